//! Golden JSON tests for the Responses upstream translation, both ways.

use super::*;
use crate::request::ResponseParams;
use crate::test_support::{items, model_input, CountingIds as Ids};
use crate::toolset::FunctionTool;

#[test]
fn a_request_is_stateless_with_every_item_outputs_after_their_calls_and_reasoning_before_its_message(
) {
    let params = ResponseParams {
        instructions: Some("Be terse.".into()),
        max_output_tokens: Some(100),
        ..ResponseParams::default()
    };
    let conversation = items(json!([
        {"type": "message", "id": "msg_u", "role": "user", "content": "sum and look up"},
        {"type": "message", "id": "msg_a", "role": "assistant", "content": "On it."},
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "plan"}], "encrypted_content": "gAAAA1", "status": "completed"},
        {"type": "reasoning", "id": "rs_2", "summary": [], "encrypted_content": "anthropic.thinking:SIG"},
        {"type": "mcp_call", "id": "mcp_1", "call_id": "call_add", "server_label": "gateway", "name": "add", "arguments": "{\"a\":1}", "output": "{\"sum\":1}"},
        {"type": "function_call", "id": "fc_1", "call_id": "call_l", "name": "lookup", "arguments": "{\"w\":\"x\"}"},
        {"type": "function_call_output", "call_id": "call_l", "output": "found"}
    ]));
    let tool = OfferedTool::function(&FunctionTool {
        name: "lookup".into(),
        description: Some("Look up".into()),
        parameters: Some(json!({"type": "object"})),
        strict: None,
    });

    let body = build_request("gpt-x", &model_input(&params, &conversation, &[tool]));

    assert_eq!(
        body,
        json!({
            "model": "gpt-x",
            "store": false,
            "include": ["reasoning.encrypted_content"],
            "instructions": "Be terse.",
            "max_output_tokens": 100,
            "text": {"format": {"type": "text"}},
            "input": [
                {"type": "message", "role": "user", "content": "sum and look up"},
                {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "plan"}], "encrypted_content": "gAAAA1"},
                {"type": "message", "role": "assistant", "content": "On it."},
                {"type": "function_call", "call_id": "call_add", "name": "add", "arguments": "{\"a\":1}"},
                {"type": "function_call", "call_id": "call_l", "name": "lookup", "arguments": "{\"w\":\"x\"}"},
                {"type": "function_call_output", "call_id": "call_add", "output": "{\"sum\":1}"},
                {"type": "function_call_output", "call_id": "call_l", "output": "found"}
            ],
            "tools": [{"type": "function", "name": "lookup", "description": "Look up", "parameters": {"type": "object"}}],
            "tool_choice": "auto",
            "parallel_tool_calls": true
        })
    );
}

#[test]
fn a_tools_output_of_parts_goes_as_its_parts() {
    let conversation = items(json!([
        {"type": "function_call", "call_id": "call_p", "name": "shot", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_p", "output": [
            {"type": "input_text", "text": "the page"},
            {"type": "output_text", "text": "as written"},
            {"type": "input_image", "image_url": "https://x/p.png", "detail": "low"},
            {"type": "input_file", "file_id": "file-1"}]}
    ]));

    let body = build_request(
        "gpt-x",
        &model_input(&ResponseParams::default(), &conversation, &[]),
    );

    assert_eq!(
        body["input"][1],
        json!({"type": "function_call_output", "call_id": "call_p", "output": [
            {"type": "input_text", "text": "the page"},
            {"type": "input_text", "text": "as written"},
            {"type": "input_image", "image_url": "https://x/p.png", "detail": "low"},
            {"type": "input_file", "file_id": "file-1"}]})
    );
}

#[test]
fn reasoning_goes_back_under_the_upstreams_own_id() {
    let answer = json!({"status": "completed", "output": [
        {"type": "reasoning", "id": "rs_upstream", "summary": [], "encrypted_content": "gAAAA3"}]});
    let output = parse_response(&answer, &mut Ids(0)).unwrap();
    let conversation: Vec<Item> = output.reasoning.into_iter().map(Item::Reasoning).collect();
    let body = build_request(
        "m",
        &model_input(&ResponseParams::default(), &conversation, &[]),
    );
    assert_eq!(
        body["input"],
        json!([{"type": "reasoning", "id": "rs_upstream", "summary": [], "encrypted_content": "gAAAA3"}])
    );
}

#[test]
fn custom_tools_go_natively() {
    let tool = OfferedTool {
        name: "patch".into(),
        description: None,
        input: ToolInput::Text {
            format: Some(json!({"type": "grammar", "syntax": "lark", "definition": "start: /.+/"})),
        },
    };
    let conversation = items(json!([
        {"type": "custom_tool_call", "call_id": "c1", "name": "patch", "input": "diff"},
        {"type": "custom_tool_call_output", "call_id": "c1", "output": "ok"}
    ]));
    let body = build_request(
        "m",
        &model_input(&ResponseParams::default(), &conversation, &[tool]),
    );
    assert_eq!(
        body["tools"],
        json!([{"type": "custom", "name": "patch", "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"}}])
    );
    assert_eq!(
        body["input"],
        json!([
            {"type": "custom_tool_call", "call_id": "c1", "name": "patch", "input": "diff"},
            {"type": "custom_tool_call_output", "call_id": "c1", "output": "ok"}
        ])
    );
}

