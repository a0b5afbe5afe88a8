//! Who a key belongs to, and which deployment and server tools a project may use for a model.

use gateway_core::entity::{NoteTemplate, ProviderKind, ToolPolicy};
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
    /// Anthropic's required `max_tokens` when the request sets no `max_output_tokens`.
    pub max_tokens: u32,
    /// Names of the deployments tried, in order, when this one fails after its retries (SPEC 8).
    pub fallbacks: Vec<String>,
}

/// `max_tokens` of an Anthropic call whose request and deployment set none.
pub const DEFAULT_MAX_TOKENS: u32 = 4096;

/// One server tool, as its source defines it.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct ToolSource {
    pub id: String,
    pub name: String,
    pub description: String,
    pub parameters: serde_json::Value,
    pub url: String,
    pub timeout_ms: u64,
    /// Sent as `Authorization: Bearer`; never serialised, logged or shown.
    #[serde(skip)]
    pub secret: Option<SecretString>,
    pub strict: bool,
    /// In-flight bound, output cap and breaker (SPEC 7).
    #[serde(default)]
    pub policy: ToolPolicy,
    /// Progress-note templates (SPEC 7).
    #[serde(default)]
    pub note_on_request: Option<NoteTemplate>,
    #[serde(default)]
    pub note_on_result: Option<NoteTemplate>,
    /// The hosted tool type this source serves (SPEC 12), if any.
    #[serde(default)]
    pub hosted_type: Option<String>,
    /// `http` (one tool, this record) or `mcp` (a server whose tools each become a server tool).
    #[serde(default)]
    pub kind: SourceKind,
    /// `mcp`: the server's tools offered (`None`: all).
    #[serde(default)]
    pub allowed_tools: Option<Vec<String>>,
    /// `mcp`: put before each of the server's tool names.
    #[serde(default)]
    pub name_prefix: Option<String>,
    /// For one tool of an `mcp` source: its name on the server (`name` may carry the prefix).
    #[serde(default)]
    pub mcp_tool: Option<String>,
    /// For one tool of an `mcp` source: the source's name, shown as `server_label` of its calls.
    #[serde(default)]
    pub server_label: Option<String>,
    /// For a tool of a `remote` server: whether the client approves each call first (SPEC 12).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub approval_required: bool,
    /// For a tool of a `remote` server: where and how to reach it (checked address, credentials). Never stored:
    /// a resumed response declares the server again in its stored request.
    #[serde(skip)]
    pub remote: Option<std::sync::Arc<crate::tools::mcp::RemoteAccess>>,
}

impl ToolSource {
    /// The `tool` label of its metrics: its name, or `remote_mcp` for any tool of a server a request names
    /// (whose names are the client's, and would grow the metrics without bound).
    pub fn metric_label(&self) -> String {
        match self.kind {
            SourceKind::Remote => "remote_mcp".into(),
            SourceKind::Http | SourceKind::Mcp => self.name.clone(),
        }
    }
}

/// The kind of a tool source.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SourceKind {
    #[default]
    Http,
    Mcp,
    /// A remote MCP server that the request itself names (SPEC 12); never registered by an operator.
    Remote,
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
            SourceKind::Remote => "remote",
        }
    }
}

/// What a project may use when it names a model.
#[derive(Debug, Clone)]
pub struct Resolution {
    pub deployment: Deployment,
    pub tools: Vec<ToolSource>,
}

/// SHA-256 hex of an API key: what the store keeps instead of the key.
pub fn hash_key(key: &str) -> String {
    hex::encode(Sha256::digest(key.as_bytes()))
}

impl Store {
    /// The project of a live (unrevoked) key, if any.
    pub async fn project_for_key(&self, key: &str) -> Result<Option<String>, StoreError> {
        let _timer = self.timed("project_for_key");
        let project_id = with_pool!(self, |pool| sqlx::query_scalar(
            "SELECT project_id FROM api_keys WHERE key_hash = $1 AND revoked_at IS NULL",
        )
        .bind(hash_key(key))
        .fetch_optional(pool)
        .await)?;
        Ok(project_id)
    }

