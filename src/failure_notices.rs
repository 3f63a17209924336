//! Failure notices (docs/design/contract.md, Notices and signatures): when a task ends `failed` or `expired` in a biz type with a
//! `failure_url`, chime POSTs a signed notice there, retried like a callback. Every
//! statement on `failure_notices` is in this module, except the inserts, which are in the
//! statements that end tasks or move a receiver's breaker (`engine::breaker`) (`tasks/sql/record_tasks.sql`, `recover_leases.sql`, the
//! expiry sweep): a notice is made in the same statement as the end of its task, so none is
//! lost and none is made for a task that did not end.
//!
//! States. `pending` (due at `due_at`) → `running` (held by `held_by` until `due_at`, its
//! biz type's timeout plus a margin) → `delivered`, `pending` again at the backoff (or the
//! receiver's `Retry-After`), or `failed` once the biz type's `max_attempts` are used up or
//! the receiver answered a permanent error.
//!
//! Every node with an engine runs a sender. Each turn claims due notices, `FOR UPDATE SKIP
//! LOCKED`, so nodes never wait for one another nor take the same notice; a notice still
//! `running` past its hold was left by a sender that died or lost the database, and is
//! claimed again: at least once, never lost (a receiver deduplicates on `Chime-Notice-Id`).
//! Only the holder records a result. Senders poll (`POLL`) rather than being woken: a
//! notice is news of a task that has failed for good, where half a second does not matter,
//! and polling needs no notification from every statement that ends a task.
//!
//! Isolation. Biz types do not wait on one another's receivers, as their callbacks do not:
//! the loop claims again at each poll while earlier notices are still being sent, and a biz
//! type has at most `PER_BIZ_TYPE` notices in flight on a node, so a failure receiver that
//! hangs holds that many sends of its own biz type, never a slot of another's. (Before, a
//! turn sent a batch and waited for its slowest: a receiver taking 45 s delayed every other
//! biz type's notices by as much.)
//!
//! A paused biz type's notices are still sent: a pause holds its tasks back, not the news
//! of those that failed. An archived one's are not (nothing of it is delivered); they are
//! left pending.
//!
//! The body is `{"event", "task", "last_attempt"}`: the task as `GET /api/v1/tasks/{id}`
//! shows it (without its attempts) and its last attempt, or null (an expired task may have
//! none).
//!
//! A biz type's own notices, `biz_type.receiver_down` and `biz_type.receiver_up`, are rows
//! of the same table without a task, made by the transaction that opens or closes its
//! receiver's breaker (`engine::breaker`) and sent, retried and signed the same way; their
//! body is `{"event", "biz_type", "breaker"}` (`detail`, written with the row) and they carry
//! no `Chime-Task-Id`. It is sent by the callback's own code (`engine::deliver::post`): the same
//! signature (both `v1` during a rotation's overlap), redirects, deny list and answers.
//!
//! The sender also sends the biz types' chat notices (`chat_notices`): each poll claims the
//! chat channels with a message due and sends each as a task of its own, not counted
//! against `PER_BIZ_TYPE`, so that a chat webhook that hangs holds neither a failure notice
//! nor another biz type's message.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use tokio::task::JoinSet;
use uuid::Uuid;

use crate::callback_hosts::CallbackHosts;
use crate::chat_notices::{self, Pace};
use crate::db::{Health, Pool};
use crate::engine::BizTypeConfig;
use crate::engine::deliver;
use crate::error::Error;
use crate::lifecycle::Signal;
use crate::tasks::lease::Verdict;
use crate::{metrics, tasks};

/// Longest wait before looking for due notices again: one indexed probe per biz type with
/// notices due, twice a second per node.
const POLL: Duration = Duration::from_millis(500);
/// Most notices claimed in one turn.
const CLAIM_BATCH: i64 = 50;
/// Most notices of one biz type a node sends at once: what a hanging failure receiver can
/// hold up, of its own biz type's notices only.
const PER_BIZ_TYPE: i64 = 10;
/// Added to the biz type's timeout to make a sender's hold on a notice: time to record
/// the result. Longer costs a dead node's notices that much delay.
const HOLD_MARGIN_MS: i64 = 5_000;
/// Sessions of the sender's own pool: one claims or records while others send.
const POOL_SIZE: u32 = 2;

