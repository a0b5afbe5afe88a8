//! Golden JSON tests for the Chat Completions translation, both ways.

use super::*;
use crate::context::model_conversation;
use crate::items::InputItem;
use crate::request::ResponseParams;
use crate::request::{validate, CreateResponseBody};
use crate::steps::{ModelStep, Step, StepBody, StepState, ToolOutcome};
use crate::test_support::{items, model_input};
use crate::toolset::FunctionTool;

// ---- helpers -------------------------------------------------------------------------------------

fn params() -> ResponseParams {
    ResponseParams::default()
}

fn tool(
    name: &str,
    description: Option<&str>,
    parameters: Option<Value>,
    strict: Option<bool>,
) -> OfferedTool {
    OfferedTool::function(&FunctionTool {
        name: name.into(),
        description: description.map(Into::into),
        parameters,
        strict,
    })
}

fn weather_tool() -> OfferedTool {
    tool(
        "get_weather",
        Some("Weather by city"),
        Some(json!({"type": "object"})),
        None,
    )
}

/// The `messages` of the request for this conversation, without instructions or tools.
fn messages_of(conversation: Value) -> Value {
    build_request("m", &model_input(&params(), &items(conversation), &[]))["messages"].clone()
}

/// Ids drawn in order: `fc_1`, `msg_2`, ...; synthesised call ids name their index, and are logged.
#[derive(Default)]
struct CountingIds {
    next: usize,
    call_id_requests: Vec<usize>,
}

impl IdSource for CountingIds {
    fn item_id(&mut self, prefix: &str) -> String {
        self.next += 1;
        format!("{prefix}_{}", self.next)
    }

    fn call_id(&mut self, index: usize) -> String {
        self.call_id_requests.push(index);
        format!("call_synth{index}")
    }
}

/// The answer read as a tree and as sent (its bytes), which must agree.
fn parse(body: Value) -> Result<ModelOutput, ParseError> {
    let from_tree = parse_response(&body, &mut CountingIds::default());
    let bytes = serde_json::to_vec(&body).unwrap();
    let from_bytes = parse_answer(&bytes, &mut CountingIds::default()).map_err(|e| match e {
        AnswerError::Shape(e) => e,
        AnswerError::Json(e) => panic!("valid JSON was refused: {e}"),
    });
    assert_eq!(from_bytes, from_tree, "{body}");
    from_tree
}

/// An answer read as sent, from its text.
fn parse_text(body: &str) -> Result<ModelOutput, AnswerError> {
    parse_answer(body.as_bytes(), &mut CountingIds::default())
}

/// A one-choice answer whose message holds these tool calls.
fn answer_with_calls(tool_calls: Value, finish_reason: &str) -> Value {
    json!({"choices": [{"index": 0, "message": {"role": "assistant", "content": null, "tool_calls": tool_calls},
        "finish_reason": finish_reason}]})
}

fn call(item_id: &str, call_id: &str, name: &str, arguments: &str) -> ToolCall {
    ToolCall::function(item_id, call_id, name, arguments)
}

// ---- build_request: messages ---------------------------------------------------------------------

#[test]
fn instructions_lead_and_string_input_becomes_a_user_message() {
    let valid = validate(
        serde_json::from_value::<CreateResponseBody>(
            json!({"model": "gw-model", "input": "What is 2+2?", "instructions": "Be terse."}),
        )
        .unwrap(),
    )
    .unwrap();
    let input: Vec<Item> = valid
        .input
        .into_iter()
        .map(|i| match i {
            InputItem::Item(item) => item,
            InputItem::Reference { .. } | InputItem::Hosted { .. } => {
                unreachable!("no references here")
            }
        })
        .collect();
    let body = build_request("upstream-model", &model_input(&valid.params, &input, &[]));
    assert_eq!(
        body,
        json!({
            "model": "upstream-model",
            "messages": [
                {"role": "system", "content": "Be terse."},
                {"role": "user", "content": "What is 2+2?"},
            ],
        })
    );
}

