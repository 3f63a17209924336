//! The `fairness` scenario (issue 34): whether one biz type's punctuality depends on the
//! others sharing the service. Each figure is taken beside the same without the neighbours,
//! in the same run, on every node count of `--nodes`.
//!
//! 1. Idle biz types (the cost of many). With 10 biz types delivering by callback (the
//!    scenario's own, those earlier scenarios left, and idle ones to make up 10): the
//!    database's transactions a second while nothing is due, over `--fairness-idle-secs`,
//!    and the nodes' CPU meanwhile; then steady's lateness (`--steady-rate` for
//!    `--steady-secs`). Then `--fairness-biz-types` less those are added in one statement
//!    (`biz_types::load::create_idle`: callback URL the bench's receiver, never given a
//!    task), the nodes are given time to re-read them, and the same is measured again. The
//!    idle biz types are deleted afterwards.
//! 2. Noisy neighbour. Steady for a biz type B alone; then steady again for another B while
//!    `--fairness-herd` tasks of biz type A, written straight into the table in one
//!    statement (as the backlog is), all fall due at one instant a second after B's first
//!    (a quarter of `--steady-secs` if that is shorter). Also reported: how long A's herd
//!    took to deliver, and B's p99 over the tasks due while the herd was delivered; the JSON
//!    has the timeline (`herd_timelines`: per 100 ms, the herd's callbacks and B's worst
//!    lateness), to see when B fell behind.
//!
//! The bounds (steady p99 within 1.5× with 10,000 biz types, idle transactions within
//! 2×; B's p99 beside the herd within 1.5× alone) are the targets of the ratios: the table
//! says `ok` or `MISSED`, and a miss does not fail the run (CI machines are noisy).
//!
//! 3. Priority. `--fairness-herd` tasks of one biz type written due at once and delivered
//!    at `QUEUE_RATE` a second (its rate limit: a receiver that takes no more), so that they
//!    queue; meanwhile `URGENT` tasks of priority 9 are created due now, one every
//!    `URGENT_GAP`, and each one's lateness (its creation to its callback) is measured.
//!    Target: at most 50 ms, the bound for a top-priority task behind 100,000.
//!
//! 4. Flow keys. One biz type with `flow_max_in_flight` `HOT_CAP`: steady spread over
//!    `KEYS` flow keys, alone; then again beside `--fairness-herd` tasks of one hot key, all
//!    due at one instant a moment after steady's first. Target: steady's p99 beside the hot
//!    key within 2× alone. The hot key's running tasks are sampled every 10 ms meanwhile
//!    (chime's side: what was leased, which bounds what reached the receiver); target: never
//!    over `HOT_CAP`. Then the overhead: a burst of `--fairness-herd` tasks spread over
//!    `KEYS` keys against the same burst in a biz type without per-key limits; target: at
//!    least 70% of its rate.
//!
//! The neighbour of 100,000 cron timers is the timers scenario's: steady's p99 beside them
//! against alone, with the same 1.5× target.
//! Priority's overhead on a burst is measured on the claim statement (docs/design/claim.md).

use std::collections::HashSet;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use chime::biz_types::{self, Settings, load as biz_load};
use chime::db::{self, Pool};
use chrono::{DateTime, SubsecRound, TimeDelta, Utc};

use super::{Bench, Biz, first_lateness_ms, ms, percentile, plural, secs};
use crate::memory;
use crate::receiver::Arrival;
use crate::report::Target;
use serde_json::json;
use uuid::Uuid;

/// Biz types delivering when steady runs among few.
const FEW: i64 = 10;
/// How long the nodes are given to re-read the biz types after idle ones are added: they
/// are told at once (the insert's notification) and re-read every 2 s anyway (the engine's
/// SETTINGS_REFRESH); a second more for the sweep that follows.
const REREAD: Duration = Duration::from_secs(3);
/// The scenario's name in the report.
const SCENARIO: &str = "fairness";
/// Callbacks a second of the biz type whose tasks queue in part 3.
const QUEUE_RATE: f64 = 200.0;
/// Tasks of priority 9 created in part 3, one every `URGENT_GAP`.
const URGENT: usize = 20;
const URGENT_GAP: Duration = Duration::from_millis(100);
/// Flow keys of part 4, and the cap per key.
const KEYS: usize = 10_000;
const HOT_CAP: i32 = 10;

