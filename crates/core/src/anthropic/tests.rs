//! Golden JSON tests for the Anthropic Messages translation, both ways.

use super::*;
use crate::request::ResponseParams;
use crate::test_support::{items, model_input, CountingIds as Ids};
use crate::toolset::FunctionTool;

fn weather() -> OfferedTool {
    OfferedTool::function(&FunctionTool {
        name: "get_weather".into(),
        description: Some("Weather by city".into()),
        parameters: Some(json!({"type": "object", "properties": {"city": {"type": "string"}}})),
        strict: None,
    })
}

#[test]
fn images_and_pdfs_of_a_tools_output_go_as_blocks_of_its_result() {
    let conversation = items(json!([
        {"type": "message", "role": "user", "content": "look"},
        {"type": "function_call", "call_id": "toolu_1", "name": "shot", "arguments": "{}"},
        {"type": "function_call", "call_id": "toolu_2", "name": "note", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "toolu_1", "output": [
            {"type": "input_text", "text": "the page"},
            {"type": "input_image", "image_url": "data:image/png;base64,iVBOR"},
            {"type": "input_file", "file_data": "data:application/pdf;base64,JVBER"},
            {"type": "input_file", "file_id": "file-1"}]},
        {"type": "function_call_output", "call_id": "toolu_2", "output": [
            {"type": "input_text", "text": "plain"}, {"type": "input_image", "file_id": "file-2"}]}
    ]));

    let body = build_request(
        "claude-x",
        1024,
        &model_input(&ResponseParams::default(), &conversation, &[]),
    );

    assert_eq!(
        body["messages"][2]["content"],
        json!([
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": [
                {"type": "text", "text": "the page"},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBOR"}},
                {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBER"}}]},
            {"type": "tool_result", "tool_use_id": "toolu_2", "content": [{"type": "text", "text": "plain"}], "cache_control": {"type": "ephemeral"}}
        ]),
        "{body:#}"
    );
}

#[test]
fn a_whole_request_has_system_max_tokens_tools_and_alternating_turns() {
    let params = ResponseParams {
        instructions: Some("Be terse.".into()),
        temperature: Some(0.5),
        ..ResponseParams::default()
    };
    let conversation = items(json!([
        {"type": "message", "role": "developer", "content": "Use metric units."},
        {"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "Weather in Paris and Rome? See"},
            {"type": "input_image", "image_url": "data:image/png;base64,iVBOR"},
            {"type": "input_image", "image_url": "https://example.com/a.png"},
            {"type": "input_file", "file_data": "data:application/pdf;base64,JVBER", "filename": "a.pdf"},
            {"type": "input_file", "file_url": "https://example.com/b.pdf"},
            {"type": "input_file", "file_data": "data:text/csv;base64,YSxi", "filename": "c.csv"}]},
        {"type": "message", "role": "assistant", "content": "Checking both."},
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "Two cities."}], "encrypted_content": "anthropic.thinking:sig1"},
        {"type": "reasoning", "summary": [], "encrypted_content": "gAAAA-from-openai"},
        {"type": "function_call", "call_id": "toolu_1", "name": "get_weather", "arguments": "{\"city\":\"Paris\"}"},
        {"type": "function_call", "call_id": "toolu_2", "name": "get_weather", "arguments": "{\"city\":\"Rome\"}"},
        {"type": "function_call_output", "call_id": "toolu_2", "output": "{\"error\":{\"message\":\"timed out\"}}"},
        {"type": "function_call_output", "call_id": "toolu_1", "output": "{\"temp\":21}"},
        {"type": "message", "role": "user", "content": "And tomorrow?"}
    ]));

    let body = build_request(
        "claude-x",
        1024,
        &model_input(&params, &conversation, &[weather()]),
    );

    assert_eq!(
        body,
        json!({
            "model": "claude-x",
            "max_tokens": 1024,
            "system": [{"type": "text", "text": "Be terse.\n\nUse metric units.", "cache_control": {"type": "ephemeral"}}],
            "temperature": 0.5,
            "messages": [
                {"role": "user", "content": [
                    {"type": "text", "text": "Weather in Paris and Rome? See"},
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBOR"}},
                    {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}},
                    {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBER"}},
                    {"type": "document", "source": {"type": "url", "url": "https://example.com/b.pdf"}}]},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "Two cities.", "signature": "sig1"},
                    {"type": "text", "text": "Checking both."},
                    {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
                    {"type": "tool_use", "id": "toolu_2", "name": "get_weather", "input": {"city": "Rome"}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "{\"temp\":21}"},
                    {"type": "tool_result", "tool_use_id": "toolu_2", "content": "{\"error\":{\"message\":\"timed out\"}}", "is_error": true},
                    {"type": "text", "text": "And tomorrow?", "cache_control": {"type": "ephemeral"}}]}
            ],
            "tools": [{"name": "get_weather", "description": "Weather by city",
                       "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
                       "cache_control": {"type": "ephemeral"}}],
            "tool_choice": {"type": "auto"}
        })
    );
}

