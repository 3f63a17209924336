//! A task's history as its page tells it: every attempt numbered across replays (the
//! attempts table numbers them from 1 again after each replay), with a row where each
//! replay happened and who made it, read from the audit log.
//!
//! A single replay (console or API) is audited per task (`task.replay`, target the task's
//! id). A bulk replay is audited once (`task.bulk_replay`, target the biz type's name, or
//! "every biz type" from the console, with its filter): writing a row per task would cost
//! as much as the replay itself at 100,000 tasks; the entry lists the ids of the first 1,000
//! tasks it replayed. So where the attempts show a replay (a number that starts again) that
//! no per-task entry explains, the bulk entry of the task's biz type made in that interval
//! that lists the task names it; past its first 1,000 tasks (or in an entry older than the
//! lists), the one whose key prefix the task's key matches.
//! Both reads are ranges of `audit_log_target_idx` (migration 0019) from the task's
//! creation, at most 200 entries each (a biz type replayed in bulk more often than that
//! in one task's life has its later bulk replays shown as "who is not recorded").

use chrono::{DateTime, TimeDelta, Utc};

use crate::audit::{self, Entry};
use crate::db::Pool;
use crate::tasks::{Attempt, Task};

/// How much later than the first attempt after it a replay's audit entry may be written:
/// the entry is recorded after the replay commits, and a due task can be claimed and
/// attempted in between.
const AUDIT_LAG: TimeDelta = TimeDelta::seconds(5);

/// One row of the history: an attempt, or a replay or release of the task.
pub struct Event {
    /// The attempt's running number over the whole history, from 1 (0 on a mark row).
    pub ordinal: usize,
    pub attempt: Option<Attempt>,
    pub mark: Option<Mark>,
}

/// A replay or release: when, by whom, and how (an action of the audit log).
pub struct Mark {
    /// None: the attempts show a replay that no audit entry explains.
    pub at: Option<DateTime<Utc>>,
    pub actor: String,
    /// "replay", "bulk replay", "release", or "replay" with an unknown actor.
    pub what: &'static str,
}

impl Mark {
    fn of(entry: &Entry) -> Mark {
        let what = match entry.action.as_str() {
            "task.bulk_replay" => "bulk replay",
            "task.release" => "release",
            _ => "replay",
        };
        Mark { at: Some(entry.at), actor: entry.actor.clone(), what }
    }
}

/// The audit entries a task's history reads, oldest first.
pub struct Audited {
    /// `task.replay` and `task.release` of this task.
    pub own: Vec<Entry>,
    /// `task.bulk_replay` of its biz type (or of every biz type).
    pub bulk: Vec<Entry>,
}

impl Audited {
    pub async fn read(pool: &Pool, task: &Task) -> Result<Audited, sqlx::Error> {
        // Only those made after the task was: older ones cannot be its replays.
        let since = task.created_at;
        let own = audit::for_target(pool, "task", &task.id.to_string(), &["task.replay", "task.release"], since).await?;
        let mut bulk = audit::for_target(pool, "task", &task.biz_type, &["task.bulk_replay"], since).await?;
        bulk.extend(audit::for_target(pool, "task", "every biz type", &["task.bulk_replay"], since).await?);
        bulk.sort_by_key(|e| (e.at, e.id));
        Ok(Audited { own, bulk })
    }
}

