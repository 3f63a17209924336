//! Counting tasks and attempts: the queue's state per biz type and the last hour of
//! deliveries, for `/metrics` and the console's dashboard. Reads only.
//!
//! `/metrics` (`chime_tasks_pending`, `…_retrying`, `…_failed`,
//! `chime_oldest_pending_age_seconds`) is read by the leader when it is scraped
//! (`metrics::Node`), so a cluster pays for it once however many nodes it has.
//!
//! Every count reaches rows through the partial indexes (`tasks_claim_idx` for pending,
//! `tasks_failed_idx` for failed, `tasks_lease_idx` for running), so its cost follows the
//! queue, not the finished history; only the hot partitions are read (tasks due beyond the
//! hot horizon wait in `tasks_cold` and are not counted).

use std::collections::HashMap;
use std::time::Duration;

use crate::db::Pool;

/// Pending (of which retrying) and failed tasks of one biz type in use (archived ones are
/// left out, as from every list).
#[derive(Debug, sqlx::FromRow)]
pub struct Counts {
    pub biz_type: String,
    /// Waiting for delivery, due or not (in the hot partitions).
    pub pending: i64,
    /// Pending after at least one failed attempt: waiting to be retried.
    pub retrying: i64,
    /// Failed for good and not replayed (a replay makes a task pending again).
    pub failed: i64,
}

/// Counts per biz type, given up after `timeout`.
///
/// Counting walks every pending task (retrying needs `attempt_count`, which only the row
/// has) and every failed one. Measured on PostgreSQL 15 with 1,000,000 pending tasks
/// (half due), 1,000,000 succeeded and 20,000 failed, over 5 biz types: 0.84 to 1.4 s
/// (warm cache); the pending count alone 0.28 s, the failed one 9 ms. Hence the caller's
/// cache and this timeout.
pub async fn counts(pool: &Pool, timeout: Duration) -> Result<Vec<Counts>, sqlx::Error> {
    let mut tx = pool.begin().await?;
    set_statement_timeout(&mut tx, timeout).await?;
    let counts = crate::db::query_as(
        "SELECT b.name AS biz_type, p.pending, p.retrying,
                (SELECT count(*) FROM tasks t WHERE t.biz_type_id = b.id AND t.status = 'failed') AS failed
           FROM biz_types b
          CROSS JOIN LATERAL (
                SELECT count(*) AS pending, count(*) FILTER (WHERE t.attempt_count > 0) AS retrying
                  FROM tasks t
                 WHERE t.biz_type_id = b.id AND t.status = 'pending'
          ) p
          WHERE b.archived_at IS NULL",
    )
    .fetch_all(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(counts)
}

/// Per biz type, how long its oldest due and undelivered task has waited (now − run_at),
/// 0 when none is due. One index probe per biz type and partition (the first entry of
/// `tasks_claim_idx` for it): 3.4 ms with the backlog measured above.
pub async fn oldest_pending_age(pool: &Pool, timeout: Duration) -> Result<Vec<(String, f64)>, sqlx::Error> {
    let mut tx = pool.begin().await?;
    set_statement_timeout(&mut tx, timeout).await?;
    let ages = crate::db::query_as(
        "SELECT b.name, coalesce(extract(epoch FROM now() - o.run_at), 0)::float8
           FROM biz_types b
           LEFT JOIN LATERAL (
                SELECT t.run_at FROM tasks t
                 WHERE t.biz_type_id = b.id AND t.status = 'pending' AND t.run_at <= now()
                 ORDER BY t.run_at LIMIT 1
           ) o ON true
          WHERE b.archived_at IS NULL",
    )
    .fetch_all(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(ages)
}

/// The dashboard's queue counts of one biz type, each stopped at the caller's cap.
#[derive(Debug, sqlx::FromRow)]
pub struct QueueCounts {
    pub biz_type_id: i32,
    pub name: String,
    pub paused: bool,
    /// Pending and never tried (pending minus retrying).
    pub pending: i64,
    /// Pending after a failed attempt (`super::RETRYING_SQL`): waiting for the next try.
    pub retrying: i64,
    /// Pending or retrying, due within the next hour (overdue ones included).
    pub due_next_hour: i64,
    pub running: i64,
    pub failed: i64,
    /// Ended `expired` (not delivered before their deadline) and not replayed.
    pub expired: i64,
}

/// The dashboard's counts, one row per biz type by name. Each count stops at `$1` (the
/// cap), so that a huge backlog cannot make the dashboard slow, and each walks one partial
/// index only (no table rows where the visibility map allows): `tasks_claim_idx` for
/// pending and due, `tasks_retrying_idx` (migration 0022, the same condition as
/// `RETRYING_SQL`) for retrying, `tasks_lease_idx` for running, `tasks_failed_idx` and
/// `tasks_expired_idx`. Never-tried is all pending minus retrying, the pending walk
/// stopped at cap + retrying, so that it too is exact below the cap. Locks nothing.
static QUEUE_COUNTS: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "SELECT b.id AS biz_type_id, b.name, b.paused, p.all_pending - r.retrying AS pending, r.retrying,
                (SELECT count(*) FROM (SELECT 1 FROM tasks t WHERE t.biz_type_id = b.id AND t.status = 'pending'
                                                              AND t.run_at < now() + interval '1 hour' LIMIT $1) c) AS due_next_hour,
                (SELECT count(*) FROM (SELECT 1 FROM tasks t WHERE t.biz_type_id = b.id AND t.status = 'running' LIMIT $1) c) AS running,
                (SELECT count(*) FROM (SELECT 1 FROM tasks t WHERE t.biz_type_id = b.id AND t.status = 'failed' LIMIT $1) c) AS failed,
                (SELECT count(*) FROM (SELECT 1 FROM tasks t WHERE t.biz_type_id = b.id AND t.status = 'expired' LIMIT $1) c) AS expired
           FROM biz_types b
          CROSS JOIN LATERAL (SELECT count(*) AS retrying FROM (SELECT 1 FROM tasks t WHERE t.biz_type_id = b.id AND {retrying} LIMIT $1) c) r
          CROSS JOIN LATERAL (SELECT count(*) AS all_pending
                                FROM (SELECT 1 FROM tasks t WHERE t.biz_type_id = b.id AND t.status = 'pending' LIMIT $1 + r.retrying) c) p
          ORDER BY b.name",
        retrying = super::RETRYING_SQL
    )
});

