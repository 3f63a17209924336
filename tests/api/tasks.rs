use chrono::{DateTime, Duration, DurationRound, Utc};
use serde_json::{Value, json};

use crate::helpers::spawn_app;

fn time(v: &Value) -> DateTime<Utc> {
    v.as_str().unwrap().parse().unwrap()
}

/// A time as PostgreSQL keeps it: to the microsecond.
fn micros(t: DateTime<Utc>) -> DateTime<Utc> {
    t.duration_trunc(Duration::microseconds(1)).unwrap()
}

/// A create answers 201 with the task in the API's shape (docs/book/src/api.md, the OpenAPI document), and GET returns it with attempts.
#[tokio::test]
async fn create_then_get_returns_the_task_with_attempts() {
    let app = spawn_app().await;
    let token = app.biz_type("orders").await;

    let before = Utc::now();
    let task = app.create_task(&token, json!({"biz_type": "orders", "key": "order-1", "delay_ms": 60000, "payload": {"order": 1}})).await;

    for field in
        ["id", "biz_type", "key", "run_at", "payload", "status", "attempt_count", "timer_id", "last_error", "created_at", "updated_at", "finished_at"]
    {
        assert!(task.get(field).is_some(), "missing {field} in {task}");
    }
    assert_eq!(task["biz_type"], "orders");
    assert_eq!(task["status"], "pending");
    assert_eq!(task["payload"], json!({"order": 1}));
    let run_at = time(&task["run_at"]);
    assert!(run_at >= before + Duration::seconds(59) && run_at <= Utc::now() + Duration::seconds(61), "{run_at}");

    let got = app.get(&format!("/api/v1/tasks/{}", task["id"].as_str().unwrap()), &token).await;
    assert_eq!(got.status, 200);
    assert_eq!(got.body["id"], task["id"]);
    assert_eq!(got.body["attempts"], json!([]));
}

/// Without run_at or delay_ms a task is due now; run_at is kept as given.
#[tokio::test]
async fn run_at_defaults_to_now_and_is_kept_as_given() {
    let app = spawn_app().await;
    let token = app.biz_type("orders").await;
    let now_task = app.create_task(&token, json!({"biz_type": "orders"})).await;
    assert!((time(&now_task["run_at"]) - Utc::now()).num_seconds().abs() <= 5);
    assert_eq!(now_task["payload"], Value::Null);

    let at = (Utc::now() + Duration::hours(3)).with_timezone(&chrono::FixedOffset::east_opt(8 * 3600).unwrap());
    let task = app.create_task(&token, json!({"biz_type": "orders", "run_at": at.to_rfc3339()})).await;
    assert_eq!(time(&task["run_at"]), micros(at.with_timezone(&Utc)));
}

