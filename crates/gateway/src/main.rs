//! The `gateway` binary: `gateway serve` runs the server, `gateway migrate` applies migrations.

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use gateway::store::Store;
use gateway::{Application, Config};

#[derive(Parser)]
#[command(
    name = "gateway",
    version,
    about = "OpenAI Responses-compatible gateway with server-side tools"
)]
struct Cli {
    /// Configuration file; `GATEWAY__SECTION__KEY` variables override it.
    /// Defaults to `config/default.toml` when it exists; a file given here must exist.
    #[arg(long, global = true)]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the server.
    Serve,
    /// Apply database migrations and exit.
    Migrate,
    /// Run a self-contained demo: the embedded store (unless a database is configured), the testkit's mock
    /// model and example tools in-process, and a seeded demo project, key, deployment and tools.
    #[cfg(feature = "demo")]
    Demo,
}

fn main() -> anyhow::Result<()> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        // A worker about to go idle flushes its cache of freed blocks when the memory upkeep asked for it (see
        // `gateway::memory`), so that what a burst freed can be given back.
        .on_thread_park(gateway_allocator::flush_if_asked)
        .build()?
        .block_on(serve_or_migrate())
}

async fn serve_or_migrate() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let config = Config::load(&config_file(cli.config)?)
        .map_err(|e| anyhow::anyhow!("invalid configuration: {e}"))?;
    let telemetry = gateway::telemetry::init(&config.log, &config.telemetry)?;
    let ran = run(cli.command, config).await;
    telemetry.shutdown();
    ran
}

async fn run(command: Command, config: Config) -> anyhow::Result<()> {
    match command {
        Command::Serve => {
            warn_of_misnamed_variables(&config);
            let admin_api = if config.admin.token.is_some() {
                "on"
            } else {
                "off"
            };
            let metrics_auth = if config.admin.metrics_token.is_some() {
                "bearer token"
            } else {
                "open"
            };
            let traces = config.telemetry.otlp_endpoint.is_some();
            let app = Application::build(config).await?;
            let store = match app.store().backend() {
                gateway::store::Backend::Postgres(_) => "postgres",
                gateway::store::Backend::Sqlite(_) => "embedded (sqlite)",
            };
            tracing::info!(
                version = env!("CARGO_PKG_VERSION"),
                address = %app.local_addr()?,
                replica.id = %app.replica_id(),
                store,
                admin_api,
                metrics_auth,
                traces,
                "gateway listening"
            );
            app.run_until(shutdown_signal()).await?;
            tracing::info!("gateway stopped");
        }
        #[cfg(feature = "demo")]
        Command::Demo => gateway::demo::run(config, shutdown_signal()).await?,
        Command::Migrate => {
            let database = gateway::config::DatabaseConfig {
                max_connections: 1,
                ..config.database.clone()
            };
            Store::connect_configured(&database)
                .await?
                .migrate()
                .await?;
            tracing::info!("migrations applied");
        }
    }
    Ok(())
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = terminate => {},
    }
}

/// Warns of variables that look like settings but are not read: `GATEWAY_ADMIN_TOKEN` (docker compose's name)
/// instead of `GATEWAY__ADMIN__TOKEN`, and any `GATEWAY_X` where `GATEWAY__X` was meant.
fn warn_of_misnamed_variables(config: &Config) {
    const SECTIONS: [&str; 14] = [
        "SERVER",
        "ADMIN",
        "DATABASE",
        "LIMITS",
        "UPSTREAM",
        "TOOLS",
        "LOG",
        "TENANCY",
        "DURABILITY",
        "WEBSOCKET",
        "COMPACTION",
        "GOVERNANCE",
        "TELEMETRY",
        "SEED",
    ];
    for (name, _) in std::env::vars_os() {
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix("GATEWAY_")) else {
            continue;
        };
        let Some((section, key)) = rest.split_once('_') else {
            continue;
        };
        if SECTIONS.contains(&section) && !key.is_empty() && !key.starts_with('_') {
            tracing::warn!(
                variable = %name.to_string_lossy(),
                meant = %format!("GATEWAY__{section}__{key}"),
                "this variable is not read: settings take a double underscore after GATEWAY and between section and key"
            );
        }
    }
    if config.admin.token.is_none() {
        tracing::info!("admin API off: set GATEWAY__ADMIN__TOKEN (or admin.token) to turn it on");
    }
}

/// The configuration file: the one given (which must exist), or the default one when present.
fn config_file(given: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    match given {
        Some(path) if !path.is_file() => {
            anyhow::bail!("configuration file {} not found", path.display())
        }
        Some(path) => Ok(path),
        None => Ok(PathBuf::from("config/default.toml")),
    }
}
