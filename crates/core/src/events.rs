//! Responses API stream events: construction with contiguous `sequence_number`s and SSE framing.

use serde_json::{json, Map, Value};

/// One event of a response stream.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    pub kind: &'static str,
    pub data: Value,
}

impl Event {
    /// The whole SSE frame: `event: <type>\ndata: <one line>\n\n`, written as one chunk.
    pub fn to_sse(&self) -> String {
        format!("event: {}\ndata: {}\n\n", self.kind, self.data)
    }

    pub fn sequence_number(&self) -> u64 {
        self.data
            .get("sequence_number")
            .and_then(Value::as_u64)
            .unwrap_or(0)
    }
}

/// Numbers a response's events from 0, without gaps.
#[derive(Debug, Clone, Default)]
pub struct EventSequence {
    next: u64,
}

impl EventSequence {
    pub fn new() -> EventSequence {
        EventSequence::default()
    }

    /// The event `kind` with `fields`, stamped with its type and the next sequence number.
    pub fn event(&mut self, kind: &'static str, fields: Value) -> Event {
        let mut data = match fields {
            Value::Object(map) => map,
            _ => Map::new(),
        };
        data.insert("type".into(), json!(kind));
        data.insert("sequence_number".into(), json!(self.next));
        self.next += 1;
        Event {
            kind,
            data: Value::Object(data),
        }
    }

    pub fn response(&mut self, kind: &'static str, response: &Value) -> Event {
        self.event(kind, json!({"response": response}))
    }

    pub fn item_added(&mut self, output_index: usize, item: &Value) -> Event {
        self.event(
            "response.output_item.added",
            json!({"output_index": output_index, "item": item}),
        )
    }

    pub fn item_done(&mut self, output_index: usize, item: &Value) -> Event {
        self.event(
            "response.output_item.done",
            json!({"output_index": output_index, "item": item}),
        )
    }

    pub fn content_part_added(&mut self, item_id: &str, output_index: usize) -> Event {
        self.event(
            "response.content_part.added",
            json!({"item_id": item_id, "output_index": output_index, "content_index": 0, "part": text_part("")}),
        )
    }

    pub fn text_delta(&mut self, item_id: &str, output_index: usize, delta: &str) -> Event {
        self.event(
            "response.output_text.delta",
            json!({"item_id": item_id, "output_index": output_index, "content_index": 0, "delta": delta, "logprobs": []}),
        )
    }

    pub fn text_done(&mut self, item_id: &str, output_index: usize, text: &str) -> Event {
        self.event(
            "response.output_text.done",
            json!({"item_id": item_id, "output_index": output_index, "content_index": 0, "text": text, "logprobs": []}),
        )
    }

    pub fn content_part_done(&mut self, item_id: &str, output_index: usize, text: &str) -> Event {
        self.event(
            "response.content_part.done",
            json!({"item_id": item_id, "output_index": output_index, "content_index": 0, "part": text_part(text)}),
        )
    }

    pub fn arguments_delta(&mut self, item_id: &str, output_index: usize, delta: &str) -> Event {
        self.event(
            "response.function_call_arguments.delta",
            json!({"item_id": item_id, "output_index": output_index, "delta": delta}),
        )
    }

    pub fn arguments_done(
        &mut self,
        item_id: &str,
        output_index: usize,
        name: &str,
        arguments: &str,
    ) -> Event {
        self.event(
            "response.function_call_arguments.done",
            json!({"item_id": item_id, "output_index": output_index, "name": name, "arguments": arguments}),
        )
    }

    /// An in-stream error: nested `error` object, with `code`/`message`/`param` also at top level, so that
    /// the OpenAI spec, the Open Responses schema and the SDKs all read it.
    pub fn error(&mut self, code: &str, message: &str) -> Event {
        self.event(
            "error",
            json!({"code": code, "message": message, "param": null,
                   "error": {"type": "server_error", "code": code, "message": message, "param": null}}),
        )
    }
}

/// An `output_text` content part.
pub fn text_part(text: &str) -> Value {
    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequence_numbers_are_contiguous_from_zero() {
        let mut events = EventSequence::new();
        let numbers: Vec<u64> = [
            events.response("response.created", &json!({})),
            events.item_added(0, &json!({})),
            events.text_delta("msg_1", 0, "hi"),
            events.error("server_error", "boom"),
        ]
        .iter()
        .map(Event::sequence_number)
        .collect();
        assert_eq!(numbers, vec![0, 1, 2, 3]);
    }

    #[test]
    fn a_frame_is_one_chunk_with_single_line_data() {
        let mut events = EventSequence::new();
        let frame = events.text_delta("msg_1", 0, "line one\nline two").to_sse();
        assert!(frame.starts_with("event: response.output_text.delta\ndata: {"));
        assert!(frame.ends_with("}\n\n"));
        assert_eq!(frame.matches('\n').count(), 3, "{frame}");
    }

    #[test]
    fn error_events_are_nested_and_flat() {
        let event = EventSequence::new().error("server_error", "boom");
        assert_eq!(event.data["error"]["message"], "boom");
        assert_eq!(event.data["message"], "boom");
        assert_eq!(event.data["code"], "server_error");
    }
}
