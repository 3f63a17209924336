//! The leader: election and takeover with real processes, timers and the cold-to-hot
//! migrator carrying on across a kill, partition retention.

use std::time::{Duration, Instant};

use chime::biz_types::{self, Settings};
use chime::callback_hosts::CallbackHosts;
use chime::db::Pool;
use chime::partitions::{self, Layout};
use chime::{leader, timers};
use chrono::{DateTime, Days, Utc};
use uuid::Uuid;

use crate::helpers::{chime_process, fresh_database, node_of, spawn_app, spawn_second_node, wait_until};

async fn pool(db_url: &str) -> Pool {
    chime::db::connect(db_url, 4).await.unwrap()
}

async fn biz_type_id(pool: &Pool, name: &str) -> i32 {
    let settings = Settings { callback_url: Some("http://127.0.0.1:9/callback".into()), ..Default::default() };
    biz_types::create(pool, name, &settings, CallbackHosts::Any).await.unwrap().id
}

/// Waits until `node` leads; returns how long that took.
async fn wait_leader(pool: &Pool, node: Uuid, within: Duration) -> Duration {
    let started = Instant::now();
    wait_until(&format!("node {node} leading"), within, || async {
        let leader = leader::current(pool).await.unwrap();
        if leader == Some(node) { Ok(()) } else { Err(format!("leader {leader:?}")) }
    })
    .await;
    started.elapsed()
}

/// Nodes that only keep house: no engine, a short lease and timer window.
const QUIET: &[(&str, &str)] =
    &[("CHIME_ENGINE", "false"), ("CHIME_LEADER_LEASE_SECS", "2"), ("CHIME_TIMER_WINDOW_SECS", "10"), ("CHIME_MIGRATE_BATCH", "200")];

#[tokio::test]
async fn one_node_leads_and_metrics_say_which() {
    let a = spawn_app().await;
    let _b = spawn_second_node(&a).await;
    // Both nodes register (heartbeat) and one of them leads, each within moments of starting.
    let leader = wait_until("two nodes registered and a leader", Duration::from_secs(5), || async {
        let leader = leader::current(&a.pool).await.unwrap();
        let nodes: i64 = sqlx::query_scalar("SELECT count(*) FROM nodes").fetch_one(&a.pool).await.unwrap();
        if nodes == 2 { leader.ok_or(format!("{nodes} nodes, no leader")) } else { Err(format!("{nodes} nodes, leader {leader:?}")) }
    })
    .await;
    let registered: bool = sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM nodes WHERE id = $1)").bind(leader).fetch_one(&a.pool).await.unwrap();
    assert!(registered, "the leader is one of the nodes");
    // The nodes of every test in this process share its metrics registry: look at ours.
    let ours: Vec<Uuid> = sqlx::query_scalar("SELECT id FROM nodes").fetch_all(&a.pool).await.unwrap();
    assert_eq!(ours.len(), 2);
    let metrics = a.client.get(format!("{}/metrics", a.address)).send().await.unwrap().text().await.unwrap();
    let mut lines: Vec<&str> =
        metrics.lines().filter(|l| l.starts_with("chime_leader{") && ours.iter().any(|id| l.contains(&id.to_string()))).collect();
    lines.sort_by_key(|l| !l.ends_with(" 1"));
    let follower = ours.iter().find(|id| **id != leader).unwrap();
    assert_eq!(lines, [format!("chime_leader{{node=\"{leader}\"}} 1"), format!("chime_leader{{node=\"{follower}\"}} 0")]);
}

