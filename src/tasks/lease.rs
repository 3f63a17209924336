//! Leases: the one way a task leaves `pending`, and the one way it comes back. The engine
//! (callbacks) and pull (consumers) are two holders of the same kind of lease:
//!
//! * `claim` (engine) and `reserve` (pull) move due tasks to `running`, each with a holder
//!   in `leased_by` (the node, or a receipt per reserved task) and a `lease_until`;
//! * `record` settles leases: succeeded, failed, or pending again at a retry time (backoff
//!   computed here, once, for both), with one attempt each; `touch` extends a reservation,
//!   `give_back` returns tasks a stopping node claimed ahead and never started;
//! * `recover_expired_leases` (the leader, or any node) puts back what a dead holder left,
//!   and `release` what a person judged a dead pull consumer holds, before its time runs out;
//! * `expire_overdue` (the leader) ends the pending tasks whose deadline passed unclaimed.
//!
//! Deadlines are kept at every step (no callback starts at or after `expires_at`): the
//! claim and reserve end what they pick past it, a retry or snooze reaching it ends the
//! task (`Verdict::Expire`), lease recovery too.
//!
//! Every statement that changes a lease compares the holder on the locked row, so a holder
//! whose lease ran out can never settle the task of the one that holds it now. The
//! statements are whole `.sql` files under `sql/`, each opening with what it locks and why.

use std::collections::HashMap;
use std::sync::LazyLock;
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use rand::Rng;
use serde::Serialize;
use sqlx::PgConnection;
use uuid::Uuid;

use super::Task;
use crate::db::Pool;
use crate::wake;

pub mod flows_citus;

/// A task this node holds a lease on.
#[derive(Debug, sqlx::FromRow)]
pub struct Claimed {
    pub id: Uuid,
    pub key: Option<String>,
    pub flow_key: Option<String>,
    pub run_at: DateTime<Utc>,
    /// The payload as stored, passed through to the callback body without parsing.
    pub payload: String,
    /// This delivery's number (1 for the first try since creation or replay).
    pub attempt_count: i32,
    pub timer_id: Option<Uuid>,
    /// The task's deadline: no callback starts at or after it (docs/design/contract.md, Tasks by key).
    pub expires_at: Option<DateTime<Utc>>,
    /// The W3C trace context its create carried; each callback sends a child of it.
    pub traceparent: Option<String>,
    /// The claim found the deadline passed and ended the task `expired` instead of leasing
    /// it: not to be delivered (`claim` leaves these out of what it returns).
    pub expired: bool,
    /// The database clock as the row was returned: with `run_at`, tells how long to wait
    /// before calling back, whatever this node's own clock says.
    pub db_now: DateTime<Utc>,
}

/// What a claim took.
#[derive(Debug, Default)]
pub struct Claim {
    /// The tasks now leased to this node.
    pub leased: Vec<Claimed>,
    /// Tasks picked whose deadline had passed, ended `expired` instead.
    pub expired: usize,
    /// The biz type's cap (max_in_flight, across the cluster) left tasks due untaken: a
    /// slot frees when a lease anywhere is settled, given back or recovered, and no node is
    /// told when another's does. Also set when a flow key's limit held back its due tasks.
    pub capped: bool,
    /// Where the next claim's walk of the biz type's flow keys goes on from (None: from
    /// the first key).
    pub cursor: Option<String>,
    /// When the biz type's settings last changed, as the claim saw them: settings read
    /// before that are too old to deliver what it leased.
    pub settings_at: Option<DateTime<Utc>>,
    /// The biz type had tasks of another priority than 5 due: its next claims are better
    /// made with the priority branches (`Want::priorities`).
    pub prioritized: bool,
}

/// One biz type's part of a claim: up to `limit` of its tasks due now or within the next
/// `ahead_ms` (which the caller holds until they are due), leased for `lease_ms` after that.
#[derive(Debug, Clone)]
pub struct Want {
    pub biz_type_id: i32,
    pub limit: i64,
    pub ahead_ms: i64,
    pub lease_ms: i64,
    /// How many of `limit` go to the longest-due tasks, whatever their priority.
    pub oldest: i64,
    /// Take them from this lane alone (`chime_lane`, 0 to 15; pick.sql), or None: from the
    /// whole biz type. Not applied with priorities or per-key limits.
    pub lane: Option<i32>,
    /// The biz type's per-key limits, if it has any (pick_flow.sql picks for it).
    pub flow: Option<FlowWant>,
    /// Claim with the priority branches (pick_priority.sql) at once: a claim lately found
    /// the biz type needing them (`Claim::prioritized`). Without, a claim that finds it
    /// so makes a second statement.
    pub priorities: bool,
}

/// A biz type's per-key limits, for a claim.
#[derive(Debug, Clone)]
pub struct FlowWant {
    /// Tasks of one flow key in flight at once, across the cluster (1 when ordered; 0: no cap).
    pub cap: i32,
    /// One at a time per key, in run_at order.
    pub ordered: bool,
    /// Where the walk of the biz type's keys goes on from (the last claim's `Claim::cursor`).
    pub cursor: Option<String>,
    /// Leases a second per key, across the cluster; None: no such limit.
    pub rate: Option<f64>,
}

/// Leases to node `node_id` what each of `wants` asks for, in one statement whatever the
/// number of biz types (a second for those that need the priority branches, `Pick`, and
/// a third for those with per-key limits): never more of a biz type than its max_in_flight leaves, counting
/// the leases of every node. Tasks it picked whose deadline had passed are ended `expired`
/// instead (see claim.sql). Returns each biz type's part; one that got nothing is absent.
/// `floor`: `unfinished_floor()` as last read, or None.
/// Biz types with per-key limits are claimed in a statement of their own (pick_flow.sql), so
/// that the others' claim is what it was.
/// On a Citus cluster (`db::citus::active`), one statement per biz type (`claim_each`), and
/// for a biz type with per-key limits a few (`flows_citus`).
pub async fn claim(pool: &Pool, wants: &[Want], node_id: Uuid, floor: Option<DateTime<Utc>>) -> Result<HashMap<i32, Claim>, sqlx::Error> {
    let (flows, plain): (Vec<&Want>, Vec<&Want>) = wants.iter().partition(|w| w.flow.is_some());
    let mut claims: HashMap<i32, Claim> = HashMap::new();
    if crate::db::citus::active() {
        claim_each(pool, &plain, node_id, floor, &mut claims).await?;
        for want in flows {
            flows_citus::claim(pool, want, node_id, floor, &mut claims).await?;
        }
        return Ok(claims);
    }
    // Most biz types never set a priority: their claim leaves out the priority branches
    // (`Pick::Plain`), and one found to need them is claimed again with them at once
    // (`Claim::prioritized`; the engine then asks for them, `Want::priorities`, a while).
    let (mut full, plain): (Vec<&Want>, Vec<&Want>) = plain.into_iter().partition(|w| w.priorities);
    if !plain.is_empty() {
        let needing = claim_some(pool, &plain, Pick::Plain, node_id, floor, &mut claims).await?;
        full.extend(plain.into_iter().filter(|w| needing.contains(&w.biz_type_id)));
    }
    if !full.is_empty() {
        claim_some(pool, &full, Pick::Full, node_id, floor, &mut claims).await?;
    }
    if !flows.is_empty() {
        claim_some(pool, &flows, Pick::Flows, node_id, floor, &mut claims).await?;
    }
    Ok(claims)
}

/// Which pick a claim statement takes its due tasks with.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Pick {
    /// pick.sql without its priority branches: a biz type that needs them gets nothing and
    /// a `prioritized` row.
    Plain,
    /// pick.sql with its priority branches (pick_priority.sql).
    Full,
    /// pick_flow.sql, for biz types with per-key limits.
    Flows,
}

