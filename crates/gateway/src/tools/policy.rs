//! Per-source policy kept across calls (SPEC 7): the bound on calls in flight and the circuit breaker.
//!
//! Both are per replica (each gateway process keeps its own), keyed by the source's id, and follow the source's
//! current settings: a changed `max_in_flight` starts a new bound, a changed breaker threshold applies from the
//! next call.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use gateway_core::entity::ToolPolicy;
use tokio::sync::Semaphore;

/// What the breaker says about a call about to start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// The breaker is closed: call.
    Call,
    /// The cool-down is over: this call is the one trial that decides.
    Trial,
    /// The breaker is open (or another call is the trial): fail fast, for about this long still.
    Refuse { retry_in: Duration },
}

/// A circuit breaker: after `failures` consecutive failed calls it opens for `cooldown`, then lets one trial
/// call through; the trial's success closes it, its failure opens it again. Pure: the caller passes the time.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Breaker {
    consecutive_failures: u32,
    open_until: Option<Instant>,
    trial_running: bool,
}

impl Breaker {
    /// Whether a call may start at `now`.
    pub fn admit(&mut self, now: Instant) -> Admission {
        let Some(open_until) = self.open_until else {
            return Admission::Call;
        };
        if now < open_until {
            return Admission::Refuse {
                retry_in: open_until - now,
            };
        }
        if self.trial_running {
            return Admission::Refuse {
                retry_in: Duration::ZERO,
            };
        }
        self.trial_running = true;
        Admission::Trial
    }

    /// Records how an admitted call ended; `trial` when it was the trial [`admit`](Breaker::admit) let through.
    /// A call admitted before the breaker opened that ends during the trial leaves the trial to decide.
    pub fn record(
        &mut self,
        now: Instant,
        failed: bool,
        trial: bool,
        threshold: u32,
        cooldown: Duration,
    ) {
        if trial {
            self.trial_running = false;
        }
        if !failed {
            let trial_running = self.trial_running;
            *self = Breaker {
                trial_running,
                ..Breaker::default()
            };
            return;
        }
        self.consecutive_failures = self.consecutive_failures.saturating_add(1);
        if trial || self.consecutive_failures >= threshold.max(1) {
            self.open_until = Some(now + cooldown);
        }
    }

    /// The trial let through ended without a result (its call was dropped: the response cancelled, its lease
    /// lost): the next call after the cool-down is the trial.
    pub fn abandon_trial(&mut self) {
        self.trial_running = false;
    }

    pub fn is_open(&self) -> bool {
        self.open_until.is_some()
    }
}

/// One source's state: its in-flight bound (with the size it was made for) and its breaker.
#[derive(Debug, Default)]
struct SourceState {
    slots: Option<(u32, Arc<Semaphore>)>,
    breaker: Breaker,
}

/// The policy state of every source this replica called.
#[derive(Debug, Default)]
pub struct Policies {
    sources: Mutex<HashMap<String, SourceState>>,
}

impl Policies {
    fn with<T>(&self, source_id: &str, f: impl FnOnce(&mut SourceState) -> T) -> T {
        let mut sources = self.sources.lock().unwrap_or_else(PoisonError::into_inner);
        f(sources.entry(source_id.to_owned()).or_default())
    }

    /// The semaphore bounding the source's calls in flight, if it has a bound.
    pub fn slots(&self, source_id: &str, policy: &ToolPolicy) -> Option<Arc<Semaphore>> {
        let limit = policy.max_in_flight?;
        self.with(source_id, |state| match &state.slots {
            Some((size, slots)) if *size == limit => Some(Arc::clone(slots)),
            _ => {
                let slots = Arc::new(Semaphore::new(usize::try_from(limit).unwrap_or(1)));
                state.slots = Some((limit, Arc::clone(&slots)));
                Some(slots)
            }
        })
    }

    pub fn admit(&self, source_id: &str, now: Instant) -> Admission {
        self.with(source_id, |state| state.breaker.admit(now))
    }

    /// Whether the source's breaker is open on this replica now (cooling down, or awaiting its trial call).
    pub fn is_open(&self, source_id: &str) -> bool {
        let sources = self.sources.lock().unwrap_or_else(PoisonError::into_inner);
        sources
            .get(source_id)
            .is_some_and(|state| state.breaker.is_open())
    }

    /// The source's trial call ended without a result (see [`Breaker::abandon_trial`]).
    pub fn abandon_trial(&self, source_id: &str) {
        self.with(source_id, |state| state.breaker.abandon_trial());
    }

