//! Creating tasks, one or a thousand at a time, in one statement.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use serde::Deserialize;
use sha2::{Digest, Sha256};
use sqlx::PgPool;
use uuid::Uuid;

use super::{Task, When, validate_key};
use crate::error::Error;

/// A create request as the client sends it (one item of a batch, or a single create).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateTask {
    pub biz_type: String,
    pub key: Option<String>,
    pub run_at: Option<String>,
    pub delay_ms: Option<i64>,
    pub payload: Option<serde_json::Value>,
}

/// A validated create request.
#[derive(Debug, Clone)]
pub struct NewTask {
    pub key: Option<String>,
    pub when: When,
    pub payload: serde_json::Value,
    /// The payload serialized, as sent to the database.
    pub payload_json: String,
    /// SHA-256 of the request as sent, to tell an idempotent repeat from a conflict (empty
    /// without a key).
    pub request_hash: Vec<u8>,
}

impl CreateTask {
    /// Validates the request; `request_hash` is the `request_hash` of the item as sent.
    pub fn validate(self, request_hash: Vec<u8>, now: DateTime<Utc>, max_payload_bytes: usize) -> Result<NewTask, Error> {
        if let Some(key) = &self.key {
            validate_key(key)?;
        }
        let when = When::parse(self.run_at.as_deref(), self.delay_ms, now)?;
        let payload = self.payload.unwrap_or(serde_json::Value::Null);
        let payload_json = payload.to_string();
        check_serialized_payload(&payload, &payload_json, max_payload_bytes)?;
        Ok(NewTask { key: self.key, when, payload, payload_json, request_hash })
    }
}

/// SHA-256 of a create request. serde_json's maps are sorted, so the hash ignores key order
/// and spacing: the same request sent again, however it is formatted, is a repeat.
pub fn request_hash(request: &serde_json::Value) -> Vec<u8> {
    Sha256::digest(serde_json::to_vec(request).unwrap_or_default()).to_vec()
}

/// Refuses a payload over the size limit (413) or one PostgreSQL cannot store as sent (422).
pub fn check_payload(payload: &serde_json::Value, max_payload_bytes: usize) -> Result<(), Error> {
    check_serialized_payload(payload, &payload.to_string(), max_payload_bytes)
}

fn check_serialized_payload(payload: &serde_json::Value, serialized: &str, max_payload_bytes: usize) -> Result<(), Error> {
    if serialized.len() > max_payload_bytes {
        return Err(too_large(serialized.len(), max_payload_bytes));
    }
    if has_nul(payload) {
        return Err(Error::invalid("payload", "must not contain the character U+0000, which PostgreSQL cannot store"));
    }
    if let Some(n) = number_out_of_range(payload) {
        let shown: String = n.to_string().chars().take(40).collect();
        return Err(Error::invalid(
            "payload",
            format!(
                "the number {shown} is out of range: a number may have an exponent of at most ±308 \
                 and at most 16383 digits after the point; send it as a string"
            ),
        ));
    }
    Ok(())
}

/// The first number in the payload that PostgreSQL would not keep at about the size it was
/// sent. jsonb stores numbers as `numeric` and prints them without an exponent, so
/// `1e100000` (8 bytes) would come back as 100001 digits, slipping past the payload size
/// limit; past numeric's range (16383 digits after the point) it is not stored at all but
/// fails the statement (a 500, and in a batch for every item). An exponent within a
/// double's (±308) bounds both. serde_json's `arbitrary_precision` keeps each number's
/// text as sent.
fn number_out_of_range(value: &serde_json::Value) -> Option<&serde_json::Number> {
    use serde_json::Value;
    match value {
        Value::Number(n) => {
            let text = n.to_string();
            let (mantissa, exponent) = text.split_once(['e', 'E']).unwrap_or((&text, "0"));
            let decimals = mantissa.split_once('.').map_or(0, |(_, d)| d.len() as i64);
            let in_range = exponent.parse::<i64>().is_ok_and(|e| e.abs() <= 308 && decimals - e <= 16_383);
            (!in_range).then_some(n)
        }
        Value::Array(items) => items.iter().find_map(number_out_of_range),
        Value::Object(map) => map.values().find_map(number_out_of_range),
        _ => None,
    }
}

