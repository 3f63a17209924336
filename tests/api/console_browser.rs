//! The console in a real headless Chromium, end to end: sign in, create a biz type whose
//! receiver fails, watch its tasks fail, fix the receiver, bulk-replay, see them succeed;
//! escaping, CSRF and the support role as a browser meets them. Takes the README's
//! screenshots: into the target directory, or where CHIME_SCREENSHOTS says
//! (`CHIME_SCREENSHOTS=docs/screenshots` refreshes the README's), so that a test run
//! leaves the tree as it was.

use std::time::Duration;

use serde_json::json;

use crate::browser::Browser;
use crate::helpers::{TestApp, spawn_node};
use crate::receiver::{Answer, Receiver};

fn shot(name: &str) -> std::path::PathBuf {
    let dir = std::env::var_os("CHIME_SCREENSHOTS")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("screenshots"));
    dir.join(name)
}

async fn sign_in(browser: &Browser, app: &TestApp, user: &str, password: &str) {
    browser.goto(&format!("{}/console", app.address)).await;
    assert!(browser.current_url().await.contains("/console/login"), "signed out, the console asks to sign in");
    browser.fill("#login input[name=username]", user).await;
    browser.fill("#login input[name=password]", password).await;
    browser.submit("#login").await;
    assert_eq!(browser.current_url().await, format!("{}/console", app.address));
}

async fn count(app: &TestApp, status: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM tasks WHERE status = $1").bind(status).fetch_one(&app.pool).await.unwrap()
}

