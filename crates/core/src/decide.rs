//! `decide_next_action`: the loop's whole policy, as a pure function of the stored steps.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::response::FailureCode;
use crate::steps::{Finish, Step, StepBody, ToolCall, ToolStep};

/// Ceilings that end a response as `incomplete`. The request may lower the operator's values, never raise them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    /// Server tool calls per response (`max_tool_calls`); `None` means no limit.
    pub max_tool_calls: Option<u32>,
    /// Model calls per response.
    pub max_model_calls: u32,
    /// Consecutive batches in which every tool call failed.
    pub max_failing_batches: u32,
}

/// Everything the decision looks at.
#[derive(Debug, Clone, Copy)]
pub struct LoopInput<'a> {
    pub steps: &'a [Step],
    /// Names of the server tools this response may run.
    pub registered: &'a BTreeSet<String>,
    pub limits: Limits,
    /// Whether the whole-response deadline has passed (the caller reads the clock).
    pub deadline_passed: bool,
    /// Whether the budget of the response's key or project is spent (SPEC 13): no further model call is made.
    pub budget_spent: bool,
}

/// What the driver does next.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "snake_case")]
pub enum NextAction {
    /// Call the upstream model with the context and every result so far.
    CallModel,
    /// Re-issue the model call of step `seq`, which was recorded but never ended.
    ResumeModelCall { seq: u32 },
    /// Record one tool step per call (all in one write), then run them concurrently.
    DispatchBatch {
        batch: Option<u32>,
        calls: Vec<ToolCall>,
    },
    /// Run (or resume) these recorded tool steps, by `seq`.
    RunTools { seqs: Vec<u32> },
    /// The model answered without tool calls: the response is complete.
    Complete,
    /// The batch holds a name that is not registered: hand the whole batch to the client.
    HandBack { calls: Vec<ToolCall> },
    /// A limit was reached.
    Incomplete { reason: IncompleteReason },
    /// The upstream model failed for good.
    Fail { code: FailureCode, message: String },
}

impl NextAction {
    /// The action's name, for logs (which must not carry tool arguments).
    pub fn kind(&self) -> &'static str {
        match self {
            NextAction::CallModel => "call_model",
            NextAction::ResumeModelCall { .. } => "resume_model_call",
            NextAction::DispatchBatch { .. } => "dispatch_batch",
            NextAction::RunTools { .. } => "run_tools",
            NextAction::Complete => "complete",
            NextAction::HandBack { .. } => "hand_back",
            NextAction::Incomplete { .. } => "incomplete",
            NextAction::Fail { .. } => "fail",
        }
    }
}

/// Why a response ended `incomplete`; `as_str` is what `incomplete_details.reason` says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IncompleteReason {
    MaxOutputTokens,
    ContentFilter,
    MaxToolCalls,
    MaxModelCalls,
    #[serde(rename = "max_failing_tool_batches")]
    ToolFailures,
    Deadline,
    /// The client of a foreground stream went away; the response stopped at its next step boundary.
    ClientDisconnected,
    /// The budget of the response's key or project was spent while it ran (SPEC 13).
    BudgetExceeded,
}

impl IncompleteReason {
    pub fn as_str(self) -> &'static str {
        match self {
            IncompleteReason::MaxOutputTokens => "max_output_tokens",
            IncompleteReason::ContentFilter => "content_filter",
            IncompleteReason::MaxToolCalls => "max_tool_calls",
            IncompleteReason::MaxModelCalls => "max_model_calls",
            IncompleteReason::ToolFailures => "max_failing_tool_batches",
            IncompleteReason::Deadline => "deadline",
            IncompleteReason::ClientDisconnected => "client_disconnected",
            IncompleteReason::BudgetExceeded => "budget_exceeded",
        }
    }

    pub const ALL: [IncompleteReason; 8] = [
        IncompleteReason::MaxOutputTokens,
        IncompleteReason::ContentFilter,
        IncompleteReason::MaxToolCalls,
        IncompleteReason::MaxModelCalls,
        IncompleteReason::ToolFailures,
        IncompleteReason::Deadline,
        IncompleteReason::ClientDisconnected,
        IncompleteReason::BudgetExceeded,
    ];

    pub fn parse(text: &str) -> Option<IncompleteReason> {
        IncompleteReason::ALL
            .into_iter()
            .find(|reason| reason.as_str() == text)
    }
}

