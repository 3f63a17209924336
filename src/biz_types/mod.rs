//! Biz types: one callback target each, with its own limits, retries, signing secret and
//! API tokens (docs/design/contract.md, Biz types).

pub mod apply;
mod create_limits;
pub mod load;
pub mod secrets;
mod tokens;

pub use create_limits::CreateLimiter;
pub use secrets::{ChatSecret, PreviousSecret, SigningSecret};
use tokens::set_signing_secret;
pub use tokens::{
    DEFAULT_OVERLAP_SECS, MAX_OVERLAP_SECS, MAX_SIGNING_SECRET_BYTES, Rotated, TokenAuth, TokenCache, TokenInfo, authenticate, create_token,
    list_tokens, mint_token, new_secret, record_use, revoke_token, rotate_secret, token_name, validate_overlap, validate_signing_secret,
};
pub(crate) use tokens::{hash as hash_token, random_base64};
pub use tokens::{validate_secret_for_scheme, whsec_key};

use crate::db::Pool;
use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgConnection;

use crate::audit::Action;
use crate::callback_hosts::CallbackHosts;
use crate::error::{Error, SecretError};
use crate::wake::{self, Wake};

/// A new biz type's retries (the schema's column defaults, from migration 0008): 1 s
/// doubling to an hour, for at least 24 hours even with the jitter at its least, so that a
/// receiver down for a working day loses nothing. The book's retry table
/// (docs/book/src/callbacks.md) is checked against them.
pub const DEFAULT_MAX_ATTEMPTS: i32 = 60;
/// Snoozes a task may take before the next fails it (migration 0028's default): 2.8 hours of
/// a receiver snoozing every second, a week of one snoozing every minute.
pub const DEFAULT_MAX_SNOOZES: i32 = 10_000;
pub const DEFAULT_BACKOFF_INITIAL_MS: i32 = 1000;
pub const DEFAULT_BACKOFF_MAX_MS: i32 = 3_600_000;
/// The receiver's breaker (migration 0034's defaults, `engine::breaker`): 10 failures in a
/// row within a minute open it, and a probe every 5 s tests the receiver. A single task
/// retried alone by the default backoff (1 s doubling) fails at most 7 times in a minute,
/// so it cannot open the breaker by itself; a receiver that is down for everyone opens it
/// within its first 10 answers.
pub const DEFAULT_BREAKER_THRESHOLD: i32 = 10;
pub const DEFAULT_BREAKER_WINDOW_MS: i32 = 60_000;
pub const DEFAULT_BREAKER_PROBE_MS: i32 = 5_000;

#[derive(Debug, Clone, Serialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct BizType {
    /// The row's key, which tasks, timers and tokens refer to; never shown.
    #[serde(skip)]
    pub id: i32,
    /// `[a-z0-9][a-z0-9_-]{0,63}`, fixed at creation: clients name the biz type by it.
    pub name: String,
    /// Free text for the console.
    pub description: String,
    /// Where callbacks go (mode `callback`); empty for a pull biz type.
    pub callback_url: String,
    /// `callback` (the engine calls back) or `pull` (consumers reserve the tasks).
    pub mode: String,
    /// How long a callback may take before it counts as failed; a pull reservation's
    /// default time to run. Also sizes the engine's lease (timeout plus a margin).
    pub timeout_ms: i32,
    /// Attempts before a task is failed for good (a replay starts counting afresh).
    pub max_attempts: i32,
    /// `Chime-Snooze` answers a task may take (snoozes do not count toward `max_attempts`);
    /// the next one fails it, so that its history stays bounded. A replay counts afresh.
    pub max_snoozes: i32,
    /// The first retry's delay; each later one doubles, up to `backoff_max_ms`, with jitter.
    pub backoff_initial_ms: i32,
    pub backoff_max_ms: i32,
    /// Callbacks (or reservations) per second across the cluster, shared by the live
    /// nodes; None: unlimited.
    pub rate_limit: Option<f64>,
    /// Callbacks in flight (or tasks reserved) at once, across the whole cluster.
    pub max_in_flight: i32,
    /// Callbacks of one flow key in flight at once, across the whole cluster; 0: no such
    /// limit (docs/design/claim.md, Flow keys).
    pub flow_max_in_flight: i32,
    /// Each flow key's tasks are delivered one at a time, in run_at order: the next starts
    /// once the one before is settled (succeeded, failed, expired or cancelled).
    pub ordered: bool,
    /// Callbacks of one flow key started a second, across the whole cluster; None:
    /// unlimited.
    pub flow_rate_limit: Option<f64>,
    /// Its share of a node's delivery capacity against the other biz types with due work,
    /// when that capacity is short (`--node-capacity`): weight 3 gets three times the share
    /// of weight 1. It caps nothing by itself. 1 to 100.
    pub weight: i32,
    /// Create calls per second through the API, per node; None: unlimited.
    pub create_rate_limit: Option<f64>,
    /// Failures in a row (no answer, a timeout, 408, 429 or 5xx) that open the receiver's
    /// breaker, if they come within `breaker_window_ms`: its tasks are then only probed,
    /// without counting toward `max_attempts`, until a probe is answered. 0: no breaker.
    pub breaker_threshold: i32,
    /// How recent those failures must be: the first of them at most this long before the last.
    pub breaker_window_ms: i32,
    /// While the breaker is open, one task is sent as a probe this often, across the cluster.
    pub breaker_probe_ms: i32,
    /// Its tasks stay pending (and are still accepted) until it is resumed.
    pub paused: bool,
    /// Where a signed notice is POSTed when one of its tasks ends failed or expired
    /// (`failure_notices`); null: nowhere.
    pub failure_url: Option<String>,
    /// How its callbacks and failure notices are signed: `chime` (`Chime-Signature`) or
    /// `standard-webhooks` (`webhook-id`, `webhook-timestamp`, `webhook-signature`, keyed
    /// by a `whsec_<base64>` secret).
    #[schema(example = "chime")]
    pub signing_scheme: String,
    /// The chat tool its notices also go to (`chat_notices`): `dingtalk`, `feishu`, `wecom`
    /// or `slack`; null: none.
    pub chat_platform: Option<String>,
    /// The chat tool's incoming webhook URL (null exactly when `chat_platform` is).
    pub chat_url: Option<String>,
    /// Whether the chat robot signs with a secret (DingTalk, Feishu); the secret is never
    /// shown.
    #[serde(rename = "chat_signed")]
    #[schema(value_type = bool)]
    #[sqlx(flatten)]
    pub chat_secret: ChatSecret,
    /// Opened with this process's keys as the row is read (`secrets`).
    #[serde(skip)]
    #[sqlx(flatten)]
    pub signing_secret: SigningSecret,
    /// The secret the last rotation replaced, while it still signs (`secrets`).
    #[serde(skip)]
    #[sqlx(flatten)]
    pub previous_secret: PreviousSecret,
    /// Until when callbacks carry a signature with the secret the last rotation replaced,
    /// beside the current one's; null (or past): only the current one signs.
    pub previous_secret_until: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    /// When it was archived (deleted): its tokens no longer work, nothing is delivered, and
    /// its name stays taken. None: in use.
    pub archived_at: Option<DateTime<Utc>>,
}

