//! The context a model call sees: the stored context and the steps as one conversation, approvals as a model reads
//! them, call ids kept unique. Checking that a client's context pairs up is `pairing`'s; pairing calls with results
//! for a translation is `walk`'s.

mod pairing;

pub use pairing::{pair_calls, PairingError};

use std::collections::{HashMap, HashSet};

use crate::items::{
    FunctionCallOutputItem, FunctionOutput, Item, MessageContent, MessageItem, Role,
};
use crate::request::ResponseParams;
use crate::steps::{Step, StepBody, ToolCall};
use crate::toolset::{call_item, OfferedTool};

/// What one model call is given to translate, whatever the provider: the request's parameters, the conversation
/// (calls under the flat names the model is offered), and the tools as offered.
#[derive(Debug, Clone, Copy)]
pub struct ModelInput<'a> {
    pub params: &'a ResponseParams,
    pub conversation: &'a [Item],
    pub tools: &'a [OfferedTool],
}

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
mod tests;
