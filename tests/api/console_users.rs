//! The console's users page and own-account page over plain HTTP, and API tokens' names and
//! last use (console, admin API, command line).

use std::time::Duration;

use serde_json::json;

use crate::admin::admin_token;
use crate::cli::chime;
use crate::console::{ADMIN_PASSWORD, Console, cookie, revealed, sign_in, sign_in_attempt};
use crate::helpers::{TestApp, settings_notice, spawn_app, wait_until, wake_listener};

/// The audit log's (actor, action, target) rows about users, sign-ins and the first start's
/// left out, oldest first.
async fn user_audit(app: &TestApp) -> Vec<(String, String, String)> {
    sqlx::query_as(
        "SELECT actor, action, target FROM audit_log WHERE action LIKE 'user.%' AND action NOT LIKE 'user.sign_in%' AND actor <> 'chime' ORDER BY id",
    )
    .fetch_all(&app.pool)
    .await
    .unwrap()
}

async fn sessions_of(app: &TestApp, name: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM sessions s JOIN users u ON u.id = s.user_id WHERE u.username = $1")
        .bind(name)
        .fetch_one(&app.pool)
        .await
        .unwrap()
}

/// Whether this console session is still signed in (a page, not a redirect to sign in).
async fn signed_in(console: &Console) -> bool {
    let page = console.get("/console").await;
    match page.status {
        200 => true,
        303 if page.location().starts_with("/console/login") => false,
        other => panic!("unexpected {other}: {}", page.body),
    }
}

/// An admin creates a support user, who signs in; the admin disables them: their open
/// session stops working at once (pages and actions), they cannot sign in, and their
/// session rows are gone; enabled again, they sign in with the same password. The page
/// lists each user's role, state, creation and last sign-in; support staff do not see the
/// page in the nav and get 403 for it; every change is audited under the admin.
#[tokio::test]
async fn a_disabled_support_user_cannot_sign_in_and_their_open_session_ends() {
    let app = spawn_app().await;
    let admin = sign_in(&app, "admin", ADMIN_PASSWORD).await;

    let list = admin.get("/console/users").await;
    assert_eq!(list.status, 200, "{}", list.body);
    assert!(list.body.contains("href=\"/console/users\""), "admins see Users in the nav");
    assert!(list.body.contains("id=\"user-admin\""), "{}", list.body);

    let (page, _) = admin.post_and_follow("/console/users", &[("name", "helen"), ("role", "support"), ("password", "support-password")]).await;
    assert_eq!(page.status, 200, "{}", page.body);
    assert!(page.body.contains("support user helen created"), "no flash: {}", page.body);
    assert!(!page.body.contains("id=\"revealed\""), "a typed password is not shown");
    let row = &page.body[page.body.find("id=\"user-helen\"").expect("helen is listed")..];
    let row = &row[..row.find("</tr>").unwrap()];
    assert!(row.contains("<td>support</td>") && row.contains("enabled") && row.contains("never"), "{row}");

    let helen = sign_in(&app, "helen", "support-password").await;
    let home = helen.get("/console").await;
    assert!(!home.body.contains("href=\"/console/users\""), "support staff do not see Users in the nav");
    assert_eq!(helen.get("/console/users").await.status, 403);
    let row = admin.get("/console/users").await.body;
    let row = &row[row.find("id=\"user-helen\"").unwrap()..];
    let row = &row[..row.find("</tr>").unwrap()];
    assert!(!row.contains("never"), "the last sign-in is shown: {row}");
    let token = app.biz_type("orders").await;
    let task = app.create_task(&token, json!({"biz_type": "orders", "delay_ms": 3600000})).await;
    let task_id = task["id"].as_str().unwrap();

    let (page, _) = admin.post_and_follow("/console/users/helen/disable", &[]).await;
    assert!(page.body.contains("helen disabled"), "{}", page.body);
    assert!(!signed_in(&helen).await, "the open session still works after disabling");
    let cancel = helen.post(&format!("/console/tasks/{task_id}/cancel"), &[]).await;
    assert_eq!(cancel.status, 303);
    assert!(cancel.location().starts_with("/console/login"), "{}", cancel.location());
    let status: String = sqlx::query_scalar("SELECT status FROM all_tasks WHERE id = $1::uuid").bind(task_id).fetch_one(&app.pool).await.unwrap();
    assert_eq!(status, "pending", "the disabled user's session acted");
    assert_eq!(sessions_of(&app, "helen").await, 0, "their sessions are deleted");
    let refused = sign_in_attempt(&app, "helen", "support-password").await;
    assert_eq!(refused.status, 401, "{}", refused.body);
    let row = admin.get("/console/users").await.body;
    let row = &row[row.find("id=\"user-helen\"").unwrap()..];
    assert!(row[..row.find("</tr>").unwrap()].contains("disabled"));

    let (page, _) = admin.post_and_follow("/console/users/helen/enable", &[]).await;
    assert!(page.body.contains("helen enabled"), "{}", page.body);
    let again = sign_in(&app, "helen", "support-password").await;
    assert!(signed_in(&again).await);

    let actor = "user:admin".to_string();
    let expected = [("user.create", "helen"), ("user.update", "helen"), ("user.update", "helen")];
    let expected: Vec<_> = expected.iter().map(|(a, t)| (actor.clone(), a.to_string(), t.to_string())).collect();
    assert_eq!(user_audit(&app).await, expected);
    let hashes: i64 =
        sqlx::query_scalar("SELECT count(*) FROM audit_log WHERE after::text LIKE '%support-password%'").fetch_one(&app.pool).await.unwrap();
    assert_eq!(hashes, 0, "a password in the audit log");
}

