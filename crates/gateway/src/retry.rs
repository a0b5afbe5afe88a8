//! The one retry policy of the gateway's outgoing requests, upstream model calls and tool calls alike: a bounded
//! number of retries, waits growing exponentially, with equal jitter.

use std::future::Future;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};

/// Doublings after which the wait stops growing: at most 1024 × the base.
const MAX_DOUBLINGS: u32 = 10;

/// How often, and how far apart, a failed request is tried again. Which failures deserve a retry is the caller's to
/// say: only it knows whether a failed attempt may have taken effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    max_retries: u32,
    base: Duration,
}

impl RetryPolicy {
    /// At most `max_retries` retries after the first attempt, waits growing from `backoff_ms`.
    pub fn new(max_retries: u32, backoff_ms: u64) -> RetryPolicy {
        RetryPolicy {
            max_retries,
            base: Duration::from_millis(backoff_ms),
        }
    }

    /// The waits before retry 1, 2, …: exponential backoff with *equal jitter*. Retry n waits a uniformly random
    /// time in [c/2, c), where c = base × 2^(n−1) and c stops growing at base × 2^10. The fixed half keeps retries
    /// from hammering an upstream that just failed; the random half spreads out callers that failed together.
    fn backoff(&self) -> ExponentialBuilder {
        // backon's jitter adds a uniform [0, d) to its delay d; starting d at half the ceiling gives [c/2, c).
        let half = self.base / 2;
        ExponentialBuilder::new()
            .with_min_delay(half)
            .with_factor(2.0)
            .with_max_delay(half.saturating_mul(1 << MAX_DOUBLINGS))
            .with_max_times(self.max_retries as usize)
            .with_jitter()
    }

    /// The waits before retry 1, 2, … as `run` takes them, for a caller whose attempts need state that a closure
    /// cannot lend (a `&mut` borrowed across attempts).
    pub fn waits(&self) -> impl Iterator<Item = Duration> {
        backon::BackoffBuilder::build(self.backoff())
    }

    /// Runs `attempt` (given its number, from 1) until it succeeds, fails in a way `retryable` refuses, or the
    /// retries are spent, and returns the last attempt's result. `on_retry` hears of every failure that is about to
    /// be retried, with its attempt number and the wait before the next attempt.
    pub async fn run<T, E, Fut>(
        &self,
        mut attempt: impl FnMut(u32) -> Fut,
        retryable: impl FnMut(&E) -> bool,
        mut on_retry: impl FnMut(u32, &E, Duration),
    ) -> Result<T, E>
    where
        Fut: Future<Output = Result<T, E>>,
    {
        let attempts = AtomicU32::new(0);
        (|| attempt(attempts.fetch_add(1, Ordering::Relaxed) + 1))
            .retry(self.backoff())
            .sleep(tokio::time::sleep)
            .when(retryable)
            .notify(|error, wait| on_retry(attempts.load(Ordering::Relaxed), error, wait))
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use backon::BackoffBuilder;
    use tokio::time::Instant;

    /// Whether `wait` lies in [c/2, c] for c = `ceiling_ms`, give or take the timer's millisecond.
    fn within_equal_jitter(wait: Duration, ceiling_ms: u64) -> bool {
        let low = Duration::from_millis(ceiling_ms / 2).saturating_sub(Duration::from_millis(1));
        let high = Duration::from_millis(ceiling_ms + 1);
        (low..=high).contains(&wait)
    }

    #[tokio::test(start_paused = true)]
    async fn failures_are_retried_with_growing_jittered_waits_until_the_retries_are_spent() {
        let policy = RetryPolicy::new(3, 200);
        let started = Instant::now();
        let mut tried_at = Vec::new();
        let mut retried = Vec::new();

        let result: Result<(), u32> = policy
            .run(
                |n| {
                    tried_at.push(started.elapsed());
                    async move { Err(n) }
                },
                |_| true,
                |n, error, wait| retried.push((n, *error, wait)),
            )
            .await;

        assert_eq!(result, Err(4), "the last attempt's error");
        assert_eq!(tried_at.len(), 4, "one attempt and three retries");
        for (gap, ceiling) in tried_at
            .windows(2)
            .map(|w| w[1] - w[0])
            .zip([200, 400, 800])
        {
            assert!(
                within_equal_jitter(gap, ceiling),
                "{gap:?} for a ceiling of {ceiling} ms"
            );
        }
        let told: Vec<(u32, u32)> = retried.iter().map(|(n, e, _)| (*n, *e)).collect();
        assert_eq!(told, [(1, 1), (2, 2), (3, 3)]);
        for (i, (_, _, wait)) in retried.iter().enumerate() {
            // The timer rounds a wait up to its millisecond.
            let gap = tried_at[i + 1] - tried_at[i];
            assert!(
                gap >= *wait && gap - *wait <= Duration::from_millis(1),
                "told {wait:?}, took {gap:?}"
            );
        }
    }

    #[test]
    fn the_waits_grow_with_equal_jitter_and_end_with_the_retries() {
        let waits: Vec<Duration> = RetryPolicy::new(3, 100).waits().collect();
        assert_eq!(waits.len(), 3);
        for (wait, ceiling) in waits.into_iter().zip([100, 200, 400]) {
            assert!(within_equal_jitter(wait, ceiling), "{wait:?} for {ceiling}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_failure_the_caller_refuses_is_returned_at_once() {
        let policy = RetryPolicy::new(3, 200);
        let started = Instant::now();
        let mut attempts = 0;

        let result: Result<(), &str> = policy
            .run(
                |_| {
                    attempts += 1;
                    async { Err("client error") }
                },
                |e| *e != "client error",
                |_, _, _| {},
            )
            .await;

        assert_eq!(result, Err("client error"));
        assert_eq!(attempts, 1);
        assert_eq!(started.elapsed(), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn a_success_after_failures_is_returned() {
        let policy = RetryPolicy::new(2, 10);

        let result = policy
            .run(
                |n| async move {
                    if n < 3 {
                        Err(n)
                    } else {
                        Ok(n)
                    }
                },
                |_| true,
                |_, _, _| {},
            )
            .await;

        assert_eq!(result, Ok(3));
    }

    #[tokio::test(start_paused = true)]
    async fn no_retries_means_one_attempt() {
        let mut attempts = 0;
        let result: Result<(), ()> = RetryPolicy::new(0, 200)
            .run(
                |_| {
                    attempts += 1;
                    async { Err(()) }
                },
                |_| true,
                |_, _, _| {},
            )
            .await;
        assert_eq!((result, attempts), (Err(()), 1));
    }

    #[test]
    fn the_wait_stops_doubling_after_ten_doublings() {
        let waits: Vec<Duration> = RetryPolicy::new(14, 8).backoff().build().collect();
        assert_eq!(waits.len(), 14);
        for (n, wait) in waits.into_iter().enumerate() {
            let ceiling = 8 << (n as u32).min(MAX_DOUBLINGS);
            assert!(
                within_equal_jitter(wait, ceiling),
                "retry {}: {wait:?}",
                n + 1
            );
        }
    }
}
