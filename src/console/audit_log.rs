//! The audit log: who changed which setting, who replayed or cancelled what, each entry
//! summarised in words; and a page per entry, which for a bulk operation follows its tasks
//! until every one is settled.

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use askama::Template;
use chrono::{DateTime, NaiveDate, Utc};
use serde::Deserialize;

use super::{ConsoleError, Ctx, Session, grouped, parse_local_time, render};
use crate::audit::{self, Entry};
use crate::error::Error;
use crate::state::AppState;
use crate::tasks::bulk::{self, Progress, Recorded};
use crate::tasks::{self, Task};

const PAGE_SIZE: i64 = 100;

/// The most tasks of one key the search by key looks for entries of (the key's current
/// task and those before it).
const KEY_TASKS: i64 = 100;

/// The tasks an operation's page lists.
const TASKS_SHOWN: i64 = 50;

/// How often an operation's page refreshes itself while its tasks are being delivered.
const FOLLOW_SECONDS: u32 = 2;

#[derive(Debug, Default, Deserialize)]
pub struct Filter {
    #[serde(default)]
    pub actor: String,
    #[serde(default)]
    pub action: String,
    /// As the page shows it ("biz_type invoices") or a name or id alone.
    #[serde(default)]
    pub target: String,
    /// A task's key: the entries of the tasks that held it, in any biz type.
    #[serde(default)]
    pub key: String,
    /// A day (the whole day, UTC) or a time; entries from then.
    #[serde(default)]
    pub from: String,
    /// A day (the whole day, UTC, included) or a time; entries before then.
    #[serde(default)]
    pub to: String,
    /// Entries older than this id (the next page), as typed.
    #[serde(default)]
    pub before: String,
}

/// The filter as read: the bounds, and the next page's position.
#[derive(Debug, Default, PartialEq)]
struct Bounds {
    from: Option<DateTime<Utc>>,
    to: Option<DateTime<Utc>>,
    before: Option<i64>,
}

/// A day ("2026-11-27", as a date input sends it) from its start, or a time as the task
/// filters take one; `end`: a day to its end, so that "to 2026-11-27" includes that day.
fn parse_day_or_time(field: &str, raw: &str, end: bool) -> Result<Option<DateTime<Utc>>, Error> {
    match NaiveDate::parse_from_str(raw.trim(), "%Y-%m-%d") {
        Ok(day) => {
            let day = if end { day.succ_opt().ok_or_else(|| Error::invalid(field, "is past the last day there is"))? } else { day };
            Ok(Some(day.and_hms_opt(0, 0, 0).expect("midnight").and_utc()))
        }
        Err(_) => parse_local_time(field, raw),
    }
}

impl Filter {
    /// The bounds; the texts searched for, which PostgreSQL must be able to hold.
    fn check(&self) -> Result<Bounds, Error> {
        for (field, text) in [("actor", &self.actor), ("action", &self.action), ("target", &self.target), ("key", &self.key)] {
            if text.contains(char::is_control) {
                return Err(Error::invalid(field, "must not contain control characters"));
            }
        }
        if !self.key.trim().is_empty() {
            tasks::validate_key(self.key.trim())?;
        }
        let from = parse_day_or_time("from", &self.from, false)?;
        let to = parse_day_or_time("to", &self.to, true)?;
        if let (Some(from), Some(to)) = (from, to)
            && from >= to
        {
            return Err(Error::invalid("to", "must be after from"));
        }
        let before = match self.before.trim() {
            "" => None,
            raw => Some(raw.parse().map_err(|_| Error::invalid("before", "is not a page link from this log"))?),
        };
        Ok(Bounds { from, to, before })
    }

    /// The next page's address: this filter, entries older than `before`.
    fn next(&self, before: i64) -> String {
        let query = url::form_urlencoded::Serializer::new(String::new())
            .append_pair("actor", &self.actor)
            .append_pair("action", &self.action)
            .append_pair("target", &self.target)
            .append_pair("key", &self.key)
            .append_pair("from", &self.from)
            .append_pair("to", &self.to)
            .append_pair("before", &before.to_string())
            .finish();
        format!("/console/audit?{query}")
    }
}

#[derive(Template)]
#[template(path = "audit.html")]
struct Page {
    ctx: Ctx,
    filter: Filter,
    entries: Vec<Entry>,
    next: Option<String>,
    /// The field a refused filter is refused for, and why.
    error: Option<(String, String)>,
}

impl Page {
    /// How long ago, in words: beside the time, on a line of its own.
    fn ago(&self, at: &DateTime<Utc>) -> String {
        super::when::relative(*at - self.ctx.now)
    }
}

