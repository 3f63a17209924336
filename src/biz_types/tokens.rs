//! API tokens and signing secrets. A token is shown once when created; only its SHA-256 is
//! stored, so a leaked database does not leak working tokens.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::db::Pool;
use base64::Engine;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use rand::RngCore;
use sha2::{Digest, Sha256};
use sqlx::PgConnection;

use crate::audit::Action;
use uuid::Uuid;

use super::SigningSecret;
use crate::error::Error;

/// What a valid bearer token grants: acting on one biz type.
#[derive(Debug, Clone)]
pub struct TokenAuth {
    /// The token's row: where its last use is recorded.
    pub token_id: Uuid,
    pub biz_type_id: i32,
    pub biz_type: String,
    pub create_rate_limit: Option<f64>,
    /// The biz type is archived: the token is genuine but grants nothing.
    pub archived: bool,
}

/// A new signing secret: `whsec_` and 32 random bytes in standard base64 (padded), the form
/// Standard Webhooks takes (`whsec_key`), so that any biz type can switch to that scheme
/// after a rotation. Chime's own scheme signs with the whole text, whatever its form.
pub fn new_secret() -> String {
    let mut buf = [0u8; 32];
    rand::rng().fill_bytes(&mut buf);
    format!("whsec_{}", STANDARD.encode(buf))
}

/// The key a secret gives Standard Webhooks' HMAC: the bytes of `whsec_<base64>` (standard
/// alphabet, padded, as the specification's libraries decode it), 24 to 64 of them as it
/// advises. None: not in that form.
pub fn whsec_key(secret: &str) -> Option<Vec<u8>> {
    let key = STANDARD.decode(secret.strip_prefix("whsec_")?).ok()?;
    (24..=64).contains(&key.len()).then_some(key)
}

/// A secret given by the operator for a biz type of `scheme`: Standard Webhooks' must be in
/// the form `whsec_key` takes; chime's own scheme takes any (`validate_signing_secret`).
pub fn validate_secret_for_scheme(scheme: &str, secret: &str) -> Result<(), Error> {
    if scheme == super::STANDARD_WEBHOOKS && whsec_key(secret).is_none() {
        return Err(Error::invalid(
            "signing_secret",
            "must be `whsec_` and the standard base64 of 24 to 64 random bytes for the standard-webhooks signing scheme \
             (as `echo whsec_$(openssl rand -base64 32)` makes)",
        ));
    }
    Ok(())
}

pub(crate) fn random_base64(bytes: usize) -> String {
    let mut buf = vec![0u8; bytes];
    rand::rng().fill_bytes(&mut buf);
    URL_SAFE_NO_PAD.encode(buf)
}

pub(crate) fn hash(token: &str) -> Vec<u8> {
    Sha256::digest(token.as_bytes()).to_vec()
}

/// Creates an unnamed token for the named biz type and returns it; it cannot be shown again.
pub async fn create_token(pool: &Pool, biz_type: &str) -> Result<String, Error> {
    let mut conn = pool.acquire().await?;
    Ok(mint(&mut conn, biz_type, None).await?.1)
}

/// A token's name, as the console, the admin API and `chime token create` take it: what
/// it is for, at most 64 characters, no control characters (the table's CHECK). Blank or
/// absent: unnamed. The length is the name's as given, before trimming, since that is what
/// the API document's `maxLength` counts.
pub fn token_name(name: Option<&str>) -> Result<Option<String>, Error> {
    let Some(name) = name else { return Ok(None) };
    if name.chars().count() > 64 || name.chars().any(char::is_control) {
        return Err(Error::invalid("name", "must be at most 64 characters, without control characters"));
    }
    Ok(Some(name.trim()).filter(|n| !n.is_empty()).map(str::to_string))
}

/// The columns lists show (`TokenInfo`).
const TOKEN_COLUMNS: &str = "id, name, prefix, created_at, last_used_at, revoked_at";

/// Creates a token for the named biz type (not an archived one), named `name` (what it is
/// for; see `token_name`): returns it as lists show it, and the token itself, which cannot
/// be shown again. Recorded in the audit log as `actor`'s (`token.create`: its prefix and
/// name) in the same transaction.
pub async fn mint_token(pool: &Pool, biz_type: &str, name: Option<&str>, actor: &str) -> Result<(TokenInfo, String), Error> {
    let mut tx = pool.begin().await?;
    let (info, token) = mint(&mut tx, biz_type, name).await?;
    let record = serde_json::json!({"prefix": info.prefix, "name": info.name});
    crate::audit::record(&mut tx, actor, Action::TokenCreate, biz_type, None, Some(record)).await?;
    tx.commit().await?;
    Ok((info, token))
}

