//! `/projects`: create, list, read, change (name, limits, budget) and delete tenants.

use axum::extract::State;
use axum::Json;
use gateway_core::entity::EntityName;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::governed::{governance, governance_changes, GovernanceObject};
use super::{found, nullable, parse_changed, parse_required, present, AdminJson, ApiPath};
use crate::api::error::ApiError;
use crate::api::AppState;
use crate::store::admin::{ProjectChanges, ProjectRow};

/// `{"name", "limits", "budget"}` of a project.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProjectBody {
    #[serde(default, deserialize_with = "nullable")]
    name: Option<Option<String>>,
    #[serde(default, deserialize_with = "present")]
    limits: Option<Value>,
    #[serde(default, deserialize_with = "present")]
    budget: Option<Value>,
}

/// A project as the admin API shows it.
#[derive(Debug, Serialize)]
pub struct ProjectObject {
    id: String,
    object: &'static str,
    name: String,
    created_at: i64,
    #[serde(flatten)]
    governance: GovernanceObject,
}

impl From<ProjectRow> for ProjectObject {
    fn from(row: ProjectRow) -> ProjectObject {
        ProjectObject {
            governance: GovernanceObject::from(&row.governance),
            id: row.id,
            object: "project",
            name: row.name,
            created_at: row.created_at,
        }
    }
}

/// `POST /projects`: `limits` and `budget` are optional.
pub async fn create_project(
    State(state): State<AppState>,
    AdminJson(body): AdminJson<ProjectBody>,
) -> Result<Json<ProjectObject>, ApiError> {
    let name = parse_required(body.name, "name", EntityName::parse)?;
    let governance = governance(body.limits, body.budget)?;
    let row = state.store.create_project(&name, &governance).await?;
    tracing::info!(project.id = %row.id, "project created");
    Ok(Json(row.into()))
}

/// `PATCH /projects/{project_id}`: any of `name`, `limits` (merged) and `budget` (replaced; `null` removes it),
/// all checked before anything is written.
pub async fn update_project(
    State(state): State<AppState>,
    ApiPath(id): ApiPath<String>,
    AdminJson(body): AdminJson<ProjectBody>,
) -> Result<Json<ProjectObject>, ApiError> {
    let name = parse_changed(body.name, "name", EntityName::parse)?;
    let changes = ProjectChanges {
        name: name.as_ref(),
        governance: governance_changes(body.limits, body.budget)?,
    };
    let row = found(
        state.store.update_project(&id, &changes).await?,
        "project",
        &id,
    )?;
    tracing::info!(project.id = %row.id, "project updated");
    Ok(Json(row.into()))
}

list_and_get! {
    ProjectObject, "project";
    /// `GET /projects`.
    list_projects: list_projects;
    /// `GET /projects/{project_id}`.
    get_project: get_project;
}

delete_by_id! {
    /// `DELETE /projects/{project_id}`: also deletes its keys, responses and group grants.
    delete_project: delete_project, "project", "project", project.id
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::admin::{deleted, list};
    use crate::store::admin::GovernanceColumns;
    use serde_json::json;

    #[test]
    fn a_project_answers_the_documented_fields() {
        let row = ProjectRow {
            id: "proj_1".into(),
            name: "acme".into(),
            created_at: 1_735_689_600,
            governance: GovernanceColumns::default(),
        };
        assert_eq!(
            serde_json::to_value(ProjectObject::from(row.clone())).unwrap(),
            json!({
                "id": "proj_1", "object": "project", "name": "acme", "created_at": 1_735_689_600,
                "limits": {"rpm": null, "tpm": null, "max_concurrent": null}, "budget": null,
            })
        );
        let governed = ProjectRow {
            governance: GovernanceColumns {
                rpm_limit: Some(60),
                tpm_limit: None,
                max_concurrent: Some(2),
                budget_usd: Some(10.5),
                budget_period: Some("month".into()),
            },
            ..row
        };
        assert_eq!(
            serde_json::to_value(ProjectObject::from(governed)).unwrap(),
            json!({
                "id": "proj_1", "object": "project", "name": "acme", "created_at": 1_735_689_600,
                "limits": {"rpm": 60, "tpm": null, "max_concurrent": 2},
                "budget": {"usd": 10.5, "period": "month"},
            })
        );
    }

    #[test]
    fn a_body_tells_a_field_given_as_null_from_one_left_out() {
        let null: ProjectBody = serde_json::from_value(json!({"limits": null})).unwrap();
        assert_eq!(null.limits, Some(Value::Null));
        assert_eq!(null.budget, None);
        let given: ProjectBody =
            serde_json::from_value(json!({"budget": {"usd": 1, "period": "day"}})).unwrap();
        assert_eq!(given.budget, Some(json!({"usd": 1, "period": "day"})));
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
