//! Generated input against the real server and database (issue 8): bodies for every
//! endpoint that creates or changes something, and query strings for the task list, drawn
//! from JSON of every shape in every field, byte-level mutations of valid bodies (broken
//! syntax, invalid UTF-8), deep nesting, and valid bodies.
//!
//! Whatever arrives, the API answers 2xx or a 4xx in its error shape, never a 5xx. An
//! accepted request was a valid one (docs/design/contract.md, API) and is stored as sent; a valid one is
//! accepted; a refused one changes nothing; and at the end the tables hold exactly what
//! the accepted requests created.
//!
//! proptest's runner is synchronous, so it runs on a blocking thread and waits there for
//! each case's requests: a failure is still shrunk to a small input and printed.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::{Arc, Mutex};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use chrono::{DateTime, Duration, FixedOffset, TimeDelta, Utc};
use proptest::prelude::*;
use proptest::sample::{Index, select};
use proptest::test_runner::{Config, RngSeed, TestCaseError, TestRunner};
use serde_json::{Map, Value, json};

use crate::helpers::{Reply, TestApp, spawn_app, spawn_app_with};

/// Cases per endpoint: enough to reach every field with every shape, a few seconds each.
const CASES: u32 = 300;

/// A fixed seed, so that CI sends the same requests every time; PROPTEST_RNG_SEED and
/// PROPTEST_CASES search further. No failure files written into the tree.
fn config(cases: u32) -> Config {
    let default = Config::default();
    let rng_seed = match default.rng_seed {
        RngSeed::Random => RngSeed::Fixed(0x00c4_17e5),
        chosen => chosen,
    };
    let cases = if std::env::var_os("PROPTEST_CASES").is_some() { default.cases } else { cases };
    Config { cases, rng_seed, failure_persistence: None, ..default }
}

/// Runs `check` on `cases` inputs from the strategy `make` builds (on the runner's
/// thread: strategies are not `Send`); panics with the shrunk failing input.
async fn run<S, F, Fut>(cases: u32, make: impl FnOnce() -> S + Send + 'static, check: F)
where
    S: Strategy,
    F: Fn(S::Value) -> Fut + Send + 'static,
    Fut: Future<Output = Result<(), TestCaseError>>,
{
    let runtime = tokio::runtime::Handle::current();
    tokio::task::spawn_blocking(move || {
        let mut runner = TestRunner::new(config(cases));
        if let Err(e) = runner.run(&make(), |input| runtime.block_on(check(input))) {
            panic!("{e}");
        }
    })
    .await
    .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
}

// ---------------------------------------------------------------------------------------
// Generators

/// Picks one of `words`.
fn one_of(words: &'static [&'static str]) -> impl Strategy<Value = String> {
    select(words).prop_map(str::to_string)
}

/// Number literals at the edges of i64, u64, a double and PostgreSQL's numeric.
#[rustfmt::skip]
const ODD_NUMBERS: &[&str] = &[
    "0", "-0", "-0.0", "0.1", "1E+2", "1e400", "-1e400", "1e-400", "1.7976931348623157e308", "1.8e308", "5e-324",
    "9223372036854775807", "9223372036854775808", "-9223372036854775809", "18446744073709551616",
    "123456789012345678901234567890", "1e131072", "1e-16384", "0e-999999", "1e999999999",
];

/// Words the API knows, and characters that look like nothing.
#[rustfmt::skip]
const WORDS: &[&str] = &[
    "", "\0", "orders", "other", "nosuch", "Orders", "null", "2026-11-21T09:30:00Z", "0 0 9 * * *", "UTC",
    "Europe/Berlin", "\u{feff}", "\u{202e}", "a\nb",
];

/// Times at and past every edge, and near misses of RFC 3339.
#[rustfmt::skip]
const ODD_TIMES: &[&str] = &[
    "0000-01-01T00:00:00Z", "0001-01-01T00:00:00+23:59", "9999-12-31T23:59:59-23:59", "9999-12-31T23:59:60Z",
    "+275760-09-13T00:00:00Z", "294277-01-01T00:00:00Z", "-0001-01-01T00:00:00Z", "1970-01-01T00:00:00Z",
    "2262-04-11T23:47:16.854775808Z", "2026-02-30T10:00:00Z", "2026-11-21T09:30:00", "2026-11-21 09:30:00Z",
    "2026-11-21T09:30:00.0000000000001Z",
];

/// Cron's tokens and near misses: out of range, zero steps, Quartz extras.
#[rustfmt::skip]
const CRON_TOKENS: &[&str] = &[
    "*", "?", "0", "60", "-1", "4294967296", "99999999999999999999", "*/0", "1-0", "L", "W", "1#2", "MON-FRI", "",
    "2101", "1969",
];

/// Number literals: the grammar's corners, and beyond i64, u64, double and PostgreSQL's
/// numeric (whose exponent ends near ±131072 and ±16383).
fn number() -> impl Strategy<Value = Value> {
    let text = prop_oneof![
        one_of(ODD_NUMBERS),
        any::<i64>().prop_map(|n| n.to_string()),
        any::<f64>().prop_filter("JSON has no NaN or infinity", |f| f.is_finite()).prop_map(|f| format!("{f:e}")),
        "-?(0|[1-9][0-9]{0,24})(\\.[0-9]{1,24})?([eE][+-]?[0-9]{1,7})?",
    ];
    text.prop_map(|t| serde_json::from_str(&t).expect("a JSON number"))
}

