//! The test harness: one throwaway PostgreSQL cluster per test binary (unless
//! DATABASE_URL names a server), a fresh database per test cloned from a migrated template,
//! and chime's real HTTP server on a random port.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use chime::callback_hosts::CallbackHosts;
use chime::config::ServeArgs;
use chime::db::Pool;
use chime::db::embedded_pg::{self, EmbeddedPg};
use chime::startup::Application;
use serde_json::Value;
use sqlx::{Connection, Executor, PgConnection};
use tokio::sync::OnceCell;
use uuid::Uuid;

/// Where the test server is, and the template database every test database is cloned from.
struct Server {
    /// URL of a maintenance database, for CREATE DATABASE.
    admin_url: String,
    /// Kept for the life of the process; its watchdog removes it when we exit.
    _cluster: Option<EmbeddedPg>,
}

static SERVER: OnceCell<Server> = OnceCell::const_new();
const TEMPLATE: &str = "chime_test_template";

async fn server() -> &'static Server {
    SERVER
        .get_or_init(|| async {
            let (admin_url, cluster) = match std::env::var("DATABASE_URL") {
                Ok(url) => (url, None),
                Err(_) => {
                    let pg = embedded_pg::start_throwaway().await.expect("starting a throwaway PostgreSQL");
                    (pg.url("postgres"), Some(pg))
                }
            };
            // The template is migrated once; each test then gets a copy in milliseconds.
            let mut conn = PgConnection::connect(&admin_url).await.expect("connecting to PostgreSQL");
            let suffix = std::process::id();
            let template = format!("{TEMPLATE}_{suffix}");
            conn.execute(sqlx::AssertSqlSafe(format!("DROP DATABASE IF EXISTS {template}"))).await.unwrap();
            conn.execute(sqlx::AssertSqlSafe(format!("CREATE DATABASE {template}"))).await.unwrap();
            let mut template_conn = PgConnection::connect(&with_database(&admin_url, &template)).await.unwrap();
            chime::db::migrate_on(&mut template_conn).await.expect("migrating the template database");
            template_conn.close().await.unwrap();
            Server { admin_url, _cluster: cluster }
        })
        .await
}

/// The URL with its database replaced.
fn with_database(url: &str, database: &str) -> String {
    let mut parsed = url::Url::parse(url).expect("a database URL");
    parsed.set_path(&format!("/{database}"));
    parsed.to_string()
}

/// A fresh, migrated database; returns its URL.
pub async fn fresh_database() -> String {
    new_database(&format!("TEMPLATE {TEMPLATE}_{}", std::process::id())).await
}

/// A fresh database that was never migrated; returns its URL.
pub async fn empty_database() -> String {
    new_database("").await
}

async fn new_database(options: &str) -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let server = server().await;
    let name = format!("chime_test_{}_{}", std::process::id(), COUNTER.fetch_add(1, Ordering::Relaxed));
    let mut conn = PgConnection::connect(&server.admin_url).await.unwrap();
    conn.execute(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name} {options}"))).await.unwrap();
    with_database(&server.admin_url, &name)
}

/// An HTTP client for tests (the TLS provider must be installed before any is built).
pub fn client() -> reqwest::Client {
    chime::engine::install_tls_provider();
    reqwest::Client::new()
}

pub struct TestApp {
    pub address: String,
    pub pool: Pool,
    pub db_url: String,
    pub client: reqwest::Client,
}

/// The API alone: tasks stay as the test leaves them.
pub async fn spawn_app() -> TestApp {
    spawn_app_with(ServeArgs { engine: false, ..ServeArgs::default() }).await
}

/// The API alone, on a database whose leader lock (leader.rs, LEADER_LOCK) the test holds
/// for as long as it keeps the returned session, so that no leader duty (lease recovery,
/// the hot horizon) changes tasks behind its back, however late a loaded machine runs them.
pub async fn spawn_app_without_leader() -> (TestApp, PgConnection) {
    let db_url = fresh_database().await;
    let mut holder = PgConnection::connect(&db_url).await.unwrap();
    holder.execute("SELECT pg_advisory_lock(109300096525676)").await.unwrap(); // 0x6368696d656c, "chimel"
    (spawn_on(db_url, ServeArgs { engine: false, ..ServeArgs::default() }).await, holder)
}

