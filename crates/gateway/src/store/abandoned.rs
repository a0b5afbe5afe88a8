//! Connections abandoned mid-statement, given up without waiting on them: a statement the database did not answer
//! in time (`answered_within`) leaves its connection to the pool, which tests it with a ping as it takes it back.
//! Over a connection whose database vanished without closing it (a silent network) that ping would wait until the
//! kernel gives up (many minutes), and the connection would keep its place in the pool all that time. For a while
//! after an abandonment, every connection given back is pinged first with the same bound, and one that does not
//! answer is shut down at once, its place freed.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use sqlx::pool::PoolConnectionMetadata;
use sqlx::postgres::PgConnection;
use sqlx::Connection;

/// Until when (milliseconds since `origin`) connections given back are pinged with a bound; 0: not now.
static CHECK_UNTIL_MS: AtomicU64 = AtomicU64::new(0);

/// The bound of those pings, in milliseconds: that of the last abandoned statement.
static PING_WAIT_MS: AtomicU64 = AtomicU64::new(0);

/// The process's clock origin for `CHECK_UNTIL_MS`.
fn since_origin() -> Duration {
    static ORIGIN: OnceLock<Instant> = OnceLock::new();
    ORIGIN.get_or_init(Instant::now).elapsed()
}

/// Notes that a statement was abandoned after `wait`: the abandoned connection is given back within moments (its
/// statement's future dropped), and pinged with the same bound for twice as long as the wait.
pub(crate) fn noted(wait: Duration) {
    let wait_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX);
    PING_WAIT_MS.store(wait_ms.max(1), Ordering::Relaxed);
    let until = u64::try_from((since_origin() + wait * 2).as_millis()).unwrap_or(u64::MAX);
    CHECK_UNTIL_MS.fetch_max(until, Ordering::Relaxed);
}

/// The bound of a ping of a connection given back now, while abandonments are recent.
fn ping_wait() -> Option<Duration> {
    let now = u64::try_from(since_origin().as_millis()).unwrap_or(u64::MAX);
    (now < CHECK_UNTIL_MS.load(Ordering::Relaxed))
        .then(|| Duration::from_millis(PING_WAIT_MS.load(Ordering::Relaxed)))
}

/// The pool's `after_release` test: `Ok(true)` keeps the connection; a failure shuts it down without a word (a
/// goodbye could wait on a full send buffer). Outside the while after an abandonment, nothing is asked of the
/// database: sqlx pings every connection it takes back anyway, without a bound.
pub(crate) fn after_release(
    connection: &mut PgConnection,
    _: PoolConnectionMetadata,
) -> futures::future::BoxFuture<'_, Result<bool, sqlx::Error>> {
    Box::pin(async move {
        let Some(wait) = ping_wait() else {
            return Ok(true);
        };
        match tokio::time::timeout(wait, connection.ping()).await {
            Ok(answered) => answered.map(|()| true),
            Err(_) => Err(sqlx::Error::Io(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "a connection given back did not answer a ping; it is shut down",
            ))),
        }
    })
}
