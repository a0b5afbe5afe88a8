//! The tool executor: runs one server tool call where its [`Target`] says (an HTTP source, an operator's MCP
//! source, a request's own MCP server; SPEC sections 7 and 12), within the source's policy (calls in flight,
//! circuit breaker, output cap; see [`policy`]).

pub mod failure;
pub mod mcp;
pub mod policy;
pub mod remote;
pub mod server_tool;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gateway_core::steps::{ToolCall, ToolOutcome};
use secrecy::ExposeSecret;
use serde_json::Value;

use crate::config::ToolsConfig;
use crate::retry::RetryPolicy;
use failure::{Failure, FailureKind};
pub use server_tool::{
    Endpoint, McpSource, McpTool, NoteTemplates, RemoteTool, ServerTool, ServerTools, Source,
    Target,
};

/// Runs server tool calls; every failure becomes an error outcome that the model sees.
#[derive(Debug, Clone)]
pub struct ToolExecutor {
    http: reqwest::Client,
    config: ToolsConfig,
    retry: RetryPolicy,
    /// Compiled argument schemas, by the schema's JSON text: compiling is far dearer than checking.
    validators: moka::sync::Cache<String, Arc<jsonschema::Validator>>,
    /// Calls in flight and breakers, per source.
    policies: Arc<policy::Policies>,
    /// Sessions and tool lists of MCP sources.
    mcp: Arc<mcp::McpClients>,
    /// The operator's allow-list of MCP servers that requests name themselves.
    remote_servers: remote::RemoteServers,
}

/// Identifies one tool step across retries and restarts.
#[derive(Debug, Clone, Copy)]
pub struct CallRef<'a> {
    pub response_id: &'a str,
    /// Stable key of the tool step, the same on every re-send of the step: sent as `Idempotency-Key` to an HTTP
    /// source and as `params._meta.idempotencyKey` of an MCP `tools/call`.
    pub idempotency_key: &'a str,
}

impl ToolExecutor {
    pub fn new(config: ToolsConfig) -> Result<ToolExecutor, reqwest::Error> {
        // rmcp's reqwest 0.13 clients (MCP sessions) need a rustls provider before they are built.
        remote::install_tls_provider();
        let http = reqwest::Client::builder()
            // As for model calls (`upstream.max_idle_connections`): enough for steady use, not a burst's worth.
            .pool_max_idle_per_host(64)
            // A 3xx is the tool's answer, not an instruction: following it could re-post the arguments (and
            // the source's secret) to another host, or loop (SPEC 7).
            .redirect(reqwest::redirect::Policy::none())
            .build()?;
        Ok(ToolExecutor {
            http,
            retry: RetryPolicy::new(config.max_retries, config.backoff_ms),
            validators: moka::sync::Cache::new(1024),
            policies: Arc::default(),
            mcp: Arc::new(mcp::McpClients::new(
                Duration::from_millis(config.mcp_list_ttl_ms),
                Duration::from_millis(config.mcp_connect_timeout_ms),
            )),
            // Checked when the configuration was loaded.
            remote_servers: remote::RemoteServers::new(
                &config.mcp_allowed_urls,
                &config.mcp_allowed_private_urls,
            )
            .unwrap_or_default(),
            config,
        })
    }

    /// The MCP client of every MCP source and of the servers requests name.
    /// Whether the source's circuit breaker is open on this replica (breakers are kept per replica, in memory).
    pub fn breaker_open(&self, source_id: &str) -> bool {
        self.policies.is_open(source_id)
    }

    pub fn mcp(&self) -> &mcp::McpClients {
        &self.mcp
    }

    /// Whether a server a request names may be reached (`tools.mcp_allowed_urls` and
    /// `tools.mcp_allowed_private_urls`, then every address its host resolves to), within `tools.mcp_connect_timeout_ms`; the refusal as the client reads it.
    pub async fn check_remote(&self, url: &str) -> Result<remote::CheckedServer, String> {
        let timeout = Duration::from_millis(self.config.mcp_connect_timeout_ms);
        match tokio::time::timeout(timeout, self.remote_servers.check(url)).await {
            Ok(checked) => checked.map_err(|refusal| refusal.to_string()),
            Err(_) => Err(format!(
                "server_url's host could not be resolved within {} ms",
                timeout.as_millis()
            )),
        }
    }

    /// The timeout of a tool call whose source sets none.
    pub fn default_timeout_ms(&self) -> u64 {
        self.config.default_timeout_ms
    }

