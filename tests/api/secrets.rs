//! Secrets at rest: signing secrets encrypted with CHIME_SECRET_KEY, `chime secrets
//! reencrypt`, nodes that lack the key, and the first start's credentials kept out of stdout
//! when it is not a terminal. Real `chime` processes on a test database.

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use chime::db::Pool;
use serde_json::json;

use crate::cli::{Output, chime};
use crate::helpers::{TestApp, chime_node, chime_process_logging, client, free_port, fresh_database, wait_ready, wait_until};
use crate::receiver::{Answer, Receiver};

/// A key as an operator makes one: 32 random bytes in base64 (here, fixed bytes).
fn key(byte: u8) -> String {
    STANDARD.encode([byte; 32])
}

/// The stored forms of the biz type's secret: (in clear, sealed).
async fn stored(pool: &Pool, name: &str) -> (Option<String>, Option<String>) {
    sqlx::query_as("SELECT signing_secret, signing_secret_sealed FROM biz_types WHERE name = $1").bind(name).fetch_one(pool).await.unwrap()
}

/// Runs `chime serve` that is expected to refuse to start; its output.
async fn serve_refused(env: &[(&str, &str)]) -> Output {
    let mut env = env.to_vec();
    env.extend([("CHIME_LISTEN", "127.0.0.1:0"), ("CHIME_ADMIN_PASSWORD", "secrets-admin-password")]);
    let out = tokio::time::timeout(Duration::from_secs(60), chime(&env, &["serve"], None))
        .await
        .expect("chime serve started (or hung) instead of refusing to");
    assert!(!out.ok, "chime serve exited successfully: {}", out.stderr);
    out
}

/// Creates a task on the node and checks that its callback arrives signed with `secret`.
async fn delivered_signed_with(node: &TestApp, token: &str, receiver: &Receiver, secret: &str) {
    let before = receiver.received().len();
    node.create_task(token, json!({"biz_type": "orders", "payload": {"n": before}})).await;
    let received = receiver.wait_for(before + 1, Duration::from_secs(30)).await;
    let request = received.last().expect("a callback");
    let signature = request.header("chime-signature").unwrap();
    let t: i64 = signature.strip_prefix("t=").unwrap().split(',').next().unwrap().parse().unwrap();
    assert_eq!(signature, chime::engine::signature(secret, t, &request.body), "the callback is signed with the biz type's secret");
}

/// The first start's credentials file in `data_dir`, once written (at most 10 s), after
/// checking that only its owner can read it.
pub async fn first_start_file(data_dir: &std::path::Path) -> String {
    let path = data_dir.join(chime::first_start::FILE);
    let text = wait_until(&format!("the credentials file at {}", path.display()), Duration::from_secs(10), || async {
        std::fs::read_to_string(&path).ok().filter(|text| text.ends_with('\n'))
    })
    .await;
    assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600, "readable by its owner only");
    text
}

/// A biz type created with CHIME_SECRET_KEY set keeps its secret only encrypted in the
/// database, and a node with the key signs its callbacks with the secret itself (a receiver
/// verifies Chime-Signature).
#[tokio::test]
async fn a_secret_made_with_the_key_is_stored_encrypted_and_still_signs() {
    let db_url = fresh_database().await;
    let pool = chime::db::connect(&db_url, 2).await.unwrap();
    let receiver = Receiver::start(vec![], Answer::status(200)).await;
    let with_key = [("DATABASE_URL", db_url.as_str()), ("CHIME_SECRET_KEY", &key(1))];
    let out = chime(&with_key, &["biz-type", "create", "orders", "--callback-url", &receiver.url], None).await;
    assert!(out.ok, "{}", out.stderr);
    let secret = out.last_line().to_string();
    assert!(secret.starts_with("whsec_"), "{}", out.stdout);

    let (clear, sealed) = stored(&pool, "orders").await;
    let sealed = sealed.expect("a sealed secret");
    assert_eq!(clear, None, "the secret is also stored in clear");
    assert!(sealed.starts_with("enc:v1:") && !sealed.contains(&secret) && !sealed.contains(&secret["whsec_".len()..]), "{sealed}");
    let row: String = sqlx::query_scalar("SELECT b::text FROM biz_types b").fetch_one(&pool).await.unwrap();
    assert!(!row.contains(&secret["whsec_".len()..]), "{row}");

    let token = chime::biz_types::create_token(&pool, "orders").await.unwrap();
    let (_node, address) = chime_node(&db_url, &[("CHIME_SECRET_KEY", &key(1))]).await;
    let node = TestApp { address, pool, db_url, client: client() };
    delivered_signed_with(&node, &token, &receiver, &secret).await;
}

