//! Translation to and from OpenAI-compatible Chat Completions, normalising what real servers send.

use std::collections::HashSet;

use serde::ser::{SerializeMap, SerializeSeq};
use serde::{Deserialize, Serialize, Serializer};
use serde_json::{json, Map, Value};

use crate::context::ModelInput;
use crate::items::{parts_text, ContentPart, Item, MessageContent, Role};
use crate::steps::{AssistantMessage, Finish, ModelOutput, ToolCall, Usage};
use crate::toolset::{model_tool_choice, OfferedTool, ToolInput};
use crate::walk::{call_of, results_by_call_id, Call};

mod answer;

/// Builds the Chat Completions request body for one model call, as a JSON value.
pub fn build_request(upstream_model: &str, input: &ModelInput<'_>) -> Value {
    build_chat_request(upstream_model, input).into_value()
}

/// A Chat Completions request body as it is sent: its fields, and the offered tools, written out in Chat's shape
/// as the body is serialised (a model call does not copy every tool's schema into a JSON tree, then drop it).
#[derive(Debug)]
pub struct ChatRequest<'a> {
    /// Every field but `tools`.
    pub fields: Map<String, Value>,
    tools: &'a [OfferedTool],
}

impl ChatRequest<'_> {
    /// The whole body as a JSON value, `tools` included.
    pub fn into_value(self) -> Value {
        let mut fields = self.fields;
        if !self.tools.is_empty() {
            // Only string keys are written, so it cannot fail.
            let tools = serde_json::to_value(ChatTools(self.tools)).unwrap_or_default();
            fields.insert("tools".into(), tools);
        }
        Value::Object(fields)
    }
}

impl Serialize for ChatRequest<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let has_tools = !self.tools.is_empty();
        let mut map = serializer.serialize_map(Some(self.fields.len() + usize::from(has_tools)))?;
        for (key, value) in &self.fields {
            map.serialize_entry(key, value)?;
        }
        if has_tools {
            map.serialize_entry("tools", &ChatTools(self.tools))?;
        }
        map.end()
    }
}

/// The offered tools as Chat's `tools`: each a `function` (a free-form tool as a function of one string).
struct ChatTools<'a>(&'a [OfferedTool]);

impl Serialize for ChatTools<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut tools = serializer.serialize_seq(Some(self.0.len()))?;
        for tool in self.0 {
            tools.serialize_element(&ChatTool(&tool.as_function()))?;
        }
        tools.end()
    }
}

/// One tool as Chat's `{"type": "function", "function": {name, description, parameters, strict}}`.
struct ChatTool<'a>(&'a OfferedTool);

impl Serialize for ChatTool<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut tool = serializer.serialize_map(Some(2))?;
        tool.serialize_entry("type", "function")?;
        tool.serialize_entry("function", &FunctionDeclaration(self.0))?;
        tool.end()
    }
}

/// A function tool's declaration: its name, its description unless empty, its schema and `strict` when set.
struct FunctionDeclaration<'a>(&'a OfferedTool);

impl Serialize for FunctionDeclaration<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let tool = self.0;
        let mut function = serializer.serialize_map(None)?;
        function.serialize_entry("name", &tool.name)?;
        if let Some(description) = tool.description.as_deref().filter(|d| !d.is_empty()) {
            function.serialize_entry("description", description)?;
        }
        if let ToolInput::Json { parameters, strict } = &tool.input {
            function.serialize_entry("parameters", parameters)?;
            if let Some(strict) = strict {
                function.serialize_entry("strict", strict)?;
            }
        }
        function.end()
    }
}

