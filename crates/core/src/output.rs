//! Assembly of the Responses API `Response` object from a response's stored record and steps.

use serde::Serialize;
use serde_json::{json, Value};

use crate::items::{
    ContentPart, Item, McpCallItem, McpListToolsItem, MessageContent, MessageItem, Role,
};
use crate::response::{Ending, ResponseRecord, ResponseState};
use crate::steps::{
    Approval, ListingStep, Step, StepBody, StepState, ToolOutcome, ToolStep, Usage,
};
use crate::toolset::{call_item, DeclaredTool};

/// `server_label` of the `mcp_call` items that show server tool calls.
pub const SERVER_LABEL: &str = "gateway";

/// The output items of a response, in the order they happened.
///
/// Server tool calls that ran show as `mcp_call` items. Calls of the last batch show as `function_call` (or
/// `custom_tool_call`) items only when that batch was handed back to the client; calls never run (a limit was reached, or the
/// tool step was recorded but never started) are left out. A model call that broke off after streaming
/// some text shows that text as an `incomplete` message.
pub fn render_output(steps: &[Step], handed_back: bool) -> Vec<Item> {
    let last_model = steps.iter().rposition(|s| s.model().is_some());
    let mut items = Vec::new();
    for (index, step) in steps.iter().enumerate() {
        match &step.body {
            StepBody::Model(model) => {
                if let Some(partial) = model.failure.as_ref().and_then(|f| f.partial.as_ref()) {
                    items.push(message_with_status(
                        &partial.item_id,
                        &partial.text,
                        "incomplete",
                    ));
                }
                let Some(output) = &model.output else {
                    continue;
                };
                if let Some(message) = &output.message {
                    items.push(assistant_message(&message.item_id, &message.text));
                }
                // After the message: a stream shows the text as it comes, and the reasoning once the call ended.
                items.extend(output.reasoning.iter().cloned().map(Item::Reasoning));
                if handed_back && Some(index) == last_model {
                    for call in &output.tool_calls {
                        items.push(call_item(call, "completed"));
                    }
                }
            }
            StepBody::Tool(_) if step.state == StepState::Pending => {}
            StepBody::Tool(tool) => items.push(mcp_call_item(tool)),
            StepBody::Listing(listing) => items.push(listing_item(listing)),
        }
    }
    items
}

/// A server tool step as an `mcp_call` item: in progress until its outcome is known.
pub fn mcp_call_item(tool: &ToolStep) -> Item {
    let (output, error, status) = match &tool.outcome {
        Some(ToolOutcome::Output { text }) => (Some(text.clone()), None, "completed"),
        Some(failure @ ToolOutcome::Error { .. }) => (None, failure.mcp_error(), "failed"),
        None => (None, None, "in_progress"),
    };
    Item::McpCall(McpCallItem {
        id: Some(tool.item_id.clone()),
        call_id: Some(tool.call.call_id.clone()),
        server_label: tool
            .server_label
            .clone()
            .unwrap_or_else(|| SERVER_LABEL.into()),
        name: tool.call.name.clone(),
        arguments: tool.call.arguments.clone(),
        output,
        error,
        status: Some(status.into()),
        hosted_type: tool.hosted_type.clone(),
        approval_request_id: match &tool.call.approval {
            Some(Approval::Granted { request_id }) => Some(request_id.clone()),
            _ => None,
        },
    })
}

/// A remote MCP server's listing as its `mcp_list_tools` item.
pub fn listing_item(listing: &ListingStep) -> Item {
    Item::McpListTools(McpListToolsItem {
        id: Some(listing.item_id.clone()),
        server_label: listing.server_label.clone(),
        tools: listing.tools.clone(),
        error: None,
    })
}

