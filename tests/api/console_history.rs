//! The task page as a support person reads it (issue 16): when a task was first due, every
//! attempt numbered across replays with who replayed it when, who holds a running task,
//! "retrying" apart from pending; and acting safely: a succeeded task is replayed only by
//! an admin after a confirm page, selected rows are cancelled or replayed by the single
//! actions' rules, a dead pull consumer's task can be released, and the reschedule form is
//! prefilled in the zone asked for.

use chime::biz_types::{self, Settings};
use chime::callback_hosts::CallbackHosts;
use serde_json::{Value, json};

use crate::console::{ADMIN_PASSWORD, sign_in, support_user};
use crate::helpers::{TestApp, spawn_app};

/// A pull biz type `jobs` allowing `max_attempts`, with a token: its consumer is the test,
/// so every attempt is made by the real reserve, ack and nack.
async fn jobs(app: &TestApp, max_attempts: i32) -> String {
    let settings = Settings { mode: Some("pull".into()), max_attempts: Some(max_attempts), ..Settings::default() };
    biz_types::create(&app.pool, "jobs", &settings, CallbackHosts::Any).await.unwrap();
    biz_types::create_token(&app.pool, "jobs").await.unwrap()
}

/// Reserves the one due task of `jobs`; returns its receipt.
async fn reserve_one(app: &TestApp, token: &str) -> String {
    let reply = app.post("/api/v1/biz-types/jobs/reserve", token, json!({"max": 1, "ttr_ms": 60000})).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let tasks = reply.body["tasks"].as_array().unwrap();
    assert_eq!(tasks.len(), 1, "one task due: {}", reply.body);
    tasks[0]["receipt"].as_str().unwrap().to_string()
}

async fn ack(app: &TestApp, token: &str, id: &str, receipt: &str) {
    let reply = app.post(&format!("/api/v1/tasks/{id}/ack"), token, json!({"receipt": receipt})).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
}

async fn nack(app: &TestApp, token: &str, id: &str, receipt: &str) {
    let reply = app.post(&format!("/api/v1/tasks/{id}/nack"), token, json!({"receipt": receipt, "delay_ms": 0, "error": "boom"})).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
}

async fn status_of(app: &TestApp, token: &str, id: &str) -> Value {
    app.get(&format!("/api/v1/tasks/{id}"), token).await.body["status"].clone()
}

/// The attempts table's rows, as text: "#n try m" for an attempt, "mark: …" for a replay.
fn history(body: &str) -> Vec<String> {
    let table = &body[body.find("id=\"attempts\"").expect("an attempts table")..];
    let table = &table[..table.find("</table>").unwrap()];
    let mut rows = vec![];
    for row in table.split("<tr").skip(2) {
        let cells: Vec<String> = row
            .split("<td")
            .skip(1)
            .map(|c| {
                let c = &c[c.find('>').unwrap() + 1..];
                let mut text = String::new();
                let mut inside = false;
                for ch in c.split("</td>").next().unwrap().chars() {
                    match ch {
                        '<' => inside = true,
                        '>' => inside = false,
                        _ if !inside => text.push(ch),
                        _ => {}
                    }
                }
                text.split_whitespace().collect::<Vec<_>>().join(" ")
            })
            .collect();
        if row.contains("class=\"mark") {
            rows.push(format!("mark: {}", cells[0]));
        } else {
            rows.push(format!("#{} try {}", cells[0], cells[1]));
        }
    }
    rows
}

