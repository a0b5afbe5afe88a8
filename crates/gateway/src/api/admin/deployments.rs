//! `/deployments`: create, list, read, change and delete the model names clients send, each bound to an
//! upstream provider and priced. The upstream key is write-only.

use axum::extract::State;
use axum::Json;
use gateway_core::entity::{check_non_empty, check_secret, EntityName, HttpUrl, ProviderKind};
use gateway_core::governance::Pricing;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{
    found, not_null, nullable, parse_changed, parse_required, present, required, AdminJson, ApiPath,
};
use crate::api::error::ApiError;
use crate::api::AppState;
use crate::store::admin::{DeploymentChanges, DeploymentRow, NewDeployment};
use crate::store::tenancy::{parse_fallbacks, DEFAULT_MAX_TOKENS};
use gateway_core::toolset::UnsupportedTools;

/// `{"name", "provider", "fallbacks", "unsupported_tools", "unsupported_params", "pricing"}` of a deployment.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeploymentBody {
    #[serde(default, deserialize_with = "nullable")]
    name: Option<Option<String>>,
    #[serde(default, deserialize_with = "nullable")]
    provider: Option<Option<ProviderBody>>,
    #[serde(default, deserialize_with = "nullable")]
    fallbacks: Option<Option<Vec<String>>>,
    #[serde(default, deserialize_with = "nullable")]
    unsupported_tools: Option<Option<String>>,
    /// What a create setting a parameter the provider kind cannot honour gets: `ignore` (listed) or `reject`.
    #[serde(default, deserialize_with = "nullable")]
    unsupported_params: Option<Option<String>>,
    /// USD per million tokens; `null` removes the prices.
    #[serde(default, deserialize_with = "present")]
    pricing: Option<Value>,
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
    /// Anthropic's `max_tokens` when a request sets none; `null` is the gateway's default.
    #[serde(default, deserialize_with = "nullable")]
    max_tokens: Option<Option<i64>>,
}

/// A deployment as the admin API shows it: whether it has an upstream key, never the key.
#[derive(Debug, Serialize)]
pub struct DeploymentObject {
    id: String,
    object: &'static str,
    name: String,
    provider: ProviderObject,
    fallbacks: Vec<String>,
    unsupported_tools: String,
    unsupported_params: String,
    pricing: Option<Pricing>,
    created_at: i64,
}

/// The `provider` of a `DeploymentObject`.
#[derive(Debug, Serialize)]
pub struct ProviderObject {
    kind: ProviderKind,
    base_url: String,
    model: String,
    has_api_key: bool,
    /// What an Anthropic call sends as `max_tokens` when the request sets none (Anthropic deployments only).
    #[serde(skip_serializing_if = "Option::is_none")]
    max_tokens: Option<u32>,
}

