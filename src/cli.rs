//! The admin subcommands: biz types, tokens, users, secrets. Their output is meant for scripts: the
//! value a script wants (secret, token) is the last line.

use std::io::{Read, Write};

use crate::db::Pool;
use anyhow::Context;

use crate::audit;
use crate::biz_types::apply::{self, Action};
use crate::biz_types::{self, BizType, Settings};
use crate::callback_hosts::CallbackHosts;
use crate::config::{AdminTokenCommand, ApplyArgs, BizTypeCommand, BizTypeFlags, MigrateArgs, SecretsCommand, TokenCommand, UserCommand};
use crate::db::{self, Schema};
use crate::{admin_tokens, users};

/// `println!` for what a command says on stdout, in a function returning `anyhow::Result`.
macro_rules! say {
    ($($arg:tt)*) => { out(format_args!("{}\n", format_args!($($arg)*)))? };
}

/// Writes to stdout. A reader that has gone (`chime biz-type list | head -1`) ends the
/// command with `StdoutClosed`, which `main` turns into a quiet exit, where `println!`
/// would panic.
fn out(text: std::fmt::Arguments) -> anyhow::Result<()> {
    std::io::stdout().write_fmt(text).map_err(|e| match e.kind() {
        std::io::ErrorKind::BrokenPipe => anyhow::Error::new(StdoutClosed),
        _ => anyhow::Error::new(e).context("writing to stdout"),
    })
}

/// Stdout's reader went away before the command said everything (what it did is done).
#[derive(Debug, thiserror::Error)]
#[error("stdout was closed before the command's output was written")]
pub struct StdoutClosed;

fn settings(flags: BizTypeFlags, paused: Option<bool>) -> Settings {
    Settings {
        description: flags.description,
        callback_url: flags.callback_url,
        mode: flags.mode,
        timeout_ms: flags.timeout_ms,
        max_attempts: flags.max_attempts,
        max_snoozes: flags.max_snoozes,
        backoff_initial_ms: flags.backoff_initial_ms,
        backoff_max_ms: flags.backoff_max_ms,
        rate_limit: flags.rate_limit,
        max_in_flight: flags.max_in_flight,
        flow_max_in_flight: flags.flow_max_in_flight,
        ordered: flags.ordered,
        flow_rate_limit: flags.flow_rate_limit,
        weight: flags.weight,
        create_rate_limit: flags.create_rate_limit,
        breaker_threshold: flags.breaker_threshold,
        breaker_window_ms: flags.breaker_window_ms,
        breaker_probe_ms: flags.breaker_probe_ms,
        paused,
        failure_url: flags.failure_url,
        signing_scheme: flags.signing_scheme,
        chat_platform: flags.chat_platform,
        chat_url: flags.chat_url,
        chat_secret: flags.chat_secret,
    }
}

fn describe(b: &BizType) -> String {
    let rate = |r: Option<f64>| r.map_or("unlimited".to_string(), |r| format!("{r}/s"));
    format!(
        "{name}\t{mode}\t{state}\t{url}\ttimeout {timeout}ms, {attempts} attempts, {snoozes} snoozes, backoff {bi}-{bm}ms, rate {rate}, in-flight {inflight}{flows}{weight}, create rate {crate_}, {breaker}, failure notices to {failure}{signing}",
        name = b.name,
        mode = b.mode,
        state = if b.archived_at.is_some() {
            "archived"
        } else if b.paused {
            "paused"
        } else {
            "active"
        },
        url = if b.callback_url.is_empty() { "-" } else { &b.callback_url },
        timeout = b.timeout_ms,
        attempts = b.max_attempts,
        snoozes = b.max_snoozes,
        bi = b.backoff_initial_ms,
        bm = b.backoff_max_ms,
        rate = rate(b.rate_limit),
        inflight = b.max_in_flight,
        flows = match (b.ordered, b.flow_max_in_flight) {
            (true, _) => ", ordered by flow key".to_string(),
            (false, 0) => String::new(),
            (false, n) => format!(" ({n} per flow key)"),
        } + &b.flow_rate_limit.map(|r| format!(", {r}/s per flow key")).unwrap_or_default(),
        weight = if b.weight == 1 { String::new() } else { format!(", weight {}", b.weight) },
        crate_ = rate(b.create_rate_limit),
        breaker = match b.breaker_threshold {
            0 => "no breaker".to_string(),
            n => format!("breaker {n} failures in {}ms, probe every {}ms", b.breaker_window_ms, b.breaker_probe_ms),
        },
        failure = b.failure_url.as_deref().unwrap_or("nowhere"),
        signing = if b.signing_scheme == "chime" { String::new() } else { format!(", signed {}", b.signing_scheme) },
    ) + &b.chat_platform.as_ref().map(|p| format!(", chat notices to {p}")).unwrap_or_default()
}

