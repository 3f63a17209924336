//! The delivery engine: every node claims due tasks, calls their biz type's callback, and
//! records what happened (docs/design/contract.md: Callbacks, Engine).
//!
//! Shape. One claim loop per node. Each turn it reads the biz types that deliver by
//! callback and are neither paused nor archived (re-read as soon as any node changes one,
//! and every `SETTINGS_REFRESH` in case that notice was lost), and claims, in one
//! statement for all of them, as many due tasks of each as it has free in-flight slots.
//! A claimed task's callback starts at once, so a lease never waits behind other work:
//! the lease is the biz type's timeout plus a margin. Outcomes go to a recorder
//! (`recorder`) that writes them in batches, one statement for the tasks and one for the
//! attempts.
//!
//! Cost with many biz types. A company's timer service holds thousands of biz types, most
//! of them idle at any moment; a turn must not cost a statement, or even an index probe,
//! per idle one. So the engine keeps, per biz type, when it is next due (`next_look`): a
//! turn claims only the biz types whose time has come. That time is learnt from the
//! database when a biz type's claim caught up with what was due (one statement for all
//! such biz types, an index probe each), from a notification naming the biz type (a task
//! due within a second was created, replayed or rescheduled, on any node), from the
//! recorder (a retry or snooze it wrote), and from a sweep every `SWEEP` that asks every
//! biz type's next due time within the sweep (one statement, an index probe each): the
//! fallback for a task created a few seconds ahead, a recovered lease or a lost
//! notification. With 2,000 idle biz types a turn used to be 2,000 claims, one after the
//! other; now it is what is due, and the sweep a probe per biz type a second.
//!
//! Fair between biz types. Every biz type due in a turn is claimed in the same statement,
//! each up to its own free slots (at most `CLAIM_BATCH`): a herd of one takes its share
//! of the claim, not the turn before the others' come. The node holds at most its
//! capacity (`capacity`) over all biz types; when the due ones want more than is free, the
//! free part goes by weight to those holding least, so a herd that fills the node gives
//! the next freed places to a biz type due beside it.
//!
//! Sleeping. When a turn leaves nothing due, the loop sleeps until the first biz type with
//! a free slot is next due, until a callback finishes or an outcome is recorded (a slot
//! is free, a retry may be due), until a wake-up notification (`wake`) arrives, or
//! until the next sweep, whichever comes first.
//!
//! Firing on time. A claim also takes the tasks due within the next `CLAIM_AHEAD`, and
//! each waits in its delivery task until it is due, so that the claim's own time is not
//! added to its lateness. The wait is measured from the database's clock, as returned
//! with the row: a node whose clock runs ahead of the database's never fires early.
//!
//! Deadlines (docs/design/contract.md, Tasks by key). No callback starts at or after a task's `expires_at`: the claim
//! ends the tasks it picks whose deadline has passed instead of leasing them; a task claimed
//! ahead whose deadline comes before its due time is recorded expired, not sent (an attempt
//! that says so, `deliver::not_sent`); a retry or snooze that would start at or after the
//! deadline ends the task now (`Verdict::Expire`); and the leader's sweep ends the tasks no
//! claim reached in time (`leader::expire_overdue`).
//!
//! Failure. A node that dies holding leases leaves tasks `running`; when their leases
//! expire, the leader puts them back to pending (`recover_expired_leases`, every second)
//! and they are delivered again: at least once, never lost. A result for a task whose lease this
//! node lost is not written over the new holder's.
//!
//! Stopping (docs/design/contract.md, Operating, `lifecycle`). At the node's stop signal the loop claims no more and
//! each delivery task still waiting for its due time gives its task back (pending again,
//! its attempt not counted), so another node delivers it on time. Callbacks in flight
//! finish and are recorded as usual. If the grace runs out first, they are cut off: the
//! attempt is recorded as cut off and the task is pending again at once, rather than
//! after its lease (the receiver may have acted on it: at least once).
//!
//! One turn at a time. The loop's state lives in `Engine`, and one turn is `Engine::turn`:
//! `run` takes turns and sleeps between them, while a test can take single turns and wait
//! for the callbacks they started (`Engine::settled`) instead of sleeping. A turn's steps
//! are methods of their own: settings and sweep (`refresh`), the biz types due (`due`),
//! the node's capacity shared among them (`share`) and their rate limits (`wants`), the
//! claim (`claim`), and a `Delivery` started for each task claimed (`take`).
//!
//! In-flight cap. A biz type's max_in_flight is for the whole cluster too: a receiver sized
//! for 50 requests at once gets 50 however many nodes deliver. Each node keeps no more
//! than the cap itself (its own count, free), and each claim takes no more than the cap
//! leaves after every node's leases, counted in the database under a lock per biz type
//! (claim.sql), so two nodes claiming at once cannot both take the last slots. A lease is
//! counted from its claim (a task claimed ahead holds its slot while it waits) until its
//! outcome is recorded or it is given back or recovered. A claim the cap held back makes
//! the node look again within `CAPPED_POLL`, since another node's freed slot wakes no one.
//!
//! Receivers down (`breaker`). A biz type whose receiver fails this node's callbacks
//! `breaker_threshold` times in a row opens its breaker, in the database, for the whole
//! cluster: the turn skips it (a look in memory) and claims one task of it per probe
//! interval on the one node the database elects, until a probe is answered. A receiver's
//! `Retry-After` (429, 503) holds the biz type's claims the same way, on every node.
//!
//! Rate limits. A biz type's rate is for the whole cluster; each node takes its share,
//! the rate divided by the live delivering nodes (re-counted with the settings). A node
//! claims only as many tasks as its limiter lets it start now, so a rate-limited backlog
//! stays pending in the database, where any node can take it, rather than queueing here.

pub mod breaker;
pub mod capacity;
pub(crate) mod deliver;
mod failures;
mod lanes;
pub(crate) mod rate;
mod recorder;
mod spans;

pub use deliver::signature;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

use crate::db::Pool;
use sqlx::postgres::PgConnectOptions;
use tokio::sync::{Notify, mpsc};
use tokio::task::JoinHandle;
use uuid::Uuid;

