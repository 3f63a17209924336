//! The REST API under `/api/v1` (docs/design/contract.md, API), plus `/healthz` and `/readyz`.
//! Handlers parse and authorise; the SQL lives in the domain modules.

mod admin;
mod attempts;
mod auth;
mod bulk;
mod error;
mod openapi;
mod pull;
mod stats;
mod tasks;
mod timers;

pub use error::ApiError;

use std::collections::BTreeMap;

use actix_web::body::MessageBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::error::PayloadError;
use actix_web::middleware::{Next, from_fn};
use actix_web::{HttpRequest, HttpResponse, web};
use serde::de::value::MapDeserializer;
use serde::de::{MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use utoipa::ToSchema;

use crate::lifecycle::Phase;
use crate::state::AppState;

/// `/api/v1/openapi.json`, generated on first request.
static OPENAPI: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| openapi::document().to_string());

pub use openapi::document as openapi_document;

pub fn routes(cfg: &mut web::ServiceConfig) {
    // Probes often use HEAD; it answers like GET without the body.
    cfg.service(resource("/healthz", "GET, HEAD").route(web::get().to(healthz)).route(web::head().to(healthz_head)))
        .service(resource("/readyz", "GET, HEAD").route(web::get().to(readyz)).route(web::head().to(readyz_head)))
        .service(resource("/api/v1/openapi.json", "GET").route(web::get().to(openapi)))
        .service(
            web::scope("/api/v1")
                .wrap(from_fn(require_database))
                .service(resource("/tasks", "GET, POST").route(web::post().to(tasks::create)).route(web::get().to(tasks::list)))
                .service(resource("/tasks/batch", "POST").route(web::post().to(tasks::create_batch)))
                .service(
                    resource("/tasks/{id}", "GET, PATCH, DELETE")
                        .route(web::get().to(tasks::get))
                        .route(web::patch().to(tasks::reschedule))
                        .route(web::delete().to(tasks::cancel)),
                )
                .service(resource("/tasks/{id}/replay", "POST").route(web::post().to(tasks::replay)))
                .service(resource("/tasks/{id}/attempts", "GET").route(web::get().to(attempts::list)))
                .service(resource("/biz-types/{name}/tasks/cancel", "POST").route(web::post().to(bulk::cancel)))
                .service(resource("/biz-types/{name}/tasks/replay", "POST").route(web::post().to(bulk::replay)))
                .service(
                    resource("/biz-types/{name}/tasks/by-key/{key:.*}", "GET, PATCH, DELETE")
                        .route(web::get().to(tasks::get_by_key))
                        .route(web::patch().to(tasks::reschedule_by_key))
                        .route(web::delete().to(tasks::cancel_by_key)),
                )
                .service(resource("/timers", "GET, POST").route(web::post().to(timers::create)).route(web::get().to(timers::list)))
                .service(
                    resource("/timers/{id}", "GET, PATCH, DELETE")
                        .route(web::get().to(timers::get))
                        .route(web::patch().to(timers::update))
                        .route(web::delete().to(timers::delete)),
                )
                .service(resource("/biz-types/{name}/stats", "GET").route(web::get().to(stats::get)))
                .service(resource("/biz-types/{name}/reserve", "POST").route(web::post().to(pull::reserve)))
                .service(resource("/tasks/{id}/ack", "POST").route(web::post().to(pull::ack)))
                .service(resource("/tasks/{id}/nack", "POST").route(web::post().to(pull::nack)))
                .service(resource("/tasks/{id}/touch", "POST").route(web::post().to(pull::touch)))
                .service(resource("/timers/{id}/activate", "POST").route(web::post().to(timers::activate)))
                .service(resource("/timers/{id}/deactivate", "POST").route(web::post().to(timers::deactivate)))
                .configure(admin::routes)
                .default_service(web::to(not_found)),
        );
}

/// `/metrics`, on the API's address unless CHIME_METRICS_LISTEN gives it one of its own.
pub fn metrics_route(cfg: &mut web::ServiceConfig) {
    cfg.service(resource("/metrics", "GET").route(web::get().to(metrics)));
}

/// A resource that answers a method it does not serve with a JSON 405 naming the `allow`ed ones.
fn resource(path: &str, allow: &'static str) -> actix_web::Resource {
    web::resource(path).default_service(web::to(move |req: HttpRequest| async move {
        Err::<HttpResponse, _>(ApiError::MethodNotAllowed {
            message: format!("{} is not allowed on {}; use {allow}", req.method(), req.path()),
            allow,
        })
    }))
}

pub async fn not_found(req: HttpRequest) -> Result<HttpResponse, ApiError> {
    Err(ApiError::NotFound(format!("no such endpoint: {} {}", req.method(), req.path())))
}

