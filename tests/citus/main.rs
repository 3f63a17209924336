//! chime on a real Citus cluster (docs/book/src/citus.md): a coordinator and two workers
//! started by the tests (`cluster.rs`), chime's real server over HTTP on the coordinator.
//! `chime migrate` distributes the per-task tables by biz type; tasks created through the
//! API land on the worker that holds their biz type's shard, and read back by id and by key;
//! the claim is one statement on that worker; a biz type's tasks are delivered end to end.
//!
//! Needs PostgreSQL 15 with the citus extension (tests/setup.sh builds and installs it from
//! ../shared/citus). Without it the tests fail, saying what is missing; they never skip.
//! A binary of its own (`cargo test --test citus`): its three servers and their background
//! workers never run beside the timing-sensitive API tests.
// The tests' own statements go straight to PostgreSQL: sqlx's query functions are fine here.
#![allow(clippy::disallowed_methods)]

#[path = "../api/helpers.rs"]
#[allow(dead_code)]
mod helpers;
#[path = "../api/receiver.rs"]
#[allow(dead_code)]
mod receiver;

mod admin;
mod bulk;
mod cluster;
mod console;
mod delivery;
mod ids;
mod kill;
mod leader;
mod moving;
mod placement;
mod senders;
mod shard_move;
mod statements;
mod timers;
