//! Persistence on Postgres through `sqlx`: tenancy, deployments, tool sources, responses and their steps.

pub mod admin;
pub mod responses;
pub mod tenancy;

use sqlx::migrate::Migrator;
use sqlx::postgres::{PgPool, PgPoolOptions};

/// The Postgres migrations, embedded in the binary.
pub static MIGRATOR: Migrator = sqlx::migrate!("../../migrations/postgres");

/// Failures of the store, mapped to API errors at the boundary.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("not found")]
    NotFound,
    #[error("conflict: {0}")]
    Conflict(String),
    #[error("stored data is corrupt: {0}")]
    Corrupt(String),
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    #[error("migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
}

impl StoreError {
    /// Maps a unique-constraint violation to `Conflict` naming what clashed.
    pub fn from_write(error: sqlx::Error, what: &str) -> StoreError {
        if let sqlx::Error::Database(db) = &error {
            if db.is_unique_violation() {
                return StoreError::Conflict(what.to_owned());
            }
            if db.is_foreign_key_violation() {
                return StoreError::NotFound;
            }
        }
        StoreError::Database(error)
    }
}

/// Handle to the database; cheap to clone.
#[derive(Debug, Clone)]
pub struct Store {
    pool: PgPool,
}

impl Store {
    /// Connects to `url` with a bounded pool.
    pub async fn connect(url: &str, max_connections: u32) -> Result<Store, StoreError> {
        let pool = PgPoolOptions::new()
            .max_connections(max_connections)
            .connect(url)
            .await?;
        Ok(Store { pool })
    }

    pub fn from_pool(pool: PgPool) -> Store {
        Store { pool }
    }

    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Applies pending migrations.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        MIGRATOR.run(&self.pool).await?;
        Ok(())
    }

    /// Whether the database answers.
    pub async fn ping(&self) -> Result<(), StoreError> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }
}

/// Current Unix time in seconds.
pub fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// A new opaque id with a kind prefix, e.g. `resp_3f2a...`.
pub fn new_id(prefix: &str) -> String {
    format!("{prefix}_{}", uuid::Uuid::new_v4().simple())
}
