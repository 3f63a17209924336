//! The admin API on a Citus cluster: biz types (a reference table) made, changed, their
//! secret rotated and their tokens (coordinator rows) made and revoked, each told to the
//! nodes on commit; a biz type archived with its pending tasks (on a worker) cancelled.

use serde_json::json;

use chime::config::ServeArgs;

use crate::cluster::migrated_database;
use crate::helpers;

#[tokio::test]
async fn biz_types_and_tokens_are_managed_through_the_admin_api_on_citus() {
    let app = helpers::spawn_on(migrated_database().await, ServeArgs { engine: false, ..ServeArgs::default() }).await;
    let admin = chime::admin_tokens::create(&app.pool, "ci", "test").await.unwrap().1;

    let made = app.post("/api/v1/admin/biz-types", &admin, json!({"name": "orders", "callback_url": "http://127.0.0.1:9/cb"})).await;
    assert_eq!(made.status, 201, "{}", made.body);
    let changed = app.patch("/api/v1/admin/biz-types/orders", &admin, json!({"description": "the shop's orders", "weight": 3})).await;
    assert_eq!((changed.status, &changed.body["weight"]), (200, &json!(3)), "{}", changed.body);
    let rotated = app.post("/api/v1/admin/biz-types/orders/rotate-secret", &admin, json!({})).await;
    assert_eq!(rotated.status, 200, "{}", rotated.body);

    let token = app.post("/api/v1/admin/biz-types/orders/tokens", &admin, json!({})).await;
    assert_eq!(token.status, 201, "{}", token.body);
    let (secret, token_id) = (token.body["token"].as_str().unwrap().to_string(), token.body["id"].as_str().unwrap().to_string());
    let listed = app.get("/api/v1/admin/biz-types/orders/tokens", &admin).await;
    assert_eq!(listed.status, 200, "{}", listed.body);
    let task = app.create_task(&secret, json!({"biz_type": "orders", "delay_ms": 3_600_000})).await;

    let revoked = app.delete(&format!("/api/v1/admin/biz-types/orders/tokens/{token_id}"), &admin).await;
    assert_eq!(revoked.status, 204, "{}", revoked.body);
    let refused = app.post("/api/v1/tasks", &secret, json!({"biz_type": "orders"})).await;
    assert_eq!(refused.status, 401, "a revoked token is refused at once: {}", refused.body);

    let archived = app.delete("/api/v1/admin/biz-types/orders", &admin).await;
    assert_eq!(archived.status, 200, "{}", archived.body);
    let status: String =
        sqlx::query_scalar("SELECT status FROM all_tasks WHERE id = $1::uuid").bind(task["id"].as_str().unwrap()).fetch_one(&app.pool).await.unwrap();
    assert_eq!(status, "cancelled", "an archived biz type's pending tasks are cancelled");
}
