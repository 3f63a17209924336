//! How chime sends its statements: the one place that knows whether they go straight to
//! PostgreSQL or through a pooler in transaction mode (CHIME_DIRECT_DATABASE_URL set).
//!
//! Through PgBouncer in transaction mode a server session serves a client only until the
//! client's transaction ends; outside a transaction, until each Sync. sqlx sends a statement
//! with parameters in two rounds (Parse + Describe + Sync, then Bind + Execute + Sync), so
//! PgBouncer may hand the server session to another client between them. Measured through
//! PgBouncer 1.18 (20 clients): errors, and worse, silent wrong results (a Bind ran another
//! client's statement). Named statements (sqlx's default, cached per connection) collide
//! across clients even inside transactions ("prepared statement sqlx_s_1 already exists"),
//! and `statement_cache_capacity(0)` does not unname them. The one safe way, measured with 0
//! errors and 0 wrong results: every statement unnamed, and every statement inside a
//! transaction. So in pooler mode:
//! - a statement run on `&Pool` runs as BEGIN, the statement (unnamed), COMMIT;
//! - a statement run inside `Pool::begin`'s transaction is unnamed if it was made with
//!   `db::query`, `db::query_as` or `db::query_scalar` (clippy refuses `sqlx::query*` in
//!   chime's code: clippy.toml).
//!
//! In direct mode both forward to sqlx unchanged: prepared statements and their cache stay.

use std::sync::atomic::{AtomicBool, Ordering};

use futures_util::future::BoxFuture;
use futures_util::stream::{self, BoxStream, StreamExt, TryStreamExt};
use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgArguments, PgConnectOptions, PgPoolOptions, PgQueryResult, PgRow, PgStatement, PgTypeInfo};
use sqlx::query::{Query, QueryAs, QueryScalar};
use sqlx::{Either, Error, Execute, Executor, FromRow, PgPool, Postgres, SqlSafeStr, SqlStr, Transaction};

/// The pool chime's statements go through. Cheap to clone (one pool shared).
#[derive(Clone, Debug)]
pub struct Pool {
    pub(super) pg: PgPool,
    /// Through a pooler in transaction mode: each statement in a transaction of its own,
    /// and unnamed.
    pooled: bool,
}

/// Whether `db::query*` make named (prepared and cached) statements: false once a pool
/// through a pooler exists in this process. A process has one database, so one mode.
static NAMED: AtomicBool = AtomicBool::new(true);

fn named() -> bool {
    NAMED.load(Ordering::Relaxed)
}

impl Pool {
    /// A pool whose sessions reach PostgreSQL itself.
    pub fn direct(pg: PgPool) -> Pool {
        Pool { pg, pooled: false }
    }

    /// A pool through a pooler in transaction mode; from now on `db::query*` make unnamed
    /// statements in this process.
    pub fn pooled(pg: PgPool) -> Pool {
        NAMED.store(false, Ordering::Relaxed);
        Pool { pg, pooled: true }
    }

    /// Whether statements go through a pooler.
    pub fn is_pooled(&self) -> bool {
        self.pooled
    }

    /// A transaction: it holds one server session throughout, through a pooler too.
    pub async fn begin(&self) -> Result<Transaction<'static, Postgres>, Error> {
        self.pg.begin().await
    }

    /// A read-only transaction in one snapshot (REPEATABLE READ): every statement in it
    /// sees the database as it was at its first, so a page read by several statements
    /// never mixes two moments. Read only, it takes no lock beyond its statements' own
    /// ACCESS SHARE. Commit it (or drop it) when done.
    pub async fn snapshot(&self) -> Result<Transaction<'static, Postgres>, Error> {
        let mut tx = self.pg.begin().await?;
        query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY").execute(&mut *tx).await?;
        Ok(tx)
    }

    /// A session of the pool. Through a pooler, statements on it belong in a transaction
    /// (`begin`); this is for holding sessions, and for what runs on a direct pool.
    pub async fn acquire(&self) -> Result<PoolConnection<Postgres>, Error> {
        self.pg.acquire().await
    }

    pub async fn close(&self) {
        self.pg.close().await
    }

    pub fn is_closed(&self) -> bool {
        self.pg.is_closed()
    }

    pub fn size(&self) -> u32 {
        self.pg.size()
    }

    pub fn num_idle(&self) -> usize {
        self.pg.num_idle()
    }

    pub fn options(&self) -> &PgPoolOptions {
        self.pg.options()
    }

    pub fn connect_options(&self) -> std::sync::Arc<PgConnectOptions> {
        self.pg.connect_options()
    }
}

