//! Deadlines (docs/design/contract.md, Tasks by key): no callback starts at or after a task's `expires_at`; a task not
//! delivered by then ends `expired`, whatever held it back; a replay clears the deadline.

use std::time::Duration;

use chime::biz_types::{self, Settings};
use chime::callback_hosts::CallbackHosts;
use serde_json::{Value, json};

use crate::delivery::wait_for_status;
use crate::helpers::{TestApp, engine, spawn_app, wait_until};
use crate::receiver::{Answer, Receiver};

/// A delivering biz type pointed at the receiver; returns its token.
async fn biz_type(app: &TestApp, name: &str, receiver: &Receiver, settings: Settings) -> String {
    let settings = Settings { callback_url: Some(receiver.url.clone()), ..settings };
    biz_types::create(&app.pool, name, &settings, CallbackHosts::Any).await.unwrap();
    biz_types::create_token(&app.pool, name).await.unwrap()
}

fn in_ms(ms: i64) -> String {
    (chrono::Utc::now() + chrono::TimeDelta::milliseconds(ms)).to_rfc3339()
}

/// A task whose deadline passes while its biz type is paused ends expired (the leader's
/// sweep), saying why, with a failure notice queued for a biz type that wants them; it is
/// never called back, not even once the biz type resumes. A replay clears the deadline and
/// delivers it.
#[tokio::test]
async fn a_task_whose_deadline_passes_while_paused_ends_expired_and_is_never_called() {
    let app = spawn_app().await;
    let receiver = Receiver::start(vec![], Answer::status(200)).await;
    let token = biz_type(&app, "orders", &receiver, Settings { paused: Some(true), ..Default::default() }).await;
    sqlx::query("UPDATE biz_types SET failure_url = 'http://127.0.0.1:9/failed'").execute(&app.pool).await.unwrap();
    let task = app.create_task(&token, json!({"biz_type": "orders", "expires_at": in_ms(800)})).await;
    let id = task["id"].as_str().unwrap();
    let mut engine = engine(&app);
    assert_eq!(engine.turn().await.claimed, 0, "paused: nothing claimed");

    // The app's leader sweeps every second.
    let expired = wait_for_status(&app, &token, id, "expired").await;
    let error = expired["last_error"].as_str().unwrap();
    assert!(error.starts_with("expired at ") && error.contains("not delivered before its deadline") && error.contains("paused"), "{error}");
    assert!(expired["finished_at"].is_string());
    assert_eq!(expired["attempts"], json!([]), "never attempted");
    let notices: Vec<String> =
        sqlx::query_scalar("SELECT event FROM failure_notices WHERE task_id = $1::uuid").bind(id).fetch_all(&app.pool).await.unwrap();
    assert_eq!(notices, ["task.expired"]);

    sqlx::query("UPDATE biz_types SET paused = false").execute(&app.pool).await.unwrap();
    engine.reread_settings();
    assert_eq!(engine.turn().await.claimed, 0, "an expired task is not claimed");
    engine.settled().await;
    assert!(receiver.received().is_empty(), "no callback after the deadline");

    let replayed = app.post(&format!("/api/v1/tasks/{id}/replay"), &token, json!({})).await;
    assert_eq!(replayed.status, 200, "{}", replayed.body);
    assert_eq!((&replayed.body["status"], &replayed.body["expires_at"]), (&json!("pending"), &Value::Null), "a replay has no deadline");
    assert_eq!(engine.turn().await.claimed, 1);
    engine.settled().await;
    wait_for_status(&app, &token, id, "succeeded").await;
    assert_eq!(receiver.received().len(), 1);
}