use crate::biz_types::{PreviousSecret, SigningSecret};
use crate::callback_hosts::CallbackHosts;
use crate::db::{Health, Route};
use crate::error::SecretError;
use crate::lifecycle::Signal;
use crate::tasks::lease::{self, Outcome, Verdict};
use crate::wake::{self, Wake};
use crate::{metrics, nodes};
use lanes::Lanes;
use recorder::{ClaimLoop, Drained, Report};
use spans::TaskTrace;

/// Longest sleep without looking at the database, in case a wake-up was missed.
const IDLE_POLL: Duration = Duration::from_millis(1000);
/// How often biz type settings are re-read without being told of a change.
const SETTINGS_REFRESH: Duration = Duration::from_secs(2);
/// How soon a biz type whose cap (max_in_flight, across the cluster) held back its claim
/// is claimed again, unless this node is woken first. A slot another node frees is
/// usually taken again by that node at once (its own callback ending wakes it); this is
/// for the slots it does not take, a node stopping or with nothing left claimed. Shorter
/// costs each node a claim (a lock and a count of the leases) that often per capped biz type.
const CAPPED_POLL: Duration = Duration::from_millis(100);

/// How long a biz type found with tasks of several priorities due is claimed with the
/// priority branches at once (`lease::Want::priorities`), before a claim without them
/// looks again: a second statement that often at most.
const PRIORITIZED_FOR: Duration = Duration::from_secs(60);

/// Most tasks of one biz type claimed in one statement.
const CLAIM_BATCH: i64 = 200;
/// Of the tasks a node claims of a biz type, one in this many goes to its longest-due
/// tasks whatever their priority (claim.sql), so that no priority is starved by higher
/// ones: a task at the head of the due order waits at most for this share to reach it.
const OLDEST_SHARE: i64 = 10;
/// How often every biz type's next due time is asked (`Engine::sweep`): what no
/// notification announces is claimed at most this late (no later than due, for a task
/// created at least this far ahead). Each sweep is one statement with an index probe
/// per biz type.
const SWEEP: Duration = Duration::from_secs(1);
/// When a biz type with nothing due is looked at, unless a sweep or a notification says
/// otherwise first.
const NOTHING_DUE: Duration = Duration::from_secs(3600);
/// How far ahead of their due time tasks are claimed. Longer holds in-flight slots for
/// longer; shorter makes claims smaller when tasks are due one by one.
const CLAIM_AHEAD: Duration = Duration::from_millis(100);
/// Tasks a node holds at once unless told otherwise (`--node-capacity`): claimed and not
/// yet recorded, over all biz types. Under a burst, calling back can outrun recording, and
/// a task whose outcome waits longer than its lease would be delivered again.
pub const DEFAULT_NODE_CAPACITY: usize = 2000;
/// Added to a biz type's timeout to make its lease: time to record the outcome. Longer
/// costs a dead node's tasks that much delay; shorter risks a second delivery when the
/// recording is slow.
const LEASE_MARGIN_MS: i64 = 5_000;

/// The settings of a biz type the engine needs, as last read.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct BizTypeConfig {
    /// The fields below are the biz type's (`biz_types::BizType` says what each is for),
    /// as last read: every `SETTINGS_REFRESH`, and at once when any node changes one.
    pub id: i32,
    pub name: String,
    pub callback_url: String,
    pub timeout_ms: i32,
    pub max_attempts: i32,
    pub backoff_initial_ms: i32,
    pub backoff_max_ms: i32,
    pub max_in_flight: i32,
    /// Callbacks per second across the cluster; None = unlimited.
    pub rate_limit: Option<f64>,
    /// Tasks of one flow key in flight at once, across the cluster; 0: no such limit.
    #[sqlx(default)]
    pub flow_max_in_flight: i32,
    /// Each flow key's tasks one at a time, in run_at order.
    #[sqlx(default)]
    pub ordered: bool,
    /// Callbacks a second per flow key, across the cluster; None: unlimited.
    #[sqlx(default)]
    pub flow_rate_limit: Option<f64>,
    /// Its share of the node's capacity against the other biz types due, when short.
    #[sqlx(default)]
    pub weight: i32,
    #[sqlx(flatten)]
    pub signing_secret: SigningSecret,
    /// The secret the last rotation replaced, signing beside the current one until its
    /// overlap ends (`rotate_secret`): read only while the database says the overlap lasts,
    /// and checked against the time at each signature for the seconds between re-reads.
    #[sqlx(flatten)]
    pub previous_secret: PreviousSecret,
    /// Where failure notices go (`failure_notices`); None: nowhere.
    pub failure_url: Option<String>,
    /// `chime` or `standard-webhooks` (`deliver::sign`).
    #[sqlx(default)]
    pub signing_scheme: String,
    /// When its settings last changed (a claim that sees a later change makes the engine
    /// read them again before delivering).
    #[sqlx(default)]
    pub updated_at: chrono::DateTime<chrono::Utc>,
    /// The receiver's breaker (`breaker`); 0: none. Read by the engine only (a failure
    /// notice's sender has no use for them: 0 there).
    #[sqlx(default)]
    pub breaker_threshold: i32,
    #[sqlx(default)]
    pub breaker_window_ms: i32,
    #[sqlx(default)]
    pub breaker_probe_ms: i32,
}

impl BizTypeConfig {
    /// Its per-key limits, if it has any (a cap, 1 when ordered, 0 for none; whether
    /// ordered; a rate): a claim of its tasks then goes through them.
    fn flow(&self) -> Option<(i32, bool, Option<f64>)> {
        let cap = if self.ordered { 1 } else { self.flow_max_in_flight };
        (cap > 0 || self.flow_rate_limit.is_some()).then_some((cap, self.ordered, self.flow_rate_limit))
    }

    /// Why this node cannot sign for the biz type: its secret, or the previous one while it
    /// still signs, is sealed under a key this node lacks. A callback never goes out with
    /// fewer signatures than it should.
    pub fn unopened(&self) -> Option<SecretError> {
        let previous = self.previous_secret.signing_at(chrono::Utc::now()).and_then(|p| p.expose().err());
        self.signing_secret.expose().err().or(previous)
    }
}

