//! Handlers of `/v1/responses`: create, read, delete, and list input items.

use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use gateway_core::output::{render_output, response_object};
use gateway_core::request::{validate, CreateResponseBody};
use gateway_core::response::{Ending, ResponseRecord};
use serde::Deserialize;
use serde_json::{json, Value};

use super::error::ApiError;
use super::extract::{ApiJson, ProjectKey};
use super::stream::event_stream;
use super::AppState;
use crate::store::responses::{Order, StoredResponse};

/// `POST /v1/responses`: a JSON answer, or with `stream: true` the Responses event stream.
///
/// A non-streaming create that carries an `Idempotency-Key` header runs once per project and key: a repeat
/// answers what the first one answered (409, which SDKs retry, while the first is still running).
pub async fn create_response(
    State(state): State<AppState>,
    ProjectKey(project): ProjectKey,
    headers: HeaderMap,
    ApiJson(body): ApiJson<CreateResponseBody>,
) -> Result<Response, ApiError> {
    let request = validate(body)?;
    let idempotency_key = idempotency_key(&headers)?.filter(|_| !request.stream);
    if idempotency_key.is_some() && !request.store {
        return Err(ApiError::invalid(
            "An Idempotency-Key needs a stored response to answer repeats with: it cannot be used with 'store': false.",
            Some("store"),
            None,
        ));
    }
    if let Some(key) = idempotency_key {
        if let Some(id) = state
            .store
            .response_for_idempotency_key(&project, key)
            .await?
        {
            return replay(&state, &project, &id).await;
        }
    }
    if request.background {
        return Err(ApiError::invalid(
            "Background mode is not supported yet.",
            Some("background"),
            None,
        ));
    }
    if request.stream {
        // Errors found before the stream starts are plain JSON errors (from `prepare`).
        let run = state.engine.prepare(&project, request, None).await?;
        return Ok(event_stream(state.engine.clone(), run));
    }
    let finished = state
        .engine
        .create(&project, request, idempotency_key)
        .await?;
    answer(&finished.record, finished.object())
}

/// The answer to a finished create: the response, or, when it failed upstream, a 500 naming it that SDKs
/// must not retry (server tools may already have run).
fn answer(record: &ResponseRecord, object: Value) -> Result<Response, ApiError> {
    if let Some(Ending::Failed { message, .. }) = record.ending() {
        return Err(ApiError::server(format!(
            "{message} The response '{}' failed.",
            record.id
        )));
    }
    Ok(Json(object).into_response())
}

/// Answers a repeated create with what the first one answered.
async fn replay(state: &AppState, project: &str, id: &str) -> Result<Response, ApiError> {
    let stored = find_response(state, project, id).await?;
    if stored.record.ending().is_none() {
        return Err(ApiError::idempotency_in_progress());
    }
    let object = response_json(state, project, &stored).await?;
    answer(&stored.record, object)
}

/// A response of `project`; another project's is a 404, exactly like a missing one.
async fn find_response(
    state: &AppState,
    project: &str,
    id: &str,
) -> Result<StoredResponse, ApiError> {
    state
        .store
        .load_response(project, id)
        .await?
        .ok_or_else(|| ApiError::response_not_found(id))
}

/// A stored response as the API shows it, with its output rendered from its steps.
async fn response_json(
    state: &AppState,
    project: &str,
    stored: &StoredResponse,
) -> Result<Value, ApiError> {
    let record = &stored.record;
    let steps = state.store.load_steps(project, &record.id).await?;
    let handed_back = record.ending().is_some_and(Ending::handed_back);
    Ok(response_object(record, &render_output(&steps, handed_back)))
}

/// The `Idempotency-Key` header, when present: 1 to 255 visible ASCII characters.
fn idempotency_key(headers: &HeaderMap) -> Result<Option<&str>, ApiError> {
    let Some(value) = headers.get("idempotency-key") else {
        return Ok(None);
    };
    match value.to_str() {
        Ok(key)
            if !key.is_empty() && key.len() <= 255 && key.bytes().all(|b| b.is_ascii_graphic()) =>
        {
            Ok(Some(key))
        }
        _ => Err(ApiError::invalid(
            "The Idempotency-Key header must be 1 to 255 visible ASCII characters.",
            None,
            Some("invalid_idempotency_key"),
        )),
    }
}

/// `GET /v1/responses/{id}`.
pub async fn get_response(
    State(state): State<AppState>,
    ProjectKey(project): ProjectKey,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let stored = find_response(&state, &project, &id).await?;
    Ok(Json(response_json(&state, &project, &stored).await?))
}

/// `DELETE /v1/responses/{id}`.
pub async fn delete_response(
    State(state): State<AppState>,
    ProjectKey(project): ProjectKey,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let stored = find_response(&state, &project, &id).await?;
    if stored.record.ending().is_none() {
        // Its loop is still writing steps; deleting under it would break the loop, not stop it.
        return Err(ApiError::invalid(
            format!(
                "Response '{id}' is still {}; it can be deleted once it ends.",
                stored.record.status().as_str()
            ),
            None,
            Some("response_in_progress"),
        ));
    }
    if !state.store.delete_response(&project, &id).await? {
        return Err(ApiError::response_not_found(&id));
    }
    Ok(Json(
        json!({"id": id, "object": "response", "deleted": true}),
    ))
}

/// Query of `GET /v1/responses/{id}/input_items`.
#[derive(Debug, Deserialize)]
pub struct ListQuery {
    limit: Option<String>,
    order: Option<String>,
    after: Option<String>,
}

/// `GET /v1/responses/{id}/input_items`: the full context the response saw, paginated as OpenAI does.
pub async fn list_input_items(
    State(state): State<AppState>,
    ProjectKey(project): ProjectKey,
    Path(id): Path<String>,
    Query(query): Query<ListQuery>,
) -> Result<Json<Value>, ApiError> {
    let limit = match query.limit.as_deref() {
        None => 20,
        Some(text) => match text.parse::<i64>() {
            Ok(n) if (1..=100).contains(&n) => n,
            _ => {
                return Err(ApiError::invalid(
                    format!(
                        "Invalid 'limit': expected an integer between 1 and 100, got '{text}'."
                    ),
                    Some("limit"),
                    None,
                ))
            }
        },
    };
    let order = match query.order.as_deref() {
        None | Some("desc") => Order::Desc,
        Some("asc") => Order::Asc,
        Some(other) => {
            return Err(ApiError::invalid(
                format!("Invalid 'order': expected 'asc' or 'desc', got '{other}'."),
                Some("order"),
                None,
            ))
        }
    };
    find_response(&state, &project, &id).await?;
    let (data, has_more) = state
        .store
        .input_items_page(&project, &id, query.after.as_deref(), limit, order)
        .await?
        .ok_or_else(|| {
            ApiError::invalid(
                format!(
                    "Invalid 'after': no input item with id '{}' in response '{id}'.",
                    query.after.as_deref().unwrap_or_default()
                ),
                Some("after"),
                None,
            )
        })?;
    let first_id = data
        .first()
        .and_then(|i| i.get("id"))
        .cloned()
        .unwrap_or(Value::Null);
    let last_id = data
        .last()
        .and_then(|i| i.get("id"))
        .cloned()
        .unwrap_or(Value::Null);
    Ok(Json(
        json!({"object": "list", "data": data, "first_id": first_id, "last_id": last_id, "has_more": has_more}),
    ))
}
