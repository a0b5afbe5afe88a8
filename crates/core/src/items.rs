//! Responses API items as the gateway stores them: messages, function and custom tool calls and their outputs,
//! server tool calls (`mcp_call`), MCP listings and approvals, reasoning and compactions; and reading input items.
//! An absent optional field is left out of an item's JSON (`skip_serializing_none`) unless it says `serialize_always`.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use serde_with::skip_serializing_none;

/// One conversation item, in the Responses API's wire shape.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Item {
    Message(MessageItem),
    FunctionCall(FunctionCallItem),
    FunctionCallOutput(FunctionCallOutputItem),
    CustomToolCall(CustomToolCallItem),
    CustomToolCallOutput(CustomToolCallOutputItem),
    McpCall(McpCallItem),
    McpListTools(McpListToolsItem),
    McpApprovalRequest(McpApprovalRequestItem),
    McpApprovalResponse(McpApprovalResponseItem),
    Reasoning(ReasoningItem),
    Compaction(CompactionItem),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    User,
    Assistant,
    System,
    Developer,
}

#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MessageItem {
    pub id: Option<String>,
    pub role: Role,
    pub content: MessageContent,
    pub status: Option<String>,
}

/// Message content: clients may send a bare string or a list of parts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum MessageContent {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ContentPart {
    InputText {
        text: String,
    },
    OutputText {
        text: String,
        #[serde(default)]
        annotations: Vec<Value>,
        #[serde(default)]
        logprobs: Vec<Value>,
    },
    Refusal {
        refusal: String,
    },
    InputImage {
        image_url: Option<String>,
        file_id: Option<String>,
        detail: Option<String>,
    },
    InputFile {
        file_id: Option<String>,
        file_url: Option<String>,
        file_data: Option<String>,
        filename: Option<String>,
    },
}

#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FunctionCallItem {
    pub id: Option<String>,
    pub call_id: String,
    /// The namespace of a function declared inside a `namespace` tool.
    pub namespace: Option<String>,
    pub name: String,
    pub arguments: String,
    pub status: Option<String>,
}

/// A tool's result as the client sends it back: `function_call_output`, and `custom_tool_call_output` too.
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FunctionCallOutputItem {
    pub id: Option<String>,
    pub call_id: String,
    pub output: FunctionOutput,
    pub status: Option<String>,
}

/// A call of a `custom` tool: free-form text `input` instead of JSON arguments.
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CustomToolCallItem {
    pub id: Option<String>,
    pub call_id: String,
    pub namespace: Option<String>,
    pub name: String,
    pub input: String,
    pub status: Option<String>,
}

/// The client's answer to a `custom_tool_call`: the same fields as a `function_call_output`.
pub type CustomToolCallOutputItem = FunctionCallOutputItem;

impl ContentPart {
    /// Whether the part is an image or a file, which not every provider takes.
    pub fn is_media(&self) -> bool {
        matches!(
            self,
            ContentPart::InputImage { .. } | ContentPart::InputFile { .. }
        )
    }
}

/// A tool's output: a string, or (from clients) a list of content parts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum FunctionOutput {
    Text(String),
    Parts(Vec<ContentPart>),
}

impl FunctionOutput {
    /// The output flattened to text, as chat upstreams take it.
    pub fn to_text(&self) -> String {
        match self {
            FunctionOutput::Text(text) => text.clone(),
            FunctionOutput::Parts(parts) => parts_text(parts),
        }
    }

    /// The content parts, when the output came as a list of them.
    pub fn parts(&self) -> Option<&[ContentPart]> {
        match self {
            FunctionOutput::Text(_) => None,
            FunctionOutput::Parts(parts) => Some(parts),
        }
    }
}