pub async fn migrate(pool: &Pool, args: MigrateArgs) -> anyhow::Result<()> {
    if !args.status && !args.sql {
        db::migrate(pool).await?;
        say!("migrations applied");
        return Ok(());
    }
    let schema = Schema::read(pool).await?;
    if args.sql {
        // The session setting `chime migrate` applies them with (src/db.rs).
        say!("SET lock_timeout = '10s';");
        for m in schema.pending() {
            let transaction = if m.no_tx { "outside a transaction" } else { "in one transaction" };
            say!("\n-- migration {} ({}), run {transaction}", m.version, m.description);
            say!("{}", m.sql.as_str().trim_end());
        }
        return Ok(());
    }
    let mut rows: Vec<(i64, &str, &str)> =
        db::MIGRATOR.iter().map(|m| (m.version, &*m.description, if schema.is_applied(m.version) { "applied" } else { "pending" })).collect();
    rows.extend(schema.newer().into_iter().map(|(v, d)| (*v, d.as_str(), "applied, newer than this binary")));
    rows.sort_by_key(|r| r.0);
    for (version, description, state) in rows {
        say!("{version:04}\t{state}\t{description}");
    }
    Ok(())
}

/// `hosts` is the install's rule for callback URLs, as `serve` applies it.
pub async fn biz_type(pool: &Pool, command: BizTypeCommand, hosts: CallbackHosts) -> anyhow::Result<()> {
    match command {
        BizTypeCommand::Create { name, settings: flags } => {
            let created = biz_types::create_audited(pool, &name, &settings(flags, None), hosts, "cli").await?;
            say!("created biz type {}", describe(&created));
            let header = if created.signing_scheme == biz_types::STANDARD_WEBHOOKS { "webhook-signature" } else { "Chime-Signature" };
            say!("signing secret (verify the {header} header with it):");
            say!("{}", created.signing_secret.expose()?);
        }
        BizTypeCommand::Update { name, settings: flags, pause, resume } => {
            let paused = if pause {
                Some(true)
            } else if resume {
                Some(false)
            } else {
                None
            };
            let by = audit::By { actor: "cli", action: audit::Action::BizTypeUpdate };
            let (_, after) = biz_types::update_audited(pool, &name, &settings(flags, paused), hosts, by).await?;
            say!("updated biz type {}", describe(&after));
        }
        BizTypeCommand::List { archived } => {
            let list = if archived { biz_types::list_all(pool).await? } else { biz_types::list(pool).await? };
            for b in list {
                say!("{}", describe(&b));
            }
        }
        BizTypeCommand::Archive { name } => {
            let (_, _, cancelled) = biz_types::archive(pool, &name, "cli").await?;
            let tasks = if cancelled == 1 { "task" } else { "tasks" };
            say!("archived biz type {name}: its tokens no longer work, {cancelled} pending {tasks} cancelled");
        }
        BizTypeCommand::RotateSecret { name, overlap_secs } => {
            let id = biz_types::id_of(pool, &name).await?;
            let rotated = biz_types::rotate_secret(pool, id, overlap_secs, "cli").await?;
            match rotated.previous_until {
                Some(until) => say!(
                    "rotated the signing secret of {name}: until {} callbacks carry both signatures (v1=<new>,v1=<old>); \
                     give the new secret to the receivers before then",
                    until.format("%Y-%m-%d %H:%M:%S UTC")
                ),
                None => say!("rotated the signing secret of {name}: callbacks are signed with the new secret only, from now on"),
            }
            say!("new signing secret (shown only this once):");
            say!("{}", rotated.secret);
        }
    }
    Ok(())
}

