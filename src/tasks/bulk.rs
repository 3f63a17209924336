//! Cancelling or replaying every task that matches a filter (docs/design/contract.md, Tasks by key), any number of them:
//! in batches of `BATCH`, a transaction each, so that no transaction holds many locks or
//! runs long, and the engine's claims (of this biz type and of others) go on between them.
//!
//! Each batch walks an index in (run_at, id) order from where the last one stopped (keyset),
//! so a row that does not match (its key has another prefix, another timer) is read once in
//! the whole operation, not once per batch. Rows locked at that moment by someone else (the
//! engine claiming them, a client changing one) are passed over (SKIP LOCKED) rather than
//! waited for: a claimed task is about to run, and would not be pending to cancel anyway.
//! The caller gets the counts when every batch is done.
//!
//! Which index: pending tasks are walked in `tasks_claim_idx` (biz type, run_at, id), and
//! `tasks_cold_list_idx` in cold storage; failed ones in `tasks_failed_idx`, expired ones in
//! `tasks_expired_idx`. A key prefix is a filter on that walk, not an index of its own: the
//! walk reads the biz type's tasks of that state once, 30 to 40 ms for 100,000 pending tasks
//! (a prefix matching 1,111 of them, cancelled; `tests/api/bulk.rs`, release build on two
//! shared cores), and a prefix index on `task_keys` would have to be joined back to the
//! tasks, a probe per partition for each. Cancelling all 100,000 took 1.0 to 1.6 s, with a
//! steady biz type's callbacks 1.5 to 2 ms late (p50; p99 about 5 ms) meanwhile.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use sqlx::{PgConnection, Postgres, QueryBuilder};
use uuid::Uuid;

use super::{COUNT_CAP, Status, check_time, validate_key};
use crate::audit::{self, Action};
use crate::db::Pool;
use crate::error::Error;

/// The biz types with a bulk operation under way on this node, and the time each may
/// still spend on them, for the API to run them one at a time per biz type and, beyond a
/// burst of `BURST`, at most `DUTY` of the time: a walk reads every task of the biz type in
/// one state. 16 dry runs at once over 200,000 pending tasks took another biz type's create
/// p99 from 41 to ~600 ms; one at a time, back to back, still from 26 to 111 ms (debug
/// build, two shared cores). With this share, `LEAST` and the dry run's capped `count`,
/// 1.09x (`bulk_dry_runs_leave_another_biz_type_s_creates_alone`, median of 3).
/// Per node, not per cluster: a session-held advisory lock would not survive a pooler in
/// transaction mode, and a cluster of N nodes runs at most N at once.
#[derive(Default)]
pub struct Running(Mutex<HashMap<i32, Share>>);

/// The most of the time a biz type's bulk operations may take on a node, in the long run.
const DUTY: f64 = 0.1;
/// The time they may take at once: enough for a dry run and the cancel after it (which may
/// then overdraw it, and rest).
const BURST: Duration = Duration::from_millis(500);
/// The least an operation is charged, however quick: 2 a second after the burst. 16 clients
/// dry-running a prefix over 200,000 tasks (10 ms each, capped) took another biz type's
/// create p99 to 1.34x (median of 3) charged 20 ms each, to 1.09x charged 50 ms.
const LEAST: Duration = Duration::from_millis(50);

/// A biz type's bulk operations on this node: whether one is under way, and the time they
/// may still take (earned at `DUTY` a second up to `BURST`, spent by each as it ends).
struct Share {
    under_way: bool,
    credit: f64,
    at: Instant,
}

/// A biz type's bulk operation under way, until dropped (also when its request is dropped).
pub struct Under<'a> {
    running: &'a Running,
    biz_type_id: i32,
    started: Instant,
}

impl Running {
    /// Marks `biz_type_id`'s bulk operation under way; while another one is, or they spent
    /// their time, how long to wait (an estimate, while one is under way).
    pub fn start(&self, biz_type_id: i32) -> Result<Under<'_>, Duration> {
        let mut running = self.0.lock().expect("bulk lock");
        let now = Instant::now();
        let share = running.entry(biz_type_id).or_insert(Share { under_way: false, credit: BURST.as_secs_f64(), at: now });
        share.credit = (share.credit + (now - share.at).as_secs_f64() * DUTY).min(BURST.as_secs_f64());
        share.at = now;
        if share.under_way {
            return Err(Duration::from_secs(1));
        }
        if share.credit <= 0.0 {
            return Err(Duration::from_secs_f64(-share.credit / DUTY));
        }
        share.under_way = true;
        Ok(Under { running: self, biz_type_id, started: now })
    }
}

