//! Stored steps of a response: model calls, server tool calls and listings of the MCP servers a request names, with
//! explicit states, usage, tool outcomes and approvals.

use serde::{Deserialize, Serialize};
use serde_with::skip_serializing_none;

use crate::response::FailureCode;

/// Where a step stands. A step is written before its side effect and updated after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepState {
    /// Recorded, not started.
    Pending,
    /// The side effect was started (an upstream request or a tool request may be in flight).
    Running,
    /// Ended with a usable result.
    Succeeded,
    /// Ended with an error; for a tool step the error is still the model's result.
    Failed,
}

impl StepState {
    /// Whether the step has ended, one way or the other.
    pub fn is_ended(self) -> bool {
        matches!(self, StepState::Succeeded | StepState::Failed)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            StepState::Pending => "pending",
            StepState::Running => "running",
            StepState::Succeeded => "succeeded",
            StepState::Failed => "failed",
        }
    }

    pub fn parse(text: &str) -> Option<StepState> {
        match text {
            "pending" => Some(StepState::Pending),
            "running" => Some(StepState::Running),
            "succeeded" => Some(StepState::Succeeded),
            "failed" => Some(StepState::Failed),
            _ => None,
        }
    }
}

/// One step of a response's loop, in order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Step {
    /// Position in the response, from 0.
    pub seq: u32,
    pub state: StepState,
    pub body: StepBody,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum StepBody {
    Model(ModelStep),
    Tool(ToolStep),
    /// The tools of a remote MCP server named in the request, listed when the response was created (SPEC 12).
    Listing(ListingStep),
}

/// A remote MCP server's `tools/list`, shown as an `mcp_list_tools` item.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ListingStep {
    pub item_id: String,
    pub server_label: String,
    /// `{name, description, input_schema, annotations}` per tool.
    #[serde(default)]
    pub tools: Vec<serde_json::Value>,
}

/// A call to the upstream model: what came back, normalised, or why it failed.
#[skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ModelStep {
    pub output: Option<ModelOutput>,
    pub failure: Option<UpstreamFailure>,
    /// The fallback deployment that answered, when the response's own deployment did not (SPEC 8).
    pub deployment: Option<String>,
}

/// A model call's normalised result, whatever the provider.
#[skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ModelOutput {
    /// Assistant text, if any, with the id of the message item that shows it.
    pub message: Option<AssistantMessage>,
    #[serde(default)]
    pub tool_calls: Vec<ToolCall>,
    pub usage: Option<Usage>,
    pub finish: Finish,
    /// Thinking (Anthropic) or reasoning (Responses) the model produced, each with its id, as `reasoning` items
    /// whose `encrypted_content` carries what the provider needs to have it replayed ([`crate::reasoning`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reasoning: Vec<crate::items::ReasoningItem>,
}

/// What a streamed model call produced that the client may see at once, whatever the provider. Its
/// accumulation is the call's `ModelOutput`; deltas are only passed on, never stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelDelta {
    /// Assistant text, continuing the call's message.
    Text(String),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AssistantMessage {
    pub item_id: String,
    pub text: String,
    /// How the text streamed: the length in characters of each delta a client was shown, in order. Empty when
    /// it did not stream; it is then shown as one delta. Kept so that a replay of the stream equals the original.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deltas: Vec<u32>,
}

impl AssistantMessage {
    /// A message that did not stream.
    pub fn whole(item_id: impl Into<String>, text: impl Into<String>) -> AssistantMessage {
        AssistantMessage {
            item_id: item_id.into(),
            text: text.into(),
            deltas: Vec::new(),
        }
    }

    /// The text cut as it streamed: one piece per recorded delta, or the whole text when the lengths are
    /// missing or do not add up to it.
    pub fn pieces(&self) -> Vec<&str> {
        let total: u64 = self.deltas.iter().map(|&n| u64::from(n)).sum();
        if self.deltas.is_empty() || total != self.text.chars().count() as u64 {
            return vec![self.text.as_str()];
        }
        let mut pieces = Vec::with_capacity(self.deltas.len());
        let mut rest = self.text.as_str();
        for &chars in &self.deltas {
            let end = rest
                .char_indices()
                .nth(chars as usize)
                .map_or(rest.len(), |(at, _)| at);
            let (piece, tail) = rest.split_at(end);
            pieces.push(piece);
            rest = tail;
        }
        pieces
    }
}

/// Why the model stopped, normalised. Tool calls are decided from `tool_calls`, never from this.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Finish {
    #[default]
    Stop,
    ToolCalls,
    Length,
    ContentFilter,
}

/// A tool call the model asked for. `call_id` is never empty: missing upstream ids are synthesised.
///
/// `name` and `namespace` are the tool's own, as the client declared it; the model saw the flat name
/// ([`crate::toolset::flat_name`]).
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// Id of the output item that shows this call (`fc_...`, `ctc_...` or `mcp_...`).
    pub item_id: String,
    pub call_id: String,
    pub namespace: Option<String>,
    pub name: String,
    /// JSON text of the arguments as the model produced it; for a custom tool, its free-form input.
    pub arguments: String,
    #[serde(default, skip_serializing_if = "CallKind::is_function")]
    pub kind: CallKind,
    /// For a tool of a remote MCP server named in the request: whether the client must approve the call first,
    /// or approved it (SPEC 12).
    pub approval: Option<Approval>,
}

