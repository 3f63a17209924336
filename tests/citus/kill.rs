//! A `kill -9` of a chime node under load on a Citus cluster: two `chime serve` processes on
//! the coordinator, three biz types' tasks due at once, one node killed mid-delivery.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use chime::biz_types::Settings;
use serde_json::json;

use crate::cluster::migrated_database;
use crate::helpers::{self, chime_node, wait_until};
use crate::receiver::{Answer, Receiver};

/// Tasks per biz type, and the biz types.
const EACH: usize = 1_000;
const BIZ_TYPES: [&str; 3] = ["orders", "refunds", "invoices"];
/// How long, from the kill, every task may take to be finished: the dead node's leases
/// run out (the callback timeout, 2 s, and a margin), the leader (the other node, if the
/// dead one led) puts them back, and the other node delivers the rest.
const BOUND: Duration = Duration::from_secs(45);

/// Every task is delivered at least once and recorded delivered exactly once; none is lost,
/// none is marked delivered that the receiver did not answer; the tasks delivered twice are
/// at most those the dead node held; all within `BOUND` of the kill.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_killed_under_load_loses_nothing_on_citus() {
    let url = migrated_database().await;
    let pool = chime::db::connect(&url, 4).await.unwrap();
    // A short wait in each answer, so that a node holds callbacks in flight when killed.
    let receiver = Receiver::start(vec![], Answer { delay: Duration::from_millis(20), ..Answer::status(200) }).await;
    let settings = Settings { callback_url: Some(receiver.url.clone()), timeout_ms: Some(2000), max_in_flight: Some(200), ..Default::default() };
    let mut tokens = Vec::new();
    for name in BIZ_TYPES {
        tokens.push(helpers::biz_type_with(&pool, name, &settings).await);
    }
    let (mut first, address) = chime_node(&url, &[]).await;
    let (mut second, _) = chime_node(&url, &[]).await;

    let due = sqlx::query_scalar::<_, chrono::DateTime<chrono::Utc>>("SELECT now() + interval '4 seconds'").fetch_one(&pool).await.unwrap();
    let mut ids = Vec::new();
    for (name, token) in BIZ_TYPES.iter().zip(&tokens) {
        let tasks = (0..EACH).map(|i| json!({"biz_type": name, "run_at": due, "payload": i})).collect();
        ids.extend(helpers::create_tasks(&address, token, tasks).await);
    }
    let total = ids.len();

    receiver.wait_for(total / 4, Duration::from_secs(60)).await;
    // Kill whichever node holds leases now (a node between two claims holds none).
    let (victim, victim_id, in_flight) = helpers::stop_a_node_holding_leases(&pool, &[&first, &second]).await;
    let arrived_at_kill = receiver.received().len();
    if victim == 0 { first.kill().await } else { second.kill().await }.unwrap(); // SIGKILL
    let killed = Instant::now();
    assert!(arrived_at_kill < total, "the kill came mid-delivery: {arrived_at_kill} arrived, {in_flight} in flight");

    let statuses = wait_until("every task finished", BOUND, || async {
        let statuses: HashMap<String, i64> = sqlx::query_as::<_, (String, i64)>("SELECT status, count(*) FROM tasks GROUP BY status")
            .fetch_all(&pool)
            .await
            .unwrap()
            .into_iter()
            .collect();
        if !statuses.contains_key("pending") && !statuses.contains_key("running") { Ok(statuses) } else { Err(format!("{statuses:?}")) }
    })
    .await;
    let took = killed.elapsed();

    let received = receiver.received();
    let mut per_task: HashMap<String, usize> = HashMap::new();
    for r in &received {
        *per_task.entry(r.header("chime-task-id").unwrap().to_string()).or_insert(0) += 1;
    }
    let duplicated: usize = per_task.values().map(|n| n - 1).sum();
    let lost = ids.iter().filter(|id| !per_task.contains_key(*id)).count();
    println!(
        "kill -9 of one of two nodes on Citus: {total} tasks of {} biz types, {arrived_at_kill} arrived at the kill, {in_flight} in flight; \
         all finished {:.1} s after it; delivered {}, duplicated {duplicated}, lost {lost}",
        BIZ_TYPES.len(),
        took.as_secs_f64(),
        per_task.len()
    );
    assert_eq!(statuses.get("succeeded"), Some(&(total as i64)), "{statuses:?}");
    assert_eq!(lost, 0);
    assert_eq!(per_task.len(), total);
    assert!(duplicated as i64 <= in_flight, "duplicates beyond what the dead node held: {duplicated} > {in_flight}");

    // Recorded once: one delivered attempt per task, and every task the database calls
    // delivered is one the receiver answered.
    let recorded: Vec<(String, i64)> =
        sqlx::query_as("SELECT task_id::text, count(*) FROM attempts WHERE status_code = 200 GROUP BY task_id").fetch_all(&pool).await.unwrap();
    assert_eq!(recorded.len(), total);
    assert!(recorded.iter().all(|(_, n)| *n == 1), "a task recorded delivered twice");
    let succeeded: HashSet<String> =
        sqlx::query_scalar("SELECT id::text FROM tasks WHERE status = 'succeeded'").fetch_all(&pool).await.unwrap().into_iter().collect();
    assert!(succeeded.iter().all(|id| per_task.contains_key(id)), "a task marked delivered that the receiver never got");
    // The dead node's lost attempts were recorded by lease recovery, on the workers.
    let lost_attempts: i64 = sqlx::query_scalar("SELECT count(*) FROM attempts WHERE node_id = $1 AND error LIKE 'lease expired%'")
        .bind(victim_id)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(lost_attempts, in_flight, "one lost attempt per task the dead node held");
}
