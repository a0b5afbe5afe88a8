//! MCP tool sources (SPEC 2, 7): the gateway as an MCP client over streamable HTTP (`rmcp`).
//!
//! One session per source and replica, opened on first use and reused (no `initialize` per call); it is opened
//! again after a transport error, or when the source's URL, secret or output cap changed. A source's tool list is cached and
//! listed again after a `notifications/tools/list_changed` from the server or after the TTL. A server that is
//! down keeps offering the tools it last listed (since the process started), and their calls end with error
//! outputs: a server tool never becomes a client's function call, and the client never gets a 5xx.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gateway_core::steps::ToolOutcome;
use rmcp::model::{
    CallToolRequestParams, CallToolResult, ContentBlock, PaginatedRequestParams, RequestMetaObject,
    Tool,
};
use rmcp::service::{NotificationContext, Peer, RunningService, ServiceError};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::{ClientHandler, RoleClient, ServiceExt};
use secrecy::ExposeSecret;
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::failure::{Failure, FailureKind};
use super::remote::redact_url;
use super::server_tool::{Endpoint, McpSource, McpTool, ServerTool, Target};

/// Marks a session's tool list stale when the server says it changed.
#[derive(Debug, Clone, Default)]
struct Watcher {
    stale: Arc<AtomicBool>,
}

impl ClientHandler for Watcher {
    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.stale.store(true, Ordering::SeqCst);
    }
}

/// The most tools a server's listing may hold (every page together); a larger listing is an error.
pub const MAX_LISTED_TOOLS: usize = 1_000;

/// The most bytes a server's listing may hold: the tools of every page together, measured as their JSON. A
/// larger listing is an error.
pub const MAX_LISTING_BYTES: usize = 4 * 1024 * 1024;

/// Why a listing failed.
#[derive(Debug, thiserror::Error)]
enum ListingError {
    #[error(transparent)]
    Service(#[from] ServiceError),
    #[error("it lists more than {MAX_LISTED_TOOLS} tools, the gateway's limit")]
    TooMany,
    #[error("its tools take more than {} MiB, the gateway's limit", MAX_LISTING_BYTES / (1024 * 1024))]
    TooLarge,
}

/// Every page of a server's `tools/list`, within [`MAX_LISTED_TOOLS`] and [`MAX_LISTING_BYTES`]: paging stops as
/// soon as a page takes the listing over either limit (or after as many pages as tools are allowed, so a server
/// answering empty pages with a cursor cannot keep it going). rmcp's transport reads each page as one whole
/// JSON-RPC message and offers no byte limit for it, so a single page is read before it is measured: the bound is
/// on what is kept and on how many pages are asked for, and each page's read is bounded in time by the listing's
/// timeout.
async fn list_bounded(peer: &Peer<RoleClient>) -> Result<Vec<Tool>, ListingError> {
    let mut tools: Vec<Tool> = Vec::new();
    let mut bytes = 0usize;
    let mut cursor = None;
    for _ in 0..MAX_LISTED_TOOLS {
        let page = peer
            .list_tools(Some(PaginatedRequestParams::default().with_cursor(cursor)))
            .await?;
        for tool in &page.tools {
            bytes = bytes.saturating_add(serde_json::to_vec(tool).map_or(0, |json| json.len()));
        }
        if tools.len().saturating_add(page.tools.len()) > MAX_LISTED_TOOLS {
            return Err(ListingError::TooMany);
        }
        if bytes > MAX_LISTING_BYTES {
            return Err(ListingError::TooLarge);
        }
        tools.extend(page.tools);
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => return Ok(tools),
        }
    }
    Err(ListingError::TooMany)
}

/// The most bytes of one answer rmcp reads from a server whatever the cap: its own default, 16 MiB.
pub const MIN_ANSWER_BYTES: usize = 16 * 1024 * 1024;

