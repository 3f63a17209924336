//! Several nodes on one database: registration, sharing work, and a node killed with
//! callbacks in flight.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use chime::biz_types::{self, Settings};
use chime::callback_hosts::CallbackHosts;
use chime::config::ServeArgs;
use serde_json::{Value, json};

use crate::helpers::{
    TestEngine, chime_process, engine, node_of, spawn_app, spawn_app_without_leader, spawn_node, spawn_on, spawn_second_node, wait_until,
};
use crate::receiver::{Answer, Receiver};

/// A running node registers itself with a heartbeat.
#[tokio::test]
async fn nodes_register_themselves() {
    let app = spawn_node().await;
    let _second = spawn_second_node(&app).await;
    let count = wait_until("two nodes with a heartbeat", Duration::from_secs(5), || async {
        let count = sqlx::query_scalar::<_, i64>("SELECT count(*) FROM nodes WHERE heartbeat_at > now() - interval '1 minute'")
            .fetch_one(&app.pool)
            .await
            .unwrap();
        if count == 2 { Ok(count) } else { Err(format!("{count} nodes")) }
    })
    .await;
    assert_eq!(count, 2);
}

/// Two nodes deliver one backlog between them, and no task twice.
#[tokio::test]
async fn two_nodes_share_work_without_duplicates() {
    let a = spawn_app().await;
    let b = spawn_on(a.db_url.clone(), ServeArgs { engine: false, ..ServeArgs::default() }).await;
    let receiver = Receiver::start(vec![], Answer { delay: Duration::from_millis(300), ..Answer::status(200) }).await;
    // A cap above the backlog: max_in_flight is the cluster's, and a cap the first claim
    // filled would leave the other node nothing to take until a slot freed (the node whose
    // callbacks end is the first to know, and takes it).
    let settings = Settings { callback_url: Some(receiver.url.clone()), max_in_flight: Some(1000), ..Default::default() };
    biz_types::create(&a.pool, "orders", &settings, CallbackHosts::Any).await.unwrap();
    let token = biz_types::create_token(&a.pool, "orders").await.unwrap();
    // Each node's engine, its own loop running, both knowing the biz type (their first turn
    // read it) before the backlog falls due, so both compete.
    let mut engines = [engine(&a), engine(&b)];
    for engine in &mut engines {
        assert_eq!(engine.turn().await.claimed, 0);
    }
    let engines: Vec<_> = engines.into_iter().map(TestEngine::spawn).collect();
    let due = (chrono::Utc::now() + chrono::Duration::seconds(1)).to_rfc3339();
    let items: Vec<Value> = (0..500).map(|i| json!({"biz_type": "orders", "run_at": due, "payload": i})).collect();
    assert_eq!(b.post("/api/v1/tasks/batch", &token, json!({"tasks": items})).await.status, 200);

    let received = receiver.wait_for(500, Duration::from_secs(30)).await;
    // Stopped, each engine first finishes and records its callbacks in flight: no request
    // arrives after this.
    for engine in engines {
        engine.stop().await;
    }
    let received = receiver.received().len().max(received.len());
    assert_eq!(received, 500, "each task delivered exactly once");
    let ids: HashSet<String> = receiver.received().iter().map(|r| r.header("chime-task-id").unwrap().to_string()).collect();
    assert_eq!(ids.len(), 500);
    let per_node: Vec<(uuid::Uuid, i64)> =
        sqlx::query_as("SELECT node_id, count(*) FROM attempts GROUP BY node_id").fetch_all(&a.pool).await.unwrap();
    assert_eq!(per_node.len(), 2, "both nodes delivered: {per_node:?}");
}

