//! Upgrades and rollbacks: which commands migrate, and a node beside a newer schema.

use std::time::Duration;

use chime::biz_types::{self, Settings};
use chime::callback_hosts::CallbackHosts;
use chime::db::Pool;
use serde_json::json;

use crate::cli::chime;
use crate::helpers::{TestApp, chime_process_logging, client, empty_database, free_port, fresh_database};
use crate::receiver::{Answer, Receiver};

async fn has_migrations_table(pool: &Pool) -> bool {
    sqlx::query_scalar("SELECT to_regclass('_sqlx_migrations') IS NOT NULL").fetch_one(pool).await.unwrap()
}

/// The previous release's node beside the next release's schema: this binary's migrations
/// plus one it does not know (an added nullable column, as migrations/README.md allows).
/// Before, the node refused to start ("migration 9999 was previously applied but is
/// missing"), so a rollback, or an old pod restarting mid-rollout, could not run.
#[tokio::test]
async fn a_node_runs_on_a_schema_with_a_newer_migration() {
    let db_url = fresh_database().await;
    let pool = chime::db::connect(&db_url, 2).await.unwrap();
    sqlx::query("ALTER TABLE tasks ADD COLUMN note_from_the_future text").execute(&pool).await.unwrap();
    sqlx::query(
        "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) \
         VALUES (9999, 'tasks note from the future', true, '\\x00', 0)",
    )
    .execute(&pool)
    .await
    .unwrap();

    let log_path = std::env::temp_dir().join(format!("chime-upgrades-log-{}-{}.txt", std::process::id(), uuid::Uuid::new_v4()));
    let log = std::fs::File::create(&log_path).unwrap();
    let (mut child, address) = chime_process_logging(&db_url, &[("CHIME_ADMIN_PASSWORD", "upgrades-admin-password")], log).await;
    let node = TestApp { address, pool: pool.clone(), db_url: db_url.clone(), client: client() };
    let receiver = Receiver::start(vec![], Answer::status(200)).await;
    let settings = Settings { callback_url: Some(receiver.url.clone()), ..Default::default() };
    biz_types::create(&pool, "orders", &settings, CallbackHosts::Any).await.unwrap();
    let token = biz_types::create_token(&pool, "orders").await.unwrap();
    node.create_task(&token, json!({"biz_type": "orders", "payload": {"n": 1}})).await;
    assert_eq!(receiver.wait_for(1, Duration::from_secs(20)).await.len(), 1, "the task was not delivered");

    let env = [("DATABASE_URL", db_url.as_str())];
    let status = chime(&env, &["migrate", "--status"], None).await;
    assert!(status.ok, "{}", status.stderr);
    assert!(status.stdout.contains("9999\tapplied, newer than this binary\ttasks note from the future"), "{}", status.stdout);
    assert!(status.stdout.contains("0007\tapplied\tattempts redirected to"), "{}", status.stdout);
    let migrate = chime(&env, &["migrate"], None).await;
    assert!(migrate.ok, "chime migrate refused the newer schema: {}", migrate.stderr);

    child.kill().await.unwrap();
    let log = std::fs::read_to_string(&log_path).unwrap();
    std::fs::remove_file(&log_path).unwrap();
    let warnings: Vec<_> = log.lines().filter(|l| l.contains("newer than this binary")).collect();
    assert_eq!(warnings.len(), 1, "one warning naming the newer migration: {log}");
    assert!(warnings[0].contains("WARN") && warnings[0].contains("9999 (tasks note from the future)"), "{log}");
}

