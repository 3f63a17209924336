//! `/api/v1/openapi.json`, generated from the handlers' `#[utoipa::path]` attributes and the
//! `ToSchema` types they take and answer, so that the document follows the code. What utoipa
//! cannot say is added here, after generation, each with its reason (`document`).

use serde_json::{Value, json};
use utoipa::openapi::OpenApi as Document;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

use super::{admin, attempts, bulk, pull, stats, tasks, timers};

#[derive(OpenApi)]
#[openapi(
    info(
        title = "chime",
        description = r#"chime is a timer service: register a task ("call me back about order 123 in 30 minutes") and chime POSTs it to your biz type's callback URL when it is due, retrying until your receiver answers 2xx. Delivery is at least once: deduplicate on the `Chime-Task-Id` header.

**Auth.** Every `/api/v1` task operation needs `Authorization: Bearer <token>`. A token belongs to one biz type and acts only on its tasks: 401 without a valid token, 403 for another biz type's task or name. Tokens are created with `chime token create --biz-type NAME`. The admin API under `/api/v1/admin/` takes an admin token instead (`chime admin-token create`), and only it: an admin token is refused elsewhere (403), an API token there (403).

**Errors** are JSON, `{"error": {"code": "invalid_argument", "message": "…"}}`, with a status to match (see `ErrorDetail.code`). 503 means the database is briefly unreachable: retry. A method a path does not serve answers 405, an unknown path 404, both in the same shape.

**Times** are RFC 3339; chime answers in UTC with microseconds. The server's database clock is the clock of record.

**Limits.** Task payloads up to the server's payload limit (default 64 KiB, as PostgreSQL stores them: numbers written out in full; setting `CHIME_MAX_PAYLOAD_BYTES`) → 413; numbers in a payload with an exponent of at most ±308 (422 beyond); keys up to 256 bytes; `run_at` from 24 hours ago to 10 years ahead; batches up to 1000 tasks; per-biz-type create rate limit → 429 with `Retry-After`."#,
        license(name = "Apache-2.0", url = "https://www.apache.org/licenses/LICENSE-2.0"),
    ),
    servers((url = "/", description = "The chime node serving this document.")),
    tags(
        (name = "tasks", description = "Scheduled callbacks."),
        (name = "health", description = "Liveness and readiness probes."),
        (name = "meta", description = "About the API itself."),
        (name = "metrics", description = "Prometheus metrics of this node."),
        (name = "timers", description = "Periodic schedules whose occurrences become tasks."),
        (name = "pull", description = "Pull delivery: consumers reserve due tasks and ack or nack them with the receipt of their reservation."),
        // `.ci/schemathesis` runs the admin API apart, with an admin token, by this tag.
        (name = "admin", description = "Managing chime as code: biz types, their API tokens and signing secrets, console users. Admin tokens only (`chime admin-token create`); every change is in the audit log under the token's prefix and name."),
    ),
    paths(
        super::healthz,
        super::healthz_head,
        super::readyz,
        super::readyz_head,
        super::openapi,
        tasks::create,
        tasks::list,
        tasks::create_batch,
        tasks::get,
        attempts::list,
        tasks::reschedule,
        tasks::cancel,
        tasks::replay,
        tasks::get_by_key,
        tasks::reschedule_by_key,
        tasks::cancel_by_key,
        bulk::cancel,
        bulk::replay,
        stats::get,
        super::metrics,
        timers::create,
        timers::list,
        timers::get,
        timers::update,
        timers::delete,
        timers::activate,
        timers::deactivate,
        pull::reserve,
        pull::ack,
        pull::nack,
        pull::touch,
        admin::list_biz_types,
        admin::create_biz_type,
        admin::get_biz_type,
        admin::update_biz_type,
        admin::archive_biz_type,
        admin::rotate_secret,
        admin::list_tokens,
        admin::create_token,
        admin::revoke_token,
        admin::list_users,
        admin::create_user,
        admin::update_user,
        admin::delete_user,
    ),
    components(
        schemas(super::error::Error, super::error::ErrorDetail, super::pull::Receipt),
        responses(
            super::error::Unauthenticated,
            super::error::Unavailable,
            super::error::Internal,
            super::error::RequestTimeout,
            super::error::AdminForbidden,
            super::error::AdminUnauthenticated,
            super::error::BadBody,
            super::error::BodyOver16KiB
        ),
    ),
    modifiers(&SecuritySchemes),
)]
struct ApiDoc;

/// The document as served, built once.
pub fn document() -> Value {
    let mut doc = serde_json::to_value(ApiDoc::openapi()).expect("the OpenAPI document serialises");
    add_what_utoipa_cannot_say(&mut doc);
    doc
}

