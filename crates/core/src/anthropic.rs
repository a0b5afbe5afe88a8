//! Translation to and from Anthropic's Messages API (`POST /v1/messages`), whole answers and streamed events.
//!
//! Requests: instructions and system/developer messages become `system`; calls become `tool_use` blocks in the
//! assistant turn (several per turn), their results `tool_result` blocks at the start of the next user turn
//! (`is_error` when the result is a tool failure, `{"error": ...}`); consecutive turns of one role are merged, as the
//! API wants roles to alternate. Thinking that an Anthropic model produced earlier is replayed first in its
//! assistant turn, unchanged ([`crate::reasoning`]).

use std::collections::{HashMap, HashSet};

use serde_json::{json, Map, Value};

use crate::chat::{normalise_arguments, scrub_nul, AnswerError, IdSource, ParseError};
use crate::context::ModelInput;
use crate::event_stream::TypedEventStream;
use crate::items::{ContentPart, Item, MessageContent, Role};
use crate::reasoning::{self, Replay};
use crate::steps::{AssistantMessage, Finish, ModelDelta, ModelOutput, ToolCall, Usage};
use crate::toolset::{model_tool_choice, OfferedTool, ToolInput};
use crate::walk::{call_of, results_by_call_id};

/// The `anthropic-version` header the adapter speaks.
pub const API_VERSION: &str = "2023-06-01";

/// Builds the Messages request body. `max_tokens` is the request's `max_output_tokens`, else `default_max_tokens`
/// (the API requires it).
pub fn build_request(
    upstream_model: &str,
    default_max_tokens: u32,
    input: &ModelInput<'_>,
) -> Value {
    let (params, conversation, tools) = (input.params, input.conversation, input.tools);
    let mut body = Map::new();
    body.insert("model".into(), json!(upstream_model));
    let max_tokens = params.max_output_tokens.unwrap_or(default_max_tokens);
    let thinking = thinking_budget(params.reasoning.as_ref());
    // Thinking counts against `max_tokens`: it is raised by the budget, so the answer keeps the room asked for.
    body.insert(
        "max_tokens".into(),
        json!(max_tokens.saturating_add(thinking.unwrap_or(0))),
    );
    if let Some(budget) = thinking {
        body.insert(
            "thinking".into(),
            json!({"type": "enabled", "budget_tokens": budget}),
        );
    }
    let (system, mut messages) = messages(params.instructions.as_deref(), conversation);
    if !system.is_empty() {
        // As a block, to carry the system prompt's own cache breakpoint.
        body.insert(
            "system".into(),
            json!([{"type": "text", "text": system, "cache_control": {"type": "ephemeral"}}]),
        );
    }
    mark_cache_breakpoint(
        messages
            .last_mut()
            .and_then(|m| m["content"].as_array_mut()),
    );
    body.insert("messages".into(), Value::Array(messages));
    // Structured output: the format is a tool the model must call, whose input becomes the answer's text.
    let structured = structured_output_tool(params, tools, thinking.is_some());
    if !tools.is_empty() || structured.is_some() {
        let mut declared: Vec<Value> = tools.iter().map(anthropic_tool).collect();
        declared.extend(structured.clone());
        mark_cache_breakpoint(Some(&mut declared));
        body.insert("tools".into(), Value::Array(declared));
        let mut choice = match structured {
            // With tools of its own to call first, the model must call some tool; else the format's.
            Some(_) if !tools.is_empty() && params.tool_choice != json!("none") => {
                tool_choice(&json!("required"), params.parallel_tool_calls)
            }
            Some(_) => tool_choice(
                &json!({"type": "function", "name": STRUCTURED_OUTPUT_TOOL}),
                params.parallel_tool_calls,
            ),
            None => tool_choice(
                &model_tool_choice(&params.tool_choice, tools),
                params.parallel_tool_calls,
            ),
        };
        // With thinking on, Anthropic refuses a forced tool: the model chooses (listed as ignored).
        if thinking.is_some() && matches!(choice["type"].as_str(), Some("any" | "tool")) {
            choice["type"] = json!("auto");
            if let Some(map) = choice.as_object_mut() {
                map.remove("name");
            }
        }
        body.insert("tool_choice".into(), choice);
    }
    // Thinking takes neither a temperature nor a `top_p` of the client's (listed as ignored).
    if thinking.is_none() {
        if let Some(t) = params.temperature {
            body.insert("temperature".into(), json!(t));
        }
        if let Some(p) = params.top_p {
            body.insert("top_p".into(), json!(p));
        }
    }
    // Anthropic's one per-user field: an opaque id of the end user, for abuse detection.
    if let Some(user) = params.safety_identifier.as_ref().or(params.user.as_ref()) {
        body.insert("metadata".into(), json!({"user_id": user}));
    }
    Value::Object(body)
}

