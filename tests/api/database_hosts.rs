//! DATABASE_URL with several hosts, and a server that stops taking writes under a running
//! node (docs/design/contract.md, High availability). Failover with a real standby and a failover manager is in `tests/ha`.

use std::time::{Duration, Instant};

use chime::biz_types::{self, Settings};
use chime::callback_hosts::CallbackHosts;
use chime::db::embedded_pg;
use serde_json::json;
use sqlx::postgres::PgConnectOptions;
use sqlx::{Connection, Executor, PgConnection};

use crate::helpers::{TestApp, chime_process_logging, client, free_port, fresh_database, wait_until};
use crate::receiver::{Answer, Receiver};

/// The test server's database as a host list, in both libpq forms, with a closed TCP port
/// first: its socket directory is a host like any other.
fn closed_port_first(url: &str) -> ([String; 2], u16) {
    let options: PgConnectOptions = url.parse().unwrap();
    let socket = options.get_socket().expect("the test server is reached over its socket").display().to_string();
    let (closed, port, user) = (free_port(), options.get_port(), options.get_username());
    let database = options.get_database().unwrap();
    let encoded = socket.replace('/', "%2F");
    (
        [
            format!("host=127.0.0.1,{socket} port={closed},{port} dbname={database} user={user} target_session_attrs=read-write"),
            format!("postgres://{user}@127.0.0.1:{closed},{encoded}:{port}/{database}?target_session_attrs=primary"),
        ],
        closed,
    )
}

async fn node_with_log(db_url: &str, name: &str) -> (tokio::process::Child, TestApp, std::path::PathBuf) {
    let log_path = std::env::temp_dir().join(format!("chime-{name}-{}-{}.log", std::process::id(), uuid::Uuid::new_v4()));
    let log = std::fs::File::create(&log_path).unwrap();
    let (child, address) = chime_process_logging(db_url, &[], log).await;
    let pool = chime::db::connect(db_url, 2).await.unwrap();
    (child, TestApp { address, pool, db_url: db_url.to_string(), client: client() }, log_path)
}

/// A delivering biz type pointed at the receiver; returns its token.
async fn biz_type(app: &TestApp, receiver: &Receiver) -> String {
    let settings = Settings { callback_url: Some(receiver.url.clone()), ..Settings::default() };
    biz_types::create(&app.pool, "orders", &settings, CallbackHosts::Any).await.unwrap();
    biz_types::create_token(&app.pool, "orders").await.unwrap()
}

async fn create(app: &TestApp, token: &str, n: u64) -> u16 {
    app.request(
        "POST",
        "/api/v1/tasks",
        Some(token),
        Some(json!({"biz_type": "orders", "delay_ms": 100, "payload": {"n": n}}).to_string().into_bytes()),
    )
    .await
    .status
}

/// Both libpq forms: a host that refuses is skipped, and the node serves and delivers on the
/// next one.
#[tokio::test]
async fn a_host_that_refuses_is_skipped_in_both_libpq_forms() {
    let db_url = fresh_database().await;
    let (forms, closed) = closed_port_first(&db_url);
    let receiver = Receiver::start(vec![], Answer::status(200)).await;
    let mut token = None;
    for (n, form) in forms.iter().enumerate() {
        let (mut child, app, log_path) = node_with_log(form, "hosts").await;
        let token = match &token {
            Some(t) => t,
            None => token.insert(biz_type(&app, &receiver).await),
        };
        assert_eq!(create(&app, token, n as u64).await, 201, "{form}");
        receiver.wait_for(n + 1, Duration::from_secs(10)).await;
        child.kill().await.unwrap();
        let log = std::fs::read_to_string(&log_path).unwrap();
        std::fs::remove_file(&log_path).unwrap();
        assert!(!log.contains(&closed.to_string()), "a refused host at start is not worth a line:\n{log}");
        assert!(!log.contains("WARN chime::db"), "{log}");
    }
}

