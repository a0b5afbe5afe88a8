//! The declared tools nothing serves, and what a deployment does with them (SPEC 12).

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use super::DeclaredTool;

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