/// The tool a `text.format` of `json_schema` or `json_object` becomes: the model answers by calling it, and its
/// input is the answer's text (whole and streamed). Not with thinking on (Anthropic refuses a forced tool then:
/// the format is listed as ignored), nor when the client offers a tool of that name.
pub const STRUCTURED_OUTPUT_TOOL: &str = "emit_structured_output";

/// The structured-output tool of `params`, if its `text.format` asks for JSON and it can be honoured.
pub fn structured_output_tool(
    params: &crate::request::ResponseParams,
    tools: &[OfferedTool],
    thinking: bool,
) -> Option<Value> {
    let format = params.text.get("format")?;
    let schema = match format.get("type").and_then(Value::as_str)? {
        "json_schema" => format
            .get("schema")
            .cloned()
            .unwrap_or_else(|| json!({"type": "object"})),
        "json_object" => json!({"type": "object"}),
        _ => return None,
    };
    if thinking || tools.iter().any(|t| t.name == STRUCTURED_OUTPUT_TOOL) {
        return None;
    }
    let described = format
        .get("description")
        .and_then(Value::as_str)
        .map(|d| format!(" {d}"))
        .unwrap_or_default();
    Some(json!({
        "name": STRUCTURED_OUTPUT_TOOL,
        "description": format!("Give your final answer by calling this tool: its input is the answer.{described}"),
        "input_schema": schema,
    }))
}

/// Prompt caching (`docs/behaviour.md`, "Providers"): a breakpoint on the last tool, on the system prompt and on
/// the last block of the newest message, so that each model call of a loop reads what the call before it wrote
/// (Anthropic finds the earlier breakpoint's prefix among the blocks before a new one) and writes its own prefix
/// for the next, and a conversation rewritten before its newest message still reads the tools and system prompt.
/// Three of the four breakpoints Anthropic allows; a prompt under the model's minimum is not cached and costs
/// nothing more.
fn mark_cache_breakpoint(blocks: Option<&mut Vec<Value>>) {
    let last = blocks.and_then(|blocks| {
        blocks
            .iter_mut()
            .rev()
            .find(|b| !matches!(b["type"].as_str(), Some("thinking" | "redacted_thinking")))
    });
    if let Some(Value::Object(block)) = last {
        block.insert("cache_control".into(), json!({"type": "ephemeral"}));
    }
}

/// The extended-thinking budget of a `reasoning.effort` (`docs/behaviour.md`, "Providers"): `minimal` and `low`
/// 1,024 tokens (Anthropic's least), `medium` 4,096, `high` 16,384, `xhigh` 32,768; none for `none` or no effort.
pub fn thinking_budget(reasoning: Option<&Value>) -> Option<u32> {
    match reasoning?.get("effort")?.as_str()? {
        "minimal" | "low" => Some(1_024),
        "medium" => Some(4_096),
        "high" => Some(16_384),
        "xhigh" => Some(32_768),
        _ => None,
    }
}

