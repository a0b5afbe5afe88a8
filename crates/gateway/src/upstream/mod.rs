//! Upstream model calls (SPEC section 8): one provider-neutral call, an adapter per provider kind behind it, and the
//! retry rule they all share.

mod anthropic;
pub mod count;
mod openai_chat;
mod openai_responses;
mod sse;
mod transport;

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;

use futures::future::BoxFuture;
use gateway_core::chat::{AnswerError, ChatRequest, IdSource};
use gateway_core::context::ModelInput;
use gateway_core::entity::ProviderKind;
use gateway_core::reasoning::replayed_to;
use gateway_core::request::ResponseParams;
use gateway_core::response::FailureCode;
use gateway_core::steps::{ModelDelta, ModelOutput};
use gateway_core::toolset::{custom_as_functions, unwrap_custom_inputs, OfferedTool, ToolInput};
use gateway_core::Item;
use http::header::{HeaderMap, HeaderValue, InvalidHeaderValue, AUTHORIZATION};
use secrecy::{ExposeSecret, SecretString};
use serde_json::Value;
use tokio::sync::mpsc;

use crate::config::UpstreamConfig;
use crate::ids::{item_id, new_id};
use crate::retry::RetryPolicy;
use transport::{Answer, ModelHttp};

pub use transport::BuildError;

/// Why a model call failed for good. Detail is for logs; clients get a generic message.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    #[error("upstream answered HTTP {status} after {attempts} attempt(s): {detail}")]
    Status {
        status: u16,
        attempts: u32,
        detail: String,
    },
    #[error("upstream unreachable after {attempts} attempt(s): {detail}")]
    Transport { attempts: u32, detail: String },
    /// A streamed answer that broke off: the connection dropped, an `{"error": ...}` chunk came, or the
    /// body ended before the answer did.
    #[error("upstream stream broke off after {attempts} attempt(s): {detail}")]
    Broken { attempts: u32, detail: String },
    /// The provider refused the request as the client's problem (a 4xx other than 408/409/429): not retried, not
    /// passed to fallbacks. `message` is the provider's own, secrets stripped and capped, fit for the client.
    #[error("upstream refused the request with HTTP {status}: {message}")]
    Rejected { status: u16, message: String },
    #[error("upstream answer unreadable: {0}")]
    Parse(String),
    /// A failed attempt that was not made again: whoever asked for the call may no longer send it (its replica's
    /// hold on the response lapsed, or its run was told to stop).
    #[error("not sent again after attempt {attempts}: the caller may no longer send it")]
    Withheld { attempts: u32 },
}

impl UpstreamError {
    /// A stream that broke off at attempt `attempts`, for the reason given.
    fn broken_at(attempts: u32) -> impl Fn(String) -> UpstreamError {
        move |detail| UpstreamError::Broken { attempts, detail }
    }

    /// What the response's `error.message` says: no upstream text, which may hold secrets or prompts.
    pub fn public_message(&self) -> String {
        match self {
            UpstreamError::Status {
                status, attempts, ..
            } => {
                format!("The upstream model failed: it answered HTTP {status} (after {attempts} attempt(s)).")
            }
            UpstreamError::Transport { attempts, .. } => {
                format!("The upstream model could not be reached (after {attempts} attempt(s)).")
            }
            UpstreamError::Broken { attempts, .. } => {
                format!("The upstream model's stream broke off (after {attempts} attempt(s)).")
            }
            UpstreamError::Rejected { message, .. } => {
                format!("The upstream model rejected the request: {message}")
            }
            UpstreamError::Parse(_) => "The upstream model's answer could not be read.".into(),
            UpstreamError::Withheld { attempts } => format!(
                "The upstream model call failed and was not made again (after {attempts} attempt(s))."
            ),
        }
    }

