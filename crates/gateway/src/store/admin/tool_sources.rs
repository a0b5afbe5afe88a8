//! Tool sources: server tools, each a function the model sees and the HTTP endpoint that runs it. The secret
//! is written here and only read back as `has_secret`.

use gateway_core::entity::{
    HttpUrl, NoteTemplate, TimeoutMs, ToolName, ToolParameters, ToolPolicy,
};
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
    pub max_in_flight: Option<i64>,
    pub max_output_bytes: Option<i64>,
    pub breaker_failures: Option<i64>,
    pub breaker_cooldown_ms: Option<i64>,
    pub note_on_request: Option<String>,
    pub note_on_result: Option<String>,
    pub hosted_type: Option<String>,
    pub kind: String,
    pub allowed_tools: Option<Value>,
    pub name_prefix: Option<String>,
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
    pub policy: ToolPolicy,
    pub note_on_request: Option<&'a NoteTemplate>,
    pub note_on_result: Option<&'a NoteTemplate>,
    pub hosted_type: Option<&'a str>,
    /// `http` or `mcp`.
    pub kind: &'a str,
    pub allowed_tools: Option<&'a [String]>,
    pub name_prefix: Option<&'a str>,
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
    /// For each of these, `Some(None)` returns to the default (or removes the note or binding).
    pub max_in_flight: Option<Option<u32>>,
    pub max_output_bytes: Option<Option<u64>>,
    pub breaker_failures: Option<Option<u32>>,
    pub breaker_cooldown_ms: Option<Option<u64>>,
    pub note_on_request: Option<Option<&'a NoteTemplate>>,
    pub note_on_result: Option<Option<&'a NoteTemplate>>,
    pub hosted_type: Option<Option<&'a str>>,
    pub allowed_tools: Option<Option<&'a [String]>>,
    pub name_prefix: Option<Option<&'a str>>,
}

/// The columns of a `ToolSourceRow`: whether there is a secret, never the secret.
macro_rules! tool_source_columns {
    () => {
        "id, name, description, parameters, url, timeout_ms, strict, (secret IS NOT NULL) AS has_secret, created_at, \
         max_in_flight, max_output_bytes, breaker_failures, breaker_cooldown_ms, note_on_request, note_on_result, \
         hosted_type, kind, allowed_tools, name_prefix"
    };
}

impl Store {
    /// Creates a tool source; `Conflict` when the name is taken.
    pub async fn create_tool_source(
        &self,
        new: &NewToolSource<'_>,
    ) -> Result<ToolSourceRow, StoreError> {
        with_pool!(self, |pool| sqlx::query_as::<_, ToolSourceRow>(concat!(
            "INSERT INTO tool_sources (id, name, description, parameters, url, timeout_ms, secret, strict, created_at,
                max_in_flight, max_output_bytes, breaker_failures, breaker_cooldown_ms, note_on_request, note_on_result,
                hosted_type, kind, allowed_tools, name_prefix)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19)
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
        .bind(new.policy.max_in_flight.map(i64::from))
        .bind(new.policy.max_output_bytes.map(wide))
        .bind(new.policy.breaker_failures.map(i64::from))
        .bind(new.policy.breaker_cooldown_ms.map(wide))
        .bind(new.note_on_request.map(NoteTemplate::as_str))
        .bind(new.note_on_result.map(NoteTemplate::as_str))
        .bind(new.hosted_type)
        .bind(new.kind)
        .bind(new.allowed_tools.map(|t| serde_json::json!(t)))
        .bind(new.name_prefix)
        .fetch_one(pool)
        .await)
        .map_err(|e| StoreError::from_write(e, &taken(new.name.as_str())))
    }

    rows_by_name_and_id! {
        ToolSourceRow, tool_source_columns, "tool_sources";
        /// Every tool source, by name.
        list_tool_sources;
        /// One tool source.
        get_tool_source
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
                strict = COALESCE($9, strict),
                max_in_flight = CASE WHEN $10 THEN $11 ELSE max_in_flight END,
                max_output_bytes = CASE WHEN $12 THEN $13 ELSE max_output_bytes END,
                breaker_failures = CASE WHEN $14 THEN $15 ELSE breaker_failures END,
                breaker_cooldown_ms = CASE WHEN $16 THEN $17 ELSE breaker_cooldown_ms END,
                note_on_request = CASE WHEN $18 THEN $19 ELSE note_on_request END,
                note_on_result = CASE WHEN $20 THEN $21 ELSE note_on_result END,
                hosted_type = CASE WHEN $22 THEN $23 ELSE hosted_type END,
                allowed_tools = CASE WHEN $24 THEN $25 ELSE allowed_tools END,
                name_prefix = CASE WHEN $26 THEN $27 ELSE name_prefix END
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
        .bind(changes.max_in_flight.is_some())
        .bind(changes.max_in_flight.flatten().map(i64::from))
        .bind(changes.max_output_bytes.is_some())
        .bind(changes.max_output_bytes.flatten().map(wide))
        .bind(changes.breaker_failures.is_some())
        .bind(changes.breaker_failures.flatten().map(i64::from))
        .bind(changes.breaker_cooldown_ms.is_some())
        .bind(changes.breaker_cooldown_ms.flatten().map(wide))
        .bind(changes.note_on_request.is_some())
        .bind(changes.note_on_request.flatten().map(NoteTemplate::as_str))
        .bind(changes.note_on_result.is_some())
        .bind(changes.note_on_result.flatten().map(NoteTemplate::as_str))
        .bind(changes.hosted_type.is_some())
        .bind(changes.hosted_type.flatten())
        .bind(changes.allowed_tools.is_some())
        .bind(
            changes
                .allowed_tools
                .flatten()
                .map(|t| serde_json::json!(t))
        )
        .bind(changes.name_prefix.is_some())
        .bind(changes.name_prefix.flatten())
        .fetch_optional(pool)
        .await)
        .map_err(|e| StoreError::from_write(e, &taken(changes.name.map_or("", ToolName::as_str))))
    }
}

/// A timeout as the `BIGINT` column keeps it.
fn millis(timeout: TimeoutMs) -> i64 {
    // At most `TimeoutMs::MAX` (ten minutes), so it always fits.
    i64::try_from(timeout.get()).unwrap_or(i64::MAX)
}

/// A bounded policy value as its `BIGINT` column keeps it (the parsers keep it far below `i64::MAX`).
fn wide(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

fn taken(name: &str) -> String {
    format!("A tool source named '{name}' already exists.")
}
