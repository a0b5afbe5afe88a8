//! A run polled on its caller's task that goes on by itself when the caller goes away.
//!
//! A foreground create waits for its run, and the run must outlive the request: a client that leaves must not
//! abandon it halfway (its tool requests, its writes). Spawning the run on a task of its own for every request
//! costs a task, moves the run's future into it and its answer out of it, and wakes the request's task once
//! more. [`Outliving`] instead polls the run where it is awaited, and only when it is dropped before the run
//! ended does it hand the rest of the run to a task of its own, in the span it was started in.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::task::{Context, Poll};

use tracing::Instrument;

/// A boxed future that is run to its end whether or not what awaits it stays: awaited, it is polled in place;
/// dropped before it ended, it is spawned, within the span that was current when it was made. A panic in it
/// is caught and answered as [`Unanswered`], as a panicking task would be by its `JoinHandle`.
pub struct Outliving<F: Future + Send + 'static>
where
    F::Output: Send + 'static,
{
    future: Option<Pin<Box<F>>>,
    span: tracing::Span,
}

/// The future of an [`Outliving`] gave no answer: it panicked (or it was polled again after it answered).
#[derive(Debug)]
pub struct Unanswered;

impl<F: Future + Send + 'static> Outliving<F>
where
    F::Output: Send + 'static,
{
    /// Wraps `future`, to be run to its end even if the wrapper is dropped.
    pub fn new(future: F) -> Outliving<F> {
        Outliving {
            future: Some(Box::pin(future)),
            span: tracing::Span::current(),
        }
    }
}

impl<F: Future + Send + 'static> Future for Outliving<F>
where
    F::Output: Send + 'static,
{
    type Output = Result<F::Output, Unanswered>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // `Outliving` is `Unpin`: the future it holds is boxed.
        let this = self.get_mut();
        let Some(future) = this.future.as_mut() else {
            return Poll::Ready(Err(Unanswered));
        };
        match std::panic::catch_unwind(AssertUnwindSafe(|| future.as_mut().poll(cx))) {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(output)) => {
                this.future = None;
                Poll::Ready(Ok(output))
            }
            Err(_) => {
                // A future that panicked is not polled again, nor spawned when this is dropped.
                let panicked = this.future.take();
                if std::panic::catch_unwind(AssertUnwindSafe(move || drop(panicked))).is_err() {
                    tracing::error!("a panicked run panicked again while dropped");
                }
                Poll::Ready(Err(Unanswered))
            }
        }
    }
}

impl<F: Future + Send + 'static> Drop for Outliving<F>
where
    F::Output: Send + 'static,
{
    fn drop(&mut self) {
        let Some(future) = self.future.take() else {
            return;
        };
        // Outside a runtime (the process is ending) there is nothing to run it on: it is dropped, as a crash
        // would drop it, and a stored response is taken over from its steps.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(future.instrument(self.span.clone()));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    use tokio::sync::oneshot;

    use super::*;

    #[tokio::test]
    async fn awaited_it_runs_in_place_to_its_end() {
        let ended = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&ended);
        let answer = Outliving::new(async move {
            tokio::task::yield_now().await;
            flag.store(true, Ordering::SeqCst);
        })
        .await;
        assert!(answer.is_ok());
        assert!(ended.load(Ordering::SeqCst));
    }

    #[tokio::test]
    async fn dropped_halfway_it_goes_on_by_itself_to_its_end() {
        let (release, released) = oneshot::channel::<()>();
        let (started_tx, started) = oneshot::channel::<()>();
        let (ended_tx, ended) = oneshot::channel::<()>();
        let mut outliving = Box::pin(Outliving::new(async move {
            let _ = started_tx.send(());
            let _ = released.await;
            let _ = ended_tx.send(());
        }));
        // Polled once, it starts and waits; then whoever awaited it goes away.
        assert!(futures::poll!(outliving.as_mut()).is_pending());
        started.await.unwrap();
        drop(outliving);
        release.send(()).unwrap();
        ended
            .await
            .expect("the run went on after its waiter was dropped");
    }

    #[tokio::test]
    async fn a_panic_is_answered_as_unanswered_and_nothing_is_left_to_run() {
        let answer = Outliving::new(async {
            #[allow(clippy::panic)]
            {
                panic!("a bug in a run");
            }
        })
        .await;
        assert!(answer.is_err());
    }
}
