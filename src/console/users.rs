//! Console users (admins only): list, create, change role, disable and enable, reset a
//! password; and every user's own account page, where they change their password.
//!
//! The rules are `users`'s, the admin API's and `chime user`'s: one set of checks, and the
//! same refusal when a change would leave no enabled admin. Disabling a user or giving them
//! a new password ends their sessions (`users::update`), so that an open tab cannot go on
//! acting for them. A password made here (a new user's when none is typed, a reset) is
//! shown once on the users page, through `reveal`: a reload shows nothing.

use std::time::Instant;

use actix_web::http::StatusCode;
use actix_web::http::header;
use actix_web::{HttpRequest, HttpResponse, web};
use askama::Template;
use serde::Deserialize;

use super::login_limits::LoginLimiter;
use super::session::CsrfForm;
use super::{ConsoleError, Ctx, Problems, Session, done, render, reveal};
use crate::audit::{self, Action};
use crate::client_address::TrustedProxies;
use crate::error::Error;
use crate::state::AppState;
use crate::users::{self, UserChanges, UserInfo};

/// The users page: every action on a user leads back here (post/redirect/get).
const PAGE: &str = "/console/users";

/// The new-user form, as typed: kept so that a refused form comes back as it was.
#[derive(Debug, Default, Deserialize)]
pub struct NewUserForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    name: String,
    #[serde(default)]
    role: String,
    /// Empty: a password is generated and shown once.
    #[serde(default)]
    password: String,
}

#[derive(Template)]
#[template(path = "users.html")]
struct UsersPage {
    ctx: Ctx,
    users: Vec<UserInfo>,
    form: NewUserForm,
    /// Each field the new-user form is refused for, and why.
    errors: Vec<(String, String)>,
    /// Why an action on a listed user was refused (the last admin kept, say).
    refused: Option<String>,
    /// Shown once: a password made by the action that led here.
    revealed: Option<reveal::Revealed>,
}

impl UsersPage {
    fn error_for(&self, field: &str) -> &str {
        super::error_for(&self.errors, field)
    }

    fn invalid(&self, field: &str) -> String {
        super::invalid(&self.errors, field)
    }
}

/// The users page with `status`: the list, the new-user form as given, and what was refused.
async fn page(
    req: &HttpRequest,
    session: &Session,
    state: &AppState,
    status: StatusCode,
    form: NewUserForm,
    errors: Vec<(String, String)>,
    refused: Option<String>,
) -> Result<HttpResponse, ConsoleError> {
    let page = UsersPage { ctx: Ctx::new(session, req, "users"), users: users::list(&state.pool).await?, form, errors, refused, revealed: None };
    render(status, &page.ctx, &page)
}

pub async fn list(req: HttpRequest, session: Session, state: web::Data<AppState>) -> Result<HttpResponse, ConsoleError> {
    session.require_admin()?;
    let revealed = reveal::take(&req, &session, PAGE);
    let form = NewUserForm { role: "support".into(), ..NewUserForm::default() };
    let page =
        UsersPage { ctx: Ctx::new(&session, &req, "users"), users: users::list(&state.pool).await?, form, errors: vec![], refused: None, revealed };
    let mut response = render(StatusCode::OK, &page.ctx, &page)?;
    reveal::forget(&req, &mut response, PAGE);
    Ok(response)
}

/// The redirect to the users page, showing `password` there once when it was made here.
fn done_revealing(req: &HttpRequest, session: &Session, message: &str, name: &str, password: &str) -> HttpResponse {
    let mut response = done(PAGE, message);
    reveal::set(req, &mut response, session, PAGE, &format!("password of {name}"), password);
    response
}