/// A server tool call that the gateway ran, shown to clients as OpenAI's hosted `mcp_call` item.
///
/// `call_id` is the gateway's addition: it pairs the call with the model's tool call id, so a client that
/// replays history keeps calls and results together.
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct McpCallItem {
    pub id: Option<String>,
    pub call_id: Option<String>,
    #[serde(default)]
    pub server_label: String,
    pub name: String,
    pub arguments: String,
    /// Shown as `null` while the call has none, as OpenAI shows it.
    #[serialize_always]
    pub output: Option<String>,
    /// OpenAI's error object (`http_error`, `mcp_tool_execution_error`, ...); older clients send a string.
    #[serialize_always]
    pub error: Option<Value>,
    pub status: Option<String>,
    /// The gateway's own mark, kept in stored context: the hosted tool type whose bound source ran this call.
    /// Clients are shown the hosted item (`web_search_call`) instead (see [`crate::output::client_item_json`]);
    /// models see the call and its output like any server tool call.
    pub hosted_type: Option<String>,
    /// The `mcp_approval_request` whose approval let this call run.
    pub approval_request_id: Option<String>,
}

/// The tools a remote MCP server named in the request listed (SPEC 12). Kept in the chain: a later response of
/// the chain that declares the same `server_label` uses this list instead of listing again.
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct McpListToolsItem {
    pub id: Option<String>,
    pub server_label: String,
    /// `{name, description, input_schema, annotations}` per tool, as the server listed it.
    #[serde(default)]
    pub tools: Vec<Value>,
    #[serialize_always]
    pub error: Option<String>,
}

/// A call of a remote MCP server's tool that waits for the client's approval (SPEC 12).
///
/// `call_id` is the gateway's addition, as on `mcp_call`: it pairs the request with the model's tool call. A
/// request sent back without it pairs by its `id`.
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct McpApprovalRequestItem {
    pub id: Option<String>,
    pub call_id: Option<String>,
    pub server_label: String,
    pub name: String,
    pub arguments: String,
}

impl McpApprovalRequestItem {
    /// The id that pairs this call with its result upstream.
    pub fn pairing_id(&self) -> Option<&str> {
        self.call_id.as_deref().or(self.id.as_deref())
    }
}

/// The client's answer to an `mcp_approval_request`: approved, the call runs; denied, the model is told so.
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct McpApprovalResponseItem {
    pub id: Option<String>,
    pub approval_request_id: String,
    pub approve: bool,
    pub reason: Option<String>,
}

impl McpApprovalResponseItem {
    /// What the model reads in place of the output of a call the client denied.
    pub fn denial_text(&self, name: &str) -> String {
        let mut message = format!("The user denied running the tool '{name}'.");
        if let Some(reason) = self.reason.as_deref().filter(|r| !r.is_empty()) {
            message.push_str(&format!(" Reason: {reason}"));
        }
        serde_json::json!({"error": {"message": message}}).to_string()
    }
}

impl McpCallItem {
    /// The error as text for a model: its `message`, its content's text, or the string it is.
    pub fn error_text(&self) -> Option<String> {
        let error = self.error.as_ref().filter(|e| !e.is_null())?;
        if let Some(text) = error.as_str() {
            return Some(text.to_owned());
        }
        if let Some(message) = error.get("message").and_then(Value::as_str) {
            return Some(message.to_owned());
        }
        let content_text: Vec<&str> = error
            .get("content")
            .and_then(Value::as_array)
            .map(|parts| {
                parts
                    .iter()
                    .filter_map(|p| p.get("text").and_then(Value::as_str))
                    .collect()
            })
            .unwrap_or_default();
        if !content_text.is_empty() {
            return Some(content_text.join(""));
        }
        Some(error.to_string())
    }

    /// The id that pairs this call with its result upstream.
    pub fn pairing_id(&self) -> Option<&str> {
        self.call_id.as_deref().or(self.id.as_deref())
    }
}

#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReasoningItem {
    pub id: Option<String>,
    #[serde(default)]
    pub summary: Vec<Value>,
    pub encrypted_content: Option<String>,
    pub status: Option<String>,
}

/// A compacted window's summary (`POST /v1/responses/compact`), sealed by the gateway: clients carry it back as
/// input but can neither read nor forge it.
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompactionItem {
    pub id: Option<String>,
    pub encrypted_content: String,
    /// The summary once the gateway opened the item: in memory only, never stored or shown.
    #[serde(skip)]
    pub summary: Option<String>,
}

