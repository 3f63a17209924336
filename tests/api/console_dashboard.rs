//! The dashboard (plain HTTP): tasks and attempts labelled as what they are, retrying apart
//! from pending, lateness in human units, one chart scale for every row with each row's
//! peak named, biz types needing attention first, a refresh that can be switched off and a
//! page complete without script. The last test loads a large table and prints the time.

use std::time::Instant;

use chrono::{Duration, Utc};
use serde_json::json;

use crate::console::{ADMIN_PASSWORD, Page, sign_in};
use crate::helpers::{TestApp, spawn_app};

/// The biz types' rows in page order, each as (name, the row's HTML).
fn biz_type_rows(page: &Page) -> Vec<(String, String)> {
    let table = page.body.split("<tbody>").nth(1).unwrap_or_else(|| panic!("no table: {}", page.body));
    table
        .split("<tr class=\"biz-type")
        .skip(1)
        .map(|row| {
            let row = row.split("</tr>").next().unwrap().to_string();
            let name = row.split("?biz_type=").nth(1).unwrap().split('"').next().unwrap().to_string();
            (name, row)
        })
        .collect()
}

/// The text of the cell with this class in a row (links and spans taken off).
fn cell(row: &str, class: &str) -> String {
    let marker = format!("<td class=\"num {class}\">");
    let start = row.find(&marker).unwrap_or_else(|| panic!("no {class} cell: {row}")) + marker.len();
    let html = row[start..].split("</td>").next().unwrap();
    let mut text = String::new();
    let mut in_tag = false;
    for c in html.chars() {
        match c {
            '<' => in_tag = true,
            '>' => in_tag = false,
            c if !in_tag => text.push(c),
            _ => {}
        }
    }
    text
}

/// Writes `n` attempts of a biz type, each started `at` (SQL) with this status code and
/// lateness; returns the minute they fell in as the dashboard writes it ("14:05").
async fn attempts(app: &TestApp, biz_type: &str, n: i32, at: &str, status_code: Option<i16>, lateness_ms: i32) -> String {
    let minutes: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "INSERT INTO attempts (task_id, number, started_at, duration_ms, status_code, biz_type_id, lateness_ms)
         SELECT gen_random_uuid(), 1, {at}, 20, $2, (SELECT id FROM biz_types WHERE name = $1), $3 FROM generate_series(1, $4)
         RETURNING to_char(started_at AT TIME ZONE 'UTC', 'HH24:MI')"
    )))
    .bind(biz_type)
    .bind(status_code)
    .bind(lateness_ms)
    .bind(n)
    .fetch_all(&app.pool)
    .await
    .unwrap();
    minutes[0].clone()
}

