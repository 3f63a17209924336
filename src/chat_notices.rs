//! Notices in a chat tool (docs/book/src/concepts/chat-notices.md): a biz type with a
//! `chat_platform` and `chat_url` also tells a chat tool's incoming webhook (a DingTalk or
//! WeCom group robot, a Feishu/Lark custom bot, a Slack incoming webhook) of its failed and
//! expired tasks and of its receiver going down and up, in that platform's own message
//! format and signing. Every statement on `chat_notices` and `chat_channels` (migration 0047)
//! is in this module, except the inserts, which are in the statements that end tasks or move
//! a receiver's breaker, beside the failure notices' (`failure_notices`): a row is made in
//! the same statement as the end of its task, so none is lost.
//!
//! Not a flood. A chat channel is read by people: the tasks are summarised, one message per
//! biz type at most every `Pace::window` ("payments: 37 tasks failed since 12:04 UTC, last
//! error: …"), sent `Pace::gather` after the oldest failure it tells of, so that a burst is
//! one message. A receiver going down or up is sent as it happens, one message each.
//!
//! Sending. The failure notice sender (`failure_notices::Sender`) sends these too: each poll
//! it claims the channels with a message due (`chat_channels`, one row per biz type with a
//! chat tool, `FOR UPDATE SKIP LOCKED`), holding each for `HOLD`, so that one node at a time
//! sends a biz type's messages, one at a time. Each message is a task of its own, outside the
//! failure notices' `PER_BIZ_TYPE` count, bounded by `TIMEOUT`: a chat webhook that is down
//! or slow holds one send of its own biz type, never a callback, a failure notice or another
//! biz type's message. A message not delivered (no answer, a non-2xx answer, or a 2xx whose
//! body carries the platform's error code) is tried again after a backoff (`Pace::first_retry`
//! doubling to `MAX_BACKOFF`), `MAX_TRIES` times in all, then given up; a summary retried
//! tells of the tasks that failed meanwhile too. At least once: a message whose sender died
//! is sent again once its hold runs out. Logged once per trouble: when a channel's first try
//! fails, when it is given up, and when it answers again, never per failure.
//!
//! The link to the console needs the console's address as users reach it (`--public-url`);
//! without it messages carry none.

use std::sync::LazyLock;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use chrono::{DateTime, Utc};
use hmac::{Hmac, Mac};
use serde_json::{Value, json};
use sha2::Sha256;
use uuid::Uuid;

use crate::biz_types::ChatSecret;
use crate::callback_hosts::CallbackHosts;
use crate::db::Pool;

/// Longest a chat webhook may take to answer.
pub const TIMEOUT: Duration = Duration::from_secs(10);
/// A sender's hold on a channel: the send and time to record it.
const HOLD: Duration = Duration::from_secs(15);
/// Tries of one message before it is given up.
pub const MAX_TRIES: i32 = 8;
/// Longest wait between two tries.
const MAX_BACKOFF: Duration = Duration::from_secs(300);
/// Most channels claimed in one turn.
const CLAIM_BATCH: i64 = 20;
/// Longest message text, in bytes: under every platform's limit (WeCom's markdown takes
/// 4096 bytes, a Slack section block 3000 characters).
pub const MAX_TEXT_BYTES: usize = 3000;
/// Longest error quoted in a message, in characters.
const MAX_ERROR_CHARS: usize = 300;
/// How much of a chat webhook's answer is read.
const MAX_ANSWER_BYTES: usize = 4096;

/// How often a biz type's chat tool hears of its tasks. Tests shorten it.
#[derive(Debug, Clone, Copy)]
pub struct Pace {
    /// A summary waits this long after the oldest failure it tells of: a burst is one message.
    pub gather: Duration,
    /// Least time between two summaries of one biz type.
    pub window: Duration,
    /// Wait before a message not delivered is tried again; doubles at each try.
    pub first_retry: Duration,
}

impl Default for Pace {
    fn default() -> Self {
        Pace { gather: Duration::from_secs(10), window: Duration::from_secs(300), first_retry: Duration::from_secs(2) }
    }
}

/// A channel this node holds, with its biz type's chat settings as they are now.
#[derive(sqlx::FromRow)]
pub struct Channel {
    biz_type_id: i32,
    /// The message being sent: its rows are `taken_by` it, and only its holder records it.
    claim: Uuid,
    /// Tries of this message that failed already.
    tries: i32,
    name: String,
    platform: String,
    url: String,
    #[sqlx(flatten)]
    secret: ChatSecret,
    /// A receiver going down or up waits: this message tells of it rather than summarise.
    receiver_waiting: bool,
}

