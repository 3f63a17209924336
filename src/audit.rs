//! The audit log: who changed which setting, who replayed or cancelled what.

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::PgConnection;
use uuid::Uuid;

use crate::db::Pool;

/// The actor of what chime does by itself: the first admin, the demo biz type and its
/// token, made on the first start.
pub const CHIME: &str = "chime";

/// The fields of a recorded object that hold URLs, which may carry `user:pass@`.
const URL_FIELDS: [&str; 2] = ["callback_url", "failure_url"];

/// `url` with the password of its `user:pass@` replaced by `•••`, for whoever may read it
/// without being an admin (support staff, the audit log); unchanged without one. Read as
/// text, so that a URL the parser would refuse is masked too.
pub fn masked_url(url: &str) -> String {
    let Some(scheme_end) = url.find("://").map(|i| i + 3) else { return url.to_string() };
    let authority_len = url[scheme_end..].find(['/', '?', '#']).unwrap_or(url.len() - scheme_end);
    let authority = &url[scheme_end..scheme_end + authority_len];
    let Some(at) = authority.rfind('@') else { return url.to_string() };
    let Some(colon) = authority[..at].find(':') else { return url.to_string() };
    format!("{}•••{}", &url[..scheme_end + colon + 1], &url[scheme_end + at..])
}

/// `text` with the password of every `scheme://user:pass@…` in it masked as `masked_url`
/// does: an attempt's error names the URL a redirect went to, which may carry one.
pub fn masked_urls(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        // The scheme: the letters just before "://".
        let start =
            rest[..at].char_indices().rev().find(|(_, c)| !(c.is_ascii_alphanumeric() || "+-.".contains(*c))).map_or(0, |(i, c)| i + c.len_utf8());
        let authority = at + 3;
        let end = rest[authority..].find(|c: char| c.is_whitespace() || "/?#)>\"'".contains(c)).map_or(rest.len(), |i| authority + i);
        out.push_str(&rest[..start]);
        out.push_str(&masked_url(&rest[start..end]));
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

/// `before` and `after` with their URL fields masked (`masked_url`). A change of the
/// password alone would mask to the same text, and vanish from the diff: it is marked.
fn masked(before: Option<Value>, after: Option<Value>) -> (Option<Value>, Option<Value>) {
    let (raw_before, raw_after) = (before.clone(), after.clone());
    let mask = |value: Option<Value>| {
        value.map(|mut value| {
            if let Value::Object(fields) = &mut value {
                for field in URL_FIELDS {
                    if let Some(Value::String(url)) = fields.get_mut(field) {
                        *url = masked_url(url);
                    }
                }
            }
            value
        })
    };
    let (before, mut after) = (mask(before), mask(after));
    if let (Some(Value::Object(raw_before)), Some(Value::Object(raw_after)), Some(Value::Object(b)), Some(Value::Object(a))) =
        (&raw_before, &raw_after, &before, &mut after)
    {
        for field in URL_FIELDS {
            let password_changed = b.get(field) == a.get(field) && raw_before.get(field) != raw_after.get(field) && a.get(field).is_some();
            if password_changed && let Some(Value::String(url)) = a.get_mut(field) {
                url.push_str(" (password changed)");
            }
        }
    }
    (before, after)
}

/// What an entry records. Stored as its dotted name (`as_str`), which the audit log page
/// shows and filters on, and which entries written before this type existed carry too.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    AdminTokenCreate,
    AdminTokenRevoke,
    BizTypeArchive,
    BizTypeCreate,
    BizTypePause,
    BizTypeResume,
    BizTypeRotateSecret,
    BizTypeSetSecret,
    BizTypeTestCallback,
    BizTypeUpdate,
    SecretsReencrypt,
    TaskBulkCancel,
    TaskBulkReplay,
    TaskCancel,
    TaskRelease,
    TaskReplay,
    TaskReschedule,
    TimerActivate,
    TimerCreate,
    TimerDeactivate,
    TimerDelete,
    TimerUpdate,
    TokenCreate,
    TokenRevoke,
    UserChangePassword,
    UserCreate,
    UserDelete,
    UserResetPassword,
    UserSignIn,
    UserSignInFailed,
    UserUpdate,
}