/// One claim statement for `wants`, its rows sorted into `claims`. Returns the biz types
/// it passed over because they need the priority branches (`Pick::Plain` only).
async fn claim_some(
    pool: &Pool,
    wants: &[&Want],
    pick: Pick,
    node_id: Uuid,
    floor: Option<DateTime<Utc>>,
    claims: &mut HashMap<i32, Claim>,
) -> Result<Vec<i32>, sqlx::Error> {
    let ids: Vec<i32> = wants.iter().map(|w| w.biz_type_id).collect();
    let limits: Vec<i64> = wants.iter().map(|w| w.limit).collect();
    let leases: Vec<i64> = wants.iter().map(|w| w.lease_ms + w.ahead_ms).collect();
    let aheads: Vec<i64> = wants.iter().map(|w| w.ahead_ms).collect();
    let oldest: Vec<i64> = wants.iter().map(|w| w.oldest).collect();
    let lanes: Vec<Option<i32>> = wants.iter().map(|w| w.lane).collect();
    static CLAIM: LazyLock<String> = LazyLock::new(|| with_pick(include_str!("sql/claim.sql")));
    static CLAIM_PLAIN: LazyLock<String> = LazyLock::new(|| with_pick_as(include_str!("sql/claim.sql"), NEEDS_PRIORITIES));
    static CLAIM_FLOWS: LazyLock<String> = LazyLock::new(|| {
        include_str!("sql/claim.sql")
            .replace("{pick}", include_str!("sql/pick_flow.sql").trim_end())
            .replace("{markers}", &format!("\n{}", include_str!("sql/flow_markers.sql").trim_end()))
    });
    let query = crate::db::query_as(match pick {
        Pick::Plain => CLAIM_PLAIN.as_str(),
        Pick::Full => CLAIM.as_str(),
        Pick::Flows => CLAIM_FLOWS.as_str(),
    });
    let flows: Vec<&FlowWant> = wants.iter().filter_map(|w| w.flow.as_ref()).collect();
    let mut query = query.bind(&ids).bind(&limits).bind(&leases).bind(node_id).bind(&aheads).bind(floor).bind(&oldest).bind(&lanes);
    if pick == Pick::Flows {
        query = query
            .bind(flows.iter().map(|f| f.cap).collect::<Vec<i32>>())
            .bind(flows.iter().map(|f| f.ordered).collect::<Vec<bool>>())
            .bind(flows.iter().map(|f| f.cursor.clone()).collect::<Vec<Option<String>>>())
            .bind(flows.iter().map(|f| f.rate).collect::<Vec<Option<f64>>>());
    }
    let picked: Vec<ClaimRow> = query.fetch_all(pool).await?;
    let needing: Vec<i32> = picked.iter().filter(|r| r.prioritized).map(|r| r.biz_type_id).collect();
    take(picked, claims);
    Ok(needing)
}

/// Sorts a claim's rows into each biz type's `Claim`.
fn take(rows: Vec<ClaimRow>, claims: &mut HashMap<i32, Claim>) {
    for row in rows {
        let claim = claims.entry(row.biz_type_id).or_default();
        claim.settings_at = claim.settings_at.max(row.settings_at);
        if row.task.id.is_nil() {
            claim.capped |= row.capped;
            claim.prioritized |= row.prioritized;
            claim.cursor = claim.cursor.take().or(row.cursor);
        } else if row.task.expired {
            claim.expired += 1;
        } else {
            claim.leased.push(row.task);
        }
    }
}

/// The claim on a Citus cluster: claim_citus.sql, one statement per biz type (in id
/// order, as claim.sql gates them), each routed whole to the worker that holds the biz
/// type's shard, after the biz type's gate (`chime_claim_room`) in its transaction. The
/// failure and chat notices of the tasks it ended expired follow in the same transaction
/// (notices_citus.sql), a statement of their own: Citus would split a statement that
/// inserts into one table what another returned into steps through the coordinator. Both
/// reach the one worker; the gate is the coordinator's.
async fn claim_each(
    pool: &Pool,
    wants: &[&Want],
    node_id: Uuid,
    floor: Option<DateTime<Utc>>,
    claims: &mut HashMap<i32, Claim>,
) -> Result<(), sqlx::Error> {
    let mut wants = wants.to_vec();
    wants.sort_by_key(|w| w.biz_type_id);
    for want in wants {
        let mut tx = pool.begin().await?;
        let room = citus_room(&mut tx, want).await?;
        let rows: Vec<ClaimRow> = bind_citus_claim(crate::db::query_as(citus_claim_sql()), want, node_id, floor, room).fetch_all(&mut *tx).await?;
        citus_commit(tx, want.biz_type_id, rows, claims).await?;
    }
    Ok(())
}

/// The first statement of a biz type's claim on Citus: its claim locks, on the coordinator,
/// until the commit (claim_citus.sql, Locks), and its room under the cap. And a plan made
/// for the biz type at each claim, for every statement of the transaction: PostgreSQL's
/// generic plan of a statement run often leaves $8 a parameter, which Citus cannot route
/// ("could not create distributed plan").
async fn citus_room(tx: &mut PgConnection, want: &Want) -> Result<i32, sqlx::Error> {
    crate::db::query_scalar("SELECT chime_claim_room($1, $2) FROM set_config('plan_cache_mode', 'force_custom_plan', true)")
        .bind(want.biz_type_id)
        .bind(want.limit)
        .fetch_one(tx)
        .await
}

/// claim_citus.sql's parameters `$1`–`$9`, which flows_citus's lease statement shares.
fn bind_citus_claim<'q>(
    query: sqlx::query::QueryAs<'q, sqlx::Postgres, ClaimRow, sqlx::postgres::PgArguments>,
    want: &Want,
    node_id: Uuid,
    floor: Option<DateTime<Utc>>,
    room: i32,
) -> sqlx::query::QueryAs<'q, sqlx::Postgres, ClaimRow, sqlx::postgres::PgArguments> {
    query
        .bind(vec![want.biz_type_id])
        .bind(vec![want.limit])
        .bind(vec![want.lease_ms + want.ahead_ms])
        .bind(node_id)
        .bind(vec![want.ahead_ms])
        .bind(floor)
        .bind(vec![want.oldest])
        .bind(want.biz_type_id)
        .bind(room)
}

/// The end of a biz type's claim on Citus: the failure and chat notices of the tasks it
/// ended expired (notices_citus.sql), the commit, and the claimed rows taken into `claims`.
async fn citus_commit(
    mut tx: sqlx::Transaction<'static, sqlx::Postgres>,
    biz_type_id: i32,
    rows: Vec<ClaimRow>,
    claims: &mut HashMap<i32, Claim>,
) -> Result<(), sqlx::Error> {
    let ended: Vec<Uuid> = rows.iter().filter(|r| r.task.expired).map(|r| r.task.id).collect();
    if !ended.is_empty() {
        let events = vec!["task.expired"; ended.len()];
        crate::db::query(include_str!("sql/notices_citus.sql")).bind(biz_type_id).bind(&ended).bind(&events).execute(&mut *tx).await?;
    }
    tx.commit().await?;
    take(rows, claims);
    Ok(())
}

/// claim_citus.sql as the engine runs it, with pick.sql's `picked` CTE (tests/citus
/// EXPLAINs it).
pub fn citus_claim_sql() -> &'static str {
    static CLAIM: LazyLock<String> = LazyLock::new(|| with_pick(include_str!("sql/claim_citus.sql")));
    CLAIM.as_str()
}

/// claim.sql or reserve.sql with pick.sql's `picked` CTE, which both take due tasks with,
/// in place of its `{pick}`, priority branches included.
fn with_pick(sql: &str) -> String {
    with_pick_as(sql, include_str!("sql/pick_priority.sql").trim_end())
}

