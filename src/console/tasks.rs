//! Task pages: search, one task with its attempts, cancel, reschedule, replay, and bulk
//! replay (of failed or expired tasks) and bulk cancel (of pending ones) by filter.

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use askama::Template;
use chrono::{DateTime, Utc};
use serde::Deserialize;
use uuid::Uuid;

use super::history;
use super::session::CsrfForm;
use super::{ConsoleError, Ctx, Problems, Session, done, parse_local_time, render, see_other};
use crate::audit;
use crate::biz_types::{self, BizType};
use crate::error::Error;
use crate::failure_notices;
use crate::state::AppState;
use crate::tasks::bulk::{self, BulkFilter};
use crate::tasks::{self, Attempt, AttemptsFrom, Holding, ListFilter, Status, Task, When};

const PAGE_SIZE: i64 = 50;

/// The search form; every field optional. A GET form: the whole search is in the address,
/// to be shared or reloaded.
#[derive(Debug, Default, Clone, Deserialize)]
pub struct Filter {
    #[serde(default)]
    pub biz_type: String,
    /// A status, or `retrying` (`tasks::RETRYING_SQL`).
    #[serde(default)]
    pub status: String,
    #[serde(default)]
    pub from: String,
    #[serde(default)]
    pub to: String,
    /// A key's start, or an id's (8 hex digits or more); combined with every other field.
    #[serde(default)]
    pub q: String,
    /// "Payload contains": JSON or `field = value` (`tasks::containment`); across biz types
    /// bounded as `tasks::list` says.
    #[serde(default)]
    pub payload: String,
    /// A timer's id: only its occurrences; needs a biz type.
    #[serde(default)]
    pub timer: String,
    /// 0 to 9: only tasks of this priority; needs a biz type.
    #[serde(default)]
    pub priority: String,
    /// A flow key: only its tasks; needs a biz type.
    #[serde(default)]
    pub flow_key: String,
    /// `oldest` (the default) or `newest` first, by due time.
    #[serde(default)]
    pub order: String,
    /// The next page: the last row's position.
    #[serde(default)]
    pub cursor: String,
    /// The previous page: the first row's position.
    #[serde(default)]
    pub before: String,
}

impl Filter {
    /// The query string of this filter (without the page's position), for links.
    fn query(&self) -> String {
        let mut query = url::form_urlencoded::Serializer::new(String::new());
        query.append_pair("biz_type", &self.biz_type).append_pair("status", &self.status).append_pair("from", &self.from).append_pair("to", &self.to);
        // Left out when empty: the bulk actions' links back stay as they were.
        for (name, value) in [
            ("q", &self.q),
            ("payload", &self.payload),
            ("timer", &self.timer),
            ("priority", &self.priority),
            ("flow_key", &self.flow_key),
            ("order", &self.order),
        ] {
            if !value.is_empty() {
                query.append_pair(name, value);
            }
        }
        query.finish()
    }

    async fn biz_type_id(&self, state: &AppState) -> Result<Option<i32>, Error> {
        if self.biz_type.is_empty() {
            return Ok(None);
        }
        Ok(Some(biz_types::id_of(&state.pool, &self.biz_type).await?))
    }
}

#[derive(Template)]
#[template(path = "tasks.html")]
struct ListPage {
    ctx: Ctx,
    filter: Filter,
    biz_types: Vec<BizType>,
    statuses: &'static [Status],
    tasks: Vec<Task>,
    next: Option<String>,
    prev: Option<String>,
    /// How many match: "1,234", or "10,000+" past `tasks::COUNT_CAP`; empty when refused.
    count: String,
    /// What the box was read as: "key" (a key prefix), "id" (an id prefix), or "" (none).
    searched: &'static str,
    /// Whether filters other than the box and the biz type narrow the search.
    narrowed: bool,
    /// How a payload search across biz types was bounded, when it was one.
    bound: Option<String>,
    /// Searches that may find what this one did not: what each finds, and its link (empty:
    /// advice without a link).
    hints: Vec<(String, String)>,
    /// Each field a refused filter is refused for, and why.
    errors: Vec<(String, String)>,
}

impl ListPage {
    fn invalid(&self, field: &str) -> String {
        super::invalid(&self.errors, field)
    }

    /// The biz type the filter names, when no biz type has that name (kept in the form,
    /// marked, rather than dropped).
    fn unknown_biz_type(&self) -> Option<&str> {
        let name = self.filter.biz_type.as_str();
        (!name.is_empty() && !self.biz_types.iter().any(|b| b.name == name)).then_some(name)
    }
}

/// One page of a search: its tasks, the links to the pages after and before, the count, and
/// what the box was read as.
#[derive(Default)]
struct Found {
    tasks: Vec<Task>,
    next: Option<String>,
    prev: Option<String>,
    /// As `ListPage::count`.
    count: String,
    searched: &'static str,
    /// As `ListPage::bound`.
    bound: Option<String>,
    /// As `ListPage::hints`.
    hints: Vec<(String, String)>,
}

pub async fn list(req: HttpRequest, session: Session, state: web::Data<AppState>, filter: web::Query<Filter>) -> Result<HttpResponse, ConsoleError> {
    let filter = filter.into_inner();
    // A whole id goes straight to its task.
    if let Ok(id) = filter.q.trim().parse::<Uuid>()
        && tasks::get(&state.pool, id).await?.is_some()
    {
        return Ok(see_other(&format!("/console/tasks/{id}")));
    }
    match search(&state, &filter).await {
        Ok(found) => {
            // A whole key that only one task matches: that task, not a list of one.
            let q = filter.q.trim();
            if let [task] = found.tasks.as_slice()
                && found.searched == "key"
                && filter.cursor.is_empty()
                && filter.before.is_empty()
                && task.key.as_deref() == Some(q)
            {
                return Ok(done(&format!("/console/tasks/{}", task.id), &format!("Opened the one task the search for `{q}` matches.")));
            }
            list_page(&req, &session, &state, filter, found, vec![]).await
        }
        Err(problems) => list_page(&req, &session, &state, filter, Found::default(), problems.by_field()?).await,
    }
}

