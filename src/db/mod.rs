//! Reaching the database: an external one (DATABASE_URL, one host or several) or the
//! embedded one (`embedded_pg` starts and stops it), following its primary through a failover, whether it is known to be down,
//! and the migrations.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use sqlx::migrate::{Migrate, Migration, Migrator};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions, PgSslMode};
use sqlx::{ConnectOptions, Connection, PgConnection, PgPool};
use tokio::sync::watch;

pub mod citus;
pub mod embedded_pg;
pub mod hosts;
mod pool;

use embedded_pg::{EmbeddedPg, EmbeddedPgError};
pub use hosts::{Hosts, NoWritableHost, Writable};
pub use pool::{Pool, query, query_as, query_scalar};

/// The migrations this binary knows. Applied migrations it does not know (a newer binary's)
/// are let be: migrations are expand/contract (`migrations/README.md`), so this binary runs
/// on the schema they leave. Locking is `migrate_on`'s, so that its wait has no timeout.
pub static MIGRATOR: Migrator = {
    let mut migrator = sqlx::migrate!();
    migrator.ignore_missing = true;
    migrator.locking = false;
    migrator
};

/// Where the database is. Shared by every subcommand, so that admin commands reach the
/// same database as `serve` (`config::Cli` flattens it in).
#[derive(Debug, Clone, Args)]
pub struct DbArgs {
    /// PostgreSQL URL of an existing database. When unset, chime uses its embedded PostgreSQL.
    /// libpq's forms, with several hosts tried in order:
    /// `postgres://u@h1:5432,h2:5432/chime` or `host=h1,h2 port=5432 dbname=chime user=u`.
    /// chime uses the first server that accepts writes, and moves to the promoted one after
    /// a failover by itself.
    #[arg(long, env = "DATABASE_URL", global = true, hide_env_values = true)]
    pub database_url: Option<String>,

    /// Pooler mode: when DATABASE_URL goes through a pooler in transaction mode (PgBouncer),
    /// a direct (or session-pooled) URL of the same database, for what needs one server
    /// session throughout: the leader's lock, LISTEN, migrations and the delivery engine.
    /// Each statement on DATABASE_URL then runs unnamed, in a transaction of its own.
    #[arg(long, env = "CHIME_DIRECT_DATABASE_URL", global = true, hide_env_values = true, requires = "database_url")]
    pub direct_database_url: Option<String>,

    /// Directory for the embedded PostgreSQL's data and chime's local state.
    #[arg(long, env = "CHIME_DATA_DIR", default_value = "./chime-data", global = true)]
    pub data_dir: PathBuf,

    /// Directory holding initdb, pg_ctl and postgres for the embedded database
    /// [default: found on PATH, by `pg_config --bindir`, or under /usr/lib/postgresql/*/bin].
    #[arg(long, env = "CHIME_PG_BIN_DIR", global = true)]
    pub pg_bin_dir: Option<PathBuf>,

    /// Connections in the pool to PostgreSQL.
    #[arg(long, env = "CHIME_DB_POOL_SIZE", default_value_t = 16, global = true,
          value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub db_pool_size: u32,
}

/// The database a command works on. An embedded PostgreSQL started here is supervised
/// (restarted when it dies) and stopped when the command ends (`close`).
pub struct Database {
    /// For statements: DATABASE_URL, perhaps through a pooler in transaction mode.
    pub pool: Pool,
    pub health: Health,
    embedded: Option<embedded_pg::Supervisor>,
}