/// `mint_token` on the caller's connection, unrecorded.
async fn mint(conn: &mut PgConnection, biz_type: &str, name: Option<&str>) -> Result<(TokenInfo, String), Error> {
    let name = token_name(name)?;
    let biz_type_id = super::id_of(&mut *conn, biz_type).await?;
    let token = format!("chime_{}", random_base64(32));
    let info = crate::db::query_as(sqlx::AssertSqlSafe(format!(
        "INSERT INTO api_tokens (id, biz_type_id, token_hash, prefix, name)
         SELECT $1, id, $3, $4, $5 FROM biz_types WHERE id = $2 AND archived_at IS NULL
         RETURNING {TOKEN_COLUMNS}"
    )))
    .bind(Uuid::now_v7())
    .bind(biz_type_id)
    .bind(hash(&token))
    .bind(&token[..12])
    .bind(name)
    .fetch_optional(&mut *conn)
    .await?
    .ok_or_else(|| super::archived(biz_type))?;
    Ok((info, token))
}

/// The grant of an unrevoked token, or `None`.
pub async fn authenticate(pool: &Pool, token: &str) -> Result<Option<TokenAuth>, sqlx::Error> {
    let row: Option<(Uuid, i32, String, Option<f64>, bool)> = crate::db::query_as(
        "SELECT t.id, b.id, b.name, b.create_rate_limit, b.archived_at IS NOT NULL
           FROM api_tokens t JOIN biz_types b ON b.id = t.biz_type_id
          WHERE t.token_hash = $1 AND t.revoked_at IS NULL",
    )
    .bind(hash(token))
    .fetch_optional(pool)
    .await?;
    Ok(row.map(|(token_id, biz_type_id, biz_type, create_rate_limit, archived)| TokenAuth {
        token_id,
        biz_type_id,
        biz_type,
        create_rate_limit,
        archived,
    }))
}

/// Records that the token let a request in, unless a use was recorded less than a minute
/// ago (by any node: the database's clock decides). `TokenCache::use_due` keeps a node from
/// asking more than once a minute per token, so this is no write per request.
pub async fn record_use(pool: &Pool, token_id: Uuid) -> Result<(), sqlx::Error> {
    // Locks the token's row for the update only; a use recorded meanwhile by another node
    // is seen once the lock is had (the WHERE is checked again), and nothing is written.
    crate::db::query(
        "UPDATE api_tokens SET last_used_at = now()
          WHERE id = $1 AND (last_used_at IS NULL OR last_used_at < now() - interval '1 minute')",
    )
    .bind(token_id)
    .execute(pool)
    .await?;
    Ok(())
}

/// A token as lists show it: never the token itself.
#[derive(Debug, Clone, serde::Serialize, sqlx::FromRow, utoipa::ToSchema)]
#[schema(as = ApiToken)]
pub struct TokenInfo {
    pub id: Uuid,
    /// What it is for, as given when it was made; null: unnamed.
    pub name: Option<String>,
    /// Its first characters, to recognise it.
    pub prefix: String,
    pub created_at: chrono::DateTime<chrono::Utc>,
    /// When it last let a request in, to within a minute; null: never since it was made (or
    /// since chime recorded uses).
    pub last_used_at: Option<chrono::DateTime<chrono::Utc>>,
    pub revoked_at: Option<chrono::DateTime<chrono::Utc>>,
}

pub async fn list_tokens(pool: &Pool, biz_type_id: i32) -> Result<Vec<TokenInfo>, Error> {
    Ok(crate::db::query_as(sqlx::AssertSqlSafe(format!("SELECT {TOKEN_COLUMNS} FROM api_tokens WHERE biz_type_id = $1 ORDER BY created_at DESC")))
        .bind(biz_type_id)
        .fetch_all(pool)
        .await?)
}