fn anthropic_tool(tool: &OfferedTool) -> Value {
    let tool = tool.as_function();
    let mut out = tool.name_and_description();
    let schema = match &tool.input {
        ToolInput::Json { parameters, .. } => parameters.clone(),
        ToolInput::Text { .. } => json!({"type": "object"}),
    };
    out.insert("input_schema".into(), schema);
    Value::Object(out)
}

/// `tool_choice` in Anthropic's shape; `parallel_tool_calls: false` is `disable_parallel_tool_use`.
fn tool_choice(choice: &Value, parallel: bool) -> Value {
    let mut out = match choice {
        Value::String(mode) if mode == "required" => json!({"type": "any"}),
        Value::String(mode) if mode == "none" => json!({"type": "none"}),
        Value::Object(map) => match map.get("type").and_then(Value::as_str) {
            Some("function" | "custom") => {
                json!({"type": "tool", "name": map.get("name").cloned().unwrap_or(Value::Null)})
            }
            Some("allowed_tools") => match map.get("mode").and_then(Value::as_str) {
                Some("required") => json!({"type": "any"}),
                _ => json!({"type": "auto"}),
            },
            _ => json!({"type": "auto"}),
        },
        _ => json!({"type": "auto"}),
    };
    if !parallel && out["type"] != "none" {
        out["disable_parallel_tool_use"] = json!(true);
    }
    out
}

/// Turns under construction: consecutive blocks of one role end up in one message.
struct Turns {
    messages: Vec<(Role, Vec<Value>)>,
}

impl Turns {
    fn push(&mut self, role: Role, block: Value) {
        match self.messages.last_mut() {
            Some((last, blocks)) if *last == role => blocks.push(block),
            _ => self.messages.push((role, vec![block])),
        }
    }

    /// Thinking goes first in its assistant turn, as the API requires.
    fn push_thinking(&mut self, block: Value) {
        match self.messages.last_mut() {
            Some((Role::Assistant, blocks)) => {
                let at = blocks
                    .iter()
                    .position(|b| {
                        !matches!(b["type"].as_str(), Some("thinking" | "redacted_thinking"))
                    })
                    .unwrap_or(blocks.len());
                blocks.insert(at, block);
            }
            _ => self.messages.push((Role::Assistant, vec![block])),
        }
    }
}

/// The `system` text and the messages of a conversation.
fn messages(instructions: Option<&str>, conversation: &[Item]) -> (String, Vec<Value>) {
    let results = results_by_call_id(conversation);
    let mut system: Vec<String> = instructions.map(str::to_owned).into_iter().collect();
    let mut turns = Turns {
        messages: Vec::new(),
    };
    let mut emitted: HashSet<&str> = HashSet::new();
    // Results wait for the end of the run of calls they answer: they open the next user turn.
    let mut pending_results: Vec<&str> = Vec::new();
    let flush = |turns: &mut Turns, pending: &mut Vec<&str>| {
        for id in pending.drain(..) {
            let result = results.get(id);
            // Images and PDFs a client's output holds go as blocks of the result, which Messages takes; an output
            // of text alone goes as its text.
            let blocks = result
                .and_then(|r| r.parts)
                .filter(|parts| parts.iter().any(ContentPart::is_media))
                .map(|parts| content_blocks_of(parts, Role::User))
                .filter(|blocks| !blocks.is_empty());
            let content = match blocks {
                Some(blocks) => json!(blocks),
                None => json!(result.map(|r| r.text.as_str()).unwrap_or_default()),
            };
            let mut block = json!({"type": "tool_result", "tool_use_id": id, "content": content});
            if result.is_some_and(|r| r.failed) {
                block["is_error"] = json!(true);
            }
            turns.push(Role::User, block);
        }
    };
    for item in conversation {
        if let Some(call) = call_of(item) {
            if emitted.insert(call.call_id) {
                turns.push(
                    Role::Assistant,
                    json!({"type": "tool_use", "id": call.call_id, "name": call.name, "input": input_object(&call.function_arguments())}),
                );
                pending_results.push(call.call_id);
            }
            continue;
        }
        if let Item::Reasoning(r) = item {
            // Thinking belongs to the assistant turn of the calls it preceded.
            match reasoning::replay(r) {
                Some((
                    _,
                    Replay::Thinking {
                        thinking,
                        signature,
                    },
                )) => turns.push_thinking(
                    json!({"type": "thinking", "thinking": thinking, "signature": signature}),
                ),
                Some((_, Replay::RedactedThinking { data })) => {
                    turns.push_thinking(json!({"type": "redacted_thinking", "data": data}))
                }
                _ => {}
            }
            continue;
        }
        flush(&mut turns, &mut pending_results);
        // Outputs were placed after their calls; messages go as they are.
        if let Item::Message(message) = item {
            match message.role {
                Role::System | Role::Developer => system.push(content_text(&message.content)),
                role => {
                    for block in content_blocks(&message.content, role) {
                        turns.push(role, block);
                    }
                }
            }
        }
    }
    flush(&mut turns, &mut pending_results);
    let messages = turns
        .messages
        .into_iter()
        .map(|(role, content)| {
            let role = if role == Role::Assistant {
                "assistant"
            } else {
                "user"
            };
            json!({"role": role, "content": content})
        })
        .collect();
    (system.join("\n\n"), messages)
}

