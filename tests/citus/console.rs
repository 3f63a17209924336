//! The console's pages on a Citus cluster, read by a signed-in admin: the dashboard's counts
//! and the list of every biz type's tasks, which Citus refuses as one statement, are read a
//! biz type at a time.

use chime::config::ServeArgs;
use reqwest::header::COOKIE;
use serde_json::json;

use crate::cluster::migrated_database;
use crate::helpers;
use crate::ids::sign_in;

#[tokio::test]
async fn every_console_page_shows_on_citus() {
    let app = helpers::spawn_on(migrated_database().await, ServeArgs::default()).await;
    let token = app.biz_type("orders").await;
    app.create_task(&token, json!({"biz_type": "orders", "delay_ms": 3_600_000, "key": "zz-order-key"})).await;
    let other = app.biz_type("invoices").await;
    app.create_task(&other, json!({"biz_type": "invoices", "delay_ms": 7_200_000, "key": "zz-invoice-key"})).await;
    app.post("/api/v1/timers", &token, json!({"biz_type": "orders", "key": "t", "cron": "0 0 * * * *"})).await;
    let session = sign_in(&app).await;
    let mut failed = Vec::new();
    for page in [
        "/console",
        "/console/tasks",
        "/console/tasks?biz_type=orders",
        "/console/tasks?biz_type=orders&status=pending",
        "/console/biz-types",
        "/console/biz-types/orders",
        "/console/timers",
        "/console/audit",
        "/console/cluster",
        "/console/users",
        "/console/account",
    ] {
        let reply = helpers::client().get(format!("{}{page}", app.address)).header(COOKIE, format!("chime_session={session}")).send().await.unwrap();
        if reply.status() != 200 {
            failed.push((page, reply.status().as_u16()));
        }
    }
    assert!(failed.is_empty(), "{failed:?}");

    // Every biz type's tasks in one list, each biz type's page read on its worker and merged;
    // the dashboard counts each biz type's.
    let get = |page: &'static str| {
        let (app, session) = (&app, &session);
        async move {
            let reply =
                helpers::client().get(format!("{}{page}", app.address)).header(COOKIE, format!("chime_session={session}")).send().await.unwrap();
            reply.text().await.unwrap()
        }
    };
    let all = get("/console/tasks").await;
    let (first, second) = (all.find("zz-order-key"), all.find("zz-invoice-key"));
    assert!(first.is_some() && second.is_some() && first < second, "both, in due order: {all}");
    let newest = get("/console/tasks?order=newest").await;
    let (first, second) = (newest.find("zz-invoice-key"), newest.find("zz-order-key"));
    assert!(first.is_some() && second.is_some() && first < second, "newest first: {newest}");
    let dashboard = get("/console").await;
    assert!(dashboard.contains("orders") && dashboard.contains("invoices"), "{dashboard}");
}
