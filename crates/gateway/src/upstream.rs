//! Upstream model adapters. OpenAI-compatible Chat Completions, with bounded retries and backoff.

use std::time::Duration;

use gateway_core::chat::{self, IdSource};
use gateway_core::entity::ProviderKind;
use gateway_core::steps::ModelOutput;
use rand::Rng;
use secrecy::ExposeSecret;
use serde_json::Value;

use crate::config::UpstreamConfig;
use crate::ids::new_id;
use crate::store::tenancy::Deployment;

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
    #[error("upstream answer unreadable: {0}")]
    Parse(String),
    #[error("provider kind '{0}' is not supported yet")]
    UnsupportedProvider(String),
}

impl UpstreamError {
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
            UpstreamError::Parse(_) => "The upstream model's answer could not be read.".into(),
            UpstreamError::UnsupportedProvider(kind) => {
                format!("The deployment's provider kind '{kind}' is not supported yet.")
            }
        }
    }
}

/// Calls upstream models; holds one pooled HTTP client for all of them.
#[derive(Debug, Clone)]
pub struct Upstream {
    http: reqwest::Client,
    config: UpstreamConfig,
}

/// Draws random ids for output items and for calls that came without an id.
struct RandomIds;

impl IdSource for RandomIds {
    fn item_id(&mut self, prefix: &str) -> String {
        new_id(prefix)
    }

    fn call_id(&mut self, _index: usize) -> String {
        new_id("call")
    }
}

impl Upstream {
    pub fn new(config: UpstreamConfig) -> Result<Upstream, reqwest::Error> {
        let http = reqwest::Client::builder()
            // Streams may run long: a stalled read is what fails them, not their total length. Whole
            // (non-streaming) answers get a total timeout per request below.
            .connect_timeout(Duration::from_millis(config.timeout_ms.min(10_000)))
            .read_timeout(Duration::from_millis(config.timeout_ms))
            .pool_max_idle_per_host(256)
            .build()?;
        Ok(Upstream { http, config })
    }

    /// One model call: sends `body` (a Chat Completions request) and normalises the answer.
    pub async fn complete(
        &self,
        deployment: &Deployment,
        body: &Value,
    ) -> Result<ModelOutput, UpstreamError> {
        if deployment.provider_kind != ProviderKind::OpenaiChat {
            return Err(UpstreamError::UnsupportedProvider(
                deployment.provider_kind.to_string(),
            ));
        }
        let url = format!(
            "{}/chat/completions",
            deployment.base_url.trim_end_matches('/')
        );
        let answer = self.post_with_retries(&url, deployment, body).await?;
        chat::parse_response(&answer, &mut RandomIds).map_err(|e| UpstreamError::Parse(e.0))
    }

    async fn post_with_retries(
        &self,
        url: &str,
        deployment: &Deployment,
        body: &Value,
    ) -> Result<Value, UpstreamError> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let mut request = self
                .http
                .post(url)
                .timeout(Duration::from_millis(self.config.timeout_ms))
                .json(body);
            if let Some(key) = &deployment.api_key {
                request = request.bearer_auth(key.expose_secret());
            }
            let retryable_failure = match request.send().await {
                Ok(response) => {
                    let status = response.status();
                    if status.is_success() {
                        return response
                            .json::<Value>()
                            .await
                            .map_err(|e| UpstreamError::Parse(e.to_string()));
                    }
                    let detail = response.text().await.unwrap_or_default();
                    let failure = UpstreamError::Status {
                        status: status.as_u16(),
                        attempts: attempt,
                        detail: truncate(&detail),
                    };
                    if status.as_u16() != 429 && !status.is_server_error() {
                        return Err(failure);
                    }
                    failure
                }
                Err(e) => UpstreamError::Transport {
                    attempts: attempt,
                    detail: e.to_string(),
                },
            };
            if attempt > self.config.max_retries {
                return Err(retryable_failure);
            }
            tracing::warn!(attempt, deployment = %deployment.name, error = %retryable_failure, "upstream call failed; retrying");
            tokio::time::sleep(backoff(self.config.backoff_ms, attempt)).await;
        }
    }
}

/// Exponential backoff with full jitter: a random wait below `base * 2^(attempt-1)`.
fn backoff(base_ms: u64, attempt: u32) -> Duration {
    let ceiling = base_ms
        .saturating_mul(1 << attempt.saturating_sub(1).min(10))
        .max(1);
    Duration::from_millis(rand::rng().random_range(ceiling / 2..=ceiling))
}

fn truncate(text: &str) -> String {
    text.chars().take(500).collect()
}

