//! What many callers of one kind cost the database and the node: waiting pull reserves,
//! and list answers of large payloads.
//!
//! The database's work is counted as the statements a node sends, by a proxy between the
//! node and PostgreSQL (`StatementCounter`): `pg_stat_database` counts only what each
//! backend has flushed, which lags by up to 10 s.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use chime::biz_types::{self, Settings};
use chime::callback_hosts::CallbackHosts;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::helpers::{chime_node, client, fresh_database};
use crate::receiver::{Answer, Receiver};
use crate::{biz_type, heavy};

/// A TCP proxy in front of PostgreSQL that counts the statements sent through it: each
/// simple query (`Q`) and each extended-protocol round trip (`S`, Sync) is one, sqlx's
/// test of a connection as its pool hands it out (a bare Sync) too.
struct StatementCounter {
    url: String,
    statements: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl StatementCounter {
    async fn start(db_url: &str) -> StatementCounter {
        let mut url = url::Url::parse(db_url).unwrap();
        let port = url.port().unwrap_or(5432);
        // The harness's server listens on a Unix socket in the `host` directory.
        let socket_dir = url.query_pairs().find(|(k, _)| k == "host").map(|(_, v)| v.into_owned());
        let upstream = match &socket_dir {
            Some(dir) => format!("{dir}/.s.PGSQL.{port}"),
            None => format!("{}:{port}", url.host_str().unwrap()),
        };
        let others: Vec<(String, String)> =
            url.query_pairs().filter(|(k, _)| k != "host" && k != "sslmode").map(|(k, v)| (k.into_owned(), v.into_owned())).collect();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        url.set_host(Some("127.0.0.1")).unwrap();
        url.set_port(Some(listener.local_addr().unwrap().port())).unwrap();
        // The node must not try TLS through the proxy: the counter reads the messages.
        url.query_pairs_mut().clear().extend_pairs(others).append_pair("sslmode", "disable");
        let statements = Arc::new(AtomicU64::new(0));
        let counted = statements.clone();
        let task = tokio::spawn(async move {
            let mut sessions = tokio::task::JoinSet::new();
            while let Ok((client, _)) = listener.accept().await {
                let (upstream, counted, unix) = (upstream.clone(), counted.clone(), socket_dir.is_some());
                sessions.spawn(async move {
                    let (mut from_client, mut to_client) = client.into_split();
                    if unix {
                        let Ok(server) = tokio::net::UnixStream::connect(&upstream).await else { return };
                        let (mut from_server, mut to_server) = server.into_split();
                        let back = tokio::spawn(async move { tokio::io::copy(&mut from_server, &mut to_client).await });
                        let _ = count_messages(&mut from_client, &mut to_server, &counted).await;
                        back.abort();
                    } else {
                        let Ok(server) = TcpStream::connect(&upstream).await else { return };
                        let (mut from_server, mut to_server) = server.into_split();
                        let back = tokio::spawn(async move { tokio::io::copy(&mut from_server, &mut to_client).await });
                        let _ = count_messages(&mut from_client, &mut to_server, &counted).await;
                        back.abort();
                    }
                });
            }
        });
        StatementCounter { url: url.to_string(), statements, task }
    }

    fn count(&self) -> u64 {
        self.statements.load(Ordering::SeqCst)
    }

    /// The fewest statements a second over `n` seconds: the node's own work (heartbeats,
    /// leader duties) comes in bursts a few seconds apart, which the floor leaves out.
    async fn floor_rate(&self, n: usize) -> f64 {
        let mut floor = f64::MAX;
        for _ in 0..n {
            floor = floor.min(self.rate_over(Duration::from_secs(1)).await);
        }
        floor
    }

    /// Statements per second over `window`.
    async fn rate_over(&self, window: Duration) -> f64 {
        let before = self.count();
        tokio::time::sleep(window).await;
        (self.count() - before) as f64 / window.as_secs_f64()
    }
}

impl Drop for StatementCounter {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Passes a client's messages on to the server, counting its statements. The first
/// messages have no type byte (an SSL or GSS request, then the startup message, protocol
/// 3.0); every later one does.
async fn count_messages(
    from: &mut (impl tokio::io::AsyncRead + Unpin),
    to: &mut (impl tokio::io::AsyncWrite + Unpin),
    counted: &AtomicU64,
) -> std::io::Result<()> {
    let mut from = tokio::io::BufReader::new(from);
    let mut started = false;
    loop {
        let kind = if started { Some(from.read_u8().await?) } else { None };
        let len = from.read_u32().await?;
        let mut body = vec![0; len.saturating_sub(4) as usize];
        from.read_exact(&mut body).await?;
        let mut message = Vec::with_capacity(len as usize + 1);
        message.extend(kind);
        message.extend(len.to_be_bytes());
        message.extend(&body);
        to.write_all(&message).await?;
        match kind {
            None => started = body.get(..4) == Some(&196_608u32.to_be_bytes()[..]),
            Some(b'Q' | b'S') => {
                counted.fetch_add(1, Ordering::SeqCst);
            }
            Some(_) => {}
        }
    }
}

/// A pull biz type named `name`; returns a token for it.
async fn pull_biz_type(pool: &chime::db::Pool, name: &str) -> String {
    biz_types::create(pool, name, &Settings { mode: Some("pull".into()), ..Default::default() }, CallbackHosts::Any).await.unwrap();
    biz_types::create_token(pool, name).await.unwrap()
}

/// Creates `n` tasks of `biz`, due now, one request each, `per_second` a second; returns
/// each create's time (10 s for one that failed).
async fn due_creates(address: &str, token: &str, biz: &str, n: usize, per_second: u32) -> Vec<Duration> {
    let client = client();
    let mut every = tokio::time::interval(Duration::from_secs(1) / per_second);
    let mut took = Vec::with_capacity(n);
    for i in 0..n {
        every.tick().await;
        let started = Instant::now();
        let response = client
            .post(format!("{address}/api/v1/tasks"))
            .bearer_auth(token)
            .json(&json!({"biz_type": biz, "payload": i}))
            .timeout(Duration::from_secs(10))
            .send()
            .await;
        match response {
            Ok(response) if response.status() == 201 => took.push(started.elapsed()),
            failed => {
                println!("a create failed: {failed:?}");
                took.push(Duration::from_secs(10));
            }
        }
    }
    took
}

fn p99(mut took: Vec<Duration>) -> Duration {
    took.sort();
    took[(took.len() * 99 / 100).min(took.len() - 1)]
}

/// The slowest of `n` health probes, one after another; a probe that fails or is not
/// answered within 5 s counts as 5 s.
async fn slowest_healthz(address: &str, n: usize) -> Duration {
    let client = client();
    let mut slowest = Duration::ZERO;
    for _ in 0..n {
        let started = Instant::now();
        let answered = client.get(format!("{address}/healthz")).timeout(Duration::from_secs(5)).send().await;
        let took = match answered {
            Ok(response) if response.status() == 200 => started.elapsed(),
            failed => {
                println!("/healthz: {failed:?}");
                Duration::from_secs(5)
            }
        };
        slowest = slowest.max(took);
    }
    slowest
}

/// 1,000 reserves waiting on one pull biz type cost the database about what one waiter
/// costs: a few statements a second more than the idle node, also while another biz type
/// creates 20 due tasks a second (those wake its engine, not the waiters). `/healthz`
/// stays quick, and a task of the waiters' biz type goes to exactly one of them at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_thousand_waiting_reserves_cost_the_database_about_what_one_does() {
    let _heavy = heavy().await;
    let db_url = fresh_database().await;
    let pool = chime::db::connect(&db_url, 2).await.unwrap();
    let receiver = Receiver::start(vec![], Answer::status(200)).await;
    let jobs = pull_biz_type(&pool, "jobs").await;
    let orders = biz_type(&pool, "orders", &receiver.url, Settings::default()).await;
    let counter = StatementCounter::start(&db_url).await;
    // Room for the waiters' connections beside the probes' (the default is 500).
    let (_node, address) = chime_node(&counter.url, &[("CHIME_MAX_CONNECTIONS", "4000")]).await;

