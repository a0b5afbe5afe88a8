//! The OpenAI Responses adapter: `POST {base_url}/responses`, called statelessly (SPEC 8), answered whole or as
//! SSE events; translation and normalisation are the core's (`openai_responses`).

use bytes::Bytes;
use futures::{Stream, StreamExt};
use gateway_core::openai_responses::{self, ResponsesStream};
use gateway_core::steps::ModelOutput;
use secrecy::ExposeSecret;
use serde_json::Value;

use super::{sse, Forwarder, Live, ModelRequest, Upstream, UpstreamError};
use crate::store::tenancy::Deployment;

/// One model call: the body is built once, then sent once per attempt.
pub(super) async fn call(
    upstream: &Upstream,
    deployment: &Deployment,
    request: &ModelRequest<'_>,
    live: Option<Live<'_>>,
) -> Result<ModelOutput, UpstreamError> {
    let mut body = openai_responses::build_request(
        &deployment.upstream_model,
        request.params,
        request.conversation,
        request.tools,
    );
    let url = format!("{}/responses", deployment.base_url.trim_end_matches('/'));
    let post = |body: &Value| {
        let request = upstream.http.post(&url).json(body);
        match &deployment.api_key {
            Some(key) => request.bearer_auth(key.expose_secret()),
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
                    openai_responses::parse_response,
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

/// Reads a Responses SSE body (typed events ending with `response.completed` or `response.incomplete`), passing
/// text on as it arrives, into the normalised answer.
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
    let mut stream = ResponsesStream::new();
    let mut events = std::pin::pin!(sse::upstream_events(body, attempt));
    while let Some(event) = events.next().await {
        let event = event?;
        let data = event.data.trim();
        if data.is_empty() || data == "[DONE]" {
            continue;
        }
        let mut value: Value = serde_json::from_str(data)
            .map_err(|e| UpstreamError::Parse(format!("bad event: {e}")))?;
        if value.get("type").is_none() && !event.event.is_empty() {
            value["type"] = Value::String(event.event.clone());
        }
        for delta in stream.push(&value).map_err(|e| broken(e.0))? {
            out.send(delta).await;
        }
        if stream.is_complete() {
            break;
        }
    }
    if !stream.is_complete() {
        return Err(broken("the body ended before the response did".into()));
    }
    stream
        .finish(&mut out.ids(response_id))
        .map_err(|e| UpstreamError::Parse(e.0))
}
