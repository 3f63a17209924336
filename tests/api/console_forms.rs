//! Every console form against hostile input (issue 16). The forms are not listed here: the
//! test reads them off the pages an admin sees (and the sign-in page), checks that every
//! POST route in `src/console/mod.rs` has a form among them, and then sends each form once
//! per field and hostile value (NUL, far years, CRLF, over-long), the other fields as the
//! page filled them in. Nothing may answer 5xx; a value a person types that is refused
//! comes back on its form, with an error shown and the value kept.

use reqwest::header::{COOKIE, LOCATION};
use serde_json::json;

use crate::console::{ADMIN_PASSWORD, Console, Page, cookie, no_redirects, sign_in};
use crate::helpers::{TestApp, spawn_app};

const HOSTILE: [&str; 5] = ["a\0b", "-4714-01-01T00:00", "-200000-01-01T00:00", "line\r\nSet-Cookie: x=y", ""];
/// Over every field's limit; a query string (GET forms) is kept shorter, as browsers and
/// servers keep URLs.
const OVER_LONG: usize = 100_000;
const OVER_LONG_IN_URL: usize = 4_000;

#[derive(Debug, Clone)]
struct Form {
    page: String,
    method: String,
    action: String,
    id: String,
    fields: Vec<Field>,
}

#[derive(Debug, Clone)]
struct Field {
    name: String,
    /// The input's type, or "select" / "textarea".
    kind: String,
    value: String,
}

impl Field {
    /// A field a person types into (not hidden, not a choice among options).
    fn typed(&self) -> bool {
        !matches!(self.kind.as_str(), "hidden" | "select" | "checkbox" | "radio" | "submit")
    }
}

fn unescape(s: &str) -> String {
    s.replace("&lt;", "<").replace("&gt;", ">").replace("&#34;", "\"").replace("&quot;", "\"").replace("&#39;", "'").replace("&amp;", "&")
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&#34;").replace('\'', "&#39;")
}

/// The value of attribute `name` in a start tag's text, unescaped.
fn attr(tag: &str, name: &str) -> Option<String> {
    let key = format!(" {name}=\"");
    let start = tag.find(&key)? + key.len();
    Some(unescape(&tag[start..start + tag[start..].find('"')?]))
}

fn has_attr(tag: &str, name: &str) -> bool {
    tag.split(|c: char| c.is_whitespace() || c == '>').any(|word| word == name || word.starts_with(&format!("{name}=")))
}

/// The forms on a page (our own templates: well-formed, attributes double-quoted), with
/// what a browser would send: every named field, checkboxes ticked, a select's chosen (or
/// first) option, the first named button.
fn forms_in(page: &str, body: &str) -> Vec<Form> {
    let mut forms = vec![];
    for chunk in body.split("<form").skip(1) {
        let tag = &chunk[..chunk.find('>').unwrap()];
        let inner = &chunk[tag.len()..chunk.find("</form>").unwrap()];
        let mut fields: Vec<Field> = vec![];
        let mut button = None;
        for piece in inner.split('<').skip(1) {
            let element = piece.split([' ', '>']).next().unwrap();
            let tag = &piece[..piece.find('>').unwrap_or(piece.len())];
            let Some(name) = attr(tag, "name") else { continue };
            match element {
                "input" => {
                    let kind = attr(tag, "type").unwrap_or_else(|| "text".into());
                    if kind == "submit" {
                        button.get_or_insert(Field { name, kind, value: attr(tag, "value").unwrap_or_default() });
                    } else if !fields.iter().any(|f| f.name == name && kind == "checkbox") {
                        fields.push(Field { name, kind, value: attr(tag, "value").unwrap_or_default() });
                    }
                }
                "textarea" => {
                    let text = &piece[tag.len() + 1..];
                    fields.push(Field { name, kind: "textarea".into(), value: unescape(text) });
                }
                "select" => {
                    let options = &inner[inner.find(tag).unwrap()..];
                    let options = &options[..options.find("</select>").unwrap()];
                    let opts: Vec<&str> = options.split("<option").skip(1).map(|o| &o[..o.find('>').unwrap()]).collect();
                    let chosen = opts.iter().find(|o| has_attr(o, "selected")).or(opts.first()).and_then(|o| attr(o, "value")).unwrap_or_default();
                    fields.push(Field { name, kind: "select".into(), value: chosen });
                }
                "button" => {
                    button.get_or_insert(Field { name, kind: "submit".into(), value: attr(tag, "value").unwrap_or_default() });
                }
                _ => {}
            }
        }
        fields.extend(button);
        forms.push(Form {
            page: page.to_string(),
            method: attr(tag, "method").unwrap_or_else(|| "get".into()),
            action: attr(tag, "action").unwrap_or_else(|| page.to_string()),
            id: attr(tag, "id").or_else(|| attr(tag, "class")).unwrap_or_default(),
            fields,
        });
    }
    forms
}