/// A string field of a block, empty when absent.
fn string_field(block: &Value, key: &str) -> String {
    block
        .get(key)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned()
}

/// Tool-call arguments as the `input` object Anthropic wants; arguments that are not an object are wrapped.
fn input_object(arguments: &str) -> Value {
    match serde_json::from_str::<Value>(arguments) {
        Ok(value @ Value::Object(_)) => value,
        Ok(other) => json!({"input": other}),
        Err(_) => json!({"input": arguments}),
    }
}

fn content_text(content: &MessageContent) -> String {
    match content {
        MessageContent::Text(text) => text.clone(),
        MessageContent::Parts(parts) => crate::items::parts_text(parts),
    }
}

fn content_blocks(content: &MessageContent, role: Role) -> Vec<Value> {
    match content {
        MessageContent::Text(text) if text.is_empty() => Vec::new(),
        MessageContent::Text(text) => vec![json!({"type": "text", "text": text})],
        MessageContent::Parts(parts) => content_blocks_of(parts, role),
    }
}

/// Content parts as Messages blocks: text, images, PDFs (by data or URL); what Messages does not take is left out
/// (and listed as ignored: `preparation::ignored_content`).
fn content_blocks_of(parts: &[ContentPart], role: Role) -> Vec<Value> {
    let text_block = |text: &str| json!({"type": "text", "text": text});
    parts
            .iter()
            .filter_map(|part| match part {
                ContentPart::InputText { text } | ContentPart::OutputText { text, .. } => {
                    (!text.is_empty()).then(|| text_block(text))
                }
                ContentPart::Refusal { refusal } => Some(text_block(refusal)),
                ContentPart::InputImage {
                    image_url: Some(url),
                    ..
                } if role == Role::User => Some(image_block(url)),
                ContentPart::InputFile {
                    file_data: Some(data),
                    ..
                } if role == Role::User => pdf_data(data).map(|data| {
                    json!({"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": data}})
                }),
                ContentPart::InputFile {
                    file_url: Some(url),
                    file_data: None,
                    ..
                } if role == Role::User => {
                    Some(json!({"type": "document", "source": {"type": "url", "url": url}}))
                }
                // Anything else the response lists as ignored (`preparation::ignored_content`).
                ContentPart::InputImage { .. } | ContentPart::InputFile { .. } => None,
            })
            .collect()
}

