//! `/tool_sources`: create, list, read, change and delete server tools. The secret is write-only.

use axum::extract::State;
use axum::Json;
use gateway_core::entity::{
    check_secret, parse_hosted_type, HttpUrl, NoteTemplate, TimeoutMs, ToolName, ToolParameters,
    ToolPolicy,
};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{found, not_null, nullable, parse_changed, parse_required, AdminJson, ApiPath};
use crate::api::error::ApiError;
use crate::api::AppState;
use crate::store::admin::{NewToolSource, ToolSourceChanges, ToolSourceRow};
use crate::store::tenancy::SourceKind;

/// A tool source's fields.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolSourceBody {
    #[serde(default, deserialize_with = "nullable")]
    name: Option<Option<String>>,
    #[serde(default, deserialize_with = "nullable")]
    description: Option<Option<String>>,
    #[serde(default, deserialize_with = "nullable")]
    parameters: Option<Option<Value>>,
    #[serde(default, deserialize_with = "nullable")]
    url: Option<Option<String>>,
    #[serde(default, deserialize_with = "nullable")]
    timeout_ms: Option<Option<i64>>,
    #[serde(default, deserialize_with = "nullable")]
    secret: Option<Option<String>>,
    #[serde(default, deserialize_with = "nullable")]
    strict: Option<Option<bool>>,
    #[serde(default, deserialize_with = "nullable")]
    max_in_flight: Option<Option<i64>>,
    #[serde(default, deserialize_with = "nullable")]
    max_output_bytes: Option<Option<i64>>,
    #[serde(default, deserialize_with = "nullable")]
    breaker_failures: Option<Option<i64>>,
    #[serde(default, deserialize_with = "nullable")]
    breaker_cooldown_ms: Option<Option<i64>>,
    #[serde(default, deserialize_with = "nullable")]
    note_on_request: Option<Option<String>>,
    #[serde(default, deserialize_with = "nullable")]
    note_on_result: Option<Option<String>>,
    #[serde(default, deserialize_with = "nullable")]
    hosted_type: Option<Option<String>>,
    #[serde(default, deserialize_with = "nullable")]
    kind: Option<Option<String>>,
    #[serde(default, deserialize_with = "nullable")]
    allowed_tools: Option<Option<Vec<String>>>,
    #[serde(default, deserialize_with = "nullable")]
    name_prefix: Option<Option<String>>,
}

/// `allowed_tools`: at most 1000 tool names (as the server names them).
fn parse_allowed_tools(
    names: Vec<String>,
    param: &str,
) -> Result<Vec<String>, gateway_core::request::InvalidRequest> {
    let bad = names.len() > 1000
        || names
            .iter()
            .any(|n| n.is_empty() || n.len() > 128 || n.chars().any(char::is_control));
    if bad {
        return Err(gateway_core::request::InvalidRequest::new(
            format!(
                "'{param}' must be a list of at most 1000 tool names, each 1 to 128 characters."
            ),
            param,
        )
        .with_code("invalid_value"));
    }
    Ok(names)
}

/// `name_prefix`: 1 to 32 letters, digits, `_` or `-`, so that prefixed names stay valid tool names.
fn parse_name_prefix(
    prefix: String,
    param: &str,
) -> Result<String, gateway_core::request::InvalidRequest> {
    let ok = (1..=32).contains(&prefix.len())
        && prefix
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if ok {
        Ok(prefix)
    } else {
        Err(gateway_core::request::InvalidRequest::new(
            format!("'{param}' must be 1 to 32 letters, digits, '_' or '-'."),
            param,
        )
        .with_code("invalid_value"))
    }
}

/// A field that may be absent, `null` (back to the default) or a value parsed with `parse`.
fn optional<T, U>(
    value: Option<Option<T>>,
    param: &str,
    parse: impl FnOnce(T, &str) -> Result<U, gateway_core::request::InvalidRequest>,
) -> Result<Option<Option<U>>, ApiError> {
    match value {
        None => Ok(None),
        Some(None) => Ok(Some(None)),
        Some(Some(value)) => Ok(Some(Some(parse(value, param)?))),
    }
}

/// The policy, notes and binding fields of a body, parsed: absent ones are `None`.
struct Extras {
    max_in_flight: Option<Option<u32>>,
    max_output_bytes: Option<Option<u64>>,
    breaker_failures: Option<Option<u32>>,
    breaker_cooldown_ms: Option<Option<u64>>,
    note_on_request: Option<Option<NoteTemplate>>,
    note_on_result: Option<Option<NoteTemplate>>,
    hosted_type: Option<Option<String>>,
    allowed_tools: Option<Option<Vec<String>>>,
    name_prefix: Option<Option<String>>,
}

