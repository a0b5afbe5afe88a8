//! The tools of a request: what the client declares (functions, custom tools, namespaces, MCP servers, hosted
//! tools), how they are checked, what a model is offered (namespaces flattened, custom tools shaped for providers
//! without them), and the way back from the name a model called to the tool the client declared.

use std::collections::{BTreeSet, HashMap};

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{json, Map, Value};

use crate::items::{CustomToolCallItem, FunctionCallItem, FunctionCallOutputItem, Item};
use crate::request::InvalidRequest;
use crate::steps::{CallKind, ToolCall};

/// A function tool, as the client declares it or as a tool source defines it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FunctionTool {
    pub name: String,
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default)]
    pub parameters: Option<Value>,
    #[serde(default)]
    pub strict: Option<bool>,
}

/// A `custom` tool: the model writes free-form text for it, optionally constrained by a grammar (`format`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CustomTool {
    pub name: String,
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default)]
    pub format: Option<Value>,
}

/// A `namespace` tool: a named group of functions and custom tools (as Codex sends its MCP tools).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NamespaceTool {
    pub name: String,
    #[serde(default)]
    pub description: String,
    pub tools: Vec<NamespaceMember>,
}

/// A tool inside a namespace.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum NamespaceMember {
    Function(FunctionTool),
    Custom(CustomTool),
}

/// A tool of a type the gateway does not define itself (`mcp`, `web_search`, `file_search`, ...): its type and
/// the rest of its declaration as sent.
#[derive(Debug, Clone, PartialEq)]
pub struct OtherTool {
    pub kind: String,
    pub settings: Map<String, Value>,
}

impl OtherTool {
    /// A remote MCP server named by the client.
    pub fn is_mcp(&self) -> bool {
        self.kind == "mcp"
    }
}

/// A tool as the request declares it. Stored with the response and echoed in it.
#[derive(Debug, Clone, PartialEq)]
pub enum DeclaredTool {
    Function(FunctionTool),
    Custom(CustomTool),
    Namespace(NamespaceTool),
    /// `mcp` and hosted tool types: served by a bound tool source, or left to the deployment's
    /// `unsupported_tools` policy.
    Other(OtherTool),
}

impl DeclaredTool {
    /// The tool's `type`.
    pub fn kind(&self) -> &str {
        match self {
            DeclaredTool::Function(_) => "function",
            DeclaredTool::Custom(_) => "custom",
            DeclaredTool::Namespace(_) => "namespace",
            DeclaredTool::Other(other) => &other.kind,
        }
    }

    /// The names a model sees for this declaration (flat, for a namespace's members).
    pub fn model_names(&self) -> Vec<String> {
        declared_names(self, "")
            .into_iter()
            .map(|(name, _)| name)
            .collect()
    }

    /// The declaration in the Responses API's shape, as the response echoes it.
    pub fn to_json(&self) -> Value {
        match self {
            DeclaredTool::Function(f) => function_json(f),
            DeclaredTool::Custom(c) => custom_json(c),
            DeclaredTool::Namespace(n) => {
                let tools: Vec<Value> = n
                    .tools
                    .iter()
                    .map(|member| match member {
                        NamespaceMember::Function(f) => function_json(f),
                        NamespaceMember::Custom(c) => custom_json(c),
                    })
                    .collect();
                json!({"type": "namespace", "name": n.name, "description": n.description, "tools": tools})
            }
            DeclaredTool::Other(other) => {
                let mut map = other.settings.clone();
                map.insert("type".into(), json!(other.kind));
                Value::Object(map)
            }
        }
    }

    /// The declaration as a response shows it: an `mcp` server's credentials left out.
    pub fn to_client_json(&self) -> Value {
        match self {
            DeclaredTool::Other(other) if other.is_mcp() => {
                let mut map = crate::remote_mcp::redacted_settings(&other.settings);
                map.insert("type".into(), json!("mcp"));
                Value::Object(map)
            }
            _ => self.to_json(),
        }
    }