/// Text with anything in it: control characters and NUL, any Unicode, and words the API
/// knows.
fn text() -> impl Strategy<Value = String> {
    prop_oneof![prop::collection::vec(any::<char>(), 0..12).prop_map(String::from_iter), "\\PC{0,12}", one_of(WORDS)]
}

/// JSON of every shape, nested a few levels.
fn json_value() -> BoxedStrategy<Value> {
    let leaf = prop_oneof![Just(Value::Null), any::<bool>().prop_map(Value::Bool), number(), text().prop_map(Value::String)];
    leaf.prop_recursive(4, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::vec((text(), inner), 0..4).prop_map(|fields| Value::Object(fields.into_iter().collect())),
        ]
    })
    .boxed()
}

/// Arrays or objects nested around the JSON parser's limit (128 levels).
fn deep_value() -> impl Strategy<Value = Value> {
    (100usize..140, any::<bool>())
        .prop_map(|(depth, objects)| (0..depth).fold(json!(1), |inner, _| if objects { json!({"a": inner}) } else { json!([inner]) }))
}

/// A payload the API must accept (see `storable`).
fn valid_payload() -> impl Strategy<Value = Value> {
    json_value().prop_filter("storable", storable)
}

/// A payload: any JSON, sometimes deeply nested.
fn payload() -> impl Strategy<Value = Value> {
    prop_oneof![9 => json_value(), 1 => deep_value()]
}

/// A time as RFC 3339 text in a random zone.
fn rfc3339(t: DateTime<Utc>, offset_minutes: i32) -> String {
    t.with_timezone(&FixedOffset::east_opt(offset_minutes * 60).unwrap()).to_rfc3339()
}

/// A run_at the API accepts while the test runs: from an hour ago to a year ahead of `start`.
fn good_time(start: DateTime<Utc>) -> impl Strategy<Value = String> {
    (-3600i64..366 * 86_400, -1439i32..=1439).prop_map(move |(secs, offset)| rfc3339(start + Duration::seconds(secs), offset))
}

/// Time-like text at and past every edge: years 0000 and 9999, leap seconds, impossible
/// dates, no zone, and instants beyond chrono's and PostgreSQL's ranges.
fn odd_time() -> impl Strategy<Value = String> {
    let made = ((0u32..=9999, 0u32..=13, 0u32..=32), (0u32..=24, 0u32..=60, 0u32..=60), "Z|z|[+-](0[0-9]|1[0-9]|2[0-4]):[0-5][0-9]|")
        .prop_map(|((y, mo, d), (h, mi, s), zone)| format!("{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}{zone}"));
    let edges = one_of(ODD_TIMES);
    prop_oneof![made, edges]
}

/// A valid object with one or two of its fields replaced (by the field's odd values, or
/// any JSON) or removed, or an unknown field added: each field's checks meet every shape
/// while the rest of the request is valid.
fn tweaked(valid: impl Strategy<Value = Value>, fields: Vec<(&'static str, BoxedStrategy<Value>)>) -> impl Strategy<Value = Value> {
    let mut edits: Vec<BoxedStrategy<(String, Option<Value>)>> = fields
        .into_iter()
        .map(|(name, odd)| {
            let value = prop_oneof![3 => odd, 1 => json_value()];
            prop::option::weighted(0.9, value).prop_map(move |v| (name.to_string(), v)).boxed()
        })
        .collect();
    edits.push((text(), json_value()).prop_map(|(name, v)| (name, Some(v))).boxed());
    (valid, prop::collection::vec(proptest::strategy::Union::new(edits), 1..=2)).prop_map(|(mut object, edits)| {
        for (name, value) in edits {
            match value {
                Some(value) => object[name.as_str()] = value,
                None => {
                    object.as_object_mut().map(|o| o.remove(&name));
                }
            }
        }
        object
    })
}

fn bytes(v: &Value) -> Vec<u8> {
    v.to_string().into_bytes()
}

/// A valid body with a few bytes replaced, inserted or removed, or cut short: broken
/// syntax, stray control bytes, invalid UTF-8.
fn mutated(valid: impl Strategy<Value = Value>) -> impl Strategy<Value = Vec<u8>> {
    let byte = prop_oneof![any::<u8>(), select(b"\"{}[],:\\\x00\x7f\x80\xc0\xc3\xed\xff".to_vec())];
    (valid, prop::collection::vec((any::<Index>(), byte, 0u8..4), 1..4)).prop_map(|(valid, edits)| {
        let mut body = bytes(&valid);
        for (at, byte, edit) in edits {
            let i = at.index(body.len() + 1);
            match edit {
                0 if i < body.len() => body[i] = byte,
                1 => body.insert(i, byte),
                2 if i < body.len() => {
                    body.remove(i);
                }
                3 => body.truncate(i),
                _ => {}
            }
        }
        body
    })
}

/// A request body and whether it is valid (then the API must accept it).
#[derive(Clone)]
struct Body {
    bytes: Vec<u8>,
    valid: bool,
}

/// Shown as the bytes sent, escaped where they are not printable ASCII.
impl std::fmt::Debug for Body {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} body b\"{}\"", if self.valid { "valid" } else { "generated" }, self.bytes.escape_ascii())
    }
}

/// Bodies of every kind: valid ones from `valid`, valid ones with fields changed from
/// `mixed`, any JSON, and mutated bytes of valid ones.
fn bodies(valid: impl Strategy<Value = Value> + 'static, mixed: impl Strategy<Value = Value> + 'static) -> impl Strategy<Value = Body> {
    let valid = valid.boxed();
    let body = |s: BoxedStrategy<Vec<u8>>, valid| s.prop_map(move |bytes| Body { bytes, valid });
    prop_oneof![
        2 => body(valid.clone().prop_map(|v| bytes(&v)).boxed(), true),
        5 => body(mixed.prop_map(|v| bytes(&v)).boxed(), false),
        1 => body(json_value().prop_map(|v| bytes(&v)).boxed(), false),
        2 => body(mutated(valid).boxed(), false),
    ]
}

