//! What a project gets: `GET /projects/{project_id}/resolution?model=M` (the deployment a create naming `M`
//! runs on, its fallbacks, and each server tool with its source and the groups that grant it, resolved as a
//! create resolves them), and `GET /tool_sources/{tool_source_id}/tools` (the tools a source offers now: an MCP
//! source's as its server lists them).

use axum::extract::State;
use axum::Json;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{found, ApiPath};
use crate::api::error::ApiError;
use crate::api::extract::ApiQuery;
use crate::api::AppState;

/// `?model=M`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelQuery {
    model: String,
}

#[derive(Debug, Serialize)]
pub struct ResolutionView {
    object: &'static str,
    project_id: String,
    model: String,
    deployment: DeploymentView,
    tools: Vec<ToolView>,
}

#[derive(Debug, Serialize)]
struct DeploymentView {
    id: String,
    name: String,
    kind: &'static str,
    upstream_model: String,
    /// Each fallback by name, with whether a deployment of that name exists.
    fallbacks: Vec<FallbackView>,
}

#[derive(Debug, Serialize)]
struct FallbackView {
    name: String,
    exists: bool,
}

#[derive(Debug, Serialize)]
struct ToolView {
    /// The name the model is offered.
    name: String,
    tool_source: String,
    tool_source_id: String,
    kind: &'static str,
    /// The groups that grant it to the project with this deployment.
    groups: Vec<String>,
}

/// `GET /projects/{project_id}/resolution?model=M`.
pub async fn project_resolution(
    State(state): State<AppState>,
    ApiPath(project_id): ApiPath<String>,
    ApiQuery(query): ApiQuery<ModelQuery>,
) -> Result<Json<ResolutionView>, ApiError> {
    found(
        state.store.get_project(&project_id).await?,
        "project",
        &project_id,
    )?;
    let Some(resolution) = state.store.resolve(&project_id, &query.model).await? else {
        return Err(ApiError {
            status: axum::http::StatusCode::NOT_FOUND,
            ..ApiError::invalid(
                format!(
                    "Project '{project_id}' has no deployment named '{}' in its groups.",
                    query.model
                ),
                Some("model"),
                Some("model_not_found"),
            )
        });
    };
    let deployment = resolution.deployment;
    let mut fallbacks = Vec::with_capacity(deployment.fallbacks.len());
    for name in &deployment.fallbacks {
        let exists = state.store.deployment_by_name(name).await?.is_some();
        fallbacks.push(FallbackView {
            name: name.clone(),
            exists,
        });
    }
    let mut tools = Vec::new();
    for source in resolution.tools {
        let groups = state
            .store
            .groups_granting(&project_id, &deployment.id, &source.id)
            .await?;
        let (source_id, source_name, kind) = (source.id.clone(), source.name.clone(), source.kind);
        for tool in state.engine.source_tools(source).await {
            tools.push(ToolView {
                name: tool.name,
                tool_source: source_name.clone(),
                tool_source_id: source_id.clone(),
                kind: kind.as_str(),
                groups: groups.clone(),
            });
        }
    }
    Ok(Json(ResolutionView {
        object: "project.resolution",
        project_id,
        model: query.model,
        deployment: DeploymentView {
            id: deployment.id.clone(),
            name: deployment.name.clone(),
            kind: deployment.provider_kind.as_str(),
            upstream_model: deployment.upstream_model.clone(),
            fallbacks,
        },
        tools,
    }))
}

#[derive(Debug, Serialize)]
pub struct SourceTools {
    object: &'static str,
    data: Vec<SourceTool>,
}

#[derive(Debug, Serialize)]
struct SourceTool {
    name: String,
    description: String,
    parameters: Value,
}

/// `GET /tool_sources/{tool_source_id}/tools`: the tools the source offers now. An MCP source's are listed from
/// its server (its cached list, as a create would use it), filtered by `allowed_tools` and prefixed; an MCP
/// server that cannot be listed offers none.
pub async fn source_tools(
    State(state): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<SourceTools>, ApiError> {
    let source = state
        .store
        .tool_sources_by_id(std::slice::from_ref(&id))
        .await?
        .pop();
    let source = found(source, "tool source", &id)?;
    let data = state
        .engine
        .source_tools(source)
        .await
        .into_iter()
        .map(|tool| SourceTool {
            name: tool.name,
            description: tool.description,
            parameters: tool.parameters,
        })
        .collect();
    Ok(Json(SourceTools {
        object: "list",
        data,
    }))
}
