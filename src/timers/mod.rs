//! Timers: periodic schedules owned by a biz type; each occurrence becomes a task
//! (docs/design/contract.md: API, Leader).
//!
//! The leader writes occurrences as ordinary tasks for a window ahead
//! (`CHIME_TIMER_WINDOW_SECS`), keyed `"<timer key>@<fire time>"`. Two things make each
//! occurrence exist exactly once, across leader changes too: the timer's row is locked
//! while its occurrences are written together with its new `materialized_until` (one
//! transaction), and the key is unique per biz type (`task_keys`), so even two leaders
//! cannot write the same occurrence twice.
//!
//! Changing a timer's schedule, payload or state removes its occurrences that have not
//! fired yet (pending, never attempted) and starts again from now. When the leader finds
//! a timer behind the clock (no node ran for a while), the occurrences missed meanwhile
//! are skipped, or with `catch_up` the latest of them fires once, now.

mod reading;
mod schedule;

pub use reading::{reading, six_fields};
pub use schedule::Schedule;

use crate::audit::{self, Action};
use crate::db::Pool;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use serde_json::value::RawValue;
use sha2::{Digest, Sha256};
use sqlx::{Postgres, Transaction};
use uuid::Uuid;

use crate::error::Error;
use crate::tasks::{MAX_KEY_BYTES, check_payload, validate_key};

/// Room an occurrence key needs after the timer key: `@2026-11-22T09:30:00Z`.
const OCCURRENCE_SUFFIX_BYTES: usize = 21;
/// Most occurrences written for one timer in one transaction; the rest follow next tick.
const MAX_PER_PASS: usize = 10_000;
/// Most timers locked by one pass of `materialize_due`.
const TIMERS_PER_PASS: usize = 1_000;
/// A pass takes no more timers once it has this many occurrences to write (it always takes
/// one), which keeps its insert to a fraction of a second.
const ROWS_PER_PASS: usize = 10_000;
/// `materialize_due` starts no new pass after this long: the rest of the leader's tick
/// (lease recovery) waits at most this plus one pass.
const TICK_BUDGET: std::time::Duration = std::time::Duration::from_secs(1);
/// How late an occurrence may be written and still fire (late) rather than count as missed
/// (Quartz's misfire threshold is the same minute).
const LATE_GRACE: chrono::Duration = chrono::Duration::seconds(60);
/// Fire times shown with a timer.
pub const SHOWN_FIRE_TIMES: usize = 5;

#[derive(Debug, Clone, Serialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct Timer {
    pub id: Uuid,
    #[serde(skip)]
    pub biz_type_id: i32,
    pub biz_type: String,
    pub key: String,
    pub cron: String,
    pub timezone: String,
    /// As PostgreSQL prints it.
    #[schema(value_type = serde_json::Value)]
    pub payload: Box<RawValue>,
    pub active: bool,
    pub catch_up: bool,
    /// Occurrences up to here have been written as tasks.
    pub materialized_until: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

impl Timer {
    pub fn schedule(&self) -> Result<Schedule, Error> {
        Schedule::parse(&self.cron, &self.timezone)
    }

    /// The next fire times after `now` (none if inactive).
    pub fn next_fire_times(&self, now: DateTime<Utc>) -> Vec<DateTime<Utc>> {
        match (self.active, self.schedule()) {
            (true, Ok(s)) => s.next(now, SHOWN_FIRE_TIMES),
            _ => Vec::new(),
        }
    }
}

