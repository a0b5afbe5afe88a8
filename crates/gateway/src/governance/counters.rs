//! The shared counts of `rpm`, `tpm` and budgets, kept per replica between trips to the store: requests are taken
//! from slices leased from a shared minute that never passes its limit; tokens (per minute) and spend (per budget
//! period, in nano-dollars) are added to a shared window and the other replicas' read back, at most every `sync`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gateway_core::governance::{window_start, Standing, WINDOW_SECS};

use crate::store::{Store, StoreError};

/// The requests of a window leased at once: a twentieth of the limit, between 1 and 100.
fn slice(limit: u64) -> u64 {
    (limit / 20).clamp(1, 100)
}

/// The tokens of a window that matter at once: counted here, they are added to the shared window without waiting
/// for `sync`; within them of the limit, every admission reads the shared window afresh. A twentieth of the limit.
fn token_slice(limit: u64) -> u64 {
    (limit / 20).max(1)
}

/// What this replica knows of one window of one counter.
#[derive(Debug, Default)]
struct Window {
    start: i64,
    /// Requests leased from the shared window, and taken of those.
    leased: u64,
    taken: u64,
    /// The shared window's count as last read (every replica's leases or tokens).
    shared: u64,
    /// Tokens counted here and not yet added to the shared window.
    unsynced: u64,
    /// Tokens on their way to the shared window: counted here until the write that adds them answers.
    syncing: u64,
    synced_at: Option<Instant>,
    /// A write of the unsynced part is scheduled.
    flushing: bool,
    /// A read of the shared window is on its way.
    reading: bool,
}

impl Window {
    fn at(&mut self, start: i64) -> &mut Window {
        if self.start != start {
            *self = Window {
                start,
                ..Window::default()
            };
        }
        self
    }
}

/// Seconds from `now` until the window that holds it ends.
fn reset_secs(now: i64) -> u64 {
    (window_start(now) + WINDOW_SECS - now) as u64
}

/// Every counter this replica has used, by name.
#[derive(Clone)]
pub(super) struct Counters {
    store: Store,
    sync: Duration,
    windows: Arc<Mutex<HashMap<String, Window>>>,
}

impl Counters {
    pub(super) fn new(store: Store, sync: Duration) -> Counters {
        Counters {
            store,
            sync,
            windows: Arc::default(),
        }
    }

    /// Runs `f` on the counter's window that starts at `start`. A window older than the one the counter is at
    /// (a trip to the store that began before the minute turned) is a throwaway: its results no longer count.
    fn with<T>(&self, name: &str, start: i64, f: impl FnOnce(&mut Window) -> T) -> T {
        let mut windows = self.windows.lock().unwrap_or_else(|e| e.into_inner());
        if !windows.contains_key(name) {
            windows.insert(name.to_owned(), Window::default());
        }
        let Some(window) = windows.get_mut(name) else {
            unreachable!("inserted above");
        };
        if window.start > start {
            return f(&mut Window {
                start,
                ..Window::default()
            });
        }
        f(window.at(start))
    }

    /// Counts one request against `limit` in the window of `now`: its standing after it, or (as `Err`) the
    /// standing that refuses it.
    pub(super) async fn request(
        &self,
        name: &str,
        limit: u64,
        now: i64,
    ) -> Result<Result<Standing, Standing>, StoreError> {
        let start = window_start(now);
        let standing = |window: &Window| Standing {
            limit,
            remaining: limit.saturating_sub(window.shared) + (window.leased - window.taken),
            reset_secs: reset_secs(now),
        };
        let taken = self.with(name, start, |window| {
            (window.taken < window.leased).then(|| {
                window.taken += 1;
                standing(window)
            })
        });
        if let Some(standing) = taken {
            return Ok(Ok(standing));
        }
        let lease = self
            .store
            .lease_window(name, start, slice(limit), limit)
            .await?;
        Ok(self.with(name, start, |window| {
            window.leased += lease.granted;
            window.shared = window.shared.max(lease.used.min(limit));
            if lease.granted == 0 {
                return Err(standing(window));
            }
            window.taken += 1;
            Ok(standing(window))
        }))
    }