impl Drop for Under<'_> {
    fn drop(&mut self) {
        let mut running = self.running.0.lock().expect("bulk lock");
        if let Some(share) = running.get_mut(&self.biz_type_id) {
            let now = Instant::now();
            share.credit += (now - share.at).as_secs_f64() * DUTY - self.started.elapsed().max(LEAST).as_secs_f64();
            share.credit = share.credit.min(BURST.as_secs_f64());
            share.at = now;
            share.under_way = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_biz_type_runs_one_bulk_operation_at_a_time_and_a_tenth_of_the_time_beyond_a_burst_at_least_50_ms_each() {
        let running = Running::default();
        let first = running.start(1).expect("the first starts");
        assert_eq!(running.start(1).err(), Some(Duration::from_secs(1)), "one at a time");
        assert!(running.start(2).is_ok(), "another biz type's is its own");
        drop(first);
        assert!(running.start(1).is_ok(), "within the burst");
        // The rest of the burst pays for 9 operations however quick (and a little earned).
        let quick = std::iter::from_fn(|| running.start(1).ok()).take(100).count();
        assert!((8..=10).contains(&quick), "{quick} quick operations in the burst");
        // As if operations had taken 3 s: the next may start once 1 s is earned back, 10 s on.
        running.0.lock().unwrap().get_mut(&1).unwrap().credit = -1.0;
        let wait = running.start(1).err().expect("refused once the burst is spent");
        assert!(wait > Duration::from_secs(9) && wait <= Duration::from_secs(10), "{wait:?}");
    }
}

/// Tasks changed per transaction. 1,000 keeps each transaction to some milliseconds of
/// locks, and the statements per 100,000 tasks to a hundred.
pub const BATCH: i64 = 1000;

/// Which tasks a bulk operation acts on: those of the biz type (None: of every biz type,
/// for the console) matching every condition given.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BulkFilter {
    pub biz_type_id: Option<i32>,
    /// The key starts with this (case-sensitive, as keys are).
    pub key_prefix: Option<String>,
    /// run_at ≥ this
    pub run_at_from: Option<DateTime<Utc>>,
    /// run_at < this
    pub run_at_to: Option<DateTime<Utc>>,
    /// Occurrences of this timer.
    pub timer_id: Option<Uuid>,
}

impl BulkFilter {
    /// The filter the API and the console both build, by the same rules: a key prefix is
    /// checked as a key is, times as a list's filter times are, and a filter without any
    /// condition acts on every task of the biz type, so it must say so (`all`).
    pub fn new(
        biz_type_id: Option<i32>,
        key_prefix: Option<String>,
        run_at_from: Option<DateTime<Utc>>,
        run_at_to: Option<DateTime<Utc>>,
        timer_id: Option<Uuid>,
        all: bool,
    ) -> Result<BulkFilter, Error> {
        if let Some(prefix) = &key_prefix {
            validate_key(prefix).map_err(|e| match e {
                Error::Invalid { message, .. } => Error::invalid("key_prefix", message),
                e => e,
            })?;
        }
        let run_at_from = run_at_from.map(|t| check_time("run_at_from", t)).transpose()?;
        let run_at_to = run_at_to.map(|t| check_time("run_at_to", t)).transpose()?;
        if let (Some(from), Some(to)) = (run_at_from, run_at_to)
            && from >= to
        {
            return Err(Error::invalid("run_at_to", "must be after run_at_from (the range is run_at_from ≤ run_at < run_at_to)"));
        }
        let filter = BulkFilter { biz_type_id, key_prefix, run_at_from, run_at_to, timer_id };
        if !all && !filter.has_condition() {
            return Err(Error::invalid(
                "all",
                "the filter has no condition, so it would act on every task: give key_prefix, run_at_from, run_at_to or timer_id, or say \"all\": true",
            ));
        }
        Ok(filter)
    }

    fn has_condition(&self) -> bool {
        self.key_prefix.is_some() || self.run_at_from.is_some() || self.run_at_to.is_some() || self.timer_id.is_some()
    }

