//! `GET /api/v1/biz-types/{name}/stats`: a biz type's queue right now, for autoscalers.
//! Counts per state as tasks are created, delivered and failed, capped; the last minute's
//! lateness; what is in flight; and the same authorisation as the biz type's other paths.

use chime::biz_types::{self, Settings};
use chime::callback_hosts::CallbackHosts;
use serde_json::{Value, json};

use crate::delivery::wait_for_status;
use crate::helpers::{TestApp, spawn_app, spawn_node};
use crate::receiver::{Answer, Receiver};

async fn stats(app: &TestApp, name: &str, token: &str) -> Value {
    let reply = app.get(&format!("/api/v1/biz-types/{name}/stats"), token).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    reply.body
}

fn in_ms(ms: i64) -> String {
    (chrono::Utc::now() + chrono::TimeDelta::milliseconds(ms)).to_rfc3339()
}

/// Three tasks delivered and two failed for good by a real receiver show as two failed and
/// five attempts with a lateness; then, the biz type paused, tasks created due and later,
/// one of them retrying, one leased and one expired, each count as what it is.
#[tokio::test]
async fn counts_follow_the_tasks_created_delivered_and_failed() {
    let app = spawn_node().await;
    let receiver = Receiver::start(vec![Answer::status(200), Answer::status(200), Answer::status(200)], Answer::status(500)).await;
    let settings = Settings { callback_url: Some(receiver.url.clone()), max_attempts: Some(1), max_in_flight: Some(7), ..Default::default() };
    biz_types::create(&app.pool, "stats-a", &settings, CallbackHosts::Any).await.unwrap();
    let token = biz_types::create_token(&app.pool, "stats-a").await.unwrap();

    // One at a time, so that the three 200s go to the first three.
    for status in ["succeeded", "succeeded", "succeeded", "failed", "failed"] {
        let id = app.create_task(&token, json!({"biz_type": "stats-a"})).await["id"].as_str().unwrap().to_string();
        wait_for_status(&app, &token, &id, status).await;
    }
    let s = stats(&app, "stats-a", &token).await;
    assert_eq!(s["counts"], json!({"due": 0, "pending": 0, "running": 0, "retrying": 0, "failed": 2, "expired": 0}), "{s}");
    assert_eq!((&s["biz_type"], &s["count_cap"], &s["capped"]), (&json!("stats-a"), &json!(10_000), &json!([])), "{s}");
    assert_eq!(s["lateness"]["attempts"], 5, "{s}");
    assert_eq!(s["lateness"]["window_s"], 60, "{s}");
    assert!(s["lateness"]["p50_ms"].as_i64().is_some_and(|p50| p50 >= 0), "{s}");
    assert!(s["lateness"]["p99_ms"].as_i64() >= s["lateness"]["p50_ms"].as_i64(), "{s}");
    assert_eq!((&s["oldest_due_age_ms"], &s["in_flight"]), (&Value::Null, &json!({"count": 0, "max": 7})), "{s}");

    // A paused biz type keeps what is created as the test leaves it.
    let paused = Settings { callback_url: Some(receiver.url.clone()), paused: Some(true), max_in_flight: Some(3), ..Default::default() };
    biz_types::create(&app.pool, "stats-b", &paused, CallbackHosts::Any).await.unwrap();
    let b = biz_types::create_token(&app.pool, "stats-b").await.unwrap();
    for _ in 0..2 {
        app.create_task(&b, json!({"biz_type": "stats-b", "run_at": in_ms(-30_000)})).await;
    }
    let mut later = Vec::new();
    for _ in 0..5 {
        later.push(app.create_task(&b, json!({"biz_type": "stats-b", "run_at": in_ms(3_600_000)})).await["id"].as_str().unwrap().to_string());
    }
    // In cold storage: beyond the hot horizon (two days).
    app.create_task(&b, json!({"biz_type": "stats-b", "run_at": in_ms(5 * 86_400_000)})).await;
    sqlx::query("UPDATE tasks SET attempt_count = 1, last_error = 'HTTP 500' WHERE id = $1::uuid").bind(&later[0]).execute(&app.pool).await.unwrap();
    app.force_status(&later[1], "running").await;
    app.force_status(&later[2], "expired").await;

    let s = stats(&app, "stats-b", &b).await;
    assert_eq!(s["counts"], json!({"due": 2, "pending": 6, "running": 1, "retrying": 1, "failed": 0, "expired": 1}), "{s}");
    assert_eq!((&s["in_flight"], &s["lateness"]["attempts"]), (&json!({"count": 1, "max": 3}), &json!(0)), "{s}");
    assert!(s["oldest_due_age_ms"].as_i64().is_some_and(|age| (30_000..600_000).contains(&age)), "{s}");
    assert_eq!(s["lateness"]["p50_ms"], Value::Null, "{s}");
    // The other biz type's are its own.
    assert_eq!(stats(&app, "stats-a", &token).await["counts"]["failed"], 2);
}

