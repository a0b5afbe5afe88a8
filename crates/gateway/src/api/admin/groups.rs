//! `/deployment_groups`: create, list, read, rename and delete groups, and attach or detach their members
//! (deployments, projects, tool sources).

use axum::extract::State;
use axum::Json;
use serde::Serialize;

use super::{not_found, ApiPath};
use crate::api::error::ApiError;
use crate::api::AppState;
use crate::store::admin::{GroupRow, Member, Membership};
use crate::store::StoreError;

/// A deployment group as the admin API shows it, with its members' ids, and each member with its name.
#[derive(Debug, Serialize)]
pub struct GroupObject {
    id: String,
    object: &'static str,
    name: String,
    deployment_ids: Vec<String>,
    project_ids: Vec<String>,
    tool_source_ids: Vec<String>,
    deployments: Vec<NamedMember>,
    projects: Vec<NamedMember>,
    tool_sources: Vec<NamedMember>,
    created_at: i64,
}

/// A member of a group (or a group), by id and name.
#[derive(Debug, Serialize)]
pub struct NamedMember {
    id: String,
    name: String,
}

impl NamedMember {
    pub fn new(id: String, name: String) -> NamedMember {
        NamedMember { id, name }
    }
}

/// Ids and names read in the same order, paired.
fn named(ids: &[String], names: Vec<String>) -> Vec<NamedMember> {
    ids.iter()
        .cloned()
        .zip(names)
        .map(|(id, name)| NamedMember { id, name })
        .collect()
}

impl From<GroupRow> for GroupObject {
    fn from(row: GroupRow) -> GroupObject {
        GroupObject {
            deployments: named(&row.deployment_ids, row.deployment_names),
            projects: named(&row.project_ids, row.project_names),
            tool_sources: named(&row.tool_source_ids, row.tool_source_names),
            id: row.id,
            object: "deployment_group",
            name: row.name,
            deployment_ids: row.deployment_ids,
            project_ids: row.project_ids,
            tool_source_ids: row.tool_source_ids,
            created_at: row.created_at,
        }
    }
}

create_and_rename! {
    GroupObject, "deployment group", group.id;
    /// `POST /deployment_groups`.
    create_group: create_group;
    /// `PATCH /deployment_groups/{group_id}`: renames the group.
    update_group: update_group;
}

list_and_get! {
    GroupObject, "deployment group";
    /// `GET /deployment_groups`.
    list_groups: list_groups;
    /// `GET /deployment_groups/{group_id}`.
    get_group: get_group;
}

delete_by_id! {
    /// `DELETE /deployment_groups/{group_id}`: refused while it holds projects, deployments or tool sources,
    /// unless forced; forced, it removes its memberships, not its members.
    delete_group: remove_group, "deployment group", "deployment_group", group.id,
    unless referred to
}

/// The answer to attaching or detaching a member: `{"group_id", "<kind>_id", "attached"}`.
#[derive(Debug, Serialize)]
pub struct MembershipObject {
    group_id: String,
    #[serde(flatten)]
    member: MemberId,
    attached: bool,
}

/// A member's id under the name of its kind's id field.
#[derive(Debug, Serialize)]
enum MemberId {
    #[serde(rename = "deployment_id")]
    Deployment(String),
    #[serde(rename = "project_id")]
    Project(String),
    #[serde(rename = "tool_source_id")]
    ToolSource(String),
}

impl MemberId {
    fn new(kind: Member, id: String) -> MemberId {
        match kind {
            Member::Deployment => MemberId::Deployment(id),
            Member::Project => MemberId::Project(id),
            Member::ToolSource => MemberId::ToolSource(id),
        }
    }
}

