//! Golden tests for the output items and the `Response` object.

use serde_json::json;
use std::collections::BTreeMap;

use super::*;
use crate::decide::IncompleteReason;
use crate::request::{FunctionTool, ResponseParams};
use crate::response::{FailureCode, ResponseRecord, ResponseState, ResponseStatus};
use crate::steps::{AssistantMessage, Finish, ModelStep, StepState, ToolCall, UpstreamFailure};
use crate::test_support::{answered_step, server_call_step};
use crate::toolset::DeclaredTool;

// ---- step builders -------------------------------------------------------------------------------

fn call(call_id: &str, name: &str) -> ToolCall {
    ToolCall::function(
        format!("fc_{call_id}"),
        call_id,
        name,
        format!("{{\"q\":\"{call_id}\"}}"),
    )
}

/// A model call that said `text` (if any) and asked for these `(call_id, name)` calls.
fn model(seq: u32, text: Option<&str>, calls: &[(&str, &str)]) -> Step {
    let finish = if calls.is_empty() {
        Finish::Stop
    } else {
        Finish::ToolCalls
    };
    let tool_calls = calls.iter().map(|(id, name)| call(id, name)).collect();
    answered_step(seq, text, tool_calls, finish)
}

/// A model call that failed for good with `message`, after streaming `partial` if it did.
fn failed_model(seq: u32, message: &str, partial: Option<AssistantMessage>) -> Step {
    Step {
        seq,
        state: StepState::Failed,
        body: StepBody::Model(ModelStep {
            deployment: None,
            output: None,
            failure: Some(UpstreamFailure {
                message: message.into(),
                code: Default::default(),
                partial,
                cut_by_deadline: false,
            }),
        }),
    }
}

fn tool(seq: u32, batch: Option<u32>, call_id: &str, outcome: Option<ToolOutcome>) -> Step {
    let state = match &outcome {
        Some(ToolOutcome::Output { .. }) => StepState::Succeeded,
        Some(ToolOutcome::Error { .. }) => StepState::Failed,
        None => StepState::Running,
    };
    server_call_step(seq, state, call(call_id, "search"), batch, outcome)
}

fn ok(seq: u32, batch: Option<u32>, call_id: &str) -> Step {
    tool(
        seq,
        batch,
        call_id,
        Some(ToolOutcome::Output {
            text: format!("out_{call_id}"),
        }),
    )
}

fn err(seq: u32, batch: Option<u32>, call_id: &str) -> Step {
    tool(
        seq,
        batch,
        call_id,
        Some(ToolOutcome::error(format!("{call_id} failed"))),
    )
}

fn rendered(steps: &[Step], handed_back: bool) -> Value {
    serde_json::to_value(render_output(steps, handed_back)).unwrap()
}

// ---- expected items ------------------------------------------------------------------------------

