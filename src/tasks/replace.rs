//! A create whose key is taken, when it says what to do about it (`on_conflict`, docs/design/contract.md, Tasks by key):
//! `replace` changes the key's pending task or gives the key to a new task, `keep` answers
//! with the key's task. `reject`, the default, is `create_batch`'s own answer (a repeat or
//! a conflict), but for an item of a batch that follows a `replace` of its key: it is
//! answered here, after the replace, as if sent after it.
//!
//! Each such create is a transaction of its own that takes a lock on the key first (an
//! advisory lock on the biz type and the key's hash, which a key row that is deleted and
//! written again cannot slip out of), so that creates of one key queue up there and each
//! sees what the last one did; then the key's row in `task_keys`, and then the task's row, as a cancel does, so that it cannot be claimed meanwhile: a
//! replace racing with the engine finds the task either pending (and changes it before the
//! claim sees it: the claim skips locked rows) or running (409 `task_running`), never half
//! of each. The fresh path (a key nobody holds) stays `insert`'s one statement.

use serde::Deserialize;
use uuid::Uuid;

use super::Status;
use super::create::{CreateOutcome, NewTask, Rows, insert, key_conflict};
use super::queries::{Requeue, lock, read, requeue};
use crate::db::Pool;
use crate::error::{Conflict, Error};

/// What a create does when its key is already taken.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum OnConflict {
    /// The same request again is a repeat (200), another one a conflict (409 `key_conflict`).
    #[default]
    Reject,
    /// A pending task takes this request's time, payload, deadline and priority; a finished one
    /// leaves the key to a new task (and joins the key's earlier tasks); a running one is a
    /// conflict (409 `task_running`).
    Replace,
    /// The key's task as it is, whatever the request.
    Keep,
}

/// Tries at most this often when the key changes hands between two statements. Replaces
/// and keeps of one key wait for each other on the key's lock, so only a create of a free
/// key (`insert`'s one statement) or the key's task retiring can move it under a try; each
/// try sees a later state. Without the key's lock, 12-way replace races ran out of 3 tries
/// in 1-2 of ~6,500 creates, and the client was told the key conflicted.
const TRIES: usize = 10;

