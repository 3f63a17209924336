//! Command line and settings. Every setting is a flag with an environment variable and a
//! default, so `--help` documents all of them. An optional TOML file (`CHIME_CONFIG`)
//! supplies values for settings that neither a flag nor the environment gives: flags win
//! over the environment, the environment over the file.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use clap::{Args, Parser, Subcommand};

use crate::biz_types::secrets::SecretArgs;
use crate::db::DbArgs;
use crate::logs::LogArgs;

#[derive(Debug, Parser)]
#[command(
    name = "chime",
    version,
    about = "A timer service on PostgreSQL: register timers over REST, get HTTP callbacks when they are due.",
    long_about = "A timer service on PostgreSQL: register timers over REST, get HTTP callbacks when they are due.\n\n\
        Without DATABASE_URL, chime starts an embedded PostgreSQL from the binaries installed on this \
        machine, with its data under CHIME_DATA_DIR. Settings come from flags, the environment, and an \
        optional TOML file named by CHIME_CONFIG whose keys are the long flag names with underscores \
        (listen = \"0.0.0.0:8080\", data_dir = \"/var/lib/chime\"); flags win over the environment, the \
        environment over the file."
)]
#[command(args_conflicts_with_subcommands = true)]
pub struct Cli {
    #[command(flatten)]
    pub db: DbArgs,
    #[command(flatten)]
    pub log: LogArgs,
    #[command(flatten)]
    pub secrets: SecretArgs,
    /// `serve`'s settings, for `chime` without a subcommand.
    #[command(flatten)]
    pub serve: ServeArgs,
    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a chime node: the REST API, the console and the delivery engine. The default.
    ///
    /// It listens first (`/healthz` answers 200), then migrates the database (`/readyz`
    /// answers 503 until it is done). On SIGTERM or Ctrl-C it stops as
    /// CHIME_SHUTDOWN_GRACE_SECS says; a second signal cuts the grace short.
    Serve(ServeArgs),
    /// Apply the pending database migrations and exit (or list them, or print their SQL).
    Migrate(MigrateArgs),
    /// Manage biz types (business types: one callback target with its own limits and tokens).
    #[command(subcommand)]
    BizType(BizTypeCommand),
    /// Manage API tokens.
    #[command(subcommand)]
    Token(TokenCommand),
    /// Manage admin tokens, the credentials of the admin API (/api/v1/admin/).
    #[command(subcommand)]
    AdminToken(AdminTokenCommand),
    /// Manage console users.
    #[command(subcommand)]
    User(UserCommand),
    /// Manage the encryption of signing secrets at rest (CHIME_SECRET_KEY).
    #[command(subcommand)]
    Secrets(SecretsCommand),
    /// Make biz types match a TOML file (chime as code): prints what it changes; with
    /// --dry-run, only what it would change.
    Apply(ApplyArgs),
    /// Measure chime: create rate, burst delivery, steady lateness, backlog independence.
    /// Runs `chime-bench`, built beside this binary (`cargo build --release` builds both).
    #[command(disable_help_flag = true)]
    Bench(ToolArgs),
    /// Run a mixed load (creates, timers, failures, replays) against real nodes for a
    /// while, then count what was delivered, duplicated and lost (lost must be 0).
    /// Runs `chime-bench`, built beside this binary (`cargo build --release` builds both).
    #[command(disable_help_flag = true)]
    Soak(ToolArgs),
    /// Print the REST API's OpenAPI document (what /api/v1/openapi.json serves) and exit,
    /// without a database: the TypeScript client's types are generated from it.
    Openapi,
}

/// `chime bench` and `chime soak` live in their own binary, `chime-bench`, so that the server
/// does not carry them: these subcommands take their arguments unread (`--help` included)
/// and hand the whole command line to it.
#[derive(Debug, Clone, Args)]
pub struct ToolArgs {
    /// Options of `chime-bench`: see `chime bench --help` or `chime soak --help`.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    pub args: Vec<std::ffi::OsString>,
}

#[derive(Debug, Clone, Args)]
pub struct MigrateArgs {
    /// List each migration as applied or pending, and applied ones newer than this binary;
    /// apply nothing.
    #[arg(long, conflicts_with = "sql")]
    pub status: bool,

