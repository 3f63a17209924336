//! Task endpoints.

use std::collections::HashMap;

use actix_web::{HttpRequest, HttpResponse, web};
use chrono::{DateTime, Utc};
use serde::de::{SeqAccess, Visitor};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use serde_json::value::RawValue;
use uuid::Uuid;

use super::auth::Caller;
use super::{ApiError, from_raw, parse_limit, parse_query, raw_json, read_raw_body};
use crate::state::AppState;
use crate::tasks::{self, CreateOutcome, CreateTask, ListFilter, NewTask, When};
use crate::{audit, biz_types};

/// Most tasks in one batch create.
pub const MAX_BATCH: usize = 1000;
/// Room in a request body for the fields around the payload.
const ENVELOPE_BYTES: usize = 4096;
/// Most bytes in one batch body.
const MAX_BATCH_BODY: usize = 32 * 1024 * 1024;

/// GET of one task adds its attempts.
#[derive(Serialize)]
struct TaskWithAttempts<'a> {
    #[serde(flatten)]
    task: &'a tasks::Task,
    attempts: &'a [tasks::Attempt],
}

/// One entry of a batch answer: a task (201 or 200) or an error.
#[derive(Serialize)]
struct ItemResult<'a> {
    status: u16,
    #[serde(skip_serializing_if = "Option::is_none")]
    task: Option<&'a tasks::Task>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<Value>,
}

fn parse_id(raw: &str) -> Result<Uuid, ApiError> {
    raw.parse().map_err(|_| ApiError::BadRequest(format!("`{raw}` is not a task id (a UUID)")))
}

/// Validates one create request (its raw text). An item's biz type must be the caller's;
/// `foreign` says of each other biz type named in the request whether it exists (404 if not,
/// else 403).
fn validate_item(
    caller: &Caller,
    state: &AppState,
    item: &RawValue,
    now: DateTime<Utc>,
    foreign: &HashMap<String, bool>,
) -> Result<NewTask, ApiError> {
    let request: CreateTask = from_raw(item)?;
    if request.biz_type != caller.0.biz_type {
        return Err(match foreign.get(&request.biz_type) {
            Some(false) => ApiError::NotFound(format!("no biz type named `{}`", request.biz_type)),
            _ => caller.forbidden(&request.biz_type),
        });
    }
    // Only a keyed request can be repeated, so only it needs the hash of the request as sent.
    let request_hash = if request.key.is_some() { tasks::request_hash(item) } else { Vec::new() };
    Ok(request.validate(request_hash, now, state.max_payload_bytes)?)
}

/// Whether each biz type named in these requests, other than the caller's, exists. Costs a
/// query only when a request names another biz type.
async fn foreign_biz_types(caller: &Caller, state: &AppState, items: &[&RawValue]) -> Result<HashMap<String, bool>, ApiError> {
    #[derive(Deserialize)]
    struct Named {
        biz_type: String,
    }
    let mut foreign = HashMap::new();
    for name in items.iter().filter_map(|item| from_raw::<Named>(item).ok()).map(|named| named.biz_type) {
        if name != caller.0.biz_type && !foreign.contains_key(&name) {
            let exists = biz_types::exists(&state.pool, &name).await?;
            foreign.insert(name, exists);
        }
    }
    Ok(foreign)
}

fn check_rate(caller: &Caller, state: &AppState) -> Result<(), ApiError> {
    state.create_limiter.check(caller.0.biz_type_id, caller.0.create_rate_limit).map_err(ApiError::RateLimited)
}

pub async fn create(caller: Caller, state: web::Data<AppState>, body: web::Payload) -> Result<HttpResponse, ApiError> {
    let body = read_raw_body(body, state.max_payload_bytes + ENVELOPE_BYTES).await?;
    let item = raw_json(&body)?;
    let foreign = foreign_biz_types(&caller, &state, &[item]).await?;
    let item = validate_item(&caller, &state, item, Utc::now(), &foreign)?;
    check_rate(&caller, &state)?;
    match state.creates.create(caller.0.biz_type_id, &caller.0.biz_type, item).await? {
        CreateOutcome::Created(task) => Ok(HttpResponse::Created().json(task)),
        CreateOutcome::Existing(task) => Ok(HttpResponse::Ok().json(task)),
        CreateOutcome::Failed(e) => Err(e.into()),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BatchRequest<'a> {
    #[serde(borrow, deserialize_with = "at_most_max_batch")]
    tasks: Vec<&'a RawValue>,
}

/// The items of a batch as raw text; parsing stops at the first item beyond MAX_BATCH, so
/// that a body of millions of tiny items costs no more than one of a thousand.
fn at_most_max_batch<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<&'de RawValue>, D::Error> {
    struct Items;
    impl<'de> Visitor<'de> for Items {
        type Value = Vec<&'de RawValue>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a sequence")
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            let mut items = Vec::new();
            while let Some(item) = seq.next_element()? {
                if items.len() == MAX_BATCH {
                    return Err(serde::de::Error::custom(format!("must hold 1 to {MAX_BATCH} items, not more")));
                }
                items.push(item);
            }
            Ok(items)
        }
    }
    d.deserialize_seq(Items)
}

