//! The dashboard: per biz type, the queue's state and the last hour of deliveries, the biz
//! types needing attention first (`needs_attention`, the rule the page states). Each row's
//! chart is drawn to its own busiest minute, or every row to one scale (`?scale=shared`).

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use askama::Template;
use chrono::DurationRound;

use super::{ConsoleError, Ctx, Session, charts, render};
use crate::engine::breaker;
use crate::state::AppState;
use crate::tasks::stats;

/// Counts on the dashboard stop one past the task list's cap, and read as its count does:
/// "1,234", or "10,000+". Measured with 1,000,000 tasks (a quarter pending, 100,000 in one
/// biz type): stopping at 100,000 the counts took 420 ms; at 10,000, 87 to 130 ms (debug build,
/// a shared 2-core machine).
const COUNT_CAP: i64 = crate::tasks::COUNT_CAP + 1;

/// A biz type whose p99 lateness over the last `LATE_MINUTES` is above this needs attention.
const LATE_MS: i32 = 5_000;

/// Lateness counts toward attention over this many minutes: long enough that a backlog is
/// not missed between two refreshes, short enough that the mark clears soon after it is
/// gone (over the hour, it stayed an hour).
const LATE_MINUTES: i32 = 5;

/// A count as shown: exact up to the list's cap, "10,000+" past it.
fn shown(n: i64) -> String {
    super::tasks::shown_count(n)
}

/// A duration in milliseconds as a person reads it: "840 ms", "4.2 s", "38 s", "2.5 min",
/// "12 min", "1.3 h", "30 h". Two significant figures at most below 10 of a unit, whole
/// units above; the unit changes where rounding would otherwise show "10.0 s" or "60 s".
pub fn human_ms(ms: i64) -> String {
    let sign = if ms < 0 { "-" } else { "" };
    let a = ms.unsigned_abs() as f64;
    let text = if a < 1_000.0 {
        format!("{a} ms")
    } else if a < 9_950.0 {
        format!("{:.1} s", a / 1_000.0)
    } else if a < 59_500.0 {
        format!("{:.0} s", a / 1_000.0)
    } else if a < 597_000.0 {
        format!("{:.1} min", a / 60_000.0)
    } else if a < 3_570_000.0 {
        format!("{:.0} min", a / 60_000.0)
    } else if a < 35_820_000.0 {
        format!("{:.1} h", a / 3_600_000.0)
    } else {
        format!("{:.0} h", a / 3_600_000.0)
    };
    format!("{sign}{text}")
}

pub struct Row {
    pub name: String,
    pub paused: bool,
    /// Its receiver's breaker is open: since when (`engine::breaker`).
    pub receiver_down: Option<chrono::DateTime<chrono::Utc>>,
    /// A receiver's Retry-After holds its claims until then.
    pub slowed_until: Option<chrono::DateTime<chrono::Utc>>,
    pub pending: String,
    pub retrying: String,
    pub due_next_hour: String,
    pub running: String,
    pub failed: String,
    pub expired: String,
    pub delivered_last_hour: i64,
    pub failed_last_hour: i64,
    pub lateness_p50: Option<String>,
    pub lateness_p99: Option<String>,
    /// The last hour's p99 lateness was over `LATE_MS` (shown red; past, so no attention).
    pub was_late: bool,
    /// Why this biz type needs attention (empty: it does not).
    pub attention: Vec<String>,
    pub chart: String,
    /// "peak 312/min at 14:05 UTC", or that there was no attempt.
    pub peak: String,
}

