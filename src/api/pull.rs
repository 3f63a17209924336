//! Pull delivery endpoints: reserve (long-polling), ack, nack, touch.

use std::time::Duration;

use actix_web::{HttpResponse, web};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;
use utoipa::ToSchema;
use uuid::Uuid;

use super::auth::Caller;
use super::{ApiError, from_json, read_optional_json};
use crate::biz_types::{self, BizType};
use crate::metrics;
use crate::pull::{self, Turn, Verdict};
use crate::state::AppState;
use crate::tasks::lease;

const MAX_RESERVE: i64 = 100;
const MAX_WAIT_MS: u64 = 30_000;
const MAX_TTR_MS: i64 = 24 * 3600 * 1000;
/// Longest a waiting reserve sleeps without looking, in case a wake-up was missed.
const POLL_FALLBACK: Duration = Duration::from_secs(1);
const BODY_LIMIT: usize = 16 * 1024;

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct ReserveRequest {
    /// Most tasks to reserve.
    #[schema(minimum = 1, maximum = 100, default = 1)]
    max: Option<i64>,
    /// How long to wait for a due task when none is.
    #[schema(minimum = 0, maximum = 30000, default = 0)]
    wait_ms: Option<u64>,
    /// Time to run: how long each task stays reserved. Default: the biz type's timeout.
    #[schema(minimum = 1, maximum = 86_400_000)]
    ttr_ms: Option<i64>,
}

/// The answer to a reserve: the tasks reserved, none if none came due in time.
#[derive(Serialize, ToSchema)]
#[schema(as = Reserved)]
pub(super) struct ReserveAnswer {
    tasks: Vec<lease::Reserved>,
}

/// The answer to a touch: until when the task is reserved.
#[derive(Serialize, ToSchema)]
pub(super) struct Touched {
    id: Uuid,
    reserved_until: DateTime<Utc>,
}

async fn pull_biz_type(caller: &Caller, state: &AppState, name: &str) -> Result<BizType, ApiError> {
    caller.require(state, name).await?;
    let biz = biz_types::by_name(&state.pool, name).await?.ok_or_else(|| ApiError::NotFound(format!("no biz type named `{name}`")))?;
    if biz.mode != "pull" {
        return Err(ApiError::Conflict(
            super::error::Conflict::InvalidState,
            format!("biz type `{name}` delivers by callback; set its mode to pull to reserve its tasks"),
        ));
    }
    Ok(biz)
}

fn ttr(raw: Option<i64>, biz: &BizType) -> Result<i64, ApiError> {
    match raw {
        None => Ok(i64::from(biz.timeout_ms)),
        Some(ms) if (1..=MAX_TTR_MS).contains(&ms) => Ok(ms),
        Some(_) => Err(ApiError::Invalid(format!("ttr_ms: must be between 1 and {MAX_TTR_MS} (a day)"))),
    }
}

