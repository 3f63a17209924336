//! Prometheus metrics, served at `/metrics` in the OpenMetrics text format through
//! Prometheus' own Rust client (`prometheus-client`).
//!
//! Two registries, both shown by `/metrics`:
//! * the process's: what the engine and the leader count (claims, outcomes, callbacks in
//!   flight, latency and lateness per biz type; cold moves, timer occurrences, partitions
//!   dropped) and whether each node leads. One per process: the engine reports through the
//!   free functions below, and the nodes a test runs in one process share it.
//! * a node's (`Node`): its HTTP requests by route and status, its database pool, and, on
//!   the leader only, the queue read from the database (`tasks::stats`): pending,
//!   retrying and failed tasks and the age of the oldest due one per biz type. Every node
//!   would read the same numbers; the leader alone reading them keeps their cost to one
//!   reader per cluster, and alert rules take `max by (biz_type)` so that two nodes
//!   exporting them during a change of leader do not double-count.
//!
//! The engine updates the process's metrics once per claim and once per finished callback:
//! atomics behind a read lock per family, nanoseconds against a callback's milliseconds.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::db::Pool;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::encoding::text::{encode_eof, encode_registry};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use uuid::Uuid;

use crate::tasks::stats;

/// Bucket bounds in seconds, shared by the latency and lateness histograms: from 1 ms
/// (on-time firing is judged in milliseconds) to 10 minutes (retries after an outage).
const SECONDS_BUCKETS: [f64; 14] = [0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 60.0, 600.0];
const BATCH_BUCKETS: [f64; 8] = [1.0, 5.0, 10.0, 25.0, 50.0, 100.0, 200.0, 500.0];
/// The leader counts the queue at most this often; scrapes in between show the last count.
const COUNT_EVERY: Duration = Duration::from_secs(30);
/// A count or age query that takes longer is cancelled; its metrics are left out (and a
/// warning logged) until one succeeds. A scrape runs at most one that long, inside
/// Prometheus' default 10 s scrape timeout.
const QUERY_TIMEOUT: Duration = Duration::from_secs(5);

/// The content type of `render`'s text.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// The content type of `classic`'s text: Prometheus' own text format, for clients that do
/// not ask for OpenMetrics (curl, `promtool check metrics`).
pub const CLASSIC_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Whether a scrape's Accept header asks for OpenMetrics (Prometheus' does): the text
/// `render` makes. Others get `classic`, as Prometheus' Go client answers them.
pub fn wants_openmetrics(accept: Option<&str>) -> bool {
    accept.is_some_and(|a| a.contains("application/openmetrics-text"))
}