    /// Whether another attempt may do better: a 429, a 5xx, no connection, or a stream that broke off. Any other
    /// answer would be the same again.
    fn is_retryable(&self) -> bool {
        match self {
            UpstreamError::Status { status, .. } => {
                matches!(*status, 408 | 409 | 429) || (500..=599).contains(status)
            }
            UpstreamError::Transport { .. } | UpstreamError::Broken { .. } => true,
            UpstreamError::Rejected { .. }
            | UpstreamError::Parse(_)
            | UpstreamError::Withheld { .. } => false,
        }
    }

    /// The `error.code` a response that this failure ends carries.
    pub fn failure_code(&self) -> FailureCode {
        match self {
            UpstreamError::Rejected { .. } => FailureCode::UpstreamRejected,
            _ => FailureCode::ServerError,
        }
    }
}

/// Where a model call goes: what upstream needs of a deployment, borrowed by the engine from the stored one.
#[derive(Debug, Clone, Copy)]
pub struct Target<'a> {
    /// The deployment's name, for logs.
    pub name: &'a str,
    pub kind: ProviderKind,
    /// The provider's base URL; each adapter adds its own path.
    pub base_url: &'a str,
    /// The model the provider is asked for.
    pub model: &'a str,
    pub api_key: Option<&'a SecretString>,
    /// Anthropic's required `max_tokens` when the request sets no `max_output_tokens`.
    pub max_tokens: u32,
}

/// Asked before a failed model call is made again (a retry, a fallback): whether its caller may still send it.
pub trait Resend: Sync {
    fn may_resend(&self) -> futures::future::BoxFuture<'_, bool>;
}

/// What one model call sends, whatever the provider.
#[derive(Clone, Copy)]
pub struct ModelRequest<'a> {
    /// The response the call is for: its output items carry its id in theirs.
    pub response_id: &'a str,
    pub params: &'a ResponseParams,
    /// The conversation with calls under the flat names the model is offered.
    pub conversation: &'a [Item],
    /// Client tools and server tools, as offered to the model.
    pub tools: &'a [OfferedTool],
    /// Asked before each attempt after the first; `None`: every attempt may go.
    pub resend: Option<&'a dyn Resend>,
}

impl std::fmt::Debug for ModelRequest<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelRequest")
            .field("response_id", &self.response_id)
            .field("conversation", &self.conversation.len())
            .field("tools", &self.tools.len())
            .finish_non_exhaustive()
    }
}

/// Whether attempt `attempt` of a call may go: the first always, a later one when `resend` says so.
async fn may_attempt(resend: Option<&dyn Resend>, attempt: u32) -> Result<(), UpstreamError> {
    match resend {
        Some(resend) if attempt > 1 && !resend.may_resend().await => Err(UpstreamError::Withheld {
            attempts: attempt - 1,
        }),
        _ => Ok(()),
    }
}

impl ModelRequest<'_> {
    /// What the provider's translation is given.
    fn input(&self) -> ModelInput<'_> {
        ModelInput {
            params: self.params,
            conversation: self.conversation,
            tools: self.tools,
        }
    }
}

/// Where a streamed call's output goes as it arrives.
#[derive(Debug, Clone, Copy)]
pub struct Live<'a> {
    /// The id of the message item the call's text is shown in; its output's message keeps it.
    pub message_id: &'a str,
    pub deltas: &'a mpsc::Sender<ModelDelta>,
}

/// Calls upstream models; holds one pooled HTTP client for all of them.
#[derive(Debug, Clone)]
pub struct Upstream {
    http: ModelHttp,
    config: UpstreamConfig,
    retry: RetryPolicy,
}

impl Upstream {
    pub fn new(config: UpstreamConfig) -> Result<Upstream, BuildError> {
        // Streams may run long: a stalled read is what fails them, not their total length. Whole (non-streaming)
        // answers get a total timeout per request (`whole_answer_timeout`).
        Ok(Upstream {
            http: ModelHttp::new(&config)?,
            retry: RetryPolicy::new(config.max_retries, config.backoff_ms),
            config,
        })
    }

