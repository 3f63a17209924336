//! Building and running a node: what `chime serve` does, and what the tests start on a
//! random port.

use std::net::TcpListener;

use actix_web::{App, HttpServer, dev::Server, middleware, web};
use sqlx::PgPool;

use crate::api::{self, AppState};
use crate::callback_hosts::CallbackHosts;
use crate::config::ServeArgs;
use crate::partitions::{self, Layout};
use crate::{console, demo, engine, leader, nodes, users};

pub struct Application {
    port: u16,
    server: Server,
    pool: PgPool,
    run_engine: bool,
    callback_hosts: CallbackHosts,
    leader: leader::Settings,
    grace: std::time::Duration,
    listen: String,
}

impl Application {
    /// Prepares the database (partitions, first admin) and binds the listener; port 0
    /// picks a free port (tests).
    pub async fn build(settings: &ServeArgs, pool: PgPool) -> anyhow::Result<Application> {
        let layout = Layout::new(settings.partition_hours, settings.hot_days, settings.retention_days).map_err(anyhow::Error::msg)?;
        if u64::from(settings.timer_window_secs) >= u64::from(settings.hot_days) * 86_400 {
            anyhow::bail!("CHIME_TIMER_WINDOW_SECS must be shorter than CHIME_HOT_DAYS");
        }
        // Creates can start before a leader is elected: the partitions they need exist.
        partitions::ensure(&pool, &layout).await?;
        let leader = leader::Settings {
            layout,
            lease: std::time::Duration::from_secs(settings.leader_lease_secs.into()),
            timer_window: std::time::Duration::from_secs(settings.timer_window_secs.into()),
            migrate_batch: settings.migrate_batch.into(),
        };
        if let Some(password) = users::ensure_first_admin(&pool, settings.admin_password.as_deref()).await? {
            // Printed, not only logged: the operator needs it once, at first start.
            println!("created console user `admin` with password: {password}");
            println!("(shown only this once; set CHIME_ADMIN_PASSWORD before the first start to choose it)");
        }
        let listener = TcpListener::bind(settings.listen)
            .map_err(|e| anyhow::anyhow!("cannot listen on {} ({e}); set CHIME_LISTEN to a free address", settings.listen))?;
        let port = listener.local_addr()?.port();
        let state = web::Data::new(AppState::new(pool.clone(), settings.max_payload_bytes as usize, settings.callback_hosts()));
        let login_limiter = web::Data::new(console::LoginLimiter::default());
        let mut server = HttpServer::new(move || {
            App::new()
                .app_data(state.clone())
                .app_data(login_limiter.clone())
                .wrap(middleware::Logger::new("%r %s %Dms").log_target("chime::http"))
                .configure(api::routes)
                .configure(console::routes)
                .route(demo::PATH, web::post().to(demo::receive))
                .default_service(web::to(api::not_found))
        })
        .listen(listener)?
        // Signals are handled by `serve`, which stops the server and then the database.
        .disable_signals();
        if let Some(workers) = settings.http_workers {
            server = server.workers(workers);
        }
        let listen = format!("{}:{port}", settings.listen.ip());
        let grace = std::time::Duration::from_secs(settings.shutdown_grace_secs);
        Ok(Application {
            port,
            server: server.run(),
            pool,
            run_engine: settings.engine,
            callback_hosts: settings.callback_hosts(),
            leader,
            grace,
            listen,
        })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Serves the API and runs the engine until `stop` completes; then stops taking
    /// requests, lets the engine finish the callbacks in flight, and returns.
    pub async fn run_until(self, stop: impl std::future::Future<Output = ()>) -> std::io::Result<()> {
        let (stopping, stop_signal) = tokio::sync::watch::channel(false);
        let node = nodes::Node { id: uuid::Uuid::now_v7(), listen: self.listen.clone(), delivers: self.run_engine };
        let node_id = node.id;
        let heartbeat = tokio::spawn(nodes::heartbeat(self.pool.clone(), node, stop_signal.clone()));
        let leader = tokio::spawn(leader::run(self.pool.clone(), node_id, self.leader, stop_signal.clone()));
        let engine = self.run_engine.then(|| tokio::spawn(engine::run(self.pool.clone(), node_id, self.callback_hosts, stop_signal)));
        let handle = self.server.handle();
        let server = tokio::spawn(self.server);
        stop.await;
        handle.stop(true).await;
        let _ = stopping.send(true);
        if let Some(engine) = engine
            && tokio::time::timeout(self.grace, engine).await.is_err()
        {
            tracing::warn!(
                "callbacks still in flight after the {} s grace period; their tasks will be delivered again once their lease expires",
                self.grace.as_secs()
            );
        }
        let _ = heartbeat.await;
        let _ = leader.await;
        server.await.map_err(std::io::Error::other)?
    }
}
