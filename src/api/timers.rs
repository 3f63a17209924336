//! Timer endpoints.

use actix_web::{HttpRequest, HttpResponse, web};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

use super::auth::Caller;
use super::{ApiError, from_raw, parse_limit, parse_query, raw_json, read_raw_body};
use crate::audit::{self, Action};
use crate::state::AppState;
use crate::tasks::validate_key;
use crate::timers::{self, CreateTimer, Timer, TimerChanges};

/// Room in a request body for the fields around the payload.
const ENVELOPE_BYTES: usize = 4096;

/// A timer as the API shows it: with its next fire times.
#[derive(Serialize, ToSchema)]
#[schema(as = Timer, description = "A timer, with its next fire times.")]
pub(super) struct TimerView<'a> {
    #[serde(flatten)]
    #[schema(inline)]
    timer: &'a Timer,
    /// The next (up to 5) fire times; empty while inactive.
    next_fire_times: Vec<DateTime<Utc>>,
}

/// A page of timers, written out as it is serialised: a `json!` value would parse every
/// payload into a tree.
#[derive(Serialize, ToSchema)]
#[schema(as = TimerList, description = "A page of timers, by key.")]
pub(super) struct ListAnswer<'a> {
    items: Vec<TimerView<'a>>,
    /// Pass as `cursor` to get the next page; null on the last page.
    #[schema(required = true)]
    next_cursor: Option<String>,
}

fn view(timer: &Timer) -> TimerView<'_> {
    TimerView { timer, next_fire_times: timer.next_fire_times(Utc::now()) }
}

fn parse_id(raw: &str) -> Result<Uuid, ApiError> {
    raw.parse().map_err(|_| ApiError::BadRequest(format!("`{raw}` is not a timer id (a UUID)")))
}

