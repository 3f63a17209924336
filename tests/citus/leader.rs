//! The leader's duties and the record's moves to cold storage on a Citus cluster, per biz
//! type (docs/design/citus.md, The leader): lease recovery, the expiry sweep, cold → hot
//! moves, a release, a retry or snooze beyond the hot horizon; and partitions made,
//! indexed and dropped on the workers.
//!
//! The leader lock is held by the test (as `helpers::spawn_app_without_leader` does), so
//! that no leader changes tasks behind its back; the test runs each duty itself.

use std::collections::BTreeMap;

use chime::biz_types::{self, Settings};
use chime::callback_hosts::CallbackHosts;
use chime::config::ServeArgs;
use chime::partitions::{self, Layout};
use chime::tasks::lease::{self, Outcome, Verdict, Want};
use chrono::{DateTime, Utc};
use serde_json::json;
use sqlx::{Connection, Executor, PgConnection};
use uuid::Uuid;

use crate::cluster::{self, migrated_database};
use crate::helpers::{self, TestApp};
use crate::receiver::{Answer, Receiver};

/// The API on a migrated Citus database whose leader lock the test holds while it keeps
/// the returned session.
pub async fn app_without_leader(engine: bool) -> (TestApp, PgConnection) {
    let url = migrated_database().await;
    let mut holder = PgConnection::connect(&url).await.unwrap();
    holder.execute("SELECT pg_advisory_lock(109300096525676)").await.unwrap(); // 0x6368696d656c, "chimel"
    (helpers::spawn_on(url, ServeArgs { engine, ..ServeArgs::default() }).await, holder)
}

/// The worker (its socket directory) that holds biz type `id`'s shard of `tasks`.
pub async fn worker_of(app: &TestApp, id: i32) -> String {
    sqlx::query_scalar("SELECT nodename FROM citus_shards WHERE shardid = get_shard_id_for_distribution_column('tasks', $1)")
        .bind(id)
        .fetch_one(&app.pool)
        .await
        .unwrap()
}

/// Biz types made with `settings` (named `{prefix}0`, `{prefix}1`, ...) until two sit on
/// different workers; each one's name, id and token.
async fn on_both_workers(app: &TestApp, prefix: &str, settings: &Settings) -> Vec<(String, i32, String)> {
    let mut by_worker: BTreeMap<String, (String, i32, String)> = BTreeMap::new();
    for i in 0..16 {
        let name = format!("{prefix}{i}");
        biz_types::create(&app.pool, &name, settings, CallbackHosts::Any).await.unwrap();
        let token = biz_types::create_token(&app.pool, &name).await.unwrap();
        let id: i32 = sqlx::query_scalar("SELECT id FROM biz_types WHERE name = $1").bind(&name).fetch_one(&app.pool).await.unwrap();
        by_worker.entry(worker_of(app, id).await).or_insert((name, id, token));
        if by_worker.len() == 2 {
            return by_worker.into_values().collect();
        }
    }
    panic!("no two biz types on different workers: {by_worker:?}");
}

async fn run(app: &TestApp, sql: &str, biz_type_id: i32, id: &str) {
    let done = sqlx::query(sqlx::AssertSqlSafe(sql.to_string())).bind(biz_type_id).bind(id).execute(&app.pool).await.unwrap();
    assert_eq!(done.rows_affected(), 1, "{sql}");
}

async fn state(app: &TestApp, id: &str) -> (String, String, i32, Option<String>) {
    sqlx::query_as(
        "SELECT tableoid::regclass::text, status, attempt_count, last_error FROM tasks WHERE id = $1::uuid
         UNION ALL SELECT 'tasks_cold', status, attempt_count, last_error FROM tasks_cold WHERE id = $1::uuid",
    )
    .bind(id)
    .fetch_one(&app.pool)
    .await
    .unwrap()
}