/// What one part-1 measurement found.
struct Crowd {
    /// Biz types delivering by callback.
    biz_types: i64,
    xacts_per_s: f64,
    /// The nodes' CPU over the idle window, in % of one core (all nodes together).
    cpu_pct: f64,
    /// Steady's lateness, ms, sorted.
    lateness: Vec<f64>,
}

impl Bench {
    pub(super) async fn fairness(&mut self, run: u32) -> anyhow::Result<()> {
        let parts = self.args.fairness_parts.clone();
        if parts.contains(&1) {
            self.fairness_idle_biz_types(run).await?;
        }
        if parts.contains(&2) {
            self.fairness_herd(run).await?;
        }
        if parts.contains(&3) {
            self.fairness_priority(run).await?;
        }
        if parts.contains(&4) {
            self.fairness_keys(run).await?;
        }
        Ok(())
    }

    /// Part 1: steady and the idle database among 10 biz types, then among
    /// `--fairness-biz-types`.
    async fn fairness_idle_biz_types(&mut self, run: u32) -> anyhow::Result<()> {
        let nodes = self.nodes.len() as u32;
        let few_biz = self.new_biz_type(&format!("fairness-few-{nodes}n-{run}")).await?;
        let many_biz = self.new_biz_type(&format!("fairness-many-{nodes}n-{run}")).await?;
        let prefix = format!("bench-idle-{nodes}n-{run}-");
        let url = self.callback_url();

        let before = biz_load::delivering(&self.pool).await?;
        let mut made = biz_load::create_idle(&self.pool, &prefix, 0, (FEW - before).max(0) as u64, &url).await?;
        let few_count = biz_load::delivering(&self.pool).await?;
        if few_count > FEW {
            eprintln!("bench: fairness: {few_count} biz types deliver already (earlier scenarios' among them), more than the {FEW} to compare with");
        }
        tokio::time::sleep(REREAD).await;
        let few = self.idle_then_steady(&few_biz, few_count).await?;

        let many = self.args.fairness_biz_types as i64;
        let started = Instant::now();
        made += biz_load::create_idle(&self.pool, &prefix, made, (many - few_count).max(0) as u64, &url).await?;
        let creating_s = started.elapsed().as_secs_f64();
        let many_count = biz_load::delivering(&self.pool).await?;
        eprintln!("bench: fairness: {made} idle biz types created ({creating_s:.1} s for the last ones); {many_count} deliver");
        tokio::time::sleep(REREAD).await;
        let crowded = self.idle_then_steady(&many_biz, many_count).await?;

        biz_load::delete_idle(&self.pool, &prefix).await?;
        for biz in [&few_biz, &many_biz] {
            biz_types::archive(&self.pool, &biz.name, "chime-bench").await?;
        }

        let rate = self.args.steady_rate;
        let r = &mut self.report;
        let s = SCENARIO;
        let (few_label, many_label) = (format!("{FEW} biz types"), format!("{many} biz types"));
        for (label, m) in [(&few_label, &few), (&many_label, &crowded)] {
            r.add(s, nodes, &format!("{label}: biz types delivering"), "biz types", m.biz_types as f64, None);
            let idle = self.args.fairness_idle_secs;
            r.add(s, nodes, &format!("{label}: database transactions at idle ({idle} s)"), "xact/s", m.xacts_per_s, None);
            r.add(s, nodes, &format!("{label}: nodes' CPU at idle"), "% of a core", m.cpu_pct, None);
            r.add(s, nodes, &format!("{label}: steady {rate}/s lateness p50"), "ms", percentile(&m.lateness, 0.50), None);
            r.add(s, nodes, &format!("{label}: steady {rate}/s lateness p99"), "ms", percentile(&m.lateness, 0.99), None);
            r.add(s, nodes, &format!("{label}: steady {rate}/s lateness max"), "ms", percentile(&m.lateness, 1.0), None);
        }
        r.add(s, nodes, &format!("{many_label}: idle biz types created, one statement"), "s", creating_s, None);
        let p99 = |m: &Crowd| percentile(&m.lateness, 0.99);
        r.add(s, nodes, &format!("steady p99 with {many} biz types / with {FEW}"), "×", p99(&crowded) / p99(&few), Some(Target::AtMost(1.5)));
        r.add(
            s,
            nodes,
            &format!("idle transactions/s with {many} biz types / with {FEW}"),
            "×",
            crowded.xacts_per_s / few.xacts_per_s,
            Some(Target::AtMost(2.0)),
        );
        let per = |label: &str| format!("fairness, steady among {label}, {nodes} node{}", plural(nodes));
        r.lateness_series(&per(&few_label), few.lateness);
        r.lateness_series(&per(&many_label), crowded.lateness);
        Ok(())
    }