    /// Print the pending migrations' SQL, in order, for review; apply nothing.
    #[arg(long)]
    pub sql: bool,
}

#[derive(Debug, Clone, Args)]
#[command(after_help = "The file has one table per biz type, with the settings of `chime biz-type create` \
    and `paused`:\n\n\
    [biz_types.orders]\n\
    callback_url = \"https://orders.example.com/chime\"\n\
    max_attempts = 30\n\
    rate_limit = 50                                 # 0 = unlimited\n\
    signing_secret = { env = \"ORDERS_SECRET\" }      # or { file = \"/run/secrets/orders\" }\n\n\
    A setting left out is kept as it is (a new biz type gets the default). Secrets are never written in the \
    file, only where to read them (a relative file path is read from the file's directory); without one, \
    the secret is kept, or generated for a new biz type. Biz types not in the file are left as they are. \
    Everything in the file is checked first, every problem reported, and the changes are made in one \
    transaction, recorded in the audit log as `apply`. See \"Chime as code\" in docs/book/src/admin-commands.md.")]
pub struct ApplyArgs {
    /// The TOML file that describes the biz types.
    #[arg(short = 'f', long = "file", value_name = "FILE")]
    pub file: PathBuf,

    /// Print what would change, and change nothing (reads only).
    #[arg(long)]
    pub dry_run: bool,

    /// Exit with status 2 when the database did not match the file (changes made, or to be
    /// made with --dry-run): a drift check for CI.
    #[arg(long)]
    pub exit_code: bool,
}