/// A node without the key, or with another key, refuses to start on an encrypted secret and
/// says which biz type and what to set, rather than sign callbacks with something else.
#[tokio::test]
async fn a_node_that_cannot_decrypt_a_secret_refuses_to_start() {
    let db_url = fresh_database().await;
    let out = chime(
        &[("DATABASE_URL", &db_url), ("CHIME_SECRET_KEY", &key(1))],
        &["biz-type", "create", "orders", "--callback-url", "http://127.0.0.1:9/x"],
        None,
    )
    .await;
    assert!(out.ok, "{}", out.stderr);

    let without = serve_refused(&[("DATABASE_URL", &db_url)]).await;
    assert!(
        without.stderr.contains("the signing secret of biz type `orders` is encrypted (key ")
            && without
                .stderr
                .contains("and CHIME_SECRET_KEY is not set: set CHIME_SECRET_KEY (or CHIME_SECRET_KEY_FILE) to the key it was encrypted with"),
        "{}",
        without.stderr
    );
    let other = serve_refused(&[("DATABASE_URL", &db_url), ("CHIME_SECRET_KEY", &key(2))]).await;
    assert!(
        other.stderr.contains("the signing secret of biz type `orders` is encrypted with key ")
            && other.stderr.contains("CHIME_SECRET_KEY_OLD does not hold it: give this node the key it was encrypted with"),
        "{}",
        other.stderr
    );
}

/// A secret that a running node cannot decrypt (written since its start by a node with
/// another key) is never signed with: the node logs an ERROR naming the biz type, once, and
/// leaves its tasks pending, while it goes on delivering the other biz types.
#[tokio::test]
async fn a_running_node_leaves_a_biz_type_it_cannot_decrypt_pending() {
    let db_url = fresh_database().await;
    let pool = chime::db::connect(&db_url, 2).await.unwrap();
    let receiver = Receiver::start(vec![], Answer::status(200)).await;
    let (key1, key2) = (key(1), key(2));
    let create = |name: &'static str, key: &str| {
        let (db_url, key, url) = (db_url.clone(), key.to_string(), receiver.url.clone());
        async move { chime(&[("DATABASE_URL", &db_url), ("CHIME_SECRET_KEY", &key)], &["biz-type", "create", name, "--callback-url", &url], None).await }
    };
    let orders = create("orders", &key1).await;
    assert!(orders.ok, "{}", orders.stderr);
    let log_path = std::env::temp_dir().join(format!("chime-secrets-log-{}-{}.txt", std::process::id(), uuid::Uuid::new_v4()));
    let (mut child, address) = chime_process_logging(&db_url, &[("CHIME_SECRET_KEY", &key1)], std::fs::File::create(&log_path).unwrap()).await;
    let node = TestApp { address, pool: pool.clone(), db_url: db_url.clone(), client: client() };
    assert!(create("refunds", &key2).await.ok);

    let said = "the signing secret of biz type `refunds` is encrypted with key ";
    let mut log = String::new();
    for _ in 0..200 {
        log = std::fs::read_to_string(&log_path).unwrap();
        if log.contains(said) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let refunds_token = chime::biz_types::create_token(&pool, "refunds").await.unwrap();
    let refund = node.create_task(&refunds_token, json!({"biz_type": "refunds"})).await;
    // A task of another biz type, created after it and delivered: the engine has passed over
    // the refund since it fell due.
    let orders_token = chime::biz_types::create_token(&pool, "orders").await.unwrap();
    delivered_signed_with(&node, &orders_token, &receiver, orders.last_line()).await;
    let (status, attempts): (String, i32) = sqlx::query_as("SELECT status::text, attempt_count FROM tasks WHERE id = $1")
        .bind(uuid::Uuid::parse_str(refund["id"].as_str().unwrap()).unwrap())
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!((status.as_str(), attempts), ("pending", 0), "the refund was attempted");
    assert_eq!(receiver.received().len(), 1, "only the order was called back");

    assert!(log.contains(said), "no ERROR naming the biz type: {log}");
    child.kill().await.unwrap();
    let log = std::fs::read_to_string(&log_path).unwrap();
    std::fs::remove_file(&log_path).unwrap();
    let errors: Vec<&str> = log.lines().filter(|l| l.contains(said)).collect();
    assert_eq!(errors.len(), 1, "one ERROR: {log}");
    assert!(errors[0].contains("ERROR") && errors[0].ends_with("its tasks are not delivered by this node"), "{log}");
}

