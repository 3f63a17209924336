//! One HTTP callback (docs/design/contract.md, Callbacks): the body, the signature, and what the answer means.

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use hmac::{Hmac, Mac};
use serde::Serialize;
use serde_json::value::RawValue;
use sha2::Sha256;
use uuid::Uuid;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;

use super::BizTypeConfig;
use super::spans::{self, TaskTrace};
use crate::biz_types::{STANDARD_WEBHOOKS, whsec_key};
use crate::callback_hosts::CallbackHosts;
use crate::error::SecretError;
use crate::tasks::lease::{Claimed, Outcome, RetryPolicy, Verdict};
use crate::traces;
use opentelemetry::trace::Span as _;

/// How much of a receiver's answer is kept with the attempt.
const EXCERPT_BYTES: usize = 512;
/// The longest `Retry-After` honoured; beyond it the backoff applies.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(86_400);
/// How many 307 or 308 redirects one attempt follows.
const MAX_REDIRECTS: usize = 5;

#[derive(Serialize)]
struct Body<'a> {
    task_id: Uuid,
    biz_type: &'a str,
    key: Option<&'a str>,
    /// Only when the task has one, so that a body without is what it always was.
    #[serde(skip_serializing_if = "Option::is_none")]
    flow_key: Option<&'a str>,
    run_at: DateTime<Utc>,
    fired_at: DateTime<Utc>,
    attempt: i32,
    timer_id: Option<Uuid>,
    payload: &'a RawValue,
}

/// `t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">`.
pub fn signature(secret: &str, unix_seconds: i64, body: &[u8]) -> String {
    signatures(&[secret], unix_seconds, body)
}

/// `t=<unix seconds>,v1=<HMAC with the first secret>,v1=<HMAC with the next>…`: during a
/// rotation's overlap the current secret's and then the replaced one's, so that a receiver
/// accepting any matching `v1` verifies with whichever it knows (docs/design/contract.md, Notices and signatures).
pub fn signatures(secrets: &[&str], unix_seconds: i64, body: &[u8]) -> String {
    let mut header = format!("t={unix_seconds}");
    for secret in secrets {
        let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("HMAC takes a key of any length");
        mac.update(unix_seconds.to_string().as_bytes());
        mac.update(b".");
        mac.update(body);
        header.push_str(&format!(",v1={}", hex::encode(mac.finalize().into_bytes())));
    }
    header
}

/// `v1,<base64 HMAC-SHA256 of "<id>.<t>.<body>">` for each key, space-separated: Standard
/// Webhooks' `webhook-signature`, keyed by the bytes of `whsec_<base64>` secrets (`whsec_key`).
pub fn standard_signatures(keys: &[&[u8]], id: &str, unix_seconds: i64, body: &[u8]) -> String {
    let signed: Vec<String> = keys
        .iter()
        .map(|key| {
            let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes a key of any length");
            mac.update(format!("{id}.{unix_seconds}.").as_bytes());
            mac.update(body);
            format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes()))
        })
        .collect();
    signed.join(" ")
}

/// The signature headers of `body`, message `id`, sent at `fired_at` for `biz` in its
/// signing scheme: the current secret's signature, and the previous one's while it still
/// signs; or why this node cannot sign. Chime's: `Chime-Signature`. Standard Webhooks':
/// `webhook-id`, `webhook-timestamp` and `webhook-signature`, and no `Chime-Signature` (one
/// scheme per biz type, the one its receivers verify); a previous secret not in `whsec_`
/// form (one from before the switch) cannot sign that way and is left out.
fn sign(biz: &BizTypeConfig, id: &str, fired_at: DateTime<Utc>, body: &[u8]) -> Result<Vec<(&'static str, String)>, SecretError> {
    let current = biz.signing_secret.expose()?;
    let previous = biz.previous_secret.signing_at(fired_at).map(|p| p.expose()).transpose()?;
    let t = fired_at.timestamp();
    if biz.signing_scheme != STANDARD_WEBHOOKS {
        let secrets: Vec<&str> = std::iter::once(current).chain(previous).collect();
        return Ok(vec![("Chime-Signature", signatures(&secrets, t, body))]);
    }
    let current = whsec_key(current).ok_or_else(|| SecretError::NotWhsec { biz_type: biz.name.clone() })?;
    let previous = previous.and_then(whsec_key);
    let keys: Vec<&[u8]> = std::iter::once(current.as_slice()).chain(previous.as_deref()).collect();
    Ok(vec![("webhook-id", id.to_string()), ("webhook-timestamp", t.to_string()), ("webhook-signature", standard_signatures(&keys, id, t, body))])
}

/// What an answer says about the receiver rather than the task: the receiver breaker's input
/// (`breaker`).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Answer {
    /// No answer (connection error, timeout), or 408, 429 or 5xx: the receiver is in
    /// trouble. Any other answer, a 4xx or a redirect that is the callback's own fault
    /// included, says it is up.
    pub trouble: bool,
    /// A 429 or 503 with `Retry-After`: how long it asked the whole biz type to wait.
    pub slow_for: Option<Duration>,
}

impl Answer {
    fn of(sent: &Sent) -> Answer {
        let trouble = match sent.status_code {
            None => true,
            Some(code) => code == 408 || code == 429 || code >= 500,
        };
        let slow_for = sent.retry_after.filter(|_| matches!(sent.status_code, Some(429 | 503)));
        Answer { trouble, slow_for }
    }
}

