//! The leader: one node at a time does the cluster's housekeeping (docs/design/contract.md, Leader).
//!
//! Election. Every node keeps one database session of its own (not from the pool) and
//! asks for a PostgreSQL advisory lock on it every second; the node that gets it leads.
//! A leader that dies loses its session and with it the lock at once. A leader that hangs
//! or is cut off stops pinging its session, and the server ends the session after
//! `idle_session_timeout` (the leader lease, `CHIME_LEADER_LEASE_SECS`), so another node
//! takes over within the lease plus a second. The leader itself steps down as soon as a
//! ping fails or takes more than half the lease.
//!
//! The duties do not rely on leadership being exclusive, only made efficient by it: each
//! is safe if two nodes ran it at once (partition DDL under an advisory lock, cold moves
//! and lease recovery with `SKIP LOCKED`, timer occurrences under a row lock and a unique
//! key). So a deposed leader finishing its last step, or a test calling a duty directly,
//! cannot lose or double a task.

use std::sync::Arc;
use std::time::Duration;

use crate::db::Pool;
use sqlx::{Connection, PgConnection};
use tokio::time::Instant;
use uuid::Uuid;

use crate::lifecycle::Signal;
use crate::partitions::{self, Layout};
use crate::{metrics, tasks, timers};

/// The advisory lock whose holder leads.
const LEADER_LOCK: i64 = 0x6368_696d_656c; // "chimel"
/// How often a follower asks for the lock.
const TRY_EVERY: Duration = Duration::from_secs(1);
/// The leader's housekeeping tick; timers and lease recovery run every tick.
const TICK: Duration = Duration::from_secs(1);
const PARTITIONS_EVERY: Duration = Duration::from_secs(60);
const RETENTION_EVERY: Duration = Duration::from_secs(600);
const SWEEP_EVERY: Duration = Duration::from_secs(10);
/// How often the migrator looks for cold tasks inside the horizon when it found none.
const MIGRATE_EVERY: Duration = Duration::from_secs(5);

#[derive(Debug, Clone)]
pub struct Settings {
    /// Partition width, how far ahead they are made (the hot horizon) and retention.
    pub layout: Layout,
    /// How long a silent leader keeps the lock.
    pub lease: Duration,
    /// How far ahead timer occurrences are written.
    pub timer_window: Duration,
    /// Cold tasks moved per statement.
    pub migrate_batch: i64,
}

/// The `application_name` of the session that holds (or asks for) the lock, which is how
/// any node can tell who leads.
fn session_name(node_id: Uuid) -> String {
    format!("chime node {node_id}")
}

/// The node holding the leader lock, if any.
pub async fn current(pool: &Pool) -> Result<Option<Uuid>, sqlx::Error> {
    // A bigint advisory key shows in pg_locks as classid (high half), objid (low half), objsubid 1.
    crate::db::query_scalar(
        "SELECT split_part(a.application_name, ' ', 3)::uuid
           FROM pg_locks l
           JOIN pg_stat_activity a ON a.pid = l.pid
          WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
            AND l.classid = ($1 >> 32)::oid AND l.objid = ($1 & 4294967295)::oid
            AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
            AND a.application_name LIKE 'chime node %'",
    )
    .bind(LEADER_LOCK)
    .fetch_optional(pool)
    .await
}

/// How long the election session may be refused before a warning says so.
const REFUSED_WARN_AFTER: Duration = Duration::from_secs(10);