pub async fn create(
    req: HttpRequest,
    session: Session,
    state: web::Data<AppState>,
    form: web::Form<NewUserForm>,
) -> Result<HttpResponse, ConsoleError> {
    session.admin_form(&form.csrf)?;
    let mut form = form.into_inner();
    form.name = form.name.trim().to_string();
    let generated = form.password.is_empty().then(users::generate_password);
    let password = generated.clone().unwrap_or_else(|| form.password.clone());
    let problems = users::problems(&form.name, &form.role, &password);
    let created = match Problems::of(problems.into_iter().map(Some)) {
        Some(problems) => Err(problems),
        None => {
            let how = if generated.is_some() { "generated" } else { "given" };
            users::create_audited(&state.pool, &form.name, &form.role, &password, &session.actor(), how).await.map_err(Problems::from)
        }
    };
    let user = match created {
        Ok(user) => user,
        Err(problems) => {
            // A name already taken is the name field's problem.
            let name_taken = |e| match e {
                Error::Conflict(_, message) => Error::Invalid { field: "name".into(), message },
                other => other,
            };
            let errors = Problems(problems.0.into_iter().map(name_taken).collect()).by_field()?;
            form.password.clear();
            return page(&req, &session, &state, StatusCode::UNPROCESSABLE_ENTITY, form, errors, None).await;
        }
    };
    let message = format!(
        "{} user {} created; they sign in with the password {}.",
        user.role,
        user.name,
        if generated.is_some() { "below" } else { "you typed" }
    );
    Ok(match generated {
        Some(password) => done_revealing(&req, &session, &message, &user.name, &password),
        None => done(PAGE, &message),
    })
}

/// Applies `changes` to the named user, audited as `action`; a refusal (the last enabled
/// admin kept, no such user, a role that is not one) is shown on the users page.
async fn change(
    req: &HttpRequest,
    session: &Session,
    state: &AppState,
    name: &str,
    changes: &UserChanges,
    action: Action,
    password: Option<&str>,
) -> Result<Result<(UserInfo, UserInfo), HttpResponse>, ConsoleError> {
    match users::update_audited(&state.pool, name, changes, audit::By { actor: &session.actor(), action }, password).await {
        Ok(changed) => Ok(Ok(changed)),
        Err(e @ (Error::Conflict(..) | Error::Invalid { .. } | Error::NotFound(_))) => {
            let status = match e {
                Error::Conflict(..) => StatusCode::CONFLICT,
                Error::NotFound(_) => StatusCode::NOT_FOUND,
                _ => StatusCode::UNPROCESSABLE_ENTITY,
            };
            let form = NewUserForm { role: "support".into(), ..NewUserForm::default() };
            Ok(Err(page(req, session, state, status, form, vec![], Some(e.to_string())).await?))
        }
        Err(e) => Err(e.into()),
    }
}

#[derive(Debug, Deserialize)]
pub struct RoleForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    role: String,
}

pub async fn set_role(
    req: HttpRequest,
    session: Session,
    state: web::Data<AppState>,
    name: web::Path<String>,
    form: web::Form<RoleForm>,
) -> Result<HttpResponse, ConsoleError> {
    session.admin_form(&form.csrf)?;
    let changes = UserChanges { role: Some(form.role.clone()), ..UserChanges::default() };
    Ok(match change(&req, &session, &state, &name, &changes, Action::UserUpdate, None).await? {
        Ok((before, after)) if before.role == after.role => done(PAGE, &format!("{name} was {} already.", after.role)),
        // An admin who made themselves support staff can no longer see the users page.
        Ok((_, after)) if *name == session.user.username && after.role != "admin" => {
            done("/console", &format!("You are now {}: another admin manages users from here on.", after.role))
        }
        Ok((_, after)) => done(PAGE, &format!("{name} is now {}.", after.role)),
        Err(refused) => refused,
    })
}

async fn set_disabled(
    req: &HttpRequest,
    session: &Session,
    state: &AppState,
    name: &str,
    form: &CsrfForm,
    disabled: bool,
) -> Result<HttpResponse, ConsoleError> {
    session.admin_form(&form.csrf)?;
    let changes = UserChanges { disabled: Some(disabled), ..UserChanges::default() };
    Ok(match change(req, session, state, name, &changes, Action::UserUpdate, None).await? {
        Ok(_) if disabled => done(PAGE, &format!("{name} disabled: they cannot sign in, and their open sessions have ended.")),
        Ok(_) => done(PAGE, &format!("{name} enabled: they can sign in again with their password.")),
        Err(refused) => refused,
    })
}

pub async fn disable(
    req: HttpRequest,
    session: Session,
    state: web::Data<AppState>,
    name: web::Path<String>,
    form: web::Form<CsrfForm>,
) -> Result<HttpResponse, ConsoleError> {
    set_disabled(&req, &session, &state, &name, &form, true).await
}

pub async fn enable(
    req: HttpRequest,
    session: Session,
    state: web::Data<AppState>,
    name: web::Path<String>,
    form: web::Form<CsrfForm>,
) -> Result<HttpResponse, ConsoleError> {
    set_disabled(&req, &session, &state, &name, &form, false).await
}