fn string(s: impl Strategy<Value = String>) -> impl Strategy<Value = Value> {
    s.prop_map(Value::String)
}

/// A key: from a small pool (so repeats and conflicts happen), fresh, long, or any text.
fn key() -> impl Strategy<Value = Value> {
    string(prop_oneof![select(vec!["k1", "k2", "k3"]).prop_map(str::to_string), "[a-z0-9-]{1,24}", "[a-z]{200,300}", text()])
}

fn biz_type() -> BoxedStrategy<Value> {
    let others = select(vec!["other", "nosuch", "Orders", "", "ord\0ers"]).prop_map(|name| json!(name));
    prop_oneof![6 => Just(json!("orders")), 1 => others].boxed()
}

fn delay_ms() -> impl Strategy<Value = Value> {
    prop_oneof![(0i64..1_000_000_000).prop_map(Value::from), number()]
}

/// Odd values for the fields of a task create, or of a task PATCH (without biz_type and key).
fn task_fields(start: DateTime<Utc>, create: bool) -> Vec<(&'static str, BoxedStrategy<Value>)> {
    let mut fields = vec![
        ("run_at", string(prop_oneof![good_time(start), odd_time(), text()]).boxed()),
        ("delay_ms", delay_ms().boxed()),
        ("payload", payload().boxed()),
    ];
    if create {
        fields.push(("biz_type", biz_type()));
        fields.push(("key", key().boxed()));
    }
    fields
}

/// A valid task create: at most one time field, a storable payload, maybe a key (some
/// from a small pool: a different request with a taken key is answered 409).
fn valid_task(start: DateTime<Utc>) -> impl Strategy<Value = Value> {
    let when = prop_oneof![
        Just(None),
        good_time(start).prop_map(|t| Some(("run_at", json!(t)))),
        (0i64..1_000_000_000).prop_map(|d| Some(("delay_ms", json!(d)))),
    ];
    let key = prop_oneof![3 => "[a-z0-9]{16}", 1 => select(vec!["k1", "k2", "k3"]).prop_map(str::to_string)];
    (prop::option::of(key), when, prop::option::of(valid_payload())).prop_map(|(key, when, payload)| {
        let mut task = json!({"biz_type": "orders"});
        if let Some(key) = key {
            task["key"] = json!(key);
        }
        if let Some((name, value)) = when {
            task[name] = value;
        }
        if let Some(payload) = payload {
            task["payload"] = payload;
        }
        task
    })
}

// ---------------------------------------------------------------------------------------
// Checks

/// A reply is a success or a 4xx in the API's error shape; never a 5xx.
fn check_reply(reply: &Reply) -> Result<(), TestCaseError> {
    prop_assert!(reply.status < 500, "answered {}: {}", reply.status, reply.body);
    if reply.status >= 400 {
        check_error(&reply.body["error"])?;
    }
    Ok(())
}

fn check_error(error: &Value) -> Result<(), TestCaseError> {
    let non_empty = |name: &str| error[name].as_str().is_some_and(|s| !s.is_empty());
    prop_assert!(non_empty("code") && non_empty("message"), "not the API's error shape: {error}");
    Ok(())
}

fn time(v: &Value) -> DateTime<Utc> {
    v.as_str().and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("not a time: {v}"))
}

/// Whether the API may accept a payload: no NUL (PostgreSQL's text cannot hold it), and
/// numbers that PostgreSQL keeps at about the size they were sent: an exponent within a
/// double's (±308) and at most 16383 digits after the point (numeric's limit).
fn storable(payload: &Value) -> bool {
    match payload {
        Value::String(s) => !s.contains('\0'),
        Value::Number(n) => {
            let text = n.to_string();
            let (mantissa, exponent) = text.split_once(['e', 'E']).unwrap_or((&text, "0"));
            let decimals = mantissa.split_once('.').map_or(0, |(_, d)| d.len() as i64);
            exponent.parse::<i64>().is_ok_and(|e| e.abs() <= 308 && decimals - e <= 16383)
        }
        Value::Array(items) => items.iter().all(storable),
        Value::Object(fields) => fields.iter().all(|(name, value)| !name.contains('\0') && storable(value)),
        Value::Bool(_) | Value::Null => true,
    }
}

fn check_payload(payload: &Value) -> Result<(), TestCaseError> {
    prop_assert!(storable(payload), "accepted the payload {payload}");
    Ok(())
}

/// A key the API may accept: 1 to `max` bytes, no control characters.
fn check_key(key: &Value, max: usize) -> Result<(), TestCaseError> {
    let key = key.as_str().unwrap_or_default();
    prop_assert!((1..=max).contains(&key.len()) && !key.chars().any(char::is_control), "accepted the key {key:?}");
    Ok(())
}

fn check_fields(sent: &Map<String, Value>, allowed: &[&str]) -> Result<(), TestCaseError> {
    let unknown: Vec<&String> = sent.keys().filter(|k| !allowed.contains(&k.as_str())).collect();
    prop_assert!(unknown.is_empty(), "accepted unknown fields {unknown:?}");
    Ok(())
}

