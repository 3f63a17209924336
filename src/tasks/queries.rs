//! Reading and changing single tasks, and listing them.

use crate::db::Pool;
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use chrono::{DateTime, Utc};
use sqlx::{AssertSqlSafe, PgConnection, Postgres, QueryBuilder};
use uuid::Uuid;

use super::ids;
use super::{Attempt, Deadline, Status, Task, When};
use crate::audit::{self, Action};
use crate::error::Error;

pub(super) const SELECT_TASK: &str = "SELECT t.*, b.name AS biz_type FROM all_tasks t JOIN biz_types b ON b.id = t.biz_type_id";

/// Attempts a task is shown with (the API's task, the console's task page): its last
/// ones. A receiver that snoozes every second made 86,400 a day, and a task read with all
/// of them answered 17 MB; the rest are read a page at a time (`attempts`).
pub const ATTEMPTS_SHOWN: i64 = 100;

/// One task with its last `ATTEMPTS_SHOWN` attempts, oldest first, or `None`.
pub async fn get(pool: &Pool, id: Uuid) -> Result<Option<(Task, Vec<Attempt>)>, Error> {
    let Some(task) = read(pool, id).await? else {
        return Ok(None);
    };
    let shown = attempts(pool, id, &AttemptsFrom::Newest, ATTEMPTS_SHOWN).await?;
    Ok(Some((task, shown.items)))
}

/// Where a page of a task's attempts starts.
pub enum AttemptsFrom {
    /// The oldest attempts.
    Oldest,
    /// The attempts after this cursor (a page's `newer`), oldest first.
    After(String),
    /// The newest attempts.
    Newest,
    /// The attempts before this cursor (a page's `older`).
    Before(String),
}

/// A page of a task's attempts, oldest first, with the cursors of the pages either side.
pub struct AttemptPage {
    pub items: Vec<Attempt>,
    /// Pass as `AttemptsFrom::Before` for the page before; None: none older.
    pub older: Option<String>,
    /// Pass as `AttemptsFrom::After` for the page after; None: none newer.
    pub newer: Option<String>,
}

/// Up to `limit` attempts of task `id`, in the order they started (ties by number), from
/// where `from` says. The cursor is a row's (started_at, number).
pub async fn attempts<'e>(db: impl sqlx::PgExecutor<'e>, id: Uuid, from: &AttemptsFrom, limit: i64) -> Result<AttemptPage, Error> {
    let (cursor, forward) = match from {
        AttemptsFrom::Oldest => (None, true),
        AttemptsFrom::After(c) => (Some(decode_attempt_cursor(c)?), true),
        AttemptsFrom::Newest => (None, false),
        AttemptsFrom::Before(c) => (Some(decode_attempt_cursor(c)?), false),
    };
    let routed = ids::routed(id);
    let query = crate::db::query_as::<Attempt>(AssertSqlSafe(sql::attempts(cursor.is_some(), forward, routed.is_some()))).bind(id).bind(limit + 1);
    let query = match cursor {
        Some((at, number)) => query.bind(at).bind(number),
        None => query,
    };
    let query = match routed {
        Some(biz_type_id) => query.bind(biz_type_id).persistent(false),
        None => query,
    };
    let mut items = query.fetch_all(db).await?;
    let more = items.len() as i64 > limit;
    items.truncate(limit as usize);
    if !forward {
        items.reverse();
    }
    let cursor_of = |a: &Attempt| encode_attempt_cursor(a.started_at, a.number);
    let (older, newer) = if forward {
        (cursor.and(items.first().map(cursor_of)), if more { items.last().map(cursor_of) } else { None })
    } else {
        (if more { items.first().map(cursor_of) } else { None }, cursor.and(items.last().map(cursor_of)))
    };
    Ok(AttemptPage { items, older, newer })
}

/// How many attempts task `id` has had in all (a count over attempts_task_idx).
pub async fn attempt_total<'e>(db: impl sqlx::PgExecutor<'e>, id: Uuid) -> Result<i64, Error> {
    let query = match ids::routed(id) {
        Some(biz_type_id) => crate::db::query_scalar(sql::ATTEMPT_TOTAL_CITUS).bind(id).bind(biz_type_id).persistent(false),
        None => crate::db::query_scalar("SELECT count(*) FROM attempts WHERE task_id = $1").bind(id),
    };
    Ok(query.fetch_one(db).await?)
}

/// How many attempts task `id` had before `attempt` (in the order `attempts` pages them).
pub async fn attempts_before<'e>(db: impl sqlx::PgExecutor<'e>, id: Uuid, attempt: &Attempt) -> Result<i64, Error> {
    let query = match ids::routed(id) {
        Some(biz_type_id) => crate::db::query_scalar(sql::ATTEMPTS_BEFORE_CITUS)
            .bind(id)
            .bind(attempt.started_at)
            .bind(attempt.number)
            .bind(biz_type_id)
            .persistent(false),
        None => crate::db::query_scalar("SELECT count(*) FROM attempts WHERE task_id = $1 AND (started_at, number) < ($2, $3)")
            .bind(id)
            .bind(attempt.started_at)
            .bind(attempt.number),
    };
    Ok(query.fetch_one(db).await?)
}

fn encode_attempt_cursor(started_at: DateTime<Utc>, number: i32) -> String {
    URL_SAFE_NO_PAD.encode(format!("a|{}|{number}", started_at.to_rfc3339_opts(chrono::SecondsFormat::Micros, true)))
}

fn decode_attempt_cursor(cursor: &str) -> Result<(DateTime<Utc>, i32), Error> {
    let bad = || Error::invalid("cursor", "is not a cursor returned by this API");
    let text = String::from_utf8(URL_SAFE_NO_PAD.decode(cursor).map_err(|_| bad())?).map_err(|_| bad())?;
    let mut parts = text.splitn(3, '|');
    let (Some("a"), Some(at), Some(number)) = (parts.next(), parts.next(), parts.next()) else {
        return Err(bad());
    };
    Ok((DateTime::parse_from_rfc3339(at).map_err(|_| bad())?.with_timezone(&Utc), number.parse().map_err(|_| bad())?))
}

/// One task, without its attempts (inside the caller's transaction, if given one).
pub async fn read<'e>(db: impl sqlx::PgExecutor<'e>, id: Uuid) -> Result<Option<Task>, Error> {
    let query = match ids::routed(id) {
        Some(biz_type_id) => crate::db::query_as::<Task>(AssertSqlSafe(sql::read(true))).bind(id).bind(biz_type_id).persistent(false),
        None => crate::db::query_as::<Task>(AssertSqlSafe(sql::read(false))).bind(id),
    };
    Ok(query.fetch_optional(db).await?)
}

/// The by-id statements' text, on a plain install and, with the biz type the id carries
/// as `$n` (`ids::routed`), on a Citus cluster, where naming it sends the statement to its
/// shard alone (docs/book/src/design/citus.md, By id; tests/citus/statements.rs EXPLAINs
/// them). Run unnamed (`persistent(false)`) on Citus: PostgreSQL then plans each run with
/// the biz type's value, which Citus routes on; a generic plan of a prepared statement
/// would keep it a parameter, and ask every shard or fail.
pub mod sql {
    /// One task by id: `$1` the id, then (`routed`) `$2` its biz type.
    pub fn read(routed: bool) -> String {
        format!("{} WHERE t.id = $1{}", super::SELECT_TASK, if routed { " AND t.biz_type_id = $2" } else { "" })
    }

