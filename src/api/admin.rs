//! The admin API under `/api/v1/admin/` (docs/design/contract.md, Operating, managing chime as code): biz types,
//! their API tokens and signing secrets, and console users, for an admin token only.
//! The rules are the domain modules' (the console and the CLI use the same ones); every
//! change is in the audit log under the admin token's prefix and name.

use actix_web::{HttpRequest, HttpResponse, web};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

use super::auth::Admin;
use super::{ApiError, from_json, from_raw, parse_query, raw_json, read_optional_json, read_raw_body, resource};
use crate::audit::{self, Action};
use crate::biz_types::{self, BizType, Settings};
use crate::error::Error;
use crate::state::AppState;
use crate::users::{self, UserChanges, UserInfo};

/// Largest request body: settings and names only (a description is at most 1000 bytes).
const BODY_LIMIT: usize = 16 * 1024;

pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.service(resource("/admin/biz-types", "GET, POST").route(web::get().to(list_biz_types)).route(web::post().to(create_biz_type)))
        .service(
            resource("/admin/biz-types/{name}", "GET, PATCH, DELETE")
                .route(web::get().to(get_biz_type))
                .route(web::patch().to(update_biz_type))
                .route(web::delete().to(archive_biz_type)),
        )
        .service(resource("/admin/biz-types/{name}/rotate-secret", "POST").route(web::post().to(rotate_secret)))
        .service(resource("/admin/biz-types/{name}/tokens", "GET, POST").route(web::get().to(list_tokens)).route(web::post().to(create_token)))
        .service(resource("/admin/biz-types/{name}/tokens/{id}", "DELETE").route(web::delete().to(revoke_token)))
        .service(resource("/admin/users", "GET, POST").route(web::get().to(list_users)).route(web::post().to(create_user)))
        .service(resource("/admin/users/{name}", "PATCH, DELETE").route(web::patch().to(update_user)).route(web::delete().to(delete_user)));
}

