//! Accumulates a streamed Chat Completions answer, chunk by chunk, into the normalised model output.
//!
//! Real servers vary: ids and names may repeat in every delta or come once, `index` may be missing or
//! wrong, whole calls may arrive in one chunk, `arguments` may be an object, empty or null, usage may come
//! in a last chunk with empty `choices` or not at all. "Has tool calls" is decided from what accumulated,
//! never from `finish_reason`.

use serde_json::Value;

use crate::chat::{normalise_arguments, parse_usage, IdSource, ParseError};
use crate::steps::{AssistantMessage, Finish, ModelDelta, ModelOutput, ToolCall, Usage};

#[derive(Debug, Clone, Default, PartialEq)]
struct PartialCall {
    index: Option<u64>,
    id: String,
    name: String,
    arguments: String,
    /// Arguments that arrived as a JSON value rather than text.
    arguments_value: Option<Value>,
}

/// The state of one streamed answer.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ChatStream {
    text: String,
    calls: Vec<PartialCall>,
    usage: Option<Usage>,
    finish: Option<Finish>,
}

impl ChatStream {
    pub fn new() -> ChatStream {
        ChatStream::default()
    }

    /// Reads one `data:` chunk. An `{"error": ...}` chunk is an error.
    pub fn push(&mut self, chunk: &Value) -> Result<Vec<ModelDelta>, ParseError> {
        if let Some(error) = chunk.get("error").filter(|e| !e.is_null()) {
            let message = error
                .get("message")
                .and_then(Value::as_str)
                .unwrap_or("upstream error in stream");
            return Err(ParseError(format!("error in stream: {message}")));
        }
        if let Some(usage) = chunk.get("usage").and_then(parse_usage) {
            self.usage = Some(usage);
        }
        let mut deltas = Vec::new();
        let Some(choice) = chunk
            .get("choices")
            .and_then(Value::as_array)
            .and_then(|c| c.first())
        else {
            return Ok(deltas);
        };
        if let Some(reason) = choice.get("finish_reason").and_then(Value::as_str) {
            self.finish = Some(finish_of(reason));
        }
        let Some(delta) = choice.get("delta") else {
            return Ok(deltas);
        };
        if let Some(text) = delta
            .get("content")
            .and_then(Value::as_str)
            .filter(|t| !t.is_empty())
        {
            self.text.push_str(text);
            deltas.push(ModelDelta::Text(text.to_owned()));
        }
        if let Some(calls) = delta.get("tool_calls").and_then(Value::as_array) {
            for call in calls {
                self.push_call_delta(call);
            }
        }
        Ok(deltas)
    }

