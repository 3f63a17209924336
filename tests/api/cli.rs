//! The admin subcommands, run as the real binary against a test database.

use serde_json::json;

use crate::helpers::spawn_app;

pub struct Output {
    pub ok: bool,
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Output {
    pub fn last_line(&self) -> &str {
        self.stdout.lines().last().unwrap_or("")
    }
}

/// Runs `chime <args>` with the given environment (and nothing else of ours).
pub async fn chime(env: &[(&str, &str)], args: &[&str], stdin: Option<&str>) -> Output {
    use tokio::io::AsyncWriteExt;
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_chime"));
    cmd.args(args)
        .env_remove("DATABASE_URL")
        .env_remove("CHIME_CONFIG")
        .envs(env.iter().copied())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        // A `serve` that a test gives up waiting for must not outlive it.
        .kill_on_drop(true);
    let mut child = cmd.spawn().expect("running chime");
    let mut input = child.stdin.take().unwrap();
    if let Some(text) = stdin {
        input.write_all(text.as_bytes()).await.unwrap();
    }
    drop(input);
    let out = child.wait_with_output().await.unwrap();
    Output {
        ok: out.status.success(),
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// biz-type create prints the signing secret last; token create prints a token that the
/// API accepts; update and list show the settings.
#[tokio::test]
async fn biz_type_and_token_commands_work_end_to_end() {
    let app = spawn_app().await;
    let env = [("DATABASE_URL", app.db_url.as_str())];

    let out = chime(
        &env,
        &["biz-type", "create", "orders", "--callback-url", "https://example.test/hook", "--max-attempts", "5", "--rate-limit", "50"],
        None,
    )
    .await;
    assert!(out.ok, "{}", out.stderr);
    let secret: String = sqlx::query_scalar("SELECT signing_secret FROM biz_types WHERE name = 'orders'").fetch_one(&app.pool).await.unwrap();
    assert_eq!(out.last_line(), secret);

    let out = chime(&env, &["token", "create", "--biz-type", "orders"], None).await;
    assert!(out.ok, "{}", out.stderr);
    let token = out.last_line().to_string();
    app.create_task(&token, json!({"biz_type": "orders"})).await;

    let out = chime(&env, &["biz-type", "update", "orders", "--pause", "--timeout-ms", "2500", "--rate-limit", "0"], None).await;
    assert!(out.ok, "{}", out.stderr);
    let (paused, timeout, rate): (bool, i32, Option<f64>) =
        sqlx::query_as("SELECT paused, timeout_ms, rate_limit FROM biz_types WHERE name = 'orders'").fetch_one(&app.pool).await.unwrap();
    assert_eq!((paused, timeout, rate), (true, 2500, None));
    let max_attempts: i32 = sqlx::query_scalar("SELECT max_attempts FROM biz_types").fetch_one(&app.pool).await.unwrap();
    assert_eq!(max_attempts, 5, "settings not given are kept");

    let out = chime(&env, &["biz-type", "list"], None).await;
    assert!(out.ok);
    assert!(out.stdout.contains("orders") && out.stdout.contains("paused") && out.stdout.contains("2500ms"), "{}", out.stdout);

    let audit: Vec<String> = sqlx::query_scalar("SELECT action FROM audit_log WHERE actor = 'cli' ORDER BY id").fetch_all(&app.pool).await.unwrap();
    assert_eq!(audit, ["biz_type.create", "token.create", "biz_type.update"]);
}

/// Bad arguments fail with a message that names the problem, and change nothing.
#[tokio::test]
async fn biz_type_commands_reject_bad_settings() {
    let app = spawn_app().await;
    let env = [("DATABASE_URL", app.db_url.as_str())];
    let cases: [(&[&str], &str); 7] = [
        (&["biz-type", "create", "Bad Name", "--callback-url", "http://x.test/"], "name"),
        (&["biz-type", "create", "a", "--callback-url", "ftp://x.test/"], "callback_url"),
        (&["biz-type", "create", "a"], "callback_url"),
        (&["biz-type", "create", "a", "--callback-url", "http://x.test/", "--timeout-ms", "0"], "timeout_ms"),
        (
            &["biz-type", "create", "a", "--callback-url", "http://x.test/", "--backoff-initial-ms", "5000", "--backoff-max-ms", "10"],
            "backoff_max_ms",
        ),
        (&["biz-type", "update", "nosuch", "--pause"], "nosuch"),
        (&["token", "create", "--biz-type", "nosuch"], "nosuch"),
    ];
    for (args, mentions) in cases {
        let out = chime(&env, args, None).await;
        assert!(!out.ok, "{args:?} succeeded");
        assert!(out.stderr.contains(mentions), "{args:?}: {}", out.stderr);
    }
    let count: i64 = sqlx::query_scalar("SELECT count(*) FROM biz_types").fetch_one(&app.pool).await.unwrap();
    assert_eq!(count, 0);

    assert!(chime(&env, &["biz-type", "create", "a", "--callback-url", "http://x.test/"], None).await.ok);
    let again = chime(&env, &["biz-type", "create", "a", "--callback-url", "http://x.test/"], None).await;
    assert!(!again.ok && again.stderr.contains("already exists"), "{}", again.stderr);
}

/// user create takes the password from --password or stdin and stores an argon2 hash.
#[tokio::test]
async fn user_create_stores_an_argon2_hash() {
    let app = spawn_app().await;
    let env = [("DATABASE_URL", app.db_url.as_str())];
    let out = chime(&env, &["user", "create", "alice", "--role", "support", "--password", "correct horse"], None).await;
    assert!(out.ok, "{}", out.stderr);
    let out = chime(&env, &["user", "create", "bob", "--role", "admin"], Some("battery staple\n")).await;
    assert!(out.ok, "{}", out.stderr);
    let short = chime(&env, &["user", "create", "carol", "--role", "admin", "--password", "short"], None).await;
    assert!(!short.ok && short.stderr.contains("password"));
    let bad_role = chime(&env, &["user", "create", "dave", "--role", "root", "--password", "long enough"], None).await;
    assert!(!bad_role.ok);

    let users: Vec<(String, String, String)> =
        sqlx::query_as("SELECT username, role, password_hash FROM users ORDER BY username").fetch_all(&app.pool).await.unwrap();
    let names: Vec<_> = users.iter().map(|u| (u.0.as_str(), u.1.as_str())).collect();
    assert_eq!(names, [("admin", "admin"), ("alice", "support"), ("bob", "admin")]);
    for (_, _, hash) in &users {
        assert!(hash.starts_with("$argon2"), "{hash}");
    }
}

/// `user list` shows each user's role, state, creation and last sign-in; `user disable`
/// keeps a user out and ends their open session, `enable` lets them back in; the last
/// enabled admin cannot be disabled (the admin API's rule and words). `user reset-password`
/// recovers a lost admin password: with no password given it prints a generated one as the
/// last line (once); or takes --password, or a line on stdin; the old password stops
/// working and the user's sessions end. Every change is audited under `cli`.
#[tokio::test]
async fn user_list_disable_enable_and_reset_password() {
    use crate::console::{ADMIN_PASSWORD, sign_in, sign_in_attempt};
    let app = spawn_app().await;
    let env = [("DATABASE_URL", app.db_url.as_str())];
    assert!(chime(&env, &["user", "create", "helen", "--role", "support", "--password", "support-password"], None).await.ok);
    let helen = sign_in(&app, "helen", "support-password").await;

    let out = chime(&env, &["user", "list"], None).await;
    assert!(out.ok, "{}", out.stderr);
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{}", out.stdout);
    assert!(lines[0].starts_with("admin\tadmin\tenabled\tcreated ") && lines[0].ends_with("never signed in"), "{}", lines[0]);
    assert!(lines[1].starts_with("helen\tsupport\tenabled\tcreated ") && lines[1].contains("last signed in 20"), "{}", lines[1]);

    let out = chime(&env, &["user", "disable", "helen"], None).await;
    assert!(out.ok, "{}", out.stderr);
    assert_eq!(helen.get("/console").await.status, 303, "the open session still works");
    assert_eq!(sign_in_attempt(&app, "helen", "support-password").await.status, 401);
    assert!(chime(&env, &["user", "list"], None).await.stdout.contains("helen\tsupport\tdisabled"));
    let out = chime(&env, &["user", "disable", "admin"], None).await;
    assert!(!out.ok && out.stderr.contains("`admin` is the last enabled admin; make another user an admin first"), "{}", out.stderr);
    let out = chime(&env, &["user", "enable", "helen"], None).await;
    assert!(out.ok, "{}", out.stderr);
    assert_eq!(sign_in_attempt(&app, "helen", "support-password").await.status, 303);

    // A lost first admin password.
    let admin = sign_in(&app, "admin", ADMIN_PASSWORD).await;
    let out = chime(&env, &["user", "reset-password", "admin"], None).await;
    assert!(out.ok, "{}", out.stderr);
    assert!(out.stdout.contains("shown only this once"), "{}", out.stdout);
    let generated = out.last_line().to_string();
    assert_eq!(generated.len(), 20, "{}", out.stdout);
    assert_eq!(admin.get("/console").await.status, 303, "the admin's session survived the reset");
    assert_eq!(sign_in_attempt(&app, "admin", ADMIN_PASSWORD).await.status, 401, "the old password still works");
    assert_eq!(sign_in_attempt(&app, "admin", &generated).await.status, 303);

    let out = chime(&env, &["user", "reset-password", "helen", "--password", "given-password"], None).await;
    assert!(out.ok && !out.stdout.contains("shown only this once"), "{}{}", out.stdout, out.stderr);
    assert_eq!(sign_in_attempt(&app, "helen", "given-password").await.status, 303);
    let out = chime(&env, &["user", "reset-password", "helen"], Some("piped-password\n")).await;
    assert!(out.ok && !out.stdout.contains("piped-password"), "{}{}", out.stdout, out.stderr);
    assert_eq!(sign_in_attempt(&app, "helen", "piped-password").await.status, 303);

    for (args, says) in [
        (&["user", "reset-password", "helen", "--password", "short"][..], "password: must be at least 8 characters"),
        (&["user", "disable", "nobody"][..], "no user named `nobody`"),
    ] {
        let out = chime(&env, args, None).await;
        assert!(!out.ok && out.stderr.contains(says), "{args:?}: {}", out.stderr);
    }
    assert_eq!(sign_in_attempt(&app, "helen", "piped-password").await.status, 303, "a refused reset changed the password");

    let audit: Vec<(String, String)> =
        sqlx::query_as("SELECT action, target FROM audit_log WHERE actor = 'cli' ORDER BY id").fetch_all(&app.pool).await.unwrap();
    let audit: Vec<(&str, &str)> = audit.iter().map(|(a, t)| (a.as_str(), t.as_str())).collect();
    assert_eq!(
        audit,
        [
            ("user.create", "helen"),
            ("user.update", "helen"),
            ("user.update", "helen"),
            ("user.reset_password", "admin"),
            ("user.reset_password", "helen"),
            ("user.reset_password", "helen")
        ]
    );
    let leaked: i64 =
        sqlx::query_scalar("SELECT count(*) FROM audit_log WHERE after::text LIKE '%' || $1 || '%' OR after::text LIKE '%given-password%'")
            .bind(&generated)
            .fetch_one(&app.pool)
            .await
            .unwrap();
    assert_eq!(leaked, 0, "a password in the audit log");
}

/// --help documents every setting with its environment variable and default.
#[tokio::test]
async fn help_documents_settings() {
    let out = chime(&[], &["--help"], None).await;
    assert!(out.ok);
    for needle in [
        "DATABASE_URL",
        "CHIME_DATA_DIR",
        "./chime-data",
        "CHIME_LISTEN",
        "127.0.0.1:8080",
        "CHIME_ADMIN_PASSWORD",
        "CHIME_CONFIG",
        "serve",
        "biz-type",
        "token",
        "user",
        "migrate",
    ] {
        assert!(out.stdout.contains(needle), "--help lacks {needle}:\n{}", out.stdout);
    }
    // The engine has shipped: nothing promises it for later.
    assert!(!out.stdout.to_lowercase().contains("later version"), "--help still promises the engine for later:\n{}", out.stdout);
    let out = chime(&[], &["serve", "--help"], None).await;
    for needle in ["CHIME_LISTEN", "CHIME_MAX_PAYLOAD_BYTES", "65536", "CHIME_HOT_DAYS", "CHIME_DENY_PRIVATE_CALLBACKS", "multi-tenant"] {
        assert!(out.stdout.contains(needle), "serve --help lacks {needle}");
    }
    for needle in ["CHIME_LOG", "added to the default `info,chime::http=warn,sqlx=warn`", "CHIME_LOG_FORMAT", "json"] {
        assert!(out.stdout.contains(needle), "serve --help lacks {needle}:\n{}", out.stdout);
    }
    // Sign-in through an OpenID Provider: each setting, and where the redirect URI comes from.
    for needle in ["CHIME_OIDC_ISSUER", "CHIME_OIDC_CLIENT_SECRET_FILE", "CHIME_OIDC_ADMIN_GROUPS", "CHIME_LOCAL_PASSWORDS", "/console/oidc/callback"]
    {
        assert!(out.stdout.contains(needle), "serve --help lacks {needle}:\n{}", out.stdout);
    }
}

/// `chime bench` and `chime soak` hand their command line to chime-bench, the binary built
/// beside chime: their --help explains the options, and a chime without chime-bench beside
/// it says how to build it.
#[tokio::test]
async fn bench_and_soak_run_chime_bench() {
    let out = chime(&[], &["bench", "--help"], None).await;
    assert!(out.ok, "{}", out.stderr);
    for needle in [
        "Usage: chime bench",
        "--scenarios",
        "--burst-tasks",
        "--receiver-url",
        "--fairness-herd",
        "--scenarios fairness",
        "DATABASE_URL",
        "throwaway embedded PostgreSQL",
    ] {
        assert!(out.stdout.contains(needle), "bench --help lacks {needle}:\n{}", out.stdout);
    }
    let out = chime(&[], &["soak", "--help"], None).await;
    assert!(out.ok, "{}", out.stderr);
    for needle in ["Usage: chime soak", "--kill-every", "--timers", "Lost:"] {
        assert!(out.stdout.contains(needle), "soak --help lacks {needle}:\n{}", out.stdout);
    }
    // The options are chime-bench's to check, global ones (--log) included.
    let out = chime(&[], &["bench", "--log", "warn", "--runs", "0"], None).await;
    assert!(!out.ok && out.stderr.contains("invalid value '0' for '--runs"), "{}", out.stderr);
    // The fairness scenario compares 10 biz types with more.
    let out = chime(&[], &["bench", "--scenarios", "fairness", "--fairness-biz-types", "10"], None).await;
    assert!(!out.ok && out.stderr.contains("invalid value '10' for '--fairness-biz-types"), "{}", out.stderr);

    // A hard link has its own directory, so current_exe finds no chime-bench beside it.
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("lone-chime-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let lone = dir.join("chime");
    let _ = std::fs::remove_file(&lone);
    std::fs::hard_link(env!("CARGO_BIN_EXE_chime"), &lone).unwrap();
    for command in ["bench", "soak"] {
        let out = tokio::process::Command::new(&lone).args([command, "--help"]).env_remove("CHIME_CONFIG").output().await.unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(stderr.contains("chime-bench not found") && stderr.contains("`cargo build --bin chime-bench`"), "{stderr}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `chime openapi` prints the document /api/v1/openapi.json serves, and needs no database
/// (its DATABASE_URL here names a port nothing listens on): clients/test.sh generates the
/// TypeScript client's types from it.
#[tokio::test]
async fn openapi_prints_the_served_document_without_a_database() {
    let out = chime(&[("DATABASE_URL", "postgres://chime@127.0.0.1:1/none")], &["openapi"], None).await;
    assert!(out.ok, "{}", out.stderr);
    let printed: serde_json::Value = serde_json::from_str(&out.stdout).expect("chime openapi prints JSON");
    let app = spawn_app().await;
    let served = app.request("GET", "/api/v1/openapi.json", None, None).await;
    assert_eq!(served.status, 200);
    assert_eq!(printed, served.body);
}

/// A new biz type retries for a day: the schema's defaults (migration 0008) are the ones the
/// engine's schedule test and the README use, and the console's create form and
/// `biz-type create --help` show them.
#[tokio::test]
async fn new_biz_types_get_the_day_long_retry_defaults() {
    use chime::biz_types::{DEFAULT_BACKOFF_INITIAL_MS, DEFAULT_BACKOFF_MAX_MS, DEFAULT_MAX_ATTEMPTS};
    let app = spawn_app().await;
    let settings = chime::biz_types::Settings { callback_url: Some("http://127.0.0.1:9/x".into()), ..Default::default() };
    let created = chime::biz_types::create(&app.pool, "orders", &settings, chime::callback_hosts::CallbackHosts::Any).await.unwrap();
    assert_eq!(
        (created.max_attempts, created.backoff_initial_ms, created.backoff_max_ms),
        (DEFAULT_MAX_ATTEMPTS, DEFAULT_BACKOFF_INITIAL_MS, DEFAULT_BACKOFF_MAX_MS)
    );
    let out = chime(&[], &["biz-type", "create", "--help"], None).await;
    assert!(out.stdout.contains(&format!("[default: {DEFAULT_MAX_ATTEMPTS}")), "{}", out.stdout);
    let admin = crate::console::sign_in(&app, "admin", "test-admin-password").await;
    let form = admin.get("/console/biz-types/new").await.body;
    for (name, value) in
        [("max_attempts", DEFAULT_MAX_ATTEMPTS), ("backoff_initial_ms", DEFAULT_BACKOFF_INITIAL_MS), ("backoff_max_ms", DEFAULT_BACKOFF_MAX_MS)]
    {
        assert!(form.contains(&format!(r#"name="{name}" value="{value}""#)), "{name}: {form}");
    }
}

/// A config file supplies settings; the environment wins over it; unknown keys are refused.
#[tokio::test]
async fn config_file_is_read_and_validated() {
    let app = spawn_app().await;
    let dir = std::env::temp_dir().join(format!("chime-config-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let good = dir.join("good.toml");
    std::fs::write(&good, format!("database_url = \"{}\"\n", app.db_url)).unwrap();
    let out = chime(&[("CHIME_CONFIG", good.to_str().unwrap())], &["biz-type", "create", "fromfile", "--callback-url", "http://x.test/"], None).await;
    assert!(out.ok, "{}", out.stderr);
    assert!(chime::biz_types::by_name(&app.pool, "fromfile").await.unwrap().is_some());

    let wrong = dir.join("wrong.toml");
    std::fs::write(&wrong, "database_url = \"postgres://nobody@127.0.0.1:1/none\"\n").unwrap();
    let out = chime(&[("CHIME_CONFIG", wrong.to_str().unwrap()), ("DATABASE_URL", &app.db_url)], &["biz-type", "list"], None).await;
    assert!(out.ok && out.stdout.contains("fromfile"), "the environment wins: {}", out.stderr);

    let bad = dir.join("bad.toml");
    std::fs::write(&bad, "listen_addr = \"x\"\n").unwrap();
    let out = chime(&[("CHIME_CONFIG", bad.to_str().unwrap())], &["biz-type", "list"], None).await;
    assert!(!out.ok && out.stderr.contains("listen_addr"), "{}", out.stderr);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A user name is one name in any case: after `chime user create helen`, `HELEN` is refused
/// by the command line and by the admin API (409), helen signs in as `HeLeN`, and the admin
/// API changes her as `Helen`. Before, `HELEN` was a second user.
#[tokio::test]
async fn user_names_are_the_same_in_any_case() {
    use crate::console::sign_in_attempt;
    let app = spawn_app().await;
    let env = [("DATABASE_URL", app.db_url.as_str())];
    assert!(chime(&env, &["user", "create", "helen", "--role", "support", "--password", "support-password"], None).await.ok);
    let twin = chime(&env, &["user", "create", "HELEN", "--role", "admin", "--password", "another-password"], None).await;
    let admin = crate::admin::admin_token(&app).await;
    let body = json!({"name": "hElEn", "role": "admin", "password": "another-password"});
    let api = app.request("POST", "/api/v1/admin/users", Some(&admin), Some(body.to_string().into_bytes())).await;
    let names: Vec<String> = sqlx::query_scalar("SELECT username FROM users ORDER BY id").fetch_all(&app.pool).await.unwrap();
    println!(
        "`chime user create HELEN`: ok {} ({}); the admin API's hElEn: {} {}; users {names:?}",
        twin.ok,
        twin.stderr.trim(),
        api.status,
        api.body
    );
    assert!(!twin.ok && twin.stderr.contains("already exists"), "{}", twin.stderr);
    assert_eq!(api.status, 409, "{}", api.body);
    assert_eq!(names, ["admin", "helen"]);

    let page = sign_in_attempt(&app, "HeLeN", "support-password").await;
    assert_eq!(page.status, 303, "helen signs in in any case: {}", page.body);
    let changed = app.request("PATCH", "/api/v1/admin/users/Helen", Some(&admin), Some(json!({"disabled": true}).to_string().into_bytes())).await;
    assert_eq!(changed.status, 200, "{}", changed.body);
    assert_eq!(changed.body["name"], "helen", "{}", changed.body);
}

/// Runs `chime <args>` with its stdout a pipe whose reader is gone, as `chime ... | head -1`
/// leaves it once `head` has its line.
fn chime_into_closed_pipe(db_url: &str, args: &[&str]) -> std::process::Output {
    let (reader, writer) = nix::unistd::pipe().unwrap();
    drop(reader);
    std::process::Command::new(env!("CARGO_BIN_EXE_chime"))
        .args(args)
        .env_remove("CHIME_CONFIG")
        .env("DATABASE_URL", db_url)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::from(writer))
        .stderr(std::process::Stdio::piped())
        .output()
        .unwrap()
}

/// A command whose output is cut (`chime biz-type list | head -1`) exits as a program
/// killed by SIGPIPE does by convention, 141, without a panic or an error message; what it
/// did is done (the biz type is created).
#[tokio::test]
async fn a_closed_stdout_ends_a_command_quietly() {
    let app = spawn_app().await;
    let mut ended = Vec::new();
    for args in [&["biz-type", "create", "orders", "--callback-url", "https://example.test/hook"][..], &["biz-type", "list"]] {
        let out = chime_into_closed_pipe(&app.db_url, args);
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        println!("{args:?}: {:?}\n{stderr}", out.status);
        ended.push((out.status.code(), stderr));
    }
    let quiet = (Some(141), String::new());
    assert_eq!(ended, [quiet.clone(), quiet]);
    assert!(chime::biz_types::by_name(&app.pool, "orders").await.unwrap().is_some(), "the biz type was created");
}
