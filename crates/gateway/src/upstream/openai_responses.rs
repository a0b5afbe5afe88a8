//! The OpenAI Responses adapter: `POST {base_url}/responses`, called statelessly (SPEC 8), answered whole or as
//! SSE events; translation and normalisation are the core's (`openai_responses`).

use super::{bearer, sse, Body, Wire};
use gateway_core::openai_responses::{self, ResponsesStream};

/// How a Responses upstream speaks.
pub(super) const WIRE: Wire = Wire {
    path: "/responses",
    build: |target, input| Body::Json(openai_responses::build_request(target.model, input)),
    headers: bearer,
    parse: openai_responses::parse_answer,
    include_usage: false,
    read_stream: sse::read_typed_events::<ResponsesStream>,
};