#[test]
fn conversations_become_the_chat_messages_a_provider_reads() {
    // (what the row shows, the conversation, its messages)
    let rows = [
        (
            "no instructions means no system message",
            json!([{"type": "message", "role": "user", "content": "hi"}]),
            json!([{"role": "user", "content": "hi"}]),
        ),
        (
            "message roles and parts map to chat messages",
            json!([
                {"type": "message", "role": "developer", "content": "dev rules"},
                {"type": "message", "role": "system", "content": [{"type": "input_text", "text": "sys rules"}]},
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]},
                {"type": "message", "role": "user", "content": [
                    {"type": "input_text", "text": "look"},
                    {"type": "input_image", "image_url": "https://x/cat.png", "detail": "low"},
                    {"type": "input_image", "file_id": "file_1"},
                    {"type": "input_file", "file_data": "data:application/pdf;base64,JVBER", "filename": "a.pdf"},
                    {"type": "input_file", "file_url": "https://x/b.pdf"},
                    {"type": "input_file", "file_id": "file_2"}]},
                {"type": "message", "role": "assistant", "content": [
                    {"type": "output_text", "text": "a cat", "annotations": []}, {"type": "refusal", "refusal": "!"}]},
                {"type": "message", "role": "assistant", "content": [
                    {"type": "output_text", "text": "see"}, {"type": "input_image", "image_url": "https://x/dog.png"}]},
            ]),
            json!([
                {"role": "system", "content": "dev rules"},
                {"role": "system", "content": "sys rules"},
                {"role": "user", "content": "ab"},
                {"role": "user", "content": [
                    {"type": "text", "text": "look"},
                    {"type": "image_url", "image_url": {"url": "https://x/cat.png", "detail": "low"}},
                    {"type": "file", "file": {"file_data": "data:application/pdf;base64,JVBER", "filename": "a.pdf"}},
                    {"type": "file", "file": {"file_id": "file_2"}}]},
                {"role": "assistant", "content": "a cat!"},
                {"role": "assistant", "content": "see"},
            ]),
        ),
        (
            "consecutive function calls and the text before them form one assistant message",
            json!([
                {"type": "message", "role": "user", "content": "weather and time?"},
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking both."}]},
                {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\":\"SF\"}"},
                {"type": "function_call", "id": "fc_2", "call_id": "call_2", "name": "get_time", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
                {"type": "function_call_output", "call_id": "call_2", "output": "noon"},
            ]),
            json!([
                {"role": "user", "content": "weather and time?"},
                {"role": "assistant", "content": "Checking both.", "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"SF\"}"}},
                    {"id": "call_2", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
                {"role": "tool", "tool_call_id": "call_2", "content": "noon"},
            ]),
        ),
        (
            "tool messages follow their calls in call order whatever order outputs came in",
            json!([
                {"type": "message", "role": "user", "content": "go"},
                {"type": "function_call", "call_id": "call_a", "name": "f", "arguments": "{}"},
                {"type": "function_call", "call_id": "call_b", "name": "g", "arguments": "{}"},
                {"type": "message", "role": "user", "content": "also this"},
                {"type": "function_call_output", "call_id": "call_b", "output": [{"type": "input_text", "text": "B"}, {"type": "input_text", "text": "!"}]},
                {"type": "function_call_output", "call_id": "call_a", "output": "A"},
            ]),
            json!([
                {"role": "user", "content": "go"},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "call_a", "type": "function", "function": {"name": "f", "arguments": "{}"}},
                    {"id": "call_b", "type": "function", "function": {"name": "g", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "call_a", "content": "A"},
                {"role": "tool", "tool_call_id": "call_b", "content": "B!"},
                {"role": "user", "content": "also this"},
            ]),
        ),
        (
            "calls separated by a user message form separate assistant messages",
            json!([
                {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c1", "output": "one"},
                {"type": "message", "role": "user", "content": "again"},
                {"type": "function_call", "call_id": "c2", "name": "f", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c2", "output": "two"},
            ]),
            json!([
                {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "one"},
                {"role": "user", "content": "again"},
                {"role": "assistant", "content": null, "tool_calls": [{"id": "c2", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "c2", "content": "two"},
            ]),
        ),
        (
            "mcp calls become tool calls with their result or error as tool messages",
            json!([
                {"type": "message", "role": "user", "content": "search"},
                {"type": "mcp_call", "id": "mcp_1", "call_id": "call_s", "server_label": "gateway", "name": "search",
                 "arguments": "{\"q\":\"rust\"}", "output": "3 hits", "error": null, "status": "completed"},
                {"type": "function_call", "id": "fc_9", "call_id": "call_c", "name": "client_fn", "arguments": "{}"},
                {"type": "mcp_call", "id": "mcp_2", "call_id": "call_f", "server_label": "gateway", "name": "fetch",
                 "arguments": "{}", "output": null, "error": "HTTP 502", "status": "failed"},
                {"type": "mcp_call", "id": "mcp_only", "server_label": "gateway", "name": "fetch", "arguments": "{}", "output": "by id"},
                {"type": "function_call_output", "call_id": "call_c", "output": "client result"},
            ]),
            json!([
                {"role": "user", "content": "search"},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "call_s", "type": "function", "function": {"name": "search", "arguments": "{\"q\":\"rust\"}"}},
                    {"id": "call_c", "type": "function", "function": {"name": "client_fn", "arguments": "{}"}},
                    {"id": "call_f", "type": "function", "function": {"name": "fetch", "arguments": "{}"}},
                    {"id": "mcp_only", "type": "function", "function": {"name": "fetch", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "call_s", "content": "3 hits"},
                {"role": "tool", "tool_call_id": "call_c", "content": "client result"},
                {"role": "tool", "tool_call_id": "call_f", "content": "{\"error\":{\"message\":\"HTTP 502\"}}"},
                {"role": "tool", "tool_call_id": "mcp_only", "content": "by id"},
            ]),
        ),
        // A passed-through batch: the client answered its own call, the gateway ran the server one later.
        (
            "a function call repeated later as an mcp call is sent once",
            json!([
                {"type": "message", "role": "user", "content": "go"},
                {"type": "function_call", "id": "fc_1", "call_id": "call_s", "name": "search", "arguments": "{}"},
                {"type": "function_call", "id": "fc_2", "call_id": "call_c", "name": "client_fn", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "call_c", "output": "C"},
                {"type": "mcp_call", "id": "mcp_1", "call_id": "call_s", "server_label": "gateway", "name": "search",
                 "arguments": "{}", "output": "S", "error": null, "status": "completed"},
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "done"}]},
            ]),
            json!([
                {"role": "user", "content": "go"},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "call_s", "type": "function", "function": {"name": "search", "arguments": "{}"}},
                    {"id": "call_c", "type": "function", "function": {"name": "client_fn", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "call_s", "content": "S"},
                {"role": "tool", "tool_call_id": "call_c", "content": "C"},
                {"role": "assistant", "content": "done"},
            ]),
        ),
        (
            "reasoning items are not sent upstream",
            json!([
                {"type": "message", "role": "user", "content": "hi"},
                {"type": "reasoning", "id": "rs_1", "summary": []},
                {"type": "message", "role": "assistant", "content": "hello"},
            ]),
            json!([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]),
        ),
        (
            "a message of nothing Chat takes is left out, not sent empty",
            json!([
                {"type": "message", "role": "user", "content": [{"type": "input_file", "file_url": "https://x/b.pdf"}]},
                {"type": "message", "role": "user", "content": "what does it say?"},
            ]),
            json!([{"role": "user", "content": "what does it say?"}]),
        ),
        (
            "a tool's output of parts reaches Chat as its text",
            json!([
                {"type": "function_call", "call_id": "call_p", "name": "shot", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "call_p", "output": [
                    {"type": "input_text", "text": "the page"},
                    {"type": "input_image", "image_url": "data:image/png;base64,iVBOR"}]},
            ]),
            json!([
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "call_p", "type": "function", "function": {"name": "shot", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "call_p", "content": "the page"},
            ]),
        ),
    ];
    for (name, conversation, messages) in rows {
        assert_eq!(messages_of(conversation), messages, "{name}");
    }
}

