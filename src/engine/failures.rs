//! Failed attempts in the log (docs/design/contract.md, Operating): each one at WARN with its task, biz type, attempt
//! and status or error. A receiver that is down under a burst would make that thousands of
//! lines a second, so past `LOUD` lines in an interval a biz type's failures are counted
//! instead, and the count is one line when the interval ends.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::tasks::lease::{Outcome, Verdict};

/// Failed attempts of one biz type logged one by one in an interval.
const LOUD: u32 = 5;
/// How long a biz type's failures beyond `LOUD` are counted into one line.
const INTERVAL: Duration = Duration::from_secs(10);

#[derive(Default)]
pub struct FailureLog(Mutex<HashMap<i32, Window>>);

/// One biz type's failures in the current interval.
struct Window {
    biz_type: String,
    started: Instant,
    logged: u32,
    counted: u64,
    /// The first counted failure's error.
    example: String,
}

impl FailureLog {
    /// Logs `outcome` if it is a failed attempt, or counts it when its biz type's interval
    /// has had `LOUD` lines already.
    pub fn note(&self, biz_type: &str, outcome: &Outcome) {
        // A snooze is the receiver's answer, not a failure, even one that ends the task. A
        // failure held by an open breaker is the breaker's: its opening is logged once.
        if matches!(outcome.verdict, Verdict::Delivered | Verdict::Snooze(_) | Verdict::Expire { snoozed: true, .. } | Verdict::Held(_)) {
            return;
        }
        let error = outcome.error.as_deref().unwrap_or("failed");
        let now = Instant::now();
        let (ended, loud) = {
            let mut windows = self.0.lock().unwrap();
            let window = windows.entry(outcome.biz_type_id).or_insert_with(|| Window::new(biz_type, now));
            let ended = (now - window.started >= INTERVAL).then(|| std::mem::replace(window, Window::new(biz_type, now)));
            let loud = window.logged < LOUD;
            if loud {
                window.logged += 1;
            } else {
                window.counted += 1;
                if window.example.is_empty() {
                    window.example = error.to_string();
                }
            }
            (ended, loud)
        };
        if let Some(ended) = ended {
            ended.summarise();
        }
        if !loud {
            return;
        }
        let status = outcome.status_code;
        match outcome.verdict {
            Verdict::RetryAt(at) => tracing::warn!(
                task_id = %outcome.task_id, biz_type, attempt = outcome.attempt, status, error, retry_at = %at,
                "delivery attempt failed; will retry"
            ),
            Verdict::Expire { deadline, .. } => tracing::warn!(
                task_id = %outcome.task_id, biz_type, attempt = outcome.attempt, status, error, expires_at = %deadline,
                "delivery attempt failed and its retry would start at or after the task's deadline; the task has expired"
            ),
            _ => tracing::warn!(
                task_id = %outcome.task_id, biz_type, attempt = outcome.attempt, status, error,
                "delivery attempt failed; the task has failed"
            ),
        }
    }

    /// Logs the count of each interval that has ended (all of them when `all`, at shutdown).
    pub fn flush(&self, all: bool) {
        let now = Instant::now();
        let ended: Vec<Window> = {
            let mut windows = self.0.lock().unwrap();
            let ids: Vec<i32> = windows.iter().filter(|(_, w)| all || now - w.started >= INTERVAL).map(|(id, _)| *id).collect();
            ids.iter().filter_map(|id| windows.remove(id)).collect()
        };
        for window in ended {
            window.summarise();
        }
    }
}

impl Window {
    fn new(biz_type: &str, now: Instant) -> Window {
        Window { biz_type: biz_type.to_string(), started: now, logged: 0, counted: 0, example: String::new() }
    }

    fn summarise(self) {
        if self.counted > 0 {
            tracing::warn!(
                biz_type = %self.biz_type,
                failed = self.counted,
                interval_secs = INTERVAL.as_secs(),
                example = %self.example,
                "more delivery attempts failed than were logged one by one"
            );
        }
    }
}
