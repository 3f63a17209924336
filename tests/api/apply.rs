//! `chime apply -f FILE`: the real binary makes biz types match a TOML file.

use std::path::PathBuf;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::json;

use crate::cli::chime;
use crate::helpers::{TestApp, spawn_app, spawn_node};
use crate::receiver::{Answer, Receiver};

/// A directory of its own for a test's files, removed when dropped.
struct Dir(PathBuf);

impl Dir {
    fn new(test: &str) -> Dir {
        let dir = std::env::temp_dir().join(format!("chime-apply-{test}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        Dir(dir)
    }

    /// Writes a file and returns its path.
    fn write(&self, name: &str, text: &str) -> String {
        let path = self.0.join(name);
        std::fs::write(&path, text).unwrap();
        path.to_str().unwrap().to_string()
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

const TWO: &str = r#"
[biz_types.orders]
description = "Close unpaid orders"
callback_url = "https://orders.example.test/chime"
timeout_ms = 5000
max_attempts = 30
rate_limit = 50

[biz_types.reports]
mode = "pull"
paused = true
"#;

async fn updated_at(app: &TestApp) -> Vec<(String, DateTime<Utc>)> {
    sqlx::query_as("SELECT name, updated_at FROM biz_types ORDER BY name").fetch_all(&app.pool).await.unwrap()
}

async fn audit(app: &TestApp) -> Vec<(String, String)> {
    sqlx::query_as("SELECT action, target FROM audit_log WHERE actor = 'apply' ORDER BY id").fetch_all(&app.pool).await.unwrap()
}

/// The first apply creates both biz types as the file says; a second writes nothing (not
/// even updated_at); a changed field is updated alone and printed old → new; a biz type
/// the file does not name is listed and left alone.
#[tokio::test]
async fn apply_creates_then_changes_nothing_then_updates_one_field() {
    let app = spawn_app().await;
    let env = [("DATABASE_URL", app.db_url.as_str())];
    let dir = Dir::new("cycle");
    assert!(chime(&env, &["biz-type", "create", "legacy", "--callback-url", "https://legacy.test/"], None).await.ok);
    let file = dir.write("chime.toml", TWO);

    let out = chime(&env, &["apply", "-f", &file], None).await;
    assert!(out.ok, "{}", out.stderr);
    for line in [
        "create orders",
        "    timeout_ms: 5000",
        "    rate_limit: 50",
        "create reports",
        "    mode: pull",
        "    paused: true",
        "not in the file (left as is): legacy",
    ] {
        assert!(out.stdout.lines().any(|l| l == line), "no line {line:?} in:\n{}", out.stdout);
    }
    assert_eq!(out.last_line(), "applied: created 2 and updated 0 biz type(s)");
    let orders = chime::biz_types::by_name(&app.pool, "orders").await.unwrap().unwrap();
    assert_eq!(
        (orders.description.as_str(), orders.callback_url.as_str(), orders.mode.as_str(), orders.timeout_ms, orders.max_attempts, orders.rate_limit),
        ("Close unpaid orders", "https://orders.example.test/chime", "callback", 5000, 30, Some(50.0))
    );
    assert!(orders.signing_secret.expose().unwrap().starts_with("whsec_"), "a secret is generated when the file names none");
    let reports = chime::biz_types::by_name(&app.pool, "reports").await.unwrap().unwrap();
    assert_eq!((reports.mode.as_str(), reports.paused), ("pull", true));

    let before = updated_at(&app).await;
    let out = chime(&env, &["apply", "-f", &file], None).await;
    assert!(out.ok, "{}", out.stderr);
    assert_eq!(out.stdout, "unchanged orders\nunchanged reports\nnot in the file (left as is): legacy\nno changes\n");
    assert_eq!(updated_at(&app).await, before, "a second apply writes nothing");

    let file = dir.write("chime.toml", &TWO.replace("timeout_ms = 5000", "timeout_ms = 2500"));
    let out = chime(&env, &["apply", "-f", &file], None).await;
    assert!(out.ok, "{}", out.stderr);
    assert!(out.stdout.contains("update orders\n    timeout_ms: 5000 → 2500\nunchanged reports\n"), "{}", out.stdout);
    assert_eq!(chime::biz_types::by_name(&app.pool, "orders").await.unwrap().unwrap().timeout_ms, 2500);
    let after = updated_at(&app).await;
    assert_ne!(after[1], before[1], "orders was updated");
    assert_eq!((&after[0], &after[2]), (&before[0], &before[2]), "legacy and reports were not");

    let expected = [("biz_type.create", "orders"), ("biz_type.create", "reports"), ("biz_type.update", "orders")];
    let expected: Vec<(String, String)> = expected.iter().map(|(a, t)| (a.to_string(), t.to_string())).collect();
    assert_eq!(audit(&app).await, expected);
}

/// --dry-run prints the same plan and writes nothing; --exit-code says 2 while the
/// database differs from the file and 0 once it matches.
#[tokio::test]
async fn dry_run_prints_the_plan_and_changes_nothing() {
    let app = spawn_app().await;
    let env = [("DATABASE_URL", app.db_url.as_str())];
    let dir = Dir::new("dry-run");
    let file = dir.write("chime.toml", TWO);

    let out = chime(&env, &["apply", "-f", &file, "--dry-run"], None).await;
    assert!(out.ok, "{}", out.stderr);
    assert!(out.stdout.contains("create orders\n") && out.stdout.contains("    timeout_ms: 5000\n"), "{}", out.stdout);
    assert_eq!(out.last_line(), "dry run: would create 2 and update 0 biz type(s); nothing was changed");
    assert!(updated_at(&app).await.is_empty(), "nothing was created");

    let out = chime(&env, &["apply", "-f", &file, "--dry-run", "--exit-code"], None).await;
    assert_eq!(out.code, Some(2), "drift: {}", out.stderr);

    assert!(chime(&env, &["apply", "-f", &file], None).await.ok);
    let before = updated_at(&app).await;
    let changed = dir.write("changed.toml", &TWO.replace("max_attempts = 30", "max_attempts = 3"));
    let out = chime(&env, &["apply", "-f", &changed, "--dry-run", "--exit-code"], None).await;
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(out.stdout.contains("update orders\n    max_attempts: 30 → 3\n"), "{}", out.stdout);
    assert_eq!(updated_at(&app).await, before, "the dry run wrote nothing");
    assert_eq!(chime::biz_types::by_name(&app.pool, "orders").await.unwrap().unwrap().max_attempts, 30);

    let out = chime(&env, &["apply", "-f", &file, "--dry-run", "--exit-code"], None).await;
    assert_eq!((out.code, out.last_line()), (Some(0), "no changes"), "{}", out.stderr);
    assert_eq!(audit(&app).await.len(), 2, "only the real apply is in the audit log");
}

/// One invalid biz type fails the whole apply: every problem of every biz type is listed
/// with its name and field, and nothing is written, not even the valid biz types.
#[tokio::test]
async fn an_invalid_value_fails_the_whole_apply_with_every_problem_listed() {
    let app = spawn_app().await;
    let env = [("DATABASE_URL", app.db_url.as_str())];
    let dir = Dir::new("invalid");
    assert!(chime(&env, &["apply", "-f", &dir.write("chime.toml", TWO)], None).await.ok);
    let before = updated_at(&app).await;

    let bad = format!(
        "{}\n[biz_types.refunds]\ncallback_url = \"ftp://refunds.test/\"\nmax_in_flight = 0\n\n[biz_types.coupons]\ncallback_url = \"https://coupons.test/\"\n",
        TWO.replace("timeout_ms = 5000", "timeout_ms = 2500\nbackoff_initial_ms = 9000\nbackoff_max_ms = 10")
    );
    let out = chime(&env, &["apply", "-f", &dir.write("chime.toml", &bad)], None).await;
    assert!(!out.ok, "{}", out.stdout);
    for problem in [
        "the file has 3 problem(s); nothing was changed",
        "biz type `orders`: backoff_max_ms: must be at least backoff_initial_ms",
        "biz type `refunds`: callback_url: must be an http:// or https:// URL",
        "biz type `refunds`: max_in_flight: must be between 1 and 100000",
    ] {
        assert!(out.stderr.contains(problem), "no {problem:?} in:\n{}", out.stderr);
    }
    assert_eq!(updated_at(&app).await, before, "nothing written: orders kept its timeout, coupons was not created");
    assert_eq!(chime::biz_types::by_name(&app.pool, "orders").await.unwrap().unwrap().timeout_ms, 5000);
    assert_eq!(audit(&app).await.len(), 2);
}

/// A secret referenced from the environment signs the callbacks and is never printed; one
/// from a file (relative to the TOML file) replaces it, and the next callback is signed
/// with that; a variable that is not set is named.
#[tokio::test]
async fn a_referenced_secret_signs_callbacks_and_is_never_printed() {
    let app = spawn_node().await;
    let receiver = Receiver::start(vec![], Answer::status(200)).await;
    let dir = Dir::new("secret");
    let from_env = "env-secret-3f9a7c2e51d84b06";
    let from_file = "file-secret-8d1e4a7b93c25f60";
    let file = dir
        .write("chime.toml", &format!("[biz_types.orders]\ncallback_url = \"{}\"\nsigning_secret = {{ env = \"ORDERS_SECRET\" }}\n", receiver.url));
    let env = [("DATABASE_URL", app.db_url.as_str()), ("ORDERS_SECRET", from_env)];

    let out = chime(&env, &["apply", "-f", &file], None).await;
    assert!(out.ok, "{}", out.stderr);
    assert!(out.stdout.contains("    signing_secret: from environment variable ORDERS_SECRET\n"), "{}", out.stdout);
    assert!(!out.stdout.contains(from_env) && !out.stderr.contains(from_env), "the secret is never printed");
    let token = chime::biz_types::create_token(&app.pool, "orders").await.unwrap();
    app.create_task(&token, json!({"biz_type": "orders"})).await;
    assert_signed_with(&receiver, 1, from_env).await;

    let again = chime(&env, &["apply", "-f", &file], None).await;
    assert_eq!(again.last_line(), "no changes", "the same secret is no change: {}", again.stdout);

    dir.write("orders.secret", &format!("{from_file}\n"));
    let file =
        dir.write("chime.toml", &std::fs::read_to_string(&file).unwrap().replace("{ env = \"ORDERS_SECRET\" }", "{ file = \"orders.secret\" }"));
    let out = chime(&env, &["apply", "-f", &file], None).await;
    assert!(out.ok, "{}", out.stderr);
    assert!(out.stdout.contains("update orders\n    signing_secret: changed (from file "), "{}", out.stdout);
    assert!(!out.stdout.contains(from_file) && !out.stdout.contains(from_env), "{}", out.stdout);
    app.create_task(&token, json!({"biz_type": "orders"})).await;
    assert_signed_with(&receiver, 2, from_file).await;
    let actions: Vec<String> = audit(&app).await.into_iter().map(|(action, _)| action).collect();
    assert_eq!(actions, ["biz_type.create", "biz_type.set_secret"]);

    let unset = dir.write("unset.toml", "[biz_types.orders]\nsigning_secret = { env = \"NO_SUCH_SECRET_VARIABLE\" }\n");
    let out = chime(&env, &["apply", "-f", &unset], None).await;
    assert!(
        !out.ok && out.stderr.contains("biz type `orders`: signing_secret: environment variable NO_SUCH_SECRET_VARIABLE is not set"),
        "{}",
        out.stderr
    );
}

/// Waits for the n-th callback and checks its signature with `secret`.
async fn assert_signed_with(receiver: &Receiver, n: usize, secret: &str) {
    let received = receiver.wait_for(n, Duration::from_secs(20)).await;
    assert!(received.len() >= n, "callback {n} did not arrive");
    let request = &received[n - 1];
    let signature = request.header("chime-signature").unwrap();
    let t: i64 = signature.strip_prefix("t=").unwrap().split(',').next().unwrap().parse().unwrap();
    assert_eq!(signature, chime::engine::signature(secret, t, &request.body), "callback {n} is signed with the file's secret");
}

/// An unknown key is refused with its name and line, and nothing is written.
#[tokio::test]
async fn an_unknown_key_is_named_with_its_line() {
    let app = spawn_app().await;
    let env = [("DATABASE_URL", app.db_url.as_str())];
    let dir = Dir::new("unknown-key");
    let file = dir.write("chime.toml", "[biz_types.orders]\ncallback_url = \"https://o.test/\"\ntimeout = 5000\n");
    let out = chime(&env, &["apply", "-f", &file], None).await;
    assert!(!out.ok);
    assert!(out.stderr.contains("line 3: unknown field `timeout`"), "{}", out.stderr);
    assert!(updated_at(&app).await.is_empty());

    let help = chime(&[], &["apply", "--help"], None).await;
    assert!(help.stdout.contains("[biz_types.orders]") && help.stdout.contains("Chime as code"), "{}", help.stdout);
}

/// A secret `{ file = ... }` that is not a regular file, or longer than a secret can be, is
/// refused at once with the file named, and nothing is written: `/dev/zero` is not read
/// without end, a FIFO with no writer is not waited on.
#[tokio::test]
async fn a_secret_file_that_is_not_a_regular_file_or_too_long_is_refused_at_once() {
    let app = spawn_app().await;
    let env = [("DATABASE_URL", app.db_url.as_str())];
    let dir = Dir::new("secret-file");
    let fifo = dir.0.join("orders.fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    dir.write("long.secret", &"s".repeat(5000));
    let mut wrong = Vec::new();
    for (source, says) in [
        ("/dev/zero".to_string(), "/dev/zero is not a regular file (a character device)".to_string()),
        (fifo.display().to_string(), format!("{} is not a regular file (a FIFO)", fifo.display())),
        ("long.secret".into(), format!("{} is longer than a signing secret can be (1000 bytes)", dir.0.join("long.secret").display())),
    ] {
        let file =
            dir.write("chime.toml", &format!("[biz_types.orders]\ncallback_url = \"https://o.test/\"\nsigning_secret = {{ file = \"{source}\" }}\n"));
        let started = std::time::Instant::now();
        let out = tokio::time::timeout(Duration::from_secs(5), chime(&env, &["apply", "-f", &file], None)).await;
        println!("{source}: {:?}: {}", started.elapsed(), out.as_ref().map_or("still running after 5 s", |o| o.stderr.as_str()));
        match out {
            Err(_) => wrong.push(format!("{source}: still running after 5 s")),
            Ok(out) if out.ok || !out.stderr.contains(&format!("biz type `orders`: signing_secret: {says}")) => {
                wrong.push(format!("{source}: {}", out.stderr))
            }
            Ok(_) => {}
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
    assert!(updated_at(&app).await.is_empty(), "nothing was written");

    // The file itself, named by mistake, is read only so far. Before: read until memory ran out.
    let started = std::time::Instant::now();
    let out = tokio::time::timeout(Duration::from_secs(10), chime(&env, &["apply", "-f", "/dev/zero"], None)).await;
    println!("apply -f /dev/zero: {:?}: {}", started.elapsed(), out.as_ref().map_or("still running after 10 s", |o| o.stderr.as_str()));
    let out = out.expect("chime apply -f /dev/zero still running after 10 s");
    assert!(!out.ok && out.stderr.contains("/dev/zero is longer than 16 MiB"), "{}", out.stderr);
}

/// The per-key limits are settings like the others: applied, planned, and refused by the
/// same rule, naming the field.
#[tokio::test]
async fn flow_limits_are_applied_and_checked() {
    let app = spawn_app().await;
    let env = [("DATABASE_URL", app.db_url.as_str())];
    let dir = Dir::new("flows");
    let file = format!("{TWO}\n[biz_types.payouts]\ncallback_url = \"https://payouts.test/\"\nflow_max_in_flight = 3\nordered = true\n");
    let out = chime(&env, &["apply", "-f", &dir.write("chime.toml", &file)], None).await;
    assert!(out.ok, "{}", out.stderr);
    let payouts = chime::biz_types::by_name(&app.pool, "payouts").await.unwrap().unwrap();
    assert_eq!((payouts.flow_max_in_flight, payouts.ordered), (3, true));
    let out = chime(&env, &["apply", "-f", &dir.write("chime.toml", &file.replace("flow_max_in_flight = 3", "flow_max_in_flight = -1"))], None).await;
    assert!(!out.ok && out.stderr.contains("biz type `payouts`: flow_max_in_flight: must be between 0 and 100000"), "{}", out.stderr);
}

/// A biz type's weight is applied, planned old → new, and refused outside 1-100 by the same
/// rule as everywhere, naming the field; a weight that is not a whole number is refused as
/// the file is read, naming its line (line 15: `weight = 3` in the file below).
#[tokio::test]
async fn weight_is_applied_and_checked() {
    let app = spawn_app().await;
    let env = [("DATABASE_URL", app.db_url.as_str())];
    let dir = Dir::new("weight");
    let file = format!("{TWO}\n[biz_types.payouts]\ncallback_url = \"https://payouts.test/\"\nweight = 3\n");
    let out = chime(&env, &["apply", "-f", &dir.write("chime.toml", &file)], None).await;
    assert!(out.ok && out.stdout.lines().any(|l| l == "    weight: 3"), "{}{}", out.stdout, out.stderr);
    assert!(out.stdout.contains("create orders\n") && out.stdout.lines().any(|l| l == "    weight: 1"), "the default is planned too: {}", out.stdout);
    assert_eq!((weight(&app, "payouts").await, weight(&app, "orders").await), (3, 1));
    let out = chime(&env, &["apply", "-f", &dir.write("chime.toml", &file.replace("weight = 3", "weight = 100"))], None).await;
    assert!(out.ok && out.stdout.contains("update payouts\n    weight: 3 → 100\n"), "{}{}", out.stdout, out.stderr);
    assert_eq!(weight(&app, "payouts").await, 100);
    for bad in ["0", "-1", "101"] {
        let out = chime(&env, &["apply", "-f", &dir.write("chime.toml", &file.replace("weight = 3", &format!("weight = {bad}")))], None).await;
        assert!(!out.ok && out.stderr.contains("biz type `payouts`: weight: must be between 1 and 100"), "weight {bad}: {}", out.stderr);
    }
    for bad in ["1.5", "\"3\""] {
        let out = chime(&env, &["apply", "-f", &dir.write("chime.toml", &file.replace("weight = 3", &format!("weight = {bad}")))], None).await;
        assert!(
            !out.ok && out.stderr.contains("chime.toml: line 15: invalid type: ") && out.stderr.contains("expected i32"),
            "weight {bad}: {}",
            out.stderr
        );
    }
    assert_eq!(weight(&app, "payouts").await, 100, "nothing refused was stored");
}

async fn weight(app: &TestApp, name: &str) -> i32 {
    chime::biz_types::by_name(&app.pool, name).await.unwrap().unwrap().weight
}

/// The chat settings are applied and checked like the others: the secret read from the
/// environment, never printed, the same secret no change; a secret for WeCom and a DingTalk
/// secret without `SEC` are refused naming `chat_secret`, and a change of platform without a
/// secret drops it.
#[tokio::test]
async fn chat_settings_are_applied_and_checked() {
    let app = spawn_app().await;
    let dir = Dir::new("chat");
    let secret = "SECd41d8cd98f00b204e9800998ecf8427e";
    let env = [("DATABASE_URL", app.db_url.as_str()), ("ALERTS_CHAT_SECRET", secret), ("BAD_CHAT_SECRET", "d41d8cd98f00")];
    let file = "[biz_types.alerts]\nmode = \"pull\"\nchat_platform = \"dingtalk\"\nchat_url = \"https://oapi.dingtalk.test/robot/send?access_token=t\"\nchat_secret = { env = \"ALERTS_CHAT_SECRET\" }\n";
    let path = dir.write("chime.toml", file);
    let out = chime(&env, &["apply", "-f", &path], None).await;
    assert!(out.ok, "{}", out.stderr);
    assert!(out.stdout.lines().any(|l| l == "    chat_platform: dingtalk"), "{}", out.stdout);
    assert!(out.stdout.contains("    chat_secret: set (from environment variable ALERTS_CHAT_SECRET)\n"), "{}", out.stdout);
    assert!(!out.stdout.contains(secret) && !out.stderr.contains(secret), "the secret is never printed");
    let stored = chime::biz_types::by_name(&app.pool, "alerts").await.unwrap().unwrap();
    assert_eq!(stored.chat_secret.secret.unwrap().expose().unwrap(), secret);
    let again = chime(&env, &["apply", "-f", &path], None).await;
    assert_eq!(again.last_line(), "no changes", "the same secret is no change: {}", again.stdout);

    let bad = chime(&env, &["apply", "-f", &dir.write("chime.toml", &file.replace("ALERTS_CHAT_SECRET", "BAD_CHAT_SECRET"))], None).await;
    assert!(!bad.ok && bad.stderr.contains("biz type `alerts`: chat_secret: a DingTalk robot's secret starts with `SEC`"), "{}", bad.stderr);
    let wecom = file.replace("\"dingtalk\"", "\"wecom\"");
    let bad = chime(&env, &["apply", "-f", &dir.write("chime.toml", &wecom)], None).await;
    assert!(!bad.ok && bad.stderr.contains("biz type `alerts`: chat_secret: wecom robots are not signed"), "{}", bad.stderr);
    let without = wecom.lines().filter(|l| !l.starts_with("chat_secret")).collect::<Vec<_>>().join("\n");
    let out = chime(&env, &["apply", "-f", &dir.write("chime.toml", &without)], None).await;
    assert!(out.ok && out.stdout.contains("    chat_platform: dingtalk → wecom\n"), "{}{}", out.stdout, out.stderr);
    assert!(out.stdout.contains("    chat_secret: removed (the chat_platform changed)\n"), "{}", out.stdout);
    let stored = chime::biz_types::by_name(&app.pool, "alerts").await.unwrap().unwrap();
    assert!(stored.chat_secret.secret.is_none() && stored.chat_platform.as_deref() == Some("wecom"));
}
