//! `/deployment_groups`: create, list, read, rename and delete groups, and attach or detach their members
//! (deployments, projects, tool sources).

use axum::extract::State;
use axum::Json;
use gateway_core::entity::EntityName;
use serde_json::{json, Value};

use super::{deleted, entity_name, list, not_found, required, AdminJson, Ids, NameBody};
use crate::api::error::ApiError;
use crate::api::AppState;
use crate::store::admin::{GroupRow, Member, Membership};
use crate::store::StoreError;

fn group_object(g: &GroupRow) -> Value {
    json!({
        "id": g.id,
        "object": "deployment_group",
        "name": g.name,
        "deployment_ids": g.deployment_ids,
        "project_ids": g.project_ids,
        "tool_source_ids": g.tool_source_ids,
        "created_at": g.created_at,
    })
}

/// `POST /deployment_groups`.
pub async fn create_group(
    State(state): State<AppState>,
    AdminJson(body): AdminJson<NameBody>,
) -> Result<Json<Value>, ApiError> {
    let name = EntityName::parse(required(body.name, "name")?, "name")?;
    let group = state.store.create_group(&name).await?;
    tracing::info!(group.id = %group.id, "deployment group created");
    Ok(Json(group_object(&group)))
}

/// `GET /deployment_groups`.
pub async fn list_groups(State(state): State<AppState>) -> Result<Json<Value>, ApiError> {
    let groups = state.store.list_groups().await?;
    Ok(list(groups.iter().map(group_object).collect()))
}

/// `GET /deployment_groups/{group_id}`.
pub async fn get_group(
    State(state): State<AppState>,
    Ids(id): Ids<String>,
) -> Result<Json<Value>, ApiError> {
    let group = state
        .store
        .get_group(&id)
        .await?
        .ok_or_else(|| not_found("deployment group", &id))?;
    Ok(Json(group_object(&group)))
}

/// `PATCH /deployment_groups/{group_id}`: renames the group.
pub async fn update_group(
    State(state): State<AppState>,
    Ids(id): Ids<String>,
    AdminJson(body): AdminJson<NameBody>,
) -> Result<Json<Value>, ApiError> {
    let name = entity_name(body.name)?;
    let group = state
        .store
        .update_group(&id, name.as_ref())
        .await?
        .ok_or_else(|| not_found("deployment group", &id))?;
    tracing::info!(group.id = %group.id, "deployment group updated");
    Ok(Json(group_object(&group)))
}

/// `DELETE /deployment_groups/{group_id}`: removes its memberships, not its members.
pub async fn delete_group(
    State(state): State<AppState>,
    Ids(id): Ids<String>,
) -> Result<Json<Value>, ApiError> {
    if !state.store.delete_group(&id).await? {
        return Err(not_found("deployment group", &id));
    }
    tracing::info!(group.id = %id, "deployment group deleted");
    Ok(deleted(&id, "deployment_group"))
}

/// Attaches (`attach`) or detaches a member and renders `{"group_id", "<kind>_id", "attached"}`.
async fn membership(
    state: &AppState,
    kind: Member,
    group_id: &str,
    member_id: &str,
    attach: bool,
) -> Result<Json<Value>, ApiError> {
    let outcome = if attach {
        state.store.attach_member(group_id, kind, member_id).await
    } else {
        state.store.detach_member(group_id, kind, member_id).await
    };
    let what = kind.as_str().replace('_', " ");
    match outcome {
        Ok(Membership::Done) => {}
        Ok(Membership::GroupMissing) => return Err(not_found("deployment group", group_id)),
        Ok(Membership::MemberMissing) => return Err(not_found(&what, member_id)),
        Ok(Membership::NotAttached) => {
            return Err(ApiError::not_found(format!(
                "The {what} '{member_id}' is not attached to deployment group '{group_id}'."
            )))
        }
        // A concurrent delete of the group or the member.
        Err(StoreError::NotFound) => {
            return Err(ApiError::not_found(format!(
                "No deployment group '{group_id}' or {what} '{member_id}'."
            )))
        }
        Err(e) => return Err(e.into()),
    }
    tracing::info!(group.id = %group_id, member.kind = kind.as_str(), member.id = %member_id, attached = attach, "group membership changed");
    let mut answer = serde_json::Map::new();
    answer.insert("group_id".into(), json!(group_id));
    answer.insert(format!("{}_id", kind.as_str()), json!(member_id));
    answer.insert("attached".into(), json!(attach));
    Ok(Json(Value::Object(answer)))
}

/// `PUT /deployment_groups/{group_id}/deployments/{deployment_id}`.
pub async fn attach_deployment(
    State(state): State<AppState>,
    Ids((group_id, member_id)): Ids<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    membership(&state, Member::Deployment, &group_id, &member_id, true).await
}

/// `DELETE /deployment_groups/{group_id}/deployments/{deployment_id}`.
pub async fn detach_deployment(
    State(state): State<AppState>,
    Ids((group_id, member_id)): Ids<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    membership(&state, Member::Deployment, &group_id, &member_id, false).await
}

/// `PUT /deployment_groups/{group_id}/projects/{project_id}`: grants the project the group.
pub async fn attach_project(
    State(state): State<AppState>,
    Ids((group_id, member_id)): Ids<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    membership(&state, Member::Project, &group_id, &member_id, true).await
}

/// `DELETE /deployment_groups/{group_id}/projects/{project_id}`: withdraws the grant.
pub async fn detach_project(
    State(state): State<AppState>,
    Ids((group_id, member_id)): Ids<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    membership(&state, Member::Project, &group_id, &member_id, false).await
}

/// `PUT /deployment_groups/{group_id}/tool_sources/{tool_source_id}`.
pub async fn attach_tool_source(
    State(state): State<AppState>,
    Ids((group_id, member_id)): Ids<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    membership(&state, Member::ToolSource, &group_id, &member_id, true).await
}

/// `DELETE /deployment_groups/{group_id}/tool_sources/{tool_source_id}`.
pub async fn detach_tool_source(
    State(state): State<AppState>,
    Ids((group_id, member_id)): Ids<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    membership(&state, Member::ToolSource, &group_id, &member_id, false).await
}
