//! Biz type pages: list, create, edit every setting, pause and resume, rotate the signing
//! secret, create and revoke API tokens. Changing anything is for admins; support staff
//! see the settings read-only.

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use askama::Template;
use serde::Deserialize;
use uuid::Uuid;

use super::session::CsrfForm;
use super::{ConsoleError, Ctx, Problems, Session, done, render, reveal};
use crate::audit::{self, Action};
use crate::biz_types::{self, BizType, Settings, TokenInfo};
use crate::engine::{BizTypeConfig, deliver};
use crate::error::Error;
use crate::state::AppState;
use crate::tasks::stats;

/// The settings form, as typed: kept as text so that a refused form comes back as it was.
#[derive(Debug, Default, Clone, Deserialize)]
pub struct Form {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub description: String,
    #[serde(default)]
    pub callback_url: String,
    #[serde(default)]
    pub mode: String,
    #[serde(default)]
    pub timeout_ms: String,
    #[serde(default)]
    pub max_attempts: String,
    #[serde(default)]
    pub max_snoozes: String,
    #[serde(default)]
    pub backoff_initial_ms: String,
    #[serde(default)]
    pub backoff_max_ms: String,
    #[serde(default)]
    pub rate_limit: String,
    #[serde(default)]
    pub max_in_flight: String,
    #[serde(default)]
    pub flow_max_in_flight: String,
    #[serde(default)]
    pub flow_rate_limit: String,
    #[serde(default)]
    pub weight: String,
    /// A checkbox: present ("on") when ticked.
    #[serde(default)]
    pub ordered: String,
    #[serde(default)]
    pub create_rate_limit: String,
    #[serde(default)]
    pub failure_url: String,
    #[serde(default)]
    pub breaker_threshold: String,
    #[serde(default)]
    pub breaker_window_ms: String,
    #[serde(default)]
    pub breaker_probe_ms: String,
    #[serde(default)]
    pub signing_scheme: String,
    /// `dingtalk`, `feishu`, `wecom`, `slack`, or empty: none.
    #[serde(default)]
    pub chat_platform: String,
    #[serde(default)]
    pub chat_url: String,
    /// Never shown back: empty keeps the secret set.
    #[serde(default)]
    pub chat_secret: String,
    /// A checkbox: present ("on") to remove the secret set.
    #[serde(default)]
    pub chat_secret_remove: String,
}

impl Form {
    /// The settings of `b`; URLs with their password masked unless `admin`.
    fn of(b: &BizType, admin: bool) -> Form {
        let url = |u: &str| if admin { u.to_string() } else { audit::masked_url(u) };
        let rate = |r: Option<f64>| r.map(|r| r.to_string()).unwrap_or_default();
        Form {
            csrf: String::new(),
            name: b.name.clone(),
            description: b.description.clone(),
            callback_url: url(&b.callback_url),
            mode: b.mode.clone(),
            timeout_ms: b.timeout_ms.to_string(),
            max_attempts: b.max_attempts.to_string(),
            max_snoozes: b.max_snoozes.to_string(),
            backoff_initial_ms: b.backoff_initial_ms.to_string(),
            backoff_max_ms: b.backoff_max_ms.to_string(),
            rate_limit: rate(b.rate_limit),
            max_in_flight: b.max_in_flight.to_string(),
            flow_max_in_flight: b.flow_max_in_flight.to_string(),
            flow_rate_limit: rate(b.flow_rate_limit),
            weight: b.weight.to_string(),
            signing_scheme: b.signing_scheme.clone(),
            ordered: if b.ordered { "on".into() } else { String::new() },
            create_rate_limit: rate(b.create_rate_limit),
            failure_url: b.failure_url.as_deref().map(url).unwrap_or_default(),
            breaker_threshold: b.breaker_threshold.to_string(),
            breaker_window_ms: b.breaker_window_ms.to_string(),
            breaker_probe_ms: b.breaker_probe_ms.to_string(),
            chat_platform: b.chat_platform.clone().unwrap_or_default(),
            // Its key is in the URL (WeCom, DingTalk, Slack): only admins see more than the host.
            chat_url: b.chat_url.as_deref().map(|u| if admin { u.to_string() } else { audit::masked_webhook(u) }).unwrap_or_default(),
            chat_secret: String::new(),
            chat_secret_remove: String::new(),
        }
    }