/// `render`'s OpenMetrics text in Prometheus' classic text format (0.0.4). They differ
/// where chime's metrics are concerned in one thing that matters: OpenMetrics names a
/// counter family `x` and its sample `x_total`, while the classic format wants HELP and
/// TYPE under the sample's name, so a classic parser saw `x_total` without help or type
/// (`promtool check metrics`: "no help text" for every counter with a sample). `# UNIT` and
/// `# EOF` are OpenMetrics' own and are left out.
pub fn classic(openmetrics: &str) -> String {
    let lines: Vec<&str> = openmetrics.lines().collect();
    let mut out = String::with_capacity(openmetrics.len() + 1024);
    for (i, line) in lines.iter().enumerate() {
        if *line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        // A family's HELP comes before its TYPE. Names are not unique across types:
        // `chime_tasks_failed` is a counter (per node) and a gauge (the leader's count).
        let counter = |name: &str| {
            let typed = if line.starts_with("# TYPE ") { Some(line) } else { lines.get(i + 1) };
            typed.and_then(|t| t.strip_prefix("# TYPE ")?.strip_suffix(" counter")) == Some(name)
        };
        let described = ["# HELP ", "# TYPE "].into_iter().find_map(|kind| Some((kind, line.strip_prefix(kind)?.split_once(' ')?)));
        match described {
            Some((kind, (name, text))) if counter(name) => out.push_str(&format!("{kind}{name}_total {text}")),
            _ => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_classic_format_names_a_counters_help_and_type_after_its_samples() {
        let openmetrics = "# HELP a_seconds Time.\n# TYPE a_seconds histogram\n# UNIT a_seconds seconds\na_seconds_sum 1.0\n\
            # HELP x Things.\n# TYPE x counter\nx_total{b=\"1\"} 2\n# HELP x Things now.\n# TYPE x gauge\nx{b=\"1\"} 1\n# EOF\n";
        assert_eq!(
            super::classic(openmetrics),
            "# HELP a_seconds Time.\n# TYPE a_seconds histogram\na_seconds_sum 1.0\n\
             # HELP x_total Things.\n# TYPE x_total counter\nx_total{b=\"1\"} 2\n# HELP x Things now.\n# TYPE x gauge\nx{b=\"1\"} 1\n"
        );
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BizType {
    biz_type: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NodeLabel {
    node: String,
}

/// An HTTP request's route (the pattern it matched, never the raw path, so that the label
/// takes a bounded set of values) and method.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Route {
    method: &'static str,
    route: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Request {
    method: &'static str,
    route: String,
    status: u16,
}

fn seconds_histogram() -> Histogram {
    Histogram::new(SECONDS_BUCKETS)
}

type SecondsFamily<L> = Family<L, Histogram, fn() -> Histogram>;

fn seconds_family<L: Clone + std::hash::Hash + Eq>() -> SecondsFamily<L> {
    Family::new_with_constructor(seconds_histogram)
}

/// The process's metrics: the engine's and the leader's.
struct Process {
    registry: Registry,
    claimed: Family<BizType, Counter>,
    delivered: Family<BizType, Counter>,
    retried: Family<BizType, Counter>,
    failed: Family<BizType, Counter>,
    /// Tasks ended `expired` by this node, however it found the deadline passed.
    expired: Family<BizType, Counter>,
    /// Callbacks answered 2xx with `Chime-Snooze`.
    snoozed: Family<BizType, Counter>,
    in_flight: Family<BizType, Gauge>,
    latency: SecondsFamily<BizType>,
    lateness: SecondsFamily<BizType>,
    claim_batches: Histogram,
    /// Whether each node in this process leads (one node per process, except in tests).
    leader: Family<NodeLabel, Gauge>,
    cold_moved: Counter,
    occurrences: Counter,
    /// How long each leader tick spent writing timer occurrences.
    materialize_seconds: Histogram,
    partitions_dropped: Counter,
    /// Failure notices by biz type and outcome (`failure_notices`).
    failure_notices: Family<NoticeOutcome, Counter>,
    /// Chat messages by biz type and outcome (`chat_notices`).
    chat_messages: Family<NoticeOutcome, Counter>,
    /// Failed attempts held by an open receiver breaker, not counted (`engine::breaker`).
    held: Family<BizType, Counter>,
    /// Receiver breakers opened and closed by this node, by biz type and `to`.
    breaker_transitions: Family<Transition, Counter>,
    /// Whether each biz type's breaker is open, as this node last read or set it.
    breaker_open: Family<BizType, Gauge>,
    /// Probes of open breakers sent by this node, by biz type and `result`.
    breaker_probes: Family<ProbeResult, Counter>,
    /// Retry-After answers that held a whole biz type's claims.
    slowed: Family<BizType, Counter>,
}

/// A receiver breaker's transition: `to` is `open` or `closed`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Transition {
    biz_type: String,
    to: &'static str,
}

/// A probe's `result`: `up` (answered: the breaker closes) or `down`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ProbeResult {
    biz_type: String,
    result: &'static str,
}

/// This node opened the biz type's receiver breaker.
pub fn breaker_opened(biz_type_name: &str) {
    process().breaker_transitions.get_or_create(&Transition { biz_type: biz_type_name.to_string(), to: "open" }).inc();
    drop(process().breaker_transitions.get_or_create(&Transition { biz_type: biz_type_name.to_string(), to: "closed" }));
}

/// This node closed the biz type's receiver breaker (a probe was answered).
pub fn breaker_closed(biz_type_name: &str) {
    process().breaker_transitions.get_or_create(&Transition { biz_type: biz_type_name.to_string(), to: "closed" }).inc();
}

/// The biz type's receiver breaker is open (or not), as this node knows.
pub fn breaker_open(biz_type_name: &str, open: bool) {
    process().breaker_open.get_or_create(&biz_type(biz_type_name)).set(i64::from(open));
}

/// A probe of the biz type's open breaker: answered (`up`) or not.
pub fn breaker_probe(biz_type_name: &str, up: bool) {
    let result = if up { "up" } else { "down" };
    process().breaker_probes.get_or_create(&ProbeResult { biz_type: biz_type_name.to_string(), result }).inc();
}

/// A receiver's Retry-After held the biz type's claims.
pub fn slowed(biz_type_name: &str) {
    process().slowed.get_or_create(&biz_type(biz_type_name)).inc();
}

/// A notice's or chat message's attempt: `delivered`, `retried` or `failed` (for good).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NoticeOutcome {
    biz_type: String,
    outcome: &'static str,
}

/// One failure notice attempt of the biz type: `delivered`, `retried` or `failed` (for good).
pub fn failure_notice(biz_type_name: &str, outcome: &'static str) {
    process().failure_notices.get_or_create(&NoticeOutcome { biz_type: biz_type_name.to_string(), outcome }).inc();
}

/// One try of a chat message of the biz type: `delivered`, `retried` or `failed` (given up).
pub fn chat_message(biz_type_name: &str, outcome: &'static str) {
    process().chat_messages.get_or_create(&NoticeOutcome { biz_type: biz_type_name.to_string(), outcome }).inc();
}

fn process() -> &'static Process {
    static PROCESS: OnceLock<Process> = OnceLock::new();
    PROCESS.get_or_init(|| {
        let p = Process {
            registry: Registry::default(),
            claimed: Family::default(),
            delivered: Family::default(),
            retried: Family::default(),
            failed: Family::default(),
            expired: Family::default(),
            snoozed: Family::default(),
            in_flight: Family::default(),
            latency: seconds_family(),
            lateness: seconds_family(),
            claim_batches: Histogram::new(BATCH_BUCKETS),
            leader: Family::default(),
            cold_moved: Counter::default(),
            occurrences: Counter::default(),
            materialize_seconds: Histogram::new(SECONDS_BUCKETS),
            partitions_dropped: Counter::default(),
            failure_notices: Family::default(),
            chat_messages: Family::default(),
            held: Family::default(),
            breaker_transitions: Family::default(),
            breaker_open: Family::default(),
            breaker_probes: Family::default(),
            slowed: Family::default(),
        };
        let mut r = Registry::default();
        // Counters are registered without `_total`: the encoder appends it to the samples.
        r.register("chime_tasks_claimed", "Tasks claimed for delivery", p.claimed.clone());
        r.register("chime_tasks_delivered", "Callbacks answered with 2xx", p.delivered.clone());
        r.register("chime_tasks_retried", "Failed attempts that will be retried", p.retried.clone());
        r.register("chime_tasks_failed", "Tasks failed for good (permanent error or attempts exhausted)", p.failed.clone());
        r.register(
            "chime_tasks_expired",
            "Tasks ended expired by this node: not delivered before their deadline (expires_at), found at the claim, before sending, after a failure or snooze reaching the deadline, at lease recovery, or by the leader's sweep",
            p.expired.clone(),
        );
        r.register("chime_attempts_snoozed", "Callbacks answered 2xx with a valid Chime-Snooze: the task is pending again, due later, the attempt not counted", p.snoozed.clone());
        r.register("chime_in_flight", "Callbacks in flight on this node", p.in_flight.clone());
        r.register("chime_delivery_seconds", "Callback duration", p.latency.clone());
        r.register("chime_lateness_seconds", "Fire time minus run_at", p.lateness.clone());
        r.register("chime_claim_batch_size", "Tasks per claim", p.claim_batches.clone());
        r.register("chime_leader", "1 if this node is the cluster's leader", p.leader.clone());
        r.register("chime_cold_tasks_moved", "Tasks moved from cold storage into the hot partitions by this node", p.cold_moved.clone());
        r.register("chime_timer_occurrences", "Timer occurrences written as tasks by this node", p.occurrences.clone());
        r.register(
            "chime_timer_materialize_seconds",
            "Time this node spent writing timer occurrences per leader tick (those with nothing due included)",
            p.materialize_seconds.clone(),
        );
        r.register("chime_partitions_dropped", "Partitions dropped past retention by this node", p.partitions_dropped.clone());
        r.register("chime_failure_notices", "Failure notice attempts by outcome: delivered, retried, failed (for good)", p.failure_notices.clone());
        r.register("chime_chat_messages", "Chat message tries by outcome: delivered, retried, failed (given up)", p.chat_messages.clone());
        r.register(
            "chime_attempts_held",
            "Failed callbacks held by an open receiver breaker (its probes, and callbacks in flight when it opened): the task is pending again, the attempt not counted",
            p.held.clone(),
        );
        r.register(
            "chime_receiver_breaker_transitions",
            "Receiver breakers opened (to=open: failures in a row) and closed (to=closed: a probe answered) by this node",
            p.breaker_transitions.clone(),
        );
        r.register(
            "chime_receiver_breaker_open",
            "1 while the biz type's receiver breaker is open (its tasks wait, one probes the receiver), as this node knows; aggregate with max by (biz_type)",
            p.breaker_open.clone(),
        );
        r.register("chime_receiver_breaker_probes", "Probes of open receiver breakers sent by this node, by result: up (answered) or down", p.breaker_probes.clone());
        r.register("chime_receiver_slowed", "Answers 429 or 503 with Retry-After that held the whole biz type's claims", p.slowed.clone());
        Process { registry: r, ..p }
    })
}

fn biz_type(name: &str) -> BizType {
    BizType { biz_type: name.to_string() }
}

pub fn claimed(biz_type_name: &str, count: usize) {
    let p = process();
    let b = biz_type(biz_type_name);
    p.claim_batches.observe(count as f64);
    p.claimed.get_or_create(&b).inc_by(count as u64);
    p.in_flight.get_or_create(&b).inc_by(count as i64);
    // A biz type's every series appears with its first claim, at zero until it counts.
    for family in [&p.delivered, &p.retried, &p.failed, &p.expired, &p.snoozed] {
        drop(family.get_or_create(&b));
    }
    drop(p.latency.get_or_create(&b));
    drop(p.lateness.get_or_create(&b));
}

/// One finished delivery attempt: how long the callback took, how late it fired, and
/// whether it was delivered, will be retried, failed for good, was snoozed by the
/// receiver, or ended the task expired (its retry or snooze reaching the deadline).
pub enum Finish {
    Delivered,
    Retried,
    Failed,
    Snoozed,
    Expired,
    /// Failed while the receiver's breaker was open: pending again, not counted.
    Held,
}

pub fn finished(biz_type_name: &str, latency_s: f64, lateness_s: f64, result: Finish) {
    let p = process();
    let b = biz_type(biz_type_name);
    p.in_flight.get_or_create(&b).dec();
    p.latency.get_or_create(&b).observe(latency_s);
    p.lateness.get_or_create(&b).observe(lateness_s.max(0.0));
    let outcome = match result {
        Finish::Delivered => &p.delivered,
        Finish::Retried => &p.retried,
        Finish::Failed => &p.failed,
        Finish::Snoozed => &p.snoozed,
        Finish::Expired => &p.expired,
        Finish::Held => &p.held,
    };
    outcome.get_or_create(&b).inc();
}

/// Tasks of a biz type ended `expired` without a callback (at the claim, at lease recovery,
/// by the sweep, by a pull reserve).
pub fn expired(biz_type_name: &str, count: u64) {
    if count > 0 {
        process().expired.get_or_create(&biz_type(biz_type_name)).inc_by(count);
    }
}

/// Tasks ended `expired` by a sweep, one biz type name per task (`tasks::lease::Swept`).
pub fn expired_each<'a>(biz_type_names: impl IntoIterator<Item = &'a String>) {
    let mut counts: std::collections::HashMap<&str, u64> = std::collections::HashMap::new();
    for name in biz_type_names {
        *counts.entry(name).or_default() += 1;
    }
    for (name, n) in counts {
        expired(name, n);
    }
}