async fn notices(app: &TestApp, id: &str) -> Vec<String> {
    sqlx::query_scalar("SELECT event FROM failure_notices WHERE task_id = $1::uuid").bind(id).fetch_all(&app.pool).await.unwrap()
}

async fn attempt_errors(app: &TestApp, id: &str) -> Vec<Option<String>> {
    sqlx::query_scalar("SELECT error FROM attempts WHERE task_id = $1::uuid ORDER BY number").bind(id).fetch_all(&app.pool).await.unwrap()
}

/// Lease recovery, the expiry sweep, cold → hot moves and a release, each run by the
/// leader's own functions against two biz types on different workers: each biz type's
/// tasks are changed as on plain PostgreSQL, with their attempts and notices.
#[tokio::test]
async fn the_leaders_duties_run_per_biz_type_on_citus() {
    let (app, _leader) = app_without_leader(false).await;
    let settings = Settings {
        callback_url: Some("http://127.0.0.1:9/callback".into()),
        failure_url: Some("http://127.0.0.1:9/failed".into()),
        ..Default::default()
    };
    let pull = Settings { mode: Some("pull".into()), ..Default::default() };
    let mut pulls = on_both_workers(&app, "jobs", &pull).await.into_iter();
    for (name, id, token) in on_both_workers(&app, "orders", &settings).await {
        let create = |body: serde_json::Value| {
            let (app, token) = (&app, &token);
            async move { app.create_task(token, body).await["id"].as_str().unwrap().to_string() }
        };
        // A lease run out (its node died), one run out past its deadline, one pending past
        // its deadline, one in cold storage now inside the horizon.
        let lost = create(json!({"biz_type": name})).await;
        let lost_late = create(json!({"biz_type": name, "ttl_ms": 600_000})).await;
        let overdue = create(json!({"biz_type": name, "delay_ms": 60_000, "ttl_ms": 600_000})).await;
        let cold = create(json!({"biz_type": name, "delay_ms": 30 * 86_400_000_i64})).await;
        let dead = Uuid::new_v4();
        for task in [&lost, &lost_late] {
            sqlx::query(
                "UPDATE tasks SET status = 'running', leased_by = $3, lease_until = now() - interval '1 second', attempt_count = 1
                  WHERE biz_type_id = $1 AND id = $2::uuid",
            )
            .bind(id)
            .bind(task)
            .bind(dead)
            .execute(&app.pool)
            .await
            .unwrap();
        }
        run(&app, "UPDATE tasks SET expires_at = now() - interval '1 second' WHERE biz_type_id = $1 AND id = $2::uuid", id, &lost_late).await;
        run(&app, "UPDATE tasks SET expires_at = now() - interval '1 second' WHERE biz_type_id = $1 AND id = $2::uuid", id, &overdue).await;
        assert_eq!(state(&app, &cold).await.0, "tasks_cold");
        run(&app, "UPDATE tasks_cold SET run_at = now() + interval '1 hour' WHERE biz_type_id = $1 AND id = $2::uuid", id, &cold).await;

        assert_eq!(chime::leader::recover_leases(&app.pool).await, 2, "{name}");
        let (_, status, attempts, error) = state(&app, &lost).await;
        assert_eq!((status.as_str(), attempts), ("pending", 1), "{name}: pending again");
        assert!(error.as_deref().is_some_and(|e| e.starts_with("lease expired")), "{error:?}");
        assert_eq!(attempt_errors(&app, &lost).await.len(), 1, "the lost attempt is recorded");
        let (_, status, _, error) = state(&app, &lost_late).await;
        assert_eq!(status, "expired", "{name}: past its deadline");
        assert!(error.as_deref().is_some_and(|e| e.starts_with("expired at")), "{error:?}");
        assert_eq!(notices(&app, &lost_late).await, ["task.expired"]);

        assert_eq!(chime::leader::expire_overdue(&app.pool).await, 1, "{name}");
        let (_, status, _, error) = state(&app, &overdue).await;
        assert_eq!(status, "expired");
        assert!(error.as_deref().is_some_and(|e| e.starts_with("expired at") && e.contains("after its deadline")), "{error:?}");
        assert_eq!(notices(&app, &overdue).await, ["task.expired"]);

        // The fallback sweep's probe finds a task more than a minute overdue.
        let late = Utc::now() - chrono::TimeDelta::minutes(2);
        create(json!({"biz_type": name, "run_at": late})).await;
        let found = chime::tasks::stats::overdue(&app.pool).await.expect("the sweep's probe on Citus");
        assert!(found.iter().any(|(biz_type, at)| *biz_type == name && (*at - late).num_milliseconds().abs() < 1), "{name}: {found:?}");

        assert_eq!(chime::leader::move_cold(&app.pool, 100).await, 1, "{name}");
        let (table, status, _, _) = state(&app, &cold).await;
        assert!(table.starts_with("tasks_p"), "{name}: moved into a partition: {table}");
        assert_eq!(status, "pending");
        // Nothing is left to do, and the other biz types' tasks were not touched.
        assert_eq!(chime::leader::recover_leases(&app.pool).await, 0);
        assert_eq!(chime::leader::expire_overdue(&app.pool).await, 0);
        assert_eq!(chime::leader::move_cold(&app.pool, 100).await, 0);

        // A pull consumer's reservation released by a person, on this worker too.
        let (jobs, jobs_id, jobs_token) = pulls.next().unwrap();
        let held = app.create_task(&jobs_token, json!({"biz_type": jobs})).await["id"].as_str().unwrap().to_string();
        let receipt = Uuid::new_v4();
        sqlx::query(
            "UPDATE tasks SET status = 'running', leased_by = $3, lease_until = now() + interval '1 hour', attempt_count = 1
              WHERE biz_type_id = $1 AND id = $2::uuid",
        )
        .bind(jobs_id)
        .bind(&held)
        .bind(receipt)
        .execute(&app.pool)
        .await
        .unwrap();
        let id_of = held.parse().unwrap();
        assert!(!lease::release(&app.pool, jobs_id, id_of, Uuid::new_v4(), "judged dead", "admin").await.unwrap(), "another receipt");
        assert!(lease::release(&app.pool, jobs_id, id_of, receipt, "judged dead", "admin").await.unwrap());
        let (table, status, attempts, error) = state(&app, &held).await;
        assert!(table.starts_with("tasks_p"), "{table}");
        assert_eq!((status.as_str(), attempts, error.as_deref()), ("pending", 1, Some("judged dead")), "{jobs}: released");
        assert_eq!(attempt_errors(&app, &held).await, [Some("judged dead".to_string())]);
    }
}

