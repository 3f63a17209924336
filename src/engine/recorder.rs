//! The recorder: the delivery tasks' reports come to it, and it writes them in batches
//! (`lease::record`: one statement for the tasks, `record_tasks.sql`, and one for the
//! attempts, `record_attempts.sql`), and gives back the tasks claimed ahead that never
//! started. Once a batch is written it frees the tasks' places in the node's capacity and
//! wakes the claim loop. A task of its own, apart from the claim loop and the callbacks: a
//! callback's end never waits for a write, and each write takes whatever arrived meanwhile.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::sync::{Notify, mpsc};
use uuid::Uuid;

use super::spans::TaskTrace;
use super::{Looks, capacity};
use crate::db::{Health, Pool};
use crate::lifecycle::Signal;
use crate::tasks::lease::{self, Outcome, Verdict};

/// What a delivery task hands the recorder.
pub(super) enum Report {
    /// A callback's outcome.
    Finished(Outcome),
    /// A callback still in flight when the grace ran out, cut off.
    CutOff(Outcome),
    /// A task claimed ahead whose due time had not come when the node began to stop.
    Unstarted { task_id: Uuid, run_at: chrono::DateTime<chrono::Utc>, biz_type_id: i32 },
}

/// What the recorder wrote once the node was stopping, for the engine's last log line.
#[derive(Default)]
pub(super) struct Drained {
    pub(super) finished: usize,
    pub(super) given_back: usize,
    pub(super) cut_off: usize,
}

/// What the recorder tells the claim loop: that a batch is written (a slot and a place in
/// the node's capacity are free, a retry may be due), which biz types to look at again.
pub(super) struct ClaimLoop {
    pub(super) wake: Arc<Notify>,
    pub(super) looks: Arc<Looks>,
}

/// Writes outcomes in batches: whatever has arrived by the time the previous batch is
/// written goes into the next. Tasks given back unstarted are written the same way.
pub(super) async fn record_outcomes(
    pool: Pool,
    health: Health,
    node_id: Uuid,
    mut rx: mpsc::UnboundedReceiver<(Report, capacity::Hold, Option<TaskTrace>)>,
    claims: ClaimLoop,
    stop: Signal,
) -> Drained {
    let ClaimLoop { wake, looks } = claims;
    let mut reports = Vec::new();
    let mut drained = Drained::default();
    while rx.recv_many(&mut reports, 1000).await > 0 {
        let mut batch = Vec::with_capacity(reports.len());
        // Given up once the batch is written.
        let mut holds = Vec::with_capacity(reports.len());
        let mut unstarted = Vec::new();
        // The outcomes with a trace (traces on): each index in `batch`, and its trace.
        let mut traced = Vec::new();
        let mut again = HashSet::new();
        let mut settled = HashSet::new();
        let (mut finished, mut cut_off) = (0, 0);
        for (report, hold, trace) in reports.drain(..) {
            holds.push(hold);
            if let (Some(trace), Report::Finished(_) | Report::CutOff(_)) = (trace, &report) {
                traced.push((batch.len(), trace));
            }
            match report {
                Report::Finished(outcome) => {
                    finished += 1;
                    if matches!(outcome.verdict, Verdict::RetryAt(_) | Verdict::Snooze(_)) {
                        again.insert(outcome.biz_type_id);
                    } else {
                        settled.insert(outcome.biz_type_id);
                    }
                    batch.push(outcome);
                }
                Report::CutOff(outcome) => {
                    cut_off += 1;
                    batch.push(outcome);
                }
                Report::Unstarted { task_id, run_at, biz_type_id } => unstarted.push((task_id, run_at, biz_type_id)),
            }
        }
        if stop.is_stopping() {
            drained.finished += finished;
            drained.cut_off += cut_off;
            drained.given_back += unstarted.len();
        }
        let count = batch.len() + unstarted.len();
        loop {
            // Read only while traces are on, for the record spans.
            let started = (!traced.is_empty()).then(SystemTime::now);
            let written = async {
                if !batch.is_empty() {
                    lease::record(&pool, node_id, &batch).await?;
                    for (i, trace) in traced.drain(..) {
                        trace.recorded(&batch[i], started.unwrap_or_else(SystemTime::now));
                    }
                    batch.clear();
                }
                if !unstarted.is_empty() {
                    lease::give_back(&pool, node_id, &unstarted).await?;
                }
                Ok::<_, sqlx::Error>(())
            }
            .await;
            match written {
                Ok(()) => break,
                Err(e) => {
                    // The tasks stay running under our lease; keep trying rather than
                    // lose the outcome (if we die, the lease expires and they are retried).
                    if !health.saw(&e) {
                        tracing::warn!(error = %e, outcomes = count, "could not record outcomes; retrying in 1 s");
                    }
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
        // A retry or snooze may be due before the biz type's next due time as last asked.
        for id in &again {
            looks.add(*id);
        }
        for id in settled {
            looks.settled(id);
        }
        drop(holds);
        wake.notify_one();
    }
    drained
}
