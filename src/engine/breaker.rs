//! A breaker per receiver: a biz type whose callback URL stops answering is not retried
//! task by task until every task has used up its attempts (before: a receiver answering 503
//! for 20 s failed all 50 of its tasks, 200 attempts); its deliveries stop, one task at a
//! time probes the receiver, and they resume by themselves when a probe is answered.
//!
//! Failures. No answer (connection refused or broken, a timeout), 408, 429 and 5xx are the
//! receiver's trouble (`deliver::Answer`); any other answer, a 4xx included, says it is up.
//! `breaker_threshold` failures in a row whose first is at most `breaker_window_ms` before
//! the last open the breaker. Each node counts its own callbacks' failures in memory: the
//! hot path writes nothing. With several nodes delivering a biz type each sees its share, so
//! the cluster may send up to threshold × nodes failing callbacks before one node opens it.
//! The failures that open it count toward their tasks' `max_attempts` as any failure does.
//!
//! State. Open or closed is the cluster's, in `receiver_breakers` (migration 0034): one row
//! per biz type, written when it opens or closes, at each probe, and when a receiver asks
//! the biz type to wait (below), never on an ordinary callback. The node that opens or
//! closes it (the `UPDATE ... WHERE open` that changes the row) logs it once, counts it
//! in `/metrics`, makes the signed `biz_type.receiver_down` or `biz_type.receiver_up`
//! notice for the failure_url in the same transaction (`failure_notices`), and its chat
//! notice for the chat_url (`chat_notices`), and sends the
//! settings notification (`Wake::Settings`): every engine re-reads its biz types, and this
//! table with them, at once (and every 2 s in case the notification was lost).
//!
//! Open. The engine claims none of the biz type's tasks (`gate`, one look in memory per
//! turn): they stay pending, their attempts untouched, and are delivered at the normal
//! pace, oldest due first, once it closes. A callback already in flight that fails while it
//! is open is held: its attempt is recorded with its error, not counted, and the task is
//! pending again after the next probe (`Verdict::Held`). A task's deadline still holds: one
//! that passes while the breaker is open ends `expired` by the leader's sweep, as for a
//! paused biz type.
//!
//! Probes. Every `breaker_probe_ms` one node is elected by `UPDATE ... WHERE next_probe_at
//! <= now()` on the row (the locked row's own value decides, so two nodes never both win),
//! which moves `next_probe_at` past the probe's longest time (the timeout plus a margin): one
//! probe at a time across the cluster, even when the prober dies. The winner claims one due
//! task and delivers it for real. Answered: the breaker closes. Failed: the attempt is held
//! like the others (not counted: a receiver down for a day does not fail its tasks one probe
//! at a time) and the task is due again only after the next probe, so that the next probe
//! takes another task: one task the receiver refuses cannot keep the breaker open while it
//! answers the others. Nothing due: no probe, until the next interval.
//!
//! Retry-After. A 429 or 503 with `Retry-After` holds the whole biz type's claims until then
//! (at most `MAX_SLOW`), on every node: the node that reads it writes `slowed_until` and
//! notifies, once per answer that moves it by `SLOW_STEP` or more (a burst of 429s writes
//! once). The task that got the answer retries then, as before.
//!
//! `breaker_threshold` 0 turns the breaker off; Retry-After still slows the biz type.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use tokio::time::Instant;

use super::BizTypeConfig;
use super::deliver::Answer;
use crate::db::Pool;
use crate::metrics;
use crate::tasks::lease::{Outcome, Verdict};
use crate::wake::{self, Wake};

/// The longest a receiver's `Retry-After` holds the whole biz type; a longer one still holds
/// the task that got it (up to a day, `deliver`), not its neighbours: one answer should not
/// stop a biz type for longer without a person.
const MAX_SLOW: Duration = Duration::from_secs(300);
/// A `Retry-After` that moves the biz type's wait by less than this is not written: a burst
/// of 429s, each saying "5 s", writes once.
const SLOW_STEP: Duration = Duration::from_millis(500);
/// Added to the biz type's timeout for how long an elected probe holds the next one off: the
/// probe's callback and its result, so that a slow probe is never joined by a second one.
const PROBE_MARGIN: Duration = Duration::from_secs(1);
/// How soon a node that lost a probe election to a row it could not read looks again.
const ELECTION_RETRY: Duration = Duration::from_millis(100);

