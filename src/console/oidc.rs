//! Sign-in through the OpenID Provider (`crate::oidc`): `start` sends the browser there
//! with a new state, nonce and PKCE challenge; `callback` takes it back. The state is in a
//! cookie of this browser's and in the database (`users::oidc`), where the nonce and the
//! verifier stay; the callback must bring the same state as the cookie (a state from
//! another browser, or edited, is refused) and finds its row once (a replayed callback
//! finds none). A refused sign-in gets a page that says why, and an audit entry.

use std::sync::Arc;

use actix_web::cookie::{Cookie, SameSite};
use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use askama::Template;
use serde::Deserialize;

use super::session::{self, LoginQuery};
use super::{ConsoleError, assets};
use crate::audit::{self, Action};
use crate::client_address::TrustedProxies;
use crate::oidc::{self, Provider, Refused};
use crate::state::AppState;
use crate::users::oidc::{self as oidc_users, Outcome, Pending};

/// The cookie that ties a sign-in under way to the browser that started it.
const STATE_COOKIE: &str = "chime_oidc";
/// How long a person has at the provider to sign in.
const SIGN_IN_MINUTES: i32 = 10;

/// How people sign in to this node's console: through the provider, with chime passwords, or both.
pub struct SignInMethods {
    pub provider: Option<Arc<Provider>>,
    pub passwords: bool,
}

#[derive(Template)]
#[template(path = "oidc_refused.html")]
struct RefusedPage {
    reason: String,
    hint: Option<String>,
    css: String,
    icon: String,
}

/// A refused sign-in's page: why, and what to do about it.
fn refused(reason: &str, hint: Option<String>) -> HttpResponse {
    let page = RefusedPage { reason: reason.to_string(), hint, css: assets::url("console.css"), icon: assets::url("favicon.svg") };
    HttpResponse::build(StatusCode::FORBIDDEN).content_type("text/html; charset=utf-8").body(page.render().unwrap_or_default())
}

/// `refused`, and the browser's sign-in under way forgotten (its row is gone).
fn refused_after_taking(reason: &str, hint: Option<String>) -> HttpResponse {
    let mut response = refused(reason, hint);
    let _ = response.add_cookie(&state_cookie_removal());
    response
}

fn state_cookie_removal() -> Cookie<'static> {
    let mut gone = Cookie::build(STATE_COOKIE, "").path("/console/oidc").finish();
    gone.make_removal();
    gone
}

fn provider(methods: &SignInMethods) -> Result<&Provider, ConsoleError> {
    methods.provider.as_deref().ok_or_else(|| ConsoleError::NotFound("sign-in through an OpenID Provider is not set up (CHIME_OIDC_ISSUER)".into()))
}

pub async fn start(
    req: HttpRequest,
    state: web::Data<AppState>,
    methods: web::Data<SignInMethods>,
    query: web::Query<LoginQuery>,
) -> Result<HttpResponse, ConsoleError> {
    let provider = provider(&methods)?;
    let sign_in_state = oidc::random_value();
    let pending = Pending { nonce: oidc::random_value(), pkce_verifier: oidc::random_value(), next: session::safe_next(query.next.as_deref()) };
    if !oidc_users::begin(&state.pool, &sign_in_state, &pending, SIGN_IN_MINUTES).await? {
        return Err(ConsoleError::TooMany("too many sign-ins are under way at once; try again in a few minutes".into()));
    }
    let location = provider.authorization_url(&sign_in_state, &pending.nonce, &pending.pkce_verifier);
    // Lax: the provider's redirect back is a top-level GET from another site, which a
    // Strict cookie would not come with.
    let cookie = Cookie::build(STATE_COOKIE, sign_in_state)
        .path("/console/oidc")
        .http_only(true)
        .secure(session::secure(&req))
        .same_site(SameSite::Lax)
        .max_age(actix_web::cookie::time::Duration::minutes(SIGN_IN_MINUTES.into()))
        .finish();
    let mut response = super::see_other(&location);
    let _ = response.add_cookie(&cookie);
    Ok(response)
}

#[derive(Deserialize)]
pub struct CallbackQuery {
    code: Option<String>,
    state: Option<String>,
    error: Option<String>,
    error_description: Option<String>,
    /// The issuer of the answer (RFC 9207), when the provider names it.
    iss: Option<String>,
}

const START_AGAIN: &str = "Start again from the sign-in page.";