    /// A page of a task's attempts: `$1` the id, `$2` the limit, `$3` and `$4` the cursor
    /// when there is one, then (`routed`) the biz type.
    pub fn attempts(cursor: bool, forward: bool, routed: bool) -> String {
        let bound = match (cursor, forward) {
            (false, _) => "",
            (true, true) => "AND (started_at, number) > ($3, $4)",
            (true, false) => "AND (started_at, number) < ($3, $4)",
        };
        let order = if forward { "started_at, number" } else { "started_at DESC, number DESC" };
        let biz_type = match (routed, cursor) {
            (false, _) => "",
            (true, false) => " AND biz_type_id = $3",
            (true, true) => " AND biz_type_id = $5",
        };
        // Reads one more than the page, to know whether there is more: a walk of
        // attempts_task_idx (task_id, started_at) from the cursor, in each partition.
        format!(
            "SELECT number, started_at, duration_ms, status_code, error, response_excerpt, redirected_to, snoozed_until
           FROM attempts WHERE task_id = $1 {bound}{biz_type}
          ORDER BY {order} LIMIT $2"
        )
    }

    /// Whether a rescheduled task now runs at or after its deadline: `$1` the id, `$2` its
    /// biz type (the owner's).
    pub const RESCHEDULED_PAST_DEADLINE_CITUS: &str = "SELECT expires_at FROM all_tasks WHERE id = $1 AND run_at >= expires_at AND biz_type_id = $2";

    /// The other tasks of a task's key (`others_with_key`): `$1` the biz type, `$2` the
    /// key, `$3` the task. On Citus (`citus`) the tasks are read on the key's biz type's
    /// shard too: without it Citus refuses the statement ("complex joins are only
    /// supported when all distributed tables are co-located and joined on their
    /// distribution columns").
    pub fn others_with_key(citus: bool) -> String {
        format!(
            "{}
          WHERE t.id = ANY(ARRAY(SELECT unnest(k.earlier || k.task_id) FROM task_keys k
                                  WHERE k.biz_type_id = $1 AND k.key = $2))
            AND t.id <> $3{}
          ORDER BY t.created_at DESC LIMIT 20",
            super::SELECT_TASK,
            if citus { " AND t.biz_type_id = $1" } else { "" }
        )
    }

    /// `$1` the id, `$2` the biz type.
    pub const ATTEMPT_TOTAL_CITUS: &str = "SELECT count(*) FROM attempts WHERE task_id = $1 AND biz_type_id = $2";

    /// `$1` the id, `$2` and `$3` the attempt, `$4` the biz type.
    pub const ATTEMPTS_BEFORE_CITUS: &str =
        "SELECT count(*) FROM attempts WHERE task_id = $1 AND (started_at, number) < ($2, $3) AND biz_type_id = $4";

    /// What the task page tells beside the task, but for the holding node's name, on a
    /// Citus cluster: `nodes` is a coordinator table, and a join of it with the task's
    /// shard would be planned in steps (every shard read whole into the coordinator).
    /// `$1` the id, then (`routed`) `$2` the biz type.
    pub fn holding_citus(routed: bool) -> String {
        format!(
            "SELECT t.first_run_at, t.leased_by, t.lease_until, NULL::text AS node, b.mode = 'pull' AS pull
           FROM all_tasks t JOIN biz_types b ON b.id = t.biz_type_id
          WHERE t.id = $1{}",
            if routed { " AND t.biz_type_id = $2" } else { "" }
        )
    }

    /// The lock of a change by id on a Citus cluster, in `table`, on the caller's biz type's
    /// shard: `$1` the id, `$2` the biz type. Locks the row (Citus refuses FOR UPDATE
    /// across shards).
    pub fn lock_citus(table: &str) -> String {
        format!("SELECT status FROM {table} WHERE id = $1 AND biz_type_id = $2 FOR UPDATE")
    }

    /// A cancel of the task `lock` locked, in `table`: `$1` the id, then (`routed`) `$2`
    /// its biz type.
    pub fn cancel(table: &str, routed: bool) -> String {
        format!(
            "WITH t AS (
             UPDATE {table} SET status = 'cancelled', finished_at = now(), updated_at = now()
              WHERE id = $1{} RETURNING *
         )
         SELECT t.*, b.name AS biz_type FROM t JOIN biz_types b ON b.id = t.biz_type_id",
            if routed { " AND biz_type_id = $2" } else { "" }
        )
    }
}

pub async fn get_by_key(pool: &Pool, biz_type_id: i32, key: &str) -> Result<Option<Task>, Error> {
    Ok(crate::db::query_as::<Task>(AssertSqlSafe(format!(
        "{SELECT_TASK} JOIN task_keys k ON k.task_id = t.id WHERE k.biz_type_id = $1 AND k.key = $2"
    )))
    .bind(biz_type_id)
    .bind(key)
    .fetch_optional(pool)
    .await?)
}

#[derive(Debug, Default)]
pub struct ListFilter {
    pub status: Option<Status>,
    /// Only retrying tasks (`super::RETRYING_SQL`), pending ones that were tried; `status`
    /// is then None or pending.
    pub retrying: bool,
    /// run_at ≥ from
    pub from: Option<DateTime<Utc>>,
    /// run_at < to
    pub to: Option<DateTime<Utc>>,
    /// Only tasks whose payload contains this JSON text (`payload @>`, see
    /// `super::containment`). The walk is the list's, in due order, filtered: the console
    /// asks for it only within one biz type, which bounds what it reads.
    pub payload: Option<String>,
    /// Only occurrences of this timer. No index leads with it (`tasks_timer_idx` holds
    /// pending ones only): like `payload`, the walk is the list's, filtered, and the
    /// console asks for it within one biz type (and, for a timer's page, a time window).
    pub timer_id: Option<Uuid>,
    /// Only tasks of this priority: like `payload`, the list's walk filtered, within one
    /// biz type.
    pub priority: Option<i16>,
    /// Only tasks of this flow key: like `priority`, the list's walk filtered, within one
    /// biz type.
    pub flow_key: Option<String>,
    pub cursor: Option<String>,
    /// The cursor is the first row of a page, and the page before it is wanted.
    pub backward: bool,
    /// Latest due first (run_at, id descending).
    pub newest_first: bool,
    pub limit: i64,
}

pub struct Page {
    pub items: Vec<Task>,
    pub next_cursor: Option<String>,
    /// The page before (for the console; the API pages forward only).
    pub prev_cursor: Option<String>,
}

/// Where a count stops: beyond it a list says "10,000+" (counting every match of a broad
/// filter among millions would cost more than the page).
pub const COUNT_CAP: i64 = 10_000;

/// Each walk's status condition, written out rather than bound: a partial index serves a
/// statement only if its condition provably implies the index's, which a parameter never
/// does in a generic plan. Without a status, one walk per index, merged: pending tasks
/// (tasks_claim_idx), running ones (tasks_running_idx: a few, sorted), and the rest
/// (tasks_finished_list_idx). The payload search's index leaves running tasks out too
/// (migration 0050: a claim adds no entry to either).
fn walks(filter: &ListFilter) -> Vec<String> {
    match (filter.retrying, filter.status) {
        (true, _) => vec![format!("t.status = 'pending' AND {}", super::RETRYING_SQL)],
        (false, Some(status)) => vec![format!("t.status = '{status}'")],
        (false, None) => vec!["t.status = 'pending'".into(), "t.status = 'running'".into(), "t.status NOT IN ('pending', 'running')".into()],
    }
}

/// `filter`'s status condition on the task row `t` as one condition (written out, as in
/// `walks`), or None without one.
fn status_condition(filter: &ListFilter) -> Option<String> {
    match (filter.retrying, filter.status) {
        (true, _) => Some(super::RETRYING_SQL.to_string()),
        (false, Some(status)) => Some(format!("t.status = '{status}'")),
        (false, None) => None,
    }
}