/// Whether `query`, given `first` and the JSON sent, is true. It compares JSON as
/// PostgreSQL compares jsonb: numbers by value (`1.50` is `1.5`, `-0` is `0`).
async fn db_says(app: &TestApp, query: &str, first: &str, sent: &Value) -> bool {
    sqlx::query_scalar(sqlx::AssertSqlSafe(query.to_string())).bind(first).bind(sent.to_string()).fetch_one(&app.pool).await.unwrap()
}

/// The run_at a task was given: as sent, after the delay, or now; the delay is resolved
/// by the database clock between `before` and `after`.
fn check_run_at(sent: &Map<String, Value>, got: DateTime<Utc>, before: DateTime<Utc>, after: DateTime<Utc>) -> Result<(), TestCaseError> {
    let slack = Duration::seconds(2);
    match (sent.get("run_at").filter(|v| !v.is_null()), sent.get("delay_ms").filter(|v| !v.is_null())) {
        (Some(_), Some(_)) => prop_assert!(false, "accepted both run_at and delay_ms"),
        (Some(at), None) => {
            // PostgreSQL keeps microseconds: a finer time is rounded.
            let at = at.as_str().and_then(|s| DateTime::parse_from_rfc3339(s).ok());
            prop_assert!(at.is_some_and(|at| (got - at.with_timezone(&Utc)).abs() < TimeDelta::microseconds(1)), "run_at {got} for {at:?}");
            prop_assert!(got >= before - Duration::days(1) - slack && got <= after + Duration::days(3660) + slack, "accepted run_at {got}");
        }
        (None, delay) => {
            let delay = delay.map_or(Some(0), |d| d.as_i64()).filter(|d| (0..=Duration::days(3660).num_milliseconds()).contains(d));
            prop_assert!(delay.is_some(), "accepted delay_ms {:?}", sent.get("delay_ms"));
            let delay = TimeDelta::milliseconds(delay.unwrap());
            prop_assert!(got >= before + delay - slack && got <= after + delay + slack, "run_at {got} for a delay of {delay}");
        }
    }
    Ok(())
}

/// What the API has created: checked against the tables at the end.
#[derive(Default)]
struct Created {
    /// Ids of the tasks (or timers) answered with 201.
    ids: HashSet<String>,
    /// Each key taken, with the request that took it (a repeat must equal it).
    keys: HashMap<String, Value>,
}

/// One biz type's view of the API under test.
struct Fixture {
    app: TestApp,
    token: String,
    start: DateTime<Utc>,
    created: Mutex<Created>,
}

impl Fixture {
    async fn new(app: TestApp) -> Arc<Fixture> {
        let token = app.biz_type("orders").await;
        app.biz_type("other").await;
        Arc::new(Fixture { app, token, start: Utc::now(), created: Mutex::default() })
    }

    async fn send(&self, method: &str, path: &str, body: &[u8]) -> Reply {
        self.app.request(method, path, Some(&self.token), Some(body.to_vec())).await
    }

    /// Checks one create's outcome (a whole request's or a batch item's): 201 stores a
    /// valid request as sent; 200 repeats a keyed request exactly; 409 is a key taken by
    /// another request; anything else is a 4xx error.
    async fn check_task_created(
        &self,
        sent: &Value,
        status: u16,
        task: &Value,
        error: &Value,
        when: (DateTime<Utc>, DateTime<Utc>),
    ) -> Result<(), TestCaseError> {
        let key = sent.get("key").filter(|k| !k.is_null()).and_then(Value::as_str);
        let taken_by = key.and_then(|k| self.created.lock().unwrap().keys.get(k).cloned());
        match status {
            201 => {
                // Recorded first, so that a failed check below does not hide the task from
                // the cases that follow (proptest's shrinking among them).
                let id = task["id"].as_str().unwrap();
                {
                    let mut created = self.created.lock().unwrap();
                    created.ids.insert(id.to_string());
                    if let Some(k) = key {
                        created.keys.insert(k.to_string(), sent.clone());
                    }
                }
                let fields = sent.as_object().expect("an accepted request is an object");
                check_fields(fields, &["biz_type", "key", "run_at", "delay_ms", "payload"])?;
                prop_assert_eq!(&sent["biz_type"], &json!("orders"));
                if let Some(k) = fields.get("key").filter(|k| !k.is_null()) {
                    check_key(k, 256)?;
                }
                prop_assert!(taken_by.is_none(), "201 for a key already taken");
                let payload = fields.get("payload").cloned().unwrap_or(Value::Null);
                check_payload(&payload)?;
                check_run_at(fields, time(&task["run_at"]), when.0, when.1)?;
                prop_assert_eq!((&task["biz_type"], &task["status"]), (&json!("orders"), &json!("pending")));
                prop_assert_eq!(&task["key"], &key.map_or(Value::Null, |k| json!(k)));
                let answered = db_says(&self.app, "SELECT $1::jsonb = $2::jsonb", &task["payload"].to_string(), &payload).await;
                prop_assert!(answered, "the payload answered {} is the one sent", task["payload"]);
                let stored = db_says(&self.app, "SELECT payload = $2::jsonb FROM all_tasks WHERE id = $1::uuid", id, &payload).await;
                prop_assert!(stored, "the payload stored is the one sent");
            }
            200 => {
                prop_assert_eq!(taken_by.as_ref(), Some(sent), "200 is only for a repeat of the request that took the key");
                let id = task["id"].as_str().unwrap_or_default();
                prop_assert!(self.created.lock().unwrap().ids.contains(id), "200 with a task never created: {task}");
            }
            409 => {
                check_error(error)?;
                prop_assert!(taken_by.is_some_and(|first| first != *sent), "409 without a key taken by another request");
            }
            _ => {
                prop_assert!((400..500).contains(&status) && status != 409, "answered {status}");
                check_error(error)?;
            }
        }
        Ok(())
    }

