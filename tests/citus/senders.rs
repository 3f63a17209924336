//! What a node sends and serves on a Citus cluster besides the engine's claim: failure
//! notices and chat notices (each sender's claim and record routed per biz type to the
//! worker of its shard), and pull (reserve, ack and nack). A chime node on the
//! coordinator, real receivers.

use std::time::Duration;

use chime::biz_types::{self, Settings};
use chime::callback_hosts::CallbackHosts;
use chime::chat_notices::Pace;
use chime::config::ServeArgs;
use chime::failure_notices::Sender;
use serde_json::json;
use uuid::Uuid;

use crate::cluster::migrated_database;
use crate::helpers::{self, TestApp, wait_until};
use crate::receiver::{Answer, Received, Receiver};

/// Whether a receiver knowing `secret` accepts the request: a `v1` of its
/// `Chime-Signature` is the HMAC of "<t>.<body>" (docs/design/contract.md).
fn verifies_with(request: &Received, secret: &str) -> bool {
    let header = request.header("chime-signature").expect("a Chime-Signature header");
    let t: i64 = header.strip_prefix("t=").unwrap().split(',').next().unwrap().parse().unwrap();
    let expected = chime::engine::signature(secret, t, &request.body);
    let v1 = expected.split(',').nth(1).unwrap();
    header.split(',').any(|part| part == v1)
}

async fn id_of(app: &TestApp, name: &str) -> i32 {
    sqlx::query_scalar("SELECT id FROM biz_types WHERE name = $1").bind(name).fetch_one(&app.pool).await.unwrap()
}

#[tokio::test]
async fn a_task_failed_on_citus_sends_its_signed_failure_notice() {
    let app = helpers::spawn_on(migrated_database().await, ServeArgs::default()).await;
    let callbacks = Receiver::start(vec![], Answer::status(404)).await;
    // The first notice is refused (retried after the backoff), the second taken.
    let failures = Receiver::start(vec![Answer::status(503)], Answer::status(200)).await;
    let settings = Settings {
        callback_url: Some(callbacks.url.clone()),
        failure_url: Some(failures.url.clone()),
        backoff_initial_ms: Some(10),
        ..Default::default()
    };
    let token = helpers::biz_type_with(&app.pool, "orders", &settings).await;
    let task = app.create_task(&token, json!({"biz_type": "orders", "payload": {"n": 1}})).await;
    let id = task["id"].as_str().unwrap();

    let sent = failures.wait_for(2, Duration::from_secs(30)).await;
    let secret = biz_types::by_name(&app.pool, "orders").await.unwrap().unwrap().signing_secret.expose().unwrap().to_string();
    for notice in &sent {
        assert_eq!(notice.header("chime-event"), Some("task.failed"));
        assert_eq!(notice.header("chime-task-id"), Some(id));
        assert!(verifies_with(notice, &secret), "signed with the biz type's secret: {:?}", notice.header("chime-signature"));
        let body = notice.json();
        assert_eq!(body["task"]["id"], task["id"], "{body}");
        assert_eq!(body["task"]["status"], "failed", "{body}");
        assert_eq!(body["last_attempt"]["status_code"], 404, "{body}");
    }
    assert_eq!(sent[0].header("chime-notice-id"), sent[1].header("chime-notice-id"), "one notice, sent again");
    assert_eq!(sent[1].header("chime-attempt"), Some("2"));

    // Recorded on the worker by its sender: delivered at its second send.
    wait_until("the notice recorded delivered", Duration::from_secs(10), || async {
        let row: (String, i32, Option<i16>, bool) =
            sqlx::query_as("SELECT status, attempt_count, last_status_code, held_by IS NULL FROM failure_notices WHERE task_id = $1::uuid")
                .bind(id)
                .fetch_one(&app.pool)
                .await
                .unwrap();
        if row == ("delivered".to_string(), 2, Some(200), true) { Ok(()) } else { Err(format!("{row:?}")) }
    })
    .await;
    assert_eq!(failures.received().len(), 2, "nothing sent after it was delivered");
}

/// Summaries at once, then not again for a minute.
fn quick() -> Pace {
    Pace { gather: Duration::ZERO, window: Duration::from_secs(60), first_retry: Duration::from_millis(100) }
}