/// `with_pick` with `by_priority` in place of pick.sql's priority branches.
fn with_pick_as(sql: &str, by_priority: &str) -> String {
    sql.replace("{pick}", include_str!("sql/pick.sql").trim_end()).replace("{by_priority}", by_priority).replace("{markers}", "")
}

/// In place of the priority branches (`Pick::Plain`), a row with no task for a biz type that
/// needs them (claim.sql, its `prioritized` row).
const NEEDS_PRIORITIES: &str = "UNION ALL\n        (SELECT NULL::uuid, NULL::timestamptz, 0 WHERE x.prioritized)";

/// A row of claim.sql: a task, or (`capped`) the one row per biz type that says the cap
/// held it back.
#[derive(sqlx::FromRow)]
struct ClaimRow {
    #[sqlx(flatten)]
    task: Claimed,
    biz_type_id: i32,
    capped: bool,
    cursor: Option<String>,
    settings_at: Option<DateTime<Utc>>,
    /// The biz type needs the priority branches this claim left out (`Pick::Plain`).
    #[sqlx(default)]
    prioritized: bool,
}

/// When the next pending task of these biz types is due (None: nothing pending).
pub async fn next_due(pool: &Pool, biz_type_ids: &[i32]) -> Result<Option<DateTime<Utc>>, sqlx::Error> {
    Ok(next_due_each(pool, biz_type_ids, None, None).await?.into_iter().filter_map(|(_, next)| next).min())
}

/// When the next pending task of each of these biz types is due (None: nothing pending,
/// or, given `within`, nothing due before then). One index probe per biz type, in one
/// statement: min(run_at) of each is the first entry of its part of tasks_claim_idx.
/// `within` and `floor` (`unfinished_floor`) prune, when the statement starts, the
/// partitions wholly after and before them.
pub async fn next_due_each(
    pool: &Pool,
    biz_type_ids: &[i32],
    within: Option<Duration>,
    floor: Option<DateTime<Utc>>,
) -> Result<Vec<(i32, Option<DateTime<Utc>>)>, sqlx::Error> {
    if crate::db::citus::active() {
        return next_due_citus(pool, biz_type_ids, within, floor).await;
    }
    // Without `within`, the upper bound is infinity: both bounds are computed as the
    // statement starts, so its partitions are pruned then.
    crate::db::query_as(
        "SELECT b.id, n.next FROM unnest($1::int[]) AS b(id)
           LEFT JOIN LATERAL (
               SELECT run_at AS next FROM tasks
                WHERE biz_type_id = b.id AND status = 'pending' AND run_at >= coalesce($2, '-infinity')
                  AND run_at <= coalesce(now() + $3 * interval '1 millisecond', 'infinity')
                ORDER BY run_at LIMIT 1
           ) n ON true",
    )
    .bind(biz_type_ids)
    .bind(floor)
    .bind(within.map(|w| w.as_millis() as i64))
    .fetch_all(pool)
    .await
}

/// `next_due_each` on a Citus cluster: a statement per biz type, each sent to the worker of
/// its shard. Citus refuses the one statement for all (a LATERAL subquery with a LIMIT over
/// an array of biz types).
async fn next_due_citus(
    pool: &Pool,
    biz_type_ids: &[i32],
    within: Option<Duration>,
    floor: Option<DateTime<Utc>>,
) -> Result<Vec<(i32, Option<DateTime<Utc>>)>, sqlx::Error> {
    let mut next = Vec::with_capacity(biz_type_ids.len());
    for &id in biz_type_ids {
        let due: Option<DateTime<Utc>> = crate::db::query_scalar(
            "SELECT run_at FROM tasks
              WHERE biz_type_id = $1 AND status = 'pending' AND run_at >= coalesce($2, '-infinity')
                AND run_at <= coalesce(now() + $3 * interval '1 millisecond', 'infinity')
              ORDER BY run_at LIMIT 1",
        )
        .bind(id)
        .bind(floor)
        .bind(within.map(|w| w.as_millis() as i64))
        .fetch_optional(pool)
        .await?;
        next.push((id, due));
    }
    Ok(next)
}

/// An instant before which no unfinished task is due, now or later (migration 0036): a
/// lower bound on `run_at` that prunes the partitions of finished tasks.
pub async fn unfinished_floor(pool: &Pool) -> Result<DateTime<Utc>, sqlx::Error> {
    crate::db::query_scalar("SELECT chime_unfinished_floor()").fetch_one(pool).await
}

/// A reserved task: the task, until when the consumer holds it, and the receipt that
/// settles this reservation.
#[derive(Debug, Clone, Serialize, sqlx::FromRow, utoipa::ToSchema)]
#[schema(as = ReservedTask)]
pub struct Reserved {
    #[serde(flatten)]
    #[sqlx(flatten)]
    pub task: Task,
    pub reserved_until: DateTime<Utc>,
    pub receipt: Uuid,
    /// The reserve found the deadline passed and ended the task `expired` instead: not
    /// handed out (`reserve` leaves these out).
    #[serde(skip)]
    pub expired: bool,
}

/// Leases up to `limit` due tasks of a pull biz type for `ttr_ms`, each under a receipt of
/// its own, by priority as a claim takes them. Tasks it picked whose deadline had passed
/// are ended `expired` instead (see reserve.sql), not handed out: the second value counts
/// them, for the caller's metrics.
pub async fn reserve(pool: &Pool, biz_type_id: i32, biz_type: &str, limit: i64, ttr_ms: i64) -> Result<(Vec<Reserved>, u64), sqlx::Error> {
    static RESERVE: LazyLock<String> = LazyLock::new(|| with_pick(include_str!("sql/reserve.sql")));
    // A tenth to the longest-due, as the engine gives (`engine::OLDEST_SHARE`); consumers
    // hold no count between reserves, so a reserve of n < 10 takes one with chance n / 10.
    let oldest = limit / 10 + i64::from(rand::random_range(0..10) < limit % 10);
    let floor: Option<DateTime<Utc>> = None;
    if crate::db::citus::active() {
        return reserve_citus(pool, biz_type_id, biz_type, limit, ttr_ms, oldest).await;
    }
    let picked: Vec<Reserved> = crate::db::query_as(RESERVE.as_str())
        .bind(biz_type_id)
        .bind(limit)
        .bind(ttr_ms)
        .bind(biz_type)
        .bind(oldest)
        .bind(floor)
        .fetch_all(pool)
        .await?;
    let (expired, reserved): (Vec<Reserved>, Vec<Reserved>) = picked.into_iter().partition(|r| r.expired);
    Ok((reserved, expired.len() as u64))
}

/// `reserve` on a Citus cluster: reserve_citus.sql, routed whole to the worker holding the
/// biz type's shard, then the failure and chat notices of the tasks it ended expired
/// (notices_citus.sql), in one transaction planned with the values
/// (`db::citus::begin_routed`). The receipts are made here: Citus refuses
/// `gen_random_uuid()` in an UPDATE.
async fn reserve_citus(
    pool: &Pool,
    biz_type_id: i32,
    biz_type: &str,
    limit: i64,
    ttr_ms: i64,
    oldest: i64,
) -> Result<(Vec<Reserved>, u64), sqlx::Error> {
    let receipts: Vec<Uuid> = (0..limit.max(0)).map(|_| Uuid::new_v4()).collect();
    let mut tx = crate::db::citus::begin_routed(pool).await?;
    let picked: Vec<Reserved> = crate::db::query_as(citus_reserve_sql())
        .bind(biz_type_id)
        .bind(limit)
        .bind(ttr_ms)
        .bind(biz_type)
        .bind(oldest)
        .bind(None::<DateTime<Utc>>)
        .bind(&receipts)
        .fetch_all(&mut *tx)
        .await?;
    let (expired, reserved): (Vec<Reserved>, Vec<Reserved>) = picked.into_iter().partition(|r| r.expired);
    if !expired.is_empty() {
        let ended: Vec<Uuid> = expired.iter().map(|r| r.task.id).collect();
        let events = vec!["task.expired"; ended.len()];
        crate::db::query(include_str!("sql/notices_citus.sql")).bind(biz_type_id).bind(&ended).bind(&events).execute(&mut *tx).await?;
    }
    tx.commit().await?;
    Ok((reserved, expired.len() as u64))
}

