//! What an upstream was sent, read from its provider's shape into one form, so one scenario can check every kind:
//! Chat `messages` with `tool_calls` and `tool` messages, Anthropic blocks, Responses `input` items.

use serde_json::Value;

use super::Kind;

/// One upstream request as the table compares it.
#[derive(Debug)]
pub struct Sent {
    /// The instructions: Chat's `system` messages, Anthropic's `system`, Responses' `instructions`.
    pub instructions: Option<String>,
    /// The conversation, one line per part: `user:text`, `assistant:text`, `call:id:name:arguments` (arguments as
    /// compact JSON), `result:id:content` (`:error` appended when the provider marks failures),
    /// `thinking:text:signature`, `reasoning:id:encrypted_content`.
    pub lines: Vec<String>,
    /// The names of the tools offered.
    pub tools: Vec<String>,
    /// The output-token cap, in the provider's own field.
    pub max_tokens: Option<u64>,
    /// The roles of the messages, for the kinds that send messages (not Responses items).
    pub roles: Vec<String>,
}

fn text(value: &Value) -> &str {
    value.as_str().unwrap_or_default()
}

/// Arguments as compact JSON, whether sent as a string of JSON or as an object.
fn arguments(value: &Value) -> String {
    match value {
        Value::String(s) => serde_json::from_str::<Value>(s)
            .map(|v| v.to_string())
            .unwrap_or_else(|_| s.clone()),
        other => other.to_string(),
    }
}

/// A message's text, whether its content is a string or parts.
fn content_text(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts.iter().filter_map(|p| p["text"].as_str()).collect(),
        _ => String::new(),
    }
}

fn names(tools: &Value, pointer: &str) -> Vec<String> {
    tools
        .as_array()
        .into_iter()
        .flatten()
        .map(|t| text(t.pointer(pointer).unwrap_or(&Value::Null)).to_owned())
        .collect()
}

fn roles(request: &Value) -> Vec<String> {
    request["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|m| text(&m["role"]).to_owned())
        .collect()
}

/// Reads a request `kind`'s adapter sent.
pub fn sent(kind: Kind, request: &Value) -> Sent {
    match kind {
        Kind::OpenaiChat => chat(request),
        Kind::Anthropic => anthropic(request),
        Kind::OpenaiResponses => responses(request),
    }
}

fn chat(request: &Value) -> Sent {
    let mut instructions = Vec::new();
    let mut lines = Vec::new();
    for message in request["messages"].as_array().into_iter().flatten() {
        let role = text(&message["role"]);
        let content = content_text(&message["content"]);
        match role {
            "system" => instructions.push(content),
            "tool" => lines.push(format!(
                "result:{}:{content}",
                text(&message["tool_call_id"])
            )),
            _ => {
                if !content.is_empty() {
                    lines.push(format!("{role}:{content}"));
                }
                for call in message["tool_calls"].as_array().into_iter().flatten() {
                    lines.push(format!(
                        "call:{}:{}:{}",
                        text(&call["id"]),
                        text(&call["function"]["name"]),
                        arguments(&call["function"]["arguments"])
                    ));
                }
            }
        }
    }
    Sent {
        instructions: (!instructions.is_empty()).then(|| instructions.join("\n\n")),
        lines,
        tools: names(&request["tools"], "/function/name"),
        max_tokens: request["max_tokens"].as_u64(),
        roles: roles(request),
    }
}

fn anthropic(request: &Value) -> Sent {
    let mut lines = Vec::new();
    for message in request["messages"].as_array().into_iter().flatten() {
        let role = text(&message["role"]);
        for block in message["content"].as_array().into_iter().flatten() {
            lines.push(match text(&block["type"]) {
                "text" => format!("{role}:{}", text(&block["text"])),
                "tool_use" => format!(
                    "call:{}:{}:{}",
                    text(&block["id"]),
                    text(&block["name"]),
                    arguments(&block["input"])
                ),
                "tool_result" => format!(
                    "result:{}:{}{}",
                    text(&block["tool_use_id"]),
                    content_text(&block["content"]),
                    if block["is_error"] == true {
                        ":error"
                    } else {
                        ""
                    }
                ),
                "thinking" => format!(
                    "thinking:{}:{}",
                    text(&block["thinking"]),
                    text(&block["signature"])
                ),
                other => other.to_owned(),
            });
        }
    }
    Sent {
        // A string, or text blocks (the gateway sends one, with its cache breakpoint).
        instructions: match &request["system"] {
            Value::String(text) => Some(text.clone()),
            Value::Array(blocks) => {
                Some(blocks.iter().filter_map(|b| b["text"].as_str()).collect())
            }
            _ => None,
        },
        lines,
        tools: names(&request["tools"], "/name"),
        max_tokens: request["max_tokens"].as_u64(),
        roles: roles(request),
    }
}

fn responses(request: &Value) -> Sent {
    let lines = request["input"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|item| match text(&item["type"]) {
            "message" => format!("{}:{}", text(&item["role"]), content_text(&item["content"])),
            "function_call" => format!(
                "call:{}:{}:{}",
                text(&item["call_id"]),
                text(&item["name"]),
                arguments(&item["arguments"])
            ),
            "function_call_output" => format!(
                "result:{}:{}",
                text(&item["call_id"]),
                text(&item["output"])
            ),
            "reasoning" => format!(
                "reasoning:{}:{}",
                text(&item["id"]),
                text(&item["encrypted_content"])
            ),
            other => other.to_owned(),
        })
        .collect();
    Sent {
        instructions: request["instructions"].as_str().map(str::to_owned),
        lines,
        tools: names(&request["tools"], "/name"),
        max_tokens: request["max_output_tokens"].as_u64(),
        roles: Vec::new(),
    }
}
