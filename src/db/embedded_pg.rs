//! The embedded PostgreSQL that `chime` runs when no `DATABASE_URL` is set.
//!
//! Why embed at all: a first `chime serve` should work on a machine that merely has the
//! PostgreSQL binaries installed, with no server to set up, no role or password to create.
//! We drive the stock `initdb`/`pg_ctl`/`postgres`, so the database is the real thing and
//! an operator can later point other tools at it or move to an external server.
//!
//! Layout under the data directory (`CHIME_DATA_DIR`):
//!
//! - `pgdata/`: the cluster. It lives under the data directory, not a temp dir, so timers
//!   survive restarts. It is created as `pgdata.init/` and renamed only once `initdb` and
//!   our configuration are complete, so a crash during the first start never leaves a
//!   half-made cluster that later starts look at.
//! - `run/`: the Unix socket directory. The server listens on no TCP port at all and lets
//!   anyone who reaches the socket in as `postgres` without a password (`trust`). That is
//!   safe only because `run/` is mode 0700 and owned by the database user: reaching the
//!   socket already requires being that user (or root). The socket settings sit in
//!   `pgdata/chime.conf`, rewritten at every start, so a moved data directory still works.
//! - `postgres.log`: the server log; error messages quote its tail.
//! - `chime.lock`: an exclusive `flock` held by the one chime process that manages the
//!   cluster. The kernel drops it when that process dies however it dies, so holding it
//!   proves no one else is managing the cluster. A second chime gets [`EmbeddedPgError::Busy`]
//!   and attaches to the running server through [`socket_url`] instead.
//!
//! `initdb` and `postgres` refuse to run as root. When chime runs as root, the cluster is
//! run as an unprivileged user: the owner of an existing `pgdata/`, else `postgres`, else
//! `nobody`. That user must be able to traverse every directory above the data directory,
//! which we check up front because PostgreSQL's own error for it is obscure.
//!
//! `pg_ctl` puts the postmaster in its own session, so a Ctrl-C at the terminal reaches
//! chime but not the database, and chime shuts the database down cleanly itself. If chime
//! is killed outright, the postmaster keeps running unmanaged; the next chime to take the
//! lock finds it with `pg_ctl status`, stops it and starts afresh.

use std::fmt::Display;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::fd::FromRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use nix::unistd::{Gid, Uid, User, chown, geteuid};
use sqlx::Connection;

/// The database chime's own tables live in.
const DATABASE: &str = "chime";
/// Only names the socket file (`.s.PGSQL.5432`); there is no TCP listener. Fixed here and
/// in the URL so that a stray `PGPORT` in the environment cannot make the two disagree.
const PORT: u16 = 5432;
const LOG_TAIL_LINES: usize = 20;
const PG_CTL_TIMEOUT_SECS: &str = "60";
/// `sun_path` holds 108 bytes including the terminating NUL.
const MAX_SOCKET_PATH: usize = 107;

/// Durability traded for speed in test clusters, which are thrown away anyway.
const THROWAWAY_CONF: &str = "fsync = off\nsynchronous_commit = off\nfull_page_writes = off\n";

#[derive(Debug, thiserror::Error)]
pub enum EmbeddedPgError {
    #[error(
        "PostgreSQL server binaries (initdb, pg_ctl, postgres) not found on PATH, in \
         `pg_config --bindir` or /usr/lib/postgresql/*/bin; install them (Debian/Ubuntu: \
         `apt-get install postgresql`) and/or set CHIME_PG_BIN_DIR, or set DATABASE_URL to \
         use an existing database"
    )]
    BinariesNotFound,

    #[error(
        "{} does not contain the PostgreSQL server binaries (initdb, pg_ctl, postgres); set \
         CHIME_PG_BIN_DIR to the directory that does (for example /usr/lib/postgresql/16/bin) \
         or unset it to search PATH",
        dir.display()
    )]
    BadBinDir { dir: PathBuf },

    #[error(
        "the embedded database in {} is managed by another running chime process (it holds \
         {}/chime.lock); connect through that process, or stop it first",
        data_dir.display(),
        data_dir.display()
    )]
    Busy { data_dir: PathBuf },

    #[error(
        "the database user `{user}` cannot enter {}, so PostgreSQL could not reach its data \
         there; set CHIME_DATA_DIR to a directory that user can reach (for example under \
         /var/lib or /tmp), or open this one with `chmod o+x {}`",
        dir.display(),
        dir.display()
    )]
    Unreachable { dir: PathBuf, user: String },

    #[error("initdb could not create the embedded database cluster (full output appended to {}):\n{log_tail}", log.display())]
    InitDb { log: PathBuf, log_tail: String },

    #[error("the embedded PostgreSQL did not start; last lines of {}:\n{log_tail}", log.display())]
    Start { log: PathBuf, log_tail: String },

    #[error(
        "a PostgreSQL server left running on {} by an earlier chime did not stop; stop it by \
         hand (`pg_ctl stop -D {}`) and retry; last lines of {}:\n{log_tail}",
        pgdata.display(),
        pgdata.display(),
        log.display()
    )]
    StaleServer { pgdata: PathBuf, log: PathBuf, log_tail: String },

    #[error("the embedded PostgreSQL started but chime could not set up its database in it: {0}")]
    Database(#[from] sqlx::Error),

    #[error("{what}: {source}")]
    Io { what: String, source: io::Error },

    #[error("{0}")]
    Other(String),
}

