//! Persistence through `sqlx` on Postgres or on an embedded SQLite file: tenancy, deployments, tool sources,
//! responses and their steps.
//!
//! One `Store` serves both backends. Most statements are portable (SQLite accepts Postgres's `$n`
//! placeholders), so a method is written once and `with_pool!` compiles its body for each backend; where the
//! SQL differs (arrays, `UNNEST`, `= ANY`) the method matches on the backend. Row types derive `sqlx::FromRow`,
//! which is generic over the row type, so one derive reads either backend.

/// The value of `$body` (a block of statements on Postgres, whose `?`s give a `StoreError`), waiting at most the
/// store's `reply_wait` for the database (`answered_within`); that failure, or the body's own, is returned from the
/// enclosing method.
macro_rules! answered {
    ($store:expr, $body:expr) => {
        $crate::store::answered_within($store.reply_wait, async {
            Ok::<_, $crate::store::StoreError>($body)
        })
        .await?
    };
}

/// Runs `$body` with `$pool` bound to the store's pool, whichever backend it is. The body is compiled once per
/// backend, so one SQL text, one list of binds and one row conversion serve both. On Postgres it waits at most the
/// store's `reply_wait` for the database (`answered_within`), and then returns that failure from the enclosing
/// method, as a `?` in the body returns the body's own.
macro_rules! with_pool {
    ($store:expr, |$pool:ident| $body:expr) => {
        match &$store.backend {
            $crate::store::Backend::Postgres($pool) => {
                answered!($store, $body)
            }
            $crate::store::Backend::Sqlite($pool) => $body,
        }
    };
}

/// Like `with_pool!`, for statements that only read: on the embedded store they run on the connections kept
/// for reads, beside its one writer, so that they neither wait for writes nor hold them up.
macro_rules! with_read_pool {
    ($store:expr, |$pool:ident| $body:expr) => {
        match &$store.backend {
            $crate::store::Backend::Postgres($pool) => {
                answered!($store, $body)
            }
            $crate::store::Backend::Sqlite(writer) => {
                let $pool = $store.embedded_reads.as_ref().unwrap_or(writer);
                $body
            }
        }
    };
}

/// The database clock in milliseconds, as Postgres reads it: times that decide ownership or a deadline come from
/// the database, never from a replica's clock (SPEC 9).
macro_rules! pg_now_ms {
    () => {
        "(extract(epoch from clock_timestamp()) * 1000)::bigint"
    };
}

/// The database clock in milliseconds, as SQLite reads it.
macro_rules! sqlite_now_ms {
    () => {
        "CAST(unixepoch('subsec') * 1000 AS INTEGER)"
    };
}

/// One SQL text with the database clock (milliseconds) between `$before` and `$after` (and again before
/// `$last`, when given), for the store's backend.
macro_rules! with_clock {
    ($store:expr, $before:literal, $after:literal) => {
        match &$store.backend {
            $crate::store::Backend::Postgres(_) => concat!($before, pg_now_ms!(), $after),
            $crate::store::Backend::Sqlite(_) => concat!($before, sqlite_now_ms!(), $after),
        }
    };
    ($store:expr, $before:literal, $between:literal, $last:literal) => {
        match &$store.backend {
            $crate::store::Backend::Postgres(_) => {
                concat!($before, pg_now_ms!(), $between, pg_now_ms!(), $last)
            }
            $crate::store::Backend::Sqlite(_) => {
                concat!($before, sqlite_now_ms!(), $between, sqlite_now_ms!(), $last)
            }
        }
    };
}

/// Postgres: the `UsageRecord`s of a JSON array parameter (`$param`) as rows in `usage_records`' column order.
macro_rules! usage_recordset {
    ($param:literal) => {
        concat!(
            "jsonb_to_recordset(",
            $param,
            ") AS u(response_id text, seq int, project_id text, api_key_id text, deployment text,
                provider_kind text, tool_source text, input_tokens bigint, cached_tokens bigint,
                output_tokens bigint, reasoning_tokens bigint, cost_usd float8, created_at bigint, calls bigint)"
        )
    };
}

mod abandoned;
pub mod admin;
mod backend;
mod compaction;
pub mod conversations;
pub mod governance;
mod json_text;
mod multirow;
pub mod notify;
pub mod observe;
pub mod ownership;
pub mod responses;
pub mod stored_tools;
pub mod tenancy;
pub mod webhooks;

use sqlx::migrate::Migrator;
use sqlx::postgres::PgPool;
use sqlx::sqlite::SqlitePool;