/// The rows of the history: attempts (oldest first, as `tasks::get` reads them) with the
/// audited replays and releases between them, and a mark where the attempts show a replay
/// that no entry of the task explains.
pub fn events(task: &Task, attempts: Vec<Attempt>, audited: Audited) -> Vec<Event> {
    let Audited { own, bulk } = audited;
    let mut own = own.into_iter().peekable();
    let mut events = Vec::with_capacity(attempts.len() + own.len());
    let mut replayed_since_last = false;
    let mut last: Option<(i32, bool, DateTime<Utc>)> = None;
    for (i, attempt) in attempts.into_iter().enumerate() {
        while let Some(entry) = own.next_if(|e| e.at <= attempt.started_at) {
            replayed_since_last |= entry.action == "task.replay";
            events.push(Event { ordinal: 0, attempt: None, mark: Some(Mark::of(&entry)) });
        }
        if let Some((number, snoozed, started)) = last
            && !replayed_since_last
            && (attempt.number < number || (attempt.number == number && !snoozed))
        {
            // Numbers started again: a replay. Its entry may have been written just after
            // this attempt started (AUDIT_LAG); else a bulk replay in the interval.
            let mark = match own.next_if(|e| e.action == "task.replay" && e.at <= attempt.started_at + AUDIT_LAG) {
                Some(entry) => Mark::of(&entry),
                None => bulk_between(task, &bulk, started, Some(attempt.started_at)),
            };
            events.push(Event { ordinal: 0, attempt: None, mark: Some(mark) });
        }
        last = Some((attempt.number, attempt.snoozed_until.is_some(), attempt.started_at));
        replayed_since_last = false;
        events.push(Event { ordinal: i + 1, attempt: Some(attempt), mark: None });
    }
    for entry in own {
        replayed_since_last |= entry.action == "task.replay";
        events.push(Event { ordinal: 0, attempt: None, mark: Some(Mark::of(&entry)) });
    }
    // Replayed since its last attempt and not attempted again yet.
    if let Some((_, _, started)) = last
        && !replayed_since_last
        && task.attempt_count == 0
    {
        events.push(Event { ordinal: 0, attempt: None, mark: Some(bulk_between(task, &bulk, started, None)) });
    }
    events
}

/// The bulk replay that took `task` between two times (`until` None: up to now), or a
/// mark that says no entry names who replayed it.
fn bulk_between(task: &Task, bulk: &[Entry], since: DateTime<Utc>, until: Option<DateTime<Utc>>) -> Mark {
    let matches = |e: &&Entry| {
        let prefix = e.after.as_ref().and_then(|a| a.get("key_prefix")).and_then(|p| p.as_str());
        e.at > since
            && until.is_none_or(|u| e.at <= u + AUDIT_LAG)
            && lists(e, task).unwrap_or_else(|| prefix.is_none_or(|p| task.key.as_deref().is_some_and(|k| k.starts_with(p))))
    };
    match bulk.iter().find(matches) {
        Some(entry) => Mark::of(entry),
        None => Mark { at: None, actor: String::new(), what: "replay" },
    }
}

