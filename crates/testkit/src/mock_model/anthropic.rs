//! The mock model's answers in Anthropic's Messages shape (`POST /v1/messages`), whole or as SSE events with
//! their quirks: `ping`, thinking with `signature_delta`, tool input as `input_json_delta` fragments, an `error`
//! event mid-stream, a connection cut.

use serde_json::{json, Value};

use super::reply::{split_pieces, Frame, Resolved, StreamMode, WireCall};

/// Anthropic's error body for `status`: 529 is `overloaded_error`, as the real API says it.
pub(crate) fn error_body(status: u16, message: &str) -> Value {
    let kind = match status {
        400 | 413 | 422 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        429 => "rate_limit_error",
        529 => "overloaded_error",
        _ => "api_error",
    };
    json!({"type": "error", "error": {"type": kind, "message": message}})
}

fn stop_reason(finish_reason: &str) -> &'static str {
    match finish_reason {
        "tool_calls" => "tool_use",
        "length" => "max_tokens",
        "content_filter" => "refusal",
        _ => "end_turn",
    }
}

fn input(call: &WireCall) -> Value {
    match &call.arguments {
        Value::String(s) => serde_json::from_str(s).unwrap_or_else(|_| json!({})),
        other => other.clone(),
    }
}

fn tool_use_head(call: &WireCall, input: Value) -> Value {
    let mut block = json!({"type": "tool_use", "name": call.name, "input": input});
    if let Some(id) = &call.id {
        block["id"] = json!(id);
    }
    block
}

fn usage(resolved: &Resolved) -> Value {
    let (input, output) = resolved.usage.map_or((0, 0), |u| (u.prompt, u.completion));
    json!({"input_tokens": input, "output_tokens": output, "cache_read_input_tokens": 0, "cache_creation_input_tokens": 0})
}

/// The whole `message` answer.
pub(crate) fn message_json(resolved: &Resolved, id: &str, model: &str) -> Value {
    let mut content = Vec::new();
    if let Some((thinking, signature)) = &resolved.thinking {
        content.push(json!({"type": "thinking", "thinking": thinking, "signature": signature}));
    }
    if let Some(text) = &resolved.text {
        content.push(json!({"type": "text", "text": text}));
    }
    for call in &resolved.calls {
        content.push(tool_use_head(call, input(call)));
    }
    json!({
        "id": id, "type": "message", "role": "assistant", "model": model, "content": content,
        "stop_reason": stop_reason(&resolved.finish_reason), "stop_sequence": null, "usage": usage(resolved),
    })
}

