//! How the store reports the time its operations take, to whoever measures them, without knowing who that is.

use std::fmt::Debug;
use std::time::{Duration, Instant};

/// Hears how long each store operation took. The store is given one at construction (`Store::observed_by`);
/// the metrics implement it, so the store never imports them.
pub trait StoreObserver: Debug + Send + Sync {
    /// Operation `name` (e.g. `load_steps`) ended, in success or in error, after `elapsed`.
    fn statement(&self, name: &'static str, elapsed: Duration);

    /// Group commit wrote a batch of `writes` responses' writes together.
    fn batch(&self, writes: usize) {
        let _ = writes;
    }

    /// A duty of the store (the group-commit writer) panicked and was started again.
    fn duty_restarted(&self, duty: &'static str) {
        let _ = duty;
    }
}

/// The observer of a store nobody measures (tools, tests): it hears and forgets.
#[derive(Debug, Clone, Copy, Default)]
pub struct Unobserved;

impl StoreObserver for Unobserved {
    fn statement(&self, _name: &'static str, _elapsed: Duration) {}
}

/// Reports how long an operation took when dropped, so that an early `?` return is measured too.
pub(super) struct Timing<'a> {
    observer: &'a dyn StoreObserver,
    name: &'static str,
    started: Instant,
}

impl<'a> Timing<'a> {
    pub(super) fn start(observer: &'a dyn StoreObserver, name: &'static str) -> Timing<'a> {
        Timing {
            observer,
            name,
            started: Instant::now(),
        }
    }
}

impl Drop for Timing<'_> {
    fn drop(&mut self) {
        self.observer.statement(self.name, self.started.elapsed());
    }
}