/// The most bytes rmcp reads of one answer (a JSON body or an SSE event) from a source whose outputs are cut to
/// `max_output_bytes`: rmcp refuses a larger answer whole rather than reading a part of it, so the bound leaves
/// room for an output at the cap twice over (a text and its `structuredContent`, or escapes) and the JSON-RPC
/// around it; an output up to the cap is then read and kept, a longer one read and cut to it, as an HTTP tool's
/// is (unless its JSON runs past twice its text: escapes all through, or the text given more than twice over).
/// An answer past the bound is refused: rmcp closes the session it came on, the call fails as one whose
/// session broke, and the next call opens a new session.
pub fn answer_limit(max_output_bytes: u64) -> usize {
    let cap = usize::try_from(max_output_bytes).unwrap_or(usize::MAX);
    cap.saturating_mul(2)
        .saturating_add(1024 * 1024)
        .max(MIN_ANSWER_BYTES)
}

/// One open MCP session of a source, with its cached tool list.
struct Session {
    /// The URL, a digest of the secret and the answer bound it was opened with.
    opened_for: (String, String, usize),
    service: RunningService<RoleClient, Watcher>,
    stale: Arc<AtomicBool>,
    listed: tokio::sync::Mutex<Option<(Instant, Arc<Vec<Tool>>)>>,
}

/// One source's session on this replica: opened by one caller at a time, the others waiting for that one.
#[derive(Default)]
struct SessionSlot {
    session: Option<Arc<Session>>,
    /// When the last open failed, and how: callers that waited for that open fail with it, rather than each
    /// opening again in turn, one timeout after another.
    failed: Option<(Instant, String)>,
}

/// The MCP sessions of this replica, by source id: each source's behind a lock of its own, so that a server
/// that does not answer holds up only its own callers.
pub struct McpClients {
    sessions: std::sync::Mutex<HashMap<String, Arc<tokio::sync::Mutex<SessionSlot>>>>,
    /// The last tools each source listed successfully since the process started, by source id: kept while its
    /// server is down, so that its tools stay server tools (their calls end with error outputs) and are never
    /// handed to the client as its own functions.
    last_known: std::sync::Mutex<HashMap<String, Arc<Vec<Tool>>>>,
    /// How long a tool list is used before it is listed again.
    ttl: Duration,
    /// How long opening a session or listing may take.
    timeout: Duration,
}

impl std::fmt::Debug for McpClients {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpClients")
            .field("ttl", &self.ttl)
            .finish_non_exhaustive()
    }
}

fn opened_for(source: &Endpoint) -> (String, String, usize) {
    let secret = source
        .secret
        .as_ref()
        .map(|s| hex::encode(Sha256::digest(s.expose_secret().as_bytes())))
        .unwrap_or_default();
    (
        source.url.clone(),
        secret,
        answer_limit(source.policy.max_output_bytes()),
    )
}

impl McpClients {
    pub fn new(ttl: Duration, timeout: Duration) -> McpClients {
        McpClients {
            sessions: std::sync::Mutex::default(),
            last_known: std::sync::Mutex::default(),
            ttl,
            timeout,
        }
    }

    /// The source's open session, opened if there is none (or it closed, or the source changed); a failure
    /// names the server by `named` (the source, or the tool being called).
    async fn session(&self, source: &Endpoint, named: &str) -> Result<Arc<Session>, String> {
        let asked = Instant::now();
        let slot = self.slot(&source.source_id);
        let mut slot = slot.lock().await;
        let wanted = opened_for(source);
        if let Some(session) = &slot.session {
            if session.opened_for == wanted && !session.service.is_closed() {
                return Ok(Arc::clone(session));
            }
        }
        if let Some((at, message)) = &slot.failed {
            if *at >= asked {
                return Err(message.clone());
            }
        }
        let opened = self.open(source, named, wanted).await;
        match &opened {
            Ok(session) => {
                slot.session = Some(Arc::clone(session));
                slot.failed = None;
            }
            Err(message) => slot.failed = Some((Instant::now(), message.clone())),
        }
        opened
    }