/// A create request as the client sends it.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(description = "A periodic schedule whose occurrences become tasks.")]
pub struct CreateTimer {
    /// The token's biz type.
    pub biz_type: String,
    /// Unique per biz type: 1 to 235 bytes of UTF-8 without control characters (occurrences
    /// are keyed `<key>@<fire time>`, within the 256 bytes of a task key).
    #[schema(min_length = 1, max_length = 235, pattern = r"^[^\u0000-\u001f\u007f-\u009f]+$")]
    pub key: String,
    /// Six or seven fields: second minute hour day-of-month month day-of-week [year],
    /// separated by spaces on one line (no control characters).
    #[schema(pattern = r"^[^\u0000-\u001f\u007f-\u009f]+$", example = "0 */15 * * * *")]
    pub cron: String,
    /// IANA time zone name.
    #[schema(default = "UTC", example = "America/New_York")]
    pub timezone: Option<String>,
    /// Sent with every occurrence. Any JSON value.
    #[schema(value_type = serde_json::Value, required = false)]
    pub payload: Option<Box<RawValue>>,
    #[schema(default = true)]
    pub active: Option<bool>,
    /// After a time with no node running, fire the latest missed occurrence once (true) or
    /// skip the missed ones (false).
    #[schema(default = false)]
    pub catch_up: Option<bool>,
}

/// The changes of a PATCH; absent fields stay as they are.
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = PatchTimer, description = "What to change in a timer; absent fields stay as they are, at least one must be given.")]
pub struct TimerChanges {
    /// Six or seven fields: second minute hour day-of-month month day-of-week [year],
    /// separated by spaces on one line (no control characters).
    #[schema(pattern = r"^[^\u0000-\u001f\u007f-\u009f]+$", example = "0 */15 * * * *")]
    pub cron: Option<String>,
    /// IANA time zone name.
    #[schema(example = "America/New_York")]
    pub timezone: Option<String>,
    /// Sent with every occurrence. Any JSON value.
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = serde_json::Value)]
    pub payload: Option<Box<RawValue>>,
    pub active: Option<bool>,
    /// After a time with no node running, fire the latest missed occurrence once (true) or
    /// skip the missed ones (false).
    pub catch_up: Option<bool>,
}

/// `Some(null)` when the client sends `"payload": null`, `None` when it is absent.
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Box<RawValue>>, D::Error> {
    Box::<RawValue>::deserialize(d).map(Some)
}

impl CreateTimer {
    pub fn validate(&self, max_payload_bytes: usize) -> Result<(), Error> {
        validate_key(&self.key)?;
        if self.key.len() > MAX_KEY_BYTES - OCCURRENCE_SUFFIX_BYTES {
            return Err(Error::invalid(
                "key",
                format!("must be at most {} bytes (occurrence keys add `@<fire time>`)", MAX_KEY_BYTES - OCCURRENCE_SUFFIX_BYTES),
            ));
        }
        validate_schedule(&self.cron, self.timezone.as_deref().unwrap_or("UTC"))?;
        if let Some(payload) = self.payload.as_deref() {
            check_payload(payload, max_payload_bytes)?;
        }
        Ok(())
    }
}

impl TimerChanges {
    pub fn is_empty(&self) -> bool {
        self.cron.is_none() && self.timezone.is_none() && self.payload.is_none() && self.active.is_none() && self.catch_up.is_none()
    }
}

/// A schedule must parse and fire at least once more. A new one must be on one line: the
/// cron crate takes CR, LF or tab between fields, but the text is stored and shown as given.
/// (Not in `Schedule::parse`, which reads timers already stored.)
fn validate_schedule(cron: &str, timezone: &str) -> Result<Schedule, Error> {
    if cron.contains(char::is_control) {
        return Err(Error::invalid("cron", "must not contain control characters; separate the fields with spaces"));
    }
    let schedule = Schedule::parse(cron, timezone)?;
    if schedule.next(Utc::now(), 1).is_empty() {
        return Err(Error::invalid("cron", "never fires again"));
    }
    Ok(schedule)
}

const SELECT: &str = "SELECT t.*, b.name AS biz_type FROM timers t JOIN biz_types b ON b.id = t.biz_type_id";

