//! Bulk cancel and bulk replay by filter (docs/design/contract.md, Tasks by key): what they match, what they refuse, that
//! they go through any number of tasks in batches, and what a steady biz type sees meanwhile.

use std::time::{Duration, Instant, SystemTime};

use chime::biz_types::{self, Settings};
use chime::callback_hosts::CallbackHosts;
use chrono::{DateTime, Utc};
use serde_json::{Value, json};
use uuid::Uuid;

use crate::helpers::{TestApp, spawn_app, spawn_node};
use crate::receiver::{Answer, Receiver};

/// Writes `count` tasks of `biz` straight into the tables, key `<prefix><i>`, due `first`
/// plus `i` times `step_ms`, in `status`: hot or cold by the horizon, with their keys.
async fn load(app: &TestApp, biz: &str, prefix: &str, count: i64, first: DateTime<Utc>, step_ms: f64, status: &str) {
    let biz_type_id: i32 = sqlx::query_scalar("SELECT id FROM biz_types WHERE name = $1").bind(biz).fetch_one(&app.pool).await.unwrap();
    for table in ["tasks", "tasks_cold"] {
        let side = if table == "tasks" { "<" } else { ">=" };
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "WITH rows AS (
                 SELECT gen_random_uuid() AS id, $2 || i AS key, $3::timestamptz + (i * $4::float8) * interval '1 millisecond' AS run_at
                   FROM generate_series(0, $5 - 1) i
             ), picked AS (
                 SELECT * FROM rows WHERE run_at {side} (SELECT until FROM hot_horizon)
             ), keys AS (
                 INSERT INTO task_keys (biz_type_id, key, task_id, request_hash) SELECT $1, key, id, '\\x00' FROM picked
             )
             INSERT INTO {table} (id, biz_type_id, key, run_at, status, finished_at, lease_until)
             SELECT id, $1, key, run_at, $6, CASE WHEN $6 IN ('pending', 'running') THEN NULL ELSE now() END,
                    CASE WHEN $6 = 'running' THEN now() + interval '1 hour' END
               FROM picked"
        )))
        .bind(biz_type_id)
        .bind(prefix)
        .bind(first)
        .bind(step_ms)
        .bind(count)
        .bind(status)
        .execute(&app.pool)
        .await
        .unwrap();
    }
}

/// How many tasks of `biz` are in `status`, hot and cold.
async fn count(app: &TestApp, biz: &str, status: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM all_tasks t JOIN biz_types b ON b.id = t.biz_type_id WHERE b.name = $1 AND t.status = $2")
        .bind(biz)
        .bind(status)
        .fetch_one(&app.pool)
        .await
        .unwrap()
}

fn hours(h: i64) -> DateTime<Utc> {
    Utc::now() + chrono::Duration::hours(h)
}

/// A few seconds ago: due, and (but for the seconds after midnight) in today's partition,
/// which a fresh database has.
fn just_now() -> DateTime<Utc> {
    Utc::now() - chrono::Duration::seconds(5)
}

