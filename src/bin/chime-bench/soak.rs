//! `chime soak`: a mixed load against real nodes for a chosen time (`SoakArgs`' help says
//! what it is), then a reckoning. A task is lost if its creation was acknowledged, or it
//! is a timer's fire time before the end (its occurrence written or not), and the
//! receiver never answered it 2xx; the soak fails if any is.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix_web::http::StatusCode;
use anyhow::{Context, bail};
use chime::biz_types::{self, Settings};
use chime::db::DbArgs;
use chime::db::{self, Pool};
use chime::tasks::load;
use chrono::{DateTime, Utc};
use serde_json::{Value, json};
use tokio::sync::Semaphore;
use uuid::Uuid;

use crate::bench::{database, percentile};
use crate::cli::SoakArgs;
use crate::nodes::Nodes;
use crate::receiver::{Callback, Log, Receiver};

const PLAIN: &str = "soak-plain";
const FLAKY: &str = "soak-flaky";
const REPLAYED: &str = "soak-replayed";
const TIMERS: &str = "soak-timers";
/// How long the soak waits, after the load, for everything due to be delivered.
const DRAIN: Duration = Duration::from_secs(120);
/// Single creates in flight at once.
const CLIENTS: usize = 64;

pub async fn run(db_args: &DbArgs, args: SoakArgs) -> anyhow::Result<()> {
    let (url, embedded) = database(db_args).await?;
    let result = soak(&url, &args).await;
    if let Some(pg) = embedded {
        pg.stop().await;
    }
    result
}

async fn soak(url: &str, args: &SoakArgs) -> anyhow::Result<()> {
    if args.kill_every > 0 && args.nodes < 2 {
        bail!("--kill-every needs --nodes 2 or more: node 1 is never killed");
    }
    let pool = db::connect(url, 4).await?;
    db::migrate(&pool).await?;
    let logs = std::env::temp_dir().join(format!("chime-soak-{}", std::process::id()));
    std::fs::create_dir_all(&logs).with_context(|| format!("creating {}", logs.display()))?;
    eprintln!("soak: node logs in {} (removed if the soak passes)", logs.display());
    let receiver = Receiver::start(answer()).context("starting the soak's receiver")?;
    let client = reqwest::Client::builder().pool_max_idle_per_host(CLIENTS).timeout(Duration::from_secs(30)).build()?;
    let tokens = create_biz_types(&pool, &receiver.url).await?;
    let mut nodes = Nodes::new(url, None, logs, true, client.clone());
    let outcome = async {
        nodes.ensure(args.nodes as usize).await?;
        let memory_start = memory(&nodes);
        // With kills, node 1 takes every API call: the others come and go.
        let bases = match args.kill_every {
            0 => nodes.iter().map(|n| n.base.clone()).collect(),
            _ => vec![nodes.base(0).to_string()],
        };
        let load = Arc::new(Load { client, bases, tokens, ..Load::default() });
        let timers = load.create_timers(args.timers).await?;
        let running = AtomicBool::new(true);
        let (report, kills) = tokio::join!(
            async {
                let report = load.run(&pool, args, &receiver.log, &timers).await;
                running.store(false, Ordering::Relaxed);
                report
            },
            kill_nodes(&mut nodes, args.kill_every, &running)
        );
        let mut report = report?;
        report.kills = kills?;
        Ok::<_, anyhow::Error>((report, memory_start, memory(&nodes)))
    }
    .await;
    nodes.stop(0).await;
    receiver.stop().await;
    let verdict = async {
        let (mut report, memory_start, memory_end) = outcome?;
        report.memory_mib = memory_start.into_iter().zip(memory_end).collect();
        report.print(args);
        std::fs::write(&args.json, serde_json::to_vec_pretty(&report)?).with_context(|| format!("writing {}", args.json.display()))?;
        eprintln!("soak: results written to {}", args.json.display());
        if report.lost > 0 || report.errors.values().sum::<u64>() > 0 {
            bail!("soak failed: {} tasks lost, errors {:?}", report.lost, report.errors);
        }
        Ok(())
    }
    .await;
    nodes.tidy_logs("soak", verdict.is_ok());
    verdict
}