pub use backend::{EmbeddedLock, SessionLimits, DEFAULT_URL};
pub use observe::StoreObserver;

use std::sync::Arc;

use crate::config::DatabaseConfig;
use observe::{Timing, Unobserved};
use secrecy::ExposeSecret;

/// The Postgres migrations, embedded in the binary.
pub static POSTGRES_MIGRATOR: Migrator = sqlx::migrate!("../../migrations/postgres");

/// The SQLite migrations of the embedded store, embedded in the binary.
pub static SQLITE_MIGRATOR: Migrator = sqlx::migrate!("../../migrations/sqlite");

/// Failures of the store, mapped to API errors at the boundary.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("not found")]
    NotFound,
    #[error("conflict: {0}")]
    Conflict(String),
    #[error("stored data is corrupt: {0}")]
    Corrupt(String),
    /// No pooled connection became free within `database.acquire_timeout_ms`: the store is busy, not broken.
    #[error("no store connection became free in time")]
    Busy,
    /// A write for a response this replica no longer drives: another replica took it over, or it was deleted.
    #[error("the response is no longer driven by this replica")]
    NotOwner,
    /// A write that shared a batch (group commit) with others, which failed as a whole, for a passing reason (a
    /// deadlock, a server restarting), before any of it was written; the text says what the batch met.
    #[error("the batch this write was in failed: {0}")]
    BatchFailed(String),
    #[error("database error: {0}")]
    Database(#[source] sqlx::Error),
    #[error("migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// The database URL names neither Postgres nor SQLite. The URL itself is not repeated: it may hold a password.
    #[error("unsupported database URL: expected postgres://, postgresql:// or sqlite:")]
    UnsupportedUrl,
    #[error("cannot create the directory of the embedded store: {0}")]
    Directory(#[source] std::io::Error),
    /// Another process holds the lock of this embedded store file (SPEC 9: one process per embedded store).
    #[error("the embedded store {0} is used by another gateway process; stop that one, or give this one another database.url")]
    InUse(String),
    /// The lock file of the embedded store could not be opened or locked.
    #[error("cannot lock the embedded store with {0}: {1}")]
    Lock(String, #[source] std::io::Error),
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
        StoreError::from(error)
    }
}

impl StoreError {
    /// Whether the store may well answer if asked again in a moment: it was busy, or the connection to the
    /// database failed (the server restarting, a network hiccup), as opposed to a refused or unreadable write.
    pub fn is_transient(&self) -> bool {
        match self {
            StoreError::Busy | StoreError::BatchFailed(_) => true,
            StoreError::Database(error) => match error {
                sqlx::Error::Io(_)
                | sqlx::Error::Tls(_)
                | sqlx::Error::Protocol(_)
                | sqlx::Error::PoolTimedOut
                | sqlx::Error::PoolClosed
                | sqlx::Error::WorkerCrashed => true,
                sqlx::Error::Database(db) => db.code().is_some_and(|code| {
                    // Connection exceptions (08…), an administrator shutdown or restart (57P01–57P03), a
                    // serialization failure or deadlock (40001, 40P01), a statement cancelled (57014: an
                    // operator's `statement_timeout` or `pg_cancel_backend`) or a lock not had in time (55P03:
                    // `lock_timeout`), the server short of resources (53…: disk full, out of memory, too many
                    // connections), SQLite's busy and locked (5, 6). None says the data is wrong: a running
                    // response that met one is read again later rather than ended as unreadable.
                    code.starts_with("08")
                        || code.starts_with("53")
                        || matches!(
                            &*code,
                            "57P01"
                                | "57P02"
                                | "57P03"
                                | "57014"
                                | "55P03"
                                | "40001"
                                | "40P01"
                                | "5"
                                | "6"
                        )
                }),
                _ => false,
            },
            StoreError::NotFound
            | StoreError::Conflict(_)
            | StoreError::Corrupt(_)
            | StoreError::NotOwner
            | StoreError::Migrate(_)
            | StoreError::UnsupportedUrl
            | StoreError::Directory(_)
            | StoreError::InUse(_)
            | StoreError::Lock(..) => false,
        }
    }
}

impl StoreError {
    /// Whether a replica that is starting waits for the database after failing this way: it may well answer in a
    /// moment ([`StoreError::is_transient`]), and the failure is not one of the connection's setting, which no
    /// wait mends: TLS refused (the server takes none, or a certificate fails its check; rustls reports the
    /// latter as unreadable data in the handshake).
    pub fn heals_while_starting(&self) -> bool {
        let setting = match self {
            StoreError::Database(sqlx::Error::Tls(_)) => true,
            StoreError::Database(sqlx::Error::Io(error)) => {
                error.kind() == std::io::ErrorKind::InvalidData
                    && error
                        .get_ref()
                        .is_some_and(|inner| inner.is::<rustls::Error>())
            }
            _ => false,
        };
        self.is_transient() && !setting
    }

    /// Whether a write that failed this way may have committed all the same: the statement reached the database
    /// and the connection failed before its answer came back (a lost reply). A write that found no free
    /// connection, or that the database refused, did not.
    pub fn may_have_committed(&self) -> bool {
        matches!(
            self,
            StoreError::Database(
                sqlx::Error::Io(_) | sqlx::Error::Protocol(_) | sqlx::Error::WorkerCrashed
            )
        )
    }
}

impl From<sqlx::Error> for StoreError {
    fn from(error: sqlx::Error) -> StoreError {
        match error {
            sqlx::Error::PoolTimedOut => StoreError::Busy,
            other => StoreError::Database(other),
        }
    }
}

/// The database behind a `Store`.
#[derive(Debug, Clone)]
pub enum Backend {
    /// The production store.
    Postgres(PgPool),
    /// The embedded store: one SQLite file (or memory), for a single machine with no database server.
    Sqlite(SqlitePool),
}

/// Handle to the database; cheap to clone (one reference count: a store is cloned on a request's path, by the
/// governance's places and counters).
#[derive(Debug, Clone)]
pub struct Store(Arc<StoreParts>);

impl std::ops::Deref for Store {
    type Target = StoreParts;

    fn deref(&self) -> &StoreParts {
        &self.0
    }
}

/// What a [`Store`] holds.
#[derive(Debug, Clone)]
pub struct StoreParts {
    backend: Backend,
    /// On the embedded store (a file), the connections for statements that only read (`with_read_pool!`);
    /// `backend`'s one connection takes every write.
    embedded_reads: Option<SqlitePool>,
    /// Hears how long each operation took (`Unobserved` until `observed_by`).
    observer: Arc<dyn StoreObserver>,
    /// The writer that batches responses' writes (`with_group_commit`); without it each is written alone.
    group: Option<responses::GroupCommit>,
    /// How long a statement on Postgres waits for the database's answer before it is abandoned, and a write in
    /// doubt (`with_reply_wait`).
    reply_wait: std::time::Duration,
}

/// How long a statement waits for the database by default (`database.reply_timeout_ms`).
fn default_reply_wait() -> std::time::Duration {
    std::time::Duration::from_millis(DatabaseConfig::default().reply_timeout_ms)
}

/// What `statement` answers, or, when the database has not answered within `wait`, the failure of a lost reply
/// (`unanswered`). Over a connection whose database vanished without closing it the answer would never come, and
/// the request, or the duty, that waits for it would wait for ever. The statement is abandoned on its connection,
/// which the pool tests, with the same bound, as it takes it back (`abandoned`).
pub(crate) async fn answered_within<T, E: From<sqlx::Error>>(
    wait: std::time::Duration,
    statement: impl std::future::Future<Output = Result<T, E>>,
) -> Result<T, E> {
    match tokio::time::timeout(wait, statement).await {
        Ok(answer) => answer,
        Err(_) => {
            abandoned::noted(wait);
            Err(E::from(unanswered(wait)))
        }
    }
}

/// The failure of a statement the database did not answer within `wait`: an I/O failure, so transient, and in
/// doubt for a write (`StoreError::may_have_committed`), as after a lost reply.
fn unanswered(wait: std::time::Duration) -> sqlx::Error {
    sqlx::Error::Io(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!(
            "the database did not answer within {} ms (database.reply_timeout_ms); whether a write was made is \
             unknown",
            wait.as_millis()
        ),
    ))
}

