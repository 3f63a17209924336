//! The Kubernetes manifests (deploy/kubernetes/), which the README's "Operating chime"
//! section points to, held to what a real node does: the Deployment's init container, probes,
//! ports and grace period are tried against `chime` processes started with its settings.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use chime::biz_types::{self, Settings};
use chime::callback_hosts::CallbackHosts;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::json;

use crate::helpers::{TestApp, client, empty_database, free_port, wait_ready};
use crate::receiver::{Answer, Receiver};

const MANIFESTS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/kubernetes");

/// What the test reads from the Deployment.
struct Deployment {
    grace_period_secs: u64,
    /// The init container's arguments to chime: what runs before each node starts.
    init_args: Vec<String>,
    /// The chime container's arguments, settings and probes.
    args: Vec<String>,
    env: BTreeMap<String, String>,
    liveness_path: String,
    readiness_path: String,
}

/// `args: ["a", "b"]`, as the manifests write them.
fn args(line: &str) -> Option<Vec<String>> {
    let list = line.strip_prefix("args: [")?.strip_suffix(']')?;
    Some(list.split(',').map(|a| a.trim().trim_matches('"').to_string()).collect())
}

/// deploy/kubernetes/deployment.yaml, read line by line: it is written in a few fixed shapes
/// (`- {name: X, value: "Y"}`, `httpGet: {path: /p, …}`, `args: [...]`), which this reader
/// insists on, so that an edit it cannot follow fails here. What follows `initContainers:` is
/// the init container's, what follows `containers:` the node's.
fn kubernetes_deployment() -> Deployment {
    let yaml = std::fs::read_to_string(format!("{MANIFESTS}/deployment.yaml")).unwrap();
    let mut grace_period_secs = None;
    let (mut init_args, mut node_args) = (None, None);
    let mut env = BTreeMap::new();
    let (mut liveness_path, mut readiness_path) = (None, None);
    let (mut section, mut probe) = ("", "");
    for line in yaml.lines().map(str::trim) {
        if let Some(v) = line.strip_prefix("terminationGracePeriodSeconds:") {
            grace_period_secs = Some(v.trim().parse().unwrap());
        } else if matches!(line, "initContainers:" | "containers:" | "volumes:") {
            section = line;
        } else if let Some(a) = args(line) {
            match section {
                "initContainers:" => init_args = Some(a),
                "containers:" => node_args = Some(a),
                other => panic!("args under {other:?}"),
            }
        } else if let Some(item) = line.strip_prefix("- {name: ").and_then(|l| l.strip_suffix("\"}")) {
            assert_eq!(section, "containers:", "settings with a value are the node's only: {line}");
            let (name, value) = item.split_once(", value: \"").expect("env items as {name: X, value: \"Y\"}");
            env.insert(name.to_string(), value.to_string());
        } else if line.ends_with("Probe:") {
            probe = line;
        } else if let Some(rest) = line.strip_prefix("httpGet: {path: ") {
            let path = rest.split(',').next().unwrap().to_string();
            match probe {
                "livenessProbe:" => liveness_path = Some(path),
                "readinessProbe:" => readiness_path = Some(path),
                other => panic!("httpGet under {other:?}"),
            }
        }
    }
    Deployment {
        grace_period_secs: grace_period_secs.expect("terminationGracePeriodSeconds"),
        init_args: init_args.expect("an init container with args"),
        args: node_args.expect("a container with args"),
        env,
        liveness_path: liveness_path.expect("a livenessProbe path"),
        readiness_path: readiness_path.expect("a readinessProbe path"),
    }
}

