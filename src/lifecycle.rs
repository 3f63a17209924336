//! A node's life, from binding its port to leaving the cluster (docs/design/contract.md, Operating), and the one
//! signal every background loop stops on.
//!
//! Starting → Migrating → Ready → Draining → Leaving. The listener is bound first, so
//! `/healthz` answers 200 from the start and a liveness probe never kills a long migration;
//! `/readyz` answers 200 only while Ready. SIGTERM or Ctrl-C makes the node Draining: `/readyz`
//! answers 503 at once, no claim and no callback starts, tasks claimed ahead go back to
//! pending, the leader lets its lock go, and the callbacks in flight may finish. When the
//! grace (`CHIME_SHUTDOWN_GRACE_SECS`) is over, or at a second signal, it is Leaving: the
//! callbacks still in flight are cut off and their tasks given back, so that another node
//! delivers them at once rather than after their lease (at least once allows the
//! duplicate: the receiver may have acted on the call cut off).

use std::fmt;

use tokio::sync::watch;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Phase {
    /// Bound, not yet looking at the schema.
    Starting,
    /// Applying migrations (or waiting for another node's).
    Migrating,
    Ready,
    /// Stopping: callbacks in flight may finish.
    Draining,
    /// The grace is over: what is still in flight is cut off.
    Leaving,
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Phase::Starting => "starting",
            Phase::Migrating => "migrating",
            Phase::Ready => "ready",
            Phase::Draining | Phase::Leaving => "stopping",
        })
    }
}

/// The node's phase, moved on by `startup` and read by the HTTP server and the loops.
#[derive(Clone)]
pub struct Lifecycle(std::sync::Arc<watch::Sender<Phase>>);

impl Default for Lifecycle {
    fn default() -> Self {
        Lifecycle(std::sync::Arc::new(watch::Sender::new(Phase::Starting)))
    }
}

impl Lifecycle {
    pub fn phase(&self) -> Phase {
        *self.0.borrow()
    }

    /// Moves to `phase`; never back.
    pub fn enter(&self, phase: Phase) {
        self.0.send_if_modified(|now| {
            let later = phase > *now;
            if later {
                *now = phase;
            }
            later
        });
    }

    pub fn signal(&self) -> Signal {
        Signal(self.0.subscribe())
    }
}

/// What a loop listens to: whether the node is stopping, and whether its grace is over.
#[derive(Clone)]
pub struct Signal(watch::Receiver<Phase>);

impl Signal {
    pub fn phase(&self) -> Phase {
        *self.0.borrow()
    }

    pub fn is_stopping(&self) -> bool {
        *self.0.borrow() >= Phase::Draining
    }

    pub fn is_leaving(&self) -> bool {
        *self.0.borrow() >= Phase::Leaving
    }

    /// Resolves once the node is stopping (at once if it already is).
    pub async fn stopping(&mut self) {
        self.reached(Phase::Draining).await
    }

    /// Resolves once the grace is over.
    pub async fn leaving(&mut self) {
        self.reached(Phase::Leaving).await
    }

    async fn reached(&mut self, phase: Phase) {
        // The sender lives as long as the node; if it were dropped, stop.
        let _ = self.0.wait_for(|now| *now >= phase).await;
    }
}