/// The state filter as the list takes it: a status and whether only retrying tasks.
fn parse_state(raw: &str) -> Result<(Option<Status>, bool), Error> {
    match raw {
        "" => Ok((None, false)),
        "retrying" => Ok((Some(Status::Pending), true)),
        other => Status::parse(other).map(|s| (Some(s), false)).map_err(|_| {
            let names: Vec<&str> = Status::ALL.iter().map(|s| s.as_str()).collect();
            Error::invalid("status", format!("must be one of {}, or retrying", names.join(", ")))
        }),
    }
}

/// The timer filter: a timer's id, within a biz type (unbounded, it would read every task).
fn parse_timer(filter: &Filter) -> Result<Option<Uuid>, Error> {
    let raw = filter.timer.trim();
    if raw.is_empty() {
        return Ok(None);
    }
    let id = raw.parse::<Uuid>().map_err(|_| Error::invalid("timer", "must be a timer's id (a UUID, as on the timer's page)"))?;
    if filter.biz_type.is_empty() {
        return Err(Error::invalid("timer", "choose the timer's biz type too: a timer filter reads one biz type's tasks"));
    }
    Ok(Some(id))
}

/// The priority filter: none, or 0 to 9 as the API takes it, within one biz type.
fn parse_priority(filter: &Filter) -> Result<Option<i16>, Error> {
    let raw = filter.priority.trim();
    if raw.is_empty() {
        return Ok(None);
    }
    let priority = raw.parse::<i64>().map_err(|_| Error::invalid("priority", "must be an integer from 0 to 9")).and_then(tasks::validate_priority)?;
    if filter.biz_type.is_empty() {
        return Err(Error::invalid("priority", "choose a biz type too: a priority filter reads one biz type's tasks"));
    }
    Ok(Some(priority))
}

/// The flow key filter: none, or a key by the rules of `key`, within one biz type.
fn parse_flow_key(filter: &Filter) -> Result<Option<String>, Error> {
    let raw = filter.flow_key.trim();
    if raw.is_empty() {
        return Ok(None);
    }
    tasks::validate_flow_key(raw)?;
    if filter.biz_type.is_empty() {
        return Err(Error::invalid("flow_key", "choose a biz type too: a flow key filter reads one biz type's tasks"));
    }
    Ok(Some(raw.to_string()))
}

/// Whether the list is newest first.
fn parse_order(raw: &str) -> Result<bool, Error> {
    match raw {
        "" | "oldest" => Ok(false),
        "newest" => Ok(true),
        _ => Err(Error::invalid("order", "must be oldest or newest")),
    }
}

/// The biz type the filter names: its id, None for all, or a problem with the field (not a
/// page of its own: the list says it beside the field, with the search kept).
async fn parse_biz_type(state: &AppState, filter: &Filter) -> Result<Result<Option<i32>, Error>, Error> {
    match filter.biz_type_id(state).await {
        Ok(id) => Ok(Ok(id)),
        Err(Error::NotFound(_)) => {
            Ok(Err(Error::invalid("biz_type", format!("no biz type is named `{}`; choose one from the list", filter.biz_type.escape_debug()))))
        }
        Err(e) => Err(e),
    }
}

/// A due window that ends where or before it starts matches nothing: said, not searched.
fn check_window(from: Option<DateTime<Utc>>, to: Option<DateTime<Utc>>) -> Result<(), Error> {
    match (from, to) {
        (Some(from), Some(to)) if from >= to => Err(Error::invalid(
            "to",
            format!(
                "is not after from (`{}` to `{}` UTC): nothing is due in that window; swap them or widen it",
                from.format("%Y-%m-%d %H:%M"),
                to.format("%Y-%m-%d %H:%M")
            ),
        )),
        _ => Ok(()),
    }
}

