//! Timers over the API, and their occurrences written as tasks by the leader.

use std::time::Duration;

use chime::db::Pool;
use chime::timers;
use chrono::{DateTime, Utc};
use serde_json::{Value, json};

use crate::helpers::{TestApp, spawn_app, spawn_app_without_leader, wait_until};

const WINDOW: Duration = Duration::from_secs(600);

async fn create_timer(app: &TestApp, token: &str, body: Value) -> Value {
    let reply = app.post("/api/v1/timers", token, body).await;
    assert_eq!(reply.status, 201, "{}", reply.body);
    reply.body
}

/// (key, run_at, status) of a timer's occurrences, by run_at.
async fn occurrences(pool: &Pool, timer_id: &str) -> Vec<(String, DateTime<Utc>, String)> {
    sqlx::query_as("SELECT key, run_at, status FROM all_tasks WHERE timer_id = $1::uuid ORDER BY run_at")
        .bind(timer_id)
        .fetch_all(pool)
        .await
        .unwrap()
}

/// Waits until the leader has written a timer's occurrences.
async fn wait_materialized(pool: &Pool, timer_id: &str) -> Vec<(String, DateTime<Utc>, String)> {
    wait_until(&format!("an occurrence of timer {timer_id} written by the leader"), Duration::from_secs(10), || async {
        let found = occurrences(pool, timer_id).await;
        (!found.is_empty()).then_some(found)
    })
    .await
}

fn time(v: &Value) -> DateTime<Utc> {
    v.as_str().unwrap().parse().unwrap()
}

#[tokio::test]
async fn create_get_list_and_delete_a_timer() {
    let app = spawn_app().await;
    let token = app.biz_type("reports").await;
    let timer = create_timer(
        &app,
        &token,
        json!({"biz_type": "reports", "key": "nightly", "cron": "0 30 2 * * *", "timezone": "America/New_York", "payload": {"kind": "daily"}}),
    )
    .await;
    assert_eq!(timer["active"], true);
    assert_eq!(timer["catch_up"], false);
    assert_eq!(timer["timezone"], "America/New_York");
    let next: Vec<DateTime<Utc>> = timer["next_fire_times"].as_array().unwrap().iter().map(time).collect();
    assert_eq!(next.len(), 5);
    for (i, t) in next.iter().enumerate() {
        let local = t.with_timezone(&chrono_tz::America::New_York).format("%H:%M:%S").to_string();
        // 03:30 only on a spring-forward day, when 02:30 does not exist.
        assert!(local == "02:30:00" || local == "03:30:00", "{local}");
        if i > 0 {
            let hours = (*t - next[i - 1]).num_hours();
            assert!((23..=25).contains(&hours), "one a day: {next:?}");
        }
    }

    let id = timer["id"].as_str().unwrap();
    let got = app.get(&format!("/api/v1/timers/{id}"), &token).await;
    assert_eq!(got.status, 200);
    assert_eq!(got.body["key"], "nightly");
    assert_eq!(got.body["payload"], json!({"kind": "daily"}));
    create_timer(&app, &token, json!({"biz_type": "reports", "key": "hourly", "cron": "0 0 * * * *"})).await;
    let list = app.get("/api/v1/timers?limit=1", &token).await;
    assert_eq!(list.body["items"][0]["key"], "hourly");
    let cursor = list.body["next_cursor"].as_str().unwrap();
    let rest = app.get(&format!("/api/v1/timers?limit=1&cursor={cursor}"), &token).await;
    assert_eq!(rest.body["items"][0]["key"], "nightly");

    let again = app.post("/api/v1/timers", &token, json!({"biz_type": "reports", "key": "nightly", "cron": "* * * * * *"})).await;
    assert_eq!((again.status, again.code()), (409, "key_conflict"));

    assert_eq!(app.delete(&format!("/api/v1/timers/{id}"), &token).await.status, 204);
    assert_eq!(app.get(&format!("/api/v1/timers/{id}"), &token).await.status, 404);
    let audited: i64 = sqlx::query_scalar("SELECT count(*) FROM audit_log WHERE target_type = 'timer'").fetch_one(&app.pool).await.unwrap();
    assert_eq!(audited, 3, "two creates and a delete");
}