impl Store {
    /// Deletes row `id` of `project_id` with `delete_row` (`$1` the id, `$2` the project) and, when it was there,
    /// its children with each of `delete_children` (`$1` the id), in one transaction, after each of `before`
    /// (`$1` the id, `$2` the project, reading the row as it was): where a foreign key would cascade as well (on
    /// SQLite, when its connection enforces them) they find nothing left. Whether the row was there.
    async fn delete_with_children(
        &self,
        before: &[&str],
        delete_row: &str,
        delete_children: &[&str],
        id: &str,
        project_id: &str,
    ) -> Result<bool, StoreError> {
        let deleted = with_pool!(self, |pool| {
            let mut tx = pool.begin().await?;
            for statement in before {
                sqlx::query(statement)
                    .bind(id)
                    .bind(project_id)
                    .execute(&mut *tx)
                    .await?;
            }
            let deleted = sqlx::query(delete_row)
                .bind(id)
                .bind(project_id)
                .execute(&mut *tx)
                .await?
                .rows_affected();
            if deleted > 0 {
                for delete in delete_children {
                    sqlx::query(delete).bind(id).execute(&mut *tx).await?;
                }
            }
            tx.commit().await?;
            Ok::<_, sqlx::Error>(deleted)
        })?;
        Ok(deleted > 0)
    }