/// The API and the delivery engine.
pub async fn spawn_node() -> TestApp {
    spawn_app_with(ServeArgs::default()).await
}

pub async fn spawn_app_with(settings: ServeArgs) -> TestApp {
    spawn_on(fresh_database().await, settings).await
}

/// A delivery engine on `app`'s database, with a node id of its own, that the test drives
/// one turn at a time (`Engine::turn`, `Engine::settled`) instead of the node's loop.
pub fn engine(app: &TestApp) -> TestEngine {
    let lifecycle = chime::lifecycle::Lifecycle::default();
    let health = chime::db::Health::new(&app.pool);
    let engine = chime::engine::Engine::start(health, Uuid::new_v4(), CallbackHosts::Any, lifecycle.signal());
    TestEngine { engine, lifecycle }
}

/// An engine driven by the test, and the phase it listens to (a dropped sender would read
/// as "stopping").
pub struct TestEngine {
    engine: chime::engine::Engine,
    lifecycle: chime::lifecycle::Lifecycle,
}

impl TestEngine {
    /// One turn, claiming every biz type's due tasks: a test creates a task and takes a
    /// turn at once, before the notification that it is due reaches the engine.
    pub async fn turn(&mut self) -> chime::engine::Turn {
        self.engine.look_at_every_biz_type();
        self.engine.turn().await
    }

    /// Runs the engine's own loop (`Engine::run`) from here on, until `RunningEngine::stop`.
    pub fn spawn(self) -> RunningEngine {
        RunningEngine { task: tokio::spawn(self.engine.run()), lifecycle: self.lifecycle }
    }
}

/// An engine running its loop in a task of its own.
pub struct RunningEngine {
    task: tokio::task::JoinHandle<()>,
    lifecycle: chime::lifecycle::Lifecycle,
}

impl RunningEngine {
    /// Stops the engine as its node would (docs/design/contract.md, Operating) and waits until it has stopped: every
    /// callback in flight finished and recorded, every task claimed ahead given back.
    pub async fn stop(self) {
        self.lifecycle.enter(chime::lifecycle::Phase::Draining);
        self.task.await.expect("the engine's loop ended without panicking");
    }
}

impl std::ops::Deref for TestEngine {
    type Target = chime::engine::Engine;
    fn deref(&self) -> &Self::Target {
        &self.engine
    }
}

impl std::ops::DerefMut for TestEngine {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.engine
    }
}

/// Another node on the same database as `app`.
pub async fn spawn_second_node(app: &TestApp) -> TestApp {
    spawn_on(app.db_url.clone(), ServeArgs::default()).await
}

/// The app on the database at `db_url` (another role or another server than the harness's).
pub async fn spawn_on(db_url: String, mut settings: ServeArgs) -> TestApp {
    settings.listen = "127.0.0.1:0".parse().unwrap();
    serve_on(db_url, settings).await
}

/// As `spawn_on`, listening where `settings.listen` says (a test that must tell others
/// chime's address before it starts: an OpenID Provider, its redirect URI).
pub async fn serve_on(db_url: String, mut settings: ServeArgs) -> TestApp {
    let pool = chime::db::connect(&db_url, 8).await.unwrap();
    settings.http_workers = Some(1);
    settings.admin_password.get_or_insert_with(|| "test-admin-password".into());
    let app = Application::build(&settings, pool.clone(), chime::db::Health::new(&pool)).await.expect("building the app");
    let address = format!("http://127.0.0.1:{}", app.port());
    tokio::spawn(app.run_until(futures_util::stream::pending()));
    TestApp { address, pool, db_url, client: client() }
}

/// A `chime serve` process on the given database with extra settings, ready; killed
/// when dropped.
pub async fn chime_process(db_url: &str, env: &[(&str, &str)]) -> tokio::process::Child {
    chime_node(db_url, env).await.0
}