/// `chime secrets reencrypt` encrypts secrets stored in clear, does nothing the second time,
/// and after a key rotation re-encrypts them with the new key (the old one in
/// CHIME_SECRET_KEY_OLD); callbacks keep verifying with the same secret throughout.
#[tokio::test]
async fn reencrypt_encrypts_secrets_in_clear_and_rotates_keys() {
    let db_url = fresh_database().await;
    let pool = chime::db::connect(&db_url, 2).await.unwrap();
    let receiver = Receiver::start(vec![], Answer::status(200)).await;
    let db = ("DATABASE_URL", db_url.as_str());
    let out = chime(&[db], &["biz-type", "create", "orders", "--callback-url", &receiver.url], None).await;
    assert!(out.ok, "{}", out.stderr);
    let secret = out.last_line().to_string();
    assert_eq!(stored(&pool, "orders").await, (Some(secret.clone()), None), "without a key it is stored in clear");
    let token = chime::biz_types::create_token(&pool, "orders").await.unwrap();

    let refused = chime(&[db], &["secrets", "reencrypt"], None).await;
    assert!(!refused.ok && refused.stderr.contains("CHIME_SECRET_KEY: is not set"), "{}", refused.stderr);
    let (key1, key2) = (key(1), key(2));
    let first = chime(&[db, ("CHIME_SECRET_KEY", &key1)], &["secrets", "reencrypt"], None).await;
    assert!(first.ok, "{}", first.stderr);
    assert!(
        first.stdout.contains("1 encrypted (were in clear), 0 re-encrypted (were under an older key), 0 already under the current key"),
        "{}",
        first.stdout
    );
    let (clear, sealed) = stored(&pool, "orders").await;
    assert!(clear.is_none() && sealed.as_deref().is_some_and(|s| s.starts_with("enc:v1:") && !s.contains(&secret)), "{clear:?} {sealed:?}");
    let again = chime(&[db, ("CHIME_SECRET_KEY", &key1)], &["secrets", "reencrypt"], None).await;
    assert!(
        again.stdout.contains("0 encrypted (were in clear), 0 re-encrypted (were under an older key), 1 already under the current key"),
        "{}",
        again.stdout
    );
    assert_eq!(stored(&pool, "orders").await.1, sealed, "a second run changes nothing");
    let audited: i64 =
        sqlx::query_scalar("SELECT count(*) FROM audit_log WHERE actor = 'cli' AND action = 'secrets.reencrypt'").fetch_one(&pool).await.unwrap();
    assert_eq!(audited, 1, "the run that changed something is in the audit log");
    {
        let (_node, address) = chime_node(&db_url, &[("CHIME_SECRET_KEY", &key1)]).await;
        let node = TestApp { address, pool: pool.clone(), db_url: db_url.clone(), client: client() };
        delivered_signed_with(&node, &token, &receiver, &secret).await;
    }

    // Rotation: the new key, the old one to read with; then the new key alone, from a file.
    let rotated = chime(&[db, ("CHIME_SECRET_KEY", &key2), ("CHIME_SECRET_KEY_OLD", &key1)], &["secrets", "reencrypt"], None).await;
    assert!(rotated.stdout.contains("0 encrypted (were in clear), 1 re-encrypted (were under an older key), 0 already"), "{}", rotated.stdout);
    assert_ne!(stored(&pool, "orders").await.1, sealed);
    let key_file = std::env::temp_dir().join(format!("chime-key-{}", uuid::Uuid::new_v4()));
    std::fs::write(&key_file, format!("{key2}\n")).unwrap();
    let (_node, address) = chime_node(&db_url, &[("CHIME_SECRET_KEY_FILE", key_file.to_str().unwrap())]).await;
    std::fs::remove_file(&key_file).unwrap();
    let node = TestApp { address, pool, db_url, client: client() };
    delivered_signed_with(&node, &token, &receiver, &secret).await;
}

