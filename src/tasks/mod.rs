//! The task store: a task is one scheduled callback (docs/design/contract.md: Tasks, API). This module validates
//! what clients ask for and owns every statement that inserts, moves, leases, settles or
//! deletes a row of `tasks`, `tasks_cold`, `task_keys` and `attempts`. Nothing outside it
//! writes those tables; "where is a task row changed?" is answered by this folder.
//!
//! States (`Status`, mirroring the schema's CHECK) and who moves a task between them:
//!
//! ```text
//!            insert                 claim / reserve (lease)
//!   (new) ──────────► pending ─────────────────────────────► running
//!                      ▲  │ cancel                │   │ record: retry at T
//!    requeue: replay,  │  ▼                       │   └──────────► pending
//!    reschedule ──────►│ cancelled                │ record / settle
//!                      │                          ▼
//!                      └──── replay ◄──── succeeded | failed | expired
//! ```
//!
//! `expired` (docs/design/contract.md, Tasks by key): a task with an `expires_at` gets no callback that would start at
//! or after it. The claim and reserve end the tasks they pick past it instead of leasing
//! them, `record` ends one whose next retry or snooze would fall there, lease recovery
//! one whose lease ran out past it, and the leader's sweep (`lease::expire_overdue`) the
//! pending ones nothing picked in time: so `pending` and `running` both lead to it.
//!
//! * `insert` (`create.rs`, `sql/insert.sql`) is the one way a row is made: API creates,
//!   batches and timer occurrences. A key is claimed in `task_keys` in the same statement.
//! * `lease.rs` is the one way out of `pending` and back: the engine's claim and pull's
//!   reserve lease a task (`running`, with a holder and a `lease_until`); `record` settles
//!   it (succeeded, failed, expired, or pending again at a retry or snooze time, the
//!   backoff computed once for callbacks and nacks), with its attempt; lease recovery puts
//!   back what a dead holder left. Only the current holder can settle.
//! * `queries.rs`: reads and lists, and the changes a client or support person asks for,
//!   by id or by key: `cancel` (pending only), and `requeue`, "back to pending at T", shared
//!   by reschedule (pending only), replay (finished only) and bulk replay.
//! * `bulk.rs`: cancel or replay every task matching a filter, in bounded batches.
//! * `replace.rs`: a create whose key is taken and that says `on_conflict: "replace"`
//!   (requeue the pending task, or give the key to a new one) or `"keep"`.
//! * `placement.rs`: where a row lives (below), moving cold rows in, and the keys of
//!   retired partitions. `stats.rs`: counts for `/metrics`, the dashboard and the stats API.
//!   The notification that wakes sleeping engines and reserves is `crate::wake`'s.
//!
//! Where a task lives: due before the hot horizon (`hot_horizon.until`), in the partitioned
//! `tasks`; due later, in `tasks_cold`, until the migrator moves it. Statements that write a
//! task read the horizon in the same statement, so they never disagree with it; a row that
//! lands in cold storage just as the horizon moves past it is picked up by the next sweep.
//! A cold task is pending, or cancelled there; it is never leased (a retry is kept below
//! the horizon), so leases, records and the counts read the partitions alone.

mod batcher;
pub mod bulk;
mod create;
pub mod ids;
pub mod lease;
pub mod load;
mod occurrences;
mod payload;
pub mod placement;
mod queries;
mod replace;
pub mod stats;

pub use batcher::CreateBatcher;
pub use create::{CreateOutcome, CreateTask, NewTask, Rows, create_batch, insert, request_hash};
pub use occurrences::{Occurrences, insert_occurrences};
pub use payload::{check_payload, containment};
pub use queries::{
    ATTEMPTS_SHOWN, AttemptPage, AttemptsFrom, COUNT_CAP, HeldKey, Holding, KeySearch, ListFilter, Page, Reschedule, Target, attempt_total, attempts,
    attempts_before, by_id_prefix, cancel, cancel_archived, cancel_target, count, count_keys, failed_occurrences, find_by_key, get, get_by_key,
    held_flow_keys, holding, ids_with_key, list, others_with_key, read, remove_unfired, replay, reschedule, reschedule_target, search_keys,
    sql as by_id_sql,
};
pub use replace::OnConflict;

use chrono::{DateTime, Datelike, TimeDelta, Utc};
use serde::Serialize;
use uuid::Uuid;

use crate::error::Error;

