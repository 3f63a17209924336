//! A breaker per receiver (src/engine/breaker.rs): real nodes and real receivers. A receiver
//! that is down opens its biz type's breaker after a few failures in a row; its tasks then
//! wait without using up attempts while one task at a time, spaced, probes it; the first
//! answered probe closes it and every task is delivered. The state is the cluster's; a
//! Retry-After holds the whole biz type on every node; the failure_url hears of it, signed.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::admin::admin_token;
use crate::cli::chime;
use crate::console::{ADMIN_PASSWORD, sign_in};
use crate::helpers::{TestApp, engine, free_port, spawn_app, spawn_node, spawn_second_node, wait_until};
use crate::receiver::{Answer, Received, Receiver};

/// Creates a callback biz type through the admin API with `settings` (its name and
/// callback URL among them); returns an API token and its signing secret.
async fn biz_type(app: &TestApp, settings: Value) -> (String, String) {
    let admin = admin_token(app).await;
    let created = app.post("/api/v1/admin/biz-types", &admin, settings.clone()).await;
    assert_eq!(created.status, 201, "{}", created.body);
    let name = settings["name"].as_str().unwrap();
    let token = chime::biz_types::create_token(&app.pool, name).await.unwrap();
    (token, created.body["signing_secret"].as_str().unwrap().to_string())
}

/// Creates `n` tasks due now, in one batch.
async fn tasks_due_now(app: &TestApp, token: &str, biz_type: &str, n: usize) {
    let tasks: Vec<Value> = (0..n).map(|_| json!({"biz_type": biz_type})).collect();
    let reply = app.post("/api/v1/tasks/batch", token, json!({"tasks": tasks})).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
}

/// The biz type's breaker row: (open, opened_at set, closed_at set, probes).
async fn breaker(app: &TestApp, biz_type: &str) -> Option<(bool, bool, bool, i32)> {
    sqlx::query_as(
        "SELECT r.open, r.opened_at IS NOT NULL, r.closed_at IS NOT NULL, r.probes
           FROM receiver_breakers r JOIN biz_types b ON b.id = r.biz_type_id WHERE b.name = $1",
    )
    .bind(biz_type)
    .fetch_optional(&app.pool)
    .await
    .unwrap()
}

/// Waits until the biz type's breaker is open (`true`) or closed after opening (`false`).
async fn wait_for_breaker(app: &TestApp, biz_type: &str, open: bool) {
    let what = format!("the breaker of {biz_type} {}", if open { "open" } else { "closed" });
    wait_until(&what, Duration::from_secs(15), || async {
        match breaker(app, biz_type).await {
            Some((true, ..)) if open => Ok(()),
            Some((false, true, true, _)) if !open => Ok(()),
            state => Err(format!("{state:?}")),
        }
    })
    .await;
}

/// The biz type's tasks by status: (succeeded, failed, other).
async fn statuses(app: &TestApp, biz_type: &str) -> (i64, i64, i64) {
    sqlx::query_as(
        "SELECT count(*) FILTER (WHERE t.status = 'succeeded'), count(*) FILTER (WHERE t.status = 'failed'),
                count(*) FILTER (WHERE t.status NOT IN ('succeeded', 'failed'))
           FROM tasks t JOIN biz_types b ON b.id = t.biz_type_id WHERE b.name = $1",
    )
    .bind(biz_type)
    .fetch_one(&app.pool)
    .await
    .unwrap()
}

/// Waits until every one of the biz type's `n` tasks has succeeded (at most `within`).
async fn wait_all_succeeded(app: &TestApp, biz_type: &str, n: i64, within: Duration) {
    wait_until(&format!("all {n} tasks of {biz_type} succeeded"), within, || async {
        let (succeeded, failed, other) = statuses(app, biz_type).await;
        assert_eq!(failed, 0, "no task of {biz_type} may fail");
        if succeeded == n { Ok(()) } else { Err(format!("{succeeded} succeeded, {other} not yet")) }
    })
    .await;
}