#[tokio::test]
async fn bad_timers_are_refused_naming_the_field() {
    let app = spawn_app().await;
    let token = app.biz_type("reports").await;
    let cases = [
        (json!({"biz_type": "reports", "key": "a", "cron": "0 9 * * *"}), "cron: needs 6 or 7 fields"),
        (json!({"biz_type": "reports", "key": "a", "cron": "0 0 25 * * *"}), "cron: is not a valid cron expression"),
        (json!({"biz_type": "reports", "key": "a", "cron": "0 0 0 30 2 *"}), "cron: never fires again"),
        (json!({"biz_type": "reports", "key": "a", "cron": "0\r\n0 9 * * *"}), "cron: must not contain control characters"),
        (json!({"biz_type": "reports", "key": "a", "cron": "0 0 9 * * *", "timezone": "Mars/Olympus"}), "timezone:"),
        (json!({"biz_type": "reports", "key": "", "cron": "0 0 9 * * *"}), "key:"),
        (json!({"biz_type": "reports", "key": "k".repeat(240), "cron": "0 0 9 * * *"}), "key: must be at most 235 bytes"),
        (json!({"biz_type": "reports", "key": "a", "cron": "0 0 9 * * *", "every": 5}), "unknown field `every`"),
        (json!({"biz_type": "reports", "key": "a"}), "missing field `cron`"),
    ];
    for (body, expected) in cases {
        let reply = app.post("/api/v1/timers", &token, body.clone()).await;
        assert_eq!(reply.status, 422, "{body} → {}", reply.body);
        assert!(reply.message().contains(expected), "{body}: `{}` lacks `{expected}`", reply.message());
    }
    let count: i64 = sqlx::query_scalar("SELECT count(*) FROM timers").fetch_one(&app.pool).await.unwrap();
    assert_eq!(count, 0);

    let timer = create_timer(&app, &token, json!({"biz_type": "reports", "key": "a", "cron": "0 0 9 * * *"})).await;
    let id = timer["id"].as_str().unwrap();
    let reply = app.patch(&format!("/api/v1/timers/{id}"), &token, json!({"timezone": "Nowhere"})).await;
    assert_eq!(reply.status, 422);
    let reply = app.patch(&format!("/api/v1/timers/{id}"), &token, json!({"cron": "0 0 9 * * *\t"})).await;
    assert_eq!(reply.status, 422);
    let reply = app.patch(&format!("/api/v1/timers/{id}"), &token, json!({})).await;
    assert_eq!(reply.status, 422);
    let reply = app.patch(&format!("/api/v1/timers/{id}"), &token, json!({"key": "b"})).await;
    assert_eq!(reply.status, 422, "the key cannot change");
    assert_eq!(app.get("/api/v1/timers/not-a-uuid", &token).await.status, 400);
    assert_eq!(app.get(&format!("/api/v1/timers/{}", uuid::Uuid::now_v7()), &token).await.status, 404);
}

#[tokio::test]
async fn another_biz_type_s_token_cannot_touch_a_timer() {
    let app = spawn_app().await;
    let owner = app.biz_type("reports").await;
    let stranger = app.biz_type("billing").await;
    let timer = create_timer(&app, &owner, json!({"biz_type": "reports", "key": "a", "cron": "0 0 9 * * *"})).await;
    let id = timer["id"].as_str().unwrap();
    assert_eq!(app.get(&format!("/api/v1/timers/{id}"), &stranger).await.status, 403);
    assert_eq!(app.patch(&format!("/api/v1/timers/{id}"), &stranger, json!({"active": false})).await.status, 403);
    assert_eq!(app.post(&format!("/api/v1/timers/{id}/deactivate"), &stranger, json!({})).await.status, 403);
    assert_eq!(app.delete(&format!("/api/v1/timers/{id}"), &stranger).await.status, 403);
    let reply = app.post("/api/v1/timers", &stranger, json!({"biz_type": "reports", "key": "b", "cron": "0 0 9 * * *"})).await;
    assert_eq!(reply.status, 403);
    assert_eq!(app.get("/api/v1/timers?biz_type=reports", &stranger).await.status, 403);
    assert_eq!(app.get("/api/v1/timers", &stranger).await.body["items"], json!([]));
    let still: bool = sqlx::query_scalar("SELECT active FROM timers").fetch_one(&app.pool).await.unwrap();
    assert!(still);
}