    fn push_call_delta(&mut self, delta: &Value) {
        let index = delta.get("index").and_then(Value::as_u64);
        let id = delta
            .get("id")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty());
        let function = delta.get("function").unwrap_or(&Value::Null);
        let name = function
            .get("name")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty());
        let slot = self.slot_for(index, id, name);
        let call = &mut self.calls[slot];
        if let (Some(id), true) = (id, call.id.is_empty()) {
            call.id = id.to_owned();
        }
        if let (Some(name), true) = (name, call.name.is_empty()) {
            call.name = name.to_owned();
        }
        if call.index.is_none() {
            call.index = index;
        }
        match function.get("arguments") {
            Some(Value::String(fragment)) => call.arguments.push_str(fragment),
            Some(Value::Null) | None => {}
            Some(value) => call.arguments_value = Some(value.clone()),
        }
    }

    /// Which accumulated call a delta belongs to, creating one when the delta starts a new call.
    fn slot_for(&mut self, index: Option<u64>, id: Option<&str>, name: Option<&str>) -> usize {
        if let Some(id) = id {
            if let Some(slot) = self.calls.iter().position(|c| c.id == id) {
                return slot;
            }
        }
        if let Some(index) = index {
            if let Some(slot) = self.calls.iter().position(|c| c.index == Some(index)) {
                let same_call =
                    id.is_none_or(|id| self.calls[slot].id.is_empty() || self.calls[slot].id == id);
                if same_call {
                    return slot;
                }
            }
        }
        let starts_new = match self.calls.last() {
            None => true,
            // A new id, or a second name, opens a new call; a bare fragment continues the last one,
            // even when its index is wrong (some servers increment it for argument deltas).
            Some(last) => id.is_some() || name.is_some_and(|_| !last.name.is_empty()),
        };
        if starts_new {
            self.calls.push(PartialCall::default());
        }
        self.calls.len() - 1
    }

    /// The text accumulated so far.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Whether a chunk named a `finish_reason`: a complete answer does, a cut one may not.
    pub fn has_finish_reason(&self) -> bool {
        self.finish.is_some()
    }

    /// The normalised output once the stream has ended.
    pub fn finish(self, ids: &mut dyn IdSource) -> Result<ModelOutput, ParseError> {
        let mut tool_calls = Vec::with_capacity(self.calls.len());
        for (position, call) in self.calls.into_iter().enumerate() {
            if call.name.is_empty() {
                return Err(ParseError(format!(
                    "streamed tool call {position} has no function name"
                )));
            }
            let arguments = match &call.arguments_value {
                Some(value) if call.arguments.is_empty() => normalise_arguments(Some(value)),
                _ => normalise_arguments(Some(&Value::String(call.arguments))),
            };
            let call_id = if call.id.is_empty() {
                ids.call_id(position)
            } else {
                call.id
            };
            tool_calls.push(ToolCall::function(
                ids.item_id("fc"),
                call_id,
                call.name,
                arguments,
            ));
        }
        let finish = match self.finish {
            Some(Finish::Stop) | None if !tool_calls.is_empty() => Finish::ToolCalls,
            Some(finish) => finish,
            None => Finish::Stop,
        };
        Ok(ModelOutput {
            reasoning: Vec::new(),
            message: (!self.text.is_empty()).then(|| AssistantMessage {
                item_id: ids.item_id("msg"),
                text: crate::chat::scrub_nul(self.text),
                deltas: Vec::new(),
            }),
            tool_calls,
            usage: self.usage,
            finish,
        })
    }
}

