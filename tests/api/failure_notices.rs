//! Signing secret rotation with an overlap, and failure notices (docs/design/contract.md, Notices and signatures): the real server,
//! engine and notice sender against real receivers, the real `chime` binary for the CLI.

use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use chime::biz_types::{self, Settings};
use chime::callback_hosts::CallbackHosts;
use chime::failure_notices::Sender;
use serde_json::{Value, json};
use uuid::Uuid;

use crate::admin::admin_token;
use crate::cli::chime;
use crate::console::{ADMIN_PASSWORD, sign_in};
use crate::delivery::wait_for_status;
use crate::helpers::{TestApp, engine, settings_notice, spawn_app, spawn_node, wake_listener};
use crate::receiver::{Answer, Received, Receiver};

/// The `v1` values of a `Chime-Signature` header, in order.
fn v1s(request: &Received) -> Vec<String> {
    let header = request.header("chime-signature").expect("a Chime-Signature header");
    header.split(',').filter_map(|part| part.strip_prefix("v1=")).map(str::to_string).collect()
}

/// Whether a receiver knowing only `secret` accepts the request: any `v1` matches the HMAC
/// of "<t>.<body>" (docs/design/contract.md, Notices and signatures).
fn verifies_with(request: &Received, secret: &str) -> bool {
    let header = request.header("chime-signature").unwrap();
    let t: i64 = header.strip_prefix("t=").unwrap().split(',').next().unwrap().parse().unwrap();
    let expected = chime::engine::signature(secret, t, &request.body);
    let expected_v1 = expected.split(',').nth(1).unwrap().strip_prefix("v1=").unwrap().to_string();
    v1s(request).contains(&expected_v1)
}

async fn secret_of(app: &TestApp, name: &str) -> String {
    biz_types::by_name(&app.pool, name).await.unwrap().unwrap().signing_secret.expose().unwrap().to_string()
}

/// A notice sender on `app`'s database, driven one turn at a time; the lifecycle must live
/// as long as it (a dropped one reads as "stopping").
fn sender(app: &TestApp) -> (Sender, chime::lifecycle::Lifecycle) {
    let lifecycle = chime::lifecycle::Lifecycle::default();
    let sender = Sender::start(chime::db::Health::new(&app.pool), Uuid::new_v4(), CallbackHosts::Any, lifecycle.signal());
    (sender, lifecycle)
}

/// The notices' (event, status, attempt_count) of a task.
async fn notices_of(app: &TestApp, task_id: &str) -> Vec<(String, String, i32)> {
    sqlx::query_as("SELECT event, status, attempt_count FROM failure_notices WHERE task_id = $1::uuid ORDER BY created_at")
        .bind(task_id)
        .fetch_all(&app.pool)
        .await
        .unwrap()
}