#[tokio::test]
async fn a_chat_summary_reaches_its_webhook_on_citus() {
    let app = helpers::spawn_on(migrated_database().await, ServeArgs::default()).await;
    let callbacks = Receiver::start(vec![], Answer::status(404)).await;
    let chat = Receiver::start(vec![], Answer::status(200)).await;
    let settings = Settings {
        callback_url: Some(callbacks.url.clone()),
        chat_platform: Some("slack".into()),
        chat_url: Some(chat.url.clone()),
        ..Default::default()
    };
    let token = helpers::biz_type_with(&app.pool, "payments", &settings).await;
    let biz_type_id = id_of(&app, "payments").await;
    for n in 0..3 {
        app.create_task(&token, json!({"biz_type": "payments", "payload": n})).await;
    }
    wait_until("three tasks failed and their chat rows queued", Duration::from_secs(30), || async {
        let rows: i64 =
            sqlx::query_scalar("SELECT count(*) FROM chat_notices WHERE biz_type_id = $1").bind(biz_type_id).fetch_one(&app.pool).await.unwrap();
        if rows == 3 { Ok(()) } else { Err(format!("{rows} rows")) }
    })
    .await;

    // A sender of the test's (the node's own waits `Pace::default().gather` first).
    let lifecycle = chime::lifecycle::Lifecycle::default();
    let sender = Sender::start(chime::db::Health::new(&app.pool), Uuid::new_v4(), CallbackHosts::Any, lifecycle.signal()).with_chat_pace(quick());
    assert_eq!(sender.chat_turn().await, 1, "the channel claimed and its message sent");
    let sent = chat.received();
    assert_eq!(sent.len(), 1);
    let text = sent[0].json()["text"].as_str().unwrap().to_string();
    assert!(text.starts_with("payments: 3 tasks failed since "), "{text}");

    // Recorded on the worker: the rows told of are gone, the channel let go and summarised.
    let left: i64 =
        sqlx::query_scalar("SELECT count(*) FROM chat_notices WHERE biz_type_id = $1").bind(biz_type_id).fetch_one(&app.pool).await.unwrap();
    assert_eq!(left, 0);
    let channel: (Option<Uuid>, i32, bool) =
        sqlx::query_as("SELECT claim, tries, summarised_at IS NOT NULL FROM chat_channels WHERE biz_type_id = $1")
            .bind(biz_type_id)
            .fetch_one(&app.pool)
            .await
            .unwrap();
    assert_eq!(channel, (None, 0, true));
    // Within the window nothing more is due.
    assert_eq!(sender.chat_turn().await, 0);
}

async fn reserve(app: &TestApp, token: &str, max: i64) -> Vec<serde_json::Value> {
    let reply = app.post("/api/v1/biz-types/jobs/reserve", token, json!({"max": max, "ttr_ms": 60_000})).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    reply.body["tasks"].as_array().unwrap().clone()
}

