//! Decision tables for `decide_next_action`: one row per branch and per edge case.

use super::*;
use crate::steps::{
    AssistantMessage, ModelOutput, ModelStep, StepState, ToolOutcome, UpstreamFailure,
};
use crate::test_support::tool_step;

// ---- step builders -------------------------------------------------------------------------------

/// A tool call as the model asked for it. Names starting with `client_` are never registered.
fn call(call_id: &str, name: &str) -> ToolCall {
    ToolCall::function(
        format!("fc_{call_id}"),
        call_id,
        name,
        format!("{{\"id\":\"{call_id}\"}}"),
    )
}

fn calls(specs: &[(&str, &str)]) -> Vec<ToolCall> {
    specs.iter().map(|(id, name)| call(id, name)).collect()
}

fn model_step(seq: u32, state: StepState, model: ModelStep) -> Step {
    Step {
        seq,
        state,
        body: StepBody::Model(model),
    }
}

fn answered(seq: u32, text: Option<&str>, tool_calls: Vec<ToolCall>, finish: Finish) -> Step {
    let output = ModelOutput {
        reasoning: Vec::new(),
        message: text.map(|t| AssistantMessage {
            item_id: format!("msg_{seq}"),
            text: t.into(),
            deltas: Vec::new(),
        }),
        tool_calls,
        usage: None,
        finish,
    };
    model_step(
        seq,
        StepState::Succeeded,
        ModelStep {
            deployment: None,
            output: Some(output),
            failure: None,
        },
    )
}

/// A model call that answered with text only.
fn text(seq: u32) -> Step {
    answered(seq, Some("done"), Vec::new(), Finish::Stop)
}

/// A model call that stopped for `finish` without tool calls.
fn stopped(seq: u32, finish: Finish) -> Step {
    answered(seq, Some("partial"), Vec::new(), finish)
}

/// A model call that asked for these `(call_id, name)` tool calls.
fn asked(seq: u32, specs: &[(&str, &str)]) -> Step {
    answered(seq, None, calls(specs), Finish::ToolCalls)
}

/// A model call that asked for tool calls but reported another finish reason.
fn asked_with_finish(seq: u32, specs: &[(&str, &str)], finish: Finish) -> Step {
    answered(seq, Some("calling"), calls(specs), finish)
}

/// A model call recorded but not ended.
fn model_unended(seq: u32, state: StepState) -> Step {
    model_step(seq, state, ModelStep::default())
}

/// A model call that failed for good.
fn upstream_failed(seq: u32, message: Option<&str>) -> Step {
    let failure = message.map(|m| UpstreamFailure {
        message: m.into(),
        code: Default::default(),
        partial: None,
    });
    model_step(
        seq,
        StepState::Failed,
        ModelStep {
            deployment: None,
            output: None,
            failure,
        },
    )
}

fn tool(
    seq: u32,
    batch: Option<u32>,
    call_id: &str,
    state: StepState,
    outcome: Option<ToolOutcome>,
) -> Step {
    tool_step(
        seq,
        state,
        format!("mcp_{call_id}"),
        call(call_id, "search"),
        batch,
        outcome,
    )
}

/// A tool step of `batch` that ended with an output.
fn ok(seq: u32, batch: Option<u32>, call_id: &str) -> Step {
    let outcome = ToolOutcome::Output {
        text: format!("result of {call_id}"),
    };
    tool(seq, batch, call_id, StepState::Succeeded, Some(outcome))
}

/// A tool step of `batch` that ended with an error output.
fn err(seq: u32, batch: Option<u32>, call_id: &str) -> Step {
    let outcome = ToolOutcome::error(format!("{call_id} timed out"));
    tool(seq, batch, call_id, StepState::Failed, Some(outcome))
}

/// A tool step of `batch` recorded but not started.
fn pending(seq: u32, batch: Option<u32>, call_id: &str) -> Step {
    tool(seq, batch, call_id, StepState::Pending, None)
}

/// A tool step of `batch` whose request may be in flight.
fn running(seq: u32, batch: Option<u32>, call_id: &str) -> Step {
    tool(seq, batch, call_id, StepState::Running, None)
}

