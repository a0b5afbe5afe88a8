//! Checking that a context's tool calls and outputs pair up by `call_id` (SPEC 5), approvals included: what a
//! client sends is refused with the item at fault, and the unanswered server calls are carried to run.

use std::collections::{BTreeSet, HashMap, HashSet};

use crate::items::Item;
use crate::steps::{Approval, CallKind, ToolCall};

/// A context whose tool calls and outputs do not pair up. `index` is the item's position in the context.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PairingError {
    #[error("No tool call found for function call output with call_id '{call_id}'.")]
    OrphanOutput { call_id: String, index: usize },
    #[error("No tool output found for function call '{name}' with call_id '{call_id}': send a function_call_output for it.")]
    UnansweredCall { call_id: String, name: String },
    #[error("Duplicate tool call: call_id '{call_id}' is already used by an earlier call.")]
    DuplicateCall { call_id: String, index: usize },
    #[error("Duplicate tool output: the call with call_id '{call_id}' is already answered.")]
    DuplicateOutput { call_id: String, index: usize },
    #[error(
        "No mcp_approval_request found with id '{request_id}' for this mcp_approval_response."
    )]
    OrphanApproval { request_id: String, index: usize },
    #[error(
        "Duplicate mcp_approval_response: the approval request '{request_id}' is already answered."
    )]
    DuplicateApproval { request_id: String, index: usize },
    #[error("No mcp_approval_response found for mcp_approval_request '{request_id}' (tool '{name}'): send one that approves or denies it.")]
    UnansweredApproval { request_id: String, name: String },
    #[error("The approved call of tool '{name}' cannot run: this request declares no MCP server '{server_label}' that offers it.")]
    ApprovedToolUnavailable { name: String, server_label: String },
}

impl PairingError {
    /// Position in the context of the item at fault, when one item is.
    pub fn index(&self) -> Option<usize> {
        match self {
            PairingError::OrphanOutput { index, .. }
            | PairingError::DuplicateCall { index, .. }
            | PairingError::DuplicateOutput { index, .. }
            | PairingError::OrphanApproval { index, .. }
            | PairingError::DuplicateApproval { index, .. } => Some(*index),
            PairingError::UnansweredCall { .. }
            | PairingError::UnansweredApproval { .. }
            | PairingError::ApprovedToolUnavailable { .. } => None,
        }
    }
}

