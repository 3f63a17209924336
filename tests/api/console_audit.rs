//! The bulk flow and the audit log over HTTP: a bulk confirmation restates the whole
//! filter, names some of its tasks, says how the receiver is doing and how long the rate
//! limit takes; a bulk operation lands on its own page, which counts where its tasks are
//! now; the audit log says in words what each entry did, links a bulk operation to that
//! page, and is searched by what it shows, by a task's key and by date.

use chime::biz_types::{self, Settings};
use chime::callback_hosts::CallbackHosts;
use serde_json::json;

use crate::console::{ADMIN_PASSWORD, sign_in};
use crate::helpers::{TestApp, spawn_app};

/// A biz type with a rate limit (5 a second) and its token.
async fn biz_type(app: &TestApp, name: &str) -> String {
    let settings = Settings { callback_url: Some("http://127.0.0.1:9/callback".into()), rate_limit: Some(5.0), ..Default::default() };
    biz_types::create(&app.pool, name, &settings, CallbackHosts::Any).await.unwrap();
    biz_types::create_token(&app.pool, name).await.unwrap()
}

/// `n` attempts of `biz_type` made a minute ago, `delivered` of them answered 200, the rest
/// 503: what the receiver's last minutes look like.
async fn attempts(app: &TestApp, biz_type: &str, n: i32, delivered: i32) {
    sqlx::query(
        "INSERT INTO attempts (task_id, number, started_at, duration_ms, status_code, biz_type_id)
         SELECT gen_random_uuid(), 1, now() - interval '1 minute', 3, CASE WHEN i <= $3 THEN 200 ELSE 503 END, b.id
           FROM generate_series(1, $2) i, biz_types b WHERE b.name = $1",
    )
    .bind(biz_type)
    .bind(n)
    .bind(delivered)
    .execute(&app.pool)
    .await
    .unwrap();
}

/// The audit entry a console redirect leads to: `/console/audit/{id}`.
fn entry_of(location: &str) -> i64 {
    location.strip_prefix("/console/audit/").and_then(|id| id.parse().ok()).unwrap_or_else(|| panic!("not an entry's page: {location}"))
}

