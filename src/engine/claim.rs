//! Claiming due tasks and recording what became of them. These are the engine's hot-path
//! statements: one round trip per claimed batch, one per recorded batch.

use chrono::{DateTime, Utc};
use crate::db::Pool;
use uuid::Uuid;

/// A task this node holds a lease on.
#[derive(Debug, sqlx::FromRow)]
pub struct Claimed {
    pub id: Uuid,
    pub key: Option<String>,
    pub run_at: DateTime<Utc>,
    /// The payload as stored, passed through to the callback body without parsing.
    pub payload: String,
    /// This delivery's number (1 for the first try since creation or replay).
    pub attempt_count: i32,
    pub timer_id: Option<Uuid>,
    /// The database clock as the row was returned: with `run_at`, tells how long to wait
    /// before calling back, whatever this node's own clock says.
    pub db_now: DateTime<Utc>,
}

/// Leases up to `limit` tasks of one biz type to this node: those due now, and those due
/// within the next `ahead_ms`, which the caller holds until they are due.
///
/// The CTE picks the rows and locks them; `SKIP LOCKED` makes concurrent claimers on other
/// nodes pass over rows already being taken rather than wait for them, so no two nodes
/// hold the same task. Keeping the pick in a CTE fences the planner: it must apply the
/// LIMIT before the UPDATE joins back (a nested loop over the subquery could otherwise
/// update more rows than asked for). The pick walks `tasks_claim_idx`, which holds pending
/// tasks only, in `run_at` order, and partitions wholly in the future are pruned at run
/// time, so its cost does not grow with future or finished tasks.
///
/// The update finds the picked rows through each partition's primary key, given the ids
/// as an array; not by a join, whose plan rests on statistics: with those of a partition
/// analysed while empty, the planner chose a nested loop that read the whole partition once
/// per picked row (3.6 s per claim during a burst of 50,000). Nor with a `run_at` range to
/// prune partitions: with those statistics, the planner walked the list index through the
/// range instead (50,000 rows read when all were due at one instant). The cost is a probe
/// of 200 ids in each retained partition, well under a millisecond each.
pub async fn claim(
    pool: &Pool,
    biz_type_id: i32,
    limit: i64,
    ahead_ms: i64,
    lease_ms: i64,
    node_id: Uuid,
) -> Result<Vec<Claimed>, sqlx::Error> {
    crate::db::query_as(
        "WITH due AS (
             SELECT id, run_at FROM tasks
              WHERE biz_type_id = $1 AND status = 'pending' AND run_at <= now() + $5 * interval '1 millisecond'
              ORDER BY run_at
              LIMIT $2
              FOR UPDATE SKIP LOCKED
         )
         UPDATE tasks t
            SET status = 'running', lease_until = now() + $3 * interval '1 millisecond', leased_by = $4,
                attempt_count = t.attempt_count + 1, updated_at = now()
          WHERE t.id = ANY(ARRAY(SELECT id FROM due))
         RETURNING t.id, t.key, t.run_at, t.payload::text AS payload, t.attempt_count, t.timer_id,
                   clock_timestamp() AS db_now",
    )
    .bind(biz_type_id)
    .bind(limit)
    .bind(lease_ms + ahead_ms)
    .bind(node_id)
    .bind(ahead_ms)
    .fetch_all(pool)
    .await
}

/// When the next pending task of these biz types is due (None: nothing pending).
pub async fn next_due(pool: &Pool, biz_type_ids: &[i32]) -> Result<Option<DateTime<Utc>>, sqlx::Error> {
    // One index probe per biz type: min(run_at) of each is the first entry of its part of
    // tasks_claim_idx.
    crate::db::query_scalar(
        "SELECT min(next) FROM unnest($1::int[]) AS b(id)
           CROSS JOIN LATERAL (
               SELECT run_at AS next FROM tasks
                WHERE biz_type_id = b.id AND status = 'pending'
                ORDER BY run_at LIMIT 1
           ) n",
    )
    .bind(biz_type_ids)
    .fetch_one(pool)
    .await
}