/// A biz type's settings as the API takes them: every field optional (on create, absent
/// ones take their defaults). Whole numbers beyond 32 bits are taken as the largest (or
/// smallest) 32-bit number, so that the range rule refuses them in its own words.
/// In the document, the create request (`CreateBizType`) is this one with `name` required.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = PatchBizType, description = "The settings to change; absent or null ones stay as they are. `name`, if given, must be the biz type's own (a biz type cannot be renamed).")]
pub(super) struct BizTypeRequest {
    /// Lowercase letters, digits, `-` and `_`, at most 64 characters; cannot be changed later.
    #[schema(pattern = "^[a-z0-9][a-z0-9_-]{0,63}$")]
    name: Option<String>,
    /// Free text, at most 1000 bytes.
    #[schema(max_length = 1000)]
    description: Option<String>,
    /// The http:// or https:// URL callbacks are POSTed to; required in callback mode. With
    /// `CHIME_DENY_PRIVATE_CALLBACKS`, private and loopback addresses are refused.
    callback_url: Option<String>,
    /// `callback` (chime calls the URL; the default) or `pull` (consumers reserve tasks).
    #[schema(value_type = Option<Mode>)]
    mode: Option<String>,
    /// Time a callback may take (default 10000).
    #[schema(minimum = 1, maximum = 600_000)]
    timeout_ms: Option<i64>,
    /// Attempts before a task fails (default 60).
    #[schema(minimum = 1, maximum = 1000)]
    max_attempts: Option<i64>,
    /// `Chime-Snooze` answers a task may take (they do not count toward `max_attempts`)
    /// before the next one fails it; a replay counts afresh (default 10000).
    #[schema(minimum = 0, maximum = 100_000)]
    max_snoozes: Option<i64>,
    /// Delay before the first retry, doubling after each (default 1000).
    #[schema(minimum = 0, maximum = 86_400_000)]
    backoff_initial_ms: Option<i64>,
    /// Longest retry delay, at least `backoff_initial_ms` (default 3600000).
    #[schema(minimum = 0, maximum = 604_800_000)]
    backoff_max_ms: Option<i64>,
    /// Callbacks per second across the cluster; 0: unlimited (the default).
    #[schema(minimum = 0, maximum = 1_000_000)]
    rate_limit: Option<f64>,
    /// Callbacks (or reserved tasks) in flight at once, across the cluster (default 100).
    #[schema(minimum = 1, maximum = 100_000)]
    max_in_flight: Option<i64>,
    /// Callbacks of one flow key (a task's `flow_key`) in flight at once, across the
    /// cluster; 0: no per-key limit (the default).
    #[schema(minimum = 0, maximum = 100_000)]
    flow_max_in_flight: Option<i64>,
    /// Each flow key's tasks are delivered one at a time, in run_at order: the next starts
    /// once the one before is settled (succeeded, failed, expired or cancelled). A task that
    /// fails holds its key while it retries. Default false.
    ordered: Option<bool>,
    /// Callbacks of one flow key started a second, across the cluster; 0: unlimited (the
    /// default).
    #[schema(minimum = 0, maximum = 1_000_000)]
    flow_rate_limit: Option<f64>,
    /// Its share of a node's delivery capacity against the other biz types with due work,
    /// when that capacity is short (`--node-capacity`): a biz type of weight 3 gets three
    /// times the share of one of weight 1. It caps nothing by itself (default 1).
    #[schema(minimum = 1, maximum = 100)]
    weight: Option<i64>,
    /// API creates per second; 0: unlimited (the default).
    #[schema(minimum = 0, maximum = 1_000_000)]
    create_rate_limit: Option<f64>,
    /// Failures in a row (no answer, a timeout, 408, 429 or 5xx) within
    /// `breaker_window_ms` that open the receiver's breaker: the biz type's tasks then wait,
    /// their attempts not counted, while one task every `breaker_probe_ms` probes the
    /// receiver, and deliveries resume by themselves when a probe is answered. 0: no
    /// breaker (default 10).
    #[schema(minimum = 0, maximum = 10_000)]
    breaker_threshold: Option<i64>,
    /// How close together those failures must be: the first at most this long before the
    /// last (default 60000).
    #[schema(minimum = 100, maximum = 86_400_000)]
    breaker_window_ms: Option<i64>,
    /// While the breaker is open, one task probes the receiver this often, across the
    /// cluster (default 5000).
    #[schema(minimum = 100, maximum = 3_600_000)]
    breaker_probe_ms: Option<i64>,
    /// Paused: its tasks stay pending until resumed.
    paused: Option<bool>,
    /// The http:// or https:// URL a signed failure notice is POSTed to when a task ends
    /// `failed` or `expired`, and when the receiver's breaker opens or closes
    /// (`biz_type.receiver_down`, `biz_type.receiver_up`); the same rules as `callback_url`;
    /// `""` removes it.
    failure_url: Option<String>,
    /// How callbacks and failure notices are signed: `chime` (`Chime-Signature`, the
    /// default) or `standard-webhooks` (`webhook-id`, `webhook-timestamp`,
    /// `webhook-signature`, with a `whsec_<base64>` secret). A biz type whose secret is
    /// older than that form is refused the switch (422): rotate its secret first.
    #[schema(value_type = Option<SigningScheme>)]
    signing_scheme: Option<String>,
    /// The chat tool the notices also go to, in its own message format: `dingtalk` (a
    /// custom robot), `feishu` (a Feishu/Lark custom bot), `wecom` (a group robot) or `slack`
    /// (an incoming webhook). Failed and expired tasks are summarised, at most one message
    /// every few minutes; the receiver going down or up is sent as it happens. `""` stops
    /// chat notices (and clears `chat_url` and `chat_secret`).
    #[schema(example = "dingtalk")]
    chat_platform: Option<String>,
    /// The chat tool's incoming webhook URL (http:// or https://, the rules of `callback_url`);
    /// required with `chat_platform`.
    chat_url: Option<String>,
    /// The robot's signing secret, for `dingtalk` (it starts with `SEC`) and `feishu` robots
    /// that have signing turned on; refused for the others. Never shown (`chat_signed` says
    /// whether one is set); dropped when `chat_platform` changes unless given again; `""`
    /// removes it.
    #[schema(max_length = 256)]
    chat_secret: Option<String>,
}

/// How a biz type's callbacks are signed. Only the document uses this type; `biz_types`
/// checks the value.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "kebab-case")]
#[schema(description = "`chime` (chime's own `Chime-Signature`; the default) or `standard-webhooks` (the Standard Webhooks headers).")]
#[allow(dead_code)]
enum SigningScheme {
    Chime,
    StandardWebhooks,
}

/// How a biz type's tasks are delivered. Only the document uses this type; `biz_types` checks
/// the value.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
#[schema(description = "`callback` (chime calls the URL; the default) or `pull` (consumers reserve tasks).")]
#[allow(dead_code)]
enum Mode {
    Callback,
    Pull,
}

