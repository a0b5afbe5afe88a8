//! `example-tools`: the example tool server (demos, docker compose).

use std::net::SocketAddr;

use clap::Parser;
use gateway_testkit::ToolServer;

/// Example tool server: each tool answers `POST /tools/{name}` with a JSON object of arguments.
#[derive(Debug, Parser)]
#[command(
    name = "example-tools",
    version,
    about,
    after_help = "TOOLS (POST /tools/{name}, JSON arguments):
  get_weather {\"city\": \"Paris\"}   a made-up forecast for the city
  add {\"a\": 2, \"b\": 3}           {\"sum\": 5}
  echo {...}                     the arguments back, under \"echo\"
  plain_text {}                  a text/plain answer
  fail {}                        always HTTP 500
  slow {\"ms\": 500}               waits that long, then answers
  gate {}                        waits until POST /_tools/gate/open
  barrier {\"n\": 3}               waits until n calls are in flight together
  anything else                  HTTP 404

CONTROL:
  GET /_tools/calls              every call received (tool, headers, body)
  POST /_tools/reset             forget the calls
  POST /_tools/gate/open, POST /_tools/gate/close"
)]
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