/// The item type a call of a bound hosted tool shows as, for the hosted types the gateway shapes: `web_search`
/// → `web_search_call`. Calls of other hosted types (`file_search`, `code_interpreter`, ...) show as `mcp_call`:
/// their OpenAI items describe results the gateway cannot know from a tool's text output (file hits, code
/// outputs, images), so no honest item of that type can be built.
pub fn hosted_item_kind(hosted_type: &str) -> Option<&'static str> {
    match hosted_type {
        "web_search" | "web_search_preview" => Some("web_search_call"),
        _ => None,
    }
}

/// The prefix of the item id of a server tool call: `ws` for a bound `web_search`, `mcp` otherwise.
pub fn tool_item_prefix(hosted_type: Option<&str>) -> &'static str {
    match hosted_type.and_then(hosted_item_kind) {
        Some("web_search_call") => "ws",
        _ => "mcp",
    }
}

/// An item as clients are shown it: a call of a bound hosted tool as its hosted item (`web_search_call`, without
/// the output, as OpenAI's carries none), everything else as stored.
pub fn client_item_json(item: &Item) -> Value {
    if let Item::McpCall(call) = item {
        if let Some(hosted) = call.hosted_type.as_deref() {
            if let Some(shaped) = hosted_call_json(call, hosted) {
                return shaped;
            }
            let mut plain = call.clone();
            plain.hosted_type = None;
            return serde_json::to_value(Item::McpCall(plain)).unwrap_or(Value::Null);
        }
    }
    serde_json::to_value(item).unwrap_or(Value::Null)
}

/// A bound hosted call in OpenAI's shape, for the types [`hosted_item_kind`] names.
fn hosted_call_json(call: &McpCallItem, hosted_type: &str) -> Option<Value> {
    match hosted_item_kind(hosted_type)? {
        "web_search_call" => {
            let status = match call.status.as_deref() {
                Some("completed") => "completed",
                Some("failed") => "failed",
                _ => "in_progress",
            };
            let mut action = json!({"type": "search"});
            let query = serde_json::from_str::<Value>(&call.arguments)
                .ok()
                .and_then(|args| args.get("query").and_then(Value::as_str).map(str::to_owned));
            if let Some(query) = query {
                action["query"] = json!(query);
            }
            Some(
                json!({"id": call.id, "type": "web_search_call", "status": status, "action": action}),
            )
        }
        _ => None,
    }
}

/// An assistant message item holding one `output_text` part.
pub fn assistant_message(id: &str, text: &str) -> Item {
    message_with_status(id, text, "completed")
}

/// An assistant message item holding one `output_text` part, with `status`.
pub fn message_with_status(id: &str, text: &str, status: &str) -> Item {
    Item::Message(MessageItem {
        id: Some(id.into()),
        role: Role::Assistant,
        content: MessageContent::Parts(vec![ContentPart::OutputText {
            text: text.into(),
            annotations: Vec::new(),
            logprobs: Vec::new(),
        }]),
        status: Some(status.into()),
    })
}

/// The Responses API `Response` object of `record` with `output` (what `render_output` made of its steps), as a
/// JSON value (see [`ResponseObject`], which a caller that only writes it out serialises directly).
pub fn response_object(record: &ResponseRecord, output: &[Item]) -> Value {
    serde_json::to_value(ResponseObject::new(record, output)).unwrap_or(Value::Null)
}

/// The Responses API `Response` object, borrowed from the record and the output it shows: serialised straight
/// to the answer's bytes, with no `Value` tree built on the way. Fields in OpenAI's order.
#[derive(Debug, Serialize)]
pub struct ResponseObject<'a> {
    id: &'a str,
    object: &'static str,
    created_at: i64,
    completed_at: Option<i64>,
    conversation: Option<ConversationRef<'a>>,
    status: &'static str,
    background: bool,
    error: Option<ErrorObject<'a>>,
    incomplete_details: Option<IncompleteDetails>,
    instructions: Option<&'a str>,
    max_output_tokens: Option<u32>,
    max_tool_calls: Option<u32>,
    model: &'a str,
    output: Vec<ClientItem<'a>>,
    output_text: String,
    parallel_tool_calls: bool,
    previous_response_id: Option<&'a str>,
    prompt_cache_key: Option<&'a str>,
    reasoning: Value,
    safety_identifier: Option<&'a str>,
    service_tier: &'a str,
    store: bool,
    temperature: f64,
    text: Value,
    tool_choice: &'a Value,
    tools: Vec<Value>,
    top_logprobs: u32,
    top_p: f64,
    truncation: &'a str,
    presence_penalty: f64,
    frequency_penalty: f64,
    usage: Option<UsageObject>,
    user: Option<&'a str>,
    metadata: &'a std::collections::BTreeMap<String, String>,
}

