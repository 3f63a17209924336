//! Creating tasks, one or a thousand at a time, in one statement.

use std::collections::HashMap;

use crate::db::Pool;
use chrono::{DateTime, Utc};
use serde::Deserialize;
use serde_json::value::RawValue;
use sha2::{Digest, Sha256};
use uuid::Uuid;

use super::replace::OnConflict;
use super::{Deadline, Task, When, check_payload, validate_key};
use crate::error::Error;

/// A create request as the client sends it (one item of a batch, or a single create), its
/// payload borrowed from the request's text.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(description = "A request to schedule one callback. Give at most one of `run_at` and `delay_ms`; with neither, the task is due now.", example = json!({"biz_type": "order-close", "key": "order-123", "delay_ms": 1800000, "payload": {"order_id": 123}}))]
pub struct CreateTask<'a> {
    /// The biz type to create the task in; must be the one the token belongs to.
    pub biz_type: String,
    /// Optional client key (idempotency key), unique within the biz type: 1 to 256 bytes of
    /// UTF-8 without control characters. The same key with the same request again answers 200
    /// with the existing task; with a different request, 409. A key stays taken as long as its
    /// task is retained. null is the same as leaving it out.
    #[schema(min_length = 1, max_length = 256, pattern = r"^[^\u0000-\u001f\u007f-\u009f]+$")]
    pub key: Option<String>,
    /// Absolute due time, RFC 3339 (e.g. `2026-11-21T09:30:00Z` or `2026-11-21T17:30:00+08:00`),
    /// from 24 hours ago to 10 years ahead. null is the same as leaving it out.
    #[schema(format = DateTime)]
    pub run_at: Option<String>,
    /// Due this many milliseconds after the server accepts the request (0 to 10 years), on
    /// the server's clock. null is the same as leaving it out.
    #[schema(minimum = 0, maximum = 316_224_000_000_i64)]
    pub delay_ms: Option<i64>,
    /// Any JSON value, stored as is and sent back in the callback body; null by default. At
    /// most the server's payload limit (default 64 KiB) as PostgreSQL stores it, numbers
    /// written out in full (413 beyond); numbers with an exponent of at most ±308 and strings
    /// without U+0000 (422 otherwise).
    #[serde(borrow)]
    #[schema(value_type = serde_json::Value, required = false)]
    pub payload: Option<&'a RawValue>,
    /// Deadline, RFC 3339: no callback starts at or after it; a task not delivered by then
    /// (held back by a pause, a backlog, a rate limit or waiting for a retry) ends
    /// `expired`. After the due time, at most 10 years after it. null: no deadline.
    #[schema(format = DateTime)]
    pub expires_at: Option<String>,
    /// Deadline as milliseconds after the due time (1 to 10 years), instead of `expires_at`.
    #[schema(minimum = 1, maximum = 316_224_000_000_i64)]
    pub ttl_ms: Option<i64>,
    /// What to do when `key` is already taken. `reject` (default): the same request again
    /// answers 200 with the task, a different one 409 `key_conflict`. `replace`: a pending
    /// task takes this request's time, payload and deadline (200); a running one answers 409
    /// `task_running`; a finished, cancelled or expired one keeps its history and a new task
    /// takes the key (201). `keep`: the key's task as it is (200), whatever the body. Not part
    /// of the request compared to tell a repeat: the same request sent with another
    /// `on_conflict` is a repeat. null is the same as leaving it out.
    pub on_conflict: Option<OnConflict>,
    /// 0 to 9, 9 the most urgent; 5 by default. Of a biz type's due tasks, those of higher
    /// priority are called back first; a tenth of its deliveries still go to its
    /// longest-due tasks whatever their priority, so none waits for ever. null is the same
    /// as leaving it out.
    #[schema(minimum = 0, maximum = 9)]
    pub priority: Option<i64>,
    /// What the task is for inside its biz type (a merchant, a user, a destination), by the
    /// same rules as `key`. The biz type's `flow_max_in_flight` caps how many tasks of one
    /// flow key are in flight at once, and with `ordered` a flow key's tasks are delivered
    /// one at a time in run_at order; a key at its limit waits without holding back the
    /// others. null: none (no per-key limit applies). A replace keeps the task's flow key.
    #[schema(min_length = 1, max_length = 256, pattern = r"^[^\u0000-\u001f\u007f-\u009f]+$")]
    pub flow_key: Option<String>,
}