#[tokio::test]
async fn pull_reserves_acks_nacks_and_touches_on_citus() {
    let app = helpers::spawn_on(migrated_database().await, ServeArgs::default()).await;
    let settings = Settings { mode: Some("pull".into()), failure_url: Some("http://127.0.0.1:9/failed".into()), ..Default::default() };
    let token = helpers::biz_type_with(&app.pool, "jobs", &settings).await;
    let biz_type_id = id_of(&app, "jobs").await;
    let mut ids = Vec::new();
    for n in 0..4 {
        ids.push(app.create_task(&token, json!({"biz_type": "jobs", "payload": n})).await["id"].as_str().unwrap().to_string());
    }
    // One is past its deadline (which the API would not accept at create): the reserve ends
    // it expired, with its failure notice, and hands it to nobody.
    sqlx::query("UPDATE tasks SET expires_at = now() - interval '1 second' WHERE biz_type_id = $1 AND id = $2::uuid")
        .bind(biz_type_id)
        .bind(&ids[3])
        .execute(&app.pool)
        .await
        .unwrap();

    let first = reserve(&app, &token, 10).await;
    let mut got: Vec<&str> = first.iter().map(|t| t["id"].as_str().unwrap()).collect();
    got.sort();
    let mut due: Vec<&str> = ids[..3].iter().map(String::as_str).collect();
    due.sort();
    assert_eq!(got, due, "the three due tasks within their deadline");
    let receipts: std::collections::BTreeSet<&str> = first.iter().map(|t| t["receipt"].as_str().unwrap()).collect();
    assert_eq!(receipts.len(), 3, "a receipt each: {first:?}");
    let expired: (String, String) = sqlx::query_as(
        "SELECT t.status, n.event FROM tasks t JOIN failure_notices n ON n.task_id = t.id AND n.biz_type_id = t.biz_type_id
          WHERE t.biz_type_id = $1 AND t.id = $2::uuid",
    )
    .bind(biz_type_id)
    .bind(&ids[3])
    .fetch_one(&app.pool)
    .await
    .unwrap();
    assert_eq!(expired, ("expired".to_string(), "task.expired".to_string()));
    assert!(reserve(&app, &token, 10).await.is_empty(), "nothing left due");

    // Ack one, nack one (due again at once), and a receipt that no longer holds its task.
    let acked = app.post(&format!("/api/v1/tasks/{}/ack", first[0]["id"].as_str().unwrap()), &token, json!({"receipt": first[0]["receipt"]})).await;
    assert_eq!(acked.status, 200, "{}", acked.body);
    assert_eq!(acked.body["status"], "succeeded");
    let nack = json!({"receipt": first[1]["receipt"], "delay_ms": 0, "error": "busy"});
    let nacked = app.post(&format!("/api/v1/tasks/{}/nack", first[1]["id"].as_str().unwrap()), &token, nack).await;
    assert_eq!(nacked.status, 200, "{}", nacked.body);
    assert_eq!(nacked.body["status"], "pending");
    let stale = app.post(&format!("/api/v1/tasks/{}/ack", first[0]["id"].as_str().unwrap()), &token, json!({"receipt": first[0]["receipt"]})).await;
    assert_eq!(stale.status, 409, "{}", stale.body);

    // The nacked task comes back under a new receipt, its second attempt.
    let again = reserve(&app, &token, 10).await;
    assert_eq!(again.len(), 1, "{again:?}");
    assert_eq!(again[0]["id"], first[1]["id"]);
    assert_ne!(again[0]["receipt"], first[1]["receipt"]);
    assert_eq!(again[0]["attempt_count"], 2, "{}", again[0]);
    // Touched: held ten minutes from now rather than one.
    let touch = json!({"receipt": again[0]["receipt"], "ttr_ms": 600_000});
    let touched = app.post(&format!("/api/v1/tasks/{}/touch", again[0]["id"].as_str().unwrap()), &token, touch).await;
    assert_eq!(touched.status, 200, "{}", touched.body);
    let until: chrono::DateTime<chrono::Utc> = touched.body["reserved_until"].as_str().unwrap().parse().unwrap();
    assert!(until > chrono::Utc::now() + chrono::Duration::seconds(500), "{until}");
    let attempts: Vec<(String, Option<String>)> =
        sqlx::query_as("SELECT task_id::text, error FROM attempts WHERE biz_type_id = $1 ORDER BY started_at")
            .bind(biz_type_id)
            .fetch_all(&app.pool)
            .await
            .unwrap();
    assert_eq!(attempts.len(), 2, "the ack and the nack recorded: {attempts:?}");
    assert!(
        attempts.iter().any(|(task, error)| *task == first[1]["id"].as_str().unwrap() && error.as_deref() == Some("nacked: busy")),
        "{attempts:?}"
    );
}

/// A cap of 2 per key (`flow_max_in_flight`) on Citus, a receiver that holds each request
/// 300 ms, a biz type that takes 10 at once: a herd of 30 tasks of key `hot`, due first,
/// fills a claim's first look (its first 10 due tasks) whole; five tasks of other keys are
/// due just after it. The receiver never has more than 2 of `hot` at once, the other keys
/// are found past the herd (the walk of the keys) and delivered at once, and every task is
/// delivered.
#[tokio::test]
async fn a_flow_keyed_biz_type_delivers_within_its_per_key_limit_on_citus() {
    const CAP: usize = 2;
    const HOLD: Duration = Duration::from_millis(300);
    let app = helpers::spawn_on(migrated_database().await, ServeArgs::default()).await;
    let receiver = Receiver::start(vec![], Answer { delay: HOLD, ..Answer::status(200) }).await;
    let settings =
        Settings { callback_url: Some(receiver.url.clone()), max_in_flight: Some(10), flow_max_in_flight: Some(CAP as i32), ..Default::default() };
    let token = helpers::biz_type_with(&app.pool, "orders", &settings).await;
    let due = chrono::Utc::now() + chrono::Duration::seconds(1);
    let later = due + chrono::Duration::milliseconds(50);
    let mut tasks: Vec<serde_json::Value> =
        (0..30).map(|i| json!({"biz_type": "orders", "run_at": due.to_rfc3339(), "flow_key": "hot", "payload": {"key": "hot", "i": i}})).collect();
    tasks.extend(
        (0..5).map(|i| json!({"biz_type": "orders", "run_at": later.to_rfc3339(), "flow_key": format!("k{i}"), "payload": {"key": format!("k{i}")}})),
    );
    let created = app.post("/api/v1/tasks/batch", &token, json!({"tasks": tasks})).await;
    assert_eq!(created.status, 200, "{}", created.body);

    let received = receiver.wait_for(35, Duration::from_secs(60)).await;
    let first = received.iter().map(|r| r.at).min().unwrap();
    let others: Vec<Duration> = received.iter().filter(|r| r.json()["payload"]["key"] != "hot").map(|r| r.at - first).collect();
    // Arrivals of one key closer together than a request's hold overlapped at the receiver.
    let mut by_key: std::collections::HashMap<String, Vec<std::time::Instant>> = std::collections::HashMap::new();
    for r in &received {
        by_key.entry(r.json()["payload"]["key"].as_str().unwrap().to_string()).or_default().push(r.at);
    }
    let mut peak = 0;
    for ats in by_key.values_mut() {
        ats.sort();
        for (i, at) in ats.iter().enumerate() {
            peak = peak.max(ats[..i].iter().filter(|earlier| *at - **earlier < HOLD - Duration::from_millis(30)).count() + 1);
        }
    }
    println!("the other keys arrived {others:?} after the first callback; peak per key {peak}");
    assert!(peak <= CAP, "{peak} callbacks of one key at once, over its cap of {CAP}");
    assert_eq!(peak, CAP, "the key's cap is used whole");
    assert_eq!(others.len(), 5, "{others:?}");
    assert!(others.iter().all(|d| *d < Duration::from_secs(3)), "the other keys waited behind the herd: {others:?}");
    wait_until("every task succeeded", Duration::from_secs(10), || async {
        let left: i64 = sqlx::query_scalar("SELECT count(*) FROM tasks WHERE status <> 'succeeded'").fetch_one(&app.pool).await.unwrap();
        if left == 0 { Ok(()) } else { Err(format!("{left} not succeeded")) }
    })
    .await;
    assert_eq!(receiver.received().len(), 35, "each delivered once");
}