impl Database {
    /// Connects to DATABASE_URL, or starts the embedded PostgreSQL under the data directory.
    /// With `attach`, a data directory already served by a running `chime serve` is used
    /// through that process's socket (admin commands); without it, that is an error.
    pub async fn open(args: &DbArgs, attach: bool) -> anyhow::Result<Database> {
        let (url, embedded) = match &args.database_url {
            Some(url) => (url.clone(), None),
            None => match EmbeddedPg::start(&args.data_dir, args.pg_bin_dir.as_deref()).await {
                Ok(pg) => (pg.url("chime"), Some(pg)),
                Err(EmbeddedPgError::Busy { .. }) if attach => (embedded_pg::socket_url(&args.data_dir, "chime"), None),
                Err(e @ EmbeddedPgError::Busy { .. }) => {
                    return Err(anyhow::anyhow!(
                        "{e}. To run a second node on this machine, give it the same database: \
                         DATABASE_URL='{}' and another CHIME_LISTEN",
                        embedded_pg::socket_url(&args.data_dir, "chime")
                    ));
                }
                Err(e) => return Err(e.into()),
            },
        };
        let opened = async {
            let statements = Hosts::parse(&url, "DATABASE_URL")?;
            let direct = args.direct_database_url.as_deref().map(|url| Hosts::parse(url, "CHIME_DIRECT_DATABASE_URL")).transpose()?;
            let health = Health::follow(statements, direct).await?;
            let pool = health.statements_pool(args.db_pool_size);
            let sessions = if health.pooled() { health.pool(Route::Sessions, SESSIONS_POOL_SIZE, no_jit) } else { pool.pg.clone() };
            let _ = health.inner.sessions.set(sessions);
            check_server_version(&pool).await?;
            anyhow::Ok((pool, health))
        };
        match opened.await {
            Ok((pool, health)) => {
                let embedded = embedded.map(|pg| {
                    let health = health.clone();
                    pg.supervise(move || health.mark_down())
                });
                Ok(Database { pool, health, embedded })
            }
            Err(e) => {
                if let Some(pg) = embedded {
                    pg.stop().await;
                }
                Err(e)
            }
        }
    }

    pub async fn close(self) {
        self.pool.close().await;
        self.health.sessions().close().await;
        if let Some(pg) = self.embedded {
            pg.stop().await;
        }
    }
}

/// The sessions pool in pooler mode: the API's LISTEN session, the leader's lock session, a
/// migration. (The engine's hot path has a pool of its own on the same route.)
const SESSIONS_POOL_SIZE: u32 = 4;

/// chime's statements each touch a few rows by index. When the planner misjudges one
/// (statistics of a partition analysed while empty), JIT compiling it costs hundreds of
/// milliseconds (measured: 658 ms for a 1 ms update) and gains nothing.
pub fn no_jit(options: PgConnectOptions) -> PgConnectOptions {
    options.options([("jit", "off")])
}

/// Through a pooler in transaction mode (CHIME_DIRECT_DATABASE_URL set), a server session
/// serves many clients, one transaction at a time: nothing may outlive a transaction.
/// PgBouncer 1.18 refuses the `options` and `extra_float_digits` startup parameters (so
/// `jit` is the role's setting, README; PostgreSQL 12+ prints floats exactly without
/// `extra_float_digits`). Statements are unnamed and each in a transaction (`pool.rs`);
/// without a statement cache, a named one made by mistake fails ("already exists") rather
/// than be run later on a server session where the name means another client's statement.
fn pooled_statements(options: PgConnectOptions) -> PgConnectOptions {
    options.statement_cache_capacity(0).extra_float_digits(None)
}

/// Why a statement failed when the database, not the statement, is at fault: answered
/// 503 ("retry shortly") rather than 500 by the API and the console, and, but for a pool
/// closed at shutdown, marks the database down (`Health::saw`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outage {
    /// Cut, refused, not answering in time, or ending the session: an I/O error, the pool's
    /// acquire timeout, or a SQLSTATE of connection failure (class 08, but for 08P01) or
    /// 57P01-57P03 (the server shutting down, restarting after a crash, or not yet accepting
    /// sessions). A session killed under a failover reports a FATAL of that kind on its next
    /// statement.
    Unreachable,
    /// SQLSTATE 25006: a server that stopped taking writes under the session (a failover,
    /// a pooler that moved, a promoted node still read-only).
    ReadOnly,
    /// This node's pool is closed: it is shutting down.
    PoolClosed,
}

pub fn outage(e: &sqlx::Error) -> Option<Outage> {
    match e {
        sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut => Some(Outage::Unreachable),
        sqlx::Error::PoolClosed => Some(Outage::PoolClosed),
        sqlx::Error::Database(db) => match db.code().as_deref() {
            Some("25006") => Some(Outage::ReadOnly),
            Some("57P01" | "57P02" | "57P03" | "08000" | "08001" | "08003" | "08004" | "08006" | "08007") => Some(Outage::Unreachable),
            // 08P01, a protocol violation, is not among them: PgBouncer answers it to what it
            // does not support (a startup parameter), which no retry mends.
            _ => None,
        },
        _ => None,
    }
}

/// Where a pool's sessions go: DATABASE_URL, or the direct URL in pooler mode (the same
/// hosts otherwise).
#[derive(Clone, Copy, PartialEq)]
pub enum Route {
    Statements,
    Sessions,
}

