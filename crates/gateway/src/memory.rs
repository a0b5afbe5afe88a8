//! Gives the memory a burst freed back to the system. The allocator keeps what the gateway freed for its next
//! allocations, so after a thousand streams close the process would stay near their peak; a task looks at what
//! the allocator holds unused twice a second and, when that has grown by `GIVE_BACK_AT` over the lowest it has seen
//! since it last gave back, asks for it to be given back (`gateway_allocator::give_back`).

use std::time::Duration;

/// How often the task looks at what the allocator holds free.
const LOOK_EVERY: Duration = Duration::from_millis(500);

/// Growth of the free memory held that makes the task give it back: well above what a steady load frees and
/// takes again between two looks, well below a burst's.
const GIVE_BACK_AT: usize = 16 * 1024 * 1024;

/// When to give free memory back: the lowest free figure seen since the last give-back, and the rule.
#[derive(Debug, Default)]
struct Upkeep {
    lowest_free: Option<usize>,
}

impl Upkeep {
    /// Hears what is free now; whether to give it back.
    fn give_back(&mut self, free: usize) -> bool {
        let lowest = self.lowest_free.map_or(free, |lowest| lowest.min(free));
        if free >= lowest + GIVE_BACK_AT {
            // Growth is measured from here on (what is given back may not all go at once), and from lower figures
            // as the memory is used again.
            self.lowest_free = Some(free);
            true
        } else {
            self.lowest_free = Some(lowest);
            false
        }
    }
}

/// Starts the task, when the allocator can say what it holds unused.
pub fn start() {
    if gateway_allocator::free_bytes().is_none() {
        return;
    }
    tokio::spawn(async {
        let mut upkeep = Upkeep::default();
        let mut looks = tokio::time::interval(LOOK_EVERY);
        looks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            looks.tick().await;
            let Some(free) = gateway_allocator::free_bytes() else {
                return;
            };
            if upkeep.give_back(free) {
                // It takes each arena's lock in turn and unmaps pages: off the request threads.
                let _ = tokio::task::spawn_blocking(gateway_allocator::give_back).await;
                tracing::debug!(free_bytes = free, "gave freed memory back to the system");
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::{Upkeep, GIVE_BACK_AT};

    const MIB: usize = 1024 * 1024;

    #[test]
    fn a_burst_freed_is_given_back_once_and_a_steady_load_never() {
        let mut upkeep = Upkeep::default();
        // A steady load: what is free moves up and down by less than the threshold.
        for free in [4 * MIB, 9 * MIB, 3 * MIB, 12 * MIB, 5 * MIB] {
            assert!(!upkeep.give_back(free), "{free} free under a steady load");
        }
        // A burst ends: far more is free than the lowest seen (3 MiB).
        assert!(upkeep.give_back(3 * MIB + GIVE_BACK_AT + 80 * MIB));
        // Given back, it stays counted free: not given back again while nothing changes.
        assert!(!upkeep.give_back(3 * MIB + GIVE_BACK_AT + 80 * MIB));
        // The memory is used again, then a second burst frees it: given back again.
        assert!(!upkeep.give_back(6 * MIB));
        assert!(upkeep.give_back(6 * MIB + GIVE_BACK_AT));
    }
}