    /// The slot of the source `source_id`, made on its first use.
    fn slot(&self, source_id: &str) -> Arc<tokio::sync::Mutex<SessionSlot>> {
        let mut sessions = self
            .sessions
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        Arc::clone(sessions.entry(source_id.to_owned()).or_default())
    }

    /// Opens a session with the source's server, within the connect timeout.
    async fn open(
        &self,
        source: &Endpoint,
        named: &str,
        wanted: (String, String, usize),
    ) -> Result<Arc<Session>, String> {
        let mut config = StreamableHttpClientTransportConfig::with_uri(source.url.clone());
        if let Some(secret) = &source.secret {
            config = config.auth_header(secret.expose_secret().to_owned());
        }
        config.max_json_response_size = wanted.2;
        config.max_sse_event_size = wanted.2;
        let transport = StreamableHttpClientTransport::from_config(config);
        let watcher = Watcher::default();
        let stale = Arc::clone(&watcher.stale);
        let service = match tokio::time::timeout(self.timeout, watcher.serve(transport)).await {
            Ok(Ok(service)) => service,
            Ok(Err(e)) => {
                tracing::warn!(tool_source.name = %named, error = %redact_url(&e.to_string(), &source.url),
                    "MCP session could not be opened");
                return Err(format!("The MCP server of '{named}' could not be reached."));
            }
            Err(_) => {
                return Err(format!(
                    "The MCP server of '{named}' did not answer in time."
                ))
            }
        };
        Ok(Arc::new(Session {
            opened_for: wanted,
            service,
            stale,
            listed: tokio::sync::Mutex::default(),
        }))
    }

    /// Forgets a source's session after a transport error, so that the next use opens a new one.
    async fn forget(&self, source: &Endpoint) {
        self.slot(&source.source_id).lock().await.session = None;
    }

    /// The tools of an MCP source as the server lists them (cached); when it cannot list them now, the last
    /// tools it listed since the process started, if any.
    async fn list(&self, source: &Endpoint) -> Result<Arc<Vec<Tool>>, String> {
        match self.list_now(source).await {
            Ok(tools) => {
                self.last_known
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .insert(source.source_id.clone(), Arc::clone(&tools));
                Ok(tools)
            }
            Err(message) => {
                let kept = self
                    .last_known
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .get(&source.source_id)
                    .cloned();
                match kept {
                    Some(tools) => {
                        tracing::warn!(tool_source.name = %source.source_name, reason = %message,
                            "MCP source cannot list its tools; its last known tools are kept");
                        Ok(tools)
                    }
                    None => Err(message),
                }
            }
        }
    }

    /// The tools of an MCP source as the server lists them (cached in its session).
    async fn list_now(&self, source: &Endpoint) -> Result<Arc<Vec<Tool>>, String> {
        let named = source.source_name.as_str();
        let session = self.session(source, named).await?;
        let mut listed = session.listed.lock().await;
        let changed = session.stale.swap(false, Ordering::SeqCst);
        if let Some((at, tools)) = listed.as_ref() {
            if !changed && at.elapsed() < self.ttl {
                return Ok(Arc::clone(tools));
            }
        }
        match tokio::time::timeout(self.timeout, list_bounded(&session.service)).await {
            Ok(Ok(tools)) => {
                let tools = Arc::new(tools);
                *listed = Some((Instant::now(), Arc::clone(&tools)));
                Ok(tools)
            }
            Ok(Err(e @ (ListingError::TooMany | ListingError::TooLarge))) => {
                // The server answered: the session is sound, the listing is refused.
                tracing::warn!(tool_source.name = %named, reason = %e, "MCP tools/list refused");
                Err(format!(
                    "The MCP server of '{named}' did not list its tools: {e}."
                ))
            }
            failed => {
                if let Ok(Err(e)) = &failed {
                    tracing::warn!(tool_source.name = %named, error = %redact_url(&e.to_string(), &source.url),
                        "MCP tools/list failed");
                }
                drop(listed);
                self.forget(source).await;
                Err(format!(
                    "The MCP server of '{named}' did not list its tools."
                ))
            }
        }
    }

