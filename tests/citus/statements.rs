//! The engine's claim on a Citus cluster: one statement per biz type, routed whole to the
//! worker of the biz type's shard (claim_citus.sql), which leases due tasks and ends those
//! past their deadline, as claim.sql does on plain PostgreSQL.

use chime::biz_types::Settings;
use chime::config::ServeArgs;
use chime::tasks::lease::{self, Want};
use chime::tasks::placement;
use serde_json::json;
use uuid::Uuid;

use crate::cluster::migrated_database;
use crate::helpers::{self, TestApp};

async fn worker_of(app: &TestApp, biz_type_id: i32) -> String {
    sqlx::query_scalar("SELECT nodename FROM citus_shards WHERE shardid = get_shard_id_for_distribution_column('tasks', $1)")
        .bind(biz_type_id)
        .fetch_one(&app.pool)
        .await
        .unwrap()
}

/// A biz type whose failure notices go to a (never reached) failure_url; its id and token.
async fn orders(app: &TestApp) -> (i32, String) {
    let settings = Settings {
        callback_url: Some("http://127.0.0.1:9/callback".into()),
        failure_url: Some("http://127.0.0.1:9/failed".into()),
        ..Default::default()
    };
    let token = helpers::biz_type_with(&app.pool, "orders", &settings).await;
    let id = sqlx::query_scalar("SELECT id FROM biz_types WHERE name = 'orders'").fetch_one(&app.pool).await.unwrap();
    (id, token)
}

fn want(biz_type_id: i32, limit: i64) -> Want {
    Want { biz_type_id, limit, ahead_ms: 0, lease_ms: 60_000, oldest: 1, lane: None, flow: None, priorities: false }
}

/// EXPLAIN of `sql` (its rows joined), with the binds `bind` gives it.
type Explain = sqlx::query::QueryScalar<'static, sqlx::Postgres, String, sqlx::postgres::PgArguments>;

async fn explain(app: &TestApp, sql: &str, bind: impl FnOnce(Explain) -> Explain) -> String {
    let query = sqlx::query_scalar(sqlx::AssertSqlSafe(format!("EXPLAIN (costs off) {sql}")));
    let plan: Vec<String> = bind(query).fetch_all(&app.pool).await.unwrap_or_else(|e| panic!("{sql}: {e}"));
    plan.join("\n")
}

/// One task, on `worker`, with no step through the coordinator.
fn assert_one_task_on(what: &str, plan: &str, worker: &str) {
    assert!(!plan.contains("Distributed Subplan"), "{what}: {plan}");
    assert!(!plan.contains("pull to coordinator"), "{what}: {plan}");
    assert_eq!(plan.matches("Task Count: ").count(), 1, "{what}: {plan}");
    assert!(plan.contains("Task Count: 1\n"), "{what}: {plan}");
    assert!(plan.contains(&format!("Node: host={worker} ")), "{what} on {worker}: {plan}");
}

/// The plan of `sql` on the coordinator, run with the arguments `bind` gives, as EXPLAIN
/// shows it: asserted one task on `worker`, with no step through the coordinator.
async fn assert_single_shard(app: &TestApp, worker: &str, sql: &str, bind: impl FnOnce(Explain) -> Explain) -> String {
    let plan = explain(app, sql, bind).await;
    assert_one_task_on(sql, &plan, worker);
    plan
}

