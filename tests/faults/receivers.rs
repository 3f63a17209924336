//! Receivers that are gone or misbehave.

use std::collections::HashMap;
use std::time::Duration;

use chime::biz_types::Settings;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::helpers::{chime_node, free_port, fresh_database};
use crate::receiver::{Answer, Receiver};
use crate::{Tally, biz_type, create_tasks, db_now, heavy, rss_kib, statuses, wait_all_finished};

/// The receiver is down for a minute, then back: its breaker opens (the tasks wait rather
/// than burn their attempts: fewer attempts than tasks in the minute, the first failures
/// and a probe every 5 s), a probe closes it when the receiver is back, every task is
/// delivered, none is marked delivered while it is away, and each arrives once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_down_for_a_minute_gets_every_task_when_back() {
    const TASKS: usize = 100;
    let db_url = fresh_database().await;
    let pool = chime::db::connect(&db_url, 4).await.unwrap();
    let port = free_port(); // nothing listens there for now
    let settings =
        Settings { timeout_ms: Some(1000), max_attempts: Some(100), backoff_initial_ms: Some(500), backoff_max_ms: Some(5000), ..Default::default() };
    let token = biz_type(&pool, "orders", &format!("http://127.0.0.1:{port}/hook"), settings).await;
    let (_node, address) = chime_node(&db_url, &[]).await;
    // Half due at once, half one a second through the minute the receiver is away.
    let tasks = (0..TASKS).map(|i| json!({"biz_type": "orders", "delay_ms": i.saturating_sub(TASKS / 2) * 1000})).collect();
    let ids = create_tasks(&address, &token, tasks).await;

    // A sleep on purpose: the minute the receiver stays away is the scenario itself.
    tokio::time::sleep(Duration::from_secs(60)).await;
    let (attempts, refused): (i64, i64) =
        sqlx::query_as("SELECT count(*), count(*) FILTER (WHERE error LIKE 'could not connect%') FROM attempts").fetch_one(&pool).await.unwrap();
    assert_eq!(statuses(&pool).await.get("succeeded"), None, "nothing is delivered while the receiver is away");
    assert!(attempts < TASKS as i64 && refused == attempts, "{attempts} attempts, {refused} refused connections");

    let back_at = db_now(&pool).await;
    let receiver = Receiver::start_at(port, vec![], Answer::status(200)).await;
    let statuses = wait_all_finished(&pool, Duration::from_secs(30)).await;
    let tally = Tally::of(&receiver.received());
    println!(
        "receiver down for a minute: {TASKS} tasks, {attempts} attempts refused while it was away; \
         delivered {}, duplicated {}, lost {}",
        tally.delivered(),
        tally.duplicated(),
        tally.lost(&ids)
    );
    assert_eq!(statuses.get("succeeded"), Some(&(TASKS as i64)), "{statuses:?}");
    assert_eq!(tally.lost(&ids), 0);
    assert_eq!(tally.duplicated(), 0);
    let early: i64 = sqlx::query_scalar("SELECT count(*) FROM tasks WHERE finished_at < $1").bind(back_at).fetch_one(&pool).await.unwrap();
    assert_eq!(early, 0, "tasks marked delivered before the receiver was back");
}

#[derive(Clone, Copy, Debug)]
enum Misbehaviour {
    /// Accepts the connection, reads the request, never answers.
    Hangs,
    /// Reads the request and resets the connection.
    Resets,
    /// Sends its status line, then a header a byte every 200 ms.
    Drips,
    /// Answers 200 with a body that never ends.
    EndlessBody,
    /// Answers with a header line that never ends.
    EndlessHeader,
}

/// A raw TCP receiver that misbehaves so; returns its URL.
async fn misbehaving(how: Misbehaviour) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move {
        loop {
            let (socket, _) = listener.accept().await.unwrap();
            tokio::spawn(misbehave(how, socket));
        }
    });
    url
}

