//! Partitions of `tasks` and `attempts`, the hot horizon, cold-to-hot moves and retention
//! (docs/design/contract.md: Storage, Leader).
//!
//! Partitions are fixed-width time ranges aligned on the Unix epoch (daily by default:
//! midnight UTC). Which partitions exist is read from the catalog, not derived from a
//! naming rule, so the width can change between runs: new partitions simply fill the gaps.
//!
//! * `ensure` (every node at start, then the leader every minute) creates the partitions
//!   from a day ago (a task may be created up to a day in the past) to `hot_days` ahead,
//!   and moves the hot horizon to their end. Tasks due beyond the horizon go to
//!   `tasks_cold`.
//! * `tasks::placement::move_cold` (the leader's migrator) moves cold tasks that now fall before the horizon into the
//!   hot partitions, one batch per statement: the DELETE from cold and the INSERT into hot
//!   commit together or not at all, so a leader dying mid-move loses and doubles nothing.
//! * `retire` (the leader) drops partitions past retention, by detaching them first (a
//!   short lock), then removing their tasks' idempotency keys in batches, then dropping the
//!   detached table. A partition that still holds an unfinished task is kept.
//! * `complete_indexes` (the leader, beside its tick) finishes the partitioned indexes a
//!   migration made `ON ONLY` on `tasks` or `attempts` (migrations/README.md says why): it
//!   builds each partition's index concurrently and attaches it, after which PostgreSQL
//!   marks the parent's index valid. Partitions created later get it with their table. An
//!   index such a migration replaced (`REPLACED`) is dropped once its replacement is valid.

use crate::db::Pool;
use crate::tasks::placement;
use chrono::{DateTime, Duration, DurationRound, Utc};
use sqlx::{AssertSqlSafe, Connection};

/// Serialises partition DDL between nodes starting together.
const PARTITION_LOCK: i64 = 0x6368_696d_6570; // "chimep"
/// How far back partitions are made: a task may be created up to a day in the past.
const BEHIND: Duration = Duration::days(1);
/// Detached partitions waiting for their keys to be removed and to be dropped.
const RETIRED_PREFIX: &str = "retired_";
/// Serialises `complete_indexes` between nodes (a deposed leader still building, a test).
const INDEX_LOCK: i64 = 0x6368_696d_6569; // "chimei"
/// Storage parameters of a `tasks` partition (migration 0050 sets the fillfactor of those made before).
const TASKS_STORAGE: &str = " WITH (fillfactor = 50, autovacuum_vacuum_scale_factor = 0.05, autovacuum_analyze_scale_factor = 0.02)";
/// Partitioned indexes a migration replaced, each with its replacement: `complete_indexes`
/// drops the old one once the new one is valid, so that what it served always has an index.
const REPLACED: [(&str, &str); 2] = [("tasks_list_idx", "tasks_finished_list_idx"), ("tasks_payload_idx", "tasks_payload_resting_idx")];
/// Idempotency keys removed per statement when a partition is retired.
const KEY_BATCH: i64 = 10_000;

/// Where partitions go and how long they are kept, from the node's settings.
#[derive(Debug, Clone, Copy)]
pub struct Layout {
    pub width: Duration,
    pub hot_days: u32,
    pub retention_days: u32,
}

impl Layout {
    pub fn new(partition_hours: u32, hot_days: u32, retention_days: u32) -> Result<Layout, String> {
        if !(24 % partition_hours == 0 || partition_hours.is_multiple_of(24)) {
            return Err(format!("CHIME_PARTITION_HOURS must divide 24 (1, 2, 3, 4, 6, 8, 12) or be a multiple of 24, not {partition_hours}"));
        }
        Ok(Layout { width: Duration::hours(i64::from(partition_hours)), hot_days, retention_days })
    }

    fn align_down(&self, t: DateTime<Utc>) -> DateTime<Utc> {
        t.duration_trunc(self.width).expect("partition width fits the timestamp range")
    }
}

impl Default for Layout {
    fn default() -> Self {
        Layout { width: Duration::days(1), hot_days: 2, retention_days: 30 }
    }
}

/// One partition, as the catalog describes it.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Partition {
    pub name: String,
    pub from: DateTime<Utc>,
    pub to: DateTime<Utc>,
}