/// During an overlap every callback carries the new secret's `v1` and then the old one's,
/// so a receiver that knows only the old secret keeps accepting; the running engine signs
/// with both from the first callback after the rotation (the rotation wakes it). After the
/// overlap a callback carries the new `v1` alone. The API answers until when the old one
/// signs, and the audit log records the overlap.
#[tokio::test]
async fn a_receiver_with_the_old_secret_accepts_callbacks_until_the_overlap_ends() {
    let app = spawn_node().await;
    let receiver = Receiver::start(vec![], Answer::status(200)).await;
    let admin = admin_token(&app).await;
    let created = app.post("/api/v1/admin/biz-types", &admin, json!({"name": "orders", "callback_url": receiver.url})).await;
    let old = created.body["signing_secret"].as_str().unwrap().to_string();
    let token = biz_types::create_token(&app.pool, "orders").await.unwrap();

    let mut listener = wake_listener(&app).await;
    let rotated = app.post("/api/v1/admin/biz-types/orders/rotate-secret", &admin, json!({"overlap_secs": 5})).await;
    assert_eq!(rotated.status, 200, "{}", rotated.body);
    let new = rotated.body["signing_secret"].as_str().unwrap().to_string();
    let until: chrono::DateTime<chrono::Utc> = rotated.body["previous_secret_until"].as_str().unwrap().parse().unwrap();
    let from_now = (until - chrono::Utc::now()).num_milliseconds();
    assert!((3_000..=5_000).contains(&from_now), "the overlap ends {from_now} ms from now");
    let shown = app.get("/api/v1/admin/biz-types/orders", &admin).await.body;
    assert_eq!(shown["previous_secret_until"], rotated.body["previous_secret_until"], "{shown}");

    // The first callback of a task created after the rotation carries both: the claim that
    // leases it sees the rotation, and the engine re-reads its settings before calling back.
    settings_notice(&mut listener).await;
    let task = app.create_task(&token, json!({"biz_type": "orders"})).await;
    wait_for_status(&app, &token, task["id"].as_str().unwrap(), "succeeded").await;
    let during = receiver.received().pop().unwrap();
    assert_eq!(v1s(&during).len(), 2, "{:?}", during.header("chime-signature"));
    assert!(verifies_with(&during, &old), "a receiver with only the old secret accepts it");
    assert!(verifies_with(&during, &new), "a receiver with the new secret accepts it");
    let t: i64 = during.header("chime-signature").unwrap()[2..].split(',').next().unwrap().parse().unwrap();
    let expected = format!(
        "{},v1={}",
        chime::engine::signature(&new, t, &during.body),
        chime::engine::signature(&old, t, &during.body).split(",v1=").nth(1).unwrap()
    );
    assert_eq!(during.header("chime-signature").unwrap(), expected, "the new secret's v1 first, then the old one's");

    tokio::time::sleep((until - chrono::Utc::now()).to_std().unwrap_or_default() + Duration::from_millis(200)).await;
    let task = app.create_task(&token, json!({"biz_type": "orders"})).await;
    wait_for_status(&app, &token, task["id"].as_str().unwrap(), "succeeded").await;
    let after = receiver.received().pop().unwrap();
    assert_eq!(v1s(&after).len(), 1, "{:?}", after.header("chime-signature"));
    assert!(verifies_with(&after, &new) && !verifies_with(&after, &old), "after the overlap only the new secret signs");

    let audited: Value =
        sqlx::query_scalar("SELECT after FROM audit_log WHERE action = 'biz_type.rotate_secret'").fetch_one(&app.pool).await.unwrap();
    assert_eq!(audited["overlap_secs"], 5, "{audited}");
    assert_eq!(audited["previous_secret_until"], rotated.body["previous_secret_until"], "{audited}");
}

/// A callback of a task created after its biz type's secret changed is signed with the new
/// secret even when the engine has not heard of the change (its notification late, its
/// periodic re-read seconds away): the claim that leases the task sees the change, and the
/// engine reads its settings again before calling back.
#[tokio::test]
async fn a_task_created_after_a_rotation_is_signed_with_the_new_secret_at_once() {
    let app = crate::helpers::spawn_app_with(chime::config::ServeArgs { engine: false, ..Default::default() }).await;
    let receiver = Receiver::start(vec![], Answer::status(200)).await;
    let settings = Settings { callback_url: Some(receiver.url.clone()), ..Default::default() };
    biz_types::create(&app.pool, "orders", &settings, CallbackHosts::Any).await.unwrap();
    let token = biz_types::create_token(&app.pool, "orders").await.unwrap();
    let old = secret_of(&app, "orders").await;
    let mut engine = engine(&app);
    engine.turn().await;

    // Changed behind the engine's back: no notification, as if it had not arrived yet.
    let new = "whsec_".to_string() + &STANDARD.encode([7u8; 32]);
    sqlx::query("UPDATE biz_types SET signing_secret = $1, signing_secret_sealed = NULL, updated_at = now() WHERE name = 'orders'")
        .bind(&new)
        .execute(&app.pool)
        .await
        .unwrap();
    app.create_task(&token, json!({"biz_type": "orders"})).await;
    assert_eq!(engine.turn().await.claimed, 1);
    let callback = receiver.wait_for(1, Duration::from_secs(10)).await.pop().unwrap();
    assert!(verifies_with(&callback, &new) && !verifies_with(&callback, &old), "{:?}", callback.header("chime-signature"));
}

