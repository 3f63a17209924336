//! Reaching the database: an external one (DATABASE_URL) or the embedded one, whether it
//! is known to be down, and the migrations.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use sqlx::{ConnectOptions, Connection, PgConnection, PgPool};
use sqlx::migrate::{Migrate, Migration, Migrator};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions, PgSslMode};
use tokio::sync::watch;

use crate::config::DbArgs;
use crate::embedded_pg::{self, EmbeddedPg, EmbeddedPgError};

/// The migrations this binary knows. Applied migrations it does not know (a newer binary's)
/// are let be: migrations are expand/contract (`migrations/README.md`), so this binary runs
/// on the schema they leave. Locking is `migrate_on`'s, so that its wait has no timeout.
pub static MIGRATOR: Migrator = {
    let mut migrator = sqlx::migrate!();
    migrator.ignore_missing = true;
    migrator.locking = false;
    migrator
};

/// The database a command works on. An embedded PostgreSQL started here is supervised
/// (restarted when it dies) and stopped when the command ends (`close`).
pub struct Database {
    pub pool: PgPool,
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
        let pool = match connect(&url, args.db_pool_size).await {
            Ok(pool) => pool,
            Err(e) => {
                if let Some(pg) = embedded {
                    pg.stop().await;
                }
                return Err(e);
            }
        };
        let health = Health::new(pool.clone());
        let embedded = embedded.map(|pg| {
            let health = health.clone();
            pg.supervise(move || health.mark_down())
        });
        Ok(Database { pool, health, embedded })
    }

    pub async fn close(self) {
        self.pool.close().await;
        if let Some(pg) = self.embedded {
            pg.stop().await;
        }
    }
}

/// Whether the database is known to be down. While it is, `/readyz` and the API answer 503
/// at once: otherwise each request would wait out the pool's acquire timeout, since sqlx
/// keeps retrying a refused connection until then (10 s).
///
/// Marked down by whoever notices first: the embedded database's supervisor (its postmaster
/// exited), the API's LISTEN session (its connection broke: an external server that
/// crashed or was stopped closes it at once), or a request that found the database
/// unreachable. Marked up again by a probe that, while the database is down, tries one
/// connection every `PROBE_EVERY`; a single attempt, unlike the pool's, fails at once on a
/// refused connection, and succeeds only once the server accepts sessions again (after
/// its crash recovery).
#[derive(Clone)]
pub struct Health {
    pool: PgPool,
    /// True while down; requests in flight wait on it too.
    down: Arc<watch::Sender<bool>>,
}

const PROBE_EVERY: Duration = Duration::from_millis(200);
/// A host that drops packets gives no answer at all.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

impl Health {
    pub fn new(pool: PgPool) -> Health {
        Health { pool, down: Arc::new(watch::Sender::new(false)) }
    }

    pub fn is_down(&self) -> bool {
        *self.down.borrow()
    }

    /// Resolves when the database is marked down: a request waiting on the pool gives up
    /// then rather than at the acquire timeout.
    pub async fn went_down(&self) {
        let _ = self.down.subscribe().wait_for(|down| *down).await;
    }

    /// Marks the database down until a probe connects; the first call starts the probe.
    pub fn mark_down(&self) {
        if self.pool.is_closed() || !self.down.send_if_modified(|down| !std::mem::replace(down, true)) {
            return;
        }
        tracing::warn!("the database is unreachable; answering 503 at once until it is back");
        let health = self.clone();
        tokio::spawn(async move {
            let options = health.pool.connect_options();
            // The first try at once: a LISTEN session can also break with the server fine.
            loop {
                if health.pool.is_closed() {
                    return;
                }
                if let Ok(Ok(conn)) = tokio::time::timeout(PROBE_TIMEOUT, PgConnection::connect_with(&options)).await {
                    let _ = conn.close().await;
                    break;
                }
                tokio::time::sleep(PROBE_EVERY).await;
            }
            health.down.send_replace(false);
            tracing::info!("the database is reachable again");
        });
    }
}

