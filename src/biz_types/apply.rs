//! `chime apply`: makes biz types match a TOML file, for installs managed as code (docs/design/contract.md, Operating).
//!
//! The file has one table per biz type, `[biz_types.NAME]`, holding the settings of
//! `chime biz-type create` (and `paused`). A setting the file leaves out is kept as it is,
//! or for a new biz type takes its default; biz types the file does not name are left as
//! they are (never deleted). Signing secrets are never written in the file: it says where
//! to read one, `signing_secret = { env = "VAR" }` or `{ file = "PATH" }`; without that,
//! chime keeps the secret it has, or generates one for a new biz type.
//!
//! An apply reads every biz type under a row lock, plans (each biz type is created,
//! updated field by field, or left unchanged), and checks the whole plan before writing:
//! every problem in the file is reported at once and nothing is written. The writes go
//! through `create_in`/`update_in`, the rules every other writer uses, in one transaction
//! with their audit entries, so an apply happens entirely or not at all. Applying the same
//! file again writes nothing (not even `updated_at`).

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use crate::db::Pool;
use serde::Deserialize;
use sqlx::PgConnection;

use super::{
    BizType, MAX_SIGNING_SECRET_BYTES, Settings, SigningSecret, create_in, set_signing_secret, update_in, validate_name, validate_secret_for_scheme,
    validate_signing_secret,
};
use crate::audit;
use crate::callback_hosts::CallbackHosts;
use crate::error::Error;

/// Who the audit log says made the changes.
const ACTOR: &str = "apply";

/// The file as written. Unknown keys are refused, with the key and its line.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    biz_types: BTreeMap<String, Entry>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    description: Option<String>,
    callback_url: Option<String>,
    mode: Option<String>,
    timeout_ms: Option<i32>,
    max_attempts: Option<i32>,
    max_snoozes: Option<i32>,
    backoff_initial_ms: Option<i32>,
    backoff_max_ms: Option<i32>,
    rate_limit: Option<f64>,
    max_in_flight: Option<i32>,
    flow_max_in_flight: Option<i32>,
    ordered: Option<bool>,
    flow_rate_limit: Option<f64>,
    weight: Option<i32>,
    create_rate_limit: Option<f64>,
    breaker_threshold: Option<i32>,
    breaker_window_ms: Option<i32>,
    breaker_probe_ms: Option<i32>,
    paused: Option<bool>,
    failure_url: Option<String>,
    signing_scheme: Option<String>,
    signing_secret: Option<SecretRef>,
    chat_platform: Option<String>,
    chat_url: Option<String>,
    /// Read as `signing_secret` is, never written in the file.
    chat_secret: Option<SecretRef>,
}

/// Where a secret is read from: `{ env = "VAR" }` or `{ file = "PATH" }`.
#[derive(Debug)]
enum SecretRef {
    Env(String),
    File(PathBuf),
}

const SECRET_FORMS: &str = "{ env = \"VAR\" } or { file = \"PATH\" }";

/// By hand, so that a secret written in the file by mistake is not repeated in the error.
impl<'de> Deserialize<'de> for SecretRef {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::{Error as _, MapAccess, Visitor};
        struct Source;
        impl<'de> Visitor<'de> for Source {
            type Value = SecretRef;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                write!(f, "{SECRET_FORMS}")
            }
            fn visit_str<E: serde::de::Error>(self, _: &str) -> Result<SecretRef, E> {
                Err(E::custom(format!("a secret is never written in the file; say where to read it: {SECRET_FORMS}")))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<SecretRef, A::Error> {
                let one = |found: Option<(String, String)>| match found {
                    Some((key, value)) if key == "env" => Ok(SecretRef::Env(value)),
                    Some((key, value)) if key == "file" => Ok(SecretRef::File(value.into())),
                    Some((key, _)) => Err(A::Error::custom(format!("unknown secret source `{key}`: expected {SECRET_FORMS}"))),
                    None => Err(A::Error::custom(format!("no secret source: expected {SECRET_FORMS}"))),
                };
                let source = one(map.next_entry()?)?;
                if map.next_key::<String>()?.is_some() {
                    return Err(A::Error::custom(format!("one secret source only: {SECRET_FORMS}")));
                }
                Ok(source)
            }
        }
        deserializer.deserialize_any(Source)
    }
}