/// The partitions of `table` (`tasks` or `attempts`), oldest first.
pub async fn list<'c>(db: impl sqlx::PgExecutor<'c>, table: &str) -> Result<Vec<Partition>, sqlx::Error> {
    // The bounds are printed by pg_get_expr and parsed back in the same session, so the
    // session's TimeZone and DateStyle cannot confuse them.
    crate::db::query_as(
        r#"SELECT c.relname::text AS name,
                  (regexp_match(b.expr, 'FROM \(''([^'']+)''\)'))[1]::timestamptz AS "from",
                  (regexp_match(b.expr, 'TO \(''([^'']+)''\)'))[1]::timestamptz AS "to"
             FROM pg_inherits i
             JOIN pg_class c ON c.oid = i.inhrelid
             CROSS JOIN LATERAL (SELECT pg_get_expr(c.relpartbound, c.oid) AS expr) b
            WHERE i.inhparent = $1::regclass
            ORDER BY 2"#,
    )
    .bind(table)
    .fetch_all(db)
    .await
}

/// The ranges to create so that `[start, end)` is covered, given the existing partitions
/// (oldest first): whole slots of `width`, cut short where an existing partition begins.
fn missing_ranges(layout: &Layout, existing: &[Partition], start: DateTime<Utc>, end: DateTime<Utc>) -> Vec<(DateTime<Utc>, DateTime<Utc>)> {
    let mut out = Vec::new();
    let mut t = layout.align_down(start);
    while t < end {
        if let Some(p) = existing.iter().find(|p| p.from <= t && t < p.to) {
            t = p.to;
            continue;
        }
        let mut next = layout.align_down(t) + layout.width;
        if let Some(p) = existing.iter().find(|p| t < p.from && p.from < next) {
            next = p.from;
        }
        out.push((t, next));
        t = next;
    }
    out
}

pub fn partition_name(table: &str, from: DateTime<Utc>) -> String {
    if from.time() == chrono::NaiveTime::MIN {
        format!("{table}_p{}", from.format("%Y%m%d"))
    } else {
        format!("{table}_p{}", from.format("%Y%m%d_%H%M"))
    }
}

/// Creates the partitions from a day ago to `hot_days` ahead and moves the hot horizon to
/// their end. Safe on many nodes at once. Returns the horizon.
pub async fn ensure(pool: &Pool, layout: &Layout) -> Result<DateTime<Utc>, sqlx::Error> {
    ensure_since(pool, layout, BEHIND).await
}

/// `ensure`, from `behind` ago rather than a day: the partitions that `ensure` made on each
/// of the past days, as retention keeps them (the bench fills them with finished tasks).
pub async fn ensure_since(pool: &Pool, layout: &Layout, behind: Duration) -> Result<DateTime<Utc>, sqlx::Error> {
    let mut tx = pool.begin().await?;
    crate::db::query("SELECT pg_advisory_xact_lock($1)").bind(PARTITION_LOCK).execute(&mut *tx).await?;
    // Creating a partition locks its parent for a moment; rather than queue behind a long
    // query (and hold up every claim queued behind us), fail and try again later.
    crate::db::query("SET LOCAL lock_timeout = '5s'").execute(&mut *tx).await?;
    let now: DateTime<Utc> = crate::db::query_scalar("SELECT now()").fetch_one(&mut *tx).await?;
    let end = layout.align_down(now + Duration::days(i64::from(layout.hot_days))) + layout.width;
    let mut created = 0;
    for table in ["tasks", "attempts"] {
        let existing = list(&mut *tx, table).await?;
        for (from, to) in missing_ranges(layout, &existing, now - behind, end) {
            // DDL takes no bind parameters; the values are timestamps we formatted ourselves.
            // Task partitions are queues: rows change state within minutes of arriving, so
            // they are vacuumed and analysed early (stale statistics can make the claim
            // walk the list index past finished tasks instead of the pending-only one), and
            // their pages are filled half at insert, so that a task's claim and record put
            // its new versions beside the old (migration 0050: less WAL per task).
            let storage = if table == "tasks" { TASKS_STORAGE } else { "" };
            crate::db::query(AssertSqlSafe(format!(
                "CREATE TABLE {} PARTITION OF {table} FOR VALUES FROM ('{}') TO ('{}'){storage}",
                partition_name(table, from),
                from.to_rfc3339(),
                to.to_rfc3339()
            )))
            .execute(&mut *tx)
            .await?;
            created += 1;
        }
    }
    let horizon: DateTime<Utc> =
        crate::db::query_scalar("UPDATE hot_horizon SET until = greatest(until, $1) RETURNING until").bind(end).fetch_one(&mut *tx).await?;
    tx.commit().await?;
    if created > 0 {
        tracing::info!(created, %horizon, "created partitions");
    }
    Ok(horizon)
}