pub async fn callback(
    req: HttpRequest,
    state: web::Data<AppState>,
    methods: web::Data<SignInMethods>,
    proxies: web::Data<TrustedProxies>,
    query: web::Query<CallbackQuery>,
) -> Result<HttpResponse, ConsoleError> {
    let provider = provider(&methods)?;
    let address = proxies.client(&req);
    let query = query.into_inner();
    let cookie = req.cookie(STATE_COOKIE).map(|c| c.value().to_string()).unwrap_or_default();
    let sent = query.state.clone().unwrap_or_default();
    if cookie.is_empty() || !oidc::same(&cookie, &sent) {
        // The cookie stays: a link someone else made (a login CSRF) does not end this
        // browser's own sign-in under way.
        tracing::warn!(%address, "console: OIDC sign-in refused, its state is not this browser's");
        let reason = "this sign-in's state is not the one this browser started (it was changed, came from another browser, or was already used)";
        return Ok(refused(reason, Some(START_AGAIN.into())));
    }
    let Some(pending) = oidc_users::take(&state.pool, &sent).await? else {
        tracing::warn!(%address, "console: OIDC sign-in refused, its state was used or expired");
        return Ok(refused_after_taking("this sign-in was already used, or it expired", Some(START_AGAIN.into())));
    };
    let refuse = |reason: String, subject: Option<String>| {
        let pool = state.pool.clone();
        async move {
            tracing::warn!(%address, subject = subject.as_deref().unwrap_or(""), %reason, "console: OIDC sign-in refused");
            let actor = subject.as_ref().map_or_else(|| format!("address:{address}"), |s| format!("oidc:{s}"));
            let after = serde_json::json!({"address": address.to_string(), "oidc_subject": subject, "reason": reason});
            audit::record_alone(&pool, &actor, Action::UserSignInFailed, subject.as_deref().unwrap_or("(unknown)"), None, Some(after)).await?;
            Ok::<_, ConsoleError>(reason)
        }
    };
    if let Some(iss) = &query.iss
        && iss != provider.issuer()
    {
        let reason = refuse(format!("the answer names another issuer, `{iss}`, than CHIME_OIDC_ISSUER"), None).await?;
        return Ok(refused_after_taking(&reason, Some(START_AGAIN.into())));
    }
    if let Some(error) = &query.error {
        let description = query.error_description.as_deref().map(|d| format!(" ({d})")).unwrap_or_default();
        let reason = refuse(format!("the provider did not sign you in: {error}{description}"), None).await?;
        return Ok(refused_after_taking(&reason, Some(START_AGAIN.into())));
    }
    let code = query.code.unwrap_or_default();
    let identity = match provider.sign_in(&code, &pending.pkce_verifier, &pending.nonce).await {
        Ok(identity) => identity,
        Err(Refused(reason)) => {
            let reason = refuse(reason, None).await?;
            return Ok(refused_after_taking(&reason, Some(START_AGAIN.into())));
        }
    };
    let subject = Some(identity.subject.clone());
    let Some(role) = provider.role(&identity) else {
        let groups = if identity.groups.is_empty() { "none".to_string() } else { identity.groups.join(", ") };
        let reason = format!("your account is in no group that has a role in chime (your groups: {groups})");
        let reason = refuse(reason, subject).await?;
        let hint = format!("The groups that give a role are {}. Ask whoever manages them to add you to one.", provider.role_groups());
        return Ok(refused_after_taking(&reason, Some(hint)));
    };
    let Some(username) = identity.username.clone() else {
        let reason = refuse("the provider sent no user name (CHIME_OIDC_USERNAME_CLAIM)".into(), subject).await?;
        return Ok(refused_after_taking(&reason, None));
    };
    let outcome = match oidc_users::sign_in(&state.pool, &identity.issuer, &identity.subject, &username, role).await {
        Ok(outcome) => outcome,
        Err(crate::error::Error::Invalid { message, .. }) => {
            let reason =
                refuse(format!("the user name the provider sent, `{}`, cannot be a chime user name: it {message}", username.escape_debug()), subject)
                    .await?;
            return Ok(refused_after_taking(&reason, None));
        }
        Err(e) => return Err(e.into()),
    };
    let user = match outcome {
        Outcome::SignedIn { user, created } => {
            tracing::info!(user = %user.username, subject = %identity.subject, role, created, %address, "console: signed in through the OpenID Provider");
            user
        }
        Outcome::Disabled(name) => {
            let reason = refuse(format!("the chime user `{name}` that your account signs in as is disabled"), subject).await?;
            return Ok(refused_after_taking(&reason, Some("An admin can enable it on the Users page.".into())));
        }
        Outcome::NameTaken(name) => {
            let reason = refuse(format!("a chime user named `{name}` exists that does not sign in through the provider"), subject).await?;
            return Ok(refused_after_taking(
                &reason,
                Some("An admin can delete or rename that user; you are made one of your own at your next sign-in.".into()),
            ));
        }
    };
    let mut response = session::start_session(&req, &state, &user, &pending.next).await?;
    let _ = response.add_cookie(&state_cookie_removal());
    Ok(response)
}
