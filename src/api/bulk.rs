//! Bulk cancel and bulk replay of a biz type's tasks by filter (docs/design/contract.md, Tasks by key). The work is the
//! task store's (`tasks::bulk`): bounded batches, the answer when all are done. One at a
//! time per biz type on each node, and at most a tenth of the time (`tasks::bulk::Running`);
//! another meanwhile is told when to retry (429).

use actix_web::{HttpResponse, web};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

use super::auth::Caller;
use super::{ApiError, from_raw, parse_time, raw_json, read_raw_body};
use crate::state::AppState;
use crate::tasks::bulk::{self, BulkFilter, Under};
use crate::tasks::{self, Status};

/// Room for a filter's fields.
const BODY_BYTES: usize = 4096;

/// Which pending tasks to cancel: those matching every condition given. At least one
/// condition, or `"all": true`.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = BulkCancel, example = json!({"key_prefix": "order-", "run_at_to": "2026-12-01T00:00:00Z", "dry_run": true}))]
pub(super) struct CancelRequest {
    /// Tasks whose key starts with this (1 to 256 bytes, no control characters, as a key).
    #[schema(min_length = 1, max_length = 256, pattern = r"^[^\u0000-\u001f\u007f-\u009f]+$")]
    key_prefix: Option<String>,
    /// Tasks due at or after this time (RFC 3339).
    #[schema(format = DateTime)]
    run_at_from: Option<String>,
    /// Tasks due before this time (RFC 3339); after `run_at_from`.
    #[schema(format = DateTime)]
    run_at_to: Option<String>,
    /// Occurrences of this timer.
    timer_id: Option<Uuid>,
    /// Only count the matching tasks; change nothing.
    dry_run: Option<bool>,
    /// Must be true to cancel every pending task of the biz type (a filter without conditions).
    all: Option<bool>,
}

/// The states a bulk replay takes tasks from.
#[derive(Deserialize, ToSchema, Clone, Copy)]
#[serde(rename_all = "lowercase")]
pub(super) enum ReplayStatus {
    Failed,
    Expired,
}

/// Which failed or expired tasks to replay: those matching every condition given. At least
/// one condition besides `status`, or `"all": true`.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = BulkReplay, example = json!({"status": "failed", "run_at_from": "2026-11-21T00:00:00Z"}))]
pub(super) struct ReplayRequest {
    /// The state of the tasks to replay.
    status: ReplayStatus,
    /// Tasks whose key starts with this (1 to 256 bytes, no control characters, as a key).
    #[schema(min_length = 1, max_length = 256, pattern = r"^[^\u0000-\u001f\u007f-\u009f]+$")]
    key_prefix: Option<String>,
    /// Tasks due at or after this time (RFC 3339).
    #[schema(format = DateTime)]
    run_at_from: Option<String>,
    /// Tasks due before this time (RFC 3339); after `run_at_from`.
    #[schema(format = DateTime)]
    run_at_to: Option<String>,
    /// Only count the matching tasks; change nothing.
    dry_run: Option<bool>,
    /// Must be true to replay every task of the biz type in that state (no other condition).
    all: Option<bool>,
}

/// What a bulk cancel found and did.
#[derive(Serialize, ToSchema)]
#[schema(as = BulkCancelled)]
pub(super) struct Cancelled {
    /// Pending tasks that matched (a dry run: that match now).
    matched: i64,
    /// Of those, cancelled (0 for a dry run).
    cancelled: i64,
    /// A dry run only: more than `matched` match (a dry run counts at most 10,000).
    #[serde(skip_serializing_if = "Option::is_none")]
    more: Option<bool>,
}

/// What a bulk replay found and did.
#[derive(Serialize, ToSchema)]
#[schema(as = BulkReplayed)]
pub(super) struct Replayed {
    /// Tasks in the state that matched (a dry run: that match now).
    matched: i64,
    /// Of those, replayed: pending and due now (0 for a dry run).
    replayed: i64,
    /// A dry run only: more than `matched` match (a dry run counts at most 10,000).
    #[serde(skip_serializing_if = "Option::is_none")]
    more: Option<bool>,
}

/// A dry run's count, at most `tasks::COUNT_CAP`, and whether more match.
async fn dry_run(state: &AppState, filter: &BulkFilter, status: Status) -> Result<(i64, bool), ApiError> {
    let count = bulk::count(&state.pool, filter, status).await?;
    Ok((count.min(tasks::COUNT_CAP), count > tasks::COUNT_CAP))
}

