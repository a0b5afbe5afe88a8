//! The one canonical walk of tool calls (SPEC 8): from the gateway's items or any provider's history shape (Chat
//! `tool_calls` + `tool` messages, Anthropic `tool_use` / `tool_result` blocks, Responses items) to one record per
//! call, paired with its result, whatever the shape.
//!
//! A call that came without an id gets one from the caller (the core draws nothing), and the id is written back
//! into the history the walk read, on the call and on the result that answers it (found by position when it names
//! no call), so that every later copy of that history pairs.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::items::Item;
use crate::steps::Step;

/// Which shape a history was in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Shape {
    /// The gateway's own items (stored context and output).
    Items,
    Chat,
    Anthropic,
    Responses,
}

/// Where something sits: the index of its message or item, and of its block within an Anthropic message or
/// its position among a Chat message's `tool_calls`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Position {
    pub index: usize,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub part: Option<usize>,
}

/// One tool call and its result, however the history shaped them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallRecord {
    pub call_id: String,
    pub name: String,
    /// JSON text of the arguments (for a custom tool, its free-form input).
    pub arguments: String,
    /// The result as text, once there is one.
    pub result: Option<String>,
    /// Whether a result answers the call.
    pub completed: bool,
    /// Whether the result says the call failed (`is_error`, an `mcp_call` error, or the gateway's `{"error": …}`).
    pub failed: bool,
    pub call_at: Position,
    pub result_at: Option<Position>,
    pub shape: Shape,
}

/// Records under construction, in call order.
struct Walk<'f> {
    records: Vec<CallRecord>,
    shape: Shape,
    fresh: &'f mut dyn FnMut() -> String,
}

impl Walk<'_> {
    /// Records a call; returns the id it goes by (`id` or a fresh one when it has none).
    fn call(&mut self, id: Option<&str>, name: &str, arguments: String, at: Position) -> String {
        let call_id = match id.filter(|id| !id.is_empty()) {
            Some(id) => id.to_owned(),
            None => (self.fresh)(),
        };
        self.records.push(CallRecord {
            call_id: call_id.clone(),
            name: name.to_owned(),
            arguments,
            result: None,
            completed: false,
            failed: false,
            call_at: at,
            result_at: None,
            shape: self.shape,
        });
        call_id
    }

    /// Pairs a result with the call it names, or, naming none, with the first unanswered call; returns the id of
    /// the call it answers (to be written back), `None` when it answers nothing.
    fn result(
        &mut self,
        id: Option<&str>,
        text: String,
        failed: bool,
        at: Position,
    ) -> Option<String> {
        let record = match id.filter(|id| !id.is_empty()) {
            Some(id) => self
                .records
                .iter_mut()
                .find(|r| r.call_id == id && !r.completed),
            None => self.records.iter_mut().find(|r| !r.completed),
        }?;
        record.result = Some(text);
        record.completed = true;
        record.failed = failed;
        record.result_at = Some(at);
        Some(record.call_id.clone())
    }
}

fn looks_failed(text: &str) -> bool {
    serde_json::from_str::<Value>(text)
        .ok()
        .and_then(|v| {
            v.as_object()
                .map(|o| o.len() == 1 && o.contains_key("error"))
        })
        .unwrap_or(false)
}

