//! Live event streams over HTTP: the sink a streamed response reports to, which turns its progress into events
//! through the core's projection, and the `text/event-stream` answer that carries them (with keep-alives).

use std::convert::Infallible;
use std::time::Duration;

use axum::response::sse::{KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use gateway_core::events::{Event, EventProjection, Progress};
use tokio::sync::mpsc;

use crate::engine::{Engine, ProgressSink, Run};

/// Events waiting for a slow client: the loop waits when this many are queued (backpressure).
pub const STREAM_BUFFER: usize = 64;

/// A client that takes no event for this long, its connection open, is treated as gone: its response stops at
/// the next step boundary and gives back its place, instead of holding it for ever.
pub const STREAM_STALL_TIMEOUT: Duration = Duration::from_secs(60);

/// While no event is sent for this long, a `: keep-alive` comment goes out, so that proxies and clients do not
/// time out a stream that waits on a slow model or tool.
pub const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(15);

/// Where a streamed response's events go while its loop runs: projected from its progress, then queued for
/// the client.
pub struct EventSink {
    projection: EventProjection,
    tx: mpsc::Sender<Event>,
    closed: bool,
}

impl EventSink {
    pub fn new(tx: mpsc::Sender<Event>) -> EventSink {
        EventSink {
            projection: EventProjection::new(),
            tx,
            closed: false,
        }
    }

    async fn send(&mut self, event: Event) {
        if self.closed {
            return;
        }
        match tokio::time::timeout(STREAM_STALL_TIMEOUT, self.tx.send(event)).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => self.closed = true,
            Err(_) => {
                tracing::info!("stream client stalled; treating it as gone");
                self.closed = true;
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
        self.closed || self.tx.is_closed()
    }
}

/// Runs `run` on its own task and answers with its events as they come (`text/event-stream`), each written
/// whole as `event: <type>\ndata: <one line of JSON>\n\n`.
pub fn event_stream(engine: Engine, run: Run) -> Response {
    let (tx, rx) = mpsc::channel(STREAM_BUFFER);
    tokio::spawn(tracing::Instrument::in_current_span(async move {
        // Errors are told to the client inside the stream and logged by the engine.
        let _open = crate::metrics::ActiveStream::open();
        let _ = engine.run(run, EventSink::new(tx)).await;
    }));
    let events = futures::stream::unfold(rx, |mut rx| async move {
        let event = rx.recv().await?;
        Some((Ok::<_, Infallible>(sse_event(&event)), rx))
    });
    Sse::new(events)
        .keep_alive(
            KeepAlive::new()
                .interval(KEEP_ALIVE_INTERVAL)
                .text("keep-alive"),
        )
        .into_response()
}

fn sse_event(event: &Event) -> axum::response::sse::Event {
    axum::response::sse::Event::default()
        .event(event.kind)
        .data(event.data.to_string())
}

#[cfg(test)]
mod tests {
    use futures::FutureExt;
    use gateway_core::steps::{Finish, ModelOutput};

    use super::*;

    fn delta(sink: &mut EventSink, text: &str) -> Option<()> {
        sink.report(Progress::TextDelta {
            item_id: "msg_1",
            delta: text,
        })
        .now_or_never()
    }

    #[tokio::test]
    async fn a_sink_whose_client_reads_nothing_waits_once_its_buffer_is_full() {
        let (tx, mut rx) = mpsc::channel(STREAM_BUFFER);
        let mut sink = EventSink::new(tx);
        // The first delta opens the message: output_item.added, content_part.added and the delta.
        delta(&mut sink, "a");
        for _ in 3..STREAM_BUFFER {
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
        let (tx, _rx) = mpsc::channel(STREAM_BUFFER);
        let mut sink = EventSink::new(tx);
        // The first delta opens the message: three events; then one each, up to a full buffer.
        for _ in 0..STREAM_BUFFER - 2 {
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
        assert!(started.elapsed() >= STREAM_STALL_TIMEOUT);
        assert!(delta(&mut sink, "c").is_some());
    }

    #[tokio::test]
    async fn a_sink_whose_client_went_away_is_closed_and_drops_events() {
        let (tx, rx) = mpsc::channel(STREAM_BUFFER);
        let mut sink = EventSink::new(tx);
        drop(rx);
        assert!(sink.is_closed());
        // Nothing blocks, however many events follow.
        for _ in 0..STREAM_BUFFER * 2 {
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
}