/// The base64 data of a PDF sent as a `data:application/pdf;base64,` URL: the one kind of file data a Messages
/// `document` block takes as it is.
pub fn pdf_data(file_data: &str) -> Option<&str> {
    file_data.strip_prefix("data:application/pdf;base64,")
}

/// An image block: a `data:` URL as base64 source, any other URL as a URL source.
fn image_block(url: &str) -> Value {
    if let Some(rest) = url.strip_prefix("data:") {
        if let Some((media_type, data)) = rest.split_once(";base64,") {
            return json!({"type": "image", "source": {"type": "base64", "media_type": media_type, "data": data}});
        }
    }
    json!({"type": "image", "source": {"type": "url", "url": url}})
}

/// Reads a non-streaming Messages answer, as sent, into the normalised model output.
pub fn parse_answer(body: &[u8], ids: &mut dyn IdSource) -> Result<ModelOutput, AnswerError> {
    let body: Value = crate::json::from_bytes(body)?;
    Ok(parse_response(&body, ids)?)
}

/// Reads a whole Messages answer.
pub fn parse_response(body: &Value, ids: &mut dyn IdSource) -> Result<ModelOutput, ParseError> {
    let content = body
        .get("content")
        .and_then(Value::as_array)
        .ok_or_else(|| ParseError("no 'content' in the answer".into()))?;
    let mut answer = Answer::default();
    for block in content {
        answer.block(block);
    }
    answer.stop_reason = body
        .get("stop_reason")
        .and_then(Value::as_str)
        .map(str::to_owned);
    answer.usage = body.get("usage").cloned();
    answer.finish(ids, None)
}

/// The blocks of an answer, whole or accumulated from a stream.
#[derive(Debug, Clone, Default, PartialEq)]
struct Answer {
    text: String,
    calls: Vec<(String, String, String)>,
    /// `(thinking, signature)`, or `(None, data)` for a redacted block.
    thinking: Vec<(Option<String>, String)>,
    stop_reason: Option<String>,
    usage: Option<Value>,
}

impl Answer {
    fn block(&mut self, block: &Value) {
        let text = |key: &str| string_field(block, key);
        match block.get("type").and_then(Value::as_str) {
            Some("text") => self.text.push_str(&text("text")),
            Some("tool_use") if text("name") == STRUCTURED_OUTPUT_TOOL => {
                // The answer is the format's JSON alone, whatever text came before the call.
                self.text = normalise_arguments(block.get("input"));
            }
            Some("tool_use") => {
                let input = block.get("input");
                self.calls
                    .push((text("id"), text("name"), normalise_arguments(input)));
            }
            Some("thinking") => self
                .thinking
                .push((Some(text("thinking")), text("signature"))),
            Some("redacted_thinking") => self.thinking.push((None, text("data"))),
            _ => {}
        }
    }

    fn finish(
        self,
        ids: &mut dyn IdSource,
        message_deltas: Option<Vec<u32>>,
    ) -> Result<ModelOutput, ParseError> {
        let reasoning = self
            .thinking
            .into_iter()
            .map(|(thinking, token)| match thinking {
                Some(thinking) => reasoning::from_thinking(ids.item_id("rs"), &thinking, &token),
                None => reasoning::from_redacted_thinking(ids.item_id("rs"), &token),
            })
            .collect();
        let mut tool_calls = Vec::with_capacity(self.calls.len());
        for (index, (id, name, arguments)) in self.calls.into_iter().enumerate() {
            if name.is_empty() {
                return Err(ParseError(format!("tool_use block {index} has no name")));
            }
            let call_id = if id.is_empty() {
                ids.call_id(index)
            } else {
                id
            };
            tool_calls.push(ToolCall::function(
                ids.item_id("fc"),
                call_id,
                name,
                arguments,
            ));
        }
        let finish = match self.stop_reason.as_deref() {
            Some("max_tokens") => Finish::Length,
            Some("refusal") => Finish::ContentFilter,
            _ if !tool_calls.is_empty() => Finish::ToolCalls,
            _ => Finish::Stop,
        };
        let text = scrub_nul(self.text);
        Ok(ModelOutput {
            message: (!text.is_empty()).then(|| AssistantMessage {
                item_id: ids.item_id("msg"),
                text,
                deltas: message_deltas.unwrap_or_default(),
            }),
            tool_calls,
            usage: self.usage.as_ref().and_then(parse_usage),
            finish,
            reasoning,
        })
    }
}