/// The breakers as one node sees them: the cluster's state as last read (`sync`) or changed
/// here, and this node's own count of failures in a row. Shared by the claim loop and the
/// callbacks in flight.
pub(crate) struct Breakers {
    pool: Pool,
    /// The claim loop's biz types to look at next turn: one whose breaker this node closed.
    looks: Arc<super::Looks>,
    state: Mutex<HashMap<i32, Local>>,
}

#[derive(Default)]
struct Local {
    /// When this node's latest failures in a row came, since the last answer that was not
    /// one (at most `breaker_threshold` kept).
    streak: VecDeque<Instant>,
    /// Open, since this time (the database's): tells one opening from the next.
    open: Option<DateTime<Utc>>,
    /// This node is writing the opening: the failures meanwhile are held already.
    opening: bool,
    /// Open: no probe election before then (the row's `next_probe_at`, as last read or set).
    next_probe: Option<Instant>,
    /// No claim before then (`slowed_until`, as last read or set).
    slowed_until: Option<Instant>,
    /// When this node last opened or closed it: a read that began before then is older
    /// than what this node knows, and does not undo it.
    changed: Option<Instant>,
}

/// What the claim loop does with a biz type this turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Gate {
    Claim,
    /// Its breaker is open and this node won the probe: claim one task.
    Probe,
    /// Open, or slowed by Retry-After: look again then.
    Wait(Instant),
}

/// A breaker's row, as `sync` reads it: times as milliseconds from the database's now, so
/// that a node's clock does not matter.
#[derive(sqlx::FromRow)]
struct Row {
    biz_type_id: i32,
    open: bool,
    opened_at: Option<DateTime<Utc>>,
    probe_in_ms: Option<i64>,
    slowed_for_ms: Option<i64>,
}

/// One biz type's probe election, as `elect` reads it.
#[derive(sqlx::FromRow)]
struct Election {
    biz_type_id: i32,
    open: bool,
    /// This node won it.
    elected: bool,
    /// When the probe another node won ends (ms from the database's now).
    probe_in_ms: Option<i64>,
}

/// The statement `sync` reads: the breakers that are open or slowing now. One left open
/// when its biz type turned the breaker off (`breaker_threshold` 0) is not open; if it is
/// turned on again, the next probe closes it.
const READ: &str = "SELECT r.biz_type_id, r.open AND b.breaker_threshold > 0 AS open, r.opened_at,
        (extract(epoch FROM r.next_probe_at - now()) * 1000)::bigint AS probe_in_ms,
        (extract(epoch FROM r.slowed_until - now()) * 1000)::bigint AS slowed_for_ms
   FROM receiver_breakers r JOIN biz_types b ON b.id = r.biz_type_id
  WHERE r.open OR r.slowed_until > now()";

/// `now + ms` (a negative `ms` is now).
fn after_ms(now: Instant, ms: i64) -> Instant {
    now + Duration::from_millis(ms.max(0) as u64)
}