/// A task claimed by the engine and not sent, because its deadline came before its due
/// time: no longer in flight, and expired.
pub fn not_sent_expired(biz_type_name: &str) {
    let p = process();
    let b = biz_type(biz_type_name);
    p.in_flight.get_or_create(&b).dec();
    p.expired.get_or_create(&b).inc();
}

/// What the leader did: cold tasks moved, timer occurrences written, partitions dropped.
pub fn housekeeping(cold_moved: u64, occurrences: u64, partitions_dropped: u64) {
    let p = process();
    p.cold_moved.inc_by(cold_moved);
    p.occurrences.inc_by(occurrences);
    p.partitions_dropped.inc_by(partitions_dropped);
}

/// One leader tick's writing of timer occurrences took this long.
pub fn timers_materialized(seconds: f64) {
    process().materialize_seconds.observe(seconds);
}

/// One node's metrics: its HTTP requests and database pool, and, while it leads, the
/// queue's state. Built with the node; `/metrics` renders it with the process's.
pub struct Node {
    /// The node's id, its label in `chime_leader`.
    id: Uuid,
    /// The node's pool: read for the pool gauges, and queried for the queue's metrics.
    pool: Pool,
    registry: Registry,
    requests: Family<Request, Counter>,
    request_seconds: SecondsFamily<Route>,
    /// Set from the pool at each scrape.
    pool_in_use: Gauge,
    pool_idle: Gauge,
    pool_max: Gauge,
    /// Set by the election loop; the queue's metrics are read only while it is true.
    leading: AtomicBool,
    /// The queue per biz type, replaced whole at each count (a biz type gone is dropped).
    pending: Family<BizType, Gauge>,
    retrying: Family<BizType, Gauge>,
    failed: Family<BizType, Gauge>,
    oldest_pending_age: Family<BizType, Gauge<f64, AtomicU64>>,
    /// When the queue was last counted while leading; held by a scrape for its whole
    /// render, so that scrapes at once (two Prometheus servers) count once and never show
    /// a half-updated family.
    counted: tokio::sync::Mutex<Option<Instant>>,
}

