//! Pull delivery: consumers reserve due tasks with a time to run, and ack, nack or touch
//! them.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use chime::biz_types::{self, Settings};
use chime::callback_hosts::CallbackHosts;
use serde_json::{Value, json};

use crate::helpers::{TestApp, spawn_app};

/// A pull biz type with a token.
async fn pull_biz_type(app: &TestApp, name: &str, settings: Settings) -> String {
    biz_types::create(&app.pool, name, &Settings { mode: Some("pull".into()), ..settings }, CallbackHosts::Any).await.unwrap();
    biz_types::create_token(&app.pool, name).await.unwrap()
}

async fn reserve(app: &TestApp, token: &str, body: Value) -> Vec<Value> {
    let reply = app.post("/api/v1/biz-types/jobs/reserve", token, body).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    reply.body["tasks"].as_array().unwrap().clone()
}

/// A reserve from a task of its own (a consumer beside the test), its answer as JSON.
async fn reserve_from(client: &reqwest::Client, address: &str, token: &str, body: Value) -> Value {
    let resp = client.post(format!("{address}/api/v1/biz-types/jobs/reserve")).bearer_auth(token).json(&body).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    resp.json().await.unwrap()
}

/// Reserves until `n` tasks are back after another consumer's time to run passed (the
/// leader takes them back every second), or fails after 10 s.
async fn reserve_taken_back(app: &TestApp, token: &str, n: usize) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut got = Vec::new();
    while got.len() < n {
        assert!(Instant::now() < deadline, "only {} of {n} tasks came back within 10 s", got.len());
        got.extend(reserve(app, token, json!({"max": n, "wait_ms": 200, "ttr_ms": 60000})).await);
    }
    got
}

async fn create(app: &TestApp, token: &str, n: usize) -> Vec<String> {
    let items: Vec<Value> = (0..n).map(|i| json!({"biz_type": "jobs", "payload": i})).collect();
    let reply = app.post("/api/v1/tasks/batch", token, json!({"tasks": items})).await;
    reply.body["results"].as_array().unwrap().iter().map(|r| r["task"]["id"].as_str().unwrap().to_string()).collect()
}

#[tokio::test]
async fn concurrent_consumers_never_hold_the_same_task() {
    let app = spawn_app().await;
    let token = pull_biz_type(&app, "jobs", Settings { max_in_flight: Some(1000), ..Default::default() }).await;
    create(&app, &token, 400).await;
    let consumers: Vec<_> = (0..8)
        .map(|_| {
            let (address, token) = (app.address.clone(), token.clone());
            tokio::spawn(async move {
                let client = crate::helpers::client();
                let mut got = Vec::new();
                loop {
                    let reply = reserve_from(&client, &address, &token, json!({"max": 10, "ttr_ms": 60000})).await;
                    let tasks = reply["tasks"].as_array().unwrap().clone();
                    if tasks.is_empty() {
                        return got;
                    }
                    for t in tasks {
                        let id = t["id"].as_str().unwrap().to_string();
                        let receipt = json!({"receipt": t["receipt"]});
                        let ack = client.post(format!("{address}/api/v1/tasks/{id}/ack")).bearer_auth(&token).json(&receipt).send().await.unwrap();
                        assert_eq!(ack.status(), 200);
                        got.push(id);
                    }
                }
            })
        })
        .collect();
    let mut seen: HashMap<String, usize> = HashMap::new();
    for c in consumers {
        for id in c.await.unwrap() {
            *seen.entry(id).or_default() += 1;
        }
    }
    assert_eq!(seen.len(), 400, "every task reserved");
    assert!(seen.values().all(|n| *n == 1), "no task reserved twice while its lease held");
    let succeeded: i64 = sqlx::query_scalar("SELECT count(*) FROM tasks WHERE status = 'succeeded'").fetch_one(&app.pool).await.unwrap();
    assert_eq!(succeeded, 400);
    let acked: i64 = sqlx::query_scalar("SELECT count(*) FROM attempts WHERE response_excerpt = 'acked'").fetch_one(&app.pool).await.unwrap();
    assert_eq!(acked, 400, "each reservation is an attempt in the history");
}

