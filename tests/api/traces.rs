//! OpenTelemetry traces (docs/book/src/traces.md): a real `chime serve` exporting over
//! OTLP/HTTP to a receiver that decodes with the OpenTelemetry project's own protobuf
//! definitions (tests/otlp/receiver.py, PyPI's `opentelemetry-proto` in target/otlp-venv,
//! installed by tests/setup.sh).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use chime::biz_types::{self, Settings};
use chime::callback_hosts::CallbackHosts;
use chime::config::ServeArgs;
use serde_json::{Value, json};
use tokio::io::AsyncBufReadExt;

use crate::helpers::{TestApp, chime_node, chime_process_logging, free_port, spawn_app_with, wait_until};
use crate::receiver::{Answer, Receiver};

/// The OTLP receiver, a child process: killed when dropped.
struct Collector {
    /// Its base URL, for OTEL_EXPORTER_OTLP_ENDPOINT.
    url: String,
    /// Where it writes each span it decoded, a JSON object a line.
    out: PathBuf,
    _child: tokio::process::Child,
}

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

impl Collector {
    async fn start() -> Collector {
        let out = std::env::temp_dir().join(format!("chime-otlp-{}-{}.jsonl", std::process::id(), uuid::Uuid::new_v4()));
        let python = root().join("target/otlp-venv/bin/python");
        assert!(python.exists(), "{} is missing: run tests/setup.sh, which installs opentelemetry-proto there", python.display());
        let mut child = tokio::process::Command::new(python)
            .arg(root().join("tests/otlp/receiver.py"))
            .arg(&out)
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
        let port = tokio::time::timeout(Duration::from_secs(30), lines.next_line()).await.expect("the receiver's port within 30 s").unwrap().unwrap();
        Collector { url: format!("http://127.0.0.1:{}", port.trim()), out, _child: child }
    }

    /// The spans received so far.
    fn spans(&self) -> Vec<Value> {
        let text = std::fs::read_to_string(&self.out).unwrap_or_default();
        text.lines().map(|line| serde_json::from_str(line).unwrap()).collect()
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.out);
    }
}

/// A database with a biz type `traced` calling back `receiver`, quickly retried; its token.
async fn traced_biz_type(receiver: &Receiver) -> (TestApp, String) {
    // This process only holds the database: the node under test is a `chime serve` process.
    let app = spawn_app_with(ServeArgs { engine: false, ..Default::default() }).await;
    let settings = Settings { callback_url: Some(receiver.url.clone()), backoff_initial_ms: Some(100), max_attempts: Some(3), ..Default::default() };
    biz_types::create(&app.pool, "traced", &settings, CallbackHosts::Any).await.unwrap();
    let token = biz_types::create_token(&app.pool, "traced").await.unwrap();
    (app, token)
}

fn attribute<'a>(span: &'a Value, key: &str) -> &'a Value {
    &span["attributes"][key]
}