/// A new generated password for the user, shown once; their sessions end.
pub async fn reset_password(
    req: HttpRequest,
    session: Session,
    state: web::Data<AppState>,
    name: web::Path<String>,
    form: web::Form<CsrfForm>,
) -> Result<HttpResponse, ConsoleError> {
    session.admin_form(&form.csrf)?;
    let password = users::generate_password();
    let changes = UserChanges { password: Some(password.clone()), ..UserChanges::default() };
    Ok(match change(&req, &session, &state, &name, &changes, Action::UserResetPassword, Some("generated")).await? {
        Ok((_, after)) => {
            let disabled = if after.disabled { " They are disabled: enable them to let them sign in." } else { "" };
            let message = format!("New password for {name}: give it to them; their sessions have ended.{disabled}");
            done_revealing(&req, &session, &message, &name, &password)
        }
        Err(refused) => refused,
    })
}

/// The own-password form, as typed (the passwords are not sent back).
#[derive(Debug, Default, Deserialize)]
pub struct PasswordForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    current_password: String,
    #[serde(default)]
    new_password: String,
    #[serde(default)]
    confirm_password: String,
}

#[derive(Template)]
#[template(path = "account.html")]
struct AccountPage {
    ctx: Ctx,
    errors: Vec<(String, String)>,
}

impl AccountPage {
    fn error_for(&self, field: &str) -> &str {
        super::error_for(&self.errors, field)
    }

    fn invalid(&self, field: &str) -> String {
        super::invalid(&self.errors, field)
    }
}

fn account_page(req: &HttpRequest, session: &Session, status: StatusCode, errors: Vec<(String, String)>) -> Result<HttpResponse, ConsoleError> {
    let page = AccountPage { ctx: Ctx::new(session, req, "account"), errors };
    render(status, &page.ctx, &page)
}

pub async fn account(req: HttpRequest, session: Session) -> Result<HttpResponse, ConsoleError> {
    account_page(&req, &session, StatusCode::OK, vec![])
}

/// Any user changes their own password, giving the current one (so that a session left open
/// cannot take the account over). Guessing it is limited as sign-in is. Their other sessions
/// end; this one stays.
pub async fn change_password(
    req: HttpRequest,
    session: Session,
    state: web::Data<AppState>,
    limiter: web::Data<LoginLimiter>,
    proxies: web::Data<TrustedProxies>,
    form: web::Form<PasswordForm>,
) -> Result<HttpResponse, ConsoleError> {
    session.check_csrf(&form.csrf)?;
    let name = session.user.username.clone();
    let address = proxies.client(&req);
    if let Err(wait) = limiter.begin(address, &name, Instant::now()) {
        let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
        let errors = vec![("current_password".to_string(), format!("too many wrong passwords; try again in {secs} seconds"))];
        let mut response = account_page(&req, &session, StatusCode::TOO_MANY_REQUESTS, errors)?;
        response.headers_mut().insert(header::RETRY_AFTER, header::HeaderValue::from(secs));
        return Ok(response);
    }
    // Signed in: queued behind a flood of sign-ins rather than refused.
    let verdict = users::verify(&state.pool, &name, &form.current_password, false).await?;
    let current_ok = matches!(verdict, users::Verdict::Right(u) if u.id == session.user.id);
    if current_ok {
        limiter.succeeded(address, &name);
    }
    let checks = [
        (!current_ok).then(|| Error::invalid("current_password", "is not your current password")),
        users::validate_password(&form.new_password).err().map(|e| match e {
            Error::Invalid { message, .. } => Error::invalid("new_password", message),
            other => other,
        }),
        (form.new_password != form.confirm_password).then(|| Error::invalid("confirm_password", "does not match the new password")),
    ];
    let changed = match Problems::of(checks) {
        Some(problems) => Err(problems),
        None => users::set_own_password(&state.pool, session.user.id, &form.new_password, &session.token_hash, &session.actor())
            .await
            .map_err(Problems::from),
    };
    match changed {
        Ok(_) => Ok(done("/console/account", "Password changed; your other sessions have ended.")),
        Err(problems) => account_page(&req, &session, StatusCode::UNPROCESSABLE_ENTITY, problems.by_field()?),
    }
}
