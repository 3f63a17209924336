//! Snooze (docs/design/contract.md, Tasks by key) and trace context on callbacks (docs/design/contract.md, Notices and signatures): a receiver answering 2xx
//! with `Chime-Snooze: <seconds>` is called again that much later, without the attempt
//! counting toward max_attempts; a bad value is a protocol error retried like a failure.

use std::time::Duration;

use chime::biz_types::{self, Settings};
use chime::callback_hosts::CallbackHosts;
use chrono::{DateTime, Utc};
use serde_json::{Value, json};

use crate::delivery::wait_for_status;
use crate::helpers::{TestApp, engine, spawn_app, spawn_app_without_leader};
use crate::receiver::{Answer, Receiver};

async fn biz_type(app: &TestApp, name: &str, receiver: &Receiver, settings: Settings) -> String {
    let settings = Settings { callback_url: Some(receiver.url.clone()), ..settings };
    biz_types::create(&app.pool, name, &settings, CallbackHosts::Any).await.unwrap();
    biz_types::create_token(&app.pool, name).await.unwrap()
}

fn time(v: &Value) -> DateTime<Utc> {
    v.as_str().unwrap_or_else(|| panic!("not a time: {v}")).parse().unwrap()
}

/// With one attempt allowed, a task snoozed twice is still delivered on the third call:
/// snoozes do not count. Each comes back after its snooze; the snoozed attempts are
/// recorded with their time and keep the number the next call uses again.
#[tokio::test]
async fn a_snoozed_task_comes_back_later_without_counting() {
    let app = spawn_app().await;
    let receiver = Receiver::start(vec![Answer::snooze("1"), Answer::snooze("1")], Answer::status(200)).await;
    let token = biz_type(&app, "refunds", &receiver, Settings { max_attempts: Some(1), ..Default::default() }).await;
    let task = app.create_task(&token, json!({"biz_type": "refunds"})).await;
    let id = task["id"].as_str().unwrap();

    let mut engine = engine(&app);
    assert_eq!(engine.turn().await.claimed, 1);
    engine.settled().await;
    let snoozed = app.get(&format!("/api/v1/tasks/{id}"), &token).await.body;
    assert_eq!((&snoozed["status"], &snoozed["attempt_count"], &snoozed["last_error"]), (&json!("pending"), &json!(0), &Value::Null), "{snoozed}");
    let until = time(&snoozed["attempts"][0]["snoozed_until"]);
    let started = time(&snoozed["attempts"][0]["started_at"]);
    let ahead = (until - started).num_milliseconds();
    assert!((900..=3000).contains(&ahead), "snoozed until {ahead} ms after the call");
    assert_eq!(time(&snoozed["run_at"]), until, "due when the snooze ends");

    let running = engine.spawn();
    let done = wait_for_status(&app, &token, id, "succeeded").await;
    running.stop().await;
    let received = receiver.received();
    assert_eq!(received.len(), 3);
    for pair in received.windows(2) {
        assert!(pair[1].at - pair[0].at >= Duration::from_millis(900), "called again before the snooze ended");
    }
    let numbers: Vec<&str> = received.iter().map(|r| r.header("chime-attempt").unwrap()).collect();
    assert_eq!(numbers, ["1", "1", "1"], "a snoozed attempt's number is used again");
    assert_eq!(done["attempt_count"], 1);
    let attempts = done["attempts"].as_array().unwrap();
    let snoozes: Vec<bool> = attempts.iter().map(|a| a["snoozed_until"].is_string()).collect();
    assert_eq!(snoozes, [true, true, false]);
}

