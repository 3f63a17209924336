//! `chime-bench`: `chime bench` and `chime soak`, a binary of their own so that the server
//! does not carry them. `chime bench …` execs this binary with the same command line; so
//! does running it directly (`target/release/chime-bench bench …`). The nodes it starts are
//! the `chime` binary found beside it, which must come from the same build.
//!
//! A binary target of the chime package rather than a workspace member: it uses the
//! library (`chime::`) and the package's dependencies as they are, `cargo build` and
//! `cargo test` build and test it with the rest, and the lockfile and target directory
//! stay one.

mod bench;
mod cli;
mod memory;
mod nodes;
mod receiver;
mod report;
mod scale;
mod soak;
mod waits;

use clap::Parser;

use chime::biz_types::secrets;

use self::cli::{Cli, Tool};

#[tokio::main]
async fn main() {
    if let Err(e) = run().await {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

async fn run() -> anyhow::Result<()> {
    // As in `chime`: CHIME_CONFIG's values count when this binary is run directly, too.
    chime::config::load_config_file()?;
    let args = Cli::parse();
    chime::logs::init(args.log.log.as_deref(), args.log.log_format)?;
    // The bench and the soak create biz types, whose signing secrets go through these keys.
    secrets::install(secrets::Keyring::from_settings(&args.secrets)?);
    chime::engine::install_tls_provider();
    // Each brings its own database (unless DATABASE_URL is given) and nodes.
    match args.command {
        Tool::Bench(bench) => bench::run(&args.db, *bench).await,
        Tool::Soak(soak) => soak::run(&args.db, soak).await,
    }
}
