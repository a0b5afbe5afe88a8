//! The pairing: by call id whatever the order, first result wins, repeats are one call, failures recognised.

use super::*;
use crate::test_support::items;
use serde_json::json;

/// `(call_id, name, arguments, result)` of each record.
fn flat(records: &[CallRecord]) -> Vec<(&str, &str, &str, Option<&str>)> {
    records
        .iter()
        .map(|r| {
            (
                r.call_id.as_str(),
                r.name.as_str(),
                r.arguments.as_str(),
                r.result.as_deref(),
            )
        })
        .collect()
}

#[test]
fn the_gateways_items_mix_mcp_calls_with_function_and_custom_calls() {
    let conversation = items(json!([
        {"type": "message", "role": "user", "content": "go"},
        {"type": "mcp_call", "id": "mcp_1", "server_label": "gateway", "name": "add", "arguments": "{\"a\":1}", "output": "{\"sum\":1}"},
        {"type": "function_call", "call_id": "call_b", "name": "fail", "arguments": "{}"},
        {"type": "custom_tool_call", "call_id": "call_p", "name": "patch", "input": "*** Begin"},
        {"type": "function_call_output", "call_id": "call_b", "output": "{\"error\":{\"message\":\"no\"}}"},
        {"type": "custom_tool_call_output", "call_id": "call_p", "output": "Done"},
        {"type": "function_call", "call_id": "call_c", "name": "add", "arguments": "{\"a\":3}"}
    ]));
    let records = call_records(&conversation);
    assert_eq!(
        flat(&records),
        [
            ("mcp_1", "add", "{\"a\":1}", Some("{\"sum\":1}")),
            (
                "call_b",
                "fail",
                "{}",
                Some("{\"error\":{\"message\":\"no\"}}")
            ),
            ("call_p", "patch", "*** Begin", Some("Done")),
            ("call_c", "add", "{\"a\":3}", None),
        ],
        "an mcp_call without call_id pairs by its item id; a custom call keeps its free-form input"
    );
    assert_eq!(
        records[0].result_at,
        Some(records[0].call_at),
        "an mcp_call carries its own result"
    );
    assert_eq!(records[1].call_at, Position::item(2));
    assert_eq!(records[1].result_at, Some(Position::item(4)));
    assert!(records[1].completed && !records[3].completed);
    assert!(records.iter().all(|r| r.shape == Shape::Items));
}

#[test]
fn results_pair_by_call_id_not_position_and_the_first_result_wins() {
    let conversation = items(json!([
        {"type": "function_call", "call_id": "b", "name": "client", "arguments": "{}"},
        {"type": "function_call", "call_id": "a", "name": "client", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "a", "output": "A"},
        {"type": "function_call_output", "call_id": "b", "output": "B"},
        {"type": "function_call_output", "call_id": "b", "output": "again"},
    ]));
    let results = results_by_call_id(&conversation);
    assert_eq!(results["a"].text, "A");
    assert_eq!(results["b"].text, "B");
    assert_eq!(results["b"].index, 3);
}

#[test]
fn a_call_repeated_as_the_mcp_call_that_ran_it_is_one_call() {
    let conversation = items(json!([
        {"type": "function_call", "call_id": "s", "name": "server", "arguments": "{}"},
        {"type": "mcp_call", "id": "mcp_1", "call_id": "s", "name": "server", "server_label": "gateway",
         "arguments": "{}", "output": "1", "status": "completed"},
    ]));
    let records = call_records(&conversation);
    assert_eq!(flat(&records), [("s", "server", "{}", Some("1"))]);
    assert_eq!(records[0].call_at, Position::item(0));
}

#[test]
fn a_result_naming_no_known_call_pairs_with_nothing() {
    let conversation = items(json!([
        {"type": "function_call_output", "call_id": "ghost", "output": "x"},
        {"type": "function_call", "call_id": "call_a", "name": "f", "arguments": "{}"}
    ]));
    let records = call_records(&conversation);
    assert_eq!(records.len(), 1);
    assert!(!records[0].completed);
}

#[test]
fn an_mcp_call_error_reaches_the_model_as_the_gateways_failure_shape() {
    let conversation = items(json!([
        {"type": "mcp_call", "id": "mcp_1", "call_id": "s", "server_label": "gateway", "name": "server",
         "arguments": "{}", "output": null,
         "error": {"type": "mcp_tool_execution_error", "content": [{"type": "text", "text": "it broke"}]}},
        {"type": "mcp_call", "id": "mcp_2", "call_id": "t", "server_label": "gateway", "name": "server",
         "arguments": "{}", "output": null, "error": "plain string"},
        {"type": "mcp_call", "id": "mcp_3", "call_id": "u", "server_label": "gateway", "name": "server",
         "arguments": "{}", "output": "42", "error": null},
    ]));
    let results = results_by_call_id(&conversation);
    assert_eq!(results["s"].text, r#"{"error":{"message":"it broke"}}"#);
    assert_eq!(results["t"].text, r#"{"error":{"message":"plain string"}}"#);
    assert!(results["s"].failed && results["t"].failed);
    assert_eq!(results["u"].text, "42");
    assert!(!results["u"].failed);
}

#[test]
fn only_the_gateways_compact_error_object_reads_as_a_failure() {
    for (text, failed) in [
        (r#"{"error":{"message":"no"}}"#, true),
        (r#"{"error":"no"}"#, true),
        (r#"{"error":"no","detail":1}"#, false),
        (r#"{ "error": "spaced" }"#, false),
        (r#"{"error""#, false),
        ("plain text", false),
    ] {
        assert_eq!(reads_as_failure(text), failed, "{text}");
    }
}

#[test]
fn a_custom_input_is_sent_as_a_function_of_one_string() {
    let conversation = items(json!([
        {"type": "custom_tool_call", "call_id": "p", "name": "patch", "input": "a \"b\""},
        {"type": "function_call", "call_id": "f", "name": "f", "arguments": "{\"x\":1}"},
    ]));
    let calls: Vec<Call> = conversation.iter().filter_map(call_of).collect();
    assert_eq!(calls[0].function_arguments(), r#"{"input":"a \"b\""}"#);
    assert_eq!(calls[1].function_arguments(), r#"{"x":1}"#);
}
