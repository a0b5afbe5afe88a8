//! Server-sent events of a streamed upstream answer, decoded by `eventsource-stream` (any line ending, multi-line
//! `data`, comments and `event:`/`id:` fields, as the SSE specification has them).

use bytes::Bytes;
use eventsource_stream::{Event, EventStreamError, Eventsource};
use futures::{Stream, StreamExt};

/// The events of an SSE body.
///
/// Some servers end the body right after the last event's final line, without the blank line that dispatches it;
/// one more line end at the end of the body still dispatches such an event, while a last line cut mid-way stays
/// incomplete and is dropped (the caller sees the answer end early).
pub(super) fn events<E>(
    body: impl Stream<Item = Result<Bytes, E>>,
) -> impl Stream<Item = Result<Event, EventStreamError<E>>> {
    body.chain(futures::stream::iter([Ok(Bytes::from_static(b"\n"))]))
        .eventsource()
}
