//! Priority inside a biz type (docs/design/claim.md, Priority): due tasks of higher priority
//! are called back first, and a tenth of the deliveries go to the longest-due tasks.

use std::time::Duration;

use chime::biz_types::{self, Settings};
use chime::callback_hosts::CallbackHosts;
use chrono::Utc;
use serde_json::json;

use crate::console::{ADMIN_PASSWORD, sign_in};
use crate::helpers::{engine, spawn_app};
use crate::receiver::{Answer, Receiver};

/// One callback at a time (max_in_flight 1), so the receiver sees the claim order: 5 tasks of
/// priority 9 due last, 20 of priority 5 before them and 5 of priority 0 due first. The
/// urgent ones go first; the default ones in due order; and the lowest are not left to the
/// end: every tenth claim takes the longest-due task, one of them.
#[tokio::test]
async fn due_tasks_go_by_priority_and_the_longest_due_are_not_starved() {
    let app = spawn_app().await;
    let receiver = Receiver::start(vec![], Answer::status(200)).await;
    let settings = Settings { callback_url: Some(receiver.url.clone()), max_in_flight: Some(1), ..Default::default() };
    biz_types::create(&app.pool, "orders", &settings, CallbackHosts::Any).await.unwrap();
    let token = biz_types::create_token(&app.pool, "orders").await.unwrap();
    let now = Utc::now();
    let mut items = Vec::new();
    for i in 0..5 {
        items.push(json!({"biz_type": "orders", "run_at": (now - chrono::Duration::seconds(60 - i)).to_rfc3339(), "priority": 0, "payload": format!("low-{i}")}));
    }
    for i in 0..20 {
        items
            .push(json!({"biz_type": "orders", "run_at": (now - chrono::Duration::seconds(40 - i)).to_rfc3339(), "payload": format!("default-{i}")}));
    }
    for i in 0..5 {
        items.push(json!({"biz_type": "orders", "run_at": (now - chrono::Duration::seconds(10 - i)).to_rfc3339(), "priority": 9, "payload": format!("urgent-{i}")}));
    }
    let created = app.post("/api/v1/tasks/batch", &token, json!({"tasks": items})).await;
    assert_eq!(created.status, 200, "{}", created.body);

    let running = engine(&app).spawn();
    let order: Vec<String> =
        receiver.wait_for(30, Duration::from_secs(30)).await.iter().map(|r| r.json()["payload"].as_str().unwrap().to_string()).collect();
    running.stop().await;
    assert_eq!(order.len(), 30, "every task delivered: {order:?}");
    let urgent: Vec<String> = (0..5).map(|i| format!("urgent-{i}")).collect();
    assert_eq!(order[..5], urgent[..], "the urgent ones first, in due order: {order:?}");
    let defaults: Vec<&String> = order.iter().filter(|p| p.starts_with("default-")).collect();
    let in_due_order: Vec<String> = (0..20).map(|i| format!("default-{i}")).collect();
    assert_eq!(defaults, in_due_order.iter().collect::<Vec<_>>(), "the default priority in due order");
    let last_default = order.iter().rposition(|p| p.starts_with("default-")).unwrap();
    let low_before = order[..last_default].iter().filter(|p| p.starts_with("low-")).count();
    assert!(low_before >= 2, "a tenth of the claims take the longest-due, low priority or not: {order:?}");
    assert_eq!(order[..last_default].iter().find(|p| p.starts_with("low-")).map(String::as_str), Some("low-0"), "the longest-due first");
}

