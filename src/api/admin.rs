//! The admin API under `/api/v1/admin/` (SPEC §14, managing chime as code): biz types,
//! their API tokens and signing secrets, and console users, for an admin token only.
//! The rules are the domain modules' (the console and the CLI use the same ones); every
//! change is in the audit log under the admin token's prefix and name.

use actix_web::{HttpRequest, HttpResponse, web};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::auth::Admin;
use super::{ApiError, from_raw, parse_query, raw_json, read_raw_body, resource};
use crate::state::AppState;
use crate::biz_types::{self, BizType, Settings};
use crate::users::{self, UserChanges, UserInfo};
use crate::{audit, error::Error};

/// Largest request body: settings and names only (a description is at most 1000 bytes).
const BODY_LIMIT: usize = 16 * 1024;

pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.service(
        resource("/admin/biz-types", "GET, POST").route(web::get().to(list_biz_types)).route(web::post().to(create_biz_type)),
    )
    .service(
        resource("/admin/biz-types/{name}", "GET, PATCH, DELETE")
            .route(web::get().to(get_biz_type))
            .route(web::patch().to(update_biz_type))
            .route(web::delete().to(archive_biz_type)),
    )
    .service(resource("/admin/biz-types/{name}/rotate-secret", "POST").route(web::post().to(rotate_secret)))
    .service(
        resource("/admin/biz-types/{name}/tokens", "GET, POST").route(web::get().to(list_tokens)).route(web::post().to(create_token)),
    )
    .service(resource("/admin/biz-types/{name}/tokens/{id}", "DELETE").route(web::delete().to(revoke_token)))
    .service(resource("/admin/users", "GET, POST").route(web::get().to(list_users)).route(web::post().to(create_user)))
    .service(
        resource("/admin/users/{name}", "PATCH, DELETE").route(web::patch().to(update_user)).route(web::delete().to(delete_user)),
    );
}

/// A biz type's settings as the API takes them: every field optional (on create, absent
/// ones take their defaults). Whole numbers beyond 32 bits are taken as the largest (or
/// smallest) 32-bit number, so that the range rule refuses them in its own words.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BizTypeRequest {
    name: Option<String>,
    description: Option<String>,
    callback_url: Option<String>,
    mode: Option<String>,
    timeout_ms: Option<i64>,
    max_attempts: Option<i64>,
    backoff_initial_ms: Option<i64>,
    backoff_max_ms: Option<i64>,
    rate_limit: Option<f64>,
    max_in_flight: Option<i64>,
    create_rate_limit: Option<f64>,
    paused: Option<bool>,
}

impl BizTypeRequest {
    fn settings(&self) -> Settings {
        let int = |v: Option<i64>| v.map(|v| i32::try_from(v).unwrap_or(if v < 0 { i32::MIN } else { i32::MAX }));
        Settings {
            description: self.description.clone(),
            callback_url: self.callback_url.clone(),
            mode: self.mode.clone(),
            timeout_ms: int(self.timeout_ms),
            max_attempts: int(self.max_attempts),
            backoff_initial_ms: int(self.backoff_initial_ms),
            backoff_max_ms: int(self.backoff_max_ms),
            rate_limit: self.rate_limit,
            max_in_flight: int(self.max_in_flight),
            create_rate_limit: self.create_rate_limit,
            paused: self.paused,
        }
    }
}

async fn read<T: serde::de::DeserializeOwned>(body: web::Payload) -> Result<T, ApiError> {
    let body = read_raw_body(body, BODY_LIMIT).await?;
    from_raw::<T>(raw_json(&body)?)
}

fn snapshot<T: Serialize>(value: &T) -> Option<serde_json::Value> {
    serde_json::to_value(value).ok()
}

async fn found(state: &AppState, name: &str) -> Result<BizType, ApiError> {
    biz_types::by_name(&state.pool, name).await?.ok_or_else(|| ApiError::NotFound(format!("no biz type named `{}`", name.escape_debug())))
}

#[derive(Serialize)]
struct Items<T> {
    items: Vec<T>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ListQuery {
    archived: Option<bool>,
}

/// The biz types in use; with `archived=true`, archived ones too.
async fn list_biz_types(_: Admin, req: HttpRequest, state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    let query: ListQuery = parse_query(&req)?;
    let items = if query.archived == Some(true) { biz_types::list_all(&state.pool).await? } else { biz_types::list(&state.pool).await? };
    Ok(HttpResponse::Ok().json(Items { items }))
}

async fn get_biz_type(_: Admin, state: web::Data<AppState>, name: web::Path<String>) -> Result<HttpResponse, ApiError> {
    Ok(HttpResponse::Ok().json(found(&state, &name).await?))
}

/// A biz type with its signing secret: answered once, when the secret is made.
#[derive(Serialize)]
struct WithSecret<'a> {
    #[serde(flatten)]
    biz_type: &'a BizType,
    signing_secret: &'a str,
}

async fn create_biz_type(admin: Admin, state: web::Data<AppState>, body: web::Payload) -> Result<HttpResponse, ApiError> {
    let request: BizTypeRequest = read(body).await?;
    let name = request.name.as_deref().ok_or_else(|| ApiError::from(Error::invalid("name", "is required")))?;
    let created = biz_types::create(&state.pool, name, &request.settings(), state.callback_hosts).await?;
    audit::record(&state.pool, &admin.0.actor(), "biz_type.create", "biz_type", name, None, snapshot(&created)).await?;
    Ok(HttpResponse::Created().json(WithSecret { biz_type: &created, signing_secret: created.signing_secret.expose().map_err(Error::from)? }))
}

