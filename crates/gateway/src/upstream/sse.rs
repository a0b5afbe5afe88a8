//! Server-sent events of a streamed upstream answer, decoded by `eventsource-stream` (any line ending, multi-line
//! `data`, comments and `event:`/`id:` fields, as the SSE specification has them), and the reader of the typed
//! events that Anthropic Messages and OpenAI Responses stream.

use std::pin::Pin;

use bytes::Bytes;
use eventsource_stream::{Event, EventStreamError, Eventsource};
use futures::future::BoxFuture;
use futures::{Stream, StreamExt};
use gateway_core::event_stream::TypedEventStream;
use gateway_core::steps::ModelOutput;
use serde_json::Value;

use super::{Forwarder, UpstreamError};

/// The events of an upstream's SSE answer as the adapters read them.
pub(super) type Events<'a> = Pin<Box<dyn Stream<Item = Result<Event, UpstreamError>> + Send + 'a>>;

/// The events of an upstream's SSE answer, each failure already an [`UpstreamError`]: a body cut or broken is
/// `Broken` (retried), bytes that are not UTF-8 or not SSE are `Parse`.
pub(super) fn upstream_events<E: std::fmt::Display>(
    body: impl Stream<Item = Result<Bytes, E>>,
    attempt: u32,
) -> impl Stream<Item = Result<Event, UpstreamError>> {
    events(body).map(move |event| {
        event.map_err(|e| match e {
            EventStreamError::Transport(e) => UpstreamError::Broken {
                attempts: attempt,
                detail: format!("body error: {e}"),
            },
            EventStreamError::Utf8(e) => UpstreamError::Parse(format!("body not UTF-8: {e}")),
            EventStreamError::Parser(e) => UpstreamError::Parse(format!("bad event stream: {e}")),
        })
    })
}

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

/// Reads a body of typed events (`event: <type>` / `data: {...}`, ending with the provider's terminal event) into
/// the provider's accumulator `S`, passing text on as it arrives, into the normalised answer.
pub(super) fn read_typed_events<'a, S: TypedEventStream + Send + 'static>(
    mut events: Events<'a>,
    attempt: u32,
    out: &'a Forwarder<'a>,
    response_id: &'a str,
) -> BoxFuture<'a, Result<ModelOutput, UpstreamError>> {
    Box::pin(async move {
        let broken = UpstreamError::broken_at(attempt);
        let mut stream = S::default();
        while let Some(event) = events.next().await {
            let event = event?;
            let data = event.data.trim();
            if data.is_empty() || Some(data) == S::NOT_AN_EVENT {
                continue;
            }
            let mut value: Value = serde_json::from_str(data)
                .map_err(|e| UpstreamError::Parse(format!("bad event: {e}")))?;
            // The data carries its type; a server that leaves it out still names the event.
            if value.get("type").is_none() && !event.event.is_empty() {
                value["type"] = Value::String(event.event.clone());
            }
            // The only events `push` refuses are error events: the upstream gave up mid-answer (overloaded, say).
            for delta in stream.push(&value).map_err(|e| broken(e.0))? {
                out.send(delta).await;
            }
            if stream.is_complete() {
                break;
            }
        }
        if !stream.is_complete() {
            return Err(broken(S::CUT_SHORT.into()));
        }
        stream
            .finish(&mut out.ids(response_id))
            .map_err(|e| UpstreamError::Parse(e.0))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The events (type and data) that `body`, delivered in `chunks`, decodes to; `None` when decoding failed.
    fn decode(chunks: Vec<Vec<u8>>) -> Option<Vec<(String, String)>> {
        let body = futures::stream::iter(
            chunks
                .into_iter()
                .map(|c| Ok::<_, std::convert::Infallible>(Bytes::from(c))),
        );
        futures::executor::block_on(async {
            let mut decoded = Vec::new();
            let mut events = std::pin::pin!(events(body));
            while let Some(event) = events.next().await {
                let event = event.ok()?;
                decoded.push((event.event, event.data));
            }
            Some(decoded)
        })
    }

    /// SSE text from fields and line endings the decoder must handle, comments and multi-line data included.
    fn sse_text() -> impl Strategy<Value = Vec<u8>> {
        let line = prop_oneof![
            "[ -~]{0,20}".prop_map(|d| format!("data: {d}")),
            "[ -~]{0,20}".prop_map(|d| format!("data:{d}")),
            "[a-z.]{1,12}".prop_map(|e| format!("event: {e}")),
            Just(": keep-alive".to_owned()),
            Just("id: 7".to_owned()),
            Just("retry: 10".to_owned()),
            Just(String::new()),
            "[ -~]{0,10}",
        ];
        let ending = prop_oneof![Just("\n"), Just("\r\n"), Just("\r")];
        prop::collection::vec((line, ending), 0..24).prop_map(|lines| {
            lines
                .into_iter()
                .flat_map(|(line, end)| format!("{line}{end}").into_bytes())
                .collect()
        })
    }

    proptest! {
        #[test]
        fn events_are_the_same_however_the_body_is_cut(
            text in sse_text(),
            cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..8),
        ) {
            let mut positions: Vec<usize> = cuts.iter().map(|c| c.index(text.len() + 1)).collect();
            positions.sort_unstable();
            positions.dedup();
            let mut chunks = Vec::new();
            let mut start = 0;
            for cut in positions.into_iter().chain([text.len()]) {
                chunks.push(text[start..cut].to_vec());
                start = cut;
            }
            prop_assert_eq!(decode(vec![text.clone()]), decode(chunks));
        }

        #[test]
        fn any_bytes_decode_or_fail_without_a_panic(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
            let _ = decode(vec![bytes]);
        }
    }
}
