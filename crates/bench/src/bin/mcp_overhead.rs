//! `gateway-mcp-overhead`: what the gateway adds to one MCP tool call. The testkit's MCP server runs in-process;
//! the same `add` call is made N times directly over an rmcp client session, and N times through the gateway's
//! tool executor (an `mcp` tool source: schema check, per-source policy, metrics, output cap, the same kind of
//! reused session), and N times as a server that a request names (SPEC 12: checked address, a session opened and
//! closed per call). Prints p50/p90/p99 of each and the p50 differences, in microseconds.

use std::time::Instant;

use anyhow::Context;
use clap::Parser;
use gateway::config::ToolsConfig;
use gateway::tools::{
    CallRef, Endpoint, McpSource, RemoteTool, ServerTool, Source, Target, ToolExecutor,
};
use gateway_core::steps::ToolCall;
use gateway_testkit::McpServer;
use hdrhistogram::Histogram;
use rmcp::model::CallToolRequestParams;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::ServiceExt;
use serde_json::json;

#[derive(Debug, Parser)]
struct Args {
    /// Calls measured on each path (after as many warm-up calls, a tenth of it).
    #[arg(long, default_value_t = 2000)]
    calls: u64,
}

fn micros(h: &Histogram<u64>, q: f64) -> u64 {
    h.value_at_quantile(q)
}

fn line(name: &str, h: &Histogram<u64>) {
    println!(
        "{name:<22} p50 {:>6} us   p90 {:>6} us   p99 {:>6} us   ({} calls)",
        micros(h, 0.5),
        micros(h, 0.9),
        micros(h, 0.99),
        h.len()
    );
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    gateway::tools::remote::install_tls_provider();
    let mcp = McpServer::start().await?;
    let warmup = (args.calls / 10).max(10);

    // Directly: one rmcp client session, tools/call in a loop.
    let direct_client =
        ().serve(StreamableHttpClientTransport::from_uri(mcp.url()))
            .await
            .context("direct MCP session")?;
    let mut direct = Histogram::<u64>::new(3)?;
    for i in 0..warmup + args.calls {
        let arguments = json!({"a": i, "b": 1});
        let request = CallToolRequestParams::new("add")
            .with_arguments(arguments.as_object().cloned().unwrap_or_default());
        let started = Instant::now();
        direct_client.call_tool(request).await?;
        if i >= warmup {
            direct.record(elapsed_us(started))?;
        }
    }

    // Through the gateway's executor.
    let executor = ToolExecutor::new(ToolsConfig::default())?;
    let source = Source::Mcp(McpSource {
        server: Endpoint {
            source_id: "tool_bench".into(),
            source_name: "calc".into(),
            url: mcp.url(),
            timeout_ms: 30_000,
            secret: None,
            policy: Default::default(),
        },
        strict: false,
        notes: Default::default(),
        allowed_tools: None,
        name_prefix: None,
    });
    let tools = executor.expand(vec![source]).await;
    let add = tools
        .iter()
        .find(|t| t.name == "add")
        .context("the MCP server's add tool was not discovered")?;
    let gateway = measure(&executor, add, warmup, args.calls).await?;

    // As a server a request names: the same tool, reached through the checked address, a session per call.
    let prefix = format!("http://{}/", mcp.addr());
    let checked = gateway::tools::remote::RemoteServers::new(&[], &[prefix])?
        .check(&mcp.url())
        .await?;
    let remote = ServerTool {
        target: Target::Remote(RemoteTool {
            server_label: "calc".into(),
            tool: "add".into(),
            approval_required: false,
            timeout_ms: 30_000,
            access: Some(std::sync::Arc::new(gateway::tools::mcp::RemoteAccess {
                server_label: "calc".into(),
                server: checked,
                headers: Default::default(),
                authorization: None,
            })),
        }),
        ..add.clone()
    };
    let declared = measure(&executor, &remote, warmup, args.calls).await?;

    line("direct (rmcp client)", &direct);
    line("through the gateway", &gateway);
    line("request-declared server", &declared);
    let p50 = i128::from(micros(&gateway, 0.5)) - i128::from(micros(&direct, 0.5));
    println!("gateway overhead per MCP call at p50: {p50} us");
    let p50 = i128::from(micros(&declared, 0.5)) - i128::from(micros(&direct, 0.5));
    println!("request-declared server (session per call) overhead at p50: {p50} us");
    Ok(())
}

/// `calls` timed calls of `add` on `tool` through the executor, after `warmup` untimed ones.
async fn measure(
    executor: &ToolExecutor,
    tool: &ServerTool,
    warmup: u64,
    calls: u64,
) -> anyhow::Result<Histogram<u64>> {
    let mut histogram = Histogram::<u64>::new(3)?;
    for i in 0..warmup + calls {
        let call = ToolCall::function(
            format!("fc_{i}"),
            format!("call_{i}"),
            "add",
            json!({"a": i, "b": 1}).to_string(),
        );
        let key = format!("resp_bench:{i}");
        let at = CallRef {
            response_id: "resp_bench",
            idempotency_key: &key,
        };
        let started = Instant::now();
        let Some(outcome) = executor
            .execute(tool, &call, at, std::future::ready(true))
            .await
        else {
            anyhow::bail!("the executor sent nothing although nothing stopped it");
        };
        if outcome.is_error() {
            anyhow::bail!(
                "the call through the gateway failed: {}",
                outcome.model_text()
            );
        }
        if i >= warmup {
            histogram.record(elapsed_us(started))?;
        }
    }
    Ok(histogram)
}

fn elapsed_us(started: Instant) -> u64 {
    u64::try_from(started.elapsed().as_micros())
        .unwrap_or(u64::MAX)
        .max(1)
}
