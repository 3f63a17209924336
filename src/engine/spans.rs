//! A claimed task's spans, when traces are on (`traces`): its claim, each callback attempt
//! (an HTTP client span) and its record, all children of the span its creator's
//! `traceparent` named. Built only when `traces::tracer()` is Some: with traces off the
//! engine holds a `None` per task and builds nothing (docs/book/src/traces.md).

use std::time::SystemTime;

use opentelemetry::trace::{Span as _, SpanKind, Status, TraceContextExt, Tracer as _};
use opentelemetry::{Context, KeyValue};

use super::BizTypeConfig;
use crate::tasks::lease::{Claimed, Outcome, Verdict};
use crate::traces::{self, Span};

/// A claimed task's place in its trace: the parent of its spans and what each says of it.
pub(crate) struct TaskTrace {
    /// The creator's span, remote; for a task created without a `traceparent`, its claim
    /// span, so that its attempt and record join one trace.
    parent: Context,
    /// chime.biz_type, chime.task.id, chime.task.key (when it has one), chime.task.attempt.
    attributes: Vec<KeyValue>,
}

impl TaskTrace {
    /// Records the claim of `task` (a claim statement that started at `started` and has
    /// just returned) as a span, and keeps where the task's next spans go.
    pub(crate) fn claimed(biz: &BizTypeConfig, task: &Claimed, started: SystemTime) -> Option<TaskTrace> {
        let tracer = traces::tracer()?;
        let mut attributes = vec![
            KeyValue::new("chime.biz_type", biz.name.clone()),
            KeyValue::new("chime.task.id", task.id.to_string()),
            KeyValue::new("chime.task.attempt", i64::from(task.attempt_count)),
        ];
        if let Some(key) = &task.key {
            attributes.push(KeyValue::new("chime.task.key", key.clone()));
        }
        let creator = traces::remote_parent(task.traceparent.as_deref());
        let mut claim = tracer
            .span_builder("claim")
            .with_kind(SpanKind::Internal)
            .with_start_time(started)
            .with_attributes(attributes.clone())
            .start_with_context(tracer, creator.as_ref().unwrap_or(&Context::new()));
        claim.end();
        let parent = creator.unwrap_or_else(|| Context::new().with_remote_span_context(claim.span_context().clone()));
        Some(TaskTrace { parent, attributes })
    }

    /// The client span of one callback attempt, started now: its id goes into the
    /// callback's `traceparent` (`traces::traceparent_of`).
    pub(crate) fn attempt(&self, url: &str) -> Option<Span> {
        let tracer = traces::tracer()?;
        let mut attributes = self.attributes.clone();
        attributes.push(KeyValue::new("http.request.method", "POST"));
        // Without its query, which may hold a receiver's credentials.
        if let Ok(mut url) = url::Url::parse(url) {
            url.set_query(None);
            let _ = url.set_password(None);
            let _ = url.set_username("");
            attributes.push(KeyValue::new("server.address", url.host_str().unwrap_or_default().to_string()));
            if let Some(port) = url.port_or_known_default() {
                attributes.push(KeyValue::new("server.port", i64::from(port)));
            }
            attributes.push(KeyValue::new("url.full", url.to_string()));
        }
        Some(tracer.span_builder("POST").with_kind(SpanKind::Client).with_attributes(attributes).start_with_context(tracer, &self.parent))
    }

    /// Records that `outcome` was written in a batch that started at `started` and has just
    /// been committed.
    pub(crate) fn recorded(&self, outcome: &Outcome, started: SystemTime) {
        let Some(tracer) = traces::tracer() else { return };
        let mut attributes = self.attributes.clone();
        attributes.push(KeyValue::new("chime.outcome", outcome_name(&outcome.verdict)));
        if let Some(code) = outcome.status_code {
            attributes.push(KeyValue::new("http.response.status_code", i64::from(code)));
        }
        let mut record = tracer
            .span_builder("record")
            .with_kind(SpanKind::Internal)
            .with_start_time(started)
            .with_attributes(attributes)
            .start_with_context(tracer, &self.parent);
        record.end();
    }
}

/// Ends an attempt's span with what the receiver answered: its status code, or the error
/// when none came; an error status unless delivered.
pub(crate) fn answered(span: &mut Span, status_code: Option<i16>, error: Option<&str>, delivered: bool) {
    match status_code {
        Some(code) => span.set_attribute(KeyValue::new("http.response.status_code", i64::from(code))),
        None => span.set_attribute(KeyValue::new("error.type", "no answer")),
    }
    if let (Some(code), false) = (status_code, delivered) {
        span.set_attribute(KeyValue::new("error.type", code.to_string()));
    }
    if !delivered {
        span.set_status(Status::error(error.unwrap_or("not delivered").to_string()));
    }
    span.end();
}

/// What a recorded outcome did to its task, as the `chime.outcome` attribute says it.
fn outcome_name(verdict: &Verdict) -> &'static str {
    match verdict {
        Verdict::Delivered => "delivered",
        Verdict::RetryAt(_) => "retry",
        Verdict::GiveUp => "failed",
        Verdict::Snooze(_) => "snoozed",
        Verdict::Expire { .. } => "expired",
        Verdict::Held(_) => "held",
    }
}