/// A page of the tasks whose id or key starts with the box's text, or of those matching the
/// filter, the box and every other field combined; every field checked by the API's rules,
/// every problem at once.
async fn search(state: &AppState, filter: &Filter) -> Result<Found, Problems> {
    let q = filter.q.trim();
    let payload = filter.payload.trim();
    let status = parse_state(&filter.status);
    let order = parse_order(&filter.order);
    let (from, to) = (parse_local_time("from", &filter.from), parse_local_time("to", &filter.to));
    let window = match (&from, &to) {
        (Ok(from), Ok(to)) => check_window(*from, *to),
        _ => Ok(()),
    };
    let id_prefix = tasks::id_prefix(q);
    let key = (!q.is_empty() && id_prefix.is_none()).then(|| tasks::validate_key(q));
    // Across biz types a payload search reads the payload index, bounded (`tasks::list`).
    let payload = (!payload.is_empty()).then(|| tasks::containment(payload));
    let timer = parse_timer(filter);
    let priority = parse_priority(filter);
    let flow_key = parse_flow_key(filter);
    let biz_type = parse_biz_type(state, filter).await?;
    let (status, newest_first, from, to, payload, timer_id, priority, flow_key, biz_type_id) =
        match (status, order, from, to, payload.transpose(), key.transpose(), timer, priority, flow_key, biz_type, window) {
            (Ok(status), Ok(order), Ok(from), Ok(to), Ok(payload), Ok(_), Ok(timer), Ok(priority), Ok(flow_key), Ok(biz_type), Ok(())) => {
                (status, order, from, to, payload, timer, priority, flow_key, biz_type)
            }
            (status, order, from, to, payload, key, timer, priority, flow_key, biz_type, window) => {
                let problems = [
                    biz_type.err(),
                    status.err(),
                    order.err(),
                    key.err(),
                    from.err(),
                    to.err(),
                    window.err(),
                    payload.err(),
                    timer.err(),
                    priority.err(),
                    flow_key.err(),
                ];
                return Err(Problems(problems.into_iter().flatten().collect()));
            }
        };
    let position = |c: &str| Some(c.to_string()).filter(|c| !c.is_empty());
    let (cursor, backward) = match position(&filter.before) {
        Some(before) => (Some(before), true),
        None => (position(&filter.cursor), false),
    };
    let link = |name: &str, c: String| format!("/console/tasks?{}&{name}={c}", filter.query());
    let (status, retrying) = status;
    let list = ListFilter { status, retrying, from, to, payload, timer_id, priority, flow_key, cursor, backward, newest_first, limit: PAGE_SIZE };
    if let Some(range) = id_prefix {
        // Ids are copied from somewhere, not guessed: the first page of them is enough, and
        // "50+" says to type more of the id.
        let mut tasks: Vec<Task> = tasks::by_id_prefix(&state.pool, range, biz_type_id, &list, PAGE_SIZE + 1).await?;
        if !tasks.is_empty() {
            let count = if tasks.len() as i64 > PAGE_SIZE { format!("{PAGE_SIZE}+") } else { tasks.len().to_string() };
            tasks.truncate(PAGE_SIZE as usize);
            return Ok(Found { tasks, count, searched: "id", ..Found::default() });
        }
    }
    if !q.is_empty() {
        tasks::validate_key(q)?;
        let search = tasks::KeySearch { prefix: q, biz_type_id, cursor: list.cursor.clone(), backward, limit: PAGE_SIZE, filter: Some(&list) };
        let page = tasks::search_keys(&state.pool, &search).await?;
        let count = tasks::count_keys(&state.pool, &search).await?;
        let hints = if count == 0 { key_hints(state, filter, &search).await? } else { vec![] };
        return Ok(Found {
            tasks: page.items,
            next: page.next_cursor.map(|c| link("cursor", c)),
            prev: page.prev_cursor.map(|c| link("before", c)),
            count: shown_count(count),
            searched: "key",
            hints,
            ..Found::default()
        });
    }
    let page = tasks::list(&state.pool, biz_type_id, &list).await?;
    let count = tasks::count(&state.pool, biz_type_id, &list).await?;
    let bound = match (biz_type_id, &list.payload) {
        (None, Some(_)) => {
            let horizon = crate::partitions::horizon(&state.pool).await.map_err(Error::from)?;
            Some(format!(
                "Across every biz type a payload search reads the payload index, which holds the tasks due before {} UTC (the hot \
                 partitions), at most {} matches a page; choose a biz type to search all of its tasks, later ones too, in due order.",
                horizon.format("%Y-%m-%d %H:%M"),
                super::grouped(tasks::COUNT_CAP)
            ))
        }
        _ => None,
    };
    Ok(Found {
        tasks: page.items,
        next: page.next_cursor.map(|c| link("cursor", c)),
        prev: page.prev_cursor.map(|c| link("before", c)),
        count: shown_count(count),
        bound,
        ..Found::default()
    })
}

/// Most fields the "no key starts with it" hint offers to search payloads by.
const PAYLOAD_FIELDS: usize = 4;
/// How many of the newest tasks the payload fields offered are read from.
const PAYLOAD_SAMPLES: i64 = 20;

/// Searches to try when no key starts with the box's text: the same text in another case
/// (keys are case-sensitive), the keys without the other filters, and the payloads' fields
/// for the text (the fields of the newest tasks' payloads, in the biz type or all).
async fn key_hints(state: &AppState, filter: &Filter, search: &tasks::KeySearch<'_>) -> Result<Vec<(String, String)>, Error> {
    let q = search.prefix;
    let mut hints = vec![];
    let with = |change: &dyn Fn(&mut Filter)| {
        let mut changed = filter.clone();
        change(&mut changed);
        format!("/console/tasks?{}", changed.query())
    };
    let mut cases = vec![q.to_lowercase(), q.to_uppercase()];
    cases.dedup();
    for other in cases.into_iter().filter(|c| c != q) {
        let n = tasks::count_keys(&state.pool, &tasks::KeySearch { prefix: &other, cursor: None, backward: false, ..*search }).await?;
        if n > 0 {
            hints.push((
                format!("`{other}`: {} (keys are case-sensitive)", super::counted(n.min(tasks::COUNT_CAP), "key", "keys")),
                with(&|f| f.q.clone_from(&other)),
            ));
        }
    }
    if search.filter.is_some_and(|_| filter_narrows(filter)) {
        let n = tasks::count_keys(&state.pool, &tasks::KeySearch { cursor: None, backward: false, filter: None, ..*search }).await?;
        if n > 0 {
            let keys = super::counted(n.min(tasks::COUNT_CAP), "key starts", "keys start");
            hints.push((
                format!("{keys} with `{q}` when the state, due and other filters are left out"),
                with(&|f| *f = Filter { biz_type: f.biz_type.clone(), q: f.q.clone(), order: f.order.clone(), ..Filter::default() }),
            ));
        }
    }
    // The payload's fields, from the newest tasks: a number typed is offered as a number
    // where the field held one, as text where it held text.
    let newest = ListFilter { newest_first: true, limit: PAYLOAD_SAMPLES, ..ListFilter::default() };
    let sample = tasks::list(&state.pool, search.biz_type_id, &newest).await?;
    let mut offered: Vec<String> = vec![];
    for task in &sample.items {
        let Ok(serde_json::Value::Object(fields)) = serde_json::from_str::<serde_json::Value>(task.payload.get()) else { continue };
        for (field, value) in fields {
            let typed = match value {
                serde_json::Value::Number(_) if q.parse::<serde_json::Number>().is_ok() => format!("{field} = {q}"),
                serde_json::Value::String(_) => format!("{field} = {}", serde_json::Value::String(q.to_string())),
                _ => continue,
            };
            if offered.len() < PAYLOAD_FIELDS && !offered.contains(&typed) && !field.contains(['.', '=']) {
                offered.push(typed);
            }
        }
    }
    for typed in &offered {
        hints.push((format!("payloads with `{typed}`"), with(&|f| (f.q, f.payload) = (String::new(), typed.clone()))));
    }
    if offered.is_empty() {
        hints.push((format!("To search payloads for it, write `field = {q}` in Payload contains."), String::new()));
    }
    Ok(hints)
}

