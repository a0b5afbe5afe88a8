//! `POST /v1/responses/input_tokens` (SPEC 15): the input tokens a create would send its model, without storing
//! anything or calling a model. The `x-gateway-tokens-counted-by` header says who counted: `provider`, or
//! `local:<encoding>`.

use axum::extract::State;
use axum::http::HeaderValue;
use axum::response::{IntoResponse, Response};
use axum::Json;
use gateway_core::request::{validate_count, CreateResponseBody};
use serde_json::json;

use super::error::ApiError;
use super::extract::{ApiJson, ProjectKey};
use super::AppState;
use crate::upstream::count::CountedBy;

pub async fn count_input_tokens(
    State(state): State<AppState>,
    ProjectKey(project, _): ProjectKey,
    ApiJson(body): ApiJson<CreateResponseBody>,
) -> Result<Response, ApiError> {
    let request = validate_count(body)?;
    let count = state.engine.count_input_tokens(&project, request).await?;
    let counted_by = match count.counted_by {
        CountedBy::Provider => "provider".to_owned(),
        CountedBy::Local(encoding) => format!("local:{}", encoding.as_str()),
    };
    let mut response =
        Json(json!({"object": "response.input_tokens", "input_tokens": count.tokens}))
            .into_response();
    if let Ok(value) = HeaderValue::from_str(&counted_by) {
        response
            .headers_mut()
            .insert("x-gateway-tokens-counted-by", value);
    }
    Ok(response)
}