/// (attempts recorded, attempts counted: the sum of the tasks' attempt counts) of a biz type.
async fn attempts(app: &TestApp, biz_type: &str) -> (i64, i64) {
    sqlx::query_as(
        "SELECT (SELECT count(*) FROM attempts a WHERE a.biz_type_id = b.id),
                (SELECT coalesce(sum(attempt_count), 0)::bigint FROM tasks t WHERE t.biz_type_id = b.id)
           FROM biz_types b WHERE b.name = $1",
    )
    .bind(biz_type)
    .fetch_one(&app.pool)
    .await
    .unwrap()
}

/// Whether a request's `Chime-Signature` has a `v1` that is the HMAC of "<t>.<body>" with `secret`.
fn signed_with(request: &Received, secret: &str) -> bool {
    let header = request.header("chime-signature").expect("a Chime-Signature header");
    let t: i64 = header.strip_prefix("t=").unwrap().split(',').next().unwrap().parse().unwrap();
    let ours = chime::engine::signature(secret, t, &request.body);
    let ours = ours.rsplit_once("v1=").unwrap().1;
    header.split(',').filter_map(|p| p.strip_prefix("v1=")).any(|v1| v1 == ours)
}

async fn scrape(app: &TestApp) -> String {
    app.client.get(format!("{}/metrics", app.address)).send().await.unwrap().text().await.unwrap()
}

