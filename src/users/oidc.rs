//! Users who sign in through the OpenID Provider (`crate::oidc`), and the sign-ins under
//! way (the `oidc_sign_ins` table). Such a user is made at their first sign-in, tied to the
//! provider's issuer and subject (`sub`), and their role is set from the provider's groups
//! at every sign-in. They have no password: `password_hash` holds `NO_PASSWORD`, which no
//! password verifies, so the password form never signs them in (a reset password would).

use crate::audit::Action;
use crate::db::Pool;
use crate::error::Error;

use super::User;

/// The `password_hash` of a user made by a sign-in through the provider: not a PHC string,
/// so that `hashing` verifies no password against it.
pub const NO_PASSWORD: &str = "!oidc";

/// A sign-in under way, as its callback takes it back.
#[derive(Debug)]
pub struct Pending {
    pub nonce: String,
    pub pkce_verifier: String,
    pub next: String,
}

/// At most this many sign-ins under way at once: anyone may start one, and each is a row
/// until it expires, so the table is bounded (a few MB) however fast they come.
const MOST_UNDER_WAY: i64 = 10_000;

/// Records a sign-in sent to the provider, for `minutes`; expired ones are cleared on the
/// way. False, recording nothing, when `MOST_UNDER_WAY` are already under way (two
/// starting at once may both pass the count: the bound is loose by that much).
pub async fn begin(pool: &Pool, state: &str, pending: &Pending, minutes: i32) -> Result<bool, Error> {
    crate::db::query("DELETE FROM oidc_sign_ins WHERE expires_at < now()").execute(pool).await?;
    let recorded = crate::db::query(
        "INSERT INTO oidc_sign_ins (state, nonce, pkce_verifier, next, expires_at)
         SELECT $1, $2, $3, $4, now() + $5 * interval '1 minute' WHERE (SELECT count(*) FROM oidc_sign_ins) < $6",
    )
    .bind(state)
    .bind(&pending.nonce)
    .bind(&pending.pkce_verifier)
    .bind(&pending.next)
    .bind(minutes)
    .bind(MOST_UNDER_WAY)
    .execute(pool)
    .await?;
    Ok(recorded.rows_affected() == 1)
}

/// Takes the sign-in under `state` back, once: the row is deleted, so a second callback
/// with the same state (a replay) finds none. None when there is none or it expired.
pub async fn take(pool: &Pool, state: &str) -> Result<Option<Pending>, Error> {
    Ok(crate::db::query_as("DELETE FROM oidc_sign_ins WHERE state = $1 RETURNING nonce, pkce_verifier, next, expires_at > now() AS live")
        .bind(state)
        .fetch_optional(pool)
        .await?
        .and_then(|(nonce, pkce_verifier, next, live): (String, String, String, bool)| live.then_some(Pending { nonce, pkce_verifier, next })))
}

/// What a sign-in through the provider came to.
#[derive(Debug)]
pub enum Outcome {
    /// Signed in as this user (made now, when `created`).
    SignedIn { user: User, created: bool },
    /// The user this identity made was disabled in chime.
    Disabled(String),
    /// The name is another user's (a local one, or another identity's).
    NameTaken(String),
}

/// Signs in the identity (`issuer`, `subject`) with the role its groups give: the user it
/// made before, its role set again, or a new user named `username`. Recorded in the audit
/// log with the subject, in the same transaction: `user.create` for a new user,
/// `user.update` for a changed role, `user.sign_in`.
pub async fn sign_in(pool: &Pool, issuer: &str, subject: &str, username: &str, role: &str) -> Result<Outcome, Error> {
    let mut tx = pool.begin().await?;
    let identity = serde_json::json!({"oidc_issuer": issuer, "oidc_subject": subject});
    // Locks this identity's user, if it has one, until the commit.
    let found: Option<(i32, String, String, bool)> =
        crate::db::query_as("SELECT id, username, role, disabled FROM users WHERE oidc_issuer = $1 AND oidc_subject = $2 FOR UPDATE")
            .bind(issuer)
            .bind(subject)
            .fetch_optional(&mut *tx)
            .await?;
    let (user, created, role) = match found {
        Some((_, name, _, true)) => return Ok(Outcome::Disabled(name)),
        Some((id, name, old_role, false)) => {
            // The groups would take away the last enabled admin: nobody could then manage
            // the console (as `users::update` refuses). The user stays an admin until
            // another is made one. Locks every enabled admin, as `users::lock_user` does.
            let role = if old_role == "admin" && role != "admin" && !another_admin(&mut tx, id).await? {
                tracing::warn!(
                    user = %name,
                    groups_role = role,
                    "the provider's groups no longer make this user an admin, but they are the last enabled admin:                      they stay an admin until another user is made one"
                );
                "admin"
            } else {
                role
            };
            if old_role != role {
                crate::db::query("UPDATE users SET role = $2 WHERE id = $1").bind(id).bind(role).execute(&mut *tx).await?;
                let before = serde_json::json!({"name": name, "role": old_role});
                let after = serde_json::json!({"name": name, "role": role, "oidc_subject": subject, "why": "the provider's groups"});
                crate::audit::record(&mut tx, &format!("user:{name}"), Action::UserUpdate, &name, Some(before), Some(after)).await?;
            }
            (User { id, username: name, role: role.to_string() }, false, role)
        }
        None => {
            super::validate_username(username)?;
            // Either name constraint (the same name in another case too) leaves it to its owner.
            let id: Option<i32> = crate::db::query_scalar(
                "INSERT INTO users (username, password_hash, role, oidc_issuer, oidc_subject) VALUES ($1, $2, $3, $4, $5)
                 ON CONFLICT DO NOTHING RETURNING id",
            )
            .bind(username)
            .bind(NO_PASSWORD)
            .bind(role)
            .bind(issuer)
            .bind(subject)
            .fetch_optional(&mut *tx)
            .await?;
            let Some(id) = id else { return Ok(Outcome::NameTaken(username.to_string())) };
            let mut after = serde_json::json!({"name": username, "role": role, "password": "none: signs in through the provider"});
            after.as_object_mut().expect("an object").extend(identity.as_object().expect("an object").clone());
            crate::audit::record(&mut tx, &format!("user:{username}"), Action::UserCreate, username, None, Some(after)).await?;
            (User { id, username: username.to_string(), role: role.to_string() }, true, role)
        }
    };
    crate::db::query("UPDATE users SET last_sign_in_at = now() WHERE id = $1").bind(user.id).execute(&mut *tx).await?;
    let mut after = identity;
    after["role"] = role.into();
    crate::audit::record(&mut tx, &format!("user:{}", user.username), Action::UserSignIn, &user.username, None, Some(after)).await?;
    tx.commit().await?;
    Ok(Outcome::SignedIn { user, created })
}

/// Whether an enabled admin other than user `id` remains; locks every enabled admin until
/// the commit, so that two demotions cannot both take away the last one.
async fn another_admin(tx: &mut sqlx::PgConnection, id: i32) -> Result<bool, Error> {
    let admins: Vec<i32> =
        crate::db::query_scalar("SELECT id FROM users WHERE role = 'admin' AND NOT disabled ORDER BY id FOR UPDATE").fetch_all(&mut *tx).await?;
    Ok(admins.iter().any(|admin| *admin != id))
}