/// The answer to a batch.
#[derive(Serialize)]
struct BatchAnswer<'a> {
    results: Vec<ItemResult<'a>>,
}

/// Creates up to 1000 tasks. Each item succeeds or fails on its own; the answer lists an
/// outcome per item, in order.
pub async fn create_batch(caller: Caller, state: web::Data<AppState>, body: web::Payload) -> Result<HttpResponse, ApiError> {
    // Whatever the payload limit, the body need not hold more than a thousand of them (and
    // memory follows the body: payloads stay text).
    let limit = MAX_BATCH_BODY.min(MAX_BATCH * (state.max_payload_bytes + ENVELOPE_BYTES));
    let body = read_raw_body(body, limit).await?;
    let request: BatchRequest = from_raw(raw_json(&body)?)?;
    if request.tasks.is_empty() {
        return Err(ApiError::Invalid(format!("tasks: must hold 1 to {MAX_BATCH} items, not 0")));
    }
    check_rate(&caller, &state)?;
    let foreign = foreign_biz_types(&caller, &state, &request.tasks).await?;
    let now = Utc::now();
    // Invalid items are answered on their own; the valid ones go to the database together.
    let mut valid: Vec<NewTask> = Vec::with_capacity(request.tasks.len());
    let invalid: Vec<Option<ApiError>> = request
        .tasks
        .into_iter()
        .map(|item| validate_item(&caller, &state, item, now, &foreign).map(|task| valid.push(task)).err())
        .collect();
    // The valid payloads are copied out of the body; it is no longer needed.
    drop(body);
    let mut outcomes = tasks::create_batch(&state.pool, caller.0.biz_type_id, &caller.0.biz_type, &mut valid).await?.into_iter();
    let outcomes: Vec<Result<(u16, tasks::Task), ApiError>> = invalid
        .into_iter()
        .map(|invalid| match invalid {
            Some(e) => Err(e),
            None => match outcomes.next().expect("one outcome per valid item") {
                CreateOutcome::Created(task) => Ok((201, task)),
                CreateOutcome::Existing(task) => Ok((200, task)),
                CreateOutcome::Failed(e) => Err(e.into()),
            },
        })
        .collect();
    let results: Vec<ItemResult> = outcomes
        .iter()
        .enumerate()
        .map(|(i, outcome)| match outcome {
            Ok((status, task)) => ItemResult { status: *status, task: Some(task), error: None },
            Err(e) => item_error(i, e),
        })
        .collect();
    Ok(HttpResponse::Ok().json(BatchAnswer { results }))
}

fn item_error(index: usize, e: &ApiError) -> ItemResult<'static> {
    use actix_web::ResponseError;
    let mut body = e.body();
    body["message"] = Value::String(format!("tasks[{index}]: {e}"));
    ItemResult { status: e.status_code().as_u16(), task: None, error: Some(body) }
}

pub async fn get(caller: Caller, state: web::Data<AppState>, id: web::Path<String>) -> Result<HttpResponse, ApiError> {
    let id = parse_id(&id)?;
    let (task, attempts) =
        tasks::get(&state.pool, id).await?.ok_or_else(|| ApiError::NotFound(format!("no task with id {id}")))?;
    if task.biz_type_id != caller.0.biz_type_id {
        return Err(ApiError::Forbidden("this task belongs to another biz type".into()));
    }
    Ok(HttpResponse::Ok().json(TaskWithAttempts { task: &task, attempts: &attempts }))
}

