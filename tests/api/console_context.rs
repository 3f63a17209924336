//! Context where a support person needs it (issue 16): a biz type's page shows its last
//! hour of deliveries and, for admins, sends a signed test callback whose result the page
//! shows; URLs with a password are masked for support staff and in the audit log.

use chime::biz_types::{self, Settings};
use chime::callback_hosts::CallbackHosts;
use serde_json::json;

use crate::console::{ADMIN_PASSWORD, sign_in, support_user};
use crate::helpers::{engine, spawn_app, wait_until};
use crate::receiver::{Answer, Receiver};

/// The flash message on a page (the result of the action before it).
fn flash(body: &str) -> &str {
    let start = body.find("class=\"flash\"").unwrap_or_else(|| panic!("no flash message: {body}"));
    let text = &body[start..];
    &text[text.find('>').unwrap() + 1..text.find("</p>").unwrap()]
}

/// An admin's "Send test callback" POSTs a signed `{"test": true, …}` with `Chime-Event:
/// test` through the engine's sending code, and the page it leads to says what came of it:
/// status, latency, the answer, and whether the receiver took the signature; reloading
/// sends nothing again; the test is audited. A 401 reads as a refused signature.
#[tokio::test]
async fn an_admin_sends_a_test_callback_and_reads_its_result() {
    let app = spawn_app().await;
    let receiver = Receiver::start(vec![Answer::status(200), Answer::status(401)], Answer::status(200)).await;
    let settings = Settings { callback_url: Some(receiver.url.clone()), ..Settings::default() };
    let b = biz_types::create(&app.pool, "orders", &settings, CallbackHosts::Any).await.unwrap();
    let secret = b.signing_secret.expose().unwrap().to_string();
    let admin = sign_in(&app, "admin", ADMIN_PASSWORD).await;

    let page = admin.get("/console/biz-types/orders").await;
    assert!(page.body.contains("id=\"test-callback\""), "the button, for an admin");
    let (page, cookies) = admin.post_and_follow("/console/biz-types/orders/test-callback", &[]).await;
    assert_eq!(page.status, 200);
    let message = flash(&page.body);
    assert!(message.contains("HTTP 200 in ") && message.contains(" ms"), "{message}");
    assert!(message.contains("signature accepted"), "{message}");

    let received = receiver.received();
    assert_eq!(received.len(), 1, "one test callback");
    let test = &received[0];
    assert_eq!(test.header("chime-event"), Some("test"));
    let body = test.json();
    assert_eq!(body["test"], true);
    assert_eq!(body["biz_type"], "orders");
    assert!(body["sent_at"].as_str().unwrap().parse::<chrono::DateTime<chrono::Utc>>().is_ok(), "{body}");
    let header = test.header("chime-signature").expect("signed");
    let t: i64 = header.strip_prefix("t=").unwrap().split(',').next().unwrap().parse().unwrap();
    assert_eq!(header, chime::engine::signature(&secret, t, &test.body), "signed with the biz type's secret, as callbacks are");

    // A reload of the page it led to sends nothing.
    let again = admin.get_with("/console/biz-types/orders", &cookies).await;
    assert_eq!(again.status, 200);
    assert_eq!(receiver.received().len(), 1, "a reload sends no second test");

    let (page, _) = admin.post_and_follow("/console/biz-types/orders/test-callback", &[]).await;
    let message = flash(&page.body);
    assert!(message.contains("HTTP 401") && message.contains("refused"), "{message}");

    let audited: Vec<serde_json::Value> =
        sqlx::query_scalar("SELECT after FROM audit_log WHERE action = 'biz_type.test_callback' AND actor = 'user:admin' ORDER BY id")
            .fetch_all(&app.pool)
            .await
            .unwrap();
    assert_eq!(audited.len(), 2);
    assert_eq!(audited[0]["status_code"], 200);
    assert_eq!(audited[1]["status_code"], 401);
}

