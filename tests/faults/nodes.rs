//! A node killed mid-burst.

use std::time::Duration;

use chime::biz_types::Settings;
use serde_json::json;

use crate::helpers::{chime_node, chime_process, fresh_database, node_of};
use crate::receiver::{Answer, Receiver};
use crate::{Tally, biz_type, create_tasks, db_now, heavy, wait_all_finished};

/// `kill -9` of one of two nodes (one holding leases) a quarter of the way through a burst
/// of 20,000 due tasks: the other node delivers the dead one's tasks once their leases end. Every task
/// is delivered; the ones delivered twice are at most those the dead node had in flight.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_killed_mid_burst_loses_nothing() {
    const TASKS: usize = 20_000;
    let _turn = heavy().await;
    let db_url = fresh_database().await;
    let pool = chime::db::connect(&db_url, 4).await.unwrap();
    let receiver = Receiver::start(vec![], Answer::status(200)).await;
    let settings = Settings { timeout_ms: Some(2000), max_in_flight: Some(1000), ..Default::default() };
    let token = biz_type(&pool, "burst", &receiver.url, settings).await;
    let mut doomed = chime_process(&db_url, &[]).await;
    let doomed_id = node_of(&pool, &doomed).await;
    let (mut other, address) = chime_node(&db_url, &[]).await;
    let other_id = node_of(&pool, &other).await;

    let due = db_now(&pool).await + chrono::Duration::seconds(5);
    let tasks = (0..TASKS).map(|i| json!({"biz_type": "burst", "run_at": due, "payload": i})).collect();
    let ids = create_tasks(&address, &token, tasks).await;
    assert!(db_now(&pool).await < due, "the burst was created before it was due");

    receiver.wait_for(TASKS / 4, Duration::from_secs(60)).await;
    // The kill takes whichever node holds leases at that moment: a node delivering fast
    // holds none between two of its claims, and the biz type's max_in_flight, shared by the
    // cluster, may be all the other node's for a while (CI's runs found one node holding
    // nothing for 10 s).
    let holding = "SELECT count(*) FROM tasks WHERE status = 'running' AND leased_by = $1";
    let pool_ref = &pool;
    let holds = |node| async move { sqlx::query_scalar::<_, i64>(holding).bind(node).fetch_one(pool_ref).await.unwrap() > 0 };
    let waiting = std::time::Instant::now();
    let victim = loop {
        if holds(doomed_id).await || waiting.elapsed() >= Duration::from_secs(10) {
            break doomed_id;
        }
        if holds(other_id).await {
            break other_id;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    };
    let before_kill = receiver.received().len();
    if victim == doomed_id { doomed.kill().await } else { other.kill().await }.unwrap(); // SIGKILL
    // What the dead node held: claimed, and not recorded. Nothing touches these rows until
    // their lease ends (2 s timeout + margin), so this counts them as they were at the kill.
    let in_flight: i64 = sqlx::query_scalar(holding).bind(victim).fetch_one(&pool).await.unwrap();
    assert!(before_kill < TASKS && in_flight > 0, "the kill came mid-burst: {before_kill} arrived, {in_flight} in flight");

    let statuses = wait_all_finished(&pool, Duration::from_secs(120)).await;
    assert_eq!(statuses.get("succeeded"), Some(&(TASKS as i64)), "{statuses:?}");
    let tally = Tally::of(&receiver.received());
    println!(
        "kill -9 of one of two nodes mid-burst: {} tasks, delivered {}, duplicated {}, lost {} \
         (the dead node had {in_flight} in flight)",
        TASKS,
        tally.delivered(),
        tally.duplicated(),
        tally.lost(&ids)
    );
    assert_eq!(tally.lost(&ids), 0);
    assert_eq!(tally.delivered(), TASKS);
    assert!(tally.duplicated() as i64 <= in_flight, "duplicates beyond what the dead node held");
}
