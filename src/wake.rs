//! Wake-ups between nodes, on one PostgreSQL channel. Engines sleep until their next due
//! task (at most a second) and waiting pull reserves until theirs; a task that becomes due
//! sooner must wake them, on every node. So does a changed biz type, which the engines and
//! the token caches re-read at once rather than at their next refresh. A notification is
//! delivered on commit, so no one wakes to a row it cannot see yet.
//!
//! A lost notification (a LISTEN session that broke) costs only the sleeper's poll.
//!
//! A task due soon names its biz type (`Wake::DueFor`): thousands of reserves waiting on
//! one biz type must not all be woken by every task another biz type creates.

use std::time::Duration;

/// The channel every node listens on.
pub const CHANNEL: &str = "chime_wake";

/// Why a node is woken, as the notification's payload says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wake {
    /// A task is due within a second: created, replayed, rescheduled, retried or given back.
    /// Wakes every sleeper.
    Due,
    /// A task of this biz type is due within a second: wakes the engines and only this biz
    /// type's waiting reserves (`pull::Waiters`). A node of the previous release reads it
    /// as `Due`.
    DueFor(i32),
    /// A biz type's settings, tokens or secret changed.
    Settings,
}

impl Wake {
    /// The notification's payload (insert.sql writes `DueFor`'s itself: keep them alike).
    pub fn payload(self) -> String {
        match self {
            Wake::Due => String::new(),
            Wake::DueFor(id) => format!("due:{id}"),
            Wake::Settings => "settings".into(),
        }
    }

    fn from_payload(payload: &str) -> Wake {
        if payload == "settings" {
            return Wake::Settings;
        }
        match payload.strip_prefix("due:").and_then(|id| id.parse().ok()) {
            Some(id) => Wake::DueFor(id),
            None => Wake::Due,
        }
    }
}

/// Sends `wake` on commit of the caller's transaction (at once outside one).
pub async fn notify<'e>(executor: impl sqlx::PgExecutor<'e>, wake: Wake) -> Result<(), sqlx::Error> {
    crate::db::query("SELECT pg_notify($1, $2)").bind(CHANNEL).bind(wake.payload()).execute(executor).await.map(drop)
}

/// How long to wait before listening again after LISTEN failed.
const RETRY_LISTEN: Duration = Duration::from_secs(1);

/// Passes each wake-up to `on_wake` until `pool` is closed. When its session breaks it
/// calls `on_lost` and reconnects; notifications sent while it was away are lost, which
/// the sleepers' polls cover.
pub async fn listen(pool: sqlx::PgPool, on_wake: impl Fn(Wake), on_lost: impl Fn()) {
    while !pool.is_closed() {
        let mut listener = match sqlx::postgres::PgListener::connect_with(&pool).await {
            Ok(l) => l,
            Err(_) if pool.is_closed() => return,
            Err(e) => {
                tracing::warn!(error = %e, "cannot LISTEN for new tasks; polling meanwhile");
                tokio::time::sleep(RETRY_LISTEN).await;
                continue;
            }
        };
        if let Err(e) = listener.listen(CHANNEL).await {
            tracing::warn!(error = %e, "cannot LISTEN for new tasks; polling meanwhile");
            tokio::time::sleep(RETRY_LISTEN).await;
            continue;
        }
        // A lost connection is reported (`None`) before reconnecting, which can take the
        // pool's acquire timeout.
        listener.eager_reconnect(false);
        loop {
            match listener.try_recv().await {
                Ok(Some(notification)) => on_wake(Wake::from_payload(notification.payload())),
                Err(_) if pool.is_closed() => return,
                lost => {
                    on_lost();
                    let error = lost.err().map_or("closed".to_string(), |e| e.to_string());
                    tracing::warn!(error, "lost the LISTEN connection; reconnecting");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    break;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Wake;

    #[test]
    fn a_payload_reads_back_as_the_wake_it_was_written_for() {
        for wake in [Wake::Due, Wake::DueFor(42), Wake::Settings] {
            assert_eq!(Wake::from_payload(&wake.payload()), wake);
        }
        // The previous release's payloads, and anything unknown, wake every sleeper.
        assert_eq!(Wake::from_payload(""), Wake::Due);
        assert_eq!(Wake::from_payload("due:x"), Wake::Due);
    }
}