impl From<io::Error> for EmbeddedPgError {
    fn from(source: io::Error) -> Self {
        EmbeddedPgError::Io { what: "embedded PostgreSQL".into(), source }
    }
}

/// Names the file or command behind an I/O error, which a bare `io::Error` never does.
trait Context<T> {
    fn ctx(self, what: impl Display) -> Result<T, EmbeddedPgError>;
}

impl<T> Context<T> for io::Result<T> {
    fn ctx(self, what: impl Display) -> Result<T, EmbeddedPgError> {
        self.map_err(|source| EmbeddedPgError::Io { what: what.to_string(), source })
    }
}

/// Finds a directory holding `initdb`, `pg_ctl` and `postgres`: the override (which must
/// have them), then PATH, then `pg_config --bindir`, then `/usr/lib/postgresql/*/bin`,
/// newest version first.
pub fn find_bin_dir(override_dir: Option<&Path>) -> Result<PathBuf, EmbeddedPgError> {
    if let Some(dir) = override_dir {
        return if has_binaries(dir) { Ok(dir.to_path_buf()) } else { Err(EmbeddedPgError::BadBinDir { dir: dir.to_path_buf() }) };
    }
    let path_dirs = std::env::var_os("PATH").map(|p| std::env::split_paths(&p).collect::<Vec<_>>()).unwrap_or_default();
    let pg_config_dir = Command::new("pg_config")
        .arg("--bindir")
        .stderr(Stdio::null())
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()));
    let mut versioned: Vec<(Vec<u32>, PathBuf)> = fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| {
            let version = e.file_name().to_string_lossy().split('.').map(|n| n.parse().unwrap_or(0)).collect();
            (version, e.path().join("bin"))
        })
        .collect();
    versioned.sort_by(|a, b| b.0.cmp(&a.0));

    path_dirs
        .into_iter()
        .chain(pg_config_dir)
        .chain(versioned.into_iter().map(|(_, dir)| dir))
        .find(|dir| has_binaries(dir))
        .ok_or(EmbeddedPgError::BinariesNotFound)
}

fn has_binaries(dir: &Path) -> bool {
    ["initdb", "pg_ctl", "postgres"].iter().all(|name| fs::metadata(dir.join(name)).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0))
}

/// The URL of the embedded database in `data_dir`, whichever process manages it.
pub fn socket_url(data_dir: &Path, database: &str) -> String {
    let data_dir = fs::canonicalize(data_dir).or_else(|_| std::path::absolute(data_dir)).unwrap_or_else(|_| data_dir.to_path_buf());
    url_for(&data_dir.join("run"), database)
}

/// sqlx takes the socket directory from the `host` query parameter. The explicit port and
/// `sslmode` keep `PGPORT`/`PGSSLMODE` in the environment from overriding them.
fn url_for(run_dir: &Path, database: &str) -> String {
    format!(
        "postgres://postgres@localhost:{PORT}/{}?host={}&sslmode=disable",
        percent_encode(database.as_bytes()),
        percent_encode(run_dir.as_os_str().as_bytes()),
    )
}