fn outcome(task: &lease::Claimed, biz_type_id: i32, verdict: Verdict, status_code: i16) -> Outcome {
    Outcome {
        task_id: task.id,
        biz_type_id,
        run_at: task.run_at,
        attempt: task.attempt_count,
        started_at: Utc::now(),
        duration_ms: 5,
        status_code: Some(status_code),
        error: (status_code >= 300).then(|| format!("HTTP {status_code}")),
        response_excerpt: None,
        redirected_to: None,
        verdict,
    }
}

/// A retry and a snooze beyond the hot horizon (later_cold_citus.sql) move their tasks to
/// cold storage, on the worker of their biz type; when they are due (the test moves their
/// due time to now, for the days that would pass), the leader's migrator moves them back
/// into the partitions and the engine delivers them.
#[tokio::test]
async fn a_retry_or_snooze_beyond_the_horizon_goes_cold_and_comes_back_on_citus() {
    let (app, _leader) = app_without_leader(false).await;
    let receiver = Receiver::start(vec![Answer::snooze(&(4 * 86_400).to_string())], Answer::status(200)).await;
    let settings = Settings { callback_url: Some(receiver.url.clone()), ..Default::default() };
    let [(retried_type, retried_id, retried_token), (snoozed_type, snoozed_id, snoozed_token)]: [(String, i32, String); 2] =
        on_both_workers(&app, "later", &settings).await.try_into().unwrap();
    let horizon = partitions::horizon(&app.pool).await.unwrap();

    // The retry: a claim and a record as the engine makes them (no receiver's Retry-After
    // or backoff reaches past the horizon on the first try).
    let retried = app.create_task(&retried_token, json!({"biz_type": retried_type})).await["id"].as_str().unwrap().to_string();
    let node = Uuid::new_v4();
    let want = Want { biz_type_id: retried_id, limit: 10, ahead_ms: 0, lease_ms: 60_000, oldest: 1, lane: None, flow: None, priorities: false };
    let claims = lease::claim(&app.pool, &[want], node, None).await.unwrap();
    let claimed = &claims[&retried_id].leased[0];
    let until: DateTime<Utc> = Utc::now() + chrono::TimeDelta::days(5);
    lease::record(&app.pool, node, &[outcome(claimed, retried_id, Verdict::RetryAt(until), 503)]).await.expect("the record on Citus");
    let task = app.get(&format!("/api/v1/tasks/{retried}"), &retried_token).await.body;
    assert_eq!((&task["status"], &task["attempt_count"], &task["last_error"]), (&json!("pending"), &json!(1), &json!("HTTP 503")), "{task}");
    assert_eq!(state(&app, &retried).await.0, "tasks_cold");
    let cold_at: DateTime<Utc> =
        sqlx::query_scalar("SELECT run_at FROM tasks_cold WHERE id = $1::uuid").bind(&retried).fetch_one(&app.pool).await.unwrap();
    assert_eq!(cold_at.timestamp_micros(), until.timestamp_micros(), "due when the retry is");
    assert!(cold_at > horizon);

    // The snooze: a real callback through the engine, answered with a four-day snooze.
    let snoozed = app.create_task(&snoozed_token, json!({"biz_type": snoozed_type})).await["id"].as_str().unwrap().to_string();
    let mut engine = helpers::engine(&app);
    assert_eq!(engine.turn().await.claimed, 1);
    engine.settled().await;
    let task = app.get(&format!("/api/v1/tasks/{snoozed}"), &snoozed_token).await.body;
    assert_eq!((&task["status"], &task["attempt_count"]), (&json!("pending"), &json!(0)), "{task}");
    assert_eq!(state(&app, &snoozed).await.0, "tasks_cold");
    let snoozes: i32 = sqlx::query_scalar("SELECT snoozes FROM tasks_cold WHERE id = $1::uuid").bind(&snoozed).fetch_one(&app.pool).await.unwrap();
    assert_eq!(snoozes, 1);
    // Not moved before the horizon reaches them.
    assert_eq!(chime::leader::move_cold(&app.pool, 100).await, 0);

    // The days pass: both are due now.
    run(&app, "UPDATE tasks_cold SET run_at = now() WHERE biz_type_id = $1 AND id = $2::uuid", retried_id, &retried).await;
    run(&app, "UPDATE tasks_cold SET run_at = now() WHERE biz_type_id = $1 AND id = $2::uuid", snoozed_id, &snoozed).await;
    assert_eq!(chime::leader::move_cold(&app.pool, 100).await, 2);
    assert_eq!(engine.turn().await.claimed, 2);
    engine.settled().await;
    for (id, token) in [(&retried, &retried_token), (&snoozed, &snoozed_token)] {
        let task = app.get(&format!("/api/v1/tasks/{id}"), token).await.body;
        assert_eq!(task["status"], "succeeded", "{task}");
        let codes: Vec<&serde_json::Value> = task["attempts"].as_array().unwrap().iter().map(|a| &a["status_code"]).collect();
        assert_eq!(codes, [&json!(if *id == retried { 503 } else { 200 }), &json!(200)], "{task}");
    }
    let arrived: Vec<String> = receiver.received().iter().map(|r| r.header("chime-task-id").unwrap().to_string()).collect();
    assert_eq!(arrived.len(), 3, "{arrived:?}");
    assert_eq!(arrived.iter().filter(|id| **id == retried).count(), 1);
    assert_eq!(arrived.iter().filter(|id| **id == snoozed).count(), 2);
}