/// A failed attempt whose retry would start at or after the deadline ends the task expired
/// at once, not pending until then: the attempt is kept, and the task says why.
#[tokio::test]
async fn a_failure_whose_retry_would_pass_the_deadline_ends_expired_now() {
    let app = spawn_app().await;
    let receiver = Receiver::start(vec![], Answer::status(503)).await;
    let settings = Settings { backoff_initial_ms: Some(20_000), backoff_max_ms: Some(20_000), ..Default::default() };
    let token = biz_type(&app, "orders", &receiver, settings).await;
    let task = app.create_task(&token, json!({"biz_type": "orders", "ttl_ms": 5000})).await;
    let id = task["id"].as_str().unwrap();
    let mut engine = engine(&app);
    assert_eq!(engine.turn().await.claimed, 1);
    engine.settled().await;

    let task = app.get(&format!("/api/v1/tasks/{id}"), &token).await.body;
    assert_eq!(task["status"], "expired", "the retry (10 to 20 s away) falls after the 5 s deadline: {task}");
    let error = task["last_error"].as_str().unwrap();
    assert!(
        error.contains("next retry would start at") && error.contains("at or after its deadline") && error.ends_with("(last attempt: HTTP 503)"),
        "{error}"
    );
    assert_eq!(task["attempts"].as_array().unwrap().len(), 1);
    assert_eq!(task["attempts"][0]["status_code"], 503);
    assert_eq!(receiver.received().len(), 1);

    // With a deadline beyond the retry, the same failure is retried.
    let task = app.create_task(&token, json!({"biz_type": "orders", "ttl_ms": 60_000})).await;
    let id = task["id"].as_str().unwrap();
    assert_eq!(engine.turn().await.claimed, 1);
    engine.settled().await;
    let task = app.get(&format!("/api/v1/tasks/{id}"), &token).await.body;
    assert_eq!((&task["status"], &task["attempt_count"]), (&json!("pending"), &json!(1)), "{task}");
}