/// A task's state, mirroring the CHECK on `tasks.status` (see the module's comment for
/// who moves a task from one to the next).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Waiting for its `run_at` (or for a free slot, its rate, a resumed biz type).
    Pending,
    /// Leased: a node is calling back, or a consumer holds a reservation.
    Running,
    Succeeded,
    /// Its attempts are used up, or its receiver answered a permanent error.
    Failed,
    Cancelled,
    /// Not delivered by its `expires_at`: no callback starts after the deadline.
    Expired,
}

impl Status {
    pub const ALL: [Status; 6] = [Status::Pending, Status::Running, Status::Succeeded, Status::Failed, Status::Cancelled, Status::Expired];

    pub const fn as_str(self) -> &'static str {
        match self {
            Status::Pending => "pending",
            Status::Running => "running",
            Status::Succeeded => "succeeded",
            Status::Failed => "failed",
            Status::Cancelled => "cancelled",
            Status::Expired => "expired",
        }
    }

    /// A status as a client names it in a filter.
    pub fn parse(status: &str) -> Result<Status, Error> {
        Status::ALL.into_iter().find(|s| s.as_str() == status).ok_or_else(|| {
            let names: Vec<&str> = Status::ALL.iter().map(|s| s.as_str()).collect();
            Error::invalid("status", format!("must be one of {}", names.join(", ")))
        })
    }

    /// Succeeded, failed, cancelled or expired: may be replayed.
    pub const fn is_finished(self) -> bool {
        matches!(self, Status::Succeeded | Status::Failed | Status::Cancelled | Status::Expired)
    }
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

// Stored as text (the schema's CHECK keeps it to these six), so encoded and decoded as text.
impl sqlx::Type<sqlx::Postgres> for Status {
    fn type_info() -> sqlx::postgres::PgTypeInfo {
        <&str as sqlx::Type<sqlx::Postgres>>::type_info()
    }

    fn compatible(ty: &sqlx::postgres::PgTypeInfo) -> bool {
        <&str as sqlx::Type<sqlx::Postgres>>::compatible(ty)
    }
}

impl<'r> sqlx::Decode<'r, sqlx::Postgres> for Status {
    fn decode(value: sqlx::postgres::PgValueRef<'r>) -> Result<Self, sqlx::error::BoxDynError> {
        let text = <&str as sqlx::Decode<sqlx::Postgres>>::decode(value)?;
        Status::ALL.into_iter().find(|s| s.as_str() == text).ok_or_else(|| format!("unknown task status {text:?}").into())
    }
}

impl sqlx::Encode<'_, sqlx::Postgres> for Status {
    fn encode_by_ref(&self, buf: &mut sqlx::postgres::PgArgumentBuffer) -> Result<sqlx::encode::IsNull, sqlx::error::BoxDynError> {
        <&str as sqlx::Encode<sqlx::Postgres>>::encode_by_ref(&self.as_str(), buf)
    }
}

/// "Retrying": a pending task that has been tried and waits for its next attempt (it has an
/// attempt, or a last error kept from one), as opposed to one not yet tried. Not a status of
/// its own (the row says pending); the one definition, as SQL on a task row `t`, that lists
/// and counts filter with, and `Task::is_retrying` says the same of a task read.
pub const RETRYING_SQL: &str = "(t.status = 'pending' AND (t.attempt_count > 0 OR t.last_error IS NOT NULL))";

impl Task {
    /// See `RETRYING_SQL`.
    pub fn is_retrying(&self) -> bool {
        self.status == Status::Pending && (self.attempt_count > 0 || self.last_error.is_some())
    }
}

/// The range of ids starting with `text`, when it reads as the start of a task id: 8 to 32
/// hexadecimal digits, dashes anywhere ignored. Ids are UUIDv7 (time first), so a prefix is
/// a range of the primary keys' order: (lowest, highest) with the rest all 0 or all f.
pub fn id_prefix(text: &str) -> Option<(Uuid, Uuid)> {
    let hex: String = text.trim().chars().filter(|c| *c != '-').collect();
    if !(8..=32).contains(&hex.len()) || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let low = format!("{hex:0<32}");
    let high = format!("{hex:f<32}");
    Some((Uuid::parse_str(&low).ok()?, Uuid::parse_str(&high).ok()?))
}