    /// One model call to `target`'s provider: streamed upstream when `live` is given (deltas forwarded as
    /// they arrive), whole otherwise; retried as SPEC 8 says.
    pub async fn call(
        &self,
        target: &Target<'_>,
        request: &ModelRequest<'_>,
        live: Option<Live<'_>>,
    ) -> Result<ModelOutput, UpstreamError> {
        let provider = target.kind;
        // Thinking and reasoning go only to the provider kind that made them (SPEC 8).
        let foreign_reasoning = request
            .conversation
            .iter()
            .any(|i| !replayed_to(i, provider));
        let kept: Vec<Item>;
        let request = &if foreign_reasoning {
            kept = request
                .conversation
                .iter()
                .filter(|i| replayed_to(i, provider))
                .cloned()
                .collect();
            ModelRequest {
                conversation: &kept,
                ..*request
            }
        } else {
            *request
        };
        if provider.has_custom_tools() || !needs_custom_as_functions(request) {
            return self.call_provider(target, request, live).await;
        }
        // A provider without custom tools sees each as a function of one string; its calls' inputs come back out.
        let mut conversation = request.conversation.to_vec();
        let mut tools = request.tools.to_vec();
        custom_as_functions(&mut conversation, &mut tools);
        let shaped = ModelRequest {
            conversation: &conversation,
            tools: &tools,
            ..*request
        };
        let mut output = self.call_provider(target, &shaped, live).await?;
        unwrap_custom_inputs(request.tools, &mut output.tool_calls);
        Ok(output)
    }

    /// The input tokens `request` would cost at `target`, and who counted them: the provider where it has a
    /// counting endpoint (the call's body sent there, reduced to the fields it takes), this gateway otherwise.
    pub async fn count_input_tokens(
        &self,
        target: &Target<'_>,
        request: &ModelRequest<'_>,
    ) -> Result<(u64, count::CountedBy), UpstreamError> {
        let kept: Vec<Item> = request
            .conversation
            .iter()
            .filter(|i| replayed_to(i, target.kind))
            .cloned()
            .collect();
        let request = ModelRequest {
            conversation: &kept,
            ..*request
        };
        let wire = wire_of(target.kind);
        let body = (wire.build)(target, &request.input()).into_value();
        let (counted_by, endpoint) = count::counting(target.kind, target.model);
        let Some((path, fields)) = endpoint else {
            let count::CountedBy::Local(encoding) = counted_by else {
                return Ok((0, counted_by));
            };
            return Ok((count::count_chat_request(&body, encoding), counted_by));
        };
        let body = count::only(body, fields);
        let url = format!("{}{path}", target.base_url.trim_end_matches('/'));
        let headers = headers_for(wire, target)?;
        let body = encode(&body)?;
        let (url, headers, body) = (url.as_str(), &headers, &body);
        let answer: Value = self
            .retry
            .run(
                |attempt| async move {
                    let bytes = self
                        .within_whole_answer_timeout(attempt, async {
                            let answer = self.send(target, url, headers, body, attempt).await?;
                            answer.bytes().await.map_err(|e| UpstreamError::Transport {
                                attempts: attempt,
                                detail: format!("the count's answer could not be read: {e}"),
                            })
                        })
                        .await?;
                    serde_json::from_slice::<Value>(&bytes).map_err(|e| UpstreamError::Transport {
                        attempts: attempt,
                        detail: format!("the count's answer is not JSON: {e}"),
                    })
                },
                UpstreamError::is_retryable,
                |attempt, failure, wait| {
                    tracing::warn!(attempt, deployment = %target.name, error = %failure, wait_ms = wait.as_millis() as u64, "token count failed; retrying");
                },
            )
            .await?;
        let tokens = answer
            .get("input_tokens")
            .and_then(Value::as_u64)
            .ok_or_else(|| UpstreamError::Transport {
                attempts: 1,
                detail: format!(
                    "the count's answer has no input_tokens: {}",
                    truncate(&answer.to_string())
                ),
            })?;
        Ok((tokens, counted_by))
    }