/// The value of one series, its name and labels exactly as written.
fn value(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

/// A receiver answering 503 for 2 s, then 200. Its biz type (threshold 3 in 10 s, a probe
/// every 300 ms, max_attempts 4 with 100-200 ms backoff, 5 in flight) has 50 tasks due. The
/// breaker opens after the first failures; while it is open the receiver sees only probes,
/// at least 300 ms apart, and no attempt is counted; the first probe after it is back closes
/// the breaker and every task is delivered within seconds, none failed. The failure_url
/// hears `biz_type.receiver_down` and `biz_type.receiver_up`, signed; /metrics counts the
/// opening, the closing, the probes and the held attempts; the dashboard and the biz type's
/// page show the receiver down meanwhile.
///
/// Without the breaker (the same biz type with `breaker_threshold` 0) the 2 s outage sends
/// about 150 attempts and fails most tasks.
#[tokio::test]
async fn a_receiver_down_then_back_is_probed_and_every_task_delivered() {
    const NAME: &str = "breaker-503";
    const TASKS: i64 = 50;
    let app = spawn_node().await;
    let receiver = Receiver::start(vec![], Answer::status(503)).await;
    let notices = Receiver::start(vec![], Answer::status(200)).await;
    let (token, secret) = biz_type(
        &app,
        json!({"name": NAME, "callback_url": receiver.url, "failure_url": notices.url, "max_attempts": 4,
               "backoff_initial_ms": 100, "backoff_max_ms": 200, "max_in_flight": 5,
               "breaker_threshold": 3, "breaker_window_ms": 10_000, "breaker_probe_ms": 300}),
    )
    .await;
    tasks_due_now(&app, &token, NAME, TASKS as usize).await;
    wait_for_breaker(&app, NAME, true).await;
    let opened = Instant::now();

    // Meanwhile the console says so.
    let console = sign_in(&app, "admin", ADMIN_PASSWORD).await;
    let dashboard = console.get("/console").await.body;
    assert!(dashboard.contains("receiver down since"), "{dashboard}");
    let page = console.get(&format!("/console/biz-types/{NAME}")).await.body;
    assert!(page.contains("receiver down") && page.contains("3 failures in a row, the last: HTTP 503"), "{page}");

    tokio::time::sleep(Duration::from_secs(2).saturating_sub(opened.elapsed())).await;
    let down = receiver.received();
    let (succeeded, failed, _) = statuses(&app, NAME).await;
    assert_eq!((succeeded, failed), (0, 0), "nothing delivered, nothing failed while the receiver is down");
    receiver.answer_with(Answer::status(200));
    let up = Instant::now();
    wait_all_succeeded(&app, NAME, TASKS, Duration::from_secs(10)).await;
    let delivered_in = up.elapsed();
    wait_for_breaker(&app, NAME, false).await;

    // While it was down: the failures that opened it (and what was in flight then), then
    // probes only, each at least a probe interval after the one before.
    let first = down.first().expect("the receiver was called").at;
    let probes: Vec<Instant> = down.iter().map(|r| r.at).filter(|at| *at > first + Duration::from_millis(200)).collect();
    let burst = down.len() - probes.len();
    println!(
        "down for 2 s: {} requests ({burst} before it opened, {} probes); all {TASKS} delivered {delivered_in:?} after it was back",
        down.len(),
        probes.len()
    );
    assert!(burst <= 3 + 5 + 5, "{burst} requests before the breaker held the biz type");
    assert!((2..=8).contains(&probes.len()), "{} probes in about 2 s at one per 300 ms", probes.len());
    for pair in probes.windows(2) {
        assert!(pair[1] - pair[0] >= Duration::from_millis(250), "probes {:?} apart", pair[1] - pair[0]);
    }
    assert!(delivered_in < Duration::from_secs(5), "delivered {delivered_in:?} after the receiver was back");

    // Every request is an attempt in the database; the ones held while it was open did not
    // count: a task was counted at most its delivery and one failure.
    let (recorded, counted) = attempts(&app, NAME).await;
    let sent = receiver.received().len() as i64;
    assert_eq!(recorded, sent, "every request is recorded");
    assert!(counted <= TASKS + 3 + 5, "{counted} attempts counted for {TASKS} tasks ({recorded} recorded)");
    let most: i32 = sqlx::query_scalar("SELECT max(attempt_count) FROM tasks t JOIN biz_types b ON b.id = t.biz_type_id WHERE b.name = $1")
        .bind(NAME)
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert!(most <= 2, "a task counted {most} attempts");
    let held: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM attempts a JOIN biz_types b ON b.id = a.biz_type_id WHERE b.name = $1 AND a.error LIKE '%not counted%'",
    )
    .bind(NAME)
    .fetch_one(&app.pool)
    .await
    .unwrap();
    assert!(held >= probes.len() as i64, "{held} attempts say they were not counted");

    // The failure receiver heard both, signed with the biz type's secret.
    let heard = notices.wait_for(2, Duration::from_secs(5)).await;
    let events: Vec<String> = heard.iter().map(|r| r.header("chime-event").unwrap_or_default().to_string()).collect();
    assert!(events.contains(&"biz_type.receiver_down".to_string()) && events.contains(&"biz_type.receiver_up".to_string()), "{events:?}");
    assert_eq!(heard.len(), 2, "one notice each: {events:?}");
    for notice in &heard {
        assert!(signed_with(notice, &secret), "a notice signed with the biz type's secret");
        assert!(notice.header("chime-notice-id").is_some() && notice.header("chime-task-id").is_none());
        let body = notice.json();
        assert_eq!(body["biz_type"], NAME, "{body}");
        assert_eq!(body["event"], notice.header("chime-event").unwrap(), "{body}");
        assert_eq!(body["breaker"]["callback_url"], receiver.url.as_str(), "{body}");
        if body["event"] == "biz_type.receiver_down" {
            assert_eq!((body["breaker"]["state"].as_str(), body["breaker"]["failures"].as_i64()), (Some("open"), Some(3)), "{body}");
            assert_eq!(body["breaker"]["reason"], "HTTP 503", "{body}");
        } else {
            assert_eq!(body["breaker"]["state"], "closed", "{body}");
            assert!(body["breaker"]["probes"].as_i64().unwrap() >= 1 && body["breaker"]["down_ms"].as_i64().unwrap() >= 2000, "{body}");
        }
    }

    let text = scrape(&app).await;
    let series = |name: &str, labels: &str| value(&text, &format!("{name}{{biz_type=\"{NAME}\"{labels}}}"));
    assert_eq!(series("chime_receiver_breaker_transitions_total", ",to=\"open\""), Some(1.0), "{text}");
    assert_eq!(series("chime_receiver_breaker_transitions_total", ",to=\"closed\""), Some(1.0), "{text}");
    assert_eq!(series("chime_receiver_breaker_open", ""), Some(0.0), "{text}");
    assert_eq!(series("chime_receiver_breaker_probes_total", ",result=\"up\""), Some(1.0), "{text}");
    assert!(series("chime_receiver_breaker_probes_total", ",result=\"down\"").unwrap_or(0.0) >= 1.0, "{text}");
    assert_eq!(series("chime_attempts_held_total", ""), Some(held as f64), "{text}");
}