/// The console's POST routes, read from its route table.
fn post_routes() -> Vec<String> {
    let source = include_str!("../../src/console/mod.rs");
    let routes: Vec<String> = source
        .lines()
        .filter(|l| l.contains("web::post()"))
        .map(|l| format!("/console{}", l.split('"').nth(1).unwrap()))
        .map(|r| r.trim_end_matches('/').to_string())
        .collect();
    assert!(routes.len() > 20, "the route table was not read: {routes:?}");
    routes
}

fn matches(route: &str, path: &str) -> bool {
    let path = path.split('?').next().unwrap();
    let (r, p): (Vec<&str>, Vec<&str>) = (route.split('/').collect(), path.split('/').collect());
    r.len() == p.len() && r.iter().zip(&p).all(|(r, p)| r == p || (r.starts_with('{') && !p.is_empty()))
}

/// Sends `form` with `fields`; a GET form as its query string.
async fn send(console: &Console, form: &Form, fields: &[(String, String)]) -> Page {
    let pairs: Vec<(&str, &str)> = fields.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
    if form.method == "get" {
        let query: String = url::form_urlencoded::Serializer::new(String::new()).extend_pairs(&pairs).finish();
        console.get(&format!("{}?{query}", form.action)).await
    } else {
        console.post_raw(&form.action, &pairs).await
    }
}

/// The sign-in form, from a browser without a session: its cookie and its fields.
async fn sign_in_form(app: &TestApp) -> (String, Form) {
    let page = no_redirects().get(format!("{}/console/login", app.address)).send().await.unwrap();
    let login_cookie = cookie(page.headers(), "chime_login").unwrap();
    let body = page.text().await.unwrap();
    let form = forms_in("/console/login", &body).into_iter().find(|f| f.id == "login").expect("a sign-in form");
    (login_cookie, form)
}

/// A field a person typed, refused: the page is the form again (its id or action on it),
/// with an error shown and the value kept (passwords are never shown back).
fn assert_refused_on_its_form(form: &Form, field: &Field, value: &str, page: &Page, what: &str) {
    assert!(
        page.body.contains(&format!("id=\"{}\"", form.id)) || page.body.contains(&format!("action=\"{}\"", escape(&form.action))),
        "{what}: answered {} without its form: {}",
        page.status,
        &page.body[..page.body.len().min(3000)]
    );
    let shows_error = page.body.contains("class=\"flash error\"")
        || page.body.split("class=\"field-error\"").skip(1).any(|rest| !rest[rest.find('>').unwrap() + 1..].starts_with("</span>"));
    assert!(shows_error, "{what}: answered {} with no error shown", page.status);
    if field.kind != "password" && !value.is_empty() {
        assert!(page.body.contains(&escape(value)), "{what}: the value typed is not kept");
    }
}