fn has_nul(value: &serde_json::Value) -> bool {
    use serde_json::Value;
    match value {
        Value::String(s) => s.contains('\0'),
        Value::Array(items) => items.iter().any(has_nul),
        Value::Object(map) => map.iter().any(|(k, v)| k.contains('\0') || has_nul(v)),
        _ => false,
    }
}

fn too_large(size: usize, max_payload_bytes: usize) -> Error {
    Error::TooLarge(format!("payload is {size} bytes; the limit is {max_payload_bytes}"))
}

#[derive(Debug)]
pub enum CreateOutcome {
    /// A new task (201).
    Created(Task),
    /// The same request was made before under this key (200).
    Existing(Task),
    Failed(Error),
}

/// Inserts the tasks of one biz type in one statement (plus one more only when a key was
/// already taken), returning one outcome per input, in order. The created tasks' payloads
/// are moved out of `items` into the outcomes; on an error, `items` are as they were.
pub async fn create_batch(pool: &PgPool, biz_type_id: i32, biz_type: &str, items: &mut [NewTask]) -> Result<Vec<CreateOutcome>, Error> {
    // A key repeated inside the batch is answered from its first occurrence.
    let mut first_with_key: HashMap<&str, usize> = HashMap::new();
    let mut repeat_of: Vec<Option<usize>> = vec![None; items.len()];
    for (i, item) in items.iter().enumerate() {
        if let Some(key) = &item.key {
            match first_with_key.get(key.as_str()) {
                Some(&first) => repeat_of[i] = Some(first),
                None => {
                    first_with_key.insert(key, i);
                }
            }
        }
    }

    let mut ids = Vec::new();
    let (mut keys, mut run_ats, mut delays, mut payloads, mut hashes) = (vec![], vec![], vec![], vec![], vec![]);
    let mut id_of_item: Vec<Uuid> = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let id = Uuid::now_v7();
        id_of_item.push(id);
        if repeat_of[i].is_some() {
            continue;
        }
        let (run_at, delay) = item.when.binds();
        ids.push(id);
        keys.push(item.key.clone());
        run_ats.push(run_at);
        delays.push(delay);
        payloads.push(item.payload_json.as_str());
        hashes.push(item.request_hash.clone());
    }

    // Keys are claimed in `task_keys` first; an item whose key was already taken is not
    // inserted (ON CONFLICT DO NOTHING) and is answered below. Each task goes to the hot
    // partitions or to cold storage by the horizon read in this same statement.
    let created: Vec<Task> = sqlx::query_as(
        "WITH input AS (
             SELECT i.id, i.key, coalesce(i.run_at, now() + i.delay_ms * interval '1 millisecond') AS run_at,
                    i.payload::jsonb AS payload, i.request_hash
               FROM unnest($2::uuid[], $3::text[], $4::timestamptz[], $5::bigint[], $6::text[], $7::bytea[])
                    AS i(id, key, run_at, delay_ms, payload, request_hash)
         ), taken AS (
             INSERT INTO task_keys (biz_type_id, key, task_id, request_hash)
             SELECT $1, key, id, request_hash FROM input WHERE key IS NOT NULL
             ON CONFLICT DO NOTHING
             RETURNING task_id
         ), fresh AS (
             SELECT * FROM input WHERE key IS NULL OR id IN (SELECT task_id FROM taken)
         ), hot AS (
             INSERT INTO tasks (id, biz_type_id, key, run_at, payload)
             SELECT id, $1, key, run_at, payload FROM fresh
              WHERE run_at < (SELECT until FROM hot_horizon)
             RETURNING id, key, run_at, status, attempt_count, timer_id, last_error, created_at, updated_at, finished_at
         ), cold AS (
             INSERT INTO tasks_cold (id, biz_type_id, key, run_at, payload)
             SELECT id, $1, key, run_at, payload FROM fresh
              WHERE run_at >= (SELECT until FROM hot_horizon)
             RETURNING id, key, run_at, status, attempt_count, timer_id, last_error, created_at, updated_at, finished_at
         ), wake AS (
             -- Engines sleep until the next due task, at most the engine's IDLE_POLL (1 s); one due
             -- sooner must wake them (delivered on commit, on every node).
             SELECT pg_notify('chime_wake', '') FROM fresh
              WHERE run_at <= now() + interval '1 second' LIMIT 1
         )
         -- The payloads are not sent back: the caller has them. The join only makes the
         -- `wake` CTE run: an unreferenced CTE is not evaluated, and a LEFT JOIN to it
         -- would be removed by the planner (it adds no column and at most one row).
         SELECT t.id, $1 AS biz_type_id, $8::text AS biz_type, t.key, t.run_at, 'null'::jsonb AS payload, t.status,
                t.attempt_count, t.timer_id, t.last_error, t.created_at, t.updated_at, t.finished_at
           FROM (SELECT * FROM hot UNION ALL SELECT * FROM cold) t
           CROSS JOIN (SELECT count(*) FROM wake) w",
    )
    .bind(biz_type_id)
    .bind(&ids)
    .bind(&keys)
    .bind(&run_ats)
    .bind(&delays)
    .bind(&payloads)
    .bind(&hashes)
    .bind(biz_type)
    .fetch_all(pool)
    .await?;

    let mut created: HashMap<Uuid, Task> = created.into_iter().map(|t| (t.id, t)).collect();
    let taken_keys: Vec<String> = items
        .iter()
        .zip(&id_of_item)
        .enumerate()
        .filter(|(i, (item, id))| repeat_of[*i].is_none() && item.key.is_some() && !created.contains_key(*id))
        .filter_map(|(_, (item, _))| item.key.clone())
        .collect();
    let existing = existing_by_key(pool, biz_type_id, &taken_keys).await?;

    let mut outcomes: Vec<CreateOutcome> = Vec::with_capacity(items.len());
    for i in 0..items.len() {
        // A repeated key is held by the task its first occurrence created in this batch, or
        // else by the task found in `existing` (which a later item may repeat exactly even
        // when the first occurrence conflicted with it).
        let outcome = if let Some(first) = repeat_of[i]
            && let CreateOutcome::Created(t) = &outcomes[first]
        {
            if items[first].request_hash == items[i].request_hash {
                CreateOutcome::Existing(t.clone())
            } else {
                CreateOutcome::Failed(key_conflict(&items[i]))
            }
        } else if let Some(mut task) = created.remove(&id_of_item[i]) {
            task.payload = std::mem::take(&mut items[i].payload);
            CreateOutcome::Created(task)
        } else {
            let item = &items[i];
            match item.key.as_deref().and_then(|k| existing.get(k)) {
                Some((hash, task)) if *hash == item.request_hash => CreateOutcome::Existing(task.clone()),
                _ => CreateOutcome::Failed(key_conflict(item)),
            }
        };
        outcomes.push(outcome);
    }
    Ok(outcomes)
}