/// `kill -9` of the leader: the other node takes over at once, and the timer's
/// occurrences go on with no gap and no duplicate.
#[tokio::test]
async fn a_killed_leader_is_replaced_and_timers_go_on() {
    let db_url = fresh_database().await;
    let pool = pool(&db_url).await;
    let biz = biz_type_id(&pool, "reports").await;
    let mut a = chime_process(&db_url, QUIET).await;
    let a_id = node_of(&pool, &a).await;
    wait_leader(&pool, a_id, Duration::from_secs(10)).await;
    let b = chime_process(&db_url, QUIET).await;
    let b_id = node_of(&pool, &b).await;

    let timer = every_second_timer(&pool, biz).await;
    // Until the first leader has written occurrences (at most 10 s): the kill then cuts a
    // timer that is under way.
    wait_until("the timer's first occurrences written", Duration::from_secs(10), || async {
        let written: i64 = sqlx::query_scalar("SELECT count(*) FROM all_tasks WHERE timer_id = $1").bind(timer.id).fetch_one(&pool).await.unwrap();
        written > 0
    })
    .await;
    a.kill().await.unwrap();
    let killed_at: DateTime<Utc> = sqlx::query_scalar("SELECT now()").fetch_one(&pool).await.unwrap();
    let takeover = wait_leader(&pool, b_id, Duration::from_secs(10)).await;
    println!("takeover after kill -9 of the leader: {takeover:?}");

    // The new leader extends the window well past the kill.
    let until = wait_until("the timer materialized well past the kill", Duration::from_secs(20), || async {
        let until: Option<DateTime<Utc>> =
            sqlx::query_scalar("SELECT materialized_until FROM timers WHERE id = $1").bind(timer.id).fetch_one(&pool).await.unwrap();
        match until {
            Some(u) if u > killed_at + chrono::Duration::seconds(15) => Ok(u),
            until => Err(format!("materialized until {until:?}")),
        }
    })
    .await;
    assert!(until > killed_at + chrono::Duration::seconds(15), "materialized only until {until}");
    let run_ats: Vec<DateTime<Utc>> =
        sqlx::query_scalar("SELECT run_at FROM all_tasks WHERE timer_id = $1 ORDER BY run_at").bind(timer.id).fetch_all(&pool).await.unwrap();
    // From just after the timer was made to well after the kill, every second, once.
    assert!(run_ats[0] <= timer.created_at + chrono::Duration::seconds(1), "first at {}", run_ats[0]);
    assert!(*run_ats.last().unwrap() >= killed_at + chrono::Duration::seconds(14));
    for pair in run_ats.windows(2) {
        assert_eq!(pair[1] - pair[0], chrono::Duration::seconds(1), "a gap or a duplicate at {}", pair[0]);
    }
    println!("leader killed while writing an every-second timer's occurrences: {} occurrences, none missing or doubled", run_ats.len());
}

