//! `chime bench`: measures what a timer service is judged on (issue 6's targets) on this
//! machine, end to end: tasks go in through the REST API of real `chime serve` processes,
//! and come out as HTTP callbacks to a receiver in this process.
//!
//! Scenarios:
//! - create-single: tasks created one per request by many clients;
//! - create-batch: tasks created 1000 per request, unkeyed then keyed;
//! - burst: tasks all due at one instant; rate from the due instant until the last
//!   success is recorded, and how late the first callback came;
//! - steady: tasks due at an even rate; how late each callback came;
//! - backlog: writes millions of future and finished tasks, then repeats burst and steady;
//! - scale: writes up to 100M pending tasks over a year (cold storage) and a month of daily
//!   partitions of finished ones (scale.rs), then repeats burst and steady;
//! - timers: cron timers, their occurrences' lateness and steady beside them (`timers.rs`);
//! - fairness: steady among thousands of idle biz types, and beside another biz type's
//!   herd, each against the same without them in the same run (`fairness.rs`).
//!
//! Burst and timers also report the nodes' memory (RSS): at rest and at its peak.
//!
//! Times come from one clock: the receiver's arrival times and the database's, on the
//! same machine. Tasks due in the future are created before they are due, so creating
//! them is not part of their lateness.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use actix_web::http::StatusCode;
use anyhow::{Context, bail};
use chime::biz_types::{self, Settings};
use chime::db::DbArgs;
use chime::db::embedded_pg;
use chime::db::{self, Pool};
use chime::partitions;
use chime::tasks::load;
use chrono::{DateTime, TimeDelta, Utc};

use crate::cli::{BenchArgs, BenchScenario};
use crate::memory;
use crate::nodes::Nodes;
use crate::receiver::{Arrival, Receiver};
use crate::report::{Report, Target};
use crate::waits::{self, Seen, Waits};

#[path = "fairness.rs"]
mod fairness;
#[path = "timers.rs"]
mod timers;

const BATCH: usize = 1000;
/// Create-scenario tasks are due this far ahead: they are never delivered during the run.
const CREATE_DELAY_MS: i64 = 3_600_000;

pub async fn run(db_args: &DbArgs, args: BenchArgs) -> anyhow::Result<()> {
    let (url, embedded) = database(db_args).await?;
    let result = async {
        // The bench's own statements and migrations go straight to PostgreSQL (in pooler
        // mode the nodes' statements go through DATABASE_URL's pooler).
        let direct = db_args.direct_database_url.as_deref();
        let pool = db::connect(direct.unwrap_or(&url), 4).await?;
        db::migrate(&pool).await?;
        let logs = std::env::temp_dir().join(format!("chime-bench-{}", std::process::id()));
        std::fs::create_dir_all(&logs).with_context(|| format!("creating {}", logs.display()))?;
        eprintln!("bench: node logs in {} (removed if the run succeeds)", logs.display());
        let receiver = match &args.receiver_url {
            Some(_) => None,
            None => Some(Receiver::start(|_| StatusCode::OK).context("starting the bench's receiver")?),
        };
        // Idle connections are dropped well before the nodes' keep-alive (actix-web's 5 s)
        // closes them: a request sent on one the node is closing fails ("connection closed
        // before message completed"), which ended runs between scenarios.
        let client = reqwest::Client::builder().pool_max_idle_per_host(1024).pool_idle_timeout(Duration::from_secs(2)).build()?;
        let nodes = Nodes::new(&url, direct, logs, receiver.is_some(), client.clone());
        let mut bench = Bench { client, pool, receiver, nodes, report: Report::new(&args), args };
        let outcome = bench.run_all().await;
        bench.nodes.stop(0).await;
        if let Some(receiver) = &bench.receiver {
            receiver.stop().await;
        }
        bench.nodes.tidy_logs("bench", outcome.is_ok());
        outcome?;
        bench.report.print();
        bench.report.write_json(&bench.args.json)?;
        eprintln!("bench: results written to {}", bench.args.json.display());
        if let Some(path) = &bench.args.svg {
            bench.report.write_svg(path)?;
            eprintln!("bench: charts drawn in {}", path.display());
        }
        anyhow::Ok(())
    }
    .await;
    if let Some(pg) = embedded {
        pg.stop().await;
    }
    result
}

