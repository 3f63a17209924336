//! The `timers` scenario (issue 21, target 4): many cron timers beside the steady load.
//!
//! 1. steady alone, for comparison;
//! 2. `--timers` × 4/5 timers firing every minute (second `i % 60`, so that each second
//!    has its share) in several time zones, created through `POST /api/v1/timers` by 64
//!    clients at once (the API has no batch create for timers; a direct load would skip
//!    what the leader sees in production: timers arriving while it writes);
//! 3. waits until the leader has written every timer's occurrences ahead: the catch-up time;
//! 4. the other fifth: daily timers, each at a wall-clock time of its zone that falls
//!    within the measured window (so that the daily ones fire during the run, and zones
//!    with half-hour offsets are exercised), and waits for them to be written too;
//! 5. for `--timers-secs`: steady again beside the timers, while the nodes' memory is read
//!    every 100 ms and how far ahead the timers are written every second;
//! 6. then: every fire time in the window delivered (missed ones counted), its lateness at
//!    this bench's receiver, the occurrences written per second and the leader's time per
//!    tick (`chime_timer_materialize_seconds` read from the nodes' `/metrics`).
//!
//! The window the leader writes ahead is the nodes' `CHIME_TIMER_WINDOW_SECS` (600 s by
//! default), read here from the same environment. With the default, a run of a few minutes
//! sees only the first writing of each timer; `CHIME_TIMER_WINDOW_SECS=120` makes the leader
//! refill every timer each minute within the run: 100k every-minute timers then cost it
//! ~1,700 occurrences a second, as many as fire.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use chime::db::Pool;
use chime::tasks::load;
use chime::timers::{self, Schedule};
use chrono::{DateTime, TimeDelta, Utc};

use super::{Bench, Biz, percentile};
use crate::memory;
use crate::report::Target;

/// Zones the timers are spread over: whole and half-hour offsets, both hemispheres.
const ZONES: [&str; 6] = ["UTC", "America/New_York", "Europe/Berlin", "Asia/Shanghai", "Asia/Kolkata", "Australia/Adelaide"];
/// Concurrent clients creating timers.
const CLIENTS: usize = 64;

/// One timer as created: enough to know when it should fire.
struct Made {
    cron: String,
    zone: &'static str,
}