/// A task claimed ahead of its due time whose deadline comes before that time is not sent:
/// its attempt says so and the task ends expired.
#[tokio::test]
async fn a_task_claimed_ahead_whose_deadline_comes_first_is_not_sent() {
    let app = spawn_app().await;
    let receiver = Receiver::start(vec![], Answer::status(200)).await;
    let token = biz_type(&app, "orders", &receiver, Settings::default()).await;
    let mut engine = engine(&app);
    // The claim takes tasks due within 100 ms; the deadline must still lie ahead when it
    // does, so a slow turn may find it passed (then the claim ends it): try a few times.
    let mut sent_path = None;
    for _ in 0..10 {
        let task = app.create_task(&token, json!({"biz_type": "orders", "delay_ms": 60_000})).await;
        let id = task["id"].as_str().unwrap().to_string();
        sqlx::query(
            "UPDATE tasks SET run_at = now() + interval '95 milliseconds', expires_at = now() + interval '70 milliseconds' WHERE id = $1::uuid",
        )
        .bind(&id)
        .execute(&app.pool)
        .await
        .unwrap();
        let claimed = engine.turn().await.claimed;
        engine.settled().await;
        let task = wait_for_status(&app, &token, &id, "expired").await;
        if claimed == 1 {
            sent_path = Some(task);
            break;
        }
    }
    let task = sent_path.expect("no turn claimed the task before its deadline in 10 tries");
    assert!(receiver.received().is_empty(), "not sent");
    let attempts = task["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 1, "{task}");
    let error = attempts[0]["error"].as_str().unwrap();
    assert!(error.starts_with("not sent: its deadline") && error.contains("came before its due time"), "{error}");
    assert_eq!(attempts[0]["status_code"], Value::Null);
}

/// The claim ends a due task whose deadline has passed instead of leasing it.
#[tokio::test]
async fn the_claim_ends_tasks_past_their_deadline_and_leases_the_rest() {
    let app = spawn_app().await;
    let receiver = Receiver::start(vec![], Answer::status(200)).await;
    let token = biz_type(&app, "orders", &receiver, Settings::default()).await;
    let late = app.create_task(&token, json!({"biz_type": "orders", "delay_ms": 60_000})).await;
    let fine = app.create_task(&token, json!({"biz_type": "orders"})).await;
    let (late, fine) = (late["id"].as_str().unwrap(), fine["id"].as_str().unwrap());
    // Due a second ago, its deadline just passed (a backlog held it back).
    sqlx::query("UPDATE tasks SET run_at = now() - interval '1 second', expires_at = now() WHERE id = $1::uuid")
        .bind(late)
        .execute(&app.pool)
        .await
        .unwrap();
    let mut engine = engine(&app);
    let turn = engine.turn().await;
    engine.settled().await;
    assert!(turn.claimed <= 1, "{turn:?}");
    wait_for_status(&app, &token, fine, "succeeded").await;
    let late = wait_for_status(&app, &token, late, "expired").await;
    let error = late["last_error"].as_str().unwrap();
    assert!(error.starts_with("expired at ") && error.contains("not delivered before its deadline"), "{error}");
    assert_eq!(receiver.received().len(), 1, "only the task inside its deadline was called");
    assert_eq!(receiver.received()[0].json()["task_id"], fine);
}

/// Rescheduling a pending task to its deadline or later is refused, naming the field; to
/// before it is accepted and keeps the deadline.
#[tokio::test]
async fn a_reschedule_at_or_after_the_deadline_is_refused() {
    let app = spawn_app().await;
    let token = app.biz_type("orders").await;
    let task = app.create_task(&token, json!({"biz_type": "orders", "delay_ms": 3_600_000, "ttl_ms": 3_600_000})).await;
    let id = task["id"].as_str().unwrap();
    let deadline = task["expires_at"].as_str().unwrap().to_string();
    let path = format!("/api/v1/tasks/{id}");

    let at_deadline = app.patch(&path, &token, json!({"run_at": deadline})).await;
    assert_eq!((at_deadline.status, at_deadline.code()), (422, "invalid_argument"), "{}", at_deadline.body);
    assert!(at_deadline.message().starts_with("run_at") && at_deadline.message().contains("deadline"), "{}", at_deadline.message());
    let by_delay = app.patch(&path, &token, json!({"delay_ms": 3 * 3_600_000})).await;
    assert_eq!(by_delay.status, 422, "{}", by_delay.body);
    assert!(by_delay.message().starts_with("delay_ms"), "{}", by_delay.message());
    let unchanged = app.get(&path, &token).await.body;
    assert_eq!(unchanged["run_at"], task["run_at"], "a refused reschedule changes nothing");

    let earlier = app.patch(&path, &token, json!({"delay_ms": 60_000})).await;
    assert_eq!(earlier.status, 200, "{}", earlier.body);
    assert_eq!(earlier.body["expires_at"].as_str(), Some(deadline.as_str()), "the deadline stays");
}

/// Lease recovery ends a task whose deadline passed while its lease ran out, rather than
/// putting it back to pending.
#[tokio::test]
async fn a_lease_recovered_past_the_deadline_ends_expired() {
    let app = spawn_app().await;
    let token = app.biz_type("orders").await;
    let task = app.create_task(&token, json!({"biz_type": "orders", "ttl_ms": 60_000})).await;
    let id = task["id"].as_str().unwrap();
    sqlx::query(
        "UPDATE tasks SET status = 'running', attempt_count = 1, leased_by = gen_random_uuid(),
                lease_until = now() - interval '1 second', expires_at = now() WHERE id = $1::uuid",
    )
    .bind(id)
    .execute(&app.pool)
    .await
    .unwrap();
    chime::leader::recover_leases(&app.pool).await;
    let task = wait_for_status(&app, &token, id, "expired").await;
    let error = task["last_error"].as_str().unwrap();
    assert!(error.contains("not delivered before its deadline") && error.contains("lease expired"), "{error}");
    assert_eq!(task["attempts"].as_array().unwrap().len(), 1, "the lost attempt is recorded");
}

/// A pull biz type nobody reserves from: its task past the deadline ends expired; one
/// reserved after its deadline passed is ended by the reserve, not handed out.
#[tokio::test]
async fn pull_tasks_past_their_deadline_end_expired_and_are_not_reserved() {
    let app = spawn_app().await;
    biz_types::create(&app.pool, "feed", &Settings { mode: Some("pull".into()), ..Default::default() }, CallbackHosts::Any).await.unwrap();
    let token = biz_types::create_token(&app.pool, "feed").await.unwrap();
    let task = app.create_task(&token, json!({"biz_type": "feed", "ttl_ms": 500})).await;
    let swept = task["id"].as_str().unwrap();
    wait_for_status(&app, &token, swept, "expired").await;

    let task = app.create_task(&token, json!({"biz_type": "feed", "ttl_ms": 60_000})).await;
    let late = task["id"].as_str().unwrap();
    sqlx::query("UPDATE tasks SET expires_at = now() WHERE id = $1::uuid").bind(late).execute(&app.pool).await.unwrap();
    let biz_type_id = biz_types::id_of(&app.pool, "feed").await.unwrap();
    let (reserved, _) = chime::tasks::lease::reserve(&app.pool, biz_type_id, "feed", 10, 30_000).await.unwrap();
    assert!(reserved.is_empty(), "{reserved:?}");
    wait_for_status(&app, &token, late, "expired").await;

    // A nack whose retry would start at or after the deadline ends the task at once.
    let task = app.create_task(&token, json!({"biz_type": "feed", "ttl_ms": 5_000})).await;
    let nacked_id = task["id"].as_str().unwrap();
    let reserved = app.post("/api/v1/biz-types/feed/reserve", &token, json!({})).await;
    assert_eq!(reserved.status, 200, "{}", reserved.body);
    let receipt = &reserved.body["tasks"][0]["receipt"];
    let nacked = app.post(&format!("/api/v1/tasks/{nacked_id}/nack"), &token, json!({"receipt": receipt, "delay_ms": 10_000})).await;
    assert_eq!(nacked.status, 200, "{}", nacked.body);
    assert_eq!(nacked.body["status"], "expired", "{}", nacked.body);
    let error = nacked.body["last_error"].as_str().unwrap();
    assert!(error.contains("next retry would start at") && error.ends_with("(last attempt: nacked)"), "{error}");
}

/// The expiry sweep's index, made `ON ONLY` by migration 0015, is completed by the leader:
/// each partition's index built and attached, the parent valid; doing it again builds
/// nothing. The sweep walks it.
#[tokio::test]
async fn the_expiry_index_is_completed_on_every_partition() {
    let app = spawn_app().await;
    let valid = || async {
        sqlx::query_scalar::<_, bool>("SELECT indisvalid FROM pg_index WHERE indexrelid = 'tasks_expiry_idx'::regclass")
            .fetch_one(&app.pool)
            .await
            .unwrap()
    };
    wait_until("the leader completing the index", Duration::from_secs(20), valid).await;
    assert!(valid().await, "the leader completes the index");
    let (partitions, attached): (i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM pg_inherits WHERE inhparent = 'tasks'::regclass),
                (SELECT count(*) FROM pg_inherits WHERE inhparent = 'tasks_expiry_idx'::regclass)",
    )
    .fetch_one(&app.pool)
    .await
    .unwrap();
    assert!(partitions > 0 && partitions == attached, "{attached} of {partitions} partitions have the index");
    assert_eq!(chime::leader::complete_indexes(&app.pool).await, 0, "nothing left to build");

    // Any partitioned index a migration makes ON ONLY is completed the same way, a
    // leftover of a failed concurrent build (invalid) dropped and built again. Made in one
    // transaction, as a migration would, so the leader's own pass never sees half of it.
    let partition: String =
        sqlx::query_scalar("SELECT inhrelid::regclass::text FROM pg_inherits WHERE inhparent = 'attempts'::regclass ORDER BY 1 LIMIT 1")
            .fetch_one(&app.pool)
            .await
            .unwrap();
    let child = format!("{partition}_attempts_note_idx");
    let mut tx = app.pool.begin().await.unwrap();
    sqlx::query("CREATE INDEX attempts_note_idx ON ONLY attempts (error)").execute(&mut *tx).await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE INDEX {child} ON {partition} (error)"))).execute(&mut *tx).await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!("UPDATE pg_index SET indisvalid = false WHERE indexrelid = '{child}'::regclass")))
        .execute(&mut *tx)
        .await
        .unwrap();
    let leftover: i64 =
        sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT '{child}'::regclass::oid::bigint"))).fetch_one(&mut *tx).await.unwrap();
    tx.commit().await.unwrap();
    // A call builds them, unless the leader's own pass holds the lock just then (and
    // looked before this index existed): call again until complete.
    let complete = || async {
        sqlx::query_as::<_, (bool, i64, i64, Option<i64>)>(
            "SELECT (SELECT indisvalid FROM pg_index WHERE indexrelid = 'attempts_note_idx'::regclass),
                    (SELECT count(*) FROM pg_inherits WHERE inhparent = 'attempts'::regclass),
                    (SELECT count(*) FROM pg_inherits i JOIN pg_index x ON x.indexrelid = i.inhrelid
                      WHERE i.inhparent = 'attempts_note_idx'::regclass AND x.indisvalid),
                    (SELECT oid::bigint FROM pg_class WHERE relname = $1)",
        )
        .bind(&child)
        .fetch_one(&app.pool)
        .await
        .unwrap()
    };
    let mut state = (false, 0, 0, None);
    for _ in 0..200 {
        chime::leader::complete_indexes(&app.pool).await;
        state = complete().await;
        if state.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (valid, partitions, attached, rebuilt) = state;
    assert!(valid && partitions == attached, "parent valid: {valid}; {attached} of {partitions} partition indexes attached and valid");
    assert!(rebuilt.is_some_and(|oid| oid != leftover), "the invalid leftover was dropped and built again");
}

/// A paused biz type's backlog of 20,000 tasks past their deadline is ended by the leader's
/// sweep in batches, each with its failure notice, walking the expiry index; prints how long.
#[tokio::test]
async fn the_sweep_ends_a_large_backlog_through_its_index() {
    let app = spawn_app().await;
    let receiver = Receiver::start(vec![], Answer::status(200)).await;
    biz_type(&app, "orders", &receiver, Settings { paused: Some(true), ..Default::default() }).await;
    sqlx::query("UPDATE biz_types SET failure_url = 'http://127.0.0.1:9/failed'").execute(&app.pool).await.unwrap();
    let plan: Vec<String> = sqlx::query_scalar(
        "EXPLAIN SELECT id FROM tasks WHERE status = 'pending' AND expires_at IS NOT NULL AND expires_at <= now()
          ORDER BY expires_at LIMIT 1000 FOR UPDATE SKIP LOCKED",
    )
    .fetch_all(&app.pool)
    .await
    .unwrap();
    assert!(plan.iter().any(|l| l.contains("expires_at_idx") || l.contains("expiry_idx")), "walks the expiry index: {plan:#?}");

    let started = std::time::Instant::now();
    sqlx::query(
        "INSERT INTO tasks (id, biz_type_id, run_at, payload, expires_at)
         SELECT gen_random_uuid(), (SELECT id FROM biz_types), now() - interval '1 minute', '{}', now() - interval '1 second'
           FROM generate_series(1, 20000)",
    )
    .execute(&app.pool)
    .await
    .unwrap();
    let inserted = started.elapsed();
    let left = wait_until("every task ended", Duration::from_secs(30), || async {
        let left: i64 = sqlx::query_scalar("SELECT count(*) FROM tasks WHERE status = 'pending'").fetch_one(&app.pool).await.unwrap();
        if left == 0 { Ok(left) } else { Err(format!("{left} pending")) }
    })
    .await;
    let swept = started.elapsed() - inserted;
    assert_eq!(left, 0, "all ended");
    println!("20,000 tasks past their deadline ended expired by the leader's sweep within {swept:?} of their insert (the sweep runs every second)");
    let (expired, notices): (i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM tasks WHERE status = 'expired'), (SELECT count(*) FROM failure_notices WHERE event = 'task.expired')",
    )
    .fetch_one(&app.pool)
    .await
    .unwrap();
    assert_eq!((expired, notices), (20_000, 20_000));
    assert!(receiver.received().is_empty());
}