fn message_json(id: &str, text: &str) -> Value {
    json!({"type": "message", "id": id, "role": "assistant", "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]})
}

/// An `mcp_call` item; a failure is OpenAI's `mcp_tool_execution_error` object holding the message.
fn mcp_json(call_id: &str, output: Option<&str>, error: Option<&str>, status: &str) -> Value {
    let error = error.map(|message| {
        json!({"type": "mcp_tool_execution_error", "content": [{"type": "text", "text": message}]})
    });
    json!({"type": "mcp_call", "id": format!("mcp_{call_id}"), "call_id": call_id, "server_label": "gateway",
        "name": "search", "arguments": format!("{{\"q\":\"{call_id}\"}}"), "output": output, "error": error, "status": status})
}

fn function_call_json(call_id: &str, name: &str) -> Value {
    json!({"type": "function_call", "id": format!("fc_{call_id}"), "call_id": call_id, "name": name,
        "arguments": format!("{{\"q\":\"{call_id}\"}}"), "status": "completed"})
}

/// The ids of rendered items, in order.
fn ids(steps: &[Step], handed_back: bool) -> Vec<String> {
    render_output(steps, handed_back)
        .iter()
        .map(|i| i.id().unwrap_or("<none>").to_owned())
        .collect()
}

// ---- render_output -------------------------------------------------------------------------------

#[test]
fn steps_render_as_the_output_items_clients_see() {
    // (what the row shows, the steps, whether the last batch is handed back, the items)
    let rows = [
        (
            "model text renders as an assistant message",
            vec![model(0, Some("Hi there"), &[])],
            false,
            json!([message_json("msg_0", "Hi there")]),
        ),
        (
            "server calls render as mcp calls with output, error or in progress",
            vec![
                model(
                    0,
                    None,
                    &[("a", "search"), ("b", "search"), ("c", "search")],
                ),
                ok(1, Some(0), "a"),
                err(2, Some(0), "b"),
                tool(3, Some(0), "c", None),
            ],
            false,
            json!([
                mcp_json("a", Some("out_a"), None, "completed"),
                mcp_json("b", None, Some("b failed"), "failed"),
                mcp_json("c", None, None, "in_progress"),
            ]),
        ),
        (
            "a handed back batch renders as function calls after its text",
            vec![model(
                0,
                Some("Checking."),
                &[("a", "search"), ("b", "client_fn")],
            )],
            true,
            json!([
                message_json("msg_0", "Checking."),
                function_call_json("a", "search"),
                function_call_json("b", "client_fn")
            ]),
        ),
        (
            "only the last batch is handed back",
            vec![
                model(0, None, &[("a", "search")]),
                ok(1, Some(0), "a"),
                model(2, None, &[("b", "client_fn")]),
            ],
            true,
            json!([
                mcp_json("a", Some("out_a"), None, "completed"),
                function_call_json("b", "client_fn")
            ]),
        ),
        (
            "carried tool steps render before the first model text",
            vec![
                ok(0, None, "x"),
                err(1, None, "y"),
                model(2, Some("answer"), &[]),
            ],
            false,
            json!([
                mcp_json("x", Some("out_x"), None, "completed"),
                mcp_json("y", None, Some("y failed"), "failed"),
                message_json("msg_2", "answer"),
            ]),
        ),
    ];
    for (name, steps, handed_back, items) in rows {
        assert_eq!(rendered(&steps, handed_back), items, "{name}");
    }
}

#[test]
fn calls_of_a_batch_that_never_ran_are_left_out() {
    // A limit was reached before dispatch: neither function_call nor mcp_call items.
    let steps = [model(
        0,
        Some("Let me search."),
        &[("a", "search"), ("b", "search")],
    )];
    assert_eq!(
        rendered(&steps, false),
        json!([message_json("msg_0", "Let me search.")])
    );

    // Partly recorded: only the recorded call shows.
    let steps = [
        model(0, None, &[("a", "search"), ("b", "search")]),
        ok(1, Some(0), "a"),
    ];
    assert_eq!(ids(&steps, false), ["mcp_a"]);
}

#[test]
fn items_appear_in_the_order_they_happened_across_model_calls() {
    let steps = [
        model(0, Some("first"), &[("a", "search")]),
        ok(1, Some(0), "a"),
        model(2, Some("second"), &[("b", "search"), ("c", "search")]),
        ok(3, Some(2), "c"),
        err(4, Some(2), "b"),
        model(5, Some("done"), &[]),
    ];
    assert_eq!(
        ids(&steps, false),
        ["msg_0", "mcp_a", "msg_2", "mcp_c", "mcp_b", "msg_5"]
    );
    // handed_back only concerns the last model call, which asked for nothing here.
    assert_eq!(
        ids(&steps, true),
        ["msg_0", "mcp_a", "msg_2", "mcp_c", "mcp_b", "msg_5"]
    );
}

#[test]
fn failed_or_unended_model_calls_render_nothing() {
    let failed = failed_model(2, "503", None);
    let running = Step {
        seq: 2,
        state: StepState::Running,
        body: StepBody::Model(ModelStep::default()),
    };
    for last in [failed, running] {
        let steps = [
            model(0, None, &[("a", "search")]),
            ok(1, Some(0), "a"),
            last,
        ];
        assert_eq!(ids(&steps, false), ["mcp_a"]);
    }
}

#[test]
fn a_model_call_that_broke_off_after_streaming_text_renders_that_text_as_an_incomplete_message() {
    let streamed = AssistantMessage {
        item_id: "msg_partial".into(),
        text: "The answer is".into(),
        deltas: Vec::new(),
    };
    let broken = failed_model(2, "stream broke", Some(streamed));
    let steps = [
        model(0, None, &[("a", "search")]),
        ok(1, Some(0), "a"),
        broken,
    ];
    let mut partial = message_json("msg_partial", "The answer is");
    partial["status"] = json!("incomplete");
    assert_eq!(
        rendered(&steps, false),
        json!([mcp_json("a", Some("out_a"), None, "completed"), partial])
    );
}

#[test]
fn tool_steps_recorded_but_never_started_are_left_out() {
    let mut pending = tool(2, Some(0), "b", None);
    pending.state = StepState::Pending;
    let steps = [
        model(0, None, &[("a", "search"), ("b", "search")]),
        ok(1, Some(0), "a"),
        pending,
    ];
    assert_eq!(ids(&steps, false), ["mcp_a"]);
}

#[test]
fn rendered_items_read_back_as_input_items() {
    let steps = [
        model(0, Some("t"), &[("a", "search")]),
        ok(1, Some(0), "a"),
        model(2, None, &[("b", "client_fn")]),
    ];
    let items = render_output(&steps, true);
    for item in &items {
        let value = serde_json::to_value(item).unwrap();
        assert_eq!(
            crate::items::parse_input_item(value),
            Ok(crate::items::InputItem::Item(item.clone()))
        );
    }
}

// ---- response_object -----------------------------------------------------------------------------

fn params() -> ResponseParams {
    ResponseParams::default()
}

fn record() -> ResponseRecord {
    ResponseRecord {
        id: "resp_1".into(),
        created_at: 1_741_476_777,
        state: ResponseState::Ended {
            ending: Ending::Completed { handed_back: false },
            completed_at: 1_741_476_778,
        },
        model: "m".into(),
        params: params(),
        previous_response_id: None,
        store: true,
        background: false,
        usage: Some(Usage {
            input_tokens: 5,
            output_tokens: 3,
            cached_tokens: 0,
            reasoning_tokens: 0,
        }),
    }
}

#[test]
fn a_minimal_response_has_every_key_with_its_default() {
    let output = render_output(&[model(0, Some("Hi"), &[])], false);
    assert_eq!(
        response_object(&record(), &output),
        json!({
            "id": "resp_1", "object": "response", "created_at": 1_741_476_777, "completed_at": 1_741_476_778, "conversation": null,
            "status": "completed", "background": false, "error": null, "incomplete_details": null,
            "instructions": null, "max_output_tokens": null, "max_tool_calls": null, "model": "m",
            "output": [message_json("msg_0", "Hi")], "output_text": "Hi",
            "parallel_tool_calls": true, "previous_response_id": null,
            "presence_penalty": 0.0, "frequency_penalty": 0.0, "top_logprobs": 0,
            "reasoning": {"effort": null, "summary": null},
            "safety_identifier": null, "prompt_cache_key": null, "service_tier": "default",
            "store": true, "temperature": 1.0, "text": {"format": {"type": "text"}}, "tool_choice": "auto",
            "tools": [], "top_p": 1.0, "truncation": "disabled",
            "usage": {"input_tokens": 5, "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0}, "output_tokens": 3,
                      "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 8},
            "user": null, "metadata": {},
        })
    );
}

#[test]
fn every_request_parameter_is_echoed() {
    let mut r = record();
    r.previous_response_id = Some("resp_0".into());
    r.background = true;
    r.state = ResponseState::InProgress;
    r.usage = None;
    r.params = ResponseParams {
        instructions: Some("Be terse.".into()),
        tools: vec![
            DeclaredTool::Function(FunctionTool {
                name: "get_weather".into(),
                description: Some("Weather".into()),
                parameters: Some(json!({"type": "object"})),
                strict: Some(true),
            }),
            DeclaredTool::Function(FunctionTool {
                name: "bare".into(),
                description: None,
                parameters: None,
                strict: None,
            }),
        ],
        tool_choice: json!({"type": "function", "name": "get_weather"}),
        parallel_tool_calls: false,
        max_tool_calls: Some(4),
        temperature: Some(0.2),
        top_p: Some(0.5),
        max_output_tokens: Some(500),
        truncation: "auto".into(),
        text: json!({"format": {"type": "json_object"}}),
        reasoning: Some(json!({"effort": "low", "summary": "auto"})),
        metadata: BTreeMap::from([("team".to_string(), "search".to_string())]),
        user: Some("u1".into()),
        safety_identifier: Some("s1".into()),
        prompt_cache_key: Some("k1".into()),
        service_tier: Some("flex".into()),
        include: None,
        top_logprobs: Some(2),
        presence_penalty: Some(0.25),
        frequency_penalty: Some(-1.0),
        conversation: Some("conv_1".into()),
        conversation_turn_from: Some(3),
    };
    let object = response_object(&r, &[]);
    let expected = [
        ("status", json!("in_progress")),
        ("conversation", json!({"id": "conv_1"})),
        ("completed_at", Value::Null),
        ("background", json!(true)),
        ("previous_response_id", json!("resp_0")),
        ("instructions", json!("Be terse.")),
        ("max_output_tokens", json!(500)),
        ("max_tool_calls", json!(4)),
        ("parallel_tool_calls", json!(false)),
        ("temperature", json!(0.2)),
        ("top_p", json!(0.5)),
        ("presence_penalty", json!(0.25)),
        ("frequency_penalty", json!(-1.0)),
        ("truncation", json!("auto")),
        ("text", json!({"format": {"type": "json_object"}})),
        ("reasoning", json!({"effort": "low", "summary": "auto"})),
        (
            "tool_choice",
            json!({"type": "function", "name": "get_weather"}),
        ),
        ("metadata", json!({"team": "search"})),
        ("user", json!("u1")),
        ("safety_identifier", json!("s1")),
        ("prompt_cache_key", json!("k1")),
        ("service_tier", json!("flex")),
        ("usage", Value::Null),
        ("output", json!([])),
        ("output_text", json!("")),
        (
            "tools",
            json!([
                {"type": "function", "name": "get_weather", "description": "Weather", "parameters": {"type": "object"}, "strict": true},
                {"type": "function", "name": "bare", "description": null, "parameters": null, "strict": null},
            ]),
        ),
    ];
    for (key, value) in expected {
        assert_eq!(object.get(key), Some(&value), "{key}");
    }
    assert!(
        !object.to_string().contains("turn_from"),
        "what the gateway keeps for itself is never shown"
    );
}

#[test]
fn echoed_tools_always_carry_description_parameters_and_strict() {
    let mut r = record();
    r.params.tools = vec![DeclaredTool::Function(FunctionTool {
        name: "bare".into(),
        description: None,
        parameters: None,
        strict: None,
    })];
    let object = response_object(&r, &[]);
    let tool = object["tools"][0].as_object().unwrap();
    for key in ["type", "name", "description", "parameters", "strict"] {
        assert!(tool.contains_key(key), "tool lacks '{key}': {object}");
    }
}

#[test]
fn every_key_required_by_openai_and_open_responses_is_present() {
    let object = response_object(&record(), &[]);
    let keys = [
        "id",
        "object",
        "created_at",
        "completed_at",
        "status",
        "background",
        "error",
        "incomplete_details",
        "instructions",
        "max_output_tokens",
        "max_tool_calls",
        "model",
        "output",
        "parallel_tool_calls",
        "previous_response_id",
        "reasoning",
        "store",
        "temperature",
        "text",
        "tool_choice",
        "tools",
        "top_p",
        "truncation",
        "usage",
        "metadata",
        "presence_penalty",
        "frequency_penalty",
        "top_logprobs",
        "service_tier",
        "safety_identifier",
        "prompt_cache_key",
    ];
    for key in keys {
        assert!(object.get(key).is_some(), "missing '{key}'");
    }
    assert!(object["created_at"].is_i64());
}

#[test]
fn a_failed_response_carries_its_error_and_no_incomplete_details() {
    let mut r = record();
    r.state = ResponseState::Ended {
        ending: Ending::server_error("The upstream model failed."),
        completed_at: 1_741_476_778,
    };
    let object = response_object(&r, &[]);
    assert_eq!(object["status"], "failed");
    assert_eq!(
        object["error"],
        json!({"code": "server_error", "message": "The upstream model failed."})
    );
    assert_eq!(object["incomplete_details"], Value::Null);
}

#[test]
fn an_incomplete_response_names_its_reason() {
    let mut r = record();
    r.state = ResponseState::Ended {
        ending: Ending::Incomplete {
            reason: IncompleteReason::MaxToolCalls,
        },
        completed_at: 1_741_476_778,
    };
    let object = response_object(&r, &[]);
    assert_eq!(object["status"], "incomplete");
    assert_eq!(
        object["incomplete_details"],
        json!({"reason": "max_tool_calls"})
    );
    assert_eq!(object["error"], Value::Null);
}

/// Token counts: input, output, of the input cached, of the output reasoning.
fn usage(input: u64, output: u64, cached: u64, reasoning: u64) -> Usage {
    Usage {
        input_tokens: input,
        output_tokens: output,
        cached_tokens: cached,
        reasoning_tokens: reasoning,
    }
}

/// The `usage` of a response object whose record holds `usage`.
fn usage_json(usage: Usage) -> Value {
    let mut r = record();
    r.usage = Some(usage);
    response_object(&r, &[])["usage"].clone()
}

#[test]
fn usage_reports_details_and_the_total() {
    assert_eq!(
        usage_json(usage(120, 45, 100, 30)),
        json!({"input_tokens": 120, "input_tokens_details": {"cached_tokens": 100, "cache_write_tokens": 0}, "output_tokens": 45,
               "output_tokens_details": {"reasoning_tokens": 30}, "total_tokens": 165})
    );
}

#[test]
fn usage_of_several_model_calls_is_summed() {
    let with_usage = |seq: u32, input: u64, output: u64, cached: u64| {
        let mut step = model(seq, Some("x"), &[]);
        if let StepBody::Model(ModelStep {
            output: Some(o), ..
        }) = &mut step.body
        {
            o.usage = Some(usage(input, output, cached, 1));
        }
        step
    };
    let steps = [
        with_usage(0, 10, 2, 4),
        ok(1, Some(0), "a"),
        with_usage(2, 20, 3, 0),
    ];
    assert_eq!(
        usage_json(crate::steps::total_usage(&steps)),
        json!({"input_tokens": 30, "input_tokens_details": {"cached_tokens": 4, "cache_write_tokens": 0}, "output_tokens": 5,
               "output_tokens_details": {"reasoning_tokens": 2}, "total_tokens": 35})
    );
}

#[test]
fn output_text_joins_the_text_of_every_message_only() {
    let steps = [
        model(0, Some("Let me check. "), &[("a", "search")]),
        ok(1, Some(0), "a"),
        model(2, Some("It is sunny."), &[]),
    ];
    let object = response_object(&record(), &render_output(&steps, false));
    assert_eq!(object["output_text"], "Let me check. It is sunny.");
    assert_eq!(object["output"].as_array().map(Vec::len), Some(3));
}

#[test]
fn statuses_round_trip_through_their_wire_names() {
    let statuses = [
        (ResponseStatus::Queued, "queued", false),
        (ResponseStatus::InProgress, "in_progress", false),
        (ResponseStatus::Completed, "completed", true),
        (ResponseStatus::Incomplete, "incomplete", true),
        (ResponseStatus::Failed, "failed", true),
        (ResponseStatus::Cancelled, "cancelled", true),
    ];
    assert_eq!(statuses.len(), ResponseStatus::ALL.len());
    for (status, name, terminal) in statuses {
        assert_eq!(status.as_str(), name);
        assert_eq!(ResponseStatus::parse(name), Some(status));
        assert_eq!(status.is_terminal(), terminal, "{name}");
    }
    assert_eq!(ResponseStatus::parse("done"), None);
}

#[test]
fn echoed_reasoning_always_has_effort_and_summary() {
    let cases = [
        (None, json!({"effort": null, "summary": null})),
        (
            Some(json!({"effort": "low"})),
            json!({"effort": "low", "summary": null}),
        ),
        (
            Some(json!({"summary": "auto"})),
            json!({"effort": null, "summary": "auto"}),
        ),
        (
            Some(json!({"effort": "high", "summary": "detailed"})),
            json!({"effort": "high", "summary": "detailed"}),
        ),
    ];
    for (reasoning, expected) in cases {
        let mut r = record();
        r.params.reasoning = reasoning.clone();
        assert_eq!(
            response_object(&r, &[])["reasoning"],
            expected,
            "reasoning {reasoning:?}"
        );
    }
}

#[test]
fn echoed_text_always_names_a_format() {
    let cases = [
        (
            json!({"verbosity": "low"}),
            json!({"format": {"type": "text"}, "verbosity": "low"}),
        ),
        (json!({}), json!({"format": {"type": "text"}})),
        (
            json!({"format": {"type": "json_object"}, "verbosity": "high"}),
            json!({"format": {"type": "json_object"}, "verbosity": "high"}),
        ),
    ];
    for (text, expected) in cases {
        let mut r = record();
        r.params.text = text.clone();
        assert_eq!(response_object(&r, &[])["text"], expected, "text {text}");
    }
}

#[test]
fn a_tool_that_answered_non_2xx_renders_an_http_error() {
    let mut step = tool(0, Some(0), "h", None);
    if let StepBody::Tool(tool) = &mut step.body {
        tool.outcome = Some(ToolOutcome::Error {
            message: "Tool answered HTTP 503".into(),
            http_status: Some(503),
        });
    }
    let items = rendered(&[step], false);
    assert_eq!(
        items[0]["error"],
        json!({"type": "http_error", "code": 503, "message": "Tool answered HTTP 503"})
    );
    assert_eq!(items[0]["status"], "failed");
}

#[test]
fn listed_input_items_show_string_content_as_text_parts() {
    assert_eq!(
        listed_input_item(json!({"id": "msg_1", "role": "user", "content": "hi"})),
        json!({"id": "msg_1", "type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]})
    );
    assert_eq!(
        listed_input_item(json!({"type": "message", "role": "assistant", "content": "ok"})),
        json!({"type": "message", "role": "assistant",
               "content": [{"type": "output_text", "text": "ok", "annotations": []}]})
    );
    let parts = json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a"}]});
    assert_eq!(
        listed_input_item(parts.clone()),
        parts,
        "parts stay as sent"
    );
    let output = json!({"type": "function_call_output", "call_id": "c", "output": "text"});
    assert_eq!(
        listed_input_item(output.clone()),
        output,
        "only messages change"
    );
}

/// A bound `web_search` call `a` (item `ws_a`, query "rust") that answered "results".
fn hosted_search_step() -> Step {
    let mut step = tool(
        1,
        Some(0),
        "a",
        Some(ToolOutcome::Output {
            text: "results".into(),
        }),
    );
    if let StepBody::Tool(t) = &mut step.body {
        t.hosted_type = Some("web_search".into());
        t.item_id = "ws_a".into();
        t.call.arguments = "{\"query\":\"rust\"}".into();
    }
    step
}

#[test]
fn a_bound_hosted_call_keeps_its_output_for_models_and_shows_clients_the_hosted_item() {
    let step = hosted_search_step();
    let item = render_output(std::slice::from_ref(&step), false).remove(0);
    // Stored context keeps the call and its output: a continuation pairs them for the model.
    let Item::McpCall(call) = &item else {
        panic!("{item:?}")
    };
    assert_eq!(call.output.as_deref(), Some("results"));
    assert_eq!(call.hosted_type.as_deref(), Some("web_search"));
    let stored: Item = serde_json::from_value(serde_json::to_value(&item).unwrap()).unwrap();
    assert_eq!(stored, item);
    assert_eq!(
        client_item_json(&item),
        json!({"id": "ws_a", "type": "web_search_call", "status": "completed",
               "action": {"type": "search", "query": "rust"}})
    );
    // A hosted type without a shaped item shows as a plain mcp_call.
    let Item::McpCall(mut other) = item else {
        unreachable!()
    };
    other.hosted_type = Some("file_search".into());
    let shown = client_item_json(&Item::McpCall(other));
    assert_eq!(shown["type"], "mcp_call");
    assert!(shown.get("hosted_type").is_none());
}

#[test]
fn the_object_written_straight_out_reads_back_as_the_response_object() {
    let mut output = render_output(
        &[
            model(0, Some("Hi"), &[("a", "search")]),
            hosted_search_step(),
        ],
        false,
    );
    output.insert(
        0,
        Item::Reasoning(crate::items::ReasoningItem {
            id: Some("rs_1".into()),
            summary: vec![json!({"type": "summary_text", "text": "thought"})],
            encrypted_content: Some("sealed".into()),
            status: None,
        }),
    );
    let mut r = record();
    r.params.conversation = Some("conv_1".into());
    r.params.metadata.insert("k".into(), "v".into());
    for include in [
        None,
        Some(vec![crate::reasoning::INCLUDE_ENCRYPTED.to_owned()]),
    ] {
        r.params.include = include;
        let written = serde_json::to_vec(&ResponseObject::new(&r, &output)).unwrap();
        let read: Value = serde_json::from_slice(&written).unwrap();
        let object = response_object(&r, &output);
        assert_eq!(read, object);
        // What clients are shown: the hosted call in OpenAI's shape, the reasoning sealed unless asked for.
        assert_eq!(object["output"][2]["type"], "web_search_call");
        assert_eq!(
            object["output"][0]["encrypted_content"].is_string(),
            r.params.include.is_some()
        );
    }
}

#[test]
fn the_usage_object_is_written_with_its_keys_in_the_order_they_always_had() {
    let usage = Usage {
        input_tokens: 12,
        output_tokens: 5,
        cached_tokens: 3,
        reasoning_tokens: 2,
    };
    assert_eq!(
        serde_json::to_string(&usage_object(&usage)).unwrap(),
        r#"{"input_tokens":12,"input_tokens_details":{"cache_write_tokens":0,"cached_tokens":3},"output_tokens":5,"output_tokens_details":{"reasoning_tokens":2},"total_tokens":17}"#
    );
}

/// The object's text written by hand and by serde_json's derive, which must be the same bytes.
fn both_texts(r: &ResponseRecord, output: &[Item]) -> (String, String) {
    let object = ResponseObject::new(r, output);
    let mut by_hand = Vec::new();
    object.write_json(&mut by_hand).unwrap();
    let derived = serde_json::to_vec(&object).unwrap();
    (
        String::from_utf8(by_hand).unwrap(),
        String::from_utf8(derived).unwrap(),
    )
}

#[test]
fn the_object_written_by_hand_is_the_derived_text_in_every_state() {
    let output = render_output(
        &[
            model(0, Some("Hi \"there\"\n"), &[("a", "search")]),
            tool(
                1,
                Some(0),
                "a",
                Some(ToolOutcome::Output { text: "x".into() }),
            ),
            hosted_search_step(),
        ],
        true,
    );
    let states = [
        ResponseState::Queued,
        ResponseState::InProgress,
        ResponseState::Ended {
            ending: Ending::Completed { handed_back: true },
            completed_at: 7,
        },
        ResponseState::Ended {
            ending: Ending::Incomplete {
                reason: IncompleteReason::MaxToolCalls,
            },
            completed_at: 7,
        },
        ResponseState::Ended {
            ending: Ending::Failed {
                code: FailureCode::UpstreamRejected,
                message: "no \\ way".into(),
            },
            completed_at: 7,
        },
    ];
    for state in states {
        let mut r = record();
        r.state = state;
        let (by_hand, derived) = both_texts(&r, &output);
        assert_eq!(by_hand, derived);
    }
    let mut r = record();
    r.usage = None;
    r.previous_response_id = Some("resp_0".into());
    r.params = ResponseParams {
        instructions: Some("Be terse.\t".into()),
        tools: vec![DeclaredTool::Function(FunctionTool {
            name: "get_weather".into(),
            description: Some("Weather".into()),
            parameters: Some(json!({"type": "object"})),
            strict: Some(true),
        })],
        tool_choice: json!({"type": "function", "name": "get_weather"}),
        max_tool_calls: Some(4),
        temperature: Some(0.2),
        top_p: Some(1e-7),
        max_output_tokens: Some(500),
        text: json!({"verbosity": "low"}),
        reasoning: Some(json!({"effort": "low"})),
        metadata: BTreeMap::from([
            ("team".to_string(), "search".to_string()),
            ("é\u{1}".to_string(), "\"q\"".to_string()),
        ]),
        user: Some("u1".into()),
        safety_identifier: Some("s1".into()),
        prompt_cache_key: Some("k1".into()),
        service_tier: Some("flex".into()),
        include: Some(vec![crate::reasoning::INCLUDE_ENCRYPTED.to_owned()]),
        top_logprobs: Some(2),
        conversation: Some("conv_1".into()),
        ..ResponseParams::default()
    };
    let (by_hand, derived) = both_texts(&r, &output);
    assert_eq!(by_hand, derived);
    let (by_hand, derived) = both_texts(&r, &[]);
    assert_eq!(by_hand, derived);
    // Messages of every role and content, with and without an id and a status.
    let messages: Vec<Item> = [
        json!({"type": "message", "role": "user", "content": "plain \"text\""}),
        json!({"type": "message", "id": "msg_1", "role": "system", "content": [
            {"type": "input_text", "text": "a"}, {"type": "output_text", "text": "b"}]}),
        json!({"type": "message", "role": "developer", "status": "completed", "content": [
            {"type": "output_text", "text": "c", "annotations": [{"type": "url_citation"}]},
            {"type": "refusal", "refusal": "no"}]}),
        json!({"type": "message", "role": "assistant", "content": []}),
    ]
    .into_iter()
    .map(|item| serde_json::from_value(item).unwrap())
    .collect();
    let (by_hand, derived) = both_texts(&r, &messages);
    assert_eq!(by_hand, derived);
}

proptest::proptest! {
    /// Any text in any string field, and any number, comes out as the derived text does.
    #[test]
    fn the_object_written_by_hand_is_the_derived_text_for_any_strings_and_numbers(
        texts in proptest::collection::vec(proptest::option::of(".*"), 6),
        numbers in proptest::collection::vec(proptest::num::u32::ANY, 4),
        created_at in proptest::num::i64::ANY,
        temperature in proptest::num::f64::ANY,
    ) {
        let text = |i: usize| texts[i].clone();
        let mut r = record();
        r.id = text(0).unwrap_or_default();
        r.model = text(1).unwrap_or_default();
        r.created_at = created_at;
        r.params.instructions = text(2);
        r.params.user = text(3);
        r.params.max_output_tokens = Some(numbers[0]);
        r.params.top_logprobs = Some(numbers[1]);
        r.params.temperature = Some(temperature);
        if let (Some(key), Some(value)) = (text(4), text(5)) {
            r.params.metadata.insert(key, value);
        }
        r.usage = Some(Usage {
            input_tokens: u64::from(numbers[2]),
            output_tokens: u64::from(numbers[3]),
            cached_tokens: 3,
            reasoning_tokens: 1,
        });
        let output = render_output(&[model(0, text(5).as_deref(), &[])], false);
        let (by_hand, derived) = both_texts(&r, &output);
        proptest::prop_assert_eq!(by_hand, derived);
    }
}

proptest::proptest! {
    /// A string written whole, or in pieces between quotes, is the text serde_json writes for it.
    #[test]
    fn a_string_written_by_hand_is_the_text_serde_json_writes(
        pieces in proptest::collection::vec("(?s).{0,12}", 0..4),
    ) {
        let whole: String = pieces.concat();
        let expected = serde_json::to_vec(&whole).unwrap();
        let mut at_once = b"[".to_vec();
        push_json_string(&mut at_once, &whole);
        proptest::prop_assert_eq!(&at_once[1..], &expected[..]);
        let mut in_pieces = b"[\"".to_vec();
        for piece in &pieces {
            push_json_string_contents(&mut in_pieces, piece);
        }
        in_pieces.push(b'"');
        proptest::prop_assert_eq!(&in_pieces[1..], &expected[..]);
        // Into an empty buffer: nothing before the text to take for a quote.
        let mut bare = Vec::new();
        for piece in &pieces {
            push_json_string_contents(&mut bare, piece);
        }
        proptest::prop_assert_eq!(&bare[..], &expected[1..expected.len() - 1]);
    }
}