    /// The server tools of an MCP source: one per tool its server lists (those in `allowed_tools`, named with
    /// `name_prefix`; a name no provider accepts is skipped with a warning). A server that cannot list offers the
    /// tools it last listed (their calls fail while it is down), or nothing if it never listed since the process
    /// started.
    pub async fn tools_of(&self, source: &McpSource) -> Vec<ServerTool> {
        let server = &source.server;
        let listed = match self.list(server).await {
            Ok(listed) => listed,
            Err(message) => {
                tracing::warn!(tool_source.name = %server.source_name, reason = %message, "MCP source offers no tools now");
                return Vec::new();
            }
        };
        let mut tools = Vec::new();
        for tool in listed.iter() {
            let original = tool.name.to_string();
            if let Some(allowed) = &source.allowed_tools {
                if !allowed.contains(&original) {
                    continue;
                }
            }
            let name = format!(
                "{}{original}",
                source.name_prefix.as_deref().unwrap_or_default()
            );
            if !gateway_core::request::is_valid_tool_name(&name) {
                tracing::warn!(tool_source.name = %server.source_name, tool.name = %name, "MCP tool name is not usable; skipped");
                continue;
            }
            tools.push(ServerTool {
                name,
                description: tool.description.as_deref().unwrap_or_default().to_owned(),
                parameters: Value::Object((*tool.input_schema).clone()),
                strict: source.strict,
                notes: source.notes.clone(),
                // An MCP server's tools are many: a hosted binding names one HTTP tool.
                hosted: None,
                target: Target::Mcp(McpTool {
                    server: server.clone(),
                    tool: original,
                }),
            });
        }
        tools
    }

    /// Calls `target`, offered as `offered`, with `arguments`; every failure is an error outcome.
    pub async fn call(
        &self,
        offered: &str,
        target: &McpTool,
        arguments: &Value,
        timeout: Duration,
        idempotency_key: &str,
    ) -> (ToolOutcome, Option<Failure>) {
        let (source, tool) = (&target.server, target.tool.as_str());
        let label = &source.source_name;
        let session = match self.session(source, offered).await {
            Ok(session) => session,
            Err(message) => {
                let failure = Failure::new(FailureKind::Unreachable, message.clone());
                return (ToolOutcome::error(message), Some(failure));
            }
        };
        let request = call_request(tool, arguments, idempotency_key);
        match tokio::time::timeout(timeout, session.service.call_tool(request)).await {
            Ok(Ok(result)) => outcome_with_failure(&result),
            Ok(Err(e)) => {
                let cause = redact_url(&e.to_string(), &source.url);
                self.forget(source).await;
                let message =
                    format!("Tool '{offered}' (MCP server '{label}') could not be called.");
                (
                    ToolOutcome::error(message),
                    Some(Failure::new(FailureKind::Unreachable, cause)),
                )
            }
            Err(_) => timed_out(format!(
                "Tool '{offered}' timed out after {} ms.",
                timeout.as_millis()
            )),
        }
    }
}

/// How to reach a remote MCP server that a request names (SPEC 12): the address the allow-list check passed
/// (connections go there and nowhere else) and the request's credentials. Never stored, logged or shown.
pub struct RemoteAccess {
    pub server_label: String,
    pub server: super::remote::CheckedServer,
    pub headers: std::collections::BTreeMap<String, String>,
    pub authorization: Option<String>,
}

impl std::fmt::Debug for RemoteAccess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteAccess")
            .field("server_label", &self.server_label)
            .field("host", &self.server.host())
            .finish_non_exhaustive()
    }
}