/// Builds the Chat Completions request body for one model call, its tools borrowed from `input`.
pub fn build_chat_request<'a>(upstream_model: &str, input: &ModelInput<'a>) -> ChatRequest<'a> {
    let (params, conversation, tools) = (input.params, input.conversation, input.tools);
    let mut body = Map::new();
    body.insert("model".into(), json!(upstream_model));
    body.insert(
        "messages".into(),
        Value::Array(messages(params.instructions.as_deref(), conversation)),
    );
    if !tools.is_empty() {
        body.insert(
            "tool_choice".into(),
            chat_tool_choice(&model_tool_choice(&params.tool_choice, tools)),
        );
        body.insert(
            "parallel_tool_calls".into(),
            json!(params.parallel_tool_calls),
        );
    }
    if let Some(t) = params.temperature {
        body.insert("temperature".into(), json!(t));
    }
    if let Some(p) = params.top_p {
        body.insert("top_p".into(), json!(p));
    }
    if let Some(n) = params.max_output_tokens {
        body.insert("max_tokens".into(), json!(n));
    }
    if let Some(effort) = params
        .reasoning
        .as_ref()
        .and_then(|r| r.get("effort"))
        .filter(|e| e.is_string())
    {
        body.insert("reasoning_effort".into(), effort.clone());
    }
    // Passed on as the client set them: Chat Completions has the same fields.
    for (key, value) in [
        ("prompt_cache_key", &params.prompt_cache_key),
        ("safety_identifier", &params.safety_identifier),
        ("user", &params.user),
        ("service_tier", &params.service_tier),
    ] {
        if let Some(value) = value {
            body.insert(key.into(), json!(value));
        }
    }
    if let Some(verbosity) = params.text.get("verbosity").filter(|v| v.is_string()) {
        body.insert("verbosity".into(), verbosity.clone());
    }
    for (key, value) in [
        ("presence_penalty", params.presence_penalty),
        ("frequency_penalty", params.frequency_penalty),
    ] {
        if let Some(value) = value {
            body.insert(key.into(), json!(value));
        }
    }
    if let Some(n) = params.top_logprobs.filter(|n| *n > 0) {
        body.insert("logprobs".into(), json!(true));
        body.insert("top_logprobs".into(), json!(n));
    }
    if let Some(format) = params.text.get("format") {
        match format.get("type").and_then(Value::as_str) {
            Some("json_object") => {
                body.insert("response_format".into(), json!({"type": "json_object"}));
            }
            Some("json_schema") => {
                let mut schema = Map::new();
                for key in ["name", "schema", "description", "strict"] {
                    if let Some(v) = format.get(key) {
                        schema.insert(key.into(), v.clone());
                    }
                }
                body.insert(
                    "response_format".into(),
                    json!({"type": "json_schema", "json_schema": schema}),
                );
            }
            _ => {}
        }
    }
    ChatRequest {
        fields: body,
        tools,
    }
}

/// `tool_choice` in Chat's shape, from the choice as the model sees it ([`model_tool_choice`]).
fn chat_tool_choice(choice: &Value) -> Value {
    match choice {
        Value::Object(map) => match map.get("type").and_then(Value::as_str) {
            Some("function" | "custom") => {
                json!({"type": "function", "function": {"name": map.get("name").cloned().unwrap_or(Value::Null)}})
            }
            // Chat Completions has no allowed_tools; its mode is the closest faithful choice.
            Some("allowed_tools") => map.get("mode").cloned().unwrap_or_else(|| json!("auto")),
            _ => json!("auto"),
        },
        other => other.clone(),
    }
}

/// The chat messages for a conversation. Consecutive tool calls (with any assistant text just before them)
/// become one assistant message, immediately followed by one `tool` message per call, paired by `call_id`.
fn messages(instructions: Option<&str>, conversation: &[Item]) -> Vec<Value> {
    let results = results_by_call_id(conversation);
    let mut messages = Vec::new();
    if let Some(instructions) = instructions {
        messages.push(json!({"role": "system", "content": instructions}));
    }
    let mut emitted_calls: HashSet<&str> = HashSet::new();
    let mut index = 0;
    while index < conversation.len() {
        match &conversation[index] {
            Item::Message(message) => {
                let role = match message.role {
                    Role::User => "user",
                    Role::Assistant => "assistant",
                    Role::System | Role::Developer => "system",
                };
                let content = chat_content(&message.content, message.role);
                // A message whose every part Chat cannot take (a file by URL alone) is left out, as its parts are
                // (and listed as ignored): an empty content list is refused by Chat servers.
                if content.as_array().is_none_or(|parts| !parts.is_empty()) {
                    messages.push(json!({"role": role, "content": content}));
                }
                index += 1;
            }
            Item::FunctionCall(_) | Item::CustomToolCall(_) | Item::McpCall(_) => {
                let mut calls: Vec<Call<'_>> = Vec::new();
                while let Some(item) = conversation.get(index) {
                    if !matches!(
                        item,
                        Item::FunctionCall(_) | Item::CustomToolCall(_) | Item::McpCall(_)
                    ) {
                        break;
                    }
                    index += 1;
                    let Some(call) = call_of(item) else { continue };
                    if emitted_calls.insert(call.call_id) {
                        calls.push(call);
                    }
                }
                if calls.is_empty() {
                    continue;
                }
                // A free-form input goes as the function of one string it was offered as.
                let tool_calls: Vec<Value> = calls
                    .iter()
                    .map(|call| {
                        json!({"id": call.call_id, "type": "function", "function": {"name": call.name, "arguments": call.function_arguments()}})
                    })
                    .collect();
                attach_tool_calls(&mut messages, tool_calls);
                for call in &calls {
                    let content = results.get(call.call_id).map(|r| r.text.as_str()).unwrap_or_default();
                    messages.push(json!({"role": "tool", "tool_call_id": call.call_id, "content": content}));
                }
            }
            // Outputs were placed right after their calls; reasoning is not sent to chat upstreams; a compaction
            // reaches the model as its summary (`context::model_conversation`).
            Item::FunctionCallOutput(_)
            | Item::CustomToolCallOutput(_)
            | Item::Reasoning(_)
            | Item::Compaction(_)
            // `context::model_conversation` made these function calls and outputs already.
            | Item::McpListTools(_)
            | Item::McpApprovalRequest(_)
            | Item::McpApprovalResponse(_) => index += 1,
        }
    }
    messages
}