    /// The database's transactions a second and the nodes' CPU over `--fairness-idle-secs`
    /// with nothing due, then steady's lateness for `biz`.
    async fn idle_then_steady(&self, biz: &Biz, biz_types: i64) -> anyhow::Result<Crowd> {
        let window = Duration::from_secs(u64::from(self.args.fairness_idle_secs));
        let pids = self.nodes.pids();
        let (xacts_before, cpu_before, started) = (xacts(&self.pool).await?, memory::total_cpu_secs(&pids), Instant::now());
        tokio::time::sleep(window).await;
        let (xacts_after, cpu_after) = (xacts(&self.pool).await?, memory::total_cpu_secs(&pids));
        let elapsed = started.elapsed().as_secs_f64();
        // Less the bench's own read that opened the window (the one closing it is counted
        // only in the next).
        let xacts_per_s = (xacts_after - xacts_before - 1).max(0) as f64 / elapsed;
        let cpu_pct = 100.0 * (cpu_after - cpu_before) / elapsed;

        let start = Utc::now() + self.steady_lead();
        let total = self.create_steady(biz, start).await?;
        let (arrivals, _) = self.wait_delivered(biz, total, Duration::from_secs(u64::from(self.args.steady_secs) + 60)).await?;
        Ok(Crowd { biz_types, xacts_per_s, cpu_pct, lateness: first_lateness_ms(&arrivals) })
    }

    /// Part 2: steady for B alone, then for another B beside biz type A's herd, all due at
    /// one instant a moment after B's first task.
    async fn fairness_herd(&mut self, run: u32) -> anyhow::Result<()> {
        let nodes = self.nodes.len() as u32;
        let herd = self.args.fairness_herd;
        let steady_limit = Duration::from_secs(u64::from(self.args.steady_secs) + 60 + herd / 1000);

        let alone = self.new_biz_type(&format!("fairness-b-alone-{nodes}n-{run}")).await?;
        let start = Utc::now() + self.steady_lead();
        let total = self.create_steady(&alone, start).await?;
        let (arrivals, _) = self.wait_delivered(&alone, total, steady_limit).await?;
        let alone_lateness = first_lateness_ms(&arrivals);

        let beside = self.new_biz_type(&format!("fairness-b-beside-{nodes}n-{run}")).await?;
        let a = self.new_biz_type(&format!("fairness-herd-{nodes}n-{run}")).await?;
        // The herd falls due a second into B's steady (a quarter of it, if that is shorter).
        let offset = TimeDelta::milliseconds((i64::from(self.args.steady_secs) * 250).min(1000));
        // Time to write the herd (10,000 rows a second at worst, on a busy machine), then to
        // create B's tasks before the first is due.
        let write_lead = TimeDelta::milliseconds(2000 + herd as i64 / 10);
        let herd_due = Utc::now() + write_lead + self.steady_lead() + offset;
        let writing = Instant::now();
        let part = crate::scale::Part { what: "herd", count: herd, from: herd_due, to: herd_due, finished: false, cold: false, flow_key: None };
        crate::scale::write(&self.pool, a.id, &self.payload(0), vec![part], "fairness herd").await?;
        let writing_s = writing.elapsed().as_secs_f64();
        let start = herd_due - offset;
        if Utc::now() + self.steady_lead() > start {
            bail!(
                "writing a herd of {herd} tasks took {writing_s:.1} s, longer than the {} ms allowed; use a smaller --fairness-herd",
                write_lead.num_milliseconds()
            );
        }
        let total = self.create_steady(&beside, start).await?;
        let (b_arrivals, _) = self.wait_delivered(&beside, total, steady_limit).await?;
        let (herd_arrivals, herd_recorded) = self.wait_delivered(&a, herd as usize, steady_limit).await?;

        let beside_lateness = first_lateness_ms(&b_arrivals);
        let herd_first = herd_arrivals.iter().map(|a| a.at).min().expect("the herd has tasks");
        let herd_last = herd_arrivals.iter().map(|a| a.at).max().expect("the herd has tasks");
        // B's tasks due while the herd was being delivered: where its lateness comes from.
        let during = first_lateness_ms(&due_within(&b_arrivals, herd_due, herd_last));

        for biz in [&alone, &beside, &a] {
            biz_types::archive(&self.pool, &biz.name, "chime-bench").await?;
        }

        let rate = self.args.steady_rate;
        let r = &mut self.report;
        let s = SCENARIO;
        let beside_label = format!("B beside a herd of {herd}");
        for (label, lateness) in [("B alone", &alone_lateness), (beside_label.as_str(), &beside_lateness)] {
            r.add(s, nodes, &format!("{label}: steady {rate}/s lateness p50"), "ms", percentile(lateness, 0.50), None);
            r.add(s, nodes, &format!("{label}: steady {rate}/s lateness p99"), "ms", percentile(lateness, 0.99), None);
            r.add(s, nodes, &format!("{label}: steady {rate}/s lateness max"), "ms", percentile(lateness, 1.0), None);
        }
        r.add(s, nodes, "B beside the herd: p99 of its tasks due while the herd was delivered", "ms", percentile(&during, 0.99), None);
        r.add(s, nodes, &format!("herd of {herd} due at one instant: written, one statement"), "s", writing_s, None);
        r.add(s, nodes, "herd: first callback after due", "ms", ms(herd_first - herd_due), None);
        r.add(s, nodes, "herd: last callback after due", "s", secs(herd_last - herd_due), None);
        r.add(s, nodes, "herd: delivery rate (due to last success recorded)", "tasks/s", herd as f64 / secs(herd_recorded - herd_due), None);
        let ratio = percentile(&beside_lateness, 0.99) / percentile(&alone_lateness, 0.99);
        r.add(s, nodes, &format!("B's steady p99 beside a herd of {herd} / alone"), "×", ratio, Some(Target::AtMost(1.5)));
        let per = |label: &str| format!("fairness, {label}, {nodes} node{}", plural(nodes));
        r.lateness_series(&per("B alone"), alone_lateness);
        r.lateness_series(&per("B beside the herd"), beside_lateness);
        r.burst_series(&per(&format!("herd of {herd}")), herd_due, &herd_arrivals);
        r.herd_timeline(&per(&format!("B beside a herd of {herd}")), start, herd_due, &herd_arrivals, &b_arrivals);
        Ok(())
    }

