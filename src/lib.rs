//! chime: a timer service on PostgreSQL. A guided tour; the book's Architecture chapter
//! (docs/book/src/architecture.md) maps the same modules to the tables, loops and endpoints
//! each owns.

/// Admin subcommands (biz types, tokens, users, secrets) for scripts.
pub mod cli;
/// Flags, environment variables and the optional TOML file.
pub mod config;
/// The web console: server-rendered pages for admins and support staff, and their sign-in
/// (table `console_keys`; the sessions are `users::sessions`).
pub mod console;
/// Reaching the database (external, or embedded: `db::embedded_pg`): the server that
/// accepts writes, failover, pooler mode (`db::Pool`, `db::query*`, through which every
/// statement goes), migrations.
pub mod db;
/// The quick start's demo biz type and built-in receiver.
pub mod demo;
/// The domain error every operation returns.
pub mod error;
/// What the first start hands the operator: on a terminal, or in an owner-only file.
pub mod first_start;

/// Admin tokens: the credentials of the admin API (table `admin_tokens`).
pub mod admin_tokens;
/// The REST API under `/api/v1` (the admin API included), `/healthz`, `/readyz`, and its
/// OpenAPI document.
pub mod api;
/// The audit log (table `audit_log`).
pub mod audit;
/// Biz types, their API tokens and signing secrets (tables `biz_types`, `api_tokens`), and
/// `chime apply`.
pub mod biz_types;
/// Which addresses callbacks may go to: the optional deny list for private ranges.
pub mod callback_hosts;
/// Notices in a chat tool (DingTalk, Feishu/Lark, WeCom, Slack): summaries of failed tasks
/// and a receiver going down or up (tables `chat_notices`, `chat_channels`).
pub mod chat_notices;
/// Which client a request comes from, behind trusted reverse proxies.
pub mod client_address;
/// The delivery engine: claim due tasks, call back, retry, record; receiver breakers (table
/// `receiver_breakers`).
pub mod engine;
/// Failure notices: a signed POST to a biz type's failure_url when a task ends failed or
/// expired, and their sender (table `failure_notices`).
pub mod failure_notices;
/// The leader: election by advisory lock, and the cluster's housekeeping (partitions, timer
/// occurrences, lease recovery, deadlines, cold moves, retention).
pub mod leader;
/// A node's phases, from binding its port to leaving, and the signal its loops stop on.
pub mod lifecycle;
/// The log's format: one line per event, client text escaped.
pub mod logs;
/// Prometheus metrics at /metrics: the process's registry and each node's.
pub mod metrics;
/// Node registration and heartbeats (table `nodes`), and which nodes are live.
pub mod nodes;
/// Console sign-in through an OpenID Provider: its settings, metadata and keys, the code's
/// exchange and the ID token's checks.
pub mod oidc;
/// Partitions of `tasks` and `attempts`, the hot horizon (table `hot_horizon`), retention.
pub mod partitions;
/// Pull delivery: consumers reserve due tasks and ack or nack them.
pub mod pull;
/// What the database server reports about itself and its standbys.
pub mod replication;
/// Building a node: its HTTP server and its loops, and stopping them in order.
pub mod startup;
/// What every request handler of a node shares.
pub mod state;
/// The task store: create, read, list, reschedule, cancel, replay, leases, and where a row
/// lives; the only writer of `tasks`, `tasks_cold`, `task_keys` and `attempts`.
pub mod tasks;
/// Timers: cron schedules whose occurrences become tasks (table `timers`).
pub mod timers;
/// OpenTelemetry traces over OTLP, off unless an endpoint is set: the settings, the
/// process's tracer, and the W3C trace context read from and written to headers.
pub mod traces;
/// Console users, their sign-in sessions and sign-ins through an OpenID Provider under way
/// (tables `users`, `sessions`, `oidc_sign_ins`).
pub mod users;
/// Wake-ups between nodes: the `chime_wake` notifications that tasks, biz types and the
/// engine send, and the LISTEN loop every node runs.
pub mod wake;

/// How the unit-level property tests run: a fixed seed, so that CI runs the same cases
/// every time and a failure reproduces (PROPTEST_RNG_SEED and PROPTEST_CASES search
/// further), and no failure files written into the source tree. A failure prints its
/// shrunk input.
#[cfg(test)]
pub(crate) fn proptest_config(cases: u32) -> proptest::test_runner::Config {
    use proptest::test_runner::{Config, RngSeed};
    let default = Config::default();
    let rng_seed = match default.rng_seed {
        RngSeed::Random => RngSeed::Fixed(0x00c4_17e5),
        chosen => chosen,
    };
    let cases = if std::env::var_os("PROPTEST_CASES").is_some() { default.cases } else { cases };
    Config { cases, rng_seed, failure_persistence: None, ..default }
}
