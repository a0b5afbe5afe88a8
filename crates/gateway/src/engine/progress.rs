//! Where a running response reports its progress: nowhere (a JSON answer), or an event stream, to the client
//! that created it and to whoever follows it.

use std::future::Future;
use std::time::Duration;

use gateway_core::events::{project_stored, Event, EventProjection, Progress};
use gateway_core::response::ResponseRecord;
use gateway_core::Step;
use tokio::sync::mpsc;

use super::runs::Hub;

/// Takes the progress of one response as its loop runs (see [`Progress`]).
pub trait ProgressSink: Send {
    /// Takes one report; may wait while a slow reader catches up (backpressure).
    fn report(&mut self, progress: Progress<'_>) -> impl Future<Output = ()> + Send;

    /// Whether the model's text should be reported as it arrives (the upstream is then called streaming).
    fn wants_text_deltas(&self) -> bool;

    /// Whether the client of a foreground stream went away: the response then stops at its next step boundary.
    fn is_closed(&self) -> bool;

    /// Where the run's live events go for followers (a re-attached stream on this replica), if it has any.
    fn follow_with(&mut self, _hub: Hub) {}
}

/// The sink of a response answered as JSON: nobody watches it run.
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

/// The events of a response, projected from its progress by the core, for its client (if it has one) and its
/// followers.
pub struct EventSink {
    projection: EventProjection,
    client: Option<mpsc::Sender<Event>>,
    client_gone: bool,
    /// A client that takes no event for this long, its connection open, is treated as gone
    /// (`server.stream_stall_timeout_ms`): a foreground response stops at the next step boundary and gives back
    /// its place, instead of holding it for ever.
    stall: Duration,
    /// A foreground stream ends when its client leaves; a background response runs on without it.
    stops_without_client: bool,
    hub: Option<Hub>,
}

impl EventSink {
    /// The events of a new streamed response, sent to its client (`foreground`: the response stops when the
    /// client leaves), who is treated as gone once it takes nothing for `stall`.
    pub fn for_client(client: mpsc::Sender<Event>, foreground: bool, stall: Duration) -> EventSink {
        EventSink {
            projection: EventProjection::new(),
            client: Some(client),
            client_gone: false,
            stall,
            stops_without_client: foreground,
            hub: None,
        }
    }

    /// The events of a response nobody created a stream for (a background one, or one resumed after a crash),
    /// numbered after the events its stored steps account for: followers read those from the store.
    pub fn for_followers(record: &ResponseRecord, steps: &[Step]) -> EventSink {
        let mut projection = EventProjection::new();
        project_stored(&mut projection, record, steps);
        while projection.poll().is_some() {}
        EventSink {
            projection,
            client: None,
            client_gone: true,
            // No client to wait for.
            stall: Duration::ZERO,
            stops_without_client: false,
            hub: None,
        }
    }

    async fn send(&mut self, event: Event) {
        if let Some(hub) = self.hub.as_ref().and_then(|hub| hub.get()) {
            // No follower, or one too far behind: it reads the store instead.
            let _ = hub.send(event.clone());
        }
        let Some(client) = &self.client else { return };
        if self.client_gone {
            return;
        }
        match tokio::time::timeout(self.stall, client.send(event)).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => self.client_gone = true,
            Err(_) => {
                tracing::info!("stream client stalled; treating it as gone");
                self.client_gone = true;
            }
        }
    }
}

impl ProgressSink for EventSink {
    async fn report(&mut self, progress: Progress<'_>) {
        self.projection.handle(progress);
        while let Some(event) = self.projection.poll() {
            self.send(event).await;
        }
    }

    fn wants_text_deltas(&self) -> bool {
        true
    }

    fn is_closed(&self) -> bool {
        let gone = self.client_gone || self.client.as_ref().is_some_and(|c| c.is_closed());
        self.stops_without_client && gone
    }

