//! Translation to and from OpenAI's Responses API as an upstream (`POST /responses`), called statelessly
//! (SPEC 8): `store: false`, the whole input every step, `include: ["reasoning.encrypted_content"]`.
//!
//! The conversation goes as items: messages, `function_call` / `function_call_output`, custom tool calls natively,
//! the gateway's own server tool calls (`mcp_call`) as a `function_call` with its `function_call_output`, and
//! reasoning made by a Responses upstream with its `encrypted_content`, placed before the assistant message it
//! came with, under the upstream's own id (which the API requires back). Other item ids are the gateway's, which the
//! upstream never issued: they are left out.

use std::collections::HashSet;

use serde_json::{json, Map, Value};

use crate::chat::{normalise_arguments, scrub_nul, AnswerError, IdSource, ParseError};
use crate::context::ModelInput;
use crate::event_stream::TypedEventStream;
use crate::items::{ContentPart, Item, MessageItem, Role};
use crate::reasoning::{self, Replay};
use crate::steps::{AssistantMessage, Finish, ModelDelta, ModelOutput, ToolCall, Usage};
use crate::toolset::{model_tool_choice, OfferedTool, ToolInput};
use crate::walk::{call_of, results_by_call_id, CallInput, CallResult};

/// Builds the request body for one model call.
pub fn build_request(upstream_model: &str, model_input: &ModelInput<'_>) -> Value {
    let (params, conversation, tools) = (
        model_input.params,
        model_input.conversation,
        model_input.tools,
    );
    let mut body = Map::new();
    body.insert("model".into(), json!(upstream_model));
    body.insert("input".into(), Value::Array(input(conversation)));
    body.insert("store".into(), json!(false));
    body.insert("include".into(), json!([reasoning::INCLUDE_ENCRYPTED]));
    if let Some(instructions) = &params.instructions {
        body.insert("instructions".into(), json!(instructions));
    }
    if !tools.is_empty() {
        body.insert(
            "tools".into(),
            Value::Array(tools.iter().map(tool_json).collect()),
        );
        body.insert(
            "tool_choice".into(),
            model_tool_choice(&params.tool_choice, tools),
        );
        body.insert(
            "parallel_tool_calls".into(),
            json!(params.parallel_tool_calls),
        );
    }
    for (key, value) in [
        ("temperature", params.temperature.map(|t| json!(t))),
        ("top_p", params.top_p.map(|p| json!(p))),
        (
            "max_output_tokens",
            params.max_output_tokens.map(|n| json!(n)),
        ),
        ("reasoning", params.reasoning.clone()),
        // Passed on as the client set them: the Responses API has the same fields.
        (
            "prompt_cache_key",
            params.prompt_cache_key.as_ref().map(|v| json!(v)),
        ),
        (
            "safety_identifier",
            params.safety_identifier.as_ref().map(|v| json!(v)),
        ),
        ("user", params.user.as_ref().map(|v| json!(v))),
        (
            "service_tier",
            params.service_tier.as_ref().map(|v| json!(v)),
        ),
        (
            "top_logprobs",
            params.top_logprobs.filter(|n| *n > 0).map(|n| json!(n)),
        ),
    ] {
        if let Some(value) = value {
            body.insert(key.into(), value);
        }
    }
    if params.text.get("format").is_some() || params.text.get("verbosity").is_some() {
        body.insert("text".into(), params.text.clone());
    }
    Value::Object(body)
}

fn tool_json(tool: &OfferedTool) -> Value {
    let mut out = tool.name_and_description();
    match &tool.input {
        ToolInput::Json { parameters, strict } => {
            out.insert("type".into(), json!("function"));
            out.insert("parameters".into(), parameters.clone());
            if let Some(strict) = strict {
                out.insert("strict".into(), json!(strict));
            }
        }
        ToolInput::Text { format } => {
            out.insert("type".into(), json!("custom"));
            if let Some(format) = format {
                out.insert("format".into(), format.clone());
            }
        }
    }
    Value::Object(out)
}

/// A part of a tool's output as the Responses API takes it: text as `input_text` (a client may send what the
/// model wrote, `output_text` or a `refusal`), images and files as sent.
fn output_part(part: &ContentPart) -> Value {
    match part {
        ContentPart::OutputText { text, .. } | ContentPart::Refusal { refusal: text } => {
            json!({"type": "input_text", "text": text})
        }
        other => json!(other),
    }
}

