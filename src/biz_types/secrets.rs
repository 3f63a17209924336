//! Signing secrets at rest. With `CHIME_SECRET_KEY` set, a biz type's signing secret is
//! stored sealed with XChaCha20-Poly1305 (a random 24-byte nonce per value, so nonces need
//! no bookkeeping), in the column `signing_secret_sealed`, as
//!
//! ```text
//! enc:v1:<key id>:<base64 of nonce, ciphertext and tag>
//! ```
//!
//! The key id (the first 8 hex digits of the key's SHA-256) says which key sealed a value,
//! so that one sealed under the previous key is opened with `CHIME_SECRET_KEY_OLD` during a
//! rotation, and an error can name the key that is missing. The biz type's name is the
//! associated data: a sealed secret copied onto another biz type does not open.
//!
//! Rows in clear (written without a key, or by the previous release, which knows only the
//! `signing_secret` column) and sealed rows coexist; the clear column, when set, is the
//! newer value (migration 0010). `chime secrets reencrypt` seals the ones in clear and
//! re-seals those under an old key.
//!
//! The secret a rotation replaced (`biz_types.previous_secret`, which signs too until
//! `previous_secret_until`) is kept in one column, in the same forms: the sealed text
//! when a key is set, else the secret in clear; a value is sealed exactly when it starts
//! with `enc:v1:`, which is why a signing secret given by an operator may not
//! (`tokens::validate_signing_secret`).
//!
//! Every read and write of a secret goes through this module: the keys are process settings,
//! installed once at start (`install`), so that callers read and write plaintext. A secret
//! that cannot be opened is never replaced by anything else: it is `Unopened`, and signing
//! with it is refused.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use clap::Args;
use rand::RngCore;
use sha2::{Digest, Sha256};
use sqlx::postgres::PgRow;
use sqlx::{PgConnection, Row};

use crate::error::{Error, SecretError};

/// The key that encrypts signing secrets at rest. Shared by every subcommand, since admin
/// commands create and read biz types too (`config::Cli` flattens it in). Its Debug shows which are set, not the keys.
#[derive(Clone, Args)]
pub struct SecretArgs {
    /// Key that encrypts biz types' signing secrets in the database: 32 random bytes in
    /// base64 (`openssl rand -base64 32`). Set it on every node and wherever admin commands
    /// run, once every node runs a release that knows it (docs/book/src/settings.md, Secrets
    /// at rest); without it secrets are stored in clear. Prefer the environment or
    /// CHIME_SECRET_KEY_FILE to the flag, which others on the machine can see.
    #[arg(long, env = "CHIME_SECRET_KEY", global = true, hide_env_values = true, conflicts_with = "secret_key_file")]
    pub secret_key: Option<String>,

    /// A file holding CHIME_SECRET_KEY (its base64 text), e.g. a mounted Kubernetes secret.
    #[arg(long, env = "CHIME_SECRET_KEY_FILE", global = true)]
    pub secret_key_file: Option<PathBuf>,

    /// Earlier keys, comma-separated: secrets encrypted with them are still read, and
    /// `chime secrets reencrypt` re-encrypts them with CHIME_SECRET_KEY.
    #[arg(long, env = "CHIME_SECRET_KEY_OLD", global = true, hide_env_values = true, conflicts_with = "secret_key_old_file")]
    pub secret_key_old: Option<String>,

    /// A file holding CHIME_SECRET_KEY_OLD (keys one per line or comma-separated).
    #[arg(long, env = "CHIME_SECRET_KEY_OLD_FILE", global = true)]
    pub secret_key_old_file: Option<PathBuf>,
}

impl std::fmt::Debug for SecretArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SecretArgs")
            .field("secret_key", &self.secret_key.as_ref().map(|_| ".."))
            .field("secret_key_file", &self.secret_key_file)
            .field("secret_key_old", &self.secret_key_old.as_ref().map(|_| ".."))
            .field("secret_key_old_file", &self.secret_key_old_file)
            .finish()
    }
}

const PREFIX: &str = "enc:v1:";
const NONCE_LEN: usize = 24;
/// What to tell an operator whose key is unusable.
const MAKE_ONE: &str = "it must be 32 random bytes in base64, as `openssl rand -base64 32` makes";