    async fn call_provider(
        &self,
        target: &Target<'_>,
        request: &ModelRequest<'_>,
        live: Option<Live<'_>>,
    ) -> Result<ModelOutput, UpstreamError> {
        let wire = wire_of(target.kind);
        let body = (wire.build)(target, &request.input());
        let url = format!("{}{}", target.base_url.trim_end_matches('/'), wire.path);
        let headers = headers_for(wire, target)?;
        let call = Call {
            target,
            url: &url,
            headers: &headers,
        };
        self.call_over(&call, wire, body, request, live).await
    }

    /// Runs the attempts of one model call (`attempt` is given each one's number, from 1): a retryable failure is
    /// tried again, bounded, with backoff, but a streamed call only while none of its output reached `out`: once
    /// the client saw text, a new attempt could not take it back.
    async fn with_retries<Fut>(
        &self,
        target: &Target<'_>,
        out: Option<&Forwarder<'_>>,
        attempt: impl FnMut(u32) -> Fut,
    ) -> Result<ModelOutput, UpstreamError>
    where
        Fut: Future<Output = Result<ModelOutput, UpstreamError>>,
    {
        self.retry
            .run(
                attempt,
                |failure| failure.is_retryable() && !out.is_some_and(Forwarder::forwarded),
                |attempt, failure, wait| {
                    tracing::warn!(attempt, deployment = %target.name, error = %failure, wait_ms = wait.as_millis() as u64, "upstream call failed; retrying");
                },
            )
            .await
    }

    /// Sends one attempt of `call` with `body`: a 4xx that is the client's problem is `Rejected` (with the
    /// provider's message, the target's key and anything like a credential stripped), any other answer but 2xx
    /// is `Status` (with the start of its body, for logs), no answer is `Transport`.
    async fn send(
        &self,
        target: &Target<'_>,
        url: &str,
        headers: &HeaderMap,
        body: &Bytes,
        attempt: u32,
    ) -> Result<Answer, UpstreamError> {
        let answer = self
            .http
            .post(url, headers.clone(), body.clone())
            .await
            .map_err(|detail| UpstreamError::Transport {
                attempts: attempt,
                detail,
            })?;
        let status = answer.status();
        if status.is_success() {
            return Ok(answer);
        }
        let detail = answer.text().await;
        if is_rejection(status.as_u16()) {
            let key = target.api_key.as_ref().map(|k| k.expose_secret());
            return Err(UpstreamError::Rejected {
                status: status.as_u16(),
                message: provider_message(&detail, key),
            });
        }
        Err(UpstreamError::Status {
            status: status.as_u16(),
            attempts: attempt,
            detail: truncate(&detail),
        })
    }

    /// One model call over `wire` with its retries, `body` built and encoded once and sent once per attempt:
    /// whole when `live` is `None` (the JSON answer read and parsed), else streamed with its text passed on as it
    /// arrives.
    async fn call_over(
        &self,
        call: &Call<'_>,
        wire: &Wire,
        mut body: Body<'_>,
        request: &ModelRequest<'_>,
        live: Option<Live<'_>>,
    ) -> Result<ModelOutput, UpstreamError> {
        let (response_id, resend) = (request.response_id, request.resend);
        let (parse, read_stream) = (wire.parse, wire.read_stream);
        let Call {
            target,
            url,
            headers,
        } = *call;
        let Some(live) = live else {
            let body = &encode(&body)?;
            return self
                .with_retries(target, None, |attempt| async move {
                    may_attempt(resend, attempt).await?;
                    let answer = self
                        .within_whole_answer_timeout(attempt, async {
                            let answer = self.send(target, url, headers, body, attempt).await?;
                            read_whole(answer, attempt).await
                        })
                        .await?;
                    parse(&answer, &mut ResponseIds { response_id })
                        .map_err(|e| unreadable(e, attempt))
                })
                .await;
        };
        body.set("stream", Value::Bool(true));
        if wire.include_usage {
            body.set("stream_options", serde_json::json!({"include_usage": true}));
        }
        let body = &encode(&body)?;
        let out = &Forwarder::new(live);
        self.with_retries(target, Some(out), |attempt| async move {
            may_attempt(resend, attempt).await?;
            let answer = self.send(target, url, headers, body, attempt).await?;
            let events = Box::pin(sse::upstream_events(answer.parts(), attempt));
            read_stream(events, attempt, out, response_id).await
        })
        .await
    }