/// https callbacks go through rustls with the ring provider, which must be installed in
/// the process before any HTTP client is built. Safe to call more than once.
pub fn install_tls_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// The biz types to deliver, and those left out because this node cannot open their signing
/// secret (sealed under a key it was not given). Their tasks wait, pending, for a node that can.
async fn active_biz_types(pool: &Pool) -> Result<(Vec<BizTypeConfig>, Vec<(i32, SecretError)>), sqlx::Error> {
    let all: Vec<BizTypeConfig> = crate::db::query_as(
        "SELECT id, name, callback_url, timeout_ms, max_attempts, backoff_initial_ms, backoff_max_ms,
                max_in_flight, rate_limit, signing_secret, signing_secret_sealed, failure_url,
                breaker_threshold, breaker_window_ms, breaker_probe_ms, flow_max_in_flight, ordered, flow_rate_limit, weight,
                signing_scheme, updated_at,
                CASE WHEN previous_secret_until > now() THEN previous_secret END AS previous_secret,
                CASE WHEN previous_secret_until > now() THEN previous_secret_until END AS previous_secret_until
           FROM biz_types WHERE mode = 'callback' AND NOT paused AND archived_at IS NULL ORDER BY id",
    )
    .fetch_all(pool)
    .await?;
    let (usable, unopened): (Vec<_>, Vec<_>) = all.into_iter().partition(|b| b.unopened().is_none());
    Ok((usable, unopened.into_iter().filter_map(|b| b.unopened().map(|e| (b.id, e))).collect()))
}

/// Biz types the next turn claims whatever the engine thought of their next due time:
/// named by a notification (a task due soon, on any node) or by the recorder (a retry or
/// snooze it wrote); all of them when a notification named none.
#[derive(Default)]
struct Looks {
    ids: std::sync::Mutex<HashSet<i32>>,
    all: AtomicBool,
    /// Biz types with per-key limits: a task of theirs settled may free its key for the
    /// next, so the recorder names them after each batch it writes.
    flows: std::sync::Mutex<HashSet<i32>>,
}

impl Looks {
    /// Names `biz_type_id` if it has per-key limits.
    fn settled(&self, biz_type_id: i32) {
        if self.flows.lock().unwrap_or_else(std::sync::PoisonError::into_inner).contains(&biz_type_id) {
            self.add(biz_type_id);
        }
    }

    fn add(&self, biz_type_id: i32) {
        self.ids.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(biz_type_id);
    }

    fn add_all(&self) {
        self.all.store(true, Ordering::Relaxed);
    }

    /// Makes `next_look` say "at once" for what was added since the last call.
    fn take_into(&self, next_look: &mut HashMap<i32, tokio::time::Instant>) {
        if self.all.swap(false, Ordering::Relaxed) {
            next_look.clear();
        }
        for id in self.ids.lock().unwrap_or_else(std::sync::PoisonError::into_inner).drain() {
            next_look.remove(&id);
        }
    }
}

/// Runs the engine until the node stops (`stop`), then gives back what it claimed ahead,
/// waits for the callbacks in flight (until the grace is over) and records them.
/// `hosts` decides which addresses callbacks may reach. While the database is down (or no
/// host accepts writes) the engine waits for it rather than fail a claim a second.
pub async fn run(health: Health, node_id: Uuid, hosts: CallbackHosts, capacity: usize, stop: Signal) {
    let mut engine = Engine::start(health, node_id, hosts, stop);
    engine.capacity = capacity;
    engine.run().await
}

/// What one turn of the engine did, and when the loop should take the next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Turn {
    /// Tasks claimed in this turn; their callbacks have started (or wait for their due time).
    pub claimed: usize,
    /// How long to sleep before the next turn, unless woken; `None` when more is due at
    /// once (a biz type took a full claim with every slot free).
    pub sleep: Option<Duration>,
}

/// A biz type due in a turn, with free slots: its counter of this node's callbacks in
/// flight, how many it may claim, and whether it is claimed for its breaker's probe.
struct Due {
    biz: Arc<BizTypeConfig>,
    counter: Arc<AtomicI32>,
    slots: i64,
    probe: bool,
}

/// A biz type in a turn's claim: how many it asks for (`free`, what its place in the
/// node's capacity and its rate limit left of its slots) and how many of them go to its
/// longest-due tasks; when its rate limit allows more, if it held some back.
struct Claiming {
    due: Due,
    free: i64,
    wait: Option<Duration>,
    oldest: i64,
    /// The lane claimed from, if one (`Lanes`).
    lane: Option<i32>,
}

/// What a turn's claim says of the next turn: tasks claimed, whether more is due at once,
/// the biz types that claimed all that was due (when each is next due is asked), and the
/// longest the loop may sleep for the biz types held back (a rate limit, a cap).
struct Next {
    claimed: usize,
    more_due: bool,
    caught_up: Vec<i32>,
    rate_wait: Duration,
}

/// What every delivery needs of the engine, whatever its task: the engine keeps one, and
/// each delivery takes a clone.
#[derive(Clone)]
struct Courier {
    client: reqwest::Client,
    /// Which addresses callbacks may reach.
    hosts: CallbackHosts,
    breakers: Arc<breaker::Breakers>,
    /// To the recorder, with the task's place in the node's capacity, which the recorder
    /// gives up once the outcome is written, and its trace (traces on); each delivery holds
    /// a clone until it has reported.
    outcomes_tx: mpsc::UnboundedSender<(Report, capacity::Hold, Option<TaskTrace>)>,
    /// The claim loop's, woken when a delivery has reported.
    wake: Arc<Notify>,
    failures: Arc<failures::FailureLog>,
    stop: Signal,
}

/// One claimed task's delivery: what its delivery task holds from the claim until it has
/// handed its report to the recorder.
struct Delivery {
    courier: Courier,
    biz: Arc<BizTypeConfig>,
    /// This node's callbacks of the biz type in flight (or waiting for their due time),
    /// this one among them until it has reported.
    in_flight: Arc<AtomicI32>,
    /// Its place in the node's capacity, handed to the recorder with the report.
    hold: capacity::Hold,
    task: lease::Claimed,
    /// When the task is due, by this node's clock.
    due_at: tokio::time::Instant,
    /// It tests the receiver of an open breaker.
    probe: bool,
    /// Where its spans go; None while traces are off.
    trace: Option<TaskTrace>,
}