/// Two nodes working through one backlog claim apart (docs/design/claim.md, Lanes): once a
/// node's claim comes back full, its next ones take its own lanes (with two nodes, the
/// tasks whose `chime_lane` is even, or odd), so that neither reads and locks the rows the
/// other has just claimed. Nearly all of each node's deliveries come from its own lanes;
/// claiming at one shared head, each would take about half from each.
#[tokio::test]
async fn two_nodes_working_one_backlog_claim_their_own_lanes() {
    const TASKS: usize = 8000;
    let app = spawn_app().await; // the API only
    let receiver = Receiver::start(vec![], Answer::status(200)).await;
    // A cap far above what two nodes hold (2 x 2,000), so that the cap's gate never cuts a
    // claim short: a capped claim, like a short one, sends the next back to the whole biz type.
    let settings = Settings { callback_url: Some(receiver.url.clone()), max_in_flight: Some(10 * TASKS as i32), ..Default::default() };
    biz_types::create(&app.pool, "orders", &settings, CallbackHosts::Any).await.unwrap();
    let token = biz_types::create_token(&app.pool, "orders").await.unwrap();
    let nodes = [chime_process(&app.db_url, &[]).await, chime_process(&app.db_url, &[]).await];
    let mut ids = [node_of(&app.pool, &nodes[0]).await, node_of(&app.pool, &nodes[1]).await];
    ids.sort();

    // Due after each node has counted the other (the settings, the node count with them,
    // are re-read every 2 s).
    let due = (chrono::Utc::now() + chrono::Duration::seconds(5)).to_rfc3339();
    for part in 0..TASKS / 1000 {
        let items: Vec<Value> = (0..1000).map(|i| json!({"biz_type": "orders", "run_at": due, "payload": part * 1000 + i})).collect();
        assert_eq!(app.post("/api/v1/tasks/batch", &token, json!({"tasks": items})).await.status, 200);
    }
    let received = receiver.wait_for(TASKS, Duration::from_secs(60)).await;
    assert_eq!(received.len(), TASKS);
    wait_until("every attempt recorded", Duration::from_secs(30), || async {
        let recorded: i64 = sqlx::query_scalar("SELECT count(*) FROM attempts").fetch_one(&app.pool).await.unwrap();
        if recorded == TASKS as i64 { Ok(()) } else { Err(format!("{recorded} recorded")) }
    })
    .await;

    for (place, id) in ids.iter().enumerate() {
        let (all, own): (i64, i64) =
            sqlx::query_as("SELECT count(*), count(*) FILTER (WHERE chime_lane(task_id) % 2 = $2) FROM attempts WHERE node_id = $1")
                .bind(id)
                .bind(place as i32)
                .fetch_one(&app.pool)
                .await
                .unwrap();
        println!("node {place}: {all} deliveries, {own} from its own lanes");
        assert!(all >= 400, "both nodes worked the backlog: node {place} delivered {all}");
        assert!(own * 10 >= all * 7, "node {place} took {own} of its {all} tasks from its own lanes");
    }
}

