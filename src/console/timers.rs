//! Timer pages: list, create, edit, activate and deactivate, with the next fire times in
//! the timer's own zone. Changing timers is for admins.

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use askama::Template;
use chrono::Utc;
use serde::Deserialize;
use uuid::Uuid;

use super::session::CsrfForm;
use super::{ConsoleError, Ctx, Problems, Session, done, render};
use crate::audit::{self, Action};
use crate::biz_types::{self, BizType};
use crate::error::Error;
use crate::state::AppState;
use crate::tasks::{self, ListFilter, Task};
use crate::timers::{self, CreateTimer, Timer, TimerChanges};

#[derive(Debug, Default, Clone, Deserialize)]
pub struct Form {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    pub biz_type: String,
    #[serde(default)]
    pub key: String,
    #[serde(default)]
    pub cron: String,
    #[serde(default)]
    pub timezone: String,
    #[serde(default)]
    pub payload: String,
    /// Checkboxes: present when ticked.
    #[serde(default)]
    pub catch_up: Option<String>,
    #[serde(default)]
    pub active: Option<String>,
}

impl Form {
    fn of(t: &Timer) -> Form {
        Form {
            csrf: String::new(),
            biz_type: t.biz_type.clone(),
            key: t.key.clone(),
            cron: t.cron.clone(),
            timezone: t.timezone.clone(),
            payload: super::pretty_json(&t.payload),
            catch_up: t.catch_up.then(|| "on".into()),
            active: t.active.then(|| "on".into()),
        }
    }

    fn payload(&self) -> Result<Box<serde_json::value::RawValue>, Error> {
        if self.payload.trim().is_empty() {
            return Ok(serde_json::value::RawValue::NULL.to_owned());
        }
        // Parsed as a value first: that refuses what the API's parser refuses (lone surrogates).
        serde_json::from_str::<serde_json::Value>(&self.payload)
            .and_then(|value| serde_json::value::to_raw_value(&value))
            .map_err(|e| Error::invalid("payload", format!("is not valid JSON: {e}")))
    }
}

/// A timer with its next fire times, in its zone.
pub struct Listed {
    pub timer: Timer,
    pub next: Vec<String>,
}

fn listed(timer: Timer) -> Listed {
    let tz: chrono_tz::Tz = timer.timezone.parse().unwrap_or(chrono_tz::UTC);
    let next = timer.next_fire_times(Utc::now()).iter().map(|t| t.with_timezone(&tz).format("%Y-%m-%d %H:%M:%S %Z").to_string()).collect();
    Listed { timer, next }
}

#[derive(Template)]
#[template(path = "timers.html")]
struct ListPage {
    ctx: Ctx,
    timers: Vec<Listed>,
}

#[derive(Template)]
#[template(path = "timer.html")]
struct EditPage {
    ctx: Ctx,
    timer: Option<Listed>,
    form: Form,
    /// Each field a refused form is refused for, and why.
    errors: Vec<(String, String)>,
    biz_types: Vec<BizType>,
    zones: Vec<&'static str>,
    /// The timer's latest occurrences due by now, newest first (none on the create form).
    occurrences: Vec<Task>,
}

/// How many occurrences a timer's page lists, and how far back it looks for them: the
/// walk reads the biz type's tasks of that window newest first (no index leads with the
/// timer), so the window bounds it for a timer that fires rarely among many other tasks.
const OCCURRENCES: i64 = 20;
const OCCURRENCES_WINDOW: chrono::TimeDelta = chrono::TimeDelta::days(30);

/// The latest occurrences of `timer` due by now, newest first.
async fn occurrences(state: &AppState, timer: &Timer) -> Result<Vec<Task>, Error> {
    let now = Utc::now();
    let filter = ListFilter {
        timer_id: Some(timer.id),
        from: Some(now - OCCURRENCES_WINDOW),
        to: Some(now),
        newest_first: true,
        limit: OCCURRENCES,
        ..ListFilter::default()
    };
    Ok(tasks::list(&state.pool, Some(timer.biz_type_id), &filter).await?.items)
}