/// Whether a bulk entry's list of the tasks it changed has `task`: None when it cannot say
/// (no list, or more changed than it lists).
fn lists(entry: &Entry, task: &Task) -> Option<bool> {
    let after = entry.after.as_ref()?;
    let ids = after.get("task_ids")?.as_array()?;
    let id = task.id.to_string();
    if ids.iter().any(|listed| listed.as_str() == Some(id.as_str())) {
        return Some(true);
    }
    // The console records the count as "changed", the API as "replayed".
    let changed = after.get("changed").or_else(|| after.get("replayed"))?.as_u64()?;
    (changed <= ids.len() as u64).then_some(false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use uuid::Uuid;

    fn at(s: &str) -> DateTime<Utc> {
        s.parse().unwrap()
    }

    fn task(attempt_count: i32) -> Task {
        Task {
            id: Uuid::now_v7(),
            biz_type_id: 1,
            biz_type: "orders".into(),
            key: Some("order-7".into()),
            run_at: at("2026-11-24T12:00:00Z"),
            payload: serde_json::value::RawValue::from_string("{}".into()).unwrap(),
            status: crate::tasks::Status::Succeeded,
            attempt_count,
            timer_id: None,
            last_error: None,
            created_at: at("2026-11-24T10:00:00Z"),
            updated_at: at("2026-11-24T12:00:00Z"),
            finished_at: None,
            expires_at: None,
            traceparent: None,
            priority: 5,
            flow_key: None,
        }
    }

    fn attempt(number: i32, started: &str, snoozed: bool) -> Attempt {
        Attempt {
            number,
            started_at: at(started),
            duration_ms: 1,
            status_code: Some(200),
            error: None,
            response_excerpt: None,
            redirected_to: None,
            snoozed_until: snoozed.then(|| at("2026-11-24T11:30:00Z")),
        }
    }

    fn entry(action: &str, at_: &str, target: &str, after: Option<serde_json::Value>) -> Entry {
        Entry {
            id: 1,
            at: at(at_),
            actor: "user:admin".into(),
            action: action.into(),
            target_type: "task".into(),
            target: target.into(),
            before: None,
            after,
        }
    }

    fn rows(events: &[Event]) -> Vec<String> {
        events
            .iter()
            .map(|e| match (&e.attempt, &e.mark) {
                (Some(a), _) => format!("#{} try {}", e.ordinal, a.number),
                (None, Some(m)) => format!("{} by {:?}", m.what, m.actor),
                _ => unreachable!(),
            })
            .collect()
    }

    /// A snoozed attempt's number is used again by the next (not a replay); a number that
    /// starts again is one, named by the bulk replay of the interval whose key prefix the
    /// task's key has, or said to be unknown; an entry written just after the attempt it
    /// led to started still stands before it.
    #[test]
    fn replays_are_found_between_attempts() {
        let t = task(1);
        let attempts = vec![
            attempt(1, "2026-11-24T11:00:00Z", true),
            attempt(1, "2026-11-24T11:30:00Z", false),
            attempt(1, "2026-11-24T11:40:00Z", false),
            attempt(1, "2026-11-24T11:50:00Z", false),
            attempt(1, "2026-11-24T11:55:00Z", false),
        ];
        let own = vec![entry("task.replay", "2026-11-24T11:50:02Z", &t.id.to_string(), None)];
        let bulk = vec![
            entry("task.bulk_replay", "2026-11-24T11:35:00Z", "orders", Some(serde_json::json!({"key_prefix": "invoice-"}))),
            entry("task.bulk_replay", "2026-11-24T11:36:00Z", "orders", Some(serde_json::json!({"key_prefix": "order-"}))),
        ];
        let events = events(&t, attempts, Audited { own, bulk });
        assert_eq!(
            rows(&events),
            [
                "#1 try 1",
                "#2 try 1",
                "bulk replay by \"user:admin\"",
                "#3 try 1",
                "replay by \"user:admin\"",
                "#4 try 1",
                "replay by \"\"",
                "#5 try 1",
            ]
        );
    }

    /// A bulk entry that lists the tasks it replayed names the task's replay only if it lists
    /// it; one listing fewer than it replayed falls back to its key prefix.
    #[test]
    fn a_bulk_replay_listing_its_tasks_names_only_those() {
        let t = task(1);
        let attempts = vec![attempt(1, "2026-11-24T11:00:00Z", false), attempt(1, "2026-11-24T11:30:00Z", false)];
        let other = Uuid::now_v7().to_string();
        let by = |actor: &str, mut e: Entry| {
            e.actor = actor.into();
            e
        };
        let replayed = |at_: &str, ids: Vec<String>, changed: u64| {
            let after = serde_json::json!({"key_prefix": null, "task_ids": ids, "changed": changed});
            entry("task.bulk_replay", at_, "orders", Some(after))
        };
        let bulk = vec![
            by("user:ann", replayed("2026-11-24T11:10:00Z", vec![other.clone()], 1)),
            by("user:bob", replayed("2026-11-24T11:11:00Z", vec![t.id.to_string()], 1)),
        ];
        assert_eq!(rows(&events(&t, attempts.clone(), Audited { own: vec![], bulk })), ["#1 try 1", "bulk replay by \"user:bob\"", "#2 try 1"]);

        let bulk = vec![by("user:ann", replayed("2026-11-24T11:10:00Z", vec![other.clone()], 1))];
        assert_eq!(
            rows(&events(&t, attempts.clone(), Audited { own: vec![], bulk })),
            ["#1 try 1", "replay by \"\"", "#2 try 1"],
            "an entry that does not list it"
        );

        let bulk = vec![by("user:ann", replayed("2026-11-24T11:10:00Z", vec![other], 1_001))];
        assert_eq!(
            rows(&events(&t, attempts, Audited { own: vec![], bulk })),
            ["#1 try 1", "bulk replay by \"user:ann\"", "#2 try 1"],
            "its list is cut short"
        );
    }

    /// Replayed after its last attempt and not attempted since: the mark closes the list.
    #[test]
    fn a_replay_not_attempted_yet_is_shown_last() {
        let t = task(0);
        let attempts = vec![attempt(1, "2026-11-24T11:00:00Z", false)];
        let bulk = vec![entry("task.bulk_replay", "2026-11-24T11:10:00Z", "orders", Some(serde_json::json!({"key_prefix": null})))];
        let events = events(&t, attempts, Audited { own: vec![], bulk });
        assert_eq!(rows(&events), ["#1 try 1", "bulk replay by \"user:admin\""]);
    }
}