    let idle = counter.floor_rate(4).await;
    let started = counter.count();
    let quiet_creates = due_creates(&address, &orders, "orders", 40, 20).await;
    let creating = (counter.count() - started) as f64 / 2.0;
    println!(
        "without waiters: {idle:.0} statements/s idle (the floor of 4 s), {creating:.0}/s with 20 due creates/s of another biz type (create p99 {:?})",
        p99(quiet_creates.clone())
    );

    // One client for all: a client each would set up TLS 1,000 times over.
    let waiting_client = client();
    let reserve = |_| {
        let (address, jobs, client) = (address.clone(), jobs.clone(), waiting_client.clone());
        tokio::spawn(async move {
            let response = client
                .post(format!("{address}/api/v1/biz-types/jobs/reserve"))
                .bearer_auth(jobs)
                .json(&json!({"wait_ms": 30000}))
                .send()
                .await
                .map_err(|e| format!("{e:?}"))?;
            match response.status().as_u16() {
                200 => response.json::<Value>().await.map_err(|e| e.to_string()),
                status => Err(format!("{status}")),
            }
        })
    };
    // One waiter first: what the 1,000 are compared with.
    let mut waiters: Vec<_> = (0..1).map(reserve).collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let one = counter.floor_rate(4).await;
    waiters.extend((1..1000).map(reserve));
    // Each reserve costs a few statements as it comes in (its biz type read, a first look):
    // wait until those are over, that is until a second passes with about the idle node's
    // statements (at most 10 s: waiters that keep looking never get there).
    let settling = Instant::now();
    loop {
        let rate = counter.rate_over(Duration::from_secs(1)).await;
        if rate < idle + 20.0 || settling.elapsed() > Duration::from_secs(10) {
            break;
        }
    }
    let waiting = counter.floor_rate(4).await;
    let healthz = slowest_healthz(&address, 20).await;
    let started = counter.count();
    let busy_creates = due_creates(&address, &orders, "orders", 40, 20).await;
    let creating_waiting = (counter.count() - started) as f64 / 2.0;
    let failed = waiters.iter().filter(|w| w.is_finished()).count();
    println!(
        "one waiter: {one:.0} statements/s idle; 1,000 waiters: {waiting:.0} statements/s idle (the floor of 4 s), {creating_waiting:.0}/s with 20 due creates/s of another biz type (create p99 {:?}); slowest /healthz {healthz:?}; {failed} reserves ended early",
        p99(busy_creates)
    );
    assert_eq!(failed, 0, "reserves waiting 30 s ended early: {:?}", {
        let mut ended = Vec::new();
        for w in waiters.iter_mut().filter(|w| w.is_finished()).take(3) {
            ended.push(w.await.unwrap());
        }
        ended
    });
    // 1,000 waiters cost what one does: one look a second, 4 queries (the biz type, the
    // in-flight count, the reserve, the next due time; read in the node's sqlx log), which
    // the proxy counts as +12 to +22 messages a second over the idle node, whose own floor
    // moves by a few from one second to the next. Without the line: ~47,000 a second.
    assert!(waiting < one + 8.0, "one waiter took the idle node from {idle:.0} to {one:.0} messages/s, 1,000 waiters to {waiting:.0}");
    // The engine's statements for the creates vary by a few percent from one window to the
    // next; without the waiters' line, every create woke 1,000 looks (~47,000 statements/s).
    assert!(
        creating_waiting < creating * 1.1 + 10.0,
        "1,000 waiters took the node creating another biz type's tasks from {creating:.0} to {creating_waiting:.0} statements/s"
    );
    assert!(healthz < Duration::from_millis(100), "/healthz took {healthz:?} beside 1,000 waiters");

