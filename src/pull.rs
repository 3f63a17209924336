//! Pull delivery: consumers that cannot take a callback reserve due tasks, each leased for
//! a time-to-run, and ack or nack them (issue: pull delivery; SPEC §3).
//!
//! A reservation is the engine's claim with the consumer as the lease holder: the task
//! goes `running` with `lease_until` = now + time-to-run, so `SKIP LOCKED` and the lease
//! keep two consumers from holding it at once. Ack finishes it; nack puts it back (after
//! the delay asked for, or the biz type's backoff) or fails it when its attempts are
//! used up; touch extends the lease. A lease that runs out is taken back by the leader's
//! lease recovery, which counts it as a failed attempt. Every reservation ends as one
//! attempt in the task's history: acked, nacked, or time-to-run passed.
//!
//! Each reservation has a receipt, a random UUID kept in `leased_by` (for a callback lease
//! it holds the node) and handed to the consumer; ack, nack and touch act only when it is
//! still the task's. Without it, a consumer whose time to run passed could settle the
//! reservation of the consumer that reserved the task next. Lease recovery and settling
//! clear it, and every reservation draws a new one, so a stale receipt never matches again.

use chrono::{DateTime, Utc};
use serde::Serialize;
use crate::db::Pool;
use uuid::Uuid;

use crate::biz_types::BizType;
use crate::error::Error;
use crate::tasks::Task;

/// A reserved task: the task, until when the consumer holds it, and the receipt that
/// settles this reservation.
#[derive(Debug, Clone, Serialize, sqlx::FromRow, utoipa::ToSchema)]
#[schema(as = ReservedTask)]
pub struct Reserved {
    #[serde(flatten)]
    #[sqlx(flatten)]
    pub task: Task,
    pub reserved_until: DateTime<Utc>,
    pub receipt: Uuid,
}

/// Leases up to `limit` due tasks of a pull biz type for `ttr_ms`.
pub async fn reserve(pool: &Pool, biz: &BizType, limit: i64, ttr_ms: i64) -> Result<Vec<Reserved>, Error> {
    Ok(crate::db::query_as(
        "WITH due AS (
             SELECT id, run_at FROM tasks
              WHERE biz_type_id = $1 AND status = 'pending' AND run_at <= now()
              ORDER BY run_at
              LIMIT $2
              FOR UPDATE SKIP LOCKED
         ), leased AS (
             UPDATE tasks t
                SET status = 'running', lease_until = now() + $3 * interval '1 millisecond', leased_by = gen_random_uuid(),
                    attempt_count = t.attempt_count + 1, updated_at = now()
               FROM due
              WHERE t.id = due.id AND t.run_at = due.run_at
             RETURNING t.*
         )
         SELECT leased.*, $4::text AS biz_type, leased.lease_until AS reserved_until, leased.leased_by AS receipt
           FROM leased ORDER BY run_at",
    )
    .bind(biz.id)
    .bind(limit)
    .bind(ttr_ms)
    .bind(&biz.name)
    .fetch_all(pool)
    .await?)
}

/// How many tasks of the biz type are due, counting no further than `up_to`.
pub async fn due_count(pool: &Pool, biz_type_id: i32, up_to: i64) -> Result<i64, Error> {
    Ok(crate::db::query_scalar(
        "SELECT count(*) FROM (
             SELECT 1 FROM tasks WHERE biz_type_id = $1 AND status = 'pending' AND run_at <= now() LIMIT $2
         ) due",
    )
    .bind(biz_type_id)
    .bind(up_to)
    .fetch_one(pool)
    .await?)
}

/// How many tasks of the biz type are reserved and not yet acked or nacked.
pub async fn reserved_count(pool: &Pool, biz_type_id: i32) -> Result<i64, Error> {
    Ok(crate::db::query_scalar("SELECT count(*) FROM tasks WHERE biz_type_id = $1 AND status = 'running'")
        .bind(biz_type_id)
        .fetch_one(pool)
        .await?)
}

/// What became of a reservation.
pub enum Verdict {
    Ack,
    /// Retry after this delay (None: the biz type's backoff), with the consumer's reason.
    Nack { delay_ms: Option<i64>, error: Option<String> },
}