/// Whether the filter names more than a biz type and the box.
fn filter_narrows(filter: &Filter) -> bool {
    [&filter.status, &filter.from, &filter.to, &filter.payload, &filter.timer, &filter.priority, &filter.flow_key]
        .iter()
        .any(|f| !f.trim().is_empty())
}

/// "1,234", or "10,000+" past the count's cap (the dashboard's counts too).
pub(super) fn shown_count(count: i64) -> String {
    let mut shown = super::grouped(count.min(tasks::COUNT_CAP));
    if count > tasks::COUNT_CAP {
        shown.push('+');
    }
    shown
}

/// The list page; with errors, answered 422 with the filter as it was typed.
async fn list_page(
    req: &HttpRequest,
    session: &Session,
    state: &AppState,
    filter: Filter,
    found: Found,
    errors: Vec<(String, String)>,
) -> Result<HttpResponse, ConsoleError> {
    // A biz type that does not exist is not found (the page still shows, with the search).
    let status = match errors.is_empty() {
        true => StatusCode::OK,
        false if errors.iter().any(|(field, _)| field == "biz_type") => StatusCode::NOT_FOUND,
        false => StatusCode::UNPROCESSABLE_ENTITY,
    };
    let page = ListPage {
        ctx: Ctx::new(session, req, "tasks"),
        count: found.count,
        searched: found.searched,
        narrowed: filter_narrows(&filter),
        bound: found.bound,
        hints: found.hints,
        filter,
        biz_types: biz_types::list(&state.pool).await?,
        statuses: &Status::ALL,
        tasks: found.tasks,
        next: found.next,
        prev: found.prev,
        errors,
    };
    render(status, &page.ctx, &page)
}

#[derive(Template)]
#[template(path = "task.html")]
struct TaskPage {
    ctx: Ctx,
    task: Task,
    /// "retrying" for a pending task with attempts made, else its status.
    state: &'static str,
    payload: String,
    /// Its attempts numbered across replays, with the replays and releases between them.
    events: Vec<history::Event>,
    /// When it was first due, and who holds it while running.
    holding: Holding,
    /// Other tasks that held this task's key: the key's current task, those before it.
    others: Vec<Task>,
    /// The zone the reschedule form's time is in (an IANA name), and the time as typed
    /// (prefilled with the current due time in that zone).
    zone: String,
    run_at: String,
    /// Each reschedule field refused, and why.
    errors: Vec<(String, String)>,
    /// Its failure notices (`failure_notices`), oldest first.
    notices: Vec<failure_notices::Notice>,
    /// How many attempts it has had in all; `events` shows a page of them.
    attempt_total: i64,
    /// The cursor of the page of attempts before the one shown; None: none older.
    older: Option<String>,
    /// An older page is shown, not the newest.
    paged: bool,
}

impl TaskPage {
    fn error_for(&self, field: &str) -> &str {
        super::error_for(&self.errors, field)
    }

    fn invalid(&self, field: &str) -> String {
        super::invalid(&self.errors, field)
    }
}

/// The state a person reads: a pending task tried before is retrying (`Task::is_retrying`).
fn state_of(task: &Task) -> &'static str {
    if task.is_retrying() { "retrying" } else { task.status.as_str() }
}

/// A zone a form names: an IANA name chrono-tz knows (empty: UTC).
fn parse_zone(raw: &str) -> Result<chrono_tz::Tz, Error> {
    let raw = raw.trim();
    if raw.is_empty() {
        return Ok(chrono_tz::UTC);
    }
    raw.parse().map_err(|_| Error::invalid("zone", format!("`{raw}` is not a time zone; give an IANA name such as UTC or Europe/Paris")))
}

/// A time typed in the form, in `zone` unless it names its own offset; the API's rules
/// for times (`check_time`, through `parse_local_time`) apply to the result.
fn parse_zoned_time(field: &str, raw: &str, zone: chrono_tz::Tz) -> Result<Option<chrono::DateTime<chrono::Utc>>, Error> {
    use chrono::TimeZone;
    let trimmed = raw.trim();
    if zone == chrono_tz::UTC || trimmed.is_empty() || chrono::DateTime::parse_from_rfc3339(trimmed).is_ok() {
        return parse_local_time(field, raw);
    }
    for format in ["%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M", "%Y-%m-%d %H:%M:%S"] {
        if let Ok(local) = chrono::NaiveDateTime::parse_from_str(trimmed, format) {
            return match zone.from_local_datetime(&local).single() {
                Some(t) => parse_local_time(field, &t.with_timezone(&chrono::Utc).to_rfc3339()),
                None => {
                    Err(Error::invalid(field, format!("`{trimmed}` is skipped or repeated by a clock change in {zone}; choose a time an hour away")))
                }
            };
        }
    }
    Err(Error::invalid(field, format!("`{trimmed}` is not a time such as 2026-11-22 09:30 ({zone})")))
}

/// The reschedule form's time: the task's due time in `zone`.
fn due_in(task: &Task, zone: chrono_tz::Tz) -> String {
    task.run_at.with_timezone(&zone).format("%Y-%m-%dT%H:%M:%S").to_string()
}

/// The reschedule form's time: as typed (sent back with its errors), or the task's due
/// time in a zone.
enum RunAt {
    Typed(String),
    DueIn(chrono_tz::Tz),
}