/// Up to `max` due tasks, each leased for its time to run. When none is due, waits up to
/// `wait_ms`, woken by the same notifications as the engine and by the next task's due
/// time, and answers as soon as one can be reserved.
#[utoipa::path(
    post,
    path = "/api/v1/biz-types/{name}/reserve",
    operation_id = "reserveTasks",
    tag = "pull",
    summary = r#"Reserve due tasks (pull delivery)"#,
    description = r#"Leases up to `max` due tasks of a pull-mode biz type for `ttr_ms` (default: the biz type's timeout). While a task is reserved no other consumer gets it; ack, nack or touch it with its `receipt` before the time to run passes, or it goes back to pending (a failed attempt) and the receipt is stale. When none is due, waits up to `wait_ms` and answers as soon as one is. The biz type's rate limit, in-flight limit (reserved and not settled, whole cluster) and pause apply. The body may be empty."#,
    params(
        ("name" = String, Path, description = r#"A biz type in pull mode (the token's)."#)
    ),
    request_body(content = Option<ReserveRequest>),
    responses(
        (status = 200, description = r#"The reserved tasks (possibly none)."#, links(("AckTask" = (operation_id = "ackTask", parameters(("id" = "$response.body#/tasks/0/id")), description = r#"Each reserved task is settled by its `id` and `receipt`; this link follows the first."#)), ("NackTask" = (operation_id = "nackTask", parameters(("id" = "$response.body#/tasks/0/id")))), ("TouchTask" = (operation_id = "touchTask", parameters(("id" = "$response.body#/tasks/0/id"))))), body = ReserveAnswer),
        (status = 400, description = r#"The body is not valid JSON."#, body = super::error::Error, example = json!({"error": {"code": "bad_request", "message": "request body is not valid JSON: expected value at line 1 column 1"}})),
        (status = 401, response = super::error::Unauthenticated),
        (status = 403, description = r#"The biz type is not the token's. Also: the token's biz type is archived, or the token is an admin token (which acts only on `/api/v1/admin/`)."#, body = super::error::Error, example = json!({"error": {"code": "permission_denied", "message": "this token belongs to biz type `jobs`, not `billing`"}})),
        (status = 404, description = r#"No biz type has this name."#, body = super::error::Error, example = json!({"error": {"code": "not_found", "message": "no biz type named `billing`"}})),
        (status = 408, response = super::error::RequestTimeout),
        (status = 409, description = r#"The biz type delivers by callback."#, body = super::error::Error, example = json!({"error": {"code": "invalid_state", "message": "biz type `hooks` delivers by callback; set its mode to pull to reserve its tasks"}})),
        (status = 413, response = super::error::BodyOver16KiB),
        (status = 422, description = r#"A field is invalid; the message names it."#, body = super::error::Error, example = json!({"error": {"code": "invalid_argument", "message": "max: must be between 1 and 100"}})),
        (status = 500, response = super::error::Internal),
        (status = 503, response = super::error::Unavailable)
    ),
    security(("bearerAuth" = []))
)]
pub async fn reserve(caller: Caller, state: web::Data<AppState>, name: web::Path<String>, body: web::Payload) -> Result<HttpResponse, ApiError> {
    let request: ReserveRequest = match read_optional_json(body, BODY_LIMIT).await? {
        Some(value) => from_json(value)?,
        None => ReserveRequest { max: None, wait_ms: None, ttr_ms: None },
    };
    let biz = pull_biz_type(&caller, &state, &name).await?;
    let max = request.max.unwrap_or(1);
    if !(1..=MAX_RESERVE).contains(&max) {
        return Err(ApiError::Invalid(format!("max: must be between 1 and {MAX_RESERVE}")));
    }
    let wait_ms = request.wait_ms.unwrap_or(0);
    if wait_ms > MAX_WAIT_MS {
        return Err(ApiError::Invalid(format!("wait_ms: must be between 0 and {MAX_WAIT_MS}")));
    }
    let ttr_ms = ttr(request.ttr_ms, &biz)?;
    if wait_ms == 0 {
        // Not waiting: look now, whatever other reserves found a moment ago, so that a task
        // created just before is found.
        let tasks = look(&state, &biz, max, ttr_ms).await?.unwrap_or_default();
        return Ok(HttpResponse::Ok().json(ReserveAnswer { tasks }));
    }
    let deadline = Instant::now() + Duration::from_millis(wait_ms);
    // A look another waiter made may answer this one: any task that became due since it
    // looked sent a wake-up, which makes the next waiter in the line look again.
    let line = state.pull_waiters.line(biz.id);
    let mut fresh = Some(biz);
    loop {
        // Registered before looking, so a notification that comes while we look still wakes us.
        let woken = line.woken();
        tokio::pin!(woken);
        woken.as_mut().enable();

        let turn = line
            .look(async || {
                // Pausing, resuming or a changed limit applies to a waiting reserve too.
                let biz = match fresh.take() {
                    Some(biz) => biz,
                    None => pull_biz_type(&caller, &state, &name).await?,
                };
                look(&state, &biz, max, ttr_ms).await
            })
            .await?;
        // Read at the request's start: fresh for its first turn only.
        fresh = None;
        let again = match turn {
            Turn::Found(tasks) => return Ok(HttpResponse::Ok().json(ReserveAnswer { tasks })),
            Turn::Nothing(again) => again,
        };
        if Instant::now() >= deadline {
            return Ok(HttpResponse::Ok().json(ReserveAnswer { tasks: Vec::new() }));
        }
        tokio::select! {
            _ = &mut woken => {}
            _ = tokio::time::sleep_until(again.min(deadline)) => {}
        }
    }
}

/// One look for due tasks to reserve: the tasks reserved (never none), or how long until
/// one may be (the next due time, the rate limit, or the poll in case a wake-up was missed).
async fn look(state: &AppState, biz: &BizType, max: i64, ttr_ms: i64) -> Result<Result<Vec<lease::Reserved>, Duration>, ApiError> {
    if biz.paused {
        return Ok(Err(POLL_FALLBACK));
    }
    let mut sleep_for = POLL_FALLBACK;
    let room = i64::from(biz.max_in_flight) - lease::leased_count(&state.pool, biz.id).await?;
    let mut want = max.min(room.max(0));
    if biz.rate_limit.is_some() && want > 0 {
        // Permits are not given back: ask only for as many as are due.
        want = want.min(lease::due_count(&state.pool, biz.id, want).await?);
    }
    let (permitted, rate_wait) = state.pull_limits.take(&state.pool, biz, want).await;
    if permitted > 0 {
        let (tasks, expired) = lease::reserve(&state.pool, biz.id, &biz.name, permitted, ttr_ms).await?;
        metrics::expired(&biz.name, expired);
        if !tasks.is_empty() {
            return Ok(Ok(tasks));
        }
    }
    if let Some(wait) = rate_wait {
        sleep_for = sleep_for.min(wait);
    }
    if let Some(next) = lease::next_due(&state.pool, &[biz.id]).await? {
        let until_due = (next - chrono::Utc::now()).to_std().unwrap_or_default();
        sleep_for = sleep_for.min(until_due.max(Duration::from_millis(1)));
    }
    Ok(Err(sleep_for))
}

fn parse_id(raw: &str) -> Result<Uuid, ApiError> {
    raw.parse().map_err(|_| ApiError::BadRequest(format!("`{raw}` is not a task id (a UUID)")))
}

/// The caller's biz type, which must be in pull mode: a callback task running in an
/// engine is not the consumer's to settle.
async fn own_pull_biz_type(caller: &Caller, state: &AppState) -> Result<BizType, ApiError> {
    pull_biz_type(caller, state, &caller.0.biz_type).await
}

/// The `receipt` of an ack, nack or touch: the one reserve returned with the task, which
/// settles that reservation only.
fn receipt(raw: Option<&str>) -> Result<Uuid, ApiError> {
    let raw = raw.ok_or_else(|| ApiError::Invalid("receipt: required; send the receipt that reserve returned with the task".into()))?;
    raw.parse().map_err(|_| ApiError::Invalid("receipt: must be the receipt that reserve returned with the task (a UUID)".into()))
}

#[derive(Deserialize, Default, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct AckRequest {
    // Optional here only to answer its absence with a 422 that says what to send.
    #[schema(value_type = Receipt, required = true)]
    receipt: Option<String>,
}

#[utoipa::path(
    post,
    path = "/api/v1/tasks/{id}/ack",
    operation_id = "ackTask",
    tag = "pull",
    summary = r#"Ack a reserved task: it succeeded"#,
    description = r#"The task succeeded: it is finished and its reservation ends."#,
    params(
        ("id" = Uuid, Path, description = r#"The task's id."#)
    ),
    request_body(content = AckRequest),
    responses(
        (status = 200, description = r#"The task as it is now."#, body = crate::tasks::Task),
        (status = 400, description = r#"The `id` is not a UUID, or the body is not valid JSON."#, body = super::error::Error, example = json!({"error": {"code": "bad_request", "message": "`42` is not a task id (a UUID)"}})),
        (status = 401, response = super::error::Unauthenticated),
        (status = 403, description = r#"The task belongs to another biz type than the token's. Also: the token's biz type is archived, or the token is an admin token (which acts only on `/api/v1/admin/`)."#, body = super::error::Error, example = json!({"error": {"code": "permission_denied", "message": "this task belongs to another biz type"}})),
        (status = 404, description = r#"No task has this id."#, body = super::error::Error, example = json!({"error": {"code": "not_found", "message": "no task with id 01937a4e-8f5c-7cc2-9a54-3c6f1f0b2d11"}})),
        (status = 408, response = super::error::RequestTimeout),
        (status = 409, description = r#"The receipt no longer holds the task (`stale_receipt`: its time to run passed and it went back to pending or to another consumer, or it was acked or nacked already, or the receipt is another task's); nothing changed. Or the token's biz type delivers by callback (`invalid_state`)."#, body = super::error::Error, example = json!({"error": {"code": "stale_receipt", "message": "this receipt no longer holds the task: its time to run passed and another reservation holds it now (or the receipt is another task's)"}})),
        (status = 413, response = super::error::BodyOver16KiB),
        (status = 422, description = r#"A field is invalid, or the receipt is missing."#, body = super::error::Error, example = json!({"error": {"code": "invalid_argument", "message": "receipt: required; send the receipt that reserve returned with the task"}})),
        (status = 500, response = super::error::Internal),
        (status = 503, response = super::error::Unavailable)
    ),
    security(("bearerAuth" = []))
)]
pub async fn ack(caller: Caller, state: web::Data<AppState>, id: web::Path<String>, body: web::Payload) -> Result<HttpResponse, ApiError> {
    let id = parse_id(&id)?;
    let request: AckRequest = read_optional_json(body, BODY_LIMIT).await?.map(from_json).transpose()?.unwrap_or_default();
    let receipt = receipt(request.receipt.as_deref())?;
    let biz = own_pull_biz_type(&caller, &state).await?;
    let task = pull::settle(&state.pool, &biz, id, receipt, Verdict::Ack).await?;
    Ok(HttpResponse::Ok().json(task))
}

#[derive(Deserialize, Default, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct NackRequest {
    #[schema(value_type = Receipt, required = true)]
    receipt: Option<String>,
    /// Retry after this long, at most 10 years (3660 days). Default: the biz type's backoff.
    #[schema(minimum = 0, maximum = 316_224_000_000_i64)]
    delay_ms: Option<i64>,
    /// Why; kept as the task's last error. At most 1000 characters, without NUL.
    #[schema(max_length = 1000, pattern = r"^[^\u0000]*$")]
    error: Option<String>,
}

#[utoipa::path(
    post,
    path = "/api/v1/tasks/{id}/nack",
    operation_id = "nackTask",
    tag = "pull",
    summary = r#"Nack a reserved task: retry it later"#,
    description = r#"The task goes back to pending, due after `delay_ms` (default: the biz type's backoff), or is failed when it has used its `max_attempts`."#,
    params(
        ("id" = Uuid, Path, description = r#"The task's id."#)
    ),
    request_body(content = NackRequest),
    responses(
        (status = 200, description = r#"The task as it is now."#, body = crate::tasks::Task),
        (status = 400, description = r#"The `id` is not a UUID, or the body is not valid JSON."#, body = super::error::Error, example = json!({"error": {"code": "bad_request", "message": "`42` is not a task id (a UUID)"}})),
        (status = 401, response = super::error::Unauthenticated),
        (status = 403, description = r#"The task belongs to another biz type than the token's. Also: the token's biz type is archived, or the token is an admin token (which acts only on `/api/v1/admin/`)."#, body = super::error::Error, example = json!({"error": {"code": "permission_denied", "message": "this task belongs to another biz type"}})),
        (status = 404, description = r#"No task has this id."#, body = super::error::Error, example = json!({"error": {"code": "not_found", "message": "no task with id 01937a4e-8f5c-7cc2-9a54-3c6f1f0b2d11"}})),
        (status = 408, response = super::error::RequestTimeout),
        (status = 409, description = r#"The receipt no longer holds the task (`stale_receipt`: its time to run passed and it went back to pending or to another consumer, or it was acked or nacked already, or the receipt is another task's); nothing changed. Or the token's biz type delivers by callback (`invalid_state`)."#, body = super::error::Error, example = json!({"error": {"code": "stale_receipt", "message": "this receipt no longer holds the task: its time to run passed and another reservation holds it now (or the receipt is another task's)"}})),
        (status = 413, response = super::error::BodyOver16KiB),
        (status = 422, description = r#"A field is invalid, or the receipt is missing."#, body = super::error::Error, example = json!({"error": {"code": "invalid_argument", "message": "delay_ms: must be between 0 and 10 years in milliseconds"}})),
        (status = 500, response = super::error::Internal),
        (status = 503, response = super::error::Unavailable)
    ),
    security(("bearerAuth" = []))
)]
pub async fn nack(caller: Caller, state: web::Data<AppState>, id: web::Path<String>, body: web::Payload) -> Result<HttpResponse, ApiError> {
    let id = parse_id(&id)?;
    let request: NackRequest = read_optional_json(body, BODY_LIMIT).await?.map(from_json).transpose()?.unwrap_or_default();
    let receipt = receipt(request.receipt.as_deref())?;
    if let Some(ms) = request.delay_ms
        && !(0..=crate::tasks::MAX_AHEAD.num_milliseconds()).contains(&ms)
    {
        return Err(ApiError::Invalid("delay_ms: must be between 0 and 10 years in milliseconds".into()));
    }
    if let Some(error) = &request.error {
        // Characters, as the document's `maxLength` counts them.
        if error.chars().count() > 1000 {
            return Err(ApiError::Invalid("error: must be at most 1000 characters".into()));
        }
        // PostgreSQL text cannot hold NUL.
        if error.contains('\0') {
            return Err(ApiError::Invalid("error: must not contain NUL characters".into()));
        }
    }
    let biz = own_pull_biz_type(&caller, &state).await?;
    let task = pull::settle(&state.pool, &biz, id, receipt, Verdict::Nack { delay_ms: request.delay_ms, error: request.error }).await?;
    Ok(HttpResponse::Ok().json(task))
}

#[derive(Deserialize, Default, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct TouchRequest {
    #[schema(value_type = Receipt, required = true)]
    receipt: Option<String>,
    /// New time to run from now. Default: the biz type's timeout.
    #[schema(minimum = 1, maximum = 86_400_000)]
    ttr_ms: Option<i64>,
}

#[utoipa::path(
    post,
    path = "/api/v1/tasks/{id}/touch",
    operation_id = "touchTask",
    tag = "pull",
    summary = r#"Extend a reservation"#,
    description = r#"Sets the reservation to end `ttr_ms` from now (default: the biz type's timeout); the receipt stays the same."#,
    params(
        ("id" = Uuid, Path, description = r#"The task's id."#)
    ),
    request_body(content = inline(TouchRequest)),
    responses(
        (status = 200, description = r#"Until when the task is reserved."#, body = inline(Touched)),
        (status = 400, description = r#"The `id` is not a UUID, or the body is not valid JSON."#, body = super::error::Error, example = json!({"error": {"code": "bad_request", "message": "`42` is not a task id (a UUID)"}})),
        (status = 401, response = super::error::Unauthenticated),
        (status = 403, description = r#"The task belongs to another biz type than the token's. Also: the token's biz type is archived, or the token is an admin token (which acts only on `/api/v1/admin/`)."#, body = super::error::Error, example = json!({"error": {"code": "permission_denied", "message": "this task belongs to another biz type"}})),
        (status = 404, description = r#"No task has this id."#, body = super::error::Error, example = json!({"error": {"code": "not_found", "message": "no task with id 01937a4e-8f5c-7cc2-9a54-3c6f1f0b2d11"}})),
        (status = 408, response = super::error::RequestTimeout),
        (status = 409, description = r#"The receipt no longer holds the task (`stale_receipt`: its time to run passed and it went back to pending or to another consumer, or it was acked or nacked already, or the receipt is another task's); nothing changed. Or the token's biz type delivers by callback (`invalid_state`)."#, body = super::error::Error, example = json!({"error": {"code": "stale_receipt", "message": "this receipt no longer holds the task: its time to run passed and another reservation holds it now (or the receipt is another task's)"}})),
        (status = 413, response = super::error::BodyOver16KiB),
        (status = 422, description = r#"A field is invalid, or the receipt is missing."#, body = super::error::Error, example = json!({"error": {"code": "invalid_argument", "message": "ttr_ms: must be between 1 and 86400000 (a day)"}})),
        (status = 500, response = super::error::Internal),
        (status = 503, response = super::error::Unavailable)
    ),
    security(("bearerAuth" = []))
)]
pub async fn touch(caller: Caller, state: web::Data<AppState>, id: web::Path<String>, body: web::Payload) -> Result<HttpResponse, ApiError> {
    let id = parse_id(&id)?;
    let request: TouchRequest = read_optional_json(body, BODY_LIMIT).await?.map(from_json).transpose()?.unwrap_or_default();
    let receipt = receipt(request.receipt.as_deref())?;
    let biz = own_pull_biz_type(&caller, &state).await?;
    let until = pull::touch(&state.pool, &biz, id, receipt, ttr(request.ttr_ms, &biz)?).await?;
    Ok(HttpResponse::Ok().json(Touched { id, reserved_until: until }))
}

/// The receipt that reserve returned with the task. It settles that reservation only: once its time to run has passed (and the task may have gone to another consumer) or the task was acked or nacked, it answers 409 `stale_receipt`.
#[derive(ToSchema)]
#[allow(dead_code)] // Only described: handlers read receipts as text, to word their 422.
pub struct Receipt(uuid::Uuid);
