//! Signing in and out, the session cookie, roles and CSRF tokens.
//!
//! The session cookie holds 32 random bytes; the database keeps only their SHA-256, with
//! the user and the session's CSRF token. Signing in always makes a new session (a
//! session id planted before sign-in is worthless). The sign-in form itself is protected
//! by a signed double-submit token: a random value and its HMAC under a key the nodes share
//! (`LoginKey`), in a cookie and in the form, which must match; a pair the client made up
//! is refused, whatever it put in both.
//! Sign-in attempts are limited per client address (behind trusted proxies, the one they
//! forwarded: `client_address`) and user name (`login_limits`); failed ones are logged and
//! audited.

use std::future::Future;
use std::pin::Pin;
use std::time::Instant;

use actix_web::cookie::{Cookie, SameSite};
use actix_web::dev::Payload;
use actix_web::http::{ConnectionType, StatusCode, header};
use actix_web::{FromRequest, HttpRequest, HttpResponse, web};
use askama::Template;
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use rand::RngCore;
use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::login_limits::LoginLimiter;
use super::oidc::SignInMethods;
use super::{ConsoleError, assets, see_other};
use crate::audit::{self, Action};
use crate::client_address::TrustedProxies;
use crate::state::AppState;
use crate::users::{self, User, sessions};

/// The session cookie; a request without it (or an Authorization header) is anonymous.
pub const COOKIE: &str = "chime_session";
const LOGIN_COOKIE: &str = "chime_login";
const SESSION_HOURS: i64 = 12;

#[derive(Debug, Clone)]
pub struct Session {
    pub user: User,
    pub csrf: String,
    /// Seals what this session is shown once (`reveal`): derived from the cookie's token,
    /// which the database does not hold, so it exists only while the browser sends it.
    pub(super) reveal_key: super::reveal::Key,
    /// The stored hash of this session's token: the session a user's own password change
    /// keeps while their others end.
    pub(super) token_hash: Vec<u8>,
}

impl Session {
    pub fn is_admin(&self) -> bool {
        self.user.role == "admin"
    }

    pub fn require_admin(&self) -> Result<(), ConsoleError> {
        if self.is_admin() {
            Ok(())
        } else {
            Err(ConsoleError::Forbidden(format!("only an admin can do this; `{}` is {}", self.user.username, self.user.role)))
        }
    }

    /// Refuses a form whose CSRF token is missing or not this session's.
    pub fn check_csrf(&self, sent: &str) -> Result<(), ConsoleError> {
        if constant_time_eq(sent.as_bytes(), self.csrf.as_bytes()) {
            Ok(())
        } else {
            Err(ConsoleError::Forbidden("this form's security token is missing or stale; reload the page and try again".into()))
        }
    }

    /// An admin's action: the user must be an admin and the form carry the session's token.
    pub fn admin_form(&self, csrf: &str) -> Result<(), ConsoleError> {
        self.require_admin()?;
        self.check_csrf(csrf)
    }

