//! What the bench and the soak (`chime-bench`) write and read on task rows, beside the REST
//! API they drive: clearing a scenario's tasks, waiting for them to succeed, their fire
//! times, a backlog written straight into the table, and the soak's final reckoning.
//! Nothing in the server calls these: they are here because the task store owns every
//! statement on `tasks`, so that a change to the table finds them.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use sqlx::AssertSqlSafe;
use uuid::Uuid;

use crate::db::{self, Pool};

/// Deletes every task of a biz type (the bench's create scenarios, between runs). Locks the
/// rows it deletes: they are due an hour ahead, so no engine holds or wants them.
pub async fn delete_all(pool: &Pool, biz_type_id: i32) -> Result<u64, sqlx::Error> {
    // Hot tasks only: the create scenarios' tasks are due well before the hot horizon.
    let done = db::query("DELETE FROM tasks WHERE biz_type_id = $1").bind(biz_type_id).execute(pool).await?;
    db::query("DELETE FROM task_keys WHERE biz_type_id = $1").bind(biz_type_id).execute(pool).await?;
    Ok(done.rows_affected())
}

/// How many tasks of a biz type due at or after `since` have succeeded, and when the last
/// of them finished.
pub async fn succeeded(pool: &Pool, biz_type_id: i32, since: DateTime<Utc>) -> Result<(i64, Option<DateTime<Utc>>), sqlx::Error> {
    // A plain read (no row locks): the bench polls it while the engines deliver. `since`
    // prunes the partitions before it, and the state lets tasks_finished_list_idx serve:
    // without them each poll read every retained partition whole (0.6 s a poll in the
    // scale scenario, beside the burst it measured).
    db::query_as("SELECT count(*), max(finished_at) FROM tasks WHERE biz_type_id = $1 AND status = 'succeeded' AND run_at >= $2")
        .bind(biz_type_id)
        .bind(since)
        .fetch_one(pool)
        .await
}

/// One callback as chime recorded it (a row of `attempts`).
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct AttemptTime {
    pub task_id: Uuid,
    /// When the task was due.
    pub run_at: DateTime<Utc>,
    pub started_at: DateTime<Utc>,
    /// 1 for the task's first attempt.
    pub number: i32,
    /// The receiver answered 2xx.
    pub succeeded: bool,
}

/// A biz type's callbacks as chime recorded them, in start order: the bench's lateness when
/// the callbacks go to a receiver it cannot see.
pub async fn attempt_times(pool: &Pool, biz_type_id: i32) -> Result<Vec<AttemptTime>, sqlx::Error> {
    db::query_as(
        "SELECT a.task_id, t.run_at, a.started_at, a.number, coalesce(a.status_code BETWEEN 200 AND 299, false) AS succeeded
           FROM attempts a JOIN tasks t ON t.id = a.task_id
          WHERE a.biz_type_id = $1 ORDER BY a.started_at",
    )
    .bind(biz_type_id)
    .fetch_all(pool)
    .await
}

/// Backlog rows as years of use would leave them, written straight into `tasks` (or
/// `tasks_cold`) without the API: row `i` is due at `from + i * step_us` microseconds.
#[derive(Debug, Clone)]
pub struct Backlog<'a> {
    pub biz_type_id: i32,
    pub from: DateTime<Utc>,
    pub step_us: f64,
    /// Each row's payload, JSON text.
    pub payload: &'a str,
    /// Written as succeeded a second after it was due, else pending.
    pub finished: bool,
    /// Into `tasks_cold`: every `run_at` is at or after the hot horizon.
    pub cold: bool,
    /// Every row's flow key, if any.
    pub flow_key: Option<&'a str>,
}

/// Writes backlog rows `first .. first + count` in one statement.
pub async fn insert_backlog(pool: &Pool, backlog: &Backlog<'_>, first: u64, count: u64) -> Result<u64, sqlx::Error> {
    // The caller keeps every `run_at` below the hot horizon (`partitions::horizon`) for `tasks`, at or
    // after it for `tasks_cold`, so each row is where the layout puts it. New rows: no lock
    // that a claim waits on, but one statement of up to a million rows holds its
    // transaction (and the WAL) until it is done. Ids are UUIDv7 of the moment they are
    // written, as `tasks::create` makes them (Uuid::now_v7): a random id would land on a
    // random leaf of the primary key, and a load of millions would rewrite the whole index.
    let table = if backlog.cold { "tasks_cold" } else { "tasks" };
    let done = db::query(AssertSqlSafe(format!(
        "INSERT INTO {table} (id, biz_type_id, run_at, first_run_at, payload, status, attempt_count, finished_at, flow_key)
         SELECT (lpad(to_hex(((extract(epoch FROM clock_timestamp()) * 1000)::int8 << 16) | x'7000'::int8
                             | (random() * 4095)::int8), 16, '0')
                 || substr(replace(gen_random_uuid()::text, '-', ''), 17))::uuid,
                $1, r.at, r.at, $5::jsonb,
                CASE WHEN $6 THEN 'succeeded' ELSE 'pending' END, CASE WHEN $6 THEN 1 ELSE 0 END,
                CASE WHEN $6 THEN r.at + interval '1 second' END, $8::text
           FROM generate_series($2::bigint, $2 + $3 - 1) i,
                LATERAL (SELECT $4::timestamptz + (i * $7::float8) * interval '1 microsecond' AS at) r"
    )))
    .bind(backlog.biz_type_id)
    .bind(first as i64)
    .bind(count as i64)
    .bind(backlog.from)
    .bind(backlog.payload)
    .bind(backlog.finished)
    .bind(backlog.step_us)
    .bind(backlog.flow_key)
    .execute(pool)
    .await?;
    Ok(done.rows_affected())
}

