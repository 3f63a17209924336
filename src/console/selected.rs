//! Cancel or replay the rows selected on the task list: each task by the rules of its own
//! page's button (the store's `cancel` and `replay`, and `tasks::replay_refused`; a
//! succeeded task, which an admin replays after its own confirm page, is skipped), each
//! audited as that button is, and one message saying how many were done and which were
//! skipped and why.

use actix_web::{HttpRequest, HttpResponse, web};
use uuid::Uuid;

use super::{ConsoleError, Session, done};

use crate::error::Error;
use crate::state::AppState;
use crate::tasks::{self, Status};

/// Most rows one form may name: a few pages of the list (50 rows each).
const MOST: usize = 200;
/// Skipped tasks the message names one by one; the rest are counted.
const NAMED: usize = 10;

/// The form: `csrf`, `action` (`cancel` or `replay`) and one `id` per selected row, read
/// from the body by hand since a field given many times is not a struct's field.
pub async fn apply(req: HttpRequest, session: Session, state: web::Data<AppState>, body: web::Bytes) -> Result<HttpResponse, ConsoleError> {
    let (mut csrf, mut action, mut ids) = (String::new(), String::new(), Vec::new());
    for (name, value) in url::form_urlencoded::parse(&body) {
        match name.as_ref() {
            "csrf" => csrf = value.into_owned(),
            "action" => action = value.into_owned(),
            "id" => ids.push(value.into_owned()),
            _ => {}
        }
    }
    session.check_csrf(&csrf)?;
    let replay = match action.as_str() {
        "replay" => true,
        "cancel" => false,
        _ => return Err(Error::invalid("action", "must be cancel or replay (the buttons below the list)").into()),
    };
    let back = back_to(&req);
    if ids.is_empty() {
        return Ok(done(&back, "Nothing selected: tick the rows to change, then press the button again."));
    }
    if ids.len() > MOST {
        return Err(Error::invalid("id", format!("{} rows selected; select at most {MOST} at a time", ids.len())).into());
    }
    let mut changed = 0;
    let mut skipped: Vec<(String, String)> = vec![];
    for raw in ids {
        match one(&session, &state, &raw, replay).await {
            Ok(()) => changed += 1,
            Err(why) => skipped.push((raw, why)),
        }
    }
    let verb = if replay { "Replayed" } else { "Cancelled" };
    let mut message =
        format!("{verb} {changed} of {} selected task{}.", changed + skipped.len(), if changed + skipped.len() == 1 { "" } else { "s" });
    if !skipped.is_empty() {
        let named: Vec<String> = skipped.iter().take(NAMED).map(|(id, why)| format!("{id} ({why})")).collect();
        message.push_str(&format!(" Skipped {}: {}", skipped.len(), named.join("; ")));
        if skipped.len() > NAMED {
            message.push_str(&format!("; and {} more", skipped.len() - NAMED));
        }
        message.push('.');
    }
    Ok(done(&back, &message))
}

/// Cancels or replays one selected task; the reason it was skipped otherwise.
async fn one(session: &Session, state: &AppState, raw: &str, replay: bool) -> Result<(), String> {
    let id: Uuid = raw.trim().parse().map_err(|_| "not a task id".to_string())?;
    let task = match tasks::read(&state.pool, id).await {
        Ok(Some(task)) => task,
        Ok(None) => return Err("no such task: deleted with its partition?".into()),
        Err(e) => return Err(failed(e)),
    };
    if replay {
        if let Some(why) = super::tasks::replay_refused(session, &task) {
            return Err(why);
        }
        if task.status == Status::Succeeded {
            // An admin delivers a succeeded task again only after its own confirm page.
            return Err("succeeded: replay it from its own page, which asks first".into());
        }
        tasks::replay(&state.pool, task.biz_type_id, id, &session.actor()).await.map_err(failed)?;
    } else {
        tasks::cancel(&state.pool, task.biz_type_id, id, &session.actor()).await.map_err(failed)?;
    }
    Ok(())
}

/// Why the store refused a task, as the message says it (an internal error is logged and
/// told as one).
fn failed(e: Error) -> String {
    match e {
        Error::Conflict(_, message) | Error::Invalid { message, .. } | Error::NotFound(message) | Error::Forbidden(message) => message,
        e => {
            tracing::error!(error = ?e, "a selected task could not be changed");
            "an internal error, logged; try it from its own page".into()
        }
    }
}

/// The list page the form was on (its filter and page kept), else the list.
fn back_to(req: &HttpRequest) -> String {
    req.headers()
        .get(actix_web::http::header::REFERER)
        .and_then(|r| r.to_str().ok())
        .and_then(|r| url::Url::parse(r).ok())
        .filter(|u| u.path() == "/console/tasks")
        .map(|u| match u.query() {
            Some(q) => format!("/console/tasks?{q}"),
            None => "/console/tasks".into(),
        })
        .unwrap_or_else(|| "/console/tasks".into())
}