/// Acks or nacks a task of `biz` reserved under `receipt`, in one statement; returns the
/// task as it is now. A receipt that no longer holds the task (it was settled already, or
/// its time to run passed and it went back to pending or to another consumer) answers
/// StaleReceipt and changes nothing.
pub async fn settle(pool: &Pool, biz: &BizType, id: Uuid, receipt: Uuid, verdict: Verdict) -> Result<Task, Error> {
    let (ack, delay_ms, reason) = match verdict {
        Verdict::Ack => (true, None, None),
        Verdict::Nack { delay_ms, error } => (false, delay_ms, Some(format!("nacked{}", error.map(|e| format!(": {e}")).unwrap_or_default()))),
    };
    // Nack: failed when the attempts are used up, else pending again after the delay
    // asked for or the biz type's backoff (doubling from the first delay, capped, with
    // jitter over the upper half, as for callbacks), kept inside the hot horizon.
    //
    // `old` locks the task's row, so lease recovery (SKIP LOCKED) passes over it and a
    // concurrent settle or touch waits; one that committed first is seen, as `FOR UPDATE`
    // reads the row's newest version. The receipt is compared on that locked row by the
    // UPDATE that settles, so no other reservation can begin between check and settle.
    let settled: Option<Task> = crate::db::query_as(
        "WITH old AS (
             SELECT id, run_at, status, biz_type_id, leased_by, attempt_count, updated_at AS reserved_at,
                    NOT $2 AND attempt_count >= $5 AS exhausted
               FROM tasks WHERE id = $1 FOR UPDATE
         ), settled AS (
             UPDATE tasks t
                SET status = CASE WHEN $2 THEN 'succeeded' WHEN o.exhausted THEN 'failed' ELSE 'pending' END,
                    run_at = CASE WHEN $2 OR o.exhausted THEN t.run_at
                                  ELSE least(now() + coalesce($4::bigint, least($6::float8 * power(2, least(o.attempt_count - 1, 30)), $7::float8)
                                                                           * (0.5 + random() * 0.5))::bigint * interval '1 millisecond',
                                             (SELECT until FROM hot_horizon) - interval '1 second') END,
                    finished_at = CASE WHEN $2 OR o.exhausted THEN now() END,
                    lease_until = NULL, leased_by = NULL, last_error = $8, updated_at = now()
               FROM old o
              WHERE t.id = o.id AND t.run_at = o.run_at AND o.status = 'running' AND o.biz_type_id = $3
                AND o.leased_by = $10
             RETURNING t.*
         ), attempt AS (
             INSERT INTO attempts (task_id, number, started_at, duration_ms, error, response_excerpt, biz_type_id, lateness_ms)
             SELECT o.id, o.attempt_count, o.reserved_at, (extract(epoch FROM now() - o.reserved_at) * 1000)::int, $8,
                    CASE WHEN $2 THEN 'acked' END, $3, greatest(0, extract(epoch FROM o.reserved_at - o.run_at) * 1000)::int
               FROM old o WHERE EXISTS (SELECT 1 FROM settled)
         )
         SELECT s.*, $9::text AS biz_type FROM settled s",
    )
    .bind(id)
    .bind(ack)
    .bind(biz.id)
    .bind(delay_ms)
    .bind(biz.max_attempts)
    .bind(f64::from(biz.backoff_initial_ms))
    .bind(f64::from(biz.backoff_max_ms))
    .bind(&reason)
    .bind(&biz.name)
    .bind(receipt)
    .fetch_optional(pool)
    .await?;
    match settled {
        Some(task) => Ok(task),
        None => Err(refused(pool, biz, id).await?),
    }
}

/// Why a settle or touch changed nothing: no such task, another biz type's, or a receipt
/// that no longer holds the task (said as the task is now).
async fn refused(pool: &Pool, biz: &BizType, id: Uuid) -> Result<Error, Error> {
    let Some((task, _)) = crate::tasks::get(pool, id).await? else {
        return Ok(Error::NotFound(format!("no task with id {id}")));
    };
    if task.biz_type_id != biz.id {
        return Ok(Error::Forbidden("this task belongs to another biz type".into()));
    }
    let now = match task.status.as_str() {
        "running" => "its time to run passed and another reservation holds it now (or the receipt is another task's)".to_string(),
        "pending" => "it is pending, not reserved (nacked, or its time to run passed)".to_string(),
        status => format!("it is {status} (acked or nacked already, or its time to run passed)"),
    };
    Ok(Error::StaleReceipt(format!("this receipt no longer holds the task: {now}")))
}

/// Extends the reservation of a task of `biz` held under `receipt` to `ttr_ms` from now.
pub async fn touch(pool: &Pool, biz: &BizType, id: Uuid, receipt: Uuid, ttr_ms: i64) -> Result<DateTime<Utc>, Error> {
    // Locks the task's row; a settle or lease recovery that got there first is waited for,
    // and the WHERE is checked again on the row it left, whose receipt is cleared.
    let until: Option<DateTime<Utc>> = crate::db::query_scalar(
        "UPDATE tasks SET lease_until = now() + $3 * interval '1 millisecond'
          WHERE id = $1 AND biz_type_id = $2 AND status = 'running' AND leased_by = $4
         RETURNING lease_until",
    )
    .bind(id)
    .bind(biz.id)
    .bind(ttr_ms)
    .bind(receipt)
    .fetch_optional(pool)
    .await?;
    match until {
        Some(until) => Ok(until),
        None => Err(refused(pool, biz, id).await?),
    }
}
