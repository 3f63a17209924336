//! The by-id API on a Citus cluster (docs/book/src/design/citus.md, By id): a task made on
//! the cluster has an id that carries its biz type (`tasks::ids`), and every by-id route
//! finds it on that biz type's shard; an id that carries none (made before, or on a plain
//! install moved to Citus) is still found, by asking every shard.

use chime::config::ServeArgs;
use chime::tasks::ids;
use reqwest::header::{COOKIE, LOCATION, SET_COOKIE};
use serde_json::json;
use uuid::Uuid;

use crate::cluster::migrated_database;
use crate::helpers::{self, TestApp};

const ADMIN_PASSWORD: &str = "test-admin-password";

async fn biz_type_id(app: &TestApp, name: &str) -> i32 {
    sqlx::query_scalar("SELECT id FROM biz_types WHERE name = $1").bind(name).fetch_one(&app.pool).await.unwrap()
}

/// Every by-id route of the API on `id`, which `token`'s biz type owns and which is pending
/// when called: read, attempts, reschedule, cancel, replay, each as on plain PostgreSQL.
async fn every_by_id_route(app: &TestApp, token: &str, other: &str, id: &str) {
    let read = app.get(&format!("/api/v1/tasks/{id}"), token).await;
    assert_eq!((read.status, read.body["status"].as_str()), (200, Some("pending")), "{}", read.body);
    let attempts = app.get(&format!("/api/v1/tasks/{id}/attempts"), token).await;
    assert_eq!(attempts.status, 200, "{}", attempts.body);
    assert_eq!(attempts.body["items"], json!([]));
    let moved = app.patch(&format!("/api/v1/tasks/{id}"), token, json!({"delay_ms": 7_200_000, "priority": 3})).await;
    assert_eq!((moved.status, moved.body["priority"].as_i64()), (200, Some(3)), "{}", moved.body);
    let cancelled = app.delete(&format!("/api/v1/tasks/{id}"), token).await;
    assert_eq!((cancelled.status, cancelled.body["status"].as_str()), (200, Some("cancelled")), "{}", cancelled.body);
    let replayed = app.post(&format!("/api/v1/tasks/{id}/replay"), token, json!({})).await;
    assert_eq!((replayed.status, replayed.body["status"].as_str()), (200, Some("pending")), "{}", replayed.body);
    // Another biz type's token is refused by name, as on plain PostgreSQL, for reads and changes.
    for (method, path) in
        [("GET", format!("/api/v1/tasks/{id}")), ("GET", format!("/api/v1/tasks/{id}/attempts")), ("DELETE", format!("/api/v1/tasks/{id}"))]
    {
        let refused = app.request(method, &path, Some(other), None).await;
        assert_eq!((refused.status, refused.code()), (403, "permission_denied"), "{method} {path}: {}", refused.body);
    }
    let found = app.get(&format!("/api/v1/tasks/{id}"), token).await;
    assert_eq!(found.body["status"], "pending", "{}", found.body);
}

#[tokio::test]
async fn a_task_made_on_citus_carries_its_biz_type_and_every_by_id_route_finds_it() {
    let app = helpers::spawn_on(migrated_database().await, ServeArgs { engine: false, ..ServeArgs::default() }).await;
    let token = app.biz_type("orders").await;
    let other = app.biz_type("invoices").await;
    let orders = biz_type_id(&app, "orders").await;

    let id = app.create_task(&token, json!({"biz_type": "orders", "delay_ms": 3_600_000})).await["id"].as_str().unwrap().to_string();
    let uuid: Uuid = id.parse().unwrap();
    assert_eq!(ids::biz_type_of(uuid), Some(orders), "{id} carries its biz type");
    every_by_id_route(&app, &token, &other, &id).await;

    // An id that is not a task's, carrying a biz type or not: not found, as ever.
    for unknown in [ids::carrying(orders), ids::carrying(orders + 1), Uuid::now_v7()] {
        let missing = app.get(&format!("/api/v1/tasks/{unknown}"), &token).await;
        assert_eq!((missing.status, missing.code()), (404, "not_found"), "{unknown}: {}", missing.body);
        let missing = app.delete(&format!("/api/v1/tasks/{unknown}"), &token).await;
        assert_eq!((missing.status, missing.code()), (404, "not_found"), "{unknown}: {}", missing.body);
    }
}

#[tokio::test]
async fn an_id_made_before_citus_is_still_found_on_every_by_id_route() {
    let app = helpers::spawn_on(migrated_database().await, ServeArgs { engine: false, ..ServeArgs::default() }).await;
    let token = app.biz_type("orders").await;
    let other = app.biz_type("invoices").await;
    let orders = biz_type_id(&app, "orders").await;
    // A task as a plain install made it: a version 7 id, which says no biz type.
    let made = app.create_task(&token, json!({"biz_type": "orders", "delay_ms": 3_600_000})).await["id"].as_str().unwrap().to_string();
    let old = Uuid::now_v7();
    sqlx::query("UPDATE tasks SET id = $1 WHERE biz_type_id = $2 AND id = $3::uuid")
        .bind(old)
        .bind(orders)
        .bind(&made)
        .execute(&app.pool)
        .await
        .unwrap();
    assert_eq!(ids::biz_type_of(old), None);
    every_by_id_route(&app, &token, &other, &old.to_string()).await;
}

#[tokio::test]
async fn the_consoles_task_page_shows_a_task_on_citus() {
    let app = helpers::spawn_on(migrated_database().await, ServeArgs { engine: false, ..ServeArgs::default() }).await;
    let token = app.biz_type("orders").await;
    let id =
        app.create_task(&token, json!({"biz_type": "orders", "delay_ms": 3_600_000, "key": "order-17"})).await["id"].as_str().unwrap().to_string();

    let session = sign_in(&app).await;
    let page =
        helpers::client().get(format!("{}/console/tasks/{id}", app.address)).header(COOKIE, format!("chime_session={session}")).send().await.unwrap();
    assert_eq!(page.status(), 200);
    let body = page.text().await.unwrap();
    assert!(body.contains(&id) && body.contains("order-17"), "{}", &body[..body.len().min(3000)]);
}

/// Signs the first admin in to the console; returns the session cookie's value.
pub async fn sign_in(app: &TestApp) -> String {
    helpers::client();
    let client = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap();
    let form = client.get(format!("{}/console/login", app.address)).send().await.unwrap();
    let cookie_of = |headers: &reqwest::header::HeaderMap, name: &str| {
        headers
            .get_all(SET_COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .find_map(|c| c.strip_prefix(&format!("{name}=")).map(|rest| rest.split(';').next().unwrap().to_string()))
    };
    let login = cookie_of(form.headers(), "chime_login").expect("a login cookie");
    let body = form.text().await.unwrap();
    let csrf = body.split("name=\"csrf\" value=\"").nth(1).and_then(|s| s.split('"').next()).expect("a csrf field").to_string();
    let signed = client
        .post(format!("{}/console/login", app.address))
        .header(COOKIE, format!("chime_login={login}"))
        .form(&[("username", "admin"), ("password", ADMIN_PASSWORD), ("csrf", &csrf), ("next", "/console/tasks")])
        .send()
        .await
        .unwrap();
    assert_eq!(signed.status(), 303, "signed in");
    assert_eq!(signed.headers()[LOCATION], "/console/tasks");
    cookie_of(signed.headers(), "chime_session").expect("a session cookie")
}
