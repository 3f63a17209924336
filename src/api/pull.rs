//! Pull delivery endpoints: reserve (long-polling), ack, nack, touch.

use std::time::Duration;

use actix_web::{HttpResponse, web};
use serde::Deserialize;
use serde_json::json;
use tokio::time::Instant;
use uuid::Uuid;

use super::auth::Caller;
use super::{ApiError, from_json, read_optional_json};
use crate::state::AppState;
use crate::biz_types::{self, BizType};
use crate::pull::{self, Verdict};

const MAX_RESERVE: i64 = 100;
const MAX_WAIT_MS: u64 = 30_000;
const MAX_TTR_MS: i64 = 24 * 3600 * 1000;
/// Longest a waiting reserve sleeps without looking, in case a wake-up was missed.
const POLL_FALLBACK: Duration = Duration::from_secs(1);
const BODY_LIMIT: usize = 16 * 1024;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReserveRequest {
    max: Option<i64>,
    wait_ms: Option<u64>,
    ttr_ms: Option<i64>,
}

async fn pull_biz_type(caller: &Caller, state: &AppState, name: &str) -> Result<BizType, ApiError> {
    caller.require(state, name).await?;
    let biz = biz_types::by_name(&state.pool, name).await?.ok_or_else(|| ApiError::NotFound(format!("no biz type named `{name}`")))?;
    if biz.mode != "pull" {
        return Err(ApiError::Conflict(format!(
            "biz type `{name}` delivers by callback; set its mode to pull to reserve its tasks"
        )));
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
    let deadline = Instant::now() + Duration::from_millis(wait_ms);
    let mut biz = biz;
    loop {
        // Registered before looking, so a notification that comes while we look still wakes us.
        let woken = state.wake.notified();
        tokio::pin!(woken);
        woken.as_mut().enable();

        let mut sleep_for = POLL_FALLBACK;
        if !biz.paused {
            let room = i64::from(biz.max_in_flight) - pull::reserved_count(&state.pool, biz.id).await?;
            let mut want = max.min(room.max(0));
            if biz.rate_limit.is_some() && want > 0 {
                // Permits are not given back: ask only for as many as are due.
                want = want.min(pull::due_count(&state.pool, biz.id, want).await?);
            }
            let (permitted, rate_wait) = state.pull_limits.take(&state.pool, &biz, want).await;
            if permitted > 0 {
                let tasks = pull::reserve(&state.pool, &biz, permitted, ttr_ms).await?;
                if !tasks.is_empty() {
                    return Ok(HttpResponse::Ok().json(json!({"tasks": tasks})));
                }
            }
            if let Some(wait) = rate_wait {
                sleep_for = sleep_for.min(wait);
            }
            if let Some(next) = crate::tasks::lease::next_due(&state.pool, &[biz.id]).await? {
                let until_due = (next - chrono::Utc::now()).to_std().unwrap_or_default();
                sleep_for = sleep_for.min(until_due.max(Duration::from_millis(1)));
            }
        }
        let now = Instant::now();
        if now >= deadline {
            return Ok(HttpResponse::Ok().json(json!({"tasks": []})));
        }
        tokio::select! {
            _ = &mut woken => {}
            _ = tokio::time::sleep(sleep_for.min(deadline - now)) => {}
        }
        // Pausing, resuming or a changed limit applies to a waiting reserve too.
        biz = pull_biz_type(&caller, &state, &name).await?;
    }
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

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct AckRequest {
    receipt: Option<String>,
}

pub async fn ack(caller: Caller, state: web::Data<AppState>, id: web::Path<String>, body: web::Payload) -> Result<HttpResponse, ApiError> {
    let id = parse_id(&id)?;
    let request: AckRequest = read_optional_json(body, BODY_LIMIT).await?.map(from_json).transpose()?.unwrap_or_default();
    let receipt = receipt(request.receipt.as_deref())?;
    let biz = own_pull_biz_type(&caller, &state).await?;
    let task = pull::settle(&state.pool, &biz, id, receipt, Verdict::Ack).await?;
    Ok(HttpResponse::Ok().json(task))
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct NackRequest {
    receipt: Option<String>,
    delay_ms: Option<i64>,
    error: Option<String>,
}

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

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct TouchRequest {
    receipt: Option<String>,
    ttr_ms: Option<i64>,
}

pub async fn touch(caller: Caller, state: web::Data<AppState>, id: web::Path<String>, body: web::Payload) -> Result<HttpResponse, ApiError> {
    let id = parse_id(&id)?;
    let request: TouchRequest = read_optional_json(body, BODY_LIMIT).await?.map(from_json).transpose()?.unwrap_or_default();
    let receipt = receipt(request.receipt.as_deref())?;
    let biz = own_pull_biz_type(&caller, &state).await?;
    let until = pull::touch(&state.pool, &biz, id, receipt, ttr(request.ttr_ms, &biz)?).await?;
    Ok(HttpResponse::Ok().json(json!({"id": id, "reserved_until": until})))
}
