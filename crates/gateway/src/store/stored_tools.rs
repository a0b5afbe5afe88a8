//! The server tools a response started with, as its row keeps them (`responses.server_tools`, a JSON array):
//! read back when a replica resumes it. Rows written by earlier versions read as they were written.

use gateway_core::entity::{NoteTemplate, ToolPolicy};
use serde::{Deserialize, Serialize};

/// One server tool of a stored response, without its secret or the way to a request's own server.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoredTool {
    /// Its source's id; `remote:{server_label}` for a tool of a request's own server.
    pub id: String,
    /// The name the model was offered.
    pub name: String,
    pub description: String,
    pub parameters: serde_json::Value,
    /// Its source's URL; empty for a tool of a request's own server. Kept so that earlier versions read the row.
    pub url: String,
    pub timeout_ms: u64,
    pub strict: bool,
    #[serde(default)]
    pub policy: ToolPolicy,
    pub note_on_request: Option<NoteTemplate>,
    pub note_on_result: Option<NoteTemplate>,
    pub hosted_type: Option<String>,
    #[serde(default)]
    pub kind: StoredToolKind,
    /// Not written any more (earlier versions wrote the source's); never read.
    pub allowed_tools: Option<Vec<String>>,
    /// Not written any more (earlier versions wrote the source's); never read.
    pub name_prefix: Option<String>,
    /// Its name on its MCP server.
    pub mcp_tool: Option<String>,
    /// Its MCP server's `server_label`.
    pub server_label: Option<String>,
    /// For a tool of a request's own server: whether the client approves each call first.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub approval_required: bool,
}

/// Where a stored tool's calls went.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StoredToolKind {
    /// An operator's HTTP source.
    #[default]
    Http,
    /// A tool of an operator's MCP source.
    Mcp,
    /// A tool of an MCP server the request names.
    Remote,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use serde_json::json;

    /// `responses.server_tools` as the version before `StoredTool` wrote it: an HTTP tool bound to a hosted type,
    /// an MCP source's tool and a tool of a request's own server.
    fn written_before() -> serde_json::Value {
        json!([
            {"id": "ts_1", "name": "web_search", "description": "Search", "parameters": {"type": "object"},
             "url": "http://127.0.0.1:9/search", "timeout_ms": 5000, "strict": true,
             "policy": {"max_in_flight": 2, "max_output_bytes": null, "breaker_failures": null, "breaker_cooldown_ms": null},
             "note_on_request": "Searching {query}", "note_on_result": null, "hosted_type": "web_search",
             "kind": "http", "allowed_tools": null, "name_prefix": null, "mcp_tool": null, "server_label": null},
            {"id": "ts_2", "name": "docs_lookup", "description": "", "parameters": {"type": "object"},
             "url": "http://127.0.0.1:9/mcp", "timeout_ms": 0, "strict": false,
             "policy": {"max_in_flight": null, "max_output_bytes": null, "breaker_failures": null, "breaker_cooldown_ms": null},
             "note_on_request": null, "note_on_result": null, "hosted_type": null, "kind": "mcp",
             "allowed_tools": ["lookup"], "name_prefix": "docs_", "mcp_tool": "lookup", "server_label": "docs"},
            {"id": "remote:deepwiki", "name": "ask", "description": "Ask", "parameters": {"type": "object"},
             "url": "", "timeout_ms": 30000, "strict": false,
             "policy": {"max_in_flight": null, "max_output_bytes": null, "breaker_failures": null, "breaker_cooldown_ms": null},
             "note_on_request": null, "note_on_result": null, "hosted_type": null, "kind": "remote",
             "allowed_tools": null, "name_prefix": null, "mcp_tool": "ask", "server_label": "deepwiki",
             "approval_required": true}
        ])
    }

    #[test]
    fn a_row_written_before_reads_as_it_was_written_and_writes_back_the_same() {
        let tools: Vec<StoredTool> = serde_json::from_value(written_before()).unwrap();
        let kinds: Vec<StoredToolKind> = tools.iter().map(|t| t.kind).collect();
        assert_eq!(
            kinds,
            [
                StoredToolKind::Http,
                StoredToolKind::Mcp,
                StoredToolKind::Remote
            ]
        );
        assert_eq!(tools[0].policy.max_in_flight, Some(2));
        assert!(tools[0].note_on_request.is_some());
        assert_eq!(tools[1].mcp_tool.as_deref(), Some("lookup"));
        assert!(tools[2].approval_required);
        assert_eq!(serde_json::to_value(&tools).unwrap(), written_before());
    }

    #[test]
    fn a_row_with_only_the_fields_every_version_wrote_reads() {
        let tools: Vec<StoredTool> = serde_json::from_value(json!([
            {"id": "ts_1", "name": "add", "description": "", "parameters": {}, "url": "http://h/", "timeout_ms": 1,
             "strict": false}
        ]))
        .unwrap();
        assert_eq!(tools[0].kind, StoredToolKind::Http);
        assert!(!tools[0].approval_required);
    }
}