impl Breakers {
    pub(super) fn new(pool: Pool, looks: Arc<super::Looks>) -> Breakers {
        Breakers { pool, looks, state: Mutex::default() }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<i32, Local>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Reads the cluster's breakers (with the settings: every `SETTINGS_REFRESH`, and at once
    /// when any node notifies a change) and takes them as this node's. Returns the biz types
    /// this node saw close, to be claimed at once. An error leaves the state as it was.
    pub async fn sync(&self, biz_types: &[Arc<BizTypeConfig>]) -> Result<Vec<i32>, sqlx::Error> {
        let read_at = Instant::now();
        let rows: Vec<Row> = crate::db::query_as(READ).fetch_all(&self.pool).await?;
        let now = Instant::now();
        let names: HashMap<i32, &str> = biz_types.iter().map(|b| (b.id, b.name.as_str())).collect();
        let mut closed = Vec::new();
        let mut state = self.lock();
        let listed: HashSet<i32> = rows.iter().map(|r| r.biz_type_id).collect();
        for row in rows {
            let local = state.entry(row.biz_type_id).or_default();
            if local.changed.is_some_and(|at| at >= read_at) {
                continue;
            }
            let was_open = local.open.is_some();
            if row.open {
                local.open = row.opened_at;
                local.next_probe = Some(after_ms(now, row.probe_in_ms.unwrap_or(0)));
            } else if was_open {
                local.open = None;
                closed.push(row.biz_type_id);
            }
            if let Some(ms) = row.slowed_for_ms.filter(|ms| *ms > 0) {
                let until = after_ms(now, ms);
                local.slowed_until = Some(local.slowed_until.map_or(until, |u| u.max(until)));
            }
            if let Some(name) = names.get(&row.biz_type_id) {
                metrics::breaker_open(name, row.open);
            }
        }
        // Not listed: closed and not slowed, as far as the cluster knows (one this node is
        // opening right now excepted).
        for (id, local) in state.iter_mut().filter(|(id, l)| !listed.contains(id) && l.changed.is_none_or(|at| at < read_at)) {
            if local.open.take().is_some() {
                closed.push(*id);
                if let Some(name) = names.get(id) {
                    metrics::breaker_open(name, false);
                }
            }
        }
        Ok(closed)
    }

    /// What the claim loop does with `biz` this turn: claim, probe (this node won the
    /// election, `probing`), or wait. Costs a look in memory.
    pub fn gate(&self, biz: &BizTypeConfig, now: Instant, probing: &HashSet<i32>) -> Gate {
        let state = self.lock();
        let Some(local) = state.get(&biz.id) else { return Gate::Claim };
        if let Some(until) = local.slowed_until.filter(|u| *u > now) {
            return Gate::Wait(until);
        }
        if biz.breaker_threshold == 0 || (local.open.is_none() && !local.opening) {
            return Gate::Claim;
        }
        if probing.contains(&biz.id) {
            return Gate::Probe;
        }
        Gate::Wait(local.next_probe.filter(|at| *at > now).unwrap_or(now + ELECTION_RETRY))
    }

    /// Elects this node to probe the open biz types whose probe is due as far as it knows:
    /// one statement for all of them, none when no probe is due (every turn but one per
    /// probe interval). Returns those it won.
    pub async fn elect(&self, biz_types: &[Arc<BizTypeConfig>]) -> HashSet<i32> {
        let now = Instant::now();
        // The breakers this node knows (a few), not every biz type, are walked each turn.
        let due: Vec<(i32, i64)> = {
            let state = self.lock();
            let ids: Vec<i32> =
                state.iter().filter(|(_, l)| l.open.is_some() && l.next_probe.is_none_or(|at| at <= now)).map(|(id, _)| *id).collect();
            if ids.is_empty() {
                return HashSet::new();
            }
            biz_types.iter().filter(|b| b.breaker_threshold > 0 && ids.contains(&b.id)).map(|b| (b.id, probe_hold(b).as_millis() as i64)).collect()
        };
        if due.is_empty() {
            return HashSet::new();
        }
        let (ids, holds): (Vec<i32>, Vec<i64>) = due.iter().copied().unzip();
        // Locks: the rows of the breakers it elects this node for, FOR UPDATE SKIP LOCKED: a
        // row another node is electing (or writing) is skipped, and a row whose probe another
        // node took since this statement began no longer passes `next_probe_at <= now()` once
        // locked. The last SELECT reads the rows as they were before the UPDATE: for one not
        // won, when the winner's probe ends.
        let elected: Result<Vec<Election>, sqlx::Error> = crate::db::query_as(
            "WITH due AS (
                 SELECT * FROM unnest($1::int[], $2::bigint[]) AS d(id, hold_ms)
             ), won AS (
                 SELECT r.biz_type_id FROM receiver_breakers r JOIN due d ON d.id = r.biz_type_id
                  WHERE r.open AND r.next_probe_at <= now()
                    FOR UPDATE OF r SKIP LOCKED
             ), elected AS (
                 UPDATE receiver_breakers r
                    SET next_probe_at = now() + d.hold_ms * interval '1 millisecond', probes = r.probes + 1, last_probe_at = now()
                   FROM won w, due d
                  WHERE r.biz_type_id = w.biz_type_id AND d.id = w.biz_type_id
                 RETURNING r.biz_type_id
             )
             SELECT d.id AS biz_type_id, coalesce(r.open, false) AS open, d.id IN (SELECT biz_type_id FROM elected) AS elected,
                    (extract(epoch FROM r.next_probe_at - now()) * 1000)::bigint AS probe_in_ms
               FROM due d LEFT JOIN receiver_breakers r ON r.biz_type_id = d.id",
        )
        .bind(&ids)
        .bind(&holds)
        .fetch_all(&self.pool)
        .await;
        let now = Instant::now();
        let mut state = self.lock();
        let rows = match elected {
            Ok(rows) => rows,
            Err(e) => {
                tracing::warn!(error = %e, "could not elect a probe of an open receiver breaker; trying again shortly");
                for (id, _) in &due {
                    if let Some(local) = state.get_mut(id) {
                        local.next_probe = Some(now + ELECTION_RETRY);
                    }
                }
                return HashSet::new();
            }
        };
        let mut won = HashSet::new();
        for Election { biz_type_id: id, open, elected, probe_in_ms } in rows {
            let Some(local) = state.get_mut(&id) else { continue };
            let hold = due.iter().find(|(d, _)| *d == id).map_or(0, |(_, ms)| *ms);
            if elected {
                local.next_probe = Some(after_ms(now, hold));
                won.insert(id);
            } else if !open {
                // Closed meanwhile: the notification that says so re-reads the settings.
                local.open = None;
            } else {
                let at = after_ms(now, probe_in_ms.unwrap_or(0));
                local.next_probe = Some(at.max(now + ELECTION_RETRY));
            }
        }
        won
    }

