//! The context a model call sees, and the pairing of tool calls with their outputs by `call_id`.

use std::collections::{BTreeSet, HashMap, HashSet};

use crate::items::{
    FunctionCallItem, FunctionCallOutputItem, FunctionOutput, Item, MessageContent, MessageItem,
    Role,
};
use crate::steps::{Step, StepBody, ToolCall};

/// The conversation for the next model call: the stored context, then what the steps produced.
pub fn model_conversation(context: &[Item], steps: &[Step]) -> Vec<Item> {
    let mut conversation = context.to_vec();
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
                for call in &output.tool_calls {
                    conversation.push(Item::FunctionCall(FunctionCallItem {
                        id: Some(call.item_id.clone()),
                        call_id: call.call_id.clone(),
                        name: call.name.clone(),
                        arguments: call.arguments.clone(),
                        status: Some("completed".into()),
                    }));
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
        }
    }
    conversation
}

/// A context whose tool calls and outputs do not pair up.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PairingError {
    #[error("No tool call found for function call output with call_id '{call_id}'.")]
    OrphanOutput { call_id: String, index: usize },
    #[error("No tool output found for function call '{name}' with call_id '{call_id}': send a function_call_output for it.")]
    UnansweredCall { call_id: String, name: String },
}

/// Checks that every output answers a call and every call is answered, by `call_id` (never by position).
///
/// Calls to registered server tools that the client left unanswered are returned: the gateway runs them
/// before the next model call. `context` is the whole context (previous ones first, new input last).
pub fn pair_calls(
    context: &[Item],
    registered: &BTreeSet<String>,
) -> Result<Vec<ToolCall>, PairingError> {
    let mut calls: Vec<&FunctionCallItem> = Vec::new();
    let mut known_ids: HashSet<&str> = HashSet::new();
    let mut answered: HashSet<&str> = HashSet::new();
    for (index, item) in context.iter().enumerate() {
        match item {
            Item::FunctionCall(call) => {
                known_ids.insert(&call.call_id);
                calls.push(call);
            }
            Item::McpCall(call) => {
                if let Some(id) = call.pairing_id() {
                    known_ids.insert(id);
                    answered.insert(id);
                }
            }
            Item::FunctionCallOutput(output) => {
                if !known_ids.contains(output.call_id.as_str()) {
                    return Err(PairingError::OrphanOutput {
                        call_id: output.call_id.clone(),
                        index,
                    });
                }
                answered.insert(&output.call_id);
            }
            Item::Message(_) | Item::Reasoning(_) => {}
        }
    }
    let mut carried = Vec::new();
    let mut seen: HashSet<&str> = HashSet::new();
    for call in calls {
        if answered.contains(call.call_id.as_str()) || !seen.insert(&call.call_id) {
            continue;
        }
        if !registered.contains(&call.name) {
            return Err(PairingError::UnansweredCall {
                call_id: call.call_id.clone(),
                name: call.name.clone(),
            });
        }
        carried.push(ToolCall {
            item_id: call.id.clone().unwrap_or_else(|| call.call_id.clone()),
            call_id: call.call_id.clone(),
            name: call.name.clone(),
            arguments: call.arguments.clone(),
        });
    }
    Ok(carried)
}

/// Every tool result in a conversation, by `call_id`: client outputs and the results inside `mcp_call` items.
pub fn outputs_by_call_id(conversation: &[Item]) -> HashMap<&str, String> {
    let mut outputs = HashMap::new();
    for item in conversation {
        match item {
            Item::FunctionCallOutput(output) => {
                outputs
                    .entry(output.call_id.as_str())
                    .or_insert_with(|| output.output.to_text());
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
            Item::Message(_) | Item::FunctionCall(_) | Item::Reasoning(_) => {}
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
        let id = match item {
            Item::FunctionCall(call) => Some(call.call_id.as_str()),
            Item::FunctionCallOutput(output) => Some(output.call_id.as_str()),
            Item::McpCall(call) => call.pairing_id(),
            Item::Message(_) | Item::Reasoning(_) => None,
        };
        if let Some(id) = id {
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
    fn outputs_pair_by_call_id_not_position() {
        let context = items(json!([
            {"type": "function_call", "call_id": "b", "name": "client", "arguments": "{}"},
            {"type": "function_call", "call_id": "a", "name": "client", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "a", "output": "A"},
            {"type": "function_call_output", "call_id": "b", "output": "B"},
        ]));
        assert_eq!(pair_calls(&context, &registered(&[])), Ok(vec![]));
        let outputs = outputs_by_call_id(&context);
        assert_eq!(outputs["a"], "A");
        assert_eq!(outputs["b"], "B");
    }

    #[test]
    fn an_output_without_a_call_is_an_orphan() {
        let context =
            items(json!([{"type": "function_call_output", "call_id": "zz", "output": "x"}]));
        assert!(matches!(
            pair_calls(&context, &registered(&[])),
            Err(PairingError::OrphanOutput { .. })
        ));
    }

    #[test]
    fn an_unanswered_registered_call_is_carried_and_a_client_one_is_an_error() {
        let context = items(json!([
            {"type": "function_call", "id": "fc_1", "call_id": "s", "name": "server", "arguments": "{}"},
            {"type": "function_call", "id": "fc_2", "call_id": "c", "name": "client", "arguments": "{}"},
        ]));
        let err = pair_calls(&context, &registered(&["server"])).unwrap_err();
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
        let carried = pair_calls(&answered, &registered(&["server"])).unwrap();
        assert_eq!(carried.len(), 1);
        assert_eq!(carried[0].call_id, "s");
    }

    #[test]
    fn mcp_calls_answer_themselves() {
        let context = items(json!([
            {"type": "mcp_call", "id": "mcp_1", "call_id": "s", "server_label": "gateway", "name": "server",
             "arguments": "{}", "output": "42", "error": null},
        ]));
        assert_eq!(pair_calls(&context, &registered(&[])), Ok(vec![]));
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
        let call = |id: &str| ToolCall {
            item_id: format!("fc_{id}"),
            call_id: id.into(),
            name: "f".into(),
            arguments: "{}".into(),
        };
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
}