/// Same key and same request → 200 with the same task (key order and spacing do not
/// matter, and a repeated delay_ms is a repeat); same key, different request → 409.
#[tokio::test]
async fn create_is_idempotent_on_key() {
    let app = spawn_app().await;
    let token = app.biz_type("orders").await;
    let first = app.create_task(&token, json!({"biz_type": "orders", "key": "k1", "delay_ms": 5000, "payload": {"a": 1, "b": 2}})).await;

    let again = app
        .request(
            "POST",
            "/api/v1/tasks",
            Some(&token),
            Some(br#"{ "payload": {"b": 2, "a": 1}, "delay_ms": 5000, "key": "k1", "biz_type": "orders" }"#.to_vec()),
        )
        .await;
    assert_eq!(again.status, 200, "{}", again.body);
    assert_eq!(again.body, first, "the existing task, unchanged");

    let different = app.post("/api/v1/tasks", &token, json!({"biz_type": "orders", "key": "k1", "delay_ms": 6000})).await;
    assert_eq!(different.status, 409);
    assert_eq!(different.code(), "key_conflict");
    assert!(different.message().contains("k1"));

    // The key is per biz type: another biz type may use it.
    let other = app.biz_type("coupons").await;
    app.create_task(&other, json!({"biz_type": "coupons", "key": "k1"})).await;

    let count: i64 = sqlx::query_scalar("SELECT count(*) FROM all_tasks").fetch_one(&app.pool).await.unwrap();
    assert_eq!(count, 2);
}

/// Racing creates with one key make exactly one task.
#[tokio::test]
async fn concurrent_creates_with_one_key_make_one_task() {
    let app = spawn_app().await;
    let token = app.biz_type("orders").await;
    let body = json!({"biz_type": "orders", "key": "race", "payload": {"x": 1}});
    let replies = futures_util::future::join_all((0..16).map(|_| app.post("/api/v1/tasks", &token, body.clone()))).await;
    let created = replies.iter().filter(|r| r.status == 201).count();
    let repeated = replies.iter().filter(|r| r.status == 200).count();
    assert_eq!((created, repeated), (1, 15), "{:?}", replies.iter().map(|r| r.status).collect::<Vec<_>>());
    let ids: std::collections::HashSet<_> = replies.iter().map(|r| r.body["id"].clone()).collect();
    assert_eq!(ids.len(), 1);
}

/// A batch answers one result per item in order: created, repeated, or an error of its own.
#[tokio::test]
async fn batch_create_gives_per_item_results_in_order() {
    let app = spawn_app().await;
    let token = app.biz_type("orders").await;
    app.biz_type("coupons").await;
    app.create_task(&token, json!({"biz_type": "orders", "key": "old"})).await;

    let reply = app
        .post(
            "/api/v1/tasks/batch",
            &token,
            json!({"tasks": [
                {"biz_type": "orders", "key": "a", "payload": 1},
                {"biz_type": "orders", "key": "old"},
                {"biz_type": "orders", "key": "old", "payload": "changed"},
                {"biz_type": "orders", "delay_ms": -1},
                {"biz_type": "coupons"},
                {"biz_type": "nosuch"},
                {"biz_type": "orders", "payload": {"bad": "\u{0}"}},
                {"biz_type": "orders", "key": "a", "payload": 1},
                {"biz_type": "orders", "key": "a", "payload": 2},
                {"biz_type": "orders", "run_at": "2030-02-30T00:00:00Z"},
                {"biz_type": "orders"},
                "not an object",
            ]}),
        )
        .await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let results = reply.body["results"].as_array().unwrap();
    let statuses: Vec<u64> = results.iter().map(|r| r["status"].as_u64().unwrap()).collect();
    assert_eq!(statuses, [201, 200, 409, 422, 403, 404, 422, 200, 409, 422, 201, 422]);
    assert_eq!(results[7]["task"]["id"], results[0]["task"]["id"], "a repeat inside the batch answers with the first");
    assert!(results[3]["error"]["message"].as_str().unwrap().contains("delay_ms"));
    assert!(results[9]["error"]["message"].as_str().unwrap().contains("tasks[9]: run_at"));

    let count: i64 = sqlx::query_scalar("SELECT count(*) FROM all_tasks").fetch_one(&app.pool).await.unwrap();
    assert_eq!(count, 3, "old, a, and the unkeyed one");
}

/// In a batch, an item that repeats the request that took its key before is a repeat
/// (200), even after an item with the same key and another body (409). It was answered
/// from that first item, as a conflict.
#[tokio::test]
async fn batch_repeat_after_a_conflicting_item_is_still_a_repeat() {
    let app = spawn_app().await;
    let token = app.biz_type("orders").await;
    let first = app.create_task(&token, json!({"biz_type": "orders", "key": "k"})).await;

    let reply = app
        .post(
            "/api/v1/tasks/batch",
            &token,
            json!({"tasks": [{"biz_type": "orders", "key": "k", "payload": "other"}, {"biz_type": "orders", "key": "k"}]}),
        )
        .await;

    assert_eq!(reply.status, 200, "{}", reply.body);
    let results = reply.body["results"].as_array().unwrap();
    let statuses: Vec<u64> = results.iter().map(|r| r["status"].as_u64().unwrap()).collect();
    assert_eq!(statuses, [409, 200], "{}", reply.body);
    assert_eq!(results[1]["task"]["id"], first["id"]);
}

/// A full batch of 1000 is accepted; 1001 or none is refused.
#[tokio::test]
async fn batch_holds_up_to_1000_tasks() {
    let app = spawn_app().await;
    let token = app.biz_type("orders").await;
    let items: Vec<Value> = (0..1000).map(|i| json!({"biz_type": "orders", "key": format!("k{i}"), "delay_ms": i})).collect();
    let reply = app.post("/api/v1/tasks/batch", &token, json!({"tasks": items})).await;
    assert_eq!(reply.status, 200);
    assert!(reply.body["results"].as_array().unwrap().iter().all(|r| r["status"] == 201));
    let count: i64 = sqlx::query_scalar("SELECT count(*) FROM tasks").fetch_one(&app.pool).await.unwrap();
    assert_eq!(count, 1000);

    let too_many: Vec<Value> = (0..1001).map(|_| json!({"biz_type": "orders"})).collect();
    let reply = app.post("/api/v1/tasks/batch", &token, json!({"tasks": too_many})).await;
    assert_eq!((reply.status, reply.code()), (422, "invalid_argument"));
    assert!(reply.message().contains("tasks"));
    let reply = app.post("/api/v1/tasks/batch", &token, json!({"tasks": []})).await;
    assert_eq!(reply.status, 422);
}

/// A new task is answered from what the client sent and what the database decided at the
/// insert (not read back): the answer is the task exactly as GET then shows it, every
/// field, whether it went to a hot partition or to cold storage, alone or in a batch.
#[tokio::test]
async fn a_created_task_is_answered_as_it_is_stored() {
    let app = spawn_app().await;
    let token = app.biz_type("orders").await;
    let parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let next_year = (Utc::now() + Duration::days(365)).to_rfc3339();
    let single = app
        .client
        .post(format!("{}/api/v1/tasks", app.address))
        .bearer_auth(&token)
        .header("traceparent", parent)
        .json(&json!({"biz_type": "orders", "key": "k-1", "delay_ms": 60000, "ttl_ms": 5000, "payload": {"order": 1, "n": 1.50}}))
        .send()
        .await
        .unwrap();
    assert_eq!(single.status(), 201);
    let mut answered = vec![single.json::<Value>().await.unwrap()];
    let batch = app
        .post(
            "/api/v1/tasks/batch",
            &token,
            json!({"tasks": [
                {"biz_type": "orders", "run_at": next_year, "expires_at": (Utc::now() + Duration::days(366)).to_rfc3339(), "payload": [1, "two"]},
                {"biz_type": "orders", "key": "k-2"},
            ]}),
        )
        .await;
    assert_eq!(batch.status, 200, "{}", batch.body);
    answered.extend(batch.body["results"].as_array().unwrap().iter().map(|r| r["task"].clone()));
    assert_eq!(app.table_of(answered[1]["id"].as_str().unwrap()).await, "tasks_cold");

    for task in answered {
        let mut got = app.get(&format!("/api/v1/tasks/{}", task["id"].as_str().unwrap()), &token).await.body;
        got.as_object_mut().unwrap().remove("attempts");
        got.as_object_mut().unwrap().remove("attempt_total");
        assert_eq!(got, task, "GET shows the task as its create answered it");
    }
}

/// With `"results": "ids"`, a created or repeated item answers its status and id only, the
/// id of the task it names; a failed item answers as without it. `"tasks"` or null is the
/// default, the whole task.
#[tokio::test]
async fn batch_answers_ids_only_when_asked() {
    let app = spawn_app().await;
    let token = app.biz_type("orders").await;
    let old = app.create_task(&token, json!({"biz_type": "orders", "key": "old"})).await;
    let items = json!([
        {"biz_type": "orders", "key": "a", "payload": 1},
        {"biz_type": "orders", "key": "old"},
        {"biz_type": "orders", "key": "old", "payload": "changed"},
        {"biz_type": "orders", "delay_ms": -1},
        {"biz_type": "nosuch"},
        {"biz_type": "orders"},
    ]);
    let reply = app.post("/api/v1/tasks/batch", &token, json!({"tasks": items, "results": "ids"})).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let results = reply.body["results"].as_array().unwrap();
    let statuses: Vec<u64> = results.iter().map(|r| r["status"].as_u64().unwrap()).collect();
    assert_eq!(statuses, [201, 200, 409, 422, 404, 201]);
    for i in [0, 1, 5] {
        let fields: Vec<&String> = results[i].as_object().unwrap().keys().collect();
        assert_eq!(fields, ["id", "status"], "{}", results[i]);
    }
    assert_eq!(results[1]["id"], old["id"], "a repeat names the task its key holds");
    let a = app.get(&format!("/api/v1/tasks/{}", results[0]["id"].as_str().unwrap()), &token).await;
    assert_eq!((a.status, &a.body["key"], &a.body["payload"]), (200, &json!("a"), &json!(1)));
    let unkeyed = app.get(&format!("/api/v1/tasks/{}", results[5]["id"].as_str().unwrap()), &token).await;
    assert_eq!((unkeyed.status, &unkeyed.body["key"]), (200, &Value::Null));

    // The failed items, and repeats, answer the same without the option.
    let full = app.post("/api/v1/tasks/batch", &token, json!({"tasks": items})).await;
    let full = full.body["results"].as_array().unwrap();
    for i in [2, 3, 4] {
        assert_eq!(results[i], full[i], "a failed item answers the same either way");
    }
    assert_eq!(full[0]["task"]["id"], results[0]["id"], "a repeat of the first item");
    assert_eq!(full[0]["status"], 200);
    for results in [json!("tasks"), Value::Null] {
        let reply = app.post("/api/v1/tasks/batch", &token, json!({"tasks": [{"biz_type": "orders"}], "results": results})).await;
        assert_eq!(reply.status, 200, "{}", reply.body);
        assert_eq!(reply.body["results"][0]["status"], 201);
        assert_eq!(reply.body["results"][0]["task"]["status"], "pending", "{}", reply.body);
    }
}

/// `results` other than `tasks` or `ids` is refused (422, naming it), and nothing is created.
#[tokio::test]
async fn batch_refuses_an_unknown_results_option() {
    let app = spawn_app().await;
    let token = app.biz_type("orders").await;
    for results in [json!("id"), json!("IDS"), json!(""), json!(1), json!(["ids"])] {
        let reply = app.post("/api/v1/tasks/batch", &token, json!({"tasks": [{"biz_type": "orders"}], "results": results})).await;
        assert_eq!((reply.status, reply.code()), (422, "invalid_argument"), "{results}: {}", reply.body);
        assert!(reply.message().starts_with("results: "), "{results}: {}", reply.message());
    }
    let count: i64 = sqlx::query_scalar("SELECT count(*) FROM all_tasks").fetch_one(&app.pool).await.unwrap();
    assert_eq!(count, 0);
}

/// A task due within the hot horizon lands in that day's partition; one due next year in
/// cold storage. Both are found by id and listed.
#[tokio::test]
async fn tasks_land_in_hot_partitions_or_cold_storage() {
    let app = spawn_app().await;
    let token = app.biz_type("orders").await;
    let soon = app.create_task(&token, json!({"biz_type": "orders", "delay_ms": 3_600_000})).await;
    let next_year = app.create_task(&token, json!({"biz_type": "orders", "run_at": (Utc::now() + Duration::days(365)).to_rfc3339()})).await;

    let day = time(&soon["run_at"]).format("%Y%m%d");
    assert_eq!(app.table_of(soon["id"].as_str().unwrap()).await, format!("tasks_p{day}"));
    assert_eq!(app.table_of(next_year["id"].as_str().unwrap()).await, "tasks_cold");

    let got = app.get(&format!("/api/v1/tasks/{}", next_year["id"].as_str().unwrap()), &token).await;
    assert_eq!(got.status, 200);
    let list = app.get("/api/v1/tasks", &token).await;
    let ids: Vec<&Value> = list.body["items"].as_array().unwrap().iter().map(|t| &t["id"]).collect();
    assert_eq!(ids, [&soon["id"], &next_year["id"]], "ordered by run_at across hot and cold");
}

#[tokio::test]
async fn get_by_key_finds_the_task() {
    let app = spawn_app().await;
    let token = app.biz_type("orders").await;
    let task = app.create_task(&token, json!({"biz_type": "orders", "key": "order/7 ü"})).await;

    let reply = app.get("/api/v1/biz-types/orders/tasks/by-key/order%2F7%20%C3%BC", &token).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(reply.body["id"], task["id"]);

    let missing = app.get("/api/v1/biz-types/orders/tasks/by-key/nope", &token).await;
    assert_eq!((missing.status, missing.code()), (404, "not_found"));
    let unknown_type = app.get("/api/v1/biz-types/nosuch/tasks/by-key/x", &token).await;
    assert_eq!(unknown_type.status, 404);
}

/// Keyset pagination visits every task once, in run_at order, and filters hold.
#[tokio::test]
async fn list_paginates_and_filters() {
    let app = spawn_app().await;
    let token = app.biz_type("orders").await;
    let other = app.biz_type("coupons").await;
    app.create_task(&other, json!({"biz_type": "coupons"})).await;
    let base = Utc::now() + Duration::minutes(10);
    let items: Vec<Value> =
        (0..25).map(|i| json!({"biz_type": "orders", "run_at": (base + Duration::seconds(i % 5)).to_rfc3339(), "payload": i})).collect();
    let created = app.post("/api/v1/tasks/batch", &token, json!({"tasks": items})).await;
    // Pending and finished tasks are read through different indexes: pages must merge them.
    for result in created.body["results"].as_array().unwrap().iter().step_by(3) {
        app.force_status(result["task"]["id"].as_str().unwrap(), "succeeded").await;
    }

    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        let path = match &cursor {
            Some(c) => format!("/api/v1/tasks?biz_type=orders&limit=10&cursor={c}"),
            None => "/api/v1/tasks?limit=10".to_string(),
        };
        let page = app.get(&path, &token).await;
        assert_eq!(page.status, 200, "{}", page.body);
        pages += 1;
        seen.extend(page.body["items"].as_array().unwrap().iter().cloned());
        match page.body["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => break,
        }
    }
    assert_eq!(pages, 3);
    assert_eq!(seen.len(), 25);
    let keys: Vec<(DateTime<Utc>, String)> = seen.iter().map(|t| (time(&t["run_at"]), t["id"].as_str().unwrap().to_string())).collect();
    let mut sorted = keys.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(keys, sorted, "strictly ordered, no repeats");
    assert!(seen.iter().all(|t| t["biz_type"] == "orders"));
    let succeeded = app.get("/api/v1/tasks?status=succeeded&limit=1000", &token).await;
    assert_eq!(succeeded.body["items"].as_array().unwrap().len(), 9);

    // Time range: [base+1s, base+3s) holds payloads with i % 5 in {1, 2}.
    let from = (base + Duration::seconds(1)).to_rfc3339().replace('+', "%2B");
    let to = (base + Duration::seconds(3)).to_rfc3339().replace('+', "%2B");
    let ranged = app.get(&format!("/api/v1/tasks?from={from}&to={to}&limit=1000"), &token).await;
    assert_eq!(ranged.status, 200, "{}", ranged.body);
    assert_eq!(ranged.body["items"].as_array().unwrap().len(), 10);

    let first = seen.iter().find(|t| t["status"] == "pending").unwrap()["id"].as_str().unwrap();
    assert_eq!(app.delete(&format!("/api/v1/tasks/{first}"), &token).await.status, 200);
    let cancelled = app.get("/api/v1/tasks?status=cancelled", &token).await;
    let items = cancelled.body["items"].as_array().unwrap();
    assert_eq!(items.len(), 1);
    assert_eq!(items[0]["id"], first);
}

