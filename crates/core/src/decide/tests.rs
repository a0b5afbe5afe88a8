//! Decision tables for `decide_next_action`: one row per branch and per edge case.

use super::*;
use crate::steps::{ModelStep, StepState, ToolOutcome, UpstreamFailure};
use crate::test_support::{answered_step, server_call_step};

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

/// A model call that answered with text only.
fn text(seq: u32) -> Step {
    answered_step(seq, Some("done"), Vec::new(), Finish::Stop)
}

/// A model call that stopped for `finish` without tool calls.
fn stopped(seq: u32, finish: Finish) -> Step {
    answered_step(seq, Some("partial"), Vec::new(), finish)
}

/// A model call that asked for these `(call_id, name)` tool calls.
fn asked(seq: u32, specs: &[(&str, &str)]) -> Step {
    answered_step(seq, None, calls(specs), Finish::ToolCalls)
}

/// A model call that asked for tool calls but reported another finish reason.
fn asked_with_finish(seq: u32, specs: &[(&str, &str)], finish: Finish) -> Step {
    answered_step(seq, Some("calling"), calls(specs), finish)
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
        cut_by_deadline: false,
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

/// A model call the response's deadline cut.
fn cut_by_deadline(seq: u32) -> Step {
    let mut step = upstream_failed(seq, Some("The deadline passed."));
    if let StepBody::Model(ModelStep {
        failure: Some(failure),
        ..
    }) = &mut step.body
    {
        failure.cut_by_deadline = true;
    }
    step
}

fn tool(
    seq: u32,
    batch: Option<u32>,
    call_id: &str,
    state: StepState,
    outcome: Option<ToolOutcome>,
) -> Step {
    server_call_step(seq, state, call(call_id, "search"), batch, outcome)
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

fn dispatch(batch: Option<u32>, specs: &[(&str, &str)]) -> NextAction {
    NextAction::DispatchBatch {
        batch,
        calls: calls(specs),
    }
}

/// What `decide_next_action` answers for `steps` with these tools registered.
fn decide(
    steps: &[Step],
    registered: &[&str],
    limits: Limits,
    deadline_passed: bool,
    budget_spent: bool,
) -> NextAction {
    let registered: BTreeSet<String> = registered.iter().map(|n| n.to_string()).collect();
    decide_next_action(&LoopInput {
        steps,
        registered: &registered,
        limits,
        deadline_passed,
        budget_spent,
    })
}

// ---- the table notation --------------------------------------------------------------------------
//
// A table holds a row in two lines: the row's name, then, indented, `steps => expected | options`.
//
// Steps are separated by `;` and take their seq from their place (`-` for none):
//   `text`, `stopped <finish>`, `asked <id>:<name> ... [finish=<finish>]`, `model <state>`,
//   `failed [message]`, `cut` (by the deadline), `listing`, and the tool steps `ok|err|pending|running <id>[@<batch>]`
//   (no batch: a carried step).
// Expected: `call_model`, `complete`, `incomplete <wire reason>`, `resume <seq>`, `fail <message>`,
//   `dispatch@<batch> <id>:<name> ...`, `hand_back <id>:<name> ...`, `run <seq> ...`.
// Options: `max_tool_calls=<n>`, `max_model_calls=<n>`, `max_failing_batches=<n>`,
//   `after_deadline`, `budget_spent`, `nothing_registered`.

struct Row {
    name: &'static str,
    steps: Vec<Step>,
    registered: &'static [&'static str],
    limits: Limits,
    deadline_passed: bool,
    budget_spent: bool,
    expected: NextAction,
}

/// The rows of a table written in the notation above; an unknown word fails the test.
fn rows(table: &'static str) -> Vec<Row> {
    let mut lines = table.lines().filter(|line| !line.trim().is_empty());
    let mut rows = Vec::new();
    while let Some(name) = lines.next() {
        assert!(
            !name.starts_with(' '),
            "expected a row name, found the indented case '{name}'"
        );
        let case = lines
            .next()
            .unwrap_or_else(|| panic!("row '{name}' has no case"));
        let (steps, rest) = case.trim().split_once(" => ").unwrap();
        let (expected, options) = rest.split_once(" | ").unwrap_or((rest, ""));
        let mut row = Row {
            name: name.trim(),
            steps: parse_steps(steps),
            registered: REGISTERED,
            limits: LIMITS,
            deadline_passed: false,
            budget_spent: false,
            expected: parse_expected(expected),
        };
        for option in options.split_whitespace() {
            match option.split_once('=') {
                Some(("max_tool_calls", n)) => row.limits.max_tool_calls = Some(n.parse().unwrap()),
                Some(("max_model_calls", n)) => row.limits.max_model_calls = n.parse().unwrap(),
                Some(("max_failing_batches", n)) => {
                    row.limits.max_failing_batches = n.parse().unwrap()
                }
                None if option == "after_deadline" => row.deadline_passed = true,
                None if option == "budget_spent" => row.budget_spent = true,
                None if option == "nothing_registered" => row.registered = &[],
                _ => panic!("unknown option '{option}' in row '{name}'"),
            }
        }
        rows.push(row);
    }
    rows
}

/// `id:name` words as `(call_id, name)` pairs.
fn parse_specs<'a>(words: &[&'a str]) -> Vec<(&'a str, &'a str)> {
    let spec = |word: &&'a str| match word.split_once(':') {
        Some(spec) => spec,
        None => panic!("a call is written id:name, not '{word}'"),
    };
    words.iter().map(spec).collect()
}