    /// Who the audit log names.
    pub fn actor(&self) -> String {
        format!("user:{}", self.user.username)
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn random_token() -> String {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    URL_SAFE_NO_PAD.encode(bytes)
}

fn hash(token: &str) -> Vec<u8> {
    Sha256::digest(token.as_bytes()).to_vec()
}

impl FromRequest for Session {
    type Error = ConsoleError;
    type Future = Pin<Box<dyn Future<Output = Result<Self, ConsoleError>>>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        let state = req.app_data::<web::Data<AppState>>().cloned();
        let token = req.cookie(COOKIE).map(|c| c.value().to_string());
        let next = req.uri().path_and_query().map(|p| p.to_string()).unwrap_or_default();
        Box::pin(async move {
            let state = state.ok_or_else(|| ConsoleError::Internal("no application state".into()))?;
            let sign_in = || ConsoleError::SignIn { next: next.clone() };
            let token = token.ok_or_else(sign_in)?;
            let token_hash = hash(&token);
            let (user, csrf) = sessions::find(&state.pool, &token_hash).await?.ok_or_else(sign_in)?;
            let reveal_key = super::reveal::Key::of_session(&token);
            Ok(Session { user, csrf, reveal_key, token_hash })
        })
    }
}

#[derive(Template)]
#[template(path = "login.html")]
struct LoginPage {
    csrf: String,
    next: String,
    /// `next` as a query string's value, for the provider's link.
    next_encoded: String,
    /// "Sign in with …": the provider's name, when there is one.
    provider: Option<String>,
    /// Whether the password form is offered (CHIME_LOCAL_PASSWORDS).
    passwords: bool,
    username: String,
    error: Option<String>,
    css: String,
    icon: String,
}

#[derive(Deserialize)]
pub struct LoginQuery {
    pub(super) next: Option<String>,
}

/// Only a console path may be the page to return to after signing in, and only in visible
/// ASCII (as a browser sends it): it goes into a Location header, where CR, LF or other
/// bytes are refused.
pub(super) fn safe_next(next: Option<&str>) -> String {
    match next {
        Some(n) if n.starts_with("/console") && !n.contains("//") && !n.contains('\\') && n.bytes().all(|b| b.is_ascii_graphic()) => n.to_string(),
        _ => "/console".into(),
    }
}

pub(super) fn secure(req: &HttpRequest) -> bool {
    req.connection_info().scheme() == "https"
}

/// The key that signs sign-in form tokens, shared by the nodes through the database
/// (`console_keys`) and read once per node, on first use.
#[derive(Default)]
pub struct LoginKey(tokio::sync::OnceCell<[u8; 32]>);

impl LoginKey {
    async fn get(&self, state: &AppState) -> Result<&[u8; 32], ConsoleError> {
        self.0
            .get_or_try_init(|| async {
                let mut made = [0u8; 32];
                rand::rng().fill_bytes(&mut made);
                // The first node to ask makes it; the others read it. A key row is never
                // updated, so nothing is locked beyond the insert's own row.
                let key: Vec<u8> = crate::db::query_scalar(
                    "WITH made AS (
                        INSERT INTO console_keys (purpose, key) VALUES ('login', $1) ON CONFLICT DO NOTHING RETURNING key
                     )
                     SELECT key FROM made UNION ALL SELECT key FROM console_keys WHERE purpose = 'login' LIMIT 1",
                )
                .bind(made.as_slice())
                .fetch_one(&state.pool)
                .await
                .map_err(crate::error::Error::from)?;
                key.try_into().map_err(|_| ConsoleError::Internal("the console's login key is not 32 bytes".into()))
            })
            .await
    }
}

/// A new sign-in form token: 32 random bytes and their HMAC-SHA256, both base64url, joined
/// by a dot.
fn signed_token(key: &[u8; 32]) -> String {
    let random = random_token();
    format!("{random}.{}", URL_SAFE_NO_PAD.encode(login_mac(key, &random)))
}

fn login_mac(key: &[u8; 32], random: &str) -> Vec<u8> {
    use hmac::{Hmac, Mac};
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes any key length");
    mac.update(b"chime login form\0");
    mac.update(random.as_bytes());
    mac.finalize().into_bytes().to_vec()
}

/// Whether the cookie and the form carry the same token, and it is one this cluster made.
fn login_token_ok(key: &[u8; 32], cookie: &str, form: &str) -> bool {
    let Some((random, mac)) = form.split_once('.') else { return false };
    let Ok(mac) = URL_SAFE_NO_PAD.decode(mac) else { return false };
    constant_time_eq(cookie.as_bytes(), form.as_bytes()) && constant_time_eq(&mac, &login_mac(key, random))
}

fn login_page(
    req: &HttpRequest,
    methods: &SignInMethods,
    key: &[u8; 32],
    status: StatusCode,
    next: String,
    username: String,
    error: Option<String>,
) -> HttpResponse {
    let csrf = signed_token(key);
    let next_encoded = url::form_urlencoded::byte_serialize(next.as_bytes()).collect();
    let page = LoginPage {
        csrf: csrf.clone(),
        next,
        next_encoded,
        provider: methods.provider.as_ref().map(|p| p.display_name.clone()),
        passwords: methods.passwords,
        username,
        error,
        css: assets::url("console.css"),
        icon: assets::url("favicon.svg"),
    };
    let cookie = Cookie::build(LOGIN_COOKIE, csrf).path("/console/login").http_only(true).secure(secure(req)).same_site(SameSite::Strict).finish();
    HttpResponse::build(status).content_type("text/html; charset=utf-8").cookie(cookie).body(page.render().unwrap_or_default())
}