/// `PUT` (attach, `true`) or `DELETE` (detach, `false`) `/deployment_groups/{group_id}/<members>/{id}` for one
/// member kind: each handler is `membership` for its kind.
macro_rules! membership_handlers {
    ($($(#[$doc:meta])* $handler:ident: $kind:ident, $attach:literal;)+) => {$(
        $(#[$doc])*
        pub async fn $handler(
            State(state): State<AppState>,
            ApiPath(ids): ApiPath<(String, String)>,
        ) -> Result<Json<MembershipObject>, ApiError> {
            membership(&state, Member::$kind, ids, $attach).await
        }
    )+};
}

/// Attaches (`attach`) or detaches a member of the group.
async fn membership(
    state: &AppState,
    kind: Member,
    (group_id, member_id): (String, String),
    attach: bool,
) -> Result<Json<MembershipObject>, ApiError> {
    let outcome = if attach {
        state.store.attach_member(&group_id, kind, &member_id).await
    } else {
        state.store.detach_member(&group_id, kind, &member_id).await
    };
    let what = kind.as_str().replace('_', " ");
    match outcome {
        Ok(Membership::Done) => {}
        Ok(Membership::GroupMissing) => return Err(not_found("deployment group", &group_id)),
        Ok(Membership::MemberMissing) => return Err(not_found(&what, &member_id)),
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
    Ok(Json(MembershipObject {
        group_id,
        member: MemberId::new(kind, member_id),
        attached: attach,
    }))
}

membership_handlers! {
    /// `PUT /deployment_groups/{group_id}/deployments/{deployment_id}`.
    attach_deployment: Deployment, true;
    /// `DELETE /deployment_groups/{group_id}/deployments/{deployment_id}`.
    detach_deployment: Deployment, false;
    /// `PUT /deployment_groups/{group_id}/projects/{project_id}`: grants the project the group.
    attach_project: Project, true;
    /// `DELETE /deployment_groups/{group_id}/projects/{project_id}`: withdraws the grant.
    detach_project: Project, false;
}

/// `PUT /deployment_groups/{group_id}/tool_sources/{tool_source_id}`: `409` when one of its tool names is
/// already offered by another source that a key could see together with it.
pub async fn attach_tool_source(
    State(state): State<AppState>,
    ApiPath(ids): ApiPath<(String, String)>,
) -> Result<Json<MembershipObject>, ApiError> {
    let (group_id, source_id) = &ids;
    let beside = state.store.tool_sources_beside(group_id).await?;
    if !beside.iter().any(|s| &s.id == source_id) {
        let joining = state
            .store
            .tool_sources_by_id(std::slice::from_ref(source_id))
            .await?;
        if !joining.is_empty() {
            let new_names = state.engine.offered_tool_names(joining).await;
            let others = state.engine.offered_tool_names(beside).await;
            for (name, source) in &new_names {
                if let Some((_, other)) = others.iter().find(|(n, _)| n == name) {
                    return Err(ApiError::conflict(format!(
                        "Tool source '{source}' offers a tool named '{name}', which tool source '{other}' already \
                         offers to the projects and deployments of this group; rename one (or give an MCP source \
                         a 'name_prefix' or 'allowed_tools')."
                    )));
                }
            }
        }
    }
    membership(&state, Member::ToolSource, ids, true).await
}

membership_handlers! {
    /// `DELETE /deployment_groups/{group_id}/tool_sources/{tool_source_id}`.
    detach_tool_source: ToolSource, false;
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_group_answers_the_documented_fields_with_its_members() {
        let row = GroupRow {
            id: "grp_1".into(),
            name: "default".into(),
            created_at: 1_735_689_600,
            deployment_ids: vec!["dep_1".into()],
            project_ids: vec!["proj_1".into(), "proj_2".into()],
            tool_source_ids: Vec::new(),
            deployment_names: vec!["gpt".into()],
            project_names: vec!["acme".into(), "beta".into()],
            tool_source_names: Vec::new(),
        };
        assert_eq!(
            serde_json::to_value(GroupObject::from(row)).unwrap(),
            json!({
                "id": "grp_1",
                "object": "deployment_group",
                "name": "default",
                "deployment_ids": ["dep_1"],
                "project_ids": ["proj_1", "proj_2"],
                "tool_source_ids": [],
                "deployments": [{"id": "dep_1", "name": "gpt"}],
                "projects": [{"id": "proj_1", "name": "acme"}, {"id": "proj_2", "name": "beta"}],
                "tool_sources": [],
                "created_at": 1_735_689_600,
            })
        );
    }

    #[test]
    fn a_membership_names_the_member_by_its_kind() {
        for (kind, field) in [
            (Member::Deployment, "deployment_id"),
            (Member::Project, "project_id"),
            (Member::ToolSource, "tool_source_id"),
        ] {
            let answer = MembershipObject {
                group_id: "grp_1".into(),
                member: MemberId::new(kind, "m_1".into()),
                attached: true,
            };
            assert_eq!(
                serde_json::to_value(answer).unwrap(),
                json!({"group_id": "grp_1", field: "m_1", "attached": true})
            );
        }
    }
}