/// Like `chime_process`; returns the process and its address.
pub async fn chime_node(db_url: &str, env: &[(&str, &str)]) -> (tokio::process::Child, String) {
    spawn_chime(db_url, env, std::process::Stdio::null()).await
}

/// Like `chime_process`, with its log (stderr) written to `log`; returns the process and
/// its address.
pub async fn chime_process_logging(db_url: &str, env: &[(&str, &str)], log: std::fs::File) -> (tokio::process::Child, String) {
    spawn_chime(db_url, env, log.into()).await
}

async fn spawn_chime(db_url: &str, env: &[(&str, &str)], stderr: std::process::Stdio) -> (tokio::process::Child, String) {
    let (child, address) = start_chime(db_url, env, stderr);
    wait_ready(&address).await;
    (child, address)
}

/// A `chime serve` process as soon as it answers `/healthz`, which it does before it is
/// ready; its log (stderr) written to `log`. Killed when dropped.
pub async fn chime_process_live(db_url: &str, env: &[(&str, &str)], log: std::fs::File) -> (tokio::process::Child, String) {
    let (child, address) = start_chime(db_url, env, log.into());
    let client = client();
    wait_until("chime serve answering /healthz", Duration::from_secs(60), || async {
        client.get(format!("{address}/healthz")).send().await.is_ok_and(|r| r.status() == 200)
    })
    .await;
    (child, address)
}

fn start_chime(db_url: &str, env: &[(&str, &str)], stderr: std::process::Stdio) -> (tokio::process::Child, String) {
    let port = free_port();
    let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_chime"))
        .env("DATABASE_URL", db_url)
        .env("CHIME_LISTEN", format!("127.0.0.1:{port}"))
        .env_remove("CHIME_CONFIG")
        // A first start that made a password would write it into ./chime-data.
        .env("CHIME_ADMIN_PASSWORD", "test-admin-password")
        .envs(env.iter().copied())
        .stdout(std::process::Stdio::null())
        .stderr(stderr)
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    (child, format!("http://127.0.0.1:{port}"))
}

/// A response's status and JSON body.
pub struct Reply {
    pub status: u16,
    pub headers: reqwest::header::HeaderMap,
    pub body: Value,
}

impl Reply {
    /// The error code of an error reply.
    pub fn code(&self) -> &str {
        self.body["error"]["code"].as_str().unwrap_or_else(|| panic!("not an error reply: {}", self.body))
    }
    pub fn message(&self) -> &str {
        self.body["error"]["message"].as_str().unwrap_or_else(|| panic!("not an error reply: {}", self.body))
    }
}

/// Creates biz type `name` with `settings` (any callback host) and returns an API token for it.
pub async fn biz_type_with(pool: &Pool, name: &str, settings: &chime::biz_types::Settings) -> String {
    chime::biz_types::create(pool, name, settings, CallbackHosts::Any).await.unwrap();
    chime::biz_types::create_token(pool, name).await.unwrap()
}

/// Creates tasks through the API of the node at `address`, 1000 per request; returns their ids.
/// (The faults and Citus suites' chime processes; the API suite has no use for it.)
#[allow(dead_code)]
pub async fn create_tasks(address: &str, token: &str, tasks: Vec<Value>) -> Vec<String> {
    let client = client();
    let mut ids = Vec::with_capacity(tasks.len());
    for chunk in tasks.chunks(1000) {
        let body = serde_json::json!({ "tasks": chunk });
        let response = client.post(format!("{address}/api/v1/tasks/batch")).bearer_auth(token).json(&body).send().await.unwrap();
        assert_eq!(response.status(), 200);
        let body: Value = response.json().await.unwrap();
        for result in body["results"].as_array().unwrap() {
            assert_eq!(result["status"], 201, "{result}");
            ids.push(result["task"]["id"].as_str().unwrap().to_string());
        }
    }
    ids
}

