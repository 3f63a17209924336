//! Stopping and starting as docs/design/contract.md, Operating says, with real `chime serve` processes: SIGTERM to a
//! node with callbacks in flight and tasks claimed ahead, beside another node; `/healthz`
//! before `/readyz` while the database is being migrated.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use base64::Engine;
use chime::biz_types::{self, Settings};
use chime::callback_hosts::CallbackHosts;
use chime::db::Pool;
use chrono::{DateTime, Utc};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::{Value, json};
use sqlx::migrate::Migrate;
use sqlx::{Connection, PgConnection};
use uuid::Uuid;

use crate::helpers::{TestApp, chime_process_live, chime_process_logging, client, fresh_database, node_of, wait_ready};
use crate::receiver::{Answer, Receiver};

/// The grace the stopping node is given, short for the test (the default is 20 s).
const GRACE: Duration = Duration::from_secs(5);

/// A secret key, as production sets one: without it a node warns at start (secrets in
/// clear), and these tests count warnings.
fn secret_key() -> String {
    base64::engine::general_purpose::STANDARD.encode([7u8; 32])
}

fn sigterm(child: &tokio::process::Child) {
    kill(Pid::from_raw(child.id().unwrap() as i32), Signal::SIGTERM).unwrap();
}

/// A task held by a node: its id and `run_at`.
type Held = (Uuid, DateTime<Utc>);

/// A log file for a chime process, and its path.
fn log_file(name: &str) -> (std::fs::File, std::path::PathBuf) {
    let path = std::env::temp_dir().join(format!("chime-{name}-{}-{}.log", std::process::id(), Uuid::new_v4()));
    (std::fs::File::create(&path).unwrap(), path)
}

/// Reads and removes a log; returns its WARN and ERROR lines too.
fn read_log(path: &std::path::Path) -> (String, Vec<String>) {
    let log = std::fs::read_to_string(path).unwrap();
    std::fs::remove_file(path).unwrap();
    let loud = log.lines().filter(|l| l.contains("WARN") || l.contains("ERROR")).map(str::to_string).collect();
    (log, loud)
}

