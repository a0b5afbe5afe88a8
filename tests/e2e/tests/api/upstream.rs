//! Upstream quirks through the non-streaming Chat Completions adapter, and upstream failures.

use crate::common::*;
use gateway_e2e::items_of;
use gateway_testkit::{Call, Reply};
use serde_json::{json, Value};

#[tokio::test]
async fn tool_calls_without_an_id_or_with_an_empty_id_get_distinct_stable_synthesised_ids() {
    let (gw, tenant) = gateway_with_tools(&["add"]).await;
    gw.model.push(Reply::tool_calls(vec![
        Call::new("add", json!({"a": 1, "b": 1})).without_id(),
        Call::new("add", json!({"a": 2, "b": 2})).with_empty_id(),
    ]));
    gw.model.push(Reply::text("2 and 4"));

    let body = create_ok(
        &gw,
        &tenant.key,
        json!({"model": "mock", "input": "two sums"}),
    )
    .await;

    assert_eq!(body["status"], "completed", "{body:#}");
    let mcp = items_of(&body, "mcp_call");
    assert_eq!(mcp.len(), 2, "{body:#}");
    let by_args = |a: i64| -> String {
        let item = mcp
            .iter()
            .find(|i| parse(i["arguments"].as_str().unwrap_or("{}"))["a"] == a)
            .unwrap_or_else(|| panic!("no mcp_call with a={a}: {body:#}"));
        item["call_id"].as_str().unwrap_or_default().to_owned()
    };
    let missing = by_args(1);
    let empty = by_args(2);
    assert!(!missing.is_empty() && !empty.is_empty(), "{body:#}");
    assert_ne!(missing, empty, "each synthesised id is distinct");

    // The same ids are stored, read back, sent to the tool and to the model.
    let read = get_response(&gw, &tenant.key, &id_of(&body)).await;
    assert_eq!(read.body, body);
    let sent_to_tools: Vec<String> = gw
        .tools
        .calls()
        .iter()
        .map(|c| c.header("x-gateway-call-id").unwrap_or_default().to_owned())
        .collect();
    assert!(
        sent_to_tools.contains(&missing) && sent_to_tools.contains(&empty),
        "{sent_to_tools:?}"
    );
    let requests = gw.model.requests();
    let calls: Vec<String> = assistant_tool_calls(&requests[1])
        .into_iter()
        .map(|c| c.0)
        .collect();
    assert_eq!(calls, [missing.clone(), empty.clone()]);
    assert_eq!(
        parse(&tool_result(&requests[1], &missing)),
        json!({"sum": 2})
    );
    assert_eq!(parse(&tool_result(&requests[1], &empty)), json!({"sum": 4}));
    assert_calls_paired(&requests[1]);
}