    /// Takes a callback's answer into account: this node's count of failures in a row, the
    /// opening or closing of the breaker, and a Retry-After for the whole biz type. A
    /// failure while the breaker is open (a probe's, or one in flight when it opened) is
    /// held: `outcome` becomes `Verdict::Held`, not counted.
    pub async fn after(&self, biz: &BizTypeConfig, probe: bool, answer: Answer, outcome: &mut Outcome) {
        if let Some(wait) = answer.slow_for {
            self.slow(biz, wait.min(MAX_SLOW)).await;
        }
        if biz.breaker_threshold == 0 {
            return;
        }
        let now = Instant::now();
        let step = {
            let mut state = self.lock();
            let local = state.entry(biz.id).or_default();
            if !answer.trouble {
                local.streak.clear();
                match local.open {
                    Some(opened_at) if probe => Step::Close(opened_at),
                    _ => Step::Nothing,
                }
            } else if local.open.is_some() || local.opening {
                Step::Hold(local.open)
            } else {
                local.streak.push_back(now);
                while local.streak.len() > biz.breaker_threshold as usize {
                    local.streak.pop_front();
                }
                let window = Duration::from_millis(biz.breaker_window_ms.max(0) as u64);
                let full = local.streak.len() >= biz.breaker_threshold as usize;
                if full && local.streak.front().is_some_and(|first| now - *first <= window) {
                    local.opening = true;
                    Step::Open(local.streak.len())
                } else {
                    Step::Nothing
                }
            }
        };
        match step {
            Step::Nothing => {}
            Step::Open(failures) => self.open(biz, failures, outcome.error.as_deref().unwrap_or("failed")).await,
            Step::Close(opened_at) => {
                metrics::breaker_probe(&biz.name, true);
                self.close(biz, opened_at, outcome).await;
            }
            Step::Hold(opened_at) => {
                let at = Utc::now() + chrono::TimeDelta::milliseconds(i64::from(biz.breaker_probe_ms));
                outcome.verdict = Verdict::Held(at);
                let error = outcome.error.take().unwrap_or_else(|| "failed".into());
                let why = if probe { "a probe of the receiver's open breaker" } else { "the receiver's breaker is open" };
                outcome.error = Some(format!("{error} (not counted: {why})"));
                if probe && let Some(opened_at) = opened_at {
                    metrics::breaker_probe(&biz.name, false);
                    self.probe_failed(biz, opened_at, &error).await;
                }
            }
        }
    }