    fn defaults() -> Form {
        Form {
            mode: "callback".into(),
            timeout_ms: "10000".into(),
            max_attempts: biz_types::DEFAULT_MAX_ATTEMPTS.to_string(),
            max_snoozes: biz_types::DEFAULT_MAX_SNOOZES.to_string(),
            backoff_initial_ms: biz_types::DEFAULT_BACKOFF_INITIAL_MS.to_string(),
            backoff_max_ms: biz_types::DEFAULT_BACKOFF_MAX_MS.to_string(),
            max_in_flight: "100".into(),
            flow_max_in_flight: "0".into(),
            weight: "1".into(),
            signing_scheme: "chime".into(),
            breaker_threshold: biz_types::DEFAULT_BREAKER_THRESHOLD.to_string(),
            breaker_window_ms: biz_types::DEFAULT_BREAKER_WINDOW_MS.to_string(),
            breaker_probe_ms: biz_types::DEFAULT_BREAKER_PROBE_MS.to_string(),
            ..Form::default()
        }
    }

    /// The settings typed, and the fields that are not numbers (left out of the settings);
    /// an empty rate means unlimited, an empty number the default.
    fn settings(&self) -> (Settings, Vec<Error>) {
        fn int(field: &str, raw: &str) -> Result<Option<i32>, Error> {
            let raw = raw.trim();
            if raw.is_empty() {
                return Ok(None);
            }
            raw.parse().map(Some).map_err(|_| Error::invalid(field, "must be a whole number"))
        }
        fn rate(field: &str, raw: &str) -> Result<Option<f64>, Error> {
            let raw = raw.trim();
            if raw.is_empty() {
                return Ok(Some(0.0));
            }
            raw.parse().map(Some).map_err(|_| Error::invalid(field, "must be a number of calls per second (empty: unlimited)"))
        }
        fn noted<T>(parsed: Result<Option<T>, Error>, problems: &mut Vec<Error>) -> Option<T> {
            parsed.unwrap_or_else(|e| {
                problems.push(e);
                None
            })
        }
        let mut problems = Vec::new();
        let settings = Settings {
            description: Some(self.description.trim().to_string()),
            callback_url: Some(self.callback_url.trim().to_string()).filter(|u| !u.is_empty() || self.mode != "pull"),
            mode: Some(self.mode.clone()),
            timeout_ms: noted(int("timeout_ms", &self.timeout_ms), &mut problems),
            max_attempts: noted(int("max_attempts", &self.max_attempts), &mut problems),
            max_snoozes: noted(int("max_snoozes", &self.max_snoozes), &mut problems),
            backoff_initial_ms: noted(int("backoff_initial_ms", &self.backoff_initial_ms), &mut problems),
            backoff_max_ms: noted(int("backoff_max_ms", &self.backoff_max_ms), &mut problems),
            rate_limit: noted(rate("rate_limit", &self.rate_limit), &mut problems),
            max_in_flight: noted(int("max_in_flight", &self.max_in_flight), &mut problems),
            flow_max_in_flight: noted(int("flow_max_in_flight", &self.flow_max_in_flight), &mut problems),
            flow_rate_limit: noted(rate("flow_rate_limit", &self.flow_rate_limit), &mut problems),
            weight: noted(int("weight", &self.weight), &mut problems),
            ordered: Some(!self.ordered.is_empty()),
            create_rate_limit: noted(rate("create_rate_limit", &self.create_rate_limit), &mut problems),
            breaker_threshold: noted(int("breaker_threshold", &self.breaker_threshold), &mut problems),
            breaker_window_ms: noted(int("breaker_window_ms", &self.breaker_window_ms), &mut problems),
            breaker_probe_ms: noted(int("breaker_probe_ms", &self.breaker_probe_ms), &mut problems),
            paused: None,
            // Empty: no failure notices.
            failure_url: Some(self.failure_url.trim().to_string()),
            // Absent (a form from before the setting): left as it is.
            signing_scheme: Some(self.signing_scheme.clone()).filter(|s| !s.is_empty()),
            // Empty: no chat notices.
            chat_platform: Some(self.chat_platform.trim().to_string()),
            chat_url: Some(self.chat_url.trim().to_string()),
            chat_secret: match self.chat_secret.trim() {
                _ if !self.chat_secret_remove.is_empty() => Some(String::new()),
                "" => None,
                secret => Some(secret.to_string()),
            },
        };
        (settings, problems)
    }
}

