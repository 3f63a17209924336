//! The API's error: each variant answers with its status and the JSON shape docs/design/contract.md, API, describes
//! `{"error": {"code", "message"}}`. Internal causes are logged, never sent.

use std::time::Duration;

use actix_web::http::StatusCode;
use actix_web::{HttpResponse, ResponseError};
use serde::Serialize;
use serde_json::{Value, json};
use utoipa::openapi::RefOr;
use utoipa::openapi::content::ContentBuilder;
use utoipa::openapi::header::HeaderBuilder;
use utoipa::openapi::response::{Response, ResponseBuilder};
use utoipa::openapi::schema::{ObjectBuilder, Ref, Schema, Type};
use utoipa::{PartialSchema, ToResponse, ToSchema};

use crate::db::Outage;

pub use crate::error::Conflict;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// 400: the body is not JSON, or a path or query value is malformed.
    #[error("{0}")]
    BadRequest(String),
    /// 401: no token, or not a valid one.
    #[error("{0}")]
    Unauthenticated(String),
    /// 403: the token belongs to another biz type.
    #[error("{0}")]
    Forbidden(String),
    /// 404
    #[error("{0}")]
    NotFound(String),
    /// 405, with the Allow header.
    #[error("{message}")]
    MethodNotAllowed { message: String, allow: &'static str },
    /// 409: a key already used with another request, a running task met by a replace, or
    /// the wrong state; the kind is the answer's code.
    #[error("{1}")]
    Conflict(Conflict, String),
    /// 409: the receipt's reservation is over; the consumer must drop the task.
    #[error("{0}")]
    StaleReceipt(String),
    /// 408: the request's body did not arrive in time (CHIME_BODY_TIMEOUT_SECS).
    #[error("{0}")]
    TimedOut(String),
    /// 413
    #[error("{0}")]
    TooLarge(String),
    /// 422: a field is invalid; the message names it.
    #[error("{0}")]
    Invalid(String),
    /// 429, with Retry-After.
    #[error("create rate limit of this biz type exceeded; retry after {} ms", .0.as_millis())]
    RateLimited(Duration),
    /// 429, with Retry-After: the caller must wait for its own work under way (a biz type's
    /// bulk operation) to end.
    #[error("{0}")]
    Busy(String, Duration),
    /// 503: the database cannot be reached.
    #[error("{0}")]
    Unavailable(String),
    /// 500: logged with its cause; the client sees only that it happened.
    #[error("internal error")]
    Internal(#[source] anyhow::Error),
}

impl ApiError {
    pub fn code(&self) -> &'static str {
        match self {
            ApiError::BadRequest(_) => "bad_request",
            ApiError::Unauthenticated(_) => "unauthenticated",
            ApiError::Forbidden(_) => "permission_denied",
            ApiError::NotFound(_) => "not_found",
            ApiError::MethodNotAllowed { .. } => "method_not_allowed",
            ApiError::Conflict(kind, _) => kind.code(),
            ApiError::StaleReceipt(_) => "stale_receipt",
            ApiError::TimedOut(_) => "request_timeout",
            ApiError::TooLarge(_) => "payload_too_large",
            ApiError::Invalid(_) => "invalid_argument",
            ApiError::RateLimited(_) | ApiError::Busy(..) => "rate_limited",
            ApiError::Unavailable(_) => "unavailable",
            ApiError::Internal(_) => "internal",
        }
    }

    /// The `{"code", "message"}` object, also used for the items of a batch.
    pub fn body(&self) -> ErrorDetail {
        ErrorDetail { code: self.code(), message: self.to_string() }
    }
}

impl From<crate::error::Error> for ApiError {
    fn from(e: crate::error::Error) -> Self {
        use crate::error::Error;
        match e {
            Error::Invalid { .. } => ApiError::Invalid(e.to_string()),
            Error::NotFound(m) => ApiError::NotFound(m),
            Error::Forbidden(m) => ApiError::Forbidden(m),
            Error::Conflict(kind, m) => ApiError::Conflict(kind, m),
            Error::StaleReceipt(m) => ApiError::StaleReceipt(m),
            Error::TooLarge(m) => ApiError::TooLarge(m),
            Error::Secret(e) => ApiError::Internal(e.into()),
            Error::Db(e) => e.into(),
        }
    }
}

impl From<sqlx::Error> for ApiError {
    fn from(e: sqlx::Error) -> Self {
        // Said once by `db::Health`, which the API's middleware marks down.
        match crate::db::outage(&e) {
            Some(Outage::Unreachable | Outage::PoolClosed) => {
                tracing::debug!(error = %e, "database unavailable");
                ApiError::Unavailable("the database is unavailable; retry shortly".into())
            }
            // The pools move to the server that takes writes.
            Some(Outage::ReadOnly) => {
                tracing::debug!(error = %e, "database read-only");
                ApiError::Unavailable("the database accepts no writes at the moment (a failover?); retry shortly".into())
            }
            None => ApiError::Internal(e.into()),
        }
    }
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        match self {
            ApiError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ApiError::Unauthenticated(_) => StatusCode::UNAUTHORIZED,
            ApiError::Forbidden(_) => StatusCode::FORBIDDEN,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::Conflict(..) | ApiError::StaleReceipt(_) => StatusCode::CONFLICT,
            ApiError::TimedOut(_) => StatusCode::REQUEST_TIMEOUT,
            ApiError::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::Invalid(_) => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::RateLimited(_) | ApiError::Busy(..) => StatusCode::TOO_MANY_REQUESTS,
            ApiError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn error_response(&self) -> HttpResponse {
        if let ApiError::Internal(cause) = self {
            tracing::error!(error = format!("{cause:#}"), "request failed");
        }
        let mut response = HttpResponse::build(self.status_code());
        if let ApiError::RateLimited(wait) | ApiError::Busy(_, wait) = self {
            response.insert_header(("Retry-After", wait.as_secs_f64().ceil().max(1.0).to_string()));
        }
        if let ApiError::MethodNotAllowed { allow, .. } = self {
            response.insert_header(("Allow", *allow));
        }
        if let ApiError::Unauthenticated(_) = self {
            response.insert_header(("WWW-Authenticate", "Bearer"));
        }
        response.json(Error { error: self.body() })
    }
}

/// Every error answer has this shape, with an HTTP status to match `code`.
#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"error": {"code": "invalid_argument", "message": "run_at: is more than 24 hours in the past"}}))]
pub struct Error {
    pub error: ErrorDetail,
}

#[derive(Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ErrorDetail {
    #[schema(value_type = ErrorCode)]
    pub code: &'static str,
    /// Human-readable explanation; for invalid fields it starts with the field's name. Do not parse it.
    pub message: String,
}