/// The task's page; with errors, answered 422 with the reschedule form as it was typed.
///
/// Every read is made in one snapshot (`Pool::snapshot`): read one by one, a task finishing
/// meanwhile showed "running" beside the 200 attempt that finished it and no finish time.
#[allow(clippy::too_many_arguments)]
async fn task_page(
    req: &HttpRequest,
    session: &Session,
    state: &AppState,
    id: Uuid,
    from: AttemptsFrom,
    zone: String,
    run_at: RunAt,
    errors: Vec<(String, String)>,
) -> Result<HttpResponse, ConsoleError> {
    let status = if errors.is_empty() { StatusCode::OK } else { StatusCode::UNPROCESSABLE_ENTITY };
    let mut tx = state.pool.snapshot().await?;
    let mut task = tasks::read(&mut *tx, id).await?.ok_or_else(|| ConsoleError::NotFound(format!("no task with id {id}")))?;
    // A page of attempts, the newest by default: a task snoozed every second for a day
    // made a page of 35 MB when all were shown.
    let paged = matches!(from, AttemptsFrom::Before(_));
    let page = tasks::attempts(&mut *tx, task.id, &from, tasks::ATTEMPTS_SHOWN).await?;
    let mut attempts = page.items;
    let attempt_total = tasks::attempt_total(&mut *tx, task.id).await?;
    let before_page = match attempts.first() {
        Some(first) => tasks::attempts_before(&mut *tx, task.id, first).await?,
        None => 0,
    };
    let payload = super::pretty_json(&task.payload);
    let others = tasks::others_with_key(&mut *tx, &task).await?;
    let mut notices = failure_notices::for_task(&mut *tx, task.id).await?;
    let holding = tasks::holding(&mut tx, task.id).await?.ok_or_else(|| ConsoleError::NotFound(format!("no task with id {}", task.id)))?;
    // Only the changes among the attempts shown, when there are more.
    let (first, last) = (attempts.first().map(|a| a.started_at), attempts.last().map(|a| a.started_at));
    let since = first.filter(|_| page.older.is_some());
    let until = last.filter(|_| page.newer.is_some());
    let audited = history::Audited::read(&mut *tx, &task, since, until).await?;
    tx.commit().await?;
    let run_at = match run_at {
        RunAt::Typed(typed) => typed,
        RunAt::DueIn(zone) => due_in(&task, zone),
    };
    if !session.is_admin() {
        // A redirect's target, in the attempt and its error, may carry `user:pass@`.
        task.last_error = task.last_error.as_deref().map(audit::masked_urls);
        for n in &mut notices {
            n.last_error = n.last_error.as_deref().map(audit::masked_urls);
        }
        for a in &mut attempts {
            a.redirected_to = a.redirected_to.as_deref().map(audit::masked_url);
            a.error = a.error.as_deref().map(audit::masked_urls);
        }
    }
    let mut events = history::events(&task, attempts, audited);
    for e in events.iter_mut().filter(|e| e.attempt.is_some()) {
        e.ordinal += before_page as usize;
    }
    let page = TaskPage {
        ctx: Ctx::new(session, req, "tasks"),
        state: state_of(&task),
        task,
        payload,
        events,
        holding,
        others,
        zone,
        run_at,
        errors,
        notices,
        attempt_total,
        older: page.older,
        paged,
    };
    render(status, &page.ctx, &page)
}

async fn found(state: &AppState, id: Uuid) -> Result<(Task, Vec<Attempt>), ConsoleError> {
    tasks::get(&state.pool, id).await?.ok_or_else(|| ConsoleError::NotFound(format!("no task with id {id}")))
}

fn parse_id(raw: &str) -> Result<Uuid, ConsoleError> {
    raw.parse().map_err(|_| ConsoleError::NotFound(format!("`{raw}` is not a task id")))
}

#[derive(Deserialize)]
pub struct ShowQuery {
    /// The zone the reschedule form is in (an IANA name; empty: UTC).
    #[serde(default)]
    zone: String,
    /// Show the attempts before this cursor (a link from the page) rather than the newest.
    #[serde(default)]
    attempts_before: String,
}

pub async fn show(
    req: HttpRequest,
    session: Session,
    state: web::Data<AppState>,
    id: web::Path<String>,
    query: web::Query<ShowQuery>,
) -> Result<HttpResponse, ConsoleError> {
    let id = parse_id(&id)?;
    let from = match query.attempts_before.as_str() {
        "" => AttemptsFrom::Newest,
        cursor => AttemptsFrom::Before(cursor.to_string()),
    };
    let (zone, errors) = match parse_zone(&query.zone) {
        Ok(zone) => (zone, vec![]),
        Err(Error::Invalid { field, message }) => (chrono_tz::UTC, vec![(field, message)]),
        Err(e) => return Err(e.into()),
    };
    let run_at = RunAt::DueIn(zone);
    let zone = if errors.is_empty() { zone.name().to_string() } else { query.into_inner().zone };
    task_page(&req, &session, &state, id, from, zone, run_at, errors).await
}

pub async fn cancel(
    session: Session,
    state: web::Data<AppState>,
    id: web::Path<String>,
    form: web::Form<CsrfForm>,
) -> Result<HttpResponse, ConsoleError> {
    session.check_csrf(&form.csrf)?;
    let (task, _) = found(&state, parse_id(&id)?).await?;
    tasks::cancel(&state.pool, task.biz_type_id, task.id, &session.actor()).await?;
    Ok(done(&format!("/console/tasks/{}", task.id), "Task cancelled."))
}