#[tokio::test]
async fn a_consumer_that_dies_leaves_its_tasks_to_others_after_the_time_to_run() {
    let app = spawn_app().await;
    let token = pull_biz_type(&app, "jobs", Settings::default()).await;
    let ids = create(&app, &token, 3).await;
    let first = reserve(&app, &token, json!({"max": 10, "ttr_ms": 500})).await;
    assert_eq!(first.len(), 3);
    assert!(reserve(&app, &token, json!({"max": 10})).await.is_empty(), "held while the lease lasts");
    // The first consumer never acks; the leader takes the tasks back after the time to run.
    let again = reserve_taken_back(&app, &token, 3).await;
    let mut got: Vec<String> = again.iter().map(|t| t["id"].as_str().unwrap().to_string()).collect();
    got.sort();
    let mut want = ids.clone();
    want.sort();
    assert_eq!(got, want);
    assert!(again.iter().all(|t| t["attempt_count"] == 2));
    let task = app.get(&format!("/api/v1/tasks/{}", ids[0]), &token).await.body;
    assert_eq!(task["attempts"][0]["error"], "time to run passed without an ack or nack");
    // The late consumer's ack no longer counts: the task is the second consumer's to settle
    // (a_late_consumer_s_receipt_cannot_settle_the_next_reservation).
    let late = app.post(&format!("/api/v1/tasks/{}/ack", first[0]["id"].as_str().unwrap()), &token, json!({"receipt": first[0]["receipt"]})).await;
    assert_eq!((late.status, late.code()), (409, "stale_receipt"), "{}", late.body);
}

/// A reservation's receipt settles that reservation only. Consumer A's time to run passes,
/// B reserves the tasks again, and A's late ack, nack and touch answer 409 `stale_receipt`
/// and change nothing; B's receipts settle them. Before receipts, A's late ack settled
/// B's reservation (issue 18, item 7).
#[tokio::test]
async fn a_late_consumer_s_receipt_cannot_settle_the_next_reservation() {
    let app = spawn_app().await;
    let token = pull_biz_type(&app, "jobs", Settings::default()).await;
    create(&app, &token, 3).await;
    let a = reserve(&app, &token, json!({"max": 3, "ttr_ms": 200})).await;
    assert_eq!(a.len(), 3);
    // A never answers in time: B gets the tasks once the leader has taken them back.
    let b: HashMap<String, Value> =
        reserve_taken_back(&app, &token, 3).await.into_iter().map(|t| (t["id"].as_str().unwrap().to_string(), t)).collect();
    let snapshot = || async {
        let tasks: Vec<String> = sqlx::query_scalar("SELECT t::text FROM tasks t ORDER BY id").fetch_all(&app.pool).await.unwrap();
        let attempts: Vec<String> = sqlx::query_scalar("SELECT a::text FROM attempts a ORDER BY task_id, number").fetch_all(&app.pool).await.unwrap();
        (tasks, attempts)
    };
    let before = snapshot().await;
    for (action, late) in ["ack", "nack", "touch"].into_iter().zip(&a) {
        let id = late["id"].as_str().unwrap();
        let late = app.post(&format!("/api/v1/tasks/{id}/{action}"), &token, json!({"receipt": late["receipt"]})).await;
        assert_eq!(late.status, 409, "A's late {action} of a task B holds: {}", late.body);
        assert_eq!(late.code(), "stale_receipt");
        assert!(late.message().contains("another reservation holds it"), "{}", late.message());
    }
    assert_eq!(snapshot().await, before, "A's late calls changed nothing: B still holds the tasks, until the same time");
    assert!(
        a.iter().all(|a| a["receipt"].is_string() && a["receipt"] != b[a["id"].as_str().unwrap()]["receipt"]),
        "each reservation has its own receipt"
    );
    for (id, b) in &b {
        let acked = app.post(&format!("/api/v1/tasks/{id}/ack"), &token, json!({"receipt": b["receipt"]})).await;
        assert_eq!((acked.status, acked.body["status"].as_str()), (200, Some("succeeded")), "B's ack: {}", acked.body);
    }
}

