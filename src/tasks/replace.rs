//! A create whose key is taken, when it says what to do about it (`on_conflict`, SPEC §11):
//! `replace` changes the key's pending task or gives the key to a new task, `keep` answers
//! with the key's task. `reject`, the default, is `create_batch`'s own answer (a repeat or
//! a conflict); it needs nothing here.
//!
//! Each such create is a transaction of its own that locks the key's row in `task_keys`
//! first, so that creates of one key queue up there and each sees what the last one did,
//! and then the task's row, as a cancel does, so that it cannot be claimed meanwhile: a
//! replace racing with the engine finds the task either pending (and changes it before the
//! claim sees it: the claim skips locked rows) or running (409 `task_running`), never half
//! of each. The fresh path (a key nobody holds) stays `insert`'s one statement.

use serde::Deserialize;
use uuid::Uuid;

use super::create::{CreateOutcome, NewTask, Rows, insert, key_conflict};
use super::queries::{lock, read, requeue};
use super::Status;
use crate::db::Pool;
use crate::error::{Conflict, Error};

/// What a create does when its key is already taken.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum OnConflict {
    /// The same request again is a repeat (200), another one a conflict (409 `key_conflict`).
    #[default]
    Reject,
    /// A pending task takes this request's time and payload; a finished one leaves the key
    /// to a new task; a running one is a conflict (409 `task_running`).
    Replace,
    /// The key's task as it is, whatever the request.
    Keep,
}

/// Tries at most this often when the key changes hands between two statements (its task
/// retired, or a concurrent create took it back): each try sees a later state, and two
/// changes in a row are already unlikely.
const TRIES: usize = 3;

/// Answers a `replace` or `keep` create whose key was taken when `insert` ran; in a
/// transaction per try. Its payload is moved into the outcome when it becomes a task's.
pub(super) async fn create_taken(pool: &Pool, biz_type_id: i32, biz_type: &str, item: &mut NewTask) -> Result<CreateOutcome, Error> {
    let key = item.key.clone().expect("only a keyed create can find its key taken");
    for _ in 0..TRIES {
        let mut tx = pool.begin().await?;
        // Locks the key: creates of this key wait here for each other.
        let holder: Option<Uuid> =
            crate::db::query_scalar("SELECT task_id FROM task_keys WHERE biz_type_id = $1 AND key = $2 FOR UPDATE")
                .bind(biz_type_id)
                .bind(&key)
                .fetch_optional(&mut *tx)
                .await?;
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
            (_, None) => {
                crate::db::query("DELETE FROM task_keys WHERE biz_type_id = $1 AND key = $2")
                    .bind(biz_type_id)
                    .bind(&key)
                    .execute(&mut *tx)
                    .await?;
                insert_one(&mut tx, biz_type_id, biz_type, item).await?
            }
            (OnConflict::Keep, Some((id, ..))) => read(&mut *tx, id).await?.map(CreateOutcome::Existing),
            (OnConflict::Reject, Some(_)) => Some(CreateOutcome::Failed(key_conflict(item))),
            (OnConflict::Replace, Some((_, Status::Running, _))) => Some(CreateOutcome::Failed(Error::Conflict(
                Conflict::TaskRunning,
                format!("the task holding key `{key}` is running (its callback is under way); once it has finished, the same replace gives the key to a new task"),
            ))),
            (OnConflict::Replace, Some((id, Status::Pending, cold))) => {
                // TODO(expires_at): once the create side carries a deadline, the replace
                // takes it too (requeue sets it alongside run_at and payload).
                let mut tasks = requeue(&mut tx, cold, &[id], Some(item.when), Some(&item.payload), false).await?;
                // The replacing request is now the key's: sent again, it is a repeat.
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
            (OnConflict::Replace, Some(_)) => {
                crate::db::query("DELETE FROM task_keys WHERE biz_type_id = $1 AND key = $2")
                    .bind(biz_type_id)
                    .bind(&key)
                    .execute(&mut *tx)
                    .await?;
                insert_one(&mut tx, biz_type_id, biz_type, item).await?
            }
        };
        if let Some(outcome) = outcome {
            tx.commit().await?;
            return Ok(outcome);
        }
    }
    Err(Error::key_conflict(format!("key `{key}` changed hands {TRIES} times while this create ran; send it again")))
}

/// Inserts the item with its key (free in this transaction); None if a concurrent create
/// claimed the key first.
async fn insert_one(tx: &mut sqlx::PgConnection, biz_type_id: i32, biz_type: &str, item: &mut NewTask) -> Result<Option<CreateOutcome>, Error> {
    let mut rows = Rows::default();
    let payload = item.payload.get().to_string();
    rows.push(Uuid::now_v7(), item.key.clone(), item.when, &payload, item.request_hash.clone());
    let Some(mut task) = insert(&mut *tx, biz_type_id, biz_type, None, &rows).await?.pop() else {
        return Ok(None);
    };
    task.payload = std::mem::take(&mut item.payload);
    Ok(Some(CreateOutcome::Created(task)))
}