/// An index of a partition that should be attached to an invalid partitioned index.
#[derive(Debug, sqlx::FromRow)]
struct MissingIndex {
    /// The parent's index, as `ON ONLY` made it.
    parent: String,
    partition: String,
    /// The parent index's definition from `USING` on: what each partition's index repeats.
    definition: String,
    /// The partition's index of the expected name, if one exists (then not attached: a
    /// build that failed half-way, left invalid, or one this code did not finish attaching).
    existing_valid: Option<bool>,
}

/// Completes every invalid partitioned index of `tasks` and `attempts`: for each partition
/// without its index, builds it `CONCURRENTLY` (writes go on) and attaches it; once every
/// partition's is attached, PostgreSQL marks the parent valid. Idempotent: an index already
/// attached is left alone, a valid one not yet attached is attached, an invalid leftover
/// of a failed build is dropped and built again. Only one node at a time (an advisory
/// lock on its own session; a node that does not get it returns at once). `direct` must
/// reach PostgreSQL itself: the build runs outside a transaction and the lock is a
/// session's. Returns how many partition indexes it built.
pub async fn complete_indexes(direct: &Pool) -> Result<u32, sqlx::Error> {
    // A session of its own, closed at the end, so that its settings and lock never go back
    // to the pool.
    let mut conn = direct.acquire().await?.detach();
    let locked: bool = crate::db::query_scalar("SELECT pg_try_advisory_lock($1)").bind(INDEX_LOCK).fetch_one(&mut conn).await?;
    if !locked {
        return Ok(0);
    }
    // A build on a large partition takes minutes: a statement_timeout set on the server
    // would cut it off every time, leaving an invalid index to build again.
    crate::db::query("SET statement_timeout = 0").execute(&mut conn).await?;
    let missing: Vec<MissingIndex> = crate::db::query_as(
        "SELECT pi.relname::text AS parent, part.relname::text AS partition,
                substring(pg_get_indexdef(pi.oid) FROM ' USING .*$') AS definition,
                (SELECT x2.indisvalid FROM pg_class ci JOIN pg_index x2 ON x2.indexrelid = ci.oid
                  WHERE ci.relname = part.relname || '_' || pi.relname AND ci.relnamespace = part.relnamespace) AS existing_valid
           FROM pg_index x
           JOIN pg_class pi ON pi.oid = x.indexrelid
           JOIN pg_class pt ON pt.oid = x.indrelid
           JOIN pg_inherits i ON i.inhparent = pt.oid
           JOIN pg_class part ON part.oid = i.inhrelid
          WHERE pt.relname IN ('tasks', 'attempts') AND pt.relnamespace = current_schema()::regnamespace
            AND pi.relkind = 'I' AND NOT x.indisvalid
            AND NOT EXISTS (SELECT 1 FROM pg_inherits ii JOIN pg_index xc ON xc.indexrelid = ii.inhrelid
                             WHERE ii.inhparent = pi.oid AND xc.indrelid = part.oid)
          ORDER BY 1, 2",
    )
    .fetch_all(&mut conn)
    .await?;
    let mut built = 0;
    let mut outcome = Ok(());
    for m in &missing {
        let index = format!("{}_{}", m.partition, m.parent);
        let step = async {
            if m.existing_valid == Some(false) {
                crate::db::query(AssertSqlSafe(format!("DROP INDEX CONCURRENTLY IF EXISTS {index}"))).execute(&mut conn).await?;
            }
            if m.existing_valid != Some(true) {
                // Names and definition come from the catalog, not from a client.
                crate::db::query(AssertSqlSafe(format!("CREATE INDEX CONCURRENTLY IF NOT EXISTS {index} ON {} {}", m.partition, m.definition)))
                    .execute(&mut conn)
                    .await?;
                built += 1;
            }
            // Attaching locks the parent index for a moment: rather than queue behind a long
            // query (and everything behind us), fail and try again at the next round. The
            // builds above wait as long as it takes for older transactions to end (their
            // locks block no writes), so they run without it.
            crate::db::query("SET lock_timeout = '5s'").execute(&mut conn).await?;
            crate::db::query(AssertSqlSafe(format!("ALTER INDEX {} ATTACH PARTITION {index}", m.parent))).execute(&mut conn).await?;
            crate::db::query("SET lock_timeout = 0").execute(&mut conn).await?;
            Ok::<_, sqlx::Error>(())
        };
        if let Err(e) = step.await {
            outcome = Err(e);
            break;
        }
        tracing::info!(index = %index, parent = %m.parent, "built and attached a partition's index");
    }
    if outcome.is_ok() {
        outcome = drop_replaced(&mut conn).await;
    }
    let _ = conn.close().await;
    outcome.map(|()| built)
}

