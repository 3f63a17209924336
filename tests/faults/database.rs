//! PostgreSQL crashing under load.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use chime::biz_types::Settings;
use serde_json::{Value, json};

use crate::helpers::{chime_node, client, wait_until};
use crate::receiver::{Answer, Receiver};
use crate::{Tally, biz_type, heavy, statuses};

/// What the load got back from its creates.
#[derive(Default)]
struct Load {
    /// Ids of the tasks whose creation was acknowledged (201).
    accepted: Vec<String>,
    /// Every other answer: its status, or "no answer".
    refused: std::collections::BTreeMap<String, usize>,
}

/// Creates a task every 5 ms through the nodes in turn, due within 2 s, until `stop`.
async fn load(addresses: Vec<String>, token: String, stop: Arc<AtomicBool>) -> Load {
    let client = client();
    let mut load = Load::default();
    let mut i = 0usize;
    while !stop.load(Ordering::Relaxed) {
        let address = &addresses[i % addresses.len()];
        let response = client
            .post(format!("{address}/api/v1/tasks"))
            .bearer_auth(&token)
            .timeout(Duration::from_secs(15))
            .json(&json!({"biz_type": "orders", "delay_ms": (i % 20) * 100, "payload": i}))
            .send()
            .await;
        match response {
            Ok(r) if r.status() == 201 => {
                let task: Value = r.json().await.unwrap();
                load.accepted.push(task["id"].as_str().unwrap().to_string());
            }
            Ok(r) => *load.refused.entry(r.status().to_string()).or_default() += 1,
            Err(_) => *load.refused.entry("no answer".into()).or_default() += 1,
        }
        i += 1;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    load
}

/// Polls `/readyz` until it answers `want` (at most `within`); returns how long it took.
async fn wait_readyz(address: &str, want: u16, within: Duration) -> Duration {
    let client = client();
    let started = Instant::now();
    wait_until(&format!("{address}/readyz answering {want}"), within, || async {
        let status = client.get(format!("{address}/readyz")).timeout(Duration::from_secs(2)).send().await.map(|r| r.status().as_u16());
        if status.as_ref().is_ok_and(|s| *s == want) { Ok(()) } else { Err(format!("{status:?}")) }
    })
    .await;
    started.elapsed()
}

/// PostgreSQL crashes (`pg_ctl stop -m immediate`) under load and is back 5 s later: both
/// nodes say they are not ready while it is gone, stay up, reconnect by themselves, and
/// every task whose creation was acknowledged is delivered; none is marked delivered that
/// did not arrive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_crash_under_load_loses_nothing() {
    let _turn = heavy().await;
    // A cluster of its own, as durable as production's (fsync and synchronous commit on):
    // it is the one crashed.
    let mut pg = chime::db::embedded_pg::start_temporary("").await.unwrap();
    let db_url = pg.url("chime");
    let pool = chime::db::connect(&db_url, 4).await.unwrap();
    chime::db::migrate(&pool).await.unwrap();
    let receiver = Receiver::start(vec![], Answer::status(200)).await;
    let settings = Settings { timeout_ms: Some(2000), backoff_initial_ms: Some(200), ..Default::default() };
    let token = biz_type(&pool, "orders", &receiver.url, settings).await;
    let mut nodes = vec![chime_node(&db_url, &[]).await, chime_node(&db_url, &[]).await];
    let addresses: Vec<String> = nodes.iter().map(|(_, a)| a.clone()).collect();

    let stop = Arc::new(AtomicBool::new(false));
    let load = tokio::spawn(load(addresses.clone(), token, stop.clone()));
    // A sleep on purpose: three seconds of load before the crash, so that it cuts work in flight.
    tokio::time::sleep(Duration::from_secs(3)).await;

    pg.crash().await.unwrap();
    let crashed = Instant::now();
    for address in &addresses {
        wait_readyz(address, 503, Duration::from_secs(10)).await;
        println!("{address}: not ready {:?} after the crash", crashed.elapsed());
    }
    // A sleep on purpose: what is proved is that nothing happens (no node exits) while the
    // database stays down for 5 s.
    tokio::time::sleep(Duration::from_secs(5).saturating_sub(crashed.elapsed())).await;
    for (child, address) in &mut nodes {
        assert!(child.try_wait().unwrap().is_none(), "{address} exited while the database was down");
    }

    pg.restart().await.unwrap();
    let restarted = Instant::now();
    for address in &addresses {
        wait_readyz(address, 200, Duration::from_secs(30)).await;
        println!("{address}: ready again {:?} after the restart", restarted.elapsed());
    }
    // A node leads again: the leader's lock lived on a connection the crash cut.
    let within = Duration::from_secs(30).saturating_sub(restarted.elapsed());
    wait_until("a node leading again (30 s after the restart at most)", within, || async {
        chime::leader::current(&pool).await.ok().flatten().is_some()
    })
    .await;
    println!("a leader again {:?} after the restart", restarted.elapsed());
    // A sleep on purpose: three more seconds of load after the recovery (a span, not an event).
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.store(true, Ordering::Relaxed);
    let load = load.await.unwrap();

    // Every acknowledged task ends delivered: wait for all of them.
    let started = Instant::now();
    let mut done = 0i64;
    while started.elapsed() < Duration::from_secs(60) {
        done = sqlx::query_scalar("SELECT count(*) FROM tasks WHERE id = ANY($1::uuid[]) AND status = 'succeeded'")
            .bind(&load.accepted)
            .fetch_one(&pool)
            .await
            .unwrap();
        if done == load.accepted.len() as i64 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let tally = Tally::of(&receiver.received());
    let succeeded: Vec<String> = sqlx::query_scalar("SELECT id::text FROM tasks WHERE status = 'succeeded'").fetch_all(&pool).await.unwrap();
    println!(
        "database crash under load: {} creates acknowledged, refused {:?}; delivered {}, duplicated {}, lost {}; statuses {:?}",
        load.accepted.len(),
        load.refused,
        tally.delivered(),
        tally.duplicated(),
        tally.lost(&load.accepted),
        statuses(&pool).await
    );
    assert_eq!(done, load.accepted.len() as i64, "acknowledged tasks not delivered");
    assert_eq!(tally.lost(&load.accepted), 0);
    assert_eq!(tally.lost(&succeeded), 0, "a task marked delivered that never arrived");
    assert!(load.refused.keys().all(|status| status.starts_with("503")), "only 503s while the database was gone: {:?}", load.refused);
    pg.stop().await;
}
