//! Pooler mode: two `chime serve` nodes whose statements go through a real PgBouncer in
//! transaction mode (DATABASE_URL) and whose sessions go straight to PostgreSQL
//! (CHIME_DIRECT_DATABASE_URL), under concurrent creates, reads and deliveries.

use std::collections::HashMap;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use chime::biz_types::{self, Settings};
use chime::callback_hosts::CallbackHosts;
use chime::db::Pool;
use serde_json::{Value, json};

use crate::console::sign_in;
use crate::helpers::{TestApp, chime_process_logging, client, free_port, fresh_database, node_of};
use crate::receiver::{Answer, Receiver};

/// PgBouncer 1.18 in transaction mode in front of the harness's PostgreSQL, logging in as
/// its own role (`chime_pooled`) so that its server sessions are told apart from chime's
/// direct ones. Stopped and its directory removed when dropped.
struct PgBouncer {
    port: u16,
    dir: PathBuf,
    child: std::process::Child,
}

impl PgBouncer {
    /// In front of the server of `db_url` (the harness's: a Unix socket). A small pool, so
    /// that server sessions are shared by many clients, as in production.
    fn start(db_url: &str) -> PgBouncer {
        let url = url::Url::parse(db_url).unwrap();
        let socket_dir = url.query_pairs().find(|(k, _)| k == "host").expect("the harness's URL names its socket").1.into_owned();
        let pg_port = url.port().unwrap_or(5432);
        let port = free_port();
        let dir = std::env::temp_dir().join(format!("chime-pgbouncer-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let config = dir.join("pgbouncer.ini");
        std::fs::write(
            &config,
            format!(
                "[databases]\n\
                 * = host={socket_dir} port={pg_port} user=chime_pooled\n\
                 [pgbouncer]\n\
                 listen_addr = 127.0.0.1\n\
                 listen_port = {port}\n\
                 unix_socket_dir =\n\
                 auth_type = any\n\
                 pool_mode = transaction\n\
                 default_pool_size = 4\n\
                 max_client_conn = 200\n\
                 logfile = {dir}/pgbouncer.log\n\
                 pidfile = {dir}/pgbouncer.pid\n",
                dir = dir.display()
            ),
        )
        .unwrap();
        let mut command = std::process::Command::new("/usr/sbin/pgbouncer");
        command.arg(&config).stdout(std::process::Stdio::null()).stderr(std::process::Stdio::null());
        // PgBouncer refuses to run as root; the database's user reaches its socket.
        if nix::unistd::geteuid().is_root() {
            let user = nix::unistd::User::from_name("postgres").unwrap().expect("a postgres user");
            nix::unistd::chown(&dir, Some(user.uid), Some(user.gid)).unwrap();
            command.uid(user.uid.as_raw()).gid(user.gid.as_raw());
        }
        let child = command.spawn().expect("starting /usr/sbin/pgbouncer (Debian: apt-get install pgbouncer)");
        let bouncer = PgBouncer { port, dir, child };
        let started = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(started.elapsed() < Duration::from_secs(10), "PgBouncer did not listen within 10 s: {}", bouncer.log());
            std::thread::sleep(Duration::from_millis(20));
        }
        bouncer
    }

    /// `db_url`'s database through this PgBouncer.
    fn url(&self, db_url: &str) -> String {
        let database = url::Url::parse(db_url).unwrap().path().to_string();
        format!("postgres://chime_pooled@127.0.0.1:{}{database}?sslmode=disable", self.port)
    }

    /// A file in PgBouncer's directory for a node's log.
    fn node_log(&self, name: &str) -> std::fs::File {
        let path = self.dir.join(format!("chime-{name}.log"));
        eprintln!("node {name} logs to {}", path.display());
        std::fs::File::create(path).unwrap()
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("pgbouncer.log")).unwrap_or_default()
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // Kept when the test fails: the nodes' and PgBouncer's logs are there.
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Creates, reads and deliveries from 20 clients at once through PgBouncer in transaction
/// mode: every answer is right (a statement run with another client's parameters would
/// show as a task whose payload is not its own), every task is delivered once with its own
/// payload, the console signs in and shows its pages, a node leads on a direct session, an
/// every-second timer fires, and a task due
/// in 200 ms is delivered within milliseconds of its time (NOTIFY still wakes the engine).
#[tokio::test]
async fn every_statement_is_safe_through_pgbouncer_in_transaction_mode() {
    let db_url = fresh_database().await;
    let pool = chime::db::connect(&db_url, 4).await.unwrap();
    let role = "CREATE ROLE chime_pooled LOGIN SUPERUSER";
    if let Err(e) = sqlx::query(role).execute(&pool).await {
        // One role for the whole cluster: another test of this process made it already.
        assert!(e.to_string().contains("already exists"), "{e}");
    }
    sqlx::query("ALTER ROLE chime_pooled SET jit = off").execute(&pool).await.unwrap();
    let bouncer = PgBouncer::start(&db_url);
    let receiver = Receiver::start(vec![], Answer::status(200)).await;
    let token = biz_type(&pool, "orders", &receiver.url).await;
    let ticks = biz_type(&pool, "ticks", &receiver.url).await;

    let pooled_url = bouncer.url(&db_url);
    let env = [("CHIME_DIRECT_DATABASE_URL", db_url.as_str()), ("CHIME_LEADER_LEASE_SECS", "2")];
    let (a, a_address) = chime_process_logging(&pooled_url, &env, bouncer.node_log("a")).await;
    let (b, b_address) = chime_process_logging(&pooled_url, &env, bouncer.node_log("b")).await;
    let nodes = [node_of(&pool, &a).await, node_of(&pool, &b).await];
    let addresses = [a_address, b_address];

    let timer = post(&addresses[0], &ticks, "/api/v1/timers", json!({"biz_type": "ticks", "key": "every-second", "cron": "* * * * * *"})).await;
    let timer_id = timer["id"].as_str().unwrap().to_string();

    // 20 clients, each alternating single and batch creates with reads of what it made.
    let clients = (0..20).map(|c| {
        let (address, token) = (addresses[c % 2].clone(), token.clone());
        tokio::spawn(async move {
            let mut made = HashMap::new();
            for round in 0..6 {
                let key = format!("c{c}-r{round}");
                let task =
                    post(&address, &token, "/api/v1/tasks", json!({"biz_type": "orders", "key": key, "delay_ms": 300, "payload": {"key": key}}))
                        .await;
                assert_eq!(task["payload"]["key"], key.as_str(), "a create answered with another's task: {task}");
                made.insert(task["id"].as_str().unwrap().to_string(), key.clone());
                let keys: Vec<String> = (0..5).map(|i| format!("c{c}-r{round}-b{i}")).collect();
                let items: Vec<Value> = keys.iter().map(|k| json!({"biz_type": "orders", "key": k, "payload": {"key": k}})).collect();
                let batch = post(&address, &token, "/api/v1/tasks/batch", json!({ "tasks": items })).await;
                for (result, k) in batch["results"].as_array().unwrap().iter().zip(&keys) {
                    assert_eq!(result["status"], 201, "{result}");
                    assert_eq!(result["task"]["payload"]["key"], k.as_str(), "a batch item answered with another's task: {result}");
                    made.insert(result["task"]["id"].as_str().unwrap().to_string(), k.clone());
                }
                for (id, k) in made.iter().take(3) {
                    let read = get(&address, &token, &format!("/api/v1/tasks/{id}")).await;
                    assert_eq!(
                        (read["id"].as_str(), read["key"].as_str()),
                        (Some(id.as_str()), Some(k.as_str())),
                        "a read answered with another's task"
                    );
                }
                get(&address, &token, "/api/v1/tasks?biz_type=orders&limit=20").await;
                get(&address, &token, &format!("/api/v1/biz-types/orders/tasks/by-key/{key}")).await;
            }
            made
        })
    });
    let mut made = HashMap::new();
    for c in futures_util::future::join_all(clients).await {
        made.extend(c.expect("a client's requests all answered right"));
    }
    assert_eq!(made.len(), 20 * 6 * 6);

    // Every task delivered once, with its own payload.
    let deadline = Instant::now() + Duration::from_secs(30);
    let delivered = loop {
        let delivered: Vec<Value> = receiver.received().iter().map(|r| r.json()).filter(|b| b["biz_type"] == "orders").collect();
        if delivered.len() >= made.len() || Instant::now() > deadline {
            break delivered;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let mut seen = HashMap::new();
    for body in &delivered {
        let id = body["task_id"].as_str().unwrap();
        let key = made.get(id).unwrap_or_else(|| panic!("a callback for a task nobody created: {body}"));
        assert_eq!(body["payload"]["key"], key.as_str(), "delivered with another's payload: {body}");
        *seen.entry(id.to_string()).or_insert(0) += 1;
    }
    let twice = seen.values().filter(|n| **n > 1).count();
    println!("pooler: {} created, {} delivered, {twice} twice", made.len(), seen.len());
    assert_eq!((seen.len(), twice), (made.len(), 0), "every task delivered exactly once");

    // One node leads, on a direct session (the pooler's sessions log in as chime_pooled),
    // and its duties run: the every-second timer fires.
    let leader = chime::leader::current(&pool).await.unwrap().expect("a leader");
    assert!(nodes.contains(&leader));
    let lock_holders: Vec<String> = sqlx::query_scalar(
        "SELECT a.usename::text FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid WHERE l.locktype = 'advisory' AND l.granted",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert!(!lock_holders.is_empty() && lock_holders.iter().all(|u| u == "postgres"), "advisory locks held by {lock_holders:?}");
    let pooled: i64 = sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE usename = 'chime_pooled'").fetch_one(&pool).await.unwrap();
    assert!(pooled > 0, "statements went through PgBouncer");
    let fired = wait_matching(&receiver, |b| b["timer_id"] == timer_id.as_str(), 2, Duration::from_secs(10)).await.len();
    assert!(fired >= 2, "the every-second timer fired {fired} times");

    // The console signs in and shows its pages through the pooler too.
    let app = TestApp { address: addresses[0].clone(), pool: pool.clone(), db_url: pooled_url.clone(), client: client() };
    let console = sign_in(&app, "admin", "test-admin-password").await;
    for page in ["/console", "/console/tasks", "/console/timers", "/console/cluster"] {
        let shown = console.get(page).await;
        assert_eq!(shown.status, 200, "{page}: {}", shown.body);
    }

    // A task due in 200 ms: the create's NOTIFY wakes the engine (its idle poll is 1 s).
    let mut lateness = Vec::new();
    for i in 0..5 {
        let key = format!("soon-{i}");
        let task = post(&addresses[i % 2], &token, "/api/v1/tasks", json!({"biz_type": "orders", "key": key, "delay_ms": 200})).await;
        let id = task["id"].as_str().unwrap().to_string();
        let body = wait_matching(&receiver, |b| b["task_id"] == id.as_str(), 1, Duration::from_secs(5)).await.pop().expect("delivered");
        let (run_at, fired_at): (chrono::DateTime<chrono::Utc>, chrono::DateTime<chrono::Utc>) =
            (body["run_at"].as_str().unwrap().parse().unwrap(), body["fired_at"].as_str().unwrap().parse().unwrap());
        lateness.push((fired_at - run_at).num_milliseconds());
    }
    println!("pooler: lateness of tasks due in 200 ms: {lateness:?} ms");
    assert!(lateness.iter().all(|ms| *ms < 300), "lateness {lateness:?} ms: the engine was not woken");

    // A task that fails: its failure notice is sent through the pooler too (the notice
    // sender has sessions of its own, once opened with what PgBouncer refuses).
    let refusing = Receiver::start(vec![], Answer::status(500)).await;
    let notices = Receiver::start(vec![], Answer::status(200)).await;
    let settings =
        Settings { callback_url: Some(refusing.url.clone()), failure_url: Some(notices.url.clone()), max_attempts: Some(1), ..Settings::default() };
    biz_types::create(&pool, "doomed", &settings, CallbackHosts::Any).await.unwrap();
    let doomed = biz_types::create_token(&pool, "doomed").await.unwrap();
    let task = post(&addresses[0], &doomed, "/api/v1/tasks", json!({"biz_type": "doomed", "key": "doomed-1"})).await;
    let noticed = notices.wait_for(1, Duration::from_secs(15)).await;
    assert_eq!(noticed.len(), 1, "no failure notice through the pooler");
    assert_eq!(noticed[0].header("chime-event"), Some("task.failed"));
    assert_eq!(noticed[0].header("chime-task-id"), task["id"].as_str());
    drop((a, b));
}

async fn biz_type(pool: &Pool, name: &str, url: &str) -> String {
    let settings = Settings { callback_url: Some(url.to_string()), ..Settings::default() };
    biz_types::create(pool, name, &settings, CallbackHosts::Any).await.unwrap();
    biz_types::create_token(pool, name).await.unwrap()
}

/// The callbacks matching `matches` (waiting up to `within` for `n` of them).
async fn wait_matching(receiver: &Receiver, matches: impl Fn(&Value) -> bool, n: usize, within: Duration) -> Vec<Value> {
    let started = Instant::now();
    loop {
        let found: Vec<Value> = receiver.received().iter().map(|r| r.json()).filter(|b| matches(b)).collect();
        if found.len() >= n || started.elapsed() > within {
            return found;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn post(address: &str, token: &str, path: &str, body: Value) -> Value {
    let response = client().post(format!("{address}{path}")).bearer_auth(token).json(&body).send().await.unwrap();
    let status = response.status().as_u16();
    let body: Value = response.json().await.unwrap();
    assert!(status == 200 || status == 201, "POST {path}: {status} {body}");
    body
}

async fn get(address: &str, token: &str, path: &str) -> Value {
    let response = client().get(format!("{address}{path}")).bearer_auth(token).send().await.unwrap();
    let status = response.status().as_u16();
    let body: Value = response.json().await.unwrap();
    assert_eq!(status, 200, "GET {path}: {body}");
    body
}