    /// The tables hold exactly the tasks answered with 201, and their keys.
    async fn check_only_accepted_tasks_exist(&self) {
        let ids: Vec<String> = sqlx::query_scalar("SELECT id::text FROM all_tasks").fetch_all(&self.app.pool).await.unwrap();
        let keys: Vec<String> = sqlx::query_scalar("SELECT key FROM task_keys").fetch_all(&self.app.pool).await.unwrap();
        let created = self.created.lock().unwrap();
        assert_eq!(ids.into_iter().collect::<HashSet<_>>(), created.ids, "the tasks are those created");
        assert_eq!(keys.into_iter().collect::<HashSet<_>>(), created.keys.keys().cloned().collect(), "the keys are those taken");
    }
}

// ---------------------------------------------------------------------------------------
// Tasks

/// POST /api/v1/tasks with bodies of every kind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn task_create_takes_valid_bodies_and_refuses_the_rest_cleanly() {
    let fx = Fixture::new(spawn_app().await).await;
    let start = fx.start;
    let f = fx.clone();
    let strategy = move || bodies(valid_task(start), tweaked(valid_task(start), task_fields(start, true)));
    run(CASES, strategy, move |body: Body| {
        let fx = f.clone();
        async move {
            let before = Utc::now();
            let reply = fx.send("POST", "/api/v1/tasks", &body.bytes).await;
            let after = Utc::now();
            check_reply(&reply)?;
            let sent: Option<Value> = serde_json::from_slice(&body.bytes).ok();
            if body.valid {
                prop_assert!(matches!(reply.status, 200 | 201 | 409), "refused a valid body: {} {}", reply.status, reply.body);
            }
            let Some(sent) = sent else {
                prop_assert_eq!(reply.status, 400, "not JSON: {}", reply.body);
                return Ok(());
            };
            fx.check_task_created(&sent, reply.status, &reply.body, &reply.body["error"], (before, after)).await?;
            if reply.status == 201 && sent.get("key").is_some_and(|k| !k.is_null()) {
                let again = fx.send("POST", "/api/v1/tasks", &body.bytes).await;
                prop_assert_eq!(again.status, 200, "a keyed request sent again: {}", again.body);
                prop_assert_eq!(&again.body["id"], &reply.body["id"], "a repeat answers with the task first created");
            }
            Ok(())
        }
    })
    .await;
    fx.check_only_accepted_tasks_exist().await;
}

/// POST /api/v1/tasks/batch: each item answered on its own, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn task_batch_answers_each_item_and_refuses_bad_bodies_cleanly() {
    let fx = Fixture::new(spawn_app().await).await;
    let start = fx.start;
    let strategy = move || {
        let item = prop_oneof![valid_task(start), tweaked(valid_task(start), task_fields(start, true)), json_value()];
        let items = prop::collection::vec(item, 0..6).prop_map(Value::Array).boxed();
        let valid_batch = || prop::collection::vec(valid_task(start), 1..6).prop_map(|tasks| json!({"tasks": tasks}));
        bodies(valid_batch(), tweaked(valid_batch(), vec![("tasks", items)]))
    };
    let f = fx.clone();
    run(CASES, strategy, move |body: Body| {
        let fx = f.clone();
        async move {
            let before = Utc::now();
            let reply = fx.send("POST", "/api/v1/tasks/batch", &body.bytes).await;
            let after = Utc::now();
            check_reply(&reply)?;
            if body.valid {
                prop_assert_eq!(reply.status, 200, "refused a valid batch: {}", reply.body);
            }
            if reply.status != 200 {
                return Ok(());
            }
            let sent: Value = serde_json::from_slice(&body.bytes).unwrap();
            let fields = sent.as_object().expect("an accepted batch is an object");
            check_fields(fields, &["tasks"])?;
            let items = sent["tasks"].as_array().expect("tasks is an array");
            let results = reply.body["results"].as_array().expect("results");
            prop_assert!(!items.is_empty() && results.len() == items.len(), "{} results for {} items", results.len(), items.len());
            for (item, result) in items.iter().zip(results) {
                let status = result["status"].as_u64().unwrap_or_default() as u16;
                if body.valid {
                    prop_assert!(matches!(status, 200 | 201 | 409), "refused a valid item: {result}");
                }
                fx.check_task_created(item, status, &result["task"], &result["error"], (before, after)).await?;
            }
            Ok(())
        }
    })
    .await;
    fx.check_only_accepted_tasks_exist().await;
}