/// Whether channel `c` has a message due: a receiver row waiting, or task rows whose summary
/// is due (the oldest `gather` old, the last summary `window` ago), and neither held by a
/// live sender nor waiting out a retry's backoff. `biz` names the channel's biz type in the
/// statement, `gather` and `window` the binds of the pace's, in ms. The one condition of the
/// three statements below.
fn due(biz: &str, gather: &str, window: &str) -> String {
    format!(
        "(c.held_until IS NULL OR c.held_until <= now())
         AND (c.next_at IS NULL OR c.next_at <= now())
         AND (EXISTS (SELECT 1 FROM chat_notices n WHERE n.biz_type_id = {biz} AND n.task_id IS NULL)
              OR ((c.summarised_at IS NULL OR c.summarised_at <= now() - {window} * interval '1 millisecond')
                  AND EXISTS (SELECT 1 FROM chat_notices n
                               WHERE n.biz_type_id = {biz} AND n.task_id IS NOT NULL
                                 AND n.created_at <= now() - {gather} * interval '1 millisecond')))"
    )
}

/// The claim of up to `$5` channels with a message due (`claim`): `$1` the node, `$2` the
/// hold, `$3` and `$4` the pace's gather and window, in ms.
static CLAIM: LazyLock<String> = LazyLock::new(|| {
    format!(
        "WITH ready AS (
             SELECT c.biz_type_id
               FROM chat_channels c JOIN biz_types b ON b.id = c.biz_type_id
              WHERE b.archived_at IS NULL AND b.chat_url IS NOT NULL
                AND {due}
              ORDER BY random()
              LIMIT $5
                FOR UPDATE OF c SKIP LOCKED
         )
         UPDATE chat_channels c
            SET claim = gen_random_uuid(), held_by = $1, held_until = now() + $2 * interval '1 millisecond'
           FROM ready r, biz_types b
          WHERE c.biz_type_id = r.biz_type_id AND b.id = c.biz_type_id
         RETURNING c.biz_type_id, c.claim, c.tries, b.name, b.chat_platform AS platform, b.chat_url AS url, b.chat_secret,
                   EXISTS (SELECT 1 FROM chat_notices n WHERE n.biz_type_id = c.biz_type_id AND n.task_id IS NULL) AS receiver_waiting",
        due = due("c.biz_type_id", "$3", "$4")
    )
});

/// Every channel and whether it has a message due (`claim_citus`): `$1` and `$2` the pace's
/// gather and window, in ms.
static CHANNELS_DUE: LazyLock<String> =
    LazyLock::new(|| format!("SELECT c.biz_type_id, {due} FROM chat_channels c", due = due("c.biz_type_id", "$1", "$2")));

/// Holds up to `CLAIM_BATCH` channels with a message due (`due`) for `node_id`.
pub async fn claim(pool: &Pool, node_id: Uuid, pace: &Pace) -> Result<Vec<Channel>, sqlx::Error> {
    if crate::db::citus::active() {
        return claim_citus(pool, node_id, pace).await;
    }
    // Locks: the channel rows it makes, one for each biz type given a chat tool since the
    // last poll (an anti-join over biz_types, whose rows are few); a row another node made
    // meanwhile is left as it is.
    crate::db::query(
        "INSERT INTO chat_channels (biz_type_id)
         SELECT b.id FROM biz_types b
          WHERE b.chat_url IS NOT NULL AND b.archived_at IS NULL
            AND NOT EXISTS (SELECT 1 FROM chat_channels c WHERE c.biz_type_id = b.id)
         ON CONFLICT (biz_type_id) DO NOTHING",
    )
    .execute(pool)
    .await?;
    // Locks: the channels it takes, FOR UPDATE SKIP LOCKED, so that the senders of every node
    // claim at once without waiting for, or taking, one another's; a channel held by a live
    // sender (`held_until` ahead) is passed over. Each channel's rows are probed through
    // chat_notices_receiver_idx and chat_notices_tasks_idx, so that an idle channel costs two
    // index probes. Archived biz types' channels are left as they are.
    crate::db::query_as(sqlx::AssertSqlSafe(CLAIM.as_str()))
        .bind(node_id)
        .bind(HOLD.as_millis() as i64)
        .bind(pace.gather.as_millis() as i64)
        .bind(pace.window.as_millis() as i64)
        .bind(CLAIM_BATCH)
        .fetch_all(pool)
        .await
}