/// A validated create request.
#[derive(Debug, Clone)]
pub struct NewTask {
    pub key: Option<String>,
    pub when: When,
    /// As sent: raw JSON text, which the database parses. A value tree would cost 10 to 40
    /// times the text (a maximal batch of small numbers: +1 GB).
    pub payload: Box<RawValue>,
    /// SHA-256 of the request as sent, to tell an idempotent repeat from a conflict (empty
    /// without a key).
    pub request_hash: Vec<u8>,
    pub deadline: Option<Deadline>,
    /// The W3C `traceparent` the create request carried, if well-formed.
    pub traceparent: Option<String>,
    /// What to do when the key is taken.
    pub on_conflict: OnConflict,
    pub priority: i16,
    pub flow_key: Option<String>,
}

impl CreateTask<'_> {
    /// Validates the request; `request_hash` is the `request_hash` of the item as sent.
    pub fn validate(self, request_hash: Vec<u8>, now: DateTime<Utc>, max_payload_bytes: usize) -> Result<NewTask, Error> {
        if let Some(key) = &self.key {
            validate_key(key)?;
        }
        if let Some(flow_key) = &self.flow_key {
            super::validate_flow_key(flow_key)?;
        }
        let when = When::parse(self.run_at.as_deref(), self.delay_ms, now)?;
        let deadline = Deadline::parse(self.expires_at.as_deref(), self.ttl_ms, when, now)?;
        let payload = self.payload.unwrap_or(RawValue::NULL);
        check_payload(payload, max_payload_bytes)?;
        let on_conflict = self.on_conflict.unwrap_or_default();
        let priority = self.priority.map_or(Ok(super::DEFAULT_PRIORITY), super::validate_priority)?;
        Ok(NewTask {
            key: self.key,
            when,
            payload: payload.to_owned(),
            request_hash,
            deadline,
            traceparent: None,
            on_conflict,
            priority,
            flow_key: self.flow_key,
        })
    }
}

/// SHA-256 of a create request. It is hashed as serde_json's value, whose maps are sorted, so
/// the hash ignores key order and spacing: the same request sent again, however it is
/// formatted, is a repeat. `on_conflict` is left out: it says what to do about another
/// request, and is no part of this one (a request sent again with `reject` after it replaced
/// the task is a repeat). The value lives only while it is hashed, one request at a time.
pub fn request_hash(request: &RawValue) -> Vec<u8> {
    let mut value: serde_json::Value = serde_json::from_str(request.get()).unwrap_or_default();
    if let Some(fields) = value.as_object_mut() {
        fields.remove("on_conflict");
    }
    Sha256::digest(serde_json::to_vec(&value).unwrap_or_default()).to_vec()
}

/// New tasks for `insert`, column by column, as the statement takes them.
#[derive(Default)]
pub struct Rows<'a> {
    ids: Vec<Uuid>,
    keys: Vec<Option<String>>,
    run_ats: Vec<Option<DateTime<Utc>>>,
    delays: Vec<Option<i64>>,
    /// JSON text, parsed by the database.
    payloads: Vec<&'a str>,
    request_hashes: Vec<Vec<u8>>,
    expires_ats: Vec<Option<DateTime<Utc>>>,
    ttls: Vec<Option<i64>>,
    traceparents: Vec<Option<&'a str>>,
    priorities: Vec<i16>,
    flow_keys: Vec<Option<&'a str>>,
}

impl<'a> Rows<'a> {
    pub fn push(&mut self, id: Uuid, key: Option<String>, when: When, payload: &'a str, request_hash: Vec<u8>) {
        let (run_at, delay) = when.binds();
        self.ids.push(id);
        self.keys.push(key);
        self.run_ats.push(run_at);
        self.delays.push(delay);
        self.payloads.push(payload);
        self.request_hashes.push(request_hash);
        self.expires_ats.push(None);
        self.ttls.push(None);
        self.traceparents.push(None);
        self.priorities.push(super::DEFAULT_PRIORITY);
        self.flow_keys.push(None);
    }