#[tokio::test]
async fn every_console_form_survives_hostile_input_with_the_error_on_the_form() {
    let app = spawn_app().await;
    let token = app.biz_type("orders").await;
    let admin = sign_in(&app, "admin", ADMIN_PASSWORD).await;
    chime::users::create(&app.pool, "helen", "support", "support-password").await.unwrap();
    // A disabled user (their Enable form) and a paused biz type (its Resume form).
    chime::users::create(&app.pool, "ivan", "support", "support-password").await.unwrap();
    let disable = chime::users::UserChanges { disabled: Some(true), ..Default::default() };
    chime::users::update(&app.pool, "ivan", &disable).await.unwrap();
    let paused = chime::biz_types::Settings { mode: Some("pull".into()), paused: Some(true), ..Default::default() };
    chime::biz_types::create(&app.pool, "paused", &paused, chime::callback_hosts::CallbackHosts::Any).await.unwrap();

    // A task in each state a form is offered for, a pull task held by a consumer, a timer.
    let pending =
        app.create_task(&token, json!({"biz_type": "orders", "key": "order-1", "delay_ms": 3_600_000})).await["id"].as_str().unwrap().to_string();
    let failed = app.create_task(&token, json!({"biz_type": "orders", "key": "order-2"})).await["id"].as_str().unwrap().to_string();
    app.force_status(&failed, "failed").await;
    let succeeded = app.create_task(&token, json!({"biz_type": "orders", "key": "order-3"})).await["id"].as_str().unwrap().to_string();
    app.force_status(&succeeded, "succeeded").await;
    let settings = chime::biz_types::Settings { mode: Some("pull".into()), ..Default::default() };
    chime::biz_types::create(&app.pool, "jobs", &settings, chime::callback_hosts::CallbackHosts::Any).await.unwrap();
    let jobs = chime::biz_types::create_token(&app.pool, "jobs").await.unwrap();
    let held = app.create_task(&jobs, json!({"biz_type": "jobs"})).await["id"].as_str().unwrap().to_string();
    let reserved = app.post("/api/v1/biz-types/jobs/reserve", &jobs, json!({"max": 1, "ttr_ms": 600_000})).await;
    assert_eq!(reserved.body["tasks"].as_array().map(Vec::len), Some(1), "{}", reserved.body);
    let timer = app.post("/api/v1/timers", &token, json!({"biz_type": "orders", "key": "nightly", "cron": "0 0 3 * * *"})).await;
    assert_eq!(timer.status, 201, "{}", timer.body);
    let timer = timer.body["id"].as_str().unwrap().to_string();
    let inactive = app.post("/api/v1/timers", &token, json!({"biz_type": "orders", "key": "weekly", "cron": "0 0 3 * * MON", "active": false})).await;
    assert_eq!(inactive.status, 201, "{}", inactive.body);
    let inactive = inactive.body["id"].as_str().unwrap().to_string();

    let pages = [
        "/console".to_string(),
        "/console/biz-types".into(),
        "/console/biz-types/new".into(),
        "/console/biz-types/orders".into(),
        "/console/biz-types/paused".into(),
        "/console/tasks".into(),
        format!("/console/tasks/{pending}"),
        format!("/console/tasks/{failed}"),
        format!("/console/tasks/{succeeded}/replay"),
        format!("/console/tasks/{held}"),
        "/console/tasks/replay-failed?biz_type=orders".into(),
        "/console/tasks/cancel-pending?biz_type=orders".into(),
        "/console/timers".into(),
        "/console/timers/new".into(),
        format!("/console/timers/{timer}"),
        format!("/console/timers/{inactive}"),
        "/console/users".into(),
        "/console/account".into(),
        "/console/audit".into(),
    ];
    let mut forms: Vec<Form> = vec![];
    for path in &pages {
        let page = admin.get(path).await;
        assert_eq!(page.status, 200, "{path}: {}", page.body);
        for form in forms_in(path, &page.body) {
            if !forms.iter().any(|f| f.method == form.method && f.action == form.action && f.id == form.id) {
                forms.push(form);
            }
        }
    }
    let (_, login) = sign_in_form(&app).await;
    forms.push(login);

    let posted: Vec<&Form> = forms.iter().filter(|f| f.method == "post").collect();
    for route in post_routes() {
        assert!(posted.iter().any(|f| matches(&route, &f.action)), "no form on the pages read posts to {route}: add the page that has it");
    }

    // Sign-out and forms whose only field is the CSRF token have nothing to be hostile in.
    let fuzzed: Vec<&Form> = forms.iter().filter(|f| f.action != "/console/logout" && f.fields.iter().any(|x| x.name != "csrf")).collect();
    let mut sent = 0;
    for form in &fuzzed {
        for field in form.fields.iter().filter(|x| x.name != "csrf") {
            let over_long = "x".repeat(if form.method == "get" { OVER_LONG_IN_URL } else { OVER_LONG });
            for value in HOSTILE.iter().map(|v| if v.is_empty() { over_long.as_str() } else { v }) {
                let fields: Vec<(String, String)> =
                    form.fields.iter().map(|x| (x.name.clone(), if x.name == field.name { value.to_string() } else { x.value.clone() })).collect();
                let shown = format!("{:?}", &value[..value.len().min(40)]);
                let what = format!("{} {} ({}, on {}) with {}={shown}", form.method, form.action, form.id, form.page, field.name);
                let page = if form.id == "login" {
                    // Signed out, with a fresh sign-in form each time, as a browser would be.
                    let (login_cookie, form) = sign_in_form(&app).await;
                    let mut fields = fields.clone();
                    for (name, v) in fields.iter_mut() {
                        match name.as_str() {
                            "username" if field.name != "username" => *v = "admin".into(),
                            "password" if field.name != "password" => *v = ADMIN_PASSWORD.into(),
                            "csrf" => *v = form.fields.iter().find(|f| f.name == "csrf").unwrap().value.clone(),
                            _ => {}
                        }
                    }
                    let resp = no_redirects()
                        .post(format!("{}/console/login", app.address))
                        .header(COOKIE, format!("chime_login={login_cookie}"))
                        .form(&fields)
                        .send()
                        .await
                        .unwrap();
                    Page { status: resp.status().as_u16(), headers: resp.headers().clone(), body: resp.text().await.unwrap() }
                } else {
                    send(&admin, form, &fields).await
                };
                sent += 1;
                assert!(page.status < 500, "{what}: {} {}", page.status, &page.body[..page.body.len().min(3000)]);
                if let Some(location) = page.headers.get(LOCATION) {
                    let location = location.to_str().unwrap();
                    assert!(location.starts_with('/') && !location.starts_with("//"), "{what}: sent to {location}");
                } else if page.status != 200 && field.typed() && page.status != 429 && page.status != 401 {
                    assert_refused_on_its_form(form, field, value, &page, &what);
                } else if form.id == "login" && page.status == 401 {
                    assert!(page.body.contains("id=\"login\""), "{what}: the sign-in form is not shown again");
                }
            }
        }
    }
    eprintln!("{} forms read, {} sent hostile values {sent} times", forms.len(), fuzzed.len());
    assert!(
        fuzzed.len() >= 18 && sent > 300,
        "only {} forms ({sent} posts) were tried: {:#?}",
        fuzzed.len(),
        fuzzed.iter().map(|f| &f.action).collect::<Vec<_>>()
    );
    // The admin is still signed in and an admin: nothing hostile changed who they are.
    assert_eq!(admin.get("/console/users").await.status, 200);
}