impl Node {
    pub fn new(id: Uuid, pool: Pool) -> Node {
        let mut node = Node {
            id,
            pool,
            registry: Registry::default(),
            requests: Family::default(),
            request_seconds: seconds_family(),
            pool_in_use: Gauge::default(),
            pool_idle: Gauge::default(),
            pool_max: Gauge::default(),
            leading: AtomicBool::new(false),
            pending: Family::default(),
            retrying: Family::default(),
            failed: Family::default(),
            oldest_pending_age: Family::default(),
            counted: tokio::sync::Mutex::new(None),
        };
        let r = &mut node.registry;
        r.register(
            "chime_http_requests",
            "HTTP requests answered by this node (API, console, probes), by method, route pattern (`unmatched` for a path no route matches) and status",
            node.requests.clone(),
        );
        r.register(
            "chime_http_request_duration_seconds",
            "Time to answer an HTTP request, by method and route pattern",
            node.request_seconds.clone(),
        );
        r.register(
            "chime_db_pool_connections_in_use",
            "Connections of this node's database pool (CHIME_DB_POOL_SIZE) in use; at chime_db_pool_max_connections, further queries wait for one. The engine's own 4 connections and the leader's session are not counted",
            node.pool_in_use.clone(),
        );
        r.register("chime_db_pool_connections_idle", "Open connections of this node's database pool that are idle", node.pool_idle.clone());
        r.register("chime_db_pool_max_connections", "Size limit of this node's database pool (CHIME_DB_POOL_SIZE)", node.pool_max.clone());
        let leader_only = "Exported by the leader only (aggregate with max by (biz_type)), counted at most every 30 s; hot partitions only";
        r.register("chime_tasks_pending", format!("Tasks waiting for delivery, due or not, per biz type. {leader_only}"), node.pending.clone());
        r.register(
            "chime_tasks_retrying",
            format!("Pending tasks that failed at least once and wait for their next attempt (included in chime_tasks_pending). {leader_only}"),
            node.retrying.clone(),
        );
        r.register("chime_tasks_failed", format!("Tasks failed for good and not replayed. {leader_only}"), node.failed.clone());
        r.register(
            "chime_oldest_pending_age_seconds",
            "Seconds the oldest due, undelivered task of each biz type has waited (now - run_at), 0 if none is due. Exported by the leader only (aggregate with max by (biz_type)), read at every scrape",
            node.oldest_pending_age.clone(),
        );
        node
    }

