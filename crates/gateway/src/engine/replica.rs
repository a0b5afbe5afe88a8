//! This process as one replica among those sharing the database: its id, its lease settings, the runs it drives,
//! and the signals that pass between its parts (progress for followers, work to claim).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{broadcast, watch, Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

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
    /// How many starts from the store one response may have before it ends failed rather than run again.
    pub max_resumes: i64,
    pub runs: Arc<Runs>,
    /// Cleared when the replica shuts down: it takes no new work.
    accepting: AtomicBool,
    /// Set when the replica shuts down, for the streams that follow responses here: they tell their clients to
    /// re-attach elsewhere rather than be cut off when the process exits.
    stopping: watch::Sender<bool>,
    /// Ids of responses that progressed (stored steps or an ending), for followers on this replica.
    progress: broadcast::Sender<Arc<str>>,
    /// Wakes the claimer: a response waits for a replica, or room was made.
    pub work: Notify,
    /// Responses a run gave up while the store did not answer, with the epoch of its claim: they are released
    /// once it answers again, so that a replica (maybe this one) resumes them.
    to_release: Mutex<Vec<(String, i64)>>,
    /// Until when this replica's lease is known to hold: a beat sent at `t` that found the previous one within the
    /// lease keeps it until `t + lease`, on this process's monotonic clock (the database counts from when the beat
    /// arrived, later). Past it, runs act no more until a beat renews it (SPEC 9).
    lease_until: watch::Sender<Instant>,
    /// One permit per re-attached stream this replica follows (`durability.max_followers`).
    followers: Arc<Semaphore>,
    /// When this replica last told the others that somebody here follows a response: followers of one response
    /// share that notification.
    told_following: Mutex<std::collections::HashMap<String, Instant>>,
    /// Set for the embedded store, which one process holds (a file lock): nobody else can take its responses, so
    /// its lease always holds.
    exclusive: AtomicBool,
}

impl Replica {
    pub fn new(config: &DurabilityConfig) -> Replica {
        Replica {
            id: new_id("replica"),
            lease: Duration::from_millis(config.lease_ms),
            sweep_interval: Duration::from_millis(config.sweep_interval_ms),
            wait: Duration::from_millis(config.wait_ms),
            max_resumes: i64::from(config.max_resumes),
            runs: Arc::default(),
            accepting: AtomicBool::new(true),
            stopping: watch::Sender::new(false),
            progress: broadcast::channel(PROGRESS_CAPACITY).0,
            work: Notify::new(),
            to_release: Mutex::default(),
            // Nobody can take a response from a replica that has not beaten yet and owns none.
            lease_until: watch::Sender::new(
                Instant::now() + Duration::from_millis(config.lease_ms),
            ),
            exclusive: AtomicBool::new(false),
            followers: Arc::new(Semaphore::new(
                config.max_followers.min(Semaphore::MAX_PERMITS),
            )),
            told_following: Mutex::default(),
        }
    }

    /// A place for one more follower of a stream; `None` when this replica follows as many as it may.
    pub fn admit_follower(&self) -> Option<OwnedSemaphorePermit> {
        Arc::clone(&self.followers).try_acquire_owned().ok()
    }

    /// Whether the others must be told (again) that somebody here follows response `id`: once per `every`, however
    /// many follow it here.
    pub fn should_tell_following(&self, id: &str, every: Duration) -> bool {
        let now = Instant::now();
        let mut told = self
            .told_following
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if told
            .get(id)
            .is_some_and(|at| now.duration_since(*at) < every)
        {
            return false;
        }
        told.retain(|_, at| now.duration_since(*at) < every);
        told.insert(id.to_owned(), now);
        true
    }

    /// Says that this replica is the only process on its store (the embedded store).
    pub fn set_exclusive(&self) {
        self.exclusive.store(true, Ordering::Release);
    }

    /// Records a beat sent at `sent` that found the lease held: it holds until `sent + lease`.
    pub fn lease_renewed(&self, sent: Instant) {
        let until = sent + self.lease;
        self.lease_until.send_if_modified(|current| {
            let later = until > *current;
            if later {
                *current = until;
            }
            later
        });
    }

    /// Whether this replica's lease is known to hold now: no other replica can have taken its responses.
    pub fn holds_lease(&self) -> bool {
        self.exclusive.load(Ordering::Acquire) || Instant::now() < *self.lease_until.borrow()
    }

    /// Waits, at most a lease, for this replica's lease to hold (a paused process that came back waits for its next
    /// beat, which first tells its runs whether their responses are still theirs). `false` when it did not.
    pub async fn hold_lease(&self) -> bool {
        if self.holds_lease() {
            return true;
        }
        let mut until = self.lease_until.subscribe();
        let renewed = until.wait_for(|until| Instant::now() < *until);
        tokio::time::timeout(self.lease, renewed)
            .await
            .is_ok_and(|held| held.is_ok())
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
        self.stopping.send_replace(true);
        self.work.notify_waiters();
    }

    /// Resolves once the replica shuts down (at once when it already does).
    pub fn stopping(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut stopping = self.stopping.subscribe();
        async move {
            // The sender lives as long as the replica: a closed channel is a replica gone, as good as stopped.
            let _ = stopping.wait_for(|stopping| *stopping).await;
        }
    }

    /// Tells followers on this replica that response `id` progressed.
    pub fn progressed(&self, id: &str) {
        let _ = self.progress.send(Arc::from(id));
    }

    /// Signals of progress, by response id.
    pub fn watch_progress(&self) -> broadcast::Receiver<Arc<str>> {
        self.progress.subscribe()
    }

    /// Remembers a response (and the epoch of the claim this replica ran it under) to release once the store
    /// answers again.
    pub fn release_later(&self, id: &str, epoch: i64) {
        self.lock_release().push((id.to_owned(), epoch));
    }

    /// The responses waiting to be released.
    pub fn take_to_release(&self) -> Vec<(String, i64)> {
        std::mem::take(&mut *self.lock_release())
    }

    fn lock_release(&self) -> std::sync::MutexGuard<'_, Vec<(String, i64)>> {
        self.to_release
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