    /// Closes the pools: statements still running finish, every later one fails.
    pub async fn close(&self) {
        if let Some(reads) = &self.embedded_reads {
            reads.close().await;
        }
        match &self.backend {
            Backend::Postgres(pool) => pool.close().await,
            Backend::Sqlite(pool) => pool.close().await,
        }
    }

    /// Connects to `url` with a bounded pool: `postgres://` or `postgresql://` selects Postgres, `sqlite:` the
    /// embedded store (created if missing, with its directory).
    pub async fn connect(url: &str, max_connections: u32) -> Result<Store, StoreError> {
        // The configured default wait for a pooled connection.
        let acquire_timeout =
            std::time::Duration::from_millis(DatabaseConfig::default().acquire_timeout_ms);
        Store::connect_waiting(url, max_connections, acquire_timeout).await
    }

    /// Like `connect`; a statement waits at most `acquire_timeout` for a pooled connection, then fails
    /// (`StoreError::Busy`).
    pub async fn connect_waiting(
        url: &str,
        max_connections: u32,
        acquire_timeout: std::time::Duration,
    ) -> Result<Store, StoreError> {
        let session = SessionLimits::of(&DatabaseConfig::default());
        Store::connect_limited(url, max_connections, acquire_timeout, session).await
    }

    /// Like `connect_waiting`, with every Postgres session told `session` when it starts.
    pub async fn connect_limited(
        url: &str,
        max_connections: u32,
        acquire_timeout: std::time::Duration,
        session: SessionLimits,
    ) -> Result<Store, StoreError> {
        let opened = backend::connect(url, max_connections, acquire_timeout, session).await?;
        Ok(Store(Arc::new(StoreParts {
            backend: opened.backend,
            embedded_reads: opened.embedded_reads,
            observer: Arc::new(Unobserved),
            group: None,
            reply_wait: default_reply_wait(),
        })))
    }

    /// Connects as `database` says: to its URL, or to the embedded store at `DEFAULT_URL` when there is none. A
    /// database that does not answer (not up yet, restarting, unreachable for a moment) is tried again, with
    /// backoff, for `database.startup_wait_ms`.
    pub async fn connect_configured(database: &DatabaseConfig) -> Result<Store, StoreError> {
        let url = database.url.as_ref().map(|u| u.expose_secret());
        let give_up_at = tokio::time::Instant::now()
            + std::time::Duration::from_millis(database.startup_wait_ms);
        let mut waits = crate::retry::RetryPolicy::new(u32::MAX, 100).waits();
        loop {
            let connected = Store::connect_limited(
                url.unwrap_or(DEFAULT_URL),
                database.max_connections,
                std::time::Duration::from_millis(database.acquire_timeout_ms),
                SessionLimits::of(database),
            )
            .await;
            let failure = match connected {
                Ok(store) => {
                    return Ok(store.with_reply_wait(std::time::Duration::from_millis(
                        database.reply_timeout_ms,
                    )))
                }
                Err(failure) => failure,
            };
            let wait = waits
                .next()
                .map(|wait| wait.min(std::time::Duration::from_secs(2)))
                .filter(|wait| {
                    failure.heals_while_starting()
                        && tokio::time::Instant::now() + *wait < give_up_at
                });
            let Some(wait) = wait else {
                return Err(failure);
            };
            tracing::warn!(error = %failure, "the database did not answer; waiting for it");
            tokio::time::sleep(wait).await;
        }
    }

