//! API keys of projects: kept as a SHA-256 hash (never read back) and a short prefix to tell keys apart, with
//! when they expire and the limits and budget they are held to.

use gateway_core::entity::EntityName;
use gateway_core::governance::{Change, Governance};

use super::governed::{GovernanceChanges, GovernanceColumns};
use crate::clock::now;
use crate::ids::new_id;
use crate::store::{Store, StoreError};

/// An API key as the store keeps it: a hash (not read back here) and a short prefix to tell keys apart.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct ApiKeyRow {
    pub id: String,
    pub project_id: String,
    pub name: String,
    pub key_prefix: String,
    pub created_at: i64,
    pub revoked_at: Option<i64>,
    /// Unix seconds; the key is refused from then on.
    pub expires_at: Option<i64>,
    /// Unix seconds; written at most once a minute per replica.
    pub last_used_at: Option<i64>,
    #[sqlx(flatten)]
    pub governance: GovernanceColumns,
}

/// A new API key: the caller generates the key and passes only its hash and prefix.
#[derive(Debug, Clone)]
pub struct NewApiKey<'a> {
    pub project_id: &'a str,
    pub name: &'a EntityName,
    pub key_hash: &'a str,
    pub key_prefix: &'a str,
    pub expires_at: Option<i64>,
    pub governance: Governance,
}

/// Changes to a key; the default changes nothing.
#[derive(Debug, Clone, Default)]
pub struct ApiKeyChanges<'a> {
    pub name: Option<&'a EntityName>,
    /// `Some(None)`: the key never expires.
    pub expires_at: Change<i64>,
    pub governance: GovernanceChanges,
}

/// The columns of an `ApiKeyRow`: never the hash.
macro_rules! api_key_columns {
    () => {
        concat!(
            "id, project_id, name, key_prefix, created_at, revoked_at, expires_at, last_used_at, ",
            governance_columns!()
        )
    };
}

impl Store {
    /// Records a new key of a project; `Ok(None)` when the project does not exist.
    pub async fn create_api_key(
        &self,
        new: &NewApiKey<'_>,
    ) -> Result<Option<ApiKeyRow>, StoreError> {
        with_pool!(self, |pool| bind_governance!(
            sqlx::query_as::<_, ApiKeyRow>(concat!(
                "INSERT INTO api_keys (id, project_id, name, key_hash, key_prefix, created_at, expires_at, ",
                governance_columns!(),
                ") SELECT $1, p.id, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12 FROM projects p WHERE p.id = $2
                 RETURNING ",
                api_key_columns!()
            ))
            .bind(new_id("key"))
            .bind(new.project_id)
            .bind(new.name.as_str())
            .bind(new.key_hash)
            .bind(new.key_prefix)
            .bind(now())
            .bind(new.expires_at),
            &new.governance
        )
        .fetch_optional(pool)
        .await)
        .map_err(|e| StoreError::from_write(e, "A key with the same hash already exists."))
    }

    /// Every key of a project (revoked ones too), oldest first; `Ok(None)` when the project does not exist.
    pub async fn list_api_keys(
        &self,
        project_id: &str,
    ) -> Result<Option<Vec<ApiKeyRow>>, StoreError> {
        if self.get_project(project_id).await?.is_none() {
            return Ok(None);
        }
        let keys = with_pool!(self, |pool| sqlx::query_as::<_, ApiKeyRow>(concat!(
            "SELECT ",
            api_key_columns!(),
            " FROM api_keys WHERE project_id = $1 ORDER BY created_at, id"
        ))
        .bind(project_id)
        .fetch_all(pool)
        .await)?;
        Ok(Some(keys))
    }

    row_by_id! {
        /// One key.
        get_api_key -> ApiKeyRow, api_key_columns, "api_keys"
    }

    /// The key of a project with this hash, revoked or not: how the seed finds a key it gave before.
    pub async fn api_key_with_hash(
        &self,
        project_id: &str,
        key_hash: &str,
    ) -> Result<Option<ApiKeyRow>, StoreError> {
        Ok(with_pool!(self, |pool| sqlx::query_as::<_, ApiKeyRow>(
            concat!(
                "SELECT ",
                api_key_columns!(),
                " FROM api_keys WHERE project_id = $1 AND key_hash = $2"
            )
        )
        .bind(project_id)
        .bind(key_hash)
        .fetch_optional(pool)
        .await)?)
    }

    /// Applies changes to a key in one write; `Ok(None)` when there is no such key.
    pub async fn update_api_key(
        &self,
        id: &str,
        changes: &ApiKeyChanges<'_>,
    ) -> Result<Option<ApiKeyRow>, StoreError> {
        Ok(with_pool!(self, |pool| bind_governance_changes!(
            sqlx::query_as::<_, ApiKeyRow>(concat!(
                "UPDATE api_keys SET ",
                governance_set!(),
                ", name = COALESCE($12, name),
                 expires_at = CASE WHEN $13 THEN $14 ELSE expires_at END
                 WHERE id = $1 RETURNING ",
                api_key_columns!()
            ))
            .bind(id),
            &changes.governance
        )
        .bind(changes.name.map(EntityName::as_str))
        .bind(changes.expires_at.is_some())
        .bind(changes.expires_at.flatten())
        .fetch_optional(pool)
        .await)?)
    }

    /// Revokes a key: every lookup that reaches the store refuses it from now on. Revoking again keeps the
    /// first revocation time.
    pub async fn revoke_api_key(&self, id: &str) -> Result<Option<ApiKeyRow>, StoreError> {
        Ok(with_pool!(self, |pool| {
            sqlx::query_as::<_, ApiKeyRow>(
            concat!(
                "UPDATE api_keys SET revoked_at = COALESCE(revoked_at, $2) WHERE id = $1 RETURNING ",
                api_key_columns!()
            )
        )
        .bind(id)
        .bind(now())
        .fetch_optional(pool)
        .await
        })?)
    }
}