/// A change to a biz type's settings: `None` leaves a setting as it is (on create, the
/// schema's default applies). A rate of 0 means unlimited.
#[derive(Debug, Clone, Default)]
pub struct Settings {
    pub description: Option<String>,
    pub callback_url: Option<String>,
    pub mode: Option<String>,
    pub timeout_ms: Option<i32>,
    pub max_attempts: Option<i32>,
    pub max_snoozes: Option<i32>,
    pub backoff_initial_ms: Option<i32>,
    pub backoff_max_ms: Option<i32>,
    pub rate_limit: Option<f64>,
    pub max_in_flight: Option<i32>,
    pub flow_max_in_flight: Option<i32>,
    pub ordered: Option<bool>,
    pub flow_rate_limit: Option<f64>,
    pub weight: Option<i32>,
    pub create_rate_limit: Option<f64>,
    pub breaker_threshold: Option<i32>,
    pub breaker_window_ms: Option<i32>,
    pub breaker_probe_ms: Option<i32>,
    pub paused: Option<bool>,
    /// An empty URL clears it (no failure notices).
    pub failure_url: Option<String>,
    /// `chime` or `standard-webhooks` (`SIGNING_SCHEMES`).
    pub signing_scheme: Option<String>,
    /// `dingtalk`, `feishu`, `wecom` or `slack`; empty: no chat notices (the URL and the
    /// secret are cleared with it).
    pub chat_platform: Option<String>,
    pub chat_url: Option<String>,
    /// The chat robot's signing secret; empty: none. Dropped when the platform changes,
    /// unless given again.
    pub chat_secret: Option<String>,
}

/// The chat tools a biz type's notices can go to (`chat_notices`), and whether each signs
/// its robot's messages with a secret.
pub const CHAT_PLATFORMS: [(&str, bool); 4] = [("dingtalk", true), ("feishu", true), ("wecom", false), ("slack", false)];

/// Longest chat robot secret, in bytes.
pub const MAX_CHAT_SECRET_BYTES: usize = 256;

fn chat_signs(platform: &str) -> bool {
    CHAT_PLATFORMS.iter().any(|(p, signs)| *p == platform && *signs)
}

/// The signing schemes a biz type may have: chime's own, the default, and Standard Webhooks.
pub const SIGNING_SCHEMES: [&str; 2] = ["chime", STANDARD_WEBHOOKS];
/// The scheme of the Standard Webhooks specification.
pub const STANDARD_WEBHOOKS: &str = "standard-webhooks";

pub fn validate_name(name: &str) -> Result<(), Error> {
    let mut chars = name.chars();
    let first_ok = chars.next().is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    let rest_ok = chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_');
    if !first_ok || !rest_ok || name.len() > 64 {
        return Err(Error::invalid("name", "must be 1-64 characters of lowercase letters, digits, '-' and '_', starting with a letter or digit"));
    }
    Ok(())
}

impl Settings {
    /// Checks each given setting on its own; cross-field rules (backoff_max_ms ≥
    /// backoff_initial_ms) are checked against the merged result by `BizType::with`.
    fn validate(&self, hosts: CallbackHosts) -> Result<(), Error> {
        self.problems(hosts).into_iter().next().map_or(Ok(()), Err)
    }

