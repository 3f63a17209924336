//! The console's Cluster page, database section (docs/design/contract.md, High availability): the server chime writes to as
//! the server itself reports it, and the standbys streaming from it. The standby is a real
//! WAL sender: `pg_receivewal` streaming from the test server, which PostgreSQL lists in
//! `pg_stat_replication` like any standby.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use chime::config::ServeArgs;
use chime::db::Pool;
use chime::db::embedded_pg;
use sqlx::{Connection, Executor, PgConnection};

use crate::console::{ADMIN_PASSWORD, Console, sign_in};
use crate::helpers::{free_port, spawn_app, spawn_on, wait_until};

/// `pg_receivewal` streaming from the server at `db_url` under `application_name`:
/// killed, and its directory removed, when dropped.
struct WalReceiver {
    child: Child,
    dir: PathBuf,
}

impl WalReceiver {
    fn start(db_url: &str, application_name: &str, synchronous: bool) -> WalReceiver {
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        // Beside the server binaries the harness uses, or where its pg_ctl links to.
        let bin_dir = embedded_pg::find_bin_dir(None).expect("the PostgreSQL binaries");
        let program = [bin_dir.clone(), std::fs::canonicalize(bin_dir.join("pg_ctl")).unwrap().parent().unwrap().to_path_buf()]
            .into_iter()
            .map(|dir| dir.join("pg_receivewal"))
            .find(|p| p.exists())
            .unwrap_or_else(|| "pg_receivewal".into());
        let dir = std::env::temp_dir().join(format!("chime-wal-{}-{}", std::process::id(), COUNTER.fetch_add(1, Ordering::Relaxed)));
        std::fs::create_dir(&dir).unwrap();
        let mut conninfo = url::Url::parse(db_url).unwrap();
        conninfo.query_pairs_mut().append_pair("application_name", application_name);
        let mut cmd = Command::new(program);
        cmd.arg("--dbname").arg(conninfo.as_str()).arg("--directory").arg(&dir).args(["--no-loop", "--no-password"]);
        if synchronous {
            cmd.arg("--synchronous");
        }
        // Its complaints go to the test's output, should it fail to stream.
        let child = cmd.stdin(Stdio::null()).stdout(Stdio::null()).spawn().unwrap_or_else(|e| {
            let _ = std::fs::remove_dir_all(&dir);
            panic!("starting pg_receivewal: {e}")
        });
        WalReceiver { child, dir }
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for WalReceiver {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn unique_name(what: &str) -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    format!("chime_{what}_{}_{}", std::process::id(), COUNTER.fetch_add(1, Ordering::Relaxed))
}

/// The Cluster page's row for the standby named `name`, if it lists one.
fn standby_row(body: &str, name: &str) -> Option<String> {
    let at = body.find(&format!("<td>{name}</td>"))?;
    let start = body[..at].rfind("<tr>").unwrap();
    let end = at + body[at..].find("</tr>").unwrap();
    Some(body[start..end].to_string())
}

/// Loads the Cluster page until `done` holds for its body (at most 30 s); returns the body.
async fn cluster_page_until(console: &Console, what: &str, done: impl Fn(&str) -> bool) -> String {
    wait_until(&format!("the Cluster page showing {what}"), Duration::from_secs(30), || async {
        let page = console.get("/console/cluster").await;
        assert_eq!(page.status, 200, "{}", page.body);
        if done(&page.body) { Ok(page.body) } else { Err(format!("\n{}", page.body)) }
    })
    .await
}

/// What the server says about where this session reached it, as the page should put it.
async fn server_address(pool: &Pool) -> String {
    let (host, port, directories, port_setting): (Option<String>, Option<i32>, String, String) =
        sqlx::query_as("SELECT host(inet_server_addr()), inet_server_port(), current_setting('unix_socket_directories'), current_setting('port')")
            .fetch_one(pool)
            .await
            .unwrap();
    match (host, port) {
        (Some(host), Some(port)) => format!("<code>{host}</code> port {port}"),
        // The harness's server has one socket directory, in quotes in the setting.
        _ => format!("Unix socket in <code>{}</code>, port {port_setting}", directories.trim_matches('"')),
    }
}

/// The page names the server as it reports itself (over the harness's Unix socket: the
/// socket directory and port), says it is the primary, gives its version, and says that no
/// standby streams from it.
#[tokio::test]
async fn cluster_page_shows_the_database_server_chime_writes_to() {
    let app = spawn_app().await;
    let console = sign_in(&app, "admin", ADMIN_PASSWORD).await;
    let body = console.get("/console/cluster").await.body;

    let address = server_address(&app.pool).await;
    let version: String = sqlx::query_scalar("SELECT current_setting('server_version')").fetch_one(&app.pool).await.unwrap();
    assert!(body.contains(&format!("<dd id=\"db-server\">{address}</dd>")), "{address} in:\n{body}");
    assert!(body.contains("<dd id=\"db-role\">primary</dd>"), "{body}");
    assert!(body.contains(&format!("<dd id=\"db-version\">PostgreSQL {version}</dd>")), "{version} in:\n{body}");
    assert!(body.contains("none asked for: replication, if any, is asynchronous"), "{body}");
}

/// A WAL receiver streaming from the test server is listed by its application name with
/// its state while it runs, and no longer once it is killed.
#[tokio::test]
async fn cluster_page_lists_a_streaming_standby_until_it_goes() {
    let app = spawn_app().await;
    let console = sign_in(&app, "admin", ADMIN_PASSWORD).await;
    let name = unique_name("standby");
    let mut receiver = WalReceiver::start(&app.db_url, &name, false);

    let body =
        cluster_page_until(&console, "the standby streaming", |b| standby_row(b, &name).is_some_and(|r| r.contains("<td>streaming</td>"))).await;
    let row = standby_row(&body, &name).unwrap();
    assert!(row.contains("<td>async</td>"), "{row}");
    if server_address(&app.pool).await.starts_with("Unix socket") {
        assert!(row.contains("<td>Unix socket</td>"), "the receiver came the harness's way:\n{row}");
    }

    receiver.kill();
    let body = cluster_page_until(&console, "the standby gone", |b| standby_row(b, &name).is_none()).await;
    assert!(!body.contains(&name));
}

/// chime's database role without pg_monitor sees that a standby streams but not how: the
/// page says which role would show it, rather than blank cells.
#[tokio::test]
async fn cluster_page_says_the_standby_details_need_pg_monitor() {
    let app = spawn_app().await;
    // A member of the tables' owner: it may do all chime does, but is no superuser and
    // has no pg_read_all_stats (pg_monitor).
    let role = unique_name("unmonitored");
    let owner: String = sqlx::query_scalar("SELECT current_user::text").fetch_one(&app.pool).await.unwrap();
    app.pool.execute(sqlx::AssertSqlSafe(format!("CREATE ROLE {role} LOGIN IN ROLE {owner}"))).await.unwrap();
    let mut url = url::Url::parse(&app.db_url).unwrap();
    url.set_username(&role).unwrap();
    let unmonitored = spawn_on(url.to_string(), ServeArgs { engine: false, ..ServeArgs::default() }).await;
    let console = sign_in(&unmonitored, "admin", ADMIN_PASSWORD).await;
    let name = unique_name("standby");
    let _receiver = WalReceiver::start(&app.db_url, &name, false);

    let body = cluster_page_until(&console, "the standby", |b| standby_row(b, &name).is_some()).await;
    let row = standby_row(&body, &name).unwrap();
    assert!(row.contains("details need the pg_monitor role"), "{row}");
    // Over a Unix socket (the harness's own server), the directory is a setting only
    // pg_monitor may read; a TCP address is for all to see.
    let mut address = server_address(&app.pool).await;
    if address.starts_with("Unix socket") {
        let port: String = sqlx::query_scalar("SELECT current_setting('port')").fetch_one(&app.pool).await.unwrap();
        address = format!("Unix socket (its directory needs the pg_monitor role), port {port}");
    }
    assert!(body.contains(&format!("<dd id=\"db-server\">{address}</dd>")), "{address} in:\n{body}");
    assert!(!row.contains("streaming"), "{row}");
}

/// On a server with `synchronous_standby_names` set, over TCP: the page names the address
/// and port the server reports, the synchronous standby as `sync`, and, once that standby
/// is gone and commits are synchronous, that commits wait.
#[tokio::test]
async fn cluster_page_shows_synchronous_replication_and_a_missing_sync_standby() {
    let mut pg = embedded_pg::start_throwaway().await.expect("starting a throwaway PostgreSQL");
    let port = free_port();
    let standby = unique_name("sync");
    let mut conn = PgConnection::connect(&pg.url("postgres")).await.unwrap();
    for setting in [
        "listen_addresses = '127.0.0.1'".to_string(),
        format!("port = {port}"),
        format!("synchronous_standby_names = '{standby}'"),
        // For now commits do not wait: chime has to migrate and sign in first.
        "synchronous_commit = 'local'".to_string(),
    ] {
        conn.execute(sqlx::AssertSqlSafe(format!("ALTER SYSTEM SET {setting}"))).await.unwrap();
    }
    conn.close().await.unwrap();
    // listen_addresses and port take a restart; the cluster is fresh, so a hard stop is fine.
    pg.crash().await.unwrap();
    pg.restart().await.unwrap();
    let url = format!("postgres://postgres@127.0.0.1:{port}/chime?sslmode=disable");
    let mut conn = PgConnection::connect(&url).await.unwrap();
    chime::db::migrate_on(&mut conn).await.unwrap();
    let app = spawn_on(url.clone(), ServeArgs { engine: false, ..ServeArgs::default() }).await;
    let console = sign_in(&app, "admin", ADMIN_PASSWORD).await;

    let body = console.get("/console/cluster").await.body;
    assert!(body.contains(&format!("<dd id=\"db-server\"><code>127.0.0.1</code> port {port}</dd>")), "{body}");
    assert!(body.contains(&format!("<dd id=\"db-host\"><code>127.0.0.1:{port}</code>")), "{body}");
    assert!(body.contains(&format!("<code>{standby}</code> (synchronous_commit local)")), "{body}");
    assert!(body.contains("No standby is streaming from this server"), "{body}");
    assert!(!body.contains("commits wait"), "with synchronous_commit local they do not:\n{body}");

    let mut receiver = WalReceiver::start(&url, &standby, true);
    let body =
        cluster_page_until(&console, "the synchronous standby", |b| standby_row(b, &standby).is_some_and(|r| r.contains("<td>sync</td>"))).await;
    let row = standby_row(&body, &standby).unwrap();
    assert!(row.contains("<td>127.0.0.1</td>") && row.contains("<td>streaming</td>"), "{row}");

    receiver.kill();
    conn.execute("ALTER SYSTEM SET synchronous_commit = 'on'").await.unwrap();
    conn.execute("SELECT pg_reload_conf()").await.unwrap();
    cluster_page_until(&console, "that commits wait", |b| {
        standby_row(b, &standby).is_none() && b.contains("no synchronous standby is connected: commits wait until one is")
    })
    .await;
}