type Customize = Arc<dyn Fn(PgConnectOptions) -> PgConnectOptions + Send + Sync>;

/// The hosts of one URL, the one in use, and the pools whose sessions go there.
struct Target {
    hosts: Hosts,
    /// How a probe connects: what the server (or pooler) at these hosts accepts.
    probe: fn(PgConnectOptions) -> PgConnectOptions,
    current: Mutex<usize>,
    pools: Mutex<Vec<(PgPool, Customize)>>,
}

impl Target {
    fn new(hosts: Hosts, probe: fn(PgConnectOptions) -> PgConnectOptions, current: usize) -> Arc<Target> {
        Arc::new(Target { hosts, probe, current: Mutex::new(current), pools: Mutex::new(Vec::new()) })
    }

    fn current(&self) -> &hosts::Host {
        &self.hosts.hosts()[*self.current.lock().expect("not poisoned")]
    }

    /// Points every pool at host `i` for the sessions they open from now on.
    fn switch(&self, i: usize) {
        let was = std::mem::replace(&mut *self.current.lock().expect("not poisoned"), i);
        let hosts = self.hosts.hosts();
        if was != i {
            tracing::warn!(
                "the server that accepts writes in {} is now {} (was {}): new sessions go there",
                self.hosts.setting,
                hosts[i].label,
                hosts[was].label
            );
        }
        for (pool, customize) in self.pools.lock().expect("not poisoned").iter() {
            pool.set_connect_options(customize(hosts[i].options.clone()));
        }
    }

    fn closed(&self) -> bool {
        self.pools.lock().expect("not poisoned").iter().all(|(pool, _)| pool.is_closed())
    }

    /// Finds the host that accepts writes now and points the pools there.
    async fn find(&self) -> Result<(), NoWritableHost> {
        let (i, conn) = self.hosts.find_writable(&self.probe).await?;
        let _ = conn.close().await;
        self.switch(i);
        Ok(())
    }
}

/// Whether the database is known to be down, and which server its sessions go to. While
/// it is down, `/readyz` and the API answer 503 at once: otherwise each request would wait
/// out the pool's acquire timeout, since sqlx keeps retrying a refused connection until
/// then (10 s).
///
/// Marked down by whoever notices first: the embedded database's supervisor (its postmaster
/// exited), a LISTEN session (its connection broke: a server that crashed, was stopped or
/// is being demoted closes it at once), a pool's new session that landed on a standby, or a
/// request that found the database unreachable or read-only. Marked up again by a probe
/// that, while the database is down, goes through the hosts every `PROBE_EVERY` and points
/// the pools at the first that accepts writes: after a failover, the promoted standby.
/// Sessions opened before the database was marked down are not handed out again.
#[derive(Clone)]
pub struct Health {
    inner: Arc<HealthInner>,
}

struct HealthInner {
    statements: Arc<Target>,
    /// The direct URL's hosts in pooler mode, else the same target as `statements`.
    sessions_target: Arc<Target>,
    /// The pool for sessions (set once the pools exist).
    sessions: OnceLock<PgPool>,
    /// True while down; requests in flight wait on it too.
    down: watch::Sender<bool>,
    /// When it was last marked down: sessions opened before are closed, not reused.
    marked_down_at: Mutex<Option<Instant>>,
}

const PROBE_EVERY: Duration = Duration::from_millis(200);
/// An outage this long is said again, with each host's reason.
const STILL_DOWN_AFTER: Duration = Duration::from_secs(10);

impl Health {
    /// For an existing pool on one host (tests): it is its own sessions pool.
    pub fn new(pool: &Pool) -> Health {
        let pool = pool.pg.clone();
        let target = Target::new(Hosts::single(pool.connect_options().as_ref().clone(), "DATABASE_URL"), no_jit, 0);
        target.pools.lock().expect("not poisoned").push((pool.clone(), Arc::new(|o| o)));
        let health = Health::with_targets(target.clone(), target);
        let _ = health.inner.sessions.set(pool);
        health
    }

