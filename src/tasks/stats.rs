//! Counting tasks and attempts: the queue's state per biz type and the last hour of
//! deliveries, for `/metrics`, the console's dashboard and the stats API (`live`). Reads
//! only.
//!
//! `/metrics` (`chime_tasks_pending`, `…_retrying`, `…_failed`,
//! `chime_oldest_pending_age_seconds`) is read by the leader when it is scraped
//! (`metrics::Node`), so a cluster pays for it once however many nodes it has.
//!
//! Every count reaches rows through the partial indexes (`tasks_claim_idx` for pending,
//! `tasks_failed_idx` for failed, `tasks_lease_idx` for running), so its cost follows the
//! queue, not the finished history; only the hot partitions are read (tasks due beyond the
//! hot horizon wait in `tasks_cold` and are not counted), except by the stats API's pending
//! count, which goes on into `tasks_cold` while it is below its cap.

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

/// `QUEUE_COUNTS` of one biz type, `$2`, named in every count: on a Citus cluster, which
/// refuses the statement over every biz type ("complex joins are only supported when all
/// distributed tables are co-located"), each count is then routed to the biz type's worker.
static QUEUE_COUNTS_OF_ONE: std::sync::LazyLock<String> =
    std::sync::LazyLock::new(|| QUEUE_COUNTS.replace("t.biz_type_id = b.id", "t.biz_type_id = $2").replace("ORDER BY b.name", "WHERE b.id = $2"));