/// One channel's claim on a Citus cluster (`claim_citus`): $1 the biz type, $2 the node,
/// $3 the claim's id, $4 the hold, $5 and $6 the pace's gather and window, in ms. Routed
/// whole to the worker holding the biz type's shard (tests/citus/statements.rs EXPLAINs it).
pub static CITUS_CLAIM: LazyLock<String> = LazyLock::new(|| {
    format!(
        "WITH ready AS (
             SELECT c.biz_type_id FROM chat_channels c
              WHERE c.biz_type_id = $1
                AND EXISTS (SELECT 1 FROM biz_types b WHERE b.id = $1 AND b.archived_at IS NULL AND b.chat_url IS NOT NULL)
                AND {due}
                FOR UPDATE OF c SKIP LOCKED
         ), mine AS (
             UPDATE chat_channels c
                SET claim = $3, held_by = $2, held_until = now() + $4 * interval '1 millisecond'
              WHERE c.biz_type_id = $1 AND EXISTS (SELECT 1 FROM ready)
             RETURNING c.biz_type_id, c.claim, c.tries
         )
         SELECT m.biz_type_id, m.claim, m.tries, b.name, b.chat_platform AS platform, b.chat_url AS url, b.chat_secret,
                EXISTS (SELECT 1 FROM chat_notices n WHERE n.biz_type_id = $1 AND n.task_id IS NULL) AS receiver_waiting
           FROM mine m JOIN biz_types b ON b.id = $1",
        due = due("$1", "$5", "$6")
    )
});

/// `claim` on a Citus cluster (docs/design/citus.md, The notice senders), which refuses the
/// one statement for every channel ("correlated subqueries are not supported when the FROM
/// clause contains a reference table") and the insert of the missing channels (the same).
/// First every channel and whether it has a message due: a read of every shard that locks
/// nothing (one row per biz type with a chat tool). Then the channel of each biz type given
/// a chat tool since (its row made on its worker), and, in a random order, each ready one's
/// claim: a statement that names the biz type as a constant, so that Citus routes it whole
/// to the worker holding its shard, in a transaction of its own (`db::citus::begin_routed`).
async fn claim_citus(pool: &Pool, node_id: Uuid, pace: &Pace) -> Result<Vec<Channel>, sqlx::Error> {
    use rand::seq::SliceRandom;
    let chatty: Vec<i32> =
        crate::db::query_scalar("SELECT id FROM biz_types WHERE chat_url IS NOT NULL AND archived_at IS NULL").fetch_all(pool).await?;
    if chatty.is_empty() {
        return Ok(vec![]);
    }
    let channels: Vec<(i32, bool)> = crate::db::query_as(sqlx::AssertSqlSafe(CHANNELS_DUE.as_str()))
        .bind(pace.gather.as_millis() as i64)
        .bind(pace.window.as_millis() as i64)
        .fetch_all(pool)
        .await?;
    let mut ready: Vec<i32> = channels.iter().filter(|(id, ready)| *ready && chatty.contains(id)).map(|(id, _)| *id).collect();
    for &id in chatty.iter().filter(|id| !channels.iter().any(|(c, _)| c == *id)) {
        // Locks the new row; one another node made meanwhile is left as it is.
        crate::db::query("INSERT INTO chat_channels (biz_type_id) VALUES ($1) ON CONFLICT (biz_type_id) DO NOTHING").bind(id).execute(pool).await?;
        ready.push(id);
    }
    ready.shuffle(&mut rand::rng());
    let mut claimed = Vec::new();
    for biz_type_id in ready.into_iter().take(CLAIM_BATCH as usize) {
        // Locks: the channel, FOR UPDATE SKIP LOCKED, as `claim`'s, and only if it still has
        // a message due and its biz type a chat tool, as this statement sees them.
        let mut tx = crate::db::citus::begin_routed(pool).await?;
        let channel: Option<Channel> = crate::db::query_as(sqlx::AssertSqlSafe(CITUS_CLAIM.as_str()))
            .bind(biz_type_id)
            .bind(node_id)
            // The claim's id: made here, as Citus refuses gen_random_uuid() (VOLATILE) in an UPDATE.
            .bind(Uuid::new_v4())
            .bind(HOLD.as_millis() as i64)
            .bind(pace.gather.as_millis() as i64)
            .bind(pace.window.as_millis() as i64)
            .fetch_optional(&mut *tx)
            .await?;
        tx.commit().await?;
        claimed.extend(channel);
    }
    Ok(claimed)
}

/// What a message tells.
#[derive(Debug, Clone, PartialEq)]
pub enum News {
    /// Tasks that ended failed and expired, the oldest of them at `since`.
    Tasks { failed: i64, expired: i64, since: DateTime<Utc>, last_error: Option<String> },
    /// `biz_type.receiver_down` or `biz_type.receiver_up`, with what its failure notice's
    /// body says of the breaker (`engine::breaker`).
    Receiver { event: String, breaker: Value },
}