/// `kill -9` of the leader while it writes the occurrences of 400 every-second timers (100
/// timers a pass, each in one transaction): the next leader writes the rest, and every
/// timer fires each second of its window exactly once.
#[tokio::test]
async fn a_leader_killed_mid_materialization_loses_and_doubles_nothing() {
    const TIMERS: i64 = 400;
    const WINDOW_SECS: i64 = 300;
    let env = &[("CHIME_ENGINE", "false"), ("CHIME_LEADER_LEASE_SECS", "2"), ("CHIME_TIMER_WINDOW_SECS", "300")];
    let db_url = fresh_database().await;
    let pool = pool(&db_url).await;
    let biz = biz_type_id(&pool, "reports").await;
    let created: DateTime<Utc> = sqlx::query_scalar(
        "INSERT INTO timers (id, biz_type_id, key, cron, timezone, payload, active, catch_up, materialized_until)
         SELECT gen_random_uuid(), $1, 'every-second-' || i, '* * * * * *', 'UTC', 'null', true, false, now()
           FROM generate_series(1, $2) i
         RETURNING now()",
    )
    .bind(biz)
    .bind(TIMERS)
    .fetch_all(&pool)
    .await
    .unwrap()[0];
    // Timers whose window has been written: their materialized_until moved on.
    let written = || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM timers WHERE materialized_until > $1 + interval '1 minute'")
            .bind(created)
            .fetch_one(&pool)
            .await
            .unwrap()
    };

    let mut a = chime_process(&db_url, env).await;
    for _ in 0..2000 {
        if written().await > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    a.kill().await.unwrap();
    let written_at_kill = written().await;
    assert!(0 < written_at_kill && written_at_kill < TIMERS, "killed mid-materialization: {written_at_kill} of {TIMERS} timers written");

    let _b = chime_process(&db_url, env).await;
    wait_until("every timer written", Duration::from_secs(60), || async { written().await == TIMERS }).await;
    assert_eq!(written().await, TIMERS, "the new leader wrote the rest");
    // Per timer: its occurrences, distinct fire times, and the span they cover.
    let per_timer: Vec<(i64, i64, DateTime<Utc>, DateTime<Utc>)> = sqlx::query_as(
        "SELECT count(*), count(DISTINCT run_at), min(run_at), max(run_at) FROM all_tasks WHERE timer_id IS NOT NULL GROUP BY timer_id",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    let occurrences: i64 = per_timer.iter().map(|t| t.0).sum();
    println!(
        "leader killed mid-materialization: {TIMERS} every-second timers, {written_at_kill} written at the kill; \
         then {occurrences} occurrences for {} timers",
        per_timer.len()
    );
    assert_eq!(per_timer.len() as i64, TIMERS);
    for (count, distinct, first, last) in per_timer {
        assert_eq!(count, distinct, "an occurrence written twice");
        assert_eq!((last - first).num_seconds() + 1, count, "a gap between {first} and {last}");
        assert!(first <= created + chrono::Duration::seconds(1), "first occurrence at {first}, created at {created}");
        assert!(count >= WINDOW_SECS, "{count} occurrences: less than the window");
    }
}

/// `kill -9` of the leader halfway through moving cold tasks into the hot partitions:
/// the next leader finishes, and every task exists exactly once.
#[tokio::test]
async fn a_leader_killed_mid_migration_loses_and_doubles_nothing() {
    const TASKS: i64 = 100_000;
    let db_url = fresh_database().await;
    let pool = pool(&db_url).await;
    let biz = biz_type_id(&pool, "orders").await;
    // Cold tasks now inside the horizon, as right after the horizon advanced.
    sqlx::query(
        "INSERT INTO tasks_cold (id, biz_type_id, run_at)
         SELECT gen_random_uuid(), $1, now() + interval '1 day' + i * interval '1 millisecond' FROM generate_series(1, $2) i",
    )
    .bind(biz)
    .bind(TASKS)
    .execute(&pool)
    .await
    .unwrap();
    let cold = || async { sqlx::query_scalar::<_, i64>("SELECT count(*) FROM tasks_cold").fetch_one(&pool).await.unwrap() };

    let mut a = chime_process(&db_url, QUIET).await;
    let mut left = TASKS;
    for _ in 0..2000 {
        left = cold().await;
        if left < TASKS * 9 / 10 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    a.kill().await.unwrap();
    let left_at_kill = cold().await;
    assert!(0 < left_at_kill && left_at_kill < TASKS, "killed mid-migration: {left} then {left_at_kill} left in cold storage");

    let _b = chime_process(&db_url, QUIET).await;
    wait_until("cold storage emptied", Duration::from_secs(60), || async { cold().await == 0 }).await;
    assert_eq!(cold().await, 0, "the new leader moved the rest");
    let (hot, distinct): (i64, i64) = sqlx::query_as("SELECT count(*), count(DISTINCT id) FROM tasks").fetch_one(&pool).await.unwrap();
    println!("leader killed mid-migration: {TASKS} cold tasks, {left_at_kill} still cold at the kill; then {hot} hot, {distinct} distinct");
    assert_eq!((hot, distinct), (TASKS, TASKS));
}

/// A task due beyond the horizon waits in cold storage and moves into its day's
/// partition once the horizon reaches it.
#[tokio::test]
async fn a_far_task_moves_into_the_hot_partitions_as_the_horizon_reaches_it() {
    let app = spawn_app().await;
    let token = app.biz_type("orders").await;
    let run_at = Utc::now() + chrono::Duration::days(30);
    let task = app.create_task(&token, serde_json::json!({"biz_type": "orders", "run_at": run_at.to_rfc3339()})).await;
    let id = task["id"].as_str().unwrap();
    assert_eq!(app.table_of(id).await, "tasks_cold");

    let wide = Layout { hot_days: 40, ..Layout::default() };
    let horizon = partitions::ensure(&app.pool, &wide).await.unwrap();
    assert!(horizon > run_at);
    while chime::tasks::placement::move_cold(&app.pool, 1000).await.unwrap() > 0 {}
    assert_eq!(app.table_of(id).await, partitions::partition_name("tasks", run_at.date_naive().and_hms_opt(0, 0, 0).unwrap().and_utc()));
    assert_eq!(app.get(&format!("/api/v1/tasks/{id}"), &token).await.body["run_at"], task["run_at"]);
}

/// Partitions of a changed width fill the gaps between the existing ones: the range from a
/// day ago to the horizon is covered without overlap.
#[tokio::test]
async fn partitions_of_another_width_fill_the_gaps() {
    let pool = pool(&fresh_database().await).await;
    partitions::ensure(&pool, &Layout::default()).await.unwrap();
    let six_hours = Layout::new(6, 4, 30).unwrap();
    let horizon = partitions::ensure(&pool, &six_hours).await.unwrap();
    let now = Utc::now();
    for table in ["tasks", "attempts"] {
        let list = partitions::list(&pool, table).await.unwrap();
        assert!(list[0].from <= now - chrono::Duration::days(1));
        assert_eq!(list.last().unwrap().to, horizon);
        for pair in list.windows(2) {
            assert_eq!(pair[0].to, pair[1].from, "contiguous: {list:?}");
        }
        assert!(list.iter().any(|p| p.to - p.from == chrono::Duration::hours(6)), "new ones are 6 hours wide");
    }
}

/// Partitions aged past retention are dropped with their tasks' keys and audited events,
/// except one that still holds an unfinished task; a partition a dead leader left detached
/// is finished.
#[tokio::test]
async fn retention_drops_old_finished_partitions_and_keeps_unfinished_ones() {
    let pool = pool(&fresh_database().await).await;
    let biz = biz_type_id(&pool, "orders").await;
    let today = Utc::now().date_naive();
    // (days ago, statuses of the tasks in it)
    let aged = [(60, vec!["succeeded", "failed", "cancelled"]), (50, vec!["succeeded", "pending"]), (45, vec!["succeeded"]), (10, vec!["succeeded"])];
    for (ago, statuses) in &aged {
        let day = today - Days::new(*ago);
        let mut tx = pool.begin().await.unwrap();
        for table in ["tasks", "attempts"] {
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "CREATE TABLE {table}_p{} PARTITION OF {table} FOR VALUES FROM ('{day} 00:00:00+00') TO ('{} 00:00:00+00')",
                day.format("%Y%m%d"),
                day + Days::new(1)
            )))
            .execute(&mut *tx)
            .await
            .unwrap();
        }
        // A bulk operation took every task of the day: one entry, an event per task.
        let entry: i64 = sqlx::query_scalar(
            "INSERT INTO audit_log (actor, action, target_type, target) VALUES ('test', 'task.bulk_cancel', 'task', 'orders') RETURNING id",
        )
        .fetch_one(&mut *tx)
        .await
        .unwrap();
        for (i, status) in statuses.iter().enumerate() {
            let id = Uuid::now_v7();
            let key = format!("{ago}-{i}");
            let run_at = day.and_hms_opt(12, 0, 0).unwrap().and_utc();
            sqlx::query(
                "INSERT INTO tasks (id, biz_type_id, key, run_at, status, finished_at)
                 VALUES ($1, $2, $3, $4, $5, CASE WHEN $5 = 'pending' THEN NULL ELSE $4 END)",
            )
            .bind(id)
            .bind(biz)
            .bind(&key)
            .bind(run_at)
            .bind(status)
            .execute(&mut *tx)
            .await
            .unwrap();
            sqlx::query("INSERT INTO task_keys (biz_type_id, key, task_id, request_hash) VALUES ($1, $2, $3, '')")
                .bind(biz)
                .bind(&key)
                .bind(id)
                .execute(&mut *tx)
                .await
                .unwrap();
            sqlx::query("INSERT INTO attempts (task_id, number, started_at, duration_ms) VALUES ($1, 1, $2, 5)")
                .bind(id)
                .bind(run_at)
                .execute(&mut *tx)
                .await
                .unwrap();
            sqlx::query("INSERT INTO task_events (task_id, audit_id) VALUES ($1, $2)").bind(id).bind(entry).execute(&mut *tx).await.unwrap();
        }
        tx.commit().await.unwrap();
    }
    // A leader died after detaching the 45-day-old partition, before dropping it.
    let day45 = (today - Days::new(45)).format("%Y%m%d");
    sqlx::query(sqlx::AssertSqlSafe(format!("ALTER TABLE tasks DETACH PARTITION tasks_p{day45}"))).execute(&pool).await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!("ALTER TABLE tasks_p{day45} RENAME TO retired_tasks_p{day45}"))).execute(&pool).await.unwrap();

    let mut dropped = partitions::retire(&pool, &Layout::default()).await.unwrap();
    dropped.sort();
    let name = |table: &str, ago: u64| format!("{table}_p{}", (today - Days::new(ago)).format("%Y%m%d"));
    let mut expected = vec![name("attempts", 60), name("attempts", 50), name("attempts", 45), name("tasks", 60), name("tasks", 45)];
    expected.sort();
    assert_eq!(dropped, expected);

    let tasks: Vec<String> = partitions::list(&pool, "tasks").await.unwrap().into_iter().map(|p| p.name).collect();
    assert!(tasks.contains(&name("tasks", 50)), "kept: it holds a pending task");
    assert!(tasks.contains(&name("tasks", 10)), "kept: within retention");
    let mut keys: Vec<String> = sqlx::query_scalar("SELECT key FROM task_keys").fetch_all(&pool).await.unwrap();
    keys.sort();
    assert_eq!(keys, ["10-0", "50-0", "50-1"], "the dropped tasks' keys are free again");
    let attempts: i64 = sqlx::query_scalar("SELECT count(*) FROM attempts").fetch_one(&pool).await.unwrap();
    assert_eq!(attempts, 1, "only the 10-day-old attempt is within retention");
    let events = || async { sqlx::query_scalar::<_, i64>("SELECT count(*) FROM task_events").fetch_one(&pool).await.unwrap() };
    assert_eq!(events().await, 3, "the dropped tasks' events go with them");

    // Once its task is finished, the kept partition goes too.
    sqlx::query("UPDATE tasks SET status = 'succeeded', finished_at = now() WHERE status = 'pending'").execute(&pool).await.unwrap();
    assert_eq!(partitions::retire(&pool, &Layout::default()).await.unwrap(), [name("tasks", 50)]);
    assert_eq!(events().await, 1);
}