impl EditPage {
    fn error_for(&self, field: &str) -> &str {
        super::error_for(&self.errors, field)
    }

    fn invalid(&self, field: &str) -> String {
        super::invalid(&self.errors, field)
    }
}

pub async fn list(req: HttpRequest, session: Session, state: web::Data<AppState>) -> Result<HttpResponse, ConsoleError> {
    let all = timers::list(&state.pool, None, None, 1000).await?;
    let page = ListPage { ctx: Ctx::new(&session, &req, "timers"), timers: all.into_iter().map(listed).collect() };
    render(StatusCode::OK, &page.ctx, &page)
}

async fn edit_page(
    req: &HttpRequest,
    session: &Session,
    state: &AppState,
    timer: Option<Timer>,
    form: Form,
    errors: Vec<(String, String)>,
) -> Result<HttpResponse, ConsoleError> {
    let status = if errors.is_empty() { StatusCode::OK } else { StatusCode::UNPROCESSABLE_ENTITY };
    let occurrences = match &timer {
        Some(timer) => occurrences(state, timer).await?,
        None => vec![],
    };
    let page = EditPage {
        ctx: Ctx::new(session, req, "timers"),
        timer: timer.map(listed),
        form,
        errors,
        biz_types: biz_types::list(&state.pool).await?,
        zones: chrono_tz::TZ_VARIANTS.iter().map(|z| z.name()).collect(),
        occurrences,
    };
    render(status, &page.ctx, &page)
}

/// Each field's problem: a taken key and an over-large payload are shown at their fields.
fn field_errors(problems: Problems) -> Result<Vec<(String, String)>, ConsoleError> {
    let at_field = |e| match e {
        Error::Conflict(_, message) => Error::Invalid { field: "key".into(), message },
        Error::TooLarge(message) => Error::Invalid { field: "payload".into(), message },
        other => other,
    };
    Ok(Problems(problems.0.into_iter().map(at_field).collect()).by_field()?)
}

pub async fn new(req: HttpRequest, session: Session, state: web::Data<AppState>) -> Result<HttpResponse, ConsoleError> {
    session.require_admin()?;
    let form = Form { timezone: "UTC".into(), active: Some("on".into()), ..Form::default() };
    edit_page(&req, &session, &state, None, form, vec![]).await
}

pub async fn create(req: HttpRequest, session: Session, state: web::Data<AppState>, form: web::Form<Form>) -> Result<HttpResponse, ConsoleError> {
    session.admin_form(&form.csrf)?;
    let form = form.into_inner();
    // The biz type, the payload's JSON and the API's rules are checked side by side, so
    // that every field's problem is shown at once.
    let biz_type_id = biz_types::id_of(&state.pool, &form.biz_type).await.map_err(|_| Error::invalid("biz_type", "choose a biz type"));
    let payload = form.payload();
    let request = CreateTimer {
        biz_type: form.biz_type.clone(),
        key: form.key.trim().to_string(),
        cron: form.cron.trim().to_string(),
        timezone: Some(form.timezone.trim().to_string()).filter(|z| !z.is_empty()),
        payload: payload.as_ref().ok().cloned(),
        active: Some(form.active.is_some()),
        catch_up: Some(form.catch_up.is_some()),
    };
    let checked = request.validate(state.max_payload_bytes);
    let created = match (biz_type_id, payload, checked) {
        (Ok(biz_type_id), Ok(_), Ok(())) => timers::create(&state.pool, biz_type_id, request, &session.actor()).await.map_err(Problems::from),
        (biz_type_id, payload, checked) => Err(Problems(vec![biz_type_id.err(), payload.err(), checked.err()].into_iter().flatten().collect())),
    };
    match created {
        Ok(timer) => Ok(done(&format!("/console/timers/{}", timer.id), "Timer created.")),
        Err(problems) => edit_page(&req, &session, &state, None, form, field_errors(problems)?).await,
    }
}

async fn found(state: &AppState, raw: &str) -> Result<Timer, ConsoleError> {
    let id: Uuid = raw.parse().map_err(|_| ConsoleError::NotFound(format!("`{raw}` is not a timer id")))?;
    timers::get(&state.pool, id).await?.ok_or_else(|| ConsoleError::NotFound(format!("no timer with id {id}")))
}

