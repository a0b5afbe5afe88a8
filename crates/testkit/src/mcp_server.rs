//! Example MCP server (rmcp's server side, streamable HTTP at `/mcp`): tools that succeed, fail, hang and
//! change their list, standing in for the MCP servers teams run.
//!
//! Tools: `add` (`{a, b}` → `{"sum": a + b}` as text; with `{ms}` too, it answers after that many milliseconds,
//! so that a chaos run can kill a replica while the call is in flight), `fail` (a result with `isError`; with `{bytes}`, its text
//! is that many `x`), `hang` (answers only when [`McpServer::release`] is called), once
//! [`McpServer::add_late_tool`] was called `late` (answers `"late"`), and the extra tools that
//! [`McpServer::list_extra_tools`] asks for. Adding the late tool notifies every connected client with
//! `notifications/tools/list_changed`.
//! Every `tools/call` (with its `_meta`) and `tools/list` is counted; the `Authorization` header of each HTTP
//! request is kept.
//!
//! Control surface (for out-of-process tests): `GET /_mcp/calls` answers
//! `{"calls": [{"tool", "arguments", "meta"}], "lists": N}`, and `POST /_mcp/reset` forgets the calls, the list
//! count and the kept `Authorization` headers.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use axum::routing::{get, post};
use axum::{Json, Router};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, InitializeResult,
    ListToolsResult, PaginatedRequestParams, ServerCapabilities, Tool,
};
use rmcp::service::{NotificationContext, Peer, RequestContext};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData, RoleServer, ServerHandler};
use serde_json::{json, Map, Value};

use crate::kept::Kept;
use crate::server::{self, lock, ServerGuard};

#[derive(Debug, Default)]
struct Shared {
    /// The calls received (the latest ones).
    calls: Mutex<Kept<(String, Value)>>,
    /// The `_meta` of each call in `calls` (an empty object when it had none).
    metas: Mutex<Kept<Value>>,
    lists: AtomicUsize,
    initializes: AtomicUsize,
    late: AtomicBool,
    /// Extra tools listed: how many, and how long each one's description is.
    extra: Mutex<(usize, usize)>,
    authorization: Mutex<Kept<String>>,
    peers: Mutex<Vec<Peer<RoleServer>>>,
    release: tokio::sync::Notify,
}

/// The tools' handler; one per MCP session, all sharing the server's state.
#[derive(Debug, Clone)]
struct Handler(Arc<Shared>);

fn schema(value: Value) -> Arc<Map<String, Value>> {
    Arc::new(match value {
        Value::Object(map) => map,
        _ => Map::new(),
    })
}

fn tools(late: bool, (extra, description_bytes): (usize, usize)) -> Vec<Tool> {
    let empty = json!({"type": "object", "properties": {}});
    let mut tools = vec![
        Tool::new(
            "add",
            "Add two numbers.",
            schema(
                json!({"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
                          "required": ["a", "b"]}),
            ),
        ),
        Tool::new("fail", "Always fails (isError).", schema(empty.clone())),
        Tool::new(
            "hang",
            "Answers only when the test releases it.",
            schema(empty.clone()),
        ),
    ];
    if late {
        tools.push(Tool::new("late", "Appears later.", schema(empty.clone())));
    }
    let description = "d".repeat(description_bytes);
    tools.extend((0..extra).map(|i| {
        Tool::new(
            format!("extra_{i}"),
            description.clone(),
            schema(empty.clone()),
        )
    }));
    tools
}

impl ServerHandler for Handler {
    fn get_info(&self) -> InitializeResult {
        InitializeResult::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_tool_list_changed()
                .build(),
        )
    }

    async fn on_initialized(&self, context: NotificationContext<RoleServer>) {
        self.0.initializes.fetch_add(1, Ordering::SeqCst);
        lock(&self.0.peers).push(context.peer);
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        self.0.lists.fetch_add(1, Ordering::SeqCst);
        Ok(ListToolsResult::with_all_items(tools(
            self.0.late.load(Ordering::SeqCst),
            *lock(&self.0.extra),
        )))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let arguments = Value::Object(request.arguments.clone().unwrap_or_default());
        // rmcp hands the request's `_meta` over in the context; the params keep it too on some paths.
        let meta = request
            .meta
            .as_ref()
            .filter(|meta| !meta.is_empty())
            .unwrap_or(&context.meta);
        let meta = serde_json::to_value(meta).unwrap_or_default();
        {
            let mut calls = lock(&self.0.calls);
            let mut metas = lock(&self.0.metas);
            calls.push((request.name.to_string(), arguments.clone()));
            metas.push(meta);
        }
        let result = match request.name.as_ref() {
            "add" => {
                if let Some(ms) = arguments.get("ms").and_then(Value::as_u64) {
                    tokio::time::sleep(std::time::Duration::from_millis(ms.min(60_000))).await;
                }
                let a = arguments.get("a").and_then(Value::as_f64).unwrap_or(0.0);
                let b = arguments.get("b").and_then(Value::as_f64).unwrap_or(0.0);
                let sum = a + b;
                let sum = if sum.fract() == 0.0 && sum.abs() < 1e15 {
                    json!(sum as i64)
                } else {
                    json!(sum)
                };
                CallToolResult::success(vec![ContentBlock::text(json!({"sum": sum}).to_string())])
            }
            "fail" => match arguments.get("bytes").and_then(Value::as_u64) {
                Some(bytes) => CallToolResult::error(vec![ContentBlock::text(
                    "x".repeat(usize::try_from(bytes).unwrap_or(0)),
                )]),
                None => {
                    CallToolResult::error(vec![ContentBlock::text("the tool failed on purpose")])
                }
            },
            "hang" => {
                self.0.release.notified().await;
                CallToolResult::success(vec![ContentBlock::text("released")])
            }
            "late" if self.0.late.load(Ordering::SeqCst) => {
                CallToolResult::success(vec![ContentBlock::text("late")])
            }
            other => {
                return Err(ErrorData::invalid_params(
                    format!("unknown tool {other}"),
                    None,
                ))
            }
        };
        Ok(CallToolResponse::Complete(result))
    }
}