/// The relation names of `table`'s shards on the cluster's workers.
async fn shards(app: &TestApp, table: &str) -> Vec<(String, String)> {
    sqlx::query_as("SELECT nodename, shard_name FROM citus_shards WHERE table_name = $1::regclass ORDER BY shard_name")
        .bind(table)
        .fetch_all(&app.pool)
        .await
        .unwrap()
}

/// Whether relation `name` exists on the worker `worker`.
async fn on_worker(app: &TestApp, worker: &str, name: &str) -> bool {
    let database = url::Url::parse(&app.db_url).unwrap().path().trim_start_matches('/').to_string();
    let mut conn = PgConnection::connect(&cluster::worker_url(worker, &database)).await.unwrap();
    let found: bool = sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL").bind(name).fetch_one(&mut conn).await.unwrap();
    conn.close().await.unwrap();
    found
}

/// Partitions on Citus: made on the coordinator, each a distributed table colocated with
/// `tasks`, with its shards on the workers; a partitioned index a migration made `ON ONLY`
/// is completed on every partition (`complete_indexes`); partitions past retention are
/// dropped, shards and task keys with them, and one holding an unfinished task is kept.
#[tokio::test]
async fn partitions_are_made_indexed_and_dropped_on_the_workers() {
    let (app, _leader) = app_without_leader(false).await;
    let token = app.biz_type("orders").await;
    let biz: i32 = sqlx::query_scalar("SELECT id FROM biz_types WHERE name = 'orders'").fetch_one(&app.pool).await.unwrap();
    let layout = Layout { retention_days: 30, ..Layout::default() };
    // Partitions back to 40 days ago, as a leader running for that long leaves them.
    partitions::ensure_since(&app.pool, &layout, chrono::Duration::days(40)).await.unwrap();
    let made = partitions::list(&app.pool, "tasks").await.unwrap();
    assert!(made.len() >= 42, "{made:?}");
    let colocated: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_dist_partition p WHERE p.logicalrelid::text LIKE 'tasks_p%'
            AND p.colocationid = (SELECT colocationid FROM pg_dist_partition WHERE logicalrelid = 'tasks'::regclass)",
    )
    .fetch_one(&app.pool)
    .await
    .unwrap();
    assert_eq!(colocated, made.len() as i64, "every partition distributed with tasks");
    let newest = &made.last().unwrap().name;
    let placed = shards(&app, newest).await;
    assert_eq!(placed.len(), 4, "{newest}: {placed:?}");
    for (worker, shard) in &placed {
        assert!(on_worker(&app, worker, shard).await, "{shard} on {worker}");
    }

    // An index made ON ONLY, as a migration does, completed by the leader's duty.
    sqlx::query("CREATE INDEX tasks_citus_test_idx ON ONLY tasks (biz_type_id, created_at)").execute(&app.pool).await.unwrap();
    let built = chime::leader::complete_indexes(&chime::db::Pool::direct(sqlx::PgPool::connect(&app.db_url).await.unwrap())).await;
    assert_eq!(built as usize, made.len(), "one build per partition");
    let valid: bool =
        sqlx::query_scalar("SELECT indisvalid FROM pg_index WHERE indexrelid = 'tasks_citus_test_idx'::regclass").fetch_one(&app.pool).await.unwrap();
    assert!(valid, "the partitioned index is valid once every partition's is attached");
    let (worker, shard) = &placed[0];
    let shard_index = format!("{newest}_tasks_citus_test_idx_{}", shard.rsplit('_').next().unwrap());
    assert!(on_worker(&app, worker, &shard_index).await, "{shard_index} on {worker}");

    // Two tasks 35 days old (past retention), one finished and keyed, one still pending in
    // another day's partition; their partitions are where the API would have put them.
    let old = |days: i64| Utc::now() - chrono::TimeDelta::days(days);
    let finished = Uuid::new_v4();
    let pending = Uuid::new_v4();
    sqlx::query(
        "INSERT INTO tasks (id, biz_type_id, key, run_at, status, finished_at) VALUES ($1, $3, 'old-key', $4, 'succeeded', $4),
                                                                                  ($2, $3, NULL, $5, 'pending', NULL)",
    )
    .bind(finished)
    .bind(pending)
    .bind(biz)
    .bind(old(35))
    .bind(old(36))
    .execute(&app.pool)
    .await
    .unwrap();
    sqlx::query("INSERT INTO task_keys (biz_type_id, key, task_id, request_hash) VALUES ($1, 'old-key', $2, '\\x00')")
        .bind(biz)
        .bind(finished)
        .execute(&app.pool)
        .await
        .unwrap();
    // (The partition's name on the coordinator: `tableoid` read through Citus names the shard.)
    let day = |days: i64| partitions::partition_name("tasks", old(days).date_naive().and_hms_opt(0, 0, 0).unwrap().and_utc());
    let (finished_partition, pending_partition) = (day(35), day(36));
    let finished_shards = shards(&app, &finished_partition).await;

    let dropped = partitions::retire(&app.pool, &layout).await.expect("retention on Citus");
    assert!(dropped.contains(&finished_partition), "{dropped:?}");
    assert!(!dropped.contains(&pending_partition), "kept: it holds a pending task: {dropped:?}");
    let left = partitions::list(&app.pool, "tasks").await.unwrap();
    assert!(left.iter().all(|p| p.to > Utc::now() - chrono::TimeDelta::days(31) || p.name == pending_partition), "{left:?}");
    for (worker, shard) in &finished_shards {
        assert!(!on_worker(&app, worker, shard).await, "{shard} dropped on {worker}");
    }
    let keys: i64 = sqlx::query_scalar("SELECT count(*) FROM task_keys WHERE biz_type_id = $1").bind(biz).fetch_one(&app.pool).await.unwrap();
    assert_eq!(keys, 0, "the dropped task's key is gone with it");
    let by_key = app.get("/api/v1/biz-types/orders/tasks/by-key/old-key", &token).await;
    assert_eq!(by_key.status, 404, "{}", by_key.body);
}