/// Rotating again during an overlap keeps the secret just replaced as the previous one:
/// callbacks carry the newest and the one before, and the first no longer signs. An overlap
/// of 0 stops the old secret at once.
#[tokio::test]
async fn rotating_again_during_an_overlap_keeps_the_secret_just_replaced() {
    let app = spawn_app().await;
    let receiver = Receiver::start(vec![], Answer::status(200)).await;
    let settings = Settings { callback_url: Some(receiver.url.clone()), ..Default::default() };
    let b = biz_types::create(&app.pool, "orders", &settings, CallbackHosts::Any).await.unwrap();
    let token = biz_types::create_token(&app.pool, "orders").await.unwrap();
    let first = secret_of(&app, "orders").await;
    let second = biz_types::rotate_secret(&app.pool, b.id, 3600, "test").await.unwrap();
    let third = biz_types::rotate_secret(&app.pool, b.id, 3600, "test").await.unwrap();
    assert!(third.previous_until.is_some());

    let mut engine = engine(&app);
    app.create_task(&token, json!({"biz_type": "orders"})).await;
    engine.turn().await;
    engine.settled().await;
    let callback = receiver.received().pop().expect("a callback");
    assert_eq!(v1s(&callback).len(), 2);
    assert!(verifies_with(&callback, &third.secret) && verifies_with(&callback, &second.secret), "the newest and the one it replaced");
    assert!(!verifies_with(&callback, &first), "the first secret stopped at the second rotation");

    let fourth = biz_types::rotate_secret(&app.pool, b.id, 0, "test").await.unwrap();
    assert_eq!(fourth.previous_until, None);
    let (previous, until): (Option<String>, Option<chrono::DateTime<chrono::Utc>>) =
        sqlx::query_as("SELECT previous_secret, previous_secret_until FROM biz_types WHERE id = $1").bind(b.id).fetch_one(&app.pool).await.unwrap();
    assert_eq!((previous, until), (None, None), "no overlap: nothing kept");
    engine.reread_settings();
    app.create_task(&token, json!({"biz_type": "orders"})).await;
    engine.turn().await;
    engine.settled().await;
    let callback = receiver.received().pop().unwrap();
    assert_eq!(v1s(&callback).len(), 1);
    assert!(verifies_with(&callback, &fourth.secret));
}

/// An overlap beyond 30 days, or negative, is refused naming `overlap_secs` by the admin
/// API (body or query, not both) and the CLI, and in hours by the console; nothing rotates.
/// The CLI and the query parameter take an overlap, and 0.
#[tokio::test]
async fn overlaps_out_of_range_are_refused_everywhere() {
    let app = spawn_app().await;
    app.biz_type("orders").await;
    let admin = admin_token(&app).await;
    let before = secret_of(&app, "orders").await;
    for (path, body) in [
        ("/api/v1/admin/biz-types/orders/rotate-secret", json!({"overlap_secs": 2_592_001})),
        ("/api/v1/admin/biz-types/orders/rotate-secret", json!({"overlap_secs": -1})),
        ("/api/v1/admin/biz-types/orders/rotate-secret?overlap_secs=99999999", json!({})),
        ("/api/v1/admin/biz-types/orders/rotate-secret?overlap_secs=60", json!({"overlap_secs": 60})),
    ] {
        let refused = app.post(path, &admin, body.clone()).await;
        assert_eq!((refused.status, refused.code()), (422, "invalid_argument"), "{path} {body}: {}", refused.body);
        assert!(refused.message().starts_with("overlap_secs: "), "{}", refused.message());
    }
    let console = sign_in(&app, "admin", ADMIN_PASSWORD).await;
    let refused = console.post("/console/biz-types/orders/rotate-secret", &[("overlap_hours", "721")]).await;
    assert_eq!(refused.status, 422, "{}", refused.body);
    assert!(refused.body.contains("must be a whole number of hours from 0 (the old secret stops at once) to 720 (30 days)"), "{}", refused.body);
    let db = ("DATABASE_URL", app.db_url.as_str());
    let out = chime(&[db], &["biz-type", "rotate-secret", "orders", "--overlap-secs", "2592001"], None).await;
    assert!(!out.ok && out.stderr.contains("overlap_secs: must be between 0"), "{}", out.stderr);
    assert_eq!(secret_of(&app, "orders").await, before, "nothing rotated");

    let zero = app.post("/api/v1/admin/biz-types/orders/rotate-secret?overlap_secs=0", &admin, json!({})).await;
    assert_eq!((zero.status, zero.body["previous_secret_until"].clone()), (200, Value::Null), "{}", zero.body);
    let out = chime(&[db], &["biz-type", "rotate-secret", "orders", "--overlap-secs", "600"], None).await;
    assert!(out.ok, "{}", out.stderr);
    assert_eq!(out.last_line(), secret_of(&app, "orders").await, "the new secret is the last line");
    assert!(out.stdout.contains("callbacks carry both signatures"), "{}", out.stdout);
    let (rotated, _) = console.post_and_follow("/console/biz-types/orders/rotate-secret", &[("overlap_hours", "24")]).await;
    assert!(rotated.body.contains("id=\"previous-secret\""), "the biz type page shows until when the old secret signs: {}", rotated.body);
}

