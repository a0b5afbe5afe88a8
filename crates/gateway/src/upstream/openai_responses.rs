//! The OpenAI Responses adapter: `POST {base_url}/responses`, called statelessly (SPEC 8), answered whole or as
//! SSE events; translation and normalisation are the core's (`openai_responses`).

use gateway_core::openai_responses::{self, ResponsesStream};
use gateway_core::steps::ModelOutput;
use serde_json::Value;

use super::{sse, Live, ModelRequest, Target, Upstream, UpstreamError, Wire};

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
        read_stream: sse::read_typed_events::<ResponsesStream>,
    };
    upstream
        .call_over(target, wire, body, request.response_id, live)
        .await
}
