//! Remote MCP servers that a request names (`{"type": "mcp", "server_url", ...}`, SPEC 12): the declaration read
//! and checked, which of their tools need the client's approval, the listing kept in the chain, and what the
//! response echoes of them (never their credentials).

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{json, Map, Value};

use crate::items::{Item, McpListToolsItem};
use crate::request::InvalidRequest;
use crate::toolset::{is_valid_tool_name, DeclaredTool};

/// A remote MCP server as the request declares it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteMcpServer {
    pub server_label: String,
    pub server_url: String,
    /// Sent with every request to the server (credentials included): never logged, echoed or shown a model.
    pub headers: BTreeMap<String, String>,
    /// An OAuth access token, sent as `Authorization: Bearer`.
    pub authorization: Option<String>,
    /// The server's tools offered to the model (`None`: all it lists).
    pub allowed_tools: Option<BTreeSet<String>>,
    pub approval: ApprovalPolicy,
    pub server_description: Option<String>,
}

/// Which of a server's tools wait for the client's approval (`require_approval`; OpenAI's default is `always`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApprovalPolicy {
    /// For a tool named in neither list.
    pub by_default: bool,
    pub always: BTreeSet<String>,
    pub never: BTreeSet<String>,
}

impl Default for ApprovalPolicy {
    fn default() -> Self {
        ApprovalPolicy {
            by_default: true,
            always: BTreeSet::new(),
            never: BTreeSet::new(),
        }
    }
}

impl ApprovalPolicy {
    /// Whether a call of `tool` waits for the client's approval.
    pub fn requires(&self, tool: &str) -> bool {
        if self.always.contains(tool) {
            return true;
        }
        if self.never.contains(tool) {
            return false;
        }
        self.by_default
    }
}

impl RemoteMcpServer {
    /// Whether the model is offered `tool` of this server.
    pub fn allows(&self, tool: &str) -> bool {
        self.allowed_tools
            .as_ref()
            .is_none_or(|allowed| allowed.contains(tool))
    }
}