/// Whether `filter` says anything of a task beyond where the list starts.
fn narrows(filter: &ListFilter) -> bool {
    status_condition(filter).is_some()
        || filter.from.is_some()
        || filter.to.is_some()
        || filter.payload.is_some()
        || filter.timer_id.is_some()
        || filter.priority.is_some()
        || filter.flow_key.is_some()
}

/// The conditions of `filter` other than status and cursor, for the task row `t`.
fn push_conditions(q: &mut QueryBuilder<Postgres>, filter: &ListFilter) {
    if let Some(from) = filter.from {
        q.push(" AND t.run_at >= ").push_bind(from);
    }
    if let Some(to) = filter.to {
        q.push(" AND t.run_at < ").push_bind(to);
    }
    if let Some(payload) = &filter.payload {
        q.push(" AND t.payload @> ").push_bind(payload.clone()).push("::jsonb");
    }
    if let Some(timer_id) = filter.timer_id {
        q.push(" AND t.timer_id = ").push_bind(timer_id);
    }
    if let Some(flow_key) = &filter.flow_key {
        q.push(" AND t.flow_key = ").push_bind(flow_key.clone());
    }
    if let Some(priority) = filter.priority {
        q.push(" AND t.priority = ").push_bind(priority);
    }
}

/// The most a page of tasks holds, payloads and other fields counted, beyond its first
/// task: 8 parallel lists of 1,000 tasks of 32 KB payloads took a node up by 343 MB before.
pub const PAGE_BYTES: usize = 2 * 1024 * 1024;
/// What a task's fields other than its payload take in an answer, about.
const ROW_BYTES: usize = 512;

/// Tasks of one biz type (or of all, for the console) in (run_at, id) order, oldest or
/// newest first, a page at a time: `filter.limit` tasks at most, and fewer where they
/// would take more than `PAGE_BYTES` (never none while one is left). The cursor is the last row's (run_at, id) (the first
/// row's, going backward), so pages stay stable while tasks are added (keyset pagination).
pub async fn list(pool: &Pool, biz_type_id: Option<i32>, filter: &ListFilter) -> Result<Page, Error> {
    let after = filter.cursor.as_deref().map(decode_cursor).transpose()?;
    if biz_type_id.is_none() && filter.payload.is_some() {
        return list_by_payload(pool, filter, after).await;
    }
    if biz_type_id.is_none() && crate::db::citus::active() {
        return Box::pin(list_each(pool, filter, after)).await;
    }
    // Built per call rather than with `$n IS NULL OR …` so that each filter combination
    // gets a plan that walks an index in (run_at, id) order: tasks_claim_idx holds a biz
    // type's pending tasks, tasks_finished_list_idx the others but running ones. Without a status filter, each walk
    // yields a page and the two are merged. Across all biz types, the same is done per biz
    // type and those pages are merged: both indexes lead with the biz type. Newest first
    // (or a page back) walks the same indexes backward.
    let descending = filter.newest_first != filter.backward;
    let (beyond, dir) = if descending { ("<", " DESC") } else { (">", "") };
    let order = format!(" ORDER BY t.run_at{dir}, t.id{dir} LIMIT ");
    let limit = filter.limit + 1;
    let mut q: QueryBuilder<Postgres> = QueryBuilder::new("");
    let all_biz_types = biz_type_id.is_none();
    if all_biz_types {
        q.push("SELECT t.* FROM biz_types b CROSS JOIN LATERAL (");
    }
    let walks = walks(filter);
    let merged = walks.len() > 1;
    if merged {
        q.push("SELECT * FROM (");
    }
    for (i, status) in walks.iter().enumerate() {
        if i > 0 {
            q.push(" UNION ALL ");
        }
        q.push("(");
        match biz_type_id {
            Some(id) => q.push(SELECT_TASK).push(" WHERE t.biz_type_id = ").push_bind(id),
            None => q.push("SELECT t.*, b.name AS biz_type FROM all_tasks t WHERE t.biz_type_id = b.id"),
        };
        q.push(" AND ").push(status);
        push_conditions(&mut q, filter);
        if let Some((run_at, id)) = after {
            q.push(format_args!(" AND (t.run_at, t.id) {beyond} (")).push_bind(run_at).push(", ").push_bind(id).push(")");
        }
        q.push(&order).push_bind(limit).push(")");
    }
    if merged {
        q.push(") t").push(&order).push_bind(limit);
    }
    if all_biz_types {
        q.push(") t").push(&order).push_bind(limit);
    }
    // Read row by row, and cut at the byte budget as well as at the limit: a page of 1,000
    // large payloads would otherwise be held whole, twice (rows and answer).
    let mut rows = q.build_query_as::<Task>().fetch(pool);
    let (mut items, mut bytes, mut more) = (Vec::new(), 0, false);
    while let Some(task) = futures_util::TryStreamExt::try_next(&mut rows).await? {
        let size = task.payload.get().len() + ROW_BYTES;
        if items.len() as i64 == filter.limit || (!items.is_empty() && bytes + size > PAGE_BYTES) {
            more = true;
            break;
        }
        bytes += size;
        items.push(task);
    }
    drop(rows);
    if filter.backward {
        items.reverse();
    }
    Ok(page_of(items, more, filter.backward, after))
}

/// A page of `items` (in the order shown) with its cursors: `more`, past them in the
/// direction walked (a page back walks backward); `after`, the cursor the page began from.
fn page_of(items: Vec<Task>, more: bool, backward: bool, after: Option<(DateTime<Utc>, Uuid)>) -> Page {
    let cursor_of = |t: &Task| encode_cursor(t.run_at, t.id);
    let (next_cursor, prev_cursor) = if backward {
        (items.last().map(cursor_of), if more { items.first().map(cursor_of) } else { None })
    } else {
        (if more { items.last().map(cursor_of) } else { None }, after.and(items.first().map(cursor_of)))
    };
    Page { items, next_cursor, prev_cursor }
}

/// `list` across every biz type on a Citus cluster, which refuses the walk of each biz type
/// inside one statement ("cannot push down this subquery"): a page of each biz type (each
/// on its worker), merged here. Each page holds the `limit` tasks nearest the cursor of its
/// biz type, so the `limit` nearest of them all are the merged page: a task a page left out
/// lies beyond its page's last, so beyond the merged page too. A round trip a biz type.
async fn list_each(pool: &Pool, filter: &ListFilter, after: Option<(DateTime<Utc>, Uuid)>) -> Result<Page, Error> {
    let ids: Vec<i32> = crate::db::query_scalar("SELECT id FROM biz_types").fetch_all(pool).await?;
    let (mut items, mut more) = (Vec::new(), false);
    for id in ids {
        let page = list(pool, Some(id), filter).await?;
        // Past this page's tasks, in the direction walked, the biz type has more.
        more |= if filter.backward { page.prev_cursor.is_some() } else { page.next_cursor.is_some() };
        items.extend(page.items);
    }
    // In the order shown, newest first or not; a page back keeps the last `limit` of it.
    items.sort_by_key(|t| (t.run_at, t.id));
    if filter.newest_first {
        items.reverse();
    }
    let limit = filter.limit.max(0) as usize;
    if items.len() > limit {
        more = true;
        if filter.backward {
            items.drain(..items.len() - limit);
        } else {
            items.truncate(limit);
        }
    }
    Ok(page_of(items, more, filter.backward, after))
}