/// The Deployment's grace period covers chime's own with room for the HTTP server's stop; its
/// init container (the migration Job's command) makes an empty database fit for a node that
/// does not migrate; its probes answer on a node started with its settings, `/metrics` is
/// where it says, and a node told to stop with a callback in flight stops taking traffic at
/// once and exits inside the grace period.
#[tokio::test]
async fn the_kubernetes_manifests_match_a_real_node() {
    let deployment = kubernetes_deployment();
    let grace: u64 = deployment.env["CHIME_SHUTDOWN_GRACE_SECS"].parse().unwrap();
    assert!(
        grace + 5 <= deployment.grace_period_secs,
        "terminationGracePeriodSeconds ({}) must leave 5 s beyond CHIME_SHUTDOWN_GRACE_SECS ({grace})",
        deployment.grace_period_secs
    );
    let env = &deployment.env;
    assert!(env["CHIME_LISTEN"].ends_with(":8080") && env["CHIME_METRICS_LISTEN"].ends_with(":9090"));
    assert_eq!(deployment.args, ["serve"]);
    assert_eq!(env["CHIME_AUTO_MIGRATE"], "false", "the Job and the init container migrate, not the nodes");
    let job = std::fs::read_to_string(format!("{MANIFESTS}/migrate-job.yaml")).unwrap();
    let job_args = job.lines().find_map(|l| args(l.trim())).expect("the Job's args");
    assert_eq!(job_args, deployment.init_args, "the Job runs what the init container runs");

    // A first rollout: the init container runs on an empty database, with only its URL.
    let db_url = empty_database().await;
    let init = tokio::process::Command::new(env!("CARGO_BIN_EXE_chime"))
        .args(&deployment.init_args)
        .env("DATABASE_URL", &db_url)
        .env_remove("CHIME_CONFIG")
        .output()
        .await
        .unwrap();
    assert!(init.status.success(), "the init container failed: {}", String::from_utf8_lossy(&init.stderr));

    // The node's settings, on free loopback ports.
    let (port, metrics_port) = (free_port(), free_port());
    let mut env = deployment.env.clone();
    env.insert("CHIME_LISTEN".into(), format!("127.0.0.1:{port}"));
    env.insert("CHIME_METRICS_LISTEN".into(), format!("127.0.0.1:{metrics_port}"));
    // DATABASE_URL and the admin password come from the Secret, as does the mounted key.
    env.insert("CHIME_ADMIN_PASSWORD".into(), "operating-admin-password".into());
    // The mounted Secret's key: 32 random bytes in base64, as `openssl rand -base64 32` makes.
    let key_file = std::env::temp_dir().join(format!("chime-operating-key-{}", uuid::Uuid::new_v4()));
    std::fs::write(&key_file, STANDARD.encode([7u8; 32])).unwrap();
    assert!(env.contains_key("CHIME_SECRET_KEY_FILE"), "the Deployment mounts the secret key");
    env.insert("CHIME_SECRET_KEY_FILE".into(), key_file.display().to_string());
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_chime"))
        .args(&deployment.args)
        .env("DATABASE_URL", &db_url)
        .env_remove("CHIME_CONFIG")
        .envs(&env)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let address = format!("http://127.0.0.1:{port}");
    // A node that refuses to start (a schema the init container left behind) says so at once.
    tokio::select! {
        () = wait_ready(&address) => {}
        status = child.wait() => panic!("the node exited before it was ready: {status:?}"),
    }
    let http = client();
    for path in [&deployment.liveness_path, &deployment.readiness_path] {
        let status = http.get(format!("{address}{path}")).send().await.unwrap().status();
        assert_eq!(status, 200, "{path} on a ready node");
    }
    let metrics = http.get(format!("http://127.0.0.1:{metrics_port}/metrics")).send().await.unwrap();
    assert_eq!(metrics.status(), 200, "/metrics on CHIME_METRICS_LISTEN");
    assert_eq!(http.get(format!("{address}/metrics")).send().await.unwrap().status(), 404, "/metrics off the API's port");

    // A callback that takes 3 s is in flight when the node is told to stop.
    let pool = chime::db::connect(&db_url, 2).await.unwrap();
    let receiver = Receiver::start(vec![], Answer { delay: Duration::from_secs(3), ..Answer::status(200) }).await;
    let settings = Settings { callback_url: Some(receiver.url.clone()), ..Default::default() };
    biz_types::create(&pool, "orders", &settings, CallbackHosts::Any).await.unwrap();
    let token = biz_types::create_token(&pool, "orders").await.unwrap();
    let node = TestApp { address: address.clone(), pool: pool.clone(), db_url, client: http.clone() };
    node.create_task(&token, json!({"biz_type": "orders", "payload": {}})).await;
    receiver.wait_for(1, Duration::from_secs(20)).await;

    let signalled = Instant::now();
    kill(Pid::from_raw(child.id().unwrap() as i32), Signal::SIGTERM).unwrap();
    // Ready no more within a probe period: 503, or the listener already closed.
    let readiness = format!("{address}{}", deployment.readiness_path);
    loop {
        match http.get(&readiness).timeout(Duration::from_secs(1)).send().await {
            Ok(r) if r.status() == 200 => {}
            _ => break,
        }
        assert!(signalled.elapsed() < Duration::from_secs(2), "{readiness} still 200 two seconds after SIGTERM");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let status = tokio::time::timeout(Duration::from_secs(deployment.grace_period_secs), child.wait())
        .await
        .expect("the node exits inside terminationGracePeriodSeconds")
        .unwrap();
    assert!(status.success(), "a clean stop exits 0: {status}");
    let task: String = sqlx::query_scalar("SELECT status FROM tasks").fetch_one(&pool).await.unwrap();
    assert_eq!(task, "succeeded", "the callback in flight was let finish and recorded");
    std::fs::remove_file(&key_file).unwrap();
}
