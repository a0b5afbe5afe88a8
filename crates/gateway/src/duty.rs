//! Background duties that outlive a panic: a replica's beat, sweep and listener, and the writers that batch what
//! requests hand them. A duty that panics is logged, reported to the hook its spawner gave (the gateway counts it
//! in `gateway_duty_restarts_total{duty}`) and started again a moment later; one that returns has ended for good
//! (its queue closed, the process stopping). It knows nothing of the rest of the crate, so the store may use it.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use tokio::sync::Mutex;
use tokio::task::JoinHandle;

/// How long a duty that panicked waits before it starts again: a duty that panics at once every time does not
/// spin the process.
const RESTART_DELAY: Duration = Duration::from_secs(1);

/// Spawns the duty that `start` makes, and makes it again whenever it panics, telling `restarted` first. Aborting
/// the handle stops it.
pub fn spawn<F, Fut>(
    name: &'static str,
    restarted: impl Fn(&'static str) + Send + 'static,
    mut start: F,
) -> JoinHandle<()>
where
    F: FnMut() -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    tokio::spawn(async move {
        loop {
            match AssertUnwindSafe(start()).catch_unwind().await {
                Ok(()) => return,
                Err(panic) => {
                    let message = panic
                        .downcast_ref::<&str>()
                        .map(|s| (*s).to_owned())
                        .or_else(|| panic.downcast_ref::<String>().cloned())
                        .unwrap_or_default();
                    tracing::error!(duty = name, panic = %message, "a background duty panicked; starting it again");
                    restarted(name);
                    tokio::time::sleep(RESTART_DELAY).await;
                }
            }
        }
    })
}

/// The queue a duty takes its work from, kept across its restarts: the duty that panicked gives it back as it
/// unwinds, and the next one takes it up where it stopped (what the panicking one held is dropped, and whoever
/// waited on it is answered as by a writer that went away).
pub struct Queue<R>(Arc<Mutex<R>>);

impl<R> Clone for Queue<R> {
    fn clone(&self) -> Self {
        Queue(Arc::clone(&self.0))
    }
}

impl<R> Queue<R> {
    pub fn new(receiver: R) -> Queue<R> {
        Queue(Arc::new(Mutex::new(receiver)))
    }

    /// The receiver, for as long as this duty runs.
    pub async fn take(&self) -> tokio::sync::MutexGuard<'_, R> {
        self.0.lock().await
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

    use std::sync::atomic::{AtomicUsize, Ordering};

    use tokio::sync::{mpsc, oneshot};

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_duty_that_panics_is_started_again_and_takes_its_queue_up_where_it_stopped() {
        let (sender, receiver) = mpsc::unbounded_channel::<(u32, oneshot::Sender<u32>)>();
        let queue = Queue::new(receiver);
        let starts = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&starts);
        let reported = Arc::new(AtomicUsize::new(0));
        let restarts = Arc::clone(&reported);
        let told = move |_: &'static str| {
            restarts.fetch_add(1, Ordering::SeqCst);
        };
        let duty = spawn("test", told, move || {
            let queue = queue.clone();
            counted.fetch_add(1, Ordering::SeqCst);
            async move {
                let mut jobs = queue.take().await;
                while let Some((job, answer)) = jobs.recv().await {
                    if job == 0 {
                        panic!("a job the duty cannot take");
                    }
                    let _ = answer.send(job * 2);
                }
            }
        });

        let ask = |job| {
            let (answer, answered) = oneshot::channel();
            sender.send((job, answer)).expect("queued");
            answered
        };
        assert_eq!(ask(1).await.expect("answered"), 2);
        // The job it panics on goes unanswered, as from a writer that went away.
        assert!(ask(0).await.is_err());
        // The next duty takes the queue up.
        assert_eq!(ask(3).await.expect("answered after the restart"), 6);
        assert_eq!(starts.load(Ordering::SeqCst), 2);
        assert_eq!(
            reported.load(Ordering::SeqCst),
            1,
            "the restart was reported"
        );

        // Once its queue closes, the duty ends for good.
        drop(sender);
        duty.await.expect("ended");
        assert_eq!(starts.load(Ordering::SeqCst), 2);
    }
}
