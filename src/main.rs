use anyhow::Context;
use clap::Parser;

use chime::config::{Cli, Command, ServeArgs};
use chime::db::{self, Database};
use chime::startup::Application;
use chime::{cli, config};

#[tokio::main]
async fn main() {
    if let Err(e) = run().await {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

async fn run() -> anyhow::Result<()> {
    config::load_config_file()?;
    let args = Cli::parse();
    chime::logs::init(args.log.log.as_deref(), args.log.log_format)?;

    // The biz-type commands validate callback URLs as `serve` does: CHIME_DENY_PRIVATE_CALLBACKS
    // reaches them through the environment or the config file.
    let callback_hosts = args.serve.callback_hosts();
    let command = args.command.unwrap_or(Command::Serve(args.serve));
    if let Command::Bench(bench) = command {
        // The bench brings its own database (unless DATABASE_URL is given) and nodes.
        return chime::bench::run(&args.db, bench).await;
    }
    if let Command::Soak(soak) = command {
        return chime::bench::soak(&args.db, soak).await;
    }
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
                if settings.auto_migrate {
                    db::migrate(&database.pool).await?;
                } else {
                    let schema = db::Schema::read(&database.pool).await?;
                    schema.require_current().context("CHIME_AUTO_MIGRATE is false")?;
                    schema.warn_newer();
                }
                serve(&database, &settings, args.db.database_url.is_none()).await
            }
            Command::Migrate(m) => cli::migrate(&database.pool, m).await,
            Command::BizType(c) => cli::biz_type(&database.pool, c, callback_hosts).await,
            Command::Token(c) => cli::token(&database.pool, c).await,
            Command::AdminToken(c) => cli::admin_token(&database.pool, c).await,
            Command::User(c) => cli::user(&database.pool, c).await,
            Command::Bench(_) | Command::Soak(_) => unreachable!("handled above"),
        }
    }
    .await;
    database.close().await;
    result
}

async fn serve(database: &Database, settings: &ServeArgs, embedded: bool) -> anyhow::Result<()> {
    let app = Application::build(settings, database.pool.clone(), database.health.clone()).await?;
    tracing::info!(
        "chime listening on http://{}:{} (console at /console, API under /api/v1, OpenAPI at /api/v1/openapi.json)",
        settings.listen.ip(),
        app.port()
    );
    if let (Some(address), Some(port)) = (settings.metrics_listen, app.metrics_port()) {
        tracing::info!("metrics at http://{}:{port}/metrics", address.ip());
    }
    // The demo's receiver is on loopback, which the deny list refuses.
    if embedded && !settings.deny_private_callbacks {
        let ip = if settings.listen.ip().is_unspecified() { "127.0.0.1".to_string() } else { settings.listen.ip().to_string() };
        let url = format!("http://{ip}:{}{}", app.port(), chime::demo::PATH);
        if let Some(token) = chime::demo::ensure(&database.pool, &url).await? {
            println!("created biz type `demo`, delivering to the built-in receiver at {url}; its API token:");
            println!("{token}");
            println!(
                "try: curl -s http://{ip}:{}/api/v1/tasks -H \"Authorization: Bearer {token}\" -d '{{\"biz_type\": \"demo\", \"delay_ms\": 2000, \"payload\": {{\"hello\": \"world\"}}}}'",
                app.port()
            );
        }
    }
    app.run_until(async {
        match shutdown_signal().await {
            Ok(signal) => tracing::info!("{signal} received; shutting down"),
            Err(e) => tracing::error!(error = %e, "cannot listen for signals; shutting down"),
        }
    })
    .await
    .context("running the server")
}

async fn shutdown_signal() -> anyhow::Result<&'static str> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    Ok(tokio::select! {
        _ = tokio::signal::ctrl_c() => "Ctrl-C",
        _ = term.recv() => "SIGTERM",
    })
}