#[tokio::test]
async fn the_claim_of_one_biz_type_is_one_statement_on_its_worker() {
    let app = helpers::spawn_on(migrated_database().await, ServeArgs { engine: false, ..ServeArgs::default() }).await;
    let (id, token) = orders(&app).await;
    app.create_task(&token, json!({"biz_type": "orders", "payload": 1})).await;
    let worker = worker_of(&app, id).await;

    let explain = format!("EXPLAIN (costs off) {}", lease::citus_claim_sql());
    let plan: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(explain))
        .bind(vec![id])
        .bind(vec![10_i64])
        .bind(vec![60_000_i64])
        .bind(Uuid::new_v4())
        .bind(vec![0_i64])
        .bind(None::<chrono::DateTime<chrono::Utc>>)
        .bind(vec![1_i64])
        .bind(id)
        .bind(10_i32)
        .fetch_all(&app.pool)
        .await
        .unwrap();
    let plan = plan.join("\n");
    // One task, on the biz type's worker, which locks the rows it picks there: no step
    // through the coordinator (a "Distributed Subplan").
    assert!(!plan.contains("Distributed Subplan"), "{plan}");
    assert_eq!(plan.matches("Task Count: 1").count(), 1, "{plan}");
    assert!(plan.contains(&format!("Node: host={worker} ")), "on {worker}: {plan}");
    assert!(plan.contains("LockRows"), "{plan}");
}

#[tokio::test]
async fn the_claim_on_citus_leases_due_tasks_and_ends_those_past_their_deadline() {
    let app = helpers::spawn_on(migrated_database().await, ServeArgs { engine: false, ..ServeArgs::default() }).await;
    let (id, token) = orders(&app).await;
    let mut due = Vec::new();
    for n in 0..3 {
        due.push(app.create_task(&token, json!({"biz_type": "orders", "payload": n})).await["id"].as_str().unwrap().to_string());
    }
    let later = app.create_task(&token, json!({"biz_type": "orders", "delay_ms": 3_600_000})).await["id"].as_str().unwrap().to_string();
    // One of the due tasks is past its deadline (which the API would not accept at create).
    sqlx::query("UPDATE tasks SET expires_at = now() - interval '1 second' WHERE biz_type_id = $1 AND id = $2::uuid")
        .bind(id)
        .bind(&due[2])
        .execute(&app.pool)
        .await
        .unwrap();

    let node = Uuid::new_v4();
    let claims = lease::claim(&app.pool, &[want(id, 10)], node, None).await.expect("the claim on Citus");
    let claim = &claims[&id];
    let mut leased: Vec<String> = claim.leased.iter().map(|t| t.id.to_string()).collect();
    leased.sort();
    let mut expected = due[..2].to_vec();
    expected.sort();
    assert_eq!(leased, expected, "the due tasks within their deadline");
    assert_eq!(claim.expired, 1);
    assert!(!claim.capped);

    let states: Vec<(String, String, Option<Uuid>)> =
        sqlx::query_as("SELECT id::text, status, leased_by FROM tasks WHERE biz_type_id = $1 ORDER BY id")
            .bind(id)
            .fetch_all(&app.pool)
            .await
            .unwrap();
    for (task, status, holder) in &states {
        let (want_status, want_holder) = if *task == due[2] {
            ("expired", None)
        } else if *task == later {
            ("pending", None)
        } else {
            ("running", Some(node))
        };
        assert_eq!((status.as_str(), *holder), (want_status, want_holder), "{task}: {states:?}");
    }
    // Its failure notice came with it, in the claim's transaction.
    let notices: Vec<(String, String)> =
        sqlx::query_as("SELECT task_id::text, event FROM failure_notices WHERE biz_type_id = $1").bind(id).fetch_all(&app.pool).await.unwrap();
    assert_eq!(notices, vec![(due[2].clone(), "task.expired".to_string())]);

    // Nothing is left due: a second node's claim takes nothing, and is not capped.
    let again = lease::claim(&app.pool, &[want(id, 10)], Uuid::new_v4(), None).await.unwrap();
    assert!(again.get(&id).is_none_or(|c| c.leased.is_empty() && !c.capped), "{again:?}");
}

