use serde_json::json;

use crate::helpers::{TestApp, spawn_app};

/// Every task endpoint, as (method, path, body) for a task of biz type `orders`.
fn endpoints(id: &str) -> Vec<(&'static str, String, Option<serde_json::Value>)> {
    vec![
        ("POST", "/api/v1/tasks".into(), Some(json!({"biz_type": "orders"}))),
        ("POST", "/api/v1/tasks/batch".into(), Some(json!({"tasks": [{"biz_type": "orders"}]}))),
        ("GET", "/api/v1/tasks".into(), None),
        ("GET", format!("/api/v1/tasks/{id}"), None),
        ("GET", "/api/v1/biz-types/orders/tasks/by-key/k".into(), None),
        ("PATCH", format!("/api/v1/tasks/{id}"), Some(json!({"delay_ms": 1000}))),
        ("DELETE", format!("/api/v1/tasks/{id}"), None),
        ("POST", format!("/api/v1/tasks/{id}/replay"), Some(json!({}))),
    ]
}

async fn call(app: &TestApp, token: Option<&str>, method: &str, path: &str, body: &Option<serde_json::Value>) -> crate::helpers::Reply {
    app.request(method, path, token, body.as_ref().map(|b| b.to_string().into_bytes())).await
}

/// No token, a malformed header, an unknown token and a revoked token all get 401 on every
/// endpoint.
#[tokio::test]
async fn every_endpoint_requires_a_valid_token() {
    let app = spawn_app().await;
    let token = app.biz_type("orders").await;
    let task = app.create_task(&token, json!({"biz_type": "orders", "key": "k"})).await;
    let id = task["id"].as_str().unwrap();
    let revoked = chime::biz_types::create_token(&app.pool, "orders").await.unwrap();
    sqlx::query("UPDATE api_tokens SET revoked_at = now() WHERE prefix = $1").bind(&revoked[..12]).execute(&app.pool).await.unwrap();

    for (method, path, body) in endpoints(id) {
        for bad in [None, Some("chime_not-a-real-token"), Some(revoked.as_str())] {
            let reply = call(&app, bad, method, &path, &body).await;
            assert_eq!((reply.status, reply.code()), (401, "unauthenticated"), "{method} {path} with {bad:?}");
            assert_eq!(reply.headers["www-authenticate"], "Bearer");
        }
        let reply = app
            .client
            .request(method.parse().unwrap(), format!("{}{path}", app.address))
            .header("Authorization", format!("Basic {token}"))
            .send()
            .await
            .unwrap();
        assert_eq!(reply.status(), 401, "{method} {path} with a Basic header");
    }
    // The valid token still works, and the task was never touched.
    let reply = app.get(&format!("/api/v1/tasks/{id}"), &token).await;
    assert_eq!(reply.body["status"], "pending");
}

/// A token of another biz type gets 403 on everything of `orders`, and changes nothing.
#[tokio::test]
async fn a_token_acts_only_on_its_own_biz_type() {
    let app = spawn_app().await;
    let token = app.biz_type("orders").await;
    let intruder = app.biz_type("coupons").await;
    let task = app.create_task(&token, json!({"biz_type": "orders", "key": "k"})).await;
    let id = task["id"].as_str().unwrap();

    for (method, path, body) in endpoints(id) {
        let reply = call(&app, Some(&intruder), method, &path, &body).await;
        if method == "GET" && path == "/api/v1/tasks" {
            // Listing without a biz type lists the caller's own tasks: none.
            assert_eq!(reply.status, 200);
            assert_eq!(reply.body["items"], json!([]));
            continue;
        }
        if path.ends_with("/batch") {
            assert_eq!(reply.status, 200);
            assert_eq!(reply.body["results"][0]["status"], 403, "{}", reply.body);
            continue;
        }
        assert_eq!((reply.status, reply.code()), (403, "permission_denied"), "{method} {path}: {}", reply.body);
    }
    let list = app.get("/api/v1/tasks?biz_type=orders", &intruder).await;
    assert_eq!(list.status, 403);

    let reply = app.get(&format!("/api/v1/tasks/{id}"), &token).await;
    assert_eq!(reply.body["status"], "pending");
    assert_eq!(reply.body["run_at"], task["run_at"]);
    let count: i64 = sqlx::query_scalar("SELECT count(*) FROM all_tasks").fetch_one(&app.pool).await.unwrap();
    assert_eq!(count, 1, "the intruder created nothing");
}

/// Tokens are stored only as hashes.
#[tokio::test]
async fn tokens_are_stored_hashed() {
    let app = spawn_app().await;
    let token = app.biz_type("orders").await;
    let stored: Vec<(Vec<u8>, String)> = sqlx::query_as("SELECT token_hash, prefix FROM api_tokens").fetch_all(&app.pool).await.unwrap();
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0].0.len(), 32);
    assert!(!String::from_utf8_lossy(&stored[0].0).contains(&token[12..]));
    assert_eq!(stored[0].1, token[..12]);
}

/// Revoking a token shuts it out within seconds, also after it was used (and cached).
#[tokio::test]
async fn a_revoked_token_stops_working_within_seconds() {
    let app = spawn_app().await;
    let token = app.biz_type("orders").await;
    assert_eq!(app.get("/api/v1/tasks", &token).await.status, 200);
    sqlx::query("UPDATE api_tokens SET revoked_at = now()").execute(&app.pool).await.unwrap();
    // Asked until it is refused: at most 6 s after the revocation (the cache keeps a token 5 s).
    let revoked = std::time::Instant::now();
    let mut reply = app.get("/api/v1/tasks", &token).await;
    while reply.status != 401 && revoked.elapsed() < std::time::Duration::from_secs(6) {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        reply = app.get("/api/v1/tasks", &token).await;
    }
    assert_eq!(reply.status, 401);
}

/// A token revoked through the admin API is refused at once by every node that had checked
/// (and cached) it: by the node that revoked it from its answer on, and by another as soon
/// as the settings notification reaches it, not after the token cache's 5 s.
#[tokio::test]
async fn a_revoked_token_is_refused_at_once_on_every_node() {
    let app = spawn_app().await;
    let other = crate::helpers::spawn_second_node(&app).await;
    let token = app.biz_type("orders").await;
    let admin = crate::admin::admin_token(&app).await;
    for node in [&app, &other] {
        assert_eq!(node.get("/api/v1/tasks", &token).await.status, 200, "checked and cached");
    }
    let id: uuid::Uuid = sqlx::query_scalar("SELECT id FROM api_tokens").fetch_one(&app.pool).await.unwrap();
    let reply = app.request("DELETE", &format!("/api/v1/admin/biz-types/orders/tokens/{id}"), Some(&admin), None).await;
    assert_eq!(reply.status, 204, "{}", reply.body);
    let revoked = std::time::Instant::now();
    let here = app.get("/api/v1/tasks", &token).await.status;
    // The other node is told by notification: asked until it refuses, for up to 6 s.
    let mut there = other.get("/api/v1/tasks", &token).await.status;
    while there != 401 && revoked.elapsed() < std::time::Duration::from_secs(6) {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        there = other.get("/api/v1/tasks", &token).await.status;
    }
    let took = revoked.elapsed();
    println!("after the revocation: {here} from the node that revoked it; {there} from the other after {took:?}");
    assert_eq!(here, 401, "the node that revoked it refuses it at once");
    assert_eq!(there, 401);
    assert!(took < std::time::Duration::from_secs(1), "the other node refused it only after {took:?}");
}