/// reserve_citus.sql as `reserve` runs it on Citus, with pick.sql's `picked` CTE (tests/citus
/// EXPLAINs it).
pub fn citus_reserve_sql() -> &'static str {
    static RESERVE: LazyLock<String> = LazyLock::new(|| with_pick(include_str!("sql/reserve_citus.sql")));
    RESERVE.as_str()
}

/// How many tasks of the biz type are due, counting no further than `up_to`.
pub async fn due_count(pool: &Pool, biz_type_id: i32, up_to: i64) -> Result<i64, sqlx::Error> {
    crate::db::query_scalar(
        "SELECT count(*) FROM (
             SELECT 1 FROM tasks WHERE biz_type_id = $1 AND status = 'pending' AND run_at <= now() LIMIT $2
         ) due",
    )
    .bind(biz_type_id)
    .bind(up_to)
    .fetch_one(pool)
    .await
}

/// How many tasks of the biz type are leased (reserved and not yet acked or nacked).
pub async fn leased_count(pool: &Pool, biz_type_id: i32) -> Result<i64, sqlx::Error> {
    crate::db::query_scalar("SELECT count(*) FROM tasks WHERE biz_type_id = $1 AND status = 'running'").bind(biz_type_id).fetch_one(pool).await
}

/// A reservation locked for settling, as `hold` found it.
#[derive(Debug, sqlx::FromRow)]
pub struct Held {
    pub run_at: DateTime<Utc>,
    /// This reservation's attempt number.
    pub attempt_count: i32,
    pub reserved_at: DateTime<Utc>,
    /// The task's deadline: a nack whose retry would fall at or after it ends the task.
    pub expires_at: Option<DateTime<Utc>>,
    /// The database clock, to measure the reservation by.
    pub db_now: DateTime<Utc>,
}

/// Locks the task `id` of `biz_type_id` if `holder` still holds its lease (None: it does
/// not, or there is no such task). A settle or lease recovery that got there first is
/// waited for, and the condition is checked again on the row it left.
pub async fn hold(tx: &mut PgConnection, biz_type_id: i32, id: Uuid, holder: Uuid) -> Result<Option<Held>, sqlx::Error> {
    crate::db::query_as(
        "SELECT run_at, attempt_count, updated_at AS reserved_at, expires_at, now() AS db_now FROM tasks
          WHERE id = $1 AND biz_type_id = $2 AND status = 'running' AND leased_by = $3
            FOR UPDATE",
    )
    .bind(id)
    .bind(biz_type_id)
    .bind(holder)
    .fetch_optional(tx)
    .await
}

/// Extends the lease of task `id` of `biz_type_id` held by `holder` to `ttr_ms` from now;
/// None if `holder` no longer holds it.
pub async fn touch(pool: &Pool, biz_type_id: i32, id: Uuid, holder: Uuid, ttr_ms: i64) -> Result<Option<DateTime<Utc>>, sqlx::Error> {
    // Locks the task's row; a settle or lease recovery that got there first is waited for,
    // and the WHERE is checked again on the row it left, whose holder is cleared.
    crate::db::query_scalar(
        "UPDATE tasks SET lease_until = now() + $3 * interval '1 millisecond'
          WHERE id = $1 AND biz_type_id = $2 AND status = 'running' AND leased_by = $4
         RETURNING lease_until",
    )
    .bind(id)
    .bind(biz_type_id)
    .bind(ttr_ms)
    .bind(holder)
    .fetch_optional(pool)
    .await
}

/// What one delivery attempt came to.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub task_id: Uuid,
    pub biz_type_id: i32,
    pub run_at: DateTime<Utc>,
    pub attempt: i32,
    pub started_at: DateTime<Utc>,
    pub duration_ms: i32,
    pub status_code: Option<i16>,
    pub error: Option<String>,
    pub response_excerpt: Option<String>,
    /// Where a 307 or 308 sent the callback, if one did.
    pub redirected_to: Option<String>,
    pub verdict: Verdict,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Verdict {
    Delivered,
    RetryAt(DateTime<Utc>),
    GiveUp,
    /// The receiver answered 2xx with a valid `Chime-Snooze`: the task is pending again,
    /// due at this time, and the attempt does not count toward `max_attempts`.
    Snooze(DateTime<Utc>),
    /// The task ends `expired`: its `deadline` passed before the callback could start
    /// (`next` None: it was not sent), or its next callback, a retry or (`snoozed`) the
    /// end of a snooze at `next`, would start at or after it (docs/design/contract.md, Tasks by key).
    Expire {
        deadline: DateTime<Utc>,
        next: Option<DateTime<Utc>>,
        snoozed: bool,
    },
    /// The attempt failed while the biz type's receiver breaker was open (a probe, or a
    /// callback in flight when it opened): the task is pending again, due at this time, and
    /// the attempt, recorded with its error, does not count toward `max_attempts`
    /// (`engine::breaker`).
    Held(DateTime<Utc>),
}

/// How a biz type retries: its attempts and backoff.
#[derive(Debug, Clone, Copy)]
pub struct RetryPolicy {
    pub max_attempts: i32,
    pub backoff_initial_ms: i32,
    pub backoff_max_ms: i32,
}

impl Verdict {
    /// After attempt number `attempt` failed: given up once the attempts are used up, else
    /// a retry after `wait` (a receiver's `Retry-After`, a consumer's nack delay) or the
    /// backoff, counted from `now`; expired now if that retry would start at or after the
    /// task's deadline `expires_at`, since no callback starts then.
    pub fn after_failure(
        attempt: i32,
        policy: RetryPolicy,
        wait: Option<Duration>,
        now: DateTime<Utc>,
        expires_at: Option<DateTime<Utc>>,
    ) -> Verdict {
        if attempt >= policy.max_attempts {
            return Verdict::GiveUp;
        }
        let wait = wait.unwrap_or_else(|| backoff(policy.backoff_initial_ms, policy.backoff_max_ms, attempt));
        let at = now.checked_add_signed(TimeDelta::from_std(wait).unwrap_or(TimeDelta::MAX)).unwrap_or(DateTime::<Utc>::MAX_UTC);
        match expires_at {
            Some(deadline) if at >= deadline => Verdict::Expire { deadline, next: Some(at), snoozed: false },
            _ => Verdict::RetryAt(at),
        }
    }

    /// After the receiver asked to be called again at `until` (`Chime-Snooze`): snoozed, or
    /// expired now if `until` is at or after the deadline (no callback would start again).
    pub fn after_snooze(until: DateTime<Utc>, expires_at: Option<DateTime<Utc>>) -> Verdict {
        match expires_at {
            Some(deadline) if until >= deadline => Verdict::Expire { deadline, next: Some(until), snoozed: true },
            _ => Verdict::Snooze(until),
        }
    }

    /// The state the task is left in, and when it is due again if pending.
    fn settles_as(&self) -> (super::Status, Option<DateTime<Utc>>) {
        match *self {
            Verdict::Delivered => (super::Status::Succeeded, None),
            Verdict::RetryAt(at) | Verdict::Snooze(at) | Verdict::Held(at) => (super::Status::Pending, Some(at)),
            Verdict::GiveUp => (super::Status::Failed, None),
            Verdict::Expire { .. } => (super::Status::Expired, None),
        }
    }

