//! The README's "Operating chime" section, held to what a real node does: the Kubernetes
//! example's probes, ports and grace period are tried against a `chime serve` process
//! started with the example's settings.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use chime::biz_types::{self, Settings};
use chime::callback_hosts::CallbackHosts;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::json;

use crate::helpers::{TestApp, client, free_port, fresh_database, wait_ready};
use crate::receiver::{Answer, Receiver};

/// What the test reads from the README's Kubernetes example.
struct Example {
    grace_period_secs: u64,
    env: BTreeMap<String, String>,
    liveness_path: String,
    readiness_path: String,
}

/// The first `yaml` block of the "Operating chime" section, read line by line: the example
/// is written in a few fixed shapes (`- {name: X, value: "Y"}`, `httpGet: {path: /p, …}`),
/// which this reader insists on, so that an edit it cannot follow fails here.
fn kubernetes_example() -> Example {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let section = readme.split("\n## Operating chime\n").nth(1).expect("the README has an \"Operating chime\" section");
    let yaml = section.split("```yaml\n").nth(1).and_then(|s| s.split("```").next()).expect("a yaml block in it");
    let mut grace_period_secs = None;
    let mut env = BTreeMap::new();
    let (mut liveness_path, mut readiness_path) = (None, None);
    let mut probe = "";
    for line in yaml.lines().map(str::trim) {
        if let Some(v) = line.strip_prefix("terminationGracePeriodSeconds:") {
            grace_period_secs = Some(v.trim().parse().unwrap());
        } else if let Some(item) = line.strip_prefix("- {name: ").and_then(|l| l.strip_suffix("\"}")) {
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
    Example {
        grace_period_secs: grace_period_secs.expect("terminationGracePeriodSeconds"),
        env,
        liveness_path: liveness_path.expect("a livenessProbe path"),
        readiness_path: readiness_path.expect("a readinessProbe path"),
    }
}

/// The example's grace period covers chime's own with room for the HTTP server's stop, its
/// probes answer on a node started with its settings, `/metrics` is where it says, and a
/// node told to stop with a callback in flight stops taking traffic at once and exits
/// inside the example's grace period.
#[tokio::test]
async fn the_readmes_kubernetes_example_matches_a_real_node() {
    let example = kubernetes_example();
    let grace: u64 = example.env["CHIME_SHUTDOWN_GRACE_SECS"].parse().unwrap();
    assert!(
        grace + 5 <= example.grace_period_secs,
        "terminationGracePeriodSeconds ({}) must leave 5 s beyond CHIME_SHUTDOWN_GRACE_SECS ({grace})",
        example.grace_period_secs
    );
    assert!(example.env["CHIME_LISTEN"].ends_with(":8080") && example.env["CHIME_METRICS_LISTEN"].ends_with(":9090"));

    // The example's settings, on free loopback ports.
    let (port, metrics_port) = (free_port(), free_port());
    let db_url = fresh_database().await;
    let mut env = example.env.clone();
    env.insert("CHIME_LISTEN".into(), format!("127.0.0.1:{port}"));
    env.insert("CHIME_METRICS_LISTEN".into(), format!("127.0.0.1:{metrics_port}"));
    env.insert("CHIME_ADMIN_PASSWORD".into(), "operating-admin-password".into());
    // The mounted Secret's key: 32 random bytes in base64, as `openssl rand -base64 32` makes.
    let key_file = std::env::temp_dir().join(format!("chime-operating-key-{}", uuid::Uuid::new_v4()));
    std::fs::write(&key_file, STANDARD.encode([7u8; 32])).unwrap();
    assert!(env.contains_key("CHIME_SECRET_KEY_FILE"), "the example mounts the secret key");
    env.insert("CHIME_SECRET_KEY_FILE".into(), key_file.display().to_string());
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_chime"))
        .arg("serve")
        .env("DATABASE_URL", &db_url)
        .env_remove("CHIME_CONFIG")
        .envs(&env)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let address = format!("http://127.0.0.1:{port}");
    wait_ready(&address).await;
    let http = client();
    for path in [&example.liveness_path, &example.readiness_path] {
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
    let readiness = format!("{address}{}", example.readiness_path);
    loop {
        match http.get(&readiness).timeout(Duration::from_secs(1)).send().await {
            Ok(r) if r.status() == 200 => {}
            _ => break,
        }
        assert!(signalled.elapsed() < Duration::from_secs(2), "{readiness} still 200 two seconds after SIGTERM");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let status = tokio::time::timeout(Duration::from_secs(example.grace_period_secs), child.wait())
        .await
        .expect("the node exits inside terminationGracePeriodSeconds")
        .unwrap();
    assert!(status.success(), "a clean stop exits 0: {status}");
    let task: String = sqlx::query_scalar("SELECT status FROM tasks").fetch_one(&pool).await.unwrap();
    assert_eq!(task, "succeeded", "the callback in flight was let finish and recorded");
    std::fs::remove_file(&key_file).unwrap();
}
