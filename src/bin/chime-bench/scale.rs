//! The `scale` scenario's load (issue 21, flat cost with size): the table as months of use
//! leave it, written straight into PostgreSQL, before burst and steady run again on it.
//!
//! - `--scale-pending` tasks pending, due evenly from an hour ahead to a year ahead: those
//!   due before the hot horizon in `tasks`' partitions, the rest (nearly all) in
//!   `tasks_cold`, where the layout puts them (`tasks::placement`).
//! - `--scale-days` daily partitions of the past days, each holding `--scale-finished`
//!   succeeded tasks: the partitions the leader's `partitions::ensure` made on each of those
//!   days and retention keeps (30 days by default), so that every claim and every record
//!   finds as many partitions as a node that has run for a month.
//!
//! Rows go in by `INSERT … SELECT generate_series` in statements of up to a million rows,
//! two at a time (the machine's cores), not through the API: the API's create rate is the
//! create scenarios' business. Unkeyed, so `task_keys` has nothing to hold. Then VACUUM
//! ANALYZE, as autovacuum would have done over those months, and a CHECKPOINT.
//!
//! The backlog scenario writes its rows with the same loader (`write`, `settle`).
//!
//! Reported: the load's time and rate, the vacuum's time, and the disk space per million
//! tasks (the database's growth; `tasks_cold` per million pending; the partitions per
//! million tasks written into them, nearly all finished).

use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::{Context, bail};
use chime::db::{self, Pool};
use chime::partitions::{self, Layout};
use chime::tasks::load::{self, Backlog};
use chrono::{DateTime, TimeDelta, Utc};

use crate::bench::secs;
use crate::cli::BenchArgs;
use crate::report::Report;

/// Rows per INSERT statement: big enough that the statement's overhead vanishes, small
/// enough that one transaction does not hold a gigabyte of WAL.
const CHUNK: u64 = 1_000_000;
/// Statements in flight at once: one PostgreSQL backend per core of this machine.
const LOADERS: usize = 2;

/// One stretch of rows to write: `count` rows due evenly over `[from, to)`.
pub struct Part {
    pub what: &'static str,
    pub count: u64,
    pub from: DateTime<Utc>,
    pub to: DateTime<Utc>,
    pub finished: bool,
    pub cold: bool,
    /// Every task's flow key, if any.
    pub flow_key: Option<&'static str>,
}

/// Writes `parts` as tasks of biz type `biz_type_id`, `LOADERS` statements of up to `CHUNK`
/// rows at a time, saying how far it got under `label` (scale, backlog). Returns the rows
/// written and the seconds it took.
pub async fn write(pool: &Pool, biz_type_id: i32, payload: &str, parts: Vec<Part>, label: &'static str) -> anyhow::Result<(u64, f64)> {
    let started = Instant::now();
    // Every statement to run, in order; the loaders take them in turn.
    let mut jobs = Vec::new();
    for (p, part) in parts.iter().enumerate() {
        let mut first = 0;
        while first < part.count {
            let n = (part.count - first).min(CHUNK);
            jobs.push((p, first, n));
            first += n;
        }
    }
    let total: u64 = parts.iter().map(|p| p.count).sum();
    let parts = Arc::new(parts);
    let jobs = Arc::new(Mutex::new(jobs.into_iter().rev().collect::<Vec<_>>()));
    let written = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut loaders = tokio::task::JoinSet::new();
    for _ in 0..LOADERS {
        let (pool, parts, jobs, written, payload) = (pool.clone(), parts.clone(), jobs.clone(), written.clone(), payload.to_owned());
        loaders.spawn(async move {
            loop {
                let Some((p, first, n)) = jobs.lock().expect("no loader panics holding the list").pop() else {
                    return anyhow::Ok(());
                };
                let part = &parts[p];
                let step_us = secs(part.to - part.from) * 1e6 / part.count as f64;
                let backlog = Backlog {
                    biz_type_id,
                    from: part.from,
                    step_us,
                    payload: &payload,
                    finished: part.finished,
                    cold: part.cold,
                    flow_key: part.flow_key,
                };
                load::insert_backlog(&pool, &backlog, first, n).await.with_context(|| format!("writing {} tasks", part.what))?;
                let done = written.fetch_add(n, std::sync::atomic::Ordering::Relaxed) + n;
                eprintln!("bench: {label}: {done} of {total} tasks written ({:.0} s)", started.elapsed().as_secs_f64());
            }
        });
    }
    while let Some(done) = loaders.join_next().await {
        done??;
    }
    Ok((total, started.elapsed().as_secs_f64()))
}