/// How the model reads a compaction's summary: a user message that says what it is.
pub fn summary_message(summary: &str) -> Item {
    Item::user_text(format!(
        "Summary of the earlier conversation, which was compacted:\n{summary}"
    ))
}

/// Writes, from one list of every item kind with its wire `type` and its id prefix, what each kind answers
/// alike: its id, the setting of it, its id prefix and the list of wire types.
macro_rules! item_kinds {
    ($($variant:ident => $wire_type:literal, $prefix:literal;)*) => {
        impl Item {
            /// The wire `type` of every item kind.
            pub const TYPES: &'static [&'static str] = &[$($wire_type),*];

            /// The item's id, when it has one.
            pub fn id(&self) -> Option<&str> {
                match self {
                    $(Item::$variant(item) => item.id.as_deref(),)*
                }
            }

            /// Sets the item's id.
            pub fn set_id(&mut self, id: String) {
                let slot = match self {
                    $(Item::$variant(item) => &mut item.id,)*
                };
                *slot = Some(id);
            }

            /// The prefix of ids the gateway issues for this kind of item.
            pub fn id_prefix(&self) -> &'static str {
                match self {
                    $(Item::$variant(_) => $prefix,)*
                }
            }
        }
    };
}

item_kinds! {
    Message => "message", "msg";
    FunctionCall => "function_call", "fc";
    FunctionCallOutput => "function_call_output", "fco";
    CustomToolCall => "custom_tool_call", "ctc";
    CustomToolCallOutput => "custom_tool_call_output", "ctco";
    McpCall => "mcp_call", "mcp";
    McpListTools => "mcp_list_tools", "mcpl";
    McpApprovalRequest => "mcp_approval_request", "mcpr";
    McpApprovalResponse => "mcp_approval_response", "mcpa";
    Reasoning => "reasoning", "rs";
    Compaction => "compaction", "cmp";
}

impl Item {
    /// The `call_id` of a tool call or tool output: what pairs them.
    pub fn call_id(&self) -> Option<&str> {
        match self {
            Item::FunctionCall(c) => Some(&c.call_id),
            Item::FunctionCallOutput(o) => Some(&o.call_id),
            Item::CustomToolCall(c) => Some(&c.call_id),
            Item::CustomToolCallOutput(o) => Some(&o.call_id),
            Item::McpCall(c) => c.pairing_id(),
            Item::McpApprovalRequest(r) => r.pairing_id(),
            Item::Message(_)
            | Item::Reasoning(_)
            | Item::Compaction(_)
            | Item::McpListTools(_)
            | Item::McpApprovalResponse(_) => None,
        }
    }

    /// A user message holding plain text.
    pub fn user_text(text: impl Into<String>) -> Item {
        Item::Message(MessageItem {
            id: None,
            role: Role::User,
            content: MessageContent::Text(text.into()),
            status: None,
        })
    }
}

/// The text of a list of parts, joined as a chat upstream would read it.
pub fn parts_text(parts: &[ContentPart]) -> String {
    let mut texts = Vec::new();
    for part in parts {
        match part {
            ContentPart::InputText { text } | ContentPart::OutputText { text, .. } => {
                texts.push(text.as_str())
            }
            ContentPart::Refusal { refusal } => texts.push(refusal.as_str()),
            ContentPart::InputImage { .. } | ContentPart::InputFile { .. } => {}
        }
    }
    texts.join("")
}

/// Why an input item could not be read.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct ItemError {
    pub message: String,
}

/// An input item as a client sends it: an item, or a reference to a stored one that the shell resolves.
#[derive(Debug, Clone, PartialEq)]
// Read once per request and turned into items at once: boxing the item would cost an allocation per input item.
#[allow(clippy::large_enum_variant)]
pub enum InputItem {
    Item(Item),
    /// `{"type": "item_reference", "id"}`: stands for a stored item of the same project.
    Reference {
        id: String,
    },
    /// A hosted call item the gateway showed (`web_search_call`), sent back as history: it stands for the stored
    /// call (with its output) when its `id` names one, and for nothing otherwise (it carries no output a model
    /// could pair with it).
    Hosted {
        id: Option<String>,
    },
}

