//! Tasks addressed by the client's key (docs/design/contract.md, Tasks by key): PATCH and DELETE by key, `on_conflict` on
//! create and batch items, and the 409 codes that say which conflict a refusal is.

use std::collections::HashMap;
use std::time::Duration;

use chime::biz_types::{self, Settings};
use chime::callback_hosts::CallbackHosts;
use serde_json::{Value, json};

use crate::helpers::{spawn_app, spawn_node};
use crate::receiver::{Answer, Receiver};

fn by_key(biz: &str, key: &str) -> String {
    format!("/api/v1/biz-types/{biz}/tasks/by-key/{}", urlencoding(key))
}

/// Percent-encodes everything but unreserved characters, as a client puts a key in a path.
fn urlencoding(key: &str) -> String {
    key.bytes().map(|b| if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) { (b as char).to_string() } else { format!("%{b:02X}") }).collect()
}

/// PATCH by key changes the key's pending task exactly as PATCH by id does (time and
/// payload, a key with a `/` too), and DELETE by key cancels it, audited as by id; both
/// refuse a task that is not pending with 409 `invalid_state`.
#[tokio::test]
async fn patch_and_delete_by_key_act_on_the_keys_task() {
    let app = spawn_app().await;
    let token = app.biz_type("orders").await;
    let task = app.create_task(&token, json!({"biz_type": "orders", "key": "order/123", "delay_ms": 3_600_000, "payload": {"v": 1}})).await;
    let path = by_key("orders", "order/123");

    let moved = app.patch(&path, &token, json!({"run_at": "2030-01-01T09:00:00Z", "payload": {"v": 2}})).await;
    assert_eq!(moved.status, 200, "{}", moved.body);
    assert_eq!((&moved.body["id"], &moved.body["payload"]), (&task["id"], &json!({"v": 2})));
    assert_eq!(moved.body["run_at"], "2030-01-01T09:00:00Z");
    assert_eq!(app.table_of(task["id"].as_str().unwrap()).await, "tasks_cold", "moved to cold storage as by id");
    let by_id = app.get(&format!("/api/v1/tasks/{}", task["id"].as_str().unwrap()), &token).await.body;
    assert_eq!(by_id["payload"], json!({"v": 2}));
    // The same body rules as by id.
    let empty = app.patch(&path, &token, json!({})).await;
    assert_eq!((empty.status, empty.message()), (422, "give run_at, delay_ms, payload or priority to change"));
    let both = app.patch(&path, &token, json!({"run_at": "2030-01-01T09:00:00Z", "delay_ms": 5})).await;
    assert_eq!(both.status, 422);
    assert!(both.message().starts_with("run_at"), "{}", both.message());

    let cancelled = app.delete(&path, &token).await;
    assert_eq!((cancelled.status, cancelled.body["status"].as_str()), (200, Some("cancelled")), "{}", cancelled.body);
    assert_eq!(cancelled.body["id"], task["id"]);
    let audited: Vec<(String, String)> =
        sqlx::query_as("SELECT action, target FROM audit_log WHERE actor <> 'chime' ORDER BY id").fetch_all(&app.pool).await.unwrap();
    let id = task["id"].as_str().unwrap().to_string();
    assert_eq!(
        audited,
        [("task.reschedule".to_string(), id.clone()), ("task.cancel".to_string(), id)],
        "the PATCH by key is audited, like the cancel"
    );

    for (method, body) in [("DELETE", None), ("PATCH", Some(json!({"delay_ms": 5})))] {
        let again = app.request(method, &path, Some(&token), body.map(|b| b.to_string().into_bytes())).await;
        assert_eq!((again.status, again.code()), (409, "invalid_state"), "{method}: {}", again.body);
        assert!(again.message().contains("cancelled"), "{}", again.message());
    }
    // A running task cannot be cancelled by key either.
    let running = app.create_task(&token, json!({"biz_type": "orders", "key": "busy"})).await;
    app.force_status(running["id"].as_str().unwrap(), "running").await;
    let refused = app.delete(&by_key("orders", "busy"), &token).await;
    assert_eq!((refused.status, refused.code()), (409, "invalid_state"), "{}", refused.body);
}