/// VACUUM ANALYZE and a CHECKPOINT after a load, as autovacuum and time would have done
/// over what it stands for. Returns the seconds it took.
pub async fn settle(pool: &Pool, label: &str) -> anyhow::Result<f64> {
    eprintln!("bench: {label}: VACUUM ANALYZE and CHECKPOINT, as autovacuum and time would have done");
    let started = Instant::now();
    load::vacuum_loaded(pool).await?;
    db::query("CHECKPOINT").execute(pool).await?;
    Ok(started.elapsed().as_secs_f64())
}

/// Writes the scale scenario's tasks for biz type `biz_type_id` and reports what the load
/// cost. The nodes are running: they see the rows as they land, as they would in service.
pub async fn fill(pool: &Pool, biz_type_id: i32, payload: &str, args: &BenchArgs, report: &mut Report) -> anyhow::Result<()> {
    let nodes = args.nodes[0];
    let layout = Layout::default();
    if args.scale_days > layout.retention_days {
        bail!(
            "--scale-days {} is more than the {} days of retention: the leader would drop the older partitions as soon \
             as it ran; give --scale-days {} or less",
            args.scale_days,
            layout.retention_days,
            layout.retention_days
        );
    }
    let before = load::sizes(pool).await?;
    let started = Instant::now();
    // The past days' partitions, as the leader made them day after day; retention keeps
    // every one that ended less than `retention_days` ago.
    let horizon = partitions::ensure_since(pool, &layout, TimeDelta::days(i64::from(args.scale_days))).await?;
    let now = Utc::now();
    let today = midnight(now);
    let pending_from = now + TimeDelta::hours(1);
    let pending_to = now + TimeDelta::days(365);
    // Pending tasks are spread evenly over the year, so the share due before the horizon
    // goes to the partitions and the rest to cold storage.
    let span = secs(pending_to - pending_from);
    let hot_count = (args.scale_pending as f64 * secs(horizon - pending_from) / span).round() as u64;
    let mut parts = vec![
        Part { what: "pending (hot)", count: hot_count, from: pending_from, to: horizon, finished: false, cold: false, flow_key: None },
        Part {
            what: "pending (cold)",
            count: args.scale_pending - hot_count,
            from: horizon,
            to: pending_to,
            finished: false,
            cold: true,
            flow_key: None,
        },
    ];
    for d in 1..=i64::from(args.scale_days) {
        let from = today - TimeDelta::days(d);
        parts.push(Part {
            what: "finished",
            count: args.scale_finished,
            from,
            to: from + TimeDelta::days(1),
            finished: true,
            cold: false,
            flow_key: None,
        });
    }
    let (total, load_secs) = write(pool, biz_type_id, payload, parts, "scale").await?;
    let vacuum_secs = settle(pool, "scale").await?;
    let after = load::sizes(pool).await?;
    eprintln!("bench: scale: ready after {:.0} s", started.elapsed().as_secs_f64());

    let finished = args.scale_finished * u64::from(args.scale_days);
    let per_million = |bytes: i64, rows: u64| if rows == 0 { f64::NAN } else { bytes as f64 / rows as f64 * 1e6 / (1 << 20) as f64 };
    let add = |report: &mut Report, metric: &str, unit: &str, value: f64| report.add("scale", nodes, metric, unit, value, None);
    add(report, &format!("load: {total} tasks written"), "s", load_secs);
    add(report, "load: rate", "tasks/s", total as f64 / load_secs);
    add(report, "load: VACUUM ANALYZE and CHECKPOINT", "s", vacuum_secs);
    add(report, "partitions of tasks (each probed by a claim's update)", "partitions", after.partitions as f64);
    add(report, "disk: database growth per million tasks", "MiB", per_million(after.database - before.database, total));
    add(report, "disk: tasks_cold per million pending", "MiB", per_million(after.cold - before.cold, args.scale_pending - hot_count));
    add(report, "disk: tasks' partitions per million tasks in them", "MiB", per_million(after.hot - before.hot, finished + hot_count));
    add(report, "disk: database after the load", "MiB", after.database as f64 / (1 << 20) as f64);
    Ok(())
}

/// Midnight UTC of the day: where a daily partition begins.
fn midnight(t: DateTime<Utc>) -> DateTime<Utc> {
    t.date_naive().and_hms_opt(0, 0, 0).expect("midnight exists").and_utc()
}
