//! Which database the store runs on: choosing it from the URL and opening its pool.

use std::fs::{File, OpenOptions, TryLockError};
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions};

use super::{Backend, StoreError};

/// The embedded store of a fresh machine: `data/gateway.db` under the working directory, created if missing.
pub const DEFAULT_URL: &str = "sqlite://data/gateway.db?mode=rwc";

/// How long a SQLite statement waits for the file's lock before it fails with "database is locked": only a
/// checkpoint, or another program opening the file, holds it against this process's one writer.
const SQLITE_BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// What every Postgres session of the gateway is told when it starts (startup options: no round trip), so that a
/// replica that stops between two statements of a transaction, or whose machine or network vanishes, does not hold
/// row locks (and other replicas' takeovers) for hours: the database ends such a session itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionLimits {
    /// `idle_in_transaction_session_timeout`, in milliseconds; 0 leaves the database's setting.
    pub idle_in_transaction_ms: u64,
    /// `tcp_keepalives_idle` in seconds (probes every third of it, three of them) and `tcp_user_timeout` twice
    /// as long; 0 leaves the database's settings.
    pub keepalive_secs: u64,
}

impl SessionLimits {
    /// The limits `database` sets.
    pub fn of(database: &crate::config::DatabaseConfig) -> SessionLimits {
        SessionLimits {
            idle_in_transaction_ms: database.idle_in_transaction_timeout_ms,
            keepalive_secs: database.server_keepalive_secs,
        }
    }

    /// The settings as startup options of a connection.
    fn applied_to(self, options: PgConnectOptions) -> PgConnectOptions {
        let mut settings = Vec::new();
        if self.idle_in_transaction_ms > 0 {
            settings.push((
                "idle_in_transaction_session_timeout",
                self.idle_in_transaction_ms.to_string(),
            ));
        }
        if self.keepalive_secs > 0 {
            let idle = self.keepalive_secs;
            settings.push(("tcp_keepalives_idle", idle.to_string()));
            settings.push(("tcp_keepalives_interval", (idle / 3).max(1).to_string()));
            settings.push(("tcp_keepalives_count", "3".to_owned()));
            settings.push(("tcp_user_timeout", idle.saturating_mul(2_000).to_string()));
        }
        if settings.is_empty() {
            options
        } else {
            options.options(settings)
        }
    }
}

/// A backend as opened: its pool, and on the embedded store the connections kept for reads.
pub(super) struct Opened {
    pub(super) backend: Backend,
    pub(super) embedded_reads: Option<SqlitePool>,
}

/// Opens the pool of the backend that `url` names.
pub(super) async fn connect(
    url: &str,
    max_connections: u32,
    acquire_timeout: Duration,
    session: SessionLimits,
) -> Result<Opened, StoreError> {
    let scheme = url
        .split_once(':')
        .map(|(scheme, _)| scheme.to_ascii_lowercase())
        .unwrap_or_default();
    match scheme.as_str() {
        "postgres" | "postgresql" => {
            let pool = PgPoolOptions::new()
                .max_connections(max_connections)
                // No ping before every checkout: a dead connection fails its query and is dropped anyway.
                .test_before_acquire(false)
                .after_release(super::abandoned::after_release)
                .acquire_timeout(acquire_timeout)
                .connect_with(session.applied_to(PgConnectOptions::from_str(url)?))
                .await?;
            Ok(Opened {
                backend: Backend::Postgres(pool),
                embedded_reads: None,
            })
        }
        "sqlite" => {
            let (writer, embedded_reads) =
                connect_sqlite(url, max_connections, acquire_timeout).await?;
            Ok(Opened {
                backend: Backend::Sqlite(writer),
                embedded_reads,
            })
        }
        _ => Err(StoreError::UnsupportedUrl),
    }
}

/// The statements each connection of the embedded store keeps prepared: the writer's multi-row writes alone come in
/// seven kinds of seven sizes (`multirow::parts`), past sqlx's default of 100 with the rest.
const KEPT_STATEMENTS: usize = 256;

