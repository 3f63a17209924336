//! Admin tokens: the credentials of `/api/v1/admin/` (managing biz types, their tokens and
//! console users as code). Made by `chime admin-token create`, shown once, stored as a
//! SHA-256 only, as API tokens are. They start `chime_admin_` so that a leaked one is
//! recognisable, and live in a table of their own: an API token is never an admin token,
//! nor the other way round.

use crate::audit::Action;
use crate::db::Pool;
use chrono::{DateTime, Utc};
use serde::Serialize;
use uuid::Uuid;

use crate::biz_types::{hash_token, random_base64};
use crate::error::Error;

pub const PREFIX: &str = "chime_admin_";
/// How much of a token lists show: the marker and 6 random characters.
const SHOWN: usize = PREFIX.len() + 6;

/// An admin token as lists show it: never the token itself.
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct AdminToken {
    pub id: Uuid,
    pub name: String,
    pub prefix: String,
    pub created_at: DateTime<Utc>,
    pub revoked_at: Option<DateTime<Utc>>,
}

impl AdminToken {
    /// Who the audit log names for a change made with this token.
    pub fn actor(&self) -> String {
        format!("admin-token:{} ({})", self.prefix, self.name)
    }
}

fn validate_name(name: &str) -> Result<(), Error> {
    if name.is_empty() || name.chars().count() > 64 || name.chars().any(char::is_control) {
        return Err(Error::invalid("name", "must be 1-64 characters without control characters"));
    }
    Ok(())
}

/// Makes a token named `name` (who or what will hold it); returns it as lists show it and
/// the token itself, which cannot be shown again. Recorded in the audit log as `actor`'s
/// (`admin_token.create`: its prefix) in the same transaction.
pub async fn create(pool: &Pool, name: &str, actor: &str) -> Result<(AdminToken, String), Error> {
    validate_name(name)?;
    let token = format!("{PREFIX}{}", random_base64(32));
    let mut tx = pool.begin().await?;
    let info: AdminToken = crate::db::query_as(
        "INSERT INTO admin_tokens (id, name, token_hash, prefix) VALUES ($1, $2, $3, $4)
         RETURNING id, name, prefix, created_at, revoked_at",
    )
    .bind(Uuid::now_v7())
    .bind(name)
    .bind(hash_token(&token))
    .bind(&token[..SHOWN])
    .fetch_one(&mut *tx)
    .await?;
    crate::audit::record(&mut tx, actor, Action::AdminTokenCreate, &info.name, None, Some(info.prefix.clone().into())).await?;
    tx.commit().await?;
    Ok((info, token))
}

pub async fn list(pool: &Pool) -> Result<Vec<AdminToken>, Error> {
    Ok(crate::db::query_as("SELECT id, name, prefix, created_at, revoked_at FROM admin_tokens ORDER BY created_at").fetch_all(pool).await?)
}

/// Revokes the token with this id, or the one whose prefix starts with this text (as lists
/// show it); revoking twice is harmless. Returns it. Recorded in the audit log as `actor`'s
/// (`admin_token.revoke`: its prefix) in the same transaction.
pub async fn revoke(pool: &Pool, id_or_prefix: &str, actor: &str) -> Result<AdminToken, Error> {
    if id_or_prefix.is_empty() {
        return Err(Error::invalid("token", "give the token's id or prefix (`chime admin-token list`)"));
    }
    let id = id_or_prefix.parse::<Uuid>().ok();
    let matches: Vec<AdminToken> = crate::db::query_as(
        "SELECT id, name, prefix, created_at, revoked_at FROM admin_tokens
          WHERE id = $1 OR ($1 IS NULL AND starts_with(prefix, $2))",
    )
    .bind(id)
    .bind(id_or_prefix)
    .fetch_all(pool)
    .await?;
    let token = match matches.as_slice() {
        [one] => one,
        [] => return Err(Error::NotFound(format!("no admin token has the id or prefix `{}`", id_or_prefix.escape_debug()))),
        _ => {
            return Err(Error::invalid_state(format!(
                "{} admin tokens start with `{}`; give more of the prefix, or the id (`chime admin-token list`)",
                matches.len(),
                id_or_prefix.escape_debug()
            )));
        }
    };
    let mut tx = pool.begin().await?;
    let revoked: AdminToken = crate::db::query_as(
        "UPDATE admin_tokens SET revoked_at = coalesce(revoked_at, now()) WHERE id = $1
         RETURNING id, name, prefix, created_at, revoked_at",
    )
    .bind(token.id)
    .fetch_one(&mut *tx)
    .await?;
    crate::audit::record(&mut tx, actor, Action::AdminTokenRevoke, &revoked.name, None, Some(revoked.prefix.clone().into())).await?;
    tx.commit().await?;
    Ok(revoked)
}

/// The unrevoked admin token this is, or `None`. Not cached: a revoked token is refused at once.
pub async fn authenticate(pool: &Pool, token: &str) -> Result<Option<AdminToken>, sqlx::Error> {
    if !token.starts_with(PREFIX) {
        return Ok(None);
    }
    crate::db::query_as("SELECT id, name, prefix, created_at, revoked_at FROM admin_tokens WHERE token_hash = $1 AND revoked_at IS NULL")
        .bind(hash_token(token))
        .fetch_optional(pool)
        .await
}
