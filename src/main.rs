use anyhow::Context;
use clap::Parser;

use chime::biz_types::secrets;
use chime::config::{Cli, Command, ServeArgs};
use chime::db::DbArgs;
use chime::db::{self, Database};
use chime::startup::Application;
use chime::{cli, config};

#[tokio::main]
async fn main() {
    match run().await {
        Ok(0) => {}
        Ok(code) => std::process::exit(code),
        // As a command killed by SIGPIPE ends, by convention (`| head -1`): nothing to say,
        // and no one to say it to.
        Err(e) if e.is::<cli::StdoutClosed>() => std::process::exit(128 + libc::SIGPIPE),
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::exit(1);
        }
    }
}

/// `chime bench` and `chime soak`: replaces this process with `chime-bench` from this
/// binary's directory, given the same command line, so that the server carries no bench
/// code. Returns only if that fails.
fn exec_bench_tool() -> anyhow::Error {
    use std::os::unix::process::CommandExt;
    let tool = match std::env::current_exe() {
        Ok(exe) => exe.with_file_name("chime-bench"),
        Err(e) => return anyhow::Error::new(e).context("finding this binary's directory, where chime-bench is"),
    };
    if !tool.exists() {
        let release = if cfg!(debug_assertions) { "" } else { " --release" };
        return anyhow::anyhow!(
            "{} not found: `chime bench` and `chime soak` run it; build it beside chime with `cargo build{release} --bin chime-bench`",
            tool.display()
        );
    }
    // argv[0] "chime", so that its help and errors name the command that was typed.
    let error = std::process::Command::new(&tool).arg0("chime").args(std::env::args_os().skip(1)).exec();
    anyhow::Error::new(error).context(format!("running {}", tool.display()))
}

/// Returns the exit status: 0, or 2 from `apply --exit-code` when there was drift.
async fn run() -> anyhow::Result<i32> {
    config::load_config_file()?;
    let args = Cli::parse();
    chime::logs::init(args.log.log.as_deref(), args.log.log_format)?;
    // Before any biz type is read or written: every secret goes through these keys.
    let keyring = secrets::Keyring::from_settings(&args.secrets)?;
    let sealing = keyring.seals();
    secrets::install(keyring);

    // The biz-type commands validate callback URLs as `serve` does: CHIME_DENY_PRIVATE_CALLBACKS
    // reaches them through the environment or the config file.
    let callback_hosts = args.serve.callback_hosts();
    let command = args.command.unwrap_or(Command::Serve(args.serve));
    if let Command::Bench(_) | Command::Soak(_) = command {
        return Err(exec_bench_tool());
    }
    if let Command::Openapi = command {
        println!("{:#}", chime::api::openapi_document());
        return Ok(0);
    }
    // Checked before the database is opened: a bad OTEL_* setting stops a node at once.
    let traces = match &command {
        Command::Serve(settings) => chime::traces::start(&settings.traces)?,
        _ => None,
    };
    let mut exit_code = 0;
    let attach = !matches!(command, Command::Serve(_));
    let database = Database::open(&args.db, attach).await?;
    let result = async {
        // Only `serve` and `migrate` change the schema: an admin command run from a laptop
        // must not upgrade production under the nodes still running the previous release.
        if !matches!(command, Command::Serve(_) | Command::Migrate(_)) {
            db::Schema::read(&database.pool).await?.require_current()?;
        }
        match command {
            Command::Serve(settings) => {
                if !sealing {
                    tracing::warn!(
                        "CHIME_SECRET_KEY is not set: biz types' signing secrets are stored in clear in the database \
                         (docs/book/src/settings.md, Secrets at rest)"
                    );
                }
                serve(&database, &settings, &args.db, sealing).await
            }
            Command::Migrate(m) => cli::migrate(&database.health.sessions().into(), m).await,
            Command::BizType(c) => cli::biz_type(&database.pool, c, callback_hosts).await,
            Command::Token(c) => cli::token(&database.pool, c).await,
            Command::AdminToken(c) => cli::admin_token(&database.pool, c).await,
            Command::User(c) => cli::user(&database.pool, c).await,
            Command::Secrets(c) => cli::secrets(&database.pool, c).await,
            Command::Apply(a) => {
                let drift = cli::apply(&database.pool, &a, callback_hosts).await?;
                exit_code = if drift && a.exit_code { 2 } else { 0 };
                Ok(())
            }
            Command::Bench(_) | Command::Soak(_) | Command::Openapi => unreachable!("handled above"),
        }
    }
    .await;
    database.close().await;
    if let Some(traces) = traces {
        traces.stop().await;
    }
    result.map(|()| exit_code)
}

