//! Task endpoints.

use std::collections::HashMap;

use actix_web::{HttpRequest, HttpResponse, web};
use chrono::{DateTime, Utc};
use serde::de::{SeqAccess, Visitor};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use utoipa::ToSchema;
use uuid::Uuid;

use super::auth::Caller;
use super::{ApiError, from_raw, parse_id, parse_limit, parse_query, parse_time, raw_json, read_raw_body};
use crate::biz_types;
use crate::state::AppState;
use crate::tasks::{self, CreateOutcome, CreateTask, ListFilter, NewTask, When};
use crate::traces;
use opentelemetry::KeyValue;
use opentelemetry::trace::{Span as _, SpanKind, Status, Tracer as _};

/// Most tasks in one batch create.
pub const MAX_BATCH: usize = 1000;
/// Room in a request body for the fields around the payload.
const ENVELOPE_BYTES: usize = 4096;
/// Most bytes in one batch body.
const MAX_BATCH_BODY: usize = 32 * 1024 * 1024;

/// A task with its latest delivery tries.
#[derive(Serialize, ToSchema)]
pub(super) struct TaskWithAttempts<'a> {
    #[serde(flatten)]
    task: &'a tasks::Task,
    /// The last 100 delivery tries, oldest first, including those before a replay; all of
    /// them, a page at a time, from `GET /api/v1/tasks/{id}/attempts`.
    attempts: &'a [tasks::Attempt],
    /// How many delivery tries the task has had in all.
    attempt_total: i64,
}

/// One entry of a batch answer: a task (201 or 200) or an error.
#[derive(Serialize, ToSchema)]
#[serde(untagged)]
enum ItemResult<'a> {
    Created(BatchItemCreated<'a>),
    Id(BatchItemId),
    Failed(BatchItemFailed),
}

/// An item of the batch that was created (201), or found already created by the same request (200).
#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct BatchItemCreated<'a> {
    #[schema(minimum = 200, maximum = 201)]
    status: u16,
    task: &'a tasks::Task,
}

/// An item of the batch that was created (201), or found already created by the same
/// request (200), answered with its id only (`"results": "ids"`).
#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct BatchItemId {
    #[schema(minimum = 200, maximum = 201)]
    status: u16,
    /// The task's id, as `task.id` would be.
    id: Uuid,
}

/// An item of the batch that failed on its own, with the status and error it would have had alone.
#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct BatchItemFailed {
    #[schema(minimum = 400, maximum = 599)]
    status: u16,
    error: super::error::ErrorDetail,
}

/// The request's W3C trace context, if it carries a well-formed one.
fn traceparent(req: &HttpRequest) -> Option<String> {
    req.headers().get("traceparent").and_then(|v| v.to_str().ok()).and_then(tasks::traceparent)
}

/// A create request's server span while traces are on (`traces`): a child of the caller's
/// `traceparent`, beside the spans of the tasks it creates (docs/book/src/traces.md).
struct CreateSpan(Option<traces::Span>);

impl CreateSpan {
    fn start(req: &HttpRequest, route: &'static str, caller: &Caller) -> CreateSpan {
        let Some(tracer) = traces::tracer() else { return CreateSpan(None) };
        let parent = traces::remote_parent(traceparent(req).as_deref()).unwrap_or_default();
        let attributes = vec![
            KeyValue::new("http.request.method", "POST"),
            KeyValue::new("http.route", route),
            KeyValue::new("url.path", route),
            KeyValue::new("chime.biz_type", caller.0.biz_type.clone()),
        ];
        let span =
            tracer.span_builder(format!("POST {route}")).with_kind(SpanKind::Server).with_attributes(attributes).start_with_context(tracer, &parent);
        CreateSpan(Some(span))
    }

    /// Notes the task a single create answers with.
    fn task(&mut self, task: tasks::Task) -> tasks::Task {
        if let Some(span) = &mut self.0 {
            span.set_attribute(KeyValue::new("chime.task.id", task.id.to_string()));
            if let Some(key) = &task.key {
                span.set_attribute(KeyValue::new("chime.task.key", key.clone()));
            }
        }
        task
    }

    /// Notes how many tasks of a batch were created or found.
    fn tasks(&mut self, count: usize) {
        if let Some(span) = &mut self.0 {
            span.set_attribute(KeyValue::new("chime.tasks", count as i64));
        }
    }

    /// Ends the span with the answer's status (an error status for a 5xx, as the HTTP
    /// conventions say of a server span).
    fn answered(self, answer: &Result<HttpResponse, ApiError>) {
        let Some(mut span) = self.0 else { return };
        let status = match answer {
            Ok(response) => response.status(),
            Err(e) => actix_web::ResponseError::status_code(e),
        };
        span.set_attribute(KeyValue::new("http.response.status_code", i64::from(status.as_u16())));
        if status.is_server_error() {
            span.set_status(Status::error(status.to_string()));
        }
        span.end();
    }
}

/// Why a create request was refused.
enum Refused {
    Now(ApiError),
    /// It names this other biz type: 404 if there is none of that name, else 403, once
    /// that is known (`Foreign::error`).
    Foreign(String),
}

impl From<ApiError> for Refused {
    fn from(e: ApiError) -> Refused {
        Refused::Now(e)
    }
}

/// Validates one create request (its raw text), parsed once. An item's biz type must be the
/// caller's.
fn validate_item(caller: &Caller, state: &AppState, item: &RawValue, now: DateTime<Utc>, traceparent: Option<&str>) -> Result<NewTask, Refused> {
    let request: CreateTask = from_raw(item)?;
    if request.biz_type != caller.0.biz_type {
        return Err(Refused::Foreign(request.biz_type));
    }
    // Only a keyed request can be repeated, so only it needs the hash of the request as sent.
    let request_hash = if request.key.is_some() { tasks::request_hash(item) } else { Vec::new() };
    let mut task = request.validate(request_hash, now, state.max_payload_bytes).map_err(ApiError::from)?;
    task.traceparent = traceparent.map(str::to_owned);
    Ok(task)
}