async fn update_biz_type(admin: Admin, state: web::Data<AppState>, name: web::Path<String>, body: web::Payload) -> Result<HttpResponse, ApiError> {
    let request: BizTypeRequest = read(body).await?;
    if request.name.as_ref().is_some_and(|n| n != name.as_str()) {
        return Err(Error::invalid("name", "a biz type cannot be renamed").into());
    }
    found(&state, &name).await?;
    let (before, after) = biz_types::update(&state.pool, &name, &request.settings(), state.callback_hosts).await?;
    audit::record(&state.pool, &admin.0.actor(), "biz_type.update", "biz_type", &name, snapshot(&before), snapshot(&after)).await?;
    Ok(HttpResponse::Ok().json(after))
}

#[derive(Serialize)]
struct Archived<'a> {
    #[serde(flatten)]
    biz_type: &'a BizType,
    /// Pending tasks cancelled by this call.
    cancelled_tasks: u64,
}

/// Deleting a biz type archives it (`biz_types::archive` says what that means).
async fn archive_biz_type(admin: Admin, state: web::Data<AppState>, name: web::Path<String>) -> Result<HttpResponse, ApiError> {
    let (before, after, cancelled_tasks) = biz_types::archive(&state.pool, &name).await?;
    // This node's cache at once; the others empty theirs on the `settings` notification.
    state.forget_tokens();
    let mut record = snapshot(&after);
    if let Some(serde_json::Value::Object(fields)) = &mut record {
        fields.insert("cancelled_tasks".into(), cancelled_tasks.into());
    }
    audit::record(&state.pool, &admin.0.actor(), "biz_type.archive", "biz_type", &name, snapshot(&before), record).await?;
    Ok(HttpResponse::Ok().json(Archived { biz_type: &after, cancelled_tasks }))
}

async fn rotate_secret(admin: Admin, state: web::Data<AppState>, name: web::Path<String>) -> Result<HttpResponse, ApiError> {
    let b = found(&state, &name).await?;
    let secret = biz_types::rotate_secret(&state.pool, b.id).await?;
    audit::record(&state.pool, &admin.0.actor(), "biz_type.rotate_secret", "biz_type", &name, None, None).await?;
    Ok(HttpResponse::Ok().json(serde_json::json!({"signing_secret": secret})))
}

async fn list_tokens(_: Admin, state: web::Data<AppState>, name: web::Path<String>) -> Result<HttpResponse, ApiError> {
    let b = found(&state, &name).await?;
    Ok(HttpResponse::Ok().json(Items { items: biz_types::list_tokens(&state.pool, b.id).await? }))
}

#[derive(Serialize)]
struct NewToken<'a> {
    #[serde(flatten)]
    info: &'a biz_types::TokenInfo,
    /// Shown only this once.
    token: &'a str,
}

async fn create_token(admin: Admin, state: web::Data<AppState>, name: web::Path<String>) -> Result<HttpResponse, ApiError> {
    found(&state, &name).await?;
    let (info, token) = biz_types::mint_token(&state.pool, &name).await?;
    audit::record(&state.pool, &admin.0.actor(), "token.create", "biz_type", &name, None, Some(info.prefix.clone().into())).await?;
    Ok(HttpResponse::Created().json(NewToken { info: &info, token: &token }))
}

async fn revoke_token(admin: Admin, state: web::Data<AppState>, path: web::Path<(String, String)>) -> Result<HttpResponse, ApiError> {
    let (name, id) = path.into_inner();
    let b = found(&state, &name).await?;
    let id: Uuid = id.parse().map_err(|_| ApiError::BadRequest(format!("`{}` is not a token id (a UUID)", id.escape_debug())))?;
    let prefix = biz_types::revoke_token(&state.pool, b.id, id).await?;
    audit::record(&state.pool, &admin.0.actor(), "token.revoke", "biz_type", &name, None, Some(prefix.into())).await?;
    Ok(HttpResponse::NoContent().finish())
}

async fn list_users(_: Admin, state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    Ok(HttpResponse::Ok().json(Items { items: users::list(&state.pool).await? }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NewUser {
    name: String,
    role: String,
    password: String,
}

async fn create_user(admin: Admin, state: web::Data<AppState>, body: web::Payload) -> Result<HttpResponse, ApiError> {
    let request: NewUser = read(body).await?;
    let user = users::create(&state.pool, &request.name, &request.role, &request.password).await?;
    audit::record(&state.pool, &admin.0.actor(), "user.create", "user", &user.name, None, snapshot(&user)).await?;
    Ok(HttpResponse::Created().json(user))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct UserPatch {
    role: Option<String>,
    password: Option<String>,
    disabled: Option<bool>,
}

async fn update_user(admin: Admin, state: web::Data<AppState>, name: web::Path<String>, body: web::Payload) -> Result<HttpResponse, ApiError> {
    let patch: UserPatch = read(body).await?;
    let changes = UserChanges { role: patch.role, password: patch.password, disabled: patch.disabled };
    let (before, after): (UserInfo, UserInfo) = users::update(&state.pool, &name, &changes).await?;
    // The password is never recorded; that it changed is.
    let mut record = snapshot(&after);
    if let (Some(serde_json::Value::Object(fields)), true) = (&mut record, changes.password.is_some()) {
        fields.insert("password".into(), "changed".into());
    }
    audit::record(&state.pool, &admin.0.actor(), "user.update", "user", &name, snapshot(&before), record).await?;
    Ok(HttpResponse::Ok().json(after))
}

async fn delete_user(admin: Admin, state: web::Data<AppState>, name: web::Path<String>) -> Result<HttpResponse, ApiError> {
    let user = users::delete(&state.pool, &name).await?;
    audit::record(&state.pool, &admin.0.actor(), "user.delete", "user", &name, snapshot(&user), None).await?;
    Ok(HttpResponse::NoContent().finish())
}