    /// `WHERE …` of one walk: the state (written out, so that the partial index serves it),
    /// the filter's conditions, and the position after the last batch.
    fn push_where(&self, q: &mut QueryBuilder<Postgres>, status: Status, after: Option<(DateTime<Utc>, Uuid)>) {
        q.push(" WHERE status = '").push(status.as_str()).push("'");
        if let Some(id) = self.biz_type_id {
            q.push(" AND biz_type_id = ").push_bind(id);
        }
        if let Some(prefix) = &self.key_prefix {
            q.push(" AND starts_with(key, ").push_bind(prefix.clone()).push(")");
        }
        if let Some(from) = self.run_at_from {
            q.push(" AND run_at >= ").push_bind(from);
        }
        if let Some(to) = self.run_at_to {
            q.push(" AND run_at < ").push_bind(to);
        }
        if let Some(timer) = self.timer_id {
            q.push(" AND timer_id = ").push_bind(timer);
        }
        if let Some((run_at, id)) = after {
            q.push(" AND (run_at, id) > (").push_bind(run_at).push(", ").push_bind(id).push(")");
        }
    }
}

/// What a bulk operation found and did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BulkCount {
    /// Tasks that matched (with `dry_run`, all that match now).
    pub matched: i64,
    /// Of those, cancelled or replayed (0 for a dry run).
    pub changed: i64,
    /// The operation's entry in the audit log (None for a dry run): its page follows it.
    pub entry: Option<i64>,
}

/// Who makes a bulk operation, for its entry in the audit log: the actor, and the name of
/// the biz type the filter is of (None: every biz type, from the console).
#[derive(Debug, Clone, Copy)]
pub struct By<'a> {
    pub actor: &'a str,
    pub biz_type: Option<&'a str>,
}

impl By<'_> {
    /// The operation's one entry, written in its first batch's transaction: the filter, the
    /// same from the API and the console. The tasks each batch changes refer to it
    /// (`audit::tasks_touched`), and the last batch adds the counts (`finish`); an operation
    /// cut short (the node stopped) keeps its filter and the tasks it did change.
    async fn start(&self, tx: &mut PgConnection, action: Action, filter: &BulkFilter, status: Status) -> Result<i64, sqlx::Error> {
        let scope = serde_json::json!({
            "biz_type": self.biz_type,
            "status": status.as_str(),
            "key_prefix": filter.key_prefix,
            "run_at_from": filter.run_at_from,
            "run_at_to": filter.run_at_to,
            "timer_id": filter.timer_id,
        });
        audit::record(tx, self.actor, action, self.biz_type.unwrap_or("every biz type"), None, Some(scope)).await
    }

    /// Adds the counts to the operation's entry, in its last batch's transaction.
    async fn finish(tx: &mut PgConnection, entry: i64, count: &BulkCount) -> Result<(), sqlx::Error> {
        audit::add_to_after(tx, entry, serde_json::json!({"matched": count.matched, "changed": count.changed})).await
    }
}

/// How many tasks in `status` match, hot and (for pending) cold: a dry run. Counts at most
/// `COUNT_CAP + 1` (more than `COUNT_CAP` means "more than that"), as the lists do: a full
/// count reads every task of the biz type in that state, and 16 clients dry-running a
/// prefix over 200,000 pending tasks took another biz type's create p99 to 3x, within the
/// time share of `Running`, where a capped count stops after a tenth of the walk.
pub async fn count(pool: &Pool, filter: &BulkFilter, status: Status) -> Result<i64, Error> {
    let mut total = 0;
    for table in tables(status) {
        let mut q = QueryBuilder::new(format!("SELECT count(*) FROM (SELECT 1 FROM {table}"));
        filter.push_where(&mut q, status, None);
        q.push(" LIMIT ").push_bind(COUNT_CAP + 1 - total).push(") c");
        total += q.build_query_scalar::<i64>().fetch_one(pool).await?;
        if total > COUNT_CAP {
            break;
        }
    }
    Ok(total)
}

/// Where tasks in this state can be: only pending ones are ever in cold storage (a cold
/// task is pending or cancelled; a failed or expired one was due, so hot).
fn tables(status: Status) -> &'static [&'static str] {
    if status == Status::Pending { &["tasks", "tasks_cold"] } else { &["tasks"] }
}