    /// Opens the breaker of `biz` after `failures` in a row (the last one's `error`), unless
    /// another node did first; either way this node holds the biz type's tasks from now on.
    async fn open(&self, biz: &BizTypeConfig, failures: usize, error: &str) {
        let opened = async {
            let mut tx = self.pool.begin().await?;
            // Locks: the biz type's breaker row, inserted or updated only if it was closed
            // (an open one is left as it is: its opening was another node's). The notice is
            // made in the same transaction, so that an opening and its notice are one.
            let opened: Option<(DateTime<Utc>, i64)> = crate::db::query_as(
                "WITH opened AS (
                     INSERT INTO receiver_breakers AS r (biz_type_id, open, opened_at, reason, failures, next_probe_at, probes,
                                                         last_probe_at, last_probe_error)
                     VALUES ($1, true, now(), $2, $3, now() + $4 * interval '1 millisecond', 0, NULL, NULL)
                     ON CONFLICT (biz_type_id) DO UPDATE
                        SET open = true, opened_at = now(), reason = excluded.reason, failures = excluded.failures,
                            next_probe_at = excluded.next_probe_at, probes = 0, last_probe_at = NULL, last_probe_error = NULL
                      WHERE NOT r.open
                     RETURNING r.opened_at, r.next_probe_at
                 ), news AS (
                     SELECT b.id, b.failure_url, b.chat_url,
                            jsonb_build_object('state', 'open', 'callback_url', b.callback_url, 'opened_at', o.opened_at,
                                               'reason', $2::text, 'failures', $3::int, 'window_ms', b.breaker_window_ms,
                                               'probe_ms', b.breaker_probe_ms) AS detail
                       FROM opened o, biz_types b
                      WHERE b.id = $1
                 ), notice AS (
                     INSERT INTO failure_notices (biz_type_id, event, detail)
                     SELECT id, 'biz_type.receiver_down', detail FROM news WHERE failure_url IS NOT NULL
                 ), chat AS (
                     INSERT INTO chat_notices (biz_type_id, event, detail)
                     SELECT id, 'biz_type.receiver_down', detail FROM news WHERE chat_url IS NOT NULL
                 )
                 SELECT opened_at, (extract(epoch FROM next_probe_at - now()) * 1000)::bigint FROM opened",
            )
            .bind(biz.id)
            .bind(error)
            .bind(failures as i32)
            .bind(i64::from(biz.breaker_probe_ms))
            .fetch_optional(&mut *tx)
            .await?;
            let opened = match opened {
                Some(opened) => {
                    wake::notify(&mut *tx, Wake::Settings).await?;
                    Some((true, opened))
                }
                // Open already: another node opened it first, and this node takes its state
                // rather than wait for that node's notification to be read.
                None => crate::db::query_as::<(DateTime<Utc>, i64)>(
                    "SELECT opened_at, (extract(epoch FROM next_probe_at - now()) * 1000)::bigint
                       FROM receiver_breakers WHERE biz_type_id = $1 AND open",
                )
                .bind(biz.id)
                .fetch_optional(&mut *tx)
                .await?
                .map(|open| (false, open)),
            };
            tx.commit().await?;
            Ok::<_, sqlx::Error>(opened)
        }
        .await;
        let now = Instant::now();
        let mut state = self.lock();
        let local = state.entry(biz.id).or_default();
        local.opening = false;
        match opened {
            Ok(Some((false, (opened_at, probe_in_ms)))) => {
                local.open = Some(opened_at);
                local.next_probe = Some(after_ms(now, probe_in_ms));
                local.streak.clear();
            }
            Ok(Some((true, (opened_at, probe_in_ms)))) => {
                local.open = Some(opened_at);
                local.next_probe = Some(after_ms(now, probe_in_ms));
                local.changed = Some(now);
                local.streak.clear();
                drop(state);
                metrics::breaker_opened(&biz.name);
                metrics::breaker_open(&biz.name, true);
                tracing::warn!(
                    biz_type = %biz.name, failures, window_ms = biz.breaker_window_ms, error, probe_ms = biz.breaker_probe_ms,
                    "receiver down: its breaker is open; the biz type's tasks wait, their attempts not counted, while one task \
                     at a time probes the receiver; deliveries resume by themselves when a probe is answered"
                );
            }
            // Closed again meanwhile (a probe answered): this node's failures count anew.
            Ok(None) => local.streak.clear(),
            // Tried again at the next failure (the streak is kept).
            Err(e) => tracing::warn!(biz_type = %biz.name, error = %e, "could not open the receiver's breaker; its failures are retried as usual"),
        }
    }

    /// Closes the breaker of `biz` opened at `opened_at`: a probe was answered.
    async fn close(&self, biz: &BizTypeConfig, opened_at: DateTime<Utc>, outcome: &Outcome) {
        let closed = async {
            let mut tx = self.pool.begin().await?;
            // Locks: the biz type's breaker row, only while the opening it saw lasts (an
            // opening since is left open: its own probe closes it).
            let closed: Option<(i32,)> = crate::db::query_as(
                "WITH closed AS (
                     UPDATE receiver_breakers
                        SET open = false, closed_at = now(), next_probe_at = NULL, last_probe_at = now()
                      WHERE biz_type_id = $1 AND open AND opened_at = $2
                     RETURNING opened_at, closed_at, probes
                 ), news AS (
                     SELECT b.id, b.failure_url, b.chat_url,
                            jsonb_build_object('state', 'closed', 'callback_url', b.callback_url, 'opened_at', c.opened_at,
                                               'closed_at', c.closed_at, 'probes', c.probes, 'status_code', $3::int,
                                               'down_ms', (extract(epoch FROM c.closed_at - c.opened_at) * 1000)::bigint) AS detail
                       FROM closed c, biz_types b
                      WHERE b.id = $1
                 ), notice AS (
                     INSERT INTO failure_notices (biz_type_id, event, detail)
                     SELECT id, 'biz_type.receiver_up', detail FROM news WHERE failure_url IS NOT NULL
                 ), chat AS (
                     INSERT INTO chat_notices (biz_type_id, event, detail)
                     SELECT id, 'biz_type.receiver_up', detail FROM news WHERE chat_url IS NOT NULL
                 )
                 SELECT probes FROM closed",
            )
            .bind(biz.id)
            .bind(opened_at)
            .bind(outcome.status_code.map(i32::from))
            .fetch_optional(&mut *tx)
            .await?;
            if closed.is_some() {
                wake::notify(&mut *tx, Wake::Settings).await?;
            }
            tx.commit().await?;
            Ok::<_, sqlx::Error>(closed)
        }
        .await;
        match closed {
            Ok(Some((probes,))) => {
                if let Some(local) = self.lock().get_mut(&biz.id) {
                    local.open = None;
                    local.changed = Some(Instant::now());
                }
                // Claimed at the next turn (the callback's end wakes the loop).
                self.looks.add(biz.id);
                metrics::breaker_closed(&biz.name);
                metrics::breaker_open(&biz.name, false);
                let down_ms = (Utc::now() - opened_at).num_milliseconds();
                tracing::info!(
                    biz_type = %biz.name, probes, down_ms, status = outcome.status_code,
                    "receiver up: a probe was answered and its breaker is closed; the biz type's waiting tasks are delivered again"
                );
            }
            // Closed or opened again by another node meanwhile: its notification says so.
            Ok(None) => {}
            // Still open: the next probe tries again (and closes it).
            Err(e) => tracing::warn!(biz_type = %biz.name, error = %e, "could not close the receiver's breaker after an answered probe"),
        }
    }

    /// A probe failed: the next one is due a probe interval from now, on any node.
    async fn probe_failed(&self, biz: &BizTypeConfig, opened_at: DateTime<Utc>, error: &str) {
        // Locks: the biz type's breaker row, while the opening it probed lasts.
        let written = crate::db::query(
            "UPDATE receiver_breakers SET next_probe_at = now() + $3 * interval '1 millisecond', last_probe_error = $4
              WHERE biz_type_id = $1 AND open AND opened_at = $2",
        )
        .bind(biz.id)
        .bind(opened_at)
        .bind(i64::from(biz.breaker_probe_ms))
        .bind(error)
        .execute(&self.pool)
        .await;
        let next = Instant::now() + Duration::from_millis(biz.breaker_probe_ms.max(0) as u64);
        if let Some(local) = self.lock().get_mut(&biz.id) {
            local.next_probe = Some(next);
        }
        // The claim loop waits for the election's hold; it looks again, and waits for this.
        self.looks.add(biz.id);
        if let Err(e) = written {
            // The election's hold (timeout plus margin) spaces the next probe meanwhile.
            tracing::warn!(biz_type = %biz.name, error = %e, "could not record a failed probe of the receiver");
        }
    }

    /// Holds the whole biz type's claims for `wait` (a receiver's Retry-After), on every
    /// node: written, and notified, only when it moves the wait this node knows by
    /// `SLOW_STEP` or more.
    async fn slow(&self, biz: &BizTypeConfig, wait: Duration) {
        let until = Instant::now() + wait;
        {
            let mut state = self.lock();
            let local = state.entry(biz.id).or_default();
            if local.slowed_until.is_some_and(|known| known + SLOW_STEP > until) {
                return;
            }
            local.slowed_until = Some(until);
        }
        let slowed = async {
            let mut tx = self.pool.begin().await?;
            // Locks: the biz type's breaker row, moved only later.
            let moved = crate::db::query(
                "INSERT INTO receiver_breakers AS r (biz_type_id, slowed_until) VALUES ($1, now() + $2 * interval '1 millisecond')
                 ON CONFLICT (biz_type_id) DO UPDATE SET slowed_until = excluded.slowed_until
                  WHERE r.slowed_until IS NULL OR r.slowed_until < excluded.slowed_until",
            )
            .bind(biz.id)
            .bind(wait.as_millis() as i64)
            .execute(&mut *tx)
            .await?
            .rows_affected();
            if moved > 0 {
                wake::notify(&mut *tx, Wake::Settings).await?;
            }
            tx.commit().await
        }
        .await;
        metrics::slowed(&biz.name);
        tracing::info!(biz_type = %biz.name, wait_ms = wait.as_millis() as u64, "the receiver asked to wait (Retry-After): no callback of the biz type starts before then");
        if let Err(e) = slowed {
            tracing::warn!(biz_type = %biz.name, error = %e, "could not tell the other nodes to wait (Retry-After); this node waits");
        }
    }
}