/// PATCH moves a pending task in time (between hot and cold storage too) and replaces its
/// payload; a task that is running or finished cannot be changed.
#[tokio::test]
async fn reschedule_changes_pending_tasks_only() {
    let app = spawn_app().await;
    let token = app.biz_type("orders").await;
    let task = app.create_task(&token, json!({"biz_type": "orders", "key": "r", "delay_ms": 1000, "payload": {"v": 1}})).await;
    let id = task["id"].as_str().unwrap();
    let path = format!("/api/v1/tasks/{id}");

    let far = Utc::now() + Duration::days(200);
    let reply = app.patch(&path, &token, json!({"run_at": far.to_rfc3339()})).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(time(&reply.body["run_at"]), micros(far));
    assert_eq!(reply.body["payload"], json!({"v": 1}), "payload kept");
    assert_eq!(app.table_of(id).await, "tasks_cold");

    let reply = app.patch(&path, &token, json!({"delay_ms": 120000, "payload": {"v": 2}})).await;
    assert_eq!(reply.status, 200);
    assert_eq!(reply.body["payload"], json!({"v": 2}));
    assert!(time(&reply.body["run_at"]) < Utc::now() + Duration::minutes(3));
    assert!(app.table_of(id).await.starts_with("tasks_p"));
    assert_eq!(reply.body["id"], task["id"]);
    assert_eq!(reply.body["created_at"], task["created_at"]);

    let reply = app.patch(&path, &token, json!({"payload": [1, 2]})).await;
    assert_eq!(reply.status, 200);
    assert_eq!(reply.body["payload"], json!([1, 2]));
    let by_key = app.get("/api/v1/biz-types/orders/tasks/by-key/r", &token).await;
    assert_eq!(by_key.body["payload"], json!([1, 2]), "the key still finds the moved task");
    assert_eq!(by_key.body["id"], task["id"]);

    let reply = app.patch(&path, &token, json!({"payload": null})).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(reply.body["payload"], Value::Null);

    let reply = app.patch(&path, &token, json!({})).await;
    assert_eq!(reply.status, 422);

    for status in ["running", "succeeded", "failed"] {
        app.force_status(id, status).await;
        let reply = app.patch(&path, &token, json!({"delay_ms": 5})).await;
        assert_eq!((reply.status, reply.code()), (409, "invalid_state"), "{status}");
        assert!(reply.message().contains(status));
    }

    let missing = app.patch(&format!("/api/v1/tasks/{}", uuid::Uuid::now_v7()), &token, json!({"delay_ms": 5})).await;
    assert_eq!(missing.status, 404);
}

