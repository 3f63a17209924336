//! Behind a TCP proxy that follows the primary (HAProxy, as Patroni deployments use), one
//! host in DATABASE_URL: the proxy cuts the sessions when the primary dies and sends new ones
//! to the standby, which is not yet promoted. chime must not write or lead there, and must
//! resume by itself once it is promoted.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::cluster::{Proxy, Server, advisory_locks, url};
use crate::helpers::chime_node;
use crate::helpers::wait_until;
use crate::receiver::{Answer, Receiver};
use crate::{Tally, heavy, load, orders, wait_readyz};

/// Two nodes through HAProxy under a create load; the primary is killed, and promoted by
/// hand 3 s later. Meanwhile the proxy leads to the standby: every create answers 503 (none
/// 500), nothing leads there. After the promotion the nodes resume unrestarted, a node
/// leads on the new primary, and every acknowledged create is delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_a_proxy_the_standby_is_not_used_until_promoted() {
    let _turn = heavy().await;
    let mut primary = Server::primary().await;
    let standby = Server::standby_of(&primary).await;
    primary.make_synchronous(&standby).await;
    let proxy = Proxy::start(&primary, &standby).await;
    let db_url = url(proxy.port, "chime");
    let pool = chime::db::connect(&url(primary.port, "chime"), 2).await.unwrap();
    let receiver = Receiver::start(vec![], Answer::status(200)).await;
    let token = orders(&pool, &receiver.url).await;
    pool.close().await;
    let nodes = [chime_node(&db_url, &[]).await, chime_node(&db_url, &[]).await];
    let addresses: Vec<String> = nodes.iter().map(|(_, a)| a.clone()).collect();

    let stop = Arc::new(AtomicBool::new(false));
    let running = tokio::spawn(load(addresses.clone(), token.clone(), stop.clone()));
    // A sleep on purpose: three seconds of load before the kill, so that it cuts writes in flight.
    tokio::time::sleep(Duration::from_secs(3)).await;
    primary.kill();
    let killed = Instant::now();
    for address in &addresses {
        wait_readyz(address, 503, Duration::from_secs(10)).await;
    }
    // The proxy now leads to the standby for 3 s: chime checks each session and takes no
    // lock there (the leader retries its election every second meanwhile).
    let window = Instant::now();
    while window.elapsed() < Duration::from_secs(3) {
        assert_eq!(advisory_locks(standby.port).await, 0, "a node took a lock on the standby behind the proxy");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    standby.promote();
    let promoted = Instant::now();
    for address in &addresses {
        wait_readyz(address, 200, Duration::from_secs(30)).await;
    }
    let resumed = promoted.elapsed();
    let new = chime::db::connect(&url(standby.port, "chime"), 2).await.unwrap();
    wait_until("a leader on the promoted standby", Duration::from_secs(30), || async { chime::leader::current(&new).await.ok().flatten().is_some() })
        .await;
    // A sleep on purpose: two seconds of load on the promoted standby (a span, not an event).
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, Ordering::Relaxed);
    let load = running.await.unwrap();
    let ids = load.ids();
    wait_until("every acknowledged task at the receiver", Duration::from_secs(60), || async { Tally::of(&receiver.received()).lost(&ids) == 0 })
        .await;
    let tally = Tally::of(&receiver.received());
    println!(
        "behind HAProxy: acknowledged {} | lost {} | delivered twice {} | write outage {:.2} s (primary killed, promoted 3 s later by hand) | ready {:.2} s after the promotion | refused {:?} | {:?} from kill to promotion",
        ids.len(),
        tally.lost(&ids),
        tally.duplicated(),
        load.longest_gap().as_secs_f64(),
        resumed.as_secs_f64(),
        load.refused,
        promoted - killed,
    );
    assert!(!load.refused.contains_key("500"), "creates answered 500: {:?}", load.refused);
    assert_eq!(tally.lost(&ids), 0);
    for (mut child, _) in nodes {
        assert!(child.try_wait().unwrap().is_none(), "a node exited");
        child.kill().await.unwrap();
    }
}
