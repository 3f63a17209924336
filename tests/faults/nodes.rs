//! A node killed mid-burst.

use std::time::Duration;

use chime::biz_types::Settings;
use serde_json::json;

use crate::helpers::{chime_node, chime_process, fresh_database, stop_a_node_holding_leases};
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
    let (mut other, address) = chime_node(&db_url, &[]).await;

    let due = db_now(&pool).await + chrono::Duration::seconds(5);
    let tasks = (0..TASKS).map(|i| json!({"biz_type": "burst", "run_at": due, "payload": i})).collect();
    let ids = create_tasks(&address, &token, tasks).await;
    assert!(db_now(&pool).await < due, "the burst was created before it was due");

    receiver.wait_for(TASKS / 4, Duration::from_secs(60)).await;
    // The kill takes whichever node holds leases at that moment: a node delivering fast
    // holds none between two of its claims, and the biz type's max_in_flight, shared by the
    // cluster, may be all the other node's for a while (CI's runs found one node holding
    // nothing for 10 s).
    let (victim, _, in_flight) = stop_a_node_holding_leases(&pool, &[&doomed, &other]).await;
    let before_kill = receiver.received().len();
    if victim == 0 { doomed.kill().await } else { other.kill().await }.unwrap(); // SIGKILL
    assert!(before_kill < TASKS, "the kill came mid-burst: {before_kill} arrived, {in_flight} in flight");

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