/// Longest client key, in bytes.
pub const MAX_KEY_BYTES: usize = 256;
/// How far in the past a `run_at` may be (it then fires at once); older is surely a mistake.
/// The claims' lower bound (`chime_unfinished_floor`, migration 0036) lies an hour below it.
pub const MAX_PAST: TimeDelta = TimeDelta::days(1);
/// How far ahead a task may be scheduled.
pub const MAX_AHEAD: TimeDelta = TimeDelta::days(3660);

#[derive(Debug, Clone, Serialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct Task {
    /// A UUID made by chime at creation (version 7; on a Citus cluster version 8, carrying the biz type); kept through reschedules and replays.
    pub id: Uuid,
    #[serde(skip)]
    pub biz_type_id: i32,
    /// The name of the biz type the task belongs to.
    pub biz_type: String,
    /// The client's key, unique per biz type while the task is retained; a timer's
    /// occurrence has `<timer key>@<fire time>`.
    pub key: Option<String>,
    /// When it is due. A reschedule changes it, a replay sets it to the time of the replay,
    /// a retry to the time of the next try.
    pub run_at: DateTime<Utc>,
    /// As PostgreSQL prints it, passed through to the answer without parsing.
    #[schema(value_type = serde_json::Value)]
    pub payload: Box<serde_json::value::RawValue>,
    pub status: Status,
    /// Attempts since creation or the last replay, the one in progress included.
    pub attempt_count: i32,
    /// The timer whose occurrence this is, if any.
    pub timer_id: Option<Uuid>,
    /// The last failed attempt's error, kept while the task retries; a replay clears it.
    pub last_error: Option<String>,
    pub created_at: DateTime<Utc>,
    /// When the task last changed (a delivery starting included).
    pub updated_at: DateTime<Utc>,
    /// When it succeeded, failed, was cancelled or expired; None while unfinished.
    pub finished_at: Option<DateTime<Utc>>,
    /// No callback starts at or after this time; undelivered then, the task ends `expired`.
    pub expires_at: Option<DateTime<Utc>>,
    /// The W3C trace context of the request that created it; its callbacks carry the same trace.
    pub traceparent: Option<String>,
    /// 0 to 9, 9 the most urgent: the biz type's due tasks are claimed by priority, then
    /// by due time (a tenth of its deliveries go to its longest-due tasks whatever their
    /// priority).
    pub priority: i16,
    /// What it is for inside its biz type (a merchant, a user): the biz type's per-key
    /// limits count tasks by it. null: none.
    #[sqlx(default)]
    pub flow_key: Option<String>,
}

#[derive(Debug, Clone, Serialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct Attempt {
    /// The task's `attempt_count` when it was made (numbers restart after a replay; a
    /// snoozed attempt's number is used again by the next).
    pub number: i32,
    /// When the callback was sent, or the pull reservation made.
    pub started_at: DateTime<Utc>,
    pub duration_ms: i32,
    /// The receiver's HTTP status; None when it did not answer (and for pull).
    pub status_code: Option<i16>,
    /// Why it failed: timeout, connection error, the receiver's status, a nack's reason.
    pub error: Option<String>,
    /// The first 512 bytes of the receiver's answer ("acked" for a pull ack).
    pub response_excerpt: Option<String>,
    /// Where a 307 or 308 sent the callback (null: not redirected).
    pub redirected_to: Option<String>,
    /// The receiver answered 2xx with `Chime-Snooze`: the task was due again at this time,
    /// and this attempt did not count toward `max_attempts` (the next callback has the same
    /// number). Null: not snoozed.
    pub snoozed_until: Option<DateTime<Utc>>,
}

/// When a task should run, as the client said it. A delay is resolved against the
/// database clock, the clock of record.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum When {
    At(DateTime<Utc>),
    After { delay_ms: i64 },
}