/// DATABASE_URL, or else a throwaway embedded PostgreSQL with the durable settings of
/// `chime serve`, removed by the caller's `stop` (or, failing that, at exit).
pub async fn database(db_args: &DbArgs) -> anyhow::Result<(String, Option<embedded_pg::EmbeddedPg>)> {
    Ok(match &db_args.database_url {
        Some(url) => (url.clone(), None),
        None => {
            let pg = embedded_pg::start_temporary("").await.context("starting a throwaway PostgreSQL")?;
            (pg.url("chime"), Some(pg))
        }
    })
}

/// A biz type made for one scenario run, with its API token.
struct Biz {
    id: i32,
    name: String,
    token: String,
    /// A minute before the biz type was made: none of its tasks is due earlier.
    since: DateTime<Utc>,
}

struct Bench {
    args: BenchArgs,
    pool: Pool,
    client: reqwest::Client,
    receiver: Option<Receiver>,
    nodes: Nodes,
    report: Report,
}

impl Bench {
    async fn run_all(&mut self) -> anyhow::Result<()> {
        let wants = |s| self.args.scenarios.contains(&s);
        let (single, batch, burst, steady, backlog, scale) = (
            wants(BenchScenario::CreateSingle),
            wants(BenchScenario::CreateBatch),
            wants(BenchScenario::Burst),
            wants(BenchScenario::Steady),
            wants(BenchScenario::Backlog),
            wants(BenchScenario::Scale),
        );
        let timers = wants(BenchScenario::Timers);
        let fairness = wants(BenchScenario::Fairness);
        // Backlog and scale compare with the empty table's burst and steady, on the first
        // node count.
        let loaded = backlog || scale;
        let counts = self.args.nodes.clone();
        for (i, &nodes) in counts.iter().enumerate() {
            self.nodes.ensure(nodes as usize).await?;
            for run in 1..=self.args.runs {
                // Creating goes through the API of every node, so one count is enough.
                if i == 0 && single {
                    self.create_single(run).await?;
                }
                if i == 0 && batch {
                    self.create_batch(run).await?;
                }
                if burst || loaded && i == 0 {
                    self.burst(run, "burst").await?;
                }
                if steady || loaded && i == 0 {
                    self.steady(run, "steady").await?;
                }
                if i == 0 && timers {
                    self.timers(run).await?;
                }
                if fairness {
                    self.fairness(run).await?;
                }
            }
        }
        if backlog {
            self.nodes.ensure(counts[0] as usize).await?;
            self.fill_backlog().await?;
            for run in 1..=self.args.runs {
                self.burst(run, "backlog burst").await?;
                self.steady(run, "backlog steady").await?;
            }
            self.report.compare_loaded("backlog", counts[0]);
        }
        if scale {
            self.nodes.ensure(counts[0] as usize).await?;
            let biz = self.new_biz_type("scale").await?;
            crate::scale::fill(&self.pool, biz.id, &self.payload(0), &self.args, &mut self.report).await?;
            for run in 1..=self.args.runs {
                self.burst(run, "scale burst").await?;
                self.steady(run, "scale steady").await?;
            }
            self.report.compare_loaded("scale", counts[0]);
        }
        Ok(())
    }

    fn callback_url(&self) -> String {
        match (&self.args.receiver_url, &self.receiver) {
            (Some(url), _) => url.clone(),
            (None, Some(r)) => r.url.clone(),
            (None, None) => unreachable!("a receiver runs when no URL is given"),
        }
    }

    async fn new_biz_type(&self, name: &str) -> anyhow::Result<Biz> {
        self.new_biz_type_with(name, Settings::default()).await
    }

    /// `new_biz_type`, with `settings` for what the bench does not set itself.
    async fn new_biz_type_with(&self, name: &str, settings: Settings) -> anyhow::Result<Biz> {
        let name = format!("bench-{name}");
        let settings = Settings {
            callback_url: Some(self.callback_url()),
            mode: Some("callback".into()),
            max_in_flight: Some(self.args.max_in_flight as i32),
            timeout_ms: Some(10_000),
            ..settings
        };
        let biz = match biz_types::create(&self.pool, &name, &settings, chime::callback_hosts::CallbackHosts::Any).await {
            Ok(biz) => biz,
            Err(chime::error::Error::Conflict(..)) => bail!("biz type {name} exists: give the bench an empty database"),
            Err(e) => return Err(e.into()),
        };
        let token = biz_types::create_token(&self.pool, &name).await?;
        Ok(Biz { id: biz.id, name, token, since: Utc::now() - TimeDelta::minutes(1) })
    }