/// A by-key path refuses what a create would refuse, GET as PATCH and DELETE: a key that is
/// empty, too long, has control characters (NUL too) or is not UTF-8 once decoded (never
/// read as U+FFFD) is a 422 naming `key`; an unknown key is a 404; another biz type's name a
/// 403 and an unknown one a 404. None of them changes anything.
#[tokio::test]
async fn by_key_paths_refuse_bad_keys_unknown_keys_and_other_biz_types() {
    let app = spawn_app().await;
    let token = app.biz_type("orders").await;
    app.biz_type("coupons").await;
    let task = app.create_task(&token, json!({"biz_type": "orders", "key": "k", "delay_ms": 3_600_000})).await;
    let long = "k".repeat(257);

    // A key that `%FF` would decode to if it were read as U+FFFD: found, were it so read.
    app.create_task(&token, json!({"biz_type": "orders", "key": "a\u{FFFD}b", "delay_ms": 3_600_000})).await;
    for (method, body) in [("GET", None), ("PATCH", Some(json!({"delay_ms": 5}))), ("DELETE", None)] {
        let call = |path: String| {
            let body = body.clone().map(|b| b.to_string().into_bytes());
            let app = &app;
            let token = &token;
            async move { app.request(method, &path, Some(token), body).await }
        };
        for bad in ["a%0Ab", "%07", "a%00b", "a%FFb", "%C3", long.as_str()] {
            let reply = call(format!("/api/v1/biz-types/orders/tasks/by-key/{bad}")).await;
            assert_eq!((reply.status, reply.code()), (422, "invalid_argument"), "{method} {bad}: {}", reply.body);
            assert!(reply.message().starts_with("key:"), "{}", reply.message());
        }
        let empty = call("/api/v1/biz-types/orders/tasks/by-key/".to_string()).await;
        assert_eq!(empty.status, 422, "{method} an empty key: {}", empty.body);
        let unknown = call(by_key("orders", "nope")).await;
        assert_eq!((unknown.status, unknown.code()), (404, "not_found"), "{method}: {}", unknown.body);
        assert!(unknown.message().contains("nope"), "{}", unknown.message());
        let foreign = call(by_key("coupons", "k")).await;
        assert_eq!((foreign.status, foreign.code()), (403, "permission_denied"), "{method}: {}", foreign.body);
        let no_biz = call(by_key("nobody", "k")).await;
        assert_eq!(no_biz.status, 404, "{method}: {}", no_biz.body);
    }
    let unchanged = app.get(&format!("/api/v1/tasks/{}", task["id"].as_str().unwrap()), &token).await.body;
    assert_eq!((&unchanged["status"], &unchanged["run_at"]), (&json!("pending"), &task["run_at"]));
}

/// `reject` (the default): the same request again is a repeat (200), a different one a 409
/// `key_conflict`. `keep`: the key's task, 200, whatever the body; with the key free, 201.
/// An unknown `on_conflict` is a 422 naming it.
#[tokio::test]
async fn reject_and_keep_answer_with_the_keys_task() {
    let app = spawn_app().await;
    let token = app.biz_type("orders").await;
    let first = app.create_task(&token, json!({"biz_type": "orders", "key": "k", "delay_ms": 60_000, "payload": 1})).await;

    let repeat =
        app.post("/api/v1/tasks", &token, json!({"biz_type": "orders", "key": "k", "delay_ms": 60_000, "payload": 1, "on_conflict": "reject"})).await;
    assert_eq!((repeat.status, &repeat.body["id"]), (200, &first["id"]), "on_conflict is not part of the request compared");
    let other = app.post("/api/v1/tasks", &token, json!({"biz_type": "orders", "key": "k", "payload": 2})).await;
    assert_eq!((other.status, other.code()), (409, "key_conflict"), "{}", other.body);

    let kept = app.post("/api/v1/tasks", &token, json!({"biz_type": "orders", "key": "k", "payload": 3, "on_conflict": "keep"})).await;
    assert_eq!((kept.status, &kept.body["id"], &kept.body["payload"]), (200, &first["id"], &json!(1)), "{}", kept.body);
    app.force_status(first["id"].as_str().unwrap(), "succeeded").await;
    let kept = app.post("/api/v1/tasks", &token, json!({"biz_type": "orders", "key": "k", "on_conflict": "keep"})).await;
    assert_eq!((kept.status, kept.body["status"].as_str()), (200, Some("succeeded")), "keep answers a finished task too");
    let fresh = app.post("/api/v1/tasks", &token, json!({"biz_type": "orders", "key": "new", "on_conflict": "keep"})).await;
    assert_eq!(fresh.status, 201, "{}", fresh.body);
    let fresh = app.post("/api/v1/tasks", &token, json!({"biz_type": "orders", "key": "newer", "on_conflict": "replace"})).await;
    assert_eq!(fresh.status, 201, "{}", fresh.body);
    let null = app.post("/api/v1/tasks", &token, json!({"biz_type": "orders", "key": "k", "on_conflict": null})).await;
    assert_eq!((null.status, null.code()), (409, "key_conflict"), "null is the default: {}", null.body);

    for bad in [json!("overwrite"), json!("REPLACE"), json!(1), json!({})] {
        let reply = app.post("/api/v1/tasks", &token, json!({"biz_type": "orders", "key": "k", "on_conflict": bad})).await;
        assert_eq!((reply.status, reply.code()), (422, "invalid_argument"), "{bad}: {}", reply.body);
        assert!(reply.message().starts_with("on_conflict"), "{bad}: {}", reply.message());
    }
    let tasks: i64 = sqlx::query_scalar("SELECT count(*) FROM all_tasks").fetch_one(&app.pool).await.unwrap();
    assert_eq!(tasks, 3, "k, new and newer");
}