impl Extras {
    fn parse(body: &mut ToolSourceBody) -> Result<Extras, ApiError> {
        Ok(Extras {
            max_in_flight: optional(
                body.max_in_flight.take(),
                "max_in_flight",
                ToolPolicy::parse_max_in_flight,
            )?,
            max_output_bytes: optional(
                body.max_output_bytes.take(),
                "max_output_bytes",
                ToolPolicy::parse_max_output_bytes,
            )?,
            breaker_failures: optional(
                body.breaker_failures.take(),
                "breaker_failures",
                ToolPolicy::parse_breaker_failures,
            )?,
            breaker_cooldown_ms: optional(
                body.breaker_cooldown_ms.take(),
                "breaker_cooldown_ms",
                ToolPolicy::parse_breaker_cooldown_ms,
            )?,
            note_on_request: optional(
                body.note_on_request.take(),
                "note_on_request",
                NoteTemplate::parse,
            )?,
            note_on_result: optional(
                body.note_on_result.take(),
                "note_on_result",
                NoteTemplate::parse,
            )?,
            hosted_type: optional(body.hosted_type.take(), "hosted_type", parse_hosted_type)?,
            allowed_tools: optional(
                body.allowed_tools.take(),
                "allowed_tools",
                parse_allowed_tools,
            )?,
            name_prefix: optional(body.name_prefix.take(), "name_prefix", parse_name_prefix)?,
        })
    }

    fn policy(&self) -> ToolPolicy {
        ToolPolicy {
            max_in_flight: self.max_in_flight.flatten(),
            max_output_bytes: self.max_output_bytes.flatten(),
            breaker_failures: self.breaker_failures.flatten(),
            breaker_cooldown_ms: self.breaker_cooldown_ms.flatten(),
        }
    }
}

/// A tool source as the admin API shows it: whether it has a secret, never the secret; the groups that hold it;
/// and only the fields its kind uses (an MCP source's tools bring their own `parameters` and `strict`; an HTTP
/// source has no `allowed_tools` or `name_prefix`).
#[derive(Debug, Serialize)]
pub struct ToolSourceObject {
    id: String,
    object: &'static str,
    name: String,
    description: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    parameters: Option<Value>,
    url: String,
    timeout_ms: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    strict: Option<bool>,
    has_secret: bool,
    created_at: i64,
    /// `null`: no bound.
    max_in_flight: Option<i64>,
    /// The effective values, defaults filled in.
    max_output_bytes: i64,
    breaker_failures: i64,
    breaker_cooldown_ms: i64,
    note_on_request: Option<String>,
    note_on_result: Option<String>,
    hosted_type: Option<String>,
    /// `http` or `mcp`.
    kind: String,
    /// MCP sources only (`null`: every tool).
    #[serde(skip_serializing_if = "Option::is_none")]
    allowed_tools: Option<Option<Value>>,
    /// MCP sources only.
    #[serde(skip_serializing_if = "Option::is_none")]
    name_prefix: Option<Option<String>>,
    /// The groups that hold it.
    groups: Vec<super::groups::NamedMember>,
}

impl ToolSourceObject {
    /// With the groups that hold each of `sources`.
    async fn with_groups(
        state: &AppState,
        mut sources: Vec<ToolSourceObject>,
    ) -> Result<Vec<ToolSourceObject>, ApiError> {
        let memberships = state.store.tool_source_groups().await?;
        for source in &mut sources {
            source.groups = memberships
                .iter()
                .filter(|(source_id, _, _)| *source_id == source.id)
                .map(|(_, id, name)| super::groups::NamedMember::new(id.clone(), name.clone()))
                .collect();
        }
        Ok(sources)
    }
}