/// A notice as the console shows it with its task.
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct Notice {
    pub id: Uuid,
    /// `task.failed` or `task.expired`.
    pub event: String,
    /// `pending`, `running`, `delivered` or `failed`.
    pub status: String,
    pub attempt_count: i32,
    /// When it is next sent (pending), or until when its sender holds it (running).
    pub due_at: DateTime<Utc>,
    pub last_status_code: Option<i16>,
    pub last_error: Option<String>,
    pub created_at: DateTime<Utc>,
    /// When it was delivered or failed for good.
    pub finished_at: Option<DateTime<Utc>>,
}

/// The notices of a task, oldest first (a task replayed and failed again has one per end).
pub async fn for_task<'e>(db: impl sqlx::PgExecutor<'e>, task_id: Uuid) -> Result<Vec<Notice>, Error> {
    Ok(crate::db::query_as::<Notice>(
        "SELECT id, event, status, attempt_count, due_at, last_status_code, last_error, created_at, finished_at
           FROM failure_notices WHERE task_id = $1 ORDER BY created_at",
    )
    .bind(task_id)
    .fetch_all(db)
    .await?)
}

/// Deletes the notices delivered or failed before `before` (retention: their tasks are
/// retired by then). Returns how many.
pub async fn forget_finished(pool: &Pool, before: DateTime<Utc>) -> Result<u64, sqlx::Error> {
    // Locks the rows it deletes; a finished notice is never written again.
    Ok(crate::db::query("DELETE FROM failure_notices WHERE status IN ('delivered', 'failed') AND finished_at < $1")
        .bind(before)
        .execute(pool)
        .await?
        .rows_affected())
}

/// A notice this node holds, with its biz type's settings as they are now.
#[derive(sqlx::FromRow)]
struct Claimed {
    notice_id: Uuid,
    /// None for a biz type's notice (`biz_type.receiver_down`, `biz_type.receiver_up`).
    task_id: Option<Uuid>,
    event: String,
    /// A biz type's notice: what its body says of the event (`engine::breaker`).
    detail: Option<serde_json::Value>,
    /// This send's number (1 for the first).
    attempt: i32,
    #[sqlx(flatten)]
    biz: BizTypeConfig,
}

