//! `chime serve` on its embedded PostgreSQL, as a real process: data survives a restart,
//! admin commands reach it while it runs and without it, and a killed run leaves nothing
//! that stops the next start.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::{Value, json};

use crate::cli::chime;
use crate::helpers::{free_port, wait_ready};

struct Node {
    child: tokio::process::Child,
    address: String,
}

async fn start(data_dir: &Path) -> Node {
    start_logging(data_dir, std::process::Stdio::null()).await
}

/// Like `start`, with the node's log (stderr) going to `log`.
async fn start_logging(data_dir: &Path, log: std::process::Stdio) -> Node {
    let port = free_port();
    let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_chime"))
        .env_remove("DATABASE_URL")
        .env_remove("CHIME_CONFIG")
        .env("CHIME_DATA_DIR", data_dir)
        .env("CHIME_LISTEN", format!("127.0.0.1:{port}"))
        .env("CHIME_ADMIN_PASSWORD", "first-admin-password")
        .stdout(std::process::Stdio::piped())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let address = format!("http://127.0.0.1:{port}");
    wait_ready(&address).await;
    Node { child, address }
}

/// GET (no body) or POST (a body) to the API with a token; the JSON answer.
async fn call(client: &reqwest::Client, token: &str, url: &str, body: Option<Value>) -> Value {
    let request = match body {
        Some(body) => client.post(url).json(&body),
        None => client.get(url),
    };
    request.bearer_auth(token).send().await.unwrap().json().await.unwrap()
}

/// The API token a first start makes for the demo biz type: stdout is not a terminal here,
/// so it is in the data directory's owner-only credentials file.
async fn first_start_token(data_dir: &Path) -> String {
    let text = crate::secrets::first_start_file(data_dir).await;
    text.lines().find(|l| l.starts_with("chime_")).unwrap_or_else(|| panic!("no demo token in the file: {text}")).to_string()
}

fn postmaster_pid(data_dir: &Path) -> Option<i32> {
    let text = std::fs::read_to_string(data_dir.join("pgdata/postmaster.pid")).ok()?;
    text.lines().next()?.trim().parse().ok()
}