/// Runs for the node's lifetime: waits for leadership, leads, and waits again if it loses
/// it. When the node stops, a leader lets the lock go at once, so another node leads
/// within a second (its next try) rather than after the lease.
/// `sessions` is the pool for the election session (the direct URL's in pooler mode).
pub async fn run(pool: Pool, sessions: sqlx::PgPool, node_id: Uuid, settings: Settings, node_metrics: Arc<metrics::Node>, mut stop: Signal) {
    node_metrics.leading(false);
    let mut session: Option<PgConnection> = None;
    // Since when the election session cannot be opened, and whether that was said: a
    // database that is briefly down is reported elsewhere, but a session refused for long
    // (a setting the server rejects, too few connections) means no node may lead.
    let mut refused_since: Option<(Instant, bool)> = None;
    loop {
        if session.is_none() {
            session = match connect(&sessions, node_id, settings.lease).await {
                Ok(conn) => {
                    if let Some((_, true)) = refused_since.take() {
                        tracing::info!("the leader election session is open again");
                    }
                    Some(conn)
                }
                Err(e) => {
                    let (since, said) = refused_since.get_or_insert((Instant::now(), false));
                    if !*said && since.elapsed() >= REFUSED_WARN_AFTER {
                        *said = true;
                        tracing::warn!(error = %e, "cannot open the leader election session for {} s: this node cannot lead until it can; retrying", REFUSED_WARN_AFTER.as_secs());
                    } else {
                        tracing::debug!(error = %e, "cannot open the leader election session; retrying");
                    }
                    None
                }
            };
        }
        if let Some(conn) = session.as_mut() {
            // Advisory locks work on a standby too: a node whose session outlived a demotion
            // must not "lead" there while the primary has no leader.
            let lock = "SELECT CASE WHEN pg_is_in_recovery() THEN NULL ELSE pg_try_advisory_lock($1) END";
            match crate::db::query_scalar::<Option<bool>>(lock).bind(LEADER_LOCK).fetch_one(&mut *conn).await {
                Ok(Some(true)) => {
                    let conn = session.take().expect("session is open");
                    tracing::info!(%node_id, "this node is now the leader");
                    node_metrics.leading(true);
                    let reason = lead(conn, &pool, &sessions, &settings, &mut stop).await;
                    node_metrics.leading(false);
                    tracing::info!(%node_id, reason, "this node no longer leads; the leader lock is released");
                }
                Ok(Some(false)) => {}
                Ok(None) => {
                    tracing::debug!("the leader election session is on a standby; reconnecting");
                    session = None;
                }
                Err(e) => {
                    tracing::debug!(error = %e, "leader election session failed; reconnecting");
                    session = None;
                }
            }
        }
        if stop.is_stopping() {
            break;
        }
        tokio::select! {
            _ = tokio::time::sleep(TRY_EVERY) => {}
            _ = stop.stopping() => break,
        }
    }
    tracing::info!(%node_id, "leader election stopped: the node is stopping");
}

/// A session of its own, taken from the sessions pool so that it goes to the server that
/// accepts writes (the pool checks each new session), and kept out of the pool.
async fn connect(sessions: &sqlx::PgPool, node_id: Uuid, lease: Duration) -> Result<PgConnection, sqlx::Error> {
    let mut conn = sessions.acquire().await?.detach();
    // The server ends this session, releasing the lock, when the leader falls silent.
    crate::db::query("SELECT set_config('application_name', $1, false), set_config('idle_session_timeout', $2, false)")
        .bind(session_name(node_id))
        .bind(lease.as_millis().to_string())
        .execute(&mut conn)
        .await?;
    Ok(conn)
}

/// Leads until the session fails or the node stops; returns why it stopped.
async fn lead(mut session: PgConnection, pool: &Pool, sessions: &sqlx::PgPool, settings: &Settings, stop: &mut Signal) -> &'static str {
    // The migrator and index builds run beside the other duties, so a large move or build
    // never delays timers or lease recovery.
    let duties = [
        tokio::spawn(housekeeping(pool.clone(), settings.clone())),
        tokio::spawn(migrate(pool.clone(), settings.migrate_batch)),
        tokio::spawn(complete_indexes_every(Pool::direct(sessions.clone()))),
    ];
    let mut ping = tokio::time::interval((settings.lease / 4).max(Duration::from_millis(250)));
    let reason = loop {
        tokio::select! {
            _ = ping.tick() => {
                let ping = crate::db::query_scalar::<bool>("SELECT pg_is_in_recovery()").fetch_one(&mut session);
                match tokio::time::timeout(settings.lease / 2, ping).await {
                    Ok(Ok(false)) => {}
                    Ok(Ok(true)) => break "its database server is in recovery (a standby now)",
                    Ok(Err(_)) => break "its database session failed",
                    Err(_) => break "its database session did not answer within half the leader lease",
                }
            }
            _ = stop.stopping() => break "the node is stopping",
        }
    };
    for duty in duties {
        duty.abort();
        let _ = duty.await;
    }
    // Closing the session releases the lock now rather than when the server notices.
    let _ = tokio::time::timeout(Duration::from_secs(1), session.close()).await;
    reason
}

