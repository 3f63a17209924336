//! The claim of a biz type with per-key limits on a Citus cluster (docs/design/citus.md,
//! Flow keys): pick_flow.sql's pick, taken apart into statements that Citus routes whole to
//! the worker holding the biz type's shard, each naming the biz type as a constant, with
//! the keys' rooms counted between them on the coordinator.
//!
//! Why not pick_flow.sql as it is: Citus refuses it (its LATERAL subqueries with a LIMIT
//! read columns of the `flows` CTE, not constants), and its functions read `tasks`:
//! `chime_flow_rooms` (plpgsql) inside a statement sent to a shard is "a distributed query
//! from a query on a shard", and `chime_flow_head` (SQL, inlined by the worker) would read
//! the worker's empty shell of `tasks` rather than the shard. So `chime_flow_head`'s two
//! probes are written out here (`HEADS`), and `chime_flow_rooms` runs alone on the
//! coordinator, where its advisory locks are taken by every claim of every node (as the
//! gate's) and its counts are statements Citus routes by the biz type (the transaction's
//! `plan_cache_mode = force_custom_plan` makes its parameter a constant).
//!
//! The steps, in one transaction: the gate (`chime_claim_room`, `citus_room`); `HEAD`,
//! the first n due tasks, locked; their keys' heads when ordered (`HEADS`) and rooms;
//! when those leave the claim short of n, `WALK`, up to 64 keys after the cursor with due
//! work, their heads and rooms, and their tasks up to each room (`KEY_TASKS`); then
//! claim_citus.sql leases what was chosen, its pick (`PICKED`) locking those rows again.
//! Five to eight statements where plain PostgreSQL runs one: the cost of per-key limits on
//! Citus, paid only by biz types that have them.

use std::collections::{BTreeMap, HashMap};
use std::sync::LazyLock;

use chrono::{DateTime, Utc};
use sqlx::PgConnection;
use uuid::Uuid;

use super::{Claim, ClaimRow, FlowWant, Want};
use crate::db::Pool;

/// Keys a claim walks past the head at most (pick_flow.sql's KEY_WALK).
const KEY_WALK: i64 = 64;

/// The first $4 due tasks of biz type $1 (due within $2 ms, no earlier than $3), locked as
/// pick_flow.sql's `head` locks them: FOR UPDATE SKIP LOCKED, so that another node's claim
/// passes over them to the next due tasks.
pub const HEAD: &str = "SELECT id, run_at, flow_key FROM tasks
  WHERE biz_type_id = $1 AND status = 'pending' AND run_at <= now() + $2 * interval '1 millisecond'
    AND run_at >= coalesce($3, '-infinity')
  ORDER BY run_at LIMIT $4
    FOR UPDATE SKIP LOCKED";

/// Each ordered key's head (chime_flow_head's two probes: the task tried already and
/// pending, else the first pending by run_at, id) among keys $2 of biz type $1, and whether
/// it is due within $4 ms. Reads, locks nothing.
pub const HEADS: &str = "SELECT k.i::int, h.id, h.run_at, h.run_at <= now() + $4 * interval '1 millisecond' AS due
  FROM unnest($2::text[]) WITH ORDINALITY AS k(flow_key, i)
 CROSS JOIN LATERAL (
    (SELECT t.id, t.run_at FROM tasks t
      WHERE t.biz_type_id = $1 AND t.flow_key = k.flow_key AND t.status = 'pending'
        AND (t.attempt_count > 0 OR t.snoozes > 0) AND t.run_at >= coalesce($3, '-infinity')
      LIMIT 1)
    UNION ALL
    (SELECT t.id, t.run_at FROM tasks t
      WHERE t.biz_type_id = $1 AND t.flow_key = k.flow_key AND t.status = 'pending' AND t.run_at >= coalesce($3, '-infinity')
      ORDER BY t.run_at, t.id LIMIT 1)
    LIMIT 1
 ) h";

/// Up to 64 keys of biz type $1 after $2 with a task due within $3 ms (no earlier than $4),
/// in key order: a loose scan of tasks_flow_idx, one descent per key, as pick_flow.sql's
/// `walk`. Reads, locks nothing.
pub const WALK: &str = "WITH RECURSIVE scan(flow_key, i) AS (
    SELECT (SELECT flow_key FROM tasks
             WHERE biz_type_id = $1 AND status = 'pending' AND flow_key > coalesce($2, '')
               AND run_at <= now() + $3 * interval '1 millisecond' AND run_at >= coalesce($4, '-infinity')
             ORDER BY flow_key LIMIT 1), 1::int8
    UNION ALL
    SELECT (SELECT t.flow_key FROM tasks t
             WHERE t.biz_type_id = $1 AND t.status = 'pending' AND t.flow_key > scan.flow_key
               AND t.run_at <= now() + $3 * interval '1 millisecond' AND t.run_at >= coalesce($4, '-infinity')
             ORDER BY t.flow_key LIMIT 1), scan.i + 1
      FROM scan WHERE scan.flow_key IS NOT NULL AND scan.i < 64
)
SELECT flow_key, i FROM scan WHERE flow_key IS NOT NULL";

