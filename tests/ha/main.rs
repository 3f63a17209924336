//! High-availability tests: real `chime serve` processes on a replicated PostgreSQL (a
//! primary and a synchronous standby made with pg_basebackup, or a pg_auto_failover
//! formation whose monitor promotes the standby when the primary is killed), real
//! receivers, and docs/design/contract.md, High availability's promises checked from outside: the standby is skipped, no node
//! leads on a standby, and a failover under load loses no acknowledged task.
//!
//! Needs, as root (each server runs as the `postgres` user): PostgreSQL 15 under
//! /usr/lib/postgresql/15/bin and pg_auto_failover (Debian packages `postgresql-15`,
//! `pg-auto-failover-cli`, `postgresql-15-auto-failover`, and `haproxy`; `.ci/run` installs them). Without
//! them the tests fail, saying what is missing; they never skip.
//!
//! A binary of its own (`cargo test --test ha`), so that its load never runs beside the
//! timing-sensitive tests; within it the tests take turns (`heavy()`).
// The tests' own statements go straight to PostgreSQL: sqlx's query functions are fine here.
#![allow(clippy::disallowed_methods)]

#[path = "../api/helpers.rs"]
#[allow(dead_code)]
mod helpers;
#[path = "../api/receiver.rs"]
#[allow(dead_code)]
mod receiver;

mod cluster;
mod failover;
mod proxy;
mod standby;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use chime::biz_types::{self, Settings};
use chime::callback_hosts::CallbackHosts;
use chime::db::Pool;
use serde_json::{Value, json};

use crate::helpers::{client, wait_until};
use crate::receiver::Received;

/// Held by each test, so that they run one at a time.
async fn heavy() -> tokio::sync::MutexGuard<'static, ()> {
    static HEAVY: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    HEAVY.lock().await
}

/// Migrates the database and creates the biz type `orders`, whose callbacks go to `url`;
/// returns an API token for it.
async fn orders(pool: &Pool, url: &str) -> String {
    chime::db::migrate(pool).await.unwrap();
    let settings = Settings { callback_url: Some(url.to_string()), timeout_ms: Some(2000), backoff_initial_ms: Some(200), ..Default::default() };
    biz_types::create(pool, "orders", &settings, CallbackHosts::Any).await.unwrap();
    biz_types::create_token(pool, "orders").await.unwrap()
}

/// Creates a task due at once through `address`; returns its id.
async fn create_task(address: &str, token: &str) -> String {
    let response = client()
        .post(format!("{address}/api/v1/tasks"))
        .bearer_auth(token)
        .json(&json!({"biz_type": "orders", "payload": "one"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 201);
    let task: Value = response.json().await.unwrap();
    task["id"].as_str().unwrap().to_string()
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
    /// Arrivals beyond each task's first.
    fn duplicated(&self) -> usize {
        self.per_task.values().map(|n| n - 1).sum()
    }
    /// Of `ids`, those that never arrived.
    fn lost(&self, ids: &[String]) -> usize {
        ids.iter().filter(|id| !self.per_task.contains_key(*id)).count()
    }
}

/// What the load got back from its creates.
#[derive(Default)]
struct Load {
    /// The tasks whose creation was acknowledged (201): id and when the answer came.
    accepted: Vec<(Instant, String)>,
    /// Every other answer: its status, or "no answer".
    refused: std::collections::BTreeMap<String, usize>,
}

impl Load {
    fn ids(&self) -> Vec<String> {
        self.accepted.iter().map(|(_, id)| id.clone()).collect()
    }
    /// The longest time between two acknowledged creates.
    fn longest_gap(&self) -> Duration {
        self.accepted.windows(2).map(|w| w[1].0 - w[0].0).max().unwrap_or_default()
    }
}

/// Creates a task every 5 ms through the nodes in turn, due within 2 s, until `stop`.
async fn load(addresses: Vec<String>, token: String, stop: Arc<AtomicBool>) -> Load {
    let client = client();
    let mut load = Load::default();
    let mut i = 0usize;
    while !stop.load(Ordering::Relaxed) {
        let address = &addresses[i % addresses.len()];
        let response = client
            .post(format!("{address}/api/v1/tasks"))
            .bearer_auth(&token)
            .timeout(Duration::from_secs(15))
            .json(&json!({"biz_type": "orders", "delay_ms": (i % 20) * 100, "payload": i}))
            .send()
            .await;
        match response {
            Ok(r) if r.status() == 201 => {
                let task: Value = r.json().await.unwrap();
                load.accepted.push((Instant::now(), task["id"].as_str().unwrap().to_string()));
            }
            Ok(r) => *load.refused.entry(r.status().to_string()).or_default() += 1,
            Err(_) => *load.refused.entry("no answer".into()).or_default() += 1,
        }
        i += 1;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    load
}

/// Polls `/readyz` until it answers `want` (at most `within`); returns how long it took.
async fn wait_readyz(address: &str, want: u16, within: Duration) -> Duration {
    let client = client();
    let started = Instant::now();
    wait_until(&format!("{address}/readyz answering {want}"), within, || async {
        let status = client.get(format!("{address}/readyz")).timeout(Duration::from_secs(2)).send().await.map(|r| r.status().as_u16());
        if status.as_ref().is_ok_and(|s| *s == want) { Ok(()) } else { Err(format!("{status:?}")) }
    })
    .await;
    started.elapsed()
}
