//! Timer occurrences written as tasks, many timers in one statement (the leader's
//! `timers::materialize_due`).

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use uuid::Uuid;

/// Occurrences for `insert_occurrences`, column by column, as the statement takes them.
#[derive(Default)]
pub struct Occurrences {
    timer_ids: Vec<Uuid>,
    biz_type_ids: Vec<i32>,
    ids: Vec<Uuid>,
    keys: Vec<String>,
    run_ats: Vec<DateTime<Utc>>,
    request_hashes: Vec<Vec<u8>>,
}

impl Occurrences {
    pub fn push(&mut self, timer_id: Uuid, biz_type_id: i32, key: String, run_at: DateTime<Utc>, request_hash: Vec<u8>) {
        self.timer_ids.push(timer_id);
        self.biz_type_ids.push(biz_type_id);
        self.ids.push(super::ids::new(biz_type_id));
        self.keys.push(key);
        self.run_ats.push(run_at);
        self.request_hashes.push(request_hash);
    }

    pub fn len(&self) -> usize {
        self.ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }
}

/// Inserts the occurrences, each with its timer's payload, in one statement
/// (`sql/insert_occurrences.sql`); an occurrence whose key is taken is skipped. The caller
/// holds the timers' rows locked. Returns how many were written per timer.
pub async fn insert_occurrences<'e>(db: impl sqlx::PgExecutor<'e>, rows: &Occurrences) -> Result<HashMap<Uuid, i64>, sqlx::Error> {
    if rows.is_empty() {
        return Ok(HashMap::new());
    }
    let written: Vec<(Uuid, i64)> = crate::db::query_as(include_str!("sql/insert_occurrences.sql"))
        .bind(&rows.timer_ids)
        .bind(&rows.biz_type_ids)
        .bind(&rows.ids)
        .bind(&rows.keys)
        .bind(&rows.run_ats)
        .bind(&rows.request_hashes)
        .bind(crate::wake::CHANNEL)
        .fetch_all(db)
        .await?;
    Ok(written.into_iter().collect())
}