async fn wait_count(app: &TestApp, status: &str, n: i64) {
    for _ in 0..300 {
        if count(app, status).await == n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("expected {n} {status} tasks, found {}", count(app, status).await);
}

#[tokio::test]
async fn failing_receiver_fixed_and_failed_tasks_replayed_from_the_console() {
    let app = spawn_node().await;
    let receiver = Receiver::start(vec![], Answer::status(500)).await;
    let browser = Browser::start().await;
    sign_in(&browser, &app, "admin", "test-admin-password").await;

    // A biz type pointing at the failing receiver; a bad number is refused next to its field.
    browser.goto("/console/biz-types/new").await;
    browser.fill("#biz-type input[name=name]", "orders").await;
    browser.fill("#biz-type input[name=description]", "Closes unpaid orders").await;
    browser.fill("#biz-type input[name=callback_url]", &receiver.url).await;
    browser.fill("#biz-type input[name=max_attempts]", "two").await;
    browser.submit("#biz-type").await;
    assert_eq!(browser.text(".field-error[data-field=max_attempts]").await, "must be a whole number");
    browser.fill("#biz-type input[name=max_attempts]", "2").await;
    browser.fill("#biz-type input[name=backoff_initial_ms]", "100").await;
    browser.fill("#biz-type input[name=backoff_max_ms]", "200").await;
    browser.submit("#biz-type").await;
    assert!(browser.text("#revealed").await.starts_with("whsec_"), "the signing secret is shown once");
    browser.screenshot(shot("biz-type.png")).await;
    browser.submit("#create-token").await;
    let token = browser.text("#revealed").await;
    assert!(token.starts_with("chime_"), "{token}");
    // The token's page came from a redirect: reloading it mints nothing and shows nothing.
    browser.client().refresh().await.expect("reloading the page");
    assert!(!browser.exists("#revealed").await, "a reload shows the token again");
    let tokens: i64 = sqlx::query_scalar("SELECT count(*) FROM api_tokens").fetch_one(&app.pool).await.unwrap();
    assert_eq!(tokens, 1, "the reload minted another token");

    // Tasks scheduled over the API fail against the receiver.
    let mut ids = Vec::new();
    for i in 0..5 {
        let payload = if i == 0 { json!({"note": "<script>alert('x')</script>", "order": 1}) } else { json!({"order": i + 1}) };
        ids.push(
            app.create_task(&token, json!({"biz_type": "orders", "key": format!("order-{}", i + 1), "payload": payload})).await["id"]
                .as_str()
                .unwrap()
                .to_string(),
        );
    }
    wait_count(&app, "failed", 5).await;
    browser.goto("/console/tasks?biz_type=orders&status=failed").await;
    assert_eq!(browser.texts("#tasks tr.task").await.len(), 5);
    browser.goto(&format!("/console/tasks/{}", ids[1])).await;
    assert_eq!(browser.texts("#attempts tbody tr").await.len(), 2, "both attempts are listed");
    assert!(browser.text("#attempts").await.contains("500"));

    // The receiver is fixed; one confirmed bulk replay delivers them all. The confirmation
    // restates the filter, names the first tasks, and says what the console knows of the
    // receiver: its last 5 minutes were all failures.
    receiver.answer_with(Answer::status(200));
    browser.goto("/console/tasks?biz_type=orders&status=failed").await;
    browser.submit("#bulk-replay").await;
    assert!(browser.text("#bulk-count").await.contains("Replay 5 failed tasks"), "{}", browser.text("#bulk-count").await);
    assert_eq!(browser.text("#bulk-scope").await, "Filter: failed tasks of biz type orders, due at any time.");
    // In due order, which their retries set: all five, in some order.
    let mut samples = browser.texts("#bulk-samples li").await;
    samples.sort();
    assert_eq!(samples, ["order-1", "order-2", "order-3", "order-4", "order-5"]);
    let warning = browser.text("#bulk-receiver .warning").await;
    assert!(warning.starts_with("orders: 0% delivered in the last 5 min (0 of 10 attempts)"), "{warning}");
    browser.screenshot(shot("bulk-replay-confirm.png")).await;
    browser.submit("#confirm-bulk-replay").await;
    assert!(browser.text(".flash").await.contains("Replayed 5 failed tasks"));
    // It lands on the operation's page, which follows its tasks by itself until every one
    // is delivered.
    let operation = browser.current_url().await;
    assert!(operation.starts_with(&format!("{}/console/audit/", app.address)), "{operation}");
    browser.wait_for("#operation-live[data-done]", Duration::from_secs(30)).await;
    assert_eq!(browser.text("#progress").await, "5 delivered, 0 failed, 0 still pending");
    assert_eq!(browser.texts("#operation-tasks tr.task").await.len(), 5);
    browser.screenshot(shot("bulk-operation.png")).await;
    wait_count(&app, "succeeded", 5).await;
    // The audit log says what it did and leads back to it.
    browser.goto("/console/audit").await;
    assert!(browser.text("#audit").await.contains("Replayed 5 of 5 matching failed tasks."), "{}", browser.text("#audit").await);
    browser.screenshot(shot("audit-log.png")).await;
    browser.click("#audit a.follow").await;
    assert_eq!(browser.current_url().await, operation);
    browser.goto("/console/tasks?biz_type=orders&status=succeeded").await;
    assert_eq!(browser.texts("#tasks tr.task").await.len(), 5);

    // A payload with markup is shown as text, not run.
    browser.goto(&format!("/console/tasks/{}", ids[0])).await;
    assert!(browser.text("#payload").await.contains("<script>alert('x')</script>"));
    assert_eq!(browser.execute("return document.querySelectorAll('script').length").await, json!(1), "only the console's own script");
    browser.screenshot(shot("task.png")).await;
    browser.goto("/console").await;
    assert!(browser.text("#dashboard").await.contains("orders"));
    browser.screenshot(shot("dashboard.png")).await;

    // A form stripped of its CSRF token is refused, and nothing changes.
    browser.goto("/console/biz-types/orders").await;
    browser.execute("document.querySelector('#pause input[name=csrf]').remove()").await;
    browser.submit("#pause").await;
    assert!(browser.source().await.contains("security token"));
    assert!(!chime::biz_types::by_name(&app.pool, "orders").await.unwrap().unwrap().paused);

    // Support staff can replay but not edit a biz type.
    chime::users::create(&app.pool, "helen", "support", "support-password").await.unwrap();
    browser.goto("/console").await;
    browser.submit("#logout").await;
    sign_in(&browser, &app, "helen", "support-password").await;
    browser.goto("/console/biz-types/orders").await;
    assert!(browser.exists("#biz-type fieldset[disabled]").await, "the settings are read-only");
    assert!(!browser.exists("#biz-type button[type=submit]").await);
    assert!(!browser.exists("#pause").await && !browser.exists("#rotate-secret").await && !browser.exists("#create-token").await);
    // A succeeded task is an admin's to deliver again (issue 16): support is not offered it.
    browser.goto(&format!("/console/tasks/{}", ids[2])).await;
    assert!(!browser.exists("#replay").await, "support is offered the replay of a succeeded task");
    // A failed one is support's to replay: made failed here as a receiver's permanent
    // error would leave it.
    sqlx::query("UPDATE tasks SET status = 'failed', finished_at = now() WHERE id = $1::uuid").bind(&ids[2]).execute(&app.pool).await.unwrap();
    browser.goto(&format!("/console/tasks/{}", ids[2])).await;
    // The receiver answers after 1.5 s, so that the replayed task is still running when its
    // page loads: answered at once, it was sometimes delivered before (a CI run).
    receiver.answer_with(Answer { delay: Duration::from_millis(1500), ..Answer::status(200) });
    browser.submit("#replay").await;
    assert!(browser.text(".flash").await.contains("Task replayed"));
    // The page of a task not yet finished refreshes itself (issue 4): it turns succeeded
    // without a reload, its attempt and finish time with it, never one without the others.
    assert_eq!(browser.execute("return document.getElementById('refresh').hidden").await, json!(false), "the script shows the switch");
    browser.execute("window.notReloaded = true").await;
    browser.wait_for("#status.succeeded", Duration::from_secs(20)).await;
    assert_eq!(browser.execute("return window.notReloaded === true").await, json!(true), "swapped in place");
    assert_eq!(browser.texts("#attempts tbody tr.attempt").await.len(), 4, "its new attempt beside its new state");
    assert!(browser.text("#finished").await != "—", "its finish time beside its new state");
    assert!(browser.text("#refreshed").await.contains("no longer refreshed"), "{}", browser.text("#refreshed").await);
    // Due now, it is delivered again at once (the receiver answers 200 by now).
    for _ in 0..100 {
        if task_status(&app, &ids[2]).await == "succeeded" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    browser.goto(&format!("/console/tasks/{}", ids[2])).await;
    assert_eq!(browser.text("#status").await, "succeeded");
    assert_eq!(browser.texts("#attempts tbody tr.attempt").await.len(), 4, "two failures, the bulk replay's success, this replay's");
    assert_eq!(browser.texts("#attempts tbody tr.mark").await.len(), 2, "a row at each replay: the bulk one and helen's");
    browser.close().await;
}

async fn task_status(app: &TestApp, id: &str) -> String {
    sqlx::query_scalar("SELECT status FROM tasks WHERE id = $1::uuid").bind(id).fetch_one(&app.pool).await.unwrap()
}

/// An admin creates a support user on the Users page; she signs in in her own browser and
/// does not see the page; the admin disables her (confirming): her next page is the
/// sign-in page, and signing in again is refused. Enabled again, she gets back in.
#[tokio::test]
async fn a_support_user_created_then_disabled_cannot_sign_in() {
    let app = crate::helpers::spawn_app().await;
    let admin = Browser::start().await;
    sign_in(&admin, &app, "admin", "test-admin-password").await;
    admin.click("header nav a[href='/console/users']").await;
    admin.fill("#new-user input[name=name]", "helen").await;
    admin.select("#new-user select[name=role]", "support").await;
    admin.fill("#new-user input[name=password]", "support-password").await;
    admin.submit("#new-user").await;
    assert!(admin.text(".flash").await.contains("support user helen created"), "{}", admin.text(".flash").await);
    assert!(admin.text("#user-helen").await.contains("never"), "no sign-in yet");

    let helen = Browser::start().await;
    sign_in(&helen, &app, "helen", "support-password").await;
    assert!(!helen.exists("header nav a[href='/console/users']").await, "support staff see Users in the nav");
    helen.goto("/console/users").await;
    assert!(helen.source().await.contains("only an admin can do this"));

    admin.goto("/console/users").await;
    assert!(!admin.text("#user-helen").await.contains("never"), "the sign-in is shown");
    // The Disable button asks first (console.js); the person says yes.
    admin.execute("window.confirm = () => true").await;
    admin.submit("#user-helen form.disable").await;
    assert!(admin.text(".flash").await.contains("helen disabled"));
    assert!(admin.text("#user-helen").await.contains("disabled"));

    helen.goto("/console/tasks").await;
    assert!(helen.current_url().await.contains("/console/login"), "her open session still works: {}", helen.current_url().await);
    helen.fill("#login input[name=username]", "helen").await;
    helen.fill("#login input[name=password]", "support-password").await;
    helen.submit("#login").await;
    assert_eq!(helen.text(".flash.error").await, "wrong user name or password");

    admin.submit("#user-helen form.enable").await;
    assert!(admin.text(".flash").await.contains("helen enabled"));
    sign_in(&helen, &app, "helen", "support-password").await;
    helen.close().await;
    admin.close().await;
}

/// Issue 4: an admin's page of a pending task, its reschedule form shown, refreshes itself
/// too: the form as served is not taken for one being filled in (the browser reads its
/// due time "10:00:00" as "10:00"), and the page turns succeeded without a reload.
#[tokio::test]
async fn a_pending_tasks_page_with_its_forms_refreshes_itself() {
    let app = crate::helpers::spawn_app().await;
    let token = app.biz_type("orders").await;
    // Due in an hour, on the minute (in the hot partitions, where force_status reaches).
    let due = (chrono::Utc::now() + chrono::Duration::hours(1)).format("%Y-%m-%dT%H:%M:00Z").to_string();
    let task = app.create_task(&token, json!({"biz_type": "orders", "key": "o-1", "run_at": due})).await;
    let id = task["id"].as_str().unwrap().to_string();
    let browser = Browser::start().await;
    sign_in(&browser, &app, "admin", "test-admin-password").await;
    browser.goto(&format!("/console/tasks/{id}")).await;
    assert!(browser.exists("#reschedule").await, "the admin's reschedule form");
    assert_eq!(browser.execute("return document.getElementById('auto-refresh').checked").await, json!(true));
    browser.execute("window.notReloaded = true").await;
    app.force_status(&id, "succeeded").await;
    browser.wait_for("#status.succeeded", Duration::from_secs(20)).await;
    assert_eq!(browser.execute("return window.notReloaded === true").await, json!(true), "swapped in place");
    assert!(!browser.exists("#reschedule").await, "a finished task has no reschedule form");
    browser.close().await;
}

/// Issue 16, "read its history after two replays, reload after each action without
/// repeating it": a task that failed once then succeeded is replayed twice by an admin,
/// each time through the confirm page a succeeded task asks for; reloading the confirm page
/// and the page after the replay repeats nothing; the history then numbers its four
/// attempts 1 to 4 across the replays, with a row naming who replayed it at each.
#[tokio::test]
async fn a_tasks_history_after_two_replays_reads_in_order_and_reloads_repeat_nothing() {
    let app = spawn_node().await;
    let receiver = Receiver::start(vec![Answer::status(500)], Answer::status(200)).await;
    let settings = chime::biz_types::Settings {
        callback_url: Some(receiver.url.clone()),
        max_attempts: Some(3),
        backoff_initial_ms: Some(100),
        backoff_max_ms: Some(200),
        ..Default::default()
    };
    chime::biz_types::create(&app.pool, "orders", &settings, chime::callback_hosts::CallbackHosts::Any).await.unwrap();
    let token = chime::biz_types::create_token(&app.pool, "orders").await.unwrap();
    let task = app.create_task(&token, json!({"biz_type": "orders", "key": "order-7"})).await;
    let id = task["id"].as_str().unwrap().to_string();
    let succeeded = || async {
        for _ in 0..300 {
            if task_status(&app, &id).await == "succeeded" {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("task {id} did not succeed");
    };
    succeeded().await;
    let replays =
        || async { sqlx::query_scalar::<_, i64>("SELECT count(*) FROM audit_log WHERE action = 'task.replay'").fetch_one(&app.pool).await.unwrap() };
    let browser = Browser::start().await;
    sign_in(&browser, &app, "admin", "test-admin-password").await;

    for round in 1..=2 {
        browser.goto(&format!("/console/tasks/{id}")).await;
        browser.click("#replay").await;
        browser.wait_for("#confirm-replay", Duration::from_secs(10)).await;
        assert!(browser.text("#replay-question").await.contains("called again"), "{}", browser.text("#replay-question").await);
        browser.client().refresh().await.expect("reloading the confirm page");
        assert_eq!(task_status(&app, &id).await, "succeeded", "round {round}: asking (and asking again) changes nothing");
        browser.submit("#confirm-replay").await;
        assert!(browser.text(".flash").await.contains("Task replayed"));
        browser.client().refresh().await.expect("reloading the task's page");
        assert_eq!(replays().await, round, "round {round}: the reload replayed it again");
        succeeded().await;
    }

    browser.goto(&format!("/console/tasks/{id}")).await;
    let ordinals: Vec<String> = browser.texts("#attempts tbody tr.attempt td:first-child").await.into_iter().map(|t| t.trim().to_string()).collect();
    assert_eq!(ordinals, ["1", "2", "3", "4"], "one failure, its retry's success, one success after each replay");
    let tries: Vec<String> = browser.texts("#attempts tbody tr.attempt td:nth-child(2)").await.into_iter().map(|t| t.trim().to_string()).collect();
    assert_eq!(tries, ["1", "2", "1", "1"], "each replay starts the task's own count again");
    let marks = browser.texts("#attempts tbody tr.mark").await;
    assert_eq!(marks.len(), 2, "{marks:?}");
    assert!(marks.iter().all(|m| m.starts_with("Replayed by user:admin at ")), "{marks:?}");
    let rows = browser.texts("#attempts tbody tr").await;
    assert!(rows[2].starts_with("Replayed") && rows[4].starts_with("Replayed"), "each mark stands before the attempt it led to: {rows:?}");
    let first: chrono::DateTime<chrono::Utc> = task["run_at"].as_str().unwrap().parse().unwrap();
    assert!(browser.text("#first-due").await.starts_with(&first.format("%Y-%m-%d %H:%M:%S").to_string()), "{}", browser.text("#first-due").await);
    browser.screenshot(shot("task-history.png")).await;
    browser.close().await;
}

/// Finding one task among thousands by the start of its key, as a support person would:
/// type the start, narrow to its biz type, page on and back, then type the whole key wanted,
/// which opens its task. The search stays in the address, to be shared.
#[tokio::test]
async fn a_task_is_found_by_its_key_prefix_among_thousands() {
    let app = crate::helpers::spawn_app().await;
    let orders = app.biz_type("orders").await;
    let billing = app.biz_type("billing").await;
    for batch in 0..3 {
        let items: Vec<_> =
            (0..1000).map(|i| json!({"biz_type": "orders", "key": format!("order-{:04}", batch * 1000 + i), "delay_ms": 3_600_000})).collect();
        let reply = app.post("/api/v1/tasks/batch", &orders, json!({"tasks": items})).await;
        assert_eq!(reply.status, 200, "{}", reply.body);
    }
    let reply = app.post("/api/v1/tasks/batch", &billing, json!({"tasks": [{"biz_type": "billing", "key": "order-1234"}]})).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let browser = Browser::start().await;
    sign_in(&browser, &app, "admin", "test-admin-password").await;

    browser.goto("/console/tasks").await;
    browser.fill("#filter input[name=q]", "order-12").await;
    browser.submit("#filter").await;
    assert!(browser.text("#count").await.starts_with("101 keys start with"), "{}", browser.text("#count").await);
    browser.select("#filter select[name=biz_type]", "orders").await;
    browser.submit("#filter").await;
    assert!(browser.text("#count").await.starts_with("100 keys start with"), "{}", browser.text("#count").await);
    let url = browser.current_url().await;
    assert!(url.contains("biz_type=orders") && url.contains("q=order-12"), "{url}");
    let keys = browser.texts("#tasks tbody tr td code").await;
    assert_eq!((keys.len(), keys[0].as_str(), keys[49].as_str()), (50, "order-1200", "order-1249"));
    browser.click("#next-page").await;
    assert_eq!(browser.texts("#tasks tbody tr td code").await[0], "order-1250");
    browser.click("#prev-page").await;
    assert_eq!(browser.texts("#tasks tbody tr td code").await[0], "order-1200");
    browser.screenshot(shot("find-by-key.png")).await;

    // A whole key one task holds opens that task.
    browser.fill("#filter input[name=q]", "order-1234").await;
    browser.submit("#filter").await;
    assert!(browser.current_url().await.contains("/console/tasks/0"), "{}", browser.current_url().await);
    assert!(browser.source().await.contains("order-1234"));
    browser.close().await;
}

/// Reading the dashboard under load (20,000 tasks) as a person would: biz types needing
/// attention first; the page refreshes itself in place (no reload) and shows a new failure
/// within seconds; switched off, it stays as it was, and stays off after a reload.
#[tokio::test]
async fn the_dashboard_refreshes_itself_until_switched_off() {
    let app = crate::helpers::spawn_app().await;
    for name in ["orders", "billing", "coupons", "emails"] {
        app.biz_type(name).await;
    }
    crate::console_find::load(&app, 1, 20_000).await;
    let browser = Browser::start().await;
    sign_in(&browser, &app, "admin", "test-admin-password").await;
    let names = || async { browser.texts("#dashboard tr.biz-type > td:first-child > a").await };
    assert_eq!(names().await, ["billing", "orders", "coupons", "emails"], "failed, retrying, then by name");
    assert_eq!(browser.execute("return document.getElementById('refresh').hidden").await, json!(false), "the script shows the switch");
    assert_eq!(browser.execute("return document.getElementById('auto-refresh').checked").await, json!(true), "on by default");

    // A task of emails fails: the page shows it without being reloaded.
    browser.execute("window.notReloaded = true").await;
    let failing = |key: &'static str| {
        let app = &app;
        async move {
            let id: String = sqlx::query_scalar("SELECT task_id::text FROM task_keys WHERE key = $1").bind(key).fetch_one(&app.pool).await.unwrap();
            app.force_status(&id, "failed").await;
        }
    };
    failing("emails-3").await;
    let mut seen = vec![];
    for _ in 0..30 {
        seen = names().await;
        if seen[1] == "emails" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_eq!(seen, ["billing", "emails", "orders", "coupons"]);
    assert_eq!(browser.execute("return window.notReloaded === true").await, json!(true), "swapped in place");
    assert!(browser.text("#refreshed").await.starts_with("updated "));

    // Switched off, remembered across a reload; a new failure waits for the person.
    browser.check("#auto-refresh", false).await;
    browser.goto("/console").await;
    assert_eq!(browser.execute("return document.getElementById('auto-refresh').checked").await, json!(false), "still off");
    failing("coupons-2").await;
    tokio::time::sleep(Duration::from_secs(12)).await;
    assert_eq!(names().await, ["billing", "emails", "orders", "coupons"], "not refreshed");
    browser.goto("/console").await;
    assert_eq!(names().await, ["billing", "coupons", "emails", "orders"]);
}

/// Issue 16, "usable at 390 px wide": on a phone-sized window the dashboard, the task list,
/// a task's page, a biz type's and a timer's page fit the width (the nav wraps, tables
/// scroll inside their card): nothing makes the page itself scroll sideways.
#[tokio::test]
async fn the_console_fits_a_390_px_wide_screen() {
    let app = crate::helpers::spawn_app().await;
    let token = app.biz_type("orders").await;
    let mut id = String::new();
    for i in 0..5 {
        let task = app.create_task(&token, json!({"biz_type": "orders", "key": format!("order-with-a-rather-long-key-{i:04}"), "payload": {"customer": "a-long-customer-name", "i": i}})).await;
        id = task["id"].as_str().unwrap().to_string();
    }
    let timer = app.post("/api/v1/timers", &token, json!({"biz_type": "orders", "key": "nightly", "cron": "0 30 2 * * *"})).await;
    assert_eq!(timer.status, 201, "{}", timer.body);
    let timer_id = timer.body["id"].as_str().unwrap().to_string();

    let browser = Browser::start().await;
    sign_in(&browser, &app, "admin", "test-admin-password").await;
    browser.client().set_window_size(390, 844).await.expect("a phone-sized window");
    let width = browser.execute("return window.innerWidth").await;
    assert_eq!(width, json!(390), "the window is as narrow as asked");
    for path in [
        "/console".to_string(),
        "/console/tasks".into(),
        format!("/console/tasks/{id}"),
        "/console/biz-types/orders".into(),
        format!("/console/timers/{timer_id}"),
        "/console/cluster".into(),
    ] {
        browser.goto(&path).await;
        let scroll_width = browser.execute("return document.documentElement.scrollWidth").await;
        // What sticks out, for the message: the outermost elements reaching past the edge.
        let wide = browser
            .execute(
                "return [...document.querySelectorAll('body *')].filter(e => e.getBoundingClientRect().right > 391 \
                   && !(e.parentElement && e.parentElement.getBoundingClientRect().right > 391)) \
                   .map(e => e.tagName + '#' + e.id + '.' + e.className + ' ' + Math.round(e.getBoundingClientRect().right)).slice(0, 10)",
            )
            .await;
        assert!(scroll_width.as_i64().unwrap() <= 390, "{path}: the page is {scroll_width} px wide at 390 px; past the edge: {wide}");
        assert!(browser.exists("header.top nav a[href='/console/tasks']").await, "{path}: the nav is there");
    }
    browser.goto("/console/tasks").await;
    browser.screenshot(shot("tasks-390px.png")).await;
    // Issue 7: a biz type's whole row is in view on the dashboard, not 3 of its columns
    // with the rest to scroll to: a card, its counts labelled.
    browser.goto("/console").await;
    let cells = "[...document.querySelectorAll('#dashboard tr.biz-type td')]";
    assert_eq!(browser.execute(&format!("return {cells}.length")).await, json!(8));
    let outside = browser.execute(&format!("return {cells}.filter(e => e.getBoundingClientRect().right > 390).map(e => e.className)")).await;
    assert_eq!(outside, json!([]), "cells past the screen's edge");
    assert_eq!(
        browser.execute("return getComputedStyle(document.querySelector('#dashboard td.pending'), '::before').content").await,
        json!("\"Pending\"")
    );
    browser.screenshot(shot("dashboard-390px.png")).await;
    browser.close().await;
}

/// Issue 16, "context where it is needed": an admin opens a biz type, reads its last hour
/// and sends a test callback; the page it comes back to says what the receiver answered,
/// and a reload sends nothing again.
#[tokio::test]
async fn an_admin_tests_a_biz_types_callback_from_its_page() {
    let app = crate::helpers::spawn_app().await;
    let receiver = Receiver::start(vec![], Answer::status(200)).await;
    let settings = chime::biz_types::Settings { callback_url: Some(receiver.url.clone()), ..Default::default() };
    chime::biz_types::create(&app.pool, "orders", &settings, chime::callback_hosts::CallbackHosts::Any).await.unwrap();
    let browser = Browser::start().await;
    sign_in(&browser, &app, "admin", "test-admin-password").await;
    browser.goto("/console/biz-types/orders").await;
    assert!(browser.text("#delivery-rate").await.contains("no attempts"), "{}", browser.text("#delivery-rate").await);
    browser.submit("#test-callback").await;
    let flash = browser.text(".flash").await;
    assert!(flash.contains("HTTP 200") && flash.contains("signature accepted"), "{flash}");
    assert_eq!(receiver.received().len(), 1);
    browser.client().refresh().await.expect("reloading the biz type's page");
    assert_eq!(receiver.received().len(), 1, "a reload sends no second test");
    browser.close().await;
}

/// A bulk cancel from the task list lands on the operation's page, which says its tasks
/// are cancelled and has nothing to wait for; each task's history links back to it.
/// Before, it landed on the list, with nothing saying what the operation did.
#[tokio::test]
async fn a_bulk_cancel_lands_on_its_operation_and_its_tasks_link_back() {
    let app = crate::helpers::spawn_app().await;
    let token = app.biz_type("orders").await;
    let mut ids = Vec::new();
    for i in 1..=3 {
        let task = app.create_task(&token, json!({"biz_type": "orders", "key": format!("late-{i}"), "delay_ms": 3_600_000})).await;
        ids.push(task["id"].as_str().unwrap().to_string());
    }
    let browser = Browser::start().await;
    sign_in(&browser, &app, "admin", "test-admin-password").await;
    // The search box's key prefix is the bulk action's.
    browser.goto("/console/tasks?biz_type=orders&status=pending&q=late-").await;
    browser.submit("#bulk-cancel").await;
    assert_eq!(browser.text("#bulk-scope").await, "Filter: pending tasks of biz type orders, keys starting late-, due at any time.");
    assert_eq!(browser.texts("#bulk-samples li").await, ["late-1", "late-2", "late-3"]);
    browser.submit("#confirm-bulk-cancel").await;
    assert_eq!(browser.text(".flash").await, "Cancelled 3 pending tasks.");
    let operation = browser.current_url().await;
    assert!(operation.starts_with(&format!("{}/console/audit/", app.address)), "{operation}");
    assert!(browser.exists("#operation-live[data-done]").await, "a cancel has nothing to follow");
    assert_eq!(browser.text("#progress").await, "3 cancelled, 0 since replayed or rescheduled");
    assert_eq!(browser.texts("#operation-tasks tr.task .badge").await, ["cancelled", "cancelled", "cancelled"]);
    // From a task it cancelled, back to it.
    browser.click("#operation-tasks tr.task a").await;
    assert_eq!(browser.current_url().await, format!("{}/console/tasks/{}", app.address, ids[0]));
    browser.click(&format!("#attempts tr.mark a[href='{}']", operation.trim_start_matches(&app.address))).await;
    assert_eq!(browser.current_url().await, operation);
    browser.close().await;
}

/// The support scenario with the combined search, as a support person walks it: a customer
/// quotes order 10042; typed in the key box it finds no key, and the page offers the
/// payloads holding it (across biz types, saying how that search is bounded); the task
/// found failed against a broken receiver, as its page says; the receiver is fixed, the
/// task replayed from its page, and its page then says it was delivered. Then the other
/// failed tasks of that key prefix are found with the box and the state together, all
/// selected with one box; "Cancel selected" asks first (declined: nothing changes), and
/// "Replay selected" delivers them.
#[tokio::test]
async fn support_finds_reads_fixes_replays_and_confirms_delivery_with_the_combined_search() {
    let app = spawn_node().await;
    let receiver = Receiver::start(vec![], Answer::status(500)).await;
    let settings = chime::biz_types::Settings { callback_url: Some(receiver.url.clone()), max_attempts: Some(1), ..Default::default() };
    chime::biz_types::create(&app.pool, "payments", &settings, chime::callback_hosts::CallbackHosts::Any).await.unwrap();
    let payments = chime::biz_types::create_token(&app.pool, "payments").await.unwrap();
    let invoices = app.biz_type("invoices").await;
    let mut ids = vec![];
    for i in 0..4 {
        let task = app.create_task(&payments, json!({"biz_type": "payments", "key": format!("pay-{i}"), "payload": {"order_id": 10040 + i}})).await;
        ids.push(task["id"].as_str().unwrap().to_string());
    }
    app.create_task(&invoices, json!({"biz_type": "invoices", "key": "inv-1", "delay_ms": 3_600_000, "payload": {"order_id": 7}})).await;
    wait_count(&app, "failed", 4).await;
    chime::users::create(&app.pool, "helen", "support", "support-password").await.unwrap();
    let browser = Browser::start().await;
    sign_in(&browser, &app, "helen", "support-password").await;

    // Find: the number is no key; the page offers the payloads holding it.
    browser.goto("/console/tasks").await;
    browser.fill("#filter input[name=q]", "10042").await;
    browser.submit("#filter").await;
    assert_eq!(browser.text("p.empty").await, "No task matches.");
    assert!(browser.text("#hints").await.contains("payloads with order_id = 10042"), "{}", browser.text("#hints").await);
    // A click does not wait for the page it leads to: wait for what only that page has.
    browser.click("#hints a").await;
    browser.wait_for("#bound", Duration::from_secs(10)).await;
    assert_eq!(browser.texts("#tasks tbody tr td code").await, ["pay-2"]);
    assert!(browser.text("#bound").await.starts_with("Across every biz type a payload search reads the payload index"));
    // Read: why it failed.
    browser.click("#tasks tbody tr a").await;
    browser.wait_for("#attempts", Duration::from_secs(10)).await;
    assert!(browser.current_url().await.ends_with(&format!("/console/tasks/{}", ids[2])), "{}", browser.current_url().await);
    assert!(browser.text("#attempts").await.contains("500"), "{}", browser.text("#attempts").await);
    // Fix, replay, confirm delivered.
    receiver.answer_with(Answer::status(200));
    browser.submit("#replay").await;
    assert!(browser.text(".flash").await.contains("Task replayed"));
    crate::helpers::wait_until("pay-2 delivered", Duration::from_secs(30), || async { task_status(&app, &ids[2]).await == "succeeded" }).await;
    browser.goto(&format!("/console/tasks/{}", ids[2])).await;
    assert_eq!(browser.text("#status").await, "succeeded");

    // The rest of that prefix's failed tasks: the box and the state together.
    browser.goto("/console/tasks").await;
    browser.fill("#filter input[name=q]", "pay-").await;
    browser.select("#filter select[name=status]", "failed").await;
    browser.submit("#filter").await;
    assert_eq!(browser.texts("#tasks tbody tr td code").await, ["pay-0", "pay-1", "pay-3"]);
    assert!(browser.text("#count").await.starts_with("3 keys start with pay- and match the filters"), "{}", browser.text("#count").await);
    browser.check("#select-all", true).await;
    let ticked = "return document.querySelectorAll('input[name=id][form=selected]:checked').length";
    assert_eq!(browser.execute(ticked).await, json!(3), "one box selects every row");
    // Cancel asks first; declined, nothing changes.
    browser.execute("window.confirm = (q) => { window.asked = q; return false; }").await;
    browser.click("#selected button[value=cancel]").await;
    assert_eq!(browser.execute("return window.asked").await, json!("Cancel the 3 selected tasks? They will not be delivered."));
    assert_eq!(count(&app, "failed").await, 3);
    browser.click("#selected button[value=replay]").await;
    browser.wait_for(".flash", Duration::from_secs(10)).await;
    assert_eq!(browser.text(".flash").await, "Replayed 3 of 3 selected tasks.");
    wait_count(&app, "succeeded", 4).await;
    browser.goto("/console/tasks?q=pay-&status=succeeded").await;
    assert_eq!(browser.texts("#tasks tbody tr td code").await, ["pay-0", "pay-1", "pay-2", "pay-3"]);
    browser.close().await;
}
