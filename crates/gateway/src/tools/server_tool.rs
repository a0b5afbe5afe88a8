//! A server tool as a response holds it: what the model is offered, and where its calls go ([`Target`]). The
//! engine builds them (from the operator's tool sources and the request's own MCP servers) and keeps them in a
//! [`ServerTools`] map; the executor dispatches each call on its target.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use gateway_core::entity::{NoteTemplate, ToolPolicy};
use secrecy::SecretString;
use serde_json::Value;

use super::mcp::RemoteAccess;

/// One server tool of a response.
#[derive(Debug, Clone)]
pub struct ServerTool {
    /// The name the model is offered and calls: a source's name, an MCP tool's name with its source's prefix,
    /// or a hosted type (`web_search`) that a source serves.
    pub name: String,
    pub description: String,
    pub parameters: Value,
    pub strict: bool,
    /// Progress-note templates (SPEC 7).
    pub notes: NoteTemplates,
    /// The hosted tool type this tool serves (SPEC 12), if any: its calls show as that type's items.
    pub hosted: Option<String>,
    pub target: Target,
}

impl ServerTool {
    /// Where its calls go, as a log line may name it: `scheme://host[:port]` of an operator's source; the
    /// `server_label` of a request's own server (whose address is the client's).
    pub fn origin(&self) -> String {
        match &self.target {
            Target::Http(endpoint) => super::failure::origin(&endpoint.url),
            Target::Mcp(tool) => super::failure::origin(&tool.server.url),
            Target::Remote(tool) => format!("mcp:{}", tool.server_label),
        }
    }

    /// The name of the source that serves it, as usage counts its calls: an operator's source by its name, a
    /// request's own MCP server as `mcp:<server_label>`.
    pub fn source_name(&self) -> String {
        match &self.target {
            Target::Http(endpoint) => endpoint.source_name.clone(),
            Target::Mcp(tool) => tool.server.source_name.clone(),
            Target::Remote(tool) => format!("mcp:{}", tool.server_label),
        }
    }
}

/// The progress notes a tool's calls render, before they go out and when they end (SPEC 7).
#[derive(Debug, Clone, Default)]
pub struct NoteTemplates {
    pub on_request: Option<NoteTemplate>,
    pub on_result: Option<NoteTemplate>,
}

/// Where a server tool's calls go.
#[derive(Debug, Clone)]
pub enum Target {
    /// An operator's HTTP source: one `POST` per call.
    Http(Endpoint),
    /// One tool of an operator's MCP source: a `tools/call` on its session.
    Mcp(McpTool),
    /// One tool of an MCP server the request names itself (SPEC 12).
    Remote(RemoteTool),
}

/// An operator's tool source as its calls reach it: shared by its HTTP tool, or by every tool of its MCP server.
#[derive(Debug, Clone)]
pub struct Endpoint {
    /// The source's id: the key of its session, calls in flight and breaker.
    pub source_id: String,
    /// The source's name: the `server_label` of its MCP tools' calls.
    pub source_name: String,
    pub url: String,
    /// `0`: the executor's default.
    pub timeout_ms: u64,
    /// Sent as `Authorization: Bearer`; never logged or shown.
    pub secret: Option<SecretString>,
    /// In-flight bound, output cap and breaker (SPEC 7).
    pub policy: ToolPolicy,
}

/// One tool of an operator's MCP source.
#[derive(Debug, Clone)]
pub struct McpTool {
    pub server: Endpoint,
    /// Its name on the server (the offered name may carry the source's prefix).
    pub tool: String,
}

/// One tool of an MCP server a request names.
#[derive(Debug, Clone)]
pub struct RemoteTool {
    /// The server's `server_label`, as the request declares it.
    pub server_label: String,
    /// Its name on the server.
    pub tool: String,
    /// Whether the client approves each call first (SPEC 12).
    pub approval_required: bool,
    pub timeout_ms: u64,
    /// Where and how to reach the server (checked address, credentials); `None` when a resumed response's
    /// server is refused now, and its calls end with error outputs. Never stored: a resumed response declares
    /// the server again in its stored request.
    pub access: Option<Arc<RemoteAccess>>,
}

impl ServerTool {
    /// The `server_label` its calls show: its MCP server's; `None` for an HTTP tool.
    pub fn server_label(&self) -> Option<&str> {
        match &self.target {
            Target::Http(_) => None,
            Target::Mcp(mcp) => Some(&mcp.server.source_name),
            Target::Remote(remote) => Some(&remote.server_label),
        }
    }

    /// Whether its calls wait for the client's approval.
    pub fn approval_required(&self) -> bool {
        matches!(&self.target, Target::Remote(remote) if remote.approval_required)
    }

    /// The `source` label of its metrics: its source's name, or `remote_mcp` for a server a request names.
    pub fn metric_source(&self) -> String {
        match &self.target {
            Target::Http(endpoint) => endpoint.source_name.clone(),
            Target::Mcp(tool) => tool.server.source_name.clone(),
            Target::Remote(_) => "remote_mcp".into(),
        }
    }

    /// The `tool` label of its metrics: its name, or `remote_mcp` for any tool of a server a request names
    /// (whose names are the client's, and would grow the metrics without bound).
    pub fn metric_label(&self) -> String {
        match &self.target {
            Target::Http(_) | Target::Mcp(_) => self.name.clone(),
            Target::Remote(_) => "remote_mcp".into(),
        }
    }