/// Creates a timer of biz type `biz_type_id`, recorded in the audit log as `actor`'s
/// (`timer.create`, the timer as made) in the same transaction.
pub async fn create(pool: &Pool, biz_type_id: i32, request: CreateTimer, actor: &str) -> Result<Timer, Error> {
    let mut tx = pool.begin().await?;
    let timer: Option<Timer> = crate::db::query_as(
        "WITH t AS (
             INSERT INTO timers (id, biz_type_id, key, cron, timezone, payload, active, catch_up, materialized_until)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, now())
             ON CONFLICT (biz_type_id, key) DO NOTHING
             RETURNING *
         )
         SELECT t.*, b.name AS biz_type FROM t JOIN biz_types b ON b.id = t.biz_type_id",
    )
    .bind(Uuid::now_v7())
    .bind(biz_type_id)
    .bind(&request.key)
    .bind(&request.cron)
    .bind(request.timezone.as_deref().unwrap_or("UTC"))
    .bind(request.payload.as_deref().unwrap_or(RawValue::NULL))
    .bind(request.active.unwrap_or(true))
    .bind(request.catch_up.unwrap_or(false))
    .fetch_optional(&mut *tx)
    .await?;
    let timer = timer.ok_or_else(|| Error::key_conflict(format!("a timer with key `{}` already exists in this biz type", request.key)))?;
    audit::record(&mut tx, actor, Action::TimerCreate, &timer.id.to_string(), None, serde_json::to_value(&timer).ok()).await?;
    tx.commit().await?;
    Ok(timer)
}

pub async fn get(pool: &Pool, id: Uuid) -> Result<Option<Timer>, Error> {
    Ok(crate::db::query_as(sqlx::AssertSqlSafe(format!("{SELECT} WHERE t.id = $1"))).bind(id).fetch_optional(pool).await?)
}

/// A biz type's timers (or all, for the console) by biz type and key, `limit` of them;
/// with a biz type, those after `after_key`.
pub async fn list(pool: &Pool, biz_type_id: Option<i32>, after_key: Option<&str>, limit: i64) -> Result<Vec<Timer>, Error> {
    Ok(crate::db::query_as(sqlx::AssertSqlSafe(format!(
        "{SELECT} WHERE ($1::int IS NULL OR t.biz_type_id = $1) AND ($2::text IS NULL OR t.key > $2)
          ORDER BY b.name, t.key LIMIT $3"
    )))
    .bind(biz_type_id)
    .bind(after_key)
    .bind(limit)
    .fetch_all(pool)
    .await?)
}

/// Locks a timer of biz type `owner` for a change (404 if missing, 403 if another's).
async fn lock(tx: &mut Transaction<'_, Postgres>, owner: i32, id: Uuid) -> Result<Timer, Error> {
    let timer: Timer = crate::db::query_as(sqlx::AssertSqlSafe(format!("{SELECT} WHERE t.id = $1 FOR UPDATE OF t")))
        .bind(id)
        .fetch_optional(&mut **tx)
        .await?
        .ok_or_else(|| Error::NotFound(format!("no timer with id {id}")))?;
    if timer.biz_type_id != owner {
        return Err(Error::Forbidden("this timer belongs to another biz type".into()));
    }
    Ok(timer)
}