/// Most claims are made without the priority branches (`lease::Pick::Plain`, cheaper on a
/// table of many partitions). One that finds a biz type with a task of another priority
/// due claims that biz type again with them in the same call, so the urgent task is leased
/// at once, and says so (`Claim::prioritized`) for the engine's next claims; a biz type
/// whose tasks are all of the default priority is claimed by the first statement, in due order.
#[tokio::test]
async fn a_claim_without_the_priority_branches_claims_a_prioritized_biz_type_again_with_them() {
    use chime::tasks::lease::{self, Want};
    let app = spawn_app().await;
    let settings = Settings { callback_url: Some("http://127.0.0.1:9/".into()), ..Default::default() };
    let mut ids = Vec::new();
    for name in ["orders", "plain"] {
        ids.push(biz_types::create(&app.pool, name, &settings, CallbackHosts::Any).await.unwrap().id);
        let token = biz_types::create_token(&app.pool, name).await.unwrap();
        let now = Utc::now();
        let mut items: Vec<_> = (0..3)
            .map(|i| json!({"biz_type": name, "run_at": (now - chrono::Duration::seconds(30 - i)).to_rfc3339(), "payload": format!("default-{i}")}))
            .collect();
        if name == "orders" {
            items.push(json!({"biz_type": name, "run_at": (now - chrono::Duration::seconds(1)).to_rfc3339(), "priority": 9, "payload": "urgent"}));
        }
        let created = app.post("/api/v1/tasks/batch", &token, json!({"tasks": items})).await;
        assert_eq!(created.status, 200, "{}", created.body);
    }
    let want = |biz_type_id| Want { biz_type_id, limit: 1, ahead_ms: 0, lease_ms: 60_000, oldest: 0, lane: None, flow: None, priorities: false };
    let claims = lease::claim(&app.pool, &[want(ids[0]), want(ids[1])], uuid::Uuid::new_v4(), None).await.unwrap();
    let orders = &claims[&ids[0]];
    assert!(orders.prioritized, "the claim says the biz type wants the priority branches");
    let payloads: Vec<&str> = orders.leased.iter().map(|t| t.payload.as_str()).collect();
    assert_eq!(payloads, ["\"urgent\""], "the urgent task leased in the same call");
    let plain = &claims[&ids[1]];
    assert!(!plain.prioritized);
    let payloads: Vec<&str> = plain.leased.iter().map(|t| t.payload.as_str()).collect();
    assert_eq!(payloads, ["\"default-0\""], "the longest-due of a biz type without priorities");
}