/// Updates the planner's statistics and the visibility map of both homes of a task after a
/// large load, as autovacuum would have over the months it stands for (a load of tens of
/// millions of rows otherwise sets off autovacuum on `tasks_cold` in the middle of the
/// measurements that follow).
pub async fn vacuum_loaded(pool: &Pool) -> Result<(), sqlx::Error> {
    // VACUUM cannot run in a transaction block: the bench's pool (`db::connect`) goes straight
    // to PostgreSQL, where a statement on the pool runs outside one. It takes SHARE UPDATE
    // EXCLUSIVE on each table and partition: the nodes' reads and writes go on.
    db::query("VACUUM ANALYZE tasks, tasks_cold").execute(pool).await?;
    Ok(())
}

/// Bytes on disk: the whole database, `tasks` (every partition, with indexes and TOAST),
/// `tasks_cold` (the same), and how many partitions `tasks` has.
#[derive(Debug, Clone, Copy, sqlx::FromRow)]
pub struct Sizes {
    pub database: i64,
    pub hot: i64,
    pub cold: i64,
    pub partitions: i64,
}

/// The sizes as PostgreSQL counts them now (reads the catalog and the files' sizes; no lock).
pub async fn sizes(pool: &Pool) -> Result<Sizes, sqlx::Error> {
    db::query_as(
        "SELECT pg_database_size(current_database())::int8 AS database,
                (SELECT coalesce(sum(pg_total_relation_size(relid)), 0) FROM pg_partition_tree('tasks'))::int8 AS hot,
                pg_total_relation_size('tasks_cold')::int8 AS cold,
                (SELECT count(*) FROM pg_partition_tree('tasks') WHERE isleaf)::int8 AS partitions",
    )
    .fetch_one(pool)
    .await
}

/// The soak's timer fire times never written: for each timer of the biz type, every whole
/// second after its creation up to `end` that has no occurrence (hot or cold).
pub async fn unwritten_fire_times(pool: &Pool, biz_type: &str, end: DateTime<Utc>) -> Result<i64, sqlx::Error> {
    db::query_scalar(
        "SELECT coalesce(sum(extract(epoch FROM date_trunc('second', $2::timestamptz) - date_trunc('second', t.created_at))::int8
                             - (SELECT count(DISTINCT o.run_at) FROM all_tasks o
                                 WHERE o.timer_id = t.id AND o.run_at > t.created_at AND o.run_at <= $2)), 0)::int8
           FROM timers t JOIN biz_types b ON b.id = t.biz_type_id WHERE b.name = $1",
    )
    .bind(biz_type)
    .bind(end)
    .fetch_one(pool)
    .await
}

/// The ids of a biz type's tasks (hot or cold) due at or before `until`.
pub async fn due_ids(pool: &Pool, biz_type: &str, until: DateTime<Utc>) -> Result<Vec<Uuid>, sqlx::Error> {
    db::query_scalar("SELECT t.id FROM all_tasks t JOIN biz_types b ON b.id = t.biz_type_id WHERE b.name = $1 AND t.run_at <= $2")
        .bind(biz_type)
        .bind(until)
        .fetch_all(pool)
        .await
}

/// How many tasks (hot or cold) of the biz types whose names start with `prefix` are in
/// each status.
pub async fn statuses(pool: &Pool, prefix: &str) -> Result<BTreeMap<String, i64>, sqlx::Error> {
    let rows: Vec<(String, i64)> = db::query_as(
        "SELECT t.status, count(*) FROM all_tasks t JOIN biz_types b ON b.id = t.biz_type_id
          WHERE starts_with(b.name, $1) GROUP BY 1",
    )
    .bind(prefix)
    .fetch_all(pool)
    .await?;
    Ok(rows.into_iter().collect())
}