/// Bulk cancel takes the pending tasks matching every condition, hot and cold, and leaves
/// the others (another prefix, another time, running or finished ones, another biz type's);
/// a dry run only counts. Each real run is in the audit log with its filter and counts.
#[tokio::test]
async fn bulk_cancel_takes_the_pending_tasks_matching_the_filter() {
    let app = spawn_app().await;
    let token = app.biz_type("orders").await;
    let other = app.biz_type("billing").await;
    load(&app, "orders", "order-", 5, hours(1), 1000.0, "pending").await;
    load(&app, "orders", "order-cold-", 3, hours(24 * 300), 1000.0, "pending").await;
    load(&app, "orders", "refund-", 4, hours(1), 1000.0, "pending").await;
    load(&app, "orders", "order-done-", 2, just_now(), 1.0, "succeeded").await;
    load(&app, "orders", "order-busy-", 2, just_now(), 1.0, "running").await;
    load(&app, "billing", "order-", 3, hours(1), 1000.0, "pending").await;
    let cancel = |body: Value| app.post("/api/v1/biz-types/orders/tasks/cancel", &token, body);

    let dry = cancel(json!({"key_prefix": "order-", "dry_run": true})).await;
    assert_eq!((dry.status, &dry.body), (200, &json!({"matched": 8, "cancelled": 0, "more": false})), "hot and cold");
    assert_eq!(count(&app, "orders", "pending").await, 12, "a dry run changes nothing");

    // Time conditions: the cold ones are due in 300 days.
    let later = cancel(json!({"key_prefix": "order-", "run_at_from": hours(24 * 200).to_rfc3339()})).await;
    assert_eq!(later.body, json!({"matched": 3, "cancelled": 3}));
    let first_two = cancel(json!({"run_at_to": (hours(1) + chrono::Duration::milliseconds(1500)).to_rfc3339(), "key_prefix": "order-"})).await;
    assert_eq!(first_two.body, json!({"matched": 2, "cancelled": 2}));
    let rest = cancel(json!({"key_prefix": "order-"})).await;
    assert_eq!(rest.body, json!({"matched": 3, "cancelled": 3}));
    assert_eq!(count(&app, "orders", "pending").await, 4, "the refunds are left");
    assert_eq!((count(&app, "orders", "running").await, count(&app, "orders", "succeeded").await), (2, 2));
    assert_eq!(count(&app, "billing", "pending").await, 3, "another biz type's tasks are left");

    // A timer's occurrences.
    let timer = Uuid::now_v7();
    sqlx::query("UPDATE tasks SET timer_id = $1 WHERE key IN ('refund-0', 'refund-1')").bind(timer).execute(&app.pool).await.unwrap();
    let of_timer = cancel(json!({"timer_id": timer})).await;
    assert_eq!(of_timer.body, json!({"matched": 2, "cancelled": 2}));
    let all = cancel(json!({"all": true})).await;
    assert_eq!(all.body, json!({"matched": 2, "cancelled": 2}));
    assert_eq!(count(&app, "orders", "pending").await, 0);
    let none = cancel(json!({"all": true})).await;
    assert_eq!(none.body, json!({"matched": 0, "cancelled": 0}));

    let audited: Vec<(String, String, Value)> =
        sqlx::query_as("SELECT action, target, after FROM audit_log WHERE actor <> 'chime' ORDER BY id").fetch_all(&app.pool).await.unwrap();
    assert_eq!(audited.len(), 6, "every run but the dry one: {audited:?}");
    assert!(audited.iter().all(|(action, target, _)| action == "task.bulk_cancel" && target == "orders"), "{audited:?}");
    // One shape from the API and the console (`the_console_cancels_and_replays_in_bulk_after_asking`): the count is `changed`.
    assert_eq!((&audited[0].2["key_prefix"], &audited[0].2["matched"], &audited[0].2["changed"]), (&json!("order-"), &json!(3), &json!(3)));
    assert_eq!(audited[3].2["timer_id"], json!(timer));
    drop(other);
}

/// A dry run counts at most 10,000 (a full count reads every task of the biz type in that
/// state, which another tenant's creates felt): past it, hot and cold together, it says
/// `more`; the cancel itself still takes every match.
#[tokio::test]
async fn a_dry_run_counts_up_to_ten_thousand() {
    let app = spawn_app().await;
    let token = app.biz_type("orders").await;
    load(&app, "orders", "many-", 6_000, hours(1), 1.0, "pending").await;
    load(&app, "orders", "many-cold-", 4_000, hours(24 * 300), 1.0, "pending").await;
    let cancel = |body: Value| app.post("/api/v1/biz-types/orders/tasks/cancel", &token, body);
    let dry = cancel(json!({"key_prefix": "many-", "dry_run": true})).await;
    assert_eq!(dry.body, json!({"matched": 10_000, "cancelled": 0, "more": false}), "exactly the cap");
    load(&app, "orders", "many-cold-more-", 1, hours(24 * 301), 1.0, "pending").await;
    let dry = cancel(json!({"key_prefix": "many-", "dry_run": true})).await;
    assert_eq!(dry.body, json!({"matched": 10_000, "cancelled": 0, "more": true}), "one past it, in cold storage");
    let done = cancel(json!({"key_prefix": "many-"})).await;
    assert_eq!(done.body, json!({"matched": 10_001, "cancelled": 10_001}));
}