/// Who may replay a task in this state: a succeeded task was delivered, so replaying it
/// calls the receiver a second time for the same thing; that is an admin's decision.
/// Failed, cancelled and expired tasks are open to support. Why not, or None. (The
/// selected rows' replay asks the same.)
pub(super) fn replay_refused(session: &Session, task: &Task) -> Option<String> {
    (task.status == Status::Succeeded && !session.is_admin()).then(|| {
        format!(
            "this task succeeded: replaying it delivers it again, which only an admin may do; `{}` is {}. Ask an admin.",
            session.user.username, session.user.role
        )
    })
}

fn may_replay(session: &Session, task: &Task) -> Result<(), ConsoleError> {
    replay_refused(session, task).map_or(Ok(()), |why| Err(ConsoleError::Forbidden(why)))
}

#[derive(Template)]
#[template(path = "task_replay.html")]
struct ReplayPage {
    ctx: Ctx,
    task: Task,
}

/// Asks before replaying a succeeded task (a page of its own: reloading it changes
/// nothing); other finished tasks are replayed from their page's button directly.
pub async fn ask_replay(req: HttpRequest, session: Session, state: web::Data<AppState>, id: web::Path<String>) -> Result<HttpResponse, ConsoleError> {
    let (task, _) = found(&state, parse_id(&id)?).await?;
    may_replay(&session, &task)?;
    if task.status != Status::Succeeded {
        // Nothing to ask (or nothing to replay): its page says which, and offers the button.
        return Ok(see_other(&format!("/console/tasks/{}", task.id)));
    }
    let page = ReplayPage { ctx: Ctx::new(&session, &req, "tasks"), task };
    render(StatusCode::OK, &page.ctx, &page)
}

#[derive(Deserialize)]
pub struct ReplayForm {
    #[serde(default)]
    csrf: String,
    /// "yes" from the confirm page; a succeeded task is replayed only with it.
    #[serde(default)]
    confirm: String,
}

pub async fn replay(
    session: Session,
    state: web::Data<AppState>,
    id: web::Path<String>,
    form: web::Form<ReplayForm>,
) -> Result<HttpResponse, ConsoleError> {
    session.check_csrf(&form.csrf)?;
    let (task, _) = found(&state, parse_id(&id)?).await?;
    may_replay(&session, &task)?;
    if task.status == Status::Succeeded && form.confirm != "yes" {
        return Ok(see_other(&format!("/console/tasks/{}/replay", task.id)));
    }
    tasks::replay(&state.pool, task.biz_type_id, task.id, &session.actor()).await?;
    Ok(done(&format!("/console/tasks/{}", task.id), "Task replayed: it is pending and due now."))
}

#[derive(Deserialize)]
pub struct ReleaseForm {
    #[serde(default)]
    csrf: String,
    /// The receipt the page showed holding it: released only if it still does.
    #[serde(default)]
    receipt: String,
}

/// Puts a task held by a pull consumer an admin judged dead back to pending now (admins
/// only, audited), rather than waiting for its time to run to pass.
pub async fn release(
    session: Session,
    state: web::Data<AppState>,
    id: web::Path<String>,
    form: web::Form<ReleaseForm>,
) -> Result<HttpResponse, ConsoleError> {
    session.admin_form(&form.csrf)?;
    let (task, _) = found(&state, parse_id(&id)?).await?;
    let back = format!("/console/tasks/{}", task.id);
    let Ok(receipt) = form.receipt.trim().parse::<Uuid>() else {
        return Err(Error::invalid("receipt", "is not a receipt; reload the task's page and release it from there").into());
    };
    let reason = format!("released by {}: the consumer holding it was given up for dead", session.actor());
    if !tasks::lease::release(&state.pool, task.biz_type_id, task.id, receipt, &reason, &session.actor()).await? {
        return Ok(done(
            &back,
            "Not released: the task is no longer held by that consumer (it was acked, nacked or recovered meanwhile). Read its state below.",
        ));
    }
    Ok(done(&back, "Task released: it is pending and due now; the consumer's receipt no longer settles it."))
}

#[derive(Deserialize)]
pub struct RescheduleForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    run_at: String,
    /// The zone `run_at` is in (an IANA name; empty: UTC).
    #[serde(default)]
    zone: String,
}

pub async fn reschedule(
    req: HttpRequest,
    session: Session,
    state: web::Data<AppState>,
    id: web::Path<String>,
    form: web::Form<RescheduleForm>,
) -> Result<HttpResponse, ConsoleError> {
    session.admin_form(&form.csrf)?;
    let (task, _) = found(&state, parse_id(&id)?).await?;
    // The API's rules for run_at: a time RFC 3339 can name, at most 24 hours past and 10
    // years ahead; every field's problem at once.
    let zone = parse_zone(&form.zone);
    let when = parse_zoned_time("run_at", &form.run_at, *zone.as_ref().unwrap_or(&chrono_tz::UTC))
        .and_then(|t| t.ok_or_else(|| Error::invalid("run_at", "give the new time")))
        .and_then(|t| When::parse(Some(&t.to_rfc3339()), None, chrono::Utc::now()));
    let moved = match (zone, when) {
        (Ok(_), Ok(when)) => match tasks::reschedule(
            &state.pool,
            task.biz_type_id,
            task.id,
            tasks::Reschedule { when: Some(when), ..tasks::Reschedule::default() },
            &session.actor(),
        )
        .await
        {
            Ok(moved) => Ok(moved),
            // Past its deadline, say: shown on the form as the API names it.
            Err(e @ Error::Invalid { .. }) => Err(Problems(vec![e])),
            Err(e) => return Err(e.into()),
        },
        (zone, when) => Err(Problems(vec![zone.err(), when.err()].into_iter().flatten().collect())),
    };
    if let Err(problems) = moved {
        let form = form.into_inner();
        return task_page(&req, &session, &state, task.id, AttemptsFrom::Newest, form.zone, RunAt::Typed(form.run_at), problems.by_field()?).await;
    }
    Ok(done(&format!("/console/tasks/{}", task.id), "Task rescheduled."))
}

