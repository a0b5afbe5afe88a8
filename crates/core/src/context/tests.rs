//! The conversation a model sees, and unique call ids.

use super::*;
use crate::test_support::items;
use serde_json::json;

#[test]
fn a_compaction_reaches_the_model_as_its_summary_and_never_as_its_seal() {
    let mut context = items(json!([
        {"type": "message", "role": "user", "content": "kept"},
        {"type": "compaction", "id": "cmp_1", "encrypted_content": "sealed"},
        {"type": "compaction", "encrypted_content": "not opened"},
    ]));
    if let Item::Compaction(c) = &mut context[1] {
        c.summary = Some("the summary".into());
    }

    let conversation = model_conversation(&context, &[]);

    assert_eq!(
        conversation,
        vec![
            context[0].clone(),
            crate::items::summary_message("the summary")
        ]
    );
    // Stored and shown, the item keeps its seal and drops the summary.
    assert_eq!(
        serde_json::to_value(&context[1]).unwrap(),
        json!({"type": "compaction", "id": "cmp_1", "encrypted_content": "sealed"})
    );
}

#[test]
fn call_ids_already_used_or_repeated_in_the_answer_are_replaced() {
    let conversation = items(json!([
        {"type": "function_call", "call_id": "call_0", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_0", "output": "x"},
        {"type": "mcp_call", "id": "mcp_1", "call_id": "call_m", "server_label": "gateway", "name": "g",
         "arguments": "{}", "output": "y", "error": null},
    ]));
    let call = |id: &str| ToolCall::function(format!("fc_{id}"), id, "f", "{}");
    let mut calls = vec![
        call("call_0"),
        call("call_new"),
        call("call_new"),
        call("call_m"),
    ];
    let mut n = 0;
    make_call_ids_unique(&mut calls, &conversation, || {
        n += 1;
        format!("fresh_{n}")
    });
    let ids: Vec<&str> = calls.iter().map(|c| c.call_id.as_str()).collect();
    assert_eq!(ids, ["fresh_1", "call_new", "fresh_2", "fresh_3"]);
}
