//! Projects (tenants): the owners of API keys and responses, with the limits and budget they are held to.

use gateway_core::entity::EntityName;
use gateway_core::governance::Governance;

use super::governed::{GovernanceChanges, GovernanceColumns};
use crate::clock::now;
use crate::ids::new_id;
use crate::store::{Backend, Store, StoreError};

/// A project (tenant).
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct ProjectRow {
    pub id: String,
    pub name: String,
    pub created_at: i64,
    #[sqlx(flatten)]
    pub governance: GovernanceColumns,
}

/// Changes to a project; the default changes nothing.
#[derive(Debug, Clone, Default)]
pub struct ProjectChanges<'a> {
    pub name: Option<&'a EntityName>,
    pub governance: GovernanceChanges,
}

/// The columns of a `ProjectRow`.
macro_rules! project_columns {
    () => {
        concat!("id, name, created_at, ", governance_columns!())
    };
}

impl Store {
    /// Creates a project held to `governance`; `Conflict` when the name is taken.
    pub async fn create_project(
        &self,
        name: &EntityName,
        governance: &Governance,
    ) -> Result<ProjectRow, StoreError> {
        with_pool!(self, |pool| bind_governance!(
            sqlx::query_as::<_, ProjectRow>(concat!(
                "INSERT INTO projects (id, name, created_at, ",
                governance_columns!(),
                ") VALUES ($1, $2, $3, $4, $5, $6, $7, $8) RETURNING ",
                project_columns!()
            ))
            .bind(new_id("proj"))
            .bind(name.as_str())
            .bind(now()),
            governance
        )
        .fetch_one(pool)
        .await)
        .map_err(|e| StoreError::from_write(e, &taken(name.as_str())))
    }

    rows_by_name_and_id! {
        ProjectRow, project_columns, "projects";
        /// Every project, by name.
        list_projects;
        /// One project.
        get_project
    }

    /// Applies changes to a project in one write; `Ok(None)` when there is no such project.
    pub async fn update_project(
        &self,
        id: &str,
        changes: &ProjectChanges<'_>,
    ) -> Result<Option<ProjectRow>, StoreError> {
        let name = changes.name.map(EntityName::as_str);
        with_pool!(self, |pool| bind_governance_changes!(
            sqlx::query_as::<_, ProjectRow>(concat!(
                "UPDATE projects SET ",
                governance_set!(),
                ", name = COALESCE($12, name) WHERE id = $1 RETURNING ",
                project_columns!()
            ))
            .bind(id),
            &changes.governance
        )
        .bind(name)
        .fetch_optional(pool)
        .await)
        .map_err(|e| StoreError::from_write(e, &taken(name.unwrap_or(""))))
    }

    /// Deletes a project with its keys, responses (with their steps and items) and group grants; `false` when
    /// there was none.
    pub async fn delete_project(&self, id: &str) -> Result<bool, StoreError> {
        // Keys, grants and responses go by their foreign keys' cascade; steps and items have none on Postgres
        // (migration 0016) and go first. On Postgres the project's row is locked before: a response written
        // meanwhile checks its foreign key to the project, so it either committed before the lock (and its
        // steps are seen and deleted here) or waits and then fails for want of the project. Then its responses'
        // rows, in the order a step write locks them, before any step row: a run writing steps finishes first
        // instead of waiting on a step row locked here while this waits on its response (a deadlock).
        let locks: &[&str] = match &self.backend {
            Backend::Postgres(_) => &[
                "SELECT 1 FROM projects WHERE id = $1 FOR UPDATE",
                "SELECT 1 FROM responses WHERE project_id = $1 ORDER BY created_at, id FOR UPDATE",
            ],
            Backend::Sqlite(_) => &[],
        };
        let deleted = with_pool!(self, |pool| {
            let mut tx = pool.begin().await?;
            for statement in locks.iter().copied().chain([
                "DELETE FROM steps WHERE response_id IN (SELECT id FROM responses WHERE project_id = $1)",
                "DELETE FROM response_input_items
                 WHERE response_id IN (SELECT id FROM responses WHERE project_id = $1)",
            ]) {
                sqlx::query(statement).bind(id).execute(&mut *tx).await?;
            }
            let deleted = sqlx::query("DELETE FROM projects WHERE id = $1")
                .bind(id)
                .execute(&mut *tx)
                .await?
                .rows_affected();
            tx.commit().await?;
            Ok::<_, sqlx::Error>(deleted)
        })?;
        Ok(deleted > 0)
    }
}

fn taken(name: &str) -> String {
    format!("A project named '{name}' already exists.")
}
