//! The scenarios: what is sent to the gateway, what a correct answer looks like, and the equivalent
//! upstream work sent straight to the mock model and tool server ("direct").

use std::time::Instant;

use anyhow::{bail, Context};
use bytes::Bytes;
use futures::StreamExt;
use reqwest::Client;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::load::last_chars;
use crate::setup::{PLAIN_MODEL, TOOLS_ANTHROPIC_MODEL, TOOLS_MODEL, TOOLS_RESPONSES_MODEL};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scenario {
    TextStored,
    TextUnstored,
    ToolRound,
    ToolRoundAnthropic,
    ToolRoundResponses,
    ParallelTools,
    Passthrough,
    StreamText,
    OpenStreams,
    Background,
}

impl Scenario {
    pub const ALL: [Scenario; 10] = [
        Scenario::TextStored,
        Scenario::TextUnstored,
        Scenario::ToolRound,
        Scenario::ToolRoundAnthropic,
        Scenario::ToolRoundResponses,
        Scenario::ParallelTools,
        Scenario::Passthrough,
        Scenario::StreamText,
        Scenario::OpenStreams,
        Scenario::Background,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Scenario::TextStored => "text-stored",
            Scenario::TextUnstored => "text-unstored",
            Scenario::ToolRound => "tool-round",
            Scenario::ToolRoundAnthropic => "tool-round-anthropic",
            Scenario::ToolRoundResponses => "tool-round-responses",
            Scenario::ParallelTools => "parallel-tools",
            Scenario::Passthrough => "passthrough",
            Scenario::StreamText => "stream-text",
            Scenario::OpenStreams => "open-streams",
            Scenario::Background => "background",
        }
    }

    pub fn describe(self) -> &'static str {
        match self {
            Scenario::TextStored => "one model call answering text, `store: true`",
            Scenario::TextUnstored => "one model call answering text, `store: false`",
            Scenario::ToolRound => {
                "model → server tool `add` → model (2 model calls, 1 tool call), stored"
            }
            Scenario::ToolRoundAnthropic => "tool-round over an `anthropic` deployment (Messages API)",
            Scenario::ToolRoundResponses => {
                "tool-round over an `openai_responses` deployment (Responses API)"
            }
            Scenario::ParallelTools => "model → 4 server tools in one batch → model, stored",
            Scenario::Passthrough => {
                "model asks for a client tool: the batch is handed back as `function_call`, stored"
            }
            Scenario::StreamText => "`stream: true`, one model call answering text, stored",
            Scenario::OpenStreams => {
                "N concurrent `stream: true` requests held open by a slow upstream"
            }
            Scenario::Background => {
                "`background: true` text: the create answers `queued` at once, the response runs after (run it at a fixed --rate: a closed loop queues without bound)"
            }
        }
    }

    /// Parses `all` or a comma-separated list of names.
    pub fn parse_list(text: &str) -> anyhow::Result<Vec<Scenario>> {
        if text.trim() == "all" {
            return Ok(Scenario::ALL.to_vec());
        }
        text.split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|name| {
                Scenario::ALL
                    .into_iter()
                    .find(|s| s.name() == name)
                    .with_context(|| {
                        let names: Vec<&str> = Scenario::ALL.iter().map(|s| s.name()).collect();
                        format!(
                            "unknown scenario '{name}'; expected all or {}",
                            names.join(", ")
                        )
                    })
            })
            .collect()
    }

    /// Where the mock model answers this scenario's provider kind, for the direct plan.
    pub fn model_path(self) -> &'static str {
        match self {
            Scenario::ToolRoundAnthropic => "/v1/messages",
            Scenario::ToolRoundResponses => "/v1/responses",
            _ => "/v1/chat/completions",
        }
    }

    /// The body of the gateway request and what its answer must hold.
    pub fn gateway_body(self) -> (Value, Expect) {
        let text = "Say hello to the benchmark.";
        match self {
            Scenario::TextStored => (
                json!({"model": PLAIN_MODEL, "input": text, "store": true}),
                Expect::Text,
            ),
            Scenario::TextUnstored => (
                json!({"model": PLAIN_MODEL, "input": text, "store": false}),
                Expect::Text,
            ),
            Scenario::ToolRound => (
                json!({"model": TOOLS_MODEL, "input": "!call add {\"a\":1,\"b\":2}", "store": true}),
                Expect::ServerTools(1),
            ),
            Scenario::ToolRoundAnthropic => (
                json!({"model": TOOLS_ANTHROPIC_MODEL, "input": "!call add {\"a\":1,\"b\":2}", "store": true}),
                Expect::ServerTools(1),
            ),
            Scenario::ToolRoundResponses => (
                json!({"model": TOOLS_RESPONSES_MODEL, "input": "!call add {\"a\":1,\"b\":2}", "store": true}),
                Expect::ServerTools(1),
            ),
            Scenario::ParallelTools => (
                json!({
                    "model": TOOLS_MODEL,
                    "input": "!call add {\"a\":1,\"b\":2} !call add {\"a\":3,\"b\":4} !call echo {\"n\":5} !call get_weather {\"city\":\"Paris\"}",
                    "store": true,
                }),
                Expect::ServerTools(4),
            ),
            Scenario::Passthrough => (
                json!({
                    "model": PLAIN_MODEL,
                    "input": "!call lookup {\"q\":\"bench\"}",
                    "tools": [{
                        "type": "function",
                        "name": "lookup",
                        "description": "A client-side lookup.",
                        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
                    }],
                    "store": true,
                }),
                Expect::HandBack(1),
            ),
            Scenario::StreamText | Scenario::OpenStreams => (
                json!({"model": PLAIN_MODEL, "input": text, "stream": true, "store": true}),
                Expect::Text,
            ),
            Scenario::Background => (
                json!({"model": PLAIN_MODEL, "input": text, "background": true}),
                Expect::Queued,
            ),
        }
    }
}

