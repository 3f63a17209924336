//! Finding a task on the console's list (plain HTTP): by a key's or an id's start, by what
//! its payload contains, retrying apart from pending, newest first, pages both ways, the
//! count, every filter in the address, and the API's rules for each field. The last test
//! loads a large table and prints each page's time.

use std::time::Instant;

use chrono::{Duration, Utc};
use serde_json::{Value, json};
use sqlx::Connection;

use crate::console::{ADMIN_PASSWORD, Console, Page, sign_in};
use crate::helpers::{TestApp, spawn_app};

/// Creates tasks through the batch API, asserting each was created; returns their ids.
async fn create(app: &TestApp, token: &str, items: Vec<Value>) -> Vec<String> {
    let mut ids = vec![];
    for chunk in items.chunks(500) {
        let reply = app.post("/api/v1/tasks/batch", token, json!({"tasks": chunk})).await;
        assert_eq!(reply.status, 200, "{}", reply.body);
        for item in reply.body["results"].as_array().unwrap() {
            assert_eq!(item["status"], 201, "{item}");
            ids.push(item["task"]["id"].as_str().unwrap_or_else(|| panic!("{item}")).to_string());
        }
    }
    ids
}

/// The keys of the task rows on a list page, in order.
fn keys(page: &Page) -> Vec<String> {
    page.body
        .split("<tr class=\"task\">")
        .skip(1)
        .map(|row| match row.split_once("<code>") {
            Some((_, rest)) => rest.split('<').next().unwrap().to_string(),
            None => String::new(),
        })
        .collect()
}

/// The ids of the task rows on a list page, in order.
fn ids(page: &Page) -> Vec<String> {
    page.body
        .split("<tr class=\"task\">")
        .skip(1)
        .map(|row| row.split("href=\"/console/tasks/").nth(1).unwrap().split('"').next().unwrap().to_string())
        .collect()
}

/// The link with this id on the page (HTML-unescaped), if any.
fn link(page: &Page, id: &str) -> Option<String> {
    let marker = format!("id=\"{id}\" href=\"");
    let start = page.body.find(&marker)? + marker.len();
    Some(page.body[start..].split('"').next().unwrap().replace("&amp;", "&").replace("&#38;", "&"))
}

/// The count line's number ("1,234" or "10,000+").
fn count(page: &Page) -> String {
    let start = page.body.find("<p id=\"count\" class=\"muted\">").unwrap_or_else(|| panic!("no count: {}", page.body)) + 28;
    page.body[start..].split(' ').next().unwrap().to_string()
}

async fn ok(admin: &Console, path: &str) -> Page {
    let page = admin.get(path).await;
    assert_eq!(page.status, 200, "{path}: {}", &page.body[..page.body.len().min(3000)]);
    page
}

/// A key's start finds the keys that start with it, in key order (then biz type), across
/// biz types or in one, a page at a time both ways; the count says how many.
#[tokio::test]
async fn a_key_prefix_finds_its_keys_in_one_biz_type_or_all_paging_both_ways() {
    let app = spawn_app().await;
    let orders = app.biz_type("orders").await;
    let billing = app.biz_type("billing").await;
    let items: Vec<Value> = (0..120).map(|i| json!({"biz_type": "orders", "key": format!("order-{i:03}"), "delay_ms": 3_600_000})).collect();
    create(&app, &orders, items).await;
    create(
        &app,
        &billing,
        vec![json!({"biz_type": "billing", "key": "order-050", "delay_ms": 3_600_000}), json!({"biz_type": "billing", "key": "orders-x"})],
    )
    .await;
    let admin = sign_in(&app, "admin", ADMIN_PASSWORD).await;

    // order-0: order-000 to order-099 in orders, order-050 in billing.
    let first = ok(&admin, "/console/tasks?q=order-0").await;
    assert_eq!(count(&first), "101");
    let mut expected: Vec<String> = (0..100).map(|i| format!("order-{i:03}")).collect();
    expected.insert(51, "order-050".into()); // billing's, after orders' (biz type order)
    assert_eq!(keys(&first), expected[..50]);
    assert!(link(&first, "prev-page").is_none());
    let second = ok(&admin, &link(&first, "next-page").expect("a next page")).await;
    assert_eq!(keys(&second), expected[50..100]);
    let third = ok(&admin, &link(&second, "next-page").unwrap()).await;
    assert_eq!(keys(&third), expected[100..]);
    assert!(link(&third, "next-page").is_none());
    // Back from the third page: the second again, then the first.
    let back = ok(&admin, &link(&third, "prev-page").expect("a previous page")).await;
    assert_eq!(keys(&back), expected[50..100]);
    let back = ok(&admin, &link(&back, "prev-page").unwrap()).await;
    assert_eq!(keys(&back), expected[..50]);
    assert!(link(&back, "prev-page").is_none());

    // In one biz type; a prefix that is a whole key; the search kept in the address.
    let billing_only = ok(&admin, "/console/tasks?biz_type=billing&q=order").await;
    assert_eq!(keys(&billing_only), ["order-050", "orders-x"]);
    assert!(billing_only.body.contains("name=\"q\" value=\"order\""));
    // A whole key that one task holds opens it (see `an_exact_key_opens…`).
    let exact = admin.get("/console/tasks?q=order-119").await;
    assert_eq!(exact.status, 303, "{}", exact.body);
    assert!(exact.location().starts_with("/console/tasks/0"), "{}", exact.location());
    assert!(ok(&admin, "/console/tasks?q=order-2").await.body.contains("No task matches."));
    // `_` and `%` are characters, not patterns.
    assert!(ok(&admin, "/console/tasks?q=order_").await.body.contains("No task matches."));
    assert!(ok(&admin, "/console/tasks?q=%25").await.body.contains("No task matches."));
}

