//! A task's history as its page tells it: every attempt numbered across replays (the
//! attempts table numbers them from 1 again after each replay), with a row where each
//! audited change of the task was made (replay, release, cancel, reschedule, alone or in a
//! bulk operation) and who made it.
//!
//! Each such change writes, in its own transaction, an entry of the audit log and an event
//! of the task that refers to it (`task_events`, migration 0044): a bulk operation one entry
//! for all its tasks. So the history reads the task's events by its id, each with the time
//! the change was made to the task, which is before any attempt it led to (the attempt
//! could only start once the change committed). Where the attempts show a replay (a number
//! that starts again) that no event explains (one made before events were recorded), a row
//! says who is not recorded.

use chrono::{DateTime, Utc};

use crate::audit::{self, Entry};
use crate::tasks::{Attempt, Task};

/// One row of the history: an attempt, or an audited change of the task.
pub struct Event {
    /// The attempt's running number over the whole history, from 1 (0 on a mark row).
    pub ordinal: usize,
    pub attempt: Option<Attempt>,
    pub mark: Option<Mark>,
}

/// An audited change of the task: when, by whom, and how (an action of the audit log).
pub struct Mark {
    /// None: the attempts show a replay that no audit entry explains.
    pub at: Option<DateTime<Utc>>,
    pub actor: String,
    /// "replay", "bulk replay", "release", "cancel", "bulk cancel", "reschedule", or
    /// "replay" with an unknown actor.
    pub what: &'static str,
    /// The audit entry: of a bulk operation, the one for all its tasks.
    pub entry: Option<i64>,
}

impl Mark {
    fn of(entry: &Entry) -> Mark {
        let what = match entry.action.as_str() {
            "task.bulk_replay" => "bulk replay",
            "task.release" => "release",
            "task.cancel" => "cancel",
            "task.bulk_cancel" => "bulk cancel",
            "task.reschedule" => "reschedule",
            _ => "replay",
        };
        Mark { at: Some(entry.at), actor: entry.actor.clone(), what, entry: Some(entry.id) }
    }

    /// Whether the attempts start numbering again after it.
    fn restarts(&self) -> bool {
        matches!(self.what, "replay" | "bulk replay")
    }

    /// What the page says happened.
    pub fn label(&self) -> &'static str {
        match self.what {
            "release" => "Released",
            "bulk replay" => "Replayed in a bulk replay",
            "cancel" => "Cancelled",
            "bulk cancel" => "Cancelled in a bulk cancel",
            "reschedule" => "Rescheduled",
            _ => "Replayed",
        }
    }

    /// The row's class: a replay's rows look alike, the others are their own.
    pub fn class(&self) -> &'static str {
        match self.what {
            "release" => "release",
            "cancel" | "bulk cancel" => "cancel",
            "reschedule" => "reschedule",
            _ => "replay",
        }
    }

    /// The audit log's page that starts with this entry (a bulk operation's filter and counts).
    pub fn entry_link(&self) -> Option<String> {
        self.entry.filter(|_| self.what.starts_with("bulk")).map(|id| format!("/console/audit?before={}", id + 1))
    }
}

/// The task's events (`audit::of_task`), oldest first.
pub struct Audited(pub Vec<Entry>);

impl Audited {
    /// The events of `task` made within `[since, until]` (None: no bound), at most
    /// `audit::TASK_EVENTS`.
    pub async fn read<'e>(
        db: impl sqlx::PgExecutor<'e>,
        task: &Task,
        since: Option<DateTime<Utc>>,
        until: Option<DateTime<Utc>>,
    ) -> Result<Audited, sqlx::Error> {
        audit::of_task(db, task.id, since, until).await.map(Audited)
    }
}