impl Delivery {
    /// Counts it in flight and starts its delivery task.
    fn start(self) {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        tokio::spawn(self.run());
    }

    /// Waits for the task's due time, then calls back and hands the outcome to the recorder.
    async fn run(self) {
        let Delivery { courier, biz, in_flight, hold, task, due_at, probe, trace } = self;
        let Courier { client, hosts, breakers, outcomes_tx, wake, failures, mut stop } = courier;
        let waited = tokio::select! {
            biased;
            _ = stop.stopping() => false,
            _ = tokio::time::sleep_until(due_at) => true,
        };
        let report = if !waited || stop.is_stopping() {
            // No callback starts once the node is stopping.
            Report::Unstarted { task_id: task.id, run_at: task.run_at, biz_type_id: biz.id }
        } else if let Some(deadline) = task.expires_at.filter(|d| *d <= chrono::Utc::now()) {
            // Claimed ahead, and its deadline came before its due time: no
            // callback starts at or after the deadline (docs/design/contract.md, Tasks by key).
            metrics::not_sent_expired(&biz.name);
            Report::Finished(deliver::not_sent(&biz, &task, deadline))
        } else {
            let (task_id, run_at, attempt) = (task.id, task.run_at, task.attempt_count);
            let (started_at, started) = (chrono::Utc::now(), std::time::Instant::now());
            let delivered = async {
                let (mut outcome, answer) = deliver::deliver(&client, hosts, &biz, task, trace.as_ref()).await;
                breakers.after(&biz, probe, answer, &mut outcome).await;
                outcome
            };
            tokio::select! {
                outcome = delivered => {
                    finished(&biz, &outcome);
                    failures.note(&biz.name, &outcome);
                    Report::Finished(outcome)
                }
                _ = stop.leaving() => Report::CutOff(deliver::cut_off(&biz, task_id, run_at, attempt, started_at, started)),
            }
        };
        let _ = outcomes_tx.send((report, hold, trace));
        in_flight.fetch_sub(1, Ordering::Relaxed);
        wake.notify_one();
    }
}

/// Counts a callback's outcome in the metrics: its duration, its lateness and how it ended.
fn finished(biz: &BizTypeConfig, outcome: &Outcome) {
    let lateness = (outcome.started_at - outcome.run_at).as_seconds_f64();
    let finish = match outcome.verdict {
        Verdict::Delivered => metrics::Finish::Delivered,
        Verdict::RetryAt(_) => metrics::Finish::Retried,
        Verdict::GiveUp => metrics::Finish::Failed,
        Verdict::Snooze(_) => metrics::Finish::Snoozed,
        Verdict::Expire { .. } => metrics::Finish::Expired,
        Verdict::Held(_) => metrics::Finish::Held,
    };
    metrics::finished(&biz.name, f64::from(outcome.duration_ms) / 1000.0, lateness, finish);
}

/// One node's engine: what the claim loop keeps from one turn to the next. `run` takes turns
/// until the node stops; a test can build one and take single turns (`turn`), then wait for
/// what they started (`settled`).
pub struct Engine {
    /// The engine's own sessions (`hot_path` settings), for claims and recording.
    pool: Pool,
    health: Health,
    /// Written into each attempt and each lease.
    node_id: Uuid,
    /// What each delivery takes a clone of; its sender to the recorder is dropped when the
    /// engine finishes.
    courier: Courier,
    /// Woken by: a callback finishing, an outcome recorded, a wake-up notification.
    wake: Arc<Notify>,
    /// Set by a biz type's change on any node: re-read the settings at the next turn.
    settings_changed: Arc<AtomicBool>,
    /// Biz types to look at next turn, whatever `next_look` says.
    looks: Arc<Looks>,
    /// When each biz type is next to be claimed, as far as this node knows (absent: at
    /// once): a biz type with nothing due costs no statement until then.
    next_look: HashMap<i32, tokio::time::Instant>,
    /// When every biz type's next due time was last asked (`sweep`).
    swept_at: Option<tokio::time::Instant>,
    /// No unfinished task is due before this (`lease::unfinished_floor`, read at each
    /// sweep): the claims' lower bound on `run_at`, which prunes the partitions of
    /// finished tasks as each statement starts. None until first read.
    floor: Option<chrono::DateTime<chrono::Utc>>,
    listener: JoinHandle<()>,
    recorder: JoinHandle<Drained>,
    /// Tasks this node holds, per biz type id: claimed and not yet recorded (`capacity`).
    held: HashMap<i32, Arc<AtomicUsize>>,
    /// Their sum, over all biz types.
    held_total: Arc<AtomicUsize>,
    /// The most tasks it holds at once, over all biz types.
    pub capacity: usize,
    /// Turns taken: which biz type wins a tie for the capacity turns with it.
    turns: usize,
    /// Callbacks in flight (or waiting for their due time) on this node, per biz type id:
    /// this node's part of the biz type's cap, which the claim checks across the cluster.
    in_flight: HashMap<i32, Arc<AtomicI32>>,
    /// Leased of each biz type since its last task taken as the longest-due (`OLDEST_SHARE`).
    owed_oldest: HashMap<i32, i64>,
    /// Where the next claim's walk of each biz type's flow keys goes on from (pick_flow.sql).
    flow_cursors: HashMap<i32, String>,
    limiters: rate::Limiters,
    /// Live delivering nodes, re-counted with the settings: a rate limit's divisor.
    delivering_nodes: i64,
    /// This node's place among them (0 for the lowest id): which lanes are its own.
    place: i64,
    /// Biz types whose last claim took all it asked, so that their next one takes a lane
    /// of this node's (`Lanes`): how many lane claims of each have gone before.
    lane_turns: HashMap<i32, u32>,
    /// Biz types a claim lately found with tasks of several priorities due, and until
    /// when their claims take the priority branches at once (`lease::Want::priorities`).
    prioritized: HashMap<i32, tokio::time::Instant>,
    /// Shared with the callbacks in flight, so that starting one copies no settings.
    biz_types: Vec<Arc<BizTypeConfig>>,
    /// When the settings were last read; `None` until the first turn (or `reread_settings`).
    refreshed_at: Option<tokio::time::Instant>,
    /// Biz types left out for a secret this node cannot open, each reported once.
    unopened_reported: HashSet<i32>,
    failures: Arc<failures::FailureLog>,
    /// The receivers' breakers, and Retry-After holds (`breaker`).
    breakers: Arc<breaker::Breakers>,
    stop: Signal,
}