/// The most of a file `chime apply` reads: far more than thousands of biz types take.
const MAX_APPLY_FILE: u64 = 16 << 20;

/// `chime apply`'s file, read up to `MAX_APPLY_FILE`, so that `/dev/zero` named by mistake is
/// refused within moments rather than read until memory runs out. A pipe (`-f <(...)`)
/// is read as a file is.
fn read_apply_file(path: &std::path::Path) -> anyhow::Result<String> {
    use std::io::Read;
    let file = std::fs::File::open(path).with_context(|| format!("cannot read {}", path.display()))?;
    let mut text = String::new();
    file.take(MAX_APPLY_FILE + 1).read_to_string(&mut text).with_context(|| format!("cannot read {}", path.display()))?;
    anyhow::ensure!(text.len() as u64 <= MAX_APPLY_FILE, "{} is longer than {} MiB: not a chime apply file", path.display(), MAX_APPLY_FILE >> 20);
    Ok(text)
}

/// `chime apply`: prints the plan and what was done; returns whether the database differed
/// from the file.
pub async fn apply(pool: &Pool, args: &ApplyArgs, hosts: CallbackHosts) -> anyhow::Result<bool> {
    let path = &args.file;
    let text = read_apply_file(path)?;
    let dir = path.parent().unwrap_or(std::path::Path::new("."));
    let desired = apply::load(&text, dir).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    let plan = apply::run(pool, desired, hosts, args.dry_run).await?;
    out(format_args!("{plan}"))?;
    let (created, updated) = (plan.count(Action::Create), plan.count(Action::Update));
    if !plan.changes_anything() {
        say!("no changes");
    } else if args.dry_run {
        say!("dry run: would create {created} and update {updated} biz type(s); nothing was changed");
    } else {
        say!("applied: created {created} and updated {updated} biz type(s)");
    }
    Ok(plan.changes_anything())
}

pub async fn token(pool: &Pool, command: TokenCommand) -> anyhow::Result<()> {
    match command {
        TokenCommand::Create { biz_type, name } => {
            let (info, token) = biz_types::mint_token(pool, &biz_type, name.as_deref(), "cli").await?;
            let named = info.name.as_ref().map(|n| format!(" named {n}")).unwrap_or_default();
            say!("API token{named} for biz type {biz_type} (shown only this once; send it as `Authorization: Bearer <token>`):");
            say!("{token}");
        }
    }
    Ok(())
}

pub async fn secrets(pool: &Pool, command: SecretsCommand) -> anyhow::Result<()> {
    match command {
        SecretsCommand::Reencrypt => {
            let done = biz_types::reencrypt(pool).await?;
            if done.sealed + done.resealed > 0 {
                let counts = serde_json::json!({"encrypted": done.sealed, "re_encrypted": done.resealed, "unchanged": done.unchanged});
                audit::record_alone(pool, "cli", audit::Action::SecretsReencrypt, "*", None, Some(counts)).await?;
            }
            say!(
                "signing secrets: {} encrypted (were in clear), {} re-encrypted (were under an older key), {} already under the current key",
                done.sealed,
                done.resealed,
                done.unchanged
            );
        }
    }
    Ok(())
}