#[derive(Template)]
#[template(path = "biz_types.html")]
struct ListPage {
    ctx: Ctx,
    biz_types: Vec<BizType>,
}

impl ListPage {
    /// A callback URL as this user may see it.
    fn url(&self, url: &str) -> String {
        if self.ctx.admin { url.to_string() } else { audit::masked_url(url) }
    }
}

/// The last hour of one biz type's deliveries, counted by the dashboard's queries.
struct LastHour {
    /// Attempts answered 2xx.
    delivered: i64,
    /// Attempts that were not (no answer, or another status).
    failed: i64,
    /// Median and 99th percentile lateness (ms): how long after its due time an attempt began.
    p50_ms: Option<i32>,
    p99_ms: Option<i32>,
}

impl LastHour {
    async fn of(pool: &crate::db::Pool, biz_type_id: i32) -> Result<LastHour, sqlx::Error> {
        let (delivered, failed) = stats::last_hour_by_minute(pool)
            .await?
            .iter()
            .filter(|m| m.biz_type_id == biz_type_id)
            .fold((0, 0), |(d, f), m| (d + m.delivered, f + m.failed));
        let (p50_ms, p99_ms) = stats::lateness_last_hour(pool).await?.remove(&biz_type_id).unwrap_or((None, None));
        Ok(LastHour { delivered, failed, p50_ms, p99_ms })
    }

    /// Delivered attempts in percent of all, to one decimal; none without an attempt.
    fn rate(&self) -> Option<String> {
        let all = self.delivered + self.failed;
        (all > 0).then(|| format!("{:.1} %", self.delivered as f64 * 100.0 / all as f64))
    }

    fn p50(&self) -> String {
        Self::lateness(self.p50_ms)
    }

    fn p99(&self) -> String {
        Self::lateness(self.p99_ms)
    }

    /// As the dashboard writes lateness (`human_ms`).
    fn lateness(ms: Option<i32>) -> String {
        ms.map_or_else(|| "—".into(), |ms| super::dashboard::human_ms(i64::from(ms)))
    }
}

#[derive(Template)]
#[template(path = "biz_type.html")]
struct EditPage {
    ctx: Ctx,
    /// None: the create form.
    biz_type: Option<BizType>,
    form: Form,
    /// Each field a refused form is refused for, and why.
    errors: Vec<(String, String)>,
    tokens: Vec<TokenInfo>,
    /// Its deliveries in the last hour (none on the create form).
    last_hour: Option<LastHour>,
    /// Its receiver's breaker, if it ever opened or was slowed (`engine::breaker`).
    receiver: Option<crate::engine::breaker::State>,
    /// Flow keys whose next tasks wait (with per-key limits only).
    held: Vec<crate::tasks::HeldKey>,
    /// Shown once: a new signing secret or API token, left by the action that made it.
    revealed: Option<reveal::Revealed>,
    /// What was typed into a refused one-field form (rotate, new token): (field, value).
    typed: Option<(&'static str, String)>,
}

impl EditPage {
    /// Admins may change a biz type that is not archived.
    fn editable(&self) -> bool {
        self.ctx.admin && self.biz_type.as_ref().is_none_or(|b| b.archived_at.is_none())
    }

    fn error_for(&self, field: &str) -> &str {
        super::error_for(&self.errors, field)
    }

    fn invalid(&self, field: &str) -> String {
        super::invalid(&self.errors, field)
    }

    /// The value a one-field form shows: what was typed, if it was refused.
    fn typed_or<'a>(&'a self, field: &str, default: &'a str) -> &'a str {
        self.typed.as_ref().filter(|(f, _)| *f == field).map_or(default, |(_, v)| v)
    }

    /// Its receiver's breaker, if it is open now.
    fn receiver_down(&self) -> Option<&crate::engine::breaker::State> {
        self.receiver.as_ref().filter(|r| r.open)
    }

    /// The held keys listed are only the first ones.
    fn held_cut_short(&self) -> bool {
        self.held.len() as i64 == HELD_SHOWN
    }