/// Answers a create whose key was taken when `insert` ran (a `replace` or `keep`, or any
/// item of a batch after a `replace` of its key); in a transaction per try. Its payload is moved into the outcome when it becomes a task's.
pub(super) async fn create_taken(pool: &Pool, biz_type_id: i32, biz_type: &str, item: &mut NewTask) -> Result<CreateOutcome, Error> {
    let key = item.key.clone().expect("only a keyed create can find its key taken");
    for _ in 0..TRIES {
        let mut tx = pool.begin().await?;
        // Creates of this key that say what to do about it wait here for each other, until
        // the one before commits. Two-key advisory locks are apart from the one-key locks
        // the leader and the partition keeper take.
        crate::db::query("SELECT pg_advisory_xact_lock($1, hashtext($2))").bind(biz_type_id).bind(&key).execute(&mut *tx).await?;
        // Locks the key's row against a cancel or retirement.
        let row: Option<(Uuid, Vec<u8>)> =
            crate::db::query_as("SELECT task_id, request_hash FROM task_keys WHERE biz_type_id = $1 AND key = $2 FOR UPDATE")
                .bind(biz_type_id)
                .bind(&key)
                .fetch_optional(&mut *tx)
                .await?;
        let (holder, request_hash) = row.unzip();
        let state = match holder {
            None => None,
            Some(id) => match lock(&mut tx, biz_type_id, id).await {
                Ok((status, cold)) => Some((id, status, cold)),
                // A key left behind by a task that is gone (retired with its partition,
                // its key not yet forgotten): free to take.
                Err(Error::NotFound(_)) => None,
                Err(e) => return Err(e),
            },
        };
        let outcome = match (item.on_conflict, state) {
            (_, None) => give_key(&mut tx, biz_type_id, biz_type, item, holder, None).await?,
            (OnConflict::Keep, Some((id, ..))) => read(&mut *tx, id).await?.map(CreateOutcome::Existing),
            (OnConflict::Reject, Some((id, ..))) if request_hash.as_ref() == Some(&item.request_hash) => {
                read(&mut *tx, id).await?.map(CreateOutcome::Existing)
            }
            (OnConflict::Reject, Some(_)) => Some(CreateOutcome::Failed(key_conflict(item))),
            (OnConflict::Replace, Some((_, Status::Running, _))) => Some(CreateOutcome::Failed(Error::Conflict(
                Conflict::TaskRunning,
                format!(
                    "the task holding key `{key}` is running (its callback is under way); once it has finished, the same replace gives the key to a new task"
                ),
            ))),
            (OnConflict::Replace, Some((id, Status::Pending, cold))) => {
                // The request's time, payload and deadline (none: none), the deadline
                // counted from the new due time.
                let changes = Requeue {
                    when: Some(item.when),
                    payload: Some(&item.payload),
                    deadline: Some(item.deadline),
                    priority: Some(item.priority),
                    ..Requeue::default()
                };
                let mut tasks = requeue(&mut tx, cold, &[id], changes).await?;
                // The replacing request is now the key's: sent again, it is a repeat. (The
                // key's row, locked above.)
                crate::db::query("UPDATE task_keys SET request_hash = $3 WHERE biz_type_id = $1 AND key = $2")
                    .bind(biz_type_id)
                    .bind(&key)
                    .bind(&item.request_hash)
                    .execute(&mut *tx)
                    .await?;
                tasks.pop().map(CreateOutcome::Replaced)
            }
            // Finished, cancelled or expired: the old task keeps its history (and its `key`
            // column), the key goes to a new task, found by key from now on.
            (OnConflict::Replace, Some((id, ..))) => give_key(&mut tx, biz_type_id, biz_type, item, Some(id), Some(id)).await?,
        };
        if let Some(outcome) = outcome {
            tx.commit().await?;
            return Ok(outcome);
        }
    }
    Err(Error::key_conflict(format!("key `{key}` changed hands {TRIES} times while this create ran; send it again")))
}

/// Gives the key (locked by this transaction, or free) to a new task made of the item; the
/// task that held it, if any, joins the key's earlier tasks (`task_keys.earlier`, the
/// console's history of the key). `holder` is the task the key's row named when it was
/// locked (None: no row): only that row is taken away, never one a concurrent create of
/// the free key wrote since. None if such a create claimed the key first.
async fn give_key(
    tx: &mut sqlx::PgConnection,
    biz_type_id: i32,
    biz_type: &str,
    item: &mut NewTask,
    holder: Option<Uuid>,
    old: Option<Uuid>,
) -> Result<Option<CreateOutcome>, Error> {
    let key = item.key.clone().expect("a keyed create");
    let earlier: Option<Vec<Uuid>> =
        crate::db::query_scalar("DELETE FROM task_keys WHERE biz_type_id = $1 AND key = $2 AND task_id = $3 RETURNING earlier")
            .bind(biz_type_id)
            .bind(&key)
            .bind(holder)
            .fetch_optional(&mut *tx)
            .await?;
    let mut rows = Rows::default();
    rows.push_new(super::ids::new(biz_type_id), item);
    let created = insert(&mut *tx, biz_type_id, &rows).await?.pop();
    drop(rows);
    let Some(inserted) = created else {
        return Ok(None);
    };
    let mut earlier = earlier.unwrap_or_default();
    earlier.extend(old);
    if !earlier.is_empty() {
        crate::db::query("UPDATE task_keys SET earlier = $3 WHERE biz_type_id = $1 AND key = $2")
            .bind(biz_type_id)
            .bind(&key)
            .bind(&earlier)
            .execute(&mut *tx)
            .await?;
    }
    Ok(Some(CreateOutcome::Created(inserted.task(biz_type_id, biz_type, item))))
}
