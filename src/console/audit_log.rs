//! The audit log: who changed which setting, who replayed or cancelled what.

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use askama::Template;
use serde::Deserialize;

use super::{ConsoleError, Ctx, Session, render};
use crate::audit::{self, Entry};
use crate::error::Error;
use crate::state::AppState;

const PAGE_SIZE: i64 = 100;

#[derive(Debug, Default, Deserialize)]
pub struct Filter {
    #[serde(default)]
    pub actor: String,
    #[serde(default)]
    pub action: String,
    #[serde(default)]
    pub target: String,
    /// Entries older than this id (the next page), as typed.
    #[serde(default)]
    pub before: String,
}

impl Filter {
    /// The `before` id; the texts searched for, which PostgreSQL must be able to hold.
    fn check(&self) -> Result<Option<i64>, Error> {
        for (field, text) in [("actor", &self.actor), ("action", &self.action), ("target", &self.target)] {
            if text.contains(char::is_control) {
                return Err(Error::invalid(field, "must not contain control characters"));
            }
        }
        match self.before.trim() {
            "" => Ok(None),
            raw => raw.parse().map(Some).map_err(|_| Error::invalid("before", "is not a page link from this log")),
        }
    }
}

#[derive(Template)]
#[template(path = "audit.html")]
struct Page {
    ctx: Ctx,
    filter: Filter,
    entries: Vec<Entry>,
    next: Option<String>,
    /// The field a refused filter is refused for, and why.
    error: Option<(String, String)>,
}

pub async fn list(req: HttpRequest, session: Session, state: web::Data<AppState>, filter: web::Query<Filter>) -> Result<HttpResponse, ConsoleError> {
    let filter = filter.into_inner();
    let before = match filter.check() {
        Ok(before) => before,
        Err(Error::Invalid { field, message }) => {
            let page = Page { ctx: Ctx::new(&session, &req, "audit"), filter, entries: vec![], next: None, error: Some((field, message)) };
            return render(StatusCode::UNPROCESSABLE_ENTITY, &page.ctx, &page);
        }
        Err(e) => return Err(e.into()),
    };
    let search = audit::Search { actor: &filter.actor, action: &filter.action, target: &filter.target, before };
    let entries = audit::list(&state.pool, &search, PAGE_SIZE).await?;
    let next = (entries.len() as i64 == PAGE_SIZE).then(|| {
        let query = url::form_urlencoded::Serializer::new(String::new())
            .append_pair("actor", &filter.actor)
            .append_pair("action", &filter.action)
            .append_pair("target", &filter.target)
            .append_pair("before", &entries.last().map(|e| e.id).unwrap_or_default().to_string())
            .finish();
        format!("/console/audit?{query}")
    });
    let page = Page { ctx: Ctx::new(&session, &req, "audit"), filter, entries, next, error: None };
    render(StatusCode::OK, &page.ctx, &page)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_postgresql_cannot_take_are_refused() {
        let filter = |actor: &str, before: &str| Filter { actor: actor.into(), before: before.into(), ..Filter::default() };
        assert!(matches!(filter("user:admin", " 42 ").check(), Ok(Some(42))));
        assert!(matches!(filter("", "").check(), Ok(None)));
        for (bad, field) in [(filter("user\0admin", ""), "actor"), (filter("", "99999999999999999999"), "before"), (filter("", "1e3"), "before")] {
            assert!(matches!(bad.check(), Err(Error::Invalid { field: f, .. }) if f == field), "{field}");
        }
    }
}