/// What a successful gateway answer must contain.
#[derive(Debug, Clone, Copy)]
pub enum Expect {
    /// `completed`, with a message.
    Text,
    /// `completed`, with this many completed `mcp_call` items and a message.
    ServerTools(usize),
    /// `completed`, with this many `function_call` items.
    HandBack(usize),
    /// `queued` (a background create, answered before it runs).
    Queued,
}

#[derive(Deserialize)]
struct ResponseShape {
    status: String,
    #[serde(default)]
    output: Vec<ItemShape>,
}

#[derive(Deserialize)]
struct ItemShape {
    #[serde(rename = "type")]
    kind: String,
    status: Option<String>,
}

impl Expect {
    fn check(self, response: ResponseShape) -> Result<(), String> {
        if let Expect::Queued = self {
            return match response.status.as_str() {
                "queued" => Ok(()),
                other => Err(format!("response status '{other}', expected 'queued'")),
            };
        }
        if response.status != "completed" {
            return Err(format!("response status '{}'", response.status));
        }
        let count = |kind: &str| response.output.iter().filter(|i| i.kind == kind).count();
        let has_message = count("message") > 0;
        let ok = match self {
            Expect::Text => has_message,
            Expect::ServerTools(n) => {
                has_message
                    && count("mcp_call") == n
                    && response
                        .output
                        .iter()
                        .filter(|i| i.kind == "mcp_call")
                        .all(|i| i.status.as_deref() == Some("completed"))
            }
            Expect::HandBack(n) => count("function_call") == n,
            Expect::Queued => true,
        };
        if ok {
            Ok(())
        } else {
            let kinds: Vec<&str> = response.output.iter().map(|i| i.kind.as_str()).collect();
            Err(format!("unexpected output {kinds:?} for {self:?}"))
        }
    }