impl Engine {
    /// Opens the engine's sessions and starts its listener and recorder; claims nothing
    /// until the first turn.
    pub fn start(health: Health, node_id: Uuid, hosts: CallbackHosts, stop: Signal) -> Engine {
        install_tls_provider();
        let sessions = health.pool(Route::Sessions, POOL_SIZE, hot_path);
        let pool = Pool::direct(sessions.clone());
        let client = hosts.http_client().pool_idle_timeout(POOL_IDLE).build().expect("an HTTP client with the ring TLS provider");
        let (outcomes_tx, outcomes_rx) = mpsc::unbounded_channel();
        let wake = Arc::new(Notify::new());
        let settings_changed = Arc::new(AtomicBool::new(false));
        let looks = Arc::new(Looks::default());
        let listener = {
            let (wake, settings_changed, looks) = (wake.clone(), settings_changed.clone(), looks.clone());
            tokio::spawn(wake::listen(
                sessions,
                move |why| {
                    match why {
                        Wake::Settings => settings_changed.store(true, Ordering::Relaxed),
                        Wake::DueFor(id) => looks.add(id),
                        Wake::Due => looks.add_all(),
                    }
                    wake.notify_one();
                },
                || (),
            ))
        };
        let to_claims = ClaimLoop { wake: wake.clone(), looks: looks.clone() };
        let recorder = tokio::spawn(recorder::record_outcomes(pool.clone(), health.clone(), node_id, outcomes_rx, to_claims, stop.clone()));
        let breakers = Arc::new(breaker::Breakers::new(pool.clone(), looks.clone()));
        let failures = Arc::new(failures::FailureLog::default());
        let courier =
            Courier { client, hosts, breakers: breakers.clone(), outcomes_tx, wake: wake.clone(), failures: failures.clone(), stop: stop.clone() };
        tracing::info!(%node_id, "delivery engine started");
        Engine {
            pool,
            health,
            node_id,
            courier,
            wake,
            settings_changed,
            looks,
            next_look: HashMap::new(),
            swept_at: None,
            floor: None,
            listener,
            recorder,
            held: HashMap::new(),
            held_total: Arc::default(),
            capacity: DEFAULT_NODE_CAPACITY,
            turns: 0,
            in_flight: HashMap::new(),
            owed_oldest: HashMap::new(),
            flow_cursors: HashMap::new(),
            limiters: rate::Limiters::default(),
            delivering_nodes: 1,
            place: 0,
            lane_turns: HashMap::new(),
            prioritized: HashMap::new(),
            biz_types: Vec::new(),
            refreshed_at: None,
            unopened_reported: HashSet::new(),
            failures,
            breakers,
            stop,
        }
    }

    /// Takes turns until the node stops, sleeping between them as each turn says (or until
    /// woken); then drains (`finish`).
    pub async fn run(mut self) {
        while !self.stop.is_stopping() {
            self.failures.flush(false);
            if self.health.is_down() {
                tokio::select! {
                    () = self.health.came_up() => {}
                    () = self.stop.stopping() => break,
                }
            }
            let Some(sleep) = self.turn().await.sleep else {
                continue;
            };
            tokio::select! {
                _ = tokio::time::sleep(sleep) => {}
                _ = self.wake.notified() => {}
                _ = self.stop.stopping() => {}
            }
        }
        self.finish().await
    }

    /// Makes the next turn re-read the biz types and the live nodes, as a `settings`
    /// notification does (which reaches the engine when its listener gets to it).
    pub fn reread_settings(&mut self) {
        self.refreshed_at = None;
    }

    /// Makes the next turn claim every biz type, as if each were due: for a test that
    /// drives single turns and would otherwise wait for a notification to reach the engine.
    pub fn look_at_every_biz_type(&mut self) {
        self.next_look.clear();
    }

    /// Callbacks started and not yet recorded, over all biz types.
    pub fn unsettled(&self) -> usize {
        self.held_total.load(Ordering::Relaxed)
    }

    /// Waits until every callback started so far has finished and its outcome is written.
    pub async fn settled(&self) {
        loop {
            // A wake between the look and the wait leaves a permit (`notify_one`): not lost.
            let woken = self.wake.notified();
            if self.unsettled() == 0 {
                return;
            }
            woken.await;
        }
    }

    /// One turn: re-reads the settings if they changed or are old, and every biz type's next
    /// due time if a `SWEEP` has passed; then claims, in one statement, what is due (or due
    /// within `CLAIM_AHEAD`) for each biz type whose time has come and that has free slots,
    /// and starts its callbacks. Says how long the loop may sleep before the next turn.
    pub async fn turn(&mut self) -> Turn {
        self.refresh().await;
        let now = tokio::time::Instant::now();
        let room = self.capacity.saturating_sub(self.unsettled());
        // No claim starts once the node is stopping, or while it holds all it may.
        let may_claim = room > 0 && !self.stop.is_stopping();
        let due = if may_claim { self.due(now).await } else { Vec::new() };
        let given = self.share(room, &due);
        let mut next = Next { claimed: 0, more_due: false, caught_up: Vec::new(), rate_wait: IDLE_POLL };
        let (wants, claiming) = self.wants(due, given, now, &mut next.rate_wait);
        // Read only while traces are on: with them off a claim costs nothing more per task.
        let claim_started = crate::traces::tracer().map(|_| SystemTime::now());
        let Some(mut claims) = self.claim(&wants).await else {
            return Turn { claimed: 0, sleep: Some(CAPPED_POLL) };
        };
        // A biz type whose settings changed after this node read them (a secret rotated
        // just before its task was created): read again, so that its callbacks go out
        // with the new ones rather than for up to SETTINGS_REFRESH with the old.
        let stale = |c: &Claiming| claims.get(&c.due.biz.id).and_then(|claim| claim.settings_at).is_some_and(|at| at > c.due.biz.updated_at);
        let fresh: HashMap<i32, Arc<BizTypeConfig>> = if claiming.iter().any(stale) {
            self.refresh_settings().await;
            self.biz_types.iter().map(|b| (b.id, b.clone())).collect()
        } else {
            HashMap::new()
        };
        for mut claiming in claiming {
            if let Some(biz) = fresh.get(&claiming.due.biz.id) {
                claiming.due.biz = biz.clone();
            }
            let claim = claims.remove(&claiming.due.biz.id).unwrap_or_default();
            self.take(claiming, claim, now, claim_started, &mut next);
        }
        self.ask_next_due(&next.caught_up).await;
        if next.more_due {
            return Turn { claimed: next.claimed, sleep: None };
        }
        Turn { claimed: next.claimed, sleep: Some(self.sleep(next.rate_wait)) }
    }

