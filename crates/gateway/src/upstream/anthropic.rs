//! The Anthropic Messages adapter: `POST {base_url}/v1/messages` with `x-api-key` and `anthropic-version`,
//! answered whole or as SSE events; translation and normalisation are the core's (`anthropic`).

use gateway_core::anthropic::{self, AnthropicStream};
use secrecy::ExposeSecret;

use http::header::{HeaderName, HeaderValue};

use super::{secret_header, sse, Body, Wire};

/// How Anthropic Messages speaks (SPEC 8: the base URL excludes the version, as Anthropic's SDKs have it).
/// Overloaded (529), rate-limited (429) and other 5xx answers are retried by the shared rule.
pub(super) const WIRE: Wire = Wire {
    path: "/v1/messages",
    build: |target, input| {
        Body::Json(anthropic::build_request(
            target.model,
            target.max_tokens,
            input,
        ))
    },
    headers: |headers, target| {
        headers.insert(
            HeaderName::from_static("anthropic-version"),
            HeaderValue::from_static(anthropic::API_VERSION),
        );
        if let Some(key) = &target.api_key {
            headers.insert(
                HeaderName::from_static("x-api-key"),
                secret_header(key.expose_secret())?,
            );
        }
        Ok(())
    },
    parse: anthropic::parse_answer,
    include_usage: false,
    read_stream: sse::read_typed_events::<AnthropicStream>,
};
