//! The context a model call sees, and the pairing of tool calls with their outputs by `call_id`.

use std::collections::{BTreeSet, HashMap, HashSet};

use crate::items::{
    FunctionCallOutputItem, FunctionOutput, Item, MessageContent, MessageItem, Role,
};
use crate::steps::{Approval, CallKind, Step, StepBody, ToolCall};
use crate::toolset::call_item;

/// The conversation for the next model call: the stored context, then what the steps produced.
pub fn model_conversation(context: &[Item], steps: &[Step]) -> Vec<Item> {
    // A compaction reaches the model as its summary; one the shell did not open has nothing to say.
    let mut conversation: Vec<Item> = context
        .iter()
        .filter_map(|item| match item {
            Item::Compaction(c) => c.summary.as_deref().map(crate::items::summary_message),
            other => Some(other.clone()),
        })
        .collect();
    for step in steps {
        match &step.body {
            StepBody::Model(model) => {
                let Some(output) = &model.output else {
                    continue;
                };
                if let Some(message) = &output.message {
                    conversation.push(Item::Message(MessageItem {
                        id: Some(message.item_id.clone()),
                        role: Role::Assistant,
                        content: MessageContent::Text(message.text.clone()),
                        status: Some("completed".into()),
                    }));
                }
                // After the message, as the output shows them; translations put them where their provider wants.
                conversation.extend(output.reasoning.iter().cloned().map(Item::Reasoning));
                for call in &output.tool_calls {
                    conversation.push(call_item(call, "completed"));
                }
            }
            StepBody::Tool(tool) => {
                let Some(outcome) = &tool.outcome else {
                    continue;
                };
                conversation.push(Item::FunctionCallOutput(FunctionCallOutputItem {
                    id: None,
                    call_id: tool.call.call_id.clone(),
                    output: FunctionOutput::Text(outcome.model_text()),
                    status: None,
                }));
            }
            // The model is offered the listed tools; the listing itself is not part of the conversation.
            StepBody::Listing(_) => {}
        }
    }
    as_model_reads_approvals(conversation)
}

/// The remote MCP items of a conversation as a model reads them (SPEC 12): an approval request is the model's
/// call; a denial is its output, saying so; an approval adds nothing (the call's result follows); a listing is
/// not part of the conversation (its tools are offered instead).
fn as_model_reads_approvals(conversation: Vec<Item>) -> Vec<Item> {
    let requests: HashMap<String, (String, String)> = conversation
        .iter()
        .filter_map(|item| match item {
            Item::McpApprovalRequest(request) => Some((
                request.id.clone()?,
                (request.pairing_id()?.to_owned(), request.name.clone()),
            )),
            _ => None,
        })
        .collect();
    conversation
        .into_iter()
        .filter_map(|item| match item {
            Item::McpApprovalRequest(request) => {
                let call_id = request.pairing_id()?.to_owned();
                Some(Item::FunctionCall(crate::items::FunctionCallItem {
                    id: request.id,
                    call_id,
                    namespace: None,
                    name: request.name,
                    arguments: request.arguments,
                    status: Some("completed".into()),
                }))
            }
            Item::McpApprovalResponse(response) if !response.approve => {
                let (call_id, name) = requests.get(&response.approval_request_id)?;
                Some(Item::FunctionCallOutput(FunctionCallOutputItem {
                    id: None,
                    call_id: call_id.clone(),
                    output: FunctionOutput::Text(response.denial_text(name)),
                    status: None,
                }))
            }
            Item::McpApprovalResponse(_) | Item::McpListTools(_) => None,
            other => Some(other),
        })
        .collect()
}

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

/// Every tool result in a conversation, by `call_id`: client outputs and the results inside `mcp_call` items.
pub fn outputs_by_call_id(conversation: &[Item]) -> HashMap<&str, String> {
    let mut outputs = HashMap::new();
    for item in conversation {
        match item {
            Item::FunctionCallOutput(FunctionCallOutputItem {
                call_id, output, ..
            })
            | Item::CustomToolCallOutput(crate::items::CustomToolCallOutputItem {
                call_id,
                output,
                ..
            }) => {
                outputs
                    .entry(call_id.as_str())
                    .or_insert_with(|| output.to_text());
            }
            Item::McpCall(call) => {
                if let Some(id) = call.pairing_id() {
                    let text = match (&call.output, call.error_text()) {
                        (_, Some(error)) => {
                            serde_json::json!({"error": {"message": error}}).to_string()
                        }
                        (Some(output), None) => output.clone(),
                        (None, None) => String::new(),
                    };
                    outputs.entry(id).or_insert(text);
                }
            }
            Item::Message(_)
            | Item::FunctionCall(_)
            | Item::CustomToolCall(_)
            | Item::Reasoning(_)
            | Item::Compaction(_)
            | Item::McpListTools(_)
            | Item::McpApprovalRequest(_)
            | Item::McpApprovalResponse(_) => {}
        }
    }
    outputs
}