/// Applies `changes` to a timer of biz type `owner`, recorded in the audit log as `by`'s
/// (an update, activate or deactivate: the timer before and after) in the same
/// transaction; returns the timer before and after.
pub async fn update(
    pool: &Pool,
    owner: i32,
    id: Uuid,
    changes: TimerChanges,
    max_payload_bytes: usize,
    by: audit::By<'_>,
) -> Result<(Timer, Timer), Error> {
    let mut tx = pool.begin().await?;
    let before = lock(&mut tx, owner, id).await?;
    let cron = changes.cron.as_deref().unwrap_or(&before.cron);
    let timezone = changes.timezone.as_deref().unwrap_or(&before.timezone);
    if changes.cron.is_some() || changes.timezone.is_some() {
        validate_schedule(cron, timezone)?;
    }
    if let Some(payload) = changes.payload.as_deref() {
        check_payload(payload, max_payload_bytes)?;
    }
    let active = changes.active.unwrap_or(before.active);
    let payload = changes.payload.as_deref().unwrap_or(&before.payload);
    // Anything that changes what or when it fires starts the schedule again from now.
    let restart = cron != before.cron || timezone != before.timezone || !same_json(payload, &before.payload) || active != before.active;
    if restart {
        crate::tasks::remove_unfired(&mut tx, before.id, before.biz_type_id).await?;
    }
    let after: Timer = crate::db::query_as(
        "WITH t AS (
             UPDATE timers SET cron = $2, timezone = $3, payload = $4, active = $5, catch_up = $6, updated_at = now(),
                    materialized_until = CASE WHEN $7 THEN now() ELSE materialized_until END
              WHERE id = $1
             RETURNING *
         )
         SELECT t.*, b.name AS biz_type FROM t JOIN biz_types b ON b.id = t.biz_type_id",
    )
    .bind(id)
    .bind(cron)
    .bind(timezone)
    .bind(payload)
    .bind(active)
    .bind(changes.catch_up.unwrap_or(before.catch_up))
    .bind(restart)
    .fetch_one(&mut *tx)
    .await?;
    audit::record(&mut tx, by.actor, by.action, &id.to_string(), serde_json::to_value(&before).ok(), serde_json::to_value(&after).ok()).await?;
    tx.commit().await?;
    Ok((before, after))
}

/// Whether two payloads are the same JSON, whatever their spacing and key order. Numbers
/// compare as written: `1e2` is not `100`.
fn same_json(a: &RawValue, b: &RawValue) -> bool {
    serde_json::from_str::<Value>(a.get()).ok() == serde_json::from_str::<Value>(b.get()).ok()
}

/// Deletes a timer of biz type `owner` and its occurrences that have not fired, recorded in
/// the audit log as `actor`'s (`timer.delete`, the timer as it was) in the same transaction.
pub async fn delete(pool: &Pool, owner: i32, id: Uuid, actor: &str) -> Result<Timer, Error> {
    let mut tx = pool.begin().await?;
    let timer = lock(&mut tx, owner, id).await?;
    crate::tasks::remove_unfired(&mut tx, timer.id, timer.biz_type_id).await?;
    crate::db::query("DELETE FROM timers WHERE id = $1").bind(id).execute(&mut *tx).await?;
    audit::record(&mut tx, actor, Action::TimerDelete, &id.to_string(), serde_json::to_value(&timer).ok(), None).await?;
    tx.commit().await?;
    Ok(timer)
}

/// Writes occurrences for the active timers whose window is at least half used up (an
/// archived biz type's timers write none), a pass of up to `TIMERS_PER_PASS` timers at a
/// time, until none is left or the tick's `TICK_BUDGET` is spent (the rest follow next
/// tick). Returns how many occurrences were written.
///
/// One pass is one transaction of three statements whatever the number of timers: lock the
/// due timers, insert all their occurrences, move their `materialized_until`. Each timer
/// in a transaction of its own (as before) cost a commit per timer: 100k every-minute timers
/// need ~330 timers refilled a second, and 100k created at once took over 15 minutes to
/// write at 100 a tick, so their first occurrences were missed.
pub async fn materialize_due(pool: &Pool, window: std::time::Duration) -> Result<u64, Error> {
    let started = std::time::Instant::now();
    let mut written = 0;
    loop {
        let pass = materialize_pass(pool, window, None).await?;
        written += pass.written;
        if !pass.more || started.elapsed() >= TICK_BUDGET {
            return Ok(written);
        }
    }
}

/// Writes one timer's occurrences up to `window` ahead of the database clock, whether or
/// not its window is half used up, waiting for its row if another writer holds it. Returns
/// how many were written.
pub async fn materialize(pool: &Pool, id: Uuid, window: std::time::Duration) -> Result<u64, Error> {
    Ok(materialize_pass(pool, window, Some(id)).await?.written)
}