/// What one delivery attempt came to.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub task_id: Uuid,
    pub biz_type_id: i32,
    pub run_at: DateTime<Utc>,
    pub attempt: i32,
    pub started_at: DateTime<Utc>,
    pub duration_ms: i32,
    pub status_code: Option<i16>,
    pub error: Option<String>,
    pub response_excerpt: Option<String>,
    /// Where a 307 or 308 sent the callback, if one did.
    pub redirected_to: Option<String>,
    pub verdict: Verdict,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Verdict {
    Delivered,
    RetryAt(DateTime<Utc>),
    GiveUp,
}

/// Records a batch of outcomes: one statement for the tasks, one for the attempts.
///
/// The engine's connections plan no sequential scan, so the update finds the running
/// tasks through `tasks_lease_idx` (running tasks only) or the primary key, whatever the
/// statistics say. (`t.id = ANY(ids)` here would be re-sorted for every joined row.)
///
/// Only tasks still leased to this node are changed: if a lease ran out and another node
/// took the task, its state is that node's to record (the attempt is still kept). A retry
/// moves the task to its new `run_at`, kept inside the hot horizon so that it never needs
/// a partition that does not exist.
pub async fn record(pool: &Pool, node_id: Uuid, outcomes: &[Outcome]) -> Result<(), sqlx::Error> {
    let mut ids = Vec::with_capacity(outcomes.len());
    let mut run_ats = Vec::with_capacity(outcomes.len());
    let mut statuses = Vec::with_capacity(outcomes.len());
    let mut retry_ats: Vec<Option<DateTime<Utc>>> = Vec::with_capacity(outcomes.len());
    let mut errors = Vec::with_capacity(outcomes.len());
    let (mut numbers, mut started, mut durations, mut codes, mut excerpts) = (vec![], vec![], vec![], vec![], vec![]);
    let mut redirects = Vec::with_capacity(outcomes.len());
    let mut biz_type_ids = Vec::with_capacity(outcomes.len());
    for o in outcomes {
        ids.push(o.task_id);
        run_ats.push(o.run_at);
        let (status, retry_at) = match o.verdict {
            Verdict::Delivered => ("succeeded", None),
            Verdict::RetryAt(at) => ("pending", Some(at)),
            Verdict::GiveUp => ("failed", None),
        };
        statuses.push(status);
        retry_ats.push(retry_at);
        errors.push(o.error.as_deref());
        numbers.push(o.attempt);
        started.push(o.started_at);
        durations.push(o.duration_ms);
        codes.push(o.status_code);
        excerpts.push(o.response_excerpt.as_deref());
        redirects.push(o.redirected_to.as_deref());
        biz_type_ids.push(o.biz_type_id);
    }
    let mut tx = pool.begin().await?;
    crate::db::query(
        "UPDATE tasks t
            SET status = o.status,
                run_at = CASE WHEN o.status = 'pending'
                              THEN least(o.retry_at, (SELECT until FROM hot_horizon) - interval '1 second')
                              ELSE t.run_at END,
                lease_until = NULL, leased_by = NULL,
                last_error = o.error,
                finished_at = CASE WHEN o.status = 'pending' THEN NULL ELSE now() END,
                updated_at = now()
           FROM unnest($1::uuid[], $2::timestamptz[], $3::text[], $4::timestamptz[], $5::text[])
                AS o(id, run_at, status, retry_at, error)
          WHERE t.id = o.id AND t.run_at = o.run_at AND t.status = 'running' AND t.leased_by = $6",
    )
    .bind(&ids)
    .bind(&run_ats)
    .bind(&statuses)
    .bind(&retry_ats)
    .bind(&errors)
    .bind(node_id)
    .execute(&mut *tx)
    .await?;
    crate::db::query(
        "INSERT INTO attempts (task_id, number, started_at, duration_ms, status_code, error, response_excerpt, node_id,
                               biz_type_id, lateness_ms, redirected_to)
         SELECT a.task_id, a.number, a.started_at, a.duration_ms, a.status_code, a.error, a.response_excerpt, $8,
                a.biz_type_id, greatest(0, extract(epoch FROM a.started_at - a.run_at) * 1000)::int, a.redirected_to
           FROM unnest($1::uuid[], $2::int[], $3::timestamptz[], $4::int[], $5::smallint[], $6::text[], $7::text[],
                       $9::int[], $10::timestamptz[], $11::text[])
                AS a(task_id, number, started_at, duration_ms, status_code, error, response_excerpt, biz_type_id, run_at,
                     redirected_to)",
    )
    .bind(&ids)
    .bind(&numbers)
    .bind(&started)
    .bind(&durations)
    .bind(&codes)
    .bind(&errors)
    .bind(&excerpts)
    .bind(node_id)
    .bind(&biz_type_ids)
    .bind(&run_ats)
    .bind(&redirects)
    .execute(&mut *tx)
    .await?;
    // A task given back by a node that stopped is due now: wake the other nodes rather
    // than let it wait for their poll.
    let now = Utc::now();
    if outcomes.iter().any(|o| matches!(o.verdict, Verdict::RetryAt(at) if at <= now)) {
        crate::db::query("SELECT pg_notify('chime_wake', '')").execute(&mut *tx).await?;
    }
    tx.commit().await
}

