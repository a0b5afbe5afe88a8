//! `/projects`: create, list, read, rename and delete tenants.

use axum::extract::State;
use axum::Json;
use gateway_core::entity::EntityName;
use serde::Serialize;

use super::{
    deleted, list, not_found, parse_changed, parse_required, AdminJson, ApiPath, Deleted, List,
    NameBody,
};
use crate::api::error::ApiError;
use crate::api::AppState;
use crate::store::admin::ProjectRow;

/// A project as the admin API shows it.
#[derive(Debug, Serialize)]
pub struct ProjectObject {
    id: String,
    object: &'static str,
    name: String,
    created_at: i64,
}

impl From<ProjectRow> for ProjectObject {
    fn from(row: ProjectRow) -> ProjectObject {
        ProjectObject {
            id: row.id,
            object: "project",
            name: row.name,
            created_at: row.created_at,
        }
    }
}

/// `POST /projects`.
pub async fn create_project(
    State(state): State<AppState>,
    AdminJson(body): AdminJson<NameBody>,
) -> Result<Json<ProjectObject>, ApiError> {
    let name = parse_required(body.name, "name", EntityName::parse)?;
    let project = state.store.create_project(&name).await?;
    tracing::info!(project.id = %project.id, "project created");
    Ok(Json(project.into()))
}

/// `GET /projects`.
pub async fn list_projects(
    State(state): State<AppState>,
) -> Result<Json<List<ProjectObject>>, ApiError> {
    Ok(list(state.store.list_projects().await?))
}

/// `GET /projects/{project_id}`.
pub async fn get_project(
    State(state): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<ProjectObject>, ApiError> {
    let project = state
        .store
        .get_project(&id)
        .await?
        .ok_or_else(|| not_found("project", &id))?;
    Ok(Json(project.into()))
}

/// `PATCH /projects/{project_id}`.
pub async fn update_project(
    State(state): State<AppState>,
    ApiPath(id): ApiPath<String>,
    AdminJson(body): AdminJson<NameBody>,
) -> Result<Json<ProjectObject>, ApiError> {
    let name = parse_changed(body.name, "name", EntityName::parse)?;
    let project = state
        .store
        .update_project(&id, name.as_ref())
        .await?
        .ok_or_else(|| not_found("project", &id))?;
    tracing::info!(project.id = %project.id, "project updated");
    Ok(Json(project.into()))
}

/// `DELETE /projects/{project_id}`: also deletes its keys, responses and group grants.
pub async fn delete_project(
    State(state): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<Deleted>, ApiError> {
    if !state.store.delete_project(&id).await? {
        return Err(not_found("project", &id));
    }
    tracing::info!(project.id = %id, "project deleted");
    Ok(deleted(id, "project"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_project_answers_the_documented_fields() {
        let row = ProjectRow {
            id: "proj_1".into(),
            name: "acme".into(),
            created_at: 1_735_689_600,
        };
        assert_eq!(
            serde_json::to_value(ProjectObject::from(row)).unwrap(),
            json!({"id": "proj_1", "object": "project", "name": "acme", "created_at": 1_735_689_600})
        );
    }

    #[test]
    fn lists_and_deletes_answer_their_envelopes() {
        let Json(listed) = list::<ProjectRow, ProjectObject>(Vec::new());
        assert_eq!(
            serde_json::to_value(listed).unwrap(),
            json!({"object": "list", "data": []})
        );
        let Json(gone) = deleted("proj_1".into(), "project");
        assert_eq!(
            serde_json::to_value(gone).unwrap(),
            json!({"id": "proj_1", "object": "project", "deleted": true})
        );
    }
}
