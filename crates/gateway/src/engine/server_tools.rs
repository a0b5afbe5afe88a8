//! Where a response's server tools come from and how they are kept: the operator's tool sources (store rows)
//! made into [`ServerTool`]s, the hosted binding applied, and the tools written with the response as
//! [`StoredTool`] rows, read back when a replica resumes it.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use gateway_core::preparation::{bind_hosted, Bindable, RemoteName};
use gateway_core::steps::{Step, StepBody, StepState, ToolCall, ToolStep};
use gateway_core::toolset::DeclaredTool;

use crate::ids::item_id;
use crate::store::stored_tools::{StoredTool, StoredToolKind};
use crate::store::tenancy::{SourceKind, ToolSource};
use crate::tools::{
    Endpoint, McpSource, NoteTemplates, RemoteTool, ServerTool, ServerTools, Source, Target,
};

/// The tool source a row describes: an HTTP source's one tool, or an MCP server whose tools are listed.
pub(super) fn source_of(row: ToolSource) -> Source {
    let server = Endpoint {
        source_id: row.id,
        source_name: row.name,
        url: row.url,
        timeout_ms: row.timeout_ms,
        secret: row.secret,
        policy: row.policy,
    };
    let notes = NoteTemplates {
        on_request: row.note_on_request,
        on_result: row.note_on_result,
    };
    match row.kind {
        SourceKind::Http => Source::Http(ServerTool {
            name: server.source_name.clone(),
            description: row.description,
            parameters: row.parameters,
            strict: row.strict,
            notes,
            hosted: row.hosted_type,
            target: Target::Http(server),
        }),
        SourceKind::Mcp => Source::Mcp(McpSource {
            server,
            strict: row.strict,
            notes,
            allowed_tools: row.allowed_tools,
            name_prefix: row.name_prefix,
        }),
    }
}

/// The tools a request may use, given the hosted tools it declares (see
/// [`bind_hosted`](gateway_core::preparation::bind_hosted)): a bound tool renamed after the type it serves,
/// one the request does not ask for left out. Answers the hosted types served too.
pub(super) fn bind_hosted_tools(
    tools: Vec<ServerTool>,
    declared: &[DeclaredTool],
) -> (ServerTools, BTreeSet<String>) {
    let bindable: Vec<Bindable<'_>> = tools
        .iter()
        .map(|t| Bindable {
            name: &t.name,
            hosted: t.hosted.as_deref(),
        })
        .collect();
    let binding = bind_hosted(&bindable, declared);
    let mut bound = ServerTools::default();
    for (mut tool, offered_as) in tools.into_iter().zip(binding.offered_as) {
        match offered_as {
            Some(name) => {
                tool.name = name;
                bound.insert(tool);
            }
            None if tool.hosted.is_some() => {
                tracing::debug!(tool.name = %tool.name, "a hosted binding is not used by this request");
            }
            None => {}
        }
    }
    (bound, binding.served)
}

/// The names of the tools of the request's own servers, for [`check_remote_names`](gateway_core::preparation::check_remote_names).
pub(super) fn remote_names(tools: &[ServerTool]) -> Vec<RemoteName<'_>> {
    tools
        .iter()
        .map(|t| RemoteName {
            name: &t.name,
            server_label: t.server_label().unwrap_or_default(),
        })
        .collect()
}

/// A pending step for `call`, shown as its tool's item (a hosted type's item when it serves one).
pub(super) fn unsent_step(
    tools: &ServerTools,
    call: ToolCall,
    batch: Option<u32>,
    hosted_items: bool,
    response_id: &str,
) -> Step {
    let tool = tools.get(&call.name);
    let hosted_type = tool.and_then(|t| t.hosted.clone()).filter(|_| hosted_items);
    let prefix = gateway_core::output::tool_item_prefix(hosted_type.as_deref());
    let server_label = tool.and_then(|t| t.server_label().map(str::to_owned));
    Step {
        seq: 0,
        state: StepState::Pending,
        body: StepBody::Tool(ToolStep::unsent(
            item_id(prefix, response_id),
            call,
            batch,
            server_label,
            hosted_type,
        )),
    }
}

/// The rows a response keeps of its server tools, in the shape every version reads.
pub(super) fn stored(tools: &ServerTools) -> Vec<StoredTool> {
    tools.iter().map(stored_tool).collect()
}

