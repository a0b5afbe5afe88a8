//! Scratch databases: a fresh Postgres database or embedded SQLite file for one test, removed after it.
//!
//! Shared by the store tests and the end-to-end harness, so that every test runs on a database of its own.

use anyhow::Context;
use sqlx::Connection;

/// Where the per-test Postgres databases are created; `TEST_DATABASE_URL` overrides the local default.
pub fn server_url() -> String {
    std::env::var("TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into())
}

/// A database made for one test: a Postgres database, or a directory holding an embedded store's file.
/// Dropping it removes it.
#[derive(Debug)]
pub struct ScratchDatabase {
    url: String,
    place: Place,
}

#[derive(Debug)]
enum Place {
    Postgres(String),
    Sqlite(std::path::PathBuf),
}

impl ScratchDatabase {
    /// A new, empty Postgres database on the test server.
    pub async fn postgres() -> anyhow::Result<ScratchDatabase> {
        let server = server_url();
        let name = format!("gw_test_{}", uuid::Uuid::new_v4().simple());
        let mut conn = sqlx::PgConnection::connect(&server)
            .await
            .context("connect to the test Postgres")?;
        sqlx::query(&format!("CREATE DATABASE \"{name}\""))
            .execute(&mut conn)
            .await?;
        let url = match server.rsplit_once('/') {
            Some((base, _)) => format!("{base}/{name}"),
            None => anyhow::bail!("TEST_DATABASE_URL has no database path"),
        };
        Ok(ScratchDatabase {
            url,
            place: Place::Postgres(name),
        })
    }

    /// The URL of an embedded store in a fresh directory under the system's temp dir. Neither exists yet: the
    /// store creates both, as it would on a fresh machine.
    pub fn sqlite() -> ScratchDatabase {
        let dir = std::env::temp_dir().join(format!("gw_test_{}", uuid::Uuid::new_v4().simple()));
        ScratchDatabase {
            url: format!("sqlite://{}?mode=rwc", dir.join("gateway.db").display()),
            place: Place::Sqlite(dir),
        }
    }

    /// The database's URL, as the gateway's `database.url` takes it.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Whether this is an embedded (SQLite) store.
    pub fn is_sqlite(&self) -> bool {
        matches!(self.place, Place::Sqlite(_))
    }
}

/// Polls until at least `n` statements of `pool`'s database wait on a lock (a test that holds one from another
/// transaction then knows what it holds up), or the database fails to say.
pub async fn until_statements_wait_on_a_lock(pool: &sqlx::PgPool, n: i64) -> sqlx::Result<()> {
    loop {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM pg_stat_activity
             WHERE datname = current_database() AND wait_event_type = 'Lock'",
        )
        .fetch_one(pool)
        .await?;
        if waiting >= n {
            return Ok(());
        }
        tokio::task::yield_now().await;
    }
}

impl Drop for ScratchDatabase {
    fn drop(&mut self) {
        match &self.place {
            Place::Sqlite(dir) => {
                let _ = std::fs::remove_dir_all(dir);
            }
            Place::Postgres(name) => {
                let name = name.clone();
                // Drop cannot await and the test's runtime may be busy or gone: drop the database on a thread
                // and runtime of its own.
                let _ = std::thread::spawn(move || {
                    let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                    else {
                        return;
                    };
                    runtime.block_on(async move {
                        if let Ok(mut conn) = sqlx::PgConnection::connect(&server_url()).await {
                            let _ = sqlx::query(&format!(
                                "DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"
                            ))
                            .execute(&mut conn)
                            .await;
                        }
                    });
                })
                .join();
            }
        }
    }
}