fn text_of(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// Walks the gateway's items (function, custom and mcp calls with their outputs).
pub fn walk_items(items: &mut [Item], fresh: &mut dyn FnMut() -> String) -> Vec<CallRecord> {
    let mut walk = Walk {
        records: Vec::new(),
        shape: Shape::Items,
        fresh,
    };
    // Approval requests by id: the call id each stands for, and the tool it names.
    let mut requests: std::collections::HashMap<String, (String, String)> =
        std::collections::HashMap::new();
    for (index, item) in items.iter_mut().enumerate() {
        let at = Position { index, part: None };
        match item {
            Item::McpApprovalRequest(r) => {
                let id = walk.call(r.pairing_id(), &r.name, r.arguments.clone(), at);
                if let Some(request_id) = r.id.clone() {
                    requests.insert(request_id, (id.clone(), r.name.clone()));
                }
                if r.call_id.is_none() {
                    r.call_id = Some(id);
                }
            }
            // A denial answers the call; an approval leaves it to the `mcp_call` that ran it.
            Item::McpApprovalResponse(r) => {
                if let Some((call_id, name)) = requests.get(&r.approval_request_id) {
                    if !r.approve {
                        walk.result(Some(call_id), r.denial_text(name), true, at);
                    }
                }
            }
            Item::McpListTools(_) => {}
            Item::FunctionCall(c) => {
                c.call_id = walk.call(Some(&c.call_id), &c.name, c.arguments.clone(), at);
            }
            Item::CustomToolCall(c) => {
                c.call_id = walk.call(Some(&c.call_id), &c.name, c.input.clone(), at);
            }
            Item::McpCall(c) => {
                let id = walk.call(c.pairing_id(), &c.name, c.arguments.clone(), at);
                let error = c.error_text();
                let failed = error.is_some();
                let text = error.or_else(|| c.output.clone());
                if c.call_id.is_none() {
                    c.call_id = Some(id.clone());
                }
                if let Some(text) = text {
                    walk.result(Some(&id), text, failed, at);
                }
            }
            Item::FunctionCallOutput(o) => {
                let text = o.output.to_text();
                let failed = looks_failed(&text);
                if let Some(id) = walk.result(Some(&o.call_id), text, failed, at) {
                    o.call_id = id;
                }
            }
            Item::CustomToolCallOutput(o) => {
                let text = o.output.to_text();
                if let Some(id) = walk.result(Some(&o.call_id), text, false, at) {
                    o.call_id = id;
                }
            }
            Item::Message(_) | Item::Reasoning(_) | Item::Compaction(_) => {}
        }
    }
    walk.records
}

/// Walks Chat Completions `messages`: assistant `tool_calls`, then `tool` messages (which, without a
/// `tool_call_id`, answer the calls in order).
pub fn walk_chat(messages: &mut Value, fresh: &mut dyn FnMut() -> String) -> Vec<CallRecord> {
    let mut walk = Walk {
        records: Vec::new(),
        shape: Shape::Chat,
        fresh,
    };
    let Some(messages) = messages.as_array_mut() else {
        return Vec::new();
    };
    for (index, message) in messages.iter_mut().enumerate() {
        if let Some(calls) = message.get_mut("tool_calls").and_then(Value::as_array_mut) {
            for (part, call) in calls.iter_mut().enumerate() {
                let function = call.get("function").cloned().unwrap_or(Value::Null);
                let name = function
                    .get("name")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                let arguments = crate::chat::normalise_arguments(function.get("arguments"));
                let given = call.get("id").and_then(Value::as_str).map(str::to_owned);
                let at = Position {
                    index,
                    part: Some(part),
                };
                let id = walk.call(given.as_deref(), name, arguments, at);
                call["id"] = Value::String(id);
            }
        }
        if message.get("role").and_then(Value::as_str) == Some("tool") {
            let given = message
                .get("tool_call_id")
                .and_then(Value::as_str)
                .map(str::to_owned);
            let text = text_of(message.get("content").unwrap_or(&Value::Null));
            let failed = looks_failed(&text);
            let at = Position { index, part: None };
            if let Some(id) = walk.result(given.as_deref(), text, failed, at) {
                message["tool_call_id"] = Value::String(id);
            }
        }
    }
    walk.records
}

/// Walks Anthropic `messages`: `tool_use` blocks, then `tool_result` blocks (`is_error` for failures).
pub fn walk_anthropic(messages: &mut Value, fresh: &mut dyn FnMut() -> String) -> Vec<CallRecord> {
    let mut walk = Walk {
        records: Vec::new(),
        shape: Shape::Anthropic,
        fresh,
    };
    let Some(messages) = messages.as_array_mut() else {
        return Vec::new();
    };
    for (index, message) in messages.iter_mut().enumerate() {
        let Some(blocks) = message.get_mut("content").and_then(Value::as_array_mut) else {
            continue;
        };
        for (part, block) in blocks.iter_mut().enumerate() {
            let at = Position {
                index,
                part: Some(part),
            };
            match block.get("type").and_then(Value::as_str) {
                Some("tool_use") => {
                    let name = block
                        .get("name")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_owned();
                    let arguments = crate::chat::normalise_arguments(block.get("input"));
                    let given = block.get("id").and_then(Value::as_str).map(str::to_owned);
                    let id = walk.call(given.as_deref(), &name, arguments, at);
                    block["id"] = Value::String(id);
                }
                Some("tool_result") => {
                    let given = block
                        .get("tool_use_id")
                        .and_then(Value::as_str)
                        .map(str::to_owned);
                    let text = text_of(block.get("content").unwrap_or(&Value::Null));
                    let failed = block
                        .get("is_error")
                        .and_then(Value::as_bool)
                        .unwrap_or(false);
                    if let Some(id) = walk.result(given.as_deref(), text, failed, at) {
                        block["tool_use_id"] = Value::String(id);
                    }
                }
                _ => {}
            }
        }
    }
    walk.records
}

/// Walks a Responses `input` (or `output`) array: `function_call` / `custom_tool_call` items and their outputs.
pub fn walk_responses(input: &mut Value, fresh: &mut dyn FnMut() -> String) -> Vec<CallRecord> {
    let mut walk = Walk {
        records: Vec::new(),
        shape: Shape::Responses,
        fresh,
    };
    let Some(items) = input.as_array_mut() else {
        return Vec::new();
    };
    for (index, item) in items.iter_mut().enumerate() {
        let at = Position { index, part: None };
        let given = item
            .get("call_id")
            .and_then(Value::as_str)
            .map(str::to_owned);
        match item.get("type").and_then(Value::as_str) {
            Some(kind @ ("function_call" | "custom_tool_call")) => {
                let name = item
                    .get("name")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned();
                let arguments = if kind == "custom_tool_call" {
                    text_of(item.get("input").unwrap_or(&Value::Null))
                } else {
                    crate::chat::normalise_arguments(item.get("arguments"))
                };
                let id = walk.call(given.as_deref(), &name, arguments, at);
                item["call_id"] = Value::String(id);
            }
            Some("function_call_output" | "custom_tool_call_output") => {
                let text = text_of(item.get("output").unwrap_or(&Value::Null));
                let failed = looks_failed(&text);
                if let Some(id) = walk.result(given.as_deref(), text, failed, at) {
                    item["call_id"] = Value::String(id);
                }
            }
            _ => {}
        }
    }
    walk.records
}

/// The tool calls a response's model made, and the calls it carried over from the batch its previous response
/// handed back, as canonical records, each with the tool step that ran it when the gateway did.
pub fn calls_of_response(steps: &[Step]) -> Vec<(CallRecord, Option<&Step>)> {
    let mut items = crate::context::model_conversation(&[], steps);
    // Stored calls always have ids; a fresh one would only ever name a call the store lost.
    let mut missing = 0;
    let mut fresh = || {
        missing += 1;
        format!("call_unknown_{missing}")
    };
    let records = walk_items(&mut items, &mut fresh);
    let tool_step = |call_id: &str| {
        steps
            .iter()
            .find(|s| s.tool().is_some_and(|t| t.call.call_id == call_id))
    };
    let mut calls: Vec<(CallRecord, Option<&Step>)> = records
        .into_iter()
        .map(|r| {
            let step = tool_step(&r.call_id);
            (r, step)
        })
        .collect();
    // Carried-over calls were made by the previous response's model: only their tool step is here.
    for step in steps {
        let Some(tool) = step.tool() else { continue };
        if calls.iter().any(|(r, _)| r.call_id == tool.call.call_id) {
            continue;
        }
        let at = Position {
            index: step.seq as usize,
            part: None,
        };
        let result = tool.outcome.as_ref().map(|o| o.model_text());
        calls.push((
            CallRecord {
                call_id: tool.call.call_id.clone(),
                name: tool.call.name.clone(),
                arguments: tool.call.arguments.clone(),
                completed: result.is_some(),
                failed: tool.outcome.as_ref().is_some_and(|o| o.is_error()),
                result,
                call_at: at,
                result_at: tool.outcome.is_some().then_some(at),
                shape: Shape::Items,
            },
            Some(step),
        ));
    }
    calls
}

#[cfg(test)]
mod tests;