/// Decides the loop's next action from the stored steps. Looks at every step of the last batch.
pub fn decide_next_action(input: &LoopInput<'_>) -> NextAction {
    let steps = input.steps;
    let last_model = steps
        .iter()
        .rposition(|s| matches!(s.body, StepBody::Model(_)));
    let (batch_id, calls, batch_steps): (Option<u32>, Vec<&ToolCall>, Vec<&Step>) = match last_model
    {
        None => {
            // Only calls carried over from a passed-through batch can precede the first model call.
            let carried: Vec<&Step> = steps.iter().filter(|s| s.tool().is_some()).collect();
            if carried.is_empty() {
                return call_model(input);
            }
            (None, Vec::new(), carried)
        }
        Some(index) => {
            let step = &steps[index];
            let Some(model) = step.model() else {
                return call_model(input);
            };
            if !step.state.is_ended() {
                if input.deadline_passed {
                    return incomplete(IncompleteReason::Deadline);
                }
                return NextAction::ResumeModelCall { seq: step.seq };
            }
            let Some(output) = model.output.as_ref() else {
                if model.failure.as_ref().is_some_and(|f| f.cut_by_deadline) {
                    return incomplete(IncompleteReason::Deadline);
                }
                let (code, message) = model
                    .failure
                    .as_ref()
                    .map(|f| (f.code, f.message.clone()))
                    .unwrap_or_else(|| {
                        (
                            FailureCode::ServerError,
                            "the upstream model call failed".into(),
                        )
                    });
                return NextAction::Fail { code, message };
            };
            if output.tool_calls.is_empty() {
                return match output.finish {
                    Finish::Length => incomplete(IncompleteReason::MaxOutputTokens),
                    Finish::ContentFilter => incomplete(IncompleteReason::ContentFilter),
                    Finish::Stop | Finish::ToolCalls => NextAction::Complete,
                };
            }
            let batch_steps: Vec<&Step> = steps[index + 1..]
                .iter()
                .filter(|s| s.tool().is_some())
                .collect();
            (
                Some(step.seq),
                output.tool_calls.iter().collect(),
                batch_steps,
            )
        }
    };

    let recorded = |call: &ToolCall| {
        batch_steps
            .iter()
            .filter_map(|s| s.tool())
            .any(|t| t.call.call_id == call.call_id)
    };
    let missing: Vec<ToolCall> = calls
        .iter()
        .filter(|c| !recorded(c))
        .map(|c| (*c).clone())
        .collect();
    if !missing.is_empty() {
        // A call the client runs, or one it must approve first, sends the whole batch back to it.
        let for_the_client =
            |c: &ToolCall| !c.is_server_call(input.registered) || c.awaits_approval();
        if batch_steps.is_empty() && missing.iter().any(for_the_client) {
            return NextAction::HandBack { calls: missing };
        }
        if input.deadline_passed {
            return incomplete(IncompleteReason::Deadline);
        }
        let run_so_far = steps.iter().filter(|s| s.tool().is_some()).count();
        if let Some(max) = input.limits.max_tool_calls {
            if run_so_far + missing.len() > max as usize {
                return incomplete(IncompleteReason::MaxToolCalls);
            }
        }
        return NextAction::DispatchBatch {
            batch: batch_id,
            calls: missing,
        };
    }

    let unfinished: Vec<u32> = batch_steps
        .iter()
        .filter(|s| !s.state.is_ended())
        .map(|s| s.seq)
        .collect();
    if !unfinished.is_empty() {
        if input.deadline_passed {
            return incomplete(IncompleteReason::Deadline);
        }
        return NextAction::RunTools { seqs: unfinished };
    }
    if trailing_failing_batches(steps) >= input.limits.max_failing_batches {
        return incomplete(IncompleteReason::ToolFailures);
    }
    call_model(input)
}

fn call_model(input: &LoopInput<'_>) -> NextAction {
    let model_calls = input.steps.iter().filter(|s| s.model().is_some()).count();
    if model_calls >= input.limits.max_model_calls as usize {
        return incomplete(IncompleteReason::MaxModelCalls);
    }
    if input.deadline_passed {
        return incomplete(IncompleteReason::Deadline);
    }
    if input.budget_spent {
        return incomplete(IncompleteReason::BudgetExceeded);
    }
    NextAction::CallModel
}

fn incomplete(reason: IncompleteReason) -> NextAction {
    NextAction::Incomplete { reason }
}

/// How many batches in a row, counting back from the last, ended with every call failed.
fn trailing_failing_batches(steps: &[Step]) -> u32 {
    let mut batches: Vec<(Option<u32>, bool)> = Vec::new();
    for tool in steps.iter().filter_map(Step::tool) {
        let failed = tool_failed(tool);
        match batches.last_mut() {
            Some((batch, all_failed)) if *batch == tool.batch => *all_failed &= failed,
            _ => batches.push((tool.batch, failed)),
        }
    }
    batches
        .iter()
        .rev()
        .take_while(|(_, all_failed)| *all_failed)
        .count() as u32
}

fn tool_failed(tool: &ToolStep) -> bool {
    tool.outcome.as_ref().is_some_and(|o| o.is_error())
}

#[cfg(test)]
mod tests;