/// What an answer does to the breaker.
enum Step {
    Nothing,
    /// This node's failures in a row reached the threshold: open it.
    Open(usize),
    /// A probe was answered: close the breaker opened then.
    Close(DateTime<Utc>),
    /// A failure while open (since then, if known): held, not counted.
    Hold(Option<DateTime<Utc>>),
}

/// How long an elected probe holds off the next: its callback's longest time and a margin,
/// or the probe interval if longer.
fn probe_hold(biz: &BizTypeConfig) -> Duration {
    let timeout = Duration::from_millis(biz.timeout_ms.max(0) as u64) + PROBE_MARGIN;
    timeout.max(Duration::from_millis(biz.breaker_probe_ms.max(0) as u64))
}

/// A biz type's breaker as the console shows it.
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct State {
    pub biz_type_id: i32,
    pub open: bool,
    pub opened_at: Option<DateTime<Utc>>,
    pub closed_at: Option<DateTime<Utc>>,
    /// The failure that opened it, and how many in a row.
    pub reason: Option<String>,
    pub failures: i32,
    pub next_probe_at: Option<DateTime<Utc>>,
    pub probes: i32,
    pub last_probe_at: Option<DateTime<Utc>>,
    pub last_probe_error: Option<String>,
    /// A Retry-After holds the biz type's claims until then (shown while in the future).
    pub slowed_until: Option<DateTime<Utc>>,
}

/// Every biz type's breaker that has ever opened or been slowed, by biz type id (open only
/// while its biz type has a breaker).
pub async fn states(pool: &Pool) -> Result<HashMap<i32, State>, sqlx::Error> {
    let rows: Vec<State> = crate::db::query_as(
        "SELECT r.biz_type_id, r.open AND b.breaker_threshold > 0 AS open, r.opened_at, r.closed_at, r.reason, r.failures,
                r.next_probe_at, r.probes, r.last_probe_at, r.last_probe_error,
                CASE WHEN r.slowed_until > now() THEN r.slowed_until END AS slowed_until
           FROM receiver_breakers r JOIN biz_types b ON b.id = r.biz_type_id",
    )
    .fetch_all(pool)
    .await?;
    Ok(rows.into_iter().map(|s| (s.biz_type_id, s)).collect())
}