    // A task of their biz type goes to one waiter, at once.
    let created = Instant::now();
    let response = client()
        .post(format!("{address}/api/v1/tasks"))
        .bearer_auth(&jobs)
        .json(&json!({"biz_type": "jobs", "payload": "one"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 201);
    let answered = loop {
        let finished = waiters.iter().position(|w| w.is_finished());
        if let Some(i) = finished {
            break waiters.swap_remove(i).await.unwrap().unwrap();
        }
        assert!(created.elapsed() < Duration::from_secs(2), "no waiter got the task within 2 s");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    println!("a task of the waiters' biz type reached one of them {:?} after its create", created.elapsed());
    assert_eq!(answered["tasks"][0]["payload"], "one", "{answered}");
    assert!(waiters.iter().all(|w| !w.is_finished()), "only one waiter answered");
    for waiter in waiters {
        waiter.abort();
    }
}

/// 8 parallel lists of `limit=1000` over 1,000 tasks of 32 KB payloads cost the node a few
/// pages of about 2 MiB each, not 8 times the 32 MB of payloads: its peak memory grows by
/// less than 100 MiB (before the byte budget: +343 MB in a release build).
#[tokio::test]
async fn parallel_lists_of_large_payloads_take_pages_of_bounded_size() {
    let _heavy = heavy().await;
    let db_url = fresh_database().await;
    let pool = chime::db::connect(&db_url, 2).await.unwrap();
    let token = biz_type(&pool, "orders", "http://127.0.0.1:9/callback", Settings::default()).await;
    let (node, address) = chime_node(&db_url, &[]).await;
    let pid = node.id().unwrap();
    let big = "x".repeat(32 * 1024);
    // Due in an hour, in batches of 50, so that creating them costs the node little.
    let items: Vec<Value> = (0..1000).map(|i| json!({"biz_type": "orders", "delay_ms": 3_600_000, "payload": [i, big]})).collect();
    for chunk in items.chunks(50) {
        crate::create_tasks(&address, &token, chunk.to_vec()).await;
    }
    let before = crate::peak_rss_kib(pid);
    let lists: Vec<_> = (0..8)
        .map(|_| {
            let (address, token) = (address.clone(), token.clone());
            tokio::spawn(async move {
                let response = client().get(format!("{address}/api/v1/tasks?limit=1000")).bearer_auth(token).send().await.unwrap();
                assert_eq!(response.status(), 200);
                let page: Value = response.json().await.unwrap();
                (page["items"].as_array().unwrap().len(), page["next_cursor"].is_string())
            })
        })
        .collect();
    let mut pages = Vec::new();
    for list in lists {
        pages.push(list.await.unwrap());
    }
    let after = crate::peak_rss_kib(pid);
    println!("8 parallel lists (tasks, more?): {pages:?}; node peak memory {} MiB before, {} MiB after", before / 1024, after / 1024);
    assert!(pages.iter().all(|&(n, more)| (1..1000).contains(&n) && more), "each a page cut by bytes, with a cursor: {pages:?}");
    assert!(after - before < 100 * 1024, "8 parallel lists took the node's peak up by {} MiB", (after - before) / 1024);
}

/// Measures (ignored by default: ~60 s) what 16 clients dry-running a key prefix over
/// 200,000 pending tasks cost another biz type's creates, 30 a second for 20 s (fewer made
/// the p99 alone swing from 5 to 9 ms between runs): their p99
/// with the dry runs stays within 1.5 times of without (before one bulk operation per biz
/// type at a time: 41 -> ~600 ms in a release build). The clients wait as Retry-After says
/// when refused. `cargo test --test faults -- --ignored bulk_dry_runs --nocapture`
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore]
async fn bulk_dry_runs_leave_another_biz_type_s_creates_alone() {
    let _heavy = heavy().await;
    let db_url = fresh_database().await;
    let pool = chime::db::connect(&db_url, 2).await.unwrap();
    let receiver = Receiver::start(vec![], Answer::status(200)).await;
    let orders = biz_type(&pool, "orders", &receiver.url, Settings::default()).await;
    let coupons = biz_type(&pool, "coupons", &receiver.url, Settings::default()).await;
    // The node makes the partitions the tasks go to.
    let (_node, address) = chime_node(&db_url, &[]).await;
    // 200,000 pending tasks of `orders`, due in an hour, keys order-<i>.
    sqlx::query(
        "WITH rows AS (
             SELECT gen_random_uuid() AS id, 'order-' || i AS key, now() + interval '1 hour' + i * interval '1 millisecond' AS run_at
               FROM generate_series(1, 200000) i
         ), keys AS (
             INSERT INTO task_keys (biz_type_id, key, task_id, request_hash)
             SELECT (SELECT id FROM biz_types WHERE name = 'orders'), key, id, '\\x00' FROM rows
         )
         INSERT INTO tasks (id, biz_type_id, key, run_at, first_run_at)
         SELECT id, (SELECT id FROM biz_types WHERE name = 'orders'), key, run_at, run_at FROM rows",
    )
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query("VACUUM ANALYZE tasks").execute(&pool).await.unwrap();

    let quiet = p99(due_creates(&address, &coupons, "coupons", 600, 30).await);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let clients: Vec<_> = (0..16)
        .map(|_| {
            let (address, orders, stop) = (address.clone(), orders.clone(), stop.clone());
            tokio::spawn(async move {
                let client = client();
                let (mut served, mut refused) = (0, 0);
                while !stop.load(Ordering::SeqCst) {
                    let response = client
                        .post(format!("{address}/api/v1/biz-types/orders/tasks/cancel"))
                        .bearer_auth(&orders)
                        .json(&json!({"key_prefix": "order-1", "dry_run": true}))
                        .send()
                        .await
                        .unwrap();
                    match response.status().as_u16() {
                        200 => served += 1,
                        429 => {
                            refused += 1;
                            let wait: u64 = response.headers()["retry-after"].to_str().unwrap().parse().unwrap();
                            tokio::time::sleep(Duration::from_secs(wait)).await;
                        }
                        status => panic!("a dry run answered {status}"),
                    }
                }
                (served, refused)
            })
        })
        .collect();
    let busy = p99(due_creates(&address, &coupons, "coupons", 600, 30).await);
    stop.store(true, Ordering::SeqCst);
    let (mut served, mut refused) = (0, 0);
    for client in clients {
        let (s, r) = client.await.unwrap();
        (served, refused) = (served + s, refused + r);
    }
    println!(
        "another biz type's create p99: {quiet:?} alone, {busy:?} beside 16 clients dry-running a prefix over 200,000 tasks ({served} dry runs served, {refused} refused)"
    );
    assert!(busy.as_secs_f64() < quiet.as_secs_f64() * 1.5, "create p99 {quiet:?} -> {busy:?}");
}

/// 2,000 idle biz types cost the database about what 10 do, and a burst of a busy one
/// among them is delivered promptly. Before, each engine turn claimed every biz type, one
/// statement after another: with 2,000 idle ones the idle database ran ~1,220
/// transactions a second (35 without), and of a burst of 500, 38 were still undelivered
/// after 8 s. The engine now claims only the biz types due (one statement for all), and
/// learns when each is next due from one statement a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_thousand_idle_biz_types_cost_about_what_ten_do() {
    let _heavy = heavy().await;
    let db_url = fresh_database().await;
    let pool = chime::db::connect(&db_url, 2).await.unwrap();
    let receiver = Receiver::start(vec![], Answer::status(200)).await;
    let busy = biz_type(&pool, "busy", &receiver.url, Settings::default()).await;
    let add_idle = |from: i32, to: i32| {
        sqlx::query(
            "INSERT INTO biz_types (name, callback_url, signing_secret) SELECT 'idle-' || i, $3, 'idle-secret' FROM generate_series($1, $2) i",
        )
        .bind(from)
        .bind(to)
        .bind(&receiver.url)
        .execute(&pool)
    };
    add_idle(1, 9).await.unwrap();
    let counter = StatementCounter::start(&db_url).await;
    let (_node, address) = chime_node(&counter.url, &[]).await;
    let ten = counter.floor_rate(4).await;

    add_idle(10, 1999).await.unwrap();
    // The node re-reads its biz types within 2 s.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let two_thousand = counter.floor_rate(4).await;
    println!("statements/s at idle (the floor of 4 s): {ten:.0} with 10 biz types, {two_thousand:.0} with 2,000");

    let started = Instant::now();
    crate::create_tasks(&address, &busy, (0..500).map(|i| json!({"biz_type": "busy", "payload": i})).collect()).await;
    let delivered = receiver.wait_for(500, Duration::from_secs(20)).await.len();
    println!("a burst of 500 of one biz type among 2,000: {delivered} delivered in {:?}", started.elapsed());
    assert!(two_thousand <= ten * 2.0 + 5.0, "statements/s at idle: {ten:.0} with 10 biz types, {two_thousand:.0} with 2,000");
    assert_eq!(delivered, 500);
    assert!(started.elapsed() < Duration::from_secs(8), "the burst took {:?}", started.elapsed());
}