/// An admin command never migrates: on a database never migrated, `biz-type list` stops
/// with a message naming `chime migrate` and leaves no `_sqlx_migrations` behind. Before,
/// every subcommand applied every pending migration. `migrate --status` and `--sql` apply
/// nothing either; `migrate` does.
#[tokio::test]
async fn only_migrate_and_serve_change_the_schema() {
    let db_url = empty_database().await;
    let pool = chime::db::connect(&db_url, 2).await.unwrap();
    let env = [("DATABASE_URL", db_url.as_str())];

    let out = chime(&env, &["biz-type", "list"], None).await;
    assert!(!out.ok, "biz-type list ran on an unmigrated database: {}", out.stdout);
    assert!(
        out.stderr.contains("pending migrations 1 (schema), 2 (nodes deliver)") && out.stderr.contains("run `chime migrate` first"),
        "{}",
        out.stderr
    );
    assert!(!has_migrations_table(&pool).await, "biz-type list touched the schema");

    let status = chime(&env, &["migrate", "--status"], None).await;
    assert!(status.ok, "{}", status.stderr);
    let lines: Vec<_> = status.stdout.lines().collect();
    assert_eq!(lines.len(), chime::db::MIGRATOR.iter().count(), "{}", status.stdout);
    assert!(lines.iter().all(|l| l.contains("\tpending\t")), "{}", status.stdout);
    assert_eq!(lines[0], "0001\tpending\tschema");

    let sql = chime(&env, &["migrate", "--sql"], None).await;
    assert!(sql.ok, "{}", sql.stderr);
    assert!(sql.stdout.starts_with("SET lock_timeout"), "{}", sql.stdout);
    let first = sql.stdout.find("-- migration 1 (schema), run in one transaction").expect("migration 1's header");
    let last = sql.stdout.find("ALTER TABLE attempts ADD COLUMN redirected_to text;").expect("migration 7's SQL");
    assert!(first < last, "in order: {}", sql.stdout);
    assert!(!has_migrations_table(&pool).await, "--status or --sql touched the schema");

    let out = chime(&env, &["migrate"], None).await;
    assert!(out.ok, "{}", out.stderr);
    let status = chime(&env, &["migrate", "--status"], None).await;
    assert!(status.stdout.lines().all(|l| l.contains("\tapplied\t")), "{}", status.stdout);
    assert_eq!(chime(&env, &["migrate", "--sql"], None).await.stdout.trim(), "SET lock_timeout = '10s';");
    let out = chime(&env, &["biz-type", "list"], None).await;
    assert!(out.ok, "{}", out.stderr);
}

/// With CHIME_AUTO_MIGRATE=false a node refuses a schema older than it needs (the previous
/// release's: without migration 7), says which command to run, and changes nothing.
#[tokio::test]
async fn serve_without_auto_migrate_refuses_an_older_schema() {
    let db_url = fresh_database().await;
    let pool = chime::db::connect(&db_url, 2).await.unwrap();
    sqlx::query("DELETE FROM _sqlx_migrations WHERE version = 7").execute(&pool).await.unwrap();
    sqlx::query("ALTER TABLE attempts DROP COLUMN redirected_to").execute(&pool).await.unwrap();

    let listen = format!("127.0.0.1:{}", free_port());
    let env = [("DATABASE_URL", db_url.as_str()), ("CHIME_LISTEN", listen.as_str()), ("CHIME_AUTO_MIGRATE", "false")];
    let out = tokio::time::timeout(Duration::from_secs(30), chime(&env, &["serve"], None)).await.expect("chime serve did not stop");
    assert!(!out.ok);
    assert!(
        out.stderr.contains("CHIME_AUTO_MIGRATE is false")
            && out.stderr.contains("pending migrations 7 (attempts redirected to); run `chime migrate` first"),
        "{}",
        out.stderr
    );
    let applied: bool = sqlx::query_scalar("SELECT EXISTS (SELECT FROM _sqlx_migrations WHERE version = 7)").fetch_one(&pool).await.unwrap();
    assert!(!applied, "the node migrated");
}