/// Constraints between fields, which JSON Schema can state but utoipa's derive cannot: they
/// keep schemathesis from sending requests chime refuses by design (both `run_at` and
/// `delay_ms`, or a PATCH that changes nothing), and tell clients the same. And the create
/// request of a biz type, which is its PATCH request with `name` required (one Rust type reads
/// both).
fn add_what_utoipa_cannot_say(doc: &mut Value) {
    name_link_fields_as_openapi_does(doc);
    let schemas = doc["components"]["schemas"].as_object_mut().expect("the document has schemas");
    let not_both_times = json!({"not": {
        "required": ["run_at", "delay_ms"],
        "properties": {"run_at": {"type": "string"}, "delay_ms": {"type": "integer"}},
    }});
    schemas["CreateTask"]["allOf"] = json!([not_both_times]);
    schemas["PatchTask"]["allOf"] = json!([not_both_times, {"anyOf": [
        {"required": ["run_at"], "properties": {"run_at": {"type": "string"}}},
        {"required": ["delay_ms"], "properties": {"delay_ms": {"type": "integer"}}},
        {"required": ["payload"]},
        {"required": ["priority"], "properties": {"priority": {"type": "integer"}}},
    ]}]);
    schemas["PatchTimer"]["anyOf"] = json!([
        {"required": ["cron"], "properties": {"cron": {"type": "string"}}},
        {"required": ["timezone"], "properties": {"timezone": {"type": "string"}}},
        {"required": ["payload"]},
        {"required": ["active"], "properties": {"active": {"type": "boolean"}}},
        {"required": ["catch_up"], "properties": {"catch_up": {"type": "boolean"}}},
    ]);
    let mut create = schemas["PatchBizType"].clone();
    create["required"] = json!(["name"]);
    create["description"] = json!("A new biz type: its name and any settings (absent or null ones take their defaults).");
    schemas.insert("CreateBizType".into(), create);
    // Answers write every field, null ones too; utoipa counts an `Option` field as one that
    // may be left out.
    for name in
        ["Task", "Attempt", "Timer", "BizTypeStats", "BizTypeStatsLateness", "BizType", "ApiToken", "User", "ReservedTask", "TaskList", "TimerList"]
    {
        require_every_property(&mut schemas[name]);
    }
    let operation = |doc: &mut Value, path: &str, method: &str| doc["paths"][path][method]["requestBody"].take();
    // utoipa writes an optional body as `null | ReserveRequest`, which invites a JSON `null`
    // that chime refuses; an absent body is what may be left out.
    let mut reserve = operation(doc, "/api/v1/biz-types/{name}/reserve", "post");
    reserve["content"]["application/json"]["schema"] = json!({"$ref": "#/components/schemas/ReserveRequest"});
    doc["paths"]["/api/v1/biz-types/{name}/reserve"]["post"]["requestBody"] = reserve;
    let rotate_path = "/api/v1/admin/biz-types/{name}/rotate-secret";
    let mut rotate = operation(doc, rotate_path, "post");
    rotate["content"]["application/json"]["schema"] = json!({"$ref": "#/components/schemas/RotateSecret"});
    doc["paths"][rotate_path]["post"]["requestBody"] = rotate;
    let tokens_path = "/api/v1/admin/biz-types/{name}/tokens";
    let mut create_token = operation(doc, tokens_path, "post");
    create_token["content"]["application/json"]["schema"] = json!({"$ref": "#/components/schemas/CreateApiToken"});
    doc["paths"][tokens_path]["post"]["requestBody"] = create_token;
    // A body given by reference is not known to be required.
    doc["paths"]["/api/v1/admin/biz-types"]["post"]["requestBody"]["required"] = json!(true);
}

/// Marks every property of an object schema required, in its inline `allOf` parts too.
fn require_every_property(schema: &mut Value) {
    if let Some(properties) = schema.get("properties").and_then(Value::as_object) {
        let names: Vec<Value> = properties.keys().map(|name| json!(name)).collect();
        schema["required"] = Value::Array(names);
    }
    for part in schema.get_mut("allOf").and_then(Value::as_array_mut).into_iter().flatten() {
        require_every_property(part);
    }
}

/// utoipa 5.5 writes a link's fields in snake case (`operation_id`); OpenAPI names them in
/// camel case, and schemathesis follows only links that say `operationId`.
fn name_link_fields_as_openapi_does(doc: &mut Value) {
    let operations = doc["paths"]
        .as_object_mut()
        .into_iter()
        .flat_map(|paths| paths.values_mut())
        .flat_map(|item| item.as_object_mut())
        .flat_map(|item| item.values_mut());
    for operation in operations {
        let Some(responses) = operation.get_mut("responses").and_then(Value::as_object_mut) else { continue };
        for link in responses.values_mut().filter_map(|r| r.get_mut("links")).filter_map(Value::as_object_mut).flat_map(|links| links.values_mut()) {
            let Some(link) = link.as_object_mut() else { continue };
            for (snake, camel) in [("operation_id", "operationId"), ("operation_ref", "operationRef"), ("request_body", "requestBody")] {
                if let Some(value) = link.remove(snake) {
                    link.insert(camel.into(), value);
                }
            }
        }
    }
}