/// A console user's role. Only the document uses this type; `users` checks the value.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
#[schema(description = "`admin`: everything; `support`: browse, replay and cancel.")]
#[allow(dead_code)]
enum Role {
    Admin,
    Support,
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
            max_snoozes: int(self.max_snoozes),
            backoff_initial_ms: int(self.backoff_initial_ms),
            backoff_max_ms: int(self.backoff_max_ms),
            rate_limit: self.rate_limit,
            max_in_flight: int(self.max_in_flight),
            flow_max_in_flight: int(self.flow_max_in_flight),
            ordered: self.ordered,
            flow_rate_limit: self.flow_rate_limit,
            weight: int(self.weight),
            create_rate_limit: self.create_rate_limit,
            breaker_threshold: int(self.breaker_threshold),
            breaker_window_ms: int(self.breaker_window_ms),
            breaker_probe_ms: int(self.breaker_probe_ms),
            paused: self.paused,
            failure_url: self.failure_url.clone(),
            signing_scheme: self.signing_scheme.clone(),
            chat_platform: self.chat_platform.clone(),
            chat_url: self.chat_url.clone(),
            chat_secret: self.chat_secret.clone(),
        }
    }
}

async fn read<T: serde::de::DeserializeOwned>(body: web::Payload) -> Result<T, ApiError> {
    let body = read_raw_body(body, BODY_LIMIT).await?;
    from_raw::<T>(raw_json(&body)?)
}

async fn found(state: &AppState, name: &str) -> Result<BizType, ApiError> {
    biz_types::by_name(&state.pool, name).await?.ok_or_else(|| ApiError::NotFound(format!("no biz type named `{}`", name.escape_debug())))
}

#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct BizTypeList {
    items: Vec<BizType>,
}

#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct ApiTokenList {
    items: Vec<biz_types::TokenInfo>,
}

#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct UserList {
    items: Vec<UserInfo>,
}

#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct SigningSecret {
    /// The new secret, shown only this once; callbacks are signed with it from now on.
    signing_secret: String,
    /// Until when callbacks carry a second signature, with the secret this rotation
    /// replaced; null: the old secret stopped at once.
    previous_secret_until: Option<chrono::DateTime<chrono::Utc>>,
}