/// Bulk replay takes the failed (or the expired) tasks matching the filter back to pending,
/// due now, with a fresh attempt count, as one replay does; a dry run only counts.
#[tokio::test]
async fn bulk_replay_takes_failed_or_expired_tasks_back_to_pending() {
    let app = spawn_app().await;
    let token = app.biz_type("orders").await;
    load(&app, "orders", "order-", 3, just_now(), 1.0, "failed").await;
    load(&app, "orders", "refund-", 2, just_now(), 1.0, "failed").await;
    load(&app, "orders", "order-late-", 4, just_now(), 1.0, "expired").await;
    sqlx::query("UPDATE tasks SET attempt_count = 10, last_error = 'HTTP 500'").execute(&app.pool).await.unwrap();
    let replay = |body: Value| app.post("/api/v1/biz-types/orders/tasks/replay", &token, body);

    let dry = replay(json!({"status": "failed", "key_prefix": "order-", "dry_run": true})).await;
    assert_eq!((dry.status, &dry.body), (200, &json!({"matched": 3, "replayed": 0, "more": false})), "{}", dry.body);
    let failed = replay(json!({"status": "failed", "key_prefix": "order-"})).await;
    assert_eq!(failed.body, json!({"matched": 3, "replayed": 3}));
    let expired = replay(json!({"status": "expired", "run_at_to": Utc::now().to_rfc3339()})).await;
    assert_eq!(expired.body, json!({"matched": 4, "replayed": 4}));
    assert_eq!((count(&app, "orders", "pending").await, count(&app, "orders", "failed").await, count(&app, "orders", "expired").await), (7, 2, 0));
    let fresh: Vec<(i32, Option<String>, bool)> =
        sqlx::query_as("SELECT attempt_count, last_error, run_at > now() - interval '1 minute' FROM tasks WHERE status = 'pending'")
            .fetch_all(&app.pool)
            .await
            .unwrap();
    assert!(fresh.iter().all(|row| *row == (0, None, true)), "replayed as one replay does: {fresh:?}");
    let task = app.get(&format!("/api/v1/biz-types/orders/tasks/by-key/{}", "order-late-0"), &token).await.body;
    assert_eq!(task["status"], "pending");
    let rest = replay(json!({"status": "failed", "all": true})).await;
    assert_eq!(rest.body, json!({"matched": 2, "replayed": 2}));
    let actions: Vec<String> =
        sqlx::query_scalar("SELECT action FROM audit_log WHERE actor <> 'chime' ORDER BY id").fetch_all(&app.pool).await.unwrap();
    assert_eq!(actions, ["task.bulk_replay"; 3]);
}