/// The `code` of an error. Only the document uses this type: the answers take
/// `ApiError::code`, which a test holds to these names
/// (`openapi::tests::every_error_code_is_documented`).
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
#[schema(
    description = "Machine-readable reason, fixed per HTTP status: `bad_request` 400 (body not JSON, malformed id), `unauthenticated` 401, `permission_denied` 403 (another biz type's task or name, an archived biz type's token, or a token of the wrong kind: an admin token outside `/api/v1/admin/`, an API token inside), `not_found` 404, `method_not_allowed` 405, `request_timeout` 408 (the body arrived too slowly), `key_conflict` 409 (a key or name already held: a task key created with a different request, a timer key, a biz type or user name), `task_running` 409 (an `on_conflict: \"replace\"` create met the key's task while it runs), `invalid_state` 409 (the operation needs another state: cancelling or rescheduling a task that is not pending, replaying one that is not finished, changing an archived biz type, reserving from a callback biz type), `stale_receipt` 409 (a pull receipt whose reservation is over: drop the task), `payload_too_large` 413, `invalid_argument` 422 (a field is invalid; the message names it), `rate_limited` 429, `unavailable` 503 (database unreachable; retry), `internal` 500."
)]
#[allow(dead_code)]
pub enum ErrorCode {
    BadRequest,
    Unauthenticated,
    PermissionDenied,
    NotFound,
    MethodNotAllowed,
    RequestTimeout,
    KeyConflict,
    TaskRunning,
    InvalidState,
    StaleReceipt,
    PayloadTooLarge,
    InvalidArgument,
    RateLimited,
    Unavailable,
    Internal,
}

// The error answers many operations share, as the API description shows them: each
// handler's `#[utoipa::path]` names them, and `openapi` lists them once under components.

/// `Retry-After` of a 429: whole seconds, at least 1.
pub struct RetryAfter;

impl PartialSchema for RetryAfter {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new().schema_type(Type::Integer).minimum(Some(1)).into()
    }
}

impl ToSchema for RetryAfter {}

/// An error answer shared by many operations, with its example and any headers.
fn error_response(description: &str, example: Value, www_authenticate: bool) -> RefOr<Response> {
    let content = ContentBuilder::new().schema(Some(Ref::from_schema_name("Error"))).example(Some(example)).build();
    let mut response = ResponseBuilder::new().description(description).content("application/json", content);
    if www_authenticate {
        let always_bearer = ObjectBuilder::new().schema_type(Type::String).enum_values(Some(["Bearer"]));
        response = response.header("WWW-Authenticate", HeaderBuilder::new().schema(always_bearer).description(Some("Always `Bearer`.")).build());
    }
    RefOr::T(response.build())
}

fn error(code: &str, message: &str) -> Value {
    json!({"error": {"code": code, "message": message}})
}

macro_rules! shared_response {
    ($name:ident, $description:expr, $code:expr, $message:expr, $www_authenticate:expr) => {
        pub struct $name;

        impl<'r> ToResponse<'r> for $name {
            fn response() -> (&'r str, RefOr<Response>) {
                (stringify!($name), error_response($description, error($code, $message), $www_authenticate))
            }
        }
    };
}

shared_response!(
    Unauthenticated,
    "No `Authorization: Bearer <token>` header, or the token is not valid or has been revoked.",
    "unauthenticated",
    "missing token: send `Authorization: Bearer <token>`",
    true
);
shared_response!(
    Unavailable,
    "The database cannot be reached right now; retry shortly.",
    "unavailable",
    "the database is unavailable; retry shortly",
    false
);
shared_response!(
    Internal,
    "An unexpected server error; the cause is logged on the server, the answer only says it happened.",
    "internal",
    "internal error",
    false
);
shared_response!(
    RequestTimeout,
    "The request's body did not all arrive within CHIME_BODY_TIMEOUT_SECS of its headers; the connection is closed.",
    "request_timeout",
    "the request body did not arrive within 30 s",
    false
);
shared_response!(BadBody, "The request body is empty or is not valid JSON.", "bad_request", "request body is empty; send a JSON object", false);
shared_response!(BodyOver16KiB, "The request body is over 16 KiB.", "payload_too_large", "request body is larger than 16384 bytes", false);
shared_response!(
    AdminForbidden,
    "The token is a biz type's API token, not an admin token.",
    "permission_denied",
    "this is a biz type's API token: the admin API needs an admin token (`chime admin-token create`)",
    false
);
shared_response!(
    AdminUnauthenticated,
    "No `Authorization: Bearer <admin token>` header, or the admin token is not valid or has been revoked.",
    "unauthenticated",
    "the admin token is not valid or has been revoked",
    true
);