/// `priority` is 0 to 9, 5 when left out; it is answered with the task, kept when the task
/// moves to cold storage and back, changed by a PATCH and by a replace, shown on the
/// console's task page and a filter of its task list; anything else is refused with 422
/// naming the field.
#[tokio::test]
async fn priority_is_checked_kept_and_changed() {
    let app = spawn_app().await;
    let token = app.biz_type("orders").await;
    let plain = app.create_task(&token, json!({"biz_type": "orders"})).await;
    assert_eq!(plain["priority"], 5);

    for bad in [json!(10), json!(-1), json!(70000), json!(1.5), json!("high")] {
        let reply = app.post("/api/v1/tasks", &token, json!({"biz_type": "orders", "priority": bad})).await;
        assert_eq!(reply.status, 422, "{bad}: {}", reply.body);
        assert!(reply.message().contains("priority"), "{bad}: {}", reply.body);
        let reply = app.patch(&format!("/api/v1/tasks/{}", plain["id"].as_str().unwrap()), &token, json!({"priority": bad})).await;
        assert_eq!(reply.status, 422, "PATCH {bad}: {}", reply.body);
        assert!(reply.message().contains("priority"), "PATCH {bad}: {}", reply.body);
    }

    // Thirty days ahead: cold storage.
    let later = app.create_task(&token, json!({"biz_type": "orders", "key": "k", "delay_ms": 30_i64 * 86_400_000, "priority": 7})).await;
    let id = later["id"].as_str().unwrap();
    assert_eq!(app.table_of(id).await, "tasks_cold");
    assert_eq!(app.get(&format!("/api/v1/tasks/{id}"), &token).await.body["priority"], 7);
    let moved = app.patch(&format!("/api/v1/tasks/{id}"), &token, json!({"delay_ms": 60_000})).await;
    assert_eq!(moved.body["priority"], 7, "kept when moved into the partitions: {}", moved.body);
    assert!(app.table_of(id).await.starts_with("tasks_p"), "in a partition");
    let changed = app.patch(&format!("/api/v1/tasks/{id}"), &token, json!({"priority": 2})).await;
    assert_eq!(changed.body["priority"], 2, "{}", changed.body);
    let replaced = app.post("/api/v1/tasks", &token, json!({"biz_type": "orders", "key": "k", "on_conflict": "replace", "priority": 8})).await;
    assert_eq!((replaced.status, replaced.body["id"].as_str(), &replaced.body["priority"]), (200, Some(id), &json!(8)), "{}", replaced.body);
    let stored: i16 = sqlx::query_scalar("SELECT priority FROM tasks WHERE id = $1::uuid").bind(id).fetch_one(&app.pool).await.unwrap();
    assert_eq!(stored, 8);

    // The console's task page says it.
    let admin = sign_in(&app, "admin", ADMIN_PASSWORD).await;
    let page = admin.get(&format!("/console/tasks/{id}")).await;
    assert!(page.body.contains(r#"<dd id="priority">8 <span class="muted">(called back before the default)"#), "{}", page.body);
    // And its task list filters by it, within a biz type, by the API's rule.
    let page = admin.get("/console/tasks?biz_type=orders&priority=8").await;
    assert_eq!(page.status, 200, "{}", page.body);
    assert!(page.body.contains(id) && !page.body.contains(plain["id"].as_str().unwrap()), "{}", page.body);
    let page = admin.get("/console/tasks?biz_type=orders&priority=5").await;
    assert!(!page.body.contains(id) && page.body.contains(plain["id"].as_str().unwrap()), "{}", page.body);
    for (query, message) in
        [("biz_type=orders&priority=12", "from 0 to 9"), ("biz_type=orders&priority=high", "from 0 to 9"), ("priority=8", "choose a biz type")]
    {
        let page = admin.get(&format!("/console/tasks?{query}")).await;
        assert_eq!(page.status, 422, "{query}: {}", page.body);
        assert!(page.body.contains(r#"data-field="priority""#) && page.body.contains(message), "{query}: {}", page.body);
    }
}

/// A pull consumer reserves by priority too: ten reserved of a low-priority task due first,
/// eleven default ones and an urgent one due last are, in the order answered, the urgent
/// one, the first eight defaults, and the low one (a tenth of a reserve goes to the
/// longest-due task whatever its priority).
#[tokio::test]
async fn a_reserve_takes_the_urgent_first_and_a_tenth_by_age() {
    let app = spawn_app().await;
    let settings = Settings { mode: Some("pull".into()), ..Default::default() };
    biz_types::create(&app.pool, "jobs", &settings, CallbackHosts::Any).await.unwrap();
    let token = biz_types::create_token(&app.pool, "jobs").await.unwrap();
    let due = |i: i64| (Utc::now() - chrono::Duration::seconds(60 - i)).to_rfc3339();
    let mut items = vec![json!({"biz_type": "jobs", "run_at": due(0), "priority": 0, "payload": "low"})];
    items.extend((1..12).map(|i| json!({"biz_type": "jobs", "run_at": due(i), "payload": format!("default-{i}")})));
    items.push(json!({"biz_type": "jobs", "priority": 9, "payload": "urgent"}));
    let created = app.post("/api/v1/tasks/batch", &token, json!({"tasks": items})).await;
    assert_eq!(created.status, 200, "{}", created.body);

    let reply = app.post("/api/v1/biz-types/jobs/reserve", &token, json!({"max": 10, "ttr_ms": 60000})).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let got: Vec<&str> = reply.body["tasks"].as_array().unwrap().iter().map(|t| t["payload"].as_str().unwrap()).collect();
    let mut expected = vec!["urgent".to_string()];
    expected.extend((1..9).map(|i| format!("default-{i}")));
    expected.push("low".into());
    assert_eq!(got, expected.iter().map(String::as_str).collect::<Vec<_>>());
}