/// The rows of the history: attempts (oldest first, as `tasks::get` reads them) with the
/// task's events between them, and a mark where the attempts show a replay that no event
/// explains.
pub fn events(task: &Task, attempts: Vec<Attempt>, audited: Audited) -> Vec<Event> {
    let mut own = audited.0.into_iter().peekable();
    let mut events = Vec::with_capacity(attempts.len() + own.len());
    let mut replayed_since_last = false;
    let mut last: Option<(i32, bool)> = None;
    let unknown = || Event { ordinal: 0, attempt: None, mark: Some(Mark { at: None, actor: String::new(), what: "replay", entry: None }) };
    for (i, attempt) in attempts.into_iter().enumerate() {
        while let Some(entry) = own.next_if(|e| e.at <= attempt.started_at) {
            let mark = Mark::of(&entry);
            replayed_since_last |= mark.restarts();
            events.push(Event { ordinal: 0, attempt: None, mark: Some(mark) });
        }
        if let Some((number, snoozed)) = last
            && !replayed_since_last
            && (attempt.number < number || (attempt.number == number && !snoozed))
        {
            // Numbers started again: a replay no event records.
            events.push(unknown());
        }
        last = Some((attempt.number, attempt.snoozed_until.is_some()));
        replayed_since_last = false;
        events.push(Event { ordinal: i + 1, attempt: Some(attempt), mark: None });
    }
    for entry in own {
        let mark = Mark::of(&entry);
        replayed_since_last |= mark.restarts();
        events.push(Event { ordinal: 0, attempt: None, mark: Some(mark) });
    }
    // Replayed since its last attempt and not attempted again yet.
    if last.is_some() && !replayed_since_last && task.attempt_count == 0 {
        events.push(unknown());
    }
    events
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

    /// A snoozed attempt's number is used again by the next (not a replay); an event stands
    /// before the attempts made after it, whatever it was (a bulk replay, a reschedule, a
    /// replay); a number that starts again with no event before it is a replay said to be
    /// unknown.
    #[test]
    fn events_stand_between_attempts_and_an_unrecorded_replay_is_said_so() {
        let t = task(1);
        let attempts = vec![
            attempt(1, "2026-11-24T11:00:00Z", true),
            attempt(1, "2026-11-24T11:30:00Z", false),
            attempt(1, "2026-11-24T11:40:00Z", false),
            attempt(1, "2026-11-24T11:50:00Z", false),
            attempt(1, "2026-11-24T11:55:00Z", false),
        ];
        let events = events(
            &t,
            attempts,
            Audited(vec![
                entry("task.bulk_replay", "2026-11-24T11:35:00Z", "orders", None),
                entry("task.reschedule", "2026-11-24T11:36:00Z", &t.id.to_string(), None),
                entry("task.replay", "2026-11-24T11:49:59Z", &t.id.to_string(), None),
            ]),
        );
        assert_eq!(
            rows(&events),
            [
                "#1 try 1",
                "#2 try 1",
                "bulk replay by \"user:admin\"",
                "reschedule by \"user:admin\"",
                "#3 try 1",
                "replay by \"user:admin\"",
                "#4 try 1",
                "replay by \"\"",
                "#5 try 1",
            ]
        );
        let bulk = events[2].mark.as_ref().unwrap();
        assert_eq!((bulk.label(), bulk.entry_link().as_deref()), ("Replayed in a bulk replay", Some("/console/audit?before=2")));
        assert_eq!(events[3].mark.as_ref().unwrap().entry_link(), None, "a task's own entry is not linked");
    }

    /// Replayed after its last attempt and not attempted since: the mark closes the list; with
    /// no event, it says who is not recorded.
    #[test]
    fn a_replay_not_attempted_yet_is_shown_last() {
        let t = task(0);
        let attempts = vec![attempt(1, "2026-11-24T11:00:00Z", false)];
        let audited = Audited(vec![entry("task.bulk_replay", "2026-11-24T11:10:00Z", "orders", None)]);
        assert_eq!(rows(&events(&t, attempts.clone(), audited)), ["#1 try 1", "bulk replay by \"user:admin\""]);
        assert_eq!(rows(&events(&t, attempts, Audited(vec![]))), ["#1 try 1", "replay by \"\""]);
    }

    /// A cancel (alone or in bulk) is shown where it was made, and starts no numbering.
    #[test]
    fn cancels_are_shown_and_are_not_replays() {
        let t = task(1);
        let attempts = vec![attempt(1, "2026-11-24T11:00:00Z", true), attempt(1, "2026-11-24T11:30:00Z", false)];
        let audited = Audited(vec![entry("task.bulk_cancel", "2026-11-24T11:40:00Z", "orders", None)]);
        let events = events(&t, attempts, audited);
        assert_eq!(rows(&events), ["#1 try 1", "#2 try 1", "bulk cancel by \"user:admin\""]);
        assert_eq!(events[2].mark.as_ref().unwrap().label(), "Cancelled in a bulk cancel");
    }
}
