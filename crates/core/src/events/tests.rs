//! The event projection, table-tested: each row is a response's live progress, as the loop reports it, with the
//! events a client must see. Every row also checks that replaying the stored steps gives the very same events,
//! and that the items' output indices are their places in the final `output`.

use serde_json::json;

use super::*;
use crate::decide::IncompleteReason;
use crate::request::ResponseParams;
use crate::response::ResponseState;
use crate::steps::{Finish, ModelStep, ToolOutcome, ToolStep, UpstreamFailure};

fn params() -> ResponseParams {
    ResponseParams::default()
}

fn ended(ending: Ending) -> ResponseRecord {
    ResponseRecord {
        id: "resp_1".into(),
        created_at: 1_700_000_000,
        model: "m".into(),
        params: params(),
        previous_response_id: None,
        store: true,
        background: false,
        state: ResponseState::Ended {
            ending,
            completed_at: 1_700_000_001,
        },
        usage: Some(Default::default()),
    }
}

fn call(call_id: &str) -> ToolCall {
    ToolCall::function(
        format!("fc_{call_id}"),
        call_id,
        "search",
        format!("{{\"q\":\"{call_id}\"}}"),
    )
}

/// A streamed message: `pieces` are the deltas as the client saw them.
fn streamed(id: &str, pieces: &[&str]) -> AssistantMessage {
    AssistantMessage {
        item_id: id.into(),
        text: pieces.concat(),
        deltas: pieces.iter().map(|p| p.chars().count() as u32).collect(),
    }
}

fn model(seq: u32, message: Option<AssistantMessage>, calls: &[&str]) -> Step {
    Step {
        seq,
        state: StepState::Succeeded,
        body: StepBody::Model(ModelStep {
            deployment: None,
            output: Some(ModelOutput {
                reasoning: Vec::new(),
                message,
                tool_calls: calls.iter().map(|c| call(c)).collect(),
                usage: None,
                finish: if calls.is_empty() {
                    Finish::Stop
                } else {
                    Finish::ToolCalls
                },
            }),
            failure: None,
        }),
    }
}

fn tool(seq: u32, batch: u32, call_id: &str, failed: bool, ended_rank: u32) -> Step {
    let outcome = if failed {
        ToolOutcome::error("it broke")
    } else {
        ToolOutcome::Output {
            text: format!("out_{call_id}"),
        }
    };
    Step {
        seq,
        state: if failed {
            StepState::Failed
        } else {
            StepState::Succeeded
        },
        body: StepBody::Tool(ToolStep {
            item_id: format!("mcp_{call_id}"),
            call: call(call_id),
            batch: Some(batch),
            outcome: Some(outcome),
            ended_rank: Some(ended_rank),
            started_at_ms: None,
            ended_at_ms: None,
            notes: Default::default(),
            server_label: None,
            hosted_type: None,
        }),
    }
}

fn output_of(step: &Step) -> &ModelOutput {
    step.model().and_then(|m| m.output.as_ref()).unwrap()
}

/// Reports that the model call of `step` ended with its output.
fn model_ended(p: &mut EventProjection, step: &Step) {
    p.handle(Progress::ModelEnded {
        output: output_of(step),
    });
}

/// Reports the pieces of text the model streamed for the message `item_id`.
fn text_deltas(p: &mut EventProjection, item_id: &str, pieces: &[&str]) {
    for delta in pieces {
        p.handle(Progress::TextDelta { item_id, delta });
    }
}

/// Feeds the live progress of a run to a fresh projection and collects the events.
fn live(
    record: &ResponseRecord,
    steps: &[Step],
    feed: &dyn Fn(&mut EventProjection),
) -> Vec<Event> {
    let mut projection = EventProjection::new();
    projection.handle(Progress::Created { record });
    projection.handle(Progress::Running { record });
    feed(&mut projection);
    let ending = record.ending().unwrap();
    let output = render_output(steps, ending.handed_back());
    projection.handle(Progress::Ended {
        record,
        output: &output,
    });
    std::iter::from_fn(|| projection.poll()).collect()
}

/// The first event of `kind`; the test fails without one.
fn first_of<'a>(events: &'a [Event], kind: &str) -> &'a Event {
    match events.iter().find(|e| e.kind == kind) {
        Some(event) => event,
        None => panic!("no {kind} event in {:?}", kinds(events)),
    }
}

fn kinds(events: &[Event]) -> Vec<&'static str> {
    events.iter().map(|e| e.kind).collect()
}