/// Calls back about `task`, and says what came of it. With traces on (`trace`), the attempt
/// is a client span whose id the callback's `traceparent` carries; off, the `traceparent`
/// is a child of the creator's with a random span id, as it always was.
pub async fn deliver(
    client: &reqwest::Client,
    hosts: CallbackHosts,
    biz: &BizTypeConfig,
    task: Claimed,
    trace: Option<&TaskTrace>,
) -> (Outcome, Answer) {
    let fired_at = Utc::now();
    // The payload comes from a jsonb column, so it is valid JSON; moved, not copied.
    let payload = RawValue::from_string(task.payload).unwrap_or_else(|_| RawValue::from_string("null".into()).unwrap());
    let body = serde_json::to_vec(&Body {
        task_id: task.id,
        biz_type: &biz.name,
        key: task.key.as_deref(),
        flow_key: task.flow_key.as_deref(),
        run_at: task.run_at,
        fired_at,
        attempt: task.attempt_count,
        timer_id: task.timer_id,
        payload: &payload,
    })
    .expect("a callback body serializes");
    let mut headers = vec![("Chime-Task-Id", task.id.to_string()), ("Chime-Attempt", task.attempt_count.to_string())];
    let mut span = trace.and_then(|trace| trace.attempt(&biz.callback_url));
    let traceparent = match &span {
        Some(span) => Some(traces::traceparent_of(span.span_context())),
        None => task.traceparent.as_deref().and_then(child_traceparent),
    };
    if let Some(traceparent) = traceparent {
        headers.push(("traceparent", traceparent));
    }
    // The task's id is the message's: a receiver deduplicates retries on it.
    let id = task.id.to_string();
    let Posted { sent, duration_ms } = post(client, hosts, biz, Post { url: &biz.callback_url, id: &id, headers: &headers, fired_at, body }).await;

    let mut error = sent.error.clone();
    let deadline = task.expires_at;
    let verdict = match (sent.status_code, &sent.snooze) {
        (Some(code), Some(snooze)) if (200..300).contains(&code) => match snooze {
            Ok(seconds) => Verdict::after_snooze(Utc::now() + chrono::TimeDelta::seconds(i64::from(*seconds)), deadline),
            // A snooze the receiver got wrong is its protocol error: retried like a failure
            // (counted, with backoff), so a receiver that always answers it still ends.
            Err(why) => {
                error = Some(why.clone());
                retry(biz, task.attempt_count, None, deadline)
            }
        },
        _ => verdict(biz, task.attempt_count, &sent, deadline),
    };
    if let Some(span) = &mut span {
        let ok = sent.status_code.is_some_and(|code| (200..300).contains(&code)) && error.is_none();
        spans::answered(span, sent.status_code, error.as_deref(), ok);
    }
    let answer = Answer::of(&sent);
    let outcome = Outcome {
        task_id: task.id,
        biz_type_id: biz.id,
        run_at: task.run_at,
        attempt: task.attempt_count,
        started_at: fired_at,
        duration_ms,
        status_code: sent.status_code,
        error,
        response_excerpt: sent.excerpt,
        redirected_to: sent.redirected_to,
        verdict,
    };
    (outcome, answer)
}

/// What an answer means for attempt number `attempt` (docs/design/contract.md, Callbacks), a snooze aside: a 2xx is
/// delivered; a timeout, connection error, 408, 429 or 5xx is retried by the biz type's
/// backoff (`Retry-After` honoured) until its attempts are used up, or its `deadline`;
/// any other 4xx gives up. A callback's and a failure notice's alike.
pub(crate) fn verdict(biz: &BizTypeConfig, attempt: i32, sent: &Sent, deadline: Option<DateTime<Utc>>) -> Verdict {
    match sent.status_code {
        Some(code) if (200..300).contains(&code) => Verdict::Delivered,
        Some(code) if code == 408 || code == 429 || code >= 500 => retry(biz, attempt, sent.retry_after, deadline),
        // A redirect that `send` does not follow is retried rather than failed at once: the
        // fix is the biz type's callback URL, and once an operator makes it, the tasks still
        // retrying are delivered without a replay of each.
        Some(code) if changes_method(code) => retry(biz, attempt, sent.retry_after, deadline),
        Some(_) => Verdict::GiveUp,
        None => retry(biz, attempt, None, deadline),
    }
}

/// One signed POST: what came of it, and how long it took. A callback's, or a failure
/// notice's (`failure_notices`), which is sent the same way.
pub(crate) struct Posted {
    pub sent: Sent,
    pub duration_ms: i32,
}

/// What to POST: `body` to `url` with `headers` (besides Content-Type and the signature),
/// sent at `fired_at`; `id` is the message's, the same on each retry (a task's or a
/// notice's id), which Standard Webhooks signs.
pub(crate) struct Post<'a> {
    pub url: &'a str,
    pub id: &'a str,
    pub headers: &'a [(&'a str, String)],
    pub fired_at: DateTime<Utc>,
    pub body: Vec<u8>,
}

/// Sends `request` signed for `biz` (its timeout; redirects and the deny list as `send` says).
pub(crate) async fn post(client: &reqwest::Client, hosts: CallbackHosts, biz: &BizTypeConfig, request: Post<'_>) -> Posted {
    let Post { url, id, headers, fired_at, body } = request;
    let started = Instant::now();
    // An IP-literal host is connected to without a lookup, so the resolver cannot refuse
    // it: checked here. The URL was valid when saved; the deny list may be newer. Without a
    // deny list there is nothing to check, and no URL to parse per callback.
    let refusal = match hosts {
        CallbackHosts::Any => None,
        CallbackHosts::PublicOnly => url::Url::parse(url).ok().and_then(|url| hosts.address_refusal(&url)),
    };
    let sent = match refusal {
        Some(reason) => Sent { error: Some(format!("could not connect: {reason}")), ..Sent::default() },
        None => send(client, hosts, biz, url, (id, headers), fired_at, body).await,
    };
    let duration_ms = started.elapsed().as_millis().min(i32::MAX as u128) as i32;
    Posted { sent, duration_ms }
}

