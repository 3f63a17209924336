//! Pull delivery: consumers that cannot take a callback reserve due tasks, each leased for
//! a time-to-run, and ack or nack them (issue: pull delivery; docs/design/contract.md, API).
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
//!
//! Reserves that wait for a task stand in one line per biz type on each node (`Waiters`).
//! Only the waiter at the head of the line looks at the database; the others find, when
//! their turn comes, that the look made since the last wake-up answers them too, and go
//! back to waiting. A biz type's waiters thus cost one look per wake-up (or per poll) on
//! each node, however many they are, and hold no connection while they wait; they are
//! woken only by wake-ups for their own biz type (or for all). Without the line, 300
//! waiters looked every second each and at every task created anywhere: 1,212
//! transactions/s on an idle database instead of 166, and 510 of them took every
//! connection of the pool.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::Notify;
use tokio::time::Instant;
use uuid::Uuid;

use crate::biz_types::BizType;
use crate::db::Pool;
use crate::engine::rate::Limiters;
use crate::error::Error;
use crate::tasks::lease::{self, Outcome, RetryPolicy};
use crate::tasks::{Status, Task};
use crate::wake::Wake;

/// The lines of reserves waiting on this node, one per biz type that has waiters.
#[derive(Default)]
pub struct Waiters {
    /// A line lives as long as a waiter holds it; dead entries are swept as lines are made.
    lines: Mutex<HashMap<i32, Weak<Line>>>,
}

impl Waiters {
    /// The line of `biz_type_id`'s waiters, to stand in while waiting.
    pub fn line(&self, biz_type_id: i32) -> Arc<Line> {
        let mut lines = self.lines.lock().expect("waiters lock");
        if let Some(line) = lines.get(&biz_type_id).and_then(Weak::upgrade) {
            return line;
        }
        lines.retain(|_, line| line.strong_count() > 0);
        let line = Arc::new(Line::default());
        lines.insert(biz_type_id, Arc::downgrade(&line));
        line
    }

    /// Wakes the lines a wake-up is for: its biz type's, or all of them.
    pub fn wake(&self, why: Wake) {
        let woken: Vec<Arc<Line>> = {
            let lines = self.lines.lock().expect("waiters lock");
            match why {
                Wake::DueFor(id) => lines.get(&id).and_then(Weak::upgrade).into_iter().collect(),
                Wake::Due | Wake::Settings => lines.values().filter_map(Weak::upgrade).collect(),
            }
        };
        for line in woken {
            line.wakes.fetch_add(1, Ordering::SeqCst);
            line.notify.notify_waiters();
        }
    }
}

/// The waiting reserves of one biz type on this node.
#[derive(Default)]
pub struct Line {
    notify: Notify,
    /// Wake-ups counted, so that a waiter can tell whether one came since the last look.
    wakes: AtomicU64,
    /// Held by the waiter looking at the database, with what the last look found.
    turn: tokio::sync::Mutex<Option<Looked>>,
}

/// A look that found nothing to reserve: answers every waiter until the next wake-up or
/// until `again`.
#[derive(Clone, Copy)]
struct Looked {
    wakes: u64,
    again: Instant,
}

/// What a waiter's turn came to.
pub enum Turn<T> {
    /// It looked and found this.
    Found(T),
    /// It looked, or a look since the last wake-up answered for it: nothing to reserve
    /// until a wake-up or this instant.
    Nothing(Instant),
}

impl Line {
    /// A wake-up for this line that comes from now on, even while the caller looks.
    pub fn woken(&self) -> tokio::sync::futures::Notified<'_> {
        self.notify.notified()
    }

    /// Waits for this waiter's turn and then, unless a look made since the last wake-up
    /// (and not yet due again) found nothing already, looks with `look`, which answers what
    /// it found or how long to wait before looking again.
    pub async fn look<T, E, F>(&self, look: F) -> Result<Turn<T>, E>
    where
        F: AsyncFnOnce() -> Result<Result<T, Duration>, E>,
    {
        let mut last = self.turn.lock().await;
        let wakes = self.wakes.load(Ordering::SeqCst);
        if let Some(looked) = *last
            && looked.wakes == wakes
            && looked.again > Instant::now()
        {
            return Ok(Turn::Nothing(looked.again));
        }
        // Whatever this look finds or fails with, the next waiter looks again.
        *last = None;
        match look().await? {
            Ok(found) => Ok(Turn::Found(found)),
            Err(wait) => {
                let again = Instant::now() + wait;
                *last = Some(Looked { wakes, again });
                Ok(Turn::Nothing(again))
            }
        }
    }
}