/// Reports a run's live progress, given its steps.
type Feed = Box<dyn Fn(&mut EventProjection, &[Step])>;

struct Row {
    name: &'static str,
    record: ResponseRecord,
    steps: Vec<Step>,
    feed: Feed,
    expected: Vec<&'static str>,
}

const START: [&str; 2] = ["response.created", "response.in_progress"];

fn message_events(deltas: usize) -> Vec<&'static str> {
    let mut kinds = vec!["response.output_item.added", "response.content_part.added"];
    kinds.extend(std::iter::repeat_n("response.output_text.delta", deltas));
    kinds.extend([
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
    ]);
    kinds
}

fn rows() -> Vec<Row> {
    let mcp_added = [
        "response.output_item.added",
        "response.mcp_call_arguments.delta",
        "response.mcp_call_arguments.done",
        "response.mcp_call.in_progress",
    ];
    vec![
        Row {
            name: "text",
            record: ended(Ending::Completed { handed_back: false }),
            steps: vec![model(
                0,
                Some(streamed("msg_1", &["Hel", "lo ", "wörld"])),
                &[],
            )],
            feed: Box::new(|p, steps| {
                text_deltas(p, "msg_1", &["Hel", "lo ", "wörld"]);
                model_ended(p, &steps[0]);
            }),
            expected: [
                START.to_vec(),
                message_events(3),
                vec!["response.completed"],
            ]
            .concat(),
        },
        Row {
            name: "text that did not stream",
            record: ended(Ending::Completed { handed_back: false }),
            steps: vec![model(
                0,
                Some(AssistantMessage::whole("msg_1", "Hello")),
                &[],
            )],
            feed: Box::new(|p, steps| {
                model_ended(p, &steps[0]);
            }),
            expected: [
                START.to_vec(),
                message_events(1),
                vec!["response.completed"],
            ]
            .concat(),
        },
        Row {
            name: "server tool batch, ended out of order, then the answer",
            record: ended(Ending::Completed { handed_back: false }),
            steps: vec![
                model(0, Some(streamed("msg_0", &["Let me look."])), &["a", "b"]),
                tool(1, 0, "a", false, 1),
                tool(2, 0, "b", true, 0),
                model(3, Some(streamed("msg_3", &["Found", " it."])), &[]),
            ],
            feed: Box::new(|p, steps| {
                text_deltas(p, "msg_0", &["Let me look."]);
                model_ended(p, &steps[0]);
                p.handle(Progress::ToolsStarted {
                    steps: &[&steps[1], &steps[2]],
                });
                p.handle(Progress::ToolEnded { step: &steps[2] });
                p.handle(Progress::ToolEnded { step: &steps[1] });
                text_deltas(p, "msg_3", &["Found", " it."]);
                model_ended(p, &steps[3]);
            }),
            expected: [
                START.to_vec(),
                message_events(1),
                mcp_added.to_vec(),
                mcp_added.to_vec(),
                vec!["response.mcp_call.failed", "response.output_item.done"],
                vec!["response.mcp_call.completed", "response.output_item.done"],
                message_events(2),
                vec!["response.completed"],
            ]
            .concat(),
        },
        Row {
            name: "passthrough",
            record: ended(Ending::Completed { handed_back: true }),
            steps: vec![model(0, None, &["a", "b"])],
            feed: Box::new(|p, steps| {
                let output = output_of(&steps[0]);
                p.handle(Progress::ModelEnded { output });
                p.handle(Progress::HandedBack {
                    calls: &output.tool_calls,
                });
            }),
            expected: [
                START.to_vec(),
                [
                    "response.output_item.added",
                    "response.function_call_arguments.delta",
                    "response.function_call_arguments.done",
                    "response.output_item.done",
                ]
                .repeat(2),
                vec!["response.completed"],
            ]
            .concat(),
        },
        Row {
            name: "failure after some text streamed",
            record: ended(Ending::server_error(
                "The upstream model's stream broke off.",
            )),
            steps: vec![Step {
                seq: 0,
                state: StepState::Failed,
                body: StepBody::Model(ModelStep {
                    deployment: None,
                    output: None,
                    failure: Some(UpstreamFailure {
                        message: "The upstream model's stream broke off.".into(),
                        code: Default::default(),
                        partial: Some(streamed("msg_1", &["Hel", "lo"])),
                        cut_by_deadline: false,
                    }),
                }),
            }],
            feed: Box::new(|p, steps| {
                text_deltas(p, "msg_1", &["Hel", "lo"]);
                let partial = steps[0]
                    .model()
                    .and_then(|m| m.failure.as_ref())
                    .and_then(|f| f.partial.as_ref());
                p.handle(Progress::ModelFailed { partial });
            }),
            expected: [
                START.to_vec(),
                message_events(2),
                vec!["error", "response.failed"],
            ]
            .concat(),
        },
        Row {
            name: "incomplete: a batch over max_tool_calls is not run",
            record: ended(Ending::Incomplete {
                reason: IncompleteReason::MaxToolCalls,
            }),
            steps: vec![model(0, None, &["a"])],
            feed: Box::new(|p, steps| {
                model_ended(p, &steps[0]);
            }),
            expected: [START.to_vec(), vec!["response.incomplete"]].concat(),
        },
    ]
}