/// Ordered on Citus: key `a`'s tasks reach the receiver one at a time in run_at order, the
/// first failing once (500) and holding the key through its retry (the key's head, found
/// by the claim's own probes rather than `chime_flow_head`); key `b` is not held back.
#[tokio::test]
async fn an_ordered_key_is_delivered_one_at_a_time_in_order_on_citus() {
    const HOLD: Duration = Duration::from_millis(100);
    let app = helpers::spawn_on(migrated_database().await, ServeArgs::default()).await;
    let receiver = Receiver::start(vec![Answer { delay: HOLD, ..Answer::status(500) }], Answer { delay: HOLD, ..Answer::status(200) }).await;
    let settings = Settings {
        callback_url: Some(receiver.url.clone()),
        ordered: Some(true),
        backoff_initial_ms: Some(200),
        backoff_max_ms: Some(200),
        ..Default::default()
    };
    let token = helpers::biz_type_with(&app.pool, "orders", &settings).await;
    let due = chrono::Utc::now() + chrono::Duration::seconds(1);
    let at = |ms: i64| (due + chrono::Duration::milliseconds(ms)).to_rfc3339();
    let mut tasks: Vec<serde_json::Value> =
        (0..3).map(|i| json!({"biz_type": "orders", "run_at": at(i * 10), "flow_key": "a", "payload": {"key": "a", "i": i}})).collect();
    // Key b's task due 50 ms after a's first, so that a's reaches the receiver first and
    // takes its one 500 (due together, b's could, under load).
    tasks.push(json!({"biz_type": "orders", "run_at": at(50), "flow_key": "b", "payload": {"key": "b", "i": 0}}));
    let created = app.post("/api/v1/tasks/batch", &token, json!({"tasks": tasks})).await;
    assert_eq!(created.status, 200, "{}", created.body);

    let received = receiver.wait_for(5, Duration::from_secs(30)).await;
    let a: Vec<&Received> = received.iter().filter(|r| r.json()["payload"]["key"] == "a").collect();
    let order: Vec<i64> = a.iter().map(|r| r.json()["payload"]["i"].as_i64().unwrap()).collect();
    assert_eq!(order, [0, 0, 1, 2], "in run_at order, the first again after its retry");
    for pair in a.windows(2) {
        assert!(pair[1].at - pair[0].at >= HOLD - Duration::from_millis(20), "one at a time: {:?}", pair[1].at - pair[0].at);
    }
    let b = received.iter().find(|r| r.json()["payload"]["key"] == "b").expect("key b delivered");
    assert!(b.at < a[1].at, "key b did not wait for key a's retry");
    wait_until("every task succeeded", Duration::from_secs(10), || async {
        let left: i64 = sqlx::query_scalar("SELECT count(*) FROM tasks WHERE status <> 'succeeded'").fetch_one(&app.pool).await.unwrap();
        if left == 0 { Ok(()) } else { Err(format!("{left} not succeeded")) }
    })
    .await;
}
