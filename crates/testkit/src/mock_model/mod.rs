//! Scripted mock of the OpenAI Chat Completions API (the upstream model provider).
//!
//! Start it with [`MockModel::start`], point the gateway at [`MockModel::base_url`], queue
//! answers with [`MockModel::push`] and inspect what the gateway sent with
//! [`MockModel::requests`] and [`MockModel::request_headers`]. Each request to
//! `POST {base_url}/chat/completions` pops one scripted [`Reply`]; when the script is empty the
//! server answers by rule (see the `rules` section below), so the `mock-model` binary is usable
//! for demos.
//!
//! # Rules (empty script)
//!
//! * last message has role `tool` → text `"Tool results: "` + the contents of the trailing tool
//!   messages joined by `"; "`;
//! * the last user message contains `!call NAME {json args}` directives (arguments optional) and
//!   the request has `tools` → those tool calls;
//! * otherwise → text `"Echo: "` + the last user message's text.
//!
//! # Control surface (for out-of-process tests)
//!
//! * `POST /_mock/script` — a JSON array of [`ReplySpec`]s, appended to the script (FIFO);
//!   answers `{"pending": N}`, or 400 naming the bad spec (then nothing is appended);
//! * `GET /_mock/requests` — a JSON array of every chat completion request body received;
//! * `POST /_mock/reset` — clears the script and the recorded requests.
//!
//! Also served: `GET /v1/models` (lists `mock-model`) and `GET /health`. Other routes get a
//! 404 JSON error.

mod anthropic;
mod reply;
mod responses;
mod rules;
mod spec;

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, MethodRouter};
use axum::{Json, Router};
use futures::StreamExt;
use serde_json::{json, Value};

pub use reply::{Call, Reply, StreamMode};
pub use spec::{CallSpec, ErrorSpec, ReplySpec};

use crate::kept::{Kept, DEFAULT_KEPT};
use crate::server::{self, header_pairs, lock, ServerGuard};
use reply::{error_body, Envelope, Frame};

/// The model id listed by `GET /v1/models` and used when a request names no model.
pub const MODEL_ID: &str = "mock-model";

/// Largest request body accepted (long conversations are large).
const BODY_LIMIT: usize = 64 * 1024 * 1024;

/// Headers as `(lower-case name, value)` pairs.
type Headers = Vec<(String, String)>;

#[derive(Debug, Default)]
struct Shared {
    script: Mutex<VecDeque<Reply>>,
    /// The requests received (the latest ones): body (Null if not JSON) and headers.
    received: Mutex<Kept<(Value, Headers)>>,
    /// The token-counting requests received (Anthropic's `count_tokens`, Responses' `input_tokens`).
    counted: Mutex<Kept<Value>>,
    /// With Anthropic prompt caching counted: the prefixes written to the cache so far (hashes).
    prompt_cache: Mutex<Option<std::collections::HashSet<u64>>>,
    /// Woken by every request received.
    arrived: tokio::sync::Notify,
    next_call: AtomicU64,
    next_completion: AtomicU64,
}

impl Shared {
    fn reset(&self) {
        lock(&self.script).clear();
        lock(&self.received).clear();
        lock(&self.counted).clear();
    }
}

/// Handle to a running mock model server. Clones share the same server and script.
///
/// The server stops when the last handle is dropped, so keep one alive for as long as it is
/// needed (`let _ = MockModel::start()…` would stop it at once).
#[derive(Debug, Clone)]
pub struct MockModel {
    shared: Arc<Shared>,
    guard: ServerGuard,
}

impl MockModel {
    /// Starts a server on `127.0.0.1` with a free port.
    pub async fn start() -> anyhow::Result<MockModel> {
        MockModel::start_on(SocketAddr::from(([127, 0, 0, 1], 0))).await
    }

    /// Starts a server on `addr`, keeping the latest [`DEFAULT_KEPT`] requests it receives.
    pub async fn start_on(addr: SocketAddr) -> anyhow::Result<MockModel> {
        MockModel::start_keeping(addr, DEFAULT_KEPT).await
    }