    /// Until when the secret the last rotation replaced still signs, if it does now.
    fn previous_secret_until(&self) -> Option<chrono::DateTime<chrono::Utc>> {
        self.biz_type.as_ref()?.previous_secret_until.filter(|until| *until > chrono::Utc::now())
    }
}

pub async fn list(req: HttpRequest, session: Session, state: web::Data<AppState>) -> Result<HttpResponse, ConsoleError> {
    let page = ListPage { ctx: Ctx::new(&session, &req, "biz-types"), biz_types: biz_types::list_all(&state.pool).await? };
    render(StatusCode::OK, &page.ctx, &page)
}

pub async fn new(req: HttpRequest, session: Session) -> Result<HttpResponse, ConsoleError> {
    session.require_admin()?;
    let page = EditPage {
        ctx: Ctx::new(&session, &req, "biz-types"),
        biz_type: None,
        form: Form::defaults(),
        errors: vec![],
        tokens: vec![],
        last_hour: None,
        receiver: None,
        held: vec![],
        revealed: None,
        typed: None,
    };
    render(StatusCode::OK, &page.ctx, &page)
}

async fn found(state: &AppState, name: &str) -> Result<BizType, ConsoleError> {
    biz_types::by_name(&state.pool, name).await?.ok_or_else(|| ConsoleError::NotFound(format!("no biz type named `{name}`")))
}

/// A biz type's page: where every action on it leads (post/redirect/get).
fn page_of(name: &str) -> String {
    format!("/console/biz-types/{name}")
}

/// Held flow keys listed on a biz type's page.
const HELD_SHOWN: i64 = 20;

pub async fn show(req: HttpRequest, session: Session, state: web::Data<AppState>, name: web::Path<String>) -> Result<HttpResponse, ConsoleError> {
    let b = found(&state, &name).await?;
    let here = page_of(&b.name);
    let revealed = reveal::take(&req, &session, &here);
    let tokens = biz_types::list_tokens(&state.pool, b.id).await?;
    let last_hour = Some(LastHour::of(&state.pool, b.id).await?);
    let receiver = crate::engine::breaker::states(&state.pool).await?.remove(&b.id);
    let held = if b.ordered || b.flow_max_in_flight > 0 {
        crate::tasks::held_flow_keys(&state.pool, b.id, b.flow_max_in_flight, b.ordered, HELD_SHOWN).await?
    } else {
        vec![]
    };
    let page = EditPage {
        ctx: Ctx::new(&session, &req, "biz-types"),
        form: Form::of(&b, session.is_admin()),
        biz_type: Some(b),
        errors: vec![],
        tokens,
        last_hour,
        receiver,
        held,
        revealed,
        typed: None,
    };
    let mut response = render(StatusCode::OK, &page.ctx, &page)?;
    reveal::forget(&req, &mut response, &here);
    Ok(response)
}

/// The redirect after an action that made a secret: its page shows it once.
fn done_revealing(req: &HttpRequest, session: &Session, name: &str, message: &str, what: &str, secret: &str) -> HttpResponse {
    let here = page_of(name);
    let mut response = done(&here, message);
    reveal::set(req, &mut response, session, &here, what, secret);
    response
}

/// The form again, as typed, with every reason it was refused next to its field.
fn refused(
    req: &HttpRequest,
    session: &Session,
    biz_type: Option<BizType>,
    form: Form,
    problems: Problems,
    tokens: Vec<TokenInfo>,
    typed: Option<(&'static str, String)>,
) -> Result<HttpResponse, ConsoleError> {
    let name_taken = |e| match e {
        Error::Conflict(_, message) => Error::Invalid { field: "name".into(), message },
        other => other,
    };
    let errors = Problems(problems.0.into_iter().map(name_taken).collect()).by_field()?;
    // The form and its errors only: the last hour is on the page a reload leads to.
    let page = EditPage {
        ctx: Ctx::new(session, req, "biz-types"),
        biz_type,
        form,
        errors,
        tokens,
        last_hour: None,
        receiver: None,
        held: vec![],
        revealed: None,
        typed,
    };
    render(StatusCode::UNPROCESSABLE_ENTITY, &page.ctx, &page)
}

pub async fn create(req: HttpRequest, session: Session, state: web::Data<AppState>, form: web::Form<Form>) -> Result<HttpResponse, ConsoleError> {
    session.admin_form(&form.csrf)?;
    let form = form.into_inner();
    let name = form.name.trim().to_string();
    let (settings, mut problems) = form.settings();
    problems.extend(biz_types::problems(&name, None, &settings, state.callback_hosts));
    if !problems.is_empty() {
        return refused(&req, &session, None, form, Problems(problems), vec![], None);
    }
    let created = match biz_types::create_audited(&state.pool, &name, &settings, state.callback_hosts, &session.actor()).await {
        Ok(b) => b,
        Err(e) => return refused(&req, &session, None, form, e.into(), vec![], None),
    };
    let secret = created.signing_secret.expose().map_err(Error::from)?;
    Ok(done_revealing(&req, &session, &created.name, "Biz type created.", "signing secret", secret))
}

pub async fn update(
    req: HttpRequest,
    session: Session,
    state: web::Data<AppState>,
    name: web::Path<String>,
    form: web::Form<Form>,
) -> Result<HttpResponse, ConsoleError> {
    session.admin_form(&form.csrf)?;
    let current = found(&state, &name).await?;
    let mut form = form.into_inner();
    form.name = current.name.clone();
    let (settings, mut problems) = form.settings();
    problems.extend(biz_types::problems(&name, Some(&current), &settings, state.callback_hosts));
    let updated = match Problems::of(problems.into_iter().map(Some)) {
        Some(problems) => Err(problems),
        None => {
            let by = audit::By { actor: &session.actor(), action: Action::BizTypeUpdate };
            biz_types::update_audited(&state.pool, &name, &settings, state.callback_hosts, by).await.map_err(Problems::from)
        }
    };
    match updated {
        Ok(_) => Ok(done(&format!("/console/biz-types/{name}"), "Settings saved; running nodes apply them at once.")),
        Err(problems) => {
            let tokens = biz_types::list_tokens(&state.pool, current.id).await?;
            refused(&req, &session, Some(current), form, problems, tokens, None)
        }
    }
}

async fn set_paused(session: &Session, state: &AppState, name: &str, form: &CsrfForm, paused: bool) -> Result<HttpResponse, ConsoleError> {
    session.admin_form(&form.csrf)?;
    let by = audit::By { actor: &session.actor(), action: if paused { Action::BizTypePause } else { Action::BizTypeResume } };
    biz_types::update_audited(&state.pool, name, &Settings { paused: Some(paused), ..Settings::default() }, state.callback_hosts, by).await?;
    let message = if paused { "Paused: its tasks stay pending until resumed." } else { "Resumed: pending tasks are delivered again." };
    Ok(done(&format!("/console/biz-types/{name}"), message))
}

pub async fn pause(
    session: Session,
    state: web::Data<AppState>,
    name: web::Path<String>,
    form: web::Form<CsrfForm>,
) -> Result<HttpResponse, ConsoleError> {
    set_paused(&session, &state, &name, &form, true).await
}

pub async fn resume(
    session: Session,
    state: web::Data<AppState>,
    name: web::Path<String>,
    form: web::Form<CsrfForm>,
) -> Result<HttpResponse, ConsoleError> {
    set_paused(&session, &state, &name, &form, false).await
}

/// The rotate form: how many hours the replaced secret keeps signing.
#[derive(Debug, Deserialize)]
pub struct RotateForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    overlap_hours: String,
}

impl RotateForm {
    /// The overlap in seconds; empty is the default (24 h).
    fn overlap_secs(&self) -> Result<i64, Error> {
        let raw = self.overlap_hours.trim();
        if raw.is_empty() {
            return Ok(biz_types::DEFAULT_OVERLAP_SECS);
        }
        let max_hours = biz_types::MAX_OVERLAP_SECS / 3600;
        let refused = || {
            Error::invalid("overlap_hours", format!("must be a whole number of hours from 0 (the old secret stops at once) to {max_hours} (30 days)"))
        };
        let hours: i64 = raw.parse().map_err(|_| refused())?;
        let secs = hours.checked_mul(3600).ok_or_else(refused)?;
        biz_types::validate_overlap(secs).map_err(|_| refused())?;
        Ok(secs)
    }
}

pub async fn rotate_secret(
    req: HttpRequest,
    session: Session,
    state: web::Data<AppState>,
    name: web::Path<String>,
    form: web::Form<RotateForm>,
) -> Result<HttpResponse, ConsoleError> {
    session.admin_form(&form.csrf)?;
    let b = found(&state, &name).await?;
    let overlap_secs = match form.overlap_secs() {
        Ok(secs) => secs,
        Err(e) => {
            let tokens = biz_types::list_tokens(&state.pool, b.id).await?;
            return refused(
                &req,
                &session,
                Some(b.clone()),
                Form::of(&b, session.is_admin()),
                e.into(),
                tokens,
                Some(("overlap_hours", form.overlap_hours.clone())),
            );
        }
    };
    let rotated = biz_types::rotate_secret(&state.pool, b.id, overlap_secs, &session.actor()).await?;
    let message = match rotated.previous_until {
        Some(until) => format!(
            "Signing secret rotated: callbacks carry the new secret's signature and, until {}, the old one's too; give the new one to the receivers before then.",
            until.format("%Y-%m-%d %H:%M UTC")
        ),
        None => "Signing secret rotated: callbacks are signed with the new one only, at once; give it to the receivers.".to_string(),
    };
    Ok(done_revealing(&req, &session, &b.name, &message, "signing secret", &rotated.secret))
}

/// The "New token" form: what the token is for (optional).
#[derive(Debug, Deserialize)]
pub struct TokenForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    token_name: String,
}