/// Revokes a token of the biz type; returns its prefix. Revoking twice is harmless. Every
/// node is told on commit (`Wake::Settings`) and forgets the tokens it had checked, so the
/// token is refused from then on rather than after `TokenCache::TTL`; the node that
/// revoked it should forget its own at once (`AppState::forget_tokens`), before its answer.
/// Recorded in the audit log as `actor`'s (`token.revoke`: its prefix) in the same
/// transaction.
pub async fn revoke_token(pool: &Pool, biz_type_id: i32, id: Uuid, actor: &str) -> Result<String, Error> {
    let mut tx = pool.begin().await?;
    // Locks the token's row; the notification goes out when the transaction commits.
    let (prefix, biz_type) = crate::db::query_as::<(String, String, ())>(
        "WITH revoked AS (
            UPDATE api_tokens SET revoked_at = coalesce(revoked_at, now()) WHERE id = $1 AND biz_type_id = $2 RETURNING prefix
         )
         SELECT prefix, (SELECT name FROM biz_types WHERE id = $2), pg_notify($3, $4) FROM revoked",
    )
    .bind(id)
    .bind(biz_type_id)
    .bind(crate::wake::CHANNEL)
    .bind(crate::wake::Wake::Settings.payload())
    .fetch_optional(&mut *tx)
    .await?
    .map(|(prefix, biz_type, ())| (prefix, biz_type))
    .ok_or_else(|| Error::NotFound(format!("no token {id} in this biz type")))?;
    crate::audit::record(&mut tx, actor, Action::TokenRevoke, &biz_type, None, Some(prefix.clone().into())).await?;
    tx.commit().await?;
    Ok(prefix)
}

/// How long the replaced secret may keep signing after a rotation, at most: 30 days.
pub const MAX_OVERLAP_SECS: i64 = 30 * 86_400;
/// The overlap when none is asked for: a day, for receivers to take the new secret.
pub const DEFAULT_OVERLAP_SECS: i64 = 86_400;

/// What a rotation did.
#[derive(Debug, Clone)]
pub struct Rotated {
    /// The new secret, to be shown once.
    pub secret: String,
    /// Until when the replaced secret still signs callbacks (beside the new one); None: it
    /// stopped at once (an overlap of 0, or a replaced secret this node could not open).
    pub previous_until: Option<chrono::DateTime<chrono::Utc>>,
}

/// `overlap_secs` as a rotation takes it: 0 (none) to `MAX_OVERLAP_SECS`.
pub fn validate_overlap(overlap_secs: i64) -> Result<(), Error> {
    if !(0..=MAX_OVERLAP_SECS).contains(&overlap_secs) {
        return Err(Error::invalid(
            "overlap_secs",
            format!("must be between 0 (the old secret stops at once) and {MAX_OVERLAP_SECS} (30 days), not {overlap_secs}"),
        ));
    }
    Ok(())
}

/// Gives the biz type a new signing secret and returns it. For `overlap_secs` the secret it
/// replaces keeps signing too (callbacks carry both signatures), so that receivers can
/// take the new one without a gap; a rotation during an overlap keeps the secret it
/// replaces, and the older one stops. The engines are told to re-read their settings, so
/// callbacks carry the new signature at once. An archived biz type's secret is kept.
///
/// Recorded in the audit log as `actor`'s (`biz_type.rotate_secret`: the overlap, and until
/// when the replaced secret signs) in the same transaction.
pub async fn rotate_secret(pool: &Pool, biz_type_id: i32, overlap_secs: i64, actor: &str) -> Result<Rotated, Error> {
    validate_overlap(overlap_secs)?;
    let secret = new_secret();
    let mut tx = pool.begin().await?;
    // Locks the row until the commit: two rotations at once happen one after the other, so
    // the second keeps the first's secret as the previous one.
    let current: Option<SigningSecret> =
        crate::db::query_as::<SigningSecret>("SELECT name, signing_secret, signing_secret_sealed FROM biz_types WHERE id = $1 FOR UPDATE")
            .bind(biz_type_id)
            .fetch_optional(&mut *tx)
            .await?;
    set_signing_secret(&mut tx, biz_type_id, &secret).await?;
    // A replaced secret this node cannot open cannot sign: it stops at once.
    let previous = current.as_ref().and_then(|s| s.expose().ok()).filter(|_| overlap_secs > 0);
    let previous_until = set_previous_secret(&mut tx, biz_type_id, previous, overlap_secs).await?;
    if current.is_some() {
        let name: String = crate::db::query_scalar("SELECT name FROM biz_types WHERE id = $1").bind(biz_type_id).fetch_one(&mut *tx).await?;
        let record = serde_json::json!({"overlap_secs": overlap_secs, "previous_secret_until": previous_until});
        crate::audit::record(&mut tx, actor, Action::BizTypeRotateSecret, &name, None, Some(record)).await?;
    }
    tx.commit().await?;
    Ok(Rotated { secret, previous_until })
}