    /// A client's task: `push` with its deadline and trace context.
    pub fn push_new(&mut self, id: Uuid, task: &'a NewTask) {
        self.push(id, task.key.clone(), task.when, task.payload.get(), task.request_hash.clone());
        let (expires_at, ttl) = task.deadline.map(Deadline::binds).unwrap_or_default();
        *self.expires_ats.last_mut().expect("pushed") = expires_at;
        *self.ttls.last_mut().expect("pushed") = ttl;
        *self.traceparents.last_mut().expect("pushed") = task.traceparent.as_deref();
        *self.priorities.last_mut().expect("pushed") = task.priority;
        *self.flow_keys.last_mut().expect("pushed") = task.flow_key.as_deref();
    }
}

/// What the database decided about a task `insert` made; the rest is what the caller gave.
#[derive(Debug, Clone, Copy)]
pub struct Inserted {
    pub id: Uuid,
    pub run_at: DateTime<Utc>,
    pub expires_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
}

impl Inserted {
    /// The new task, made by a client's create (no timer's): pending, never tried, made of
    /// `item` (whose payload it takes).
    pub fn task(self, biz_type_id: i32, biz_type: &str, item: &mut NewTask) -> Task {
        Task {
            id: self.id,
            biz_type_id,
            biz_type: biz_type.to_string(),
            key: item.key.clone(),
            run_at: self.run_at,
            payload: std::mem::take(&mut item.payload),
            status: super::Status::Pending,
            attempt_count: 0,
            timer_id: None,
            last_error: None,
            created_at: self.created_at,
            updated_at: self.created_at,
            finished_at: None,
            expires_at: self.expires_at,
            traceparent: item.traceparent.clone(),
            priority: item.priority,
            flow_key: item.flow_key.clone(),
        }
    }
}

/// A row of `sql/insert.sql`'s answer: id, run_at, expires_at, created_at.
type InsertedRow = (Uuid, DateTime<Utc>, Option<DateTime<Utc>>, DateTime<Utc>);

/// Inserts tasks of one biz type in one statement (`sql/insert.sql`): the one way a
/// client's task row is made (a timer's occurrences are written by `insert_occurrences`,
/// which follows it). Returns what the database decided of each task created (the caller
/// has the rest); a row whose key was already taken is not created, and the caller tells a
/// repeat from a conflict.
pub async fn insert<'e>(db: impl sqlx::PgExecutor<'e>, biz_type_id: i32, rows: &Rows<'_>) -> Result<Vec<Inserted>, sqlx::Error> {
    // Columns by position: a row of four decodes in a fraction of the time by name.
    let found: Vec<InsertedRow> = crate::db::query_as(include_str!("sql/insert.sql"))
        .bind(biz_type_id)
        .bind(&rows.ids)
        .bind(&rows.keys)
        .bind(&rows.run_ats)
        .bind(&rows.delays)
        .bind(&rows.payloads)
        .bind(&rows.request_hashes)
        .bind(crate::wake::CHANNEL)
        .bind(&rows.expires_ats)
        .bind(&rows.ttls)
        .bind(&rows.traceparents)
        .bind(&rows.priorities)
        .bind(&rows.flow_keys)
        .fetch_all(db)
        .await?;
    Ok(found.into_iter().map(|(id, run_at, expires_at, created_at)| Inserted { id, run_at, expires_at, created_at }).collect())
}

#[derive(Debug)]
pub enum CreateOutcome {
    /// A new task (201).
    Created(Task),
    /// The same request was made before under this key, or `on_conflict` said `keep` (200).
    Existing(Task),
    /// The key's pending task, changed by an `on_conflict: "replace"` create (200).
    Replaced(Task),
    Failed(Error),
}