pub async fn create_token(
    req: HttpRequest,
    session: Session,
    state: web::Data<AppState>,
    name: web::Path<String>,
    form: web::Form<TokenForm>,
) -> Result<HttpResponse, ConsoleError> {
    session.admin_form(&form.csrf)?;
    let b = found(&state, &name).await?;
    let (info, token) = match biz_types::mint_token(&state.pool, &name, Some(&form.token_name), &session.actor()).await {
        Ok(minted) => minted,
        // On this page `name` is the biz type's: the token's name has a field of its own.
        Err(Error::Invalid { field, message }) if field == "name" => {
            let tokens = biz_types::list_tokens(&state.pool, b.id).await?;
            return refused(
                &req,
                &session,
                Some(b.clone()),
                Form::of(&b, session.is_admin()),
                Error::invalid("token_name", message).into(),
                tokens,
                Some(("token_name", form.token_name.clone())),
            );
        }
        Err(e) => return Err(e.into()),
    };
    let message = match &info.name {
        Some(token_name) => format!("Token {token_name} created."),
        None => "Token created.".to_string(),
    };
    Ok(done_revealing(&req, &session, &b.name, &message, "API token", &token))
}

pub async fn revoke_token(
    session: Session,
    state: web::Data<AppState>,
    path: web::Path<(String, Uuid)>,
    form: web::Form<CsrfForm>,
) -> Result<HttpResponse, ConsoleError> {
    session.admin_form(&form.csrf)?;
    let (name, id) = path.into_inner();
    let b = found(&state, &name).await?;
    let prefix = biz_types::revoke_token(&state.pool, b.id, id, &session.actor()).await?;
    state.forget_tokens();
    Ok(done(&format!("/console/biz-types/{name}"), &format!("Token {prefix}… revoked; API calls with it are refused from now on.")))
}