/// Cancels every pending task matching the filter, hot and cold, a batch per transaction,
/// recorded in the audit log as `by`'s (`task.bulk_cancel`, one entry that each batch's
/// tasks refer to, in that batch's transaction).
pub async fn cancel(pool: &Pool, filter: &BulkFilter, by: By<'_>) -> Result<BulkCount, Error> {
    let mut count = BulkCount::default();
    let mut entry = None;
    let tables = tables(Status::Pending);
    for (i, table) in tables.iter().enumerate() {
        let mut after = None;
        loop {
            let mut tx = pool.begin().await?;
            let audit_id = match entry {
                Some(id) => id,
                None => *entry.insert(by.start(&mut tx, Action::TaskBulkCancel, filter, Status::Pending).await?),
            };
            let mut q = QueryBuilder::new(format!(
                // Locks the batch's rows (skipping those someone else holds: a claim, a
                // change), then cancels them through each partition's primary key, given
                // the ids as an array, as the claim does (`sql/claim.sql` says why not a join).
                "WITH picked AS (SELECT id, run_at FROM {table}"
            ));
            filter.push_where(&mut q, Status::Pending, after);
            q.push(" ORDER BY run_at, id LIMIT ").push_bind(BATCH).push(" FOR UPDATE SKIP LOCKED");
            q.push(format!(
                "), done AS (
                     UPDATE {table} SET status = 'cancelled', finished_at = now(), updated_at = now()
                      WHERE id = ANY(ARRAY(SELECT id FROM picked)) AND status = 'pending'
                     RETURNING id
                 ), last AS (
                     SELECT run_at, id FROM picked ORDER BY run_at DESC, id DESC LIMIT 1
                 )
                 SELECT (SELECT count(*) FROM picked), ARRAY(SELECT id FROM done), last.run_at, last.id
                   FROM (SELECT 1) one LEFT JOIN last ON true"
            ));
            let (picked, done, run_at, id): (i64, Vec<Uuid>, Option<DateTime<Utc>>, Option<Uuid>) = q.build_query_as().fetch_one(&mut *tx).await?;
            count.matched += picked;
            count.changed += done.len() as i64;
            audit::tasks_touched(&mut tx, audit_id, &done).await?;
            let next = match (run_at, id) {
                (Some(run_at), Some(id)) if picked == BATCH => Some((run_at, id)),
                _ => None,
            };
            if next.is_none() && i + 1 == tables.len() {
                By::finish(&mut tx, audit_id, &count).await?;
            }
            tx.commit().await?;
            match next {
                Some(position) => after = Some(position),
                None => break,
            }
        }
    }
    count.entry = entry;
    Ok(count)
}

/// Replays every task in `status` (failed or expired) matching the filter, as one replay
/// does (`queries::replay`: pending, due now, attempts counted afresh), a batch per
/// transaction, recorded as `by`'s as `cancel` records (`task.bulk_replay`). Delivered at
/// the biz type's rate, like any due task.
pub async fn replay(pool: &Pool, filter: &BulkFilter, status: Status, by: By<'_>) -> Result<BulkCount, Error> {
    let mut count = BulkCount::default();
    let mut entry = None;
    let mut after = None;
    loop {
        let mut tx = pool.begin().await?;
        let audit_id = match entry {
            Some(id) => id,
            None => *entry.insert(by.start(&mut tx, Action::TaskBulkReplay, filter, status).await?),
        };
        // Locks the batch, skipping rows someone else holds.
        let mut q = QueryBuilder::new("SELECT id, run_at FROM tasks");
        filter.push_where(&mut q, status, after);
        q.push(" ORDER BY run_at, id LIMIT ").push_bind(BATCH).push(" FOR UPDATE SKIP LOCKED");
        let picked: Vec<(Uuid, DateTime<Utc>)> = q.build_query_as().fetch_all(&mut *tx).await?;
        let ids: Vec<Uuid> = picked.iter().map(|(id, _)| *id).collect();
        let replayed = super::queries::requeue(&mut tx, false, &ids, super::queries::Requeue::replay()).await?;
        count.matched += picked.len() as i64;
        count.changed += replayed.len() as i64;
        audit::tasks_touched(&mut tx, audit_id, &replayed.iter().map(|t| t.id).collect::<Vec<_>>()).await?;
        let next = match picked.last() {
            Some((id, run_at)) if picked.len() as i64 == BATCH => Some((*run_at, *id)),
            _ => None,
        };
        if next.is_none() {
            By::finish(&mut tx, audit_id, &count).await?;
        }
        tx.commit().await?;
        match next {
            Some(position) => after = Some(position),
            None => return Ok(BulkCount { entry, ..count }),
        }
    }
}