/// One key: 32 bytes, known by its id.
struct Key {
    id: String,
    cipher: XChaCha20Poly1305,
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Key({})", self.id)
    }
}

impl Key {
    /// A key from its base64 text; `setting` names where it came from, for the error.
    fn parse(setting: &str, text: &str) -> Result<Key, String> {
        let bytes = STANDARD.decode(text.trim()).map_err(|e| format!("{setting} is not base64 ({e}): {MAKE_ONE}"))?;
        let bytes: [u8; 32] = bytes.as_slice().try_into().map_err(|_| format!("{setting} is {} bytes long: {MAKE_ONE}", bytes.len()))?;
        let id = hex::encode(&Sha256::digest(bytes)[..4]);
        Ok(Key { id, cipher: XChaCha20Poly1305::new(&bytes.into()) })
    }

    fn seal(&self, biz_type: &str, secret: &str) -> String {
        let mut nonce = [0u8; NONCE_LEN];
        rand::rng().fill_bytes(&mut nonce);
        let sealed = self
            .cipher
            .encrypt(&XNonce::from(nonce), Payload { msg: secret.as_bytes(), aad: biz_type.as_bytes() })
            .expect("XChaCha20-Poly1305 seals a message of any size a secret has");
        format!("{PREFIX}{}:{}", self.id, STANDARD.encode([&nonce[..], &sealed].concat()))
    }

    fn open(&self, biz_type: &str, sealed: &[u8]) -> Option<String> {
        let (nonce, ciphertext) = sealed.split_at_checked(NONCE_LEN)?;
        let nonce = XNonce::try_from(nonce).ok()?;
        let plain = self.cipher.decrypt(&nonce, Payload { msg: ciphertext, aad: biz_type.as_bytes() }).ok()?;
        String::from_utf8(plain).ok()
    }
}

/// The keys of this process: the one that seals (if any) and older ones that still open.
#[derive(Debug, Default)]
pub struct Keyring {
    current: Option<Key>,
    old: Vec<Key>,
}

impl Keyring {
    /// The keys the settings give: `CHIME_SECRET_KEY` or the file `CHIME_SECRET_KEY_FILE`
    /// names, and `CHIME_SECRET_KEY_OLD` (or `_FILE`), several separated by commas. A key
    /// that cannot be read or has the wrong length is an error that says how to make one.
    pub fn from_settings(args: &SecretArgs) -> anyhow::Result<Keyring> {
        let current = match (&args.secret_key, &args.secret_key_file) {
            (Some(text), _) => Some(Key::parse("CHIME_SECRET_KEY", text).map_err(anyhow::Error::msg)?),
            (None, Some(path)) => {
                Some(Key::parse("CHIME_SECRET_KEY_FILE", &read_key_file("CHIME_SECRET_KEY_FILE", path)?).map_err(anyhow::Error::msg)?)
            }
            (None, None) => None,
        };
        let (setting, old) = match (&args.secret_key_old, &args.secret_key_old_file) {
            (Some(text), _) => ("CHIME_SECRET_KEY_OLD", text.clone()),
            (None, Some(path)) => ("CHIME_SECRET_KEY_OLD_FILE", read_key_file("CHIME_SECRET_KEY_OLD_FILE", path)?),
            (None, None) => ("", String::new()),
        };
        let old = old
            .split([',', '\n'])
            .filter(|k| !k.trim().is_empty())
            .map(|k| Key::parse(setting, k))
            .collect::<Result<Vec<_>, _>>()
            .map_err(anyhow::Error::msg)?;
        if current.is_none() && !old.is_empty() {
            anyhow::bail!("{setting} is set but CHIME_SECRET_KEY is not: set the key that seals new secrets too");
        }
        Ok(Keyring { current, old })
    }

    /// Whether secrets are sealed (CHIME_SECRET_KEY is set).
    pub fn seals(&self) -> bool {
        self.current.is_some()
    }

    fn by_id(&self, id: &str) -> Option<&Key> {
        self.current.iter().chain(&self.old).find(|k| k.id == id)
    }

    /// The secret as stored: `(clear, sealed)`, one of them set.
    pub(super) fn store(&self, biz_type: &str, secret: &str) -> (Option<String>, Option<String>) {
        match &self.current {
            Some(key) => (None, Some(key.seal(biz_type, secret))),
            None => (Some(secret.to_string()), None),
        }
    }

