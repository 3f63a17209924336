//! The audit log: who changed which setting, who replayed or cancelled what.

use chrono::{DateTime, Utc};
use serde_json::Value;

use crate::db::Pool;

pub async fn record<'e>(
    db: impl sqlx::PgExecutor<'e>,
    actor: &str,
    action: &str,
    target_type: &str,
    target: &str,
    before: Option<Value>,
    after: Option<Value>,
) -> Result<(), sqlx::Error> {
    crate::db::query("INSERT INTO audit_log (actor, action, target_type, target, before, after) VALUES ($1, $2, $3, $4, $5, $6)")
        .bind(actor)
        .bind(action)
        .bind(target_type)
        .bind(target)
        .bind(before)
        .bind(after)
        .execute(db)
        .await?;
    Ok(())
}

/// One entry of the log.
#[derive(sqlx::FromRow)]
pub struct Entry {
    pub id: i64,
    pub at: DateTime<Utc>,
    pub actor: String,
    pub action: String,
    pub target_type: String,
    pub target: String,
    pub before: Option<Value>,
    pub after: Option<Value>,
}

impl Entry {
    /// The settings that changed, as `name: before → after`.
    pub fn changes(&self) -> Vec<String> {
        let (Some(Value::Object(before)), Some(Value::Object(after))) = (&self.before, &self.after) else {
            return self.after.iter().map(|a| a.to_string()).collect();
        };
        after
            .iter()
            .filter(|(k, v)| before.get(*k) != Some(*v) && *k != "updated_at")
            .map(|(k, v)| format!("{k}: {} → {v}", before.get(k).map(|b| b.to_string()).unwrap_or_else(|| "—".into())))
            .collect()
    }
}

/// What to look for in the log: texts the actor, action and target contain (empty: any),
/// and entries older than `before`.
pub struct Search<'a> {
    pub actor: &'a str,
    pub action: &'a str,
    pub target: &'a str,
    pub before: Option<i64>,
}

/// Up to `limit` entries matching `search`, newest first.
pub async fn list(pool: &Pool, search: &Search<'_>, limit: i64) -> Result<Vec<Entry>, sqlx::Error> {
    // Contains, case-insensitive: the text's own % and _ are matched as themselves.
    let like = |s: &str| (!s.trim().is_empty()).then(|| format!("%{}%", s.trim().replace('\\', "\\\\").replace('%', "\\%").replace('_', "\\_")));
    crate::db::query_as(
        "SELECT id, at, actor, action, target_type, target, before, after FROM audit_log
          WHERE ($1::text IS NULL OR actor ILIKE $1) AND ($2::text IS NULL OR action ILIKE $2)
            AND ($3::text IS NULL OR target ILIKE $3) AND ($4::bigint IS NULL OR id < $4)
          ORDER BY id DESC LIMIT $5",
    )
    .bind(like(search.actor))
    .bind(like(search.action))
    .bind(like(search.target))
    .bind(search.before)
    .bind(limit)
    .fetch_all(pool)
    .await
}

/// The entries about one target (e.g. `"task"`, a task's id) whose action is one of
/// `actions`, made at or after `since`, oldest first, at most 200: a range of
/// audit_log_target_idx.
pub async fn for_target(pool: &Pool, target_type: &str, target: &str, actions: &[&str], since: DateTime<Utc>) -> Result<Vec<Entry>, sqlx::Error> {
    crate::db::query_as(
        "SELECT id, at, actor, action, target_type, target, before, after FROM audit_log
          WHERE target_type = $1 AND target = $2 AND at >= $4 AND action = ANY($3)
          ORDER BY at, id LIMIT 200",
    )
    .bind(target_type)
    .bind(target)
    .bind(actions)
    .bind(since)
    .fetch_all(pool)
    .await
}