#[derive(Debug, Serialize)]
struct ConversationRef<'a> {
    id: &'a str,
}

#[derive(Debug, Serialize)]
struct ErrorObject<'a> {
    code: &'static str,
    message: &'a str,
}

#[derive(Debug, Serialize)]
struct IncompleteDetails {
    reason: &'static str,
}

/// An output item as clients see it: the item itself (a reasoning item without its encrypted content unless the
/// client asked for it), or a bound hosted call in OpenAI's shape.
#[derive(Debug)]
enum ClientItem<'a> {
    Item(&'a Item),
    /// A reasoning item as shown (boxed: an item is large, and most are borrowed).
    Shown(Box<Item>),
    Shaped(Value),
}

impl<'a> ClientItem<'a> {
    fn of(item: &'a Item, include: Option<&[String]>) -> ClientItem<'a> {
        match item {
            Item::Reasoning(_) => {
                ClientItem::Shown(Box::new(crate::reasoning::shown(item, include)))
            }
            Item::McpCall(call) if call.hosted_type.is_some() => {
                ClientItem::Shaped(client_item_json(item))
            }
            _ => ClientItem::Item(item),
        }
    }
}

impl Serialize for ClientItem<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            ClientItem::Item(item) => item.serialize(serializer),
            ClientItem::Shown(item) => item.serialize(serializer),
            ClientItem::Shaped(value) => value.serialize(serializer),
        }
    }
}

impl<'a> ResponseObject<'a> {
    pub fn new(record: &'a ResponseRecord, output: &'a [Item]) -> ResponseObject<'a> {
        let params = &record.params;
        let output_text: String = output
            .iter()
            .filter_map(|item| match item {
                Item::Message(MessageItem {
                    content: MessageContent::Parts(parts),
                    ..
                }) => Some(parts),
                _ => None,
            })
            .flatten()
            .filter_map(|part| match part {
                ContentPart::OutputText { text, .. } => Some(text.as_str()),
                _ => None,
            })
            .collect();
        ResponseObject {
            id: &record.id,
            object: "response",
            created_at: record.created_at,
            completed_at: match &record.state {
                ResponseState::Ended { completed_at, .. } => Some(*completed_at),
                ResponseState::Queued | ResponseState::InProgress => None,
            },
            conversation: params
                .conversation
                .as_deref()
                .map(|id| ConversationRef { id }),
            status: record.status().as_str(),
            background: record.background,
            error: match record.ending() {
                Some(Ending::Failed { code, message }) => Some(ErrorObject {
                    code: code.as_str(),
                    message,
                }),
                _ => None,
            },
            incomplete_details: match record.ending() {
                Some(Ending::Incomplete { reason }) => Some(IncompleteDetails {
                    reason: reason.as_str(),
                }),
                _ => None,
            },
            instructions: params.instructions.as_deref(),
            max_output_tokens: params.max_output_tokens,
            max_tool_calls: params.max_tool_calls,
            model: &record.model,
            output: output
                .iter()
                .map(|item| ClientItem::of(item, params.include.as_deref()))
                .collect(),
            output_text,
            parallel_tool_calls: params.parallel_tool_calls,
            previous_response_id: record.previous_response_id.as_deref(),
            prompt_cache_key: params.prompt_cache_key.as_deref(),
            reasoning: echoed_reasoning(params.reasoning.as_ref()),
            safety_identifier: params.safety_identifier.as_deref(),
            service_tier: params.service_tier.as_deref().unwrap_or("default"),
            store: record.store,
            temperature: params.temperature.unwrap_or(1.0),
            text: echoed_text(&params.text),
            tool_choice: &params.tool_choice,
            tools: params
                .tools
                .iter()
                .map(DeclaredTool::to_client_json)
                .collect(),
            top_logprobs: params.top_logprobs.unwrap_or(0),
            top_p: params.top_p.unwrap_or(1.0),
            truncation: &params.truncation,
            presence_penalty: params.presence_penalty.unwrap_or(0.0),
            frequency_penalty: params.frequency_penalty.unwrap_or(0.0),
            usage: record.usage.as_ref().map(usage_object),
            user: params.user.as_deref(),
            metadata: &params.metadata,
        }
    }
}