/// Pull rate limits of this node: each node hands out its share of a biz type's
/// cluster-wide rate (the rate divided by the live nodes, counted every few seconds).
#[derive(Default)]
pub struct PullLimits {
    limiters: Mutex<Limiters>,
    nodes: Mutex<Option<(Instant, i64)>>,
}

impl PullLimits {
    async fn live_nodes(&self, pool: &Pool) -> i64 {
        let cached = *self.nodes.lock().expect("pull limits lock");
        if let Some((at, n)) = cached
            && at.elapsed() < Duration::from_secs(5)
        {
            return n;
        }
        let n = crate::nodes::live(pool).await.unwrap_or(1).max(1);
        *self.nodes.lock().expect("pull limits lock") = Some((Instant::now(), n));
        n
    }

    /// How many of `want` tasks may be handed out now, and if fewer, how long until more.
    pub async fn take(&self, pool: &Pool, biz: &BizType, want: i64) -> (i64, Option<Duration>) {
        let Some(rate) = biz.rate_limit else { return (want, None) };
        let share = rate / self.live_nodes(pool).await as f64;
        self.limiters.lock().expect("pull limits lock").take(biz.id, Some(share), want)
    }
}

/// What became of a reservation.
pub enum Verdict {
    Ack,
    /// Retry after this delay (None: the biz type's backoff), with the consumer's reason.
    Nack {
        delay_ms: Option<i64>,
        error: Option<String>,
    },
}

/// Acks or nacks a task of `biz` reserved under `receipt`, and returns the task as it is
/// now. A nack fails the task when its attempts are used up, else makes it pending again
/// after the delay asked for or the biz type's backoff, as for callbacks. A receipt that
/// no longer holds the task (it was settled already, or its time to run passed and it
/// went back to pending or to another consumer) answers StaleReceipt and changes nothing.
///
/// The reservation is settled as the engine records a callback (`lease::record_in`), in
/// one transaction that holds the task's row from the receipt's check to the settle, so
/// no other reservation can begin in between.
pub async fn settle(pool: &Pool, biz: &BizType, id: Uuid, receipt: Uuid, verdict: Verdict) -> Result<Task, Error> {
    let mut tx = pool.begin().await?;
    let Some(held) = lease::hold(&mut tx, biz.id, id, receipt).await? else {
        drop(tx);
        return Err(refused(pool, biz, id).await?);
    };
    let (verdict, error, excerpt) = match verdict {
        Verdict::Ack => (lease::Verdict::Delivered, None, Some("acked".to_string())),
        Verdict::Nack { delay_ms, error } => {
            let policy =
                RetryPolicy { max_attempts: biz.max_attempts, backoff_initial_ms: biz.backoff_initial_ms, backoff_max_ms: biz.backoff_max_ms };
            let wait = delay_ms.map(|ms| std::time::Duration::from_millis(ms.max(0) as u64));
            let reason = format!("nacked{}", error.map(|e| format!(": {e}")).unwrap_or_default());
            (lease::Verdict::after_failure(held.attempt_count, policy, wait, held.db_now, held.expires_at), Some(reason), None)
        }
    };
    let outcome = Outcome {
        task_id: id,
        biz_type_id: biz.id,
        run_at: held.run_at,
        attempt: held.attempt_count,
        started_at: held.reserved_at,
        duration_ms: (held.db_now - held.reserved_at).num_milliseconds().clamp(0, i64::from(i32::MAX)) as i32,
        status_code: None,
        error,
        response_excerpt: excerpt,
        redirected_to: None,
        verdict,
    };
    lease::record_in(&mut tx, receipt, None, &[outcome]).await?;
    let task = crate::tasks::read(&mut *tx, id).await?.ok_or_else(|| Error::NotFound(format!("no task with id {id}")))?;
    tx.commit().await?;
    if matches!(verdict, lease::Verdict::Expire { .. }) {
        crate::metrics::expired(&biz.name, 1);
    }
    Ok(task)
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
    let now = match task.status {
        Status::Running => "its time to run passed and another reservation holds it now (or the receipt is another task's)".to_string(),
        Status::Pending => "it is pending, not reserved (nacked, or its time to run passed)".to_string(),
        status => format!("it is {status} (acked or nacked already, or its time to run passed)"),
    };
    Ok(Error::StaleReceipt(format!("this receipt no longer holds the task: {now}")))
}

/// Extends the reservation of a task of `biz` held under `receipt` to `ttr_ms` from now.
pub async fn touch(pool: &Pool, biz: &BizType, id: Uuid, receipt: Uuid, ttr_ms: i64) -> Result<DateTime<Utc>, Error> {
    match lease::touch(pool, biz.id, id, receipt, ttr_ms).await? {
        Some(until) => Ok(until),
        None => Err(refused(pool, biz, id).await?),
    }
}