/// Why a biz type needs attention, by the rule the page states: what is wrong now, so that
/// the mark clears once the cause is gone. Its receiver down (the breaker open), failed or
/// expired tasks, retrying tasks, or p99 lateness over `LATE_MS` in the last
/// `LATE_MINUTES` (`recent_p99`). The last hour's failed attempts and lateness are
/// history: the row shows them, but a biz type whose failed tasks were replayed and
/// delivered needs nothing more.
fn needs_attention(c: &stats::QueueCounts, receiver_down: bool, recent_p99: Option<i32>) -> Vec<String> {
    let mut why = vec![];
    if receiver_down {
        why.push("receiver down".to_string());
    }
    if c.failed > 0 {
        why.push(format!("{} failed", shown(c.failed)));
    }
    if c.expired > 0 {
        why.push(format!("{} expired", shown(c.expired)));
    }
    if c.retrying > 0 {
        why.push(format!("{} retrying", shown(c.retrying)));
    }
    if let Some(p99) = recent_p99.filter(|p| *p > LATE_MS) {
        why.push(format!("p99 lateness {} in the last {LATE_MINUTES} min", human_ms(p99.into())));
    }
    why
}

#[derive(Template)]
#[template(path = "dashboard.html")]
struct Page {
    ctx: Ctx,
    rows: Vec<Row>,
    /// The leader's host name and pid, or its id once it is no longer registered.
    leader: Option<String>,
    nodes: i64,
    /// Every row's chart drawn to one scale (`?scale=shared`), not each to its own.
    shared: bool,
    /// The busiest minute of any biz type: the one scale.
    scale: i64,
    late: String,
    late_minutes: i32,
    /// The count's cap, as written ("10,000").
    cap: String,
}

#[derive(serde::Deserialize)]
pub struct Query {
    /// "shared": every row's chart to one scale.
    #[serde(default)]
    scale: String,
}

pub async fn show(req: HttpRequest, session: Session, state: web::Data<AppState>, query: web::Query<Query>) -> Result<HttpResponse, ConsoleError> {
    let pool = &state.pool;
    // Side by side on their own connections: the page takes as long as the slowest read
    // (the counts, under a backlog), not their sum.
    let (counts, minutes, lateness, recent, leader, registered, nodes, breakers) = tokio::try_join!(
        stats::queue_counts(pool, COUNT_CAP),
        stats::last_hour_by_minute(pool),
        stats::lateness_last_hour(pool),
        stats::lateness_p99_recent(pool, LATE_MINUTES),
        crate::leader::current(pool),
        crate::nodes::list(pool),
        crate::nodes::live(pool),
        breaker::states(pool),
    )?;
    let leader = leader.map(|id| crate::nodes::name_of(&registered, id));
    let shared = query.scale == "shared";
    let scale = minutes.iter().filter(|m| (0..60).contains(&m.ago)).map(|m| m.delivered + m.failed).max().unwrap_or(0);
    // The chart's time axis ends at this minute (the bars' minutes are the database's).
    let now = minutes
        .iter()
        .map(|m| m.minute + chrono::Duration::minutes(m.ago.into()))
        .max()
        .unwrap_or_else(|| chrono::Utc::now().duration_trunc(chrono::TimeDelta::minutes(1)).unwrap_or_else(|_| chrono::Utc::now()));

    let mut rows: Vec<Row> = counts
        .into_iter()
        .map(|c| {
            let mut per_minute = vec![(0i64, 0i64); 60];
            let mut peak: Option<&stats::Minute> = None;
            for m in minutes.iter().filter(|m| m.biz_type_id == c.biz_type_id && (0..60).contains(&m.ago)) {
                per_minute[59 - m.ago as usize] = (m.delivered, m.failed);
                // The busiest minute; the latest of equals.
                if peak.is_none_or(|p| {
                    m.delivered + m.failed > p.delivered + p.failed || (m.delivered + m.failed == p.delivered + p.failed && m.ago < p.ago)
                }) {
                    peak = Some(m);
                }
            }
            let (p50, p99) = lateness.get(&c.biz_type_id).copied().unwrap_or((None, None));
            let failed_last_hour = per_minute.iter().map(|m| m.1).sum();
            let receiver = breakers.get(&c.biz_type_id);
            let receiver_down = receiver.filter(|r| r.open).and_then(|r| r.opened_at);
            Row {
                attention: needs_attention(&c, receiver_down.is_some(), recent.get(&c.biz_type_id).copied()),
                was_late: p99.is_some_and(|p| p > LATE_MS),
                name: c.name,
                paused: c.paused,
                receiver_down,
                slowed_until: receiver.and_then(|r| r.slowed_until),
                pending: shown(c.pending),
                retrying: shown(c.retrying),
                due_next_hour: shown(c.due_next_hour),
                running: shown(c.running),
                failed: shown(c.failed),
                expired: shown(c.expired),
                delivered_last_hour: per_minute.iter().map(|m| m.0).sum(),
                failed_last_hour,
                lateness_p50: p50.map(|p| human_ms(p.into())),
                lateness_p99: p99.map(|p| human_ms(p.into())),
                chart: charts::minute_bars(&per_minute, if shared { scale } else { 0 }, now),
                peak: match peak {
                    Some(m) => format!("peak {}/min at {} UTC", m.delivered + m.failed, m.minute.format("%H:%M")),
                    None => "no attempt in the last hour".into(),
                },
            }
        })
        .collect();
    // Needing attention first, by name within each group (the counts come by name): rows
    // keep their places from one refresh to the next unless their state changes.
    rows.sort_by_key(|r| r.attention.is_empty());
    let page = Page {
        ctx: Ctx::new(&session, &req, "dashboard"),
        rows,
        leader,
        nodes,
        shared,
        scale,
        late: human_ms(LATE_MS.into()),
        late_minutes: LATE_MINUTES,
        cap: shown(crate::tasks::COUNT_CAP),
    };
    render(StatusCode::OK, &page.ctx, &page)
}