/// PATCH /api/v1/tasks/{id}: an accepted change is the one sent; a refused one changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn task_patch_applies_valid_changes_and_refuses_the_rest_cleanly() {
    let fx = Fixture::new(spawn_app().await).await;
    let task = fx.app.create_task(&fx.token, json!({"biz_type": "orders", "delay_ms": 600_000, "payload": {"n": 1}})).await;
    let path = format!("/api/v1/tasks/{}", task["id"].as_str().unwrap());
    fx.created.lock().unwrap().ids.insert(task["id"].as_str().unwrap().to_string());
    let start = fx.start;
    let strategy = move || {
        let valid = || {
            prop_oneof![
                good_time(start).prop_map(|t| json!({"run_at": t})),
                (0i64..1_000_000_000).prop_map(|d| json!({"delay_ms": d})),
                valid_payload().prop_map(|p| json!({"payload": p})),
                (good_time(start), valid_payload()).prop_map(|(t, p)| json!({"run_at": t, "payload": p})),
            ]
        };
        bodies(valid(), tweaked(valid(), task_fields(start, false)))
    };
    let f = fx.clone();
    run(CASES, strategy, move |body: Body| {
        let (fx, path) = (f.clone(), path.clone());
        async move {
            let old = fx.app.get(&path, &fx.token).await.body;
            let before = Utc::now();
            let reply = fx.send("PATCH", &path, &body.bytes).await;
            let after = Utc::now();
            check_reply(&reply)?;
            if body.valid {
                prop_assert_eq!(reply.status, 200, "refused a valid change: {}", reply.body);
            }
            if reply.status != 200 {
                let now = fx.app.get(&path, &fx.token).await.body;
                prop_assert_eq!(now, old, "a refused change changed the task");
                return Ok(());
            }
            let sent: Value = serde_json::from_slice(&body.bytes).unwrap();
            let fields = sent.as_object().expect("an accepted change is an object");
            check_fields(fields, &["run_at", "delay_ms", "payload"])?;
            let task = &reply.body;
            prop_assert_eq!(&task["status"], &json!("pending"));
            if fields.get("run_at").is_some_and(|v| !v.is_null()) || fields.get("delay_ms").is_some_and(|v| !v.is_null()) {
                check_run_at(fields, time(&task["run_at"]), before, after)?;
            } else {
                prop_assert_eq!(&task["run_at"], &old["run_at"], "run_at kept");
            }
            let payload = fields.get("payload").unwrap_or(&old["payload"]);
            check_payload(payload)?;
            let stored =
                db_says(&fx.app, "SELECT payload = $2::jsonb FROM all_tasks WHERE id = $1::uuid", task["id"].as_str().unwrap(), payload).await;
            prop_assert!(stored, "the payload stored is the one sent (or kept)");
            Ok(())
        }
    })
    .await;
    fx.check_only_accepted_tasks_exist().await;
}

/// A list query's parameters: the known names, with good, odd and any values, form-encoded
/// byte by byte (so invalid UTF-8 too), or raw query text; and whether it is valid.
fn list_query() -> impl Strategy<Value = (String, bool)> {
    let cursor_time = prop_oneof![odd_time(), Just("2026-11-21T09:30:00.000000Z".to_string())];
    let cursor = (cursor_time, any::<u128>()).prop_map(|(t, id)| URL_SAFE_NO_PAD.encode(format!("{t}|{}", uuid::Uuid::from_u128(id))));
    let value = |good: BoxedStrategy<String>| {
        let bytes = prop::collection::vec(any::<u8>(), 0..6);
        prop_oneof![3 => good.prop_map(String::into_bytes), 1 => text().prop_map(String::into_bytes), 1 => bytes]
    };
    let names: Vec<(&str, BoxedStrategy<String>)> = vec![
        ("biz_type", select(vec!["orders", "other", "nosuch"]).prop_map(str::to_string).boxed()),
        ("status", select(vec!["pending", "running", "succeeded", "failed", "cancelled", "done"]).prop_map(str::to_string).boxed()),
        ("from", prop_oneof![odd_time(), Just("2026-01-01T00:00:00Z".to_string())].boxed()),
        ("to", prop_oneof![odd_time(), Just("2036-01-01T00:00:00Z".to_string())].boxed()),
        ("limit", prop_oneof![(1i64..=1000).prop_map(|n| n.to_string()), any::<i64>().prop_map(|n| n.to_string()), Just("1e3".to_string())].boxed()),
        ("cursor", cursor.boxed()),
    ];
    let params: Vec<_> = names
        .into_iter()
        .map(|(name, good)| prop::option::weighted(0.4, value(good)).prop_map(move |v| v.map(|v| (name.as_bytes().to_vec(), v))))
        .collect();
    let encoded = (params, prop::option::weighted(0.1, (text().prop_map(String::into_bytes), text().prop_map(String::into_bytes)))).prop_map(
        |(params, extra)| {
            let encode = |b: &[u8]| url::form_urlencoded::byte_serialize(b).collect::<String>();
            let pairs: Vec<String> = params.into_iter().flatten().chain(extra).map(|(n, v)| format!("{}={}", encode(&n), encode(&v))).collect();
            (pairs.join("&"), false)
        },
    );
    let raw = "[ -~]{0,30}".prop_map(|raw| (raw, false));
    prop_oneof![4 => encoded, 1 => raw, 1 => Just(("limit=5&status=pending".to_string(), true))]
}

