//! `/projects`: create, list, read, rename and delete tenants.

use serde::Serialize;

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

create_and_rename! {
    ProjectObject, "project", project.id;
    /// `POST /projects`.
    create_project: create_project;
    /// `PATCH /projects/{project_id}`.
    update_project: update_project;
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
    use axum::Json;
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
