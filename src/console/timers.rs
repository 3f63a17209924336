//! Timer pages: list, create, edit, activate and deactivate. Each time is shown in UTC, as
//! everywhere in the console, with the timer's own zone beside it; the cron expression is
//! read out in words; a timer whose occurrences failed says so. Changing timers is for
//! admins.

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
    /// The button offering the 6-field form of a refused 5-field cron: used instead of `cron`.
    #[serde(default)]
    pub use_cron: Option<String>,
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
            use_cron: None,
        }
    }

    /// The cron expression to use: the one offered, where its button was pressed.
    fn cron(&self) -> String {
        self.use_cron.as_deref().unwrap_or(&self.cron).trim().to_string()
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

/// A timer with its next fire times, its schedule in words and its failed occurrences.
pub struct Listed {
    pub timer: Timer,
    pub next: Vec<chrono::DateTime<Utc>>,
    tz: chrono_tz::Tz,
    /// The cron expression in words, in its zone.
    pub reading: String,
    /// Its occurrences failed or expired and not replayed.
    pub failed: i64,
}

impl Listed {
    /// A time in the timer's zone, to show beside its UTC (empty for a timer in UTC).
    pub fn local(&self, at: &chrono::DateTime<Utc>) -> String {
        if self.tz == chrono_tz::UTC {
            return String::new();
        }
        format!("{} {}", at.with_timezone(&self.tz).format("%Y-%m-%d %H:%M:%S %Z"), self.tz.name())
    }

    /// What the state badge says, and its class: an active timer whose occurrences failed
    /// is failing, not green.
    pub fn state(&self) -> (&'static str, &'static str) {
        match (self.timer.active, self.failed > 0) {
            (false, _) => ("inactive", "cancelled"),
            (true, true) => ("failing", "failed"),
            (true, false) => ("active", "succeeded"),
        }
    }
}

fn listed(timer: Timer, failed: i64) -> Listed {
    let tz: chrono_tz::Tz = timer.timezone.parse().unwrap_or(chrono_tz::UTC);
    let next = timer.next_fire_times(Utc::now());
    let reading = format!("{} ({} time)", timers::reading(&timer.cron), tz.name());
    Listed { timer, next, tz, reading, failed }
}

/// Each timer of `all` listed, with its failed occurrences (one statement for them all).
async fn listed_all(state: &AppState, all: Vec<Timer>) -> Result<Vec<Listed>, Error> {
    let biz_types: Vec<i32> = all.iter().map(|t| t.biz_type_id).collect();
    let ids: Vec<Uuid> = all.iter().map(|t| t.id).collect();
    let failed = tasks::failed_occurrences(&state.pool, &biz_types, &ids).await?;
    Ok(all
        .into_iter()
        .map(|t| {
            let failed = failed.get(&t.id).copied().unwrap_or(0);
            listed(t, failed)
        })
        .collect())
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
    /// How many of the latest finished occurrences failed or expired, one after another.
    failed_in_a_row: usize,
    /// Every finished one of them did (at least one).
    every_one_failed: bool,
    /// A refused 5-field cron's 6-field form, offered beside the error.
    offer: Option<String>,
    /// The cron expression typed, in words, if it parses.
    reading: Option<String>,
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
    let page = ListPage { ctx: Ctx::new(&session, &req, "timers"), timers: listed_all(&state, all).await? };
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
    let failed_in_a_row = occurrences
        .iter()
        .filter(|t| t.status.is_finished())
        .take_while(|t| matches!(t.status, tasks::Status::Failed | tasks::Status::Expired))
        .count();
    let every_one_failed = failed_in_a_row > 0 && failed_in_a_row == occurrences.iter().filter(|t| t.status.is_finished()).count();
    let timer = match timer {
        Some(timer) => listed_all(state, vec![timer]).await?.pop(),
        None => None,
    };
    let refused_cron = errors.iter().any(|(field, _)| field == "cron");
    let zone = Some(form.timezone.trim()).filter(|z| !z.is_empty()).unwrap_or("UTC");
    let offer = timers::six_fields(&form.cron).filter(|six| refused_cron && timers::Schedule::parse(six, "UTC").is_ok());
    let reading = timers::Schedule::parse(form.cron.trim(), zone).ok().map(|_| format!("{} ({zone} time)", timers::reading(form.cron.trim())));
    let page = EditPage {
        ctx: Ctx::new(session, req, "timers"),
        timer,
        form,
        errors,
        biz_types: biz_types::list(&state.pool).await?,
        zones: chrono_tz::TZ_VARIANTS.iter().map(|z| z.name()).collect(),
        occurrences,
        failed_in_a_row,
        every_one_failed,
        offer,
        reading,
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
    let mut form = form.into_inner();
    form.cron = form.cron();
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
    let mut form = form.into_inner();
    form.cron = form.cron();
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