    /// Every setting that fails its rule, each error naming its field (`apply` reports
    /// them all at once).
    fn problems(&self, hosts: CallbackHosts) -> Vec<Error> {
        let mut problems = Vec::new();
        if let Some(url) = &self.callback_url {
            problems.extend(validate_callback_url(url, hosts).err());
        }
        if let Some(url) = self.failure_url.as_deref().filter(|u| !u.is_empty()) {
            problems.extend(validate_url("failure_url", url, hosts).err());
        }
        if let Some(platform) = self.chat_platform.as_deref().filter(|p| !p.is_empty())
            && !CHAT_PLATFORMS.iter().any(|(p, _)| *p == platform)
        {
            problems.push(Error::invalid("chat_platform", "must be `dingtalk`, `feishu`, `wecom` or `slack` (or empty: none)"));
        }
        if let Some(url) = self.chat_url.as_deref().filter(|u| !u.is_empty()) {
            problems.extend(validate_url("chat_url", url, hosts).err());
        }
        if let Some(secret) = self.chat_secret.as_deref().filter(|s| !s.is_empty()) {
            problems.extend(validate_chat_secret(secret).err());
        }
        if let Some(mode) = &self.mode
            && mode != "callback"
            && mode != "pull"
        {
            problems.push(Error::invalid("mode", "must be `callback` or `pull`"));
        }
        if let Some(scheme) = &self.signing_scheme
            && !SIGNING_SCHEMES.contains(&scheme.as_str())
        {
            problems.push(Error::invalid("signing_scheme", "must be `chime` or `standard-webhooks`"));
        }
        if let Some(d) = &self.description {
            if d.len() > 1000 {
                problems.push(Error::invalid("description", "must be at most 1000 bytes"));
            }
            // PostgreSQL text cannot hold NUL.
            if d.contains('\0') {
                problems.push(Error::invalid("description", "must not contain NUL characters"));
            }
        }
        let checks = [
            range("timeout_ms", self.timeout_ms, 1, 600_000),
            range("max_attempts", self.max_attempts, 1, 1000),
            range("max_snoozes", self.max_snoozes, 0, 100_000),
            range("backoff_initial_ms", self.backoff_initial_ms, 0, 86_400_000),
            range("backoff_max_ms", self.backoff_max_ms, 0, 7 * 86_400_000),
            range("max_in_flight", self.max_in_flight, 1, 100_000),
            range("flow_max_in_flight", self.flow_max_in_flight, 0, 100_000),
            range("weight", self.weight, 1, 100),
            range("breaker_threshold", self.breaker_threshold, 0, 10_000),
            range("breaker_window_ms", self.breaker_window_ms, 100, 86_400_000),
            range("breaker_probe_ms", self.breaker_probe_ms, 100, 3_600_000),
            rate("rate_limit", self.rate_limit),
            rate("create_rate_limit", self.create_rate_limit),
            rate("flow_rate_limit", self.flow_rate_limit),
        ];
        problems.extend(checks.into_iter().filter_map(Result::err));
        problems
    }
}

/// Every rule that creating `name` with `settings` (`current`: `None`) or changing `current`
/// with them breaks, each naming its field: the console shows them on its form all at once.
/// `create` and `update` check the same rules, and refuse with the first.
pub fn problems(name: &str, current: Option<&BizType>, settings: &Settings, hosts: CallbackHosts) -> Vec<Error> {
    let mut problems = Vec::new();
    if current.is_none() {
        problems.extend(validate_name(name).err());
    }
    problems.extend(settings.problems(hosts));
    let merged = match current {
        Some(b) => b.merged(settings),
        None => BizType::planned(name, settings),
    };
    problems.extend(merged.problems());
    problems
}

/// The rules of a chat robot's secret on its own; which platforms take one is checked
/// against the merged biz type.
fn validate_chat_secret(secret: &str) -> Result<(), Error> {
    if secret.len() > MAX_CHAT_SECRET_BYTES {
        return Err(Error::invalid("chat_secret", format!("must be at most {MAX_CHAT_SECRET_BYTES} bytes long, not {}", secret.len())));
    }
    if secret.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err(Error::invalid("chat_secret", "must not contain spaces or control characters"));
    }
    // The mark of a sealed value, in this one-column form (`secrets.rs`).
    if secrets::is_sealed(secret) {
        return Err(Error::invalid("chat_secret", "must not begin with `enc:v1:` (chime's mark of an encrypted value)"));
    }
    Ok(())
}

fn range(field: &str, value: Option<i32>, min: i32, max: i32) -> Result<(), Error> {
    match value {
        Some(v) if v < min || v > max => Err(Error::invalid(field, format!("must be between {min} and {max}"))),
        _ => Ok(()),
    }
}

fn rate(field: &str, value: Option<f64>) -> Result<(), Error> {
    match value {
        Some(v) if !v.is_finite() || !(0.0..=1_000_000.0).contains(&v) => {
            Err(Error::invalid(field, "must be between 0 (unlimited) and 1000000 per second"))
        }
        _ => Ok(()),
    }
}

/// Longest callback or failure URL, in bytes.
pub const MAX_URL_BYTES: usize = 2048;

/// An http(s) URL with a host, and with `CallbackHosts::PublicOnly` not an address in a
/// denied range (host names are checked again when resolved, at delivery).
pub fn validate_callback_url(raw: &str, hosts: CallbackHosts) -> Result<(), Error> {
    validate_url("callback_url", raw, hosts)
}

/// The rules of a URL chime POSTs to (`callback_url`, `failure_url`), the error naming `field`.
fn validate_url(field: &str, raw: &str, hosts: CallbackHosts) -> Result<(), Error> {
    if raw.len() > MAX_URL_BYTES {
        return Err(Error::invalid(field, format!("must be at most {MAX_URL_BYTES} bytes, not {}", raw.len())));
    }
    // The parser would take a NUL (percent-encoded) but the text is stored as given.
    if raw.contains(|c: char| c.is_control()) {
        return Err(Error::invalid(field, "must not contain control characters"));
    }
    let url = url::Url::parse(raw).map_err(|e| Error::invalid(field, format!("not a valid URL: {e}")))?;
    if !matches!(url.scheme(), "http" | "https") || url.host().is_none() {
        return Err(Error::invalid(field, "must be an http:// or https:// URL with a host"));
    }
    if let Some(reason) = hosts.refusal(&url) {
        return Err(Error::invalid(field, reason));
    }
    Ok(())
}

