//! The nodes `chime bench` and `chime soak` run against: real `chime serve` processes of the
//! `chime` binary beside this one, on one database, each logging to a file of its own.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use tokio::process::{Child, Command};

pub struct Node {
    pub child: Child,
    pub base: String,
}

pub struct Nodes {
    database_url: String,
    /// CHIME_DIRECT_DATABASE_URL, for a bench through a pooler.
    direct_database_url: Option<String>,
    logs: PathBuf,
    /// Callbacks go to a receiver on loopback, which the deny list would refuse.
    loopback_receiver: bool,
    client: reqwest::Client,
    nodes: Vec<Node>,
    /// Nodes started so far, to name their logs.
    started: usize,
}

impl Nodes {
    pub fn new(database_url: &str, direct_database_url: Option<&str>, logs: PathBuf, loopback_receiver: bool, client: reqwest::Client) -> Nodes {
        Nodes {
            database_url: database_url.to_string(),
            direct_database_url: direct_database_url.map(str::to_string),
            logs,
            loopback_receiver,
            client,
            nodes: Vec::new(),
            started: 0,
        }
    }

    /// Once the run is over: removes the nodes' logs if it succeeded, and keeps them, saying
    /// where, if it failed (they may say why).
    pub fn tidy_logs(&self, tool: &str, succeeded: bool) {
        if !succeeded {
            eprintln!("{tool}: the nodes' logs are kept in {}", self.logs.display());
        } else if let Err(e) = std::fs::remove_dir_all(&self.logs) {
            eprintln!("{tool}: could not remove the nodes' logs in {}: {e}", self.logs.display());
        }
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// The base URL of node `i` (modulo the count: callers spread work over them).
    pub fn base(&self, i: usize) -> &str {
        &self.nodes[i % self.nodes.len()].base
    }

    pub fn iter(&self) -> impl Iterator<Item = &Node> {
        self.nodes.iter()
    }

    /// The process ids of the running nodes (for their memory).
    pub fn pids(&self) -> Vec<u32> {
        self.nodes.iter().filter_map(|n| n.child.id()).collect()
    }

    /// Starts or stops nodes until `count` run.
    pub async fn ensure(&mut self, count: usize) -> anyhow::Result<()> {
        self.stop(count).await;
        while self.nodes.len() < count {
            let node = self.start().await?;
            self.nodes.push(node);
        }
        // Let the engines see each other, so that each takes its share from the start.
        tokio::time::sleep(Duration::from_secs(2)).await;
        Ok(())
    }

    /// Kills node `i` with SIGKILL, as a crash would, and starts another in its place.
    pub async fn replace(&mut self, i: usize) -> anyhow::Result<()> {
        self.nodes[i].child.kill().await.context("killing a node")?;
        self.nodes[i] = self.start().await?;
        Ok(())
    }

    async fn start(&mut self) -> anyhow::Result<Node> {
        self.started += 1;
        let number = self.started;
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let log_path = self.logs.join(format!("node-{number}.log"));
        let log = std::fs::File::create(&log_path)?;
        let mut command = Command::new(server_exe()?);
        command
            .arg("serve")
            .env("DATABASE_URL", &self.database_url)
            .env("CHIME_LISTEN", format!("127.0.0.1:{port}"))
            .env("CHIME_ADMIN_PASSWORD", chime::biz_types::new_secret())
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true);
        if std::env::var_os("CHIME_LOG").is_none() {
            command.env("CHIME_LOG", "warn");
        }
        if self.loopback_receiver {
            command.env("CHIME_DENY_PRIVATE_CALLBACKS", "false");
        }
        if let Some(direct) = &self.direct_database_url {
            command.env("CHIME_DIRECT_DATABASE_URL", direct);
        }
        let mut child = command.spawn().context("starting a chime node")?;
        let base = format!("http://127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = child.try_wait()? {
                bail!("node {number} exited ({status}); its log: {}", log_path.display());
            }
            if let Ok(r) = self.client.get(format!("{base}/readyz")).send().await
                && r.status().is_success()
            {
                break;
            }
            if Instant::now() > deadline {
                bail!("node {number} not ready after 30 s; its log: {}", log_path.display());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(Node { child, base })
    }

    /// Stops nodes (SIGTERM, as an operator would) until `keep` are left.
    pub async fn stop(&mut self, keep: usize) {
        while self.nodes.len() > keep {
            let mut node = self.nodes.pop().expect("a node");
            if let Some(pid) = node.child.id() {
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::Signal::SIGTERM);
            }
            if tokio::time::timeout(Duration::from_secs(40), node.child.wait()).await.is_err() {
                let _ = node.child.kill().await;
            }
        }
    }
}

/// The `chime` binary beside this one: the server the nodes run, from the same build.
fn server_exe() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe().context("finding this binary's directory, where chime is")?.with_file_name("chime");
    if !exe.exists() {
        let release = if cfg!(debug_assertions) { "" } else { " --release" };
        bail!("{} not found: the bench and the soak run it as their nodes; build it with `cargo build{release} --bin chime`", exe.display());
    }
    Ok(exe)
}
