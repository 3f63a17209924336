//! Where a task row lives. Due before the hot horizon (`hot_horizon.until`), in the
//! partitioned `tasks`; due later, in `tasks_cold`, until the migrator moves it in. The
//! partitions themselves (their DDL, the horizon, retention) are `partitions`' business;
//! the rows in them are the task store's, so the statements that move rows between the
//! two, and that clean up after a retired partition, are here.

use sqlx::{AssertSqlSafe, PgConnection};
use uuid::Uuid;

use crate::db::Pool;

/// Moves one batch of cold tasks due before the hot horizon into the hot partitions, in
/// one statement. Returns how many moved; fewer than `batch` means none is left.
/// On a Citus cluster, per biz type (`move_cold_citus`).
pub async fn move_cold(pool: &Pool, batch: i64) -> Result<u64, sqlx::Error> {
    if crate::db::citus::active() {
        return move_cold_citus(pool, batch).await;
    }
    Ok(crate::db::query(include_str!("sql/move_cold.sql")).bind(batch).execute(pool).await?.rows_affected())
}

/// move_cold_citus.sql's first step: locks up to $3 of biz type $1's cold tasks due before
/// the hot horizon $2, oldest first; those a second mover, a reschedule or a cancel holds
/// are passed by. One task on the biz type's worker (tests/citus/statements.rs).
pub const MOVE_COLD_LOCK_CITUS: &str =
    "SELECT id FROM tasks_cold WHERE biz_type_id = $1 AND run_at < $2 ORDER BY run_at LIMIT $3 FOR UPDATE SKIP LOCKED";

/// move_cold_citus.sql's last step: deletes from cold storage the tasks $2 of biz type $1
/// it copied, which the first step locked.
pub const MOVE_COLD_DELETE_CITUS: &str = "DELETE FROM tasks_cold WHERE biz_type_id = $1 AND id = ANY($2)";

/// `move_cold` on a Citus cluster: the hot horizon read on the coordinator, the biz types
/// with a cold task due before it found by one statement over every shard (no lock), then
/// per biz type, until `batch` tasks are moved in all, one transaction of the three
/// statements of move_cold_citus.sql (lock, copy, delete), each on the worker of the biz
/// type's shard.
async fn move_cold_citus(pool: &Pool, batch: i64) -> Result<u64, sqlx::Error> {
    let horizon: chrono::DateTime<chrono::Utc> = crate::db::query_scalar("SELECT until FROM hot_horizon").fetch_one(pool).await?;
    let biz_types: Vec<i32> =
        crate::db::query_scalar("SELECT DISTINCT biz_type_id FROM tasks_cold WHERE run_at < $1 ORDER BY 1").bind(horizon).fetch_all(pool).await?;
    let mut moved = 0;
    for biz_type_id in biz_types {
        let left = batch - moved as i64;
        if left <= 0 {
            break;
        }
        let mut tx = crate::db::citus::begin_routed(pool).await?;
        let ids: Vec<Uuid> = crate::db::query_scalar(MOVE_COLD_LOCK_CITUS).bind(biz_type_id).bind(horizon).bind(left).fetch_all(&mut *tx).await?;
        if ids.is_empty() {
            continue;
        }
        crate::db::query(include_str!("sql/move_cold_citus.sql")).bind(biz_type_id).bind(&ids).execute(&mut *tx).await?;
        crate::db::query(MOVE_COLD_DELETE_CITUS).bind(biz_type_id).bind(&ids).execute(&mut *tx).await?;
        tx.commit().await?;
        moved += ids.len() as u64;
    }
    Ok(moved)
}

/// Whether the partition `name` of `tasks` holds an unfinished (pending or running) task.
/// The caller holds the partition's lock, so no task can move in or change state; each
/// probe uses a partial index.
pub async fn holds_unfinished(tx: &mut PgConnection, name: &str) -> Result<bool, sqlx::Error> {
    crate::db::query_scalar(AssertSqlSafe(format!(
        "SELECT EXISTS (SELECT 1 FROM {name} WHERE status = 'pending')
             OR EXISTS (SELECT 1 FROM {name} WHERE status = 'running')"
    )))
    .fetch_one(tx)
    .await
}

/// Removes the idempotency keys and the audited events (`task_events`) of up to `batch`
/// tasks of the detached partition `table` with ids after `after`, in id order (its
/// primary key), so each batch starts where the last ended; a key now held by another task
/// is left alone. Returns the last id seen (None: no task left).
pub async fn forget(pool: &Pool, table: &str, after: Uuid, batch: i64) -> Result<Option<Uuid>, sqlx::Error> {
    // Locks the keys and events it deletes; the detached partition itself is no longer
    // read by anyone but this.
    crate::db::query_scalar(AssertSqlSafe(format!(
        "WITH batch AS (
             SELECT id, biz_type_id, key FROM {table} WHERE id > $1 ORDER BY id LIMIT $2
         ), removed AS (
             DELETE FROM task_keys k USING batch b
              WHERE k.biz_type_id = b.biz_type_id AND k.key = b.key AND k.task_id = b.id
         ), events AS (
             -- A task lives in one place: gone with this partition, it has no more history.
             DELETE FROM task_events WHERE task_id = ANY(ARRAY(SELECT id FROM batch))
         )
         SELECT id FROM batch ORDER BY id DESC LIMIT 1"
    )))
    .bind(after)
    .bind(batch)
    .fetch_optional(pool)
    .await
}