/// A task retried, delivered, replayed twice (by the console after its confirm page, by
/// the API) and replayed in bulk reads as one history: its attempts numbered 1 to 6 across
/// the replays (each replay starts the task's own count again), a row at each replay
/// naming who made it, and the time it was first due, which the replays did not change.
#[tokio::test]
async fn the_history_numbers_attempts_across_replays_and_names_who_replayed() {
    let app = spawn_app().await;
    let token = jobs(&app, 2).await;
    let admin = sign_in(&app, "admin", ADMIN_PASSWORD).await;
    let task = app.create_task(&token, json!({"biz_type": "jobs"})).await;
    let id = task["id"].as_str().unwrap();
    let first_due = task["run_at"].as_str().unwrap().to_string();

    // Attempt 1 fails: retrying, shown as its own state, with its next try.
    let receipt = reserve_one(&app, &token).await;
    nack(&app, &token, id, &receipt).await;
    let page = admin.get(&format!("/console/tasks/{id}")).await;
    assert!(page.body.contains(r#"id="status">retrying<"#), "{}", page.body);
    assert!(page.body.contains("next try at "), "{}", page.body);
    // Attempt 2 succeeds.
    let receipt = reserve_one(&app, &token).await;
    ack(&app, &token, id, &receipt).await;

    // First replay: from the console, after its confirm page.
    let page = admin.post(&format!("/console/tasks/{id}/replay"), &[("confirm", "yes")]).await;
    assert_eq!(page.status, 303, "{}", page.body);
    let receipt = reserve_one(&app, &token).await;
    ack(&app, &token, id, &receipt).await;
    // Second replay: by the API, with the biz type's token.
    let reply = app.post(&format!("/api/v1/tasks/{id}/replay"), &token, json!({})).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    // Two failed attempts: failed, then replayed in bulk by the API.
    for _ in 0..2 {
        let receipt = reserve_one(&app, &token).await;
        nack(&app, &token, id, &receipt).await;
    }
    assert_eq!(status_of(&app, &token, id).await, "failed");
    let reply = app.post("/api/v1/biz-types/jobs/tasks/replay", &token, json!({"status": "failed", "all": true})).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let receipt = reserve_one(&app, &token).await;
    ack(&app, &token, id, &receipt).await;

    let page = admin.get(&format!("/console/tasks/{id}")).await;
    assert_eq!(page.status, 200);
    let rows = history(&page.body);
    assert_eq!(rows.len(), 9, "{rows:#?}");
    assert_eq!(&rows[..2], ["#1 try 1", "#2 try 2"], "{rows:#?}");
    assert!(rows[2].starts_with("mark: Replayed by user:admin at "), "{rows:#?}");
    assert_eq!(rows[3], "#3 try 1");
    assert!(rows[4].starts_with("mark: Replayed by api:jobs at "), "{rows:#?}");
    assert_eq!(&rows[5..7], ["#4 try 1", "#5 try 2"], "{rows:#?}");
    assert!(rows[7].starts_with("mark: Replayed in a bulk replay by api:jobs at "), "{rows:#?}");
    assert_eq!(rows[8], "#6 try 1");

    // First due: the time it was created for, though each replay moved its run_at.
    let first: chrono::DateTime<chrono::Utc> = first_due.parse().unwrap();
    assert!(page.body.contains(&first.format("%Y-%m-%d %H:%M:%S%.3f UTC").to_string()), "first due {first_due}: {}", page.body);
    assert!(page.body.contains("moved since by a reschedule, replay or retry"));
}

/// A succeeded task is delivered again only by an admin and only after a page that says
/// what will happen: support gets 403 for it (and can still replay a failed task), an
/// admin's unconfirmed post is sent to the confirm page, and reloading that page changes
/// nothing.
#[tokio::test]
async fn replaying_a_succeeded_task_asks_first_and_is_for_admins() {
    let app = spawn_app().await;
    let token = app.biz_type("orders").await;
    let admin = sign_in(&app, "admin", ADMIN_PASSWORD).await;
    let support = support_user(&app).await;
    let done = app.create_task(&token, json!({"biz_type": "orders"})).await;
    let done_id = done["id"].as_str().unwrap();
    app.force_status(done_id, "succeeded").await;
    let failed = app.create_task(&token, json!({"biz_type": "orders"})).await;
    let failed_id = failed["id"].as_str().unwrap();
    app.force_status(failed_id, "failed").await;

    for page in [
        support.get(&format!("/console/tasks/{done_id}/replay")).await,
        support.post(&format!("/console/tasks/{done_id}/replay"), &[("confirm", "yes")]).await,
    ] {
        assert_eq!(page.status, 403, "{}", page.body);
        assert!(page.body.contains("only an admin"), "{}", page.body);
    }
    assert!(!support.get(&format!("/console/tasks/{done_id}")).await.body.contains("id=\"replay\""), "support is not offered the button");
    assert_eq!(support.post(&format!("/console/tasks/{failed_id}/replay"), &[]).await.status, 303, "a failed task stays open to support");
    assert_eq!(status_of(&app, &token, failed_id).await, "pending");

    let other = admin.get(&format!("/console/tasks/{failed_id}/replay")).await;
    assert_eq!((other.status, other.location()), (303, format!("/console/tasks/{failed_id}").as_str()), "only a succeeded task is asked about");
    let (ask, _) = admin.post_and_follow(&format!("/console/tasks/{done_id}/replay"), &[]).await;
    assert_eq!(ask.status, 200);
    assert!(ask.body.contains("id=\"confirm-replay\"") && ask.body.contains("called <strong>again</strong>"), "{}", ask.body);
    for _ in 0..2 {
        assert_eq!(admin.get(&format!("/console/tasks/{done_id}/replay")).await.status, 200);
    }
    assert_eq!(status_of(&app, &token, done_id).await, "succeeded", "asking changes nothing");
    let (page, _) = admin.post_and_follow(&format!("/console/tasks/{done_id}/replay"), &[("confirm", "yes")]).await;
    assert!(page.body.contains("Task replayed"), "{}", page.body);
    assert_eq!(status_of(&app, &token, done_id).await, "pending");
    let audited: Vec<(String, Value)> = sqlx::query_as("SELECT actor, before FROM audit_log WHERE action = 'task.replay' AND target = $1")
        .bind(done_id)
        .fetch_all(&app.pool)
        .await
        .unwrap();
    assert_eq!(audited, [("user:admin".to_string(), json!({"status": "succeeded"}))]);
}

/// Rows selected on the list are cancelled or replayed each by its own button's rules:
/// the ones that qualify are changed and audited, the others skipped with the reason, and
/// the message says how many of each.
#[tokio::test]
async fn selected_rows_are_changed_by_the_single_actions_rules() {
    let app = spawn_app().await;
    let token = app.biz_type("orders").await;
    let support = support_user(&app).await;
    let mut ids = vec![];
    for status in ["pending", "pending", "failed", "succeeded"] {
        let t = app.create_task(&token, json!({"biz_type": "orders", "delay_ms": 600000})).await;
        let id = t["id"].as_str().unwrap().to_string();
        app.force_status(&id, status).await;
        ids.push(id);
    }
    let list = support.get("/console/tasks").await;
    assert!(list.body.contains(&format!(r#"name="id" value="{}" form="selected""#, ids[0])), "{}", list.body);

    let form = |action: &'static str| -> Vec<(&'static str, String)> {
        let mut f = vec![("action", action.to_string())];
        f.extend(ids.iter().map(|id| ("id", id.clone())));
        f
    };
    let owned = form("cancel");
    let fields: Vec<(&str, &str)> = owned.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let (page, _) = support.post_and_follow("/console/tasks/selected", &fields).await;
    assert!(page.body.contains("Cancelled 2 of 4 selected tasks. Skipped 2:"), "{}", page.body);
    assert!(page.body.contains(&format!("{} (only a pending task can be cancelled; this one is failed)", ids[2])), "{}", page.body);
    for (id, want) in ids.iter().zip(["cancelled", "cancelled", "failed", "succeeded"]) {
        assert_eq!(status_of(&app, &token, id).await, want, "{id}");
    }

    let owned = form("replay");
    let fields: Vec<(&str, &str)> = owned.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let (page, _) = support.post_and_follow("/console/tasks/selected", &fields).await;
    assert!(page.body.contains("Replayed 3 of 4 selected tasks. Skipped 1:"), "{}", page.body);
    assert!(
        page.body.contains(&format!("{} (this task succeeded: replaying it delivers it again, which only an admin may do", ids[3])),
        "{}",
        page.body
    );
    assert_eq!(status_of(&app, &token, &ids[3]).await, "succeeded");
    let audited: i64 = sqlx::query_scalar("SELECT count(*) FROM audit_log WHERE actor = 'user:helen' AND action IN ('task.cancel', 'task.replay')")
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(audited, 5, "one entry per task changed, as the single actions write");

    let page = support.post("/console/tasks/selected", &[("action", "delete"), ("id", &ids[0])]).await;
    assert_eq!(page.status, 422, "{}", page.body);
    let page = support.post_raw("/console/tasks/selected", &[("action", "cancel"), ("id", &ids[0])]).await;
    assert_eq!(page.status, 403, "no CSRF token: {}", page.body);
}

/// The skip report groups tasks by why they were skipped and names them by key, as a
/// warning: twelve succeeded tasks replayed by support read as one reason with the first
/// ten keys and a count, in warning colours, not a green list of twelve ids; a report with
/// nothing skipped stays a plain message. The list offers a box that selects every row,
/// and "Cancel selected" asks first (console.js, as the single cancel does).
#[tokio::test]
async fn skipped_rows_are_grouped_by_reason_named_by_key_and_warned() {
    let app = spawn_app().await;
    let token = app.biz_type("orders").await;
    let support = support_user(&app).await;
    let mut ids = vec![];
    for i in 0..13 {
        let t = app.create_task(&token, json!({"biz_type": "orders", "key": format!("inv-{i:02}"), "delay_ms": 600000})).await;
        let id = t["id"].as_str().unwrap().to_string();
        app.force_status(&id, if i < 12 { "succeeded" } else { "failed" }).await;
        ids.push(id);
    }
    let list = support.get("/console/tasks").await;
    assert!(list.body.contains(r#"id="select-all" aria-label="select every row on this page" hidden"#), "{}", list.body);
    assert!(list.body.contains(r#"value="cancel" class="danger" data-confirm="Cancel the {n} selected tasks?"#), "{}", list.body);

    let mut form = vec![("action", "replay")];
    form.extend(ids.iter().map(|id| ("id", id.as_str())));
    let (page, _) = support.post_and_follow("/console/tasks/selected", &form).await;
    let flash = page.body.split("<p class=\"flash warning\" role=\"status\">").nth(1).unwrap_or_else(|| panic!("no warning: {}", page.body));
    let flash = flash.split("</p>").next().unwrap();
    let keys: Vec<String> = (0..10).map(|i| format!("<code>inv-{i:02}</code>")).collect();
    assert!(
        flash.starts_with(&format!("Replayed 1 of 13 selected tasks. Skipped 12: {} and 2 more (this task succeeded", keys.join(", "))),
        "{flash}"
    );
    assert_eq!(flash.matches("this task succeeded").count(), 1, "one reason, said once: {flash}");
    assert!(!flash.contains(&ids[0]), "named by key, not id: {flash}");

    let (page, _) = support.post_and_follow("/console/tasks/selected", &[("action", "cancel"), ("id", &ids[12])]).await;
    assert!(page.body.contains("<p class=\"flash\" role=\"status\">Cancelled 1 of 1 selected task.</p>"), "{}", page.body);
}

/// A running pull task shows the receipt holding it and its lease end; an admin can
/// release it (pending again at once, the lost attempt recorded, audited) only while
/// that receipt still holds it; the consumer's late ack is then refused; support cannot.
#[tokio::test]
async fn an_admin_releases_a_task_held_by_a_dead_consumer() {
    let app = spawn_app().await;
    let token = jobs(&app, 5).await;
    let admin = sign_in(&app, "admin", ADMIN_PASSWORD).await;
    let support = support_user(&app).await;
    let task = app.create_task(&token, json!({"biz_type": "jobs"})).await;
    let id = task["id"].as_str().unwrap();
    let receipt = reserve_one(&app, &token).await;

    let page = admin.get(&format!("/console/tasks/{id}")).await;
    assert!(page.body.contains(&format!("a pull consumer, receipt <code>{receipt}</code>, until ")), "{}", page.body);
    assert!(page.body.contains("id=\"release\""));
    assert!(!support.get(&format!("/console/tasks/{id}")).await.body.contains("id=\"release\""));
    assert_eq!(support.post(&format!("/console/tasks/{id}/release"), &[("receipt", &receipt)]).await.status, 403);
    let stale = uuid::Uuid::now_v7().to_string();
    let (page, _) = admin.post_and_follow(&format!("/console/tasks/{id}/release"), &[("receipt", &stale)]).await;
    assert!(page.body.contains("Not released"), "{}", page.body);
    assert_eq!(status_of(&app, &token, id).await, "running");

    let (page, _) = admin.post_and_follow(&format!("/console/tasks/{id}/release"), &[("receipt", &receipt)]).await;
    assert!(page.body.contains("Task released"), "{}", page.body);
    let task = app.get(&format!("/api/v1/tasks/{id}"), &token).await.body;
    assert_eq!(task["status"], "pending");
    assert_eq!(task["attempts"].as_array().unwrap().len(), 1, "the lost attempt is recorded: {task}");
    assert!(task["attempts"][0]["error"].as_str().unwrap().contains("released by user:admin"), "{task}");
    let late = app.post(&format!("/api/v1/tasks/{id}/ack"), &token, json!({"receipt": receipt})).await;
    assert_eq!(late.status, 409, "the dead consumer's receipt no longer settles it: {}", late.body);
    let (again, _) = admin.post_and_follow(&format!("/console/tasks/{id}/release"), &[("receipt", &receipt)]).await;
    assert!(again.body.contains("Not released"), "a second post (a reload) releases nothing: {}", again.body);
    let page = admin.get(&format!("/console/tasks/{id}")).await;
    assert!(history(&page.body).iter().any(|r| r.starts_with("mark: Released by user:admin")), "{:?}", history(&page.body));
    let audited: i64 = sqlx::query_scalar("SELECT count(*) FROM audit_log WHERE action = 'task.release' AND target = $1")
        .bind(id)
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(audited, 1);
    // Due again at once: the next reserve takes it (reserve_one asserts one task).
    reserve_one(&app, &token).await;
}

/// The reschedule form is prefilled with the current due time in the zone asked for, reads
/// the new time in the zone it names, and shows every field's problem on the form, the
/// values kept.
#[tokio::test]
async fn reschedule_is_prefilled_in_the_chosen_zone_with_errors_on_the_form() {
    let app = spawn_app().await;
    let token = app.biz_type("orders").await;
    let admin = sign_in(&app, "admin", ADMIN_PASSWORD).await;
    let task = app.create_task(&token, json!({"biz_type": "orders", "run_at": "2030-01-15T12:00:00Z"})).await;
    let id = task["id"].as_str().unwrap();

    let page = admin.get(&format!("/console/tasks/{id}")).await;
    assert!(page.body.contains(r#"name="run_at" step="1" required value="2030-01-15T12:00:00""#), "{}", page.body);
    let page = admin.get(&format!("/console/tasks/{id}?zone=Asia/Tokyo")).await;
    assert!(page.body.contains(r#"required value="2030-01-15T21:00:00""#), "{}", page.body);
    assert!(page.body.contains(r#"name="zone" value="Asia/Tokyo""#), "{}", page.body);
    let page = admin.get(&format!("/console/tasks/{id}?zone=Mars/Olympus")).await;
    assert_eq!(page.status, 422);
    assert!(page.body.contains("is not a time zone"), "{}", page.body);

    // Both fields wrong: both problems, both values kept; nothing moved.
    let page = admin.post(&format!("/console/tasks/{id}/reschedule"), &[("run_at", "-200000-01-01T00:00"), ("zone", "Mars/Olympus")]).await;
    assert_eq!(page.status, 422, "{}", page.body);
    assert!(page.body.contains("is not a time zone") && page.body.contains(r#"data-field="run_at">"#), "{}", page.body);
    assert!(page.body.contains(r#"value="-200000-01-01T00:00""#) && page.body.contains(r#"value="Mars/Olympus""#));
    assert_eq!(app.get(&format!("/api/v1/tasks/{id}"), &token).await.body["run_at"], "2030-01-15T12:00:00Z");

    let (page, _) =
        admin.post_and_follow(&format!("/console/tasks/{id}/reschedule"), &[("run_at", "2030-02-01T09:30:00"), ("zone", "Europe/Paris")]).await;
    assert!(page.body.contains("Task rescheduled"), "{}", page.body);
    assert_eq!(app.get(&format!("/api/v1/tasks/{id}"), &token).await.body["run_at"], "2030-02-01T08:30:00Z", "09:30 in Paris in winter");
    assert!(page.body.contains("2030-01-15 12:00:00.000 UTC"), "first due is kept: {}", page.body);

    // A time at or after the task's deadline: the store's refusal, on the form.
    let late = app.create_task(&token, json!({"biz_type": "orders", "run_at": "2030-01-15T12:00:00Z", "expires_at": "2030-01-16T00:00:00Z"})).await;
    let late_id = late["id"].as_str().unwrap();
    let page = admin.post(&format!("/console/tasks/{late_id}/reschedule"), &[("run_at", "2030-01-16T00:30"), ("zone", "UTC")]).await;
    assert_eq!(page.status, 422, "{}", page.body);
    assert!(
        page.body.contains("deadline") && page.body.contains(r#"id="reschedule""#) && page.body.contains(r#"value="2030-01-16T00:30""#),
        "{}",
        page.body
    );
    assert_eq!(app.get(&format!("/api/v1/tasks/{late_id}"), &token).await.body["run_at"], "2030-01-15T12:00:00Z", "nothing moved");
}

/// A running callback task names the node holding it (its host and pid, from `nodes`)
/// and the lease's end; no release is offered, since a node's lease is recovered by the
/// cluster itself when the node dies.
#[tokio::test]
async fn a_running_task_names_the_node_holding_it() {
    let app = spawn_app().await;
    let token = app.biz_type("orders").await;
    let admin = sign_in(&app, "admin", ADMIN_PASSWORD).await;
    let task = app.create_task(&token, json!({"biz_type": "orders", "delay_ms": 600000})).await;
    let id = task["id"].as_str().unwrap();
    let (node, host, pid): (uuid::Uuid, String, i32) =
        sqlx::query_as("INSERT INTO nodes (id, hostname, pid, version, listen) VALUES (gen_random_uuid(), 'worker-3', 4242, 'test', '127.0.0.1:1') RETURNING id, hostname, pid")
            .fetch_one(&app.pool)
            .await
            .unwrap();
    sqlx::query("UPDATE tasks SET status = 'running', leased_by = $2, lease_until = '2030-01-01T00:00:00Z', attempt_count = 1 WHERE id = $1::uuid")
        .bind(id)
        .bind(node)
        .execute(&app.pool)
        .await
        .unwrap();
    let page = admin.get(&format!("/console/tasks/{id}")).await;
    assert!(page.body.contains(&format!("node {host} (pid {pid}), until 2030-01-01 00:00:00.000 UTC")), "{}", page.body);
    assert!(page.body.contains(r#"id="status">running<"#));
    assert!(!page.body.contains("id=\"release\""), "a node's lease is not released by hand");
}

/// A change and its audit entry commit together: with the entry refused (a CHECK the test
/// adds to the log), a cancel, a replay and a bulk replay, from the API and the console,
/// answer 500 and change nothing; once entries are taken again, the same cancel is made
/// and recorded, with its task's event.
#[tokio::test]
async fn a_change_is_undone_when_its_audit_entry_cannot_be_written() {
    let app = spawn_app().await;
    let token = app.biz_type("orders").await;
    let admin = sign_in(&app, "admin", ADMIN_PASSWORD).await;
    let pending = app.create_task(&token, json!({"biz_type": "orders", "delay_ms": 3_600_000})).await["id"].as_str().unwrap().to_string();
    let mut failed = vec![];
    for _ in 0..2 {
        let id = app.create_task(&token, json!({"biz_type": "orders", "delay_ms": 3_600_000})).await["id"].as_str().unwrap().to_string();
        app.force_status(&id, "failed").await;
        failed.push(id);
    }
    // NOT VALID: the rows already there (the first admin's) are not checked.
    sqlx::query("ALTER TABLE audit_log ADD CONSTRAINT no_task_entries CHECK (action NOT LIKE 'task.%') NOT VALID").execute(&app.pool).await.unwrap();

    assert_eq!(app.delete(&format!("/api/v1/tasks/{pending}"), &token).await.status, 500);
    assert_eq!(admin.post(&format!("/console/tasks/{pending}/cancel"), &[]).await.status, 500);
    assert_eq!(status_of(&app, &token, &pending).await, "pending", "not cancelled");
    assert_eq!(app.post(&format!("/api/v1/tasks/{}/replay", failed[0]), &token, json!({})).await.status, 500);
    assert_eq!(admin.post(&format!("/console/tasks/{}/replay", failed[0]), &[]).await.status, 500);
    let bulk = app.post("/api/v1/biz-types/orders/tasks/replay", &token, json!({"status": "failed", "all": true})).await;
    assert_eq!(bulk.status, 500, "{}", bulk.body);
    for id in &failed {
        assert_eq!(status_of(&app, &token, id).await, "failed", "not replayed");
    }
    let events: i64 = sqlx::query_scalar("SELECT count(*) FROM task_events").fetch_one(&app.pool).await.unwrap();
    assert_eq!(events, 0);

    sqlx::query("ALTER TABLE audit_log DROP CONSTRAINT no_task_entries").execute(&app.pool).await.unwrap();
    assert_eq!(app.delete(&format!("/api/v1/tasks/{pending}"), &token).await.status, 200);
    assert_eq!(status_of(&app, &token, &pending).await, "cancelled");
    let recorded: Vec<(String, String)> =
        sqlx::query_as("SELECT a.action, e.task_id::text FROM audit_log a JOIN task_events e ON e.audit_id = a.id WHERE a.action LIKE 'task.%'")
            .fetch_all(&app.pool)
            .await
            .unwrap();
    assert_eq!(recorded, [("task.cancel".to_string(), pending)]);
}

/// Two bulk replays of one biz type, a minute apart, by different people with different
/// filters (due times, no key prefix): each task's history names the one that took it and
/// who made it, with a link to its entry, which lists no task ids (the tasks refer to it).
/// Both record the same keys, from the API and from the console.
#[tokio::test]
async fn the_history_of_a_task_replayed_in_bulk_names_that_operation_and_its_actor() {
    let app = spawn_app().await;
    let token = jobs(&app, 1).await;
    let admin = sign_in(&app, "admin", ADMIN_PASSWORD).await;
    let now = chrono::Utc::now();
    let (early, late, between) = (now - chrono::TimeDelta::hours(2), now - chrono::TimeDelta::hours(1), now - chrono::TimeDelta::minutes(90));
    let mut ids = vec![];
    for run_at in [early, late] {
        let task = app.create_task(&token, json!({"biz_type": "jobs", "run_at": run_at.to_rfc3339()})).await;
        let id = task["id"].as_str().unwrap().to_string();
        let receipt = reserve_one(&app, &token).await;
        nack(&app, &token, &id, &receipt).await;
        assert_eq!(status_of(&app, &token, &id).await, "failed");
        ids.push(id);
    }
    // The later task, by the API; then the earlier, by the console.
    let reply = app.post("/api/v1/biz-types/jobs/tasks/replay", &token, json!({"status": "failed", "run_at_from": between.to_rfc3339()})).await;
    assert_eq!(reply.body, json!({"matched": 1, "replayed": 1}));
    let to = between.to_rfc3339();
    let done = admin.post("/console/tasks/replay-failed", &[("biz_type", "jobs"), ("status", "failed"), ("to", &to), ("confirm", "yes")]).await;
    assert_eq!(done.status, 303, "{}", done.body);

    let entries: Vec<(i64, String, Value)> =
        sqlx::query_as("SELECT id, actor, after FROM audit_log WHERE action = 'task.bulk_replay' ORDER BY id").fetch_all(&app.pool).await.unwrap();
    assert_eq!(entries.len(), 2, "one entry per operation: {entries:?}");
    let keys = |after: &Value| after.as_object().unwrap().keys().cloned().collect::<Vec<_>>();
    assert_eq!(keys(&entries[0].2), keys(&entries[1].2), "the API's and the console's entries have the same keys");
    assert!(entries.iter().all(|(_, _, after)| after.get("task_ids").is_none() && after["changed"] == 1), "{entries:?}");
    for (id, (entry, actor)) in [(&ids[1], (entries[0].0, "api:jobs")), (&ids[0], (entries[1].0, "user:admin"))] {
        let page = admin.get(&format!("/console/tasks/{id}")).await;
        let rows = history(&page.body);
        assert_eq!(rows.len(), 2, "{rows:#?}");
        assert_eq!(rows[0], "#1 try 1");
        let mark = format!("mark: Replayed in a bulk replay by {actor} at ");
        assert!(rows[1].starts_with(&mark) && rows[1].ends_with(&format!("bulk operation {entry} in the audit log")), "{rows:#?}");
        assert!(page.body.contains(&format!("href=\"/console/audit?before={}\"", entry + 1)), "{}", page.body);
    }
}

/// A replay and a cancel record the same payload whether made by the API or the console.
#[tokio::test]
async fn the_api_and_the_console_record_the_same_payload() {
    let app = spawn_app().await;
    let token = app.biz_type("orders").await;
    let admin = sign_in(&app, "admin", ADMIN_PASSWORD).await;
    let mut made = vec![];
    for status in ["failed", "failed", "pending", "pending"] {
        let id = app.create_task(&token, json!({"biz_type": "orders", "delay_ms": 3_600_000})).await["id"].as_str().unwrap().to_string();
        app.force_status(&id, status).await;
        made.push(id);
    }
    assert_eq!(app.post(&format!("/api/v1/tasks/{}/replay", made[0]), &token, json!({})).await.status, 200);
    assert_eq!(admin.post(&format!("/console/tasks/{}/replay", made[1]), &[]).await.status, 303);
    assert_eq!(app.delete(&format!("/api/v1/tasks/{}", made[2]), &token).await.status, 200);
    assert_eq!(admin.post(&format!("/console/tasks/{}/cancel", made[3]), &[]).await.status, 303);
    let recorded: Vec<(String, String, Option<Value>, Option<Value>)> =
        sqlx::query_as("SELECT action, actor, before, after FROM audit_log WHERE action LIKE 'task.%' ORDER BY id")
            .fetch_all(&app.pool)
            .await
            .unwrap();
    let actors: Vec<&str> = recorded.iter().map(|r| r.1.as_str()).collect();
    assert_eq!(actors, ["api:orders", "user:admin", "api:orders", "user:admin"]);
    let replays = (&recorded[0], &recorded[1]);
    assert_eq!((&replays.0.0, &replays.0.2, &replays.0.3), (&replays.1.0, &replays.1.2, &replays.1.3));
    assert_eq!(replays.0.2, Some(json!({"status": "failed"})));
    assert_eq!(replays.0.3, Some(json!({"status": "pending"})));
    let cancels = (&recorded[2], &recorded[3]);
    assert_eq!((&cancels.0.0, &cancels.0.2, &cancels.0.3), (&cancels.1.0, &cancels.1.2, &cancels.1.3));
}