/// A refusal that asks the caller to come back in `secs`, on a new connection: the
/// node's connections are few (`max_connections`), and a flood's refused callers holding
/// theirs open for keep-alive left the rest of the flood, and a right password behind it,
/// queued in the kernel for seconds.
fn come_back(mut page: HttpResponse, secs: u64) -> HttpResponse {
    page.headers_mut().insert(header::RETRY_AFTER, header::HeaderValue::from(secs));
    page.head_mut().set_connection_type(ConnectionType::Close);
    page
}

pub async fn login_form(
    req: HttpRequest,
    state: web::Data<AppState>,
    key: web::Data<LoginKey>,
    methods: web::Data<SignInMethods>,
    query: web::Query<LoginQuery>,
) -> Result<HttpResponse, ConsoleError> {
    Ok(login_page(&req, &methods, key.get(&state).await?, StatusCode::OK, safe_next(query.next.as_deref()), String::new(), None))
}

#[derive(Deserialize)]
pub struct LoginForm {
    #[serde(default)]
    username: String,
    #[serde(default)]
    password: String,
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    next: String,
}

pub async fn login(
    req: HttpRequest,
    state: web::Data<AppState>,
    limiter: web::Data<LoginLimiter>,
    proxies: web::Data<TrustedProxies>,
    key: web::Data<LoginKey>,
    methods: web::Data<SignInMethods>,
    form: web::Form<LoginForm>,
) -> Result<HttpResponse, ConsoleError> {
    if !methods.passwords {
        return Err(ConsoleError::Forbidden(
            "chime passwords are turned off here (CHIME_LOCAL_PASSWORDS=false): sign in through the provider".into(),
        ));
    }
    let form = form.into_inner();
    let next = safe_next(Some(&form.next));
    let cookie = req.cookie(LOGIN_COOKIE).map(|c| c.value().to_string()).unwrap_or_default();
    let key = key.get(&state).await?;
    if !login_token_ok(key, &cookie, &form.csrf) {
        let error = "the sign-in form expired; please sign in again".to_string();
        return Ok(login_page(&req, &methods, key, StatusCode::FORBIDDEN, next, form.username, Some(error)));
    }
    let address = proxies.client(&req);
    let failures = match limiter.begin(address, &form.username, Instant::now()) {
        Ok(failures) => failures,
        Err(wait) => {
            // Not logged at INFO: the failures that led here were, and this adds nothing new.
            tracing::debug!(user = %shown_name(&form.username), %address, "console: sign-in refused while waiting");
            let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
            let error = format!("too many failed sign-ins; try again in {}", in_words(secs));
            let page = login_page(&req, &methods, key, StatusCode::TOO_MANY_REQUESTS, next, form.username, Some(error));
            return Ok(come_back(page, secs));
        }
    };
    let user = match users::verify(&state.pool, &form.username, &form.password, true).await? {
        users::Verdict::Right(user) => user,
        users::Verdict::Busy => {
            // Not tried: the attempt does not count against the name or the address.
            limiter.not_tried(address, &form.username);
            tracing::debug!(user = %shown_name(&form.username), %address, "console: sign-in refused, too many being checked");
            let error = "too many sign-ins are being checked at once; try again in a second".to_string();
            let page = login_page(&req, &methods, key, StatusCode::SERVICE_UNAVAILABLE, next, form.username, Some(error));
            return Ok(come_back(page, 1));
        }
        users::Verdict::Wrong => {
            let name = shown_name(&form.username);
            tracing::warn!(user = %name, %address, failures, "console: sign-in failed");
            let after = serde_json::json!({"address": address.to_string(), "failures": failures});
            audit::record_alone(&state.pool, &format!("address:{address}"), Action::UserSignInFailed, &name, None, Some(after)).await?;
            let error = "wrong user name or password".to_string();
            return Ok(login_page(&req, &methods, key, StatusCode::UNAUTHORIZED, next, form.username, Some(error)));
        }
    };
    limiter.succeeded(address, &form.username);
    users::record_sign_in(&state.pool, user.id).await?;
    audit::record_alone(&state.pool, &format!("user:{}", user.username), Action::UserSignIn, &user.username, None, None).await?;
    tracing::info!(user = %user.username, %address, "console: signed in");
    let mut response = start_session(&req, &state, &user, &next).await?;
    let mut used = Cookie::build(LOGIN_COOKIE, "").path("/console/login").finish();
    used.make_removal();
    let _ = response.add_cookie(&used);
    Ok(response)
}