    /// Re-reads the settings if they changed or are old, takes the looks asked for since the
    /// last turn, and asks every biz type's next due time if a `SWEEP` has passed.
    async fn refresh(&mut self) {
        if self.settings_changed.swap(false, Ordering::Relaxed) || self.refreshed_at.is_none_or(|at| at.elapsed() >= SETTINGS_REFRESH) {
            self.refresh_settings().await;
        }
        self.looks.take_into(&mut self.next_look);
        if self.swept_at.is_none_or(|at| at.elapsed() >= SWEEP) {
            self.sweep().await;
        }
    }

    /// The biz types due now, with their counters and free slots (the turn claims for them
    /// if the node's capacity gives them a place). Elects the probes of open breakers.
    async fn due(&mut self, now: tokio::time::Instant) -> Vec<Due> {
        // The open breakers whose probe this node won (a statement only when one is due).
        let probing = self.breakers.elect(&self.biz_types).await;
        let mut due = Vec::new();
        for biz in &self.biz_types {
            // Nothing due yet, as far as this node knows: costs nothing this turn.
            if self.next_look.get(&biz.id).is_some_and(|at| *at > now) {
                continue;
            }
            // Its receiver's breaker is open (only a probe's one task is claimed), or the
            // receiver asked to wait (`breaker`): a look in memory.
            let probe = match self.breakers.gate(biz, now, &probing) {
                breaker::Gate::Claim => false,
                breaker::Gate::Probe => true,
                breaker::Gate::Wait(until) => {
                    self.next_look.insert(biz.id, until);
                    continue;
                }
            };
            let counter = self.in_flight.entry(biz.id).or_default().clone();
            let batch = if probe { 1 } else { CLAIM_BATCH };
            let slots = i64::from(biz.max_in_flight - counter.load(Ordering::Relaxed)).min(batch);
            if slots <= 0 {
                // A finishing callback wakes the loop.
                continue;
            }
            due.push(Due { biz: biz.clone(), counter, slots, probe });
        }
        due
    }

    /// What the node's capacity (`room` free) gives each of the biz types `due`.
    fn share(&mut self, room: usize, due: &[Due]) -> Vec<usize> {
        let claimants: Vec<_> = due
            .iter()
            .map(|d| capacity::Claimant {
                held: self.held.get(&d.biz.id).map_or(0, |n| n.load(Ordering::Relaxed)),
                weight: d.biz.weight.max(1) as u32,
                wants: d.slots as usize,
            })
            .collect();
        self.turns = self.turns.wrapping_add(1);
        capacity::share(room, &claimants, self.turns)
    }

    /// What the claim asks of each biz type due, once its place in the node's capacity
    /// (`given`) and its rate limit have had their say: the claim's wants, and the biz types
    /// in them. One held back by its rate limit is looked at when the limit allows, and
    /// `rate_wait` is no later than that.
    fn wants(&mut self, due: Vec<Due>, given: Vec<usize>, now: tokio::time::Instant, rate_wait: &mut Duration) -> (Vec<lease::Want>, Vec<Claiming>) {
        let (mut wants, mut claiming) = (Vec::new(), Vec::new());
        for (due, given) in due.into_iter().zip(given) {
            if given == 0 {
                // The node holds all it may: a recorded outcome frees a place and wakes the loop.
                continue;
            }
            let biz = &due.biz;
            let share = biz.rate_limit.map(|r| r / self.delivering_nodes as f64);
            let (free, wait) = self.limiters.take(biz.id, share, given as i64);
            if free == 0 {
                let wait = wait.unwrap_or(IDLE_POLL);
                self.next_look.insert(biz.id, now + wait);
                *rate_wait = (*rate_wait).min(wait);
                continue;
            }
            let lease_ms = i64::from(biz.timeout_ms) + LEASE_MARGIN_MS;
            // A rate-limited biz type claims only what is due: a task claimed ahead would
            // take its permit early and could fire together with later permits.
            let ahead_ms = if share.is_some() || due.probe { 0 } else { CLAIM_AHEAD.as_millis() as i64 };
            let oldest = (self.owed_oldest.get(&biz.id).copied().unwrap_or(0) + free) / OLDEST_SHARE;
            let flow = biz.flow().map(|(cap, ordered, rate)| lease::FlowWant { cap, ordered, rate, cursor: self.flow_cursors.get(&biz.id).cloned() });
            // Per-key limits pick by key (pick_flow.sql), in no lane.
            let lane = match flow {
                Some(_) => None,
                None => self.lane_turns.get(&biz.id).and_then(|turn| Lanes { nodes: self.delivering_nodes, place: self.place }.lane(*turn)),
            };
            let priorities = self.prioritized.get(&biz.id).is_some_and(|until| *until > now);
            wants.push(lease::Want { biz_type_id: biz.id, limit: free, ahead_ms, lease_ms, oldest, lane, flow, priorities });
            claiming.push(Claiming { due, free, wait, oldest, lane });
        }
        (wants, claiming)
    }

