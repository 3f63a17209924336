//! Fault tests: real `chime serve` processes on a real PostgreSQL, real receivers, and
//! something breaking under load: a node killed, the database crashed, a receiver gone or
//! misbehaving. Each test prints what happened (delivered, duplicated, lost) and asserts
//! that nothing is lost and nothing is marked delivered that was not.
//!
//! A test binary of its own, so that this load never runs beside the timing-sensitive
//! tests in `tests/api`; within it, the heavy tests take turns (`heavy()`).
// The tests' own statements go straight to PostgreSQL: sqlx's query functions are fine here.
#![allow(clippy::disallowed_methods)]

#[path = "../api/helpers.rs"]
#[allow(dead_code)]
mod helpers;
#[path = "../api/receiver.rs"]
#[allow(dead_code)]
mod receiver;

mod console;
mod database;
mod load;
mod memory;
mod nodes;
mod receivers;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use chime::biz_types::Settings;
use chime::db::Pool;
use chrono::{DateTime, Utc};

use crate::receiver::Received;
use helpers::create_tasks;

/// Held by the tests that load the machine, so that they run one at a time.
async fn heavy() -> tokio::sync::MutexGuard<'static, ()> {
    static HEAVY: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    HEAVY.lock().await
}

/// Creates a biz type whose callbacks go to `url`; returns an API token for it.
async fn biz_type(pool: &Pool, name: &str, url: &str, settings: Settings) -> String {
    helpers::biz_type_with(pool, name, &Settings { callback_url: Some(url.to_string()), ..settings }).await
}

async fn db_now(pool: &Pool) -> DateTime<Utc> {
    sqlx::query_scalar("SELECT now()").fetch_one(pool).await.unwrap()
}

/// How many tasks are in each status.
async fn statuses(pool: &Pool) -> HashMap<String, i64> {
    sqlx::query_as::<_, (String, i64)>("SELECT status, count(*) FROM tasks GROUP BY status").fetch_all(pool).await.unwrap().into_iter().collect()
}

/// Waits until no task is pending or running (at most `within`); returns the statuses.
async fn wait_all_finished(pool: &Pool, within: Duration) -> HashMap<String, i64> {
    let started = Instant::now();
    loop {
        let now = statuses(pool).await;
        let unfinished = now.get("pending").unwrap_or(&0) + now.get("running").unwrap_or(&0);
        if unfinished == 0 || started.elapsed() > within {
            return now;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// What a receiver got: how many times each task arrived.
struct Tally {
    per_task: HashMap<String, usize>,
}

impl Tally {
    fn of(received: &[Received]) -> Tally {
        let mut per_task = HashMap::new();
        for r in received {
            *per_task.entry(r.header("chime-task-id").unwrap().to_string()).or_insert(0) += 1;
        }
        Tally { per_task }
    }
    /// Tasks that arrived at least once.
    fn delivered(&self) -> usize {
        self.per_task.len()
    }
    /// Arrivals beyond each task's first.
    fn duplicated(&self) -> usize {
        self.per_task.values().map(|n| n - 1).sum()
    }
    /// Of `ids`, those that never arrived.
    fn lost(&self, ids: &[String]) -> usize {
        ids.iter().filter(|id| !self.per_task.contains_key(*id)).count()
    }
}

/// A process's resident memory in KiB (VmRSS in /proc).
fn rss_kib(pid: u32) -> u64 {
    proc_status_kib(pid, "VmRSS:")
}

/// The most resident memory a process has had, in KiB (VmHWM in /proc).
fn peak_rss_kib(pid: u32) -> u64 {
    proc_status_kib(pid, "VmHWM:")
}

fn proc_status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with(field)).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}