/// Of each key $2 of biz type $1, up to its room $3 of its due tasks (within $4 ms, no
/// earlier than $5) in run_at order. Reads, locks nothing: `PICKED` locks what is chosen.
pub const KEY_TASKS: &str = "SELECT k.i::int, t.id, t.run_at
  FROM unnest($2::text[], $3::int[]) WITH ORDINALITY AS k(flow_key, room, i)
 CROSS JOIN LATERAL (
    SELECT id, run_at FROM tasks
     WHERE biz_type_id = $1 AND flow_key = k.flow_key AND status = 'pending'
       AND run_at <= now() + $4 * interval '1 millisecond' AND run_at >= coalesce($5, '-infinity')
     ORDER BY run_at, id LIMIT greatest(k.room, 0)
 ) t";

/// claim_citus.sql with the chosen tasks as its pick: $10 their ids, $11 their run_at, in
/// the order they are taken. Locked as pick_flow.sql's `picked` locks them, FOR UPDATE SKIP
/// LOCKED, `status` checked again on the locked row (the head's rows are this
/// transaction's already).
pub fn lease_sql() -> &'static str {
    static SQL: LazyLock<String> = LazyLock::new(|| {
        include_str!("../sql/claim_citus.sql").replace(
            "{pick}",
            "picked AS (
    SELECT $8::int AS biz_type_id, t.id, t.run_at, 5 AS ord
      FROM tasks t
     WHERE t.biz_type_id = $8 AND t.id = ANY($10::uuid[]) AND t.run_at = ANY($11::timestamptz[]) AND t.status = 'pending'
       FOR UPDATE SKIP LOCKED
)",
        )
    });
    SQL.as_str()
}

/// A key the claim looks at: its head task when ordered (id, run_at, due), and its room.
struct Key {
    flow_key: String,
    head: Option<(Uuid, DateTime<Utc>, bool)>,
    room: i32,
}