#[test]
fn each_run_streams_its_events_and_a_replay_of_its_steps_equals_them() {
    for row in rows() {
        let events = live(&row.record, &row.steps, &|p| (row.feed)(p, &row.steps));
        assert_eq!(kinds(&events), row.expected, "{}", row.name);
        let numbers: Vec<u64> = events.iter().map(Event::sequence_number).collect();
        assert_eq!(
            numbers,
            (0..events.len() as u64).collect::<Vec<_>>(),
            "{}",
            row.name
        );
        for event in &events {
            assert_eq!(event.data["type"], event.kind, "{}", row.name);
        }
        assert_eq!(
            replay(&row.record, &row.steps),
            events,
            "{}: replay",
            row.name
        );
    }
}

#[test]
fn item_events_carry_the_index_of_the_item_in_the_final_output() {
    for row in rows() {
        let events = replay(&row.record, &row.steps);
        let terminal = events.last().unwrap();
        let output = terminal.data["response"]["output"]
            .as_array()
            .unwrap()
            .clone();
        for done in events
            .iter()
            .filter(|e| e.kind == "response.output_item.done")
        {
            let index = done.data["output_index"].as_u64().unwrap() as usize;
            assert_eq!(done.data["item"], output[index], "{}", row.name);
        }
    }
}

#[test]
fn the_stream_starts_and_ends_with_the_response_as_it_was_then() {
    let row = &rows()[0];
    let events = replay(&row.record, &row.steps);
    assert_eq!(events[0].data["response"]["status"], "in_progress");
    assert_eq!(events[0].data["response"]["output"], json!([]));
    assert_eq!(events[0].data["response"]["usage"], Value::Null);
    let terminal = events.last().unwrap();
    assert_eq!(terminal.data["response"]["status"], "completed");
    assert_eq!(terminal.data["response"]["output_text"], "Hello wörld");
}

#[test]
fn a_background_stream_starts_queued() {
    let mut record = ended(Ending::Completed { handed_back: false });
    record.background = true;
    let events = replay(&record, &[model(0, None, &[])]);
    assert_eq!(
        kinds(&events)[..3],
        [
            "response.created",
            "response.queued",
            "response.in_progress"
        ]
    );
    assert_eq!(events[0].data["response"]["status"], "queued");
    assert_eq!(events[1].data["response"]["status"], "queued");
    assert_eq!(events[2].data["response"]["status"], "in_progress");
}

#[test]
fn a_background_response_that_never_ran_shows_no_start() {
    let mut queued = ended(Ending::Completed { handed_back: false });
    queued.background = true;
    queued.state = ResponseState::Queued;
    queued.usage = None;
    assert_eq!(
        kinds(&replay(&queued, &[])),
        ["response.created", "response.queued"]
    );
    let mut cancelled = ended(Ending::Cancelled);
    cancelled.background = true;
    assert_eq!(
        kinds(&replay(&cancelled, &[])),
        ["response.created", "response.queued", "response.cancelled"]
    );
    let ran = replay(&cancelled, &[model(0, None, &["a"])]);
    assert_eq!(
        ran[2].kind, "response.in_progress",
        "a cancel after it started"
    );
}

#[test]
fn a_failure_is_told_in_an_error_event_nested_and_flat_before_response_failed() {
    let events = replay(&ended(Ending::server_error("boom")), &[]);
    let error = &events[events.len() - 2];
    assert_eq!(error.kind, "error");
    assert_eq!(error.data["error"]["message"], "boom");
    assert_eq!(error.data["error"]["type"], "server_error");
    assert_eq!(error.data["message"], "boom");
    assert_eq!(error.data["code"], "server_error");
}