    /// A store on connections of its own, for the replica's ownership duties (beats, claims, releases): they never
    /// wait behind the requests' pool, so load, a full pool or many followers cannot make a healthy replica lose
    /// its lease (SPEC 9). Postgres gets a pool of two connections, kept open; the embedded store,
    /// one process on one file, shares its pool.
    pub fn for_ownership(&self, acquire_timeout: std::time::Duration) -> Store {
        match &self.backend {
            Backend::Postgres(pool) => Store(Arc::new(StoreParts {
                backend: Backend::Postgres(
                    sqlx::postgres::PgPoolOptions::new()
                        .max_connections(2)
                        .min_connections(1)
                        .after_release(abandoned::after_release)
                        .idle_timeout(None)
                        .max_lifetime(None)
                        .acquire_timeout(acquire_timeout)
                        .connect_lazy_with((*pool.connect_options()).clone()),
                ),
                embedded_reads: None,
                observer: Arc::clone(&self.observer),
                group: None,
                reply_wait: self.reply_wait,
            })),
            Backend::Sqlite(_) => self.clone(),
        }
    }

    /// Locks the embedded store `database` names for this process, when it names one (a file, not memory): a
    /// gateway holds this for as long as it serves. `StoreError::InUse` when another process serves it.
    pub fn lock_configured(database: &DatabaseConfig) -> Result<Option<EmbeddedLock>, StoreError> {
        let url = database.url.as_ref().map(|u| u.expose_secret());
        backend::lock_embedded(url.unwrap_or(DEFAULT_URL))
    }

    /// This store, reporting the time of its operations to `observer` (the metrics, in the gateway).
    pub fn observed_by(self, observer: Arc<dyn StoreObserver>) -> Store {
        Store(Arc::new(StoreParts {
            observer,
            ..StoreParts::clone(&self)
        }))
    }

    /// This store, with responses' writes batched by group commit: a writer of its own takes what concurrent
    /// runs hand it, at most `batches_in_flight` batches at a time (one on the embedded store); 0 writes each
    /// alone. Call it after `observed_by`, whose observer then hears of each batch.
    pub fn with_group_commit(self, batches_in_flight: usize) -> Store {
        let group = (batches_in_flight > 0).then(|| {
            responses::GroupCommit::start(
                self.backend.clone(),
                Arc::clone(&self.observer),
                batches_in_flight,
                self.reply_wait,
            )
        });
        Store(Arc::new(StoreParts {
            group,
            ..StoreParts::clone(&self)
        }))
    }

    /// This store, with each statement on Postgres waiting at most `wait` for the database's answer, then
    /// abandoned, and a write answered as in doubt. Call it before `with_group_commit`, whose writer takes it.
    pub fn with_reply_wait(self, wait: std::time::Duration) -> Store {
        Store(Arc::new(StoreParts {
            reply_wait: wait,
            ..StoreParts::clone(&self)
        }))
    }

    /// Starts timing operation `name`: the observer hears of it when the returned guard is dropped.
    fn timed(&self, name: &'static str) -> Timing<'_> {
        Timing::start(&*self.observer, name)
    }

    /// Whether this is the embedded store, which one process serves.
    pub fn is_embedded(&self) -> bool {
        matches!(self.backend, Backend::Sqlite(_))
    }

    /// The database behind this store, e.g. for a test to inspect what was written.
    pub fn backend(&self) -> &Backend {
        &self.backend
    }

    /// Applies pending migrations of this store's backend.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        match &self.backend {
            Backend::Postgres(pool) => POSTGRES_MIGRATOR.run(pool).await?,
            Backend::Sqlite(pool) => SQLITE_MIGRATOR.run(pool).await?,
        }
        Ok(())
    }

    /// Whether every embedded migration has been applied (readiness).
    pub async fn migrations_applied(&self) -> Result<bool, StoreError> {
        let expected = match &self.backend {
            Backend::Postgres(_) => POSTGRES_MIGRATOR.iter().count(),
            Backend::Sqlite(_) => SQLITE_MIGRATOR.iter().count(),
        } as i64;
        let applied: i64 = with_pool!(self, |pool| sqlx::query_scalar(
            "SELECT COUNT(*) FROM _sqlx_migrations WHERE success"
        )
        .fetch_one(pool)
        .await)?;
        Ok(applied >= expected)
    }
}

#[cfg(test)]
mod tests {
    use super::StoreError;

    #[test]
    fn a_pool_that_gave_no_connection_in_time_is_busy_and_other_faults_are_database_errors() {
        assert!(matches!(
            StoreError::from(sqlx::Error::PoolTimedOut),
            StoreError::Busy
        ));
        assert!(matches!(
            StoreError::from(sqlx::Error::PoolClosed),
            StoreError::Database(_)
        ));
    }
}
