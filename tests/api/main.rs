//! Integration tests: the real HTTP server, a real PostgreSQL, the real binary.

mod auth;
mod bad_input;
mod cli;
mod console;
mod delivery;
mod embedded;
mod health;
mod helpers;
mod leader;
mod nodes;
mod receiver;
mod tasks;
mod timers;