    /// The operator's source it runs on; `None` for a request's own server (no state is shared between requests
    /// over it: no breaker, no bound on calls in flight).
    pub fn endpoint(&self) -> Option<&Endpoint> {
        match &self.target {
            Target::Http(endpoint)
            | Target::Mcp(McpTool {
                server: endpoint, ..
            }) => Some(endpoint),
            Target::Remote(_) => None,
        }
    }

    /// Its policy: its source's, or the default for a request's own server.
    pub fn policy(&self) -> ToolPolicy {
        self.endpoint().map(|e| e.policy).unwrap_or_default()
    }

    /// Its timeout in milliseconds; `0`: the executor's default.
    pub fn timeout_ms(&self) -> u64 {
        match &self.target {
            Target::Http(endpoint)
            | Target::Mcp(McpTool {
                server: endpoint, ..
            }) => endpoint.timeout_ms,
            Target::Remote(remote) => remote.timeout_ms,
        }
    }
}

/// An operator's tool source, before its tools are known: an HTTP source is one tool; an MCP source, the tools
/// its server lists (see [`ToolExecutor::expand`](super::ToolExecutor::expand)).
#[derive(Debug, Clone)]
pub enum Source {
    Http(ServerTool),
    Mcp(McpSource),
}

/// An operator's MCP source, whose tools each become a server tool.
#[derive(Debug, Clone)]
pub struct McpSource {
    pub server: Endpoint,
    /// Given to each of its tools.
    pub strict: bool,
    pub notes: NoteTemplates,
    /// The server's tools offered (`None`: all).
    pub allowed_tools: Option<Vec<String>>,
    /// Put before each of the server's tool names.
    pub name_prefix: Option<String>,
}

impl Source {
    /// The source's name, as the operator gave it.
    pub fn name(&self) -> &str {
        match self {
            Source::Http(tool) => &tool.name,
            Source::Mcp(mcp) => &mcp.server.source_name,
        }
    }
}

/// The server tools of a response, by name, in the order the model is offered them. A name may also be
/// registered without a tool: a resumed response's tool whose source is gone since, whose calls are still the
/// gateway's (they end with an error output), never the client's.
#[derive(Debug, Clone, Default)]
pub struct ServerTools {
    tools: Vec<ServerTool>,
    by_name: HashMap<String, usize>,
    names: BTreeSet<String>,
}

impl ServerTools {
    /// Adds `tool` unless a tool of its name is registered; answers whether it was added.
    pub fn insert(&mut self, tool: ServerTool) -> bool {
        if !self.names.insert(tool.name.clone()) {
            return false;
        }
        self.by_name.insert(tool.name.clone(), self.tools.len());
        self.tools.push(tool);
        true
    }

    /// Registers `name` as a server tool that is no longer available.
    pub fn retire(&mut self, name: String) {
        self.names.insert(name);
    }

    /// The tool named `name`, if it is available.
    pub fn get(&self, name: &str) -> Option<&ServerTool> {
        self.by_name.get(name).map(|&index| &self.tools[index])
    }

    /// Whether `name` is a server tool's, available or not.
    pub fn contains(&self, name: &str) -> bool {
        self.names.contains(name)
    }

    /// Every registered name, available or not: what `decide_next_action` and pairing treat as server tools.
    pub fn names(&self) -> &BTreeSet<String> {
        &self.names
    }

    /// The available tools, in the order the model is offered them.
    pub fn iter(&self) -> std::slice::Iter<'_, ServerTool> {
        self.tools.iter()
    }
}

impl Extend<ServerTool> for ServerTools {
    fn extend<I: IntoIterator<Item = ServerTool>>(&mut self, tools: I) {
        for tool in tools {
            self.insert(tool);
        }
    }
}

impl FromIterator<ServerTool> for ServerTools {
    fn from_iter<I: IntoIterator<Item = ServerTool>>(tools: I) -> ServerTools {
        let mut map = ServerTools::default();
        map.extend(tools);
        map
    }
}

impl IntoIterator for ServerTools {
    type Item = ServerTool;
    type IntoIter = std::vec::IntoIter<ServerTool>;

    fn into_iter(self) -> Self::IntoIter {
        self.tools.into_iter()
    }
}

impl<'a> IntoIterator for &'a ServerTools {
    type Item = &'a ServerTool;
    type IntoIter = std::slice::Iter<'a, ServerTool>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn http(name: &str) -> ServerTool {
        ServerTool {
            name: name.into(),
            description: String::new(),
            parameters: serde_json::json!({"type": "object"}),
            strict: false,
            notes: NoteTemplates::default(),
            hosted: None,
            target: Target::Http(Endpoint {
                source_id: format!("ts_{name}"),
                source_name: name.into(),
                url: "http://127.0.0.1:1/".into(),
                timeout_ms: 0,
                secret: None,
                policy: ToolPolicy::default(),
            }),
        }
    }

    #[test]
    fn the_first_tool_of_a_name_wins_and_the_order_of_insertion_is_kept() {
        let mut tools: ServerTools = [http("b"), http("a")].into_iter().collect();
        let mut second = http("a");
        second.description = "second".into();
        assert!(!tools.insert(second));
        let names: Vec<&str> = tools.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["b", "a"]);
        assert_eq!(tools.get("a").map(|t| t.description.as_str()), Some(""));
    }

    #[test]
    fn a_retired_name_is_a_server_tool_without_a_tool() {
        let mut tools: ServerTools = [http("a")].into_iter().collect();
        tools.retire("gone".into());
        assert!(tools.contains("gone"));
        assert!(tools.get("gone").is_none());
        assert_eq!(tools.iter().count(), 1);
        assert_eq!(
            tools.names().iter().collect::<Vec<_>>(),
            [&"a".to_owned(), &"gone".to_owned()]
        );
    }
}