/// Archives the biz type (after the button's confirmation).
pub async fn archive(
    session: Session,
    state: web::Data<AppState>,
    name: web::Path<String>,
    form: web::Form<CsrfForm>,
) -> Result<HttpResponse, ConsoleError> {
    session.admin_form(&form.csrf)?;
    let (_, _, cancelled) = biz_types::archive(&state.pool, &name, &session.actor()).await?;
    state.forget_tokens();
    Ok(done(
        &format!("/console/biz-types/{name}"),
        &format!("Archived: its tokens no longer work; {} cancelled.", super::counted(cancelled as i64, "pending task", "pending tasks")),
    ))
}

/// What a test callback came to, as its page shows it.
struct Tested {
    status_code: Option<i16>,
    duration_ms: i32,
    error: Option<String>,
    excerpt: Option<String>,
}

/// How much of the answer a test callback's message quotes.
const TEST_EXCERPT_CHARS: usize = 200;

impl Tested {
    /// Whether the receiver took the signature, as far as its status says: a 2xx accepted
    /// it, a 401 or 403 refused it (or the request); anything else says nothing about it.
    fn signature(&self) -> &'static str {
        match self.status_code {
            Some(200..=299) => "the receiver accepted it (signature accepted)",
            Some(401 | 403) => "the receiver refused it: check that it verifies with this biz type's current signing secret",
            Some(_) => "the status says nothing about the signature",
            None => "no answer",
        }
    }

    fn message(&self, url: &str) -> String {
        let answer = match self.status_code {
            Some(code) => format!("HTTP {code} in {} ms", self.duration_ms),
            None => format!("no answer after {} ms: {}", self.duration_ms, self.error.as_deref().unwrap_or("unknown error")),
        };
        let mut message = format!("Test callback to {url}: {answer}; {}.", self.signature());
        if let (Some(code), Some(error)) = (self.status_code, &self.error)
            && error != &format!("HTTP {code}")
        {
            message.push_str(&format!(" {error}."));
        }
        if let Some(excerpt) = &self.excerpt {
            let quoted: String = excerpt.chars().take(TEST_EXCERPT_CHARS).collect();
            let more = if quoted.len() < excerpt.len() { "…" } else { "" };
            message.push_str(&format!(" Answer: {quoted}{more}"));
        }
        message
    }
}