    /// `attempt` (sending and reading a whole answer) bounded by the whole-answer timeout; past it, a `Transport`
    /// failure, retried like any other. Not an `async fn`: one would hold `whole` both as its argument and inside
    /// the timeout it is moved into, twice its size in every caller's future.
    fn within_whole_answer_timeout<T>(
        &self,
        attempt: u32,
        whole: impl Future<Output = Result<T, UpstreamError>>,
    ) -> impl Future<Output = Result<T, UpstreamError>> {
        use futures::FutureExt as _;
        let timeout = self.whole_answer_timeout();
        // A combinator, not an `async` block either: one would hold the timeout's future as its capture and again
        // as what it awaits.
        tokio::time::timeout(timeout, whole).map(move |bounded| match bounded {
            Ok(answer) => answer,
            Err(_) => Err(UpstreamError::Transport {
                attempts: attempt,
                detail: format!("no whole answer within {} ms", timeout.as_millis()),
            }),
        })
    }

    /// The whole of a non-streaming answer must arrive within this.
    fn whole_answer_timeout(&self) -> Duration {
        Duration::from_millis(self.config.timeout_ms)
    }
}

/// Where one model call goes and with which headers (the same for each of its attempts).
#[derive(Clone, Copy)]
struct Call<'a> {
    target: &'a Target<'a>,
    url: &'a str,
    headers: &'a HeaderMap,
}

/// Reads a whole (non-streamed) answer. A body that breaks off is `Broken` and so tried again; one that ends before
/// its JSON does is found so when it is read (`unreadable`).
async fn read_whole(answer: Answer, attempt: u32) -> Result<Bytes, UpstreamError> {
    answer
        .bytes()
        .await
        .map_err(|e| UpstreamError::broken_at(attempt)(format!("body error: {e}")))
}

/// Why a whole answer could not be read: one that ends before its JSON does is `Broken` and so tried again; a
/// complete body that is not JSON, or not an answer, is `Parse`.
fn unreadable(failure: AnswerError, attempt: u32) -> UpstreamError {
    match failure {
        AnswerError::Json(e) if e.is_eof() => {
            UpstreamError::broken_at(attempt)(format!("the body ended before its JSON did: {e}"))
        }
        AnswerError::Json(e) => UpstreamError::Parse(e.to_string()),
        AnswerError::Shape(e) => UpstreamError::Parse(e.0),
    }
}

/// The headers of a call to `target` over `wire`: the provider's own (its key, its version) and, with traces on,
/// the model call's span as the provider's parent (SPEC 14). A key that cannot be a header fails the call.
fn headers_for(wire: &Wire, target: &Target<'_>) -> Result<HeaderMap, UpstreamError> {
    let mut headers = HeaderMap::new();
    crate::telemetry::add_trace_headers(&mut headers);
    (wire.headers)(&mut headers, target).map_err(|_| UpstreamError::Transport {
        attempts: 1,
        detail: format!(
            "the key of deployment '{}' cannot be sent in a header",
            target.name
        ),
    })?;
    Ok(headers)
}

/// A request body written out as JSON once for all of a call's attempts.
fn encode(body: &impl serde::Serialize) -> Result<Bytes, UpstreamError> {
    serde_json::to_vec(body)
        .map(Bytes::from)
        .map_err(|e| UpstreamError::Parse(format!("the request could not be written: {e}")))
}

/// The request body of one model call: a JSON value, or a Chat request whose tools are written out from the
/// offered tools as it is serialised (not copied into a JSON tree for every call).
enum Body<'a> {
    Json(Value),
    Chat(ChatRequest<'a>),
}

