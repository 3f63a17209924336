//! Console sign-in through a real OpenID Provider, in a real headless Chromium: the npm
//! package `oidc-provider` (OpenID Certified), run by tests/oidc/provider.mjs as a
//! company's would be (chime a confidential client that must use PKCE, a `groups` claim,
//! its own sign-in page). tests/setup.sh installs it, pinned, under target/oidc-provider;
//! these tests fail, saying so, when it is missing.
//!
//! What the provider is made to do wrong is done by the provider itself, on the test's
//! word (`IdP::mode`): give chime the ID token it issues to another client, or one that
//! expired on its way; and hold its redirect back to chime on a page, so that the browser
//! can bring back an edited state, or the same code twice.

use std::path::PathBuf;
use std::time::Duration;

use chime::config::ServeArgs;
use chime::oidc::{CALLBACK_PATH, OidcArgs};
use chime::users::UserChanges;
use tokio::io::AsyncBufReadExt;

use crate::browser::Browser;
use crate::helpers::{TestApp, free_port, fresh_database, serve_on, spawn_app};

/// The pinned version tests/setup.sh installs.
const OIDC_PROVIDER_VERSION: &str = "9.13.3";

/// The OpenID Provider, a `node` process; killed when dropped.
pub struct IdP {
    pub issuer: String,
    client: reqwest::Client,
    _child: tokio::process::Child,
}

fn package_dir() -> PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/oidc-provider/node_modules/oidc-provider")
}

impl IdP {
    /// Starts the provider, with chime's redirect URI registered for its client `chime`.
    pub async fn start(redirect_uri: &str) -> IdP {
        let dir = package_dir();
        let package = std::fs::read_to_string(dir.join("package.json")).unwrap_or_else(|e| {
            panic!("oidc-provider is missing ({}: {e}): run tests/setup.sh (it installs oidc-provider@{OIDC_PROVIDER_VERSION})", dir.display())
        });
        assert!(
            package.contains(&format!("\"version\": \"{OIDC_PROVIDER_VERSION}\"")),
            "{} holds another version: run tests/setup.sh",
            dir.display()
        );
        let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/oidc/provider.mjs");
        static STARTED: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = STARTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let log = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("oidc-provider-{}-{n}.log", std::process::id()));
        let mut child = tokio::process::Command::new("node")
            .arg(script)
            .env("OIDC_PROVIDER_MODULE", &dir)
            .env("CHIME_CALLBACK", redirect_uri)
            .env("OIDC_PROVIDER_KEY_FILE", std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("oidc-provider-key.json"))
            .stdout(std::process::Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap())
            .kill_on_drop(true)
            .spawn()
            .expect("starting node (tests/setup.sh installs it)");
        let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
        let issuer = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
            .await
            .unwrap_or_else(|_| panic!("the provider printed no issuer within 60 s; its log: {}", log.display()))
            .unwrap()
            .unwrap_or_else(|| panic!("the provider exited; its log: {}", log.display()));
        // Its stdout stays open, read to the end, so that nothing it prints fails on a
        // closed pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        IdP { issuer, client: crate::helpers::client(), _child: child }
    }

    /// How the provider's token endpoint and redirect behave from now on: `normal`,
    /// `wrong-audience`, `expired`, `hold` (tests/oidc/provider.mjs).
    pub async fn mode(&self, mode: &str) {
        let resp = self.client.post(format!("{}/test/mode?set={mode}", self.issuer)).send().await.unwrap();
        assert_eq!(resp.status(), 200);
    }
}

/// chime with the provider as a company would set it up: chime-admins are admins,
/// chime-support support staff; no clock leeway, so that a token one second old is late.
pub fn settings(idp: &IdP, public_url: &str) -> ServeArgs {
    ServeArgs {
        engine: false,
        public_url: Some(public_url.to_string()),
        oidc: Box::new(OidcArgs {
            oidc_issuer: Some(idp.issuer.clone()),
            oidc_client_id: Some("chime".into()),
            oidc_client_secret: Some("chime-client-secret".into()),
            oidc_scopes: "openid profile email groups".into(),
            oidc_admin_groups: "chime-admins".into(),
            oidc_support_groups: "chime-support".into(),
            oidc_display_name: "Example Corp".into(),
            oidc_leeway_secs: 0,
            ..OidcArgs::defaults()
        }),
        ..ServeArgs::default()
    }
}