/// DELETE cancels a pending task (hot or cold); a second cancel, or cancelling a running
/// task, is a conflict.
#[tokio::test]
async fn cancel_applies_to_pending_tasks() {
    let app = spawn_app().await;
    let token = app.biz_type("orders").await;
    for run_at in [Utc::now() + Duration::minutes(5), Utc::now() + Duration::days(300)] {
        let task = app.create_task(&token, json!({"biz_type": "orders", "run_at": run_at.to_rfc3339()})).await;
        let path = format!("/api/v1/tasks/{}", task["id"].as_str().unwrap());
        let reply = app.delete(&path, &token).await;
        assert_eq!(reply.status, 200, "{}", reply.body);
        assert_eq!(reply.body["status"], "cancelled");
        assert!(reply.body["finished_at"].is_string());
        assert_eq!(app.delete(&path, &token).await.status, 409);
    }

    let running = app.create_task(&token, json!({"biz_type": "orders"})).await;
    let id = running["id"].as_str().unwrap();
    app.force_status(id, "running").await;
    let reply = app.delete(&format!("/api/v1/tasks/{id}"), &token).await;
    assert_eq!(reply.status, 409);

    let audited: i64 = sqlx::query_scalar("SELECT count(*) FROM audit_log WHERE action = 'task.cancel'").fetch_one(&app.pool).await.unwrap();
    assert_eq!(audited, 2);
}