impl BizType {
    /// What `create_in` makes of `settings`, without writing or checking: the schema's
    /// column defaults (migrations 0001 and 0008) with the settings applied. `apply` plans
    /// with it, and checks each row it creates against it.
    fn planned(name: &str, settings: &Settings) -> BizType {
        let defaults = BizType {
            id: 0,
            name: name.to_string(),
            description: String::new(),
            callback_url: String::new(),
            mode: "pull".into(),
            timeout_ms: 10_000,
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            max_snoozes: DEFAULT_MAX_SNOOZES,
            backoff_initial_ms: DEFAULT_BACKOFF_INITIAL_MS,
            backoff_max_ms: DEFAULT_BACKOFF_MAX_MS,
            rate_limit: None,
            max_in_flight: 100,
            flow_max_in_flight: 0,
            ordered: false,
            flow_rate_limit: None,
            weight: 1,
            create_rate_limit: None,
            breaker_threshold: DEFAULT_BREAKER_THRESHOLD,
            breaker_window_ms: DEFAULT_BREAKER_WINDOW_MS,
            breaker_probe_ms: DEFAULT_BREAKER_PROBE_MS,
            paused: false,
            failure_url: None,
            chat_platform: None,
            chat_url: None,
            chat_secret: ChatSecret::default(),
            signing_scheme: "chime".into(),
            // None yet: `create_in` makes one for the scheme, or checks the one given.
            signing_secret: SigningSecret::Open(String::new()),
            previous_secret: PreviousSecret::default(),
            previous_secret_until: None,
            archived_at: None,
            created_at: DateTime::UNIX_EPOCH,
            updated_at: DateTime::UNIX_EPOCH,
        };
        defaults.merged(&settings.for_create())
    }

    /// This biz type with the given settings applied and checked as a whole.
    fn with(&self, s: &Settings) -> Result<BizType, Error> {
        let b = self.merged(s);
        b.problems().into_iter().next().map_or(Ok(b), Err)
    }

    /// This biz type with the given settings applied, not yet checked.
    fn merged(&self, s: &Settings) -> BizType {
        // A rate of 0 means unlimited, stored as NULL.
        let rate = |new: Option<f64>, old: Option<f64>| match new {
            Some(0.0) => None,
            Some(r) => Some(r),
            None => old,
        };
        BizType {
            description: s.description.clone().unwrap_or_else(|| self.description.clone()),
            callback_url: s.callback_url.clone().unwrap_or_else(|| self.callback_url.clone()),
            mode: s.mode.clone().unwrap_or_else(|| self.mode.clone()),
            timeout_ms: s.timeout_ms.unwrap_or(self.timeout_ms),
            max_attempts: s.max_attempts.unwrap_or(self.max_attempts),
            max_snoozes: s.max_snoozes.unwrap_or(self.max_snoozes),
            backoff_initial_ms: s.backoff_initial_ms.unwrap_or(self.backoff_initial_ms),
            backoff_max_ms: s.backoff_max_ms.unwrap_or(self.backoff_max_ms),
            rate_limit: rate(s.rate_limit, self.rate_limit),
            max_in_flight: s.max_in_flight.unwrap_or(self.max_in_flight),
            flow_max_in_flight: s.flow_max_in_flight.unwrap_or(self.flow_max_in_flight),
            ordered: s.ordered.unwrap_or(self.ordered),
            flow_rate_limit: rate(s.flow_rate_limit, self.flow_rate_limit),
            weight: s.weight.unwrap_or(self.weight),
            create_rate_limit: rate(s.create_rate_limit, self.create_rate_limit),
            breaker_threshold: s.breaker_threshold.unwrap_or(self.breaker_threshold),
            breaker_window_ms: s.breaker_window_ms.unwrap_or(self.breaker_window_ms),
            breaker_probe_ms: s.breaker_probe_ms.unwrap_or(self.breaker_probe_ms),
            paused: s.paused.unwrap_or(self.paused),
            failure_url: match &s.failure_url {
                Some(url) if url.is_empty() => None,
                Some(url) => Some(url.clone()),
                None => self.failure_url.clone(),
            },
            signing_scheme: s.signing_scheme.clone().unwrap_or_else(|| self.signing_scheme.clone()),
            chat_platform: match s.chat_platform.as_deref() {
                Some("") => None,
                Some(platform) => Some(platform.to_string()),
                None => self.chat_platform.clone(),
            },
            // Stopping chat notices (`chat_platform` "") clears the URL too, unless one is given
            // with it (refused: a URL needs a platform).
            chat_url: match (s.chat_platform.as_deref(), s.chat_url.as_deref()) {
                (Some(""), None) | (_, Some("")) => None,
                (_, Some(url)) => Some(url.to_string()),
                (_, None) => self.chat_url.clone(),
            },
            chat_secret: match s.chat_secret_change(self) {
                Some(Some(secret)) => ChatSecret::open(secret),
                Some(None) => ChatSecret::default(),
                None => self.chat_secret.clone(),
            },
            ..self.clone()
        }
    }

    /// The rules across settings that a biz type breaks.
    fn problems(&self) -> Vec<Error> {
        let mut problems = Vec::new();
        if self.backoff_max_ms < self.backoff_initial_ms {
            problems.push(Error::invalid("backoff_max_ms", "must be at least backoff_initial_ms"));
        }
        if self.mode == "callback" && self.callback_url.is_empty() {
            problems.push(Error::invalid("callback_url", "is required for a biz type in callback mode"));
        }
        problems.extend(self.scheme_problem());
        match (&self.chat_platform, &self.chat_url) {
            (Some(_), None) => {
                problems.push(Error::invalid("chat_url", "is required with a chat_platform (an empty chat_platform stops chat notices)"))
            }
            (None, Some(_)) => {
                problems.push(Error::invalid("chat_platform", "is required with a chat_url: `dingtalk`, `feishu`, `wecom` or `slack`"))
            }
            _ => {}
        }
        if let Some(secret) = &self.chat_secret.secret {
            match self.chat_platform.as_deref() {
                Some(platform) if !chat_signs(platform) => problems.push(Error::invalid(
                    "chat_secret",
                    format!("{platform} robots are not signed (their key is in the webhook URL): give no chat_secret"),
                )),
                None => problems.push(Error::invalid("chat_secret", "needs a chat_platform that signs: `dingtalk` or `feishu`")),
                // One given now is open; one stored was checked when given.
                Some("dingtalk") if secret.expose().is_ok_and(|s| !s.starts_with("SEC")) => problems
                    .push(Error::invalid("chat_secret", "a DingTalk robot's secret starts with `SEC`: copy it whole from the robot's settings")),
                _ => {}
            }
        }
        problems
    }
}