#[utoipa::path(
    post,
    path = "/api/v1/timers",
    operation_id = "createTimer",
    tag = "timers",
    summary = r#"Create a timer"#,
    description = r#"A periodic schedule of the token's biz type: a cron expression **with a seconds field** (`second minute hour day-of-month month day-of-week [year]`) read in an IANA time zone. The leader writes each occurrence as a task ahead of time, keyed `<timer key>@<fire time in UTC>`, exactly once. A wall-clock time skipped by a daylight-saving change fires shifted by the gap; one that occurs twice fires at its first occurrence (both, if the schedule matches every hour). After a time with no node running, `catch_up: true` fires the latest missed occurrence once, `false` skips the missed ones."#,
    request_body(content = crate::timers::CreateTimer, example = json!({"biz_type": "report", "key": "nightly", "cron": "0 30 2 * * *", "timezone": "Europe/Berlin", "payload": {"report": "daily"}})),
    responses(
        (status = 201, description = r#"The timer, with its next fire times."#, links(("GetTimer" = (operation_id = "getTimer", parameters(("id" = "$response.body#/id")), description = r#"The `id` in the answer identifies the timer in `/api/v1/timers/{id}`."#)), ("UpdateTimer" = (operation_id = "updateTimer", parameters(("id" = "$response.body#/id")))), ("DeleteTimer" = (operation_id = "deleteTimer", parameters(("id" = "$response.body#/id")))), ("ActivateTimer" = (operation_id = "activateTimer", parameters(("id" = "$response.body#/id")))), ("DeactivateTimer" = (operation_id = "deactivateTimer", parameters(("id" = "$response.body#/id"))))), body = TimerView),
        (status = 400, response = super::error::BadBody),
        (status = 401, response = super::error::Unauthenticated),
        (status = 403, description = r#"The request names another biz type than the token's. Also: the token's biz type is archived, or the token is an admin token (which acts only on `/api/v1/admin/`)."#, body = super::error::Error, example = json!({"error": {"code": "permission_denied", "message": "this token belongs to biz type `report`, not `billing`"}})),
        (status = 404, description = r#"No biz type has this name."#, body = super::error::Error, example = json!({"error": {"code": "not_found", "message": "no biz type named `billing`"}})),
        (status = 408, response = super::error::RequestTimeout),
        (status = 409, description = r#"A timer with this key exists in the biz type."#, body = super::error::Error, example = json!({"error": {"code": "key_conflict", "message": "a timer with key `nightly` already exists in this biz type"}})),
        (status = 413, description = r#"The payload is over the size limit."#, body = super::error::Error, example = json!({"error": {"code": "payload_too_large", "message": "payload is 70000 bytes as stored; the limit is 65536"}})),
        (status = 422, description = r#"A field is invalid; the message names it."#, body = super::error::Error, example = json!({"error": {"code": "invalid_argument", "message": "cron: needs 6 or 7 fields (second minute hour day-of-month month day-of-week [year]), such as `0 30 9 * * Mon-Fri`; this one has 5. As a crontab line (minute first), `30 9 * * 1-5` is `0 30 9 * * MON-FRI` here, at second 0"}})),
        (status = 500, response = super::error::Internal),
        (status = 503, response = super::error::Unavailable)
    ),
    security(("bearerAuth" = []))
)]
pub async fn create(caller: Caller, state: web::Data<AppState>, body: web::Payload) -> Result<HttpResponse, ApiError> {
    let body = read_raw_body(body, state.max_payload_bytes + ENVELOPE_BYTES).await?;
    let request: CreateTimer = from_raw(raw_json(&body)?)?;
    caller.require(&state, &request.biz_type).await?;
    request.validate(state.max_payload_bytes)?;
    let timer = timers::create(&state.pool, caller.0.biz_type_id, request, &caller.actor()).await?;
    Ok(HttpResponse::Created().json(view(&timer)))
}

#[utoipa::path(
    get,
    path = "/api/v1/timers/{id}",
    operation_id = "getTimer",
    tag = "timers",
    summary = r#"Get a timer with its next fire times"#,
    params(
        ("id" = Uuid, Path, description = r#"The timer's id."#)
    ),
    responses(
        (status = 200, description = r#"The timer."#, body = TimerView),
        (status = 400, description = r#"The `id` in the path is not a UUID."#, body = super::error::Error, example = json!({"error": {"code": "bad_request", "message": "`42` is not a timer id (a UUID)"}})),
        (status = 401, response = super::error::Unauthenticated),
        (status = 403, description = r#"The timer belongs to another biz type than the token's. Also: the token's biz type is archived, or the token is an admin token (which acts only on `/api/v1/admin/`)."#, body = super::error::Error, example = json!({"error": {"code": "permission_denied", "message": "this timer belongs to another biz type"}})),
        (status = 404, description = r#"No timer has this id."#, body = super::error::Error, example = json!({"error": {"code": "not_found", "message": "no timer with id 01937a4e-8f5c-7cc2-9a54-3c6f1f0b2d11"}})),
        (status = 500, response = super::error::Internal),
        (status = 503, response = super::error::Unavailable)
    ),
    security(("bearerAuth" = []))
)]
pub async fn get(caller: Caller, state: web::Data<AppState>, id: web::Path<String>) -> Result<HttpResponse, ApiError> {
    let id = parse_id(&id)?;
    let timer = timers::get(&state.pool, id).await?.ok_or_else(|| ApiError::NotFound(format!("no timer with id {id}")))?;
    if timer.biz_type_id != caller.0.biz_type_id {
        return Err(ApiError::Forbidden("this timer belongs to another biz type".into()));
    }
    Ok(HttpResponse::Ok().json(view(&timer)))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ListQuery {
    biz_type: Option<String>,
    limit: Option<String>,
    cursor: Option<String>,
}

/// The caller's timers by key; the cursor is the last key of the previous page.
#[utoipa::path(
    get,
    path = "/api/v1/timers",
    operation_id = "listTimers",
    tag = "timers",
    summary = r#"List the token's timers"#,
    description = r#"Timers of the token's biz type, by key, keyset-paginated: pass `next_cursor` as `cursor` for the next page."#,
    params(
        ("biz_type" = Option<String>, Query, description = r#"Must be the token's biz type if given."#),
        ("limit" = Option<i64>, Query, description = r#"Page size, 1 to 1000."#, minimum = 1, maximum = 1000, example = 100),
        ("cursor" = Option<String>, Query, description = r#"`next_cursor` of the previous page (a timer key). Leave the parameter out for the first page."#, min_length = 1, max_length = 256)
    ),
    responses(
        (status = 200, description = r#"A page of timers."#, body = ListAnswer),
        (status = 401, response = super::error::Unauthenticated),
        (status = 403, description = r#"`biz_type` names another biz type than the token's. Also: the token's biz type is archived, or the token is an admin token (which acts only on `/api/v1/admin/`)."#, body = super::error::Error, example = json!({"error": {"code": "permission_denied", "message": "this token belongs to biz type `report`, not `billing`"}})),
        (status = 404, description = r#"No biz type has this name."#, body = super::error::Error, example = json!({"error": {"code": "not_found", "message": "no biz type named `billing`"}})),
        (status = 422, description = r#"A field is invalid; the message names it."#, body = super::error::Error, example = json!({"error": {"code": "invalid_argument", "message": "limit: must be a whole number from 1 to 1000"}})),
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
    // The cursor is a timer key; one that no key can be (with NUL, say) would only fail in
    // the database.
    if query.cursor.as_deref().is_some_and(|cursor| validate_key(cursor).is_err()) {
        return Err(ApiError::Invalid("cursor: is not a cursor returned by this API".into()));
    }
    let limit = parse_limit(query.limit.as_deref())?;
    let items = timers::list(&state.pool, Some(caller.0.biz_type_id), query.cursor.as_deref(), limit).await?;
    let next_cursor = (items.len() as i64 == limit).then(|| items.last().map(|t| t.key.clone())).flatten();
    let items: Vec<TimerView> = items.iter().map(view).collect();
    Ok(HttpResponse::Ok().json(ListAnswer { items, next_cursor }))
}

async fn change(caller: &Caller, state: &AppState, id: Uuid, changes: TimerChanges, action: Action) -> Result<HttpResponse, ApiError> {
    let by = audit::By { actor: &caller.actor(), action };
    let (_, after) = timers::update(&state.pool, caller.0.biz_type_id, id, changes, state.max_payload_bytes, by).await?;
    Ok(HttpResponse::Ok().json(view(&after)))
}

#[utoipa::path(
    patch,
    path = "/api/v1/timers/{id}",
    operation_id = "updateTimer",
    tag = "timers",
    summary = r#"Change a timer"#,
    description = r#"Changes the fields given. A change of `cron`, `timezone`, `payload` or `active` removes the occurrences written ahead that have not fired yet and restarts the schedule from now."#,
    params(
        ("id" = Uuid, Path, description = r#"The timer's id."#)
    ),
    request_body(content = crate::timers::TimerChanges),
    responses(
        (status = 200, description = r#"The changed timer."#, body = TimerView),
        (status = 400, description = r#"The `id` is not a UUID, or the body is empty or not valid JSON."#, body = super::error::Error, example = json!({"error": {"code": "bad_request", "message": "`42` is not a timer id (a UUID)"}})),
        (status = 401, response = super::error::Unauthenticated),
        (status = 403, description = r#"The timer belongs to another biz type than the token's. Also: the token's biz type is archived, or the token is an admin token (which acts only on `/api/v1/admin/`)."#, body = super::error::Error, example = json!({"error": {"code": "permission_denied", "message": "this timer belongs to another biz type"}})),
        (status = 404, description = r#"No timer has this id."#, body = super::error::Error, example = json!({"error": {"code": "not_found", "message": "no timer with id 01937a4e-8f5c-7cc2-9a54-3c6f1f0b2d11"}})),
        (status = 408, response = super::error::RequestTimeout),
        (status = 413, description = r#"The payload is over the size limit."#, body = super::error::Error, example = json!({"error": {"code": "payload_too_large", "message": "payload is 70000 bytes as stored; the limit is 65536"}})),
        (status = 422, description = r#"Nothing to change (every field absent or null, but for `payload`), or a field is invalid; the message names it."#, body = super::error::Error, example = json!({"error": {"code": "invalid_argument", "message": "timezone: `Mars/Olympus` is not an IANA time zone name such as Europe/Berlin or UTC"}})),
        (status = 500, response = super::error::Internal),
        (status = 503, response = super::error::Unavailable)
    ),
    security(("bearerAuth" = []))
)]
pub async fn update(caller: Caller, state: web::Data<AppState>, id: web::Path<String>, body: web::Payload) -> Result<HttpResponse, ApiError> {
    let id = parse_id(&id)?;
    let body = read_raw_body(body, state.max_payload_bytes + ENVELOPE_BYTES).await?;
    let changes: TimerChanges = from_raw(raw_json(&body)?)?;
    if changes.is_empty() {
        return Err(ApiError::Invalid("give cron, timezone, payload, active or catch_up to change".into()));
    }
    change(&caller, &state, id, changes, Action::TimerUpdate).await
}

#[utoipa::path(
    post,
    path = "/api/v1/timers/{id}/activate",
    operation_id = "activateTimer",
    tag = "timers",
    summary = r#"Activate a timer"#,
    description = r#"Activate a timer: it fires again from now on (occurrences missed while inactive are not caught up)."#,
    params(
        ("id" = Uuid, Path, description = r#"The timer's id."#)
    ),
    responses(
        (status = 200, description = r#"The timer."#, body = TimerView),
        (status = 400, description = r#"The `id` in the path is not a UUID."#, body = super::error::Error, example = json!({"error": {"code": "bad_request", "message": "`42` is not a timer id (a UUID)"}})),
        (status = 401, response = super::error::Unauthenticated),
        (status = 403, description = r#"The timer belongs to another biz type than the token's. Also: the token's biz type is archived, or the token is an admin token (which acts only on `/api/v1/admin/`)."#, body = super::error::Error, example = json!({"error": {"code": "permission_denied", "message": "this timer belongs to another biz type"}})),
        (status = 404, description = r#"No timer has this id."#, body = super::error::Error, example = json!({"error": {"code": "not_found", "message": "no timer with id 01937a4e-8f5c-7cc2-9a54-3c6f1f0b2d11"}})),
        (status = 500, response = super::error::Internal),
        (status = 503, response = super::error::Unavailable)
    ),
    security(("bearerAuth" = []))
)]
pub async fn activate(caller: Caller, state: web::Data<AppState>, id: web::Path<String>) -> Result<HttpResponse, ApiError> {
    let id = parse_id(&id)?;
    change(&caller, &state, id, TimerChanges { active: Some(true), ..Default::default() }, Action::TimerActivate).await
}

#[utoipa::path(
    post,
    path = "/api/v1/timers/{id}/deactivate",
    operation_id = "deactivateTimer",
    tag = "timers",
    summary = r#"Deactivate a timer"#,
    description = r#"Deactivate a timer: its occurrences that have not fired yet are removed; it fires no more until activated."#,
    params(
        ("id" = Uuid, Path, description = r#"The timer's id."#)
    ),
    responses(
        (status = 200, description = r#"The timer."#, body = TimerView),
        (status = 400, description = r#"The `id` in the path is not a UUID."#, body = super::error::Error, example = json!({"error": {"code": "bad_request", "message": "`42` is not a timer id (a UUID)"}})),
        (status = 401, response = super::error::Unauthenticated),
        (status = 403, description = r#"The timer belongs to another biz type than the token's. Also: the token's biz type is archived, or the token is an admin token (which acts only on `/api/v1/admin/`)."#, body = super::error::Error, example = json!({"error": {"code": "permission_denied", "message": "this timer belongs to another biz type"}})),
        (status = 404, description = r#"No timer has this id."#, body = super::error::Error, example = json!({"error": {"code": "not_found", "message": "no timer with id 01937a4e-8f5c-7cc2-9a54-3c6f1f0b2d11"}})),
        (status = 500, response = super::error::Internal),
        (status = 503, response = super::error::Unavailable)
    ),
    security(("bearerAuth" = []))
)]
pub async fn deactivate(caller: Caller, state: web::Data<AppState>, id: web::Path<String>) -> Result<HttpResponse, ApiError> {
    let id = parse_id(&id)?;
    change(&caller, &state, id, TimerChanges { active: Some(false), ..Default::default() }, Action::TimerDeactivate).await
}

#[utoipa::path(
    delete,
    path = "/api/v1/timers/{id}",
    operation_id = "deleteTimer",
    tag = "timers",
    summary = r#"Delete a timer"#,
    description = r#"Deletes the timer and its occurrences that have not fired yet; tasks it already fired stay."#,
    params(
        ("id" = Uuid, Path, description = r#"The timer's id."#)
    ),
    responses(
        (status = 204, description = r#"Deleted."#),
        (status = 400, description = r#"The `id` in the path is not a UUID."#, body = super::error::Error, example = json!({"error": {"code": "bad_request", "message": "`42` is not a timer id (a UUID)"}})),
        (status = 401, response = super::error::Unauthenticated),
        (status = 403, description = r#"The timer belongs to another biz type than the token's. Also: the token's biz type is archived, or the token is an admin token (which acts only on `/api/v1/admin/`)."#, body = super::error::Error, example = json!({"error": {"code": "permission_denied", "message": "this timer belongs to another biz type"}})),
        (status = 404, description = r#"No timer has this id."#, body = super::error::Error, example = json!({"error": {"code": "not_found", "message": "no timer with id 01937a4e-8f5c-7cc2-9a54-3c6f1f0b2d11"}})),
        (status = 500, response = super::error::Internal),
        (status = 503, response = super::error::Unavailable)
    ),
    security(("bearerAuth" = []))
)]
pub async fn delete(caller: Caller, state: web::Data<AppState>, id: web::Path<String>) -> Result<HttpResponse, ApiError> {
    let id = parse_id(&id)?;
    timers::delete(&state.pool, caller.0.biz_type_id, id, &caller.actor()).await?;
    Ok(HttpResponse::NoContent().finish())
}