/// Drops each index of `REPLACED` whose replacement is valid (complete on every partition).
async fn drop_replaced(conn: &mut sqlx::PgConnection) -> Result<(), sqlx::Error> {
    for (old, new) in REPLACED {
        let ready: bool = crate::db::query_scalar(
            "SELECT EXISTS (SELECT FROM pg_class o WHERE o.relname = $1 AND o.relnamespace = current_schema()::regnamespace)
                AND EXISTS (SELECT FROM pg_class n JOIN pg_index x ON x.indexrelid = n.oid
                             WHERE n.relname = $2 AND n.relnamespace = current_schema()::regnamespace AND x.indisvalid)",
        )
        .bind(old)
        .bind(new)
        .fetch_one(&mut *conn)
        .await?;
        if ready {
            // Locks the table and its partitions (ACCESS EXCLUSIVE) for a moment: rather
            // than queue claims behind a long query, fail and try again at the next round.
            crate::db::query("SET lock_timeout = '1s'").execute(&mut *conn).await?;
            crate::db::query(AssertSqlSafe(format!("DROP INDEX IF EXISTS {old}"))).execute(&mut *conn).await?;
            crate::db::query("SET lock_timeout = 0").execute(&mut *conn).await?;
            tracing::info!(index = old, replacement = new, "dropped a partitioned index its replacement now serves");
        }
    }
    Ok(())
}

/// The hot horizon: tasks due before it are in the partitions, later ones in cold storage.
pub async fn horizon(pool: &Pool) -> Result<DateTime<Utc>, sqlx::Error> {
    crate::db::query_scalar("SELECT until FROM hot_horizon").fetch_one(pool).await
}

/// A table's (or partition's) estimated rows, from the statistics, and its size on disk
/// with its indexes, as PostgreSQL prints it.
pub async fn estimate(pool: &Pool, table: &str) -> Result<(i64, String), sqlx::Error> {
    crate::db::query_as(
        "SELECT greatest(coalesce(s.n_live_tup, 0), 0)::bigint, pg_size_pretty(pg_total_relation_size(c.oid))
           FROM pg_class c LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid
          WHERE c.oid = $1::regclass",
    )
    .bind(table)
    .fetch_one(pool)
    .await
}

/// Drops the partitions of `tasks` and `attempts` that ended more than `retention_days`
/// ago, keeping any partition of `tasks` that holds an unfinished task. Returns the names
/// of the partitions dropped.
pub async fn retire(pool: &Pool, layout: &Layout) -> Result<Vec<String>, sqlx::Error> {
    let now: DateTime<Utc> = crate::db::query_scalar("SELECT now()").fetch_one(pool).await?;
    let cutoff = now - Duration::days(i64::from(layout.retention_days));
    for table in ["tasks", "attempts"] {
        for p in list(pool, table).await?.into_iter().filter(|p| p.to <= cutoff) {
            detach(pool, table, &p.name).await?;
        }
    }
    // Failure notices go with their tasks: finished before the cutoff, their tasks ended
    // before it too.
    crate::failure_notices::forget_finished(pool, cutoff).await?;
    // So do chat notices that can no longer be sent (their biz type's chat tool removed).
    crate::chat_notices::forget_unsendable(pool, cutoff).await?;
    drop_detached(pool).await
}

/// Detaches one old partition (renamed `retired_…`), unless it holds unfinished tasks.
async fn detach(pool: &Pool, table: &str, name: &str) -> Result<(), sqlx::Error> {
    let mut tx = pool.begin().await?;
    // Detaching locks the parent table; waiting long would stall claims and creates
    // queued behind us. Better to try again at the next round.
    crate::db::query("SET LOCAL lock_timeout = '1s'").execute(&mut *tx).await?;
    crate::db::query(AssertSqlSafe(format!("LOCK TABLE {name} IN ACCESS EXCLUSIVE MODE"))).execute(&mut *tx).await?;
    if table == "tasks" && placement::holds_unfinished(&mut tx, name).await? {
        tracing::info!(partition = name, "partition is past retention but holds unfinished tasks; keeping it");
        return Ok(());
    }
    crate::db::query(AssertSqlSafe(format!("ALTER TABLE {table} DETACH PARTITION {name}"))).execute(&mut *tx).await?;
    crate::db::query(AssertSqlSafe(format!("ALTER TABLE {name} RENAME TO {RETIRED_PREFIX}{name}"))).execute(&mut *tx).await?;
    tx.commit().await
}