impl When {
    /// From the request's `run_at` and `delay_ms` fields; neither means now.
    pub fn parse(run_at: Option<&str>, delay_ms: Option<i64>, now: DateTime<Utc>) -> Result<When, Error> {
        match (run_at, delay_ms) {
            (Some(_), Some(_)) => Err(Error::invalid("run_at", "give run_at or delay_ms, not both")),
            (Some(s), None) => {
                let at = DateTime::parse_from_rfc3339(s)
                    .map_err(|e| Error::invalid("run_at", format!("must be an RFC 3339 time such as 2026-11-21T09:30:00Z ({e})")))?
                    .with_timezone(&Utc);
                if at < now - MAX_PAST {
                    return Err(Error::invalid("run_at", "is more than 24 hours in the past"));
                }
                if at > now + MAX_AHEAD {
                    return Err(Error::invalid("run_at", "is more than 10 years ahead"));
                }
                Ok(When::At(at))
            }
            (None, Some(ms)) => {
                if ms < 0 || ms > MAX_AHEAD.num_milliseconds() {
                    return Err(Error::invalid("delay_ms", format!("must be between 0 and {} (10 years)", MAX_AHEAD.num_milliseconds())));
                }
                Ok(When::After { delay_ms: ms })
            }
            (None, None) => Ok(When::After { delay_ms: 0 }),
        }
    }

    /// The two nullable bind values the SQL resolves with
    /// `coalesce(run_at, now() + delay_ms * interval '1 millisecond')`.
    fn binds(self) -> (Option<DateTime<Utc>>, Option<i64>) {
        match self {
            When::At(at) => (Some(at), None),
            When::After { delay_ms } => (None, Some(delay_ms)),
        }
    }
}

/// A task's deadline as the client said it: a time, or a distance from the due time
/// (resolved by the database, which resolves the due time).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Deadline {
    At(DateTime<Utc>),
    After { ttl_ms: i64 },
}

impl Deadline {
    /// From the request's `expires_at` and `ttl_ms` fields (neither: no deadline), for a
    /// task due `when`. The deadline must come after the due time (a delay is measured on
    /// this server's clock here; the database's may differ by its skew) and at most 10
    /// years after it.
    pub fn parse(expires_at: Option<&str>, ttl_ms: Option<i64>, when: When, now: DateTime<Utc>) -> Result<Option<Deadline>, Error> {
        match (expires_at, ttl_ms) {
            (None, None) => Ok(None),
            (Some(_), Some(_)) => Err(Error::invalid("expires_at", "give expires_at or ttl_ms, not both")),
            (Some(s), None) => {
                let at = DateTime::parse_from_rfc3339(s)
                    .map_err(|e| Error::invalid("expires_at", format!("must be an RFC 3339 time such as 2026-11-21T09:30:00Z ({e})")))?
                    .with_timezone(&Utc);
                let run_at = match when {
                    When::At(at) => at,
                    When::After { delay_ms } => now + TimeDelta::milliseconds(delay_ms),
                };
                if at <= run_at {
                    return Err(Error::invalid("expires_at", format!("must be after the task is due ({})", run_at.to_rfc3339())));
                }
                if at > run_at + MAX_AHEAD {
                    return Err(Error::invalid("expires_at", "is more than 10 years after the task is due"));
                }
                Ok(Some(Deadline::At(at)))
            }
            (None, Some(ms)) => {
                if ms < 1 || ms > MAX_AHEAD.num_milliseconds() {
                    return Err(Error::invalid("ttl_ms", format!("must be between 1 and {} (10 years)", MAX_AHEAD.num_milliseconds())));
                }
                Ok(Some(Deadline::After { ttl_ms: ms }))
            }
        }
    }

    /// The two nullable bind values the SQL resolves with
    /// `coalesce(expires_at, run_at + ttl_ms * interval '1 millisecond')`.
    fn binds(self) -> (Option<DateTime<Utc>>, Option<i64>) {
        match self {
            Deadline::At(at) => (Some(at), None),
            Deadline::After { ttl_ms } => (None, Some(ttl_ms)),
        }
    }
}

/// A W3C `traceparent` header (Trace Context, level 1) worth keeping: version 00 exactly as
/// specified, or a later version's first four fields. Anything else is ignored (None), as
/// the specification asks of a receiver, rather than refused: tracing must not break a create.
pub fn traceparent(header: &str) -> Option<String> {
    let header = header.trim();
    let hex = |s: &str, len: usize| s.len() == len && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    let mut fields = header.split('-');
    let (version, trace_id, parent_id, flags) = (fields.next()?, fields.next()?, fields.next()?, fields.next()?);
    let rest = fields.next();
    let well_formed = hex(version, 2)
        && version != "ff"
        && hex(trace_id, 32)
        && trace_id.bytes().any(|b| b != b'0')
        && hex(parent_id, 16)
        && parent_id.bytes().any(|b| b != b'0')
        && hex(flags, 2)
        && (rest.is_none() || version != "00");
    well_formed.then(|| format!("{version}-{trace_id}-{parent_id}-{flags}"))
}