/// chime on a port chosen first (its redirect URI is registered at the provider before it
/// starts), and the provider; `change` adjusts the settings.
pub async fn spawn_with_idp(change: impl FnOnce(&mut ServeArgs)) -> (TestApp, IdP) {
    let port = free_port();
    let public_url = format!("http://127.0.0.1:{port}");
    let idp = IdP::start(&format!("{public_url}{CALLBACK_PATH}")).await;
    let mut settings = settings(&idp, &public_url);
    settings.listen = format!("127.0.0.1:{port}").parse().unwrap();
    change(&mut settings);
    (serve_on(fresh_database().await, settings).await, idp)
}

/// From chime's sign-in page to the provider's, where `user` signs in with `password`.
pub async fn sign_in_at_idp(browser: &Browser, app: &TestApp, user: &str, password: &str) {
    browser.goto(&format!("{}/console/login", app.address)).await;
    assert_eq!(browser.text("#oidc-sign-in").await, "Sign in with Example Corp");
    browser.click("#oidc-sign-in").await;
    browser.fill("#idp-login input[name=username]", user).await;
    browser.fill("#idp-login input[name=password]", password).await;
    browser.submit("#idp-login").await;
}

async fn audit(app: &TestApp, action: &str) -> Vec<(String, String, serde_json::Value)> {
    sqlx::query_as("SELECT actor, target, coalesce(after, 'null') FROM audit_log WHERE action = $1 ORDER BY id")
        .bind(action)
        .fetch_all(&app.pool)
        .await
        .unwrap()
}

/// An admin and a support user are made at their first sign-in, with the role their
/// groups give, tied to the provider's subject, which the audit log names; someone in no
/// such group is refused with a page that says why. Sign-out ends chime's session.
#[tokio::test]
async fn staff_sign_in_with_the_role_their_groups_give_and_others_are_refused() {
    let (app, _idp) = spawn_with_idp(|_| {}).await;

    let browser = Browser::start().await;
    sign_in_at_idp(&browser, &app, "alice", "alice-password").await;
    assert_eq!(browser.current_url().await, format!("{}/console", app.address));
    let row: (String, String, Option<String>, String) =
        sqlx::query_as("SELECT role, password_hash, oidc_subject, oidc_issuer FROM users WHERE username = 'alice'")
            .fetch_one(&app.pool)
            .await
            .unwrap();
    assert_eq!((row.0.as_str(), row.1.as_str(), row.2.as_deref()), ("admin", "!oidc", Some("employee-616c696365")));
    browser.goto("/console/users").await;
    assert!(browser.text("main").await.contains("alice"), "an admin sees the users page");
    let created = audit(&app, "user.create").await;
    let created = created.iter().find(|(_, target, _)| target == "alice").expect("alice's creation is audited");
    assert_eq!(created.2["oidc_subject"], "employee-616c696365", "{created:?}");
    let signed_in = audit(&app, "user.sign_in").await;
    assert_eq!(signed_in.len(), 1, "{signed_in:?}");
    assert_eq!((signed_in[0].0.as_str(), &signed_in[0].2["oidc_subject"]), ("user:alice", &serde_json::json!("employee-616c696365")));

    // Sign-out ends the session in chime: the console asks to sign in again.
    browser.submit("#logout").await;
    let sessions: i64 = sqlx::query_scalar("SELECT count(*) FROM sessions").fetch_one(&app.pool).await.unwrap();
    assert_eq!(sessions, 0);
    browser.goto(&format!("{}/console", app.address)).await;
    assert!(browser.current_url().await.contains("/console/login"), "{}", browser.current_url().await);
    browser.close().await;

    let browser = Browser::start().await;
    sign_in_at_idp(&browser, &app, "sam", "sam-password").await;
    assert_eq!(browser.current_url().await, format!("{}/console", app.address));
    browser.goto("/console/users").await;
    assert!(browser.text("main").await.contains("only an admin can do this"), "support staff are support staff");
    browser.close().await;

    let browser = Browser::start().await;
    sign_in_at_idp(&browser, &app, "nora", "nora-password").await;
    let refusal = browser.text("#refusal").await;
    assert_eq!(refusal, "your account is in no group that has a role in chime (your groups: staff, marketing)");
    assert_eq!(
        browser.text("#refusal-hint").await,
        "The groups that give a role are admin: chime-admins; support: chime-support. Ask whoever manages them to add you to one."
    );
    browser.goto(&format!("{}/console", app.address)).await;
    assert!(browser.current_url().await.contains("/console/login"), "nora has no session");
    browser.close().await;
    let nora: i64 = sqlx::query_scalar("SELECT count(*) FROM users WHERE username = 'nora'").fetch_one(&app.pool).await.unwrap();
    assert_eq!(nora, 0, "no user is made for someone refused");
    let failed = audit(&app, "user.sign_in_failed").await;
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert_eq!(failed[0].0, "oidc:employee-6e6f7261", "the refusal names the subject");
    assert_eq!(failed[0].2["reason"], refusal);
}