/// A snooze longer than the hot horizon (2 days by default) moves the task to cold storage,
/// due when the snooze ends, rather than waiting at the horizon's edge and firing early.
#[tokio::test]
async fn a_snooze_past_the_hot_horizon_waits_in_cold_storage() {
    let app = spawn_app().await;
    let receiver = Receiver::start(vec![], Answer::snooze(&(3 * 86_400).to_string())).await;
    let token = biz_type(&app, "refunds", &receiver, Settings::default()).await;
    let task = app.create_task(&token, json!({"biz_type": "refunds"})).await;
    let id = task["id"].as_str().unwrap();
    let mut engine = engine(&app);
    assert_eq!(engine.turn().await.claimed, 1);
    engine.settled().await;

    let task = app.get(&format!("/api/v1/tasks/{id}"), &token).await.body;
    assert_eq!((&task["status"], &task["attempt_count"]), (&json!("pending"), &json!(0)), "{task}");
    let ahead = time(&task["run_at"]) - Utc::now();
    assert!(ahead > chrono::TimeDelta::hours(71) && ahead <= chrono::TimeDelta::hours(72), "due in {ahead}");
    assert_eq!(time(&task["run_at"]), time(&task["attempts"][0]["snoozed_until"]));
    assert_eq!(app.table_of(id).await, "tasks_cold");
    chime::leader::move_cold(&app.pool, 100).await;
    assert_eq!(app.table_of(id).await, "tasks_cold", "not moved before the horizon reaches it");
    assert_eq!(engine.turn().await.claimed, 0);
    assert_eq!(receiver.received().len(), 1);
}

/// A snooze ending at or after the task's deadline ends it expired at once: no callback
/// would start again.
#[tokio::test]
async fn a_snooze_reaching_the_deadline_ends_the_task_expired() {
    let app = spawn_app().await;
    let receiver = Receiver::start(vec![], Answer::snooze("120")).await;
    let token = biz_type(&app, "refund-deadline", &receiver, Settings::default()).await;
    let task = app.create_task(&token, json!({"biz_type": "refund-deadline", "ttl_ms": 60_000})).await;
    let id = task["id"].as_str().unwrap();
    let mut engine = engine(&app);
    assert_eq!(engine.turn().await.claimed, 1);
    engine.settled().await;
    let task = app.get(&format!("/api/v1/tasks/{id}"), &token).await.body;
    assert_eq!(task["status"], "expired", "{task}");
    let error = task["last_error"].as_str().unwrap();
    assert!(error.contains("snoozed it until") && error.contains("at or after its deadline"), "{error}");
    assert!(task["attempts"][0]["snoozed_until"].is_string());

    // Inside the deadline, the same snooze is kept.
    let kept = app.create_task(&token, json!({"biz_type": "refund-deadline", "ttl_ms": 600_000})).await;
    let kept_id = kept["id"].as_str().unwrap();
    assert_eq!(engine.turn().await.claimed, 1);
    engine.settled().await;
    let kept = app.get(&format!("/api/v1/tasks/{kept_id}"), &token).await.body;
    assert_eq!(kept["status"], "pending", "{kept}");

    // The console shows the deadline, each attempt's snooze, and the expired count.
    let console = crate::console::sign_in(&app, "admin", crate::console::ADMIN_PASSWORD).await;
    let page = console.get(&format!("/console/tasks/{kept_id}")).await.body;
    let deadline = time(&kept["expires_at"]).format("%Y-%m-%d %H:%M:%S%.3f UTC").to_string();
    assert!(page.contains(&format!("<dd id=\"deadline\">{deadline}")), "the deadline {deadline} is shown: {page}");
    let until = time(&kept["attempts"][0]["snoozed_until"]).format("%Y-%m-%d %H:%M:%S UTC").to_string();
    assert!(page.contains(&format!("snoozed until {until}")), "the snooze {until} is shown");
    let dashboard = console.get("/console").await.body;
    assert!(dashboard.contains("status=expired\">1</a>"), "one expired task on the dashboard: {dashboard}");

    // The process's counters (a biz type name no other test uses: they are per process).
    let metrics = app.client.get(format!("{}/metrics", app.address)).send().await.unwrap().text().await.unwrap();
    for line in ["chime_tasks_expired_total{biz_type=\"refund-deadline\"} 1", "chime_attempts_snoozed_total{biz_type=\"refund-deadline\"} 1"] {
        assert!(metrics.lines().any(|l| l == line), "{line} in {metrics}");
    }
}