/// Reads Anthropic usage: input counts every input token, cached or not; `cached_tokens` is what was read from
/// the cache.
pub fn parse_usage(usage: &Value) -> Option<Usage> {
    let usage = usage.as_object()?;
    let number = |key: &str| usage.get(key).and_then(Value::as_u64).unwrap_or(0);
    Some(Usage {
        input_tokens: number("input_tokens")
            + number("cache_creation_input_tokens")
            + number("cache_read_input_tokens"),
        output_tokens: number("output_tokens"),
        cached_tokens: number("cache_read_input_tokens"),
        reasoning_tokens: 0,
    })
}

/// A content block being streamed.
#[derive(Debug, Clone, PartialEq)]
enum OpenBlock {
    Text,
    ToolUse {
        id: String,
        name: String,
        json: String,
    },
    Thinking {
        thinking: String,
        signature: String,
    },
    Redacted {
        data: String,
    },
    Other,
}

/// The state of one streamed Messages answer, event by event.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AnthropicStream {
    answer: Answer,
    open: HashMap<u64, OpenBlock>,
    /// Blocks in the order they ended, so that calls keep their order.
    usage: Map<String, Value>,
    stopped: bool,
}

impl AnthropicStream {
    pub fn new() -> AnthropicStream {
        AnthropicStream::default()
    }

    fn close(&mut self, block: OpenBlock) {
        match block {
            OpenBlock::ToolUse { id, name, json } => {
                let arguments = normalise_arguments(Some(&Value::String(json)));
                self.answer.calls.push((id, name, arguments));
            }
            OpenBlock::Thinking {
                thinking,
                signature,
            } => self.answer.thinking.push((Some(thinking), signature)),
            OpenBlock::Redacted { data } => self.answer.thinking.push((None, data)),
            OpenBlock::Text | OpenBlock::Other => {}
        }
    }
}

impl TypedEventStream for AnthropicStream {
    const CUT_SHORT: &'static str = "the body ended before message_stop";
    const NOT_AN_EVENT: Option<&'static str> = None;

