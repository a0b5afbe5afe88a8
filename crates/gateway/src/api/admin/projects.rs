//! `/projects`: create, list, read, rename and delete tenants.

use axum::extract::State;
use axum::Json;
use gateway_core::entity::EntityName;
use serde_json::{json, Value};

use super::{deleted, entity_name, list, not_found, required, AdminJson, Ids, NameBody};
use crate::api::error::ApiError;
use crate::api::AppState;
use crate::store::admin::ProjectRow;

fn project_object(p: &ProjectRow) -> Value {
    json!({"id": p.id, "object": "project", "name": p.name, "created_at": p.created_at})
}

/// `POST /projects`.
pub async fn create_project(
    State(state): State<AppState>,
    AdminJson(body): AdminJson<NameBody>,
) -> Result<Json<Value>, ApiError> {
    let name = EntityName::parse(required(body.name, "name")?, "name")?;
    let project = state.store.create_project(&name).await?;
    tracing::info!(project.id = %project.id, "project created");
    Ok(Json(project_object(&project)))
}

/// `GET /projects`.
pub async fn list_projects(State(state): State<AppState>) -> Result<Json<Value>, ApiError> {
    let projects = state.store.list_projects().await?;
    Ok(list(projects.iter().map(project_object).collect()))
}

/// `GET /projects/{project_id}`.
pub async fn get_project(
    State(state): State<AppState>,
    Ids(id): Ids<String>,
) -> Result<Json<Value>, ApiError> {
    let project = state
        .store
        .get_project(&id)
        .await?
        .ok_or_else(|| not_found("project", &id))?;
    Ok(Json(project_object(&project)))
}

/// `PATCH /projects/{project_id}`.
pub async fn update_project(
    State(state): State<AppState>,
    Ids(id): Ids<String>,
    AdminJson(body): AdminJson<NameBody>,
) -> Result<Json<Value>, ApiError> {
    let name = entity_name(body.name)?;
    let project = state
        .store
        .update_project(&id, name.as_ref())
        .await?
        .ok_or_else(|| not_found("project", &id))?;
    tracing::info!(project.id = %project.id, "project updated");
    Ok(Json(project_object(&project)))
}

/// `DELETE /projects/{project_id}`: also deletes its keys, responses and group grants.
pub async fn delete_project(
    State(state): State<AppState>,
    Ids(id): Ids<String>,
) -> Result<Json<Value>, ApiError> {
    if !state.store.delete_project(&id).await? {
        return Err(not_found("project", &id));
    }
    tracing::info!(project.id = %id, "project deleted");
    Ok(deleted(&id, "project"))
}
