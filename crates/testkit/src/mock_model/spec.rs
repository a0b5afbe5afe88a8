//! JSON reply specs ([`ReplySpec`]) that an out-of-process test posts to `POST /_mock/script`;
//! each one maps onto the [`Reply`] and [`Call`] builders.

use std::time::Duration;

use serde::Deserialize;
use serde_json::{Map, Value};

use super::reply::{Call, Reply};

/// One scripted answer, as JSON. Exactly one of these shapes, each with an optional
/// `"finish_reason"` and an optional `"delay_ms"` (wait this many milliseconds before answering,
/// before the status line, like [`Reply::with_delay`]):
///
/// * `{"text": "..."}` — an assistant message ([`Reply::text`]);
/// * `{"tool_calls": [{"name": "...", "arguments": {...}, "id"?: "..."}], "text"?: "..."}` —
///   tool calls, with optional content text ([`Reply::tool_calls`],
///   [`Reply::text_and_tool_calls`]); `arguments` defaults to `{}` and `id` to `call_<n>`;
/// * `{"error": {"status": 500, "message": "..."}}` — an HTTP error ([`Reply::error`]).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplySpec {
    text: Option<String>,
    tool_calls: Option<Vec<CallSpec>>,
    error: Option<ErrorSpec>,
    finish_reason: Option<String>,
    delay_ms: Option<u64>,
}

/// One tool call of a [`ReplySpec`].
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CallSpec {
    name: String,
    #[serde(default = "empty_object")]
    arguments: Value,
    id: Option<String>,
}

/// The HTTP error of a [`ReplySpec`].
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ErrorSpec {
    status: u16,
    message: String,
}

fn empty_object() -> Value {
    Value::Object(Map::new())
}

impl TryFrom<ReplySpec> for Reply {
    type Error = String;

    fn try_from(spec: ReplySpec) -> Result<Reply, String> {
        let reply = match (spec.error, spec.tool_calls, spec.text) {
            (Some(error), None, None) => Reply::error(error.status, &error.message),
            (Some(_), _, _) => {
                return Err("an \"error\" reply cannot also have \"text\" or \"tool_calls\"".into())
            }
            (None, Some(calls), text) => {
                let calls = calls.into_iter().map(Call::from).collect();
                match text {
                    Some(text) => Reply::text_and_tool_calls(text, calls),
                    None => Reply::tool_calls(calls),
                }
            }
            (None, None, Some(text)) => Reply::text(text),
            (None, None, None) => {
                return Err("a reply needs \"text\", \"tool_calls\" or \"error\"".into())
            }
        };
        let reply = match spec.finish_reason {
            Some(reason) => reply.with_finish_reason(&reason),
            None => reply,
        };
        Ok(match spec.delay_ms {
            Some(ms) => reply.with_delay(Duration::from_millis(ms)),
            None => reply,
        })
    }
}

impl From<CallSpec> for Call {
    fn from(spec: CallSpec) -> Call {
        let call = Call::new(&spec.name, spec.arguments);
        match spec.id {
            Some(id) => call.with_id(&id),
            None => call,
        }
    }
}

/// Parses a JSON array of reply specs into replies, or says which one is wrong.
pub(crate) fn parse_script(body: &[u8]) -> Result<Vec<Reply>, String> {
    let specs: Vec<ReplySpec> = serde_json::from_slice(body)
        .map_err(|e| format!("expected a JSON array of reply specs: {e}"))?;
    specs
        .into_iter()
        .enumerate()
        .map(|(i, spec)| Reply::try_from(spec).map_err(|e| format!("reply [{i}]: {e}")))
        .collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn parse(value: Value) -> Result<Vec<Reply>, String> {
        parse_script(value.to_string().as_bytes())
    }

    #[test]
    fn every_spec_shape_maps_onto_the_builders() {
        let replies = parse(json!([
            {"text": "hi"},
            {"text": "cut", "finish_reason": "length"},
            {"tool_calls": [{"name": "add", "arguments": {"a": 1, "b": 2}}, {"name": "fail", "id": "call_x"}]},
            {"tool_calls": [{"name": "echo"}], "text": "calling"},
            {"error": {"status": 503, "message": "busy"}},
            {"text": "late", "delay_ms": 250},
            {"error": {"status": 500, "message": "slow"}, "delay_ms": 0},
        ]));
        assert_eq!(
            replies,
            Ok(vec![
                Reply::text("hi"),
                Reply::text("cut").with_finish_reason("length"),
                Reply::tool_calls(vec![
                    Call::new("add", json!({"a": 1, "b": 2})),
                    Call::new("fail", json!({})).with_id("call_x"),
                ]),
                Reply::text_and_tool_calls("calling", vec![Call::new("echo", json!({}))]),
                Reply::error(503, "busy"),
                Reply::text("late").with_delay(Duration::from_millis(250)),
                Reply::error(500, "slow").with_delay(Duration::ZERO),
            ])
        );
    }

    #[test]
    fn invalid_specs_are_rejected_with_their_index() {
        let cases = [
            (json!({"text": "not an array"}), "expected a JSON array"),
            (json!([{"text": "a"}, {}]), "reply [1]: a reply needs"),
            (
                json!([{"error": {"status": 500, "message": "x"}, "text": "y"}]),
                "reply [0]: an \"error\" reply",
            ),
            (json!([{"txt": "typo"}]), "unknown field `txt`"),
            (json!([{"text": "a", "delay_ms": -1}]), "invalid value"),
            (
                json!([{"tool_calls": [{"arguments": {}}]}]),
                "missing field `name`",
            ),
        ];
        for (body, expected) in cases {
            match parse(body.clone()) {
                Err(message) => assert!(message.contains(expected), "{body}: {message}"),
                Ok(replies) => panic!("{body} was accepted as {replies:?}"),
            }
        }
    }
}
