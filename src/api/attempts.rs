//! A task's attempts, a page at a time: its `GET` shows only the last ones.

use actix_web::{HttpRequest, HttpResponse, web};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::auth::Caller;
use super::{ApiError, parse_id, parse_limit, parse_query};
use crate::state::AppState;
use crate::tasks::{self, AttemptsFrom};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AttemptsQuery {
    limit: Option<String>,
    cursor: Option<String>,
}

/// A page of a task's attempts.
#[derive(Serialize, ToSchema)]
#[schema(as = AttemptList, description = "A page of a task's delivery attempts, oldest first.")]
struct AttemptList<'a> {
    items: &'a [tasks::Attempt],
    /// Pass as `cursor` to get the next page; null on the last page.
    #[schema(required = true)]
    next_cursor: Option<&'a str>,
}

#[utoipa::path(
    get,
    path = "/api/v1/tasks/{id}/attempts",
    operation_id = "listTaskAttempts",
    tag = "tasks",
    summary = r#"List a task's attempts"#,
    description = r#"Every delivery attempt of one task of the token's biz type, oldest first (those before a replay included), a page at a time: pass the previous page's `next_cursor` as `cursor` until `next_cursor` is null."#,
    params(
        ("id" = Uuid, Path, description = r#"The task's id."#),
        ("limit" = Option<i64>, Query, description = r#"Page size."#, minimum = 1, maximum = 1000, example = 100),
        ("cursor" = Option<String>, Query, description = r#"The `next_cursor` of the previous page (opaque). Leave the parameter out for the first page."#, min_length = 1)
    ),
    responses(
        (status = 200, description = r#"One page of attempts."#, body = AttemptList),
        (status = 400, description = r#"The `id` in the path is not a UUID."#, body = super::error::Error, example = json!({"error": {"code": "bad_request", "message": "`42` is not a task id (a UUID)"}})),
        (status = 401, response = super::error::Unauthenticated),
        (status = 403, description = r#"The task belongs to another biz type than the token's. Also: the token's biz type is archived, or the token is an admin token (which acts only on `/api/v1/admin/`)."#, body = super::error::Error, example = json!({"error": {"code": "permission_denied", "message": "this task belongs to another biz type"}})),
        (status = 404, description = r#"No task has this id."#, body = super::error::Error, example = json!({"error": {"code": "not_found", "message": "no task with id 01937a4e-8f5c-7cc2-9a54-3c6f1f0b2d11"}})),
        (status = 422, description = r#"A query parameter is unknown, repeated or invalid (`limit` outside 1–1000, `cursor` not from this API)."#, body = super::error::Error, example = json!({"error": {"code": "invalid_argument", "message": "limit: must be a whole number from 1 to 1000"}})),
        (status = 500, response = super::error::Internal),
        (status = 503, response = super::error::Unavailable)
    ),
    security(("bearerAuth" = []))
)]
pub async fn list(caller: Caller, state: web::Data<AppState>, id: web::Path<String>, req: HttpRequest) -> Result<HttpResponse, ApiError> {
    let id = parse_id(&id)?;
    let query: AttemptsQuery = parse_query(&req)?;
    let limit = parse_limit(query.limit.as_deref())?;
    let task = tasks::read(&state.pool, id).await?.ok_or_else(|| ApiError::NotFound(format!("no task with id {id}")))?;
    if task.biz_type_id != caller.0.biz_type_id {
        return Err(ApiError::Forbidden("this task belongs to another biz type".into()));
    }
    let from = query.cursor.map_or(AttemptsFrom::Oldest, AttemptsFrom::After);
    let page = tasks::attempts(&state.pool, id, &from, limit).await?;
    Ok(HttpResponse::Ok().json(AttemptList { items: &page.items, next_cursor: page.newer.as_deref() }))
}
