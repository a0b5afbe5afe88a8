//! Stream events as a pure projection of a response's progress.
//!
//! The loop reports what happened ([`Progress`]: the response started, text arrived, a model call ended, tool
//! calls started and ended, a batch was handed back, the response ended); [`EventProjection`] turns each report
//! into the Responses API events a client sees, numbered from 0 without gaps, with output indices that match the
//! final `output` array. It holds no IO: the shell feeds it and sends what [`EventProjection::poll`] gives.
//!
//! [`replay`] feeds the same projection the progress that a stored response's steps record, in the order it
//! happened, so that the events of a stored response equal those its live stream sent, sequence numbers
//! included: a client can re-attach to a stream and read on from where it was.

use std::collections::{BTreeMap, VecDeque};

use serde_json::{json, Map, Value};

use crate::items::Item;
use crate::output::{
    assistant_message, hosted_item_kind, listing_item, mcp_call_item, message_with_status,
    render_output, response_object,
};
use crate::response::{Ending, ResponseRecord, ResponseStatus};
use crate::steps::{AssistantMessage, CallKind, ModelOutput, Step, StepBody, StepState, ToolCall};
use crate::toolset::call_item;

/// A progress note of a server tool call: `gateway:tool_note`.
pub const TOOL_NOTE: &str = "gateway:tool_note";

/// One event of a response stream: its `type` and its whole JSON object (which repeats the type and carries
/// its `sequence_number`).
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    pub kind: &'static str,
    pub data: Value,
}

impl Event {
    pub fn sequence_number(&self) -> u64 {
        self.data
            .get("sequence_number")
            .and_then(Value::as_u64)
            .unwrap_or(0)
    }

    /// The same event under sequence number `n`.
    pub fn renumbered(mut self, n: u64) -> Event {
        if let Some(data) = self.data.as_object_mut() {
            data.insert("sequence_number".to_owned(), Value::from(n));
        }
        self
    }
}

