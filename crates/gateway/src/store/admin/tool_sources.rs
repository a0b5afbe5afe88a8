//! Tool sources: server tools, each a function the model sees and the HTTP endpoint that runs it. The secret
//! is written here and only read back as `has_secret`.

use gateway_core::entity::{HttpUrl, TimeoutMs, ToolName, ToolParameters};
use serde_json::Value;

use crate::clock::now;
use crate::ids::new_id;
use crate::store::{Store, StoreError};

/// A tool source, without its secret.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct ToolSourceRow {
    pub id: String,
    pub name: String,
    pub description: String,
    pub parameters: Value,
    pub url: String,
    pub timeout_ms: i64,
    pub strict: bool,
    pub has_secret: bool,
    pub created_at: i64,
}

/// A tool source to create.
#[derive(Debug, Clone)]
pub struct NewToolSource<'a> {
    pub name: &'a ToolName,
    pub description: &'a str,
    pub parameters: &'a ToolParameters,
    pub url: &'a HttpUrl,
    pub timeout_ms: TimeoutMs,
    pub secret: Option<&'a str>,
    pub strict: bool,
}

/// Changes to a tool source; `None` leaves a field as it is.
#[derive(Debug, Clone, Default)]
pub struct ToolSourceChanges<'a> {
    pub name: Option<&'a ToolName>,
    pub description: Option<&'a str>,
    pub parameters: Option<&'a ToolParameters>,
    pub url: Option<&'a HttpUrl>,
    pub timeout_ms: Option<TimeoutMs>,
    /// `Some(None)` clears the secret, `Some(Some(s))` replaces it.
    pub secret: Option<Option<&'a str>>,
    pub strict: Option<bool>,
}

/// The columns of a `ToolSourceRow`: whether there is a secret, never the secret.
macro_rules! tool_source_columns {
    () => {
        "id, name, description, parameters, url, timeout_ms, strict, (secret IS NOT NULL) AS has_secret, created_at"
    };
}

impl Store {
    /// Creates a tool source; `Conflict` when the name is taken.
    pub async fn create_tool_source(
        &self,
        new: &NewToolSource<'_>,
    ) -> Result<ToolSourceRow, StoreError> {
        with_pool!(self, |pool| sqlx::query_as::<_, ToolSourceRow>(concat!(
            "INSERT INTO tool_sources (id, name, description, parameters, url, timeout_ms, secret, strict, created_at)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
             RETURNING ",
            tool_source_columns!()
        ))
        .bind(new_id("tool"))
        .bind(new.name.as_str())
        .bind(new.description)
        .bind(new.parameters.as_value())
        .bind(new.url.as_str())
        .bind(millis(new.timeout_ms))
        .bind(new.secret)
        .bind(new.strict)
        .bind(now())
        .fetch_one(pool)
        .await)
        .map_err(|e| StoreError::from_write(e, &taken(new.name.as_str())))
    }

    /// Every tool source, by name.
    pub async fn list_tool_sources(&self) -> Result<Vec<ToolSourceRow>, StoreError> {
        Ok(with_pool!(self, |pool| {
            sqlx::query_as::<_, ToolSourceRow>(concat!(
                "SELECT ",
                tool_source_columns!(),
                " FROM tool_sources ORDER BY name"
            ))
            .fetch_all(pool)
            .await
        })?)
    }

    /// One tool source.
    pub async fn get_tool_source(&self, id: &str) -> Result<Option<ToolSourceRow>, StoreError> {
        Ok(with_pool!(self, |pool| {
            sqlx::query_as::<_, ToolSourceRow>(concat!(
                "SELECT ",
                tool_source_columns!(),
                " FROM tool_sources WHERE id = $1"
            ))
            .bind(id)
            .fetch_optional(pool)
            .await
        })?)
    }

    /// Applies changes to a tool source; `Ok(None)` when there is no such tool source.
    pub async fn update_tool_source(
        &self,
        id: &str,
        changes: &ToolSourceChanges<'_>,
    ) -> Result<Option<ToolSourceRow>, StoreError> {
        with_pool!(self, |pool| sqlx::query_as::<_, ToolSourceRow>(concat!(
            "UPDATE tool_sources SET
                name = COALESCE($2, name),
                description = COALESCE($3, description),
                parameters = COALESCE($4, parameters),
                url = COALESCE($5, url),
                timeout_ms = COALESCE($6, timeout_ms),
                secret = CASE WHEN $7 THEN $8 ELSE secret END,
                strict = COALESCE($9, strict)
             WHERE id = $1
             RETURNING ",
            tool_source_columns!()
        ))
        .bind(id)
        .bind(changes.name.map(ToolName::as_str))
        .bind(changes.description)
        .bind(changes.parameters.map(ToolParameters::as_value))
        .bind(changes.url.map(HttpUrl::as_str))
        .bind(changes.timeout_ms.map(millis))
        .bind(changes.secret.is_some())
        .bind(changes.secret.flatten())
        .bind(changes.strict)
        .fetch_optional(pool)
        .await)
        .map_err(|e| StoreError::from_write(e, &taken(changes.name.map_or("", ToolName::as_str))))
    }

    /// Deletes a tool source and its group attachments; `false` when there was none.
    pub async fn delete_tool_source(&self, id: &str) -> Result<bool, StoreError> {
        self.delete_by_id("DELETE FROM tool_sources WHERE id = $1", id)
            .await
    }
}

/// A timeout as the `BIGINT` column keeps it.
fn millis(timeout: TimeoutMs) -> i64 {
    // At most `TimeoutMs::MAX` (ten minutes), so it always fits.
    i64::try_from(timeout.get()).unwrap_or(i64::MAX)
}

fn taken(name: &str) -> String {
    format!("A tool source named '{name}' already exists.")
}