impl McpClients {
    /// A session with a remote server, for one operation: a request's server is not the operator's, so nothing
    /// of it outlives the operation (no session kept per client-chosen URL).
    async fn open_remote(
        &self,
        access: &RemoteAccess,
    ) -> Result<RunningService<RoleClient, ()>, String> {
        let label = &access.server_label;
        let client = access.server.http_client(self.timeout).map_err(|e| {
            tracing::error!(mcp.server_label = %label, error = %e, "no HTTP client for a remote MCP server");
            format!("The MCP server '{label}' could not be reached.")
        })?;
        let mut config =
            StreamableHttpClientTransportConfig::with_uri(access.server.url().as_str());
        if let Some(token) = &access.authorization {
            config = config.auth_header(token.clone());
        }
        let mut headers = HashMap::new();
        for (name, value) in &access.headers {
            let (Ok(name), Ok(value)) = (
                reqwest::header::HeaderName::try_from(name.as_str()),
                reqwest::header::HeaderValue::try_from(value.as_str()),
            ) else {
                return Err(format!(
                    "The MCP server '{label}' was given a header that is not valid HTTP ('{}').",
                    name.escape_debug()
                ));
            };
            headers.insert(name, value);
        }
        config = config.custom_headers(headers);
        // A request's server has the default cap.
        let bound = answer_limit(gateway_core::entity::ToolPolicy::default().max_output_bytes());
        config.max_json_response_size = bound;
        config.max_sse_event_size = bound;
        let transport = StreamableHttpClientTransport::with_client(client, config);
        match tokio::time::timeout(self.timeout, ().serve(transport)).await {
            Ok(Ok(service)) => Ok(service),
            Ok(Err(e)) => {
                tracing::info!(mcp.server_label = %label, error = %access.server.redact(&e.to_string()),
                    "remote MCP session could not be opened");
                Err(format!("The MCP server '{label}' could not be reached."))
            }
            Err(_) => Err(format!("The MCP server '{label}' did not answer in time.")),
        }
    }

    /// The tools a remote server lists now.
    pub async fn list_remote(&self, access: &RemoteAccess) -> Result<Vec<Tool>, String> {
        let service = self.open_remote(access).await?;
        let listed = tokio::time::timeout(self.timeout, list_bounded(&service)).await;
        let _ = service.cancel().await;
        match listed {
            Ok(Ok(tools)) => Ok(tools),
            Ok(Err(e @ (ListingError::TooMany | ListingError::TooLarge))) => Err(format!(
                "The MCP server '{}' did not list its tools: {e}.",
                access.server_label
            )),
            Ok(Err(e)) => {
                tracing::info!(mcp.server_label = %access.server_label,
                    error = %access.server.redact(&e.to_string()), "remote MCP tools/list failed");
                Err(format!(
                    "The MCP server '{}' did not list its tools.",
                    access.server_label
                ))
            }
            Err(_) => Err(format!(
                "The MCP server '{}' did not list its tools in time.",
                access.server_label
            )),
        }
    }

    /// Calls `tool` of a remote server; every failure is an error outcome.
    pub async fn call_remote(
        &self,
        access: &RemoteAccess,
        tool: &str,
        arguments: &Value,
        timeout: Duration,
        idempotency_key: &str,
    ) -> (ToolOutcome, Option<Failure>) {
        let label = &access.server_label;
        let service = match self.open_remote(access).await {
            Ok(service) => service,
            Err(message) => {
                let failure = Failure::new(FailureKind::Unreachable, message.clone());
                return (ToolOutcome::error(message), Some(failure));
            }
        };
        let request = call_request(tool, arguments, idempotency_key);
        let called = tokio::time::timeout(timeout, service.call_tool(request)).await;
        let _ = service.cancel().await;
        match called {
            Ok(Ok(result)) => outcome_with_failure(&result),
            Ok(Err(e)) => {
                let cause = access.server.redact(&e.to_string());
                let message = format!("Tool '{tool}' (MCP server '{label}') could not be called.");
                (
                    ToolOutcome::error(message),
                    Some(Failure::new(FailureKind::Unreachable, cause)),
                )
            }
            Err(_) => timed_out(format!(
                "Tool '{tool}' (MCP server '{label}') timed out after {} ms.",
                timeout.as_millis()
            )),
        }
    }
}