pub async fn list(req: HttpRequest, session: Session, state: web::Data<AppState>, filter: web::Query<Filter>) -> Result<HttpResponse, ConsoleError> {
    let filter = filter.into_inner();
    let bounds = match filter.check() {
        Ok(bounds) => bounds,
        Err(Error::Invalid { field, message }) => {
            let page = Page { ctx: Ctx::new(&session, &req, "audit"), filter, entries: vec![], next: None, error: Some((field, message)) };
            return render(StatusCode::UNPROCESSABLE_ENTITY, &page.ctx, &page);
        }
        Err(e) => return Err(e.into()),
    };
    let key = filter.key.trim();
    let key_tasks = if key.is_empty() { None } else { Some(tasks::ids_with_key(&state.pool, key, KEY_TASKS).await?) };
    let search = audit::Search {
        actor: &filter.actor,
        action: &filter.action,
        target: &filter.target,
        from: bounds.from,
        to: bounds.to,
        tasks: key_tasks.as_deref(),
        before: bounds.before,
    };
    let entries = audit::list(&state.pool, &search, PAGE_SIZE).await?;
    let next = (entries.len() as i64 == PAGE_SIZE).then(|| filter.next(entries.last().map(|e| e.id).unwrap_or_default()));
    let page = Page { ctx: Ctx::new(&session, &req, "audit"), filter, entries, next, error: None };
    render(StatusCode::OK, &page.ctx, &page)
}

#[derive(Template)]
#[template(path = "audit_entry.html")]
struct EntryPage {
    ctx: Ctx,
    entry: Entry,
    /// The bulk operation it records, with where its tasks are now and some of them.
    operation: Option<Followed>,
    /// What it recorded, laid out (not for a bulk operation, whose entry may list 1,000
    /// task ids from before `task_events`).
    recorded: Vec<(&'static str, String)>,
}

/// A bulk operation as its page follows it.
struct Followed {
    recorded: Recorded,
    progress: Progress,
    /// Some of its tasks, by key.
    tasks: Vec<Task>,
    /// Every task it changed is settled (a cancel's are, once it is done): nothing more to
    /// follow, and the page stops refreshing.
    done: bool,
    follow_seconds: u32,
}

impl Followed {
    /// Where its tasks are, in a line: "3 delivered, 1 failed, 1 still pending".
    fn headline(&self) -> String {
        let p = &self.progress;
        if self.recorded.replay {
            format!("{} delivered, {} failed, {} still pending", grouped(p.succeeded), grouped(p.failed + p.expired), grouped(p.unsettled()))
        } else {
            format!("{} cancelled, {} since replayed or rescheduled", grouped(p.cancelled), grouped(p.counted - p.cancelled - p.gone()))
        }
    }

    /// Each state its tasks are in, with how many (those with none left out).
    fn states(&self) -> Vec<(&'static str, &'static str, String)> {
        let p = &self.progress;
        [
            ("Delivered", "succeeded", p.succeeded),
            ("Failed", "failed", p.failed),
            ("Expired", "expired", p.expired),
            ("Retrying", "retrying", p.retrying),
            ("Waiting for their first attempt", "pending", p.waiting),
            ("Being delivered", "running", p.running),
            ("Cancelled", "cancelled", p.cancelled),
            ("No longer stored (past retention)", "gone", p.gone()),
        ]
        .into_iter()
        .filter(|(_, _, n)| *n > 0)
        .map(|(label, class, n)| (label, class, grouped(n)))
        .collect()
    }

    /// Whether more tasks were changed than the progress counts (`bulk::PROGRESS_CAP`).
    fn capped(&self) -> bool {
        self.progress.counted >= bulk::PROGRESS_CAP
    }

    fn cap(&self) -> String {
        grouped(bulk::PROGRESS_CAP)
    }

    /// How many tasks it changed, as its entry recorded (None: under way or cut short).
    fn changed(&self) -> Option<String> {
        self.recorded.changed.map(grouped)
    }
}

/// What the log says `entry` did, a line each: a bulk operation by its outcome and filter
/// (its page has the rest), any other entry as `audit::Entry::summary` reads it.
pub fn summary(entry: &Entry) -> Vec<String> {
    match crate::tasks::bulk::Recorded::of(entry) {
        Some(operation) => vec![operation.outcome(), format!("Filter: {}.", operation.scope())],
        None => entry.summary(),
    }
}

impl Page {
    fn summary(&self, entry: &Entry) -> Vec<String> {
        summary(entry)
    }
}

impl EntryPage {
    fn summary(&self) -> Vec<String> {
        summary(&self.entry)
    }