    /// The standing of `limit` tokens in the minute of `now` (see [`Counters::total`]).
    pub(super) async fn tokens(
        &self,
        name: &str,
        limit: u64,
        now: i64,
    ) -> Result<Standing, StoreError> {
        let used = self.total(name, window_start(now), limit).await?;
        Ok(Standing {
            limit,
            remaining: limit.saturating_sub(used),
            reset_secs: reset_secs(now),
        })
    }

    /// What the counter `name` holds in the window that starts at `start`, every replica's part included: read
    /// from the shared window when the last read is older than `sync` or the count is within a slice of `limit`
    /// (this replica's unsynced part added to it on the way). One read at a time: while one is on its way,
    /// others use what is known.
    pub(super) async fn total(
        &self,
        name: &str,
        start: i64,
        limit: u64,
    ) -> Result<u64, StoreError> {
        let read_now = self.with(name, start, |window| {
            let used = window.shared + window.unsynced + window.syncing;
            let stale = limit.saturating_sub(used) < token_slice(limit)
                || window.synced_at.is_none_or(|at| at.elapsed() >= self.sync);
            stale && !std::mem::replace(&mut window.reading, true)
        });
        if read_now {
            let read = self.sync(name, start).await;
            self.with(name, start, |window| window.reading = false);
            read?;
        }
        Ok(self.with(name, start, |window| {
            window.shared + window.unsynced + window.syncing
        }))
    }

    /// Adds this replica's unsynced part to the shared window and reads back what it holds.
    async fn sync(&self, name: &str, start: i64) -> Result<(), StoreError> {
        let pending = self.with(name, start, |window| {
            let pending = std::mem::take(&mut window.unsynced);
            window.syncing += pending;
            pending
        });
        let added = self.store.add_to_window(name, start, pending).await;
        self.with(name, start, |window| {
            window.syncing -= pending.min(window.syncing);
            match &added {
                // What the shared window holds now includes this part.
                Ok(used) => {
                    window.shared = window.shared.max(*used);
                    window.synced_at = Some(Instant::now());
                }
                Err(_) => window.unsynced += pending,
            }
        });
        added.map(drop)
    }

    /// Counts `tokens` a model call used in the minute of `now` against `limit` (see [`Counters::add`]).
    pub(super) fn add_tokens(&self, name: &str, tokens: u64, limit: u64, now: i64) {
        self.add(name, tokens, limit, window_start(now));
    }

    /// Counts `amount` in the window of counter `name` that starts at `start`: it reaches the shared window within
    /// `sync`, or at once when this replica's unsynced part makes a slice of `limit`.
    pub(super) fn add(&self, name: &str, amount: u64, limit: u64, start: i64) {
        let (schedule, at_once) = self.with(name, start, |window| {
            window.unsynced += amount;
            let at_once = window.unsynced >= token_slice(limit);
            (!std::mem::replace(&mut window.flushing, true), at_once)
        });
        if !schedule {
            return;
        }
        let counters = self.clone();
        let name = name.to_owned();
        tokio::spawn(async move {
            if !at_once {
                tokio::time::sleep(counters.sync).await;
            }
            counters.with(&name, start, |window| window.flushing = false);
            if let Err(e) = counters.sync(&name, start).await {
                tracing::warn!(counter = %name, error = %e, "could not add to a shared count");
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_are_a_twentieth_of_the_limit_within_bounds() {
        for (limit, expected) in [(1, 1), (19, 1), (60, 3), (1000, 50), (100_000, 100)] {
            assert_eq!(slice(limit), expected, "limit {limit}");
        }
    }

    #[test]
    fn a_new_window_forgets_the_last_one() {
        let mut window = Window {
            start: 60,
            leased: 5,
            taken: 5,
            shared: 9,
            unsynced: 3,
            ..Window::default()
        };
        assert_eq!(window.at(60).leased, 5);
        let next = window.at(120);
        assert_eq!(
            (next.start, next.leased, next.shared, next.unsynced),
            (120, 0, 0, 0)
        );
    }
}
