//! `chime migrate` on a Citus coordinator, and where tasks created through the API land.

use std::collections::BTreeMap;

use chime::config::ServeArgs;
use serde_json::json;
use sqlx::{Connection, PgConnection};

use crate::cluster::{self, migrated_database};
use crate::helpers::{self, TestApp};

/// The per-task tables, distributed by biz type, all in one colocation group.
const DISTRIBUTED: [&str; 8] =
    ["attempts", "chat_channels", "chat_notices", "failure_notices", "receiver_breakers", "task_keys", "tasks", "tasks_cold"];
/// Tables that stay on the coordinator, outside Citus's metadata.
const PLAIN: [&str; 10] =
    ["admin_tokens", "api_tokens", "audit_log", "console_keys", "hot_horizon", "nodes", "sessions", "task_events", "timers", "users"];

/// How Citus holds each table that is not a partition: `distributed by <column>`,
/// `reference`, or `local` (a Citus local table, on the coordinator; chime makes none).
async fn placements(conn: &mut PgConnection) -> BTreeMap<String, String> {
    let rows: Vec<(String, String)> = sqlx::query_as(
        "SELECT p.logicalrelid::regclass::text,
                CASE WHEN p.partmethod = 'h' THEN 'distributed by ' || column_to_column_name(p.logicalrelid, p.partkey)
                     WHEN p.repmodel = 't' THEN 'reference' ELSE 'local' END
           FROM pg_dist_partition p JOIN pg_class c ON c.oid = p.logicalrelid
          WHERE NOT c.relispartition",
    )
    .fetch_all(conn)
    .await
    .unwrap();
    rows.into_iter().collect()
}

async fn primary_key(conn: &mut PgConnection, table: &str) -> String {
    sqlx::query_scalar("SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conrelid = $1::regclass AND contype = 'p'")
        .bind(table)
        .fetch_one(conn)
        .await
        .unwrap()
}

#[tokio::test]
async fn migrate_distributes_the_per_task_tables_by_biz_type() {
    let url = migrated_database().await;
    let mut conn = PgConnection::connect(&url).await.unwrap();
    // Every `chime migrate` runs the Citus step again: it finds everything done.
    chime::db::migrate_on(&mut conn).await.expect("a second chime migrate");

    let placed = placements(&mut conn).await;
    for table in DISTRIBUTED {
        assert_eq!(placed.get(table).map(String::as_str), Some("distributed by biz_type_id"), "{table}: {placed:?}");
    }
    assert_eq!(placed.get("biz_types").map(String::as_str), Some("reference"), "{placed:?}");
    for table in PLAIN {
        assert!(!placed.contains_key(table), "{table} should stay a plain table on the coordinator: {placed:?}");
    }
    assert_eq!(placed.len(), DISTRIBUTED.len() + 1, "a table nobody placed: {placed:?}");

    let groups: Vec<i32> = sqlx::query_scalar("SELECT DISTINCT colocationid FROM pg_dist_partition WHERE logicalrelid::regclass::text = ANY($1)")
        .bind(DISTRIBUTED)
        .fetch_all(&mut conn)
        .await
        .unwrap();
    assert_eq!(groups.len(), 1, "the per-task tables are colocated: {groups:?}");

    // Keys that Citus requires to hold the distribution column.
    assert_eq!(primary_key(&mut conn, "tasks").await, "PRIMARY KEY (id, run_at, biz_type_id)");
    assert_eq!(primary_key(&mut conn, "tasks_cold").await, "PRIMARY KEY (id, biz_type_id)");
    assert_eq!(primary_key(&mut conn, "failure_notices").await, "PRIMARY KEY (id, biz_type_id)");
    assert_eq!(primary_key(&mut conn, "chat_notices").await, "PRIMARY KEY (id, biz_type_id)");
    assert_eq!(primary_key(&mut conn, "task_keys").await, "PRIMARY KEY (biz_type_id, key)");
}

/// Without the citus extension in chime's database the step does nothing: the schema is the
/// plain one, whatever the server has preloaded.
#[tokio::test]
async fn a_database_without_citus_keeps_the_plain_schema() {
    let mut conn = PgConnection::connect(&cluster::plain_database().await).await.unwrap();
    chime::db::migrate_on(&mut conn).await.expect("chime migrate on plain PostgreSQL");
    let citus: bool = sqlx::query_scalar("SELECT EXISTS (SELECT FROM pg_extension WHERE extname = 'citus')").fetch_one(&mut conn).await.unwrap();
    assert!(!citus);
    assert_eq!(primary_key(&mut conn, "tasks").await, "PRIMARY KEY (id, run_at)");
    assert_eq!(primary_key(&mut conn, "tasks_cold").await, "PRIMARY KEY (id)");
    assert_eq!(primary_key(&mut conn, "failure_notices").await, "PRIMARY KEY (id)");
}