/// A reset gives the user a generated password, shown once on the users page through the
/// sealed one-time cookie: a reload shows nothing, another session cannot open it. The old
/// password stops working and the user's sessions end; the new one signs in. A new user
/// made without a password gets a generated one, shown once the same way.
#[tokio::test]
async fn a_reset_password_is_shown_once_and_the_old_one_stops_working() {
    let app = spawn_app().await;
    let admin = sign_in(&app, "admin", ADMIN_PASSWORD).await;
    let other = sign_in(&app, "admin", ADMIN_PASSWORD).await;
    chime::users::create(&app.pool, "helen", "support", "support-password").await.unwrap();
    let helen = sign_in(&app, "helen", "support-password").await;

    let (page, cookies) = admin.post_and_follow("/console/users/helen/reset-password", &[]).await;
    assert_eq!(page.status, 200, "{}", page.body);
    assert!(page.body.contains("New password for helen"), "{}", page.body);
    let password = revealed(&page.body);
    assert_eq!(password.len(), 20, "{password}");
    assert_eq!(cookie(&page.headers, "chime_reveal").as_deref(), Some(""), "the page removes the secret's cookie");
    let reload = admin.get("/console/users").await;
    assert!(!reload.body.contains(&password) && !reload.body.contains("id=\"revealed\""), "the reload shows the password again");
    let elsewhere = other.get_with("/console/users", &cookies).await;
    assert!(elsewhere.status == 200 && !elsewhere.body.contains(&password), "another session opened the password");

    assert!(!signed_in(&helen).await, "a reset ends the user's sessions");
    assert_eq!(sign_in_attempt(&app, "helen", "support-password").await.status, 401, "the old password still works");
    assert_eq!(sign_in_attempt(&app, "helen", &password).await.status, 303, "the new password does not work");

    let (page, _) = admin.post_and_follow("/console/users", &[("name", "ivan"), ("role", "admin"), ("password", "")]).await;
    assert!(page.body.contains("admin user ivan created"), "{}", page.body);
    let generated = revealed(&page.body);
    assert!(page.body.contains("password of ivan"), "{}", page.body);
    assert!(!admin.get("/console/users").await.body.contains(&generated), "shown again");
    let ivan = sign_in(&app, "ivan", &generated).await;
    assert_eq!(ivan.get("/console/users").await.status, 200, "ivan is an admin");

    let actions: Vec<String> = user_audit(&app).await.into_iter().map(|(_, action, _)| action).collect();
    assert_eq!(actions, ["user.reset_password", "user.create"]);
    for secret in [&password, &generated] {
        let leaked: i64 =
            sqlx::query_scalar("SELECT count(*) FROM audit_log WHERE coalesce(before::text, '') || coalesce(after::text, '') LIKE '%' || $1 || '%'")
                .bind(secret)
                .fetch_one(&app.pool)
                .await
                .unwrap();
        assert_eq!(leaked, 0, "a generated password is in the audit log");
    }
}