    fn check_json(self, body: &[u8]) -> Result<(), String> {
        let response: ResponseShape = serde_json::from_slice(body)
            .map_err(|e| format!("answer is not a response object: {e}"))?;
        self.check(response)
    }

    /// Checks an event stream: it must end with `response.completed` whose response passes [`Expect::check`].
    fn check_stream(self, body: &[u8]) -> Result<(), String> {
        let text = String::from_utf8_lossy(body);
        for line in text.lines() {
            let Some(data) = line.strip_prefix("data:") else {
                continue;
            };
            if !data.contains("response.completed") && !data.contains("response.failed") {
                continue;
            }
            let Ok(event) = serde_json::from_str::<Value>(data.trim()) else {
                continue;
            };
            match event.get("type").and_then(Value::as_str) {
                Some("response.completed") => {
                    let response = event.get("response").cloned().unwrap_or(Value::Null);
                    let response: ResponseShape = serde_json::from_value(response)
                        .map_err(|e| format!("response.completed without a response: {e}"))?;
                    return self.check(response);
                }
                Some("response.failed") => return Err(format!("stream ended with {data}")),
                _ => {}
            }
        }
        let end = last_chars(&text, 300);
        Err(format!(
            "stream ended without response.completed ({} bytes; ends with {end:?})",
            body.len()
        ))
    }
}

/// One `POST /v1/responses`.
#[derive(Debug, Clone)]
pub struct GatewayRequest {
    pub url: String,
    pub key: String,
    pub body: Bytes,
    pub stream: bool,
    pub expect: Expect,
}

impl GatewayRequest {
    /// The request as `http` sends it: a JSON POST with the project's key.
    pub fn send(
        &self,
        http: &Client,
    ) -> impl std::future::Future<Output = reqwest::Result<reqwest::Response>> {
        http.post(&self.url)
            .bearer_auth(&self.key)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(self.body.clone())
            .send()
    }
}

/// One upstream-shaped request sent straight to the mock model or the tool server.
#[derive(Debug, Clone)]
pub struct DirectCall {
    pub url: String,
    pub body: Bytes,
    pub stream: bool,
}

/// The upstream work of one gateway request: stages run one after the other, the calls of a stage
/// at the same time (a parallel tool batch).
#[derive(Debug, Clone)]
pub struct DirectPlan {
    pub stages: Vec<Vec<DirectCall>>,
}

impl DirectPlan {
    pub fn describe(&self) -> String {
        let models = self
            .stages
            .iter()
            .flatten()
            .filter(|c| {
                ["/chat/completions", "/v1/messages", "/v1/responses"]
                    .iter()
                    .any(|path| c.url.ends_with(path))
            })
            .count();
        let tools = self.stages.iter().flatten().count() - models;
        format!("{models} model call(s), {tools} tool call(s)")
    }
}

/// What a load driver sends.
#[derive(Debug, Clone)]
pub enum Target {
    Gateway(GatewayRequest),
    Direct(DirectPlan),
}

impl Target {
    /// Sends one request (or one plan) and checks its answer; answers when the first body bytes
    /// arrived (streams) or `None`.
    pub async fn execute(&self, http: &Client) -> Result<Option<Instant>, String> {
        match self {
            Target::Gateway(request) => gateway_call(http, request).await,
            Target::Direct(plan) => {
                let mut first = None;
                for stage in &plan.stages {
                    let at = match stage.as_slice() {
                        [one] => direct_call(http, one).await?,
                        calls => {
                            let results = futures::future::join_all(
                                calls.iter().map(|c| direct_call(http, c)),
                            )
                            .await;
                            let mut at = None;
                            for result in results {
                                at = at.or(result?);
                            }
                            at
                        }
                    };
                    first = first.or(at);
                }
                Ok(first)
            }
        }
    }
}

fn describe_error(e: &reqwest::Error) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(inner) = source {
        text.push_str(": ");
        text.push_str(&inner.to_string());
        source = inner.source();
    }
    text
}

