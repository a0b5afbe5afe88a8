//! Example tool server: deterministic tools standing in for users' tool endpoints.
//!
//! Every tool is `POST /tools/{name}` with the arguments object as JSON body. Every call is
//! recorded (also failing ones) before it is answered, and the server tracks how many requests
//! are in flight at once. See [`tool_definitions`] for the tools and their JSON schemas.
//!
//! Control surface (for out-of-process tests): `GET /_tools/calls` answers a JSON array of
//! `{"tool", "headers", "body"}` (headers as an object of lower-case names; repeated headers
//! joined by `", "`), `POST /_tools/reset` forgets the recorded calls, and `POST /_tools/gate/open`
//! and `/close` open and close the gate that `gate` calls wait for.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};
use tokio::sync::oneshot;

use crate::kept::{Kept, DEFAULT_KEPT};
use crate::server::{self, header_pairs, lock, ServerGuard};

/// How long a `gate` call waits for the gate to open before answering 504.
const GATE_TIMEOUT: Duration = Duration::from_secs(60);

/// How long a `barrier` call waits for its peers before answering 504.
const BARRIER_TIMEOUT: Duration = Duration::from_secs(10);

/// One request received by the tool server.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordedCall {
    /// The tool name from the path (`/tools/{tool}`).
    pub tool: String,
    /// The request headers as `(lower-case name, value)`, in order.
    pub headers: Vec<(String, String)>,
    /// The JSON body, or `Null` if the body was not JSON.
    pub body: Value,
}

impl RecordedCall {
    /// `{"tool", "headers", "body"}`, with the headers as an object (repeated ones joined by `", "`).
    pub fn to_json(&self) -> Value {
        let mut headers = serde_json::Map::new();
        for (name, value) in &self.headers {
            match headers.get_mut(name) {
                Some(Value::String(joined)) => {
                    joined.push_str(", ");
                    joined.push_str(value);
                }
                _ => {
                    headers.insert(name.clone(), Value::String(value.clone()));
                }
            }
        }
        json!({"tool": self.tool, "headers": headers, "body": self.body})
    }

    /// The first value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// A tool of the example server: its name, description and JSON schema of its arguments.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolDefinition {
    /// Tool name, also the last path segment of its URL.
    pub name: &'static str,
    /// What the tool does.
    pub description: &'static str,
    /// JSON schema of the arguments object.
    pub parameters: Value,
}

/// Every tool the example server offers, with the JSON schema of its arguments.
pub fn tool_definitions() -> Vec<ToolDefinition> {
    vec![
        ToolDefinition {
            name: "get_weather",
            description: "Get the weather forecast for a city.",
            parameters: json!({
                "type": "object",
                "properties": {"city": {"type": "string", "description": "City name"}},
                "required": ["city"],
                "additionalProperties": false,
            }),
        },
        ToolDefinition {
            name: "add",
            description: "Add two numbers.",
            parameters: json!({
                "type": "object",
                "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
                "required": ["a", "b"],
                "additionalProperties": false,
            }),
        },
        ToolDefinition {
            name: "echo",
            description: "Return the arguments object unchanged, under \"echo\".",
            parameters: json!({"type": "object", "additionalProperties": true}),
        },
        ToolDefinition {
            name: "plain_text",
            description: "Answer with a text/plain body instead of JSON.",
            parameters: json!({"type": "object", "properties": {}, "additionalProperties": false}),
        },
        ToolDefinition {
            name: "fail",
            description: "Always fail with HTTP 500.",
            parameters: json!({"type": "object", "properties": {}, "additionalProperties": false}),
        },
        ToolDefinition {
            name: "slow",
            description: "Wait the given number of milliseconds, then answer.",
            parameters: json!({
                "type": "object",
                "properties": {"ms": {"type": "integer", "minimum": 0}},
                "required": ["ms"],
                "additionalProperties": false,
            }),
        },
        ToolDefinition {
            name: "gate",
            description: "Wait until the gate is opened (by the test, or `POST /_tools/gate/open`), then answer.",
            parameters: json!({"type": "object", "properties": {}, "additionalProperties": false}),
        },
        ToolDefinition {
            name: "barrier",
            description: "Wait until n barrier calls are in flight at the same time, then answer all of them.",
            parameters: json!({
                "type": "object",
                "properties": {"n": {"type": "integer", "minimum": 1}},
                "required": ["n"],
                "additionalProperties": false,
            }),
        },
    ]
}