/// Claims for `want` (which has per-key limits) on Citus; its part goes into `claims`.
pub(super) async fn claim(
    pool: &Pool,
    want: &Want,
    node_id: Uuid,
    floor: Option<DateTime<Utc>>,
    claims: &mut HashMap<i32, Claim>,
) -> Result<(), sqlx::Error> {
    let flow = want.flow.as_ref().expect("a biz type with per-key limits");
    let biz = want.biz_type_id;
    let mut tx = pool.begin().await?;
    let room = super::citus_room(&mut tx, want).await?;
    let head: Vec<(Uuid, DateTime<Utc>, Option<String>)> =
        crate::db::query_as(HEAD).bind(biz).bind(want.ahead_ms).bind(floor).bind(want.limit).fetch_all(&mut *tx).await?;

    // What the head gives: its tasks without a key; of each key, its first tasks there up
    // to its room; of an ordered key, its head task if due (pick_flow.sql's `from_head`).
    let head_keys: Vec<String> = head.iter().filter_map(|(_, _, k)| k.clone()).collect::<std::collections::BTreeSet<_>>().into_iter().collect();
    let head_rooms = keys(&mut tx, biz, head_keys, want, flow, floor).await?;
    let mut chosen: Vec<(usize, DateTime<Utc>, Uuid)> = Vec::new();
    let mut nth: HashMap<&str, i32> = HashMap::new();
    for (id, run_at, key) in &head {
        match key {
            None => chosen.push((0, *run_at, *id)),
            Some(key) if !flow.ordered => {
                let n = nth.entry(key.as_str()).or_default();
                *n += 1;
                if head_rooms.iter().any(|k| k.flow_key == *key && *n <= k.room) {
                    chosen.push((0, *run_at, *id));
                }
            }
            Some(_) => {}
        }
    }
    chosen.extend(head_rooms.iter().filter_map(|k| k.head.filter(|(_, _, due)| flow.ordered && k.room > 0 && *due).map(|(id, at, _)| (0, at, id))));

    // Keys beyond the head may have due work that a herd of the head's keys hides: when
    // the head left the claim short, the walk (pick_flow.sql's `short`, `walk`).
    let mut cursor = flow.cursor.clone();
    let mut walk_rooms = Vec::new();
    if (chosen.len() as i64) < want.limit {
        let walk: Vec<(String, i64)> =
            crate::db::query_as(WALK).bind(biz).bind(&flow.cursor).bind(want.ahead_ms).bind(floor).fetch_all(&mut *tx).await?;
        cursor = walk.iter().find(|(_, i)| *i == KEY_WALK).map(|(k, _)| k.clone());
        let position: BTreeMap<String, usize> = walk.iter().map(|(k, i)| (k.clone(), *i as usize)).collect();
        let fresh: Vec<String> = walk.into_iter().map(|(k, _)| k).filter(|k| !head_rooms.iter().any(|h| h.flow_key == *k)).collect();
        walk_rooms = keys(&mut tx, biz, fresh, want, flow, floor).await?;
        if flow.ordered {
            chosen.extend(
                walk_rooms.iter().filter_map(|k| k.head.filter(|(_, _, due)| k.room > 0 && *due).map(|(id, at, _)| (position[&k.flow_key], at, id))),
            );
        } else {
            let open: Vec<&Key> = walk_rooms.iter().filter(|k| k.room > 0).collect();
            let tasks: Vec<(i32, Uuid, DateTime<Utc>)> = crate::db::query_as(KEY_TASKS)
                .bind(biz)
                .bind(open.iter().map(|k| k.flow_key.clone()).collect::<Vec<_>>())
                .bind(open.iter().map(|k| k.room).collect::<Vec<_>>())
                .bind(want.ahead_ms)
                .bind(floor)
                .fetch_all(&mut *tx)
                .await?;
            chosen.extend(tasks.into_iter().map(|(i, id, at)| (position[&open[i as usize - 1].flow_key], at, id)));
        }
    }
    chosen.sort();
    chosen.truncate(want.limit.max(0) as usize);

    let rows: Vec<ClaimRow> = if chosen.is_empty() {
        vec![]
    } else {
        super::bind_citus_claim(crate::db::query_as(lease_sql()), want, node_id, floor, room)
            .bind(chosen.iter().map(|(_, _, id)| *id).collect::<Vec<_>>())
            .bind(chosen.iter().map(|(_, at, _)| *at).collect::<Vec<_>>())
            .fetch_all(&mut *tx)
            .await?
    };
    super::citus_commit(tx, biz, rows, claims).await?;
    // Whether a key with due work had no room (the engine then looks again shortly), and
    // where the next claim's walk starts: pick_flow.sql's `held` (-1: another claim held the
    // key's lock, and is taking it).
    let held = head_rooms.iter().chain(&walk_rooms).any(|k| k.room == 0);
    if held || cursor.is_some() {
        let claim = claims.entry(biz).or_default();
        claim.capped |= held;
        claim.cursor = cursor;
    }
    Ok(())
}

/// `keys`, each with its head when ordered (a key without one is left out, as
/// pick_flow.sql's `head_keys` leaves it) and its room (`chime_flow_rooms`, on the
/// coordinator).
async fn keys(
    tx: &mut PgConnection,
    biz: i32,
    keys: Vec<String>,
    want: &Want,
    flow: &FlowWant,
    floor: Option<DateTime<Utc>>,
) -> Result<Vec<Key>, sqlx::Error> {
    if keys.is_empty() {
        return Ok(vec![]);
    }
    let mut keys: Vec<Key> = keys.into_iter().map(|flow_key| Key { flow_key, head: None, room: 0 }).collect();
    if flow.ordered {
        let heads: Vec<(i32, Uuid, DateTime<Utc>, bool)> = crate::db::query_as(HEADS)
            .bind(biz)
            .bind(keys.iter().map(|k| k.flow_key.clone()).collect::<Vec<_>>())
            .bind(floor)
            .bind(want.ahead_ms)
            .fetch_all(&mut *tx)
            .await?;
        for (i, id, at, due) in heads {
            keys[i as usize - 1].head = Some((id, at, due));
        }
        keys.retain(|k| k.head.is_some());
    }
    // Locks (chime_flow_rooms): a try-lock on each key, on the coordinator, until the commit.
    let rooms: Vec<(i32, i32)> = crate::db::query_as("SELECT key_of, room FROM chime_flow_rooms($1, $2, $3, $4, $5)")
        .bind(biz)
        .bind(keys.iter().map(|k| k.flow_key.clone()).collect::<Vec<_>>())
        .bind(keys.iter().map(|k| k.head.map(|(id, _, _)| id)).collect::<Vec<_>>())
        .bind(flow.cap)
        .bind(flow.rate)
        .fetch_all(&mut *tx)
        .await?;
    for (i, room) in rooms {
        keys[i as usize - 1].room = room;
    }
    Ok(keys)
}