#[test]
fn a_response_still_running_replays_what_is_stored_and_no_end() {
    let mut record = ended(Ending::Completed { handed_back: false });
    record.state = ResponseState::InProgress;
    let running_model = Step {
        seq: 3,
        state: StepState::Running,
        body: StepBody::Model(ModelStep::default()),
    };
    let mut running_tool = tool(2, 0, "b", false, 0);
    running_tool.state = StepState::Running;
    if let StepBody::Tool(t) = &mut running_tool.body {
        t.outcome = None;
        t.ended_rank = None;
    }
    let steps = vec![
        model(0, None, &["a", "b"]),
        tool(1, 0, "a", false, 0),
        running_tool,
    ];
    let events = replay(&record, &steps);
    assert_eq!(
        kinds(&events),
        [
            START.as_slice(),
            &[
                "response.output_item.added",
                "response.mcp_call_arguments.delta",
                "response.mcp_call_arguments.done",
                "response.mcp_call.in_progress"
            ],
            &[
                "response.output_item.added",
                "response.mcp_call_arguments.delta",
                "response.mcp_call_arguments.done",
                "response.mcp_call.in_progress"
            ],
            &["response.mcp_call.completed", "response.output_item.done"],
        ]
        .concat()
    );
    let mut with_model = steps.clone();
    with_model.push(running_model);
    assert_eq!(
        replay(&record, &with_model),
        events,
        "a model call under way shows nothing yet"
    );
}

#[test]
fn tool_steps_never_started_are_not_shown() {
    let mut pending = tool(1, 0, "a", false, 0);
    pending.state = StepState::Pending;
    if let StepBody::Tool(t) = &mut pending.body {
        t.outcome = None;
    }
    let record = ended(Ending::Incomplete {
        reason: IncompleteReason::Deadline,
    });
    let events = replay(&record, &[model(0, None, &["a"]), pending]);
    assert_eq!(
        kinds(&events),
        [START.as_slice(), &["response.incomplete"]].concat()
    );
}

#[test]
fn a_server_call_streams_as_openai_streams_an_mcp_call_with_its_arguments_after_the_item() {
    let steps = vec![model(0, None, &["a"]), tool(1, 0, "a", false, 0)];
    let record = ended(Ending::Incomplete {
        reason: IncompleteReason::Deadline,
    });
    let events = replay(&record, &steps);
    let added = first_of(&events, "response.output_item.added");
    assert_eq!(added.data["item"]["type"], "mcp_call");
    assert_eq!(added.data["item"]["arguments"], "", "{:#}", added.data);
    assert_eq!(added.data["item"]["status"], "in_progress");
    let item_id = added.data["item"]["id"].clone();
    let arguments = output_of(&steps[0]).tool_calls[0].arguments.clone();
    let delta = first_of(&events, "response.mcp_call_arguments.delta");
    assert_eq!(delta.data["delta"], arguments.as_str());
    assert_eq!(delta.data["item_id"], item_id);
    assert_eq!(delta.data["output_index"], added.data["output_index"]);
    let done = first_of(&events, "response.mcp_call_arguments.done");
    assert_eq!(done.data["arguments"], arguments.as_str());
    assert_eq!(done.data["item_id"], item_id);
    let item_done = first_of(&events, "response.output_item.done");
    assert_eq!(item_done.data["item"]["arguments"], arguments.as_str());
    assert_eq!(item_done.data["item"]["status"], "completed");
}

#[test]
fn progress_notes_stream_as_slug_prefixed_events_of_their_call_and_replay_the_same() {
    let mut first = tool(1, 0, "a", false, 0);
    let mut second = tool(2, 0, "b", true, 1);
    if let StepBody::Tool(t) = &mut first.body {
        t.notes.on_request = Some("Searching for a".into());
        t.notes.on_result = Some("Found a".into());
    }
    if let StepBody::Tool(t) = &mut second.body {
        t.notes.on_result = Some("b went wrong".into());
    }
    let record = ended(Ending::Incomplete {
        reason: IncompleteReason::Deadline,
    });
    let steps = vec![model(0, None, &["a", "b"]), first, second];
    let events = replay(&record, &steps);
    let notes: Vec<&Event> = events.iter().filter(|e| e.kind == TOOL_NOTE).collect();
    assert_eq!(notes.len(), 3);
    let fields: Vec<(Value, Value, Value, Value, Value)> = notes
        .iter()
        .map(|e| {
            (
                e.data["item_id"].clone(),
                e.data["output_index"].clone(),
                e.data["phase"].clone(),
                e.data["label"].clone(),
                e.data["detail"].clone(),
            )
        })
        .collect();
    assert_eq!(
        fields,
        [
            (
                json!("mcp_a"),
                json!(0),
                json!("request"),
                json!("Searching for a"),
                json!("in_progress")
            ),
            (
                json!("mcp_a"),
                json!(0),
                json!("result"),
                json!("Found a"),
                json!("completed")
            ),
            (
                json!("mcp_b"),
                json!(1),
                json!("result"),
                json!("b went wrong"),
                json!("failed")
            ),
        ]
    );
    assert!(notes.iter().all(|e| e.data["type"] == "gateway:tool_note"));
    // Each note comes right after the event it annotates.
    let kinds = kinds(&events);
    let at = |i: usize| {
        kinds[events
            .iter()
            .position(|e| std::ptr::eq(e, notes[i]))
            .unwrap()
            - 1]
    };
    assert_eq!(at(0), "response.mcp_call.in_progress");
    assert_eq!(at(1), "response.mcp_call.completed");
    assert_eq!(at(2), "response.mcp_call.failed");
    // Sequence numbers stay contiguous.
    for (i, event) in events.iter().enumerate() {
        assert_eq!(event.sequence_number(), i as u64);
    }
}