pub async fn connect(url: &str, pool_size: u32) -> anyhow::Result<PgPool> {
    let options: PgConnectOptions = url.parse().context("DATABASE_URL is not a valid PostgreSQL URL")?;
    check_root_cert(url)?;
    let ssl_mode = options.get_ssl_mode();
    // chime's statements each touch a few rows by index. When the planner misjudges one
    // (statistics of a partition analysed while empty), JIT compiling it costs hundreds of
    // milliseconds (measured: 658 ms for a 1 ms update) and gains nothing.
    let options = options.options([("jit", "off")]);
    let pool = PgPoolOptions::new()
        .max_connections(pool_size)
        .acquire_timeout(Duration::from_secs(10))
        .connect_with(options)
        .await
        .with_context(|| match ssl_mode {
            PgSslMode::Require | PgSslMode::VerifyCa | PgSslMode::VerifyFull => format!(
                "cannot connect to PostgreSQL over TLS (sslmode={} in DATABASE_URL)",
                ssl_mode_name(ssl_mode)
            ),
            _ => "cannot connect to PostgreSQL (check DATABASE_URL, or unset it to use the embedded database)".into(),
        })?;
    let version: i32 = sqlx::query_scalar("SELECT current_setting('server_version_num')::int")
        .fetch_one(&pool)
        .await
        .context("asking PostgreSQL for its version")?;
    if let Err(e) = check_server_version(version) {
        pool.close().await;
        return Err(e);
    }
    Ok(pool)
}

/// The oldest PostgreSQL chime runs on: 14 brought `idle_session_timeout`, which ends a hung
/// leader's session and so frees its lock (`leader.rs`). On 13 the leader's session is
/// refused and no node would ever lead, so refuse to start instead.
const MIN_SERVER_VERSION: i32 = 140_000;

fn check_server_version(version_num: i32) -> anyhow::Result<()> {
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
/// here so that a bad one is a clear startup error.
fn check_root_cert(url: &str) -> anyhow::Result<()> {
    let parsed = url::Url::parse(url).context("DATABASE_URL is not a valid PostgreSQL URL")?;
    // The same names and environment variable sqlx accepts.
    let root_cert = parsed
        .query_pairs()
        .find(|(k, _)| matches!(k.as_ref(), "sslrootcert" | "ssl-root-cert" | "ssl-ca"))
        .map(|(_, v)| v.into_owned())
        .or_else(|| std::env::var("PGSSLROOTCERT").ok());
    let Some(path) = root_cert else { return Ok(()) };
    let trimmed = path.trim();
    // Inline PEM, told apart from a path as sqlx does.
    let (pem, name) = if trimmed.starts_with("-----BEGIN") && trimmed.ends_with("-----") {
        (path.as_bytes().to_vec(), "(inline PEM)")
    } else {
        let pem = std::fs::read(&path).with_context(|| format!("cannot read sslrootcert {path} (DATABASE_URL)"))?;
        (pem, path.as_str())
    };
    let mut count = 0;
    for cert in CertificateDer::pem_slice_iter(&pem) {
        cert.map_err(|e| anyhow::anyhow!("sslrootcert {name}: not a valid PEM certificate: {e}"))?;
        count += 1;
    }
    anyhow::ensure!(count > 0, "sslrootcert {name}: no certificate in it (expected PEM, -----BEGIN CERTIFICATE-----)");
    Ok(())
}

/// Applies the pending migrations on a connection of its own, whose session settings end
/// with it, then warns about applied migrations newer than this binary.
pub async fn migrate(pool: &PgPool) -> anyhow::Result<()> {
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
        sqlx::query("SET lock_timeout = '10s'").execute(&mut *conn).await?;
        MIGRATOR.run(&mut *conn).await.context("applying database migrations")
    }
    .await;
    conn.unlock().await.context("releasing the migration lock")?;
    result
}

/// The migrations the database records as applied, against the ones this binary knows.
pub struct Schema {
    pub applied: Vec<(i64, String)>,
}

impl Schema {
    /// Reads without creating anything: a database never migrated has applied nothing.
    pub async fn read(pool: &PgPool) -> anyhow::Result<Schema> {
        let exists: bool = sqlx::query_scalar("SELECT to_regclass('_sqlx_migrations') IS NOT NULL")
            .fetch_one(pool)
            .await
            .context("reading the applied migrations")?;
        if !exists {
            return Ok(Schema { applied: Vec::new() });
        }
        let applied = sqlx::query_as("SELECT version, description FROM _sqlx_migrations WHERE success ORDER BY version")
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
            anyhow::bail!(
                "the database schema is older than this chime needs: pending migrations {}; run `chime migrate` first",
                names.join(", ")
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn servers_older_than_14_are_refused_by_name() {
        let e = check_server_version(130_016).unwrap_err().to_string();
        assert!(e.contains("PostgreSQL 13.16 is too old") && e.contains("14 or later"), "{e}");
        assert!(check_server_version(140_000).is_ok());
        assert!(check_server_version(150_018).is_ok());
    }
}