/// An id's start (8 hex digits or more, dashes or not) finds the task; a whole id goes to it.
#[tokio::test]
async fn an_id_prefix_finds_the_task_and_a_whole_id_opens_it() {
    let app = spawn_app().await;
    let orders = app.biz_type("orders").await;
    let ids_made = create(&app, &orders, (0..3).map(|i| json!({"biz_type": "orders", "key": format!("k{i}")})).collect()).await;
    let admin = sign_in(&app, "admin", ADMIN_PASSWORD).await;
    let id = &ids_made[1];

    let whole = admin.get(&format!("/console/tasks?q={id}")).await;
    assert_eq!((whole.status, whole.location()), (303, format!("/console/tasks/{id}").as_str()));
    // The last 8 digits are random (those before may be a counter): 28 digits name one task.
    for prefix in [id[..33].to_string(), id.replace('-', "")[..28].to_string()] {
        let page = ok(&admin, &format!("/console/tasks?q={prefix}")).await;
        assert_eq!(ids(&page), std::slice::from_ref(id), "{prefix}");
        assert!(page.body.contains("1 task id starts with"), "{prefix}");
    }
    // 8 digits: the tasks made in the same 65 s, all three here.
    let page = ok(&admin, &format!("/console/tasks?q={}", &id[..8])).await;
    let mut all = ids_made.clone();
    all.sort();
    assert_eq!(ids(&page), all);
    // Hex that no id starts with is read as a key.
    let page = ok(&admin, "/console/tasks?q=ffffffff").await;
    assert!(page.body.contains("keys start with") && page.body.contains("No task matches."), "{}", page.body);
}