/// Holds up to `limit` due notices for `node_id`: pending ones whose time has come, and
/// running ones whose sender's hold ran out; of each biz type no more than `PER_BIZ_TYPE`
/// less what this node is sending of it already (`sending`: biz type id, count).
async fn claim(pool: &Pool, node_id: Uuid, limit: i64, sending: &HashMap<i32, i64>) -> Result<Vec<Claimed>, sqlx::Error> {
    if crate::db::citus::active() {
        return claim_citus(pool, node_id, limit, sending).await;
    }
    let (busy_ids, busy_counts): (Vec<i32>, Vec<i64>) = sending.iter().map(|(id, n)| (*id, *n)).unzip();
    // Locks: the notices it takes, FOR UPDATE SKIP LOCKED, so that the senders of every
    // node claim at once without waiting for, or taking, one another's. The biz types are
    // read, not locked: only those with notices due (found through failure_notices_due_idx,
    // so that an idle sender's probe costs the same however many biz types there are), in a
    // random order so that under a backlog the limit does not always favour the same ones;
    // each one's notices are a probe of failure_notices_biz_type_due_idx. Archived biz types' notices stay as they are:
    // nothing of theirs is delivered. The previous secret is read only while its overlap
    // lasts, as the engine reads it.
    crate::db::query_as(
        "WITH due AS (
             SELECT d.id
               FROM (SELECT b.id FROM biz_types b
                      WHERE b.archived_at IS NULL
                        AND b.id IN (SELECT biz_type_id FROM failure_notices
                                      WHERE status IN ('pending', 'running') AND due_at <= now())
                      ORDER BY random()) b
              CROSS JOIN LATERAL (
                    SELECT n.id FROM failure_notices n
                     WHERE n.biz_type_id = b.id AND n.status IN ('pending', 'running') AND n.due_at <= now()
                     ORDER BY n.due_at
                     LIMIT greatest(0, $4 - coalesce((SELECT s.n FROM unnest($5::int[], $6::bigint[]) AS s(id, n) WHERE s.id = b.id), 0))
                       FOR UPDATE OF n SKIP LOCKED
                    ) d
              LIMIT $1
         )
         UPDATE failure_notices n
            SET status = 'running', held_by = $2, attempt_count = n.attempt_count + 1,
                due_at = now() + (b.timeout_ms + $3) * interval '1 millisecond'
           FROM due, biz_types b
          WHERE n.id = due.id AND b.id = n.biz_type_id
         RETURNING n.id AS notice_id, n.task_id, n.event, n.detail, n.attempt_count AS attempt,
                   b.id, b.name, b.callback_url, b.timeout_ms, b.max_attempts, b.backoff_initial_ms, b.backoff_max_ms,
                   b.max_in_flight, b.rate_limit, b.signing_secret, b.signing_secret_sealed, b.failure_url, b.signing_scheme,
                   CASE WHEN b.previous_secret_until > now() THEN b.previous_secret END AS previous_secret,
                   CASE WHEN b.previous_secret_until > now() THEN b.previous_secret_until END AS previous_secret_until",
    )
    .bind(limit)
    .bind(node_id)
    .bind(HOLD_MARGIN_MS)
    .bind(PER_BIZ_TYPE)
    .bind(&busy_ids)
    .bind(&busy_counts)
    .fetch_all(pool)
    .await
}

/// One biz type's claim on a Citus cluster (`claim_citus`): $1 the biz type, $2 how many
/// notices at most, $3 the node, $4 the hold in ms. Routed whole to the worker holding the
/// biz type's shard (tests/citus/statements.rs EXPLAINs it).
pub const CITUS_CLAIM: &str = "WITH due AS (
         SELECT n.id FROM failure_notices n
          WHERE n.biz_type_id = $1 AND n.status IN ('pending', 'running') AND n.due_at <= now()
          ORDER BY n.due_at LIMIT $2
            FOR UPDATE SKIP LOCKED
     ), held AS (
         UPDATE failure_notices n
            SET status = 'running', held_by = $3, attempt_count = n.attempt_count + 1,
                due_at = now() + $4 * interval '1 millisecond'
          WHERE n.biz_type_id = $1 AND n.id = ANY(ARRAY(SELECT id FROM due))
         RETURNING n.id, n.task_id, n.event, n.detail, n.attempt_count
     )
     SELECT h.id AS notice_id, h.task_id, h.event, h.detail, h.attempt_count AS attempt,
            b.id, b.name, b.callback_url, b.timeout_ms, b.max_attempts, b.backoff_initial_ms, b.backoff_max_ms,
            b.max_in_flight, b.rate_limit, b.signing_secret, b.signing_secret_sealed, b.failure_url, b.signing_scheme,
            CASE WHEN b.previous_secret_until > now() THEN b.previous_secret END AS previous_secret,
            CASE WHEN b.previous_secret_until > now() THEN b.previous_secret_until END AS previous_secret_until
       FROM held h CROSS JOIN biz_types b
      WHERE b.id = $1";