    /// The secret from its stored form: the clear column when set (the newer value), else
    /// the sealed one opened.
    pub(super) fn open(&self, biz_type: &str, clear: Option<String>, sealed: Option<&str>) -> SigningSecret {
        if let Some(secret) = clear {
            return SigningSecret::Open(secret);
        }
        let Some(sealed) = sealed else {
            return SigningSecret::Unopened(SecretError::Missing { biz_type: biz_type.into() });
        };
        let corrupt = |key_id: &str| SecretError::Corrupt { biz_type: biz_type.into(), key_id: key_id.into() };
        let Some((key_id, data)) = sealed.strip_prefix(PREFIX).and_then(|rest| rest.split_once(':')) else {
            return SigningSecret::Unopened(corrupt("?"));
        };
        let Some(key) = self.by_id(key_id) else {
            return SigningSecret::Unopened(match &self.current {
                None => SecretError::NoKey { biz_type: biz_type.into(), key_id: key_id.into() },
                Some(current) => SecretError::UnknownKey { biz_type: biz_type.into(), key_id: key_id.into(), current: current.id.clone() },
            });
        };
        match STANDARD.decode(data).ok().and_then(|data| key.open(biz_type, &data)) {
            Some(secret) => SigningSecret::Open(secret),
            None => SigningSecret::Unopened(corrupt(key_id)),
        }
    }

    /// A secret as one column stores it (`previous_secret`): sealed when a key is set, else
    /// in clear.
    pub(super) fn store_one(&self, biz_type: &str, secret: &str) -> String {
        match self.store(biz_type, secret) {
            (_, Some(sealed)) => sealed,
            (clear, None) => clear.unwrap_or_default(),
        }
    }

    /// A secret from its one-column form (`store_one`): sealed when it carries the mark.
    pub(super) fn open_one(&self, biz_type: &str, stored: &str) -> SigningSecret {
        if is_sealed(stored) { self.open(biz_type, None, Some(stored)) } else { SigningSecret::Open(stored.to_string()) }
    }

    /// Whether a stored secret is sealed under the current key already.
    pub(super) fn is_current(&self, sealed: &str) -> bool {
        self.current.as_ref().is_some_and(|key| sealed.strip_prefix(PREFIX).is_some_and(|rest| rest.starts_with(&format!("{}:", key.id))))
    }
}

/// A signing secret as its columns store it, `(clear, sealed)`: every writer of a secret
/// goes through here or `to_store_one`. Without a key, where secrets are sealed already a
/// secret is refused rather than stored in clear: an admin command run without
/// CHIME_SECRET_KEY would otherwise undo the encryption, biz type by biz type.
pub(super) async fn to_store(conn: &mut PgConnection, biz_type: &str, secret: &str) -> Result<(Option<String>, Option<String>), Error> {
    refuse_clear_where_sealed(conn).await?;
    Ok(keyring().store(biz_type, secret))
}

/// `to_store` for a secret kept in one column (`previous_secret`).
pub(super) async fn to_store_one(conn: &mut PgConnection, biz_type: &str, secret: &str) -> Result<String, Error> {
    refuse_clear_where_sealed(conn).await?;
    Ok(keyring().store_one(biz_type, secret))
}

pub(super) async fn refuse_clear_where_sealed(conn: &mut PgConnection) -> Result<(), Error> {
    if keyring().seals() {
        return Ok(());
    }
    // Reads only, locking nothing: a key set on one node and not another is an operator's
    // mistake to point out, not a race to close.
    let sealed: bool = crate::db::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM biz_types
                             WHERE signing_secret_sealed IS NOT NULL OR previous_secret LIKE 'enc:v1:%'
                                OR chat_secret LIKE 'enc:v1:%')",
    )
    .fetch_one(&mut *conn)
    .await?;
    if sealed {
        return Err(Error::invalid_state(
            "the signing secrets in this database are encrypted and CHIME_SECRET_KEY is not set: set CHIME_SECRET_KEY \
             (or CHIME_SECRET_KEY_FILE) to their key, so that this secret is encrypted too rather than stored in clear",
        ));
    }
    Ok(())
}

/// Whether a stored value is sealed (else it is a secret in clear).
pub(super) fn is_sealed(stored: &str) -> bool {
    stored.starts_with(PREFIX)
}