    /// The server tools of `sources`: HTTP sources first, as they are, then each MCP source's tools as its server
    /// lists them (see [`mcp::McpClients::tools_of`]). An MCP tool whose name is already taken (by an HTTP tool,
    /// or an earlier source) is skipped with a warning.
    pub async fn expand(&self, sources: Vec<Source>) -> Vec<ServerTool> {
        let mut tools = Vec::with_capacity(sources.len());
        let mut servers = Vec::new();
        for source in sources {
            match source {
                Source::Http(tool) => tools.push(tool),
                Source::Mcp(server) => servers.push(server),
            }
        }
        let mut taken: BTreeSet<String> = tools.iter().map(|t| t.name.clone()).collect();
        for server in servers {
            // Boxed: the MCP client's future is kilobytes, and every request's preparation would carry it.
            for tool in Box::pin(self.mcp.tools_of(&server)).await {
                if !taken.insert(tool.name.clone()) {
                    tracing::warn!(tool_source.name = %server.server.source_name, tool.name = %tool.name,
                        "MCP tool name clashes with another server tool; skipped");
                    continue;
                }
                tools.push(tool);
            }
        }
        tools
    }

    /// Runs `call` on `tool` if `may_send`, asked right before the call goes out (after any wait for a place among
    /// its source's calls in flight), says it still may; `None` when it said no and nothing went out. Never fails
    /// otherwise: errors are outcomes. A failed call is counted by its kind and logged once, at `WARN`, with the
    /// response, the tool, its source, and the status or cause.
    pub async fn execute(
        &self,
        tool: &ServerTool,
        call: &ToolCall,
        at: CallRef<'_>,
        may_send: impl std::future::Future<Output = bool>,
    ) -> Option<ToolOutcome> {
        let started = Instant::now();
        let (outcome, failure) = self.run(tool, call, at, may_send).await?;
        let label = failure.as_ref().map_or("ok", |f| f.kind.as_str());
        let source = tool.metric_source();
        metrics::counter!("gateway_tool_calls_total", "tool" => tool.metric_label(), "source" => source.clone(), "outcome" => label)
            .increment(1);
        metrics::histogram!("gateway_tool_call_duration_seconds", "tool" => tool.metric_label(), "source" => source)
            .record(started.elapsed().as_secs_f64());
        if let Some(failure) = failure {
            tracing::warn!(
                response.id = %at.response_id,
                tool.name = %tool.name,
                tool_source.name = %tool.source_name(),
                tool.origin = %tool.origin(),
                outcome = failure.kind.as_str(),
                cause = %failure.cause,
                "tool call failed"
            );
        }
        Some(outcome)
    }

