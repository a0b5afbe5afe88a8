//! The walk over each shape: the same history gives the same records, ids it synthesised are written back.

use super::*;
use serde_json::json;

/// Fresh ids `call_syn_1`, `call_syn_2`, ...
fn counter() -> impl FnMut() -> String {
    let mut n = 0;
    move || {
        n += 1;
        format!("call_syn_{n}")
    }
}

/// `(call_id, name, arguments, result, completed, failed)` of each record.
type Flat = (String, String, String, Option<String>, bool, bool);

fn flat(records: &[CallRecord]) -> Vec<Flat> {
    records
        .iter()
        .map(|r| {
            (
                r.call_id.clone(),
                r.name.clone(),
                r.arguments.clone(),
                r.result.clone(),
                r.completed,
                r.failed,
            )
        })
        .collect()
}

/// Two calls of one turn, the first without an id, the second failing, and a third left unanswered.
fn expected() -> Vec<Flat> {
    vec![
        (
            "call_syn_1".into(),
            "add".into(),
            "{\"a\":1}".into(),
            Some("{\"sum\":1}".into()),
            true,
            false,
        ),
        (
            "call_b".into(),
            "fail".into(),
            "{}".into(),
            Some("{\"error\":{\"message\":\"no\"}}".into()),
            true,
            true,
        ),
        (
            "call_c".into(),
            "add".into(),
            "{\"a\":3}".into(),
            None,
            false,
            false,
        ),
    ]
}

#[test]
fn chat_messages_give_the_records_and_get_the_synthesised_id_back() {
    let mut messages = json!([
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": null, "tool_calls": [
            {"type": "function", "function": {"name": "add", "arguments": "{\"a\":1}"}},
            {"id": "call_b", "type": "function", "function": {"name": "fail", "arguments": {}}}]},
        {"role": "tool", "content": "{\"sum\":1}"},
        {"role": "tool", "tool_call_id": "call_b", "content": "{\"error\":{\"message\":\"no\"}}"},
        {"role": "assistant", "tool_calls": [{"id": "call_c", "type": "function", "function": {"name": "add", "arguments": "{\"a\":3}"}}]}
    ]);
    let records = walk_chat(&mut messages, &mut counter());
    assert_eq!(flat(&records), expected());
    assert_eq!(messages[1]["tool_calls"][0]["id"], "call_syn_1");
    assert_eq!(
        messages[2]["tool_call_id"], "call_syn_1",
        "written back into the result too"
    );
    assert_eq!(
        records[0].call_at,
        Position {
            index: 1,
            part: Some(0)
        }
    );
    assert_eq!(
        records[0].result_at,
        Some(Position {
            index: 2,
            part: None
        })
    );
    assert_eq!(records[0].shape, Shape::Chat);
}

#[test]
fn anthropic_blocks_give_the_same_records() {
    let mut messages = json!([
        {"role": "user", "content": [{"type": "text", "text": "go"}]},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "t", "signature": "s"},
            {"type": "tool_use", "name": "add", "input": {"a": 1}},
            {"type": "tool_use", "id": "call_b", "name": "fail", "input": {}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "content": [{"type": "text", "text": "{\"sum\":1}"}]},
            {"type": "tool_result", "tool_use_id": "call_b", "content": "{\"error\":{\"message\":\"no\"}}", "is_error": true}]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "call_c", "name": "add", "input": {"a": 3}}]}
    ]);
    let records = walk_anthropic(&mut messages, &mut counter());
    assert_eq!(flat(&records), expected());
    assert_eq!(messages[1]["content"][1]["id"], "call_syn_1");
    assert_eq!(messages[2]["content"][0]["tool_use_id"], "call_syn_1");
    assert_eq!(
        records[1].result_at,
        Some(Position {
            index: 2,
            part: Some(1)
        })
    );
}

#[test]
fn responses_items_give_the_same_records() {
    let mut input = json!([
        {"type": "message", "role": "user", "content": "go"},
        {"type": "function_call", "call_id": "", "name": "add", "arguments": "{\"a\":1}"},
        {"type": "function_call", "call_id": "call_b", "name": "fail", "arguments": "{}"},
        {"type": "function_call_output", "output": "{\"sum\":1}"},
        {"type": "function_call_output", "call_id": "call_b", "output": "{\"error\":{\"message\":\"no\"}}"},
        {"type": "function_call", "call_id": "call_c", "name": "add", "arguments": "{\"a\":3}"}
    ]);
    let records = walk_responses(&mut input, &mut counter());
    assert_eq!(flat(&records), expected());
    assert_eq!(input[1]["call_id"], "call_syn_1");
    assert_eq!(input[3]["call_id"], "call_syn_1");
}

#[test]
fn the_gateways_items_mix_mcp_calls_with_function_calls() {
    let mut items: Vec<Item> = serde_json::from_value(json!([
        {"type": "message", "role": "user", "content": "go"},
        {"type": "mcp_call", "id": "mcp_1", "server_label": "gateway", "name": "add", "arguments": "{\"a\":1}", "output": "{\"sum\":1}"},
        {"type": "function_call", "call_id": "call_b", "name": "fail", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_b", "output": "{\"error\":{\"message\":\"no\"}}"},
        {"type": "function_call", "call_id": "call_c", "name": "add", "arguments": "{\"a\":3}"}
    ]))
    .unwrap();
    let records = walk_items(&mut items, &mut counter());
    let mut want = expected();
    want[0].0 = "mcp_1".into(); // an mcp_call without call_id pairs by its item id
    assert_eq!(flat(&records), want);
    assert_eq!(
        records[0].result_at,
        Some(records[0].call_at),
        "an mcp_call carries its own result"
    );
}

#[test]
fn a_result_naming_no_known_call_pairs_with_nothing() {
    let mut input = json!([
        {"type": "function_call_output", "call_id": "ghost", "output": "x"},
        {"type": "function_call", "call_id": "call_a", "name": "f", "arguments": "{}"}
    ]);
    let records = walk_responses(&mut input, &mut counter());
    assert_eq!(records.len(), 1);
    assert!(!records[0].completed);
}