/// `replace` of a pending task changes it in place (same id, the new time and payload, hot
/// to cold and back) and answers 200; the replacing request is then the key's, so sent
/// again with `reject` it is a repeat. A running task answers 409 `task_running` and is
/// unchanged. A finished, cancelled or expired task keeps its history and a new task takes
/// the key (201): look-up by key, PATCH and DELETE by key find the new one.
#[tokio::test]
async fn replace_changes_a_pending_task_and_gives_a_finished_ones_key_to_a_new_task() {
    let app = spawn_app().await;
    let token = app.biz_type("orders").await;
    let first = app.create_task(&token, json!({"biz_type": "orders", "key": "meeting", "delay_ms": 60_000, "payload": {"at": 1}})).await;
    let id = first["id"].as_str().unwrap().to_string();

    let moved = json!({"biz_type": "orders", "key": "meeting", "run_at": "2030-06-01T08:45:00Z", "payload": {"at": 2}, "on_conflict": "replace"});
    let reply = app.post("/api/v1/tasks", &token, moved.clone()).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(
        (reply.body["id"].as_str(), &reply.body["payload"], &reply.body["run_at"]),
        (Some(id.as_str()), &json!({"at": 2}), &json!("2030-06-01T08:45:00Z"))
    );
    assert_eq!(app.table_of(&id).await, "tasks_cold");
    let mut repeat = moved.clone();
    repeat["on_conflict"] = json!("reject");
    let again = app.post("/api/v1/tasks", &token, repeat).await;
    assert_eq!((again.status, again.body["id"].as_str()), (200, Some(id.as_str())), "a repeat of the replacing request: {}", again.body);
    let old = app.post("/api/v1/tasks", &token, json!({"biz_type": "orders", "key": "meeting", "delay_ms": 60_000, "payload": {"at": 1}})).await;
    assert_eq!((old.status, old.code()), (409, "key_conflict"), "the first request is no longer the key's: {}", old.body);
    // The same replace again (a debounce) applies again, from cold storage back to hot.
    let back = app.post("/api/v1/tasks", &token, json!({"biz_type": "orders", "key": "meeting", "delay_ms": 60_000, "on_conflict": "replace"})).await;
    assert_eq!((back.status, &back.body["payload"]), (200, &Value::Null), "{}", back.body);
    assert!(app.table_of(&id).await.starts_with("tasks_p"), "{}", app.table_of(&id).await);

    app.force_status(&id, "running").await;
    let running = app.post("/api/v1/tasks", &token, json!({"biz_type": "orders", "key": "meeting", "payload": 9, "on_conflict": "replace"})).await;
    assert_eq!((running.status, running.code()), (409, "task_running"), "{}", running.body);
    assert!(running.message().contains("meeting") && running.message().contains("running"), "{}", running.message());
    assert_eq!(app.get(&format!("/api/v1/tasks/{id}"), &token).await.body["payload"], Value::Null, "unchanged");

    let mut ids = vec![id.clone()];
    for finished in ["succeeded", "failed", "cancelled", "expired"] {
        app.force_status(ids.last().unwrap(), finished).await;
        let reply = app
            .post(
                "/api/v1/tasks",
                &token,
                json!({"biz_type": "orders", "key": "meeting", "delay_ms": 3_600_000, "payload": finished, "on_conflict": "replace"}),
            )
            .await;
        assert_eq!(reply.status, 201, "after {finished}: {}", reply.body);
        let new_id = reply.body["id"].as_str().unwrap().to_string();
        assert!(!ids.contains(&new_id));
        let old = app.get(&format!("/api/v1/tasks/{}", ids.last().unwrap()), &token).await.body;
        assert_eq!((old["status"].as_str(), old["key"].as_str()), (Some(finished), Some("meeting")), "the old task keeps its history");
        let found = app.get(&by_key("orders", "meeting"), &token).await.body;
        assert_eq!(found["id"].as_str(), Some(new_id.as_str()), "look-up by key answers the newest");
        ids.push(new_id);
    }
    let newest = ids.last().unwrap();
    let patched = app.patch(&by_key("orders", "meeting"), &token, json!({"payload": "patched"})).await;
    assert_eq!((patched.status, patched.body["id"].as_str()), (200, Some(newest.as_str())), "{}", patched.body);
    let cancelled = app.delete(&by_key("orders", "meeting"), &token).await;
    assert_eq!((cancelled.status, cancelled.body["id"].as_str()), (200, Some(newest.as_str())), "{}", cancelled.body);
    let keys: Vec<(uuid::Uuid, Vec<uuid::Uuid>)> = sqlx::query_as("SELECT task_id, earlier FROM task_keys").fetch_all(&app.pool).await.unwrap();
    let as_text = |ids: &[uuid::Uuid]| ids.iter().map(|id| id.to_string()).collect::<Vec<_>>();
    assert_eq!(keys.len(), 1, "one key row, pointing to the newest task");
    assert_eq!((keys[0].0.to_string(), as_text(&keys[0].1)), (newest.clone(), ids[..ids.len() - 1].to_vec()), "the earlier tasks, oldest first");

    // The console's page of each task lists the others that held its key, and not itself.
    let console = crate::console::sign_in(&app, "admin", crate::console::ADMIN_PASSWORD).await;
    for id in [&ids[0], newest] {
        let page = console.get(&format!("/console/tasks/{id}")).await;
        let history = page.body.split("id=\"key-history\"").nth(1).unwrap_or_else(|| panic!("no key history on {id}'s page"));
        let history = history.split("</table>").next().unwrap();
        for other in ids.iter().filter(|other| *other != id) {
            assert!(history.contains(other.as_str()), "{other} missing from {id}'s page: {history}");
        }
        assert!(!history.contains(id.as_str()), "{id}'s page lists itself");
    }
}

