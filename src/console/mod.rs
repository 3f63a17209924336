//! The web console (docs/design/contract.md, Console): server-rendered pages for administrators (everything) and
//! support staff (browse, replay, cancel).
//!
//! Pages are askama templates under `templates/`; the stylesheet and a few lines of
//! JavaScript under `static/` are embedded in the binary. Every page works without
//! JavaScript: actions are plain forms posting back, answered with a redirect (and a flash
//! message in a short-lived cookie), so that reloading the page they lead to repeats
//! nothing; a secret an action made is shown once by that page (`reveal`). Each form carries the session's CSRF token; pages are
//! served with a strict Content-Security-Policy (no inline script or style).

mod assets;
mod audit_log;
mod biz_types;
mod charts;
mod cluster;
mod dashboard;
mod history;
mod login_limits;
mod oidc;
mod reveal;
mod selected;
mod session;
mod tasks;
mod timers;
mod users;
mod when;

pub use login_limits::LoginLimiter;
pub use oidc::SignInMethods;
pub use session::{COOKIE as SESSION_COOKIE, LoginKey, Session};

use actix_web::body::{EitherBody, MessageBody};
use actix_web::cookie::{Cookie, SameSite};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::StatusCode;
use actix_web::http::header;
use actix_web::middleware::Next;
use actix_web::{HttpMessage, HttpRequest, HttpResponse, ResponseError, middleware, web};
use askama::Template;
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use chrono::{DateTime, Utc};

use crate::error::Error;
use crate::tasks::check_time;

const FLASH_COOKIE: &str = "chime_flash";
/// Above every field's own limit (a description's is 1000 bytes, a payload's 64 KiB by
/// default), so that an over-long value is refused on its form, with the others kept.
const FORM_LIMIT: usize = 256 * 1024;

pub fn routes(cfg: &mut web::ServiceConfig) {
    // Browsers ask for it whatever the page links to.
    cfg.route("/favicon.ico", web::get().to(|| async { see_other(&assets::url("favicon.svg")) }));
    cfg.route("/", web::get().to(|| async { see_other("/console") })).route("/static/{file:.*}", web::get().to(assets::serve)).service(
        web::scope("/console")
            .wrap(middleware::from_fn(utf8_only))
            .wrap(security_headers())
            .app_data(web::FormConfig::default().limit(FORM_LIMIT).error_handler(|e, _| ConsoleError::BadRequest(e.to_string()).into()))
            .app_data(web::PayloadConfig::new(FORM_LIMIT))
            .app_data(web::QueryConfig::default().error_handler(|e, _| ConsoleError::BadRequest(e.to_string()).into()))
            .app_data(web::PathConfig::default().error_handler(|e, _| ConsoleError::NotFound(e.to_string()).into()))
            .route("", web::get().to(dashboard::show))
            .route("/login", web::get().to(session::login_form))
            .route("/login", web::post().to(session::login))
            .route("/logout", web::post().to(session::logout))
            .route("/oidc/start", web::get().to(oidc::start))
            .route("/oidc/callback", web::get().to(oidc::callback))
            .route("/biz-types", web::get().to(biz_types::list))
            .route("/biz-types", web::post().to(biz_types::create))
            .route("/biz-types/new", web::get().to(biz_types::new))
            .route("/biz-types/{name}", web::get().to(biz_types::show))
            .route("/biz-types/{name}", web::post().to(biz_types::update))
            .route("/biz-types/{name}/pause", web::post().to(biz_types::pause))
            .route("/biz-types/{name}/resume", web::post().to(biz_types::resume))
            .route("/biz-types/{name}/rotate-secret", web::post().to(biz_types::rotate_secret))
            .route("/biz-types/{name}/archive", web::post().to(biz_types::archive))
            .route("/biz-types/{name}/test-callback", web::post().to(biz_types::test_callback))
            .route("/biz-types/{name}/tokens", web::post().to(biz_types::create_token))
            .route("/biz-types/{name}/tokens/{id}/revoke", web::post().to(biz_types::revoke_token))
            .route("/tasks", web::get().to(tasks::list))
            .route("/tasks/replay-failed", web::get().to(tasks::ask_replay_failed))
            .route("/tasks/replay-failed", web::post().to(tasks::replay_failed))
            .route("/tasks/cancel-pending", web::get().to(tasks::ask_cancel_pending))
            .route("/tasks/cancel-pending", web::post().to(tasks::cancel_pending))
            .route("/tasks/selected", web::post().to(selected::apply))
            .route("/tasks/{id}", web::get().to(tasks::show))
            .route("/tasks/{id}/cancel", web::post().to(tasks::cancel))
            .route("/tasks/{id}/replay", web::get().to(tasks::ask_replay))
            .route("/tasks/{id}/replay", web::post().to(tasks::replay))
            .route("/tasks/{id}/release", web::post().to(tasks::release))
            .route("/tasks/{id}/reschedule", web::post().to(tasks::reschedule))
            .route("/timers", web::get().to(timers::list))
            .route("/timers", web::post().to(timers::create))
            .route("/timers/new", web::get().to(timers::new))
            .route("/timers/{id}", web::get().to(timers::show))
            .route("/timers/{id}", web::post().to(timers::update))
            .route("/timers/{id}/activate", web::post().to(timers::activate))
            .route("/timers/{id}/deactivate", web::post().to(timers::deactivate))
            .route("/timers/{id}/delete", web::post().to(timers::delete))
            .route("/cluster", web::get().to(cluster::show))
            .route("/audit", web::get().to(audit_log::list))
            .route("/audit/{id}", web::get().to(audit_log::show))
            .route("/users", web::get().to(users::list))
            .route("/users", web::post().to(users::create))
            .route("/users/{name}/role", web::post().to(users::set_role))
            .route("/users/{name}/disable", web::post().to(users::disable))
            .route("/users/{name}/enable", web::post().to(users::enable))
            .route("/users/{name}/reset-password", web::post().to(users::reset_password))
            .route("/account", web::get().to(users::account))
            .route("/account/password", web::post().to(users::change_password))
            .default_service(web::to(|| async { Err::<HttpResponse, _>(ConsoleError::NotFound("no such page".into())) })),
    );
}