fn stored_tool(tool: &ServerTool) -> StoredTool {
    let (id, url, kind, mcp_tool, approval_required) = match &tool.target {
        Target::Http(endpoint) => (
            endpoint.source_id.clone(),
            endpoint.url.clone(),
            StoredToolKind::Http,
            None,
            false,
        ),
        Target::Mcp(mcp) => (
            mcp.server.source_id.clone(),
            mcp.server.url.clone(),
            StoredToolKind::Mcp,
            Some(mcp.tool.clone()),
            false,
        ),
        Target::Remote(remote) => (
            remote_id(&remote.server_label),
            String::new(),
            StoredToolKind::Remote,
            Some(remote.tool.clone()),
            remote.approval_required,
        ),
    };
    StoredTool {
        id,
        name: tool.name.clone(),
        description: tool.description.clone(),
        parameters: tool.parameters.clone(),
        url,
        timeout_ms: tool.timeout_ms(),
        strict: tool.strict,
        policy: tool.policy(),
        note_on_request: tool.notes.on_request.clone(),
        note_on_result: tool.notes.on_result.clone(),
        hosted_type: tool.hosted.clone(),
        kind,
        allowed_tools: None,
        name_prefix: None,
        mcp_tool,
        server_label: tool.server_label().map(str::to_owned),
        approval_required,
    }
}

/// The id a tool of a request's own server is stored under.
fn remote_id(server_label: &str) -> String {
    format!("remote:{server_label}")
}

/// The ids of the operator's sources a stored response's tools ran on, each once.
pub(super) fn stored_source_ids(stored: &[StoredTool]) -> Vec<String> {
    let mut ids: Vec<String> = stored
        .iter()
        .filter(|t| t.kind != StoredToolKind::Remote)
        .map(|t| t.id.clone())
        .collect();
    // The tools of one MCP source share its id.
    ids.sort();
    ids.dedup();
    ids
}

/// The tools of the request's own servers, as a response stored them: without the way to their servers, which
/// the request declares again.
pub(super) fn stored_remote_tools(stored: &[StoredTool]) -> Vec<ServerTool> {
    stored
        .iter()
        .filter(|t| t.kind == StoredToolKind::Remote)
        .map(|t| ServerTool {
            name: t.name.clone(),
            description: t.description.clone(),
            parameters: t.parameters.clone(),
            strict: t.strict,
            notes: NoteTemplates::default(),
            hosted: None,
            target: Target::Remote(RemoteTool {
                server_label: t.server_label.clone().unwrap_or_default(),
                tool: t.mcp_tool.clone().unwrap_or_else(|| t.name.clone()),
                approval_required: t.approval_required,
                timeout_ms: t.timeout_ms,
                access: None,
            }),
        })
        .collect()
}

/// A resumed response's server tools: those it started with (by name), as they are now; a name whose tool is
/// gone since stays a server tool's, and its calls end with error outputs.
pub(super) fn restored(stored: &[StoredTool], now: Vec<ServerTool>) -> ServerTools {
    let mut now: HashMap<String, ServerTool> =
        now.into_iter().map(|t| (t.name.clone(), t)).collect();
    let mut tools = ServerTools::default();
    for name in stored.iter().map(|t| &t.name) {
        match now.remove(name) {
            Some(tool) => {
                tools.insert(tool);
            }
            None => tools.retire(name.clone()),
        }
    }
    tools
}

/// A tool of one declared server, under its own name.
pub(super) fn remote_tool(
    server_label: &str,
    listed: &serde_json::Value,
    name: &str,
    approval_required: bool,
    timeout_ms: u64,
    access: &Arc<crate::tools::mcp::RemoteAccess>,
) -> ServerTool {
    let parameters = match listed.get("input_schema") {
        Some(schema @ serde_json::Value::Object(_)) => schema.clone(),
        _ => serde_json::json!({"type": "object"}),
    };
    ServerTool {
        name: name.to_owned(),
        description: listed
            .get("description")
            .and_then(serde_json::Value::as_str)
            .unwrap_or_default()
            .to_owned(),
        parameters,
        strict: false,
        notes: NoteTemplates::default(),
        hosted: None,
        target: Target::Remote(RemoteTool {
            server_label: server_label.to_owned(),
            tool: name.to_owned(),
            approval_required,
            timeout_ms,
            access: Some(Arc::clone(access)),
        }),
    }
}
