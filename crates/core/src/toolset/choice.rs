//! `tool_choice`: checked in itself, and as a model sees it given the tools it is offered.

use serde_json::{json, Value};

use super::{is_tool_type, OfferedTool, ToolInput};
use crate::request::InvalidRequest;

/// Checks `tool_choice` in itself; whether the tool it names exists is checked once the server tools are known.
pub fn validate_tool_choice(choice: &Value) -> Result<(), InvalidRequest> {
    let valid = match choice {
        Value::String(s) => matches!(s.as_str(), "none" | "auto" | "required"),
        Value::Object(map) => match map.get("type").and_then(Value::as_str) {
            Some("function" | "custom") => map.get("name").and_then(Value::as_str).is_some(),
            Some("allowed_tools") => {
                map.get("tools").is_some_and(Value::is_array)
                    && map
                        .get("mode")
                        .is_none_or(|m| matches!(m.as_str(), Some("auto" | "required")))
            }
            Some("mcp") => map.get("server_label").and_then(Value::as_str).is_some(),
            Some(other) => is_tool_type(other),
            None => false,
        },
        _ => false,
    };
    if valid {
        Ok(())
    } else {
        Err(InvalidRequest::new(
            "Invalid 'tool_choice': expected 'none', 'auto', 'required', {\"type\":\"function\",\"name\":...}, {\"type\":\"custom\",\"name\":...}, {\"type\":\"allowed_tools\",...} or a tool type.",
            "tool_choice",
        ))
    }
}

/// The name a `tool_choice` of type `function` or `custom` forces, if it forces one.
pub fn forced_tool_name(choice: &Value) -> Option<&str> {
    match choice.get("type").and_then(Value::as_str) {
        Some("function" | "custom") => choice.get("name").and_then(Value::as_str),
        _ => None,
    }
}

/// `tool_choice` as a model sees it, given the flat names it is offered: a choice of a tool it is not offered
/// (a hosted tool left out, say) is `auto`; a hosted type a bound source serves (offered under the type's name)
/// forces that function; a custom tool named is `custom` or, for a provider without custom
/// tools, `function`; `allowed_tools` keeps only offered names.
pub fn model_tool_choice(choice: &Value, offered: &[OfferedTool]) -> Value {
    let offered_name = |name: &str| offered.iter().find(|t| t.name == name);
    match choice {
        Value::Object(map) => match map.get("type").and_then(Value::as_str) {
            Some("function" | "custom") => {
                let name = map.get("name").and_then(Value::as_str).unwrap_or_default();
                match offered_name(name) {
                    Some(tool) => {
                        let kind = match tool.input {
                            ToolInput::Json { .. } => "function",
                            ToolInput::Text { .. } => "custom",
                        };
                        json!({"type": kind, "name": tool.name})
                    }
                    None => json!("auto"),
                }
            }
            Some("allowed_tools") => {
                let tools: Vec<Value> = map
                    .get("tools")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .filter_map(|t| {
                        let name = t.get("name").and_then(Value::as_str)?;
                        offered_name(name)
                            .map(|tool| json!({"type": "function", "name": tool.name}))
                    })
                    .collect();
                let mode = map.get("mode").cloned().unwrap_or_else(|| json!("auto"));
                if tools.is_empty() {
                    return mode;
                }
                json!({"type": "allowed_tools", "mode": mode, "tools": tools})
            }
            // A hosted type served by a bound source is offered under the type's name: choosing the type
            // forces that function.
            Some(kind) if kind != "mcp" && offered_name(kind).is_some() => {
                json!({"type": "function", "name": kind})
            }
            _ => json!("auto"),
        },
        other => other.clone(),
    }
}
