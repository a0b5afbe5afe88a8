//! The tools of a request as the client declares them (functions, custom tools, namespaces, MCP servers, hosted
//! tools), read and checked; what a model is offered of them is `offered`, `tool_choice` is `choice`, and what a
//! deployment does with tools nothing serves is `unsupported`.

mod choice;
mod offered;
mod unsupported;

pub use choice::{forced_tool_name, model_tool_choice, validate_tool_choice};
pub use offered::{
    call_item, custom_as_functions, flat_name, flatten_namespaces, name_calls,
    offered_client_tools, unwrap_custom_inputs, OfferedTool, ToolInput,
};
pub use unsupported::{unserved_tools, UnsupportedTools, IGNORED_TOOLS_KEY};

use std::collections::{BTreeSet, HashMap};

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{json, Map, Value};

use crate::request::InvalidRequest;

/// A function tool, as the client declares it or as a tool source defines it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FunctionTool {
    pub name: String,
    pub description: Option<String>,
    pub parameters: Option<Value>,
    pub strict: Option<bool>,
}

/// A `custom` tool: the model writes free-form text for it, optionally constrained by a grammar (`format`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CustomTool {
    pub name: String,
    pub description: Option<String>,
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
pub(super) fn is_tool_type(kind: &str) -> bool {
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

#[cfg(test)]
mod tests;