/// No answer at all (nothing listens) is said as such, with the reason.
#[tokio::test]
async fn a_test_callback_that_gets_no_answer_says_why() {
    let app = spawn_app().await;
    let port = crate::helpers::free_port();
    let settings = Settings { callback_url: Some(format!("http://127.0.0.1:{port}/hook")), ..Settings::default() };
    biz_types::create(&app.pool, "orders", &settings, CallbackHosts::Any).await.unwrap();
    let admin = sign_in(&app, "admin", ADMIN_PASSWORD).await;
    let (page, _) = admin.post_and_follow("/console/biz-types/orders/test-callback", &[]).await;
    let message = flash(&page.body);
    assert!(message.contains("no answer") && message.contains("could not connect"), "{message}");
}

/// Support staff get no button and a 403; a pull biz type has no callback to test.
#[tokio::test]
async fn only_admins_test_and_only_callback_biz_types() {
    let app = spawn_app().await;
    let receiver = Receiver::start(vec![], Answer::status(200)).await;
    let settings = Settings { callback_url: Some(receiver.url.clone()), ..Settings::default() };
    biz_types::create(&app.pool, "orders", &settings, CallbackHosts::Any).await.unwrap();
    biz_types::create(&app.pool, "jobs", &Settings { mode: Some("pull".into()), ..Settings::default() }, CallbackHosts::Any).await.unwrap();

    let helen = support_user(&app).await;
    let page = helen.get("/console/biz-types/orders").await;
    assert!(page.body.contains("id=\"last-hour\""), "support staff read the last hour");
    assert!(!page.body.contains("id=\"test-callback\""), "but get no button");
    assert_eq!(helen.post("/console/biz-types/orders/test-callback", &[]).await.status, 403);

    let admin = sign_in(&app, "admin", ADMIN_PASSWORD).await;
    let page = admin.get("/console/biz-types/jobs").await;
    assert!(!page.body.contains("id=\"test-callback\""), "a pull biz type has no button");
    assert_eq!(admin.post("/console/biz-types/jobs/test-callback", &[]).await.status, 409);
    assert!(receiver.received().is_empty());
}

