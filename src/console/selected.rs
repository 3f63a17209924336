//! Cancel or replay the rows selected on the task list: each task by the rules of its own
//! page's button (the store's `cancel` and `replay`, and `tasks::replay_refused`; a
//! succeeded task, which an admin replays after its own confirm page, is skipped), each
//! audited as that button is, and one message saying how many were done and which were
//! skipped, grouped by why (a warning when any was).

use actix_web::{HttpRequest, HttpResponse, web};
use uuid::Uuid;

use super::{ConsoleError, Session, done, done_warning};

use crate::error::Error;
use crate::state::AppState;
use crate::tasks::{self, Status};

/// Most rows one form may name: a few pages of the list (50 rows each).
const MOST: usize = 200;
/// Skipped tasks the message names one by one for each reason; the rest are counted.
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
    let total = ids.len();
    let mut changed = 0;
    // The reasons in the order first met, each with the tasks skipped for it.
    let mut skipped: Vec<(String, Vec<String>)> = vec![];
    for raw in ids {
        if let Err((name, why)) = one(&session, &state, &raw, replay).await {
            match skipped.iter_mut().find(|(reason, _)| *reason == why) {
                Some((_, names)) => names.push(name),
                None => skipped.push((why, vec![name])),
            }
        } else {
            changed += 1;
        }
    }
    let verb = if replay { "Replayed" } else { "Cancelled" };
    let mut message = format!("{verb} {changed} of {total} selected task{}.", if total == 1 { "" } else { "s" });
    if skipped.is_empty() {
        return Ok(done(&back, &message));
    }
    message.push_str(&format!(" Skipped {}: ", total - changed));
    let groups: Vec<String> = skipped.iter().map(|(why, names)| format!("{} ({why})", named(names))).collect();
    message.push_str(&groups.join("; "));
    message.push('.');
    Ok(done_warning(&back, &message))
}

/// Tasks as the skip message names them: the first `NAMED`, then how many more.
fn named(names: &[String]) -> String {
    let shown = names.iter().take(NAMED).cloned().collect::<Vec<_>>().join(", ");
    match names.len() {
        n if n > NAMED => format!("{shown} and {} more", n - NAMED),
        _ => shown,
    }
}

/// Cancels or replays one selected task; otherwise the task as the message names it (its
/// key in backticks, else its id) and why it was skipped.
async fn one(session: &Session, state: &AppState, raw: &str, replay: bool) -> Result<(), (String, String)> {
    let by_id = |why: String| (raw.trim().to_string(), why);
    let id: Uuid = raw.trim().parse().map_err(|_| by_id("not a task id".into()))?;
    let task = match tasks::read(&state.pool, id).await {
        Ok(Some(task)) => task,
        Ok(None) => return Err(by_id("no such task: deleted with its partition?".into())),
        Err(e) => return Err(by_id(failed(e))),
    };
    let name = match &task.key {
        Some(key) => format!("`{key}`"),
        None => task.id.to_string(),
    };
    let skip = |why: String| (name.clone(), why);
    if replay {
        if let Some(why) = super::tasks::replay_refused(session, &task) {
            return Err(skip(why));
        }
        if task.status == Status::Succeeded {
            // An admin delivers a succeeded task again only after its own confirm page.
            return Err(skip("succeeded: replay it from its own page, which asks first".into()));
        }
        tasks::replay(&state.pool, task.biz_type_id, id, &session.actor()).await.map_err(|e| skip(failed(e)))?;
    } else {
        tasks::cancel(&state.pool, task.biz_type_id, id, &session.actor()).await.map_err(|e| skip(failed(e)))?;
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