#[test]
fn an_answer_with_reasoning_text_and_calls_is_read() {
    let body = json!({
        "id": "resp_1", "status": "completed",
        "output": [
            {"type": "reasoning", "id": "rs_up", "summary": [{"type": "summary_text", "text": "think"}], "encrypted_content": "gAAAA2"},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hi."}]},
            {"type": "function_call", "id": "fc_up", "call_id": "call_1", "name": "add", "arguments": "{\"a\":1}"},
            {"type": "function_call", "id": "fc_up2", "name": "add", "arguments": {"a": 2}},
            {"type": "custom_tool_call", "call_id": "call_3", "name": "patch", "input": "diff"}
        ],
        "usage": {"input_tokens": 9, "output_tokens": 4, "input_tokens_details": {"cached_tokens": 3}, "output_tokens_details": {"reasoning_tokens": 2}}
    });
    let output = parse_response(&body, &mut Ids(0)).unwrap();
    assert_eq!(
        serde_json::to_value(&output).unwrap(),
        json!({
            "message": {"item_id": "msg_5", "text": "Hi."},
            "tool_calls": [
                {"item_id": "fc_2", "call_id": "call_1", "name": "add", "arguments": "{\"a\":1}"},
                {"item_id": "fc_3", "call_id": "call_synth_1", "name": "add", "arguments": "{\"a\":2}"},
                {"item_id": "fc_4", "call_id": "call_3", "name": "patch", "arguments": "diff"}
            ],
            "usage": {"input_tokens": 9, "output_tokens": 4, "cached_tokens": 3, "reasoning_tokens": 2},
            "finish": "tool_calls",
            "reasoning": [{"id": "rs_1", "summary": [{"type": "summary_text", "text": "think"}], "encrypted_content": "openai.reasoning:rs_up:gAAAA2", "status": "completed"}]
        })
    );
}

#[test]
fn incomplete_and_failed_answers_are_read_as_such() {
    let incomplete = json!({"status": "incomplete", "incomplete_details": {"reason": "max_output_tokens"},
        "output": [{"type": "message", "content": [{"type": "output_text", "text": "par"}]}]});
    assert_eq!(
        parse_response(&incomplete, &mut Ids(0)).unwrap().finish,
        Finish::Length
    );
    let failed = json!({"status": "failed", "error": {"message": "boom"}, "output": []});
    assert!(parse_response(&failed, &mut Ids(0))
        .unwrap_err()
        .0
        .contains("boom"));
}

#[test]
fn a_stream_passes_text_on_and_reads_the_terminal_response() {
    let mut stream = ResponsesStream::new();
    let final_response = json!({"status": "completed", "output": [
        {"type": "message", "content": [{"type": "output_text", "text": "Hello"}]}]});
    let events = [
        json!({"type": "response.created", "response": {"status": "in_progress", "output": []}}),
        json!({"type": "response.output_text.delta", "delta": "Hel"}),
        json!({"type": "response.output_text.delta", "delta": "lo"}),
        json!({"type": "response.completed", "response": final_response}),
    ];
    let mut deltas = Vec::new();
    for event in &events {
        deltas.extend(stream.push(event).unwrap());
    }
    assert!(stream.is_complete());
    assert_eq!(
        deltas,
        [
            ModelDelta::Text("Hel".into()),
            ModelDelta::Text("lo".into())
        ]
    );
    assert_eq!(
        stream.finish(&mut Ids(0)).unwrap().message.unwrap().text,
        "Hello"
    );

    let mut broken = ResponsesStream::new();
    let error = broken
        .push(&json!({"type": "error", "code": "server_error", "message": "exploded"}))
        .unwrap_err();
    assert!(error.0.contains("exploded"));
}

#[test]
fn provider_settings_a_client_sets_are_passed_on() {
    let body: crate::request::CreateResponseBody = serde_json::from_value(json!({
        "model": "m", "input": "x", "prompt_cache_key": "k1", "safety_identifier": "u-hash",
        "user": "u1", "service_tier": "flex", "top_logprobs": 3, "text": {"verbosity": "low"}
    }))
    .unwrap();
    let request = crate::request::validate(body).unwrap();
    let sent = build_request("up", &model_input(&request.params, &[], &[]));
    assert_eq!(sent["prompt_cache_key"], "k1");
    assert_eq!(sent["safety_identifier"], "u-hash");
    assert_eq!(sent["user"], "u1");
    assert_eq!(sent["service_tier"], "flex");
    assert_eq!(sent["top_logprobs"], 3);
    assert_eq!(sent["text"]["verbosity"], "low");
    assert_eq!(sent["store"], false, "always stateless");
}