/// A biz type as the file wants it, its secret read. (No `Debug`: it holds the secret.)
#[derive(Clone)]
pub struct Desired {
    name: String,
    settings: Settings,
    secret: Option<Secret>,
    chat_secret: Option<Secret>,
}

#[derive(Clone)]
struct Secret {
    /// Where it came from, for the plan: never the value.
    source: String,
    /// The secret, or why it could not be read.
    value: Result<String, String>,
}

/// Reads the file's text: a parse error names the line (and an unknown key); secrets are
/// read from the environment or files (relative paths from `dir`, the file's directory).
/// A secret that cannot be read is reported by `plan` with the other problems.
pub fn load(text: &str, dir: &Path) -> Result<Vec<Desired>, String> {
    // The message and its line, without the line's text: it could hold a secret.
    let file: File = toml::from_str(text).map_err(|e| match e.span() {
        Some(span) => format!("line {}: {}", text[..span.start].matches('\n').count() + 1, e.message()),
        None => e.message().to_string(),
    })?;
    Ok(file.biz_types.into_iter().map(|(name, entry)| entry.desired(name, dir)).collect())
}

impl Entry {
    fn desired(self, name: String, dir: &Path) -> Desired {
        let read = |r: SecretRef| match r {
            SecretRef::Env(var) => Secret {
                value: std::env::var(&var).map_err(|e| match e {
                    std::env::VarError::NotPresent => format!("environment variable {var} is not set"),
                    std::env::VarError::NotUnicode(_) => format!("environment variable {var} is not UTF-8"),
                }),
                source: format!("environment variable {var}"),
            },
            SecretRef::File(path) => {
                let path = dir.join(path);
                Secret { value: read_secret_file(&path), source: format!("file {}", path.display()) }
            }
        };
        let secret = self.signing_secret.map(read);
        let chat_secret = self.chat_secret.map(read);
        let settings = Settings {
            description: self.description,
            callback_url: self.callback_url,
            mode: self.mode,
            timeout_ms: self.timeout_ms,
            max_attempts: self.max_attempts,
            max_snoozes: self.max_snoozes,
            backoff_initial_ms: self.backoff_initial_ms,
            backoff_max_ms: self.backoff_max_ms,
            rate_limit: self.rate_limit,
            max_in_flight: self.max_in_flight,
            flow_max_in_flight: self.flow_max_in_flight,
            ordered: self.ordered,
            flow_rate_limit: self.flow_rate_limit,
            weight: self.weight,
            create_rate_limit: self.create_rate_limit,
            breaker_threshold: self.breaker_threshold,
            breaker_window_ms: self.breaker_window_ms,
            breaker_probe_ms: self.breaker_probe_ms,
            paused: self.paused,
            failure_url: self.failure_url,
            signing_scheme: self.signing_scheme,
            chat_platform: self.chat_platform,
            chat_url: self.chat_url,
            // Set by `plan` where the file's differs from the one stored.
            chat_secret: None,
        };
        Desired { name, settings, secret, chat_secret }
    }
}

/// A secret from a file: a regular file, of which at most what a secret can be is read, so
/// that `/dev/zero` or a FIFO named by mistake is refused at once rather than read for ever
/// (or waited on). A trailing line break is the file's, not the secret's.
fn read_secret_file(path: &Path) -> Result<String, String> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let cannot = |e: std::io::Error| format!("cannot read {}: {e}", path.display());
    // Non-blocking, so that opening a FIFO does not wait for a writer; the file is then
    // checked on what was opened, not on its name.
    let file = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(path).map_err(cannot)?;
    let kind = file.metadata().map_err(cannot)?.file_type();
    if !kind.is_file() {
        return Err(format!("{} is not a regular file ({}): give a file that holds the secret", path.display(), file_kind(kind)));
    }
    // Room for the longest secret and a line break ("\r\n"); one byte more says it is too long.
    let limit = MAX_SIGNING_SECRET_BYTES + 2;
    let mut bytes = Vec::with_capacity(limit + 1);
    file.take(limit as u64 + 1).read_to_end(&mut bytes).map_err(cannot)?;
    if bytes.len() > limit {
        return Err(format!("{} is longer than a signing secret can be ({MAX_SIGNING_SECRET_BYTES} bytes)", path.display()));
    }
    let text = String::from_utf8(bytes).map_err(|_| format!("{} is not UTF-8 text", path.display()))?;
    Ok(text.trim_end_matches(['\r', '\n']).to_string())
}