/// A filter is checked before anything is done: no condition without `"all": true`, a key
/// prefix a key could not be, a time that is not RFC 3339 or out of range, an empty range,
/// an unknown field or state are each a 422 naming the field, and change nothing.
#[tokio::test]
async fn bulk_filters_are_checked_naming_the_field() {
    let app = spawn_app().await;
    let token = app.biz_type("orders").await;
    load(&app, "orders", "order-", 3, hours(1), 1000.0, "pending").await;
    load(&app, "orders", "order-f-", 3, just_now(), 1.0, "failed").await;
    let long = "k".repeat(257);
    let cases = [
        ("cancel", json!({}), "all"),
        ("cancel", json!({"dry_run": true}), "all"),
        ("cancel", json!({"all": false}), "all"),
        ("cancel", json!({"key_prefix": ""}), "key_prefix"),
        ("cancel", json!({"key_prefix": "a\u{7}"}), "key_prefix"),
        ("cancel", json!({"key_prefix": long}), "key_prefix"),
        ("cancel", json!({"run_at_from": "yesterday"}), "run_at_from"),
        ("cancel", json!({"run_at_to": "2026-11-21 09:00"}), "run_at_to"),
        ("cancel", json!({"run_at_from": "+10000-01-01T00:00:00Z"}), "run_at_from"),
        ("cancel", json!({"run_at_from": "2026-11-22T00:00:00Z", "run_at_to": "2026-11-21T00:00:00Z"}), "run_at_to"),
        ("cancel", json!({"timer_id": "nope"}), "timer_id"),
        ("cancel", json!({"status": "pending", "all": true}), "status"),
        ("replay", json!({"all": true}), "status"),
        ("replay", json!({"status": "pending", "all": true}), "status"),
        ("replay", json!({"status": "failed"}), "all"),
        ("replay", json!({"status": "failed", "timer_id": Uuid::now_v7()}), "timer_id"),
        ("replay", json!({"status": "failed", "key_prefix": "\n"}), "key_prefix"),
    ];
    for (action, body, field) in cases {
        let reply = app.post(&format!("/api/v1/biz-types/orders/tasks/{action}"), &token, body.clone()).await;
        assert_eq!((reply.status, reply.code()), (422, "invalid_argument"), "{action} {body}: {}", reply.body);
        assert!(reply.message().contains(field), "{action} {body}: {}", reply.message());
    }
    let empty = app.request("POST", "/api/v1/biz-types/orders/tasks/cancel", Some(&token), None).await;
    assert_eq!(empty.status, 400);
    assert_eq!((count(&app, "orders", "pending").await, count(&app, "orders", "failed").await), (3, 3), "nothing changed");
    let audited: i64 = sqlx::query_scalar("SELECT count(*) FROM audit_log WHERE actor <> 'chime'").fetch_one(&app.pool).await.unwrap();
    assert_eq!(audited, 0);
}

/// More tasks than a batch, the matching ones interleaved with others of another prefix:
/// every matching task is cancelled (each batch starts where the last stopped), none of the
/// others.
#[tokio::test]
async fn bulk_cancel_goes_through_many_batches() {
    let app = spawn_app().await;
    let token = app.biz_type("orders").await;
    // Interleaved in time: a match every 2 ms, another key every 2 ms in between.
    load(&app, "orders", "a-", 2500, hours(1), 2.0, "pending").await;
    load(&app, "orders", "b-", 2500, hours(1) + chrono::Duration::milliseconds(1), 2.0, "pending").await;
    let reply = app.post("/api/v1/biz-types/orders/tasks/cancel", &token, json!({"key_prefix": "a-"})).await;
    assert_eq!(reply.body, json!({"matched": 2500, "cancelled": 2500}));
    let left: Vec<(String, i64)> =
        sqlx::query_as("SELECT status, count(*) FROM tasks GROUP BY status ORDER BY status").fetch_all(&app.pool).await.unwrap();
    assert_eq!(left, [("cancelled".to_string(), 2500), ("pending".to_string(), 2500)]);
    let wrong: i64 =
        sqlx::query_scalar("SELECT count(*) FROM tasks WHERE (status = 'cancelled') <> starts_with(key, 'a-')").fetch_one(&app.pool).await.unwrap();
    assert_eq!(wrong, 0);
}