/// Checks that every output answers a call and every call is answered, by `call_id` (never by position).
///
/// Calls to registered server tools that the client left unanswered are returned: the gateway runs them
/// before the next model call. `context` is the whole context (previous ones first, new input last);
/// `first_new` is where the client's new input starts. A call id used twice, or answered twice, is refused
/// when the repeat is in the new input; the stored chain repeats ids by design (a handed-back server call
/// shows again as the `mcp_call` that ran it), and there the first occurrence wins.
pub fn pair_calls(
    context: &[Item],
    first_new: usize,
    registered: &BTreeSet<String>,
) -> Result<Vec<ToolCall>, PairingError> {
    // Calls by call_id, in order; each id names one call and is answered at most once.
    let mut calls: Vec<ToolCall> = Vec::new();
    let mut known_ids: HashSet<&str> = HashSet::new();
    let mut answered: HashSet<&str> = HashSet::new();
    // Approval requests by their id: the call id they stand for, and the server they name.
    let mut requests: HashMap<&str, (&str, &str)> = HashMap::new();
    // Approved calls by call id: the request that approved them.
    let mut granted: HashMap<&str, &str> = HashMap::new();
    let mut decided: HashSet<&str> = HashSet::new();
    for (index, item) in context.iter().enumerate() {
        match item {
            Item::FunctionCall(_)
            | Item::CustomToolCall(_)
            | Item::McpCall(_)
            | Item::McpApprovalRequest(_) => {
                let Some(call_id) = item.call_id() else {
                    continue;
                };
                if !known_ids.insert(call_id) {
                    // The run of an approved call repeats its request's call id, also when a client sends the
                    // whole history back by value.
                    let runs_approved = matches!(item, Item::McpCall(_))
                        && requests.values().any(|(id, _)| *id == call_id);
                    if index >= first_new && !runs_approved {
                        return Err(PairingError::DuplicateCall {
                            call_id: call_id.to_owned(),
                            index,
                        });
                    }
                    if matches!(item, Item::McpCall(_)) {
                        answered.insert(call_id);
                    }
                    continue;
                }
                match item {
                    Item::FunctionCall(call) => calls.push(ToolCall {
                        item_id: call.id.clone().unwrap_or_else(|| call.call_id.clone()),
                        call_id: call.call_id.clone(),
                        namespace: call.namespace.clone(),
                        name: call.name.clone(),
                        arguments: call.arguments.clone(),
                        kind: CallKind::Function,
                        approval: None,
                    }),
                    Item::CustomToolCall(call) => calls.push(ToolCall {
                        item_id: call.id.clone().unwrap_or_else(|| call.call_id.clone()),
                        call_id: call.call_id.clone(),
                        namespace: call.namespace.clone(),
                        name: call.name.clone(),
                        arguments: call.input.clone(),
                        kind: CallKind::Custom,
                        approval: None,
                    }),
                    Item::McpApprovalRequest(request) => {
                        let request_id = request.id.as_deref().unwrap_or(call_id);
                        requests.insert(request_id, (call_id, request.server_label.as_str()));
                        calls.push(ToolCall {
                            item_id: request_id.to_owned(),
                            call_id: call_id.to_owned(),
                            namespace: None,
                            name: request.name.clone(),
                            arguments: request.arguments.clone(),
                            kind: CallKind::Function,
                            approval: Some(Approval::Required {
                                server_label: request.server_label.clone(),
                            }),
                        });
                    }
                    // An mcp_call carries its own result.
                    _ => {
                        answered.insert(call_id);
                    }
                }
            }
            Item::FunctionCallOutput(_) | Item::CustomToolCallOutput(_) => {
                let Some(call_id) = item.call_id() else {
                    continue;
                };
                if !known_ids.contains(call_id) {
                    return Err(PairingError::OrphanOutput {
                        call_id: call_id.to_owned(),
                        index,
                    });
                }
                if !answered.insert(call_id) && index >= first_new {
                    return Err(PairingError::DuplicateOutput {
                        call_id: call_id.to_owned(),
                        index,
                    });
                }
            }
            Item::McpApprovalResponse(response) => {
                let request_id = response.approval_request_id.as_str();
                let Some(&(call_id, _)) = requests.get(request_id) else {
                    return Err(PairingError::OrphanApproval {
                        request_id: request_id.to_owned(),
                        index,
                    });
                };
                if !decided.insert(request_id) {
                    if index >= first_new {
                        return Err(PairingError::DuplicateApproval {
                            request_id: request_id.to_owned(),
                            index,
                        });
                    }
                    continue;
                }
                if response.approve {
                    granted.insert(call_id, request_id);
                } else {
                    answered.insert(call_id);
                }
            }
            Item::Message(_) | Item::Reasoning(_) | Item::Compaction(_) | Item::McpListTools(_) => {
            }
        }
    }
    let mut carried = Vec::new();
    for mut call in calls {
        if answered.contains(call.call_id.as_str()) {
            continue;
        }
        if let Some(Approval::Required { server_label }) = &call.approval {
            let Some(&request_id) = granted.get(call.call_id.as_str()) else {
                return Err(PairingError::UnansweredApproval {
                    request_id: call.item_id,
                    name: call.name,
                });
            };
            if !registered.contains(&call.name) {
                return Err(PairingError::ApprovedToolUnavailable {
                    name: call.name,
                    server_label: server_label.clone(),
                });
            }
            call.approval = Some(Approval::Granted {
                request_id: request_id.to_owned(),
            });
            carried.push(call);
            continue;
        }
        if !call.is_server_call(registered) {
            return Err(PairingError::UnansweredCall {
                call_id: call.call_id,
                name: call.name,
            });
        }
        carried.push(call);
    }
    Ok(carried)
}

#[cfg(test)]
mod tests;