/// An outage's bulk replay, over HTTP: the confirmation restates the filter (time window
/// included), names the first tasks, warns that the receiver delivered 0% in the last 5
/// minutes and says how long the rate limit takes; confirmed, it lands on the operation's
/// page, which counts its tasks as they are delivered, refreshes itself until none is
/// pending, and lists them. Before, it landed on the list filtered to the old state
/// ("0 tasks match") with nothing showing progress.
#[tokio::test]
async fn a_bulk_replay_is_confirmed_with_its_whole_filter_and_followed_on_its_own_page() {
    let app = spawn_app().await;
    let token = biz_type(&app, "invoices").await;
    let other = biz_type(&app, "billing").await;
    let mut ids = Vec::new();
    for i in 1..=3 {
        let id = app.create_task(&token, json!({"biz_type": "invoices", "key": format!("inv-{i}")})).await["id"].as_str().unwrap().to_string();
        app.force_status(&id, "failed").await;
        ids.push(id);
    }
    let t = app.create_task(&other, json!({"biz_type": "billing", "key": "inv-9"})).await;
    app.force_status(t["id"].as_str().unwrap(), "failed").await;
    attempts(&app, "invoices", 12, 0).await;
    attempts(&app, "billing", 4, 4).await;
    let admin = sign_in(&app, "admin", ADMIN_PASSWORD).await;

    let ask = admin.get("/console/tasks/replay-failed?biz_type=invoices&key_prefix=inv-&from=2020-01-01T00:00&to=").await;
    assert_eq!(ask.status, 200, "{}", ask.body);
    assert!(ask.body.contains("Replay <strong>3</strong> failed tasks"), "{}", ask.body);
    assert!(
        ask.body.contains("Filter: failed tasks of biz type invoices, keys starting inv-, due from 2020-01-01 00:00:00 UTC on."),
        "the whole filter, its time window included: {}",
        ask.body
    );
    for (i, id) in ids.iter().enumerate() {
        assert!(ask.body.contains(&format!("<a href=\"/console/tasks/{id}\"><code>inv-{}</code></a>", i + 1)), "sample {i}: {}", ask.body);
    }
    assert!(ask.body.contains("invoices: 0% delivered in the last 5 min (0 of 12 attempts) — replaying now will likely fail again."), "{}", ask.body);
    assert!(!ask.body.contains("billing:"), "only the receiver it replays to: {}", ask.body);
    assert!(ask.body.contains("At its rate limit of 5 callbacks a second, sending them takes about 1 s."), "{}", ask.body);
    // Of every biz type: each receiver with callbacks, the healthy one without a warning.
    let every = admin.get("/console/tasks/replay-failed?biz_type=&key_prefix=inv-").await;
    assert!(every.body.contains("Filter: failed tasks of every biz type, keys starting inv-, due at any time."), "{}", every.body);
    assert!(every.body.contains("<p>billing: 100% delivered in the last 5 min (4 of 4 attempts).</p>"), "{}", every.body);

    let done = admin
        .post(
            "/console/tasks/replay-failed",
            &[("biz_type", "invoices"), ("key_prefix", "inv-"), ("from", "2020-01-01T00:00"), ("to", ""), ("confirm", "yes")],
        )
        .await;
    assert_eq!(done.status, 303, "{}", done.body);
    let entry = entry_of(done.location());
    let page = admin.get(done.location()).await;
    assert_eq!(page.status, 200, "{}", page.body);
    assert!(page.body.contains("<h1>Bulk replay"), "{}", page.body);
    assert!(page.body.contains("<li>Replayed 3 of 3 matching failed tasks.</li>"), "{}", page.body);
    assert!(page.body.contains("<p id=\"progress\" class=\"big\">0 delivered, 0 failed, 3 still pending</p>"), "{}", page.body);
    assert!(page.body.contains("data-follow-seconds=\"2\""), "it refreshes itself while tasks are pending: {}", page.body);
    for id in &ids {
        assert!(page.body.contains(&format!("href=\"/console/tasks/{id}\"")), "its tasks are listed: {}", page.body);
    }

    // Delivered, one by one: counted as they go; once none is pending it stops refreshing.
    app.force_status(&ids[0], "succeeded").await;
    app.force_status(&ids[1], "running").await;
    let page = admin.get(&format!("/console/audit/{entry}")).await;
    assert!(page.body.contains("1 delivered, 0 failed, 2 still pending"), "{}", page.body);
    app.force_status(&ids[1], "succeeded").await;
    app.force_status(&ids[2], "failed").await;
    let page = admin.get(&format!("/console/audit/{entry}")).await;
    assert!(page.body.contains("2 delivered, 1 failed, 0 still pending"), "{}", page.body);
    assert!(page.body.contains(" data-done>") && !page.body.contains("data-follow-seconds"), "{}", page.body);
    assert!(page.body.contains("Done: every task it replayed is settled."), "{}", page.body);

    // Reachable from the log and from each task it touched.
    let log = admin.get("/console/audit").await;
    assert!(log.body.contains(&format!("<a class=\"follow\" href=\"/console/audit/{entry}\">")), "{}", log.body);
    let task = admin.get(&format!("/console/tasks/{}", ids[0])).await;
    assert!(task.body.contains(&format!("<a href=\"/console/audit/{entry}\">bulk operation {entry}</a>")), "{}", task.body);

    assert_eq!(admin.get("/console/audit/999999").await.status, 404);
    assert_eq!(admin.get("/console/audit/not-an-id").await.status, 404);
}

/// A bulk cancel lands on its page too, which says its tasks were cancelled and has nothing
/// to wait for.
#[tokio::test]
async fn a_bulk_cancel_lands_on_its_page() {
    let app = spawn_app().await;
    let token = biz_type(&app, "invoices").await;
    for i in 1..=4 {
        app.create_task(&token, json!({"biz_type": "invoices", "key": format!("late-{i}"), "delay_ms": 3_600_000})).await;
    }
    let admin = sign_in(&app, "admin", ADMIN_PASSWORD).await;
    let ask = admin.get("/console/tasks/cancel-pending?biz_type=invoices&key_prefix=late-").await;
    assert!(ask.body.contains("Filter: pending tasks of biz type invoices, keys starting late-, due at any time."), "{}", ask.body);
    assert!(!ask.body.contains("id=\"bulk-receiver\""), "a cancel calls no receiver: {}", ask.body);
    let (page, _) =
        admin.post_and_follow("/console/tasks/cancel-pending", &[("biz_type", "invoices"), ("key_prefix", "late-"), ("confirm", "yes")]).await;
    assert_eq!(page.status, 200, "{}", page.body);
    assert!(page.body.contains("<p class=\"flash\" role=\"status\">Cancelled 4 pending tasks.</p>"), "{}", page.body);
    assert!(page.body.contains("<h1>Bulk cancel"), "{}", page.body);
    assert!(page.body.contains("<p id=\"progress\" class=\"big\">4 cancelled, 0 since replayed or rescheduled</p>"), "{}", page.body);
    assert!(page.body.contains(" data-done>"), "{}", page.body);
    assert_eq!(page.body.matches("<span class=\"badge status cancelled\">").count(), 4, "{}", page.body);
}