/// Queue counts of every biz type, by name; each count stops at `cap` (`pending`, the
/// never-tried ones, too). On Citus a statement per biz type (the dashboard's cost there
/// grows with the biz types: a round trip each, each count on one worker).
pub async fn queue_counts(pool: &Pool, cap: i64) -> Result<Vec<QueueCounts>, sqlx::Error> {
    if !crate::db::citus::active() {
        return crate::db::query_as(sqlx::AssertSqlSafe(QUEUE_COUNTS.as_str())).bind(cap).fetch_all(pool).await;
    }
    let ids: Vec<i32> = crate::db::query_scalar("SELECT id FROM biz_types ORDER BY name").fetch_all(pool).await?;
    let mut tx = crate::db::citus::begin_routed(pool).await?;
    let mut counts = Vec::with_capacity(ids.len());
    for id in ids {
        counts.push(crate::db::query_as(sqlx::AssertSqlSafe(QUEUE_COUNTS_OF_ONE.as_str())).bind(cap).bind(id).fetch_one(&mut *tx).await?);
    }
    tx.commit().await?;
    Ok(counts)
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
/// taken long ago. One index probe per biz type; on a Citus cluster, which refuses the
/// LATERAL over every biz type, a statement per biz type, each on the worker of its shard.
pub async fn overdue(pool: &Pool) -> Result<Vec<(String, chrono::DateTime<chrono::Utc>)>, sqlx::Error> {
    if crate::db::citus::active() {
        let biz_types: Vec<(i32, String)> = crate::db::query_as(
            "SELECT id, name FROM biz_types WHERE mode = 'callback' AND NOT paused AND rate_limit IS NULL AND archived_at IS NULL ORDER BY id",
        )
        .fetch_all(pool)
        .await?;
        let mut overdue = Vec::new();
        for (id, name) in biz_types {
            let oldest: Option<chrono::DateTime<chrono::Utc>> = crate::db::query_scalar(
                "SELECT run_at FROM tasks WHERE biz_type_id = $1 AND status = 'pending' AND run_at < now() - interval '1 minute'
                  ORDER BY run_at LIMIT 1",
            )
            .bind(id)
            .fetch_optional(pool)
            .await?;
            overdue.extend(oldest.map(|at| (name, at)));
        }
        return Ok(overdue);
    }
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

/// Counts of the stats API stop at this: each is exact below it, and "at least this" at it.
pub const LIVE_CAP: i64 = 10_000;

/// One biz type's queue right now, for `GET /api/v1/biz-types/{name}/stats`: what an
/// autoscaler of receivers or pull consumers polls, every second per biz type. Each count
/// stops at `LIVE_CAP`.
#[derive(Debug)]
pub struct Live {
    /// The database's clock when counted.
    pub at: chrono::DateTime<chrono::Utc>,
    /// Pending and due now (overdue included): waiting for a claim or a reserve.
    pub due: i64,
    /// Pending, due or not, in the partitions and in cold storage (retrying included).
    pub pending: i64,
    /// Leased: a callback under way, or reserved by a consumer.
    pub running: i64,
    /// Pending after a failed attempt (`super::RETRYING_SQL`).
    pub retrying: i64,
    pub failed: i64,
    pub expired: i64,
    /// How long the oldest due task has waited (now − run_at); None when none is due.
    pub oldest_due_age_ms: Option<i64>,
    pub lateness: Lateness,
    pub max_in_flight: i32,
}

/// The attempts of one biz type that started within the last minute, on any node, and the
/// median and 99th percentile of their lateness (start − run_at).
#[derive(Debug, Clone, Copy, Default)]
pub struct Lateness {
    pub attempts: i64,
    pub p50_ms: Option<i32>,
    pub p99_ms: Option<i32>,
}

/// The unfinished part of a biz type's queue. Each count walks the partial index of its
/// state in `run_at` order (`tasks_claim_idx` for due and pending, `tasks_retrying_idx`,
/// `tasks_running_idx`), stopped at `$2`; the order keeps PostgreSQL off a sequential scan
/// of a partition that is mostly pending, where it would read past the finished tasks
/// stored before them (measured: 65,000 rows read to count 10,000). Pending goes on into
/// `tasks_cold` only while the partitions hold fewer than `$2`, in `tasks_cold_list_idx`'s
/// order (by `run_at` alone, `tasks_cold_run_at_idx` would serve, and walk every biz type's
/// cold tasks to find this one's). All
/// pass the floor (`$3`, `chime_unfinished_floor()` as read lately, which only rises), so
/// that PostgreSQL leaves out the partitions of finished tasks while planning: this
/// statement is planned at each call (its parameters prune), over the few partitions left.
/// The oldest due task is the first entry of `tasks_claim_idx`. Locks nothing.
static LIVE_QUEUE: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "SELECT now() AS at, d.due, h.hot + c.cold AS pending, r.running, rt.retrying,
                (SELECT (extract(epoch FROM now() - min(t.run_at)) * 1000)::bigint
                   FROM tasks t WHERE t.biz_type_id = $1 AND t.status = 'pending' AND t.run_at >= $3 AND t.run_at <= now()) AS oldest_due_age_ms
           FROM (SELECT count(*) AS due FROM (SELECT 1 FROM tasks t WHERE t.biz_type_id = $1 AND t.status = 'pending'
                                                                      AND t.run_at >= $3 AND t.run_at <= now() ORDER BY t.run_at LIMIT $2) c) d
          CROSS JOIN (SELECT count(*) AS hot FROM (SELECT 1 FROM tasks t WHERE t.biz_type_id = $1 AND t.status = 'pending' AND t.run_at >= $3
                                                    ORDER BY t.run_at LIMIT $2) c) h
          CROSS JOIN LATERAL (SELECT count(*) AS cold FROM (SELECT 1 FROM tasks_cold t WHERE t.biz_type_id = $1 AND t.status = 'pending'
                                                             ORDER BY t.run_at, t.id LIMIT $2 - h.hot) c) c
          CROSS JOIN (SELECT count(*) AS running FROM (SELECT 1 FROM tasks t WHERE t.biz_type_id = $1 AND t.status = 'running' AND t.run_at >= $3
                                                        LIMIT $2) c) r
          CROSS JOIN (SELECT count(*) AS retrying FROM (SELECT 1 FROM tasks t WHERE t.biz_type_id = $1 AND {retrying} AND t.run_at >= $3
                                                         ORDER BY t.run_at LIMIT $2) c) rt",
        retrying = super::RETRYING_SQL
    )
});

/// The finished part, and the biz type's in-flight limit: `tasks_failed_idx` and
/// `tasks_expired_idx`, one descent per retained partition, stopped at `$2`. Nothing here
/// depends on the floor, so PostgreSQL plans it once per connection (a generic plan) rather
/// than at each call over every retained partition. Locks nothing.
const LIVE_FINISHED: &str = "SELECT b.max_in_flight,
        (SELECT count(*) FROM (SELECT 1 FROM tasks t WHERE t.biz_type_id = $1 AND t.status = 'failed' LIMIT $2) c) AS failed,
        (SELECT count(*) FROM (SELECT 1 FROM tasks t WHERE t.biz_type_id = $1 AND t.status = 'expired' LIMIT $2) c) AS expired
   FROM biz_types b
  WHERE b.id = $1";