fn parse_finish(word: &str) -> Finish {
    serde_json::from_value(serde_json::Value::from(word)).unwrap()
}

fn parse_steps(steps: &str) -> Vec<Step> {
    if steps == "-" {
        return Vec::new();
    }
    let steps = steps.split("; ").enumerate().map(|(seq, step)| {
        let seq = seq as u32;
        let (kind, rest) = step.split_once(' ').unwrap_or((step, ""));
        let words: Vec<&str> = rest.split_whitespace().collect();
        match kind {
            "text" => text(seq),
            "stopped" => stopped(seq, parse_finish(rest)),
            "asked" => match words.split_last() {
                Some((last, specs)) if last.starts_with("finish=") => {
                    let finish = parse_finish(&last["finish=".len()..]);
                    asked_with_finish(seq, &parse_specs(specs), finish)
                }
                _ => asked(seq, &parse_specs(&words)),
            },
            "model" => model_unended(seq, serde_json::from_value(rest.into()).unwrap()),
            "failed" => upstream_failed(seq, Some(rest).filter(|m| !m.is_empty())),
            "cut" => cut_by_deadline(seq),
            "listing" => listing(seq),
            _ => {
                let (call_id, batch) = match rest.split_once('@') {
                    Some((call_id, batch)) => (call_id, Some(batch.parse().unwrap())),
                    None => (rest, None),
                };
                let tool_step = match kind {
                    "ok" => ok,
                    "err" => err,
                    "pending" => pending,
                    "running" => running,
                    _ => panic!("unknown step '{step}'"),
                };
                tool_step(seq, batch, call_id)
            }
        }
    });
    steps.collect()
}

fn parse_expected(expected: &str) -> NextAction {
    let (kind, rest) = expected.split_once(' ').unwrap_or((expected, ""));
    let words: Vec<&str> = rest.split_whitespace().collect();
    match kind {
        "call_model" => NextAction::CallModel,
        "complete" => NextAction::Complete,
        "incomplete" => NextAction::Incomplete {
            reason: IncompleteReason::parse(rest).unwrap(),
        },
        "resume" => NextAction::ResumeModelCall {
            seq: rest.parse().unwrap(),
        },
        "fail" => NextAction::Fail {
            code: crate::response::FailureCode::ServerError,
            message: rest.into(),
        },
        "hand_back" => NextAction::HandBack {
            calls: calls(&parse_specs(&words)),
        },
        "run" => NextAction::RunTools {
            seqs: words.iter().map(|seq| seq.parse().unwrap()).collect(),
        },
        _ => match kind.strip_prefix("dispatch@") {
            Some(batch) => dispatch(Some(batch.parse().unwrap()), &parse_specs(&words)),
            None => panic!("unknown expectation '{expected}'"),
        },
    }
}