#[utoipa::path(
    get,
    path = "/api/v1/openapi.json",
    operation_id = "getOpenApiDocument",
    tag = "meta",
    summary = r#"This OpenAPI document"#,
    description = r#"The OpenAPI 3.0 description of this API. No token needed."#,
    responses(
        (status = 200, description = r#"The document."#, body = serde_json::Value)
    )
)]
async fn openapi() -> HttpResponse {
    HttpResponse::Ok().content_type("application/json").body(OPENAPI.as_str())
}

#[utoipa::path(
    get,
    path = "/metrics",
    operation_id = "metrics",
    tag = "metrics",
    summary = r#"Prometheus metrics of this node"#,
    description = r#"Counters of tasks claimed, delivered, retried and failed per biz type; callbacks in flight; histograms of callback duration, lateness (fire time minus run_at) and claim batch size; HTTP requests by route pattern and status; the node's database pool; and, on the leader only, pending, retrying and failed tasks and the age of the oldest due task per biz type (the README lists them). OpenMetrics text format when the Accept header asks for it (as Prometheus does), else Prometheus' classic text format (0.0.4). Asks for no credentials. When CHIME_METRICS_LISTEN is set, served on that address only, and this path answers 404 here."#,
    responses(
        (status = 200, description = r#"The metrics."#, content((String = "application/openmetrics-text"), (String = "text/plain")))
    )
)]
pub(super) async fn metrics(req: HttpRequest, node: web::Data<crate::metrics::Node>) -> HttpResponse {
    let accept = req.headers().get(actix_web::http::header::ACCEPT).and_then(|a| a.to_str().ok());
    let text = node.render().await;
    if crate::metrics::wants_openmetrics(accept) {
        HttpResponse::Ok().content_type(crate::metrics::CONTENT_TYPE).body(text)
    } else {
        HttpResponse::Ok().content_type(crate::metrics::CLASSIC_CONTENT_TYPE).body(crate::metrics::classic(&text))
    }
}

#[utoipa::path(
    get,
    path = "/healthz",
    operation_id = "getHealth",
    tag = "health",
    summary = r#"Liveness"#,
    description = r#"Answers 200 as long as the process serves HTTP. Does not touch the database. No token needed."#,
    responses(
        (status = 200, description = r#"The process is alive."#, body = inline(Alive), example = json!({"status": "ok"}))
    )
)]
async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(Alive { status: AliveStatus::Ok })
}

#[utoipa::path(
    head,
    path = "/healthz",
    operation_id = "getHealthHead",
    tag = "health",
    summary = r#"Liveness (HEAD: status only)"#,
    description = r#"Answers 200 as long as the process serves HTTP. Does not touch the database. No token needed."#,
    responses(
        (status = 200, description = r#"The process is alive."#)
    )
)]
async fn healthz_head() -> HttpResponse {
    healthz().await
}

/// `/healthz`'s answer.
#[derive(Serialize, ToSchema)]
struct Alive {
    status: AliveStatus,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
enum AliveStatus {
    Ok,
}

/// `/readyz`'s answer when ready.
#[derive(Serialize, ToSchema)]
struct Ready {
    status: ReadyStatus,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
enum ReadyStatus {
    Ready,
}

#[utoipa::path(
    head,
    path = "/readyz",
    operation_id = "getReadinessHead",
    tag = "health",
    summary = r#"Readiness (HEAD: status only)"#,
    description = r#"200 when the database answers and every schema migration this binary knows is applied; 503 otherwise. Use it for load-balancer and orchestrator readiness checks. No token needed."#,
    responses(
        (status = 200, description = r#"Ready to serve."#),
        (status = 503, description = r#"Not ready: the database is unreachable or migrations are pending; the message says which."#)
    )
)]
async fn readyz_head(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    readyz(state).await
}

/// Until the node is ready (starting, or migrating the database), every request but the
/// probes and `/metrics` answers 503: the tables its handler needs may not exist yet.
/// A node that is stopping still answers, for the requests a load balancer sends it
/// before it notices `/readyz`, but closes each connection after its answer, so that a
/// client with a kept-alive connection opens its next one to another node and the HTTP
/// server's own stop does not wait on it.
pub async fn by_phase(req: ServiceRequest, next: Next<impl MessageBody>) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    let lifecycle = req.app_data::<web::Data<AppState>>().expect("the API's state is registered").lifecycle.clone();
    let phase = lifecycle.phase();
    if phase < Phase::Ready && !matches!(req.path(), "/healthz" | "/readyz" | "/metrics") {
        return Err(ApiError::Unavailable(format!("chime is {phase}; retry shortly")).into());
    }
    let mut response = next.call(req).await?;
    if lifecycle.is_stopping() {
        response.response_mut().head_mut().set_connection_type(actix_web::http::ConnectionType::Close);
    }
    Ok(response)
}

/// While the database is known to be down, every API call answers 503 at once (not after
/// the pool's acquire timeout), and so does a call in flight when it is found down; a call
/// that finds it unreachable marks it down.
async fn require_database(req: ServiceRequest, next: Next<impl MessageBody>) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    let health = req.app_data::<web::Data<AppState>>().expect("the API's state is registered").health.clone();
    let unavailable = || ApiError::Unavailable("the database is unavailable; retry shortly".into());
    if health.is_down() {
        return Err(unavailable().into());
    }
    let response = tokio::select! {
        response = next.call(req) => response?,
        () = health.went_down() => return Err(unavailable().into()),
    };
    if response.response().error().and_then(|e| e.as_error::<ApiError>()).is_some_and(|e| matches!(e, ApiError::Unavailable(_))) {
        health.mark_down();
    }
    Ok(response)
}