/// A `Chime-Snooze` that is not whole seconds from 1 to 31536000 is the receiver's protocol
/// error: the attempt is recorded with an error naming the header and the value, retried
/// with backoff and counted, so the task still ends (failed) after max_attempts.
#[tokio::test]
async fn bad_snooze_values_are_protocol_errors_retried_until_the_attempts_end() {
    let app = spawn_app().await;
    let mut running = Vec::new();
    let mut cases = Vec::new();
    for (i, bad) in ["0", "-1", "1.5", "soon", "31536001", ""].into_iter().enumerate() {
        let receiver = Receiver::start(vec![], Answer::snooze(bad)).await;
        let settings = Settings { max_attempts: Some(2), backoff_initial_ms: Some(300), backoff_max_ms: Some(300), ..Default::default() };
        let token = biz_type(&app, &format!("bad-{i}"), &receiver, settings).await;
        let task = app.create_task(&token, json!({"biz_type": format!("bad-{i}")})).await;
        cases.push((bad, receiver, token, task["id"].as_str().unwrap().to_string()));
    }
    running.push(engine(&app).spawn());
    for (bad, receiver, token, id) in &cases {
        let task = wait_for_status(&app, token, id, "failed").await;
        let attempts = task["attempts"].as_array().unwrap();
        assert_eq!(attempts.len(), 2, "{bad:?}: {task}");
        for a in attempts {
            let error = a["error"].as_str().unwrap();
            assert!(error.contains("protocol error") && error.contains(&format!("Chime-Snooze {bad:?}")), "{bad:?}: {error}");
            assert_eq!((&a["status_code"], &a["snoozed_until"]), (&json!(200), &Value::Null));
        }
        let received = receiver.received();
        assert_eq!(received.len(), 2, "{bad:?}");
        assert!(received[1].at - received[0].at >= Duration::from_millis(140), "{bad:?}: retried with backoff");
    }
    for engine in running {
        engine.stop().await;
    }
}

/// Every callback of a task created with a `traceparent` carries one of the same trace
/// (version, trace id, flags) with a span id of its own; a task created without one sends
/// none.
#[tokio::test]
async fn callbacks_carry_the_creates_trace_with_a_new_span_each() {
    let app = spawn_app().await;
    let receiver = Receiver::start(vec![Answer::status(500)], Answer::status(200)).await;
    let settings = Settings { backoff_initial_ms: Some(100), backoff_max_ms: Some(100), ..Default::default() };
    let token = biz_type(&app, "orders", &receiver, settings).await;
    let parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let created = app
        .client
        .post(format!("{}/api/v1/tasks", app.address))
        .bearer_auth(&token)
        .header("traceparent", parent)
        .json(&json!({"biz_type": "orders"}))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 201);
    let id = created.json::<Value>().await.unwrap()["id"].as_str().unwrap().to_string();
    let running = engine(&app).spawn();
    wait_for_status(&app, &token, &id, "succeeded").await;

    let plain = app.create_task(&token, json!({"biz_type": "orders"})).await;
    wait_for_status(&app, &token, plain["id"].as_str().unwrap(), "succeeded").await;
    running.stop().await;

    let received = receiver.received();
    let traced: Vec<&str> =
        received.iter().filter(|r| r.header("chime-task-id") == Some(id.as_str())).map(|r| r.header("traceparent").unwrap()).collect();
    assert_eq!(traced.len(), 2, "a failed attempt and its retry");
    let spans: Vec<&str> = traced
        .iter()
        .map(|tp| {
            let fields: Vec<&str> = tp.split('-').collect();
            assert_eq!((fields.len(), fields[0], fields[1], fields[3]), (4, "00", "4bf92f3577b34da6a3ce929d0e0e4736", "01"), "{tp}");
            assert!(fields[2].len() == 16 && fields[2].bytes().all(|b| b.is_ascii_hexdigit()) && fields[2] != "0000000000000000", "{tp}");
            assert_ne!(fields[2], "00f067aa0ba902b7", "a new span, not the create's");
            fields[2]
        })
        .collect();
    assert_ne!(spans[0], spans[1], "each attempt has a span of its own");
    let untraced = received.iter().find(|r| r.header("chime-task-id") == plain["id"].as_str()).unwrap();
    assert_eq!(untraced.header("traceparent"), None);
}