impl Bench {
    pub(super) async fn timers(&mut self, run: u32) -> anyhow::Result<()> {
        if self.receiver.is_none() {
            bail!("the timers scenario measures lateness at the bench's own receiver: leave out --receiver-url");
        }
        let nodes = self.nodes.len() as u32;
        let window = timer_window()?;
        self.steady(run, "timers steady alone").await?;

        let pids = self.nodes.pids();
        let at_rest = memory::max_rss_mib(&pids);
        let memory = memory::Sampler::start(pids.clone());
        let biz = self.new_biz_type(&format!("timers-{nodes}n-{run}")).await?;
        let total = self.args.timers as usize;
        let daily = total / 5;
        let minutely: Vec<Made> = (0..total - daily).map(|i| Made { cron: format!("{} * * * * *", i % 60), zone: ZONES[i % ZONES.len()] }).collect();
        let started = Instant::now();
        self.create_timers(&biz, &minutely, 0).await?;
        let mut creating = started.elapsed();
        let created = Instant::now();
        let caught_up = wait_written_ahead(&self.pool, &biz, window, Duration::from_secs(600)).await?;
        let catch_up_s = caught_up.duration_since(created).as_secs_f64();

        // The daily timers fire over the measured window, which starts once they are written.
        let secs = i64::from(self.args.timers_secs);
        // Time to create the daily timers (at 1,000 a second at worst) and have them written.
        let lead = TimeDelta::seconds(15 + daily as i64 / 1000);
        let from = Utc::now() + lead;
        let until = from + TimeDelta::seconds(secs);
        let first_daily = from + TimeDelta::seconds(5);
        let spread_ms = (secs - 10).max(1) * 1000;
        let dailies: Vec<Made> = (0..daily)
            .map(|i| {
                let zone = ZONES[i % ZONES.len()];
                let at = first_daily + TimeDelta::milliseconds(spread_ms * i as i64 / daily.max(1) as i64);
                Made { cron: daily_cron(at, zone), zone }
            })
            .collect();
        let again = Instant::now();
        self.create_timers(&biz, &dailies, total - daily).await?;
        creating += again.elapsed();
        if Utc::now() > from {
            bail!("creating {daily} daily timers took longer than the {} s allowed; use fewer --timers", lead.num_seconds());
        }
        // From here on, a timer due for writing is the leader falling behind, not one just created.
        let limit = (from - Utc::now()).to_std().unwrap_or_default();
        wait_written_ahead(&self.pool, &biz, window, limit).await?;
        let metrics_before = self.scrape_metrics().await?;
        let lag = LagSampler::start(self.pool.clone(), biz.id, window);
        let measuring = Instant::now();
        self.steady(run, "timers steady beside").await?;
        let left = (until - Utc::now()).to_std().unwrap_or_default();
        tokio::time::sleep(left + Duration::from_secs(3)).await;
        let metrics_after = self.scrape_metrics().await?;
        let measured_s = measuring.elapsed().as_secs_f64();
        let (most_behind, least_ahead) = lag.stop().await;
        let peak = memory.peak().await;
        let at_end = memory::max_rss_mib(&pids);

        // Every fire time in [from, until) ought to have arrived; the last ones may still be
        // on their way, so a second more is given to them.
        let made: Vec<&Made> = minutely.iter().chain(&dailies).collect();
        let expected = expected_fires(&made, from, until)?;
        let deadline = Instant::now() + Duration::from_secs(30);
        let in_window = |arrivals: &[crate::receiver::Arrival]| -> Vec<crate::receiver::Arrival> {
            arrivals.iter().filter(|a| a.run_at >= from && a.run_at < until).copied().collect()
        };
        let mut arrived = in_window(&self.receiver.as_ref().expect("checked above").log.arrivals(&biz.name));
        while distinct_tasks(&arrived) < expected && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(500)).await;
            arrived = in_window(&self.receiver.as_ref().expect("checked above").log.arrivals(&biz.name));
        }
        let delivered = distinct_tasks(&arrived);
        let lateness = super::first_lateness_ms(&arrived);

        let r = &mut self.report;
        let s = "timers";
        r.add(
            s,
            nodes,
            &format!("{total} timers ({} every minute, {daily} daily, {} zones): created", total - daily, ZONES.len()),
            "timers/s",
            total as f64 / creating.as_secs_f64(),
            None,
        );
        r.add(s, nodes, "every-minute timers all written ahead, after the last create", "s", catch_up_s, None);
        r.add(s, nodes, &format!("occurrences due in {secs} s"), "tasks", expected as f64, None);
        r.add(s, nodes, "occurrences missed", "tasks", expected.saturating_sub(delivered) as f64, Some(Target::AtMost(0.0)));
        r.add(s, nodes, "occurrence lateness p50", "ms", percentile(&lateness, 0.50), Some(Target::AtMost(5.0)));
        r.add(s, nodes, "occurrence lateness p99", "ms", percentile(&lateness, 0.99), Some(Target::AtMost(20.0)));
        r.add(s, nodes, "occurrence lateness max", "ms", percentile(&lateness, 1.0), None);
        let occurrences = metrics_after.occurrences - metrics_before.occurrences;
        r.add(s, nodes, &format!("occurrences written (window {} s)", window.as_secs()), "tasks/s", occurrences / measured_s, None);
        let ticks = metrics_after.ticks - metrics_before.ticks;
        let mean_ms = 1000.0 * (metrics_after.tick_seconds - metrics_before.tick_seconds) / ticks.max(1.0);
        r.add(s, nodes, "leader's timer writing per tick: mean", "ms", mean_ms, None);
        let p99 = metrics_after.tick_quantile(&metrics_before, 0.99).map_or(f64::NAN, |b| b * 1000.0);
        r.add(s, nodes, "leader's timer writing per tick: p99 (histogram bound)", "ms", p99, None);
        r.add(s, nodes, "timers due for writing, at worst", "timers", most_behind as f64, None);
        r.add(s, nodes, "occurrences written ahead, at least", "s", least_ahead.unwrap_or(f64::NAN), Some(Target::AtLeast(0.0)));
        if let (Some(alone), Some(beside)) =
            (r.median_of("timers steady alone", nodes, "lateness p99"), r.median_of("timers steady beside", nodes, "lateness p99"))
        {
            // Issue 34's bound for a steady biz type beside 100,000 cron timers: 1.5×.
            r.add(s, nodes, "steady lateness p99 beside the timers, % of alone", "%", 100.0 * beside / alone, Some(Target::AtMost(150.0)));
        }
        let mib = |v: Option<f64>| v.unwrap_or(f64::NAN);
        r.add(s, nodes, "node RSS at rest", "MiB", mib(at_rest), None);
        r.add(s, nodes, &format!("node RSS peak with {total} timers (sampled every 100 ms)"), "MiB", mib(peak), None);
        r.add(s, nodes, &format!("node RSS at the end with {total} timers"), "MiB", mib(at_end), None);

        timers::delete_all(&self.pool, biz.id).await?;
        load::delete_all(&self.pool, biz.id).await?;
        if delivered < expected {
            bail!(
                "{} of {expected} timer occurrences due in the measured window were not delivered (the figures above say how far behind the leader was; the node logs say why)",
                expected - delivered
            );
        }
        Ok(())
    }

    /// Creates timers through the API, `CLIENTS` requests at a time spread over the nodes;
    /// their keys are numbered from `first`.
    async fn create_timers(&self, biz: &Biz, made: &[Made], first: usize) -> anyhow::Result<()> {
        let bodies: Arc<Vec<String>> = Arc::new(
            made.iter()
                .enumerate()
                .map(|(i, m)| {
                    let n = first + i;
                    format!(
                        r#"{{"biz_type":"{}","key":"timer-{n}","cron":"{}","timezone":"{}","payload":{{"timer":{n}}}}}"#,
                        biz.name, m.cron, m.zone
                    )
                })
                .collect(),
        );
        let next = Arc::new(AtomicUsize::new(0));
        let mut workers = tokio::task::JoinSet::new();
        for c in 0..CLIENTS {
            let (client, bodies, next, token) = (self.client.clone(), bodies.clone(), next.clone(), biz.token.clone());
            let url = format!("{}/api/v1/timers", self.nodes.base(c));
            workers.spawn(async move {
                loop {
                    let Some(body) = bodies.get(next.fetch_add(1, Ordering::Relaxed)) else { return anyhow::Ok(()) };
                    let reply = client.post(&url).bearer_auth(&token).body(body.clone()).send().await?;
                    if reply.status() != reqwest::StatusCode::CREATED {
                        bail!("timer create answered {}: {}", reply.status(), reply.text().await.unwrap_or_default());
                    }
                }
            });
        }
        while let Some(done) = workers.join_next().await {
            done??;
        }
        Ok(())
    }

    /// The leader's timer counters, summed over the nodes (only the leader's move).
    async fn scrape_metrics(&self) -> anyhow::Result<TimerMetrics> {
        let mut sum = TimerMetrics::default();
        for node in self.nodes.iter() {
            let text = self.client.get(format!("{}/metrics", node.base)).send().await?.text().await?;
            sum.add(&TimerMetrics::parse(&text));
        }
        Ok(sum)
    }
}

