//! The OpenAI-compatible Chat Completions adapter: `POST {base_url}/chat/completions`, answered whole or as SSE
//! chunks; translation and normalisation are the core's (`chat`, `chat_stream`).

use futures::future::BoxFuture;
use futures::StreamExt;
use gateway_core::chat;
use gateway_core::chat_stream::ChatStream;
use gateway_core::steps::ModelOutput;
use serde_json::Value;

use super::{bearer, sse, Body, Forwarder, UpstreamError, Wire};

/// How an OpenAI-compatible Chat Completions upstream speaks.
pub(super) const WIRE: Wire = Wire {
    path: "/chat/completions",
    build: |target, input| Body::Chat(chat::build_chat_request(target.model, input)),
    headers: bearer,
    parse: chat::parse_answer,
    include_usage: true,
    read_stream,
};

/// Reads a Chat Completions SSE body (`data: {...}` events, ending with `data: [DONE]`), passing text on as it
/// arrives, into the normalised answer.
fn read_stream<'a>(
    mut events: sse::Events<'a>,
    attempt: u32,
    out: &'a Forwarder<'a>,
    response_id: &'a str,
) -> BoxFuture<'a, Result<ModelOutput, UpstreamError>> {
    Box::pin(async move {
        let broken = UpstreamError::broken_at(attempt);
        let mut stream = ChatStream::new();
        let mut done = false;
        while let Some(event) = events.next().await {
            let event = event?;
            if event.data.trim() == "[DONE]" {
                done = true;
                break;
            }
            let value: Value = serde_json::from_str(&event.data)
                .map_err(|e| UpstreamError::Parse(format!("bad chunk: {e}")))?;
            // The only chunk `push` refuses is an `{"error": ...}` chunk: the upstream gave up mid-answer.
            for delta in stream.push(&value).map_err(|e| broken(e.0))? {
                out.send(delta).await;
            }
        }
        if !done && !stream.has_finish_reason() {
            // Some servers end without [DONE], but every complete answer names a finish reason.
            return Err(broken("the body ended before the answer did".into()));
        }
        stream
            .finish(&mut out.ids(response_id))
            .map_err(|e| UpstreamError::Parse(e.0))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::upstream::Live;
    use bytes::Bytes;
    use gateway_core::steps::{Finish, ModelDelta};
    use serde_json::json;
    use tokio::sync::mpsc;

    /// A body as it arrives: its parts, or a transport error.
    type Body = Vec<Result<&'static str, &'static str>>;

    fn chunk(delta: Value, finish_reason: Option<&str>) -> String {
        let chunk =
            json!({"choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}]});
        format!("data: {chunk}\n\n")
    }

    /// What reading `parts` (the body, as it arrives) gave: the answer's text or the failure, and the deltas
    /// passed on.
    async fn read(parts: Body) -> (Result<ModelOutput, UpstreamError>, Vec<ModelDelta>) {
        let (tx, mut rx) = mpsc::channel(64);
        let out = Forwarder::new(Live {
            message_id: "msg_live",
            deltas: &tx,
        });
        let body = futures::stream::iter(
            parts
                .into_iter()
                .map(|p| p.map(|p| Bytes::from_static(p.as_bytes()))),
        );
        let events = Box::pin(sse::upstream_events(body, 1));
        let result = read_stream(events, 1, &out, "resp_test").await;
        assert_eq!(
            out.forwarded(),
            !rx.is_empty(),
            "forwarded says whether anything was passed on"
        );
        drop(tx);
        let mut deltas = Vec::new();
        while let Some(delta) = rx.recv().await {
            deltas.push(delta);
        }
        (result, deltas)
    }

    fn leak(text: String) -> &'static str {
        Box::leak(text.into_boxed_str())
    }

    fn text(deltas: &[ModelDelta]) -> String {
        deltas
            .iter()
            .map(|ModelDelta::Text(t)| t.as_str())
            .collect()
    }

    #[tokio::test]
    async fn complete_bodies_are_read_whole_however_they_are_framed() {
        let hello = leak(chunk(json!({"role": "assistant", "content": "Hel"}), None));
        let lo = leak(chunk(json!({"content": "lo"}), Some("stop")));
        let cases: Vec<(&str, Body)> = vec![
            ("normal", vec![Ok(hello), Ok(lo), Ok("data: [DONE]\n\n")]),
            (
                "CRLF line ends",
                vec![Ok(leak(
                    format!("{hello}{lo}data: [DONE]\n\n").replace('\n', "\r\n"),
                ))],
            ),
            (
                "split anywhere, even inside a line ending",
                vec![
                    Ok(leak(format!("{hello}{}", &lo[..10]).replace('\n', "\r\n"))),
                    Ok(leak(lo[10..].replace('\n', "\r\n"))),
                    Ok("data: [DO"),
                    Ok("NE]\r"),
                    Ok("\n\r\n"),
                ],
            ),
            (
                "multi-line events, comments and other fields",
                vec![
                    Ok(": keep-alive\n\n"),
                    Ok("event: chunk\nid: 1\ndata: {\"choices\": [{\"delta\":\ndata: {\"content\": \"Hel\"}}]}\n\n"),
                    Ok(lo),
                    Ok("data:[DONE]\n\n"),
                ],
            ),
            ("no [DONE], but a finish_reason", vec![Ok(hello), Ok(lo)]),
            (
                "the last event's blank line missing",
                vec![Ok(hello), Ok(leak(lo.trim_end().to_owned() + "\n"))],
            ),
            (
                "nothing read after [DONE]",
                vec![Ok(hello), Ok(lo), Ok("data: [DONE]\n\ndata: {not json\n\n")],
            ),
        ];
        for (name, parts) in cases {
            let (result, deltas) = read(parts).await;
            let output = result.unwrap_or_else(|e| panic!("{name}: {e}"));
            let message = output.message.expect(name);
            assert_eq!(
                (message.item_id.as_str(), message.text.as_str()),
                ("msg_live", "Hello"),
                "{name}"
            );
            assert_eq!(output.finish, Finish::Stop, "{name}");
            assert_eq!(text(&deltas), "Hello", "{name}");
        }
    }

    #[tokio::test]
    async fn bodies_that_break_off_are_broken_and_say_what_was_passed_on() {
        let hello = leak(chunk(json!({"role": "assistant", "content": "Hel"}), None));
        let cases: Vec<(&str, Body, &str)> = vec![
            (
                "ended cleanly before a finish_reason",
                vec![Ok(hello)],
                "Hel",
            ),
            ("empty", vec![], ""),
            (
                "cut mid-event",
                vec![
                    Ok(hello),
                    Ok("data: {\"choices\": [{\"delta\": {\"content\": \"lo\"}, \"fin"),
                ],
                "Hel",
            ),
            (
                "an error chunk",
                vec![
                    Ok(hello),
                    Ok("data: {\"error\": {\"message\": \"overloaded\"}}\n\n"),
                ],
                "Hel",
            ),
            (
                "an error chunk first",
                vec![Ok("data: {\"error\": {\"message\": \"overloaded\"}}\n\n")],
                "",
            ),
            (
                "the connection dropped",
                vec![Ok(hello), Err("connection reset")],
                "Hel",
            ),
        ];
        for (name, parts, passed_on) in cases {
            let (result, deltas) = read(parts).await;
            assert!(
                matches!(result, Err(UpstreamError::Broken { attempts: 1, .. })),
                "{name}: {result:?}"
            );
            assert_eq!(text(&deltas), passed_on, "{name}");
        }
    }

    #[tokio::test]
    async fn an_unparseable_chunk_is_a_parse_error() {
        let (result, _) = read(vec![Ok("data: {\"choices\": [\n\n")]).await;
        assert!(matches!(result, Err(UpstreamError::Parse(_))), "{result:?}");
    }
}
