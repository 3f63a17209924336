//! What PostgreSQL did while a burst or steady ran (issue 35): what its active backends
//! waited on, sampled from `pg_stat_activity`, its CPU per delivered task and the WAL it
//! wrote, so that every run shows where the next limit is.
//!
//! A sample is the wait event of each client backend that is active at that instant
//! (`CPU` when it waits on nothing: running, or ready to run), the sampler's own left out;
//! a share is the part of all such backend-samples over the window. PostgreSQL's CPU is the
//! user and system time, from `/proc`, of its processes (backends and background workers
//! alike) over the window: those there at the start, and in full those that started during
//! it (a pool's new connections). Only where PostgreSQL runs on this machine: elsewhere
//! `/proc` knows none of its processes, and the figure is left out.
//!
//! Each wait also names the statement most often found waiting on it: the first words of
//! the statement's first line (chime's SQL files begin with a comment that says what the
//! statement does: "Leases to node $4" is the claim, "Settles a batch of leases" the record).

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use chime::db::{self, Pool};

use crate::memory;

/// How often the active backends are sampled.
const EVERY: Duration = Duration::from_millis(20);

/// Samples `pg_stat_activity` from `start` until `stop`.
pub struct Waits {
    pool: Pool,
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<BTreeMap<String, BTreeMap<String, u64>>>,
    /// PostgreSQL's processes at the start, and their CPU seconds then.
    cpu_before: Vec<(u32, f64)>,
    /// The WAL's insert position at the start.
    wal_before: u64,
}

/// What the window showed.
pub struct Seen {
    /// Share of the backend-samples per wait (`Type:Name`, or `CPU`), most first, with the
    /// statement most often seen in it and its share of that wait's samples.
    pub waits: Vec<(String, f64, String, f64)>,
    /// PostgreSQL's CPU seconds over the window; None where its processes are not local.
    pub cpu_secs: Option<f64>,
    /// Bytes of WAL written over the window, by anything (full-page images after a
    /// checkpoint included, as in production).
    pub wal_bytes: u64,
}

impl Waits {
    pub async fn start(pool: &Pool) -> anyhow::Result<Waits> {
        let cpu_before = pids(pool).await?.into_iter().filter_map(|p| memory::cpu_secs(p).map(|s| (p, s))).collect();
        let wal_before = wal_position(pool).await?;
        let stop = Arc::new(AtomicBool::new(false));
        let (flag, sampling) = (stop.clone(), pool.clone());
        let task = tokio::spawn(async move {
            let mut counts: BTreeMap<String, BTreeMap<String, u64>> = BTreeMap::new();
            let mut tick = tokio::time::interval(EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            while !flag.load(Ordering::Relaxed) {
                tick.tick().await;
                let sample: Result<Vec<(String, String)>, sqlx::Error> = db::query_as(
                    "SELECT coalesce(wait_event_type || ':' || wait_event, 'CPU'), split_part(ltrim(query), E'\\n', 1) FROM pg_stat_activity
                      WHERE state = 'active' AND backend_type = 'client backend' AND pid <> pg_backend_pid()",
                )
                .fetch_all(&sampling)
                .await;
                // A sample lost to a busy pool is only a sample fewer.
                for (wait, line) in sample.unwrap_or_default() {
                    *counts.entry(wait).or_default().entry(statement(&line)).or_default() += 1;
                }
            }
            counts
        });
        Ok(Waits { pool: pool.clone(), stop, task, cpu_before, wal_before })
    }

    pub async fn stop(self) -> Seen {
        self.stop.store(true, Ordering::Relaxed);
        let counts = self.task.await.unwrap_or_default();
        let total: u64 = counts.values().flat_map(|by| by.values()).sum();
        let mut waits: Vec<(String, f64, String, f64)> = counts
            .into_iter()
            .map(|(wait, by)| {
                let n: u64 = by.values().sum();
                let (top, in_top) = by.into_iter().max_by_key(|(_, k)| *k).unwrap_or_default();
                (wait, n as f64 / total.max(1) as f64, top, in_top as f64 / n.max(1) as f64)
            })
            .collect();
        waits.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        let cpu_secs = match pids(&self.pool).await {
            Ok(now) if !self.cpu_before.is_empty() => {
                let before: HashSet<u32> = self.cpu_before.iter().map(|(p, _)| *p).collect();
                let kept: f64 = self.cpu_before.iter().filter_map(|(p, s)| memory::cpu_secs(*p).map(|now| now - s)).sum();
                let new: f64 = now.iter().filter(|p| !before.contains(p)).filter_map(|p| memory::cpu_secs(*p)).sum();
                Some(kept + new)
            }
            _ => None,
        };
        let wal_bytes = wal_position(&self.pool).await.map(|now| now.saturating_sub(self.wal_before)).unwrap_or(0);
        Seen { waits, cpu_secs, wal_bytes }
    }
}

/// Where the next WAL record goes, in bytes from the start of the WAL.
pub async fn wal_position(pool: &Pool) -> anyhow::Result<u64> {
    let at: i64 = db::query_scalar("SELECT (pg_current_wal_insert_lsn() - '0/0')::bigint").fetch_one(pool).await?;
    Ok(at as u64)
}

/// PostgreSQL's processes as it lists them: every backend and background process.
async fn pids(pool: &Pool) -> anyhow::Result<Vec<u32>> {
    let pids: Vec<i32> = db::query_scalar("SELECT pid FROM pg_stat_activity").fetch_all(pool).await?;
    Ok(pids.into_iter().map(|p| p as u32).collect())
}

/// A statement's name in the report: the first six words of its first line, a leading
/// comment's dashes left out.
fn statement(first_line: &str) -> String {
    let words: Vec<&str> = first_line.trim_start_matches('-').split_whitespace().take(6).collect();
    words.join(" ")
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_statement_is_named_by_its_first_words() {
        assert_eq!(super::statement("-- Leases to node $4, for each biz type of $1 (the arrays"), "Leases to node $4, for each");
        assert_eq!(super::statement("SELECT 1"), "SELECT 1");
    }
}
