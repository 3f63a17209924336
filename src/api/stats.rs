//! A biz type's queue right now, for autoscalers of receivers and pull consumers: counts per
//! state, the oldest due task's age, the last minute's lateness, what is in flight. Read
//! from the database (`tasks::stats::live`), so the whole cluster's, and cheap enough to
//! poll every second.

use actix_web::{HttpResponse, web};
use chrono::{DateTime, Utc};
use serde::Serialize;
use utoipa::ToSchema;

use super::ApiError;
use super::auth::Caller;
use crate::state::AppState;
use crate::tasks::stats::{self, LIVE_CAP};

/// A biz type's queue right now.
#[derive(Serialize, ToSchema)]
#[schema(as = BizTypeStats, example = json!({
    "biz_type": "order-close",
    "at": "2026-11-27T12:00:00.123456Z",
    "count_cap": 10000,
    "counts": {"due": 42, "pending": 10000, "running": 50, "retrying": 3, "failed": 1, "expired": 0},
    "capped": ["pending"],
    "oldest_due_age_ms": 2310,
    "lateness": {"window_s": 60, "attempts": 5234, "p50_ms": 12, "p99_ms": 870},
    "in_flight": {"count": 50, "max": 50}
}))]
pub(super) struct Stats {
    biz_type: String,
    /// The database's clock when counted.
    at: DateTime<Utc>,
    /// Each count stops here: a count equal to it means at least this many.
    count_cap: i64,
    counts: Counts,
    /// The counts that reached `count_cap` (at least that many), by name.
    capped: Vec<&'static str>,
    /// How long the oldest due task has waited (now − run_at); null when none is due.
    #[schema(required = true)]
    oldest_due_age_ms: Option<i64>,
    lateness: Lateness,
    in_flight: InFlight,
}

/// Tasks per state, each exact below `count_cap`.
#[derive(Serialize, ToSchema)]
#[schema(as = BizTypeStatsCounts)]
struct Counts {
    /// Pending and due now (overdue included): waiting for a callback or a reserve.
    due: i64,
    /// Pending, due or not (retrying and due included).
    pending: i64,
    /// Leased: a callback under way, or reserved by a consumer.
    running: i64,
    /// Pending after a failed attempt, waiting for the next.
    retrying: i64,
    /// Failed for good (not replayed), within retention.
    failed: i64,
    /// Not delivered by their `expires_at` (not replayed), within retention.
    expired: i64,
}

/// Lateness (an attempt's start − the task's run_at) of the attempts that started within
/// the window, on every node, as recorded once each settled; read at most every 5 s by each
/// node, and to 3 significant digits.
#[derive(Serialize, ToSchema)]
#[schema(as = BizTypeStatsLateness)]
struct Lateness {
    /// The window: the last minute.
    window_s: i64,
    /// Attempts in it.
    attempts: i64,
    /// Null when there were none.
    #[schema(required = true)]
    p50_ms: Option<i32>,
    #[schema(required = true)]
    p99_ms: Option<i32>,
}

/// Tasks leased across the cluster (callbacks under way, reservations held) and the biz
/// type's limit on them.
#[derive(Serialize, ToSchema)]
#[schema(as = BizTypeStatsInFlight)]
struct InFlight {
    /// The same as `counts.running`.
    count: i64,
    /// `max_in_flight`: whole cluster.
    max: i32,
}

#[utoipa::path(
    get,
    path = "/api/v1/biz-types/{name}/stats",
    operation_id = "getBizTypeStats",
    tag = "tasks",
    summary = r#"A biz type's queue right now"#,
    description = r#"Counts of the biz type's tasks per state (due now, pending, running, retrying, failed, expired), each exact up to `count_cap` (10,000) and named in `capped` when it reached it; how long the oldest due task has waited; the median and 99th percentile lateness of the last minute's attempts (to 3 significant digits, read at most every 5 s by each node); and what is in flight against `max_in_flight`. Read from the database, so the whole cluster's, whichever node answers. Made for autoscalers of receivers and pull consumers: cheap enough to poll every second (each count is bounded, whatever the history)."#,
    params(
        ("name" = String, Path, description = r#"The biz type's name; must be the token's biz type."#, pattern = r#"^[a-z0-9][a-z0-9_-]{0,63}$"#)
    ),
    responses(
        (status = 200, description = r#"The biz type's queue."#, body = Stats),
        (status = 401, response = super::error::Unauthenticated),
        (status = 403, description = r#"`name` is another biz type than the token's. Also: the token's biz type is archived, or the token is an admin token (which acts only on `/api/v1/admin/`)."#, body = super::error::Error, example = json!({"error": {"code": "permission_denied", "message": "this token belongs to biz type `order-close`, not `coupon-expiry`"}})),
        (status = 404, description = r#"No biz type has this name."#, body = super::error::Error, example = json!({"error": {"code": "not_found", "message": "no biz type named `billing`"}})),
        (status = 500, response = super::error::Internal),
        (status = 503, response = super::error::Unavailable)
    ),
    security(("bearerAuth" = []))
)]
pub async fn get(caller: Caller, state: web::Data<AppState>, name: web::Path<String>) -> Result<HttpResponse, ApiError> {
    caller.require(&state, &name).await?;
    let live = stats::live(&state.pool, caller.0.biz_type_id, &state.stats_floor, &state.stats_lateness)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("no biz type named `{}`", name.escape_debug())))?;
    let counts =
        Counts { due: live.due, pending: live.pending, running: live.running, retrying: live.retrying, failed: live.failed, expired: live.expired };
    let capped = [
        ("due", counts.due),
        ("pending", counts.pending),
        ("running", counts.running),
        ("retrying", counts.retrying),
        ("failed", counts.failed),
        ("expired", counts.expired),
    ]
    .into_iter()
    .filter(|&(_, n)| n >= LIVE_CAP)
    .map(|(name, _)| name)
    .collect();
    let answer = Stats {
        biz_type: caller.0.biz_type.clone(),
        at: live.at,
        count_cap: LIVE_CAP,
        capped,
        oldest_due_age_ms: live.oldest_due_age_ms,
        lateness: Lateness { window_s: 60, attempts: live.lateness.attempts, p50_ms: live.lateness.p50_ms, p99_ms: live.lateness.p99_ms },
        in_flight: InFlight { count: live.running, max: live.max_in_flight },
        counts,
    };
    Ok(HttpResponse::Ok().insert_header(("Cache-Control", "no-store")).json(answer))
}