/// Replay puts a finished task back to pending, due now, with a fresh attempt count; a
/// pending or running task cannot be replayed.
#[tokio::test]
async fn replay_requeues_finished_tasks() {
    let app = spawn_app().await;
    let token = app.biz_type("orders").await;
    let task = app.create_task(&token, json!({"biz_type": "orders", "key": "rp", "delay_ms": 600000})).await;
    let id = task["id"].as_str().unwrap();
    let path = format!("/api/v1/tasks/{id}/replay");

    assert_eq!(app.post(&path, &token, json!({})).await.status, 409, "pending");
    app.force_status(id, "running").await;
    assert_eq!(app.post(&path, &token, json!({})).await.status, 409, "running");

    sqlx::query("UPDATE tasks SET attempt_count = 10, last_error = 'HTTP 500' WHERE id = $1::uuid").bind(id).execute(&app.pool).await.unwrap();
    for status in ["failed", "succeeded", "cancelled"] {
        app.force_status(id, status).await;
        let reply = app.post(&path, &token, json!({})).await;
        assert_eq!(reply.status, 200, "{status}: {}", reply.body);
        assert_eq!(reply.body["status"], "pending");
        assert_eq!(reply.body["attempt_count"], 0);
        assert_eq!(reply.body["finished_at"], Value::Null);
        assert!((time(&reply.body["run_at"]) - Utc::now()).num_seconds().abs() <= 5, "due now");
    }
    let by_key = app.get("/api/v1/biz-types/orders/tasks/by-key/rp", &token).await;
    assert_eq!(by_key.body["id"], task["id"]);
}

/// The create rate limit of a biz type answers 429 with Retry-After once spent.
#[tokio::test]
async fn create_rate_limit_answers_429_with_retry_after() {
    let app = spawn_app().await;
    let token = app.biz_type("orders").await;
    sqlx::query("UPDATE biz_types SET create_rate_limit = 0.1").execute(&app.pool).await.unwrap();
    let mut statuses = Vec::new();
    for _ in 0..4 {
        let reply = app.post("/api/v1/tasks", &token, json!({"biz_type": "orders"})).await;
        if reply.status == 429 {
            assert_eq!(reply.code(), "rate_limited");
            let retry: u64 = reply.headers["retry-after"].to_str().unwrap().parse().unwrap();
            assert!(retry >= 1);
        }
        statuses.push(reply.status);
    }
    assert_eq!(statuses, [201, 429, 429, 429], "one call per 10 s, burst of one");
}