/// Tools that misbehave on purpose, to test the gateway's tool policy (SPEC 7); served like the others but not
/// part of [`tool_definitions`] (the demo does not offer them).
pub fn misbehaving_tool_definitions() -> Vec<ToolDefinition> {
    let no_arguments = json!({"type": "object", "properties": {}, "additionalProperties": false});
    vec![
        ToolDefinition {
            name: "redirect_loop",
            description: "Answer 302 with a Location pointing back at itself.",
            parameters: no_arguments.clone(),
        },
        ToolDefinition {
            name: "redirect_away",
            description: "Answer 307 with a Location pointing at the echo tool.",
            parameters: no_arguments,
        },
        ToolDefinition {
            name: "huge",
            description: "Answer a JSON object holding a string of the given number of bytes, with the given HTTP status (default 200).",
            parameters: json!({
                "type": "object",
                "properties": {"bytes": {"type": "integer", "minimum": 0},
                               "status": {"type": "integer", "minimum": 200, "maximum": 599}},
                "required": ["bytes"],
                "additionalProperties": false,
            }),
        },
    ]
}

#[derive(Debug, Default)]
struct Barrier {
    /// `barrier` calls currently in flight (released or not).
    in_flight: usize,
    /// Calls not released yet: (id, n, release signal).
    waiting: Vec<(u64, usize, oneshot::Sender<()>)>,
}

#[derive(Debug)]
struct Shared {
    /// The calls received (the latest ones).
    calls: Mutex<Kept<RecordedCall>>,
    /// Woken by every recorded call.
    called: tokio::sync::Notify,
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
    barrier: Mutex<Barrier>,
    next_barrier_id: AtomicU64,
    /// Whether `gate` calls answer (`true`) or wait.
    gate: tokio::sync::watch::Sender<bool>,
}

impl Default for Shared {
    fn default() -> Shared {
        Shared {
            calls: Mutex::default(),
            called: tokio::sync::Notify::new(),
            in_flight: AtomicUsize::default(),
            max_in_flight: AtomicUsize::default(),
            barrier: Mutex::default(),
            next_barrier_id: AtomicU64::default(),
            gate: tokio::sync::watch::channel(false).0,
        }
    }
}

impl Shared {
    fn reset(&self) {
        lock(&self.calls).clear();
        self.max_in_flight
            .store(self.in_flight.load(Ordering::SeqCst), Ordering::SeqCst);
    }
}

/// Counts a request as in flight until dropped (also when the client goes away mid-request).
struct InFlight(Arc<Shared>);