/// What a file that is not a regular one is, for the error.
fn file_kind(kind: std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if kind.is_dir() {
        "a directory"
    } else if kind.is_fifo() {
        "a FIFO"
    } else if kind.is_char_device() {
        "a character device"
    } else if kind.is_block_device() {
        "a block device"
    } else if kind.is_socket() {
        "a socket"
    } else {
        "not a regular file"
    }
}

/// What an apply does, biz type by biz type (by name), and the biz types it leaves alone.
/// (No `Debug`: it holds the secrets to store.)
pub struct Plan {
    pub steps: Vec<Step>,
    pub not_in_file: Vec<String>,
}

pub struct Step {
    pub name: String,
    pub action: Action,
    /// One line per setting: `field: old → new`, for a new biz type `field: value`, and
    /// for the secret only where it comes from.
    pub changes: Vec<String>,
    settings: Settings,
    /// Whether `settings` change anything (else only the secret changes, if anything).
    settings_changed: bool,
    /// The settings the biz type will have.
    planned: BizType,
    /// A secret to store (a new biz type without one gets a generated one).
    secret: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Create,
    Update,
    Unchanged,
}

impl Plan {
    pub fn changes_anything(&self) -> bool {
        self.steps.iter().any(|s| s.action != Action::Unchanged)
    }

    pub fn count(&self, action: Action) -> usize {
        self.steps.iter().filter(|s| s.action == action).count()
    }
}

/// A problem with one biz type of the file.
#[derive(Debug)]
pub struct Problem {
    pub biz_type: String,
    pub error: Error,
}

