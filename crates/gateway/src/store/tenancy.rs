//! Who a key belongs to, and which deployment and server tools a project may use for a model.

use super::backend::Fields;
use super::{Store, StoreError};
use gateway_core::entity::ProviderKind;
use secrecy::SecretString;
use sha2::{Digest, Sha256};

/// A deployment: the model name clients send, bound to an upstream provider.
#[derive(Debug, Clone)]
pub struct Deployment {
    pub id: String,
    pub name: String,
    pub provider_kind: ProviderKind,
    pub base_url: String,
    pub upstream_model: String,
    pub api_key: Option<SecretString>,
}

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
            let row = sqlx::query(
                "SELECT d.id, d.name, d.provider_kind, d.base_url, d.upstream_model, d.api_key
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
            let Some(row) = row else { return Ok(None) };
            let deployment = deployment(&row)?;
            let rows = sqlx::query(
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
            .await?;
            let tools = rows.iter().map(tool_source).collect::<Result<_, _>>()?;
            Ok(Some(Resolution { deployment, tools }))
        })
    }
}

fn deployment(row: &impl Fields) -> Result<Deployment, StoreError> {
    let provider_kind: String = row.field("provider_kind")?;
    Ok(Deployment {
        id: row.field("id")?,
        name: row.field("name")?,
        provider_kind: ProviderKind::parse(&provider_kind, "provider_kind")
            .map_err(|e| StoreError::Corrupt(e.message))?,
        base_url: row.field("base_url")?,
        upstream_model: row.field("upstream_model")?,
        api_key: row
            .field::<Option<String>>("api_key")?
            .map(SecretString::from),
    })
}

fn tool_source(row: &impl Fields) -> Result<ToolSource, sqlx::Error> {
    Ok(ToolSource {
        id: row.field("id")?,
        name: row.field("name")?,
        description: row.field("description")?,
        parameters: row.field("parameters")?,
        url: row.field("url")?,
        timeout_ms: row.field::<i64>("timeout_ms")?.max(0) as u64,
        secret: row
            .field::<Option<String>>("secret")?
            .map(SecretString::from),
        strict: row.field("strict")?,
    })
}