/// `sealing`: CHIME_SECRET_KEY is set.
async fn serve(database: &Database, settings: &ServeArgs, db: &DbArgs, sealing: bool) -> anyhow::Result<()> {
    // Listening first: /healthz answers while the database is migrated, so a liveness
    // probe does not kill a long migration; /readyz answers 200 once it is done.
    let app = Application::bind(settings, database.pool.clone(), database.health.clone()).await?;
    tracing::info!("listening on http://{}:{}; /healthz answers, /readyz once the database is ready", settings.listen.ip(), app.port());
    // The operator needs these once; shown on a terminal, else put in an owner-only file.
    let mut credentials = String::new();
    if let Some(password) = app.prepare().await? {
        credentials += &format!("created console user `admin` with password: {password}\n");
        credentials += "(shown only this once; set CHIME_ADMIN_PASSWORD before the first start to choose it)\n";
    }
    // Said once, as the node becomes ready: the same secrets stay in clear until someone
    // runs the command.
    if sealing {
        let clear = chime::biz_types::secrets_in_clear(&database.pool).await?;
        if !clear.is_empty() {
            let names: Vec<String> = clear.iter().take(10).map(|n| format!("`{n}`")).collect();
            let more = if clear.len() > names.len() { format!(" and {} more", clear.len() - names.len()) } else { String::new() };
            tracing::warn!(
                "CHIME_SECRET_KEY is set, but the signing secrets of {} biz type(s) are stored in clear in the database: {}{more}; \
                 run `chime secrets reencrypt` to encrypt them (docs/book/src/settings.md, Secrets at rest)",
                clear.len(),
                names.join(", ")
            );
        }
    }
    tracing::info!(
        "chime ready on http://{}:{} (console at /console, API under /api/v1, OpenAPI at /api/v1/openapi.json)",
        settings.listen.ip(),
        app.port()
    );
    if let (Some(address), Some(port)) = (settings.metrics_listen, app.metrics_port()) {
        tracing::info!("metrics at http://{}:{port}/metrics", address.ip());
    }
    // The demo's receiver is on loopback, which the deny list refuses.
    if db.database_url.is_none() && !settings.deny_private_callbacks {
        let ip = if settings.listen.ip().is_unspecified() { "127.0.0.1".to_string() } else { settings.listen.ip().to_string() };
        let url = format!("http://{ip}:{}{}", app.port(), chime::demo::PATH);
        if let Some(token) = chime::demo::ensure(&database.pool, &url).await? {
            credentials += &format!("created biz type `demo`, delivering to the built-in receiver at {url}; its API token:\n{token}\n");
            credentials += &format!(
                "try: curl -s http://{ip}:{}/api/v1/tasks -H \"Authorization: Bearer {token}\" -d '{{\"biz_type\": \"demo\", \"delay_ms\": 2000, \"payload\": {{\"hello\": \"world\"}}}}'\n",
                app.port()
            );
        }
    }
    if !credentials.is_empty() {
        chime::first_start::hand_over(&db.data_dir, &credentials)?;
    }
    app.run_until(signals()?).await.context("running the server")
}

/// SIGTERM and Ctrl-C as they come: the first stops the node, a second ends its grace.
fn signals() -> anyhow::Result<impl futures_util::Stream<Item = &'static str>> {
    use tokio::signal::unix::{SignalKind, signal};
    let listening = (signal(SignalKind::terminate())?, signal(SignalKind::interrupt())?);
    Ok(futures_util::stream::unfold(listening, |(mut term, mut int)| async move {
        let name = tokio::select! {
            _ = int.recv() => "Ctrl-C",
            _ = term.recv() => "SIGTERM",
        };
        Some((name, (term, int)))
    }))
}
