//! Admin persistence, one module per entity: projects, API keys, deployments, deployment groups (with the
//! memberships that decide what a project may use) and tool sources.
//!
//! Row structs never carry a secret: deployment API keys and tool-source secrets are written here but only
//! ever read back as `has_api_key` / `has_secret`, so no admin answer can leak them by accident. Rows derive
//! `sqlx::FromRow`, which is generic over the row type, so one derive reads both backends.

mod api_keys;
mod deployments;
mod groups;
mod projects;
mod tool_calls;
mod tool_sources;

pub use api_keys::{ApiKeyRow, NewApiKey};
pub use deployments::{DeploymentChanges, DeploymentRow, NewDeployment};
pub use groups::{GroupRow, Member, Membership};
pub use projects::ProjectRow;
pub use tool_calls::{AuditedResponse, StepAttempts};
pub use tool_sources::{NewToolSource, ToolSourceChanges, ToolSourceRow};

use super::{Store, StoreError};

impl Store {
    /// Runs a `DELETE ... WHERE id = $1`; whether it deleted a row.
    async fn delete_by_id(&self, sql: &'static str, id: &str) -> Result<bool, StoreError> {
        let deleted = with_pool!(self, |pool| sqlx::query(sql)
            .bind(id)
            .execute(pool)
            .await?
            .rows_affected());
        Ok(deleted > 0)
    }
}
