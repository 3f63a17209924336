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

/// With CHIME_METRICS_LISTEN, `/metrics` is served on that address and no longer on the
/// API's, which may face clients that should not see the biz type names.
#[tokio::test]
async fn metrics_listen_moves_metrics_off_the_api_address() {
    let metrics_address = format!("127.0.0.1:{}", crate::helpers::free_port());
    let db_url = crate::helpers::fresh_database().await;
    let (_node, address) = crate::helpers::chime_node(&db_url, &[("CHIME_METRICS_LISTEN", &metrics_address)]).await;
    let client = crate::helpers::client();
    let on_api = client.get(format!("{address}/metrics")).send().await.unwrap();
    assert_eq!(on_api.status(), 404);
    let own = client.get(format!("http://{metrics_address}/metrics")).header("accept", "application/openmetrics-text").send().await.unwrap();
    assert_eq!(own.status(), 200);
    let text = own.text().await.unwrap();
    assert!(text.contains("# TYPE chime_db_pool_connections_in_use gauge") && text.ends_with("# EOF\n"), "{text}");
    let other = client.get(format!("http://{metrics_address}/readyz")).send().await.unwrap();
    assert_eq!(other.status(), 404, "only /metrics is served there");
}

/// A client that sends its headers and then its body a byte a second is answered 408 and
/// disconnected once CHIME_BODY_TIMEOUT_SECS (2 s here) has passed since its headers, and
/// the server answers others meanwhile.
#[tokio::test]
async fn a_body_sent_too_slowly_is_answered_408() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let app = crate::helpers::spawn_app_with(chime::config::ServeArgs { engine: false, body_timeout_secs: 2, ..Default::default() }).await;
    let token = app.biz_type("orders").await;
    let host = app.address.trim_start_matches("http://").to_string();
    let stream = tokio::net::TcpStream::connect(&host).await.unwrap();
    let (mut reader, mut writer) = stream.into_split();
    let head = format!(
        "POST /api/v1/tasks HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
    );
    writer.write_all(head.as_bytes()).await.unwrap();
    let started = std::time::Instant::now();
    let drip = tokio::spawn(async move {
        while writer.write_all(b" ").await.is_ok() {
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        }
    });
    assert_eq!(app.request("GET", "/healthz", None, None).await.status, 200);

    // Everything the server sends until it closes the connection (at most 10 s).
    let mut answer = Vec::new();
    let closed = tokio::time::timeout(std::time::Duration::from_secs(10), reader.read_to_end(&mut answer)).await;
    let elapsed = started.elapsed();
    drip.abort();
    let answer = String::from_utf8_lossy(&answer);
    println!("slow body: answered and disconnected after {elapsed:?}: {}", answer.lines().next().unwrap_or(""));
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("request_timeout"), "{answer}");
    assert!(closed.is_ok(), "the connection stayed open");
    assert!(elapsed < std::time::Duration::from_secs(4), "took {elapsed:?}, for a 2 s timeout");
}
