//! What the core's unit tests share: items from JSON, ids drawn in order, and tool steps.

use serde_json::Value;

use crate::chat::IdSource;
use crate::items::Item;
use crate::steps::{
    AssistantMessage, Finish, ModelOutput, ModelStep, Step, StepBody, StepState, ToolCall,
    ToolOutcome, ToolStep,
};

/// Items read from a JSON array of them.
pub fn items(values: Value) -> Vec<Item> {
    serde_json::from_value(values).unwrap()
}

/// Ids drawn in order (`msg_1`, `rs_2`, ...); synthesised call ids name their index (`call_synth_0`).
pub struct CountingIds(pub usize);

impl IdSource for CountingIds {
    fn item_id(&mut self, prefix: &str) -> String {
        self.0 += 1;
        format!("{prefix}_{}", self.0)
    }

    fn call_id(&mut self, index: usize) -> String {
        format!("call_synth_{index}")
    }
}

/// A tool step of `batch` for `call`, with no timings, notes or server label.
pub fn tool_step(
    seq: u32,
    state: StepState,
    item_id: String,
    call: ToolCall,
    batch: Option<u32>,
    outcome: Option<ToolOutcome>,
) -> Step {
    Step {
        seq,
        state,
        body: StepBody::Tool(ToolStep {
            item_id,
            call,
            batch,
            outcome,
            ended_rank: None,
            started_at_ms: None,
            ended_at_ms: None,
            notes: Default::default(),
            server_label: None,
            hosted_type: None,
        }),
    }
}

/// A tool step of `batch` for `call`, shown as `mcp_{call_id}`, as the engine names a server tool call's item.
pub fn server_call_step(
    seq: u32,
    state: StepState,
    call: ToolCall,
    batch: Option<u32>,
    outcome: Option<ToolOutcome>,
) -> Step {
    tool_step(
        seq,
        state,
        format!("mcp_{}", call.call_id),
        call,
        batch,
        outcome,
    )
}

/// A model call that succeeded: `text` (if any) as message `msg_{seq}`, these tool calls, and how it finished.
pub fn answered_step(
    seq: u32,
    text: Option<&str>,
    tool_calls: Vec<ToolCall>,
    finish: Finish,
) -> Step {
    let output = ModelOutput {
        reasoning: Vec::new(),
        message: text.map(|t| AssistantMessage::whole(format!("msg_{seq}"), t)),
        tool_calls,
        usage: None,
        finish,
    };
    Step {
        seq,
        state: StepState::Succeeded,
        body: StepBody::Model(ModelStep {
            deployment: None,
            output: Some(output),
            failure: None,
        }),
    }
}

/// What a translator is given for one model call.
pub fn model_input<'a>(
    params: &'a crate::request::ResponseParams,
    conversation: &'a [crate::items::Item],
    tools: &'a [crate::toolset::OfferedTool],
) -> crate::context::ModelInput<'a> {
    crate::context::ModelInput {
        params,
        conversation,
        tools,
    }
}