/// The stats of biz type `biz_type_id` (None if there is no such biz type).
pub async fn live(pool: &Pool, biz_type_id: i32, floor: &Floor, lateness: &LatenessCache) -> Result<Option<Live>, sqlx::Error> {
    let Some((max_in_flight, failed, expired)) =
        crate::db::query_as::<(i32, i64, i64)>(LIVE_FINISHED).bind(biz_type_id).bind(LIVE_CAP).fetch_optional(pool).await?
    else {
        return Ok(None);
    };
    let floor = floor.get(pool).await?;
    let (at, due, pending, running, retrying, oldest_due_age_ms) =
        crate::db::query_as::<(chrono::DateTime<chrono::Utc>, i64, i64, i64, i64, Option<i64>)>(sqlx::AssertSqlSafe(LIVE_QUEUE.as_str()))
            .bind(biz_type_id)
            .bind(LIVE_CAP)
            .bind(floor)
            .fetch_one(pool)
            .await?;
    let lateness = lateness.of(pool, biz_type_id).await?;
    Ok(Some(Live { at, due, pending, running, retrying, failed, expired, oldest_due_age_ms, lateness, max_in_flight }))
}

/// `chime_unfinished_floor()` (migration 0036) as a node read it lately, for the stats
/// API: reading it costs a few dozen index probes, more than the counts it bounds
/// (measured: 1,446 buffers, 5 to 40 ms), and a floor read a while ago is still true (it
/// only rises), only prunes less.
#[derive(Default)]
pub struct Floor(std::sync::Mutex<Option<(std::time::Instant, chrono::DateTime<chrono::Utc>)>>);

impl Floor {
    /// How long a floor read is used: it rises when the oldest partition holding unfinished
    /// work is left behind, about once a day.
    const FRESH: Duration = Duration::from_secs(60);

    async fn get(&self, pool: &Pool) -> Result<chrono::DateTime<chrono::Utc>, sqlx::Error> {
        if let Some((read, floor)) = *self.0.lock().expect("the floor's lock is never poisoned")
            && read.elapsed() < Self::FRESH
        {
            return Ok(floor);
        }
        let floor = super::lease::unfinished_floor(pool).await?;
        *self.0.lock().expect("the floor's lock is never poisoned") = Some((std::time::Instant::now(), floor));
        Ok(floor)
    }
}

/// The last minute's lateness of every biz type, as a node read it within the last 5 s.
/// Reading it walks every attempt of the minute, whatever its biz type, through the BRIN
/// index on `started_at` (measured: 110,000 attempts, 1,361 buffers). An index by biz type
/// and time would make it one biz type's, but every attempt recorded would pay for it
/// (measured: 343 bytes of WAL per attempt instead of 237, inserts 27% slower). So one
/// read serves every biz type's stats for 5 s: the cost follows the attempt rate, not how
/// many biz types are polled, nor how often; a minute's percentiles move little in 5 s.
#[derive(Default)]
pub struct LatenessCache(tokio::sync::Mutex<Option<(std::time::Instant, HashMap<i32, Lateness>)>>);

/// The last minute's attempts per biz type and lateness rounded down to 3 significant
/// digits (exact below a second, within 1% above): a hash aggregate of a few hundred groups,
/// where exact percentiles would sort every attempt of the minute (measured with 120,000:
/// the sort alone spilled to disk and took longer than reading them). Locks nothing.
const LATENESS_LAST_MINUTE: &str = "SELECT biz_type_id,
        CASE WHEN lateness_ms < 1000 THEN lateness_ms
             WHEN lateness_ms < 10000 THEN lateness_ms / 10 * 10
             WHEN lateness_ms < 100000 THEN lateness_ms / 100 * 100
             WHEN lateness_ms < 1000000 THEN lateness_ms / 1000 * 1000
             ELSE lateness_ms / 10000 * 10000 END AS ms,
        count(*)
   FROM attempts
  WHERE started_at >= now() - interval '1 minute' AND lateness_ms IS NOT NULL AND biz_type_id IS NOT NULL
  GROUP BY 1, 2";

impl LatenessCache {
    const FRESH: Duration = Duration::from_secs(5);