#[derive(Deserialize)]
pub struct BulkForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    biz_type: String,
    /// Bulk replay: `failed` (the default) or `expired`. Bulk cancel: pending, always.
    #[serde(default)]
    status: String,
    #[serde(default)]
    key_prefix: String,
    #[serde(default)]
    from: String,
    #[serde(default)]
    to: String,
    /// Absent: show how many would be changed and ask; "yes": change them.
    #[serde(default)]
    confirm: String,
}

/// A bulk action of the console: the API's bulk cancel and bulk replay, by the same filter
/// rules (`BulkFilter::new`).
#[derive(Clone, Copy, PartialEq)]
enum Bulk {
    Replay(Status),
    Cancel,
}

impl Bulk {
    fn path(self) -> &'static str {
        match self {
            Bulk::Replay(_) => "/console/tasks/replay-failed",
            Bulk::Cancel => "/console/tasks/cancel-pending",
        }
    }
    fn status(self) -> Status {
        match self {
            Bulk::Replay(status) => status,
            Bulk::Cancel => Status::Pending,
        }
    }
}

#[derive(Template)]
#[template(path = "bulk_replay.html")]
struct ConfirmPage {
    ctx: Ctx,
    count: i64,
    /// `count` as `shown_count` writes it ("10,000+" past the dry run's cap).
    shown: String,
    /// "replay" or "cancel".
    action: &'static str,
    path: &'static str,
    status: Status,
    biz_type: String,
    key_prefix: String,
    from: String,
    to: String,
    /// The whole filter in words (`bulk::describe`), its time window included.
    scope: String,
    /// The keys (or ids) of the first few tasks it would change, with their ids.
    samples: Vec<(Uuid, String)>,
    /// A replay's receivers: how their callbacks went in the last `RECENT_MINUTES`.
    recent: Vec<Recent>,
    /// A replay of one biz type: how long its rate limit takes to send them, in words.
    send_time: Option<String>,
}

impl ConfirmPage {
    /// Whether the examples are every task it would change.
    fn all_shown(&self) -> bool {
        self.samples.len() as i64 >= self.count
    }
}

/// The minutes of attempts a bulk replay's confirm page reads the receiver's state from.
const RECENT_MINUTES: i32 = 5;

/// The tasks a bulk confirm page names as examples.
const SAMPLES: i64 = 5;

/// A receiver's last minutes, as a bulk replay's confirm page tells them.
struct Recent {
    /// "payments: 0% delivered in the last 5 min (0 of 12 attempts)".
    said: String,
    /// Under half delivered: replaying now will likely fail again.
    failing: bool,
}

impl Recent {
    fn of(recent: &tasks::stats::Recent) -> Recent {
        let said = format!(
            "{}: {}% delivered in the last {RECENT_MINUTES} min ({} of {})",
            recent.biz_type,
            recent.percent(),
            super::grouped(recent.delivered),
            super::counted(recent.attempts, "attempt", "attempts")
        );
        Recent { said, failing: recent.delivered * 2 < recent.attempts }
    }
}

impl BulkForm {
    fn filter(&self) -> Filter {
        // The key prefix is the list's box: the list's one key field.
        let q = self.key_prefix.clone();
        Filter { biz_type: self.biz_type.clone(), from: self.from.clone(), to: self.to.clone(), q, ..Filter::default() }
    }

    /// A replay form's state: failed unless it says expired.
    fn replay(&self) -> Result<Bulk, Error> {
        match self.status.as_str() {
            "" | "failed" => Ok(Bulk::Replay(Status::Failed)),
            "expired" => Ok(Bulk::Replay(Status::Expired)),
            _ => Err(Error::invalid("status", "a bulk replay takes failed or expired tasks")),
        }
    }

    /// The tasks this form names, by the API's rules. The console's confirm step (a page
    /// that says how many) stands for the API's `"all": true`: a filter of a biz type alone
    /// (or of every biz type) is taken. When a field is wrong, the list page with every
    /// field's problem.
    async fn bulk_filter(
        &self,
        bulk: Bulk,
        req: &HttpRequest,
        session: &Session,
        state: &AppState,
    ) -> Result<Result<BulkFilter, HttpResponse>, ConsoleError> {
        let prefix = Some(self.key_prefix.clone()).filter(|p| !p.is_empty());
        let filter = match (parse_local_time("from", &self.from), parse_local_time("to", &self.to)) {
            (Ok(from), Ok(to)) => BulkFilter::new(self.filter().biz_type_id(state).await?, prefix, from, to, None, true)
                // The console's form names its times `from` and `to`.
                .map_err(|e| match e {
                    Error::Invalid { field, message } if field.starts_with("run_at_") => {
                        Error::Invalid { field: field["run_at_".len()..].into(), message }
                    }
                    e => e,
                })
                .map_err(|e| Problems(vec![e])),
            (from, to) => Err(Problems(vec![from.err(), to.err()].into_iter().flatten().collect())),
        };
        match filter {
            Ok(filter) => Ok(Ok(filter)),
            Err(problems) => {
                let errors = problems.by_field()?;
                let filter = Filter { status: bulk.status().to_string(), ..self.filter() };
                list_page(req, session, state, filter, Found::default(), errors).await.map(Err)
            }
        }
    }

    /// The confirm page's address for this form.
    fn ask(&self, bulk: Bulk) -> String {
        let ask = url::form_urlencoded::Serializer::new(String::new())
            .append_pair("biz_type", &self.biz_type)
            .append_pair("status", bulk.status().as_str())
            .append_pair("key_prefix", &self.key_prefix)
            .append_pair("from", &self.from)
            .append_pair("to", &self.to)
            .finish();
        format!("{}?{ask}", bulk.path())
    }
}