/// A receiver whose port refuses connections opens the breaker just the same; its tasks
/// wait with their attempts untouched; once something listens there, the next probe
/// closes it and they are all delivered.
#[tokio::test]
async fn a_refused_connection_opens_the_breaker_until_the_receiver_listens() {
    const NAME: &str = "breaker-refused";
    let app = spawn_node().await;
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}/hook");
    let (token, _) = biz_type(
        &app,
        json!({"name": NAME, "callback_url": url, "max_attempts": 3, "backoff_initial_ms": 50, "backoff_max_ms": 100,
               "max_in_flight": 2, "breaker_threshold": 3, "breaker_window_ms": 5_000, "breaker_probe_ms": 200}),
    )
    .await;
    tasks_due_now(&app, &token, NAME, 20).await;
    wait_for_breaker(&app, NAME, true).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (recorded, counted) = attempts(&app, NAME).await;
    let (_, failed, _) = statuses(&app, NAME).await;
    assert_eq!(failed, 0);
    assert!(recorded <= 3 + 2 + 2 + 9, "{recorded} attempts in 1.5 s with probes every 200 ms");
    assert!(counted <= 3 + 2 + 2, "{counted} counted");
    let error: String = sqlx::query_scalar("SELECT reason FROM receiver_breakers").fetch_one(&app.pool).await.unwrap();
    assert!(error.starts_with("could not connect"), "{error}");

    let receiver = Receiver::start_at(port, vec![], Answer::status(200)).await;
    wait_all_succeeded(&app, NAME, 20, Duration::from_secs(10)).await;
    wait_for_breaker(&app, NAME, false).await;
    assert_eq!(receiver.received().len(), 20, "each task once, after it was back");
}