/// The longest `id` a client may give an item: ids are kept in indexes, and read back by path and query
/// parameters, which take at most as many characters.
pub const MAX_ITEM_ID_LEN: usize = 256;

/// Reads one input item as clients send it: messages may omit `type`, item references too.
pub fn parse_input_item(value: Value) -> Result<InputItem, ItemError> {
    let value = match value {
        Value::Object(mut map) => {
            if let Some(Value::String(id)) = map.get("id") {
                if id.chars().count() > MAX_ITEM_ID_LEN {
                    return Err(ItemError {
                        message: format!(
                            "an item's 'id' is at most {MAX_ITEM_ID_LEN} characters; this one has {}",
                            id.chars().count()
                        ),
                    });
                }
            }
            if !map.contains_key("type") || map.get("type") == Some(&Value::Null) {
                if map.contains_key("role") {
                    map.insert("type".into(), Value::String("message".into()));
                } else if map.len() == 1 || (map.len() == 2 && map.contains_key("type")) {
                    map.insert("type".into(), Value::String("item_reference".into()));
                }
            }
            Value::Object(map)
        }
        other => {
            return Err(ItemError {
                message: format!("expected an object, got {}", json_kind(&other)),
            })
        }
    };
    let kind = value
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    match kind.as_str() {
        item_type if Item::TYPES.contains(&item_type) => {
            check_parts(&kind, &value)?;
            serde_json::from_value(value)
                .map(InputItem::Item)
                .map_err(|e| ItemError {
                    message: format!("invalid '{kind}' item: {e}"),
                })
        }
        "web_search_call" => Ok(InputItem::Hosted {
            id: value
                .get("id")
                .and_then(Value::as_str)
                .filter(|id| !id.is_empty())
                .map(str::to_owned),
        }),
        "item_reference" => match value.get("id").and_then(Value::as_str) {
            Some(id) if !id.is_empty() => Ok(InputItem::Reference { id: id.to_owned() }),
            _ => Err(ItemError {
                message: "an 'item_reference' needs the 'id' of a stored item".into(),
            }),
        },
        "" => Err(ItemError {
            message: "an input item needs a 'type' (or a 'role' for a message)".into(),
        }),
        other => Err(ItemError {
            message: format!("input items of type '{other}' are not supported by this gateway"),
        }),
    }
}

/// The content parts of an item of type `kind`, checked before the item is read, so that what is wrong with them
/// is said in the API's terms: a message's `content`, a tool output's `output` when it is a list.
fn check_parts(kind: &str, item: &Value) -> Result<(), ItemError> {
    let field = match kind {
        "message" => "content",
        "function_call_output" | "custom_tool_call_output" => "output",
        _ => return Ok(()),
    };
    let parts = match item.get(field) {
        None | Some(Value::String(_)) => return Ok(()),
        Some(Value::Array(parts)) => parts,
        Some(other) => {
            return Err(ItemError {
                message: format!(
                    "'{field}' must be a string or an array of content parts, but got {}",
                    json_kind(other)
                ),
            })
        }
    };
    for (j, part) in parts.iter().enumerate() {
        let at = format!("{field}[{j}]");
        let Value::Object(part) = part else {
            return Err(ItemError {
                message: format!("'{at}' must be an object, but got {}", json_kind(part)),
            });
        };
        let text = |name: &str| part.get(name).and_then(Value::as_str);
        let given = |name: &str| part.get(name).is_some_and(|v| !v.is_null());
        match text("type") {
            Some("input_text" | "output_text") if text("text").is_none() => {
                return Err(ItemError {
                    message: format!("'{at}' needs a string 'text'"),
                })
            }
            Some("refusal") if text("refusal").is_none() => {
                return Err(ItemError {
                    message: format!("'{at}' needs a string 'refusal'"),
                })
            }
            Some("input_image") if !given("image_url") && !given("file_id") => {
                return Err(ItemError {
                    message: format!(
                        "'{at}' of type 'input_image' needs an 'image_url' (an https: or a data: URL) or a 'file_id'"
                    ),
                })
            }
            Some("input_file") if !given("file_data") && !given("file_url") && !given("file_id") => {
                return Err(ItemError {
                    message: format!(
                        "'{at}' of type 'input_file' needs 'file_data' (a base64 data: URL), 'file_url' or 'file_id'"
                    ),
                })
            }
            Some(
                "input_text" | "output_text" | "refusal" | "input_image" | "input_file",
            ) => {}
            Some(other) => {
                return Err(ItemError {
                    message: format!(
                        "'{at}' has an unknown type '{other}'; expected one of 'input_text', 'output_text', \
                         'refusal', 'input_image' or 'input_file'"
                    ),
                })
            }
            None => {
                return Err(ItemError {
                    message: format!("'{at}' needs a 'type'"),
                })
            }
        }
    }
    Ok(())
}