    /// The outcome, and why it failed when it did (see [`FailureKind`]); `None` when `may_send` said no.
    async fn run(
        &self,
        tool: &ServerTool,
        call: &ToolCall,
        at: CallRef<'_>,
        may_send: impl std::future::Future<Output = bool>,
    ) -> Option<(ToolOutcome, Option<Failure>)> {
        let arguments = match self.parse_arguments(tool, &call.arguments) {
            Ok(arguments) => arguments,
            Err(message) => {
                // Not the message: it may quote the arguments, which are never logged.
                let failure = Failure::new(
                    FailureKind::InvalidArguments,
                    "the arguments were refused before the call (not JSON, or not as the tool's schema says)",
                );
                return Some((ToolOutcome::error(message), Some(failure)));
            }
        };
        let timeout_ms = match tool.timeout_ms() {
            0 => self.config.default_timeout_ms,
            set => set,
        };
        let policy = tool.policy();
        let deadline = Instant::now() + Duration::from_millis(timeout_ms);
        let _slot = match tool
            .endpoint()
            .and_then(|e| self.policies.slots(&e.source_id, &policy))
        {
            None => None,
            Some(slots) => {
                let waiting = Waiting::start(metrics::gauge!(
                    "gateway_tool_calls_waiting",
                    "tool" => tool.metric_label()
                ));
                let acquired =
                    tokio::time::timeout_at(deadline.into(), slots.acquire_owned()).await;
                drop(waiting);
                match acquired {
                    Ok(Ok(slot)) => Some(slot),
                    _ => {
                        let message = format!(
                            "Tool '{}' had all of its {} slots busy for the whole timeout of {timeout_ms} ms; \
                             the call was not made.",
                            tool.name,
                            policy.max_in_flight.unwrap_or(0)
                        );
                        let failure = Failure::new(
                            FailureKind::Timeout,
                            "every slot of the source stayed busy (max_in_flight)",
                        );
                        return Some((ToolOutcome::error(message), Some(failure)));
                    }
                }
            }
        };
        // The wait for a place may have outlasted this replica's hold on the response (a pause, a lapsed lease,
        // a cancel): asked once it has its place, right before the call goes out.
        if !may_send.await {
            return None;
        }
        // A request's own server is not the operator's: no breaker state is shared between requests over it.
        let guarded = tool.endpoint().map(|e| e.source_id.as_str());
        let admission = guarded.map(|id| (id, self.policies.admit(id, Instant::now())));
        if let Some((_, policy::Admission::Refuse { retry_in })) = admission {
            let message = format!(
                "Tool '{}' is failing: after {} consecutive failed calls the gateway stopped calling it \
                 for a while (circuit breaker open); try again in about {} s.",
                tool.name,
                policy.breaker_failures(),
                retry_in.as_secs().max(1)
            );
            let failure = Failure::new(
                FailureKind::BreakerOpen,
                "the source's circuit breaker is open",
            );
            return Some((ToolOutcome::error(message), Some(failure)));
        }
        // The breaker's trial, given back undecided if this call is dropped before it ends.
        let trial = match admission {
            Some((id, policy::Admission::Trial)) => Some(Trial {
                policies: &self.policies,
                source_id: id,
            }),
            _ => None,
        };
        let remaining = deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1));
        let (outcome, failure) = match &tool.target {
            Target::Http(endpoint) => {
                let sent = Sent {
                    endpoint,
                    arguments: &arguments,
                    timeout: remaining,
                    timeout_ms,
                };
                self.send(tool, call, at, sent).await
            }
            // The MCP calls' futures are boxed: about 6 KB each, held inline they made every HTTP tool call's
            // future (one per call of a batch) that size too.
            Target::Mcp(mcp) => {
                let (outcome, failure) = Box::pin(self.mcp.call(
                    &tool.name,
                    mcp,
                    &arguments,
                    remaining,
                    at.idempotency_key,
                ))
                .await;
                (cap_output(outcome, policy.max_output_bytes()), failure)
            }
            Target::Remote(RemoteTool {
                tool: name,
                access: Some(access),
                ..
            }) => {
                let (outcome, failure) = Box::pin(self.mcp.call_remote(
                    access,
                    name,
                    &arguments,
                    remaining,
                    at.idempotency_key,
                ))
                .await;
                (cap_output(outcome, policy.max_output_bytes()), failure)
            }
            // A request's server is reached only through its checked address.
            Target::Remote(RemoteTool { access: None, .. }) => {
                let message = format!(
                    "Tool '{}': its MCP server is not declared in this request.",
                    tool.name
                );
                let failure = Failure::new(FailureKind::Unreachable, message.clone());
                (ToolOutcome::error(message), Some(failure))
            }
        };
        // A 4xx is the tool refusing this call (arguments, say), not the tool being down.
        let failed = failure
            .as_ref()
            .is_some_and(|f| f.kind != FailureKind::Http4xx);
        if let Some(id) = guarded {
            let trial = trial.map(Trial::decided).is_some();
            self.record_for_breaker(tool, id, &policy, failed, trial);
        }
        Some((outcome, failure))
    }

    /// Feeds the source's breaker one call's result; logs when the breaker opens or closes.
    fn record_for_breaker(
        &self,
        tool: &ServerTool,
        source_id: &str,
        policy: &gateway_core::entity::ToolPolicy,
        failed: bool,
        trial: bool,
    ) {
        let was_open = self.policies.is_open(source_id);
        let open = self
            .policies
            .record(source_id, policy, Instant::now(), failed, trial);
        metrics::gauge!("gateway_tool_breaker_open", "tool" => tool.metric_label()).set(if open {
            1.0
        } else {
            0.0
        });
        match (was_open, open) {
            (false, true) => tracing::warn!(
                tool_source.name = %tool.source_name(),
                failures = policy.breaker_failures(),
                "circuit breaker opened: the source's calls are refused for a while"
            ),
            (true, false) => tracing::info!(
                tool_source.name = %tool.source_name(),
                "circuit breaker closed: the source answered again"
            ),
            _ => {}
        }
    }

    async fn send(
        &self,
        tool: &ServerTool,
        call: &ToolCall,
        at: CallRef<'_>,
        Sent {
            endpoint,
            arguments,
            timeout,
            timeout_ms,
        }: Sent<'_>,
    ) -> (ToolOutcome, Option<Failure>) {
        let sent = self
            .retry
            .run(
                |_| {
                    let mut request = self
                        .http
                        .post(&endpoint.url)
                        .timeout(timeout)
                        .header("Idempotency-Key", at.idempotency_key)
                        .header("X-Gateway-Tool-Name", &tool.name)
                        .header("X-Gateway-Call-Id", &call.call_id)
                        .header("X-Gateway-Response-Id", at.response_id)
                        .json(arguments);
                    if let Some(secret) = &endpoint.secret {
                        request = request.bearer_auth(secret.expose_secret());
                    }
                    crate::telemetry::with_trace_headers(request).send()
                },
                // A refused connection sent nothing, so trying again cannot run the tool twice.
                reqwest::Error::is_connect,
                |_, _, _| {},
            )
            .await;
        match sent {
            Ok(response) => {
                let cap = usize::try_from(endpoint.policy.max_output_bytes()).unwrap_or(usize::MAX);
                read_answer(&tool.name, response, cap).await
            }
            Err(e) => {
                let failure = failure::of_send_error(&e);
                let message = if failure.kind == FailureKind::Timeout {
                    format!("Tool '{}' timed out after {timeout_ms} ms.", tool.name)
                } else {
                    format!("Tool '{}' could not be reached.", tool.name)
                };
                (ToolOutcome::error(message), Some(failure))
            }
        }
    }
}