/// A migration queued behind a long transaction gives up after its lock_timeout (10 s)
/// instead of waiting, with every later read and write of the table queued behind it.
/// Before, `chime migrate` waited as long as the transaction did.
#[tokio::test]
async fn a_migration_behind_a_long_transaction_gives_up() {
    let db_url = fresh_database().await;
    let pool = chime::db::connect(&db_url, 2).await.unwrap();
    sqlx::query("DELETE FROM _sqlx_migrations WHERE version = 7").execute(&pool).await.unwrap();
    sqlx::query("ALTER TABLE attempts DROP COLUMN redirected_to").execute(&pool).await.unwrap();
    // A long reader of `attempts`: migration 7's ALTER TABLE needs ACCESS EXCLUSIVE on it.
    let mut reader = pool.begin().await.unwrap();
    sqlx::query("SELECT count(*) FROM attempts").execute(&mut *reader).await.unwrap();

    let env = [("DATABASE_URL", db_url.as_str())];
    let started = std::time::Instant::now();
    let out = tokio::time::timeout(Duration::from_secs(60), chime(&env, &["migrate"], None)).await.expect("chime migrate waited on");
    assert!(!out.ok);
    assert!(out.stderr.contains("lock timeout"), "{}", out.stderr);
    assert!(started.elapsed() < Duration::from_secs(30), "gave up after {:?}", started.elapsed());
    reader.rollback().await.unwrap();
    let out = chime(&env, &["migrate"], None).await;
    assert!(out.ok, "{}", out.stderr);
}

/// Migration 0025 on a database where user names differ only in case: the oldest keeps its
/// name, the others are renamed `<name>-<id>` (cut to 64 characters) with an audit entry
/// naming the old name, keep their passwords, and `chime migrate` succeeds.
#[tokio::test]
async fn user_names_that_differ_only_in_case_are_renamed_by_the_migration() {
    let db_url = crate::helpers::empty_database().await;
    let pool = chime::db::connect(&db_url, 2).await.unwrap();
    let mut before = sqlx::migrate::Migrator { ignore_missing: true, ..sqlx::migrate!() };
    before.migrations = before.migrations.iter().filter(|m| m.version < 25).cloned().collect::<Vec<_>>().into();
    let mut conn = <sqlx::PgConnection as sqlx::Connection>::connect(&db_url).await.unwrap();
    before.run(&mut conn).await.unwrap();
    let long = format!("h{}", "e".repeat(63));
    for name in ["helen", "HELEN", "Helen", "ivan", long.as_str(), &long.to_uppercase()] {
        sqlx::query("INSERT INTO users (username, password_hash, role) VALUES ($1, 'hash of ' || $1, 'support')")
            .bind(name)
            .execute(&pool)
            .await
            .unwrap();
    }

    let env = [("DATABASE_URL", db_url.as_str())];
    let migrate = crate::cli::chime(&env, &["migrate"], None).await;
    assert!(migrate.ok, "{}", migrate.stderr);
    let users: Vec<(String, String)> = sqlx::query_as("SELECT username, password_hash FROM users ORDER BY id").fetch_all(&pool).await.unwrap();
    let audited: Vec<(String, String, serde_json::Value)> =
        sqlx::query_as("SELECT actor, target, before FROM audit_log WHERE action = 'user.rename' ORDER BY id").fetch_all(&pool).await.unwrap();
    println!("users after 0025: {users:?}; audited: {audited:?}");
    let renamed_long = format!("{}-6", &long.to_uppercase()[..62]);
    let names: Vec<&str> = users.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["helen", "HELEN-2", "Helen-3", "ivan", long.as_str(), renamed_long.as_str()]);
    assert_eq!(users[1].1, "hash of HELEN", "the renamed user keeps their password");
    assert_eq!(audited.len(), 3);
    assert_eq!(audited[0], ("chime".to_string(), "HELEN-2".to_string(), serde_json::json!({"name": "HELEN"})));
    let twin = sqlx::query("INSERT INTO users (username, password_hash, role) VALUES ('IVAN', 'x', 'support')").execute(&pool).await;
    assert!(twin.is_err(), "no new pair can be made");
}