/// The outcome of a task claimed ahead of its due time whose deadline came first: not sent
/// (no callback starts at or after the deadline), recorded as an attempt that says so, and
/// the task expired.
pub fn not_sent(biz: &BizTypeConfig, task: &Claimed, deadline: DateTime<Utc>) -> Outcome {
    Outcome {
        task_id: task.id,
        biz_type_id: biz.id,
        run_at: task.run_at,
        attempt: task.attempt_count,
        started_at: Utc::now(),
        duration_ms: 0,
        status_code: None,
        error: Some(format!("not sent: its deadline {} came before its due time {}", deadline.to_rfc3339(), task.run_at.to_rfc3339())),
        response_excerpt: None,
        redirected_to: None,
        verdict: Verdict::Expire { deadline, next: None, snoozed: false },
    }
}

/// The longest `Chime-Snooze`, in seconds: a year (docs/design/contract.md, Tasks by key).
pub const MAX_SNOOZE_SECS: u32 = 31_536_000;

/// A `Chime-Snooze` header's values: whole seconds from 1 to `MAX_SNOOZE_SECS`, or the
/// attempt's protocol error naming the header and what it said.
fn parse_snooze<'a>(mut values: impl Iterator<Item = &'a [u8]>) -> Option<Result<u32, String>> {
    let first = values.next()?;
    let text = String::from_utf8_lossy(first);
    let wrong = |why: &str| {
        Err(format!(
            "protocol error: the receiver answered 2xx with Chime-Snooze {text:?}, {why}; a snooze must be whole seconds \
             from 1 to {MAX_SNOOZE_SECS}: retried like a failure"
        ))
    };
    if values.next().is_some() {
        return Some(wrong("given more than once"));
    }
    let trimmed = text.trim();
    if trimmed.is_empty() || !trimmed.bytes().all(|b| b.is_ascii_digit()) {
        return Some(wrong("not a whole number of seconds"));
    }
    Some(match trimmed.parse::<u64>() {
        Ok(seconds @ 1..) if seconds <= u64::from(MAX_SNOOZE_SECS) => Ok(seconds as u32),
        _ => wrong("out of range"),
    })
}

/// The `traceparent` of a callback of a task whose create carried `parent` (W3C Trace
/// Context): the same version, trace id and flags, and a new span id, random for each
/// attempt. None when `parent` is not a traceparent this can continue.
pub fn child_traceparent(parent: &str) -> Option<String> {
    let mut fields = parent.trim().splitn(5, '-');
    let (version, trace_id, _parent_id, flags) = (fields.next()?, fields.next()?, fields.next()?, fields.next()?);
    let hex = |s: &str, len: usize| s.len() == len && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    let valid = hex(version, 2) && version != "ff" && hex(trace_id, 32) && trace_id.bytes().any(|b| b != b'0') && hex(flags, 2);
    if !valid || (version == "00" && fields.next().is_some()) {
        return None;
    }
    let span: u64 = rand::Rng::random_range(&mut rand::rng(), 1..=u64::MAX);
    Some(format!("{version}-{trace_id}-{span:016x}-{flags}"))
}

/// The outcome of a callback cut off because the node's shutdown grace ran out: an attempt
/// without an answer, and the task pending again at once for another node (whatever its
/// attempt count: the receiver is not at fault).
pub fn cut_off(biz: &BizTypeConfig, task_id: Uuid, run_at: DateTime<Utc>, attempt: i32, started_at: DateTime<Utc>, started: Instant) -> Outcome {
    Outcome {
        task_id,
        biz_type_id: biz.id,
        run_at,
        attempt,
        started_at,
        duration_ms: started.elapsed().as_millis().min(i32::MAX as u128) as i32,
        status_code: None,
        error: Some(
            "cut off: the node delivering it was stopping and its shutdown grace (CHIME_SHUTDOWN_GRACE_SECS) ran out before the receiver answered"
                .into(),
        ),
        response_excerpt: None,
        redirected_to: None,
        verdict: Verdict::RetryAt(Utc::now()),
    }
}

/// What became of one send.
#[derive(Default)]
pub(crate) struct Sent {
    /// The final answer's status; none when no answer came.
    pub status_code: Option<i16>,
    /// Why it was not delivered (none for a 2xx).
    pub error: Option<String>,
    /// The beginning of the final answer's body.
    pub excerpt: Option<String>,
    retry_after: Option<Duration>,
    /// The last URL a 307 or 308 sent the callback to.
    pub redirected_to: Option<String>,
    /// A 2xx answer's `Chime-Snooze`: seconds, or why it is wrong (none: no such header).
    snooze: Option<Result<u32, String>>,
}

/// 301, 302 and 303: a client following them sends a GET without the body.
fn changes_method(code: i16) -> bool {
    matches!(code, 301..=303)
}