/// The page's last hour counts the biz type's attempts by the dashboard's queries: the
/// delivered share, the failed attempts, the lateness.
#[tokio::test]
async fn the_biz_type_page_shows_its_last_hour() {
    let app = spawn_app().await;
    let receiver = Receiver::start(vec![Answer::status(500)], Answer::status(200)).await;
    let settings = Settings {
        callback_url: Some(receiver.url.clone()),
        max_attempts: Some(3),
        backoff_initial_ms: Some(1),
        backoff_max_ms: Some(1),
        ..Settings::default()
    };
    biz_types::create(&app.pool, "orders", &settings, CallbackHosts::Any).await.unwrap();
    let token = biz_types::create_token(&app.pool, "orders").await.unwrap();
    let other = Settings { callback_url: Some(receiver.url.clone()), ..Settings::default() };
    biz_types::create(&app.pool, "other", &other, CallbackHosts::Any).await.unwrap();

    let admin = sign_in(&app, "admin", ADMIN_PASSWORD).await;
    let page = admin.get("/console/biz-types/orders").await;
    assert!(page.body.contains("no attempts"), "nothing yet");

    let task = app.create_task(&token, json!({"biz_type": "orders"})).await;
    let id = task["id"].as_str().unwrap().to_string();
    let mut engine = engine(&app);
    for _ in 0..50 {
        engine.turn().await;
        engine.settled().await;
        if app.get(&format!("/api/v1/tasks/{id}"), &token).await.body["status"] == "succeeded" {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let page = admin.get("/console/biz-types/orders").await;
    let section = &page.body[page.body.find("id=\"last-hour\"").unwrap()..];
    let section = &section[..section.find("</section>").unwrap()];
    assert!(section.contains("50.0 %") && section.contains("(1 of 2 attempts)"), "{section}");
    assert!(section.contains("id=\"failed-attempts\">1<"), "{section}");
    assert!(section.contains("median ") && !section.contains("median —"), "{section}");
    let other = admin.get("/console/biz-types/other").await;
    assert!(other.body.contains("no attempts"), "another biz type's attempts are not counted");
}

/// A URL's password is masked for support staff on every page and in the audit log;
/// admins see it on the biz type's form only.
#[tokio::test]
async fn passwords_in_urls_are_masked_for_support_and_in_the_audit_log() {
    let app = spawn_app().await;
    let settings = Settings {
        callback_url: Some("http://hook:s3cret-one@127.0.0.1:9/hook".into()),
        failure_url: Some("http://fail:s3cret-two@127.0.0.1:9/failed".into()),
        ..Settings::default()
    };
    biz_types::create(&app.pool, "orders", &settings, CallbackHosts::Any).await.unwrap();
    let admin = sign_in(&app, "admin", ADMIN_PASSWORD).await;
    let helen = support_user(&app).await;

    let page = admin.get("/console/biz-types/orders").await;
    assert!(page.body.contains("http://hook:s3cret-one@127.0.0.1:9/hook") && page.body.contains("s3cret-two"), "an admin edits the full URL");
    for path in ["/console/biz-types", "/console/biz-types/orders"] {
        let page = helen.get(path).await;
        assert_eq!(page.status, 200);
        assert!(!page.body.contains("s3cret"), "{path}: {}", page.body);
        assert!(page.body.contains("http://hook:•••@127.0.0.1:9/hook"), "{path}");
    }

    // An admin changes the password in the URL: the log says it changed, and shows neither.
    let form = [
        ("description", ""),
        ("callback_url", "http://hook:s3cret-three@127.0.0.1:9/hook"),
        ("failure_url", "http://fail:s3cret-two@127.0.0.1:9/failed"),
        ("mode", "callback"),
        ("timeout_ms", "10000"),
        ("max_attempts", "5"),
        ("backoff_initial_ms", "1000"),
        ("backoff_max_ms", "60000"),
        ("rate_limit", ""),
        ("max_in_flight", "100"),
        ("create_rate_limit", ""),
    ];
    let (page, _) = admin.post_and_follow("/console/biz-types/orders", &form).await;
    assert_eq!(page.status, 200, "{}", page.body);
    for console in [&admin, &helen] {
        let log = console.get("/console/audit").await;
        assert!(!log.body.contains("s3cret"), "{}", log.body);
        assert!(log.body.contains("(password changed)"), "{}", log.body);
    }
    let stored: Vec<String> =
        sqlx::query_scalar("SELECT coalesce(before::text, '') || coalesce(after::text, '') FROM audit_log").fetch_all(&app.pool).await.unwrap();
    assert!(stored.iter().all(|row| !row.contains("s3cret")), "{stored:?}");
    let after: serde_json::Value =
        sqlx::query_scalar("SELECT after FROM audit_log WHERE action = 'biz_type.update'").fetch_one(&app.pool).await.unwrap();
    assert_eq!(after["callback_url"], "http://hook:•••@127.0.0.1:9/hook (password changed)");
    assert_eq!(after["failure_url"], "http://fail:•••@127.0.0.1:9/failed", "unchanged, so not marked");
}

/// A redirect's target is recorded with the attempt (where it went, or in the error when it
/// is not followed); a password in it is masked for support staff on the task page, as a
/// callback URL's is. Real redirects, from a real receiver.
#[tokio::test]
async fn passwords_in_redirect_targets_are_masked_for_support_on_the_task_page() {
    let app = crate::helpers::spawn_node().await;
    let target = Receiver::start(vec![], Answer::status(200)).await;
    let port = target.url.rsplit(':').next().unwrap().split('/').next().unwrap().to_string();
    let followed = Receiver::start(vec![], Answer::redirect(307, &format!("http://hook:s3cret-a@127.0.0.1:{port}/moved"))).await;
    let refused = Receiver::start(vec![], Answer::redirect(302, &format!("http://hook:s3cret-b@127.0.0.1:{port}/moved"))).await;
    let mut ids = vec![];
    for (name, receiver, max_attempts) in [("followed", &followed, 5), ("refused", &refused, 1)] {
        let settings = Settings { callback_url: Some(receiver.url.clone()), max_attempts: Some(max_attempts), ..Settings::default() };
        biz_types::create(&app.pool, name, &settings, CallbackHosts::Any).await.unwrap();
        let token = biz_types::create_token(&app.pool, name).await.unwrap();
        let id = app.create_task(&token, json!({"biz_type": name})).await["id"].as_str().unwrap().to_string();
        let done = if name == "followed" { "succeeded" } else { "failed" };
        crate::delivery::wait_for_status(&app, &token, &id, done).await;
        ids.push(id);
    }
    let admin = sign_in(&app, "admin", ADMIN_PASSWORD).await;
    let helen = support_user(&app).await;
    for (id, secret) in ids.iter().zip(["s3cret-a", "s3cret-b"]) {
        let path = format!("/console/tasks/{id}");
        assert!(admin.get(&path).await.body.contains(secret), "an admin sees where it went");
        let page = helen.get(&path).await;
        assert_eq!(page.status, 200);
        assert!(!page.body.contains("s3cret"), "{path}: {}", page.body);
        assert!(page.body.contains(&format!("http://hook:•••@127.0.0.1:{port}/moved")), "{path}: {}", page.body);
    }
}

/// A timer's page lists its occurrences due by now, newest first, with their state and
/// attempts; its "Tasks" link lists its occurrences only (other tasks of the biz type are
/// left out). A timer filter that is not a UUID, or without a biz type, is refused on the
/// form (422).
#[tokio::test]
async fn a_timers_page_lists_its_occurrences_and_links_to_them() {
    let app = spawn_app().await;
    let token = app.biz_type("reports").await;
    let timer = app.post("/api/v1/timers", &token, json!({"biz_type": "reports", "key": "tick", "cron": "* * * * * *"})).await;
    assert_eq!(timer.status, 201, "{}", timer.body);
    let timer_id = timer.body["id"].as_str().unwrap().to_string();
    let other = app.create_task(&token, json!({"biz_type": "reports", "key": "not-the-timers"})).await;
    // Occurrences every second: wait until three are due.
    let due = wait_until("three occurrences due", std::time::Duration::from_secs(20), || async {
        let due: Vec<(String, chrono::DateTime<chrono::Utc>)> =
            sqlx::query_as("SELECT id::text, run_at FROM tasks WHERE timer_id = $1::uuid AND run_at <= now() ORDER BY run_at DESC")
                .bind(&timer_id)
                .fetch_all(&app.pool)
                .await
                .unwrap();
        if due.len() >= 3 { Ok(due) } else { Err(format!("{due:?}")) }
    })
    .await;
    assert!(due.len() >= 3, "the leader materialized occurrences: {due:?}");
    app.force_status(&due[1].0, "succeeded").await;

    let helen = support_user(&app).await;
    let page = helen.get(&format!("/console/timers/{timer_id}")).await;
    assert_eq!(page.status, 200);
    let table = &page.body[page.body.find("id=\"occurrences\"").expect("an occurrences table")..];
    let table = &table[..table.find("</table>").unwrap()];
    let listed: Vec<&str> = table.match_indices("/console/tasks/").map(|(i, _)| &table[i + 15..i + 51]).collect();
    // Newest first: those due by the time the page was read start with the ones seen here.
    let seen: Vec<&str> = due.iter().map(|(id, _)| id.as_str()).collect();
    let start = listed.iter().position(|id| *id == seen[0]).expect("the newest seen is listed");
    assert_eq!(&listed[start..start + 3], &seen[..3], "newest first: {listed:?}");
    assert!(!listed.contains(&other["id"].as_str().unwrap()), "not the timer's");
    assert!(table.contains("badge succeeded"), "{table}");

    let link = format!("/console/tasks?biz_type=reports&amp;timer={timer_id}&amp;order=newest");
    assert!(page.body.contains(&link), "the Tasks link is filtered to the timer");
    let list = helen.get(&link.replace("&amp;", "&")).await;
    assert_eq!(list.status, 200, "{}", list.body);
    assert!(list.body.contains("name=\"timer\""), "the filter shows the timer");
    // Oldest first, the first occurrences lead, where the other task (due at once) would be.
    let list = helen.get(&format!("/console/tasks?biz_type=reports&timer={timer_id}")).await;
    assert_eq!(list.status, 200, "{}", list.body);
    assert!(list.body.contains(&format!("/console/tasks/{}", seen[seen.len() - 1])), "{}", list.body);
    assert!(!list.body.contains(other["id"].as_str().unwrap()), "another task of the biz type is left out");
    let unfiltered = helen.get("/console/tasks?biz_type=reports").await;
    assert!(unfiltered.body.contains(other["id"].as_str().unwrap()), "it is listed without the timer filter");

    let refused = helen.get("/console/tasks?biz_type=reports&timer=not-a-uuid").await;
    assert_eq!(refused.status, 422);
    assert!(refused.body.contains("data-field=\"timer\""), "{}", refused.body);
    let refused = helen.get(&format!("/console/tasks?timer={timer_id}")).await;
    assert_eq!(refused.status, 422);
    assert!(refused.body.contains("biz type too"), "{}", refused.body);
}

/// A PATCH by id is audited like a cancel (the new due time, whether the payload was
/// replaced); the tasks a bulk cancel cancelled each refer to its one entry (`task_events`).
#[tokio::test]
async fn api_reschedules_and_bulk_entries_are_audited_with_their_tasks() {
    let app = spawn_app().await;
    let token = app.biz_type("orders").await;
    let task = app.create_task(&token, json!({"biz_type": "orders", "key": "o-1", "delay_ms": 3_600_000})).await;
    let id = task["id"].as_str().unwrap();
    let moved = app.patch(&format!("/api/v1/tasks/{id}"), &token, json!({"run_at": "2030-01-01T09:00:00Z"})).await;
    assert_eq!(moved.status, 200, "{}", moved.body);
    let (actor, target, after): (String, String, serde_json::Value) =
        sqlx::query_as("SELECT actor, target, after FROM audit_log WHERE action = 'task.reschedule'").fetch_one(&app.pool).await.unwrap();
    assert!(actor.starts_with("api:"), "{actor}");
    assert_eq!(target, id);
    assert_eq!(after, json!({"run_at": "2030-01-01T09:00:00Z", "priority": 5, "payload_replaced": false}));

    let mut ids = vec![id.to_string()];
    for i in 2..=3 {
        ids.push(
            app.create_task(&token, json!({"biz_type": "orders", "key": format!("o-{i}"), "delay_ms": 3_600_000})).await["id"]
                .as_str()
                .unwrap()
                .to_string(),
        );
    }
    let cancelled = app.post("/api/v1/biz-types/orders/tasks/cancel", &token, json!({"key_prefix": "o-"})).await;
    assert_eq!(cancelled.status, 200, "{}", cancelled.body);
    let (entry, after): (i64, serde_json::Value) =
        sqlx::query_as("SELECT id, after FROM audit_log WHERE action = 'task.bulk_cancel'").fetch_one(&app.pool).await.unwrap();
    let listed: Vec<String> = sqlx::query_scalar("SELECT task_id::text FROM task_events WHERE audit_id = $1 ORDER BY task_id")
        .bind(entry)
        .fetch_all(&app.pool)
        .await
        .unwrap();
    ids.sort();
    assert_eq!(listed, ids, "{after}");
    assert!(after.get("task_ids").is_none(), "the tasks refer to the entry, which lists none: {after}");
}

/// The first admin, made on the first start, is in the audit log as chime's doing.
#[tokio::test]
async fn the_first_admin_is_audited_as_made_by_chime() {
    let app = spawn_app().await;
    let rows: Vec<(String, String, String)> =
        sqlx::query_as("SELECT actor, action, target FROM audit_log WHERE actor = 'chime'").fetch_all(&app.pool).await.unwrap();
    assert_eq!(rows, [("chime".to_string(), "user.create".to_string(), "admin".to_string())]);
    let admin = sign_in(&app, "admin", ADMIN_PASSWORD).await;
    let log = admin.get("/console/audit?actor=chime").await;
    assert!(log.body.contains("user.create") && log.body.contains("first_start"), "{}", log.body);
}
