//! Nodes: every running chime registers itself and heartbeats, so that the console can
//! show the cluster and the engine can share cluster-wide limits among the live nodes.
//! A node that stops removes its row as soon as it begins to stop: from then on it starts
//! no work, so the others count it out of the cluster-wide rate share at once, and the
//! console shows it gone (its callbacks still in flight are recorded under its id). One
//! that dies ages out.

use std::time::Duration;

use crate::db::Pool;
use uuid::Uuid;

use crate::lifecycle::Signal;

pub const HEARTBEAT: Duration = Duration::from_secs(5);
/// A node is live while its last heartbeat is younger than this: three beats, so that one
/// slow or lost beat does not count it out. The one definition used by the engine's and
/// pull's shares of a cluster-wide rate and by the dashboard.
pub const LIVE_WITHIN: Duration = Duration::from_secs(3 * HEARTBEAT.as_secs());
/// A node silent for this long is taken for dead and removed (by any other node).
const DEAD_AFTER_SECS: i64 = 60;

pub struct Node {
    pub id: Uuid,
    pub listen: String,
    /// Runs the delivery engine.
    pub delivers: bool,
}

async fn beat(pool: &Pool, node: &Node) -> Result<(), sqlx::Error> {
    let hostname = nix::unistd::gethostname().map(|h| h.to_string_lossy().into_owned()).unwrap_or_default();
    crate::db::query(
        "INSERT INTO nodes (id, hostname, pid, version, listen, delivers) VALUES ($1, $2, $3, $4, $5, $6)
         ON CONFLICT (id) DO UPDATE SET heartbeat_at = now()",
    )
    .bind(node.id)
    .bind(hostname)
    .bind(std::process::id() as i32)
    .bind(env!("CARGO_PKG_VERSION"))
    .bind(&node.listen)
    .bind(node.delivers)
    .execute(pool)
    .await?;
    crate::db::query("DELETE FROM nodes WHERE heartbeat_at < now() - $1 * interval '1 second'").bind(DEAD_AFTER_SECS).execute(pool).await?;
    Ok(())
}

/// Registers the node and heartbeats until it stops, then deregisters it.
pub async fn heartbeat(pool: Pool, node: Node, mut stop: Signal) {
    let mut every = tokio::time::interval(HEARTBEAT);
    loop {
        tokio::select! {
            biased;
            _ = stop.stopping() => break,
            _ = every.tick() => {
                if let Err(e) = beat(&pool, &node).await {
                    tracing::warn!(error = %e, "node heartbeat failed; retrying");
                }
            }
        }
    }
    match leave(&pool, node.id).await {
        Ok(()) => tracing::info!(node_id = %node.id, "heartbeat stopped: the node is stopping, and has left the cluster"),
        Err(e) => tracing::warn!(error = %e, "could not deregister this node; it will age out"),
    }
}

/// Removes the node's row: it says it left.
async fn leave(pool: &Pool, id: Uuid) -> Result<(), sqlx::Error> {
    crate::db::query("DELETE FROM nodes WHERE id = $1").bind(id).execute(pool).await.map(drop)
}

/// How many live nodes deliver by callback (at least 1), and the place among them of node
/// `id` by id (0 for the lowest; its claim lanes, `engine::lanes`).
pub async fn delivering_place(pool: &Pool, id: Uuid) -> Result<(i64, i64), sqlx::Error> {
    let (count, place): (i64, i64) = crate::db::query_as(
        "SELECT count(*), count(*) FILTER (WHERE id < $2) FROM nodes WHERE delivers AND heartbeat_at > now() - $1 * interval '1 second'",
    )
    .bind(LIVE_WITHIN.as_secs() as i64)
    .bind(id)
    .fetch_one(pool)
    .await?;
    Ok((count.max(1), place))
}

/// How many nodes are live (`LIVE_WITHIN`).
pub async fn live(pool: &Pool) -> Result<i64, sqlx::Error> {
    crate::db::query_scalar("SELECT count(*) FROM nodes WHERE heartbeat_at > now() - $1 * interval '1 second'")
        .bind(LIVE_WITHIN.as_secs() as i64)
        .fetch_one(pool)
        .await
}

/// A registered node, as the console's Cluster page shows it.
#[derive(Debug, sqlx::FromRow)]
pub struct Registered {
    pub id: Uuid,
    pub hostname: String,
    pub pid: i32,
    pub version: String,
    /// The address its HTTP server listens on.
    pub listen: String,
    pub delivers: bool,
    pub started_at: chrono::DateTime<chrono::Utc>,
    /// Seconds since its last heartbeat.
    pub silent_secs: f64,
}

impl Registered {
    /// How a person tells it apart: its host name and pid ("web-1 (pid 4121)").
    pub fn name(&self) -> String {
        format!("{} (pid {})", self.hostname, self.pid)
    }
}

/// The name of node `id` among `nodes` (`Registered::name`), or its id once it is no
/// longer registered.
pub fn name_of(nodes: &[Registered], id: Uuid) -> String {
    nodes.iter().find(|n| n.id == id).map_or_else(|| id.to_string(), Registered::name)
}

/// Every registered node, oldest first (dead ones until they age out).
pub async fn list(pool: &Pool) -> Result<Vec<Registered>, sqlx::Error> {
    crate::db::query_as(
        "SELECT id, hostname, pid, version, listen, delivers, started_at,
                extract(epoch FROM now() - heartbeat_at)::float8 AS silent_secs
           FROM nodes ORDER BY started_at",
    )
    .fetch_all(pool)
    .await
}