/// A retry the receiver asks for past the hot horizon (`Retry-After`) waits in cold storage
/// at the time asked, rather than at the horizon's edge, and is called back when that time
/// comes. The horizon is pulled in to a second from now so that a 2 s `Retry-After` is past it.
#[tokio::test]
async fn a_retry_after_past_the_hot_horizon_waits_in_cold_storage_until_its_time() {
    // No leader: its first duties put the horizon back where it belongs, and under load they
    // can come after the test pulls it in.
    let (app, _leader_lock) = spawn_app_without_leader().await;
    let busy = Answer { retry_after: Some(2), ..Answer::status(503) };
    let receiver = Receiver::start(vec![busy], Answer::status(200)).await;
    let token = biz_type(&app, "refunds", &receiver, Settings::default()).await;
    let task = app.create_task(&token, json!({"biz_type": "refunds"})).await;
    let id = task["id"].as_str().unwrap();
    let horizon: DateTime<Utc> =
        sqlx::query_scalar("UPDATE hot_horizon h SET until = now() + interval '1 second' FROM hot_horizon old RETURNING old.until")
            .fetch_one(&app.pool)
            .await
            .unwrap();
    let mut engine = engine(&app);
    assert_eq!(engine.turn().await.claimed, 1);
    engine.settled().await;

    let retrying = app.get(&format!("/api/v1/tasks/{id}"), &token).await.body;
    let asked = time(&retrying["attempts"][0]["started_at"]) + chrono::TimeDelta::seconds(2);
    let run_at = time(&retrying["run_at"]);
    assert!((run_at - asked).num_milliseconds().abs() < 1_000, "due at {run_at}, Retry-After asked for about {asked}: {retrying}");
    assert_eq!((&retrying["status"], &retrying["attempt_count"]), (&json!("pending"), &json!(1)), "{retrying}");
    assert_eq!(app.table_of(id).await, "tasks_cold");

    // The horizon moves on (as the leader moves it); the migrator brings the task back and
    // it is called back when its time comes, not before.
    sqlx::query("UPDATE hot_horizon SET until = $1").bind(horizon).execute(&app.pool).await.unwrap();
    chime::leader::move_cold(&app.pool, 100).await;
    let running = engine.spawn();
    let done = wait_for_status(&app, &token, id, "succeeded").await;
    running.stop().await;
    let received = receiver.received();
    assert_eq!(received.len(), 2);
    assert!(received[1].at - received[0].at >= Duration::from_millis(1_900), "called back {:?} after the first", received[1].at - received[0].at);
    assert_eq!(done["attempt_count"], 2, "the retry counted");
}

/// A pull consumer's nack with a delay past the hot horizon (5 days, the horizon is 2) keeps
/// the delay: the task waits in cold storage, due 5 days from now, counted as an attempt,
/// and is not reservable before.
#[tokio::test]
async fn a_nack_delay_past_the_hot_horizon_is_kept() {
    let app = spawn_app().await;
    let settings = Settings { mode: Some("pull".into()), ..Default::default() };
    biz_types::create(&app.pool, "jobs", &settings, CallbackHosts::Any).await.unwrap();
    let token = biz_types::create_token(&app.pool, "jobs").await.unwrap();
    let task = app.create_task(&token, json!({"biz_type": "jobs"})).await;
    let id = task["id"].as_str().unwrap();
    let reserved = app.post("/api/v1/biz-types/jobs/reserve", &token, json!({"max": 1})).await;
    let receipt = &reserved.body["tasks"][0]["receipt"];
    let five_days = chrono::TimeDelta::days(5);
    let asked = Utc::now() + five_days;
    let nacked = app.post(&format!("/api/v1/tasks/{id}/nack"), &token, json!({"receipt": receipt, "delay_ms": five_days.num_milliseconds()})).await;
    assert_eq!(nacked.status, 200, "{}", nacked.body);
    let task = app.get(&format!("/api/v1/tasks/{id}"), &token).await.body;
    let run_at = time(&task["run_at"]);
    assert!((run_at - asked).num_seconds().abs() < 5, "due at {run_at}, nacked until about {asked}: {task}");
    assert_eq!((&task["status"], &task["attempt_count"]), (&json!("pending"), &json!(1)), "{task}");
    assert_eq!(app.table_of(id).await, "tasks_cold");
    let again = app.post("/api/v1/biz-types/jobs/reserve", &token, json!({"max": 1})).await;
    assert_eq!(again.body["tasks"], json!([]), "not reservable before its time");
}
