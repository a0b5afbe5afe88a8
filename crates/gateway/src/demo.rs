//! `gateway demo`: one command to a working gateway, with a mock model and example tools in-process.

use std::future::Future;

use gateway_testkit::mcp_server::McpServer;
use gateway_testkit::mock_model::MockModel;
use gateway_testkit::tool_server::{tool_definitions, ToolServer};

use crate::config::{Config, SeedDeployment, SeedGroup, SeedProject, SeedToolSource};
use crate::Application;

/// The demo project's API key. It is public: the demo is for trying the gateway on one machine.
pub const DEMO_KEY: &str = "sk-demo-local-only-0000000000000000";

/// The demo's deployments: one per provider kind.
pub const DEMO_MODELS: [&str; 3] = ["mock", "mock-anthropic", "mock-responses"];

/// The example tools the demo registers as server tools.
const DEMO_TOOLS: [&str; 3] = ["get_weather", "add", "plain_text"];

/// The demo's MCP source (the testkit's MCP server) and the prefix of its tools' names.
const DEMO_MCP_SOURCE: &str = "calc";
const DEMO_MCP_PREFIX: &str = "calc_";

/// Starts the mock model and tool server, seeds the demo entities into `config`, and serves until `shutdown`.
pub async fn run(
    mut config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    // Nobody inspects what the demo's mocks received: they keep none of it, so that a demo under load stays the
    // size it started at.
    let local = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
    let model = MockModel::start_keeping(local, 0).await?;
    let tools = ToolServer::start_keeping(local, 0).await?;
    let mcp = McpServer::start().await?;
    add_demo_seed(&mut config, &model.base_url(), |tool| tools.url(tool));
    add_demo_mcp_seed(&mut config, &mcp.url());
    let app = Application::build(config).await?;
    let address = app.local_addr()?;
    // One write, and a closed stdout is no reason to stop serving.
    let banner = format!(
        "listening on http://{address}\ndemo API key: {DEMO_KEY}   models: {}   server tools: {}, \
         MCP source '{DEMO_MCP_SOURCE}' ({DEMO_MCP_PREFIX}add)\n",
        DEMO_MODELS.join(", "),
        DEMO_TOOLS.join(", ")
    );
    let _ = std::io::Write::write_all(&mut std::io::stdout(), banner.as_bytes());
    app.run_until(shutdown).await?;
    // The mock servers live until the gateway has stopped.
    drop((model, tools, mcp));
    Ok(())
}

/// Adds the demo's MCP source (its `add` tool, offered as `calc_add`) to the demo group.
pub fn add_demo_mcp_seed(config: &mut Config, mcp_url: &str) {
    config.seed.tool_sources.insert(
        DEMO_MCP_SOURCE.into(),
        SeedToolSource {
            kind: Some("mcp".into()),
            description: String::new(),
            parameters: serde_json::Value::Null,
            url: mcp_url.to_owned(),
            timeout_ms: None,
            secret: None,
            strict: false,
            allowed_tools: Some(vec!["add".into()]),
            name_prefix: Some(DEMO_MCP_PREFIX.into()),
        },
    );
    if let Some(group) = config.seed.deployment_groups.get_mut("demo") {
        group.tool_sources.push(DEMO_MCP_SOURCE.into());
    }
}

/// Adds the demo project (key `DEMO_KEY`), the `mock` deployment and the demo tools to `config.seed`.
pub fn add_demo_seed(config: &mut Config, model_base_url: &str, tool_url: impl Fn(&str) -> String) {
    let seed = &mut config.seed;
    let mut project = SeedProject::default();
    project
        .api_keys
        .insert("demo".into(), DEMO_KEY.to_owned().into());
    seed.projects.insert("demo".into(), project);
    // One deployment per provider kind, all answered by the mock model in that provider's shape; Anthropic's base
    // URL excludes the version (SPEC 8).
    let root_url = model_base_url.trim_end_matches("/v1");
    for (name, kind, base_url) in [
        ("mock", "openai_chat", model_base_url),
        ("mock-anthropic", "anthropic", root_url),
        ("mock-responses", "openai_responses", model_base_url),
    ] {
        seed.deployments.insert(
            name.into(),
            SeedDeployment {
                kind: kind.into(),
                base_url: base_url.to_owned(),
                model: gateway_testkit::mock_model::MODEL_ID.into(),
                api_key: None,
                fallbacks: Vec::new(),
                max_tokens: None,
                pricing: None,
                unsupported_tools: None,
                unsupported_params: None,
            },
        );
    }
    for definition in tool_definitions()
        .into_iter()
        .filter(|d| DEMO_TOOLS.contains(&d.name))
    {
        seed.tool_sources.insert(
            definition.name.into(),
            SeedToolSource {
                kind: None,
                description: definition.description.into(),
                parameters: definition.parameters,
                allowed_tools: None,
                name_prefix: None,
                url: tool_url(definition.name),
                timeout_ms: None,
                secret: None,
                strict: false,
            },
        );
    }
    seed.deployment_groups.insert(
        "demo".into(),
        SeedGroup {
            deployments: DEMO_MODELS.iter().map(|m| m.to_string()).collect(),
            projects: vec!["demo".into()],
            tool_sources: DEMO_TOOLS.iter().map(|t| t.to_string()).collect(),
        },
    );
}
