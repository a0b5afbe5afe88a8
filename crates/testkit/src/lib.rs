//! Mocks for everything outside the gateway: an upstream model provider and users' tool endpoints.
//!
//! * [`mock_model`] — a scripted mock of the OpenAI Chat Completions API ([`MockModel`]).
//! * [`tool_server`] — an example tool server with deterministic tools ([`ToolServer`]).
//! * [`otlp_receiver`] — an OTLP/HTTP trace receiver that keeps the spans it is sent ([`OtlpReceiver`]).
//! * [`webhook_receiver`] — a webhook receiver that keeps what it is sent and answers as scripted ([`WebhookReceiver`]).
//! * [`fault_proxy`] — a TCP proxy that cuts connections at random moments, for fault injection ([`FaultProxy`]).
//! * `scratch` (feature `scratch`) — a fresh database per test, Postgres or an embedded-store file.
//!
//! Both servers run in-process on a tokio task, bind to a port of your choice (port 0 in
//! tests) and stop when the last handle is dropped. They never touch the real network.
//! The `mock-model` and `example-tools` binaries wrap them for demos, docker compose and
//! out-of-process tests (the Python client suite), which script and inspect them over HTTP
//! (`/_mock/*`, `/_tools/*`). Each binary prints `listening on http://HOST:PORT` on stdout once
//! bound, so a test can start it with `--bind 127.0.0.1:0` and read the port.

pub mod fault_proxy;
mod kept;
pub mod mcp_server;
pub mod mock_model;
pub mod otlp_receiver;
#[cfg(feature = "scratch")]
pub mod scratch;
mod server;
pub mod tool_server;
pub mod webhook_receiver;

pub use fault_proxy::FaultProxy;
pub use kept::DEFAULT_KEPT;
pub use mcp_server::McpServer;
pub use mock_model::{
    anthropic_prompt_cache_usage, mock_input_tokens, Call, MockModel, Reply, ReplySpec, StreamMode,
};
pub use otlp_receiver::{OtlpReceiver, ReceivedSpan};
pub use tool_server::{
    misbehaving_tool_definitions, tool_definitions, RecordedCall, ToolDefinition, ToolServer,
};
pub use webhook_receiver::{ReceivedWebhook, WebhookAnswer, WebhookReceiver};

/// Installs a `tracing-subscriber` fmt logger on stderr filtered by `RUST_LOG` (default `info`),
/// for the binaries; stdout is kept for the readiness line ([`announce`]). Does nothing if a
/// global subscriber is already set.
pub fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

/// Prints `listening on http://HOST:PORT` on stdout and flushes it: the readiness line that an
/// out-of-process test reads to learn the port of a binary started with `--bind 127.0.0.1:0`.
pub fn announce(addr: std::net::SocketAddr) -> std::io::Result<()> {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "listening on http://{addr}")?;
    stdout.flush()
}

/// Resolves on Ctrl-C or (on Unix) SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::error!(error = %e, "cannot listen for Ctrl-C");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = terminate => {}
    }
}