impl InFlight {
    fn enter(shared: &Arc<Shared>) -> InFlight {
        let now = shared.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        shared.max_in_flight.fetch_max(now, Ordering::SeqCst);
        InFlight(Arc::clone(shared))
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Membership of one `barrier` call; leaves the barrier when dropped.
struct BarrierSeat {
    shared: Arc<Shared>,
    id: u64,
}

impl Drop for BarrierSeat {
    fn drop(&mut self) {
        let mut barrier = lock(&self.shared.barrier);
        barrier.in_flight = barrier.in_flight.saturating_sub(1);
        barrier.waiting.retain(|(id, _, _)| *id != self.id);
    }
}

/// Handle to a running example tool server. Clones share the same server and records.
///
/// The server stops when the last handle is dropped.
#[derive(Debug, Clone)]
pub struct ToolServer {
    shared: Arc<Shared>,
    guard: ServerGuard,
}

impl ToolServer {
    /// Starts a server on `127.0.0.1` with a free port.
    pub async fn start() -> anyhow::Result<ToolServer> {
        ToolServer::start_on(SocketAddr::from(([127, 0, 0, 1], 0))).await
    }

    /// Starts a server on `addr`, keeping the latest [`DEFAULT_KEPT`] calls it receives.
    pub async fn start_on(addr: SocketAddr) -> anyhow::Result<ToolServer> {
        ToolServer::start_keeping(addr, DEFAULT_KEPT).await
    }

    /// Starts a server on `addr` that keeps the latest `kept` calls it receives (none with 0: the demo, which
    /// nobody inspects).
    pub async fn start_keeping(addr: SocketAddr, kept: usize) -> anyhow::Result<ToolServer> {
        let shared = Arc::new(Shared {
            calls: Mutex::new(Kept::new(kept)),
            ..Shared::default()
        });
        let router = Router::new()
            .route("/tools/{tool}", post(call_tool))
            .route("/health", get(health))
            .route("/_tools/calls", get(recorded_calls))
            .route("/_tools/reset", post(reset))
            .route("/_tools/gate/open", post(open_gate))
            .route("/_tools/gate/close", post(close_gate))
            .fallback(not_found)
            .with_state(Arc::clone(&shared));
        let guard = server::spawn("example-tools", addr, router).await?;
        Ok(ToolServer { shared, guard })
    }

    /// The address the server listens on.
    pub fn addr(&self) -> SocketAddr {
        self.guard.addr()
    }

    /// `http://HOST:PORT/tools/{tool}`.
    pub fn url(&self, tool: &str) -> String {
        format!("http://{}/tools/{tool}", self.addr())
    }

    /// Every call received, in arrival order: the latest [`DEFAULT_KEPT`] (or as many as the server keeps).
    pub fn calls(&self) -> Vec<RecordedCall> {
        lock(&self.shared.calls).iter().cloned().collect()
    }

    /// Waits until at least `n` calls of `tool` have been received (recorded before they are answered), and
    /// returns them; `None` after `timeout`.
    pub async fn wait_for_calls(
        &self,
        tool: &str,
        n: usize,
        timeout: Duration,
    ) -> Option<Vec<RecordedCall>> {
        let waiting = async {
            loop {
                let called = self.shared.called.notified();
                let calls: Vec<RecordedCall> = self
                    .calls()
                    .into_iter()
                    .filter(|c| c.tool == tool)
                    .collect();
                if calls.len() >= n {
                    return calls;
                }
                called.await;
            }
        };
        tokio::time::timeout(timeout, waiting).await.ok()
    }

    /// Lets every `gate` call answer, those waiting and those to come.
    pub fn open_gate(&self) {
        self.shared.gate.send_replace(true);
    }

    /// Makes `gate` calls wait again.
    pub fn close_gate(&self) {
        self.shared.gate.send_replace(false);
    }

    /// Forgets the recorded calls and restarts [`ToolServer::max_in_flight`] from the requests
    /// in flight now.
    pub fn reset(&self) {
        self.shared.reset();
    }

    /// The highest number of requests (all tools) that were handled at the same time.
    pub fn max_in_flight(&self) -> usize {
        self.shared.max_in_flight.load(Ordering::SeqCst)
    }
}

fn error(status: StatusCode, message: &str) -> Response {
    (status, Json(json!({"error": message}))).into_response()
}

fn bad_request(message: &str) -> Response {
    error(StatusCode::BAD_REQUEST, message)
}

async fn call_tool(
    State(shared): State<Arc<Shared>>,
    Path(tool): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let _in_flight = InFlight::enter(&shared);
    let args = serde_json::from_slice::<Value>(&body).unwrap_or(Value::Null);
    lock(&shared.calls).push(RecordedCall {
        tool: tool.clone(),
        headers: header_pairs(&headers),
        body: args.clone(),
    });
    shared.called.notify_waiters();
    tracing::debug!(tool = %tool, args = %args, "tool call");

    match tool.as_str() {
        "get_weather" => match args.get("city").and_then(Value::as_str) {
            Some(city) => {
                let len = i64::try_from(city.chars().count()).unwrap_or(0);
                let temperature = 15 + len % 15;
                Json(json!({"city": city, "forecast": "sunny", "temperature_c": temperature}))
                    .into_response()
            }
            None => bad_request("missing string argument \"city\""),
        },
        "add" => add(&args),
        "echo" => Json(json!({"echo": args})).into_response(),
        "plain_text" => (
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            "plain text answer",
        )
            .into_response(),
        "fail" => error(StatusCode::INTERNAL_SERVER_ERROR, "tool exploded"),
        "slow" => match args.get("ms").and_then(Value::as_u64) {
            Some(ms) => {
                tokio::time::sleep(Duration::from_millis(ms)).await;
                Json(json!({"slept_ms": ms})).into_response()
            }
            None => bad_request("missing non-negative integer argument \"ms\""),
        },
        "gate" => {
            let mut gate = shared.gate.subscribe();
            let opened = tokio::time::timeout(GATE_TIMEOUT, async move {
                gate.wait_for(|open| *open).await.is_ok()
            })
            .await;
            match opened {
                Ok(true) => Json(json!({"gate": "open"})).into_response(),
                _ => error(
                    StatusCode::GATEWAY_TIMEOUT,
                    "the gate was not opened in time",
                ),
            }
        }
        "barrier" => match args.get("n").and_then(Value::as_u64) {
            Some(n) => barrier(&shared, n).await,
            None => bad_request("missing non-negative integer argument \"n\""),
        },
        "redirect_loop" => (
            StatusCode::FOUND,
            [(header::LOCATION, "/tools/redirect_loop")],
        )
            .into_response(),
        "redirect_away" => (
            StatusCode::TEMPORARY_REDIRECT,
            [(header::LOCATION, "/tools/echo")],
        )
            .into_response(),
        "huge" => match args.get("bytes").and_then(Value::as_u64) {
            Some(bytes) => {
                let blob = "x".repeat(usize::try_from(bytes).unwrap_or(0));
                let status = args
                    .get("status")
                    .and_then(Value::as_u64)
                    .and_then(|s| u16::try_from(s).ok())
                    .and_then(|s| StatusCode::from_u16(s).ok())
                    .unwrap_or(StatusCode::OK);
                (status, Json(json!({"blob": blob}))).into_response()
            }
            None => bad_request("missing non-negative integer argument \"bytes\""),
        },
        _ => error(StatusCode::NOT_FOUND, "unknown tool"),
    }
}

fn add(args: &Value) -> Response {
    let (Some(a), Some(b)) = (args.get("a"), args.get("b")) else {
        return bad_request("missing number arguments \"a\" and \"b\"");
    };
    if let (Some(x), Some(y)) = (a.as_i64(), b.as_i64()) {
        if let Some(sum) = x.checked_add(y) {
            return Json(json!({"sum": sum})).into_response();
        }
    }
    match (a.as_f64(), b.as_f64()) {
        (Some(x), Some(y)) => Json(json!({"sum": x + y})).into_response(),
        _ => bad_request("arguments \"a\" and \"b\" must be numbers"),
    }
}

/// Waits until `n` barrier calls are in flight together (or times out), without polling.
async fn barrier(shared: &Arc<Shared>, n: u64) -> Response {
    let n_usize = usize::try_from(n).unwrap_or(usize::MAX);
    let id = shared.next_barrier_id.fetch_add(1, Ordering::Relaxed);
    let (tx, rx) = oneshot::channel::<()>();
    let _seat = {
        let mut barrier = lock(&shared.barrier);
        barrier.in_flight += 1;
        barrier.waiting.push((id, n_usize, tx));
        let count = barrier.in_flight;
        // Release every waiter (this one included) whose threshold is now reached.
        let (release, keep): (Vec<_>, Vec<_>) = std::mem::take(&mut barrier.waiting)
            .into_iter()
            .partition(|(_, need, _)| *need <= count);
        barrier.waiting = keep;
        for (_, _, tx) in release {
            let _ = tx.send(());
        }
        BarrierSeat {
            shared: Arc::clone(shared),
            id,
        }
    };
    match tokio::time::timeout(BARRIER_TIMEOUT, rx).await {
        Ok(Ok(())) => Json(json!({"released": true, "n": n})).into_response(),
        _ => error(StatusCode::GATEWAY_TIMEOUT, "barrier not reached"),
    }
}

/// `GET /_tools/calls`: every call received, in arrival order.
async fn recorded_calls(State(shared): State<Arc<Shared>>) -> Json<Value> {
    Json(Value::Array(
        lock(&shared.calls)
            .iter()
            .map(RecordedCall::to_json)
            .collect(),
    ))
}

/// `POST /_tools/reset`: forgets the recorded calls.
async fn reset(State(shared): State<Arc<Shared>>) -> Json<Value> {
    shared.reset();
    Json(json!({"calls": 0}))
}

async fn open_gate(State(shared): State<Arc<Shared>>) -> Json<Value> {
    shared.gate.send_replace(true);
    Json(json!({"gate": "open"}))
}

async fn close_gate(State(shared): State<Arc<Shared>>) -> Json<Value> {
    shared.gate.send_replace(false);
    Json(json!({"gate": "closed"}))
}

async fn health() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

async fn not_found() -> Response {
    error(StatusCode::NOT_FOUND, "unknown tool")
}
