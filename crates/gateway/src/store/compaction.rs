//! The generated compaction key, shared by every replica through the database.

use super::{Store, StoreError};

/// The name of the one generated key.
const GENERATED: &str = "generated";

impl Store {
    /// The generated key (base64), stored now as `candidate` when there is none yet; whichever replica stores
    /// first wins, and every replica answers its key.
    pub async fn compaction_key(
        &self,
        candidate: &str,
        created_at: i64,
    ) -> Result<String, StoreError> {
        with_pool!(self, |pool| {
            sqlx::query(
                "INSERT INTO compaction_keys (name, key_base64, created_at) VALUES ($1, $2, $3) \
                 ON CONFLICT (name) DO NOTHING",
            )
            .bind(GENERATED)
            .bind(candidate)
            .bind(created_at)
            .execute(pool)
            .await
            .map(|_| ())
        })?;
        let (key,): (String,) = with_pool!(self, |pool| {
            sqlx::query_as("SELECT key_base64 FROM compaction_keys WHERE name = $1")
                .bind(GENERATED)
                .fetch_one(pool)
                .await
        })?;
        Ok(key)
    }

    /// The generated key (base64), if one was ever stored.
    pub async fn generated_compaction_key(&self) -> Result<Option<String>, StoreError> {
        let key: Option<(String,)> = with_pool!(self, |pool| {
            sqlx::query_as("SELECT key_base64 FROM compaction_keys WHERE name = $1")
                .bind(GENERATED)
                .fetch_optional(pool)
                .await
        })?;
        Ok(key.map(|(key,)| key))
    }
}
