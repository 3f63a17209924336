//! The dashboard: per biz type, the queue's state and the last hour of deliveries.

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use askama::Template;

use super::{ConsoleError, Ctx, Session, charts, render};
use crate::state::AppState;
use crate::tasks::stats;

/// Counts on the dashboard stop here.
const COUNT_CAP: i64 = 100_000;

/// A count as shown: exact below the cap, "100000+" at it.
fn shown(n: i64) -> String {
    if n >= COUNT_CAP { format!("{COUNT_CAP}+") } else { n.to_string() }
}

pub struct Row {
    pub name: String,
    pub paused: bool,
    pub pending: String,
    pub due_next_hour: String,
    pub running: String,
    pub failed: String,
    pub expired: String,
    pub delivered_last_hour: i64,
    pub failed_last_hour: i64,
    pub lateness_p50_ms: Option<i32>,
    pub lateness_p99_ms: Option<i32>,
    pub chart: String,
}

#[derive(Template)]
#[template(path = "dashboard.html")]
struct Page {
    ctx: Ctx,
    rows: Vec<Row>,
    leader: Option<uuid::Uuid>,
    nodes: i64,
}

pub async fn show(req: HttpRequest, session: Session, state: web::Data<AppState>) -> Result<HttpResponse, ConsoleError> {
    let pool = &state.pool;
    let counts = stats::queue_counts(pool, COUNT_CAP).await?;
    let minutes = stats::last_hour_by_minute(pool).await?;
    let lateness = stats::lateness_last_hour(pool).await?;

    let rows = counts
        .into_iter()
        .map(|c| {
            let mut per_minute = vec![(0i64, 0i64); 60];
            for m in minutes.iter().filter(|m| m.biz_type_id == c.biz_type_id) {
                if (0..60).contains(&m.ago) {
                    per_minute[59 - m.ago as usize] = (m.delivered, m.failed);
                }
            }
            let (p50, p99) = lateness.get(&c.biz_type_id).copied().unwrap_or((None, None));
            Row {
                name: c.name,
                paused: c.paused,
                pending: shown(c.pending),
                due_next_hour: shown(c.due_next_hour),
                running: shown(c.running),
                failed: shown(c.failed),
                expired: shown(c.expired),
                delivered_last_hour: per_minute.iter().map(|m| m.0).sum(),
                failed_last_hour: per_minute.iter().map(|m| m.1).sum(),
                lateness_p50_ms: p50,
                lateness_p99_ms: p99,
                chart: charts::minute_bars(&per_minute),
            }
        })
        .collect();
    let leader = crate::leader::current(pool).await?;
    let nodes = crate::nodes::live(pool).await?;
    let page = Page { ctx: Ctx::new(&session, &req, "dashboard"), rows, leader, nodes };
    render(StatusCode::OK, &page.ctx, &page)
}

#[cfg(test)]
mod tests {
    #[test]
    fn counts_stop_at_the_cap() {
        assert_eq!(super::shown(99_999), "99999");
        assert_eq!(super::shown(100_000), "100000+");
    }
}
