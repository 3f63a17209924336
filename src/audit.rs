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

/// A chat webhook URL (`chat_url`) as the audit log and support staff see it: its scheme and
/// host, not the robot's key in its path or query (Slack, WeCom, DingTalk).
pub fn masked_webhook(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(u) => format!("{}://{}/…", u.scheme(), u.host_str().unwrap_or("")),
        Err(_) => "…".into(),
    }
}

/// `before` and `after` with their URL fields masked (`masked_url`, `masked_webhook`). A
/// change of the password (or the webhook's key) alone would mask to the same text, and
/// vanish from the diff: it is marked.
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
                if let Some(Value::String(url)) = fields.get_mut("chat_url") {
                    *url = masked_webhook(url);
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
        let field = "chat_url";
        if b.get(field) == a.get(field)
            && raw_before.get(field) != raw_after.get(field)
            && a.get(field).is_some_and(|u| !u.is_null())
            && let Some(Value::String(url)) = a.get_mut(field)
        {
            url.push_str(" (changed)");
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

/// The fields of a recorded object a summary leaves out: kept for the record, noise to a
/// reader (`ids`: the task ids a bulk entry listed before `task_events` held them).
const UNSHOWN: [&str; 4] = ["id", "created_at", "updated_at", "ids"];

/// The fields a reader looks for first, shown before the others (which follow by name).
const FIRST: [&str; 7] = ["name", "username", "key", "mode", "role", "cron", "callback_url"];

/// The most characters of a value a summary shows.
const SHOWN_CHARS: usize = 120;

impl Entry {
    /// What the log page says the entry did, a line each: an update's changes (`changes`);
    /// what a create recorded, on one line (`name: value · …`, a text without JSON's
    /// quotes, a list by its length); what a delete removed; nothing where nothing is
    /// recorded. (A bulk operation's entry reads as its outcome and filter: the task store
    /// knows those, `console::audit_log::summary`.)
    pub fn summary(&self) -> Vec<String> {
        match (&self.before, &self.after) {
            (Some(Value::Object(_)), Some(Value::Object(_))) => self.changes(),
            (None, Some(after)) => vec![fields(after)],
            (Some(before), None) => vec![format!("Removed: {}", fields(before))],
            (Some(before), Some(after)) => vec![format!("{} → {}", shown(before), shown(after))],
            (None, None) => vec![],
        }
    }

    /// Whether it records a bulk operation, which has a page that follows its tasks.
    pub fn is_bulk(&self) -> bool {
        matches!(self.action.as_str(), "task.bulk_replay" | "task.bulk_cancel")
    }
}

/// A recorded value as a reader reads it: a text as itself, a list by its length, any
/// other value as JSON; cut at `SHOWN_CHARS`.
fn shown(value: &Value) -> String {
    let text = match value {
        Value::String(s) => s.clone(),
        Value::Null => "none".into(),
        Value::Array(items) => format!("{} item{}", items.len(), if items.len() == 1 { "" } else { "s" }),
        other => other.to_string(),
    };
    match text.char_indices().nth(SHOWN_CHARS) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text,
    }
}

/// A recorded object's fields as `name: value · …`, those set (not null, not empty) and
/// worth reading, the ones a reader looks for first (`FIRST`); any other value as itself.
fn fields(value: &Value) -> String {
    let Value::Object(map) = value else { return shown(value) };
    let mut set: Vec<(&String, &Value)> =
        map.iter().filter(|(k, v)| !v.is_null() && v.as_str() != Some("") && !UNSHOWN.contains(&k.as_str())).collect();
    set.sort_by_key(|(k, _)| (FIRST.iter().position(|f| f == k).unwrap_or(FIRST.len()), k.as_str()));
    set.iter().map(|(k, v)| format!("{k}: {}", shown(v))).collect::<Vec<_>>().join(" · ")
}

/// What to look for in the log: texts the actor, action and target contain (empty: any;
/// the target as the page shows it, "biz_type invoices", or its name alone), entries made
/// within `[from, to)`, entries that changed one of `tasks` (their `task_events`: a key's
/// tasks, say), and entries older than `before`.
#[derive(Default)]
pub struct Search<'a> {
    pub actor: &'a str,
    pub action: &'a str,
    pub target: &'a str,
    pub from: Option<DateTime<Utc>>,
    pub to: Option<DateTime<Utc>>,
    /// None: any entry; Some: only those of these tasks (none: no entry).
    pub tasks: Option<&'a [Uuid]>,
    pub before: Option<i64>,
}