/// A replace of a pending task takes the request's deadline too (`expires_at`, or `ttl_ms`
/// from the new due time), and a replace without one leaves the task without a deadline.
#[tokio::test]
async fn replace_takes_the_requests_deadline() {
    let app = spawn_app().await;
    let token = app.biz_type("orders").await;
    let replace = |extra: Value| {
        let mut body = json!({"biz_type": "orders", "key": "refund-9", "run_at": "2030-06-01T08:00:00Z", "on_conflict": "replace"});
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        app.post("/api/v1/tasks", &token, body)
    };
    let first = replace(json!({"ttl_ms": 60_000})).await;
    assert_eq!((first.status, &first.body["expires_at"]), (201, &json!("2030-06-01T08:01:00Z")), "{}", first.body);
    let absolute = replace(json!({"run_at": "2030-06-02T08:00:00Z", "expires_at": "2030-06-02T09:00:00Z"})).await;
    assert_eq!((absolute.status, &absolute.body["expires_at"]), (200, &json!("2030-06-02T09:00:00Z")), "{}", absolute.body);
    let relative = replace(json!({"ttl_ms": 1000})).await;
    assert_eq!((relative.status, &relative.body["expires_at"]), (200, &json!("2030-06-01T08:00:01Z")), "from the new due time: {}", relative.body);
    let none = replace(json!({})).await;
    assert_eq!((none.status, &none.body["expires_at"]), (200, &Value::Null), "{}", none.body);
    let stored = app.get(&by_key("orders", "refund-9"), &token).await.body;
    assert_eq!((&stored["id"], &stored["expires_at"]), (&first.body["id"], &Value::Null));
    let bad = replace(json!({"expires_at": "2030-06-01T07:00:00Z"})).await;
    assert_eq!((bad.status, bad.code()), (422, "invalid_argument"), "a deadline before the due time: {}", bad.body);
}