/// `reasoning` as echoed: `effort` and `summary` always present (Open Responses requires both keys, even
/// when the client sent only one), with the client's values kept.
fn echoed_reasoning(reasoning: Option<&Value>) -> Value {
    let mut echoed = json!({"effort": null, "summary": null});
    if let (Some(Value::Object(given)), Value::Object(target)) = (reasoning, &mut echoed) {
        for (key, value) in given {
            target.insert(key.clone(), value.clone());
        }
    }
    echoed
}

/// `text` as echoed: a client may send only `verbosity`, but the response must name a `format`.
fn echoed_text(text: &Value) -> Value {
    let mut echoed = text.clone();
    if let Value::Object(map) = &mut echoed {
        map.entry("format")
            .or_insert_with(|| json!({"type": "text"}));
    }
    echoed
}

/// The Responses API `usage` object, written straight out (its keys in the order they always had). OpenAI's schema
/// requires `cache_write_tokens`; upstreams do not report it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct UsageObject {
    input_tokens: u64,
    input_tokens_details: InputTokensDetails,
    output_tokens: u64,
    output_tokens_details: OutputTokensDetails,
    total_tokens: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
struct InputTokensDetails {
    cache_write_tokens: u64,
    cached_tokens: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
struct OutputTokensDetails {
    reasoning_tokens: u64,
}

/// The Responses API `usage` object of `usage`.
pub fn usage_object(usage: &Usage) -> UsageObject {
    UsageObject {
        input_tokens: usage.input_tokens,
        input_tokens_details: InputTokensDetails {
            cache_write_tokens: 0,
            cached_tokens: usage.cached_tokens,
        },
        output_tokens: usage.output_tokens,
        output_tokens_details: OutputTokensDetails {
            reasoning_tokens: usage.reasoning_tokens,
        },
        total_tokens: usage.total_tokens(),
    }
}

#[cfg(test)]
mod tests;
mod written;

pub use written::{push_json_string, push_json_string_contents};

/// An input item as `GET /v1/responses/{id}/input_items` lists it: a message whose content the client sent
/// as a bare string shows it as one text part (`input_text`, or `output_text` for the assistant), as OpenAI
/// lists it and as openai-node types it; a bound hosted call shows as its hosted item. Everything else is listed
/// as stored.
pub fn listed_input_item(mut item: Value) -> Value {
    if item.get("type").and_then(Value::as_str) == Some("mcp_call")
        && item.get("hosted_type").is_some_and(Value::is_string)
    {
        if let Ok(call) = serde_json::from_value::<Item>(item.clone()) {
            return client_item_json(&call);
        }
    }
    let role = item.get("role").and_then(Value::as_str).map(str::to_owned);
    let is_message = matches!(
        item.get("type").and_then(Value::as_str),
        None | Some("message")
    );
    if let (true, Some(role), Some(Value::String(text))) = (is_message, role, item.get("content")) {
        let kind = if role == "assistant" {
            "output_text"
        } else {
            "input_text"
        };
        let part = if kind == "output_text" {
            json!({"type": kind, "text": text, "annotations": []})
        } else {
            json!({"type": kind, "text": text})
        };
        item["content"] = json!([part]);
        item["type"] = json!("message");
    }
    item
}