/// A stopping node gives back the tasks it claimed ahead and never started
/// (`lease::give_back`), per biz type on Citus: pending again, as if never claimed, and
/// only those it still holds.
#[tokio::test]
async fn a_stopping_node_gives_back_what_it_claimed_ahead_on_citus() {
    let (app, _leader) = app_without_leader(false).await;
    let settings = Settings { callback_url: Some("http://127.0.0.1:9/callback".into()), ..Default::default() };
    let node = Uuid::new_v4();
    let mut claimed = Vec::new();
    for (name, id, token) in on_both_workers(&app, "ahead", &settings).await {
        app.create_task(&token, json!({"biz_type": name, "delay_ms": 2_000})).await;
        let want = Want { biz_type_id: id, limit: 10, ahead_ms: 60_000, lease_ms: 60_000, oldest: 1, lane: None, flow: None, priorities: false };
        let claims = lease::claim(&app.pool, &[want], node, None).await.unwrap();
        let task = &claims[&id].leased[0];
        claimed.push((task.id, task.run_at, id));
    }
    // Another node's lease is not this node's to give back.
    assert_eq!(lease::give_back(&app.pool, Uuid::new_v4(), &claimed).await.unwrap(), 0);
    assert_eq!(lease::give_back(&app.pool, node, &claimed).await.unwrap(), 2);
    for (id, _, _) in &claimed {
        let (_, status, attempts, _) = state(&app, &id.to_string()).await;
        assert_eq!((status.as_str(), attempts), ("pending", 0), "{id}");
    }
}