/// `CHIME_TIMER_WINDOW_SECS` as the nodes read it.
fn timer_window() -> anyhow::Result<Duration> {
    let secs = match std::env::var("CHIME_TIMER_WINDOW_SECS") {
        Ok(v) => v.parse().with_context(|| format!("CHIME_TIMER_WINDOW_SECS={v} is not a number of seconds"))?,
        Err(_) => 600,
    };
    Ok(Duration::from_secs(secs))
}

/// A daily cron expression firing at `at`'s wall-clock second in `zone`.
fn daily_cron(at: DateTime<Utc>, zone: &str) -> String {
    let tz: chrono_tz::Tz = zone.parse().expect("a zone of ZONES");
    let local = at.with_timezone(&tz);
    use chrono::Timelike;
    format!("{} {} {} * * *", local.second(), local.minute(), local.hour())
}

/// How many fire times the timers have in [from, until).
fn expected_fires(made: &[&Made], from: DateTime<Utc>, until: DateTime<Utc>) -> anyhow::Result<usize> {
    let mut n = 0;
    for m in made {
        let schedule = Schedule::parse(&m.cron, m.zone).map_err(|e| anyhow::anyhow!("{e}"))?;
        // `between` takes (after, until]: the same set as [from, until) at whole seconds.
        n += schedule.between(from - TimeDelta::milliseconds(1), until - TimeDelta::milliseconds(1), 100_000).len();
    }
    Ok(n)
}

fn distinct_tasks(arrivals: &[crate::receiver::Arrival]) -> usize {
    arrivals.iter().map(|a| a.task_id).collect::<HashSet<_>>().len()
}