/// The `input` items of a conversation. Each run of calls is followed by their outputs, in call order, paired by
/// `call_id` (not in the order a client sent them), as every provider gets them.
fn input(conversation: &[Item]) -> Vec<Value> {
    let results = results_by_call_id(conversation);
    let mut items: Vec<Value> = Vec::new();
    let mut sent_calls: HashSet<&str> = HashSet::new();
    let mut pending: Vec<&str> = Vec::new();
    let flush = |items: &mut Vec<Value>, pending: &mut Vec<&str>| {
        for id in pending.drain(..) {
            let result = results.get(id);
            // Content parts (text, images, files) go as the client sent them: a Responses upstream takes them.
            let output = match result {
                Some(CallResult {
                    parts: Some(parts), ..
                }) => Value::Array(parts.iter().map(output_part).collect()),
                result => json!(result.map(|r| r.text.as_str()).unwrap_or_default()),
            };
            let kind = if result.is_some_and(|r| r.custom) {
                "custom_tool_call_output"
            } else {
                "function_call_output"
            };
            items.push(json!({"type": kind, "call_id": id, "output": output}));
        }
    };
    for item in conversation {
        if let Some(call) = call_of(item) {
            if sent_calls.insert(call.call_id) {
                // The gateway's own tool (`mcp_call`) too: the upstream sees a function call and its result.
                items.push(match call.input {
                    CallInput::Arguments(arguments) => {
                        json!({"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": arguments})
                    }
                    CallInput::Custom(input) => {
                        json!({"type": "custom_tool_call", "call_id": call.call_id, "name": call.name, "input": input})
                    }
                });
                pending.push(call.call_id);
            }
            continue;
        }
        match item {
            // Placed after their calls.
            Item::FunctionCallOutput(_) | Item::CustomToolCallOutput(_) => continue,
            Item::Reasoning(r) => {
                let Some((
                    _,
                    Replay::Encrypted {
                        id,
                        encrypted_content,
                    },
                )) = reasoning::replay(r)
                else {
                    continue;
                };
                let mut replayed = json!({"type": "reasoning", "summary": r.summary, "encrypted_content": encrypted_content});
                if let Some(id) = id {
                    replayed["id"] = json!(id);
                }
                // Reasoning comes before the assistant message it was produced with.
                let after_message = pending.is_empty()
                    && items.last().is_some_and(|i| {
                        i["type"] == "message" && i["role"] == json!(Role::Assistant)
                    });
                if after_message {
                    let at = items.len() - 1;
                    items.insert(at, replayed);
                } else {
                    flush(&mut items, &mut pending);
                    items.push(replayed);
                }
            }
            Item::Message(MessageItem { role, content, .. }) => {
                flush(&mut items, &mut pending);
                items.push(json!({"type": "message", "role": role, "content": content}));
            }
            _ => {}
        }
    }
    flush(&mut items, &mut pending);
    items
}

/// Reads a non-streaming Responses answer, as sent, into the normalised model output.
pub fn parse_answer(body: &[u8], ids: &mut dyn IdSource) -> Result<ModelOutput, AnswerError> {
    let body: Value = crate::json::from_bytes(body)?;
    Ok(parse_response(&body, ids)?)
}

/// Reads a whole Responses answer (or the `response` of a stream's last event).
pub fn parse_response(body: &Value, ids: &mut dyn IdSource) -> Result<ModelOutput, ParseError> {
    parse_with_deltas(body, ids, Vec::new())
}

