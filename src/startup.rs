//! Building and running a node: what `chime serve` does, and what the tests start on a
//! random port. The node goes through `lifecycle`'s phases: `bind` listens and answers the
//! probes, `prepare` migrates the database, `run_until` runs the loops and, on the first
//! stop signal, stops in the order docs/design/contract.md, Operating, gives.

use std::net::TcpListener;
use std::time::Duration;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::db::Pool;
use actix_web::dev::{Payload, Server, ServerHandle, Service, ServiceRequest, ServiceResponse};
use actix_web::error::PayloadError;
use actix_web::http::header;
use actix_web::middleware::from_fn;
use actix_web::{App, HttpMessage, HttpServer, middleware, web};
use anyhow::Context;
use futures_util::future::Either;
use futures_util::{Stream, StreamExt};
use tokio::time::Instant;

use crate::api;
use crate::config::ServeArgs;
use crate::db::{self, Health};
use crate::lifecycle::{Lifecycle, Phase};
use crate::partitions::{self, Layout};
use crate::state::AppState;
use crate::{biz_types, console, demo, engine, failure_notices, leader, metrics, nodes, users};

/// How the console's users sign in: the OpenID Provider the settings name, read now (its
/// metadata and keys: a provider that does not answer stops the start), and whether chime
/// passwords are allowed besides. Refuses settings that would leave no way in.
async fn sign_in_methods(settings: &ServeArgs) -> anyhow::Result<console::SignInMethods> {
    let provider = crate::oidc::Provider::discover(&settings.oidc, settings.public_url.as_deref()).await?;
    if !settings.local_passwords && provider.is_none() {
        anyhow::bail!(
            "CHIME_LOCAL_PASSWORDS=false with no OpenID Provider would leave no way to sign in to the console: set CHIME_OIDC_ISSUER (and its client), or leave CHIME_LOCAL_PASSWORDS on"
        );
    }
    if let Some(provider) = &provider {
        tracing::info!(issuer = provider.issuer(), passwords = settings.local_passwords, "console: sign-in through the OpenID Provider");
    }
    Ok(console::SignInMethods { provider: provider.map(Arc::new), passwords: settings.local_passwords })
}

/// How long a client has to send a request's headers (actix-web's default, made explicit:
/// its body is bounded by CHIME_BODY_TIMEOUT_SECS).
const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a request without credentials (no Authorization header, no session cookie),
/// and any sign-in post, has to send its body, whatever CHIME_BODY_TIMEOUT_SECS says: a
/// sign-in form is a few hundred bytes, and anyone can send these. 520 sign-in posts
/// sending a byte a second held their connections for the whole body timeout (30 s).
const ANONYMOUS_BODY_TIMEOUT: Duration = Duration::from_secs(5);
/// Connections accepted beyond CHIME_MAX_CONNECTIONS, for the probes: once that many other
/// requests are in progress, further ones are answered 503 at once (`RequestLimit`), so
/// that `/healthz`, `/readyz` and `/metrics` always find a connection whatever holds the
/// others. Before, 520 slow sign-in bodies made `/healthz` wait 22 s for a free one.
const PROBE_CONNECTIONS: usize = 32;
/// After a stop signal, the listener stays open this long (at most a quarter of the grace) with
/// `/readyz` answering 503, so that a load balancer that polls it sees the node go before
/// its requests find no listener. Kubernetes removes a terminating pod from its Services
/// as it sends SIGTERM, but proxies learn of it a few seconds later.
const LINGER: Duration = Duration::from_secs(5);
/// Once the grace is over, how long the engine has to record what it cut off and the
/// loops to finish, before the node exits anyway (their leases then run out).
const AFTER_GRACE: Duration = Duration::from_secs(3);

