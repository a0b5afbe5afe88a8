//! `POST /v1/responses/compact` (SPEC 11): a window compacted into the kept user messages and a sealed summary.

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use gateway_core::output::usage_object;
use gateway_core::request::{validate, CreateResponseBody};
use serde::Deserialize;
use serde_json::{json, Value};

use super::error::ApiError;
use super::extract::{ApiJson, ProjectKey};
use super::governance::{admit, with_rate_headers};
use super::AppState;

/// The body of a compaction request; fields the gateway does not use are accepted and ignored.
#[derive(Debug, Deserialize)]
pub struct CompactBody {
    model: Option<String>,
    input: Option<Value>,
    previous_response_id: Option<String>,
    instructions: Option<String>,
    prompt_cache_key: Option<String>,
}

/// `POST /v1/responses/compact`: the `response.compaction` object; nothing is stored but the usage of its summary
/// call. It is admitted like a create (the key's and project's limits and budgets, `max_concurrent` held while
/// it runs) and answers the `x-ratelimit-*` headers.
pub async fn compact_response(
    State(state): State<AppState>,
    ProjectKey(_, grant): ProjectKey,
    ApiJson(body): ApiJson<CompactBody>,
) -> Result<Response, ApiError> {
    // The same rules as a create for what the two share (model required, input items, previous response).
    let request = validate(CreateResponseBody {
        model: body.model,
        input: body.input,
        previous_response_id: body.previous_response_id,
        instructions: body.instructions,
        prompt_cache_key: body.prompt_cache_key,
        store: Some(false),
        ..CreateResponseBody::default()
    })?;
    let (admitted, standings) = admit(&state, &grant).await?;
    let compacted = state.engine.compact(&admitted.payer, request).await?;
    let answer = Json(json!({
        "id": compacted.id,
        "object": "response.compaction",
        "created_at": compacted.created_at,
        "output": compacted.output,
        "usage": usage_object(&compacted.usage),
    }));
    // Its place under `max_concurrent` is given back once the answer is made.
    drop(admitted);
    Ok(with_rate_headers(answer.into_response(), &standings))
}