/// Reads a body to its end, noting when the first bytes came.
async fn read_body(response: reqwest::Response) -> Result<(Vec<u8>, Option<Instant>), String> {
    let mut first = None;
    let mut body = Vec::new();
    let mut chunks = response.bytes_stream();
    while let Some(chunk) = chunks.next().await {
        let chunk = chunk.map_err(|e| format!("body: {}", describe_error(&e)))?;
        if first.is_none() && !chunk.is_empty() {
            first = Some(Instant::now());
        }
        body.extend_from_slice(&chunk);
    }
    Ok((body, first))
}

fn status_error(status: reqwest::StatusCode, body: &[u8]) -> String {
    let text: String = String::from_utf8_lossy(body).chars().take(300).collect();
    format!("HTTP {status}: {text}")
}

async fn gateway_call(http: &Client, request: &GatewayRequest) -> Result<Option<Instant>, String> {
    let response = request.send(http).await.map_err(|e| describe_error(&e))?;
    let status = response.status();
    if request.stream {
        let (body, first) = read_body(response).await?;
        if !status.is_success() {
            return Err(status_error(status, &body));
        }
        request.expect.check_stream(&body)?;
        Ok(first)
    } else {
        let body = response
            .bytes()
            .await
            .map_err(|e| format!("body: {}", describe_error(&e)))?;
        if !status.is_success() {
            return Err(status_error(status, &body));
        }
        request.expect.check_json(&body)?;
        Ok(None)
    }
}

async fn direct_call(http: &Client, call: &DirectCall) -> Result<Option<Instant>, String> {
    let response = http
        .post(&call.url)
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(call.body.clone())
        .send()
        .await
        .map_err(|e| describe_error(&e))?;
    let status = response.status();
    let (body, first) = read_body(response).await?;
    if !status.is_success() {
        return Err(status_error(status, &body));
    }
    if call.stream && !body.windows(6).any(|w| w == b"[DONE]") {
        return Err("direct stream ended without [DONE]".into());
    }
    Ok(if call.stream { first } else { None })
}

/// Where the bench sends its requests.
#[derive(Debug, Clone)]
pub struct Endpoints {
    pub gateway: String,
    pub key: String,
    pub mock: String,
    pub tools: String,
}

async fn get_json(http: &Client, url: &str) -> anyhow::Result<Value> {
    let response = http
        .get(url)
        .send()
        .await
        .with_context(|| format!("GET {url}"))?;
    let status = response.status();
    if !status.is_success() {
        bail!("GET {url} answered {status}");
    }
    Ok(response.json().await?)
}

/// Forgets the script and the requests recorded by the mock model and the tool server (they keep every
/// request in memory).
pub async fn reset_mocks(http: &Client, endpoints: &Endpoints) -> anyhow::Result<()> {
    for url in [
        format!("{}/_mock/reset", endpoints.mock),
        format!("{}/_tools/reset", endpoints.tools),
    ] {
        let status = http.post(&url).send().await?.status();
        if !status.is_success() {
            bail!("POST {url} answered {status}");
        }
    }
    Ok(())
}