pub async fn admin_token(pool: &Pool, command: AdminTokenCommand) -> anyhow::Result<()> {
    match command {
        AdminTokenCommand::Create { name } => {
            let (_, token) = admin_tokens::create(pool, &name, "cli").await?;
            say!("admin token {name} for /api/v1/admin/ (shown only this once; send it as `Authorization: Bearer <token>`):");
            say!("{token}");
        }
        AdminTokenCommand::List => {
            for t in admin_tokens::list(pool).await? {
                let state = t.revoked_at.map_or("active".to_string(), |at| format!("revoked {}", at.format("%Y-%m-%d %H:%M:%S UTC")));
                say!("{}\t{}…\t{}\tcreated {}\t{state}", t.id, t.prefix, t.name, t.created_at.format("%Y-%m-%d %H:%M:%S UTC"));
            }
        }
        AdminTokenCommand::Revoke { token } => {
            let t = admin_tokens::revoke(pool, &token, "cli").await?;
            say!("revoked admin token {}… ({}); it is refused from now on", t.prefix, t.name);
        }
    }
    Ok(())
}

/// A password piped on stdin (its first line), or `None` when stdin is a terminal or empty.
fn piped_line() -> std::io::Result<Option<String>> {
    use std::io::IsTerminal;
    if std::io::stdin().is_terminal() {
        return Ok(None);
    }
    let mut input = String::new();
    std::io::stdin().read_to_string(&mut input)?;
    let line = input.lines().next().unwrap_or_default().to_string();
    Ok(Some(line).filter(|l| !l.is_empty()))
}

pub async fn user(pool: &Pool, command: UserCommand) -> anyhow::Result<()> {
    match command {
        UserCommand::Create { name, role, password } => {
            let password = match password {
                Some(p) => p,
                None => {
                    let mut input = String::new();
                    std::io::stdin().read_to_string(&mut input).context("reading the password from stdin")?;
                    input.trim_end_matches(['\r', '\n']).to_string()
                }
            };
            users::create_audited(pool, &name, &role, &password, "cli", "given").await?;
            say!("created {role} user {name}");
        }
        UserCommand::List => {
            let time = |t: chrono::DateTime<chrono::Utc>| t.format("%Y-%m-%d %H:%M:%S UTC").to_string();
            for u in users::list(pool).await? {
                let state = if u.disabled { "disabled" } else { "enabled" };
                let last = u.last_sign_in_at.map_or("never signed in".to_string(), |t| format!("last signed in {}", time(t)));
                say!("{}\t{}\t{state}\tcreated {}\t{last}", u.name, u.role, time(u.created_at));
            }
        }
        UserCommand::Disable { name } => {
            let by = audit::By { actor: "cli", action: audit::Action::UserUpdate };
            users::update_audited(pool, &name, &users::UserChanges { disabled: Some(true), ..Default::default() }, by, None).await?;
            say!("disabled user {name}: they cannot sign in, and their open sessions have ended");
        }
        UserCommand::Enable { name } => {
            let by = audit::By { actor: "cli", action: audit::Action::UserUpdate };
            users::update_audited(pool, &name, &users::UserChanges { disabled: Some(false), ..Default::default() }, by, None).await?;
            say!("enabled user {name}: they can sign in again with their password");
        }
        UserCommand::ResetPassword { name, password } => {
            let given = match password {
                Some(p) => Some(p),
                None => piped_line().context("reading the password from stdin")?,
            };
            let generated = given.is_none();
            let password = given.unwrap_or_else(users::generate_password);
            let changes = users::UserChanges { password: Some(password.clone()), ..Default::default() };
            let by = audit::By { actor: "cli", action: audit::Action::UserResetPassword };
            let (_, after) = users::update_audited(pool, &name, &changes, by, Some(if generated { "generated" } else { "given" })).await?;
            let disabled =
                if after.disabled { format!("; {name} is disabled: `chime user enable {name}` to let them sign in") } else { String::new() };
            say!("reset the password of {name}: their sessions have ended{disabled}");
            if generated {
                say!("new password (shown only this once):");
                say!("{password}");
            }
        }
    }
    Ok(())
}
