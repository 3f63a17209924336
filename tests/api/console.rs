//! The console over plain HTTP: sign-in, sessions, CSRF, roles, security headers. The
//! browser tests (`tests/console/`) drive the same pages in Chromium.

use reqwest::header::{COOKIE, LOCATION, SET_COOKIE};
use serde_json::json;

use chime::config::ServeArgs;

use crate::helpers::{TestApp, chime_process_logging, fresh_database, spawn_app, spawn_app_with};

pub const ADMIN_PASSWORD: &str = "test-admin-password";

/// A signed-in console user: the session cookie and the session's CSRF token.
pub struct Console {
    address: String,
    client: reqwest::Client,
    pub session: String,
    pub csrf: String,
}

pub struct Page {
    pub status: u16,
    pub headers: reqwest::header::HeaderMap,
    pub body: String,
}

impl Page {
    pub fn location(&self) -> &str {
        self.headers.get(LOCATION).map(|l| l.to_str().unwrap()).unwrap_or_default()
    }
}

pub fn no_redirects() -> reqwest::Client {
    crate::helpers::client();
    reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap()
}

pub fn cookie(headers: &reqwest::header::HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(SET_COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find_map(|c| c.strip_prefix(&format!("{name}=")).map(|rest| rest.split(';').next().unwrap().to_string()))
}

fn csrf_in(body: &str) -> String {
    let start = body.find("name=\"csrf\" value=\"").expect("a form with a csrf field") + 19;
    body[start..].split('"').next().unwrap().to_string()
}

/// Posts the sign-in form as a browser would; returns the answer.
pub async fn sign_in_attempt(app: &TestApp, user: &str, password: &str) -> Page {
    sign_in_attempt_from(app, "127.0.0.1", user, password, "/console/tasks").await
}

/// Like `sign_in_attempt`, from another loopback address (127.0.0.2, …) and asking to go
/// on to `next`.
pub async fn sign_in_attempt_from(app: &TestApp, from: &str, user: &str, password: &str, next: &str) -> Page {
    sign_in_attempt_forwarded(app, from, None, user, password, next).await
}

/// Like `sign_in_attempt_from`, as a proxy would send it: with `X-Forwarded-For`.
pub async fn sign_in_attempt_forwarded(app: &TestApp, from: &str, forwarded_for: Option<&str>, user: &str, password: &str, next: &str) -> Page {
    crate::helpers::client();
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .local_address(from.parse::<std::net::IpAddr>().unwrap())
        .build()
        .unwrap();
    let form = client.get(format!("{}/console/login", app.address)).send().await.unwrap();
    let login_cookie = cookie(form.headers(), "chime_login").unwrap();
    let csrf = csrf_in(&form.text().await.unwrap());
    let mut request = client.post(format!("{}/console/login", app.address)).header(COOKIE, format!("chime_login={login_cookie}"));
    if let Some(forwarded_for) = forwarded_for {
        request = request.header("X-Forwarded-For", forwarded_for);
    }
    let resp = request.form(&[("username", user), ("password", password), ("csrf", &csrf), ("next", next)]).send().await.unwrap();
    Page { status: resp.status().as_u16(), headers: resp.headers().clone(), body: resp.text().await.unwrap() }
}

pub async fn sign_in(app: &TestApp, user: &str, password: &str) -> Console {
    let page = sign_in_attempt(app, user, password).await;
    assert_eq!(page.status, 303, "{}", page.body);
    assert_eq!(page.location(), "/console/tasks", "back to the page asked for");
    let session = cookie(&page.headers, "chime_session").expect("a session cookie");
    let mut console = Console { address: app.address.clone(), client: no_redirects(), session, csrf: String::new() };
    console.csrf = csrf_in(&console.get("/console").await.body);
    console
}

impl Console {
    pub async fn get(&self, path: &str) -> Page {
        let resp = self.client.get(format!("{}{path}", self.address)).header(COOKIE, format!("chime_session={}", self.session)).send().await.unwrap();
        Page { status: resp.status().as_u16(), headers: resp.headers().clone(), body: resp.text().await.unwrap() }
    }

    /// Gets a page sending `cookies` ("name=value; …") beside the session cookie.
    pub async fn get_with(&self, path: &str, cookies: &str) -> Page {
        let resp = self
            .client
            .get(format!("{}{path}", self.address))
            .header(COOKIE, format!("chime_session={}; {cookies}", self.session))
            .send()
            .await
            .unwrap();
        Page { status: resp.status().as_u16(), headers: resp.headers().clone(), body: resp.text().await.unwrap() }
    }

    /// Posts a form (with the CSRF token) and follows its redirect as a browser would, with
    /// the cookies the redirect set (a flash message, a secret to show once). Returns the
    /// page it led to, and the cookies sent with it ("name=value; …").
    pub async fn post_and_follow(&self, path: &str, form: &[(&str, &str)]) -> (Page, String) {
        let posted = self.post(path, form).await;
        assert_eq!(posted.status, 303, "{path} answers with a redirect: {}", &posted.body[..posted.body.len().min(2000)]);
        assert!(!posted.body.contains("id=\"revealed\""), "{path}: the redirect itself shows a secret");
        let cookies: Vec<String> =
            posted.headers.get_all(SET_COOKIE).iter().map(|v| v.to_str().unwrap().split(';').next().unwrap().to_string()).collect();
        let cookies = cookies.join("; ");
        (self.get_with(posted.location(), &cookies).await, cookies)
    }

    /// Posts a form with the session's CSRF token added.
    pub async fn post(&self, path: &str, form: &[(&str, &str)]) -> Page {
        let mut fields: Vec<(&str, &str)> = form.to_vec();
        fields.push(("csrf", &self.csrf));
        self.post_raw(path, &fields).await
    }

    /// Posts a form body encoded as given, with the session's CSRF token added: bytes a
    /// browser would not send (invalid UTF-8, NUL) included.
    pub async fn post_encoded(&self, path: &str, body: &str) -> Page {
        let resp = self
            .client
            .post(format!("{}{path}", self.address))
            .header(COOKIE, format!("chime_session={}", self.session))
            .header(reqwest::header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .body(format!("{body}&csrf={}", self.csrf))
            .send()
            .await
            .unwrap();
        Page { status: resp.status().as_u16(), headers: resp.headers().clone(), body: resp.text().await.unwrap() }
    }

    /// Posts a form exactly as given (no CSRF token unless it is in `form`).
    pub async fn post_raw(&self, path: &str, form: &[(&str, &str)]) -> Page {
        let resp = self
            .client
            .post(format!("{}{path}", self.address))
            .header(COOKIE, format!("chime_session={}", self.session))
            .form(form)
            .send()
            .await
            .unwrap();
        Page { status: resp.status().as_u16(), headers: resp.headers().clone(), body: resp.text().await.unwrap() }
    }
}

/// The value a console page shows once (a new token or signing secret).
pub fn revealed(body: &str) -> String {
    let marker = r#"<code id="revealed" class="secret">"#;
    let start = body.find(marker).unwrap_or_else(|| panic!("nothing revealed on the page: {body}")) + marker.len();
    body[start..].split('<').next().unwrap().to_string()
}

/// Signs in `helen`, a support user (created here).
pub async fn support_user(app: &TestApp) -> Console {
    chime::users::create(&app.pool, "helen", "support", "support-password").await.unwrap();
    sign_in(app, "helen", "support-password").await
}

#[tokio::test]
async fn every_page_needs_a_signed_in_user() {
    let app = spawn_app().await;
    let client = no_redirects();
    for path in
        ["/console", "/console/biz-types", "/console/biz-types/new", "/console/tasks", "/console/timers", "/console/cluster", "/console/audit"]
    {
        let resp = client.get(format!("{}{path}", app.address)).send().await.unwrap();
        assert_eq!(resp.status(), 303, "{path}");
        let location = resp.headers()[LOCATION].to_str().unwrap();
        assert!(location.starts_with("/console/login?next="), "{path} → {location}");
    }
    let resp = client.post(format!("{}/console/biz-types", app.address)).form(&[("name", "x")]).send().await.unwrap();
    assert_eq!(resp.status(), 303);
    assert!(chime::biz_types::list(&app.pool).await.unwrap().is_empty());
    // A made-up session cookie is no better.
    let resp = client.get(format!("{}/console", app.address)).header(COOKIE, "chime_session=forged").send().await.unwrap();
    assert_eq!(resp.status(), 303);
}

#[tokio::test]
async fn sign_in_refuses_wrong_passwords_and_limits_attempts() {
    let app = spawn_app().await;
    let wrong = sign_in_attempt(&app, "admin", "not-the-password").await;
    assert_eq!(wrong.status, 401);
    assert!(wrong.body.contains("wrong user name or password"));
    assert!(cookie(&wrong.headers, "chime_session").is_none());
    let mut statuses = Vec::new();
    for _ in 0..10 {
        statuses.push(sign_in_attempt(&app, "admin", "guess").await.status);
    }
    assert_eq!(statuses.last(), Some(&429), "{statuses:?}");
    // Even the right password waits out the limit.
    assert_eq!(sign_in_attempt(&app, "admin", ADMIN_PASSWORD).await.status, 429);
}

/// Wrong passwords for `admin` hold back only the address they come from, with growing
/// waits: while 127.0.0.2 keeps guessing, admin signs in from 127.0.0.1. Every failure is
/// logged and audited with its address; a refused attempt says when to try again.
#[tokio::test]
async fn wrong_passwords_from_one_address_do_not_lock_admin_out_from_another() {
    let app = spawn_app().await;
    let mut statuses = Vec::new();
    for _ in 0..12 {
        statuses.push(sign_in_attempt_from(&app, "127.0.0.2", "admin", "guess", "/console").await.status);
    }
    sign_in(&app, "admin", ADMIN_PASSWORD).await;
    assert_eq!(statuses, [[401; 5].as_slice(), &[429; 7]].concat(), "five failures, then a wait");
    let refused = sign_in_attempt_from(&app, "127.0.0.2", "admin", ADMIN_PASSWORD, "/console").await;
    assert_eq!(refused.status, 429, "the guessing address waits even with the right password");
    let wait: u64 = refused.headers["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((1..=15).contains(&wait), "{wait}");
    assert!(refused.body.contains(&format!("try again in {wait} seconds")), "{}", refused.body);
    let audited: Vec<(String, String, String)> =
        sqlx::query_as("SELECT actor, action, target FROM audit_log WHERE action LIKE 'user.%' AND actor <> 'chime' ORDER BY id")
            .fetch_all(&app.pool)
            .await
            .unwrap();
    let failed = ("address:127.0.0.2".to_string(), "user.sign_in_failed".to_string(), "admin".to_string());
    let signed_in = ("user:admin".to_string(), "user.sign_in".to_string(), "admin".to_string());
    assert_eq!(audited, [vec![failed; 5], vec![signed_in]].concat());
}

/// Behind a proxy (127.0.0.1, trusted by CHIME_TRUSTED_PROXIES) the sign-in limit keys on
/// the client the proxy forwards: one client's failures make it wait, not another's, and the
/// audit log names the client. Before, every client behind the proxy shared its address, so
/// one script locked everyone out.
#[tokio::test]
async fn behind_a_trusted_proxy_each_forwarded_client_has_its_own_limit() {
    let trusted = chime::client_address::TrustedProxies::parse("127.0.0.1").ok();
    let app = spawn_app_with(ServeArgs { engine: false, trusted_proxies: trusted, ..ServeArgs::default() }).await;
    let attempt = |forwarded: &'static str, password: &'static str| {
        let app = &app;
        async move { sign_in_attempt_forwarded(app, "127.0.0.1", Some(forwarded), "admin", password, "/console").await.status }
    };
    let mut statuses = Vec::new();
    for _ in 0..6 {
        // What the client wrote is to the left of what the proxy appended.
        statuses.push(attempt("10.9.9.9, 198.51.100.7", "guess").await);
    }
    assert_eq!(statuses, [401, 401, 401, 401, 401, 429], "the guessing client waits");
    assert_eq!(attempt("203.0.113.9", "guess").await, 401, "another client behind the proxy does not wait");
    assert_eq!(attempt("203.0.113.9", ADMIN_PASSWORD).await, 303, "and signs in");
    let actors: Vec<String> = sqlx::query_scalar("SELECT DISTINCT actor FROM audit_log WHERE action = 'user.sign_in_failed' ORDER BY actor")
        .fetch_all(&app.pool)
        .await
        .unwrap();
    assert_eq!(actors, ["address:198.51.100.7", "address:203.0.113.9"], "the audit log names the clients, not the proxy");
}

/// Without CHIME_TRUSTED_PROXIES, X-Forwarded-For is ignored: a client that writes another
/// address into it for each attempt still waits out its own limit.
#[tokio::test]
async fn without_trusted_proxies_a_forged_forwarded_header_does_not_escape_the_limit() {
    let app = spawn_app().await;
    let mut statuses = Vec::new();
    for n in 0..6 {
        let forged = format!("198.51.100.{n}");
        statuses.push(sign_in_attempt_forwarded(&app, "127.0.0.3", Some(&forged), "admin", "guess", "/console").await.status);
    }
    assert_eq!(statuses, [401, 401, 401, 401, 401, 429], "the forged addresses were believed");
    let forged = sign_in_attempt_forwarded(&app, "127.0.0.3", Some("203.0.113.9"), "admin", ADMIN_PASSWORD, "/console").await;
    assert_eq!(forged.status, 429);
    let actors: Vec<String> =
        sqlx::query_scalar("SELECT DISTINCT actor FROM audit_log WHERE action = 'user.sign_in_failed'").fetch_all(&app.pool).await.unwrap();
    assert_eq!(actors, ["address:127.0.0.3"]);
}

/// A CHIME_TRUSTED_PROXIES entry that is neither an address nor a range stops the start,
/// naming it.
#[tokio::test]
async fn an_invalid_trusted_proxy_stops_the_start() {
    let db_url = fresh_database().await;
    let env = [("DATABASE_URL", db_url.as_str()), ("CHIME_LISTEN", "127.0.0.1:0"), ("CHIME_TRUSTED_PROXIES", "10.0.0.0/8, proxy.internal")];
    let out = tokio::time::timeout(std::time::Duration::from_secs(60), crate::cli::chime(&env, &["serve"], None)).await.expect("chime serve started");
    assert!(!out.ok, "{}", out.stderr);
    assert!(
        out.stderr.contains("`proxy.internal` is not an IP address or a CIDR range (like 10.0.0.0/8 or 192.0.2.7, comma-separated)"),
        "{}",
        out.stderr
    );
}

/// A `chime serve` process's log, after sign-ins whose user names carry a newline, a
/// terminal escape and a NUL byte: the forged "signed in" line is not a line of its own, no
/// raw control character reaches the log, and the sign-in is refused as wrong (not a 500).
#[tokio::test]
async fn user_names_cannot_forge_log_lines() {
    let db_url = fresh_database().await;
    let log_path = std::env::temp_dir().join(format!("chime-forging-log-{}-{}.txt", std::process::id(), uuid::Uuid::new_v4()));
    let env = [("CHIME_ADMIN_PASSWORD", ADMIN_PASSWORD), ("CHIME_ENGINE", "false")];
    let (mut child, address) = chime_process_logging(&db_url, &env, std::fs::File::create(&log_path).unwrap()).await;
    let pool = chime::db::connect(&db_url, 2).await.unwrap();
    let node = TestApp { address, pool, db_url, client: crate::helpers::client() };

    let forged = "x\n2026-11-23T16:00:00.000000Z  INFO chime::console::session: console: signed in user=admin address=10.0.0.1";
    for name in [forged.to_string(), format!("\x1b[2K\r{forged}\0")] {
        let page = sign_in_attempt(&node, &name, "guess").await;
        assert_eq!(page.status, 401, "{}", page.body);
    }
    child.kill().await.unwrap();
    let log = std::fs::read_to_string(&log_path).unwrap();
    std::fs::remove_file(&log_path).unwrap();
    assert_eq!(log.matches("console: sign-in failed").count(), 2, "{log}");
    assert!(!log.lines().any(|line| line.contains("signed in user=admin") && !line.contains("sign-in failed")), "a forged line: {log}");
    assert!(!log.contains(|c: char| c.is_control() && c != '\n'), "a raw control character: {log:?}");
}

/// What PostgreSQL, chrono or a header cannot take, in each console form and filter, gets
/// the API's rules: 422 with the error on the form and the values kept (or 404 for a name
/// nothing can have), never a 500 or a bare 400; nothing changes.
#[tokio::test]
async fn console_forms_and_filters_refuse_what_the_api_refuses_on_the_form() {
    let app = spawn_app().await;
    app.biz_type("orders").await;
    let admin = sign_in(&app, "admin", ADMIN_PASSWORD).await;

    let page = admin.get("/console/tasks?q=order%00-1").await;
    assert_eq!(page.status, 422, "{}", page.body);
    assert!(page.body.contains("key: must not contain control characters") && page.body.contains("value=\"order\0-1\""), "{}", page.body);
    for year in ["-4714", "-200000"] {
        for field in ["from", "to"] {
            let value = format!("{year}-01-01T00:00");
            let error = format!("{field}: must be between the years 0000 and 9999");
            let kept = format!("name=\"{field}\" value=\"{value}\"");
            let page = admin.get(&format!("/console/tasks?status=failed&{field}={value}")).await;
            assert_eq!(page.status, 422, "{field}={value}: {}", page.body);
            assert!(page.body.contains(&error) && page.body.contains(&kept), "{}", page.body);
            let page = admin.post("/console/tasks/replay-failed", &[("biz_type", "orders"), (field, &value)]).await;
            assert_eq!(page.status, 422, "bulk replay {field}={value}: {}", page.body);
            assert!(page.body.contains(&error) && page.body.contains(&kept), "{}", page.body);
        }
    }
    assert_eq!(admin.get("/console/tasks?biz_type=ord%00ers").await.status, 404);
    assert_eq!(admin.get("/console/biz-types/ord%00ers").await.status, 404);

    let long = "d".repeat(20_000);
    for (field, value) in [("name", "ord\0ers"), ("description", "a\0b"), ("callback_url", "http://x.test/\0"), ("description", long.as_str())] {
        let mut form = vec![("name", "billing"), ("mode", "callback"), ("callback_url", "http://x.test/hook"), ("description", "")];
        form.retain(|(f, _)| *f != field);
        form.push((field, value));
        for path in ["/console/biz-types", "/console/biz-types/orders"] {
            if path.ends_with("orders") && field == "name" {
                continue; // an edit keeps the name
            }
            let page = admin.post(path, &form).await;
            assert_eq!(page.status, 422, "{path} {field}: {}", &page.body[..page.body.len().min(2000)]);
            assert!(
                page.body.contains(&format!("data-field=\"{field}\">")) && !page.body.contains(&format!("data-field=\"{field}\"></span>")),
                "no error at {field}"
            );
            assert!(page.body.contains(value), "{field} not kept");
        }
    }
    assert_eq!(chime::biz_types::list(&app.pool).await.unwrap().len(), 1);
    assert!(chime::biz_types::by_name(&app.pool, "orders").await.unwrap().unwrap().description.is_empty());

    // A CR LF in `next` (a header's end) is not followed: back to the console's start.
    let page = sign_in_attempt_from(&app, "127.0.0.1", "admin", ADMIN_PASSWORD, "/console\r\nSet-Cookie: x=1").await;
    assert_eq!((page.status, page.location()), (303, "/console"), "{}", page.body);
    let form = no_redirects().get(format!("{}/console/login?next=%2Fconsole%0D%0ASet-Cookie:%20x=1", app.address)).send().await.unwrap();
    assert_eq!(form.status(), 200);
    assert!(form.text().await.unwrap().contains("name=\"next\" value=\"/console\""));
}

/// The timer forms, the task page's reschedule form and the audit filter get the API's
/// rules for what PostgreSQL, chrono or the schedule cannot take (NUL, CR LF, years beyond
/// 0000-9999, over-long text, invalid UTF-8, payloads that are not JSON, too deep or out of
/// numeric's range): 422 with the error next to the field and the values kept, never a
/// 500 or a bare 400; nothing changes.
#[tokio::test]
async fn timer_reschedule_and_audit_forms_refuse_what_the_api_refuses_on_the_form() {
    let app = spawn_app().await;
    let token = app.biz_type("orders").await;
    let admin = sign_in(&app, "admin", ADMIN_PASSWORD).await;
    let created = app.post("/api/v1/timers", &token, json!({"biz_type": "orders", "key": "nightly", "cron": "0 0 3 * * *"})).await;
    assert_eq!(created.status, 201, "{}", created.body);
    let timer = created.body["id"].as_str().unwrap().to_string();
    let task = app.create_task(&token, json!({"biz_type": "orders", "key": "t-1", "delay_ms": 600000})).await;
    let task_id = task["id"].as_str().unwrap().to_string();
    let audit_entries: i64 = sqlx::query_scalar("SELECT count(*) FROM audit_log").fetch_one(&app.pool).await.unwrap();

    let long = "7".repeat(100_000);
    let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
    let cron_years = ["0 0 0 1 1 ? -4714", "0 0 0 1 1 ? -200000", "0 0 0 1 1 ? 10000", "0 0 0 1 1 ? 275760", "0 0 0 1 1 ? 1970"];
    // (field, value as urlencoded in the body, what the page shows of it)
    let mut bad: Vec<(&str, String, String)> = vec![
        ("key", "a%00b".into(), "a\0b".into()),
        ("key", "a%0D%0Ab".into(), "a\r\nb".into()),
        ("key", "k".repeat(300), "k".repeat(300)),
        ("cron", "0%000 3 * * *".into(), "0\u{0}0 3 * * *".into()),
        ("cron", "99999999999999999999 0 3 * * *".into(), "99999999999999999999 0 3 * * *".into()),
        ("cron", long.clone(), long.clone()),
        ("cron", "0%0D%0A0 3 * * *".into(), "0\r\n0 3 * * *".into()),
        ("timezone", "UTC%00".into(), "UTC\0".into()),
        ("timezone", "UTC%0D%0ASet-Cookie:x".into(), "UTC\r\nSet-Cookie:x".into()),
        ("timezone", "Z".repeat(100_000), "Z".repeat(100_000)),
        ("payload", "%7B%22a%22%3A%22%00%22%7D".into(), "{&#34;a&#34;:&#34;\0&#34;}".into()),
        ("payload", "%7B%22a%22%3A%22%5Cu0000%22%7D".into(), "{&#34;a&#34;:&#34;\\u0000&#34;}".into()),
        ("payload", "1e999".into(), "1e999".into()),
        ("payload", "-1e99999999999999999999".into(), "-1e99999999999999999999".into()),
        ("payload", "not+json".into(), "not json".into()),
        ("payload", deep.clone(), deep.clone()),
        ("payload", format!("%22{}%22", "p".repeat(70_000)), format!("&#34;{}&#34;", "p".repeat(70_000))),
    ];
    for cron in cron_years {
        bad.push(("cron", cron.replace(' ', "+").replace('?', "%3F"), cron.into()));
    }
    for (field, value, shown) in &bad {
        let base = [("biz_type", "orders"), ("key", "daily"), ("cron", "0+0+4+*+*+*"), ("timezone", "UTC"), ("payload", "%7B%7D")];
        for path in ["/console/timers".to_string(), format!("/console/timers/{timer}")] {
            if path != "/console/timers" && *field == "key" {
                continue; // an edit keeps the key
            }
            let body: Vec<String> =
                base.iter().filter(|(f, _)| f != field).map(|(f, v)| format!("{f}={v}")).chain([format!("{field}={value}")]).collect();
            let page = admin.post_encoded(&path, &body.join("&")).await;
            let short = &page.body[..page.body.len().min(3000)];
            assert_eq!(page.status, 422, "{path} {field}={}: {short}", &value[..value.len().min(80)]);
            assert!(
                !page.body.contains(&format!("data-field=\"{field}\"></span>")),
                "{path} {field}={}: no error at {field}: {short}",
                &value[..value.len().min(80)]
            );
            assert!(page.body.contains(shown.as_str()), "{path} {field}={}: not kept", &value[..value.len().min(80)]);
        }
    }
    let timers = chime::timers::list(&app.pool, None, None, 10).await.unwrap();
    assert_eq!(timers.len(), 1, "only the timer made through the API");
    assert_eq!((timers[0].cron.as_str(), timers[0].timezone.as_str(), timers[0].payload.get()), ("0 0 3 * * *", "UTC", "null"));

    let run_at_before = chime::tasks::get(&app.pool, task_id.parse().unwrap()).await.unwrap().unwrap().0.run_at;
    let too_late = (chrono::Utc::now() + chrono::Duration::days(366 * 11)).format("%Y-%m-%dT%H:%M").to_string();
    let too_early = (chrono::Utc::now() - chrono::Duration::days(2)).format("%Y-%m-%dT%H:%M").to_string();
    for (value, shown) in [
        ("-4714-01-01T00:00", "-4714-01-01T00:00"),
        ("-200000-01-01T00:00", "-200000-01-01T00:00"),
        ("10000-01-01T00:00", "10000-01-01T00:00"),
        ("275760-09-13T00:00", "275760-09-13T00:00"),
        ("2030-01-01T09:00%00", "2030-01-01T09:00\0"),
        ("2030-01-01T09:00%0D%0AX", "2030-01-01T09:00\r\nX"),
        (long.as_str(), long.as_str()),
        (too_late.as_str(), too_late.as_str()),
        (too_early.as_str(), too_early.as_str()),
        ("", ""),
    ] {
        let page = admin.post_encoded(&format!("/console/tasks/{task_id}/reschedule"), &format!("run_at={value}")).await;
        let short = &page.body[..page.body.len().min(3000)];
        assert_eq!(page.status, 422, "run_at={}: {short}", &value[..value.len().min(80)]);
        assert!(!page.body.contains("data-field=\"run_at\"></span>"), "run_at={}: no error at run_at: {short}", &value[..value.len().min(80)]);
        assert!(
            page.body.contains(&format!("name=\"run_at\" step=\"1\" required value=\"{shown}\"")),
            "run_at={}: not kept",
            &value[..value.len().min(80)]
        );
    }
    assert_eq!(chime::tasks::get(&app.pool, task_id.parse().unwrap()).await.unwrap().unwrap().0.run_at, run_at_before);

    for (query, field) in [
        ("actor=user%00admin", "actor"),
        ("action=task%0D%0A", "action"),
        ("target=%00", "target"),
        ("before=99999999999999999999", "before"),
        ("before=1e3", "before"),
    ] {
        let page = admin.get(&format!("/console/audit?{query}")).await;
        assert_eq!(page.status, 422, "{query}: {}", page.body);
        assert!(page.body.contains(&format!("data-field=\"{field}\">{field}: ")), "{query}: {}", page.body);
    }
    for (query, field) in [("cursor=%00", "cursor"), ("cursor=x", "cursor"), ("status=pending%00", "status")] {
        let page = admin.get(&format!("/console/tasks?{query}")).await;
        assert_eq!(page.status, 422, "{query}: {}", page.body);
        assert!(page.body.contains(&format!("data-field=\"{field}\">{field}: ")), "{query}: {}", page.body);
    }
    let page = admin.post("/console/biz-types/orders/tokens/not-a-uuid/revoke", &[]).await;
    assert_eq!(page.status, 404, "{}", page.body);
    assert!(page.body.contains("<title>404"), "the console's page, not the framework's: {}", page.body);
    let page =
        admin.post("/console/timers", &[("biz_type", "orders"), ("key", "big"), ("cron", "0 0 4 * * *"), ("payload", &"9".repeat(300 * 1024))]).await;
    assert_eq!(page.status, 400, "{}", &page.body[..page.body.len().min(2000)]);
    assert!(page.body.contains("<title>400") && page.body.contains("262144 bytes"), "{}", page.body);
    // A long search text is only a search that finds nothing.
    let page = admin.get(&format!("/console/audit?actor={}", "a".repeat(40_000))).await;
    assert!(page.status == 200 && page.body.contains("Nothing recorded matches."), "{}: {}", page.status, &page.body[..page.body.len().min(2000)]);

    // Text that is not UTF-8 would be read as U+FFFD, not as sent: refused before any form.
    for (path, body, field) in [
        ("/console/timers".to_string(), "biz_type=orders&key=a%FFb&cron=0+0+4+*+*+*", "key"),
        (format!("/console/timers/{timer}"), "cron=0+0+4+*+*+*&timezone=UTC%C3", "timezone"),
        (format!("/console/tasks/{task_id}/reschedule"), "run_at=2030-01-01T09:00%FF", "run_at"),
    ] {
        let page = admin.post_encoded(&path, body).await;
        assert_eq!(page.status, 400, "{path} {body}: {}", page.body);
        assert!(page.body.contains(&format!("{field}: is not UTF-8 text")), "{path} {body}: {}", page.body);
    }
    for path in ["/console/tasks?q=%FF", "/console/audit?actor=%C3"] {
        let page = admin.get(path).await;
        assert_eq!(page.status, 400, "{path}: {}", page.body);
        assert!(page.body.contains("is not UTF-8 text") && page.headers.contains_key("content-security-policy"), "{path}: {}", page.body);
    }
    assert_eq!(chime::timers::list(&app.pool, None, None, 10).await.unwrap().len(), 1);
    assert_eq!(chime::tasks::get(&app.pool, task_id.parse().unwrap()).await.unwrap().unwrap().0.run_at, run_at_before);
    let now: i64 = sqlx::query_scalar("SELECT count(*) FROM audit_log").fetch_one(&app.pool).await.unwrap();
    assert_eq!(now, audit_entries, "nothing recorded");
}

#[tokio::test]
async fn each_sign_in_makes_a_new_session_and_sign_out_ends_it() {
    let app = spawn_app().await;
    let first = sign_in(&app, "admin", ADMIN_PASSWORD).await;
    let second = sign_in(&app, "admin", ADMIN_PASSWORD).await;
    assert_ne!(first.session, second.session);
    assert_ne!(first.csrf, second.csrf);
    let stored: Vec<Vec<u8>> = sqlx::query_scalar("SELECT token_hash FROM sessions").fetch_all(&app.pool).await.unwrap();
    assert!(stored.iter().all(|h| h.len() == 32), "only hashes are stored");

    let out = second.post("/console/logout", &[]).await;
    assert_eq!((out.status, out.location()), (303, "/console/login"));
    assert_eq!(second.get("/console").await.status, 303, "the session is gone");
    assert_eq!(first.get("/console").await.status, 200, "other sessions live on");
}

#[tokio::test]
async fn a_form_without_its_csrf_token_is_refused_and_changes_nothing() {
    let app = spawn_app().await;
    app.biz_type("orders").await;
    let admin = sign_in(&app, "admin", ADMIN_PASSWORD).await;
    for form in [vec![], vec![("csrf", "not-the-token")]] {
        let page = admin.post_raw("/console/biz-types/orders/pause", &form).await;
        assert_eq!(page.status, 403, "{}", page.body);
        assert!(page.body.contains("security token"), "{}", page.body);
    }
    assert!(!chime::biz_types::by_name(&app.pool, "orders").await.unwrap().unwrap().paused);
    let page = admin.post("/console/biz-types/orders/pause", &[]).await;
    assert_eq!(page.status, 303);
    assert!(chime::biz_types::by_name(&app.pool, "orders").await.unwrap().unwrap().paused);
}

#[tokio::test]
async fn support_can_replay_and_cancel_but_not_change_settings() {
    let app = spawn_app().await;
    let token = app.biz_type("orders").await;
    let support = support_user(&app).await;
    let failed = app.create_task(&token, json!({"biz_type": "orders"})).await;
    let failed_id = failed["id"].as_str().unwrap();
    app.force_status(failed_id, "failed").await;
    let pending = app.create_task(&token, json!({"biz_type": "orders", "delay_ms": 600000})).await;
    let pending_id = pending["id"].as_str().unwrap();

    for (path, form) in [
        ("/console/biz-types/orders", vec![("description", "x"), ("mode", "callback"), ("callback_url", "http://x.test/")]),
        ("/console/biz-types/orders/pause", vec![]),
        ("/console/biz-types/orders/rotate-secret", vec![]),
        ("/console/biz-types/orders/tokens", vec![]),
        ("/console/biz-types", vec![("name", "new-one"), ("mode", "pull")]),
        ("/console/timers", vec![("biz_type", "orders"), ("key", "k"), ("cron", "0 0 * * * *")]),
    ] {
        let page = support.post(path, &form).await;
        assert_eq!(page.status, 403, "{path}: {}", page.body);
    }
    assert_eq!(support.get("/console/biz-types/new").await.status, 403);
    let b = chime::biz_types::by_name(&app.pool, "orders").await.unwrap().unwrap();
    assert!(!b.paused && b.description.is_empty());
    assert_eq!(chime::biz_types::list(&app.pool).await.unwrap().len(), 1);

    let page = support.post(&format!("/console/tasks/{failed_id}/replay"), &[]).await;
    assert_eq!(page.status, 303, "{}", page.body);
    assert_eq!(app.get(&format!("/api/v1/tasks/{failed_id}"), &token).await.body["status"], "pending");
    let page = support.post(&format!("/console/tasks/{pending_id}/cancel"), &[]).await;
    assert_eq!(page.status, 303);
    assert_eq!(app.get(&format!("/api/v1/tasks/{pending_id}"), &token).await.body["status"], "cancelled");
    let audited: Vec<(String, String)> =
        sqlx::query_as("SELECT actor, action FROM audit_log WHERE action LIKE 'task.%' ORDER BY id").fetch_all(&app.pool).await.unwrap();
    assert_eq!(audited, [("user:helen".to_string(), "task.replay".to_string()), ("user:helen".to_string(), "task.cancel".to_string())]);
}

#[tokio::test]
async fn pages_carry_security_headers_and_escape_payloads() {
    let app = spawn_app().await;
    let token = app.biz_type("orders").await;
    let task = app.create_task(&token, json!({"biz_type": "orders", "payload": {"note": "<script>alert(1)</script>"}})).await;
    let admin = sign_in(&app, "admin", ADMIN_PASSWORD).await;
    let page = admin.get(&format!("/console/tasks/{}", task["id"].as_str().unwrap())).await;
    assert_eq!(page.status, 200);
    assert!(!page.body.contains("<script>alert"), "the payload is escaped");
    assert!(page.body.contains("&#60;script&#62;alert(1)&#60;/script&#62;"));
    let csp = page.headers["content-security-policy"].to_str().unwrap();
    assert!(csp.contains("script-src 'self'") && !csp.contains("unsafe-inline"), "{csp}");
    assert!(csp.contains("frame-ancestors 'none'"));
    assert_eq!(page.headers["x-frame-options"], "DENY");
    assert_eq!(page.headers["x-content-type-options"], "nosniff");
    assert_eq!(page.body.matches("<script").count(), 1, "only the console's own script file");
    let css = no_redirects().get(format!("{}{}", app.address, "/static/console.css")).send().await.unwrap();
    assert_eq!(css.status(), 200);
    assert!(css.headers()["cache-control"].to_str().unwrap().contains("immutable"));
}

#[tokio::test]
async fn bulk_replay_says_how_many_then_replays_them() {
    let app = spawn_app().await;
    let token = app.biz_type("orders").await;
    let other = app.biz_type("billing").await;
    for _ in 0..3 {
        let t = app.create_task(&token, json!({"biz_type": "orders"})).await;
        app.force_status(t["id"].as_str().unwrap(), "failed").await;
    }
    let t = app.create_task(&other, json!({"biz_type": "billing"})).await;
    app.force_status(t["id"].as_str().unwrap(), "failed").await;
    let admin = sign_in(&app, "admin", ADMIN_PASSWORD).await;

    // Asking is a page of its own (GET): a reload asks again and changes nothing.
    let failed = || async { sqlx::query_scalar::<_, i64>("SELECT count(*) FROM tasks WHERE status = 'failed'").fetch_one(&app.pool).await.unwrap() };
    for _ in 0..2 {
        let ask = admin.get("/console/tasks/replay-failed?biz_type=orders&from=&to=").await;
        assert_eq!(ask.status, 200);
        assert!(ask.body.contains("Replay <strong>3</strong> failed tasks"), "{}", ask.body);
        assert_eq!(failed().await, 4, "asking changes nothing");
    }
    // The unconfirmed form (posted from a page older than this one) is sent to ask.
    let (ask, _) = admin.post_and_follow("/console/tasks/replay-failed", &[("biz_type", "orders"), ("from", ""), ("to", "")]).await;
    assert_eq!(ask.status, 200);
    assert!(ask.body.contains("Replay <strong>3</strong> failed tasks"), "{}", ask.body);
    assert_eq!(failed().await, 4, "asking changes nothing");
    let done = admin.post("/console/tasks/replay-failed", &[("biz_type", "orders"), ("from", ""), ("to", ""), ("confirm", "yes")]).await;
    assert_eq!(done.status, 303);
    assert_eq!(failed().await, 1, "only the other biz type's failed task is left");
}

/// Post/redirect/get: "Create biz type", "Rotate signing secret" and "New token" answer with
/// a redirect to the biz type's page, which shows the new secret once and removes it; a
/// reload of that page (the GET again, as the browser sends it then) repeats nothing and
/// shows nothing, and the secret shown is the one in use. The secret cannot be opened by
/// another session. Before, each answered the POST with the page itself, so a reload minted
/// a second token, or rotated again and killed the secret just copied.
#[tokio::test]
async fn actions_redirect_and_a_reload_neither_repeats_them_nor_shows_the_secret_again() {
    let app = spawn_app().await;
    let admin = sign_in(&app, "admin", ADMIN_PASSWORD).await;
    let other = sign_in(&app, "admin", ADMIN_PASSWORD).await;
    let page_path = "/console/biz-types/orders";
    let stored_secret =
        || async { chime::biz_types::by_name(&app.pool, "orders").await.unwrap().unwrap().signing_secret.expose().unwrap().to_string() };
    let tokens = || async { sqlx::query_scalar::<_, i64>("SELECT count(*) FROM api_tokens").fetch_one(&app.pool).await.unwrap() };

    let create = [("name", "orders"), ("mode", "callback"), ("callback_url", "http://x.test/hook")];
    // (path, form, the secret's prefix, the flash message)
    type Action<'a> = (&'a str, &'a [(&'a str, &'a str)], &'a str, &'a str);
    let actions: [Action; 3] = [
        ("/console/biz-types", &create, "whsec_", "Biz type created."),
        ("/console/biz-types/orders/rotate-secret", &[], "whsec_", "Signing secret rotated"),
        ("/console/biz-types/orders/tokens", &[], "chime_", "Token created."),
    ];
    let mut shown = Vec::new();
    for (path, form, prefix, message) in actions {
        let (page, cookies) = admin.post_and_follow(path, form).await;
        assert_eq!(page.status, 200, "{path}: {}", page.body);
        let secret = revealed(&page.body);
        assert!(secret.starts_with(prefix), "{path}: {secret}");
        assert!(page.body.contains(message), "{path}: no flash message: {}", page.body);
        assert_eq!(cookie(&page.headers, "chime_reveal").as_deref(), Some(""), "{path}: the page does not remove the secret's cookie");

        let reload = admin.get(page_path).await;
        assert_eq!(reload.status, 200, "{path}: reload: {}", reload.body);
        assert!(!reload.body.contains(&secret) && !reload.body.contains("id=\"revealed\""), "{path}: the reload shows the secret again");
        let elsewhere = other.get_with(page_path, &cookies).await;
        assert!(elsewhere.status == 200 && !elsewhere.body.contains(&secret), "{path}: another session opened the secret");
        shown.push(secret);
    }
    assert_eq!(chime::biz_types::list(&app.pool).await.unwrap().len(), 1);
    assert_eq!(stored_secret().await, shown[1], "the rotated secret shown is the one in use");
    assert_ne!(shown[0], shown[1]);
    assert_eq!(tokens().await, 1, "one token minted");
    let token = &shown[2];
    assert_eq!(app.get("/api/v1/tasks", token).await.status, 200, "the token shown works");
    let audited: Vec<String> =
        sqlx::query_scalar("SELECT action FROM audit_log WHERE action NOT LIKE 'user.%' ORDER BY id").fetch_all(&app.pool).await.unwrap();
    assert_eq!(audited, ["biz_type.create", "biz_type.rotate_secret", "token.create"], "each action once");
}

/// A form with several fields wrong shows every field's problem at once, each next to its
/// field, with every value kept: the biz type form (create and edit, the domain's rules via
/// `biz_types::problems`), the task filter and the bulk replay form. Before, only the first
/// problem was shown, so a person fixed one field per round trip.
#[tokio::test]
async fn a_form_shows_every_fields_problem_at_once() {
    let app = spawn_app().await;
    app.biz_type("orders").await;
    let admin = sign_in(&app, "admin", ADMIN_PASSWORD).await;

    let bad = [
        ("name", "Bad Name"),
        ("description", "a\0b"),
        ("callback_url", "ftp://x.test/hook"),
        ("timeout_ms", "soon"),
        ("max_attempts", "0"),
        ("backoff_initial_ms", "-5"),
        ("rate_limit", "fast"),
        ("max_in_flight", "100001"),
        ("create_rate_limit", "-1"),
    ];
    for path in ["/console/biz-types", "/console/biz-types/orders"] {
        let mut form = bad.to_vec();
        form.push(("mode", "callback"));
        let page = admin.post(path, &form).await;
        assert_eq!(page.status, 422, "{path}: {}", page.body);
        for (field, value) in bad {
            if field == "name" && path.ends_with("orders") {
                continue; // an edit keeps the name
            }
            assert!(
                page.body.contains(&format!("data-field=\"{field}\">")) && !page.body.contains(&format!("data-field=\"{field}\"></span>")),
                "{path}: no error at {field}"
            );
            assert!(page.body.contains(&format!("value=\"{value}\"")), "{path}: {field} not kept");
        }
    }
    assert_eq!(chime::biz_types::list(&app.pool).await.unwrap().len(), 1);
    let orders = chime::biz_types::by_name(&app.pool, "orders").await.unwrap().unwrap();
    assert!(orders.description.is_empty() && orders.max_attempts != 0, "nothing changed");

    let page = admin.get("/console/tasks?status=bogus&from=-4714-01-01T00:00&to=-200000-01-01T00:00").await;
    assert_eq!(page.status, 422, "{}", page.body);
    for field in ["status", "from", "to"] {
        assert!(page.body.contains(&format!("data-field=\"{field}\">{field}: ")), "no error at {field}: {}", page.body);
    }
    assert!(page.body.contains("value=\"-4714-01-01T00:00\"") && page.body.contains("value=\"-200000-01-01T00:00\""), "the times typed are not kept");
    let page = admin.post("/console/tasks/replay-failed", &[("biz_type", "orders"), ("from", "-4714-01-01T00:00"), ("to", "soon")]).await;
    assert_eq!(page.status, 422, "{}", page.body);
    for field in ["from", "to"] {
        assert!(page.body.contains(&format!("data-field=\"{field}\">{field}: ")), "bulk replay: no error at {field}: {}", page.body);
    }
    // The timer form: the biz type, the payload's JSON and the schedule, side by side.
    let token = chime::biz_types::create_token(&app.pool, "orders").await.unwrap();
    let created = app.post("/api/v1/timers", &token, json!({"biz_type": "orders", "key": "nightly", "cron": "0 0 3 * * *"})).await;
    let timer = created.body["id"].as_str().unwrap().to_string();
    let page = admin
        .post("/console/timers", &[("biz_type", ""), ("key", "daily"), ("cron", "every day"), ("timezone", "UTC"), ("payload", "not json")])
        .await;
    assert_eq!(page.status, 422, "{}", page.body);
    for field in ["biz_type", "cron", "payload"] {
        assert!(!page.body.contains(&format!("data-field=\"{field}\"></span>")), "new timer: no error at {field}");
    }
    assert!(page.body.contains("every day") && page.body.contains("not json"), "new timer: values not kept");
    let page = admin.post(&format!("/console/timers/{timer}"), &[("cron", "every day"), ("timezone", "UTC"), ("payload", "not json")]).await;
    assert_eq!(page.status, 422, "{}", page.body);
    for field in ["cron", "payload"] {
        assert!(!page.body.contains(&format!("data-field=\"{field}\"></span>")), "timer edit: no error at {field}");
    }
    assert_eq!(chime::timers::list(&app.pool, None, None, 10).await.unwrap().len(), 1, "no timer made");

    let page = admin.get("/console/tasks/replay-failed?biz_type=orders&from=-4714-01-01T00:00&to=soon").await;
    assert_eq!(page.status, 422, "{}", page.body);
    for field in ["from", "to"] {
        assert!(page.body.contains(&format!("data-field=\"{field}\">{field}: ")), "asking to replay: no error at {field}: {}", page.body);
    }
}

/// The sign-in form's token is signed by the cluster: a cookie and form field the client
/// made up together (equal, as double-submit asked) are refused with the right password,
/// as is a token of the right shape with a made-up signature, while the pair a login
/// page handed out, from either node, signs in. Before, any equal pair passed.
#[tokio::test]
async fn a_sign_in_token_the_client_made_up_is_refused() {
    let app = spawn_app().await;
    let other = crate::helpers::spawn_second_node(&app).await;
    let client = no_redirects();
    let post = |cookie: String, csrf: String| {
        let client = client.clone();
        let address = app.address.clone();
        async move {
            let reply = client
                .post(format!("{address}/console/login"))
                .header(COOKIE, format!("chime_login={cookie}"))
                .form(&[("username", "admin"), ("password", ADMIN_PASSWORD), ("csrf", &csrf), ("next", "/console")])
                .send()
                .await
                .unwrap();
            reply.status().as_u16()
        }
    };
    let page = client.get(format!("{}/console/login", other.address)).send().await.unwrap();
    let genuine = cookie(page.headers(), "chime_login").unwrap();
    assert_eq!(csrf_in(&page.text().await.unwrap()), genuine, "the form carries the cookie's token");
    let (random, _) = genuine.split_once('.').unwrap_or((genuine.as_str(), ""));
    let shaped = format!("{random}.{}", "A".repeat(43));
    let made_up = post("chosen-by-the-client".into(), "chosen-by-the-client".into()).await;
    let unsigned = post(random.into(), random.into()).await;
    let bad_signature = post(shaped.clone(), shaped).await;
    let handed_out = post(genuine.clone(), genuine).await;
    println!("made-up pair: {made_up}; unsigned: {unsigned}; bad signature: {bad_signature}; handed out by another node: {handed_out}");
    assert_eq!([made_up, unsigned, bad_signature], [403, 403, 403]);
    assert_eq!(handed_out, 303, "the pair another node handed out signs in here");
}

/// Issue 12: the cluster page names each node by its host name and pid, with its version,
/// the leader too (the id beside it, small); the dashboard names the leader the same way;
/// both refresh themselves (the switch is there for the script).
#[tokio::test]
async fn the_cluster_page_names_its_nodes() {
    let app = spawn_app().await;
    let admin = sign_in(&app, "admin", ADMIN_PASSWORD).await;
    let host = nix::unistd::gethostname().unwrap().to_string_lossy().into_owned();
    let name = format!("{host} (pid {})", std::process::id());
    let node: uuid::Uuid = crate::helpers::wait_until("the node's row", std::time::Duration::from_secs(10), || async {
        sqlx::query_scalar("SELECT id FROM nodes").fetch_optional(&app.pool).await.unwrap()
    })
    .await;
    // The leader is whichever node takes the lock first: this one, the only one.
    let page = crate::helpers::wait_until("a leader named on the cluster page", std::time::Duration::from_secs(20), || async {
        let page = admin.get("/console/cluster").await;
        if page.body.contains("<p id=\"leader\">Leader: <strong>") { Ok(page) } else { Err(page.body) }
    })
    .await;
    assert!(
        page.body.contains(&format!("<p id=\"leader\">Leader: <strong>{name}</strong> <span class=\"muted small\">(<code>{node}</code>)</span></p>")),
        "{}",
        page.body
    );
    assert!(page.body.contains(&format!("<strong class=\"node-name\">{name}</strong> <span class=\"badge leader\">leader</span>")), "{}", page.body);
    assert!(page.body.contains(&format!("<code class=\"muted small node-id\">{node}</code>")), "the id, small, beside the name");
    assert!(page.body.contains(&format!("<td class=\"node-version\">{}</td>", env!("CARGO_PKG_VERSION"))), "{}", page.body);
    assert!(page.body.contains("<input type=\"checkbox\" id=\"auto-refresh\" data-refresh-seconds=\"5\" data-refresh-key=\"cluster\">"));
    assert!(page.body.contains("<div id=\"live\">"));

    let dashboard = admin.get("/console").await;
    assert!(dashboard.body.contains(&format!("leader <a href=\"/console/cluster\" id=\"leader\">{name}</a>")), "{}", dashboard.body);
}

/// Issue 8: a timer whose occurrences fail is not green, on its page and in the list, and
/// says how many failed in a row; every time is in UTC with the timer's zone beside it; the
/// cron is read out in words; a crontab's 5 fields are refused with their 6-field form
/// offered, one press away.
#[tokio::test]
async fn timers_say_when_they_fail_and_read_their_cron() {
    let app = spawn_app().await;
    let token = app.biz_type("reports").await;
    let created = app
        .post("/api/v1/timers", &token, json!({"biz_type": "reports", "key": "nightly", "cron": "0 30 9 * * Mon-Fri", "timezone": "Europe/Berlin"}))
        .await;
    let timer = created.body["id"].as_str().unwrap().to_string();
    let admin = sign_in(&app, "admin", ADMIN_PASSWORD).await;

    let page = admin.get(&format!("/console/timers/{timer}")).await;
    assert!(page.body.contains("<span class=\"badge succeeded\" id=\"timer-state\">active</span>"), "{}", page.body);
    assert!(page.body.contains("<small id=\"cron-reading\">Reads: at 09:30, on Monday to Friday (Europe/Berlin time)</small>"), "{}", page.body);
    // The next fire times in UTC, as every time in the console, the zone's beside them.
    let next = page.body.split("<ol id=\"next-fire-times\"><li>").nth(1).unwrap().split("</li>").next().unwrap();
    assert!(next.contains(" UTC (in ") && next.contains("<span class=\"muted\">· ") && next.contains(" Europe/Berlin</span>"), "{next}");
    assert!(next.contains(":30:00 CET Europe/Berlin") || next.contains(":30:00 CEST Europe/Berlin"), "{next}");
    let list = admin.get("/console/timers").await;
    assert!(list.body.contains("at 09:30, on Monday to Friday (Europe/Berlin time)"), "{}", list.body);

    // Its occurrences fail, one after another (made so here, as failing callbacks leave them).
    for i in 0..3 {
        let task = app.create_task(&token, json!({"biz_type": "reports", "key": format!("nightly@{i}"), "run_at": (chrono::Utc::now() - chrono::Duration::hours(3 - i)).to_rfc3339()})).await;
        let id = task["id"].as_str().unwrap();
        sqlx::query("UPDATE tasks SET timer_id = $2::uuid WHERE id = $1::uuid").bind(id).bind(&timer).execute(&app.pool).await.unwrap();
        app.force_status(id, "failed").await;
    }
    let page = admin.get(&format!("/console/timers/{timer}")).await;
    assert!(page.body.contains("<span class=\"badge failed\" id=\"timer-state\">failing</span>"), "not green: {}", page.body);
    assert!(page.body.contains("Every occurrence of the last 30 days that finished failed (3)."), "{}", page.body);
    let list = admin.get("/console/timers").await;
    assert!(list.body.contains("<span class=\"badge failed\">failing</span> <span class=\"small bad\">3 failed</span>"), "{}", list.body);
    assert!(!list.body.contains("badge succeeded"), "{}", list.body);

    // A crontab line: refused, its 6-field form offered; pressing the offer saves that.
    let page = admin.post(&format!("/console/timers/{timer}"), &[("cron", "30 9 * * 1-5"), ("timezone", "Europe/Berlin"), ("active", "on")]).await;
    assert_eq!(page.status, 422, "{}", page.body);
    assert!(
        page.body.contains("this one has 5. As a crontab line (minute first), `30 9 * * 1-5` is `0 30 9 * * MON-FRI` here, at second 0"),
        "{}",
        page.body
    );
    assert!(
        page.body
            .contains("<button type=\"submit\" name=\"use_cron\" value=\"0 30 9 * * MON-FRI\">Use <code>0 30 9 * * MON-FRI</code> instead</button>"),
        "{}",
        page.body
    );
    let saved = admin
        .post(
            &format!("/console/timers/{timer}"),
            &[("cron", "30 9 * * 1-5"), ("use_cron", "0 30 9 * * MON-FRI"), ("timezone", "Europe/Berlin"), ("active", "on")],
        )
        .await;
    assert_eq!(saved.status, 303, "{}", saved.body);
    let timers = chime::timers::list(&app.pool, None, None, 10).await.unwrap();
    assert_eq!(timers[0].cron, "0 30 9 * * MON-FRI");
}