/// A call counted in `gateway_tool_calls_waiting` while it waits for a slot: counted out when it stops waiting,
/// or when it is dropped waiting (its response cancelled).
struct Waiting(metrics::Gauge);

impl Waiting {
    fn start(gauge: metrics::Gauge) -> Waiting {
        gauge.increment(1.0);
        Waiting(gauge)
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        self.0.decrement(1.0);
    }
}

/// A call that is its source's breaker trial: dropped before it ends (its response cancelled, its lease lost), it
/// gives the trial back undecided, so that the next call after the cool-down is the trial rather than none ever.
struct Trial<'a> {
    policies: &'a policy::Policies,
    source_id: &'a str,
}

impl Trial<'_> {
    /// The call ended with a result, which the breaker records as the trial's.
    fn decided(self) {
        std::mem::forget(self);
    }
}

impl Drop for Trial<'_> {
    fn drop(&mut self) {
        self.policies.abandon_trial(self.source_id);
    }
}

/// What an HTTP call sends, and where.
struct Sent<'a> {
    endpoint: &'a Endpoint,
    arguments: &'a Value,
    /// What is left of the call's timeout.
    timeout: Duration,
    /// The whole timeout, as its error names it.
    timeout_ms: u64,
}

impl ToolExecutor {
    /// The call's arguments as a JSON object, checked against the tool's schema.
    fn parse_arguments(&self, tool: &ServerTool, arguments: &str) -> Result<Value, String> {
        let value: Value = serde_json::from_str(arguments).map_err(|e| {
            format!(
                "The arguments for tool '{}' are not valid JSON: {e}.",
                tool.name
            )
        })?;
        if !value.is_object() {
            return Err(format!(
                "The arguments for tool '{}' must be a JSON object.",
                tool.name
            ));
        }
        let Some(validator) = self.validator(tool) else {
            return Ok(value);
        };
        let problems: Vec<String> = validator
            .iter_errors(&value)
            .map(|e| e.to_string())
            .take(5)
            .collect();
        if !problems.is_empty() {
            return Err(format!(
                "The arguments for tool '{}' do not match its schema: {}.",
                tool.name,
                problems.join("; ")
            ));
        }
        Ok(value)
    }

    /// The compiled schema of a tool, compiled once; `None` when it has none or it does not compile.
    fn validator(&self, tool: &ServerTool) -> Option<Arc<jsonschema::Validator>> {
        if !tool.parameters.is_object() {
            return None;
        }
        let key = tool.parameters.to_string();
        if let Some(validator) = self.validators.get(&key) {
            return Some(validator);
        }
        match jsonschema::validator_for(&tool.parameters) {
            Ok(validator) => {
                let validator = Arc::new(validator);
                self.validators.insert(key, Arc::clone(&validator));
                Some(validator)
            }
            Err(e) => {
                tracing::warn!(tool.name = %tool.name, error = %e, "tool schema does not compile; arguments not checked");
                None
            }
        }
    }
}

/// A tool's HTTP answer as its outcome, and why it failed when it did.
async fn read_answer(
    tool: &str,
    response: reqwest::Response,
    cap: usize,
) -> (ToolOutcome, Option<Failure>) {
    match read_body(tool, response, cap).await {
        // The body broke off: classified as a request that got no answer.
        Err(e) => {
            let failure = failure::of_send_error(&e);
            let message = if failure.kind == FailureKind::Timeout {
                format!("Tool '{tool}' timed out while answering.")
            } else {
                format!("Tool '{tool}' broke off its answer.")
            };
            (ToolOutcome::error(message), Some(failure))
        }
        Ok(
            outcome @ ToolOutcome::Error {
                http_status: Some(status),
                ..
            },
        ) => (
            outcome,
            Some(Failure::new(
                FailureKind::of_status(status),
                format!("HTTP {status}"),
            )),
        ),
        Ok(outcome) => (outcome, None),
    }
}