/// The figure: a bulk cancel of 100,000 pending tasks of one biz type (first those of a key
/// prefix, then the rest) while the engine delivers a steady 50 tasks a second of another.
/// Prints how long the cancels took and the steady callbacks' lateness (receipt minus
/// run_at); asserts only that all 100,000 were cancelled and every steady task was
/// delivered. Run with `--nocapture` to see it.
#[tokio::test]
async fn bulk_cancel_of_100k_beside_a_steady_biz_type() {
    let app = spawn_node().await;
    let receiver = Receiver::start(vec![], Answer::status(200)).await;
    let settings = Settings { callback_url: Some(receiver.url.clone()), ..Default::default() };
    for name in ["steady", "bulk"] {
        biz_types::create(&app.pool, name, &settings, CallbackHosts::Any).await.unwrap();
    }
    let steady = biz_types::create_token(&app.pool, "steady").await.unwrap();
    let bulk = biz_types::create_token(&app.pool, "bulk").await.unwrap();
    let loading = Instant::now();
    load(&app, "bulk", "order-", 100_000, hours(2), 600.0, "pending").await;
    sqlx::query("ANALYZE tasks").execute(&app.pool).await.unwrap();
    println!("100,000 pending tasks loaded in {:?}", loading.elapsed());

    // 50 a second for 8 seconds, from 2 seconds on.
    let start = Utc::now() + chrono::Duration::seconds(2);
    let items: Vec<Value> =
        (0..400).map(|i| json!({"biz_type": "steady", "run_at": (start + chrono::Duration::milliseconds(i * 20)).to_rfc3339()})).collect();
    let created = app.post("/api/v1/tasks/batch", &steady, json!({"tasks": items})).await;
    assert!(created.body["results"].as_array().unwrap().iter().all(|r| r["status"] == 201), "{}", created.body);
    let (wall, clock) = (SystemTime::now(), Instant::now());
    tokio::time::sleep((start - Utc::now()).to_std().unwrap_or_default() + Duration::from_millis(500)).await;

    // A key prefix is a filter on the walk of the biz type's pending tasks: a prefix matching
    // 1,111 of them costs a read of all 100,000.
    let began = Instant::now();
    let reply = app.post("/api/v1/biz-types/bulk/tasks/cancel", &bulk, json!({"key_prefix": "order-99"})).await;
    let by_prefix = began.elapsed();
    assert_eq!(reply.body, json!({"matched": 1111, "cancelled": 1111}), "{}", reply.body);
    let began = Instant::now();
    let reply = app.post("/api/v1/biz-types/bulk/tasks/cancel", &bulk, json!({"all": true})).await;
    let took = began.elapsed();
    assert_eq!(reply.body, json!({"matched": 98_889, "cancelled": 98_889}), "{}", reply.body);
    assert_eq!(count(&app, "bulk", "pending").await, 0);

    let received = receiver.wait_for(400, Duration::from_secs(60)).await;
    assert_eq!(received.len(), 400, "every steady task delivered once");
    let window = (began - clock, began - clock + took);
    let lateness = |during: bool| -> Vec<f64> {
        let mut late: Vec<f64> = received
            .iter()
            .filter(|r| !during || (r.at - clock >= window.0 && r.at - clock <= window.1))
            .map(|r| {
                let at: DateTime<Utc> = (wall + (r.at - clock)).into();
                let run_at: DateTime<Utc> = r.json()["run_at"].as_str().unwrap().parse().unwrap();
                (at - run_at).num_microseconds().unwrap() as f64 / 1000.0
            })
            .collect();
        late.sort_by(f64::total_cmp);
        late
    };
    let pct = |v: &[f64], p: f64| v.get(((v.len() as f64 - 1.0) * p).round() as usize).copied().unwrap_or(f64::NAN);
    let (all, during) = (lateness(false), lateness(true));
    println!(
        "bulk cancel by a key prefix matching 1,111 of 100,000 pending tasks: {by_prefix:?}; of the other 98,889: {took:?}; steady biz type (50/s): lateness p50 {:.1} ms, p99 {:.1} ms over all 400; \
         during the cancel ({} callbacks) p50 {:.1} ms, p99 {:.1} ms",
        pct(&all, 0.5),
        pct(&all, 0.99),
        during.len(),
        pct(&during, 0.5),
        pct(&during, 0.99),
    );
}