pub struct Application {
    /// The port the API and console answer on (the one bound, when asked for port 0).
    port: u16,
    /// `/metrics` on an address of its own (CHIME_METRICS_LISTEN): its port.
    metrics_port: Option<u16>,
    /// The HTTP servers, answering since `bind`: the API's, and `/metrics`'s when apart.
    servers: Vec<(ServerHandle, tokio::task::JoinHandle<std::io::Result<()>>)>,
    /// The node's general pool (the engine and the leader open their own sessions).
    pool: Pool,
    /// Whether the database takes writes; which host of DATABASE_URL is the primary.
    health: Health,
    /// The node's phase, from Starting to Leaving; every loop stops on its signal.
    lifecycle: Lifecycle,
    /// What the operator configured (flags, environment, file), as validated at start.
    settings: ServeArgs,
    /// The leader's duties' settings, derived from `settings`.
    leader: leader::Settings,
    /// The address this node registers as listening on (shown on the Cluster page).
    listen: String,
    /// This process's identity as a node: its heartbeat row, its leases, its leader session.
    node_id: uuid::Uuid,
    /// This node's metrics: HTTP requests, the pool, and (while it leads) the queue.
    node_metrics: web::Data<metrics::Node>,
}

impl Application {
    /// Binds the listeners and starts answering: `/healthz` 200 at once, `/readyz` and
    /// everything else 503 until `prepare` is done. Port 0 picks a free port (tests).
    pub async fn bind(settings: &ServeArgs, pool: Pool, health: Health) -> anyhow::Result<Application> {
        let layout = Layout::new(settings.partition_hours, settings.hot_days, settings.retention_days).map_err(anyhow::Error::msg)?;
        let sign_in = web::Data::new(sign_in_methods(settings).await?);
        if u64::from(settings.timer_window_secs) >= u64::from(settings.hot_days) * 86_400 {
            anyhow::bail!("CHIME_TIMER_WINDOW_SECS must be shorter than CHIME_HOT_DAYS");
        }
        let leader = leader::Settings {
            layout,
            lease: Duration::from_secs(settings.leader_lease_secs.into()),
            timer_window: Duration::from_secs(settings.timer_window_secs.into()),
            migrate_batch: settings.migrate_batch.into(),
        };
        let lifecycle = Lifecycle::default();
        let listener =
            listen(settings.listen).map_err(|e| anyhow::anyhow!("cannot listen on {} ({e}); set CHIME_LISTEN to a free address", settings.listen))?;
        let port = listener.local_addr()?.port();
        let node_id = uuid::Uuid::now_v7();
        let node_metrics = web::Data::new(metrics::Node::new(node_id, pool.clone()));
        let signal = lifecycle.signal();
        let state =
            web::Data::new(AppState::new(pool.clone(), health.clone(), settings.max_payload_bytes as usize, settings.callback_hosts(), signal));
        let login_limiter = web::Data::new(console::LoginLimiter::default());
        let login_key = web::Data::new(console::LoginKey::default());
        let proxies = web::Data::new(settings.trusted_proxies.clone().unwrap_or_default());
        let metrics_here = settings.metrics_listen.is_none();
        let body_timeout = Duration::from_secs(settings.body_timeout_secs);
        let http_grace = http_grace(settings);
        let app_metrics = node_metrics.clone();
        let limit = Arc::new(RequestLimit { in_progress: AtomicUsize::new(0), max: settings.max_connections as usize });
        let mut server = HttpServer::new(move || {
            let counted = app_metrics.clone();
            let limit = limit.clone();
            App::new()
                .app_data(state.clone())
                .app_data(login_limiter.clone())
                .app_data(login_key.clone())
                .app_data(sign_in.clone())
                .app_data(app_metrics.clone())
                .app_data(proxies.clone())
                .wrap(from_fn(api::by_phase))
                .wrap(middleware::Logger::new("%r %s %Dms").log_target("chime::http"))
                .wrap_fn(move |mut req, service| {
                    limit_body_time(&mut req, body_timeout);
                    service.call(req)
                })
                .wrap_fn(move |req, service| match limit.enter(req.path()) {
                    Ok(held) => {
                        let response = service.call(req);
                        Either::Left(async move {
                            let response = response.await;
                            drop(held);
                            response.map(ServiceResponse::map_into_left_body)
                        })
                    }
                    Err(busy) => {
                        let mut response = req.error_response(busy);
                        response.headers_mut().insert(header::RETRY_AFTER, header::HeaderValue::from(1));
                        // Its connection is closed: a refused caller does not keep one of
                        // the few `max_connections` while it waits.
                        response.response_mut().head_mut().set_connection_type(actix_web::http::ConnectionType::Close);
                        Either::Right(std::future::ready(Ok(response.map_into_right_body())))
                    }
                })
                .wrap_fn(move |req, service| {
                    // The pattern, found before routing from the app's resource map.
                    let (route, method, started) = (req.match_pattern(), req.method().clone(), std::time::Instant::now());
                    let response = service.call(req);
                    let node = counted.clone();
                    async move {
                        let response = response.await;
                        let status = match &response {
                            Ok(r) => r.status(),
                            Err(e) => e.as_response_error().status_code(),
                        };
                        node.http_request(method.as_str(), route.as_deref(), status.as_u16(), started.elapsed());
                        response
                    }
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
        .shutdown_timeout(http_grace)
        .client_request_timeout(HEADER_TIMEOUT);
        // actix-web counts connections per worker.
        let workers = settings.http_workers.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())).max(1);
        server = server.workers(workers).max_connections((settings.max_connections as usize + PROBE_CONNECTIONS).div_ceil(workers));
        let mut servers = vec![start(server.run())];
        let mut metrics_port = None;
        if let Some(address) = settings.metrics_listen {
            let listener =
                listen(address).map_err(|e| anyhow::anyhow!("cannot listen on {address} ({e}); set CHIME_METRICS_LISTEN to a free address"))?;
            metrics_port = Some(listener.local_addr()?.port());
            let node_metrics = node_metrics.clone();
            let server = HttpServer::new(move || {
                App::new().app_data(node_metrics.clone()).configure(api::metrics_route).default_service(web::to(api::not_found))
            })
            .listen(listener)?
            .disable_signals()
            .shutdown_timeout(http_grace)
            .workers(1)
            .run();
            servers.push(start(server));
        }
        let listen = format!("{}:{port}", settings.listen.ip());
        Ok(Application { port, metrics_port, servers, pool, health, lifecycle, settings: settings.clone(), leader, listen, node_id, node_metrics })
    }

    /// Migrates the database (with CHIME_AUTO_MIGRATE=false, checks that it needs no
    /// migration), checks that every signing secret can be opened, and makes sure the
    /// partitions and the first admin exist; then the node is ready: `/readyz` answers 200.
    /// Returns the `admin` password when this start created it, for `serve` to hand to the
    /// operator (`first_start`), never to the log.
    pub async fn prepare(&self) -> anyhow::Result<Option<String>> {
        if self.settings.auto_migrate {
            self.lifecycle.enter(Phase::Migrating);
            db::migrate(&self.health.sessions().into()).await?;
        } else {
            let schema = db::Schema::read(&self.pool).await?;
            schema.require_current().context("CHIME_AUTO_MIGRATE is false")?;
            schema.warn_newer();
        }
        // Creates can start before a leader is elected: the partitions they need exist.
        partitions::ensure(&self.pool, &self.leader.layout).await?;
        // A node that cannot open a signing secret would fail every callback of its biz type.
        let unopened = biz_types::unopened_secrets(&self.pool).await?;
        if !unopened.is_empty() {
            let reasons: Vec<String> = unopened.iter().map(ToString::to_string).collect();
            anyhow::bail!("{}", reasons.join("\n"));
        }
        let first_admin_password = users::ensure_first_admin(&self.pool, self.settings.admin_password.as_deref()).await?;
        self.lifecycle.enter(Phase::Ready);
        Ok(first_admin_password)
    }

    /// `bind` and `prepare`: a ready node.
    pub async fn build(settings: &ServeArgs, pool: Pool, health: Health) -> anyhow::Result<Application> {
        let app = Application::bind(settings, pool, health).await?;
        // Tests choose the password (CHIME_ADMIN_PASSWORD) or do not need it.
        app.prepare().await?;
        Ok(app)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The port of `/metrics` when CHIME_METRICS_LISTEN gives it an address of its own.
    pub fn metrics_port(&self) -> Option<u16> {
        self.metrics_port
    }

    /// Runs the loops until the first of `signals` (named, for the log), then stops:
    /// at once `/readyz` answers 503, no claim or callback starts, tasks claimed ahead go
    /// back to pending, the leader lets its lock go and the node leaves the `nodes` table;
    /// the callbacks in flight have the grace to finish (a second signal ends it), after
    /// which they are cut off and given back; the listener stays open for the linger and
    /// its requests then have what is left of the grace.
    pub async fn run_until(self, signals: impl Stream<Item = &'static str> + Send + 'static) -> std::io::Result<()> {
        let Application { servers, pool, health, lifecycle, settings, leader, listen, node_id, node_metrics, .. } = self;
        let signal = lifecycle.signal();
        let node = nodes::Node { id: node_id, listen, delivers: settings.engine };
        let heartbeat = tokio::spawn(nodes::heartbeat(pool.clone(), node, signal.clone()));
        let leader = tokio::spawn(leader::run(pool.clone(), health.sessions(), node_id, leader, node_metrics.into_inner(), signal.clone()));
        let engine = settings
            .engine
            .then(|| tokio::spawn(engine::run(health.clone(), node_id, settings.callback_hosts(), settings.node_capacity, signal.clone())));
        // Nodes that deliver callbacks send failure notices too.
        let notices = settings.engine.then(|| {
            tokio::spawn(failure_notices::run(health.clone(), node_id, settings.callback_hosts(), settings.public_url.clone(), signal.clone()))
        });

        let mut signals = Box::pin(signals);
        let name = signals.next().await.unwrap_or("the end of the signals");
        let signalled = Instant::now();
        let grace = Duration::from_secs(settings.shutdown_grace_secs);
        let linger = LINGER.min(grace / 4);
        lifecycle.enter(Phase::Draining);
        tracing::info!(
            grace_secs = grace.as_secs(),
            linger_secs = linger.as_secs_f64(),
            "{name} received: stopping; /readyz answers 503, no claim and no callback starts, callbacks in flight have \
             the grace to finish, the listener stays open for the linger"
        );
        // The grace ends at its time, or at a second signal.
        let deadline = signalled + grace;
        let timekeeper = tokio::spawn(async move {
            tokio::select! {
                Some(again) = signals.next() => tracing::info!("{again} received again: ending the shutdown grace now"),
                () = tokio::time::sleep_until(deadline) => tracing::info!("the shutdown grace is over"),
            }
            lifecycle.enter(Phase::Leaving);
        });

        let http = async {
            let mut leaving = signal.clone();
            tokio::select! {
                () = tokio::time::sleep_until(signalled + linger) => {}
                () = leaving.leaving() => {}
            }
            futures_util::future::join_all(servers.iter().map(|(handle, _)| handle.stop(true))).await;
            let mut result = Ok(());
            for (_, server) in servers {
                if let Err(e) = server.await.map_err(std::io::Error::other).and_then(|r| r) {
                    result = Err(e);
                }
            }
            tracing::info!("HTTP server stopped");
            result
        };
        let drain = async {
            // The notice sender stops claiming at the signal, and drops what it is sending when
            // the grace is over (sent again by another node when its hold runs out).
            let notices = async {
                if let Some(notices) = notices
                    && tokio::time::timeout_at(deadline + AFTER_GRACE, notices).await.is_err()
                {
                    tracing::warn!("the failure notice sender did not stop in time (is the database reachable?)");
                }
            };
            let engine = async {
                let Some(mut engine) = engine else { return };
                let mut leaving = signal.clone();
                tokio::select! {
                    _ = &mut engine => return,
                    () = leaving.leaving() => {}
                }
                if tokio::time::timeout(AFTER_GRACE, engine).await.is_err() {
                    tracing::warn!("the delivery engine could not record what it cut off; those tasks go back to pending when their lease runs out");
                }
            };
            tokio::join!(engine, notices);
        };
        let loops = async {
            // Both end at once on the signal, unless the database does not answer.
            let ended = tokio::time::timeout_at(deadline + AFTER_GRACE, async {
                let _ = heartbeat.await;
                let _ = leader.await;
            });
            if ended.await.is_err() {
                tracing::warn!("the heartbeat or the leader election did not stop in time (is the database reachable?)");
            }
        };
        let (result, (), ()) = tokio::join!(http, drain, loops);
        timekeeper.abort();
        tracing::info!(secs = signalled.elapsed().as_secs_f64(), "node stopped");
        result
    }
}

/// The HTTP server's own graceful stop fits in the grace: it begins after the linger and
/// has the rest, in whole seconds as actix takes it.
fn http_grace(settings: &ServeArgs) -> u64 {
    let grace = Duration::from_secs(settings.shutdown_grace_secs);
    (grace - LINGER.min(grace / 4)).as_secs()
}

/// Runs an HTTP server in the background; returns the handle that stops it.
fn start(server: Server) -> (ServerHandle, tokio::task::JoinHandle<std::io::Result<()>>) {
    (server.handle(), tokio::spawn(server))
}

/// Requests in progress other than the probes, and how many there may be
/// (CHIME_MAX_CONNECTIONS); the server accepts `PROBE_CONNECTIONS` connections more.
struct RequestLimit {
    in_progress: AtomicUsize,
    max: usize,
}

/// A request counted by `RequestLimit` until it is answered.
struct Counted(Option<Arc<RequestLimit>>);

impl Drop for Counted {
    fn drop(&mut self) {
        if let Some(limit) = &self.0 {
            limit.in_progress.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

impl RequestLimit {
    /// Lets a probe through uncounted, and another request while fewer than `max` are in
    /// progress; refuses it otherwise.
    fn enter(self: &Arc<Self>, path: &str) -> Result<Counted, api::ApiError> {
        if ["/healthz", "/readyz", "/metrics"].contains(&path) {
            return Ok(Counted(None));
        }
        if self.in_progress.fetch_add(1, Ordering::Relaxed) >= self.max {
            self.in_progress.fetch_sub(1, Ordering::Relaxed);
            return Err(api::ApiError::Unavailable(format!(
                "this node is answering {} requests (CHIME_MAX_CONNECTIONS); retry shortly or on another node",
                self.max
            )));
        }
        Ok(Counted(Some(self.clone())))
    }
}

/// Ends a request's body with a `TimedOut` error once `timeout` has passed since its
/// headers arrived (the API answers 408); `ANONYMOUS_BODY_TIMEOUT` for a request without
/// credentials or a sign-in. actix-web's `client_request_timeout` covers only the headers:
/// without this, a client sending its body a byte at a time would hold its connection,
/// and a file descriptor, for as long as it likes.
fn limit_body_time(req: &mut ServiceRequest, timeout: Duration) {
    let anonymous = !req.headers().contains_key(header::AUTHORIZATION) && req.cookie(console::SESSION_COOKIE).is_none();
    let timeout = if anonymous || req.path() == "/console/login" { timeout.min(ANONYMOUS_BODY_TIMEOUT) } else { timeout };
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

/// Connections the kernel queues for a node that is not accepting more (at
/// `max_connections`), as actix-web's own `bind` would; std's `TcpListener::bind` queues
/// 128. Past the queue, a connection's SYN is dropped and its client waits for the
/// retransmission (1 s, then 3 s and 7 s in all): 1,000 concurrent sign-ins overflowed
/// 128 about 1,900 times, and a right password sent among them waited 7 s to connect.
const LISTEN_BACKLOG: u32 = 2048;

fn listen(address: std::net::SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if address.is_ipv4() { tokio::net::TcpSocket::new_v4()? } else { tokio::net::TcpSocket::new_v6()? };
    // As std's bind does: a restarted node binds while its old connections are in TIME_WAIT.
    socket.set_reuseaddr(true)?;
    socket.bind(address)?;
    socket.listen(LISTEN_BACKLOG)?.into_std()
}
