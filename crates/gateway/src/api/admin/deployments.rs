//! `/deployments`: create, list, read, change and delete the model names clients send, each bound to an
//! upstream provider. The upstream key is write-only.

use axum::extract::State;
use axum::Json;
use gateway_core::entity::{check_non_empty, check_secret, EntityName, HttpUrl, ProviderKind};
use serde::Deserialize;
use serde_json::{json, Value};

use super::{deleted, entity_name, list, not_found, not_null, nullable, required, AdminJson, Ids};
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

fn deployment_object(d: &DeploymentRow) -> Value {
    json!({
        "id": d.id,
        "object": "deployment",
        "name": d.name,
        "provider": {"kind": d.provider_kind, "base_url": d.base_url, "model": d.upstream_model, "has_api_key": d.has_api_key},
        "created_at": d.created_at,
    })
}

/// `POST /deployments`.
pub async fn create_deployment(
    State(state): State<AppState>,
    AdminJson(body): AdminJson<DeploymentBody>,
) -> Result<Json<Value>, ApiError> {
    let name = EntityName::parse(required(body.name, "name")?, "name")?;
    let provider = required(body.provider, "provider")?;
    let kind = ProviderKind::parse(&required(provider.kind, "provider.kind")?, "provider.kind")?;
    let base_url = HttpUrl::parse(
        required(provider.base_url, "provider.base_url")?,
        "provider.base_url",
    )?;
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
    Ok(Json(deployment_object(&deployment)))
}

/// `GET /deployments`.
pub async fn list_deployments(State(state): State<AppState>) -> Result<Json<Value>, ApiError> {
    let deployments = state.store.list_deployments().await?;
    Ok(list(deployments.iter().map(deployment_object).collect()))
}

/// `GET /deployments/{deployment_id}`.
pub async fn get_deployment(
    State(state): State<AppState>,
    Ids(id): Ids<String>,
) -> Result<Json<Value>, ApiError> {
    let deployment = state
        .store
        .get_deployment(&id)
        .await?
        .ok_or_else(|| not_found("deployment", &id))?;
    Ok(Json(deployment_object(&deployment)))
}

/// `PATCH /deployments/{deployment_id}`: any of `name` and the provider's fields; `provider.api_key: null`
/// removes the key.
pub async fn update_deployment(
    State(state): State<AppState>,
    Ids(id): Ids<String>,
    AdminJson(body): AdminJson<DeploymentBody>,
) -> Result<Json<Value>, ApiError> {
    let name = entity_name(body.name)?;
    let provider = not_null(body.provider, "provider")?;
    let (mut kind, mut base_url, mut model, mut api_key) = (None, None, None, None);
    if let Some(provider) = provider {
        kind = not_null(provider.kind, "provider.kind")?
            .map(|kind| ProviderKind::parse(&kind, "provider.kind"))
            .transpose()?;
        base_url = not_null(provider.base_url, "provider.base_url")?
            .map(|url| HttpUrl::parse(url, "provider.base_url"))
            .transpose()?;
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
    Ok(Json(deployment_object(&deployment)))
}

/// `DELETE /deployments/{deployment_id}`: also removes it from every group.
pub async fn delete_deployment(
    State(state): State<AppState>,
    Ids(id): Ids<String>,
) -> Result<Json<Value>, ApiError> {
    if !state.store.delete_deployment(&id).await? {
        return Err(not_found("deployment", &id));
    }
    tracing::info!(deployment.id = %id, "deployment deleted");
    Ok(deleted(&id, "deployment"))
}