/// Adds tool calls to the assistant message just emitted, or emits a new assistant message for them.
fn attach_tool_calls(messages: &mut Vec<Value>, tool_calls: Vec<Value>) {
    if let Some(last) = messages.last_mut() {
        let is_plain_assistant = last.get("role").and_then(Value::as_str) == Some("assistant")
            && last.get("tool_calls").is_none();
        if is_plain_assistant {
            last["tool_calls"] = Value::Array(tool_calls);
            return;
        }
    }
    messages.push(json!({"role": "assistant", "content": null, "tool_calls": tool_calls}));
}

fn chat_content(content: &MessageContent, role: Role) -> Value {
    match content {
        MessageContent::Text(text) => json!(text),
        MessageContent::Parts(parts) => {
            let has_media = parts.iter().any(|p| {
                matches!(
                    p,
                    ContentPart::InputImage { .. } | ContentPart::InputFile { .. }
                )
            });
            if !has_media || role == Role::Assistant {
                return json!(parts_text(parts));
            }
            let mut chat_parts = Vec::new();
            for part in parts {
                match part {
                    ContentPart::InputText { text } | ContentPart::OutputText { text, .. } => {
                        chat_parts.push(json!({"type": "text", "text": text}))
                    }
                    ContentPart::Refusal { refusal } => {
                        chat_parts.push(json!({"type": "text", "text": refusal}))
                    }
                    ContentPart::InputImage {
                        image_url: Some(url),
                        detail,
                        ..
                    } => {
                        let mut image = json!({"url": url});
                        if let Some(detail) = detail {
                            image["detail"] = json!(detail);
                        }
                        chat_parts.push(json!({"type": "image_url", "image_url": image}));
                    }
                    ContentPart::InputFile {
                        file_data: Some(data),
                        filename,
                        ..
                    } => {
                        let mut file = json!({"file_data": data});
                        if let Some(filename) = filename {
                            file["filename"] = json!(filename);
                        }
                        chat_parts.push(json!({"type": "file", "file": file}));
                    }
                    ContentPart::InputFile {
                        file_id: Some(id), ..
                    } => chat_parts.push(json!({"type": "file", "file": {"file_id": id}})),
                    // A file by URL or an image by file id: Chat Completions takes neither, and the response lists
                    // them as ignored (`preparation::ignored_content`).
                    ContentPart::InputImage { .. } | ContentPart::InputFile { .. } => {}
                }
            }
            Value::Array(chat_parts)
        }
    }
}

/// A Chat Completions answer that cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unreadable upstream answer: {0}")]
pub struct ParseError(pub String);

/// Ids the parser needs; the caller draws them (the core has no randomness).
pub trait IdSource {
    /// A new output-item id with this prefix (`msg`, `fc`).
    fn item_id(&mut self, prefix: &str) -> String;
    /// A tool call id for a call the upstream left without one (index within the answer).
    fn call_id(&mut self, index: usize) -> String;
}

