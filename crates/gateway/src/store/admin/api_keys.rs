//! API keys of projects: kept as a SHA-256 hash (never read back) and a short prefix to tell keys apart.

use gateway_core::entity::EntityName;

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
}

/// A new API key: the caller generates the key and passes only its hash and prefix.
#[derive(Debug, Clone)]
pub struct NewApiKey<'a> {
    pub project_id: &'a str,
    pub name: &'a EntityName,
    pub key_hash: &'a str,
    pub key_prefix: &'a str,
}

/// The columns of an `ApiKeyRow`: never the hash.
macro_rules! api_key_columns {
    () => {
        "id, project_id, name, key_prefix, created_at, revoked_at"
    };
}

impl Store {
    /// Records a new key of a project; `Ok(None)` when the project does not exist.
    pub async fn create_api_key(
        &self,
        new: &NewApiKey<'_>,
    ) -> Result<Option<ApiKeyRow>, StoreError> {
        with_pool!(self, |pool| sqlx::query_as::<_, ApiKeyRow>(concat!(
            "INSERT INTO api_keys (id, project_id, name, key_hash, key_prefix, created_at)
             SELECT $1, p.id, $3, $4, $5, $6 FROM projects p WHERE p.id = $2
             RETURNING ",
            api_key_columns!()
        ))
        .bind(new_id("key"))
        .bind(new.project_id)
        .bind(new.name.as_str())
        .bind(new.key_hash)
        .bind(new.key_prefix)
        .bind(now())
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

    /// One key.
    pub async fn get_api_key(&self, id: &str) -> Result<Option<ApiKeyRow>, StoreError> {
        self.select_by_id(
            concat!(
                "SELECT ",
                api_key_columns!(),
                " FROM api_keys WHERE id = $1"
            ),
            id,
        )
        .await
    }

    /// Renames a key (`None` keeps the name).
    pub async fn update_api_key(
        &self,
        id: &str,
        name: Option<&EntityName>,
    ) -> Result<Option<ApiKeyRow>, StoreError> {
        Ok(with_pool!(self, |pool| sqlx::query_as::<_, ApiKeyRow>(
            concat!(
                "UPDATE api_keys SET name = COALESCE($2, name) WHERE id = $1 RETURNING ",
                api_key_columns!()
            )
        )
        .bind(id)
        .bind(name.map(EntityName::as_str))
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