#[test]
fn max_tokens_comes_from_the_request_when_it_sets_one() {
    let params = ResponseParams {
        max_output_tokens: Some(77),
        ..ResponseParams::default()
    };
    let body = build_request("m", 1024, &model_input(&params, &items(json!([])), &[]));
    assert_eq!(body["max_tokens"], 77);
    assert!(body.get("system").is_none() && body.get("tools").is_none());
}

#[test]
fn reasoning_effort_is_extended_thinking_with_room_for_its_budget() {
    for (effort, budget) in [
        ("minimal", 1_024),
        ("low", 1_024),
        ("medium", 4_096),
        ("high", 16_384),
    ] {
        let params = ResponseParams {
            reasoning: Some(json!({"effort": effort})),
            max_output_tokens: Some(500),
            temperature: Some(0.2),
            top_p: Some(0.5),
            tool_choice: json!("required"),
            ..ResponseParams::default()
        };
        let body = build_request(
            "m",
            1024,
            &model_input(&params, &items(json!([])), &[weather()]),
        );
        assert_eq!(
            body["thinking"],
            json!({"type": "enabled", "budget_tokens": budget}),
            "{effort}"
        );
        assert_eq!(body["max_tokens"], 500 + budget, "{effort}");
        // Anthropic refuses these with thinking on: they are not sent (and the response lists them as ignored).
        assert!(
            body.get("temperature").is_none() && body.get("top_p").is_none(),
            "{body:#}"
        );
        assert_eq!(body["tool_choice"], json!({"type": "auto"}));
    }
    let plain = ResponseParams {
        reasoning: Some(json!({"effort": "none"})),
        temperature: Some(0.2),
        ..ResponseParams::default()
    };
    let body = build_request("m", 1024, &model_input(&plain, &items(json!([])), &[]));
    assert!(body.get("thinking").is_none());
    assert_eq!(body["max_tokens"], 1024);
    assert_eq!(body["temperature"], 0.2);
}

#[test]
fn tool_choice_maps_each_mode() {
    let cases = [
        (json!("auto"), true, json!({"type": "auto"})),
        (json!("required"), true, json!({"type": "any"})),
        (json!("none"), false, json!({"type": "none"})),
        (
            json!("auto"),
            false,
            json!({"type": "auto", "disable_parallel_tool_use": true}),
        ),
        (
            json!({"type": "function", "name": "get_weather"}),
            true,
            json!({"type": "tool", "name": "get_weather"}),
        ),
    ];
    for (choice, parallel, expected) in cases {
        let params = ResponseParams {
            tool_choice: choice.clone(),
            parallel_tool_calls: parallel,
            ..ResponseParams::default()
        };
        let body = build_request(
            "m",
            10,
            &model_input(&params, &items(json!([])), &[weather()]),
        );
        assert_eq!(body["tool_choice"], expected, "{choice}");
    }
}

#[test]
fn mcp_calls_pair_with_their_own_results_and_odd_arguments_are_wrapped() {
    let conversation = items(json!([
        {"type": "message", "role": "user", "content": "go"},
        {"type": "mcp_call", "id": "mcp_1", "call_id": "call_a", "server_label": "gateway", "name": "add",
         "arguments": "[1,2]", "output": "3", "status": "completed"},
    ]));
    let body = build_request(
        "m",
        10,
        &model_input(&ResponseParams::default(), &conversation, &[]),
    );
    assert_eq!(
        body["messages"],
        json!([
            {"role": "user", "content": [{"type": "text", "text": "go"}]},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "call_a", "name": "add", "input": {"input": [1, 2]}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_a", "content": "3", "cache_control": {"type": "ephemeral"}}]}
        ])
    );
}