/// Two engines on one database share the breaker, driven a turn at a time: the one whose
/// callbacks fail opens it, and the other, told by the settings notification, claims
/// nothing; when a probe is due exactly one of them, taking turns at once, sends it; its
/// answer closes the breaker for both.
#[tokio::test]
async fn the_breaker_is_the_clusters() {
    const NAME: &str = "breaker-shared";
    let app = spawn_app().await;
    let receiver = Receiver::start(vec![], Answer::status(500)).await;
    let (token, _) = biz_type(
        &app,
        json!({"name": NAME, "callback_url": receiver.url, "max_in_flight": 3, "breaker_threshold": 3,
               "breaker_window_ms": 10_000, "breaker_probe_ms": 400, "backoff_initial_ms": 10, "backoff_max_ms": 10}),
    )
    .await;
    let (mut a, mut b) = (engine(&app), engine(&app));
    // Both read the settings before anything happens: from now on B learns only by being told.
    assert_eq!((a.turn().await.claimed, b.turn().await.claimed), (0, 0));
    tasks_due_now(&app, &token, NAME, 10).await;

    assert_eq!(a.turn().await.claimed, 3);
    a.settled().await;
    assert_eq!(breaker(&app, NAME).await.map(|s| s.0), Some(true), "three failures in a row opened it");
    assert_eq!(receiver.received().len(), 3);
    // The notification reaches B's listener within moments.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(b.turn().await.claimed, 0, "B claims nothing of an open biz type");
    assert_eq!(a.turn().await.claimed, 0, "nor A before the probe is due");
    assert_eq!(receiver.received().len(), 3);

    // The probe: one task, by one of them.
    tokio::time::sleep(Duration::from_millis(450)).await;
    let (ta, tb) = tokio::join!(a.turn(), b.turn());
    assert_eq!(ta.claimed + tb.claimed, 1, "one probe across the cluster: {ta:?} {tb:?}");
    a.settled().await;
    b.settled().await;
    assert_eq!(receiver.received().len(), 4);
    let (_, _, _, probes) = breaker(&app, NAME).await.unwrap();
    assert_eq!(probes, 1);
    let (ta, tb) = tokio::join!(a.turn(), b.turn());
    assert_eq!(ta.claimed + tb.claimed, 0, "the failed probe spaces the next");

    // Back: the next probe closes it, and both claim again.
    receiver.answer_with(Answer::status(200));
    tokio::time::sleep(Duration::from_millis(450)).await;
    let (ta, tb) = tokio::join!(a.turn(), b.turn());
    assert_eq!(ta.claimed + tb.claimed, 1, "{ta:?} {tb:?}");
    a.settled().await;
    b.settled().await;
    assert_eq!(breaker(&app, NAME).await.map(|s| s.0), Some(false), "the answered probe closed it");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let claimed = a.turn().await.claimed + b.turn().await.claimed;
    a.settled().await;
    b.settled().await;
    assert!(claimed >= 3, "claimed {claimed} once it closed");
    // The rest, whichever engine takes them (each task's retry or hold time passes first).
    for _ in 0..100 {
        if statuses(&app, NAME).await.0 == 10 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        a.turn().await;
        b.turn().await;
        a.settled().await;
        b.settled().await;
    }
    assert_eq!(statuses(&app, NAME).await, (10, 0, 0));
    let (_, counted) = attempts(&app, NAME).await;
    assert_eq!(counted, 10 + 3, "the three that opened it count; the probe did not");
}

/// A 429 with `Retry-After: 2` holds the whole biz type's claims for 2 s on every node: a
/// task created due now after it, on a cluster of two, is not called back before then.
#[tokio::test]
async fn retry_after_holds_the_whole_biz_type_on_every_node() {
    const NAME: &str = "breaker-retry-after";
    let app = spawn_node().await;
    let _second = spawn_second_node(&app).await;
    let receiver = Receiver::start(vec![Answer { retry_after: Some(2), ..Answer::status(429) }], Answer::status(200)).await;
    let (token, _) = biz_type(&app, json!({"name": NAME, "callback_url": receiver.url, "breaker_threshold": 0})).await;
    let first = app.create_task(&token, json!({"biz_type": NAME})).await;
    let told = receiver.wait_for(1, Duration::from_secs(5)).await[0].at;
    // Well after the other node was told.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let second = app.create_task(&token, json!({"biz_type": NAME})).await;
    let calls = receiver.wait_for(3, Duration::from_secs(6)).await;
    assert_eq!(calls.len(), 3, "the first, its retry, and the second");
    for call in &calls[1..] {
        let after = call.at - told;
        assert!(after >= Duration::from_millis(1900), "a callback {after:?} after the 429 with Retry-After: 2");
    }
    let ids: Vec<String> = calls.iter().map(|c| c.json()["task_id"].as_str().unwrap().to_string()).collect();
    assert!(ids.contains(&second["id"].as_str().unwrap().to_string()) && ids[0] == first["id"].as_str().unwrap());
    let slowed: Option<chrono::DateTime<chrono::Utc>> =
        sqlx::query_scalar("SELECT slowed_until FROM receiver_breakers").fetch_one(&app.pool).await.unwrap();
    assert!(slowed.is_some());
}

