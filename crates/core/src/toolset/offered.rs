//! What a model is offered of the client's tools: one flat name and one input shape per tool (namespaces
//! flattened, custom tools as functions of one string for providers without them), and the way back from the name
//! a model called to the tool the client declared.

use std::borrow::Cow;

use serde_json::{json, Map, Value};

use super::{CustomTool, DeclaredTool, FunctionTool, NamespaceMember};
use crate::items::{CustomToolCallItem, FunctionCallItem, FunctionCallOutputItem, Item};
use crate::steps::{CallKind, ToolCall};

/// The name a model sees for a tool: its own outside a namespace, `<namespace>__<name>` inside one, made to fit
/// `^[a-zA-Z0-9_-]{1,64}$` (other characters become `_`; a longer name keeps its start and a hash of the whole).
pub fn flat_name(namespace: Option<&str>, name: &str) -> String {
    let Some(namespace) = namespace else {
        return name.to_owned();
    };
    let joined = format!("{namespace}__{name}");
    let mut flat: String = joined
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if flat.len() > 64 {
        flat.truncate(55);
        flat.push_str(&format!("_{:08x}", fnv1a32(joined.as_bytes())));
    }
    flat
}

/// FNV-1a, 32 bits: a stable hash that needs no dependency; names only need to stay apart, not be secret.
fn fnv1a32(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5_u32, |hash, &b| {
        (hash ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}

/// A tool as a model is offered it: one flat name and one input shape.
#[derive(Debug, Clone, PartialEq)]
pub struct OfferedTool {
    pub name: String,
    pub description: Option<String>,
    pub input: ToolInput,
}

/// What a tool takes.
#[derive(Debug, Clone, PartialEq)]
pub enum ToolInput {
    /// JSON arguments, described by a JSON Schema.
    Json {
        parameters: Value,
        strict: Option<bool>,
    },
    /// Free-form text (a custom tool), optionally constrained by a grammar.
    Text { format: Option<Value> },
}

impl OfferedTool {
    /// The tool's `name` and, unless it is empty, its `description`: what every provider's tool declaration
    /// holds besides its input.
    pub fn name_and_description(&self) -> Map<String, Value> {
        let mut fields = Map::new();
        fields.insert("name".into(), json!(self.name));
        if let Some(d) = self.description.as_deref().filter(|d| !d.is_empty()) {
            fields.insert("description".into(), json!(d));
        }
        fields
    }

    pub fn function(tool: &FunctionTool) -> OfferedTool {
        OfferedTool {
            name: tool.name.clone(),
            description: tool.description.clone(),
            input: ToolInput::Json {
                parameters: match &tool.parameters {
                    Some(p) if p.is_object() => p.clone(),
                    _ => json!({"type": "object", "properties": {}}),
                },
                strict: tool.strict,
            },
        }
    }

    fn custom(namespace: Option<&str>, tool: &CustomTool) -> OfferedTool {
        OfferedTool {
            name: flat_name(namespace, &tool.name),
            description: tool.description.clone(),
            input: ToolInput::Text {
                format: tool.format.clone(),
            },
        }
    }

    /// For a provider without custom tools: a free-form tool becomes a function of one string, `input`; a
    /// function is itself (borrowed: its schema is not copied for every model call).
    pub fn as_function(&self) -> Cow<'_, OfferedTool> {
        match &self.input {
            ToolInput::Json { .. } => Cow::Borrowed(self),
            ToolInput::Text { format } => Cow::Owned(OfferedTool {
                description: with_grammar(self.description.as_deref(), format.as_ref()),
                input: ToolInput::Json {
                    parameters: json!({
                        "type": "object",
                        "properties": {"input": {"type": "string", "description": "The tool's free-form input."}},
                        "required": ["input"],
                        "additionalProperties": false,
                    }),
                    strict: None,
                },
                name: self.name.clone(),
            }),
        }
    }
}

/// A custom tool's description for a provider that cannot enforce its grammar: the grammar is spelled out, so
/// the model can still follow it.
fn with_grammar(description: Option<&str>, format: Option<&Value>) -> Option<String> {
    let grammar = format.filter(|f| f.get("type").and_then(Value::as_str) == Some("grammar"));
    let Some(grammar) = grammar else {
        return description.map(str::to_owned);
    };
    let syntax = grammar
        .get("syntax")
        .and_then(Value::as_str)
        .unwrap_or("lark");
    let definition = grammar
        .get("definition")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let rule = format!("The input must match this {syntax} grammar:\n{definition}");
    Some(match description.filter(|d| !d.is_empty()) {
        Some(d) => format!("{d}\n\n{rule}"),
        None => rule,
    })
}

/// The client's tools as a model is offered them, in declaration order. Tools of other types are not offered:
/// a bound source serves them, or the deployment's policy leaves them out.
pub fn offered_client_tools(tools: &[DeclaredTool]) -> Vec<OfferedTool> {
    let mut offered = Vec::new();
    for tool in tools {
        match tool {
            DeclaredTool::Function(f) => offered.push(OfferedTool::function(f)),
            DeclaredTool::Custom(c) => offered.push(OfferedTool::custom(None, c)),
            DeclaredTool::Namespace(n) => {
                for member in &n.tools {
                    offered.push(match member {
                        NamespaceMember::Function(f) => OfferedTool {
                            name: flat_name(Some(&n.name), &f.name),
                            ..OfferedTool::function(f)
                        },
                        NamespaceMember::Custom(c) => OfferedTool::custom(Some(&n.name), c),
                    });
                }
            }
            DeclaredTool::Other(_) => {}
        }
    }
    offered
}

/// Gives each call of a model answer the name, namespace and kind of the client tool its flat name stands for.
/// Calls of server tools (and of names no client tool has) are left as plain functions.
pub fn name_calls(tools: &[DeclaredTool], calls: &mut [ToolCall]) {
    for call in calls {
        for tool in tools {
            let found = match tool {
                DeclaredTool::Custom(c) if c.name == call.name => Some((None, CallKind::Custom)),
                DeclaredTool::Namespace(n) => n
                    .tools
                    .iter()
                    .find(|m| flat_name(Some(&n.name), m.name()) == call.name)
                    .map(|m| {
                        let kind = match m {
                            NamespaceMember::Function(_) => CallKind::Function,
                            NamespaceMember::Custom(_) => CallKind::Custom,
                        };
                        call.name = m.name().to_owned();
                        (Some(n.name.clone()), kind)
                    }),
                _ => None,
            };
            if let Some((namespace, kind)) = found {
                call.namespace = namespace;
                call.kind = kind;
                if kind == CallKind::Custom {
                    if let Some(rest) = call.item_id.strip_prefix("fc_") {
                        call.item_id = format!("ctc_{rest}");
                    }
                }
                break;
            }
        }
    }
}

/// The conversation as a model sees it: calls inside a namespace under their flat name.
pub fn flatten_namespaces(conversation: &mut [Item]) {
    for item in conversation {
        match item {
            Item::FunctionCall(call) => {
                if let Some(namespace) = call.namespace.take() {
                    call.name = flat_name(Some(&namespace), &call.name);
                }
            }
            Item::CustomToolCall(call) => {
                if let Some(namespace) = call.namespace.take() {
                    call.name = flat_name(Some(&namespace), &call.name);
                }
            }
            _ => {}
        }
    }
}

/// For a provider without custom tools: custom calls become function calls whose arguments are
/// `{"input": <text>}`, their outputs function outputs, and custom tools functions of one string.
pub fn custom_as_functions(conversation: &mut [Item], tools: &mut [OfferedTool]) {
    for tool in tools.iter_mut() {
        if let Cow::Owned(function) = tool.as_function() {
            *tool = function;
        }
    }
    for item in conversation {
        match item {
            Item::CustomToolCall(call) => {
                *item = Item::FunctionCall(FunctionCallItem {
                    id: call.id.clone(),
                    call_id: call.call_id.clone(),
                    namespace: call.namespace.clone(),
                    name: call.name.clone(),
                    arguments: json!({"input": call.input}).to_string(),
                    status: call.status.clone(),
                });
            }
            Item::CustomToolCallOutput(output) => {
                *item = Item::FunctionCallOutput(FunctionCallOutputItem {
                    id: output.id.clone(),
                    call_id: output.call_id.clone(),
                    output: output.output.clone(),
                    status: output.status.clone(),
                });
            }
            _ => {}
        }
    }
}

/// For a provider without custom tools: the free-form input back out of the `{"input": ...}` arguments a model
/// wrote for a custom tool (offered as a function). Arguments of another shape are kept as they are.
pub fn unwrap_custom_inputs(offered: &[OfferedTool], calls: &mut [ToolCall]) {
    for call in calls {
        let is_text = offered
            .iter()
            .any(|t| t.name == call.name && matches!(t.input, ToolInput::Text { .. }));
        if !is_text {
            continue;
        }
        if let Ok(Value::Object(map)) = serde_json::from_str::<Value>(&call.arguments) {
            if let Some(Value::String(input)) = map.get("input") {
                call.arguments = input.clone();
            }
        }
    }
}

/// A handed-back or replayed call as the item the client sees: `function_call` or `custom_tool_call`.
pub fn call_item(call: &ToolCall, status: &str) -> Item {
    if let Some(crate::steps::Approval::Required { server_label }) = &call.approval {
        return Item::McpApprovalRequest(crate::items::McpApprovalRequestItem {
            id: Some(call.item_id.clone()),
            call_id: Some(call.call_id.clone()),
            server_label: server_label.clone(),
            name: call.name.clone(),
            arguments: call.arguments.clone(),
        });
    }
    match call.kind {
        CallKind::Function => Item::FunctionCall(FunctionCallItem {
            id: Some(call.item_id.clone()),
            call_id: call.call_id.clone(),
            namespace: call.namespace.clone(),
            name: call.name.clone(),
            arguments: call.arguments.clone(),
            status: Some(status.into()),
        }),
        CallKind::Custom => Item::CustomToolCall(CustomToolCallItem {
            id: Some(call.item_id.clone()),
            call_id: call.call_id.clone(),
            namespace: call.namespace.clone(),
            name: call.name.clone(),
            input: call.arguments.clone(),
            status: Some(status.into()),
        }),
    }
}
