//! The admin API (`/api/v1/admin/`) and admin tokens, end to end: a real server with its
//! engine, a real receiver, the real `chime` binary for the admin-token commands.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::cli::chime;
use crate::console::{ADMIN_PASSWORD, sign_in, sign_in_attempt};
use crate::delivery::wait_for_status;
use crate::helpers::{TestApp, spawn_app, spawn_node, wait_until};
use crate::receiver::{Answer, Receiver};

/// An admin token named `ci`, made as `chime admin-token create` makes it.
pub async fn admin_token(app: &TestApp) -> String {
    chime::admin_tokens::create(&app.pool, "ci", "test").await.unwrap().1
}

/// The audit log's (actor, action, target) rows, oldest first, but for the first start's.
async fn audit(app: &TestApp) -> Vec<(String, String, String)> {
    sqlx::query_as("SELECT actor, action, target FROM audit_log WHERE actor <> 'chime' ORDER BY id").fetch_all(&app.pool).await.unwrap()
}

/// Whether the callback verifies with this signing secret.
fn signed_with(callback: &crate::receiver::Received, secret: &str) -> bool {
    let signature = callback.header("chime-signature").unwrap();
    let t: i64 = signature.strip_prefix("t=").unwrap().split(',').next().unwrap().parse().unwrap();
    signature == chime::engine::signature(secret, t, &callback.body)
}