    /// Whether this node leads (the leader's election loop says so).
    pub fn leading(&self, leads: bool) {
        self.leading.store(leads, Ordering::Relaxed);
        process().leader.get_or_create(&NodeLabel { node: self.id.to_string() }).set(i64::from(leads));
    }

    /// One HTTP request answered: its method, the route pattern it matched (None: no route
    /// matched), its status and how long it took.
    pub fn http_request(&self, method: &str, route: Option<&str>, status: u16, took: Duration) {
        // Only the methods chime serves are labels of their own: any token is a valid method.
        let method = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"].into_iter().find(|m| *m == method).unwrap_or("other");
        let route = route.unwrap_or("unmatched").to_string();
        self.request_seconds.get_or_create(&Route { method, route: route.clone() }).observe(took.as_secs_f64());
        self.requests.get_or_create(&Request { method, route, status }).inc();
    }

    /// The process's and this node's metrics, in the OpenMetrics text format.
    pub async fn render(&self) -> String {
        let mut counted = self.counted.lock().await;
        self.pool_max.set(i64::from(self.pool.options().get_max_connections()));
        let (size, idle) = (i64::from(self.pool.size()), self.pool.num_idle() as i64);
        self.pool_idle.set(idle);
        self.pool_in_use.set((size - idle).max(0));
        if self.leading.load(Ordering::Relaxed) {
            self.read_queue(&mut counted).await;
        } else {
            *counted = None;
            self.clear_counts();
            self.oldest_pending_age.clear();
        }
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = encode_registry(&mut out, &process().registry);
        let _ = encode_registry(&mut out, &self.registry);
        let _ = encode_eof(&mut out);
        out
    }