fn key_conflict(item: &NewTask) -> Error {
    Error::Conflict(format!(
        "key `{}` is already used by a task created with a different request",
        item.key.as_deref().unwrap_or_default()
    ))
}

/// The tasks holding these keys, with the hash of the request that created each.
async fn existing_by_key(pool: &PgPool, biz_type_id: i32, keys: &[String]) -> Result<HashMap<String, (Vec<u8>, Task)>, Error> {
    if keys.is_empty() {
        return Ok(HashMap::new());
    }
    #[derive(sqlx::FromRow)]
    struct Row {
        request_hash: Vec<u8>,
        #[sqlx(flatten)]
        task: Task,
    }
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT k.request_hash, t.*, b.name AS biz_type
           FROM task_keys k
           JOIN all_tasks t ON t.id = k.task_id
           JOIN biz_types b ON b.id = t.biz_type_id
          WHERE k.biz_type_id = $1 AND k.key = ANY($2)",
    )
    .bind(biz_type_id)
    .bind(keys)
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .filter_map(|r| Some((r.task.key.clone()?, (r.request_hash, r.task))))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payload_numbers_are_refused_beyond_a_doubles_exponent() {
        let check = |n: &str| check_payload(&serde_json::from_str(&format!("[{{\"n\": {n}}}]")).unwrap(), 65536);
        for ok in ["0", "-0", "1e308", "-1.7976931348623157E+308", "1e-308", "0.5e-308", "123456789012345678901234567890"] {
            assert!(check(ok).is_ok(), "{ok}");
        }
        for bad in ["1e309", "1e-309", "1e131072", "0e-999999", "1e99999999999999999999"] {
            assert!(matches!(check(bad), Err(Error::Invalid { field, .. }) if field == "payload"), "{bad}");
        }
    }
}