/// Where a remote MCP tool call stands with the client's approval.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum Approval {
    /// The call waits for the client: it is handed back as an `mcp_approval_request` of `server_label`.
    Required { server_label: String },
    /// The client approved the request `request_id`: the call runs, and its `mcp_call` names the request.
    Granted { request_id: String },
}

/// Whether a call takes JSON arguments (a function) or free-form text (a custom tool).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CallKind {
    #[default]
    Function,
    Custom,
}

impl CallKind {
    pub fn is_function(&self) -> bool {
        *self == CallKind::Function
    }
}

impl ToolCall {
    /// A call of a function tool outside any namespace: what upstreams produce before the toolset names it.
    pub fn function(
        item_id: impl Into<String>,
        call_id: impl Into<String>,
        name: impl Into<String>,
        arguments: impl Into<String>,
    ) -> ToolCall {
        ToolCall {
            item_id: item_id.into(),
            call_id: call_id.into(),
            namespace: None,
            name: name.into(),
            arguments: arguments.into(),
            kind: CallKind::Function,
            approval: None,
        }
    }

    /// Whether the client must approve this call before it runs.
    pub fn awaits_approval(&self) -> bool {
        matches!(self.approval, Some(Approval::Required { .. }))
    }

    /// Whether the gateway runs this call: a plain function named like one of the server tools. A call inside a
    /// namespace, or of a custom tool, is always the client's.
    pub fn is_server_call(&self, registered: &std::collections::BTreeSet<String>) -> bool {
        self.namespace.is_none() && self.kind.is_function() && registered.contains(&self.name)
    }
}

/// Token usage of one model call (or of a whole response, summed).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub input_tokens: u64,
    pub output_tokens: u64,
    #[serde(default)]
    pub cached_tokens: u64,
    #[serde(default)]
    pub reasoning_tokens: u64,
}

impl Usage {
    /// Adds `other`, each count held at `u64::MAX`: usage is what an upstream reported, and no report may
    /// overflow a sum (a panic in a debug build, a wrapped count in a release one).
    pub fn add(&mut self, other: &Usage) {
        self.input_tokens = self.input_tokens.saturating_add(other.input_tokens);
        self.output_tokens = self.output_tokens.saturating_add(other.output_tokens);
        self.cached_tokens = self.cached_tokens.saturating_add(other.cached_tokens);
        self.reasoning_tokens = self.reasoning_tokens.saturating_add(other.reasoning_tokens);
    }

    pub fn total_tokens(&self) -> u64 {
        self.input_tokens.saturating_add(self.output_tokens)
    }
}

/// Why an upstream call failed for good (after the adapter's retries).
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UpstreamFailure {
    pub message: String,
    /// What the response's `error.code` says when this failure ends it: `upstream_rejected` when the provider
    /// refused the request as the client's problem.
    #[serde(default, skip_serializing_if = "FailureCode::is_server_error")]
    pub code: FailureCode,
    /// Text a streaming client had already been shown when the call broke off: it stays in the
    /// response's output as an `incomplete` message, as the client saw it.
    pub partial: Option<AssistantMessage>,
    /// The call was cut because the response's deadline passed: the response ends `incomplete` (deadline), with
    /// what was shown of the call, rather than `failed`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cut_by_deadline: bool,
}

/// One server tool call: the model's call, and its outcome once it ended.
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolStep {
    /// Id of the `mcp_call` item that shows this run to the client.
    pub item_id: String,
    pub call: ToolCall,
    /// The model step whose batch this call belongs to; `None` for calls carried over from a
    /// previous response's passed-through batch.
    pub batch: Option<u32>,
    pub outcome: Option<ToolOutcome>,
    /// Among the calls that ran together, the order in which this one ended (0 first), as a stream showed
    /// them: kept so that a replay of the stream equals the original.
    pub ended_rank: Option<u32>,
    /// When the call was last sent, and when it ended (Unix milliseconds), for the tool-call audit.
    pub started_at_ms: Option<i64>,
    pub ended_at_ms: Option<i64>,
    /// Progress notes rendered from the source's templates (SPEC 7), kept with the step so that a replay of
    /// the stream shows them as the live stream did.
    #[serde(default, skip_serializing_if = "ToolNotes::is_empty")]
    pub notes: ToolNotes,
    /// The `server_label` its `mcp_call` item shows: the MCP source's name; `None` for HTTP tools ("gateway").
    pub server_label: Option<String>,
    /// The hosted tool type (`web_search`, ...) whose bound source ran this call (SPEC 12): clients see the
    /// hosted item type rather than `mcp_call` (see [`crate::output::hosted_item_kind`]).
    pub hosted_type: Option<String>,
}