    /// Reads a stored declaration. Structure only: requests are checked by [`parse_tools`]. A declaration without
    /// a `type` is a function (as responses stored before other types existed hold them).
    pub fn from_json(value: Value) -> Result<DeclaredTool, serde_json::Error> {
        let Value::Object(mut map) = value else {
            return Err(serde::de::Error::custom("a tool must be an object"));
        };
        let kind = match map.remove("type") {
            Some(Value::String(kind)) => kind,
            None | Some(Value::Null) => "function".to_owned(),
            Some(_) => return Err(serde::de::Error::custom("a tool's 'type' must be a string")),
        };
        Ok(match kind.as_str() {
            "function" => DeclaredTool::Function(serde_json::from_value(Value::Object(map))?),
            "custom" => DeclaredTool::Custom(serde_json::from_value(Value::Object(map))?),
            "namespace" => DeclaredTool::Namespace(serde_json::from_value(Value::Object(map))?),
            _ => DeclaredTool::Other(OtherTool {
                kind,
                settings: map,
            }),
        })
    }
}

impl Serialize for DeclaredTool {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.to_json().serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for DeclaredTool {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<DeclaredTool, D::Error> {
        DeclaredTool::from_json(Value::deserialize(deserializer)?).map_err(serde::de::Error::custom)
    }
}

fn function_json(f: &FunctionTool) -> Value {
    json!({"type": "function", "name": f.name, "description": f.description, "parameters": f.parameters,
           "strict": f.strict})
}

fn custom_json(c: &CustomTool) -> Value {
    let mut map = Map::new();
    map.insert("type".into(), json!("custom"));
    map.insert("name".into(), json!(c.name));
    if let Some(description) = &c.description {
        map.insert("description".into(), json!(description));
    }
    if let Some(format) = &c.format {
        map.insert("format".into(), format.clone());
    }
    Value::Object(map)
}

/// Whether a tool name is one every provider accepts (OpenAI Chat's rule).
pub fn is_valid_tool_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Reads and checks the request's `tools`; every error names the offending `param`.
pub fn parse_tools(values: Vec<Value>) -> Result<Vec<DeclaredTool>, InvalidRequest> {
    let mut tools = Vec::with_capacity(values.len());
    // Flat name -> the param that declared it: two declarations a model would see under one name clash.
    let mut names: HashMap<String, String> = HashMap::new();
    let mut server_labels: BTreeSet<String> = BTreeSet::new();
    for (i, value) in values.into_iter().enumerate() {
        let at = format!("tools[{i}]");
        let tool = parse_tool(value, &at)?;
        if let DeclaredTool::Other(other) = &tool {
            if let Some(Value::String(label)) = other.settings.get("server_label") {
                if other.is_mcp() && !server_labels.insert(label.clone()) {
                    return Err(InvalidRequest::new(
                        format!("Duplicate MCP server_label '{label}' in 'tools'."),
                        format!("{at}.server_label"),
                    ));
                }
            }
        }
        for (flat, param) in declared_names(&tool, &at) {
            if names.insert(flat.clone(), param.clone()).is_some() {
                return Err(InvalidRequest::new(
                    format!("Duplicate tool name '{flat}' in 'tools'."),
                    param,
                ));
            }
        }
        tools.push(tool);
    }
    Ok(tools)
}

fn parse_tool(value: Value, at: &str) -> Result<DeclaredTool, InvalidRequest> {
    let Value::Object(map) = value else {
        return Err(InvalidRequest::new(
            format!("Invalid '{at}': expected an object."),
            at,
        ));
    };
    let kind = match map.get("type") {
        Some(Value::String(kind)) => kind.clone(),
        None | Some(Value::Null) => {
            return Err(InvalidRequest::new(
                format!("Missing required parameter: '{at}.type'."),
                format!("{at}.type"),
            )
            .with_code("missing_required_parameter"))
        }
        Some(_) => {
            return Err(InvalidRequest::new(
                format!("Invalid '{at}.type': expected a string."),
                format!("{at}.type"),
            ))
        }
    };
    match kind.as_str() {
        "function" => Ok(DeclaredTool::Function(parse_function(map, at)?)),
        "custom" => Ok(DeclaredTool::Custom(parse_custom(map, at)?)),
        "namespace" => {
            let name = match map.get("name") {
                Some(Value::String(name)) if !name.is_empty() => name.clone(),
                _ => {
                    return Err(InvalidRequest::new(
                        format!("Invalid '{at}.name': a namespace needs a non-empty name."),
                        format!("{at}.name"),
                    ))
                }
            };
            let description = match map.get("description") {
                Some(Value::String(d)) => d.clone(),
                None | Some(Value::Null) => String::new(),
                Some(_) => {
                    return Err(InvalidRequest::new(
                        format!("Invalid '{at}.description': expected a string."),
                        format!("{at}.description"),
                    ))
                }
            };
            let members = match map.get("tools") {
                Some(Value::Array(members)) if !members.is_empty() => members.clone(),
                _ => {
                    return Err(InvalidRequest::new(
                        format!("Invalid '{at}.tools': a namespace needs a non-empty array of function or custom tools."),
                        format!("{at}.tools"),
                    ))
                }
            };
            let mut tools = Vec::with_capacity(members.len());
            for (j, member) in members.into_iter().enumerate() {
                let member_at = format!("{at}.tools[{j}]");
                match parse_tool(member, &member_at)? {
                    DeclaredTool::Function(f) => tools.push(NamespaceMember::Function(f)),
                    DeclaredTool::Custom(c) => tools.push(NamespaceMember::Custom(c)),
                    other => {
                        return Err(InvalidRequest::new(
                            format!(
                                "Invalid '{member_at}.type': a namespace holds function and custom tools, not '{}'.",
                                other.kind()
                            ),
                            format!("{member_at}.type"),
                        ))
                    }
                }
            }
            Ok(DeclaredTool::Namespace(NamespaceTool {
                name,
                description,
                tools,
            }))
        }
        other if is_tool_type(other) => {
            let mut settings = map;
            settings.remove("type");
            if other == "mcp" {
                crate::remote_mcp::parse_remote_mcp(&settings, at)?;
            }
            Ok(DeclaredTool::Other(OtherTool {
                kind: other.to_owned(),
                settings,
            }))
        }
        other => Err(InvalidRequest::new(
            format!(
                "Invalid '{at}.type': '{}' is not a tool type.",
                other.escape_debug()
            ),
            format!("{at}.type"),
        )),
    }
}

/// Whether `kind` reads as a tool type (`web_search_preview_2025_03_11`, `mcp`, ...): hosted types are many and
/// grow, so any such name is taken and left to the deployment's policy rather than refused outright.
fn is_tool_type(kind: &str) -> bool {
    !kind.is_empty()
        && kind.len() <= 64
        && kind.starts_with(|c: char| c.is_ascii_lowercase())
        && kind
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

/// A tool object typed, an error naming the field at fault (`tools[0].name` for a missing or mistyped name).
fn typed<T: serde::de::DeserializeOwned>(
    map: Map<String, Value>,
    at: &str,
) -> Result<T, InvalidRequest> {
    serde_path_to_error::deserialize(Value::Object(map)).map_err(|error| {
        let path = error.path().to_string();
        let inner = error.into_inner().to_string();
        let field = if path.is_empty() || path == "." {
            inner
                .strip_prefix("missing field `")
                .and_then(|rest| rest.split('`').next())
                .map(str::to_owned)
        } else {
            Some(path)
        };
        let param = match field {
            Some(field) => format!("{at}.{field}"),
            None => at.to_owned(),
        };
        InvalidRequest::new(format!("Invalid '{param}': {inner}."), param)
    })
}

fn parse_function(map: Map<String, Value>, at: &str) -> Result<FunctionTool, InvalidRequest> {
    let tool: FunctionTool = typed(map, at)?;
    check_name(&tool.name, at)?;
    if let Some(params) = &tool.parameters {
        check_parameters(params, &format!("{at}.parameters"))?;
    }
    Ok(tool)
}

fn parse_custom(map: Map<String, Value>, at: &str) -> Result<CustomTool, InvalidRequest> {
    let tool: CustomTool = typed(map, at)?;
    check_name(&tool.name, at)?;
    if let Some(format) = &tool.format {
        let param = format!("{at}.format");
        match format.get("type").and_then(Value::as_str) {
            Some("text") => {}
            Some("grammar") => {
                let syntax_ok = matches!(
                    format.get("syntax").and_then(Value::as_str),
                    Some("lark" | "regex")
                );
                if !syntax_ok || !format.get("definition").is_some_and(Value::is_string) {
                    return Err(InvalidRequest::new(
                        format!("Invalid '{param}': a grammar format needs 'syntax' ('lark' or 'regex') and a string 'definition'."),
                        param,
                    ));
                }
            }
            _ => {
                return Err(InvalidRequest::new(
                    format!("Invalid '{param}.type': expected 'text' or 'grammar'."),
                    format!("{param}.type"),
                ))
            }
        }
    }
    Ok(tool)
}

fn check_name(name: &str, at: &str) -> Result<(), InvalidRequest> {
    if is_valid_tool_name(name) {
        return Ok(());
    }
    Err(InvalidRequest::new(
        format!(
            "Invalid '{at}.name': '{}' must match ^[a-zA-Z0-9_-]{{1,64}}$.",
            name.escape_debug()
        ),
        format!("{at}.name"),
    ))
}

/// A function's `parameters` must be a JSON Schema object that compiles: a model offered a broken schema fails
/// later, upstream, where the client cannot see why.
pub fn check_parameters(params: &Value, param: &str) -> Result<(), InvalidRequest> {
    if !params.is_object() {
        return Err(InvalidRequest::new(
            format!("Invalid '{param}': expected a JSON Schema object."),
            param,
        ));
    }
    if let Err(error) = jsonschema::validator_for(params) {
        let mut detail = error.to_string();
        if detail.len() > 300 {
            let cut = (0..=300)
                .rev()
                .find(|&i| detail.is_char_boundary(i))
                .unwrap_or(0);
            detail.truncate(cut);
        }
        return Err(InvalidRequest::new(
            format!("Invalid '{param}': not a valid JSON Schema: {detail}"),
            param,
        )
        .with_code("invalid_function_parameters"));
    }
    Ok(())
}

/// The flat names a declaration shows the model, each with the param that declared it.
fn declared_names(tool: &DeclaredTool, at: &str) -> Vec<(String, String)> {
    match tool {
        DeclaredTool::Function(f) => vec![(f.name.clone(), format!("{at}.name"))],
        DeclaredTool::Custom(c) => vec![(c.name.clone(), format!("{at}.name"))],
        DeclaredTool::Namespace(n) => n
            .tools
            .iter()
            .enumerate()
            .map(|(j, member)| {
                (
                    flat_name(Some(&n.name), member.name()),
                    format!("{at}.tools[{j}].name"),
                )
            })
            .collect(),
        DeclaredTool::Other(_) => Vec::new(),
    }
}

impl NamespaceMember {
    pub fn name(&self) -> &str {
        match self {
            NamespaceMember::Function(f) => &f.name,
            NamespaceMember::Custom(c) => &c.name,
        }
    }
}

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

    /// For a provider without custom tools: a free-form tool becomes a function of one string, `input`.
    pub fn as_function(&self) -> OfferedTool {
        match &self.input {
            ToolInput::Json { .. } => self.clone(),
            ToolInput::Text { format } => OfferedTool {
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
            },
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
        *tool = tool.as_function();
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

/// What a deployment does with a declared tool that no model is offered and no bound source serves (SPEC 12).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UnsupportedTools {
    /// Leave it out of what the model sees, and list its type under `metadata.gateway_ignored_tools`.
    #[default]
    Ignore,
    /// Refuse the request.
    Reject,
}

impl UnsupportedTools {
    pub fn as_str(self) -> &'static str {
        match self {
            UnsupportedTools::Ignore => "ignore",
            UnsupportedTools::Reject => "reject",
        }
    }

    pub fn parse(text: &str) -> Option<UnsupportedTools> {
        match text {
            "ignore" => Some(UnsupportedTools::Ignore),
            "reject" => Some(UnsupportedTools::Reject),
            _ => None,
        }
    }
}

/// The `metadata` key that lists the tool types a response left out.
pub const IGNORED_TOOLS_KEY: &str = "gateway_ignored_tools";

/// The declared tools that nothing serves, by index: types other than function, custom and namespace that are
/// not in `served` (the hosted types bound to a tool source for this key).
pub fn unserved_tools<'a>(
    tools: &'a [DeclaredTool],
    served: &BTreeSet<String>,
) -> Vec<(usize, &'a str)> {
    tools
        .iter()
        .enumerate()
        .filter_map(|(i, tool)| match tool {
            // A remote MCP server is served by the gateway itself, or the request refused (SPEC 12).
            DeclaredTool::Other(other) if !other.is_mcp() && !served.contains(&other.kind) => {
                Some((i, other.kind.as_str()))
            }
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests;