impl Action {
    /// The name stored in `audit_log.action`.
    pub fn as_str(self) -> &'static str {
        match self {
            Action::AdminTokenCreate => "admin_token.create",
            Action::AdminTokenRevoke => "admin_token.revoke",
            Action::BizTypeArchive => "biz_type.archive",
            Action::BizTypeCreate => "biz_type.create",
            Action::BizTypePause => "biz_type.pause",
            Action::BizTypeResume => "biz_type.resume",
            Action::BizTypeRotateSecret => "biz_type.rotate_secret",
            Action::BizTypeSetSecret => "biz_type.set_secret",
            Action::BizTypeTestCallback => "biz_type.test_callback",
            Action::BizTypeUpdate => "biz_type.update",
            Action::SecretsReencrypt => "secrets.reencrypt",
            Action::TaskBulkCancel => "task.bulk_cancel",
            Action::TaskBulkReplay => "task.bulk_replay",
            Action::TaskCancel => "task.cancel",
            Action::TaskRelease => "task.release",
            Action::TaskReplay => "task.replay",
            Action::TaskReschedule => "task.reschedule",
            Action::TimerActivate => "timer.activate",
            Action::TimerCreate => "timer.create",
            Action::TimerDeactivate => "timer.deactivate",
            Action::TimerDelete => "timer.delete",
            Action::TimerUpdate => "timer.update",
            Action::TokenCreate => "token.create",
            Action::TokenRevoke => "token.revoke",
            Action::UserChangePassword => "user.change_password",
            Action::UserCreate => "user.create",
            Action::UserDelete => "user.delete",
            Action::UserResetPassword => "user.reset_password",
            Action::UserSignIn => "user.sign_in",
            Action::UserSignInFailed => "user.sign_in_failed",
            Action::UserUpdate => "user.update",
        }
    }

    /// What kind of object its entries name as their target (`audit_log.target_type`). A
    /// biz type's tokens and secrets are recorded against the biz type; a bulk operation
    /// against the biz type's name (or "every biz type"), as a task's `task`.
    pub fn target_type(self) -> &'static str {
        match self {
            Action::AdminTokenCreate | Action::AdminTokenRevoke => "admin_token",
            Action::BizTypeArchive
            | Action::BizTypeCreate
            | Action::BizTypePause
            | Action::BizTypeResume
            | Action::BizTypeRotateSecret
            | Action::BizTypeSetSecret
            | Action::BizTypeTestCallback
            | Action::BizTypeUpdate
            | Action::SecretsReencrypt
            | Action::TokenCreate
            | Action::TokenRevoke => "biz_type",
            Action::TaskBulkCancel
            | Action::TaskBulkReplay
            | Action::TaskCancel
            | Action::TaskRelease
            | Action::TaskReplay
            | Action::TaskReschedule => "task",
            Action::TimerActivate | Action::TimerCreate | Action::TimerDeactivate | Action::TimerDelete | Action::TimerUpdate => "timer",
            Action::UserChangePassword
            | Action::UserCreate
            | Action::UserDelete
            | Action::UserResetPassword
            | Action::UserSignIn
            | Action::UserSignInFailed
            | Action::UserUpdate => "user",
        }
    }
}

impl std::fmt::Display for Action {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Who makes a change that a domain function records in its own transaction, where the
/// function serves more than one action (a timer's update, activate and deactivate).
#[derive(Debug, Clone, Copy)]
pub struct By<'a> {
    pub actor: &'a str,
    pub action: Action,
}

/// Records an action, in the transaction (or on the connection) of the change it records,
/// so that the two commit together: a failed insert undoes the change. URL fields in
/// `before` and `after` are stored masked (`masked_url`): the log is read by support
/// staff, who do not see passwords. Returns the entry's id.
pub async fn record(
    db: &mut PgConnection,
    actor: &str,
    action: Action,
    target: &str,
    before: Option<Value>,
    after: Option<Value>,
) -> Result<i64, sqlx::Error> {
    let (before, after) = masked(before, after);
    crate::db::query_scalar("INSERT INTO audit_log (actor, action, target_type, target, before, after) VALUES ($1, $2, $3, $4, $5, $6) RETURNING id")
        .bind(actor)
        .bind(action.as_str())
        .bind(action.target_type())
        .bind(target)
        .bind(before)
        .bind(after)
        .fetch_one(db)
        .await
}

/// Records an action on one task (`record`, its id the target) and the event of the task
/// that refers to it, which the task's history reads (`tasks_touched`).
pub async fn record_task(
    db: &mut PgConnection,
    actor: &str,
    action: Action,
    task: Uuid,
    before: Option<Value>,
    after: Option<Value>,
) -> Result<i64, sqlx::Error> {
    let id = record(&mut *db, actor, action, &task.to_string(), before, after).await?;
    tasks_touched(db, id, &[task]).await?;
    Ok(id)
}

