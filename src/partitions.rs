//! Partitions of `tasks` and `attempts`, one per UTC day, and the hot horizon.
//!
//! For now every node does the simple duty at start and every few minutes: make sure the
//! partitions for yesterday through `hot_days` ahead exist, move the horizon to the end of
//! them, and bring into the hot partitions the cold tasks that now fall before it. It is
//! safe on many nodes at once (an advisory lock serialises it). The leader's partition
//! manager (retention, batched cold-to-hot moves) will take it over.

use chrono::{Days, NaiveDate};
use sqlx::{AssertSqlSafe, PgPool};

/// Serialises partition DDL between nodes starting together.
const PARTITION_LOCK: i64 = 0x6368_696d_6570; // "chimep"

pub fn partition_name(table: &str, day: NaiveDate) -> String {
    format!("{table}_p{}", day.format("%Y%m%d"))
}

/// Runs `ensure` every few minutes, for a node that runs across midnight.
pub async fn keep_ahead(pool: PgPool, hot_days: u32) {
    let mut every = tokio::time::interval(std::time::Duration::from_secs(300));
    every.tick().await;
    loop {
        every.tick().await;
        if let Err(e) = ensure(&pool, hot_days).await {
            tracing::warn!(error = %e, "could not prepare partitions; will retry in 5 minutes");
        }
    }
}

pub async fn ensure(pool: &PgPool, hot_days: u32) -> Result<(), sqlx::Error> {
    let mut tx = pool.begin().await?;
    sqlx::query("SELECT pg_advisory_xact_lock($1)").bind(PARTITION_LOCK).execute(&mut *tx).await?;
    let today: NaiveDate = sqlx::query_scalar("SELECT (now() AT TIME ZONE 'UTC')::date").fetch_one(&mut *tx).await?;
    let first = today - Days::new(1);
    let end = today + Days::new(u64::from(hot_days) + 1);
    let mut day = first;
    while day < end {
        let next = day + Days::new(1);
        for table in ["tasks", "attempts"] {
            // DDL takes no bind parameters; the values are dates we formatted ourselves.
            sqlx::query(AssertSqlSafe(format!(
                "CREATE TABLE IF NOT EXISTS {} PARTITION OF {table} FOR VALUES FROM ('{day} 00:00:00+00') TO ('{next} 00:00:00+00')",
                partition_name(table, day)
            )))
            .execute(&mut *tx)
            .await?;
        }
        day = next;
    }
    let until = format!("{end} 00:00:00+00");
    sqlx::query("UPDATE hot_horizon SET until = greatest(until, $1::timestamptz)")
        .bind(&until)
        .execute(&mut *tx)
        .await?;
    let moved = sqlx::query(
        "WITH moved AS (DELETE FROM tasks_cold WHERE run_at < (SELECT until FROM hot_horizon) RETURNING *)
         INSERT INTO tasks SELECT * FROM moved",
    )
    .execute(&mut *tx)
    .await?
    .rows_affected();
    tx.commit().await?;
    tracing::debug!(from = %first, until = %end, moved_from_cold = moved, "partitions ready");
    Ok(())
}