#[tokio::test]
async fn the_cap_holds_on_citus() {
    let app = helpers::spawn_on(migrated_database().await, ServeArgs { engine: false, ..ServeArgs::default() }).await;
    let (id, token) = orders(&app).await;
    sqlx::query("UPDATE biz_types SET max_in_flight = 2 WHERE id = $1").bind(id).execute(&app.pool).await.unwrap();
    for n in 0..5 {
        app.create_task(&token, json!({"biz_type": "orders", "payload": n})).await;
    }
    let first = lease::claim(&app.pool, &[want(id, 10)], Uuid::new_v4(), None).await.unwrap();
    assert_eq!(first[&id].leased.len(), 2, "max_in_flight 2");
    assert!(first[&id].capped, "the cap held the rest back");
    let second = lease::claim(&app.pool, &[want(id, 10)], Uuid::new_v4(), None).await.unwrap();
    assert!(second[&id].leased.is_empty(), "two running already, on another node's claim");
    assert!(second[&id].capped);
}

#[tokio::test]
async fn the_pull_reserve_and_the_notice_senders_claims_are_one_statement_on_the_worker() {
    let app = helpers::spawn_on(migrated_database().await, ServeArgs { engine: false, ..ServeArgs::default() }).await;
    let settings = Settings {
        mode: Some("pull".into()),
        chat_platform: Some("slack".into()),
        chat_url: Some("http://127.0.0.1:9/chat".into()),
        ..Default::default()
    };
    let token = helpers::biz_type_with(&app.pool, "jobs", &settings).await;
    app.create_task(&token, json!({"biz_type": "jobs", "payload": 1})).await;
    let id: i32 = sqlx::query_scalar("SELECT id FROM biz_types WHERE name = 'jobs'").fetch_one(&app.pool).await.unwrap();
    let worker = worker_of(&app, id).await;

    let plan = assert_single_shard(&app, &worker, lease::citus_reserve_sql(), |q| {
        q.bind(id)
            .bind(10_i64)
            .bind(60_000_i64)
            .bind("jobs")
            .bind(1_i64)
            .bind(None::<chrono::DateTime<chrono::Utc>>)
            .bind((0..10).map(|_| Uuid::new_v4()).collect::<Vec<_>>())
    })
    .await;
    assert!(plan.contains("LockRows"), "{plan}");
    let plan =
        assert_single_shard(&app, &worker, chime::failure_notices::CITUS_CLAIM, |q| q.bind(id).bind(10_i64).bind(Uuid::new_v4()).bind(15_000_i64))
            .await;
    assert!(plan.contains("LockRows"), "{plan}");
    let plan = assert_single_shard(&app, &worker, &chime::chat_notices::CITUS_CLAIM, |q| {
        q.bind(id).bind(Uuid::new_v4()).bind(Uuid::new_v4()).bind(15_000_i64).bind(0_i64).bind(0_i64)
    })
    .await;
    assert!(plan.contains("LockRows"), "{plan}");
}

#[tokio::test]
async fn the_flow_keyed_claims_statements_are_each_one_statement_on_the_worker() {
    use chime::tasks::lease::flows_citus;
    let app = helpers::spawn_on(migrated_database().await, ServeArgs { engine: false, ..ServeArgs::default() }).await;
    let (id, token) = orders(&app).await;
    sqlx::query("UPDATE biz_types SET flow_max_in_flight = 1 WHERE id = $1").bind(id).execute(&app.pool).await.unwrap();
    let task = app.create_task(&token, json!({"biz_type": "orders", "flow_key": "a", "payload": 1})).await;
    let run_at: chrono::DateTime<chrono::Utc> =
        sqlx::query_scalar("SELECT run_at FROM tasks WHERE biz_type_id = $1").bind(id).fetch_one(&app.pool).await.unwrap();
    let worker = worker_of(&app, id).await;
    let floor = None::<chrono::DateTime<chrono::Utc>>;
    let keys = vec!["a".to_string(), "b".to_string()];

    let plan = assert_single_shard(&app, &worker, flows_citus::HEAD, |q| q.bind(id).bind(0_i64).bind(floor).bind(10_i64)).await;
    assert!(plan.contains("LockRows"), "{plan}");
    assert_single_shard(&app, &worker, flows_citus::HEADS, |q| q.bind(id).bind(keys.clone()).bind(floor).bind(0_i64)).await;
    assert_single_shard(&app, &worker, flows_citus::WALK, |q| q.bind(id).bind(None::<String>).bind(0_i64).bind(floor)).await;
    assert_single_shard(&app, &worker, flows_citus::KEY_TASKS, |q| q.bind(id).bind(keys.clone()).bind(vec![1_i32, 1]).bind(0_i64).bind(floor)).await;
    let plan = assert_single_shard(&app, &worker, flows_citus::lease_sql(), |q| {
        q.bind(vec![id])
            .bind(vec![10_i64])
            .bind(vec![60_000_i64])
            .bind(Uuid::new_v4())
            .bind(vec![0_i64])
            .bind(floor)
            .bind(vec![1_i64])
            .bind(id)
            .bind(10_i32)
            .bind(vec![task["id"].as_str().unwrap().parse::<Uuid>().unwrap()])
            .bind(vec![run_at])
    })
    .await;
    assert!(plan.contains("LockRows"), "{plan}");
}

