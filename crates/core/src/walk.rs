//! The one pairing of tool calls with their results in a conversation of the gateway's items (SPEC 8): every
//! translator (`chat`, `anthropic`, `openai_responses`) and the tool-call audit read calls and results through it.
//!
//! Calls pair with results by `call_id`, never by position. A call id names one call: a repeat (a handed-back
//! server call shows again as the `mcp_call` that ran it) is the same call, and the first result of a call is its
//! result. The client's input is checked, with errors, before it ever gets here (`context::pair_calls`); this walk
//! only reads what the checks let through and what the gateway stored.

use std::borrow::Cow;
use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::items::{ContentPart, Item};
use crate::steps::Step;

/// One tool call of a conversation, borrowed from its item.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Call<'a> {
    pub call_id: &'a str,
    pub name: &'a str,
    pub input: CallInput<'a>,
}

/// What a call carries: a function's JSON arguments, or a custom tool's free-form input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallInput<'a> {
    Arguments(&'a str),
    Custom(&'a str),
}

impl<'a> Call<'a> {
    /// The arguments as a function call: a custom tool's free-form input is the function of one string it is
    /// offered as to providers without custom tools (`{"input": …}`).
    pub fn function_arguments(&self) -> Cow<'a, str> {
        match self.input {
            CallInput::Arguments(arguments) => Cow::Borrowed(arguments),
            CallInput::Custom(input) => {
                Cow::Owned(serde_json::json!({ "input": input }).to_string())
            }
        }
    }
}

/// The call an item makes: function and custom tool calls, and the gateway's own calls (`mcp_call`) that have an
/// id to pair by.
pub fn call_of(item: &Item) -> Option<Call<'_>> {
    match item {
        Item::FunctionCall(c) => Some(Call {
            call_id: &c.call_id,
            name: &c.name,
            input: CallInput::Arguments(&c.arguments),
        }),
        Item::CustomToolCall(c) => Some(Call {
            call_id: &c.call_id,
            name: &c.name,
            input: CallInput::Custom(&c.input),
        }),
        Item::McpCall(c) => c.pairing_id().map(|call_id| Call {
            call_id,
            name: &c.name,
            input: CallInput::Arguments(&c.arguments),
        }),
        Item::Message(_)
        | Item::FunctionCallOutput(_)
        | Item::CustomToolCallOutput(_)
        | Item::Reasoning(_)
        | Item::Compaction(_)
        | Item::McpListTools(_)
        | Item::McpApprovalRequest(_)
        | Item::McpApprovalResponse(_) => None,
    }
}

/// A call's result as the model reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct CallResult<'a> {
    /// The text; an `mcp_call`'s error is the gateway's `{"error": {"message": …}}`.
    pub text: String,
    /// The content parts a client sent as the output (text, images, files), for a provider that takes them as
    /// they are; `text` is them flattened, for one that takes text only.
    pub parts: Option<&'a [ContentPart]>,
    /// Whether the result says the call failed: the gateway's `{"error": …}` shape.
    pub failed: bool,
    /// Whether it came as a `custom_tool_call_output` (Responses upstreams take it back in that form).
    pub custom: bool,
    /// Where it stands in the conversation.
    pub index: usize,
}

