//! Console users. Passwords are stored as argon2 hashes only, made and checked on the
//! threads of `hashing`.

mod hashing;
pub mod oidc;
pub mod sessions;

use crate::db::Pool;
use rand::Rng;

use crate::audit::Action;
use crate::error::Error;

pub use hashing::Busy;

pub const ROLES: [&str; 2] = ["admin", "support"];

async fn hash_password(password: &str) -> String {
    hashing::hash(password.to_string()).await
}

/// The users table's CHECK on names, so that a name no user can have is refused here. A
/// name is one name in any case: unique and looked up by `lower(username)`.
fn validate_username(username: &str) -> Result<(), Error> {
    let ok_char = |c: char| c.is_ascii_alphanumeric() || "_.@-".contains(c);
    if username.is_empty()
        || username.len() > 64
        || !username.chars().all(ok_char)
        || !username.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
    {
        return Err(Error::invalid("name", "must be 1-64 letters, digits, '_', '.', '@' or '-', starting with a letter or digit"));
    }
    Ok(())
}

pub fn validate_role(role: &str) -> Result<(), Error> {
    if !ROLES.contains(&role) {
        return Err(Error::invalid("role", "must be admin or support"));
    }
    Ok(())
}

/// The one rule on passwords, wherever one is set (console, API, command line).
pub fn validate_password(password: &str) -> Result<(), Error> {
    if password.chars().count() < 8 {
        return Err(Error::invalid("password", "must be at least 8 characters"));
    }
    Ok(())
}

/// Every problem with a new user's fields, side by side (a form shows them all at once).
pub fn problems(username: &str, role: &str, password: &str) -> Vec<Error> {
    [validate_username(username), validate_role(role), validate_password(password)].into_iter().filter_map(Result::err).collect()
}