/// `kill -9` of a node process with callbacks in flight: another node process delivers them
/// after their lease expires. Nothing is lost; the lost attempts are in the history.
#[tokio::test]
async fn a_killed_node_s_tasks_are_delivered_by_another() {
    let app = spawn_app().await; // the API only: no engine of its own
    let receiver = Receiver::start(vec![], Answer { delay: Duration::from_secs(2), ..Answer::status(200) }).await;
    let settings = Settings { callback_url: Some(receiver.url.clone()), timeout_ms: Some(3000), ..Default::default() };
    biz_types::create(&app.pool, "orders", &settings, CallbackHosts::Any).await.unwrap();
    let token = biz_types::create_token(&app.pool, "orders").await.unwrap();

    // The node to be killed is a real process, the only engine while it lives.
    let mut doomed = chime_process(&app.db_url, &[]).await;
    let items: Vec<Value> = (0..20).map(|i| json!({"biz_type": "orders", "payload": i})).collect();
    app.post("/api/v1/tasks/batch", &token, json!({"tasks": items})).await;
    let in_flight = receiver.wait_for(20, Duration::from_secs(10)).await;
    assert_eq!(in_flight.len(), 20, "the doomed node has every callback in flight");
    doomed.kill().await.unwrap(); // SIGKILL

    let _survivor = chime_process(&app.db_url, &[]).await;
    // Every task ends succeeded, delivered by the survivor once the leases expired.
    let statuses = wait_until("every task succeeded", Duration::from_secs(30), || async {
        let statuses: HashMap<String, i64> =
            sqlx::query_as("SELECT status, count(*) FROM tasks GROUP BY status").fetch_all(&app.pool).await.unwrap().into_iter().collect();
        if statuses.get("succeeded") == Some(&20) { Ok(statuses) } else { Err(format!("{statuses:?}")) }
    })
    .await;
    assert_eq!(statuses.get("succeeded"), Some(&20), "{statuses:?}");
    let received = receiver.received();
    assert_eq!(received.len(), 40, "each task twice: cut off by the kill, then delivered");
    let ids: HashSet<String> = received.iter().map(|r| r.header("chime-task-id").unwrap().to_string()).collect();
    assert_eq!(ids.len(), 20);
    let lost: i64 = sqlx::query_scalar("SELECT count(*) FROM attempts WHERE error LIKE 'lease expired%'").fetch_one(&app.pool).await.unwrap();
    assert_eq!(lost, 20, "the attempts cut off by the kill are recorded");
}

/// SIGTERM: the node stops claiming, lets the callbacks in flight finish and records them,
/// deregisters, and exits cleanly. Nothing is delivered twice.
#[tokio::test]
async fn sigterm_finishes_callbacks_in_flight() {
    let app = spawn_app().await;
    let receiver = Receiver::start(vec![], Answer { delay: Duration::from_millis(1500), ..Answer::status(200) }).await;
    let settings = Settings { callback_url: Some(receiver.url.clone()), ..Default::default() };
    biz_types::create(&app.pool, "orders", &settings, CallbackHosts::Any).await.unwrap();
    let token = biz_types::create_token(&app.pool, "orders").await.unwrap();
    let mut node = chime_process(&app.db_url, &[]).await;
    let items: Vec<Value> = (0..10).map(|i| json!({"biz_type": "orders", "payload": i})).collect();
    app.post("/api/v1/tasks/batch", &token, json!({"tasks": items})).await;
    assert_eq!(receiver.wait_for(10, Duration::from_secs(10)).await.len(), 10);

    nix::sys::signal::kill(nix::unistd::Pid::from_raw(node.id().unwrap() as i32), nix::sys::signal::Signal::SIGTERM).unwrap();
    let status = tokio::time::timeout(Duration::from_secs(20), node.wait()).await.unwrap().unwrap();
    assert!(status.success(), "{status}");

    let succeeded: i64 = sqlx::query_scalar("SELECT count(*) FROM tasks WHERE status = 'succeeded'").fetch_one(&app.pool).await.unwrap();
    assert_eq!(succeeded, 10, "the callbacks in flight were finished and recorded");
    assert_eq!(receiver.received().len(), 10, "none delivered twice");
    let nodes: i64 = sqlx::query_scalar("SELECT count(*) FROM nodes WHERE delivers").fetch_one(&app.pool).await.unwrap();
    assert_eq!(nodes, 0, "the node deregistered (the API-only test node remains)");
}