/// Ack, nack and touch need the receipt: missing or malformed is a 422 naming it, another
/// task's is a 409 (it does not hold this task), and none of them changes anything.
#[tokio::test]
async fn ack_nack_and_touch_require_the_reservation_s_receipt() {
    let app = spawn_app().await;
    let token = pull_biz_type(&app, "jobs", Settings::default()).await;
    create(&app, &token, 2).await;
    let reserved = reserve(&app, &token, json!({"max": 2, "ttr_ms": 60000})).await;
    let (id, other) = (reserved[0]["id"].as_str().unwrap(), &reserved[1]["receipt"]);
    let before: Vec<String> = sqlx::query_scalar("SELECT t::text FROM tasks t ORDER BY id").fetch_all(&app.pool).await.unwrap();
    for action in ["ack", "nack", "touch"] {
        let path = format!("/api/v1/tasks/{id}/{action}");
        let empty = app.request("POST", &path, Some(&token), None).await;
        for (reply, what) in [
            (empty, "no body"),
            (app.post(&path, &token, json!({})).await, "no receipt"),
            (app.post(&path, &token, json!({"receipt": "r-42"})).await, "a receipt that is not a UUID"),
        ] {
            assert_eq!((reply.status, reply.code()), (422, "invalid_argument"), "{action} with {what}: {}", reply.body);
            assert!(reply.message().starts_with("receipt: "), "{}", reply.message());
        }
        let foreign = app.post(&path, &token, json!({"receipt": other})).await;
        assert_eq!((foreign.status, foreign.code()), (409, "stale_receipt"), "{action} with another task's receipt: {}", foreign.body);
    }
    let after: Vec<String> = sqlx::query_scalar("SELECT t::text FROM tasks t ORDER BY id").fetch_all(&app.pool).await.unwrap();
    assert_eq!(after, before);
    let acked = app.post(&format!("/api/v1/tasks/{id}/ack"), &token, json!({"receipt": reserved[0]["receipt"]})).await;
    assert_eq!(acked.status, 200, "{}", acked.body);
}

#[tokio::test]
async fn reserve_waits_for_a_task_to_become_due() {
    let app = spawn_app().await;
    let token = pull_biz_type(&app, "jobs", Settings::default()).await;
    let started = Instant::now();
    // Due 1 s after the reserve starts: the waiting reserve answers when it is due, long
    // before its 10 s wait, whether the task is created before it first looks or after.
    let due = chrono::Utc::now() + chrono::Duration::milliseconds(1000);
    let waiter = {
        let (address, token) = (app.address.clone(), token.clone());
        tokio::spawn(async move {
            let reply = reserve_from(&crate::helpers::client(), &address, &token, json!({"wait_ms": 10000})).await;
            (reply, Instant::now())
        })
    };
    app.create_task(&token, json!({"biz_type": "jobs", "run_at": due.to_rfc3339(), "payload": "soon"})).await;
    let (reply, answered) = waiter.await.unwrap();
    assert_eq!(reply["tasks"][0]["payload"], "soon");
    let waited = answered - started;
    assert!(waited >= Duration::from_millis(900) && waited < Duration::from_secs(5), "{waited:?}");
    // Nothing due: an empty answer after the wait.
    let started = Instant::now();
    assert!(reserve(&app, &token, json!({"wait_ms": 300})).await.is_empty());
    assert!(started.elapsed() >= Duration::from_millis(300));
}

#[tokio::test]
async fn nack_retries_after_the_delay_and_fails_after_max_attempts() {
    let app = spawn_app().await;
    let token = pull_biz_type(&app, "jobs", Settings { max_attempts: Some(2), ..Default::default() }).await;
    let id = create(&app, &token, 1).await.remove(0);
    let first = reserve(&app, &token, json!({})).await;
    let nacked = app
        .post(&format!("/api/v1/tasks/{id}/nack"), &token, json!({"receipt": first[0]["receipt"], "delay_ms": 800, "error": "database busy"}))
        .await;
    assert_eq!(nacked.status, 200, "{}", nacked.body);
    assert_eq!(nacked.body["status"], "pending");
    assert_eq!(nacked.body["last_error"], "nacked: database busy");
    assert!(reserve(&app, &token, json!({})).await.is_empty(), "not before the delay");
    let again = reserve(&app, &token, json!({"wait_ms": 3000})).await;
    assert_eq!(again.len(), 1, "after the delay");
    let failed = app.post(&format!("/api/v1/tasks/{id}/nack"), &token, json!({"receipt": again[0]["receipt"]})).await;
    assert_eq!(failed.body["status"], "failed", "the second of two attempts");
    let task = app.get(&format!("/api/v1/tasks/{id}"), &token).await.body;
    assert_eq!(task["attempts"].as_array().unwrap().len(), 2);

    // Replay works for pull tasks too.
    assert_eq!(app.post(&format!("/api/v1/tasks/{id}/replay"), &token, json!({})).await.status, 200);
    let replayed = reserve(&app, &token, json!({})).await;
    assert_eq!(replayed[0]["id"], id.as_str());
    assert_eq!(replayed[0]["attempt_count"], 1);
}