/// Across every biz type, a payload search can no longer walk a biz type's tasks in due
/// order and filter them (that would read every task of every biz type): it reads the
/// matches from the payload index instead (tasks_payload_resting_idx, on the hot partitions: tasks
/// due before the hot horizon), at most `COUNT_CAP + 1` of them per walk past the cursor, and shows
/// those in due order. Up to `COUNT_CAP` matches the pages are exact; beyond, each page is
/// the earliest due of the matches read, and the count says "10,000+".
async fn list_by_payload(pool: &Pool, filter: &ListFilter, after: Option<(DateTime<Utc>, Uuid)>) -> Result<Page, Error> {
    let descending = filter.newest_first != filter.backward;
    let (beyond, dir) = if descending { ("<", " DESC") } else { (">", "") };
    // One read per walk (`walks`): the payload index leaves running tasks out, which
    // their own walk finds among the few running.
    let mut q: QueryBuilder<Postgres> = QueryBuilder::new("SELECT t.*, b.name AS biz_type FROM (");
    for (i, status) in walks(filter).iter().enumerate() {
        if i > 0 {
            q.push(" UNION ALL ");
        }
        q.push("(SELECT t.* FROM tasks t WHERE ").push(status);
        push_conditions(&mut q, filter);
        if let Some((run_at, id)) = after {
            q.push(format_args!(" AND (t.run_at, t.id) {beyond} (")).push_bind(run_at).push(", ").push_bind(id).push(")");
        }
        q.push(" LIMIT ").push_bind(COUNT_CAP + 1).push(")");
    }
    q.push(format_args!(") t JOIN biz_types b ON b.id = t.biz_type_id ORDER BY t.run_at{dir}, t.id{dir} LIMIT ")).push_bind(filter.limit + 1);
    let mut items: Vec<Task> = q.build_query_as().fetch_all(pool).await?;
    let more = items.len() as i64 > filter.limit;
    items.truncate(filter.limit as usize);
    Ok(paged(items, more, filter.backward, after.is_some(), |t| encode_cursor(t.run_at, t.id)))
}

/// A page's rows in the order shown and its links: `items` as read (backward: last shown
/// first), `more` when a row beyond them was read, `from_cursor` when the read started at
/// a cursor.
fn paged(mut items: Vec<Task>, more: bool, backward: bool, from_cursor: bool, cursor_of: impl Fn(&Task) -> String) -> Page {
    if backward {
        items.reverse();
    }
    let (next_cursor, prev_cursor) = if backward {
        (items.last().map(&cursor_of), if more { items.first().map(&cursor_of) } else { None })
    } else {
        (if more { items.last().map(&cursor_of) } else { None }, if from_cursor { items.first().map(&cursor_of) } else { None })
    };
    Page { items, next_cursor, prev_cursor }
}

/// How many tasks `filter` matches (its cursor aside), counting at most `COUNT_CAP + 1`:
/// more than `COUNT_CAP` means "more than that". Reads the rows it counts through the same
/// indexes as `list` (or the partitions in any order, unfiltered), walk after walk, stopping
/// at the cap.
pub async fn count(pool: &Pool, biz_type_id: Option<i32>, filter: &ListFilter) -> Result<i64, Error> {
    // Across biz types a payload search reads the payload index, which the hot partitions
    // have and cold storage has not (`list_by_payload`).
    let table = if biz_type_id.is_none() && filter.payload.is_some() { "tasks" } else { "all_tasks" };
    let mut q: QueryBuilder<Postgres> = QueryBuilder::new("SELECT count(*) FROM (");
    for (i, status) in walks(filter).iter().enumerate() {
        if i > 0 {
            q.push(" UNION ALL ");
        }
        q.push(format_args!("SELECT 1 FROM {table} t WHERE ")).push(status);
        if let Some(id) = biz_type_id {
            q.push(" AND t.biz_type_id = ").push_bind(id);
        }
        push_conditions(&mut q, filter);
    }
    q.push(" LIMIT ").push_bind(COUNT_CAP + 1).push(") c");
    Ok(q.build_query_scalar().fetch_one(pool).await?)
}

/// The tasks whose id starts with the range `super::id_prefix` made, in id order, at most
/// `limit`, in one biz type or all, that `filter` matches too (its cursor and order aside):
/// one range probe of each partition's primary key (id first), the rest checked on each
/// task found.
pub async fn by_id_prefix(
    pool: &Pool,
    (low, high): (Uuid, Uuid),
    biz_type_id: Option<i32>,
    filter: &ListFilter,
    limit: i64,
) -> Result<Vec<Task>, Error> {
    let mut q: QueryBuilder<Postgres> = QueryBuilder::new(SELECT_TASK);
    q.push(" WHERE t.id BETWEEN ").push_bind(low).push(" AND ").push_bind(high);
    if let Some(id) = biz_type_id {
        q.push(" AND t.biz_type_id = ").push_bind(id);
    }
    if let Some(status) = status_condition(filter) {
        q.push(" AND ").push(status);
    }
    push_conditions(&mut q, filter);
    q.push(" ORDER BY t.id LIMIT ").push_bind(limit);
    Ok(q.build_query_as().fetch_all(pool).await?)
}

/// A search of client keys by prefix: in one biz type or all, in key order, a page at a time.
#[derive(Debug, Default)]
pub struct KeySearch<'a> {
    /// Validated by the caller (`super::validate_key`).
    pub prefix: &'a str,
    pub biz_type_id: Option<i32>,
    pub cursor: Option<String>,
    /// The cursor is a page's first row, and the page before it is wanted.
    pub backward: bool,
    pub limit: i64,
    /// Only keys whose task this matches too (its cursor and order aside): each key's task
    /// is read as the keys are walked, so the walk is bounded by the prefix's keys.
    pub filter: Option<&'a ListFilter>,
}

/// The key search's join to each key's task and `filter`'s conditions on it, when it
/// narrows anything (without, no task is read until the page's).
fn push_key_filter(q: &mut QueryBuilder<Postgres>, filter: Option<&ListFilter>) {
    let Some(filter) = filter.filter(|f| narrows(f)) else { return };
    q.push(" AND EXISTS (SELECT 1 FROM all_tasks t WHERE t.id = k.task_id AND t.biz_type_id = k.biz_type_id");
    if let Some(status) = status_condition(filter) {
        q.push(" AND ").push(status);
    }
    push_conditions(q, filter);
    q.push(")");
}

/// The first string after every string that starts with `prefix`, in code point order (the
/// "C" collation's, for UTF-8): the prefix with its last character that can grow grown by
/// one. None: no bound (the prefix is all U+10FFFF).
fn prefix_end(prefix: &str) -> Option<String> {
    let mut chars: Vec<char> = prefix.chars().collect();
    while let Some(last) = chars.pop() {
        let next = (u32::from(last) + 1..=0x10FFFF).find_map(char::from_u32);
        if let Some(next) = next {
            chars.push(next);
            return Some(chars.into_iter().collect());
        }
    }
    None
}

/// The keys' range condition on `k`, for task_keys_prefix_idx (biz_type_id, key COLLATE
/// "C"): the database's own collation may not sort a prefix's keys together (en_US puts
/// `order-1` beside `order1`), the "C" collation does, whatever the database's.
fn push_key_range(q: &mut QueryBuilder<Postgres>, prefix: &str) {
    q.push(" AND k.key COLLATE \"C\" >= ").push_bind(prefix.to_string());
    if let Some(end) = prefix_end(prefix) {
        q.push(" AND k.key COLLATE \"C\" < ").push_bind(end);
    }
}