/// Whether each other biz type that requests named exists: a query per name, only when a
/// request names another biz type.
#[derive(Default)]
struct Foreign(HashMap<String, bool>);

impl Foreign {
    async fn error(&mut self, caller: &Caller, state: &AppState, refused: Refused) -> Result<ApiError, ApiError> {
        let name = match refused {
            Refused::Now(e) => return Ok(e),
            Refused::Foreign(name) => name,
        };
        let exists = match self.0.get(&name) {
            Some(&exists) => exists,
            None => {
                let exists = biz_types::exists(&state.pool, &name).await?;
                self.0.insert(name.clone(), exists);
                exists
            }
        };
        Ok(if exists { caller.forbidden(&name) } else { ApiError::NotFound(format!("no biz type named `{name}`")) })
    }
}

fn check_rate(caller: &Caller, state: &AppState) -> Result<(), ApiError> {
    state.create_limiter.check(caller.0.biz_type_id, caller.0.create_rate_limit).map_err(ApiError::RateLimited)
}

#[utoipa::path(
    post,
    path = "/api/v1/tasks",
    operation_id = "createTask",
    tag = "tasks",
    summary = r#"Schedule a task"#,
    description = r#"Schedules one callback to the biz type's callback URL. Give at most one of `run_at` and `delay_ms`; with neither, the task is due now. `run_at` is an absolute RFC 3339 time (with `Z` or an offset) from 24 hours in the past (a past time fires at once) to 10 years ahead. `delay_ms` is relative: milliseconds from the moment the server accepts the request, measured on the server's clock, so it is immune to skew of the client's clock.

**Idempotency.** Give a `key` to make retries safe: repeating the request with the same `key` and the same body answers **200** with the task created the first time (nothing new is scheduled; the body is compared as JSON, so key order and spacing do not matter, and a repeated `delay_ms` request is a repeat even though time has passed). The same `key` with a different body answers **409** `key_conflict`. A key stays taken while its task is retained.

**When the key is taken** (`on_conflict`): `reject` (the default) is the idempotency above. `replace`: the key's task, if pending, takes this request's `run_at`/`delay_ms`, `payload` and deadline (`expires_at`/`ttl_ms`; none: none) → **200** with the changed task (a debounce: the same `delay_ms` request sent again pushes the task back); if it is running → **409** `task_running`; if it is finished (succeeded, failed, cancelled or expired), a new task takes the key → **201**, and the old one keeps its history (look-up by key answers the new one). `keep`: the key's task as it is → **200**, whatever the body. `on_conflict` is not part of the request compared for a repeat: after a `replace`, the same request sent with `reject` is a repeat (200).

**Deadline.** `expires_at` (a time after the due time) or `ttl_ms` (milliseconds after it) sets a deadline: no callback starts at or after it, and a task not delivered by then (held back by a pause, a backlog, a rate limit or waiting for a retry) ends `expired`.

**Trace context.** A W3C `traceparent` header is kept with the task, and every callback of the task carries a `traceparent` of the same trace.