impl Body<'_> {
    /// Sets a top-level field (a streamed call's `stream`, `stream_options`).
    fn set(&mut self, field: &str, value: Value) {
        match self {
            Body::Json(body) => body[field] = value,
            Body::Chat(request) => {
                request.fields.insert(field.to_owned(), value);
            }
        }
    }

    /// The whole body as a JSON value.
    fn into_value(self) -> Value {
        match self {
            Body::Json(body) => body,
            Body::Chat(request) => request.into_value(),
        }
    }
}

impl serde::Serialize for Body<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Body::Json(body) => body.serialize(serializer),
            Body::Chat(request) => request.serialize(serializer),
        }
    }
}

/// How one provider kind speaks: where and how an attempt is sent, and how its answer, whole or streamed, is read.
struct Wire {
    /// Put after the deployment's base URL.
    path: &'static str,
    /// The request body of one call.
    build: for<'a> fn(&Target<'_>, &ModelInput<'a>) -> Body<'a>,
    /// The provider's own headers on an attempt (its key, its version).
    headers: fn(&mut HeaderMap, &Target<'_>) -> Result<(), InvalidHeaderValue>,
    /// Turns a whole answer, as sent, into the normalised one.
    parse: fn(&[u8], &mut dyn IdSource) -> Result<ModelOutput, AnswerError>,
    /// A streamed request asks for the usage (`stream_options.include_usage`), which Chat sends only when asked.
    include_usage: bool,
    /// Reads a streamed answer's events into the normalised answer, passing text on as it arrives.
    read_stream: ReadStream,
}

/// How `kind` speaks.
fn wire_of(kind: ProviderKind) -> &'static Wire {
    match kind {
        ProviderKind::OpenaiChat => &openai_chat::WIRE,
        ProviderKind::Anthropic => &anthropic::WIRE,
        ProviderKind::OpenaiResponses => &openai_responses::WIRE,
    }
}

/// The `Authorization: Bearer` of a deployment's key, if it has one.
fn bearer(headers: &mut HeaderMap, target: &Target<'_>) -> Result<(), InvalidHeaderValue> {
    if let Some(key) = &target.api_key {
        headers.insert(
            AUTHORIZATION,
            secret_header(&format!("Bearer {}", key.expose_secret()))?,
        );
    }
    Ok(())
}

/// A header value that holds a secret: marked so that it is never shown (in logs, in `Debug`).
fn secret_header(value: &str) -> Result<HeaderValue, InvalidHeaderValue> {
    let mut value = HeaderValue::from_str(value)?;
    value.set_sensitive(true);
    Ok(value)
}

/// A provider's stream reader: its events, the attempt's number, where the text goes and the response's id.
type ReadStream = for<'b> fn(
    sse::Events<'b>,
    u32,
    &'b Forwarder<'b>,
    &'b str,
) -> BoxFuture<'b, Result<ModelOutput, UpstreamError>>;

/// A streamed call's `Live`, and whether any of the call's output was passed on yet.
struct Forwarder<'a> {
    live: Live<'a>,
    forwarded: AtomicBool,
}

impl<'a> Forwarder<'a> {
    fn new(live: Live<'a>) -> Forwarder<'a> {
        Forwarder {
            live,
            forwarded: AtomicBool::new(false),
        }
    }

    /// Passes `delta` on. A closed receiver means the client left; the answer is still read to its end and stored.
    async fn send(&self, delta: ModelDelta) {
        self.forwarded.store(true, Ordering::Relaxed);
        let _ = self.live.deltas.send(delta).await;
    }

    fn forwarded(&self) -> bool {
        self.forwarded.load(Ordering::Relaxed)
    }

    /// Ids for the streamed answer: its message keeps the id its events already used.
    fn ids<'b>(&'b self, response_id: &'b str) -> StreamIds<'b> {
        StreamIds {
            message_id: self.live.message_id,
            response_id,
        }
    }
}

/// Whether the call has custom tools or custom calls that a provider without them must see as functions.
fn needs_custom_as_functions(request: &ModelRequest<'_>) -> bool {
    request
        .tools
        .iter()
        .any(|t| matches!(t.input, ToolInput::Text { .. }))
        || request
            .conversation
            .iter()
            .any(|i| matches!(i, Item::CustomToolCall(_) | Item::CustomToolCallOutput(_)))
}

/// Draws ids for a response's output items, and random ids for calls that came without one.
struct ResponseIds<'a> {
    response_id: &'a str,
}