fn due(last: Option<Instant>, every: Duration) -> bool {
    last.is_none_or(|at| at.elapsed() >= every)
}

/// The leader's duties, each on its own period, until aborted.
async fn housekeeping(pool: Pool, s: Settings) {
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut duties = Duties::new(pool, s);
    loop {
        tick.tick().await;
        duties.run_once().await;
    }
}

/// The housekeeping duties and when each last ran. The leader runs them once a tick
/// (`run_once`); a test can run one tick, or call a single duty, whenever it likes. Each
/// duty logs its own failure and carries on: the next tick (or period) retries it.
pub struct Duties {
    pool: Pool,
    settings: Settings,
    /// When partitions were last ensured (`PARTITIONS_EVERY`); `None`: at the next tick.
    partitioned: Option<Instant>,
    /// When partitions past retention were last dropped (`RETENTION_EVERY`).
    retired: Option<Instant>,
    /// When the fallback sweep last ran (`SWEEP_EVERY`).
    swept: Option<Instant>,
}

impl Duties {
    /// Duties that have never run: the first tick runs every one of them.
    pub fn new(pool: Pool, settings: Settings) -> Duties {
        Duties { pool, settings, partitioned: None, retired: None, swept: None }
    }

    /// One tick: timers, lease recovery and expiry every time, the other duties when their period
    /// has passed. Moving cold tasks is not among them: it runs beside the tick (`move_cold`).
    pub async fn run_once(&mut self) {
        let (pool, s) = (&self.pool, &self.settings);
        if due(self.partitioned, PARTITIONS_EVERY) {
            self.partitioned = Some(Instant::now());
            ensure_partitions(pool, &s.layout).await;
        }
        materialize_timers(pool, s.timer_window).await;
        recover_leases(pool).await;
        expire_overdue(pool).await;
        if due(self.swept, SWEEP_EVERY) {
            self.swept = Some(Instant::now());
            sweep_and_cancel_archived(pool).await;
        }
        if due(self.retired, RETENTION_EVERY) {
            // Also after a failure: retiring takes short exclusive locks, not to be retried every tick.
            self.retired = Some(Instant::now());
            retire_partitions(pool, &s.layout).await;
        }
    }
}

/// Creates the partitions up to the horizon (every `PARTITIONS_EVERY`).
pub async fn ensure_partitions(pool: &Pool, layout: &Layout) {
    if let Err(e) = partitions::ensure(pool, layout).await {
        tracing::warn!(error = %e, "could not create partitions; will retry in a minute");
    }
}

/// Completes the partitioned indexes of tasks and attempts a migration made `ON ONLY`
/// (`partitions::complete_indexes`), at once and then every `PARTITIONS_EVERY`. Beside the
/// tick, like the migrator: building an index on a large partition takes minutes, during
/// which timers and lease recovery must go on. `direct` reaches PostgreSQL itself (the
/// build holds a session lock, which a pooler in transaction mode would not keep).
async fn complete_indexes_every(direct: Pool) {
    loop {
        complete_indexes(&direct).await;
        tokio::time::sleep(PARTITIONS_EVERY).await;
    }
}

/// One pass of `complete_indexes_every`; returns how many partition indexes it built.
pub async fn complete_indexes(direct: &Pool) -> u32 {
    match partitions::complete_indexes(direct).await {
        Ok(built) => built,
        Err(e) => {
            tracing::warn!(error = %e, "could not complete the partitioned indexes of tasks and attempts; will retry in a minute");
            0
        }
    }
}

/// Writes the timers' occurrences due within `window` as tasks (every tick).
pub async fn materialize_timers(pool: &Pool, window: Duration) {
    let started = Instant::now();
    let written = timers::materialize_due(pool, window).await;
    metrics::timers_materialized(started.elapsed().as_secs_f64());
    match written {
        Ok(0) => {}
        Ok(n) => metrics::housekeeping(0, n, 0),
        Err(e) => tracing::warn!(error = %e, "could not write timer occurrences; retrying"),
    }
}

/// Puts running tasks whose lease expired back to pending (every tick); returns how many.
pub async fn recover_leases(pool: &Pool) -> u64 {
    match tasks::lease::recover_expired_leases(pool).await {
        Ok(swept) if swept.tasks == 0 => 0,
        Ok(swept) => {
            metrics::expired_each(&swept.expired);
            let n = swept.tasks;
            tracing::warn!(tasks = n, "recovered tasks whose lease expired; they will be delivered again");
            n
        }
        Err(e) => {
            tracing::warn!(error = %e, "could not recover expired leases");
            0
        }
    }
}

