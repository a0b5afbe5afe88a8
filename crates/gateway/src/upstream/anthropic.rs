//! The Anthropic Messages adapter: `POST {base_url}/v1/messages` with `x-api-key` and `anthropic-version`,
//! answered whole or as SSE events; translation and normalisation are the core's (`anthropic`).

use bytes::Bytes;
use futures::{Stream, StreamExt};
use gateway_core::anthropic::{self, AnthropicStream};
use gateway_core::steps::ModelOutput;
use secrecy::ExposeSecret;
use serde_json::Value;

use super::{sse, Forwarder, Live, ModelRequest, Upstream, UpstreamError};
use crate::store::tenancy::Deployment;

/// One model call: the body is built once, then sent once per attempt. Overloaded (529), rate-limited (429) and
/// other 5xx answers are retried by the shared rule.
pub(super) async fn call(
    upstream: &Upstream,
    deployment: &Deployment,
    request: &ModelRequest<'_>,
    live: Option<Live<'_>>,
) -> Result<ModelOutput, UpstreamError> {
    let mut body = anthropic::build_request(
        &deployment.upstream_model,
        deployment.max_tokens,
        request.params,
        request.conversation,
        request.tools,
    );
    // SPEC 8: the base URL excludes the version, as Anthropic's SDKs have it.
    let url = format!("{}/v1/messages", deployment.base_url.trim_end_matches('/'));
    let post = |body: &Value| {
        let request = upstream
            .http
            .post(&url)
            .header("anthropic-version", anthropic::API_VERSION)
            .json(body);
        match &deployment.api_key {
            Some(key) => request.header("x-api-key", key.expose_secret()),
            None => request,
        }
    };
    let post = &post;
    let response_id = request.response_id;
    match live {
        None => {
            upstream
                .call_whole(
                    deployment,
                    &|| post(&body),
                    anthropic::parse_response,
                    response_id,
                )
                .await
        }
        Some(live) => {
            body["stream"] = Value::Bool(true);
            let body = &body;
            let out = &Forwarder::new(live);
            upstream
                .with_retries(deployment, Some(out), |attempt| async move {
                    let response = upstream.send(deployment, post(body), attempt).await?;
                    read_stream(response.bytes_stream(), attempt, out, response_id).await
                })
                .await
        }
    }
}

/// Reads a Messages SSE body (`event: <type>` / `data: {...}` pairs, ending with `message_stop`), passing text on
/// as it arrives, into the normalised answer.
async fn read_stream<E: std::fmt::Display>(
    body: impl Stream<Item = Result<Bytes, E>>,
    attempt: u32,
    out: &Forwarder<'_>,
    response_id: &str,
) -> Result<ModelOutput, UpstreamError> {
    let broken = |detail: String| UpstreamError::Broken {
        attempts: attempt,
        detail,
    };
    let mut stream = AnthropicStream::new();
    let mut events = std::pin::pin!(sse::upstream_events(body, attempt));
    while let Some(event) = events.next().await {
        let event = event?;
        if event.data.trim().is_empty() {
            continue;
        }
        let mut value: Value = serde_json::from_str(&event.data)
            .map_err(|e| UpstreamError::Parse(format!("bad event: {e}")))?;
        // The data carries its type; a server that leaves it out still names the event.
        if value.get("type").is_none() && !event.event.is_empty() {
            value["type"] = Value::String(event.event.clone());
        }
        // The only event `push` refuses is an `error` event: the upstream gave up mid-answer (overloaded, say).
        for delta in stream.push(&value).map_err(|e| broken(e.0))? {
            out.send(delta).await;
        }
        if stream.is_complete() {
            break;
        }
    }
    if !stream.is_complete() {
        return Err(broken("the body ended before message_stop".into()));
    }
    stream
        .finish(&mut out.ids(response_id))
        .map_err(|e| UpstreamError::Parse(e.0))
}
