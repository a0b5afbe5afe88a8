//! Event streams over HTTP (`text/event-stream`, with keep-alives): the stream of a response created with
//! `stream: true`, and a follower that replays a stored response's events after a sequence number and then
//! follows the live ones to the end, from any replica (re-attach, background streams).

use std::convert::Infallible;
use std::time::Duration;

use axum::response::sse::{KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use gateway_core::events::{replay, stream_error, Event};
use tokio::sync::{broadcast, mpsc};

use super::error::ApiError;
use super::shared_reads::SharedReads;
use crate::engine::{Engine, EventSink, Run};

/// Events waiting for a slow client: the loop waits when this many are queued (backpressure).
pub const STREAM_BUFFER: usize = 64;

/// A follower reads the store again after this long without a sign of progress (a notification may be lost).
const FOLLOW_POLL: Duration = Duration::from_secs(1);

/// How an event stream is kept: a keep-alive comment after `keep_alive` without an event
/// (`server.keep_alive_ms`), and its client treated as gone once it takes nothing for `stall`
/// (`server.stream_stall_timeout_ms`).
#[derive(Debug, Clone, Copy)]
pub struct StreamTimings {
    pub keep_alive: Duration,
    pub stall: Duration,
}

/// The terminal events: a follower stops after one.
pub const TERMINAL: [&str; 4] = [
    "response.completed",
    "response.incomplete",
    "response.failed",
    "response.cancelled",
];

/// Runs `run` (a foreground stream: it stops when its client leaves) on its own task and answers with its
/// events as they come.
pub fn event_stream(engine: &Engine, run: Run, timings: StreamTimings) -> Response {
    let (tx, rx) = mpsc::channel(STREAM_BUFFER);
    let response_id = run.response_id().to_owned();
    let ran = engine.spawn(run, EventSink::for_client(tx, true, timings.stall));
    sse(
        rx,
        Some(RunOfStream {
            ran,
            response_id,
            next: 0,
            told_the_end: false,
        }),
        timings.keep_alive,
    )
}

/// The run a stream carries the events of, watched so that the stream never ends without saying how: a run that
/// gave its response up (deleted while it ran, or handed over to another replica after a pause past its lease or
/// a store that stopped answering) or panicked reports no terminal event, and its client is told why in an
/// `error` event instead of a connection that just closes.
struct RunOfStream {
    ran: tokio::task::JoinHandle<Result<crate::engine::Finished, crate::engine::EngineError>>,
    response_id: String,
    /// The sequence number after the last event sent.
    next: u64,
    told_the_end: bool,
}

impl RunOfStream {
    fn saw(&mut self, event: &Event) {
        self.next = event.sequence_number() + 1;
        // A failure's `error` event told why, even when its `response.failed` could not follow.
        self.told_the_end |= TERMINAL.contains(&event.kind) || event.kind == "error";
    }

    /// The `error` event that ends the stream when its run ended without telling its client.
    async fn untold_end(self) -> Option<Event> {
        if self.told_the_end {
            return None;
        }
        let id = &self.response_id;
        let mut error = match self.ran.await {
            Ok(Ok(_)) => return None,
            Ok(Err(error)) => ApiError::from(error),
            Err(_) => ApiError::run_panicked(id),
        };
        if error.status != axum::http::StatusCode::NOT_FOUND {
            error.message.push(' ');
            error.message.push_str(&re_attach(id, self.next));
        }
        Some(error_event(self.next, &error))
    }
}

/// How to follow the rest of response `id`'s events after those numbered below `next`: the `error` event that
/// ends a stream early is not one of the response's, and its number is the one the response's next event takes.
fn re_attach(id: &str, next: u64) -> String {
    match next.checked_sub(1) {
        Some(last) => format!(
            "To follow the rest of its events, re-attach with GET /v1/responses/{id}?stream=true&starting_after={last}."
        ),
        None => format!(
            "To follow its events, re-attach with GET /v1/responses/{id}?stream=true."
        ),
    }
}

/// `error` as the `error` event numbered `sequence_number`; its code falls back to its type, as on WebSocket.
fn error_event(sequence_number: u64, error: &ApiError) -> Event {
    let code = error.code.as_deref().unwrap_or(error.kind);
    stream_error(sequence_number, error.kind, code, &error.message)
}

/// What a client follows: response `id` of `project`, from after sequence number `after` (from the start without
/// one); `live` follows the run when it runs here; `place` is the follower's place among those this replica
/// follows (`None` for a stream that began with the response).
pub struct Following {
    pub project: String,
    pub id: String,
    pub after: Option<u64>,
    pub live: Option<broadcast::Receiver<Event>>,
    pub place: Option<tokio::sync::OwnedSemaphorePermit>,
}

/// The events of what `following` names: those the store accounts for, then the live ones until the response
/// ends.
pub fn follow(
    engine: Engine,
    reads: SharedReads,
    following: Following,
    timings: StreamTimings,
) -> Response {
    let Following {
        project,
        id,
        after,
        live,
        place,
    } = following;
    let (tx, rx) = mpsc::channel(STREAM_BUFFER);
    tokio::spawn(tracing::Instrument::in_current_span(async move {
        // The follower's place among those this replica follows, given back when it stops.
        let _place = place;
        let mut follower = Follower {
            engine,
            reads,
            project,
            id,
            next: after.map_or(0, |n| n.saturating_add(1)),
            sent_any: false,
            tx,
            stall: timings.stall,
        };
        // A follower that stops before the response's end tells its client why, rather than just closing.
        let untold = match follower.run(live).await {
            Ok(Followed::ToTheEnd) => return,
            Ok(Followed::Deleted) => ApiError::not_found(format!(
                "Response '{}' was deleted while it was followed.",
                follower.id
            )),
            Ok(Followed::ShuttingDown) => ApiError {
                retryable: true,
                ..ApiError::server(format!(
                    "This gateway replica is shutting down; response '{}' goes on. {}",
                    follower.id,
                    re_attach(&follower.id, follower.next)
                ))
            },
            Err(e) => {
                tracing::warn!(error = %e, "a stream follower stopped: the store failed");
                ApiError {
                    retryable: true,
                    ..ApiError::server(format!(
                        "The gateway's store failed while following response '{}'. {}",
                        follower.id,
                        re_attach(&follower.id, follower.next)
                    ))
                }
            }
        };
        let event = error_event(follower.next, &untold);
        let _ = tokio::time::timeout(follower.stall, follower.tx.send(event)).await;
    }));
    sse(rx, None, timings.keep_alive)
}

/// The SSE answer carrying `events`, each written whole as `event: <type>\ndata: <one line of JSON>\n\n`, with a
/// `: keep-alive` comment whenever `keep_alive` passes without one; the stream counts as open until its last
/// frame is taken.
fn sse(events: mpsc::Receiver<Event>, run: Option<RunOfStream>, keep_alive: Duration) -> Response {
    let open = crate::metrics::ActiveStream::open();
    let frames = futures::stream::unfold(
        (events, run, open),
        |(mut events, mut run, open)| async move {
            let event = match events.recv().await {
                Some(event) => {
                    if let Some(run) = run.as_mut() {
                        run.saw(&event);
                    }
                    event
                }
                // The run ended (its sink is dropped): the last frame says how, when its events did not.
                None => run.take()?.untold_end().await?,
            };
            let frame = axum::response::sse::Event::default()
                .event(event.kind)
                .data(event.data.to_string());
            Some((Ok::<_, Infallible>(frame), (events, run, open)))
        },
    );
    Sse::new(frames)
        .keep_alive(KeepAlive::new().interval(keep_alive).text("keep-alive"))
        .into_response()
}

/// How a follower stopped without a store failure.
enum Followed {
    /// The response ended and the client saw its end, or the client left.
    ToTheEnd,
    /// The response was deleted before it ended.
    Deleted,
    /// This replica shuts down: the client follows the rest elsewhere.
    ShuttingDown,
}

/// Follows one response for one client.
struct Follower {
    engine: Engine,
    /// The store, read once for every follower of the response woken by the same progress.
    reads: SharedReads,
    project: String,
    id: String,
    /// The sequence number of the next event to send, and whether this follower sent any yet.
    next: u64,
    sent_any: bool,
    tx: mpsc::Sender<Event>,
    /// How long its client may take nothing before this follower stops.
    stall: Duration,
}

/// What woke a waiting follower.
enum Woken {
    /// The response may have progressed: read the store.
    Progress,
    /// A live event.
    Live(Event),
    /// The live events are lost to this follower (it fell behind, or the run ended here).
    LiveGone,
    /// The client left.
    ClientGone,
    /// This replica shuts down.
    ShuttingDown,
}

impl Follower {
    async fn run(
        &mut self,
        mut live: Option<broadcast::Receiver<Event>>,
    ) -> Result<Followed, std::sync::Arc<crate::store::StoreError>> {
        let mut progress = self.engine.replica().watch_progress();
        let stopping = self.engine.replica().stopping();
        tokio::pin!(stopping);
        let mut woken = tokio::time::Instant::now();
        let mut said_at: Option<tokio::time::Instant> = None;
        loop {
            if live.is_none() {
                live = self.engine.replica().runs.follow(&self.id);
            }
            if said_at.is_none_or(|at| at.elapsed() >= FOLLOW_POLL) {
                // The replica that runs it (if another) tells of its progress while somebody follows.
                self.engine.follow(&self.id).await;
                said_at = Some(tokio::time::Instant::now());
            }
            // Everything the store accounts for, from where the client is.
            let snapshot = match self.reads.load(&self.project, &self.id, woken).await {
                Ok(snapshot) => snapshot,
                // A busy or briefly unreachable store does not end the client's stream: it is read again.
                Err(e) if e.is_transient() => {
                    tracing::debug!(response.id = %self.id, error = %e, "a follower's read failed; reading again");
                    tokio::select! {
                        () = tokio::time::sleep(FOLLOW_POLL) => {}
                        () = self.tx.closed() => return Ok(Followed::ToTheEnd),
                        () = &mut stopping, if live.is_none() => return Ok(Followed::ShuttingDown),
                    }
                    woken = tokio::time::Instant::now();
                    continue;
                }
                Err(e) => return Err(e),
            };
            let Some(snapshot) = snapshot else {
                return Ok(Followed::Deleted);
            };
            let (stored, steps) = &*snapshot;
            let mut told_the_end = false;
            let mut end = None;
            for event in replay(&stored.record, steps) {
                let last = TERMINAL.contains(&event.kind);
                if event.sequence_number() >= self.next {
                    told_the_end |= last;
                    if !self.send(event).await {
                        return Ok(Followed::ToTheEnd);
                    }
                } else if last {
                    end = Some(event);
                }
            }
            if stored.record.ending().is_some() {
                // The store's account may number its end at or before what this follower sent (a model call made
                // again after a takeover, answered in fewer pieces than the first; a run that started, ended
                // before a step of it was stored): the end is told all the same, after the last event sent, so
                // that no stream ends without saying how. (A client that re-attaches after the end's number, and
                // was sent nothing here, is sent nothing: it says it saw the end.)
                if let Some(end) = end.filter(|_| self.sent_any && !told_the_end) {
                    let next = self.next;
                    self.send(end.renumbered(next)).await;
                }
                return Ok(Followed::ToTheEnd);
            }
            // Then the live events, as long as they follow on; anything else sends it back to the store.
            let poll = tokio::time::sleep(FOLLOW_POLL);
            tokio::pin!(poll);
            loop {
                let wake = tokio::select! {
                    () = &mut poll => Woken::Progress,
                    () = self.tx.closed() => Woken::ClientGone,
                    // A run here may still end within the shutdown's grace: its live events go on meanwhile.
                    () = &mut stopping, if live.is_none() => Woken::ShuttingDown,
                    signal = progress.recv() => match signal {
                        Ok(id) if *id == *self.id => Woken::Progress,
                        Ok(_) => continue,
                        Err(broadcast::error::RecvError::Lagged(_)) => Woken::Progress,
                        Err(broadcast::error::RecvError::Closed) => Woken::ClientGone,
                    },
                    event = next_live(&mut live) => match event {
                        Some(event) => Woken::Live(event),
                        None => Woken::LiveGone,
                    },
                };
                match wake {
                    Woken::Progress => {
                        woken = tokio::time::Instant::now();
                        break;
                    }
                    Woken::ClientGone => return Ok(Followed::ToTheEnd),
                    Woken::ShuttingDown => return Ok(Followed::ShuttingDown),
                    Woken::LiveGone => {
                        live = None;
                        woken = tokio::time::Instant::now();
                        break;
                    }
                    Woken::Live(event) if event.sequence_number() == self.next => {
                        let last = TERMINAL.contains(&event.kind);
                        if !self.send(event).await || last {
                            return Ok(Followed::ToTheEnd);
                        }
                    }
                    // An event sent already, or one after a gap (the store fills it in).
                    Woken::Live(_) => {}
                }
            }
        }
    }

    /// Sends `event` and moves on; `false` when the client left, or took nothing for a whole stall timeout (its
    /// socket's window shut): such a follower holds its place among the followers no longer.
    async fn send(&mut self, event: Event) -> bool {
        self.next = event.sequence_number() + 1;
        self.sent_any = true;
        matches!(
            tokio::time::timeout(self.stall, self.tx.send(event)).await,
            Ok(Ok(()))
        )
    }
}

/// The next live event, or `None` once there are none to have (no run here, it ended, or this follower fell too
/// far behind).
async fn next_live(live: &mut Option<broadcast::Receiver<Event>>) -> Option<Event> {
    let Some(receiver) = live.as_mut() else {
        return std::future::pending().await;
    };
    receiver.recv().await.ok()
}