**Limits.** The payload may be at most the server's payload limit (default 64 KiB) → 413. Each biz type may have a create rate limit (calls per second) → 429 with `Retry-After`. A paused biz type still accepts tasks; they are delivered after it is resumed."#,
    params(("traceparent" = Option<String>, Header, description = r#"W3C Trace Context of the caller (`00-<trace id>-<parent id>-<flags>`), kept with the task; a malformed value is ignored."#)),
    request_body(content = crate::tasks::CreateTask),
    responses(
        (status = 200, description = r#"A task with this key was already created by the same request, or `on_conflict` is `keep`: this is that task, unchanged. Or `on_conflict` is `replace` and the key's task was pending: this is that task, changed."#, body = crate::tasks::Task, example = json!({"id": "01937a4e-8f5c-7cc2-9a54-3c6f1f0b2d11", "biz_type": "order-close", "key": "order-123", "run_at": "2026-11-21T10:00:00Z", "payload": {"order_id": 123}, "status": "pending", "attempt_count": 0, "timer_id": null, "last_error": null, "created_at": "2026-11-21T09:30:00.123456Z", "updated_at": "2026-11-21T09:30:00.123456Z", "finished_at": null})),
        (status = 201, description = r#"The task was created (with `on_conflict: "replace"`, also when the key's task had finished: the key now finds this one)."#, links(("GetTask" = (operation_id = "getTask", parameters(("id" = "$response.body#/id")), description = r#"The `id` in the answer identifies the task in `GET /api/v1/tasks/{id}`."#)), ("UpdateTask" = (operation_id = "updateTask", parameters(("id" = "$response.body#/id")))), ("CancelTask" = (operation_id = "cancelTask", parameters(("id" = "$response.body#/id")))), ("ReplayTask" = (operation_id = "replayTask", parameters(("id" = "$response.body#/id")))), ("GetTaskByKey" = (operation_id = "getTaskByKey", parameters(("name" = "$response.body#/biz_type"), ("key" = "$response.body#/key")), description = r#"A task created with a `key` can be found again by it."#)), ("UpdateTaskByKey" = (operation_id = "updateTaskByKey", parameters(("name" = "$response.body#/biz_type"), ("key" = "$response.body#/key")))), ("CancelTaskByKey" = (operation_id = "cancelTaskByKey", parameters(("name" = "$response.body#/biz_type"), ("key" = "$response.body#/key"))))), body = crate::tasks::Task, example = json!({"id": "01937a4e-8f5c-7cc2-9a54-3c6f1f0b2d11", "biz_type": "order-close", "key": "order-123", "run_at": "2026-11-21T10:00:00Z", "payload": {"order_id": 123}, "status": "pending", "attempt_count": 0, "timer_id": null, "last_error": null, "created_at": "2026-11-21T09:30:00.123456Z", "updated_at": "2026-11-21T09:30:00.123456Z", "finished_at": null})),
        (status = 400, response = super::error::BadBody),
        (status = 401, response = super::error::Unauthenticated),
        (status = 403, description = r#"`biz_type` names another biz type than the token's. Also: the token's biz type is archived, or the token is an admin token (which acts only on `/api/v1/admin/`)."#, body = super::error::Error, example = json!({"error": {"code": "permission_denied", "message": "this token belongs to biz type `order-close`, not `coupon-expiry`"}})),
        (status = 404, description = r#"No biz type has the name given in `biz_type`."#, body = super::error::Error, example = json!({"error": {"code": "not_found", "message": "no biz type named `order-clos`"}})),
        (status = 408, response = super::error::RequestTimeout),
        (status = 409, description = r#"`key_conflict`: the `key` is already taken by a task created with a different request body (`on_conflict` absent or `reject`). `task_running`: `on_conflict` is `replace` and the key's task is running."#, body = super::error::Error, example = json!({"error": {"code": "key_conflict", "message": "key `order-123` is already used by a task created with a different request"}})),
        (status = 413, description = r#"The payload (or the whole body) is larger than the server's limit (default 64 KiB for the payload)."#, body = super::error::Error, example = json!({"error": {"code": "payload_too_large", "message": "payload is 70000 bytes as stored; the limit is 65536"}})),
        (status = 422, description = r#"A field is missing, unknown or invalid (e.g. `run_at` not RFC 3339 or out of range, both `run_at` and `delay_ms` given, `key` empty or too long, `on_conflict` not `reject`, `replace` or `keep`); the message names the field."#, body = super::error::Error, example = json!({"error": {"code": "invalid_argument", "message": "run_at: must be an RFC 3339 time such as 2026-11-21T09:30:00Z (input contains invalid characters)"}})),
        (status = 429, description = r#"The biz type's create rate limit is exceeded; retry after `Retry-After` seconds."#, headers(("Retry-After" = inline(super::error::RetryAfter), description = r#"Whole seconds to wait before trying again (at least 1)."#)), body = super::error::Error, example = json!({"error": {"code": "rate_limited", "message": "create rate limit of this biz type exceeded; retry after 180 ms"}})),
        (status = 500, response = super::error::Internal),
        (status = 503, response = super::error::Unavailable)
    ),
    security(("bearerAuth" = []))
)]
pub async fn create(caller: Caller, state: web::Data<AppState>, req: HttpRequest, body: web::Payload) -> Result<HttpResponse, ApiError> {
    let mut span = CreateSpan::start(&req, "/api/v1/tasks", &caller);
    let answer = create_one(caller, state, req, body, &mut span).await;
    span.answered(&answer);
    answer
}

async fn create_one(
    caller: Caller,
    state: web::Data<AppState>,
    req: HttpRequest,
    body: web::Payload,
    span: &mut CreateSpan,
) -> Result<HttpResponse, ApiError> {
    let body = read_raw_body(body, state.max_payload_bytes + ENVELOPE_BYTES).await?;
    let item = raw_json(&body)?;
    let item = match validate_item(&caller, &state, item, Utc::now(), traceparent(&req).as_deref()) {
        Ok(item) => item,
        Err(refused) => return Err(Foreign::default().error(&caller, &state, refused).await?),
    };
    check_rate(&caller, &state)?;
    match state.creates.create(caller.0.biz_type_id, &caller.0.biz_type, item).await? {
        CreateOutcome::Created(task) => Ok(HttpResponse::Created().json(span.task(task))),
        CreateOutcome::Existing(task) | CreateOutcome::Replaced(task) => Ok(HttpResponse::Ok().json(span.task(task))),
        CreateOutcome::Failed(e) => Err(e.into()),
    }
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = BatchCreate, example = json!({"tasks": [
    {"biz_type": "order-close", "key": "order-123", "delay_ms": 1800000, "payload": {"order_id": 123}},
    {"biz_type": "order-close", "key": "order-124", "run_at": "2026-11-21T10:00:00Z"},
]}))]
pub(super) struct BatchRequest<'a> {
    /// 1 to 1000 create requests, each exactly as for `POST /api/v1/tasks`. Any JSON value is
    /// accepted as an item: one that is not a valid `CreateTask` fails in its own result
    /// (status 422, 404 or 403), not the whole request.
    #[serde(borrow, deserialize_with = "at_most_max_batch")]
    #[schema(value_type = Vec<serde_json::Value>, min_items = 1, max_items = 1000)]
    tasks: Vec<&'a RawValue>,
    /// What each created item's result holds: `tasks` (the default), the whole task;
    /// `ids`, its id only, which makes the answer about 10 times smaller and cheaper to
    /// make and to read. Failed items answer the same either way. null is the same as
    /// leaving it out.
    results: Option<Results>,
}

/// What a batch answers for each created item.
#[derive(Debug, Clone, Copy, Default, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
enum Results {
    /// `{"status": 201, "task": {…}}`
    #[default]
    Tasks,
    /// `{"status": 201, "id": "…"}`
    Ids,
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
#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = BatchResult)]
pub(super) struct BatchAnswer<'a> {
    /// One entry per item of the request, in the same order.
    results: Vec<ItemResult<'a>>,
}

/// Creates up to 1000 tasks. Each item succeeds or fails on its own; the answer lists an
/// outcome per item, in order.
#[utoipa::path(
    post,
    path = "/api/v1/tasks/batch",
    operation_id = "createTasksBatch",
    tag = "tasks",
    summary = r#"Schedule up to 1000 tasks"#,
    description = r#"Creates 1 to 1000 tasks in one call. Each item is handled exactly like a single `POST /api/v1/tasks` and succeeds or fails on its own: the answer is always 200 (once the request itself is valid), with one result per item, in order. Items repeating a key that appeared earlier in the same batch are answered like repeats of that earlier item (200 with the same task if the item is identical or says `on_conflict: "keep"`, 409 otherwise; a `replace` item replaces it, in item order). Each item may carry its own `on_conflict`. The whole call counts once against the create rate limit. The body may be at most 32 MiB.

**A smaller answer.** With `"results": "ids"` beside `tasks`, a created item answers `{"status": 201, "id": "…"}` (or 200 for a repeat) instead of the whole task: about a tenth of the bytes, for clients that keep only the ids. Failed items answer the same either way."#,
    params(("traceparent" = Option<String>, Header, description = r#"W3C Trace Context of the caller, kept with every task of the batch; a malformed value is ignored."#)),
    request_body(content = BatchRequest),
    responses(
        (status = 200, description = r#"One result per item, in order."#, body = BatchAnswer),
        (status = 400, response = super::error::BadBody),
        (status = 401, response = super::error::Unauthenticated),
        (status = 403, description = r#"The token's biz type is archived, or the token is an admin token (which acts only on `/api/v1/admin/`)."#, body = super::error::Error, example = json!({"error": {"code": "permission_denied", "message": "biz type `orders` is archived: its tokens no longer work"}})),
        (status = 408, response = super::error::RequestTimeout),
        (status = 413, description = r#"The request body is larger than 32 MiB (or than 1000 times the payload limit plus 4 KiB, if that is less)."#, body = super::error::Error, example = json!({"error": {"code": "payload_too_large", "message": "request body is larger than 33554432 bytes"}})),
        (status = 422, description = r#"`tasks` is missing, not an array, empty or longer than 1000, `results` is neither `tasks` nor `ids`, or the body has another field. (Invalid items do not fail the request; they fail in their result.)"#, body = super::error::Error, example = json!({"error": {"code": "invalid_argument", "message": "tasks: must hold 1 to 1000 items, not 0"}})),
        (status = 429, description = r#"The biz type's create rate limit is exceeded; nothing was created. Retry after `Retry-After` seconds."#, headers(("Retry-After" = inline(super::error::RetryAfter), description = r#"Whole seconds to wait before trying again (at least 1)."#)), body = super::error::Error, example = json!({"error": {"code": "rate_limited", "message": "create rate limit of this biz type exceeded; retry after 180 ms"}})),
        (status = 500, response = super::error::Internal),
        (status = 503, response = super::error::Unavailable)
    ),
    security(("bearerAuth" = []))
)]
pub async fn create_batch(caller: Caller, state: web::Data<AppState>, req: HttpRequest, body: web::Payload) -> Result<HttpResponse, ApiError> {
    let mut span = CreateSpan::start(&req, "/api/v1/tasks/batch", &caller);
    let answer = create_many(caller, state, req, body, &mut span).await;
    span.answered(&answer);
    answer
}

async fn create_many(
    caller: Caller,
    state: web::Data<AppState>,
    req: HttpRequest,
    body: web::Payload,
    span: &mut CreateSpan,
) -> Result<HttpResponse, ApiError> {
    // Whatever the payload limit, the body need not hold more than a thousand of them (and
    // memory follows the body: payloads stay text).
    let limit = MAX_BATCH_BODY.min(MAX_BATCH * (state.max_payload_bytes + ENVELOPE_BYTES));
    let body = read_raw_body(body, limit).await?;
    let request: BatchRequest = from_raw(raw_json(&body)?)?;
    if request.tasks.is_empty() {
        return Err(ApiError::Invalid(format!("tasks: must hold 1 to {MAX_BATCH} items, not 0")));
    }
    check_rate(&caller, &state)?;
    let now = Utc::now();
    let traceparent = traceparent(&req);
    // Invalid items are answered on their own; the valid ones go to the database together.
    let mut valid: Vec<NewTask> = Vec::with_capacity(request.tasks.len());
    let mut refused: Vec<Option<Refused>> = Vec::with_capacity(request.tasks.len());
    for item in request.tasks {
        match validate_item(&caller, &state, item, now, traceparent.as_deref()) {
            Ok(task) => {
                valid.push(task);
                refused.push(None);
            }
            Err(e) => refused.push(Some(e)),
        }
    }
    let results = request.results.unwrap_or_default();
    // The valid payloads are copied out of the body; it is no longer needed.
    drop(body);
    let mut foreign = Foreign::default();
    let mut invalid: Vec<Option<ApiError>> = Vec::with_capacity(refused.len());
    for r in refused {
        invalid.push(match r {
            Some(r) => Some(foreign.error(&caller, &state, r).await?),
            None => None,
        });
    }
    let mut outcomes = tasks::create_batch(&state.pool, caller.0.biz_type_id, &caller.0.biz_type, &mut valid).await?.into_iter();
    let outcomes: Vec<Result<(u16, tasks::Task), ApiError>> = invalid
        .into_iter()
        .map(|invalid| match invalid {
            Some(e) => Err(e),
            None => match outcomes.next().expect("one outcome per valid item") {
                CreateOutcome::Created(task) => Ok((201, task)),
                CreateOutcome::Existing(task) | CreateOutcome::Replaced(task) => Ok((200, task)),
                CreateOutcome::Failed(e) => Err(e.into()),
            },
        })
        .collect();
    span.tasks(outcomes.iter().filter(|o| o.is_ok()).count());
    let results: Vec<ItemResult> = outcomes
        .iter()
        .enumerate()
        .map(|(i, outcome)| match (outcome, results) {
            (Ok((status, task)), Results::Tasks) => ItemResult::Created(BatchItemCreated { status: *status, task }),
            (Ok((status, task)), Results::Ids) => ItemResult::Id(BatchItemId { status: *status, id: task.id }),
            (Err(e), _) => item_error(i, e),
        })
        .collect();
    Ok(HttpResponse::Ok().json(BatchAnswer { results }))
}

fn item_error(index: usize, e: &ApiError) -> ItemResult<'static> {
    use actix_web::ResponseError;
    let mut error = e.body();
    error.message = format!("tasks[{index}]: {e}");
    ItemResult::Failed(BatchItemFailed { status: e.status_code().as_u16(), error })
}

#[utoipa::path(
    get,
    path = "/api/v1/tasks/{id}",
    operation_id = "getTask",
    tag = "tasks",
    summary = r#"Get a task with its last attempts"#,
    description = r#"One task of the token's biz type, in any state, with its last 100 delivery attempts and how many it has had (`attempt_total`); `GET /api/v1/tasks/{id}/attempts` pages through all of them."#,
    params(
        ("id" = Uuid, Path, description = r#"The task's id."#)
    ),
    responses(
        (status = 200, description = r#"The task and its attempts."#, body = TaskWithAttempts),
        (status = 400, description = r#"The `id` in the path is not a UUID."#, body = super::error::Error, example = json!({"error": {"code": "bad_request", "message": "`42` is not a task id (a UUID)"}})),
        (status = 401, response = super::error::Unauthenticated),
        (status = 403, description = r#"The task belongs to another biz type than the token's. Also: the token's biz type is archived, or the token is an admin token (which acts only on `/api/v1/admin/`)."#, body = super::error::Error, example = json!({"error": {"code": "permission_denied", "message": "this task belongs to another biz type"}})),
        (status = 404, description = r#"No task has this id."#, body = super::error::Error, example = json!({"error": {"code": "not_found", "message": "no task with id 01937a4e-8f5c-7cc2-9a54-3c6f1f0b2d11"}})),
        (status = 500, response = super::error::Internal),
        (status = 503, response = super::error::Unavailable)
    ),
    security(("bearerAuth" = []))
)]
pub async fn get(caller: Caller, state: web::Data<AppState>, id: web::Path<String>) -> Result<HttpResponse, ApiError> {
    let id = parse_id(&id)?;
    let (task, attempts) = tasks::get(&state.pool, id).await?.ok_or_else(|| ApiError::NotFound(format!("no task with id {id}")))?;
    if task.biz_type_id != caller.0.biz_type_id {
        return Err(ApiError::Forbidden("this task belongs to another biz type".into()));
    }
    let attempt_total = tasks::attempt_total(&state.pool, id).await?;
    Ok(HttpResponse::Ok().json(TaskWithAttempts { task: &task, attempts: &attempts, attempt_total }))
}

#[utoipa::path(
    get,
    path = "/api/v1/biz-types/{name}/tasks/by-key/{key}",
    operation_id = "getTaskByKey",
    tag = "tasks",
    summary = r#"Find a task by its client key"#,
    description = r#"The task created with this `key` in this biz type, in any state (without attempts; get it by id for those)."#,
    params(
        ("name" = String, Path, description = r#"The biz type's name; must be the token's biz type."#, pattern = r#"^[a-z0-9][a-z0-9_-]{0,63}$"#),
        ("key" = String, Path, description = r#"The client key given at creation, percent-encoded (it may contain `/`)."#, min_length = 1, max_length = 256, pattern = r#"^[^\u0000-\u001f\u007f-\u009f]+$"#)
    ),
    responses(
        (status = 200, description = r#"The task holding this key."#, body = crate::tasks::Task),
        (status = 401, response = super::error::Unauthenticated),
        (status = 403, description = r#"`name` is another biz type than the token's. Also: the token's biz type is archived, or the token is an admin token (which acts only on `/api/v1/admin/`)."#, body = super::error::Error, example = json!({"error": {"code": "permission_denied", "message": "this token belongs to biz type `order-close`, not `coupon-expiry`"}})),
        (status = 404, description = r#"No biz type has this name, or no task of it has this key."#, body = super::error::Error, example = json!({"error": {"code": "not_found", "message": "no task with key `order-123` in biz type `order-close`"}})),
        (status = 422, description = r#"The key is one a create would refuse (empty, over 256 bytes, control characters, not UTF-8 once percent-decoded)."#, body = super::error::Error, example = json!({"error": {"code": "invalid_argument", "message": "key: must be 1 to 256 bytes"}})),
        (status = 500, response = super::error::Internal),
        (status = 503, response = super::error::Unavailable)
    ),
    security(("bearerAuth" = []))
)]
pub async fn get_by_key(
    caller: Caller,
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    let (name, key) = key_path(&caller, &state, &req, path).await?;
    let task = tasks::get_by_key(&state.pool, caller.0.biz_type_id, &key)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("no task with key `{}` in biz type `{name}`", key.escape_debug())))?;
    Ok(HttpResponse::Ok().json(task))
}

// The states a list may be narrowed to. Only the document uses this type (`tasks` checks the
// value); it can give way to the task store's own status type once that derives `ToSchema`.
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

#[utoipa::path(
    get,
    path = "/api/v1/tasks",
    operation_id = "listTasks",
    tag = "tasks",
    summary = r#"List tasks"#,
    description = r#"Lists the token's biz type's tasks in `run_at` order (ties by `id`), a page at a time. Pagination is by cursor (keyset): pass the previous page's `next_cursor` as `cursor`, with the same filters, until `next_cursor` is null. A page holds at most `limit` tasks, and fewer (at least one) where they would take more than about 2 MiB: page on until `next_cursor` is null, not until a page is short. Pages stay consistent while new tasks are added. Remember to percent-encode `+` in time offsets (`%2B08:00`)."#,
    params(
        ("biz_type" = Option<String>, Query, description = r#"Optional; if given, must be the token's biz type (403 for another, 404 for an unknown name). Lists always cover the token's biz type only."#, pattern = r#"^[a-z0-9][a-z0-9_-]{0,63}$"#),
        ("status" = Option<tasks::Status>, Query, description = r#"Only tasks in this state."#),
        ("from" = Option<DateTime<Utc>>, Query, description = r#"Only tasks with `run_at` at or after this time (RFC 3339)."#),
        ("to" = Option<DateTime<Utc>>, Query, description = r#"Only tasks with `run_at` before this time (RFC 3339)."#),
        ("limit" = Option<i64>, Query, description = r#"Page size."#, minimum = 1, maximum = 1000, example = 100),
        ("cursor" = Option<String>, Query, description = r#"The `next_cursor` of the previous page (opaque). Leave the parameter out for the first page."#, min_length = 1)
    ),
    responses(
        (status = 200, description = r#"One page of tasks."#, body = ListAnswer),
        (status = 401, response = super::error::Unauthenticated),
        (status = 403, description = r#"`biz_type` names another biz type than the token's. Also: the token's biz type is archived, or the token is an admin token (which acts only on `/api/v1/admin/`)."#, body = super::error::Error, example = json!({"error": {"code": "permission_denied", "message": "this token belongs to biz type `order-close`, not `coupon-expiry`"}})),
        (status = 404, description = r#"No biz type has the name given in `biz_type`."#, body = super::error::Error, example = json!({"error": {"code": "not_found", "message": "no biz type named `order-clos`"}})),
        (status = 422, description = r#"A query parameter is unknown, repeated or invalid (bad `status`, `limit` outside 1–1000, `from`/`to` not RFC 3339, `cursor` not from this API)."#, body = super::error::Error, example = json!({"error": {"code": "invalid_argument", "message": "limit: must be a whole number from 1 to 1000"}})),
        (status = 500, response = super::error::Internal),
        (status = 503, response = super::error::Unavailable)
    ),
    security(("bearerAuth" = []))
)]
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
        ..ListFilter::default()
    };
    let page = tasks::list(&state.pool, Some(caller.0.biz_type_id), &filter).await?;
    Ok(HttpResponse::Ok().json(ListAnswer { items: &page.items, next_cursor: page.next_cursor.as_deref() }))
}

/// A page of tasks, written out as it is serialised: a `json!` value would parse every
/// payload into a tree.
#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = TaskList, description = "A page of tasks, by `run_at`.")]
pub(super) struct ListAnswer<'a> {
    items: &'a [tasks::Task],
    /// Pass as `cursor` to get the next page; null on the last page.
    #[schema(required = true)]
    next_cursor: Option<&'a str>,
}

/// What to change in a pending task: its due time (`run_at` or `delay_ms`, not both), its
/// payload, its priority; at least one must be given. A time field that is left out or null is
/// kept; a payload that is left out is kept, and `"payload": null` sets it to null.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = PatchTask, example = json!({"delay_ms": 600000}))]
pub(super) struct PatchRequest<'a> {
    /// New absolute due time, RFC 3339, from 24 hours ago to 10 years ahead.
    #[schema(format = DateTime)]
    run_at: Option<String>,
    /// New due time as milliseconds from now (server clock), 0 to 10 years.
    #[schema(minimum = 0, maximum = 316_224_000_000_i64)]
    delay_ms: Option<i64>,
    /// New payload, replacing the old one whole (any JSON value, null included). Same size
    /// limit as at creation.
    // `Some(null)` when the client sets the payload to null, `None` when absent.
    #[serde(default, borrow, deserialize_with = "present")]
    #[schema(value_type = serde_json::Value)]
    payload: Option<&'a RawValue>,
    /// New priority, 0 to 9 (9 the most urgent).
    #[schema(minimum = 0, maximum = 9)]
    priority: Option<i64>,
}

fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<&'de RawValue>, D::Error> {
    <&RawValue>::deserialize(d).map(Some)
}

#[utoipa::path(
    patch,
    path = "/api/v1/tasks/{id}",
    operation_id = "updateTask",
    tag = "tasks",
    summary = r#"Reschedule a pending task, replace its payload or change its priority"#,
    description = r#"Changes the due time (`run_at` or `delay_ms`, as at creation), the priority, and/or replaces the payload of a **pending** task; a running or finished task answers 409. The attempt count, last error and key stay as they are (a later create repeating the original request still answers 200 with this task). Recorded in the audit log (`task.reschedule`: the new due time, and whether the payload was replaced)."#,
    params(
        ("id" = Uuid, Path, description = r#"The task's id."#)
    ),
    request_body(content = PatchRequest),
    responses(
        (status = 200, description = r#"The task as changed."#, body = crate::tasks::Task),
        (status = 400, description = r#"The `id` is not a UUID, or the body is empty or not valid JSON."#, body = super::error::Error, example = json!({"error": {"code": "bad_request", "message": "`42` is not a task id (a UUID)"}})),
        (status = 401, response = super::error::Unauthenticated),
        (status = 403, description = r#"The task belongs to another biz type than the token's. Also: the token's biz type is archived, or the token is an admin token (which acts only on `/api/v1/admin/`)."#, body = super::error::Error, example = json!({"error": {"code": "permission_denied", "message": "this task belongs to another biz type"}})),
        (status = 404, description = r#"No task has this id."#, body = super::error::Error, example = json!({"error": {"code": "not_found", "message": "no task with id 01937a4e-8f5c-7cc2-9a54-3c6f1f0b2d11"}})),
        (status = 408, response = super::error::RequestTimeout),
        (status = 409, description = r#"The task is not pending (it is running or finished)."#, body = super::error::Error, example = json!({"error": {"code": "invalid_state", "message": "only a pending task can be changed; this one is succeeded"}})),
        (status = 413, description = r#"The new payload is larger than the server's limit (default 64 KiB)."#, body = super::error::Error, example = json!({"error": {"code": "payload_too_large", "message": "payload is 70000 bytes as stored; the limit is 65536"}})),
        (status = 422, description = r#"Nothing to change, both `run_at` and `delay_ms` given, a time invalid or out of range, a priority outside 0-9, a time at or after the task's deadline (`expires_at`: no callback starts then), or an unknown field; the message names the field."#, body = super::error::Error, example = json!({"error": {"code": "invalid_argument", "message": "give run_at, delay_ms, payload or priority to change"}})),
        (status = 500, response = super::error::Internal),
        (status = 503, response = super::error::Unavailable)
    ),
    security(("bearerAuth" = []))
)]
pub async fn reschedule(caller: Caller, state: web::Data<AppState>, id: web::Path<String>, body: web::Payload) -> Result<HttpResponse, ApiError> {
    let id = parse_id(&id)?;
    patch(&caller, &state, tasks::Target::Id(id), body).await
}

/// A PATCH of the task found by id or by key: the body checked, then the change made.
async fn patch(caller: &Caller, state: &AppState, target: tasks::Target<'_>, body: web::Payload) -> Result<HttpResponse, ApiError> {
    let body = read_raw_body(body, state.max_payload_bytes + ENVELOPE_BYTES).await?;
    let request: PatchRequest = from_raw(raw_json(&body)?)?;
    if request.run_at.is_none() && request.delay_ms.is_none() && request.payload.is_none() && request.priority.is_none() {
        return Err(ApiError::Invalid("give run_at, delay_ms, payload or priority to change".into()));
    }
    let priority = request.priority.map(tasks::validate_priority).transpose()?;
    let when = match (&request.run_at, request.delay_ms) {
        (None, None) => None,
        (run_at, delay) => Some(When::parse(run_at.as_deref(), delay, Utc::now())?),
    };
    if let Some(payload) = request.payload {
        tasks::check_payload(payload, state.max_payload_bytes)?;
    }
    let changes = tasks::Reschedule { when, payload: request.payload, priority };
    let task = tasks::reschedule_target(&state.pool, caller.0.biz_type_id, target, changes, &caller.actor()).await?;
    Ok(HttpResponse::Ok().json(task))
}

/// The biz type and key of a by-key path, checked: the biz type must be the caller's (403,
/// or 404 if there is none), the key one a create would take (422). The key is decoded from
/// the path as sent: bytes that are not UTF-8 are refused, where the router would read them
/// as U+FFFD and look up a key nobody sent.
async fn key_path(caller: &Caller, state: &AppState, req: &HttpRequest, path: web::Path<(String, String)>) -> Result<(String, String), ApiError> {
    let (name, _) = path.into_inner();
    caller.require(state, &name).await?;
    // A biz type's name has no `/`: the first `/by-key/` is the one before the key.
    let raw = req.uri().path().split_once("/by-key/").map_or("", |(_, key)| key);
    let key = percent_encoding::percent_decode_str(raw)
        .decode_utf8()
        .map_err(|_| ApiError::Invalid("key: must be UTF-8 once percent-decoded".into()))?
        .into_owned();
    tasks::validate_key(&key)?;
    Ok((name, key))
}

#[utoipa::path(
    patch,
    path = "/api/v1/biz-types/{name}/tasks/by-key/{key}",
    operation_id = "updateTaskByKey",
    tag = "tasks",
    summary = r#"Reschedule a pending task, or replace its payload, by its client key"#,
    description = r#"Exactly `PATCH /api/v1/tasks/{id}` (same body, same answers), of the task holding `key` in this biz type (the newest one, when `on_conflict: "replace"` gave the key to a new task). One call where a look-up by key and a PATCH by id would be two, with a race between them."#,
    params(
        ("name" = String, Path, description = r#"The biz type's name; must be the token's biz type."#, pattern = r#"^[a-z0-9][a-z0-9_-]{0,63}$"#),
        ("key" = String, Path, description = r#"The client key given at creation, percent-encoded (it may contain `/`)."#, min_length = 1, max_length = 256, pattern = r#"^[^\u0000-\u001f\u007f-\u009f]+$"#)
    ),
    request_body(content = PatchRequest),
    responses(
        (status = 200, description = r#"The task as changed."#, body = crate::tasks::Task),
        (status = 400, response = super::error::BadBody),
        (status = 401, response = super::error::Unauthenticated),
        (status = 403, description = r#"`name` is another biz type than the token's. Also: the token's biz type is archived, or the token is an admin token (which acts only on `/api/v1/admin/`)."#, body = super::error::Error, example = json!({"error": {"code": "permission_denied", "message": "this token belongs to biz type `order-close`, not `coupon-expiry`"}})),
        (status = 404, description = r#"No biz type has this name, or no task of it has this key."#, body = super::error::Error, example = json!({"error": {"code": "not_found", "message": "no task with key `order-123` in this biz type"}})),
        (status = 408, response = super::error::RequestTimeout),
        (status = 409, description = r#"The task is not pending (it is running or finished): `invalid_state`."#, body = super::error::Error, example = json!({"error": {"code": "invalid_state", "message": "only a pending task can be changed; this one is succeeded"}})),
        (status = 413, description = r#"The new payload is larger than the server's limit (default 64 KiB)."#, body = super::error::Error, example = json!({"error": {"code": "payload_too_large", "message": "payload is 70000 bytes as stored; the limit is 65536"}})),
        (status = 422, description = r#"The key is one a create would refuse (empty, over 256 bytes, control characters), nothing to change, both `run_at` and `delay_ms` given, a time invalid or out of range, or an unknown field; the message names the field."#, body = super::error::Error, example = json!({"error": {"code": "invalid_argument", "message": "key: must not contain control characters"}})),
        (status = 500, response = super::error::Internal),
        (status = 503, response = super::error::Unavailable)
    ),
    security(("bearerAuth" = []))
)]
pub async fn reschedule_by_key(
    caller: Caller,
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<(String, String)>,
    body: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let (_, key) = key_path(&caller, &state, &req, path).await?;
    patch(&caller, &state, tasks::Target::Key(&key), body).await
}

#[utoipa::path(
    delete,
    path = "/api/v1/biz-types/{name}/tasks/by-key/{key}",
    operation_id = "cancelTaskByKey",
    tag = "tasks",
    summary = r#"Cancel a pending task by its client key"#,
    description = r#"Exactly `DELETE /api/v1/tasks/{id}` (same answers), of the task holding `key` in this biz type (the newest one, when `on_conflict: "replace"` gave the key to a new task): "the order was paid: cancel its close-timer" in one call. Recorded in the audit log like a cancel by id."#,
    params(
        ("name" = String, Path, description = r#"The biz type's name; must be the token's biz type."#, pattern = r#"^[a-z0-9][a-z0-9_-]{0,63}$"#),
        ("key" = String, Path, description = r#"The client key given at creation, percent-encoded (it may contain `/`)."#, min_length = 1, max_length = 256, pattern = r#"^[^\u0000-\u001f\u007f-\u009f]+$"#)
    ),
    responses(
        (status = 200, description = r#"The cancelled task."#, body = crate::tasks::Task),
        (status = 401, response = super::error::Unauthenticated),
        (status = 403, description = r#"`name` is another biz type than the token's. Also: the token's biz type is archived, or the token is an admin token (which acts only on `/api/v1/admin/`)."#, body = super::error::Error, example = json!({"error": {"code": "permission_denied", "message": "this token belongs to biz type `order-close`, not `coupon-expiry`"}})),
        (status = 404, description = r#"No biz type has this name, or no task of it has this key."#, body = super::error::Error, example = json!({"error": {"code": "not_found", "message": "no task with key `order-123` in this biz type"}})),
        (status = 409, description = r#"The task is running or already finished: `invalid_state`."#, body = super::error::Error, example = json!({"error": {"code": "invalid_state", "message": "only a pending task can be cancelled; this one is running"}})),
        (status = 422, description = r#"The key is one a create would refuse (empty, over 256 bytes, control characters, not UTF-8 once percent-decoded)."#, body = super::error::Error, example = json!({"error": {"code": "invalid_argument", "message": "key: must be 1 to 256 bytes"}})),
        (status = 500, response = super::error::Internal),
        (status = 503, response = super::error::Unavailable)
    ),
    security(("bearerAuth" = []))
)]
pub async fn cancel_by_key(
    caller: Caller,
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    let (_, key) = key_path(&caller, &state, &req, path).await?;
    let task = tasks::cancel_target(&state.pool, caller.0.biz_type_id, tasks::Target::Key(&key), &caller.actor()).await?;
    Ok(HttpResponse::Ok().json(task))
}

#[utoipa::path(
    delete,
    path = "/api/v1/tasks/{id}",
    operation_id = "cancelTask",
    tag = "tasks",
    summary = r#"Cancel a pending task"#,
    description = r#"Cancels a **pending** task so it never fires, and answers with it (status `cancelled`). A task that is running or already finished answers 409. The task stays visible (and its key taken) while retained; a cancelled task can be replayed."#,
    params(
        ("id" = Uuid, Path, description = r#"The task's id."#)
    ),
    responses(
        (status = 200, description = r#"The cancelled task."#, body = crate::tasks::Task),
        (status = 400, description = r#"The `id` in the path is not a UUID."#, body = super::error::Error, example = json!({"error": {"code": "bad_request", "message": "`42` is not a task id (a UUID)"}})),
        (status = 401, response = super::error::Unauthenticated),
        (status = 403, description = r#"The task belongs to another biz type than the token's. Also: the token's biz type is archived, or the token is an admin token (which acts only on `/api/v1/admin/`)."#, body = super::error::Error, example = json!({"error": {"code": "permission_denied", "message": "this task belongs to another biz type"}})),
        (status = 404, description = r#"No task has this id."#, body = super::error::Error, example = json!({"error": {"code": "not_found", "message": "no task with id 01937a4e-8f5c-7cc2-9a54-3c6f1f0b2d11"}})),
        (status = 409, description = r#"The task is running or already finished."#, body = super::error::Error, example = json!({"error": {"code": "invalid_state", "message": "only a pending task can be cancelled; this one is running"}})),
        (status = 500, response = super::error::Internal),
        (status = 503, response = super::error::Unavailable)
    ),
    security(("bearerAuth" = []))
)]
pub async fn cancel(caller: Caller, state: web::Data<AppState>, id: web::Path<String>) -> Result<HttpResponse, ApiError> {
    let id = parse_id(&id)?;
    let task = tasks::cancel(&state.pool, caller.0.biz_type_id, id, &caller.actor()).await?;
    Ok(HttpResponse::Ok().json(task))
}

#[utoipa::path(
    post,
    path = "/api/v1/tasks/{id}/replay",
    operation_id = "replayTask",
    tag = "tasks",
    summary = r#"Replay a finished task"#,
    description = r#"Puts a failed, succeeded, cancelled or expired task back to `pending`, due now, with its attempt count reset to 0 and last error cleared; the earlier attempts stay in its history. The deadline (`expires_at`) is cleared too: it was the original delivery's, and a replay is delivered whenever it gets through. A pending or running task answers 409. No request body is needed."#,
    params(
        ("id" = Uuid, Path, description = r#"The task's id."#)
    ),
    responses(
        (status = 200, description = r#"The task, pending again."#, body = crate::tasks::Task),
        (status = 400, description = r#"The `id` in the path is not a UUID."#, body = super::error::Error, example = json!({"error": {"code": "bad_request", "message": "`42` is not a task id (a UUID)"}})),
        (status = 401, response = super::error::Unauthenticated),
        (status = 403, description = r#"The task belongs to another biz type than the token's. Also: the token's biz type is archived, or the token is an admin token (which acts only on `/api/v1/admin/`)."#, body = super::error::Error, example = json!({"error": {"code": "permission_denied", "message": "this task belongs to another biz type"}})),
        (status = 404, description = r#"No task has this id."#, body = super::error::Error, example = json!({"error": {"code": "not_found", "message": "no task with id 01937a4e-8f5c-7cc2-9a54-3c6f1f0b2d11"}})),
        (status = 409, description = r#"The task is pending or running, so there is nothing to replay."#, body = super::error::Error, example = json!({"error": {"code": "invalid_state", "message": "only a finished task can be replayed; this one is pending"}})),
        (status = 500, response = super::error::Internal),
        (status = 503, response = super::error::Unavailable)
    ),
    security(("bearerAuth" = []))
)]
pub async fn replay(caller: Caller, state: web::Data<AppState>, id: web::Path<String>) -> Result<HttpResponse, ApiError> {
    let id = parse_id(&id)?;
    let task = tasks::replay(&state.pool, caller.0.biz_type_id, id, &caller.actor()).await?;
    Ok(HttpResponse::Ok().json(task))
}
