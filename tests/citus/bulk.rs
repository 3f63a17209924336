//! A biz type's task lists and bulk operations on a Citus cluster: the list of its tasks,
//! a bulk cancel of the pending ones matching a filter (hot and cold), a bulk replay of the
//! failed ones, which are then delivered, and a task's attempts.

use std::time::Duration;

use chime::biz_types::Settings;
use chime::config::ServeArgs;
use serde_json::json;

use crate::cluster::migrated_database;
use crate::helpers::{self, wait_until};
use crate::receiver::{Answer, Receiver};

#[tokio::test]
async fn a_biz_types_tasks_are_listed_cancelled_and_replayed_in_bulk_on_citus() {
    let app = helpers::spawn_on(migrated_database().await, ServeArgs::default()).await;
    // Refused for good at first: the due tasks fail.
    let receiver = Receiver::start(vec![], Answer::status(404)).await;
    let settings = Settings { callback_url: Some(receiver.url.clone()), ..Default::default() };
    let token = helpers::biz_type_with(&app.pool, "orders", &settings).await;
    for n in 0..3 {
        app.create_task(&token, json!({"biz_type": "orders", "key": format!("due-{n}")})).await;
        app.create_task(&token, json!({"biz_type": "orders", "key": format!("later-{n}"), "delay_ms": 3_600_000})).await;
    }
    app.create_task(&token, json!({"biz_type": "orders", "key": "later-cold", "delay_ms": 30 * 86_400_000_i64})).await;
    let count = |status: &'static str| {
        let app = &app;
        async move {
            let n: i64 = sqlx::query_scalar("SELECT count(*) FROM all_tasks WHERE status = $1").bind(status).fetch_one(&app.pool).await.unwrap();
            n
        }
    };
    wait_until("the due tasks failed", Duration::from_secs(30), || async { count("failed").await == 3 }).await;

    let listed = app.get("/api/v1/tasks?biz_type=orders&status=pending", &token).await;
    assert_eq!(listed.status, 200, "{}", listed.body);
    assert_eq!(listed.body["items"].as_array().map(Vec::len), Some(4), "{}", listed.body);
    let failed = app.get("/api/v1/tasks?biz_type=orders&status=failed", &token).await;
    let one = failed.body["items"][0]["id"].as_str().unwrap().to_string();
    let attempts = app.get(&format!("/api/v1/tasks/{one}/attempts"), &token).await;
    assert_eq!(attempts.status, 200, "{}", attempts.body);

    let dry = app.post("/api/v1/biz-types/orders/tasks/cancel", &token, json!({"key_prefix": "later-", "dry_run": true})).await;
    assert_eq!((dry.status, &dry.body["matched"]), (200, &json!(4)), "hot and cold: {}", dry.body);
    let cancelled = app.post("/api/v1/biz-types/orders/tasks/cancel", &token, json!({"key_prefix": "later-"})).await;
    assert_eq!((cancelled.status, &cancelled.body["cancelled"]), (200, &json!(4)), "{}", cancelled.body);
    assert_eq!(count("cancelled").await, 4);

    receiver.answer_with(Answer::status(200));
    let replayed = app.post("/api/v1/biz-types/orders/tasks/replay", &token, json!({"status": "failed", "key_prefix": "due-"})).await;
    assert_eq!(replayed.status, 200, "{}", replayed.body);
    wait_until("the replayed tasks delivered", Duration::from_secs(30), || async { count("succeeded").await == 3 }).await;
}