// ---- limits and expectations ---------------------------------------------------------------------

const REGISTERED: &[&str] = &["search", "fetch"];

/// Generous limits: no row hits them unless it lowers one.
const LIMITS: Limits = Limits {
    max_tool_calls: None,
    max_model_calls: 10,
    max_failing_batches: 3,
};

fn max_tool_calls(n: u32) -> Limits {
    Limits {
        max_tool_calls: Some(n),
        ..LIMITS
    }
}

fn max_model_calls(n: u32) -> Limits {
    Limits {
        max_model_calls: n,
        ..LIMITS
    }
}

fn max_failing_batches(n: u32) -> Limits {
    Limits {
        max_failing_batches: n,
        ..LIMITS
    }
}

fn dispatch(batch: Option<u32>, specs: &[(&str, &str)]) -> NextAction {
    NextAction::DispatchBatch {
        batch,
        calls: calls(specs),
    }
}

fn hand_back(specs: &[(&str, &str)]) -> NextAction {
    NextAction::HandBack {
        calls: calls(specs),
    }
}

fn run(seqs: &[u32]) -> NextAction {
    NextAction::RunTools {
        seqs: seqs.to_vec(),
    }
}

fn incomplete(reason: IncompleteReason) -> NextAction {
    NextAction::Incomplete { reason }
}

fn fail(message: &str) -> NextAction {
    NextAction::Fail {
        code: crate::response::FailureCode::ServerError,
        message: message.into(),
    }
}

// ---- the table runner ----------------------------------------------------------------------------

struct Row {
    name: &'static str,
    steps: Vec<Step>,
    registered: &'static [&'static str],
    limits: Limits,
    deadline_passed: bool,
    expected: NextAction,
}

/// A row with the default registry, limits and no deadline.
fn row(name: &'static str, steps: Vec<Step>, expected: NextAction) -> Row {
    Row {
        name,
        steps,
        registered: REGISTERED,
        limits: LIMITS,
        deadline_passed: false,
        expected,
    }
}

impl Row {
    fn limits(mut self, limits: Limits) -> Row {
        self.limits = limits;
        self
    }

    fn registered(mut self, names: &'static [&'static str]) -> Row {
        self.registered = names;
        self
    }

    fn after_deadline(mut self) -> Row {
        self.deadline_passed = true;
        self
    }
}