/// The console offers the same: bulk cancel of the pending tasks matching the list's filter
/// (and a key prefix), bulk replay of expired tasks as well as failed ones, each asking first
/// on a page of its own that says how many (asking changes nothing), by the API's filter
/// rules (a bad key prefix is refused on the form), audited.
#[tokio::test]
async fn the_console_cancels_and_replays_in_bulk_after_asking() {
    use crate::console::{ADMIN_PASSWORD, sign_in};
    let app = spawn_app().await;
    app.biz_type("orders").await;
    load(&app, "orders", "order-", 3, hours(1), 1000.0, "pending").await;
    load(&app, "orders", "order-cold-", 2, hours(24 * 300), 1000.0, "pending").await;
    load(&app, "orders", "refund-", 4, hours(1), 1000.0, "pending").await;
    load(&app, "orders", "order-late-", 2, just_now(), 1.0, "expired").await;
    let admin = sign_in(&app, "admin", ADMIN_PASSWORD).await;

    let list = admin.get("/console/tasks?biz_type=orders&status=pending").await;
    assert!(list.body.contains("id=\"bulk-cancel\"") && !list.body.contains("id=\"bulk-replay\""), "{}", list.body);
    let list = admin.get("/console/tasks?biz_type=orders&status=expired").await;
    assert!(list.body.contains("id=\"bulk-replay\"") && list.body.contains("Replay all expired tasks"), "{}", list.body);

    for _ in 0..2 {
        let ask = admin.get("/console/tasks/cancel-pending?biz_type=orders&key_prefix=order-&from=&to=").await;
        assert_eq!(ask.status, 200, "{}", ask.body);
        assert!(ask.body.contains("Cancel <strong>5</strong> pending tasks"), "{}", ask.body);
        assert_eq!(count(&app, "orders", "pending").await, 9, "asking changes nothing");
    }
    let (ask, _) = admin.post_and_follow("/console/tasks/cancel-pending", &[("biz_type", "orders"), ("key_prefix", "order-")]).await;
    assert!(ask.body.contains("Cancel <strong>5</strong> pending tasks"), "an unconfirmed form is sent to ask: {}", ask.body);
    let refused = admin.post("/console/tasks/cancel-pending", &[("biz_type", "orders"), ("key_prefix", "a\u{7}"), ("confirm", "yes")]).await;
    assert_eq!(refused.status, 422, "{}", refused.body);
    assert!(refused.body.contains("key_prefix: must not contain control characters"), "{}", refused.body);
    let done = admin.post("/console/tasks/cancel-pending", &[("biz_type", "orders"), ("key_prefix", "order-"), ("confirm", "yes")]).await;
    assert_eq!(done.status, 303);
    assert_eq!((count(&app, "orders", "pending").await, count(&app, "orders", "cancelled").await), (4, 5), "hot and cold");

    let ask = admin.get("/console/tasks/replay-failed?biz_type=orders&status=expired").await;
    assert!(ask.body.contains("Replay <strong>2</strong> expired tasks"), "{}", ask.body);
    let done = admin.post("/console/tasks/replay-failed", &[("biz_type", "orders"), ("status", "expired"), ("confirm", "yes")]).await;
    assert_eq!(done.status, 303);
    assert_eq!((count(&app, "orders", "expired").await, count(&app, "orders", "pending").await), (0, 6));
    let bogus = admin.get("/console/tasks/replay-failed?biz_type=orders&status=pending").await;
    assert_eq!(bogus.status, 422, "only failed or expired tasks are replayed in bulk: {}", bogus.body);

    let audited: Vec<(String, Value)> =
        sqlx::query_as("SELECT action, after FROM audit_log WHERE action LIKE 'task.%' ORDER BY id").fetch_all(&app.pool).await.unwrap();
    let actions: Vec<&str> = audited.iter().map(|(a, _)| a.as_str()).collect();
    assert_eq!(actions, ["task.bulk_cancel", "task.bulk_replay"]);
    assert_eq!((&audited[0].1["key_prefix"], &audited[0].1["changed"]), (&json!("order-"), &json!(5)));
    assert_eq!((&audited[1].1["status"], &audited[1].1["changed"]), (&json!("expired"), &json!(2)));
}