/// The leader writes a window of occurrences ahead, one task per fire time, keyed
/// `<key>@<fire time>`, carrying the timer's payload and id.
#[tokio::test]
async fn the_leader_writes_occurrences_for_the_window_ahead() {
    let app = spawn_app().await;
    let token = app.biz_type("reports").await;
    let timer = create_timer(&app, &token, json!({"biz_type": "reports", "key": "tick", "cron": "0 * * * * *", "payload": [1, 2]})).await;
    let id = timer["id"].as_str().unwrap();
    let found = wait_materialized(&app.pool, id).await;
    // One per minute for the 10-minute window.
    assert!((10..=11).contains(&found.len()), "{found:?}");
    for (key, run_at, status) in &found {
        assert_eq!(run_at.timestamp() % 60, 0);
        assert_eq!(key, &timers::occurrence_key("tick", *run_at));
        assert_eq!(status, "pending");
    }
    for pair in found.windows(2) {
        assert_eq!(pair[1].1 - pair[0].1, chrono::Duration::minutes(1), "no gap, no duplicate");
    }
    let first = &found[0];
    let task = app.get(&format!("/api/v1/biz-types/reports/tasks/by-key/{}", first.0), &token).await;
    assert_eq!(task.body["payload"], json!([1, 2]));
    assert_eq!(task.body["timer_id"], id);
    assert_eq!(time(&timer["next_fire_times"][0]), first.1);
}

/// Many writers at once (as with two leaders during a failover) still write each
/// occurrence exactly once.
#[tokio::test]
async fn concurrent_materialization_writes_each_occurrence_once() {
    let app = spawn_app().await;
    let token = app.biz_type("reports").await;
    let timer = create_timer(&app, &token, json!({"biz_type": "reports", "key": "sec", "cron": "* * * * * *", "active": false})).await;
    let id: uuid::Uuid = timer["id"].as_str().unwrap().parse().unwrap();
    // Activated behind the leader's back, then written by eight writers together.
    sqlx::query("UPDATE timers SET active = true, materialized_until = now() WHERE id = $1").bind(id).execute(&app.pool).await.unwrap();
    let writers: Vec<_> = (0..8)
        .map(|_| {
            let pool = app.pool.clone();
            tokio::spawn(async move { timers::materialize(&pool, id, WINDOW).await.unwrap() })
        })
        .collect();
    let mut written = 0;
    for w in writers {
        written += w.await.unwrap();
    }
    let found = occurrences(&app.pool, &id.to_string()).await;
    let distinct: std::collections::HashSet<_> = found.iter().map(|o| o.1).collect();
    assert_eq!(distinct.len(), found.len(), "no fire time twice");
    assert!(found.len() >= 600, "a second apart over the 600 s window: {}", found.len());
    assert!(written as usize <= found.len(), "written {written}, found {}", found.len());
    for pair in found.windows(2) {
        assert_eq!(pair[1].1 - pair[0].1, chrono::Duration::seconds(1));
    }
}