/// Keeps `previous` signing for `overlap_secs` from now (None: no previous secret); returns
/// until when. Sealed like the current secret (`secrets.rs`).
async fn set_previous_secret(
    conn: &mut PgConnection,
    biz_type_id: i32,
    previous: Option<&str>,
    overlap_secs: i64,
) -> Result<Option<chrono::DateTime<chrono::Utc>>, Error> {
    let name: String = crate::db::query_scalar("SELECT name FROM biz_types WHERE id = $1").bind(biz_type_id).fetch_one(&mut *conn).await?;
    let stored = match previous {
        Some(p) => Some(super::secrets::to_store_one(conn, &name, p).await?),
        None => None,
    };
    // Without a previous secret the overlap is NULL, and so is its end: no CASE, which
    // Citus refuses around now() on a distributed (here reference) table.
    let overlap = stored.as_ref().map(|_| overlap_secs as f64);
    Ok(crate::db::query_scalar(
        "UPDATE biz_types
            SET previous_secret = $2, previous_secret_until = now() + $3 * interval '1 second'
          WHERE id = $1
         RETURNING previous_secret_until",
    )
    .bind(biz_type_id)
    .bind(stored)
    .bind(overlap)
    .fetch_one(conn)
    .await?)
}

/// Stores a signing secret (rotated, or given by `apply`) and wakes the engines on commit.
/// Sealed with CHIME_SECRET_KEY when it is set (`secrets.rs`).
pub(super) async fn set_signing_secret(conn: &mut PgConnection, biz_type_id: i32, secret: &str) -> Result<(), Error> {
    validate_signing_secret(secret)?;
    // The name is the sealed value's associated data; names never change.
    let (name, archived): (String, bool) = crate::db::query_as("SELECT name, archived_at IS NOT NULL FROM biz_types WHERE id = $1")
        .bind(biz_type_id)
        .fetch_optional(&mut *conn)
        .await?
        .ok_or_else(|| Error::NotFound(format!("no biz type with id {biz_type_id}")))?;
    if archived {
        return Err(super::archived(&name));
    }
    let (clear, sealed) = super::secrets::to_store(conn, &name, secret).await?;
    // Locks the biz type's row until the caller commits; `archive` takes the same lock.
    crate::db::query(
        "WITH changed AS (
            UPDATE biz_types SET signing_secret = $2, signing_secret_sealed = $3, updated_at = now()
             WHERE id = $1 AND archived_at IS NULL RETURNING id
         )
         SELECT pg_notify($4, $5) FROM changed",
    )
    .bind(biz_type_id)
    .bind(clear)
    .bind(sealed)
    .bind(crate::wake::CHANNEL)
    .bind(crate::wake::Wake::Settings.payload())
    .execute(conn)
    .await?;
    Ok(())
}

/// The longest signing secret an operator may give, in bytes.
pub const MAX_SIGNING_SECRET_BYTES: usize = 1000;

/// A secret given by the operator (chime's own are `whsec_` and 44 base64 characters): long
/// enough not to be guessed, and text that a receiver's configuration can hold as is.
pub fn validate_signing_secret(secret: &str) -> Result<(), Error> {
    if secret.len() < 16 || secret.len() > MAX_SIGNING_SECRET_BYTES {
        return Err(Error::invalid("signing_secret", format!("must be 16 to {MAX_SIGNING_SECRET_BYTES} bytes long, not {}", secret.len())));
    }
    if secret.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err(Error::invalid("signing_secret", "must not contain spaces or control characters"));
    }
    // The mark of a sealed value, where a secret is stored in one column (`secrets.rs`).
    if super::secrets::is_sealed(secret) {
        return Err(Error::invalid("signing_secret", "must not begin with `enc:v1:` (chime's mark of an encrypted value)"));
    }
    Ok(())
}

/// Valid tokens seen lately, so that a busy client costs one token look-up every few
/// seconds rather than one per request. A revoked token or an archived biz type takes effect
/// at once (every node empties its cache when told that biz types or tokens changed); a
/// changed create rate limit within `TTL`, as does anything a lost notification missed.
///
/// It also keeps "last used" cheap: a token's use is recorded (`record_use`) at most once a
/// minute per token by each node, rather than written on every request.
#[derive(Default)]
pub struct TokenCache {
    entries: Mutex<HashMap<String, (TokenAuth, Instant)>>,
    /// When this node last asked to record each token's use. Kept when `entries` is
    /// emptied (a biz type changed), so that a busy token is not recorded again at once.
    uses: Mutex<HashMap<Uuid, Instant>>,
}

