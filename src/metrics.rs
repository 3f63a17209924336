//! Prometheus metrics of this node, served at `/metrics` in the text format.
//!
//! Small on purpose: counters and histograms keyed by biz type, behind one mutex that the
//! engine takes once per claim and once per finished callback (an uncontended lock costs
//! tens of nanoseconds against a callback's milliseconds). One registry per process.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;
use std::sync::OnceLock;

/// Bucket bounds in seconds, shared by the latency and lateness histograms: from 1 ms
/// (on-time firing is judged in milliseconds) to 10 minutes (retries after an outage).
const SECONDS_BUCKETS: [f64; 14] = [0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 60.0, 600.0];
const BATCH_BUCKETS: [f64; 8] = [1.0, 5.0, 10.0, 25.0, 50.0, 100.0, 200.0, 500.0];

#[derive(Default, Clone)]
struct Histogram {
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    fn observe(&mut self, bounds: &[f64], value: f64) {
        if self.counts.is_empty() {
            self.counts = vec![0; bounds.len()];
        }
        for (i, bound) in bounds.iter().enumerate() {
            if value <= *bound {
                self.counts[i] += 1;
            }
        }
        self.sum += value;
        self.count += 1;
    }
}

#[derive(Default)]
struct PerBizType {
    claimed: u64,
    delivered: u64,
    retried: u64,
    failed: u64,
    in_flight: i64,
    latency: Histogram,
    lateness: Histogram,
}

#[derive(Default)]
struct Registry {
    by_biz_type: BTreeMap<String, PerBizType>,
    claim_batches: Histogram,
    /// Whether each node in this process leads (one node per process, except in tests).
    leading: BTreeMap<String, bool>,
    cold_moved: u64,
    occurrences: u64,
    partitions_dropped: u64,
}

fn registry() -> &'static Mutex<Registry> {
    static REGISTRY: OnceLock<Mutex<Registry>> = OnceLock::new();
    REGISTRY.get_or_init(Mutex::default)
}

pub fn claimed(biz_type: &str, count: usize) {
    let mut r = registry().lock().expect("metrics lock");
    r.claim_batches.observe(&BATCH_BUCKETS, count as f64);
    let b = r.by_biz_type.entry(biz_type.to_string()).or_default();
    b.claimed += count as u64;
    b.in_flight += count as i64;
}

/// One finished delivery attempt: how long the callback took, how late it fired, and
/// whether it was delivered, will be retried, or failed for good.
pub enum Finish {
    Delivered,
    Retried,
    Failed,
}

pub fn finished(biz_type: &str, latency_s: f64, lateness_s: f64, result: Finish) {
    let mut r = registry().lock().expect("metrics lock");
    let b = r.by_biz_type.entry(biz_type.to_string()).or_default();
    b.in_flight -= 1;
    b.latency.observe(&SECONDS_BUCKETS, latency_s);
    b.lateness.observe(&SECONDS_BUCKETS, lateness_s.max(0.0));
    match result {
        Finish::Delivered => b.delivered += 1,
        Finish::Retried => b.retried += 1,
        Finish::Failed => b.failed += 1,
    }
}

pub fn leading(node_id: uuid::Uuid, leads: bool) {
    registry().lock().expect("metrics lock").leading.insert(node_id.to_string(), leads);
}

/// What the leader did: cold tasks moved, timer occurrences written, partitions dropped.
pub fn housekeeping(cold_moved: u64, occurrences: u64, partitions_dropped: u64) {
    let mut r = registry().lock().expect("metrics lock");
    r.cold_moved += cold_moved;
    r.occurrences += occurrences;
    r.partitions_dropped += partitions_dropped;
}

fn label(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

fn histogram(out: &mut String, name: &str, labels: &str, bounds: &[f64], h: &Histogram) {
    let sep = if labels.is_empty() { "" } else { "," };
    for (i, bound) in bounds.iter().enumerate() {
        let n = h.counts.get(i).copied().unwrap_or(0);
        let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"{bound}\"}} {n}");
    }
    let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {}", h.count);
    let braces = if labels.is_empty() { String::new() } else { format!("{{{labels}}}") };
    let _ = writeln!(out, "{name}_sum{braces} {}", h.sum);
    let _ = writeln!(out, "{name}_count{braces} {}", h.count);
}

/// The metrics in Prometheus' text exposition format.
pub fn render() -> String {
    let r = registry().lock().expect("metrics lock");
    let mut out = String::new();
    let counters = [
        ("chime_tasks_claimed_total", "Tasks claimed for delivery.", 0),
        ("chime_tasks_delivered_total", "Callbacks answered with 2xx.", 1),
        ("chime_tasks_retried_total", "Failed attempts that will be retried.", 2),
        ("chime_tasks_failed_total", "Tasks failed for good (permanent error or attempts exhausted).", 3),
    ];
    for (name, help, which) in counters {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
        for (biz, b) in &r.by_biz_type {
            let v = [b.claimed, b.delivered, b.retried, b.failed][which];
            let _ = writeln!(out, "{name}{{biz_type=\"{}\"}} {v}", label(biz));
        }
    }
    let _ = writeln!(out, "# HELP chime_in_flight Callbacks in flight on this node.\n# TYPE chime_in_flight gauge");
    for (biz, b) in &r.by_biz_type {
        let _ = writeln!(out, "chime_in_flight{{biz_type=\"{}\"}} {}", label(biz), b.in_flight);
    }
    let _ = writeln!(out, "# HELP chime_delivery_seconds Callback duration.\n# TYPE chime_delivery_seconds histogram");
    for (biz, b) in &r.by_biz_type {
        histogram(&mut out, "chime_delivery_seconds", &format!("biz_type=\"{}\"", label(biz)), &SECONDS_BUCKETS, &b.latency);
    }
    let _ = writeln!(out, "# HELP chime_lateness_seconds Fire time minus run_at.\n# TYPE chime_lateness_seconds histogram");
    for (biz, b) in &r.by_biz_type {
        histogram(&mut out, "chime_lateness_seconds", &format!("biz_type=\"{}\"", label(biz)), &SECONDS_BUCKETS, &b.lateness);
    }
    let _ = writeln!(out, "# HELP chime_claim_batch_size Tasks per claim.\n# TYPE chime_claim_batch_size histogram");
    histogram(&mut out, "chime_claim_batch_size", "", &BATCH_BUCKETS, &r.claim_batches);
    let _ = writeln!(out, "# HELP chime_leader 1 if this node is the cluster's leader.\n# TYPE chime_leader gauge");
    for (node, leads) in &r.leading {
        let _ = writeln!(out, "chime_leader{{node=\"{node}\"}} {}", u8::from(*leads));
    }
    let leader_counters = [
        ("chime_cold_tasks_moved_total", "Tasks moved from cold storage into the hot partitions by this node.", r.cold_moved),
        ("chime_timer_occurrences_total", "Timer occurrences written as tasks by this node.", r.occurrences),
        ("chime_partitions_dropped_total", "Partitions dropped past retention by this node.", r.partitions_dropped),
    ];
    for (name, help, v) in leader_counters {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}");
    }
    out
}