/// GET /api/v1/tasks with any query string: a page of the caller's tasks, or a clean 4xx.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn task_list_answers_any_query_cleanly() {
    let fx = Fixture::new(spawn_app().await).await;
    for delay in [0, 60_000, 86_400_000 * 5] {
        fx.app.create_task(&fx.token, json!({"biz_type": "orders", "delay_ms": delay})).await;
    }
    let f = fx.clone();
    run(CASES, list_query, move |(query, valid)| {
        let fx = f.clone();
        async move {
            // The query as it goes on the wire (the URL parser trims and encodes some text).
            let url = url::Url::parse(&format!("http://chime/api/v1/tasks?{query}")).unwrap();
            let sent = url.query().unwrap_or_default();
            let reply = fx.app.get(&format!("/api/v1/tasks?{sent}"), &fx.token).await;
            check_reply(&reply)?;
            if valid {
                prop_assert_eq!(reply.status, 200, "refused a valid query: {}", reply.body);
            }
            if reply.status != 200 {
                return Ok(());
            }
            let items = reply.body["items"].as_array().expect("items");
            prop_assert!(items.iter().all(|t| t["biz_type"] == "orders"), "another biz type's task listed");
            prop_assert!(reply.body["next_cursor"].is_null() || reply.body["next_cursor"].is_string());
            // An accepted query named only known parameters, and the page obeys each.
            for (name, value) in url::form_urlencoded::parse(sent.as_bytes()) {
                let run_ats = || items.iter().map(|t| time(&t["run_at"]));
                let obeyed = match &*name {
                    "biz_type" => value == "orders",
                    "status" => items.iter().all(|t| t["status"] == *value),
                    "limit" => value.parse::<usize>().is_ok_and(|limit| items.len() <= limit),
                    "from" => DateTime::parse_from_rfc3339(&value).is_ok_and(|from| run_ats().all(|t| t >= from)),
                    "to" => DateTime::parse_from_rfc3339(&value).is_ok_and(|to| run_ats().all(|t| t < to)),
                    "cursor" => true,
                    _ => false,
                };
                prop_assert!(obeyed, "accepted {name}={value:?} and answered {}", reply.body["items"]);
            }
            Ok(())
        }
    })
    .await;
}

// ---------------------------------------------------------------------------------------
// Timers

/// Cron text: valid expressions (firing at most a few times a minute, so that the
/// leader's occurrences stay few), and cron's tokens with near misses.
fn cron() -> impl Strategy<Value = String> {
    let valid = (
        "[0-5]?[0-9]",
        "\\*|[0-5]?[0-9]|\\*/[1-9]",
        "\\*|1?[0-9]|2[0-3]",
        "\\*|[1-9]|[12][0-9]|3[01]|\\?",
        "\\*|[1-9]|1[0-2]|JAN-JUN",
        "\\*|\\?|[1-7]|Mon-Fri",
    )
        .prop_map(|(s, m, h, dom, mon, dow)| format!("{s} {m} {h} {dom} {mon} {dow}"));
    let token = prop_oneof![one_of(CRON_TOKENS), "[0-9*/,?LW#A-Za-z-]{1,6}",];
    let near = prop::collection::vec(token, 0..=8).prop_map(|fields| fields.join(" "));
    prop_oneof![3 => valid.clone(), 1 => valid.prop_map(|c| format!("{c} 2099")), 2 => near]
}

fn zone() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => select(chrono_tz::TZ_VARIANTS.to_vec()).prop_map(|z| z.name().to_string()),
        1 => select(vec!["UTC", "utc", "Mars/Olympus", "+08:00", "EST5EDT", "Etc/GMT+12", "Europe/Berlin\0"])
            .prop_map(str::to_string),
    ]
}

/// A valid timer create with a fresh key.
fn valid_timer() -> impl Strategy<Value = Value> {
    let zone = select(chrono_tz::TZ_VARIANTS.to_vec());
    ("[a-z0-9]{16}", "[0-5]?[0-9]", zone, any::<bool>(), valid_payload()).prop_map(|(key, second, tz, active, payload)| {
        let cron = format!("{second} 0 9 * * Mon-Fri");
        json!({"biz_type": "orders", "key": key, "cron": cron, "timezone": tz.name(), "active": active, "payload": payload})
    })
}

/// Odd values for the fields of a timer create, or of a timer PATCH (without biz_type and key).
fn timer_fields(create: bool) -> Vec<(&'static str, BoxedStrategy<Value>)> {
    let mut fields = vec![
        ("cron", string(prop_oneof![cron(), text()]).boxed()),
        ("timezone", string(zone()).boxed()),
        ("payload", payload().boxed()),
        ("active", any::<bool>().prop_map(Value::Bool).boxed()),
        ("catch_up", any::<bool>().prop_map(Value::Bool).boxed()),
    ];
    if create {
        fields.push(("biz_type", biz_type()));
        fields.push(("key", key().boxed()));
    }
    fields
}

/// A timer's fields that only a change may alter (not the leader's `materialized_until`,
/// nor the next fire times, which move with the clock).
fn timer_state(timer: &Value) -> Value {
    let mut state = timer.clone();
    for moving in ["materialized_until", "next_fire_times"] {
        state.as_object_mut().map(|o| o.remove(moving));
    }
    state
}

/// Checks an accepted timer against the request: its fields are those sent (or kept from
/// `old`, or the defaults), and an active one fires again, at increasing future times.
async fn check_timer(fx: &Fixture, sent: &Map<String, Value>, timer: &Value, old: &Value, before: DateTime<Utc>) -> Result<(), TestCaseError> {
    let given = |name: &str| sent.get(name).filter(|v| !v.is_null());
    for (name, default) in [("cron", &old["cron"]), ("timezone", &old["timezone"]), ("active", &old["active"]), ("catch_up", &old["catch_up"])] {
        prop_assert_eq!(&timer[name], given(name).unwrap_or(default), "{} as sent", name);
    }
    let payload = sent.get("payload").unwrap_or(&old["payload"]);
    check_payload(payload)?;
    let stored = db_says(&fx.app, "SELECT payload = $2::jsonb FROM timers WHERE id = $1::uuid", timer["id"].as_str().unwrap(), payload).await;
    prop_assert!(stored, "the payload stored is the one sent");
    let fires: Vec<DateTime<Utc>> = timer["next_fire_times"].as_array().expect("next_fire_times").iter().map(time).collect();
    if timer["active"] == true {
        prop_assert!(!fires.is_empty() && fires.len() <= 5, "{fires:?}");
    }
    prop_assert!(fires.windows(2).all(|w| w[0] < w[1]) && fires.iter().all(|t| *t > before - Duration::seconds(1)), "{fires:?}");
    Ok(())
}