/// The worker (its socket directory) that holds the shard of `table` for `biz_type_id`, and
/// that shard's table name.
async fn shard_of(pool: &chime::db::Pool, table: &str, biz_type_id: i32) -> (String, String) {
    sqlx::query_as(
        "SELECT s.nodename, s.shard_name FROM citus_shards s
          WHERE s.shardid = get_shard_id_for_distribution_column($1, $2)",
    )
    .bind(table)
    .bind(biz_type_id)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// Rows of `biz_type_id` in the shards of `table` that `worker` holds, read on the worker
/// itself: where the rows are stored, not what the coordinator answers.
async fn rows_on_worker(app: &TestApp, worker: &str, table: &str, biz_type_id: i32) -> i64 {
    let shards: Vec<String> = sqlx::query_scalar("SELECT shard_name FROM citus_shards WHERE table_name = $1::regclass AND nodename = $2")
        .bind(table)
        .bind(worker)
        .fetch_all(&app.pool)
        .await
        .unwrap();
    assert!(!shards.is_empty(), "{worker} holds shards of {table}");
    let database = url::Url::parse(&app.db_url).unwrap().path().trim_start_matches('/').to_string();
    let mut conn = PgConnection::connect(&cluster::worker_url(worker, &database)).await.unwrap();
    let union = shards.iter().map(|s| format!("SELECT count(*) AS n FROM {s} WHERE biz_type_id = $1")).collect::<Vec<_>>().join(" UNION ALL ");
    let n: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT sum(n)::int8 FROM ({union}) s")))
        .bind(biz_type_id)
        .fetch_one(&mut conn)
        .await
        .unwrap();
    conn.close().await.unwrap();
    n
}

#[tokio::test]
async fn tasks_created_through_the_api_land_on_the_worker_of_their_biz_type() {
    let url = migrated_database().await;
    let app = helpers::spawn_on(url, ServeArgs { engine: false, ..ServeArgs::default() }).await;

    // Biz types until two of them sit on different workers (hashing decides; the same ids
    // hash the same way on every run).
    let mut by_worker: BTreeMap<String, (String, i32, String)> = BTreeMap::new();
    for i in 0..16 {
        let name = format!("orders{i}");
        let token = app.biz_type(&name).await;
        let id: i32 = sqlx::query_scalar("SELECT id FROM biz_types WHERE name = $1").bind(&name).fetch_one(&app.pool).await.unwrap();
        let (worker, _) = shard_of(&app.pool, "tasks", id).await;
        by_worker.entry(worker).or_insert((name, id, token));
        if by_worker.len() == 2 {
            break;
        }
    }
    assert_eq!(by_worker.len(), 2, "biz types on both workers: {by_worker:?}");
    let workers: Vec<String> = by_worker.keys().cloned().collect();

    for (worker, (name, id, token)) in &by_worker {
        let other = workers.iter().find(|w| *w != worker).unwrap();
        // Three due soon, one keyed; one beyond the hot horizon (cold storage).
        let keyed = app.create_task(token, json!({"biz_type": name, "key": "order-1", "delay_ms": 60_000, "payload": {"n": 1}})).await;
        app.create_task(token, json!({"biz_type": name, "delay_ms": 60_000, "payload": {"n": 2}})).await;
        app.create_task(token, json!({"biz_type": name, "delay_ms": 60_000, "payload": {"n": 3}})).await;
        let cold =
            app.create_task(token, json!({"biz_type": name, "key": "order-later", "delay_ms": 30 * 86_400_000_i64, "payload": {"n": 4}})).await;

        assert_eq!(rows_on_worker(&app, worker, "tasks", *id).await, 3, "{name}'s hot tasks on {worker}");
        assert_eq!(rows_on_worker(&app, other, "tasks", *id).await, 0, "none of {name}'s tasks on {other}");
        assert_eq!(rows_on_worker(&app, worker, "tasks_cold", *id).await, 1, "{name}'s cold task on {worker}");
        assert_eq!(rows_on_worker(&app, worker, "task_keys", *id).await, 2, "{name}'s keys on {worker}");
        assert_eq!(rows_on_worker(&app, other, "task_keys", *id).await, 0, "none of {name}'s keys on {other}");

        // Read back through the coordinator: by id (no biz type in the path: every shard is
        // asked) and by key (routed to the biz type's shard).
        for task in [&keyed, &cold] {
            let id = task["id"].as_str().unwrap();
            let by_id = app.get(&format!("/api/v1/tasks/{id}"), token).await;
            assert_eq!(by_id.status, 200, "{}", by_id.body);
            assert_eq!(by_id.body["id"], task["id"]);
            assert_eq!(by_id.body["biz_type"], json!(name));
            assert_eq!(by_id.body["payload"], task["payload"]);
            let key = task["key"].as_str().unwrap();
            let by_key = app.get(&format!("/api/v1/biz-types/{name}/tasks/by-key/{key}"), token).await;
            assert_eq!(by_key.status, 200, "{}", by_key.body);
            assert_eq!(by_key.body["id"], task["id"]);
        }
        // The same key again is the same task (task_keys' primary key, on the worker).
        let again = app.post("/api/v1/tasks", token, json!({"biz_type": name, "key": "order-1", "delay_ms": 60_000, "payload": {"n": 1}})).await;
        assert_eq!(again.status, 200, "{}", again.body);
        assert_eq!(again.body["id"], keyed["id"]);
    }

    // A biz type's token reads only its own tasks: another's is found (on its worker) and
    // refused.
    let mut types = by_worker.values();
    let (first, second) = (types.next().unwrap(), types.next().unwrap());
    let theirs = app.create_task(&second.2, json!({"biz_type": second.0, "delay_ms": 60_000})).await;
    let refused = app.get(&format!("/api/v1/tasks/{}", theirs["id"].as_str().unwrap()), &first.2).await;
    assert_eq!(refused.status, 403, "{}", refused.body);
}
