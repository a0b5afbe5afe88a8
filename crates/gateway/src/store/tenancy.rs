//! Who a key belongs to, and which deployment and server tools a project may use for a model.

use gateway_core::entity::{NoteTemplate, ProviderKind, ToolPolicy};
use gateway_core::governance::Pricing;
use secrecy::SecretString;
use sha2::{Digest, Sha256};

use super::{Store, StoreError};

/// A deployment: the model name clients send, bound to an upstream provider.
#[derive(Debug, Clone)]
pub struct Deployment {
    pub id: String,
    pub name: String,
    pub provider_kind: ProviderKind,
    pub base_url: String,
    pub upstream_model: String,
    pub api_key: Option<SecretString>,
    /// What to do with declared tools nothing serves (SPEC 12).
    pub unsupported_tools: gateway_core::toolset::UnsupportedTools,
    /// What to do with create parameters its provider kind cannot honour: list them, or refuse the create.
    pub unsupported_params: gateway_core::toolset::UnsupportedTools,
    /// Anthropic's required `max_tokens` when the request sets no `max_output_tokens`.
    pub max_tokens: u32,
    /// Names of the deployments tried, in order, when this one fails after its retries (SPEC 8).
    pub fallbacks: Vec<String>,
    /// What its calls cost (SPEC 13); without it they cost nothing and are counted in tokens only.
    pub pricing: Option<Pricing>,
}

/// `max_tokens` of an Anthropic call whose request and deployment set none.
pub const DEFAULT_MAX_TOKENS: u32 = 4096;

/// A tool source as the operator registered it: one HTTP tool, or an MCP server whose tools each become a
/// server tool (what it serves is the engine's business, see `tools::ServerTool`).
#[derive(Debug, Clone)]
pub struct ToolSource {
    pub id: String,
    pub name: String,
    pub description: String,
    pub parameters: serde_json::Value,
    pub url: String,
    /// `0` when the column is out of range: the executor's default.
    pub timeout_ms: u64,
    /// Sent as `Authorization: Bearer`; never logged or shown.
    pub secret: Option<SecretString>,
    pub strict: bool,
    /// In-flight bound, output cap and breaker (SPEC 7).
    pub policy: ToolPolicy,
    /// Progress-note templates (SPEC 7).
    pub note_on_request: Option<NoteTemplate>,
    pub note_on_result: Option<NoteTemplate>,
    /// The hosted tool type this source serves (SPEC 12), if any.
    pub hosted_type: Option<String>,
    pub kind: SourceKind,
    /// `mcp`: the server's tools offered (`None`: all).
    pub allowed_tools: Option<Vec<String>>,
    /// `mcp`: put before each of the server's tool names.
    pub name_prefix: Option<String>,
}

/// The kind of a tool source.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SourceKind {
    /// One tool, this record.
    #[default]
    Http,
    /// A server whose tools each become a server tool.
    Mcp,
}

impl SourceKind {
    pub fn parse(kind: &str) -> Option<SourceKind> {
        match kind {
            "http" => Some(SourceKind::Http),
            "mcp" => Some(SourceKind::Mcp),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            SourceKind::Http => "http",
            SourceKind::Mcp => "mcp",
        }
    }
}

/// What a project may use when it names a model.
#[derive(Debug, Clone)]
pub struct Resolution {
    /// Shared with the runs it starts, which keep it while they run.
    pub deployment: std::sync::Arc<Deployment>,
    pub tools: Vec<ToolSource>,
}

/// The columns of a `DeploymentRecord`, of `deployments d`.
macro_rules! deployment_columns {
    () => {
        "d.id, d.name, d.provider_kind, d.base_url, d.upstream_model, d.api_key, d.fallbacks, d.unsupported_tools, \
         d.unsupported_params, d.max_tokens, d.input_per_mtok, d.cached_input_per_mtok, d.output_per_mtok"
    };
}

/// The columns of a `ToolSourceRecord`, of `tool_sources t`.
macro_rules! tool_source_columns {
    () => {
        "t.id, t.name, t.description, t.parameters, t.url, t.timeout_ms, t.secret, t.strict, t.max_in_flight, \
         t.max_output_bytes, t.breaker_failures, t.breaker_cooldown_ms, t.note_on_request, t.note_on_result, \
         t.hosted_type, t.kind, t.allowed_tools, t.name_prefix"
    };
}

/// SHA-256 hex of an API key: what the store keeps instead of the key.
pub fn hash_key(key: &str) -> String {
    hex::encode(key_digest(key))
}