/// In a batch, each item's `on_conflict` applies to it alone, in item order: fresh items
/// are created together, a replace of a taken key changes its task, a keep answers with it,
/// a reject conflicts, and a later replace of a key an earlier item created replaces that task.
#[tokio::test]
async fn batch_items_each_say_what_to_do_with_a_taken_key() {
    let app = spawn_app().await;
    let token = app.biz_type("orders").await;
    let pending = app.create_task(&token, json!({"biz_type": "orders", "key": "p", "delay_ms": 60_000, "payload": 0})).await;
    let done = app.create_task(&token, json!({"biz_type": "orders", "key": "d", "payload": 0})).await;
    app.force_status(done["id"].as_str().unwrap(), "succeeded").await;
    let busy = app.create_task(&token, json!({"biz_type": "orders", "key": "r"})).await;
    app.force_status(busy["id"].as_str().unwrap(), "running").await;

    let reply = app
        .post(
            "/api/v1/tasks/batch",
            &token,
            json!({"tasks": [
                {"biz_type": "orders", "key": "fresh", "payload": 1},
                {"biz_type": "orders", "key": "p", "payload": 2, "on_conflict": "replace"},
                {"biz_type": "orders", "key": "d", "payload": 3, "on_conflict": "replace"},
                {"biz_type": "orders", "key": "r", "payload": 4, "on_conflict": "replace"},
                {"biz_type": "orders", "key": "p", "payload": 5, "on_conflict": "keep"},
                {"biz_type": "orders", "key": "d", "payload": 6},
                {"biz_type": "orders", "key": "fresh", "payload": 7, "on_conflict": "replace"},
                {"biz_type": "orders", "key": "x", "on_conflict": "sometimes"},
            ]}),
        )
        .await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let results = reply.body["results"].as_array().unwrap();
    let statuses: Vec<u64> = results.iter().map(|r| r["status"].as_u64().unwrap()).collect();
    assert_eq!(statuses, [201, 200, 201, 409, 200, 409, 200, 422], "{}", reply.body);
    assert_eq!((&results[1]["task"]["id"], &results[1]["task"]["payload"]), (&pending["id"], &json!(2)));
    assert_ne!(results[2]["task"]["id"], done["id"]);
    assert_eq!(results[3]["error"]["code"], "task_running");
    assert_eq!(results[5]["error"]["code"], "key_conflict");
    assert_eq!((&results[6]["task"]["id"], &results[6]["task"]["payload"]), (&results[0]["task"]["id"], &json!(7)));
    assert!(results[7]["error"]["message"].as_str().unwrap().contains("on_conflict"), "{}", results[7]);
    let fresh = app.get(&by_key("orders", "fresh"), &token).await.body;
    assert_eq!(fresh["payload"], json!(7), "the later replace won");
}