/// A server that stops taking writes (as a primary being fenced does: read-only transactions
/// by default) gets 503s, not 500s, and one line in the log; the node resumes by itself
/// once it takes writes again. A node started meanwhile says which host refused and why.
#[tokio::test]
async fn a_server_that_stops_taking_writes_gets_503s_and_the_node_resumes_by_itself() {
    let mut pg = embedded_pg::start_throwaway().await.expect("starting a throwaway PostgreSQL");
    let port = free_port();
    let mut admin = PgConnection::connect(&pg.url("postgres")).await.unwrap();
    for setting in ["listen_addresses = '127.0.0.1'".to_string(), format!("port = {port}")] {
        admin.execute(sqlx::AssertSqlSafe(format!("ALTER SYSTEM SET {setting}"))).await.unwrap();
    }
    admin.close().await.unwrap();
    pg.crash().await.unwrap();
    pg.restart().await.unwrap();
    let url = format!("postgres://postgres@127.0.0.1:{port}/chime?sslmode=disable");
    let receiver = Receiver::start(vec![], Answer::status(200)).await;
    let (mut child, app, log_path) = node_with_log(&url, "read-only").await;
    let token = biz_type(&app, &receiver).await;
    assert_eq!(create(&app, &token, 1).await, 201);
    receiver.wait_for(1, Duration::from_secs(10)).await;

    let set_read_only = |on: bool| {
        let url = url.clone();
        async move {
            let mut conn = PgConnection::connect(&url).await.unwrap();
            let statement =
                if on { "ALTER SYSTEM SET default_transaction_read_only = on" } else { "ALTER SYSTEM RESET default_transaction_read_only" };
            conn.execute(statement).await.unwrap();
            conn.execute("SELECT pg_reload_conf()").await.unwrap();
            conn.close().await.unwrap();
        }
    };
    set_read_only(true).await;
    // The reload reaches every session within moments; each create either went through
    // before it or answers 503.
    let started = Instant::now();
    let mut statuses = Vec::new();
    loop {
        let status = create(&app, &token, 2).await;
        statuses.push(status);
        assert!(status == 201 || status == 503, "a create answered {status} on a read-only server: {statuses:?}");
        if status == 503 {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "creates kept succeeding on a read-only server: {statuses:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let readyz = app.client.get(format!("{}/readyz", app.address)).send().await.unwrap().status();
    assert_eq!(readyz, 503);
    for _ in 0..20 {
        assert_eq!(create(&app, &token, 3).await, 503);
    }

    // A node started now names the host and why, and gives up (after its start wait).
    let closed = free_port();
    let two_hosts = format!("postgres://postgres@127.0.0.1:{closed},127.0.0.1:{port}/chime?sslmode=disable");
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_chime"))
        .args(["serve", "--listen", &format!("127.0.0.1:{}", free_port())])
        .env("DATABASE_URL", &two_hosts)
        .env_remove("CHIME_CONFIG")
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "no host in DATABASE_URL accepts writes: 127.0.0.1:{closed} refused the connection; 127.0.0.1:{port} accepts no writes (default_transaction_read_only is on)"
        )),
        "{stderr}"
    );

    // The outage outlasts the node's own 10 s of saying nothing more: wait until it says
    // so, which a loaded machine can put past the second node's start wait.
    let why =
        format!("still no server accepts writes after 10 s: the database in DATABASE_URL does not accept writes: 127.0.0.1:{port} accepts no writes");
    wait_until("the node saying the outage went on", Duration::from_secs(10), || async {
        std::fs::read_to_string(&log_path).unwrap().contains(&why)
    })
    .await;
    set_read_only(false).await;
    let started = Instant::now();
    wait_until("the node resuming (a create answered 201)", Duration::from_secs(10), || async { create(&app, &token, 4).await == 201 }).await;
    eprintln!("resumed {:?} after the server took writes again", started.elapsed());
    // Exactly the tasks whose create answered 201 are delivered: the first, those of the
    // second kind that went through before the reload reached their session, and the last;
    // none of those answered 503.
    let went_through = statuses.iter().filter(|s| **s == 201).count();
    let received = receiver.wait_for(2 + went_through, Duration::from_secs(10)).await;
    let mut payloads: Vec<i64> = received.iter().map(|r| r.json()["payload"]["n"].as_i64().unwrap()).collect();
    payloads.sort();
    let mut expected = vec![1];
    expected.extend(std::iter::repeat_n(2, went_through));
    expected.push(4);
    assert_eq!(payloads, expected, "creates before the outage answered {statuses:?}");

    child.kill().await.unwrap();
    let log = std::fs::read_to_string(&log_path).unwrap();
    std::fs::remove_file(&log_path).unwrap();
    let down = log.matches("accepts no writes; answering 503").count();
    assert_eq!(down, 1, "the outage is said once:\n{log}");
    assert_eq!(log.matches("the database accepts writes again").count(), 1, "{log}");
    // The outage outlasted the second node's start (10 s): said once more, with the reason.
    assert_eq!(log.matches(&why).count(), 1, "{log}");
    assert!(!log.contains(" ERROR "), "{log}");
}