/// Up to `limit` entries matching `search`, newest first. Walks the log's primary key
/// backwards (a task's entries through `task_events`' primary key); locks nothing.
pub async fn list(pool: &Pool, search: &Search<'_>, limit: i64) -> Result<Vec<Entry>, sqlx::Error> {
    // Contains, case-insensitive: the text's own % and _ are matched as themselves.
    let like = |s: &str| (!s.trim().is_empty()).then(|| format!("%{}%", s.trim().replace('\\', "\\\\").replace('%', "\\%").replace('_', "\\_")));
    crate::db::query_as(
        "SELECT id, at, actor, action, target_type, target, before, after FROM audit_log
          WHERE ($1::text IS NULL OR actor ILIKE $1) AND ($2::text IS NULL OR action ILIKE $2)
            AND ($3::text IS NULL OR target ILIKE $3 OR target_type || ' ' || target ILIKE $3) AND ($4::bigint IS NULL OR id < $4)
            AND ($5::timestamptz IS NULL OR at >= $5) AND ($6::timestamptz IS NULL OR at < $6)
            AND ($7::uuid[] IS NULL OR id IN (SELECT audit_id FROM task_events WHERE task_id = ANY($7)))
          ORDER BY id DESC LIMIT $8",
    )
    .bind(like(search.actor))
    .bind(like(search.action))
    .bind(like(search.target))
    .bind(search.before)
    .bind(search.from)
    .bind(search.to)
    .bind(search.tasks)
    .bind(limit)
    .fetch_all(pool)
    .await
}

/// Entry `id`, or None.
pub async fn get(pool: &Pool, id: i64) -> Result<Option<Entry>, sqlx::Error> {
    crate::db::query_as("SELECT id, at, actor, action, target_type, target, before, after FROM audit_log WHERE id = $1")
        .bind(id)
        .fetch_optional(pool)
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

    fn entry(action: &str, before: Option<Value>, after: Option<Value>) -> Entry {
        let at = "2026-11-27T12:00:00Z".parse().unwrap();
        Entry { id: 7, at, actor: "user:admin".into(), action: action.into(), target_type: "x".into(), target: "y".into(), before, after }
    }

    /// Every action reads as words: a create by its fields (no JSON quotes, no ids, a list
    /// by its length), an update by its changes, a delete by what it removed.
    #[test]
    fn summaries_read_as_words_not_json() {
        let create = entry(
            "biz_type.create",
            None,
            Some(json!({"id": 3, "name": "invoices", "callback_url": "https://h/x", "rate_limit": null, "tags": [1, 2]})),
        );
        assert_eq!(create.summary(), ["name: invoices · callback_url: https://h/x · tags: 2 items"]);
        let update = entry("timer.update", Some(json!({"cron": "0 * * * *", "updated_at": 1})), Some(json!({"cron": "5 * * * *", "updated_at": 2})));
        assert_eq!(update.summary(), ["cron: \"0 * * * *\" → \"5 * * * *\""]);
        assert_eq!(entry("user.delete", Some(json!({"name": "helen", "role": "support"})), None).summary(), ["Removed: name: helen · role: support"]);
        assert_eq!(entry("token.create", None, Some(json!("chime_ab12"))).summary(), ["chime_ab12"]);
        assert_eq!(entry("user.sign_in", None, None).summary(), Vec::<String>::new());
        let long = entry("biz_type.create", None, Some(json!({"description": "é".repeat(200), "name": ""})));
        assert_eq!(long.summary()[0].chars().count(), "description: ".len() + SHOWN_CHARS + 1);
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

    #[test]
    fn records_keep_a_chat_webhooks_key_out_and_mark_its_change() {
        let before = json!({"chat_url": "https://qyapi.weixin.qq.com/cgi-bin/webhook/send?key=k-one", "name": "n"});
        let after = json!({"chat_url": "https://qyapi.weixin.qq.com/cgi-bin/webhook/send?key=k-two", "name": "n"});
        let (before, after) = masked(Some(before), Some(after));
        assert_eq!(before.unwrap()["chat_url"], "https://qyapi.weixin.qq.com/…");
        assert_eq!(after.unwrap()["chat_url"], "https://qyapi.weixin.qq.com/… (changed)");
        let (_, none) = masked(Some(json!({"chat_url": null})), Some(json!({"chat_url": null})));
        assert_eq!(none.unwrap()["chat_url"], Value::Null);
    }
}
