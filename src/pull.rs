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

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgPool;
use uuid::Uuid;

use crate::biz_types::BizType;
use crate::engine::deliver::backoff;
use crate::error::Error;
use crate::tasks::Task;

/// A reserved task: the task and until when the consumer holds it.
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct Reserved {
    #[serde(flatten)]
    #[sqlx(flatten)]
    pub task: Task,
    pub reserved_until: DateTime<Utc>,
}

/// Leases up to `limit` due tasks of a pull biz type for `ttr_ms`.
pub async fn reserve(pool: &PgPool, biz: &BizType, limit: i64, ttr_ms: i64) -> Result<Vec<Reserved>, Error> {
    Ok(sqlx::query_as(
        "WITH due AS (
             SELECT id, run_at FROM tasks
              WHERE biz_type_id = $1 AND status = 'pending' AND run_at <= now()
              ORDER BY run_at
              LIMIT $2
              FOR UPDATE SKIP LOCKED
         ), leased AS (
             UPDATE tasks t
                SET status = 'running', lease_until = now() + $3 * interval '1 millisecond', leased_by = $4,
                    attempt_count = t.attempt_count + 1, updated_at = now()
               FROM due
              WHERE t.id = due.id AND t.run_at = due.run_at
             RETURNING t.*
         )
         SELECT leased.*, $5::text AS biz_type, leased.lease_until AS reserved_until FROM leased ORDER BY run_at",
    )
    .bind(biz.id)
    .bind(limit)
    .bind(ttr_ms)
    .bind(Uuid::now_v7())
    .bind(&biz.name)
    .fetch_all(pool)
    .await?)
}

/// How many tasks of the biz type are reserved and not yet acked or nacked.
pub async fn reserved_count(pool: &PgPool, biz_type_id: i32) -> Result<i64, Error> {
    Ok(sqlx::query_scalar("SELECT count(*) FROM tasks WHERE biz_type_id = $1 AND status = 'running'")
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

/// Acks or nacks a reserved task of `biz`; returns the task as it is now. A task that is
/// not reserved (never was, was acked already, or its time-to-run passed and it went back
/// to pending) answers Conflict.
pub async fn settle(pool: &PgPool, biz: &BizType, id: Uuid, verdict: Verdict) -> Result<Task, Error> {
    let mut tx = pool.begin().await?;
    let row: Option<(i32, String, DateTime<Utc>, i32, DateTime<Utc>)> =
        sqlx::query_as("SELECT biz_type_id, status, run_at, attempt_count, updated_at FROM tasks WHERE id = $1 FOR UPDATE")
            .bind(id)
            .fetch_optional(&mut *tx)
            .await?;
    let Some((owner, status, run_at, attempt, reserved_at)) = row else {
        let elsewhere: Option<i32> = sqlx::query_scalar("SELECT biz_type_id FROM tasks_cold WHERE id = $1").bind(id).fetch_optional(&mut *tx).await?;
        return Err(match elsewhere {
            Some(owner) if owner != biz.id => Error::Forbidden("this task belongs to another biz type".into()),
            Some(_) => Error::Conflict("this task is not reserved: it is pending".into()),
            None => Error::NotFound(format!("no task with id {id}")),
        });
    };
    if owner != biz.id {
        return Err(Error::Forbidden("this task belongs to another biz type".into()));
    }
    if status != "running" {
        return Err(Error::Conflict(format!(
            "this task is not reserved: it is {status} (acked or nacked already, or its time to run passed)"
        )));
    }
    let (new_status, retry_in_ms, error, excerpt) = match verdict {
        Verdict::Ack => ("succeeded", None, None, Some("acked")),
        Verdict::Nack { delay_ms, error } => {
            let error = Some(format!("nacked{}", error.map(|e| format!(": {e}")).unwrap_or_default()));
            if attempt >= biz.max_attempts {
                ("failed", None, error, None)
            } else {
                let delay = delay_ms.unwrap_or_else(|| backoff(biz.backoff_initial_ms, biz.backoff_max_ms, attempt).as_millis() as i64);
                ("pending", Some(delay), error, None)
            }
        }
    };
    let task: Task = sqlx::query_as(
        "WITH settled AS (
             UPDATE tasks
                SET status = $3,
                    run_at = CASE WHEN $3 = 'pending'
                                  THEN least(now() + $4 * interval '1 millisecond', (SELECT until FROM hot_horizon) - interval '1 second')
                                  ELSE run_at END,
                    lease_until = NULL, leased_by = NULL, last_error = $5, updated_at = now(),
                    finished_at = CASE WHEN $3 = 'pending' THEN NULL ELSE now() END
              WHERE id = $1 AND run_at = $2
             RETURNING *
         )
         SELECT settled.*, $6::text AS biz_type FROM settled",
    )
    .bind(id)
    .bind(run_at)
    .bind(new_status)
    .bind(retry_in_ms.unwrap_or(0))
    .bind(&error)
    .bind(&biz.name)
    .fetch_one(&mut *tx)
    .await?;
    sqlx::query(
        "INSERT INTO attempts (task_id, number, started_at, duration_ms, error, response_excerpt, biz_type_id, lateness_ms)
         VALUES ($1, $2, $3, (extract(epoch FROM now() - $3) * 1000)::int, $4, $5, $6,
                 greatest(0, extract(epoch FROM $3 - $7) * 1000)::int)",
    )
    .bind(id)
    .bind(attempt)
    .bind(reserved_at)
    .bind(&error)
    .bind(excerpt)
    .bind(biz.id)
    .bind(run_at)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(task)
}

/// Extends the lease of a reserved task of `biz` to `ttr_ms` from now.
pub async fn touch(pool: &PgPool, biz: &BizType, id: Uuid, ttr_ms: i64) -> Result<DateTime<Utc>, Error> {
    let until: Option<DateTime<Utc>> = sqlx::query_scalar(
        "UPDATE tasks SET lease_until = now() + $3 * interval '1 millisecond'
          WHERE id = $1 AND biz_type_id = $2 AND status = 'running'
         RETURNING lease_until",
    )
    .bind(id)
    .bind(biz.id)
    .bind(ttr_ms)
    .fetch_optional(pool)
    .await?;
    match until {
        Some(until) => Ok(until),
        None => Err(match crate::tasks::get(pool, id).await? {
            None => Error::NotFound(format!("no task with id {id}")),
            Some((t, _)) if t.biz_type_id != biz.id => Error::Forbidden("this task belongs to another biz type".into()),
            Some((t, _)) => Error::Conflict(format!("this task is not reserved: it is {}", t.status)),
        }),
    }
}