    async fn of(&self, pool: &Pool, biz_type_id: i32) -> Result<Lateness, sqlx::Error> {
        // Held while reading: calls that arrive meanwhile wait for this read, not make theirs.
        let mut cached = self.0.lock().await;
        if let Some((read, by_biz_type)) = &*cached
            && read.elapsed() < Self::FRESH
        {
            return Ok(by_biz_type.get(&biz_type_id).copied().unwrap_or_default());
        }
        let rows = crate::db::query_as::<(i32, i32, i64)>(LATENESS_LAST_MINUTE).fetch_all(pool).await?;
        let mut histograms: HashMap<i32, Vec<(i32, i64)>> = HashMap::new();
        for (id, ms, n) in rows {
            histograms.entry(id).or_default().push((ms, n));
        }
        let by_biz_type: HashMap<i32, Lateness> = histograms.into_iter().map(|(id, histogram)| (id, Lateness::of(histogram))).collect();
        let lateness = by_biz_type.get(&biz_type_id).copied().unwrap_or_default();
        *cached = Some((std::time::Instant::now(), by_biz_type));
        Ok(lateness)
    }
}

impl Lateness {
    /// From a histogram of (lateness, attempts): the lateness under which half (and 99%) of
    /// the attempts fall, as `percentile_disc` gives it.
    fn of(mut histogram: Vec<(i32, i64)>) -> Lateness {
        histogram.sort_unstable();
        let attempts: i64 = histogram.iter().map(|&(_, n)| n).sum();
        let percentile = |p: f64| {
            let rank = ((p * attempts as f64).ceil() as i64).max(1);
            let mut seen = 0;
            histogram.iter().find(|&&(_, n)| {
                seen += n;
                seen >= rank
            })
        };
        Lateness { attempts, p50_ms: percentile(0.5).map(|&(ms, _)| ms), p99_ms: percentile(0.99).map(|&(ms, _)| ms) }
    }
}

async fn set_statement_timeout(tx: &mut sqlx::PgConnection, timeout: Duration) -> Result<(), sqlx::Error> {
    crate::db::query("SELECT set_config('statement_timeout', $1, true)").bind(format!("{}ms", timeout.as_millis())).execute(tx).await?;
    Ok(())
}

/// A biz type's recent callbacks: how many were tried and how many answered 2xx.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct Recent {
    pub biz_type: String,
    pub attempts: i64,
    pub delivered: i64,
}

impl Recent {
    /// The share delivered, in percent (rounded down, so that 99.9% is not read as all).
    pub fn percent(&self) -> i64 {
        if self.attempts == 0 { 0 } else { self.delivered * 100 / self.attempts }
    }
}

/// The attempts of the last `minutes` minutes of one biz type (None: of each that had
/// any), by name: what a bulk replay's confirm page says of the receiver it would call
/// again. Reads the attempts' started_at range (`attempts_started_brin`); locks nothing.
pub async fn recent(pool: &Pool, biz_type_id: Option<i32>, minutes: i32) -> Result<Vec<Recent>, sqlx::Error> {
    crate::db::query_as(
        "SELECT b.name AS biz_type, count(*) AS attempts, count(*) FILTER (WHERE a.status_code BETWEEN 200 AND 299) AS delivered
           FROM attempts a JOIN biz_types b ON b.id = a.biz_type_id
          WHERE a.started_at >= now() - make_interval(mins => $1) AND ($2::int IS NULL OR a.biz_type_id = $2)
          GROUP BY b.name ORDER BY b.name",
    )
    .bind(minutes)
    .bind(biz_type_id)
    .fetch_all(pool)
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lateness_percentiles_are_those_of_percentile_disc() {
        // 100 attempts: 1 ms ×50, 2 ms ×49, 900 ms ×1.
        let l = Lateness::of(vec![(900, 1), (2, 49), (1, 50)]);
        assert_eq!((l.attempts, l.p50_ms, l.p99_ms), (100, Some(1), Some(2)));
        let l = Lateness::of(vec![(1, 50), (2, 48), (900, 2)]);
        assert_eq!(l.p99_ms, Some(900));
        let l = Lateness::of(vec![(7, 1)]);
        assert_eq!((l.attempts, l.p50_ms, l.p99_ms), (1, Some(7), Some(7)));
        let l = Lateness::of(vec![]);
        assert_eq!((l.attempts, l.p50_ms, l.p99_ms), (0, None, None));
    }
}