impl Upstream {
    /// One streamed model call: text deltas go to `text` as they arrive; the accumulated answer is
    /// normalised at the end. A failed attempt (429/5xx, connection error, or a stream that broke off) is
    /// retried, bounded, only while no text has been passed on: once the client saw text, a new attempt
    /// could not take it back.
    pub async fn complete_streaming(
        &self,
        deployment: &Deployment,
        body: &Value,
        message_id: &str,
        text: tokio::sync::mpsc::Sender<String>,
    ) -> Result<ModelOutput, UpstreamError> {
        if deployment.provider_kind != ProviderKind::OpenaiChat {
            return Err(UpstreamError::UnsupportedProvider(
                deployment.provider_kind.to_string(),
            ));
        }
        let mut body = body.clone();
        body["stream"] = Value::Bool(true);
        body["stream_options"] = serde_json::json!({"include_usage": true});
        let url = format!(
            "{}/chat/completions",
            deployment.base_url.trim_end_matches('/')
        );
        let mut attempt = 0;
        loop {
            attempt += 1;
            let mut out = TextOut {
                message_id,
                tx: &text,
                forwarded: false,
            };
            let failure = match self
                .stream_attempt(&url, deployment, &body, attempt, &mut out)
                .await
            {
                Ok(output) => return Ok(output),
                Err(failure) => failure,
            };
            let forwarded = out.forwarded;
            let retryable = match &failure {
                UpstreamError::Status { status, .. } => *status == 429 || *status >= 500,
                UpstreamError::Transport { .. } | UpstreamError::Broken { .. } => true,
                UpstreamError::Parse(_) | UpstreamError::UnsupportedProvider(_) => false,
            };
            if !retryable || forwarded || attempt > self.config.max_retries {
                return Err(failure);
            }
            tracing::warn!(attempt, deployment = %deployment.name, error = %failure, "upstream call failed; retrying");
            tokio::time::sleep(backoff(self.config.backoff_ms, attempt)).await;
        }
    }

    /// One attempt of a streamed call.
    async fn stream_attempt(
        &self,
        url: &str,
        deployment: &Deployment,
        body: &Value,
        attempt: u32,
        out: &mut TextOut<'_>,
    ) -> Result<ModelOutput, UpstreamError> {
        let mut request = self.http.post(url).json(body);
        if let Some(key) = &deployment.api_key {
            request = request.bearer_auth(key.expose_secret());
        }
        let response = request.send().await.map_err(|e| UpstreamError::Transport {
            attempts: attempt,
            detail: e.to_string(),
        })?;
        let status = response.status();
        if !status.is_success() {
            let detail = response.text().await.unwrap_or_default();
            return Err(UpstreamError::Status {
                status: status.as_u16(),
                attempts: attempt,
                detail: truncate(&detail),
            });
        }
        read_chat_stream(response, attempt, out).await
    }
}

/// Where the text of a streamed call goes, and whether any was passed on yet.
struct TextOut<'a> {
    /// The id of the message item the text is shown in.
    message_id: &'a str,
    tx: &'a tokio::sync::mpsc::Sender<String>,
    forwarded: bool,
}

/// Reads a Chat Completions SSE body (`data: {...}` lines, ending with `data: [DONE]`).
async fn read_chat_stream(
    response: reqwest::Response,
    attempt: u32,
    out: &mut TextOut<'_>,
) -> Result<ModelOutput, UpstreamError> {
    use futures::StreamExt;
    use gateway_core::chat_stream::{ChatStream, StreamDelta};

    let broken = |detail: String| UpstreamError::Broken {
        attempts: attempt,
        detail,
    };
    let mut stream = ChatStream::new();
    let mut body = response.bytes_stream();
    let mut buffer: Vec<u8> = Vec::new();
    let mut done = false;
    while !done {
        let Some(chunk) = body.next().await else {
            break;
        };
        let chunk = chunk.map_err(|e| broken(format!("body error: {e}")))?;
        buffer.extend_from_slice(&chunk);
        while let Some(end) = buffer.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = buffer.drain(..=end).collect();
            let line = String::from_utf8_lossy(&line);
            let Some(data) = line.trim_end_matches(['\r', '\n']).strip_prefix("data:") else {
                continue;
            };
            let data = data.trim_start();
            if data == "[DONE]" {
                done = true;
                break;
            }
            let value: Value = serde_json::from_str(data)
                .map_err(|e| UpstreamError::Parse(format!("bad chunk: {e}")))?;
            // The only chunk `push` refuses is an `{"error": ...}` chunk: the upstream gave up mid-answer.
            let deltas = stream.push(&value).map_err(|e| broken(e.0))?;
            for StreamDelta::Text(delta) in deltas {
                out.forwarded = true;
                // A closed receiver means the client left; the answer is still read to its end and stored.
                let _ = out.tx.send(delta).await;
            }
        }
    }
    if !done && !stream.has_finish_reason() {
        // Some servers end without [DONE], but every complete answer names a finish reason.
        return Err(broken("the body ended before the answer did".into()));
    }
    stream
        .finish(&mut StreamIds {
            message_id: out.message_id,
        })
        .map_err(|e| UpstreamError::Parse(e.0))
}

/// Ids for a streamed answer: its message keeps the id its events already used.
struct StreamIds<'a> {
    message_id: &'a str,
}

impl IdSource for StreamIds<'_> {
    fn item_id(&mut self, prefix: &str) -> String {
        if prefix == "msg" {
            self.message_id.to_owned()
        } else {
            new_id(prefix)
        }
    }

    fn call_id(&mut self, _index: usize) -> String {
        new_id("call")
    }
}