#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// Address the API listens on.
    #[arg(long, env = "CHIME_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,

    /// Serve `/metrics` on this address instead of the API's [default: unset, on the API's
    /// address]. `/metrics` asks for no credentials and names every biz type: set this to a
    /// private address when the API's is reachable by anyone you would not show them to.
    #[arg(long, env = "CHIME_METRICS_LISTEN")]
    pub metrics_listen: Option<SocketAddr>,

    /// Addresses or CIDR ranges of reverse proxies in front of chime, comma-separated
    /// (`10.0.0.0/8, 192.0.2.7`) [default: none]. A request from one of them is taken to come
    /// from the client its `X-Forwarded-For` names: the header is read right to left, past
    /// the trusted proxies, and the first address that is not one is the client, whom the
    /// console's sign-in limits and the audit log then see. Without it the header is ignored,
    /// since any client can write it.
    #[arg(long, env = "CHIME_TRUSTED_PROXIES", value_parser = crate::client_address::TrustedProxies::parse)]
    pub trusted_proxies: Option<crate::client_address::TrustedProxies>,

    /// Seconds a client has to send a request's body, counted from its headers; a slower
    /// one is answered 408 and disconnected. (The headers themselves must arrive within 5 s.)
    #[arg(long, env = "CHIME_BODY_TIMEOUT_SECS", default_value_t = 30,
          value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub body_timeout_secs: u64,

    /// Most requests in progress at once on the API's address, besides the probes
    /// (`/healthz`, `/readyz`, `/metrics`); more are answered 503 at once. The server
    /// accepts 32 connections more, kept for the probes; beyond, connections wait in the
    /// listen queue. Each is a file descriptor: keep it well under `ulimit -n`.
    #[arg(long, env = "CHIME_MAX_CONNECTIONS", default_value_t = 500,
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub max_connections: u32,

    /// Password of the first `admin` console account, used only when no user exists yet.
    /// When unset, a random one is printed once at first start.
    #[arg(long, env = "CHIME_ADMIN_PASSWORD", hide_env_values = true)]
    pub admin_password: Option<String>,

    /// Largest accepted task payload, in bytes (a larger create is refused with 413).
    #[arg(long, env = "CHIME_MAX_PAYLOAD_BYTES", default_value_t = 65536,
          value_parser = clap::value_parser!(u32).range(16..=16 * 1024 * 1024))]
    pub max_payload_bytes: u32,

    /// Days ahead kept in hot partitions; tasks due later wait in cold storage.
    #[arg(long, env = "CHIME_HOT_DAYS", default_value_t = 2,
          value_parser = clap::value_parser!(u32).range(1..=60))]
    pub hot_days: u32,

    /// Width of one partition of `tasks` and `attempts`, in hours: a divisor of 24 (1, 2, 3,
    /// 4, 6, 8, 12) or a multiple of it (24 = daily, 168 = weekly). A change applies to
    /// partitions created from then on.
    #[arg(long, env = "CHIME_PARTITION_HOURS", default_value_t = 24,
          value_parser = clap::value_parser!(u32).range(1..=24 * 31))]
    pub partition_hours: u32,

    /// Days finished tasks and delivery attempts are kept; older partitions are dropped
    /// (never one that still holds an unfinished task).
    #[arg(long, env = "CHIME_RETENTION_DAYS", default_value_t = 30,
          value_parser = clap::value_parser!(u32).range(1..=3650))]
    pub retention_days: u32,

    /// How far ahead the leader writes timer occurrences as tasks, in seconds.
    #[arg(long, env = "CHIME_TIMER_WINDOW_SECS", default_value_t = 600,
          value_parser = clap::value_parser!(u32).range(10..=86400))]
    pub timer_window_secs: u32,

    /// Seconds after which a leader that stopped answering loses leadership to another
    /// node (its database session is ended); also how long a node waits between tries.
    #[arg(long, env = "CHIME_LEADER_LEASE_SECS", default_value_t = 5,
          value_parser = clap::value_parser!(u32).range(2..=300))]
    pub leader_lease_secs: u32,

    /// Cold tasks moved into the hot partitions per transaction.
    #[arg(long, env = "CHIME_MIGRATE_BATCH", default_value_t = 5000,
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub migrate_batch: u32,

    /// HTTP worker threads for the API [default: the number of CPUs].
    #[arg(long, env = "CHIME_HTTP_WORKERS")]
    pub http_workers: Option<usize>,

    /// On SIGTERM/Ctrl-C, how long callbacks in flight have to finish, in seconds. At the
    /// signal `/readyz` answers 503, no claim or callback starts, tasks claimed ahead go
    /// back to pending, the node leaves the cluster and a leader lets its lock go. The
    /// listener stays open a quarter of the grace (at most 5 s) so that load balancers see
    /// `/readyz`; requests then in progress have the rest. Callbacks still in flight when
    /// the grace runs out (or at a second signal) are cut off and their tasks given back,
    /// for another node to deliver at once. The process exits within about a second of it:
    /// keep it below the time your supervisor waits before killing (Kubernetes'
    /// terminationGracePeriodSeconds, 30 s by default).
    #[arg(long, env = "CHIME_SHUTDOWN_GRACE_SECS", default_value_t = 20,
          value_parser = clap::value_parser!(u64).range(0..=3600))]
    pub shutdown_grace_secs: u64,

    /// Tasks this node holds at once, over all biz types: claimed, called back and not yet
    /// recorded. When the biz types with due work want more, what is free goes first to
    /// those holding least for their weight, so a place that one biz type's herd frees goes
    /// first to another's due task. Each biz type's max_in_flight still caps it across the
    /// cluster; raise this for many slow receivers at once (each held task is a connection
    /// and a little memory).
    #[arg(long, env = "CHIME_NODE_CAPACITY", default_value_t = crate::engine::DEFAULT_NODE_CAPACITY,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1_000_000))]
    pub node_capacity: usize,

    /// Deliver due tasks from this node. `false` makes an API-only node.
    #[arg(long, env = "CHIME_ENGINE", default_value_t = true, action = clap::ArgAction::Set)]
    pub engine: bool,

    /// Refuse callbacks to loopback, private, link-local, CGNAT and unspecified addresses
    /// (127.0.0.0/8, 10/8, 172.16/12, 192.168/16, 169.254/16 with the cloud metadata address,
    /// 100.64/10, 0.0.0.0, ::1, fc00::/7, fe80::/10, and their IPv4-mapped forms) and to
    /// `localhost`: such a callback URL is refused when a biz type is saved, and a host name
    /// that resolves only to such addresses fails at delivery. Turn it on in a multi-tenant
    /// install where biz type admins are not trusted with the internal network; leave it off
    /// when receivers live on your private network (the usual case). Also read by the
    /// `biz-type` subcommands (from the environment or the config file).
    #[arg(long, env = "CHIME_DENY_PRIVATE_CALLBACKS", default_value_t = false, action = clap::ArgAction::Set)]
    pub deny_private_callbacks: bool,

    /// Apply pending database migrations at start. With `false`, a node refuses to start on
    /// a schema older than it needs, and says to run `chime migrate`. The admin subcommands
    /// never migrate.
    #[arg(long, env = "CHIME_AUTO_MIGRATE", default_value_t = true, action = clap::ArgAction::Set)]
    pub auto_migrate: bool,

    /// The console's base URL as its users reach it (`https://chime.example.com`, or with a
    /// path prefix behind a proxy), for the links in chat notices [default: unset: chat
    /// notices carry no link]. An http:// or https:// URL with a host, without a query or
    /// fragment.
    #[arg(long, env = "CHIME_PUBLIC_URL", value_parser = parse_public_url)]
    pub public_url: Option<String>,

    /// Sign-in to the console through an OpenID Provider (CHIME_OIDC_*).
    #[command(flatten)]
    pub oidc: Box<crate::oidc::OidcArgs>,

    /// Whether console users may sign in with a chime password. `false` leaves only the
    /// OpenID Provider (CHIME_OIDC_ISSUER), and is refused at start without one; the admin
    /// API's tokens and the `chime user` commands are not affected.
    #[arg(long, env = "CHIME_LOCAL_PASSWORDS", default_value_t = true, action = clap::ArgAction::Set)]
    pub local_passwords: bool,

    /// OpenTelemetry traces (`OTEL_*`), off by default.
    #[command(flatten)]
    pub traces: crate::traces::TraceArgs,
}