/// `claim` on a Citus cluster (docs/design/citus.md, The notice senders), which refuses
/// the one statement for every biz type ("cannot push down this subquery": a LATERAL
/// subquery with a LIMIT per biz type). First the biz types with notices due: a read of
/// every shard, through failure_notices_due_idx on each, that locks nothing. Then, in a
/// random order (as `claim`'s), each one's claim: a statement that names the biz type as a
/// constant, so that Citus routes it whole to the worker holding its shard, in a
/// transaction of its own (`db::citus::begin_routed`).
async fn claim_citus(pool: &Pool, node_id: Uuid, limit: i64, sending: &HashMap<i32, i64>) -> Result<Vec<Claimed>, sqlx::Error> {
    use rand::seq::SliceRandom;
    // The biz types with notices due and not archived, each with its timeout (the hold is
    // made of it: Citus refuses a STABLE function of a joined column in an UPDATE).
    let mut due: Vec<(i32, i32)> = crate::db::query_as(
        "SELECT DISTINCT b.id, b.timeout_ms FROM failure_notices n JOIN biz_types b ON b.id = n.biz_type_id
          WHERE n.status IN ('pending', 'running') AND n.due_at <= now() AND b.archived_at IS NULL",
    )
    .fetch_all(pool)
    .await?;
    due.shuffle(&mut rand::rng());
    let mut claimed: Vec<Claimed> = Vec::new();
    for (biz_type_id, timeout_ms) in due {
        let left = limit - claimed.len() as i64;
        if left <= 0 {
            break;
        }
        let room = left.min(PER_BIZ_TYPE - sending.get(&biz_type_id).copied().unwrap_or(0));
        if room <= 0 {
            continue;
        }
        // Locks: the biz type's notices it takes, FOR UPDATE SKIP LOCKED, as `claim`'s; the
        // biz type is read, not locked. The due notices are a probe of
        // failure_notices_biz_type_due_idx; the held ones are found again through the primary
        // key, as an array (claim_citus.sql's way: no join for the planner to misjudge).
        let mut tx = crate::db::citus::begin_routed(pool).await?;
        let rows: Vec<Claimed> = crate::db::query_as(CITUS_CLAIM)
            .bind(biz_type_id)
            .bind(room)
            .bind(node_id)
            .bind(i64::from(timeout_ms) + HOLD_MARGIN_MS)
            .fetch_all(&mut *tx)
            .await?;
        tx.commit().await?;
        claimed.extend(rows);
    }
    Ok(claimed)
}

/// What one send of a notice came to.
struct Attempted {
    verdict: Verdict,
    status_code: Option<i16>,
    error: Option<String>,
}

/// Records the result of a notice `node_id` holds; a notice it no longer holds (its hold ran
/// out and another node took it) is left to that node.
async fn record(pool: &Pool, node_id: Uuid, biz_type_id: i32, notice_id: Uuid, result: &Attempted) -> Result<(), sqlx::Error> {
    let (status, due_at) = match result.verdict {
        Verdict::Delivered => ("delivered", None),
        Verdict::RetryAt(at) | Verdict::Held(at) => ("pending", Some(at)),
        // Snoozes and deadlines are a task's; `send` makes neither for a notice.
        Verdict::GiveUp | Verdict::Snooze(_) | Verdict::Expire { .. } => ("failed", None),
    };
    if crate::db::citus::active() {
        return record_citus(pool, node_id, biz_type_id, notice_id, status, due_at, result).await;
    }
    // Locks the notice's row; only its holder's result is written.
    crate::db::query(
        "UPDATE failure_notices
            SET status = $3, due_at = coalesce($4, due_at), last_status_code = $5, last_error = $6, held_by = NULL,
                finished_at = CASE WHEN $3 IN ('delivered', 'failed') THEN now() END
          WHERE id = $1 AND status = 'running' AND held_by = $2",
    )
    .bind(notice_id)
    .bind(node_id)
    .bind(status)
    .bind(due_at)
    .bind(result.status_code)
    .bind(&result.error)
    .execute(pool)
    .await
    .map(drop)
}

