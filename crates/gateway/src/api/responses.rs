//! Handlers of `/v1/responses`: create, read, delete, and list input items.

use axum::extract::{Path, Query, State};
use axum::Json;
use gateway_core::output::{render_output, response_object};
use gateway_core::request::{validate, CreateResponseBody};
use serde::Deserialize;
use serde_json::{json, Value};

use super::error::ApiError;
use super::extract::{ApiJson, ProjectKey};
use super::AppState;
use crate::store::responses::Order;

/// `POST /v1/responses`.
pub async fn create_response(
    State(state): State<AppState>,
    ProjectKey(project): ProjectKey,
    ApiJson(body): ApiJson<CreateResponseBody>,
) -> Result<Json<Value>, ApiError> {
    let request = validate(body)?;
    if request.stream {
        return Err(ApiError::invalid(
            "Streaming ('stream': true) is not supported yet.",
            Some("stream"),
            None,
        ));
    }
    if request.background {
        return Err(ApiError::invalid(
            "Background mode is not supported yet.",
            Some("background"),
            None,
        ));
    }
    let finished = state.engine.create(&project, request).await?;
    if let Some((_, message)) = &finished.record.error {
        return Err(ApiError::server(format!(
            "{message} The response '{}' failed.",
            finished.record.id
        )));
    }
    Ok(Json(finished.object()))
}

/// `GET /v1/responses/{id}`.
pub async fn get_response(
    State(state): State<AppState>,
    ProjectKey(project): ProjectKey,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let stored = state
        .store
        .load_response(&project, &id)
        .await?
        .ok_or_else(|| ApiError::response_not_found(&id))?;
    let steps = state.store.load_steps(&id).await?;
    let output = render_output(&steps, stored.handed_back);
    Ok(Json(response_object(&stored.record, &output)))
}

/// `DELETE /v1/responses/{id}`.
pub async fn delete_response(
    State(state): State<AppState>,
    ProjectKey(project): ProjectKey,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
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
    if state.store.load_response(&project, &id).await?.is_none() {
        return Err(ApiError::response_not_found(&id));
    }
    let (data, has_more) = state
        .store
        .input_items_page(&id, query.after.as_deref(), limit, order)
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
