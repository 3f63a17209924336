//! Flow keys (docs/design/claim.md, Flow keys and order by key): `flow_max_in_flight` caps
//! a key's callbacks in flight across the cluster, a key at its cap holds back no other, and
//! `ordered` delivers a key's tasks one at a time in run_at order through retries, snoozes
//! and cancels.

use std::collections::HashMap;
use std::time::Duration;

use chime::biz_types::{self, Settings};
use chime::callback_hosts::CallbackHosts;
use chrono::Utc;
use serde_json::{Value, json};

use crate::console::{ADMIN_PASSWORD, sign_in};
use crate::helpers::{chime_process, engine, spawn_app, wait_until};
use crate::receiver::{Answer, Receiver};

/// Two `chime serve` processes, a cap of 2 per key, and a receiver that holds each request
/// 300 ms. A herd of 300 tasks of key `hot`, due first, is more than a claim's first look
/// (200 tasks in due order) takes in; ten tasks of other keys are due just after it. The
/// receiver never has more than 2 of one key at once, and the other keys are delivered
/// within a couple of seconds, while the herd needs 45.
#[tokio::test]
async fn a_key_at_its_cap_holds_back_no_other_key_across_nodes() {
    const CAP: usize = 2;
    const HOLD: Duration = Duration::from_millis(300);
    let app = spawn_app().await;
    let receiver = Receiver::start(vec![], Answer { delay: HOLD, ..Answer::status(200) }).await;
    let settings =
        Settings { callback_url: Some(receiver.url.clone()), max_in_flight: Some(100), flow_max_in_flight: Some(CAP as i32), ..Default::default() };
    biz_types::create(&app.pool, "orders", &settings, CallbackHosts::Any).await.unwrap();
    let token = biz_types::create_token(&app.pool, "orders").await.unwrap();
    let _nodes = [chime_process(&app.db_url, &[]).await, chime_process(&app.db_url, &[]).await];
    let due = Utc::now() + chrono::Duration::seconds(1);
    let hot: Vec<Value> =
        (0..300).map(|i| json!({"biz_type": "orders", "run_at": due.to_rfc3339(), "flow_key": "hot", "payload": {"key": "hot", "i": i}})).collect();
    assert_eq!(app.post("/api/v1/tasks/batch", &token, json!({"tasks": hot})).await.status, 200);
    let later = due + chrono::Duration::milliseconds(50);
    let others: Vec<Value> = (0..10)
        .map(|i| json!({"biz_type": "orders", "run_at": later.to_rfc3339(), "flow_key": format!("k{i}"), "payload": {"key": format!("k{i}")}}))
        .collect();
    assert_eq!(app.post("/api/v1/tasks/batch", &token, json!({"tasks": others})).await.status, 200);

    // The ten others and a few of the herd: 10 + 2 per 300 ms.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let received = loop {
        let received = receiver.received();
        let others = received.iter().filter(|r| r.json()["payload"]["key"] != "hot").count();
        if others == 10 || tokio::time::Instant::now() > deadline {
            break received;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let first = received.iter().map(|r| r.at).min().expect("something delivered");
    let others: Vec<Duration> = received.iter().filter(|r| r.json()["payload"]["key"] != "hot").map(|r| r.at - first).collect();
    // Arrivals of one key closer together than a request's hold overlapped at the receiver.
    let mut by_key: HashMap<String, Vec<std::time::Instant>> = HashMap::new();
    for r in &received {
        by_key.entry(r.json()["payload"]["key"].as_str().unwrap().to_string()).or_default().push(r.at);
    }
    let mut peak = 0;
    for ats in by_key.values_mut() {
        ats.sort();
        for (i, at) in ats.iter().enumerate() {
            let overlapping = ats[..i].iter().filter(|earlier| *at - **earlier < HOLD - Duration::from_millis(30)).count() + 1;
            peak = peak.max(overlapping);
        }
    }
    println!("the other keys arrived {others:?} after the first callback; peak per key {peak}");
    assert_eq!(others.len(), 10, "every other key delivered while the herd waits: {others:?}");
    assert!(others.iter().all(|d| *d < Duration::from_secs(3)), "the other keys waited behind the herd: {others:?}");
    assert!(peak <= CAP, "{peak} callbacks of one key at once, over its cap of {CAP}");
    assert_eq!(peak, CAP, "the key's cap is used whole");
}

/// Ordered: key `a`'s tasks reach the receiver one at a time in run_at order. The first
/// fails once (500) and is snoozed once, and holds the key through both; the second is
/// cancelled before its turn; one due last is replaced to be due before the third, and
/// goes before it. Key `b` is not held back by `a`'s retries.
#[tokio::test]
async fn an_ordered_key_is_delivered_one_at_a_time_through_a_retry_a_snooze_and_a_cancel() {
    let app = spawn_app().await;
    let receiver = Receiver::start(vec![Answer::status(500), Answer::snooze("1")], Answer::status(200)).await;
    let settings = Settings {
        callback_url: Some(receiver.url.clone()),
        ordered: Some(true),
        backoff_initial_ms: Some(200),
        backoff_max_ms: Some(200),
        ..Default::default()
    };
    biz_types::create(&app.pool, "orders", &settings, CallbackHosts::Any).await.unwrap();
    let token = biz_types::create_token(&app.pool, "orders").await.unwrap();
    let now = Utc::now();
    let task = |name: &str, key: &str, ms: i64| json!({"biz_type": "orders", "run_at": (now + chrono::Duration::milliseconds(ms)).to_rfc3339(), "flow_key": key, "payload": name});
    let created = app.post("/api/v1/tasks/batch", &token, json!({"tasks": [task("a1", "a", 0), task("a2", "a", 10), task("a3", "a", 20)]})).await;
    assert_eq!(created.status, 200, "{}", created.body);
    let a2 = created.body["results"][1]["task"]["id"].as_str().unwrap().to_string();
    assert_eq!(app.delete(&format!("/api/v1/tasks/{a2}"), &token).await.status, 200);
    // Due after a3 as created; a replace moves it before a3, and its key follows.
    let mut late = task("a-late", "a", 5_000);
    late["key"] = json!("moved");
    app.create_task(&token, late).await;
    let mut moved = task("a-moved", "a", 15);
    moved["key"] = json!("moved");
    moved["on_conflict"] = json!("replace");
    assert_eq!(app.post("/api/v1/tasks", &token, moved).await.status, 200);

    let running = engine(&app).spawn();
    // a1 fails and is snoozed first: b1, created now, goes while a1 waits.
    let first_two = receiver.wait_for(2, Duration::from_secs(10)).await;
    assert_eq!(app.create_task(&token, task("b1", "b", 0)).await["status"], "pending");
    let received = receiver.wait_for(6, Duration::from_secs(20)).await;
    running.stop().await;
    let order: Vec<String> = received.iter().map(|r| r.json()["payload"].as_str().unwrap().to_string()).collect();
    println!("arrivals: {order:?}");
    assert_eq!(first_two.len(), 2);
    assert_eq!(first_two[0].json()["flow_key"], "a", "the callback names its flow key");
    let of_a: Vec<&str> = order.iter().map(String::as_str).filter(|p| p.starts_with('a')).collect();
    assert_eq!(of_a, ["a1", "a1", "a1", "a-moved", "a3"], "a1 held its key through its retry and snooze; a2 was cancelled");
    let b1 = order.iter().position(|p| p == "b1").expect("b1 delivered");
    let last_a1 = order.iter().rposition(|p| p == "a1").unwrap();
    assert!(b1 < last_a1, "b1 waited for key a: {order:?}");
    // One at a time: each of a's callbacks came after the one before was answered.
    let a_ats: Vec<_> = received.iter().filter(|r| r.json()["payload"].as_str().unwrap().starts_with('a')).map(|r| r.at).collect();
    assert!(a_ats.windows(2).all(|w| w[1] > w[0]));
}

/// Ordered: a head snoozed beyond the hot horizon (three days; it waits in cold storage)
/// still holds its key. The key's next task, due just after it, is not sent while tasks of
/// another key created later are.
#[tokio::test]
async fn an_ordered_key_s_head_snoozed_into_cold_storage_still_holds_its_key() {
    let app = spawn_app().await;
    let receiver = Receiver::start(vec![Answer::snooze("259200")], Answer::status(200)).await;
    let settings = Settings { callback_url: Some(receiver.url.clone()), ordered: Some(true), ..Default::default() };
    biz_types::create(&app.pool, "orders", &settings, CallbackHosts::Any).await.unwrap();
    let token = biz_types::create_token(&app.pool, "orders").await.unwrap();
    let now = Utc::now();
    let task = |name: &str, key: &str, ms: i64| json!({"biz_type": "orders", "run_at": (now + chrono::Duration::milliseconds(ms)).to_rfc3339(), "flow_key": key, "payload": name});
    let created = app.post("/api/v1/tasks/batch", &token, json!({"tasks": [task("a1", "a", 0), task("a2", "a", 10)]})).await;
    assert_eq!(created.status, 200, "{}", created.body);
    let a1 = created.body["results"][0]["task"]["id"].as_str().unwrap().to_string();

    let running = engine(&app).spawn();
    receiver.wait_for(1, Duration::from_secs(10)).await;
    wait_until("a1's snooze sending it to cold storage", Duration::from_secs(10), || async {
        let cold: i64 = sqlx::query_scalar("SELECT count(*) FROM tasks_cold WHERE id = $1::uuid AND status = 'pending' AND snoozes = 1")
            .bind(&a1)
            .fetch_one(&app.pool)
            .await
            .unwrap();
        cold == 1
    })
    .await;
    // Key b's tasks, one after the other: each is a turn in which a2, due before them, was looked at.
    for (i, name) in ["b1", "b2"].into_iter().enumerate() {
        app.create_task(&token, task(name, "b", 0)).await;
        receiver.wait_for(2 + i, Duration::from_secs(10)).await;
    }
    running.stop().await;
    let order: Vec<String> = receiver.received().iter().map(|r| r.json()["payload"].as_str().unwrap().to_string()).collect();
    assert_eq!(order, ["a1", "b1", "b2"], "a2 went while a1, snoozed into cold storage, held key a");
}

/// `flow_key` follows `key`'s rules and is answered with the task; a biz type's
/// `flow_max_in_flight` is 0 or more, and both are refused with 422 naming the field.
#[tokio::test]
async fn flow_keys_and_limits_are_validated_and_answered() {
    let app = spawn_app().await;
    let settings = Settings { callback_url: Some("http://127.0.0.1:9/".into()), paused: Some(true), ..Default::default() };
    biz_types::create(&app.pool, "orders", &settings, CallbackHosts::Any).await.unwrap();
    let token = biz_types::create_token(&app.pool, "orders").await.unwrap();
    let created = app.create_task(&token, json!({"biz_type": "orders", "flow_key": "merchant-7"})).await;
    assert_eq!(created["flow_key"], "merchant-7");
    let read = app.get(&format!("/api/v1/tasks/{}", created["id"].as_str().unwrap()), &token).await;
    assert_eq!(read.body["flow_key"], "merchant-7");
    for bad in [json!(""), json!("x".repeat(257))] {
        let reply = app.post("/api/v1/tasks", &token, json!({"biz_type": "orders", "flow_key": bad})).await;
        assert_eq!(reply.status, 422, "{}", reply.body);
        assert!(reply.message().contains("flow_key"), "{}", reply.body);
    }
    let refused = biz_types::update(&app.pool, "orders", &Settings { flow_max_in_flight: Some(-1), ..Default::default() }, CallbackHosts::Any).await;
    assert!(refused.unwrap_err().to_string().contains("flow_max_in_flight"));
}

/// Ordered, and the node delivering a key's first task is killed (`kill -9`) mid-callback:
/// the task holds its key while its lease runs out, is delivered again by another node, and
/// only then does the key's second task go.
#[tokio::test]
async fn an_ordered_key_s_task_holds_its_key_through_a_kill_of_its_node() {
    let app = spawn_app().await; // its leader recovers the dead node's lease
    let receiver = Receiver::start(vec![Answer { delay: Duration::from_secs(30), ..Answer::status(200) }], Answer::status(200)).await;
    let settings = Settings { callback_url: Some(receiver.url.clone()), ordered: Some(true), timeout_ms: Some(1000), ..Default::default() };
    biz_types::create(&app.pool, "orders", &settings, CallbackHosts::Any).await.unwrap();
    let token = biz_types::create_token(&app.pool, "orders").await.unwrap();
    let mut doomed = chime_process(&app.db_url, &[]).await;
    let now = Utc::now();
    let tasks: Vec<Value> = ["a1", "a2"]
        .iter()
        .enumerate()
        .map(|(i, name)| json!({"biz_type": "orders", "run_at": (now + chrono::Duration::milliseconds(10 * i as i64)).to_rfc3339(), "flow_key": "a", "payload": name}))
        .collect();
    assert_eq!(app.post("/api/v1/tasks/batch", &token, json!({"tasks": tasks})).await.status, 200);
    assert_eq!(receiver.wait_for(1, Duration::from_secs(10)).await.len(), 1, "a1 is being delivered");
    doomed.kill().await.unwrap(); // SIGKILL, a1's callback unanswered
    let _survivor = chime_process(&app.db_url, &[]).await;
    let received = receiver.wait_for(3, Duration::from_secs(30)).await;
    let order: Vec<String> = received.iter().map(|r| r.json()["payload"].as_str().unwrap().to_string()).collect();
    println!("arrivals: {order:?}, the second after {:?}", received.get(1).map(|r| r.at - received[0].at));
    assert_eq!(order, ["a1", "a1", "a2"], "a1 kept its key until delivered again");
}

/// A flow key is kept when its task moves to cold storage and back; the console shows it on
/// the task page, filters the task list by it within a biz type, and lists on the biz type's
/// page the ordered keys held by a task waiting for its retry.
#[tokio::test]
async fn the_console_shows_flow_keys_and_the_keys_held() {
    let app = spawn_app().await;
    let receiver = Receiver::start(vec![], Answer::status(503)).await;
    let settings = Settings {
        callback_url: Some(receiver.url.clone()),
        ordered: Some(true),
        backoff_initial_ms: Some(3_600_000),
        breaker_threshold: Some(0),
        ..Default::default()
    };
    biz_types::create(&app.pool, "orders", &settings, CallbackHosts::Any).await.unwrap();
    let token = biz_types::create_token(&app.pool, "orders").await.unwrap();
    // Thirty days ahead: cold storage; moved back by a PATCH, its flow key with it.
    let later = app.create_task(&token, json!({"biz_type": "orders", "flow_key": "m-2", "delay_ms": 30_i64 * 86_400_000})).await;
    let later_id = later["id"].as_str().unwrap();
    assert_eq!(app.table_of(later_id).await, "tasks_cold");
    let moved = app.patch(&format!("/api/v1/tasks/{later_id}"), &token, json!({"delay_ms": 3_600_000})).await;
    assert_eq!(moved.body["flow_key"], "m-2", "kept when moved into the partitions: {}", moved.body);
    let failing = app.create_task(&token, json!({"biz_type": "orders", "flow_key": "m-1"})).await;
    let id = failing["id"].as_str().unwrap();
    let mut engine = engine(&app);
    engine.turn().await;
    engine.settled().await;

    let admin = sign_in(&app, "admin", ADMIN_PASSWORD).await;
    let page = admin.get("/console/biz-types/orders").await;
    let held = page.body.split(r#"<dd id="held-keys">"#).nth(1).expect("the held keys are listed").split("</dd>").next().unwrap();
    assert!(held.contains("m-1") && held.contains(&format!("/console/tasks/{id}")) && held.contains("503"), "{held}");
    assert!(!held.contains("m-2"), "a key whose task was never tried is not held: {held}");
    let page = admin.get(&format!("/console/tasks/{id}")).await;
    assert!(page.body.contains(r#"<dd id="flow-key"><a href="/console/tasks?biz_type=orders&amp;flow_key=m-1">m-1</a>"#), "{}", page.body);
    let page = admin.get("/console/tasks?biz_type=orders&flow_key=m-1").await;
    assert_eq!(page.status, 200, "{}", page.body);
    assert!(page.body.contains(id) && !page.body.contains(later_id), "{}", page.body);
    let page = admin.get("/console/tasks?flow_key=m-1").await;
    assert_eq!(page.status, 422, "{}", page.body);
    assert!(page.body.contains(r#"data-field="flow_key""#) && page.body.contains("choose a biz type"), "{}", page.body);
}

/// `flow_rate_limit` 5: of 20 tasks of key `a` due at once, no more than 5 start within a
/// second, and key `b`'s tasks are not held back by `a`'s.
#[tokio::test]
async fn a_key_s_rate_holds_it_alone() {
    let app = spawn_app().await;
    let receiver = Receiver::start(vec![], Answer::status(200)).await;
    let settings = Settings { callback_url: Some(receiver.url.clone()), flow_rate_limit: Some(5.0), ..Default::default() };
    biz_types::create(&app.pool, "orders", &settings, CallbackHosts::Any).await.unwrap();
    let token = biz_types::create_token(&app.pool, "orders").await.unwrap();
    let mut items: Vec<Value> = (0..20).map(|i| json!({"biz_type": "orders", "flow_key": "a", "payload": format!("a{i}")})).collect();
    items.extend((0..3).map(|i| json!({"biz_type": "orders", "flow_key": "b", "payload": format!("b{i}")})));
    assert_eq!(app.post("/api/v1/tasks/batch", &token, json!({"tasks": items})).await.status, 200);
    let running = engine(&app).spawn();
    let received = receiver.wait_for(13, Duration::from_secs(10)).await;
    running.stop().await;
    let first = received.iter().map(|r| r.at).min().unwrap();
    let of = |key: char| -> Vec<Duration> {
        received.iter().filter(|r| r.json()["payload"].as_str().unwrap().starts_with(key)).map(|r| r.at - first).collect()
    };
    let (a, b) = (of('a'), of('b'));
    println!("a at {a:?}\nb at {b:?}");
    assert_eq!(b.len(), 3, "b's tasks delivered");
    assert!(b.iter().all(|d| *d < Duration::from_millis(500)), "b waited for a's rate: {b:?}");
    let most_in_a_second =
        a.iter().map(|start| a.iter().filter(|d| **d >= *start && **d < *start + Duration::from_millis(900)).count()).max().unwrap();
    assert!(most_in_a_second <= 5, "{most_in_a_second} of key a within a second, over its rate of 5: {a:?}");
    assert!(a.len() >= 10, "the rate is used: {a:?}");
}