/// The settings of a timer app: the leader writes occurrences only 10 s ahead.
async fn timer_app() -> TestApp {
    spawn_app_with(chime::config::ServeArgs { engine: false, timer_window_secs: 10, ..Default::default() }).await
}

/// POST /api/v1/timers with bodies of every kind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timer_create_takes_valid_bodies_and_refuses_the_rest_cleanly() {
    let fx = Fixture::new(timer_app().await).await;
    let f = fx.clone();
    let strategy = || bodies(valid_timer(), tweaked(valid_timer(), timer_fields(true)));
    run(CASES, strategy, move |body: Body| {
        let fx = f.clone();
        async move {
            let before = Utc::now();
            let reply = fx.send("POST", "/api/v1/timers", &body.bytes).await;
            check_reply(&reply)?;
            let sent: Option<Value> = serde_json::from_slice(&body.bytes).ok();
            let key = sent.as_ref().and_then(|s| s.get("key")).and_then(Value::as_str).map(str::to_string);
            let taken = key.as_ref().is_some_and(|k| fx.created.lock().unwrap().keys.contains_key(k));
            if body.valid {
                prop_assert!(reply.status == 201 || (reply.status == 409 && taken), "refused a valid timer: {} {}", reply.status, reply.body);
            }
            if reply.status == 409 {
                prop_assert!(taken, "409 for a key not taken: {}", reply.body);
            }
            if reply.status != 201 {
                return Ok(());
            }
            let sent = sent.unwrap();
            {
                // Recorded first, as for tasks.
                let mut created = fx.created.lock().unwrap();
                created.ids.insert(reply.body["id"].as_str().unwrap().to_string());
                created.keys.insert(key.clone().unwrap_or_default(), sent.clone());
            }
            let fields = sent.as_object().expect("an accepted timer is an object");
            check_fields(fields, &["biz_type", "key", "cron", "timezone", "payload", "active", "catch_up"])?;
            prop_assert_eq!(&sent["biz_type"], &json!("orders"));
            check_key(&sent["key"], 235)?;
            prop_assert!(!taken, "201 for a key already taken");
            prop_assert_eq!(&reply.body["key"], &sent["key"]);
            let defaults = json!({"timezone": "UTC", "active": true, "catch_up": false, "payload": null, "cron": null});
            check_timer(&fx, fields, &reply.body, &defaults, before).await
        }
    })
    .await;
    let ids: Vec<String> = sqlx::query_scalar("SELECT id::text FROM timers").fetch_all(&fx.app.pool).await.unwrap();
    assert_eq!(ids.into_iter().collect::<HashSet<_>>(), fx.created.lock().unwrap().ids, "the timers are those created");
    let strays: i64 = sqlx::query_scalar("SELECT count(*) FROM all_tasks WHERE timer_id IS NULL OR timer_id NOT IN (SELECT id FROM timers)")
        .fetch_one(&fx.app.pool)
        .await
        .unwrap();
    assert_eq!(strays, 0, "every task is an occurrence of a timer created");
}

/// PATCH /api/v1/timers/{id}: an accepted change is the one sent; a refused one changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timer_patch_applies_valid_changes_and_refuses_the_rest_cleanly() {
    let fx = Fixture::new(timer_app().await).await;
    let timer = fx.app.post("/api/v1/timers", &fx.token, json!({"biz_type": "orders", "key": "daily", "cron": "0 0 9 * * *"})).await;
    assert_eq!(timer.status, 201, "{}", timer.body);
    let path = format!("/api/v1/timers/{}", timer.body["id"].as_str().unwrap());
    let strategy = || {
        let valid = || {
            prop_oneof![
                cron()
                    .prop_filter("a valid one", |c| chime::timers::Schedule::parse(c, "UTC").is_ok_and(|s| !s.next(Utc::now(), 1).is_empty()))
                    .prop_map(|c| json!({"cron": c})),
                select(chrono_tz::TZ_VARIANTS.to_vec()).prop_map(|z| json!({"timezone": z.name()})),
                (any::<bool>(), any::<bool>()).prop_map(|(a, c)| json!({"active": a, "catch_up": c})),
                valid_payload().prop_map(|p| json!({"payload": p})),
            ]
        };
        bodies(valid(), tweaked(valid(), timer_fields(false)))
    };
    let f = fx.clone();
    run(CASES, strategy, move |body: Body| {
        let (fx, path) = (f.clone(), path.clone());
        async move {
            let old = fx.app.get(&path, &fx.token).await.body;
            let before = Utc::now();
            let reply = fx.send("PATCH", &path, &body.bytes).await;
            check_reply(&reply)?;
            if body.valid {
                prop_assert_eq!(reply.status, 200, "refused a valid change: {}", reply.body);
            }
            if reply.status != 200 {
                let now = fx.app.get(&path, &fx.token).await.body;
                prop_assert_eq!(timer_state(&now), timer_state(&old), "a refused change changed the timer");
                return Ok(());
            }
            let sent: Value = serde_json::from_slice(&body.bytes).unwrap();
            let fields = sent.as_object().expect("an accepted change is an object");
            check_fields(fields, &["cron", "timezone", "payload", "active", "catch_up"])?;
            check_timer(&fx, fields, &reply.body, &old, before).await
        }
    })
    .await;
}