#[test]
fn every_assistant_tool_call_is_answered_right_after_it() {
    // Conversations as clients replay them: interleaved outputs, duplicates, unanswered (interrupted) calls.
    let conversations = [
        json!([
            {"type": "function_call", "call_id": "a", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "a", "output": "A"},
            {"type": "function_call", "call_id": "b", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "b", "output": "B"},
        ]),
        json!([
            {"type": "message", "role": "assistant", "content": "x"},
            {"type": "function_call", "call_id": "a", "name": "f", "arguments": "{}"},
            {"type": "mcp_call", "call_id": "b", "name": "s", "arguments": "{}", "output": "B"},
            {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c", "output": "C"},
            {"type": "message", "role": "user", "content": "y"},
            {"type": "function_call_output", "call_id": "a", "output": "A"},
            {"type": "mcp_call", "call_id": "a", "name": "f", "arguments": "{}", "output": "A again"},
        ]),
        json!([
            {"type": "function_call", "call_id": "lost", "name": "f", "arguments": "{}"},
            {"type": "message", "role": "user", "content": "never mind"},
        ]),
    ];
    for conversation in conversations {
        let messages = messages_of(conversation.clone());
        let messages = messages.as_array().unwrap();
        let mut answered = 0;
        for (index, message) in messages.iter().enumerate() {
            let Some(calls) = message.get("tool_calls").and_then(Value::as_array) else {
                continue;
            };
            let ids: Vec<&Value> = calls.iter().map(|c| &c["id"]).collect();
            let following: Vec<&Value> = messages[index + 1..]
                .iter()
                .take_while(|m| m["role"] == "tool")
                .map(|m| &m["tool_call_id"])
                .collect();
            assert_eq!(ids, following, "in {conversation}");
            answered += ids.len();
        }
        let tool_messages = messages.iter().filter(|m| m["role"] == "tool").count();
        assert_eq!(
            answered, tool_messages,
            "a tool message without its call in {conversation}"
        );
    }
}

#[test]
fn steps_of_a_running_response_pair_with_their_calls_in_the_next_request() {
    let context = items(json!([{"type": "message", "role": "user", "content": "both please"}]));
    let model = ModelOutput {
        reasoning: Vec::new(),
        message: Some(AssistantMessage {
            item_id: "msg_1".into(),
            text: "On it.".into(),
            deltas: Vec::new(),
        }),
        tool_calls: vec![
            call("fc_1", "call_1", "search", "{\"q\":1}"),
            call("fc_2", "call_2", "fetch", "{}"),
        ],
        usage: None,
        finish: Finish::ToolCalls,
    };
    let tool_step = |seq: u32, call: ToolCall, outcome: ToolOutcome| {
        let state = if outcome.is_error() {
            StepState::Failed
        } else {
            StepState::Succeeded
        };
        crate::test_support::tool_step(
            seq,
            state,
            format!("mcp_{seq}"),
            call,
            Some(0),
            Some(outcome),
        )
    };
    let steps = vec![
        Step {
            seq: 0,
            state: StepState::Succeeded,
            body: StepBody::Model(ModelStep {
                deployment: None,
                output: Some(model.clone()),
                failure: None,
            }),
        },
        // Recorded in the other order: pairing is by call_id.
        tool_step(
            1,
            model.tool_calls[1].clone(),
            ToolOutcome::error("timeout"),
        ),
        tool_step(
            2,
            model.tool_calls[0].clone(),
            ToolOutcome::Output {
                text: "found".into(),
            },
        ),
    ];
    let body = build_request(
        "m",
        &model_input(&params(), &model_conversation(&context, &steps), &[]),
    );
    assert_eq!(
        body["messages"],
        json!([
            {"role": "user", "content": "both please"},
            {"role": "assistant", "content": "On it.", "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "search", "arguments": "{\"q\":1}"}},
                {"id": "call_2", "type": "function", "function": {"name": "fetch", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "found"},
            {"role": "tool", "tool_call_id": "call_2", "content": "{\"error\":{\"message\":\"timeout\"}}"},
        ])
    );
}

// ---- build_request: tools and options ------------------------------------------------------------

/// A strict function tool with a description and a schema.
fn strict_weather_tool() -> OfferedTool {
    tool(
        "get_weather",
        Some("Weather by city"),
        Some(json!({"type": "object", "properties": {"city": {"type": "string"}}})),
        Some(true),
    )
}

#[test]
fn tools_map_to_chat_functions() {
    let tools = [
        strict_weather_tool(),
        tool("no_params", Some(""), None, None),
        tool("null_params", None, Some(Value::Null), Some(false)),
    ];
    let mut p = params();
    p.parallel_tool_calls = false;
    let body = build_request(
        "m",
        &model_input(
            &p,
            &items(json!([{"type": "message", "role": "user", "content": "x"}])),
            &tools,
        ),
    );
    assert_eq!(
        body,
        json!({
            "model": "m",
            "messages": [{"role": "user", "content": "x"}],
            "tools": [
                {"type": "function", "function": {"name": "get_weather", "description": "Weather by city",
                    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}, "strict": true}},
                {"type": "function", "function": {"name": "no_params", "parameters": {"type": "object", "properties": {}}}},
                {"type": "function", "function": {"name": "null_params", "parameters": {"type": "object", "properties": {}}, "strict": false}},
            ],
            "tool_choice": "auto",
            "parallel_tool_calls": false,
        })
    );
}

#[test]
fn the_body_as_sent_reads_back_as_the_request_built() {
    let custom = OfferedTool {
        name: "patch".into(),
        description: Some("Applies a patch".into()),
        input: ToolInput::Text {
            format: Some(json!({"type": "grammar", "syntax": "lark", "definition": "start: /.+/"})),
        },
    };
    let tools = [
        strict_weather_tool(),
        tool("no_params", Some(""), None, None),
        custom,
    ];
    let conversation = items(json!([{"type": "message", "role": "user", "content": "x"}]));
    let p = params();
    let input = model_input(&p, &conversation, &tools);

    let sent = serde_json::to_vec(&build_chat_request("m", &input)).expect("serialises");

    let read_back: Value = serde_json::from_slice(&sent).expect("JSON");
    let built = build_request("m", &input);
    assert_eq!(read_back, built);
    assert_eq!(built["tools"].as_array().map(Vec::len), Some(3), "{built}");
    assert_eq!(
        built["tools"][2]["function"]["parameters"]["required"],
        json!(["input"]),
        "the custom tool is a function of one string: {built}"
    );
}

#[test]
fn without_tools_no_tool_fields_are_sent() {
    let mut p = params();
    p.tool_choice = json!("required");
    let body = build_request("m", &model_input(&p, &[Item::user_text("x")], &[]));
    for key in ["tools", "tool_choice", "parallel_tool_calls"] {
        assert!(body.get(key).is_none(), "{key} sent without tools: {body}");
    }
}

#[test]
fn tool_choice_maps_to_its_chat_form() {
    let cases = [
        (json!("auto"), json!("auto")),
        (json!("none"), json!("none")),
        (json!("required"), json!("required")),
        (
            json!({"type": "function", "name": "get_weather"}),
            json!({"type": "function", "function": {"name": "get_weather"}}),
        ),
        (
            json!({"type": "allowed_tools", "mode": "required", "tools": [{"type": "function", "name": "get_weather"}]}),
            json!("required"),
        ),
        (
            json!({"type": "allowed_tools", "mode": "auto", "tools": []}),
            json!("auto"),
        ),
        (json!({"type": "allowed_tools", "tools": []}), json!("auto")),
    ];
    for (choice, expected) in cases {
        let mut p = params();
        p.tool_choice = choice.clone();
        let body = build_request(
            "m",
            &model_input(&p, &[Item::user_text("x")], &[weather_tool()]),
        );
        assert_eq!(body["tool_choice"], expected, "tool_choice {choice}");
    }
}

#[test]
fn text_format_maps_to_response_format() {
    let schema =
        json!({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]});
    let cases = [
        (json!({"format": {"type": "text"}}), None),
        (json!({}), None),
        (
            json!({"format": {"type": "json_object"}}),
            Some(json!({"type": "json_object"})),
        ),
        (
            json!({"format": {"type": "json_schema", "name": "answer", "schema": schema, "strict": true, "description": "An answer"}}),
            Some(
                json!({"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": true, "description": "An answer"}}),
            ),
        ),
        (
            json!({"format": {"type": "json_schema", "name": "answer", "schema": schema}}),
            Some(
                json!({"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}),
            ),
        ),
    ];
    for (text, expected) in cases {
        let mut p = params();
        p.text = text.clone();
        let body = build_request("m", &model_input(&p, &[Item::user_text("x")], &[]));
        assert_eq!(
            body.get("response_format").cloned(),
            expected,
            "text {text}"
        );
    }
}

#[test]
fn sampling_and_length_options_are_carried_over() {
    let mut p = params();
    p.max_output_tokens = Some(256);
    p.temperature = Some(0.5);
    p.top_p = Some(0.25);
    p.reasoning = Some(json!({"effort": "low", "summary": "auto"}));
    p.max_tool_calls = Some(3);
    p.metadata.insert("k".into(), "v".into());
    p.user = Some("u".into());
    let body = build_request("m", &model_input(&p, &[Item::user_text("x")], &[]));
    assert_eq!(
        body,
        json!({
            "model": "m",
            "messages": [{"role": "user", "content": "x"}],
            "max_tokens": 256,
            "temperature": 0.5,
            "top_p": 0.25,
            "reasoning_effort": "low",
            "user": "u",
        }),
        "metadata and max_tool_calls stay with the gateway"
    );
}

#[test]
fn reasoning_without_a_string_effort_sends_no_reasoning_effort() {
    for reasoning in [json!({"summary": "auto"}), json!({"effort": null})] {
        let mut p = params();
        p.reasoning = Some(reasoning.clone());
        let body = build_request("m", &model_input(&p, &[Item::user_text("x")], &[]));
        assert!(
            body.get("reasoning_effort").is_none(),
            "{reasoning}: {body}"
        );
    }
}

// ---- parse_response ------------------------------------------------------------------------------

#[test]
fn a_text_answer_becomes_a_message() {
    let output = parse(json!({
        "id": "chatcmpl-1", "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello!"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15},
    }))
    .unwrap();
    assert_eq!(
        output,
        ModelOutput {
            reasoning: Vec::new(),
            message: Some(AssistantMessage {
                item_id: "msg_1".into(),
                text: "Hello!".into(),
                deltas: Vec::new(),
            }),
            tool_calls: Vec::new(),
            usage: Some(Usage {
                input_tokens: 12,
                output_tokens: 3,
                cached_tokens: 0,
                reasoning_tokens: 0
            }),
            finish: Finish::Stop,
        }
    );
}

