//! Real replicated PostgreSQL for the HA tests: a server started from initdb, a standby
//! made with pg_basebackup, and a pg_auto_failover formation (monitor + two nodes).
//!
//! Everything runs as the `postgres` user (PostgreSQL refuses root), each server or keeper
//! in a process group of its own, so that a kill -9 takes its backends and services with
//! it. Dropping a `Server` or a `Formation` kills its processes and removes its directory,
//! also when the test panics (its logs are printed then).

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::{Pid, User, chown};
use sqlx::{Connection, PgConnection};

use crate::helpers::{free_port, wait_until};

/// PostgreSQL 15's binaries: pg_auto_failover's Debian packages are built for 15.
const BIN: &str = "/usr/lib/postgresql/15/bin";

/// A directory of its own under the temp dir, given to the `postgres` user; removed on drop.
struct Dir(PathBuf);

impl Dir {
    fn new(what: &str) -> Dir {
        let user = postgres_user();
        let path = std::env::temp_dir().join(format!("chime-ha-{what}-{}-{:08x}", std::process::id(), rand::random::<u32>()));
        fs::create_dir(&path).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o700)).unwrap();
        chown(&path, Some(user.uid), Some(user.gid)).unwrap();
        Dir(path)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn postgres_user() -> User {
    User::from_name("postgres").unwrap().expect("the HA tests run PostgreSQL as the `postgres` user, and there is none")
}

/// A command for a PostgreSQL or pg_autoctl binary, run as `postgres`, in a process group
/// of its own, its output appended to `log`.
fn command(program: &str, log: &Path) -> Command {
    let user = postgres_user();
    let path = if program == "pg_autoctl" { PathBuf::from("/usr/bin/pg_autoctl") } else { Path::new(BIN).join(program) };
    assert!(path.exists(), "{} is missing: the HA tests need PostgreSQL 15 and pg_auto_failover (see tests/ha/main.rs)", path.display());
    let log = fs::OpenOptions::new().create(true).append(true).open(log).unwrap();
    let mut cmd = Command::new(path);
    cmd.uid(user.uid.as_raw())
        .gid(user.gid.as_raw())
        .process_group(0)
        .env("PATH", format!("{BIN}:/usr/bin:/bin"))
        .env("PG_CONFIG", format!("{BIN}/pg_config"))
        .env_remove("PGPORT")
        .env_remove("PGHOST")
        .env_remove("PGDATA")
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log);
    cmd
}

/// Runs a command to the end; panics with its log when it fails.
fn run(mut cmd: Command, log: &Path) {
    let status = cmd.status().unwrap();
    assert!(status.success(), "{cmd:?} failed ({status}):\n{}", tail(log));
}

