//! This process as one replica among those sharing the database: its id, its lease settings, the runs it drives,
//! and the signals that pass between its parts (progress for followers, work to claim).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{broadcast, Notify};

use super::runs::Runs;
use crate::config::DurabilityConfig;
use crate::ids::new_id;

/// Progress signals kept for a follower that is busy; one that misses some reads the store again.
const PROGRESS_CAPACITY: usize = 1024;

/// This replica.
#[derive(Debug)]
pub struct Replica {
    /// Its id in the `replicas` table and as the `owner` of the responses it drives.
    pub id: String,
    pub lease: Duration,
    pub sweep_interval: Duration,
    /// How long a repeated create or a cancel waits for a response to end.
    pub wait: Duration,
    pub runs: Arc<Runs>,
    /// Cleared when the replica shuts down: it takes no new work.
    accepting: AtomicBool,
    /// Ids of responses that progressed (stored steps or an ending), for followers on this replica.
    progress: broadcast::Sender<Arc<str>>,
    /// Wakes the claimer: a response waits for a replica, or room was made.
    pub work: Notify,
    /// Responses a run gave up while the store did not answer: they are released once it answers again, so
    /// that a replica (maybe this one) resumes them.
    to_release: Mutex<Vec<String>>,
}

impl Replica {
    pub fn new(config: &DurabilityConfig) -> Replica {
        Replica {
            id: new_id("replica"),
            lease: Duration::from_millis(config.lease_ms),
            sweep_interval: Duration::from_millis(config.sweep_interval_ms),
            wait: Duration::from_millis(config.wait_ms),
            runs: Arc::default(),
            accepting: AtomicBool::new(true),
            progress: broadcast::channel(PROGRESS_CAPACITY).0,
            work: Notify::new(),
            to_release: Mutex::default(),
        }
    }

    /// The lease in milliseconds, as the store compares it.
    pub fn lease_ms(&self) -> i64 {
        i64::try_from(self.lease.as_millis()).unwrap_or(i64::MAX)
    }

    pub fn is_accepting(&self) -> bool {
        self.accepting.load(Ordering::Acquire)
    }

    /// Takes no new work from now on (shutdown).
    pub fn stop_accepting(&self) {
        self.accepting.store(false, Ordering::Release);
        self.work.notify_waiters();
    }

    /// Tells followers on this replica that response `id` progressed.
    pub fn progressed(&self, id: &str) {
        let _ = self.progress.send(Arc::from(id));
    }

    /// Signals of progress, by response id.
    pub fn watch_progress(&self) -> broadcast::Receiver<Arc<str>> {
        self.progress.subscribe()
    }

    /// Remembers a response to release once the store answers again.
    pub fn release_later(&self, id: &str) {
        self.lock_release().push(id.to_owned());
    }

    /// The responses waiting to be released.
    pub fn take_to_release(&self) -> Vec<String> {
        std::mem::take(&mut *self.lock_release())
    }

    fn lock_release(&self) -> std::sync::MutexGuard<'_, Vec<String>> {
        self.to_release
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