#[test]
fn content_given_as_parts_is_joined() {
    let output = parse(json!({"choices": [{"message": {"role": "assistant",
        "content": [{"type": "text", "text": "Hel"}, {"type": "text", "text": "lo"}]}, "finish_reason": "stop"}]}))
    .unwrap();
    assert_eq!(output.message.map(|m| m.text).as_deref(), Some("Hello"));
}

#[test]
fn empty_or_null_content_gives_no_message() {
    for content in [json!(""), Value::Null] {
        let output = parse(json!({"choices": [{"message": {"role": "assistant", "content": content}, "finish_reason": "stop"}]})).unwrap();
        assert_eq!(output.message, None, "content {content}");
    }
}

#[test]
fn tool_calls_with_null_content_are_read_with_their_ids() {
    let mut ids = CountingIds::default();
    let output = parse_response(
        &json!({"choices": [{"index": 0, "message": {"role": "assistant", "content": null, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"SF\"}"}},
            {"id": "call_2", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}]},
            "finish_reason": "tool_calls"}],
            "usage": {"prompt_tokens": 40, "completion_tokens": 20, "total_tokens": 60}}),
        &mut ids,
    )
    .unwrap();
    assert_eq!(
        output,
        ModelOutput {
            reasoning: Vec::new(),
            message: None,
            tool_calls: vec![
                call("fc_1", "call_1", "get_weather", "{\"city\":\"SF\"}"),
                call("fc_2", "call_2", "get_time", "{}"),
            ],
            usage: Some(Usage {
                input_tokens: 40,
                output_tokens: 20,
                cached_tokens: 0,
                reasoning_tokens: 0
            }),
            finish: Finish::ToolCalls,
        }
    );
    assert!(
        ids.call_id_requests.is_empty(),
        "ids were synthesised for calls that had one"
    );
}

