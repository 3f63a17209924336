//! The console against WCAG 2 A and AA, as axe-core checks it in a real Chromium: every page,
//! signed in as an admin and as support staff, signed out, and the error pages. Also what a
//! keyboard or a phone needs that a test can see: a skip link to `main` on every page, a
//! refused field marked invalid, no sideways scroll of the page at 390 px.
//!
//! axe-core is not in the repository: tests/setup.sh installs the pinned version under
//! target/axe (with npm), and these tests fail, saying so, when it is missing.

use std::path::PathBuf;
use std::time::Duration;

use fantoccini::key::Key;
use serde_json::{Value, json};

use crate::browser::Browser;
use crate::console::{ADMIN_PASSWORD, no_redirects, sign_in as sign_in_http};
use crate::helpers::{TestApp, spawn_app, spawn_node};
use crate::receiver::{Answer, Receiver};

/// The axe-core version tests/setup.sh installs; the two must agree.
const AXE_VERSION: &str = "4.14.1";
const WCAG_TAGS: &[&str] = &["wcag2a", "wcag2aa", "wcag21a", "wcag21aa"];
/// axe-core files these under best practice, not under a WCAG tag; they are how it sees
/// what WCAG 1.3.1 and 2.4.1 ask (headers that name their column, a main landmark).
const MORE_RULES: &[&str] = &["empty-table-header", "landmark-one-main", "region", "page-has-heading-one"];

fn axe_dir() -> PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/axe/node_modules/axe-core")
}

/// axe-core's script, checked to be the pinned version.
fn axe_source() -> String {
    let dir = axe_dir();
    let install = format!("tests/setup.sh (or: npm install --no-save --prefix target/axe axe-core@{AXE_VERSION})");
    let package =
        std::fs::read_to_string(dir.join("package.json")).unwrap_or_else(|e| panic!("axe-core is missing ({}: {e}): run {install}", dir.display()));
    let version = serde_json::from_str::<Value>(&package).ok().and_then(|p| p["version"].as_str().map(str::to_string));
    assert_eq!(version.as_deref(), Some(AXE_VERSION), "{} holds another axe-core: run {install}", dir.display());
    std::fs::read_to_string(dir.join("axe.min.js")).unwrap_or_else(|e| panic!("reading axe.min.js in {}: {e}: run {install}", dir.display()))
}

/// Runs axe-core on the current page with the WCAG 2 A/AA rules and `MORE_RULES`: each
/// violation as "rule id at the node's selector: help text".
async fn violations(browser: &Browser, axe: &str) -> Vec<String> {
    // Injected through WebDriver, which the page's Content-Security-Policy does not govern.
    browser.execute(&format!("{axe}\n;return typeof axe")).await;
    let script = "const done = arguments[arguments.length - 1];
        const rules = Object.fromEntries(arguments[1].map(r => [r, { enabled: true }]));
        axe.run(document, { runOnly: { type: 'tag', values: arguments[0] }, rules, resultTypes: ['violations'] })
          .then(r => done(r.violations.flatMap(v => v.nodes.map(n => v.id + ' at `' + n.target.join(' ') + '`: ' + v.help
                + (n.failureSummary ? ' (' + n.failureSummary.replace(/\\s+/g, ' ') + ')' : '')))),
                e => done(['axe-core failed: ' + e]));";
    let found =
        browser.client().execute_async(script, vec![json!(WCAG_TAGS), json!(MORE_RULES)]).await.unwrap_or_else(|e| panic!("running axe-core: {e}"));
    serde_json::from_value(found).expect("a list of strings")
}