/// Headers say tasks or attempts; retrying is counted apart from never-tried pending;
/// lateness reads in ms, s or min; every chart has the busiest minute of any row as its
/// scale, written on it, with its own peak named; biz types needing attention come first,
/// with the reason, by the rule the page states; the refresh box is there for the script,
/// and the page is whole without it.
#[tokio::test]
async fn the_dashboard_reads_at_a_glance() {
    let app = spawn_app().await;
    let mut tokens = vec![];
    for name in ["alpha", "beta", "delta", "gamma"] {
        tokens.push(app.biz_type(name).await);
    }
    let later = (Utc::now() + Duration::hours(2)).to_rfc3339();
    for key in ["a1", "a2", "a3"] {
        app.create_task(&tokens[0], json!({"biz_type": "alpha", "key": key, "run_at": later})).await;
    }
    let mut beta = vec![];
    for key in ["b1", "b2", "b3"] {
        beta.push(app.create_task(&tokens[1], json!({"biz_type": "beta", "key": key, "run_at": later})).await);
    }
    // b1 was tried once and waits for its retry.
    sqlx::query("UPDATE tasks SET attempt_count = 1, last_error = 'HTTP 503' WHERE id = $1::uuid")
        .bind(beta[0]["id"].as_str().unwrap())
        .execute(&app.pool)
        .await
        .unwrap();
    // alpha: 30 delivered in one minute, 40 ms late (the busiest minute of any row);
    // beta: one failed attempt, 1.5 s late; gamma: 12 delivered, 12 s late (over 5 s).
    let alpha_peak = attempts(&app, "alpha", 30, "date_trunc('minute', now()) - interval '5 minutes' + interval '10 seconds'", Some(200), 40).await;
    let beta_peak = attempts(&app, "beta", 1, "now() - interval '1 minute'", Some(503), 1_500).await;
    attempts(&app, "gamma", 12, "now() - interval '2 minutes'", Some(204), 12_000).await;
    let admin = sign_in(&app, "admin", ADMIN_PASSWORD).await;

    let page = admin.get("/console").await;
    assert_eq!(page.status, 200, "{}", page.body);
    for header in [
        "Tasks pending (not yet tried)",
        "Tasks retrying",
        "Tasks due within the hour",
        "Tasks running",
        "Tasks failed",
        "Tasks expired",
        "Attempts delivered in the last hour",
        "Attempts failed in the last hour",
        "Lateness p50 / p99, last hour",
        "Attempts per minute, last hour (one scale for every row: 0–30/min)",
    ] {
        assert!(page.body.contains(&format!("{header}</th>")), "{header}: {}", page.body);
    }
    assert!(page.body.contains(
        "Biz types needing attention come first (marked): those whose receiver is down (its breaker open), with failed, expired or retrying tasks, failed attempts in the last hour, or p99 lateness over 5.0 s; then the others, by name."
    ));

    // Needing attention first (beta: retrying and a failed attempt; gamma: late), by name.
    let rows = biz_type_rows(&page);
    let names: Vec<&str> = rows.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(names, ["beta", "gamma", "alpha", "delta"]);
    let row = |name: &str| rows.iter().find(|(n, _)| n == name).unwrap().1.clone();
    assert!(row("beta").contains("needs attention</span> <span class=\"small bad\">1 retrying, 1 failed attempt</span>"), "{}", row("beta"));
    assert!(row("gamma").contains("<span class=\"small bad\">p99 lateness 12 s</span>"), "{}", row("gamma"));
    assert!(!row("alpha").contains("needs attention") && !row("delta").contains("needs attention"));

    // Retrying apart from pending, linked to the list of them.
    assert_eq!((cell(&row("beta"), "pending"), cell(&row("beta"), "retrying")), ("2".into(), "1".into()));
    assert!(row("beta").contains("href=\"/console/tasks?biz_type=beta&amp;status=retrying\">1</a>"));
    assert_eq!((cell(&row("alpha"), "pending"), cell(&row("alpha"), "retrying")), ("3".into(), "0".into()));
    assert_eq!(cell(&row("beta"), "due"), "0", "due in two hours");
    assert_eq!((cell(&row("alpha"), "delivered-last-hour"), cell(&row("alpha"), "failed-last-hour")), ("30".into(), "0".into()));
    assert_eq!((cell(&row("beta"), "delivered-last-hour"), cell(&row("beta"), "failed-last-hour")), ("0".into(), "1".into()));

    // Lateness in human units.
    assert_eq!(cell(&row("alpha"), "lateness"), "40 ms / 40 ms");
    assert_eq!(cell(&row("beta"), "lateness"), "1.5 s / 1.5 s");
    assert_eq!(cell(&row("gamma"), "lateness"), "12 s / 12 s");
    assert_eq!(cell(&row("delta"), "lateness"), "— / —");

    // One scale, written on every chart; each row's own peak named.
    for (name, html) in &rows {
        assert!(html.contains(">30/min</text>"), "{name}'s chart has the shared scale: {html}");
    }
    assert!(row("alpha").contains(&format!("peak 30/min at {alpha_peak} UTC")), "{}", row("alpha"));
    assert!(row("beta").contains(&format!("peak 1/min at {beta_peak} UTC")), "{}", row("beta"));
    assert!(row("gamma").contains("height=\"19.2\" class=\"ok\""), "12 of 30 is 0.4 of 48: {}", row("gamma"));
    assert!(row("delta").contains("no attempt in the last hour"));

    // The refresh box, for the script (hidden without it); the page served whole.
    assert!(page.body.contains("<p class=\"refresh\" id=\"refresh\" hidden><label class=\"check\"><input type=\"checkbox\" id=\"auto-refresh\""));
    assert!(page.body.contains("<script src=\"/static/console.js"), "{}", page.body);
    assert!(page.body.contains("<div id=\"live\">") && page.body.trim_end().ends_with("</html>"));
    let script = app.client.get(format!("{}/static/console.js", app.address)).send().await.unwrap().text().await.unwrap();
    assert!(script.contains("getElementById(\"auto-refresh\")") && script.contains("localStorage"));
}