/// The tasks holding keys that start with `search.prefix` (a key's current task) that
/// `search.filter` matches, ordered by key and then biz type. Each biz type's keys are a range of task_keys_prefix_idx, walked
/// from the cursor for a page and merged; each task is then read by id (a probe of each
/// partition's primary key, as `read`).
pub async fn search_keys(pool: &Pool, search: &KeySearch<'_>) -> Result<Page, Error> {
    let after = search.cursor.as_deref().map(decode_key_cursor).transpose()?;
    let descending = search.backward;
    let (beyond, dir) = if descending { ("<", " DESC") } else { (">", "") };
    let limit = search.limit + 1;
    let mut q: QueryBuilder<Postgres> = QueryBuilder::new(
        "SELECT t.*, bt.name AS biz_type FROM (
             SELECT k.* FROM biz_types bt CROSS JOIN LATERAL (
                 SELECT k.biz_type_id, k.key, k.task_id FROM task_keys k WHERE k.biz_type_id = bt.id",
    );
    push_key_range(&mut q, search.prefix);
    push_key_filter(&mut q, search.filter);
    if let Some((biz_type_id, key)) = &after {
        q.push(format_args!(" AND k.key COLLATE \"C\" {beyond}= ")).push_bind(key.clone());
        q.push(format_args!(" AND (k.key COLLATE \"C\" {beyond} ")).push_bind(key.clone());
        q.push(format_args!(" OR bt.id {beyond} ")).push_bind(*biz_type_id).push(")");
    }
    q.push(format_args!(" ORDER BY k.key COLLATE \"C\"{dir} LIMIT ")).push_bind(limit).push(") k");
    if let Some(id) = search.biz_type_id {
        q.push(" WHERE bt.id = ").push_bind(id);
    }
    q.push(format_args!(" ORDER BY k.key COLLATE \"C\"{dir}, k.biz_type_id{dir} LIMIT ")).push_bind(limit);
    q.push(") k JOIN all_tasks t ON t.id = k.task_id AND t.biz_type_id = k.biz_type_id JOIN biz_types bt ON bt.id = t.biz_type_id");
    q.push(format_args!(" ORDER BY k.key COLLATE \"C\"{dir}, k.biz_type_id{dir}"));
    let mut items: Vec<Task> = q.build_query_as().fetch_all(pool).await?;
    let more = items.len() as i64 > search.limit;
    items.truncate(search.limit as usize);
    if search.backward {
        items.reverse();
    }
    let cursor_of = |t: &Task| encode_key_cursor(t.biz_type_id, t.key.as_deref().unwrap_or_default());
    let (next_cursor, prev_cursor) = if search.backward {
        (items.last().map(cursor_of), if more { items.first().map(cursor_of) } else { None })
    } else {
        (if more { items.last().map(cursor_of) } else { None }, after.and(items.first().map(cursor_of)))
    };
    Ok(Page { items, next_cursor, prev_cursor })
}

/// How many keys start with `search.prefix` (in its biz type, or all) whose task
/// `search.filter` matches, at most `COUNT_CAP + 1`: a range of task_keys_prefix_idx per
/// biz type, each key's task read when there is a filter.
pub async fn count_keys(pool: &Pool, search: &KeySearch<'_>) -> Result<i64, Error> {
    let mut q: QueryBuilder<Postgres> =
        QueryBuilder::new("SELECT count(*) FROM (SELECT 1 FROM biz_types bt JOIN task_keys k ON k.biz_type_id = bt.id WHERE true");
    push_key_range(&mut q, search.prefix);
    push_key_filter(&mut q, search.filter);
    if let Some(id) = search.biz_type_id {
        q.push(" AND bt.id = ").push_bind(id);
    }
    q.push(" LIMIT ").push_bind(COUNT_CAP + 1).push(") c");
    Ok(q.build_query_scalar().fetch_one(pool).await?)
}

fn encode_key_cursor(biz_type_id: i32, key: &str) -> String {
    URL_SAFE_NO_PAD.encode(format!("{biz_type_id}|{key}"))
}

fn decode_key_cursor(cursor: &str) -> Result<(i32, String), Error> {
    let bad = || Error::invalid("cursor", "is not a cursor returned by this page");
    let text = String::from_utf8(URL_SAFE_NO_PAD.decode(cursor).map_err(|_| bad())?).map_err(|_| bad())?;
    let (id, key) = text.split_once('|').ok_or_else(bad)?;
    super::validate_key(key).map_err(|_| bad())?;
    Ok((id.parse().map_err(|_| bad())?, key.to_string()))
}

/// The other tasks that held `task`'s key in its biz type: the key's current task and those
/// it held before (`task_keys.earlier`), newest first, at most 20. Empty without a key. The
/// ids go in as an array, so each is a probe of a primary key (as `read` does), never a
/// scan of the view.
pub async fn others_with_key<'e>(db: impl sqlx::PgExecutor<'e>, task: &Task) -> Result<Vec<Task>, Error> {
    let Some(key) = &task.key else { return Ok(vec![]) };
    let citus = crate::db::citus::active();
    let query = crate::db::query_as::<Task>(AssertSqlSafe(sql::others_with_key(citus))).bind(task.biz_type_id).bind(key).bind(task.id);
    Ok(if citus { query.persistent(false) } else { query }.fetch_all(db).await?)
}

/// The ids of every task that held `key`, in any biz type (the key's current task and
/// those before it, `task_keys.earlier`), at most `limit`: the audit log's search by key.
/// A probe of `task_keys`' primary key per biz type; locks nothing.
pub async fn ids_with_key(pool: &Pool, key: &str, limit: i64) -> Result<Vec<Uuid>, Error> {
    Ok(crate::db::query_scalar(
        "SELECT held.task_id FROM biz_types b CROSS JOIN LATERAL
                (SELECT unnest(k.earlier || k.task_id) AS task_id FROM task_keys k WHERE k.biz_type_id = b.id AND k.key = $1) held
          LIMIT $2",
    )
    .bind(key)
    .bind(limit)
    .fetch_all(pool)
    .await?)
}

/// What the task page tells beside the task: when it was first due, and who holds it.
#[derive(Debug, sqlx::FromRow)]
pub struct Holding {
    /// The run_at it was created with, kept through reschedules, replays and retries;
    /// None for tasks made before migration 0019.
    pub first_run_at: Option<DateTime<Utc>>,
    /// Running: the node (callbacks) or the receipt (pull) holding it, and until when.
    pub leased_by: Option<Uuid>,
    pub lease_until: Option<DateTime<Utc>>,
    /// The holding node's hostname and pid, while it is registered in `nodes`.
    pub node: Option<String>,
    /// Its biz type is pull: a holder is a consumer's receipt, never a node.
    pub pull: bool,
}

/// The task's `Holding`, or None: a probe of the primary key of each part of `all_tasks`
/// (as `read`), and of `nodes`.
pub async fn holding(db: &mut PgConnection, id: Uuid) -> Result<Option<Holding>, Error> {
    if crate::db::citus::active() {
        return holding_citus(db, id).await;
    }
    Ok(crate::db::query_as::<Holding>(
        "SELECT t.first_run_at, t.leased_by, t.lease_until, n.hostname || ' (pid ' || n.pid || ')' AS node, b.mode = 'pull' AS pull
           FROM all_tasks t JOIN biz_types b ON b.id = t.biz_type_id LEFT JOIN nodes n ON n.id = t.leased_by
          WHERE t.id = $1",
    )
    .bind(id)
    .fetch_optional(db)
    .await?)
}

/// `holding` on a Citus cluster: the task on its shard (every shard for an id that carries
/// no biz type), then the holding node's name on the coordinator.
async fn holding_citus(db: &mut PgConnection, id: Uuid) -> Result<Option<Holding>, Error> {
    let routed = ids::routed(id);
    let query = crate::db::query_as::<Holding>(AssertSqlSafe(sql::holding_citus(routed.is_some()))).bind(id);
    let query = match routed {
        Some(biz_type_id) => query.bind(biz_type_id).persistent(false),
        None => query,
    };
    let Some(mut holding) = query.fetch_optional(&mut *db).await? else {
        return Ok(None);
    };
    if let Some(node) = holding.leased_by.filter(|_| !holding.pull) {
        holding.node =
            crate::db::query_scalar("SELECT hostname || ' (pid ' || pid || ')' FROM nodes WHERE id = $1").bind(node).fetch_optional(&mut *db).await?;
    }
    Ok(Some(holding))
}

