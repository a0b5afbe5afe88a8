//! `mock-model`: the scripted mock OpenAI Chat Completions server, answering by rule (demos, docker compose).

use std::net::SocketAddr;

use clap::Parser;
use gateway_testkit::MockModel;

/// Mock model server speaking OpenAI Chat Completions, Anthropic Messages and OpenAI Responses, answering
/// by rule or by script.
#[derive(Debug, Parser)]
#[command(
    name = "mock-model",
    version,
    about,
    after_help = "ROUTES:
  POST /v1/chat/completions      OpenAI Chat (base_url http://HOST:PORT/v1)
  POST /v1/messages              Anthropic Messages (base_url http://HOST:PORT)
  POST /v1/responses             OpenAI Responses (base_url http://HOST:PORT/v1)
  GET /v1/models, GET /health

RULES (when no scripted reply is queued), on the last message:
  a tool result                  text \"Tool results: \" and the results, joined by \"; \"
  user text with !call NAME {json} (and tools offered)
                                 a call of each named tool, e.g. \"!call add {\\\"a\\\": 2, \\\"b\\\": 3}\"
  other user text                text \"Echo: \" and the message

CONTROL:
  POST /_mock/script             a JSON array of replies, answered first, in order
  GET /_mock/requests            every request body received
  POST /_mock/reset              clear the script and the requests"
)]
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