/// With a large table (200,000 tasks here; CHIME_DASHBOARD_ROWS=1000000 for the README's
/// figure) and an hour of attempts, the dashboard's counts are right; its time is printed,
/// not asserted (`cargo test --test api dashboard_under_load -- --nocapture`).
#[tokio::test]
async fn the_dashboard_under_load() {
    let rows: i64 = std::env::var("CHIME_DASHBOARD_ROWS").ok().and_then(|n| n.parse().ok()).unwrap_or(200_000);
    assert_eq!(rows % 100, 0, "a multiple of 100, so that each kind's count is exact");
    let app = spawn_app().await;
    for name in ["orders", "billing", "coupons", "emails"] {
        app.biz_type(name).await;
    }
    // The indexes made ON ONLY (0015, 0022) completed as the leader would.
    chime::partitions::complete_indexes(&app.pool).await.unwrap();
    let started = Instant::now();
    crate::console_find::load(&app, 1, rows).await;
    // An attempt a task in ten over the last 50 minutes (inside the hour the dashboard
    // reads, however long the load takes), one in twenty of them failed.
    sqlx::query(
        "INSERT INTO attempts (task_id, number, started_at, duration_ms, status_code, biz_type_id, lateness_ms)
         SELECT gen_random_uuid(), 1, now() - (i % 3000) * interval '1 second', 20,
                CASE WHEN i % 20 = 0 THEN 503 ELSE 200 END, (SELECT min(id) FROM biz_types) + i % 4, i % 900
           FROM generate_series(1, $1::bigint / 10) i",
    )
    .bind(rows)
    .execute(&app.pool)
    .await
    .unwrap();
    sqlx::query("VACUUM ANALYZE tasks").execute(&app.pool).await.unwrap();
    sqlx::query("VACUUM ANALYZE attempts").execute(&app.pool).await.unwrap();
    println!("loaded {rows} tasks and {} attempts in {:?}", rows / 10, started.elapsed());
    let admin = sign_in(&app, "admin", ADMIN_PASSWORD).await;

    admin.get("/console").await; // the first read warms the cache
    let mut times = vec![];
    let mut page = None;
    for _ in 0..5 {
        let started = Instant::now();
        let read = admin.get("/console").await;
        times.push(started.elapsed().as_secs_f64() * 1000.0);
        assert_eq!(read.status, 200);
        page = Some(read);
    }
    times.sort_by(f64::total_cmp);
    // Each read of the page on its own (they run side by side), to say which one costs.
    let pool = &app.pool;
    let started = Instant::now();
    chime::tasks::stats::queue_counts(pool, chime::tasks::COUNT_CAP + 1).await.unwrap();
    let counts = started.elapsed();
    let started = Instant::now();
    chime::tasks::stats::last_hour_by_minute(pool).await.unwrap();
    let minutes = started.elapsed();
    let started = Instant::now();
    chime::tasks::stats::lateness_last_hour(pool).await.unwrap();
    println!("counts {counts:?}, attempts per minute {minutes:?}, lateness {:?}", started.elapsed());
    println!("dashboard with {rows} tasks: median {:.1} ms, slowest {:.1} ms (5 reads)", times[2], times[4]);

    // The loader's kinds (console_find::load): task n is in slot n % 4 (orders, billing,
    // coupons, emails), pending when n % 20 < 5 (all due, so due within the hour too),
    // retrying when n % 100 = 0 (orders only), failed when n % 20 = 5 (billing only).
    let shown = |n: i64| match n {
        0..1_000 => n.to_string(),
        1_000..=10_000 => format!("{},{:03}", n / 1000, n % 1000),
        _ => "10,000+".to_string(),
    };
    let rows_of = biz_type_rows(page.as_ref().unwrap());
    let names: Vec<&str> = rows_of.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(names, ["billing", "orders", "coupons", "emails"], "failed, retrying, then by name");
    let row = |name: &str| rows_of.iter().find(|(n, _)| n == name).unwrap().1.clone();
    assert_eq!(cell(&row("orders"), "pending"), shown(rows / 10 - rows / 100));
    assert_eq!(cell(&row("orders"), "retrying"), shown(rows / 100));
    assert_eq!(cell(&row("orders"), "due"), shown(rows / 10));
    assert_eq!(cell(&row("billing"), "failed"), shown(rows / 20));
    for name in ["billing", "coupons", "emails"] {
        assert_eq!((cell(&row(name), "pending"), cell(&row(name), "retrying")), (shown(rows / 20), "0".to_string()), "{name}");
    }
    // Counts are shown with thousands separators: "1,234".
    let count = |n: &&str, class: &str| cell(&row(n), class).replace(',', "").parse::<i64>().unwrap();
    let delivered: i64 = names.iter().map(|n| count(n, "delivered-last-hour")).sum();
    let failed: i64 = names.iter().map(|n| count(n, "failed-last-hour")).sum();
    assert_eq!((delivered, failed), (rows / 10 - rows / 200, rows / 200));
    assert!(names.iter().all(|n| row(n).contains("<span class=\"muted small peak\">peak ")));
}