/// Notes that the action of entry `audit_id` changed these tasks, now (in the transaction
/// that changed them): a row of `task_events` each, which the task's history reads. A bulk
/// operation is one entry and a row per task it changed, batch by batch.
pub async fn tasks_touched(db: &mut PgConnection, audit_id: i64, tasks: &[Uuid]) -> Result<(), sqlx::Error> {
    if tasks.is_empty() {
        return Ok(());
    }
    crate::db::query("INSERT INTO task_events (task_id, audit_id) SELECT unnest($1::uuid[]), $2").bind(tasks).bind(audit_id).execute(db).await?;
    Ok(())
}

/// Adds `fields` to the `after` of entry `id`: a bulk operation's counts, known once its
/// last batch is done, written in that batch's transaction.
pub async fn add_to_after(db: &mut PgConnection, id: i64, fields: Value) -> Result<(), sqlx::Error> {
    crate::db::query("UPDATE audit_log SET after = coalesce(after, '{}'::jsonb) || $2 WHERE id = $1").bind(id).bind(fields).execute(db).await?;
    Ok(())
}

/// Records an action that changes nothing in the database (a sign-in, a test callback), or
/// whose change is not a transaction of chime's: an entry of its own.
pub async fn record_alone(
    pool: &Pool,
    actor: &str,
    action: Action,
    target: &str,
    before: Option<Value>,
    after: Option<Value>,
) -> Result<i64, sqlx::Error> {
    let mut conn = pool.acquire().await?;
    record(&mut conn, actor, action, target, before, after).await
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

/// The most events of one task its history reads at once.
pub const TASK_EVENTS: i64 = 500;

/// The entries of the changes made to task `task` (its `task_events`) within `[since,
/// until]` (None: no bound), oldest first, at most `TASK_EVENTS`; `at` is when the change
/// was made to this task (a bulk operation's entry is written at its first batch). A range
/// of task_events' primary key, then an entry by its own each.
pub async fn of_task<'e>(
    db: impl sqlx::PgExecutor<'e>,
    task: Uuid,
    since: Option<DateTime<Utc>>,
    until: Option<DateTime<Utc>>,
) -> Result<Vec<Entry>, sqlx::Error> {
    crate::db::query_as(
        "SELECT a.id, e.at, a.actor, a.action, a.target_type, a.target, a.before, a.after
           FROM task_events e JOIN audit_log a ON a.id = e.audit_id
          WHERE e.task_id = $1 AND ($2::timestamptz IS NULL OR e.at >= $2) AND ($3::timestamptz IS NULL OR e.at <= $3)
          ORDER BY e.at, e.audit_id LIMIT $4",
    )
    .bind(task)
    .bind(since)
    .bind(until)
    .bind(TASK_EVENTS)
    .fetch_all(db)
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn masks_the_passwords_of_urls_in_text() {
        assert_eq!(
            masked_urls("redirected (307) to https://u:p@b.example/x: refused; then http://c.example/ and (ftp://v:w@d)"),
            "redirected (307) to https://u:•••@b.example/x: refused; then http://c.example/ and (ftp://v:•••@d)"
        );
        assert_eq!(masked_urls("no url here: a://"), "no url here: a://");
        assert_eq!(masked_urls("•http://u:p@h"), "•http://u:•••@h");
    }

    #[test]
    fn masks_the_password_of_a_url_only() {
        assert_eq!(masked_url("https://user:s3cret@host.example/hook?x=1"), "https://user:•••@host.example/hook?x=1");
        assert_eq!(masked_url("http://u:p:q@h:8080"), "http://u:•••@h:8080");
        assert_eq!(masked_url("https://user@host/a:b@c"), "https://user@host/a:b@c", "no password; an @ in the path is not userinfo");
        assert_eq!(masked_url("https://host:8443/hook"), "https://host:8443/hook");
        assert_eq!(masked_url(""), "");
        assert_eq!(masked_url("not a url"), "not a url");
    }

    #[test]
    fn records_mask_url_fields_and_mark_a_password_change() {
        let before = json!({"callback_url": "https://a:one@h/x", "failure_url": "https://a:one@h/f", "name": "n"});
        let after = json!({"callback_url": "https://a:two@h/x", "failure_url": "https://a:one@h/f", "name": "n"});
        let (before, after) = masked(Some(before), Some(after));
        assert_eq!(before.unwrap()["callback_url"], "https://a:•••@h/x");
        let after = after.unwrap();
        assert_eq!(after["callback_url"], "https://a:•••@h/x (password changed)");
        assert_eq!(after["failure_url"], "https://a:•••@h/f", "unchanged: not marked");
        assert!(!after.to_string().contains("one") && !after.to_string().contains("two"));
    }
}