#[tokio::test]
async fn touch_extends_the_time_to_run() {
    let app = spawn_app().await;
    let token = pull_biz_type(&app, "jobs", Settings::default()).await;
    let id = create(&app, &token, 1).await.remove(0);
    let first = reserve(&app, &token, json!({"ttr_ms": 800})).await;
    let until: chrono::DateTime<chrono::Utc> = first[0]["reserved_until"].as_str().unwrap().parse().unwrap();
    let receipt = &first[0]["receipt"];
    let touched = app.post(&format!("/api/v1/tasks/{id}/touch"), &token, json!({"receipt": receipt, "ttr_ms": 60000})).await;
    assert_eq!(touched.status, 200);
    let extended: chrono::DateTime<chrono::Utc> = touched.body["reserved_until"].as_str().unwrap().parse().unwrap();
    assert!(extended > until + chrono::Duration::seconds(30));
    // Once the first time to run is over by the database's clock, the leader's lease
    // recovery leaves the task held, and so does a reserve.
    while !sqlx::query_scalar::<_, bool>("SELECT now() > $1").bind(until).fetch_one(&app.pool).await.unwrap() {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(chime::leader::recover_leases(&app.pool).await, 0, "recovered while touched");
    assert!(reserve(&app, &token, json!({})).await.is_empty(), "still held after the first time to run");
    assert_eq!(app.post(&format!("/api/v1/tasks/{id}/ack"), &token, json!({"receipt": receipt})).await.body["status"], "succeeded");
    let again = app.post(&format!("/api/v1/tasks/{id}/ack"), &token, json!({"receipt": receipt})).await;
    assert_eq!((again.status, again.code()), (409, "stale_receipt"), "acked once only");
}

#[tokio::test]
async fn reserve_refuses_bad_requests_and_respects_pause_and_mode() {
    let app = spawn_app().await;
    let token = pull_biz_type(&app, "jobs", Settings { max_in_flight: Some(2), ..Default::default() }).await;
    let callback = app.biz_type("hooks").await;
    create(&app, &token, 3).await;
    for (body, field) in [
        (json!({"max": 0}), "max"),
        (json!({"max": 101}), "max"),
        (json!({"wait_ms": 30001}), "wait_ms"),
        (json!({"ttr_ms": 0}), "ttr_ms"),
        (json!({"count": 1}), "unknown field"),
    ] {
        let reply = app.post("/api/v1/biz-types/jobs/reserve", &token, body.clone()).await;
        assert_eq!(reply.status, 422, "{body}");
        assert!(reply.message().contains(field), "{}", reply.message());
    }
    let reply = app.post("/api/v1/biz-types/hooks/reserve", &callback, json!({})).await;
    assert_eq!((reply.status, reply.code()), (409, "invalid_state"), "a callback biz type cannot be reserved from");
    assert_eq!(app.post("/api/v1/biz-types/hooks/reserve", &token, json!({})).await.status, 403);
    assert_eq!(app.post("/api/v1/biz-types/nope/reserve", &token, json!({})).await.status, 404);

    // max_in_flight caps the tasks reserved and not yet settled.
    assert_eq!(reserve(&app, &token, json!({"max": 10})).await.len(), 2);
    assert!(reserve(&app, &token, json!({"max": 10})).await.is_empty());

    biz_types::update(&app.pool, "jobs", &Settings { paused: Some(true), max_in_flight: Some(100), ..Default::default() }, CallbackHosts::Any)
        .await
        .unwrap();
    assert!(reserve(&app, &token, json!({"max": 10})).await.is_empty(), "paused: nothing handed out");
    let task = app.create_task(&callback, json!({"biz_type": "hooks"})).await;
    let task_id = task["id"].as_str().unwrap();
    let receipt = json!({"receipt": uuid::Uuid::new_v4()});
    let foreign = app.post(&format!("/api/v1/tasks/{task_id}/ack"), &token, receipt.clone()).await;
    assert_eq!(foreign.status, 403);
    // A callback task an engine is delivering is not its own biz type's consumer's to settle.
    app.force_status(task_id, "running").await;
    for action in ["ack", "nack", "touch"] {
        let reply = app.post(&format!("/api/v1/tasks/{task_id}/{action}"), &callback, receipt.clone()).await;
        assert_eq!((reply.status, reply.code()), (409, "invalid_state"), "{action}");
    }
    assert_eq!(app.get(&format!("/api/v1/tasks/{task_id}"), &callback).await.body["status"], "running");
}

/// A nack's `error` is checked as the OpenAPI document describes it (at most 1000
/// characters) and a NUL in it, which PostgreSQL text cannot hold, is a 422, not a 500; a
/// refused nack leaves the task reserved.
#[tokio::test]
async fn nack_refuses_a_bad_error_and_keeps_the_reservation() {
    let app = spawn_app().await;
    let token = pull_biz_type(&app, "jobs", Settings::default()).await;
    let id = create(&app, &token, 1).await.remove(0);
    let receipt = reserve(&app, &token, json!({})).await[0]["receipt"].clone();
    let nack = format!("/api/v1/tasks/{id}/nack");
    for (body, mentions) in [
        (json!({"receipt": receipt, "error": "bad\u{0}byte"}), "NUL"),
        (json!({"receipt": receipt, "error": "é".repeat(1001)}), "1000 characters"),
        (json!({"receipt": receipt, "delay_ms": 316_224_000_001_i64}), "delay_ms"),
    ] {
        let reply = app.post(&nack, &token, body).await;
        assert_eq!((reply.status, reply.code()), (422, "invalid_argument"), "{}", reply.body);
        assert!(reply.message().contains(mentions), "{}", reply.message());
    }
    assert_eq!(app.get(&format!("/api/v1/tasks/{id}"), &token).await.body["status"], "running");
    // 1000 two-byte characters are within the documented limit.
    let reply = app.post(&nack, &token, json!({"receipt": receipt, "error": "é".repeat(1000)})).await;
    assert_eq!((reply.status, reply.body["status"].as_str()), (200, Some("pending")), "{}", reply.body);
}

#[tokio::test]
async fn nack_without_a_delay_waits_the_biz_type_s_backoff() {
    let app = spawn_app().await;
    let token = pull_biz_type(&app, "jobs", Settings { backoff_initial_ms: Some(60_000), ..Default::default() }).await;
    let id = create(&app, &token, 1).await.remove(0);
    let receipt = reserve(&app, &token, json!({})).await[0]["receipt"].clone();
    let before = chrono::Utc::now();
    let nacked = app.post(&format!("/api/v1/tasks/{id}/nack"), &token, json!({"receipt": receipt})).await.body;
    assert_eq!(nacked["status"], "pending");
    let run_at: chrono::DateTime<chrono::Utc> = nacked["run_at"].as_str().unwrap().parse().unwrap();
    let wait = run_at - before;
    assert!(wait >= chrono::Duration::seconds(29) && wait <= chrono::Duration::seconds(61), "first backoff, jittered over its upper half: {wait}");
    assert_eq!(nacked["last_error"], "nacked");
}

/// A rate-limited biz type hands out its rate, and a reserve asking for more than is due
/// spends permits only for what it gets.
#[tokio::test]
async fn reserve_keeps_to_the_rate_limit_without_wasting_it() {
    let app = spawn_app().await;
    // 100 per second, in bursts of a tenth of a second's worth: 10.
    let token = pull_biz_type(&app, "jobs", Settings { rate_limit: Some(100.0), ..Default::default() }).await;
    create(&app, &token, 1).await;
    assert_eq!(reserve(&app, &token, json!({"max": 100})).await.len(), 1);
    create(&app, &token, 30).await;
    let got = reserve(&app, &token, json!({"max": 100})).await.len();
    assert!((5..=12).contains(&got), "the rest of the burst, not a burst spent on one task: {got}");
}