#[cfg(test)]
mod tests {
    use super::human_ms;

    fn counts() -> crate::tasks::stats::QueueCounts {
        crate::tasks::stats::QueueCounts {
            biz_type_id: 1,
            name: "orders".into(),
            paused: false,
            pending: 3,
            retrying: 0,
            due_next_hour: 3,
            running: 0,
            failed: 0,
            expired: 0,
        }
    }

    #[test]
    fn attention_is_what_is_wrong_now() {
        let fine = counts();
        assert!(super::needs_attention(&fine, false, None).is_empty());
        assert!(super::needs_attention(&fine, false, Some(5_000)).is_empty(), "5 s is not over 5 s");
        assert_eq!(super::needs_attention(&fine, false, Some(12_000)), ["p99 lateness 12 s in the last 5 min"]);
        let stuck = super::stats::QueueCounts { failed: 2, expired: 1, retrying: 1, ..counts() };
        assert_eq!(super::needs_attention(&stuck, true, None), ["receiver down", "2 failed", "1 expired", "1 retrying"]);
    }

    #[test]
    fn counts_stop_at_the_cap() {
        assert_eq!(super::shown(9_999), "9,999");
        assert_eq!(super::shown(10_000), "10,000");
        assert_eq!(super::shown(super::COUNT_CAP), "10,000+");
    }

    #[test]
    fn durations_read_in_the_unit_that_fits() {
        for (ms, text) in [
            (0, "0 ms"),
            (7, "7 ms"),
            (999, "999 ms"),
            (1_000, "1.0 s"),
            (4_249, "4.2 s"),
            (9_949, "9.9 s"),
            (9_950, "10 s"),
            (38_400, "38 s"),
            (59_499, "59 s"),
            (59_500, "1.0 min"),
            (150_000, "2.5 min"),
            (596_999, "9.9 min"),
            (597_000, "10 min"),
            (3_569_999, "59 min"),
            (3_570_000, "1.0 h"),
            (4_680_000, "1.3 h"),
            (35_820_000, "10 h"),
            (108_000_000, "30 h"),
            (i32::MAX as i64, "597 h"),
            (-1_500, "-1.5 s"),
        ] {
            assert_eq!(human_ms(ms), text, "{ms} ms");
        }
    }
}