/// Runs every row of `table` and reports all the rows that disagree, by name, in one failure.
fn check(table: &'static str) {
    let rows = rows(table);
    let mut names = BTreeSet::new();
    let mut failures = Vec::new();
    for row in &rows {
        assert!(names.insert(row.name), "duplicate row name '{}'", row.name);
        let actual = decide(
            &row.steps,
            row.registered,
            row.limits,
            row.deadline_passed,
            row.budget_spent,
        );
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
    check(
        "
empty chain calls the model
    - => call_model
text answer completes
    text => complete
text answer after a batch completes
    asked a:search; ok a@0; text => complete
finish tool_calls without any call completes
    stopped tool_calls => complete
finish length without calls is incomplete
    stopped length => incomplete max_output_tokens
finish content_filter without calls is incomplete
    stopped content_filter => incomplete content_filter
finish length after a batch is incomplete
    asked a:search; ok a@0; stopped length => incomplete max_output_tokens
finish stop with tool calls still runs them
    asked a:search finish=stop => dispatch@0 a:search
finish length with tool calls still runs them
    asked a:search finish=length => dispatch@0 a:search
pending model call is resumed
    model pending => resume 0
running model call is resumed
    model running => resume 0
unended model call after a batch is resumed by its seq
    asked a:search; ok a@0; model running => resume 2
failed upstream fails with its message
    failed upstream answered 503 => fail upstream answered 503
failed upstream after a batch fails with its message
    asked a:search; ok a@0; failed connection reset => fail connection reset
failed upstream without a message still fails
    failed => fail the upstream model call failed
a model call cut by the deadline ends the response incomplete
    asked a:search; ok a@0; cut => incomplete deadline
",
    );
}

#[test]
fn the_last_batch_is_dispatched_handed_back_or_resumed() {
    check(
        "
all registered batch dispatches every call
    asked a:search b:fetch c:search => dispatch@0 a:search b:fetch c:search
batch of a later model call is dispatched under its seq
    asked a:search; ok a@0; asked b:fetch => dispatch@2 b:fetch
mixed batch is handed back whole
    asked a:search b:client_lookup c:fetch => hand_back a:search b:client_lookup c:fetch
batch whose only unregistered call is last is handed back whole
    asked a:search b:fetch c:client_lookup => hand_back a:search b:fetch c:client_lookup
all client batch is handed back
    asked a:client_lookup => hand_back a:client_lookup
mixed batch after server batches is handed back whole
    asked a:search; ok a@0; asked b:fetch c:client_lookup => hand_back b:fetch c:client_lookup
empty registry hands every batch back
    asked a:search => hand_back a:search | nothing_registered
partly done batch runs exactly its pending and running steps
    asked a:search b:search c:search d:search; ok a@0; pending b@0; running c@0; err d@0 => run 2 3
only the last batch's unended steps are run
    asked a:search; ok a@0; asked b:search c:fetch; ok b@2; pending c@2 => run 4
batch whose every step ended calls the model
    asked a:search b:fetch; ok a@0; ok b@0 => call_model
results recorded in another order than the calls still call the model
    asked a:search b:fetch c:search; ok c@0; ok a@0; ok b@0 => call_model
a recorded later call does not stand in for an earlier one
    asked a:search b:fetch; ok b@0 => dispatch@0 a:search
failed sibling beside a success calls the model without rerunning either
    asked a:search b:fetch; err a@0; ok b@0 => call_model | max_failing_batches=1
batch recorded only partly dispatches only the missing calls
    asked a:search b:fetch c:search; pending b@0 => dispatch@0 a:search c:search
batch recorded partly and partly ended dispatches only the missing calls
    asked a:search b:fetch c:search; ok a@0; err c@0 => dispatch@0 b:fetch
call id reused from an earlier batch is dispatched again
    asked call_0:search; ok call_0@0; asked call_0:search => dispatch@2 call_0:search
carried pending step is run
    pending x => run 0
carried steps run exactly the unended ones
    ok x; running y; pending z; err w => run 1 2
carried step that ended calls the model
    ok x => call_model
carried steps that all ended call the model
    ok x; err y => call_model
",
    );
}

#[test]
fn each_limit_ends_the_response_incomplete() {
    check(
        "
batch over max_tool_calls is incomplete
    asked a:search b:fetch c:search => incomplete max_tool_calls | max_tool_calls=2
batch exactly at max_tool_calls is dispatched
    asked a:search b:fetch c:search => dispatch@0 a:search b:fetch c:search | max_tool_calls=3
calls already run count toward max_tool_calls
    asked a:search b:fetch; ok a@0; ok b@0; asked c:search => incomplete max_tool_calls | max_tool_calls=2
calls already run plus the batch exactly at max_tool_calls are dispatched
    asked a:search b:fetch; ok a@0; ok b@0; asked c:search => dispatch@3 c:search | max_tool_calls=3
carried calls count toward max_tool_calls
    ok x; asked a:search b:fetch => incomplete max_tool_calls | max_tool_calls=2
recorded calls of a partly recorded batch count toward max_tool_calls
    asked a:search b:fetch c:search; pending a@0 => incomplete max_tool_calls | max_tool_calls=2
partly recorded batch exactly at max_tool_calls dispatches the rest
    asked a:search b:fetch c:search; pending a@0 => dispatch@0 b:fetch c:search | max_tool_calls=3
max_tool_calls does not stop a hand back
    asked a:search b:client_lookup => hand_back a:search b:client_lookup | max_tool_calls=1
model call ceiling reached after a batch is incomplete
    asked a:search; ok a@0 => incomplete max_model_calls | max_model_calls=1
model call ceiling not yet reached calls the model
    asked a:search; ok a@0 => call_model | max_model_calls=2
failed model calls count toward the ceiling
    failed x; asked a:search; ok a@1 => incomplete max_model_calls | max_model_calls=2
model call ceiling applies to carried steps
    ok x => incomplete max_model_calls | max_model_calls=0
model call ceiling does not stop a text answer
    text => complete | max_model_calls=1
one all failed batch under the failing limit calls the model
    asked a:search b:fetch; err a@0; err b@0 => call_model | max_failing_batches=2
one all failed batch at a failing limit of one is incomplete
    asked a:search b:fetch; err a@0; err b@0 => incomplete max_failing_tool_batches | max_failing_batches=1
consecutive all failed batches reaching the limit are incomplete
    asked a:search; err a@0; asked b:fetch; err b@2 => incomplete max_failing_tool_batches | max_failing_batches=2
a successful batch in between resets the failing count
    asked a:search; err a@0; asked b:fetch; ok b@2; asked c:search; err c@4 => call_model | max_failing_batches=2
a batch with one success in between resets the failing count
    asked a:search; err a@0; asked b:fetch c:search; err b@2; ok c@2; asked d:search; err d@5 => call_model | max_failing_batches=2
failures before the last success do not count
    asked a:search; err a@0; asked b:search; err b@2; asked c:search; ok c@4 => call_model | max_failing_batches=2
a failing carried batch counts as a batch
    err x; asked a:search; err a@1 => incomplete max_failing_tool_batches | max_failing_batches=2
a failing carried batch alone reaches a limit of one
    err x => incomplete max_failing_tool_batches | max_failing_batches=1
"
    );
}

#[test]
fn a_passed_deadline_stops_work_that_remains_but_not_an_ending() {
    check(
        "
deadline before the first model call
    - => incomplete deadline | after_deadline
deadline with an unended model call
    model running => incomplete deadline | after_deadline
deadline before dispatching a batch
    asked a:search => incomplete deadline | after_deadline
deadline before dispatching the rest of a partly recorded batch
    asked a:search b:fetch; ok a@0 => incomplete deadline | after_deadline
deadline with tool steps still unended
    asked a:search b:fetch; ok a@0; running b@0 => incomplete deadline | after_deadline
deadline with carried steps unended
    pending x => incomplete deadline | after_deadline
deadline once the batch ended
    asked a:search; ok a@0 => incomplete deadline | after_deadline
deadline once carried steps ended
    ok x => incomplete deadline | after_deadline
deadline does not undo a text answer
    text => complete | after_deadline
deadline does not hide a length stop
    stopped length => incomplete max_output_tokens | after_deadline
deadline does not stop a hand back
    asked a:client_lookup => hand_back a:client_lookup | after_deadline
deadline does not hide an upstream failure
    failed boom => fail boom | after_deadline
",
    );
}

#[test]
fn a_spent_budget_stops_the_next_model_call_only() {
    check(
        "
a spent budget before the first model call
    - => incomplete budget_exceeded | budget_spent
a spent budget once a batch ended
    asked a:search; ok a@0 => incomplete budget_exceeded | budget_spent
a spent budget lets the batch the model asked for run
    asked a:search => dispatch@0 a:search | budget_spent
a spent budget lets recorded tool steps finish
    asked a:search b:fetch; ok a@0; running b@0 => run 2 | budget_spent
a spent budget does not undo a text answer
    text => complete | budget_spent
a spent budget does not stop a hand back
    asked a:client_lookup => hand_back a:client_lookup | budget_spent
a spent budget does not resume a model call in flight elsewhere as a new one
    model running => resume 0 | budget_spent
",
    );
}

#[test]
fn the_decision_depends_on_steps_not_on_their_count_alone() {
    // Same number of steps, same names: only the call ids differ, and so does the decision.
    check(
        "
every call of the batch has its result
    asked a:search b:search; ok a@0; ok b@0 => call_model
a stray result does not stand in for a call of the batch
    asked a:search b:search; ok a@0; ok z@0 => dispatch@0 b:search
",
    );
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
        (IncompleteReason::BudgetExceeded, "budget_exceeded"),
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
    let batch = vec![call("a", "search"), awaiting("b", "fetch")];
    let steps = vec![answered_step(0, None, batch.clone(), Finish::ToolCalls)];
    assert_eq!(
        decide(&steps, REGISTERED, LIMITS, false, false),
        NextAction::HandBack { calls: batch },
        "one call waiting for approval sends the whole batch to the client"
    );

    let granted = ToolCall {
        approval: Some(crate::steps::Approval::Granted {
            request_id: "mcpr_1".into(),
        }),
        ..call("b", "fetch")
    };
    let steps = vec![answered_step(
        0,
        None,
        vec![granted.clone()],
        Finish::ToolCalls,
    )];
    assert_eq!(
        decide(&steps, REGISTERED, LIMITS, false, false),
        NextAction::DispatchBatch {
            batch: Some(0),
            calls: vec![granted]
        }
    );
}

/// A remote MCP server's tool listing, recorded as a step of its own.
fn listing(seq: u32) -> Step {
    Step {
        seq,
        state: StepState::Succeeded,
        body: StepBody::Listing(crate::steps::ListingStep {
            item_id: "mcpl_1".into(),
            server_label: "calc".into(),
            tools: Vec::new(),
        }),
    }
}

#[test]
fn a_listing_step_changes_no_decision() {
    check(
        "
only a listing: call the model
    listing => call_model
a listing then a text answer: complete
    listing; text => complete
",
    );
}
