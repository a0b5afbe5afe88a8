//! The WebSocket transport of `/v1/responses` (SPEC 11, Open Responses 2026-04-24): `response.create` messages
//! run one at a time per connection, answered with the same event objects as SSE; the connection remembers its
//! most recent `store: false` response so that chains continue on the same socket.
//!
//! Bounded: a message is at most the HTTP body limit (a larger one is refused with close code 1009 before it is
//! read), the context a connection remembers is at most that limit too, and an API key holds at most
//! `websocket.max_connections_per_key` connections.

mod messages;
mod sockets;

pub use sockets::OpenSockets;

use std::time::Duration;

use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use futures::stream::SplitSink;
use futures::{SinkExt, StreamExt};
use gateway_core::response::Ending;
use gateway_core::Item;
use secrecy::{ExposeSecret, SecretString};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use messages::{error_envelope, read_create, read_messages, Incoming};

use super::error::ApiError;
use super::extract::{bearer, valid_grant, ProjectKey};
use super::governance::admit;
use super::stream::{STREAM_BUFFER, TERMINAL};
use super::AppState;
use crate::engine::{EventSink, Finished};

/// `response.create` messages a client may send ahead of the one running; reading the socket waits beyond it.
const QUEUED_MESSAGES: usize = 16;

/// The code of the error sent when a connection reaches `websocket.max_connection_ms`.
pub const LIMIT_REACHED: &str = "websocket_connection_limit_reached";

/// The code of the `429` refusing a connection beyond `websocket.max_connections_per_key`.
pub const TOO_MANY_CONNECTIONS: &str = "too_many_websocket_connections";

/// `GET /v1/responses` with a WebSocket upgrade. The key is checked first: a request without a valid one is
/// refused with the usual 401 before any upgrade, and a key that holds as many connections as it may gets 429.
pub async fn open_socket(
    State(state): State<AppState>,
    ProjectKey(..): ProjectKey,
    headers: HeaderMap,
    upgrade: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Result<Response, ApiError> {
    let upgrade = upgrade.map_err(|rejection| ApiError {
        status: StatusCode::METHOD_NOT_ALLOWED,
        ..ApiError::invalid(
            format!(
                "GET /v1/responses opens a WebSocket ({}); create a response over HTTP with POST.",
                rejection.body_text()
            ),
            None,
            Some("method_not_allowed"),
        )
    })?;
    let key = SecretString::from(bearer(&headers).unwrap_or_default());
    let Some(slot) = state
        .websockets
        .admit(crate::store::tenancy::hash_key(key.expose_secret()))
    else {
        return Err(ApiError {
            status: StatusCode::TOO_MANY_REQUESTS,
            ..ApiError::invalid(
                format!(
                    "This API key already holds {} open WebSocket connections, the most it may; close one first.",
                    state.websockets.max
                ),
                None,
                Some(TOO_MANY_CONNECTIONS),
            )
        });
    };
    let max_age = state.websocket_max_age;
    let limit = state.websocket_message_limit;
    // Tungstenite refuses a frame whose header announces more than this before reading its payload, and a
    // message once its frames add up to more: neither is ever held in memory.
    let upgrade = upgrade.max_message_size(limit).max_frame_size(limit);
    Ok(upgrade.on_upgrade(move |socket| async move {
        // Counted as an open stream for as long as it lives, and against its key.
        let _open = crate::metrics::ActiveStream::open();
        let _slot = slot;
        Connection {
            state,
            key,
            remembered: None,
            limit,
        }
        .serve(socket, max_age)
        .await;
    }))
}

/// The most recent `store: false` response of a connection.
struct Remembered {
    id: String,
    context: Kept,
}

/// What a connection keeps of its most recent `store: false` response.
enum Kept {
    /// Its whole context, output included.
    Context(Vec<Item>),
    /// Only its size: the context was larger than the connection may keep, so it cannot be continued here.
    TooLarge { bytes: usize },
}

/// One client's socket.
struct Connection {
    state: AppState,
    /// The key it was opened with: each turn is admitted as a create of that key's (SPEC 13), with what the key
    /// is granted then, so that a key revoked, expired or given other limits meanwhile is held to it at once.
    key: SecretString,
    remembered: Option<Remembered>,
    /// The largest message read, and the most context remembered, in bytes (the HTTP body limit).
    limit: usize,
}

/// The client went away.
struct Gone;

/// The sending half of a client's socket.
struct Outgoing {
    sink: SplitSink<WebSocket, Message>,
    /// How long the client may take nothing of a message (`server.stream_stall_timeout_ms`).
    stall: Duration,
}

impl Outgoing {
    /// Sends `message`; a client that takes nothing of it for the stall timeout (its socket's window shut) is
    /// gone as much as one that closed, so that it holds neither this connection's task nor its key's place.
    async fn send(&mut self, message: Message) -> Result<(), Gone> {
        match tokio::time::timeout(self.stall, self.sink.send(message)).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) | Err(_) => Err(Gone),
        }
    }
}

