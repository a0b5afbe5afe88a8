//! Tests of the mock model server over real HTTP.

use std::time::{Duration, Instant};

use gateway_testkit::{Call, MockModel, Reply, StreamMode};
use serde_json::{json, Value};

mod common;
use common::{chat, complete, completions, content_type, TestResult};

fn streaming(mut request: Value, include_usage: bool) -> Value {
    request["stream"] = json!(true);
    if include_usage {
        request["stream_options"] = json!({"include_usage": true});
    }
    request
}

/// Posts a streaming request and returns the parsed `data:` payloads (`[DONE]` as a string).
async fn post_stream(model: &MockModel, body: &Value) -> anyhow::Result<Vec<Value>> {
    let response = completions(model).json(body).send().await?;
    assert_eq!(response.status().as_u16(), 200);
    let content_type = content_type(&response);
    assert!(
        content_type.starts_with("text/event-stream"),
        "{content_type}"
    );
    parse_sse(&response.text().await?)
}

fn parse_sse(text: &str) -> anyhow::Result<Vec<Value>> {
    assert!(
        text.ends_with("\n\n"),
        "every frame ends with a blank line: {text:?}"
    );
    text.split("\n\n")
        .filter(|frame| !frame.is_empty())
        .map(|frame| {
            let data = frame
                .strip_prefix("data: ")
                .ok_or_else(|| anyhow::anyhow!("not a data frame: {frame:?}"))?;
            Ok(if data == "[DONE]" {
                json!("[DONE]")
            } else {
                serde_json::from_str(data)?
            })
        })
        .collect()
}

fn delta(chunk: &Value) -> &Value {
    &chunk["choices"][0]["delta"]
}

/// Reassembles streamed tool calls by `index`: (id, name, arguments).
fn assemble_calls(chunks: &[Value]) -> Vec<(Value, String, String)> {
    let mut calls: Vec<(Value, String, String)> = Vec::new();
    for chunk in chunks {
        for tc in delta(chunk)["tool_calls"].as_array().into_iter().flatten() {
            let index = tc["index"].as_u64().unwrap_or(0) as usize;
            if calls.len() <= index {
                calls.resize(index + 1, (Value::Null, String::new(), String::new()));
            }
            let call = &mut calls[index];
            if let Some(id) = tc.get("id") {
                call.0 = id.clone();
            }
            if let Some(name) = tc["function"]["name"].as_str() {
                call.1 = name.to_owned();
            }
            if let Some(args) = tc["function"]["arguments"].as_str() {
                call.2.push_str(args);
            }
        }
    }
    calls
}

fn content_of(chunks: &[Value]) -> String {
    chunks
        .iter()
        .filter_map(|c| delta(c)["content"].as_str())
        .collect()
}

