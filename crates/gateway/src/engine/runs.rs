//! The responses this replica drives right now: how to stop each one, and where its live events go while
//! somebody follows it.

use foldhash::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use gateway_core::events::Event;
use tokio::sync::{broadcast, watch, Notify};

/// Live events kept for a follower that reads slowly; one that falls further behind reads the store instead.
const HUB_CAPACITY: usize = 64;

/// How long a run tells other replicas of its progress after one of them said it follows it; followers say so
/// again while they wait.
pub const FOLLOWED_FOR: Duration = Duration::from_secs(5);

/// Why a run must stop before its work is done.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// A cancel (or the delete of the response): stop at once, abort what is in flight, end `cancelled`.
    Cancel,
    /// This replica gives the response up (shutdown, or it lost it): stop without writing anything more, so that
    /// another replica resumes it from its stored steps.
    Abandon,
}

/// Where a run's live events go once somebody follows it: created on the first follower, so that a run nobody
/// follows keeps no channel.
pub type Hub = Arc<OnceLock<broadcast::Sender<Event>>>;

struct Entry {
    /// The claim epoch the run drives the response under (SPEC 9, fencing).
    epoch: i64,
    stop: watch::Sender<Option<Stop>>,
    hub: Hub,
    followed: Followed,
}

/// Until when somebody on another replica follows a run (milliseconds since the registry began; 0: nobody).
#[derive(Debug, Clone, Default)]
pub struct Followed(Arc<AtomicU64>);

impl Followed {
    /// Whether a follower on another replica may be waiting for this run's progress now.
    pub fn now(&self, epoch: Instant) -> bool {
        let until = self.0.load(Ordering::Relaxed);
        until != 0 && epoch.elapsed().as_millis() < u128::from(until)
    }
}

/// The runs of this replica, by response id.
pub struct Runs {
    entries: Mutex<HashMap<String, Entry>>,
    emptied: Notify,
    /// What `Followed` counts from.
    epoch: Instant,
}

impl Default for Runs {
    fn default() -> Runs {
        Runs {
            entries: Mutex::default(),
            emptied: Notify::new(),
            epoch: Instant::now(),
        }
    }
}

/// A run's place in the registry, given back when it is dropped.
pub struct Registration {
    runs: Arc<Runs>,
    id: String,
    /// The claim epoch the run drives its response under.
    pub epoch: i64,
    /// Changes when the run must stop.
    pub stop: watch::Receiver<Option<Stop>>,
    pub hub: Hub,
    followed: Followed,
}

impl Registration {
    /// Whether a follower on another replica may be waiting for this run's progress now.
    pub fn is_followed(&self) -> bool {
        self.followed.now(self.runs.epoch)
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut entries = self.runs.lock();
        // A run under a later claim may have taken the place of this one: its entry stays.
        if entries.get(&self.id).is_some_and(|e| e.epoch == self.epoch) {
            entries.remove(&self.id);
        }
        if entries.is_empty() {
            self.runs.emptied.notify_waiters();
        }
    }
}

impl std::fmt::Debug for Runs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runs")
            .field("running", &self.len())
            .finish()
    }
}

impl Runs {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Entry>> {
        // A panic while holding the lock leaves the map consistent (every change is one insert or remove).
        self.entries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Registers the run of response `id` under claim `epoch`; `None` when it already runs here under that epoch
    /// or a later one. A run here under an earlier epoch lost the response, which came back to this replica by a
    /// later claim: it is told to give it up (its writes are fenced off already), and the new run takes its place.
    pub fn register(self: &Arc<Self>, id: &str, epoch: i64) -> Option<Registration> {
        let mut entries = self.lock();
        if let Some(stale) = entries.get(id) {
            if stale.epoch >= epoch {
                return None;
            }
            stale.stop.send_replace(Some(Stop::Abandon));
            entries.remove(id);
        }
        let (stop, receiver) = watch::channel(None);
        let hub: Hub = Arc::default();
        let followed = Followed::default();
        entries.insert(
            id.to_owned(),
            Entry {
                epoch,
                stop,
                hub: Arc::clone(&hub),
                followed: followed.clone(),
            },
        );
        Some(Registration {
            runs: Arc::clone(self),
            id: id.to_owned(),
            epoch,
            stop: receiver,
            hub,
            followed,
        })
    }