/// With an admin token alone: create a biz type, mint its API token, create a task that is
/// delivered signed with the biz type's secret, rotate the secret and see the next callback
/// signed with the new one; then archive it: its token is refused saying so (creates too),
/// its pending tasks (hot and cold) are cancelled, it leaves the list, its name stays
/// reserved, and every change is in the audit log under the admin token.
#[tokio::test]
async fn the_admin_api_runs_a_biz_type_from_creation_to_archive() {
    let app = spawn_node().await;
    let receiver = Receiver::start(vec![], Answer::status(200)).await;
    let admin = admin_token(&app).await;
    let prefix: String = sqlx::query_scalar("SELECT prefix FROM admin_tokens").fetch_one(&app.pool).await.unwrap();

    let created = app.post("/api/v1/admin/biz-types", &admin, json!({"name": "orders", "callback_url": receiver.url, "timeout_ms": 5000})).await;
    assert_eq!(created.status, 201, "{}", created.body);
    assert_eq!((created.body["timeout_ms"].as_i64(), created.body["archived_at"].is_null()), (Some(5000), true));
    let first_secret = created.body["signing_secret"].as_str().unwrap().to_string();
    let minted = app.post("/api/v1/admin/biz-types/orders/tokens", &admin, json!({})).await;
    assert_eq!(minted.status, 201, "{}", minted.body);
    let token = minted.body["token"].as_str().unwrap().to_string();
    assert!(token.starts_with(minted.body["prefix"].as_str().unwrap()), "{}", minted.body);
    let listed = app.get("/api/v1/admin/biz-types/orders/tokens", &admin).await;
    assert_eq!(listed.body["items"][0]["id"], minted.body["id"]);
    assert!(!listed.body.to_string().contains(&token[12..]), "a list shows the token: {}", listed.body);

    let task = app.create_task(&token, json!({"biz_type": "orders"})).await;
    wait_for_status(&app, &token, task["id"].as_str().unwrap(), "succeeded").await;
    // Without an overlap, so that the old secret stops signing at once.
    let rotated = app.post("/api/v1/admin/biz-types/orders/rotate-secret", &admin, json!({"overlap_secs": 0})).await;
    assert_eq!(rotated.status, 200, "{}", rotated.body);
    let second_secret = rotated.body["signing_secret"].as_str().unwrap().to_string();
    assert_ne!(first_secret, second_secret);
    let task = app.create_task(&token, json!({"biz_type": "orders"})).await;
    wait_for_status(&app, &token, task["id"].as_str().unwrap(), "succeeded").await;
    let callbacks = receiver.received();
    assert_eq!(callbacks.len(), 2);
    assert!(signed_with(&callbacks[0], &first_secret), "the first callback is signed with the first secret");
    assert!(signed_with(&callbacks[1], &second_secret) && !signed_with(&callbacks[1], &first_secret), "the next is signed with the new one");

    // Pending tasks: one in an hour (hot) and one in 30 days (cold storage).
    let soon = app.create_task(&token, json!({"biz_type": "orders", "delay_ms": 3_600_000})).await;
    let later = app.create_task(&token, json!({"biz_type": "orders", "delay_ms": 30 * 86_400_000i64})).await;
    assert_eq!(app.table_of(later["id"].as_str().unwrap()).await, "tasks_cold");

    let archived = app.delete("/api/v1/admin/biz-types/orders", &admin).await;
    assert_eq!(archived.status, 200, "{}", archived.body);
    assert_eq!(archived.body["cancelled_tasks"], 2, "{}", archived.body);
    assert!(archived.body["archived_at"].is_string(), "{}", archived.body);
    for id in [&soon["id"], &later["id"]] {
        let status: String =
            sqlx::query_scalar("SELECT status FROM all_tasks WHERE id = $1::uuid").bind(id.as_str().unwrap()).fetch_one(&app.pool).await.unwrap();
        assert_eq!(status, "cancelled", "task {id}");
    }
    let refused = app.post("/api/v1/tasks", &token, json!({"biz_type": "orders"})).await;
    assert_eq!((refused.status, refused.code()), (403, "permission_denied"), "{}", refused.body);
    assert!(refused.message().contains("archived"), "{}", refused.message());
    let refused = app.get(&format!("/api/v1/tasks/{}", soon["id"].as_str().unwrap()), &token).await;
    assert_eq!(refused.status, 403, "{}", refused.body);

    let names = |list: &Value| list["items"].as_array().unwrap().iter().map(|b| b["name"].as_str().unwrap().to_string()).collect::<Vec<_>>();
    assert_eq!(names(&app.get("/api/v1/admin/biz-types", &admin).await.body), Vec::<String>::new());
    let all = app.get("/api/v1/admin/biz-types?archived=true", &admin).await.body;
    assert_eq!((names(&all), all["items"][0]["archived_at"].is_string()), (vec!["orders".to_string()], true), "{all}");
    let again = app.post("/api/v1/admin/biz-types", &admin, json!({"name": "orders", "mode": "pull"})).await;
    assert_eq!((again.status, again.code()), (409, "key_conflict"), "{}", again.body);
    assert!(again.message().contains("archived") && again.message().contains("reserved"), "{}", again.message());
    for (method, path, body) in [
        ("POST", "/api/v1/admin/biz-types/orders/tokens", None),
        ("POST", "/api/v1/admin/biz-types/orders/rotate-secret", None),
        ("PATCH", "/api/v1/admin/biz-types/orders", Some(json!({"paused": true}))),
    ] {
        let reply = app.request(method, path, Some(&admin), body.map(|b| b.to_string().into_bytes())).await;
        assert_eq!((reply.status, reply.code()), (409, "invalid_state"), "{method} {path}: {}", reply.body);
    }

    let actor = format!("admin-token:{prefix} (ci)");
    let changes: Vec<String> = audit(&app).await.into_iter().filter(|(a, _, t)| a == &actor && t == "orders").map(|(_, action, _)| action).collect();
    assert_eq!(changes, ["biz_type.create", "token.create", "biz_type.rotate_secret", "biz_type.archive"]);

    // The console shows it as archived, with nothing to change.
    let console = sign_in(&app, "admin", ADMIN_PASSWORD).await;
    let list = console.get("/console/biz-types").await.body;
    assert!(list.contains(r#"<span class="badge cancelled">archived</span>"#), "{list}");
    let page = console.get("/console/biz-types/orders").await.body;
    assert!(page.contains("archived 20") && !page.contains(r#"id="archive""#) && !page.contains("Save settings"), "{page}");
}

/// The text of the error shown next to `field` on a refused console form.
pub fn console_error(body: &str, field: &str) -> String {
    let marker = format!(r#"data-field="{field}">"#);
    let start = body.find(&marker).unwrap_or_else(|| panic!("no {field} field: {body}")) + marker.len();
    let text = body[start..].split('<').next().unwrap();
    text.replace("&#x27;", "'")
        .replace("&#39;", "'")
        .replace("&#x2f;", "/")
        .replace("&#47;", "/")
        .replace("&quot;", "\"")
        .replace("&#96;", "`")
        .replace("&amp;", "&")
}

/// The admin API refuses what the console refuses, in the console's words: each bad value
/// is answered 422 (409 for a taken name) with `<field>: <the console's message>`.
#[tokio::test]
async fn the_admin_api_refuses_bad_settings_in_the_consoles_words() {
    let app = spawn_app().await;
    let admin = admin_token(&app).await;
    let console = sign_in(&app, "admin", ADMIN_PASSWORD).await;
    app.biz_type("taken").await;
    for (field, form_value, json_value) in [
        ("timeout_ms", "0", json!(0)),
        ("max_attempts", "1001", json!(1001)),
        ("backoff_max_ms", "10", json!(10)),
        ("callback_url", "ftp://example.test/hook", json!("ftp://example.test/hook")),
        ("rate_limit", "-1", json!(-1)),
        ("weight", "0", json!(0)),
        ("weight", "-1", json!(-1)),
        ("weight", "101", json!(101)),
        ("chat_platform", "teams", json!("teams")),
        ("chat_url", "ftp://example.test/robot", json!("ftp://example.test/robot")),
        ("name", "Bad Name", json!("Bad Name")),
        ("name", "taken", json!("taken")),
    ] {
        let mut form = vec![("name", "fresh"), ("mode", "callback"), ("callback_url", "http://127.0.0.1:9/x"), ("backoff_initial_ms", "1000")];
        form.retain(|(k, _)| *k != field);
        form.push((field, form_value));
        let page = console.post("/console/biz-types", &form).await;
        assert_eq!(page.status, 422, "console, {field}={form_value}: {}", page.body);
        let shown = console_error(&page.body, field);

        let mut body = json!({"name": "fresh", "mode": "callback", "callback_url": "http://127.0.0.1:9/x", "backoff_initial_ms": 1000});
        body[field] = json_value;
        let reply = app.post("/api/v1/admin/biz-types", &admin, body).await;
        if form_value == "taken" {
            assert_eq!((reply.status, reply.message()), (409, shown.as_str()), "API, {field}={form_value}");
        } else {
            assert_eq!(reply.status, 422, "API, {field}={form_value}: {}", reply.body);
            assert_eq!(reply.message(), format!("{field}: {shown}"), "API, {field}={form_value}");
        }
    }
    let count: i64 = sqlx::query_scalar("SELECT count(*) FROM biz_types").fetch_one(&app.pool).await.unwrap();
    assert_eq!(count, 1, "only `taken` exists");
}

/// A biz type's weight is 1 unless given, answered by the admin API, changed by it, by
/// `chime biz-type` and by the console's form, shown where it is not 1, and refused with 422
/// naming `weight` outside 1-100 or when it is not a whole number.
#[tokio::test]
async fn a_biz_type_s_weight_is_taken_answered_and_checked() {
    let app = spawn_app().await;
    let admin = admin_token(&app).await;
    let url = "http://127.0.0.1:9/";
    let plain = app.post("/api/v1/admin/biz-types", &admin, json!({"name": "plain", "callback_url": url})).await;
    assert_eq!((plain.status, &plain.body["weight"]), (201, &json!(1)), "{}", plain.body);
    let heavy = app.post("/api/v1/admin/biz-types", &admin, json!({"name": "heavy", "callback_url": url, "weight": 3})).await;
    assert_eq!((heavy.status, &heavy.body["weight"]), (201, &json!(3)), "{}", heavy.body);
    assert_eq!(app.get("/api/v1/admin/biz-types/heavy", &admin).await.body["weight"], json!(3));
    let changed = app.patch("/api/v1/admin/biz-types/heavy", &admin, json!({"weight": 5})).await;
    assert_eq!((changed.status, &changed.body["weight"]), (200, &json!(5)), "{}", changed.body);
    for bad in [json!(0), json!(-1), json!(101), json!(1.5), json!("3"), json!(i64::MAX)] {
        let refused = app.patch("/api/v1/admin/biz-types/heavy", &admin, json!({"weight": bad})).await;
        assert_eq!(refused.status, 422, "weight {bad}: {}", refused.body);
        assert!(refused.message().starts_with("weight: "), "weight {bad}: {}", refused.body);
        let refused = app.post("/api/v1/admin/biz-types", &admin, json!({"name": "other", "callback_url": url, "weight": bad})).await;
        assert_eq!(refused.status, 422, "weight {bad}: {}", refused.body);
        assert!(refused.message().starts_with("weight: "), "weight {bad}: {}", refused.body);
    }
    for bad in [0, -1, 101] {
        let refused = app.patch("/api/v1/admin/biz-types/heavy", &admin, json!({"weight": bad})).await;
        assert_eq!(refused.message(), "weight: must be between 1 and 100");
    }
    assert_eq!(app.get("/api/v1/admin/biz-types/heavy", &admin).await.body["weight"], json!(5), "nothing refused was stored");
    assert_eq!(app.get("/api/v1/admin/biz-types/other", &admin).await.status, 404);

    let db = ("DATABASE_URL", app.db_url.as_str());
    let out = chime(&[db], &["biz-type", "update", "heavy", "--weight", "101"], None).await;
    assert!(!out.ok && out.stderr.contains("weight: must be between 1 and 100"), "{}", out.stderr);
    let out = chime(&[db], &["biz-type", "update", "heavy", "--weight", "7"], None).await;
    assert!(out.ok && out.stdout.contains("in-flight 100, weight 7,"), "{}{}", out.stdout, out.stderr);
    let out = chime(&[db], &["biz-type", "list"], None).await;
    let line = |name: &str| out.stdout.lines().find(|l| l.starts_with(name)).unwrap_or_else(|| panic!("no {name}: {}", out.stdout)).to_string();
    assert!(line("heavy").contains(", weight 7,") && !line("plain").contains("weight"), "{}", out.stdout);

    let console = sign_in(&app, "admin", ADMIN_PASSWORD).await;
    for (bad, rule) in [
        ("0", "must be between 1 and 100"),
        ("-1", "must be between 1 and 100"),
        ("101", "must be between 1 and 100"),
        ("2.5", "must be a whole number"),
        ("x", "must be a whole number"),
    ] {
        let page = console.post("/console/biz-types/heavy", &[("mode", "callback"), ("callback_url", url), ("weight", bad)]).await;
        assert_eq!(page.status, 422, "weight {bad}: {}", page.body);
        assert_eq!(console_error(&page.body, "weight"), rule, "weight {bad}");
        assert!(page.body.contains(&format!(r#"name="weight" value="{bad}""#)), "the form comes back as typed: {}", page.body);
        let page = console.post("/console/biz-types", &[("name", "other"), ("mode", "callback"), ("callback_url", url), ("weight", bad)]).await;
        assert_eq!((page.status, console_error(&page.body, "weight")), (422, rule.to_string()), "new, weight {bad}");
    }
    assert_eq!(app.get("/api/v1/admin/biz-types/heavy", &admin).await.body["weight"], json!(7));
    assert_eq!(console.post("/console/biz-types/heavy", &[("mode", "callback"), ("callback_url", url), ("weight", "4")]).await.status, 303);
    assert_eq!(app.get("/api/v1/admin/biz-types/heavy", &admin).await.body["weight"], json!(4));
    assert_eq!(
        console.post("/console/biz-types", &[("name", "created"), ("mode", "callback"), ("callback_url", url), ("weight", "9")]).await.status,
        303
    );
    assert_eq!(app.get("/api/v1/admin/biz-types/created", &admin).await.body["weight"], json!(9));
    let page = console.get("/console/biz-types/heavy").await.body;
    assert!(page.contains(r#"name="weight" value="4""#) && page.contains(r#"<dd id="weight">4: 4 times the share"#), "{page}");
    let page = console.get("/console/biz-types/plain").await.body;
    assert!(page.contains(r#"name="weight" value="1""#) && !page.contains(r#"id="weight""#), "{page}");
    let page = console.get("/console/biz-types/new").await.body;
    assert!(page.contains(r#"name="weight" value="1""#), "a new biz type's form starts at 1: {page}");
}

/// `chime admin-token create` prints a `chime_admin_` token once (stored only hashed; `list`
/// shows its prefix and name, never it); it opens the admin API; `revoke` by prefix shuts it
/// at once (401), and both are in the audit log.
#[tokio::test]
async fn admin_tokens_are_made_listed_and_revoked_from_the_command_line() {
    let app = spawn_app().await;
    let env = [("DATABASE_URL", app.db_url.as_str())];
    let out = chime(&env, &["admin-token", "create", "--name", "deploy-bot"], None).await;
    assert!(out.ok, "{}", out.stderr);
    let token = out.last_line().to_string();
    assert!(token.starts_with("chime_admin_") && token.len() > 40, "{token}");
    let rows: Vec<String> = sqlx::query_scalar("SELECT t::text FROM admin_tokens t").fetch_all(&app.pool).await.unwrap();
    assert_eq!(rows.len(), 1);
    assert!(!rows[0].contains(&token[18..]), "stored in the clear: {rows:?}");
    let list = chime(&env, &["admin-token", "list"], None).await;
    assert!(
        list.ok && list.stdout.contains(&token[..18]) && list.stdout.contains("deploy-bot") && !list.stdout.contains(&token[18..]),
        "{}",
        list.stdout
    );

    assert_eq!(app.get("/api/v1/admin/users", &token).await.status, 200);
    let out = chime(&env, &["admin-token", "revoke", &token[..18]], None).await;
    assert!(out.ok, "{}", out.stderr);
    let refused = app.get("/api/v1/admin/users", &token).await;
    assert_eq!((refused.status, refused.code()), (401, "unauthenticated"), "{}", refused.body);
    assert!(chime(&env, &["admin-token", "list"], None).await.stdout.contains("revoked"));
    let actions: Vec<(String, String, String)> = audit(&app).await;
    assert_eq!(
        actions,
        [("cli".into(), "admin_token.create".into(), "deploy-bot".into()), ("cli".into(), "admin_token.revoke".into(), "deploy-bot".into())]
    );
}

/// `chime biz-type archive` on one process refuses the biz type's token on a running node
/// at once (the node forgets the tokens it checked when told biz types changed, rather than
/// after its 5 s cache), and cancels its pending task; `biz-type list` hides it unless
/// `--archived`.
#[tokio::test]
async fn archiving_from_the_command_line_refuses_tokens_on_running_nodes_at_once() {
    let app = spawn_app().await;
    let env = [("DATABASE_URL", app.db_url.as_str())];
    let token = app.biz_type("orders").await;
    let task = app.create_task(&token, json!({"biz_type": "orders", "delay_ms": 3_600_000})).await;
    // The node hears of changes on its LISTEN session, opened as it starts.
    wait_until("the node's LISTEN session", Duration::from_secs(4), || async {
        sqlx::query_scalar::<_, bool>(
            "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE datname = current_database() AND query ILIKE 'LISTEN%chime_wake%')",
        )
        .fetch_one(&app.pool)
        .await
        .unwrap()
    })
    .await;
    // The node checks the token now, and would trust it for 5 s (its cache's TTL).
    assert_eq!(app.get("/api/v1/tasks", &token).await.status, 200);
    let cached_at = Instant::now();

    let out = chime(&env, &["biz-type", "archive", "orders"], None).await;
    assert!(out.ok, "{}", out.stderr);
    assert!(out.stdout.contains("1 pending task cancelled"), "{}", out.stdout);
    let refused = loop {
        let reply = app.get("/api/v1/tasks", &token).await;
        if reply.status != 200 || cached_at.elapsed() > Duration::from_secs(10) {
            break reply;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(refused.status, 403, "{}", refused.body);
    println!("refused {:?} after the token was checked (the command took part of it)", cached_at.elapsed());
    assert!(cached_at.elapsed() < Duration::from_secs(5), "refused only when the cache expired, after {:?}", cached_at.elapsed());
    let status: String =
        sqlx::query_scalar("SELECT status FROM all_tasks WHERE id = $1::uuid").bind(task["id"].as_str().unwrap()).fetch_one(&app.pool).await.unwrap();
    assert_eq!(status, "cancelled");
    let list = chime(&env, &["biz-type", "list"], None).await;
    assert!(list.ok && !list.stdout.contains("orders"), "{}", list.stdout);
    let list = chime(&env, &["biz-type", "list", "--archived"], None).await;
    assert!(list.stdout.contains("orders\tcallback\tarchived"), "{}", list.stdout);
}

/// Console users through the admin API: create one who can sign in, change their password
/// (signing them out), make them admin, disable them (they cannot sign in), delete them;
/// the last enabled admin cannot be demoted, disabled or deleted; the audit log has every
/// change and no password.
#[tokio::test]
async fn the_admin_api_manages_console_users() {
    let app = spawn_app().await;
    let admin = admin_token(&app).await;
    let created = app.post("/api/v1/admin/users", &admin, json!({"name": "helen", "role": "support", "password": "first-password"})).await;
    assert_eq!(created.status, 201, "{}", created.body);
    assert_eq!(created.body["role"], "support");
    let short = app.post("/api/v1/admin/users", &admin, json!({"name": "ida", "role": "support", "password": "short"})).await;
    assert_eq!((short.status, short.message()), (422, "password: must be at least 8 characters"));
    let helen = sign_in(&app, "helen", "first-password").await;

    let changed = app.patch("/api/v1/admin/users/helen", &admin, json!({"password": "second-password", "role": "admin"})).await;
    assert_eq!((changed.status, changed.body["role"].as_str()), (200, Some("admin")), "{}", changed.body);
    assert_eq!(helen.get("/console").await.status, 303, "the old session is signed out");
    assert_eq!(sign_in_attempt(&app, "helen", "first-password").await.status, 401);
    sign_in(&app, "helen", "second-password").await;

    // Two admins: one may go. Then `admin` is the last, and stays.
    let disabled = app.patch("/api/v1/admin/users/helen", &admin, json!({"disabled": true})).await;
    assert_eq!((disabled.status, disabled.body["disabled"].as_bool()), (200, Some(true)), "{}", disabled.body);
    assert_eq!(sign_in_attempt(&app, "helen", "second-password").await.status, 401);
    for (method, body) in [("PATCH", Some(json!({"role": "support"}))), ("PATCH", Some(json!({"disabled": true}))), ("DELETE", None)] {
        let reply = app.request(method, "/api/v1/admin/users/admin", Some(&admin), body.map(|b| b.to_string().into_bytes())).await;
        assert_eq!((reply.status, reply.code()), (409, "invalid_state"), "{method}: {}", reply.body);
        assert!(reply.message().contains("last enabled admin"), "{}", reply.message());
    }
    assert_eq!(app.delete("/api/v1/admin/users/helen", &admin).await.status, 204);
    assert_eq!(app.delete("/api/v1/admin/users/helen", &admin).await.status, 404);
    let users = app.get("/api/v1/admin/users", &admin).await.body;
    assert_eq!(users["items"].as_array().unwrap().len(), 1, "{users}");

    let actions: Vec<String> =
        audit(&app).await.into_iter().filter(|(a, _, t)| a.starts_with("admin-token:") && t == "helen").map(|(_, action, _)| action).collect();
    assert_eq!(actions, ["user.create", "user.update", "user.update", "user.delete"]);
    let rows: Vec<String> = sqlx::query_scalar("SELECT l::text FROM audit_log l").fetch_all(&app.pool).await.unwrap();
    assert!(rows.iter().all(|r| !r.contains("first-password") && !r.contains("second-password")), "{rows:#?}");
}

/// A task of an archived biz type that becomes pending again afterwards (here replayed, as
/// support staff could in the console; a retry of a callback in flight at the archive is
/// another way) is cancelled by the leader's sweep within its 10 s period, rather than
/// waiting forever and keeping its partition from retention.
#[tokio::test]
async fn the_leader_cancels_tasks_left_pending_in_an_archived_biz_type() {
    let app = spawn_app().await;
    let token = app.biz_type("orders").await;
    let task = app.create_task(&token, json!({"biz_type": "orders", "delay_ms": 3_600_000})).await;
    let id: uuid::Uuid = task["id"].as_str().unwrap().parse().unwrap();
    let (_, archived, cancelled) = chime::biz_types::archive(&app.pool, "orders", "test").await.unwrap();
    assert_eq!(cancelled, 1);
    let replayed = chime::tasks::replay(&app.pool, archived.id, id, "test").await.unwrap();
    assert_eq!(replayed.status, chime::tasks::Status::Pending);

    let started = Instant::now();
    let status = loop {
        let status: String = sqlx::query_scalar("SELECT status FROM all_tasks WHERE id = $1").bind(id).fetch_one(&app.pool).await.unwrap();
        if status != "pending" || started.elapsed() > Duration::from_secs(20) {
            break status;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    println!("the leader cancelled the replayed task after {:?}", started.elapsed());
    assert_eq!(status, "cancelled", "still pending after {:?}", started.elapsed());
}

/// Archiving a biz type that is archived already changes nothing and records nothing: the
/// admin API answers 200 with the same archive time, the command line says so, and the audit
/// log keeps the one entry of the archive that happened.
#[tokio::test]
async fn archiving_an_archived_biz_type_again_records_nothing() {
    let app = spawn_app().await;
    let admin = admin_token(&app).await;
    app.biz_type("orders").await;
    let first = app.delete("/api/v1/admin/biz-types/orders", &admin).await;
    assert_eq!(first.status, 200, "{}", first.body);
    let again = app.delete("/api/v1/admin/biz-types/orders", &admin).await;
    assert_eq!(
        (again.status, &again.body["archived_at"], &again.body["cancelled_tasks"]),
        (200, &first.body["archived_at"], &json!(0)),
        "{}",
        again.body
    );
    let out = chime(&[("DATABASE_URL", app.db_url.as_str())], &["biz-type", "archive", "orders"], None).await;
    assert!(out.ok, "{}", out.stderr);
    println!("{}", out.stdout);
    let entries: Vec<String> =
        sqlx::query_scalar("SELECT actor FROM audit_log WHERE action = 'biz_type.archive' ORDER BY id").fetch_all(&app.pool).await.unwrap();
    assert_eq!(entries.len(), 1, "one entry, of the archive that happened: {entries:?}");
}