pub async fn get_by_key(
    caller: Caller,
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    let (name, key) = path.into_inner();
    caller.require(&state, &name).await?;
    if tasks::validate_key(&key).is_err() {
        return Err(ApiError::NotFound(format!("no task with key `{}` in biz type `{name}`", key.escape_debug())));
    }
    let task = tasks::get_by_key(&state.pool, caller.0.biz_type_id, &key)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("no task with key `{key}` in biz type `{name}`")))?;
    Ok(HttpResponse::Ok().json(task))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ListQuery {
    biz_type: Option<String>,
    status: Option<String>,
    from: Option<String>,
    to: Option<String>,
    limit: Option<String>,
    cursor: Option<String>,
}

fn parse_time(field: &str, raw: Option<&str>) -> Result<Option<DateTime<Utc>>, ApiError> {
    raw.map(|s| {
        DateTime::parse_from_rfc3339(s)
            .map(|t| t.with_timezone(&Utc))
            .map_err(|_| ApiError::Invalid(format!("{field}: must be an RFC 3339 time such as 2026-11-21T09:30:00Z")))
    })
    .transpose()
}

pub async fn list(caller: Caller, state: web::Data<AppState>, req: HttpRequest) -> Result<HttpResponse, ApiError> {
    let query: ListQuery = parse_query(&req)?;
    if let Some(name) = &query.biz_type {
        caller.require(&state, name).await?;
    }
    let status = query.status.as_deref().map(tasks::Status::parse).transpose()?;
    let limit = parse_limit(query.limit.as_deref())?;
    let filter = ListFilter {
        status,
        from: parse_time("from", query.from.as_deref())?,
        to: parse_time("to", query.to.as_deref())?,
        cursor: query.cursor,
        limit,
    };
    let page = tasks::list(&state.pool, Some(caller.0.biz_type_id), &filter).await?;
    Ok(HttpResponse::Ok().json(ListAnswer { items: &page.items, next_cursor: page.next_cursor.as_deref() }))
}

/// A page of tasks, written out as it is serialised: a `json!` value would parse every
/// payload into a tree.
#[derive(Serialize)]
struct ListAnswer<'a> {
    items: &'a [tasks::Task],
    next_cursor: Option<&'a str>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PatchRequest<'a> {
    run_at: Option<String>,
    delay_ms: Option<i64>,
    /// `Some(null)` when the client sets the payload to null, `None` when absent.
    #[serde(default, borrow, deserialize_with = "present")]
    payload: Option<&'a RawValue>,
}

fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<&'de RawValue>, D::Error> {
    <&RawValue>::deserialize(d).map(Some)
}

pub async fn reschedule(
    caller: Caller,
    state: web::Data<AppState>,
    id: web::Path<String>,
    body: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let id = parse_id(&id)?;
    let body = read_raw_body(body, state.max_payload_bytes + ENVELOPE_BYTES).await?;
    let request: PatchRequest = from_raw(raw_json(&body)?)?;
    if request.run_at.is_none() && request.delay_ms.is_none() && request.payload.is_none() {
        return Err(ApiError::Invalid("give run_at, delay_ms or payload to change".into()));
    }
    let when = match (&request.run_at, request.delay_ms) {
        (None, None) => None,
        (run_at, delay) => Some(When::parse(run_at.as_deref(), delay, Utc::now())?),
    };
    if let Some(payload) = request.payload {
        tasks::check_payload(payload, state.max_payload_bytes)?;
    }
    let task = tasks::reschedule(&state.pool, caller.0.biz_type_id, id, when, request.payload).await?;
    Ok(HttpResponse::Ok().json(task))
}

pub async fn cancel(caller: Caller, state: web::Data<AppState>, id: web::Path<String>) -> Result<HttpResponse, ApiError> {
    let id = parse_id(&id)?;
    let task = tasks::cancel(&state.pool, caller.0.biz_type_id, id).await?;
    audit::record(&state.pool, &caller.actor(), "task.cancel", "task", &id.to_string(), None, None).await?;
    Ok(HttpResponse::Ok().json(task))
}

pub async fn replay(caller: Caller, state: web::Data<AppState>, id: web::Path<String>) -> Result<HttpResponse, ApiError> {
    let id = parse_id(&id)?;
    let task = tasks::replay(&state.pool, caller.0.biz_type_id, id).await?;
    audit::record(&state.pool, &caller.actor(), "task.replay", "task", &id.to_string(), None, None).await?;
    Ok(HttpResponse::Ok().json(task))
}