/// Gives back tasks this node claimed ahead of their due time but never called back,
/// because it is stopping: pending again as if never claimed (their attempt is not
/// counted), so that another node, woken now, takes them without waiting for the lease to
/// run out. Only tasks still leased to this node are touched; returns how many.
pub async fn give_back(pool: &Pool, node_id: Uuid, tasks: &[(Uuid, DateTime<Utc>)]) -> Result<u64, sqlx::Error> {
    let (ids, run_ats): (Vec<Uuid>, Vec<DateTime<Utc>>) = tasks.iter().copied().unzip();
    let given = crate::db::query(
        "UPDATE tasks t
            SET status = 'pending', lease_until = NULL, leased_by = NULL,
                attempt_count = t.attempt_count - 1, updated_at = now()
           FROM unnest($1::uuid[], $2::timestamptz[]) AS g(id, run_at)
          WHERE t.id = g.id AND t.run_at = g.run_at AND t.status = 'running' AND t.leased_by = $3",
    )
    .bind(&ids)
    .bind(&run_ats)
    .bind(node_id)
    .execute(pool)
    .await?
    .rows_affected();
    if given > 0 {
        crate::db::query("SELECT pg_notify('chime_wake', '')").execute(pool).await?;
    }
    Ok(given)
}

/// Puts back to pending the tasks whose lease ran out (their node died or lost the
/// database before recording a result), recording the lost attempt. Safe on every node at
/// once: rows being recovered elsewhere are skipped.
pub async fn recover_expired_leases(pool: &Pool) -> Result<u64, sqlx::Error> {
    // A callback lease runs out when its node died: not the task's fault, so it is simply
    // pending again. A pull reservation runs out when the consumer did not ack within the
    // time to run: a failed attempt, which may be the last one.
    let recovered = crate::db::query(
        "WITH expired AS (
             SELECT t.id, t.biz_type_id, t.run_at, t.attempt_count, t.leased_by, t.updated_at,
                    b.mode = 'pull' AS pull, b.mode = 'pull' AND t.attempt_count >= b.max_attempts AS exhausted
               FROM tasks t JOIN biz_types b ON b.id = t.biz_type_id
              WHERE t.status = 'running' AND t.lease_until < now()
              LIMIT 1000
              FOR UPDATE OF t SKIP LOCKED
         ), why AS (
             SELECT e.*, CASE WHEN pull THEN 'time to run passed without an ack or nack'
                              ELSE 'lease expired: the node delivering it stopped before recording a result' END AS error
               FROM expired e
         ), requeued AS (
             UPDATE tasks t
                SET status = CASE WHEN w.exhausted THEN 'failed' ELSE 'pending' END,
                    finished_at = CASE WHEN w.exhausted THEN now() END,
                    lease_until = NULL, leased_by = NULL, updated_at = now(), last_error = w.error
               FROM why w
              WHERE t.id = w.id AND t.run_at = w.run_at
         )
         INSERT INTO attempts (task_id, number, started_at, duration_ms, error, node_id, biz_type_id)
         SELECT id, attempt_count, CASE WHEN pull THEN updated_at ELSE now() END,
                CASE WHEN pull THEN (extract(epoch FROM now() - updated_at) * 1000)::int ELSE 0 END,
                error, CASE WHEN pull THEN NULL ELSE leased_by END, biz_type_id
           FROM why",
    )
    .execute(pool)
    .await?
    .rows_affected();
    Ok(recovered)
}