fn read_key_file(setting: &str, path: &Path) -> anyhow::Result<String> {
    std::fs::read_to_string(path).map_err(|e| anyhow::anyhow!("cannot read {setting} {} ({e}): {MAKE_ONE}", path.display()))
}

static KEYRING: OnceLock<Keyring> = OnceLock::new();

/// Makes `keyring` this process's keys; the first call wins (called once, at start).
pub fn install(keyring: Keyring) {
    let _ = KEYRING.set(keyring);
}

/// This process's keys (none until `install`).
pub(super) fn keyring() -> &'static Keyring {
    KEYRING.get_or_init(Keyring::default)
}

/// A biz type's signing secret as read: in clear, or sealed under a key this process does
/// not have. Its Debug shows neither.
#[derive(Clone)]
pub enum SigningSecret {
    Open(String),
    Unopened(SecretError),
}

impl SigningSecret {
    /// The secret to sign with, or why there is none.
    pub fn expose(&self) -> Result<&str, SecretError> {
        match self {
            SigningSecret::Open(secret) => Ok(secret),
            SigningSecret::Unopened(e) => Err(e.clone()),
        }
    }
}

impl std::fmt::Debug for SigningSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SigningSecret::Open(_) => f.write_str("SigningSecret(..)"),
            SigningSecret::Unopened(e) => write!(f, "SigningSecret::Unopened({e})"),
        }
    }
}

/// Read from a row of `biz_types` (`name`, `signing_secret`, `signing_secret_sealed`) with
/// this process's keys: structs holding a secret flatten this.
impl sqlx::FromRow<'_, PgRow> for SigningSecret {
    fn from_row(row: &PgRow) -> Result<Self, sqlx::Error> {
        let name: String = row.try_get("name")?;
        let clear: Option<String> = row.try_get("signing_secret")?;
        let sealed: Option<String> = row.try_get("signing_secret_sealed")?;
        Ok(keyring().open(&name, clear, sealed.as_deref()))
    }
}

/// The secret a rotation replaced, which signs callbacks beside the current one until
/// `until` (`biz_types.previous_secret`, `previous_secret_until`). Read from a row of
/// `biz_types` (`name`, `previous_secret`, `previous_secret_until`) with this process's keys.
#[derive(Debug, Clone, Default)]
pub struct PreviousSecret {
    /// None: no rotation is overlapping (none made, made without an overlap, or over).
    pub overlap: Option<(SigningSecret, chrono::DateTime<chrono::Utc>)>,
}

impl PreviousSecret {
    /// The previous secret if it still signs at `now`.
    pub fn signing_at(&self, now: chrono::DateTime<chrono::Utc>) -> Option<&SigningSecret> {
        self.overlap.as_ref().filter(|(_, until)| now < *until).map(|(secret, _)| secret)
    }
}

impl sqlx::FromRow<'_, PgRow> for PreviousSecret {
    fn from_row(row: &PgRow) -> Result<Self, sqlx::Error> {
        let name: String = row.try_get("name")?;
        let stored: Option<String> = row.try_get("previous_secret")?;
        let until: Option<chrono::DateTime<chrono::Utc>> = row.try_get("previous_secret_until")?;
        let overlap = stored.zip(until).map(|(stored, until)| (keyring().open_one(&name, &stored), until));
        Ok(PreviousSecret { overlap })
    }
}

/// A biz type's chat robot secret (`biz_types.chat_secret`, migration 0047), kept in one
/// column as `previous_secret` is; None: the robot is not signed. Read from a row of
/// `biz_types` (`name`, `chat_secret`) with this process's keys. It is shown only as whether
/// one is set.
#[derive(Debug, Clone, Default)]
pub struct ChatSecret {
    pub secret: Option<SigningSecret>,
}

impl ChatSecret {
    pub fn open(secret: &str) -> ChatSecret {
        ChatSecret { secret: Some(SigningSecret::Open(secret.to_string())) }
    }
}

impl serde::Serialize for ChatSecret {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_bool(self.secret.is_some())
    }
}

