//! A task's attempt history is bounded (a biz type's `max_snoozes`) and read a page at a
//! time: the task shows its last attempts and how many there are, `GET .../attempts` pages
//! through all of them, and the console's task page shows the last ones with a link to older.

use std::collections::HashSet;
use std::time::Duration;

use serde_json::{Value, json};

use crate::admin::admin_token;
use crate::cli::chime;
use crate::console::{ADMIN_PASSWORD, sign_in};
use crate::delivery::wait_for_status;
use crate::helpers::{TestApp, engine, spawn_app};
use crate::receiver::{Answer, Receiver};

/// Attempts a task shows with itself (the API and the console's task page).
const SHOWN: usize = 100;

/// Writes `n` attempts of task `id` straight into the database, a millisecond apart and
/// ending a minute ago, each with a 200-byte response excerpt.
async fn insert_attempts(app: &TestApp, id: &str, n: i32) {
    sqlx::query(
        "INSERT INTO attempts (task_id, number, started_at, duration_ms, status_code, response_excerpt, biz_type_id, lateness_ms, snoozed_until)
         SELECT t.id, 1, now() - interval '1 minute' - (($2 - g) * interval '1 millisecond'), 5, 200, repeat('x', 200), t.biz_type_id, 0,
                now() + interval '1 second'
           FROM tasks t, generate_series(1, $2) g WHERE t.id = $1::uuid",
    )
    .bind(id)
    .bind(n)
    .execute(&app.pool)
    .await
    .unwrap();
}