/// Every user, support staff too, changes their own password on their account page, giving
/// the current one: every problem is shown at once (a wrong current password, a short new
/// one, a confirmation that differs) and nothing changes; then the change works, the
/// session that made it stays signed in, their other sessions end, and only the new
/// password signs in. A form without its CSRF token is refused.
#[tokio::test]
async fn everyone_changes_their_own_password_giving_the_current_one() {
    let app = spawn_app().await;
    chime::users::create(&app.pool, "helen", "support", "support-password").await.unwrap();
    let helen = sign_in(&app, "helen", "support-password").await;
    let elsewhere = sign_in(&app, "helen", "support-password").await;

    let account = helen.get("/console/account").await;
    assert_eq!(account.status, 200, "{}", account.body);
    assert!(account.body.contains("id=\"change-password\""));

    let page =
        helen.post("/console/account/password", &[("current_password", "wrong"), ("new_password", "short"), ("confirm_password", "other")]).await;
    assert_eq!(page.status, 422, "{}", page.body);
    for field in ["current_password", "new_password", "confirm_password"] {
        assert!(!page.body.contains(&format!("data-field=\"{field}\"></span>")), "no error at {field}: {}", page.body);
    }
    assert!(page.body.contains("is not your current password") && page.body.contains("at least 8 characters"), "{}", page.body);
    assert_eq!(sign_in_attempt(&app, "helen", "support-password").await.status, 303, "a refused change changed the password");

    let no_csrf = helen
        .post_raw(
            "/console/account/password",
            &[("current_password", "support-password"), ("new_password", "a new passphrase"), ("confirm_password", "a new passphrase")],
        )
        .await;
    assert_eq!(no_csrf.status, 403);

    let elsewhere_too = sign_in(&app, "helen", "support-password").await;
    let (page, _) = helen
        .post_and_follow(
            "/console/account/password",
            &[("current_password", "support-password"), ("new_password", "a new passphrase"), ("confirm_password", "a new passphrase")],
        )
        .await;
    assert_eq!(page.status, 200, "{}", page.body);
    assert!(page.body.contains("Password changed"), "{}", page.body);
    assert!(signed_in(&helen).await, "the session that changed it was signed out");
    assert!(!signed_in(&elsewhere).await && !signed_in(&elsewhere_too).await, "the other sessions still work");
    assert_eq!(sign_in_attempt(&app, "helen", "support-password").await.status, 401, "the old password still works");
    assert_eq!(sign_in_attempt(&app, "helen", "a new passphrase").await.status, 303);
    let actions: Vec<(String, String, String)> = user_audit(&app).await;
    assert_eq!(actions, [("user:helen".to_string(), "user.change_password".to_string(), "helen".to_string())]);
}

/// The last enabled admin can be neither demoted nor disabled, from the console as from the
/// admin API (409, the same words); a disabled admin does not count. With another enabled
/// admin, the demotion goes through, and the demoted admin's session loses the users page.
#[tokio::test]
async fn the_last_enabled_admin_is_kept() {
    let app = spawn_app().await;
    let admin = sign_in(&app, "admin", ADMIN_PASSWORD).await;
    let users_before = chime::users::list(&app.pool).await.unwrap();

    for (path, form) in [("/console/users/admin/role", &[("role", "support")][..]), ("/console/users/admin/disable", &[][..])] {
        let page = admin.post(path, form).await;
        assert_eq!(page.status, 409, "{path}: {}", page.body);
        assert!(page.body.contains("`admin` is the last enabled admin; make another user an admin first"), "{path}: {}", page.body);
        assert!(page.body.contains("id=\"users\""), "{path}: the refusal is shown on the users page");
    }
    let api = app.patch("/api/v1/admin/users/admin", &admin_token(&app).await, json!({"role": "support"})).await;
    assert_eq!((api.status, api.code()), (409, "invalid_state"), "{}", api.body);
    assert_eq!(api.message(), "`admin` is the last enabled admin; make another user an admin first");

    chime::users::create(&app.pool, "ops", "admin", "ops-password").await.unwrap();
    assert_eq!(admin.post_and_follow("/console/users/ops/disable", &[]).await.0.status, 200);
    assert_eq!(admin.post("/console/users/admin/role", &[("role", "support")]).await.status, 409, "a disabled admin counts");
    assert_eq!(chime::users::list(&app.pool).await.unwrap().iter().find(|u| u.name == "admin").unwrap().role, users_before[0].role);

    assert_eq!(admin.post_and_follow("/console/users/ops/enable", &[]).await.0.status, 200);
    let (page, _) = admin.post_and_follow("/console/users/admin/role", &[("role", "support")]).await;
    assert_eq!(page.status, 200, "{}", page.body);
    assert!(page.body.contains("You are now support") && !page.body.contains("href=\"/console/users\""), "{}", page.body);
    assert_eq!(admin.get("/console/users").await.status, 403, "the demoted admin still sees the users page");
    assert!(signed_in(&admin).await, "a role change keeps the session");
}