/// A call of a source bound to `web_search`, with `{"query": ...}` arguments.
fn web_search(seq: u32, call_id: &str, failed: bool) -> Step {
    let mut step = tool(seq, 0, call_id, failed, 0);
    if let StepBody::Tool(t) = &mut step.body {
        t.item_id = format!("ws_{call_id}");
        t.hosted_type = Some("web_search".into());
        t.call.arguments = format!("{{\"query\":\"q {call_id}\"}}");
    }
    step
}

#[test]
fn a_bound_web_search_streams_as_openai_streams_a_web_search_call_and_replays_the_same() {
    for failed in [false, true] {
        let mut first = model(0, None, &["a"]);
        if let StepBody::Model(m) = &mut first.body {
            if let Some(output) = &mut m.output {
                output.tool_calls[0].arguments = "{\"query\":\"q a\"}".into();
            }
        }
        let steps = vec![
            first,
            web_search(1, "a", failed),
            model(2, Some(AssistantMessage::whole("msg_2", "Found")), &[]),
        ];
        let record = ended(Ending::Completed { handed_back: false });
        let events = live(&record, &steps, &|p| {
            model_ended(p, &steps[0]);
            p.handle(Progress::ToolsStarted {
                steps: &[&steps[1]],
            });
            p.handle(Progress::ToolEnded { step: &steps[1] });
            model_ended(p, &steps[2]);
        });
        assert_eq!(
            events,
            replay(&record, &steps),
            "a replay equals the live stream"
        );
        let tool_events: Vec<&Event> = events
            .iter()
            .filter(|e| e.data["item_id"] == "ws_a" || e.data["item"]["id"] == "ws_a")
            .collect();
        let mut expected = vec![
            "response.output_item.added",
            "response.web_search_call.in_progress",
            "response.web_search_call.searching",
        ];
        if !failed {
            expected.push("response.web_search_call.completed");
        }
        expected.push("response.output_item.done");
        assert_eq!(
            tool_events.iter().map(|e| e.kind).collect::<Vec<_>>(),
            expected
        );
        assert_eq!(
            tool_events[0].data["item"],
            json!({"id": "ws_a", "type": "web_search_call", "status": "in_progress",
                   "action": {"type": "search", "query": "q a"}})
        );
        let status = if failed { "failed" } else { "completed" };
        assert_eq!(
            tool_events.last().unwrap().data["item"],
            json!({"id": "ws_a", "type": "web_search_call", "status": status,
                   "action": {"type": "search", "query": "q a"}})
        );
        let Some(Event { data, .. }) = events.last() else {
            panic!("no events")
        };
        assert_eq!(data["response"]["output"][0]["type"], "web_search_call");
        assert!(data["response"]["output"][0].get("output").is_none());
    }
}

#[test]
fn a_stream_ended_without_its_response_tells_why_in_an_error_event_of_the_same_shape() {
    let failed = replay(&ended(Ending::server_error("boom")), &[]);
    let told = &failed[failed.len() - 2];
    let error = stream_error(7, "server_error", "server_error", "boom");
    assert_eq!(error.kind, "error");
    assert_eq!(error.sequence_number(), 7);
    assert_eq!(error.data["type"], "error");
    let mut same = error.data.clone();
    same["sequence_number"] = told.data["sequence_number"].clone();
    assert_eq!(same, told.data, "the shape of a failure's error event");
}