/// Of these timers (of these biz types), how many occurrences each has failed or expired
/// and not replayed: a timer with any is failing (the console's timer pages). A walk of
/// `tasks_failed_idx` and `tasks_expired_idx` for the biz types: failed tasks are few.
/// Timers with none are left out. Locks nothing.
pub async fn failed_occurrences(pool: &Pool, biz_type_ids: &[i32], timer_ids: &[Uuid]) -> Result<std::collections::HashMap<Uuid, i64>, Error> {
    let rows: Vec<(Uuid, i64)> = crate::db::query_as(
        "SELECT t.timer_id, count(*) FROM tasks t
          WHERE t.status IN ('failed', 'expired') AND t.biz_type_id = ANY($1) AND t.timer_id = ANY($2)
          GROUP BY t.timer_id",
    )
    .bind(biz_type_ids)
    .bind(timer_ids)
    .fetch_all(pool)
    .await?;
    Ok(rows.into_iter().collect())
}

/// Tasks holding this client key, in any biz type (the console's search box).
pub async fn find_by_key(pool: &Pool, key: &str) -> Result<Vec<Task>, Error> {
    Ok(crate::db::query_as::<Task>(AssertSqlSafe(format!(
        "{SELECT_TASK} JOIN task_keys k ON k.task_id = t.id AND k.biz_type_id = t.biz_type_id WHERE k.key = $1"
    )))
    .bind(key)
    .fetch_all(pool)
    .await?)
}

fn encode_cursor(run_at: DateTime<Utc>, id: Uuid) -> String {
    URL_SAFE_NO_PAD.encode(format!("{}|{id}", run_at.to_rfc3339_opts(chrono::SecondsFormat::Micros, true)))
}

fn decode_cursor(cursor: &str) -> Result<(DateTime<Utc>, Uuid), Error> {
    let bad = || Error::invalid("cursor", "is not a cursor returned by this API");
    let text = String::from_utf8(URL_SAFE_NO_PAD.decode(cursor).map_err(|_| bad())?).map_err(|_| bad())?;
    let (run_at, id) = text.split_once('|').ok_or_else(bad)?;
    Ok((DateTime::parse_from_rfc3339(run_at).map_err(|_| bad())?.with_timezone(&Utc), id.parse().map_err(|_| bad())?))
}

/// Locks the task wherever it lives and checks that the caller's biz type owns it.
/// Returns its status and whether it is in cold storage.
pub(super) async fn lock(tx: &mut PgConnection, owner: i32, id: Uuid) -> Result<(Status, bool), Error> {
    if crate::db::citus::active() {
        return lock_citus(tx, owner, id).await;
    }
    for (table, cold) in [("tasks", false), ("tasks_cold", true)] {
        let row: Option<(i32, Status)> =
            crate::db::query_as(AssertSqlSafe(format!("SELECT biz_type_id, status FROM {table} WHERE id = $1 FOR UPDATE")))
                .bind(id)
                .fetch_optional(&mut *tx)
                .await?;
        if let Some((biz_type_id, status)) = row {
            if biz_type_id != owner {
                return Err(Error::Forbidden("this task belongs to another biz type".into()));
            }
            return Ok((status, cold));
        }
    }
    Err(Error::NotFound(format!("no task with id {id}")))
}

/// `lock` on a Citus cluster, which refuses a FOR UPDATE that asks every shard: the row is
/// locked on the caller's biz type's shard (whatever the id carries: a change is only ever
/// the owner's). Not found there, a read by id (on the id's biz type's shard, or on every
/// shard for an id that carries none) tells another biz type's task from none.
async fn lock_citus(tx: &mut PgConnection, owner: i32, id: Uuid) -> Result<(Status, bool), Error> {
    if ids::routed(id).is_none_or(|biz_type_id| biz_type_id == owner) {
        for (table, cold) in [("tasks", false), ("tasks_cold", true)] {
            let status: Option<Status> = crate::db::query_scalar(AssertSqlSafe(sql::lock_citus(table)))
                .bind(id)
                .bind(owner)
                .persistent(false)
                .fetch_optional(&mut *tx)
                .await?;
            if let Some(status) = status {
                return Ok((status, cold));
            }
        }
    }
    match read(&mut *tx, id).await? {
        Some(_) => Err(Error::Forbidden("this task belongs to another biz type".into())),
        None => Err(Error::NotFound(format!("no task with id {id}"))),
    }
}

/// Which task a client's change is for: by chime's id, or by the client's key (the task
/// holding it, the newest of the key's tasks).
#[derive(Debug, Clone, Copy)]
pub enum Target<'a> {
    Id(Uuid),
    Key(&'a str),
}

/// Locks the task a change is for, as `lock` does; returns its id too.
async fn lock_target(tx: &mut PgConnection, owner: i32, target: Target<'_>) -> Result<(Uuid, Status, bool), Error> {
    match target {
        Target::Id(id) => lock(tx, owner, id).await.map(|(status, cold)| (id, status, cold)),
        Target::Key(key) => lock_by_key(tx, owner, key).await,
    }
}

/// Locks the task holding `key` in biz type `owner`: the key's row by its primary key gives
/// the task, whose row is then locked as `lock` does. The key's row itself is not locked: a
/// replace that hands the key to a new task meanwhile leaves this change with the old one
/// (finished, so refused as by id), as if it had come first.
async fn lock_by_key(tx: &mut PgConnection, owner: i32, key: &str) -> Result<(Uuid, Status, bool), Error> {
    let unknown = || Error::NotFound(format!("no task with key `{key}` in this biz type"));
    let id: Uuid = crate::db::query_scalar("SELECT task_id FROM task_keys WHERE biz_type_id = $1 AND key = $2")
        .bind(owner)
        .bind(key)
        .fetch_optional(&mut *tx)
        .await?
        .ok_or_else(unknown)?;
    match lock(tx, owner, id).await {
        Ok((status, cold)) => Ok((id, status, cold)),
        // Retired with its partition, its key not yet forgotten.
        Err(Error::NotFound(_)) => Err(unknown()),
        Err(e) => Err(e),
    }
}

/// What `requeue` changes of the tasks it puts back; each None keeps what the task had.
#[derive(Default)]
pub(super) struct Requeue<'a> {
    /// The new `run_at`.
    pub when: Option<When>,
    pub payload: Option<&'a serde_json::value::RawValue>,
    /// Also clears the attempt count and the last error (a replay).
    pub fresh_start: bool,
    /// Sets the deadline: to none, or counted from the new run_at.
    pub deadline: Option<Option<Deadline>>,
    pub priority: Option<i16>,
}

impl Requeue<'_> {
    /// A replay: a fresh start, due now, without a deadline (its `expires_at` was the
    /// original delivery's).
    pub fn replay() -> Self {
        Requeue { when: Some(When::After { delay_ms: 0 }), fresh_start: true, deadline: Some(None), ..Requeue::default() }
    }
}