/// Headers on every console response: no framing, no sniffing, no inline script or style.
fn security_headers() -> middleware::DefaultHeaders {
    middleware::DefaultHeaders::new()
        .add((
            header::CONTENT_SECURITY_POLICY,
            "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; \
             form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ))
        .add((header::X_FRAME_OPTIONS, "DENY"))
        .add((header::X_CONTENT_TYPE_OPTIONS, "nosniff"))
        .add((header::REFERRER_POLICY, "same-origin"))
        .add((header::CACHE_CONTROL, "no-store"))
}

/// Refuses a query string or form whose percent-encoded text is not UTF-8: the extractors
/// would decode it to U+FFFD, so the value used would not be the one sent.
async fn utf8_only(mut req: ServiceRequest, next: Next<impl MessageBody>) -> Result<ServiceResponse<EitherBody<impl MessageBody>>, actix_web::Error> {
    let mut refused = not_utf8(req.query_string().as_bytes());
    if refused.is_none() && req.content_type().eq_ignore_ascii_case("application/x-www-form-urlencoded") {
        match req.extract::<web::Bytes>().await {
            Ok(body) => {
                refused = not_utf8(&body);
                req.set_payload(body.into());
            }
            Err(e) => refused = Some(format!("the form could not be read (at most {FORM_LIMIT} bytes): {e}")),
        }
    }
    match refused {
        Some(message) => Ok(req.error_response(ConsoleError::BadRequest(message)).map_into_right_body()),
        None => next.call(req).await.map(ServiceResponse::map_into_left_body),
    }
}

/// Why the first field of a query string or form whose text is not UTF-8 is refused.
fn not_utf8(encoded: &[u8]) -> Option<String> {
    encoded.split(|b| *b == b'&').find_map(|pair| {
        let mut parts = pair.splitn(2, |b| *b == b'=');
        let name = percent_encoding::percent_decode(parts.next().unwrap_or_default()).decode_utf8();
        let value = percent_encoding::percent_decode(parts.next().unwrap_or_default()).decode_utf8();
        match (name, value) {
            (Ok(_), Ok(_)) => None,
            (Ok(name), Err(_)) => Some(format!("{}: is not UTF-8 text", name.escape_debug())),
            (Err(_), _) => Some("a field's name is not UTF-8 text".into()),
        }
    })
}

/// The console's error: a page with the right status, or a redirect to sign in.
#[derive(Debug, thiserror::Error)]
pub enum ConsoleError {
    #[error("sign in first")]
    SignIn { next: String },
    #[error("{0}")]
    Forbidden(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    TooMany(String),
    #[error("{0}")]
    Unavailable(String),
    #[error("something went wrong on our side: {0}")]
    Internal(String),
}

impl From<Error> for ConsoleError {
    fn from(e: Error) -> Self {
        match e {
            Error::Invalid { .. } | Error::TooLarge(_) => ConsoleError::Invalid(e.to_string()),
            Error::NotFound(m) => ConsoleError::NotFound(m),
            Error::Forbidden(m) => ConsoleError::Forbidden(m),
            Error::Conflict(_, m) | Error::StaleReceipt(m) => ConsoleError::Conflict(m),
            Error::Secret(e) => {
                tracing::error!(error = %e, "console: a signing secret cannot be opened");
                ConsoleError::Internal(e.to_string())
            }
            Error::Db(e) => e.into(),
        }
    }
}

impl From<sqlx::Error> for ConsoleError {
    fn from(e: sqlx::Error) -> Self {
        if crate::db::outage(&e).is_some() {
            tracing::debug!(error = %e, "console: database unavailable");
            return ConsoleError::Unavailable("the database is unavailable or accepts no writes at the moment; try again shortly".into());
        }
        tracing::error!(error = %e, "console: database error");
        ConsoleError::Internal("the database did not answer as expected".into())
    }
}

impl From<askama::Error> for ConsoleError {
    fn from(e: askama::Error) -> Self {
        tracing::error!(error = %e, "console: template error");
        ConsoleError::Internal("a page could not be rendered".into())
    }
}

#[derive(Template)]
#[template(path = "error.html")]
struct ErrorPage<'a> {
    status: u16,
    title: &'a str,
    message: String,
    css: String,
    icon: String,
}

impl ResponseError for ConsoleError {
    fn status_code(&self) -> StatusCode {
        match self {
            ConsoleError::SignIn { .. } => StatusCode::SEE_OTHER,
            ConsoleError::Forbidden(_) => StatusCode::FORBIDDEN,
            ConsoleError::NotFound(_) => StatusCode::NOT_FOUND,
            ConsoleError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ConsoleError::Conflict(_) => StatusCode::CONFLICT,
            ConsoleError::Invalid(_) => StatusCode::UNPROCESSABLE_ENTITY,
            ConsoleError::TooMany(_) => StatusCode::TOO_MANY_REQUESTS,
            ConsoleError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            ConsoleError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn error_response(&self) -> HttpResponse {
        if let ConsoleError::SignIn { next } = self {
            let location = format!("/console/login?next={}", url::form_urlencoded::byte_serialize(next.as_bytes()).collect::<String>());
            return see_other(&location);
        }
        let status = self.status_code();
        let page = ErrorPage {
            status: status.as_u16(),
            title: status.canonical_reason().unwrap_or("Error"),
            message: self.to_string(),
            css: assets::url("console.css"),
            icon: assets::url("favicon.svg"),
        };
        let body = page.render().unwrap_or_else(|_| self.to_string());
        HttpResponse::build(status).content_type("text/html; charset=utf-8").body(body)
    }
}

/// What every page's frame needs: who is signed in, their CSRF token, where they are, and
/// a message left by the previous action.
pub struct Ctx {
    pub user: String,
    pub admin: bool,
    pub csrf: String,
    pub active: &'static str,
    pub flash: Option<String>,
    /// The flash is a warning (`done_warning`): shown in warning colours.
    pub flash_warning: bool,
    pub css: String,
    pub js: String,
    pub icon: String,
    /// When the page was made: what relative times count from.
    pub now: DateTime<Utc>,
}

impl Ctx {
    pub fn new(session: &Session, req: &HttpRequest, active: &'static str) -> Ctx {
        let flash = req.cookie(FLASH_COOKIE).and_then(|c| URL_SAFE_NO_PAD.decode(c.value()).ok()).and_then(|bytes| String::from_utf8(bytes).ok());
        let (flash, flash_warning) = match flash {
            Some(message) => match message.strip_prefix(WARNING) {
                Some(warning) => (Some(warning.to_string()), true),
                None => (Some(message), false),
            },
            None => (None, false),
        };
        Ctx {
            user: session.user.username.clone(),
            admin: session.is_admin(),
            csrf: session.csrf.clone(),
            active,
            flash,
            flash_warning,
            css: assets::url("console.css"),
            js: assets::url("console.js"),
            icon: assets::url("favicon.svg"),
            now: Utc::now(),
        }
    }

    /// `at` in UTC, saying so, with how long ago or how far ahead: "… UTC (in 6 h)".
    pub fn when(&self, at: impl when::Time) -> when::When {
        when::When { at: at.time(), now: self.now, millis: false }
    }

    /// As `when`, to the millisecond.
    pub fn when_ms(&self, at: impl when::Time) -> when::When {
        when::When { at: at.time(), now: self.now, millis: true }
    }
}

/// A rendered page (200 unless `status` says otherwise); clears the flash it showed.
pub fn render(status: StatusCode, ctx: &Ctx, page: &impl Template) -> Result<HttpResponse, ConsoleError> {
    let mut response = HttpResponse::build(status);
    response.content_type("text/html; charset=utf-8");
    if ctx.flash.is_some() {
        let mut gone = Cookie::build(FLASH_COOKIE, "").path("/console").finish();
        gone.make_removal();
        response.cookie(gone);
    }
    Ok(response.body(page.render()?))
}

/// A payload laid out for reading (it is kept as PostgreSQL prints it, on one line).
pub fn pretty_json(raw: &serde_json::value::RawValue) -> String {
    serde_json::from_str::<serde_json::Value>(raw.get()).and_then(|v| serde_json::to_string_pretty(&v)).unwrap_or_else(|_| raw.get().to_string())
}

pub fn see_other(location: &str) -> HttpResponse {
    HttpResponse::SeeOther().insert_header((header::LOCATION, location)).finish()
}

/// A redirect after an action, carrying a message for the next page.
pub fn done(location: &str, message: &str) -> HttpResponse {
    let cookie = Cookie::build(FLASH_COOKIE, URL_SAFE_NO_PAD.encode(message))
        .path("/console")
        .http_only(true)
        .same_site(SameSite::Lax)
        .max_age(actix_web::cookie::time::Duration::seconds(60))
        .finish();
    let mut response = see_other(location);
    let _ = response.add_cookie(&cookie);
    response
}

/// What starts a flash message that warns (no message a person writes starts with it).
const WARNING: char = '\u{1}';

/// As `done`, with a message that warns: some of what was asked was not done.
pub fn done_warning(location: &str, message: &str) -> HttpResponse {
    done(location, &format!("{WARNING}{message}"))
}

/// A message as HTML: escaped, with each `quoted` part as code, as the messages write names
/// and values (the API's messages are read as text, where the backticks show the quoting).
/// Templates write it unescaped: `{{ crate::console::marked(message)|safe }}`.
pub fn marked(message: &str) -> String {
    let escaped = message.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;").replace('\'', "&#39;");
    let mut html = String::with_capacity(escaped.len() + 16);
    let parts: Vec<&str> = escaped.split('`').collect();
    // An odd backtick out (an unmatched one) stays as typed.
    let paired = parts.len() % 2 == 1;
    for (i, part) in parts.iter().enumerate() {
        match (i % 2 == 1, paired || i + 1 < parts.len()) {
            (true, true) => html.push_str(&format!("<code>{part}</code>")),
            (true, false) => html.push_str(&format!("`{part}")),
            (false, _) => html.push_str(part),
        }
    }
    html
}

/// A count with thousands separators, as every page writes counts: "1,346". Templates
/// call it as `crate::console::grouped(n)` (with a number or a reference to one).
pub fn grouped(n: impl std::borrow::Borrow<i64>) -> String {
    let n = *n.borrow();
    let digits = n.unsigned_abs().to_string();
    let mut shown = String::from(if n < 0 { "-" } else { "" });
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            shown.push(',');
        }
        shown.push(c);
    }
    shown
}

/// A count and what it counts, singular or plural: "1 task", "1,346 tasks".
pub fn counted(n: i64, one: &str, many: &str) -> String {
    format!("{} {}", grouped(n), if n == 1 { one } else { many })
}

/// The message a refused form shows next to `field` (empty when its problems are elsewhere).
pub fn error_for<'a>(errors: &'a [(String, String)], field: &str) -> &'a str {
    errors.iter().find(|(f, _)| f == field).map_or("", |(_, message)| message)
}