    /// Starts a server on `addr` that keeps the latest `kept` requests it receives (none with 0: the demo, which
    /// nobody inspects).
    pub async fn start_keeping(addr: SocketAddr, kept: usize) -> anyhow::Result<MockModel> {
        let shared = Arc::new(Shared {
            received: Mutex::new(Kept::new(kept)),
            counted: Mutex::new(Kept::new(kept)),
            ..Shared::default()
        });
        let router = Router::new()
            .route("/v1/chat/completions", answer_in(Api::Chat))
            .route("/v1/messages", answer_in(Api::Anthropic))
            .route("/v1/responses", answer_in(Api::Responses))
            .route("/v1/messages/count_tokens", count_in(Api::Anthropic))
            .route("/v1/responses/input_tokens", count_in(Api::Responses))
            .route("/v1/models", get(models))
            .route("/health", get(health))
            .route("/_mock/script", post(push_script))
            .route("/_mock/requests", get(recorded_requests))
            .route("/_mock/reset", post(reset))
            .fallback(not_found)
            .layer(DefaultBodyLimit::max(BODY_LIMIT))
            .with_state(Arc::clone(&shared));
        let guard = server::spawn("mock-model", addr, router).await?;
        Ok(MockModel { shared, guard })
    }

    /// The address the server listens on.
    pub fn addr(&self) -> SocketAddr {
        self.guard.addr()
    }

    /// `http://HOST:PORT/v1`; the server answers `POST {base_url}/chat/completions`.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr())
    }

    /// `http://HOST:PORT`, the base URL of an `anthropic` deployment (Anthropic's excludes the version): the server
    /// answers `POST {root_url}/v1/messages`.
    pub fn root_url(&self) -> String {
        format!("http://{}", self.addr())
    }

    /// Appends a reply to the script (FIFO); each chat completion request pops one.
    pub fn push(&self, reply: Reply) {
        lock(&self.shared.script).push_back(reply);
    }

    /// How many scripted replies have not been used yet.
    pub fn pending(&self) -> usize {
        lock(&self.shared.script).len()
    }

    /// Every chat completion request body received, in order (`Null` for a body that is not JSON): the latest
    /// [`DEFAULT_KEPT`] (or as many as the server keeps).
    pub fn requests(&self) -> Vec<Value> {
        lock(&self.shared.received)
            .iter()
            .map(|(body, _)| body.clone())
            .collect()
    }

    /// From now on, answers Anthropic requests with usage counted as Anthropic counts a prompt cache: the input
    /// tokens by the mock's count, split into what was read from the cache (the longest block prefix that an
    /// earlier request wrote at a `cache_control` breakpoint), what this request writes (up to its last
    /// breakpoint) and the rest. Without it, usage is what the script says.
    pub fn count_anthropic_prompt_cache(&self) {
        *lock(&self.shared.prompt_cache) = Some(std::collections::HashSet::new());
    }

    /// Every token-counting request body received, in order.
    pub fn count_requests(&self) -> Vec<Value> {
        lock(&self.shared.counted).iter().cloned().collect()
    }

    /// Waits until at least `n` chat completion requests have been received (recorded before they are
    /// answered); `false` after `timeout`.
    pub async fn wait_for_requests(&self, n: usize, timeout: std::time::Duration) -> bool {
        let waiting = async {
            loop {
                let arrived = self.shared.arrived.notified();
                if lock(&self.shared.received).received() >= n {
                    return;
                }
                arrived.await;
            }
        };
        tokio::time::timeout(timeout, waiting).await.is_ok()
    }

    /// Forgets the script and the recorded requests (call ids keep counting, so they stay unique).
    pub fn reset(&self) {
        self.shared.reset();
    }

    /// The headers of every chat completion request, in order, as `(lower-case name, value)`.
    pub fn request_headers(&self) -> Vec<Vec<(String, String)>> {
        lock(&self.shared.received)
            .iter()
            .map(|(_, headers)| headers.clone())
            .collect()
    }
}

fn json_error(status: u16, message: &str) -> Response {
    let code = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (code, Json(error_body(code.as_u16(), message))).into_response()
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// The API shape a request came in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Api {
    Chat,
    Anthropic,
    Responses,
}

/// `POST` of one API shape: Chat Completions, Anthropic's Messages API, or OpenAI's Responses API (as an
/// upstream), each answered in its own shape from the same script.
fn answer_in(api: Api) -> MethodRouter<Arc<Shared>> {
    post(
        move |State(shared): State<Arc<Shared>>, headers: HeaderMap, body: Bytes| async move {
            serve(&shared, headers, body, api).await
        },
    )
}