/// Takes the rows `channel`'s message tells of (marks them `taken_by` its claim): the oldest
/// receiver row if one waits, else every task row. None: nothing left to tell (another
/// node's message, sent after its hold ran out, told of them).
async fn take(pool: &Pool, channel: &Channel) -> Result<Option<News>, sqlx::Error> {
    // On Citus, planned with the values (`db::citus::begin_routed`): the biz type is what
    // Citus routes the statement by.
    let taken = if crate::db::citus::active() {
        let mut tx = crate::db::citus::begin_routed(pool).await?;
        let taken = take_rows(&mut tx, channel).await?;
        tx.commit().await?;
        taken
    } else {
        take_rows(&mut *pool.acquire().await?, channel).await?
    };
    let Some((mut news, last_task)) = taken else { return Ok(None) };
    // The last error of the latest task told of; a task retired since has none to show.
    if let (News::Tasks { last_error, .. }, Some(id)) = (&mut news, last_task) {
        *last_error = crate::tasks::get(pool, id).await.ok().flatten().and_then(|(task, _)| task.last_error);
    }
    Ok(Some(news))
}

/// `take`'s statements: the news without the last error, and the latest task told of.
async fn take_rows(conn: &mut sqlx::PgConnection, channel: &Channel) -> Result<Option<(News, Option<Uuid>)>, sqlx::Error> {
    if channel.receiver_waiting {
        // Locks the one row it takes; rows are only inserted by others, and taken by the
        // channel's holder. On Citus, with the biz type, so that the UPDATE is routed to the
        // worker holding its shard.
        let row: Option<(String, Option<Value>)> = crate::db::query_as(if crate::db::citus::active() {
            "UPDATE chat_notices SET taken_by = $2
              WHERE biz_type_id = $1 AND id = (SELECT id FROM chat_notices WHERE biz_type_id = $1 AND task_id IS NULL ORDER BY id LIMIT 1)
             RETURNING event, detail"
        } else {
            "UPDATE chat_notices SET taken_by = $2
              WHERE id = (SELECT id FROM chat_notices WHERE biz_type_id = $1 AND task_id IS NULL ORDER BY id LIMIT 1)
             RETURNING event, detail"
        })
        .bind(channel.biz_type_id)
        .bind(channel.claim)
        .fetch_optional(&mut *conn)
        .await?;
        return Ok(row.map(|(event, breaker)| (News::Receiver { event, breaker: breaker.unwrap_or_default() }, None)));
    }
    // Locks the task rows it takes: every one the biz type has, those a failed try took
    // before included (the summary retried tells of them and of those since).
    let (failed, expired, since, last_task): (i64, i64, Option<DateTime<Utc>>, Option<Uuid>) = crate::db::query_as(
        "WITH taken AS (
             UPDATE chat_notices SET taken_by = $2 WHERE biz_type_id = $1 AND task_id IS NOT NULL
             RETURNING id, task_id, event, created_at
         )
         SELECT count(*) FILTER (WHERE event = 'task.failed'), count(*) FILTER (WHERE event = 'task.expired'),
                min(created_at), (SELECT task_id FROM taken ORDER BY id DESC LIMIT 1)
           FROM taken",
    )
    .bind(channel.biz_type_id)
    .bind(channel.claim)
    .fetch_one(&mut *conn)
    .await?;
    Ok(since.map(|since| (News::Tasks { failed, expired, since, last_error: None }, last_task)))
}

/// How one try of a message came out.
enum Tried {
    Delivered,
    /// Tried again after `after`.
    Retry {
        after: Duration,
        error: String,
    },
    GiveUp {
        error: String,
    },
}

/// Records a try of the message `channel` holds: delivered or given up, its rows are
/// deleted; otherwise it is due again after the backoff. A channel no longer held (its
/// hold ran out and another node took it) is left to that node.
async fn record(pool: &Pool, channel: &Channel, summary: bool, tried: &Tried) -> Result<(), sqlx::Error> {
    let (done, after, error) = match tried {
        Tried::Delivered => (true, Duration::ZERO, None),
        Tried::Retry { after, error } => (false, *after, Some(error.as_str())),
        Tried::GiveUp { error } => (true, Duration::ZERO, Some(error.as_str())),
    };
    // Locks the channel's row, only while this claim holds it, then the rows the message
    // took. The biz type in the DELETE too: Citus then routes both parts to the worker
    // holding its shard.
    let query = crate::db::query(
        "WITH mine AS (
             UPDATE chat_channels
                SET claim = NULL, held_by = NULL, held_until = NULL,
                    tries = CASE WHEN $4 THEN 0 ELSE tries + 1 END,
                    next_at = CASE WHEN $4 THEN NULL ELSE now() + $5 * interval '1 millisecond' END,
                    summarised_at = CASE WHEN $4 AND $3 THEN now() ELSE summarised_at END,
                    last_error = $6
              WHERE biz_type_id = $1 AND claim = $2
             RETURNING biz_type_id
         )
         DELETE FROM chat_notices WHERE biz_type_id = $1 AND $4 AND taken_by = $2 AND EXISTS (SELECT 1 FROM mine)",
    )
    .bind(channel.biz_type_id)
    .bind(channel.claim)
    .bind(summary)
    .bind(done)
    .bind(after.as_millis() as i64)
    .bind(error);
    if !crate::db::citus::active() {
        return query.execute(pool).await.map(drop);
    }
    // On Citus planned with the values (`db::citus::begin_routed`), which fold the CASEs
    // holding `now()` that Citus refuses in an UPDATE otherwise.
    let mut tx = crate::db::citus::begin_routed(pool).await?;
    query.execute(&mut *tx).await?;
    tx.commit().await
}