/// Tasks ended `expired` per statement of the expiry sweep: a short transaction, so that
/// a burst of deadlines (a paused biz type's backlog) never holds many row locks at once.
const EXPIRE_BATCH: i64 = 1_000;

/// Ends `expired` the pending tasks whose deadline passed without a claim (every tick):
/// held back by a pause, a backlog, a rate limit, or a pull biz type nobody reserves from.
/// Batch after batch while full ones come back; returns how many.
pub async fn expire_overdue(pool: &Pool) -> u64 {
    let mut total = 0;
    loop {
        match tasks::lease::expire_overdue(pool, EXPIRE_BATCH).await {
            Ok(swept) => {
                metrics::expired_each(&swept.expired);
                let n = swept.tasks;
                total += n;
                if n < EXPIRE_BATCH as u64 {
                    break;
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "could not end the tasks past their deadline; retrying at the next tick");
                break;
            }
        }
    }
    if total > 0 {
        tracing::info!(tasks = total, "tasks not delivered before their deadline ended expired");
    }
    total
}

/// The fallback sweep (`sweep`), then the pending tasks of archived biz types cancelled
/// (every `SWEEP_EVERY`).
pub async fn sweep_and_cancel_archived(pool: &Pool) {
    if let Err(e) = sweep(pool).await {
        tracing::warn!(error = %e, "fallback sweep failed");
    }
    match tasks::cancel_archived(pool, None).await {
        Ok(0) => {}
        Ok(n) => tracing::info!(tasks = n, "cancelled tasks left pending in archived biz types"),
        Err(e) => tracing::warn!(error = %e, "could not cancel the pending tasks of archived biz types"),
    }
}

/// Drops the partitions past retention whose tasks are all finished (every `RETENTION_EVERY`).
pub async fn retire_partitions(pool: &Pool, layout: &Layout) {
    match partitions::retire(pool, layout).await {
        Ok(dropped) => metrics::housekeeping(0, 0, dropped.len() as u64),
        Err(e) => tracing::warn!(error = %e, "could not drop partitions past retention; will retry in 10 minutes"),
    }
}

/// Moves cold tasks into the hot partitions as the horizon passes them, one batch per
/// transaction, back to back while any are left.
async fn migrate(pool: Pool, batch: i64) {
    loop {
        move_cold(&pool, batch).await;
        tokio::time::sleep(MIGRATE_EVERY).await;
    }
}

/// One pass of the migrator: moves the cold tasks inside the horizon, `batch` per
/// transaction, until none is left; returns how many moved.
pub async fn move_cold(pool: &Pool, batch: i64) -> u64 {
    let started = Instant::now();
    let mut total = 0;
    let outcome = loop {
        match tasks::placement::move_cold(pool, batch).await {
            Ok(moved) => {
                total += moved;
                if moved < batch as u64 {
                    break Ok(());
                }
            }
            Err(e) => break Err(e),
        }
    };
    if total > 0 {
        metrics::housekeeping(total, 0, 0);
        let secs = started.elapsed().as_secs_f64();
        tracing::info!(tasks = total, secs, per_sec = (total as f64 / secs) as u64, "moved cold tasks into the hot partitions");
    }
    if let Err(e) = outcome {
        tracing::warn!(error = %e, "could not move cold tasks into the hot partitions; retrying");
    }
    total
}

/// The fallback for what should never happen: a pending task overdue by more than a
/// minute in a biz type that is delivered by callback and not paused. Logs it and wakes
/// every engine (a lost notification would otherwise cost only the engine's poll, so a
/// task this late means an engine is stuck or no node delivers).
async fn sweep(pool: &Pool) -> Result<(), sqlx::Error> {
    let overdue = tasks::stats::overdue(pool).await?;
    if !overdue.is_empty() {
        for (biz_type, run_at) in &overdue {
            tracing::warn!(biz_type, oldest_due = %run_at, "pending tasks are more than a minute overdue; waking the engines");
        }
        crate::wake::notify(pool, crate::wake::Wake::Due).await?;
    }
    Ok(())
}
