//! The delivery engine against a real receiver.

use std::time::Duration;

use chime::biz_types::{self, Settings};
use chime::callback_hosts::CallbackHosts;
use serde_json::{Value, json};

use crate::helpers::{TestApp, chime_process_logging, engine, fresh_database, spawn_app, spawn_node, wait_until};
use crate::receiver::{Answer, Receiver};

/// Creates a delivering biz type pointed at the receiver; returns its token.
async fn biz_type(app: &TestApp, name: &str, receiver: &Receiver, settings: Settings) -> String {
    let settings = Settings { callback_url: Some(receiver.url.clone()), ..settings };
    biz_types::create(&app.pool, name, &settings, CallbackHosts::Any).await.unwrap();
    biz_types::create_token(&app.pool, name).await.unwrap()
}

/// Polls the task until it reaches `status` (at most 20 s); returns it with its attempts.
pub async fn wait_for_status(app: &TestApp, token: &str, id: &str, status: &str) -> Value {
    wait_until(&format!("task {id} {status}"), Duration::from_secs(20), || async {
        let task = app.get(&format!("/api/v1/tasks/{id}"), token).await.body;
        if task["status"] == status { Ok(task) } else { Err(task) }
    })
    .await
}

fn fast_retries() -> Settings {
    Settings { backoff_initial_ms: Some(200), backoff_max_ms: Some(1000), ..Default::default() }
}

