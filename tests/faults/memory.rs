//! What large requests cost a real `chime serve` process: the memory of a maximal batch,
//! and payloads that would grow once stored.

use chime::biz_types::Settings;
use serde_json::Value;

use crate::helpers::{chime_node, client, fresh_database};
use crate::{biz_type, heavy, peak_rss_kib};

const MIB: usize = 1024 * 1024;

/// Posts a batch body as sent; returns each item's status.
async fn post_batch(address: &str, token: &str, body: String) -> Vec<Value> {
    let response = client()
        .post(format!("{address}/api/v1/tasks/batch"))
        .bearer_auth(token)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let body: Value = response.json().await.unwrap();
    body["results"].as_array().unwrap().iter().map(|r| r["status"].clone()).collect()
}

/// A maximal batch (1000 items, 32 MiB of payloads of small numbers) costs the node a few
/// times its size, not the gigabytes its payloads cost as value trees; a body of millions of
/// tiny items is refused at item 1001. Payloads of `1e308`, 54 KB sent and 2.8 MB stored, are refused
/// (413) alone and in a batch, and nothing is stored.
#[tokio::test]
async fn a_maximal_batch_costs_about_its_size_and_growing_payloads_are_refused() {
    let _heavy = heavy().await;
    let db_url = fresh_database().await;
    let pool = chime::db::connect(&db_url, 2).await.unwrap();
    let token = biz_type(&pool, "orders", "http://127.0.0.1:9/callback", Settings::default()).await;
    let (node, address) = chime_node(&db_url, &[]).await;
    let pid = node.id().unwrap();

    // 16,700 small numbers: 33,401 bytes sent, 50,100 stored (", " between them), within the
    // 64 KiB limit; due in an hour, so nothing is delivered meanwhile.
    let payload = format!("[{}]", vec!["7"; 16_700].join(","));
    let item = format!(r#"{{"biz_type": "orders", "delay_ms": 3600000, "payload": {payload}}}"#);
    let body = format!(r#"{{"tasks": [{}]}}"#, vec![item.as_str(); 1000].join(", "));
    assert!((31 * MIB..=32 * MIB).contains(&body.len()), "{} bytes", body.len());
    let before = peak_rss_kib(pid);
    let statuses = post_batch(&address, &token, body).await;
    let after = peak_rss_kib(pid);
    assert!(statuses.iter().all(|s| s == 201), "every item created");
    println!("a 32 MiB batch: node peak memory {} MiB before, {} MiB after", before / 1024, after / 1024);
    // Copies of about the batch's size, some alive at once: the body (32 MiB, dropped once the
    // payloads are copied out of it), the payloads (32 MiB), the statement's parameters and
    // the message carrying them to PostgreSQL (32 MiB each, in buffers grown by doubling), and
    // the answer (33 MiB). Measured: +131 to +162 MiB in a debug build; with value trees it
    // was +2,241 MiB. 200 MiB is six times the batch, a tenth of what it was.
    assert!(after - before < 200 * 1024, "the node's peak grew by {} MiB for one 32 MiB batch", (after - before) / 1024);

    // Millions of tiny items are refused at the 1001st, not parsed first (16 million values
    // cost more than the batch of payloads above).
    let tiny = format!(r#"{{"tasks": [{}]}}"#, vec!["{}"; 10_000_000].join(","));
    let reply = client()
        .post(format!("{address}/api/v1/tasks/batch"))
        .bearer_auth(&token)
        .header("content-type", "application/json")
        .body(tiny)
        .send()
        .await
        .unwrap();
    assert_eq!(reply.status(), 422);
    let message = reply.text().await.unwrap();
    assert!(message.contains("tasks: must hold 1 to 1000 items"), "{message}");
    let after = peak_rss_kib(pid);
    println!("10 million empty items: refused; node peak memory now {} MiB", after / 1024);
    assert!(after - before < 200 * 1024, "the node's peak grew by {} MiB", (after - before) / 1024);

    let numbers = format!("[{}]", vec!["1e308"; 9_000].join(","));
    let create = format!(r#"{{"biz_type": "orders", "payload": {numbers}}}"#);
    let reply = client()
        .post(format!("{address}/api/v1/tasks"))
        .bearer_auth(&token)
        .header("content-type", "application/json")
        .body(create.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(reply.status(), 413);
    let batch = format!(r#"{{"tasks": [{}]}}"#, vec![create.as_str(); 100].join(", "));
    let statuses = post_batch(&address, &token, batch).await;
    assert!(statuses.iter().all(|s| s == 413), "every item refused: {statuses:?}");
    let grown: i64 =
        sqlx::query_scalar("SELECT count(*) FROM all_tasks WHERE run_at < now() + interval '30 minutes'").fetch_one(&pool).await.unwrap();
    assert_eq!(grown, 0, "nothing stored of the payloads that grow");
    println!("54 KB of 1e308, alone and 100 in a batch: refused; node peak memory now {} MiB", peak_rss_kib(pid) / 1024);
}
