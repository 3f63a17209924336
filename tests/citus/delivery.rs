//! Delivery of one biz type's tasks end to end on a Citus cluster: a chime node (API,
//! engine and leader) on the coordinator, a real receiver; the claim and the record run on
//! the worker of the biz type's shard (claim_citus.sql, record_citus.sql).

use std::time::Duration;

use chime::biz_types::Settings;
use chime::config::ServeArgs;
use serde_json::json;

use crate::cluster::migrated_database;
use crate::helpers::{self, wait_until};
use crate::receiver::{Answer, Receiver};

#[tokio::test]
async fn a_biz_types_tasks_are_delivered_retried_and_failed_on_citus() {
    let app = helpers::spawn_on(migrated_database().await, ServeArgs::default()).await;
    // The first callback fails and is retried; the second is refused for good (a 4xx fails
    // at once); every other is delivered.
    let receiver = Receiver::start(vec![Answer::status(500), Answer::status(404)], Answer::status(200)).await;
    let settings = Settings {
        callback_url: Some(receiver.url.clone()),
        failure_url: Some("http://127.0.0.1:9/failed".into()),
        backoff_initial_ms: Some(10),
        ..Default::default()
    };
    let token = helpers::biz_type_with(&app.pool, "orders", &settings).await;
    let mut ids = Vec::new();
    for n in 0..4 {
        ids.push(app.create_task(&token, json!({"biz_type": "orders", "payload": n})).await["id"].as_str().unwrap().to_string());
    }

    let states = wait_until("every task settled", Duration::from_secs(30), || async {
        let states: Vec<(String, String, i32)> =
            sqlx::query_as("SELECT id::text, status, attempt_count FROM tasks ORDER BY id").fetch_all(&app.pool).await.unwrap();
        if states.iter().all(|(_, status, _)| status == "succeeded" || status == "failed") { Ok(states) } else { Err(format!("{states:?}")) }
    })
    .await;
    let failed: Vec<&(String, String, i32)> = states.iter().filter(|(_, status, _)| status == "failed").collect();
    assert_eq!(failed.len(), 1, "{states:?}");
    assert_eq!(states.iter().filter(|(_, status, _)| status == "succeeded").count(), 3, "{states:?}");
    assert_eq!(states.iter().map(|(_, _, n)| n).sum::<i32>(), 5, "four first tries and one retry: {states:?}");
    assert_eq!(receiver.received().len(), 5);

    // Every try is in attempts, on the worker; the failed task's notice was queued with it.
    let attempts: i64 = sqlx::query_scalar("SELECT count(*) FROM attempts").fetch_one(&app.pool).await.unwrap();
    assert_eq!(attempts, 5);
    let notices: Vec<(String, String)> = sqlx::query_as("SELECT task_id::text, event FROM failure_notices").fetch_all(&app.pool).await.unwrap();
    assert_eq!(notices, vec![(failed[0].0.clone(), "task.failed".to_string())]);

    // Read back through the API as on plain PostgreSQL.
    let done = app.get(&format!("/api/v1/tasks/{}", failed[0].0), &token).await;
    assert_eq!(done.status, 200, "{}", done.body);
    assert_eq!(done.body["status"], "failed");
    // The 404 ends it, whether it was this task's first try or the retry after a 500: the
    // tasks are sent concurrently, so which task took which answer is not fixed.
    let tries = done.body["attempts"].as_array().unwrap();
    assert_eq!(tries.len() as i32, failed[0].2, "{}", done.body);
    assert_eq!(tries.last().unwrap()["status_code"], 404, "{}", done.body);
}