/// A task created with a `traceparent`: the create's server span, and for each of its two
/// attempts (500, then 200) a claim span, a client span and a record span, all children of
/// the creator's span in its trace, with their attributes; each callback's `traceparent`
/// names its attempt's span. A task created without one: its claim span is a root, and its
/// attempt and record are the claim's children.
#[tokio::test]
async fn a_tasks_claim_attempts_and_records_are_spans_in_the_creators_trace() {
    let receiver = Receiver::start(vec![Answer::status(500)], Answer::status(200)).await;
    let (app, token) = traced_biz_type(&receiver).await;
    let collector = Collector::start().await;
    let (_node, address) = chime_node(&app.db_url, &[("OTEL_EXPORTER_OTLP_ENDPOINT", &collector.url), ("OTEL_BSP_SCHEDULE_DELAY", "100")]).await;

    let (trace, creator) = ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7");
    let created = reqwest::Client::new()
        .post(format!("{address}/api/v1/tasks"))
        .bearer_auth(&token)
        .header("traceparent", format!("00-{trace}-{creator}-01"))
        .json(&json!({"biz_type": "traced", "key": "order-1", "payload": {}}))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 201);
    let id = created.json::<Value>().await.unwrap()["id"].as_str().unwrap().to_string();

    let spans = wait_until("the create's span and two attempts' claim, callback and record spans", Duration::from_secs(30), || async {
        let spans: Vec<Value> = collector.spans().into_iter().filter(|s| s["trace_id"] == trace).collect();
        (spans.len() >= 7).then_some(spans)
    })
    .await;
    assert_eq!(spans.len(), 7, "{spans:#?}");
    for span in &spans {
        assert_eq!(span["parent_span_id"], creator, "every span is a child of the creator's: {span}");
        assert_eq!(span["service"], "chime", "{span}");
        assert_eq!(span["scope"], "chime", "{span}");
        assert!(span["start_ns"].as_u64().unwrap() <= span["end_ns"].as_u64().unwrap(), "{span}");
        if span["name"] != "POST /api/v1/tasks" {
            assert_eq!(attribute(span, "chime.task.id"), id.as_str(), "{span}");
            assert_eq!(attribute(span, "chime.task.key"), "order-1", "{span}");
            assert_eq!(attribute(span, "chime.biz_type"), "traced", "{span}");
        }
    }
    let named = |name: &str| spans.iter().filter(|s| s["name"] == name).collect::<Vec<_>>();
    let create = named("POST /api/v1/tasks");
    assert_eq!(create.len(), 1, "{spans:#?}");
    assert_eq!(create[0]["kind"], "SPAN_KIND_SERVER");
    assert_eq!(attribute(create[0], "http.response.status_code"), 201);
    assert_eq!(attribute(create[0], "http.route"), "/api/v1/tasks");
    assert_eq!(attribute(create[0], "chime.task.id"), id.as_str());
    assert_eq!(attribute(create[0], "chime.biz_type"), "traced");

    let received = receiver.received();
    for (attempt, status, outcome) in [(1, 500, "retry"), (2, 200, "delivered")] {
        let of_attempt = |name: &str| {
            let found: Vec<&Value> = named(name).into_iter().filter(|s| attribute(s, "chime.task.attempt") == attempt).collect();
            assert_eq!(found.len(), 1, "one {name} span of attempt {attempt}: {spans:#?}");
            found[0]
        };
        let (claim, call, record) = (of_attempt("claim"), of_attempt("POST"), of_attempt("record"));
        assert_eq!(claim["kind"], "SPAN_KIND_INTERNAL");
        assert_eq!(call["kind"], "SPAN_KIND_CLIENT");
        assert_eq!(attribute(call, "http.request.method"), "POST");
        assert_eq!(attribute(call, "url.full"), receiver.url.as_str());
        assert_eq!(attribute(call, "http.response.status_code"), status);
        assert_eq!(call["status"], if status == 200 { "STATUS_CODE_UNSET" } else { "STATUS_CODE_ERROR" }, "{call}");
        assert_eq!(record["kind"], "SPAN_KIND_INTERNAL");
        assert_eq!(attribute(record, "chime.outcome"), outcome);
        assert_eq!(attribute(record, "http.response.status_code"), status);
        // The claim, then the callback, then its record.
        let (at, ends) = (|s: &Value| s["start_ns"].as_u64().unwrap(), |s: &Value| s["end_ns"].as_u64().unwrap());
        assert!(ends(claim) <= at(call) && ends(call) <= ends(record), "claim {claim}\ncall {call}\nrecord {record}");
        // The callback names its attempt's span as its parent.
        let callback = received.iter().find(|r| r.header("chime-attempt") == Some(&attempt.to_string())).expect("the callback");
        assert_eq!(callback.header("traceparent"), Some(format!("00-{trace}-{}-01", call["span_id"].as_str().unwrap()).as_str()));
    }

    // Without a traceparent: a trace per claim, rooted at the claim.
    let untraced = reqwest::Client::new()
        .post(format!("{address}/api/v1/tasks"))
        .bearer_auth(&token)
        .json(&json!({"biz_type": "traced", "key": "order-2", "payload": {}}))
        .send()
        .await
        .unwrap();
    assert_eq!(untraced.status(), 201);
    let of_task = |spans: &[Value], name: &str| spans.iter().find(|s| s["name"] == name && attribute(s, "chime.task.key") == "order-2").cloned();
    let (claim, call, record) = wait_until("the untraced task's claim, callback and record spans", Duration::from_secs(30), || async {
        let spans = collector.spans();
        Some((of_task(&spans, "claim")?, of_task(&spans, "POST")?, of_task(&spans, "record")?))
    })
    .await;
    assert_eq!(claim["parent_span_id"], "", "the claim is the root: {claim}");
    for span in [&call, &record] {
        assert_eq!(span["trace_id"], claim["trace_id"], "{span}");
        assert_eq!(span["parent_span_id"], claim["span_id"], "{span}");
    }
    let callback = receiver.received().into_iter().find(|r| r.json()["key"] == "order-2").unwrap();
    assert_eq!(
        callback.header("traceparent"),
        Some(format!("00-{}-{}-01", call["trace_id"].as_str().unwrap(), call["span_id"].as_str().unwrap()).as_str())
    );
}