impl BizType {
    /// Standard Webhooks signs with the bytes of a `whsec_<base64>` secret: a biz type whose
    /// secret is not in that form (one chime made before it made them so) is switched after
    /// a rotation, whose new secret is. The check is on the scheme, the field that changes;
    /// a secret this process cannot open, or none yet (`planned`), is not checked here.
    fn scheme_problem(&self) -> Option<Error> {
        let secret = self.signing_secret.expose().ok().filter(|s| !s.is_empty())?;
        (self.signing_scheme == STANDARD_WEBHOOKS && tokens::whsec_key(secret).is_none()).then(|| {
            Error::invalid(
                "signing_scheme",
                "standard-webhooks signs with a secret in the form `whsec_<base64>`, and this biz type's secret is older than \
                 that form: rotate the signing secret first (the new one is in that form, and signs chime's way until the \
                 switch), then switch; with `chime apply`, or give a `whsec_` secret in the same change",
            )
        })
    }
}

/// The refusal of a change to an archived biz type (409).
pub(crate) fn archived(name: &str) -> Error {
    Error::invalid_state(format!("biz type `{name}` is archived: it cannot be changed, and its name stays reserved"))
}

/// Creates a biz type; `hosts` is the install's rule for callback URLs. Not audited: for
/// setups (tests, the bench); a person's or a client's create is `create_audited`.
pub async fn create(pool: &Pool, name: &str, settings: &Settings, hosts: CallbackHosts) -> Result<BizType, Error> {
    let mut tx = pool.begin().await?;
    let biz_type = create_in(&mut tx, name, settings, None, hosts).await?;
    tx.commit().await?;
    Ok(biz_type)
}

/// `create`, recorded in the audit log as `actor`'s (`biz_type.create`, the biz type as
/// made) in the same transaction.
pub async fn create_audited(pool: &Pool, name: &str, settings: &Settings, hosts: CallbackHosts, actor: &str) -> Result<BizType, Error> {
    let mut tx = pool.begin().await?;
    let biz_type = create_in(&mut tx, name, settings, None, hosts).await?;
    crate::audit::record(&mut tx, actor, Action::BizTypeCreate, name, None, serde_json::to_value(&biz_type).ok()).await?;
    tx.commit().await?;
    Ok(biz_type)
}

/// `create` inside the caller's transaction, with the given signing secret or, when
/// `None`, a new random one.
pub async fn create_in(
    conn: &mut PgConnection,
    name: &str,
    settings: &Settings,
    signing_secret: Option<&str>,
    hosts: CallbackHosts,
) -> Result<BizType, Error> {
    validate_name(name)?;
    settings.validate(hosts)?;
    if let Some(secret) = signing_secret {
        validate_signing_secret(secret)?;
        validate_secret_for_scheme(settings.signing_scheme.as_deref().unwrap_or("chime"), secret)?;
    }
    // Insert a row of schema defaults (as `pull`, which needs no URL yet), then apply the
    // settings through the same path as an update, so that both validate alike.
    let secret = signing_secret.map_or_else(new_secret, str::to_string);
    let (clear, sealed) = secrets::to_store(conn, name, &secret).await?;
    let inserted = crate::db::query_as::<BizType>(
        "INSERT INTO biz_types (name, mode, signing_secret, signing_secret_sealed) VALUES ($1, 'pull', $2, $3)
         ON CONFLICT (name) DO NOTHING RETURNING *",
    )
    .bind(name)
    .bind(clear)
    .bind(sealed)
    .fetch_optional(&mut *conn)
    .await?;
    let Some(inserted) = inserted else {
        let archived_name: Option<bool> =
            crate::db::query_scalar("SELECT archived_at IS NOT NULL FROM biz_types WHERE name = $1").bind(name).fetch_optional(&mut *conn).await?;
        return Err(match archived_name {
            // The name is taken for good: a key conflict, not a state to wait out.
            Some(true) => Error::key_conflict(archived(name).to_string()),
            _ => Error::key_conflict(format!("biz type `{name}` already exists")),
        });
    };
    let chat_secret = settings.chat_secret_change(&inserted).flatten();
    store(conn, &inserted.with(&settings.for_create())?, Some(chat_secret)).await
}

impl Settings {
    /// A new biz type delivers by callback unless told otherwise.
    fn for_create(&self) -> Settings {
        Settings { mode: Some(self.mode.clone().unwrap_or_else(|| "callback".into())), ..self.clone() }
    }

    /// What these settings do to `current`'s chat secret: None keeps it, `Some(None)` clears
    /// it, `Some(Some(secret))` sets it. A secret belongs to one robot, so a change of platform
    /// drops it unless one is given with it.
    fn chat_secret_change(&self, current: &BizType) -> Option<Option<&str>> {
        match self.chat_secret.as_deref() {
            Some("") => Some(None),
            Some(secret) => Some(Some(secret)),
            None => {
                let platform = self.chat_platform.as_deref().map(|p| Some(p).filter(|p| !p.is_empty()));
                platform.filter(|p| *p != current.chat_platform.as_deref()).map(|_| None)
            }
        }
    }
}

/// Applies the settings; returns the biz type before and after (for the audit log). A
/// callback URL already stored is not re-checked against `hosts` unless it is given again.
/// Not audited: for setups (tests, the bench); a person's or a client's change is
/// `update_audited`.
pub async fn update(pool: &Pool, name: &str, settings: &Settings, hosts: CallbackHosts) -> Result<(BizType, BizType), Error> {
    let mut tx = pool.begin().await?;
    let changed = update_in(&mut tx, name, settings, hosts).await?;
    tx.commit().await?;
    Ok(changed)
}

