//! `/tool_sources`: create, list, read, change and delete server tools. The secret is write-only.

use axum::extract::State;
use axum::Json;
use gateway_core::entity::{check_secret, HttpUrl, TimeoutMs, ToolName, ToolParameters};
use serde::Deserialize;
use serde_json::{json, Value};

use super::{deleted, list, not_found, not_null, nullable, required, AdminJson, Ids};
use crate::api::error::ApiError;
use crate::api::AppState;
use crate::store::admin::{NewToolSource, ToolSourceChanges, ToolSourceRow};

/// A tool source's fields.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolSourceBody {
    #[serde(default, deserialize_with = "nullable")]
    name: Option<Option<String>>,
    #[serde(default, deserialize_with = "nullable")]
    description: Option<Option<String>>,
    #[serde(default, deserialize_with = "nullable")]
    parameters: Option<Option<Value>>,
    #[serde(default, deserialize_with = "nullable")]
    url: Option<Option<String>>,
    #[serde(default, deserialize_with = "nullable")]
    timeout_ms: Option<Option<i64>>,
    #[serde(default, deserialize_with = "nullable")]
    secret: Option<Option<String>>,
    #[serde(default, deserialize_with = "nullable")]
    strict: Option<Option<bool>>,
}

fn tool_source_object(t: &ToolSourceRow) -> Value {
    json!({
        "id": t.id,
        "object": "tool_source",
        "name": t.name,
        "description": t.description,
        "parameters": t.parameters,
        "url": t.url,
        "timeout_ms": t.timeout_ms,
        "strict": t.strict,
        "has_secret": t.has_secret,
        "created_at": t.created_at,
    })
}

/// `POST /tool_sources`.
pub async fn create_tool_source(
    State(state): State<AppState>,
    AdminJson(body): AdminJson<ToolSourceBody>,
) -> Result<Json<Value>, ApiError> {
    let name = ToolName::parse(required(body.name, "name")?, "name")?;
    let description = body.description.flatten().unwrap_or_default();
    let parameters = ToolParameters::parse(required(body.parameters, "parameters")?, "parameters")?;
    let url = HttpUrl::parse(required(body.url, "url")?, "url")?;
    let timeout_ms = match body.timeout_ms.flatten() {
        Some(timeout_ms) => TimeoutMs::parse(timeout_ms, "timeout_ms")?,
        None => TimeoutMs::DEFAULT,
    };
    let secret = body.secret.flatten();
    if let Some(secret) = &secret {
        check_secret(secret, "secret")?;
    }
    let new = NewToolSource {
        name: &name,
        description: &description,
        parameters: &parameters,
        url: &url,
        timeout_ms,
        secret: secret.as_deref(),
        strict: body.strict.flatten().unwrap_or(false),
    };
    let source = state.store.create_tool_source(&new).await?;
    tracing::info!(tool_source.id = %source.id, tool.name = %source.name, "tool source created");
    Ok(Json(tool_source_object(&source)))
}

/// `GET /tool_sources`.
pub async fn list_tool_sources(State(state): State<AppState>) -> Result<Json<Value>, ApiError> {
    let sources = state.store.list_tool_sources().await?;
    Ok(list(sources.iter().map(tool_source_object).collect()))
}

/// `GET /tool_sources/{tool_source_id}`.
pub async fn get_tool_source(
    State(state): State<AppState>,
    Ids(id): Ids<String>,
) -> Result<Json<Value>, ApiError> {
    let source = state
        .store
        .get_tool_source(&id)
        .await?
        .ok_or_else(|| not_found("tool source", &id))?;
    Ok(Json(tool_source_object(&source)))
}

/// `PATCH /tool_sources/{tool_source_id}`: any field; `secret: null` removes the secret, `description: null`
/// empties the description.
pub async fn update_tool_source(
    State(state): State<AppState>,
    Ids(id): Ids<String>,
    AdminJson(body): AdminJson<ToolSourceBody>,
) -> Result<Json<Value>, ApiError> {
    let name = not_null(body.name, "name")?
        .map(|name| ToolName::parse(name, "name"))
        .transpose()?;
    let description = body.description.map(Option::unwrap_or_default);
    let parameters = not_null(body.parameters, "parameters")?
        .map(|parameters| ToolParameters::parse(parameters, "parameters"))
        .transpose()?;
    let url = not_null(body.url, "url")?
        .map(|url| HttpUrl::parse(url, "url"))
        .transpose()?;
    let timeout_ms = not_null(body.timeout_ms, "timeout_ms")?
        .map(|timeout_ms| TimeoutMs::parse(timeout_ms, "timeout_ms"))
        .transpose()?;
    if let Some(Some(secret)) = &body.secret {
        check_secret(secret, "secret")?;
    }
    let strict = not_null(body.strict, "strict")?;
    let changes = ToolSourceChanges {
        name: name.as_ref(),
        description: description.as_deref(),
        parameters: parameters.as_ref(),
        url: url.as_ref(),
        timeout_ms,
        secret: body.secret.as_ref().map(Option::as_deref),
        strict,
    };
    let source = state
        .store
        .update_tool_source(&id, &changes)
        .await?
        .ok_or_else(|| not_found("tool source", &id))?;
    tracing::info!(tool_source.id = %source.id, tool.name = %source.name, "tool source updated");
    Ok(Json(tool_source_object(&source)))
}

/// `DELETE /tool_sources/{tool_source_id}`: also detaches it from every group.
pub async fn delete_tool_source(
    State(state): State<AppState>,
    Ids(id): Ids<String>,
) -> Result<Json<Value>, ApiError> {
    if !state.store.delete_tool_source(&id).await? {
        return Err(not_found("tool source", &id));
    }
    tracing::info!(tool_source.id = %id, "tool source deleted");
    Ok(deleted(&id, "tool_source"))
}
