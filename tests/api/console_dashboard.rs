//! The dashboard (plain HTTP): tasks and attempts labelled as what they are, retrying apart
//! from pending, lateness in human units, each row's chart to its own scale (or one for
//! every row, on request) with a time axis and each row's peak named, biz types needing
//! attention first and no longer once the cause is gone, a refresh that can be switched off
//! and a page complete without script. The last test loads a large table and prints the time.

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

/// The text of the count cell with this class in a row (`<td class="num {class}">`), or of
/// the last hour's figure (`<span class="{class}">`, perhaps with more classes), links and
/// spans taken off.
fn cell(row: &str, class: &str) -> String {
    let (start, end) = match row.find(&format!("<td class=\"num {class}\"")) {
        Some(at) => (at, "</td>"),
        None => (row.find(&format!("<span class=\"{class}")).unwrap_or_else(|| panic!("no {class} cell: {row}")), "</span>"),
    };
    let start = start + row[start..].find('>').unwrap() + 1;
    let html = row[start..].split(end).next().unwrap();
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

/// Short headers under "Tasks now" and "Last hour"; retrying is counted apart from
/// never-tried pending; lateness reads in ms, s or min; each chart has its own busiest
/// minute as its scale, or, asked, the busiest minute of any row, written on it, with its
/// own peak named and a time axis; biz types needing attention come first, with the
/// reason, by the rule the page states; the refresh box is there for the script, and the
/// page is whole without it.
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
    // Headers of a line each (issue 7), what each counts in its title and the note below.
    let headers = ["Biz type", "Tasks now", "Pending", "Retrying", "Due ≤ 1 h", "Running", "Failed", "Expired", "Last hour: attempts per minute"];
    for header in headers {
        assert!(page.body.contains(&format!(">{header}</th>")), "{header}: {}", page.body);
    }
    assert_eq!(page.body.matches("</th>").count(), headers.len(), "no other header");
    assert!(page.body.contains(
        "Biz types needing attention come first (marked), for what is wrong now: a receiver down (its breaker open), failed, expired or retrying tasks, or p99 lateness over 5.0 s in the last 5 minutes. The mark clears once the cause is gone; the last hour's failures and lateness stay in the row, not in the mark."
    ));

    // Needing attention first (beta: retrying; gamma: late in the last 5 minutes), by name.
    let rows = biz_type_rows(&page);
    let names: Vec<&str> = rows.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(names, ["beta", "gamma", "alpha", "delta"]);
    let row = |name: &str| rows.iter().find(|(n, _)| n == name).unwrap().1.clone();
    assert!(row("beta").contains("needs attention</span> <span class=\"small bad\">1 retrying</span>"), "{}", row("beta"));
    assert!(row("gamma").contains("<span class=\"small bad\">p99 lateness 12 s in the last 5 min</span>"), "{}", row("gamma"));
    assert!(!row("alpha").contains("needs attention") && !row("delta").contains("needs attention"));

    // Retrying apart from pending, linked to the list of them.
    assert_eq!((cell(&row("beta"), "pending"), cell(&row("beta"), "retrying")), ("2".into(), "1".into()));
    assert!(row("beta").contains("href=\"/console/tasks?biz_type=beta&amp;status=retrying\">1</a>"));
    assert_eq!((cell(&row("alpha"), "pending"), cell(&row("alpha"), "retrying")), ("3".into(), "0".into()));
    assert_eq!(cell(&row("beta"), "due"), "0", "due in two hours");
    assert_eq!((cell(&row("alpha"), "delivered-last-hour"), cell(&row("alpha"), "failed-last-hour")), ("30".into(), "0".into()));
    assert_eq!((cell(&row("beta"), "delivered-last-hour"), cell(&row("beta"), "failed-last-hour")), ("0".into(), "1".into()));

    // Lateness in human units; red over 5 s, without a mark for it.
    assert_eq!(cell(&row("alpha"), "lateness"), "40 ms / 40 ms");
    assert_eq!(cell(&row("beta"), "lateness"), "1.5 s / 1.5 s");
    assert_eq!(cell(&row("gamma"), "lateness"), "12 s / 12 s");
    assert!(row("gamma").contains("<span class=\"lateness bad\""), "{}", row("gamma"));
    assert_eq!(cell(&row("delta"), "lateness"), "— / —");

    // Each chart to its own scale (issue 7), written on it, with a time axis ending now;
    // each row's own peak named.
    assert!(page.body.contains("Draw every row to one scale"));
    for (name, scale) in [("alpha", 30), ("beta", 1), ("gamma", 12), ("delta", 1)] {
        assert!(row(name).contains(&format!(">{scale}/min</text>")), "{name}'s chart to its own scale: {}", row(name));
        assert!(row(name).contains("class=\"time\">now</text>"), "{name}'s time axis: {}", row(name));
    }
    assert!(row("alpha").contains(&format!("peak 30/min at {alpha_peak} UTC")), "{}", row("alpha"));
    assert!(row("beta").contains(&format!("peak 1/min at {beta_peak} UTC")), "{}", row("beta"));
    assert!(row("gamma").contains("height=\"48.0\" class=\"ok\""), "its busiest minute is its full height: {}", row("gamma"));
    assert!(row("delta").contains("no attempt in the last hour"));

    // Asked, one scale for every row: the busiest minute of any row, written on every chart.
    let shared = admin.get("/console?scale=shared").await;
    assert!(shared.body.contains("Bars: every row drawn to one scale, 0–30/min."), "{}", shared.body);
    let shared_rows = biz_type_rows(&shared);
    for (name, html) in &shared_rows {
        assert!(html.contains(">30/min</text>"), "{name}'s chart has the shared scale: {html}");
    }
    let gamma = &shared_rows.iter().find(|(n, _)| n == "gamma").unwrap().1;
    assert!(gamma.contains("height=\"19.2\" class=\"ok\""), "12 of 30 is 0.4 of 48: {gamma}");

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
    assert!(names.iter().all(|n| row(n).contains("<div class=\"muted small peak\">peak ")));
}