/// Reads the settings of an `mcp` tool declared at `at` (`tools[2]`); every error names its `param`.
pub fn parse_remote_mcp(
    settings: &Map<String, Value>,
    at: &str,
) -> Result<RemoteMcpServer, InvalidRequest> {
    let invalid = |field: &str, message: String| {
        let param = format!("{at}.{field}");
        InvalidRequest::new(format!("Invalid '{param}': {message}"), param)
    };
    let server_label = match settings.get("server_label") {
        Some(Value::String(label)) if is_valid_tool_name(label) => label.clone(),
        Some(Value::String(label)) if !label.is_empty() => {
            return Err(invalid(
                "server_label",
                format!(
                    "'{}' must match ^[a-zA-Z0-9_-]{{1,64}}$.",
                    label.escape_debug()
                ),
            ))
        }
        _ => {
            return Err(InvalidRequest::new(
                format!("Missing required parameter: '{at}.server_label'."),
                format!("{at}.server_label"),
            )
            .with_code("missing_required_parameter"))
        }
    };
    for unsupported in ["connector_id", "tunnel_id"] {
        if settings.get(unsupported).is_some_and(|v| !v.is_null()) {
            return Err(invalid(
                unsupported,
                "this gateway reaches MCP servers by 'server_url' only.".into(),
            ));
        }
    }
    let server_url = match settings.get("server_url") {
        Some(Value::String(url)) if !url.is_empty() => url.clone(),
        None | Some(Value::Null) => {
            return Err(InvalidRequest::new(
                format!("Missing required parameter: '{at}.server_url'."),
                format!("{at}.server_url"),
            )
            .with_code("missing_required_parameter"))
        }
        Some(_) => {
            return Err(invalid(
                "server_url",
                "expected the URL of an MCP server, as a string.".into(),
            ))
        }
    };
    let headers = match settings.get("headers") {
        None | Some(Value::Null) => BTreeMap::new(),
        Some(Value::Object(map)) => {
            let mut headers = BTreeMap::new();
            for (name, value) in map {
                let Value::String(value) = value else {
                    return Err(invalid(
                        &format!("headers.{name}"),
                        "header values must be strings.".into(),
                    ));
                };
                if !is_header_name(name) {
                    return Err(invalid(
                        "headers",
                        format!("'{}' is not a valid HTTP header name.", name.escape_debug()),
                    ));
                }
                if is_reserved_header(name) {
                    return Err(invalid(
                        &format!("headers.{name}"),
                        format!(
                            "'{name}' is set by the gateway's HTTP client or MCP session, not by a request."
                        ),
                    ));
                }
                // The value is a credential: the message never quotes it.
                if value.bytes().any(|b| (b < 0x20 && b != b'\t') || b == 0x7f) {
                    return Err(invalid(
                        &format!("headers.{name}"),
                        "header values may not hold control characters.".into(),
                    ));
                }
                headers.insert(name.clone(), value.clone());
            }
            headers
        }
        Some(_) => {
            return Err(invalid(
                "headers",
                "expected an object of header names to string values.".into(),
            ))
        }
    };
    let authorization = match settings.get("authorization") {
        None | Some(Value::Null) => None,
        Some(Value::String(token)) => Some(token.clone()),
        Some(_) => return Err(invalid("authorization", "expected a string.".into())),
    };
    let allowed_tools = match settings.get("allowed_tools") {
        None | Some(Value::Null) => None,
        Some(value) => Some(tool_names(value).ok_or_else(|| {
            invalid(
                "allowed_tools",
                "expected an array of tool names or an object with 'tool_names'.".into(),
            )
        })?),
    };
    let approval = match settings.get("require_approval") {
        None | Some(Value::Null) => ApprovalPolicy::default(),
        Some(Value::String(setting)) if setting == "always" => ApprovalPolicy::default(),
        Some(Value::String(setting)) if setting == "never" => ApprovalPolicy {
            by_default: false,
            ..ApprovalPolicy::default()
        },
        Some(Value::Object(filters)) if filters.keys().all(|k| k == "always" || k == "never") => {
            let list = |key: &str| match filters.get(key) {
                None | Some(Value::Null) => Some(BTreeSet::new()),
                Some(filter) => tool_names(filter),
            };
            match (list("always"), list("never")) {
                (Some(always), Some(never)) => ApprovalPolicy {
                    by_default: true,
                    always,
                    never,
                },
                _ => {
                    return Err(invalid(
                        "require_approval",
                        "'always' and 'never' take an object with 'tool_names'.".into(),
                    ))
                }
            }
        }
        Some(_) => {
            return Err(invalid(
                "require_approval",
                "expected 'always', 'never', or an object with 'always' and/or 'never' filters."
                    .into(),
            ))
        }
    };
    let server_description = settings
        .get("server_description")
        .and_then(Value::as_str)
        .map(str::to_owned);
    Ok(RemoteMcpServer {
        server_label,
        server_url,
        headers,
        authorization,
        allowed_tools,
        approval,
        server_description,
    })
}

/// Whether `name` is an HTTP header name (an RFC 9110 token).
fn is_header_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// Headers a request may not give its server (case-insensitive): framing and connection headers that would let it
/// smuggle or reshape the gateway's HTTP requests, proxy headers, and the MCP session headers that the gateway's
/// MCP client owns.
const RESERVED_HEADERS: [&str; 9] = [
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "upgrade",
    "te",
    "trailer",
    "mcp-session-id",
    "mcp-protocol-version",
];

/// Whether `name` is one a request may not set (see [`RESERVED_HEADERS`]), or any `Proxy-*` header.
fn is_reserved_header(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    RESERVED_HEADERS.contains(&lower.as_str()) || lower.starts_with("proxy-")
}

/// Tool names given as an array of strings or as a filter object (`{"tool_names": [...]}`).
fn tool_names(value: &Value) -> Option<BTreeSet<String>> {
    let names = match value {
        Value::Array(names) => names,
        Value::Object(filter) => match filter.get("tool_names") {
            Some(Value::Array(names)) => names,
            None | Some(Value::Null) => return Some(BTreeSet::new()),
            Some(_) => return None,
        },
        _ => return None,
    };
    names
        .iter()
        .map(|name| name.as_str().map(str::to_owned))
        .collect()
}

