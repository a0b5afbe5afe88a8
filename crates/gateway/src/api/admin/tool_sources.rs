//! `/tool_sources`: create, list, read, change and delete server tools. The secret is write-only.

use axum::extract::State;
use axum::Json;
use gateway_core::entity::{check_secret, HttpUrl, TimeoutMs, ToolName, ToolParameters};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{
    deleted, list, not_found, not_null, nullable, parse_changed, parse_required, AdminJson,
    ApiPath, Deleted, List,
};
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

/// A tool source as the admin API shows it: whether it has a secret, never the secret.
#[derive(Debug, Serialize)]
pub struct ToolSourceObject {
    id: String,
    object: &'static str,
    name: String,
    description: String,
    parameters: Value,
    url: String,
    timeout_ms: i64,
    strict: bool,
    has_secret: bool,
    created_at: i64,
}

impl From<ToolSourceRow> for ToolSourceObject {
    fn from(row: ToolSourceRow) -> ToolSourceObject {
        ToolSourceObject {
            id: row.id,
            object: "tool_source",
            name: row.name,
            description: row.description,
            parameters: row.parameters,
            url: row.url,
            timeout_ms: row.timeout_ms,
            strict: row.strict,
            has_secret: row.has_secret,
            created_at: row.created_at,
        }
    }
}

/// `POST /tool_sources`.
pub async fn create_tool_source(
    State(state): State<AppState>,
    AdminJson(body): AdminJson<ToolSourceBody>,
) -> Result<Json<ToolSourceObject>, ApiError> {
    let name = parse_required(body.name, "name", ToolName::parse)?;
    let description = body.description.flatten().unwrap_or_default();
    let parameters = parse_required(body.parameters, "parameters", ToolParameters::parse)?;
    let url = parse_required(body.url, "url", HttpUrl::parse)?;
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
    Ok(Json(source.into()))
}

/// `GET /tool_sources`.
pub async fn list_tool_sources(
    State(state): State<AppState>,
) -> Result<Json<List<ToolSourceObject>>, ApiError> {
    let sources = state.store.list_tool_sources().await?;
    Ok(list(sources))
}

/// `GET /tool_sources/{tool_source_id}`.
pub async fn get_tool_source(
    State(state): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<ToolSourceObject>, ApiError> {
    let source = state
        .store
        .get_tool_source(&id)
        .await?
        .ok_or_else(|| not_found("tool source", &id))?;
    Ok(Json(source.into()))
}

/// `PATCH /tool_sources/{tool_source_id}`: any field; `secret: null` removes the secret, `description: null`
/// empties the description.
pub async fn update_tool_source(
    State(state): State<AppState>,
    ApiPath(id): ApiPath<String>,
    AdminJson(body): AdminJson<ToolSourceBody>,
) -> Result<Json<ToolSourceObject>, ApiError> {
    let name = parse_changed(body.name, "name", ToolName::parse)?;
    let description = body.description.map(Option::unwrap_or_default);
    let parameters = parse_changed(body.parameters, "parameters", ToolParameters::parse)?;
    let url = parse_changed(body.url, "url", HttpUrl::parse)?;
    let timeout_ms = parse_changed(body.timeout_ms, "timeout_ms", TimeoutMs::parse)?;
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
    Ok(Json(source.into()))
}

/// `DELETE /tool_sources/{tool_source_id}`: also detaches it from every group.
pub async fn delete_tool_source(
    State(state): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<Deleted>, ApiError> {
    if !state.store.delete_tool_source(&id).await? {
        return Err(not_found("tool source", &id));
    }
    tracing::info!(tool_source.id = %id, "tool source deleted");
    Ok(deleted(id, "tool_source"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_tool_source_answers_the_documented_fields_without_its_secret() {
        let row = ToolSourceRow {
            id: "tool_1".into(),
            name: "get_weather".into(),
            description: "Weather.".into(),
            parameters: json!({"type": "object"}),
            url: "http://tools.internal/get_weather".into(),
            timeout_ms: 5000,
            strict: true,
            has_secret: true,
            created_at: 1_735_689_600,
        };
        assert_eq!(
            serde_json::to_value(ToolSourceObject::from(row)).unwrap(),
            json!({
                "id": "tool_1",
                "object": "tool_source",
                "name": "get_weather",
                "description": "Weather.",
                "parameters": {"type": "object"},
                "url": "http://tools.internal/get_weather",
                "timeout_ms": 5000,
                "strict": true,
                "has_secret": true,
                "created_at": 1_735_689_600,
            })
        );
    }
}