impl ToolStep {
    /// A call not yet sent, shown as item `item_id`: it has no outcome, rank, times or notes yet.
    pub fn unsent(
        item_id: String,
        call: ToolCall,
        batch: Option<u32>,
        server_label: Option<String>,
        hosted_type: Option<String>,
    ) -> ToolStep {
        ToolStep {
            item_id,
            call,
            batch,
            outcome: None,
            ended_rank: None,
            started_at_ms: None,
            ended_at_ms: None,
            notes: ToolNotes::default(),
            server_label,
            hosted_type,
        }
    }
}

/// The rendered progress notes of one tool call.
#[skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolNotes {
    /// Shown when the call starts.
    pub on_request: Option<String>,
    /// Shown when the call ends.
    pub on_result: Option<String>,
}

impl ToolNotes {
    pub fn is_empty(&self) -> bool {
        self.on_request.is_none() && self.on_result.is_none()
    }
}

/// What a tool call produced. Both variants are results the model sees.
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ToolOutcome {
    Output {
        text: String,
    },
    Error {
        message: String,
        /// The status of a tool that answered non-2xx.
        http_status: Option<u16>,
    },
}

impl ToolOutcome {
    /// An error that is not an HTTP answer (timeout, bad arguments, unreachable tool...).
    pub fn error(message: impl Into<String>) -> ToolOutcome {
        ToolOutcome::Error {
            message: message.into(),
            http_status: None,
        }
    }

    /// What a `note_on_result` template reads: the call's arguments (an object), with `result` (the output, as
    /// JSON when it parses, else as text) or `error` (the error message) added.
    pub fn note_values(&self, arguments: &str) -> serde_json::Value {
        let mut values = match serde_json::from_str::<serde_json::Value>(arguments) {
            Ok(serde_json::Value::Object(map)) => map,
            _ => serde_json::Map::new(),
        };
        match self {
            ToolOutcome::Output { text } => {
                let result = serde_json::from_str(text)
                    .unwrap_or_else(|_| serde_json::Value::String(text.clone()));
                values.insert("result".into(), result);
            }
            ToolOutcome::Error { message, .. } => {
                values.insert("error".into(), serde_json::Value::String(message.clone()));
            }
        }
        serde_json::Value::Object(values)
    }

    /// The `function_call_output` text the model sees: the output, or `{"error": {...}}`.
    pub fn model_text(&self) -> String {
        match self {
            ToolOutcome::Output { text } => text.clone(),
            ToolOutcome::Error {
                message,
                http_status,
            } => {
                let mut error = serde_json::json!({"message": message});
                if let Some(status) = http_status {
                    error["status"] = serde_json::json!(status);
                }
                serde_json::json!({ "error": error }).to_string()
            }
        }
    }

    /// The `error` of an `mcp_call` item: OpenAI's `http_error` or `mcp_tool_execution_error` object.
    pub fn mcp_error(&self) -> Option<serde_json::Value> {
        match self {
            ToolOutcome::Output { .. } => None,
            ToolOutcome::Error {
                message,
                http_status: Some(status),
            } => {
                Some(serde_json::json!({"type": "http_error", "code": status, "message": message}))
            }
            ToolOutcome::Error {
                message,
                http_status: None,
            } => Some(serde_json::json!({
                "type": "mcp_tool_execution_error",
                "content": [{"type": "text", "text": message}],
            })),
        }
    }

    pub fn is_error(&self) -> bool {
        matches!(self, ToolOutcome::Error { .. })
    }
}

impl Step {
    pub fn model(&self) -> Option<&ModelStep> {
        match &self.body {
            StepBody::Model(model) => Some(model),
            StepBody::Tool(_) | StepBody::Listing(_) => None,
        }
    }

    pub fn tool(&self) -> Option<&ToolStep> {
        match &self.body {
            StepBody::Tool(tool) => Some(tool),
            StepBody::Model(_) | StepBody::Listing(_) => None,
        }
    }

    pub fn listing(&self) -> Option<&ListingStep> {
        match &self.body {
            StepBody::Listing(listing) => Some(listing),
            StepBody::Model(_) | StepBody::Tool(_) => None,
        }
    }
}

/// The summed usage of every model call among `steps`.
pub fn total_usage(steps: &[Step]) -> Usage {
    let mut usage = Usage::default();
    for step in steps {
        if let Some(u) = step
            .model()
            .and_then(|m| m.output.as_ref())
            .and_then(|o| o.usage.as_ref())
        {
            usage.add(u);
        }
    }
    usage
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_streamed_message_is_cut_as_it_streamed_and_an_unstreamed_one_whole() {
        let streamed = AssistantMessage {
            deltas: vec![2, 1, 3],
            ..AssistantMessage::whole("msg_1", "héllo!")
        };
        assert_eq!(streamed.pieces(), ["hé", "l", "lo!"]);
        assert_eq!(
            AssistantMessage::whole("msg_1", "héllo!").pieces(),
            ["héllo!"]
        );
        let wrong = AssistantMessage {
            deltas: vec![2, 2],
            ..AssistantMessage::whole("msg_1", "héllo!")
        };
        assert_eq!(wrong.pieces(), ["héllo!"], "lengths that do not add up");
    }
}