/// `record` on a Citus cluster: the same UPDATE with the notice's biz type, so that Citus
/// routes it to the worker holding its shard rather than ask every shard, and without
/// `now()` in a CASE, which Citus refuses in an UPDATE (NULL plus `now()` is NULL).
async fn record_citus(
    pool: &Pool,
    node_id: Uuid,
    biz_type_id: i32,
    notice_id: Uuid,
    status: &str,
    due_at: Option<DateTime<Utc>>,
    result: &Attempted,
) -> Result<(), sqlx::Error> {
    let mut tx = crate::db::citus::begin_routed(pool).await?;
    // Locks the notice's row; only its holder's result is written.
    crate::db::query(
        "UPDATE failure_notices
            SET status = $3, due_at = coalesce($4, due_at), last_status_code = $5, last_error = $6, held_by = NULL,
                finished_at = now() + CASE WHEN $3 IN ('delivered', 'failed') THEN interval '0' END
          WHERE biz_type_id = $7 AND id = $1 AND status = 'running' AND held_by = $2",
    )
    .bind(notice_id)
    .bind(node_id)
    .bind(status)
    .bind(due_at)
    .bind(result.status_code)
    .bind(&result.error)
    .bind(biz_type_id)
    .execute(&mut *tx)
    .await?;
    tx.commit().await
}

#[derive(Serialize)]
struct Body<'a> {
    event: &'a str,
    task: &'a tasks::Task,
    last_attempt: Option<&'a tasks::Attempt>,
}

/// A biz type's notice: `{"event", "biz_type", "breaker"}`, the breaker as it was when it
/// opened or closed (`engine::breaker`).
#[derive(Serialize)]
struct BizTypeBody<'a> {
    event: &'a str,
    biz_type: &'a str,
    breaker: &'a serde_json::Value,
}

/// One node's failure notice sender: `run` takes turns until the node stops; a test can
/// build one and take single turns (`turn`).
pub struct Sender {
    /// The sender's own sessions.
    pool: Pool,
    health: Health,
    /// Holds the notices it sends (`held_by`).
    node_id: Uuid,
    /// Which addresses notices may reach: the callbacks' rule.
    hosts: CallbackHosts,
    client: reqwest::Client,
    stop: Signal,
    /// How often chat tools hear of failed tasks.
    chat_pace: Pace,
    /// The console's base URL as users reach it, for the links in chat notices.
    public_url: Option<String>,
}

/// Runs a sender until the node stops (see `Sender::run`); `public_url` is the console's
/// base URL as users reach it (`--public-url`), for the links in chat notices.
pub async fn run(health: Health, node_id: Uuid, hosts: CallbackHosts, public_url: Option<String>, stop: Signal) {
    Sender::start(health, node_id, hosts, stop).with_public_url(public_url).run().await
}

impl Sender {
    pub fn start(health: Health, node_id: Uuid, hosts: CallbackHosts, stop: Signal) -> Sender {
        crate::engine::install_tls_provider();
        // Its own sessions, so that notices never wait behind the API's statements.
        let pool = health.statements_pool(POOL_SIZE);
        let client = hosts.http_client().build().expect("an HTTP client with the ring TLS provider");
        Sender { pool, health, node_id, hosts, client, stop, chat_pace: Pace::default(), public_url: None }
    }

    /// Links chat notices to the console at `url` (without a trailing `/`).
    pub fn with_public_url(self, url: Option<String>) -> Sender {
        Sender { public_url: url.map(|u| u.trim_end_matches('/').to_string()), ..self }
    }

    /// Paces chat notices otherwise than `Pace::default()` (tests).
    pub fn with_chat_pace(self, chat_pace: Pace) -> Sender {
        Sender { chat_pace, ..self }
    }