/// A leader that hangs (SIGSTOP) keeps its connection open but stops pinging: the server
/// ends its session after the lease and the other node takes over. Woken up, the old
/// leader finds its session gone and does not lead again.
#[tokio::test]
async fn a_frozen_leader_loses_leadership_after_the_lease() {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    let db_url = fresh_database().await;
    let pool = pool(&db_url).await;
    let a = chime_process(&db_url, QUIET).await;
    let a_id = node_of(&pool, &a).await;
    wait_leader(&pool, a_id, Duration::from_secs(10)).await;
    let b = chime_process(&db_url, QUIET).await;
    let b_id = node_of(&pool, &b).await;

    let a_pid = Pid::from_raw(a.id().unwrap() as i32);
    kill(a_pid, Signal::SIGSTOP).unwrap();
    let takeover = wait_leader(&pool, b_id, Duration::from_secs(10)).await;
    println!("takeover from a frozen leader (lease 2 s): {takeover:?}");
    assert!(takeover >= Duration::from_secs(1), "not before the lease ran out: {takeover:?}");
    kill(a_pid, Signal::SIGCONT).unwrap();
    // A sleep, not a wait for a condition: what is proved is that nothing happens (the woken
    // node does not take the lock back) over a span longer than its one-second retry and the
    // 2 s lease.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(leader::current(&pool).await.unwrap(), Some(b_id), "the woken node follows");
}