#[test]
fn missing_or_empty_call_ids_are_synthesised_stably_per_index() {
    let body = answer_with_calls(
        json!([
            {"type": "function", "function": {"name": "a", "arguments": "{}"}},
            {"id": "call_kept", "type": "function", "function": {"name": "b", "arguments": "{}"}},
            {"id": "", "type": "function", "function": {"name": "c", "arguments": "{}"}},
            {"id": null, "type": "function", "function": {"name": "d", "arguments": "{}"}},
        ]),
        "tool_calls",
    );
    let mut ids = CountingIds::default();
    let output = parse_response(&body, &mut ids).unwrap();
    let call_ids: Vec<&str> = output
        .tool_calls
        .iter()
        .map(|c| c.call_id.as_str())
        .collect();
    assert_eq!(
        call_ids,
        ["call_synth0", "call_kept", "call_synth2", "call_synth3"]
    );
    assert_eq!(ids.call_id_requests, [0, 2, 3]);
    let item_ids: Vec<&str> = output
        .tool_calls
        .iter()
        .map(|c| c.item_id.as_str())
        .collect();
    assert_eq!(item_ids, ["fc_1", "fc_2", "fc_3", "fc_4"]);

    // The same answer read again (a resumed call) gets the same call ids.
    let again = parse_response(&body, &mut CountingIds::default()).unwrap();
    assert_eq!(again.tool_calls, output.tool_calls);
}

