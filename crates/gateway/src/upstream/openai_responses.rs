//! The OpenAI Responses adapter: `POST {base_url}/responses`, called statelessly (SPEC 8), answered whole or as
//! SSE events; translation and normalisation are the core's (`openai_responses`).

use futures::future::BoxFuture;
use futures::StreamExt;
use gateway_core::openai_responses::{self, ResponsesStream};
use gateway_core::steps::ModelOutput;
use serde_json::Value;

use super::{sse, Forwarder, Live, ModelRequest, Target, Upstream, UpstreamError, Wire};

/// One model call.
pub(super) async fn call(
    upstream: &Upstream,
    target: &Target,
    request: &ModelRequest<'_>,
    live: Option<Live<'_>>,
) -> Result<ModelOutput, UpstreamError> {
    let body = openai_responses::build_request(
        &target.model,
        request.params,
        request.conversation,
        request.tools,
    );
    let url = format!("{}/responses", target.base_url.trim_end_matches('/'));
    let post = |body: &Value| upstream.bearer_post(&url, target, body);
    let wire = Wire {
        post: &post,
        parse: openai_responses::parse_response,
        stream_options: None,
        read_stream,
    };
    upstream
        .call_over(target, wire, body, request.response_id, live)
        .await
}

/// Reads a Responses SSE body (typed events ending with `response.completed` or `response.incomplete`), passing
/// text on as it arrives, into the normalised answer.
fn read_stream<'a>(
    mut events: sse::Events<'a>,
    attempt: u32,
    out: &'a Forwarder<'a>,
    response_id: &'a str,
) -> BoxFuture<'a, Result<ModelOutput, UpstreamError>> {
    Box::pin(async move {
        let broken = UpstreamError::broken_at(attempt);
        let mut stream = ResponsesStream::new();
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
    })
}