/// `--public-url`: an http(s) URL with a host and neither query nor fragment, kept without
/// its trailing `/` so that paths can be appended.
pub fn parse_public_url(raw: &str) -> Result<String, String> {
    let url = url::Url::parse(raw).map_err(|e| format!("not a URL ({e}): give the console's base URL, e.g. https://chime.example.com"))?;
    if !matches!(url.scheme(), "http" | "https") || url.host().is_none() {
        return Err("must be an http:// or https:// URL with a host".into());
    }
    if url.query().is_some() || url.fragment().is_some() || !url.username().is_empty() || url.password().is_some() {
        return Err("must have no query, fragment or credentials: the console's base URL, e.g. https://chime.example.com".into());
    }
    Ok(url.as_str().trim_end_matches('/').to_string())
}

/// The defaults without reading the environment (tests build settings from this).
impl ServeArgs {
    pub fn callback_hosts(&self) -> crate::callback_hosts::CallbackHosts {
        crate::callback_hosts::CallbackHosts::from_deny_private(self.deny_private_callbacks)
    }
}

impl Default for ServeArgs {
    fn default() -> Self {
        ServeArgs {
            listen: "127.0.0.1:8080".parse().unwrap(),
            metrics_listen: None,
            trusted_proxies: None,
            body_timeout_secs: 30,
            max_connections: 500,
            admin_password: None,
            max_payload_bytes: 65536,
            hot_days: 2,
            partition_hours: 24,
            retention_days: 30,
            timer_window_secs: 600,
            leader_lease_secs: 5,
            migrate_batch: 5000,
            http_workers: None,
            shutdown_grace_secs: 20,
            node_capacity: crate::engine::DEFAULT_NODE_CAPACITY,
            engine: true,
            deny_private_callbacks: false,
            auto_migrate: true,
            public_url: None,
            oidc: Box::new(crate::oidc::OidcArgs::defaults()),
            local_passwords: true,
            traces: crate::traces::TraceArgs::default(),
        }
    }
}