    /// Claims `wants` in one statement (none when empty). None when the claim failed: the
    /// turn ends, and the loop tries again after `CAPPED_POLL`.
    async fn claim(&self, wants: &[lease::Want]) -> Option<HashMap<i32, lease::Claim>> {
        if wants.is_empty() {
            return Some(HashMap::new());
        }
        match lease::claim(&self.pool, wants, self.node_id, self.floor).await {
            Ok(claims) => Some(claims),
            Err(e) => {
                // An unreachable database is reported once, by `health`.
                if !self.health.saw(&e) {
                    tracing::warn!(error = %e, biz_types = wants.len(), "claim failed; retrying");
                }
                None
            }
        }
    }

    /// Takes what the claim gave one biz type: notes in `next` (and in `next_look`) what it
    /// says of the biz type's next claim, and starts a delivery for each task leased.
    /// `claim_started`: when the claim statement started, while traces are on (each task's
    /// claim span).
    fn take(&mut self, claiming: Claiming, claim: lease::Claim, now: tokio::time::Instant, claim_started: Option<SystemTime>, next: &mut Next) {
        let Claiming { due: Due { biz, counter, slots, probe }, free, wait, oldest, lane } = claiming;
        let lease::Claim { leased: claimed, expired, capped, cursor, prioritized, .. } = claim;
        if prioritized {
            self.prioritized.insert(biz.id, now + PRIORITIZED_FOR);
        }
        match cursor {
            Some(cursor) => self.flow_cursors.insert(biz.id, cursor),
            None => self.flow_cursors.remove(&biz.id),
        };
        // Counted by what was leased: the longest-due came first in it (claim.sql).
        let took = (claimed.len() + expired) as i64;
        // A claim that took all it asked leaves a backlog: the next takes a lane, then the
        // next lane, while they come back full. One that came back short goes back to the
        // whole biz type, which also takes what other nodes' lanes hold (stealing).
        if took == free && !capped && !probe {
            *self.lane_turns.entry(biz.id).or_default() += u32::from(lane.is_some());
        } else {
            self.lane_turns.remove(&biz.id);
        }
        let owed = self.owed_oldest.entry(biz.id).or_default();
        *owed = (*owed + took - OLDEST_SHARE * oldest.min(took)).max(0);
        metrics::expired(&biz.name, expired as u64);
        if capped {
            // Every slot of the cluster is taken: this node is woken when one of its own
            // callbacks ends, not when another node's does, so it looks again soon.
            self.next_look.insert(biz.id, now + CAPPED_POLL);
            next.rate_wait = next.rate_wait.min(CAPPED_POLL);
        } else if took < free && lane.is_some() {
            // Only its lane ran short: the next claim reads the whole biz type at once.
            next.more_due = true;
        } else if took < free {
            next.caught_up.push(biz.id);
        } else if free == slots {
            next.more_due = true;
        } else if let Some(wait) = wait {
            // Stopped by the rate limit with more due: come back when it allows.
            self.next_look.insert(biz.id, now + wait);
            next.rate_wait = next.rate_wait.min(wait);
        }
        if !claimed.is_empty() {
            metrics::claimed(&biz.name, claimed.len());
        }
        next.claimed += claimed.len();
        let received = tokio::time::Instant::now();
        let held = self.held.entry(biz.id).or_default().clone();
        for task in claimed {
            let due_at = received + (task.run_at - task.db_now).to_std().unwrap_or_default();
            let hold = capacity::Hold::take(&held, &self.held_total);
            let trace = claim_started.and_then(|at| TaskTrace::claimed(&biz, &task, at));
            Delivery { courier: self.courier.clone(), biz: biz.clone(), in_flight: counter.clone(), hold, task, due_at, probe, trace }.start();
        }
    }

    /// Asks when each of the biz types that `caught_up` (claimed all that was due) is next
    /// due: one statement for all of them. If that fails they are looked at after `CAPPED_POLL`.
    async fn ask_next_due(&mut self, caught_up: &[i32]) {
        if caught_up.is_empty() {
            return;
        }
        match lease::next_due_each(&self.pool, caught_up, None, self.floor).await {
            Ok(next) => self.note_next_due(&next),
            Err(e) => {
                if !self.health.saw(&e) {
                    tracing::warn!(error = %e, "could not ask for the next due task");
                }
                let again = tokio::time::Instant::now() + CAPPED_POLL;
                self.next_look.extend(caught_up.iter().map(|id| (*id, again)));
            }
        }
    }

    /// How long the loop may sleep after a turn with nothing more due at once: until the
    /// first biz type with free slots is next due, the next sweep, or `rate_wait`.
    fn sleep(&self, rate_wait: Duration) -> Duration {
        let now = tokio::time::Instant::now();
        let mut until = self.swept_at.map_or(now, |at| at + SWEEP).min(now + rate_wait);
        // While the node holds all it may, a recorded outcome wakes it.
        if self.unsettled() < self.capacity {
            for biz in &self.biz_types {
                let busy = self.in_flight.get(&biz.id).is_some_and(|n| n.load(Ordering::Relaxed) >= biz.max_in_flight);
                if !busy {
                    until = until.min(self.next_look.get(&biz.id).copied().unwrap_or(now));
                }
            }
        }
        until.saturating_duration_since(now)
    }

    /// Asks when every biz type is next due within a `SWEEP` (one statement, an index probe
    /// each): the fallback for what no notification announced, such as a task created two
    /// seconds ahead, a lease recovered or a notification lost.
    async fn sweep(&mut self) {
        match lease::unfinished_floor(&self.pool).await {
            Ok(floor) => self.floor = Some(floor),
            // The last one read is still true (it only rises); none yet: no bound.
            Err(e) => {
                if !self.health.saw(&e) {
                    tracing::warn!(error = %e, "could not read the unfinished tasks' floor");
                }
            }
        }
        let ids: Vec<i32> = self.biz_types.iter().map(|b| b.id).collect();
        match lease::next_due_each(&self.pool, &ids, Some(SWEEP + CLAIM_AHEAD), self.floor).await {
            Ok(next) => {
                self.note_next_due(&next);
                self.swept_at = Some(tokio::time::Instant::now());
            }
            Err(e) => {
                if !self.health.saw(&e) {
                    tracing::warn!(error = %e, "could not ask when the biz types are next due");
                }
                // Claim them all rather than wait for what was not found out.
                self.next_look.clear();
            }
        }
    }