/// Tools and tests hand a plain pool: it reaches PostgreSQL itself.
impl From<PgPool> for Pool {
    fn from(pg: PgPool) -> Pool {
        Pool::direct(pg)
    }
}

/// `sqlx::query`, unnamed when statements go through a pooler.
pub fn query<'q>(sql: impl SqlSafeStr) -> Query<'q, Postgres, PgArguments> {
    #[allow(clippy::disallowed_methods)]
    sqlx::query(sql).persistent(named())
}

/// `sqlx::query_as`, unnamed when statements go through a pooler.
pub fn query_as<'q, O>(sql: impl SqlSafeStr) -> QueryAs<'q, Postgres, O, PgArguments>
where
    O: for<'r> FromRow<'r, PgRow>,
{
    #[allow(clippy::disallowed_methods)]
    sqlx::query_as(sql).persistent(named())
}

/// `sqlx::query_scalar`, unnamed when statements go through a pooler.
pub fn query_scalar<'q, O>(sql: impl SqlSafeStr) -> QueryScalar<'q, Postgres, O, PgArguments>
where
    (O,): for<'r> FromRow<'r, PgRow>,
{
    #[allow(clippy::disallowed_methods)]
    sqlx::query_scalar(sql).persistent(named())
}

/// A statement sent unnamed, whatever it was made with.
struct Unnamed<E>(E);

impl<'q, E: Execute<'q, Postgres>> Execute<'q, Postgres> for Unnamed<E> {
    fn sql(self) -> SqlStr {
        self.0.sql()
    }

    fn statement(&self) -> Option<&PgStatement> {
        self.0.statement()
    }

    fn take_arguments(&mut self) -> Result<Option<PgArguments>, sqlx::error::BoxDynError> {
        self.0.take_arguments()
    }

    fn persistent(&self) -> bool {
        false
    }
}

impl<'p> Executor<'p> for &'_ Pool {
    type Database = Postgres;

    fn fetch_many<'e, 'q: 'e, E>(self, query: E) -> BoxStream<'e, Result<Either<PgQueryResult, PgRow>, Error>>
    where
        'p: 'e,
        E: 'q + Execute<'q, Postgres>,
    {
        if !self.pooled {
            return self.pg.fetch_many(query);
        }
        // Read whole before COMMIT: chime's statements each return a few rows.
        let pg = self.pg.clone();
        stream::once(async move {
            let mut tx = pg.begin().await?;
            let items: Vec<_> = (&mut *tx).fetch_many(Unnamed(query)).try_collect().await?;
            tx.commit().await?;
            Ok::<_, Error>(stream::iter(items.into_iter().map(Ok)))
        })
        .try_flatten()
        .boxed()
    }

    fn fetch_optional<'e, 'q: 'e, E>(self, query: E) -> BoxFuture<'e, Result<Option<PgRow>, Error>>
    where
        'p: 'e,
        E: 'q + Execute<'q, Postgres>,
    {
        if !self.pooled {
            return self.pg.fetch_optional(query);
        }
        let pg = self.pg.clone();
        Box::pin(async move {
            let mut tx = pg.begin().await?;
            let row = (&mut *tx).fetch_optional(Unnamed(query)).await?;
            tx.commit().await?;
            Ok(row)
        })
    }

    /// A named statement: only on a direct pool (chime prepares none itself); through a
    /// pooler its name would outlive the server session it was made on.
    fn prepare_with<'e>(self, sql: SqlStr, parameters: &'e [PgTypeInfo]) -> BoxFuture<'e, Result<PgStatement, Error>>
    where
        'p: 'e,
    {
        if self.pooled {
            return Box::pin(async { Err(Error::Configuration("no prepared statements through a pooler in transaction mode".into())) });
        }
        self.pg.prepare_with(sql, parameters)
    }

    #[doc(hidden)]
    fn describe<'e>(self, sql: SqlStr) -> BoxFuture<'e, Result<sqlx::Describe<Postgres>, Error>>
    where
        'p: 'e,
    {
        self.pg.describe(sql)
    }
}