/// Inserts the tasks of one biz type in one statement (plus one more only when a key was
/// already taken, and a transaction per `replace` item whose key was), returning one
/// outcome per input, in order. The created tasks' payloads are moved out of `items` into
/// the outcomes; on an error, `items` are as they were.
pub async fn create_batch(pool: &Pool, biz_type_id: i32, biz_type: &str, items: &mut [NewTask]) -> Result<Vec<CreateOutcome>, Error> {
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

    let mut rows = Rows::default();
    let id_of_item: Vec<Uuid> = super::ids::batch(biz_type_id, items.len());
    for (i, item) in items.iter().enumerate() {
        if repeat_of[i].is_none() {
            rows.push_new(id_of_item[i], item);
        }
    }
    let created = insert(pool, biz_type_id, &rows).await?;
    drop(rows);
    let mut created: HashMap<Uuid, Inserted> = created.into_iter().map(|t| (t.id, t)).collect();
    let taken_keys: Vec<String> = items
        .iter()
        .zip(&id_of_item)
        .enumerate()
        .filter(|(i, (item, id))| repeat_of[*i].is_none() && item.key.is_some() && !created.contains_key(*id))
        .filter_map(|(_, (item, _))| item.key.clone())
        .collect();
    let existing = existing_by_key(pool, biz_type_id, &taken_keys).await?;

    let mut outcomes: Vec<CreateOutcome> = Vec::with_capacity(items.len());
    // Items whose key was taken and that say `replace` (or `keep`, when the key's holder went
    // away meanwhile): answered one by one below, in order, after the others. So is every
    // later item of such a key, whatever it says: it must see what the replace did, as if
    // the items had been sent one by one.
    let mut one_by_one: Vec<usize> = Vec::new();
    let mut changed_keys: std::collections::HashSet<String> = std::collections::HashSet::new();
    for i in 0..items.len() {
        if let Some(key) = items[i].key.as_deref()
            && changed_keys.contains(key)
        {
            one_by_one.push(i);
            outcomes.push(CreateOutcome::Failed(key_conflict(&items[i])));
            continue;
        }
        // A repeated key is held by the task its first occurrence created in this batch, or
        // else by the task found in `existing` (which a later item may repeat exactly even
        // when the first occurrence conflicted with it).
        let outcome = if let Some(first) = repeat_of[i]
            && let CreateOutcome::Created(t) = &outcomes[first]
            && items[i].on_conflict != OnConflict::Replace
        {
            if items[first].request_hash == items[i].request_hash || items[i].on_conflict == OnConflict::Keep {
                CreateOutcome::Existing(t.clone())
            } else {
                CreateOutcome::Failed(key_conflict(&items[i]))
            }
        } else if let Some(inserted) = created.remove(&id_of_item[i]) {
            CreateOutcome::Created(inserted.task(biz_type_id, biz_type, &mut items[i]))
        } else {
            let item = &items[i];
            match (item.on_conflict, item.key.as_deref().and_then(|k| existing.get(k))) {
                // A replace applies even to the same request again: a debounce sends the
                // same `delay_ms` each time, to push the task back.
                (OnConflict::Replace, _) | (OnConflict::Keep, None) => {
                    one_by_one.push(i);
                    changed_keys.extend(item.key.clone());
                    CreateOutcome::Failed(key_conflict(item))
                }
                (OnConflict::Keep, Some((_, task))) => CreateOutcome::Existing(task.clone()),
                (OnConflict::Reject, Some((hash, task))) if *hash == item.request_hash => CreateOutcome::Existing(task.clone()),
                (OnConflict::Reject, _) => CreateOutcome::Failed(key_conflict(item)),
            }
        };
        outcomes.push(outcome);
    }
    // The others are written already: an error here is this item's alone (were it the
    // batch's, the batcher would write the others again, one by one).
    for i in one_by_one {
        outcomes[i] = super::replace::create_taken(pool, biz_type_id, biz_type, &mut items[i]).await.unwrap_or_else(CreateOutcome::Failed);
    }
    Ok(outcomes)
}

pub(super) fn key_conflict(item: &NewTask) -> Error {
    Error::key_conflict(format!("key `{}` is already used by a task created with a different request", item.key.as_deref().unwrap_or_default()))
}

/// The tasks holding these keys, with the hash of the request that created each.
async fn existing_by_key(pool: &Pool, biz_type_id: i32, keys: &[String]) -> Result<HashMap<String, (Vec<u8>, Task)>, Error> {
    if keys.is_empty() {
        return Ok(HashMap::new());
    }
    #[derive(sqlx::FromRow)]
    struct Row {
        request_hash: Vec<u8>,
        #[sqlx(flatten)]
        task: Task,
    }
    let rows: Vec<Row> = crate::db::query_as(
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
    Ok(rows.into_iter().filter_map(|r| Some((r.task.key.clone()?, (r.request_hash, r.task)))).collect())
}
