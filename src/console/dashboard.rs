//! The dashboard: per biz type, the queue's state and the last hour of deliveries.

use std::collections::HashMap;

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use askama::Template;

use super::{ConsoleError, Ctx, Session, charts, render};
use crate::api::AppState;

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
    // Counts use the partial indexes (pending, failed) and the lease index (running), so
    // their cost follows the queue, not the finished history.
    // Each count stops at COUNT_CAP (shown as "100000+"), so a huge backlog cannot make
    // the page slow.
    let counts: Vec<(i32, String, bool, i64, i64, i64, i64)> = crate::db::query_as(
        "SELECT b.id, b.name, b.paused,
                (SELECT count(*) FROM (SELECT 1 FROM tasks t WHERE t.biz_type_id = b.id AND t.status = 'pending' LIMIT $1) c),
                (SELECT count(*) FROM (SELECT 1 FROM tasks t WHERE t.biz_type_id = b.id AND t.status = 'pending'
                                                              AND t.run_at < now() + interval '1 hour' LIMIT $1) c),
                (SELECT count(*) FROM (SELECT 1 FROM tasks t WHERE t.biz_type_id = b.id AND t.status = 'running' LIMIT $1) c),
                (SELECT count(*) FROM (SELECT 1 FROM tasks t WHERE t.biz_type_id = b.id AND t.status = 'failed' LIMIT $1) c)
           FROM biz_types b ORDER BY b.name",
    )
    .bind(COUNT_CAP)
    .fetch_all(pool)
    .await?;
    // The last hour of attempts, per biz type and minute (0 = this minute).
    let minutes: Vec<(i32, i32, i64, i64)> = crate::db::query_as(
        "SELECT biz_type_id,
                (extract(epoch FROM date_trunc('minute', now()) - date_trunc('minute', started_at)) / 60)::int AS ago,
                count(*) FILTER (WHERE status_code BETWEEN 200 AND 299),
                count(*) FILTER (WHERE status_code IS NULL OR status_code NOT BETWEEN 200 AND 299)
           FROM attempts
          WHERE started_at >= date_trunc('minute', now()) - interval '59 minutes' AND biz_type_id IS NOT NULL
          GROUP BY 1, 2",
    )
    .fetch_all(pool)
    .await?;
    let lateness: HashMap<i32, (Option<i32>, Option<i32>)> = crate::db::query_as::<(i32, Option<i32>, Option<i32>)>(
        "SELECT biz_type_id,
                percentile_disc(0.5) WITHIN GROUP (ORDER BY lateness_ms),
                percentile_disc(0.99) WITHIN GROUP (ORDER BY lateness_ms)
           FROM attempts
          WHERE started_at >= now() - interval '1 hour' AND lateness_ms IS NOT NULL AND biz_type_id IS NOT NULL
          GROUP BY 1",
    )
    .fetch_all(pool)
    .await?
    .into_iter()
    .map(|(id, p50, p99)| (id, (p50, p99)))
    .collect();

    let rows = counts
        .into_iter()
        .map(|(id, name, paused, pending, due_next_hour, running, failed)| {
            let mut per_minute = vec![(0i64, 0i64); 60];
            for (_, ago, ok, bad) in minutes.iter().filter(|m| m.0 == id) {
                if (0..60).contains(ago) {
                    per_minute[59 - *ago as usize] = (*ok, *bad);
                }
            }
            let (p50, p99) = lateness.get(&id).copied().unwrap_or((None, None));
            Row {
                name,
                paused,
                pending: shown(pending),
                due_next_hour: shown(due_next_hour),
                running: shown(running),
                failed: shown(failed),
                delivered_last_hour: per_minute.iter().map(|m| m.0).sum(),
                failed_last_hour: per_minute.iter().map(|m| m.1).sum(),
                lateness_p50_ms: p50,
                lateness_p99_ms: p99,
                chart: charts::minute_bars(&per_minute),
            }
        })
        .collect();
    let leader = crate::leader::current(pool).await?;
    let nodes: i64 = crate::db::query_scalar("SELECT count(*) FROM nodes WHERE heartbeat_at > now() - interval '30 seconds'").fetch_one(pool).await?;
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
