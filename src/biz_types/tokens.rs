//! API tokens and signing secrets. A token is shown once when created; only its SHA-256 is
//! stored, so a leaked database does not leak working tokens.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use rand::RngCore;
use sha2::{Digest, Sha256};
use sqlx::PgPool;
use uuid::Uuid;

use crate::error::Error;

/// What a valid bearer token grants: acting on one biz type.
#[derive(Debug, Clone)]
pub struct TokenAuth {
    pub biz_type_id: i32,
    pub biz_type: String,
    pub create_rate_limit: Option<f64>,
}

fn random_base64(bytes: usize) -> String {
    let mut buf = vec![0u8; bytes];
    rand::rng().fill_bytes(&mut buf);
    URL_SAFE_NO_PAD.encode(buf)
}

pub fn new_secret() -> String {
    format!("whsec_{}", random_base64(32))
}

fn hash(token: &str) -> Vec<u8> {
    Sha256::digest(token.as_bytes()).to_vec()
}

/// Creates a token for the named biz type and returns it; it cannot be shown again.
pub async fn create_token(pool: &PgPool, biz_type: &str) -> Result<String, Error> {
    let biz_type_id = super::id_of(pool, biz_type).await?;
    let token = format!("chime_{}", random_base64(32));
    sqlx::query("INSERT INTO api_tokens (id, biz_type_id, token_hash, prefix) VALUES ($1, $2, $3, $4)")
        .bind(Uuid::now_v7())
        .bind(biz_type_id)
        .bind(hash(&token))
        .bind(&token[..12])
        .execute(pool)
        .await?;
    Ok(token)
}

/// The grant of an unrevoked token, or `None`.
pub async fn authenticate(pool: &PgPool, token: &str) -> Result<Option<TokenAuth>, sqlx::Error> {
    let row: Option<(i32, String, Option<f64>)> = sqlx::query_as(
        "SELECT b.id, b.name, b.create_rate_limit
           FROM api_tokens t JOIN biz_types b ON b.id = t.biz_type_id
          WHERE t.token_hash = $1 AND t.revoked_at IS NULL",
    )
    .bind(hash(token))
    .fetch_optional(pool)
    .await?;
    Ok(row.map(|(biz_type_id, biz_type, create_rate_limit)| TokenAuth { biz_type_id, biz_type, create_rate_limit }))
}