#[tokio::test]
async fn a_scripted_text_reply_is_a_well_formed_chat_completion() -> TestResult {
    let model = MockModel::start().await?;
    model.push(Reply::text("Hello there"));
    let (status, body) = complete(&model, &chat("hi")).await?;
    assert_eq!(status, 200);
    assert!(body["id"]
        .as_str()
        .unwrap_or_default()
        .starts_with("chatcmpl-"));
    assert_eq!(body["object"], "chat.completion");
    assert!(body["created"].is_u64());
    assert_eq!(body["model"], "gpt-test");
    let choice = &body["choices"][0];
    assert_eq!(choice["index"], 0);
    assert_eq!(choice["message"]["role"], "assistant");
    assert_eq!(choice["message"]["content"], "Hello there");
    assert!(choice["message"].get("tool_calls").is_none());
    assert_eq!(choice["finish_reason"], "stop");
    assert_eq!(
        body["usage"],
        json!({"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15})
    );
    assert_eq!(model.requests(), vec![chat("hi")]);
    assert_eq!(model.pending(), 0);
    Ok(())
}

#[tokio::test]
async fn scripted_replies_are_served_in_order_and_rules_answer_once_the_script_is_empty(
) -> TestResult {
    let model = MockModel::start().await?;
    model.push(Reply::text("first"));
    model.push(Reply::text("second"));
    assert_eq!(model.pending(), 2);
    let mut answers = Vec::new();
    for question in ["a", "b", "c"] {
        let (_, body) = complete(&model, &chat(question)).await?;
        answers.push(body["choices"][0]["message"]["content"].clone());
    }
    assert_eq!(
        answers,
        vec![json!("first"), json!("second"), json!("Echo: c")]
    );
    assert_eq!(model.requests().len(), 3);
    Ok(())
}

#[tokio::test]
async fn tool_calls_get_unique_default_ids_and_json_string_arguments() -> TestResult {
    let model = MockModel::start().await?;
    model.push(Reply::tool_calls(vec![
        Call::new("get_weather", json!({"city": "Paris"})),
        Call::new("add", json!({"a": 1, "b": 2})),
    ]));
    model.push(Reply::tool_calls(vec![Call::new("echo", json!({}))]));
    let (_, first) = complete(&model, &chat("x")).await?;
    let (_, second) = complete(&model, &chat("y")).await?;

    let message = &first["choices"][0]["message"];
    assert_eq!(message["content"], Value::Null);
    assert_eq!(first["choices"][0]["finish_reason"], "tool_calls");
    assert_eq!(
        message["tool_calls"],
        json!([
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}},
            {"id": "call_2", "type": "function", "function": {"name": "add", "arguments": "{\"a\":1,\"b\":2}"}},
        ])
    );
    assert_eq!(
        second["choices"][0]["message"]["tool_calls"][0]["id"],
        "call_3"
    );
    Ok(())
}

