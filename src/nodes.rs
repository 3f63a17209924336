//! Nodes: every running chime registers itself and heartbeats, so that the console can
//! show the cluster and the engine can share cluster-wide limits among the live nodes.
//! A node that stops cleanly removes its row; one that dies ages out.

use std::time::Duration;

use sqlx::PgPool;
use tokio::sync::watch;
use uuid::Uuid;

pub const HEARTBEAT: Duration = Duration::from_secs(5);
/// A node silent for this long is taken for dead and removed (by any other node).
const DEAD_AFTER_SECS: i64 = 60;

pub struct Node {
    pub id: Uuid,
    pub listen: String,
    /// Runs the delivery engine.
    pub delivers: bool,
}

async fn beat(pool: &PgPool, node: &Node) -> Result<(), sqlx::Error> {
    let hostname = nix::unistd::gethostname().map(|h| h.to_string_lossy().into_owned()).unwrap_or_default();
    sqlx::query(
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
    sqlx::query("DELETE FROM nodes WHERE heartbeat_at < now() - $1 * interval '1 second'")
        .bind(DEAD_AFTER_SECS)
        .execute(pool)
        .await?;
    Ok(())
}

/// Registers the node and heartbeats until `stop` turns true, then deregisters it.
pub async fn heartbeat(pool: PgPool, node: Node, mut stop: watch::Receiver<bool>) {
    let mut every = tokio::time::interval(HEARTBEAT);
    loop {
        tokio::select! {
            _ = every.tick() => {
                if let Err(e) = beat(&pool, &node).await {
                    tracing::warn!(error = %e, "node heartbeat failed; retrying");
                }
            }
            _ = stop.changed() => break,
        }
    }
    if let Err(e) = sqlx::query("DELETE FROM nodes WHERE id = $1").bind(node.id).execute(&pool).await {
        tracing::warn!(error = %e, "could not deregister this node; it will age out");
    }
}

/// How many live nodes deliver (at least 1: the one asking).
pub async fn delivering(pool: &PgPool) -> Result<i64, sqlx::Error> {
    let n: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM nodes WHERE delivers AND heartbeat_at > now() - $1 * interval '1 second'",
    )
    .bind(3 * HEARTBEAT.as_secs() as i64)
    .fetch_one(pool)
    .await?;
    Ok(n.max(1))
}
