//! Admin persistence, one module per entity: projects, API keys, deployments, deployment groups (with the
//! memberships that decide what a project may use) and tool sources; and what the console browses.
//!
//! Row structs never carry a secret: deployment API keys and tool-source secrets are written here but only
//! ever read back as `has_api_key` / `has_secret`, so no admin answer can leak them by accident. Rows derive
//! `sqlx::FromRow`, which is generic over the row type, so one derive reads both backends.

/// `pub async fn $name(&self, id: &str)`: the row of `$table` with that id, read with `$columns!()`.
macro_rules! row_by_id {
    ($(#[$doc:meta])* $name:ident -> $row:ty, $columns:ident, $table:literal) => {
        $(#[$doc])*
        pub async fn $name(&self, id: &str) -> Result<Option<$row>, StoreError> {
            self.select_by_id(
                concat!("SELECT ", $columns!(), " FROM ", $table, " WHERE id = $1"),
                id,
            )
            .await
        }
    };
}

/// `pub async fn $list(&self)`: every row of `$table` by name; and `$get`, as `row_by_id!`.
macro_rules! rows_by_name_and_id {
    ($row:ty, $columns:ident, $table:literal;
     $(#[$list_doc:meta])* $list:ident;
     $(#[$get_doc:meta])* $get:ident) => {
        $(#[$list_doc])*
        pub async fn $list(&self) -> Result<Vec<$row>, StoreError> {
            self.select_all(concat!("SELECT ", $columns!(), " FROM ", $table, " ORDER BY name"))
                .await
        }

        row_by_id! {
            $(#[$get_doc])*
            $get -> $row, $columns, $table
        }
    };
}

/// The governance columns of `api_keys` and `projects`, in `GovernanceColumns`' order.
macro_rules! governance_columns {
    () => {
        "rpm_limit, tpm_limit, max_concurrent, budget_usd, budget_period"
    };
}

/// Sets the governance columns from `$2` to `$11`, bound by `bind_governance_changes!`: each column a flag
/// (change it?) and its new value.
macro_rules! governance_set {
    () => {
        "rpm_limit = CASE WHEN $2 THEN $3 ELSE rpm_limit END,
         tpm_limit = CASE WHEN $4 THEN $5 ELSE tpm_limit END,
         max_concurrent = CASE WHEN $6 THEN $7 ELSE max_concurrent END,
         budget_usd = CASE WHEN $8 THEN $9 ELSE budget_usd END,
         budget_period = CASE WHEN $10 THEN $11 ELSE budget_period END"
    };
}

/// Binds the values of `governance_columns!` from a `Governance`.
macro_rules! bind_governance {
    ($query:expr, $governance:expr) => {{
        let governance: &gateway_core::governance::Governance = $governance;
        $query
            .bind($crate::store::admin::governed::limit_column(
                governance.limits.rpm,
            ))
            .bind($crate::store::admin::governed::limit_column(
                governance.limits.tpm,
            ))
            .bind($crate::store::admin::governed::limit_column(
                governance.limits.max_concurrent,
            ))
            .bind(governance.budget.map(|b| b.usd))
            .bind(governance.budget.map(|b| b.period.as_str()))
    }};
}

/// Binds `$2` to `$11` of `governance_set!` from a `GovernanceChanges`.
macro_rules! bind_governance_changes {
    ($query:expr, $changes:expr) => {{
        let changes: &$crate::store::admin::governed::GovernanceChanges = $changes;
        let limits = changes.limits;
        $query
            .bind(limits.rpm.is_some())
            .bind($crate::store::admin::governed::limit_column(
                limits.rpm.flatten(),
            ))
            .bind(limits.tpm.is_some())
            .bind($crate::store::admin::governed::limit_column(
                limits.tpm.flatten(),
            ))
            .bind(limits.max_concurrent.is_some())
            .bind($crate::store::admin::governed::limit_column(
                limits.max_concurrent.flatten(),
            ))
            .bind(changes.budget.is_some())
            .bind(changes.budget.flatten().map(|b| b.usd))
            .bind(changes.budget.is_some())
            .bind(changes.budget.flatten().map(|b| b.period.as_str()))
    }};
}

mod api_keys;
mod browse;
mod console_sessions;
mod deployments;
mod governed;
mod groups;
mod projects;
mod references;
mod tool_calls;
mod tool_sources;

pub use api_keys::{ApiKeyChanges, ApiKeyRow, NewApiKey};
pub use browse::{ResponseFilter, ResponseSummary, StepLedger, ToolCallSample};
pub use deployments::{DeploymentChanges, DeploymentRow, NewDeployment};
pub use governed::{GovernanceChanges, GovernanceColumns};
pub use groups::{GroupRow, Member, Membership};
pub use projects::{ProjectChanges, ProjectRow};
pub use references::Removal;
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
}