#[derive(Debug, Subcommand)]
pub enum BizTypeCommand {
    /// Create a biz type; prints its signing secret as the last line.
    Create {
        /// Name: lowercase letters, digits, '-' and '_', at most 64 characters.
        name: String,
        #[command(flatten)]
        settings: BizTypeFlags,
    },
    /// Change settings of a biz type (only the flags given).
    Update {
        name: String,
        #[command(flatten)]
        settings: BizTypeFlags,
        /// Stop delivering this biz type's tasks (they stay pending).
        #[arg(long, conflicts_with = "resume")]
        pause: bool,
        /// Deliver this biz type's tasks again, backlog first.
        #[arg(long)]
        resume: bool,
    },
    /// List biz types and their settings.
    List {
        /// Archived biz types too.
        #[arg(long)]
        archived: bool,
    },
    /// Archive (delete) a biz type: its API tokens stop working, its pending tasks are
    /// cancelled, nothing more is delivered; its tasks stay readable until retention drops
    /// them, and its name stays reserved.
    Archive { name: String },
    /// Give a biz type a new signing secret; prints it as the last line. For the overlap,
    /// callbacks carry the old secret's signature too (`Chime-Signature: t=…,v1=<new>,v1=<old>`),
    /// so receivers keep verifying while they take the new one. Rotating again during an
    /// overlap keeps the secret just replaced; the older one stops.
    RotateSecret {
        name: String,
        /// Seconds the old secret keeps signing beside the new one: 0 (it stops at once) to
        /// 2592000 (30 days).
        #[arg(long, default_value_t = crate::biz_types::DEFAULT_OVERLAP_SECS)]
        overlap_secs: i64,
    },
}

/// Biz type settings as flags; each is optional so that `update` changes only what is given.
/// Defaults for `create` are shown in brackets.
#[derive(Debug, Clone, Default, Args)]
pub struct BizTypeFlags {
    /// URL that receives the callbacks (http or https).
    #[arg(long)]
    pub callback_url: Option<String>,
    /// Free text shown in the console.
    #[arg(long)]
    pub description: Option<String>,
    /// Callback timeout in milliseconds [default: 10000].
    #[arg(long)]
    pub timeout_ms: Option<i32>,
    /// Delivery attempts before a task is failed [default: 60: with the default backoff,
    /// retries for at least 24 hours].
    #[arg(long)]
    pub max_attempts: Option<i32>,
    /// `Chime-Snooze` answers a task may take (they do not count as attempts) before the
    /// next one fails it; a replay counts afresh [default: 10000].
    #[arg(long)]
    pub max_snoozes: Option<i32>,
    /// First retry delay in milliseconds, doubled per attempt [default: 1000].
    #[arg(long)]
    pub backoff_initial_ms: Option<i32>,
    /// Longest retry delay in milliseconds [default: 3600000].
    #[arg(long)]
    pub backoff_max_ms: Option<i32>,
    /// Callbacks per second across the whole cluster; 0 = unlimited [default: unlimited].
    #[arg(long)]
    pub rate_limit: Option<f64>,
    /// Callbacks (or reserved tasks) in flight at once, across the whole cluster [default: 100].
    #[arg(long)]
    pub max_in_flight: Option<i32>,
    /// Callbacks of one flow key (a task's `flow_key`) in flight at once, across the whole
    /// cluster; 0 = no per-key limit [default: 0].
    #[arg(long)]
    pub flow_max_in_flight: Option<i32>,
    /// Deliver each flow key's tasks one at a time, in run_at order: the next starts once
    /// the one before is settled [default: false].
    #[arg(long)]
    pub ordered: Option<bool>,
    /// Callbacks of one flow key started a second, across the whole cluster; 0 = unlimited
    /// [default: unlimited].
    #[arg(long)]
    pub flow_rate_limit: Option<f64>,
    /// Its share of a node's delivery capacity against the other biz types with due work,
    /// when that capacity is short (`--node-capacity`): weight 3 gets three times the share
    /// of weight 1; it caps nothing by itself. 1 to 100 [default: 1].
    #[arg(long)]
    pub weight: Option<i32>,
    /// API create calls per second; 0 = unlimited [default: unlimited].
    #[arg(long)]
    pub create_rate_limit: Option<f64>,
    /// How tasks are delivered: `callback` (chime calls the URL) or `pull` (consumers reserve them) [default: callback].
    #[arg(long, value_parser = ["callback", "pull"])]
    pub mode: Option<String>,
    /// URL (http or https) a signed notice is POSTed to when a task ends failed or expired;
    /// "" removes it [default: none].
    #[arg(long)]
    pub failure_url: Option<String>,
    /// How callbacks and failure notices are signed: `chime` (Chime-Signature) or
    /// `standard-webhooks` (webhook-id, webhook-timestamp, webhook-signature with a
    /// whsec_ secret; a secret older than that form is rotated first) [default: chime].
    #[arg(long, value_parser = ["chime", "standard-webhooks"])]
    pub signing_scheme: Option<String>,
    /// Failures in a row (no answer, timeout, 408, 429, 5xx) that open the receiver's
    /// breaker: its tasks wait, attempts not counted, while one at a time probes the
    /// receiver; 0 = no breaker [default: 10].
    #[arg(long)]
    pub breaker_threshold: Option<i32>,
    /// Those failures must come within this many milliseconds [default: 60000].
    #[arg(long)]
    pub breaker_window_ms: Option<i32>,
    /// While the breaker is open, one task probes the receiver this often, in milliseconds,
    /// across the cluster [default: 5000].
    #[arg(long)]
    pub breaker_probe_ms: Option<i32>,
    /// Also send notices to a chat tool, in its own format: `dingtalk`, `feishu`, `wecom` or
    /// `slack`; "" stops them [default: none].
    #[arg(long)]
    pub chat_platform: Option<String>,
    /// The chat tool's incoming webhook URL (http or https), with --chat-platform.
    #[arg(long)]
    pub chat_url: Option<String>,
    /// The robot's signing secret (DingTalk's starts with `SEC`; Feishu), if it signs; ""
    /// removes it. Prefer the environment to the flag, which others on the machine can see.
    #[arg(long, env = "CHIME_CHAT_SECRET", hide_env_values = true)]
    pub chat_secret: Option<String>,
}