/// The log in words: a create lists what it made without JSON, a bulk operation says what
/// it did and its filter (never its task ids, also in an entry written when it listed
/// them), an update its changes; the time on one line. Searched by the target as shown
/// ("biz_type invoices"), by a task's key (the entries of the tasks that held it), and by
/// day. Before, creates and bulk rows were raw JSON, a bulk row listed up to 1,000 ids,
/// and none of these searches found anything.
#[tokio::test]
async fn the_audit_log_reads_as_words_and_is_searched_by_target_key_and_day() {
    let app = spawn_app().await;
    let admin = sign_in(&app, "admin", ADMIN_PASSWORD).await;
    for name in ["invoices", "billing"] {
        let made = admin
            .post("/console/biz-types", &[("name", name), ("mode", "callback"), ("callback_url", "http://x.test/hook"), ("rate_limit", "5")])
            .await;
        assert_eq!(made.status, 303, "{}", made.body);
    }
    let token = biz_types::create_token(&app.pool, "invoices").await.unwrap();
    let billing = biz_types::create_token(&app.pool, "billing").await.unwrap();
    app.create_task(&token, json!({"biz_type": "invoices", "key": "inv-1", "delay_ms": 3_600_000})).await;
    app.create_task(&billing, json!({"biz_type": "billing", "key": "bill-1", "delay_ms": 3_600_000})).await;
    admin.post("/console/tasks/cancel-pending", &[("biz_type", "invoices"), ("key_prefix", "inv-"), ("confirm", "yes")]).await;
    admin.post("/console/tasks/cancel-pending", &[("biz_type", "billing"), ("key_prefix", "bill-"), ("confirm", "yes")]).await;
    // An entry as bulk operations wrote them before task_events: the ids in the entry.
    let old_ids: Vec<String> = (0..1000).map(|_| uuid::Uuid::now_v7().to_string()).collect();
    sqlx::query(
        "INSERT INTO audit_log (actor, action, target_type, target, after) VALUES ('api:billing', 'task.bulk_replay', 'task', 'billing', $1)",
    )
    .bind(json!({"biz_type": "billing", "status": "failed", "matched": 1000, "changed": 1000, "ids": old_ids}))
    .execute(&app.pool)
    .await
    .unwrap();

    let log = admin.get("/console/audit").await;
    assert_eq!(log.status, 200);
    assert!(
        log.body.contains("<li>name: invoices · mode: callback · callback_url: http://x.test/hook · ") && log.body.contains(" · rate_limit: 5"),
        "a create in words: {}",
        log.body
    );
    assert!(log.body.contains("<li>Cancelled 1 of 1 matching pending task.</li>"), "{}", log.body);
    assert!(log.body.contains("<li>Filter: pending tasks of biz type invoices, keys starting inv-, due at any time.</li>"), "{}", log.body);
    assert!(log.body.contains("<li>Replayed 1000 of 1000 matching failed tasks.</li>"), "{}", log.body);
    assert!(!old_ids.iter().any(|id| log.body.contains(id.as_str())), "no task id listed");
    assert!(!log.body.contains("{&quot;") && !log.body.contains("{\""), "no raw JSON: {}", log.body);
    assert!(log.body.contains("<td class=\"when\">"), "{}", log.body);

    let rows = |body: &str| body.matches("<tr>").count().saturating_sub(1);
    // By the target as the page shows it.
    let found = admin.get("/console/audit?target=biz_type+invoices").await;
    assert!(found.body.contains("<code>biz_type.create</code>") && rows(&found.body) >= 1, "{}", found.body);
    assert!(!found.body.contains("<li>name: billing"), "{}", found.body);
    // By a task's key: the cancel that took inv-1, not billing's.
    let found = admin.get("/console/audit?key=inv-1").await;
    assert_eq!(rows(&found.body), 1, "{}", found.body);
    assert!(found.body.contains("keys starting inv-"), "{}", found.body);
    assert!(admin.get("/console/audit?key=no-such-key").await.body.contains("Nothing recorded matches."));
    // By day: today's entries, none tomorrow; a bad day refused at its field.
    let today = chrono::Utc::now().date_naive();
    let found = admin.get(&format!("/console/audit?from={today}&to={today}")).await;
    assert!(rows(&found.body) >= 5, "{}", found.body);
    let tomorrow = today.succ_opt().unwrap();
    assert!(admin.get(&format!("/console/audit?from={tomorrow}")).await.body.contains("Nothing recorded matches."));
    let refused = admin.get("/console/audit?from=2026-02-30").await;
    assert_eq!(refused.status, 422);
    assert!(refused.body.contains("data-field=\"from\""), "{}", refused.body);

    // An ordinary entry's page: its summary and what it recorded.
    let create: i64 =
        sqlx::query_scalar("SELECT id FROM audit_log WHERE action = 'biz_type.create' AND target = 'invoices'").fetch_one(&app.pool).await.unwrap();
    let page = admin.get(&format!("/console/audit/{create}")).await;
    assert_eq!(page.status, 200);
    assert!(page.body.contains("<h1>Audit entry") && page.body.contains("<li>name: invoices · "), "{}", page.body);
    assert!(page.body.contains("<pre class=\"recorded\">"), "{}", page.body);
}
