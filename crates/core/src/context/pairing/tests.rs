//! The pairing checks: by call id, never by position; repeats refused in new input, allowed in the stored chain.

use super::*;
use crate::context::model_conversation;
use crate::test_support::items;
use crate::walk::results_by_call_id;
use serde_json::json;

fn registered(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|n| n.to_string()).collect()
}

#[test]
fn outputs_answer_calls_in_any_order() {
    let context = items(json!([
        {"type": "function_call", "call_id": "b", "name": "client", "arguments": "{}"},
        {"type": "function_call", "call_id": "a", "name": "client", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "a", "output": "A"},
        {"type": "function_call_output", "call_id": "b", "output": "B"},
    ]));
    assert_eq!(pair_calls(&context, 0, &registered(&[])), Ok(vec![]));
}

#[test]
fn an_output_without_a_call_is_an_orphan() {
    let context = items(json!([{"type": "function_call_output", "call_id": "zz", "output": "x"}]));
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
    assert_eq!(results_by_call_id(&context)["p"].text, "Done");
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
    assert_eq!(results_by_call_id(&context)["s"].text, "42");
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
    let outputs = results_by_call_id(&conversation);
    assert!(
        outputs["call_1"].text.contains("denied"),
        "{}",
        outputs["call_1"].text
    );
    assert!(
        outputs["call_1"].text.contains("not now"),
        "{}",
        outputs["call_1"].text
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
    assert_eq!(results_by_call_id(&conversation)["call_1"].text, "5");
}
