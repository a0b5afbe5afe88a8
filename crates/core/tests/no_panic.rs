//! Property tests: whatever a client or an upstream sends, request validation, the Chat translation and the
//! stream accumulator answer with a value or an error, never a panic; and a streamed answer accumulates to the
//! same result however its text is split into deltas. Bounded (`PROPTEST_CASES`, 256 by default) so CI runs
//! them on every change.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use gateway_core::chat::{self, IdSource};
use gateway_core::chat_stream::ChatStream;
use gateway_core::context::{model_conversation, pair_calls};
use gateway_core::items::{parse_input_item, InputItem, Item};
use gateway_core::request::{validate, CreateResponseBody};
use gateway_core::toolset::{name_calls, offered_client_tools};
use proptest::prelude::*;
use serde_json::{json, Map, Value};

struct Counter(usize);

impl IdSource for Counter {
    fn item_id(&mut self, prefix: &str) -> String {
        self.0 += 1;
        format!("{prefix}_{}", self.0)
    }
    fn call_id(&mut self, index: usize) -> String {
        format!("call_{index}")
    }
}

/// Keys the gateway looks for, drawn often in [`any_json`].
const KEYS: &[&str] = &[
    "type",
    "role",
    "content",
    "name",
    "arguments",
    "call_id",
    "id",
    "index",
    "tool_calls",
    "function",
    "choices",
    "delta",
    "message",
    "finish_reason",
    "usage",
    "parameters",
    "tools",
    "format",
    "output",
];

/// Strings the gateway looks for, drawn often in [`any_json`].
const TEXTS: &[&str] = &[
    "function",
    "function_call",
    "function_call_output",
    "custom",
    "custom_tool_call",
    "namespace",
    "message",
    "item_reference",
    "mcp_call",
    "user",
    "assistant",
    "input_text",
    "tool_calls",
    "stop",
    "{\"a\":",
];