impl From<ToolSourceRow> for ToolSourceObject {
    fn from(row: ToolSourceRow) -> ToolSourceObject {
        let http = row.kind != "mcp";
        ToolSourceObject {
            id: row.id,
            object: "tool_source",
            name: row.name,
            description: row.description,
            parameters: http.then_some(row.parameters),
            url: row.url,
            timeout_ms: row.timeout_ms,
            strict: http.then_some(row.strict),
            has_secret: row.has_secret,
            created_at: row.created_at,
            max_in_flight: row.max_in_flight,
            max_output_bytes: row
                .max_output_bytes
                .unwrap_or(default_i64(ToolPolicy::DEFAULT_MAX_OUTPUT_BYTES)),
            breaker_failures: row
                .breaker_failures
                .unwrap_or(i64::from(ToolPolicy::DEFAULT_BREAKER_FAILURES)),
            breaker_cooldown_ms: row
                .breaker_cooldown_ms
                .unwrap_or(default_i64(ToolPolicy::DEFAULT_BREAKER_COOLDOWN_MS)),
            note_on_request: row.note_on_request,
            note_on_result: row.note_on_result,
            hosted_type: row.hosted_type,
            allowed_tools: (!http).then_some(row.allowed_tools),
            name_prefix: (!http).then_some(row.name_prefix),
            kind: row.kind,
            groups: Vec::new(),
        }
    }
}