#[test]
fn arguments_are_normalised_to_a_json_string() {
    let cases = [
        (json!("{\"city\":\"SF\"}"), "{\"city\":\"SF\"}"),
        (
            json!({"city": "SF", "days": 2}),
            "{\"city\":\"SF\",\"days\":2}",
        ),
        (json!({}), "{}"),
        (json!(""), "{}"),
        (json!("   "), "{}"),
        (Value::Null, "{}"),
    ];
    for (arguments, expected) in cases {
        let body = answer_with_calls(
            json!([{"id": "c", "type": "function", "function": {"name": "f", "arguments": arguments}}]),
            "tool_calls",
        );
        let output = parse(body).unwrap();
        assert_eq!(
            output.tool_calls[0].arguments, expected,
            "arguments {arguments}"
        );
    }
    let missing = answer_with_calls(
        json!([{"id": "c", "type": "function", "function": {"name": "f"}}]),
        "tool_calls",
    );
    assert_eq!(parse(missing).unwrap().tool_calls[0].arguments, "{}");
}

#[test]
fn an_answer_read_as_sent_takes_any_shape_as_a_tree_would() {
    let text = |body: &str| {
        parse_text(body)
            .unwrap()
            .message
            .map(|m| m.text)
            .unwrap_or_default()
    };
    // Fields of other types, other choices and unknown fields (nested deeply) are skipped.
    assert_eq!(
        text(
            r#"{"id": 7, "extra": {"a": [1, {"b": [null, true, 2.5, "x"]}]}, "choices": [
                {"message": {"content": "first", "role": ["odd"]}, "finish_reason": 3, "logprobs": {"c": []}},
                {"message": {"content": "second"}}]}"#
        ),
        "first"
    );
    // A key given twice keeps its last value; an escaped key is the key it spells.
    assert_eq!(
        text(r#"{"choices": [{"message": {"content": "old", "cont\u0065nt": "new"}}]}"#),
        "new"
    );
    assert_eq!(
        text(r#"{"choices": "none", "choices": [{"message": {"content": "kept"}}]}"#),
        "kept"
    );
    // A message that is not an object is an empty one; tool calls that are not an array are none.
    for message in [
        "null",
        "\"hi\"",
        "[1, 2]",
        "{\"tool_calls\": {\"id\": \"c\"}}",
    ] {
        let output = parse_text(&format!(r#"{{"choices": [{{"message": {message}}}]}}"#)).unwrap();
        assert_eq!(
            (output.message, output.tool_calls.len()),
            (None, 0),
            "{message}"
        );
    }
    // A call that is not an object has no function name.
    assert_eq!(
        parse_text(r#"{"choices": [{"message": {"tool_calls": [7]}}]}"#)
            .unwrap_err()
            .to_string(),
        "unreadable upstream answer: tool call 0 has no function name"
    );
    // A body that is not an answer, and one that is not JSON.
    for body in [
        "[]",
        "{}",
        r#"{"choices": []}"#,
        r#"{"choices": {"0": {}}}"#,
        r#"{"choices": [{}]}"#,
    ] {
        assert!(
            matches!(parse_text(body), Err(AnswerError::Shape(_))),
            "{body}"
        );
    }
    assert!(
        matches!(parse_text(r#"{"choices": [{"message": {"content": "cut"#), Err(AnswerError::Json(e)) if e.is_eof())
    );
    assert!(
        matches!(parse_text(r#"{"choices": [] } trailing"#), Err(AnswerError::Json(e)) if !e.is_eof())
    );
}

#[test]
fn finish_reason_stop_with_tool_calls_still_returns_the_calls() {
    let body = json!({"choices": [{"message": {"role": "assistant", "content": "Let me look.", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "search", "arguments": "{}"}}]}, "finish_reason": "stop"}]});
    let output = parse(body).unwrap();
    assert_eq!(
        output.tool_calls,
        vec![call("fc_1", "call_1", "search", "{}")]
    );
    assert_eq!(
        output.message,
        Some(AssistantMessage {
            item_id: "msg_2".into(),
            text: "Let me look.".into(),
            deltas: Vec::new(),
        })
    );
    assert_eq!(output.finish, Finish::Stop);
}

#[test]
fn finish_reasons_are_normalised() {
    let cases = [
        (json!("stop"), Finish::Stop),
        (json!("length"), Finish::Length),
        (json!("content_filter"), Finish::ContentFilter),
        (json!("tool_calls"), Finish::ToolCalls),
        (json!("function_call"), Finish::ToolCalls),
        (json!("eos"), Finish::Stop),
        (Value::Null, Finish::Stop),
    ];
    for (reason, expected) in cases {
        let body = json!({"choices": [{"message": {"role": "assistant", "content": "x"}, "finish_reason": reason}]});
        assert_eq!(
            parse(body).unwrap().finish,
            expected,
            "finish_reason {reason}"
        );
    }
}

#[test]
fn absent_or_null_usage_is_none() {
    for body in [
        json!({"choices": [{"message": {"role": "assistant", "content": "x"}, "finish_reason": "stop"}]}),
        json!({"choices": [{"message": {"role": "assistant", "content": "x"}, "finish_reason": "stop"}], "usage": null}),
    ] {
        assert_eq!(parse(body.clone()).unwrap().usage, None, "{body}");
    }
}

#[test]
fn usage_details_become_cached_and_reasoning_tokens() {
    let body = json!({"choices": [{"message": {"role": "assistant", "content": "x"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 100, "completion_tokens": 50, "total_tokens": 150,
            "prompt_tokens_details": {"cached_tokens": 64}, "completion_tokens_details": {"reasoning_tokens": 30}}});
    assert_eq!(
        parse(body).unwrap().usage,
        Some(Usage {
            input_tokens: 100,
            output_tokens: 50,
            cached_tokens: 64,
            reasoning_tokens: 30
        })
    );
}

#[test]
fn answers_without_a_usable_choice_are_parse_errors() {
    let cases = [
        json!({}),
        json!({"choices": []}),
        json!({"choices": null}),
        json!({"choices": [{"finish_reason": "stop"}]}),
        json!({"error": {"message": "overloaded"}}),
        answer_with_calls(
            json!([{"id": "c", "type": "function", "function": {"name": "", "arguments": "{}"}}]),
            "tool_calls",
        ),
        answer_with_calls(json!([{"id": "c", "type": "function"}]), "tool_calls"),
    ];
    for body in cases {
        assert!(parse(body.clone()).is_err(), "parsed: {body}");
    }
}

#[test]
fn provider_settings_a_client_sets_are_passed_on_in_chats_names() {
    let body: CreateResponseBody = serde_json::from_value(json!({
        "model": "m", "input": "x", "prompt_cache_key": "k1", "safety_identifier": "u-hash",
        "user": "u1", "service_tier": "flex", "top_logprobs": 3, "text": {"verbosity": "low"}
    }))
    .unwrap();
    let request = validate(body).unwrap();
    let sent = build_request("up", &model_input(&request.params, &[], &[]));
    assert_eq!(sent["prompt_cache_key"], "k1");
    assert_eq!(sent["safety_identifier"], "u-hash");
    assert_eq!(sent["user"], "u1");
    assert_eq!(sent["service_tier"], "flex");
    assert_eq!(sent["verbosity"], "low");
    assert_eq!(sent["logprobs"], true);
    assert_eq!(sent["top_logprobs"], 3);

    let plain = build_request("up", &model_input(&params(), &[], &[]));
    for key in [
        "prompt_cache_key",
        "user",
        "service_tier",
        "verbosity",
        "logprobs",
        "top_logprobs",
    ] {
        assert!(
            plain.get(key).is_none(),
            "{key} is not sent unless set: {plain:#}"
        );
    }
}

/// Any JSON a `usage` may hold: the keys read, and others, nested, with values of every type.
fn usage_like() -> impl proptest::strategy::Strategy<Value = Value> {
    use proptest::prelude::*;
    let leaf = prop_oneof![
        any::<u64>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        "[a-z]{0,3}".prop_map(Value::from),
    ];
    let key = prop_oneof![
        Just("prompt_tokens"),
        Just("completion_tokens"),
        Just("prompt_tokens_details"),
        Just("completion_tokens_details"),
        Just("cached_tokens"),
        Just("reasoning_tokens"),
        Just("total_tokens"),
        Just("other"),
    ];
    leaf.prop_recursive(3, 24, 6, move |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..3).prop_map(Value::Array),
            proptest::collection::btree_map(key.clone().prop_map(str::to_owned), inner, 0..6)
                .prop_map(|map| Value::Object(map.into_iter().collect())),
        ]
    })
}

proptest::proptest! {
    /// The usage read from an answer's bytes is the usage `parse_usage` reads from the same JSON as a tree.
    #[test]
    fn a_usage_read_from_the_bytes_is_the_usage_read_from_a_tree(usage in usage_like()) {
        let body = json!({"choices": [{"message": {"content": "x"}}], "usage": usage});
        let read = parse(body).expect("an answer").usage;
        proptest::prop_assert_eq!(read, parse_usage(&usage));
    }
}

#[test]
fn a_usage_key_given_twice_keeps_its_last_value_as_a_tree_would() {
    let text = r#"{"choices":[{"message":{"content":"x"}}],"usage":{"prompt_tokens":3,"prompt_tokens":"x","completion_tokens":2,"completion_tokens_details":{"reasoning_tokens":1},"completion_tokens_details":{"reasoning_tokens":4},"prompt_tokens_details":{"cached_tokens":2}}}"#;
    let usage = parse_text(text).expect("an answer").usage.expect("a usage");
    let tree: Value = serde_json::from_str(text).unwrap();
    assert_eq!(Some(usage), parse_usage(&tree["usage"]));
    assert_eq!(
        (
            usage.input_tokens,
            usage.output_tokens,
            usage.cached_tokens,
            usage.reasoning_tokens
        ),
        (0, 2, 2, 4)
    );
    let not_an_object =
        r#"{"choices":[{"message":{"content":"x"}}],"usage":{"prompt_tokens":3},"usage":null}"#;
    assert_eq!(parse_text(not_an_object).expect("an answer").usage, None);
}