/// The attributes that tell assistive technology a refused form's `field` was refused, and
/// why: its message is the `field-error` with the id `error-{field}`. Empty when it was not;
/// else it starts with a space, to follow the tag's other attributes.
/// `field` is a template's own literal name, so the result is safe to write unescaped.
pub fn invalid(errors: &[(String, String)], field: &str) -> String {
    if error_for(errors, field).is_empty() { String::new() } else { format!(r#" aria-invalid="true" aria-describedby="error-{field}""#) }
}

/// Every problem found with a form, to be shown at once (each `Error::Invalid` next to its
/// field) rather than one per round trip.
#[derive(Debug)]
pub struct Problems(pub Vec<Error>);

impl From<Error> for Problems {
    fn from(e: Error) -> Self {
        Problems(vec![e])
    }
}

impl Problems {
    /// The errors of checks made side by side; `None` when every one passed.
    pub fn of(errors: impl IntoIterator<Item = Option<Error>>) -> Option<Problems> {
        let errors: Vec<Error> = errors.into_iter().flatten().collect();
        (!errors.is_empty()).then_some(Problems(errors))
    }

    /// Each field's problems as (field, message), the first per field; or the first error
    /// that is about no field (not found, a database error), which no form can show.
    pub fn by_field(self) -> Result<Vec<(String, String)>, Error> {
        let mut fields: Vec<(String, String)> = Vec::new();
        for e in self.0 {
            match e {
                Error::Invalid { field, message } => {
                    if !fields.iter().any(|(f, _)| *f == field) {
                        fields.push((field, message));
                    }
                }
                other => return Err(other),
            }
        }
        Ok(fields)
    }
}

/// A `datetime-local` input's value (UTC) as a time, within the API's range of times.
pub fn parse_local_time(field: &str, raw: &str) -> Result<Option<DateTime<Utc>>, Error> {
    let raw = raw.trim();
    if raw.is_empty() {
        return Ok(None);
    }
    if let Ok(t) = DateTime::parse_from_rfc3339(raw) {
        return check_time(field, t.with_timezone(&Utc)).map(Some);
    }
    for format in ["%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M", "%Y-%m-%d %H:%M:%S"] {
        if let Ok(t) = chrono::NaiveDateTime::parse_from_str(raw, format) {
            return check_time(field, t.and_utc()).map(Some);
        }
    }
    Err(Error::invalid(field, format!("`{raw}` is not a time such as 2026-11-22 09:30 (UTC)")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoted_parts_of_a_message_show_as_code_and_the_rest_escaped() {
        assert_eq!(marked("`-4714-01-01` is not a time"), "<code>-4714-01-01</code> is not a time");
        assert_eq!(marked("no biz type named `<b>` & `x`"), "no biz type named <code>&lt;b&gt;</code> &amp; <code>x</code>");
        assert_eq!(marked("one ` alone"), "one ` alone");
        assert_eq!(marked("`a` and ` b"), "<code>a</code> and ` b");
        assert_eq!(marked("\"'"), "&quot;&#39;");
    }

    #[test]
    fn the_first_field_that_is_not_utf8_is_named() {
        assert_eq!(not_utf8(b"a=1&b=%C3%A9+x&c=&d"), None);
        assert_eq!(not_utf8(b"a=1&key=a%FFb&z=%C3").as_deref(), Some("key: is not UTF-8 text"));
        assert_eq!(not_utf8(b"q=\xff").as_deref(), Some("q: is not UTF-8 text"));
        assert_eq!(not_utf8(b"%FF=1").as_deref(), Some("a field's name is not UTF-8 text"));
    }
}