fn finish_of(reason: &str) -> Finish {
    match reason {
        "length" => Finish::Length,
        "content_filter" => Finish::ContentFilter,
        "tool_calls" | "function_call" => Finish::ToolCalls,
        _ => Finish::Stop,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::CountingIds as Counter;
    use serde_json::json;

    fn run(chunks: Vec<Value>) -> ModelOutput {
        let mut stream = ChatStream::new();
        for chunk in &chunks {
            stream.push(chunk).unwrap();
        }
        stream.finish(&mut Counter(0)).unwrap()
    }

    fn calls(output: &ModelOutput) -> Vec<(&str, &str, &str)> {
        output
            .tool_calls
            .iter()
            .map(|c| (c.call_id.as_str(), c.name.as_str(), c.arguments.as_str()))
            .collect()
    }

    fn delta(tool_calls: Value) -> Value {
        json!({"choices": [{"index": 0, "delta": {"tool_calls": tool_calls}, "finish_reason": null}]})
    }

    #[test]
    fn text_deltas_accumulate_and_are_reported() {
        let mut stream = ChatStream::new();
        let first = stream
            .push(&json!({"choices": [{"delta": {"role": "assistant", "content": "Hel"}}]}))
            .unwrap();
        stream
            .push(&json!({"choices": [{"delta": {"content": "lo"}, "finish_reason": "stop"}]}))
            .unwrap();
        assert_eq!(first, vec![ModelDelta::Text("Hel".into())]);
        let output = stream.finish(&mut Counter(0)).unwrap();
        assert_eq!(output.message.unwrap().text, "Hello");
        assert_eq!(output.finish, Finish::Stop);
    }

    #[test]
    fn each_quirk_accumulates_to_the_same_calls() {
        let expected = vec![("call_a", "f", "{\"x\":1}"), ("call_b", "g", "{}")];
        let cases: Vec<(&str, Vec<Value>)> = vec![
            (
                "normal",
                vec![
                    delta(
                        json!([{"index": 0, "id": "call_a", "type": "function", "function": {"name": "f", "arguments": ""}}]),
                    ),
                    delta(json!([{"index": 0, "function": {"arguments": "{\"x\""}}])),
                    delta(json!([{"index": 0, "function": {"arguments": ":1}"}}])),
                    delta(
                        json!([{"index": 1, "id": "call_b", "function": {"name": "g", "arguments": "{}"}}]),
                    ),
                ],
            ),
            (
                "whole calls in one chunk",
                vec![delta(json!([
                {"index": 0, "id": "call_a", "function": {"name": "f", "arguments": "{\"x\":1}"}},
                {"index": 1, "id": "call_b", "function": {"name": "g", "arguments": "{}"}}]))],
            ),
            (
                "missing index",
                vec![
                    delta(
                        json!([{"id": "call_a", "function": {"name": "f", "arguments": "{\"x\""}}]),
                    ),
                    delta(json!([{"function": {"arguments": ":1}"}}])),
                    delta(json!([{"id": "call_b", "function": {"name": "g", "arguments": null}}])),
                ],
            ),
            (
                "name and args separate, id and name repeated",
                vec![
                    delta(json!([{"index": 0, "id": "call_a", "function": {"name": "f"}}])),
                    delta(
                        json!([{"index": 0, "id": "call_a", "function": {"name": "f", "arguments": "{\"x\":"}}]),
                    ),
                    delta(
                        json!([{"index": 0, "id": "call_a", "function": {"name": "f", "arguments": "1}"}}]),
                    ),
                    delta(json!([{"index": 1, "id": "call_b", "function": {"name": "g"}}])),
                ],
            ),
            (
                "arguments as an object",
                vec![delta(json!([
                {"index": 0, "id": "call_a", "function": {"name": "f", "arguments": {"x": 1}}},
                {"index": 1, "id": "call_b", "function": {"name": "g", "arguments": ""}}]))],
            ),
            (
                "incremented index on argument deltas",
                vec![
                    delta(
                        json!([{"index": 0, "id": "call_a", "function": {"name": "f", "arguments": ""}}]),
                    ),
                    delta(json!([{"index": 5, "function": {"arguments": "{\"x\":1}"}}])),
                    delta(
                        json!([{"index": 1, "id": "call_b", "function": {"name": "g", "arguments": "{}"}}]),
                    ),
                ],
            ),
        ];
        for (name, chunks) in cases {
            let output = run(chunks);
            assert_eq!(calls(&output), expected, "{name}");
            assert_eq!(output.finish, Finish::ToolCalls, "{name}");
        }
    }

    #[test]
    fn missing_ids_are_synthesised_per_call() {
        let output = run(vec![delta(json!([
            {"index": 0, "function": {"name": "f", "arguments": "{}"}},
            {"index": 1, "id": "", "function": {"name": "g", "arguments": "{}"}}]))]);
        assert_eq!(
            calls(&output),
            vec![("call_synth_0", "f", "{}"), ("call_synth_1", "g", "{}")]
        );
    }

    #[test]
    fn finish_reason_stop_with_calls_still_has_calls() {
        let mut chunks = vec![delta(
            json!([{"index": 0, "id": "c", "function": {"name": "f", "arguments": "{}"}}]),
        )];
        chunks.push(json!({"choices": [{"delta": {}, "finish_reason": "stop"}]}));
        let output = run(chunks);
        assert_eq!(output.tool_calls.len(), 1);
        assert_eq!(output.finish, Finish::ToolCalls);
    }

    #[test]
    fn usage_comes_from_a_chunk_with_empty_choices_or_is_absent() {
        let with_usage = run(vec![
            json!({"choices": [{"delta": {"content": "a"}}]}),
            json!({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}),
        ]);
        assert_eq!(with_usage.usage.map(|u| u.total_tokens()), Some(5));
        let without = run(vec![
            json!({"choices": [{"delta": {"content": "a"}, "finish_reason": "stop"}]}),
        ]);
        assert_eq!(without.usage, None);
    }

    #[test]
    fn an_error_chunk_is_an_error() {
        let mut stream = ChatStream::new();
        let err = stream
            .push(&json!({"error": {"message": "boom", "type": "server_error"}}))
            .unwrap_err();
        assert!(err.0.contains("boom"));
    }
}