impl TestApp {
    /// Creates a biz type with a test callback URL and returns an API token for it.
    pub async fn biz_type(&self, name: &str) -> String {
        let settings = chime::biz_types::Settings { callback_url: Some("http://127.0.0.1:9/callback".into()), ..Default::default() };
        biz_type_with(&self.pool, name, &settings).await
    }

    pub async fn request(&self, method: &str, path: &str, token: Option<&str>, body: Option<Vec<u8>>) -> Reply {
        let authorization = token.map(|t| format!("Bearer {t}"));
        self.request_with_authorization(method, path, authorization.as_deref(), body).await
    }

    /// A request with this `Authorization` header as given (none when `None`).
    pub async fn request_with_authorization(&self, method: &str, path: &str, authorization: Option<&str>, body: Option<Vec<u8>>) -> Reply {
        let mut req = self.client.request(method.parse().unwrap(), format!("{}{path}", self.address));
        if let Some(authorization) = authorization {
            req = req.header("Authorization", authorization);
        }
        if let Some(body) = body {
            req = req.header("Content-Type", "application/json").body(body);
        }
        let resp = req.send().await.expect("request sent");
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let bytes = resp.bytes().await.unwrap();
        let body = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).unwrap_or_else(|_| panic!("{method} {path}: not JSON: {bytes:?}"))
        };
        Reply { status, headers, body }
    }

    pub async fn get(&self, path: &str, token: &str) -> Reply {
        self.request("GET", path, Some(token), None).await
    }

    pub async fn post(&self, path: &str, token: &str, body: Value) -> Reply {
        self.request("POST", path, Some(token), Some(body.to_string().into_bytes())).await
    }

    pub async fn patch(&self, path: &str, token: &str, body: Value) -> Reply {
        self.request("PATCH", path, Some(token), Some(body.to_string().into_bytes())).await
    }

    pub async fn delete(&self, path: &str, token: &str) -> Reply {
        self.request("DELETE", path, Some(token), None).await
    }

    /// Creates a task and returns it, asserting 201.
    pub async fn create_task(&self, token: &str, body: Value) -> Value {
        let reply = self.post("/api/v1/tasks", token, body).await;
        assert_eq!(reply.status, 201, "{}", reply.body);
        reply.body
    }

    /// Which table or partition holds the task.
    pub async fn table_of(&self, id: &str) -> String {
        sqlx::query_scalar(
            "SELECT tableoid::regclass::text FROM tasks WHERE id = $1::uuid
             UNION ALL SELECT tableoid::regclass::text FROM tasks_cold WHERE id = $1::uuid",
        )
        .bind(id)
        .fetch_one(&self.pool)
        .await
        .unwrap()
    }

    /// Sets a task's status directly, as the engine would.
    pub async fn force_status(&self, id: &str, status: &str) {
        let (lease, finished) = match status {
            "running" => ("now() + interval '1 minute'", "NULL"),
            "pending" => ("NULL", "NULL"),
            _ => ("NULL", "now()"),
        };
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE tasks SET status = $2, lease_until = {lease}, finished_at = {finished} WHERE id = $1::uuid"
        )))
        .bind(id)
        .bind(status)
        .execute(&self.pool)
        .await
        .unwrap();
    }
}