/// The answer as an outcome (an error for a status other than 2xx), or the error that broke its body off.
async fn read_body(
    tool: &str,
    mut response: reqwest::Response,
    cap: usize,
) -> Result<ToolOutcome, reqwest::Error> {
    let status = response.status();
    if status.is_redirection() {
        let location = response
            .headers()
            .get(reqwest::header::LOCATION)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        let detail: String = location.chars().take(200).collect();
        return Ok(ToolOutcome::Error {
            message: format!(
                "Tool '{tool}' answered HTTP {} (a redirect to '{detail}'); the gateway does not follow redirects.",
                status.as_u16()
            ),
            http_status: Some(status.as_u16()),
        });
    }
    let is_json = response
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("json"));
    // Only the first `cap` bytes are kept; the rest is counted, so the marker can say how large it was.
    let mut kept: Vec<u8> = Vec::new();
    let mut total: usize = 0;
    while let Some(chunk) = response.chunk().await? {
        total = total.saturating_add(chunk.len());
        let room = cap.saturating_sub(kept.len());
        kept.extend_from_slice(&chunk[..chunk.len().min(room)]);
    }
    let text = gateway_core::chat::scrub_nul(String::from_utf8_lossy(&kept).into_owned());
    if !status.is_success() {
        // An error body obeys the cap as an output does (the message, status line included, fits in it), with
        // the same marker giving the body's size: the model reads it, marker and all.
        let head = format!("Tool '{tool}' answered HTTP {}: ", status.as_u16());
        let room = cap.saturating_sub(head.len());
        let detail = if total > room {
            truncated(&text, total, room)
        } else {
            text
        };
        return Ok(ToolOutcome::Error {
            message: head + &detail,
            http_status: Some(status.as_u16()),
        });
    }
    if total > cap {
        return Ok(ToolOutcome::Output {
            text: truncated(&text, total, cap),
        });
    }
    // Compact, valid JSON text; a body that claims JSON but is not passes through as text.
    let text = match is_json.then(|| serde_json::from_str::<Value>(&text)) {
        Some(Ok(value)) => value.to_string(),
        _ => text,
    };
    Ok(ToolOutcome::Output { text })
}

/// An MCP outcome cut to the source's cap, as an HTTP answer is: its output, or its error (`isError`) text.
fn cap_output(outcome: ToolOutcome, cap: u64) -> ToolOutcome {
    let cap = usize::try_from(cap).unwrap_or(usize::MAX);
    match outcome {
        ToolOutcome::Output { text } if text.len() > cap => ToolOutcome::Output {
            text: truncated(&text, text.len(), cap),
        },
        ToolOutcome::Error {
            message,
            http_status,
        } if message.len() > cap => ToolOutcome::Error {
            message: truncated(&message, message.len(), cap),
            http_status,
        },
        other => other,
    }
}

/// The start of an output of `total` bytes, cut so that it and the marker that ends it fit in `cap` bytes. The
/// marker says the output was truncated and how large it was, so the model (and the client, in
/// `mcp_call.output`) knows it reads a part, and a cut JSON text is plainly not meant to parse.
pub fn truncated(text: &str, total: usize, cap: usize) -> String {
    let marker = format!(
        "\n[truncated: the tool's output was {total} bytes; only the first part is shown, cut to fit {cap} bytes]"
    );
    let mut end = cap.saturating_sub(marker.len()).min(text.len());
    while end > 0 && !text.is_char_boundary(end) {
        end -= 1;
    }
    let mut out = String::with_capacity(end + marker.len());
    out.push_str(&text[..end]);
    out.push_str(&marker);
    out
}

#[cfg(test)]
mod tests {
    use super::truncated;

    #[test]
    fn a_truncated_output_fits_its_cap_and_says_so_with_the_original_size() {
        let text = "é".repeat(1000); // 2000 bytes
        for cap in [256, 257, 300, 1024] {
            let out = truncated(&text, 10_000_000, cap);
            assert!(out.len() <= cap, "{cap}: {}", out.len());
            assert!(out.contains("truncated"), "{out}");
            assert!(out.contains("10000000 bytes"), "{out}");
            assert!(out.starts_with('é'), "{out}");
        }
    }
}