/// A count is exact below the cap (10,000); one that reaches it says 10,000 and is named in
/// `capped`.
#[tokio::test]
async fn counts_stop_at_the_cap_and_say_so() {
    let app = spawn_app().await;
    let token = app.biz_type("stats-cap").await;
    let id = biz_types::id_of(&app.pool, "stats-cap").await.unwrap();
    // 9,999 due and one later: due stays exact, pending reaches the cap.
    sqlx::query(
        "INSERT INTO tasks (id, biz_type_id, run_at)
         SELECT gen_random_uuid(), $1, CASE WHEN i < 10000 THEN now() - interval '1 minute' ELSE now() + interval '1 hour' END
           FROM generate_series(1, 10000) i",
    )
    .bind(id)
    .execute(&app.pool)
    .await
    .unwrap();
    let s = stats(&app, "stats-cap", &token).await;
    assert_eq!((&s["counts"]["due"], &s["counts"]["pending"]), (&json!(9_999), &json!(10_000)), "{s}");
    assert_eq!(s["capped"], json!(["pending"]), "{s}");

    sqlx::query("INSERT INTO tasks (id, biz_type_id, run_at) SELECT gen_random_uuid(), $1, now() FROM generate_series(1, 5)")
        .bind(id)
        .execute(&app.pool)
        .await
        .unwrap();
    let s = stats(&app, "stats-cap", &token).await;
    assert_eq!((&s["counts"]["due"], &s["counts"]["pending"]), (&json!(10_000), &json!(10_000)), "{s}");
    assert_eq!(s["capped"], json!(["due", "pending"]), "{s}");
}

/// Only the biz type's own token reads its stats: another biz type's is refused (403), a
/// name no biz type has is 404, no token 401.
#[tokio::test]
async fn stats_are_the_token_biz_types_only() {
    let app = spawn_app().await;
    let mine = app.biz_type("stats-mine").await;
    app.biz_type("stats-theirs").await;

    let reply = app.get("/api/v1/biz-types/stats-theirs/stats", &mine).await;
    assert_eq!((reply.status, reply.code()), (403, "permission_denied"), "{}", reply.body);
    let reply = app.get("/api/v1/biz-types/no-such/stats", &mine).await;
    assert_eq!((reply.status, reply.code()), (404, "not_found"), "{}", reply.body);
    let reply = app.request("GET", "/api/v1/biz-types/stats-mine/stats", None, None).await;
    assert_eq!(reply.status, 401, "{}", reply.body);
    let reply = app.request("POST", "/api/v1/biz-types/stats-mine/stats", Some(&mine), None).await;
    assert_eq!(reply.status, 405, "{}", reply.body);
    let s = stats(&app, "stats-mine", &mine).await;
    assert_eq!(s["counts"]["pending"], 0, "{s}");
    let reply = app.get("/api/v1/biz-types/stats-mine/stats", &mine).await;
    assert_eq!(
        reply.headers.get("cache-control").map(|v| v.as_bytes()),
        Some(&b"no-store"[..]),
        "autoscalers poll: nothing should answer from a cache"
    );
}