/// What one pass did.
struct Pass {
    written: u64,
    /// Timers were left due (the pass was full): another pass would find work.
    more: bool,
}

/// One transaction: locks the due timers (or timer `only`), writes their occurrences up to
/// `window` ahead of the database clock in one statement, and moves each timer's
/// `materialized_until` to where its occurrences end.
async fn materialize_pass(pool: &Pool, window: std::time::Duration, only: Option<Uuid>) -> Result<Pass, Error> {
    #[derive(sqlx::FromRow)]
    struct Row {
        #[sqlx(flatten)]
        timer: Timer,
        now: DateTime<Utc>,
    }
    let mut tx = pool.begin().await?;
    let rows: Vec<Row> = match only {
        Some(id) => {
            crate::db::query_as(
                "SELECT t.*, b.name AS biz_type, now() AS now FROM timers t JOIN biz_types b ON b.id = t.biz_type_id
                  WHERE t.id = $1 AND t.active AND b.archived_at IS NULL FOR UPDATE OF t",
            )
            .bind(id)
            .fetch_all(&mut *tx)
            .await?
        }
        // Locks the timers it returns, skipping those another writer holds (two leaders
        // during a change of leader share the work rather than queue on each other). Each
        // arm of the id list is a range of `timers_due_idx` read in order and cut by its
        // LIMIT; the timers are then fetched by primary key. One condition with
        // `OR materialized_until IS NULL`, sorted NULLS FIRST, read and sorted every timer
        // whenever many were due: 224 ms against 3-12 ms for this with 100k timers due
        // (EXPLAIN ANALYZE, PostgreSQL 15 on this machine). The most urgent first.
        None => {
            crate::db::query_as(
                "SELECT t.*, b.name AS biz_type, now() AS now
                   FROM timers t JOIN biz_types b ON b.id = t.biz_type_id
                  WHERE t.id = ANY (ARRAY(
                          (SELECT id FROM timers WHERE active AND materialized_until IS NULL
                              AND biz_type_id NOT IN (SELECT id FROM biz_types WHERE archived_at IS NOT NULL) LIMIT $2)
                          UNION ALL
                          (SELECT id FROM timers WHERE active AND materialized_until < now() + $1 * interval '1 millisecond'
                              AND biz_type_id NOT IN (SELECT id FROM biz_types WHERE archived_at IS NOT NULL)
                            ORDER BY materialized_until LIMIT $2)
                          LIMIT $2))
                    AND t.active AND b.archived_at IS NULL
                  ORDER BY t.materialized_until NULLS FIRST FOR UPDATE OF t SKIP LOCKED",
            )
            .bind(window.as_millis() as i64 / 2)
            .bind(TIMERS_PER_PASS as i64)
            .fetch_all(&mut *tx)
            .await?
        }
    };
    if rows.is_empty() {
        // Nothing due: the usual tick, one statement (the transaction rolls back, unused).
        return Ok(Pass { written: 0, more: false });
    }
    let mut more = only.is_none() && rows.len() >= TIMERS_PER_PASS;
    let mut occurrences = crate::tasks::Occurrences::default();
    // Per timer: its id, key, how many occurrences were planned, and its new materialized_until.
    let mut planned: Vec<(Uuid, &str, usize, DateTime<Utc>)> = Vec::with_capacity(rows.len());
    for Row { timer, now } in &rows {
        if occurrences.len() >= ROWS_PER_PASS {
            // The timers not reached stay due and are unlocked at commit: the next pass.
            more = true;
            break;
        }
        let plan = match timer.schedule() {
            Ok(schedule) => plan(timer, &schedule, *now, window),
            Err(e) => {
                // Moved on all the same, so that it is not first in every pass; a change
                // to its schedule starts it again from now.
                tracing::warn!(timer = %timer.id, error = %e, "timer's schedule no longer parses; skipping it (change its cron or time zone to fix it)");
                Plan { occurrences: Vec::new(), until: *now + chrono::Duration::from_std(window).expect("window fits") }
            }
        };
        let hash = Sha256::digest(format!("timer {}", timer.id)).to_vec();
        for (fire, run_at) in &plan.occurrences {
            occurrences.push(timer.id, timer.biz_type_id, occurrence_key(&timer.key, *fire), *run_at, hash.clone());
        }
        planned.push((timer.id, &timer.key, plan.occurrences.len(), plan.until));
    }
    let written = crate::tasks::insert_occurrences(&mut *tx, &occurrences).await?;
    for (id, key, count, _) in &planned {
        let got = written.get(id).copied().unwrap_or(0) as usize;
        if got < *count {
            tracing::warn!(timer = %id, key = %key, skipped = count - got,
                "some occurrence keys were already taken (by a task created with the same key); those occurrences are skipped");
        }
    }
    let (ids, untils): (Vec<Uuid>, Vec<DateTime<Utc>>) = planned.iter().map(|p| (p.0, p.3)).unzip();
    // The rows locked above.
    crate::db::query(
        "UPDATE timers t SET materialized_until = u.until
           FROM unnest($1::uuid[], $2::timestamptz[]) AS u(id, until) WHERE t.id = u.id",
    )
    .bind(&ids)
    .bind(&untils)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(Pass { written: written.values().sum::<i64>() as u64, more })
}