    /// The task's `last_error` this verdict leaves, given the attempt's own error.
    fn task_error(&self, attempt_error: Option<&str>) -> Option<String> {
        let Verdict::Expire { deadline, next, snoozed } = *self else {
            return attempt_error.map(str::to_string);
        };
        let last = attempt_error.map(|e| format!(" (last attempt: {e})")).unwrap_or_default();
        Some(match (next, snoozed) {
            (Some(until), true) => format!(
                "expired: the receiver snoozed it until {}, at or after its deadline {}, so no callback would start again",
                until.to_rfc3339(),
                deadline.to_rfc3339()
            ),
            (Some(at), false) => {
                format!("expired: its next retry would start at {}, at or after its deadline {}{last}", at.to_rfc3339(), deadline.to_rfc3339())
            }
            (None, _) => format!("expired at {}: not delivered before its deadline{last}", deadline.to_rfc3339()),
        })
    }
}

/// Delay before retry number `attempt + 1`: exponential from the initial backoff, capped,
/// with jitter over the upper half so that a burst of failures does not retry in step.
pub fn backoff(initial_ms: i32, max_ms: i32, attempt: i32) -> Duration {
    let (least, most) = backoff_range_ms(initial_ms, max_ms, attempt);
    Duration::from_millis(rand::rng().random_range(least..=most))
}

/// The shortest and longest `backoff`.
pub(crate) fn backoff_range_ms(initial_ms: i32, max_ms: i32, attempt: i32) -> (u64, u64) {
    let doublings = (attempt - 1).clamp(0, 30) as u32;
    let full = (initial_ms.max(0) as u64).saturating_mul(1 << doublings).min(max_ms.max(0) as u64);
    (full / 2, full)
}

/// Records a batch of outcomes of leases held by node `node_id`, in one transaction.
pub async fn record(pool: &Pool, node_id: Uuid, outcomes: &[Outcome]) -> Result<(), sqlx::Error> {
    let mut tx = pool.begin().await?;
    record_in(&mut tx, node_id, Some(node_id), outcomes).await?;
    tx.commit().await
}

/// Records a batch of outcomes of leases held by `holder`: one statement for the tasks,
/// one for the attempts (made by `node`, None for a pull consumer). Only tasks `holder`
/// still holds are changed; every attempt is kept.
///
/// A snoozed task is pending again at the end of its snooze, with its attempt count back
/// to what it was before this attempt (a snooze does not count toward `max_attempts`; the
/// attempt row keeps its number, which the next callback uses again); so is a task held by
/// its receiver's open breaker (`Verdict::Held`), without counting a snooze. A held task is
/// due within the breaker's probe interval, never past the hot horizon: it stays in the
/// partitions (record_tasks.sql keeps it inside them should the horizon be that near). A snooze or retry
/// ending beyond the hot horizon moves the task to cold storage first (`later_cold.sql`), as
/// a create that far ahead would be placed, so it is not claimed early at the horizon's edge.
pub async fn record_in(tx: &mut PgConnection, holder: Uuid, node: Option<Uuid>, outcomes: &[Outcome]) -> Result<(), sqlx::Error> {
    let mut ids = Vec::with_capacity(outcomes.len());
    let mut run_ats = Vec::with_capacity(outcomes.len());
    let mut statuses = Vec::with_capacity(outcomes.len());
    let mut retry_ats: Vec<Option<DateTime<Utc>>> = Vec::with_capacity(outcomes.len());
    let mut errors = Vec::with_capacity(outcomes.len());
    let mut task_errors = Vec::with_capacity(outcomes.len());
    let mut snoozed = Vec::with_capacity(outcomes.len());
    let mut uncounted = Vec::with_capacity(outcomes.len());
    let mut snoozed_until: Vec<Option<DateTime<Utc>>> = Vec::with_capacity(outcomes.len());
    let (mut numbers, mut started, mut durations, mut codes, mut excerpts) = (vec![], vec![], vec![], vec![], vec![]);
    let mut redirects = Vec::with_capacity(outcomes.len());
    let mut biz_type_ids = Vec::with_capacity(outcomes.len());
    for o in outcomes {
        ids.push(o.task_id);
        run_ats.push(o.run_at);
        let (status, retry_at) = o.verdict.settles_as();
        statuses.push(status.as_str());
        retry_ats.push(retry_at);
        errors.push(o.error.as_deref());
        task_errors.push(o.verdict.task_error(o.error.as_deref()));
        snoozed.push(matches!(o.verdict, Verdict::Snooze(_)));
        uncounted.push(matches!(o.verdict, Verdict::Held(_)));
        snoozed_until.push(match o.verdict {
            Verdict::Snooze(until) | Verdict::Expire { next: Some(until), snoozed: true, .. } => Some(until),
            _ => None,
        });
        numbers.push(o.attempt);
        started.push(o.started_at);
        durations.push(o.duration_ms);
        codes.push(o.status_code);
        excerpts.push(o.response_excerpt.as_deref());
        redirects.push(o.redirected_to.as_deref());
        biz_type_ids.push(o.biz_type_id);
    }
    // On a Citus cluster the hot horizon is read here, on the coordinator, for the statements
    // that run on the workers, and a retry or snooze beyond it moves per biz type
    // (later_cold_citus.sql).
    let citus_horizon = if crate::db::citus::active() { Some(citus_record_session(tx).await?) } else { None };
    if let Some(horizon) = citus_horizon {
        later_cold_citus(tx, holder, outcomes, &task_errors, horizon).await?;
    } else if retry_ats.iter().any(Option::is_some) {
        let mut later = (vec![], vec![], vec![], vec![], vec![]);
        for (o, error) in outcomes.iter().zip(&task_errors) {
            if let Verdict::RetryAt(until) | Verdict::Snooze(until) = o.verdict {
                later.0.push(o.task_id);
                later.1.push(o.run_at);
                later.2.push(until);
                later.3.push(matches!(o.verdict, Verdict::Snooze(_)));
                later.4.push(error.as_deref());
            }
        }
        crate::db::query(include_str!("sql/later_cold.sql"))
            .bind(&later.0)
            .bind(&later.1)
            .bind(&later.2)
            .bind(holder)
            .bind(&later.3)
            .bind(&later.4)
            .execute(&mut *tx)
            .await?;
    }
    if let Some(horizon) = citus_horizon {
        record_tasks_citus(tx, holder, outcomes, horizon).await?;
    } else {
        crate::db::query(include_str!("sql/record_tasks.sql"))
            .bind(&ids)
            .bind(&run_ats)
            .bind(&statuses)
            .bind(&retry_ats)
            .bind(&task_errors)
            .bind(holder)
            .bind(&snoozed)
            .bind(&uncounted)
            .bind(run_ats.iter().min())
            .bind(run_ats.iter().max())
            .execute(&mut *tx)
            .await?;
    }
    crate::db::query(include_str!("sql/record_attempts.sql"))
        .bind(&ids)
        .bind(&numbers)
        .bind(&started)
        .bind(&durations)
        .bind(&codes)
        .bind(&errors)
        .bind(&excerpts)
        .bind(node)
        .bind(&biz_type_ids)
        .bind(&run_ats)
        .bind(&redirects)
        .bind(&snoozed_until)
        .execute(&mut *tx)
        .await?;
    // A task given back by a node that stopped, or nacked without a delay, is due now:
    // wake the other nodes rather than let it wait for their sweep, naming its biz type.
    let now = Utc::now();
    let due_now: std::collections::BTreeSet<i32> =
        outcomes.iter().filter(|o| matches!(o.verdict, Verdict::RetryAt(at) | Verdict::Snooze(at) if at <= now)).map(|o| o.biz_type_id).collect();
    for biz_type_id in due_now {
        wake::notify(&mut *tx, wake::Wake::DueFor(biz_type_id)).await?;
    }
    Ok(())
}