/// The remote MCP servers a request declares, with their index in `tools`. The request was checked when it was
/// read, so a declaration that does not read is skipped.
pub fn remote_servers(tools: &[DeclaredTool]) -> Vec<(usize, RemoteMcpServer)> {
    tools
        .iter()
        .enumerate()
        .filter_map(|(index, tool)| match tool {
            DeclaredTool::Other(other) if other.is_mcp() => {
                parse_remote_mcp(&other.settings, &format!("tools[{index}]"))
                    .ok()
                    .map(|server| (index, server))
            }
            _ => None,
        })
        .collect()
}

/// The most recent listing of the server `server_label` in a conversation, if one succeeded: a chain lists a
/// server once, and later responses use what it listed (SPEC 12).
pub fn listed_in_chain<'a>(
    context: &'a [Item],
    server_label: &str,
) -> Option<&'a McpListToolsItem> {
    context.iter().rev().find_map(|item| match item {
        Item::McpListTools(listing)
            if listing.server_label == server_label && listing.error.is_none() =>
        {
            Some(listing)
        }
        _ => None,
    })
}

/// One tool of a listing, in the `mcp_list_tools` item's shape.
pub fn listed_tool(
    name: &str,
    description: Option<&str>,
    input_schema: Value,
    annotations: Option<Value>,
) -> Value {
    json!({
        "name": name,
        "description": description,
        "input_schema": input_schema,
        "annotations": annotations,
    })
}