/// Replaces race with the engine claiming the task: each answer is the replaced pending
/// task (200), 409 `task_running`, or a new task once the old one is done (201), and every
/// task is delivered exactly once, with the payload of the last replace it answered.
#[tokio::test]
async fn replace_racing_the_engine_loses_and_doubles_no_callback() {
    let app = spawn_node().await;
    let receiver = Receiver::start(vec![], Answer::status(200)).await;
    let settings = Settings { callback_url: Some(receiver.url.clone()), ..Default::default() };
    biz_types::create(&app.pool, "meetings", &settings, CallbackHosts::Any).await.unwrap();
    let token = biz_types::create_token(&app.pool, "meetings").await.unwrap();

    // The payload each task was last given, by task id; and how each answer went.
    let mut last_payload: HashMap<String, Value> = HashMap::new();
    let mut answers: HashMap<u16, usize> = HashMap::new();
    let keys = 8;
    // Until the race has been run both ways (tasks claimed under the replaces: refused, or
    // finished and their keys given to new tasks), for at least a second.
    let began = std::time::Instant::now();
    for round in 0..1000 {
        let answered = |status| answers.get(&status).copied().unwrap_or(0);
        if answered(201) >= 3 * keys && answered(200) >= keys && answered(409) > 0 && began.elapsed() > Duration::from_secs(1) {
            break;
        }
        let replies = futures_util::future::join_all((0..keys).map(|k| {
            // Due now, or a little later: claimed ahead (100 ms) under the replaces, or still
            // pending when the next one comes.
            let delay_ms = [0, 120, 250][(round + k) % 3];
            let body = json!({"biz_type": "meetings", "key": format!("m-{k}"), "delay_ms": delay_ms, "payload": {"round": round, "key": k}, "on_conflict": "replace"});
            app.post("/api/v1/tasks", &token, body)
        }))
        .await;
        for (k, reply) in replies.into_iter().enumerate() {
            *answers.entry(reply.status).or_default() += 1;
            match reply.status {
                200 | 201 => {
                    last_payload.insert(reply.body["id"].as_str().unwrap().to_string(), json!({"round": round, "key": k}));
                }
                409 => assert_eq!(reply.code(), "task_running", "{}", reply.body),
                other => panic!("answered {other}: {}", reply.body),
            }
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let received = receiver.wait_for(last_payload.len(), Duration::from_secs(60)).await;
    // Settle: no late duplicate may follow.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let received = if receiver.received().len() > received.len() { receiver.received() } else { received };
    let mut delivered: HashMap<String, Vec<Value>> = HashMap::new();
    for r in &received {
        let body = r.json();
        delivered.entry(body["task_id"].as_str().unwrap().to_string()).or_default().push(body["payload"].clone());
    }
    for (id, payload) in &last_payload {
        assert_eq!(delivered.get(id), Some(&vec![payload.clone()]), "task {id}: delivered once, with the last replace's payload");
    }
    assert_eq!(delivered.len(), last_payload.len(), "no callback for a task no answer named");
    println!("replace racing the engine: answers {answers:?}, {} tasks delivered", delivered.len());
    let answered = |status| answers.get(&status).copied().unwrap_or(0);
    assert!(
        answered(201) >= 3 * keys && answered(200) >= keys,
        "the race was run: tasks replaced while pending, and given new ones once finished: {answers:?}"
    );
}

/// The items of one batch are applied in order, as if sent one by one: an item sees what
/// the items before it did to its key. After a `replace`, the same request again with
/// `reject` is a repeat (200, the replaced task) and the key's first request a conflict;
/// `keep` answers the task as replaced. The same holds for a key the batch itself creates
/// and for a finished task's key given to a new task.
#[tokio::test]
async fn batch_items_see_what_earlier_items_did_to_their_key() {
    let app = spawn_app().await;
    let token = app.biz_type("orders").await;
    let pending = app.create_task(&token, json!({"biz_type": "orders", "key": "p", "delay_ms": 60_000, "payload": 0})).await;
    let done = app.create_task(&token, json!({"biz_type": "orders", "key": "d", "delay_ms": 60_000, "payload": 0})).await;
    app.force_status(done["id"].as_str().unwrap(), "succeeded").await;

    let reply = app
        .post(
            "/api/v1/tasks/batch",
            &token,
            json!({"tasks": [
                {"biz_type": "orders", "key": "p", "delay_ms": 60_000, "payload": 2, "on_conflict": "replace"},
                {"biz_type": "orders", "key": "p", "delay_ms": 60_000, "payload": 2},
                {"biz_type": "orders", "key": "p", "payload": 9, "on_conflict": "keep"},
                {"biz_type": "orders", "key": "p", "delay_ms": 60_000, "payload": 0},
                {"biz_type": "orders", "key": "f", "delay_ms": 60_000, "payload": 1},
                {"biz_type": "orders", "key": "f", "delay_ms": 60_000, "payload": 7, "on_conflict": "replace"},
                {"biz_type": "orders", "key": "f", "delay_ms": 60_000, "payload": 7},
                {"biz_type": "orders", "key": "f", "delay_ms": 60_000, "payload": 1},
                {"biz_type": "orders", "key": "d", "delay_ms": 60_000, "payload": 3, "on_conflict": "replace"},
                {"biz_type": "orders", "key": "d", "delay_ms": 60_000, "payload": 3},
                {"biz_type": "orders", "key": "d", "payload": 8, "on_conflict": "keep"},
            ]}),
        )
        .await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let results = reply.body["results"].as_array().unwrap();
    let statuses: Vec<u64> = results.iter().map(|r| r["status"].as_u64().unwrap()).collect();
    println!("statuses: {statuses:?}");
    assert_eq!(statuses, [200, 200, 200, 409, 201, 200, 200, 409, 201, 200, 200], "{}", reply.body);
    let payload_of = |i: usize| (results[i]["task"]["id"].clone(), results[i]["task"]["payload"].clone());
    for i in [0, 1, 2] {
        assert_eq!(payload_of(i), (pending["id"].clone(), json!(2)), "item {i}: the task as the replace left it: {}", results[i]);
    }
    assert_eq!(results[3]["error"]["code"], "key_conflict", "the key's request is the replace's now");
    for i in [5, 6] {
        assert_eq!(payload_of(i), (results[4]["task"]["id"].clone(), json!(7)), "item {i}: {}", results[i]);
    }
    assert_eq!(results[7]["error"]["code"], "key_conflict");
    assert_ne!(results[8]["task"]["id"], done["id"]);
    for i in [9, 10] {
        assert_eq!(payload_of(i), (results[8]["task"]["id"].clone(), json!(3)), "item {i}: the new task of the key: {}", results[i]);
    }
    for (key, payload) in [("p", 2), ("f", 7), ("d", 3)] {
        assert_eq!(app.get(&by_key("orders", key), &token).await.body["payload"], json!(payload), "key {key}");
    }
}

/// Twelve replaces of one key at once, again and again, each round on a key whose task has
/// finished: in each round one gives the key to a new task (201) and the others replace
/// that task in turn (200). None is told the key conflicted (a 409 clients must not
/// retry), and the key's tasks are the finished ones and one pending.
#[tokio::test]
async fn concurrent_replaces_of_a_finished_tasks_key_all_settle() {
    let app = spawn_app().await;
    let token = app.biz_type("orders").await;
    let mut holder = app.create_task(&token, json!({"biz_type": "orders", "key": "k", "delay_ms": 60_000})).await["id"].as_str().unwrap().to_string();
    let mut tally: HashMap<u16, usize> = HashMap::new();
    let rounds = 25;
    for round in 0..rounds {
        app.force_status(&holder, "succeeded").await;
        let replaces: Vec<_> = (0..12)
            .map(|i| {
                let (client, url, token) = (app.client.clone(), format!("{}/api/v1/tasks", app.address), token.clone());
                tokio::spawn(async move {
                    let body = json!({"biz_type": "orders", "key": "k", "delay_ms": 60_000, "payload": [round, i], "on_conflict": "replace"});
                    let response = client.post(url).bearer_auth(token).json(&body).send().await.unwrap();
                    (response.status().as_u16(), response.json::<Value>().await.unwrap())
                })
            })
            .collect();
        let mut created = Vec::new();
        for replace in replaces {
            let (status, body) = replace.await.unwrap();
            *tally.entry(status).or_default() += 1;
            match status {
                201 => created.push(body["id"].as_str().unwrap().to_string()),
                200 => {}
                _ => println!("round {round}: {status} {body}"),
            }
        }
        assert!(created.len() <= 1, "round {round}: {} new tasks for one key", created.len());
        if let Some(id) = created.pop() {
            holder = id;
        }
    }
    println!("{} replaces: {tally:?}", rounds * 12);
    assert_eq!(tally.get(&201), Some(&rounds), "{tally:?}");
    assert_eq!(tally.get(&200), Some(&(rounds * 11)), "{tally:?}");
    let pending: i64 =
        sqlx::query_scalar("SELECT count(*) FROM all_tasks WHERE key = 'k' AND status = 'pending'").fetch_one(&app.pool).await.unwrap();
    assert_eq!(pending, 1);
}
