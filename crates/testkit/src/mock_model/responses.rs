//! The mock model's answers in OpenAI's Responses shape (`POST /v1/responses`), whole or as SSE events
//! (`response.created` … `response.completed`), with reasoning items carrying `encrypted_content`.

use serde_json::{json, Value};

use super::reply::{split_pieces, Frame, Resolved, StreamMode, WireCall};

fn arguments(call: &WireCall) -> String {
    match &call.arguments {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// The output items of the answer; `id` numbers them.
fn output_items(resolved: &Resolved, id: &str) -> Vec<Value> {
    let mut items = Vec::new();
    if let Some((summary, encrypted)) = &resolved.thinking {
        items.push(json!({"type": "reasoning", "id": format!("rs_{id}"),
            "summary": [{"type": "summary_text", "text": summary}], "encrypted_content": encrypted}));
    }
    if let Some(text) = &resolved.text {
        items.push(json!({"type": "message", "id": format!("msg_{id}"), "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": []}]}));
    }
    for (n, call) in resolved.calls.iter().enumerate() {
        let mut item = json!({"type": "function_call", "id": format!("fc_{id}_{n}"), "name": call.name,
            "arguments": arguments(call), "status": "completed"});
        if let Some(call_id) = &call.id {
            item["call_id"] = json!(call_id);
        }
        items.push(item);
    }
    items
}

/// The whole `response` answer.
pub(crate) fn response_json(resolved: &Resolved, id: &str, model: &str) -> Value {
    let (input, output) = resolved.usage.map_or((0, 0), |u| (u.prompt, u.completion));
    let incomplete = resolved.finish_reason == "length";
    json!({
        "id": format!("resp_{id}"), "object": "response", "model": model,
        "status": if incomplete { "incomplete" } else { "completed" },
        "incomplete_details": if incomplete { json!({"reason": "max_output_tokens"}) } else { Value::Null },
        "output": output_items(resolved, id),
        "usage": {"input_tokens": input, "output_tokens": output, "total_tokens": input + output,
                  "input_tokens_details": {"cached_tokens": 0}, "output_tokens_details": {"reasoning_tokens": 0}},
    })
}

/// The events of a streamed answer.
pub(crate) fn stream_frames(resolved: &Resolved, id: &str, model: &str) -> Vec<Frame> {
    let mut frames: Vec<Frame> = Vec::new();
    // Each event's sequence number is its position.
    let event = |frames: &mut Vec<Frame>, kind: &'static str, mut data: Value| {
        data["type"] = json!(kind);
        data["sequence_number"] = json!(frames.len());
        frames.push(Frame::Event(kind, data.to_string()));
    };
    let whole = response_json(resolved, id, model);
    let mut started = whole.clone();
    started["status"] = json!("in_progress");
    started["output"] = json!([]);
    event(
        &mut frames,
        "response.created",
        json!({"response": started}),
    );
    event(
        &mut frames,
        "response.in_progress",
        json!({"response": started}),
    );
    let mut first_delta_at = None;
    for (index, item) in output_items(resolved, id).into_iter().enumerate() {
        let item_id = item["id"].clone();
        let mut added = item.clone();
        match item["type"].as_str() {
            Some("message") => added["content"] = json!([]),
            Some("function_call") => added["arguments"] = json!(""),
            _ => {}
        }
        event(
            &mut frames,
            "response.output_item.added",
            json!({"output_index": index, "item": added}),
        );
        match item["type"].as_str() {
            Some("message") => {
                let text = item["content"][0]["text"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned();
                event(
                    &mut frames,
                    "response.content_part.added",
                    json!({"item_id": item_id, "output_index": index, "content_index": 0,
                    "part": {"type": "output_text", "text": "", "annotations": []}}),
                );
                for piece in split_pieces(&text, 3) {
                    event(
                        &mut frames,
                        "response.output_text.delta",
                        json!({"item_id": item_id, "output_index": index, "content_index": 0, "delta": piece}),
                    );
                    first_delta_at.get_or_insert(frames.len());
                }
                event(
                    &mut frames,
                    "response.output_text.done",
                    json!({"item_id": item_id, "output_index": index, "content_index": 0, "text": text}),
                );
                event(
                    &mut frames,
                    "response.content_part.done",
                    json!({"item_id": item_id, "output_index": index, "content_index": 0,
                    "part": {"type": "output_text", "text": text, "annotations": []}}),
                );
            }
            Some("function_call") => {
                let arguments = item["arguments"].as_str().unwrap_or_default().to_owned();
                for piece in split_pieces(&arguments, 3) {
                    event(
                        &mut frames,
                        "response.function_call_arguments.delta",
                        json!({"item_id": item_id, "output_index": index, "delta": piece}),
                    );
                    first_delta_at.get_or_insert(frames.len());
                }
                event(
                    &mut frames,
                    "response.function_call_arguments.done",
                    json!({"item_id": item_id, "output_index": index, "arguments": arguments}),
                );
            }
            _ => {}
        }
        event(
            &mut frames,
            "response.output_item.done",
            json!({"output_index": index, "item": item}),
        );
    }
    let cut_at = first_delta_at.unwrap_or(frames.len());
    match resolved.mode {
        StreamMode::ErrorMidStream => {
            frames.truncate(cut_at);
            let error = json!({"type": "error", "code": "server_error", "message": "upstream exploded", "param": null, "sequence_number": cut_at});
            frames.push(Frame::Event("error", error.to_string()));
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
            let kind = if whole["status"] == "incomplete" {
                "response.incomplete"
            } else {
                "response.completed"
            };
            event(&mut frames, kind, json!({"response": whole}));
        }
    }
    frames
}

/// A Responses request's input in Chat's shape, for the rules that answer when the script is empty.
pub(crate) fn as_chat_request(request: &Value) -> Value {
    let mut messages = Vec::new();
    let input = match &request["input"] {
        Value::String(text) => vec![json!({"type": "message", "role": "user", "content": text})],
        Value::Array(items) => items.clone(),
        _ => Vec::new(),
    };
    for item in input {
        match item["type"].as_str().unwrap_or("message") {
            "message" => {
                let text = match &item["content"] {
                    Value::String(s) => s.clone(),
                    Value::Array(parts) => {
                        parts.iter().filter_map(|p| p["text"].as_str()).collect()
                    }
                    _ => String::new(),
                };
                messages.push(json!({"role": item["role"], "content": text}));
            }
            "function_call_output" => messages.push(
                json!({"role": "tool", "tool_call_id": item["call_id"], "content": item["output"]}),
            ),
            _ => {}
        }
    }
    let tools: Vec<Value> = request["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|t| json!({"type": "function", "function": {"name": t["name"], "parameters": t["parameters"]}}))
        .collect();
    json!({"model": request["model"], "messages": messages, "tools": tools})
}