/// Gives every call of a model answer an id that no item of `conversation` uses and no other call of the
/// answer uses, drawing replacements from `fresh`.
///
/// Pairing is by `call_id`, so ids must be unique in a conversation; some upstreams number their calls per
/// answer (`call_0`, `0`) and reuse them in later turns or even within one answer. Unique ids are kept as sent.
pub fn make_call_ids_unique(
    calls: &mut [ToolCall],
    conversation: &[Item],
    mut fresh: impl FnMut() -> String,
) {
    let mut used: HashSet<String> = HashSet::new();
    for item in conversation {
        if let Some(id) = item.call_id() {
            used.insert(id.to_owned());
        }
    }
    for call in calls {
        while used.contains(&call.call_id) {
            call.call_id = fresh();
        }
        used.insert(call.call_id.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn items(values: serde_json::Value) -> Vec<Item> {
        serde_json::from_value(values).unwrap()
    }

    fn registered(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|n| n.to_string()).collect()
    }

    #[test]
    fn a_compaction_reaches_the_model_as_its_summary_and_never_as_its_seal() {
        let mut context = items(json!([
            {"type": "message", "role": "user", "content": "kept"},
            {"type": "compaction", "id": "cmp_1", "encrypted_content": "sealed"},
            {"type": "compaction", "encrypted_content": "not opened"},
        ]));
        if let Item::Compaction(c) = &mut context[1] {
            c.summary = Some("the summary".into());
        }

        let conversation = model_conversation(&context, &[]);

        assert_eq!(
            conversation,
            vec![
                context[0].clone(),
                crate::items::summary_message("the summary")
            ]
        );
        // Stored and shown, the item keeps its seal and drops the summary.
        assert_eq!(
            serde_json::to_value(&context[1]).unwrap(),
            json!({"type": "compaction", "id": "cmp_1", "encrypted_content": "sealed"})
        );
    }

    #[test]
    fn outputs_pair_by_call_id_not_position() {
        let context = items(json!([
            {"type": "function_call", "call_id": "b", "name": "client", "arguments": "{}"},
            {"type": "function_call", "call_id": "a", "name": "client", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "a", "output": "A"},
            {"type": "function_call_output", "call_id": "b", "output": "B"},
        ]));
        assert_eq!(pair_calls(&context, 0, &registered(&[])), Ok(vec![]));
        let outputs = outputs_by_call_id(&context);
        assert_eq!(outputs["a"], "A");
        assert_eq!(outputs["b"], "B");
    }

    #[test]
    fn an_output_without_a_call_is_an_orphan() {
        let context =
            items(json!([{"type": "function_call_output", "call_id": "zz", "output": "x"}]));
        assert!(matches!(
            pair_calls(&context, 0, &registered(&[])),
            Err(PairingError::OrphanOutput { .. })
        ));
    }

    #[test]
    fn an_unanswered_registered_call_is_carried_and_a_client_one_is_an_error() {
        let context = items(json!([
            {"type": "function_call", "id": "fc_1", "call_id": "s", "name": "server", "arguments": "{}"},
            {"type": "function_call", "id": "fc_2", "call_id": "c", "name": "client", "arguments": "{}"},
        ]));
        let err = pair_calls(&context, 0, &registered(&["server"])).unwrap_err();
        assert_eq!(
            err,
            PairingError::UnansweredCall {
                call_id: "c".into(),
                name: "client".into()
            }
        );

        let mut answered = context.clone();
        answered.extend(items(
            json!([{"type": "function_call_output", "call_id": "c", "output": "ok"}]),
        ));
        let carried = pair_calls(&answered, 0, &registered(&["server"])).unwrap();
        assert_eq!(carried.len(), 1);
        assert_eq!(carried[0].call_id, "s");
    }

    #[test]
    fn a_call_id_used_twice_or_answered_twice_is_refused_with_its_position() {
        let twice_called = items(json!([
            {"type": "function_call", "call_id": "a", "name": "client", "arguments": "{}"},
            {"type": "custom_tool_call", "call_id": "a", "name": "patch", "input": "x"},
        ]));
        assert_eq!(
            pair_calls(&twice_called, 0, &registered(&[])),
            Err(PairingError::DuplicateCall {
                call_id: "a".into(),
                index: 1
            })
        );
        let twice_answered = items(json!([
            {"type": "function_call", "call_id": "a", "name": "client", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "a", "output": "1"},
            {"type": "function_call_output", "call_id": "a", "output": "2"},
        ]));
        assert_eq!(
            pair_calls(&twice_answered, 0, &registered(&[])),
            Err(PairingError::DuplicateOutput {
                call_id: "a".into(),
                index: 2
            })
        );
    }

    #[test]
    fn the_stored_chain_may_repeat_a_call_as_the_mcp_call_that_ran_it() {
        let context = items(json!([
            {"type": "function_call", "call_id": "s", "name": "server", "arguments": "{}"},
            {"type": "function_call", "call_id": "c", "name": "client", "arguments": "{}"},
            {"type": "mcp_call", "id": "mcp_1", "call_id": "s", "name": "server", "server_label": "gateway",
             "arguments": "{}", "output": "1", "status": "completed"},
            {"type": "function_call_output", "call_id": "c", "output": "2"},
        ]));
        assert_eq!(pair_calls(&context, 3, &registered(&[])), Ok(vec![]));
        assert_eq!(
            pair_calls(&context, 2, &registered(&[])),
            Err(PairingError::DuplicateCall {
                call_id: "s".into(),
                index: 2
            }),
            "the same repeat in the client's own input is refused"
        );
    }

    #[test]
    fn custom_tool_calls_pair_with_their_outputs() {
        let context = items(json!([
            {"type": "custom_tool_call", "call_id": "p", "name": "apply_patch", "input": "*** Begin Patch"},
            {"type": "custom_tool_call_output", "call_id": "p", "output": "Done"},
        ]));
        assert_eq!(
            pair_calls(&context, 0, &registered(&["apply_patch"])),
            Ok(vec![])
        );
        assert_eq!(outputs_by_call_id(&context)["p"], "Done");
        let unanswered = &context[..1];
        assert!(
            matches!(
                pair_calls(unanswered, 0, &registered(&["apply_patch"])),
                Err(PairingError::UnansweredCall { .. })
            ),
            "a custom call is always the client's, whatever the server tools are called"
        );
    }

    #[test]
    fn mcp_calls_answer_themselves() {
        let context = items(json!([
            {"type": "mcp_call", "id": "mcp_1", "call_id": "s", "server_label": "gateway", "name": "server",
             "arguments": "{}", "output": "42", "error": null},
        ]));
        assert_eq!(pair_calls(&context, 0, &registered(&[])), Ok(vec![]));
        assert_eq!(outputs_by_call_id(&context)["s"], "42");
    }

    #[test]
    fn call_ids_already_used_or_repeated_in_the_answer_are_replaced() {
        let conversation = items(json!([
            {"type": "function_call", "call_id": "call_0", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "call_0", "output": "x"},
            {"type": "mcp_call", "id": "mcp_1", "call_id": "call_m", "server_label": "gateway", "name": "g",
             "arguments": "{}", "output": "y", "error": null},
        ]));
        let call = |id: &str| ToolCall::function(format!("fc_{id}"), id, "f", "{}");
        let mut calls = vec![
            call("call_0"),
            call("call_new"),
            call("call_new"),
            call("call_m"),
        ];
        let mut n = 0;
        make_call_ids_unique(&mut calls, &conversation, || {
            n += 1;
            format!("fresh_{n}")
        });
        let ids: Vec<&str> = calls.iter().map(|c| c.call_id.as_str()).collect();
        assert_eq!(ids, ["fresh_1", "call_new", "fresh_2", "fresh_3"]);
    }

    #[test]
    fn an_mcp_call_error_object_reaches_the_model_as_its_message() {
        let context = items(json!([
            {"type": "mcp_call", "id": "mcp_1", "call_id": "s", "server_label": "gateway", "name": "server",
             "arguments": "{}", "output": null,
             "error": {"type": "mcp_tool_execution_error", "content": [{"type": "text", "text": "it broke"}]}},
            {"type": "mcp_call", "id": "mcp_2", "call_id": "t", "server_label": "gateway", "name": "server",
             "arguments": "{}", "output": null, "error": "plain string"},
        ]));
        let outputs = outputs_by_call_id(&context);
        assert_eq!(outputs["s"], r#"{"error":{"message":"it broke"}}"#);
        assert_eq!(outputs["t"], r#"{"error":{"message":"plain string"}}"#);
    }

    fn approval_history() -> Vec<Item> {
        items(json!([
            {"type": "message", "role": "user", "content": "add 2 and 3"},
            {"type": "mcp_list_tools", "id": "mcpl_1", "server_label": "calc", "tools": [{"name": "add"}]},
            {"type": "mcp_approval_request", "id": "mcpr_1", "call_id": "call_1", "server_label": "calc",
             "name": "add", "arguments": "{\"a\":2,\"b\":3}"},
        ]))
    }

    fn approval(approve: bool) -> Item {
        items(json!([{"type": "mcp_approval_response", "approval_request_id": "mcpr_1", "approve": approve,
                      "reason": "not now"}]))
        .remove(0)
    }

    #[test]
    fn an_approved_request_is_carried_to_run_and_names_its_request() {
        let mut context = approval_history();
        context.push(approval(true));
        let carried = pair_calls(&context, 3, &registered(&["add"])).unwrap();
        assert_eq!(carried.len(), 1);
        assert_eq!(carried[0].call_id, "call_1");
        assert_eq!(
            carried[0].approval,
            Some(Approval::Granted {
                request_id: "mcpr_1".into()
            })
        );
        let err = pair_calls(&context, 3, &registered(&[])).unwrap_err();
        assert!(
            matches!(err, PairingError::ApprovedToolUnavailable { .. }),
            "{err:?}"
        );
    }

    #[test]
    fn a_denied_request_is_answered_and_the_model_reads_the_denial() {
        let mut context = approval_history();
        context.push(approval(false));
        assert_eq!(pair_calls(&context, 3, &registered(&["add"])), Ok(vec![]));
        let conversation = model_conversation(&context, &[]);
        let kinds: Vec<&str> = conversation
            .iter()
            .map(|item| match item {
                Item::Message(_) => "message",
                Item::FunctionCall(_) => "function_call",
                Item::FunctionCallOutput(_) => "function_call_output",
                _ => "other",
            })
            .collect();
        assert_eq!(kinds, ["message", "function_call", "function_call_output"]);
        let outputs = outputs_by_call_id(&conversation);
        assert!(
            outputs["call_1"].contains("denied"),
            "{}",
            outputs["call_1"]
        );
        assert!(
            outputs["call_1"].contains("not now"),
            "{}",
            outputs["call_1"]
        );
    }

    #[test]
    fn approval_responses_that_answer_nothing_or_nothing_new_are_refused() {
        let unanswered = approval_history();
        assert!(matches!(
            pair_calls(&unanswered, 0, &registered(&["add"])),
            Err(PairingError::UnansweredApproval { .. })
        ));
        let orphan = items(
            json!([{"type": "mcp_approval_response", "approval_request_id": "mcpr_x",
                                   "approve": true}]),
        );
        assert_eq!(
            pair_calls(&orphan, 0, &registered(&[])),
            Err(PairingError::OrphanApproval {
                request_id: "mcpr_x".into(),
                index: 0
            })
        );
        let mut twice = approval_history();
        twice.push(approval(true));
        twice.push(approval(false));
        assert!(matches!(
            pair_calls(&twice, 3, &registered(&["add"])),
            Err(PairingError::DuplicateApproval { index: 4, .. })
        ));
    }

    #[test]
    fn a_whole_history_sent_back_by_value_pairs_the_approved_call_with_its_run() {
        let mut context = approval_history();
        context.push(approval(true));
        context.extend(items(json!([
            {"type": "mcp_call", "id": "mcp_1", "call_id": "call_1", "server_label": "calc", "name": "add",
             "arguments": "{}", "output": "5", "approval_request_id": "mcpr_1", "status": "completed"},
        ])));
        assert_eq!(pair_calls(&context, 0, &registered(&["add"])), Ok(vec![]));
        let conversation = model_conversation(&context, &[]);
        assert_eq!(outputs_by_call_id(&conversation)["call_1"], "5");
    }
}