/// A new session for a user who just signed in (with a password, or through the
/// provider), and the redirect to `next` that sets its cookie. A fresh session on every
/// sign-in (expired ones are cleared on the way); the browser's previous one ends.
pub(super) async fn start_session(req: &HttpRequest, state: &AppState, user: &User, next: &str) -> Result<HttpResponse, ConsoleError> {
    let token = random_token();
    sessions::start(&state.pool, &hash(&token), user.id, &random_token(), SESSION_HOURS).await?;
    if let Some(old) = req.cookie(COOKIE) {
        sessions::end(&state.pool, &hash(old.value())).await?;
    }
    let session = Cookie::build(COOKIE, token)
        .path("/")
        .http_only(true)
        .secure(secure(req))
        .same_site(SameSite::Lax)
        .max_age(actix_web::cookie::time::Duration::hours(SESSION_HOURS))
        .finish();
    let mut response = see_other(next);
    let _ = response.add_cookie(&session);
    Ok(response)
}

/// A user name as logs and the audit log show it: at most 64 characters (no user's is
/// longer) with control characters escaped, so that it is one line and storable.
fn shown_name(username: &str) -> String {
    let mut shown: String = username.chars().take(64).collect::<String>().escape_debug().collect();
    if username.chars().nth(64).is_some() {
        shown.push('…');
    }
    shown
}

/// A wait as a person reads it: "15 seconds", "4 minutes".
fn in_words(secs: u64) -> String {
    if secs < 120 { format!("{secs} seconds") } else { format!("{} minutes", secs.div_ceil(60)) }
}

#[derive(Deserialize)]
pub struct CsrfForm {
    #[serde(default)]
    pub csrf: String,
}

pub async fn logout(req: HttpRequest, session: Session, state: web::Data<AppState>, form: web::Form<CsrfForm>) -> Result<HttpResponse, ConsoleError> {
    session.check_csrf(&form.csrf)?;
    if let Some(cookie) = req.cookie(COOKIE) {
        sessions::end(&state.pool, &hash(cookie.value())).await?;
    }
    let mut gone = Cookie::build(COOKIE, "").path("/").finish();
    gone.make_removal();
    let mut response = see_other("/console/login");
    let _ = response.add_cookie(&gone);
    Ok(response)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_console_paths_are_followed_after_sign_in() {
        assert_eq!(safe_next(Some("/console/tasks?status=failed")), "/console/tasks?status=failed");
        for bad in
            ["https://evil.example/", "//evil.example", "/console//evil", "/api/v1/tasks", "/console\\x", "/console\r\nSet-Cookie: x=1", "/console/é"]
        {
            assert_eq!(safe_next(Some(bad)), "/console", "{bad}");
        }
        assert_eq!(safe_next(None), "/console");
    }

    #[test]
    fn a_login_token_must_be_signed_and_the_same_in_cookie_and_form() {
        let key = [7u8; 32];
        let token = signed_token(&key);
        assert!(login_token_ok(&key, &token, &token));
        assert!(!login_token_ok(&[8u8; 32], &token, &token), "another cluster's key");
        let other = signed_token(&key);
        assert!(!login_token_ok(&key, &token, &other), "two genuine tokens, not the same");
        let (random, _) = token.split_once('.').unwrap();
        for forged in ["", ".", "chosen-by-the-client", random, &format!("{random}.AAAA"), &format!("{random}.{}", URL_SAFE_NO_PAD.encode([0u8; 32]))]
        {
            assert!(!login_token_ok(&key, forged, forged), "{forged}");
        }
    }

    #[test]
    fn csrf_comparison_needs_the_exact_token() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"", b"abc"));
    }
}