/// Whether the process runs. An exited process that nobody reaped (a zombie: pid 1 on some
/// machines does not reap orphans) counts as gone.
fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat.rsplit(')').next().is_some_and(|rest| !rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

/// Whether the process is gone within a few seconds (an exited postmaster may linger
/// briefly until init reaps it).
async fn gone(pid: i32) -> bool {
    for _ in 0..50 {
        if !alive(pid) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

#[tokio::test]
async fn embedded_database_survives_restarts_and_kills() {
    let data_dir: PathBuf = std::env::temp_dir().join(format!("chime-embedded-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&data_dir);
    let client = crate::helpers::client();
    let env = [("CHIME_DATA_DIR", data_dir.to_str().unwrap())];

    // First start creates the cluster and the quick start's `demo` biz type, whose token it
    // hands over; a demo task is delivered to the built-in receiver.
    let mut node = start(&data_dir).await;
    let demo_token = first_start_token(&data_dir).await;
    let demo =
        call(&client, &demo_token, &format!("{}/api/v1/tasks", node.address), Some(json!({"biz_type": "demo", "payload": {"hello": "world"}}))).await;
    let mut status = Value::Null;
    for _ in 0..100 {
        let task = call(&client, &demo_token, &format!("{}/api/v1/tasks/{}", node.address, demo["id"].as_str().unwrap()), None).await;
        status = task["status"].clone();
        if status == "succeeded" {
            assert_eq!(task["attempts"][0]["status_code"], 204, "the demo receiver verified the signature");
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(status, "succeeded");

    // Admin commands attach to the running node.
    let out = chime(&env, &["biz-type", "create", "orders", "--callback-url", "http://127.0.0.1:9/hook"], None).await;
    assert!(out.ok, "{}", out.stderr);
    let out = chime(&env, &["token", "create", "--biz-type", "orders"], None).await;
    assert!(out.ok, "{}", out.stderr);
    let token = out.last_line().to_string();
    let created = call(
        &client,
        &token,
        &format!("{}/api/v1/tasks", node.address),
        Some(json!({"biz_type": "orders", "key": "survivor", "delay_ms": 3_600_000})),
    )
    .await;

    // SIGTERM: chime stops, and stops its database.
    let postmaster = postmaster_pid(&data_dir).expect("the database is running");
    kill(Pid::from_raw(node.child.id().unwrap() as i32), Signal::SIGTERM).unwrap();
    let status = tokio::time::timeout(Duration::from_secs(60), node.child.wait()).await.unwrap().unwrap();
    assert!(status.success(), "{status}");
    assert!(gone(postmaster).await, "the database stopped with chime");

    // Without a running node, an admin command starts and stops the database itself.
    let out = chime(&env, &["biz-type", "list"], None).await;
    assert!(out.ok && out.stdout.contains("orders"), "{}", out.stderr);
    assert!(postmaster_pid(&data_dir).is_none_or(|pid| !alive(pid)));

    // Restart: the data is still there.
    let mut node = start(&data_dir).await;
    let by_key = |address: &str| format!("{address}/api/v1/biz-types/orders/tasks/by-key/survivor");
    assert_eq!(call(&client, &token, &by_key(&node.address), None).await["id"], created["id"]);

    // kill -9 leaves the postmaster running; the next start deals with it.
    let postmaster = postmaster_pid(&data_dir).unwrap();
    node.child.kill().await.unwrap();
    assert!(alive(postmaster), "the orphaned database is still up");
    let mut node = start(&data_dir).await;
    assert_eq!(call(&client, &token, &by_key(&node.address), None).await["id"], created["id"]);
    assert!(gone(postmaster).await, "the stale postmaster was stopped");

    kill(Pid::from_raw(node.child.id().unwrap() as i32), Signal::SIGTERM).unwrap();
    node.child.wait().await.unwrap();
    std::fs::remove_dir_all(&data_dir).unwrap();
}

/// A second `serve` on a data directory in use refuses to start, saying why.
#[tokio::test]
async fn a_second_serve_on_the_same_data_dir_is_refused() {
    let data_dir: PathBuf = std::env::temp_dir().join(format!("chime-embedded-busy-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&data_dir);
    let mut node = start(&data_dir).await;
    let out = chime(&[("CHIME_DATA_DIR", data_dir.to_str().unwrap()), ("CHIME_LISTEN", "127.0.0.1:0")], &["serve"], None).await;
    assert!(!out.ok);
    assert!(out.stderr.contains("DATABASE_URL"), "{}", out.stderr);
    kill(Pid::from_raw(node.child.id().unwrap() as i32), Signal::SIGTERM).unwrap();
    node.child.wait().await.unwrap();
    std::fs::remove_dir_all(&data_dir).unwrap();
}

/// The postmaster of the embedded database killed with SIGKILL (as the OOM killer would):
/// while it is down `/readyz` and a create answer 503 within 1 s (the pool alone would make
/// them wait its 10 s acquire timeout); the node restarts it by itself, saying so in its
/// log, and the tasks created before the kill are delivered.
#[tokio::test]
async fn a_killed_embedded_database_is_restarted() {
    let data_dir: PathBuf = std::env::temp_dir().join(format!("chime-embedded-kill-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&data_dir);
    std::fs::create_dir_all(&data_dir).unwrap();
    let log_path = data_dir.join("chime.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let mut node = start_logging(&data_dir, log.into()).await;
    let client = crate::helpers::client();
    let env = [("CHIME_DATA_DIR", data_dir.to_str().unwrap())];
    let receiver = crate::receiver::Receiver::start(vec![], crate::receiver::Answer::status(200)).await;
    let out = chime(&env, &["biz-type", "create", "orders", "--callback-url", &receiver.url], None).await;
    assert!(out.ok, "{}", out.stderr);
    let out = chime(&env, &["token", "create", "--biz-type", "orders"], None).await;
    assert!(out.ok, "{}", out.stderr);
    let token = out.last_line().to_string();
    let tasks = format!("{}/api/v1/tasks", node.address);
    let mut ids = Vec::new();
    for i in 0..20 {
        let task = call(&client, &token, &tasks, Some(json!({"biz_type": "orders", "delay_ms": 2000, "payload": i}))).await;
        ids.push(task["id"].as_str().unwrap().to_string());
    }

    let postmaster = postmaster_pid(&data_dir).unwrap();
    kill(Pid::from_raw(postmaster), Signal::SIGKILL).unwrap();
    let killed = Instant::now();
    let readyz = loop {
        let asked = Instant::now();
        let status = client.get(format!("{}/readyz", node.address)).timeout(Duration::from_secs(30)).send().await.unwrap().status();
        if status == 503 {
            break asked.elapsed();
        }
        assert!(killed.elapsed() < Duration::from_secs(1), "/readyz still answered {status} 1 s after the kill");
    };
    let asked = Instant::now();
    let create = client.post(&tasks).bearer_auth(&token).json(&json!({"biz_type": "orders"})).timeout(Duration::from_secs(30)).send().await.unwrap();
    let create = (create.status().as_u16(), asked.elapsed());
    println!("after the kill: /readyz 503 in {readyz:?} ({:?} after the kill), a create {} in {:?}", killed.elapsed(), create.0, create.1);
    assert!(readyz < Duration::from_secs(1), "/readyz took {readyz:?} to answer 503");
    assert_eq!(create.0, 503);
    assert!(create.1 < Duration::from_secs(1), "a create took {:?} to answer 503", create.1);

    // Back without anyone doing anything, and nothing acknowledged before the kill is lost.
    wait_ready(&node.address).await;
    println!("ready again {:?} after the kill", killed.elapsed());
    assert_ne!(postmaster_pid(&data_dir), Some(postmaster));
    let received = receiver.wait_for(ids.len(), Duration::from_secs(30)).await;
    let delivered: std::collections::HashSet<&str> = received.iter().filter_map(|r| r.header("chime-task-id")).collect();
    let lost: Vec<&String> = ids.iter().filter(|id| !delivered.contains(id.as_str())).collect();
    assert!(lost.is_empty(), "tasks created before the kill not delivered: {lost:?}");
    let log = std::fs::read_to_string(&log_path).unwrap();
    assert!(log.contains("exited unexpectedly; restarting it") && log.contains("is back"), "{log}");

    kill(Pid::from_raw(node.child.id().unwrap() as i32), Signal::SIGTERM).unwrap();
    node.child.wait().await.unwrap();
    std::fs::remove_dir_all(&data_dir).unwrap();
}