/// The breaker's settings are taken, and refused out of range naming the field, by the admin
/// API, the console's form, `chime biz-type` and `chime apply`.
#[tokio::test]
async fn breaker_settings_are_checked_everywhere() {
    let app = spawn_app().await;
    let admin = admin_token(&app).await;
    let created = app.post("/api/v1/admin/biz-types", &admin, json!({"name": "hooks", "callback_url": "http://127.0.0.1:9/"})).await;
    assert_eq!(created.status, 201, "{}", created.body);
    let b = &created.body;
    assert_eq!((&b["breaker_threshold"], &b["breaker_window_ms"], &b["breaker_probe_ms"]), (&json!(10), &json!(60_000), &json!(5_000)), "{b}");
    for (field, bad, rule) in [
        ("breaker_threshold", -1, "must be between 0 and 10000"),
        ("breaker_window_ms", 99, "must be between 100 and 86400000"),
        ("breaker_probe_ms", 3_600_001, "must be between 100 and 3600000"),
    ] {
        let refused = app.patch("/api/v1/admin/biz-types/hooks", &admin, json!({field: bad})).await;
        assert_eq!(refused.status, 422, "{}", refused.body);
        assert_eq!(refused.message(), format!("{field}: {rule}"));
    }
    let changed = app.patch("/api/v1/admin/biz-types/hooks", &admin, json!({"breaker_threshold": 0, "breaker_probe_ms": 250})).await;
    assert_eq!((changed.body["breaker_threshold"].as_i64(), changed.body["breaker_probe_ms"].as_i64()), (Some(0), Some(250)));

    let db = ("DATABASE_URL", app.db_url.as_str());
    let out = chime(&[db], &["biz-type", "update", "hooks", "--breaker-window-ms", "50"], None).await;
    assert!(!out.ok && out.stderr.contains("breaker_window_ms: must be between 100 and 86400000"), "{}", out.stderr);
    let out = chime(&[db], &["biz-type", "update", "hooks", "--breaker-threshold", "4"], None).await;
    assert!(out.ok && out.stdout.contains("breaker 4 failures in 60000ms, probe every 250ms"), "{}{}", out.stdout, out.stderr);

    let dir = std::env::temp_dir().join(format!("chime-breaker-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("chime.toml");
    std::fs::write(&file, "[biz_types.hooks]\ncallback_url = \"http://127.0.0.1:9/\"\nbreaker_probe_ms = 0\n").unwrap();
    let refused = chime(&[db], &["apply", "-f", file.to_str().unwrap()], None).await;
    std::fs::write(&file, "[biz_types.hooks]\ncallback_url = \"http://127.0.0.1:9/\"\nbreaker_probe_ms = 1000\n").unwrap();
    let applied = chime(&[db], &["apply", "-f", file.to_str().unwrap()], None).await;
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(!refused.ok && refused.stderr.contains("breaker_probe_ms: must be between 100 and 3600000"), "{}", refused.stderr);
    assert!(applied.ok && applied.stdout.contains("    breaker_probe_ms: 250 → 1000"), "{}{}", applied.stdout, applied.stderr);

    let console = sign_in(&app, "admin", ADMIN_PASSWORD).await;
    let form = [("mode", "callback"), ("callback_url", "http://127.0.0.1:9/"), ("breaker_threshold", "10001")];
    let page = console.post("/console/biz-types/hooks", &form).await;
    assert_eq!(page.status, 422);
    assert!(page.body.contains(r#"data-field="breaker_threshold">must be between 0 and 10000"#), "{}", page.body);
    let form = [
        ("mode", "callback"),
        ("callback_url", "http://127.0.0.1:9/"),
        ("breaker_threshold", "7"),
        ("breaker_window_ms", "2000"),
        ("breaker_probe_ms", "300"),
    ];
    assert_eq!(console.post("/console/biz-types/hooks", &form).await.status, 303);
    let shown = app.get("/api/v1/admin/biz-types/hooks", &admin).await.body;
    assert_eq!(
        (shown["breaker_threshold"].as_i64(), shown["breaker_window_ms"].as_i64(), shown["breaker_probe_ms"].as_i64()),
        (Some(7), Some(2000), Some(300))
    );
    let page = console.get("/console/biz-types/hooks").await.body;
    assert!(page.contains(r#"name="breaker_probe_ms" value="300""#) && page.contains("opens after 7 failures in a row within 2000 ms"), "{page}");
}

/// The figure for the closing note: the issue's 20 s outage (a receiver answering 503 for
/// 20 s, 50 tasks due, max_attempts 4, the default backoff) without the breaker and with its
/// defaults. Slow (two 25 s runs): `cargo test --test api outage_of_20 -- --ignored --nocapture`.
#[tokio::test]
#[ignore]
async fn outage_of_20_s_without_and_with_the_breaker() {
    for (name, threshold) in [("outage-without", 0), ("outage-with", 10)] {
        let app = spawn_node().await;
        let receiver = Receiver::start(vec![], Answer::status(503)).await;
        let (token, _) = biz_type(&app, json!({"name": name, "callback_url": receiver.url, "max_attempts": 4, "breaker_threshold": threshold})).await;
        tasks_due_now(&app, &token, name, 50).await;
        tokio::time::sleep(Duration::from_secs(20)).await;
        let during = receiver.received().len();
        receiver.answer_with(Answer::status(200));
        let up = Instant::now();
        let mut settled = None;
        while up.elapsed() < Duration::from_secs(15) {
            let (succeeded, failed, _) = statuses(&app, name).await;
            if succeeded + failed == 50 {
                settled = Some(up.elapsed());
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let (succeeded, failed, other) = statuses(&app, name).await;
        let (recorded, counted) = attempts(&app, name).await;
        println!(
            "{name}: {during} attempts sent during the 20 s outage; then {succeeded} succeeded, {failed} failed, {other} not settled \
             (all settled {settled:?} after it was back); {recorded} attempts recorded, {counted} counted"
        );
    }
}

/// A receiver that closes a kept-alive connection as a callback goes out on it answers
/// nothing (hyper's "connection closed before message completed"); chime sends that callback
/// again at once on another connection, so each task is delivered at its first attempt and
/// no failure counts toward the breaker. The receiver here, on raw TCP, answers the first
/// request on each connection and closes the connection, unanswered, at the second: every
/// callback after the first goes out on a connection about to close.
#[tokio::test]
async fn a_callback_sent_as_the_receiver_closes_its_connection_is_sent_again_at_once() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Reads one request (headers and a Content-Length body); false at the end of the stream.
    async fn read_request(socket: &mut tokio::net::TcpStream) -> bool {
        let mut seen = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            if let Some(end) = seen.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&seen[..end]).to_ascii_lowercase();
                let length: usize = head.lines().find_map(|l| l.strip_prefix("content-length:")).map_or(0, |v| v.trim().parse().unwrap());
                if seen.len() >= end + 4 + length {
                    return true;
                }
            }
            match socket.read(&mut buf).await {
                Ok(0) | Err(_) => return false,
                Ok(n) => seen.extend_from_slice(&buf[..n]),
            }
        }
    }

    const NAME: &str = "closes-kept-alive";
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    let (answered, closed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (a, c) = (answered.clone(), closed.clone());
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let (a, c) = (a.clone(), c.clone());
            tokio::spawn(async move {
                if !read_request(&mut socket).await {
                    return;
                }
                socket.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n").await.unwrap();
                a.fetch_add(1, Ordering::SeqCst);
                if read_request(&mut socket).await {
                    c.fetch_add(1, Ordering::SeqCst);
                }
            });
        }
    });
    let app = spawn_node().await;
    let (token, _) =
        biz_type(&app, json!({"name": NAME, "callback_url": url, "max_in_flight": 1, "breaker_threshold": 2, "backoff_initial_ms": 60_000})).await;
    for delay_ms in [0, 300, 600, 900] {
        let created = app.post("/api/v1/tasks", &token, json!({"biz_type": NAME, "delay_ms": delay_ms})).await;
        assert_eq!(created.status, 201, "{}", created.body);
    }
    wait_all_succeeded(&app, NAME, 4, Duration::from_secs(10)).await;
    assert_eq!(attempts(&app, NAME).await, (4, 4), "one attempt each, none failed");
    assert!(closed.load(Ordering::SeqCst) >= 1, "the receiver closed a connection under a callback");
    assert_eq!(answered.load(Ordering::SeqCst), 4);
}