/// One tick of the leader's duties, run by hand on a database no node runs on: a task
/// whose lease ran out is pending again with its lost attempt recorded, and a new timer's
/// occurrences are written. Lease recovery and timers run at every tick.
#[tokio::test]
async fn one_tick_of_the_duties_recovers_leases_and_writes_timers() {
    let pool = pool(&fresh_database().await).await;
    let biz = biz_type_id(&pool, "reports").await;
    let settings =
        leader::Settings { layout: Layout::default(), lease: Duration::from_secs(2), timer_window: Duration::from_secs(10), migrate_batch: 200 };
    let mut duties = leader::Duties::new(pool.clone(), settings);
    // The first tick also makes the partitions the task below goes into.
    duties.run_once().await;
    let (task, node) = (Uuid::now_v7(), Uuid::new_v4());
    sqlx::query(
        "INSERT INTO tasks (id, biz_type_id, run_at, status, attempt_count, lease_until, leased_by)
         VALUES ($1, $2, now(), 'running', 1, now() - interval '1 second', $3)",
    )
    .bind(task)
    .bind(biz)
    .bind(node)
    .execute(&pool)
    .await
    .unwrap();
    let timer = every_second_timer(&pool, biz).await;

    duties.run_once().await;
    let status: String = sqlx::query_scalar("SELECT status FROM tasks WHERE id = $1").bind(task).fetch_one(&pool).await.unwrap();
    assert_eq!(status, "pending", "the expired lease is recovered");
    let lost: (Option<Uuid>, String) =
        sqlx::query_as("SELECT node_id, error FROM attempts WHERE task_id = $1").bind(task).fetch_one(&pool).await.unwrap();
    assert_eq!(lost.0, Some(node));
    assert!(lost.1.starts_with("lease expired"), "{}", lost.1);
    let occurrences: i64 = sqlx::query_scalar("SELECT count(*) FROM all_tasks WHERE timer_id = $1").bind(timer.id).fetch_one(&pool).await.unwrap();
    assert!(occurrences >= 9, "a 10 s window of an every-second timer: {occurrences} occurrences");
}

/// A timer `sec` of the `reports` biz type that fires every second.
async fn every_second_timer(pool: &Pool, biz: i32) -> timers::Timer {
    let request = timers::CreateTimer {
        biz_type: "reports".into(),
        key: "sec".into(),
        cron: "* * * * * *".into(),
        timezone: None,
        payload: None,
        active: None,
        catch_up: None,
    };
    timers::create(pool, biz, request, "test").await.unwrap()
}