/// A key that is not 32 bytes of base64, or a key file that cannot be read, stops chime at
/// start with what to do.
#[tokio::test]
async fn a_wrong_key_stops_the_start() {
    let db_url = fresh_database().await;
    let db = ("DATABASE_URL", db_url.as_str());
    let short = serve_refused(&[db, ("CHIME_SECRET_KEY", &STANDARD.encode([1u8; 16]))]).await;
    assert!(
        short.stderr.contains("CHIME_SECRET_KEY is 16 bytes long: it must be 32 random bytes in base64, as `openssl rand -base64 32` makes"),
        "{}",
        short.stderr
    );
    let garbled = serve_refused(&[db, ("CHIME_SECRET_KEY", "not a key")]).await;
    assert!(garbled.stderr.contains("CHIME_SECRET_KEY is not base64"), "{}", garbled.stderr);
    let missing = serve_refused(&[db, ("CHIME_SECRET_KEY_FILE", "/nonexistent/chime.key")]).await;
    assert!(missing.stderr.contains("cannot read CHIME_SECRET_KEY_FILE /nonexistent/chime.key"), "{}", missing.stderr);
}

/// With stdout not a terminal (a service manager, a container), the first start writes the
/// generated admin password to an owner-only file in the data directory (created for it, as
/// with an external database there is none yet) and says where in its log, and neither its
/// stdout nor its log holds the password. The password in the file signs in. Without
/// CHIME_SECRET_KEY it warns, once, that secrets are stored in clear.
#[tokio::test]
async fn first_start_credentials_go_to_an_owner_only_file_when_stdout_is_not_a_terminal() {
    let db_url = fresh_database().await;
    let data_dir = std::env::temp_dir().join(format!("chime-first-start-{}", uuid::Uuid::new_v4())).join("data");
    let port = free_port();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_chime"))
        .env_remove("CHIME_CONFIG")
        .env_remove("CHIME_ADMIN_PASSWORD")
        .env("DATABASE_URL", &db_url)
        .env("CHIME_DATA_DIR", &data_dir)
        .env("CHIME_LISTEN", format!("127.0.0.1:{port}"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let address = format!("http://127.0.0.1:{port}");
    wait_ready(&address).await;

    let path = data_dir.join(chime::first_start::FILE);
    let text = first_start_file(&data_dir).await;
    let password = text
        .lines()
        .find_map(|l| l.strip_prefix("created console user `admin` with password: "))
        .unwrap_or_else(|| panic!("no password in the file: {text}"))
        .to_string();
    let pool = chime::db::connect(&db_url, 2).await.unwrap();
    let app = TestApp { address, pool, db_url, client: client() };
    assert_eq!(crate::console::sign_in_attempt(&app, "admin", &password).await.status, 303, "the password in the file signs in");

    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id().unwrap() as i32), nix::sys::signal::Signal::SIGTERM).unwrap();
    let mut stdout = String::new();
    let mut stderr = String::new();
    use tokio::io::AsyncReadExt;
    child.stdout.take().unwrap().read_to_string(&mut stdout).await.unwrap();
    child.stderr.take().unwrap().read_to_string(&mut stderr).await.unwrap();
    child.wait().await.unwrap();
    std::fs::remove_dir_all(data_dir.parent().unwrap()).unwrap();
    assert!(!stdout.contains(&password) && !stderr.contains(&password), "the password was printed: {stdout}\n{stderr}");
    let said = format!("the first start's credentials (console password, API token) are in {}, readable by its owner only", path.display());
    assert!(stderr.contains("INFO") && stderr.contains(&said), "{stderr}");
    assert_eq!(stderr.matches("CHIME_SECRET_KEY is not set: biz types' signing secrets are stored in clear").count(), 1, "one warning: {stderr}");
}