/// Waits until every timer of `biz` has its occurrences written at least a second ahead
/// (a timer not written yet reaches only to its creation); returns when.
async fn wait_written_ahead(pool: &Pool, biz: &Biz, window: Duration, limit: Duration) -> anyhow::Result<Instant> {
    let deadline = Instant::now() + limit;
    loop {
        let (behind, ahead) = timers::lag(pool, biz.id, window).await?;
        if ahead.is_some_and(|a| a >= 1.0) {
            return Ok(Instant::now());
        }
        if Instant::now() > deadline {
            bail!("{behind} timers still not written ahead after {limit:?}: the leader falls behind (see the node logs)");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Reads every second how many timers are due for writing and how far ahead the least
/// written one reaches.
struct LagSampler {
    stop: Arc<std::sync::atomic::AtomicBool>,
    task: tokio::task::JoinHandle<(i64, Option<f64>)>,
}

impl LagSampler {
    fn start(pool: Pool, biz_type_id: i32, window: Duration) -> LagSampler {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let task = tokio::spawn(async move {
            let (mut most_behind, mut least_ahead) = (0i64, None::<f64>);
            while !flag.load(Ordering::Relaxed) {
                if let Ok((behind, ahead)) = timers::lag(&pool, biz_type_id, window).await {
                    most_behind = most_behind.max(behind);
                    if let Some(a) = ahead {
                        least_ahead = Some(least_ahead.map_or(a, |l: f64| l.min(a)));
                    }
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            (most_behind, least_ahead)
        });
        LagSampler { stop, task }
    }

    async fn stop(self) -> (i64, Option<f64>) {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.unwrap_or((0, None))
    }
}

/// The leader's timer figures from a node's `/metrics`.
#[derive(Debug, Default, Clone)]
struct TimerMetrics {
    occurrences: f64,
    ticks: f64,
    tick_seconds: f64,
    /// `chime_timer_materialize_seconds_bucket`: (upper bound, cumulative count).
    buckets: Vec<(f64, f64)>,
}

impl TimerMetrics {
    fn parse(text: &str) -> TimerMetrics {
        let mut m = TimerMetrics::default();
        for line in text.lines() {
            let Some((name, value)) = line.rsplit_once(' ') else { continue };
            let Ok(value) = value.parse::<f64>() else { continue };
            match name {
                "chime_timer_occurrences_total" => m.occurrences = value,
                "chime_timer_materialize_seconds_count" => m.ticks = value,
                "chime_timer_materialize_seconds_sum" => m.tick_seconds = value,
                _ => {
                    if let Some(le) = name.strip_prefix("chime_timer_materialize_seconds_bucket{le=\"").and_then(|r| r.strip_suffix("\"}")) {
                        let bound = if le == "+Inf" { f64::INFINITY } else { le.parse().unwrap_or(f64::NAN) };
                        m.buckets.push((bound, value));
                    }
                }
            }
        }
        m
    }

    fn add(&mut self, other: &TimerMetrics) {
        self.occurrences += other.occurrences;
        self.ticks += other.ticks;
        self.tick_seconds += other.tick_seconds;
        for &(bound, count) in &other.buckets {
            match self.buckets.iter_mut().find(|b| b.0 == bound) {
                Some(b) => b.1 += count,
                None => self.buckets.push((bound, count)),
            }
        }
    }

    /// The upper bound of the bucket holding quantile `q` of the ticks since `before`.
    fn tick_quantile(&self, before: &TimerMetrics, q: f64) -> Option<f64> {
        let ticks = self.ticks - before.ticks;
        if ticks <= 0.0 {
            return None;
        }
        self.buckets.iter().find_map(|&(bound, count)| {
            let earlier = before.buckets.iter().find(|b| b.0 == bound).map_or(0.0, |b| b.1);
            (count - earlier >= q * ticks).then_some(bound)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timer_metrics_are_read_from_the_exposition() {
        let before = TimerMetrics::parse(
            "chime_timer_occurrences_total 10\n\
             chime_timer_materialize_seconds_sum 0.5\nchime_timer_materialize_seconds_count 10\n\
             chime_timer_materialize_seconds_bucket{le=\"0.01\"} 10\nchime_timer_materialize_seconds_bucket{le=\"0.1\"} 10\n\
             chime_timer_materialize_seconds_bucket{le=\"+Inf\"} 10\n",
        );
        let after = TimerMetrics::parse(
            "chime_timer_occurrences_total 1010\n\
             chime_timer_materialize_seconds_sum 2.5\nchime_timer_materialize_seconds_count 110\n\
             chime_timer_materialize_seconds_bucket{le=\"0.01\"} 90\nchime_timer_materialize_seconds_bucket{le=\"0.1\"} 110\n\
             chime_timer_materialize_seconds_bucket{le=\"+Inf\"} 110\n",
        );
        assert_eq!(after.occurrences - before.occurrences, 1000.0);
        assert_eq!(after.tick_quantile(&before, 0.5), Some(0.01));
        assert_eq!(after.tick_quantile(&before, 0.99), Some(0.1));
        assert_eq!(before.tick_quantile(&before, 0.99), None);
    }

    #[test]
    fn a_daily_cron_fires_at_the_wall_clock_time_of_its_zone() {
        let at: DateTime<Utc> = "2026-11-25T01:02:03Z".parse().unwrap();
        assert_eq!(daily_cron(at, "UTC"), "3 2 1 * * *");
        assert_eq!(daily_cron(at, "Asia/Kolkata"), "3 32 6 * * *");
        let made = Made { cron: daily_cron(at, "Australia/Adelaide"), zone: "Australia/Adelaide" };
        assert_eq!(expected_fires(&[&made], at, at + TimeDelta::seconds(1)).unwrap(), 1);
        assert_eq!(expected_fires(&[&made], at + TimeDelta::seconds(1), at + TimeDelta::hours(23)).unwrap(), 0);
    }
}
