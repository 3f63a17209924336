//! Building and running a node: what `chime serve` does, and what the tests start on a
//! random port.

use std::net::TcpListener;
use std::time::Duration;

use actix_web::dev::{Payload, Server, Service, ServiceRequest};
use actix_web::error::PayloadError;
use actix_web::{App, HttpMessage, HttpServer, middleware, web};
use futures_util::StreamExt;
use sqlx::PgPool;

use crate::api::{self, AppState};
use crate::callback_hosts::CallbackHosts;
use crate::config::ServeArgs;
use crate::db::Health;
use crate::partitions::{self, Layout};
use crate::{biz_types, console, demo, engine, leader, nodes, users};

/// How long a client has to send a request's headers (actix-web's default, made explicit:
/// its body is bounded by CHIME_BODY_TIMEOUT_SECS).
const HEADER_TIMEOUT: Duration = Duration::from_secs(5);

pub struct Application {
    port: u16,
    server: Server,
    /// `/metrics` on an address of its own (CHIME_METRICS_LISTEN), and that port.
    metrics: Option<(Server, u16)>,
    pool: PgPool,
    run_engine: bool,
    callback_hosts: CallbackHosts,
    leader: leader::Settings,
    grace: std::time::Duration,
    listen: String,
    /// The `admin` password when this start created it.
    first_admin_password: Option<String>,
}

impl Application {
    /// Prepares the database (partitions, first admin) and binds the listener; port 0
    /// picks a free port (tests).
    pub async fn build(settings: &ServeArgs, pool: PgPool, health: Health) -> anyhow::Result<Application> {
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
        // A node that cannot open a signing secret would fail every callback of its biz type.
        let unopened = biz_types::unopened_secrets(&pool).await?;
        if !unopened.is_empty() {
            let reasons: Vec<String> = unopened.iter().map(ToString::to_string).collect();
            anyhow::bail!("{}", reasons.join("\n"));
        }
        // Handed to the operator by `serve` (`first_start`), not logged.
        let first_admin_password = users::ensure_first_admin(&pool, settings.admin_password.as_deref()).await?;
        let listener = TcpListener::bind(settings.listen)
            .map_err(|e| anyhow::anyhow!("cannot listen on {} ({e}); set CHIME_LISTEN to a free address", settings.listen))?;
        let port = listener.local_addr()?.port();
        let state = web::Data::new(AppState::new(pool.clone(), health, settings.max_payload_bytes as usize, settings.callback_hosts()));
        let login_limiter = web::Data::new(console::LoginLimiter::default());
        let proxies = web::Data::new(settings.trusted_proxies.clone().unwrap_or_default());
        let metrics_here = settings.metrics_listen.is_none();
        let body_timeout = Duration::from_secs(settings.body_timeout_secs);
        let mut server = HttpServer::new(move || {
            App::new()
                .app_data(state.clone())
                .app_data(login_limiter.clone())
                .app_data(proxies.clone())
                .wrap(middleware::Logger::new("%r %s %Dms").log_target("chime::http"))
                .wrap_fn(move |mut req, service| {
                    limit_body_time(&mut req, body_timeout);
                    service.call(req)
                })
                .configure(api::routes)
                .configure(|cfg| {
                    if metrics_here {
                        api::metrics_route(cfg);
                    }
                })
                .configure(console::routes)
                .route(demo::PATH, web::post().to(demo::receive))
                .default_service(web::to(api::not_found))
        })
        .listen(listener)?
        // Signals are handled by `serve`, which stops the server and then the database.
        .disable_signals()
        .client_request_timeout(HEADER_TIMEOUT);
        // actix-web counts connections per worker.
        let workers = settings.http_workers.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())).max(1);
        server = server.workers(workers).max_connections((settings.max_connections as usize).div_ceil(workers));
        let metrics = match settings.metrics_listen {
            Some(address) => {
                let listener = TcpListener::bind(address)
                    .map_err(|e| anyhow::anyhow!("cannot listen on {address} ({e}); set CHIME_METRICS_LISTEN to a free address"))?;
                let port = listener.local_addr()?.port();
                let server = HttpServer::new(|| App::new().configure(api::metrics_route).default_service(web::to(api::not_found)))
                    .listen(listener)?
                    .disable_signals()
                    .workers(1)
                    .run();
                Some((server, port))
            }
            None => None,
        };
        let listen = format!("{}:{port}", settings.listen.ip());
        let grace = std::time::Duration::from_secs(settings.shutdown_grace_secs);
        Ok(Application {
            port,
            server: server.run(),
            metrics,
            pool,
            run_engine: settings.engine,
            callback_hosts: settings.callback_hosts(),
            leader,
            grace,
            listen,
            first_admin_password,
        })
    }

    /// The password of the `admin` account this start created, to show the operator once.
    pub fn first_admin_password(&self) -> Option<&str> {
        self.first_admin_password.as_deref()
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The port of `/metrics` when CHIME_METRICS_LISTEN gives it an address of its own.
    pub fn metrics_port(&self) -> Option<u16> {
        self.metrics.as_ref().map(|(_, port)| *port)
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
        let metrics = self.metrics.map(|(server, _)| (server.handle(), tokio::spawn(server)));
        stop.await;
        handle.stop(true).await;
        if let Some((handle, server)) = metrics {
            handle.stop(true).await;
            let _ = server.await;
        }
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

/// Ends a request's body with a `TimedOut` error once `timeout` has passed since its
/// headers arrived (the API answers 408). actix-web's `client_request_timeout` covers only
/// the headers: without this, a client sending its body a byte at a time would hold its
/// connection, and a file descriptor, for as long as it likes.
fn limit_body_time(req: &mut ServiceRequest, timeout: Duration) {
    let deadline = tokio::time::Instant::now() + timeout;
    let body = futures_util::stream::unfold(Some(req.take_payload()), move |payload| async move {
        let mut payload = payload?;
        match tokio::time::timeout_at(deadline, payload.next()).await {
            Ok(chunk) => chunk.map(|chunk| (chunk, Some(payload))),
            Err(_) => {
                let message = format!("the request body did not arrive within {} s", timeout.as_secs());
                Some((Err(PayloadError::Io(std::io::Error::new(std::io::ErrorKind::TimedOut, message))), None))
            }
        }
    });
    req.set_payload(Payload::Stream { payload: Box::pin(body) });
}