/// Ready when the node has started and is not stopping, the database answers, and every
/// migration this binary knows is applied.
#[utoipa::path(
    get,
    path = "/readyz",
    operation_id = "getReadiness",
    tag = "health",
    summary = r#"Readiness"#,
    description = r#"200 when the database answers and every schema migration this binary knows is applied; 503 otherwise. Use it for load-balancer and orchestrator readiness checks. No token needed."#,
    responses(
        (status = 200, description = r#"Ready to serve."#, body = inline(Ready), example = json!({"status": "ready"})),
        (status = 503, description = r#"Not ready: the database is unreachable or migrations are pending; the message says which."#, body = error::Error, example = json!({"error": {"code": "unavailable", "message": "not ready: migrations pending (database at Some(1), binary at Some(2))"}}))
    )
)]
async fn readyz(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    let not_ready = |reason: String| ApiError::Unavailable(format!("not ready: {reason}"));
    let phase = state.lifecycle.phase();
    if phase != Phase::Ready {
        return Err(not_ready(phase.to_string()));
    }
    let down = || not_ready("database unreachable".into());
    if state.health.is_down() {
        return Err(down());
    }
    let pending = tokio::select! {
        pending = crate::db::unapplied(&state.pool) => pending.map_err(|e| {
            state.health.mark_down();
            not_ready(format!("database unreachable ({e})"))
        })?,
        () = state.health.went_down() => return Err(down()),
    };
    if !pending.is_empty() {
        return Err(not_ready(format!("migrations pending: {pending:?} (run `chime migrate`)")));
    }
    Ok(HttpResponse::Ok().json(Ready { status: ReadyStatus::Ready }))
}

/// The request body as JSON, or None when it is empty (every field optional).
async fn read_optional_json(payload: web::Payload, limit: usize) -> Result<Option<serde_json::Value>, ApiError> {
    let bytes = read_body(payload, limit).await?;
    if bytes.is_empty() {
        return Ok(None);
    }
    serde_json::from_slice(&bytes).map(Some).map_err(not_json)
}

/// Reads a non-empty body of at most `limit` bytes, to be parsed with `raw_json`: 413 beyond
/// the limit, 400 if empty.
async fn read_raw_body(payload: web::Payload, limit: usize) -> Result<web::Bytes, ApiError> {
    let bytes = read_body(payload, limit).await?;
    if bytes.is_empty() {
        return Err(ApiError::BadRequest("request body is empty; send a JSON object".into()));
    }
    Ok(bytes)
}

async fn read_body(payload: web::Payload, limit: usize) -> Result<web::Bytes, ApiError> {
    match payload.to_bytes_limited(limit).await {
        Ok(Ok(bytes)) => Ok(bytes),
        Err(_) => Err(ApiError::TooLarge(format!("request body is larger than {limit} bytes"))),
        Ok(Err(e))
            if e.as_error::<PayloadError>().is_some_and(|e| matches!(e, PayloadError::Io(io) if io.kind() == std::io::ErrorKind::TimedOut)) =>
        {
            Err(ApiError::TimedOut(e.to_string()))
        }
        Ok(Err(e)) => Err(ApiError::BadRequest(format!("could not read the request body: {e}"))),
    }
}

fn not_json(e: serde_json::Error) -> ApiError {
    ApiError::BadRequest(format!("request body is not valid JSON: {e}"))
}

/// A body checked to be JSON, as its raw text: 400 where parsing it into a `Value` would
/// fail (the same checks, nesting and lone surrogates among them), but without building one.
/// Requests that carry payloads are read this way, so that they cost about their size.
fn raw_json(body: &[u8]) -> Result<&RawValue, ApiError> {
    serde_json::from_slice::<Checked>(body).map_err(not_json)?;
    serde_json::from_slice(body).map_err(not_json)
}

/// Any JSON, parsed as a `Value` would be (strings decoded, so bad escapes are refused) and
/// dropped as it goes.
struct Checked;