fn filter(
    caller: &Caller,
    key_prefix: Option<String>,
    from: Option<&str>,
    to: Option<&str>,
    timer_id: Option<Uuid>,
    all: Option<bool>,
) -> Result<BulkFilter, ApiError> {
    let (from, to) = (parse_time("run_at_from", from)?, parse_time("run_at_to", to)?);
    Ok(BulkFilter::new(Some(caller.0.biz_type_id), key_prefix, from, to, timer_id, all.unwrap_or(false))?)
}

/// Marks the caller's biz type's bulk operation under way on this node until dropped, or
/// refuses it while another is or they took their share of the time: each walks every task
/// of the biz type in one state.
fn one_at_a_time<'a>(state: &'a AppState, caller: &Caller) -> Result<Under<'a>, ApiError> {
    state.bulk_running.start(caller.0.biz_type_id).map_err(|wait| {
        ApiError::Busy(
            "a bulk operation of this biz type is under way on this node, or they took their share of its time; retry after the time Retry-After says".into(),
            wait,
        )
    })
}

#[utoipa::path(
    post,
    path = "/api/v1/biz-types/{name}/tasks/cancel",
    operation_id = "cancelTasks",
    tag = "tasks",
    summary = r#"Cancel every pending task matching a filter"#,
    description = r#"Cancels the biz type's pending tasks (due soon or far ahead) matching every condition given: `key_prefix`, `run_at_from` ≤ run_at < `run_at_to`, `timer_id`. A filter without any condition is refused unless it says `"all": true`. Any number of tasks: they are cancelled in batches of 1,000, a transaction each (claims of this and other biz types go on between them), and the answer comes when all are done. A task being claimed or changed at that moment is passed over (it is about to run, or was just changed). `dry_run` only counts, up to 10,000 (`more` says whether more match). Recorded in the audit log (not a dry run) as one entry, with the filter and the counts, written with the first batch (the counts with the last); each task changed refers to it in its history."#,
    params(
        ("name" = String, Path, description = r#"The biz type's name; must be the token's biz type."#, pattern = r#"^[a-z0-9][a-z0-9_-]{0,63}$"#)
    ),
    request_body(content = CancelRequest),
    responses(
        (status = 200, description = r#"How many matched, and how many were cancelled."#, body = Cancelled, example = json!({"matched": 1200, "cancelled": 1200})),
        (status = 400, response = super::error::BadBody),
        (status = 401, response = super::error::Unauthenticated),
        (status = 403, description = r#"`name` is another biz type than the token's. Also: the token's biz type is archived, or the token is an admin token (which acts only on `/api/v1/admin/`)."#, body = super::error::Error, example = json!({"error": {"code": "permission_denied", "message": "this token belongs to biz type `order-close`, not `coupon-expiry`"}})),
        (status = 404, description = r#"No biz type has this name."#, body = super::error::Error, example = json!({"error": {"code": "not_found", "message": "no biz type named `order-clos`"}})),
        (status = 408, response = super::error::RequestTimeout),
        (status = 413, description = r#"The request body is over 4 KiB."#, body = super::error::Error, example = json!({"error": {"code": "payload_too_large", "message": "request body is larger than 4096 bytes"}})),
        (status = 422, description = r#"No condition and no `"all": true`, a `key_prefix` a key could not be, a time not RFC 3339 or out of range, `run_at_to` not after `run_at_from`, `timer_id` not a UUID, or an unknown field; the message names the field."#, body = super::error::Error, example = json!({"error": {"code": "invalid_argument", "message": "all: the filter has no condition, so it would act on every task: give key_prefix, run_at_from, run_at_to or timer_id, or say \"all\": true"}})),
        (status = 429, description = r#"Another bulk operation (cancel or replay, dry run or not) of this biz type is under way on this node, or its bulk operations took their share of the time (a tenth, after a burst of half a second, each operation counted as at least 50 ms); retry after `Retry-After` seconds."#, body = super::error::Error, example = json!({"error": {"code": "rate_limited", "message": "a bulk operation of this biz type is under way on this node, or they took their share of its time; retry after the time Retry-After says"}})),
        (status = 500, response = super::error::Internal),
        (status = 503, response = super::error::Unavailable)
    ),
    security(("bearerAuth" = []))
)]
pub async fn cancel(caller: Caller, state: web::Data<AppState>, name: web::Path<String>, body: web::Payload) -> Result<HttpResponse, ApiError> {
    caller.require(&state, &name).await?;
    let body = read_raw_body(body, BODY_BYTES).await?;
    let request: CancelRequest = from_raw(raw_json(&body)?)?;
    let filter = filter(&caller, request.key_prefix, request.run_at_from.as_deref(), request.run_at_to.as_deref(), request.timer_id, request.all)?;
    let _running = one_at_a_time(&state, &caller)?;
    if request.dry_run == Some(true) {
        let (matched, more) = dry_run(&state, &filter, Status::Pending).await?;
        return Ok(HttpResponse::Ok().json(Cancelled { matched, cancelled: 0, more: Some(more) }));
    }
    let done = bulk::cancel(&state.pool, &filter, bulk::By { actor: &caller.actor(), biz_type: Some(&name) }).await?;
    Ok(HttpResponse::Ok().json(Cancelled { matched: done.matched, cancelled: done.changed, more: None }))
}

#[utoipa::path(
    post,
    path = "/api/v1/biz-types/{name}/tasks/replay",
    operation_id = "replayTasks",
    tag = "tasks",
    summary = r#"Replay every failed or expired task matching a filter"#,
    description = r#"Replays the biz type's tasks in `status` (`failed` or `expired`) matching every other condition given: `key_prefix`, `run_at_from` ≤ run_at < `run_at_to`. Each becomes pending, due now, with its attempt count reset (as `POST /api/v1/tasks/{id}/replay` does), and is delivered at the biz type's rate limit like any due task. A filter without a condition besides `status` is refused unless it says `"all": true`. Any number of tasks, in batches of 1,000, a transaction each; the answer comes when all are done. `dry_run` only counts, up to 10,000 (`more` says whether more match). Recorded in the audit log (not a dry run) as one entry, with the filter and the counts, written with the first batch (the counts with the last); each task changed refers to it in its history."#,
    params(
        ("name" = String, Path, description = r#"The biz type's name; must be the token's biz type."#, pattern = r#"^[a-z0-9][a-z0-9_-]{0,63}$"#)
    ),
    request_body(content = ReplayRequest),
    responses(
        (status = 200, description = r#"How many matched, and how many were replayed."#, body = Replayed, example = json!({"matched": 37, "replayed": 37})),
        (status = 400, response = super::error::BadBody),
        (status = 401, response = super::error::Unauthenticated),
        (status = 403, description = r#"`name` is another biz type than the token's. Also: the token's biz type is archived, or the token is an admin token (which acts only on `/api/v1/admin/`)."#, body = super::error::Error, example = json!({"error": {"code": "permission_denied", "message": "this token belongs to biz type `order-close`, not `coupon-expiry`"}})),
        (status = 404, description = r#"No biz type has this name."#, body = super::error::Error, example = json!({"error": {"code": "not_found", "message": "no biz type named `order-clos`"}})),
        (status = 408, response = super::error::RequestTimeout),
        (status = 413, description = r#"The request body is over 4 KiB."#, body = super::error::Error, example = json!({"error": {"code": "payload_too_large", "message": "request body is larger than 4096 bytes"}})),
        (status = 422, description = r#"`status` missing or not `failed`/`expired`, no other condition and no `"all": true`, a `key_prefix` a key could not be, a time not RFC 3339 or out of range, `run_at_to` not after `run_at_from`, or an unknown field; the message names the field."#, body = super::error::Error, example = json!({"error": {"code": "invalid_argument", "message": "status: unknown variant `pending`, expected `failed` or `expired`"}})),
        (status = 429, description = r#"Another bulk operation (cancel or replay, dry run or not) of this biz type is under way on this node, or its bulk operations took their share of the time (a tenth, after a burst of half a second, each operation counted as at least 50 ms); retry after `Retry-After` seconds."#, body = super::error::Error, example = json!({"error": {"code": "rate_limited", "message": "a bulk operation of this biz type is under way on this node, or they took their share of its time; retry after the time Retry-After says"}})),
        (status = 500, response = super::error::Internal),
        (status = 503, response = super::error::Unavailable)
    ),
    security(("bearerAuth" = []))
)]
pub async fn replay(caller: Caller, state: web::Data<AppState>, name: web::Path<String>, body: web::Payload) -> Result<HttpResponse, ApiError> {
    caller.require(&state, &name).await?;
    let body = read_raw_body(body, BODY_BYTES).await?;
    let request: ReplayRequest = from_raw(raw_json(&body)?)?;
    let filter = filter(&caller, request.key_prefix, request.run_at_from.as_deref(), request.run_at_to.as_deref(), None, request.all)?;
    let _running = one_at_a_time(&state, &caller)?;
    let status = match request.status {
        ReplayStatus::Failed => Status::Failed,
        ReplayStatus::Expired => Status::Expired,
    };
    if request.dry_run == Some(true) {
        let (matched, more) = dry_run(&state, &filter, status).await?;
        return Ok(HttpResponse::Ok().json(Replayed { matched, replayed: 0, more: Some(more) }));
    }
    let done = bulk::replay(&state.pool, &filter, status, bulk::By { actor: &caller.actor(), biz_type: Some(&name) }).await?;
    Ok(HttpResponse::Ok().json(Replayed { matched: done.matched, replayed: done.changed, more: None }))
}