#[test]
fn a_whole_answer_with_thinking_text_and_calls_is_read() {
    let body = json!({
        "id": "msg_01", "type": "message", "role": "assistant", "model": "claude-x",
        "content": [
            {"type": "thinking", "thinking": "Need both.", "signature": "SIG"},
            {"type": "redacted_thinking", "data": "REDACTED"},
            {"type": "text", "text": "Checking."},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
            {"type": "tool_use", "id": "", "name": "get_weather", "input": {}}
        ],
        "stop_reason": "tool_use",
        "usage": {"input_tokens": 10, "cache_creation_input_tokens": 5, "cache_read_input_tokens": 20, "output_tokens": 7}
    });

    let output = parse_response(&body, &mut Ids(0)).unwrap();

    assert_eq!(
        serde_json::to_value(&output).unwrap(),
        json!({
            "message": {"item_id": "msg_5", "text": "Checking."},
            "tool_calls": [
                {"item_id": "fc_3", "call_id": "toolu_1", "name": "get_weather", "arguments": "{\"city\":\"Paris\"}"},
                {"item_id": "fc_4", "call_id": "call_synth_1", "name": "get_weather", "arguments": "{}"}
            ],
            "usage": {"input_tokens": 35, "output_tokens": 7, "cached_tokens": 20, "reasoning_tokens": 0},
            "finish": "tool_calls",
            "reasoning": [
                {"id": "rs_1", "summary": [{"type": "summary_text", "text": "Need both."}], "encrypted_content": "anthropic.thinking:SIG", "status": "completed"},
                {"id": "rs_2", "summary": [], "encrypted_content": "anthropic.redacted:REDACTED", "status": "completed"}
            ]
        })
    );
}

#[test]
fn stop_reasons_map_to_finishes() {
    let cases = [
        ("end_turn", Finish::Stop),
        ("stop_sequence", Finish::Stop),
        ("max_tokens", Finish::Length),
        ("refusal", Finish::ContentFilter),
        ("tool_use", Finish::Stop),
    ];
    for (reason, finish) in cases {
        let body = json!({"content": [{"type": "text", "text": "x"}], "stop_reason": reason});
        assert_eq!(
            parse_response(&body, &mut Ids(0)).unwrap().finish,
            finish,
            "{reason}"
        );
    }
}

/// A stream with every kind of event, input JSON in fragments, a ping and text in pieces.
fn full_stream() -> Vec<Value> {
    vec![
        json!({"type": "message_start", "message": {"id": "msg_01", "role": "assistant", "content": [],
               "usage": {"input_tokens": 10, "cache_read_input_tokens": 4, "output_tokens": 1}}}),
        json!({"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": "", "signature": ""}}),
        json!({"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "Need "}}),
        json!({"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "both."}}),
        json!({"type": "content_block_delta", "index": 0, "delta": {"type": "signature_delta", "signature": "SIG"}}),
        json!({"type": "content_block_stop", "index": 0}),
        json!({"type": "ping"}),
        json!({"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}}),
        json!({"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": "Check"}}),
        json!({"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": "ing."}}),
        json!({"type": "content_block_stop", "index": 1}),
        json!({"type": "content_block_start", "index": 2, "content_block": {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {}}}),
        json!({"type": "content_block_delta", "index": 2, "delta": {"type": "input_json_delta", "partial_json": ""}}),
        json!({"type": "content_block_delta", "index": 2, "delta": {"type": "input_json_delta", "partial_json": "{\"city\": \"Pa"}}),
        json!({"type": "content_block_delta", "index": 2, "delta": {"type": "input_json_delta", "partial_json": "ris\"}"}}),
        json!({"type": "content_block_stop", "index": 2}),
        json!({"type": "content_block_start", "index": 3, "content_block": {"type": "tool_use", "id": "toolu_2", "name": "get_weather", "input": {}}}),
        json!({"type": "content_block_stop", "index": 3}),
        json!({"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": null}, "usage": {"output_tokens": 15}}),
        json!({"type": "message_stop"}),
    ]
}

#[test]
fn a_stream_accumulates_to_what_the_whole_answer_gives() {
    let mut stream = AnthropicStream::new();
    let mut deltas = Vec::new();
    for event in full_stream() {
        deltas.extend(stream.push(&event).unwrap());
    }
    assert!(stream.is_complete());
    let streamed = stream.finish(&mut Ids(0)).unwrap();
    assert_eq!(
        deltas,
        [
            ModelDelta::Text("Check".into()),
            ModelDelta::Text("ing.".into())
        ]
    );

    let whole = json!({
        "content": [
            {"type": "thinking", "thinking": "Need both.", "signature": "SIG"},
            {"type": "text", "text": "Checking."},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
            {"type": "tool_use", "id": "toolu_2", "name": "get_weather", "input": {}}
        ],
        "stop_reason": "tool_use",
        "usage": {"input_tokens": 10, "cache_read_input_tokens": 4, "output_tokens": 15}
    });
    let mut whole = parse_response(&whole, &mut Ids(0)).unwrap();
    // Fragments are joined as they came; the whole answer's object is serialised compactly.
    whole.tool_calls[0].arguments = "{\"city\": \"Paris\"}".into();
    assert_eq!(streamed, whole);
    assert_eq!(streamed.usage.unwrap().input_tokens, 14);
}

#[test]
fn an_error_event_mid_stream_is_an_error_and_a_cut_stream_is_incomplete() {
    let mut stream = AnthropicStream::new();
    for event in &full_stream()[..9] {
        stream.push(event).unwrap();
    }
    assert!(!stream.is_complete());
    let error = stream
        .push(&json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}))
        .unwrap_err();
    assert!(error.0.contains("Overloaded"), "{error}");
}