/// The JSON kind of a value, for error messages.
pub fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn message_without_type_is_read_as_a_message() {
        let item = parse_input_item(json!({"role": "user", "content": "hi"}));
        assert_eq!(item, Ok(InputItem::Item(Item::user_text("hi"))));
    }

    #[test]
    fn replayed_function_call_keeps_its_ids() {
        let item = parse_input_item(
            json!({"type": "function_call", "id": "fc_1", "call_id": "call_1",
            "name": "f", "arguments": "{}", "status": "completed"}),
        );
        let Ok(InputItem::Item(Item::FunctionCall(call))) = item else {
            unreachable!("not a function call: {item:?}")
        };
        assert_eq!(call.id.as_deref(), Some("fc_1"));
        assert_eq!(call.call_id, "call_1");
    }

    #[test]
    fn unknown_item_type_is_named_in_the_error() {
        let err = parse_input_item(json!({"type": "computer_call"})).unwrap_err();
        assert!(err.message.contains("computer_call"), "{}", err.message);
    }

    #[test]
    fn item_references_are_read_with_or_without_their_type() {
        for value in [
            json!({"type": "item_reference", "id": "msg_1"}),
            json!({"id": "msg_1"}),
            json!({"type": null, "id": "msg_1"}),
        ] {
            assert_eq!(
                parse_input_item(value.clone()),
                Ok(InputItem::Reference { id: "msg_1".into() }),
                "{value}"
            );
        }
        let err = parse_input_item(json!({"type": "item_reference"})).unwrap_err();
        assert!(err.message.contains("'id'"), "{}", err.message);
    }

    #[test]
    fn custom_tool_calls_and_outputs_are_read() {
        let call = parse_input_item(
            json!({"type": "custom_tool_call", "call_id": "c1", "name": "apply_patch",
            "input": "*** Begin Patch", "namespace": "edit"}),
        )
        .unwrap();
        let InputItem::Item(Item::CustomToolCall(call)) = call else {
            unreachable!("not a custom tool call: {call:?}")
        };
        assert_eq!(call.input, "*** Begin Patch");
        assert_eq!(call.namespace.as_deref(), Some("edit"));
        let output = parse_input_item(
            json!({"type": "custom_tool_call_output", "call_id": "c1", "output": "done"}),
        )
        .unwrap();
        assert!(matches!(
            output,
            InputItem::Item(Item::CustomToolCallOutput(_))
        ));
    }

    #[test]
    fn every_listed_item_type_is_a_type_serde_reads() {
        let distinct: std::collections::BTreeSet<_> = Item::TYPES.iter().collect();
        assert_eq!(distinct.len(), Item::TYPES.len());
        for item_type in Item::TYPES {
            // A bare `{"type"}` lacks most kinds' fields; only an unknown type is named as such.
            if let Err(err) = serde_json::from_value::<Item>(json!({"type": item_type})) {
                let message = err.to_string();
                assert!(
                    !message.contains("unknown variant"),
                    "{item_type}: {message}"
                );
            }
        }
    }

    #[test]
    fn output_parts_flatten_to_text() {
        let output: FunctionOutput = serde_json::from_value(json!([
            {"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]))
        .unwrap();
        assert_eq!(output.to_text(), "ab");
    }
}
