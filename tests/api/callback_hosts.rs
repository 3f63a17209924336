//! The deny list for private callback addresses (CHIME_DENY_PRIVATE_CALLBACKS): refused when
//! a biz type is saved, and again at delivery, where names are resolved. Off by default:
//! every other test delivers to 127.0.0.1.

use chime::biz_types::{self, Settings};
use chime::callback_hosts::CallbackHosts;
use chime::config::ServeArgs;
use serde_json::json;

use crate::cli::chime;
use crate::console::{ADMIN_PASSWORD, sign_in};
use crate::delivery::wait_for_status;
use crate::helpers::{TestApp, spawn_app_with, spawn_node};
use crate::receiver::{Answer, Receiver};

fn denying() -> ServeArgs {
    ServeArgs { deny_private_callbacks: true, ..ServeArgs::default() }
}

/// The part of the field error next to the callback URL on a refused console form.
fn callback_url_error(body: &str) -> &str {
    let start = body.find(r#"data-field="callback_url">"#).expect("the callback_url field") + 26;
    body[start..].split('<').next().unwrap()
}

/// With the deny list on, the console and the command line refuse a callback URL whose host
/// is a denied address or `localhost`, naming the range; a public one is accepted.
#[tokio::test]
async fn private_callback_urls_are_refused_when_saved() {
    let app = spawn_app_with(ServeArgs { engine: false, ..denying() }).await;
    let admin = sign_in(&app, "admin", ADMIN_PASSWORD).await;
    for (url, range) in [
        ("http://127.0.0.1:9000/hook", "loopback"),
        ("http://[::ffff:10.0.0.5]/hook", "private"),
        ("http://169.254.169.254/latest/meta-data", "link-local"),
        ("http://localhost./hook", "loopback"),
    ] {
        let page = admin.post("/console/biz-types", &[("name", "orders"), ("mode", "callback"), ("callback_url", url)]).await;
        assert_eq!(page.status, 422, "{url}: {}", page.body);
        let error = callback_url_error(&page.body);
        assert!(error.contains(&format!("is in a denied range ({range}); see CHIME_DENY_PRIVATE_CALLBACKS")), "{url}: {error}");
    }
    assert!(biz_types::list(&app.pool).await.unwrap().is_empty());

    let page = admin.post("/console/biz-types", &[("name", "orders"), ("mode", "callback"), ("callback_url", "https://hooks.example.com/x")]).await;
    assert_eq!(page.status, 303, "created, and sent to its page: {}", page.body);
    let page = admin.post("/console/biz-types/orders", &[("mode", "callback"), ("callback_url", "http://10.1.2.3/x")]).await;
    assert_eq!(page.status, 422);
    assert!(callback_url_error(&page.body).contains("10.1.2.3 is in a denied range (private)"), "{}", page.body);
    assert_eq!(biz_types::by_name(&app.pool, "orders").await.unwrap().unwrap().callback_url, "https://hooks.example.com/x");

    // The command line reads the setting from the environment, as `serve` does.
    let args = ["biz-type", "create", "metadata", "--callback-url", "http://169.254.169.254/"];
    let out = chime(&[("DATABASE_URL", app.db_url.as_str()), ("CHIME_DENY_PRIVATE_CALLBACKS", "true")], &args, None).await;
    assert!(!out.ok && out.stderr.contains("169.254.169.254 is in a denied range (link-local)"), "{}", out.stderr);
    let out = chime(&[("DATABASE_URL", app.db_url.as_str())], &args, None).await;
    assert!(out.ok, "off by default: {}", out.stderr);
}

/// With the deny list on, an IPv6 literal that carries a private IPv4 address (NAT64, 6to4,
/// Teredo, SIIT, IPv4-compatible) and the special-purpose ranges are refused too, naming the
/// range and the IPv4 address; the same forms of a public IPv4 address are accepted.
#[tokio::test]
async fn transition_forms_and_special_purpose_ranges_are_refused_when_saved() {
    let app = spawn_app_with(ServeArgs { engine: false, ..denying() }).await;
    let admin = sign_in(&app, "admin", ADMIN_PASSWORD).await;
    for (url, refused) in [
        ("http://[64:ff9b::a9fe:a9fe]/latest/meta-data", "64:ff9b::a9fe:a9fe (NAT64 of 169.254.169.254) is in a denied range (link-local)"),
        ("http://[2002:a00:5::1]/hook", "2002:a00:5::1 (6to4 of 10.0.0.5) is in a denied range (private)"),
        ("http://[2001:0:4136:e378:8000:63bf:80ff:fffe]/", "(Teredo of 127.0.0.1) is in a denied range (loopback)"),
        ("http://[::ffff:0:c0a8:101]/", "::ffff:0:c0a8:101 (SIIT of 192.168.1.1) is in a denied range (private)"),
        ("http://[::a00:5]/", "::a00:5 (IPv4-compatible of 10.0.0.5) is in a denied range (private)"),
        ("http://[fec0::1]/hook", "fec0::1 is in a denied range (site-local)"),
        ("http://198.18.0.1/hook", "198.18.0.1 is in a denied range (benchmarking)"),
        ("http://192.0.2.10/hook", "192.0.2.10 is in a denied range (documentation)"),
    ] {
        let page = admin.post("/console/biz-types", &[("name", "orders"), ("mode", "callback"), ("callback_url", url)]).await;
        assert_eq!(page.status, 422, "{url}: {}", page.body);
        let error = callback_url_error(&page.body);
        assert!(error.contains(refused) && error.ends_with("; see CHIME_DENY_PRIVATE_CALLBACKS"), "{url}: {error}");
    }
    assert!(biz_types::list(&app.pool).await.unwrap().is_empty());

    for (name, url) in
        [("nat64", "http://[64:ff9b::808:808]/hook"), ("sixtofour", "http://[2002:808:808::1]/hook"), ("v6", "http://[2606:4700::1111]/hook")]
    {
        let page = admin.post("/console/biz-types", &[("name", name), ("mode", "callback"), ("callback_url", url)]).await;
        assert_eq!(page.status, 303, "{url}: created, and sent to its page: {}", page.body);
    }
    assert_eq!(biz_types::list(&app.pool).await.unwrap().len(), 3);
}

/// A biz type saved before the deny list was turned on (or whose name now resolves to a
/// private address) gets no callback: each attempt fails, saying why, and is retried like any
/// connection failure until the task fails. Without the deny list the same URL delivers.
#[tokio::test]
async fn a_denied_address_fails_at_delivery_with_the_reason() {
    let receiver = Receiver::start(vec![], Answer::status(200)).await;
    let port = receiver.url.trim_start_matches("http://127.0.0.1:").split('/').next().unwrap().to_string();
    let by_name = format!("http://localhost:{port}/hook");
    let app = spawn_app_with(denying()).await;
    let tasks = [("by-name", by_name.as_str()), ("by-address", receiver.url.as_str())];
    let mut ids = Vec::new();
    for (name, url) in tasks {
        let token = create_biz_type(&app, name, url).await;
        let task = app.create_task(&token, json!({"biz_type": name})).await;
        ids.push((token, task["id"].as_str().unwrap().to_string()));
    }

    for (token, id) in &ids {
        let task = wait_for_status(&app, token, id, "failed").await;
        let attempts = task["attempts"].as_array().unwrap();
        assert_eq!(attempts.len(), 2, "retried like a connection failure: {task}");
        for attempt in attempts {
            let error = attempt["error"].as_str().unwrap();
            assert!(error.starts_with("could not connect: callback address "), "{error}");
            assert!(error.ends_with("is in a denied range (loopback); see CHIME_DENY_PRIVATE_CALLBACKS"), "{error}");
        }
    }
    let literal = app.get(&format!("/api/v1/tasks/{}", ids[1].1), &ids[1].0).await.body;
    assert_eq!(
        literal["attempts"][0]["error"],
        "could not connect: callback address 127.0.0.1 is in a denied range (loopback); see CHIME_DENY_PRIVATE_CALLBACKS"
    );
    assert!(receiver.received().is_empty(), "nothing reached the receiver");

    // The control: the default lets the same name through.
    let open = spawn_node().await;
    let token = create_biz_type(&open, "by-name", &by_name).await;
    let task = open.create_task(&token, json!({"biz_type": "by-name"})).await;
    wait_for_status(&open, &token, task["id"].as_str().unwrap(), "succeeded").await;
    assert_eq!(receiver.received().len(), 1);
}

/// Two quick attempts, saved without the deny list's check.
async fn create_biz_type(app: &TestApp, name: &str, url: &str) -> String {
    let settings = Settings {
        callback_url: Some(url.into()),
        max_attempts: Some(2),
        backoff_initial_ms: Some(100),
        backoff_max_ms: Some(100),
        ..Default::default()
    };
    biz_types::create(&app.pool, name, &settings, CallbackHosts::Any).await.unwrap();
    biz_types::create_token(&app.pool, name).await.unwrap()
}