/// A receiver that snoozes every call for a second, in a biz type allowing 2 snoozes: the
/// third call's snooze ends the task failed, saying why, with its three attempts; a replay
/// starts counting afresh. `max_snoozes` is taken and checked by the admin API, the CLI,
/// `chime apply` and the console's form alike.
#[tokio::test]
async fn a_task_snoozed_more_than_max_snoozes_fails() {
    let app = spawn_app().await;
    let receiver = Receiver::start(vec![], Answer::snooze("1")).await;
    let admin = admin_token(&app).await;
    let created = app.post("/api/v1/admin/biz-types", &admin, json!({"name": "polls", "callback_url": receiver.url, "max_snoozes": 2})).await;
    assert_eq!(created.status, 201, "{}", created.body);
    assert_eq!(created.body["max_snoozes"], 2, "{}", created.body);
    let token = chime::biz_types::create_token(&app.pool, "polls").await.unwrap();
    let task = app.create_task(&token, json!({"biz_type": "polls"})).await;
    let id = task["id"].as_str().unwrap();

    let running = engine(&app).spawn();
    let failed = wait_for_status(&app, &token, id, "failed").await;
    running.stop().await;
    let error = failed["last_error"].as_str().unwrap_or_default();
    assert!(error.contains("snoozed it 2 times") && error.contains("max_snoozes"), "{failed}");
    assert_eq!(receiver.received().len(), 3, "two snoozes kept, the third ends it");
    assert_eq!(failed["attempt_total"], 3, "{failed}");

    // A replay starts afresh: two more snoozes before it fails again.
    assert_eq!(app.post(&format!("/api/v1/tasks/{id}/replay"), &token, json!({})).await.status, 200);
    let running = engine(&app).spawn();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(app.get(&format!("/api/v1/tasks/{id}"), &token).await.body["status"], "pending", "snoozed once again");
    wait_for_status(&app, &token, id, "failed").await;
    running.stop().await;
    assert_eq!(receiver.received().len(), 6);

    // Every way of setting it takes it, and refuses what is out of range naming it.
    let refused = app.patch("/api/v1/admin/biz-types/polls", &admin, json!({"max_snoozes": -1})).await;
    assert_eq!(refused.status, 422, "{}", refused.body);
    assert!(refused.message().starts_with("max_snoozes: must be between 0 and 100000"), "{}", refused.message());
    let db = ("DATABASE_URL", app.db_url.as_str());
    let out = chime(&[db], &["biz-type", "update", "polls", "--max-snoozes", "100001"], None).await;
    assert!(!out.ok && out.stderr.contains("max_snoozes: must be between 0 and 100000"), "{}", out.stderr);
    let out = chime(&[db], &["biz-type", "update", "polls", "--max-snoozes", "7"], None).await;
    assert!(out.ok && out.stdout.contains("7 snoozes"), "{}{}", out.stdout, out.stderr);
    let dir = std::env::temp_dir().join(format!("chime-max-snoozes-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("chime.toml");
    std::fs::write(&file, format!("[biz_types.polls]\ncallback_url = \"{}\"\nmax_snoozes = 9\n", receiver.url)).unwrap();
    let out = chime(&[db], &["apply", "-f", file.to_str().unwrap()], None).await;
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(out.ok && out.stdout.contains("    max_snoozes: 7 → 9"), "{}{}", out.stdout, out.stderr);
    let console = sign_in(&app, "admin", ADMIN_PASSWORD).await;
    let form = [("mode", "callback"), ("callback_url", receiver.url.as_str()), ("max_snoozes", "100001")];
    let page = console.post("/console/biz-types/polls", &form).await;
    assert_eq!(page.status, 422);
    assert!(page.body.contains(r#"data-field="max_snoozes">must be between 0 and 100000"#), "{}", page.body);
    let form = [("mode", "callback"), ("callback_url", receiver.url.as_str()), ("max_snoozes", "11")];
    assert_eq!(console.post("/console/biz-types/polls", &form).await.status, 303);
    assert_eq!(app.get("/api/v1/admin/biz-types/polls", &admin).await.body["max_snoozes"], 11);
}

/// A task with 20,000 attempts: its GET shows the last 100 and `attempt_total`, in a small
/// answer; `GET .../attempts` pages through all 20,000, oldest first, each once, with a
/// checked `limit` and cursor; the console's task page shows the last 100 and links to the
/// older ones, in a bounded page.
#[tokio::test]
async fn a_task_with_many_attempts_is_read_a_page_at_a_time() {
    const MANY: i32 = 20_000;
    let app = spawn_app().await;
    let token = app.biz_type("orders").await;
    let other = app.biz_type("refunds").await;
    // No engine runs: the task stays pending with the history written below.
    let task = app.create_task(&token, json!({"biz_type": "orders"})).await;
    let id = task["id"].as_str().unwrap();
    insert_attempts(&app, id, MANY).await;

    let raw = app.client.get(format!("{}/api/v1/tasks/{id}", app.address)).bearer_auth(&token).send().await.unwrap().bytes().await.unwrap();
    println!("GET /api/v1/tasks/{{id}} with {MANY} attempts: {} bytes", raw.len());
    let shown: Value = serde_json::from_slice(&raw).unwrap();
    assert!(raw.len() < 100_000, "GET answered {} bytes", raw.len());
    assert_eq!(shown["attempts"].as_array().map(Vec::len), Some(SHOWN));
    assert_eq!(shown["attempt_total"], MANY);

    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        let path = match &cursor {
            Some(c) => format!("/api/v1/tasks/{id}/attempts?limit=1000&cursor={c}"),
            None => format!("/api/v1/tasks/{id}/attempts?limit=1000"),
        };
        let page = app.get(&path, &token).await;
        assert_eq!(page.status, 200, "{}", page.body);
        pages += 1;
        let items = page.body["items"].as_array().unwrap();
        assert!(items.len() <= 1000);
        seen.extend(items.iter().map(|a| a["started_at"].as_str().unwrap().to_string()));
        match page.body["next_cursor"].as_str() {
            Some(next) => cursor = Some(next.to_string()),
            None => break,
        }
        assert!(pages <= 21, "the pages do not end");
    }
    assert_eq!(seen.len(), MANY as usize, "every attempt once");
    assert_eq!(seen.iter().collect::<HashSet<_>>().len(), MANY as usize);
    let times: Vec<chrono::DateTime<chrono::Utc>> = seen.iter().map(|s| s.parse().unwrap()).collect();
    assert!(times.windows(2).all(|w| w[0] < w[1]), "oldest first");
    let last: Vec<&str> = shown["attempts"].as_array().unwrap().iter().map(|a| a["started_at"].as_str().unwrap()).collect();
    assert_eq!(last, seen[seen.len() - SHOWN..].iter().map(String::as_str).collect::<Vec<_>>(), "the task shows the last ones");

    for bad in ["limit=0", "limit=1001", "limit=x", "cursor=nonsense", "colour=red"] {
        let refused = app.get(&format!("/api/v1/tasks/{id}/attempts?{bad}"), &token).await;
        assert_eq!((refused.status, refused.code()), (422, "invalid_argument"), "{bad}: {}", refused.body);
    }
    assert_eq!(app.get(&format!("/api/v1/tasks/{id}/attempts"), &other).await.status, 403, "another biz type's token");
    let default = app.get(&format!("/api/v1/tasks/{id}/attempts"), &token).await;
    assert_eq!(default.body["items"].as_array().map(Vec::len), Some(100), "100 by default");

    let console = sign_in(&app, "admin", ADMIN_PASSWORD).await;
    let page = console.get(&format!("/console/tasks/{id}")).await;
    println!("/console/tasks/{{id}} with {MANY} attempts: {} bytes", page.body.len());
    assert_eq!(page.status, 200);
    assert!(page.body.len() < 300_000, "the console page is {} bytes", page.body.len());
    let older = page.body.split("id=\"older-attempts\" href=\"").nth(1).map(|s| s.split('"').next().unwrap().replace("&amp;", "&"));
    let older = older.unwrap_or_else(|| panic!("a link to older attempts: {}", &page.body[..page.body.len().min(3000)]));
    let before = console.get(&older).await;
    assert_eq!(before.status, 200, "{older}");
    assert!(before.body.len() < 300_000);
    assert!(before.body.contains("id=\"newest-attempts\""), "a way back to the newest: {older}");
}
