//! Remote MCP servers a request names (SPEC 12): each checked against the operator's allow-list (address
//! included), listed once per chain (a chain that already holds its `mcp_list_tools` item is not listed again),
//! and its allowed tools made server tools of the response, whose calls wait for approval where the request says.

use std::collections::BTreeSet;
use std::sync::Arc;

use gateway_core::remote_mcp::{listed_in_chain, remote_servers, RemoteMcpServer};
use gateway_core::steps::ListingStep;
use gateway_core::toolset::{is_valid_tool_name, DeclaredTool};
use gateway_core::Item;
use serde_json::Value;

use super::server_tools::remote_tool;
use super::{Engine, EngineError};
use crate::ids::item_id;
use crate::tools::mcp::{listed_tool_json, RemoteAccess};
use crate::tools::{ServerTool, Target};

/// The server tools a request's own MCP servers add, and the listings made for them now.
#[derive(Debug, Default)]
pub(super) struct RemoteTools {
    pub tools: Vec<ServerTool>,
    pub listings: Vec<ListingStep>,
}

impl Engine {
    /// The tools of the MCP servers `declared` names. A server the allow-list refuses is a `400`; one that
    /// cannot list its tools, a `424` (as OpenAI answers); nothing is stored either way.
    pub(super) async fn remote_tools(
        &self,
        declared: &[DeclaredTool],
        context: &[Item],
        response_id: &str,
    ) -> Result<RemoteTools, EngineError> {
        let mut remote = RemoteTools::default();
        for (index, server) in remote_servers(declared) {
            // Boxed here, as below: a request without remote servers should not carry these futures' size.
            let access = Arc::new(
                Box::pin(self.remote_access(&server))
                    .await
                    .map_err(|message| EngineError::RemoteMcpRefused { index, message })?,
            );
            let listed: Vec<Value> = match listed_in_chain(context, &server.server_label) {
                Some(listing) => listing.tools.clone(),
                None => {
                    let tools = Box::pin(self.tools.mcp().list_remote(&access))
                        .await
                        .map_err(|message| EngineError::RemoteMcpUnlisted { index, message })?;
                    let tools: Vec<Value> = tools.iter().map(listed_tool_json).collect();
                    remote.listings.push(ListingStep {
                        item_id: item_id("mcpl", response_id),
                        server_label: server.server_label.clone(),
                        tools: tools.clone(),
                    });
                    tools
                }
            };
            remote.tools.extend(tools_of(
                &server,
                &listed,
                &access,
                self.tools.default_timeout_ms(),
            ));
        }
        Ok(remote)
    }

    /// The checked way to a declared server, or why it is refused.
    async fn remote_access(&self, server: &RemoteMcpServer) -> Result<RemoteAccess, String> {
        let checked = self.tools.check_remote(&server.server_url).await?;
        Ok(RemoteAccess {
            server_label: server.server_label.clone(),
            server: checked,
            headers: server.headers.clone(),
            authorization: server.authorization.clone(),
        })
    }

    /// A resumed response's remote tools, as it stored them, given again the way to their servers: each server
    /// its stored request declares is checked again (a server refused now leaves its tools unreachable, and
    /// their calls end with error outputs).
    pub(super) async fn reattach_remote(
        &self,
        declared: &[DeclaredTool],
        stored: Vec<ServerTool>,
    ) -> Vec<ServerTool> {
        let mut tools = stored;
        for (_, server) in remote_servers(declared) {
            let access = match self.remote_access(&server).await {
                Ok(access) => Arc::new(access),
                Err(reason) => {
                    tracing::warn!(mcp.server_label = %server.server_label, %reason,
                        "a resumed response's MCP server is refused now");
                    continue;
                }
            };
            for tool in &mut tools {
                if let Target::Remote(remote) = &mut tool.target {
                    if remote.server_label == server.server_label {
                        remote.access = Some(Arc::clone(&access));
                    }
                }
            }
        }
        tools
    }
}

/// The server tools of one declared server: the listed tools it allows, under their own names. A name that is
/// not one every provider accepts is left out.
fn tools_of(
    server: &RemoteMcpServer,
    listed: &[Value],
    access: &Arc<RemoteAccess>,
    timeout_ms: u64,
) -> Vec<ServerTool> {
    let mut seen = BTreeSet::new();
    listed
        .iter()
        .filter_map(|tool| {
            let name = tool.get("name").and_then(Value::as_str)?;
            if !server.allows(name) || !seen.insert(name.to_owned()) {
                return None;
            }
            if !is_valid_tool_name(name) {
                tracing::info!(mcp.server_label = %server.server_label, tool.name = %name.escape_debug(),
                    "a remote MCP tool's name is not usable; left out");
                return None;
            }
            Some(remote_tool(
                &server.server_label,
                tool,
                name,
                server.approval.requires(name),
                timeout_ms,
                access,
            ))
        })
        .collect()
}
