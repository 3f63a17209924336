//! How task rows are stored so that a delivered task costs little WAL (migration 0050): task
//! partitions keep room on their pages for a task's two updates, and the list and payload
//! indexes leave running tasks out, with the old indexes dropped once their replacements
//! are complete. Lists and searches still find tasks in every state.

use std::time::Duration;

use serde_json::json;

use crate::console::{ADMIN_PASSWORD, sign_in};
use crate::helpers::{spawn_app, wait_until};

async fn scalar<T>(app: &crate::helpers::TestApp, sql: &'static str) -> T
where
    T: for<'r> sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres> + Send + Unpin,
{
    sqlx::query_scalar(sql).fetch_one(&app.pool).await.unwrap()
}

async fn row<T>(app: &crate::helpers::TestApp, sql: &'static str) -> T
where
    T: for<'r> sqlx::FromRow<'r, sqlx::postgres::PgRow> + Send + Unpin,
{
    sqlx::query_as(sql).fetch_one(&app.pool).await.unwrap()
}

/// The number the console's count line starts with.
fn count(body: &str) -> &str {
    let marker = "<p id=\"count\" class=\"muted\">";
    let start = body.find(marker).unwrap_or_else(|| panic!("no count: {body}")) + marker.len();
    body[start..].split(' ').next().unwrap()
}

/// A fresh database ends with the replacements valid and the old indexes gone, every task
/// partition half-filled at insert. On a database upgraded with tasks in it, the
/// replacement is built on every partition first; an old index whose replacement cannot
/// be built stays.
#[tokio::test]
async fn the_lighter_indexes_replace_the_old_ones_once_complete() {
    let app = spawn_app().await;
    let settled = || async {
        scalar::<bool>(
            &app,
            "SELECT NOT EXISTS (SELECT FROM pg_class WHERE relname IN ('tasks_list_idx', 'tasks_payload_idx'))
                AND (SELECT bool_and(x.indisvalid) FROM pg_class c JOIN pg_index x ON x.indexrelid = c.oid
                      WHERE c.relname IN ('tasks_finished_list_idx', 'tasks_payload_resting_idx'))",
        )
        .await
    };
    wait_until("the leader dropping the replaced indexes", Duration::from_secs(20), settled).await;
    let half: bool = scalar(
        &app,
        "SELECT count(*) > 0 AND bool_and('fillfactor=50' = ANY(c.reloptions))
           FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = 'tasks'::regclass",
    )
    .await;
    assert!(half, "every task partition has a fillfactor of 50");

    // As a database of the previous release has it after migration 0050: the old index
    // complete, its replacement made ON ONLY (invalid: the partitions have none).
    let token = app.biz_type("orders").await;
    app.create_task(&token, json!({"biz_type": "orders", "payload": {"order_id": 1}})).await;
    for statement in [
        "DROP INDEX tasks_finished_list_idx",
        "CREATE INDEX tasks_list_idx ON tasks (biz_type_id, run_at, id) WHERE status <> 'pending'",
        "CREATE INDEX tasks_finished_list_idx ON ONLY tasks (biz_type_id, run_at, id) WHERE status NOT IN ('pending', 'running')",
    ] {
        sqlx::query(statement).execute(&app.pool).await.unwrap();
    }
    let state = || async {
        row::<(bool, bool, i64, i64)>(
            &app,
            "SELECT EXISTS (SELECT FROM pg_class WHERE relname = 'tasks_list_idx'),
                    (SELECT indisvalid FROM pg_index WHERE indexrelid = 'tasks_finished_list_idx'::regclass),
                    (SELECT count(*) FROM pg_inherits WHERE inhparent = 'tasks'::regclass),
                    (SELECT count(*) FROM pg_inherits WHERE inhparent = 'tasks_finished_list_idx'::regclass)",
        )
        .await
    };
    // The leader's own pass may hold the lock when we call: call until it is done.
    let done = wait_until("the replacement completed", Duration::from_secs(20), || async {
        chime::leader::complete_indexes(&app.pool).await;
        let now = state().await;
        if now.1 { Ok(now) } else { Err(format!("{now:?}")) }
    })
    .await;
    let (old_left, valid, partitions, attached) = done;
    assert!(valid && partitions == attached, "{attached} of {partitions} partitions have the replacement");
    assert!(!old_left, "the old index is dropped once its replacement is valid");

    // A replacement that cannot be built (a unique index over duplicates): the old index
    // stays, and the search it serves keeps it.
    app.create_task(&token, json!({"biz_type": "orders", "payload": {"order_id": 1}})).await;
    for statement in [
        "DROP INDEX tasks_payload_resting_idx",
        "CREATE INDEX tasks_payload_idx ON tasks USING gin (payload jsonb_path_ops)",
        "CREATE UNIQUE INDEX tasks_payload_resting_idx ON ONLY tasks (biz_type_id, run_at)",
    ] {
        sqlx::query(statement).execute(&app.pool).await.unwrap();
    }
    chime::partitions::complete_indexes(&app.pool).await.expect_err("a unique index over duplicates cannot be built");
    let kept: bool = scalar(&app, "SELECT EXISTS (SELECT FROM pg_class WHERE relname = 'tasks_payload_idx')").await;
    assert!(kept, "the old index stays while its replacement is not valid");
}

/// Without a status, the console's list, its count and its payload search find pending,
/// running and finished tasks alike: three walks, the running tasks' through their own index.
#[tokio::test]
async fn lists_counts_and_payload_searches_find_running_tasks() {
    let app = spawn_app().await;
    let token = app.biz_type("orders").await;
    let mut ids = vec![];
    for (key, status) in [("a-pending", "pending"), ("b-running", "running"), ("c-failed", "failed"), ("d-succeeded", "succeeded")] {
        let task = app.create_task(&token, json!({"biz_type": "orders", "key": key, "delay_ms": 3_600_000, "payload": {"order_id": 7}})).await;
        let id = task["id"].as_str().unwrap().to_string();
        app.force_status(&id, status).await;
        ids.push(id);
    }
    app.create_task(&token, json!({"biz_type": "orders", "key": "e-other", "delay_ms": 3_600_000, "payload": {"order_id": 8}})).await;

    let listed = app.get("/api/v1/tasks?biz_type=orders&limit=100", &token).await;
    assert_eq!(listed.status, 200, "{}", listed.body);
    let keys: Vec<&str> = listed.body["items"].as_array().unwrap().iter().map(|t| t["key"].as_str().unwrap()).collect();
    assert_eq!(keys.len(), 5, "{keys:?}");
    assert!(keys.contains(&"b-running"), "{keys:?}");

    let admin = sign_in(&app, "admin", ADMIN_PASSWORD).await;
    let page = admin.get("/console/tasks?biz_type=orders&payload=order_id%20%3D%207").await;
    assert_eq!(page.status, 200, "{}", page.body);
    for id in &ids {
        assert!(page.body.contains(&format!("/console/tasks/{id}\"")), "the search finds {id}: {}", page.body);
    }
    assert_eq!(count(&page.body), "4", "{}", page.body);
    let running = admin.get("/console/tasks?biz_type=orders&status=running&payload=order_id%20%3D%207").await;
    assert!(running.body.contains(&format!("/console/tasks/{}\"", ids[1])), "{}", running.body);
    assert_eq!(count(&running.body), "1", "{}", running.body);
}