    /// Finds the server that accepts writes among each URL's hosts (waiting for one for
    /// the acquire timeout); `direct` is CHIME_DIRECT_DATABASE_URL's, for pooler mode.
    async fn follow(statements: Hosts, direct: Option<Hosts>) -> anyhow::Result<Health> {
        let probe = if direct.is_some() { pooled_statements } else { no_jit };
        let (i, conn) = find_at_start(&statements, probe).await?;
        let _ = conn.close().await;
        let statements = Target::new(statements, probe, i);
        let sessions = match direct {
            Some(direct) => {
                let (i, conn) = find_at_start(&direct, no_jit).await?;
                let _ = conn.close().await;
                Target::new(direct, no_jit, i)
            }
            None => statements.clone(),
        };
        Ok(Health::with_targets(statements, sessions))
    }

    fn with_targets(statements: Arc<Target>, sessions_target: Arc<Target>) -> Health {
        Health {
            inner: Arc::new(HealthInner {
                statements,
                sessions_target,
                sessions: OnceLock::new(),
                down: watch::Sender::new(false),
                marked_down_at: Mutex::new(None),
            }),
        }
    }

    /// Whether statements go through a pooler (a direct URL was given for sessions).
    pub fn pooled(&self) -> bool {
        !Arc::ptr_eq(&self.inner.statements, &self.inner.sessions_target)
    }

    /// The pool for what needs one server session throughout, which a pooler in
    /// transaction mode cannot give: the leader's lock, LISTEN, migrations (their lock and
    /// `lock_timeout`). DATABASE_URL's pool unless CHIME_DIRECT_DATABASE_URL is set.
    pub fn sessions(&self) -> PgPool {
        self.inner.sessions.get().expect("the sessions pool is set when the pools are made").clone()
    }

    fn target(&self, route: Route) -> Arc<Target> {
        match route {
            Route::Statements => self.inner.statements.clone(),
            Route::Sessions => self.inner.sessions_target.clone(),
        }
    }

    /// The server the statements go to now, as DATABASE_URL names it.
    pub fn writing_to(&self) -> String {
        self.inner.statements.current().label.clone()
    }

    /// A pool whose sessions follow the primary: each new session is checked to be on a
    /// server that accepts writes (if not, the hosts are searched again and the session
    /// replaced), and a session opened before the database was last marked down is
    /// closed rather than handed out. Sessions are opened when needed.
    pub fn pool(&self, route: Route, size: u32, customize: fn(PgConnectOptions) -> PgConnectOptions) -> PgPool {
        let target = self.target(route);
        let customize: Customize = Arc::new(customize);
        // The pool's hooks hold the health weakly: the health holds the pool (to point it at
        // another host), and a cycle would keep both, and their sessions, alive forever.
        let (checking, stale, opts) = (Arc::downgrade(&self.inner), Arc::downgrade(&self.inner), customize.clone());
        let pool = PgPoolOptions::new()
            .max_connections(size)
            .acquire_timeout(ACQUIRE_TIMEOUT)
            .after_connect(move |conn, _| {
                let (health, customize) = (checking.upgrade().map(|inner| Health { inner }), opts.clone());
                Box::pin(async move {
                    let Some(health) = health else { return Ok(()) };
                    if hosts::writable(conn).await? == Writable::Yes {
                        return Ok(());
                    }
                    // The server stopped taking writes since the pool was pointed at it.
                    let target = health.target(route);
                    let found = match target.hosts.find_writable(&*customize).await {
                        Ok(found) => Ok(found),
                        Err(_) => {
                            // Wait for the probe, as sqlx waits for a server that refuses:
                            // the acquire's own timeout ends the wait (and an error here
                            // would be logged by sqlx at every retry).
                            health.mark_down();
                            health.came_up().await;
                            target.hosts.find_writable(&*customize).await
                        }
                    };
                    let (i, fresh) = found.map_err(|e| sqlx::Error::Configuration(e.into()))?;
                    target.switch(i);
                    let _ = std::mem::replace(conn, fresh).close().await;
                    Ok(())
                })
            })
            .before_acquire(move |_, meta| {
                let opened = Instant::now().checked_sub(meta.age);
                let down = stale.upgrade().and_then(|inner| *inner.marked_down_at.lock().expect("not poisoned"));
                let reuse = match (down, opened) {
                    (Some(down), Some(opened)) => opened > down,
                    _ => true,
                };
                Box::pin(async move { Ok(reuse) })
            })
            .connect_lazy_with(customize(target.current().options.clone()));
        target.pools.lock().expect("not poisoned").push((pool.clone(), customize));
        pool
    }