    /// Asks the run of response `id` to stop; `false` when it does not run here.
    pub fn stop(&self, id: &str, why: Stop) -> bool {
        match self.lock().get(id) {
            Some(entry) => {
                entry.stop.send_if_modified(|stop| {
                    // A cancel does not undo an abandon, and an abandon wins over a cancel: the replica that resumes
                    // the response sees its cancel request in the store.
                    let changed = *stop != Some(Stop::Abandon) && *stop != Some(why);
                    if changed {
                        *stop = Some(why);
                    }
                    changed
                });
                true
            }
            None => false,
        }
    }

    /// The responses running here, each with the epoch it runs under.
    pub fn epochs(&self) -> Vec<(String, i64)> {
        self.lock()
            .iter()
            .map(|(id, entry)| (id.clone(), entry.epoch))
            .collect()
    }

    /// Asks every run to stop.
    pub fn stop_all(&self, why: Stop) {
        let ids: Vec<String> = self.lock().keys().cloned().collect();
        for id in ids {
            self.stop(&id, why);
        }
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Waits until no run is left.
    pub async fn wait_empty(&self) {
        loop {
            let emptied = self.emptied.notified();
            if self.is_empty() {
                return;
            }
            emptied.await;
        }
    }

    /// Notes that somebody on another replica follows the run of response `id` (if it runs here): its writes
    /// tell the other replicas for a while.
    pub fn mark_followed(&self, id: &str) {
        if let Some(entry) = self.lock().get(id) {
            let until = self.epoch.elapsed() + FOLLOWED_FOR;
            let until = u64::try_from(until.as_millis()).unwrap_or(u64::MAX);
            entry.followed.0.fetch_max(until, Ordering::Relaxed);
        }
    }

    /// Follows the live events of the run of response `id`, when it runs here.
    pub fn follow(&self, id: &str) -> Option<broadcast::Receiver<Event>> {
        let entries = self.lock();
        let hub = &entries.get(id)?.hub;
        Some(
            hub.get_or_init(|| broadcast::channel(HUB_CAPACITY).0)
                .subscribe(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_run_is_registered_once_stopped_by_id_and_gone_when_its_registration_drops() {
        let runs = Arc::new(Runs::default());
        let mut first = runs.register("resp_1", 0).expect("registered");
        assert!(runs.register("resp_1", 0).is_none(), "one run per response");
        assert!(runs.stop("resp_1", Stop::Cancel));
        assert!(!runs.stop("resp_2", Stop::Cancel));
        first.stop.changed().await.expect("told");
        assert_eq!(*first.stop.borrow(), Some(Stop::Cancel));

        let waiting = tokio::spawn({
            let runs = Arc::clone(&runs);
            async move { runs.wait_empty().await }
        });
        drop(first);
        waiting.await.expect("emptied");
        assert!(runs.is_empty());
    }

    #[test]
    fn a_run_under_a_later_claim_takes_the_place_of_a_stale_one_which_is_told_to_give_up() {
        let runs = Arc::new(Runs::default());
        let stale = runs.register("resp_1", 1).expect("registered");
        assert!(runs.register("resp_1", 1).is_none(), "the same claim");
        assert!(runs.register("resp_1", 0).is_none(), "an older claim");
        let fresh = runs.register("resp_1", 2).expect("a later claim");
        assert_eq!(*stale.stop.borrow(), Some(Stop::Abandon));
        assert_eq!(*fresh.stop.borrow(), None);
        drop(stale);
        assert_eq!(
            runs.epochs(),
            vec![("resp_1".to_owned(), 2)],
            "the stale run's end leaves the new entry"
        );
        drop(fresh);
        assert!(runs.is_empty());
    }

    #[test]
    fn an_abandon_is_not_undone_by_a_cancel() {
        let runs = Arc::new(Runs::default());
        let registration = runs.register("resp_1", 0).expect("registered");
        runs.stop_all(Stop::Abandon);
        runs.stop("resp_1", Stop::Cancel);
        assert_eq!(*registration.stop.borrow(), Some(Stop::Abandon));
    }

    #[test]
    fn a_run_is_followed_for_a_while_once_marked() {
        let runs = Arc::new(Runs::default());
        let registration = runs.register("resp_1", 0).expect("registered");
        assert!(!registration.is_followed());
        runs.mark_followed("resp_1");
        runs.mark_followed("resp_2");
        assert!(registration.is_followed());
    }

    #[test]
    fn a_hub_is_made_for_the_first_follower_only() {
        let runs = Arc::new(Runs::default());
        let registration = runs.register("resp_1", 0).expect("registered");
        assert!(registration.hub.get().is_none(), "nobody follows yet");
        let _follower = runs.follow("resp_1").expect("runs here");
        assert!(registration.hub.get().is_some());
        assert!(runs.follow("resp_2").is_none());
    }
}
