//! `/deployments`: create, list, read, change and delete the model names clients send, each bound to an
//! upstream provider. The upstream key is write-only.

use axum::extract::State;
use axum::Json;
use gateway_core::entity::{check_non_empty, check_secret, EntityName, HttpUrl, ProviderKind};
use serde::{Deserialize, Serialize};

use super::{
    deleted, list, not_found, not_null, nullable, parse_changed, parse_required, required,
    AdminJson, ApiPath, Deleted, List,
};
use crate::api::error::ApiError;
use crate::api::AppState;
use crate::store::admin::{DeploymentChanges, DeploymentRow, NewDeployment};

/// `{"name","provider"}` of a deployment.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeploymentBody {
    #[serde(default, deserialize_with = "nullable")]
    name: Option<Option<String>>,
    #[serde(default, deserialize_with = "nullable")]
    provider: Option<Option<ProviderBody>>,
}

/// `{"kind","base_url","model","api_key"}` of a deployment.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderBody {
    #[serde(default, deserialize_with = "nullable")]
    kind: Option<Option<String>>,
    #[serde(default, deserialize_with = "nullable")]
    base_url: Option<Option<String>>,
    #[serde(default, deserialize_with = "nullable")]
    model: Option<Option<String>>,
    #[serde(default, deserialize_with = "nullable")]
    api_key: Option<Option<String>>,
}

/// A deployment as the admin API shows it: whether it has an upstream key, never the key.
#[derive(Debug, Serialize)]
pub struct DeploymentObject {
    id: String,
    object: &'static str,
    name: String,
    provider: ProviderObject,
    created_at: i64,
}

/// The `provider` of a `DeploymentObject`.
#[derive(Debug, Serialize)]
pub struct ProviderObject {
    kind: ProviderKind,
    base_url: String,
    model: String,
    has_api_key: bool,
}

impl From<DeploymentRow> for DeploymentObject {
    fn from(row: DeploymentRow) -> DeploymentObject {
        DeploymentObject {
            id: row.id,
            object: "deployment",
            name: row.name,
            provider: ProviderObject {
                kind: row.provider_kind,
                base_url: row.base_url,
                model: row.upstream_model,
                has_api_key: row.has_api_key,
            },
            created_at: row.created_at,
        }
    }
}

/// `POST /deployments`.
pub async fn create_deployment(
    State(state): State<AppState>,
    AdminJson(body): AdminJson<DeploymentBody>,
) -> Result<Json<DeploymentObject>, ApiError> {
    let name = parse_required(body.name, "name", EntityName::parse)?;
    let provider = required(body.provider, "provider")?;
    let kind = parse_required(provider.kind, "provider.kind", |kind: String, param| {
        ProviderKind::parse(&kind, param)
    })?;
    let base_url = parse_required(provider.base_url, "provider.base_url", HttpUrl::parse)?;
    let model = required(provider.model, "provider.model")?;
    check_non_empty(&model, "provider.model")?;
    let api_key = provider.api_key.flatten();
    if let Some(api_key) = &api_key {
        check_secret(api_key, "provider.api_key")?;
    }
    let new = NewDeployment {
        name: &name,
        provider_kind: kind,
        base_url: &base_url,
        upstream_model: &model,
        api_key: api_key.as_deref(),
    };
    let deployment = state.store.create_deployment(&new).await?;
    tracing::info!(deployment.id = %deployment.id, "deployment created");
    Ok(Json(deployment.into()))
}

/// `GET /deployments`.
pub async fn list_deployments(
    State(state): State<AppState>,
) -> Result<Json<List<DeploymentObject>>, ApiError> {
    let deployments = state.store.list_deployments().await?;
    Ok(list(deployments))
}

/// `GET /deployments/{deployment_id}`.
pub async fn get_deployment(
    State(state): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<DeploymentObject>, ApiError> {
    let deployment = state
        .store
        .get_deployment(&id)
        .await?
        .ok_or_else(|| not_found("deployment", &id))?;
    Ok(Json(deployment.into()))
}

/// `PATCH /deployments/{deployment_id}`: any of `name` and the provider's fields; `provider.api_key: null`
/// removes the key.
pub async fn update_deployment(
    State(state): State<AppState>,
    ApiPath(id): ApiPath<String>,
    AdminJson(body): AdminJson<DeploymentBody>,
) -> Result<Json<DeploymentObject>, ApiError> {
    let name = parse_changed(body.name, "name", EntityName::parse)?;
    let provider = not_null(body.provider, "provider")?;
    let (mut kind, mut base_url, mut model, mut api_key) = (None, None, None, None);
    if let Some(provider) = provider {
        kind = parse_changed(provider.kind, "provider.kind", |kind: String, param| {
            ProviderKind::parse(&kind, param)
        })?;
        base_url = parse_changed(provider.base_url, "provider.base_url", HttpUrl::parse)?;
        model = not_null(provider.model, "provider.model")?;
        if let Some(model) = &model {
            check_non_empty(model, "provider.model")?;
        }
        api_key = provider.api_key;
        if let Some(Some(api_key)) = &api_key {
            check_secret(api_key, "provider.api_key")?;
        }
    }
    let changes = DeploymentChanges {
        name: name.as_ref(),
        provider_kind: kind,
        base_url: base_url.as_ref(),
        upstream_model: model.as_deref(),
        api_key: api_key.as_ref().map(Option::as_deref),
    };
    let deployment = state
        .store
        .update_deployment(&id, &changes)
        .await?
        .ok_or_else(|| not_found("deployment", &id))?;
    tracing::info!(deployment.id = %deployment.id, "deployment updated");
    Ok(Json(deployment.into()))
}

/// `DELETE /deployments/{deployment_id}`: also removes it from every group.
pub async fn delete_deployment(
    State(state): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<Deleted>, ApiError> {
    if !state.store.delete_deployment(&id).await? {
        return Err(not_found("deployment", &id));
    }
    tracing::info!(deployment.id = %id, "deployment deleted");
    Ok(deleted(id, "deployment"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_deployment_answers_the_documented_fields_without_its_key() {
        let row = DeploymentRow {
            id: "dep_1".into(),
            name: "gpt-4o".into(),
            provider_kind: ProviderKind::OpenaiChat,
            base_url: "https://api.example.com/v1".into(),
            upstream_model: "gpt-4o-2024-08-06".into(),
            has_api_key: true,
            created_at: 1_735_689_600,
        };
        assert_eq!(
            serde_json::to_value(DeploymentObject::from(row)).unwrap(),
            json!({
                "id": "dep_1",
                "object": "deployment",
                "name": "gpt-4o",
                "provider": {"kind": "openai_chat", "base_url": "https://api.example.com/v1", "model": "gpt-4o-2024-08-06", "has_api_key": true},
                "created_at": 1_735_689_600,
            })
        );
    }
}
