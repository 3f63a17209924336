//! What the bench (`chime-bench`) writes on biz type rows beside the API: thousands of idle
//! biz types at once, as a company's shared timer service holds them (the `fairness`
//! scenario), and their removal. Nothing in the server calls these: they are here because
//! the biz types module owns every statement on `biz_types` and every signing secret.

use crate::db::Pool;
use crate::error::Error;
use crate::wake::{self, Wake};

use super::secrets;

/// Creates `count` callback biz types named `{prefix}{i}`, `i` from `first`, each with the
/// schema's default settings, `callback_url` and a signing secret of its own (sealed under
/// CHIME_SECRET_KEY when it is set, as `create` stores one), in one statement; and tells
/// every node to re-read the biz types when it commits. No token, no task: they stay idle.
/// Returns how many were created (a name already taken is skipped).
pub async fn create_idle(pool: &Pool, prefix: &str, first: u64, count: u64, callback_url: &str) -> Result<u64, Error> {
    let names: Vec<String> = (first..first + count).map(|i| format!("{prefix}{i}")).collect();
    if let Some(name) = names.last() {
        super::validate_name(name)?;
    }
    let mut tx = pool.begin().await?;
    secrets::refuse_clear_where_sealed(&mut tx).await?;
    let keyring = secrets::keyring();
    let (clear, sealed): (Vec<Option<String>>, Vec<Option<String>>) = names.iter().map(|name| keyring.store(name, &super::new_secret())).unzip();
    let done = crate::db::query(
        "INSERT INTO biz_types (name, mode, callback_url, signing_secret, signing_secret_sealed)
         SELECT n, 'callback', $2, c, s FROM unnest($1::text[], $3::text[], $4::text[]) AS u(n, c, s)
         ON CONFLICT (name) DO NOTHING",
    )
    .bind(&names)
    .bind(callback_url)
    .bind(&clear)
    .bind(&sealed)
    .execute(&mut *tx)
    .await?;
    wake::notify(&mut *tx, Wake::Settings).await?;
    tx.commit().await?;
    Ok(done.rows_affected())
}

/// Deletes the biz types whose names start with `prefix` (made by `create_idle`: no task
/// refers to them), and tells every node to re-read the biz types. Returns how many.
pub async fn delete_idle(pool: &Pool, prefix: &str) -> Result<u64, Error> {
    let mut tx = pool.begin().await?;
    let done = crate::db::query("DELETE FROM biz_types WHERE starts_with(name, $1)").bind(prefix).execute(&mut *tx).await?;
    wake::notify(&mut *tx, Wake::Settings).await?;
    tx.commit().await?;
    Ok(done.rows_affected())
}

/// How many biz types the engines deliver: by callback, neither paused nor archived.
pub async fn delivering(pool: &Pool) -> Result<i64, Error> {
    Ok(crate::db::query_scalar("SELECT count(*) FROM biz_types WHERE mode = 'callback' AND NOT paused AND archived_at IS NULL")
        .fetch_one(pool)
        .await?)
}
