//! `example-tools`: the example tool server (demos, docker compose).

use std::net::SocketAddr;

use clap::Parser;
use gateway_testkit::ToolServer;

/// Example tool server: get_weather, add, echo, plain_text, fail, slow, barrier under `/tools/{name}`.
#[derive(Debug, Parser)]
#[command(name = "example-tools", version, about)]
struct Args {
    /// Address to listen on.
    #[arg(long, env = "EXAMPLE_TOOLS_BIND", default_value = "127.0.0.1:8082")]
    bind: SocketAddr,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    gateway_testkit::init_tracing();
    let args = Args::parse();
    let tools = ToolServer::start_on(args.bind).await?;
    tracing::info!(addr = %tools.addr(), example = %tools.url("get_weather"), "example-tools listening");
    gateway_testkit::announce(tools.addr())?;
    gateway_testkit::shutdown_signal().await;
    tracing::info!("example-tools shutting down");
    drop(tools);
    Ok(())
}
