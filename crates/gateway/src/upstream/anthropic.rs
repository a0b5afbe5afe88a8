//! The Anthropic Messages adapter: `POST {base_url}/v1/messages` with `x-api-key` and `anthropic-version`,
//! answered whole or as SSE events; translation and normalisation are the core's (`anthropic`).

use futures::future::BoxFuture;
use futures::StreamExt;
use gateway_core::anthropic::{self, AnthropicStream};
use gateway_core::steps::ModelOutput;
use secrecy::ExposeSecret;
use serde_json::Value;

use super::{sse, Forwarder, Live, ModelRequest, Target, Upstream, UpstreamError, Wire};

/// One model call. Overloaded (529), rate-limited (429) and other 5xx answers are retried by the shared rule.
pub(super) async fn call(
    upstream: &Upstream,
    target: &Target,
    request: &ModelRequest<'_>,
    live: Option<Live<'_>>,
) -> Result<ModelOutput, UpstreamError> {
    let body = anthropic::build_request(
        &target.model,
        target.max_tokens,
        request.params,
        request.conversation,
        request.tools,
    );
    // SPEC 8: the base URL excludes the version, as Anthropic's SDKs have it.
    let url = format!("{}/v1/messages", target.base_url.trim_end_matches('/'));
    let post = |body: &Value| {
        let request = upstream
            .http
            .post(&url)
            .header("anthropic-version", anthropic::API_VERSION)
            .json(body);
        match &target.api_key {
            Some(key) => request.header("x-api-key", key.expose_secret()),
            None => request,
        }
    };
    let wire = Wire {
        post: &post,
        parse: anthropic::parse_response,
        stream_options: None,
        read_stream,
    };
    upstream
        .call_over(target, wire, body, request.response_id, live)
        .await
}

/// Reads a Messages SSE body (`event: <type>` / `data: {...}` pairs, ending with `message_stop`), passing text on
/// as it arrives, into the normalised answer.
fn read_stream<'a>(
    mut events: sse::Events<'a>,
    attempt: u32,
    out: &'a Forwarder<'a>,
    response_id: &'a str,
) -> BoxFuture<'a, Result<ModelOutput, UpstreamError>> {
    Box::pin(async move {
        let broken = UpstreamError::broken_at(attempt);
        let mut stream = AnthropicStream::new();
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
    })
}