/// Handle to a running example MCP server; it stops when the last clone is dropped.
#[derive(Debug, Clone)]
pub struct McpServer {
    shared: Arc<Shared>,
    guard: ServerGuard,
    /// Ends every session's streams, so that a stopped server really stops.
    cancel: tokio_util::sync::CancellationToken,
}

impl McpServer {
    /// Starts a server on `127.0.0.1` with a free port.
    pub async fn start() -> anyhow::Result<McpServer> {
        McpServer::start_on(SocketAddr::from(([127, 0, 0, 1], 0))).await
    }

    /// Starts a server on `addr`.
    pub async fn start_on(addr: SocketAddr) -> anyhow::Result<McpServer> {
        let shared = Arc::new(Shared::default());
        let for_service = Arc::clone(&shared);
        let cancel = tokio_util::sync::CancellationToken::new();
        let mut config = StreamableHttpServerConfig::default().disable_allowed_hosts();
        config.cancellation_token = cancel.child_token();
        let service = StreamableHttpService::new(
            move || Ok(Handler(Arc::clone(&for_service))),
            Arc::new(LocalSessionManager::default()),
            config,
        );
        let for_auth = Arc::clone(&shared);
        let router = Router::new()
            .route("/_mcp/calls", get(recorded_calls))
            .route("/_mcp/reset", post(reset))
            .with_state(Arc::clone(&shared))
            .nest_service("/mcp", service)
            .layer(axum::middleware::from_fn(
                move |request: Request, next: Next| {
                    let shared = Arc::clone(&for_auth);
                    async move {
                        if let Some(value) = request
                            .headers()
                            .get(axum::http::header::AUTHORIZATION)
                            .and_then(|v| v.to_str().ok())
                        {
                            lock(&shared.authorization).push(value.to_owned());
                        }
                        let response: Response = next.run(request).await;
                        response
                    }
                },
            ));
        let guard = server::spawn("example-mcp", addr, router).await?;
        Ok(McpServer {
            shared,
            guard,
            cancel,
        })
    }

    /// Stops the server: sessions end, and new connections are refused.
    pub fn stop(self) {
        self.cancel.cancel();
        drop(self.guard);
    }

    /// The address the server listens on.
    pub fn addr(&self) -> SocketAddr {
        self.guard.addr()
    }

    /// `http://HOST:PORT/mcp`.
    pub fn url(&self) -> String {
        format!("http://{}/mcp", self.addr())
    }

    /// Every `tools/call` received: `(tool, arguments)`, in arrival order.
    pub fn calls(&self) -> Vec<(String, Value)> {
        lock(&self.shared.calls).iter().cloned().collect()
    }

    /// The `params._meta` of every `tools/call` received, in the order of [`McpServer::calls`].
    pub fn call_metas(&self) -> Vec<Value> {
        lock(&self.shared.metas).iter().cloned().collect()
    }

    /// How many `tools/list` requests were answered.
    pub fn lists(&self) -> usize {
        self.shared.lists.load(Ordering::SeqCst)
    }

    /// How many sessions were initialized.
    pub fn sessions(&self) -> usize {
        self.shared.initializes.load(Ordering::SeqCst)
    }

    /// The `Authorization` headers received, one per HTTP request that had one.
    pub fn authorizations(&self) -> Vec<String> {
        lock(&self.shared.authorization).iter().cloned().collect()
    }

    /// Lists `count` more tools (`extra_0`, ...), each with a description of `description_bytes` bytes.
    pub fn list_extra_tools(&self, count: usize, description_bytes: usize) {
        *lock(&self.shared.extra) = (count, description_bytes);
    }

    /// Lets every `hang` call waiting now answer.
    pub fn release(&self) {
        self.shared.release.notify_waiters();
    }

    /// Adds the `late` tool and tells every connected client that the list changed.
    pub async fn add_late_tool(&self) {
        self.shared.late.store(true, Ordering::SeqCst);
        let peers = lock(&self.shared.peers).clone();
        for peer in peers {
            if let Err(e) = peer.notify_tool_list_changed().await {
                tracing::debug!(error = %e, "list_changed not delivered");
            }
        }
    }
}

/// `GET /_mcp/calls`: every `tools/call` received, in arrival order, and how many listings were answered.
async fn recorded_calls(State(shared): State<Arc<Shared>>) -> Json<Value> {
    // Both locks at once, in the order a call takes them: a call recorded meanwhile cannot shift one against the
    // other.
    let calls = lock(&shared.calls);
    let metas = lock(&shared.metas);
    let calls: Vec<Value> = calls
        .iter()
        .zip(metas.iter().cloned())
        .map(
            |((tool, arguments), meta)| json!({"tool": tool, "arguments": arguments, "meta": meta}),
        )
        .collect();
    Json(json!({"calls": calls, "lists": shared.lists.load(Ordering::SeqCst)}))
}

/// `POST /_mcp/reset`: forgets the recorded calls, the listing count and the `Authorization` headers.
async fn reset(State(shared): State<Arc<Shared>>) -> Json<Value> {
    lock(&shared.calls).clear();
    lock(&shared.metas).clear();
    lock(&shared.authorization).clear();
    shared.lists.store(0, Ordering::SeqCst);
    Json(json!({"reset": true}))
}