/// The first `n` tasks in `status` matching the filter, in due order (hot, then cold):
/// what the console's confirm page shows as examples of what it would change. Locks nothing.
pub async fn sample(pool: &Pool, filter: &BulkFilter, status: Status, n: i64) -> Result<Vec<(Uuid, Option<String>)>, Error> {
    let mut found = Vec::new();
    for table in tables(status) {
        let mut q = QueryBuilder::new(format!("SELECT id, key FROM {table}"));
        filter.push_where(&mut q, status, None);
        q.push(" ORDER BY run_at, id LIMIT ").push_bind(n - found.len() as i64);
        found.extend(q.build_query_as::<(Uuid, Option<String>)>().fetch_all(pool).await?);
        if found.len() as i64 >= n {
            break;
        }
    }
    Ok(found)
}

/// A bulk operation as its audit entry recorded it (`By::start`, `By::finish`): what it
/// was, the filter, and the counts once its last batch was done.
#[derive(Debug, Clone, PartialEq)]
pub struct Recorded {
    /// A replay (else a cancel).
    pub replay: bool,
    /// The biz type's name; None: every biz type.
    pub biz_type: Option<String>,
    /// The state of the tasks it took.
    pub status: String,
    pub filter: BulkFilter,
    /// None: under way, or cut short (the node stopped).
    pub matched: Option<i64>,
    pub changed: Option<i64>,
}

impl Recorded {
    /// The operation `entry` records; None for an entry of another action.
    pub fn of(entry: &audit::Entry) -> Option<Recorded> {
        let replay = match entry.action.as_str() {
            "task.bulk_replay" => true,
            "task.bulk_cancel" => false,
            _ => return None,
        };
        let after = entry.after.as_ref();
        let text = |name: &str| after.and_then(|a| a.get(name)).and_then(|v| v.as_str()).map(str::to_string);
        let time = |name: &str| text(name).and_then(|t| t.parse::<DateTime<Utc>>().ok());
        let number = |name: &str| after.and_then(|a| a.get(name)).and_then(|v| v.as_i64());
        Some(Recorded {
            replay,
            biz_type: text("biz_type"),
            status: text("status").unwrap_or_else(|| if replay { "failed" } else { "pending" }.into()),
            filter: BulkFilter {
                biz_type_id: None,
                key_prefix: text("key_prefix"),
                run_at_from: time("run_at_from"),
                run_at_to: time("run_at_to"),
                timer_id: text("timer_id").and_then(|t| t.parse().ok()),
            },
            matched: number("matched"),
            changed: number("changed"),
        })
    }

    /// What it did, as a sentence: "Replayed 92 of 92 failed tasks." (with the counts), or
    /// that it has not recorded them.
    pub fn outcome(&self) -> String {
        let verb = if self.replay { "Replayed" } else { "Cancelled" };
        match (self.matched, self.changed) {
            (Some(matched), Some(changed)) => {
                let tasks = if matched == 1 { "task" } else { "tasks" };
                format!("{verb} {changed} of {matched} matching {} {tasks}.", self.status)
            }
            _ => format!(
                "{} {} tasks: under way, or cut short (no counts recorded).",
                if self.replay { "Replaying" } else { "Cancelling" },
                self.status
            ),
        }
    }

    /// The filter in words (`describe`).
    pub fn scope(&self) -> String {
        describe(self.biz_type.as_deref(), &self.status, &self.filter)
    }
}

