//! Moving an existing install from a plain primary to a Citus coordinator, end to end on a
//! small data set, as docs/book/src/citus.md (Moving an existing install) tells an operator:
//! a chime install runs on a plain database, its nodes stop, the database becomes a Citus
//! cluster's (the extension, the workers registered), `chime migrate` runs once, the nodes
//! start again. Nothing is lost: every task, key, attempt and queued notice is where chime
//! finds it, the tasks that waited are delivered, and what had failed replays.

use std::collections::BTreeSet;
use std::time::Duration;

use chime::biz_types::{self, Settings};
use chime::callback_hosts::CallbackHosts;
use chime::config::ServeArgs;
use serde_json::json;
use sqlx::{Connection, PgConnection};

use crate::cluster::{make_cluster_of, plain_database, worker_url};
use crate::helpers::{self, TestApp, wait_until};
use crate::receiver::{Answer, Receiver};

/// What the move must keep, read through SQL: each task (id, biz type, status, tries), and
/// how many keys, attempts and queued failure notices there are.
#[derive(Debug, PartialEq)]
struct Held {
    tasks: Vec<(String, i32, String, i32)>,
    keys: i64,
    attempts: i64,
    notices: i64,
}

async fn held(conn: &mut PgConnection) -> Held {
    let tasks = sqlx::query_as("SELECT id::text, biz_type_id, status, attempt_count FROM all_tasks ORDER BY id").fetch_all(&mut *conn).await.unwrap();
    let count = |table: &str| format!("SELECT count(*) FROM {table}");
    Held {
        tasks,
        keys: sqlx::query_scalar(sqlx::AssertSqlSafe(count("task_keys"))).fetch_one(&mut *conn).await.unwrap(),
        attempts: sqlx::query_scalar(sqlx::AssertSqlSafe(count("attempts"))).fetch_one(&mut *conn).await.unwrap(),
        notices: sqlx::query_scalar(sqlx::AssertSqlSafe(count("failure_notices"))).fetch_one(&mut *conn).await.unwrap(),
    }
}

/// Rows of `table` in its shards on the workers, read on each worker: where the rows are
/// stored, not what the coordinator answers.
async fn rows_on_workers(conn: &mut PgConnection, database: &str, table: &str) -> i64 {
    let shards: Vec<(String, String)> = sqlx::query_as("SELECT nodename, shard_name FROM citus_shards WHERE table_name = $1::regclass")
        .bind(table)
        .fetch_all(&mut *conn)
        .await
        .unwrap();
    assert!(!shards.is_empty(), "{table} has shards");
    let mut rows = 0;
    for (worker, shard) in shards {
        let mut on_worker = PgConnection::connect(&worker_url(&worker, database)).await.unwrap();
        let n: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT count(*) FROM {shard}"))).fetch_one(&mut on_worker).await.unwrap();
        on_worker.close().await.unwrap();
        rows += n;
    }
    rows
}

async fn status_of(app: &TestApp, token: &str, id: &str) -> String {
    let reply = app.get(&format!("/api/v1/tasks/{id}"), token).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    reply.body["status"].as_str().unwrap().to_string()
}