/// How long the replaced secret keeps signing (a JSON body, or the query parameter).
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = RotateSecret)]
pub(super) struct Rotation {
    /// Seconds during which callbacks carry both signatures, the new secret's and the
    /// replaced one's: 0 (the old secret stops at once) to 2592000 (30 days); default 86400.
    #[schema(minimum = 0, maximum = 2_592_000, default = 86_400)]
    overlap_secs: Option<i64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ListQuery {
    archived: Option<bool>,
}

/// The biz types in use; with `archived=true`, archived ones too.
#[utoipa::path(
    get,
    path = "/api/v1/admin/biz-types",
    operation_id = "adminListBizTypes",
    tag = "admin",
    summary = r#"List biz types"#,
    description = r#"Biz types by name; archived ones only with `archived=true`."#,
    params(
        ("archived" = Option<bool>, Query, description = r#"`true`: archived biz types too."#)
    ),
    responses(
        (status = 200, description = r#"The biz types."#, body = BizTypeList),
        (status = 401, response = super::error::AdminUnauthenticated),
        (status = 403, response = super::error::AdminForbidden),
        (status = 422, description = r#"A field is invalid; the message names it (the same rules and words as the console's form and `chime biz-type`)."#, body = super::error::Error, example = json!({"error": {"code": "invalid_argument", "message": "query: archived: provided string was not `true` or `false`"}})),
        (status = 500, response = super::error::Internal),
        (status = 503, response = super::error::Unavailable)
    ),
    security(("adminAuth" = []))
)]
pub(super) async fn list_biz_types(_: Admin, req: HttpRequest, state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    let query: ListQuery = parse_query(&req)?;
    let items = if query.archived == Some(true) { biz_types::list_all(&state.pool).await? } else { biz_types::list(&state.pool).await? };
    Ok(HttpResponse::Ok().json(BizTypeList { items }))
}

#[utoipa::path(
    get,
    path = "/api/v1/admin/biz-types/{name}",
    operation_id = "adminGetBizType",
    tag = "admin",
    summary = r#"Get a biz type"#,
    description = r#"Archived ones too (`archived_at` set)."#,
    params(
        ("name" = String, Path, description = r#"The biz type's name."#)
    ),
    responses(
        (status = 200, description = r#"The biz type."#, body = BizType),
        (status = 401, response = super::error::AdminUnauthenticated),
        (status = 403, response = super::error::AdminForbidden),
        (status = 404, description = r#"No biz type has this name."#, body = super::error::Error, example = json!({"error": {"code": "not_found", "message": "no biz type named `billing`"}})),
        (status = 500, response = super::error::Internal),
        (status = 503, response = super::error::Unavailable)
    ),
    security(("adminAuth" = []))
)]
pub(super) async fn get_biz_type(_: Admin, state: web::Data<AppState>, name: web::Path<String>) -> Result<HttpResponse, ApiError> {
    Ok(HttpResponse::Ok().json(found(&state, &name).await?))
}

/// A biz type with its signing secret: answered once, when the secret is made.
#[derive(Serialize, ToSchema)]
#[schema(as = BizTypeCreated, description = "A new biz type, with its signing secret.")]
pub(super) struct WithSecret<'a> {
    #[serde(flatten)]
    biz_type: &'a BizType,
    /// Shown only this once.
    signing_secret: &'a str,
}

#[utoipa::path(
    post,
    path = "/api/v1/admin/biz-types",
    operation_id = "adminCreateBizType",
    tag = "admin",
    summary = r#"Create a biz type"#,
    description = r#"Answers with its signing secret, shown only this once."#,
    request_body(content = ref("#/components/schemas/CreateBizType"), example = json!({"name": "orders", "callback_url": "https://orders.internal/chime", "timeout_ms": 5000})),
    responses(
        (status = 201, description = r#"The new biz type and its signing secret."#, links(("GetBizType" = (operation_id = "adminGetBizType", parameters(("name" = "$response.body#/name")))), ("CreateApiToken" = (operation_id = "adminCreateApiToken", parameters(("name" = "$response.body#/name"))))), body = WithSecret),
        (status = 400, response = super::error::BadBody),
        (status = 401, response = super::error::AdminUnauthenticated),
        (status = 403, response = super::error::AdminForbidden),
        (status = 408, response = super::error::RequestTimeout),
        (status = 409, description = r#"A biz type has this name, or had it and is archived (the name stays reserved)."#, body = super::error::Error, example = json!({"error": {"code": "key_conflict", "message": "biz type `orders` is archived: it cannot be changed, and its name stays reserved"}})),
        (status = 413, response = super::error::BodyOver16KiB),
        (status = 422, description = r#"A field is invalid; the message names it (the same rules and words as the console's form and `chime biz-type`)."#, body = super::error::Error, example = json!({"error": {"code": "invalid_argument", "message": "timeout_ms: must be between 1 and 600000"}})),
        (status = 500, response = super::error::Internal),
        (status = 503, response = super::error::Unavailable)
    ),
    security(("adminAuth" = []))
)]
pub(super) async fn create_biz_type(admin: Admin, state: web::Data<AppState>, body: web::Payload) -> Result<HttpResponse, ApiError> {
    let request: BizTypeRequest = read(body).await?;
    let name = request.name.as_deref().ok_or_else(|| ApiError::from(Error::invalid("name", "is required")))?;
    let created = biz_types::create_audited(&state.pool, name, &request.settings(), state.callback_hosts, &admin.0.actor()).await?;
    Ok(HttpResponse::Created().json(WithSecret { biz_type: &created, signing_secret: created.signing_secret.expose().map_err(Error::from)? }))
}

#[utoipa::path(
    patch,
    path = "/api/v1/admin/biz-types/{name}",
    operation_id = "adminUpdateBizType",
    tag = "admin",
    summary = r#"Change a biz type's settings"#,
    description = r#"Changes the settings given; running nodes apply them at once."#,
    params(
        ("name" = String, Path, description = r#"The biz type's name."#)
    ),
    request_body(content = BizTypeRequest, example = json!({"paused": true})),
    responses(
        (status = 200, description = r#"The biz type as it is now."#, body = BizType),
        (status = 400, response = super::error::BadBody),
        (status = 401, response = super::error::AdminUnauthenticated),
        (status = 403, response = super::error::AdminForbidden),
        (status = 404, description = r#"No biz type has this name."#, body = super::error::Error, example = json!({"error": {"code": "not_found", "message": "no biz type named `billing`"}})),
        (status = 408, response = super::error::RequestTimeout),
        (status = 409, description = r#"The biz type is archived: it cannot be changed."#, body = super::error::Error, example = json!({"error": {"code": "invalid_state", "message": "biz type `orders` is archived: it cannot be changed, and its name stays reserved"}})),
        (status = 413, response = super::error::BodyOver16KiB),
        (status = 422, description = r#"A field is invalid; the message names it (the same rules and words as the console's form and `chime biz-type`)."#, body = super::error::Error, example = json!({"error": {"code": "invalid_argument", "message": "backoff_max_ms: must be at least backoff_initial_ms"}})),
        (status = 500, response = super::error::Internal),
        (status = 503, response = super::error::Unavailable)
    ),
    security(("adminAuth" = []))
)]
pub(super) async fn update_biz_type(
    admin: Admin,
    state: web::Data<AppState>,
    name: web::Path<String>,
    body: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let request: BizTypeRequest = read(body).await?;
    if request.name.as_ref().is_some_and(|n| n != name.as_str()) {
        return Err(Error::invalid("name", "a biz type cannot be renamed").into());
    }
    found(&state, &name).await?;
    let by = audit::By { actor: &admin.0.actor(), action: Action::BizTypeUpdate };
    let (_, after) = biz_types::update_audited(&state.pool, &name, &request.settings(), state.callback_hosts, by).await?;
    Ok(HttpResponse::Ok().json(after))
}

/// The archived biz type, and how many of its pending tasks this call cancelled.
#[derive(Serialize, ToSchema)]
#[schema(as = BizTypeArchived)]
pub(super) struct Archived<'a> {
    #[serde(flatten)]
    biz_type: &'a BizType,
    /// Pending tasks cancelled by this call.
    cancelled_tasks: u64,
}

/// Deleting a biz type archives it (`biz_types::archive` says what that means).
#[utoipa::path(
    delete,
    path = "/api/v1/admin/biz-types/{name}",
    operation_id = "adminArchiveBizType",
    tag = "admin",
    summary = r#"Archive (delete) a biz type"#,
    description = r#"Archives it: its API tokens stop working (403 saying it is archived), creates are refused, its pending tasks are cancelled, its timers stop, nothing more is delivered; its tasks stay readable until retention drops them. It is hidden from lists unless `archived=true`, and its name stays reserved. Archiving again changes nothing (but cancels any pending task left)."#,
    params(
        ("name" = String, Path, description = r#"The biz type's name."#)
    ),
    responses(
        (status = 200, description = r#"The archived biz type."#, body = Archived),
        (status = 401, response = super::error::AdminUnauthenticated),
        (status = 403, response = super::error::AdminForbidden),
        (status = 404, description = r#"No biz type has this name."#, body = super::error::Error, example = json!({"error": {"code": "not_found", "message": "no biz type named `billing`"}})),
        (status = 500, response = super::error::Internal),
        (status = 503, response = super::error::Unavailable)
    ),
    security(("adminAuth" = []))
)]
pub(super) async fn archive_biz_type(admin: Admin, state: web::Data<AppState>, name: web::Path<String>) -> Result<HttpResponse, ApiError> {
    let (_, after, cancelled_tasks) = biz_types::archive(&state.pool, &name, &admin.0.actor()).await?;
    // This node's cache at once; the others empty theirs on the `settings` notification.
    state.forget_tokens();
    Ok(HttpResponse::Ok().json(Archived { biz_type: &after, cancelled_tasks }))
}

#[utoipa::path(
    post,
    path = "/api/v1/admin/biz-types/{name}/rotate-secret",
    operation_id = "adminRotateSecret",
    tag = "admin",
    summary = r#"Rotate a biz type's signing secret"#,
    description = r#"Callbacks are signed with the new secret at once; it is answered only this once. For `overlap_secs` (default 86400, a day) they carry the replaced secret's signature too, `Chime-Signature: t=<t>,v1=<new>,v1=<old>`, so that receivers verifying with either keep working while they take the new one. Rotating again during an overlap keeps the secret just replaced; the older one stops. `overlap_secs` may be given in a JSON body or as a query parameter."#,
    params(
        ("name" = String, Path, description = r#"The biz type's name."#),
        ("overlap_secs" = Option<i64>, Query, description = r#"Seconds the replaced secret keeps signing: 0 to 2592000 (30 days); default 86400. Or in the body."#, minimum = 0, maximum = 2_592_000)
    ),
    request_body(content = Option<Rotation>, example = json!({"overlap_secs": 3600})),
    responses(
        (status = 200, description = r#"The new signing secret, and until when the old one still signs."#, body = SigningSecret),
        (status = 400, response = super::error::BadBody),
        (status = 401, response = super::error::AdminUnauthenticated),
        (status = 403, response = super::error::AdminForbidden),
        (status = 404, description = r#"No biz type has this name."#, body = super::error::Error, example = json!({"error": {"code": "not_found", "message": "no biz type named `billing`"}})),
        (status = 409, description = r#"The biz type is archived: it cannot be changed."#, body = super::error::Error, example = json!({"error": {"code": "invalid_state", "message": "biz type `orders` is archived: it cannot be changed, and its name stays reserved"}})),
        (status = 413, response = super::error::BodyOver16KiB),
        (status = 422, description = r#"`overlap_secs` is out of range, or given twice."#, body = super::error::Error, example = json!({"error": {"code": "invalid_argument", "message": "overlap_secs: must be between 0 (the old secret stops at once) and 2592000 (30 days), not 9999999"}})),
        (status = 500, response = super::error::Internal),
        (status = 503, response = super::error::Unavailable)
    ),
    security(("adminAuth" = []))
)]
pub(super) async fn rotate_secret(
    admin: Admin,
    req: HttpRequest,
    state: web::Data<AppState>,
    name: web::Path<String>,
    body: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let query: Rotation = parse_query(&req)?;
    // The body is optional: an empty one asks for the default overlap.
    let asked: Rotation = read_optional_json(body, BODY_LIMIT).await?.map(from_json).transpose()?.unwrap_or(Rotation { overlap_secs: None });
    let overlap_secs = match (query.overlap_secs, asked.overlap_secs) {
        (Some(_), Some(_)) => return Err(Error::invalid("overlap_secs", "give it in the body or the query, not both").into()),
        (q, b) => q.or(b).unwrap_or(biz_types::DEFAULT_OVERLAP_SECS),
    };
    let b = found(&state, &name).await?;
    let rotated = biz_types::rotate_secret(&state.pool, b.id, overlap_secs, &admin.0.actor()).await?;
    Ok(HttpResponse::Ok().json(SigningSecret { signing_secret: rotated.secret, previous_secret_until: rotated.previous_until }))
}

#[utoipa::path(
    get,
    path = "/api/v1/admin/biz-types/{name}/tokens",
    operation_id = "adminListApiTokens",
    tag = "admin",
    summary = r#"List a biz type's API tokens"#,
    description = r#"Newest first, revoked ones included; never the tokens themselves. Each with its name (if given) and when it last let a request in (to within a minute), to tell which one is safe to revoke."#,
    params(
        ("name" = String, Path, description = r#"The biz type's name."#)
    ),
    responses(
        (status = 200, description = r#"The tokens."#, body = ApiTokenList),
        (status = 401, response = super::error::AdminUnauthenticated),
        (status = 403, response = super::error::AdminForbidden),
        (status = 404, description = r#"No biz type has this name."#, body = super::error::Error, example = json!({"error": {"code": "not_found", "message": "no biz type named `billing`"}})),
        (status = 500, response = super::error::Internal),
        (status = 503, response = super::error::Unavailable)
    ),
    security(("adminAuth" = []))
)]
pub(super) async fn list_tokens(_: Admin, state: web::Data<AppState>, name: web::Path<String>) -> Result<HttpResponse, ApiError> {
    let b = found(&state, &name).await?;
    Ok(HttpResponse::Ok().json(ApiTokenList { items: biz_types::list_tokens(&state.pool, b.id).await? }))
}

/// What a new API token is for (the body is optional).
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = CreateApiToken)]
pub(super) struct TokenRequest {
    /// What the token is for ("ci", "billing worker"), shown in token lists: at most 64
    /// characters, no control characters; absent or blank: unnamed.
    #[schema(max_length = 64)]
    name: Option<String>,
}

/// A new API token: `token` is shown only this once.
#[derive(Serialize, ToSchema)]
#[schema(as = NewApiToken)]
pub(super) struct NewToken<'a> {
    #[serde(flatten)]
    info: &'a biz_types::TokenInfo,
    /// Shown only this once.
    token: &'a str,
}

#[utoipa::path(
    post,
    path = "/api/v1/admin/biz-types/{name}/tokens",
    operation_id = "adminCreateApiToken",
    tag = "admin",
    summary = r#"Create an API token"#,
    description = r#"The token is answered only this once; only its SHA-256 is kept. An optional body names what it is for (`{"name": "ci"}`), so that token lists say which one is which; they show when each was last used too."#,
    params(
        ("name" = String, Path, description = r#"The biz type's name."#)
    ),
    request_body(content = Option<TokenRequest>, example = json!({"name": "ci"})),
    responses(
        (status = 201, description = r#"The new token."#, links(("RevokeApiToken" = (operation_id = "adminRevokeApiToken", parameters(("name" = "$request.path.name"), ("id" = "$response.body#/id"))))), body = NewToken),
        (status = 400, response = super::error::BadBody),
        (status = 401, response = super::error::AdminUnauthenticated),
        (status = 403, response = super::error::AdminForbidden),
        (status = 404, description = r#"No biz type has this name."#, body = super::error::Error, example = json!({"error": {"code": "not_found", "message": "no biz type named `billing`"}})),
        (status = 409, description = r#"The biz type is archived: it cannot be changed."#, body = super::error::Error, example = json!({"error": {"code": "invalid_state", "message": "biz type `orders` is archived: it cannot be changed, and its name stays reserved"}})),
        (status = 413, response = super::error::BodyOver16KiB),
        (status = 422, description = r#"The token's `name` is too long or holds control characters."#, body = super::error::Error, example = json!({"error": {"code": "invalid_argument", "message": "name: must be at most 64 characters, without control characters"}})),
        (status = 500, response = super::error::Internal),
        (status = 503, response = super::error::Unavailable)
    ),
    security(("adminAuth" = []))
)]
pub(super) async fn create_token(
    admin: Admin,
    state: web::Data<AppState>,
    name: web::Path<String>,
    body: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let asked: Option<TokenRequest> = read_optional_json(body, BODY_LIMIT).await?.map(from_json).transpose()?;
    found(&state, &name).await?;
    let (info, token) = biz_types::mint_token(&state.pool, &name, asked.and_then(|a| a.name).as_deref(), &admin.0.actor()).await?;
    Ok(HttpResponse::Created().json(NewToken { info: &info, token: &token }))
}

#[utoipa::path(
    delete,
    path = "/api/v1/admin/biz-types/{name}/tokens/{id}",
    operation_id = "adminRevokeApiToken",
    tag = "admin",
    summary = r#"Revoke an API token"#,
    description = r#"Calls with it are refused within seconds (each node checks a token again after 5 s). Revoking twice is harmless."#,
    params(
        ("name" = String, Path, description = r#"The biz type's name."#),
        ("id" = Uuid, Path, description = r#"The token's id."#)
    ),
    responses(
        (status = 204, description = r#"Revoked."#),
        (status = 400, description = r#"The `id` in the path is not a UUID."#, body = super::error::Error, example = json!({"error": {"code": "bad_request", "message": "`42` is not a token id (a UUID)"}})),
        (status = 401, response = super::error::AdminUnauthenticated),
        (status = 403, response = super::error::AdminForbidden),
        (status = 404, description = r#"No biz type has this name, or it has no token with this id."#, body = super::error::Error, example = json!({"error": {"code": "not_found", "message": "no token 01937a4e-8f5c-7cc2-9a54-3c6f1f0b2d11 in this biz type"}})),
        (status = 500, response = super::error::Internal),
        (status = 503, response = super::error::Unavailable)
    ),
    security(("adminAuth" = []))
)]
pub(super) async fn revoke_token(admin: Admin, state: web::Data<AppState>, path: web::Path<(String, String)>) -> Result<HttpResponse, ApiError> {
    let (name, id) = path.into_inner();
    let b = found(&state, &name).await?;
    let id: Uuid = id.parse().map_err(|_| ApiError::BadRequest(format!("`{}` is not a token id (a UUID)", id.escape_debug())))?;
    biz_types::revoke_token(&state.pool, b.id, id, &admin.0.actor()).await?;
    state.forget_tokens();
    Ok(HttpResponse::NoContent().finish())
}

#[utoipa::path(
    get,
    path = "/api/v1/admin/users",
    operation_id = "adminListUsers",
    tag = "admin",
    summary = r#"List console users"#,
    description = r#"By name; never their passwords."#,
    responses(
        (status = 200, description = r#"The users."#, body = UserList),
        (status = 401, response = super::error::AdminUnauthenticated),
        (status = 403, response = super::error::AdminForbidden),
        (status = 500, response = super::error::Internal),
        (status = 503, response = super::error::Unavailable)
    ),
    security(("adminAuth" = []))
)]
pub(super) async fn list_users(_: Admin, state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    Ok(HttpResponse::Ok().json(UserList { items: users::list(&state.pool).await? }))
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = CreateUser)]
pub(super) struct NewUser {
    /// Letters, digits, `_`, `.`, `@` and `-`, at most 64, starting with a letter or digit.
    #[schema(pattern = "^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$")]
    name: String,
    /// `admin`: everything; `support`: browse, replay and cancel.
    #[schema(value_type = Role)]
    role: String,
    /// At least 8 characters; stored as an argon2 hash only.
    #[schema(min_length = 8)]
    password: String,
}

#[utoipa::path(
    post,
    path = "/api/v1/admin/users",
    operation_id = "adminCreateUser",
    tag = "admin",
    summary = r#"Create a console user"#,
    description = r#"The same rules as `chime user create`."#,
    request_body(content = NewUser, example = json!({"name": "helen", "role": "support", "password": "correct horse battery"})),
    responses(
        (status = 201, description = r#"The new user."#, body = UserInfo),
        (status = 400, response = super::error::BadBody),
        (status = 401, response = super::error::AdminUnauthenticated),
        (status = 403, response = super::error::AdminForbidden),
        (status = 408, response = super::error::RequestTimeout),
        (status = 409, description = r#"A user has this name."#, body = super::error::Error, example = json!({"error": {"code": "key_conflict", "message": "user `helen` already exists"}})),
        (status = 413, response = super::error::BodyOver16KiB),
        (status = 422, description = r#"A field is invalid; the message names it (the same rules and words as the console's form and `chime biz-type`)."#, body = super::error::Error, example = json!({"error": {"code": "invalid_argument", "message": "password: must be at least 8 characters"}})),
        (status = 500, response = super::error::Internal),
        (status = 503, response = super::error::Unavailable)
    ),
    security(("adminAuth" = []))
)]
pub(super) async fn create_user(admin: Admin, state: web::Data<AppState>, body: web::Payload) -> Result<HttpResponse, ApiError> {
    let request: NewUser = read(body).await?;
    let user = users::create_audited(&state.pool, &request.name, &request.role, &request.password, &admin.0.actor(), "given").await?;
    Ok(HttpResponse::Created().json(user))
}

/// What to change; absent or null fields stay as they are. A new password, or disabling,
/// signs the user out.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = PatchUser)]
pub(super) struct UserPatch {
    /// `admin`: everything; `support`: browse, replay and cancel.
    #[schema(value_type = Option<Role>)]
    role: Option<String>,
    /// At least 8 characters; stored as an argon2 hash only.
    #[schema(min_length = 8)]
    password: Option<String>,
    disabled: Option<bool>,
}

#[utoipa::path(
    patch,
    path = "/api/v1/admin/users/{name}",
    operation_id = "adminUpdateUser",
    tag = "admin",
    summary = r#"Change a user's role or password, or disable them"#,
    description = r#"A new password, or disabling, signs the user out everywhere."#,
    params(
        ("name" = String, Path, description = r#"The user's name."#)
    ),
    request_body(content = UserPatch, example = json!({"disabled": true})),
    responses(
        (status = 200, description = r#"The user as they are now."#, body = UserInfo),
        (status = 400, response = super::error::BadBody),
        (status = 401, response = super::error::AdminUnauthenticated),
        (status = 403, response = super::error::AdminForbidden),
        (status = 404, description = r#"No user has this name."#, body = super::error::Error, example = json!({"error": {"code": "not_found", "message": "no user named `helen`"}})),
        (status = 408, response = super::error::RequestTimeout),
        (status = 409, description = r#"The change would leave no enabled admin."#, body = super::error::Error, example = json!({"error": {"code": "invalid_state", "message": "`admin` is the last enabled admin; make another user an admin first"}})),
        (status = 413, response = super::error::BodyOver16KiB),
        (status = 422, description = r#"A field is invalid; the message names it (the same rules and words as the console's form and `chime biz-type`)."#, body = super::error::Error, example = json!({"error": {"code": "invalid_argument", "message": "role: must be admin or support"}})),
        (status = 500, response = super::error::Internal),
        (status = 503, response = super::error::Unavailable)
    ),
    security(("adminAuth" = []))
)]
pub(super) async fn update_user(
    admin: Admin,
    state: web::Data<AppState>,
    name: web::Path<String>,
    body: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let patch: UserPatch = read(body).await?;
    let changes = UserChanges { role: patch.role, password: patch.password, disabled: patch.disabled };
    // The password is never recorded; that it changed is.
    let by = audit::By { actor: &admin.0.actor(), action: Action::UserUpdate };
    let how = changes.password.is_some().then_some("changed");
    let (_, after): (UserInfo, UserInfo) = users::update_audited(&state.pool, &name, &changes, by, how).await?;
    Ok(HttpResponse::Ok().json(after))
}

#[utoipa::path(
    delete,
    path = "/api/v1/admin/users/{name}",
    operation_id = "adminDeleteUser",
    tag = "admin",
    summary = r#"Delete a console user"#,
    description = r#"Their sessions end; their entries in the audit log stay."#,
    params(
        ("name" = String, Path, description = r#"The user's name."#)
    ),
    responses(
        (status = 204, description = r#"Deleted."#),
        (status = 401, response = super::error::AdminUnauthenticated),
        (status = 403, response = super::error::AdminForbidden),
        (status = 404, description = r#"No user has this name."#, body = super::error::Error, example = json!({"error": {"code": "not_found", "message": "no user named `helen`"}})),
        (status = 409, description = r#"The change would leave no enabled admin."#, body = super::error::Error, example = json!({"error": {"code": "invalid_state", "message": "`admin` is the last enabled admin; make another user an admin first"}})),
        (status = 500, response = super::error::Internal),
        (status = 503, response = super::error::Unavailable)
    ),
    security(("adminAuth" = []))
)]
pub(super) async fn delete_user(admin: Admin, state: web::Data<AppState>, name: web::Path<String>) -> Result<HttpResponse, ApiError> {
    users::delete(&state.pool, &name, &admin.0.actor()).await?;
    Ok(HttpResponse::NoContent().finish())
}