/// The two kinds of bearer token.
struct SecuritySchemes;

impl Modify for SecuritySchemes {
    fn modify(&self, doc: &mut Document) {
        let components = doc.components.get_or_insert_with(Default::default);
        let bearer =
            |description: &str| SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).description(Some(description)).build());
        components.add_security_scheme("bearerAuth", bearer("An API token of one biz type (`chime token create --biz-type NAME`; shown once)."));
        components.add_security_scheme(
            "adminAuth",
            bearer(
                "An admin token (`chime admin-token create [--name NAME]`; shown once; it starts `chime_admin_`), for `/api/v1/admin/` only. A biz type's API token is refused there (403), and an admin token everywhere else (403).",
            ),
        );
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use actix_web::ResponseError;

    use super::*;
    use crate::api::ApiError;

    /// A PATCH that gives any one field is accepted, so each field is a branch of the "at
    /// least one" list; a field added to the body and not to the list makes schemathesis
    /// call chime wrong for accepting it.
    #[test]
    fn every_patch_field_can_be_the_one_given() {
        let doc = document();
        let schemas = &doc["components"]["schemas"];
        for (name, branches) in [("PatchTask", &schemas["PatchTask"]["allOf"][1]["anyOf"]), ("PatchTimer", &schemas["PatchTimer"]["anyOf"])] {
            let fields: BTreeSet<&str> = schemas[name]["properties"].as_object().unwrap().keys().map(String::as_str).collect();
            let alone: BTreeSet<&str> = branches.as_array().unwrap().iter().map(|b| b["required"][0].as_str().unwrap()).collect();
            assert_eq!(alone, fields, "{name}: each field may be the only one given");
        }
    }

    /// Every `code` an error answer can carry is in the document's enum, and no other.
    #[test]
    fn every_error_code_is_documented() {
        let errors = [
            ApiError::BadRequest(String::new()),
            ApiError::Unauthenticated(String::new()),
            ApiError::Forbidden(String::new()),
            ApiError::NotFound(String::new()),
            ApiError::MethodNotAllowed { message: String::new(), allow: "GET" },
            ApiError::Conflict(crate::error::Conflict::KeyConflict, String::new()),
            ApiError::Conflict(crate::error::Conflict::TaskRunning, String::new()),
            ApiError::Conflict(crate::error::Conflict::InvalidState, String::new()),
            ApiError::StaleReceipt(String::new()),
            ApiError::TimedOut(String::new()),
            ApiError::TooLarge(String::new()),
            ApiError::Invalid(String::new()),
            ApiError::RateLimited(std::time::Duration::from_secs(1)),
            ApiError::Unavailable(String::new()),
            ApiError::Internal(anyhow::anyhow!("test")),
        ];
        let answered: BTreeSet<String> = errors.iter().map(|e| e.code().to_string()).collect();
        let doc = document();
        let documented: BTreeSet<String> = doc["components"]["schemas"]["ErrorCode"]["enum"]
            .as_array()
            .expect("ErrorCode is an enum")
            .iter()
            .map(|v| v.as_str().expect("a code is a string").to_string())
            .collect();
        assert_eq!(answered, documented);
        // And each status has the code the document says it has.
        assert!(errors.iter().all(|e| e.status_code().as_u16() >= 400));
    }

    /// Links name operations by id: each must exist, or schemathesis' stateful phase finds
    /// nothing to follow.
    #[test]
    fn links_lead_to_operations_that_exist() {
        let doc = document();
        let mut ids = BTreeSet::new();
        for (path, methods) in doc["paths"].as_object().expect("paths") {
            for (method, operation) in methods.as_object().expect("methods") {
                let id = operation["operationId"].as_str().unwrap_or_else(|| panic!("{method} {path} has no operationId"));
                assert!(ids.insert(id.to_string()), "operationId {id} is used twice");
            }
        }
        let mut links = 0;
        for methods in doc["paths"].as_object().expect("paths").values() {
            for operation in methods.as_object().expect("methods").values() {
                for response in operation["responses"].as_object().expect("responses").values() {
                    for link in response["links"].as_object().into_iter().flat_map(|l| l.values()) {
                        let target = link["operationId"].as_str().expect("a link names an operationId");
                        assert!(ids.contains(target), "a link leads to {target}, which is not an operation");
                        links += 1;
                    }
                }
            }
        }
        assert!(links >= 16, "only {links} links");
    }
}