/// The leader's statements (lease recovery, expiry, cold moves), a release and the record's
/// move to cold storage, each for one biz type: one task on the biz type's worker.
#[tokio::test]
async fn the_leaders_and_the_records_statements_are_one_task_on_the_biz_types_worker() {
    let app = helpers::spawn_on(migrated_database().await, ServeArgs { engine: false, ..ServeArgs::default() }).await;
    let (id, _) = orders(&app).await;
    let worker = worker_of(&app, id).await;
    let now = chrono::Utc::now();
    let task = Uuid::new_v4();

    let plan = explain(&app, include_str!("../../src/tasks/sql/recover_leases_citus.sql"), |q| q.bind(id)).await;
    assert_one_task_on("recover_leases_citus.sql", &plan, &worker);
    assert!(plan.contains("LockRows"), "{plan}");
    let plan = explain(&app, include_str!("../../src/tasks/sql/expire_citus.sql"), |q| q.bind(1000_i64).bind(id)).await;
    assert_one_task_on("expire_citus.sql", &plan, &worker);
    assert!(plan.contains("LockRows"), "{plan}");
    let plan =
        explain(&app, include_str!("../../src/tasks/sql/release_citus.sql"), |q| q.bind(task).bind(id).bind(Uuid::new_v4()).bind("dead")).await;
    assert_one_task_on("release_citus.sql", &plan, &worker);
    let plan = explain(&app, include_str!("../../src/tasks/sql/later_cold_citus.sql"), |q| {
        q.bind(vec![task]).bind(vec![now]).bind(vec![now + chrono::TimeDelta::days(5)]).bind(vec![false]).bind(vec![Some("HTTP 503")]).bind(id)
    })
    .await;
    assert_one_task_on("later_cold_citus.sql", &plan, &worker);
    let plan =
        explain(&app, lease::LATER_COLD_LOCK_CITUS, |q| q.bind(vec![task]).bind(vec![now]).bind(vec![false]).bind(id).bind(Uuid::new_v4())).await;
    assert_one_task_on("later_cold_citus.sql's lock", &plan, &worker);
    assert!(plan.contains("LockRows"), "{plan}");
    let plan = explain(&app, lease::LATER_COLD_DELETE_CITUS, |q| q.bind(id).bind(vec![task]).bind(vec![now])).await;
    assert_one_task_on("later_cold_citus.sql's delete", &plan, &worker);
    let plan = explain(&app, include_str!("../../src/tasks/sql/move_cold_citus.sql"), |q| q.bind(id).bind(vec![task])).await;
    assert_one_task_on("move_cold_citus.sql", &plan, &worker);
    let plan = explain(&app, placement::MOVE_COLD_LOCK_CITUS, |q| q.bind(id).bind(now).bind(100_i64)).await;
    assert_one_task_on("move_cold_citus.sql's lock", &plan, &worker);
    assert!(plan.contains("LockRows"), "{plan}");
    let plan = explain(&app, lease::GIVE_BACK_CITUS, |q| q.bind(id).bind(vec![task]).bind(vec![now]).bind(Uuid::new_v4())).await;
    assert_one_task_on("a stopping node's give-back", &plan, &worker);
    let plan = explain(&app, placement::MOVE_COLD_DELETE_CITUS, |q| q.bind(id).bind(vec![task])).await;
    assert_one_task_on("move_cold_citus.sql's delete", &plan, &worker);
}