/// Puts locked tasks back to pending ("back to pending at T") with `changes`, each moved
/// to whichever of the hot partitions or cold storage its time belongs in. The one
/// statement reschedule, replay, bulk replay (`bulk.rs`) and a create's replace
/// (`replace.rs`) share; a lease's retry stays in place (`lease::record`). The tasks must
/// be locked by the caller and all in cold storage (`cold`) or all not.
pub(super) async fn requeue(tx: &mut PgConnection, cold: bool, ids: &[Uuid], changes: Requeue<'_>) -> Result<Vec<Task>, Error> {
    if ids.is_empty() {
        return Ok(vec![]);
    }
    let Requeue { when, payload, fresh_start, deadline, priority } = changes;
    let source = if cold { "tasks_cold" } else { "tasks" };
    let (run_at, delay_ms) = when.map(When::binds).unwrap_or_default();
    let (expires_at, ttl_ms) = deadline.flatten().map(Deadline::binds).unwrap_or_default();
    let tasks = crate::db::query_as::<Task>(AssertSqlSafe(format!(
        "WITH old AS (
             DELETE FROM {source} WHERE id = ANY($1) RETURNING *
         ), moved AS (
             SELECT *, coalesce($2::timestamptz, now() + $3::bigint * interval '1 millisecond', run_at) AS new_run_at
               FROM old
         ), new AS (
             SELECT id, biz_type_id, key, new_run_at AS run_at,
                    coalesce($4::jsonb, payload) AS payload,
                    CASE WHEN $5 THEN 0 ELSE attempt_count END AS attempt_count,
                    timer_id,
                    CASE WHEN $5 THEN NULL ELSE last_error END AS last_error,
                    created_at,
                    CASE WHEN $7 THEN coalesce($8::timestamptz, new_run_at + $9::bigint * interval '1 millisecond')
                         ELSE expires_at END AS expires_at,
                    traceparent,
                    -- Kept: when it was first due, whatever moved it since.
                    first_run_at,
                    -- Counted afresh after a replay, as attempts are (max_snoozes).
                    CASE WHEN $5 THEN 0 ELSE snoozes END AS snoozes,
                    coalesce($10::smallint, priority) AS priority,
                    flow_key
               FROM moved
         ), hot AS (
             INSERT INTO tasks (id, biz_type_id, key, run_at, payload, attempt_count, timer_id, last_error, created_at,
                                expires_at, traceparent, first_run_at, snoozes, priority, flow_key)
             SELECT * FROM new WHERE run_at < (SELECT until FROM hot_horizon)
             RETURNING *
         ), cold AS (
             INSERT INTO tasks_cold (id, biz_type_id, key, run_at, payload, attempt_count, timer_id, last_error, created_at,
                                     expires_at, traceparent, first_run_at, snoozes, priority, flow_key)
             SELECT * FROM new WHERE run_at >= (SELECT until FROM hot_horizon)
             RETURNING *
         ), wake AS (
             -- As on create: wake the engines if a task is now due within a second, naming its
             -- biz type (wake.rs's `Wake::DueFor`). A boolean rather than pg_notify's void, as
             -- in insert.sql: Citus keeps a CTE's rows as an intermediate result, which cannot
             -- hold a void.
             SELECT pg_notify($6, concat('due:', biz_type_id)) IS NULL AS told FROM new WHERE run_at <= now() + interval '1 second' LIMIT 1
         )
         SELECT t.*, b.name AS biz_type
           FROM (SELECT * FROM hot UNION ALL SELECT * FROM cold) t JOIN biz_types b ON b.id = t.biz_type_id
           CROSS JOIN (SELECT count(*) FROM wake) w"
    )))
    .bind(ids)
    .bind(run_at)
    .bind(delay_ms)
    .bind(payload)
    .bind(fresh_start)
    .bind(crate::wake::CHANNEL)
    .bind(deadline.is_some())
    .bind(expires_at)
    .bind(ttl_ms)
    .bind(priority)
    .fetch_all(&mut *tx)
    .await?;
    Ok(tasks)
}

/// The one task a statement on one locked id returned.
fn one(mut tasks: Vec<Task>) -> Result<Task, Error> {
    tasks.pop().ok_or(Error::Db(sqlx::Error::RowNotFound))
}

/// What a reschedule changes of a pending task; each None keeps what the task has.
#[derive(Default, Clone, Copy)]
pub struct Reschedule<'a> {
    pub when: Option<When>,
    pub payload: Option<&'a serde_json::value::RawValue>,
    pub priority: Option<i16>,
}

/// Changes the run time, payload or priority of a pending task, recorded in the audit log
/// as `actor`'s (`task.reschedule`) in the same transaction.
pub async fn reschedule(pool: &Pool, owner: i32, id: Uuid, changes: Reschedule<'_>, actor: &str) -> Result<Task, Error> {
    reschedule_target(pool, owner, Target::Id(id), changes, actor).await
}

/// `reschedule`, of the task found by id or by key.
pub async fn reschedule_target(pool: &Pool, owner: i32, target: Target<'_>, changes: Reschedule<'_>, actor: &str) -> Result<Task, Error> {
    let Reschedule { when, payload, priority } = changes;
    let mut tx = pool.begin().await?;
    let (id, status, cold) = lock_target(&mut tx, owner, target).await?;
    if status != Status::Pending {
        return Err(Error::invalid_state(format!("only a pending task can be changed; this one is {status}")));
    }
    let task = one(requeue(&mut tx, cold, &[id], Requeue { when, payload, priority, ..Requeue::default() }).await?)?;
    if let Some(when) = when {
        // No callback starts at or after the deadline: a task moved there could only expire.
        let query = if crate::db::citus::active() {
            crate::db::query_scalar(sql::RESCHEDULED_PAST_DEADLINE_CITUS).bind(id).bind(owner).persistent(false)
        } else {
            crate::db::query_scalar("SELECT expires_at FROM all_tasks WHERE id = $1 AND run_at >= expires_at").bind(id)
        };
        let deadline: Option<DateTime<Utc>> = query.fetch_optional(&mut *tx).await?.flatten();
        if let Some(deadline) = deadline {
            let field = if matches!(when, When::At(_)) { "run_at" } else { "delay_ms" };
            return Err(Error::invalid(
                field,
                format!("would be at or after the task's deadline (expires_at {}); choose an earlier time", deadline.to_rfc3339()),
            ));
        }
    }
    // The due time and priority it now has, and whether the payload was replaced (not the
    // payload itself).
    let after = serde_json::json!({"run_at": task.run_at, "priority": task.priority, "payload_replaced": payload.is_some()});
    audit::record_task(&mut tx, actor, Action::TaskReschedule, id, None, Some(after)).await?;
    tx.commit().await?;
    Ok(task)
}

/// Puts a finished task (failed, succeeded, cancelled or expired) back to pending, due now,
/// without a deadline (its `expires_at` was the original delivery's). Its attempts stay in
/// the history. Recorded in the audit log as `actor`'s (`task.replay`) in the same
/// transaction.
pub async fn replay(pool: &Pool, owner: i32, id: Uuid, actor: &str) -> Result<Task, Error> {
    let mut tx = pool.begin().await?;
    let (status, cold) = lock(&mut tx, owner, id).await?;
    if !status.is_finished() {
        return Err(Error::invalid_state(format!("only a finished task can be replayed; this one is {status}")));
    }
    // A replay is a fresh start: the deadline was the first run's.
    let task = one(requeue(&mut tx, cold, &[id], Requeue::replay()).await?)?;
    let (before, after) = (serde_json::json!({"status": status}), serde_json::json!({"status": Status::Pending}));
    audit::record_task(&mut tx, actor, Action::TaskReplay, id, Some(before), Some(after)).await?;
    tx.commit().await?;
    Ok(task)
}

/// Cancels a pending task, recorded in the audit log as `actor`'s (`task.cancel`) in the
/// same transaction. A running or finished task cannot be cancelled.
pub async fn cancel(pool: &Pool, owner: i32, id: Uuid, actor: &str) -> Result<Task, Error> {
    cancel_target(pool, owner, Target::Id(id), actor).await
}