/// Sends the callback and reads the beginning of the answer. The client follows no
/// redirect: 307 and 308, which keep the method and body, are followed here (at most
/// `MAX_REDIRECTS`, within the one timeout), each new URL checked against the deny list like
/// the callback URL. A 301, 302 or 303 would turn the POST into a bodiless GET, which a
/// receiver could answer with 200 without ever seeing the task: it is the answer, and its
/// `Location` goes into the error for the operator to put in the callback URL.
async fn send(
    client: &reqwest::Client,
    hosts: CallbackHosts,
    biz: &BizTypeConfig,
    url: &str,
    (id, headers): (&str, &[(&str, String)]),
    fired_at: DateTime<Utc>,
    body: Vec<u8>,
) -> Sent {
    let timeout = Duration::from_millis(biz.timeout_ms as u64);
    let deadline = Instant::now() + timeout;
    let mut sent = Sent::default();
    // `active_biz_types` leaves out a biz type whose secrets this node cannot open; were one
    // here, its callback fails rather than go out signed with something else.
    let signature = match sign(biz, id, fired_at, &body) {
        Ok(signature) => signature,
        Err(e) => return Sent { error: Some(e.to_string()), ..sent },
    };
    let mut request = client.post(url).timeout(timeout).header("Content-Type", "application/json");
    for (name, value) in headers {
        request = request.header(*name, value);
    }
    for (name, value) in signature {
        request = request.header(name, value);
    }
    let request = request.body(body).build();
    let mut request = match request {
        Ok(request) => request,
        Err(e) => return Sent { error: Some(failure(&e, biz.timeout_ms)), ..sent },
    };
    let mut hops = 0;
    let mut sent_again = false;
    let mut response = loop {
        // The body is bytes, so the copy for a redirect shares them.
        let again = request.try_clone().expect("a callback's body can be cloned");
        let response = match client.execute(request).await {
            Ok(response) => response,
            // The receiver closed the kept-alive connection as the callback went out on it
            // (servers close idle ones after a few seconds: 5 in Node.js and actix-web), so
            // it answered nothing: sent again at once, once, on another connection. Counted
            // as failures, the ten such at the start of a busy second opened the receiver's
            // breaker and held every callback for its probe interval (`chime bench`, steady
            // on 4 nodes: p99 5 s). A receiver that did read it gets it twice, as after any
            // failed attempt.
            Err(e) if !sent_again && closed_unanswered(&e) => {
                sent_again = true;
                request = again;
                *request.timeout_mut() = Some(deadline.saturating_duration_since(Instant::now()));
                continue;
            }
            Err(e) => return Sent { error: Some(failure(&e, biz.timeout_ms)), ..sent },
        };
        let status = response.status().as_u16();
        let Some(to) = location(&response).filter(|_| matches!(status, 307 | 308)) else { break response };
        if hops == MAX_REDIRECTS {
            return Sent { error: Some(format!("more than {MAX_REDIRECTS} redirects, the last ({status}) to {to}")), ..sent };
        }
        hops += 1;
        if let Some(reason) = hosts.address_refusal(&to) {
            return Sent { error: Some(format!("redirected ({status}) to {to}: {reason}")), ..sent };
        }
        sent.redirected_to = Some(to.to_string());
        request = again;
        *request.url_mut() = to;
        *request.timeout_mut() = Some(deadline.saturating_duration_since(Instant::now()));
    };

    let status = response.status().as_u16();
    sent.status_code = Some(status as i16);
    sent.retry_after = response.headers().get("Retry-After").and_then(|v| v.to_str().ok()).and_then(parse_retry_after);
    if response.status().is_success() {
        sent.snooze = parse_snooze(response.headers().get_all("Chime-Snooze").iter().map(|v| v.as_bytes()));
    }
    sent.error = match location(&response) {
        Some(to) if changes_method(status as i16) => Some(format!(
            "the receiver redirected ({status}) to {to}; callbacks are not redirected because the method and body \
             would change: set the biz type's callback URL to the new location"
        )),
        _ => (!response.status().is_success()).then(|| format!("HTTP {status}")),
    };
    let mut excerpt = Vec::new();
    // Read only the first bytes: a huge answer must not cost memory.
    let read = tokio::time::timeout(timeout, async {
        while excerpt.len() < EXCERPT_BYTES {
            match response.chunk().await {
                Ok(Some(chunk)) => excerpt.extend_from_slice(&chunk[..chunk.len().min(EXCERPT_BYTES - excerpt.len())]),
                _ => break,
            }
        }
    })
    .await;
    let _ = read;
    sent.excerpt = Some(String::from_utf8_lossy(&excerpt).into_owned()).filter(|e| !e.is_empty());
    sent
}

/// An answer's `Location`, resolved against the URL that answered.
fn location(response: &reqwest::Response) -> Option<url::Url> {
    let to = response.headers().get(reqwest::header::LOCATION)?.to_str().ok()?;
    response.url().join(to).ok()
}

/// The connection closed before an answer began (hyper's incomplete message).
fn closed_unanswered(e: &reqwest::Error) -> bool {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(error) = cause {
        if error.downcast_ref::<hyper::Error>().is_some_and(hyper::Error::is_incomplete_message) {
            return true;
        }
        cause = error.source();
    }
    false
}

/// The attempt's error for a request that got no answer.
fn failure(e: &reqwest::Error, timeout_ms: i32) -> String {
    if e.is_timeout() {
        format!("timed out after {timeout_ms} ms")
    } else if e.is_connect() {
        format!("could not connect: {}", root_cause(e))
    } else {
        format!("request failed: {}", root_cause(e))
    }
}

fn retry(biz: &BizTypeConfig, attempt: i32, retry_after: Option<Duration>, expires_at: Option<DateTime<Utc>>) -> Verdict {
    let policy = RetryPolicy { max_attempts: biz.max_attempts, backoff_initial_ms: biz.backoff_initial_ms, backoff_max_ms: biz.backoff_max_ms };
    Verdict::after_failure(attempt, policy, retry_after.filter(|d| *d <= MAX_RETRY_AFTER), Utc::now(), expires_at)
}