fn count_in(api: Api) -> MethodRouter<Arc<Shared>> {
    post(
        move |State(shared): State<Arc<Shared>>, body: Bytes| async move {
            let Some(request) = serde_json::from_slice::<Value>(&body)
                .ok()
                .filter(Value::is_object)
            else {
                return api_error(api, 400, "request body must be a JSON object");
            };
            lock(&shared.counted).push(request.clone());
            let tokens = mock_input_tokens(&request, api == Api::Anthropic);
            match api {
                Api::Anthropic => Json(json!({"input_tokens": tokens})).into_response(),
                _ => Json(json!({"object": "response.input_tokens", "input_tokens": tokens}))
                    .into_response(),
            }
        },
    )
}

/// Anthropic's prompt-cache usage of each of `requests` in turn, as [`MockModel::count_anthropic_prompt_cache`]
/// answers them: `(input, cache written, cache read)` per request.
pub fn anthropic_prompt_cache_usage(requests: &[Value]) -> Vec<(u64, u64, u64)> {
    let mut cache = std::collections::HashSet::new();
    requests
        .iter()
        .map(|request| anthropic::cache_usage(request, &mut cache))
        .collect()
}

/// What the mock answers a token count of `request` (an Anthropic Messages body, else a Responses one) with.
pub fn mock_input_tokens(request: &Value, anthropic: bool) -> u64 {
    let chat = if anthropic {
        anthropic::as_chat_request(request)
    } else {
        responses::as_chat_request(request)
    };
    mock_token_count(&chat)
}

/// The mock's own token count of a request in Chat's shape: a quarter of the characters of its messages and tools
/// as JSON, rounded up, plus 3 per message. Deterministic, and changed by every part a model would read.
fn mock_token_count(chat: &Value) -> u64 {
    let messages = chat
        .get("messages")
        .and_then(Value::as_array)
        .map_or(&[][..], Vec::as_slice);
    let tools = chat.get("tools").cloned().unwrap_or(Value::Null);
    let text = serde_json::to_string(&json!([messages, tools])).unwrap_or_default();
    (text.len() as u64).div_ceil(4) + 3 * messages.len() as u64
}

fn api_error(api: Api, status: u16, message: &str) -> Response {
    if api != Api::Anthropic {
        return json_error(status, message);
    }
    let code = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (code, Json(anthropic::error_body(code.as_u16(), message))).into_response()
}

async fn serve(shared: &Shared, headers: HeaderMap, body: Bytes, api: Api) -> Response {
    let parsed = serde_json::from_slice::<Value>(&body).ok();
    lock(&shared.received).push((
        parsed.clone().unwrap_or(Value::Null),
        header_pairs(&headers),
    ));
    shared.arrived.notify_waiters();
    let Some(request) = parsed.filter(Value::is_object) else {
        return json_error(400, "request body must be a JSON object");
    };
    tracing::debug!(request = %request, "chat completion request");

    let scripted = lock(&shared.script).pop_front();
    let reply = scripted.unwrap_or_else(|| match api {
        Api::Chat => rules::rule_reply(&request),
        Api::Anthropic => rules::rule_reply(&anthropic::as_chat_request(&request)),
        Api::Responses => rules::rule_reply(&responses::as_chat_request(&request)),
    });
    if let Some(d) = reply.delay() {
        tokio::time::sleep(d).await;
    }
    let cut = reply.cuts_body();
    let resolved = match reply.resolve(|| {
        format!(
            "call_{}",
            shared.next_call.fetch_add(1, Ordering::Relaxed) + 1
        )
    }) {
        Ok(r) => r,
        Err((status, message)) => return api_error(api, status, &message),
    };
    let serial = shared.next_completion.fetch_add(1, Ordering::Relaxed) + 1;
    let model = request
        .get("model")
        .and_then(Value::as_str)
        .unwrap_or(MODEL_ID)
        .to_owned();
    let streamed = request.get("stream").and_then(Value::as_bool) == Some(true);
    let frames = match (api, streamed) {
        (Api::Chat, _) => None,
        (Api::Anthropic, false) => {
            let id = format!("msg_mock_{serial}");
            let mut answer = anthropic::message_json(&resolved, &id, &model);
            if let Some(cache) = lock(&shared.prompt_cache).as_mut() {
                let (input, written, read) = anthropic::cache_usage(&request, cache);
                answer["usage"]["input_tokens"] = json!(input);
                answer["usage"]["cache_creation_input_tokens"] = json!(written);
                answer["usage"]["cache_read_input_tokens"] = json!(read);
            }
            return Json(answer).into_response();
        }
        (Api::Anthropic, true) => Some(anthropic::stream_frames(
            &resolved,
            &format!("msg_mock_{serial}"),
            &model,
        )),
        (Api::Responses, false) => {
            return Json(responses::response_json(
                &resolved,
                &format!("mock_{serial}"),
                &model,
            ))
            .into_response();
        }
        (Api::Responses, true) => Some(responses::stream_frames(
            &resolved,
            &format!("mock_{serial}"),
            &model,
        )),
    };
    if let Some(frames) = frames {
        return event_stream(frames);
    }
    let envelope = Envelope {
        id: format!("chatcmpl-mock-{serial}"),
        created: unix_now(),
        model,
        include_usage: request
            .pointer("/stream_options/include_usage")
            .and_then(Value::as_bool)
            .unwrap_or(false),
    };

    if request.get("stream").and_then(Value::as_bool) != Some(true) {
        if cut {
            return cut_json(&resolved.completion_json(&envelope));
        }
        return Json(resolved.completion_json(&envelope)).into_response();
    }

    event_stream(resolved.stream_frames(&envelope))
}