/// max_in_flight holds for the whole cluster, not per node: three `chime serve` processes
/// on one database, a cap of 5, and a receiver that holds each request 300 ms. It never has
/// more than 5 requests at once, and has 5 most of the time: the cap is the cluster's, not
/// divided away between the nodes.
#[tokio::test]
async fn max_in_flight_holds_across_the_cluster() {
    const CAP: usize = 5;
    const TASKS: usize = 60;
    const HOLD: Duration = Duration::from_millis(300);
    let app = spawn_app().await; // the API only: the three processes deliver
    let receiver = Receiver::start(vec![], Answer { delay: HOLD, ..Answer::status(200) }).await;
    let settings = Settings { callback_url: Some(receiver.url.clone()), max_in_flight: Some(CAP as i32), ..Default::default() };
    biz_types::create(&app.pool, "orders", &settings, CallbackHosts::Any).await.unwrap();
    let token = biz_types::create_token(&app.pool, "orders").await.unwrap();
    let mut nodes = Vec::new();
    for _ in 0..3 {
        nodes.push(chime_process(&app.db_url, &[]).await); // killed when dropped, pass or fail
    }
    // Due in a second, so that all three, each having read the biz type, claim at once.
    let due = (chrono::Utc::now() + chrono::Duration::seconds(1)).to_rfc3339();
    let items: Vec<Value> = (0..TASKS).map(|i| json!({"biz_type": "orders", "run_at": due, "payload": i})).collect();
    assert_eq!(app.post("/api/v1/tasks/batch", &token, json!({"tasks": items})).await.status, 200);

    let received = receiver.wait_for(TASKS, Duration::from_secs(30)).await;
    assert_eq!(received.len(), TASKS, "every task delivered");
    let peak = receiver.peak_in_flight();
    let first = received.iter().map(|r| r.at).min().unwrap();
    let last = received.iter().map(|r| r.at).max().unwrap();
    // Requests at the receiver on average, from the first arrival to the last answer.
    let mean = TASKS as f64 * HOLD.as_secs_f64() / (last - first + HOLD).as_secs_f64();
    let per_node: Vec<i64> = sqlx::query_scalar("SELECT count(*) FROM attempts GROUP BY node_id ORDER BY 1").fetch_all(&app.pool).await.unwrap();
    println!("cap {CAP}, 3 nodes: peak {peak} requests at once, mean {mean:.2}; attempts per node {per_node:?}");
    assert!(peak <= CAP, "the receiver had {peak} requests at once, over the biz type's cap of {CAP}");
    assert_eq!(peak, CAP, "the cap is used whole");
    assert!(mean >= 0.6 * CAP as f64, "mean {mean:.2} requests at once: the cap was left unused");
}

/// Another node's leases hold their slots of the cap until they end: with a cap of 2 and
/// two tasks leased by a node that died, a live node claims none of the tasks left due;
/// once lease recovery puts the dead node's tasks back, their slots are free again.
#[tokio::test]
async fn a_dead_node_s_leases_hold_their_slots_until_recovered() {
    // No leader: its lease recovery would free the slots before the first turn.
    let (app, _leader_lock) = spawn_app_without_leader().await;
    let receiver = Receiver::start(vec![], Answer::status(200)).await;
    let settings = Settings { callback_url: Some(receiver.url.clone()), max_in_flight: Some(2), ..Default::default() };
    biz_types::create(&app.pool, "orders", &settings, CallbackHosts::Any).await.unwrap();
    let token = biz_types::create_token(&app.pool, "orders").await.unwrap();
    let mut ids = Vec::new();
    for i in 0..3 {
        ids.push(app.create_task(&token, json!({"biz_type": "orders", "payload": i})).await["id"].as_str().unwrap().to_string());
    }
    // Two of them leased by a node that died: running, their lease just run out.
    for id in &ids[..2] {
        sqlx::query(
            "UPDATE tasks SET status = 'running', attempt_count = 1, leased_by = gen_random_uuid(),
                    lease_until = now() - interval '1 second' WHERE id = $1::uuid",
        )
        .bind(id)
        .execute(&app.pool)
        .await
        .unwrap();
    }

    let mut engine = engine(&app);
    assert_eq!(engine.turn().await.claimed, 0, "the dead node's two leases fill the cap of 2");
    assert_eq!(chime::tasks::lease::recover_expired_leases(&app.pool).await.unwrap().tasks, 2);
    assert_eq!(engine.turn().await.claimed, 2, "their slots are free again: two of the three due are claimed");
    engine.settled().await;
    assert_eq!(receiver.received().len(), 2);
}

