//! Tasks: one scheduled callback each (SPEC §1, §3). This module validates what clients
//! ask for and owns every statement that creates, reads or changes a task outside the
//! engine's hot path.
//!
//! Where a task lives: due before the hot horizon (`hot_horizon.until`), in the partitioned
//! `tasks`; due later, in `tasks_cold`, until the migrator moves it. Statements that write a
//! task read the horizon in the same statement, so they never disagree with it; a row that
//! lands in cold storage just as the horizon moves past it is picked up by the next sweep.

mod batcher;
mod create;
mod queries;

pub use batcher::CreateBatcher;
pub use create::{CreateOutcome, CreateTask, NewTask, check_payload, create_batch, request_hash};
pub use queries::{FailedFilter, ListFilter, Page, cancel, count_failed, find_by_key, get, get_by_key, list, replay, replay_failed, reschedule};

use chrono::{DateTime, TimeDelta, Utc};
use serde::Serialize;
use uuid::Uuid;

use crate::error::Error;

pub const STATUSES: [&str; 5] = ["pending", "running", "succeeded", "failed", "cancelled"];

/// Longest client key, in bytes.
pub const MAX_KEY_BYTES: usize = 256;
/// How far in the past a `run_at` may be (it then fires at once); older is surely a mistake.
pub const MAX_PAST: TimeDelta = TimeDelta::days(1);
/// How far ahead a task may be scheduled.
pub const MAX_AHEAD: TimeDelta = TimeDelta::days(3660);

#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct Task {
    pub id: Uuid,
    #[serde(skip)]
    pub biz_type_id: i32,
    pub biz_type: String,
    pub key: Option<String>,
    pub run_at: DateTime<Utc>,
    pub payload: serde_json::Value,
    pub status: String,
    pub attempt_count: i32,
    pub timer_id: Option<Uuid>,
    pub last_error: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
}

#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct Attempt {
    pub number: i32,
    pub started_at: DateTime<Utc>,
    pub duration_ms: i32,
    pub status_code: Option<i16>,
    pub error: Option<String>,
    pub response_excerpt: Option<String>,
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
                    .map_err(|e| {
                        Error::invalid("run_at", format!("must be an RFC 3339 time such as 2026-11-21T09:30:00Z ({e})"))
                    })?
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
                    return Err(Error::invalid(
                        "delay_ms",
                        format!("must be between 0 and {} (10 years)", MAX_AHEAD.num_milliseconds()),
                    ));
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

pub fn validate_key(key: &str) -> Result<(), Error> {
    if key.is_empty() || key.len() > MAX_KEY_BYTES {
        return Err(Error::invalid("key", format!("must be 1 to {MAX_KEY_BYTES} bytes")));
    }
    if key.chars().any(char::is_control) {
        return Err(Error::invalid("key", "must not contain control characters"));
    }
    Ok(())
}

pub fn validate_status(status: &str) -> Result<(), Error> {
    if STATUSES.contains(&status) {
        Ok(())
    } else {
        Err(Error::invalid("status", format!("must be one of {}", STATUSES.join(", "))))
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
        assert_eq!(
            When::parse(Some("2026-11-21T13:00:00+01:00"), None, now()).unwrap(),
            When::At("2026-11-21T12:00:00Z".parse().unwrap())
        );
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
    fn keys_are_bounded_and_printable() {
        assert!(validate_key("order-123").is_ok());
        assert!(validate_key("订单-123").is_ok());
        assert!(validate_key("").is_err());
        assert!(validate_key("a\nb").is_err());
        assert!(validate_key(&"k".repeat(257)).is_err());
    }
}
