//! The Anthropic Messages adapter: `POST {base_url}/v1/messages` with `x-api-key` and `anthropic-version`,
//! answered whole or as SSE events; translation and normalisation are the core's (`anthropic`).

use gateway_core::anthropic::{self, AnthropicStream};
use gateway_core::steps::ModelOutput;
use secrecy::ExposeSecret;
use serde_json::Value;

use super::{sse, Live, ModelRequest, Target, Upstream, UpstreamError, Wire};

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
        read_stream: sse::read_typed_events::<AnthropicStream>,
    };
    upstream
        .call_over(target, wire, body, request.response_id, live)
        .await
}