/// Editing the schedule or deactivating removes the occurrences not fired yet; what
/// already fired stays.
#[tokio::test]
async fn changing_a_timer_replaces_its_unfired_occurrences() {
    let app = spawn_app().await;
    let token = app.biz_type("reports").await;
    let timer = create_timer(&app, &token, json!({"biz_type": "reports", "key": "t", "cron": "0 * * * * *"})).await;
    let id = timer["id"].as_str().unwrap();
    let before = wait_materialized(&app.pool, id).await;
    // One occurrence has fired (as if delivered).
    let fired = &before[0].0;
    sqlx::query("UPDATE tasks SET status = 'succeeded', finished_at = now(), attempt_count = 1 WHERE key = $1")
        .bind(fired)
        .execute(&app.pool)
        .await
        .unwrap();

    let reply = app.patch(&format!("/api/v1/timers/{id}"), &token, json!({"cron": "30 */2 * * * *"})).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(reply.body["cron"], "30 */2 * * * *");
    let mut after = Vec::new();
    for _ in 0..100 {
        after = occurrences(&app.pool, id).await;
        if after.iter().any(|o| o.1.timestamp() % 60 == 30) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let old: Vec<_> = after.iter().filter(|o| o.1.timestamp() % 120 != 30).collect();
    assert_eq!(old.len(), 1, "only the fired occurrence of the old schedule remains: {old:?}");
    assert_eq!(&old[0].0, fired);
    assert!(after.len() >= 5, "the new schedule, every two minutes over ten: {after:?}");

    let reply = app.post(&format!("/api/v1/timers/{id}/deactivate"), &token, json!({})).await;
    assert_eq!(reply.body["active"], false);
    assert_eq!(reply.body["next_fire_times"], json!([]));
    let pending: i64 = sqlx::query_scalar("SELECT count(*) FROM all_tasks WHERE timer_id = $1::uuid AND status = 'pending'")
        .bind(id)
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(pending, 0);
    // A deactivated timer's old keys are free again: activating writes the same fire times anew.
    let reply = app.post(&format!("/api/v1/timers/{id}/activate"), &token, json!({})).await;
    assert_eq!(reply.body["active"], true);
    let again = wait_materialized_pending(&app.pool, id).await;
    assert!(again >= 4, "{again}");
}

async fn wait_materialized_pending(pool: &Pool, id: &str) -> i64 {
    for _ in 0..100 {
        let n: i64 = sqlx::query_scalar("SELECT count(*) FROM all_tasks WHERE timer_id = $1::uuid AND status = 'pending'")
            .bind(id)
            .fetch_one(pool)
            .await
            .unwrap();
        if n > 0 {
            return n;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    0
}

/// After downtime (the timer's written window ended an hour ago), the occurrence of the
/// last minute is late, not missed: it is written and fires at once. Of the older ones,
/// `catch_up: true` fires the latest once, now; `false` skips them.
#[tokio::test]
async fn after_downtime_catch_up_fires_one_occurrence_or_none() {
    // Without a leader: its pass could write the occurrences first, in a transaction that
    // began before the UPDATE below, so with an earlier now() than the one asserted on.
    let (app, _leader_lock) = spawn_app_without_leader().await;
    let token = app.biz_type("reports").await;
    for catch_up in [true, false] {
        // Not in the last two seconds of a minute: the next minute's occurrence would be
        // due within a second, and the case below could not tell it from a late one.
        while sqlx::query_scalar::<_, f64>("SELECT extract(second FROM now())::float8").fetch_one(&app.pool).await.unwrap() >= 58.0 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let key = format!("catch-{catch_up}");
        let timer =
            create_timer(&app, &token, json!({"biz_type": "reports", "key": key, "cron": "0 * * * * *", "catch_up": catch_up, "active": false}))
                .await;
        let id: uuid::Uuid = timer["id"].as_str().unwrap().parse().unwrap();
        // As if the cluster had been down for an hour: nothing was written since.
        let now: DateTime<Utc> =
            sqlx::query_scalar("UPDATE timers SET active = true, materialized_until = now() - interval '1 hour' WHERE id = $1 RETURNING now()")
                .bind(id)
                .fetch_one(&app.pool)
                .await
                .unwrap();
        timers::materialize(&app.pool, id, WINDOW).await.unwrap();
        let found = occurrences(&app.pool, &id.to_string()).await;
        // A catch-up occurrence runs when it is written, not at its fire time.
        let fire_time = |k: &str| k.split_once('@').unwrap().1.parse::<DateTime<Utc>>().unwrap();
        let caught_up: Vec<_> = found.iter().filter(|(k, run_at, _)| fire_time(k) != *run_at).collect();
        let minute = chrono::Duration::seconds(60);
        if catch_up {
            assert_eq!(caught_up.len(), 1, "one catch-up occurrence: {found:?}");
            let (k, run_at, _) = caught_up[0];
            assert!(*run_at >= now && *run_at < now + minute, "it runs now, not in the past: {run_at}");
            // The latest fire time more than a minute before it was written.
            let written = run_at.timestamp();
            let last_missed = DateTime::from_timestamp(written - 60 - (written - 60).rem_euclid(60), 0).unwrap();
            assert_eq!(*k, timers::occurrence_key(&key, last_missed), "the latest missed minute");
        } else {
            assert!(caught_up.is_empty(), "missed occurrences skipped: {caught_up:?}");
        }
        let late: Vec<_> = found.iter().filter(|(k, run_at, _)| fire_time(k) == *run_at && *run_at <= now + chrono::Duration::seconds(1)).collect();
        assert_eq!(late.len(), 1, "the last minute's occurrence, late: {found:?}");
        assert!(found.iter().all(|o| o.1 > now - minute), "nothing from the rest of the hour of downtime: {found:?}");
        assert!(found.iter().filter(|o| o.1 > now).count() >= 10, "the coming window is written as usual");
    }
}

/// More timers than one pass takes (1,000 timers, 10,000 occurrences) are all written by
/// the leader's passes: every timer gets its whole window, each fire time once, with its
/// own payload, and a further pass finds nothing due. No node runs on this database, so
/// the passes here are the only writers.
#[tokio::test]
async fn many_timers_are_written_in_passes_each_occurrence_once() {
    let pool = chime::db::connect(&crate::helpers::fresh_database().await, 4).await.unwrap();
    let settings = chime::biz_types::Settings { callback_url: Some("http://127.0.0.1:9/".into()), ..Default::default() };
    let biz = chime::biz_types::create(&pool, "reports", &settings, chime::callback_hosts::CallbackHosts::Any).await.unwrap();
    // 1,500 every-minute timers in three zones (second i % 60), and 30 every-second ones.
    sqlx::query(
        "INSERT INTO timers (id, biz_type_id, key, cron, timezone, payload, materialized_until)
         SELECT gen_random_uuid(), $1, 'm' || i, (i % 60) || ' * * * * *',
                (ARRAY['UTC', 'Asia/Shanghai', 'America/New_York'])[1 + i % 3], jsonb_build_object('i', i), now()
           FROM generate_series(1, 1500) i
         UNION ALL
         SELECT gen_random_uuid(), $1, 's' || i, '* * * * * *', 'Europe/Berlin', jsonb_build_object('i', i), now()
           FROM generate_series(1, 30) i",
    )
    .bind(biz.id)
    .execute(&pool)
    .await
    .unwrap();
    let mut written = 0;
    for _ in 0..100 {
        let n = timers::materialize_due(&pool, WINDOW).await.unwrap();
        if n == 0 {
            break;
        }
        written += n;
    }
    // (key, occurrences, distinct fire times, seconds from the first to the last, all right)
    let per_timer: Vec<(String, i64, i64, f64, bool)> = sqlx::query_as(
        "SELECT t.key, count(o.id), count(DISTINCT o.run_at), extract(epoch FROM max(o.run_at) - min(o.run_at))::float8, bool_and(o.payload = t.payload AND o.key = t.key || '@' || to_char(o.run_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"'))
           FROM timers t LEFT JOIN all_tasks o ON o.timer_id = t.id GROUP BY t.key",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(per_timer.len(), 1530);
    // A timer's first pass also writes the fire times since it was created (late, not
    // missed), so a slow pass adds a few.
    for (key, count, distinct, span, right) in &per_timer {
        assert_eq!(count, distinct, "{key}: no fire time twice");
        assert!(right, "{key}: each occurrence carries its timer's payload and key");
        if key.starts_with('m') {
            assert!((10..=12).contains(count), "{key}: once a minute over the 600 s window: {count}");
        } else {
            assert!((600..=660).contains(count), "{key}: once a second over the 600 s window: {count}");
            assert_eq!(*span as i64 + 1, *count, "{key}: every second from the first to the last, no gap");
        }
    }
    let total: i64 = per_timer.iter().map(|t| t.1).sum();
    assert_eq!(written as i64, total, "the passes counted what they wrote");
    let behind: i64 =
        sqlx::query_scalar("SELECT count(*) FROM timers WHERE materialized_until < now() + interval '540 seconds'").fetch_one(&pool).await.unwrap();
    assert_eq!(behind, 0, "every timer's window is written to its end");
    assert_eq!(timers::materialize_due(&pool, WINDOW).await.unwrap(), 0, "nothing is due any more");
}