/// The provider's ID token for another client (a wrong audience), one that expired on its
/// way, one for another sign-in (its nonce), one changed after signing, an edited state, a callback brought back twice and a code used twice sign nobody
/// in; the genuine callback, held back while the edited one was tried, still does.
#[tokio::test]
async fn wrong_audiences_expired_tokens_edited_states_and_replays_are_refused() {
    let (app, idp) = spawn_with_idp(|_| {}).await;
    let browser = Browser::start().await;
    let signed_in = |who: &'static str| {
        let pool = app.pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>("SELECT count(*) FROM sessions s JOIN users u ON u.id = s.user_id WHERE u.username = $1")
                .bind(who)
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    };

    idp.mode("wrong-audience").await;
    sign_in_at_idp(&browser, &app, "alice", "alice-password").await;
    assert_eq!(browser.text("#refusal").await, "the ID token was issued to another client, not to chime (wrong audience)");
    assert_eq!(signed_in("alice").await, 0);

    // Signed in at the provider already: the button leads straight back, two seconds late.
    idp.mode("expired").await;
    browser.goto(&format!("{}/console/login", app.address)).await;
    browser.click("#oidc-sign-in").await;
    browser.wait_for("#refusal", Duration::from_secs(15)).await;
    assert_eq!(browser.text("#refusal").await, "the ID token has expired");
    assert_eq!(signed_in("alice").await, 0);

    // Signed by the provider for another sign-in (its nonce), or changed after signing.
    for (mode, refusal) in [
        ("other-nonce", "the ID token's nonce is not this sign-in's: it was made for another one"),
        ("tampered", "the ID token's signature is not the provider's"),
    ] {
        idp.mode(mode).await;
        browser.goto(&format!("{}/console/login", app.address)).await;
        browser.click("#oidc-sign-in").await;
        assert_eq!(browser.text("#refusal").await, refusal, "{mode}");
        assert_eq!(signed_in("alice").await, 0, "{mode}");
    }

    // The provider's redirect held on a page: its link, with the state edited, is refused;
    // the link as it is still signs in.
    idp.mode("hold").await;
    browser.goto(&format!("{}/console/login", app.address)).await;
    browser.click("#oidc-sign-in").await;
    let genuine = browser.client().find(fantoccini::Locator::Css("#continue")).await.unwrap().attr("href").await.unwrap().unwrap();
    let mut edited = url::Url::parse(&genuine).unwrap();
    let pairs: Vec<(String, String)> = edited.query_pairs().map(|(k, v)| (k.into_owned(), v.into_owned())).collect();
    edited.query_pairs_mut().clear().extend_pairs(pairs.iter().map(|(k, v)| (k.as_str(), if k == "state" { "edited-state" } else { v.as_str() })));
    browser.goto(edited.as_str()).await;
    assert!(
        browser.text("#refusal").await.starts_with("this sign-in's state is not the one this browser started"),
        "{}",
        browser.text("#refusal").await
    );
    assert_eq!(signed_in("alice").await, 0);
    browser.goto(&genuine).await;
    assert_eq!(browser.current_url().await, format!("{}/console", app.address));
    assert_eq!(signed_in("alice").await, 1);

    // Signed out, the same callback again is refused.
    browser.submit("#logout").await;
    browser.goto(&genuine).await;
    assert!(browser.text("#refusal").await.starts_with("this sign-in's state is not the one this browser started"));
    assert_eq!(signed_in("alice").await, 0);

    // A new sign-in's state with the code already used: the provider refuses the code.
    browser.goto(&format!("{}/console/login", app.address)).await;
    browser.click("#oidc-sign-in").await;
    let fresh = browser.client().find(fantoccini::Locator::Css("#continue")).await.unwrap().attr("href").await.unwrap().unwrap();
    let code = |url: &str| url::Url::parse(url).unwrap().query_pairs().find(|(k, _)| k == "code").unwrap().1.into_owned();
    let replayed = fresh.replace(&code(&fresh), &code(&genuine));
    browser.goto(&replayed).await;
    let refusal = browser.text("#refusal").await;
    assert!(refusal.starts_with("the provider refused the sign-in code: invalid_grant"), "{refusal}");
    assert_eq!(signed_in("alice").await, 0);
    browser.close().await;

    let reasons: Vec<String> =
        audit(&app, "user.sign_in_failed").await.into_iter().map(|(_, _, after)| after["reason"].as_str().unwrap_or_default().to_string()).collect();
    assert_eq!(reasons.len(), 5, "{reasons:?}");
    for (reason, expected) in reasons.iter().zip(["wrong audience", "expired", "nonce", "signature", "invalid_grant"]) {
        assert!(reason.contains(expected), "{reasons:?}");
    }
}

