//! The authorization matrix: every API endpoint against every kind of credential, every
//! console route against every role, and that refused requests change nothing. Also: tokens
//! and passwords are stored hashed and never logged, and signing secrets are shown only
//! when made.

use std::collections::{BTreeSet, HashMap};

use chime::biz_types::{self, Settings};
use chime::callback_hosts::CallbackHosts;
use chime::db::Pool;
use reqwest::header::{COOKIE, LOCATION};
use serde_json::{Value, json};

use crate::console::{ADMIN_PASSWORD, Console, no_redirects, revealed, sign_in, sign_in_attempt, support_user};
use crate::helpers::{Reply, TestApp, chime_process_logging, fresh_database, spawn_app};

/// Every API call that needs a token: (method, path, body, status with the owner's token,
/// status with another biz type's token). Placeholders in braces are filled from the
/// fixtures. Rows run in order, each with the owner's token last, so a row may rely on an
/// earlier one (the task is rescheduled before it is cancelled).
///
/// Must list every route of `src/api/mod.rs` that takes a token; the test compares it with
/// the OpenAPI document, which lists them all (see `health::openapi_document_covers_the_api`).
const API: &[(&str, &str, &str, u16, u16)] = &[
    ("POST", "/api/v1/tasks", r#"{"biz_type": "jobs"}"#, 201, 403),
    // Another biz type's batch answers 200 with a 403 per item.
    ("POST", "/api/v1/tasks/batch", r#"{"tasks": [{"biz_type": "jobs"}]}"#, 200, 200),
    // Without `biz_type` a list is of the caller's own tasks: none for the other biz type.
    ("GET", "/api/v1/tasks", "", 200, 200),
    ("GET", "/api/v1/tasks?biz_type={biz}", "", 200, 403),
    ("GET", "/api/v1/tasks/{task}", "", 200, 403),
    ("GET", "/api/v1/tasks/{task}/attempts", "", 200, 403),
    ("GET", "/api/v1/biz-types/{biz}/tasks/by-key/{key}", "", 200, 403),
    ("GET", "/api/v1/biz-types/{biz}/stats", "", 200, 403),
    ("PATCH", "/api/v1/tasks/{task}", r#"{"delay_ms": 7200000}"#, 200, 403),
    ("PATCH", "/api/v1/biz-types/{biz}/tasks/by-key/{key}", r#"{"delay_ms": 7200000}"#, 200, 403),
    ("DELETE", "/api/v1/tasks/{task}", "", 200, 403),
    ("DELETE", "/api/v1/biz-types/{biz}/tasks/by-key/{key2}", "", 200, 403),
    // Filters that match nothing: later rows still find their tasks.
    ("POST", "/api/v1/biz-types/{biz}/tasks/cancel", r#"{"key_prefix": "nothing-"}"#, 200, 403),
    ("POST", "/api/v1/biz-types/{biz}/tasks/replay", r#"{"status": "failed", "key_prefix": "nothing-"}"#, 200, 403),
    ("POST", "/api/v1/tasks/{failed}/replay", "", 200, 403),
    ("POST", "/api/v1/timers", r#"{"biz_type": "jobs", "key": "t2", "cron": "0 0 0 1 1 * 2099"}"#, 201, 403),
    ("GET", "/api/v1/timers", "", 200, 200),
    ("GET", "/api/v1/timers?biz_type={biz}", "", 200, 403),
    ("GET", "/api/v1/timers/{timer}", "", 200, 403),
    ("PATCH", "/api/v1/timers/{timer}", r#"{"cron": "0 0 0 2 1 * 2099"}"#, 200, 403),
    ("POST", "/api/v1/timers/{timer}/deactivate", "", 200, 403),
    ("POST", "/api/v1/timers/{timer}/activate", "", 200, 403),
    ("DELETE", "/api/v1/timers/{timer}", "", 204, 403),
    ("POST", "/api/v1/biz-types/{biz}/reserve", r#"{"max": 1, "wait_ms": 0}"#, 200, 403),
    ("POST", "/api/v1/tasks/{ack}/ack", r#"{"receipt": "{ack_receipt}"}"#, 200, 403),
    ("POST", "/api/v1/tasks/{nack}/nack", r#"{"receipt": "{nack_receipt}", "delay_ms": 60000}"#, 200, 403),
    ("POST", "/api/v1/tasks/{touch}/touch", r#"{"receipt": "{touch_receipt}", "ttr_ms": 60000}"#, 200, 403),
];

/// Every admin API call: (method, path, body, status with an admin token). Rows run in
/// order: the biz type `{biz}` is archived last. Must list every route of `src/api/admin.rs`
/// (compared with the OpenAPI document, as `API` is).
const ADMIN: &[(&str, &str, &str, u16)] = &[
    ("GET", "/api/v1/admin/biz-types", "", 200),
    ("POST", "/api/v1/admin/biz-types", r#"{"name": "made", "mode": "pull"}"#, 201),
    ("GET", "/api/v1/admin/biz-types/{biz}", "", 200),
    ("PATCH", "/api/v1/admin/biz-types/{biz}", r#"{"description": "changed"}"#, 200),
    ("POST", "/api/v1/admin/biz-types/{biz}/rotate-secret", "", 200),
    ("GET", "/api/v1/admin/biz-types/{biz}/tokens", "", 200),
    ("POST", "/api/v1/admin/biz-types/{biz}/tokens", "", 201),
    ("DELETE", "/api/v1/admin/biz-types/{biz}/tokens/{token_id}", "", 204),
    ("GET", "/api/v1/admin/users", "", 200),
    ("POST", "/api/v1/admin/users", r#"{"name": "helen", "role": "support", "password": "support-password"}"#, 201),
    ("PATCH", "/api/v1/admin/users/{user}", r#"{"role": "admin"}"#, 200),
    ("DELETE", "/api/v1/admin/users/{user}", "", 204),
    ("DELETE", "/api/v1/admin/biz-types/{biz}", "", 200),
];

/// A cron that never fires while the tests run, so the leader writes no occurrences.
const NEVER: &str = "0 0 0 1 1 * 2099";

/// Replaces each `{name}` in `text` by its value.
fn fill(text: &str, values: &HashMap<&str, String>) -> String {
    values.iter().fold(text.to_string(), |text, (name, value)| text.replace(&format!("{{{name}}}"), value))
}

/// Everything a request could change, as text: compared before and after refused requests.
async fn snapshot(pool: &Pool) -> Vec<String> {
    let mut rows = Vec::new();
    for query in [
        "SELECT t::text FROM all_tasks t ORDER BY id",
        "SELECT a::text FROM attempts a ORDER BY task_id, number",
        "SELECT k::text FROM task_keys k ORDER BY task_id",
        // Not `materialized_until`: the leader moves it on by itself.
        "SELECT (id, biz_type_id, key, cron, timezone, payload, active, catch_up, updated_at)::text FROM timers ORDER BY id",
        "SELECT b::text FROM biz_types b ORDER BY id",
        // Not `last_used_at`: a request its token lets in records it (a refused one too,
        // at most once a minute, off the request's path).
        "SELECT (x.id, x.biz_type_id, x.token_hash, x.prefix, x.name, x.created_at, x.revoked_at)::text FROM api_tokens x ORDER BY id",
        "SELECT u::text FROM users u ORDER BY id",
        "SELECT s::text FROM sessions s ORDER BY token_hash",
        "SELECT l::text FROM audit_log l ORDER BY id",
        "SELECT a::text FROM admin_tokens a ORDER BY id",
    ] {
        rows.extend(sqlx::query_scalar::<_, String>(query).fetch_all(pool).await.unwrap());
    }
    rows
}

/// `{path}` with every `{…}` segment written `{}` and no query: a route as OpenAPI names it.
fn route(method: &str, path: &str) -> String {
    let path = path.split('?').next().unwrap();
    let segments: Vec<&str> = path.split('/').map(|s| if s.starts_with('{') { "{}" } else { s }).collect();
    format!("{} {}", method.to_uppercase(), segments.join("/"))
}

/// The table lists every API route the OpenAPI document names, except the public document itself.
#[tokio::test]
async fn the_api_matrix_lists_every_route() {
    let doc: Value = chime::api::openapi_document();
    let documented: BTreeSet<String> = doc["paths"]
        .as_object()
        .unwrap()
        .iter()
        .filter(|(path, _)| path.starts_with("/api/v1/") && path.as_str() != "/api/v1/openapi.json")
        .flat_map(|(path, methods)| methods.as_object().unwrap().keys().map(move |key| (key, path)))
        .filter(|(key, _)| ["get", "post", "put", "patch", "delete"].contains(&key.as_str()))
        .map(|(method, path)| route(method, path))
        .collect();
    let tested: BTreeSet<String> =
        API.iter().map(|(method, path, ..)| route(method, path)).chain(ADMIN.iter().map(|(method, path, ..)| route(method, path))).collect();
    assert_eq!(documented.difference(&tested).collect::<Vec<_>>(), Vec::<&String>::new(), "routes missing from authz::API or authz::ADMIN");
    assert_eq!(tested.difference(&documented).collect::<Vec<_>>(), Vec::<&String>::new(), "routes in authz::API but not documented");
}

struct ApiFixtures {
    /// Values of the placeholders in `API`.
    ids: HashMap<&'static str, String>,
    /// A token of `jobs`, a revoked one, and one of `other`.
    token: String,
    revoked: String,
    foreign: String,
}

/// Owner `jobs` (pull mode, so the pull endpoints apply) with a token and a revoked token;
/// `other` (pull mode too) with its own token; two pending tasks (keys `k`, `k2`), a failed one, three reserved
/// ones (with their receipts) and a timer of `jobs`.
async fn api_fixtures(app: &TestApp) -> ApiFixtures {
    let pull = Settings { mode: Some("pull".into()), ..Default::default() };
    for name in ["jobs", "other"] {
        biz_types::create(&app.pool, name, &pull, CallbackHosts::Any).await.unwrap();
    }
    let token = biz_types::create_token(&app.pool, "jobs").await.unwrap();
    let foreign = biz_types::create_token(&app.pool, "other").await.unwrap();
    let revoked = biz_types::create_token(&app.pool, "jobs").await.unwrap();
    sqlx::query("UPDATE api_tokens SET revoked_at = now() WHERE prefix = $1").bind(&revoked[..12]).execute(&app.pool).await.unwrap();

    let mut ids = HashMap::from([("biz", "jobs".to_string()), ("key", "k".to_string())]);
    for key in ["ack", "nack", "touch"] {
        let task = app.create_task(&token, json!({"biz_type": "jobs", "key": key})).await;
        ids.insert(key, task["id"].as_str().unwrap().to_string());
    }
    let reserved = app.post("/api/v1/biz-types/jobs/reserve", &token, json!({"max": 3, "wait_ms": 0, "ttr_ms": 600000})).await;
    assert_eq!(reserved.body["tasks"].as_array().map(Vec::len), Some(3), "{}", reserved.body);
    for (key, receipt) in [("ack", "ack_receipt"), ("nack", "nack_receipt"), ("touch", "touch_receipt")] {
        let task = reserved.body["tasks"].as_array().unwrap().iter().find(|t| t["id"] == ids[key].as_str()).unwrap();
        ids.insert(receipt, task["receipt"].as_str().unwrap().to_string());
    }
    let failed = app.create_task(&token, json!({"biz_type": "jobs"})).await;
    app.force_status(failed["id"].as_str().unwrap(), "failed").await;
    ids.insert("failed", failed["id"].as_str().unwrap().to_string());
    let pending = app.create_task(&token, json!({"biz_type": "jobs", "key": "k", "delay_ms": 3600000})).await;
    ids.insert("task", pending["id"].as_str().unwrap().to_string());
    app.create_task(&token, json!({"biz_type": "jobs", "key": "k2", "delay_ms": 3600000})).await;
    ids.insert("key2", "k2".to_string());
    let timer = app.post("/api/v1/timers", &token, json!({"biz_type": "jobs", "key": "t1", "cron": NEVER})).await;
    assert_eq!(timer.status, 201, "{}", timer.body);
    ids.insert("timer", timer.body["id"].as_str().unwrap().to_string());
    ApiFixtures { ids, token, revoked, foreign }
}

/// A reply to another biz type's token that is not an error shows nothing of `jobs`: lists
/// are empty, batch items refused.
fn shows_nothing_of_jobs(reply: &Reply) -> bool {
    let items_empty = reply.body.get("items").is_none_or(|items| items == &json!([]));
    let items_refused = reply.body.get("results").is_none_or(|r| r.as_array().unwrap().iter().all(|item| item["status"] == 403));
    items_empty && items_refused
}

/// No token, a malformed header, an unknown token and a revoked token get 401 everywhere;
/// another biz type's token gets 403 (or an empty list), and so do an admin token and the
/// token of an archived biz type; none of them changes anything; the owner's token is let
/// through.
#[tokio::test]
async fn every_api_endpoint_admits_only_its_own_biz_types_token() {
    let app = spawn_app().await;
    let ApiFixtures { ids, token, revoked, foreign } = api_fixtures(&app).await;
    let admin = chime::admin_tokens::create(&app.pool, "ci", "test").await.unwrap().1;
    let archived = app.biz_type("gone").await;
    biz_types::archive(&app.pool, "gone", "test").await.unwrap();
    let refused_credentials = [
        ("no token", None),
        ("a Basic header", Some(format!("Basic {token}"))),
        ("an empty bearer token", Some("Bearer ".to_string())),
        ("an unknown token", Some("Bearer chime_not-a-real-token".to_string())),
        ("a revoked token", Some(format!("Bearer {revoked}"))),
    ];

    for &(method, path, body, owner_status, foreign_status) in API {
        let path = fill(path, &ids);
        let body = (!body.is_empty()).then(|| fill(body, &ids).into_bytes());
        let before = snapshot(&app.pool).await;
        for (what, authorization) in &refused_credentials {
            let reply = app.request_with_authorization(method, &path, authorization.as_deref(), body.clone()).await;
            assert_eq!((reply.status, reply.code()), (401, "unauthenticated"), "{method} {path} with {what}: {}", reply.body);
            assert_eq!(reply.headers["www-authenticate"], "Bearer");
        }
        let reply = app.request(method, &path, Some(&foreign), body.clone()).await;
        assert_eq!(reply.status, foreign_status, "{method} {path} with another biz type's token: {}", reply.body);
        if foreign_status == 403 {
            assert_eq!(reply.code(), "permission_denied");
        } else {
            assert!(shows_nothing_of_jobs(&reply), "{method} {path} with another biz type's token: {}", reply.body);
        }
        for (what, credential, says) in [("an admin token", &admin, "admin token"), ("an archived biz type's token", &archived, "archived")] {
            let reply = app.request(method, &path, Some(credential), body.clone()).await;
            assert_eq!((reply.status, reply.code()), (403, "permission_denied"), "{method} {path} with {what}: {}", reply.body);
            assert!(reply.message().contains(says), "{method} {path} with {what}: {}", reply.message());
        }
        assert_eq!(snapshot(&app.pool).await, before, "{method} {path}: a refused request changed the database");

        let reply = app.request(method, &path, Some(&token), body).await;
        assert_eq!(reply.status, owner_status, "{method} {path} with its own token: {}", reply.body);
    }
}

/// On every admin route: no token, a malformed header, an unknown or revoked admin token
/// get 401; a biz type's API token (even of the biz type named) gets 403; none of them
/// changes anything; an admin token is let through.
#[tokio::test]
async fn every_admin_endpoint_admits_only_admin_tokens() {
    let app = spawn_app().await;
    let api_token = app.biz_type("managed").await;
    let admin = chime::admin_tokens::create(&app.pool, "ci", "test").await.unwrap().1;
    let (revoked_info, revoked) = chime::admin_tokens::create(&app.pool, "old", "test").await.unwrap();
    chime::admin_tokens::revoke(&app.pool, &revoked_info.id.to_string(), "test").await.unwrap();
    let victim = biz_types::create_token(&app.pool, "managed").await.unwrap();
    let token_id: uuid::Uuid =
        sqlx::query_scalar("SELECT id FROM api_tokens WHERE prefix = $1").bind(&victim[..12]).fetch_one(&app.pool).await.unwrap();
    let ids = HashMap::from([("biz", "managed".to_string()), ("token_id", token_id.to_string()), ("user", "helen".to_string())]);
    let refused_credentials = [
        ("no token", None),
        ("a Basic header", Some(format!("Basic {admin}"))),
        ("an empty bearer token", Some("Bearer ".to_string())),
        ("an unknown admin token", Some("Bearer chime_admin_not-a-real-token".to_string())),
        ("a revoked admin token", Some(format!("Bearer {revoked}"))),
    ];

    for &(method, path, body, admin_status) in ADMIN {
        let path = fill(path, &ids);
        let body = (!body.is_empty()).then(|| fill(body, &ids).into_bytes());
        let before = snapshot(&app.pool).await;
        for (what, authorization) in &refused_credentials {
            let reply = app.request_with_authorization(method, &path, authorization.as_deref(), body.clone()).await;
            assert_eq!((reply.status, reply.code()), (401, "unauthenticated"), "{method} {path} with {what}: {}", reply.body);
            assert_eq!(reply.headers["www-authenticate"], "Bearer");
        }
        let reply = app.request(method, &path, Some(&api_token), body.clone()).await;
        assert_eq!((reply.status, reply.code()), (403, "permission_denied"), "{method} {path} with an API token: {}", reply.body);
        assert_eq!(snapshot(&app.pool).await, before, "{method} {path}: a refused request changed the database");

        let reply = app.request(method, &path, Some(&admin), body).await;
        assert_eq!(reply.status, admin_status, "{method} {path} with an admin token: {}", reply.body);
    }
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum Who {
    /// Any signed-in user, support staff included.
    Staff,
    Admin,
}
use Who::{Admin, Staff};

/// Every console route but the public sign-in pages (the password form, and the OpenID
/// Provider's start and callback, tests/api/oidc.rs) and assets: (method, path, form, who
/// may, status when allowed). Placeholders are filled per user, so that support staff and
/// admins each act on objects of their own. Keep in sync with `src/console/mod.rs`; logout
/// stays last.
type Route = (&'static str, &'static str, &'static [(&'static str, &'static str)], Who, u16);
const CONSOLE: &[Route] = &[
    ("GET", "/console", &[], Staff, 200),
    ("GET", "/console/biz-types", &[], Staff, 200),
    ("GET", "/console/biz-types/new", &[], Admin, 200),
    ("GET", "/console/biz-types/{biz}", &[], Staff, 200),
    ("GET", "/console/tasks", &[], Staff, 200),
    ("GET", "/console/tasks/{task}", &[], Staff, 200),
    ("GET", "/console/timers", &[], Staff, 200),
    ("GET", "/console/timers/new", &[], Admin, 200),
    ("GET", "/console/timers/{timer}", &[], Staff, 200),
    ("GET", "/console/cluster", &[], Staff, 200),
    ("GET", "/console/audit", &[], Staff, 200),
    ("GET", "/console/audit/{entry}", &[], Staff, 200),
    ("GET", "/console/tasks/replay-failed?biz_type={biz}", &[], Staff, 200),
    ("GET", "/console/tasks/replay-failed?biz_type={biz}&status=expired", &[], Staff, 200),
    ("GET", "/console/tasks/cancel-pending?biz_type={biz}", &[], Staff, 200),
    // Every action answers with a redirect (post/redirect/get); one that makes a secret
    // leaves it for the page it leads to, which shows it once.
    ("POST", "/console/biz-types", &[("name", "{new}"), ("mode", "pull")], Admin, 303),
    ("POST", "/console/biz-types/{biz}", &[("description", "changed"), ("mode", "callback"), ("callback_url", "http://127.0.0.1:9/x")], Admin, 303),
    ("POST", "/console/biz-types/{biz}/test-callback", &[], Admin, 303),
    ("POST", "/console/biz-types/{biz}/pause", &[], Admin, 303),
    ("POST", "/console/biz-types/{biz}/resume", &[], Admin, 303),
    ("POST", "/console/biz-types/{biz}/rotate-secret", &[], Admin, 303),
    ("POST", "/console/biz-types/{biz}/tokens", &[], Admin, 303),
    ("POST", "/console/biz-types/{biz}/tokens/{token_id}/revoke", &[], Admin, 303),
    ("POST", "/console/tasks/{task}/reschedule", &[("run_at", "2030-01-01 09:00")], Admin, 303),
    ("POST", "/console/tasks/{task}/cancel", &[], Staff, 303),
    ("POST", "/console/tasks/{failed}/replay", &[], Staff, 303),
    ("POST", "/console/tasks/replay-failed", &[("biz_type", "{biz}"), ("confirm", "yes")], Staff, 303),
    ("POST", "/console/tasks/cancel-pending", &[("biz_type", "{biz}"), ("key_prefix", "nothing-"), ("confirm", "yes")], Staff, 303),
    ("POST", "/console/timers", &[("biz_type", "{biz}"), ("key", "{new}"), ("cron", NEVER), ("timezone", "UTC"), ("active", "on")], Admin, 303),
    ("POST", "/console/timers/{timer}", &[("cron", "0 0 0 2 1 * 2099"), ("timezone", "UTC"), ("active", "on")], Admin, 303),
    ("POST", "/console/timers/{timer}/deactivate", &[], Admin, 303),
    ("POST", "/console/timers/{timer}/activate", &[], Admin, 303),
    ("POST", "/console/timers/{timer}/delete", &[], Admin, 303),
    ("POST", "/console/biz-types/{gone}/archive", &[], Admin, 303),
    ("GET", "/console/users", &[], Admin, 200),
    ("POST", "/console/users", &[("name", "{new}"), ("role", "support"), ("password", "")], Admin, 303),
    ("POST", "/console/users/{user}/role", &[("role", "admin")], Admin, 303),
    ("POST", "/console/users/{user}/disable", &[], Admin, 303),
    ("POST", "/console/users/{user}/enable", &[], Admin, 303),
    ("POST", "/console/users/{user}/reset-password", &[], Admin, 303),
    // Every user's own password, support staff's too.
    ("GET", "/console/account", &[], Staff, 200),
    (
        "POST",
        "/console/account/password",
        &[("current_password", "{password}"), ("new_password", "changed-password"), ("confirm_password", "changed-password")],
        Staff,
        303,
    ),
    ("POST", "/console/logout", &[], Staff, 303),
];

/// A pending task, a failed task, a timer, a token of `orders`, a user and an audit entry
/// for one user to act on, and that user's own password.
async fn console_fixtures(app: &TestApp, token: &str, user: &str) -> HashMap<&'static str, String> {
    chime::users::create(&app.pool, &format!("u-{user}"), "support", "fixture-password").await.unwrap();
    let password = if user == "admin" { ADMIN_PASSWORD } else { "support-password" };
    let pending = app.create_task(token, json!({"biz_type": "orders", "delay_ms": 3600000})).await;
    let failed = app.create_task(token, json!({"biz_type": "orders"})).await;
    app.force_status(failed["id"].as_str().unwrap(), "failed").await;
    let timer = app.post("/api/v1/timers", token, json!({"biz_type": "orders", "key": format!("t-{user}"), "cron": NEVER})).await;
    let api_token = biz_types::create_token(&app.pool, "orders").await.unwrap();
    app.biz_type(&format!("gone-{user}")).await;
    let token_id: uuid::Uuid =
        sqlx::query_scalar("SELECT id FROM api_tokens WHERE prefix = $1").bind(&api_token[..12]).fetch_one(&app.pool).await.unwrap();
    let entry: i64 = sqlx::query_scalar("SELECT max(id) FROM audit_log").fetch_one(&app.pool).await.unwrap();
    HashMap::from([
        ("biz", "orders".to_string()),
        ("new", format!("new-{user}")),
        ("gone", format!("gone-{user}")),
        ("task", pending["id"].as_str().unwrap().to_string()),
        ("failed", failed["id"].as_str().unwrap().to_string()),
        ("timer", timer.body["id"].as_str().unwrap().to_string()),
        ("token_id", token_id.to_string()),
        ("entry", entry.to_string()),
        ("user", format!("u-{user}")),
        ("password", password.to_string()),
    ])
}

async fn console_call(console: &Console, method: &str, path: &str, form: &[(&str, &str)]) -> crate::console::Page {
    if method == "GET" { console.get(path).await } else { console.post(path, form).await }
}

/// Signed out, every route redirects to the sign-in page and changes nothing; support staff
/// may browse, replay and cancel, and get 403 (changing nothing) for the rest; admins may
/// do everything.
#[tokio::test]
async fn every_console_route_checks_the_signed_in_role() {
    let app = spawn_app().await;
    let token = app.biz_type("orders").await;
    let support = support_user(&app).await;
    let admin = sign_in(&app, "admin", ADMIN_PASSWORD).await;
    let for_support = console_fixtures(&app, &token, "support").await;
    let for_admin = console_fixtures(&app, &token, "admin").await;
    let anonymous = no_redirects();

    for &(method, path, form, who, allowed_status) in CONSOLE {
        let before = snapshot(&app.pool).await;
        let signed_out_path = fill(path, &for_support);
        let url = format!("{}{signed_out_path}", app.address);
        // No session cookie, and a forged one.
        for cookie in ["", "chime_session=forged"] {
            let request = anonymous.request(method.parse().unwrap(), &url).header(COOKIE, cookie);
            let resp = if method == "GET" { request } else { request.form(form) }.send().await.unwrap();
            let location = resp.headers().get(LOCATION).map(|l| l.to_str().unwrap().to_string()).unwrap_or_default();
            assert_eq!(resp.status(), 303, "{method} {path} signed out (cookie `{cookie}`)");
            assert!(location.starts_with("/console/login?next="), "{method} {path} signed out went to {location}");
        }
        assert_eq!(snapshot(&app.pool).await, before, "{method} {path} signed out changed the database");

        for (user, console, ids) in [("support", &support, &for_support), ("admin", &admin, &for_admin)] {
            let path = fill(path, ids);
            let form: Vec<(String, String)> = form.iter().map(|(k, v)| (k.to_string(), fill(v, ids))).collect();
            let form: Vec<(&str, &str)> = form.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            let before = snapshot(&app.pool).await;
            let page = console_call(console, method, &path, &form).await;
            if who == Admin && user == "support" {
                assert_eq!(page.status, 403, "{method} {path} as support: {}", page.body);
                assert!(page.body.contains("only an admin can do this"), "{method} {path}: {}", page.body);
                assert_eq!(snapshot(&app.pool).await, before, "{method} {path} as support changed the database");
            } else {
                assert_eq!(page.status, allowed_status, "{method} {path} as {user}: {}", page.body);
            }
        }
    }
}

/// API tokens, session tokens and console passwords are stored only as hashes: no row of
/// `api_tokens`, `sessions` or `users` holds one in the clear.
#[tokio::test]
async fn tokens_and_passwords_are_stored_hashed_only() {
    let app = spawn_app().await;
    let token = app.biz_type("orders").await;
    chime::users::create(&app.pool, "helen", "support", "support-password").await.unwrap();
    let support = sign_in(&app, "helen", "support-password").await;

    let rows: Vec<String> =
        sqlx::query_scalar("SELECT t::text FROM api_tokens t UNION ALL SELECT u::text FROM users u UNION ALL SELECT s::text FROM sessions s")
            .fetch_all(&app.pool)
            .await
            .unwrap();
    assert_eq!(rows.len(), 1 + 2 + 1, "{rows:#?}");
    // The stored prefix is the token's first 12 characters; the rest must be nowhere.
    for secret in [&token[12..], ADMIN_PASSWORD, "support-password", &support.session] {
        assert!(rows.iter().all(|row| !row.contains(secret)), "`{secret}` stored in the clear: {rows:#?}");
    }
    let hashes: Vec<String> = sqlx::query_scalar("SELECT password_hash FROM users").fetch_all(&app.pool).await.unwrap();
    assert!(hashes.iter().all(|h| h.starts_with("$argon2")), "{hashes:?}");
}

/// A `chime serve` process logging at debug level, through a token created in the console, API
/// calls with valid, revoked and wrong tokens (admin tokens too), sign-ins with right and
/// wrong passwords and a secret rotation (encrypted with CHIME_SECRET_KEY): none of the
/// tokens, passwords, secrets, session cookies or the key is in its log.
#[tokio::test]
async fn tokens_passwords_and_secrets_never_reach_the_log() {
    let db_url = fresh_database().await;
    let log_path = std::env::temp_dir().join(format!("chime-authz-log-{}-{}.txt", std::process::id(), uuid::Uuid::new_v4()));
    let log = std::fs::File::create(&log_path).unwrap();
    // Everything at debug: CHIME_LOG adds to the default, which keeps access logs and SQL at warn.
    // With secrets encrypted at rest: the key is not logged either.
    let key = "bG9nLXRlc3Qta2V5LWxvZy10ZXN0LWtleS1sb2ctdGU=";
    let env = [
        ("CHIME_LOG", "debug,chime::http=debug,sqlx=debug"),
        ("CHIME_ADMIN_PASSWORD", "log-test-admin-password"),
        ("CHIME_ENGINE", "false"),
        ("CHIME_SECRET_KEY", key),
    ];
    let (mut child, address) = chime_process_logging(&db_url, &env, log).await;
    let pool = chime::db::connect(&db_url, 2).await.unwrap();
    let node = TestApp { address, pool, db_url, client: crate::helpers::client() };

    biz_types::create(
        &node.pool,
        "orders",
        &Settings { callback_url: Some("http://127.0.0.1:9/x".into()), ..Default::default() },
        CallbackHosts::Any,
    )
    .await
    .unwrap();
    chime::users::create(&node.pool, "helen", "support", "support-password").await.unwrap();
    let admin = sign_in(&node, "admin", "log-test-admin-password").await;
    let support = sign_in(&node, "helen", "support-password").await;
    assert_eq!(sign_in_attempt(&node, "admin", "wrong-password-guess").await.status, 401);

    let (page, _) = admin.post_and_follow("/console/biz-types/orders/tokens", &[]).await;
    let token = revealed(&page.body);
    let (rotated, _) = admin.post_and_follow("/console/biz-types/orders/rotate-secret", &[]).await;
    let secret = revealed(&rotated.body);
    let task = node.create_task(&token, json!({"biz_type": "orders", "delay_ms": 600000})).await;
    assert_eq!(node.get(&format!("/api/v1/tasks/{}", task["id"].as_str().unwrap()), &token).await.status, 200);
    let revoked = biz_types::create_token(&node.pool, "orders").await.unwrap();
    sqlx::query("UPDATE api_tokens SET revoked_at = now() WHERE prefix = $1").bind(&revoked[..12]).execute(&node.pool).await.unwrap();
    assert_eq!(node.get("/api/v1/tasks", &revoked).await.status, 401);
    assert_eq!(node.get("/api/v1/tasks", "chime_wrong-token-guess").await.status, 401);
    let admin_token = chime::admin_tokens::create(&node.pool, "ci", "test").await.unwrap().1;
    assert_eq!(node.get("/api/v1/admin/users", &admin_token).await.status, 200);
    assert_eq!(node.get("/api/v1/tasks", &admin_token).await.status, 403);
    assert_eq!(node.get("/api/v1/admin/users", "chime_admin_wrong-guess").await.status, 401);

    child.kill().await.unwrap();
    let log = std::fs::read_to_string(&log_path).unwrap();
    std::fs::remove_file(&log_path).unwrap();
    assert!(log.contains("DEBUG") && log.contains("console: signed in"), "the log was not captured: {log}");
    for secret in [
        token.as_str(),
        &token[12..],
        &revoked[12..],
        &admin_token[18..],
        "chime_admin_wrong-guess",
        "chime_wrong-token-guess",
        "log-test-admin-password",
        "support-password",
        "wrong-password-guess",
        secret.as_str(),
        &admin.session,
        &support.session,
        key,
    ] {
        assert!(!log.contains(secret), "`{secret}` is in the log");
    }
}

/// A signing secret is shown when it is made (creation, rotation) and never again: not on
/// the console's pages, in the audit log, or by `chime biz-type list`.
#[tokio::test]
async fn signing_secrets_are_shown_only_when_made() {
    let app = spawn_app().await;
    let admin = sign_in(&app, "admin", ADMIN_PASSWORD).await;
    let first = revealed(&admin.post_and_follow("/console/biz-types", &[("name", "orders"), ("mode", "pull")]).await.0.body);
    let second = revealed(&admin.post_and_follow("/console/biz-types/orders/rotate-secret", &[]).await.0.body);
    assert!(first.starts_with("whsec_") && second.starts_with("whsec_") && first != second, "{first} {second}");
    let stored: String = sqlx::query_scalar("SELECT signing_secret FROM biz_types").fetch_one(&app.pool).await.unwrap();
    assert_eq!(stored, second, "the rotated secret is the one in use");

    for path in ["/console", "/console/biz-types", "/console/biz-types/orders", "/console/audit"] {
        let page = admin.get(path).await;
        assert_eq!(page.status, 200, "{path}");
        assert!(!page.body.contains(&first) && !page.body.contains(&second), "{path} shows a signing secret");
    }
    let audit: Vec<String> = sqlx::query_scalar("SELECT l::text FROM audit_log l").fetch_all(&app.pool).await.unwrap();
    assert!(audit.len() >= 2 && audit.iter().all(|row| !row.contains(&first) && !row.contains(&second)), "{audit:#?}");
    let out = crate::cli::chime(&[("DATABASE_URL", app.db_url.as_str())], &["biz-type", "list"], None).await;
    assert!(out.ok && out.stdout.contains("orders") && !out.stdout.contains(&second), "{}", out.stdout);
}