fn percent_encode(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    for &b in bytes {
        if b.is_ascii_alphanumeric() || b"-._~/".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The unprivileged account the cluster runs as when chime runs as root.
#[derive(Debug)]
struct DbUser {
    name: String,
    uid: Uid,
    gid: Gid,
}

/// `None` means "as ourselves": only root has to hand the cluster to someone else. An
/// existing cluster keeps its owner, since PostgreSQL refuses a data directory owned by
/// anyone but the user it runs as.
fn db_user(pgdata: &Path) -> Result<Option<DbUser>, EmbeddedPgError> {
    if !geteuid().is_root() {
        return Ok(None);
    }
    if let Ok(meta) = fs::metadata(pgdata)
        && meta.uid() != 0
    {
        let uid = Uid::from_raw(meta.uid());
        let name = match User::from_uid(uid) {
            Ok(Some(u)) => u.name,
            _ => meta.uid().to_string(),
        };
        return Ok(Some(DbUser { name, uid, gid: Gid::from_raw(meta.gid()) }));
    }
    for name in ["postgres", "nobody"] {
        if let Ok(Some(u)) = User::from_name(name) {
            return Ok(Some(DbUser { name: u.name, uid: u.uid, gid: u.gid }));
        }
    }
    Err(EmbeddedPgError::Other(
        "chime runs as root, and PostgreSQL refuses to, but there is neither a `postgres` nor a \
         `nobody` user to run it as; create one (`useradd --system postgres`), run chime as an \
         unprivileged user, or set DATABASE_URL"
            .into(),
    ))
}

/// PostgreSQL only says it cannot access its data directory; naming the blocking directory
/// is what the operator needs. Mode bits only: the child drops supplementary groups
/// (`Command::uid` does so), and ACLs are rare on such paths.
fn check_reachable(dir: &Path, user: &DbUser) -> Result<(), EmbeddedPgError> {
    for ancestor in dir.ancestors() {
        let meta = fs::metadata(ancestor).ctx(format_args!("reading {}", ancestor.display()))?;
        let bit = if meta.uid() == user.uid.as_raw() {
            0o100
        } else if meta.gid() == user.gid.as_raw() {
            0o010
        } else {
            0o001
        };
        if meta.mode() & bit == 0 {
            return Err(EmbeddedPgError::Unreachable { dir: ancestor.to_path_buf(), user: user.name.clone() });
        }
    }
    Ok(())
}

/// A running embedded cluster, stopped by [`EmbeddedPg::stop`] or, failing that, on drop.
#[derive(Debug)]
pub struct EmbeddedPg {
    data_dir: PathBuf,
    bin_dir: PathBuf,
    user: Option<DbUser>,
    running: bool,
    /// Holds the `flock`; closing it (on drop) releases the cluster to other processes.
    _lock: File,
}

impl EmbeddedPg {
    /// Starts (creating on first use) the cluster under `data_dir` and ensures the `chime`
    /// database exists. [`EmbeddedPgError::Busy`] means another process manages it.
    pub async fn start(data_dir: &Path, bin_override: Option<&Path>) -> Result<EmbeddedPg, EmbeddedPgError> {
        let bin_dir = find_bin_dir(bin_override)?;
        Self::start_with(data_dir, bin_dir, "").await
    }

    async fn start_with(data_dir: &Path, bin_dir: PathBuf, extra_conf: &str) -> Result<EmbeddedPg, EmbeddedPgError> {
        let data_dir = std::path::absolute(data_dir).ctx(format_args!("resolving {}", data_dir.display()))?;
        fs::create_dir_all(&data_dir).ctx(format_args!("creating the data directory {}", data_dir.display()))?;
        let data_dir = fs::canonicalize(&data_dir).ctx(format_args!("resolving {}", data_dir.display()))?;

        let lock_path = data_dir.join("chime.lock");
        let mut lock =
            OpenOptions::new().create(true).truncate(false).write(true).open(&lock_path).ctx(format_args!("opening {}", lock_path.display()))?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(fs::TryLockError::WouldBlock) => return Err(EmbeddedPgError::Busy { data_dir }),
            Err(fs::TryLockError::Error(e)) => {
                return Err(e).ctx(format_args!("locking {}", lock_path.display()));
            }
        }
        // For whoever wonders which process holds the lock.
        let _ = lock.set_len(0).and_then(|()| writeln!(lock, "{}", std::process::id()));

        let user = db_user(&data_dir.join("pgdata"))?;
        if let Some(user) = &user {
            check_reachable(&data_dir, user)?;
        }
        let socket = data_dir.join("run").join(format!(".s.PGSQL.{PORT}"));
        if socket.as_os_str().len() > MAX_SOCKET_PATH {
            return Err(EmbeddedPgError::Other(format!(
                "the embedded PostgreSQL socket path {} is longer than the {MAX_SOCKET_PATH} bytes \
                 Unix sockets allow; set CHIME_DATA_DIR to a shorter path",
                socket.display()
            )));
        }

        // From here on, dropping `pg` on an error stops the server if it got that far.
        let mut pg = EmbeddedPg { data_dir, bin_dir, user, running: false, _lock: lock };
        pg.prepare_dirs()?;
        if !pg.pgdata().join("PG_VERSION").exists() {
            pg.init(extra_conf).await?;
        }
        pg.write_socket_conf()?;
        pg.stop_stale().await?;
        pg.start_server().await?;
        pg.running = true;
        let version = pg.create_database().await?;
        tracing::info!("embedded PostgreSQL {version} started (data dir {}, socket {})", pg.data_dir.display(), pg.run_dir().display());
        Ok(pg)
    }

    /// A sqlx URL for `database` in this cluster, over its Unix socket.
    pub fn url(&self, database: &str) -> String {
        url_for(&self.run_dir(), database)
    }

    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// The directory of the server's Unix socket: the host another server names to reach
    /// it (a Citus coordinator its workers, in tests/citus), as libpq reads a host that
    /// begins with `/`. The port is always 5432.
    pub fn socket_dir(&self) -> PathBuf {
        self.run_dir()
    }

    /// Shuts the server down (fast mode: sessions are cut, everything committed is kept)
    /// and releases the data directory.
    pub async fn stop(mut self) {
        self.running = false;
        let result = Self::run(self.pg_ctl(&["stop", "-m", "fast", "-w", "-t", PG_CTL_TIMEOUT_SECS])).await;
        match result {
            Ok(out) if out.status.success() => tracing::info!("embedded PostgreSQL stopped"),
            Ok(out) => tracing::error!(
                "embedded PostgreSQL did not stop cleanly: {}\nlast lines of {}:\n{}",
                String::from_utf8_lossy(&out.stderr).trim(),
                self.log_path().display(),
                tail_of_file(&self.log_path(), 0),
            ),
            Err(e) => tracing::error!("could not run pg_ctl to stop the embedded PostgreSQL: {e}"),
        }
    }

    /// Kills the server as a crash would (`pg_ctl stop -m immediate`: no shutdown
    /// checkpoint, crash recovery at the next start) and keeps the data directory. For
    /// fault tests, with [`EmbeddedPg::restart`].
    pub async fn crash(&mut self) -> Result<(), EmbeddedPgError> {
        let out = Self::run(self.pg_ctl(&["stop", "-m", "immediate", "-w", "-t", PG_CTL_TIMEOUT_SECS])).await?;
        if !out.status.success() {
            return Err(EmbeddedPgError::Other(format!("pg_ctl stop -m immediate failed: {}", String::from_utf8_lossy(&out.stderr).trim())));
        }
        self.running = false;
        Ok(())
    }

    /// Starts the server again after [`EmbeddedPg::crash`].
    pub async fn restart(&mut self) -> Result<(), EmbeddedPgError> {
        self.start_server().await?;
        self.running = true;
        Ok(())
    }

    fn pgdata(&self) -> PathBuf {
        self.data_dir.join("pgdata")
    }

    fn run_dir(&self) -> PathBuf {
        self.data_dir.join("run")
    }

    fn log_path(&self) -> PathBuf {
        self.data_dir.join("postgres.log")
    }

    /// A command for one of the PostgreSQL binaries, run as the database user.
    fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new(self.bin_dir.join(program));
        cmd.current_dir(&self.data_dir).stdin(Stdio::null());
        if let Some(user) = &self.user {
            cmd.uid(user.uid.as_raw()).gid(user.gid.as_raw());
        }
        cmd
    }

    /// `pg_ctl` on our cluster; every use names the data directory.
    fn pg_ctl(&self, args: &[&str]) -> Command {
        let mut cmd = self.command("pg_ctl");
        cmd.args(args).arg("-D").arg(self.pgdata());
        cmd
    }

    async fn run(cmd: Command) -> Result<Output, EmbeddedPgError> {
        let program = cmd.get_program().to_string_lossy().into_owned();
        tokio::process::Command::from(cmd).output().await.ctx(format_args!("running {program}"))
    }

    /// Hands what the server must write to the database user, and closes the socket
    /// directory to everyone else: that is what makes `trust` authentication safe.
    fn prepare_dirs(&self) -> Result<(), EmbeddedPgError> {
        let run_dir = self.run_dir();
        fs::create_dir_all(&run_dir).ctx(format_args!("creating {}", run_dir.display()))?;
        self.give(&run_dir, 0o700)?;
        let log = self.log_path();
        OpenOptions::new().create(true).append(true).open(&log).ctx(format_args!("creating {}", log.display()))?;
        self.give(&log, 0o600)
    }

    fn give(&self, path: &Path, mode: u32) -> Result<(), EmbeddedPgError> {
        if let Some(user) = &self.user {
            chown(path, Some(user.uid), Some(user.gid)).map_err(io::Error::from).ctx(format_args!(
                "giving {} to the user {}",
                path.display(),
                user.name
            ))?;
        }
        fs::set_permissions(path, fs::Permissions::from_mode(mode)).ctx(format_args!("setting the mode of {}", path.display()))
    }

    async fn init(&self, extra_conf: &str) -> Result<(), EmbeddedPgError> {
        let pgdata = self.pgdata();
        if pgdata.exists() {
            // An empty directory is harmless leftover; anything else is not ours to delete.
            fs::remove_dir(&pgdata).map_err(|_| {
                EmbeddedPgError::Other(format!("{} exists but is not a PostgreSQL cluster (no PG_VERSION); move it away and retry", pgdata.display()))
            })?;
        }
        let staging = self.data_dir.join("pgdata.init");
        if staging.exists() {
            fs::remove_dir_all(&staging).ctx(format_args!("removing the unfinished cluster {}", staging.display()))?;
        }
        fs::create_dir(&staging).ctx(format_args!("creating {}", staging.display()))?;
        self.give(&staging, 0o700)?;

        tracing::info!("creating the embedded PostgreSQL cluster in {}", pgdata.display());
        let mut initdb = self.command("initdb");
        initdb.arg("-D").arg(&staging).args(["-U", "postgres", "--auth=trust", "-E", "UTF8", "--locale=C"]);
        let out = Self::run(initdb).await?;
        if !out.status.success() {
            let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
            let log = self.log_path();
            if let Ok(mut f) = OpenOptions::new().append(true).open(&log) {
                let _ = writeln!(f, "--- initdb failed ({}):\n{text}", out.status);
            }
            let _ = fs::remove_dir_all(&staging);
            return Err(EmbeddedPgError::InitDb { log, log_tail: last_lines(&text, LOG_TAIL_LINES) });
        }

        let conf = staging.join("postgresql.conf");
        let mut f = OpenOptions::new().append(true).open(&conf).ctx(format_args!("opening {}", conf.display()))?;
        write!(
            f,
            "\n# Added by chime for its embedded PostgreSQL.\n\
             max_connections = 200\n\
             shared_buffers = 256MB\n\
             {extra_conf}\
             # Socket settings, rewritten by chime at every start to follow the data directory.\n\
             include = 'chime.conf'\n"
        )
        .ctx(format_args!("writing {}", conf.display()))?;
        fs::rename(&staging, &pgdata).ctx(format_args!("renaming {} to {}", staging.display(), pgdata.display()))
    }

    fn write_socket_conf(&self) -> Result<(), EmbeddedPgError> {
        // unix_socket_directories is a list: double quotes keep commas and spaces in the
        // path; the single quotes are the configuration file's own string quoting.
        let dir = self.run_dir().to_string_lossy().replace('"', "\"\"").replace('\'', "''");
        let path = self.pgdata().join("chime.conf");
        fs::write(
            &path,
            format!(
                "# Written by chime at every start; edits are lost.\n\
                 listen_addresses = ''\n\
                 port = {PORT}\n\
                 unix_socket_directories = '\"{dir}\"'\n\
                 unix_socket_permissions = 0700\n"
            ),
        )
        .ctx(format_args!("writing {}", path.display()))?;
        self.give(&path, 0o600)
    }

    /// We hold the lock, so a server running on our cluster was left by a chime that died
    /// without stopping it. Stop it and start our own, rather than adopt a server whose
    /// configuration we did not just write.
    async fn stop_stale(&self) -> Result<(), EmbeddedPgError> {
        let pgdata = self.pgdata();
        let status = Self::run(self.pg_ctl(&["status"])).await?;
        if !status.status.success() {
            return Ok(());
        }
        // pg_ctl only checks that the pid in postmaster.pid is alive. After a reboot that pid
        // may belong to anything, even another cluster's server run by the same user, which
        // `pg_ctl stop` would then shut down. A postmaster's working directory is its data
        // directory, so where /proc can tell, a different one means the file is stale.
        let pid_file = pgdata.join("postmaster.pid");
        let pid = fs::read_to_string(&pid_file).ok().and_then(|s| s.lines().next()?.trim().parse::<u32>().ok());
        if let Some(pid) = pid
            && let Ok(cwd) = fs::read_link(format!("/proc/{pid}/cwd"))
            && cwd != pgdata
        {
            tracing::warn!("{} names process {pid}, which is not this cluster's server; removing it", pid_file.display());
            return fs::remove_file(&pid_file).ctx(format_args!("removing {}", pid_file.display()));
        }
        tracing::warn!("stopping a PostgreSQL server left running on {} by an earlier chime", pgdata.display());
        let out = Self::run(self.pg_ctl(&["stop", "-m", "fast", "-w", "-t", PG_CTL_TIMEOUT_SECS])).await?;
        if out.status.success() {
            return Ok(());
        }
        Err(EmbeddedPgError::StaleServer {
            pgdata,
            log: self.log_path(),
            log_tail: format!("{}{}", tail_of_file(&self.log_path(), 0), String::from_utf8_lossy(&out.stderr)),
        })
    }

    async fn start_server(&self) -> Result<(), EmbeddedPgError> {
        let (pgdata, log) = (self.pgdata(), self.log_path());
        for attempt in 0..2 {
            let log_start = fs::metadata(&log).map(|m| m.len()).unwrap_or(0);
            let mut start = self.pg_ctl(&["start", "-w", "-t", PG_CTL_TIMEOUT_SECS]);
            start.arg("-l").arg(&log);
            let out = Self::run(start).await?;
            if out.status.success() {
                return Ok(());
            }
            let new_log = tail_of_file(&log, log_start);
            // PostgreSQL clears a stale postmaster.pid itself unless its pid now belongs to
            // another live process (common after a reboot or in containers). pg_ctl status
            // just told us no server runs, so the file is safe to remove.
            let pid_file = pgdata.join("postmaster.pid");
            if attempt == 0 && new_log.contains("lock file \"postmaster.pid\" already exists") && pid_file.exists() {
                tracing::warn!("removing the stale {} and retrying", pid_file.display());
                fs::remove_file(&pid_file).ctx(format_args!("removing {}", pid_file.display()))?;
                continue;
            }
            // Only what this attempt logged: older runs' shutdown messages would bury it.
            let pg_ctl_said = String::from_utf8_lossy(&out.stderr);
            return Err(EmbeddedPgError::Start { log: log.clone(), log_tail: format!("{new_log}{}", pg_ctl_said.trim_end()) });
        }
        unreachable!("the second attempt always returns")
    }

    /// Returns the server version, for the log.
    async fn create_database(&self) -> Result<String, EmbeddedPgError> {
        let mut conn = sqlx::PgConnection::connect(&self.url("postgres")).await?;
        let version: String = crate::db::query_scalar("SELECT current_setting('server_version')").fetch_one(&mut conn).await?;
        let exists: bool =
            crate::db::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)").bind(DATABASE).fetch_one(&mut conn).await?;
        if !exists {
            crate::db::query("CREATE DATABASE chime").execute(&mut conn).await?;
        }
        conn.close().await?;
        Ok(version)
    }
}