/// A task's priority unless it is given one.
pub const DEFAULT_PRIORITY: i16 = 5;

/// A priority as a request gives it: 0 to 9.
pub fn validate_priority(priority: i64) -> Result<i16, Error> {
    match i16::try_from(priority) {
        Ok(p @ 0..=9) => Ok(p),
        _ => Err(Error::invalid("priority", format!("must be an integer from 0 to 9 (9 the most urgent; 5 by default), not {priority}"))),
    }
}

/// A flow key as a request gives it: by the rules of `key`.
pub fn validate_flow_key(flow_key: &str) -> Result<(), Error> {
    validate_key(flow_key).map_err(|e| match e {
        Error::Invalid { message, .. } => Error::invalid("flow_key", message),
        e => e,
    })
}

pub fn validate_key(key: &str) -> Result<(), Error> {
    if key.is_empty() || key.len() > MAX_KEY_BYTES {
        return Err(Error::invalid("key", format!("must be 1 to {MAX_KEY_BYTES} bytes")));
    }
    if key.chars().any(char::is_control) {
        return Err(Error::invalid("key", "must not contain control characters"));
    }
    Ok(())
}

/// A time to filter by must be one the API's RFC 3339 can name (years 0000 to 9999, with
/// offsets up to ±23:59); beyond, PostgreSQL (4713 BC on) or chrono fails.
pub fn check_time(field: &str, t: DateTime<Utc>) -> Result<DateTime<Utc>, Error> {
    let offset = TimeDelta::minutes(23 * 60 + 59);
    let latest_local = t.checked_add_signed(offset).map(|l| l.year());
    let earliest_local = t.checked_sub_signed(offset).map(|e| e.year());
    match (latest_local, earliest_local) {
        (Some(latest), Some(earliest)) if latest >= 0 && earliest <= 9999 => Ok(t),
        _ => Err(Error::invalid(field, "must be between the years 0000 and 9999")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> DateTime<Utc> {
        "2026-11-21T12:00:00Z".parse().unwrap()
    }

    #[test]
    fn when_accepts_either_field_or_neither() {
        assert_eq!(When::parse(None, None, now()).unwrap(), When::After { delay_ms: 0 });
        assert_eq!(When::parse(None, Some(1500), now()).unwrap(), When::After { delay_ms: 1500 });
        assert_eq!(When::parse(Some("2026-11-21T13:00:00+01:00"), None, now()).unwrap(), When::At("2026-11-21T12:00:00Z".parse().unwrap()));
    }

    #[test]
    fn when_rejects_bad_times_naming_the_field() {
        let cases: [(Option<&str>, Option<i64>, &str); 6] = [
            (Some("2026-11-21T13:00:00Z"), Some(5), "run_at"),
            (Some("tomorrow"), None, "run_at"),
            (Some("2026-11-21 13:00"), None, "run_at"),
            (Some("2026-11-19T12:00:00Z"), None, "run_at"),
            (Some("2040-01-01T00:00:00Z"), None, "run_at"),
            (None, Some(-1), "delay_ms"),
        ];
        for (run_at, delay, field) in cases {
            match When::parse(run_at, delay, now()) {
                Err(Error::Invalid { field: f, .. }) => assert_eq!(f, field, "{run_at:?} {delay:?}"),
                other => panic!("{run_at:?} {delay:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn filter_times_are_those_rfc_3339_can_name() {
        for ok in ["0000-01-01T00:00:00+23:59", "9999-12-31T23:59:59-23:59", "2026-11-21T12:00:00Z"] {
            let t = DateTime::parse_from_rfc3339(ok).unwrap().with_timezone(&Utc);
            assert!(check_time("from", t).is_ok(), "{ok}");
        }
        for year in [-4714, -200_000, -1, 10_001, 262_142] {
            let t = chrono::NaiveDate::from_ymd_opt(year, 6, 1).unwrap().and_hms_opt(0, 0, 0).unwrap().and_utc();
            assert!(matches!(check_time("from", t), Err(Error::Invalid { field, .. }) if field == "from"), "{year}");
        }
        assert!(check_time("to", DateTime::<Utc>::MIN_UTC).is_err() && check_time("to", DateTime::<Utc>::MAX_UTC).is_err());
    }

    #[test]
    fn deadlines_come_after_the_due_time_and_name_their_field() {
        let at = |s: &str| When::At(s.parse().unwrap());
        let due = at("2026-11-21T13:00:00Z");
        assert_eq!(Deadline::parse(None, None, due, now()).unwrap(), None);
        assert_eq!(
            Deadline::parse(Some("2026-11-21T14:00:00+01:00"), None, at("2026-11-21T12:30:00Z"), now()).unwrap(),
            Some(Deadline::At("2026-11-21T13:00:00Z".parse().unwrap()))
        );
        assert_eq!(Deadline::parse(None, Some(1), due, now()).unwrap(), Some(Deadline::After { ttl_ms: 1 }));
        let delayed = When::After { delay_ms: 3_600_000 };
        let cases: [(Option<&str>, Option<i64>, When, &str); 8] = [
            (Some("2026-11-21T13:00:00Z"), Some(5), due, "expires_at"),
            (Some("tomorrow"), None, due, "expires_at"),
            (Some("2026-11-21T13:00:00Z"), None, due, "expires_at"),
            (Some("2026-11-21T12:59:59Z"), None, due, "expires_at"),
            (Some("2026-11-21T12:30:00Z"), None, delayed, "expires_at"),
            (Some("2040-01-01T00:00:00Z"), None, due, "expires_at"),
            (None, Some(0), due, "ttl_ms"),
            (None, Some(MAX_AHEAD.num_milliseconds() + 1), due, "ttl_ms"),
        ];
        for (expires_at, ttl, when, field) in cases {
            match Deadline::parse(expires_at, ttl, when, now()) {
                Err(Error::Invalid { field: f, .. }) => assert_eq!(f, field, "{expires_at:?} {ttl:?}"),
                other => panic!("{expires_at:?} {ttl:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn a_traceparent_is_kept_when_well_formed_and_ignored_otherwise() {
        let ok = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        assert_eq!(traceparent(ok).as_deref(), Some(ok));
        assert_eq!(traceparent(&format!(" {ok} ")).as_deref(), Some(ok));
        // A later version may carry more fields; its first four are kept.
        assert_eq!(
            traceparent("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-next").as_deref(),
            Some("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
        );
        for bad in [
            "",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
        ] {
            assert_eq!(traceparent(bad), None, "{bad}");
        }
    }

    #[test]
    fn an_id_prefix_is_8_to_32_hex_digits_and_a_range_of_ids() {
        let id: Uuid = "0193a4f2-1c2d-7e3f-8a4b-5c6d7e8f9a0b".parse().unwrap();
        let (low, high) = id_prefix("0193a4f2-1c").unwrap();
        assert!(low <= id && id <= high);
        assert_eq!(low.to_string(), "0193a4f2-1c00-0000-0000-000000000000");
        assert_eq!(high.to_string(), "0193a4f2-1cff-ffff-ffff-ffffffffffff");
        assert_eq!(id_prefix(&id.to_string()), Some((id, id)));
        for not_an_id in ["0193a4f", "order-12", "0193a4f2x", "", &"a".repeat(33)] {
            assert_eq!(id_prefix(not_an_id), None, "{not_an_id}");
        }
    }

    #[test]
    fn keys_are_bounded_and_printable() {
        assert!(validate_key("order-123").is_ok());
        assert!(validate_key("订单-123").is_ok());
        assert!(validate_key("").is_err());
        assert!(validate_key("a\nb").is_err());
        assert!(validate_key(&"k".repeat(257)).is_err());
    }

    mod properties {
        use chrono::FixedOffset;
        use proptest::prelude::*;

        use super::*;

        /// Text shaped like an RFC 3339 time, each part drawn beyond its range: impossible
        /// dates, hour 24, second 60, years 0000 and 9999, offsets up to ±24:59.
        fn rfc3339_like() -> impl Strategy<Value = String> {
            let zone = prop_oneof![Just("Z".to_string()), Just("z".to_string()), "[+-](0[0-9]|1[0-9]|2[0-4]):[0-5][0-9]"];
            let frac = prop::option::of("[0-9]{1,12}");
            ((0u32..=9999, 0u32..=13, 0u32..=32), (0u32..=24, 0u32..=60, 0u32..=60), frac, zone).prop_map(|((y, mo, d), (h, mi, s), frac, zone)| {
                let frac = frac.map(|f| format!(".{f}")).unwrap_or_default();
                format!("{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}{frac}{zone}")
            })
        }

        /// An instant anywhere in chrono's range (or past it, then None), as seconds from
        /// `now()`, mostly near the accepted window's edges.
        fn seconds_from_now() -> impl Strategy<Value = i64> {
            let day: i64 = 86_400;
            prop_oneof![(-2 * day..2 * day), (3659 * day..3661 * day), (-400 * 366 * day..10_000 * 366 * day), any::<i64>(),]
        }

        proptest! {
            #![proptest_config(crate::proptest_config(512))]

            /// Whatever the text, run_at parses to a time inside the window or is refused
            /// by name; it never panics.
            #[test]
            fn any_run_at_text_is_a_time_in_the_window_or_refused(s in prop_oneof![any::<String>(), rfc3339_like()]) {
                match When::parse(Some(&s), None, now()) {
                    Ok(When::At(at)) => prop_assert!(at >= now() - MAX_PAST && at <= now() + MAX_AHEAD, "{s} -> {at}"),
                    Ok(other) => prop_assert!(false, "{s} -> {other:?}"),
                    Err(Error::Invalid { field, .. }) => prop_assert_eq!(field, "run_at"),
                    Err(e) => prop_assert!(false, "{s} -> {e:?}"),
                }
            }

            /// A time in any zone is accepted exactly when it lies from 24 hours ago to 10
            /// years ahead, and means that instant.
            #[test]
            fn run_at_is_accepted_exactly_inside_the_window(secs in seconds_from_now(), offset_minutes in -1439i32..=1439) {
                let Some(at) = TimeDelta::try_seconds(secs).and_then(|d| now().checked_add_signed(d)) else {
                    return Ok(()); // beyond what chrono (and so RFC 3339) can say
                };
                let text = at.with_timezone(&FixedOffset::east_opt(offset_minutes * 60).unwrap()).to_rfc3339();
                let inside = at >= now() - MAX_PAST && at <= now() + MAX_AHEAD;
                match When::parse(Some(&text), None, now()) {
                    Ok(when) => prop_assert!(inside && when == When::At(at), "{text} -> {when:?}"),
                    Err(Error::Invalid { field, .. }) => prop_assert!(!inside && field == "run_at", "{text} refused as {field}"),
                    Err(e) => prop_assert!(false, "{text} -> {e:?}"),
                }
            }

            /// Any delay from 0 to 10 years is accepted as given; any other is refused by name.
            #[test]
            fn delay_is_accepted_exactly_from_zero_to_ten_years(ms in prop_oneof![any::<i64>(), -10i64..10, (MAX_AHEAD.num_milliseconds() - 10)..(MAX_AHEAD.num_milliseconds() + 10)]) {
                let inside = (0..=MAX_AHEAD.num_milliseconds()).contains(&ms);
                match When::parse(None, Some(ms), now()) {
                    Ok(when) => prop_assert!(inside && when == When::After { delay_ms: ms }, "{ms} -> {when:?}"),
                    Err(Error::Invalid { field, .. }) => prop_assert!(!inside && field == "delay_ms", "{ms} refused as {field}"),
                    Err(e) => prop_assert!(false, "{ms} -> {e:?}"),
                }
            }

            /// Giving both time fields is refused, whatever their values.
            #[test]
            fn run_at_and_delay_together_are_refused(s in any::<String>(), ms in any::<i64>()) {
                let refused = matches!(When::parse(Some(&s), Some(ms), now()), Err(Error::Invalid { field, .. }) if field == "run_at");
                prop_assert!(refused, "{s:?} with {ms}");
            }

            /// An accepted key can be stored (no NUL, at most MAX_KEY_BYTES) and shown on one
            /// line; any printable key that fits is accepted.
            #[test]
            fn accepted_keys_are_storable_and_printable_keys_are_accepted(any_key in any::<String>(), printable in "[^\\p{Cc}]{1,64}") {
                if validate_key(&any_key).is_ok() {
                    prop_assert!(!any_key.is_empty() && any_key.len() <= MAX_KEY_BYTES);
                    prop_assert!(!any_key.contains(['\0', '\n', '\r']), "{any_key:?}");
                }
                let printable: String = printable.chars().scan(0, |bytes, c| { *bytes += c.len_utf8(); (*bytes <= MAX_KEY_BYTES).then_some(c) }).collect();
                prop_assert!(validate_key(&printable).is_ok(), "{printable:?}");
            }
        }
    }
}