/// Any JSON value, a few levels deep, with the keys and strings that the gateway looks for showing up often.
fn any_json() -> impl Strategy<Value = Value> {
    // Each word as likely as the pattern, as when each was a branch of its own.
    let key = prop_oneof![
        KEYS.len() as u32 => prop::sample::select(KEYS).prop_map(str::to_owned),
        1 => "[a-z_]{1,8}",
    ];
    // Each word as likely as the pattern, as when each was a branch of its own.
    let text = prop_oneof![
        TEXTS.len() as u32 => prop::sample::select(TEXTS).prop_map(str::to_owned),
        1 => ".{0,12}",
    ];
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>().prop_map(|f| json!(f)),
        text.prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 48, 6, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec((key.clone(), inner), 0..6)
                .prop_map(|pairs| Value::Object(pairs.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

/// A valid request with one field replaced by anything.
fn mutated_request() -> impl Strategy<Value = Value> {
    let field = prop_oneof![
        Just("model"),
        Just("input"),
        Just("tools"),
        Just("tool_choice"),
        Just("text"),
        Just("metadata"),
        Just("temperature"),
        Just("max_output_tokens"),
        Just("reasoning"),
        Just("previous_response_id"),
        Just("include"),
        Just("truncation"),
    ];
    (field, any_json()).prop_map(|(field, value)| {
        let mut body = json!({
            "model": "m",
            "input": [
                {"role": "user", "content": "hi"},
                {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c", "output": "ok"}
            ],
            "tools": [
                {"type": "function", "name": "f", "parameters": {"type": "object"}},
                {"type": "custom", "name": "p"},
                {"type": "namespace", "name": "ns", "tools": [{"type": "function", "name": "g"}]},
                {"type": "web_search"}
            ]
        });
        body[field] = value;
        body
    })
}

/// Runs a body through validation and, when it passes, through everything a model call makes of it.
fn through_the_core(body: Value) {
    let Ok(body) = serde_json::from_value::<CreateResponseBody>(body) else {
        return;
    };
    let Ok(request) = validate(body) else {
        return;
    };
    let context: Vec<Item> = request
        .input
        .into_iter()
        .filter_map(|item| match item {
            InputItem::Item(item) => Some(item),
            InputItem::Reference { .. } | InputItem::Hosted { .. } => None,
        })
        .collect();
    let _ = pair_calls(&context, 0, &Default::default());
    let conversation = model_conversation(&context, &[]);
    let offered = offered_client_tools(&request.params.tools);
    let input = gateway_core::context::ModelInput {
        params: &request.params,
        conversation: &conversation,
        tools: &offered,
    };
    let sent = chat::build_request("up", &input);
    assert!(sent["messages"].is_array());
}

proptest! {
    #[test]
    fn validation_never_panics_on_any_body(body in any_json()) {
        through_the_core(body);
    }

    #[test]
    fn validation_never_panics_on_a_valid_body_with_one_field_gone_wrong(body in mutated_request()) {
        through_the_core(body);
    }

    #[test]
    fn input_items_parse_or_fail_cleanly(item in any_json()) {
        let _ = parse_input_item(item);
    }

    #[test]
    fn a_chat_answer_parses_or_fails_cleanly(body in any_json(), choice in any_json()) {
        let _ = chat::parse_response(&body, &mut Counter(0));
        let wrapped = json!({"choices": [choice]});
        let from_tree = chat::parse_response(&wrapped, &mut Counter(0));
        // Read as sent, the same answer reads the same (or fails the same way).
        let bytes = serde_json::to_vec(&wrapped).unwrap();
        let from_bytes = chat::parse_answer(&bytes, &mut Counter(0));
        prop_assert_eq!(from_bytes.map_err(|e| e.to_string()), from_tree.clone().map_err(|e| e.to_string()));
        if let Ok(output) = from_tree {
            let mut calls = output.tool_calls;
            name_calls(&[], &mut calls);
        }
    }

    #[test]
    fn a_chat_answer_read_as_sent_takes_any_bytes(body in prop::collection::vec(any::<u8>(), 0..64), text in any_json()) {
        let _ = chat::parse_answer(&body, &mut Counter(0));
        let mut cut = serde_json::to_vec(&json!({"choices": [{"message": {"content": text}}]})).unwrap();
        cut.truncate(cut.len() / 2);
        prop_assert!(chat::parse_answer(&cut, &mut Counter(0)).is_err());
    }

    #[test]
    fn the_stream_accumulator_takes_any_chunks(chunks in prop::collection::vec(any_json(), 0..8)) {
        let mut stream = ChatStream::new();
        for chunk in &chunks {
            if stream.push(chunk).is_err() {
                return Ok(());
            }
        }
        let _ = stream.finish(&mut Counter(0));
    }

    #[test]
    fn text_and_arguments_accumulate_the_same_however_they_are_split(
        text in ".{0,40}",
        arguments in "[ -~]{0,40}",
        cuts in prop::collection::vec(0usize..40, 0..6),
    ) {
        let whole = accumulate(std::slice::from_ref(&text), std::slice::from_ref(&arguments));
        let split = accumulate(&split_at(&text, &cuts), &split_at(&arguments, &cuts));
        prop_assert_eq!(whole, split);
    }
}

/// `text` cut at the given character positions.
fn split_at(text: &str, cuts: &[usize]) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    let mut cuts: Vec<usize> = cuts.iter().map(|c| (*c).min(chars.len())).collect();
    cuts.sort_unstable();
    cuts.dedup();
    let mut parts = Vec::new();
    let mut start = 0;
    for cut in cuts.into_iter().chain([chars.len()]) {
        parts.push(chars[start..cut].iter().collect());
        start = cut;
    }
    parts
}

/// A streamed answer of text deltas then one tool call whose arguments come in pieces: what it accumulates to.
fn accumulate(text: &[String], arguments: &[String]) -> (String, Vec<(String, String, String)>) {
    let mut stream = ChatStream::new();
    for piece in text {
        stream
            .push(&json!({"choices": [{"index": 0, "delta": {"content": piece}}]}))
            .unwrap();
    }
    stream
        .push(&json!({"choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": 0, "id": "call_1", "type": "function", "function": {"name": "f", "arguments": ""}}
        ]}}]}))
        .unwrap();
    for piece in arguments {
        stream
            .push(&json!({"choices": [{"index": 0, "delta": {"tool_calls": [
                {"index": 0, "function": {"arguments": piece}}
            ]}}]}))
            .unwrap();
    }
    stream
        .push(&json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}))
        .unwrap();
    let output = stream.finish(&mut Counter(0)).unwrap();
    let text = output.message.map(|m| m.text).unwrap_or_default();
    let calls = output
        .tool_calls
        .into_iter()
        .map(|c| (c.call_id, c.name, c.arguments))
        .collect();
    (text, calls)
}