/// Asks `check` every 20 ms until it says done: `true`, `Some(value)` or `Ok(value)`, and
/// returns the value. Panics once `within` has passed, naming `what` was awaited and, for
/// a check that says `Err(seen)`, what it saw last.
pub async fn wait_until<C, F, Fut>(what: &str, within: Duration, mut check: F) -> C::Done
where
    C: Check,
    F: FnMut() -> Fut,
    Fut: Future<Output = C>,
{
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let seen = match check().await.done() {
            Ok(done) => return done,
            Err(seen) => seen,
        };
        if tokio::time::Instant::now() >= deadline {
            match seen {
                Some(seen) => panic!("waited {within:?} for {what}; last seen: {seen}"),
                None => panic!("waited {within:?} for {what}"),
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// What a `wait_until` check says: done, with a value, or not yet, perhaps with what it saw.
pub trait Check {
    type Done;
    fn done(self) -> Result<Self::Done, Option<String>>;
}

impl Check for bool {
    type Done = ();
    fn done(self) -> Result<(), Option<String>> {
        if self { Ok(()) } else { Err(None) }
    }
}

impl<T> Check for Option<T> {
    type Done = T;
    fn done(self) -> Result<T, Option<String>> {
        self.ok_or(None)
    }
}

impl<T, E: std::fmt::Display> Check for Result<T, E> {
    type Done = T;
    fn done(self) -> Result<T, Option<String>> {
        self.map_err(|seen| Some(seen.to_string()))
    }
}

/// A session listening to the nodes' wake-ups (`chime_wake`): open it before a change, then
/// wait for the change's notice (`settings_notice`).
pub async fn wake_listener(app: &TestApp) -> sqlx::postgres::PgListener {
    let mut listener = sqlx::postgres::PgListener::connect(&app.db_url).await.unwrap();
    listener.listen("chime_wake").await.unwrap();
    listener
}

/// Waits (at most 5 s) for the notice that biz types changed. The server tells every
/// session listening at the same commit, so the nodes' sessions have it too; a node may
/// still be acting on what it read before (an engine's turn under way).
pub async fn settings_notice(listener: &mut sqlx::postgres::PgListener) {
    let told = async { while listener.recv().await.unwrap().payload() != "settings" {} };
    tokio::time::timeout(Duration::from_secs(5), told).await.expect("the notice that biz types changed, within 5 s");
}

/// A port free at the time of asking.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Waits until the chime at `address` answers /readyz with 200 (at most 60 s).
pub async fn wait_ready(address: &str) {
    let client = client();
    wait_until("chime serve ready (/readyz)", Duration::from_secs(60), || async {
        client.get(format!("{address}/readyz")).send().await.is_ok_and(|r| r.status() == 200)
    })
    .await;
}

/// Of `nodes` (chime processes, in the order tried), the first found holding leases, stopped
/// (SIGSTOP) for the caller to kill: stopped before its leases are counted, so that it
/// records none between the count and the kill (a fast node records all it holds in a few
/// milliseconds). A node found holding none once stopped goes on (SIGCONT). Returns its
/// index in `nodes`, its node id, and what it holds, claimed and not recorded: nothing else
/// touches those rows until their lease ends, and a record it sent before the stop may
/// still land, which makes the count more, never less, than what is delivered again.
/// (The faults and Citus suites' kills; the API suite has no use for it.)
#[allow(dead_code)]
pub async fn stop_a_node_holding_leases(pool: &Pool, nodes: &[&tokio::process::Child]) -> (usize, Uuid, i64) {
    use nix::sys::signal::{Signal, kill};
    let holding = "SELECT count(*) FROM tasks WHERE status = 'running' AND leased_by = $1";
    let mut each = Vec::new();
    for child in nodes {
        each.push((node_of(pool, child).await, nix::unistd::Pid::from_raw(child.id().unwrap() as i32)));
    }
    let held = |node: Uuid| async move { sqlx::query_scalar::<_, i64>(holding).bind(node).fetch_one(pool).await.unwrap() };
    let waiting = std::time::Instant::now();
    loop {
        assert!(waiting.elapsed() < Duration::from_secs(60), "no node held a lease for a minute");
        for (i, &(node, pid)) in each.iter().enumerate() {
            if held(node).await == 0 {
                continue;
            }
            kill(pid, Signal::SIGSTOP).unwrap();
            let in_flight = held(node).await;
            if in_flight > 0 {
                return (i, node, in_flight);
            }
            kill(pid, Signal::SIGCONT).unwrap();
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// The node id of a chime process, from its registration.
pub async fn node_of(pool: &Pool, child: &tokio::process::Child) -> Uuid {
    let pid = child.id().unwrap() as i32;
    wait_until(&format!("process {pid} registered"), Duration::from_secs(5), || async {
        sqlx::query_scalar("SELECT id FROM nodes WHERE pid = $1").bind(pid).fetch_optional(pool).await.unwrap()
    })
    .await
}
