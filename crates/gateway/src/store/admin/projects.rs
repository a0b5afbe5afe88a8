//! Projects (tenants): the owners of API keys and responses.

use gateway_core::entity::EntityName;

use crate::clock::now;
use crate::ids::new_id;
use crate::store::{Store, StoreError};

/// A project (tenant).
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct ProjectRow {
    pub id: String,
    pub name: String,
    pub created_at: i64,
}

impl Store {
    /// Creates a project; `Conflict` when the name is taken.
    pub async fn create_project(&self, name: &EntityName) -> Result<ProjectRow, StoreError> {
        with_pool!(self, |pool| sqlx::query_as::<_, ProjectRow>(
            "INSERT INTO projects (id, name, created_at) VALUES ($1, $2, $3) RETURNING id, name, created_at"
        )
        .bind(new_id("proj"))
        .bind(name.as_str())
        .bind(now())
        .fetch_one(pool)
        .await)
        .map_err(|e| StoreError::from_write(e, &taken(name.as_str())))
    }

    /// Every project, by name.
    pub async fn list_projects(&self) -> Result<Vec<ProjectRow>, StoreError> {
        self.select_all("SELECT id, name, created_at FROM projects ORDER BY name")
            .await
    }

    /// One project.
    pub async fn get_project(&self, id: &str) -> Result<Option<ProjectRow>, StoreError> {
        self.select_by_id(
            "SELECT id, name, created_at FROM projects WHERE id = $1",
            id,
        )
        .await
    }

    /// Renames a project (`None` keeps the name); `Ok(None)` when there is no such project.
    pub async fn update_project(
        &self,
        id: &str,
        name: Option<&EntityName>,
    ) -> Result<Option<ProjectRow>, StoreError> {
        with_pool!(self, |pool| sqlx::query_as::<_, ProjectRow>(
            "UPDATE projects SET name = COALESCE($2, name) WHERE id = $1 RETURNING id, name, created_at"
        )
        .bind(id)
        .bind(name.map(EntityName::as_str))
        .fetch_optional(pool)
        .await)
        .map_err(|e| StoreError::from_write(e, &taken(name.map_or("", EntityName::as_str))))
    }

    /// Deletes a project with its keys, responses and group grants; `false` when there was none.
    pub async fn delete_project(&self, id: &str) -> Result<bool, StoreError> {
        self.delete_by_id("DELETE FROM projects WHERE id = $1", id)
            .await
    }
}

fn taken(name: &str) -> String {
    format!("A project named '{name}' already exists.")
}