async fn misbehave(how: Misbehaviour, mut socket: TcpStream) {
    let mut buf = vec![0u8; 64 * 1024];
    let _ = socket.read(&mut buf).await;
    let chunk = vec![b'x'; 64 * 1024];
    match how {
        // Until chime gives up and closes.
        Misbehaviour::Hangs => while socket.read(&mut buf).await.is_ok_and(|n| n > 0) {},
        Misbehaviour::Resets => {
            socket.set_zero_linger().unwrap();
            drop(socket);
        }
        Misbehaviour::Drips => {
            let _ = socket.write_all(b"HTTP/1.1 200 OK\r\nX-Slow: ").await;
            while socket.write_all(b"x").await.is_ok() {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        Misbehaviour::EndlessBody => {
            let _ = socket.write_all(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\n").await;
            while socket.write_all(&chunk).await.is_ok() {}
        }
        Misbehaviour::EndlessHeader => {
            let _ = socket.write_all(b"HTTP/1.1 200 OK\r\nX-Big: ").await;
            while socket.write_all(&chunk).await.is_ok() {}
        }
    }
}

/// Receivers that hang, reset, drip, or answer without end, beside a healthy one: every
/// attempt ends within its 1 s timeout, the node's memory stays bounded, and the healthy
/// biz type's tasks are delivered on time, once each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn misbehaving_receivers_cost_only_their_own_biz_type() {
    const BAD_TASKS: usize = 100;
    const GOOD_TASKS: usize = 200;
    let _turn = heavy().await;
    let db_url = fresh_database().await;
    let pool = chime::db::connect(&db_url, 4).await.unwrap();
    let bad = [
        ("hangs", Misbehaviour::Hangs),
        ("resets", Misbehaviour::Resets),
        ("drips", Misbehaviour::Drips),
        ("endless-body", Misbehaviour::EndlessBody),
        ("endless-header", Misbehaviour::EndlessHeader),
    ];
    let mut tokens = HashMap::new();
    for (name, how) in bad {
        // No breaker: every task is tried its 3 times, which is what this test measures.
        let settings = Settings {
            timeout_ms: Some(1000),
            max_attempts: Some(3),
            backoff_initial_ms: Some(100),
            backoff_max_ms: Some(100),
            breaker_threshold: Some(0),
            ..Default::default()
        };
        tokens.insert(name, biz_type(&pool, name, &misbehaving(how).await, settings).await);
    }
    let good = Receiver::start(vec![], Answer::status(200)).await;
    let good_token = biz_type(&pool, "good", &good.url, Settings::default()).await;
    let (node, address) = chime_node(&db_url, &[]).await;

    // Two rounds: the first shows what the misbehaviour costs at most (buffers for the
    // callbacks in flight), the second that the cost does not grow with the count.
    let mut good_ids = Vec::new();
    let mut rss = vec![rss_kib(node.id().unwrap())];
    for _round in 0..2 {
        for (name, _) in bad {
            let tasks = (0..BAD_TASKS / 2).map(|_| json!({"biz_type": name})).collect();
            create_tasks(&address, &tokens[name], tasks).await;
        }
        // The healthy tasks are due through the seconds the others misbehave.
        let good_tasks = (0..GOOD_TASKS / 2).map(|i| json!({"biz_type": "good", "delay_ms": i * 40})).collect();
        good_ids.extend(create_tasks(&address, &good_token, good_tasks).await);
        wait_all_finished(&pool, Duration::from_secs(60)).await;
        rss.push(rss_kib(node.id().unwrap()));
    }
    let statuses = statuses(&pool).await;

    let per_biz: Vec<(String, String, i64)> =
        sqlx::query_as("SELECT b.name, t.status, count(*) FROM tasks t JOIN biz_types b ON b.id = t.biz_type_id GROUP BY 1, 2 ORDER BY 1, 2")
            .fetch_all(&pool)
            .await
            .unwrap();
    // Per biz type: attempts, the longest one, and a sample error.
    let attempts: Vec<(String, i64, i32, Option<String>)> = sqlx::query_as(
        "SELECT b.name, count(*), max(a.duration_ms), max(a.error) FROM attempts a
           JOIN tasks t ON t.id = a.task_id JOIN biz_types b ON b.id = t.biz_type_id GROUP BY 1 ORDER BY 1",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    let good_lateness_ms: f64 = sqlx::query_scalar(
        "SELECT (extract(epoch FROM max(a.started_at - t.run_at)) * 1000)::float8 FROM attempts a
           JOIN tasks t ON t.id = a.task_id JOIN biz_types b ON b.id = t.biz_type_id WHERE b.name = 'good'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    let tally = Tally::of(&good.received());
    println!("misbehaving receivers: tasks {per_biz:?}");
    println!("attempts (biz type, count, longest ms, an error): {attempts:#?}");
    println!(
        "healthy biz type: delivered {}, duplicated {}, lost {}, latest first attempt {good_lateness_ms:.1} ms after due; \
         node memory at start and after each round {:?} MiB",
        tally.delivered(),
        tally.duplicated(),
        tally.lost(&good_ids),
        rss.iter().map(|kib| kib / 1024).collect::<Vec<_>>()
    );

    assert_eq!(statuses.get("pending").or(statuses.get("running")), None, "{statuses:?}");
    for (name, count, longest_ms, error) in &attempts {
        assert!(*longest_ms <= 1500, "{name}: an attempt took {longest_ms} ms against a 1000 ms timeout");
        match name.as_str() {
            "good" => assert_eq!(*count, GOOD_TASKS as i64),
            // The receiver said 200: delivered, with a bounded excerpt of the endless body.
            "endless-body" => assert_eq!(*count, BAD_TASKS as i64, "{error:?}"),
            _ => assert_eq!(*count, 3 * BAD_TASKS as i64, "{name}: each task tried 3 times ({error:?})"),
        }
    }
    let expected: Vec<(String, String, i64)> = [
        ("drips", "failed", BAD_TASKS),
        ("endless-body", "succeeded", BAD_TASKS),
        ("endless-header", "failed", BAD_TASKS),
        ("good", "succeeded", GOOD_TASKS),
        ("hangs", "failed", BAD_TASKS),
        ("resets", "failed", BAD_TASKS),
    ]
    .into_iter()
    .map(|(b, s, n)| (b.to_string(), s.to_string(), n as i64))
    .collect();
    assert_eq!(per_biz, expected);
    let longest_excerpt: i32 =
        sqlx::query_scalar("SELECT coalesce(max(octet_length(response_excerpt)), 0) FROM attempts").fetch_one(&pool).await.unwrap();
    assert!(longest_excerpt <= 512, "an excerpt of {longest_excerpt} bytes");
    assert_eq!((tally.delivered(), tally.duplicated(), tally.lost(&good_ids)), (GOOD_TASKS, 0, 0));
    assert!(good_lateness_ms < 1000.0, "the healthy biz type waited {good_lateness_ms} ms behind the others");
    assert!(rss[2] < rss[1] + 16 * 1024, "the node kept growing: {rss:?} KiB");
    assert!(rss[2] < rss[0] + 128 * 1024, "the node grew from {} to {} KiB", rss[0], rss[2]);
}