/// Asks whether to make the bulk change, saying how many tasks it takes: a page of its own
/// (GET), so that reloading it asks again and changes nothing.
async fn ask(bulk: Bulk, req: HttpRequest, session: Session, state: web::Data<AppState>, form: BulkForm) -> Result<HttpResponse, ConsoleError> {
    let filter = match form.bulk_filter(bulk, &req, &session, &state).await? {
        Ok(filter) => filter,
        Err(refused) => return Ok(refused),
    };
    let count = bulk::count(&state.pool, &filter, bulk.status()).await?;
    let action = if bulk == Bulk::Cancel { "cancel" } else { "replay" };
    let biz_type = Some(form.biz_type.as_str()).filter(|b| !b.is_empty());
    let scope = bulk::describe(biz_type, bulk.status().as_str(), &filter);
    let samples = bulk::sample(&state.pool, &filter, bulk.status(), SAMPLES).await?;
    let samples = samples.into_iter().map(|(id, key)| (id, key.unwrap_or_else(|| id.to_string()))).collect();
    // A replay calls the receivers again: whether they answer now, and how long the rate
    // limit takes to send what it replays.
    let (recent, send_time) = match bulk {
        Bulk::Replay(_) if count > 0 => {
            let recent = tasks::stats::recent(&state.pool, filter.biz_type_id, RECENT_MINUTES).await?;
            let limits = match biz_type {
                Some(name) => biz_types::by_name(&state.pool, name).await?.map(|b| (b.rate_limit, b.max_in_flight)),
                None => None,
            };
            let send_time = limits.map(|limits| match limits {
                (Some(rate), _) => format!(
                    "At its rate limit of {rate} callbacks a second, sending {} takes {}.",
                    if count > tasks::COUNT_CAP { format!("the first {}", super::grouped(tasks::COUNT_CAP)) } else { "them".into() },
                    super::audit_log::send_time(count.min(tasks::COUNT_CAP), rate)
                ),
                (None, in_flight) => format!("It has no rate limit: they are sent as fast as its receiver answers, {in_flight} at a time."),
            });
            (recent.iter().map(Recent::of).collect(), send_time)
        }
        _ => (vec![], None),
    };
    let page = ConfirmPage {
        ctx: Ctx::new(&session, &req, "tasks"),
        count,
        shown: shown_count(count),
        action,
        path: bulk.path(),
        status: bulk.status(),
        biz_type: form.biz_type,
        key_prefix: form.key_prefix,
        from: form.from,
        to: form.to,
        scope,
        samples,
        recent,
        send_time,
    };
    render(StatusCode::OK, &page.ctx, &page)
}

/// Makes the bulk change, once confirmed on the page that says how many; an unconfirmed
/// form (a page from before that page existed) is sent there. Audited with the filter and
/// the counts, as the API's.
async fn apply(bulk: Bulk, req: HttpRequest, session: Session, state: web::Data<AppState>, form: BulkForm) -> Result<HttpResponse, ConsoleError> {
    session.check_csrf(&form.csrf)?;
    let filter = match form.bulk_filter(bulk, &req, &session, &state).await? {
        Ok(filter) => filter,
        Err(refused) => return Ok(refused),
    };
    if form.confirm != "yes" {
        return Ok(see_other(&form.ask(bulk)));
    }
    let actor = session.actor();
    let by = bulk::By { actor: &actor, biz_type: Some(form.biz_type.as_str()).filter(|b| !b.is_empty()) };
    let (counts, verb) = match bulk {
        Bulk::Replay(status) => (bulk::replay(&state.pool, &filter, status, by).await?, "Replayed"),
        Bulk::Cancel => (bulk::cancel(&state.pool, &filter, by).await?, "Cancelled"),
    };
    let (message, then) = match bulk {
        Bulk::Replay(status) => {
            let tasks = super::counted(counts.changed, &format!("{status} task"), &format!("{status} tasks"));
            (format!("{verb} {tasks}: {} pending and due now.", if counts.changed == 1 { "it is" } else { "they are" }), Status::Pending)
        }
        Bulk::Cancel => (format!("{verb} {}.", super::counted(counts.changed, "pending task", "pending tasks")), Status::Cancelled),
    };
    // Its page follows its tasks (and says where they went); the list is the fallback for
    // an operation that matched nothing, which records no entry.
    let back = match counts.entry {
        Some(entry) => format!("/console/audit/{entry}"),
        None => format!("/console/tasks?{}", Filter { status: then.to_string(), ..form.filter() }.query()),
    };
    Ok(done(&back, &message))
}

/// The bulk replay's confirm page (failed or expired tasks).
pub async fn ask_replay_failed(
    req: HttpRequest,
    session: Session,
    state: web::Data<AppState>,
    query: web::Query<BulkForm>,
) -> Result<HttpResponse, ConsoleError> {
    let form = query.into_inner();
    let bulk = form.replay()?;
    ask(bulk, req, session, state, form).await
}

/// Replays the failed (or expired) tasks matching the list's filter, once confirmed.
pub async fn replay_failed(
    req: HttpRequest,
    session: Session,
    state: web::Data<AppState>,
    form: web::Form<BulkForm>,
) -> Result<HttpResponse, ConsoleError> {
    let form = form.into_inner();
    let bulk = form.replay()?;
    apply(bulk, req, session, state, form).await
}

/// The bulk cancel's confirm page (pending tasks).
pub async fn ask_cancel_pending(
    req: HttpRequest,
    session: Session,
    state: web::Data<AppState>,
    query: web::Query<BulkForm>,
) -> Result<HttpResponse, ConsoleError> {
    ask(Bulk::Cancel, req, session, state, query.into_inner()).await
}

/// Cancels the pending tasks matching the list's filter, hot and cold, once confirmed.
pub async fn cancel_pending(
    req: HttpRequest,
    session: Session,
    state: web::Data<AppState>,
    form: web::Form<BulkForm>,
) -> Result<HttpResponse, ConsoleError> {
    apply(Bulk::Cancel, req, session, state, form.into_inner()).await
}
