//! Timers on a Citus cluster: the leader writes a timer's occurrences (tasks of its biz
//! type, on the worker holding its shard), the engine delivers them, and a change or a
//! deactivation takes back the occurrences not fired yet.

use std::time::Duration;

use chime::biz_types::Settings;
use chime::config::ServeArgs;
use serde_json::json;

use crate::cluster::migrated_database;
use crate::helpers::{self, wait_until};
use crate::receiver::{Answer, Receiver};

#[tokio::test]
async fn a_timers_occurrences_are_written_delivered_and_taken_back_on_citus() {
    let app = helpers::spawn_on(migrated_database().await, ServeArgs::default()).await;
    let receiver = Receiver::start(vec![], Answer::status(200)).await;
    let settings = Settings { callback_url: Some(receiver.url.clone()), ..Default::default() };
    let token = helpers::biz_type_with(&app.pool, "reports", &settings).await;
    let timer = app.post("/api/v1/timers", &token, json!({"biz_type": "reports", "key": "tick", "cron": "* * * * * *", "payload": {"k": 1}})).await;
    assert_eq!(timer.status, 201, "{}", timer.body);
    let id = timer.body["id"].as_str().unwrap().to_string();

    // Every second's occurrence is delivered, as its timer's.
    let received = receiver.wait_for(3, Duration::from_secs(30)).await;
    assert!(received.len() >= 3, "{} occurrences delivered", received.len());
    for call in &received {
        let body = call.json();
        assert_eq!((body["timer_id"].as_str(), &body["payload"]), (Some(id.as_str()), &json!({"k": 1})), "{body}");
    }
    let ahead: i64 = sqlx::query_scalar("SELECT count(*) FROM all_tasks WHERE timer_id = $1::uuid AND status = 'pending'")
        .bind(&id)
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert!(ahead > 100, "the window ahead is written: {ahead} pending occurrences");

    // A new schedule replaces the occurrences not fired yet; deactivating takes them all back.
    let changed = app.patch(&format!("/api/v1/timers/{id}"), &token, json!({"cron": "0 0 * * * *"})).await;
    assert_eq!(changed.status, 200, "{}", changed.body);
    wait_until("the old schedule's occurrences taken back", Duration::from_secs(10), || async {
        let seconds: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM all_tasks WHERE timer_id = $1::uuid AND status = 'pending' AND extract(minute FROM run_at) <> 0",
        )
        .bind(&id)
        .fetch_one(&app.pool)
        .await
        .unwrap();
        if seconds == 0 { Ok(()) } else { Err(format!("{seconds} left")) }
    })
    .await;
    let off = app.post(&format!("/api/v1/timers/{id}/deactivate"), &token, json!({})).await;
    assert_eq!((off.status, &off.body["active"]), (200, &json!(false)), "{}", off.body);
    let pending: i64 = sqlx::query_scalar("SELECT count(*) FROM all_tasks WHERE timer_id = $1::uuid AND status = 'pending'")
        .bind(&id)
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(pending, 0);
}