impl Connection {
    async fn serve(mut self, socket: WebSocket, max_age: Duration) {
        let limit = Instant::now() + max_age;
        let (sink, incoming) = socket.split();
        let mut out = Outgoing {
            sink,
            stall: self.state.streams.stall,
        };
        let (queue, mut messages) = mpsc::channel(QUEUED_MESSAGES);
        let (left, mut gone) = watch::channel(false);
        let reader = tokio::spawn(read_messages(incoming, queue, left));
        loop {
            let message = tokio::select! {
                biased;
                () = tokio::time::sleep_until(limit) => {
                    let _ = self.limit_reached(&mut out).await;
                    break;
                }
                message = messages.recv() => message,
            };
            // Messages still queued when the client left are not run for nobody.
            if *gone.borrow() {
                break;
            }
            let outcome = match message {
                None => break,
                Some(Incoming::Text(text)) => self.turn(&text, &mut out, &mut gone).await,
                Some(Incoming::TooLarge) => {
                    let _ = self.too_large(&mut out).await;
                    break;
                }
                Some(Incoming::Binary) => {
                    let error = ApiError::invalid(
                        "WebSocket messages must be JSON text, not binary.",
                        None,
                        Some("invalid_message"),
                    );
                    send_error(&mut out, &error).await
                }
            };
            if outcome.is_err() {
                break;
            }
        }
        reader.abort();
    }

    /// Runs one `response.create` message to its end, sending its events; errors before the response starts
    /// are an error envelope, and the socket stays open after them.
    async fn turn(
        &mut self,
        text: &str,
        out: &mut Outgoing,
        gone: &mut watch::Receiver<bool>,
    ) -> Result<(), Gone> {
        let request = match read_create(text) {
            Ok(request) => request,
            Err(error) => return send_error(out, &error).await,
        };
        let grant = match valid_grant(&self.state, self.key.expose_secret()).await {
            Ok(grant) => grant,
            Err(error) if error.status == StatusCode::UNAUTHORIZED => {
                // The key no longer opens anything: the connection it opened ends too.
                return self.refused(out, &error).await.and(Err(Gone));
            }
            Err(error) => return send_error(out, &error).await,
        };
        let admitted = match admit(&self.state, &grant).await {
            Ok((admitted, _)) => admitted,
            Err(error) => return send_error(out, &error).await,
        };
        let previous = request.previous_response_id.clone();
        let store = request.store;
        let engine = self.state.engine.clone();
        let known = match (&previous, &self.remembered) {
            (Some(id), Some(remembered)) if remembered.id == *id => match &remembered.context {
                Kept::Context(context) => Some(context.clone()),
                Kept::TooLarge { bytes } => {
                    let error = ApiError::invalid(
                        format!(
                            "Previous response with id '{id}' cannot be continued on this WebSocket: its context ({bytes} bytes) is larger than the {} bytes a connection keeps. Continue a long chain with store: true, or send its input in full.",
                            self.limit
                        ),
                        Some("previous_response_id"),
                        Some("previous_response_not_found"),
                    );
                    // Refused like any continuation that fails: evicted.
                    self.remembered = None;
                    return send_error(out, &error).await;
                }
            },
            _ => None,
        };
        let prepared = match known {
            Some(context) => engine.prepare_continuing(admitted, request, context).await,
            None => engine.prepare(admitted, request, None).await,
        };
        let run = match prepared {
            Ok(run) => run,
            Err(error) => {
                self.forget(previous.as_deref());
                return send_error(out, &ApiError::from(error)).await;
            }
        };
        let context = (!store).then(|| run.context().to_vec());
        let response_id = run.response_id().to_owned();
        let (events_tx, mut events) = mpsc::channel(STREAM_BUFFER);
        let stall = out.stall;
        let task = tokio::spawn(tracing::Instrument::in_current_span(async move {
            engine
                .run(run, EventSink::for_client(events_tx, true, stall))
                .await
        }));
        // Whether the client was told how the response ended (its terminal event).
        let mut told_the_end = false;
        loop {
            tokio::select! {
                event = events.recv() => match event {
                    Some(event) => {
                        told_the_end |= TERMINAL.contains(&event.kind);
                        let text = event.data.to_string();
                        // The run stops at its next step boundary once nobody reads its events: a client
                        // that left, or one that has read nothing for a whole stall timeout.
                        out.send(Message::Text(text.into())).await?;
                    }
                    None => break,
                },
                () = left(gone) => return Err(Gone),
            }
        }
        let finished = match task.await {
            Ok(Ok(finished)) => finished,
            // A run that failed told the client why (an `error` event, then `response.failed`). One that gave its
            // response up (deleted while it ran, or handed over to another replica) or panicked told it nothing:
            // without an envelope, the client would wait on the open socket for an end that never comes.
            ended => {
                self.forget(previous.as_deref());
                if told_the_end {
                    return Ok(());
                }
                let error = match ended {
                    Ok(Err(error)) => ApiError::from(error),
                    _ => ApiError::run_panicked(&response_id),
                };
                return send_error(out, &error).await;
            }
        };
        self.remember(finished, context, previous.as_deref());
        Ok(())
    }