/// With CHIME_LOCAL_PASSWORDS=false the sign-in page offers the provider alone, and a
/// password posted anyway is refused.
#[tokio::test]
async fn local_passwords_can_be_turned_off() {
    let (app, _idp) = spawn_with_idp(|s| s.local_passwords = false).await;
    let client = crate::console::no_redirects();
    let page = client.get(format!("{}/console/login", app.address)).send().await.unwrap().text().await.unwrap();
    assert!(page.contains("Sign in with Example Corp") && !page.contains("name=\"password\""), "{page}");
    let refused = client
        .post(format!("{}/console/login", app.address))
        .form(&[("username", "admin"), ("password", "test-admin-password"), ("csrf", ""), ("next", "/console")])
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 403);
    assert!(refused.text().await.unwrap().contains("CHIME_LOCAL_PASSWORDS=false"));
}

async fn refused_at_start(settings: ServeArgs) -> String {
    let mut settings = settings;
    settings.listen = "127.0.0.1:0".parse().unwrap();
    let pool = chime::db::connect(&fresh_database().await, 2).await.unwrap();
    match chime::startup::Application::build(&settings, pool.clone(), chime::db::Health::new(&pool)).await {
        Ok(_) => panic!("chime started with {settings:?}"),
        Err(e) => format!("{e:#}"),
    }
}

/// Settings that cannot work stop the start, with an error that names the setting: an
/// issuer that does not answer or calls itself otherwise, no public URL, no client, and
/// local passwords off with no provider.
#[tokio::test]
async fn bad_settings_are_refused_at_start_naming_the_setting() {
    let port = free_port();
    let idp = IdP::start(&format!("http://127.0.0.1:{port}{CALLBACK_PATH}")).await;
    let good = settings(&idp, &format!("http://127.0.0.1:{port}"));

    let silent = format!("http://127.0.0.1:{}", free_port());
    let error =
        refused_at_start(ServeArgs { oidc: Box::new(OidcArgs { oidc_issuer: Some(silent.clone()), ..*good.oidc.clone() }), ..good.clone() }).await;
    assert!(error.starts_with(&format!("CHIME_OIDC_ISSUER `{silent}`: cannot read the provider's discovery document")), "{error}");

    let slash = format!("{}/", idp.issuer);
    let error =
        refused_at_start(ServeArgs { oidc: Box::new(OidcArgs { oidc_issuer: Some(slash.clone()), ..*good.oidc.clone() }), ..good.clone() }).await;
    assert!(error.contains(&format!("CHIME_OIDC_ISSUER `{slash}` is not the issuer its discovery document names (`{}`)", idp.issuer)), "{error}");

    let error = refused_at_start(ServeArgs { public_url: None, ..good.clone() }).await;
    assert!(error.starts_with("CHIME_OIDC_ISSUER is set but CHIME_PUBLIC_URL is not"), "{error}");

    let error = refused_at_start(ServeArgs { oidc: Box::new(OidcArgs { oidc_client_id: None, ..*good.oidc.clone() }), ..good.clone() }).await;
    assert!(error.starts_with("CHIME_OIDC_ISSUER is set but CHIME_OIDC_CLIENT_ID is not"), "{error}");

    let error = refused_at_start(ServeArgs { local_passwords: false, engine: false, ..ServeArgs::default() }).await;
    assert!(error.starts_with("CHIME_LOCAL_PASSWORDS=false with no OpenID Provider"), "{error}");
}

