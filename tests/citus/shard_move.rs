//! A shard move under load (docs/book/src/citus.md, Moving shards): Citus moves a busy biz
//! type's shard from one worker to the other (`citus_move_shard_placement`, by logical
//! replication, writes going on meanwhile) while a chime node delivers its tasks and the
//! API takes more. Nothing is lost, nothing is delivered twice beyond at-least-once, and
//! each delivery is recorded once.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use chime::biz_types::Settings;
use chime::config::ServeArgs;
use serde_json::json;
use sqlx::Connection;

use crate::cluster::{cluster, migrated_database};
use crate::helpers::{self, TestApp, wait_until};
use crate::receiver::{Answer, Receiver};

/// Creates `n` tasks of `busy`, due now, in one batch; returns their ids.
async fn burst(app: &TestApp, token: &str, n: usize) -> Vec<String> {
    let items: Vec<serde_json::Value> = (0..n).map(|i| json!({"biz_type": "busy", "payload": i})).collect();
    let reply = app.post("/api/v1/tasks/batch", token, json!({"tasks": items})).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    reply.body["results"].as_array().unwrap().iter().map(|r| r["task"]["id"].as_str().unwrap_or_else(|| panic!("{r}")).to_string()).collect()
}

#[tokio::test]
async fn a_shard_move_under_load_loses_nothing() {
    let app = helpers::spawn_on(migrated_database().await, ServeArgs::default()).await;
    let receiver = Receiver::start(vec![], Answer::status(200)).await;
    let settings = Settings { callback_url: Some(receiver.url.clone()), ..Default::default() };
    let token = helpers::biz_type_with(&app.pool, "busy", &settings).await;
    let biz: i32 = sqlx::query_scalar("SELECT id FROM biz_types WHERE name = 'busy'").fetch_one(&app.pool).await.unwrap();
    let (shard, from): (i64, String) =
        sqlx::query_as("SELECT shardid, nodename FROM citus_shards WHERE shardid = get_shard_id_for_distribution_column('tasks', $1)")
            .bind(biz)
            .fetch_one(&app.pool)
            .await
            .unwrap();
    let workers: Vec<String> = cluster().await.workers.iter().map(|w| w.socket_dir().to_str().unwrap().to_string()).collect();
    let to = workers.iter().find(|w| **w != from).expect("another worker").clone();

    // A backlog, being delivered when the move starts.
    let mut created = burst(&app, &token, 300).await;
    receiver.wait_for(20, Duration::from_secs(30)).await;

    // The move, on a connection of its own (it copies the shards of every colocated table
    // of this biz type's shard, then catches up on the writes made meanwhile, then switches);
    // the API takes more tasks and the engine delivers them all the while. `force_logical`:
    // `attempts` has no primary key, which Citus's default mode refuses ("cannot use logical
    // replication ... since it doesn't have a REPLICA IDENTITY or PRIMARY KEY"); chime only
    // ever inserts attempts (retention drops whole partitions), and inserts replicate
    // without one.
    let url = app.db_url.clone();
    let (mover_from, mover_to) = (from.clone(), to.clone());
    let mover = tokio::spawn(async move {
        let mut conn = sqlx::PgConnection::connect(&url).await.unwrap();
        sqlx::query("SELECT citus_move_shard_placement($1, $2, 5432, $3, 5432, shard_transfer_mode => 'force_logical')")
            .bind(shard)
            .bind(&mover_from)
            .bind(&mover_to)
            .execute(&mut conn)
            .await
            .map(|_| ())
    });
    let before_move = receiver.received().len();
    let mut during = 0;
    while !mover.is_finished() {
        created.extend(burst(&app, &token, 20).await);
        during += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    mover.await.unwrap().expect("citus_move_shard_placement");
    let delivered_during = receiver.received().len() - before_move;
    assert!(delivered_during > 0, "tasks were delivered while the shard moved");
    created.extend(burst(&app, &token, 50).await);
    let now_on: String = sqlx::query_scalar("SELECT nodename FROM citus_shards WHERE shardid = $1").bind(shard).fetch_one(&app.pool).await.unwrap();
    assert_eq!(now_on, to, "the shard moved");
    println!("{} tasks, {during} batches of 20 created and {delivered_during} delivered during the move, {from} -> {to}", created.len());

    let total = created.len() as i64;
    wait_until("every task delivered", Duration::from_secs(45), || async {
        let done: i64 = sqlx::query_scalar("SELECT count(*) FROM tasks WHERE biz_type_id = $1 AND status = 'succeeded'")
            .bind(biz)
            .fetch_one(&app.pool)
            .await
            .unwrap();
        if done == total { Ok(()) } else { Err(format!("{done} of {total} succeeded")) }
    })
    .await;

    // Every task reached the receiver; a second callback of one (at-least-once) would be
    // recorded as a second attempt, so deliveries and attempts agree task by task.
    let mut received: HashMap<String, i64> = HashMap::new();
    for request in receiver.received() {
        *received.entry(request.header("chime-task-id").unwrap().to_string()).or_default() += 1;
    }
    let created_set: HashSet<&String> = created.iter().collect();
    assert_eq!(created_set.len(), created.len(), "ids unique");
    assert_eq!(received.keys().collect::<HashSet<_>>(), created_set, "every task delivered, no other");
    let attempts: HashMap<String, i64> =
        sqlx::query_as::<_, (String, i64)>("SELECT task_id::text, count(*) FROM attempts WHERE biz_type_id = $1 GROUP BY task_id")
            .bind(biz)
            .fetch_all(&app.pool)
            .await
            .unwrap()
            .into_iter()
            .collect();
    assert_eq!(attempts, received, "each delivery recorded once");
    let statuses: Vec<(String, i64)> =
        sqlx::query_as("SELECT status, count(*) FROM all_tasks WHERE biz_type_id = $1 GROUP BY status").bind(biz).fetch_all(&app.pool).await.unwrap();
    assert_eq!(statuses, vec![("succeeded".to_string(), total)]);
    let doubled = received.values().filter(|n| **n > 1).count();
    println!("{doubled} tasks delivered more than once");
}
