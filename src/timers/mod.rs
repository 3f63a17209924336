//! Timers: periodic schedules owned by a biz type; each occurrence becomes a task
//! (SPEC §3, §7).
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

mod schedule;

pub use schedule::Schedule;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use serde_json::value::RawValue;
use sha2::{Digest, Sha256};
use sqlx::{Postgres, Transaction};
use crate::db::Pool;
use uuid::Uuid;

use crate::error::Error;
use crate::tasks::{MAX_KEY_BYTES, check_payload, validate_key};

/// Room an occurrence key needs after the timer key: `@2026-11-22T09:30:00Z`.
const OCCURRENCE_SUFFIX_BYTES: usize = 21;
/// Most occurrences written for one timer in one transaction; the rest follow next tick.
const MAX_PER_PASS: usize = 10_000;
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

pub async fn create(pool: &Pool, biz_type_id: i32, request: CreateTimer) -> Result<Timer, Error> {
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
    .fetch_optional(pool)
    .await?;
    timer.ok_or_else(|| Error::key_conflict(format!("a timer with key `{}` already exists in this biz type", request.key)))
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

/// Applies `changes` to a timer of biz type `owner`; returns the timer before and after.
pub async fn update(pool: &Pool, owner: i32, id: Uuid, changes: TimerChanges, max_payload_bytes: usize) -> Result<(Timer, Timer), Error> {
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
    tx.commit().await?;
    Ok((before, after))
}

/// Whether two payloads are the same JSON, whatever their spacing and key order. Numbers
/// compare as written: `1e2` is not `100`.
fn same_json(a: &RawValue, b: &RawValue) -> bool {
    serde_json::from_str::<Value>(a.get()).ok() == serde_json::from_str::<Value>(b.get()).ok()
}

/// Deletes a timer of biz type `owner` and its occurrences that have not fired.
pub async fn delete(pool: &Pool, owner: i32, id: Uuid) -> Result<Timer, Error> {
    let mut tx = pool.begin().await?;
    let timer = lock(&mut tx, owner, id).await?;
    crate::tasks::remove_unfired(&mut tx, timer.id, timer.biz_type_id).await?;
    crate::db::query("DELETE FROM timers WHERE id = $1").bind(id).execute(&mut *tx).await?;
    tx.commit().await?;
    Ok(timer)
}

/// Writes occurrences for the active timers whose window is at least half used up (an
/// archived biz type's timers write none).
/// Returns how many occurrences were written.
pub async fn materialize_due(pool: &Pool, window: std::time::Duration) -> Result<u64, Error> {
    let window_ms = window.as_millis() as i64;
    let due: Vec<Uuid> = crate::db::query_scalar(
        "SELECT id FROM timers
          WHERE active AND (materialized_until < now() + $1 * interval '1 millisecond' OR materialized_until IS NULL)
            AND biz_type_id NOT IN (SELECT id FROM biz_types WHERE archived_at IS NOT NULL)
          ORDER BY materialized_until NULLS FIRST LIMIT 100",
    )
    .bind(window_ms / 2)
    .fetch_all(pool)
    .await?;
    let mut written = 0;
    for id in due {
        written += materialize(pool, id, window).await?;
    }
    Ok(written)
}

/// Writes a timer's occurrences up to `window` ahead of the database clock, in one
/// transaction with its new `materialized_until`. Returns how many were written.
pub async fn materialize(pool: &Pool, id: Uuid, window: std::time::Duration) -> Result<u64, Error> {
    let mut tx = pool.begin().await?;
    #[derive(sqlx::FromRow)]
    struct Row {
        #[sqlx(flatten)]
        timer: Timer,
        now: DateTime<Utc>,
    }
    let Some(Row { timer, now }) =
        crate::db::query_as(
            "SELECT t.*, b.name AS biz_type, now() AS now FROM timers t JOIN biz_types b ON b.id = t.biz_type_id
              WHERE t.id = $1 AND t.active AND b.archived_at IS NULL FOR UPDATE OF t",
        )
            .bind(id)
            .fetch_optional(&mut *tx)
            .await?
    else {
        return Ok(0);
    };
    let schedule = match timer.schedule() {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(timer = %id, error = %e, "timer's schedule no longer parses; skipping it");
            return Ok(0);
        }
    };
    let until = now + chrono::Duration::from_std(window).expect("window fits");
    let from = timer.materialized_until.unwrap_or(now);
    // Fire times at most LATE_GRACE past are late, not missed: a timer created or changed
    // since the leader's last pass, or a leader just taking over. They are written as usual
    // and fire at once. Older ones were missed while no node ran.
    let late_from = from.max(now - LATE_GRACE);
    // (fire time, run_at): an occurrence runs at its fire time, a catch-up one now.
    let mut occurrences: Vec<(DateTime<Utc>, DateTime<Utc>)> = Vec::new();
    if from < late_from {
        let last_missed = schedule.last_between(from, late_from);
        match (last_missed, timer.catch_up) {
            (Some(missed), true) => {
                tracing::info!(timer = %id, key = %timer.key, %missed, "timer missed occurrences while no node ran; firing one catch-up occurrence");
                occurrences.push((missed, now));
            }
            (Some(missed), false) => {
                tracing::info!(timer = %id, key = %timer.key, since = %from, last = %missed, "timer missed occurrences while no node ran; skipping them (catch_up is off)");
            }
            (None, _) => {}
        }
    }
    occurrences.extend(schedule.between(late_from, until, MAX_PER_PASS).into_iter().map(|t| (t, t)));
    // When cut short, the next pass resumes after the last occurrence written.
    let materialized_until = if occurrences.len() >= MAX_PER_PASS { occurrences.last().map_or(until, |o| o.0) } else { until };

    let hash = Sha256::digest(format!("timer {id}")).to_vec();
    let mut rows = crate::tasks::Rows::default();
    for (fire, run_at) in &occurrences {
        let key = occurrence_key(&timer.key, *fire);
        rows.push(Uuid::now_v7(), Some(key), crate::tasks::When::At(*run_at), timer.payload.get(), hash.clone());
    }
    let written = crate::tasks::insert(&mut *tx, timer.biz_type_id, Some(id), &rows).await?.len();
    if written < occurrences.len() {
        tracing::warn!(timer = %id, key = %timer.key, skipped = occurrences.len() - written,
            "some occurrence keys were already taken (by a task created with the same key); those occurrences are skipped");
    }
    crate::db::query("UPDATE timers SET materialized_until = $2 WHERE id = $1")
        .bind(id)
        .bind(materialized_until)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(written as u64)
}

/// The key of a timer's occurrence: `<timer key>@<fire time in UTC>`.
pub fn occurrence_key(timer_key: &str, fire: DateTime<Utc>) -> String {
    format!("{timer_key}@{}", fire.format("%Y-%m-%dT%H:%M:%SZ"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_schedule_is_one_line_that_fires_again() {
        assert!(validate_schedule("0 0 3 * * *", "Europe/Berlin").is_ok());
        for cron in ["0\r\n0 3 * * *", "0\t0 3 * * *", "0 0 3 * * *\0", "0 0 0 1 1 ? 1970", "0 0 0 1 1 ? 275760"] {
            assert!(matches!(validate_schedule(cron, "UTC"), Err(Error::Invalid { field, .. }) if field == "cron"), "{cron:?}");
        }
    }
}