    /// A pool for statements (`Route::Statements`), made for what DATABASE_URL names: a
    /// pooler in transaction mode (see `pooled_statements`) or PostgreSQL itself.
    pub fn statements_pool(&self, size: u32) -> Pool {
        if self.pooled() {
            Pool::pooled(self.pool(Route::Statements, size, pooled_statements))
        } else {
            Pool::direct(self.pool(Route::Statements, size, no_jit))
        }
    }

    pub fn is_down(&self) -> bool {
        *self.inner.down.borrow()
    }

    /// Resolves when the database is not (or no longer) marked down.
    pub async fn came_up(&self) {
        let _ = self.inner.down.subscribe().wait_for(|down| !*down).await;
    }

    /// Resolves when the database is marked down: a request waiting on the pool gives up
    /// then rather than at the acquire timeout.
    pub async fn went_down(&self) {
        let _ = self.inner.down.subscribe().wait_for(|down| *down).await;
    }

    /// What a statement's error says about the database: cut, unreachable, or read-only
    /// (SQLSTATE 25006: a server that stopped taking writes under a session, as behind a
    /// pooler that moved) marks it down, so that the pools move to the server that accepts
    /// writes. Returns whether it did.
    pub fn saw(&self, e: &sqlx::Error) -> bool {
        let down = outage(e).is_some_and(|o| o != Outage::PoolClosed);
        if down {
            self.mark_down();
        }
        down
    }

    /// Marks the database down until a probe finds a server that accepts writes; the first
    /// call starts the probe.
    pub fn mark_down(&self) {
        let inner = &self.inner;
        if inner.statements.closed() || !inner.down.send_if_modified(|down| !std::mem::replace(down, true)) {
            return;
        }
        *inner.marked_down_at.lock().expect("not poisoned") = Some(Instant::now());
        tracing::warn!("the database is unreachable or accepts no writes; answering 503 at once until a server accepts writes");
        let health = self.clone();
        tokio::spawn(async move {
            let inner = &health.inner;
            // The first try at once: a LISTEN session can also break with the server fine.
            let since = Instant::now();
            let mut said_why = false;
            loop {
                if inner.statements.closed() {
                    return;
                }
                let found = match inner.statements.find().await {
                    Ok(()) if health.pooled() => inner.sessions_target.find().await,
                    found => found,
                };
                match found {
                    Ok(()) => break,
                    // Once, if it lasts: a failover takes seconds; longer needs a person.
                    Err(e) if !said_why && since.elapsed() >= STILL_DOWN_AFTER => {
                        said_why = true;
                        tracing::warn!("still no server accepts writes after {} s: {e}", STILL_DOWN_AFTER.as_secs());
                    }
                    Err(_) => {}
                }
                tokio::time::sleep(PROBE_EVERY).await;
            }
            inner.down.send_replace(false);
            tracing::info!(writing_to = health.writing_to(), secs = since.elapsed().as_secs_f64(), "the database accepts writes again");
        });
    }
}

/// A pool on `url` (its first host that accepts writes), for tools and tests; unlike
/// `Database::open`'s pools it does not follow a failover.
pub async fn connect(url: &str, pool_size: u32) -> anyhow::Result<Pool> {
    let hosts = Hosts::parse(url, "DATABASE_URL")?;
    let (i, conn) = find_at_start(&hosts, no_jit).await?;
    let _ = conn.close().await;
    let pool = PgPoolOptions::new()
        .max_connections(pool_size)
        .acquire_timeout(ACQUIRE_TIMEOUT)
        .connect_lazy_with(no_jit(hosts.hosts()[i].options.clone()))
        .into();
    check_server_version(&pool).await?;
    Ok(pool)
}

const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(10);

/// At start a server may still be coming up (or being promoted): the hosts are tried
/// again for the pool's acquire timeout before chime gives up, naming each host and why.
async fn find_at_start(hosts: &Hosts, customize: fn(PgConnectOptions) -> PgConnectOptions) -> anyhow::Result<(usize, PgConnection)> {
    check_root_cert(hosts)?;
    let deadline = Instant::now() + ACQUIRE_TIMEOUT;
    loop {
        match hosts.find_writable(&customize).await {
            Ok(found) => return Ok(found),
            // A certificate refused now is refused again: no waiting.
            Err(e) if Instant::now() >= deadline || e.certificate_refused => {
                let mode = hosts.hosts()[0].options.get_ssl_mode();
                let context = match mode {
                    PgSslMode::Require | PgSslMode::VerifyCa | PgSslMode::VerifyFull => {
                        format!("cannot connect to PostgreSQL over TLS (sslmode={} in {})", ssl_mode_name(mode), hosts.setting)
                    }
                    _ => format!("cannot connect to PostgreSQL (check {}, or unset it to use the embedded database)", hosts.setting),
                };
                return Err(anyhow::Error::new(e).context(context));
            }
            Err(_) => tokio::time::sleep(PROBE_EVERY).await,
        }
    }
}