/// `cancel`, of the task found by id or by key.
pub async fn cancel_target(pool: &Pool, owner: i32, target: Target<'_>, actor: &str) -> Result<Task, Error> {
    let mut tx = pool.begin().await?;
    let (id, status, cold) = lock_target(&mut tx, owner, target).await?;
    if status != Status::Pending {
        return Err(Error::invalid_state(format!("only a pending task can be cancelled; this one is {status}")));
    }
    let table = if cold { "tasks_cold" } else { "tasks" };
    // The row `lock_target` locked; on Citus, on its shard (the owner's: lock_target checked it).
    let query = if crate::db::citus::active() {
        crate::db::query_as::<Task>(AssertSqlSafe(sql::cancel(table, true))).bind(id).bind(owner).persistent(false)
    } else {
        crate::db::query_as::<Task>(AssertSqlSafe(sql::cancel(table, false))).bind(id)
    };
    let task = query.fetch_one(&mut *tx).await?;
    audit::record_task(&mut tx, actor, Action::TaskCancel, id, None, None).await?;
    tx.commit().await?;
    Ok(task)
}

/// Cancels the pending tasks of archived biz types (of the one given, or of all), hot and
/// cold; returns how many. Archiving calls it, and the leader's sweep calls it again for
/// what was left pending afterwards (a retry of a callback in flight, a create that passed
/// its token check just before). Running tasks are left to finish.
pub async fn cancel_archived<'e>(executor: impl sqlx::PgExecutor<'e>, biz_type_id: Option<i32>) -> Result<u64, Error> {
    // Locks the pending rows of archived biz types. One a claim holds is waited for, and
    // is running by then: it is left to finish, as the doc says.
    let cancelled: i64 = crate::db::query_scalar(
        "WITH archived AS (
             SELECT id FROM biz_types WHERE archived_at IS NOT NULL AND ($1::int IS NULL OR id = $1)
         ), hot AS (
             UPDATE tasks SET status = 'cancelled', finished_at = now(), updated_at = now()
              WHERE status = 'pending' AND biz_type_id IN (SELECT id FROM archived) RETURNING 1
         ), cold AS (
             UPDATE tasks_cold SET status = 'cancelled', finished_at = now(), updated_at = now()
              WHERE status = 'pending' AND biz_type_id IN (SELECT id FROM archived) RETURNING 1
         )
         SELECT (SELECT count(*) FROM hot) + (SELECT count(*) FROM cold)",
    )
    .bind(biz_type_id)
    .fetch_one(executor)
    .await?;
    Ok(cancelled as u64)
}

/// Removes the occurrences of timer `timer_id` (of biz type `biz_type_id`) that have not
/// fired, pending and never attempted, with their keys; returns how many. The caller holds
/// the timer's row lock, so the leader writes no occurrence of it meanwhile.
pub async fn remove_unfired(tx: &mut PgConnection, timer_id: Uuid, biz_type_id: i32) -> Result<u64, Error> {
    let removed: i64 = crate::db::query_scalar(
        "WITH hot AS (
             DELETE FROM tasks WHERE timer_id = $1 AND status = 'pending' AND attempt_count = 0 RETURNING id, key
         ), cold AS (
             DELETE FROM tasks_cold WHERE timer_id = $1 AND status = 'pending' AND attempt_count = 0 RETURNING id, key
         ), gone AS (
             SELECT * FROM hot UNION ALL SELECT * FROM cold
         ), keys AS (
             DELETE FROM task_keys k USING gone g WHERE k.biz_type_id = $2 AND k.key = g.key AND k.task_id = g.id
         )
         SELECT count(*) FROM gone",
    )
    .bind(timer_id)
    .bind(biz_type_id)
    .fetch_one(tx)
    .await?;
    Ok(removed as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefix_ends_before_the_first_string_it_does_not_start() {
        assert_eq!(prefix_end("order-").as_deref(), Some("order."));
        assert_eq!(prefix_end("a\u{10FFFF}").as_deref(), Some("b"));
        assert_eq!(prefix_end("\u{D7FF}").as_deref(), Some("\u{E000}"));
        assert_eq!(prefix_end("\u{10FFFF}"), None);
        let (id, key) = (7, "order|1");
        assert_eq!(decode_key_cursor(&encode_key_cursor(id, key)).unwrap(), (id, key.to_string()));
        assert!(decode_key_cursor("bm9wZQ").is_err());
    }

    #[test]
    fn cursors_round_trip_and_reject_garbage() {
        let at: DateTime<Utc> = "2026-11-21T12:00:00.123456Z".parse().unwrap();
        let id = Uuid::now_v7();
        assert_eq!(decode_cursor(&encode_cursor(at, id)).unwrap(), (at, id));
        for bad in ["", "!!", "bm90LWEtY3Vyc29y", &URL_SAFE_NO_PAD.encode("2026-01-01T00:00:00Z|nope")] {
            assert!(decode_cursor(bad).is_err(), "{bad}");
        }
    }

    mod properties {
        use proptest::prelude::*;

        use super::*;

        proptest! {
            #![proptest_config(crate::proptest_config(512))]

            /// A cursor this API made reads back as the same position, for any time RFC 3339
            /// can write (years 0000 to 9999; tasks are due within 10 years); any other text
            /// is refused by name, never a panic.
            #[test]
            fn cursors_round_trip_and_any_other_text_is_refused(
                micros in -62_167_219_200_000_000i64..253_402_300_800_000_000,
                id in any::<u128>(),
                text in prop_oneof![any::<String>(), "[A-Za-z0-9_-]{0,80}"],
            ) {
                let (at, id) = (DateTime::from_timestamp_micros(micros).unwrap(), Uuid::from_u128(id));
                prop_assert_eq!(decode_cursor(&encode_cursor(at, id)).ok(), Some((at, id)));
                match decode_cursor(&text) {
                    Ok(_) => {}
                    Err(Error::Invalid { field, .. }) => prop_assert_eq!(field, "cursor"),
                    Err(e) => prop_assert!(false, "{e:?}"),
                }
            }
        }
    }
}

/// A flow key whose next tasks wait (docs/design/claim.md, Flow keys and order by key).
#[derive(Debug, sqlx::FromRow)]
pub struct HeldKey {
    pub flow_key: String,
    /// Ordered: the task holding the key while it waits for its retry or snooze. At its
    /// cap: None.
    pub task_id: Option<Uuid>,
    /// Its tasks in flight now.
    pub running: i64,
    pub attempt_count: Option<i32>,
    /// When the holding task is tried again.
    pub run_at: Option<DateTime<Utc>>,
    pub last_error: Option<String>,
}

/// Up to `limit` flow keys of the biz type whose next tasks wait: for an ordered one, those
/// held by a task waiting for its retry or snooze (soonest first); otherwise those with
/// `cap` tasks in flight. Both read tasks_flow_busy_idx (migration 0040), which holds only
/// what is in flight or retrying.
pub async fn held_flow_keys(pool: &Pool, biz_type_id: i32, cap: i32, ordered: bool, limit: i64) -> Result<Vec<HeldKey>, Error> {
    let sql = if ordered {
        "SELECT flow_key, id AS task_id, 0::int8 AS running, attempt_count, run_at, last_error FROM tasks
          WHERE biz_type_id = $1 AND flow_key IS NOT NULL AND status = 'pending' AND (attempt_count > 0 OR snoozes > 0)
          ORDER BY run_at LIMIT $3"
    } else {
        "SELECT flow_key, NULL::uuid AS task_id, count(*) AS running, NULL::int4 AS attempt_count,
                NULL::timestamptz AS run_at, NULL::text AS last_error
           FROM tasks WHERE biz_type_id = $1 AND flow_key IS NOT NULL AND status = 'running'
          GROUP BY flow_key HAVING count(*) >= $2 ORDER BY flow_key LIMIT $3"
    };
    Ok(crate::db::query_as(sql).bind(biz_type_id).bind(cap).bind(limit).fetch_all(pool).await?)
}