/// The events of a streamed answer.
pub(crate) fn stream_frames(resolved: &Resolved, id: &str, model: &str) -> Vec<Frame> {
    let event = |name: &'static str, data: Value| Frame::Event(name, data.to_string());
    let mut frames = vec![event(
        "message_start",
        json!({"type": "message_start", "message": {"id": id, "type": "message", "role": "assistant",
               "model": model, "content": [], "stop_reason": null, "usage": {"input_tokens": usage(resolved)["input_tokens"], "output_tokens": 1}}}),
    )];
    let mut index = 0;
    if let Some((thinking, signature)) = &resolved.thinking {
        frames.push(event("content_block_start", json!({"type": "content_block_start", "index": index, "content_block": {"type": "thinking", "thinking": "", "signature": ""}})));
        for piece in split_pieces(thinking, 2) {
            frames.push(event("content_block_delta", json!({"type": "content_block_delta", "index": index, "delta": {"type": "thinking_delta", "thinking": piece}})));
        }
        frames.push(event("content_block_delta", json!({"type": "content_block_delta", "index": index, "delta": {"type": "signature_delta", "signature": signature}})));
        frames.push(event(
            "content_block_stop",
            json!({"type": "content_block_stop", "index": index}),
        ));
        index += 1;
    }
    frames.push(event("ping", json!({"type": "ping"})));
    let mut first_delta_at = None;
    if let Some(text) = &resolved.text {
        frames.push(event("content_block_start", json!({"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}})));
        for piece in split_pieces(text, 3) {
            frames.push(event("content_block_delta", json!({"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": piece}})));
            first_delta_at.get_or_insert(frames.len());
        }
        frames.push(event(
            "content_block_stop",
            json!({"type": "content_block_stop", "index": index}),
        ));
        index += 1;
    }
    for call in &resolved.calls {
        frames.push(event("content_block_start", json!({"type": "content_block_start", "index": index, "content_block": tool_use_head(call, json!({}))})));
        let arguments = input(call).to_string();
        frames.push(event("content_block_delta", json!({"type": "content_block_delta", "index": index, "delta": {"type": "input_json_delta", "partial_json": ""}})));
        for piece in split_pieces(&arguments, 3) {
            frames.push(event("content_block_delta", json!({"type": "content_block_delta", "index": index, "delta": {"type": "input_json_delta", "partial_json": piece}})));
            first_delta_at.get_or_insert(frames.len());
        }
        frames.push(event(
            "content_block_stop",
            json!({"type": "content_block_stop", "index": index}),
        ));
        index += 1;
    }
    let cut_at = first_delta_at.unwrap_or(frames.len());
    match resolved.mode {
        StreamMode::ErrorMidStream => {
            frames.truncate(cut_at);
            frames.push(event(
                "error",
                json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
            ));
        }
        StreamMode::CutMidStream => {
            frames.truncate(cut_at);
            frames.push(Frame::Abort);
        }
        StreamMode::StallMidStream => {
            frames.truncate(cut_at + 1);
            frames.push(Frame::Stall);
        }
        _ => {
            let output_tokens = resolved.usage.map_or(0, |u| u.completion);
            frames.push(event(
                "message_delta",
                json!({"type": "message_delta", "delta": {"stop_reason": stop_reason(&resolved.finish_reason), "stop_sequence": null},
                       "usage": {"output_tokens": output_tokens}}),
            ));
            frames.push(event("message_stop", json!({"type": "message_stop"})));
        }
    }
    frames
}

/// An Anthropic request's conversation in Chat's shape, for the rules that answer when the script is empty:
/// `tool_result` blocks become `tool` messages, text blocks the message's content.
pub(crate) fn as_chat_request(request: &Value) -> Value {
    let mut messages = Vec::new();
    for message in request["messages"].as_array().into_iter().flatten() {
        let role = message["role"].as_str().unwrap_or("user");
        match &message["content"] {
            Value::String(text) => messages.push(json!({"role": role, "content": text})),
            // Consecutive messages of one role arrive merged into one turn: each text block is its own message.
            Value::Array(blocks) => {
                for block in blocks {
                    match block["type"].as_str() {
                        Some("text") => messages.push(json!({"role": role, "content": block["text"]})),
                        Some("tool_result") => messages.push(json!({"role": "tool",
                            "tool_call_id": block["tool_use_id"], "content": block_text(&block["content"])})),
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    let tools: Vec<Value> = request["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|t| json!({"type": "function", "function": {"name": t["name"], "parameters": t["input_schema"]}}))
        .collect();
    json!({"model": request["model"], "messages": messages, "tools": tools})
}

fn block_text(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts.iter().filter_map(|p| p["text"].as_str()).collect(),
        _ => String::new(),
    }
}

/// Anthropic's usage of `request` with prompt caching: `(input, cache written, cache read)`, by the mock's token
/// count (a quarter of the characters of the blocks as JSON, rounded up). The blocks run tools, then system, then
/// each message's content blocks; a hit is the longest prefix ending at a block boundary that an earlier request
/// wrote; a request writes the prefixes up to each of its `cache_control` breakpoints (`cache`).
pub(crate) fn cache_usage(
    request: &Value,
    cache: &mut std::collections::HashSet<u64>,
) -> (u64, u64, u64) {
    use std::hash::{Hash, Hasher};
    let mut blocks: Vec<(String, bool)> = Vec::new();
    let mut push = |block: &Value| {
        let breakpoint = block.get("cache_control").is_some();
        let mut plain = block.clone();
        if let Some(map) = plain.as_object_mut() {
            map.remove("cache_control");
        }
        blocks.push((plain.to_string(), breakpoint));
    };
    for tool in request["tools"].as_array().into_iter().flatten() {
        push(tool);
    }
    match &request["system"] {
        Value::String(text) => push(&json!({"type": "text", "text": text})),
        Value::Array(parts) => parts.iter().for_each(&mut push),
        _ => {}
    }
    for message in request["messages"].as_array().into_iter().flatten() {
        match &message["content"] {
            Value::String(text) => {
                push(&json!({"role": message["role"], "type": "text", "text": text}))
            }
            Value::Array(parts) => parts.iter().for_each(&mut push),
            _ => {}
        }
    }
    let tokens = |chars: usize| (chars as u64).div_ceil(4);
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    let (mut chars, mut read, mut written_to) = (0usize, 0u64, 0u64);
    let mut writes = Vec::new();
    for (text, breakpoint) in &blocks {
        text.hash(&mut hasher);
        chars += text.len();
        let prefix = hasher.finish();
        if cache.contains(&prefix) {
            read = tokens(chars);
        }
        if *breakpoint {
            writes.push(prefix);
            written_to = tokens(chars);
        }
    }
    cache.extend(writes);
    let total = tokens(chars);
    let written = written_to.saturating_sub(read);
    (total - read - written, written, read)
}