    // ---- creating ----

    fn payload(&self, n: usize) -> String {
        format!(r#"{{"order":{n},"note":"{}"}}"#, "x".repeat(self.args.payload_bytes.saturating_sub(30) as usize))
    }

    async fn create_single(&mut self, run: u32) -> anyhow::Result<()> {
        let biz = self.new_biz_type(&format!("create-single-{run}")).await?;
        let (total, clients) = (self.args.single_tasks as usize, self.args.single_clients as usize);
        let body = Arc::new(format!(r#"{{"biz_type":"{}","delay_ms":{CREATE_DELAY_MS},"payload":{}}}"#, biz.name, self.payload(0)));
        let next = Arc::new(AtomicUsize::new(0));
        let started = Instant::now();
        let mut workers = tokio::task::JoinSet::new();
        for c in 0..clients {
            let (client, body, next, token) = (self.client.clone(), body.clone(), next.clone(), biz.token.clone());
            let url = format!("{}/api/v1/tasks", self.nodes.base(c));
            workers.spawn(async move {
                while next.fetch_add(1, Ordering::Relaxed) < total {
                    let reply = client.post(&url).bearer_auth(&token).body(body.as_str().to_owned()).send().await?;
                    if reply.status() != reqwest::StatusCode::CREATED {
                        bail!("create answered {}: {}", reply.status(), reply.text().await.unwrap_or_default());
                    }
                }
                anyhow::Ok(())
            });
        }
        while let Some(done) = workers.join_next().await {
            done??;
        }
        let rate = total as f64 / started.elapsed().as_secs_f64();
        let nodes = self.nodes.len() as u32;
        let metric = format!("create, one task per request, {clients} clients");
        self.report.add("create-single", nodes, &metric, "tasks/s", rate, Some(Target::AtLeast(10_000.0)));
        self.delete_tasks(&biz).await
    }

    /// Unkeyed tasks, then (in a biz type of their own) keyed ones: a key costs an insert
    /// into task_keys and a check that it is free.
    async fn create_batch(&mut self, run: u32) -> anyhow::Result<()> {
        for keyed in [false, true] {
            let biz = self.new_biz_type(&format!("create-batch{}-{run}", if keyed { "-keyed" } else { "" })).await?;
            let total = self.args.batch_tasks as usize;
            let run_at = Utc::now() + TimeDelta::milliseconds(CREATE_DELAY_MS);
            let started = Instant::now();
            self.create_batches(&biz, &vec![run_at; total], keyed, 0).await?;
            let rate = total as f64 / started.elapsed().as_secs_f64();
            let keys = if keyed { ", keyed" } else { "" };
            let metric = format!("create, {BATCH} tasks per request{keys}, {} clients", self.args.batch_clients);
            self.report.add("create-batch", self.nodes.len() as u32, &metric, "tasks/s", rate, Some(Target::AtLeast(100_000.0)));
            self.delete_tasks(&biz).await?;
        }
        Ok(())
    }

    /// Creates one task per `run_at` through the batch API, `batch_clients` requests at a
    /// time spread over the nodes.
    async fn create_due(&self, biz: &Biz, run_ats: &[DateTime<Utc>]) -> anyhow::Result<()> {
        self.create_batches(biz, run_ats, false, 0).await
    }

    /// `create_due`, each task with a key of its own if `keyed`, and task n with flow key
    /// `k<n % flow_keys>` if `flow_keys` is not 0. The answers hold what `--batch-results`
    /// says (by default ids only, as a client that keeps nothing else would ask).
    pub(super) async fn create_batches(&self, biz: &Biz, run_ats: &[DateTime<Utc>], keyed: bool, flow_keys: usize) -> anyhow::Result<()> {
        let chunks: Arc<Vec<String>> = Arc::new(
            run_ats
                .chunks(BATCH)
                .enumerate()
                .map(|(c, chunk)| {
                    let items: Vec<String> = chunk
                        .iter()
                        .enumerate()
                        .map(|(i, at)| {
                            let n = c * BATCH + i;
                            let mut key = if keyed { format!(r#""key":"task-{n}","#) } else { String::new() };
                            if flow_keys > 0 {
                                key.push_str(&format!(r#""flow_key":"k{}","#, n % flow_keys));
                            }
                            format!(
                                r#"{{"biz_type":"{}",{key}"run_at":"{}","payload":{}}}"#,
                                biz.name,
                                at.to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
                                self.payload(n)
                            )
                        })
                        .collect();
                    // The default left out, so that `tasks` also measures a release without the option.
                    match self.args.batch_results.as_str() {
                        "tasks" => format!(r#"{{"tasks":[{}]}}"#, items.join(",")),
                        results => format!(r#"{{"tasks":[{}],"results":"{results}"}}"#, items.join(",")),
                    }
                })
                .collect(),
        );
        let next = Arc::new(AtomicUsize::new(0));
        let mut workers = tokio::task::JoinSet::new();
        for c in 0..self.args.batch_clients as usize {
            let (client, chunks, next, token) = (self.client.clone(), chunks.clone(), next.clone(), biz.token.clone());
            let url = format!("{}/api/v1/tasks/batch", self.nodes.base(c));
            workers.spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(body) = chunks.get(i) else { return anyhow::Ok(()) };
                    let reply = client.post(&url).bearer_auth(&token).body(body.clone()).send().await?;
                    let status = reply.status();
                    let text = reply.text().await?;
                    // Every item answers 201; anything else is in the body as "status":4xx/5xx.
                    if !status.is_success() || text.contains(r#""status":4"#) || text.contains(r#""status":5"#) {
                        bail!("batch create answered {status}: {}", &text[..text.len().min(500)]);
                    }
                }
            });
        }
        while let Some(done) = workers.join_next().await {
            done??;
        }
        Ok(())
    }

    /// Leaves the dead rows to autovacuum, as in production. (A VACUUM ANALYZE here would
    /// record the partition as empty just before a burst fills it: see `engine::claim`.)
    async fn delete_tasks(&self, biz: &Biz) -> anyhow::Result<()> {
        load::delete_all(&self.pool, biz.id).await?;
        Ok(())
    }

    // ---- delivering ----

    async fn burst(&mut self, run: u32, scenario: &str) -> anyhow::Result<()> {
        let nodes = self.nodes.len() as u32;
        let biz = self.new_biz_type(&format!("{}-{nodes}n-{run}", scenario.replace(' ', "-"))).await?;
        let total = self.args.burst_tasks as usize;
        // Time to create the tasks (about 25k/s at worst) before they fall due.
        let lead = TimeDelta::milliseconds(1500 + total as i64 / 25);
        let due = Utc::now() + lead;
        let pids = self.nodes.pids();
        let at_rest = memory::max_rss_mib(&pids);
        let memory = memory::Sampler::start(pids);
        let wal_before = waits::wal_position(&self.pool).await?;
        self.create_due(&biz, &vec![due; total]).await?;
        let created_wal = waits::wal_position(&self.pool).await?.saturating_sub(wal_before);
        if Utc::now() > due {
            bail!("creating {total} tasks took longer than the {} ms allowed; use a smaller --burst-tasks", lead.num_milliseconds());
        }
        let waits = Waits::start(&self.pool).await?;
        let (arrivals, last_recorded) = self.wait_delivered(&biz, total, Duration::from_secs(60 + total as u64 / 1000)).await?;
        let seen = waits.stop().await;
        let peak = memory.peak().await;
        let first = arrivals.iter().map(|a| a.at).min().expect("at least one arrival");
        let rate = total as f64 / secs(last_recorded - due);
        self.report.add(scenario, nodes, &format!("burst of {total}: delivery rate"), "tasks/s", rate, Some(Target::AtLeast(15_000.0)));
        self.report.add(scenario, nodes, "burst: first callback after due", "ms", ms(first - due), Some(Target::AtMost(10.0)));
        self.report.add(scenario, nodes, "burst: duplicates", "tasks", (arrivals.len() - distinct(&arrivals)) as f64, None);
        self.report.add(scenario, nodes, "node RSS at rest, before the burst", "MiB", at_rest.unwrap_or(f64::NAN), None);
        self.report.add(
            scenario,
            nodes,
            "node RSS peak, creating and delivering the burst (sampled every 100 ms)",
            "MiB",
            peak.unwrap_or(f64::NAN),
            None,
        );
        let per_task = |bytes: u64| bytes as f64 / total.max(1) as f64;
        self.report.add(scenario, nodes, "burst: WAL per task created (batch create)", "bytes", per_task(created_wal), None);
        let whole = per_task(created_wal + seen.wal_bytes);
        self.report.add(scenario, nodes, "burst: WAL per task, create to delivery", "bytes", whole, Some(Target::AtMost(2048.0)));
        self.report_database(scenario, nodes, "burst", seen, total);
        self.report.burst_series(&format!("{scenario}, {nodes} node{}", plural(nodes)), due, &arrivals);
        Ok(())
    }

    /// What the database waited on while `what` ran (the waits of at least 1% of its
    /// active backend-samples, at most 6), and its CPU and WAL per delivered task.
    fn report_database(&mut self, scenario: &str, nodes: u32, what: &str, seen: Seen, delivered: usize) {
        if let Some(cpu) = seen.cpu_secs {
            let per_task = 1e6 * cpu / delivered.max(1) as f64;
            self.report.add(scenario, nodes, &format!("{what}: PostgreSQL CPU per delivered task"), "µs", per_task, None);
        }
        let wal = seen.wal_bytes as f64 / delivered.max(1) as f64;
        self.report.add(scenario, nodes, &format!("{what}: WAL per delivered task"), "bytes", wal, None);
        for (wait, share, statement, in_it) in seen.waits.iter().filter(|(_, share, ..)| *share >= 0.01).take(6) {
            self.report.add(scenario, nodes, &format!("{what}: database backends waiting on {wait}"), "% of samples", 100.0 * share, None);
            if wait != "CPU" {
                let name = format!("{what}: of those on {wait}, in \"{statement}\"");
                self.report.add(scenario, nodes, &name, "% of them", 100.0 * in_it, None);
            }
        }
    }

    async fn steady(&mut self, run: u32, scenario: &str) -> anyhow::Result<()> {
        let nodes = self.nodes.len() as u32;
        let biz = self.new_biz_type(&format!("{}-{nodes}n-{run}", scenario.replace(' ', "-"))).await?;
        let start = Utc::now() + self.steady_lead();
        let total = self.create_steady(&biz, start).await?;
        // From the first due time: the database's work for the tasks, not its idle wait.
        tokio::time::sleep((start - Utc::now()).to_std().unwrap_or_default()).await;
        let waits = Waits::start(&self.pool).await?;
        let (arrivals, _) = self.wait_delivered(&biz, total, Duration::from_secs(u64::from(self.args.steady_secs) + 60)).await?;
        let seen = waits.stop().await;
        self.report_database(scenario, nodes, "steady", seen, total);
        let lateness = first_lateness_ms(&arrivals);
        let metric = format!("steady {}/s: lateness", self.args.steady_rate);
        self.report.add(scenario, nodes, &format!("{metric} p50"), "ms", percentile(&lateness, 0.50), Some(Target::AtMost(5.0)));
        self.report.add(scenario, nodes, &format!("{metric} p99"), "ms", percentile(&lateness, 0.99), Some(Target::AtMost(20.0)));
        self.report.add(scenario, nodes, &format!("{metric} max"), "ms", percentile(&lateness, 1.0), None);
        self.report.lateness_series(&format!("{scenario}, {nodes} node{}", plural(nodes)), lateness);
        Ok(())
    }

    /// Time to create steady's tasks (about 25k/s at worst) before the first falls due.
    fn steady_lead(&self) -> TimeDelta {
        TimeDelta::milliseconds(1500 + i64::from(self.args.steady_rate) * i64::from(self.args.steady_secs) / 25)
    }

    /// Creates steady's tasks for `biz`: `--steady-rate` a second, spread evenly over
    /// `--steady-secs` from `start`, which must not have passed once they are created.
    /// Returns how many.
    async fn create_steady(&self, biz: &Biz, start: DateTime<Utc>) -> anyhow::Result<usize> {
        self.create_steady_over(biz, start, 0).await
    }

    /// `create_steady`, task n with flow key `k<n % flow_keys>` (0: none).
    pub(super) async fn create_steady_over(&self, biz: &Biz, start: DateTime<Utc>, flow_keys: usize) -> anyhow::Result<usize> {
        let (rate, seconds) = (i64::from(self.args.steady_rate), i64::from(self.args.steady_secs));
        let total = (rate * seconds) as usize;
        let run_ats: Vec<DateTime<Utc>> = (0..total as i64).map(|i| start + TimeDelta::microseconds(i * 1_000_000 / rate)).collect();
        let lead = start - Utc::now();
        self.create_batches(biz, &run_ats, false, flow_keys).await?;
        if Utc::now() > start {
            bail!("creating {total} tasks took longer than the {} ms allowed", lead.num_milliseconds());
        }
        Ok(total)
    }

    /// Waits until every task of `biz` succeeded; returns the callbacks as they arrived
    /// (from the receiver, or as fired according to chime's attempts when the receiver is
    /// elsewhere) and when the last success was recorded.
    async fn wait_delivered(&self, biz: &Biz, total: usize, limit: Duration) -> anyhow::Result<(Vec<Arrival>, DateTime<Utc>)> {
        let deadline = Instant::now() + limit;
        // The receiver's count is free to read; the database is asked once it is complete,
        // so that polling adds no load while the scenario runs.
        if let Some(receiver) = &self.receiver {
            while receiver.log.distinct(&biz.name) < total {
                if Instant::now() > deadline {
                    bail!("{}: {} of {total} callbacks arrived within {limit:?}", biz.name, receiver.log.distinct(&biz.name));
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        let last_recorded = loop {
            let (done, last) = load::succeeded(&self.pool, biz.id, biz.since).await?;
            if done as usize >= total {
                break last.expect("finished tasks have finished_at");
            }
            if Instant::now() > deadline {
                bail!("{}: {done} of {total} tasks succeeded within {limit:?}", biz.name);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let arrivals = match &self.receiver {
            Some(receiver) => receiver.log.arrivals(&biz.name),
            None => load::attempt_times(&self.pool, biz.id)
                .await?
                .into_iter()
                .map(|a| Arrival { task_id: a.task_id, run_at: a.run_at, at: a.started_at, attempt: a.number, delivered: a.succeeded })
                .collect(),
        };
        Ok((arrivals, last_recorded))
    }

    // ---- backlog ----

    /// Writes the backlog straight into the table, as years of use would leave it: future
    /// tasks spread over the hot partitions, finished ones over the past day.
    async fn fill_backlog(&mut self) -> anyhow::Result<()> {
        let biz = self.new_biz_type("backlog").await?;
        let payload = self.payload(0);
        let horizon = partitions::horizon(&self.pool).await?;
        let now = Utc::now();
        let part = |what, count, from, to, finished| crate::scale::Part { what, count, from, to, finished, cold: false, flow_key: None };
        let parts = vec![
            part("future", self.args.backlog_future, now + TimeDelta::hours(1), horizon - TimeDelta::hours(1), false),
            part("finished", self.args.backlog_finished, now - TimeDelta::hours(20), now - TimeDelta::hours(1), true),
        ];
        let started = Instant::now();
        crate::scale::write(&self.pool, biz.id, &payload, parts, "backlog").await?;
        crate::scale::settle(&self.pool, "backlog").await?;
        eprintln!("bench: backlog ready after {:.0} s", started.elapsed().as_secs_f64());
        Ok(())
    }
}

pub(crate) fn secs(d: TimeDelta) -> f64 {
    d.num_microseconds().unwrap_or(i64::MAX) as f64 / 1e6
}

fn ms(d: TimeDelta) -> f64 {
    secs(d) * 1000.0
}

fn plural(n: u32) -> &'static str {
    if n == 1 { "" } else { "s" }
}

fn distinct(arrivals: &[Arrival]) -> usize {
    arrivals.iter().map(|a| a.task_id).collect::<std::collections::HashSet<_>>().len()
}

/// Lateness of each task's first callback, in ms, sorted.
fn first_lateness_ms(arrivals: &[Arrival]) -> Vec<f64> {
    let mut seen = std::collections::HashSet::new();
    let mut lateness: Vec<f64> = arrivals.iter().filter(|a| seen.insert(a.task_id)).map(|a| ms(a.at - a.run_at)).collect();
    lateness.sort_by(f64::total_cmp);
    lateness
}

/// The value at quantile `q` of sorted values (nearest rank).
pub fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentile_is_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 0.5), 50.0);
        assert_eq!(percentile(&v, 0.99), 99.0);
        assert_eq!(percentile(&v, 1.0), 100.0);
        assert_eq!(percentile(&[7.0], 0.99), 7.0);
        assert!(percentile(&[], 0.5).is_nan());
    }
}