/// "Payload contains" takes JSON or `field = value` (nested with dots), within a biz type or
/// across every biz type (there bounded, and the page says how).
#[tokio::test]
async fn a_payload_search_finds_what_the_payload_contains_within_a_biz_type() {
    let app = spawn_app().await;
    let orders = app.biz_type("orders").await;
    let billing = app.biz_type("billing").await;
    let items: Vec<Value> = (0..60)
        .map(|i| json!({"biz_type": "orders", "key": format!("o{i:02}"), "payload": {"order_id": i, "customer": {"id": format!("c{}", i % 3)}}}))
        .collect();
    create(&app, &orders, items).await;
    create(&app, &billing, vec![json!({"biz_type": "billing", "key": "b", "payload": {"order_id": 7}})]).await;
    let admin = sign_in(&app, "admin", ADMIN_PASSWORD).await;

    for filter in ["order_id = 7", "payload.order_id=7", r#"{"order_id": 7}"#] {
        let page = ok(&admin, &format!("/console/tasks?biz_type=orders&payload={}", urlencoding(filter))).await;
        assert_eq!(keys(&page), ["o07"], "{filter}");
        assert_eq!(count(&page), "1");
    }
    let page = ok(&admin, &format!("/console/tasks?biz_type=orders&payload={}", urlencoding("customer.id = c1"))).await;
    assert_eq!(keys(&page).len(), 20);
    assert!(keys(&page).iter().all(|k| k[1..].parse::<u32>().unwrap() % 3 == 1));
    let page = ok(&admin, &format!("/console/tasks?biz_type=orders&payload={}", urlencoding(r#"order_id = "7""#))).await;
    assert!(page.body.contains("No task matches."), "a string is not a number");
    // Across every biz type: from the payload index, bounded, and the page says how.
    let page = ok(&admin, &format!("/console/tasks?payload={}", urlencoding("order_id = 7"))).await;
    let mut found = keys(&page);
    found.sort();
    assert_eq!(found, ["b", "o07"]);
    assert_eq!(count(&page), "2");
    let bound = page.body.split("<p id=\"bound\" class=\"muted\">").nth(1).unwrap_or_else(|| panic!("no bound: {}", page.body));
    assert!(
        bound.starts_with("Across every biz type a payload search reads the payload index") && bound.contains("at most 10,000 matches"),
        "{bound}"
    );
    // With a state, a window and the box too.
    let page = ok(&admin, &format!("/console/tasks?payload={}&status=pending&q=o0", urlencoding("order_id = 7"))).await;
    assert_eq!(keys(&page), ["o07"]);
    assert!(ok(&admin, &format!("/console/tasks?payload={}&status=failed", urlencoding("order_id = 7"))).await.body.contains("No task matches."));
}

/// The box combines with every other field: a key's start (or an id's) with the state, the
/// due window and the payload, in one biz type or all; the count says that both matched.
#[tokio::test]
async fn the_key_box_combines_with_state_due_time_and_payload() {
    let app = spawn_app().await;
    let orders = app.biz_type("orders").await;
    let billing = app.biz_type("billing").await;
    let base = Utc::now() + Duration::hours(1);
    let items: Vec<Value> = (0..8)
        .map(|i| {
            let shop = if i % 2 == 0 { "north" } else { "south" };
            json!({"biz_type": "orders", "key": format!("order-{i}"), "run_at": (base + Duration::minutes(i)).to_rfc3339(),
                   "payload": {"order_id": 10040 + i, "shop": shop}})
        })
        .collect();
    let made = create(&app, &orders, items).await;
    create(&app, &billing, vec![json!({"biz_type": "billing", "key": "order-9", "payload": {"order_id": 10042}})]).await;
    for i in [1, 3, 5] {
        app.force_status(&made[i], "failed").await;
    }
    let admin = sign_in(&app, "admin", ADMIN_PASSWORD).await;

    let page = ok(&admin, "/console/tasks?q=order-&status=failed").await;
    assert_eq!(keys(&page), ["order-1", "order-3", "order-5"]);
    assert!(page.body.contains("3 keys start with <code>order-</code> and match the filters (in key order)"), "{}", page.body);
    let (from, to) = (
        (base + Duration::minutes(2)).format("%Y-%m-%d %H:%M:%S").to_string(),
        (base + Duration::minutes(5)).format("%Y-%m-%d %H:%M:%S").to_string(),
    );
    let window = format!("from={}&to={}", urlencoding(&from), urlencoding(&to));
    assert_eq!(keys(&ok(&admin, &format!("/console/tasks?q=order-&{window}")).await), ["order-2", "order-3", "order-4"]);
    assert_eq!(keys(&ok(&admin, &format!("/console/tasks?q=order-&{window}&status=failed")).await), ["order-3"]);
    let south = format!("payload={}", urlencoding("shop = south"));
    assert_eq!(keys(&ok(&admin, &format!("/console/tasks?q=order-&{south}")).await), ["order-1", "order-3", "order-5", "order-7"]);
    assert_eq!(keys(&ok(&admin, &format!("/console/tasks?q=order-&{south}&status=pending&order=newest")).await), ["order-7"]);
    let page = ok(&admin, &format!("/console/tasks?q=order&payload={}", urlencoding("order_id = 10042"))).await;
    assert_eq!(keys(&page), ["order-2", "order-9"], "in either biz type");
    assert_eq!(keys(&ok(&admin, &format!("/console/tasks?q=order&biz_type=billing&payload={}", urlencoding("order_id = 10042"))).await), ["order-9"]);
    // The count is the filtered one, and pages keep every filter.
    assert_eq!(count(&ok(&admin, "/console/tasks?q=order-&status=pending").await), "6", "order-9 of billing too");

    // An id's start with a state and a biz type: the failed ones among those made together.
    let page = ok(&admin, &format!("/console/tasks?q={}&status=failed&biz_type=orders", &made[3][..8])).await;
    let mut failed = vec![made[1].clone(), made[3].clone(), made[5].clone()];
    failed.sort();
    assert_eq!(ids(&page), failed);
    assert!(page.body.contains("3 task ids start with") && page.body.contains("and match the filters"), "{}", page.body);
}

/// The link of the hint whose text holds `text` (HTML-unescaped).
fn hint_link(page: &Page, text: &str) -> String {
    let at = page.body.find(text).unwrap_or_else(|| panic!("no hint {text}: {}", page.body));
    let start = page.body[..at].rfind("<a href=\"").unwrap() + 9;
    page.body[start..].split('"').next().unwrap().replace("&amp;", "&").replace("&#38;", "&")
}

/// A whole key that one task holds opens that task; a key that nothing starts with says
/// what may find it instead: the same text in the other case (keys are case-sensitive),
/// the key without the other filters, and the payloads' fields holding the text typed.
#[tokio::test]
async fn an_exact_key_opens_its_task_and_a_miss_says_what_to_try() {
    let app = spawn_app().await;
    let orders = app.biz_type("orders").await;
    let made = create(
        &app,
        &orders,
        vec![
            json!({"biz_type": "orders", "key": "order-7", "payload": {"order_id": 10042, "ref": "A-1", "lines": [1]}}),
            json!({"biz_type": "orders", "key": "order-70", "payload": {"order_id": 10070, "ref": "A-2"}}),
        ],
    )
    .await;
    let admin = sign_in(&app, "admin", ADMIN_PASSWORD).await;

    let page = admin.get("/console/tasks?q=order-70").await;
    assert_eq!((page.status, page.location()), (303, format!("/console/tasks/{}", made[1]).as_str()));
    let flash = page.headers.get("set-cookie").map(|c| c.to_str().unwrap().to_string());
    assert!(flash.is_some_and(|c| c.starts_with("chime_flash=")), "the task page says why it opened");
    // A whole key that starts others too lists them all.
    assert_eq!(keys(&ok(&admin, "/console/tasks?q=order-7").await), ["order-7", "order-70"]);
    assert_eq!(admin.get("/console/tasks?q=order-7&status=pending&biz_type=orders").await.status, 200, "two still match");

    // The other case.
    let page = ok(&admin, "/console/tasks?q=ORDER-7").await;
    assert!(page.body.contains("No task matches."), "{}", page.body);
    assert!(page.body.contains("<code>order-7</code>: 2 keys (keys are case-sensitive)"), "{}", page.body);
    assert_eq!(keys(&ok(&admin, &hint_link(&page, "<code>order-7</code>: 2 keys")).await), ["order-7", "order-70"]);
    // The key without the other filters.
    let page = ok(&admin, "/console/tasks?q=order-7&status=failed&biz_type=orders").await;
    assert!(page.body.contains("2 keys start with <code>order-7</code> when the state, due and other filters are left out"), "{}", page.body);
    let link = hint_link(&page, "when the state, due and other filters");
    assert!(link.contains("biz_type=orders") && !link.contains("status=failed"), "{link}");
    // A number no key starts with: the payloads' fields holding it, as a number where the
    // field held numbers, as text where it held text; following one finds the task.
    let page = ok(&admin, "/console/tasks?q=10042").await;
    assert!(page.body.contains("payloads with <code>order_id = 10042</code>"), "{}", page.body);
    assert!(page.body.contains("payloads with <code>ref = &quot;10042&quot;</code>"), "{}", page.body);
    assert!(!page.body.contains("lines = "), "a list is not offered");
    let found = ok(&admin, &hint_link(&page, "payloads with <code>order_id = 10042</code>")).await;
    assert_eq!(keys(&found), ["order-7"]);
    assert!(found.body.contains("name=\"payload\" value=\"order_id = 10042\"") && found.body.contains("name=\"q\" value=\"\""), "{}", found.body);
    // No payload to learn fields from: the advice, without a link.
    let empty = spawn_app().await;
    empty.biz_type("orders").await;
    let admin = sign_in(&empty, "admin", ADMIN_PASSWORD).await;
    let page = ok(&admin, "/console/tasks?q=10042").await;
    assert!(page.body.contains("To search payloads for it, write <code>field = 10042</code> in Payload contains."), "{}", page.body);
}

/// A filter the list cannot take keeps the list page: an unknown biz type is not found
/// (404) on the list itself, with the menu, the search as typed and the error beside the
/// field; a due window that ends where or before it starts is refused at `to`; the page
/// then says nothing was searched, not that nothing matches; quoted names show as code;
/// times are typed as text in UTC (no browser picker with its locale's 12-hour clock).
#[tokio::test]
async fn a_refused_filter_keeps_the_page_and_the_search_and_says_why() {
    let app = spawn_app().await;
    app.biz_type("orders").await;
    let admin = sign_in(&app, "admin", ADMIN_PASSWORD).await;

    let page = admin.get("/console/tasks?biz_type=nope&q=order&status=failed").await;
    assert_eq!(page.status, 404, "{}", page.body);
    assert!(page.body.contains("<nav>") && page.body.contains("href=\"/console/audit\""), "the menu: {}", page.body);
    assert!(page.body.contains("data-field=\"biz_type\">biz_type: no biz type is named <code>nope</code>"), "{}", page.body);
    assert!(page.body.contains("<option value=\"nope\" selected>nope (no such biz type)</option>"), "{}", page.body);
    assert!(page.body.contains("name=\"q\" value=\"order\"") && page.body.contains("<option value=\"failed\" selected>"), "{}", page.body);
    assert!(page.body.contains("Nothing was searched: correct the field marked above.") && !page.body.contains("No task matches"), "{}", page.body);

    for (from, to) in [("2026-11-22T10:00", "2026-11-22+09:00"), ("2026-11-22+10:00", "2026-11-22T10:00")] {
        let page = admin.get(&format!("/console/tasks?status=failed&from={from}&to={to}")).await;
        assert_eq!(page.status, 422, "{}", page.body);
        assert!(
            page.body.contains("data-field=\"to\">to: is not after from (<code>2026-11-22 10:00</code> to <code>2026-11-22 ")
                && page.body.contains("nothing is due in that window; swap them or widen it"),
            "{}",
            page.body
        );
        assert!(page.body.contains("Nothing was searched") && !page.body.contains("No task matches"), "{}", page.body);
        assert!(!page.body.contains("id=\"bulk-replay\""), "no bulk action on a refused filter");
    }
    let page = ok(&admin, "/console/tasks").await;
    assert!(!page.body.contains("datetime-local"), "no locale picker");
    assert!(page.body.contains("placeholder=\"2026-11-22 09:30\""), "{}", page.body);
}

/// Writes tasks `first ..= last` straight into the partitions, as the years would leave
/// them, over the 20 hours before now (below the hot horizon, inside the partitions that
/// exist): a quarter pending, a twentieth failed, the rest succeeded; one pending task in 100
/// retrying; task `n` of biz type `(n % 4) + 1` (by id), keyed `<biz type>-<n>`, with a
/// payload naming its order. Task `n` is due `(n - first) * 20 h / last` after 20 hours ago.
pub async fn load(app: &TestApp, first: i64, last: i64) {
    sqlx::query(
        "WITH b AS (SELECT array_agg(id ORDER BY id) AS ids, array_agg(name ORDER BY id) AS names FROM biz_types),
              r AS (
                 SELECT gen_random_uuid() AS id, i, (i % 4) + 1 AS slot,
                        now() - interval '20 hours' + ((i - $1::bigint) * (72000.0 / $2::bigint)) * interval '1 second' AS run_at,
                        CASE WHEN i % 20 < 5 THEN 'pending' WHEN i % 20 = 5 THEN 'failed' ELSE 'succeeded' END AS status
                   FROM generate_series($1::bigint, $2::bigint) i
              ), t AS (
                 INSERT INTO tasks (id, biz_type_id, key, run_at, payload, status, attempt_count, last_error, finished_at)
                 SELECT r.id, b.ids[r.slot], b.names[r.slot] || '-' || r.i, r.run_at,
                        jsonb_build_object('order_id', r.i, 'customer', 'c' || (r.i % 1000)), r.status,
                        CASE WHEN r.status <> 'pending' OR r.i % 100 = 0 THEN 1 ELSE 0 END,
                        CASE WHEN r.status = 'failed' OR (r.status = 'pending' AND r.i % 100 = 0) THEN 'HTTP 503' END,
                        CASE WHEN r.status <> 'pending' THEN r.run_at + interval '1 second' END
                   FROM r, b
                 RETURNING id, biz_type_id, key
              )
         INSERT INTO task_keys (biz_type_id, key, task_id, request_hash) SELECT biz_type_id, key, id, '\\x00' FROM t",
    )
    .bind(first)
    .bind(last)
    .execute(&app.pool)
    .await
    .unwrap();
}

fn urlencoding(text: &str) -> String {
    url::form_urlencoded::byte_serialize(text.as_bytes()).collect()
}

/// The list by due time, oldest or newest first, pages both ways with every filter kept in
/// the links; retrying is a state of its own, inside pending.
#[tokio::test]
async fn lists_go_newest_first_page_both_ways_and_filter_retrying_apart_from_pending() {
    let app = spawn_app().await;
    let orders = app.biz_type("orders").await;
    let base = Utc::now() + Duration::hours(1);
    let items: Vec<Value> =
        (0..120).map(|i| json!({"biz_type": "orders", "key": format!("t{i:03}"), "run_at": (base + Duration::seconds(i)).to_rfc3339()})).collect();
    let made = create(&app, &orders, items).await;
    // Two tasks tried once and waiting for their retry.
    for id in [&made[3], &made[77]] {
        sqlx::query("UPDATE tasks SET attempt_count = 1, last_error = 'HTTP 503' WHERE id = $1::uuid").bind(id).execute(&app.pool).await.unwrap();
    }
    let admin = sign_in(&app, "admin", ADMIN_PASSWORD).await;
    let all: Vec<String> = (0..120).map(|i| format!("t{i:03}")).collect();
    let newest: Vec<String> = all.iter().rev().cloned().collect();

    let first = ok(&admin, "/console/tasks?biz_type=orders&status=pending&order=newest").await;
    assert_eq!(count(&first), "120");
    assert_eq!(keys(&first), newest[..50]);
    let next = link(&first, "next-page").unwrap();
    assert!(next.contains("biz_type=orders") && next.contains("status=pending") && next.contains("order=newest"), "{next}");
    let second = ok(&admin, &next).await;
    assert_eq!(keys(&second), newest[50..100]);
    let back = ok(&admin, &link(&second, "prev-page").unwrap()).await;
    assert_eq!(keys(&back), newest[..50]);
    assert!(link(&back, "prev-page").is_none());

    let oldest = ok(&admin, "/console/tasks?order=oldest").await;
    assert_eq!(keys(&oldest), all[..50]);
    let third = ok(&admin, &link(&ok(&admin, &link(&oldest, "next-page").unwrap()).await, "next-page").unwrap()).await;
    assert_eq!(keys(&third), all[100..]);
    assert!(link(&third, "next-page").is_none());
    assert_eq!(keys(&ok(&admin, &link(&third, "prev-page").unwrap()).await), all[50..100]);

    let retrying = ok(&admin, "/console/tasks?status=retrying").await;
    assert_eq!(keys(&retrying), ["t003", "t077"]);
    assert_eq!(count(&retrying), "2");
    assert!(retrying.body.contains("<option value=\"retrying\" selected>"));
    let due = ok(&admin, &format!("/console/tasks?status=retrying&from={}", (base + Duration::seconds(10)).format("%Y-%m-%dT%H:%M:%S"))).await;
    assert_eq!(keys(&due), ["t077"]);
    assert_eq!(count(&ok(&admin, "/console/tasks?status=pending").await), "120");
}

/// Every field of the search goes through the API's rules (Status::parse, check_time,
/// validate_key, the payload's): hostile values answer 422 with every field's problem at
/// once and the values kept, never a 5xx.
#[tokio::test]
async fn every_search_field_is_checked_by_the_api_rules_all_problems_at_once() {
    let app = spawn_app().await;
    app.biz_type("orders").await;
    let admin = sign_in(&app, "admin", ADMIN_PASSWORD).await;

    let long_key = "k".repeat(300);
    let path = format!(
        "/console/tasks?biz_type=orders&status=stuck&order=sideways&from=-4714-01-01T00:00&to=-200000-01-01T00:00&q=order%00-1&payload={}",
        urlencoding(r#"{"a": "\u0000"}"#)
    );
    let page = admin.get(&path).await;
    assert_eq!(page.status, 422, "{}", page.body);
    for error in [
        "status: must be one of pending, running, succeeded, failed, cancelled, expired, or retrying",
        "order: must be oldest or newest",
        "key: must not contain control characters",
        "from: must be between the years 0000 and 9999",
        "to: must be between the years 0000 and 9999",
        "payload: must not contain the character U+0000",
    ] {
        assert!(page.body.contains(error), "{error}: {}", page.body);
    }
    assert!(page.body.contains("name=\"from\" value=\"-4714-01-01T00:00\"") && page.body.contains("value=\"order\0-1\""));

    for (query, error) in [
        (format!("q={long_key}"), "key: must be 1 to 256 bytes".to_string()),
        (format!("biz_type=orders&payload={}", "x".repeat(3000)), "payload: must be at most 2048 bytes".to_string()),
        ("biz_type=orders&payload=order_id".into(), "payload: write a JSON object".into()),
        ("biz_type=orders&payload=%7B1%7D".into(), "payload: is not a JSON object".into()),
        ("biz_type=orders&payload=%7B%7D".into(), "payload: must name at least one field".into()),
        ("biz_type=orders&payload=%3D1".into(), "payload: name the field before".into()),
        (format!("biz_type=orders&payload={}", urlencoding(r#"{"n": 1e999999}"#)), "payload: the number".into()),
        ("cursor=bm9wZQ".into(), "cursor: is not a cursor".into()),
        ("before=%00".into(), "cursor: is not a cursor".into()),
        ("q=order&cursor=bm9wZQ".into(), "cursor: is not a cursor".into()),
    ] {
        let page = admin.get(&format!("/console/tasks?{query}")).await;
        assert_eq!(page.status, 422, "{query}: {}", &page.body[..page.body.len().min(3000)]);
        assert!(page.body.contains(&error), "{query}: {error}: {}", page.body);
    }
    assert_eq!(admin.get("/console/tasks?biz_type=nope&q=order").await.status, 404);
}

/// With a large table (200,000 tasks here; CHIME_FIND_ROWS=1000000 for the README's
/// figures), each kind of search answers with the right rows; each page's time is printed,
/// not asserted (`cargo test --test api finding_tasks_among -- --nocapture`).
#[tokio::test]
async fn finding_tasks_among_a_large_table() {
    let rows: i64 = std::env::var("CHIME_FIND_ROWS").ok().and_then(|n| n.parse().ok()).unwrap_or(200_000);
    let app = spawn_app().await;
    for name in ["orders", "billing", "coupons", "emails"] {
        app.biz_type(name).await;
    }
    // The search indexes made ON ONLY by migration 0022 completed as the leader would.
    chime::partitions::complete_indexes(&app.pool).await.unwrap();
    let started = Instant::now();
    load(&app, 1, rows).await;
    sqlx::query("VACUUM ANALYZE tasks").execute(&app.pool).await.unwrap();
    sqlx::query("VACUUM ANALYZE task_keys").execute(&app.pool).await.unwrap();
    println!("loaded {rows} tasks in {:?}", started.elapsed());
    let admin = sign_in(&app, "admin", ADMIN_PASSWORD).await;

    let target = rows / 2 + 3; // in slot (target % 4) + 1
    let biz_type = ["orders", "billing", "coupons", "emails"][(target % 4) as usize];
    let key_prefix = format!("{biz_type}-{}", target / 10);
    let some_id: String = sqlx::query_scalar("SELECT task_id::text FROM task_keys WHERE key = $1")
        .bind(format!("{biz_type}-{target}"))
        .fetch_one(&app.pool)
        .await
        .unwrap();
    let searches = [
        ("unfiltered, oldest first", "/console/tasks".to_string()),
        ("unfiltered, newest first", "/console/tasks?order=newest".to_string()),
        ("biz type + pending", "/console/tasks?biz_type=orders&status=pending".to_string()),
        ("biz type + failed, newest first", "/console/tasks?biz_type=billing&status=failed&order=newest".to_string()),
        ("retrying", "/console/tasks?status=retrying".to_string()),
        ("key prefix, all biz types", format!("/console/tasks?q={key_prefix}")),
        ("key prefix, one biz type", format!("/console/tasks?biz_type={biz_type}&q={biz_type}-12")),
        ("key prefix, all, 10,000+ match", "/console/tasks?q=orders-".to_string()),
        ("id prefix (12 digits)", format!("/console/tasks?q={}", &some_id[..13])),
        ("payload contains, one biz type", format!("/console/tasks?biz_type={biz_type}&payload={}", urlencoding(&format!("order_id = {target}")))),
        ("payload contains, all biz types", format!("/console/tasks?payload={}", urlencoding(&format!("order_id = {target}")))),
        // Failed tasks are task n with n % 20 == 5, all of billing (slot 2).
        ("key prefix + failed, all biz types", "/console/tasks?q=billing-1&status=failed".to_string()),
        ("key prefix + failed, none match", format!("/console/tasks?q={biz_type}-1&status=failed")),
    ];
    let mut pages = vec![];
    for (name, path) in &searches {
        ok(&admin, path).await; // the first read of each kind warms the cache
        let started = Instant::now();
        let page = ok(&admin, path).await;
        println!("{name:<34} {:>7.1} ms  ({} rows, count {})", started.elapsed().as_secs_f64() * 1000.0, keys(&page).len(), count(&page));
        pages.push(page);
    }
    let next = link(&pages[1], "next-page").unwrap();
    let started = Instant::now();
    let second = ok(&admin, &next).await;
    println!("{:<34} {:>7.1} ms", "unfiltered, newest first, page 2", started.elapsed().as_secs_f64() * 1000.0);

    assert_eq!(keys(&pages[0]).len(), 50);
    assert_eq!(count(&pages[0]), "10,000+");
    assert_eq!(keys(&pages[0])[0], "billing-1", "row 1 (slot 2) is the oldest");
    assert_eq!(keys(&pages[1])[0], format!("{}-{rows}", ["orders", "billing", "coupons", "emails"][(rows % 4) as usize]));
    assert!(keys(&second).iter().all(|k| !keys(&pages[1]).contains(k)));
    assert!(keys(&pages[2]).iter().all(|k| k.starts_with("orders-")) && count(&pages[2]) == "10,000+");
    let retrying = keys(&pages[4]);
    assert!(!retrying.is_empty() && retrying.iter().all(|k| k.rsplit('-').next().unwrap().parse::<i64>().unwrap() % 100 == 0));
    let found = keys(&pages[5]);
    assert!(found.contains(&format!("{biz_type}-{target}")) && found.iter().all(|k| k.starts_with(&key_prefix)), "{found:?}");
    assert!(keys(&pages[6]).iter().all(|k| k.starts_with(&format!("{biz_type}-12"))) && keys(&pages[6]).len() == 50);
    assert!(keys(&pages[7]).iter().all(|k| k.starts_with("orders-")) && count(&pages[7]) == "10,000+");
    assert!(ids(&pages[8]).contains(&some_id) && ids(&pages[8]).iter().all(|id| id.starts_with(&some_id[..13])));
    assert_eq!(keys(&pages[9]), [format!("{biz_type}-{target}")]);
    assert_eq!(keys(&pages[10]), [format!("{biz_type}-{target}")]);
    let failed = keys(&pages[11]);
    assert!(
        failed.len() == 50 && failed.iter().all(|k| k.starts_with("billing-1") && k.rsplit('-').next().unwrap().parse::<i64>().unwrap() % 20 == 5),
        "{failed:?}"
    );
    assert!(biz_type == "billing" || keys(&pages[12]).is_empty(), "{biz_type} has no failed task");
}

/// What the search indexes cost at insert: 100,000 keyed tasks with a payload created
/// through the batch API (1,000 a request), without task_keys_prefix_idx, tasks_payload_resting_idx
/// and tasks_retrying_idx, then with them, three times each in turn (the table growing).
/// Prints each round's time; run by hand
/// (`cargo test --release --test api insert_cost_of -- --ignored --nocapture`).
#[tokio::test]
#[ignore = "a measurement, not a check: run by hand"]
async fn insert_cost_of_the_search_indexes() {
    let app = spawn_app().await;
    let token = app.biz_type("orders").await;
    for name in ["billing", "coupons", "emails"] {
        app.biz_type(name).await;
    }
    chime::partitions::complete_indexes(&app.pool).await.unwrap();
    let drop = "DROP INDEX task_keys_prefix_idx, tasks_payload_resting_idx, tasks_retrying_idx";
    let make = [
        r#"CREATE INDEX task_keys_prefix_idx ON task_keys (biz_type_id, key COLLATE "C")"#,
        "CREATE INDEX tasks_payload_resting_idx ON tasks USING gin (payload jsonb_path_ops) WHERE status <> 'running'",
        "CREATE INDEX tasks_retrying_idx ON tasks (biz_type_id, run_at, id) WHERE status = 'pending' AND (attempt_count > 0 OR last_error IS NOT NULL)",
    ];
    let rounds: i64 = std::env::var("CHIME_FIND_ROWS").ok().and_then(|n| n.parse().ok()).unwrap_or(100_000) / 1000;
    for (round, with) in [(0, false), (1, true), (2, false), (3, true), (4, false), (5, true)] {
        if with {
            for statement in make {
                sqlx::query(sqlx::AssertSqlSafe(statement)).execute(&app.pool).await.unwrap();
            }
        } else {
            sqlx::query(drop).execute(&app.pool).await.unwrap();
        }
        let started = Instant::now();
        for batch in 0..rounds {
            let items: Vec<Value> = (0..1000)
                .map(|i| {
                    let n = (round * rounds + batch) * 1000 + i;
                    json!({"biz_type": "orders", "key": format!("order-{n}"), "delay_ms": 3_600_000, "payload": {"order_id": n, "customer": format!("c{}", n % 1000)}})
                })
                .collect();
            let reply = app.post("/api/v1/tasks/batch", &token, json!({"tasks": items})).await;
            assert_eq!(reply.status, 200);
        }
        let took = started.elapsed();
        let loaded = Instant::now();
        load(&app, 10_000_000 + round * 100_000 + 1, 10_000_000 + (round + 1) * 100_000).await;
        println!(
            "{} search indexes: 100000 rows in one INSERT … SELECT in {:.2} s",
            if with { "with   " } else { "without" },
            loaded.elapsed().as_secs_f64()
        );
        println!(
            "{} search indexes: {} tasks in {:.2} s ({:.0} a second)",
            if with { "with   " } else { "without" },
            rounds * 1000,
            took.as_secs_f64(),
            (rounds * 1000) as f64 / took.as_secs_f64()
        );
    }
}

/// On a database whose collation is not "C" (ICU's en-US here), a key's start still finds
/// exactly the keys that start with it, in code point order: the search compares in "C"
/// (task_keys_prefix_idx), not in the database's order, where `order-1` may sort beside
/// `order1` or `Order-1`.
#[tokio::test]
async fn a_key_prefix_is_exact_whatever_the_database_collation() {
    let mut url = url::Url::parse(&crate::helpers::fresh_database().await).unwrap();
    let name = format!("{}_icu", url.path().trim_start_matches('/'));
    let mut conn = sqlx::PgConnection::connect(url.as_str()).await.unwrap();
    let made =
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name} LOCALE_PROVIDER icu ICU_LOCALE 'en-US' LOCALE 'C' TEMPLATE template0")))
            .execute(&mut conn)
            .await;
    if let Err(e) = made {
        // A server built without ICU: nothing to compare against.
        println!("skipped: this PostgreSQL cannot make an ICU database ({e})");
        return;
    }
    url.set_path(&format!("/{name}"));
    let mut conn = sqlx::PgConnection::connect(url.as_str()).await.unwrap();
    chime::db::migrate_on(&mut conn).await.unwrap();
    let app = crate::helpers::spawn_on(url.to_string(), chime::config::ServeArgs::default()).await;
    let token = app.biz_type("orders").await;
    let keys_made = ["order-1", "order1", "order-10", "Order-1x", "order10", "order-1é", "order-2", "order-", "order-1~"];
    create(&app, &token, keys_made.iter().map(|k| json!({"biz_type": "orders", "key": k})).collect()).await;
    let admin = sign_in(&app, "admin", ADMIN_PASSWORD).await;

    let page = ok(&admin, "/console/tasks?q=order-1").await;
    assert_eq!(keys(&page), ["order-1", "order-10", "order-1~", "order-1é"]);
    assert_eq!(count(&page), "4");
    let page = ok(&admin, "/console/tasks?biz_type=orders&q=order-").await;
    assert_eq!(keys(&page), ["order-", "order-1", "order-10", "order-1~", "order-1é", "order-2"]);
}