#[tokio::test]
async fn call_quirks_shape_the_id_and_arguments_as_asked() -> TestResult {
    let model = MockModel::start().await?;
    model.push(Reply::tool_calls(vec![
        Call::new("a", json!({"x": 1})).with_id("my-id"),
        Call::new("b", json!({"x": 2})).without_id(),
        Call::new("c", json!({"x": 3})).with_empty_id(),
        Call::new("d", json!({"x": 4})).arguments_as_object(),
        Call::new("e", json!({"x": 5})).raw_arguments(""),
        Call::new("f", json!({"x": 6})).raw_arguments("{not json"),
    ]));
    let (_, body) = complete(&model, &chat("x")).await?;
    let calls = body["choices"][0]["message"]["tool_calls"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(calls.len(), 6);
    assert_eq!(calls[0]["id"], "my-id");
    assert!(
        calls[1].get("id").is_none(),
        "the id key is omitted: {}",
        calls[1]
    );
    assert_eq!(calls[2]["id"], "");
    assert_eq!(calls[3]["function"]["arguments"], json!({"x": 4}));
    assert_eq!(calls[4]["function"]["arguments"], "");
    assert_eq!(calls[5]["function"]["arguments"], "{not json");
    Ok(())
}

#[tokio::test]
async fn text_with_tool_calls_finish_reason_and_usage_can_be_overridden() -> TestResult {
    let model = MockModel::start().await?;
    model.push(
        Reply::text_and_tool_calls("Let me check.", vec![Call::new("echo", json!({}))])
            .with_finish_reason("stop")
            .with_usage(100, 20),
    );
    model.push(
        Reply::text("cut")
            .with_finish_reason("length")
            .without_usage(),
    );
    let (_, first) = complete(&model, &chat("x")).await?;
    let (_, second) = complete(&model, &chat("y")).await?;
    assert_eq!(first["choices"][0]["message"]["content"], "Let me check.");
    assert_eq!(
        first["choices"][0]["message"]["tool_calls"][0]["function"]["name"],
        "echo"
    );
    assert_eq!(first["choices"][0]["finish_reason"], "stop");
    assert_eq!(
        first["usage"],
        json!({"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120})
    );
    assert_eq!(second["choices"][0]["finish_reason"], "length");
    assert!(second.get("usage").is_none());
    Ok(())
}

#[tokio::test]
async fn an_error_reply_has_its_status_and_an_openai_error_body_even_when_streaming() -> TestResult
{
    let model = MockModel::start().await?;
    model.push(Reply::error(429, "slow down"));
    model.push(Reply::error(503, "overloaded"));
    let (status, body) = complete(&model, &chat("x")).await?;
    assert_eq!(status, 429);
    assert_eq!(
        body,
        json!({"error": {"message": "slow down", "type": "invalid_request_error", "param": null, "code": null}})
    );
    let (status, body) = complete(&model, &streaming(chat("x"), true)).await?;
    assert_eq!(status, 503);
    assert_eq!(body["error"]["message"], "overloaded");
    assert_eq!(body["error"]["type"], "server_error");
    Ok(())
}

#[tokio::test]
async fn a_delayed_reply_is_not_answered_before_its_delay() -> TestResult {
    let model = MockModel::start().await?;
    model.push(Reply::text("late").with_delay(Duration::from_millis(200)));
    let started = Instant::now();
    let (_, body) = complete(&model, &chat("x")).await?;
    assert!(started.elapsed() >= Duration::from_millis(200));
    assert_eq!(body["choices"][0]["message"]["content"], "late");
    Ok(())
}

#[tokio::test]
async fn without_a_script_call_directives_become_tool_calls_when_tools_are_offered() -> TestResult {
    let model = MockModel::start().await?;
    let mut request = chat("please !call get_weather {\"city\": \"Oslo\"} then !call fail");
    request["tools"] =
        json!([{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]);
    let (_, body) = complete(&model, &request).await?;
    let calls = &body["choices"][0]["message"]["tool_calls"];
    assert_eq!(calls[0]["function"]["name"], "get_weather");
    assert_eq!(calls[0]["function"]["arguments"], "{\"city\":\"Oslo\"}");
    assert_eq!(calls[1]["function"]["name"], "fail");
    assert_eq!(calls[1]["function"]["arguments"], "{}");
    assert_eq!(body["choices"][0]["finish_reason"], "tool_calls");

    // Without tools in the request, the directive is just echoed.
    let (_, body) = complete(&model, &chat("!call fail")).await?;
    assert_eq!(body["choices"][0]["message"]["content"], "Echo: !call fail");
    Ok(())
}

#[tokio::test]
async fn without_a_script_the_answer_is_made_from_the_messages() -> TestResult {
    let model = MockModel::start().await?;
    // (what the row shows, the messages, the answer's text)
    let rows = [
        (
            "tool results are summarised",
            json!([
                {"role": "user", "content": "weather?"},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
                ]},
                {"role": "tool", "tool_call_id": "call_1", "content": "{\"forecast\":\"sunny\"}"},
                {"role": "tool", "tool_call_id": "call_2", "content": [{"type": "text", "text": "42"}]},
            ]),
            "Tool results: {\"forecast\":\"sunny\"}; 42",
        ),
        (
            "the last user text is echoed, also from content parts",
            json!([
                {"role": "system", "content": "be nice"},
                {"role": "user", "content": [{"type": "text", "text": "hello parts"}]},
            ]),
            "Echo: hello parts",
        ),
    ];
    for (name, messages, answer) in rows {
        let (_, body) = complete(&model, &json!({"model": "m", "messages": messages})).await?;
        assert_eq!(body["choices"][0]["message"]["content"], answer, "{name}");
    }
    Ok(())
}

#[tokio::test]
async fn request_headers_are_recorded_with_lower_case_names() -> TestResult {
    let model = MockModel::start().await?;
    completions(&model)
        .header("Authorization", "Bearer sk-test")
        .header("X-Custom", "yes")
        .json(&chat("x"))
        .send()
        .await?;
    let headers = model.request_headers();
    assert_eq!(headers.len(), 1);
    assert!(headers[0].contains(&("authorization".to_owned(), "Bearer sk-test".to_owned())));
    assert!(headers[0].contains(&("x-custom".to_owned(), "yes".to_owned())));
    Ok(())
}

#[tokio::test]
async fn a_body_that_is_not_json_is_rejected_and_recorded_as_null() -> TestResult {
    let model = MockModel::start().await?;
    model.push(Reply::text("kept"));
    let response = completions(&model).body("not json").send().await?;
    assert_eq!(response.status().as_u16(), 400);
    assert_eq!(model.requests(), vec![Value::Null]);
    assert_eq!(model.pending(), 1, "the scripted reply is not used up");
    Ok(())
}

#[tokio::test]
async fn the_model_list_names_mock_model_and_unknown_routes_are_json_404s() -> TestResult {
    let model = MockModel::start().await?;
    let client = reqwest::Client::new();
    let list: Value = client
        .get(format!("{}/models", model.base_url()))
        .send()
        .await?
        .json()
        .await?;
    assert_eq!(list["object"], "list");
    assert_eq!(list["data"][0]["id"], "mock-model");
    let response = client
        .get(format!("{}/nope", model.base_url()))
        .send()
        .await?;
    assert_eq!(response.status().as_u16(), 404);
    let body: Value = response.json().await?;
    assert!(body["error"]["message"].is_string());
    Ok(())
}

#[tokio::test]
async fn a_normal_text_stream_has_three_deltas_a_finish_chunk_a_usage_chunk_and_done() -> TestResult
{
    let model = MockModel::start().await?;
    model.push(Reply::text("Hello streaming world"));
    let chunks = post_stream(&model, &streaming(chat("x"), true)).await?;
    assert_eq!(chunks.len(), 6, "{chunks:#?}");
    for chunk in &chunks[..5] {
        assert_eq!(chunk["object"], "chat.completion.chunk");
        assert_eq!(chunk["model"], "gpt-test");
        assert_eq!(chunk["id"], chunks[0]["id"]);
    }
    assert_eq!(delta(&chunks[0])["role"], "assistant");
    assert_eq!(content_of(&chunks), "Hello streaming world");
    for chunk in &chunks[..3] {
        assert_eq!(chunk["choices"][0]["finish_reason"], Value::Null);
        assert!(delta(chunk)["content"].is_string());
    }
    assert_eq!(chunks[3]["choices"][0]["finish_reason"], "stop");
    assert_eq!(delta(&chunks[3]), &json!({}));
    assert_eq!(chunks[4]["choices"], json!([]));
    assert_eq!(
        chunks[4]["usage"],
        json!({"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15})
    );
    assert_eq!(chunks[5], "[DONE]");
    Ok(())
}

#[tokio::test]
async fn a_stream_without_include_usage_has_no_usage_chunk() -> TestResult {
    let model = MockModel::start().await?;
    model.push(Reply::text("Hello"));
    let chunks = post_stream(&model, &streaming(chat("x"), false)).await?;
    assert_eq!(chunks.last(), Some(&json!("[DONE]")));
    assert!(chunks.iter().all(|c| c.get("usage").is_none()));
    assert!(chunks
        .iter()
        .all(|c| c == "[DONE]" || c["choices"] != json!([])));
    Ok(())
}

#[tokio::test]
async fn a_normal_tool_call_stream_sends_a_head_delta_then_argument_fragments() -> TestResult {
    let model = MockModel::start().await?;
    model.push(Reply::tool_calls(vec![
        Call::new("get_weather", json!({"city": "Paris"})),
        Call::new("add", json!({"a": 1, "b": 2})).with_id("call_add"),
    ]));
    let chunks = post_stream(&model, &streaming(chat("x"), true)).await?;
    let head = &delta(&chunks[0])["tool_calls"][0];
    assert_eq!(delta(&chunks[0])["role"], "assistant");
    assert_eq!(
        head,
        &json!({"index": 0, "id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": ""}})
    );
    let fragments: Vec<&Value> = chunks[1..]
        .iter()
        .take_while(|c| delta(c)["tool_calls"][0]["index"] == 0)
        .map(|c| &delta(c)["tool_calls"][0])
        .collect();
    assert!((2..=3).contains(&fragments.len()), "{fragments:#?}");
    for fragment in &fragments {
        assert!(fragment.get("id").is_none());
        assert!(fragment["function"].get("name").is_none());
        assert!(fragment["function"]["arguments"].is_string());
    }
    assert_eq!(
        assemble_calls(&chunks),
        vec![
            (
                json!("call_1"),
                "get_weather".to_owned(),
                "{\"city\":\"Paris\"}".to_owned()
            ),
            (
                json!("call_add"),
                "add".to_owned(),
                "{\"a\":1,\"b\":2}".to_owned()
            ),
        ]
    );
    let finish = &chunks[chunks.len() - 3];
    assert_eq!(finish["choices"][0]["finish_reason"], "tool_calls");
    assert!(chunks[chunks.len() - 2]["usage"].is_object());
    assert_eq!(chunks[chunks.len() - 1], "[DONE]");
    Ok(())
}

#[tokio::test]
async fn text_then_tool_calls_stream_text_deltas_before_the_calls() -> TestResult {
    let model = MockModel::start().await?;
    model.push(Reply::text_and_tool_calls(
        "Checking",
        vec![Call::new("echo", json!({"v": 1})).without_id()],
    ));
    let chunks = post_stream(&model, &streaming(chat("x"), false)).await?;
    assert_eq!(content_of(&chunks), "Checking");
    let first_call = chunks
        .iter()
        .position(|c| delta(c).get("tool_calls").is_some())
        .unwrap_or(0);
    assert!(chunks[..first_call]
        .iter()
        .all(|c| delta(c)["content"].is_string()));
    assert!(delta(&chunks[first_call])["tool_calls"][0]
        .get("id")
        .is_none());
    assert_eq!(
        assemble_calls(&chunks),
        vec![(Value::Null, "echo".to_owned(), "{\"v\":1}".to_owned())]
    );
    Ok(())
}

#[tokio::test]
async fn whole_calls_in_one_chunk_puts_every_complete_call_in_a_single_chunk() -> TestResult {
    let model = MockModel::start().await?;
    model.push(
        Reply::tool_calls(vec![
            Call::new("a", json!({"x": 1})),
            Call::new("b", json!({"y": 2})),
        ])
        .stream_mode(StreamMode::WholeCallsInOneChunk),
    );
    let chunks = post_stream(&model, &streaming(chat("x"), true)).await?;
    let with_calls: Vec<&Value> = chunks
        .iter()
        .filter(|c| delta(c).get("tool_calls").is_some())
        .collect();
    assert_eq!(with_calls.len(), 1);
    assert_eq!(
        delta(with_calls[0])["tool_calls"],
        json!([
            {"index": 0, "id": "call_1", "type": "function", "function": {"name": "a", "arguments": "{\"x\":1}"}},
            {"index": 1, "id": "call_2", "type": "function", "function": {"name": "b", "arguments": "{\"y\":2}"}},
        ])
    );
    assert_eq!(chunks.last(), Some(&json!("[DONE]")));
    Ok(())
}

#[tokio::test]
async fn missing_index_omits_the_index_from_every_tool_call_delta() -> TestResult {
    let model = MockModel::start().await?;
    model.push(
        Reply::tool_calls(vec![Call::new("a", json!({"x": 1}))])
            .stream_mode(StreamMode::MissingIndex),
    );
    let chunks = post_stream(&model, &streaming(chat("x"), true)).await?;
    let deltas: Vec<&Value> = chunks
        .iter()
        .filter_map(|c| delta(c)["tool_calls"].get(0))
        .collect();
    assert!(deltas.len() >= 3, "{deltas:#?}");
    assert!(deltas.iter().all(|d| d.get("index").is_none()));
    assert_eq!(deltas[0]["id"], "call_1");
    assert_eq!(
        assemble_calls(&chunks),
        vec![(json!("call_1"), "a".to_owned(), "{\"x\":1}".to_owned())]
    );
    Ok(())
}

#[tokio::test]
async fn name_and_args_separate_sends_the_name_alone_and_repeats_id_and_name() -> TestResult {
    let model = MockModel::start().await?;
    model.push(
        Reply::tool_calls(vec![Call::new("get_weather", json!({"city": "Rome"}))])
            .stream_mode(StreamMode::NameAndArgsSeparate),
    );
    let chunks = post_stream(&model, &streaming(chat("x"), true)).await?;
    let deltas: Vec<&Value> = chunks
        .iter()
        .filter_map(|c| delta(c)["tool_calls"].get(0))
        .collect();
    assert!(deltas.len() >= 3, "{deltas:#?}");
    assert_eq!(
        deltas[0],
        &json!({"index": 0, "id": "call_1", "type": "function", "function": {"name": "get_weather"}})
    );
    for d in &deltas[1..] {
        assert_eq!(d["id"], "call_1");
        assert_eq!(d["function"]["name"], "get_weather");
        assert!(d["function"]["arguments"].is_string());
    }
    let arguments: String = deltas[1..]
        .iter()
        .filter_map(|d| d["function"]["arguments"].as_str())
        .collect();
    assert_eq!(arguments, "{\"city\":\"Rome\"}");
    Ok(())
}

#[tokio::test]
async fn error_mid_stream_sends_an_error_event_after_the_first_content_chunk_and_no_done(
) -> TestResult {
    let model = MockModel::start().await?;
    model.push(Reply::text("Hello streaming world").stream_mode(StreamMode::ErrorMidStream));
    let chunks = post_stream(&model, &streaming(chat("x"), true)).await?;
    assert_eq!(chunks.len(), 2, "{chunks:#?}");
    assert!(delta(&chunks[0])["content"].is_string());
    assert_eq!(
        chunks[1],
        json!({"error": {"message": "upstream exploded", "type": "server_error"}})
    );
    Ok(())
}

#[tokio::test]
async fn cut_mid_stream_drops_the_connection_after_the_first_chunk() -> TestResult {
    let model = MockModel::start().await?;
    model.push(Reply::text("Hello streaming world").stream_mode(StreamMode::CutMidStream));
    let mut response = completions(&model)
        .json(&streaming(chat("x"), true))
        .send()
        .await?;
    assert_eq!(response.status().as_u16(), 200);
    let mut received = Vec::new();
    let outcome = loop {
        match response.chunk().await {
            Ok(Some(bytes)) => received.extend_from_slice(&bytes),
            Ok(None) => break Ok(()),
            Err(e) => break Err(e),
        }
    };
    assert!(
        outcome.is_err(),
        "the body ends with an error, not a clean end"
    );
    let text = String::from_utf8(received)?;
    let chunks = parse_sse(&text)?;
    assert_eq!(chunks.len(), 1, "{text}");
    assert_eq!(delta(&chunks[0])["role"], "assistant");
    assert!(!text.contains("[DONE]"));
    Ok(())
}

#[tokio::test]
async fn no_usage_chunk_skips_usage_even_when_it_is_requested() -> TestResult {
    let model = MockModel::start().await?;
    model.push(Reply::text("Hello").stream_mode(StreamMode::NoUsageChunk));
    let chunks = post_stream(&model, &streaming(chat("x"), true)).await?;
    assert_eq!(chunks.last(), Some(&json!("[DONE]")));
    assert!(chunks
        .iter()
        .all(|c| c == "[DONE]" || c["choices"] != json!([])));
    assert!(chunks.iter().all(|c| !c["usage"].is_object()));
    assert_eq!(
        chunks[chunks.len() - 2]["choices"][0]["finish_reason"],
        "stop"
    );
    Ok(())
}

#[tokio::test]
async fn rule_based_replies_also_stream() -> TestResult {
    let model = MockModel::start().await?;
    let chunks = post_stream(&model, &streaming(chat("stream me"), true)).await?;
    assert_eq!(content_of(&chunks), "Echo: stream me");
    assert_eq!(chunks.last(), Some(&json!("[DONE]")));
    Ok(())
}

#[tokio::test]
async fn a_mock_keeps_the_latest_requests_it_was_told_to_and_counts_them_all() -> TestResult {
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
    let model = MockModel::start_keeping(addr, 2).await?;
    for text in ["one", "two", "three"] {
        let (status, _) = complete(&model, &chat(text)).await?;
        assert_eq!(status, 200);
    }
    let kept: Vec<Value> = model
        .requests()
        .iter()
        .map(|request| request["messages"][0]["content"].clone())
        .collect();
    assert_eq!(kept, [json!("two"), json!("three")]);
    assert!(model.wait_for_requests(3, Duration::from_secs(5)).await);

    // Keeping none, as the demo does, it still answers.
    let quiet = MockModel::start_keeping(addr, 0).await?;
    let (status, _) = complete(&quiet, &chat("hi")).await?;
    assert_eq!(status, 200);
    assert!(quiet.requests().is_empty());
    Ok(())
}