/// `update`, recorded in the audit log as `by`'s (an update, pause or resume: the biz type
/// before and after) in the same transaction.
pub async fn update_audited(
    pool: &Pool,
    name: &str,
    settings: &Settings,
    hosts: CallbackHosts,
    by: crate::audit::By<'_>,
) -> Result<(BizType, BizType), Error> {
    let mut tx = pool.begin().await?;
    let (before, after) = update_in(&mut tx, name, settings, hosts).await?;
    crate::audit::record(&mut tx, by.actor, by.action, name, serde_json::to_value(&before).ok(), serde_json::to_value(&after).ok()).await?;
    tx.commit().await?;
    Ok((before, after))
}

/// `update` inside the caller's transaction.
pub async fn update_in(conn: &mut PgConnection, name: &str, settings: &Settings, hosts: CallbackHosts) -> Result<(BizType, BizType), Error> {
    settings.validate(hosts)?;
    let before = crate::db::query_as::<BizType>("SELECT * FROM biz_types WHERE name = $1 FOR UPDATE")
        .bind(name)
        .fetch_optional(&mut *conn)
        .await?
        .ok_or_else(|| Error::NotFound(format!("no biz type named `{name}`")))?;
    let after = store(conn, &before.with(settings)?, settings.chat_secret_change(&before)).await?;
    Ok((before, after))
}

/// Writes a biz type's settings: every create and update ends here, so an archived biz type
/// is refused here. `chat_secret`: None keeps the stored one, else the one to store (or none).
async fn store(conn: &mut PgConnection, b: &BizType, chat_secret: Option<Option<&str>>) -> Result<BizType, Error> {
    if b.archived_at.is_some() {
        return Err(archived(&b.name));
    }
    notify_settings_changed(&mut *conn).await?;
    let chat_secret = match chat_secret {
        Some(Some(secret)) => Some(Some(secrets::to_store_one(conn, &b.name, secret).await?)),
        Some(None) => Some(None),
        None => None,
    };
    Ok(crate::db::query_as::<BizType>(
        "UPDATE biz_types SET description = $2, callback_url = $3, mode = $4, timeout_ms = $5,
                max_attempts = $6, backoff_initial_ms = $7, backoff_max_ms = $8, rate_limit = $9,
                max_in_flight = $10, create_rate_limit = $11, paused = $12, failure_url = $13, max_snoozes = $14,
                breaker_threshold = $15, breaker_window_ms = $16, breaker_probe_ms = $17,
                flow_max_in_flight = $18, ordered = $19, flow_rate_limit = $20, weight = $21,
                signing_scheme = $22,
                chat_platform = $23, chat_url = $24,
                chat_secret = CASE WHEN $25 THEN $26 ELSE chat_secret END,
                updated_at = now()
          WHERE id = $1
          RETURNING *",
    )
    .bind(b.id)
    .bind(&b.description)
    .bind(&b.callback_url)
    .bind(&b.mode)
    .bind(b.timeout_ms)
    .bind(b.max_attempts)
    .bind(b.backoff_initial_ms)
    .bind(b.backoff_max_ms)
    .bind(b.rate_limit)
    .bind(b.max_in_flight)
    .bind(b.create_rate_limit)
    .bind(b.paused)
    .bind(&b.failure_url)
    .bind(b.max_snoozes)
    .bind(b.breaker_threshold)
    .bind(b.breaker_window_ms)
    .bind(b.breaker_probe_ms)
    .bind(b.flow_max_in_flight)
    .bind(b.ordered)
    .bind(b.flow_rate_limit)
    .bind(b.weight)
    .bind(&b.signing_scheme)
    .bind(&b.chat_platform)
    .bind(&b.chat_url)
    .bind(chat_secret.is_some())
    .bind(chat_secret.flatten())
    .fetch_one(&mut *conn)
    .await?)
}

/// Tells every node's engine to re-read the biz types now rather than at its next
/// periodic refresh (sent on commit).
async fn notify_settings_changed(conn: &mut PgConnection) -> Result<(), Error> {
    wake::notify(conn, Wake::Settings).await?;
    Ok(())
}

/// Archives (deletes) the named biz type: its tokens stop working, its engines stop
/// delivering it, its timers stop firing, and its pending tasks are cancelled; its tasks
/// stay readable until retention drops them, and its name stays taken. The archive is in
/// the audit log as done by `actor`, written with it. Archiving again changes nothing and
/// records nothing, but cancels any pending task left. Returns the biz type before and
/// after, and how many tasks were cancelled.
pub async fn archive(pool: &Pool, name: &str, actor: &str) -> Result<(BizType, BizType, u64), Error> {
    let not_found = || Error::NotFound(format!("no biz type named `{}`", name.escape_debug()));
    validate_name(name).map_err(|_| not_found())?;
    let mut tx = pool.begin().await?;
    let before = crate::db::query_as::<BizType>("SELECT * FROM biz_types WHERE name = $1 FOR UPDATE")
        .bind(name)
        .fetch_optional(&mut *tx)
        .await?
        .ok_or_else(not_found)?;
    // Archived once: a second archive changes nothing. Two statements rather than a CASE
    // over now(), which Citus refuses on biz_types (a reference table there).
    let after = crate::db::query_as::<BizType>(match before.archived_at {
        None => "UPDATE biz_types SET archived_at = now(), updated_at = now() WHERE id = $1 RETURNING *",
        Some(_) => "SELECT * FROM biz_types WHERE id = $1",
    })
    .bind(before.id)
    .fetch_one(&mut *tx)
    .await?;
    notify_settings_changed(&mut tx).await?;
    // In the transaction, so that the count is of every task pending until now: once the
    // archive is committed, the leader's sweep may cancel them too.
    let mut cancelled = crate::tasks::cancel_archived(&mut *tx, Some(before.id)).await?;
    if before.archived_at.is_none() {
        let mut record = serde_json::to_value(&after).ok();
        if let Some(serde_json::Value::Object(fields)) = &mut record {
            fields.insert("cancelled_tasks".into(), cancelled.into());
        }
        crate::audit::record(&mut tx, actor, Action::BizTypeArchive, name, serde_json::to_value(&before).ok(), record).await?;
    }
    tx.commit().await?;
    // After the commit: a task created meanwhile by a token not yet refused is pending
    // now and cancelled here (and any left later by the leader's sweep).
    cancelled += crate::tasks::cancel_archived(pool, Some(before.id)).await?;
    Ok((before, after, cancelled))
}