impl IdSource for ResponseIds<'_> {
    fn item_id(&mut self, prefix: &str) -> String {
        item_id(prefix, self.response_id)
    }

    fn call_id(&mut self, _index: usize) -> String {
        new_id("call")
    }
}

/// Ids for a streamed answer: its message keeps the id its events already used.
struct StreamIds<'a> {
    message_id: &'a str,
    response_id: &'a str,
}

impl IdSource for StreamIds<'_> {
    fn item_id(&mut self, prefix: &str) -> String {
        if prefix == "msg" {
            self.message_id.to_owned()
        } else {
            item_id(prefix, self.response_id)
        }
    }

    fn call_id(&mut self, _index: usize) -> String {
        new_id("call")
    }
}

fn truncate(text: &str) -> String {
    text.chars().take(500).collect()
}

/// The longest provider message passed on to a client, in characters.
const MAX_PROVIDER_MESSAGE: usize = 1000;

/// Whether an upstream status is the client's problem (SPEC 8): a 4xx other than 408 (timeout), 409 (conflict)
/// and 429 (rate limit), which say nothing about the request.
fn is_rejection(status: u16) -> bool {
    (400..=499).contains(&status) && !matches!(status, 408 | 409 | 429)
}

/// The provider's own message from an error body (`{"error": {"message"}}`, as OpenAI and Anthropic send it, or
/// `{"message"}`, or the text itself), with `api_key` and anything that looks like a credential replaced, capped
/// at `MAX_PROVIDER_MESSAGE` characters.
fn provider_message(body: &str, api_key: Option<&str>) -> String {
    let parsed: Option<Value> = serde_json::from_str(body).ok();
    let message = parsed
        .as_ref()
        .and_then(|v| {
            let error = v.get("error").unwrap_or(v);
            error
                .get("message")
                .and_then(Value::as_str)
                .or_else(|| error.as_str())
        })
        .map(str::to_owned)
        .unwrap_or_else(|| body.trim().to_owned());
    let message = redact_secrets(&message, api_key);
    let message = if message.is_empty() {
        "(no message)".to_owned()
    } else {
        message
    };
    if message.chars().count() > MAX_PROVIDER_MESSAGE {
        let mut capped: String = message.chars().take(MAX_PROVIDER_MESSAGE).collect();
        capped.push('…');
        capped
    } else {
        message
    }
}

const REDACTED: &str = "[redacted]";