    fn follow_with(&mut self, hub: Hub) {
        self.hub = Some(hub);
    }
}

#[cfg(test)]
mod tests {
    use futures::FutureExt;
    use gateway_core::steps::{Finish, ModelOutput};

    use super::*;

    /// The events that fit in the buffer of a client that reads nothing.
    const BUFFER: usize = 64;

    /// The default `server.stream_stall_timeout_ms`.
    const STALL: Duration = Duration::from_secs(60);

    fn delta(sink: &mut EventSink, text: &str) -> Option<()> {
        sink.report(Progress::TextDelta {
            item_id: "msg_1",
            delta: text,
        })
        .now_or_never()
    }

    #[tokio::test]
    async fn a_sink_whose_client_reads_nothing_waits_once_its_buffer_is_full() {
        let (tx, mut rx) = mpsc::channel(BUFFER);
        let mut sink = EventSink::for_client(tx, true, STALL);
        // The first delta opens the message: output_item.added, content_part.added and the delta.
        delta(&mut sink, "a");
        for _ in 3..BUFFER {
            assert!(delta(&mut sink, "a").is_some(), "room left");
        }
        assert!(
            delta(&mut sink, "b").is_none(),
            "the sink waits instead of queueing without bound"
        );
        assert_eq!(
            rx.recv().await.map(|e| e.kind),
            Some("response.output_item.added")
        );
        assert!(delta(&mut sink, "c").is_some());
        assert!(!sink.is_closed());
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_that_stops_reading_is_treated_as_gone_after_the_stall_timeout() {
        let (tx, _rx) = mpsc::channel(BUFFER);
        let mut sink = EventSink::for_client(tx, true, STALL);
        // The first delta opens the message: three events; then one each, up to a full buffer.
        for _ in 0..BUFFER - 2 {
            sink.report(Progress::TextDelta {
                item_id: "msg_1",
                delta: "a",
            })
            .await;
        }
        assert!(!sink.is_closed(), "a full buffer alone is backpressure");
        let started = tokio::time::Instant::now();
        // The receiver is alive but never reads: the send gives up after the stall timeout.
        sink.report(Progress::TextDelta {
            item_id: "msg_1",
            delta: "b",
        })
        .await;
        assert!(sink.is_closed());
        assert!(started.elapsed() >= STALL);
        assert!(delta(&mut sink, "c").is_some());
    }

    #[tokio::test]
    async fn a_sink_whose_client_went_away_is_closed_and_drops_events() {
        let (tx, rx) = mpsc::channel(BUFFER);
        let mut sink = EventSink::for_client(tx, true, STALL);
        drop(rx);
        assert!(sink.is_closed());
        // Nothing blocks, however many events follow.
        for _ in 0..BUFFER * 2 {
            assert!(delta(&mut sink, "a").is_some());
        }
        let output = ModelOutput {
            finish: Finish::Stop,
            ..ModelOutput::default()
        };
        assert!(sink
            .report(Progress::ModelEnded { output: &output })
            .now_or_never()
            .is_some());
    }

    #[test]
    fn a_background_stream_runs_on_when_its_client_leaves() {
        let (tx, rx) = mpsc::channel(BUFFER);
        let sink = EventSink::for_client(tx, false, STALL);
        drop(rx);
        assert!(!sink.is_closed());
    }

    #[tokio::test]
    async fn followers_get_the_events_once_one_follows() {
        let (tx, _rx) = mpsc::channel(BUFFER);
        let mut sink = EventSink::for_client(tx, true, STALL);
        let hub: Hub = std::sync::Arc::default();
        sink.follow_with(std::sync::Arc::clone(&hub));
        delta(&mut sink, "unseen");
        let mut follower = hub
            .get_or_init(|| tokio::sync::broadcast::channel(8).0)
            .subscribe();
        delta(&mut sink, "seen");
        let event = follower.recv().await.expect("an event");
        assert_eq!(event.data["delta"], "seen");
    }
}
