//! Who a key belongs to, and which deployment and server tools a project may use for a model.

use gateway_core::entity::ProviderKind;
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
        let _timer = crate::metrics::StoreTimer::start("project_for_key");
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
        let _timer = crate::metrics::StoreTimer::start("resolve");
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
                "SELECT DISTINCT t.id, t.name, t.description, t.parameters, t.url, t.timeout_ms, t.secret, t.strict
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
                "SELECT id, name, description, parameters, url, timeout_ms, secret, strict
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
        }
    }
}