/// `text` with `api_key`, bearer tokens and `sk-`-style keys replaced by `[redacted]`.
fn redact_secrets(text: &str, api_key: Option<&str>) -> String {
    let text = match api_key.filter(|k| k.len() >= 4) {
        Some(key) => text.replace(key, REDACTED),
        None => text.to_owned(),
    };
    let is_token_char =
        |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '~' | '+' | '/' | '=');
    let mut out = String::with_capacity(text.len());
    let mut after_bearer = false;
    let mut rest = text.as_str();
    while !rest.is_empty() {
        let token_len = rest.find(|c: char| !is_token_char(c)).unwrap_or(rest.len());
        // A sentence's full stop is not part of the token before it.
        let token_len = rest[..token_len].trim_end_matches('.').len();
        if token_len == 0 {
            if rest.starts_with('.') {
                out.push('.');
                rest = &rest[1..];
                continue;
            }
            let gap_len = rest.find(is_token_char).unwrap_or(rest.len());
            out.push_str(&rest[..gap_len]);
            rest = &rest[gap_len..];
            continue;
        }
        let token = &rest[..token_len];
        let looks_like_key =
            (token.starts_with("sk-") || token.starts_with("sk_")) && token.len() >= 8;
        if (after_bearer && token.len() >= 8) || looks_like_key {
            out.push_str(REDACTED);
        } else {
            out.push_str(token);
        }
        after_bearer = token.eq_ignore_ascii_case("bearer");
        rest = &rest[token_len..];
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A gate that answers `may` every time, counting the times it was asked.
    struct Gate {
        may: bool,
        asked: std::sync::atomic::AtomicU32,
    }

    impl Resend for Gate {
        fn may_resend(&self) -> futures::future::BoxFuture<'_, bool> {
            self.asked.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Box::pin(std::future::ready(self.may))
        }
    }

    #[tokio::test]
    async fn a_failed_call_is_made_again_only_when_its_gate_says_it_may() {
        for (may, expected_requests) in [(false, 1), (true, 2)] {
            let mock = gateway_testkit::MockModel::start().await.expect("mock");
            mock.push(gateway_testkit::Reply::error(503, "busy"));
            mock.push(gateway_testkit::Reply::text("again"));
            let upstream = Upstream::new(UpstreamConfig {
                backoff_ms: 1,
                ..UpstreamConfig::default()
            })
            .expect("upstream");
            let base_url = mock.base_url();
            let target = Target {
                name: "mock",
                kind: ProviderKind::OpenaiChat,
                base_url: &base_url,
                model: "mock-model",
                api_key: None,
                max_tokens: 1024,
            };
            let gate = Gate {
                may,
                asked: Default::default(),
            };
            let params = ResponseParams::default();
            let request = ModelRequest {
                response_id: "resp_gate",
                params: &params,
                conversation: &[],
                tools: &[],
                resend: Some(&gate),
            };
            let answer = upstream.call(&target, &request, None).await;
            assert_eq!(mock.requests().len(), expected_requests, "may: {may}");
            assert_eq!(gate.asked.load(std::sync::atomic::Ordering::SeqCst), 1);
            if may {
                assert!(answer.is_ok(), "{answer:?}");
            } else {
                assert!(
                    matches!(answer, Err(UpstreamError::Withheld { attempts: 1 })),
                    "{answer:?}"
                );
            }
        }
    }

    #[test]
    fn only_client_problems_are_rejections() {
        let rejected: Vec<u16> = [400, 401, 403, 404, 408, 409, 413, 422, 429, 499, 500, 529]
            .into_iter()
            .filter(|s| is_rejection(*s))
            .collect();
        assert_eq!(rejected, [400, 401, 403, 404, 413, 422, 499]);
    }

    #[test]
    fn provider_messages_are_read_from_each_shape_with_secrets_stripped_and_capped() {
        let cases = [
            (
                r#"{"error": {"message": "prompt is too long", "type": "invalid_request_error"}}"#,
                "prompt is too long",
            ),
            (
                r#"{"type": "error", "error": {"type": "invalid_request_error", "message": "max_tokens: too big"}}"#,
                "max_tokens: too big",
            ),
            (r#"{"message": "bad schema"}"#, "bad schema"),
            ("  plain text  ", "plain text"),
            ("", "(no message)"),
            (
                r#"{"error": {"message": "Incorrect API key provided: sk-proj-abcdef123456. Use Bearer abcdefghijklmnop"}}"#,
                "Incorrect API key provided: [redacted]. Use Bearer [redacted]",
            ),
            (
                r#"{"error": {"message": "key the-deployment-key was refused"}}"#,
                "key [redacted] was refused",
            ),
        ];
        for (body, expected) in cases {
            assert_eq!(
                provider_message(body, Some("the-deployment-key")),
                expected,
                "{body}"
            );
        }
        let long = provider_message(&"x".repeat(5000), None);
        assert_eq!(long.chars().count(), MAX_PROVIDER_MESSAGE + 1);
        assert!(long.ends_with('…'));
    }
}