/// Queue counts of every biz type, by name; each count stops at `cap` (`pending`, the
/// never-tried ones, too).
pub async fn queue_counts(pool: &Pool, cap: i64) -> Result<Vec<QueueCounts>, sqlx::Error> {
    crate::db::query_as(sqlx::AssertSqlSafe(QUEUE_COUNTS.as_str())).bind(cap).fetch_all(pool).await
}

/// The attempts of one biz type in one minute of the last hour.
#[derive(Debug, sqlx::FromRow)]
pub struct Minute {
    pub biz_type_id: i32,
    /// Minutes ago: 0 is this minute.
    pub ago: i32,
    /// The minute's start (the database's clock).
    pub minute: chrono::DateTime<chrono::Utc>,
    /// Answered 2xx.
    pub delivered: i64,
    pub failed: i64,
}

/// The last hour of attempts per biz type and minute (minutes without one left out).
pub async fn last_hour_by_minute(pool: &Pool) -> Result<Vec<Minute>, sqlx::Error> {
    crate::db::query_as(
        "SELECT biz_type_id,
                (extract(epoch FROM date_trunc('minute', now()) - date_trunc('minute', started_at)) / 60)::int AS ago,
                date_trunc('minute', started_at) AS minute,
                count(*) FILTER (WHERE status_code BETWEEN 200 AND 299) AS delivered,
                count(*) FILTER (WHERE status_code IS NULL OR status_code NOT BETWEEN 200 AND 299) AS failed
           FROM attempts
          WHERE started_at >= date_trunc('minute', now()) - interval '59 minutes' AND biz_type_id IS NOT NULL
          GROUP BY 1, 2, 3",
    )
    .fetch_all(pool)
    .await
}

/// The median and 99th percentile lateness (ms) of the last hour's attempts, per biz type.
pub async fn lateness_last_hour(pool: &Pool) -> Result<HashMap<i32, (Option<i32>, Option<i32>)>, sqlx::Error> {
    let rows = crate::db::query_as::<(i32, Option<i32>, Option<i32>)>(
        "SELECT biz_type_id,
                percentile_disc(0.5) WITHIN GROUP (ORDER BY lateness_ms),
                percentile_disc(0.99) WITHIN GROUP (ORDER BY lateness_ms)
           FROM attempts
          WHERE started_at >= now() - interval '1 hour' AND lateness_ms IS NOT NULL AND biz_type_id IS NOT NULL
          GROUP BY 1",
    )
    .fetch_all(pool)
    .await?;
    Ok(rows.into_iter().map(|(id, p50, p99)| (id, (p50, p99))).collect())
}

/// The 99th percentile lateness (ms) of the attempts started in the last `minutes`, per biz
/// type: the dashboard's "late now", which clears minutes after a backlog is gone rather
/// than an hour. The same walk of the attempts' time index as `lateness_last_hour`,
/// shorter.
pub async fn lateness_p99_recent(pool: &Pool, minutes: i32) -> Result<HashMap<i32, i32>, sqlx::Error> {
    let rows = crate::db::query_as::<(i32, i32)>(
        "SELECT biz_type_id, percentile_disc(0.99) WITHIN GROUP (ORDER BY lateness_ms)
           FROM attempts
          WHERE started_at >= now() - $1 * interval '1 minute' AND lateness_ms IS NOT NULL AND biz_type_id IS NOT NULL
          GROUP BY 1",
    )
    .bind(minutes)
    .fetch_all(pool)
    .await?;
    Ok(rows.into_iter().collect())
}

/// The oldest due task of each biz type delivered by callback (not paused, not rate
/// limited, not archived) that is more than a minute overdue: what an engine should have
/// taken long ago. One index probe per biz type.
pub async fn overdue(pool: &Pool) -> Result<Vec<(String, chrono::DateTime<chrono::Utc>)>, sqlx::Error> {
    crate::db::query_as(
        "SELECT b.name, o.run_at
           FROM biz_types b
           CROSS JOIN LATERAL (
               SELECT run_at FROM tasks t
                WHERE t.biz_type_id = b.id AND t.status = 'pending' AND t.run_at < now() - interval '1 minute'
                ORDER BY run_at LIMIT 1
           ) o
          WHERE b.mode = 'callback' AND NOT b.paused AND b.rate_limit IS NULL AND b.archived_at IS NULL",
    )
    .fetch_all(pool)
    .await
}

async fn set_statement_timeout(tx: &mut sqlx::PgConnection, timeout: Duration) -> Result<(), sqlx::Error> {
    crate::db::query("SELECT set_config('statement_timeout', $1, true)").bind(format!("{}ms", timeout.as_millis())).execute(tx).await?;
    Ok(())
}