/// With CHIME_SECRET_KEY the secret a rotation keeps is stored sealed, like the current one;
/// one kept in clear (rotated without a key) is sealed by `chime secrets reencrypt`.
#[tokio::test]
async fn the_previous_secret_is_sealed_like_the_current_one() {
    let app = spawn_app().await;
    let db = ("DATABASE_URL", app.db_url.as_str());
    let key = ("CHIME_SECRET_KEY", &*STANDARD.encode([7u8; 32]));
    let previous = || async {
        sqlx::query_scalar::<_, Option<String>>("SELECT previous_secret FROM biz_types WHERE name = 'orders'")
            .fetch_one(&app.pool)
            .await
            .unwrap()
            .unwrap()
    };
    let out = chime(&[db], &["biz-type", "create", "orders", "--callback-url", "http://127.0.0.1:9/hook"], None).await;
    let clear_secret = out.last_line().to_string();
    assert!(chime(&[db], &["biz-type", "rotate-secret", "orders"], None).await.ok);
    assert_eq!(previous().await, clear_secret, "without a key it is kept in clear");
    let out = chime(&[db, key], &["secrets", "reencrypt"], None).await;
    assert!(out.stdout.contains("2 encrypted (were in clear)"), "the current and the previous secret: {}", out.stdout);
    let sealed = previous().await;
    assert!(sealed.starts_with("enc:v1:") && !sealed.contains(&clear_secret), "{sealed}");

    let out = chime(&[db, key], &["biz-type", "rotate-secret", "orders"], None).await;
    assert!(out.ok, "{}", out.stderr);
    let kept = previous().await;
    assert!(kept.starts_with("enc:v1:") && kept != sealed, "the secret just replaced, sealed: {kept}");
}

/// Creates a biz type whose callbacks go to `callback` and failure notices to `notices`
/// (none when `None`), failing a task at its first failed attempt; returns its token.
async fn failing_biz_type(app: &TestApp, callback: &Receiver, notices: Option<&Receiver>, settings: Settings) -> String {
    let settings = Settings {
        callback_url: Some(callback.url.clone()),
        failure_url: notices.map(|r| r.url.clone()),
        max_attempts: settings.max_attempts.or(Some(1)),
        backoff_initial_ms: Some(100),
        backoff_max_ms: Some(200),
        ..settings
    };
    biz_types::create(&app.pool, "orders", &settings, CallbackHosts::Any).await.unwrap();
    biz_types::create_token(&app.pool, "orders").await.unwrap()
}