/// The cap's gate (`chime_claim_room`, migrations 0033 and 0039), called as claim.sql calls
/// it, each claim in a transaction of its own: far from the cap, three claims of 200 pass
/// at once, each setting aside what the two others may take, and a fourth waits for a
/// lane; near the cap, a claim waits for the one before it to commit and then counts its
/// A biz type with a cap of 4,000 or more has eight gate lanes (migration 0053): eight
/// claims of 200 pass at once, each left what the cap leaves once the seven others' 200
/// are set aside, and a ninth waits for a lane.
#[tokio::test]
async fn the_cap_s_gate_lets_eight_claims_through_at_once_under_a_large_cap() {
    use sqlx::{Connection, PgConnection};
    let app = spawn_app().await;
    let settings = Settings { callback_url: Some("http://127.0.0.1:9/".into()), max_in_flight: Some(10_000), ..Default::default() };
    let biz = biz_types::create(&app.pool, "orders", &settings, CallbackHosts::Any).await.unwrap().id;
    async fn claim(url: String, biz: i32) -> (PgConnection, i32) {
        let mut conn = PgConnection::connect(&url).await.unwrap();
        sqlx::query("BEGIN").execute(&mut conn).await.unwrap();
        let room = sqlx::query_scalar("SELECT chime_claim_room($1, 200)").bind(biz).fetch_one(&mut conn).await.unwrap();
        (conn, room)
    }
    let mut open = Vec::new();
    for _ in 0..8 {
        let (conn, room) =
            tokio::time::timeout(Duration::from_secs(10), claim(app.db_url.clone(), biz)).await.expect("a claim far from the cap waited");
        assert_eq!(room, 10_000 - 7 * 200);
        open.push(conn);
    }
    let ninth = tokio::spawn(claim(app.db_url.clone(), biz));
    wait_until("the ninth claim waits for a lane", Duration::from_secs(10), || async {
        let waiting: i64 =
            sqlx::query_scalar("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND database = (SELECT oid FROM pg_database WHERE datname = current_database())").fetch_one(&app.pool).await.unwrap();
        if waiting == 1 { Ok(()) } else { Err(format!("{waiting} waiting")) }
    })
    .await;
    for mut conn in open {
        sqlx::query("COMMIT").execute(&mut conn).await.unwrap();
    }
    let (_, room) = tokio::time::timeout(Duration::from_secs(10), ninth).await.expect("the ninth claim went on").unwrap();
    assert_eq!(room, 10_000 - 7 * 200);
}