    /// Notes when each biz type is next due, by this node's clock (None: nothing within
    /// what was asked, so not before the next sweep or notification). A biz type that
    /// claims ahead is looked at half the claim-ahead window before: each claim then takes
    /// half a window of tasks, and none waits for its claim.
    fn note_next_due(&mut self, next: &[(i32, Option<chrono::DateTime<chrono::Utc>>)]) {
        let (now, utc_now) = (tokio::time::Instant::now(), chrono::Utc::now());
        let rate_limited: HashSet<i32> = self.biz_types.iter().filter(|b| b.rate_limit.is_some()).map(|b| b.id).collect();
        for (id, next) in next {
            let at = match next {
                Some(next) => {
                    let early = if rate_limited.contains(id) { Duration::ZERO } else { CLAIM_AHEAD / 2 };
                    now + (*next - utc_now).to_std().unwrap_or_default().saturating_sub(early)
                }
                None => now + NOTHING_DUE,
            };
            self.next_look.insert(*id, at);
        }
    }

    /// Re-reads the biz types to deliver and the live delivering nodes.
    async fn refresh_settings(&mut self) {
        match active_biz_types(&self.pool).await {
            Ok((list, unopened)) => {
                for (id, e) in &unopened {
                    if self.unopened_reported.insert(*id) {
                        tracing::error!("{e}; its tasks are not delivered by this node");
                    }
                }
                self.unopened_reported.retain(|id| unopened.iter().any(|(u, _)| u == id));
                // One paused or left out meanwhile starts afresh when it is back.
                let listed: HashSet<i32> = list.iter().map(|b| b.id).collect();
                self.next_look.retain(|id, _| listed.contains(id));
                self.owed_oldest.retain(|id, _| listed.contains(id));
                self.flow_cursors.retain(|id, _| listed.contains(id));
                self.lane_turns.retain(|id, _| listed.contains(id));
                self.prioritized.retain(|id, _| listed.contains(id));
                *self.looks.flows.lock().unwrap_or_else(std::sync::PoisonError::into_inner) =
                    list.iter().filter(|b| b.flow().is_some()).map(|b| b.id).collect();
                self.biz_types = list.into_iter().map(Arc::new).collect();
                self.refreshed_at = Some(tokio::time::Instant::now());
            }
            Err(e) => tracing::warn!(error = %e, "could not read biz types; retrying"),
        }
        // The breakers with them: one that closed is claimed at once.
        match self.breakers.sync(&self.biz_types).await {
            Ok(closed) => {
                for id in closed {
                    self.next_look.remove(&id);
                }
            }
            Err(e) => tracing::warn!(error = %e, "could not read the receivers' breakers; retrying"),
        }
        match nodes::delivering_place(&self.pool, self.node_id).await {
            Ok((count, place)) => (self.delivering_nodes, self.place) = (count, place),
            Err(e) => tracing::warn!(error = %e, "could not count the live nodes"),
        }
    }

    /// The end of the engine's life: claims no more, lets each delivery task give back or
    /// finish its task (cut off once the grace is over), and waits until every outcome is
    /// recorded. Call it once the node is stopping (`run` does), or delivery tasks still
    /// waiting for their due time keep it waiting.
    pub async fn finish(self) {
        let held: i32 = self.in_flight.values().map(|n| n.load(Ordering::Relaxed)).sum();
        tracing::info!(
            tasks = held,
            "delivery engine stopping: the node is stopping, so no claim and no callback starts; \
             tasks claimed ahead go back to pending, callbacks in flight may finish within the grace"
        );
        self.listener.abort();
        drop(self.courier);
        // The recorder ends when every delivery task has sent its report and dropped its sender.
        let drained = self.recorder.await.unwrap_or_default();
        self.failures.flush(true);
        self.pool.close().await;
        if drained.cut_off > 0 {
            tracing::warn!(
                cut_off = drained.cut_off,
                "callbacks still in flight when the shutdown grace ran out were cut off; their tasks are pending \
                 again for another node (raise CHIME_SHUTDOWN_GRACE_SECS above the slowest receiver's answer time)"
            );
        }
        tracing::info!(finished = drained.finished, given_back = drained.given_back, cut_off = drained.cut_off, "delivery engine stopped");
    }
}

/// The settings of the engine's own sessions, on which the planner may not scan a partition
/// sequentially. Its statements touch a few rows by index; but a partition last analysed
/// while nearly empty, then filled by a burst, makes a full scan look cheaper, and each
/// claim and each recorded batch would then read the whole partition (measured: a 50,000
/// task burst fell from 15,000 to 4,900 tasks/s).
///
/// Their prepared statements keep one generic plan. A custom plan is planned anew at every
/// execution, over every retained partition of `tasks` and each of their indexes: with 30
/// daily partitions that took 2-3 ms of a claim's 5 ms (12 ms on a session's first), and
/// as long again for each recorded batch. The generic plans are the custom ones less what
/// only the parameters' values could give: the partitions are still pruned when the
/// statement starts and as it runs (issue 21: a burst on 30 days of retained partitions
/// went from 40% of the empty table's rate to 61-71%). Session settings: in pooler mode these
/// sessions take the direct URL.
fn hot_path(options: PgConnectOptions) -> PgConnectOptions {
    options.options([("jit", "off"), ("enable_seqscan", "off"), ("enable_bitmapscan", "off"), ("plan_cache_mode", "force_generic_plan")])
}

/// The engine's pool size.
const POOL_SIZE: u32 = 4;

/// How long a connection to a receiver is kept idle for the next callback: under the 5 s
/// after which Node.js, actix-web, Apache and uvicorn close an idle one, so that chime
/// drops it first rather than send on it as the receiver closes it (`deliver::send` sends
/// again once when that happens anyway).
const POOL_IDLE: Duration = Duration::from_secs(4);
