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

#[tokio::main]
async fn main() -> anyhow::Result<()> {
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
            let app = Application::build(config).await?;
            tracing::info!(address = %app.local_addr()?, replica.id = %app.replica_id(), "gateway listening");
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