    /// Records a call's end (`trial`: the breaker's trial); answers whether the breaker is open afterwards.
    pub fn record(
        &self,
        source_id: &str,
        policy: &ToolPolicy,
        now: Instant,
        failed: bool,
        trial: bool,
    ) -> bool {
        self.with(source_id, |state| {
            state.breaker.record(
                now,
                failed,
                trial,
                policy.breaker_failures(),
                Duration::from_millis(policy.breaker_cooldown_ms()),
            );
            state.breaker.is_open()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const COOL: Duration = Duration::from_secs(30);

    #[test]
    fn a_sources_breaker_reads_open_only_after_its_own_failures() {
        let policies = Policies::default();
        let policy = ToolPolicy {
            breaker_failures: Some(1),
            ..ToolPolicy::default()
        };
        assert!(!policies.is_open("tool_a"));
        assert!(policies.record("tool_a", &policy, Instant::now(), true, false));
        assert!(policies.is_open("tool_a"));
        assert!(!policies.is_open("tool_b"));
    }

    #[test]
    fn the_breaker_opens_after_the_threshold_of_consecutive_failures_and_fails_fast_until_cooled() {
        let t0 = Instant::now();
        let mut breaker = Breaker::default();
        for _ in 0..2 {
            assert_eq!(breaker.admit(t0), Admission::Call);
            breaker.record(t0, true, false, 3, COOL);
        }
        assert!(!breaker.is_open());
        assert_eq!(breaker.admit(t0), Admission::Call);
        breaker.record(t0, true, false, 3, COOL);
        assert!(breaker.is_open());
        assert_eq!(
            breaker.admit(t0 + Duration::from_secs(10)),
            Admission::Refuse {
                retry_in: Duration::from_secs(20)
            }
        );
    }

    #[test]
    fn a_success_resets_the_count_of_consecutive_failures() {
        let t0 = Instant::now();
        let mut breaker = Breaker::default();
        breaker.record(t0, true, false, 2, COOL);
        breaker.record(t0, false, false, 2, COOL);
        breaker.record(t0, true, false, 2, COOL);
        assert!(!breaker.is_open());
        breaker.record(t0, true, false, 2, COOL);
        assert!(breaker.is_open());
    }

    #[test]
    fn after_the_cool_down_one_trial_decides_and_others_fail_fast_meanwhile() {
        let t0 = Instant::now();
        let mut breaker = Breaker::default();
        breaker.record(t0, true, false, 1, COOL);
        let later = t0 + COOL;
        assert_eq!(breaker.admit(later), Admission::Trial);
        assert!(matches!(breaker.admit(later), Admission::Refuse { .. }));
        // The trial fails: open again for a whole cool-down.
        breaker.record(later, true, true, 5, COOL);
        assert!(matches!(
            breaker.admit(later + Duration::from_secs(1)),
            Admission::Refuse { .. }
        ));
        // The next trial succeeds: closed.
        let again = later + COOL;
        assert_eq!(breaker.admit(again), Admission::Trial);
        breaker.record(again, false, true, 5, COOL);
        assert!(!breaker.is_open());
        assert_eq!(breaker.admit(again), Admission::Call);
    }

    #[test]
    fn the_in_flight_bound_follows_the_source_s_setting() {
        let policies = Policies::default();
        let unbounded = ToolPolicy::default();
        assert!(policies.slots("tool_1", &unbounded).is_none());
        let two = ToolPolicy {
            max_in_flight: Some(2),
            ..ToolPolicy::default()
        };
        let slots = policies.slots("tool_1", &two).unwrap();
        assert_eq!(slots.available_permits(), 2);
        assert!(Arc::ptr_eq(
            &slots,
            &policies.slots("tool_1", &two).unwrap()
        ));
        let three = ToolPolicy {
            max_in_flight: Some(3),
            ..ToolPolicy::default()
        };
        assert_eq!(
            policies
                .slots("tool_1", &three)
                .unwrap()
                .available_permits(),
            3
        );
    }
    #[test]
    fn a_trial_whose_call_was_dropped_leaves_the_next_call_the_trial() {
        let t0 = Instant::now();
        let mut breaker = Breaker::default();
        breaker.record(t0, true, false, 1, COOL);
        let later = t0 + COOL;
        assert_eq!(breaker.admit(later), Admission::Trial);
        breaker.abandon_trial();
        assert_eq!(breaker.admit(later), Admission::Trial);
    }

    #[test]
    fn a_call_admitted_before_the_breaker_opened_does_not_end_the_trial() {
        let t0 = Instant::now();
        let mut breaker = Breaker::default();
        breaker.record(t0, true, false, 1, COOL);
        let later = t0 + COOL;
        assert_eq!(breaker.admit(later), Admission::Trial);
        // A late failure of an earlier call: the trial still runs, and no second one starts.
        breaker.record(later, true, false, 1, COOL);
        assert!(matches!(
            breaker.admit(later + COOL),
            Admission::Refuse { .. }
        ));
        // The trial succeeds: closed.
        breaker.record(later + COOL, false, true, 1, COOL);
        assert_eq!(breaker.admit(later + COOL), Admission::Call);
    }
}