/// The biz types in use (not archived), by name.
pub async fn list(pool: &Pool) -> Result<Vec<BizType>, Error> {
    Ok(crate::db::query_as::<BizType>("SELECT * FROM biz_types WHERE archived_at IS NULL ORDER BY name").fetch_all(pool).await?)
}

/// Every biz type, archived ones included, by name.
pub async fn list_all(pool: &Pool) -> Result<Vec<BizType>, Error> {
    Ok(crate::db::query_as::<BizType>("SELECT * FROM biz_types ORDER BY name").fetch_all(pool).await?)
}

pub async fn by_name(pool: &Pool, name: &str) -> Result<Option<BizType>, Error> {
    if validate_name(name).is_err() {
        return Ok(None);
    }
    Ok(crate::db::query_as::<BizType>("SELECT * FROM biz_types WHERE name = $1").bind(name).fetch_optional(pool).await?)
}

/// What `reencrypt` did: secrets sealed that were in clear, re-sealed from an older key,
/// and left as they were (sealed under the current key already).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Reencrypted {
    pub sealed: u64,
    pub resealed: u64,
    pub unchanged: u64,
}

/// Seals every signing secret under the current key (`chime secrets reencrypt`): those in
/// clear, and those under an older key. Idempotent; all or nothing, so a secret that cannot
/// be opened stops it with the biz type named. The values do not change, so the engines need
/// not re-read them.
pub async fn reencrypt(pool: &Pool) -> Result<Reencrypted, Error> {
    let keyring = secrets::keyring();
    if !keyring.seals() {
        return Err(Error::invalid("CHIME_SECRET_KEY", "is not set: set it (or CHIME_SECRET_KEY_FILE) to the key to encrypt with"));
    }
    let mut tx = pool.begin().await?;
    // (id, name, secret in clear, sealed, previous secret, chat robot secret)
    type Stored = (i32, String, Option<String>, Option<String>, Option<String>, Option<String>);
    let rows: Vec<Stored> = crate::db::query_as(
        "SELECT id, name, signing_secret, signing_secret_sealed, previous_secret, chat_secret FROM biz_types ORDER BY id FOR UPDATE",
    )
    .fetch_all(&mut *tx)
    .await?;
    let mut done = Reencrypted::default();
    for (id, name, clear, sealed, previous, chat) in rows {
        // The chat robot's secret and the one a rotation replaced, each kept in one column
        // (`secrets.rs`), counted alike.
        for (column, value) in [("chat_secret", chat), ("previous_secret", previous)] {
            let Some(value) = value else { continue };
            if keyring.is_current(&value) {
                done.unchanged += 1;
                continue;
            }
            let was_clear = !secrets::is_sealed(&value);
            let stored = keyring.store_one(&name, keyring.open_one(&name, &value).expose()?);
            // The column is one of the two names above, not a client's.
            crate::db::query(sqlx::AssertSqlSafe(format!("UPDATE biz_types SET {column} = $2 WHERE id = $1")))
                .bind(id)
                .bind(stored)
                .execute(&mut *tx)
                .await?;
            if was_clear { done.sealed += 1 } else { done.resealed += 1 }
        }
        if clear.is_none() && sealed.as_deref().is_some_and(|s| keyring.is_current(s)) {
            done.unchanged += 1;
            continue;
        }
        let was_clear = clear.is_some();
        let secret = keyring.open(&name, clear, sealed.as_deref());
        let (clear, sealed) = keyring.store(&name, secret.expose()?);
        crate::db::query("UPDATE biz_types SET signing_secret = $2, signing_secret_sealed = $3 WHERE id = $1")
            .bind(id)
            .bind(clear)
            .bind(sealed)
            .execute(&mut *tx)
            .await?;
        if was_clear { done.sealed += 1 } else { done.resealed += 1 }
    }
    tx.commit().await?;
    Ok(done)
}

/// The signing secrets this process cannot open (sealed under a key it does not have), the
/// current ones, those still signing after a rotation and chat robots': a node refuses to
/// start with any.
pub async fn unopened_secrets(pool: &Pool) -> Result<Vec<SecretError>, Error> {
    let now = Utc::now();
    let unopened = |b: BizType| {
        let previous = b.previous_secret.signing_at(now).and_then(|p| p.expose().err());
        let chat = b.chat_secret.secret.as_ref().and_then(|s| s.expose().err());
        b.signing_secret.expose().err().into_iter().chain(previous).chain(chat)
    };
    Ok(list(pool).await?.into_iter().flat_map(unopened).collect())
}

/// The biz types whose signing secret (or the one a rotation replaced, or its chat robot's) is stored in clear,
/// by name: with CHIME_SECRET_KEY set, `chime secrets reencrypt` encrypts them.
pub async fn secrets_in_clear(pool: &Pool) -> Result<Vec<String>, Error> {
    Ok(crate::db::query_scalar(
        "SELECT name FROM biz_types
          WHERE signing_secret IS NOT NULL OR previous_secret NOT LIKE 'enc:v1:%'
             OR chat_secret NOT LIKE 'enc:v1:%'
          ORDER BY name",
    )
    .fetch_all(pool)
    .await?)
}