/// The provider's groups set an identity's role at each sign-in, but never take away the
/// last enabled admin (as a person's change through the console or API cannot): that
/// user stays an admin, and is demoted once another admin is enabled.
#[tokio::test]
async fn the_groups_never_demote_the_last_enabled_admin() {
    let app = spawn_app().await;
    let issuer = "https://idp.example.com";
    let sign_in = |role: &'static str| chime::users::oidc::sign_in(&app.pool, issuer, "employee-1", "alice", role);
    let role_of = |outcome: chime::users::oidc::Outcome| match outcome {
        chime::users::oidc::Outcome::SignedIn { user, .. } => user.role,
        other => panic!("not signed in: {other:?}"),
    };
    assert_eq!(role_of(sign_in("admin").await.unwrap()), "admin");
    // The first admin, made at the start, is disabled: alice is the last enabled admin.
    chime::users::update(&app.pool, "admin", &UserChanges { disabled: Some(true), ..Default::default() }).await.unwrap();
    assert_eq!(role_of(sign_in("support").await.unwrap()), "admin", "the last enabled admin stays one");
    let stored: String = sqlx::query_scalar("SELECT role FROM users WHERE username = 'alice'").fetch_one(&app.pool).await.unwrap();
    assert_eq!(stored, "admin");
    // Another admin: the groups demote her at her next sign-in.
    chime::users::update(&app.pool, "admin", &UserChanges { disabled: Some(false), ..Default::default() }).await.unwrap();
    assert_eq!(role_of(sign_in("support").await.unwrap()), "support");
}

/// A user who signs in through the provider gets no chime password, from the admin API or
/// the command line's path alike: one would let them in after the provider stopped doing so.
#[tokio::test]
async fn a_provider_user_gets_no_password() {
    let app = spawn_app().await;
    chime::users::oidc::sign_in(&app.pool, "https://idp.example.com", "employee-2", "sam", "support").await.unwrap();
    let admin = crate::admin::admin_token(&app).await;
    let refused = app.patch("/api/v1/admin/users/sam", &admin, serde_json::json!({"password": "a-new-password"})).await;
    assert_eq!(refused.status, 409, "{}", refused.body);
    assert!(refused.message().contains("signs in through the OpenID Provider"), "{}", refused.body);
    let direct = chime::users::update(&app.pool, "sam", &UserChanges { password: Some("a-new-password".into()), ..Default::default() }).await;
    assert!(direct.is_err(), "{direct:?}");
    let hash: String = sqlx::query_scalar("SELECT password_hash FROM users WHERE username = 'sam'").fetch_one(&app.pool).await.unwrap();
    assert_eq!(hash, chime::users::oidc::NO_PASSWORD);
    // Their other changes are made as for anyone.
    let disabled = app.patch("/api/v1/admin/users/sam", &admin, serde_json::json!({"disabled": true})).await;
    assert_eq!(disabled.status, 200, "{}", disabled.body);
}

/// Anyone may start a sign-in, and each is a row until it expires: at most 10,000 are
/// under way at once, so a flood of starts cannot fill the database; the next is refused
/// (429) until some expire, and then starts again.
#[tokio::test]
async fn sign_ins_under_way_are_bounded() {
    let (app, _idp) = spawn_with_idp(|_| {}).await;
    let client = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap();
    let start = || async { client.get(format!("{}/console/oidc/start", app.address)).send().await.unwrap().status().as_u16() };
    assert_eq!(start().await, 303, "a sign-in starts");
    sqlx::query(
        "INSERT INTO oidc_sign_ins (state, nonce, pkce_verifier, next, expires_at)
         SELECT 'flood-' || n, 'n', 'v', '/console', now() + interval '10 minutes' FROM generate_series(2, 10000) n",
    )
    .execute(&app.pool)
    .await
    .unwrap();
    assert_eq!(start().await, 429, "the 10,001st is refused");
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM oidc_sign_ins").fetch_one(&app.pool).await.unwrap();
    assert_eq!(rows, 10_000);
    sqlx::query("UPDATE oidc_sign_ins SET expires_at = now() - interval '1 second' WHERE state LIKE 'flood-%'").execute(&app.pool).await.unwrap();
    assert_eq!(start().await, 303, "once they expire, sign-ins start again");
}
