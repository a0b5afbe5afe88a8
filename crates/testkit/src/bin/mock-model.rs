//! `mock-model`: the scripted mock OpenAI Chat Completions server, answering by rule (demos, docker compose).

use std::net::SocketAddr;

use clap::Parser;
use gateway_testkit::MockModel;

/// Mock OpenAI Chat Completions server (answers by rule: echo, `!call NAME {args}`, tool results).
#[derive(Debug, Parser)]
#[command(name = "mock-model", version, about)]
struct Args {
    /// Address to listen on.
    #[arg(long, env = "MOCK_MODEL_BIND", default_value = "127.0.0.1:8081")]
    bind: SocketAddr,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    gateway_testkit::init_tracing();
    let args = Args::parse();
    let model = MockModel::start_on(args.bind).await?;
    tracing::info!(addr = %model.addr(), base_url = %model.base_url(), "mock-model listening");
    gateway_testkit::announce(model.addr())?;
    gateway_testkit::shutdown_signal().await;
    tracing::info!("mock-model shutting down");
    drop(model);
    Ok(())
}