    /// The deployment named `model` if some group the project may use contains it, with the union of the
    /// tool sources attached to every such group.
    pub async fn resolve(
        &self,
        project_id: &str,
        model: &str,
    ) -> Result<Option<Resolution>, StoreError> {
        let _timer = self.timed("resolve");
        with_pool!(self, |pool| {
            let deployment = sqlx::query_as::<_, DeploymentRecord>(
                "SELECT d.id, d.name, d.provider_kind, d.base_url, d.upstream_model, d.api_key, d.fallbacks,
                        d.unsupported_tools, d.max_tokens
                 FROM deployments d
                 WHERE d.name = $2 AND EXISTS (
                    SELECT 1 FROM group_deployments gd
                    JOIN group_projects gp ON gp.group_id = gd.group_id
                    WHERE gd.deployment_id = d.id AND gp.project_id = $1)",
            )
            .bind(project_id)
            .bind(model)
            .fetch_optional(pool)
            .await?;
            let Some(deployment) = deployment.map(Deployment::from) else {
                return Ok(None);
            };
            let tools = sqlx::query_as::<_, ToolSourceRecord>(
                "SELECT DISTINCT t.id, t.name, t.description, t.parameters, t.url, t.timeout_ms, t.secret, t.strict,
                    t.max_in_flight, t.max_output_bytes, t.breaker_failures, t.breaker_cooldown_ms,
                    t.note_on_request, t.note_on_result, t.hosted_type, t.kind, t.allowed_tools, t.name_prefix
                 FROM tool_sources t
                 JOIN group_tool_sources gt ON gt.tool_source_id = t.id
                 JOIN group_deployments gd ON gd.group_id = gt.group_id
                 JOIN group_projects gp ON gp.group_id = gt.group_id
                 WHERE gd.deployment_id = $2 AND gp.project_id = $1
                 ORDER BY t.name",
            )
            .bind(project_id)
            .bind(&deployment.id)
            .fetch_all(pool)
            .await?
            .into_iter()
            .map(ToolSource::from)
            .collect();
            Ok(Some(Resolution { deployment, tools }))
        })
    }

    /// The tool sources that a key could see together with those of group `group_id`: the sources of that group,
    /// and of every group that shares a project and a deployment with it (with their secrets, for listing MCP
    /// servers).
    pub async fn tool_sources_beside(&self, group_id: &str) -> Result<Vec<ToolSource>, StoreError> {
        let rows = with_pool!(self, |pool| {
            sqlx::query_as::<_, ToolSourceRecord>(
            "SELECT DISTINCT t.id, t.name, t.description, t.parameters, t.url, t.timeout_ms, t.secret, t.strict,
                t.max_in_flight, t.max_output_bytes, t.breaker_failures, t.breaker_cooldown_ms,
                t.note_on_request, t.note_on_result, t.hosted_type, t.kind, t.allowed_tools, t.name_prefix
             FROM tool_sources t
             JOIN group_tool_sources gt ON gt.tool_source_id = t.id
             WHERE gt.group_id = $1
                OR (EXISTS (SELECT 1 FROM group_projects a JOIN group_projects b ON b.project_id = a.project_id
                            WHERE a.group_id = $1 AND b.group_id = gt.group_id)
                    AND EXISTS (SELECT 1 FROM group_deployments a JOIN group_deployments b
                                ON b.deployment_id = a.deployment_id
                                WHERE a.group_id = $1 AND b.group_id = gt.group_id))
             ORDER BY t.name",
        )
        .bind(group_id)
        .fetch_all(pool)
        .await
        })?;
        Ok(rows.into_iter().map(ToolSource::from).collect())
    }

    /// A deployment by id, whatever groups it is in: what a resumed response runs on.
    pub async fn deployment_by_id(&self, id: &str) -> Result<Option<Deployment>, StoreError> {
        let found = with_pool!(self, |pool| {
            sqlx::query_as::<_, DeploymentRecord>(
            "SELECT id, name, provider_kind, base_url, upstream_model, api_key, fallbacks, unsupported_tools, max_tokens
             FROM deployments WHERE id = $1",
        )
        .bind(id)
        .fetch_optional(pool)
        .await
        })?;
        Ok(found.map(Deployment::from))
    }

    /// A deployment by name, whatever groups it is in: a fallback (the operator chose it, SPEC 8).
    pub async fn deployment_by_name(&self, name: &str) -> Result<Option<Deployment>, StoreError> {
        let found = with_pool!(self, |pool| {
            sqlx::query_as::<_, DeploymentRecord>(
                "SELECT id, name, provider_kind, base_url, upstream_model, api_key, fallbacks, unsupported_tools, max_tokens
                 FROM deployments WHERE name = $1",
            )
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
            let found = with_pool!(self, |pool| sqlx::query_as::<_, ToolSourceRecord>(
                "SELECT id, name, description, parameters, url, timeout_ms, secret, strict,
                    max_in_flight, max_output_bytes, breaker_failures, breaker_cooldown_ms,
                    note_on_request, note_on_result, hosted_type, kind, allowed_tools, name_prefix
                 FROM tool_sources WHERE id = $1",
            )
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
    max_tokens: Option<i64>,
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
            max_tokens: row
                .max_tokens
                .and_then(|n| u32::try_from(n).ok())
                .filter(|n| *n > 0)
                .unwrap_or(DEFAULT_MAX_TOKENS),
            fallbacks: parse_fallbacks(&row.fallbacks),
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
            mcp_tool: None,
            server_label: None,
            approval_required: false,
            remote: None,
        }
    }
}