/// A due task is POSTed once with the body and headers of docs/design/contract.md
/// (Callbacks), the signature verifies with the biz type's secret, and the attempt is
/// recorded.
#[tokio::test]
async fn due_task_is_delivered_signed_and_recorded() {
    let app = spawn_node().await;
    let receiver = Receiver::start(vec![], Answer::status(200)).await;
    let token = biz_type(&app, "orders", &receiver, Settings::default()).await;
    let body = r#"{"biz_type": "orders", "key": "o-1", "payload": {"order": 1, "big": 12345678901234567890123}}"#;
    let task = app.request("POST", "/api/v1/tasks", Some(&token), Some(body.as_bytes().to_vec())).await.body;
    let id = task["id"].as_str().unwrap();

    let done = wait_for_status(&app, &token, id, "succeeded").await;
    let received = receiver.received();
    assert_eq!(received.len(), 1, "delivered exactly once");
    let request = &received[0];
    let body = request.json();
    assert_eq!(body["task_id"], task["id"]);
    assert_eq!(body["biz_type"], "orders");
    assert_eq!(body["key"], "o-1");
    assert_eq!(
        body["run_at"].as_str().unwrap().parse::<chrono::DateTime<chrono::Utc>>().unwrap(),
        task["run_at"].as_str().unwrap().parse::<chrono::DateTime<chrono::Utc>>().unwrap()
    );
    assert!(body["fired_at"].is_string());
    assert_eq!(body["attempt"], 1);
    assert_eq!(body["timer_id"], Value::Null);
    assert_eq!(body["payload"]["big"].to_string(), "12345678901234567890123", "payload passed through exactly");
    assert_eq!(request.header("content-type"), Some("application/json"));
    assert_eq!(request.header("chime-task-id"), Some(id));
    assert_eq!(request.header("chime-attempt"), Some("1"));

    let secret: String = sqlx::query_scalar("SELECT signing_secret FROM biz_types").fetch_one(&app.pool).await.unwrap();
    let signature = request.header("chime-signature").unwrap();
    let t: i64 = signature.strip_prefix("t=").unwrap().split(',').next().unwrap().parse().unwrap();
    assert_eq!(signature, chime::engine::signature(&secret, t, &request.body), "HMAC of \"<t>.<body>\"");
    assert!((t - chrono::Utc::now().timestamp()).abs() < 60);

    assert_eq!(done["attempt_count"], 1);
    assert!(done["finished_at"].is_string());
    let attempts = done["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 1);
    assert_eq!(attempts[0]["status_code"], 200);
    assert_eq!(attempts[0]["response_excerpt"], "answer 200");
}

/// A `chime serve` process logging JSON, its receiver answering 500 to a burst of 300 tasks
/// of one attempt each: every line of its log is a JSON object; the first failures are WARN
/// lines with the task, biz type, attempt and status, the rest are counted into a line per
/// interval (10 s), so the log holds a handful of lines for 300 failures, not 300.
#[tokio::test]
async fn failed_attempts_are_logged_and_a_burst_is_counted() {
    let db_url = fresh_database().await;
    let log_path = std::env::temp_dir().join(format!("chime-failures-log-{}-{}.txt", std::process::id(), uuid::Uuid::new_v4()));
    let log = std::fs::File::create(&log_path).unwrap();
    let (mut child, address) = chime_process_logging(&db_url, &[("CHIME_LOG_FORMAT", "json")], log).await;
    let pool = chime::db::connect(&db_url, 2).await.unwrap();
    let node = TestApp { address, pool, db_url, client: crate::helpers::client() };
    let receiver = Receiver::start(vec![], Answer::status(500)).await;
    // No breaker: every one of the 300 callbacks is sent and fails (with one, the first ten
    // would open it and the rest wait).
    let token = biz_type(&node, "orders", &receiver, Settings { max_attempts: Some(1), breaker_threshold: Some(0), ..Default::default() }).await;
    let tasks: Vec<Value> = (0..300).map(|_| json!({"biz_type": "orders"})).collect();
    let created = node.post("/api/v1/tasks/batch", &token, json!({ "tasks": tasks })).await;
    assert_eq!(created.status, 200, "{}", created.body);

    // Wait until the failures of the interval are counted in the log (at most 30 s).
    let lines = wait_until("300 failures counted in the log", Duration::from_secs(30), || async {
        let log = std::fs::read_to_string(&log_path).unwrap();
        let lines: Vec<Value> = log.lines().map(|line| serde_json::from_str::<Value>(line).unwrap_or_else(|e| panic!("{e}: {line}"))).collect();
        let failures = lines.iter().filter(|l| l["message"].as_str().is_some_and(|m| m.contains("delivery attempt")));
        let counted: u64 = failures.map(|l| l["failed"].as_u64().unwrap_or(1)).sum();
        if counted >= 300 { Ok(lines) } else { Err(format!("{counted} counted")) }
    })
    .await;
    child.kill().await.unwrap();
    std::fs::remove_file(&log_path).unwrap();
    let failures: Vec<&Value> = lines.iter().filter(|l| l["message"].as_str().is_some_and(|m| m.contains("delivery attempt"))).collect();
    let one = failures.iter().find(|l| l["task_id"].is_string()).unwrap_or_else(|| panic!("no failed attempt logged: {lines:#?}"));
    assert_eq!(
        (&one["level"], &one["biz_type"], &one["attempt"], &one["status"], &one["error"]),
        (&json!("WARN"), &json!("orders"), &json!(1), &json!(500), &json!("HTTP 500")),
        "{one}"
    );
    let summary = failures.iter().find(|l| l["failed"].is_u64()).unwrap_or_else(|| panic!("no count of failures: {failures:#?}"));
    assert_eq!((&summary["level"], &summary["biz_type"], &summary["example"]), (&json!("WARN"), &json!("orders"), &json!("HTTP 500")), "{summary}");
    let counted: u64 = failures.iter().map(|l| l["failed"].as_u64().unwrap_or(1)).sum();
    assert_eq!(counted, 300, "{failures:#?}");
    assert!(failures.len() <= 12, "{} lines for 300 failures: {failures:#?}", failures.len());
}

/// 5xx answers are retried with exponential backoff until a 2xx; each attempt is kept.
#[tokio::test]
async fn failures_are_retried_with_backoff_until_delivered() {
    let app = spawn_node().await;
    let receiver = Receiver::start(vec![Answer::status(500), Answer::status(503)], Answer::status(204)).await;
    let token = biz_type(&app, "orders", &receiver, fast_retries()).await;
    let id = app.create_task(&token, json!({"biz_type": "orders"})).await["id"].as_str().unwrap().to_string();

    let done = wait_for_status(&app, &token, &id, "succeeded").await;
    let received = receiver.received();
    assert_eq!(received.len(), 3);
    // Backoff 200 ms then 400 ms, each jittered into its upper half.
    let gaps: Vec<Duration> = received.windows(2).map(|w| w[1].at - w[0].at).collect();
    assert!(gaps[0] >= Duration::from_millis(100), "{gaps:?}");
    assert!(gaps[1] >= Duration::from_millis(200), "{gaps:?}");
    let attempts: Vec<(Value, Value)> =
        done["attempts"].as_array().unwrap().iter().map(|a| (a["number"].clone(), a["status_code"].clone())).collect();
    assert_eq!(attempts, [(json!(1), json!(500)), (json!(2), json!(503)), (json!(3), json!(204))]);
    let headers: Vec<&str> = received.iter().map(|r| r.header("chime-attempt").unwrap()).collect();
    assert_eq!(headers, ["1", "2", "3"]);
}

/// A Retry-After on a 429 is honoured over the (much shorter) backoff.
#[tokio::test]
async fn retry_after_is_honoured() {
    let app = spawn_node().await;
    let receiver = Receiver::start(vec![Answer { retry_after: Some(2), ..Answer::status(429) }], Answer::status(200)).await;
    let token = biz_type(&app, "orders", &receiver, Settings { backoff_initial_ms: Some(10), ..Default::default() }).await;
    let id = app.create_task(&token, json!({"biz_type": "orders"})).await["id"].as_str().unwrap().to_string();
    wait_for_status(&app, &token, &id, "succeeded").await;
    let received = receiver.received();
    assert_eq!(received.len(), 2);
    assert!(received[1].at - received[0].at >= Duration::from_millis(1900), "{:?}", received[1].at - received[0].at);
}

/// A 4xx other than 408/429 fails the task at once.
#[tokio::test]
async fn a_permanent_4xx_fails_at_once() {
    let app = spawn_app().await;
    let mut engine = engine(&app);
    let receiver = Receiver::start(vec![], Answer::status(404)).await;
    let token = biz_type(&app, "orders", &receiver, fast_retries()).await;
    let id = app.create_task(&token, json!({"biz_type": "orders"})).await["id"].as_str().unwrap().to_string();
    assert_eq!(engine.turn().await.claimed, 1);
    engine.settled().await;
    let done = wait_for_status(&app, &token, &id, "failed").await;
    assert_eq!(done["last_error"], "HTTP 404");
    // Nothing is left to retry (no task pending or running), and no callback is in flight.
    let open: i64 = sqlx::query_scalar("SELECT count(*) FROM tasks WHERE status IN ('pending', 'running')").fetch_one(&app.pool).await.unwrap();
    assert_eq!(open, 0);
    assert_eq!(engine.turn().await.claimed, 0);
    engine.settled().await;
    assert_eq!(receiver.received().len(), 1, "not retried");
}

/// A 301, 302 or 303 is not followed: following it would turn the POST into a bodiless GET,
/// and the task would count as delivered without its payload. Each attempt fails naming the
/// `Location`, is retried (the operator may fix the URL meanwhile), and the redirect's target
/// receives nothing at all.
#[tokio::test]
async fn redirects_that_would_change_the_method_are_not_followed() {
    let app = spawn_node().await;
    let target = Receiver::start(vec![], Answer::status(200)).await;
    for code in [301, 302, 303] {
        let redirector = Receiver::start(vec![], Answer::redirect(code, &target.url)).await;
        let name = format!("moved-{code}");
        let token = biz_type(&app, &name, &redirector, Settings { max_attempts: Some(2), ..fast_retries() }).await;
        let id = app.create_task(&token, json!({"biz_type": name})).await["id"].as_str().unwrap().to_string();

        let failed = wait_for_status(&app, &token, &id, "failed").await;
        let expected = format!(
            "the receiver redirected ({code}) to {}; callbacks are not redirected because the method and body would \
             change: set the biz type's callback URL to the new location",
            target.url
        );
        let attempts = failed["attempts"].as_array().unwrap();
        assert_eq!(attempts.len(), 2, "retried: {failed}");
        for attempt in attempts {
            assert_eq!((&attempt["status_code"], &attempt["error"]), (&json!(code), &json!(expected)));
            assert_eq!(attempt["redirected_to"], Value::Null);
        }
        assert_eq!(redirector.received().len(), 2);
    }
    assert!(target.received().is_empty(), "the target got {:?}", target.received().iter().map(|r| &r.method).collect::<Vec<_>>());
}

/// A 307 or 308 keeps the method and body: it is followed, the target gets the same POST
/// (body, signature and Chime headers), and the attempt records where it went.
#[tokio::test]
async fn temporary_and_permanent_redirects_are_followed_with_the_body() {
    let app = spawn_node().await;
    for code in [307, 308] {
        let target = Receiver::start(vec![], Answer::status(200)).await;
        let redirector = Receiver::start(vec![], Answer::redirect(code, &format!("{}?via={code}", target.url))).await;
        let name = format!("moved-{code}");
        let token = biz_type(&app, &name, &redirector, Settings::default()).await;
        let id = app.create_task(&token, json!({"biz_type": name, "payload": {"order": code}})).await["id"].as_str().unwrap().to_string();

        let done = wait_for_status(&app, &token, &id, "succeeded").await;
        let (sent, got) = (redirector.received(), target.received());
        assert_eq!((sent.len(), got.len()), (1, 1));
        assert_eq!(got[0].method, "POST");
        assert_eq!(got[0].body, sent[0].body, "the same body");
        assert_eq!(got[0].json()["payload"]["order"], code);
        for header in ["content-type", "chime-task-id", "chime-attempt", "chime-signature"] {
            assert_eq!(got[0].header(header), sent[0].header(header), "{header}");
        }
        let attempts = done["attempts"].as_array().unwrap();
        assert_eq!(attempts.len(), 1);
        assert_eq!(attempts[0]["status_code"], 200);
        assert_eq!(attempts[0]["error"], Value::Null);
        assert_eq!(attempts[0]["redirected_to"], format!("{}?via={code}", target.url));
    }
}

/// A receiver slower than the timeout counts as a failure; after max_attempts the task
/// is failed; a replay then delivers it once the receiver is fixed.
#[tokio::test]
async fn timeouts_exhaust_attempts_and_replay_delivers() {
    let app = spawn_node().await;
    let slow = Answer { delay: Duration::from_secs(3), ..Answer::status(200) };
    let receiver = Receiver::start(vec![], slow).await;
    let token = biz_type(
        &app,
        "orders",
        &receiver,
        Settings { timeout_ms: Some(200), max_attempts: Some(2), backoff_initial_ms: Some(50), ..Default::default() },
    )
    .await;
    let id = app.create_task(&token, json!({"biz_type": "orders"})).await["id"].as_str().unwrap().to_string();

    let failed = wait_for_status(&app, &token, &id, "failed").await;
    assert_eq!(failed["attempt_count"], 2);
    assert!(failed["last_error"].as_str().unwrap().contains("timed out"), "{}", failed["last_error"]);
    let attempts = failed["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 2);
    assert!(attempts.iter().all(|a| a["status_code"].is_null() && a["duration_ms"].as_i64().unwrap() < 2000));

    receiver.answer_with(Answer::status(200));
    let replayed = app.post(&format!("/api/v1/tasks/{id}/replay"), &token, json!({})).await;
    assert_eq!(replayed.status, 200);
    let done = wait_for_status(&app, &token, &id, "succeeded").await;
    assert_eq!(done["attempt_count"], 1, "a replay starts counting afresh");
    assert_eq!(done["attempts"].as_array().unwrap().len(), 3, "history kept");
}

/// A paused biz type's tasks wait; on resume they are delivered.
#[tokio::test]
async fn paused_biz_types_wait_until_resumed() {
    let app = spawn_app().await;
    let mut engine = engine(&app);
    let receiver = Receiver::start(vec![], Answer::status(200)).await;
    let token = biz_type(&app, "orders", &receiver, Settings { paused: Some(true), ..Default::default() }).await;
    let id = app.create_task(&token, json!({"biz_type": "orders"})).await["id"].as_str().unwrap().to_string();
    // The first turn reads the settings; the task is due, and nothing is claimed.
    assert_eq!(engine.turn().await.claimed, 0);
    engine.settled().await;
    assert!(receiver.received().is_empty());
    assert_eq!(app.get(&format!("/api/v1/tasks/{id}"), &token).await.body["status"], "pending");

    biz_types::update(&app.pool, "orders", &Settings { paused: Some(false), ..Default::default() }, CallbackHosts::Any).await.unwrap();
    engine.reread_settings();
    assert_eq!(engine.turn().await.claimed, 1);
    engine.settled().await;
    wait_for_status(&app, &token, &id, "succeeded").await;
    assert_eq!(receiver.received().len(), 1);
}

/// A task due in the future fires at its time, not before.
#[tokio::test]
async fn a_future_task_fires_at_its_time() {
    let app = spawn_node().await;
    let receiver = Receiver::start(vec![], Answer::status(200)).await;
    let token = biz_type(&app, "orders", &receiver, Settings::default()).await;
    let task = app.create_task(&token, json!({"biz_type": "orders", "delay_ms": 1500})).await;
    let run_at: chrono::DateTime<chrono::Utc> = task["run_at"].as_str().unwrap().parse().unwrap();
    let received = receiver.wait_for(1, Duration::from_secs(10)).await;
    assert_eq!(received.len(), 1);
    let fired_at: chrono::DateTime<chrono::Utc> = received[0].json()["fired_at"].as_str().unwrap().parse().unwrap();
    assert!(fired_at >= run_at, "fired {fired_at} before {run_at}");
}

/// The rate limit holds at the receiver: no second sees more than the rate (plus the
/// limiter's burst of a tenth of a second), and the backlog takes as long as it must.
#[tokio::test]
async fn rate_limit_is_respected_at_the_receiver() {
    let app = spawn_node().await;
    let receiver = Receiver::start(vec![], Answer::status(200)).await;
    let token = biz_type(&app, "orders", &receiver, Settings { rate_limit: Some(20.0), ..Default::default() }).await;
    let items: Vec<Value> = (0..60).map(|i| json!({"biz_type": "orders", "payload": i})).collect();
    app.post("/api/v1/tasks/batch", &token, json!({"tasks": items})).await;

    let received = receiver.wait_for(60, Duration::from_secs(20)).await;
    assert_eq!(received.len(), 60);
    let first = received[0].at;
    let span = received[59].at - first;
    assert!(span >= Duration::from_millis(2800), "60 callbacks at 20/s (burst 2) took only {span:?}");
    for (i, r) in received.iter().enumerate() {
        let window = received[i..].iter().take_while(|later| later.at - r.at < Duration::from_secs(1)).count();
        assert!(window <= 20 + 2 + 1, "{window} callbacks within one second");
    }
}

/// A biz type whose receiver hangs, with a large backlog, does not delay another's tasks.
#[tokio::test]
async fn a_stuck_biz_type_does_not_delay_another() {
    let app = spawn_node().await;
    let stuck = Receiver::start(vec![], Answer { delay: Duration::from_secs(30), ..Answer::status(200) }).await;
    let healthy = Receiver::start(vec![], Answer::status(200)).await;
    let stuck_token = biz_type(&app, "stuck", &stuck, Settings { timeout_ms: Some(30_000), max_in_flight: Some(20), ..Default::default() }).await;
    let token = biz_type(&app, "healthy", &healthy, Settings::default()).await;
    for _ in 0..5 {
        let items: Vec<Value> = (0..1000).map(|i| json!({"biz_type": "stuck", "payload": i})).collect();
        app.post("/api/v1/tasks/batch", &stuck_token, json!({"tasks": items})).await;
    }
    stuck.wait_for(20, Duration::from_secs(10)).await;

    let task = app.create_task(&token, json!({"biz_type": "healthy"})).await;
    let done = wait_for_status(&app, &token, task["id"].as_str().unwrap(), "succeeded").await;
    assert_eq!(done["attempts"][0]["status_code"], 200);
    assert_eq!(stuck.received().len(), 20, "the stuck biz type holds only its in-flight cap");
}

/// /metrics counts claims, deliveries, retries and failures per biz type, with latency and
/// lateness histograms, in the OpenMetrics text format.
#[tokio::test]
async fn metrics_count_deliveries_per_biz_type() {
    let app = spawn_node().await;
    let receiver = Receiver::start(vec![Answer::status(500)], Answer::status(200)).await;
    let token = biz_type(&app, "metrics-check", &receiver, fast_retries()).await;
    let items: Vec<Value> = (0..3).map(|i| json!({"biz_type": "metrics-check", "payload": i})).collect();
    app.post("/api/v1/tasks/batch", &token, json!({"tasks": items})).await;
    receiver.wait_for(4, Duration::from_secs(10)).await;

    let b = r#"{biz_type="metrics-check"}"#;
    // A callback's metrics are counted once its answer is read, just after the receiver
    // saw it: read /metrics until the fourth is (at most 10 s).
    let finished = format!("chime_delivery_seconds_count{b} 4");
    let text = wait_until(&format!("{finished} in /metrics"), Duration::from_secs(10), || async {
        let text = app.client.get(format!("{}/metrics", app.address)).send().await.unwrap().text().await.unwrap();
        text.lines().any(|l| l == finished).then_some(text)
    })
    .await;
    let value = |series: &str| -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(series).and_then(|rest| rest.trim().parse().ok()))
            .unwrap_or_else(|| panic!("no {series} in\n{text}"))
    };
    assert_eq!(value(&format!("chime_tasks_claimed_total{b}")), 4.0);
    assert_eq!(value(&format!("chime_tasks_delivered_total{b}")), 3.0);
    assert_eq!(value(&format!("chime_tasks_retried_total{b}")), 1.0);
    assert_eq!(value(&format!("chime_tasks_failed_total{b}")), 0.0);
    assert_eq!(value(&format!("chime_in_flight{b}")), 0.0);
    assert_eq!(value(&format!("chime_delivery_seconds_count{b}")), 4.0);
    assert_eq!(value(r#"chime_lateness_seconds_bucket{le="+Inf",biz_type="metrics-check"}"#), 4.0);
    assert!(text.contains("# TYPE chime_claim_batch_size histogram"));
}

/// https callbacks go through TLS with the platform's roots: a receiver with a self-signed
/// certificate is refused at the handshake, named in the attempt's error.
#[tokio::test]
async fn https_callbacks_verify_the_certificate() {
    let app = spawn_node().await;
    let dir = std::env::temp_dir().join(format!("chime-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    let made = std::process::Command::new("openssl")
        .args(["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1"])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .expect("openssl is installed");
    assert!(made.status.success());
    let port = crate::helpers::free_port();
    let mut server = tokio::process::Command::new("openssl")
        .args(["s_server", "-quiet", "-www", "-accept", &port.to_string()])
        .arg("-cert")
        .arg(&cert)
        .arg("-key")
        .arg(&key)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    // Until s_server accepts connections (at most 10 s).
    wait_until("s_server accepting connections", Duration::from_secs(10), || async {
        tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_ok()
    })
    .await;

    let settings = Settings { callback_url: Some(format!("https://127.0.0.1:{port}/hook")), max_attempts: Some(1), ..Default::default() };
    biz_types::create(&app.pool, "secure", &settings, CallbackHosts::Any).await.unwrap();
    let token = biz_types::create_token(&app.pool, "secure").await.unwrap();
    let id = app.create_task(&token, json!({"biz_type": "secure"})).await["id"].as_str().unwrap().to_string();
    let failed = wait_for_status(&app, &token, &id, "failed").await;
    let error = failed["last_error"].as_str().unwrap().to_lowercase();
    assert!(error.contains("certificate") || error.contains("issuer"), "{error}");
    server.kill().await.unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Creating, replaying or rescheduling a task due now notifies `chime_wake`, which wakes
/// sleeping engines and waiting reserves at once instead of at their next poll.
#[tokio::test]
async fn a_task_due_now_wakes_the_engines() {
    let app = crate::helpers::spawn_app().await;
    let token = app.biz_type("orders").await;
    let mut listener = sqlx::postgres::PgListener::connect(&app.db_url).await.unwrap();
    listener.listen("chime_wake").await.unwrap();
    let task = app.create_task(&token, serde_json::json!({"biz_type": "orders"})).await;
    assert!(woken(&mut listener).await, "create");
    let later = app.create_task(&token, serde_json::json!({"biz_type": "orders", "delay_ms": 3_600_000})).await;
    let id = later["id"].as_str().unwrap();
    assert_eq!(app.patch(&format!("/api/v1/tasks/{id}"), &token, serde_json::json!({"delay_ms": 0})).await.status, 200);
    assert!(woken(&mut listener).await, "reschedule to now");
    app.force_status(task["id"].as_str().unwrap(), "failed").await;
    assert_eq!(app.post(&format!("/api/v1/tasks/{}/replay", task["id"].as_str().unwrap()), &token, serde_json::json!({})).await.status, 200);
    assert!(woken(&mut listener).await, "replay");
}

async fn woken(listener: &mut sqlx::postgres::PgListener) -> bool {
    tokio::time::timeout(std::time::Duration::from_secs(2), listener.try_recv()).await.is_ok_and(|n| n.is_ok_and(|n| n.is_some()))
}

/// Tasks are claimed a little before they are due and held until then: none reaches the
/// receiver before its `run_at`, although the engine had it in hand earlier.
#[tokio::test]
async fn tasks_claimed_ahead_never_fire_early() {
    let app = spawn_node().await;
    let receiver = Receiver::start(vec![], Answer::status(200)).await;
    let token = biz_type(&app, "orders", &receiver, Settings::default()).await;
    // Due one by one, 20 ms apart, well inside the claim-ahead window of one another, so
    // most are claimed before they are due.
    let start = chrono::Utc::now() + chrono::TimeDelta::seconds(1);
    let tasks: Vec<Value> = (0..15)
        .map(|i| json!({"biz_type": "orders", "run_at": (start + chrono::TimeDelta::milliseconds(20 * i)).to_rfc3339_opts(chrono::SecondsFormat::Micros, true)}))
        .collect();
    assert_eq!(app.post("/api/v1/tasks/batch", &token, json!({"tasks": tasks})).await.status, 200);

    let received = receiver.wait_for(15, Duration::from_secs(10)).await;
    let (now_wall, now_instant) = (chrono::Utc::now(), std::time::Instant::now());
    for request in &received {
        let body = request.json();
        let run_at: chrono::DateTime<chrono::Utc> = body["run_at"].as_str().unwrap().parse().unwrap();
        let fired_at: chrono::DateTime<chrono::Utc> = body["fired_at"].as_str().unwrap().parse().unwrap();
        let arrived = now_wall - chrono::TimeDelta::from_std(now_instant - request.at).unwrap();
        assert!(fired_at >= run_at, "fired at {fired_at}, before its run_at {run_at}");
        assert!(arrived >= run_at, "arrived at {arrived}, before its run_at {run_at}");
    }
}

/// Creating, changing or re-keying a biz type tells every engine to re-read the settings
/// (`chime_wake` with payload `settings`), instead of leaving them to the periodic refresh.
#[tokio::test]
async fn biz_type_changes_tell_the_engines() {
    let app = spawn_node().await;
    let mut listener = sqlx::postgres::PgListener::connect(&app.db_url).await.unwrap();
    listener.listen("chime_wake").await.unwrap();
    let receiver = Receiver::start(vec![], Answer::status(200)).await;
    biz_type(&app, "orders", &receiver, Settings::default()).await;
    assert_eq!(settings_notice(&mut listener).await.as_deref(), Some("settings"), "create");
    let pause = Settings { paused: Some(true), ..Default::default() };
    biz_types::update(&app.pool, "orders", &pause, CallbackHosts::Any).await.unwrap();
    assert_eq!(settings_notice(&mut listener).await.as_deref(), Some("settings"), "update");
    let id = biz_types::id_of(&app.pool, "orders").await.unwrap();
    biz_types::rotate_secret(&app.pool, id, biz_types::DEFAULT_OVERLAP_SECS, "test").await.unwrap();
    assert_eq!(settings_notice(&mut listener).await.as_deref(), Some("settings"), "rotate secret");
}

async fn settings_notice(listener: &mut sqlx::postgres::PgListener) -> Option<String> {
    let notification = tokio::time::timeout(Duration::from_secs(2), listener.recv()).await.ok()?.ok()?;
    Some(notification.payload().to_string())
}

/// The claims' lower bound on `run_at` (`chime_unfinished_floor`, migration 0036) lies at
/// the oldest partition holding an unfinished task, and never after 25 hours ago: a task
/// pending in a partition three days old, behind two days of finished ones, is still
/// claimed; once it is delivered, the bound moves up past the finished partitions, which
/// the claims then prune as they start.
#[tokio::test]
async fn the_claims_lower_bound_keeps_every_unfinished_task_in_sight() {
    let app = spawn_app().await;
    let receiver = Receiver::start(vec![], Answer::status(200)).await;
    let token = biz_type(&app, "orders", &receiver, Settings::default()).await;
    chime::partitions::ensure_since(&app.pool, &chime::partitions::Layout::default(), chrono::Duration::days(5)).await.unwrap();
    let day = |n: i64| (chrono::Utc::now() - chrono::Duration::days(n)).date_naive().and_hms_opt(0, 0, 0).unwrap().and_utc();
    let insert = |days_ago: i64, status: &'static str| {
        sqlx::query(
            "INSERT INTO tasks (id, biz_type_id, run_at, first_run_at, status, finished_at)
             SELECT gen_random_uuid(), (SELECT id FROM biz_types WHERE name = 'orders'), $1, $1, $2,
                    CASE WHEN $2 = 'pending' THEN NULL ELSE now() END",
        )
        .bind(day(days_ago) + chrono::Duration::hours(1))
        .bind(status)
        .execute(&app.pool)
    };
    for days_ago in [2, 4] {
        insert(days_ago, "succeeded").await.unwrap();
    }
    insert(3, "pending").await.unwrap();
    assert_eq!(chime::tasks::lease::unfinished_floor(&app.pool).await.unwrap(), day(3), "the partition of three days ago holds a pending task");

    let mut engine = engine(&app);
    assert_eq!(engine.turn().await.claimed, 1, "claimed below 25 hours ago");
    engine.settled().await;
    assert_eq!(receiver.received().len(), 1);
    let floor = chime::tasks::lease::unfinished_floor(&app.pool).await.unwrap();
    let expected = chrono::Utc::now() - chrono::Duration::hours(25);
    assert!((floor - expected).num_seconds().abs() < 5, "with nothing unfinished in them, the old partitions are below the bound: {floor}");
    drop(token);
}