impl TokenCache {
    const TTL: Duration = Duration::from_secs(5);
    /// Beyond this many tokens the cache starts afresh rather than grow without bound.
    const MAX_ENTRIES: usize = 10_000;

    pub fn get(&self, token: &str) -> Option<TokenAuth> {
        let entries = self.entries.lock().expect("token cache lock");
        entries.get(token).filter(|(_, at)| at.elapsed() < Self::TTL).map(|(auth, _)| auth.clone())
    }

    pub fn clear(&self) {
        self.entries.lock().expect("token cache lock").clear();
    }

    pub fn put(&self, token: String, auth: TokenAuth) {
        let mut entries = self.entries.lock().expect("token cache lock");
        if entries.len() >= Self::MAX_ENTRIES {
            entries.clear();
        }
        entries.insert(token, (auth, Instant::now()));
    }

    /// Whether this node should record a use of the token now: the first use it sees, then
    /// once a minute at most. Counts this as the recording.
    pub fn use_due(&self, token_id: Uuid) -> bool {
        self.use_due_at(token_id, Instant::now())
    }

    fn use_due_at(&self, token_id: Uuid, now: Instant) -> bool {
        let mut uses = self.uses.lock().expect("token cache lock");
        if uses.get(&token_id).is_some_and(|at| now.saturating_duration_since(*at) < Self::USE_EVERY) {
            return false;
        }
        if uses.len() >= Self::MAX_ENTRIES {
            uses.clear();
        }
        uses.insert(token_id, now);
        true
    }

    /// How often a token's use is recorded, at most: "last used" is to the minute.
    const USE_EVERY: Duration = Duration::from_secs(60);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The 64 characters are counted as given: a name that fits only once trimmed is
    /// refused, as the API document's `maxLength` says (schemathesis found the difference).
    #[test]
    fn a_token_names_length_is_counted_before_trimming() {
        let fits = "x".repeat(64);
        assert_eq!(token_name(Some(&fits)).unwrap().as_deref(), Some(fits.as_str()));
        assert!(token_name(Some(&format!("\u{a0}{fits}"))).is_err());
        assert_eq!(token_name(Some("  billing  ")).unwrap().as_deref(), Some("billing"));
        assert_eq!(token_name(Some("   ")).unwrap(), None);
        assert_eq!(token_name(None).unwrap(), None);
        assert!(token_name(Some("a\u{7}b")).is_err());
    }

    /// Chime's secrets are in the form Standard Webhooks decodes; a key is 24 to 64 bytes of
    /// standard, padded base64 after `whsec_`, and a secret given for that scheme is refused
    /// otherwise, naming `signing_secret`.
    #[test]
    fn whsec_secrets_are_standard_base64_of_24_to_64_bytes() {
        let made = new_secret();
        assert_eq!(whsec_key(&made).map(|k| k.len()), Some(32), "{made}");
        assert!(whsec_key("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").is_some(), "the specification's example, 24 bytes");
        let of = |bytes: usize| format!("whsec_{}", STANDARD.encode(vec![7u8; bytes]));
        assert!(whsec_key(&of(64)).is_some() && whsec_key(&of(23)).is_none() && whsec_key(&of(65)).is_none());
        for bad in ["MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "whsec_q-Zp3_0L7nV2x9YkQe1-Rb_Tj5sW8uHcDfGa4mNo6iE", "whsec_", "whsec_not base64!"] {
            assert!(whsec_key(bad).is_none(), "{bad}");
            let Err(Error::Invalid { field, .. }) = validate_secret_for_scheme("standard-webhooks", bad) else { panic!("{bad} accepted") };
            assert_eq!(field, "signing_secret");
            assert!(validate_secret_for_scheme("chime", bad).is_ok(), "chime's scheme takes any: {bad}");
        }
    }

    #[test]
    fn a_tokens_use_is_due_once_a_minute() {
        let cache = TokenCache::default();
        let (a, b) = (Uuid::now_v7(), Uuid::now_v7());
        let start = Instant::now();
        assert!(cache.use_due_at(a, start), "the first use is recorded");
        assert!(!cache.use_due_at(a, start + Duration::from_secs(59)), "not again within the minute");
        assert!(cache.use_due_at(b, start + Duration::from_secs(1)), "each token has its own minute");
        cache.clear();
        assert!(!cache.use_due_at(a, start + Duration::from_secs(30)), "emptying the cache does not reset it");
        assert!(cache.use_due_at(a, start + Duration::from_secs(60)), "a minute later it is due again");
    }
}
