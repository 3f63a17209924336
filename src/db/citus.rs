//! chime on a Citus cluster (docs/book/src/citus.md; the design: docs/design/citus.md).
//!
//! The migrations are the same on plain PostgreSQL and on a Citus coordinator: each makes
//! ordinary tables, which Citus keeps on the coordinator. Then, where the citus extension
//! is installed in chime's database, `chime migrate` (and a node's start, which migrates)
//! runs one more step, `citus.sql`, which distributes the per-task tables by biz type and
//! makes `biz_types` a reference table. Why a step after the migrations rather than
//! migrations of their own that do nothing without Citus: a migration runs once, so one
//! applied while the database was a plain primary would never distribute anything once it
//! became a coordinator; the step runs at every migrate and does only what is left to do.
//! On a database without the extension it is one catalog probe, and nothing changes.

use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::Context;
use sqlx::PgConnection;

/// Set once a pool of this process reached a Citus coordinator: a process has one
/// database, so one mode (as `pool::NAMED`).
static ACTIVE: AtomicBool = AtomicBool::new(false);

/// Whether this process's database is on a Citus coordinator, as found when its pool was
/// made (`db::connect`, `Database::open`): the engine then claims one biz type per
/// statement (`tasks::lease::claim`, src/tasks/sql/claim_citus.sql).
pub fn active() -> bool {
    ACTIVE.load(Ordering::Relaxed)
}

pub(super) fn found(citus: bool) {
    if citus {
        ACTIVE.store(true, Ordering::Relaxed);
    }
}

/// Whether chime's database is on a Citus coordinator: the citus extension is installed in
/// it (`CREATE EXTENSION citus`, which a Citus cluster's setup does in each database).
pub async fn installed(conn: &mut PgConnection) -> Result<bool, sqlx::Error> {
    crate::db::query_scalar("SELECT EXISTS (SELECT FROM pg_extension WHERE extname = 'citus')").fetch_one(conn).await
}

/// Places chime's tables on the cluster, as `citus.sql` says; idempotent. Needs the
/// workers registered (`citus_add_node`): Citus puts a distributed table's shards on them.
pub async fn distribute(conn: &mut PgConnection) -> anyhow::Result<()> {
    let workers: i64 = crate::db::query_scalar("SELECT count(*) FROM pg_dist_node WHERE noderole = 'primary' AND shouldhaveshards AND isactive")
        .fetch_one(&mut *conn)
        .await
        .context("reading the Citus cluster's nodes (pg_dist_node)")?;
    anyhow::ensure!(
        workers > 0,
        "the citus extension is installed in chime's database but no node takes shards: register the workers on the coordinator \
         (SELECT citus_add_node('worker-host', 5432) for each, after CREATE EXTENSION citus in this database on every worker), \
         then run `chime migrate` again (docs/book/src/citus.md)"
    );
    crate::db::query(include_str!("citus.sql"))
        .execute(&mut *conn)
        .await
        .context("distributing chime's tables on the Citus cluster (src/db/citus.sql)")?;
    Ok(())
}

/// Begins a transaction for statements routed by a biz type given as a parameter: each is
/// planned with its parameters' values (`plan_cache_mode = force_custom_plan`, for this
/// transaction only). PostgreSQL runs a statement prepared and run often with a generic
/// plan, in which the biz type stays a parameter: Citus cannot route such a plan to one
/// shard, and refuses it ("could not create distributed plan") or, with `now()` in a
/// CASE, refuses what the values would have folded away. The notice senders and the pull
/// reserve run their Citus statements in one (docs/design/citus.md).
pub async fn begin_routed(pool: &crate::db::Pool) -> Result<sqlx::Transaction<'static, sqlx::Postgres>, sqlx::Error> {
    let mut tx = pool.begin().await?;
    crate::db::query("SELECT set_config('plan_cache_mode', 'force_custom_plan', true)").execute(&mut *tx).await?;
    Ok(tx)
}