fn validate(username: &str, role: &str, password: &str) -> Result<(), Error> {
    match problems(username, role, password).into_iter().next() {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// A password made here, to be shown once (first start, a reset): 20 letters and digits,
/// about 119 bits.
pub fn generate_password() -> String {
    let mut rng = rand::rng();
    (0..20).map(|_| rng.sample(rand::distr::Alphanumeric) as char).collect()
}

/// Creates a user; returns it as lists show it. Not audited: for setups (tests); a person's
/// create is `create_audited`.
pub async fn create(pool: &Pool, username: &str, role: &str, password: &str) -> Result<UserInfo, Error> {
    create_in(&mut *pool.acquire().await?, username, role, password).await
}

/// A user's entry in the audit log: the user as lists show it, and how the password was
/// set (`how`: "given", "generated", "changed"), never the password itself. The same from
/// the API, the console and the CLI.
fn record(user: &UserInfo, how: Option<&str>) -> Option<serde_json::Value> {
    let mut value = serde_json::to_value(user).ok()?;
    if let (Some(how), serde_json::Value::Object(fields)) = (how, &mut value) {
        fields.insert("password".into(), how.into());
    }
    Some(value)
}

/// `create`, recorded in the audit log as `actor`'s (`user.create`, with how the password
/// was set: `record`) in the same transaction.
pub async fn create_audited(pool: &Pool, username: &str, role: &str, password: &str, actor: &str, how: &str) -> Result<UserInfo, Error> {
    let mut tx = pool.begin().await?;
    let user = create_in(&mut tx, username, role, password).await?;
    crate::audit::record(&mut tx, actor, Action::UserCreate, &user.name, None, record(&user, Some(how))).await?;
    tx.commit().await?;
    Ok(user)
}

async fn create_in(conn: &mut sqlx::PgConnection, username: &str, role: &str, password: &str) -> Result<UserInfo, Error> {
    validate(username, role, password)?;
    crate::db::query_as(sqlx::AssertSqlSafe(format!(
        "INSERT INTO users (username, password_hash, role) VALUES ($1, $2, $3)
         ON CONFLICT DO NOTHING RETURNING {USER_COLUMNS}"
    )))
    .bind(username)
    .bind(hash_password(password).await)
    .bind(role)
    .fetch_optional(conn)
    .await?
    // Either constraint: the name, or the same name in another case (0025).
    .ok_or_else(|| Error::key_conflict(format!("user `{username}` already exists (names are the same in any case)")))
}

/// Creates the `admin` account when there is no user at all. Returns the password when it
/// was generated here (it must be shown to the operator once).
pub async fn ensure_first_admin(pool: &Pool, configured: Option<&str>) -> Result<Option<String>, Error> {
    // Checked first so that a normal start does not pay for an argon2 hash; the INSERT
    // below still guards against two first starts racing.
    let any: bool = crate::db::query_scalar("SELECT EXISTS (SELECT 1 FROM users)").fetch_one(pool).await?;
    if any {
        return Ok(None);
    }
    let generated = configured.is_none().then(generate_password);
    let password = configured.or(generated.as_deref()).unwrap_or_default();
    validate("admin", "admin", password).map_err(|_| Error::invalid("CHIME_ADMIN_PASSWORD", "must be at least 8 characters"))?;
    let hash = hash_password(password).await;
    let mut tx = pool.begin().await?;
    let created = crate::db::query(
        "INSERT INTO users (username, password_hash, role)
         SELECT 'admin', $1, 'admin' WHERE NOT EXISTS (SELECT 1 FROM users)
         ON CONFLICT DO NOTHING",
    )
    .bind(hash)
    .execute(&mut *tx)
    .await?
    .rows_affected();
    if created == 1 {
        // Made by chime itself on its first start: audited as such, like any user created.
        let after = serde_json::json!({"name": "admin", "role": "admin", "first_start": true});
        crate::audit::record(&mut tx, crate::audit::CHIME, Action::UserCreate, "admin", None, Some(after)).await?;
    }
    tx.commit().await?;
    Ok(if created == 1 { generated } else { None })
}

/// A console user who signed in.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct User {
    pub id: i32,
    pub username: String,
    pub role: String,
}

/// What a sign-in's name and password come to.
#[derive(Debug)]
pub enum Verdict {
    Right(User),
    /// No such user, a disabled one, or the wrong password: callers cannot tell which.
    Wrong,
    /// Too many passwords are being checked; nothing was (an anonymous caller only).
    Busy,
}

/// Checks a name and password: right if the user exists, is not disabled and the password
/// is theirs. A wrong name costs an argon2 hash too, so timing does not tell names apart.
/// `anonymous` (sign-in): answered `Busy` rather than queued behind a flood (`hashing`).
pub async fn verify(pool: &Pool, username: &str, password: &str, anonymous: bool) -> Result<Verdict, Error> {
    let Ok(place) = hashing::Place::take(anonymous) else { return Ok(Verdict::Busy) };
    // A name no user can have (a NUL byte, 15 KB) is not looked up: PostgreSQL refuses NUL.
    let row: Option<(i32, String, String, String)> = if validate_username(username).is_ok() {
        crate::db::query_as("SELECT id, username, role, password_hash FROM users WHERE lower(username) = lower($1) AND NOT disabled")
            .bind(username)
            .fetch_optional(pool)
            .await?
    } else {
        None
    };
    static UNKNOWN_USER: tokio::sync::OnceCell<String> = tokio::sync::OnceCell::const_new();
    let hash = match &row {
        Some(r) => r.3.clone(),
        None => UNKNOWN_USER.get_or_init(|| hash_password("no such user")).await.clone(),
    };
    Ok(match (place.verify(password.to_string(), hash).await, row) {
        (true, Some((id, username, role, _))) => Verdict::Right(User { id, username, role }),
        _ => Verdict::Wrong,
    })
}

/// Notes that the user signed in just now (the users page shows it).
pub async fn record_sign_in(pool: &Pool, user_id: i32) -> Result<(), Error> {
    crate::db::query("UPDATE users SET last_sign_in_at = now() WHERE id = $1").bind(user_id).execute(pool).await?;
    Ok(())
}

/// Sets a signed-in user's own password (the caller checked the current one): their other
/// sessions end, as after any new password, but not `keep_session` (the token hash of the
/// session that asked), so that changing it does not sign the person out. Returns the user.
/// Recorded in the audit log as `actor`'s (`user.change_password`) in the same transaction.
pub async fn set_own_password(pool: &Pool, user_id: i32, password: &str, keep_session: &[u8], actor: &str) -> Result<UserInfo, Error> {
    validate_password(password)?;
    let hash = hash_password(password).await;
    let mut tx = pool.begin().await?;
    // Locks the user's row until the commit; a disabled user has no session to ask with.
    let user: UserInfo = crate::db::query_as(sqlx::AssertSqlSafe(format!(
        "UPDATE users SET password_hash = $2 WHERE id = $1 AND NOT disabled RETURNING {USER_COLUMNS}"
    )))
    .bind(user_id)
    .bind(hash)
    .fetch_optional(&mut *tx)
    .await?
    .ok_or_else(|| Error::invalid_state("this user was disabled or deleted meanwhile"))?;
    crate::db::query("DELETE FROM sessions WHERE user_id = $1 AND token_hash <> $2").bind(user_id).bind(keep_session).execute(&mut *tx).await?;
    crate::audit::record(&mut tx, actor, Action::UserChangePassword, &user.name, None, record(&user, Some("changed"))).await?;
    tx.commit().await?;
    Ok(user)
}

/// A console user as lists show it (never the password hash).
#[derive(Debug, Clone, serde::Serialize, sqlx::FromRow, utoipa::ToSchema)]
#[schema(as = User)]
pub struct UserInfo {
    pub name: String,
    pub role: String,
    pub disabled: bool,
    pub created_at: chrono::DateTime<chrono::Utc>,
    /// When they last signed in to the console; null: not since chime recorded it.
    pub last_sign_in_at: Option<chrono::DateTime<chrono::Utc>>,
}

const USER_COLUMNS: &str = "username AS name, role, disabled, created_at, last_sign_in_at";

pub async fn list(pool: &Pool) -> Result<Vec<UserInfo>, Error> {
    Ok(crate::db::query_as(sqlx::AssertSqlSafe(format!("SELECT {USER_COLUMNS} FROM users ORDER BY username"))).fetch_all(pool).await?)
}

/// A change to a user: `None` leaves it as it is.
#[derive(Debug, Clone, Default)]
pub struct UserChanges {
    pub role: Option<String>,
    pub password: Option<String>,
    pub disabled: Option<bool>,
}

/// Locks the named user and every enabled admin, so that two changes cannot both take
/// away the last admin; returns the user.
async fn lock_user(tx: &mut sqlx::PgConnection, username: &str) -> Result<UserInfo, Error> {
    crate::db::query("SELECT 1 FROM users WHERE role = 'admin' AND NOT disabled ORDER BY id FOR UPDATE").execute(&mut *tx).await?;
    let user: Option<UserInfo> = if validate_username(username).is_ok() {
        crate::db::query_as(sqlx::AssertSqlSafe(format!("SELECT {USER_COLUMNS} FROM users WHERE lower(username) = lower($1) FOR UPDATE")))
            .bind(username)
            .fetch_optional(&mut *tx)
            .await?
    } else {
        None
    };
    user.ok_or_else(|| Error::NotFound(format!("no user named `{}`", username.escape_debug())))
}

/// Refuses a change that leaves no enabled admin: nobody could then manage the console.
async fn keep_an_admin(tx: &mut sqlx::PgConnection, username: &str) -> Result<(), Error> {
    let admins: i64 = crate::db::query_scalar("SELECT count(*) FROM users WHERE role = 'admin' AND NOT disabled").fetch_one(&mut *tx).await?;
    if admins == 0 {
        return Err(Error::invalid_state(format!("`{username}` is the last enabled admin; make another user an admin first")));
    }
    Ok(())
}

/// A user who signs in through the OpenID Provider (`users::oidc`) gets no password: one
/// would let them in with it after the provider stopped letting them in.
async fn refuse_a_password_to_a_provider_user(tx: &mut sqlx::PgConnection, username: &str) -> Result<(), Error> {
    let provider: bool = crate::db::query_scalar("SELECT oidc_issuer IS NOT NULL FROM users WHERE lower(username) = lower($1)")
        .bind(username)
        .fetch_one(&mut *tx)
        .await?;
    if provider {
        return Err(Error::invalid_state(format!(
            "`{username}` signs in through the OpenID Provider and has no chime password; their access is the provider's to change"
        )));
    }
    Ok(())
}

/// Changes a user's role, password or disabled flag; returns the user before and after. A
/// new password or disabling signs the user out everywhere. Not audited: for setups
/// (tests); a person's change is `update_audited`.
pub async fn update(pool: &Pool, username: &str, changes: &UserChanges) -> Result<(UserInfo, UserInfo), Error> {
    update_recording(pool, username, changes, None).await
}

/// `update`, recorded in the audit log as `by`'s (an update or a password reset: the user
/// before and after, and how a new password was set, `record`) in the same transaction.
pub async fn update_audited(
    pool: &Pool,
    username: &str,
    changes: &UserChanges,
    by: crate::audit::By<'_>,
    how: Option<&str>,
) -> Result<(UserInfo, UserInfo), Error> {
    update_recording(pool, username, changes, Some((by, how))).await
}

async fn update_recording(
    pool: &Pool,
    username: &str,
    changes: &UserChanges,
    audited: Option<(crate::audit::By<'_>, Option<&str>)>,
) -> Result<(UserInfo, UserInfo), Error> {
    if let Some(role) = &changes.role {
        validate_role(role)?;
    }
    if let Some(password) = &changes.password {
        validate_password(password)?;
    }
    let mut tx = pool.begin().await?;
    let before = lock_user(&mut tx, username).await?;
    if changes.password.is_some() {
        refuse_a_password_to_a_provider_user(&mut tx, username).await?;
    }
    let hash = match changes.password.as_deref() {
        Some(password) => Some(hash_password(password).await),
        None => None,
    };
    let after: UserInfo = crate::db::query_as(sqlx::AssertSqlSafe(format!(
        "UPDATE users SET role = coalesce($2, role), password_hash = coalesce($3, password_hash), disabled = coalesce($4, disabled)
          WHERE lower(username) = lower($1) RETURNING {USER_COLUMNS}"
    )))
    .bind(username)
    .bind(&changes.role)
    .bind(hash)
    .bind(changes.disabled)
    .fetch_one(&mut *tx)
    .await?;
    keep_an_admin(&mut tx, username).await?;
    if changes.password.is_some() || after.disabled {
        crate::db::query("DELETE FROM sessions WHERE user_id = (SELECT id FROM users WHERE lower(username) = lower($1))")
            .bind(username)
            .execute(&mut *tx)
            .await?;
    }
    if let Some((by, how)) = audited {
        crate::audit::record(&mut tx, by.actor, by.action, username, record(&before, None), record(&after, how)).await?;
    }
    tx.commit().await?;
    Ok((before, after))
}

/// Deletes a user (and their sessions); returns it. Their entries in the audit log stay.
/// Recorded as `actor`'s (`user.delete`) in the same transaction.
pub async fn delete(pool: &Pool, username: &str, actor: &str) -> Result<UserInfo, Error> {
    let mut tx = pool.begin().await?;
    let user = lock_user(&mut tx, username).await?;
    crate::db::query("DELETE FROM users WHERE lower(username) = lower($1)").bind(username).execute(&mut *tx).await?;
    keep_an_admin(&mut tx, username).await?;
    crate::audit::record(&mut tx, actor, Action::UserDelete, username, record(&user, None), None).await?;
    tx.commit().await?;
    Ok(user)
}