/// What the loop reports as a response runs, in the order it happens.
#[derive(Debug, Clone, Copy)]
pub enum Progress<'a> {
    /// The response was created: `response.created`, and for a background response (created queued)
    /// `response.queued`.
    Created { record: &'a ResponseRecord },
    /// The response's loop started: `response.in_progress`.
    Running { record: &'a ResponseRecord },
    /// A piece of model text, as the upstream produced it.
    TextDelta { item_id: &'a str, delta: &'a str },
    /// A model call ended with this output; its message, if any, is complete.
    ModelEnded { output: &'a ModelOutput },
    /// A model call failed; `partial` is the text a client was already shown, which ends `incomplete`.
    ModelFailed {
        partial: Option<&'a AssistantMessage>,
    },
    /// A remote MCP server's tools were listed when the response was created: its `mcp_list_tools` item.
    Listed { step: &'a Step },
    /// These tool steps started running (steps already announced are skipped).
    ToolsStarted { steps: &'a [&'a Step] },
    /// A tool step ended (its outcome is set).
    ToolEnded { step: &'a Step },
    /// The last batch goes back to the client as `function_call` items.
    HandedBack { calls: &'a [ToolCall] },
    /// The response ended; `output` is its final output.
    Ended {
        record: &'a ResponseRecord,
        output: &'a [Item],
    },
}

/// The message item being streamed.
#[derive(Debug, Clone, PartialEq)]
struct OpenMessage {
    item_id: String,
    output_index: usize,
    text: String,
}

/// The state of one response's event stream: sequence numbers, output indices, the message being streamed and
/// the tool items shown so far.
#[derive(Debug, Clone, Default)]
pub struct EventProjection {
    next_sequence_number: u64,
    next_output_index: usize,
    open_message: Option<OpenMessage>,
    /// Output index of each tool step shown, by step seq.
    tool_items: BTreeMap<u32, usize>,
    /// The request's `include`: whether reasoning items show their `encrypted_content`.
    include: Option<Vec<String>>,
    ready: VecDeque<Event>,
}

impl EventProjection {
    pub fn new() -> EventProjection {
        EventProjection::default()
    }

    /// The next event to send, if any.
    pub fn poll(&mut self) -> Option<Event> {
        self.ready.pop_front()
    }

    /// Takes one report of the loop's progress; its events become available to [`poll`](Self::poll).
    pub fn handle(&mut self, progress: Progress<'_>) {
        match progress {
            Progress::Created { record } => {
                self.include = record.params.include.clone();
                let created = response_object(&record.as_started(), &[]);
                self.emit("response.created", json!({"response": created}));
                if record.background {
                    self.emit("response.queued", json!({"response": created}));
                }
            }
            Progress::Running { record } => {
                let running = response_object(&record.as_in_progress(), &[]);
                self.emit("response.in_progress", json!({"response": running}));
            }
            Progress::TextDelta { item_id, delta } => self.text_delta(item_id, delta),
            Progress::ModelEnded { output } => self.model_ended(output),
            Progress::ModelFailed { partial } => self.model_failed(partial),
            Progress::ToolsStarted { steps } => {
                for step in steps {
                    self.tool_started(step);
                }
            }
            Progress::ToolEnded { step } => self.tool_ended(step),
            Progress::Listed { step } => self.listed(step),
            Progress::HandedBack { calls } => {
                for call in calls {
                    self.handed_back(call);
                }
            }
            Progress::Ended { record, output } => self.ended(record, output),
        }
    }

    fn text_delta(&mut self, item_id: &str, delta: &str) {
        let output_index = match &self.open_message {
            Some(open) => open.output_index,
            None => {
                let output_index = self.take_output_index();
                let item = json!({"id": item_id, "type": "message", "status": "in_progress", "role": "assistant", "content": []});
                self.emit(
                    "response.output_item.added",
                    json!({"output_index": output_index, "item": item}),
                );
                self.emit(
                    "response.content_part.added",
                    json!({"item_id": item_id, "output_index": output_index, "content_index": 0, "part": text_part("")}),
                );
                self.open_message = Some(OpenMessage {
                    item_id: item_id.to_owned(),
                    output_index,
                    text: String::new(),
                });
                output_index
            }
        };
        if let Some(open) = &mut self.open_message {
            open.text.push_str(delta);
        }
        self.emit(
            "response.output_text.delta",
            json!({"item_id": item_id, "output_index": output_index, "content_index": 0, "delta": delta, "logprobs": []}),
        );
    }

    /// Closes the streamed message with the model's text; a message that did not stream is shown whole.
    fn model_ended(&mut self, output: &ModelOutput) {
        match &output.message {
            None => self.open_message = None,
            Some(message) => {
                if self.open_message.is_none() {
                    for piece in message.pieces() {
                        self.text_delta(&message.item_id, piece);
                    }
                }
                self.close_message(&message.text, "completed");
            }
        }
        for reasoning in &output.reasoning {
            let item = crate::reasoning::shown(
                &Item::Reasoning(reasoning.clone()),
                self.include.as_deref(),
            );
            let index = self.take_output_index();
            let mut added = item_json(&item);
            added["status"] = json!("in_progress");
            self.emit(
                "response.output_item.added",
                json!({"output_index": index, "item": added}),
            );
            self.emit(
                "response.output_item.done",
                json!({"output_index": index, "item": item_json(&item)}),
            );
        }
    }

    fn model_failed(&mut self, partial: Option<&AssistantMessage>) {
        let text = match (partial, &self.open_message) {
            (Some(partial), _) => partial.text.clone(),
            (None, Some(open)) => open.text.clone(),
            (None, None) => return,
        };
        self.close_message(&text, "incomplete");
    }

    fn close_message(&mut self, text: &str, status: &str) {
        let Some(open) = self.open_message.take() else {
            return;
        };
        let (id, index) = (open.item_id.as_str(), open.output_index);
        self.emit(
            "response.output_text.done",
            json!({"item_id": id, "output_index": index, "content_index": 0, "text": text, "logprobs": []}),
        );
        self.emit(
            "response.content_part.done",
            json!({"item_id": id, "output_index": index, "content_index": 0, "part": text_part(text)}),
        );
        let item = if status == "completed" {
            assistant_message(id, text)
        } else {
            message_with_status(id, text, status)
        };
        self.emit(
            "response.output_item.done",
            json!({"output_index": index, "item": item_json(&item)}),
        );
    }

    fn tool_started(&mut self, step: &Step) {
        let Some(tool) = step.tool() else { return };
        if self.tool_items.contains_key(&step.seq) {
            return;
        }
        let index = self.take_output_index();
        self.tool_items.insert(step.seq, index);
        // As OpenAI streams an `mcp_call`: the item added with empty arguments, the arguments as a delta and a
        // done, then the call in progress.
        let mut running = tool.clone();
        running.outcome = None;
        if tool.hosted_type.as_deref().and_then(hosted_item_kind) == Some("web_search_call") {
            // As OpenAI streams a `web_search_call`: added in progress (its query known), then in progress and
            // searching.
            self.emit(
                "response.output_item.added",
                json!({"output_index": index, "item": item_json(&mcp_call_item(&running))}),
            );
            self.emit(
                "response.web_search_call.in_progress",
                json!({"item_id": tool.item_id, "output_index": index}),
            );
            self.emit(
                "response.web_search_call.searching",
                json!({"item_id": tool.item_id, "output_index": index}),
            );
            if let Some(label) = &tool.notes.on_request {
                self.note(&tool.item_id, index, "request", label, "in_progress");
            }
            return;
        }
        running.call.arguments = String::new();
        self.emit(
            "response.output_item.added",
            json!({"output_index": index, "item": item_json(&mcp_call_item(&running))}),
        );
        self.emit(
            "response.mcp_call_arguments.delta",
            json!({"item_id": tool.item_id, "output_index": index, "delta": tool.call.arguments}),
        );
        self.emit(
            "response.mcp_call_arguments.done",
            json!({"item_id": tool.item_id, "output_index": index, "arguments": tool.call.arguments}),
        );
        self.emit(
            "response.mcp_call.in_progress",
            json!({"item_id": tool.item_id, "output_index": index}),
        );
        if let Some(label) = &tool.notes.on_request {
            self.note(&tool.item_id, index, "request", label, "in_progress");
        }
    }

    /// A progress note (SPEC 7): an extension event, named with the gateway's slug, that clients which do not
    /// know it skip.
    fn note(&mut self, item_id: &str, index: usize, phase: &str, label: &str, detail: &str) {
        self.emit(
            TOOL_NOTE,
            json!({"item_id": item_id, "output_index": index, "phase": phase, "label": label, "detail": detail}),
        );
    }

    fn tool_ended(&mut self, step: &Step) {
        let (Some(tool), Some(&index)) = (step.tool(), self.tool_items.get(&step.seq)) else {
            return;
        };
        let failed = tool.outcome.as_ref().is_some_and(|o| o.is_error());
        let web_search =
            tool.hosted_type.as_deref().and_then(hosted_item_kind) == Some("web_search_call");
        // OpenAI has no `web_search_call.failed` event: a failed search shows in its done item's status.
        let kind = match (web_search, failed) {
            (false, true) => Some("response.mcp_call.failed"),
            (false, false) => Some("response.mcp_call.completed"),
            (true, false) => Some("response.web_search_call.completed"),
            (true, true) => None,
        };
        if let Some(kind) = kind {
            self.emit(
                kind,
                json!({"item_id": tool.item_id, "output_index": index}),
            );
        }
        if let Some(label) = &tool.notes.on_result {
            let status = if failed { "failed" } else { "completed" };
            self.note(&tool.item_id, index, "result", label, status);
        }
        self.emit(
            "response.output_item.done",
            json!({"output_index": index, "item": item_json(&mcp_call_item(tool))}),
        );
    }

    /// A listing, as OpenAI streams `mcp_list_tools`: the item added without its tools, in progress, completed,
    /// then the item done with them.
    fn listed(&mut self, step: &Step) {
        let Some(listing) = step.listing() else {
            return;
        };
        let index = self.take_output_index();
        let item = listing_item(listing);
        let mut added = item_json(&item);
        added["tools"] = json!([]);
        self.emit(
            "response.output_item.added",
            json!({"output_index": index, "item": added}),
        );
        self.emit(
            "response.mcp_list_tools.in_progress",
            json!({"item_id": listing.item_id, "output_index": index}),
        );
        self.emit(
            "response.mcp_list_tools.completed",
            json!({"item_id": listing.item_id, "output_index": index}),
        );
        self.emit(
            "response.output_item.done",
            json!({"output_index": index, "item": item_json(&item)}),
        );
    }

    /// A handed-back call: a `function_call` item with its arguments streamed whole, a `custom_tool_call` with
    /// its input, or an `mcp_approval_request` (added and done, as OpenAI streams it).
    fn handed_back(&mut self, call: &ToolCall) {
        let index = self.take_output_index();
        if call.awaits_approval() {
            let item = item_json(&call_item(call, "completed"));
            self.emit(
                "response.output_item.added",
                json!({"output_index": index, "item": item}),
            );
            self.emit(
                "response.output_item.done",
                json!({"output_index": index, "item": item}),
            );
            return;
        }
        let empty = ToolCall {
            arguments: String::new(),
            ..call.clone()
        };
        self.emit(
            "response.output_item.added",
            json!({"output_index": index, "item": item_json(&call_item(&empty, "in_progress"))}),
        );
        match call.kind {
            CallKind::Function => {
                self.emit(
                    "response.function_call_arguments.delta",
                    json!({"item_id": call.item_id, "output_index": index, "delta": call.arguments}),
                );
                self.emit(
                    "response.function_call_arguments.done",
                    json!({"item_id": call.item_id, "output_index": index, "name": call.name, "arguments": call.arguments}),
                );
            }
            CallKind::Custom => {
                self.emit(
                    "response.custom_tool_call_input.delta",
                    json!({"item_id": call.item_id, "output_index": index, "delta": call.arguments}),
                );
                self.emit(
                    "response.custom_tool_call_input.done",
                    json!({"item_id": call.item_id, "output_index": index, "input": call.arguments}),
                );
            }
        }
        self.emit(
            "response.output_item.done",
            json!({"output_index": index, "item": item_json(&call_item(call, "completed"))}),
        );
    }

    /// The one terminal event, carrying the whole response; a failure is told first in an `error` event.
    fn ended(&mut self, record: &ResponseRecord, output: &[Item]) {
        let kind = match record.ending() {
            Some(Ending::Completed { .. }) => "response.completed",
            Some(Ending::Incomplete { .. }) => "response.incomplete",
            Some(Ending::Cancelled) => "response.cancelled",
            Some(Ending::Failed { code, message }) => {
                let (kind, code) = (code.error_type(), code.as_str());
                self.emit("error", error_fields(kind, code, message));
                "response.failed"
            }
            None => return,
        };
        self.emit(kind, json!({"response": response_object(record, output)}));
    }

    fn take_output_index(&mut self) -> usize {
        let index = self.next_output_index;
        self.next_output_index += 1;
        index
    }

    /// Queues the event `kind` with `fields`, stamped with its type and the next sequence number.
    fn emit(&mut self, kind: &'static str, fields: Value) {
        let mut data = match fields {
            Value::Object(map) => map,
            _ => Map::new(),
        };
        data.insert("type".into(), json!(kind));
        data.insert("sequence_number".into(), json!(self.next_sequence_number));
        self.next_sequence_number += 1;
        self.ready.push_back(Event {
            kind,
            data: Value::Object(data),
        });
    }
}

/// The fields of an `error` event, nested and flat, so that the OpenAI spec, the Open Responses schema and the SDKs
/// all read it.
fn error_fields(kind: &str, code: &str, message: &str) -> Value {
    json!({"code": code, "message": message, "param": null,
           "error": {"type": kind, "code": code, "message": message, "param": null}})
}

/// An `error` event numbered `sequence_number`, for a stream that ends without its response's terminal event (the
/// response was deleted, or given up to another replica): `kind` is the error's type, `code` its code.
pub fn stream_error(sequence_number: u64, kind: &str, code: &str, message: &str) -> Event {
    let mut data = match error_fields(kind, code, message) {
        Value::Object(map) => map,
        _ => Map::new(),
    };
    data.insert("type".into(), json!("error"));
    data.insert("sequence_number".into(), json!(sequence_number));
    Event {
        kind: "error",
        data: Value::Object(data),
    }
}

/// The progress that a response's stored steps record, in the order it happened, fed to `projection`: its
/// creation and start, then each model call and each run of tool calls, then (for an ended response) the
/// hand-back and the end. A model call that never ended shows nothing (it is made again when the response
/// resumes). A background response that is still queued, or that a cancel ended before it started, never ran.
pub fn project_stored(projection: &mut EventProjection, record: &ResponseRecord, steps: &[Step]) {
    projection.handle(Progress::Created { record });
    let never_ran = record.status() == ResponseStatus::Queued
        || (record.ending() == Some(&Ending::Cancelled) && steps.is_empty());
    if !never_ran {
        projection.handle(Progress::Running { record });
    }
    let mut index = 0;
    while index < steps.len() {
        match &steps[index].body {
            StepBody::Model(model) => {
                if let Some(output) = &model.output {
                    if let Some(message) = &output.message {
                        for piece in message.pieces() {
                            projection.handle(Progress::TextDelta {
                                item_id: &message.item_id,
                                delta: piece,
                            });
                        }
                    }
                    projection.handle(Progress::ModelEnded { output });
                } else if let Some(failure) = &model.failure {
                    if let Some(partial) = &failure.partial {
                        for piece in partial.pieces() {
                            projection.handle(Progress::TextDelta {
                                item_id: &partial.item_id,
                                delta: piece,
                            });
                        }
                    }
                    projection.handle(Progress::ModelFailed {
                        partial: failure.partial.as_ref(),
                    });
                }
                index += 1;
            }
            StepBody::Listing(_) => {
                if !never_ran {
                    projection.handle(Progress::Listed {
                        step: &steps[index],
                    });
                }
                index += 1;
            }
            StepBody::Tool(first) => {
                // The tool steps that ran together: consecutive ones of the same batch.
                let run: Vec<&Step> = steps[index..]
                    .iter()
                    .take_while(|s| s.tool().is_some_and(|t| t.batch == first.batch))
                    .collect();
                index += run.len();
                let started: Vec<&Step> = run
                    .iter()
                    .copied()
                    .filter(|s| s.state != StepState::Pending)
                    .collect();
                projection.handle(Progress::ToolsStarted { steps: &started });
                let mut ended: Vec<&Step> = started
                    .iter()
                    .copied()
                    .filter(|s| s.state.is_ended())
                    .collect();
                ended.sort_by_key(|s| (s.tool().and_then(|t| t.ended_rank), s.seq));
                for step in ended {
                    projection.handle(Progress::ToolEnded { step });
                }
            }
        }
    }
    let Some(ending) = record.ending() else {
        return;
    };
    if ending.handed_back() {
        let last_calls = steps
            .iter()
            .rev()
            .find_map(|s| s.model())
            .and_then(|m| m.output.as_ref())
            .map(|o| o.tool_calls.as_slice())
            .unwrap_or_default();
        projection.handle(Progress::HandedBack { calls: last_calls });
    }
    let output = render_output(steps, ending.handed_back());
    projection.handle(Progress::Ended {
        record,
        output: &output,
    });
}

/// Every event of a stored response's stream, as its live stream sent them.
pub fn replay(record: &ResponseRecord, steps: &[Step]) -> Vec<Event> {
    let mut projection = EventProjection::new();
    project_stored(&mut projection, record, steps);
    std::iter::from_fn(|| projection.poll()).collect()
}

/// An `output_text` content part.
pub fn text_part(text: &str) -> Value {
    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
}

fn item_json(item: &Item) -> Value {
    crate::output::client_item_json(item)
}

#[cfg(test)]
mod tests;