/// The last 40 lines of a log.
fn tail(log: &Path) -> String {
    let text = fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

/// Kills a process group, and the postmaster of `pgdata` in case it left the group.
/// Its children too: a background worker that does not watch for the postmaster's death
/// (pg_auto_failover's health check) would otherwise outlive it.
fn kill_group(child: &mut Child, pgdata: &Path) {
    let postmaster = postmaster_pid(pgdata);
    let children = postmaster.map(children_of).unwrap_or_default();
    let _ = killpg(Pid::from_raw(child.id() as i32), Signal::SIGKILL);
    for pid in postmaster.into_iter().chain(children) {
        let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
    }
    let _ = child.wait();
    kill_stragglers(pgdata);
}

/// Kills what is left of the server of `pgdata` and waits until it is gone: every process
/// working in that directory (PostgreSQL's processes run in their data directory), such as
/// a backend forked after its postmaster's children were listed. In one CI run a killed
/// primary's rejoin waited past its minute: the postgres its keeper started never replaced
/// the old postmaster.pid. A process of the old server still attached to its shared memory
/// is one way that happens ("pre-existing shared memory block is still in use"); a crashed
/// machine leaves none.
fn kill_stragglers(pgdata: &Path) {
    let Ok(dir) = pgdata.canonicalize() else { return };
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let Ok(entries) = fs::read_dir("/proc") else { return };
        let left: Vec<i32> = entries
            .filter_map(|e| {
                let pid: i32 = e.ok()?.file_name().to_str()?.parse().ok()?;
                (fs::read_link(format!("/proc/{pid}/cwd")).ok()? == dir).then_some(pid)
            })
            .collect();
        if left.is_empty() || Instant::now() > deadline {
            return;
        }
        for pid in left {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The processes whose parent is `parent`, from /proc.
fn children_of(parent: i32) -> Vec<i32> {
    let Ok(entries) = fs::read_dir("/proc") else { return Vec::new() };
    entries
        .filter_map(|e| {
            let pid: i32 = e.ok()?.file_name().to_str()?.parse().ok()?;
            let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            // After the command name in parentheses: state, then the parent's pid.
            let ppid: i32 = stat.rsplit_once(')')?.1.split_whitespace().nth(1)?.parse().ok()?;
            (ppid == parent).then_some(pid)
        })
        .collect()
}

/// The postmaster's pid, from the first line of postmaster.pid.
fn postmaster_pid(pgdata: &Path) -> Option<i32> {
    fs::read_to_string(pgdata.join("postmaster.pid")).ok()?.lines().next()?.trim().parse().ok()
}

/// A URL for a database on a local server, over TCP.
pub fn url(port: u16, database: &str) -> String {
    format!("postgres://postgres@127.0.0.1:{port}/{database}?sslmode=disable")
}

/// One value from a server, or the error.
pub async fn query_one<T>(port: u16, sql: &str) -> Result<T, sqlx::Error>
where
    T: for<'r> sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres> + Send + Unpin,
{
    let mut conn = PgConnection::connect(&url(port, "postgres")).await?;
    let value = sqlx::query_scalar(sqlx::AssertSqlSafe(sql)).fetch_one(&mut conn).await;
    let _ = conn.close().await;
    value
}

/// Whether the server is in recovery (a standby); `None` when it does not answer.
pub async fn in_recovery(port: u16) -> Option<bool> {
    query_one(port, "SELECT pg_is_in_recovery()").await.ok()
}

/// Advisory locks held on a server, in any database.
pub async fn advisory_locks(port: u16) -> i64 {
    query_one(port, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'").await.unwrap()
}

/// Client sessions on a server's `chime` database that have lived more than 2 s: chime's
/// pools and its leader and LISTEN sessions, not the probe that opens a session to ask
/// whether the server is a standby and closes it at once.
pub async fn chime_sessions(port: u16) -> i64 {
    query_one(
        port,
        "SELECT count(*) FROM pg_stat_activity
          WHERE datname = 'chime' AND backend_type = 'client backend'
            AND backend_start < now() - interval '2 seconds'",
    )
    .await
    .unwrap()
}

/// A PostgreSQL 15 server on 127.0.0.1 and a free port, set up for streaming replication
/// (and pg_rewind), every local connection trusted.
pub struct Server {
    pub port: u16,
    dir: Dir,
    postmaster: Option<Child>,
}

impl Server {
    /// A new server from initdb, with a `chime` database.
    pub async fn primary() -> Server {
        let dir = Dir::new("pg");
        let log = dir.0.join("initdb.log");
        let mut initdb = command("initdb", &log);
        // trust covers replication connections from 127.0.0.1 in the default pg_hba.conf.
        initdb.args(["-A", "trust", "-U", "postgres", "--no-sync", "-D"]).arg(dir.0.join("data"));
        run(initdb, &log);
        // No crash here: fsync off for speed (the formation's servers keep it on).
        let conf = "wal_level = replica\nmax_wal_senders = 10\nhot_standby = on\nwal_log_hints = on\n\
                    fsync = off\nlog_min_messages = warning\n";
        append(&dir.0.join("data/postgresql.conf"), conf);
        let mut server = Server { port: free_port(), dir, postmaster: None };
        server.start().await;
        let mut conn = PgConnection::connect(&url(server.port, "postgres")).await.unwrap();
        sqlx::query("CREATE DATABASE chime").execute(&mut conn).await.unwrap();
        server
    }

    /// A hot standby of `primary` (pg_basebackup -R -X stream), started; its
    /// application_name (for `synchronous_standby_names`) is `standby_<port>`.
    pub async fn standby_of(primary: &Server) -> Server {
        let dir = Dir::new("pg");
        let port = free_port();
        let log = dir.0.join("basebackup.log");
        let mut backup = command("pg_basebackup", &log);
        backup
            .args(["-h", "127.0.0.1", "-p", &primary.port.to_string(), "-U", "postgres", "-R", "-X", "stream", "-c", "fast", "-D"])
            .arg(dir.0.join("data"));
        run(backup, &log);
        // -R wrote primary_conninfo; this one (later in the file, so it wins) names the standby.
        append(
            &dir.0.join("data/postgresql.auto.conf"),
            &format!("primary_conninfo = 'host=127.0.0.1 port={} user=postgres application_name=standby_{port}'\n", primary.port),
        );
        let mut server = Server { port, dir, postmaster: None };
        server.start().await;
        wait_until("the standby in recovery", Duration::from_secs(30), || async { in_recovery(port).await == Some(true) }).await;
        server
    }

    /// Makes `standby` synchronous: the primary's commits wait for it.
    pub async fn make_synchronous(&self, standby: &Server) {
        let name = format!("standby_{}", standby.port);
        let mut conn = PgConnection::connect(&url(self.port, "postgres")).await.unwrap();
        sqlx::query(sqlx::AssertSqlSafe(format!("ALTER SYSTEM SET synchronous_standby_names = '{name}'"))).execute(&mut conn).await.unwrap();
        sqlx::query("ALTER SYSTEM SET synchronous_commit = 'on'").execute(&mut conn).await.unwrap();
        sqlx::query("SELECT pg_reload_conf()").execute(&mut conn).await.unwrap();
        let port = self.port;
        wait_until("the standby synchronous", Duration::from_secs(30), || {
            let name = name.clone();
            async move {
                let sql = format!("SELECT count(*) FROM pg_stat_replication WHERE application_name = '{name}' AND sync_state = 'sync'");
                query_one::<i64>(port, &sql).await.unwrap_or(0) == 1
            }
        })
        .await;
    }

    fn pgdata(&self) -> PathBuf {
        self.dir.0.join("data")
    }

    fn log(&self) -> PathBuf {
        self.dir.0.join("postgres.log")
    }

    /// Starts the postmaster and waits until it accepts sessions.
    pub async fn start(&mut self) {
        let mut postgres = command("postgres", &self.log());
        postgres.arg("-D").arg(self.pgdata()).args(["-p", &self.port.to_string(), "-c", "listen_addresses=127.0.0.1", "-k"]).arg(&self.dir.0);
        self.postmaster = Some(postgres.spawn().unwrap());
        let started = Instant::now();
        while query_one::<i32>(self.port, "SELECT 1").await.is_err() {
            let exited = self.postmaster.as_mut().unwrap().try_wait().unwrap();
            assert!(exited.is_none() && started.elapsed() < Duration::from_secs(30), "PostgreSQL did not start:\n{}", tail(&self.log()));
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Promotes a standby (`pg_ctl promote`, waiting until it is done).
    pub fn promote(&self) {
        let log = self.dir.0.join("promote.log");
        let mut promote = command("pg_ctl", &log);
        promote.args(["promote", "-w", "-D"]).arg(self.pgdata());
        run(promote, &log);
    }

    /// kill -9 of the postmaster and its backends.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.postmaster.take() {
            kill_group(&mut child, &self.pgdata());
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("--- PostgreSQL on port {} ---\n{}", self.port, tail(&self.log()));
        }
        self.kill();
    }
}

fn append(file: &Path, text: &str) {
    use std::io::Write;
    fs::OpenOptions::new().append(true).open(file).unwrap().write_all(text.as_bytes()).unwrap();
}

/// A pg_auto_failover formation: a monitor and two PostgreSQL nodes, each run by its
/// `pg_autoctl` keeper, the second a synchronous standby of the first.
pub struct Formation {
    dir: Dir,
    monitor: Keeper,
    pub nodes: [Keeper; 2],
}

pub struct Keeper {
    pub name: String,
    pub port: u16,
    process: Option<Child>,
}

/// The monitor's health checks, made fast: it checks every node each 1 s, gives up on one
/// after a 1 s timeout and one retry 0.5 s later, and considers a node unhealthy once it
/// has not reported for 2 s. A demoted primary it cannot reach is given 2 s (not 30 s)
/// before the promoted node accepts writes.
const MONITOR_SETTINGS: &[(&str, &str)] = &[
    ("pgautofailover.health_check_period", "1000"),
    ("pgautofailover.health_check_timeout", "1000"),
    ("pgautofailover.health_check_max_retries", "1"),
    ("pgautofailover.health_check_retry_delay", "500"),
    ("pgautofailover.node_considered_unhealthy_timeout", "2000"),
    ("pgautofailover.primary_demote_timeout", "2000"),
];

impl Formation {
    /// A monitor, a primary and its synchronous secondary, all running.
    pub async fn start() -> Formation {
        let dir = Dir::new("paf");
        for sub in ["xdg", "xdg/config", "xdg/data", "xdg/run"] {
            let path = dir.0.join(sub);
            fs::create_dir(&path).unwrap();
            let user = postgres_user();
            chown(&path, Some(user.uid), Some(user.gid)).unwrap();
        }
        let mut formation = Formation {
            monitor: Keeper { name: "monitor".into(), port: free_port(), process: None },
            nodes: [
                Keeper { name: "node1".into(), port: free_port(), process: None },
                Keeper { name: "node2".into(), port: free_port(), process: None },
            ],
            dir,
        };
        let monitor_port = formation.monitor.port;
        let args = ["create", "monitor", "--hostname", "127.0.0.1", "--auth", "trust", "--no-ssl", "--run"];
        let mut cmd = formation.autoctl(&formation.monitor, &args);
        cmd.args(["--pgport", &monitor_port.to_string()]);
        formation.monitor.process = Some(cmd.spawn().unwrap());
        wait_until("the monitor up", Duration::from_secs(60), || async {
            query_monitor::<i64>(monitor_port, "SELECT count(*) FROM pgautofailover.formation").await.is_ok()
        })
        .await;
        let mut conn = PgConnection::connect(&url(monitor_port, "pg_auto_failover")).await.unwrap();
        for (name, value) in MONITOR_SETTINGS {
            sqlx::query(sqlx::AssertSqlSafe(format!("ALTER SYSTEM SET {name} = {value}"))).execute(&mut conn).await.unwrap();
        }
        sqlx::query("SELECT pg_reload_conf()").execute(&mut conn).await.unwrap();

        for i in 0..2 {
            let node = &formation.nodes[i];
            let monitor_uri = format!("postgres://autoctl_node@127.0.0.1:{monitor_port}/pg_auto_failover?sslmode=disable");
            let args = [
                "create",
                "postgres",
                "--hostname",
                "127.0.0.1",
                "--listen",
                "127.0.0.1",
                "--auth",
                "trust",
                "--no-ssl",
                "--dbname",
                "chime",
                "--run",
            ];
            let mut cmd = formation.autoctl(node, &args);
            cmd.args(["--pgport", &node.port.to_string(), "--name", &node.name, "--monitor", &monitor_uri]);
            let child = cmd.spawn().unwrap();
            formation.nodes[i].process = Some(child);
            if i == 0 {
                formation.wait_state(&[("node1", "single")], Duration::from_secs(60)).await;
            }
        }
        formation.wait_state(&[("node1", "primary"), ("node2", "secondary")], Duration::from_secs(120)).await;
        // pg_auto_failover makes the secondary synchronous by itself (the formation's
        // number_sync_standbys 0 with the node's replication quorum true gives
        // `ANY 1 (pgautofailover_standby_2)`): what the zero-loss promise rests on.
        let primary = formation.nodes[0].port;
        wait_until("node2 a synchronous standby of node1", Duration::from_secs(30), || async {
            let sync = "SELECT count(*) FROM pg_stat_replication WHERE sync_state IN ('sync', 'quorum')";
            query_one::<i64>(primary, sync).await.unwrap_or(0) == 1
                && query_one::<String>(primary, "SHOW synchronous_commit").await.ok().as_deref() == Some("on")
        })
        .await;
        formation
    }

    /// `pg_autoctl <args> --pgdata <the keeper's>`, as `postgres`, its configuration and
    /// state under the formation's directory.
    fn autoctl(&self, keeper: &Keeper, args: &[&str]) -> Command {
        let mut cmd = command("pg_autoctl", &self.log(keeper));
        cmd.args(args)
            .arg("--pgdata")
            .arg(self.pgdata(keeper))
            .env("HOME", &self.dir.0)
            .env("XDG_CONFIG_HOME", self.dir.0.join("xdg/config"))
            .env("XDG_DATA_HOME", self.dir.0.join("xdg/data"))
            .env("XDG_RUNTIME_DIR", self.dir.0.join("xdg/run"));
        cmd
    }

    fn pgdata(&self, keeper: &Keeper) -> PathBuf {
        self.dir.0.join(&keeper.name)
    }

    fn log(&self, keeper: &Keeper) -> PathBuf {
        self.dir.0.join(format!("{}.log", keeper.name))
    }

    /// The multi-host URL of the formation's `chime` database (what `pg_autoctl show uri`
    /// gives, without TLS).
    pub fn url(&self) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/chime?target_session_attrs=read-write&sslmode=disable",
            self.nodes[0].port, self.nodes[1].port
        )
    }

    /// Each node's reported and assigned state, as the monitor has them.
    pub async fn states(&self) -> Vec<(String, String, String)> {
        let mut conn = PgConnection::connect(&url(self.monitor.port, "pg_auto_failover")).await.unwrap();
        sqlx::query_as("SELECT nodename, reportedstate::text, goalstate::text FROM pgautofailover.node ORDER BY nodeid")
            .fetch_all(&mut conn)
            .await
            .unwrap()
    }

    /// Waits until each named node has reached (reported and been assigned) its state. A
    /// new standby's pg_basebackup waits for a checkpoint, which pg_autoctl asks for at the
    /// default (spread) pace: an immediate CHECKPOINT on the nodes hurries it.
    pub async fn wait_state(&self, want: &[(&str, &str)], within: Duration) {
        let started = Instant::now();
        loop {
            let states = self.states().await;
            let reached = want.iter().all(|(name, state)| states.iter().any(|(n, r, g)| n == name && r == state && g == state));
            if reached {
                return;
            }
            assert!(started.elapsed() < within, "the formation did not reach {want:?} in {within:?}: {states:?}\n{}", self.logs());
            for node in &self.nodes {
                let _ = query_one::<String>(node.port, "CHECKPOINT").await;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// kill -9 of a node's keeper and its PostgreSQL: the node is gone, as in a crash.
    pub fn kill(&mut self, node: usize) {
        let pgdata = self.pgdata(&self.nodes[node]);
        if let Some(mut child) = self.nodes[node].process.take() {
            kill_group(&mut child, &pgdata);
        }
    }

    /// Runs a node's keeper again (`pg_autoctl run`): a former primary rejoins as a standby.
    pub fn restart(&mut self, node: usize) {
        let mut cmd = self.autoctl(&self.nodes[node], &["run"]);
        self.nodes[node].process = Some(cmd.spawn().unwrap());
    }

    /// A `chime serve` on the formation's URL, its log kept beside the keepers' and shown
    /// (warnings and errors) when the test fails.
    pub async fn chime_node(&self) -> (tokio::process::Child, String) {
        let nodes = fs::read_dir(&self.dir.0).unwrap().filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().starts_with("chime-")).count();
        let log = fs::File::create(self.dir.0.join(format!("chime-{}.log", nodes + 1))).unwrap();
        crate::helpers::chime_process_logging(&self.url(), &[], log).await
    }

    fn logs(&self) -> String {
        let mut logs: String =
            [&self.monitor, &self.nodes[0], &self.nodes[1]].iter().map(|k| format!("--- {} ---\n{}\n", k.name, tail(&self.log(k)))).collect();
        let mut chime: Vec<PathBuf> = fs::read_dir(&self.dir.0)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with("chime-"))
            .collect();
        chime.sort();
        for path in chime {
            let text = fs::read_to_string(&path).unwrap_or_default();
            let lines: Vec<&str> = text.lines().filter(|l| l.contains("WARN") || l.contains("ERROR")).collect();
            logs += &format!(
                "--- {} (warnings and errors) ---\n{}\n",
                path.file_name().unwrap().to_string_lossy(),
                lines[lines.len().saturating_sub(30)..].join("\n")
            );
        }
        logs
    }
}

/// A query on the monitor's database.
async fn query_monitor<T>(port: u16, sql: &str) -> Result<T, sqlx::Error>
where
    T: for<'r> sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres> + Send + Unpin,
{
    let mut conn = PgConnection::connect(&url(port, "pg_auto_failover")).await?;
    sqlx::query_scalar(sqlx::AssertSqlSafe(sql)).fetch_one(&mut conn).await
}

impl Drop for Formation {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("{}", self.logs());
        }
        for i in 0..2 {
            self.kill(i);
        }
        let pgdata = self.pgdata(&self.monitor);
        if let Some(mut child) = self.monitor.process.take() {
            kill_group(&mut child, &pgdata);
        }
    }
}

/// HAProxy in TCP mode in front of a primary and its standby (the standby as a backup), as
/// Patroni deployments put it: a health check every 200 ms, and the sessions of a server
/// marked down cut. It knows nothing of roles: it sends new sessions to the standby while
/// the primary is down, promoted or not. Killed on drop.
pub struct Proxy {
    pub port: u16,
    dir: Dir,
    process: Child,
}

impl Proxy {
    pub async fn start(primary: &Server, standby: &Server) -> Proxy {
        let dir = Dir::new("haproxy");
        let port = free_port();
        let config = dir.0.join("haproxy.cfg");
        fs::write(
            &config,
            format!(
                "defaults\n  mode tcp\n  timeout connect 1s\n  timeout client 1h\n  timeout server 1h\n\
                 listen postgres\n  bind 127.0.0.1:{port}\n\
                   default-server inter 200ms fall 1 rise 1 on-marked-down shutdown-sessions\n\
                   server primary 127.0.0.1:{} check\n  server standby 127.0.0.1:{} check backup\n",
                primary.port, standby.port
            ),
        )
        .unwrap();
        let haproxy = Path::new("/usr/sbin/haproxy");
        assert!(haproxy.exists(), "/usr/sbin/haproxy is missing: the HA tests need Debian's haproxy (see tests/ha/main.rs)");
        let log = fs::File::create(dir.0.join("haproxy.log")).unwrap();
        let process = Command::new(haproxy)
            .args(["-db", "-f"])
            .arg(&config)
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        let proxy = Proxy { port, dir, process };
        wait_until("HAProxy passing sessions to the primary", Duration::from_secs(10), || async { in_recovery(port).await == Some(false) }).await;
        proxy
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("--- HAProxy ---\n{}", tail(&self.dir.0.join("haproxy.log")));
        }
        let _ = killpg(Pid::from_raw(self.process.id() as i32), Signal::SIGKILL);
        let _ = self.process.wait();
    }
}