/// leases.
#[tokio::test]
async fn the_cap_s_gate_lets_three_claims_through_at_once_far_from_the_cap() {
    use sqlx::{Connection, PgConnection};
    let app = spawn_app().await;
    let settings = Settings { callback_url: Some("http://127.0.0.1:9/".into()), max_in_flight: Some(1000), ..Default::default() };
    let biz = biz_types::create(&app.pool, "orders", &settings, CallbackHosts::Any).await.unwrap().id;
    let token = biz_types::create_token(&app.pool, "orders").await.unwrap();
    let items: Vec<Value> = (0..1000).map(|i| json!({"biz_type": "orders", "delay_ms": 3_600_000, "payload": i})).collect();
    assert_eq!(app.post("/api/v1/tasks/batch", &token, json!({"tasks": items})).await.status, 200);
    // Leases taken by claims (or a node that is no more): `n` pending tasks made running.
    async fn lease(conn: &mut PgConnection, n: i64) {
        sqlx::query(
            "UPDATE tasks SET status = 'running', attempt_count = 1, leased_by = gen_random_uuid(), lease_until = now() + interval '1 hour'
              WHERE id IN (SELECT id FROM tasks WHERE status = 'pending' LIMIT $1 FOR UPDATE SKIP LOCKED)",
        )
        .bind(n)
        .execute(conn)
        .await
        .unwrap();
    }
    // A claim of `picked` tasks: its transaction open, and the room the gate left it.
    async fn claim(url: String, biz: i32, picked: i64) -> (PgConnection, i32) {
        let mut conn = PgConnection::connect(&url).await.unwrap();
        sqlx::query("BEGIN").execute(&mut conn).await.unwrap();
        let room = sqlx::query_scalar("SELECT chime_claim_room($1, $2)").bind(biz).bind(picked).fetch_one(&mut conn).await.unwrap();
        (conn, room)
    }
    async fn commit(mut conn: PgConnection) {
        sqlx::query("COMMIT").execute(&mut conn).await.unwrap();
    }
    // Claims waiting for an advisory lock, as PostgreSQL sees them.
    let one_waiting = |what: &'static str| {
        let pool = app.pool.clone();
        async move {
            for _ in 0..200 {
                let waiting: i64 =
                    sqlx::query_scalar("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND database = (SELECT oid FROM pg_database WHERE datname = current_database())").fetch_one(&pool).await.unwrap();
                if waiting == 1 {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            panic!("{what}: not waiting for a lock after 10 s");
        }
    };
    let mut conn = PgConnection::connect(&app.db_url).await.unwrap();
    lease(&mut conn, 100).await;

    // Far from the cap: 100 running, three claims of 200 at once, each left 1000 - 100 -
    // 2 x 200 (what the two others may take).
    let mut open = Vec::new();
    for _ in 0..3 {
        let (mut conn, room) =
            tokio::time::timeout(Duration::from_secs(10), claim(app.db_url.clone(), biz, 200)).await.expect("a claim far from the cap waited");
        assert_eq!(room, 500);
        lease(&mut conn, 100).await;
        open.push(conn);
    }
    // A fourth waits for one lane, not for the others: it goes on when that lane's claim
    // commits, after the two others, and counts all three claims' leases.
    let fourth = tokio::spawn(claim(app.db_url.clone(), biz, 200));
    one_waiting("the fourth claim").await;
    let holder: i32 = sqlx::query_scalar(
        "SELECT h.pid FROM pg_locks w JOIN pg_locks h ON (h.database, h.classid, h.objid, h.objsubid) = (w.database, w.classid, w.objid, w.objsubid)
          WHERE w.locktype = 'advisory' AND NOT w.granted AND h.locktype = 'advisory' AND h.granted
            AND w.database = (SELECT oid FROM pg_database WHERE datname = current_database())",
    )
    .fetch_one(&app.pool)
    .await
    .unwrap();
    let mut last = None;
    for mut conn in open.drain(..) {
        let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()").fetch_one(&mut conn).await.unwrap();
        if pid == holder {
            last = Some(conn);
        } else {
            commit(conn).await;
        }
    }
    one_waiting("the fourth claim, the two other lanes free").await;
    commit(last.expect("the lane waited for is a claim's")).await;
    let (fourth, room) = tokio::time::timeout(Duration::from_secs(10), fourth).await.expect("the fourth claim still waits").unwrap();
    assert_eq!(room, 1000 - 400 - 400);
    commit(fourth).await;

    // Near the cap (500 running: 200 + 2 x 200 more would pass it), claims queue: the
    // second waits until the first commits, and counts what it leased.
    lease(&mut conn, 100).await;
    let (mut first, room) = claim(app.db_url.clone(), biz, 200).await;
    assert_eq!(room, 500);
    lease(&mut first, 200).await;
    let second = tokio::spawn(claim(app.db_url.clone(), biz, 200));
    one_waiting("the second claim near the cap").await;
    commit(first).await;
    let (second, room) = tokio::time::timeout(Duration::from_secs(10), second).await.expect("the second claim still waits").unwrap();
    assert_eq!(room, 300, "1000 less the 700 running");
    commit(second).await;
}