/// Checks the page as it is: axe-core's rules, the skip link, then at 390 px wide the width
/// and axe-core's rules again (the window is made narrow, then wide again). Adds what is
/// wrong to `problems`.
async fn check_page(browser: &Browser, axe: &str, page: &str, problems: &mut Vec<String>) {
    for v in violations(browser, axe).await {
        problems.push(format!("{page}: {v}"));
    }
    let skip = browser
        .execute(
            "const first = document.querySelector('body a[href]');
             const href = first ? first.getAttribute('href') : '';
             const target = href.startsWith('#') ? document.getElementById(href.slice(1)) : null;
             return target ? target.tagName.toLowerCase() : (first ? first.outerHTML : 'no link');",
        )
        .await;
    if skip != json!("main") {
        problems.push(format!("{page}: the first link is not a skip link to a `main` that is there: {skip}"));
    }
    browser.client().set_window_size(390, 844).await.expect("a phone-sized window");
    let widths = browser.execute("return [document.scrollingElement.scrollWidth, window.innerWidth]").await;
    if widths[0].as_i64() > widths[1].as_i64() {
        problems.push(format!("{page}: at 390 px wide the page scrolls sideways (scrollWidth, innerWidth: {widths})"));
    }
    // Narrow, tables scroll in their own box: one a keyboard cannot reach fails here.
    for v in violations(browser, axe).await {
        problems.push(format!("{page} at 390 px: {v}"));
    }
    browser.client().set_window_size(1280, 900).await.expect("a desktop-sized window");
}

async fn sign_in(browser: &Browser, app: &TestApp, user: &str, password: &str) {
    browser.goto(&format!("{}/console/login", app.address)).await;
    browser.fill("#login input[name=username]", user).await;
    browser.fill("#login input[name=password]", password).await;
    browser.submit("#login").await;
    assert_eq!(browser.current_url().await, format!("{}/console", app.address));
}