/// An `mcp` declaration as a response echoes it: its `authorization` left out and its header values hidden.
pub fn redacted_settings(settings: &Map<String, Value>) -> Map<String, Value> {
    let mut shown = settings.clone();
    shown.remove("authorization");
    if let Some(Value::Object(headers)) = shown.get_mut("headers") {
        for value in headers.values_mut() {
            *value = Value::String("<redacted>".into());
        }
    }
    shown
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(value: Value) -> Map<String, Value> {
        match value {
            Value::Object(map) => map,
            _ => Map::new(),
        }
    }

    #[test]
    fn a_declaration_reads_with_its_filters_and_credentials() {
        let server = parse_remote_mcp(
            &settings(json!({
                "server_label": "calc", "server_url": "https://mcp.example.com/mcp",
                "headers": {"X-Key": "k"}, "authorization": "tok",
                "allowed_tools": {"tool_names": ["add", "mul"]},
                "require_approval": {"never": {"tool_names": ["add"]}},
            })),
            "tools[0]",
        )
        .unwrap();
        assert_eq!(server.server_label, "calc");
        assert_eq!(server.headers["X-Key"], "k");
        assert_eq!(server.authorization.as_deref(), Some("tok"));
        assert!(server.allows("mul") && !server.allows("div"));
        assert!(!server.approval.requires("add"));
        assert!(
            server.approval.requires("mul"),
            "unlisted tools need approval"
        );
    }

    #[test]
    fn approval_defaults_to_always_and_never_turns_it_off() {
        let read = |approval: Value| {
            parse_remote_mcp(
                &settings(
                    json!({"server_label": "s", "server_url": "http://h/", "require_approval": approval}),
                ),
                "tools[0]",
            )
        };
        assert!(read(Value::Null).unwrap().approval.requires("x"));
        assert!(read(json!("always")).unwrap().approval.requires("x"));
        assert!(!read(json!("never")).unwrap().approval.requires("x"));
        let filtered =
            read(json!({"always": {"tool_names": ["x"]}, "never": {"tool_names": ["y"]}}))
                .unwrap()
                .approval;
        assert!(filtered.requires("x") && !filtered.requires("y"));
        let err = read(json!("sometimes")).unwrap_err();
        assert_eq!(err.param.as_deref(), Some("tools[0].require_approval"));
    }

    #[test]
    fn bad_declarations_name_the_field_at_fault() {
        let cases = [
            (json!({"server_url": "http://h/"}), "tools[1].server_label"),
            (json!({"server_label": "s"}), "tools[1].server_url"),
            (
                json!({"server_label": "a b", "server_url": "http://h/"}),
                "tools[1].server_label",
            ),
            (
                json!({"server_label": "s", "connector_id": "connector_gmail"}),
                "tools[1].connector_id",
            ),
            (
                json!({"server_label": "s", "server_url": "http://h/", "headers": {"a": 1}}),
                "tools[1].headers.a",
            ),
            (
                json!({"server_label": "s", "server_url": "http://h/", "allowed_tools": "add"}),
                "tools[1].allowed_tools",
            ),
            (
                json!({"server_label": "s", "server_url": "http://h/", "headers": {"a b": "x"}}),
                "tools[1].headers",
            ),
            (
                json!({"server_label": "s", "server_url": "http://h/", "headers": {"X-Key": "a\nb"}}),
                "tools[1].headers.X-Key",
            ),
            (
                json!({"server_label": "s", "server_url": 5}),
                "tools[1].server_url",
            ),
            (
                json!({"server_label": "s", "server_url": "http://h/", "headers": {"hOsT": "x"}}),
                "tools[1].headers.hOsT",
            ),
            (
                json!({"server_label": "s", "server_url": "http://h/", "headers": {"Proxy-Foo": "x"}}),
                "tools[1].headers.Proxy-Foo",
            ),
            (
                json!({"server_label": "s", "server_url": "http://h/", "headers": {"MCP-SESSION-ID": "x"}}),
                "tools[1].headers.MCP-SESSION-ID",
            ),
        ];
        for (declared, param) in cases {
            let err = parse_remote_mcp(&settings(declared.clone()), "tools[1]").unwrap_err();
            assert_eq!(err.param.as_deref(), Some(param), "{declared}");
        }
    }

    #[test]
    fn headers_the_gateway_sets_itself_are_refused_whatever_their_case() {
        for name in [
            "Host",
            "content-length",
            "Transfer-Encoding",
            "CONNECTION",
            "Upgrade",
            "te",
            "Trailer",
            "Proxy-Authorization",
            "proxy-connection",
            "Mcp-Session-Id",
            "mcp-protocol-version",
        ] {
            let err = parse_remote_mcp(
                &settings(
                    json!({"server_label": "s", "server_url": "http://h/", "headers": {name: "v"}}),
                ),
                "tools[0]",
            )
            .unwrap_err();
            assert_eq!(
                err.param.as_deref(),
                Some(format!("tools[0].headers.{name}").as_str())
            );
        }
        for name in ["X-Key", "Authorization", "Tea", "Proxy", "Mcp-Other"] {
            let read = parse_remote_mcp(
                &settings(
                    json!({"server_label": "s", "server_url": "http://h/", "headers": {name: "v"}}),
                ),
                "tools[0]",
            );
            assert!(read.is_ok(), "{name}: {read:?}");
        }
    }

    #[test]
    fn the_echo_keeps_no_credential() {
        let shown = redacted_settings(&settings(json!({
            "server_label": "s", "server_url": "http://h/", "authorization": "tok", "headers": {"X-Key": "k"},
        })));
        let text = Value::Object(shown).to_string();
        assert!(!text.contains("tok") && !text.contains("\"k\""), "{text}");
        assert!(text.contains("X-Key"), "header names stay: {text}");
    }

    #[test]
    fn the_chain_s_latest_successful_listing_is_used() {
        let listing = |id: &str, error: Option<&str>| {
            Item::McpListTools(McpListToolsItem {
                id: Some(id.into()),
                server_label: "calc".into(),
                tools: Vec::new(),
                error: error.map(str::to_owned),
            })
        };
        let context = vec![
            listing("mcpl_1", None),
            listing("mcpl_2", None),
            listing("mcpl_3", Some("down")),
        ];
        assert_eq!(
            listed_in_chain(&context, "calc").and_then(|l| l.id.as_deref()),
            Some("mcpl_2")
        );
        assert!(listed_in_chain(&context, "other").is_none());
    }
}