/// Lets go of a channel whose message had nothing left to tell.
async fn release(pool: &Pool, channel: &Channel) -> Result<(), sqlx::Error> {
    // Locks the channel's row, only while this claim holds it.
    crate::db::query("UPDATE chat_channels SET claim = NULL, held_by = NULL, held_until = NULL WHERE biz_type_id = $1 AND claim = $2")
        .bind(channel.biz_type_id)
        .bind(channel.claim)
        .execute(pool)
        .await
        .map(drop)
}

/// Deletes the rows made before `before` that no message will tell of: their biz type's chat
/// tool was removed, or the biz type archived (retention: their tasks are retired by then).
/// Returns how many.
pub async fn forget_unsendable(pool: &Pool, before: DateTime<Utc>) -> Result<u64, sqlx::Error> {
    // Locks the rows it deletes; no sender takes a row of a biz type without a chat tool.
    Ok(crate::db::query(
        "DELETE FROM chat_notices n USING biz_types b
          WHERE b.id = n.biz_type_id AND (b.chat_url IS NULL OR b.archived_at IS NOT NULL) AND n.created_at < $1",
    )
    .bind(before)
    .execute(pool)
    .await?
    .rows_affected())
}

/// What a message needs besides its news: where the console is.
pub struct Context<'a> {
    pub client: &'a reqwest::Client,
    pub hosts: CallbackHosts,
    pub pace: &'a Pace,
    /// The console's base URL as users reach it (`--public-url`), without a trailing `/`.
    pub public_url: Option<&'a str>,
}

/// Sends the message `channel` holds and records what came of it; logs once per trouble.
pub async fn deliver(pool: &Pool, cx: &Context<'_>, channel: Channel) {
    let news = match take(pool, &channel).await {
        Ok(Some(news)) => news,
        Ok(None) => {
            let _ = release(pool, &channel).await;
            return;
        }
        Err(e) => {
            // The hold runs out and the channel is claimed again.
            tracing::warn!(biz_type = %channel.name, error = %e, "could not read a chat notice; trying again once its hold runs out");
            return;
        }
    };
    let summary = matches!(news, News::Tasks { .. });
    let text = Text::of(&channel.name, &news, cx.public_url, Utc::now());
    let sent = match request(&channel.platform, &channel.url, channel.secret.secret.as_ref().map(|s| s.expose()), &text, Utc::now()) {
        Ok((url, body)) => post(cx, &url, body).await,
        Err(e) => Err(e),
    };
    let tried = match sent {
        Ok(()) => Tried::Delivered,
        Err(error) if channel.tries + 1 >= MAX_TRIES => Tried::GiveUp { error },
        Err(error) => {
            let doubled = cx.pace.first_retry.saturating_mul(1 << channel.tries.clamp(0, 20));
            Tried::Retry { after: doubled.min(MAX_BACKOFF), error }
        }
    };
    let outcome = match tried {
        Tried::Delivered => "delivered",
        Tried::Retry { .. } => "retried",
        Tried::GiveUp { .. } => "failed",
    };
    crate::metrics::chat_message(&channel.name, outcome);
    match &tried {
        Tried::Delivered if channel.tries > 0 => {
            tracing::info!(biz_type = %channel.name, platform = %channel.platform, tries = channel.tries + 1, "chat webhook answers again: notice delivered")
        }
        Tried::Delivered => {}
        Tried::Retry { after, error } if channel.tries == 0 => tracing::warn!(
            biz_type = %channel.name, platform = %channel.platform, error, retry_in_ms = after.as_millis() as u64, max_tries = MAX_TRIES,
            "chat notice not delivered; retried with backoff (not logged again until it is delivered or given up): check the biz type's chat_url"
        ),
        Tried::Retry { .. } => {}
        Tried::GiveUp { error } => tracing::warn!(
            biz_type = %channel.name, platform = %channel.platform, error, tries = MAX_TRIES,
            "chat notice given up: the chat webhook did not take it; the next one is tried afresh"
        ),
    }
    if let Err(e) = record(pool, &channel, summary, &tried).await {
        // Its hold runs out and the message is sent again: at least once.
        tracing::warn!(biz_type = %channel.name, error = %e, "could not record a chat notice's result; it is sent again once its hold runs out");
    }
}