/// Whether a biz type of this name exists, archived or not (a name that cannot be valid never does).
pub async fn exists(pool: &Pool, name: &str) -> Result<bool, Error> {
    if validate_name(name).is_err() {
        return Ok(false);
    }
    Ok(crate::db::query_scalar("SELECT EXISTS (SELECT 1 FROM biz_types WHERE name = $1)").bind(name).fetch_one(pool).await?)
}

/// The id of the named biz type (archived or not), or `NotFound`.
pub async fn id_of<'e>(db: impl sqlx::PgExecutor<'e>, name: &str) -> Result<i32, Error> {
    let id = match validate_name(name) {
        Ok(()) => crate::db::query_scalar::<i32>("SELECT id FROM biz_types WHERE name = $1").bind(name).fetch_optional(db).await?,
        Err(_) => None,
    };
    id.ok_or_else(|| Error::NotFound(format!("no biz type named `{}`", name.escape_debug())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_spec_pattern() {
        for ok in ["a", "order-close", "coupon_expiry", "9lives", &"x".repeat(64)] {
            assert!(validate_name(ok).is_ok(), "{ok}");
        }
        for bad in ["", "-a", "_a", "Order", "a b", "é", &"x".repeat(65)] {
            assert!(validate_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn callback_urls_must_be_http() {
        let any = CallbackHosts::Any;
        assert!(validate_callback_url("https://example.test/hook", any).is_ok());
        assert!(validate_callback_url("http://127.0.0.1:9000/", any).is_ok());
        assert!(validate_callback_url("ftp://example.test/", any).is_err());
        assert!(validate_callback_url("file:///etc/passwd", any).is_err());
        assert!(validate_callback_url("not a url", any).is_err());
    }

    #[test]
    fn denying_private_callbacks_refuses_private_addresses_by_field() {
        let public_only = CallbackHosts::PublicOnly;
        let Err(Error::Invalid { field, message }) = validate_callback_url("http://127.0.0.1:9000/", public_only) else {
            panic!("127.0.0.1 accepted")
        };
        assert_eq!(field, "callback_url");
        assert!(message.contains("127.0.0.1 is in a denied range (loopback)"), "{message}");
        assert!(validate_callback_url("http://localhost:9000/", public_only).is_err());
        assert!(validate_callback_url("https://example.test/hook", public_only).is_ok());
    }

    mod properties {
        use proptest::prelude::*;

        use super::*;

        /// the pattern of docs/design/contract.md, Biz types, `[a-z0-9][a-z0-9_-]{0,63}`, read literally.
        fn spec_name(s: &str) -> bool {
            let allowed = |i: usize, b: u8| b.is_ascii_lowercase() || b.is_ascii_digit() || (i > 0 && (b == b'-' || b == b'_'));
            (1..=64).contains(&s.len()) && s.bytes().enumerate().all(|(i, b)| allowed(i, b))
        }

        /// Rates of every magnitude: tiny, huge, negative, NaN and the infinities.
        fn any_rate() -> impl Strategy<Value = f64> {
            prop_oneof![
                any::<f64>(),
                (-400i32..400).prop_map(|e| 10f64.powi(e)),
                prop::sample::select(vec![
                    0.0,
                    -0.0,
                    5e-324,
                    f64::MIN_POSITIVE,
                    1_000_000.0,
                    1_000_000.000_001,
                    f64::MAX,
                    f64::NAN,
                    f64::INFINITY,
                    f64::NEG_INFINITY
                ]),
            ]
        }

        proptest! {
            #![proptest_config(crate::proptest_config(512))]

            /// A name is accepted exactly when it matches the spec's pattern.
            #[test]
            fn names_are_accepted_exactly_by_the_spec_pattern(name in prop_oneof![any::<String>(), "[a-z0-9_-]{0,66}", "[a-z0-9][a-z0-9_-]{0,63}"]) {
                prop_assert_eq!(validate_name(&name).is_ok(), spec_name(&name), "{:?}", name);
            }

            /// A rate is accepted exactly when it is a number from 0 to 1000000, and the
            /// refusal names the setting.
            #[test]
            fn rates_are_accepted_exactly_from_zero_to_a_million(r in any_rate()) {
                let settings = Settings { rate_limit: Some(r), ..Default::default() };
                match settings.validate(CallbackHosts::Any) {
                    Ok(()) => prop_assert!((0.0..=1_000_000.0).contains(&r), "{r} accepted"),
                    Err(Error::Invalid { field, .. }) => prop_assert!(!(0.0..=1_000_000.0).contains(&r) && field == "rate_limit", "{r} refused as {field}"),
                    Err(e) => prop_assert!(false, "{e:?}"),
                }
            }

            /// Integer settings are accepted exactly inside their documented range.
            #[test]
            fn whole_number_settings_are_accepted_exactly_in_range(v in prop_oneof![any::<i32>(), -2i32..2, 599_990i32..600_010]) {
                let settings = Settings { timeout_ms: Some(v), ..Default::default() };
                prop_assert_eq!(settings.validate(CallbackHosts::Any).is_ok(), (1..=600_000).contains(&v));
            }

            /// Any text as a callback URL is checked without panicking; an accepted one is
            /// http(s) with a host.
            #[test]
            fn any_callback_url_is_checked_cleanly(raw in prop_oneof![any::<String>(), "(https?|ftp|file|javascript)://[^ ]{0,20}"]) {
                if validate_callback_url(&raw, CallbackHosts::Any).is_ok() {
                    let url = url::Url::parse(&raw).unwrap();
                    prop_assert!(matches!(url.scheme(), "http" | "https") && url.host().is_some(), "{raw}");
                }
            }
        }
    }
}