/// later_cold_citus.sql's first step: locks the rows to move, tasks $1 (run_at $2, $3
/// whether a snooze) of biz type $4 still running under holder $5, and not a snooze past
/// max_snoozes (left to record_citus.sql, which fails it). One task on the biz type's
/// worker (tests/citus/statements.rs).
pub const LATER_COLD_LOCK_CITUS: &str = "SELECT t.id, t.run_at
   FROM unnest($1::uuid[], $2::timestamptz[], $3::boolean[]) AS l(id, run_at, snoozed)
   JOIN tasks t ON t.biz_type_id = $4 AND t.id = l.id AND t.run_at = l.run_at
   JOIN biz_types b ON b.id = $4
  WHERE t.status = 'running' AND t.leased_by = $5 AND NOT (l.snoozed AND t.snoozes >= b.max_snoozes)
    FOR UPDATE OF t";

/// later_cold_citus.sql's last step: deletes from `tasks` the rows of biz type $1 it copied
/// ($2, run_at $3), which the first step locked.
pub const LATER_COLD_DELETE_CITUS: &str = "DELETE FROM tasks t USING unnest($2::uuid[], $3::timestamptz[]) AS l(id, run_at)
  WHERE t.biz_type_id = $1 AND t.id = l.id AND t.run_at = l.run_at";

/// later_cold.sql's work on a Citus cluster: per biz type of the batch with a retry or
/// snooze due at or beyond the hot `horizon`, the three statements of later_cold_citus.sql
/// (lock, copy, delete), each on the worker of the biz type's shard, in the record's
/// transaction. A row moved is gone from `tasks`: record_citus.sql then finds nothing to
/// change for it. `task_errors` are the tasks' new last errors, as `outcomes`.
async fn later_cold_citus(
    tx: &mut PgConnection,
    holder: Uuid,
    outcomes: &[Outcome],
    task_errors: &[Option<String>],
    horizon: DateTime<Utc>,
) -> Result<(), sqlx::Error> {
    // Per biz type: each outcome to move, when it is due again, and the task's new error.
    type Later<'a> = Vec<(&'a Outcome, DateTime<Utc>, Option<&'a str>)>;
    let mut by_biz_type: std::collections::BTreeMap<i32, Later> = std::collections::BTreeMap::new();
    for (o, error) in outcomes.iter().zip(task_errors) {
        if let Verdict::RetryAt(until) | Verdict::Snooze(until) = o.verdict
            && until >= horizon
        {
            by_biz_type.entry(o.biz_type_id).or_default().push((o, until, error.as_deref()));
        }
    }
    for (biz_type_id, later) in by_biz_type {
        let locked: Vec<(Uuid, DateTime<Utc>)> = crate::db::query_as(LATER_COLD_LOCK_CITUS)
            .bind(later.iter().map(|(o, _, _)| o.task_id).collect::<Vec<_>>())
            .bind(later.iter().map(|(o, _, _)| o.run_at).collect::<Vec<_>>())
            .bind(later.iter().map(|(o, _, _)| matches!(o.verdict, Verdict::Snooze(_))).collect::<Vec<_>>())
            .bind(biz_type_id)
            .bind(holder)
            .fetch_all(&mut *tx)
            .await?;
        let moving: Vec<_> = later.iter().filter(|(o, _, _)| locked.contains(&(o.task_id, o.run_at))).collect();
        if moving.is_empty() {
            continue;
        }
        let (ids, run_ats): (Vec<Uuid>, Vec<DateTime<Utc>>) = moving.iter().map(|(o, _, _)| (o.task_id, o.run_at)).unzip();
        crate::db::query(include_str!("sql/later_cold_citus.sql"))
            .bind(&ids)
            .bind(&run_ats)
            .bind(moving.iter().map(|(_, until, _)| *until).collect::<Vec<_>>())
            .bind(moving.iter().map(|(o, _, _)| matches!(o.verdict, Verdict::Snooze(_))).collect::<Vec<_>>())
            .bind(moving.iter().map(|(_, _, error)| *error).collect::<Vec<_>>())
            .bind(biz_type_id)
            .execute(&mut *tx)
            .await?;
        crate::db::query(LATER_COLD_DELETE_CITUS).bind(biz_type_id).bind(&ids).bind(&run_ats).execute(&mut *tx).await?;
    }
    Ok(())
}

/// On a Citus cluster, before a record: the hot horizon, and a plan made for the biz type at
/// each run of a statement for the rest of the transaction (see `citus_room`).
async fn citus_record_session(tx: &mut PgConnection) -> Result<DateTime<Utc>, sqlx::Error> {
    crate::db::query_scalar("SELECT until FROM hot_horizon, set_config('plan_cache_mode', 'force_custom_plan', true)").fetch_one(&mut *tx).await
}

/// record_tasks.sql's work on a Citus cluster: record_citus.sql per biz type (each on the
/// worker of its shard), then the failure and chat notices of the tasks it ended failed or
/// expired (notices_citus.sql), in the caller's transaction. The hot horizon, a coordinator
/// table, is read by the caller and passed: a worker cannot read it.
async fn record_tasks_citus(tx: &mut PgConnection, holder: Uuid, outcomes: &[Outcome], horizon: DateTime<Utc>) -> Result<(), sqlx::Error> {
    let mut by_biz_type: std::collections::BTreeMap<i32, Vec<&Outcome>> = std::collections::BTreeMap::new();
    for o in outcomes {
        by_biz_type.entry(o.biz_type_id).or_default().push(o);
    }
    for (biz_type_id, group) in by_biz_type {
        let settled: Vec<(super::Status, Option<DateTime<Utc>>)> = group.iter().map(|o| o.verdict.settles_as()).collect();
        let ended: Vec<(Uuid, String)> = crate::db::query_as(include_str!("sql/record_citus.sql"))
            .bind(group.iter().map(|o| o.task_id).collect::<Vec<_>>())
            .bind(group.iter().map(|o| o.run_at).collect::<Vec<_>>())
            .bind(settled.iter().map(|(status, _)| status.as_str()).collect::<Vec<_>>())
            .bind(settled.iter().map(|(_, at)| *at).collect::<Vec<_>>())
            .bind(group.iter().map(|o| o.verdict.task_error(o.error.as_deref())).collect::<Vec<_>>())
            .bind(holder)
            .bind(group.iter().map(|o| matches!(o.verdict, Verdict::Snooze(_))).collect::<Vec<_>>())
            .bind(group.iter().map(|o| matches!(o.verdict, Verdict::Held(_))).collect::<Vec<_>>())
            .bind(biz_type_id)
            .bind(horizon)
            .fetch_all(&mut *tx)
            .await?;
        let (ids, events): (Vec<Uuid>, Vec<String>) = ended
            .into_iter()
            .filter(|(_, status)| status == "failed" || status == "expired")
            .map(|(id, status)| (id, format!("task.{status}")))
            .unzip();
        if !ids.is_empty() {
            crate::db::query(include_str!("sql/notices_citus.sql")).bind(biz_type_id).bind(&ids).bind(&events).execute(&mut *tx).await?;
        }
    }
    Ok(())
}