async fn wait_status(app: &TestApp, id: &str, status: &str) {
    for _ in 0..300 {
        let now: String = sqlx::query_scalar("SELECT status FROM tasks WHERE id = $1::uuid").bind(id).fetch_one(&app.pool).await.unwrap();
        if now == status {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("task {id} did not become {status}");
}

/// Every console page (the routes of src/console/mod.rs that answer a GET), as an admin and
/// as support staff, passes axe-core's WCAG 2 A/AA rules, has a skip link to `main`, and fits
/// 390 px; a form's refused field says so to assistive technology.
#[tokio::test]
async fn every_console_page_passes_wcag_2_aa() {
    let axe = axe_source();
    let app = spawn_node().await;
    let receiver = Receiver::start(vec![], Answer::status(500)).await;
    let settings = chime::biz_types::Settings { callback_url: Some(receiver.url.clone()), max_attempts: Some(1), ..Default::default() };
    chime::biz_types::create(&app.pool, "orders", &settings, chime::callback_hosts::CallbackHosts::Any).await.unwrap();
    let token = chime::biz_types::create_token(&app.pool, "orders").await.unwrap();
    // A failed task with an attempt (the receiver answers 500), a pending one far ahead, a
    // succeeded one (made so), a keyless one.
    let key = "order-with-a-rather-long-key-that-has-to-wrap-somewhere-on-a-phone-0001";
    let failed =
        app.create_task(&token, json!({"biz_type": "orders", "key": key, "payload": {"order": 1}})).await["id"].as_str().unwrap().to_string();
    wait_status(&app, &failed, "failed").await;
    let pending =
        app.create_task(&token, json!({"biz_type": "orders", "key": "order-2", "delay_ms": 3_600_000})).await["id"].as_str().unwrap().to_string();
    let succeeded = app.create_task(&token, json!({"biz_type": "orders", "delay_ms": 3_600_000})).await["id"].as_str().unwrap().to_string();
    app.force_status(&succeeded, "succeeded").await;
    let timer = app.post("/api/v1/timers", &token, json!({"biz_type": "orders", "key": "nightly", "cron": "0 30 2 * * *"})).await;
    assert_eq!(timer.status, 201, "{}", timer.body);
    let timer = timer.body["id"].as_str().unwrap().to_string();
    chime::users::create(&app.pool, "helen", "support", "support-password").await.unwrap();
    // A bulk operation (a cancel of a task of its own), whose page lists its tasks, and an
    // entry of another action.
    app.create_task(&token, json!({"biz_type": "orders", "key": "order-3", "delay_ms": 3_600_000})).await;
    let cancel = app.post("/api/v1/biz-types/orders/tasks/cancel", &token, json!({"key_prefix": "order-3"})).await;
    assert_eq!(cancel.status, 200, "{}", cancel.body);
    let bulk: i64 = sqlx::query_scalar("SELECT id FROM audit_log WHERE action = 'task.bulk_cancel'").fetch_one(&app.pool).await.unwrap();
    let entry: i64 = sqlx::query_scalar("SELECT min(id) FROM audit_log").fetch_one(&app.pool).await.unwrap();

    let browser = Browser::start().await;
    let mut problems = Vec::new();
    browser.goto(&format!("{}/console/login", app.address)).await;
    check_page(&browser, &axe, "the sign-in page", &mut problems).await;
    browser.fill("#login input[name=username]", "admin").await;
    browser.fill("#login input[name=password]", "wrong").await;
    browser.submit("#login").await;
    check_page(&browser, &axe, "the sign-in page, refused", &mut problems).await;
    sign_in(&browser, &app, "admin", "test-admin-password").await;

    let admin_pages = [
        "/console".to_string(),
        "/console/biz-types".into(),
        "/console/biz-types/orders".into(),
        "/console/biz-types/new".into(),
        "/console/tasks".into(),
        "/console/tasks?status=failed".into(),
        "/console/tasks?status=pending".into(),
        "/console/tasks?q=order-".into(),
        "/console/tasks?q=ORDER-".into(),
        "/console/tasks?biz_type=nope&from=2026-11-22T10:00&to=2026-11-22T09:00".into(),
        format!("/console/tasks/{failed}"),
        format!("/console/tasks/{pending}"),
        format!("/console/tasks/{succeeded}"),
        format!("/console/tasks/{succeeded}/replay"),
        "/console/tasks/replay-failed?status=failed".into(),
        "/console/tasks/cancel-pending?status=pending".into(),
        "/console/timers".into(),
        "/console/timers/new".into(),
        format!("/console/timers/{timer}"),
        "/console/cluster".into(),
        "/console/audit".into(),
        format!("/console/audit/{bulk}"),
        format!("/console/audit/{entry}"),
        "/console/users".into(),
        "/console/account".into(),
        "/console/no-such-page".into(),
        "/console/tasks/not-a-task-id".into(),
    ];
    for page in &admin_pages {
        browser.goto(page).await;
        check_page(&browser, &axe, page, &mut problems).await;
    }

    // By keyboard: the first Tab reaches the skip link, which leads into `main`, where the
    // next Tab is the search.
    browser.goto("/console/tasks").await;
    let focused = "const f = document.activeElement; return f.getAttribute('name') || f.className || f.tagName;";
    browser.press(&[Key::Tab.into()]).await;
    assert_eq!(browser.execute(focused).await, json!("skip"), "the first Tab");
    browser.press(&[Key::Enter.into(), Key::Tab.into()]).await;
    assert_eq!(browser.execute(focused).await, json!("q"), "the skip link, then a Tab");

    // On a phone the attempts table scrolls in its own box, which a keyboard can reach.
    browser.goto(&format!("/console/tasks/{failed}")).await;
    browser.client().set_window_size(390, 844).await.expect("a phone-sized window");
    let attempts = browser
        .execute(
            "const box = document.getElementById('attempts').parentElement;
             return [box.scrollWidth > box.clientWidth, box.tabIndex, getComputedStyle(box).overflowX];",
        )
        .await;
    assert_eq!(attempts, json!([true, 0, "auto"]), "the attempts table's box: scrolls, is focusable, overflows by scrolling");
    browser.client().set_window_size(1280, 900).await.expect("a desktop-sized window");

    // A flash message, a secret shown once, and a refused field.
    browser.goto("/console/biz-types/new").await;
    browser.fill("#biz-type input[name=name]", "billing").await;
    browser.fill("#biz-type input[name=callback_url]", &receiver.url).await;
    browser.fill("#biz-type input[name=max_attempts]", "two").await;
    browser.submit("#biz-type").await;
    let invalid = browser
        .execute(
            "const f = document.querySelector('#biz-type input[name=max_attempts]');
             const said = document.getElementById(f.getAttribute('aria-describedby') || '');
             return [f.getAttribute('aria-invalid'), said && said.textContent.trim(),
                     document.querySelector('#biz-type input[name=name]').getAttribute('aria-invalid')]",
        )
        .await;
    assert_eq!(invalid, json!(["true", "must be a whole number", null]), "the refused field, and only it, is marked and described");
    check_page(&browser, &axe, "a biz type's form, refused", &mut problems).await;
    browser.fill("#biz-type input[name=max_attempts]", "2").await;
    browser.submit("#biz-type").await;
    assert!(browser.exists("#revealed").await);
    // The copy button beside it puts the secret on the clipboard (stubbed: headless
    // Chromium's clipboard needs a permission), and says so.
    browser.execute("navigator.clipboard.writeText = async text => { window.copied = text; }").await;
    browser.click("button[data-copy=revealed]").await;
    browser.wait_for(".reveal [role=status]:not(:empty)", Duration::from_secs(5)).await;
    assert_eq!(browser.text(".reveal [role=status]").await, "Copied.");
    assert_eq!(browser.execute("return window.copied").await, json!(browser.text("#revealed").await));
    check_page(&browser, &axe, "a new biz type with its secret and a flash", &mut problems).await;
    browser.goto("/console/biz-types/billing").await;
    browser.execute("window.confirm = () => true").await;
    browser.submit("#pause").await;
    check_page(&browser, &axe, "a paused biz type", &mut problems).await;
    browser.goto("/console/biz-types").await;
    check_page(&browser, &axe, "the biz types with one paused", &mut problems).await;

    browser.goto("/console").await;
    browser.submit("#logout").await;
    sign_in(&browser, &app, "helen", "support-password").await;
    for page in ["/console".to_string(), "/console/biz-types/orders".into(), format!("/console/tasks/{failed}"), "/console/users".into()] {
        browser.goto(&page).await;
        check_page(&browser, &axe, &format!("{page} (support)"), &mut problems).await;
    }
    browser.close().await;
    assert!(problems.is_empty(), "{} accessibility problems:\n{}", problems.len(), problems.join("\n"));
}

/// The sign-in page with a provider's button (and with it alone, local passwords off) and
/// the page that refuses a sign-in through the provider pass the same checks.
#[tokio::test]
async fn the_sign_in_pages_of_an_openid_provider_pass_wcag_2_aa() {
    let axe = axe_source();
    let (app, _idp) = crate::oidc::spawn_with_idp(|_| {}).await;
    let browser = Browser::start().await;
    let mut problems = Vec::new();
    browser.goto(&format!("{}/console/login", app.address)).await;
    check_page(&browser, &axe, "the sign-in page with a provider", &mut problems).await;
    crate::oidc::sign_in_at_idp(&browser, &app, "nora", "nora-password").await;
    assert!(browser.exists("#refusal").await, "{}", browser.current_url().await);
    check_page(&browser, &axe, "a sign-in through the provider, refused", &mut problems).await;
    browser.close().await;
    let (app, _idp) = crate::oidc::spawn_with_idp(|s| s.local_passwords = false).await;
    let browser = Browser::start().await;
    browser.goto(&format!("{}/console/login", app.address)).await;
    check_page(&browser, &axe, "the sign-in page with the provider alone", &mut problems).await;
    browser.close().await;
    assert!(problems.is_empty(), "{} accessibility problems:\n{}", problems.len(), problems.join("\n"));
}

/// The small things a reader meets: counts with thousands separators and their nouns
/// singular for one, a task's key as its page's heading (its id under it), a finished
/// task's due time read as its last, row checkboxes named by key, and a favicon.
#[tokio::test]
async fn counts_read_right_and_a_task_is_named_by_its_key() {
    let app = spawn_app().await;
    let token = app.biz_type("orders").await;
    for (first, n) in [(0, 1000), (1000, 346)] {
        let items: Vec<_> =
            (first..first + n).map(|i| json!({"biz_type": "orders", "key": format!("order-{i:04}"), "delay_ms": 3_600_000})).collect();
        let reply = app.post("/api/v1/tasks/batch", &token, json!({"tasks": items})).await;
        assert_eq!(reply.status, 200, "{}", reply.body);
    }
    let keyless = app.create_task(&token, json!({"biz_type": "orders", "delay_ms": 3_600_000})).await["id"].as_str().unwrap().to_string();
    let id: String = sqlx::query_scalar("SELECT task_id::text FROM task_keys WHERE key = 'order-0001'").fetch_one(&app.pool).await.unwrap();
    app.force_status(&id, "failed").await;
    let console = sign_in_http(&app, "admin", ADMIN_PASSWORD).await;

    let page = console.get("/console/tasks?status=pending").await;
    assert!(page.body.contains("1,346 tasks match"), "{}", page.body);
    let page = console.get("/console/tasks/cancel-pending?status=pending").await;
    assert!(page.body.contains("Cancel <strong>1,346</strong> pending tasks") && page.body.contains("Cancel 1,346</button>"), "{}", page.body);
    let page = console.get("/console/tasks?status=failed").await;
    assert!(page.body.contains("1 task matches"), "{}", page.body);
    assert!(page.body.contains(r#"aria-label="select order-0001""#), "a row's checkbox is named by the task's key: {}", page.body);
    // (A whole key one task holds opens it: one key here is the one failed among a prefix's.)
    let page = console.get("/console/tasks?q=order-000&status=failed").await;
    assert!(page.body.contains("1 key starts with"), "{}", page.body);
    let page = console.get("/console/tasks?q=order-000").await;
    assert!(page.body.contains("10 keys start with"), "{}", page.body);
    let page = console.get(&format!("/console/tasks?q={}", &keyless[..35])).await;
    assert!(page.body.contains("1 task id starts with"), "{}", page.body);
    assert!(page.body.contains(&format!(r#"aria-label="select task {keyless}""#)), "without a key, by its id: {}", page.body);

    let page = console.get(&format!("/console/tasks/{id}")).await;
    assert!(page.body.contains("<h1>Task <code>order-0001</code></h1>"), "{}", page.body);
    assert!(page.body.contains(&format!(r#"<p class="muted small" id="task-id">id <code>{id}</code></p>"#)), "{}", page.body);
    assert!(page.body.contains("<dt>Last due</dt>") && !page.body.contains("<dt>Due</dt>"), "a failed task is not due: {}", page.body);
    let page = console.get(&format!("/console/tasks/{keyless}")).await;
    assert!(page.body.contains(&format!("<h1>Task <code>{keyless}</code></h1>")) && !page.body.contains(r#"id="task-id""#), "{}", page.body);
    assert!(page.body.contains("<dt>Due</dt>"), "{}", page.body);

    // Every page links the icon; /favicon.ico, which browsers ask for anyway, leads to it.
    let icon = page.body.split(r#"<link rel="icon" href=""#).nth(1).expect("the page links an icon").split('"').next().unwrap().to_string();
    assert!(icon.starts_with("/static/favicon.svg?v="), "{icon}");
    let client = no_redirects();
    let login = client.get(format!("{}/console/login", app.address)).send().await.unwrap().text().await.unwrap();
    assert!(login.contains(&format!(r#"<link rel="icon" href="{icon}""#)), "{login}");
    let ico = client.get(format!("{}/favicon.ico", app.address)).send().await.unwrap();
    assert_eq!((ico.status().as_u16(), ico.headers()["location"].to_str().unwrap()), (303, icon.as_str()));
    let svg = client.get(format!("{}{icon}", app.address)).send().await.unwrap();
    assert_eq!(svg.headers()["content-type"], "image/svg+xml");
    assert!(svg.text().await.unwrap().starts_with("<svg "));
}