/// Posts a message and reads the answer: a 2xx without the platform's error code in its
/// body is delivered; anything else is the error to retry on.
async fn post(cx: &Context<'_>, url: &url::Url, body: Value) -> Result<(), String> {
    if let Some(reason) = cx.hosts.address_refusal(url) {
        return Err(reason);
    }
    let response = cx.client.post(url.clone()).timeout(TIMEOUT).json(&body).send().await.map_err(|e| {
        if e.is_timeout() { format!("no answer within {} s", TIMEOUT.as_secs()) } else { format!("could not reach the chat webhook: {e}") }
    })?;
    let status = response.status();
    let mut answer = Vec::new();
    let mut response = response;
    while answer.len() < MAX_ANSWER_BYTES {
        match response.chunk().await {
            Ok(Some(chunk)) => answer.extend_from_slice(&chunk),
            _ => break,
        }
    }
    answer.truncate(MAX_ANSWER_BYTES);
    let answer = String::from_utf8_lossy(&answer);
    if !status.is_success() {
        return Err(format!("answered {}: {}", status.as_u16(), clip(answer.trim(), MAX_ERROR_CHARS)));
    }
    platform_error(&answer).map_or(Ok(()), Err)
}

/// The error a chat webhook's 2xx answer carries in its body, if any: DingTalk and WeCom
/// answer `{"errcode": 0, "errmsg": "ok"}`, Feishu `{"code": 0, "msg": "success"}` (older
/// ones `StatusCode`), anything else non-zero being a refusal (a bad signature, a missing
/// keyword, too many messages). Slack answers errors with a 4xx.
fn platform_error(answer: &str) -> Option<String> {
    let body: Value = serde_json::from_str(answer).ok()?;
    for (code, message) in [("errcode", "errmsg"), ("code", "msg"), ("StatusCode", "StatusMessage")] {
        if let Some(n) = body.get(code).and_then(Value::as_i64)
            && n != 0
        {
            let why = body.get(message).and_then(Value::as_str).unwrap_or("");
            return Some(format!("refused ({code} {n}): {}", clip(why, MAX_ERROR_CHARS)));
        }
    }
    None
}

/// A message as every platform shows it: a title, lines, and a link.
#[derive(Debug, Clone, PartialEq)]
pub struct Text {
    pub title: String,
    pub lines: Vec<String>,
    /// The console page to open, when `--public-url` is set.
    pub link: Option<String>,
}

const LINK_LABEL: &str = "Open in the chime console";

impl Text {
    /// What `news` of biz type `name` says, `now` deciding whether a time needs its date.
    pub fn of(name: &str, news: &News, public_url: Option<&str>, now: DateTime<Utc>) -> Text {
        match news {
            News::Tasks { failed, expired, since, last_error } => {
                let tasks = |n: i64| if n == 1 { "1 task".to_string() } else { format!("{n} tasks") };
                let what = match (failed, expired) {
                    (0, e) => format!("{} expired", tasks(*e)),
                    (f, 0) => format!("{} failed", tasks(*f)),
                    (f, e) => format!("{} failed and {e} expired", tasks(*f)),
                };
                let title = format!("{name}: {what} since {}", when(*since, now, "%H:%M"));
                let lines = last_error.iter().map(|e| format!("last error: {}", clip(e, MAX_ERROR_CHARS))).collect();
                let status = if *failed > 0 { "failed" } else { "expired" };
                let link = public_url.map(|base| format!("{base}/console/tasks?biz_type={name}&status={status}"));
                Text { title, lines, link }
            }
            News::Receiver { event, breaker } => {
                let at = |field: &str| breaker.get(field).and_then(Value::as_str).and_then(|t| t.parse::<DateTime<Utc>>().ok());
                let link = public_url.map(|base| format!("{base}/console/biz-types/{name}"));
                if event == "biz_type.receiver_up" {
                    let down = breaker.get("down_ms").and_then(Value::as_i64).map(|ms| format!(" after {} down", span(ms)));
                    let probes = breaker.get("probes").and_then(Value::as_i64).unwrap_or(0);
                    let title = format!("{name}: receiver up");
                    let since = at("closed_at").map(|t| format!(" at {}", when(t, now, "%H:%M:%S"))).unwrap_or_default();
                    let lines = vec![format!("answering again{since}{} ({probes} probes); deliveries resume", down.unwrap_or_default())];
                    Text { title, lines, link }
                } else {
                    let failures = breaker.get("failures").and_then(Value::as_i64).unwrap_or(0);
                    let reason = breaker.get("reason").and_then(Value::as_str).unwrap_or("");
                    let probe_ms = breaker.get("probe_ms").and_then(Value::as_i64).unwrap_or(0);
                    let since = at("opened_at").map(|t| format!(" since {}", when(t, now, "%H:%M:%S"))).unwrap_or_default();
                    let title = format!("{name}: receiver down{since}");
                    let lines = vec![
                        format!("{failures} failures in a row, the last: {}", clip(reason, MAX_ERROR_CHARS)),
                        format!(
                            "its tasks wait, their attempts not counted; one probes the receiver every {} and deliveries resume by themselves",
                            span(probe_ms)
                        ),
                    ];
                    Text { title, lines, link }
                }
            }
        }
    }