/// The new-user form gets `users`'s rules with every problem at once and the values kept
/// (never the password); hostile input (NUL, 20 KB, a name taken) is refused on the form;
/// a bad role in a change, or a user no one can be, is refused on the page. Nothing changes.
#[tokio::test]
async fn the_user_forms_refuse_what_the_api_refuses() {
    let app = spawn_app().await;
    let admin = sign_in(&app, "admin", ADMIN_PASSWORD).await;
    chime::users::create(&app.pool, "helen", "support", "support-password").await.unwrap();
    let before = chime::users::list(&app.pool).await.unwrap().len();

    let page = admin.post("/console/users", &[("name", "Bad Name!"), ("role", "root"), ("password", "shortpw")]).await;
    assert_eq!(page.status, 422, "{}", page.body);
    for field in ["name", "role", "password"] {
        assert!(
            page.body.contains(&format!("data-field=\"{field}\">")) && !page.body.contains(&format!("data-field=\"{field}\"></span>")),
            "no error at {field}"
        );
    }
    assert!(page.body.contains("value=\"Bad Name!\"") && !page.body.contains("shortpw"), "the name is kept, the password is not");

    let long = "n".repeat(20_000);
    for (name, says) in [("he\0len", "must be 1-64"), (long.as_str(), "must be 1-64"), ("helen", "already exists")] {
        let page = admin.post("/console/users", &[("name", name), ("role", "support"), ("password", "long enough")]).await;
        assert_eq!(page.status, 422, "{}", &page.body[..page.body.len().min(2000)]);
        assert!(page.body.contains(says), "{says}: {}", &page.body[..page.body.len().min(3000)]);
    }
    let page = admin.post("/console/users/helen/role", &[("role", "root")]).await;
    assert_eq!(page.status, 422, "{}", page.body);
    assert!(page.body.contains("role: must be admin or support"), "{}", page.body);
    for path in ["/console/users/nobody/disable", "/console/users/he%00len/reset-password"] {
        let page = admin.post(path, &[]).await;
        assert_eq!(page.status, 404, "{path}: {}", page.body);
    }
    assert_eq!(chime::users::list(&app.pool).await.unwrap().len(), before);
    assert!(chime::users::list(&app.pool).await.unwrap().iter().all(|u| !u.disabled && (u.name != "helen" || u.role == "support")));
}

/// The token's row: (name, last used, the row version PostgreSQL writes on every update).
async fn token_row(app: &TestApp, prefix: &str) -> (Option<String>, Option<chrono::DateTime<chrono::Utc>>, String) {
    sqlx::query_as("SELECT name, last_used_at, xmin::text FROM api_tokens WHERE prefix = $1").bind(prefix).fetch_one(&app.pool).await.unwrap()
}

/// Waits until the token's use is recorded (it is written off the request's path).
async fn wait_for_use(app: &TestApp, prefix: &str) -> (Option<String>, Option<chrono::DateTime<chrono::Utc>>, String) {
    wait_until("the token's use recorded", Duration::from_secs(5), || async {
        let row = token_row(app, prefix).await;
        row.1.is_some().then_some(row)
    })
    .await
}

