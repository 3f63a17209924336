use crate::helpers::spawn_app;

#[tokio::test]
async fn health_and_readiness_answer() {
    let app = spawn_app().await;
    let health = app.request("GET", "/healthz", None, None).await;
    assert_eq!(health.status, 200);
    let ready = app.request("GET", "/readyz", None, None).await;
    assert_eq!(ready.status, 200, "{}", ready.body);
    for path in ["/healthz", "/readyz"] {
        let head = app.client.head(format!("{}{path}", app.address)).send().await.unwrap();
        assert_eq!(head.status(), 200, "HEAD {path}");
    }
}

/// /readyz says not ready while a migration this binary knows is missing.
#[tokio::test]
async fn readyz_is_not_ready_with_pending_migrations() {
    let app = spawn_app().await;
    sqlx::query("DELETE FROM _sqlx_migrations").execute(&app.pool).await.unwrap();
    let ready = app.request("GET", "/readyz", None, None).await;
    assert_eq!((ready.status, ready.code()), (503, "unavailable"));
    assert!(ready.message().contains("migrations"), "{}", ready.message());
}

/// The OpenAPI document is served, is OpenAPI 3, and describes every API route.
#[tokio::test]
async fn openapi_document_covers_the_api() {
    let app = spawn_app().await;
    let doc = app.request("GET", "/api/v1/openapi.json", None, None).await;
    assert_eq!(doc.status, 200);
    assert!(doc.body["openapi"].as_str().unwrap().starts_with("3."));
    let paths = doc.body["paths"].as_object().unwrap();
    for (path, method) in [
        ("/api/v1/tasks", "post"),
        ("/api/v1/tasks", "get"),
        ("/api/v1/tasks/batch", "post"),
        ("/api/v1/tasks/{id}", "get"),
        ("/api/v1/tasks/{id}", "patch"),
        ("/api/v1/tasks/{id}", "delete"),
        ("/api/v1/tasks/{id}/replay", "post"),
        ("/api/v1/biz-types/{name}/tasks/by-key/{key}", "get"),
        ("/api/v1/timers", "post"),
        ("/api/v1/timers", "get"),
        ("/api/v1/timers/{id}", "get"),
        ("/api/v1/timers/{id}", "patch"),
        ("/api/v1/timers/{id}", "delete"),
        ("/api/v1/timers/{id}/activate", "post"),
        ("/api/v1/timers/{id}/deactivate", "post"),
        ("/api/v1/biz-types/{name}/reserve", "post"),
        ("/api/v1/tasks/{id}/ack", "post"),
        ("/api/v1/tasks/{id}/nack", "post"),
        ("/api/v1/tasks/{id}/touch", "post"),
    ] {
        assert!(paths.get(path).and_then(|p| p.get(method)).is_some(), "{method} {path} missing");
    }
}

/// Unknown routes and methods answer in the API's JSON error shape.
#[tokio::test]
async fn unknown_routes_and_methods_are_json_errors() {
    let app = spawn_app().await;
    let reply = app.request("GET", "/api/v1/nothing-here", None, None).await;
    assert_eq!((reply.status, reply.code()), (404, "not_found"));
    let reply = app.request("GET", "/nothing", None, None).await;
    assert_eq!(reply.status, 404);
    let reply = app.request("PUT", "/api/v1/tasks", None, None).await;
    assert_eq!((reply.status, reply.code()), (405, "method_not_allowed"));
    assert_eq!(reply.headers["allow"], "GET, POST");
    let reply = app.request("GET", "/api/v1/tasks/batch", None, None).await;
    assert_eq!(reply.status, 405);
    assert_eq!(reply.headers["allow"], "POST");
}