/// Deliveries go on at full speed while the collector is down: 300 tasks due at once are
/// delivered by a node exporting to a closed port, and by one exporting to a collector that
/// accepts connections and never answers, as fast as by one with traces off (within a
/// generous margin for a shared machine); the node with the closed port says in its log
/// that the export failed.
#[tokio::test]
async fn deliveries_go_on_at_full_speed_when_the_collector_is_down() {
    const TASKS: usize = 300;
    let closed = format!("http://127.0.0.1:{}", free_port());
    // The kernel completes its connections; nothing reads them or answers.
    let hung_listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let hung = format!("http://{}", hung_listener.local_addr().unwrap());
    let mut took = Vec::new();
    for (collector, endpoint) in [("traces off", None), ("a closed port", Some(&closed)), ("a collector that never answers", Some(&hung))] {
        let receiver = Receiver::start(vec![], Answer::status(200)).await;
        let (app, token) = traced_biz_type(&receiver).await;
        let log_path = std::env::temp_dir().join(format!("chime-otlp-down-{}-{}.log", std::process::id(), uuid::Uuid::new_v4()));
        let env: Vec<(&str, &str)> = match endpoint {
            Some(url) => vec![("OTEL_EXPORTER_OTLP_ENDPOINT", url.as_str()), ("OTEL_BSP_SCHEDULE_DELAY", "100")],
            None => vec![],
        };
        let (_node, _) = chime_process_logging(&app.db_url, &env, std::fs::File::create(&log_path).unwrap()).await;
        let tasks: Vec<Value> = (0..TASKS).map(|i| json!({"biz_type": "traced", "payload": {"i": i}})).collect();
        let started = Instant::now();
        assert_eq!(app.post("/api/v1/tasks/batch", &token, json!({"tasks": tasks})).await.status, 200);
        receiver.wait_for(TASKS, Duration::from_secs(60)).await;
        took.push((collector, started.elapsed()));
        assert_eq!(receiver.received().len(), TASKS, "every task delivered with {collector}");
        if endpoint == Some(&closed) {
            let log = wait_until("the failed export in the node's log", Duration::from_secs(20), || async {
                let log = std::fs::read_to_string(&log_path).unwrap();
                log.contains("BatchSpanProcessor.ExportError").then_some(log)
            })
            .await;
            assert!(log.contains("exporting traces over OTLP/HTTP"), "{log}");
        }
        let _ = std::fs::remove_file(&log_path);
    }
    println!("{TASKS} tasks delivered: {took:?}");
    let off = took[0].1;
    for (collector, down) in &took[1..] {
        assert!(*down < off * 2 + Duration::from_secs(1), "{collector} slowed deliveries: {down:?} against {off:?} with traces off");
    }
}

/// A malformed OTLP endpoint stops a node at start, with an error naming the variable.
#[tokio::test]
async fn a_malformed_endpoint_is_refused_at_start_naming_the_variable() {
    for (var, bad) in [("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4318"), ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")] {
        let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_chime"))
            .args(["serve", "--listen", "127.0.0.1:0"])
            .env("DATABASE_URL", "postgres://127.0.0.1:9/none")
            .env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
            .env(var, bad)
            .env_remove("CHIME_CONFIG")
            .output()
            .await
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(stderr.contains(&format!("error: {var}: `{bad}`")), "{stderr}");
    }
}