/// Sends `frames` as an SSE body.
fn event_stream(frames: Vec<Frame>) -> Response {
    let stream = futures::stream::iter(frames).then(|frame| async move {
        match frame {
            Frame::Data(payload) => Ok(Bytes::from(format!("data: {payload}\n\n"))),
            Frame::Event(name, payload) => {
                Ok(Bytes::from(format!("event: {name}\ndata: {payload}\n\n")))
            }
            Frame::Abort => {
                // Let the server flush what was already sent before the connection is dropped.
                tokio::task::yield_now().await;
                Err(std::io::Error::new(
                    std::io::ErrorKind::ConnectionAborted,
                    "mock model cut the stream",
                ))
            }
            Frame::Stall => std::future::pending().await,
        }
    });
    (
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(stream),
    )
        .into_response()
}

/// A JSON answer that announces its whole length, sends half of it, then drops the connection.
fn cut_json(answer: &Value) -> Response {
    let text = answer.to_string();
    let half = Bytes::from(text.as_bytes()[..text.len() / 2].to_vec());
    let stream = futures::stream::iter([
        Ok(half),
        Err(std::io::Error::new(
            std::io::ErrorKind::ConnectionAborted,
            "mock model cut the answer",
        )),
    ]);
    (
        [
            (header::CONTENT_TYPE, "application/json".to_owned()),
            (header::CONTENT_LENGTH, text.len().to_string()),
        ],
        Body::from_stream(stream),
    )
        .into_response()
}

/// `POST /_mock/script`: appends every reply of a JSON array of [`ReplySpec`]s, or none.
async fn push_script(State(shared): State<Arc<Shared>>, body: Bytes) -> Response {
    match spec::parse_script(&body) {
        Ok(replies) => {
            let mut script = lock(&shared.script);
            script.extend(replies);
            Json(json!({"pending": script.len()})).into_response()
        }
        Err(message) => json_error(400, &message),
    }
}

/// `GET /_mock/requests`: every chat completion request body received, in order.
async fn recorded_requests(State(shared): State<Arc<Shared>>) -> Json<Value> {
    let bodies = lock(&shared.received)
        .iter()
        .map(|(body, _)| body.clone())
        .collect();
    Json(Value::Array(bodies))
}

/// `POST /_mock/reset`: clears the script and the recorded requests.
async fn reset(State(shared): State<Arc<Shared>>) -> Json<Value> {
    shared.reset();
    Json(json!({"pending": 0}))
}

async fn models() -> Json<Value> {
    Json(json!({
        "object": "list",
        "data": [{"id": MODEL_ID, "object": "model", "created": 0, "owned_by": "gateway-testkit"}],
    }))
}

async fn health() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

async fn not_found(uri: Uri) -> Response {
    json_error(404, &format!("unknown route: {}", uri.path()))
}