    /// Drops the queue's counts, so that none is shown stale.
    fn clear_counts(&self) {
        for family in [&self.pending, &self.retrying, &self.failed] {
            family.clear();
        }
    }

    /// The age of the oldest due task at every scrape (an index probe per biz type), the
    /// counts at most every `COUNT_EVERY` (they walk the queue).
    async fn read_queue(&self, counted: &mut Option<Instant>) {
        self.oldest_pending_age.clear();
        match within(stats::oldest_pending_age(&self.pool, QUERY_TIMEOUT)).await {
            Ok(ages) => {
                for (name, age) in ages {
                    self.oldest_pending_age.get_or_create(&biz_type(&name)).set(age);
                }
            }
            Err(e) => {
                // The database is likely out of reach: no count either, so that the scrape
                // stays within one query timeout, and no stale count shown.
                tracing::warn!(error = %e, "could not read the oldest pending task's age for /metrics; the queue's metrics are left out of this scrape");
                *counted = None;
                self.clear_counts();
                return;
            }
        }
        if counted.is_some_and(|at| at.elapsed() < COUNT_EVERY) {
            return;
        }
        // Also after a failure: a count that timed out is not retried at every scrape.
        *counted = Some(Instant::now());
        self.clear_counts();
        match within(stats::counts(&self.pool, QUERY_TIMEOUT)).await {
            Ok(counts) => {
                for c in counts {
                    let b = biz_type(&c.biz_type);
                    self.pending.get_or_create(&b).set(c.pending);
                    self.retrying.get_or_create(&b).set(c.retrying);
                    self.failed.get_or_create(&b).set(c.failed);
                }
            }
            Err(e) => tracing::warn!(
                error = %e,
                "could not count pending, retrying and failed tasks for /metrics within {} s; those metrics are left out until the next count in {} s",
                QUERY_TIMEOUT.as_secs(),
                COUNT_EVERY.as_secs()
            ),
        }
    }
}

/// A query bounded as a whole: the server cancels a statement at its `statement_timeout`,
/// but waiting for a connection (a database that is down, a pool in use) is bounded only
/// by the pool's 10 s acquire timeout, past Prometheus' scrape timeout. The scrape then
/// still shows the node's other metrics.
async fn within<T>(query: impl Future<Output = Result<T, sqlx::Error>>) -> Result<T, String> {
    match tokio::time::timeout(QUERY_TIMEOUT + Duration::from_secs(1), query).await {
        Ok(result) => result.map_err(|e| e.to_string()),
        Err(_) => Err(format!("no answer within {} s", QUERY_TIMEOUT.as_secs() + 1)),
    }
}