/// The `tools/call` of `tool`, carrying the tool step's idempotency key as `_meta.idempotencyKey` (SPEC 7): the
/// same string an HTTP source gets as `Idempotency-Key`, so a server can tell a re-sent step from a new one; and,
/// with traces on, `_meta.traceparent`.
fn call_request(tool: &str, arguments: &Value, idempotency_key: &str) -> CallToolRequestParams {
    let arguments = match arguments {
        Value::Object(map) => map.clone(),
        _ => serde_json::Map::new(),
    };
    let mut meta = RequestMetaObject::new();
    meta.insert(
        "idempotencyKey".to_owned(),
        Value::String(idempotency_key.to_owned()),
    );
    // With traces on, the server gets the tool call's span as its parent, where MCP carries it (SPEC 14).
    for (name, value) in crate::telemetry::current_trace_headers() {
        meta.insert(name, Value::String(value));
    }
    let mut request = CallToolRequestParams::new(tool.to_owned()).with_arguments(arguments);
    request.meta = Some(meta);
    request
}

/// A remote server's tool as its `mcp_list_tools` item shows it.
pub fn listed_tool_json(tool: &Tool) -> Value {
    gateway_core::remote_mcp::listed_tool(
        &tool.name,
        tool.description.as_deref(),
        Value::Object((*tool.input_schema).clone()),
        tool.annotations
            .as_ref()
            .and_then(|a| serde_json::to_value(a).ok()),
    )
}

/// The outcome of an MCP result: its structured content as JSON, else its text blocks; `isError` an error.
/// A call's result as its outcome, with an `isError` answer counted as the tool's own error.
fn outcome_with_failure(result: &CallToolResult) -> (ToolOutcome, Option<Failure>) {
    let outcome = outcome_of(result);
    let failure = match &outcome {
        ToolOutcome::Error { message, .. } => Some(Failure::new(
            FailureKind::ToolError,
            // Not its text: that is the tool's output, which is never logged.
            format!(
                "the MCP tool answered isError ({} characters)",
                message.chars().count()
            ),
        )),
        ToolOutcome::Output { .. } => None,
    };
    (outcome, failure)
}

/// A call whose timeout passed.
fn timed_out(message: String) -> (ToolOutcome, Option<Failure>) {
    let failure = Failure::new(FailureKind::Timeout, "the call's timeout passed");
    (ToolOutcome::error(message), Some(failure))
}

fn outcome_of(result: &CallToolResult) -> ToolOutcome {
    let text = match &result.structured_content {
        Some(value) if result.is_error != Some(true) => value.to_string(),
        _ => result
            .content
            .iter()
            .map(|block| match block {
                ContentBlock::Text(text) => text.text.clone(),
                other => serde_json::to_string(other).unwrap_or_default(),
            })
            .collect::<Vec<_>>()
            .join("\n"),
    };
    let text = gateway_core::chat::scrub_nul(text);
    if result.is_error == Some(true) {
        ToolOutcome::error(if text.is_empty() {
            "The MCP tool reported an error.".to_owned()
        } else {
            text
        })
    } else {
        ToolOutcome::Output { text }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_mcp_result_becomes_the_output_the_model_reads() {
        let text = CallToolResult::success(vec![ContentBlock::text("a"), ContentBlock::text("b")]);
        assert_eq!(
            outcome_of(&text),
            ToolOutcome::Output {
                text: "a\nb".into()
            }
        );
        let mut structured = CallToolResult::success(vec![ContentBlock::text("ignored")]);
        structured.structured_content = Some(json!({"sum": 5}));
        assert_eq!(
            outcome_of(&structured),
            ToolOutcome::Output {
                text: r#"{"sum":5}"#.into()
            }
        );
        let failed = CallToolResult::error(vec![ContentBlock::text("no such city")]);
        assert_eq!(outcome_of(&failed), ToolOutcome::error("no such city"));
        let silent = CallToolResult::error(Vec::new());
        assert!(outcome_of(&silent).is_error());
    }
}