/// One bulk operation per biz type at a time: while one runs (here a dry run held up on a
/// lock the test takes), another of the same biz type, dry run or not, is answered at once
/// with 429 and a Retry-After, and changes nothing; another biz type's is not refused.
/// Once the first is done, the next is served (within the biz type's share of the time,
/// which `tasks::bulk`'s unit test covers). Without this, 16 clients dry-running a
/// prefix over 200,000 tasks took another biz type's create p99 from 41 to ~600 ms.
#[tokio::test]
async fn a_biz_type_runs_one_bulk_operation_at_a_time() {
    let app = spawn_app().await;
    let token = app.biz_type("orders").await;
    let other = app.biz_type("coupons").await;
    load(&app, "orders", "o-", 100, hours(1), 1000.0, "pending").await;
    load(&app, "orders", "far-", 10, hours(24 * 30), 1000.0, "pending").await;
    let post = |token: &str, path: &str, body: Value| {
        let request = app.client.post(format!("{}{path}", app.address)).bearer_auth(token).json(&body).send();
        async move { request.await.unwrap() }
    };

    // Holds every dry run at cold storage, so that the first stays under way.
    let mut blocker = app.pool.begin().await.unwrap();
    sqlx::query("LOCK TABLE tasks_cold IN ACCESS EXCLUSIVE MODE").execute(&mut *blocker).await.unwrap();
    let first = tokio::spawn(post(&token, "/api/v1/biz-types/orders/tasks/cancel", json!({"key_prefix": "o-", "dry_run": true})));
    let waiting = "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%tasks_cold%'";
    while sqlx::query_scalar::<_, i64>(waiting).fetch_one(&app.pool).await.unwrap() == 0 {
        assert!(!first.is_finished(), "the first dry run ended before it reached cold storage");
        tokio::task::yield_now().await;
    }
    let elsewhere = tokio::spawn(post(&other, "/api/v1/biz-types/coupons/tasks/cancel", json!({"all": true, "dry_run": true})));
    for (path, body) in [
        ("/api/v1/biz-types/orders/tasks/cancel", json!({"key_prefix": "o-", "dry_run": true})),
        ("/api/v1/biz-types/orders/tasks/cancel", json!({"key_prefix": "o-"})),
        ("/api/v1/biz-types/orders/tasks/replay", json!({"status": "failed", "all": true, "dry_run": true})),
    ] {
        let Ok(refused) = tokio::time::timeout(Duration::from_secs(5), post(&token, path, body.clone())).await else {
            let activity: Vec<(Option<String>, Option<String>, Option<String>)> =
                sqlx::query_as("SELECT state, wait_event_type, left(query, 120) FROM pg_stat_activity WHERE datname = current_database()")
                    .fetch_all(&app.pool)
                    .await
                    .unwrap();
            panic!("{path} {body}: not answered within 5 s, while another bulk operation runs; sessions: {activity:#?}");
        };
        let retry_after = refused.headers().get("retry-after").map(|v| v.to_str().unwrap().to_string());
        let status = refused.status().as_u16();
        let reply: Value = refused.json().await.unwrap();
        assert_eq!((status, reply["error"]["code"].as_str()), (429, Some("rate_limited")), "{path} {body}: {reply}");
        assert!(retry_after.as_deref().is_some_and(|s| s.parse::<u64>().is_ok_and(|s| s >= 1)), "{path}: Retry-After {retry_after:?}");
        assert!(reply["error"]["message"].as_str().unwrap().contains("bulk"), "{reply}");
    }
    blocker.commit().await.unwrap();
    let first = first.await.unwrap();
    assert_eq!(first.status(), 200);
    assert_eq!(first.json::<Value>().await.unwrap()["matched"], 100);
    assert_eq!(elsewhere.await.unwrap().status(), 200, "another biz type's bulk operation is not held up");
    assert_eq!(count(&app, "orders", "pending").await, 110, "the refused cancel cancelled nothing");
    let next = post(&token, "/api/v1/biz-types/orders/tasks/cancel", json!({"key_prefix": "o-"})).await;
    assert_eq!(next.status(), 200, "served once the first was done");
    assert_eq!(next.json::<Value>().await.unwrap()["cancelled"], 100);
}
