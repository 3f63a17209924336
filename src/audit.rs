//! The audit log: who changed which setting, who replayed or cancelled what.

use serde_json::Value;

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