    /// Takes turns until the node stops, without waiting for the notices of one turn to be
    /// sent before the next: each is sent on its own, and counts against its biz type's
    /// `PER_BIZ_TYPE` until it is recorded. No claim starts once the node is stopping;
    /// notices being sent may finish within the grace, and are dropped when it is over
    /// (another node sends them again when their hold runs out).
    pub async fn run(self) {
        tracing::info!(node_id = %self.node_id, "failure notice sender started");
        let mut stop = self.stop.clone();
        let mut leaving = stop.clone();
        // Each send is a task of its own, so that it goes on while the loop claims.
        let this = Arc::new(self);
        let mut sending = JoinSet::new();
        // Each send's biz type, and how many each biz type has in flight.
        let mut owner: HashMap<tokio::task::Id, i32> = HashMap::new();
        let mut busy: HashMap<i32, i64> = HashMap::new();
        while !stop.is_stopping() {
            let mut full = false;
            if !this.health.is_down() {
                let claimed = this.claim_due(&busy).await;
                full = claimed.len() as i64 == CLAIM_BATCH;
                for notice in claimed {
                    let biz_type_id = notice.biz.id;
                    *busy.entry(biz_type_id).or_default() += 1;
                    let sender = this.clone();
                    let task = sending.spawn(async move { sender.deliver(notice).await });
                    owner.insert(task.id(), biz_type_id);
                }
                // Not in `owner`: a chat message counts against no biz type's failure notices.
                for channel in this.claim_chat().await {
                    let sender = this.clone();
                    sending.spawn(async move { sender.deliver_chat(channel).await });
                }
            }
            // A full claim may leave more due at once; otherwise wait for the poll (or the
            // database to come back), counting down each biz type's sends as they end.
            let mut wait = std::pin::pin!(tokio::time::sleep(if full { Duration::ZERO } else { POLL }));
            loop {
                tokio::select! {
                    Some(sent) = sending.join_next_with_id() => {
                        // One that panicked is counted down all the same.
                        let task = sent.map_or_else(|e| e.id(), |(id, ())| id);
                        if let Some(biz_type_id) = owner.remove(&task)
                            && let Some(n) = busy.get_mut(&biz_type_id)
                        {
                            *n -= 1;
                            if *n <= 0 {
                                busy.remove(&biz_type_id);
                            }
                        }
                    }
                    () = &mut wait, if !this.health.is_down() => break,
                    () = this.health.came_up(), if this.health.is_down() => break,
                    () = stop.stopping() => break,
                }
            }
        }
        tokio::select! {
            () = async { while sending.join_next().await.is_some() {} } => {}
            () = leaving.leaving() => sending.abort_all(),
        }
        this.pool.close().await;
        tracing::info!("failure notice sender stopped: the node is stopping");
    }

    /// Claims due notices (see `claim`), or none when the database cannot be reached.
    async fn claim_due(&self, busy: &HashMap<i32, i64>) -> Vec<Claimed> {
        if self.stop.is_stopping() {
            return vec![];
        }
        match claim(&self.pool, self.node_id, CLAIM_BATCH, busy).await {
            Ok(claimed) => claimed,
            Err(e) => {
                if !self.health.saw(&e) {
                    tracing::warn!(error = %e, "could not claim failure notices; retrying");
                }
                vec![]
            }
        }
    }

    /// Claims the chat channels with a message due (see `chat_notices::claim`), or none when
    /// the database cannot be reached.
    async fn claim_chat(&self) -> Vec<chat_notices::Channel> {
        if self.stop.is_stopping() {
            return vec![];
        }
        match chat_notices::claim(&self.pool, self.node_id, &self.chat_pace).await {
            Ok(claimed) => claimed,
            Err(e) => {
                if !self.health.saw(&e) {
                    tracing::warn!(error = %e, "could not claim chat notices; retrying");
                }
                vec![]
            }
        }
    }

    async fn deliver_chat(&self, channel: chat_notices::Channel) {
        let cx = chat_notices::Context { client: &self.client, hosts: self.hosts, pace: &self.chat_pace, public_url: self.public_url.as_deref() };
        chat_notices::deliver(&self.pool, &cx, channel).await;
    }