#[tokio::test]
async fn every_by_id_statement_with_the_ids_biz_type_is_one_task_on_its_worker() {
    use chime::tasks::by_id_sql as sql;

    let app = helpers::spawn_on(migrated_database().await, ServeArgs { engine: false, ..ServeArgs::default() }).await;
    let (biz, token) = orders(&app).await;
    let id: Uuid = app.create_task(&token, json!({"biz_type": "orders", "payload": 1})).await["id"].as_str().unwrap().parse().unwrap();
    assert_eq!(chime::tasks::ids::biz_type_of(id), Some(biz));
    let worker = worker_of(&app, biz).await;
    let at = chrono::Utc::now();

    // Read (the API's task, the attempts route's check, the console's task page).
    let plan = explain(&app, &sql::read(true), |q| q.bind(id).bind(biz)).await;
    assert_one_task_on("read", &plan, &worker);
    // Attempts: the first page, a page from a cursor, the total, the count before a page.
    for (cursor, forward) in [(false, false), (false, true), (true, true), (true, false)] {
        let plan = explain(&app, &sql::attempts(cursor, forward, true), |q| {
            let q = q.bind(id).bind(101_i64);
            let q = if cursor { q.bind(at).bind(3_i32) } else { q };
            q.bind(biz)
        })
        .await;
        assert_one_task_on(&format!("attempts (cursor {cursor}, forward {forward})"), &plan, &worker);
    }
    let plan = explain(&app, sql::ATTEMPT_TOTAL_CITUS, |q| q.bind(id).bind(biz)).await;
    assert_one_task_on("attempt total", &plan, &worker);
    let plan = explain(&app, sql::ATTEMPTS_BEFORE_CITUS, |q| q.bind(id).bind(at).bind(3_i32).bind(biz)).await;
    assert_one_task_on("attempts before", &plan, &worker);
    // The console's task page: who holds it.
    let plan = explain(&app, &sql::holding_citus(true), |q| q.bind(id).bind(biz)).await;
    assert_one_task_on("holding", &plan, &worker);
    // Cancel, reschedule and replay: the lock, the cancel, the deadline check.
    for table in ["tasks", "tasks_cold"] {
        let plan = explain(&app, &sql::lock_citus(table), |q| q.bind(id).bind(biz)).await;
        assert_one_task_on(&format!("lock in {table}"), &plan, &worker);
        assert!(plan.contains("LockRows"), "{plan}");
        let plan = explain(&app, &sql::cancel(table, true), |q| q.bind(id).bind(biz)).await;
        assert_one_task_on(&format!("cancel in {table}"), &plan, &worker);
    }
    // The console's task page: the other tasks of its key.
    let plan = explain(&app, &sql::others_with_key(true), |q| q.bind(biz).bind("order-17").bind(id)).await;
    assert_one_task_on("the other tasks of its key", &plan, &worker);
    let plan = explain(&app, sql::RESCHEDULED_PAST_DEADLINE_CITUS, |q| q.bind(id).bind(biz)).await;
    assert_one_task_on("the reschedule's deadline check", &plan, &worker);

    // Without the biz type (an id that carries none) the read asks every shard: the old way.
    let plan = explain(&app, &sql::read(false), |q| q.bind(id)).await;
    assert!(plan.contains("Task Count: 4\n"), "{plan}");
}