/// The SHA-256 of a key, as bytes: what a replica keys its cached grants by (the key itself is never kept).
pub fn key_digest(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

impl Store {
    /// The deployment named `model` if some group the project may use contains it, with the union of the
    /// tool sources attached to every such group.
    pub async fn resolve(
        &self,
        project_id: &str,
        model: &str,
    ) -> Result<Option<Resolution>, StoreError> {
        let _timer = self.timed("resolve");
        // The body's own `return` leaves the inner block, whose answer is the method's.
        with_read_pool!(self, |pool| async {
            let deployment = sqlx::query_as::<_, DeploymentRecord>(concat!(
                "SELECT ",
                deployment_columns!(),
                " FROM deployments d
                 WHERE d.name = $2 AND EXISTS (
                    SELECT 1 FROM group_deployments gd
                    JOIN group_projects gp ON gp.group_id = gd.group_id
                    WHERE gd.deployment_id = d.id AND gp.project_id = $1)"
            ))
            .bind(project_id)
            .bind(model)
            .fetch_optional(pool)
            .await?;
            let Some(deployment) = deployment.map(Deployment::from) else {
                return Ok(None);
            };
            let tools = sqlx::query_as::<_, ToolSourceRecord>(concat!(
                "SELECT DISTINCT ",
                tool_source_columns!(),
                " FROM tool_sources t
                 JOIN group_tool_sources gt ON gt.tool_source_id = t.id
                 JOIN group_deployments gd ON gd.group_id = gt.group_id
                 JOIN group_projects gp ON gp.group_id = gt.group_id
                 WHERE gd.deployment_id = $2 AND gp.project_id = $1
                 ORDER BY t.name"
            ))
            .bind(project_id)
            .bind(&deployment.id)
            .fetch_all(pool)
            .await?
            .into_iter()
            .map(ToolSource::from)
            .collect();
            Ok(Some(Resolution {
                deployment: std::sync::Arc::new(deployment),
                tools,
            }))
        }
        .await)
    }

    /// The tool sources that a key could see together with those of group `group_id`: the sources of that group,
    /// and of every group that shares a project and a deployment with it (with their secrets, for listing MCP
    /// servers).
    pub async fn tool_sources_beside(&self, group_id: &str) -> Result<Vec<ToolSource>, StoreError> {
        let rows = with_read_pool!(self, |pool| {
            sqlx::query_as::<_, ToolSourceRecord>(concat!(
            "SELECT DISTINCT ",
            tool_source_columns!(),
            " FROM tool_sources t
             JOIN group_tool_sources gt ON gt.tool_source_id = t.id
             WHERE gt.group_id = $1
                OR (EXISTS (SELECT 1 FROM group_projects a JOIN group_projects b ON b.project_id = a.project_id
                            WHERE a.group_id = $1 AND b.group_id = gt.group_id)
                    AND EXISTS (SELECT 1 FROM group_deployments a JOIN group_deployments b
                                ON b.deployment_id = a.deployment_id
                                WHERE a.group_id = $1 AND b.group_id = gt.group_id))
             ORDER BY t.name"
        ))
        .bind(group_id)
        .fetch_all(pool)
        .await
        })?;
        Ok(rows.into_iter().map(ToolSource::from).collect())
    }

    /// A deployment by id, whatever groups it is in: what a resumed response runs on.
    pub async fn deployment_by_id(&self, id: &str) -> Result<Option<Deployment>, StoreError> {
        let found = with_read_pool!(self, |pool| {
            sqlx::query_as::<_, DeploymentRecord>(concat!(
                "SELECT ",
                deployment_columns!(),
                " FROM deployments d WHERE d.id = $1"
            ))
            .bind(id)
            .fetch_optional(pool)
            .await
        })?;
        Ok(found.map(Deployment::from))
    }

    /// A deployment by name, whatever groups it is in: a fallback (the operator chose it, SPEC 8).
    pub async fn deployment_by_name(&self, name: &str) -> Result<Option<Deployment>, StoreError> {
        let found = with_read_pool!(self, |pool| {
            sqlx::query_as::<_, DeploymentRecord>(concat!(
                "SELECT ",
                deployment_columns!(),
                " FROM deployments d WHERE d.name = $1"
            ))
            .bind(name)
            .fetch_optional(pool)
            .await
        })?;
        Ok(found.map(Deployment::from))
    }

    /// The tool sources with these ids that still exist, as they are now (with their secrets): what a resumed
    /// response calls.
    pub async fn tool_sources_by_id(&self, ids: &[String]) -> Result<Vec<ToolSource>, StoreError> {
        let mut sources = Vec::with_capacity(ids.len());
        for id in ids {
            let found =
                with_read_pool!(self, |pool| sqlx::query_as::<_, ToolSourceRecord>(concat!(
                    "SELECT ",
                    tool_source_columns!(),
                    " FROM tool_sources t WHERE t.id = $1"
                ))
                .bind(id)
                .fetch_optional(pool)
                .await)?;
            sources.extend(found.map(ToolSource::from));
        }
        Ok(sources)
    }
}

/// A `Deployment` as read, before its key is wrapped as a secret.
#[derive(sqlx::FromRow)]
struct DeploymentRecord {
    id: String,
    name: String,
    #[sqlx(try_from = "String")]
    provider_kind: ProviderKind,
    base_url: String,
    upstream_model: String,
    api_key: Option<String>,
    fallbacks: String,
    unsupported_tools: String,
    unsupported_params: String,
    max_tokens: Option<i64>,
    input_per_mtok: Option<f64>,
    cached_input_per_mtok: Option<f64>,
    output_per_mtok: Option<f64>,
}

/// A deployment's `fallbacks` column (a JSON array of names); unreadable text reads as none.
pub fn parse_fallbacks(text: &str) -> Vec<String> {
    serde_json::from_str(text).unwrap_or_default()
}

impl From<DeploymentRecord> for Deployment {
    fn from(row: DeploymentRecord) -> Deployment {
        Deployment {
            id: row.id,
            name: row.name,
            provider_kind: row.provider_kind,
            base_url: row.base_url,
            upstream_model: row.upstream_model,
            api_key: row.api_key.map(SecretString::from),
            unsupported_tools: gateway_core::toolset::UnsupportedTools::parse(
                &row.unsupported_tools,
            )
            .unwrap_or_default(),
            unsupported_params: gateway_core::toolset::UnsupportedTools::parse(
                &row.unsupported_params,
            )
            .unwrap_or_default(),
            max_tokens: row
                .max_tokens
                .and_then(|n| u32::try_from(n).ok())
                .filter(|n| *n > 0)
                .unwrap_or(DEFAULT_MAX_TOKENS),
            fallbacks: parse_fallbacks(&row.fallbacks),
            pricing: row.input_per_mtok.zip(row.output_per_mtok).map(
                |(input_per_mtok, output_per_mtok)| Pricing {
                    input_per_mtok,
                    cached_input_per_mtok: row.cached_input_per_mtok,
                    output_per_mtok,
                },
            ),
        }
    }
}

/// A `ToolSource` as read, before its secret is wrapped as one.
#[derive(sqlx::FromRow)]
struct ToolSourceRecord {
    id: String,
    name: String,
    description: String,
    parameters: serde_json::Value,
    url: String,
    timeout_ms: i64,
    secret: Option<String>,
    strict: bool,
    max_in_flight: Option<i64>,
    max_output_bytes: Option<i64>,
    breaker_failures: Option<i64>,
    breaker_cooldown_ms: Option<i64>,
    note_on_request: Option<String>,
    note_on_result: Option<String>,
    hosted_type: Option<String>,
    kind: String,
    allowed_tools: Option<serde_json::Value>,
    name_prefix: Option<String>,
}

impl From<ToolSourceRecord> for ToolSource {
    fn from(row: ToolSourceRecord) -> ToolSource {
        ToolSource {
            id: row.id,
            name: row.name,
            description: row.description,
            parameters: row.parameters,
            url: row.url,
            // Writers keep it in range, the column does not: a negative value reads as 0.
            timeout_ms: u64::try_from(row.timeout_ms).unwrap_or(0),
            secret: row.secret.map(SecretString::from),
            strict: row.strict,
            // Writers keep these in range; anything else reads as the default.
            policy: ToolPolicy {
                max_in_flight: row.max_in_flight.and_then(|v| u32::try_from(v).ok()),
                max_output_bytes: row.max_output_bytes.and_then(|v| u64::try_from(v).ok()),
                breaker_failures: row.breaker_failures.and_then(|v| u32::try_from(v).ok()),
                breaker_cooldown_ms: row.breaker_cooldown_ms.and_then(|v| u64::try_from(v).ok()),
            },
            note_on_request: row
                .note_on_request
                .and_then(|t| NoteTemplate::parse(t, "note_on_request").ok()),
            note_on_result: row
                .note_on_result
                .and_then(|t| NoteTemplate::parse(t, "note_on_result").ok()),
            hosted_type: row.hosted_type,
            kind: SourceKind::parse(&row.kind).unwrap_or_default(),
            allowed_tools: row
                .allowed_tools
                .and_then(|v| serde_json::from_value(v).ok()),
            name_prefix: row.name_prefix,
        }
    }
}
