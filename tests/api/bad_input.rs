//! Every kind of bad input gets a clear 4xx in the API's error shape, never a 500, and
//! changes nothing.

use serde_json::{Value, json};

use crate::helpers::spawn_app;

struct Case {
    what: &'static str,
    method: &'static str,
    path: String,
    body: Vec<u8>,
    status: u16,
    code: &'static str,
    /// A word the message must contain (usually the field's name).
    mentions: &'static str,
}

fn case(
    what: &'static str,
    method: &'static str,
    path: &str,
    body: impl Into<Vec<u8>>,
    status: u16,
    code: &'static str,
    mentions: &'static str,
) -> Case {
    Case { what, method, path: path.to_string(), body: body.into(), status, code, mentions }
}

#[tokio::test]
async fn bad_input_gets_a_clear_4xx() {
    let app = spawn_app().await;
    let token = app.biz_type("orders").await;
    let task = app.create_task(&token, json!({"biz_type": "orders", "delay_ms": 600000})).await;
    let task_path = format!("/api/v1/tasks/{}", task["id"].as_str().unwrap());
    let big_payload = format!(r#"{{"biz_type":"orders","payload":"{}"}}"#, "x".repeat(66 * 1024));
    let huge_body = format!(r#"{{"biz_type":"orders","payload":"{}"}}"#, "x".repeat(200 * 1024));
    let deep = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
    let deep_payload = format!(r#"{{"biz_type":"orders","payload":{deep}}}"#);
    let t = "/api/v1/tasks";

    let cases = vec![
        case("empty body", "POST", t, "", 400, "bad_request", "empty"),
        case("not JSON", "POST", t, "biz_type=orders", 400, "bad_request", "JSON"),
        case("truncated JSON", "POST", t, r#"{"biz_type": "orders""#, 400, "bad_request", "JSON"),
        case("invalid UTF-8", "POST", t, b"{\"biz_type\": \"ord\xff\xfe\"}".to_vec(), 400, "bad_request", "JSON"),
        case("nesting beyond the parser's limit", "POST", t, deep_payload, 400, "bad_request", "JSON"),
        case("array instead of object", "POST", t, "[1,2]", 422, "invalid_argument", "object"),
        case("missing biz_type", "POST", t, "{}", 422, "invalid_argument", "biz_type"),
        case("biz_type not a string", "POST", t, r#"{"biz_type": 7}"#, 422, "invalid_argument", "biz_type"),
        case("unknown field (typo)", "POST", t, r#"{"biz_type": "orders", "runAt": "x"}"#, 422, "invalid_argument", "runAt"),
        case("run_at not RFC 3339", "POST", t, r#"{"biz_type": "orders", "run_at": "tomorrow"}"#, 422, "invalid_argument", "run_at"),
        case("run_at without zone", "POST", t, r#"{"biz_type": "orders", "run_at": "2026-12-01T10:00:00"}"#, 422, "invalid_argument", "run_at"),
        case("run_at impossible date", "POST", t, r#"{"biz_type": "orders", "run_at": "2026-02-30T10:00:00Z"}"#, 422, "invalid_argument", "run_at"),
        case("run_at far past", "POST", t, r#"{"biz_type": "orders", "run_at": "1999-01-01T00:00:00Z"}"#, 422, "invalid_argument", "run_at"),
        case("run_at far future", "POST", t, r#"{"biz_type": "orders", "run_at": "9999-12-31T23:59:59Z"}"#, 422, "invalid_argument", "run_at"),
        case("run_at a number", "POST", t, r#"{"biz_type": "orders", "run_at": 1700000000}"#, 422, "invalid_argument", "run_at"),
        case(
            "both run_at and delay_ms",
            "POST",
            t,
            r#"{"biz_type": "orders", "run_at": "2026-12-01T10:00:00Z", "delay_ms": 5}"#,
            422,
            "invalid_argument",
            "run_at",
        ),
        case("negative delay", "POST", t, r#"{"biz_type": "orders", "delay_ms": -1}"#, 422, "invalid_argument", "delay_ms"),
        case("delay beyond ten years", "POST", t, r#"{"biz_type": "orders", "delay_ms": 999999999999999}"#, 422, "invalid_argument", "delay_ms"),
        case("delay beyond i64", "POST", t, r#"{"biz_type": "orders", "delay_ms": 99999999999999999999999}"#, 422, "invalid_argument", "delay_ms"),
        case("fractional delay", "POST", t, r#"{"biz_type": "orders", "delay_ms": 1.5}"#, 422, "invalid_argument", "delay_ms"),
        case("delay as string", "POST", t, r#"{"biz_type": "orders", "delay_ms": "5"}"#, 422, "invalid_argument", "delay_ms"),
        case("empty key", "POST", t, r#"{"biz_type": "orders", "key": ""}"#, 422, "invalid_argument", "key"),
        case("key too long", "POST", t, format!(r#"{{"biz_type": "orders", "key": "{}"}}"#, "k".repeat(300)), 422, "invalid_argument", "key"),
        case("key with a newline", "POST", t, r#"{"biz_type": "orders", "key": "a\nb"}"#, 422, "invalid_argument", "key"),
        case("key not a string", "POST", t, r#"{"biz_type": "orders", "key": 12}"#, 422, "invalid_argument", "key"),
        case("payload over 64 KiB", "POST", t, big_payload, 413, "payload_too_large", "payload"),
        case("body far over the limit", "POST", t, huge_body, 413, "payload_too_large", "bytes"),
        case("unknown biz type", "POST", t, r#"{"biz_type": "nosuch"}"#, 404, "not_found", "nosuch"),
        case("batch without tasks", "POST", "/api/v1/tasks/batch", "{}", 422, "invalid_argument", "tasks"),
        case("batch tasks not an array", "POST", "/api/v1/tasks/batch", r#"{"tasks": {}}"#, 422, "invalid_argument", "tasks"),
        case("batch not JSON", "POST", "/api/v1/tasks/batch", "[", 400, "bad_request", "JSON"),
        case("id not a UUID", "GET", "/api/v1/tasks/123", "", 400, "bad_request", "UUID"),
        case("unknown task", "GET", "/api/v1/tasks/00000000-0000-0000-0000-000000000000", "", 404, "not_found", "task"),
        case("list: bad status", "GET", "/api/v1/tasks?status=done", "", 422, "invalid_argument", "status"),
        case("list: limit zero", "GET", "/api/v1/tasks?limit=0", "", 422, "invalid_argument", "limit"),
        case("list: limit too big", "GET", "/api/v1/tasks?limit=100000", "", 422, "invalid_argument", "limit"),
        case("list: limit not a number", "GET", "/api/v1/tasks?limit=ten", "", 422, "invalid_argument", "limit"),
        case("list: bad from", "GET", "/api/v1/tasks?from=yesterday", "", 422, "invalid_argument", "from"),
        case("list: bad cursor", "GET", "/api/v1/tasks?cursor=abc", "", 422, "invalid_argument", "cursor"),
        case("list: unknown parameter", "GET", "/api/v1/tasks?sort=desc", "", 422, "invalid_argument", "sort"),
        case("list: unknown biz type", "GET", "/api/v1/tasks?biz_type=nosuch", "", 404, "not_found", "nosuch"),
        case("patch: nothing to change", "PATCH", &task_path, "{}", 422, "invalid_argument", "run_at"),
        case("patch: bad run_at", "PATCH", &task_path, r#"{"run_at": "soon"}"#, 422, "invalid_argument", "run_at"),
        case("patch: unknown field", "PATCH", &task_path, r#"{"status": "succeeded"}"#, 422, "invalid_argument", "status"),
        case("patch: not JSON", "PATCH", &task_path, "", 400, "bad_request", "empty"),
        case("lone surrogate in a payload string", "POST", t, r#"{"biz_type": "orders", "payload": "\ud800"}"#, 400, "bad_request", "JSON"),
        case("lone surrogate in a payload patch", "PATCH", &task_path, r#"{"payload": {"\udc00": 1}}"#, 400, "bad_request", "JSON"),
        case("NUL in a payload string", "POST", t, r#"{"biz_type": "orders", "payload": "a\u0000b"}"#, 422, "invalid_argument", "payload"),
        case("NUL in a payload key", "PATCH", &task_path, r#"{"payload": {"a\u0000": 1}}"#, 422, "invalid_argument", "payload"),
        case("NUL in the biz type", "POST", t, r#"{"biz_type": "ord\u0000ers"}"#, 404, "not_found", "biz type"),
        case("NUL in the listed biz type", "GET", "/api/v1/tasks?biz_type=%00", "", 404, "not_found", "biz type"),
        case("NUL in a by-key biz type", "GET", "/api/v1/biz-types/%00/tasks/by-key/x", "", 404, "not_found", "biz type"),
        case("NUL in a by-key key", "GET", "/api/v1/biz-types/orders/tasks/by-key/a%00b", "", 422, "invalid_argument", "control characters"),
        case(
            "payload number beyond PostgreSQL's range",
            "POST",
            t,
            r#"{"biz_type": "orders", "payload": {"n": 1e131072}}"#,
            422,
            "invalid_argument",
            "payload",
        ),
        case(
            "payload number with too many decimals for PostgreSQL",
            "PATCH",
            &task_path,
            r#"{"payload": [1e-16384]}"#,
            422,
            "invalid_argument",
            "payload",
        ),
        case(
            "payload number printed 100001 digits long",
            "POST",
            t,
            r#"{"biz_type": "orders", "payload": 1e100000}"#,
            422,
            "invalid_argument",
            "payload",
        ),
        case(
            "payload number beyond a double's exponent",
            "POST",
            t,
            r#"{"biz_type": "orders", "payload": [-1E+400]}"#,
            422,
            "invalid_argument",
            "payload",
        ),
        case(
            "timer payload number beyond range",
            "POST",
            "/api/v1/timers",
            r#"{"biz_type": "orders", "key": "t", "cron": "0 0 9 * * *", "payload": 1e131072}"#,
            422,
            "invalid_argument",
            "payload",
        ),
        case("timers list: NUL in the cursor", "GET", "/api/v1/timers?cursor=a%00b", "", 422, "invalid_argument", "cursor"),
        case("replay a pending task", "POST", &format!("{task_path}/replay"), "", 409, "invalid_state", "pending"),
    ];

    let mut failures = Vec::new();
    for c in &cases {
        let body = if c.method == "GET" { None } else { Some(c.body.clone()) };
        let reply = app.request(c.method, &c.path, Some(&token), body).await;
        let code = reply.body["error"]["code"].as_str().unwrap_or("");
        let message = reply.body["error"]["message"].as_str().unwrap_or("");
        if reply.status != c.status || code != c.code || !message.contains(c.mentions) {
            failures.push(format!("{}: got {} {} {:?}", c.what, reply.status, code, message));
        }
    }
    assert!(failures.is_empty(), "cases that went wrong:\n{}", failures.join("\n"));

    let count: i64 = sqlx::query_scalar("SELECT count(*) FROM all_tasks").fetch_one(&app.pool).await.unwrap();
    assert_eq!(count, 1, "no bad request created a task");
    let got = app.get(&task_path, &token).await;
    assert_eq!(got.body["run_at"], task["run_at"], "no bad request changed the task");
}

/// Any create rate limit the settings accept (above 0, however small) limits creates with
/// a 429 and never fails them. A rate below one call in 584 years used to panic the
/// limiter while it held its lock, and the poisoned lock then failed every create on the
/// node, for every biz type.
#[tokio::test]
async fn the_slowest_create_rate_limit_answers_429() {
    let app = spawn_app().await;
    let slow = app.biz_type("slow").await;
    let other = app.biz_type("other").await;
    let settings = chime::biz_types::Settings { create_rate_limit: Some(1e-11), ..Default::default() };
    chime::biz_types::update(&app.pool, "slow", &settings, chime::callback_hosts::CallbackHosts::Any).await.unwrap();

    let first = app.post("/api/v1/tasks", &slow, json!({"biz_type": "slow"})).await;
    let second = app.post("/api/v1/tasks", &slow, json!({"biz_type": "slow"})).await;
    let elsewhere = app.post("/api/v1/tasks", &other, json!({"biz_type": "other"})).await;

    assert_eq!(first.status, 201, "{}", first.body);
    assert_eq!((second.status, second.code()), (429, "rate_limited"), "{}", second.body);
    assert_eq!(elsewhere.status, 201, "{}", elsewhere.body);
}

/// A batch item whose payload PostgreSQL cannot store is refused on its own (422); the
/// other items are created. It used to fail the batch's one statement: a 500 for all.
#[tokio::test]
async fn a_batch_item_with_an_unstorable_number_is_refused_alone() {
    let app = spawn_app().await;
    let token = app.biz_type("orders").await;
    let body = r#"{"tasks": [{"biz_type": "orders", "payload": 1}, {"biz_type": "orders", "payload": 1e131072}]}"#;

    let reply = app.request("POST", "/api/v1/tasks/batch", Some(&token), Some(body.as_bytes().to_vec())).await;

    assert_eq!(reply.status, 200, "{}", reply.body);
    let statuses: Vec<&Value> = reply.body["results"].as_array().unwrap().iter().map(|r| &r["status"]).collect();
    assert_eq!(statuses, [&json!(201), &json!(422)], "{}", reply.body);
    assert!(reply.body["results"][1]["error"]["message"].as_str().unwrap().contains("payload"), "{}", reply.body);
}