async fn create_biz_types(pool: &Pool, receiver_url: &str) -> anyhow::Result<HashMap<&'static str, String>> {
    let mut tokens = HashMap::new();
    for name in [PLAIN, FLAKY, REPLAYED, TIMERS] {
        let settings = Settings {
            callback_url: Some(receiver_url.to_string()),
            max_in_flight: Some(1000),
            backoff_initial_ms: Some(200),
            backoff_max_ms: Some(2000),
            max_attempts: Some(if name == REPLAYED { 1 } else { 5 }),
            ..Settings::default()
        };
        match biz_types::create(pool, name, &settings, chime::callback_hosts::CallbackHosts::Any).await {
            Ok(_) => {}
            Err(chime::error::Error::Conflict(..)) => bail!("biz type {name} exists: give the soak an empty database"),
            Err(e) => return Err(e.into()),
        }
        tokens.insert(name, biz_types::create_token(pool, name).await?);
    }
    Ok(tokens)
}

/// Every `every` seconds while `running` (the load and the wait after it), kills a node
/// other than the first and starts another in its place; returns how many were killed.
async fn kill_nodes(nodes: &mut Nodes, every: u32, running: &AtomicBool) -> anyhow::Result<u32> {
    let mut kills = 0;
    if every == 0 {
        return Ok(kills);
    }
    let mut next = Instant::now() + Duration::from_secs(every.into());
    while running.load(Ordering::Relaxed) {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if Instant::now() >= next {
            let i = 1 + kills as usize % (nodes.len() - 1);
            nodes.replace(i).await?;
            kills += 1;
            eprintln!("soak: killed node {} (kill -9) and started another", i + 1);
            next = Instant::now() + Duration::from_secs(every.into());
        }
    }
    Ok(kills)
}

/// Each node's resident memory in MiB (VmRSS), in node order.
fn memory(nodes: &Nodes) -> Vec<u64> {
    let rss = |pid: u32| -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let kib: u64 = status.lines().find_map(|l| l.strip_prefix("VmRSS:"))?.trim().trim_end_matches("kB").trim().parse().ok()?;
        Some(kib / 1024)
    };
    nodes.iter().map(|n| n.child.id().and_then(rss).unwrap_or(0)).collect()
}

// ---- the receiver ----

/// How the soak's receiver answers: 503 the first time every fourth flaky task comes, 422
/// to a replayed-biz-type task the first time it comes (failures on purpose), 200
/// otherwise. Flaky, not down: it answers most tasks at once. A receiver refusing every
/// task's first call looks down to the breaker (ten failures in a row open it); while open
/// each probe was a first call too (a held attempt keeps its number), and the breaker
/// stayed open with 514 tasks waiting when the drain ended.
fn answer() -> impl Fn(&Callback) -> StatusCode + Send + Sync + 'static {
    let seen_replayed = Mutex::new(HashSet::new());
    let seen_flaky = Mutex::new(HashSet::new());
    move |callback| match callback.biz_type {
        FLAKY
            if {
                let mut seen = seen_flaky.lock().unwrap();
                seen.insert(callback.task_id) && seen.len() % 4 == 1
            } =>
        {
            StatusCode::SERVICE_UNAVAILABLE
        }
        REPLAYED if seen_replayed.lock().unwrap().insert(callback.task_id) => StatusCode::UNPROCESSABLE_ENTITY,
        _ => StatusCode::OK,
    }
}

// ---- the load ----

#[derive(Default)]
struct Load {
    client: reqwest::Client,
    bases: Vec<String>,
    tokens: HashMap<&'static str, String>,
    /// Tasks whose creation was acknowledged, by how they were made.
    single: Mutex<Vec<Uuid>>,
    batch: Mutex<Vec<Uuid>>,
    replays: AtomicU64,
    /// Requests that did not do what they should, by what and how.
    errors: Mutex<BTreeMap<String, u64>>,
}

impl Load {
    /// Creates `count` every-second timers; returns their ids.
    async fn create_timers(&self, count: u32) -> anyhow::Result<Vec<String>> {
        let mut timers = Vec::new();
        for i in 0..count {
            let body = json!({"biz_type": TIMERS, "key": format!("every-second-{i}"), "cron": "* * * * * *"});
            let timer = self.call("POST", "/api/v1/timers", TIMERS, i as usize, Some(body)).await.context("creating a timer")?;
            timers.push(timer["id"].as_str().context("a timer id")?.to_string());
        }
        Ok(timers)
    }

