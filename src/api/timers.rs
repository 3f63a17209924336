//! Timer endpoints.

use actix_web::{HttpRequest, HttpResponse, web};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::auth::Caller;
use super::{ApiError, from_raw, parse_limit, parse_query, raw_json, read_raw_body};
use crate::state::AppState;
use crate::audit;
use crate::tasks::validate_key;
use crate::timers::{self, CreateTimer, Timer, TimerChanges};

/// Room in a request body for the fields around the payload.
const ENVELOPE_BYTES: usize = 4096;

/// A timer as the API shows it: with its next fire times.
#[derive(Serialize)]
struct TimerView<'a> {
    #[serde(flatten)]
    timer: &'a Timer,
    next_fire_times: Vec<DateTime<Utc>>,
}

/// A page of timers, written out as it is serialised: a `json!` value would parse every
/// payload into a tree.
#[derive(Serialize)]
struct ListAnswer<'a> {
    items: Vec<TimerView<'a>>,
    next_cursor: Option<String>,
}

fn view(timer: &Timer) -> TimerView<'_> {
    TimerView { timer, next_fire_times: timer.next_fire_times(Utc::now()) }
}

fn parse_id(raw: &str) -> Result<Uuid, ApiError> {
    raw.parse().map_err(|_| ApiError::BadRequest(format!("`{raw}` is not a timer id (a UUID)")))
}

fn snapshot(timer: &Timer) -> serde_json::Value {
    serde_json::to_value(timer).unwrap_or_default()
}

pub async fn create(caller: Caller, state: web::Data<AppState>, body: web::Payload) -> Result<HttpResponse, ApiError> {
    let body = read_raw_body(body, state.max_payload_bytes + ENVELOPE_BYTES).await?;
    let request: CreateTimer = from_raw(raw_json(&body)?)?;
    caller.require(&state, &request.biz_type).await?;
    request.validate(state.max_payload_bytes)?;
    let timer = timers::create(&state.pool, caller.0.biz_type_id, request).await?;
    audit::record(&state.pool, &caller.actor(), "timer.create", "timer", &timer.id.to_string(), None, Some(snapshot(&timer)))
        .await?;
    Ok(HttpResponse::Created().json(view(&timer)))
}

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

async fn change(caller: &Caller, state: &AppState, id: Uuid, changes: TimerChanges, action: &str) -> Result<HttpResponse, ApiError> {
    let (before, after) = timers::update(&state.pool, caller.0.biz_type_id, id, changes, state.max_payload_bytes).await?;
    audit::record(&state.pool, &caller.actor(), action, "timer", &id.to_string(), Some(snapshot(&before)), Some(snapshot(&after)))
        .await?;
    Ok(HttpResponse::Ok().json(view(&after)))
}

pub async fn update(caller: Caller, state: web::Data<AppState>, id: web::Path<String>, body: web::Payload) -> Result<HttpResponse, ApiError> {
    let id = parse_id(&id)?;
    let body = read_raw_body(body, state.max_payload_bytes + ENVELOPE_BYTES).await?;
    let changes: TimerChanges = from_raw(raw_json(&body)?)?;
    if changes.is_empty() {
        return Err(ApiError::Invalid("give cron, timezone, payload, active or catch_up to change".into()));
    }
    change(&caller, &state, id, changes, "timer.update").await
}

pub async fn activate(caller: Caller, state: web::Data<AppState>, id: web::Path<String>) -> Result<HttpResponse, ApiError> {
    let id = parse_id(&id)?;
    change(&caller, &state, id, TimerChanges { active: Some(true), ..Default::default() }, "timer.activate").await
}

pub async fn deactivate(caller: Caller, state: web::Data<AppState>, id: web::Path<String>) -> Result<HttpResponse, ApiError> {
    let id = parse_id(&id)?;
    change(&caller, &state, id, TimerChanges { active: Some(false), ..Default::default() }, "timer.deactivate").await
}

pub async fn delete(caller: Caller, state: web::Data<AppState>, id: web::Path<String>) -> Result<HttpResponse, ApiError> {
    let id = parse_id(&id)?;
    let timer = timers::delete(&state.pool, caller.0.biz_type_id, id).await?;
    audit::record(&state.pool, &caller.actor(), "timer.delete", "timer", &id.to_string(), Some(snapshot(&timer)), None).await?;
    Ok(HttpResponse::NoContent().finish())
}
