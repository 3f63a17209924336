//! /metrics as docs/design/contract.md, Operating extends it: the queue per biz type (read by the leader), the
//! database pool, and HTTP requests by route pattern and status.

use std::time::Duration;

use chime::biz_types::{self, Settings};
use chime::callback_hosts::CallbackHosts;
use serde_json::json;
use uuid::Uuid;

use crate::delivery::wait_for_status;
use crate::helpers::{TestApp, spawn_app, spawn_node, spawn_second_node, wait_until};
use crate::receiver::{Answer, Receiver};

async fn scrape(app: &TestApp) -> String {
    let reply = app.client.get(format!("{}/metrics", app.address)).send().await.unwrap();
    assert_eq!(reply.status(), 200);
    reply.text().await.unwrap()
}

/// The value of one series (its name and labels exactly as written), if present.
fn value(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

/// Scrapes until `series` is present (the node leads within moments of starting).
async fn scrape_until_present(app: &TestApp, series: &str) -> String {
    wait_until(&format!("{series} in /metrics"), Duration::from_secs(10), || async {
        let text = scrape(app).await;
        if value(&text, series).is_some() { Ok(text) } else { Err(format!("\n{text}")) }
    })
    .await
}

async fn biz_type(app: &TestApp, name: &str, settings: Settings) -> String {
    biz_types::create(&app.pool, name, &settings, CallbackHosts::Any).await.unwrap();
    biz_types::create_token(&app.pool, name).await.unwrap()
}

fn series(name: &str, biz_type: &str) -> String {
    format!("{name}{{biz_type=\"{biz_type}\"}}")
}

/// Pending, retrying and failed tasks are counted per biz type: a paused biz type's tasks
/// are pending, a task whose receiver failed once waits to be retried, and a task failed
/// for good counts as failed until it is replayed.
#[tokio::test]
async fn queue_metrics_count_pending_retrying_and_failed_tasks_per_biz_type() {
    let app = spawn_node().await;
    let failing = Receiver::start(vec![], Answer::status(500)).await;
    // Fails the first two tasks; the replayed one then hangs in flight (neither pending nor failed).
    let fails_twice =
        Receiver::start(vec![Answer::status(500), Answer::status(500)], Answer { delay: Duration::from_secs(60), ..Answer::status(200) }).await;
    let paused = biz_type(&app, "q-paused", Settings { callback_url: Some(failing.url.clone()), paused: Some(true), ..Default::default() }).await;
    let retrying = biz_type(
        &app,
        "q-retrying",
        Settings {
            callback_url: Some(failing.url.clone()),
            backoff_initial_ms: Some(3_600_000),
            backoff_max_ms: Some(3_600_000),
            ..Default::default()
        },
    )
    .await;
    let failed = biz_type(
        &app,
        "q-failed",
        Settings { callback_url: Some(fails_twice.url.clone()), max_attempts: Some(1), timeout_ms: Some(120_000), ..Default::default() },
    )
    .await;
    let later = (chrono::Utc::now() + chrono::TimeDelta::hours(1)).to_rfc3339();
    for body in [json!({"biz_type": "q-paused"}), json!({"biz_type": "q-paused"}), json!({"biz_type": "q-paused", "run_at": later})] {
        app.create_task(&paused, body).await;
    }
    for _ in 0..2 {
        let id = app.create_task(&retrying, json!({"biz_type": "q-retrying"})).await["id"].as_str().unwrap().to_string();
        // Back to pending after its first attempt, the next one an hour away.
        for _ in 0..400 {
            let task = app.get(&format!("/api/v1/tasks/{id}"), &retrying).await.body;
            if task["status"] == "pending" && task["attempt_count"] == 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let mut failed_ids = Vec::new();
    for _ in 0..2 {
        let id = app.create_task(&failed, json!({"biz_type": "q-failed"})).await["id"].as_str().unwrap().to_string();
        wait_for_status(&app, &failed, &id, "failed").await;
        failed_ids.push(id);
    }
    assert_eq!(app.post(&format!("/api/v1/tasks/{}/replay", failed_ids[0]), &failed, json!({})).await.status, 200);
    wait_for_status(&app, &failed, &failed_ids[0], "running").await;

    let text = scrape_until_present(&app, &series("chime_tasks_pending", "q-paused")).await;
    let v = |name: &str, biz: &str| value(&text, &series(name, biz)).unwrap_or_else(|| panic!("no {} in\n{text}", series(name, biz)));
    assert_eq!([v("chime_tasks_pending", "q-paused"), v("chime_tasks_retrying", "q-paused"), v("chime_tasks_failed", "q-paused")], [3.0, 0.0, 0.0]);
    assert_eq!(
        [v("chime_tasks_pending", "q-retrying"), v("chime_tasks_retrying", "q-retrying"), v("chime_tasks_failed", "q-retrying")],
        [2.0, 2.0, 0.0]
    );
    assert_eq!([v("chime_tasks_pending", "q-failed"), v("chime_tasks_retrying", "q-failed"), v("chime_tasks_failed", "q-failed")], [0.0, 0.0, 1.0]);
    assert!(text.contains("# HELP chime_tasks_pending ") && text.contains("Exported by the leader only"), "{text}");
}

/// The oldest due task of a biz type that cannot deliver (paused) ages in the metric; a
/// biz type with nothing due shows 0.
#[tokio::test]
async fn oldest_pending_age_grows_while_a_due_task_waits() {
    let app = spawn_node().await;
    let settings = Settings { callback_url: Some("http://127.0.0.1:9/callback".into()), paused: Some(true), ..Default::default() };
    let stuck = biz_type(&app, "age-stuck", settings.clone()).await;
    let idle = biz_type(&app, "age-idle", settings).await;
    let run_at = (chrono::Utc::now() - chrono::TimeDelta::seconds(30)).to_rfc3339();
    app.create_task(&stuck, json!({"biz_type": "age-stuck", "run_at": run_at})).await;
    let later = (chrono::Utc::now() + chrono::TimeDelta::hours(1)).to_rfc3339();
    app.create_task(&idle, json!({"biz_type": "age-idle", "run_at": later})).await;

    let age = series("chime_oldest_pending_age_seconds", "age-stuck");
    let text = scrape_until_present(&app, &age).await;
    let first = value(&text, &age).unwrap();
    assert!((30.0..60.0).contains(&first), "due 30 s ago, yet its age is {first}");
    assert_eq!(value(&text, &series("chime_oldest_pending_age_seconds", "age-idle")), Some(0.0), "nothing due: 0");
    wait_until(&format!("the age grown from {first} s"), Duration::from_secs(5), || async {
        let last = value(&scrape(&app).await, &age).unwrap();
        if last >= first + 1.0 { Ok(()) } else { Err(format!("{last} s")) }
    })
    .await;
}

/// The queue's metrics come from the leader alone (its HELP says so), so that the cluster
/// reads the database once per scrape interval however many nodes it has.
#[tokio::test]
async fn only_the_leader_exports_the_queue_metrics() {
    let a = spawn_app().await;
    let b = spawn_second_node(&a).await;
    a.biz_type("leader-only").await;
    let pending = series("chime_tasks_pending", "leader-only");
    for _ in 0..200 {
        let (a_exports, b_exports) = (value(&scrape(&a).await, &pending).is_some(), value(&scrape(&b).await, &pending).is_some());
        assert!(!(a_exports && b_exports), "both nodes export {pending}");
        if a_exports || b_exports {
            let exporter = if a_exports { &a } else { &b };
            let leader = chime::leader::current(&a.pool).await.unwrap().expect("a leader");
            let listen: String = sqlx::query_scalar("SELECT listen FROM nodes WHERE id = $1").bind(leader).fetch_one(&a.pool).await.unwrap();
            assert_eq!(exporter.address, format!("http://{listen}"), "the node exporting them is not the leader");
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("neither node exported {pending} within 10 s");
}

/// API requests are counted by route pattern and status: a 404 for an unknown task is
/// counted under `/api/v1/tasks/{id}`, and a path no route matches adds no label value.
#[tokio::test]
async fn http_requests_are_counted_by_route_pattern_and_status() {
    let app = spawn_app().await;
    let token = app.biz_type("http-counted").await;
    for _ in 0..2 {
        assert_eq!(app.get(&format!("/api/v1/tasks/{}", Uuid::new_v4()), &token).await.status, 404);
    }
    let unknown = format!("no-such-endpoint-{}", Uuid::new_v4().simple());
    assert_eq!(app.get(&format!("/api/v1/{unknown}"), &token).await.status, 404);
    assert_eq!(app.get(&format!("/{unknown}"), &token).await.status, 404);

    let text = scrape(&app).await;
    assert_eq!(value(&text, r#"chime_http_requests_total{method="GET",route="/api/v1/tasks/{id}",status="404"}"#), Some(2.0), "{text}");
    assert_eq!(value(&text, r#"chime_http_request_duration_seconds_count{method="GET",route="/api/v1/tasks/{id}"}"#), Some(2.0), "{text}");
    assert_eq!(value(&text, r#"chime_http_requests_total{method="GET",route="unmatched",status="404"}"#), Some(2.0), "{text}");
    assert!(!text.contains(&unknown), "a raw path became a label value:\n{text}");
}

/// The pool gauges follow the connections held from the node's pool.
#[tokio::test]
async fn pool_gauges_follow_the_connections_in_use() {
    let app = spawn_app().await;
    let held = futures_util::future::try_join_all((0..3).map(|_| app.pool.acquire())).await.unwrap();
    let text = scrape(&app).await;
    let gauge = |name: &str| value(&text, name).unwrap_or_else(|| panic!("no {name} in\n{text}"));
    let (in_use, idle, max) =
        (gauge("chime_db_pool_connections_in_use"), gauge("chime_db_pool_connections_idle"), gauge("chime_db_pool_max_connections"));
    assert_eq!(max, 8.0, "the test pool's size");
    assert!(in_use >= 3.0 && idle >= 0.0 && in_use + idle <= max, "in use {in_use}, idle {idle}, max {max}");
    drop(held);
    wait_until(&format!("connections in use fallen from {in_use} by the 3 given back"), Duration::from_secs(5), || async {
        let in_use_after = value(&scrape(&app).await, "chime_db_pool_connections_in_use").unwrap();
        if in_use_after <= in_use - 3.0 { Ok(()) } else { Err(format!("{in_use_after} in use")) }
    })
    .await;
}

/// `promtool check metrics` (the Prometheus project's own linter) finds nothing to fix in a
/// node's scrape, after requests of every kind were counted. Before, three families had
/// no HELP line as promtool reads them: chime_http_requests_total,
/// chime_partitions_dropped_total and chime_timer_occurrences_total.
#[tokio::test]
async fn promtool_finds_nothing_to_fix_in_a_scrape() {
    use tokio::io::AsyncWriteExt;
    let app = spawn_node().await;
    let token = biz_type(&app, "orders", Settings { callback_url: Some("http://127.0.0.1:9/".into()), ..Settings::default() }).await;
    assert_eq!(app.get("/api/v1/tasks", &token).await.status, 200);
    let text = scrape(&app).await;
    let mut promtool = tokio::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("promtool, from Debian's prometheus package (.ci/run installs it)");
    promtool.stdin.take().unwrap().write_all(text.as_bytes()).await.unwrap();
    let out = promtool.wait_with_output().await.unwrap();
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    println!("promtool check metrics: {} {said}", out.status);
    assert!(out.status.success() && said.trim().is_empty(), "{said}\n{text}");
}