/// Asks `done` every 10 ms until it says yes (at most `within`); returns when it did.
async fn wait_until<F: std::future::Future<Output = bool>>(within: Duration, mut done: impl FnMut() -> F) -> Option<Instant> {
    let started = Instant::now();
    while started.elapsed() < within {
        if done().await {
            return Some(Instant::now());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    None
}

async fn count(pool: &Pool, sql: &'static str, node: Uuid) -> i64 {
    sqlx::query_scalar(sql).bind(node).fetch_one(pool).await.unwrap()
}

/// SIGTERM to node A, the leader, while it has callbacks in flight (one whose receiver
/// answers only after the grace) and tasks claimed ahead of their due time, with node B
/// delivering beside it. At once A's `/readyz` answers 503 (its listener still open), A
/// leaves `nodes` and B leads; A starts no callback after the signal, not even for the tasks
/// it had claimed ahead; A exits within the grace plus a second, cutting off the slow
/// callback and leaving no task leased to it; B delivers every task, the cut-off one long
/// before its lease would have run out. Before, A started a callback 11 s after SIGTERM,
/// told the engine to stop only after its HTTP server's own 30 s stop, and left what was
/// still in flight to lease expiry.
#[tokio::test]
async fn a_stopping_node_starts_nothing_and_hands_its_tasks_to_another() {
    let db_url = fresh_database().await;
    let pool = chime::db::connect(&db_url, 4).await.unwrap();
    // The first callback outlasts the grace; every later one takes 3 s.
    let slow = Answer { delay: Duration::from_secs(60), ..Answer::status(200) };
    let receiver = Receiver::start(vec![slow], Answer { delay: Duration::from_secs(3), ..Answer::status(200) }).await;
    // A lease (timeout + 5 s) far longer than the test: only a hand-back gets the slow task
    // delivered in time.
    let settings = Settings { callback_url: Some(receiver.url.clone()), timeout_ms: Some(120_000), max_in_flight: Some(1000), ..Default::default() };
    biz_types::create(&pool, "orders", &settings, CallbackHosts::Any).await.unwrap();
    let token = biz_types::create_token(&pool, "orders").await.unwrap();
    // A leader lease far longer than the test: only a released lock lets B lead in time.
    let key = secret_key();
    let env = [("CHIME_SHUTDOWN_GRACE_SECS", "5"), ("CHIME_LEADER_LEASE_SECS", "60"), ("CHIME_SECRET_KEY", key.as_str())];

    let (log, log_path) = log_file("shutdown-a");
    let (mut a, a_address) = chime_process_logging(&db_url, &env, log).await;
    let a_id = node_of(&pool, &a).await;
    let api = TestApp { address: a_address.clone(), pool: pool.clone(), db_url: db_url.clone(), client: client() };
    let slow_task = api.create_task(&token, json!({"biz_type": "orders", "payload": "slow"})).await;
    assert_eq!(receiver.wait_for(1, Duration::from_secs(10)).await.len(), 1, "A called the slow receiver");
    assert!(wait_until(Duration::from_secs(10), || async { chime::leader::current(&pool).await.unwrap() == Some(a_id) }).await.is_some());
    let (b, _) = chime_process_logging(&db_url, &env, log_file("shutdown-b").0).await;
    let b_id = node_of(&pool, &b).await;

    // A task due every 10 ms for 3 s: both nodes claim them ahead as they come due.
    let first = Utc::now() + chrono::Duration::seconds(1);
    let items: Vec<Value> = (0..300)
        .map(|i| json!({"biz_type": "orders", "run_at": (first + chrono::Duration::milliseconds(10 * i)).to_rfc3339(), "payload": i}))
        .collect();
    assert_eq!(api.post("/api/v1/tasks/batch", &token, json!({"tasks": items})).await.status, 200);

    // SIGTERM the moment A holds tasks claimed ahead, due 50 ms or more from now.
    let watching = Instant::now();
    let (ahead, signalled, signalled_at): (Vec<Held>, Instant, DateTime<Utc>) = loop {
        let ahead: Vec<Held> = sqlx::query_as(
            "SELECT id, run_at FROM tasks WHERE leased_by = $1 AND status = 'running' AND run_at > now() + interval '50 milliseconds'",
        )
        .bind(a_id)
        .fetch_all(&pool)
        .await
        .unwrap();
        if !ahead.is_empty() {
            sigterm(&a);
            break (ahead, Instant::now(), Utc::now());
        }
        assert!(watching.elapsed() < Duration::from_secs(10), "A never held a task claimed ahead");
    };
    let readyz = client();
    let readyz_503 = wait_until(Duration::from_secs(5), || {
        let request = readyz.get(format!("{a_address}/readyz")).send();
        async move { request.await.expect("A's listener is still open").status() == 503 }
    })
    .await
    .map(|at| at - signalled);
    // A was stopping by then, whatever the load on this machine.
    let surely_stopping = signalled_at + chrono::Duration::from_std(readyz_503.unwrap_or_default().max(Duration::from_millis(50))).unwrap();
    let left = wait_until(Duration::from_secs(5), || async { count(&pool, "SELECT count(*) FROM nodes WHERE id = $1", a_id).await == 0 })
        .await
        .map(|at| at - signalled);
    let b_leads =
        wait_until(Duration::from_secs(10), || async { chime::leader::current(&pool).await.unwrap() == Some(b_id) }).await.map(|at| at - signalled);
    let status = tokio::time::timeout(Duration::from_secs(30), a.wait()).await.expect("A did not exit").unwrap();
    let exited = signalled.elapsed();
    println!("after SIGTERM: /readyz 503 in {readyz_503:?}, A left nodes in {left:?}, B led in {b_leads:?}, A exited in {exited:?}");
    assert!(status.success(), "{status}");
    assert!(readyz_503.is_some_and(|d| d < Duration::from_millis(500)), "/readyz answered 503 after {readyz_503:?}");
    assert!(left.is_some_and(|d| d < Duration::from_secs(1)), "A's row left nodes after {left:?}");
    assert!(b_leads.is_some_and(|d| d < Duration::from_secs(3)), "B led after {b_leads:?} (the leader lease is 60 s)");
    assert!(exited < GRACE + Duration::from_secs(1), "A exited {exited:?} after SIGTERM, its grace being {GRACE:?}");
    assert_eq!(count(&pool, "SELECT count(*) FROM tasks WHERE leased_by = $1", a_id).await, 0, "A left tasks under its lease");

    // No callback from A after the signal (50 ms for the signal to reach its loops, or until
    // its /readyz said it was stopping), none for a task it had claimed ahead; the slow one
    // cut off.
    let late: Vec<(Uuid, DateTime<Utc>)> = sqlx::query_as("SELECT task_id, started_at FROM attempts WHERE node_id = $1 AND started_at > $2")
        .bind(a_id)
        .bind(surely_stopping)
        .fetch_all(&pool)
        .await
        .unwrap();
    assert!(late.is_empty(), "A called back after SIGTERM (at {signalled_at}): {late:?}");
    let ahead: Vec<Uuid> = ahead.into_iter().filter(|(_, run_at)| *run_at > surely_stopping).map(|(id, _)| id).collect();
    assert!(!ahead.is_empty(), "A held no task claimed ahead due after it was stopping");
    let started_ahead: i64 = sqlx::query_scalar("SELECT count(*) FROM attempts WHERE node_id = $1 AND task_id = ANY($2)")
        .bind(a_id)
        .bind(&ahead)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(started_ahead, 0, "A called back tasks it held claimed ahead at SIGTERM");
    let cut_off: Vec<String> = sqlx::query_scalar("SELECT error FROM attempts WHERE node_id = $1 AND task_id = $2::uuid")
        .bind(a_id)
        .bind(slow_task["id"].as_str().unwrap())
        .fetch_all(&pool)
        .await
        .unwrap();
    assert!(cut_off.len() == 1 && cut_off[0].starts_with("cut off"), "{cut_off:?}");

    // Every task delivered, the cut-off and the given-back ones by B; none lost.
    let all_done = wait_until(Duration::from_secs(30), || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM tasks WHERE status <> 'succeeded'").fetch_one(&pool).await.unwrap() == 0
    })
    .await;
    let statuses: Vec<(String, i64)> = sqlx::query_as("SELECT status, count(*) FROM tasks GROUP BY status").fetch_all(&pool).await.unwrap();
    assert!(all_done.is_some(), "not every task succeeded within 30 s of A's exit: {statuses:?}");
    let delivered: HashSet<String> = receiver.received().iter().map(|r| r.header("chime-task-id").unwrap().to_string()).collect();
    assert_eq!(delivered.len(), 301, "every task reached the receiver");
    let by_b: i64 = sqlx::query_scalar("SELECT count(*) FROM attempts WHERE node_id = $1 AND task_id = ANY($2)")
        .bind(b_id)
        .bind(&ahead)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(by_b, ahead.len() as i64, "B delivered the tasks A gave back");
    println!("A gave back {} tasks it held claimed ahead; B delivered them", ahead.len());

    // The stop, phase by phase; the only warning is for the callback cut off.
    let (log, loud) = read_log(&log_path);
    for phase in [
        "SIGTERM received: stopping",
        "delivery engine stopping",
        "no longer leads",
        "left the cluster",
        "shutdown grace is over",
        "delivery engine stopped",
        "HTTP server stopped",
        "node stopped",
    ] {
        assert!(log.contains(phase), "no `{phase}` in A's log:\n{log}");
    }
    // (Besides the start's warning that the test's biz type, made without the key, keeps
    // its secret in clear.)
    let loud: Vec<_> = loud.into_iter().filter(|line| !line.contains("stored in clear")).collect();
    assert!(loud.len() == 1 && loud[0].contains("cut off"), "{loud:?}");
}

/// `/healthz` answers 200 while the node waits to migrate the database (another holds the
/// migration lock, as a node running a long migration would), and `/readyz` and the API
/// answer 503 saying so; the node is ready once the lock is free. Before, a node migrated
/// before it listened, so a liveness probe could kill it mid-migration. Then a clean stop:
/// its row leaves `nodes` and its log has one line per phase and no warning.
#[tokio::test]
async fn healthz_answers_while_the_database_is_migrated() {
    let db_url = fresh_database().await;
    let pool = chime::db::connect(&db_url, 2).await.unwrap();
    let mut holder = PgConnection::connect(&db_url).await.unwrap();
    holder.lock().await.unwrap();

    let (log, log_path) = log_file("migrating");
    let (mut node, address) = chime_process_live(&db_url, &[("CHIME_SHUTDOWN_GRACE_SECS", "5"), ("CHIME_SECRET_KEY", &secret_key())], log).await;
    let client = client();
    for _ in 0..5 {
        assert_eq!(client.get(format!("{address}/healthz")).send().await.unwrap().status(), 200);
        let ready = client.get(format!("{address}/readyz")).send().await.unwrap();
        assert_eq!(ready.status(), 503);
        let body: Value = ready.json().await.unwrap();
        assert_eq!(body["error"]["message"], "not ready: migrating", "{body}");
        let api = client.get(format!("{address}/api/v1/tasks")).send().await.unwrap();
        assert_eq!(api.status(), 503, "the API answered before the migrations");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    holder.unlock().await.unwrap();
    wait_ready(&address).await;
    let id = node_of(&pool, &node).await;
    sigterm(&node);
    let stopping = Instant::now();
    let status = tokio::time::timeout(Duration::from_secs(30), node.wait()).await.expect("the node did not exit").unwrap();
    println!("a node with nothing in flight exited {:?} after SIGTERM", stopping.elapsed());
    assert!(status.success(), "{status}");
    assert!(stopping.elapsed() < GRACE, "exited {:?} after SIGTERM", stopping.elapsed());
    assert_eq!(count(&pool, "SELECT count(*) FROM nodes WHERE id = $1", id).await, 0, "the node's row is still in `nodes`");
    let (log, loud) = read_log(&log_path);
    assert!(loud.is_empty(), "warnings on a clean stop: {loud:?}\n{log}");
    for phase in [
        "SIGTERM received: stopping",
        "delivery engine stopped",
        "leader election stopped",
        "left the cluster",
        "HTTP server stopped",
        "node stopped",
    ] {
        assert!(log.contains(phase), "no `{phase}` in the log:\n{log}");
    }
}