    /// One turn of chat notices, for a test: claims the channels with a message due, sends
    /// each and records it. Returns how many it sent.
    pub async fn chat_turn(&self) -> usize {
        let claimed = self.claim_chat().await;
        let count = claimed.len();
        futures_util::future::join_all(claimed.into_iter().map(|channel| self.deliver_chat(channel))).await;
        count
    }

    /// One turn, for a test: claims the due notices, sends them all at once and records
    /// each result. Returns how many it sent.
    pub async fn turn(&self) -> usize {
        let claimed = self.claim_due(&HashMap::new()).await;
        let count = claimed.len();
        futures_util::future::join_all(claimed.into_iter().map(|notice| self.deliver(notice))).await;
        count
    }

    /// Sends one notice and records what came of it (retrying the record until the
    /// database takes it, or the node is leaving: the hold then runs out and it is sent again).
    async fn deliver(&self, notice: Claimed) {
        let result = self.send(&notice).await;
        let outcome = match result.verdict {
            Verdict::Delivered => "delivered",
            Verdict::RetryAt(_) | Verdict::Held(_) => "retried",
            Verdict::GiveUp | Verdict::Snooze(_) | Verdict::Expire { .. } => "failed",
        };
        metrics::failure_notice(&notice.biz.name, outcome);
        if result.verdict != Verdict::Delivered {
            tracing::warn!(
                task_id = ?notice.task_id, event = %notice.event, biz_type = %notice.biz.name, attempt = notice.attempt, status = result.status_code,
                error = result.error.as_deref().unwrap_or(""), outcome,
                "failure notice not delivered; check the biz type's failure_url and its receiver"
            );
        }
        while let Err(e) = record(&self.pool, self.node_id, notice.biz.id, notice.notice_id, &result).await {
            if !self.health.saw(&e) {
                tracing::warn!(error = %e, "could not record a failure notice's result; retrying in 1 s");
            }
            if self.stop.is_leaving() {
                return;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }

    async fn send(&self, notice: &Claimed) -> Attempted {
        let give_up = |error: String| Attempted { verdict: Verdict::GiveUp, status_code: None, error: Some(error) };
        // Cleared after the task failed: the notice has nowhere to go.
        let Some(url) = notice.biz.failure_url.as_deref() else {
            return give_up("the biz type's failure_url was removed before the notice was sent".into());
        };
        let mut headers = vec![("Chime-Event", notice.event.clone())];
        let body = match notice.task_id {
            Some(task_id) => {
                let (task, attempts) = match tasks::get(&self.pool, task_id).await {
                    Ok(Some(found)) => found,
                    Ok(None) => return give_up("the task no longer exists (retired past retention)".into()),
                    Err(e) => {
                        let retry_at = Utc::now() + chrono::TimeDelta::seconds(1);
                        return Attempted {
                            verdict: Verdict::RetryAt(retry_at),
                            status_code: None,
                            error: Some(format!("could not read the task: {e}")),
                        };
                    }
                };
                headers.push(("Chime-Task-Id", task_id.to_string()));
                serde_json::to_vec(&Body { event: &notice.event, task: &task, last_attempt: attempts.last() })
            }
            None => {
                let breaker = notice.detail.clone().unwrap_or_default();
                serde_json::to_vec(&BizTypeBody { event: &notice.event, biz_type: &notice.biz.name, breaker: &breaker })
            }
        }
        .expect("a notice body serializes");
        headers.push(("Chime-Notice-Id", notice.notice_id.to_string()));
        headers.push(("Chime-Attempt", notice.attempt.to_string()));
        let id = notice.notice_id.to_string();
        let request = deliver::Post { url, id: &id, headers: &headers, fired_at: Utc::now(), body };
        let sent = deliver::post(&self.client, self.hosts, &notice.biz, request).await.sent;
        // A notice has no deadline, and a `Chime-Snooze` in its answer means nothing.
        let verdict = deliver::verdict(&notice.biz, notice.attempt, &sent, None);
        Attempted { verdict, status_code: sent.status_code, error: sent.error }
    }
}