#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    /// Create an API token for one biz type; prints the token (only this once) as the last line.
    Create {
        #[arg(long)]
        biz_type: String,
        /// What the token is for ("ci", "billing worker"): token lists show it, beside when
        /// each was last used, so that it is clear which one is safe to revoke.
        #[arg(long)]
        name: Option<String>,
    },
}

#[derive(Debug, Subcommand)]
pub enum SecretsCommand {
    /// Encrypt every signing secret stored in clear with CHIME_SECRET_KEY, and re-encrypt
    /// those encrypted with a key in CHIME_SECRET_KEY_OLD; prints the counts. Safe to run
    /// again. Run it once every node runs this release: an older node cannot read them.
    Reencrypt,
}

#[derive(Debug, Subcommand)]
pub enum AdminTokenCommand {
    /// Create an admin token; prints it (only this once) as the last line.
    Create {
        /// Who or what holds it (a person, a CI job), as the audit log will name it.
        #[arg(long, default_value = "admin")]
        name: String,
    },
    /// List admin tokens (never the tokens themselves).
    List,
    /// Revoke an admin token, by id or by the prefix `list` shows; it is refused at once.
    Revoke {
        #[arg(value_name = "ID|PREFIX")]
        token: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum UserCommand {
    /// Create a console user. The password comes from --password or, when absent, from stdin.
    Create {
        name: String,
        #[arg(long, value_parser = ["admin", "support"])]
        role: String,
        #[arg(long, hide_env_values = true, env = "CHIME_USER_PASSWORD")]
        password: Option<String>,
    },
    /// List console users: name, role, enabled or disabled, created, last sign-in.
    List,
    /// Disable a user: they cannot sign in, and their open sessions end at once. The last
    /// enabled admin cannot be disabled.
    Disable { name: String },
    /// Enable a disabled user again (with the password they had).
    Enable { name: String },
    /// Give a user a new password and end their sessions (a lost `admin` password too). The
    /// password comes from --password, or a line piped on stdin; with neither, one is
    /// generated and printed (only this once) as the last line.
    ResetPassword {
        name: String,
        #[arg(long, hide_env_values = true)]
        password: Option<String>,
    },
}

/// Loads the TOML file named by `CHIME_CONFIG` (if any) into the environment for each
/// setting the environment does not already have, so that clap sees one source of values.
/// Must run before any thread is started.
pub fn load_config_file() -> anyhow::Result<()> {
    let Some(path) = std::env::var_os("CHIME_CONFIG") else { return Ok(()) };
    let path = Path::new(&path);
    let text = std::fs::read_to_string(path).map_err(|e| anyhow::anyhow!("cannot read CHIME_CONFIG file {}: {e}", path.display()))?;
    for (var, value) in config_file_env(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))? {
        if std::env::var_os(&var).is_none() {
            // SAFETY: called at the top of main, before the runtime or any thread exists.
            unsafe { std::env::set_var(var, value) };
        }
    }
    Ok(())
}

/// The settings a config file may hold, with the environment variable each one maps to:
/// every flag of `Cli` that has a variable, under its long name with underscores. Read from
/// the command's definition, flattened groups included, so that a new setting is a file
/// key without being listed twice.
fn file_keys() -> Vec<(String, String)> {
    use clap::CommandFactory;
    Cli::command().get_arguments().filter_map(|arg| Some((arg.get_long()?.replace('-', "_"), arg.get_env()?.to_str()?.to_string()))).collect()
}

fn config_file_env(text: &str) -> Result<Vec<(String, String)>, String> {
    let table: toml::Table = text.parse().map_err(|e| format!("not valid TOML: {e}"))?;
    let keys = file_keys();
    let mut out = Vec::new();
    for (key, value) in table {
        let Some((_, var)) = keys.iter().find(|(k, _)| *k == key) else {
            let known: Vec<_> = keys.iter().map(|(k, _)| k.as_str()).collect();
            return Err(format!("unknown setting `{key}` (known: {})", known.join(", ")));
        };
        let value = match value {
            toml::Value::String(s) => s,
            toml::Value::Integer(i) => i.to_string(),
            toml::Value::Float(f) => f.to_string(),
            toml::Value::Boolean(b) => b.to_string(),
            other => return Err(format!("setting `{key}` must be a string or a number, not {}", other.type_str())),
        };
        out.push((var.clone(), value));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_file_maps_keys_to_environment_variables() {
        let env = config_file_env("listen = \"0.0.0.0:9000\"\nhot_days = 3\n").unwrap();
        assert_eq!(env, vec![("CHIME_HOT_DAYS".to_string(), "3".to_string()), ("CHIME_LISTEN".to_string(), "0.0.0.0:9000".to_string())]);
    }

    #[test]
    fn config_file_can_turn_on_the_callback_deny_list() {
        let env = config_file_env("deny_private_callbacks = true").unwrap();
        assert_eq!(env, vec![("CHIME_DENY_PRIVATE_CALLBACKS".to_string(), "true".to_string())]);
    }

    #[test]
    fn config_file_keys_are_every_flag_with_an_environment_variable() {
        // From the groups other modules define (db, logs, secrets) and from serve's own,
        // node_capacity among them, which a hand-kept list once left out.
        let file = "data_dir = \"/var/lib/chime\"\nlog_format = \"json\"\nsecret_key_file = \"/run/key\"\nnode_capacity = 500\n";
        let mut env = config_file_env(file).unwrap();
        env.sort();
        let vars: Vec<&str> = env.iter().map(|(var, _)| var.as_str()).collect();
        assert_eq!(vars, ["CHIME_DATA_DIR", "CHIME_LOG_FORMAT", "CHIME_NODE_CAPACITY", "CHIME_SECRET_KEY_FILE"]);
        let keys = file_keys();
        assert!(keys.iter().all(|(key, var)| !key.contains('-') && !var.is_empty()), "{keys:?}");
        assert_eq!(keys.len(), 50, "{keys:?}");
    }

    #[test]
    fn the_public_url_is_an_http_base_url_kept_without_its_trailing_slash() {
        assert_eq!(parse_public_url("https://chime.example.com/").unwrap(), "https://chime.example.com");
        assert_eq!(parse_public_url("http://10.0.0.1:8080/ops/").unwrap(), "http://10.0.0.1:8080/ops");
        for bad in ["chime.example.com", "ftp://h.test/", "https://h.test/?a=1", "https://h.test/#x", "https://u:p@h.test/"] {
            assert!(parse_public_url(bad).is_err(), "{bad}");
        }
        let refused = Cli::try_parse_from(["chime", "serve", "--public-url", "console.example.com"]).unwrap_err().to_string();
        assert!(refused.contains("--public-url") && refused.contains("not a URL"), "{refused}");
    }

    #[test]
    fn config_file_rejects_unknown_keys_by_name() {
        let err = config_file_env("lisen = \"x\"").unwrap_err();
        assert!(err.contains("unknown setting `lisen`"), "{err}");
    }

    #[test]
    fn cli_definition_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
