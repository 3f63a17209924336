//! Reaching the database: an external one (DATABASE_URL) or the embedded one, and the
//! migrations.

use std::time::Duration;

use anyhow::Context;
use sqlx::PgPool;
use sqlx::migrate::Migrator;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

use crate::config::DbArgs;
use crate::embedded_pg::{self, EmbeddedPg, EmbeddedPgError};

pub static MIGRATOR: Migrator = sqlx::migrate!();

/// The database a command works on. An embedded PostgreSQL started here is stopped when
/// the command ends (`close`).
pub struct Database {
    pub pool: PgPool,
    embedded: Option<EmbeddedPg>,
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
        Ok(Database { pool, embedded })
    }

    pub async fn close(self) {
        self.pool.close().await;
        if let Some(pg) = self.embedded {
            pg.stop().await;
        }
    }
}

pub async fn connect(url: &str, pool_size: u32) -> anyhow::Result<PgPool> {
    let options: PgConnectOptions = url.parse().context("DATABASE_URL is not a valid PostgreSQL URL")?;
    // chime's statements each touch a few rows by index. When the planner misjudges one
    // (statistics of a partition analysed while empty), JIT compiling it costs hundreds of
    // milliseconds (measured: 658 ms for a 1 ms update) and gains nothing.
    let options = options.options([("jit", "off")]);
    PgPoolOptions::new()
        .max_connections(pool_size)
        .acquire_timeout(Duration::from_secs(10))
        .connect_with(options)
        .await
        .context("cannot connect to PostgreSQL (check DATABASE_URL, or unset it to use the embedded database)")
}

pub async fn migrate(pool: &PgPool) -> anyhow::Result<()> {
    MIGRATOR.run(pool).await.context("applying database migrations")?;
    Ok(())
}
