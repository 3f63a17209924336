//! A pg_auto_failover formation loses its primary under load: chime follows the promotion
//! by itself, loses no acknowledged task, and never uses the old primary once it is back
//! as a standby.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use chime::db::Pool;
use chrono::{DateTime, Utc};
use serde_json::json;

use crate::cluster::{Formation, advisory_locks, chime_sessions, in_recovery, query_one, url};
use crate::helpers::client;
use crate::helpers::wait_until;
use crate::receiver::{Answer, Receiver};
use crate::{Tally, create_task, heavy, load, orders, wait_readyz};

/// Waits until the formation's second node is promoted; returns when it left recovery
/// (`pg_is_in_recovery()` false) and when it took writes (pg_auto_failover keeps a promoted
/// node read-only until the old primary is known demoted or timed out).
async fn wait_promoted(formation: &Formation) -> (Instant, Instant) {
    let port = formation.nodes[1].port;
    let started = Instant::now();
    while in_recovery(port).await != Some(false) {
        assert!(started.elapsed() < Duration::from_secs(60), "node2 not promoted 60 s after the primary was killed: {:?}", formation.states().await);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let promoted = Instant::now();
    while query_one::<String>(port, "SHOW transaction_read_only").await.ok().as_deref() != Some("off") {
        assert!(started.elapsed() < Duration::from_secs(60), "node2 promoted but read-only for 60 s: {:?}", formation.states().await);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    (promoted, Instant::now())
}

/// Waits until a node leads on the server of `pool` (at most 30 s).
async fn wait_leader(pool: &Pool, server: &str) {
    wait_until(&format!("a leader on {server}"), Duration::from_secs(30), || async { chime::leader::current(pool).await.ok().flatten().is_some() })
        .await;
}

/// Two nodes on the formation's multi-host URL, a steady create load through both and an
/// every-second timer; the primary's PostgreSQL and its keeper are killed (kill -9) and the
/// monitor promotes the synchronous secondary. Every create acknowledged before, during
/// and after is delivered, no timer occurrence is doubled, the leader is back on the new
/// primary, the timer fires on time again and both nodes are ready again, unrestarted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_under_load_loses_no_acknowledged_task() {
    let _turn = heavy().await;
    let (start_instant, start_time) = (Instant::now(), Utc::now());
    let at = |i: Instant| start_time + chrono::Duration::from_std(i - start_instant).unwrap();
    let mut formation = Formation::start().await;
    let old = chime::db::connect(&url(formation.nodes[0].port, "chime"), 2).await.unwrap();
    let receiver = Receiver::start(vec![], Answer::status(200)).await;
    let token = orders(&old, &receiver.url).await;
    let mut nodes = vec![formation.chime_node().await, formation.chime_node().await];
    let addresses: Vec<String> = nodes.iter().map(|(_, a)| a.clone()).collect();
    let timer = client()
        .post(format!("{}/api/v1/timers", addresses[0]))
        .bearer_auth(&token)
        .json(&json!({"biz_type": "orders", "key": "tick", "cron": "* * * * * *"}))
        .send()
        .await
        .unwrap();
    assert_eq!(timer.status(), 201);
    wait_leader(&old, "node1").await;

    let stop = Arc::new(AtomicBool::new(false));
    let running = tokio::spawn(load(addresses.clone(), token.clone(), stop.clone()));
    // The load and the timer's callbacks flow before the kill.
    wait_until("timer callbacks before the kill", Duration::from_secs(15), || async {
        receiver.received().iter().filter(|r| !r.json()["timer_id"].is_null()).count() >= 2
    })
    .await;
    // A sleep on purpose: three more seconds of load, so that the kill cuts writes in flight
    // (a span of traffic, not a wait for an event).
    tokio::time::sleep(Duration::from_secs(3)).await;

    formation.kill(0);
    let killed = Instant::now();
    let (promoted, writable) = wait_promoted(&formation).await;
    println!("node2 out of recovery {:?} after the kill, taking writes {:?} after", promoted - killed, writable - killed);
    let new = chime::db::connect(&url(formation.nodes[1].port, "chime"), 2).await.unwrap();
    for address in &addresses {
        wait_readyz(address, 200, Duration::from_secs(60)).await;
        println!("{address}: ready {:?} after the promotion", promoted.elapsed());
    }
    wait_leader(&new, "node2 (the new primary)").await;
    println!("a leader on node2 {:?} after the promotion", promoted.elapsed());
    // The every-second timer fires on time again (within 500 ms of its fire time).
    let on_time = |r: &crate::receiver::Received| {
        let body = r.json();
        let run_at: DateTime<Utc> = body["run_at"].as_str().unwrap().parse().unwrap();
        !body["timer_id"].is_null() && r.at > promoted && at(r.at) - run_at < chrono::Duration::milliseconds(500)
    };
    wait_until("an on-time timer callback after the promotion", Duration::from_secs(30), || async { receiver.received().iter().any(on_time) }).await;
    let first_on_time = receiver.received().iter().filter(|r| on_time(r)).map(|r| r.at).min().unwrap();
    // More load on the new primary, then every acknowledged task must arrive. A sleep on
    // purpose: the load's duration, not a wait for an event.
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.store(true, Ordering::Relaxed);
    let load = running.await.unwrap();
    let ids = load.ids();
    let started = Instant::now();
    let mut done = 0i64;
    while started.elapsed() < Duration::from_secs(60) {
        done = sqlx::query_scalar("SELECT count(*) FROM tasks WHERE id = ANY($1::uuid[]) AND status = 'succeeded'")
            .bind(&ids)
            .fetch_one(&new)
            .await
            .unwrap();
        if done == ids.len() as i64 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    wait_until("every acknowledged task at the receiver", Duration::from_secs(10), || async { Tally::of(&receiver.received()).lost(&ids) == 0 })
        .await;

    let received = receiver.received();
    let tally = Tally::of(&received);
    // Timer occurrences: each fire time delivered as one task, however often it arrived.
    let mut per_fire_time: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for r in received.iter().filter(|r| !r.json()["timer_id"].is_null()) {
        let body = r.json();
        per_fire_time.entry(body["run_at"].as_str().unwrap().to_string()).or_default().insert(body["task_id"].as_str().unwrap().to_string());
    }
    let doubled: Vec<&String> = per_fire_time.iter().filter(|(_, tasks)| tasks.len() > 1).map(|(at, _)| at).collect();
    let succeeded: Vec<String> = sqlx::query_scalar("SELECT id::text FROM tasks WHERE status = 'succeeded'").fetch_all(&new).await.unwrap();
    println!(
        "failover under load: acknowledged {} | lost {} | delivered twice {} | write outage {:.2} s | promotion to first on-time callback {:.2} s | refused {:?} | timer occurrences {}",
        ids.len(),
        tally.lost(&ids),
        tally.duplicated(),
        load.longest_gap().as_secs_f64(),
        (first_on_time - promoted).as_secs_f64(),
        load.refused,
        per_fire_time.len(),
    );
    assert_eq!(done, ids.len() as i64, "acknowledged tasks not delivered");
    assert_eq!(tally.lost(&ids), 0, "acknowledged tasks lost");
    assert_eq!(tally.lost(&succeeded), 0, "a task marked delivered that never arrived");
    assert!(doubled.is_empty(), "timer occurrences delivered as two tasks: {doubled:?}");
    assert!(load.refused.keys().all(|status| status.starts_with("503")), "only 503s while no host took writes: {:?}", load.refused);
    for (child, address) in &mut nodes {
        assert!(child.try_wait().unwrap().is_none(), "{address} exited");
    }
    assert_eq!(advisory_locks(formation.nodes[1].port).await, 1, "the leader lock on the new primary");
}

/// After a failover, the old primary comes back (its keeper runs again) and pg_auto_failover
/// makes it a standby of the new one (pg_rewind): the nodes, which had sessions on it
/// before it died, neither lead nor write there, nor does a node started after it is back
/// (it is first in DATABASE_URL), and creates go on being delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_old_primary_back_as_a_standby_gets_no_leader_and_no_writes() {
    let _turn = heavy().await;
    let mut formation = Formation::start().await;
    let old = chime::db::connect(&url(formation.nodes[0].port, "chime"), 2).await.unwrap();
    let receiver = Receiver::start(vec![], Answer::status(200)).await;
    let token = orders(&old, &receiver.url).await;
    let mut nodes = vec![formation.chime_node().await, formation.chime_node().await];
    let addresses: Vec<String> = nodes.iter().map(|(_, a)| a.clone()).collect();
    for address in &addresses {
        create_task(address, &token).await;
    }
    wait_leader(&old, "node1").await;
    old.close().await;

    formation.kill(0);
    wait_promoted(&formation).await;
    let new = chime::db::connect(&url(formation.nodes[1].port, "chime"), 2).await.unwrap();
    for address in &addresses {
        wait_readyz(address, 200, Duration::from_secs(60)).await;
    }
    wait_leader(&new, "node2 (the new primary)").await;

    formation.restart(0);
    formation.wait_state(&[("node1", "secondary"), ("node2", "primary")], Duration::from_secs(60)).await;
    let old_port = formation.nodes[0].port;
    assert_eq!(in_recovery(old_port).await, Some(true), "the old primary is not in recovery");

    // A node that starts now goes through DATABASE_URL's hosts from the first, the old
    // primary: it must pass it by.
    nodes.push(formation.chime_node().await);
    let addresses: Vec<String> = nodes.iter().map(|(_, a)| a.clone()).collect();
    // Load through the three nodes while the old primary is back, first in DATABASE_URL.
    let stop = Arc::new(AtomicBool::new(false));
    let running = tokio::spawn(load(addresses.clone(), token.clone(), stop.clone()));
    // A sleep on purpose: the load's duration (no create may be refused during it).
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.store(true, Ordering::Relaxed);
    let load = running.await.unwrap();
    let ids = load.ids();
    assert!(!ids.is_empty() && load.refused.is_empty(), "creates refused after the rejoin: {:?}", load.refused);
    wait_until("every create after the rejoin delivered", Duration::from_secs(30), || async { Tally::of(&receiver.received()).lost(&ids) == 0 })
        .await;
    assert_eq!(advisory_locks(old_port).await, 0, "an advisory lock on the old primary, now a standby");
    assert_eq!(chime_sessions(old_port).await, 0, "chime holds sessions on the old primary, now a standby");
    assert_eq!(advisory_locks(formation.nodes[1].port).await, 1, "the leader lock on the new primary");
    for (child, address) in &mut nodes {
        assert!(child.try_wait().unwrap().is_none(), "{address} exited");
    }
    println!("old primary back as a standby: {} creates acknowledged and delivered, none refused", ids.len());
}