    /// Plain text, one line each (Feishu's text message).
    fn plain(&self) -> String {
        let mut text = self.title.clone();
        for line in &self.lines {
            text.push('\n');
            text.push_str(line);
        }
        if let Some(link) = &self.link {
            text.push('\n');
            text.push_str(link);
        }
        text
    }

    /// Markdown, as DingTalk and WeCom render it: the title bold, a link `[label](url)`.
    fn markdown(&self) -> String {
        let mut text = format!("**{}**", self.title);
        for line in &self.lines {
            text.push_str("\n\n");
            text.push_str(line);
        }
        if let Some(link) = &self.link {
            text.push_str(&format!("\n\n[{LINK_LABEL}]({link})"));
        }
        text
    }

    /// Slack's mrkdwn: `&`, `<` and `>` escaped, the title bold, a link `<url|label>`.
    fn slack(&self) -> String {
        let escape = |s: &str| s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;");
        let mut text = format!("*{}*", escape(&self.title));
        for line in &self.lines {
            text.push('\n');
            text.push_str(&escape(line));
        }
        if let Some(link) = &self.link {
            // `&` is one of the three characters Slack wants escaped, in a link's URL too.
            text.push_str(&format!("\n<{}|{LINK_LABEL}>", link.replace('&', "&amp;")));
        }
        text
    }
}

/// A time of day in UTC, with its date unless it is `now`'s.
fn when(t: DateTime<Utc>, now: DateTime<Utc>, time: &str) -> String {
    if t.date_naive() == now.date_naive() { format!("{} UTC", t.format(time)) } else { format!("{} UTC", t.format(&format!("%Y-%m-%d {time}"))) }
}

/// A duration for people: "45 s", "6 min", "2 h 5 min".
fn span(ms: i64) -> String {
    let s = ms / 1000;
    match s {
        ..60 => format!("{} s", s.max(1)),
        60..3600 => format!("{} min", s / 60),
        _ => format!("{} h {} min", s / 3600, s % 3600 / 60),
    }
}

/// At most `max` characters of `s`, "…" marking a cut.
fn clip(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((at, _)) => format!("{}…", &s[..at]),
        None => s.to_string(),
    }
}

/// At most `MAX_TEXT_BYTES` of `s`, cut at a character boundary.
fn bounded(mut s: String) -> String {
    if s.len() > MAX_TEXT_BYTES {
        let mut at = MAX_TEXT_BYTES - '…'.len_utf8();
        while !s.is_char_boundary(at) {
            at -= 1;
        }
        s.truncate(at);
        s.push('…');
    }
    s
}

fn hmac_base64(key: &[u8], message: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes a key of any length");
    mac.update(message);
    STANDARD.encode(mac.finalize().into_bytes())
}