#[tokio::test]
async fn a_handed_back_call_without_an_id_gets_one_that_the_client_can_answer() {
    let (gw, tenant) = gateway().await;
    let tools = json!([{"type": "function", "name": "lookup", "parameters": {"type": "object"}}]);
    gw.model.push(Reply::tool_calls(vec![Call::new(
        "lookup",
        json!({"word": "x"}),
    )
    .without_id()]));
    gw.model.push(Reply::text("found it"));
    let first = create_ok(
        &gw,
        &tenant.key,
        json!({"model": "mock", "input": "look up", "tools": tools}),
    )
    .await;
    let call_id = items_of(&first, "function_call")[0]["call_id"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(!call_id.is_empty(), "{first:#}");
    assert_eq!(
        get_response(&gw, &tenant.key, &id_of(&first)).await.body["output"][0]["call_id"],
        call_id.as_str(),
        "the synthesised id is stored"
    );

    let second = create_ok(
        &gw,
        &tenant.key,
        json!({"model": "mock", "previous_response_id": id_of(&first), "tools": tools,
            "input": [{"type": "function_call_output", "call_id": call_id, "output": "x means ten"}]}),
    )
    .await;

    assert_eq!(second["status"], "completed", "{second:#}");
    let requests = gw.model.requests();
    assert_eq!(assistant_tool_calls(&requests[1])[0].0, call_id);
    assert_eq!(tool_result(&requests[1], &call_id), "x means ten");
}

#[tokio::test]
async fn tool_call_arguments_sent_as_an_object_are_passed_on_as_json() {
    let (gw, tenant) = gateway_with_tools(&["add"]).await;
    gw.model.push(Reply::tool_calls(vec![Call::new(
        "add",
        json!({"a": 5, "b": 6}),
    )
    .arguments_as_object()
    .with_id("call_obj")]));
    gw.model.push(Reply::text("11"));

    let body = create_ok(&gw, &tenant.key, json!({"model": "mock", "input": "5+6"})).await;

    assert_eq!(body["status"], "completed", "{body:#}");
    let tool_calls = gw.tools.calls();
    assert_eq!(tool_calls.len(), 1);
    assert_eq!(tool_calls[0].body, json!({"a": 5, "b": 6}));
    let mcp = items_of(&body, "mcp_call");
    assert_eq!(
        parse(mcp[0]["arguments"].as_str().expect("arguments is a string")),
        json!({"a": 5, "b": 6})
    );
    assert_eq!(
        parse(mcp[0]["output"].as_str().unwrap_or("null")),
        json!({"sum": 11})
    );
    let requests = gw.model.requests();
    let calls = assistant_tool_calls(&requests[1]);
    assert_eq!(
        parse(&calls[0].2),
        json!({"a": 5, "b": 6}),
        "the model gets the arguments back as a JSON string"
    );
}

#[tokio::test]
async fn tool_calls_with_finish_reason_stop_are_still_run() {
    let (gw, tenant) = gateway_with_tools(&["add"]).await;
    gw.model.push(
        Reply::tool_calls(vec![
            Call::new("add", json!({"a": 1, "b": 2})).with_id("call_stop")
        ])
        .with_finish_reason("stop"),
    );
    gw.model.push(Reply::text("3"));

    let body = create_ok(&gw, &tenant.key, json!({"model": "mock", "input": "1+2"})).await;

    assert_eq!(body["status"], "completed", "{body:#}");
    assert_eq!(gw.tools.calls().len(), 1);
    assert_eq!(items_of(&body, "mcp_call").len(), 1);
    assert_eq!(body["output_text"], "3");
    assert_eq!(
        parse(&tool_result(&gw.model.requests()[1], "call_stop")),
        json!({"sum": 3})
    );
}

#[tokio::test]
async fn text_before_tool_calls_is_shown_and_sent_back_in_one_assistant_message() {
    let (gw, tenant) = gateway_with_tools(&["add"]).await;
    gw.model.push(Reply::text_and_tool_calls(
        "Let me add.",
        vec![Call::new("add", json!({"a": 1, "b": 1})).with_id("call_t")],
    ));
    gw.model.push(Reply::text("2"));

    let body = create_ok(&gw, &tenant.key, json!({"model": "mock", "input": "1+1"})).await;

    let kinds: Vec<&str> = body["output"]
        .as_array()
        .expect("output")
        .iter()
        .filter_map(|i| i["type"].as_str())
        .collect();
    assert_eq!(
        kinds,
        ["message", "mcp_call", "message"],
        "items in the order they happened: {body:#}"
    );
    let request = &gw.model.requests()[1];
    let assistant: Vec<&Value> = messages(request)
        .iter()
        .filter(|m| m["role"] == "assistant")
        .collect();
    assert_eq!(assistant.len(), 1, "{request:#}");
    assert_eq!(assistant[0]["content"], "Let me add.");
    assert_eq!(assistant[0]["tool_calls"][0]["id"], "call_t");
}

#[tokio::test]
async fn an_upstream_500_is_retried_and_answers_one_response() {
    let (gw, tenant) = gateway().await;
    gw.model.push(Reply::error(500, "temporary"));
    gw.model.push(Reply::text("after a retry"));

    let body = create_ok(&gw, &tenant.key, json!({"model": "mock", "input": "hi"})).await;

    assert_eq!(body["status"], "completed", "{body:#}");
    assert_eq!(body["output_text"], "after a retry");
    assert_eq!(gw.model.requests().len(), 2);
    assert_eq!(
        gw.model.requests()[0],
        gw.model.requests()[1],
        "the retry sends the same request"
    );
    let stored = stored_statuses(&gw).await;
    assert_eq!(stored, [(id_of(&body), "completed".to_owned())]);
}

#[tokio::test]
async fn an_upstream_that_keeps_failing_gives_a_500_server_error_and_a_failed_stored_response() {
    let (gw, tenant) = gateway().await;
    for _ in 0..10 {
        gw.model.push(Reply::error(500, "upstream secret detail"));
    }

    let answer = gw
        .create(&tenant.key, json!({"model": "mock", "input": "hi"}))
        .await;

    assert_error(&answer, 500, None, Some("server_error"));
    assert_eq!(
        answer
            .headers
            .get("x-should-retry")
            .and_then(|v| v.to_str().ok()),
        Some("false")
    );
    let message = answer.error()["message"].as_str().unwrap_or_default();
    assert!(
        !message.contains("upstream secret detail"),
        "upstream text is not returned: {message}"
    );
    let attempts = gw.model.requests().len();
    assert_eq!(attempts, 3, "one attempt and the configured two retries");

    let stored = stored_statuses(&gw).await;
    assert_eq!(stored.len(), 1, "{stored:?}");
    let (id, status) = &stored[0];
    assert_eq!(status, "failed");
    assert!(
        message.contains(id.as_str()),
        "the error names the response: {message}"
    );
    let read = get_response(&gw, &tenant.key, id).await;
    assert_eq!(read.body["status"], "failed", "{:#}", read.body);
    assert_eq!(read.body["error"]["code"], "server_error");
    assert!(read.body["error"]["message"].is_string());
    assert_eq!(read.body["output"], json!([]));
}

#[tokio::test]
async fn an_answer_cut_by_the_length_limit_ends_incomplete_with_max_output_tokens() {
    let (gw, tenant) = gateway().await;
    gw.model
        .push(Reply::text("partial ans").with_finish_reason("length"));

    let body = create_ok(
        &gw,
        &tenant.key,
        json!({"model": "mock", "input": "long story", "max_output_tokens": 16}),
    )
    .await;

    assert_eq!(body["status"], "incomplete", "{body:#}");
    assert_eq!(
        body["incomplete_details"],
        json!({"reason": "max_output_tokens"})
    );
    assert_eq!(body["output_text"], "partial ans");
    assert_eq!(gw.model.requests()[0]["max_tokens"], 16);
}

#[tokio::test]
async fn an_upstream_answer_without_usage_reports_zero_usage() {
    let (gw, tenant) = gateway().await;
    gw.model.push(Reply::text("no usage").without_usage());

    let body = create_ok(&gw, &tenant.key, json!({"model": "mock", "input": "hi"})).await;

    assert_eq!(body["status"], "completed", "{body:#}");
    assert_eq!(body["usage"]["input_tokens"], 0);
    assert_eq!(body["usage"]["output_tokens"], 0);
    assert_eq!(body["usage"]["total_tokens"], 0);
}

#[tokio::test]
async fn a_call_id_the_upstream_reuses_in_a_later_batch_still_pairs_each_call_with_its_own_result()
{
    let (gw, tenant) = gateway_with_tools(&["add"]).await;
    gw.model.push(Reply::tool_calls(vec![Call::new(
        "add",
        json!({"a": 1, "b": 1}),
    )
    .with_id("call_0")]));
    gw.model.push(Reply::tool_calls(vec![Call::new(
        "add",
        json!({"a": 2, "b": 2}),
    )
    .with_id("call_0")]));
    gw.model.push(Reply::text("2 then 4"));

    let body = create_ok(
        &gw,
        &tenant.key,
        json!({"model": "mock", "input": "two rounds"}),
    )
    .await;

    assert_eq!(body["status"], "completed", "{body:#}");
    let mcp = items_of(&body, "mcp_call");
    assert_eq!(mcp.len(), 2, "{body:#}");
    let first_id = mcp[0]["call_id"].as_str().unwrap_or_default().to_owned();
    let second_id = mcp[1]["call_id"].as_str().unwrap_or_default().to_owned();
    assert_ne!(
        first_id, second_id,
        "each call of the response has its own id: {body:#}"
    );
    let last = &gw.model.requests()[2];
    let calls = assistant_tool_calls(last);
    assert_eq!(
        calls.len(),
        2,
        "the model sees both of its calls: {:#}",
        last["messages"]
    );
    assert_eq!(parse(&tool_result(last, &first_id)), json!({"sum": 2}));
    assert_eq!(parse(&tool_result(last, &second_id)), json!({"sum": 4}));
    assert_calls_paired(last);
    assert_eq!(
        get_response(&gw, &tenant.key, &id_of(&body)).await.body,
        body
    );
}

#[tokio::test]
async fn two_calls_of_one_batch_with_the_same_id_each_get_their_own_result() {
    let (gw, tenant) = gateway_with_tools(&["add"]).await;
    gw.model.push(Reply::tool_calls(vec![
        Call::new("add", json!({"a": 1, "b": 1})).with_id("call_dup"),
        Call::new("add", json!({"a": 2, "b": 2})).with_id("call_dup"),
    ]));
    gw.model.push(Reply::text("2 and 4"));

    let body = create_ok(
        &gw,
        &tenant.key,
        json!({"model": "mock", "input": "two sums"}),
    )
    .await;

    assert_eq!(body["status"], "completed", "{body:#}");
    assert_eq!(gw.tools.calls().len(), 2);
    let mcp = items_of(&body, "mcp_call");
    assert_eq!(mcp.len(), 2, "{body:#}");
    let ids: Vec<String> = mcp
        .iter()
        .map(|i| i["call_id"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert_ne!(ids[0], ids[1], "{body:#}");
    let request = &gw.model.requests()[1];
    assert_eq!(
        assistant_tool_calls(request).len(),
        2,
        "{:#}",
        request["messages"]
    );
    assert_eq!(parse(&tool_result(request, &ids[0])), json!({"sum": 2}));
    assert_eq!(parse(&tool_result(request, &ids[1])), json!({"sum": 4}));
    assert_calls_paired(request);
}

#[tokio::test]
async fn a_call_id_reused_from_a_previous_response_is_replaced_so_both_turns_keep_their_results() {
    let (gw, tenant) = gateway_with_tools(&["add"]).await;
    gw.model.push(Reply::tool_calls(vec![Call::new(
        "add",
        json!({"a": 1, "b": 1}),
    )
    .with_id("0")]));
    gw.model.push(Reply::text("2"));
    gw.model.push(Reply::tool_calls(vec![Call::new(
        "add",
        json!({"a": 3, "b": 3}),
    )
    .with_id("0")]));
    gw.model.push(Reply::text("6"));
    let first = create_ok(&gw, &tenant.key, json!({"model": "mock", "input": "1+1"})).await;

    let second = create_ok(
        &gw,
        &tenant.key,
        json!({"model": "mock", "input": "3+3", "previous_response_id": id_of(&first)}),
    )
    .await;

    assert_eq!(
        items_of(&first, "mcp_call")[0]["call_id"],
        "0",
        "a unique id is kept as sent"
    );
    let new_id = items_of(&second, "mcp_call")[0]["call_id"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(!new_id.is_empty() && new_id != "0", "{second:#}");
    let last = &gw.model.requests()[3];
    assert_eq!(
        assistant_tool_calls(last).len(),
        2,
        "{:#}",
        last["messages"]
    );
    assert_eq!(parse(&tool_result(last, "0")), json!({"sum": 2}));
    assert_eq!(parse(&tool_result(last, &new_id)), json!({"sum": 6}));
    assert_calls_paired(last);
}

#[tokio::test]
async fn a_non_streamed_answer_cut_mid_body_is_retried_like_a_connection_error() {
    let (gw, tenant) = gateway().await;
    gw.model
        .push(Reply::text("lost half way").stream_mode(gateway_testkit::StreamMode::CutMidStream));
    gw.model.push(Reply::text("whole this time"));

    let body = create_ok(&gw, &tenant.key, json!({"model": "mock", "input": "hi"})).await;

    assert_eq!(body["status"], "completed", "{body:#}");
    assert_eq!(body["output_text"], "whole this time");
    assert_eq!(
        gw.model.requests().len(),
        2,
        "the cut answer was asked again"
    );
}