impl Drop for EmbeddedPg {
    /// The fallback for paths that never reach `stop()` (early returns, panics). Blocking
    /// here is acceptable: it happens once, on the way out.
    fn drop(&mut self) {
        if !self.running {
            return;
        }
        let result = self.pg_ctl(&["stop", "-m", "fast", "-w", "-t", PG_CTL_TIMEOUT_SECS]).stdout(Stdio::null()).stderr(Stdio::null()).status();
        match result {
            Ok(s) if s.success() => tracing::info!("embedded PostgreSQL stopped"),
            Ok(s) => tracing::warn!("pg_ctl stop for the embedded PostgreSQL failed ({s})"),
            Err(e) => tracing::warn!("could not run pg_ctl to stop the embedded PostgreSQL: {e}"),
        }
    }
}

/// An embedded cluster under watch: started again whenever its postmaster dies, until
/// [`Supervisor::stop`].
#[derive(Debug)]
pub struct Supervisor {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<EmbeddedPg>,
}

/// The first delay before a failed restart is tried again; it doubles up to the second.
const RESTART_BACKOFF: (Duration, Duration) = (Duration::from_millis(500), Duration::from_secs(60));

impl EmbeddedPg {
    /// Watches the postmaster and, when it dies (killed, out of memory), calls `on_down`
    /// and starts it again on the same data directory, where crash recovery replays what
    /// was committed. A restart that fails (the dead postmaster's backends may still hold
    /// its shared memory for a moment) is tried again after a growing delay.
    pub fn supervise(self, on_down: impl Fn() + Send + 'static) -> Supervisor {
        let (stop, mut stopping) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let pg = self;
            loop {
                let Some(pid) = pg.postmaster_pid() else {
                    tracing::warn!(
                        "cannot read {}; the embedded PostgreSQL will not be restarted if it dies",
                        pg.pgdata().join("postmaster.pid").display()
                    );
                    let _ = stopping.await;
                    return pg;
                };
                tokio::select! {
                    _ = &mut stopping => return pg,
                    () = exited(pid) => {}
                }
                on_down();
                pg.remove_socket_lock_of(pid);
                let died = Instant::now();
                tracing::warn!("the embedded PostgreSQL (pid {pid}) exited unexpectedly; restarting it");
                let mut delay = RESTART_BACKOFF.0;
                while let Err(e) = pg.start_server().await {
                    if delay == RESTART_BACKOFF.0 {
                        tracing::error!(
                            "cannot restart the embedded PostgreSQL; trying again with a delay doubling up to {} s: {e}",
                            RESTART_BACKOFF.1.as_secs()
                        );
                    }
                    tokio::select! {
                        _ = &mut stopping => return pg,
                        () = tokio::time::sleep(delay) => {}
                    }
                    delay = (delay * 2).min(RESTART_BACKOFF.1);
                }
                tracing::info!("the embedded PostgreSQL is back, {} ms after it exited", died.elapsed().as_millis());
            }
        });
        Supervisor { stop, task }
    }

    fn postmaster_pid(&self) -> Option<i32> {
        first_line_pid(&self.pgdata().join("postmaster.pid"))
    }

    /// PostgreSQL refuses to start while its socket's lock file names a process that
    /// exists, and a dead postmaster exists as a zombie until its parent reaps it, which
    /// the init of many containers never does (measured: 7 s of failed restarts). We saw
    /// `pid` exit, so its claim on the socket is void.
    fn remove_socket_lock_of(&self, pid: i32) {
        let lock = self.run_dir().join(format!(".s.PGSQL.{PORT}.lock"));
        if first_line_pid(&lock) == Some(pid) {
            let _ = fs::remove_file(&lock);
        }
    }
}