/// A filter in words, whole, its time window included: "failed tasks of `invoices`, keys
/// starting `inv-`, due from 2026-11-27 10:00:00 UTC to 2026-11-27 11:00:00 UTC". What the
/// confirm page asks about and what the audit log says was done read the same.
pub fn describe(biz_type: Option<&str>, status: &str, filter: &BulkFilter) -> String {
    let mut words = format!("{status} tasks of ");
    match biz_type {
        Some(name) => words.push_str(&format!("biz type {name}")),
        None => words.push_str("every biz type"),
    }
    if let Some(prefix) = &filter.key_prefix {
        words.push_str(&format!(", keys starting {prefix}"));
    }
    if let Some(timer) = filter.timer_id {
        words.push_str(&format!(", occurrences of timer {timer}"));
    }
    let time = |t: DateTime<Utc>| t.format("%Y-%m-%d %H:%M:%S UTC").to_string();
    match (filter.run_at_from, filter.run_at_to) {
        (Some(from), Some(to)) => words.push_str(&format!(", due from {} to {}", time(from), time(to))),
        (Some(from), None) => words.push_str(&format!(", due from {} on", time(from))),
        (None, Some(to)) => words.push_str(&format!(", due before {}", time(to))),
        (None, None) => words.push_str(", due at any time"),
    }
    words
}

/// The most tasks of one operation `progress` reads: each is a probe of the tasks'
/// primary keys (in every partition, as `read` is), and the console reads it again every
/// few seconds while the operation's tasks are being delivered.
pub const PROGRESS_CAP: i64 = COUNT_CAP;

/// Where the tasks a bulk operation changed are now (of the first `PROGRESS_CAP`).
#[derive(Debug, Clone, Default, PartialEq, Eq, sqlx::FromRow)]
pub struct Progress {
    /// Tasks read: all the operation changed, up to `PROGRESS_CAP`.
    pub counted: i64,
    /// Pending, never tried since.
    pub waiting: i64,
    /// Pending after a failed attempt (`RETRYING_SQL`).
    pub retrying: i64,
    pub running: i64,
    pub succeeded: i64,
    pub failed: i64,
    pub expired: i64,
    pub cancelled: i64,
}

impl Progress {
    /// Tasks no longer stored (retired past retention with their partition).
    pub fn gone(&self) -> i64 {
        self.counted - self.waiting - self.retrying - self.running - self.succeeded - self.failed - self.expired - self.cancelled
    }

    /// Still to be settled: pending (waiting or retrying) or running.
    pub fn unsettled(&self) -> i64 {
        self.waiting + self.retrying + self.running
    }
}

/// The states of the tasks the operation of audit entry `entry` changed (its `task_events`,
/// through `task_events_audit_idx`), hot and cold, up to `PROGRESS_CAP` of them. The ids go
/// in as an array, so each is a probe of a primary key, never a scan of the view. Locks
/// nothing.
pub async fn progress(pool: &Pool, entry: i64) -> Result<Progress, Error> {
    let sql = format!(
        "WITH touched AS (SELECT task_id FROM task_events WHERE audit_id = $1 LIMIT $2)
         SELECT (SELECT count(*) FROM touched) AS counted,
                count(*) FILTER (WHERE t.status = 'pending' AND NOT {retrying}) AS waiting,
                count(*) FILTER (WHERE {retrying}) AS retrying,
                count(*) FILTER (WHERE t.status = 'running') AS running,
                count(*) FILTER (WHERE t.status = 'succeeded') AS succeeded,
                count(*) FILTER (WHERE t.status = 'failed') AS failed,
                count(*) FILTER (WHERE t.status = 'expired') AS expired,
                count(*) FILTER (WHERE t.status = 'cancelled') AS cancelled
           FROM all_tasks t WHERE t.id = ANY(ARRAY(SELECT task_id FROM touched))",
        retrying = super::RETRYING_SQL
    );
    Ok(crate::db::query_as::<Progress>(sqlx::AssertSqlSafe(sql)).bind(entry).bind(PROGRESS_CAP).fetch_one(pool).await?)
}

/// Some of the tasks the operation of audit entry `entry` changed, up to `n`, by key (then
/// id): the operation's page lists them, each a link to its task. Locks nothing.
pub async fn touched(pool: &Pool, entry: i64, n: i64) -> Result<Vec<super::Task>, Error> {
    let sql = format!(
        "{} WHERE t.id = ANY(ARRAY(SELECT task_id FROM task_events WHERE audit_id = $1 LIMIT $2)) ORDER BY t.key, t.id",
        super::queries::SELECT_TASK
    );
    Ok(crate::db::query_as::<super::Task>(sqlx::AssertSqlSafe(sql)).bind(entry).bind(n).fetch_all(pool).await?)
}