#[test]
fn the_end_user_id_goes_as_metadata_user_id() {
    let params = ResponseParams {
        safety_identifier: Some("u-hash".into()),
        user: Some("u1".into()),
        ..ResponseParams::default()
    };
    let sent = build_request("claude", 1024, &model_input(&params, &[], &[]));
    assert_eq!(sent["metadata"], json!({"user_id": "u-hash"}));
    let plain = build_request(
        "claude",
        1024,
        &model_input(&ResponseParams::default(), &[], &[]),
    );
    assert!(plain.get("metadata").is_none());
}

#[test]
fn a_json_format_is_a_forced_tool_whose_input_is_the_answer_whole_and_streamed() {
    let schema =
        json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]});
    let params = ResponseParams {
        text: json!({"format": {"type": "json_schema", "name": "place", "schema": schema, "strict": true}}),
        ..ResponseParams::default()
    };
    let body = build_request("m", 100, &model_input(&params, &items(json!([])), &[]));
    let tool = &body["tools"][0];
    assert_eq!(tool["name"], STRUCTURED_OUTPUT_TOOL);
    assert_eq!(tool["input_schema"], schema);
    assert_eq!(
        body["tool_choice"],
        json!({"type": "tool", "name": STRUCTURED_OUTPUT_TOOL})
    );
    // With tools of the client's, the model must call one of them or the format's; with thinking, no format.
    let with_tools = build_request(
        "m",
        100,
        &model_input(&params, &items(json!([])), &[weather()]),
    );
    assert_eq!(with_tools["tool_choice"], json!({"type": "any"}));
    assert_eq!(with_tools["tools"].as_array().map(Vec::len), Some(2));
    let thinking = ResponseParams {
        reasoning: Some(json!({"effort": "low"})),
        ..params.clone()
    };
    let body = build_request("m", 100, &model_input(&thinking, &items(json!([])), &[]));
    assert!(
        body.get("tools").is_none() && body.get("tool_choice").is_none(),
        "{body:#}"
    );

    let whole = json!({
        "content": [
            {"type": "text", "text": "Here it is:"},
            {"type": "tool_use", "id": "toolu_9", "name": STRUCTURED_OUTPUT_TOOL, "input": {"city": "Paris"}}
        ],
        "stop_reason": "tool_use"
    });
    let output = parse_response(&whole, &mut Ids(0)).unwrap();
    assert_eq!(
        output.message.map(|m| m.text).as_deref(),
        Some("{\"city\":\"Paris\"}")
    );
    assert!(output.tool_calls.is_empty());
    assert_eq!(output.finish, Finish::Stop);

    let mut stream = AnthropicStream::new();
    let mut deltas = Vec::new();
    for event in [
        json!({"type": "message_start", "message": {"usage": {"input_tokens": 3}}}),
        json!({"type": "content_block_start", "index": 0, "content_block": {"type": "tool_use", "id": "toolu_9", "name": STRUCTURED_OUTPUT_TOOL, "input": {}}}),
        json!({"type": "content_block_delta", "index": 0, "delta": {"type": "input_json_delta", "partial_json": "{\"city\": "}}),
        json!({"type": "content_block_delta", "index": 0, "delta": {"type": "input_json_delta", "partial_json": "\"Paris\"}"}}),
        json!({"type": "content_block_stop", "index": 0}),
        json!({"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 5}}),
        json!({"type": "message_stop"}),
    ] {
        deltas.extend(stream.push(&event).unwrap());
    }
    let streamed = stream.finish(&mut Ids(0)).unwrap();
    assert_eq!(
        deltas,
        [
            ModelDelta::Text("{\"city\": ".into()),
            ModelDelta::Text("\"Paris\"}".into())
        ]
    );
    assert_eq!(
        streamed.message.map(|m| m.text).as_deref(),
        Some("{\"city\": \"Paris\"}")
    );
    assert!(streamed.tool_calls.is_empty());
    assert_eq!(streamed.finish, Finish::Stop);
}