impl sqlx::FromRow<'_, PgRow> for ChatSecret {
    fn from_row(row: &PgRow) -> Result<Self, sqlx::Error> {
        let name: String = row.try_get("name")?;
        let stored: Option<String> = row.try_get("chat_secret")?;
        Ok(ChatSecret { secret: stored.map(|stored| keyring().open_one(&name, &stored)) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(byte: u8) -> Key {
        Key::parse("test key", &STANDARD.encode([byte; 32])).unwrap()
    }

    #[test]
    fn a_sealed_secret_opens_with_its_key_only_and_for_its_biz_type_only() {
        let ring = Keyring { current: Some(key(1)), old: vec![] };
        let (clear, sealed) = ring.store("orders", "whsec_abc");
        let sealed = sealed.unwrap();
        assert!(clear.is_none() && sealed.starts_with(&format!("enc:v1:{}:", key(1).id)) && !sealed.contains("whsec_abc"), "{sealed}");
        assert_ne!(ring.store("orders", "whsec_abc").1.unwrap(), sealed, "a fresh nonce each time");
        assert_eq!(ring.open("orders", None, Some(&sealed)).expose().unwrap(), "whsec_abc");
        assert!(matches!(ring.open("refunds", None, Some(&sealed)), SigningSecret::Unopened(SecretError::Corrupt { .. })));
        let other = Keyring { current: Some(key(2)), old: vec![] };
        assert!(matches!(other.open("orders", None, Some(&sealed)), SigningSecret::Unopened(SecretError::UnknownKey { .. })));
        let rotated = Keyring { current: Some(key(2)), old: vec![key(1)] };
        assert_eq!(rotated.open("orders", None, Some(&sealed)).expose().unwrap(), "whsec_abc");
        assert!(ring.is_current(&sealed) && !rotated.is_current(&sealed));
        let none = Keyring::default();
        let e = none.open("orders", None, Some(&sealed)).expose().unwrap_err().to_string();
        assert!(e.contains("`orders`") && e.contains("CHIME_SECRET_KEY is not set"), "{e}");
        let mut tampered = sealed.clone();
        tampered.replace_range(tampered.len() - 4.., "AAAA");
        assert!(matches!(ring.open("orders", None, Some(&tampered)), SigningSecret::Unopened(SecretError::Corrupt { .. })));
    }

    #[test]
    fn without_a_key_secrets_are_stored_in_clear_and_clear_wins() {
        let none = Keyring::default();
        assert_eq!(none.store("orders", "whsec_abc"), (Some("whsec_abc".into()), None));
        let ring = Keyring { current: Some(key(1)), old: vec![] };
        let sealed = ring.store("orders", "whsec_old").1;
        assert_eq!(ring.open("orders", Some("whsec_new".into()), sealed.as_deref()).expose().unwrap(), "whsec_new");
    }

    #[test]
    fn keys_of_the_wrong_length_or_not_base64_are_refused_with_how_to_make_one() {
        for bad in [STANDARD.encode([0u8; 16]), "not base64!".into(), String::new()] {
            let e = Key::parse("CHIME_SECRET_KEY", &bad).unwrap_err();
            assert!(e.starts_with("CHIME_SECRET_KEY is") && e.contains("openssl rand -base64 32"), "{e}");
        }
        assert!(Key::parse("CHIME_SECRET_KEY", &format!("  {}\n", STANDARD.encode([7u8; 32]))).is_ok(), "whitespace around it is fine");
    }

    #[test]
    fn one_column_secrets_are_sealed_with_a_key_and_clear_without() {
        let ring = Keyring { current: Some(key(1)), old: vec![] };
        let stored = ring.store_one("orders", "whsec_old");
        assert!(is_sealed(&stored) && !stored.contains("whsec_old"), "{stored}");
        assert_eq!(ring.open_one("orders", &stored).expose().unwrap(), "whsec_old");
        assert!(matches!(Keyring::default().open_one("orders", &stored), SigningSecret::Unopened(SecretError::NoKey { .. })));
        let none = Keyring::default();
        assert_eq!(none.store_one("orders", "whsec_old"), "whsec_old");
        assert_eq!(ring.open_one("orders", "whsec_old").expose().unwrap(), "whsec_old", "one stored in clear opens with a key set too");
    }

    #[test]
    fn debug_shows_no_secret() {
        assert_eq!(format!("{:?}", SigningSecret::Open("whsec_abc".into())), "SigningSecret(..)");
        assert!(!format!("{:?}", key(1)).contains("cipher"));
    }
}