    /// Runs the load for `args.secs`, then waits for what is owed to be delivered.
    async fn run(self: &Arc<Self>, pool: &Pool, args: &SoakArgs, log: &Log, timers: &[String]) -> anyhow::Result<Report> {
        let started = Instant::now();
        let (creating, replaying) = (Arc::new(AtomicBool::new(true)), Arc::new(AtomicBool::new(true)));
        let singles = tokio::spawn(self.clone().singles(args.rate, creating.clone()));
        let batches = tokio::spawn(self.clone().batches(creating.clone()));
        let replayer = tokio::spawn(self.clone().replayer(replaying.clone()));
        while started.elapsed() < Duration::from_secs(args.secs.into()) {
            tokio::time::sleep(Duration::from_secs(10).min(Duration::from_secs(args.secs.into()).saturating_sub(started.elapsed()))).await;
            let delivered = log.delivered();
            eprintln!(
                "soak: {:>5} s, {} created, {delivered} delivered, {} replayed",
                started.elapsed().as_secs(),
                self.single.lock().unwrap().len() + self.batch.lock().unwrap().len(),
                self.replays.load(Ordering::Relaxed)
            );
        }
        creating.store(false, Ordering::Relaxed);
        singles.await?;
        batches.await?;
        let end: DateTime<Utc> = db::query_scalar("SELECT now()").fetch_one(pool).await?;
        // Each timer owes every whole second after its creation up to the end; the ones
        // never written are lost too (counted before deactivation removes anything).
        let unwritten = load::unwritten_fire_times(pool, TIMERS, end).await?;
        for id in timers {
            self.call("POST", &format!("/api/v1/timers/{id}/deactivate"), TIMERS, 0, None).await.context("deactivating a timer")?;
        }
        // Occurrences due before the end; deactivation removed the later ones (and any not
        // yet fired, which were never owed).
        let occurrences = load::due_ids(pool, TIMERS, end).await?;

        let owed: Vec<Uuid> = [&*self.single.lock().unwrap(), &*self.batch.lock().unwrap(), &occurrences].into_iter().flatten().copied().collect();
        let drain = Instant::now();
        let mut lost = owed.len();
        while drain.elapsed() < DRAIN {
            lost = log.undelivered(&owed);
            if lost == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        replaying.store(false, Ordering::Relaxed);
        replayer.await?;
        eprintln!("soak: drained in {:.1} s", drain.elapsed().as_secs_f64());

        let statuses = load::statuses(pool, "soak-").await?;
        let arrivals: HashMap<&str, _> = [PLAIN, FLAKY, REPLAYED, TIMERS].into_iter().map(|b| (b, log.arrivals(b))).collect();
        // Of every answer: failures given on purpose, 2xx beyond each task's first, and how
        // late the first attempts of plain tasks and timer occurrences came.
        let refused = arrivals.values().flatten().filter(|a| !a.delivered).count() as u64;
        let delivered_answers = arrivals.values().flatten().filter(|a| a.delivered).count() as u64;
        let duplicates = delivered_answers - [PLAIN, FLAKY, REPLAYED, TIMERS].into_iter().map(|b| log.distinct(b) as u64).sum::<u64>();
        let mut lateness: Vec<f64> = [PLAIN, TIMERS]
            .iter()
            .flat_map(|b| &arrivals[b])
            .filter(|a| a.attempt == 1 && a.delivered)
            .map(|a| (a.at - a.run_at).num_microseconds().unwrap_or(i64::MAX) as f64 / 1000.0)
            .collect();
        lateness.sort_by(f64::total_cmp);
        Ok(Report {
            secs: args.secs,
            nodes: args.nodes,
            created_single: self.single.lock().unwrap().len(),
            created_batch: self.batch.lock().unwrap().len(),
            timer_occurrences: occurrences.len(),
            delivered: owed.len() - log.undelivered(&owed),
            duplicates,
            lost: lost + unwritten as usize,
            unwritten_fire_times: unwritten as usize,
            refused_on_purpose: refused,
            replays: self.replays.load(Ordering::Relaxed),
            kills: 0,
            lateness_ms_p50: percentile(&lateness, 0.5),
            lateness_ms_p99: percentile(&lateness, 0.99),
            lateness_ms_max: lateness.last().copied().unwrap_or(f64::NAN),
            statuses,
            errors: self.errors.lock().unwrap().clone(),
            memory_mib: Vec::new(),
        })
    }

    /// Single creates at `rate` per second, a third of each kind, due within 3 s.
    async fn singles(self: Arc<Self>, rate: u32, creating: Arc<AtomicBool>) {
        let clients = Arc::new(Semaphore::new(CLIENTS));
        let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / f64::from(rate)));
        let mut i = 0usize;
        while creating.load(Ordering::Relaxed) {
            tick.tick().await;
            let client = clients.clone().acquire_owned().await.expect("never closed");
            let load = self.clone();
            tokio::spawn(async move {
                let biz_type = [PLAIN, FLAKY, REPLAYED][i % 3];
                let body = json!({"biz_type": biz_type, "delay_ms": i * 7919 % 3000, "payload": {"n": i}});
                if let Some(task) = load.call("POST", "/api/v1/tasks", biz_type, i, Some(body)).await
                    && let Some(id) = task["id"].as_str().and_then(|id| id.parse().ok())
                {
                    load.single.lock().unwrap().push(id);
                }
                drop(client);
            });
            i += 1;
        }
        // Wait for the creates in flight.
        let _ = clients.acquire_many(CLIENTS as u32).await;
    }

    /// A batch of 100 plain tasks every second, due within 2 s.
    async fn batches(self: Arc<Self>, creating: Arc<AtomicBool>) {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        let mut n = 0usize;
        while creating.load(Ordering::Relaxed) {
            tick.tick().await;
            let tasks: Vec<Value> = (0..100).map(|j| json!({"biz_type": PLAIN, "delay_ms": j * 31 % 2000, "payload": {"batch": n}})).collect();
            if let Some(answer) = self.call("POST", "/api/v1/tasks/batch", PLAIN, n, Some(json!({"tasks": tasks}))).await {
                for result in answer["results"].as_array().into_iter().flatten() {
                    match result["task"]["id"].as_str().and_then(|id| id.parse().ok()) {
                        Some(id) if result["status"] == 201 => self.batch.lock().unwrap().push(id),
                        _ => self.error(format!("batch item {}", result["status"])),
                    }
                }
            }
            n += 1;
        }
    }

    /// Every second, replays the replayed biz type's failed tasks, as support staff would.
    async fn replayer(self: Arc<Self>, replaying: Arc<AtomicBool>) {
        let mut n = 0usize;
        while replaying.load(Ordering::Relaxed) {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let path = format!("/api/v1/tasks?biz_type={REPLAYED}&status=failed&limit=500");
            let Some(list) = self.call("GET", &path, REPLAYED, n, None).await else { continue };
            for task in list["items"].as_array().into_iter().flatten() {
                let id = task["id"].as_str().unwrap_or_default();
                if self.call("POST", &format!("/api/v1/tasks/{id}/replay"), REPLAYED, n, None).await.is_some() {
                    self.replays.fetch_add(1, Ordering::Relaxed);
                }
                n += 1;
            }
        }
    }

    /// A request to node `i` (modulo the count) with `biz_type`'s token; the JSON answer of
    /// a 2xx, anything else counted as an error (and `None`).
    async fn call(&self, method: &str, path: &str, biz_type: &str, i: usize, body: Option<Value>) -> Option<Value> {
        let base = &self.bases[i % self.bases.len()];
        let mut request = self.client.request(method.parse().expect("a method"), format!("{base}{path}")).bearer_auth(&self.tokens[biz_type]);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let what = format!("{method} {}", path.split('?').next().unwrap_or(path));
        let error = match request.send().await {
            Ok(response) if response.status().is_success() => match response.json().await {
                Ok(answer) => return Some(answer),
                Err(e) => e.to_string(),
            },
            Ok(response) => response.status().to_string(),
            // With its causes: reqwest says "error sending request" for a refused
            // connection, a reset and a timeout alike.
            Err(e) => std::iter::successors(Some(&e as &dyn std::error::Error), |e| e.source()).map(|e| e.to_string()).collect::<Vec<_>>().join(": "),
        };
        self.error(format!("{what}: {error}"));
        None
    }

    fn error(&self, what: String) {
        *self.errors.lock().unwrap().entry(what).or_default() += 1;
    }
}

