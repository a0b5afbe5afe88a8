//! Where a running response reports its progress: nowhere (a JSON answer), or a live event stream.

use std::future::Future;

use gateway_core::events::Progress;

/// Takes the progress of one response as its loop runs (see [`Progress`]). A stream turns it into events
/// through the core's `EventProjection`; a response answered as JSON reports to [`Silent`].
pub trait ProgressSink: Send {
    /// Takes one report; may wait while a slow reader catches up (backpressure).
    fn report(&mut self, progress: Progress<'_>) -> impl Future<Output = ()> + Send;

    /// Whether the model's text should be reported as it arrives (the upstream is then called streaming).
    fn wants_text_deltas(&self) -> bool;

    /// Whether the client that follows this response went away: a foreground response then stops at its next
    /// step boundary.
    fn is_closed(&self) -> bool;
}

/// The sink of a response that nobody watches while it runs.
#[derive(Debug, Clone, Copy, Default)]
pub struct Silent;

impl ProgressSink for Silent {
    async fn report(&mut self, _progress: Progress<'_>) {}

    fn wants_text_deltas(&self) -> bool {
        false
    }

    fn is_closed(&self) -> bool {
        false
    }
}
