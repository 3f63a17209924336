//! Console sessions (the `sessions` table): one row per signed-in browser, found by the
//! hash of its cookie's token, with the CSRF token its forms carry. The console makes the
//! tokens and cookies (`console::session`); the rows are kept here. A new password, a
//! disabled or deleted user ends theirs (`users`).

use crate::db::Pool;
use crate::error::Error;

use super::User;

/// The user signed in under the token with this hash, and the session's CSRF token: while
/// the session has not expired and the user is not disabled.
pub async fn find(pool: &Pool, token_hash: &[u8]) -> Result<Option<(User, String)>, Error> {
    let row: Option<(i32, String, String, String)> = crate::db::query_as(
        "SELECT u.id, u.username, u.role, s.csrf_token
           FROM sessions s JOIN users u ON u.id = s.user_id
          WHERE s.token_hash = $1 AND s.expires_at > now() AND NOT u.disabled",
    )
    .bind(token_hash)
    .fetch_optional(pool)
    .await?;
    Ok(row.map(|(id, username, role, csrf)| (User { id, username, role }, csrf)))
}

/// Opens a session of `hours` for the user, under the token with this hash; expired
/// sessions are cleared on the way.
pub async fn start(pool: &Pool, token_hash: &[u8], user_id: i32, csrf: &str, hours: i64) -> Result<(), Error> {
    crate::db::query("DELETE FROM sessions WHERE expires_at < now()").execute(pool).await?;
    crate::db::query("INSERT INTO sessions (token_hash, user_id, csrf_token, expires_at) VALUES ($1, $2, $3, now() + $4 * interval '1 hour')")
        .bind(token_hash)
        .bind(user_id)
        .bind(csrf)
        .bind(hours)
        .execute(pool)
        .await?;
    Ok(())
}

/// Ends the session under the token with this hash, if there is one.
pub async fn end(pool: &Pool, token_hash: &[u8]) -> Result<(), Error> {
    crate::db::query("DELETE FROM sessions WHERE token_hash = $1").bind(token_hash).execute(pool).await?;
    Ok(())
}