    /// Reads one event (its `data`; the type is read from the data, which always carries it). An `error` event is
    /// an error: the upstream gave up mid-answer.
    fn push(&mut self, event: &Value) -> Result<Vec<ModelDelta>, ParseError> {
        let mut deltas = Vec::new();
        let index = event.get("index").and_then(Value::as_u64).unwrap_or(0);
        match event.get("type").and_then(Value::as_str) {
            Some("message_start") => {
                if let Some(usage) = event
                    .get("message")
                    .and_then(|m| m.get("usage"))
                    .and_then(Value::as_object)
                {
                    self.usage.extend(usage.clone());
                }
            }
            Some("content_block_start") => {
                let block = event.get("content_block").unwrap_or(&Value::Null);
                let text = |key: &str| string_field(block, key);
                let open = match block.get("type").and_then(Value::as_str) {
                    Some("text") => {
                        let initial = text("text");
                        if !initial.is_empty() {
                            self.answer.text.push_str(&initial);
                            deltas.push(ModelDelta::Text(initial));
                        }
                        OpenBlock::Text
                    }
                    Some("tool_use") if text("name") == STRUCTURED_OUTPUT_TOOL => {
                        // The answer, as the structured-output tool's input: streamed as text.
                        if let Some(Value::Object(o)) = block.get("input") {
                            if !o.is_empty() {
                                let whole = Value::Object(o.clone()).to_string();
                                self.answer.text.push_str(&whole);
                                deltas.push(ModelDelta::Text(whole));
                            }
                        }
                        OpenBlock::Text
                    }
                    Some("tool_use") => {
                        // Some servers send the whole input here instead of in deltas.
                        let json = match block.get("input") {
                            Some(Value::Object(o)) if !o.is_empty() => {
                                Value::Object(o.clone()).to_string()
                            }
                            _ => String::new(),
                        };
                        OpenBlock::ToolUse {
                            id: text("id"),
                            name: text("name"),
                            json,
                        }
                    }
                    Some("thinking") => OpenBlock::Thinking {
                        thinking: text("thinking"),
                        signature: text("signature"),
                    },
                    Some("redacted_thinking") => OpenBlock::Redacted { data: text("data") },
                    _ => OpenBlock::Other,
                };
                self.open.insert(index, open);
            }
            Some("content_block_delta") => {
                let delta = event.get("delta").unwrap_or(&Value::Null);
                let text = |key: &str| delta.get(key).and_then(Value::as_str).unwrap_or_default();
                match (
                    delta.get("type").and_then(Value::as_str),
                    self.open.get_mut(&index),
                ) {
                    (Some("text_delta"), _) => {
                        let piece = text("text");
                        if !piece.is_empty() {
                            self.answer.text.push_str(piece);
                            deltas.push(ModelDelta::Text(piece.to_owned()));
                        }
                    }
                    (Some("input_json_delta"), Some(OpenBlock::ToolUse { json, .. })) => {
                        json.push_str(text("partial_json"))
                    }
                    (Some("input_json_delta"), Some(OpenBlock::Text)) => {
                        let piece = text("partial_json");
                        if !piece.is_empty() {
                            self.answer.text.push_str(piece);
                            deltas.push(ModelDelta::Text(piece.to_owned()));
                        }
                    }
                    (Some("thinking_delta"), Some(OpenBlock::Thinking { thinking, .. })) => {
                        thinking.push_str(text("thinking"))
                    }
                    (Some("signature_delta"), Some(OpenBlock::Thinking { signature, .. })) => {
                        signature.push_str(text("signature"))
                    }
                    _ => {}
                }
            }
            Some("content_block_stop") => {
                if let Some(block) = self.open.remove(&index) {
                    self.close(block);
                }
            }
            Some("message_delta") => {
                if let Some(reason) = event
                    .get("delta")
                    .and_then(|d| d.get("stop_reason"))
                    .and_then(Value::as_str)
                {
                    self.answer.stop_reason = Some(reason.to_owned());
                }
                if let Some(usage) = event.get("usage").and_then(Value::as_object) {
                    self.usage.extend(usage.clone());
                }
            }
            Some("message_stop") => self.stopped = true,
            Some("error") => {
                let message = event
                    .get("error")
                    .and_then(|e| e.get("message"))
                    .and_then(Value::as_str)
                    .unwrap_or("upstream error in stream");
                return Err(ParseError(format!("error in stream: {message}")));
            }
            // `ping` and events this adapter does not know are skipped.
            _ => {}
        }
        Ok(deltas)
    }

    /// Whether `message_stop` came: a complete answer ends with it, a cut one does not.
    fn is_complete(&self) -> bool {
        self.stopped
    }

    /// The normalised output once the stream has ended.
    fn finish(mut self, ids: &mut dyn IdSource) -> Result<ModelOutput, ParseError> {
        let mut left: Vec<(u64, OpenBlock)> = self.open.drain().collect();
        left.sort_by_key(|(index, _)| *index);
        for (_, block) in left {
            self.close(block);
        }
        if !self.usage.is_empty() {
            self.answer.usage = Some(Value::Object(self.usage));
        }
        self.answer.finish(ids, None)
    }
}

#[cfg(test)]
mod tests;