    /// Keeps the response that just ended when it can be continued only from here; a failed continuation
    /// evicts the response it continued (Open Responses: it cannot be continued again on this socket).
    fn remember(&mut self, finished: Finished, context: Option<Vec<Item>>, previous: Option<&str>) {
        if let Some(Ending::Failed { .. }) = finished.record.ending() {
            self.forget(previous);
            return;
        }
        self.remembered = context.map(|mut context| {
            context.extend(finished.output);
            let bytes = json_size(&context);
            let context = if bytes > self.limit {
                Kept::TooLarge { bytes }
            } else {
                Kept::Context(context)
            };
            Remembered {
                id: finished.record.id,
                context,
            }
        });
    }

    /// Forgets the remembered response when it is `id`.
    fn forget(&mut self, id: Option<&str>) {
        if id.is_some_and(|id| self.remembered.as_ref().is_some_and(|r| r.id == id)) {
            self.remembered = None;
        }
    }

    /// Refuses a message larger than the limit: an error envelope, then close code 1009 (message too big). The
    /// rest of the message is never read, so the connection cannot go on.
    async fn too_large(&self, out: &mut Outgoing) -> Result<(), Gone> {
        let error = ApiError {
            status: StatusCode::PAYLOAD_TOO_LARGE,
            ..ApiError::invalid(
                format!(
                    "The WebSocket message is larger than the limit of {} bytes; the connection is closed.",
                    self.limit
                ),
                None,
                Some("request_too_large"),
            )
        };
        close_with(
            out,
            &error,
            axum::extract::ws::close_code::SIZE,
            "message too big",
        )
        .await
    }

    /// Ends the connection of a key that is no longer valid: its `401` as an error envelope, then a close frame
    /// naming the policy.
    async fn refused(&self, out: &mut Outgoing, error: &ApiError) -> Result<(), Gone> {
        close_with(
            out,
            error,
            axum::extract::ws::close_code::POLICY,
            "invalid_api_key",
        )
        .await
    }

    async fn limit_reached(&self, out: &mut Outgoing) -> Result<(), Gone> {
        let error = ApiError::invalid(
            "This WebSocket connection reached its time limit; open a new one to go on.",
            None,
            Some(LIMIT_REACHED),
        );
        close_with(
            out,
            &error,
            axum::extract::ws::close_code::NORMAL,
            LIMIT_REACHED,
        )
        .await
    }
}

/// Resolves once the client has left.
async fn left(gone: &mut watch::Receiver<bool>) {
    // An error means the reader ended without saying so: the client is gone all the same.
    let _ = gone.wait_for(|left| *left).await.map(|_| ());
}

/// The size of `value` as JSON, counted without writing it anywhere.
fn json_size(value: &impl serde::Serialize) -> usize {
    struct Counter(usize);
    impl std::io::Write for Counter {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0 += bytes.len();
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut counter = Counter(0);
    match serde_json::to_writer(&mut counter, value) {
        Ok(()) => counter.0,
        // Items always serialise; were one not to, it could not be continued from anyway.
        Err(_) => usize::MAX,
    }
}

/// Sends an error envelope: `{"type": "error", "status", "error": {"type", "code", "message", "param"}}`.
/// Sends `error` as an error envelope, then closes the socket with `code` and `reason`.
async fn close_with(
    out: &mut Outgoing,
    error: &ApiError,
    code: u16,
    reason: &'static str,
) -> Result<(), Gone> {
    send_error(out, error).await?;
    let close = CloseFrame {
        code,
        reason: reason.into(),
    };
    out.send(Message::Close(Some(close))).await
}

async fn send_error(out: &mut Outgoing, error: &ApiError) -> Result<(), Gone> {
    let envelope = error_envelope(error);
    out.send(Message::Text(envelope.to_string().into())).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_size_of_a_context_is_its_json_length() {
        let context = vec![Item::user_text("hello")];
        let json = serde_json::to_vec(&context).unwrap_or_default();
        assert_eq!(json_size(&context), json.len());
    }
}