/// What one pass writes for a timer.
#[derive(Debug, PartialEq)]
struct Plan {
    /// (fire time, run_at): an occurrence runs at its fire time, a catch-up one now.
    occurrences: Vec<(DateTime<Utc>, DateTime<Utc>)>,
    /// The timer's new `materialized_until`.
    until: DateTime<Utc>,
}

/// A timer's occurrences from its `materialized_until` (or `now`) to `window` after `now`.
fn plan(timer: &Timer, schedule: &Schedule, now: DateTime<Utc>, window: std::time::Duration) -> Plan {
    let until = now + chrono::Duration::from_std(window).expect("window fits");
    let from = timer.materialized_until.unwrap_or(now);
    // Fire times at most LATE_GRACE past are late, not missed: a timer created or changed
    // since the leader's last pass, or a leader just taking over. They are written as usual
    // and fire at once. Older ones were missed while no node ran.
    let late_from = from.max(now - LATE_GRACE);
    let mut occurrences: Vec<(DateTime<Utc>, DateTime<Utc>)> = Vec::new();
    if from < late_from {
        let last_missed = schedule.last_between(from, late_from);
        let (id, key) = (timer.id, &timer.key);
        match (last_missed, timer.catch_up) {
            (Some(missed), true) => {
                tracing::info!(timer = %id, key = %key, %missed, "timer missed occurrences while no node ran; firing one catch-up occurrence");
                occurrences.push((missed, now));
            }
            (Some(missed), false) => {
                tracing::info!(timer = %id, key = %key, since = %from, last = %missed, "timer missed occurrences while no node ran; skipping them (catch_up is off)");
            }
            (None, _) => {}
        }
    }
    occurrences.extend(schedule.between(late_from, until, MAX_PER_PASS).into_iter().map(|t| (t, t)));
    // When cut short, the next pass resumes after the last occurrence written.
    let until = if occurrences.len() >= MAX_PER_PASS { occurrences.last().map_or(until, |o| o.0) } else { until };
    Plan { occurrences, until }
}

/// How far the leader is from keeping a biz type's active timers written ahead: how many
/// are due for writing (their window more than half used up), and the least time, in
/// seconds, that any timer's written occurrences still reach ahead of the database clock
/// (negative: behind). For the bench; a plain read, no locks.
pub async fn lag(pool: &Pool, biz_type_id: i32, window: std::time::Duration) -> Result<(i64, Option<f64>), Error> {
    Ok(crate::db::query_as(
        "SELECT count(*) FILTER (WHERE materialized_until < now() + $2 * interval '1 millisecond' OR materialized_until IS NULL),
                extract(epoch FROM min(materialized_until) - now())::float8
           FROM timers WHERE biz_type_id = $1 AND active",
    )
    .bind(biz_type_id)
    .bind(window.as_millis() as i64 / 2)
    .fetch_one(pool)
    .await?)
}