/// POSTs a signed test body to the biz type's callback URL through the engine's own
/// sending code (signature, both `v1` during a rotation, redirects, deny list, timeout).
async fn send_test(state: &AppState, b: &BizType) -> Tested {
    crate::engine::install_tls_provider();
    let biz = BizTypeConfig {
        id: b.id,
        name: b.name.clone(),
        callback_url: b.callback_url.clone(),
        timeout_ms: b.timeout_ms,
        max_attempts: b.max_attempts,
        backoff_initial_ms: b.backoff_initial_ms,
        backoff_max_ms: b.backoff_max_ms,
        max_in_flight: b.max_in_flight,
        rate_limit: b.rate_limit,
        signing_secret: b.signing_secret.clone(),
        previous_secret: b.previous_secret.clone(),
        failure_url: b.failure_url.clone(),
        breaker_threshold: b.breaker_threshold,
        breaker_window_ms: b.breaker_window_ms,
        breaker_probe_ms: b.breaker_probe_ms,
        flow_max_in_flight: b.flow_max_in_flight,
        ordered: b.ordered,
        flow_rate_limit: b.flow_rate_limit,
        weight: b.weight,
        signing_scheme: b.signing_scheme.clone(),
        updated_at: b.updated_at,
    };
    let client = match state.callback_hosts.http_client().build() {
        Ok(client) => client,
        Err(e) => return Tested { status_code: None, duration_ms: 0, error: Some(format!("no HTTP client: {e}")), excerpt: None },
    };
    let sent_at = chrono::Utc::now();
    let body = serde_json::to_vec(&serde_json::json!({"test": true, "biz_type": b.name, "sent_at": sent_at})).expect("a test body serializes");
    let headers = [("Chime-Event", "test".to_string())];
    // Each test is a message of its own.
    let id = uuid::Uuid::now_v7().to_string();
    let request = deliver::Post { url: &biz.callback_url, id: &id, headers: &headers, fired_at: sent_at, body };
    let deliver::Posted { sent, duration_ms } = deliver::post(&client, state.callback_hosts, &biz, request).await;
    Tested { status_code: sent.status_code, duration_ms, error: sent.error, excerpt: sent.excerpt }
}

/// "Send test callback": a signed test body to the callback URL, its result shown on the
/// biz type's page (post/redirect/get, as a flash message) and audited.
pub async fn test_callback(
    session: Session,
    state: web::Data<AppState>,
    name: web::Path<String>,
    form: web::Form<CsrfForm>,
) -> Result<HttpResponse, ConsoleError> {
    session.admin_form(&form.csrf)?;
    let b = found(&state, &name).await?;
    if b.mode != "callback" {
        return Err(ConsoleError::Conflict(format!("{name} is a pull biz type: it has no callback URL to test; its consumers reserve tasks")));
    }
    if b.archived_at.is_some() {
        return Err(ConsoleError::Conflict(format!("{name} is archived: nothing of it is delivered")));
    }
    let tested = send_test(&state, &b).await;
    let record = serde_json::json!({
        "callback_url": b.callback_url, "status_code": tested.status_code, "duration_ms": tested.duration_ms, "error": tested.error,
    });
    audit::record_alone(&state.pool, &session.actor(), Action::BizTypeTestCallback, &name, None, Some(record)).await?;
    Ok(done(&page_of(&name), &tested.message(&audit::masked_url(&b.callback_url))))
}