/// Issue 7: a biz type needs attention for what is wrong now. Its tasks failed: marked,
/// with the failed attempts in its row. Replayed and delivered: the mark is gone at once,
/// though the failed attempts stay in the last hour's figures; so is lateness ten minutes
/// past (red in the row, not marked).
#[tokio::test]
async fn attention_clears_once_the_cause_is_gone() {
    let app = spawn_app().await;
    let token = app.biz_type("orders").await;
    let mut ids = vec![];
    for key in ["o1", "o2"] {
        ids.push(app.create_task(&token, json!({"biz_type": "orders", "key": key})).await["id"].as_str().unwrap().to_string());
    }
    // Both tried once, refused, failed for good (as a receiver's permanent error leaves them).
    attempts(&app, "orders", 2, "now() - interval '30 seconds'", Some(500), 10).await;
    for id in &ids {
        app.force_status(id, "failed").await;
    }
    let admin = sign_in(&app, "admin", ADMIN_PASSWORD).await;
    let rows = biz_type_rows(&admin.get("/console").await);
    assert!(rows[0].1.contains("needs attention</span> <span class=\"small bad\">2 failed</span>"), "{}", rows[0].1);

    // Replayed from the console, then delivered (the second attempt each, 200).
    for id in &ids {
        assert_eq!(admin.post(&format!("/console/tasks/{id}/replay"), &[]).await.status, 303);
        app.force_status(id, "succeeded").await;
    }
    attempts(&app, "orders", 2, "now()", Some(200), 10).await;
    // A backlog ten minutes ago: 30 s late then, on time since.
    attempts(&app, "orders", 1, "now() - interval '10 minutes'", Some(200), 30_000).await;
    let rows = biz_type_rows(&admin.get("/console").await);
    assert!(!rows[0].1.contains("needs attention") && !rows[0].1.contains("class=\"biz-type attention"), "the cause is gone: {}", rows[0].1);
    assert_eq!((cell(&rows[0].1, "failed"), cell(&rows[0].1, "failed-last-hour")), ("0".into(), "2".into()), "history stays in the row");
    assert_eq!(cell(&rows[0].1, "delivered-last-hour"), "3");
    assert!(rows[0].1.contains("<span class=\"lateness bad\""), "the hour's p99 is over 5 s: {}", rows[0].1);
}