fn parse_with_deltas(
    body: &Value,
    ids: &mut dyn IdSource,
    deltas: Vec<u32>,
) -> Result<ModelOutput, ParseError> {
    if body.get("status").and_then(Value::as_str) == Some("failed") {
        let message = body
            .pointer("/error/message")
            .and_then(Value::as_str)
            .unwrap_or("the upstream response failed");
        return Err(ParseError(format!("upstream response failed: {message}")));
    }
    let output = body
        .get("output")
        .and_then(Value::as_array)
        .ok_or_else(|| ParseError("no 'output' in the answer".into()))?;
    let mut text = String::new();
    let mut refused = false;
    let mut tool_calls = Vec::new();
    let mut reasoning = Vec::new();
    for (index, item) in output.iter().enumerate() {
        let field = |key: &str| item.get(key).and_then(Value::as_str).unwrap_or_default();
        match field("type") {
            "message" => {
                for part in item
                    .get("content")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    match part.get("type").and_then(Value::as_str) {
                        Some("output_text") => text
                            .push_str(part.get("text").and_then(Value::as_str).unwrap_or_default()),
                        Some("refusal") => {
                            refused = true;
                            text.push_str(
                                part.get("refusal")
                                    .and_then(Value::as_str)
                                    .unwrap_or_default(),
                            )
                        }
                        _ => {}
                    }
                }
            }
            kind @ ("function_call" | "custom_tool_call") => {
                if field("name").is_empty() {
                    return Err(ParseError(format!("output item {index} has no name")));
                }
                let call_id = match field("call_id") {
                    "" => ids.call_id(tool_calls.len()),
                    id => id.to_owned(),
                };
                let arguments = if kind == "custom_tool_call" {
                    field("input").to_owned()
                } else {
                    normalise_arguments(item.get("arguments"))
                };
                tool_calls.push(ToolCall::function(
                    ids.item_id("fc"),
                    call_id,
                    field("name"),
                    arguments,
                ));
            }
            "reasoning" => reasoning.push(reasoning::from_responses(
                ids.item_id("rs"),
                field("id"),
                item.get("summary")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default(),
                item.get("encrypted_content").and_then(Value::as_str),
            )),
            _ => {}
        }
    }
    let incomplete = body
        .pointer("/incomplete_details/reason")
        .and_then(Value::as_str);
    let finish = match incomplete {
        Some("max_output_tokens") => Finish::Length,
        Some("content_filter") => Finish::ContentFilter,
        _ if refused => Finish::ContentFilter,
        _ if !tool_calls.is_empty() => Finish::ToolCalls,
        _ => Finish::Stop,
    };
    let text = scrub_nul(text);
    Ok(ModelOutput {
        message: (!text.is_empty()).then(|| AssistantMessage {
            item_id: ids.item_id("msg"),
            text,
            deltas,
        }),
        tool_calls,
        usage: body.get("usage").and_then(parse_usage),
        finish,
        reasoning,
    })
}

/// Reads Responses usage.
pub fn parse_usage(usage: &Value) -> Option<Usage> {
    crate::chat::openai_usage(usage, "input_tokens", "output_tokens")
}

/// The state of one streamed Responses answer: text is passed on as it comes, the answer is read from the
/// terminal event's `response` (or, when that carries no output, from the items each `output_item.done` gave).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ResponsesStream {
    items: Vec<Value>,
    terminal: Option<Value>,
}

impl ResponsesStream {
    pub fn new() -> ResponsesStream {
        ResponsesStream::default()
    }
}

impl TypedEventStream for ResponsesStream {
    const CUT_SHORT: &'static str = "the body ended before the response did";
    /// Some Responses-compatible servers end the body with a Chat Completions style `[DONE]`.
    const NOT_AN_EVENT: Option<&'static str> = Some("[DONE]");

    /// Reads one event. An `error` or `response.failed` event is an error: the upstream gave up mid-answer.
    fn push(&mut self, event: &Value) -> Result<Vec<ModelDelta>, ParseError> {
        match event.get("type").and_then(Value::as_str) {
            Some("response.output_text.delta") => {
                let delta = event
                    .get("delta")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                if !delta.is_empty() {
                    return Ok(vec![ModelDelta::Text(delta.to_owned())]);
                }
            }
            Some("response.output_item.done") => {
                if let Some(item) = event.get("item") {
                    self.items.push(item.clone());
                }
            }
            Some("response.completed" | "response.incomplete") => {
                self.terminal = event.get("response").cloned();
            }
            Some("error" | "response.failed") => {
                let message = event
                    .get("message")
                    .or_else(|| event.pointer("/response/error/message"))
                    .or_else(|| event.pointer("/error/message"))
                    .and_then(Value::as_str)
                    .unwrap_or("upstream error in stream");
                return Err(ParseError(format!("error in stream: {message}")));
            }
            _ => {}
        }
        Ok(Vec::new())
    }

    /// Whether the terminal event came.
    fn is_complete(&self) -> bool {
        self.terminal.is_some()
    }

    /// The normalised output once the stream has ended.
    fn finish(self, ids: &mut dyn IdSource) -> Result<ModelOutput, ParseError> {
        let mut response = self.terminal.unwrap_or_else(|| json!({}));
        let empty = response
            .get("output")
            .and_then(Value::as_array)
            .is_none_or(Vec::is_empty);
        if empty {
            response["output"] = Value::Array(self.items);
        }
        parse_with_deltas(&response, ids, Vec::new())
    }
}

#[cfg(test)]
mod tests;
