//! `example-mcp`: the example MCP server (streamable HTTP at `/mcp`) as a process, for the client suite and demos.

use std::net::SocketAddr;

use clap::Parser;
use gateway_testkit::McpServer;

/// Example MCP server: tools add, fail and hang at `http://HOST:PORT/mcp`.
#[derive(Debug, Parser)]
#[command(name = "example-mcp", version, about)]
struct Args {
    /// Address to listen on.
    #[arg(long, env = "EXAMPLE_MCP_BIND", default_value = "127.0.0.1:8083")]
    bind: SocketAddr,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    gateway_testkit::init_tracing();
    let args = Args::parse();
    let server = McpServer::start_on(args.bind).await?;
    tracing::info!(addr = %server.addr(), url = %server.url(), "example-mcp listening");
    gateway_testkit::announce(server.addr())?;
    gateway_testkit::shutdown_signal().await;
    tracing::info!("example-mcp shutting down");
    server.stop();
    Ok(())
}
