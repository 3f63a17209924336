//! Integration tests: the real HTTP server, a real PostgreSQL, the real binary.
// The tests' own statements go straight to PostgreSQL: sqlx's query functions are fine here.
#![allow(clippy::disallowed_methods)]

mod admin;
mod apply;
mod attempts;
mod auth;
mod authz;
mod bad_input;
mod breaker;
// A toolkit: not every test uses every helper.
#[allow(dead_code)]
mod browser;
mod browser_smoke;
mod bulk;
mod by_key;
mod callback_hosts;
mod capacity;
mod chat_notices;
mod cli;
mod console;
mod console_a11y;
mod console_audit;
mod console_browser;
mod console_context;
mod console_dashboard;
mod console_find;
mod console_forms;
mod console_history;
mod console_users;
mod database_hosts;
mod deadlines;
mod delivery;
mod embedded;
mod failure_notices;
mod flow_keys;
mod fuzz_input;
mod health;
mod helpers;
mod leader;
mod metrics;
mod nodes;
mod oidc;
mod operating;
mod pooler;
mod priority;
mod protocol;
mod pull;
mod receiver;
mod replication;
mod secrets;
mod shutdown;
mod snooze;
mod standard_webhooks;
mod stats;
mod task_storage;
mod tasks;
mod timers;
mod tls;
mod traces;
mod upgrades;