#[tokio::test]
async fn an_install_moved_from_a_plain_primary_to_citus_loses_nothing() {
    // The install as it ran on a plain primary: one biz type's tasks delivered (one refused
    // for good, its failure notice queued), some waiting an hour, one in cold storage, and
    // another biz type's tasks waiting.
    let url = plain_database().await;
    let database = url::Url::parse(&url).unwrap().path().trim_start_matches('/').to_string();
    let plain = helpers::spawn_on(url.clone(), ServeArgs { engine: false, ..ServeArgs::default() }).await;
    let receiver = Receiver::start(vec![Answer::status(404)], Answer::status(200)).await;
    let settings = Settings { callback_url: Some(receiver.url.clone()), failure_url: Some("http://127.0.0.1:9/failed".into()), ..Default::default() };
    for name in ["orders", "invoices"] {
        biz_types::create(&plain.pool, name, &settings, CallbackHosts::Any).await.unwrap();
    }
    let orders = biz_types::create_token(&plain.pool, "orders").await.unwrap();
    let invoices = biz_types::create_token(&plain.pool, "invoices").await.unwrap();
    let engine = helpers::engine(&plain).spawn();
    let mut done = Vec::new();
    for n in 0..12 {
        done.push(
            plain.create_task(&orders, json!({"biz_type": "orders", "key": format!("done-{n}"), "payload": {"n": n}})).await["id"]
                .as_str()
                .unwrap()
                .to_string(),
        );
    }
    receiver.wait_for(12, Duration::from_secs(30)).await;
    engine.stop().await;
    let mut waiting = Vec::new();
    for n in 0..5 {
        waiting.push(
            plain.create_task(&orders, json!({"biz_type": "orders", "key": format!("later-{n}"), "delay_ms": 3_600_000})).await["id"]
                .as_str()
                .unwrap()
                .to_string(),
        );
    }
    for _ in 0..3 {
        waiting.push(plain.create_task(&invoices, json!({"biz_type": "invoices", "delay_ms": 3_600_000})).await["id"].as_str().unwrap().to_string());
    }
    let cold = plain.create_task(&orders, json!({"biz_type": "orders", "key": "next-month", "delay_ms": 30 * 86_400_000_i64})).await;

    let mut conn = PgConnection::connect(&url).await.unwrap();
    let before = wait_until("the delivered tasks recorded", Duration::from_secs(10), || async {
        let held = held(&mut PgConnection::connect(&url).await.unwrap()).await;
        let settled = held.tasks.iter().filter(|(_, _, status, _)| status == "succeeded" || status == "failed").count();
        if settled == 12 && held.notices == 1 { Ok(held) } else { Err(format!("{held:?}")) }
    })
    .await;
    assert_eq!(before.tasks.iter().filter(|(_, _, status, _)| status == "failed").count(), 1, "{before:?}");
    assert_eq!((before.tasks.len(), before.keys, before.attempts), (21, 18, 12), "{before:?}");

    // The move: the database becomes a Citus cluster's, and `chime migrate` runs once.
    make_cluster_of(&database).await;
    chime::db::migrate_on(&mut conn).await.expect("chime migrate moves the install onto the cluster");
    assert_eq!(held(&mut conn).await, before, "every task, key, attempt and notice, as they were");
    assert_eq!(rows_on_workers(&mut conn, &database, "tasks").await, 20, "the hot tasks are on the workers");
    assert_eq!(rows_on_workers(&mut conn, &database, "tasks_cold").await, 1, "the cold task is on a worker");
    assert_eq!(rows_on_workers(&mut conn, &database, "attempts").await, 12, "the attempts are on the workers");
    // The copies the coordinator kept (Citus leaves a distributed table's local rows on disk)
    // are gone: the move does not leave the install's size behind on the coordinator.
    let left: i64 = sqlx::query_scalar(
        "SELECT coalesce(sum(pg_relation_size(c.oid)), 0)::int8 FROM pg_class c
          WHERE c.relkind = 'r' AND c.oid IN (SELECT logicalrelid FROM pg_dist_partition WHERE partmethod = 'h')",
    )
    .fetch_one(&mut conn)
    .await
    .unwrap();
    assert_eq!(left, 0, "bytes of the per-task tables left on the coordinator");

    // The nodes start again, on the coordinator.
    let app = helpers::spawn_on(url.clone(), ServeArgs::default()).await;
    let first = app.get(&format!("/api/v1/tasks/{}", done[0]), &orders).await;
    assert_eq!(first.status, 200, "{}", first.body);
    assert_eq!(first.body["attempts"].as_array().map(Vec::len), Some(1), "{}", first.body);
    let by_key = app.get("/api/v1/biz-types/orders/tasks/by-key/next-month", &orders).await;
    assert_eq!((by_key.status, &by_key.body["id"]), (200, &cold["id"]), "{}", by_key.body);

    // What waited is delivered once made due, by key and by id; the refused task replays;
    // a new task is delivered. (Their ids were made before the move: they carry no biz
    // type, and are found by asking every shard.)
    for n in 0..5 {
        let moved = app.patch(&format!("/api/v1/biz-types/orders/tasks/by-key/later-{n}"), &orders, json!({"delay_ms": 0})).await;
        assert_eq!(moved.status, 200, "{}", moved.body);
    }
    for id in &waiting[5..] {
        let moved = app.patch(&format!("/api/v1/tasks/{id}"), &invoices, json!({"delay_ms": 0})).await;
        assert_eq!(moved.status, 200, "{}", moved.body);
    }
    let failed = before.tasks.iter().find(|(_, _, status, _)| status == "failed").unwrap().0.clone();
    let replayed = app.post(&format!("/api/v1/tasks/{failed}/replay"), &orders, json!({})).await;
    assert_eq!(replayed.status, 200, "{}", replayed.body);
    let new = app.create_task(&orders, json!({"biz_type": "orders"})).await["id"].as_str().unwrap().to_string();
    for (token, id) in
        waiting.iter().enumerate().map(|(i, id)| (if i < 5 { &orders } else { &invoices }, id)).chain([(&orders, &failed), (&orders, &new)])
    {
        wait_until("delivered after the move", Duration::from_secs(30), || async {
            let status = status_of(&app, token, id).await;
            if status == "succeeded" { Ok(()) } else { Err(format!("{id}: {status}")) }
        })
        .await;
    }
    let called: BTreeSet<String> = receiver.received().iter().map(|r| r.json()["task_id"].as_str().unwrap().to_string()).collect();
    for id in waiting.iter().chain([&failed, &new]).chain(&done) {
        assert!(called.contains(id), "{id} was never called");
    }
    assert_eq!(held(&mut conn).await.tasks.len(), 22, "the 21 tasks moved and the new one");
    conn.close().await.unwrap();
}