/// `Retry-After` as seconds or as an HTTP date (RFC 9110 §10.2.3).
fn parse_retry_after(value: &str) -> Option<Duration> {
    let value = value.trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(std::time::SystemTime::now()).unwrap_or_default())
}

fn root_cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cause = e;
    while let Some(next) = cause.source() {
        cause = next;
    }
    cause.to_string()
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use actix_web::{App, HttpResponse, HttpServer, web};

    use super::*;
    use crate::tasks::lease::{backoff, backoff_range_ms};

    fn biz(initial: i32, max: i32) -> BizTypeConfig {
        BizTypeConfig {
            id: 1,
            name: "t".into(),
            callback_url: String::new(),
            timeout_ms: 1000,
            max_attempts: 5,
            backoff_initial_ms: initial,
            backoff_max_ms: max,
            max_in_flight: 1,
            rate_limit: None,
            signing_secret: crate::biz_types::SigningSecret::Open("s".into()),
            previous_secret: crate::biz_types::PreviousSecret::default(),
            failure_url: None,
            breaker_threshold: 0,
            breaker_window_ms: 60_000,
            breaker_probe_ms: 5_000,
            flow_max_in_flight: 0,
            ordered: false,
            flow_rate_limit: None,
            weight: 1,
            signing_scheme: "chime".into(),
            updated_at: DateTime::UNIX_EPOCH,
        }
    }

    #[test]
    fn backoff_doubles_within_jitter_and_is_capped() {
        let b = biz(1000, 10_000);
        for (attempt, full) in [(1, 1000u64), (2, 2000), (3, 4000), (4, 8000), (5, 10_000), (40, 10_000)] {
            for _ in 0..50 {
                let d = backoff(b.backoff_initial_ms, b.backoff_max_ms, attempt).as_millis() as u64;
                assert!(d >= full / 2 && d <= full, "attempt {attempt}: {d} not in [{}, {full}]", full / 2);
            }
        }
    }

    /// "0.5 s", "17 min", "24.1 h".
    fn human(ms: u64) -> String {
        let trim = |x: f64, unit: &str| format!("{}", (x * 10.0).round() / 10.0) + unit;
        match ms {
            0..60_000 => trim(ms as f64 / 1000.0, " s"),
            60_000..3_600_000 => trim(ms as f64 / 60_000.0, " min"),
            _ => trim(ms as f64 / 3_600_000.0, " h"),
        }
    }

    /// The default schedule as the book's table (docs/book/src/callbacks.md): each attempt's delay after the previous
    /// one and its time since the first, shortest to longest; the attempts after the delay
    /// reaches its cap share a row.
    fn default_schedule() -> (String, u64) {
        use crate::biz_types::{DEFAULT_BACKOFF_INITIAL_MS as INITIAL, DEFAULT_BACKOFF_MAX_MS as MAX, DEFAULT_MAX_ATTEMPTS as ATTEMPTS};
        let mut table = String::from("| attempt | after the previous one | since the first |\n|---|---|---|\n| 1 | | 0 |\n");
        let (mut least, mut most) = (0, 0);
        let first_capped = (2..=ATTEMPTS).find(|a| backoff_range_ms(INITIAL, MAX, a - 1).1 == MAX as u64).unwrap_or(ATTEMPTS);
        for attempt in 2..=ATTEMPTS {
            let (shortest, longest) = backoff_range_ms(INITIAL, MAX, attempt - 1);
            least += shortest;
            most += longest;
            let capped = longest == MAX as u64;
            if capped && attempt < ATTEMPTS {
                continue;
            }
            let name = if capped { format!("{first_capped}–{attempt}") } else { attempt.to_string() };
            let each = if capped { " each" } else { "" };
            table += &format!("| {name} | {}–{}{each} | {}–{} |\n", human(shortest), human(longest), human(least), human(most));
        }
        (table, least)
    }

    #[test]
    fn the_default_schedule_spans_a_day_and_is_the_books() {
        let (table, least_ms) = default_schedule();
        assert!(least_ms >= 24 * 3_600_000, "the default retries end {} after the first attempt at the least", human(least_ms));
        // The book's chapter on callbacks shows it (it was the README's table).
        let chapter = include_str!("../../docs/book/src/callbacks.md");
        assert!(chapter.contains(&table), "docs/book/src/callbacks.md should show the default schedule as:\n{table}");
    }

    #[test]
    fn retry_after_takes_seconds_or_a_date() {
        assert_eq!(parse_retry_after(" 120 "), Some(Duration::from_secs(120)));
        let in_a_minute = httpdate::fmt_http_date(std::time::SystemTime::now() + Duration::from_secs(60));
        let parsed = parse_retry_after(&in_a_minute).unwrap();
        assert!(parsed > Duration::from_secs(55) && parsed <= Duration::from_secs(60), "{parsed:?}");
        assert_eq!(parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT"), Some(Duration::ZERO), "a past date: now");
        assert_eq!(parse_retry_after("soon"), None);
    }

    /// An HTTP server on a free loopback port that answers every request with a 307 to
    /// `location`, or with 200 when there is none; returns its port and a count of requests.
    fn server(location: Option<String>) -> (u16, Arc<AtomicUsize>) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let requests = Arc::new(AtomicUsize::new(0));
        let counted = requests.clone();
        let server = HttpServer::new(move || {
            let (location, counted) = (location.clone(), counted.clone());
            App::new().default_service(web::to(move || {
                counted.fetch_add(1, Ordering::SeqCst);
                let response = match &location {
                    Some(to) => HttpResponse::TemporaryRedirect().insert_header(("Location", to.as_str())).finish(),
                    None => HttpResponse::Ok().finish(),
                };
                async move { response }
            }))
        })
        .workers(1)
        .disable_signals()
        .listen(listener)
        .unwrap()
        .run();
        tokio::spawn(server);
        (port, requests)
    }

    /// Delivers one task to `biz` through `hosts`' client, in which the name `public.test`
    /// stands for a public receiver (it is on loopback here).
    async fn deliver_via_public_name(hosts: CallbackHosts, biz: &BizTypeConfig) -> Outcome {
        let client = hosts.http_client().resolve("public.test", SocketAddr::from(([127, 0, 0, 1], 0))).build().unwrap();
        let now = Utc::now();
        let task = Claimed {
            id: Uuid::new_v4(),
            key: None,
            flow_key: None,
            run_at: now,
            payload: "{}".into(),
            attempt_count: 1,
            timer_id: None,
            expires_at: None,
            traceparent: None,
            expired: false,
            db_now: now,
        };
        deliver(&client, hosts, biz, task, None).await.0
    }

    /// With the deny list on, a receiver's redirect into a denied range, to an IP literal or
    /// to a name resolving there, is not followed: the attempt fails with the reason and is
    /// retried. Without the deny list the same redirect is followed.
    #[tokio::test]
    async fn redirects_into_denied_ranges_are_not_followed() {
        crate::engine::install_tls_provider();
        let (target, reached) = server(None);
        for to in [format!("http://127.0.0.1:{target}/"), format!("http://[::ffff:127.0.0.1]:{target}/"), format!("http://localhost:{target}/")] {
            let (redirector, asked) = server(Some(to.clone()));
            let biz = BizTypeConfig { callback_url: format!("http://public.test:{redirector}/hook"), ..biz(100, 100) };
            let outcome = deliver_via_public_name(CallbackHosts::PublicOnly, &biz).await;
            let error = outcome.error.unwrap_or_default();
            assert!(error.contains("is in a denied range (loopback)"), "redirect to {to}: {error}");
            assert!(matches!(outcome.verdict, Verdict::RetryAt(_)), "redirect to {to}: {:?}", outcome.verdict);
            assert_eq!(asked.load(Ordering::SeqCst), 1, "the redirecting receiver was called");
        }
        assert_eq!(reached.load(Ordering::SeqCst), 0, "a denied address was reached");

        let (redirector, _) = server(Some(format!("http://127.0.0.1:{target}/")));
        let biz = BizTypeConfig { callback_url: format!("http://public.test:{redirector}/hook"), ..biz(100, 100) };
        let outcome = deliver_via_public_name(CallbackHosts::Any, &biz).await;
        assert_eq!((outcome.verdict, outcome.status_code), (Verdict::Delivered, Some(200)), "{:?}", outcome.error);
        assert_eq!(outcome.redirected_to, Some(format!("http://127.0.0.1:{target}/")));
        assert_eq!(reached.load(Ordering::SeqCst), 1);
    }

    /// A receiver redirecting to itself (by a relative `Location`) is followed
    /// `MAX_REDIRECTS` times, no more; the attempt fails saying so and is retried.
    #[tokio::test]
    async fn a_redirect_loop_is_followed_a_bounded_number_of_times() {
        crate::engine::install_tls_provider();
        let (looping, asked) = server(Some("/again".into()));
        let biz = BizTypeConfig { callback_url: format!("http://public.test:{looping}/hook"), ..biz(100, 100) };
        let outcome = deliver_via_public_name(CallbackHosts::Any, &biz).await;
        assert_eq!(asked.load(Ordering::SeqCst), MAX_REDIRECTS + 1);
        let expected = format!("more than 5 redirects, the last (307) to http://public.test:{looping}/again");
        assert_eq!(outcome.error, Some(expected));
        assert!(matches!(outcome.verdict, Verdict::RetryAt(_)), "{:?}", outcome.verdict);
    }

    /// The breaker's input: no answer, 408, 429 and 5xx are the receiver's trouble, any other
    /// answer says it is up; only a 429 or 503 with Retry-After asks the biz type to wait.
    #[test]
    fn an_answer_says_whether_the_receiver_is_in_trouble() {
        let sent = |code: Option<i16>, retry_after: Option<u64>| Sent {
            status_code: code,
            retry_after: retry_after.map(Duration::from_secs),
            ..Sent::default()
        };
        for (code, trouble) in [
            (None, true),
            (Some(200), false),
            (Some(204), false),
            (Some(302), false),
            (Some(400), false),
            (Some(404), false),
            (Some(408), true),
            (Some(429), true),
            (Some(500), true),
            (Some(502), true),
            (Some(503), true),
        ] {
            assert_eq!(Answer::of(&sent(code, None)), Answer { trouble, slow_for: None }, "{code:?}");
        }
        assert_eq!(Answer::of(&sent(Some(429), Some(3))).slow_for, Some(Duration::from_secs(3)));
        assert_eq!(Answer::of(&sent(Some(503), Some(3))).slow_for, Some(Duration::from_secs(3)));
        assert_eq!(Answer::of(&sent(Some(500), Some(3))).slow_for, None, "a 500's Retry-After holds its task only");
    }

    #[test]
    fn snooze_is_whole_seconds_from_one_to_a_year() {
        let parse = |values: &[&str]| parse_snooze(values.iter().map(|v| v.as_bytes()));
        assert_eq!(parse(&[]), None);
        assert_eq!(parse(&["1"]), Some(Ok(1)));
        assert_eq!(parse(&[" 3600 "]), Some(Ok(3600)));
        assert_eq!(parse(&["31536000"]), Some(Ok(MAX_SNOOZE_SECS)));
        for bad in ["0", "-1", "1.5", "soon", "31536001", "", "+5", "99999999999999999999999"] {
            let error = parse(&[bad]).unwrap().unwrap_err();
            assert!(error.contains("Chime-Snooze") && error.contains(&format!("{bad:?}")), "{bad}: {error}");
        }
        assert!(parse(&["5", "6"]).unwrap().is_err(), "twice");
    }

    #[test]
    fn a_callbacks_traceparent_continues_the_creates_trace_with_a_new_span() {
        let parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let (a, b) = (child_traceparent(parent).unwrap(), child_traceparent(parent).unwrap());
        for child in [&a, &b] {
            let fields: Vec<&str> = child.split('-').collect();
            assert_eq!((fields[0], fields[1], fields[3]), ("00", "4bf92f3577b34da6a3ce929d0e0e4736", "01"), "{child}");
            assert!(fields[2].len() == 16 && fields[2] != "0000000000000000" && fields[2] != "00f067aa0ba902b7", "{child}");
        }
        assert_ne!(a, b, "each attempt has a span of its own");
        for bad in [
            "",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "nonsense",
        ] {
            assert_eq!(child_traceparent(bad), None, "{bad}");
        }
    }

    #[test]
    fn signature_is_hmac_sha256_of_time_dot_body() {
        // Reference value computed independently: printf '1700000000.{"a":1}' | openssl dgst -sha256 -hmac whsec_test
        assert_eq!(
            signature("whsec_test", 1_700_000_000, br#"{"a":1}"#),
            "t=1700000000,v1=38877139021993b830af32feea6e18a8da83eb2f6e49ee50bd9e4cf4ca4d3789"
        );
    }

    /// During a rotation's overlap the header carries the new secret's `v1` first, then the
    /// old one's, over the same `t` and body; after it, the new one's alone.
    #[test]
    fn an_overlap_signs_with_the_new_secret_then_the_old() {
        // Reference values computed independently:
        // printf '1700000000.{"a":1}' | openssl dgst -sha256 -hmac whsec_new (and -hmac whsec_test)
        let both = "t=1700000000,v1=e8dddd2062d71761004bf7a203f96314721871cce1a41057a9e2fdf6d91a3735,\
                    v1=38877139021993b830af32feea6e18a8da83eb2f6e49ee50bd9e4cf4ca4d3789";
        assert_eq!(signatures(&["whsec_new", "whsec_test"], 1_700_000_000, br#"{"a":1}"#), both);
        let at: DateTime<Utc> = DateTime::from_timestamp(1_700_000_000, 0).unwrap();
        let rotated = |until: DateTime<Utc>| BizTypeConfig {
            signing_secret: crate::biz_types::SigningSecret::Open("whsec_new".into()),
            previous_secret: crate::biz_types::PreviousSecret { overlap: Some((crate::biz_types::SigningSecret::Open("whsec_test".into()), until)) },
            ..biz(100, 100)
        };
        assert_eq!(sign(&rotated(at + chrono::TimeDelta::seconds(1)), "m", at, br#"{"a":1}"#).unwrap(), [("Chime-Signature", both.to_string())]);
        assert_eq!(
            sign(&rotated(at), "m", at, br#"{"a":1}"#).unwrap(),
            [("Chime-Signature", signature("whsec_new", 1_700_000_000, br#"{"a":1}"#))],
            "the overlap is over at its end"
        );
    }

    /// The Standard Webhooks vectors the clients' `verify_webhook` are tested on: each
    /// `signatures` entry is what the server sends, and every `v1,` a `verify` case expects
    /// to match is one the server would send for that id, time, body and one of its secrets.
    #[test]
    fn standard_signatures_produce_the_clients_shared_vectors() {
        let vectors: serde_json::Value = serde_json::from_str(include_str!("../../clients/signature-vectors.json")).expect("the vectors are JSON");
        let vectors = &vectors["standard_webhooks"];
        let signatures = vectors["signatures"].as_array().expect("a `signatures` list");
        assert!(signatures.len() >= 3);
        for v in signatures {
            let key = whsec_key(v["secret"].as_str().unwrap()).expect("a whsec_ secret");
            let ours = standard_signatures(&[&key], v["id"].as_str().unwrap(), v["t"].as_i64().unwrap(), v["body"].as_str().unwrap().as_bytes());
            assert_eq!(ours, v["signature"].as_str().unwrap(), "{}", v["name"]);
        }
        let cases = vectors["verify"].as_array().expect("a `verify` list");
        let standard = |case: &serde_json::Value, name: &str| {
            case["headers"].as_object().unwrap().iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str().unwrap().to_string())
        };
        let expected_true: Vec<_> = cases.iter().filter(|c| c["expected"] == true && standard(c, "webhook-signature").is_some()).collect();
        assert!(expected_true.len() >= 5);
        for case in expected_true {
            let (id, t) = (standard(case, "webhook-id").unwrap(), standard(case, "webhook-timestamp").unwrap().parse().unwrap());
            let sent = standard(case, "webhook-signature").unwrap();
            let secrets: Vec<&str> = match &case["secrets"] {
                serde_json::Value::String(one) => vec![one.as_str()],
                many => many.as_array().unwrap().iter().map(|s| s.as_str().unwrap()).collect(),
            };
            let signed = secrets.iter().filter_map(|s| whsec_key(s)).any(|key| {
                let ours = standard_signatures(&[&key], &id, t, case["body"].as_str().unwrap().as_bytes());
                sent.split(' ').any(|v1| v1 == ours)
            });
            assert!(signed, "{}: no v1 in the header is the server's signature with one of the secrets", case["name"]);
        }
    }

    /// The Standard Webhooks specification's own example: secret, message id, timestamp,
    /// body and the signature it gives.
    #[test]
    fn standard_signatures_are_the_specifications_example() {
        let key = whsec_key("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        assert_eq!(
            standard_signatures(&[&key], "msg_p5jXN8AQM9LWM0D4loKWxJek", 1_614_265_330, br#"{"test": 2432232314}"#),
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        );
    }

    /// A `standard-webhooks` biz type is signed with `webhook-id`, `webhook-timestamp` and
    /// `webhook-signature` only: during an overlap the new key's `v1,` then the old one's,
    /// space-separated; a previous secret not in `whsec_` form is left out; a current one
    /// not in that form cannot sign.
    #[test]
    fn standard_webhooks_headers_carry_both_signatures_during_an_overlap() {
        // Reference values computed independently: printf 'msg_2.1700000000.{"a":1}' |
        // openssl dgst -sha256 -mac HMAC -macopt hexkey:<the key's hex> -binary | base64
        let new = "whsec_Y2hpbWUtcm90YXRlZC1rZXktMDEyMzQ1Njc4OWFiY2Q=";
        let old = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
        let at: DateTime<Utc> = DateTime::from_timestamp(1_700_000_000, 0).unwrap();
        let biz = |previous: Option<&str>| BizTypeConfig {
            signing_scheme: STANDARD_WEBHOOKS.into(),
            signing_secret: crate::biz_types::SigningSecret::Open(new.into()),
            previous_secret: crate::biz_types::PreviousSecret {
                overlap: previous.map(|p| (crate::biz_types::SigningSecret::Open(p.into()), at + chrono::TimeDelta::seconds(1))),
            },
            ..biz(100, 100)
        };
        let new_v1 = "v1,apCjoVTb12dzEQYei5jtHdJ0NvxMJ1PPygd/iEmnv3A=";
        let old_v1 = standard_signatures(&[&whsec_key(old).unwrap()], "msg_2", 1_700_000_000, br#"{"a":1}"#);
        let headers = |signature: String| {
            vec![("webhook-id", "msg_2".to_string()), ("webhook-timestamp", "1700000000".into()), ("webhook-signature", signature)]
        };
        assert_eq!(sign(&biz(None), "msg_2", at, br#"{"a":1}"#).unwrap(), headers(new_v1.to_string()));
        assert_eq!(sign(&biz(Some(old)), "msg_2", at, br#"{"a":1}"#).unwrap(), headers(format!("{new_v1} {old_v1}")));
        assert_eq!(sign(&biz(Some("an-old-form-secret-0123")), "msg_2", at, br#"{"a":1}"#).unwrap(), headers(new_v1.to_string()));
        let unfit = BizTypeConfig { signing_secret: crate::biz_types::SigningSecret::Open("not-whsec-0123456789".into()), ..biz(None) };
        assert!(matches!(sign(&unfit, "msg_2", at, b"{}"), Err(SecretError::NotWhsec { .. })));
    }

    /// The vectors the three clients' `verify_signature` are tested on (clients/*/tests) hold
    /// headers this function must produce, so that the server and the clients cannot drift
    /// apart: each `signatures` entry exactly, and every `v1` a `verify` case expects to match
    /// is one the server would send for that body, time and one of the case's secrets.
    #[test]
    fn signature_produces_the_clients_shared_vectors() {
        let vectors: serde_json::Value = serde_json::from_str(include_str!("../../clients/signature-vectors.json")).expect("the vectors are JSON");
        let signatures = vectors["signatures"].as_array().expect("a `signatures` list");
        assert!(signatures.len() >= 3);
        for v in signatures {
            let t = v["t"].as_i64().expect("t");
            let body = v["body"].as_str().expect("body");
            assert_eq!(signature(v["secret"].as_str().expect("secret"), t, body.as_bytes()), v["header"].as_str().unwrap(), "{}", v["name"]);
        }
        let cases = vectors["verify"].as_array().expect("a `verify` list");
        let expected_true: Vec<_> = cases.iter().filter(|c| c["expected"] == true).collect();
        assert!(expected_true.len() >= 5 && expected_true.len() < cases.len(), "both outcomes are covered");
        for case in expected_true {
            let header = case["header"].as_str().unwrap();
            let t: i64 = header.strip_prefix("t=").and_then(|rest| rest.split(',').next()).and_then(|t| t.parse().ok()).expect("t first");
            let sent: Vec<&str> = header.split(',').filter_map(|part| part.strip_prefix("v1=")).collect();
            let secrets: Vec<&str> = match &case["secrets"] {
                serde_json::Value::String(one) => vec![one.as_str()],
                many => many.as_array().unwrap().iter().map(|s| s.as_str().unwrap()).collect(),
            };
            let signed = secrets.iter().any(|secret| {
                let ours = signature(secret, t, case["body"].as_str().unwrap().as_bytes());
                sent.contains(&ours.rsplit_once("v1=").unwrap().1)
            });
            assert!(signed, "{}: no v1 in the header is the server's signature with one of the secrets", case["name"]);
        }
    }
}