impl From<DeploymentRow> for DeploymentObject {
    fn from(row: DeploymentRow) -> DeploymentObject {
        DeploymentObject {
            pricing: row.pricing(),
            id: row.id,
            object: "deployment",
            name: row.name,
            provider: ProviderObject {
                kind: row.provider_kind,
                base_url: row.base_url,
                model: row.upstream_model,
                has_api_key: row.has_api_key,
                max_tokens: (row.provider_kind == ProviderKind::Anthropic).then(|| {
                    row.max_tokens
                        .and_then(|n| u32::try_from(n).ok())
                        .unwrap_or(DEFAULT_MAX_TOKENS)
                }),
            },
            fallbacks: parse_fallbacks(&row.fallbacks),
            unsupported_tools: row.unsupported_tools,
            unsupported_params: row.unsupported_params,
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
    let max_tokens = provider
        .max_tokens
        .flatten()
        .map(parse_max_tokens)
        .transpose()?;
    let fallbacks = match body.fallbacks.flatten() {
        Some(names) => check_fallbacks(&state, names, name.as_str()).await?,
        None => Vec::new(),
    };
    let unsupported_tools = body
        .unsupported_tools
        .flatten()
        .map(|policy| parse_policy(&policy, "unsupported_tools"))
        .transpose()?
        .unwrap_or_default();
    let unsupported_params = body
        .unsupported_params
        .flatten()
        .map(|policy| parse_policy(&policy, "unsupported_params"))
        .transpose()?
        .unwrap_or_default();
    let pricing = parse_pricing(body.pricing)?.flatten();
    let new = NewDeployment {
        name: &name,
        provider_kind: kind,
        base_url: &base_url,
        upstream_model: &model,
        api_key: api_key.as_deref(),
        fallbacks: &fallbacks,
        unsupported_tools,
        unsupported_params,
        max_tokens,
        pricing,
    };
    let deployment = state.store.create_deployment(&new).await?;
    tracing::info!(deployment.id = %deployment.id, "deployment created");
    Ok(Json(deployment.into()))
}

list_and_get! {
    DeploymentObject, "deployment";
    /// `GET /deployments`.
    list_deployments: list_deployments;
    /// `GET /deployments/{deployment_id}`.
    get_deployment: get_deployment;
}

/// `PATCH /deployments/{deployment_id}`: any of `name`, the provider's fields, `fallbacks`,
/// `unsupported_tools` and `pricing`; `provider.api_key: null` removes the key, `pricing: null` the prices.
/// Everything is checked before anything is written.
pub async fn update_deployment(
    State(state): State<AppState>,
    ApiPath(id): ApiPath<String>,
    AdminJson(body): AdminJson<DeploymentBody>,
) -> Result<Json<DeploymentObject>, ApiError> {
    let name = parse_changed(body.name, "name", EntityName::parse)?;
    let provider = not_null(body.provider, "provider")?;
    let (mut kind, mut base_url, mut model, mut api_key) = (None, None, None, None);
    let mut max_tokens = None;
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
        max_tokens = match provider.max_tokens {
            None => None,
            Some(None) => Some(None),
            Some(Some(n)) => Some(Some(parse_max_tokens(n)?)),
        };
    }
    let fallbacks = match not_null(body.fallbacks, "fallbacks")? {
        Some(names) => {
            let current = found(state.store.get_deployment(&id).await?, "deployment", &id)?;
            let own = name
                .as_ref()
                .map_or(current.name.as_str(), EntityName::as_str);
            Some(check_fallbacks(&state, names, own).await?)
        }
        None => None,
    };
    let unsupported_tools = not_null(body.unsupported_tools, "unsupported_tools")?
        .map(|policy| parse_policy(&policy, "unsupported_tools"))
        .transpose()?;
    let unsupported_params = not_null(body.unsupported_params, "unsupported_params")?
        .map(|policy| parse_policy(&policy, "unsupported_params"))
        .transpose()?;
    let pricing = parse_pricing(body.pricing)?;
    let changes = DeploymentChanges {
        name: name.as_ref(),
        provider_kind: kind,
        base_url: base_url.as_ref(),
        upstream_model: model.as_deref(),
        api_key: api_key.as_ref().map(Option::as_deref),
        fallbacks: fallbacks.as_deref(),
        unsupported_tools,
        unsupported_params,
        max_tokens,
        pricing,
    };
    let deployment = found(
        state.store.update_deployment(&id, &changes).await?,
        "deployment",
        &id,
    )?;
    tracing::info!(deployment.id = %deployment.id, "deployment updated");
    Ok(Json(deployment.into()))
}

/// The most `max_tokens` a deployment may default to.
const MAX_TOKENS_CEILING: i64 = 1_000_000;

fn parse_max_tokens(n: i64) -> Result<u32, ApiError> {
    if !(1..=MAX_TOKENS_CEILING).contains(&n) {
        return Err(ApiError::invalid(
            format!("'provider.max_tokens' must be between 1 and {MAX_TOKENS_CEILING}; got {n}."),
            Some("provider.max_tokens"),
            Some("invalid_value"),
        ));
    }
    Ok(n as u32)
}

/// A `pricing` field: absent keeps the prices (`None`), `null` removes them, an object replaces them.
fn parse_pricing(pricing: Option<Value>) -> Result<Option<Option<Pricing>>, ApiError> {
    Ok(pricing
        .map(|pricing| Pricing::parse(&pricing))
        .transpose()?)
}

/// An `unsupported_tools` or `unsupported_params` policy (`field`): `ignore` or `reject`.
fn parse_policy(policy: &str, field: &str) -> Result<UnsupportedTools, ApiError> {
    UnsupportedTools::parse(policy).ok_or_else(|| {
        ApiError::invalid(
            format!("'{field}' must be 'ignore' or 'reject'; got '{policy}'."),
            Some(field),
            Some("invalid_value"),
        )
    })
}

/// The most fallbacks a deployment may list.
const MAX_FALLBACKS: usize = 8;

/// Checks `fallbacks` of the deployment named `own`: existing deployments, each once, never itself.
async fn check_fallbacks(
    state: &AppState,
    names: Vec<String>,
    own: &str,
) -> Result<Vec<String>, ApiError> {
    let refuse = |message: String, index: Option<usize>| {
        let param = index.map_or("fallbacks".to_owned(), |i| format!("fallbacks[{i}]"));
        ApiError::invalid(message, Some(&param), Some("invalid_value"))
    };
    if names.len() > MAX_FALLBACKS {
        return Err(refuse(
            format!("At most {MAX_FALLBACKS} fallbacks may be listed."),
            None,
        ));
    }
    let known = state.store.list_deployments().await?;
    for (index, name) in names.iter().enumerate() {
        if name == own {
            return Err(refuse(
                "A deployment cannot be its own fallback.".into(),
                Some(index),
            ));
        }
        if names[..index].contains(name) {
            return Err(refuse(
                format!("Fallback '{name}' is listed twice."),
                Some(index),
            ));
        }
        if !known.iter().any(|d| &d.name == name) {
            return Err(refuse(
                format!("No deployment named '{name}'."),
                Some(index),
            ));
        }
    }
    Ok(names)
}

/// `POST /deployments/{deployment_id}/check`: one small call to its upstream, made as a response's would be;
/// answers whether the model answered, the latency, and the provider's own words (and a hint) when it did not.
pub async fn check_deployment(
    State(state): State<AppState>,
    super::ApiPath(id): super::ApiPath<String>,
) -> Result<Json<crate::engine::DeploymentCheck>, ApiError> {
    let Some(deployment) = state.store.deployment_by_id(&id).await? else {
        return Err(super::not_found("deployment", &id));
    };
    let check = state.engine.check_deployment(&deployment).await;
    tracing::info!(deployment.id = %id, ok = check.ok, latency_ms = check.latency_ms,
        failure = check.failure.unwrap_or("none"), "deployment checked");
    Ok(Json(check))
}

delete_by_id! {
    /// `DELETE /deployments/{deployment_id}`: refused while a deployment names it as a fallback or a group holds
    /// it, unless forced; forced, it leaves their fallbacks and groups.
    delete_deployment: remove_deployment, "deployment", "deployment", deployment.id,
    unless referred to
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
            fallbacks: "[\"backup\"]".into(),
            unsupported_tools: "ignore".into(),
            unsupported_params: "reject".into(),
            max_tokens: None,
            created_at: 1_735_689_600,
            input_per_mtok: None,
            cached_input_per_mtok: None,
            output_per_mtok: None,
        };
        assert_eq!(
            serde_json::to_value(DeploymentObject::from(row.clone())).unwrap(),
            json!({
                "id": "dep_1",
                "object": "deployment",
                "name": "gpt-4o",
                "provider": {"kind": "openai_chat", "base_url": "https://api.example.com/v1", "model": "gpt-4o-2024-08-06", "has_api_key": true},
                "fallbacks": ["backup"],
                "unsupported_tools": "ignore",
                "unsupported_params": "reject",
                "pricing": null,
                "created_at": 1_735_689_600,
            })
        );
        let priced = DeploymentRow {
            input_per_mtok: Some(2.5),
            output_per_mtok: Some(10.0),
            ..row.clone()
        };
        assert_eq!(
            serde_json::to_value(DeploymentObject::from(priced)).unwrap()["pricing"],
            json!({"input_per_mtok": 2.5, "output_per_mtok": 10.0})
        );
        let cached = DeploymentRow {
            input_per_mtok: Some(2.5),
            cached_input_per_mtok: Some(1.25),
            output_per_mtok: Some(10.0),
            ..row.clone()
        };
        assert_eq!(
            serde_json::to_value(DeploymentObject::from(cached)).unwrap()["pricing"],
            json!({"input_per_mtok": 2.5, "cached_input_per_mtok": 1.25, "output_per_mtok": 10.0})
        );
        let half = DeploymentRow {
            input_per_mtok: Some(2.5),
            ..row
        };
        assert_eq!(
            serde_json::to_value(DeploymentObject::from(half)).unwrap()["pricing"],
            Value::Null,
            "pricing is set only when input and output prices both are"
        );
    }
}