    /// Part 3: priority. A queue of `--fairness-herd` due tasks, delivered at `QUEUE_RATE` a
    /// second; `URGENT` tasks of priority 9 created beside it, due now.
    async fn fairness_priority(&mut self, run: u32) -> anyhow::Result<()> {
        let Some(receiver) = &self.receiver else {
            eprintln!("bench: fairness: the priority part needs the bench's own receiver (no --receiver-url); skipped");
            return Ok(());
        };
        let log = receiver.log.clone();
        let nodes = self.nodes.len() as u32;
        let queued = self.args.fairness_herd;
        let settings = Settings { rate_limit: Some(QUEUE_RATE), ..Settings::default() };
        let biz = self.new_biz_type_with(&format!("fairness-priority-{nodes}n-{run}"), settings).await?;
        let now = Utc::now();
        let part = crate::scale::Part { what: "queue", count: queued, from: now, to: now, finished: false, cold: false, flow_key: None };
        crate::scale::write(&self.pool, biz.id, &self.payload(0), vec![part], "fairness priority queue").await?;
        // The queue is flowing once its first callbacks have come.
        let flowing = Instant::now();
        while log.distinct(&biz.name) < 10 {
            if flowing.elapsed() > Duration::from_secs(30) {
                bail!("{}: the queue's first callbacks did not come within 30 s", biz.name);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let mut urgent = HashSet::new();
        for i in 0..URGENT {
            let reply = self
                .client
                .post(format!("{}/api/v1/tasks", self.nodes.base(i)))
                .bearer_auth(&biz.token)
                .json(&json!({"biz_type": biz.name, "priority": 9, "payload": {"urgent": i}}))
                .send()
                .await?;
            if reply.status() != reqwest::StatusCode::CREATED {
                bail!("create answered {}: {}", reply.status(), reply.text().await.unwrap_or_default());
            }
            let task: serde_json::Value = reply.json().await?;
            urgent.insert(task["id"].as_str().context("a task id")?.parse::<Uuid>()?);
            tokio::time::sleep(URGENT_GAP).await;
        }
        let ids: Vec<Uuid> = urgent.iter().copied().collect();
        let waiting = Instant::now();
        while log.undelivered(&ids) > 0 {
            if waiting.elapsed() > Duration::from_secs(30) {
                bail!("{}: {} of {URGENT} urgent tasks not delivered within 30 s", biz.name, log.undelivered(&ids));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let still_queued = queued.saturating_sub((log.distinct(&biz.name) - URGENT) as u64);
        let arrivals: Vec<Arrival> = log.arrivals(&biz.name).into_iter().filter(|a| urgent.contains(&a.task_id)).collect();
        let lateness = first_lateness_ms(&arrivals);
        // Cancels what is left of the queue.
        biz_types::archive(&self.pool, &biz.name, "chime-bench").await?;

        let r = &mut self.report;
        let s = SCENARIO;
        let label = format!("priority 9 beside {queued} queued at {QUEUE_RATE}/s");
        r.add(s, nodes, &format!("{label}: still queued when the last urgent one came"), "tasks", still_queued as f64, None);
        r.add(s, nodes, &format!("{label}: lateness p50"), "ms", percentile(&lateness, 0.50), None);
        r.add(s, nodes, &format!("{label}: lateness max"), "ms", percentile(&lateness, 1.0), Some(Target::AtMost(50.0)));
        Ok(())
    }

    /// Part 4: flow keys. Steady over `KEYS` keys alone, then beside a hot key's herd; then
    /// a burst over `KEYS` keys against the same without flow keys.
    async fn fairness_keys(&mut self, run: u32) -> anyhow::Result<()> {
        let nodes = self.nodes.len() as u32;
        let herd = self.args.fairness_herd;
        let limit = Duration::from_secs(u64::from(self.args.steady_secs) + 60 + herd / 500);
        let settings = Settings { flow_max_in_flight: Some(HOT_CAP), ..Settings::default() };

        let alone = self.new_biz_type_with(&format!("fairness-keys-alone-{nodes}n-{run}"), settings.clone()).await?;
        let start = Utc::now() + self.steady_lead();
        let total = self.create_steady_over(&alone, start, KEYS).await?;
        let (arrivals, _) = self.wait_delivered(&alone, total, limit).await?;
        let alone_lateness = first_lateness_ms(&arrivals);

        // The hot key's herd, in the same biz type as the steady keys beside it, due a
        // second into steady (a quarter of it if shorter), half a millisecond off any
        // steady task's time so that its arrivals are told apart by due time.
        let beside = self.new_biz_type_with(&format!("fairness-keys-beside-{nodes}n-{run}"), settings.clone()).await?;
        let offset = TimeDelta::milliseconds((i64::from(self.args.steady_secs) * 250).min(1000)) + TimeDelta::microseconds(500);
        let write_lead = TimeDelta::milliseconds(2000 + herd as i64 / 10);
        // In whole microseconds, as stored, to be compared with what the callbacks say.
        let herd_due = (Utc::now() + write_lead + self.steady_lead() + offset).trunc_subsecs(6);
        let part =
            crate::scale::Part { what: "hot key", count: herd, from: herd_due, to: herd_due, finished: false, cold: false, flow_key: Some("hot") };
        crate::scale::write(&self.pool, beside.id, &self.payload(0), vec![part], "fairness hot key").await?;
        let start = herd_due - offset;
        if Utc::now() + self.steady_lead() > start {
            bail!("writing the hot key's {herd} tasks took longer than allowed; use a smaller --fairness-herd");
        }
        let sampler = {
            let (pool, biz_type_id) = (self.pool.clone(), beside.id);
            tokio::spawn(async move {
                let mut peak = 0_i64;
                loop {
                    let running: i64 =
                        db::query_scalar("SELECT count(*) FROM tasks WHERE biz_type_id = $1 AND flow_key = 'hot' AND status = 'running'")
                            .bind(biz_type_id)
                            .fetch_one(&pool)
                            .await
                            .unwrap_or(0);
                    peak = peak.max(running);
                    let left: i64 = db::query_scalar(
                        "SELECT count(*) FROM tasks WHERE biz_type_id = $1 AND flow_key = 'hot' AND status IN ('pending', 'running')",
                    )
                    .bind(biz_type_id)
                    .fetch_one(&pool)
                    .await
                    .unwrap_or(1);
                    if left == 0 && Utc::now() > herd_due {
                        return peak;
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            })
        };
        let steady_total = self.create_steady_over(&beside, start, KEYS).await?;
        let (arrivals, _) = self.wait_delivered(&beside, steady_total + herd as usize, limit).await?;
        let peak = sampler.await?;
        let (hot, steady): (Vec<Arrival>, Vec<Arrival>) = arrivals.into_iter().partition(|a| a.run_at == herd_due);
        let beside_lateness = first_lateness_ms(&steady);
        let hot_last = hot.iter().map(|a| a.at).max().context("the hot key has tasks")?;

        // The overhead: one burst over KEYS keys, one without flow keys.
        let mut rates = Vec::new();
        // The plain one in a biz type without per-key limits, claimed as every other is.
        for (label, flow_keys) in [("plain", 0), ("keyed", KEYS)] {
            let with = if flow_keys == 0 { Settings::default() } else { settings.clone() };
            let biz = self.new_biz_type_with(&format!("fairness-keys-burst-{label}-{nodes}n-{run}"), with).await?;
            let due = Utc::now() + TimeDelta::milliseconds(2000 + herd as i64 / 10);
            self.create_batches(&biz, &vec![due; herd as usize], false, flow_keys).await?;
            let (_, recorded) = self.wait_delivered(&biz, herd as usize, limit).await?;
            rates.push(herd as f64 / secs(recorded - due).max(1e-3));
            biz_types::archive(&self.pool, &biz.name, "chime-bench").await?;
        }
        for biz in [&alone, &beside] {
            biz_types::archive(&self.pool, &biz.name, "chime-bench").await?;
        }

        let rate = self.args.steady_rate;
        let r = &mut self.report;
        let s = SCENARIO;
        let beside_label = format!("steady over {KEYS} keys beside a hot key of {herd}");
        for (label, lateness) in [(format!("steady over {KEYS} keys alone"), &alone_lateness), (beside_label.clone(), &beside_lateness)] {
            r.add(s, nodes, &format!("{label}: {rate}/s lateness p50"), "ms", percentile(lateness, 0.50), None);
            r.add(s, nodes, &format!("{label}: {rate}/s lateness p99"), "ms", percentile(lateness, 0.99), None);
        }
        let ratio = percentile(&beside_lateness, 0.99) / percentile(&alone_lateness, 0.99);
        r.add(s, nodes, &format!("{beside_label}: p99 / alone"), "×", ratio, Some(Target::AtMost(2.0)));
        r.add(
            s,
            nodes,
            &format!("hot key (flow_max_in_flight {HOT_CAP}): most running at once"),
            "tasks",
            peak as f64,
            Some(Target::AtMost(f64::from(HOT_CAP))),
        );
        r.add(s, nodes, "hot key: last callback after due", "s", secs(hot_last - herd_due), None);
        r.add(s, nodes, &format!("burst of {herd}, no flow keys"), "tasks/s", rates[0], None);
        r.add(s, nodes, &format!("burst of {herd} over {KEYS} flow keys"), "tasks/s", rates[1], None);
        r.add(s, nodes, &format!("burst over {KEYS} flow keys / without"), "×", rates[1] / rates[0], Some(Target::AtLeast(0.7)));
        Ok(())
    }
}

/// The database's transactions so far, committed and rolled back: every node's, the
/// leader's and this bench's.
///
/// From `pg_stat_database`, as issue 34's figures were taken. Since PostgreSQL 15 a session
/// adds its counts to the shared statistics when it goes idle, at most once a second, and a
/// session that goes idle within a second of its last flush holds them up to 10 s
/// (PGSTAT_IDLE_INTERVAL): a transaction is counted up to 10 s late, a busy session's about
/// a second late. Over a window of 20 s the lag at either end is a small part of what it
/// counts, and it is the same window with few and with many biz types. (No exact counter
/// of transactions is to be had: pg_stat_statements counts statements as they end, but it
/// must be preloaded, a restart of a database the bench may not own.)
async fn xacts(pool: &Pool) -> anyhow::Result<i64> {
    Ok(db::query_scalar("SELECT (xact_commit + xact_rollback)::int8 FROM pg_stat_database WHERE datname = current_database()")
        .fetch_one(pool)
        .await?)
}

/// The arrivals of tasks due in [from, until].
fn due_within(arrivals: &[Arrival], from: DateTime<Utc>, until: DateTime<Utc>) -> Vec<Arrival> {
    arrivals.iter().filter(|a| a.run_at >= from && a.run_at <= until).copied().collect()
}