/// Why an apply wrote nothing.
#[derive(Debug, thiserror::Error)]
pub enum Failure {
    #[error("{}", problems_text(.0))]
    Invalid(Vec<Problem>),
    #[error(transparent)]
    Error(#[from] Error),
}

impl From<sqlx::Error> for Failure {
    fn from(e: sqlx::Error) -> Self {
        Failure::Error(e.into())
    }
}

fn problems_text(problems: &[Problem]) -> String {
    let mut text = format!("the file has {} problem(s); nothing was changed:", problems.len());
    for p in problems {
        text.push_str(&format!("\n  biz type `{}`: {}", p.biz_type.escape_debug(), p.error));
    }
    text
}

/// The settings as the plan shows them, in the file's terms: text quoted, a rate of 0 as
/// "unlimited". Floats print exactly (shortest round-trip form), so two lists are equal
/// exactly when the settings are.
fn shown(b: &BizType) -> [(&'static str, String); 23] {
    let rate = |r: Option<f64>| r.map_or_else(|| "unlimited".to_string(), |r| r.to_string());
    [
        ("mode", b.mode.clone()),
        ("callback_url", format!("{:?}", b.callback_url)),
        ("description", format!("{:?}", b.description)),
        ("timeout_ms", b.timeout_ms.to_string()),
        ("max_attempts", b.max_attempts.to_string()),
        ("max_snoozes", b.max_snoozes.to_string()),
        ("backoff_initial_ms", b.backoff_initial_ms.to_string()),
        ("backoff_max_ms", b.backoff_max_ms.to_string()),
        ("rate_limit", rate(b.rate_limit)),
        ("max_in_flight", b.max_in_flight.to_string()),
        ("flow_max_in_flight", b.flow_max_in_flight.to_string()),
        ("ordered", b.ordered.to_string()),
        ("flow_rate_limit", rate(b.flow_rate_limit)),
        ("weight", b.weight.to_string()),
        ("create_rate_limit", rate(b.create_rate_limit)),
        ("breaker_threshold", b.breaker_threshold.to_string()),
        ("breaker_window_ms", b.breaker_window_ms.to_string()),
        ("breaker_probe_ms", b.breaker_probe_ms.to_string()),
        ("paused", b.paused.to_string()),
        ("failure_url", b.failure_url.as_ref().map_or_else(|| "none".to_string(), |u| format!("{u:?}"))),
        ("signing_scheme", b.signing_scheme.clone()),
        ("chat_platform", b.chat_platform.clone().unwrap_or_else(|| "none".to_string())),
        ("chat_url", b.chat_url.as_ref().map_or_else(|| "none".to_string(), |u| format!("{u:?}"))),
    ]
}

/// The settings that differ between two versions of a biz type, as `field: old → new`.
fn diff(before: &BizType, after: &BizType) -> Vec<String> {
    shown(before)
        .into_iter()
        .zip(shown(after))
        .filter(|((_, old), (_, new))| old != new)
        .map(|((field, old), (_, new))| format!("{field}: {old} → {new}"))
        .collect()
}

/// Plans the file against the biz types there are, checking every biz type of the file
/// with the rules every writer uses; all problems are returned together.
pub fn plan(desired: Vec<Desired>, current: &[BizType], hosts: CallbackHosts) -> Result<Plan, Failure> {
    let mut steps = Vec::new();
    let mut problems = Vec::new();
    for mut d in desired {
        let existing = current.iter().find(|b| b.name == d.name);
        // The chat secret, where the file gives one that is not the one stored: a setting
        // (`Settings::chat_secret`), shown by where it comes from.
        let mut chat_secret_change = None;
        let mut chat_secret_problem = None;
        match &d.chat_secret {
            None => {}
            Some(Secret { value: Err(why), .. }) => chat_secret_problem = Some(Error::invalid("chat_secret", why.clone())),
            Some(Secret { value: Ok(value), source }) => {
                let stored = existing.and_then(|b| b.chat_secret.secret.as_ref()).and_then(|s| s.expose().ok());
                let platform_kept =
                    d.settings.chat_platform.as_ref().is_none_or(|p| Some(p.as_str()) == existing.and_then(|b| b.chat_platform.as_deref()));
                if stored != Some(value.as_str()) || !platform_kept {
                    d.settings.chat_secret = Some(value.clone());
                    chat_secret_change = Some(format!("chat_secret: {} (from {source})", if existing.is_some() { "changed" } else { "set" }));
                }
            }
        }
        let mut errors: Vec<Error> = validate_name(&d.name).err().into_iter().collect();
        errors.extend(chat_secret_problem);
        errors.extend(d.settings.problems(hosts));
        let secret = match &d.secret {
            None => None,
            Some(Secret { value: Err(why), .. }) => {
                errors.push(Error::invalid("signing_secret", why.clone()));
                None
            }
            Some(Secret { value: Ok(value), source }) => {
                errors.extend(validate_signing_secret(value).err());
                Some((value.clone(), source.clone()))
            }
        };
        let mut planned = existing.map_or_else(|| BizType::planned(&d.name, &d.settings), |b| b.merged(&d.settings));
        // The secret the file gives is the one the biz type signs with, in its scheme.
        if let Some((value, _)) = &secret {
            errors.extend(validate_secret_for_scheme(&planned.signing_scheme, value).err());
            planned.signing_secret = SigningSecret::Open(value.clone());
        }
        // The rules across fields, for fields not already refused on their own.
        let field = |e: &Error| if let Error::Invalid { field, .. } = e { Some(field.clone()) } else { None };
        for e in planned.problems() {
            if !errors.iter().any(|known| field(known) == field(&e)) {
                errors.push(e);
            }
        }
        if !errors.is_empty() {
            problems.extend(errors.into_iter().map(|error| Problem { biz_type: d.name.clone(), error }));
            continue;
        }
        let step = match existing {
            None => {
                let mut changes: Vec<String> = shown(&planned).into_iter().map(|(field, value)| format!("{field}: {value}")).collect();
                changes.push(match &secret {
                    Some((_, source)) => format!("signing_secret: from {source}"),
                    None => "signing_secret: generated (not shown; to know it, reference one from the environment or a file)".into(),
                });
                changes.extend(chat_secret_change);
                let secret = secret.map(|s| s.0);
                Step { name: d.name, action: Action::Create, changes, settings: d.settings, settings_changed: true, planned, secret }
            }
            Some(before) => {
                let mut changes = diff(before, &planned);
                // A chat secret dropped by a change of platform is a change too.
                if chat_secret_change.is_none() && before.chat_secret.secret.is_some() && planned.chat_secret.secret.is_none() {
                    chat_secret_change = Some("chat_secret: removed (the chat_platform changed)".into());
                }
                changes.extend(chat_secret_change);
                let settings_changed = !changes.is_empty();
                // A secret this process cannot open is replaced: it could not sign anyway.
                let secret = secret.filter(|(value, _)| before.signing_secret.expose().ok() != Some(value.as_str()));
                if let Some((_, source)) = &secret {
                    changes.push(format!("signing_secret: changed (from {source})"));
                }
                let action = if changes.is_empty() { Action::Unchanged } else { Action::Update };
                let secret = secret.map(|s| s.0);
                Step { name: d.name, action, changes, settings: d.settings, settings_changed, planned, secret }
            }
        };
        steps.push(step);
    }
    if !problems.is_empty() {
        return Err(Failure::Invalid(problems));
    }
    let not_in_file = current.iter().filter(|b| !steps.iter().any(|s| s.name == b.name)).map(|b| b.name.clone()).collect();
    Ok(Plan { steps, not_in_file })
}

/// Plans the file against the database and, unless `dry_run`, carries the plan out in
/// one transaction. Returns the plan (what was, or would be, done).
pub async fn run(pool: &Pool, desired: Vec<Desired>, hosts: CallbackHosts, dry_run: bool) -> Result<Plan, Failure> {
    let mut tx = pool.begin().await?;
    // A dry run only reads (a read-only database role can check for drift). A real one
    // locks every biz type until it commits, so that nothing changes one between the plan
    // and its writes, and two applies run one after the other.
    let query = if dry_run { "SELECT * FROM biz_types ORDER BY name" } else { "SELECT * FROM biz_types ORDER BY name FOR UPDATE" };
    let current = crate::db::query_as::<BizType>(query).fetch_all(&mut *tx).await?;
    let plan = plan(desired, &current, hosts)?;
    if dry_run || !plan.changes_anything() {
        return Ok(plan);
    }
    for step in &plan.steps {
        write(&mut tx, step, hosts).await?;
    }
    tx.commit().await?;
    Ok(plan)
}

async fn write(tx: &mut PgConnection, step: &Step, hosts: CallbackHosts) -> Result<(), Failure> {
    let name = step.name.as_str();
    let json = |b: &BizType| serde_json::to_value(b).ok();
    let written = match step.action {
        Action::Unchanged => return Ok(()),
        Action::Create => {
            let created = create_in(tx, name, &step.settings, step.secret.as_deref(), hosts).await?;
            audit::record(&mut *tx, ACTOR, audit::Action::BizTypeCreate, name, None, json(&created)).await?;
            created
        }
        Action::Update => {
            // The secret first: a switch to standard-webhooks is checked against the
            // secret the biz type will sign with, the file's when it gives one.
            if let Some(secret) = &step.secret {
                set_signing_secret(tx, step.planned.id, secret).await?;
                audit::record(&mut *tx, ACTOR, audit::Action::BizTypeSetSecret, name, None, None).await?;
            }
            let mut after = step.planned.clone();
            if step.settings_changed {
                let (old, new) = update_in(tx, name, &step.settings, hosts).await?;
                audit::record(&mut *tx, ACTOR, audit::Action::BizTypeUpdate, name, json(&old), json(&new)).await?;
                after = new;
            }
            after
        }
    };
    // The row written must be the one planned (and printed); if not, a rule differs
    // between the plan and the writers, and nothing is committed.
    let off = diff(&step.planned, &written);
    if !off.is_empty() {
        return Err(Error::invalid_state(format!(
            "biz type `{name}` was written differently from its plan ({}); nothing was changed",
            off.join(", ")
        ))
        .into());
    }
    Ok(())
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for step in &self.steps {
            let verb = match step.action {
                Action::Create => "create",
                Action::Update => "update",
                Action::Unchanged => "unchanged",
            };
            writeln!(f, "{verb} {}", step.name)?;
            for change in &step.changes {
                writeln!(f, "    {change}")?;
            }
        }
        if !self.not_in_file.is_empty() {
            writeln!(f, "not in the file (left as is): {}", self.not_in_file.join(", "))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ANY: CallbackHosts = CallbackHosts::Any;

    fn desired(text: &str) -> Vec<Desired> {
        load(text, Path::new("/nonexistent")).unwrap()
    }

    /// A biz type as stored, from the settings of a file.
    fn stored(name: &str, text: &str, secret: &str) -> BizType {
        let d = desired(text).into_iter().find(|d| d.name == name).unwrap();
        BizType { signing_secret: crate::biz_types::SigningSecret::Open(secret.into()), ..BizType::planned(name, &d.settings) }
    }

    fn problems(result: Result<Plan, Failure>) -> Vec<String> {
        match result {
            Err(Failure::Invalid(problems)) => problems.iter().map(|p| format!("{}: {}", p.biz_type, p.error)).collect(),
            Err(e) => panic!("expected problems, got {e}"),
            Ok(plan) => panic!("expected problems, got a plan:\n{plan}"),
        }
    }

    const ORDERS: &str = r#"
        [biz_types.orders]
        callback_url = "https://orders.test/hook"
        timeout_ms = 5000
        rate_limit = 0
    "#;

    #[test]
    fn a_new_biz_type_is_created_with_every_setting_shown() {
        let plan = plan(desired(ORDERS), &[], ANY).unwrap();
        assert_eq!(plan.steps.len(), 1);
        let step = &plan.steps[0];
        assert_eq!(step.action, Action::Create);
        for line in [
            "mode: callback",
            r#"callback_url: "https://orders.test/hook""#,
            "timeout_ms: 5000",
            "rate_limit: unlimited",
            "max_attempts: 60",
            "paused: false",
            "signing_scheme: chime",
        ] {
            assert!(step.changes.iter().any(|c| c == line), "{line} not in {:?}", step.changes);
        }
        assert!(step.changes.last().unwrap().starts_with("signing_secret: generated"), "{:?}", step.changes);
        assert!(plan.changes_anything());
    }

    #[test]
    fn a_biz_type_that_matches_is_unchanged() {
        let current = [stored("orders", ORDERS, "whsec_0123456789abcdef")];
        let plan = plan(desired(ORDERS), &current, ANY).unwrap();
        assert_eq!(plan.steps[0].action, Action::Unchanged);
        assert!(plan.steps[0].changes.is_empty(), "{:?}", plan.steps[0].changes);
        assert!(!plan.changes_anything());
        assert_eq!(plan.to_string(), "unchanged orders\n");
    }

    #[test]
    fn a_changed_setting_is_shown_old_to_new_and_nothing_else() {
        let current = [stored("orders", ORDERS, "whsec_0123456789abcdef")];
        let changed = ORDERS.replace("timeout_ms = 5000", "timeout_ms = 2500\npaused = true");
        let plan = plan(desired(&changed), &current, ANY).unwrap();
        assert_eq!(plan.steps[0].action, Action::Update);
        assert_eq!(plan.steps[0].changes, ["timeout_ms: 5000 → 2500", "paused: false → true"]);
    }

    #[test]
    fn a_setting_left_out_is_kept() {
        let current = [BizType { max_attempts: 7, ..stored("orders", ORDERS, "whsec_0123456789abcdef") }];
        let plan = plan(desired(ORDERS), &current, ANY).unwrap();
        assert_eq!(plan.steps[0].action, Action::Unchanged, "{:?}", plan.steps[0].changes);
    }

    #[test]
    fn a_secret_is_compared_but_never_shown() {
        let file = format!("{ORDERS}signing_secret = {{ env = \"CHIME_APPLY_TEST_SECRET\" }}\n");
        let mut d = desired(&file);
        d[0].secret.as_mut().unwrap().value = Ok("the-new-secret-1234".into());
        let current = [stored("orders", ORDERS, "the-old-secret-1234")];
        let plan = super::plan(d.clone(), &current, ANY).unwrap();
        assert_eq!(plan.steps[0].changes, ["signing_secret: changed (from environment variable CHIME_APPLY_TEST_SECRET)"]);
        assert!(!plan.to_string().contains("secret-1234"), "{plan}");

        let current = [stored("orders", ORDERS, "the-new-secret-1234")];
        assert!(!super::plan(d, &current, ANY).unwrap().changes_anything(), "the same secret is no change");
    }

    #[test]
    fn a_missing_secret_names_the_variable_or_file() {
        let file = r#"
            [biz_types.a]
            callback_url = "https://a.test/"
            signing_secret = { env = "CHIME_APPLY_TEST_UNSET_VARIABLE" }
            [biz_types.b]
            callback_url = "https://b.test/"
            signing_secret = { file = "no-such-secret" }
        "#;
        let found = problems(plan(desired(file), &[], ANY));
        assert_eq!(
            found,
            [
                "a: signing_secret: environment variable CHIME_APPLY_TEST_UNSET_VARIABLE is not set",
                "b: signing_secret: cannot read /nonexistent/no-such-secret: No such file or directory (os error 2)",
            ]
        );
    }

    #[test]
    fn every_problem_of_every_biz_type_is_reported_at_once() {
        let file = r#"
            [biz_types.good]
            callback_url = "https://good.test/"
            [biz_types.bad]
            callback_url = "ftp://bad.test/"
            timeout_ms = 0
            mode = "push"
            [biz_types.worse]
            backoff_initial_ms = 5000
            backoff_max_ms = 10
            [biz_types."Not-A-Name"]
            mode = "pull"
        "#;
        let found = problems(plan(desired(file), &[], ANY));
        let expected = [
            "Not-A-Name: name:",
            "bad: callback_url: must be an http:// or https:// URL",
            "bad: mode: must be `callback` or `pull`",
            "bad: timeout_ms: must be between 1 and 600000",
            "worse: backoff_max_ms: must be at least backoff_initial_ms",
            "worse: callback_url: is required for a biz type in callback mode",
        ];
        assert_eq!(found.len(), expected.len(), "{found:#?}");
        for (f, e) in found.iter().zip(expected) {
            assert!(f.starts_with(e), "{f} is not {e}");
        }
    }

    #[test]
    fn biz_types_not_in_the_file_are_listed_and_left_alone() {
        let current = [stored("orders", ORDERS, "whsec_0123456789abcdef"), BizType { name: "legacy".into(), ..stored("orders", ORDERS, "x") }];
        let plan = plan(desired(ORDERS), &current, ANY).unwrap();
        assert_eq!(plan.not_in_file, ["legacy"]);
        assert!(plan.to_string().ends_with("not in the file (left as is): legacy\n"), "{plan}");
        assert!(!plan.changes_anything());
    }

    #[test]
    fn unknown_keys_are_refused_with_their_name_and_line() {
        let err = load("[biz_types.orders]\ncallback_url = \"https://o.test/\"\ntimeout = 5\n", Path::new(".")).err().unwrap();
        assert!(err.contains("line 3") && err.contains("unknown field `timeout`"), "{err}");
        let err = load("[biz_type.orders]\n", Path::new(".")).err().unwrap();
        assert!(err.contains("line 1") && err.contains("unknown field `biz_type`"), "{err}");
        let err = load("[biz_types.orders]\nsigning_secret = { vault = \"x\" }\n", Path::new(".")).err().unwrap();
        assert!(err.contains("line 2") && err.contains("unknown secret source `vault`"), "{err}");
        let err = load("[biz_types.orders]\nsigning_secret = \"whsec_in_the_file\"\n", Path::new(".")).err().unwrap();
        assert!(err.contains("line 2") && err.contains("never written in the file"), "{err}");
        assert!(!err.contains("whsec_in_the_file"), "the secret is not repeated: {err}");
    }
}