/// Gives back tasks this node claimed ahead of their due time but never called back,
/// because it is stopping: pending again as if never claimed (their attempt is not
/// counted), so that another node, woken now, takes them without waiting for the lease to
/// run out. Only tasks still leased to this node are touched; returns how many. `tasks`:
/// each one's id, run_at and biz type. On a Citus cluster, a statement per biz type
/// (`give_back_citus`).
pub async fn give_back(pool: &Pool, node_id: Uuid, tasks: &[(Uuid, DateTime<Utc>, i32)]) -> Result<u64, sqlx::Error> {
    if crate::db::citus::active() {
        return give_back_citus(pool, node_id, tasks).await;
    }
    let (ids, run_ats): (Vec<Uuid>, Vec<DateTime<Utc>>) = tasks.iter().map(|(id, run_at, _)| (*id, *run_at)).unzip();
    // Locks the given rows still leased to this node: no other holder wants them until
    // they are pending again.
    let given = crate::db::query(
        "UPDATE tasks t
            SET status = 'pending', lease_until = NULL, leased_by = NULL,
                attempt_count = t.attempt_count - 1, updated_at = now()
           FROM unnest($1::uuid[], $2::timestamptz[]) AS g(id, run_at)
          WHERE t.id = g.id AND t.run_at = g.run_at AND t.status = 'running' AND t.leased_by = $3",
    )
    .bind(&ids)
    .bind(&run_ats)
    .bind(node_id)
    .execute(pool)
    .await?
    .rows_affected();
    if given > 0 {
        wake::notify(pool, wake::Wake::Due).await?;
    }
    Ok(given)
}

/// `give_back`'s UPDATE for the tasks $2 (run_at $3) of biz type $1 on a Citus cluster: the
/// biz type names the UPDATE, which Citus then sends to the one worker of its shard (the
/// plain statement, joined by id alone, goes to every shard). One task on the biz type's
/// worker (tests/citus/statements.rs). Locks the given rows still leased to node $4.
pub const GIVE_BACK_CITUS: &str = "UPDATE tasks t
    SET status = 'pending', lease_until = NULL, leased_by = NULL, attempt_count = t.attempt_count - 1, updated_at = now()
   FROM unnest($2::uuid[], $3::timestamptz[]) AS g(id, run_at)
  WHERE t.biz_type_id = $1 AND t.id = g.id AND t.run_at = g.run_at AND t.status = 'running' AND t.leased_by = $4";

/// `give_back` on a Citus cluster: GIVE_BACK_CITUS per biz type, in one transaction; the
/// other nodes are woken per biz type given back.
async fn give_back_citus(pool: &Pool, node_id: Uuid, tasks: &[(Uuid, DateTime<Utc>, i32)]) -> Result<u64, sqlx::Error> {
    let mut by_biz_type: std::collections::BTreeMap<i32, (Vec<Uuid>, Vec<DateTime<Utc>>)> = std::collections::BTreeMap::new();
    for (id, run_at, biz_type_id) in tasks {
        let (ids, run_ats) = by_biz_type.entry(*biz_type_id).or_default();
        ids.push(*id);
        run_ats.push(*run_at);
    }
    let mut tx = crate::db::citus::begin_routed(pool).await?;
    let mut given = 0;
    for (biz_type_id, (ids, run_ats)) in by_biz_type {
        let n = crate::db::query(GIVE_BACK_CITUS).bind(biz_type_id).bind(&ids).bind(&run_ats).bind(node_id).execute(&mut *tx).await?.rows_affected();
        if n > 0 {
            wake::notify(&mut *tx, wake::Wake::DueFor(biz_type_id)).await?;
        }
        given += n;
    }
    tx.commit().await?;
    Ok(given)
}

/// Puts back to pending the tasks whose lease ran out (their holder died, lost the
/// database, or a consumer let its time to run pass), recording the lost attempt; a task
/// whose deadline has passed ends `expired` instead. Safe on every node at once. At most
/// 1,000 tasks a call.
/// On a Citus cluster, 1,000 a biz type (`recover_expired_leases_citus`).
pub async fn recover_expired_leases(pool: &Pool) -> Result<Swept, sqlx::Error> {
    if crate::db::citus::active() {
        return recover_expired_leases_citus(pool).await;
    }
    let recovered: Vec<(String, bool)> = crate::db::query_as(include_str!("sql/recover_leases.sql")).fetch_all(pool).await?;
    Ok(Swept {
        tasks: recovered.len() as u64,
        expired: recovered.into_iter().filter(|(_, expired)| *expired).map(|(biz_type, _)| biz_type).collect(),
    })
}

/// The biz types whose tasks a leader statement on a Citus cluster has work for: one
/// statement over every shard (no lock: Citus allows a multi-shard read), through the
/// index the plain statement walks, so that the leader runs its per-biz-type statement only
/// where it finds something rather than for every biz type at every tick. `which` is the
/// condition on `tasks` (a constant of this module, never a client's text).
async fn citus_biz_types_with(pool: &Pool, which: &'static str) -> Result<Vec<i32>, sqlx::Error> {
    crate::db::query_scalar(sqlx::AssertSqlSafe(format!("SELECT DISTINCT biz_type_id FROM tasks WHERE {which} ORDER BY 1"))).fetch_all(pool).await
}

/// A task recover_leases_citus.sql put back or ended, and its lost attempt.
#[derive(sqlx::FromRow)]
struct Recovered {
    id: Uuid,
    biz_type: String,
    status: String,
    attempt_count: i32,
    started_at: DateTime<Utc>,
    duration_ms: i32,
    error: String,
    node_id: Option<Uuid>,
}

/// `recover_expired_leases` on a Citus cluster: per biz type with a lease run out, one
/// transaction on the worker of its shard: recover_leases_citus.sql, then the lost attempts
/// (lost_attempts_citus.sql) and the notices of the tasks it ended (notices_citus.sql).
async fn recover_expired_leases_citus(pool: &Pool) -> Result<Swept, sqlx::Error> {
    let mut swept = Swept::default();
    for biz_type_id in citus_biz_types_with(pool, "status = 'running' AND lease_until < now()").await? {
        let mut tx = crate::db::citus::begin_routed(pool).await?;
        let rows: Vec<Recovered> = crate::db::query_as(include_str!("sql/recover_leases_citus.sql")).bind(biz_type_id).fetch_all(&mut *tx).await?;
        if !rows.is_empty() {
            lost_attempts_citus(&mut tx, biz_type_id, &rows).await?;
        }
        let (ended, events): (Vec<Uuid>, Vec<String>) =
            rows.iter().filter(|r| r.status != "pending").map(|r| (r.id, format!("task.{}", r.status))).unzip();
        if !ended.is_empty() {
            crate::db::query(include_str!("sql/notices_citus.sql")).bind(biz_type_id).bind(&ended).bind(&events).execute(&mut *tx).await?;
        }
        tx.commit().await?;
        swept.tasks += rows.len() as u64;
        swept.expired.extend(rows.into_iter().filter(|r| r.status == "expired").map(|r| r.biz_type));
    }
    Ok(swept)
}

/// The lost attempts of `rows`, tasks of `biz_type_id` (lost_attempts_citus.sql).
async fn lost_attempts_citus(tx: &mut PgConnection, biz_type_id: i32, rows: &[Recovered]) -> Result<(), sqlx::Error> {
    crate::db::query(include_str!("sql/lost_attempts_citus.sql"))
        .bind(biz_type_id)
        .bind(rows.iter().map(|r| r.id).collect::<Vec<_>>())
        .bind(rows.iter().map(|r| r.attempt_count).collect::<Vec<_>>())
        .bind(rows.iter().map(|r| r.started_at).collect::<Vec<_>>())
        .bind(rows.iter().map(|r| r.duration_ms).collect::<Vec<_>>())
        .bind(rows.iter().map(|r| r.error.as_str()).collect::<Vec<_>>())
        .bind(rows.iter().map(|r| r.node_id).collect::<Vec<_>>())
        .execute(tx)
        .await?;
    Ok(())
}