/// Also notes whether the database is on a Citus coordinator (`citus::active`).
async fn check_server_version(pool: &Pool) -> anyhow::Result<()> {
    let (version, citus): (i32, bool) =
        crate::db::query_as("SELECT current_setting('server_version_num')::int, EXISTS (SELECT FROM pg_extension WHERE extname = 'citus')")
            .fetch_one(pool)
            .await
            .context("asking PostgreSQL for its version")?;
    if let Err(e) = check_version_num(version) {
        pool.close().await;
        return Err(e);
    }
    citus::found(citus);
    Ok(())
}

/// The oldest PostgreSQL chime runs on: 14 brought `idle_session_timeout`, which ends a hung
/// leader's session and so frees its lock (`leader.rs`). On 13 the leader's session is
/// refused and no node would ever lead, so refuse to start instead.
const MIN_SERVER_VERSION: i32 = 140_000;

fn check_version_num(version_num: i32) -> anyhow::Result<()> {
    anyhow::ensure!(
        version_num >= MIN_SERVER_VERSION,
        "PostgreSQL {}.{} is too old: chime needs PostgreSQL 14 or later (it relies on idle_session_timeout, new in 14)",
        version_num / 10_000,
        version_num % 10_000
    );
    Ok(())
}

fn ssl_mode_name(mode: PgSslMode) -> &'static str {
    match mode {
        PgSslMode::Disable => "disable",
        PgSslMode::Allow => "allow",
        PgSslMode::Prefer => "prefer",
        PgSslMode::Require => "require",
        PgSslMode::VerifyCa => "verify-ca",
        PgSslMode::VerifyFull => "verify-full",
    }
}

/// sqlx reads `sslrootcert` only during the TLS handshake, where a missing file is a bare
/// "No such file or directory" that names neither the file nor the setting. Read it once
/// here, with OpenSSL as sqlx does, so that a bad one is a clear startup error.
fn check_root_cert(hosts: &Hosts) -> anyhow::Result<()> {
    // The same names and environment variable sqlx accepts.
    let root_cert = hosts.root_cert.clone().or_else(|| std::env::var("PGSSLROOTCERT").ok());
    let Some(path) = root_cert else { return Ok(()) };
    let trimmed = path.trim();
    // Inline PEM, told apart from a path as sqlx does.
    let (pem, name) = if trimmed.starts_with("-----BEGIN") && trimmed.ends_with("-----") {
        (path.as_bytes().to_vec(), "(inline PEM)")
    } else {
        let pem = std::fs::read(&path).with_context(|| format!("cannot read sslrootcert {path} ({})", hosts.setting))?;
        (pem, path.as_str())
    };
    let certs = openssl::x509::X509::stack_from_pem(&pem).map_err(|e| anyhow::anyhow!("sslrootcert {name}: not a valid PEM certificate: {e}"))?;
    anyhow::ensure!(!certs.is_empty(), "sslrootcert {name}: no certificate in it (expected PEM, -----BEGIN CERTIFICATE-----)");
    // sqlx gives OpenSSL the file's first certificate only (native-tls's `from_pem`), where
    // libpq trusts them all: a bundle works only if the CA needed comes first.
    if certs.len() > 1 {
        tracing::warn!(
            "sslrootcert {name} holds {} certificates, of which only the first is trusted (sqlx reads one): \
             put the certificate of the CA that signed the server's first, or alone",
            certs.len()
        );
    }
    Ok(())
}

/// Applies the pending migrations on a connection of its own, whose session settings end
/// with it, then warns about applied migrations newer than this binary.
pub async fn migrate(pool: &Pool) -> anyhow::Result<()> {
    // Waiting for another node's migrations, or a long one, is expected here: not a "slow
    // statement" warning.
    let options = pool.connect_options().as_ref().clone().disable_statement_logging();
    let mut conn = PgConnection::connect_with(&options).await.context("connecting to migrate")?;
    let result = migrate_on(&mut conn).await;
    let _ = conn.close().await;
    result?;
    Schema::read(pool).await?.warn_newer();
    Ok(())
}