/// The payload is opaque: numbers beyond what a double holds exactly come back as sent,
/// and extreme ones do not break reading the task back.
#[tokio::test]
async fn payload_numbers_round_trip_exactly() {
    let app = spawn_app().await;
    let token = app.biz_type("orders").await;
    let body = r#"{"biz_type": "orders", "key": "n", "payload": {"big": 123456789012345678901234567890, "id": 18446744073709551615, "tenth": 0.1, "max": 1.7976931348623157e308}}"#;
    let created = app.request("POST", "/api/v1/tasks", Some(&token), Some(body.as_bytes().to_vec())).await;
    assert_eq!(created.status, 201, "{}", created.body);
    let got = app.get(&format!("/api/v1/tasks/{}", created.body["id"].as_str().unwrap()), &token).await;
    assert_eq!(got.status, 200, "{}", got.body);
    let payload = &got.body["payload"];
    assert_eq!(payload["big"].to_string(), "123456789012345678901234567890");
    assert_eq!(payload["id"].to_string(), "18446744073709551615");
    assert_eq!(payload["tenth"].to_string(), "0.1");
    assert_eq!(payload["max"].as_f64(), Some(f64::MAX));
    let list = app.get("/api/v1/tasks", &token).await;
    assert_eq!(list.status, 200);
    let again = app.request("POST", "/api/v1/tasks", Some(&token), Some(body.as_bytes().to_vec())).await;
    assert_eq!(again.status, 200, "an idempotent repeat reads the stored task back: {}", again.body);
}

/// Racing creates with one key and different bodies, written together in one statement:
/// the first wins, every other answers 409, and only one task exists.
#[tokio::test]
async fn concurrent_creates_with_one_key_and_different_bodies_conflict() {
    let app = spawn_app().await;
    let token = app.biz_type("orders").await;
    let replies = futures_util::future::join_all(
        (0..16).map(|i| app.post("/api/v1/tasks", &token, json!({"biz_type": "orders", "key": "race", "payload": {"x": i}}))),
    )
    .await;
    let statuses: Vec<u16> = replies.iter().map(|r| r.status).collect();
    assert_eq!(statuses.iter().filter(|s| **s == 201).count(), 1, "{statuses:?}");
    assert_eq!(statuses.iter().filter(|s| **s == 409).count(), 15, "{statuses:?}");
    let count: i64 = sqlx::query_scalar("SELECT count(*) FROM tasks").fetch_one(&app.pool).await.unwrap();
    assert_eq!(count, 1);
}

/// The size the payload limit measures is what PostgreSQL stores and prints
/// (`octet_length(payload::jsonb::text)`): for each payload, the limit at exactly that size
/// accepts it and one byte less refuses it.
#[tokio::test]
async fn payload_size_is_measured_as_postgresql_prints_it() {
    let app = spawn_app().await;
    let payloads = [
        "null",
        "true",
        "[false]",
        "0",
        "-0",
        "-0.0",
        "-0.00e1",
        "1e308",
        "-1.7976931348623157E+308",
        "1e-308",
        "0.5e-308",
        "1.5e-3",
        "-123.456e-5",
        "0.05e1",
        "12.500",
        "1.23e+5",
        "123456789012345678901234567890",
        "[1,2,3]",
        "{\"b\":1,\"a\":[{},[],{\"c\":null}]}",
        "  { \"a\" : [ 1 ,\n 2 ] }  ",
        r#""plain""#,
        r#""\"\\\/\b\f\n\r\t""#,
        r#""\u0001\u001f\u007f\u0080\u00e9\u20ac\uFFFF""#,
        r#""\ud83d\ude00 😀 é €""#,
        r#"{"ключ": "значение", "\u00e9": "\u0041"}"#,
        r#"[1e10, -2.5E-2, 3.000, {"x": [0.1e1, 10e-1]}]"#,
    ];
    for text in payloads {
        let raw: Box<serde_json::value::RawValue> = serde_json::from_str(text).unwrap();
        let stored: i32 = sqlx::query_scalar("SELECT octet_length($1::jsonb::text)").bind(text).fetch_one(&app.pool).await.unwrap();
        let stored = stored as usize;
        assert!(chime::tasks::check_payload(&raw, stored).is_ok(), "{text}: PostgreSQL prints {stored} bytes, refused at that limit");
        assert!(
            matches!(chime::tasks::check_payload(&raw, stored - 1), Err(chime::error::Error::TooLarge(_))),
            "{text}: PostgreSQL prints {stored} bytes, accepted at a limit one less"
        );
    }
}