/// Every tool result in a conversation, by `call_id`: client outputs and the results inside `mcp_call` items; the
/// first result of a call wins.
pub fn results_by_call_id(conversation: &[Item]) -> HashMap<&str, CallResult<'_>> {
    let mut results: HashMap<&str, CallResult<'_>> = HashMap::new();
    for (index, item) in conversation.iter().enumerate() {
        let (call_id, text, custom, parts) = match item {
            Item::FunctionCallOutput(o) => (
                o.call_id.as_str(),
                o.output.to_text(),
                false,
                o.output.parts(),
            ),
            Item::CustomToolCallOutput(o) => (
                o.call_id.as_str(),
                o.output.to_text(),
                true,
                o.output.parts(),
            ),
            Item::McpCall(call) => {
                let Some(call_id) = call.pairing_id() else {
                    continue;
                };
                let text = match (call.error_text(), &call.output) {
                    (Some(error), _) => {
                        serde_json::json!({"error": {"message": error}}).to_string()
                    }
                    (None, Some(output)) => output.clone(),
                    (None, None) => String::new(),
                };
                (call_id, text, false, None)
            }
            Item::Message(_)
            | Item::FunctionCall(_)
            | Item::CustomToolCall(_)
            | Item::Reasoning(_)
            | Item::Compaction(_)
            | Item::McpListTools(_)
            | Item::McpApprovalRequest(_)
            | Item::McpApprovalResponse(_) => continue,
        };
        results.entry(call_id).or_insert_with(|| CallResult {
            failed: reads_as_failure(&text),
            text,
            parts,
            custom,
            index,
        });
    }
    results
}

/// Whether a tool result is the gateway's failure shape: an object whose one key is `error`, as the gateway
/// writes it (compact, `error` first).
fn reads_as_failure(text: &str) -> bool {
    text.starts_with("{\"error\"")
        && serde_json::from_str::<Value>(text)
            .ok()
            .and_then(|v| {
                v.as_object()
                    .map(|o| o.len() == 1 && o.contains_key("error"))
            })
            .unwrap_or(false)
}

/// Which shape the audited history was in: the gateway walks only its own items. Kept as a field of the audit's
/// records, which show it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Shape {
    /// The gateway's own items (stored context and output).
    Items,
}

/// Where something sits: the index of its item (for a tool step, its sequence number).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Position {
    pub index: usize,
    /// The part within the item; the gateway's items have none (kept for the audit's record shape).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub part: Option<usize>,
}

impl Position {
    fn item(index: usize) -> Position {
        Position { index, part: None }
    }
}

/// One tool call and its result, as the audit shows it.
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
    pub call_at: Position,
    pub result_at: Option<Position>,
    pub shape: Shape,
}

/// The calls of a conversation in order, each once, paired with its result.
pub fn call_records(conversation: &[Item]) -> Vec<CallRecord> {
    let mut results = results_by_call_id(conversation);
    let mut records = Vec::new();
    for (index, item) in conversation.iter().enumerate() {
        let Some(call) = call_of(item) else { continue };
        // The first call of an id is the call; its result is taken with it, so a repeat finds none.
        if records
            .iter()
            .any(|r: &CallRecord| r.call_id == call.call_id)
        {
            continue;
        }
        let result = results.remove(call.call_id);
        let arguments = match call.input {
            CallInput::Arguments(text) | CallInput::Custom(text) => text.to_owned(),
        };
        records.push(CallRecord {
            call_id: call.call_id.to_owned(),
            name: call.name.to_owned(),
            arguments,
            completed: result.is_some(),
            result_at: result.as_ref().map(|r| Position::item(r.index)),
            result: result.map(|r| r.text),
            call_at: Position::item(index),
            shape: Shape::Items,
        });
    }
    records
}

/// The tool calls a response's model made, and the calls it carried over from the batch its previous response
/// handed back, as records, each with the tool step that ran it when the gateway did.
pub fn calls_of_response(steps: &[Step]) -> Vec<(CallRecord, Option<&Step>)> {
    let conversation = crate::context::model_conversation(&[], steps);
    let tool_step = |call_id: &str| {
        steps
            .iter()
            .find(|s| s.tool().is_some_and(|t| t.call.call_id == call_id))
    };
    let mut calls: Vec<(CallRecord, Option<&Step>)> = call_records(&conversation)
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
        let at = Position::item(step.seq as usize);
        let result = tool.outcome.as_ref().map(|o| o.model_text());
        calls.push((
            CallRecord {
                call_id: tool.call.call_id.clone(),
                name: tool.call.name.clone(),
                arguments: tool.call.arguments.clone(),
                completed: result.is_some(),
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