pub async fn show(req: HttpRequest, session: Session, state: web::Data<AppState>, id: web::Path<String>) -> Result<HttpResponse, ConsoleError> {
    let timer = found(&state, &id).await?;
    let form = Form::of(&timer);
    edit_page(&req, &session, &state, Some(timer), form, vec![]).await
}

async fn change(session: &Session, state: &AppState, timer: &Timer, changes: TimerChanges, action: Action) -> Result<Timer, Error> {
    let by = audit::By { actor: &session.actor(), action };
    let (_, after) = timers::update(&state.pool, timer.biz_type_id, timer.id, changes, state.max_payload_bytes, by).await?;
    Ok(after)
}

pub async fn update(
    req: HttpRequest,
    session: Session,
    state: web::Data<AppState>,
    id: web::Path<String>,
    form: web::Form<Form>,
) -> Result<HttpResponse, ConsoleError> {
    session.admin_form(&form.csrf)?;
    let timer = found(&state, &id).await?;
    let form = form.into_inner();
    let result = match form.payload() {
        Ok(payload) => {
            let changes = TimerChanges {
                cron: Some(form.cron.trim().to_string()),
                timezone: Some(form.timezone.trim().to_string()),
                payload: Some(payload),
                active: Some(form.active.is_some()),
                catch_up: Some(form.catch_up.is_some()),
            };
            change(&session, &state, &timer, changes, Action::TimerUpdate).await.map_err(Problems::from)
        }
        // The payload is not JSON: the schedule is checked by the API's rules beside it.
        Err(not_json) => {
            let schedule = CreateTimer {
                biz_type: timer.biz_type.clone(),
                key: timer.key.clone(),
                cron: form.cron.trim().to_string(),
                timezone: Some(form.timezone.trim().to_string()),
                payload: None,
                active: None,
                catch_up: None,
            };
            Err(Problems(vec![Some(not_json), schedule.validate(state.max_payload_bytes).err()].into_iter().flatten().collect()))
        }
    };
    match result {
        Ok(_) => Ok(done(&format!("/console/timers/{}", timer.id), "Timer saved; occurrences not fired yet were rewritten.")),
        Err(problems) => edit_page(&req, &session, &state, Some(timer), form, field_errors(problems)?).await,
    }
}

async fn set_active(session: &Session, state: &AppState, id: &str, form: &CsrfForm, active: bool) -> Result<HttpResponse, ConsoleError> {
    session.admin_form(&form.csrf)?;
    let timer = found(state, id).await?;
    let action = if active { Action::TimerActivate } else { Action::TimerDeactivate };
    change(session, state, &timer, TimerChanges { active: Some(active), ..TimerChanges::default() }, action).await?;
    let message = if active { "Timer activated: it fires from now on." } else { "Timer deactivated: occurrences not fired yet were removed." };
    Ok(done(&format!("/console/timers/{}", timer.id), message))
}

pub async fn activate(
    session: Session,
    state: web::Data<AppState>,
    id: web::Path<String>,
    form: web::Form<CsrfForm>,
) -> Result<HttpResponse, ConsoleError> {
    set_active(&session, &state, &id, &form, true).await
}

pub async fn deactivate(
    session: Session,
    state: web::Data<AppState>,
    id: web::Path<String>,
    form: web::Form<CsrfForm>,
) -> Result<HttpResponse, ConsoleError> {
    set_active(&session, &state, &id, &form, false).await
}

pub async fn delete(
    session: Session,
    state: web::Data<AppState>,
    id: web::Path<String>,
    form: web::Form<CsrfForm>,
) -> Result<HttpResponse, ConsoleError> {
    session.admin_form(&form.csrf)?;
    let timer = found(&state, &id).await?;
    let deleted = timers::delete(&state.pool, timer.biz_type_id, timer.id, &session.actor()).await?;
    Ok(done("/console/timers", &format!("Timer `{}` deleted.", deleted.key)))
}
