//! Gives the memory a burst freed back to the system. The allocator keeps what the gateway freed for its next
//! allocations, so after a thousand streams close the process would stay near their peak; a task looks at what
//! the allocator holds unused twice a second and asks for it to be given back (`gateway_allocator::give_back`)
//! when that has grown by `GIVE_BACK_AT` over the lowest it has seen since it last gave back, or, once the gateway
//! has gone quiet (its live memory still between two looks), by `GIVE_BACK_QUIET_AT`; after giving back, growth is
//! measured from what is left. Before giving back it asks the runtime's workers to flush their caches of freed
//! blocks as each next goes idle (`gateway_allocator::flush_if_asked`, run on `on_thread_park`): cached blocks keep
//! their pages in use. (jemalloc's own decay with a background thread and a one-second `dirty_decay_ms`
//! did the same, and cost 3-8 % of the request rate under load: the task gives back only when the load is gone,
//! or after a burst.)

use std::time::Duration;

/// How often the task looks at what the allocator holds free.
const LOOK_EVERY: Duration = Duration::from_millis(500);

/// Growth of the free memory held that makes the task give it back: well above what a steady load frees and
/// takes again between two looks, well below a burst's.
const GIVE_BACK_AT: usize = 16 * 1024 * 1024;

/// Growth of the free memory held that makes the task give it back once the gateway is quiet: what a burst's
/// last frees leave after the give-back that its first ones caused.
const GIVE_BACK_QUIET_AT: usize = 1024 * 1024;

/// Change of the live memory between two looks under which the gateway counts as quiet: less than a few
/// requests' worth.
const QUIET_WITHIN: usize = 64 * 1024;

/// When to give free memory back: the lowest free figure seen since the last give-back, the live memory at the
/// last look, and the rule.
#[derive(Debug, Default)]
struct Upkeep {
    lowest_free: Option<usize>,
    last_allocated: Option<usize>,
}

impl Upkeep {
    /// Hears what the allocator holds now; whether to give what is free back.
    fn give_back(&mut self, usage: gateway_allocator::Usage) -> bool {
        let free = usage.free();
        let quiet = self
            .last_allocated
            .is_some_and(|last| last.abs_diff(usage.allocated) < QUIET_WITHIN);
        self.last_allocated = Some(usage.allocated);
        let lowest = self.lowest_free.map_or(free, |lowest| lowest.min(free));
        if free >= lowest + GIVE_BACK_AT || (quiet && free >= lowest + GIVE_BACK_QUIET_AT) {
            // Growth is measured from here on (what is given back may not all go at once), and from lower figures
            // as the memory is used again; `given_back` moves the mark to what is left once it has been done.
            self.lowest_free = Some(free);
            true
        } else {
            self.lowest_free = Some(lowest);
            false
        }
    }

    /// Hears what the allocator holds just after giving back: growth is measured from there. A burst's frees that
    /// land while it gives back (or after) are then growth, given back in turn; measured from the figure before
    /// it, they could stay below it for good and never be given back.
    fn given_back(&mut self, usage: gateway_allocator::Usage) {
        self.lowest_free = Some(usage.free());
        self.last_allocated = Some(usage.allocated);
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
            let Some(usage) = gateway_allocator::usage() else {
                return;
            };
            crate::metrics::memory(usage.allocated, usage.resident);
            if upkeep.give_back(usage) {
                // The workers' caches of freed blocks hold pages of the arenas in use: each flushes its own as it
                // goes idle (this one at once), and what that frees is given back at a later look.
                gateway_allocator::ask_threads_to_flush();
                gateway_allocator::flush_if_asked();
                // It takes each arena's lock in turn and unmaps pages: off the request threads.
                let _ = tokio::task::spawn_blocking(gateway_allocator::give_back).await;
                tracing::debug!(
                    free_bytes = usage.free(),
                    "gave freed memory back to the system"
                );
                if let Some(after) = gateway_allocator::usage() {
                    upkeep.given_back(after);
                }
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::{Upkeep, GIVE_BACK_AT, GIVE_BACK_QUIET_AT};
    use gateway_allocator::Usage;

    const MIB: usize = 1024 * 1024;

    fn usage(allocated: usize, free: usize) -> Usage {
        Usage {
            allocated,
            resident: allocated + free,
        }
    }

    #[test]
    fn a_burst_freed_is_given_back_once_and_a_steady_load_never() {
        let mut upkeep = Upkeep::default();
        // A steady load: live memory moves between looks, and what is free by less than the threshold.
        for (allocated, free) in [(20, 4), (23, 9), (19, 3), (25, 12), (21, 5)] {
            let now = usage(allocated * MIB, free * MIB);
            assert!(!upkeep.give_back(now), "{now:?} under a steady load");
        }
        // A burst ends: far more is free than the lowest seen (3 MiB).
        assert!(upkeep.give_back(usage(30 * MIB, 3 * MIB + GIVE_BACK_AT + 80 * MIB)));
        // Given back, it stays counted free: not given back again while nothing changes.
        assert!(!upkeep.give_back(usage(30 * MIB, 3 * MIB + GIVE_BACK_AT + 80 * MIB)));
        // The memory is used again, then a second burst frees it: given back again.
        assert!(!upkeep.give_back(usage(90 * MIB, 6 * MIB)));
        assert!(upkeep.give_back(usage(40 * MIB, 6 * MIB + GIVE_BACK_AT)));
    }

    #[test]
    fn frees_that_land_while_memory_is_given_back_are_given_back_after_it() {
        let mut upkeep = Upkeep::default();
        assert!(!upkeep.give_back(usage(20 * MIB, 4 * MIB)));
        // The streams close: 70 MiB free, given back; by the time that is done it has left 10 MiB free.
        assert!(upkeep.give_back(usage(30 * MIB, 70 * MIB)));
        upkeep.given_back(usage(30 * MIB, 10 * MIB));
        // The last streams' frees land after it: 43 MiB free again, never as low as 10 at a look. Measured from
        // the 70 MiB before the give-back, this stayed held for good (seen in one bench run: 60 MiB resident
        // against 17 MiB live five seconds after a burst).
        assert!(upkeep.give_back(usage(17 * MIB, 43 * MIB)));
        upkeep.given_back(usage(17 * MIB, 5 * MIB));
        assert!(!upkeep.give_back(usage(17 * MIB, 5 * MIB)));
    }

    #[test]
    fn what_a_burst_left_free_is_given_back_once_the_gateway_is_quiet() {
        let mut upkeep = Upkeep::default();
        assert!(!upkeep.give_back(usage(20 * MIB, 4 * MIB)));
        // The burst's last frees: more free, under the burst threshold, while live memory still moves.
        let left = 4 * MIB + GIVE_BACK_QUIET_AT + MIB;
        assert!(!upkeep.give_back(usage(16 * MIB, left)));
        // Quiet: live memory still since the last look.
        assert!(upkeep.give_back(usage(16 * MIB + 1024, left)));
        // Nothing more to give back while it stays so.
        assert!(!upkeep.give_back(usage(16 * MIB, left)));
        assert!(!upkeep.give_back(usage(16 * MIB, 4 * MIB)));
    }
}