/// Deletes every timer of a biz type, leaving their occurrences (the bench, at the end of
/// its timers scenario, then deletes the biz type's tasks).
pub async fn delete_all(pool: &Pool, biz_type_id: i32) -> Result<u64, Error> {
    // Waits for a leader's pass that holds some of them; the leader's next pass skips them.
    let done = crate::db::query("DELETE FROM timers WHERE biz_type_id = $1").bind(biz_type_id).execute(pool).await?;
    Ok(done.rows_affected())
}

/// The key of a timer's occurrence: `<timer key>@<fire time in UTC>`.
pub fn occurrence_key(timer_key: &str, fire: DateTime<Utc>) -> String {
    format!("{timer_key}@{}", fire.format("%Y-%m-%dT%H:%M:%SZ"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timer(cron: &str, materialized_until: DateTime<Utc>, catch_up: bool) -> Timer {
        let at = materialized_until;
        Timer {
            id: Uuid::nil(),
            biz_type_id: 1,
            biz_type: "reports".into(),
            key: "t".into(),
            cron: cron.into(),
            timezone: "UTC".into(),
            payload: RawValue::NULL.to_owned(),
            active: true,
            catch_up,
            materialized_until: Some(at),
            created_at: at,
            updated_at: at,
        }
    }

    /// A pass goes on after the fire times already written (not repeating the one at
    /// `materialized_until`) up to the window's end, which becomes the new mark.
    #[test]
    fn a_plan_continues_where_the_last_pass_ended() {
        let now: DateTime<Utc> = "2026-11-25T10:00:30Z".parse().unwrap();
        let t = timer("0 * * * * *", "2026-11-25T10:05:00Z".parse().unwrap(), false);
        let p = plan(&t, &t.schedule().unwrap(), now, std::time::Duration::from_secs(600));
        assert_eq!(p.until, now + chrono::Duration::seconds(600));
        let fires: Vec<DateTime<Utc>> = p.occurrences.iter().map(|o| o.0).collect();
        let expected: Vec<DateTime<Utc>> = (6..=10).map(|m| format!("2026-11-25T10:{m:02}:00Z").parse().unwrap()).collect();
        assert_eq!(fires, expected);
        assert!(p.occurrences.iter().all(|(fire, run_at)| fire == run_at));
    }

    /// After downtime, with catch-up on, the latest missed fire time runs once, now; the
    /// last minute's is late, not missed.
    #[test]
    fn a_plan_after_downtime_catches_up_once() {
        let now: DateTime<Utc> = "2026-11-25T10:00:30Z".parse().unwrap();
        let t = timer("0 * * * * *", "2026-11-25T09:00:30Z".parse().unwrap(), true);
        let p = plan(&t, &t.schedule().unwrap(), now, std::time::Duration::from_secs(120));
        let missed: DateTime<Utc> = "2026-11-25T09:59:00Z".parse().unwrap();
        let late: DateTime<Utc> = "2026-11-25T10:00:00Z".parse().unwrap();
        assert_eq!(p.occurrences[0], (missed, now));
        assert_eq!(p.occurrences[1], (late, late));
        assert_eq!(p.occurrences.len(), 4, "{:?}", p.occurrences);
    }

    #[test]
    fn a_new_schedule_is_one_line_that_fires_again() {
        assert!(validate_schedule("0 0 3 * * *", "Europe/Berlin").is_ok());
        for cron in ["0\r\n0 3 * * *", "0\t0 3 * * *", "0 0 3 * * *\0", "0 0 0 1 1 ? 1970", "0 0 0 1 1 ? 275760"] {
            assert!(matches!(validate_schedule(cron, "UTC"), Err(Error::Invalid { field, .. }) if field == "cron"), "{cron:?}");
        }
    }
}