/// Runs every row and reports all the rows that disagree, by name, in one failure.
fn check(rows: Vec<Row>) {
    let mut names = BTreeSet::new();
    let mut failures = Vec::new();
    for row in &rows {
        assert!(names.insert(row.name), "duplicate row name '{}'", row.name);
        let registered: BTreeSet<String> = row.registered.iter().map(|n| n.to_string()).collect();
        let input = LoopInput {
            steps: &row.steps,
            registered: &registered,
            limits: row.limits,
            deadline_passed: row.deadline_passed,
        };
        let actual = decide_next_action(&input);
        if actual != row.expected {
            failures.push(format!(
                "{}:\n    expected {:?}\n    got      {:?}",
                row.name, row.expected, actual
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} rows failed:\n{}",
        failures.len(),
        rows.len(),
        failures.join("\n")
    );
}

// ---- tables --------------------------------------------------------------------------------------

#[test]
fn the_last_model_call_decides_whether_the_response_ends() {
    use IncompleteReason::*;
    check(vec![
        row("empty chain calls the model", vec![], NextAction::CallModel),
        row("text answer completes", vec![text(0)], NextAction::Complete),
        row(
            "text answer after a batch completes",
            vec![asked(0, &[("a", "search")]), ok(1, Some(0), "a"), text(2)],
            NextAction::Complete,
        ),
        row(
            "finish tool_calls without any call completes",
            vec![stopped(0, Finish::ToolCalls)],
            NextAction::Complete,
        ),
        row(
            "finish length without calls is incomplete",
            vec![stopped(0, Finish::Length)],
            incomplete(MaxOutputTokens),
        ),
        row(
            "finish content_filter without calls is incomplete",
            vec![stopped(0, Finish::ContentFilter)],
            incomplete(ContentFilter),
        ),
        row(
            "finish length after a batch is incomplete",
            vec![
                asked(0, &[("a", "search")]),
                ok(1, Some(0), "a"),
                stopped(2, Finish::Length),
            ],
            incomplete(MaxOutputTokens),
        ),
        row(
            "finish stop with tool calls still runs them",
            vec![asked_with_finish(0, &[("a", "search")], Finish::Stop)],
            dispatch(Some(0), &[("a", "search")]),
        ),
        row(
            "finish length with tool calls still runs them",
            vec![asked_with_finish(0, &[("a", "search")], Finish::Length)],
            dispatch(Some(0), &[("a", "search")]),
        ),
        row(
            "pending model call is resumed",
            vec![model_unended(0, StepState::Pending)],
            NextAction::ResumeModelCall { seq: 0 },
        ),
        row(
            "running model call is resumed",
            vec![model_unended(0, StepState::Running)],
            NextAction::ResumeModelCall { seq: 0 },
        ),
        row(
            "unended model call after a batch is resumed by its seq",
            vec![
                asked(0, &[("a", "search")]),
                ok(1, Some(0), "a"),
                model_unended(2, StepState::Running),
            ],
            NextAction::ResumeModelCall { seq: 2 },
        ),
        row(
            "failed upstream fails with its message",
            vec![upstream_failed(0, Some("upstream answered 503"))],
            fail("upstream answered 503"),
        ),
        row(
            "failed upstream after a batch fails with its message",
            vec![
                asked(0, &[("a", "search")]),
                ok(1, Some(0), "a"),
                upstream_failed(2, Some("connection reset")),
            ],
            fail("connection reset"),
        ),
        row(
            "failed upstream without a message still fails",
            vec![upstream_failed(0, None)],
            fail("the upstream model call failed"),
        ),
    ]);
}

#[test]
fn the_last_batch_is_dispatched_handed_back_or_resumed() {
    check(vec![
        row(
            "all registered batch dispatches every call",
            vec![asked(
                0,
                &[("a", "search"), ("b", "fetch"), ("c", "search")],
            )],
            dispatch(Some(0), &[("a", "search"), ("b", "fetch"), ("c", "search")]),
        ),
        row(
            "batch of a later model call is dispatched under its seq",
            vec![
                asked(0, &[("a", "search")]),
                ok(1, Some(0), "a"),
                asked(2, &[("b", "fetch")]),
            ],
            dispatch(Some(2), &[("b", "fetch")]),
        ),
        row(
            "mixed batch is handed back whole",
            vec![asked(
                0,
                &[("a", "search"), ("b", "client_lookup"), ("c", "fetch")],
            )],
            hand_back(&[("a", "search"), ("b", "client_lookup"), ("c", "fetch")]),
        ),
        row(
            "batch whose only unregistered call is last is handed back whole",
            vec![asked(
                0,
                &[("a", "search"), ("b", "fetch"), ("c", "client_lookup")],
            )],
            hand_back(&[("a", "search"), ("b", "fetch"), ("c", "client_lookup")]),
        ),
        row(
            "all client batch is handed back",
            vec![asked(0, &[("a", "client_lookup")])],
            hand_back(&[("a", "client_lookup")]),
        ),
        row(
            "mixed batch after server batches is handed back whole",
            vec![
                asked(0, &[("a", "search")]),
                ok(1, Some(0), "a"),
                asked(2, &[("b", "fetch"), ("c", "client_lookup")]),
            ],
            hand_back(&[("b", "fetch"), ("c", "client_lookup")]),
        ),
        row(
            "empty registry hands every batch back",
            vec![asked(0, &[("a", "search")])],
            hand_back(&[("a", "search")]),
        )
        .registered(&[]),
        row(
            "partly done batch runs exactly its pending and running steps",
            vec![
                asked(
                    0,
                    &[
                        ("a", "search"),
                        ("b", "search"),
                        ("c", "search"),
                        ("d", "search"),
                    ],
                ),
                ok(1, Some(0), "a"),
                pending(2, Some(0), "b"),
                running(3, Some(0), "c"),
                err(4, Some(0), "d"),
            ],
            run(&[2, 3]),
        ),
        row(
            "only the last batch's unended steps are run",
            vec![
                asked(0, &[("a", "search")]),
                ok(1, Some(0), "a"),
                asked(2, &[("b", "search"), ("c", "fetch")]),
                ok(3, Some(2), "b"),
                pending(4, Some(2), "c"),
            ],
            run(&[4]),
        ),
        row(
            "batch whose every step ended calls the model",
            vec![
                asked(0, &[("a", "search"), ("b", "fetch")]),
                ok(1, Some(0), "a"),
                ok(2, Some(0), "b"),
            ],
            NextAction::CallModel,
        ),
        row(
            "results recorded in another order than the calls still call the model",
            vec![
                asked(0, &[("a", "search"), ("b", "fetch"), ("c", "search")]),
                ok(1, Some(0), "c"),
                ok(2, Some(0), "a"),
                ok(3, Some(0), "b"),
            ],
            NextAction::CallModel,
        ),
        row(
            "a recorded later call does not stand in for an earlier one",
            vec![
                asked(0, &[("a", "search"), ("b", "fetch")]),
                ok(1, Some(0), "b"),
            ],
            dispatch(Some(0), &[("a", "search")]),
        ),
        row(
            "failed sibling beside a success calls the model without rerunning either",
            vec![
                asked(0, &[("a", "search"), ("b", "fetch")]),
                err(1, Some(0), "a"),
                ok(2, Some(0), "b"),
            ],
            NextAction::CallModel,
        )
        .limits(max_failing_batches(1)),
        row(
            "batch recorded only partly dispatches only the missing calls",
            vec![
                asked(0, &[("a", "search"), ("b", "fetch"), ("c", "search")]),
                pending(1, Some(0), "b"),
            ],
            dispatch(Some(0), &[("a", "search"), ("c", "search")]),
        ),
        row(
            "batch recorded partly and partly ended dispatches only the missing calls",
            vec![
                asked(0, &[("a", "search"), ("b", "fetch"), ("c", "search")]),
                ok(1, Some(0), "a"),
                err(2, Some(0), "c"),
            ],
            dispatch(Some(0), &[("b", "fetch")]),
        ),
        row(
            "call id reused from an earlier batch is dispatched again",
            vec![
                asked(0, &[("call_0", "search")]),
                ok(1, Some(0), "call_0"),
                asked(2, &[("call_0", "search")]),
            ],
            dispatch(Some(2), &[("call_0", "search")]),
        ),
        row(
            "carried pending step is run",
            vec![pending(0, None, "x")],
            run(&[0]),
        ),
        row(
            "carried steps run exactly the unended ones",
            vec![
                ok(0, None, "x"),
                running(1, None, "y"),
                pending(2, None, "z"),
                err(3, None, "w"),
            ],
            run(&[1, 2]),
        ),
        row(
            "carried step that ended calls the model",
            vec![ok(0, None, "x")],
            NextAction::CallModel,
        ),
        row(
            "carried steps that all ended call the model",
            vec![ok(0, None, "x"), err(1, None, "y")],
            NextAction::CallModel,
        ),
    ]);
}

#[test]
fn each_limit_ends_the_response_incomplete() {
    use IncompleteReason::*;
    let three = [("a", "search"), ("b", "fetch"), ("c", "search")];
    check(vec![
        row(
            "batch over max_tool_calls is incomplete",
            vec![asked(0, &three)],
            incomplete(MaxToolCalls),
        )
        .limits(max_tool_calls(2)),
        row(
            "batch exactly at max_tool_calls is dispatched",
            vec![asked(0, &three)],
            dispatch(Some(0), &three),
        )
        .limits(max_tool_calls(3)),
        row(
            "calls already run count toward max_tool_calls",
            vec![
                asked(0, &[("a", "search"), ("b", "fetch")]),
                ok(1, Some(0), "a"),
                ok(2, Some(0), "b"),
                asked(3, &[("c", "search")]),
            ],
            incomplete(MaxToolCalls),
        )
        .limits(max_tool_calls(2)),
        row(
            "calls already run plus the batch exactly at max_tool_calls are dispatched",
            vec![
                asked(0, &[("a", "search"), ("b", "fetch")]),
                ok(1, Some(0), "a"),
                ok(2, Some(0), "b"),
                asked(3, &[("c", "search")]),
            ],
            dispatch(Some(3), &[("c", "search")]),
        )
        .limits(max_tool_calls(3)),
        row(
            "carried calls count toward max_tool_calls",
            vec![
                ok(0, None, "x"),
                asked(1, &[("a", "search"), ("b", "fetch")]),
            ],
            incomplete(MaxToolCalls),
        )
        .limits(max_tool_calls(2)),
        row(
            "recorded calls of a partly recorded batch count toward max_tool_calls",
            vec![asked(0, &three), pending(1, Some(0), "a")],
            incomplete(MaxToolCalls),
        )
        .limits(max_tool_calls(2)),
        row(
            "partly recorded batch exactly at max_tool_calls dispatches the rest",
            vec![asked(0, &three), pending(1, Some(0), "a")],
            dispatch(Some(0), &[("b", "fetch"), ("c", "search")]),
        )
        .limits(max_tool_calls(3)),
        row(
            "max_tool_calls does not stop a hand back",
            vec![asked(0, &[("a", "search"), ("b", "client_lookup")])],
            hand_back(&[("a", "search"), ("b", "client_lookup")]),
        )
        .limits(max_tool_calls(1)),
        row(
            "model call ceiling reached after a batch is incomplete",
            vec![asked(0, &[("a", "search")]), ok(1, Some(0), "a")],
            incomplete(MaxModelCalls),
        )
        .limits(max_model_calls(1)),
        row(
            "model call ceiling not yet reached calls the model",
            vec![asked(0, &[("a", "search")]), ok(1, Some(0), "a")],
            NextAction::CallModel,
        )
        .limits(max_model_calls(2)),
        row(
            "failed model calls count toward the ceiling",
            vec![
                upstream_failed(0, Some("x")),
                asked(1, &[("a", "search")]),
                ok(2, Some(1), "a"),
            ],
            incomplete(MaxModelCalls),
        )
        .limits(max_model_calls(2)),
        row(
            "model call ceiling applies to carried steps",
            vec![ok(0, None, "x")],
            incomplete(MaxModelCalls),
        )
        .limits(max_model_calls(0)),
        row(
            "model call ceiling does not stop a text answer",
            vec![text(0)],
            NextAction::Complete,
        )
        .limits(max_model_calls(1)),
        row(
            "one all failed batch under the failing limit calls the model",
            vec![
                asked(0, &[("a", "search"), ("b", "fetch")]),
                err(1, Some(0), "a"),
                err(2, Some(0), "b"),
            ],
            NextAction::CallModel,
        )
        .limits(max_failing_batches(2)),
        row(
            "one all failed batch at a failing limit of one is incomplete",
            vec![
                asked(0, &[("a", "search"), ("b", "fetch")]),
                err(1, Some(0), "a"),
                err(2, Some(0), "b"),
            ],
            incomplete(ToolFailures),
        )
        .limits(max_failing_batches(1)),
        row(
            "consecutive all failed batches reaching the limit are incomplete",
            vec![
                asked(0, &[("a", "search")]),
                err(1, Some(0), "a"),
                asked(2, &[("b", "fetch")]),
                err(3, Some(2), "b"),
            ],
            incomplete(ToolFailures),
        )
        .limits(max_failing_batches(2)),
        row(
            "a successful batch in between resets the failing count",
            vec![
                asked(0, &[("a", "search")]),
                err(1, Some(0), "a"),
                asked(2, &[("b", "fetch")]),
                ok(3, Some(2), "b"),
                asked(4, &[("c", "search")]),
                err(5, Some(4), "c"),
            ],
            NextAction::CallModel,
        )
        .limits(max_failing_batches(2)),
        row(
            "a batch with one success in between resets the failing count",
            vec![
                asked(0, &[("a", "search")]),
                err(1, Some(0), "a"),
                asked(2, &[("b", "fetch"), ("c", "search")]),
                err(3, Some(2), "b"),
                ok(4, Some(2), "c"),
                asked(5, &[("d", "search")]),
                err(6, Some(5), "d"),
            ],
            NextAction::CallModel,
        )
        .limits(max_failing_batches(2)),
        row(
            "failures before the last success do not count",
            vec![
                asked(0, &[("a", "search")]),
                err(1, Some(0), "a"),
                asked(2, &[("b", "search")]),
                err(3, Some(2), "b"),
                asked(4, &[("c", "search")]),
                ok(5, Some(4), "c"),
            ],
            NextAction::CallModel,
        )
        .limits(max_failing_batches(2)),
        row(
            "a failing carried batch counts as a batch",
            vec![
                err(0, None, "x"),
                asked(1, &[("a", "search")]),
                err(2, Some(1), "a"),
            ],
            incomplete(ToolFailures),
        )
        .limits(max_failing_batches(2)),
        row(
            "a failing carried batch alone reaches a limit of one",
            vec![err(0, None, "x")],
            incomplete(ToolFailures),
        )
        .limits(max_failing_batches(1)),
    ]);
}

#[test]
fn a_passed_deadline_stops_work_that_remains_but_not_an_ending() {
    use IncompleteReason::*;
    check(vec![
        row(
            "deadline before the first model call",
            vec![],
            incomplete(Deadline),
        )
        .after_deadline(),
        row(
            "deadline with an unended model call",
            vec![model_unended(0, StepState::Running)],
            incomplete(Deadline),
        )
        .after_deadline(),
        row(
            "deadline before dispatching a batch",
            vec![asked(0, &[("a", "search")])],
            incomplete(Deadline),
        )
        .after_deadline(),
        row(
            "deadline before dispatching the rest of a partly recorded batch",
            vec![
                asked(0, &[("a", "search"), ("b", "fetch")]),
                ok(1, Some(0), "a"),
            ],
            incomplete(Deadline),
        )
        .after_deadline(),
        row(
            "deadline with tool steps still unended",
            vec![
                asked(0, &[("a", "search"), ("b", "fetch")]),
                ok(1, Some(0), "a"),
                running(2, Some(0), "b"),
            ],
            incomplete(Deadline),
        )
        .after_deadline(),
        row(
            "deadline with carried steps unended",
            vec![pending(0, None, "x")],
            incomplete(Deadline),
        )
        .after_deadline(),
        row(
            "deadline once the batch ended",
            vec![asked(0, &[("a", "search")]), ok(1, Some(0), "a")],
            incomplete(Deadline),
        )
        .after_deadline(),
        row(
            "deadline once carried steps ended",
            vec![ok(0, None, "x")],
            incomplete(Deadline),
        )
        .after_deadline(),
        row(
            "deadline does not undo a text answer",
            vec![text(0)],
            NextAction::Complete,
        )
        .after_deadline(),
        row(
            "deadline does not hide a length stop",
            vec![stopped(0, Finish::Length)],
            incomplete(MaxOutputTokens),
        )
        .after_deadline(),
        row(
            "deadline does not stop a hand back",
            vec![asked(0, &[("a", "client_lookup")])],
            hand_back(&[("a", "client_lookup")]),
        )
        .after_deadline(),
        row(
            "deadline does not hide an upstream failure",
            vec![upstream_failed(0, Some("boom"))],
            fail("boom"),
        )
        .after_deadline(),
    ]);
}

#[test]
fn the_decision_depends_on_steps_not_on_their_count_alone() {
    // Same number of steps, same names: only the call ids differ, and so does the decision.
    let paired = [
        asked(0, &[("a", "search"), ("b", "search")]),
        ok(1, Some(0), "a"),
        ok(2, Some(0), "b"),
    ];
    let stray = [
        asked(0, &[("a", "search"), ("b", "search")]),
        ok(1, Some(0), "a"),
        ok(2, Some(0), "z"),
    ];
    let registered: BTreeSet<String> = REGISTERED.iter().map(|n| n.to_string()).collect();
    let decide = |steps: &[Step]| {
        decide_next_action(&LoopInput {
            steps,
            registered: &registered,
            limits: LIMITS,
            deadline_passed: false,
        })
    };
    assert_eq!(decide(&paired), NextAction::CallModel);
    assert_eq!(decide(&stray), dispatch(Some(0), &[("b", "search")]));
}

#[test]
fn incomplete_reasons_round_trip_through_their_wire_names() {
    let reasons = [
        (IncompleteReason::MaxOutputTokens, "max_output_tokens"),
        (IncompleteReason::ContentFilter, "content_filter"),
        (IncompleteReason::MaxToolCalls, "max_tool_calls"),
        (IncompleteReason::MaxModelCalls, "max_model_calls"),
        (IncompleteReason::ToolFailures, "max_failing_tool_batches"),
        (IncompleteReason::Deadline, "deadline"),
        (IncompleteReason::ClientDisconnected, "client_disconnected"),
    ];
    assert_eq!(reasons.len(), IncompleteReason::ALL.len());
    for (reason, name) in reasons {
        assert_eq!(reason.as_str(), name);
        assert_eq!(IncompleteReason::parse(name), Some(reason));
        assert_eq!(serde_json::to_value(reason).unwrap(), name);
    }
    assert_eq!(IncompleteReason::parse("bogus"), None);
}

#[test]
fn next_action_is_plain_serialisable_data() {
    let action = dispatch(Some(4), &[("a", "search")]);
    let value = serde_json::to_value(&action).unwrap();
    assert_eq!(value["action"], "dispatch_batch");
    assert_eq!(value["batch"], 4);
    assert_eq!(value["calls"][0]["call_id"], "a");
    assert_eq!(serde_json::from_value::<NextAction>(value).unwrap(), action);
}

// ---- remote MCP approvals (SPEC 12) ---------------------------------------------------------------

fn awaiting(call_id: &str, name: &str) -> ToolCall {
    ToolCall {
        approval: Some(crate::steps::Approval::Required {
            server_label: "calc".into(),
        }),
        ..call(call_id, name)
    }
}

#[test]
fn a_batch_with_a_call_awaiting_approval_goes_back_whole_and_an_approved_one_runs() {
    let registered: BTreeSet<String> = REGISTERED.iter().map(|n| n.to_string()).collect();
    let batch = vec![call("a", "search"), awaiting("b", "fetch")];
    let steps = vec![answered(0, None, batch.clone(), Finish::ToolCalls)];
    let input = LoopInput {
        steps: &steps,
        registered: &registered,
        limits: LIMITS,
        deadline_passed: false,
    };
    assert_eq!(
        decide_next_action(&input),
        NextAction::HandBack { calls: batch },
        "one call waiting for approval sends the whole batch to the client"
    );

    let granted = ToolCall {
        approval: Some(crate::steps::Approval::Granted {
            request_id: "mcpr_1".into(),
        }),
        ..call("b", "fetch")
    };
    let steps = vec![answered(0, None, vec![granted.clone()], Finish::ToolCalls)];
    let input = LoopInput {
        steps: &steps,
        ..input
    };
    assert_eq!(
        decide_next_action(&input),
        NextAction::DispatchBatch {
            batch: Some(0),
            calls: vec![granted]
        }
    );
}

#[test]
fn a_listing_step_changes_no_decision() {
    let listing = Step {
        seq: 0,
        state: StepState::Succeeded,
        body: StepBody::Listing(crate::steps::ListingStep {
            item_id: "mcpl_1".into(),
            server_label: "calc".into(),
            tools: Vec::new(),
        }),
    };
    check(vec![
        row(
            "only a listing: call the model",
            vec![listing.clone()],
            NextAction::CallModel,
        ),
        row(
            "a listing then a text answer: complete",
            vec![listing, text(1)],
            NextAction::Complete,
        ),
    ]);
}