pub async fn migrate_on(conn: &mut PgConnection) -> anyhow::Result<()> {
    // The advisory lock sqlx's migrator takes (older binaries take it too): nodes starting
    // together wait for the first one's migrations, however long they take.
    conn.lock().await.context("waiting for the migration lock")?;
    // A DDL statement queued behind a long transaction would queue every read and write of
    // its table behind itself: give up instead, and let the next start try again. Session
    // wide (a no-transaction migration runs outside any transaction); the session ends here.
    let result = async {
        crate::db::query("SET lock_timeout = '10s'").execute(&mut *conn).await?;
        MIGRATOR.run(&mut *conn).await.context("applying database migrations")?;
        // On a Citus coordinator, the tables the migrations made are placed on the cluster.
        if citus::installed(&mut *conn).await? {
            citus::distribute(&mut *conn).await?;
        }
        anyhow::Ok(())
    }
    .await;
    conn.unlock().await.context("releasing the migration lock")?;
    result
}

/// This binary's migrations the database does not record as applied, by version: one
/// statement, for `/readyz`. Migrations newer than this binary do not count: it runs on the
/// schema they leave (migrations/README.md), so a node of the previous release stays ready
/// beside them.
pub async fn unapplied(pool: &Pool) -> Result<Vec<i64>, sqlx::Error> {
    let known: Vec<i64> = MIGRATOR.iter().map(|m| m.version).collect();
    let applied: Option<Vec<i64>> = crate::db::query_scalar("SELECT array_agg(version) FROM _sqlx_migrations WHERE success AND version = ANY($1)")
        .bind(&known)
        .fetch_one(pool)
        .await?;
    let applied = applied.unwrap_or_default();
    Ok(known.into_iter().filter(|v| !applied.contains(v)).collect())
}

/// The migrations the database records as applied, against the ones this binary knows.
pub struct Schema {
    pub applied: Vec<(i64, String)>,
}

impl Schema {
    /// Reads without creating anything: a database never migrated has applied nothing.
    pub async fn read(pool: &Pool) -> anyhow::Result<Schema> {
        let exists: bool = crate::db::query_scalar("SELECT to_regclass('_sqlx_migrations') IS NOT NULL")
            .fetch_one(pool)
            .await
            .context("reading the applied migrations")?;
        if !exists {
            return Ok(Schema { applied: Vec::new() });
        }
        let applied = crate::db::query_as("SELECT version, description FROM _sqlx_migrations WHERE success ORDER BY version")
            .fetch_all(pool)
            .await
            .context("reading the applied migrations")?;
        Ok(Schema { applied })
    }

    pub fn is_applied(&self, version: i64) -> bool {
        self.applied.iter().any(|(v, _)| *v == version)
    }

    /// This binary's migrations not applied yet, in order.
    pub fn pending(&self) -> Vec<&'static Migration> {
        MIGRATOR.iter().filter(|m| !self.is_applied(m.version)).collect()
    }

    /// Applied migrations this binary does not know: a newer binary's.
    pub fn newer(&self) -> Vec<&(i64, String)> {
        self.applied.iter().filter(|(v, _)| !MIGRATOR.version_exists(*v)).collect()
    }

    pub fn warn_newer(&self) {
        let newer = self.newer();
        if !newer.is_empty() {
            let names: Vec<_> = newer.iter().map(|(v, d)| format!("{v} ({d})")).collect();
            tracing::warn!(
                "the database has migrations newer than this binary: {}; running on it, as migrations only expand the schema a release before it contracts (migrations/README.md)",
                names.join(", ")
            );
        }
    }

    /// For what does not migrate: an error naming `chime migrate` while this binary's
    /// migrations are not all applied.
    pub fn require_current(&self) -> anyhow::Result<()> {
        let pending = self.pending();
        if !pending.is_empty() {
            let names: Vec<_> = pending.iter().map(|m| format!("{} ({})", m.version, m.description)).collect();
            anyhow::bail!("the database schema is older than this chime needs: pending migrations {}; run `chime migrate` first", names.join(", "));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn servers_older_than_14_are_refused_by_name() {
        let e = check_version_num(130_016).unwrap_err().to_string();
        assert!(e.contains("PostgreSQL 13.16 is too old") && e.contains("14 or later"), "{e}");
        assert!(check_version_num(140_000).is_ok());
        assert!(check_version_num(150_018).is_ok());
    }
}