    fn title(&self) -> String {
        match &self.operation {
            Some(op) if op.recorded.replay => format!("Bulk replay {}", self.entry.id),
            Some(_) => format!("Bulk cancel {}", self.entry.id),
            None => format!("Audit entry {}", self.entry.id),
        }
    }
}

/// One entry of the log; for a bulk operation, where its tasks are now.
pub async fn show(req: HttpRequest, session: Session, state: web::Data<AppState>, id: web::Path<String>) -> Result<HttpResponse, ConsoleError> {
    let not_found = || ConsoleError::NotFound(format!("no audit entry {id}"));
    let id: i64 = id.parse().map_err(|_| not_found())?;
    let entry = audit::get(&state.pool, id).await?.ok_or_else(not_found)?;
    let operation = match Recorded::of(&entry) {
        Some(recorded) => {
            let progress = bulk::progress(&state.pool, entry.id).await?;
            let tasks = bulk::touched(&state.pool, entry.id, TASKS_SHOWN).await?;
            let done = recorded.changed.is_some() && (!recorded.replay || progress.unsettled() == 0);
            Some(Followed { recorded, progress, tasks, done, follow_seconds: FOLLOW_SECONDS })
        }
        None => None,
    };
    let pretty = |v: &Option<serde_json::Value>| v.as_ref().map(|v| serde_json::to_string_pretty(v).unwrap_or_default());
    let recorded = if operation.is_some() {
        vec![]
    } else {
        [("Before", pretty(&entry.before)), ("After", pretty(&entry.after))].into_iter().filter_map(|(name, v)| v.map(|v| (name, v))).collect()
    };
    let page = EntryPage { ctx: Ctx::new(&session, &req, "audit"), entry, operation, recorded };
    render(StatusCode::OK, &page.ctx, &page)
}

/// How long sending `count` tasks takes at `rate_limit` a second, in words ("about 19 s",
/// "about 1 h 24 min"), rounded up.
pub fn send_time(count: i64, rate_limit: f64) -> String {
    let seconds = (count as f64 / rate_limit).ceil().max(1.0) as i64;
    let minutes = (seconds + 59) / 60;
    match seconds {
        s if s < 60 => format!("about {s} s"),
        _ if minutes < 60 => format!("about {minutes} min"),
        _ => format!("about {} h {} min", minutes / 60, minutes % 60),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A bulk operation reads as its outcome and whole filter, never its task ids; under
    /// way, as such.
    #[test]
    fn a_bulk_operation_reads_as_its_outcome_and_filter() {
        let entry = |action: &str, after: serde_json::Value| Entry {
            id: 7,
            at: "2026-11-27T12:00:00Z".parse().unwrap(),
            actor: "user:admin".into(),
            action: action.into(),
            target_type: "x".into(),
            target: "y".into(),
            before: None,
            after: Some(after),
        };
        let ids: Vec<String> = (0..1000).map(|i| format!("0193{i:028}")).collect();
        let bulk = entry(
            "task.bulk_replay",
            serde_json::json!({"biz_type": "invoices", "status": "failed", "key_prefix": "inv-", "run_at_from": "2026-11-27T10:00:00Z",
                        "run_at_to": null, "timer_id": null, "matched": 92, "changed": 91, "ids": ids}),
        );
        assert_eq!(
            summary(&bulk),
            [
                "Replayed 91 of 92 matching failed tasks.",
                "Filter: failed tasks of biz type invoices, keys starting inv-, due from 2026-11-27 10:00:00 UTC on."
            ]
        );
        assert!(bulk.is_bulk());
        let under_way = entry("task.bulk_cancel", serde_json::json!({"biz_type": null, "status": "pending"}));
        assert_eq!(
            summary(&under_way),
            ["Cancelling pending tasks: under way, or cut short (no counts recorded).", "Filter: pending tasks of every biz type, due at any time."]
        );
    }

    #[test]
    fn filters_postgresql_cannot_take_are_refused() {
        let filter = |actor: &str, before: &str| Filter { actor: actor.into(), before: before.into(), ..Filter::default() };
        assert!(matches!(filter("user:admin", " 42 ").check(), Ok(Bounds { before: Some(42), .. })));
        assert!(matches!(filter("", "").check(), Ok(Bounds { before: None, .. })));
        for (bad, field) in [(filter("user\0admin", ""), "actor"), (filter("", "99999999999999999999"), "before"), (filter("", "1e3"), "before")] {
            assert!(matches!(bad.check(), Err(Error::Invalid { field: f, .. }) if f == field), "{field}");
        }
    }

    /// A day bounds whole days: "from" its start, "to" its end (the day included); a time
    /// as typed; a window that ends before it starts, a key no task could have and a date
    /// that is none are refused at their field.
    #[test]
    fn date_filters_take_whole_days_or_times() {
        let dated = |from: &str, to: &str| Filter { from: from.into(), to: to.into(), ..Filter::default() }.check();
        let at = |s: &str| Some(s.parse::<DateTime<Utc>>().unwrap());
        let day = dated("2026-11-27", "2026-11-27").unwrap();
        assert_eq!((day.from, day.to), (at("2026-11-27T00:00:00Z"), at("2026-11-28T00:00:00Z")));
        let times = dated("2026-11-27T10:30", "").unwrap();
        assert_eq!((times.from, times.to), (at("2026-11-27T10:30:00Z"), None));
        for (bad, field) in [(dated("2026-11-28", "2026-11-27"), "to"), (dated("2026-13-01", ""), "from")] {
            assert!(matches!(bad, Err(Error::Invalid { field: f, .. }) if f == field), "{field}");
        }
        let key = Filter { key: "x".repeat(1000), ..Filter::default() }.check();
        assert!(matches!(key, Err(Error::Invalid { field, .. }) if field == "key"));
    }

    #[test]
    fn send_time_reads_as_words() {
        assert_eq!(send_time(92, 5.0), "about 19 s");
        assert_eq!(send_time(10_000, 2.0), "about 1 h 24 min");
        assert_eq!(send_time(3, 100.0), "about 1 s");
    }
}