// ---- the report ----

#[derive(serde::Serialize)]
struct Report {
    secs: u32,
    nodes: u32,
    created_single: usize,
    created_batch: usize,
    timer_occurrences: usize,
    /// Of the tasks owed (created, and occurrences due), those answered 2xx at least once.
    delivered: usize,
    /// 2xx answers beyond each task's first.
    duplicates: u64,
    lost: usize,
    /// Of those lost, timer fire times never written as occurrences.
    unwritten_fire_times: usize,
    refused_on_purpose: u64,
    replays: u64,
    /// Nodes killed with SIGKILL (and replaced) during the soak.
    kills: u32,
    lateness_ms_p50: f64,
    lateness_ms_p99: f64,
    lateness_ms_max: f64,
    /// Final statuses of the soak's tasks (timer occurrences after the end included).
    statuses: BTreeMap<String, i64>,
    errors: BTreeMap<String, u64>,
    /// Each node's resident memory at the start and at the end, in MiB.
    memory_mib: Vec<(u64, u64)>,
}

impl Report {
    fn print(&self, args: &SoakArgs) {
        let created = self.created_single + self.created_batch + self.timer_occurrences;
        println!("\nsoak: {} s on {} node(s), {} creates/s and a batch of 100 a second, {} timers\n", self.secs, self.nodes, args.rate, args.timers);
        println!(
            "  created      {created:>9}  ({} single, {} in batches, {} timer occurrences)",
            self.created_single, self.created_batch, self.timer_occurrences
        );
        println!("  delivered    {:>9}", self.delivered);
        println!("  duplicates   {:>9}", self.duplicates);
        println!("  lost         {:>9}  ({} timer fire times never written)", self.lost, self.unwritten_fire_times);
        println!("  failures     {:>9}  answered on purpose (retried, or failed and replayed: {} replays)", self.refused_on_purpose, self.replays);
        if self.kills > 0 {
            println!("  node kills   {:>9}  (kill -9, one every {} s, each replaced)", self.kills, args.kill_every);
        }
        println!(
            "  lateness     p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms (first attempts)",
            self.lateness_ms_p50, self.lateness_ms_p99, self.lateness_ms_max
        );
        for (i, (start, end)) in self.memory_mib.iter().enumerate() {
            println!("  node {}       {start} MiB at the start, {end} MiB at the end", i + 1);
        }
        println!("  statuses     {:?}", self.statuses);
        if !self.errors.is_empty() {
            println!("  errors       {:?}", self.errors);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_receiver_fails_every_fourth_flaky_first_arrival_and_replayed_first_arrivals() {
        let answer = answer();
        let (task, other) = (Uuid::new_v4(), Uuid::new_v4());
        let call = |biz_type, task_id, attempt| answer(&Callback { task_id, biz_type, run_at: Utc::now(), attempt });
        assert_eq!(call(PLAIN, task, 1), StatusCode::OK);
        assert_eq!(call(TIMERS, task, 1), StatusCode::OK);
        assert_eq!(call(FLAKY, task, 1), StatusCode::SERVICE_UNAVAILABLE);
        // Again, its attempt number kept (as after a held attempt): answered.
        assert_eq!(call(FLAKY, task, 1), StatusCode::OK);
        let flaky: Vec<StatusCode> = (0..8).map(|_| call(FLAKY, Uuid::new_v4(), 1)).collect();
        let refused = flaky.iter().filter(|s| **s == StatusCode::SERVICE_UNAVAILABLE).count();
        assert_eq!((refused, flaky[3]), (2, StatusCode::SERVICE_UNAVAILABLE), "every fourth: {flaky:?}");
        // Replayed: refused the first time whatever the attempt (a replay starts again at 1).
        assert_eq!(call(REPLAYED, task, 1), StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(call(REPLAYED, task, 1), StatusCode::OK);
        assert_eq!(call(REPLAYED, other, 1), StatusCode::UNPROCESSABLE_ENTITY);
    }
}