/// A token made by the command line, the admin API or the console carries the name it was
/// given (shown in the console's and the admin API's lists); a name too long or with a
/// control character is refused (422 naming it). A token's use is recorded off the request
/// path, once a minute at most: two requests within the minute write the row once, even
/// when the node checks the token again in between (its cache emptied by a biz type
/// change), and the database refuses a second write within the minute from any node. The
/// time shows in the console and the admin API.
#[tokio::test]
async fn tokens_have_names_and_a_last_use_written_once_a_minute() {
    let app = spawn_app().await;
    app.biz_type("orders").await;
    let admin_key = admin_token(&app).await;
    let env = [("DATABASE_URL", app.db_url.as_str())];

    let out = chime(&env, &["token", "create", "--biz-type", "orders", "--name", "ci"], None).await;
    assert!(out.ok, "{}", out.stderr);
    assert!(out.stdout.contains("named ci"), "{}", out.stdout);
    let ci = out.last_line().to_string();
    let bad = chime(&env, &["token", "create", "--biz-type", "orders", "--name", &"x".repeat(65)], None).await;
    assert!(!bad.ok && bad.stderr.contains("name"), "{}", bad.stderr);

    let made = app.post("/api/v1/admin/biz-types/orders/tokens", &admin_key, json!({"name": "deploy"})).await;
    assert_eq!(made.status, 201, "{}", made.body);
    assert_eq!((made.body["name"].as_str(), made.body["last_used_at"].is_null()), (Some("deploy"), true), "{}", made.body);
    let unnamed = app.request("POST", "/api/v1/admin/biz-types/orders/tokens", Some(&admin_key), None).await;
    assert_eq!(unnamed.status, 201, "{}", unnamed.body);
    assert!(unnamed.body["name"].is_null(), "{}", unnamed.body);
    for name in ["x".repeat(65), "a\u{7}b".to_string()] {
        let refused = app.post("/api/v1/admin/biz-types/orders/tokens", &admin_key, json!({"name": name})).await;
        assert_eq!((refused.status, refused.code()), (422, "invalid_argument"), "{}", refused.body);
        assert!(refused.message().starts_with("name: "), "{}", refused.body);
    }

    let admin = sign_in(&app, "admin", ADMIN_PASSWORD).await;
    let (page, _) = admin.post_and_follow("/console/biz-types/orders/tokens", &[("token_name", "billing worker")]).await;
    assert!(page.body.contains("Token billing worker created."), "{}", page.body);
    let page = admin.post("/console/biz-types/orders/tokens", &[("token_name", "a\u{1}b")]).await;
    assert_eq!(page.status, 422, "{}", page.body);
    assert!(!page.body.contains("data-field=\"token_name\"></span>"), "no error at the token's name");
    let tokens_made: i64 = sqlx::query_scalar("SELECT count(*) FROM api_tokens").fetch_one(&app.pool).await.unwrap();
    assert_eq!(tokens_made, 5, "the helper's, ci, deploy, unnamed, billing worker");

    // Two requests within the minute: one write.
    let prefix = &ci[..12];
    assert_eq!(token_row(&app, prefix).await.1, None, "used before any request");
    assert_eq!(app.get("/api/v1/tasks", &ci).await.status, 200);
    let (name, first_use, version) = wait_for_use(&app, prefix).await;
    assert_eq!(name.as_deref(), Some("ci"));
    // A biz type change empties every node's token cache (told by notification): the next
    // request checks the token in the database again, and still records no second use
    // within the minute.
    let mut listener = wake_listener(&app).await;
    let changed = app.patch("/api/v1/admin/biz-types/orders", &admin_key, json!({"description": "changed"})).await;
    assert_eq!(changed.status, 200, "{}", changed.body);
    settings_notice(&mut listener).await;
    assert_eq!(app.get("/api/v1/tasks", &ci).await.status, 200);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(token_row(&app, prefix).await, (Some("ci".into()), first_use, version.clone()), "a second request within the minute wrote the row");
    // Another node's recording within the minute writes nothing either.
    let id: uuid::Uuid = sqlx::query_scalar("SELECT id FROM api_tokens WHERE prefix = $1").bind(prefix).fetch_one(&app.pool).await.unwrap();
    chime::biz_types::record_use(&app.pool, id).await.unwrap();
    assert_eq!(token_row(&app, prefix).await.2, version, "the database recorded a second use within the minute");

    let listed = app.get("/api/v1/admin/biz-types/orders/tokens", &admin_key).await;
    let items = listed.body["items"].as_array().unwrap();
    let row = items.iter().find(|t| t["prefix"] == prefix).unwrap();
    let shown: chrono::DateTime<chrono::Utc> = row["last_used_at"].as_str().unwrap().parse().unwrap();
    assert_eq!(Some(shown), first_use);
    assert_eq!(row["name"], "ci");
    assert!(items.iter().filter(|t| t["prefix"] != prefix).all(|t| t["last_used_at"].is_null()), "unused tokens show a use: {}", listed.body);
    let names: Vec<&str> = items.iter().filter_map(|t| t["name"].as_str()).collect();
    assert_eq!(names, ["billing worker", "deploy", "ci"], "newest first");

    let page = admin.get("/console/biz-types/orders").await.body;
    let row = &page[page.find(&format!("<code>{prefix}…</code>")).expect("the token is listed")..];
    let row = &row[..row.find("</tr>").unwrap()];
    let when = first_use.unwrap().format("%Y-%m-%d %H:%M").to_string();
    assert!(row.contains("<td>ci</td>") && row.contains(&format!("<td class=\"last-used\">{when}</td>")), "{row}");
    assert!(page.contains("billing worker") && page.contains("deploy") && page.contains("unnamed"), "{page}");
}
