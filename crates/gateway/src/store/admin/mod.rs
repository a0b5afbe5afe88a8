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

/// A row both backends read: `sqlx::FromRow` for Postgres and SQLite rows.
trait AdminRow:
    for<'r> sqlx::FromRow<'r, sqlx::postgres::PgRow>
    + for<'r> sqlx::FromRow<'r, sqlx::sqlite::SqliteRow>
    + Send
    + Unpin
{
}

impl<R> AdminRow for R where
    R: for<'r> sqlx::FromRow<'r, sqlx::postgres::PgRow>
        + for<'r> sqlx::FromRow<'r, sqlx::sqlite::SqliteRow>
        + Send
        + Unpin
{
}

impl Store {
    /// Runs a `SELECT` without parameters; every row it reads.
    async fn select_all<R: AdminRow>(&self, sql: &'static str) -> Result<Vec<R>, StoreError> {
        Ok(with_pool!(self, |pool| sqlx::query_as::<_, R>(sql)
            .fetch_all(pool)
            .await)?)
    }

    /// Runs a `SELECT ... WHERE id = $1`; the row, if there is one.
    async fn select_by_id<R: AdminRow>(
        &self,
        sql: &'static str,
        id: &str,
    ) -> Result<Option<R>, StoreError> {
        Ok(with_pool!(self, |pool| sqlx::query_as::<_, R>(sql)
            .bind(id)
            .fetch_optional(pool)
            .await)?)
    }

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
