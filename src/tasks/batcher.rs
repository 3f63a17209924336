//! Single creates that arrive together are written together: one statement and one commit
//! for all the requests waiting at that moment, instead of one each. Nothing waits to fill
//! a batch: a writer takes whatever is queued when it is free, so a lone request goes
//! straight through, and under load the batches grow by themselves.

use std::sync::Arc;

use crate::db::Pool;
use tokio::sync::{Mutex, mpsc, oneshot};

use super::{CreateOutcome, NewTask, create_batch};
use crate::error::Error;

/// Statements in flight at once: enough to overlap one batch's commit with the next
/// batch's insert, few enough to leave the pool to everything else.
const WRITERS: usize = 4;
/// Most requests written in one statement.
const MAX_BATCH: usize = 1000;

struct Request {
    biz_type_id: i32,
    biz_type: String,
    task: NewTask,
    reply: oneshot::Sender<Result<CreateOutcome, Error>>,
}

#[derive(Clone)]
pub struct CreateBatcher {
    queue: mpsc::UnboundedSender<Request>,
}

impl CreateBatcher {
    /// Starts the writers; must be called inside the runtime. They stop when every
    /// `CreateBatcher` clone is dropped.
    pub fn start(pool: Pool) -> CreateBatcher {
        let (queue, rx) = mpsc::unbounded_channel();
        let rx = Arc::new(Mutex::new(rx));
        for _ in 0..WRITERS {
            tokio::spawn(write(pool.clone(), rx.clone()));
        }
        CreateBatcher { queue }
    }

    /// Creates one task, as [`create_batch`] would with one item.
    pub async fn create(&self, biz_type_id: i32, biz_type: &str, task: NewTask) -> Result<CreateOutcome, Error> {
        let (reply, answer) = oneshot::channel();
        let request = Request { biz_type_id, biz_type: biz_type.to_string(), task, reply };
        self.queue.send(request).map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())?
    }
}

fn stopped() -> Error {
    Error::Db(sqlx::Error::PoolClosed)
}

async fn write(pool: Pool, rx: Arc<Mutex<mpsc::UnboundedReceiver<Request>>>) {
    let mut queued = Vec::new();
    loop {
        // One writer at a time takes what is queued; the others wait their turn here.
        if rx.lock().await.recv_many(&mut queued, MAX_BATCH).await == 0 {
            return;
        }
        // Requests of several biz types: one statement per biz type.
        while !queued.is_empty() {
            let biz_type_id = queued[0].biz_type_id;
            let (group, rest): (Vec<Request>, Vec<Request>) = queued.drain(..).partition(|r| r.biz_type_id == biz_type_id);
            queued = rest;
            write_group(&pool, group).await;
        }
    }
}

async fn write_group(pool: &Pool, group: Vec<Request>) {
    let biz_type = group[0].biz_type.clone();
    let biz_type_id = group[0].biz_type_id;
    let (mut tasks, replies): (Vec<NewTask>, Vec<_>) = group.into_iter().map(|r| (r.task, r.reply)).unzip();
    match create_batch(pool, biz_type_id, &biz_type, &mut tasks).await {
        Ok(outcomes) => {
            for (reply, outcome) in replies.into_iter().zip(outcomes) {
                let _ = reply.send(Ok(outcome));
            }
        }
        Err(e) if replies.len() == 1 => {
            let _ = replies.into_iter().next().expect("one reply").send(Err(e));
        }
        // The statement wrote nothing; each request is tried alone, so that each gets its
        // own answer (and one bad request cannot fail the others).
        Err(_) => {
            for (reply, task) in replies.into_iter().zip(tasks.chunks_mut(1)) {
                let outcome = create_batch(pool, biz_type_id, &biz_type, task).await.map(|mut o| o.pop().expect("one outcome"));
                let _ = reply.send(outcome);
            }
        }
    }
}