/// A whole answer that cannot be read: not JSON (or cut short), or JSON without what a model's answer holds.
#[derive(Debug, thiserror::Error)]
pub enum AnswerError {
    #[error("{0}")]
    Json(#[from] serde_json::Error),
    #[error(transparent)]
    Shape(#[from] ParseError),
}

/// Reads a non-streaming Chat Completions answer, as sent, into the normalised model output.
pub fn parse_answer(body: &[u8], ids: &mut dyn IdSource) -> Result<ModelOutput, AnswerError> {
    let answer::Lenient(answer) = crate::json::from_bytes(body)?;
    Ok(output_of(answer, ids)?)
}

/// Reads a non-streaming Chat Completions answer into the normalised model output.
pub fn parse_response(body: &Value, ids: &mut dyn IdSource) -> Result<ModelOutput, ParseError> {
    // Every shape of JSON reads as some answer: a tree cannot fail here.
    let answer::Lenient(answer) =
        answer::Lenient::deserialize(body).map_err(|e| ParseError(e.to_string()))?;
    output_of(answer, ids)
}

/// The normalised model output of a read answer.
fn output_of(answer: answer::Answer, ids: &mut dyn IdSource) -> Result<ModelOutput, ParseError> {
    let choice = answer
        .choice
        .ok_or_else(|| ParseError("no 'choices' in the answer".into()))?;
    let message = choice
        .message
        .ok_or_else(|| ParseError("no 'message' in the first choice".into()))?;
    let text = scrub_nul(match message.content {
        Some(Value::String(text)) => text,
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect(),
        _ => String::new(),
    });
    let mut tool_calls = Vec::new();
    for (index, call) in message.tool_calls.into_iter().flatten().enumerate() {
        let name = call.name.unwrap_or_default();
        if name.is_empty() {
            return Err(ParseError(format!(
                "tool call {index} has no function name"
            )));
        }
        let call_id = match call.id {
            Some(id) if !id.is_empty() => id,
            _ => ids.call_id(index),
        };
        tool_calls.push(ToolCall::function(
            ids.item_id("fc"),
            call_id,
            name,
            normalise_arguments(call.arguments.as_ref()),
        ));
    }
    let finish = match choice.finish_reason.as_deref() {
        Some("length") => Finish::Length,
        Some("content_filter") => Finish::ContentFilter,
        Some("tool_calls") | Some("function_call") => Finish::ToolCalls,
        _ => Finish::Stop,
    };
    Ok(ModelOutput {
        reasoning: Vec::new(),
        message: (!text.is_empty()).then(|| AssistantMessage::whole(ids.item_id("msg"), text)),
        tool_calls,
        usage: answer.usage.map(|usage| Usage {
            input_tokens: usage.prompt_tokens.unwrap_or(0),
            output_tokens: usage.completion_tokens.unwrap_or(0),
            cached_tokens: usage.cached_tokens.unwrap_or(0),
            reasoning_tokens: usage.reasoning_tokens.unwrap_or(0),
        }),
        finish,
    })
}

/// Tool-call arguments as a JSON string: objects are serialised, null or missing becomes `{}`.
pub fn normalise_arguments(arguments: Option<&Value>) -> String {
    match arguments {
        Some(Value::String(s)) if !s.trim().is_empty() => scrub_nul(s.clone()),
        Some(Value::String(_)) | Some(Value::Null) | None => "{}".into(),
        Some(other) => other.to_string(),
    }
}

/// Reads Chat Completions usage; `None` when absent or not an object.
pub fn parse_usage(usage: &Value) -> Option<Usage> {
    openai_usage(usage, "prompt_tokens", "completion_tokens")
}

/// Usage as OpenAI's APIs report it, whatever they call the counts: input and output under `input` and `output`,
/// cached and reasoning tokens under `{input}_details` and `{output}_details`; `None` when absent or not an object.
pub(crate) fn openai_usage(usage: &Value, input: &str, output: &str) -> Option<Usage> {
    let usage = usage.as_object()?;
    let number = |v: Option<&Value>| v.and_then(Value::as_u64).unwrap_or(0);
    let detail = |count: &str, key: &str| {
        let details = usage
            .iter()
            .find(|(name, _)| name.strip_prefix(count) == Some("_details"))
            .map(|(_, details)| details);
        number(details.and_then(|d| d.get(key)))
    };
    Some(Usage {
        input_tokens: number(usage.get(input)),
        output_tokens: number(usage.get(output)),
        cached_tokens: detail(input, "cached_tokens"),
        reasoning_tokens: detail(output, "reasoning_tokens"),
    })
}

#[cfg(test)]
mod tests;

/// Replaces NUL characters, which stores cannot keep (Postgres refuses `\u0000` in text and JSON).
pub fn scrub_nul(text: String) -> String {
    if text.contains('\0') {
        text.replace('\0', "\u{FFFD}")
    } else {
        text
    }
}