/// Finishes retiring detached partitions: removes the idempotency keys and audited events
/// (`task_events`) of their tasks, in batches, then drops them. Picks up where a leader that died left off.
async fn drop_detached(pool: &Pool) -> Result<Vec<String>, sqlx::Error> {
    let detached: Vec<String> = crate::db::query_scalar(
        "SELECT relname::text FROM pg_class WHERE relkind = 'r' AND relname LIKE $1 || '%' AND relnamespace = current_schema()::regnamespace",
    )
    .bind(RETIRED_PREFIX)
    .fetch_all(pool)
    .await?;
    let mut dropped = Vec::new();
    for name in detached {
        if name.starts_with(&format!("{RETIRED_PREFIX}tasks_")) {
            let mut after = uuid::Uuid::nil();
            while let Some(last) = placement::forget(pool, &name, after, KEY_BATCH).await? {
                after = last;
            }
        }
        crate::db::query(AssertSqlSafe(format!("DROP TABLE {name}"))).execute(pool).await?;
        let original = name.trim_start_matches(RETIRED_PREFIX).to_string();
        tracing::info!(partition = %original, "dropped partition past retention");
        dropped.push(original);
    }
    Ok(dropped)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> DateTime<Utc> {
        s.parse().unwrap()
    }

    fn part(from: &str, to: &str) -> Partition {
        Partition { name: String::new(), from: at(from), to: at(to) }
    }

    #[test]
    fn fills_whole_slots_from_the_aligned_start() {
        let layout = Layout::default();
        let got = missing_ranges(&layout, &[], at("2026-11-21T13:00:00Z"), at("2026-11-23T00:00:00Z"));
        assert_eq!(got, vec![(at("2026-11-21T00:00:00Z"), at("2026-11-22T00:00:00Z")), (at("2026-11-22T00:00:00Z"), at("2026-11-23T00:00:00Z")),]);
    }

    #[test]
    fn skips_existing_partitions_and_fills_around_a_changed_width() {
        // Daily partitions existed; the width is now 6 hours.
        let layout = Layout { width: Duration::hours(6), ..Layout::default() };
        let existing = [part("2026-11-21T00:00:00Z", "2026-11-22T00:00:00Z"), part("2026-11-22T12:00:00Z", "2026-11-23T00:00:00Z")];
        let got = missing_ranges(&layout, &existing, at("2026-11-21T05:00:00Z"), at("2026-11-22T13:00:00Z"));
        assert_eq!(got, vec![(at("2026-11-22T00:00:00Z"), at("2026-11-22T06:00:00Z")), (at("2026-11-22T06:00:00Z"), at("2026-11-22T12:00:00Z")),]);
    }

    #[test]
    fn cuts_a_slot_short_where_an_existing_partition_begins() {
        let layout = Layout::default();
        let existing = [part("2026-11-22T06:00:00Z", "2026-11-23T00:00:00Z")];
        let got = missing_ranges(&layout, &existing, at("2026-11-22T01:00:00Z"), at("2026-11-23T00:00:00Z"));
        assert_eq!(got, vec![(at("2026-11-22T00:00:00Z"), at("2026-11-22T06:00:00Z"))]);
    }

    #[test]
    fn width_must_divide_a_day_or_be_whole_days() {
        assert!(Layout::new(6, 2, 30).is_ok());
        assert!(Layout::new(48, 2, 30).is_ok());
        assert!(Layout::new(5, 2, 30).unwrap_err().contains("CHIME_PARTITION_HOURS"));
        assert!(Layout::new(36, 2, 30).is_err());
    }

    #[test]
    fn names_show_the_start() {
        assert_eq!(partition_name("tasks", at("2026-11-22T00:00:00Z")), "tasks_p20261122");
        assert_eq!(partition_name("attempts", at("2026-11-22T06:00:00Z")), "attempts_p20261122_0600");
    }
}