fn default_i64(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// `POST /tool_sources`.
pub async fn create_tool_source(
    State(state): State<AppState>,
    AdminJson(mut body): AdminJson<ToolSourceBody>,
) -> Result<Json<ToolSourceObject>, ApiError> {
    let extras = Extras::parse(&mut body)?;
    let kind = match body.kind.flatten() {
        None => SourceKind::Http,
        Some(kind) => SourceKind::parse(&kind).ok_or_else(|| {
            ApiError::invalid(
                format!("Invalid 'kind': '{kind}'; expected 'http' or 'mcp'."),
                Some("kind"),
                Some("invalid_value"),
            )
        })?,
    };
    let name = parse_required(body.name, "name", ToolName::parse)?;
    let description = body.description.flatten().unwrap_or_default();
    let parameters = match (kind, body.parameters) {
        // An MCP source's tools bring their own schemas.
        (SourceKind::Mcp, None | Some(None)) => {
            ToolParameters::parse(serde_json::json!({"type": "object"}), "parameters")?
        }
        (_, parameters) => parse_required(parameters, "parameters", ToolParameters::parse)?,
    };
    if kind == SourceKind::Http && (extras.allowed_tools.is_some() || extras.name_prefix.is_some())
    {
        let param = if extras.allowed_tools.is_some() {
            "allowed_tools"
        } else {
            "name_prefix"
        };
        return Err(ApiError::invalid(
            format!("'{param}' applies to tool sources of kind 'mcp' only."),
            Some(param),
            Some("invalid_value"),
        ));
    }
    let url = parse_required(body.url, "url", HttpUrl::parse)?;
    let timeout_ms = match body.timeout_ms.flatten() {
        Some(timeout_ms) => TimeoutMs::parse(timeout_ms, "timeout_ms")?,
        None => TimeoutMs::DEFAULT,
    };
    let secret = body.secret.flatten();
    if let Some(secret) = &secret {
        check_secret(secret, "secret")?;
    }
    let new = NewToolSource {
        name: &name,
        description: &description,
        parameters: &parameters,
        url: &url,
        timeout_ms,
        secret: secret.as_deref(),
        strict: body.strict.flatten().unwrap_or(false),
        policy: extras.policy(),
        note_on_request: extras.note_on_request.as_ref().and_then(Option::as_ref),
        note_on_result: extras.note_on_result.as_ref().and_then(Option::as_ref),
        hosted_type: extras.hosted_type.as_ref().and_then(Option::as_deref),
        kind: kind.as_str(),
        allowed_tools: extras.allowed_tools.as_ref().and_then(Option::as_deref),
        name_prefix: extras.name_prefix.as_ref().and_then(Option::as_deref),
    };
    let source = state.store.create_tool_source(&new).await?;
    tracing::info!(tool_source.id = %source.id, tool.name = %source.name, "tool source created");
    Ok(Json(source.into()))
}

/// `GET /tool_sources`.
pub async fn list_tool_sources(
    State(state): State<AppState>,
) -> Result<Json<super::List<ToolSourceObject>>, ApiError> {
    let sources = state.store.list_tool_sources().await?;
    let sources =
        ToolSourceObject::with_groups(&state, sources.into_iter().map(Into::into).collect())
            .await?;
    Ok(super::list(sources))
}

/// `GET /tool_sources/{tool_source_id}`.
pub async fn get_tool_source(
    State(state): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<ToolSourceObject>, ApiError> {
    let source = found(state.store.get_tool_source(&id).await?, "tool source", &id)?;
    let mut sources = ToolSourceObject::with_groups(&state, vec![source.into()]).await?;
    sources
        .pop()
        .map(Json)
        .ok_or_else(|| super::not_found("tool source", &id))
}

/// `PATCH /tool_sources/{tool_source_id}`: any field; `secret: null` removes the secret, `description: null`
/// empties the description, `null` for a policy field returns it to the default and for a note or
/// `hosted_type` removes it.
pub async fn update_tool_source(
    State(state): State<AppState>,
    ApiPath(id): ApiPath<String>,
    AdminJson(mut body): AdminJson<ToolSourceBody>,
) -> Result<Json<ToolSourceObject>, ApiError> {
    let extras = Extras::parse(&mut body)?;
    if body.kind.is_some() {
        return Err(ApiError::invalid(
            "A tool source's 'kind' cannot be changed; create another source.".to_owned(),
            Some("kind"),
            Some("invalid_value"),
        ));
    }
    let name = parse_changed(body.name, "name", ToolName::parse)?;
    let description = body.description.map(Option::unwrap_or_default);
    let parameters = parse_changed(body.parameters, "parameters", ToolParameters::parse)?;
    let url = parse_changed(body.url, "url", HttpUrl::parse)?;
    let timeout_ms = parse_changed(body.timeout_ms, "timeout_ms", TimeoutMs::parse)?;
    if let Some(Some(secret)) = &body.secret {
        check_secret(secret, "secret")?;
    }
    let strict = not_null(body.strict, "strict")?;
    let changes = ToolSourceChanges {
        name: name.as_ref(),
        description: description.as_deref(),
        parameters: parameters.as_ref(),
        url: url.as_ref(),
        timeout_ms,
        secret: body.secret.as_ref().map(Option::as_deref),
        strict,
        max_in_flight: extras.max_in_flight,
        max_output_bytes: extras.max_output_bytes,
        breaker_failures: extras.breaker_failures,
        breaker_cooldown_ms: extras.breaker_cooldown_ms,
        note_on_request: extras.note_on_request.as_ref().map(Option::as_ref),
        note_on_result: extras.note_on_result.as_ref().map(Option::as_ref),
        hosted_type: extras.hosted_type.as_ref().map(Option::as_deref),
        allowed_tools: extras.allowed_tools.as_ref().map(Option::as_deref),
        name_prefix: extras.name_prefix.as_ref().map(Option::as_deref),
    };
    let source = found(
        state.store.update_tool_source(&id, &changes).await?,
        "tool source",
        &id,
    )?;
    tracing::info!(tool_source.id = %source.id, tool.name = %source.name, "tool source updated");
    let mut sources = ToolSourceObject::with_groups(&state, vec![source.into()]).await?;
    sources
        .pop()
        .map(Json)
        .ok_or_else(|| super::not_found("tool source", &id))
}

delete_by_id! {
    /// `DELETE /tool_sources/{tool_source_id}`: refused while a group holds it, unless forced; forced, it is
    /// detached from every group.
    delete_tool_source: remove_tool_source, "tool source", "tool_source", tool_source.id,
    unless referred to
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_tool_source_answers_the_documented_fields_without_its_secret() {
        let row = ToolSourceRow {
            id: "tool_1".into(),
            name: "get_weather".into(),
            description: "Weather.".into(),
            parameters: json!({"type": "object"}),
            url: "http://tools.internal/get_weather".into(),
            timeout_ms: 5000,
            strict: true,
            has_secret: true,
            created_at: 1_735_689_600,
            max_in_flight: None,
            max_output_bytes: None,
            breaker_failures: Some(3),
            breaker_cooldown_ms: None,
            note_on_request: Some("Weather in {city}".into()),
            note_on_result: None,
            hosted_type: None,
            kind: "http".into(),
            allowed_tools: None,
            name_prefix: None,
        };
        assert_eq!(
            serde_json::to_value(ToolSourceObject::from(row)).unwrap(),
            json!({
                "id": "tool_1",
                "object": "tool_source",
                "name": "get_weather",
                "description": "Weather.",
                "parameters": {"type": "object"},
                "url": "http://tools.internal/get_weather",
                "timeout_ms": 5000,
                "strict": true,
                "has_secret": true,
                "created_at": 1_735_689_600,
                "max_in_flight": null,
                "max_output_bytes": 1_048_576,
                "breaker_failures": 3,
                "breaker_cooldown_ms": 30_000,
                "note_on_request": "Weather in {city}",
                "note_on_result": null,
                "hosted_type": null,
                "kind": "http",
                "groups": [],
            })
        );
    }
}