/// Puts a task held by a pull consumer that a person judged dead back to pending now, as
/// lease recovery would once its time to run passed, with the lost attempt recorded under
/// `reason`; only while it is still held under `receipt` (see release.sql). Returns whether
/// it was released; the other nodes' reserves are woken. A release is recorded in the audit
/// log as `actor`'s (`task.release`) in the same transaction.
pub async fn release(pool: &Pool, biz_type_id: i32, id: Uuid, receipt: Uuid, reason: &str, actor: &str) -> Result<bool, sqlx::Error> {
    let mut tx = pool.begin().await?;
    let released: i64 = if crate::db::citus::active() {
        release_citus(&mut tx, biz_type_id, id, receipt, reason).await?
    } else {
        crate::db::query_scalar(include_str!("sql/release.sql")).bind(id).bind(biz_type_id).bind(receipt).bind(reason).fetch_one(&mut *tx).await?
    };
    if released > 0 {
        wake::notify(&mut *tx, wake::Wake::DueFor(biz_type_id)).await?;
        let (before, after) = (serde_json::json!({"status": "running", "receipt": receipt}), serde_json::json!({"status": "pending"}));
        crate::audit::record_task(&mut tx, actor, crate::audit::Action::TaskRelease, id, Some(before), Some(after)).await?;
    }
    tx.commit().await?;
    Ok(released > 0)
}

/// release.sql on a Citus cluster: release_citus.sql on the worker of the biz type's shard,
/// then the lost attempt (lost_attempts_citus.sql), in the caller's transaction. Returns how
/// many it released (0 or 1).
async fn release_citus(tx: &mut PgConnection, biz_type_id: i32, id: Uuid, receipt: Uuid, reason: &str) -> Result<i64, sqlx::Error> {
    crate::db::query("SELECT set_config('plan_cache_mode', 'force_custom_plan', true)").execute(&mut *tx).await?;
    let held: Option<(Uuid, i32, DateTime<Utc>, i32)> = crate::db::query_as(include_str!("sql/release_citus.sql"))
        .bind(id)
        .bind(biz_type_id)
        .bind(receipt)
        .bind(reason)
        .fetch_optional(&mut *tx)
        .await?;
    let Some((id, attempt_count, started_at, duration_ms)) = held else {
        return Ok(0);
    };
    let lost = Recovered {
        id,
        biz_type: String::new(),
        status: "pending".into(),
        attempt_count,
        started_at,
        duration_ms,
        error: reason.into(),
        node_id: None,
    };
    lost_attempts_citus(tx, biz_type_id, std::slice::from_ref(&lost)).await?;
    Ok(1)
}

/// What a sweep of expired leases or passed deadlines did: how many tasks it changed, and
/// the biz type of each one it ended `expired` (one name per task), which the caller counts
/// in the metrics (`metrics::expired_each`).
#[derive(Debug, Default)]
pub struct Swept {
    pub tasks: u64,
    pub expired: Vec<String>,
}

/// Ends `expired` up to `limit` pending tasks whose deadline has passed without a claim:
/// held back by a paused biz type, a backlog, a rate limit, or a pull biz type nobody
/// reserves from (see expire.sql). Safe on every node at once.
/// On a Citus cluster, per biz type with such tasks, up to `limit` in all (`expire_overdue_citus`).
pub async fn expire_overdue(pool: &Pool, limit: i64) -> Result<Swept, sqlx::Error> {
    if crate::db::citus::active() {
        return expire_overdue_citus(pool, limit).await;
    }
    let ended: Vec<String> = crate::db::query_scalar(include_str!("sql/expire.sql")).bind(limit).fetch_all(pool).await?;
    Ok(Swept { tasks: ended.len() as u64, expired: ended })
}

/// `expire_overdue` on a Citus cluster: per biz type with a pending task past its deadline,
/// one transaction on the worker of its shard: expire_citus.sql, then the notices of the
/// tasks it ended (notices_citus.sql); until `limit` tasks are ended in all.
async fn expire_overdue_citus(pool: &Pool, limit: i64) -> Result<Swept, sqlx::Error> {
    let mut swept = Swept::default();
    for biz_type_id in citus_biz_types_with(pool, "status = 'pending' AND expires_at IS NOT NULL AND expires_at <= now()").await? {
        let left = limit - swept.tasks as i64;
        if left <= 0 {
            break;
        }
        let mut tx = crate::db::citus::begin_routed(pool).await?;
        let ended: Vec<(Uuid, String)> =
            crate::db::query_as(include_str!("sql/expire_citus.sql")).bind(left).bind(biz_type_id).fetch_all(&mut *tx).await?;
        if !ended.is_empty() {
            let ids: Vec<Uuid> = ended.iter().map(|(id, _)| *id).collect();
            let events = vec!["task.expired"; ids.len()];
            crate::db::query(include_str!("sql/notices_citus.sql")).bind(biz_type_id).bind(&ids).bind(&events).execute(&mut *tx).await?;
        }
        tx.commit().await?;
        swept.tasks += ended.len() as u64;
        swept.expired.extend(ended.into_iter().map(|(_, name)| name));
    }
    Ok(swept)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_retries_until_the_attempts_are_used_up() {
        let policy = RetryPolicy { max_attempts: 3, backoff_initial_ms: 1_000, backoff_max_ms: 10_000 };
        let now: DateTime<Utc> = "2026-11-24T12:00:00Z".parse().unwrap();
        assert_eq!(Verdict::after_failure(3, policy, None, now, None), Verdict::GiveUp);
        assert_eq!(Verdict::after_failure(4, policy, Some(Duration::ZERO), now, None), Verdict::GiveUp);
        assert_eq!(Verdict::after_failure(1, policy, Some(Duration::from_secs(7)), now, None), Verdict::RetryAt(now + TimeDelta::seconds(7)));
        match Verdict::after_failure(2, policy, None, now, None) {
            Verdict::RetryAt(at) => assert!(at >= now + TimeDelta::seconds(1) && at <= now + TimeDelta::seconds(2), "{at}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_retry_or_snooze_at_or_after_the_deadline_expires_the_task_now() {
        let policy = RetryPolicy { max_attempts: 3, backoff_initial_ms: 1_000, backoff_max_ms: 10_000 };
        let now: DateTime<Utc> = "2026-11-24T12:00:00Z".parse().unwrap();
        let deadline = now + TimeDelta::seconds(7);
        let expired = Verdict::Expire { deadline, next: Some(deadline), snoozed: false };
        assert_eq!(Verdict::after_failure(1, policy, Some(Duration::from_secs(7)), now, Some(deadline)), expired);
        let early = Verdict::after_failure(1, policy, Some(Duration::from_secs(6)), now, Some(deadline));
        assert_eq!(early, Verdict::RetryAt(now + TimeDelta::seconds(6)));
        assert_eq!(Verdict::after_failure(3, policy, None, now, Some(now)), Verdict::GiveUp, "attempts used up: failed, as without a deadline");
        assert_eq!(Verdict::after_snooze(now + TimeDelta::seconds(6), Some(deadline)), Verdict::Snooze(now + TimeDelta::seconds(6)));
        assert_eq!(Verdict::after_snooze(deadline, Some(deadline)), Verdict::Expire { deadline, next: Some(deadline), snoozed: true });
        assert_eq!(Verdict::after_snooze(deadline, None), Verdict::Snooze(deadline));
        let error = expired.task_error(Some("HTTP 503")).unwrap();
        assert!(error.contains("at or after its deadline 2026-11-24T12:00:07+00:00") && error.ends_with("(last attempt: HTTP 503)"), "{error}");
    }
}