/// The request for `platform`'s webhook at `url`: where to post (a DingTalk robot's
/// signature goes in the query) and the JSON body, signed with `secret` (when the robot has
/// one) at `now`. An unopened secret is the error: a message is not sent unsigned.
pub fn request(
    platform: &str,
    url: &str,
    secret: Option<Result<&str, crate::error::SecretError>>,
    text: &Text,
    now: DateTime<Utc>,
) -> Result<(url::Url, Value), String> {
    let mut url = url::Url::parse(url).map_err(|e| format!("the chat_url is not a URL: {e}"))?;
    let secret = secret.transpose().map_err(|e| e.to_string())?;
    let body = match platform {
        // https://open.dingtalk.com/document/robots/custom-robot-access: `timestamp` (ms) and
        // `sign`, the base64 HMAC-SHA256 of "{timestamp}\n{secret}" keyed by the secret, in
        // the query (URL-encoded).
        "dingtalk" => {
            if let Some(secret) = secret {
                let timestamp = now.timestamp_millis().to_string();
                let sign = hmac_base64(secret.as_bytes(), format!("{timestamp}\n{secret}").as_bytes());
                url.query_pairs_mut().append_pair("timestamp", &timestamp).append_pair("sign", &sign);
            }
            json!({"msgtype": "markdown", "markdown": {"title": bounded(text.title.clone()), "text": bounded(text.markdown())}})
        }
        // https://open.feishu.cn/document/client-docs/bot-v3/add-custom-bot: `timestamp`
        // (seconds, a string) and `sign`, the base64 HMAC-SHA256 of an empty message keyed by
        // "{timestamp}\n{secret}", in the body.
        "feishu" => {
            let mut body = json!({"msg_type": "text", "content": {"text": bounded(text.plain())}});
            if let Some(secret) = secret {
                let timestamp = now.timestamp().to_string();
                body["sign"] = hmac_base64(format!("{timestamp}\n{secret}").as_bytes(), b"").into();
                body["timestamp"] = timestamp.into();
            }
            body
        }
        // https://developer.work.weixin.qq.com/document/path/91770: no signature (the key is
        // in the URL); markdown content at most 4096 bytes.
        "wecom" => json!({"msgtype": "markdown", "markdown": {"content": bounded(text.markdown())}}),
        // https://api.slack.com/messaging/webhooks: `text` (the notification's, and the
        // fallback) and a section block, whose text takes 3000 characters.
        "slack" => {
            let mrkdwn = bounded(text.slack());
            let fallback = bounded(text.plain());
            json!({"text": fallback, "blocks": [{"type": "section", "text": {"type": "mrkdwn", "text": mrkdwn}}]})
        }
        other => return Err(format!("unknown chat platform `{other}`")),
    };
    Ok((url, body))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> DateTime<Utc> {
        s.parse().unwrap()
    }

    #[test]
    fn a_summary_says_what_failed_how_many_since_when_and_links_the_console() {
        let news = News::Tasks { failed: 37, expired: 2, since: at("2026-11-27T12:04:10Z"), last_error: Some("answered 503".into()) };
        let text = Text::of("payments", &news, Some("https://chime.example"), at("2026-11-27T12:10:00Z"));
        assert_eq!(text.title, "payments: 37 tasks failed and 2 expired since 12:04 UTC");
        assert_eq!(text.lines, ["last error: answered 503"]);
        assert_eq!(text.link.as_deref(), Some("https://chime.example/console/tasks?biz_type=payments&status=failed"));
        let one = News::Tasks { failed: 0, expired: 1, since: at("2026-11-26T23:59:00Z"), last_error: None };
        let text = Text::of("payments", &one, None, at("2026-11-27T00:01:00Z"));
        assert_eq!(text.title, "payments: 1 task expired since 2026-11-26 23:59 UTC", "another day's time carries its date");
        assert_eq!(text.link, None, "no link without --public-url");
    }

    #[test]
    fn long_texts_are_cut_to_every_platforms_limit() {
        let news = News::Tasks { failed: 1, expired: 0, since: at("2026-11-27T12:04:10Z"), last_error: Some("é".repeat(5000)) };
        let text = Text { title: "x".repeat(4000), ..Text::of("p", &news, None, at("2026-11-27T12:04:10Z")) };
        for platform in ["dingtalk", "feishu", "wecom", "slack"] {
            let (_, body) = request(platform, "https://h.test/hook", None, &text, Utc::now()).unwrap();
            for s in [&body["markdown"]["text"], &body["markdown"]["content"], &body["content"]["text"], &body["text"]] {
                assert!(s.as_str().is_none_or(|s| s.len() <= MAX_TEXT_BYTES), "{platform}");
            }
        }
        assert_eq!(clip("abcdef", 3), "abc…");
        assert_eq!(span(6 * 60_000 + 5), "6 min");
        assert_eq!(span(7_500_000), "2 h 5 min");
    }

    #[test]
    fn platform_errors_in_a_2xx_body_are_failures() {
        assert_eq!(platform_error(r#"{"errcode":0,"errmsg":"ok"}"#), None);
        assert_eq!(platform_error(r#"{"code":0,"msg":"success","data":{}}"#), None);
        assert_eq!(platform_error("ok"), None, "Slack answers `ok`");
        assert!(platform_error(r#"{"errcode":310000,"errmsg":"sign not match"}"#).unwrap().contains("310000"));
        assert!(platform_error(r#"{"code":19021,"msg":"sign match fail"}"#).unwrap().contains("sign match fail"));
    }
}