/// Opens the embedded store: WAL (readers never wait for the writer), foreign keys enforced, and the file and
/// its directory created if missing.
///
/// Every statement that writes goes through **one** connection, kept open: SQLite lets one writer at a time
/// have the file, and writers on several connections contended for it by sleeping and retrying (its busy
/// handler), which under load cost seconds of waiting, and failed outright a transaction that read before it
/// wrote whenever another connection had committed in between ("database is locked"). On one connection the
/// writers queue in the pool instead, in order. The statements that only read (`with_read_pool!`) have
/// connections of their own (up to `max_connections`, refusing writes), so a long read never holds up a write.
/// An in-memory database has its one connection for both.
async fn connect_sqlite(
    url: &str,
    max_connections: u32,
    acquire_timeout: Duration,
) -> Result<(SqlitePool, Option<SqlitePool>), StoreError> {
    let url = resolve_sqlite(url);
    let mut options = SqliteConnectOptions::from_str(url)?
        .create_if_missing(true)
        .foreign_keys(true)
        .busy_timeout(SQLITE_BUSY_TIMEOUT)
        .statement_cache_capacity(KEPT_STATEMENTS);
    // One connection that never closes: for memory, separate connections would each see a database of their
    // own; for a file, it is the one writer (and keeps its prepared statements and page cache warm).
    let writer = SqlitePoolOptions::new()
        .max_connections(1)
        .min_connections(1)
        .idle_timeout(None)
        .max_lifetime(None)
        .acquire_timeout(acquire_timeout);
    if is_in_memory(url) {
        let pool = writer.connect_with(options).await?;
        tracing::info!(store.path = ":memory:", "opened the embedded store");
        return Ok((pool, None));
    }
    options = options.journal_mode(SqliteJournalMode::Wal);
    let directory = options.get_filename().parent();
    if let Some(directory) = directory.filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(directory).map_err(StoreError::Directory)?;
    }
    let path = options.get_filename().display().to_string();
    let writes = writer.connect_with(options.clone()).await?;
    // The file exists and is in WAL mode now (the writer's connection made it so, and the mode is kept in the
    // file): the readers only open it.
    let read_options = options.create_if_missing(false).pragma("query_only", "ON");
    let reads = SqlitePoolOptions::new()
        .max_connections(max_connections.max(1))
        .acquire_timeout(acquire_timeout)
        .connect_with(read_options)
        .await?;
    tracing::info!(store.path = %path, "opened the embedded store");
    Ok((writes, Some(reads)))
}

/// `sqlite:` alone asks for the embedded store without saying where: the default file.
fn resolve_sqlite(url: &str) -> &str {
    if matches!(url, "sqlite:" | "sqlite://") {
        DEFAULT_URL
    } else {
        url
    }
}

/// The exclusive lock of an embedded store file, held by the process that serves it for as long as this lives
/// (SPEC 9: one process per embedded store). The operating system releases it when the process ends, however it
/// ends, so a killed gateway never leaves a stale lock behind.
#[derive(Debug)]
pub struct EmbeddedLock {
    _file: File,
}

/// Takes the lock of the embedded store that `url` names: an exclusive lock on `<file>.lock` beside the
/// database (a file of its own, so that it never interferes with SQLite's own locks on the database). Postgres
/// and in-memory databases need none. A lock another process holds is `StoreError::InUse`, at once: a second
/// gateway must not wait, and must never take over the runs of the first.
pub(super) fn lock_embedded(url: &str) -> Result<Option<EmbeddedLock>, StoreError> {
    let is_sqlite = url
        .split_once(':')
        .is_some_and(|(scheme, _)| scheme.eq_ignore_ascii_case("sqlite"));
    let url = resolve_sqlite(url);
    if !is_sqlite || is_in_memory(url) {
        return Ok(None);
    }
    let options = SqliteConnectOptions::from_str(url)?;
    let database = options.get_filename();
    if let Some(directory) = database.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(directory).map_err(StoreError::Directory)?;
    }
    let mut path = database.as_os_str().to_owned();
    path.push(".lock");
    let path = PathBuf::from(path);
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| StoreError::Lock(path.display().to_string(), e))?;
    match file.try_lock() {
        Ok(()) => Ok(Some(EmbeddedLock { _file: file })),
        Err(TryLockError::WouldBlock) => Err(StoreError::InUse(database.display().to_string())),
        Err(TryLockError::Error(e)) => Err(StoreError::Lock(path.display().to_string(), e)),
    }
}

/// Whether a SQLite URL names an in-memory database (`sqlite::memory:`, `sqlite://:memory:`, `?mode=memory`).
fn is_in_memory(url: &str) -> bool {
    let (path, query) = url.split_once('?').unwrap_or((url, ""));
    path.ends_with(":memory:") || query.split('&').any(|pair| pair == "mode=memory")
}

#[cfg(test)]
mod tests {
    use super::{is_in_memory, lock_embedded};
    use crate::store::StoreError;

    #[test]
    fn in_memory_urls_are_told_apart_from_files() {
        let cases = [
            ("sqlite::memory:", true),
            ("sqlite://:memory:", true),
            ("sqlite://?mode=memory", true),
            ("sqlite://data/gateway.db?mode=rwc", false),
            ("sqlite:gateway.db", false),
            ("sqlite:///tmp/memory/gateway.db", false),
        ];
        for (url, expected) in cases {
            assert_eq!(is_in_memory(url), expected, "{url}");
        }
    }

    #[test]
    fn an_embedded_store_is_locked_once_until_its_lock_is_dropped() {
        let db = gateway_testkit::scratch::ScratchDatabase::sqlite();
        let url = db.url();

        let first = lock_embedded(url).expect("first lock");
        assert!(first.is_some());
        match lock_embedded(url) {
            Err(StoreError::InUse(path)) => assert!(path.ends_with("gateway.db"), "{path}"),
            other => panic!("a second lock was not refused: {other:?}"),
        }
        drop(first);
        assert!(lock_embedded(url).expect("lock again").is_some());
    }

    #[test]
    fn memory_and_postgres_stores_take_no_lock() {
        for url in [
            "sqlite::memory:",
            "postgres://postgres@127.0.0.1:5432/postgres",
        ] {
            assert!(lock_embedded(url).expect("no lock").is_none(), "{url}");
        }
    }
}