/// The stored forms of the secret a rotation replaced: (previous_secret, until).
async fn previous(pool: &Pool, name: &str) -> (Option<String>, Option<chrono::DateTime<chrono::Utc>>) {
    sqlx::query_as("SELECT previous_secret, previous_secret_until FROM biz_types WHERE name = $1").bind(name).fetch_one(pool).await.unwrap()
}

/// Where the secrets are encrypted, a writer without CHIME_SECRET_KEY stores no secret in
/// clear: `biz-type create`, `rotate-secret` and `apply` are refused with the variable
/// named, and the encrypted secret and its rotation's overlap stay as they were; the admin
/// API of a node without the key refuses alike.
#[tokio::test]
async fn without_the_key_no_secret_is_stored_in_clear_where_secrets_are_encrypted() {
    let db_url = fresh_database().await;
    let pool = chime::db::connect(&db_url, 2).await.unwrap();
    let key1 = key(1);
    let with_key = [("DATABASE_URL", db_url.as_str()), ("CHIME_SECRET_KEY", key1.as_str())];
    let without = [("DATABASE_URL", db_url.as_str()), ("REFUNDS_SECRET", "refunds-secret-5e8c1a9d")];
    for args in [
        &["biz-type", "create", "orders", "--callback-url", "http://127.0.0.1:9/x"][..],
        &["biz-type", "rotate-secret", "orders", "--overlap-secs", "3600"],
    ] {
        let out = chime(&with_key, args, None).await;
        assert!(out.ok, "{args:?}: {}", out.stderr);
    }
    let (sealed, overlap) = (stored(&pool, "orders").await, previous(&pool, "orders").await);
    assert!(sealed.0.is_none() && overlap.0.as_deref().is_some_and(|p| p.starts_with("enc:v1:")), "{sealed:?} {overlap:?}");

    let dir = std::env::temp_dir().join(format!("chime-clear-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir(&dir).unwrap();
    let file = dir.join("chime.toml");
    std::fs::write(&file, "[biz_types.refunds]\ncallback_url = \"http://127.0.0.1:9/r\"\nsigning_secret = { env = \"REFUNDS_SECRET\" }\n").unwrap();
    let mut wrong = Vec::new();
    for args in [
        &["biz-type", "create", "refunds", "--callback-url", "http://127.0.0.1:9/r"][..],
        &["biz-type", "rotate-secret", "orders"],
        &["apply", "-f", file.to_str().unwrap()],
    ] {
        let out = chime(&without, args, None).await;
        println!("{args:?}: exit {:?}\n{}{}", out.code, out.stdout, out.stderr);
        if out.ok || !(out.stderr.contains("CHIME_SECRET_KEY is not set") && out.stderr.contains("CHIME_SECRET_KEY_FILE")) {
            wrong.push(format!("{args:?} was not refused naming CHIME_SECRET_KEY"));
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
    let clear: Vec<String> =
        sqlx::query_scalar("SELECT name FROM biz_types WHERE signing_secret IS NOT NULL ORDER BY name").fetch_all(&pool).await.unwrap();
    assert!(wrong.is_empty() && clear.is_empty(), "{wrong:#?}; secrets stored in clear: {clear:?}");
    assert_eq!((stored(&pool, "orders").await, previous(&pool, "orders").await), (sealed, overlap), "the encrypted secret and its overlap are kept");

    // A node without the key starts while the only encrypted secret is an archived biz
    // type's; its admin API refuses to store a new one in clear.
    assert!(chime(&with_key, &["biz-type", "archive", "orders"], None).await.ok);
    let app = crate::helpers::spawn_on(db_url.clone(), chime::config::ServeArgs { engine: false, ..Default::default() }).await;
    let admin = chime::admin_tokens::create(&app.pool, "ci", "test").await.unwrap().1;
    let created = app.post("/api/v1/admin/biz-types", &admin, json!({"name": "refunds", "callback_url": "http://127.0.0.1:9/r"})).await;
    assert_eq!((created.status, created.code()), (409, "invalid_state"), "{}", created.body);
    assert!(created.message().contains("CHIME_SECRET_KEY is not set"), "{}", created.message());
}

/// A node started with CHIME_SECRET_KEY while secrets are still stored in clear warns once,
/// naming them and what to run.
#[tokio::test]
async fn a_node_with_the_key_warns_once_of_secrets_in_clear() {
    let db_url = fresh_database().await;
    let out = chime(&[("DATABASE_URL", &db_url)], &["biz-type", "create", "orders", "--callback-url", "http://127.0.0.1:9/x"], None).await;
    assert!(out.ok, "{}", out.stderr);
    let log_path = std::env::temp_dir().join(format!("chime-clear-log-{}.txt", uuid::Uuid::new_v4()));
    let (mut child, _) = chime_process_logging(&db_url, &[("CHIME_SECRET_KEY", &key(1))], std::fs::File::create(&log_path).unwrap()).await;
    // Said before "chime ready on", which can come just after /readyz answers.
    for _ in 0..50 {
        if std::fs::read_to_string(&log_path).unwrap().contains("chime ready on") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    child.kill().await.unwrap();
    let log = std::fs::read_to_string(&log_path).unwrap();
    std::fs::remove_file(&log_path).unwrap();
    println!("{log}");
    let warnings: Vec<&str> = log.lines().filter(|l| l.contains("stored in clear")).collect();
    assert_eq!(warnings.len(), 1, "one warning of secrets in clear: {log}");
    assert!(warnings[0].contains("WARN") && warnings[0].contains("`orders`") && warnings[0].contains("chime secrets reencrypt"), "{}", warnings[0]);
}

/// A chat robot's secret is kept as the signing secrets are: in clear without a key (and
/// `chime secrets reencrypt` seals it), sealed under CHIME_SECRET_KEY, never the plain text;
/// and once secrets are sealed, not stored in clear by a command run without the key.
#[tokio::test]
async fn a_chat_robot_secret_is_stored_encrypted_with_the_key() {
    let db_url = fresh_database().await;
    let pool = chime::db::connect(&db_url, 2).await.unwrap();
    let db = ("DATABASE_URL", db_url.as_str());
    let secret = "SEC7c3f0e9a51b24d68a0f1e2d3c4b5a697";
    let robot = ["--mode", "pull", "--chat-platform", "dingtalk", "--chat-url", "https://oapi.dingtalk.test/robot/send?access_token=t"];
    let chat_secret = |name: &str| {
        let pool = pool.clone();
        let name = name.to_string();
        async move {
            sqlx::query_scalar::<_, Option<String>>("SELECT chat_secret FROM biz_types WHERE name = $1")
                .bind(name)
                .fetch_one(&pool)
                .await
                .unwrap()
                .unwrap()
        }
    };
    let out = chime(&[db, ("CHIME_CHAT_SECRET", secret)], &[&["biz-type", "create", "clear"][..], &robot].concat(), None).await;
    assert!(out.ok && out.stdout.contains("chat notices to dingtalk"), "{}{}", out.stdout, out.stderr);
    assert_eq!(chat_secret("clear").await, secret, "without a key it is stored in clear");

    let key1 = key(1);
    let sealed = chime(&[db, ("CHIME_SECRET_KEY", &key1)], &["secrets", "reencrypt"], None).await;
    assert!(sealed.stdout.contains("2 encrypted (were in clear)"), "the signing secret and the chat secret: {}", sealed.stdout);
    let stored = chime_secret_sealed(&chat_secret("clear").await, secret);
    let out =
        chime(&[db, ("CHIME_SECRET_KEY", &key1), ("CHIME_CHAT_SECRET", secret)], &[&["biz-type", "create", "sealed"][..], &robot].concat(), None)
            .await;
    assert!(out.ok, "{}", out.stderr);
    chime_secret_sealed(&chat_secret("sealed").await, secret);
    assert_ne!(chat_secret("sealed").await, stored, "a fresh nonce each");

    let refused = chime(&[db, ("CHIME_CHAT_SECRET", secret)], &[&["biz-type", "update", "sealed"][..], &robot].concat(), None).await;
    assert!(!refused.ok && refused.stderr.contains("CHIME_SECRET_KEY is not set"), "never stored in clear beside sealed ones: {}", refused.stderr);
}

/// Checks a stored secret is sealed (`enc:v1:…`) and does not show `secret`; returns it.
fn chime_secret_sealed(stored: &str, secret: &str) -> String {
    assert!(stored.starts_with("enc:v1:") && !stored.contains(secret) && !stored.contains(&secret[3..]), "{stored}");
    stored.to_string()
}