/// About 54 KB of `1e308` (2.8 MB once PostgreSQL writes the numbers out; under the limit
/// however its numbers are written compactly, so the old check took it) is refused with
/// 413 wherever a payload is stored: a create, a batch item, a task PATCH, a timer create and
/// update. Nothing is stored or changed; a payload of exactly the limit as stored is taken.
#[tokio::test]
async fn payloads_are_limited_by_their_size_as_stored() {
    let app = spawn_app().await;
    let token = app.biz_type("orders").await;
    let numbers = format!("[{}]", vec!["1e308"; 9_000].join(","));
    assert!(numbers.len() < 55_000);
    let expect_413 = |reply: &crate::helpers::Reply, what: &str| {
        assert_eq!(reply.status, 413, "{what}: {:.200}", reply.body.to_string());
        assert_eq!(reply.code(), "payload_too_large", "{what}");
        let message = reply.message();
        assert!(message.contains("payload is 2799000 bytes as stored") && message.contains("1e308 takes 309 bytes"), "{what}: {message}");
    };

    let create = format!(r#"{{"biz_type": "orders", "payload": {numbers}}}"#);
    expect_413(&app.request("POST", "/api/v1/tasks", Some(&token), Some(create.clone().into_bytes())).await, "create");
    let batch = format!(r#"{{"tasks": [{create}, {{"biz_type": "orders", "delay_ms": 600000}}]}}"#);
    let reply = app.request("POST", "/api/v1/tasks/batch", Some(&token), Some(batch.into_bytes())).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!((&reply.body["results"][0]["status"], &reply.body["results"][1]["status"]), (&json!(413), &json!(201)), "{}", reply.body);
    let message = reply.body["results"][0]["error"]["message"].as_str().unwrap();
    assert!(message.starts_with("tasks[0]: payload is 2799000 bytes as stored"), "{message}");
    let kept = reply.body["results"][1]["task"].clone();
    let task_path = format!("/api/v1/tasks/{}", kept["id"].as_str().unwrap());
    let patch = format!(r#"{{"payload": {numbers}}}"#);
    expect_413(&app.request("PATCH", &task_path, Some(&token), Some(patch.clone().into_bytes())).await, "task patch");
    let timer = format!(r#"{{"biz_type": "orders", "key": "t", "cron": "0 0 9 * * *", "payload": {numbers}}}"#);
    expect_413(&app.request("POST", "/api/v1/timers", Some(&token), Some(timer.into_bytes())).await, "timer create");
    let timer = app.post("/api/v1/timers", &token, json!({"biz_type": "orders", "key": "t", "cron": "0 0 9 * * *", "payload": 1})).await;
    assert_eq!(timer.status, 201, "{}", timer.body);
    let timer_path = format!("/api/v1/timers/{}", timer.body["id"].as_str().unwrap());
    expect_413(&app.request("PATCH", &timer_path, Some(&token), Some(patch.into_bytes())).await, "timer update");

    let stored: (i64, i64) = sqlx::query_as("SELECT (SELECT count(*) FROM all_tasks), (SELECT count(*) FROM timers WHERE payload = '1')")
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(stored, (1, 1), "only the small task and the timer as created");
    assert_eq!(app.get(&task_path, &token).await.body["payload"], Value::Null, "the task's payload unchanged");

    // A string of 65534 characters is stored as 65536 bytes, quotes included: the limit.
    let at_limit = json!({"biz_type": "orders", "payload": "x".repeat(65_534)});
    assert_eq!(app.post("/api/v1/tasks", &token, at_limit).await.status, 201);
    let over = app.post("/api/v1/tasks", &token, json!({"biz_type": "orders", "payload": "x".repeat(65_535)})).await;
    assert_eq!((over.status, over.code()), (413, "payload_too_large"), "{}", over.body);
}

/// A deadline is given as `expires_at` or as `ttl_ms` after the due time, kept through a
/// reschedule, and answered with the task; a bad one is refused naming its field.
#[tokio::test]
async fn a_deadline_is_given_absolute_or_relative_and_checked() {
    let app = spawn_app().await;
    let token = app.biz_type("orders").await;
    let run_at = micros(Utc::now() + Duration::hours(1));
    let expires_at = run_at + Duration::minutes(30);
    let absolute = app.create_task(&token, json!({"biz_type": "orders", "run_at": run_at.to_rfc3339(), "expires_at": expires_at.to_rfc3339()})).await;
    assert_eq!(time(&absolute["expires_at"]), expires_at);
    let relative = app.create_task(&token, json!({"biz_type": "orders", "delay_ms": 60_000, "ttl_ms": 90_000})).await;
    assert_eq!(time(&relative["expires_at"]) - time(&relative["run_at"]), Duration::milliseconds(90_000));
    let none = app.create_task(&token, json!({"biz_type": "orders"})).await;
    assert_eq!(none["expires_at"], Value::Null);

    let id = absolute["id"].as_str().unwrap();
    let moved = app.patch(&format!("/api/v1/tasks/{id}"), &token, json!({"payload": 2})).await;
    assert_eq!(moved.status, 200, "{}", moved.body);
    assert_eq!(time(&moved.body["expires_at"]), expires_at, "a change of payload keeps the deadline");
    let batch = app
        .post("/api/v1/tasks/batch", &token, json!({"tasks": [{"biz_type": "orders", "ttl_ms": 5000}, {"biz_type": "orders", "ttl_ms": 0}]}))
        .await;
    assert_eq!(batch.body["results"][0]["status"], 201, "{}", batch.body);
    assert!(batch.body["results"][0]["task"]["expires_at"].is_string(), "{}", batch.body);
    assert_eq!(batch.body["results"][1]["status"], 422, "{}", batch.body);

    let at = run_at.to_rfc3339();
    for (body, field) in [
        (json!({"biz_type": "orders", "run_at": at, "expires_at": at}), "expires_at"),
        (json!({"biz_type": "orders", "run_at": at, "expires_at": (run_at - Duration::seconds(1)).to_rfc3339()}), "expires_at"),
        (json!({"biz_type": "orders", "delay_ms": 7_200_000, "expires_at": at}), "expires_at"),
        (json!({"biz_type": "orders", "expires_at": "next tuesday"}), "expires_at"),
        (json!({"biz_type": "orders", "expires_at": (Utc::now() + Duration::days(3700)).to_rfc3339()}), "expires_at"),
        (json!({"biz_type": "orders", "ttl_ms": 0}), "ttl_ms"),
        (json!({"biz_type": "orders", "ttl_ms": -5}), "ttl_ms"),
        (json!({"biz_type": "orders", "ttl_ms": 316_224_000_001_i64}), "ttl_ms"),
        (json!({"biz_type": "orders", "ttl_ms": 1000, "expires_at": at}), "expires_at"),
    ] {
        let reply = app.post("/api/v1/tasks", &token, body.clone()).await;
        assert_eq!(reply.status, 422, "{body}: {}", reply.body);
        assert!(reply.message().starts_with(field), "{body}: {}", reply.message());
    }
}

/// A create's W3C `traceparent` is kept with the task (a batch's with each of its tasks);
/// a malformed one is ignored, as the Trace Context specification asks, not refused.
#[tokio::test]
async fn a_creates_traceparent_is_kept_and_a_malformed_one_ignored() {
    let app = spawn_app().await;
    let token = app.biz_type("orders").await;
    let parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let send = |path: &str, header: &str, body: Value| {
        app.client.post(format!("{}{path}", app.address)).bearer_auth(&token).header("traceparent", header).json(&body).send()
    };
    let created: Value = send("/api/v1/tasks", parent, json!({"biz_type": "orders"})).await.unwrap().json().await.unwrap();
    assert_eq!(created["traceparent"], parent);
    let got = app.get(&format!("/api/v1/tasks/{}", created["id"].as_str().unwrap()), &token).await;
    assert_eq!(got.body["traceparent"], parent);
    let batch: Value =
        send("/api/v1/tasks/batch", parent, json!({"tasks": [{"biz_type": "orders"}, {"biz_type": "orders"}]})).await.unwrap().json().await.unwrap();
    for result in batch["results"].as_array().unwrap() {
        assert_eq!(result["task"]["traceparent"], parent, "{batch}");
    }
    let malformed = send("/api/v1/tasks", "00-not-a-trace-01", json!({"biz_type": "orders"})).await.unwrap();
    assert_eq!(malformed.status(), 201);
    assert_eq!(malformed.json::<Value>().await.unwrap()["traceparent"], Value::Null);
}

/// A page is bounded by bytes as well as by rows: 150 tasks of 32 KB payloads (4.8 MB)
/// listed with `limit=1000` come in pages of at most about 2 MiB of payloads, each with a
/// `next_cursor` but the last, and paging through returns every task exactly once, in
/// order. Without the bound, 8 parallel lists of 1,000 such tasks took 343 MB of a node.
#[tokio::test]
async fn a_list_page_stops_at_its_byte_budget() {
    let app = spawn_app().await;
    let token = app.biz_type("orders").await;
    let big = "x".repeat(32 * 1024);
    let base = Utc::now() + Duration::minutes(10);
    let items: Vec<Value> =
        (0..150).map(|i| json!({"biz_type": "orders", "run_at": (base + Duration::seconds(i % 7)).to_rfc3339(), "payload": [i, big]})).collect();
    let created = app.post("/api/v1/tasks/batch", &token, json!({"tasks": items})).await;
    assert_eq!(created.status, 200);

    let mut seen: Vec<Value> = Vec::new();
    let mut sizes = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let path = match &cursor {
            Some(c) => format!("/api/v1/tasks?limit=1000&cursor={c}"),
            None => "/api/v1/tasks?limit=1000".to_string(),
        };
        let page = app.get(&path, &token).await;
        assert_eq!(page.status, 200, "{}", page.body);
        let items = page.body["items"].as_array().unwrap();
        assert!(!items.is_empty(), "a page holds at least one task");
        sizes.push((items.len(), page.body.to_string().len()));
        seen.extend(items.iter().cloned());
        match page.body["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => break,
        }
    }
    println!("pages of (tasks, bytes): {sizes:?}");
    assert!(sizes.len() >= 3, "4.8 MB of payloads in pages of at most ~2 MiB: {sizes:?}");
    assert!(sizes.iter().all(|(_, bytes)| *bytes <= 2 * 1024 * 1024 + 64 * 1024), "{sizes:?}");
    assert_eq!(seen.len(), 150);
    let keys: Vec<(DateTime<Utc>, String)> = seen.iter().map(|t| (time(&t["run_at"]), t["id"].as_str().unwrap().to_string())).collect();
    let mut sorted = keys.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(keys, sorted, "every task once, in order");
}