/// A task that fails (one attempt, the receiver answers 500) makes one failure notice,
/// POSTed to the failure_url with `Chime-Event: task.failed`, the task id, a signature that
/// verifies with the biz type's secret, and the body `{"event", "task", "last_attempt"}`;
/// the console's task page shows it delivered, and the metric counts it.
#[tokio::test]
async fn a_failed_task_sends_one_signed_notice_with_the_task_and_its_last_attempt() {
    let app = spawn_app().await;
    let callback = Receiver::start(vec![], Answer::status(500)).await;
    let notices = Receiver::start(vec![], Answer::status(204)).await;
    let token = failing_biz_type(&app, &callback, Some(&notices), Settings::default()).await;
    let task = app.create_task(&token, json!({"biz_type": "orders", "key": "order-1", "payload": {"n": 1}})).await;
    let id = task["id"].as_str().unwrap();
    let (sender, _lifecycle) = sender(&app);
    assert_eq!(sender.turn().await, 0, "nothing to send before the task ends");

    let mut engine = engine(&app);
    engine.turn().await;
    engine.settled().await;
    let failed = app.get(&format!("/api/v1/tasks/{id}"), &token).await.body;
    assert_eq!(failed["status"], "failed");
    assert_eq!(notices_of(&app, id).await, [("task.failed".to_string(), "pending".to_string(), 0)], "made with the task's end");

    assert_eq!(sender.turn().await, 1);
    let received = notices.received();
    assert_eq!(received.len(), 1, "one notice");
    let notice = &received[0];
    assert_eq!(notice.method, "POST");
    assert_eq!(notice.header("chime-event"), Some("task.failed"));
    assert_eq!(notice.header("chime-task-id"), Some(id));
    assert_eq!(notice.header("content-type"), Some("application/json"));
    assert!(verifies_with(notice, &secret_of(&app, "orders").await), "signed with the biz type's secret");
    assert!(!verifies_with(notice, "whsec_some_other_secret"));
    let body = notice.json();
    assert_eq!(body["event"], "task.failed");
    let mut shown = failed.clone();
    shown.as_object_mut().unwrap().remove("attempts");
    shown.as_object_mut().unwrap().remove("attempt_total");
    assert_eq!(body["task"], shown, "the task as the API shows it");
    assert_eq!(body["last_attempt"], failed["attempts"][0], "its last attempt");
    assert_eq!(body["last_attempt"]["status_code"], 500);

    assert_eq!(notices_of(&app, id).await, [("task.failed".to_string(), "delivered".to_string(), 1)]);
    assert_eq!(sender.turn().await, 0, "delivered once");
    let console = sign_in(&app, "admin", ADMIN_PASSWORD).await;
    let page = console.get(&format!("/console/tasks/{id}")).await.body;
    assert!(page.contains("id=\"failure-notices\"") && page.contains("<span class=\"badge succeeded\">delivered</span> at "), "{page}");
    let metrics = reqwest::get(format!("{}/metrics", app.address)).await.unwrap().text().await.unwrap();
    assert!(metrics.contains(r#"chime_failure_notices_total{biz_type="orders",outcome="delivered"}"#), "{metrics}");
}

/// A notice receiver that fails first (503 with `Retry-After: 1`, then 500) is retried by the
/// biz type's rules until it answers 2xx: delivered at the third attempt, at least a second
/// after the first (Retry-After honoured). One that never answers 2xx fails for good after
/// the biz type's max_attempts, and the console shows the last error and the attempts.
#[tokio::test]
async fn a_failing_notice_receiver_is_retried_until_it_answers() {
    let app = spawn_app().await;
    let callback = Receiver::start(vec![], Answer::status(500)).await;
    let busy = Answer { retry_after: Some(1), ..Answer::status(503) };
    let notices = Receiver::start(vec![busy, Answer::status(500)], Answer::status(200)).await;
    let token = failing_biz_type(&app, &callback, Some(&notices), Settings { max_attempts: Some(3), ..Default::default() }).await;
    let task = app.create_task(&token, json!({"biz_type": "orders"})).await;
    let id = task["id"].as_str().unwrap();
    let mut engine = engine(&app);
    let (sender, _lifecycle) = sender(&app);
    // The task fails at its third attempt (backoff 100-200 ms).
    for _ in 0..100 {
        engine.turn().await;
        engine.settled().await;
        sender.turn().await;
        if notices_of(&app, id).await.first().is_some_and(|n| n.1 == "delivered") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(notices_of(&app, id).await, [("task.failed".to_string(), "delivered".to_string(), 3)]);
    let received = notices.received();
    assert_eq!(received.len(), 3);
    assert!(received[1].at - received[0].at >= Duration::from_millis(950), "Retry-After: 1 honoured: {:?}", received[1].at - received[0].at);
    assert_eq!(
        received.iter().map(|r| r.header("chime-notice-id").unwrap().to_string()).collect::<std::collections::HashSet<_>>().len(),
        1,
        "one notice, sent three times"
    );

    // Replayed, the task fails again; now the notice receiver never answers 2xx.
    notices.answer_with(Answer::status(502));
    assert_eq!(app.post(&format!("/api/v1/tasks/{id}/replay"), &token, json!({})).await.status, 200);
    for _ in 0..100 {
        engine.turn().await;
        engine.settled().await;
        sender.turn().await;
        if notices_of(&app, id).await.get(1).is_some_and(|n| n.1 == "failed") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(notices_of(&app, id).await[1], ("task.failed".to_string(), "failed".to_string(), 3), "given up after max_attempts");
    let console = sign_in(&app, "admin", ADMIN_PASSWORD).await;
    let page = console.get(&format!("/console/tasks/{id}")).await.body;
    assert!(page.contains("<span class=\"badge failed\">failed</span> at ") && page.contains("HTTP 502"), "{page}");
}

/// Without a failure_url no notice is made; clearing it (an empty URL) stops them, and a
/// biz type's notice whose URL was removed before it was sent fails saying so.
#[tokio::test]
async fn no_failure_url_makes_no_notice() {
    let app = spawn_app().await;
    let callback = Receiver::start(vec![], Answer::status(500)).await;
    let token = failing_biz_type(&app, &callback, None, Settings::default()).await;
    let task = app.create_task(&token, json!({"biz_type": "orders"})).await;
    let mut engine = engine(&app);
    engine.turn().await;
    engine.settled().await;
    wait_for_status(&app, &token, task["id"].as_str().unwrap(), "failed").await;
    let count: i64 = sqlx::query_scalar("SELECT count(*) FROM failure_notices").fetch_one(&app.pool).await.unwrap();
    assert_eq!(count, 0);

    let notices = Receiver::start(vec![], Answer::status(200)).await;
    let set = Settings { failure_url: Some(notices.url.clone()), ..Default::default() };
    biz_types::update(&app.pool, "orders", &set, CallbackHosts::Any).await.unwrap();
    let task = app.create_task(&token, json!({"biz_type": "orders"})).await;
    engine.turn().await;
    engine.settled().await;
    assert_eq!(notices_of(&app, task["id"].as_str().unwrap()).await.len(), 1);
    let clear = Settings { failure_url: Some(String::new()), ..Default::default() };
    let (_, after) = biz_types::update(&app.pool, "orders", &clear, CallbackHosts::Any).await.unwrap();
    assert_eq!(after.failure_url, None);
    let (sender, _lifecycle) = sender(&app);
    assert_eq!(sender.turn().await, 1);
    assert_eq!(notices_of(&app, task["id"].as_str().unwrap()).await[0].1, "failed");
    assert!(notices.received().is_empty());
}

/// A pull task whose reservations used up its attempts ends failed in lease recovery, and
/// its notice is made by the same statement.
#[tokio::test]
async fn a_pull_task_failed_by_lease_recovery_gets_a_notice() {
    let app = spawn_app().await;
    let notices = Receiver::start(vec![], Answer::status(200)).await;
    let settings = Settings { mode: Some("pull".into()), max_attempts: Some(1), failure_url: Some(notices.url.clone()), ..Default::default() };
    biz_types::create(&app.pool, "orders", &settings, CallbackHosts::Any).await.unwrap();
    let token = biz_types::create_token(&app.pool, "orders").await.unwrap();
    let task = app.create_task(&token, json!({"biz_type": "orders"})).await;
    let id = task["id"].as_str().unwrap();
    let reserved = app.post("/api/v1/biz-types/orders/reserve", &token, json!({"max": 1})).await;
    assert_eq!(reserved.body["tasks"].as_array().map(Vec::len), Some(1), "{}", reserved.body);
    sqlx::query("UPDATE tasks SET lease_until = now() - interval '1 second' WHERE id = $1::uuid").bind(id).execute(&app.pool).await.unwrap();
    chime::tasks::lease::recover_expired_leases(&app.pool).await.unwrap();
    assert_eq!(app.get(&format!("/api/v1/tasks/{id}"), &token).await.body["status"], "failed");
    assert_eq!(notices_of(&app, id).await, [("task.failed".to_string(), "pending".to_string(), 0)]);
    let (sender, _lifecycle) = sender(&app);
    sender.turn().await;
    assert_eq!(notices.received().len(), 1);
}

/// A notice held by a node that died (running, its hold run out) is sent by another node:
/// at least once, never lost.
#[tokio::test]
async fn a_dead_senders_notice_is_sent_by_another() {
    let app = spawn_app().await;
    let callback = Receiver::start(vec![], Answer::status(500)).await;
    let notices = Receiver::start(vec![], Answer::status(200)).await;
    let token = failing_biz_type(&app, &callback, Some(&notices), Settings::default()).await;
    let task = app.create_task(&token, json!({"biz_type": "orders"})).await;
    let mut engine = engine(&app);
    engine.turn().await;
    engine.settled().await;
    // As a sender that claimed it and died would leave it.
    sqlx::query(
        "UPDATE failure_notices SET status = 'running', held_by = gen_random_uuid(), attempt_count = 1, due_at = now() - interval '1 second'",
    )
    .execute(&app.pool)
    .await
    .unwrap();
    let (sender, _lifecycle) = sender(&app);
    assert_eq!(sender.turn().await, 1);
    assert_eq!(notices.received().len(), 1);
    assert_eq!(notices_of(&app, task["id"].as_str().unwrap()).await, [("task.failed".to_string(), "delivered".to_string(), 2)]);
}

/// A bad failure_url (not http(s), a NUL, over 2048 bytes, a private address with the deny
/// list on) is refused naming `failure_url` by the admin API (422), the console's form
/// (422, beside the field) and the CLI; nothing is saved.
#[tokio::test]
async fn bad_failure_urls_are_refused_by_the_api_the_console_and_the_cli() {
    let app = spawn_app().await;
    app.biz_type("orders").await;
    let admin = admin_token(&app).await;
    let console = sign_in(&app, "admin", ADMIN_PASSWORD).await;
    let db = ("DATABASE_URL", app.db_url.as_str());
    let long = format!("https://example.test/{}", "a".repeat(2048));
    for (bad, why) in [
        ("ftp://example.test/failed", "must be an http:// or https:// URL with a host"),
        ("https://example.test/\0failed", "must not contain control characters"),
        (long.as_str(), "must be at most 2048 bytes"),
    ] {
        let refused =
            app.request("PATCH", "/api/v1/admin/biz-types/orders", Some(&admin), Some(json!({"failure_url": bad}).to_string().into_bytes())).await;
        assert_eq!((refused.status, refused.code()), (422, "invalid_argument"), "{bad:?}: {}", refused.body);
        assert!(refused.message().starts_with("failure_url: ") && refused.message().contains(why), "{}", refused.message());
        let created = app
            .post("/api/v1/admin/biz-types", &admin, json!({"name": "refunds", "callback_url": "https://example.test/", "failure_url": bad}))
            .await;
        assert_eq!(created.status, 422, "{}", created.body);

        let page = console
            .post("/console/biz-types/orders", &[("mode", "callback"), ("callback_url", "http://127.0.0.1:9/callback"), ("failure_url", bad)])
            .await;
        assert_eq!(page.status, 422, "{bad:?}");
        assert!(
            page.body.contains(&format!(r#"<span class="field-error" data-field="failure_url">{}"#, why.replace('/', "&#x2f;")))
                || page.body.contains("data-field=\"failure_url\">must"),
            "{}",
            page.body
        );

        if !bad.contains('\0') {
            let out = chime(&[db], &["biz-type", "update", "orders", "--failure-url", bad], None).await;
            assert!(!out.ok && out.stderr.contains("failure_url: ") && out.stderr.contains(why), "{bad:?}: {}", out.stderr);
        }
    }
    let out = chime(
        &[db, ("CHIME_DENY_PRIVATE_CALLBACKS", "true")],
        &["biz-type", "update", "orders", "--failure-url", "http://127.0.0.1:8080/failed"],
        None,
    )
    .await;
    assert!(!out.ok && out.stderr.contains("failure_url: ") && out.stderr.contains("denied range"), "{}", out.stderr);
    let stored: Option<String> = sqlx::query_scalar("SELECT failure_url FROM biz_types WHERE name = 'orders'").fetch_one(&app.pool).await.unwrap();
    assert_eq!(stored, None, "nothing saved");

    let out = chime(&[db], &["biz-type", "update", "orders", "--failure-url", "https://example.test/failed"], None).await;
    assert!(out.ok && out.stdout.contains("failure notices to https://example.test/failed"), "{}", out.stderr);
    let shown = app.get("/api/v1/admin/biz-types/orders", &admin).await.body;
    assert_eq!(shown["failure_url"], "https://example.test/failed");
    let page = console.get("/console/biz-types/orders").await.body;
    assert!(
        page.contains(r#"name="failure_url" value="https:&#x2f;&#x2f;example.test&#x2f;failed""#)
            || page.contains(r#"name="failure_url" value="https://example.test/failed""#),
        "{page}"
    );
    let out = chime(&[db], &["biz-type", "update", "orders", "--failure-url", ""], None).await;
    assert!(out.ok && out.stdout.contains("failure notices to nowhere"), "{}", out.stdout);
}

/// The sender's loop sends a due notice on its own (within its one-second poll) and stops
/// at the node's stop signal, promptly, saying so.
#[tokio::test]
async fn the_sender_loop_sends_on_its_own_and_stops_with_the_node() {
    let app = spawn_app().await;
    let callback = Receiver::start(vec![], Answer::status(500)).await;
    let notices = Receiver::start(vec![], Answer::status(200)).await;
    let token = failing_biz_type(&app, &callback, Some(&notices), Settings::default()).await;
    let (sender, lifecycle) = sender(&app);
    let running = tokio::spawn(sender.run());
    app.create_task(&token, json!({"biz_type": "orders"})).await;
    let mut engine = engine(&app);
    engine.turn().await;
    engine.settled().await;
    assert_eq!(notices.wait_for(1, Duration::from_secs(5)).await.len(), 1, "sent by the loop within its poll");

    lifecycle.enter(chime::lifecycle::Phase::Draining);
    tokio::time::timeout(Duration::from_secs(3), running).await.expect("the sender stops at the signal").unwrap();
}

/// A task that ends `expired` sends a `task.expired` notice: one held back by a paused biz
/// type and ended by the expiry sweep (no attempt: `last_attempt` null), and one whose
/// node died holding its lease past the deadline, ended by lease recovery.
#[tokio::test]
async fn an_expired_task_sends_a_task_expired_notice() {
    let app = spawn_app().await;
    let callback = Receiver::start(vec![], Answer::status(200)).await;
    let notices = Receiver::start(vec![], Answer::status(200)).await;
    let token = failing_biz_type(&app, &callback, Some(&notices), Settings { paused: Some(true), ..Default::default() }).await;
    let held = app.create_task(&token, json!({"biz_type": "orders", "ttl_ms": 200})).await;
    let held_id = held["id"].as_str().unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(chime::tasks::lease::expire_overdue(&app.pool, 100).await.unwrap().tasks, 1);
    let (sender, _lifecycle) = sender(&app);
    assert_eq!(sender.turn().await, 1);
    let received = notices.received();
    assert_eq!(received[0].header("chime-event"), Some("task.expired"));
    let body = received[0].json();
    assert_eq!(
        (body["event"].as_str(), body["task"]["id"].as_str(), body["task"]["status"].as_str()),
        (Some("task.expired"), Some(held_id), Some("expired"))
    );
    assert_eq!(body["last_attempt"], Value::Null, "never attempted");

    // A task leased by a node that died, its deadline passed meanwhile.
    let leased = app.create_task(&token, json!({"biz_type": "orders", "ttl_ms": 60_000})).await;
    let leased_id = leased["id"].as_str().unwrap();
    sqlx::query(
        "UPDATE tasks SET status = 'running', leased_by = gen_random_uuid(), lease_until = now() - interval '1 second',
                          attempt_count = 1, expires_at = now() - interval '1 second' WHERE id = $1::uuid",
    )
    .bind(leased_id)
    .execute(&app.pool)
    .await
    .unwrap();
    chime::tasks::lease::recover_expired_leases(&app.pool).await.unwrap();
    assert_eq!(notices_of(&app, leased_id).await, [("task.expired".to_string(), "pending".to_string(), 0)]);
    assert_eq!(sender.turn().await, 1);
    assert_eq!(notices.received()[1].header("chime-event"), Some("task.expired"));
}

/// One biz type's failure receiver that hangs holds up only its own notices: with the
/// node's sender loop running and a notice of `slow` hanging at its receiver, a task of
/// `fast` that fails has its notice delivered within a second of its end.
#[tokio::test]
async fn a_hanging_failure_receiver_does_not_hold_up_another_biz_types_notices() {
    let app = spawn_app().await;
    let callback = Receiver::start(vec![], Answer::status(500)).await;
    let hanging = Receiver::start(vec![], Answer { delay: Duration::from_secs(30), ..Answer::status(200) }).await;
    let quick = Receiver::start(vec![], Answer::status(200)).await;
    let mut tokens = vec![];
    for (name, notices) in [("slow", &hanging), ("fast", &quick)] {
        let settings = Settings {
            callback_url: Some(callback.url.clone()),
            failure_url: Some(notices.url.clone()),
            max_attempts: Some(1),
            timeout_ms: Some(30_000),
            ..Default::default()
        };
        biz_types::create(&app.pool, name, &settings, CallbackHosts::Any).await.unwrap();
        tokens.push(biz_types::create_token(&app.pool, name).await.unwrap());
    }
    let (sender, _lifecycle) = sender(&app);
    let _running = tokio::spawn(sender.run());
    let mut engine = engine(&app);

    app.create_task(&tokens[0], json!({"biz_type": "slow"})).await;
    engine.turn().await;
    engine.settled().await;
    hanging.wait_for(1, Duration::from_secs(5)).await;
    assert_eq!(hanging.received().len(), 1, "the slow biz type's notice is hanging at its receiver");

    let task = app.create_task(&tokens[1], json!({"biz_type": "fast"})).await;
    let id = task["id"].as_str().unwrap();
    engine.turn().await;
    engine.settled().await;
    let (now, ended): (chrono::DateTime<chrono::Utc>, chrono::DateTime<chrono::Utc>) =
        sqlx::query_as("SELECT now(), finished_at FROM tasks WHERE id = $1::uuid AND status = 'failed'").bind(id).fetch_one(&app.pool).await.unwrap();
    let left = (ended + chrono::TimeDelta::seconds(1) - now).to_std().unwrap_or_default();
    let received = quick.wait_for(1, left).await;
    let late = received.first().map(|r| chrono::TimeDelta::from_std(r.at.elapsed()).unwrap());
    let arrived = late.map(|late| chrono::Utc::now() - late - ended);
    assert!(
        arrived.is_some_and(|a| a <= chrono::TimeDelta::seconds(1)),
        "the fast biz type's notice arrived {arrived:?} after its task ended (the slow one's receiver still hangs: {} received)",
        hanging.received().len()
    );
}