impl Supervisor {
    /// Stops watching, then stops the server.
    pub async fn stop(self) {
        let _ = self.stop.send(());
        match self.task.await {
            Ok(pg) => pg.stop().await,
            Err(e) => tracing::error!("the embedded PostgreSQL's supervisor failed: {e}"),
        }
    }
}

fn first_line_pid(path: &Path) -> Option<i32> {
    fs::read_to_string(path).ok()?.lines().next()?.trim().parse().ok()
}

/// Resolves when process `pid` exits. The postmaster is not our child (`pg_ctl` started
/// it and exited), so there is no `wait`; a pidfd becomes readable when the process exits,
/// whoever its parent is. On kernels without pidfds (before 5.3), a poll of the pid.
async fn exited(pid: i32) {
    // SAFETY: pidfd_open takes no pointers, and a descriptor it returns is ours to own.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd >= 0 {
        let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as i32) };
        // SAFETY: the AsyncFd owns the descriptor, which nothing else closes.
        if let Ok(fd) = unsafe { tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) } {
            let _ = fd.readable().await;
            return;
        }
    } else if io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH) {
        return;
    }
    while nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok() {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// For tests: a fresh cluster in a new temp directory, tuned for speed over durability.
///
/// Test processes are routinely killed, and a cluster kept in a static is never dropped, so
/// cleanup cannot rest on destructors. A watchdog shell in its own process group waits for
/// end-of-file on a pipe whose only write end lives in this process: the kernel closes it
/// however the process ends, with no polling and no risk of a recycled pid. The watchdog
/// then stops the cluster and removes the directory. It runs as the database user, as
/// `pg_ctl` must, so the directory is given to that user too.
pub async fn start_throwaway() -> Result<EmbeddedPg, EmbeddedPgError> {
    start_temporary(THROWAWAY_CONF).await
}

/// `start_throwaway` with the server binaries of `bin_dir` (those an extension was built
/// for) and `extra_conf` appended to its `postgresql.conf` (`shared_preload_libraries`).
pub async fn start_throwaway_with(bin_dir: &Path, extra_conf: &str) -> Result<EmbeddedPg, EmbeddedPgError> {
    start_temporary_in(find_bin_dir(Some(bin_dir))?, &format!("{THROWAWAY_CONF}{extra_conf}")).await
}

/// A fresh cluster in a new temp directory, removed when this process ends, with
/// `extra_conf` appended to its `postgresql.conf` (`chime bench` passes none: the same
/// durable settings as `chime serve`).
pub async fn start_temporary(extra_conf: &str) -> Result<EmbeddedPg, EmbeddedPgError> {
    start_temporary_in(find_bin_dir(None)?, extra_conf).await
}

async fn start_temporary_in(bin_dir: PathBuf, extra_conf: &str) -> Result<EmbeddedPg, EmbeddedPgError> {
    let dir = make_temp_dir()?;
    let user = db_user(&dir.join("pgdata"))?;
    if let Some(user) = &user {
        chown(&dir, Some(user.uid), Some(user.gid)).map_err(io::Error::from).ctx(format_args!(
            "giving {} to the user {}",
            dir.display(),
            user.name
        ))?;
    }
    spawn_watchdog(&bin_dir, &dir, user.as_ref())?;
    EmbeddedPg::start_with(&dir, bin_dir, extra_conf).await
}

fn make_temp_dir() -> Result<PathBuf, EmbeddedPgError> {
    let base = std::env::temp_dir();
    let pid = std::process::id();
    loop {
        let nonce: u32 = rand::random();
        let dir = base.join(format!("chime-pg-{pid}-{nonce:08x}"));
        match fs::create_dir(&dir) {
            Ok(()) => {
                // Traversable by the database user, whoever owns it.
                fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).ctx(format_args!("setting the mode of {}", dir.display()))?;
                return Ok(dir);
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => {
                return Err(e).ctx(format_args!("creating a directory in {}", base.display()));
            }
        }
    }
}

fn spawn_watchdog(bin_dir: &Path, dir: &Path, user: Option<&DbUser>) -> Result<(), EmbeddedPgError> {
    const SCRIPT: &str = r#"trap '' HUP INT
read _ || true
"$1" stop -D "$2" -m immediate -w -t 30 >/dev/null 2>&1
rm -rf "$3""#;
    let (reader, writer) = io::pipe().ctx("creating the watchdog pipe")?;
    let mut cmd = Command::new("/bin/sh");
    cmd.arg("-c")
        .arg(SCRIPT)
        .arg("chime-pg-watchdog")
        .arg(bin_dir.join("pg_ctl"))
        .arg(dir.join("pgdata"))
        .arg(dir)
        .stdin(reader)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .current_dir("/")
        // Out of our process group: a Ctrl-C, or a test runner killing the group, must
        // not take the watchdog down with us.
        .process_group(0);
    if let Some(user) = user {
        cmd.uid(user.uid.as_raw()).gid(user.gid.as_raw());
    }
    // Not waited for: it outlives us by design and is reaped by init.
    cmd.spawn().ctx("starting the cleanup watchdog for the test database")?;
    // Keep the write end open until the process exits. std opens pipes close-on-exec, so
    // no child (the postmaster included) holds a copy that would delay the end-of-file.
    std::mem::forget(writer);
    Ok(())
}

/// The last lines of `path` from byte `from` on, for error messages; a log that cannot be
/// read yields a note saying so rather than hiding the original error.
fn tail_of_file(path: &Path, from: u64) -> String {
    const MAX_BYTES: u64 = 64 * 1024;
    let read = || -> io::Result<String> {
        let mut f = File::open(path)?;
        let len = f.metadata()?.len();
        f.seek(SeekFrom::Start(from.max(len.saturating_sub(MAX_BYTES))))?;
        let mut buf = Vec::new();
        f.read_to_end(&mut buf)?;
        Ok(String::from_utf8_lossy(&buf).into_owned())
    };
    match read() {
        Ok(text) => last_lines(&text, LOG_TAIL_LINES),
        Err(e) => format!("(could not read {}: {e})\n", path.display()),
    }
}

fn last_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = lines[lines.len().saturating_sub(n)..].join("\n");
    out.push('\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_encodes_the_socket_directory() {
        let url = url_for(Path::new("/tmp/my data+x/run"), "chime");
        assert_eq!(url, "postgres://postgres@localhost:5432/chime?host=/tmp/my%20data%2Bx/run&sslmode=disable");
        let opts: sqlx::postgres::PgConnectOptions = url.parse().unwrap();
        assert_eq!(opts.get_socket(), Some(Path::new("/tmp/my data+x/run").to_path_buf()).as_ref());
        assert_eq!(opts.get_database(), Some("chime"));
        assert_eq!(opts.get_port(), 5432);
    }

    #[test]
    fn a_bad_override_is_reported_as_such() {
        let err = find_bin_dir(Some(Path::new("/nonexistent"))).unwrap_err();
        assert!(matches!(err, EmbeddedPgError::BadBinDir { .. }), "{err}");
    }

    #[test]
    fn last_lines_keeps_the_end() {
        assert_eq!(last_lines("a\nb\nc\n", 2), "b\nc\n");
        assert_eq!(last_lines("", 2), "\n");
    }

    /// Needs the PostgreSQL binaries, like every database test in this crate.
    #[tokio::test]
    async fn throwaway_cluster_serves_queries() {
        let pg = start_throwaway().await.unwrap();
        let mut conn = sqlx::PgConnection::connect(&pg.url("chime")).await.unwrap();
        let one: i32 = crate::db::query_scalar("SELECT 1").fetch_one(&mut conn).await.unwrap();
        assert_eq!(one, 1);
        conn.close().await.unwrap();
        pg.stop().await;
    }
}