impl<'de> Deserialize<'de> for Checked {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Checked, D::Error> {
        d.deserialize_any(Checked)
    }
}

impl<'de> Visitor<'de> for Checked {
    type Value = Checked;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("any JSON")
    }
    fn visit_bool<E>(self, _: bool) -> Result<Checked, E> {
        Ok(Checked)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Checked, E> {
        Ok(Checked)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Checked, E> {
        Ok(Checked)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Checked, E> {
        Ok(Checked)
    }
    fn visit_str<E>(self, _: &str) -> Result<Checked, E> {
        Ok(Checked)
    }
    fn visit_unit<E>(self) -> Result<Checked, E> {
        Ok(Checked)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Checked, A::Error> {
        while seq.next_element::<Checked>()?.is_some() {}
        Ok(Checked)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Checked, A::Error> {
        while map.next_entry::<Checked, Checked>()?.is_some() {}
        Ok(Checked)
    }
}

/// Deserialises a request object from its raw text (checked by `raw_json`), naming the
/// offending field in the 422. Fields may borrow from the text (a payload as `&RawValue`). A
/// field given twice keeps its last value, as when parsed into a `Value`.
fn from_raw<'a, T: Deserialize<'a>>(raw: &'a RawValue) -> Result<T, ApiError> {
    if !raw.get().starts_with('{') {
        return Err(ApiError::Invalid("the request must be a JSON object".into()));
    }
    let fields: BTreeMap<String, &RawValue> = serde_json::from_str(raw.get()).map_err(not_json)?;
    serde_path_to_error::deserialize(MapDeserializer::new(fields.into_iter())).map_err(|e| {
        // A field's own parser reports its place in the field's text: no use to the client.
        let inner = e.inner();
        let message = inner.to_string();
        let message = message.strip_suffix(&format!(" at line {} column {}", inner.line(), inner.column())).unwrap_or(&message);
        field_error(&e.path().to_string(), message)
    })
}

/// A query string parsed into `T`; a bad one is a 422 naming what is wrong.
fn parse_query<T: serde::de::DeserializeOwned>(req: &HttpRequest) -> Result<T, ApiError> {
    web::Query::<T>::from_query(req.query_string()).map(web::Query::into_inner).map_err(|e| ApiError::Invalid(format!("query: {e}")))
}

/// A task id in a path: 400 when it is not a UUID.
fn parse_id(raw: &str) -> Result<uuid::Uuid, ApiError> {
    raw.parse().map_err(|_| ApiError::BadRequest(format!("`{raw}` is not a task id (a UUID)")))
}

/// A time in a query parameter (`field` names it in the 422), RFC 3339.
fn parse_time(field: &str, raw: Option<&str>) -> Result<Option<chrono::DateTime<chrono::Utc>>, ApiError> {
    raw.map(|s| {
        chrono::DateTime::parse_from_rfc3339(s)
            .map(|t| t.with_timezone(&chrono::Utc))
            .map_err(|_| ApiError::Invalid(format!("{field}: must be an RFC 3339 time such as 2026-11-21T09:30:00Z")))
    })
    .transpose()
}

/// A list's `limit` query parameter: 1 to 1000, 100 when absent.
fn parse_limit(raw: Option<&str>) -> Result<i64, ApiError> {
    match raw {
        None => Ok(100),
        Some(raw) => match raw.parse::<i64>() {
            Ok(n) if (1..=1000).contains(&n) => Ok(n),
            _ => Err(ApiError::Invalid("limit: must be a whole number from 1 to 1000".into())),
        },
    }
}

/// Deserialises a request object, naming the offending field in the 422.
fn from_json<T: serde::de::DeserializeOwned>(value: serde_json::Value) -> Result<T, ApiError> {
    if !value.is_object() {
        return Err(ApiError::Invalid("the request must be a JSON object".into()));
    }
    serde_path_to_error::deserialize(value).map_err(|e| field_error(&e.path().to_string(), &e.inner().to_string()))
}

fn field_error(path: &str, message: &str) -> ApiError {
    if path == "." { ApiError::Invalid(message.to_string()) } else { ApiError::Invalid(format!("{path}: {message}")) }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        #![proptest_config(crate::proptest_config(512))]

        /// `limit` is accepted exactly when it is a whole number from 1 to 1000.
        #[test]
        fn limit_is_a_whole_number_from_1_to_1000(
            raw in prop_oneof![any::<String>(), "[+-]?[0-9]{1,25}", any::<i64>().prop_map(|n| n.to_string())],
        ) {
            let expected = raw.parse::<i64>().ok().filter(|n| (1..=1000).contains(n));
            prop_assert_eq!(parse_limit(Some(&raw)).ok(), expected, "{:?}", raw);
        }
    }
}