/// The gateway request of `scenario`, and its direct plan, learnt by sending the request once and
/// reading what reached the mock model and the tool server.
pub async fn probe(
    http: &Client,
    endpoints: &Endpoints,
    scenario: Scenario,
) -> anyhow::Result<(GatewayRequest, DirectPlan)> {
    let (body, expect) = scenario.gateway_body();
    let request = GatewayRequest {
        url: format!("{}/v1/responses", endpoints.gateway),
        key: endpoints.key.clone(),
        body: Bytes::from(serde_json::to_vec(&body)?),
        stream: body.get("stream").and_then(Value::as_bool) == Some(true),
        expect,
    };
    reset_mocks(http, endpoints).await?;
    if let Err(e) = gateway_call(http, &request).await {
        bail!("the probe request failed: {e}");
    }
    let mut model_calls = get_json(http, &format!("{}/_mock/requests", endpoints.mock)).await?;
    // A background response does its work after the answer: the direct plan is that work.
    let waiting_since = Instant::now();
    while scenario == Scenario::Background
        && model_calls.as_array().is_none_or(Vec::is_empty)
        && waiting_since.elapsed() < std::time::Duration::from_secs(5)
    {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        model_calls = get_json(http, &format!("{}/_mock/requests", endpoints.mock)).await?;
    }
    let tool_calls = get_json(http, &format!("{}/_tools/calls", endpoints.tools)).await?;
    reset_mocks(http, endpoints).await?;

    let mut models = Vec::new();
    for body in model_calls.as_array().into_iter().flatten() {
        models.push(DirectCall {
            url: format!("{}{}", endpoints.mock, scenario.model_path()),
            body: Bytes::from(serde_json::to_vec(body)?),
            stream: body.get("stream").and_then(Value::as_bool) == Some(true),
        });
    }
    let mut tools = Vec::new();
    for call in tool_calls.as_array().into_iter().flatten() {
        let name = call
            .get("tool")
            .and_then(Value::as_str)
            .context("a recorded tool call without a name")?;
        tools.push(DirectCall {
            url: format!("{}/tools/{name}", endpoints.tools),
            body: Bytes::from(serde_json::to_vec(
                call.get("body").unwrap_or(&Value::Null),
            )?),
            stream: false,
        });
    }
    if models.is_empty() {
        bail!("the probe request reached no model");
    }
    let mut models = models.into_iter();
    let mut stages = Vec::new();
    if let Some(first) = models.next() {
        stages.push(vec![first]);
    }
    if !tools.is_empty() {
        stages.push(tools);
    }
    stages.extend(models.map(|m| vec![m]));
    Ok((request, DirectPlan { stages }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scenario_lists_parse_by_name_or_all() -> anyhow::Result<()> {
        assert_eq!(Scenario::parse_list("all")?, Scenario::ALL.to_vec());
        assert_eq!(
            Scenario::parse_list("tool-round, open-streams")?,
            vec![Scenario::ToolRound, Scenario::OpenStreams]
        );
        assert!(Scenario::parse_list("text-stored,nope").is_err());
        Ok(())
    }

    #[test]
    fn answers_are_checked_against_the_expected_output() {
        let tools = json!({"status": "completed", "output": [
            {"type": "mcp_call", "status": "completed"},
            {"type": "message", "status": "completed"},
        ]})
        .to_string();
        assert_eq!(Expect::ServerTools(1).check_json(tools.as_bytes()), Ok(()));
        assert!(Expect::ServerTools(4).check_json(tools.as_bytes()).is_err());
        assert_eq!(Expect::Text.check_json(tools.as_bytes()), Ok(()));
        assert!(Expect::HandBack(1).check_json(tools.as_bytes()).is_err());
        let failed = json!({"status": "failed", "output": []}).to_string();
        assert!(Expect::Text.check_json(failed.as_bytes()).is_err());
        assert!(Expect::Text.check_json(b"not json").is_err());
    }

    #[test]
    fn a_stream_must_end_with_a_completed_response() {
        let completed = json!({"type": "response.completed", "response": {"status": "completed", "output": [{"type": "message"}]}});
        let good = format!(
            "event: response.created\ndata: {{\"type\":\"response.created\"}}\n\nevent: response.completed\ndata: {completed}\n\n"
        );
        assert_eq!(Expect::Text.check_stream(good.as_bytes()), Ok(()));
        let cut = "event: response.created\ndata: {\"type\":\"response.created\"}\n\n";
        assert!(Expect::Text.check_stream(cut.as_bytes()).is_err());
        let failed =
            "data: {\"type\":\"response.failed\",\"response\":{\"status\":\"failed\"}}\n\n";
        assert!(Expect::Text.check_stream(failed.as_bytes()).is_err());
    }
}
