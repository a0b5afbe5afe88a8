//! Streamed responses over a streaming upstream that behaves the way real servers do: every chunking of
//! tool calls, missing ids and indices, object arguments, unreliable `finish_reason`, missing usage, and
//! streams that break off. Each stream is checked in full (see `common::sse`).

use crate::common::sse::{
    add_deployment, assert_replay_equals_stream, check_stream, chunk, post_stream, raw_upstream,
    Checked,
};
use crate::common::*;
use gateway_e2e::{Tenant, TestGateway};
use gateway_testkit::{Call, Reply, StreamMode};
use serde_json::{json, Value};

/// Streams a request on `gw` (whose model was scripted by the caller); checks the stream and that
/// `GET` answers the terminal event's response.
async fn stream(gw: &TestGateway, tenant: &Tenant, input: &str) -> Checked {
    let checked =
        check_stream(post_stream(gw, &tenant.key, json!({"model": "mock", "input": input})).await);
    let stored = get_response(gw, &tenant.key, &checked.id()).await;
    assert_eq!(
        stored.body, checked.terminal,
        "GET differs from the terminal event"
    );
    checked
}

/// The `(name, arguments)` of the tool server's calls, in arrival order (sorted: a batch runs concurrently).
fn tool_bodies(gw: &TestGateway) -> Vec<(String, Value)> {
    let mut calls: Vec<(String, Value)> = gw
        .tools
        .calls()
        .into_iter()
        .map(|c| (c.tool, c.body))
        .collect();
    calls.sort_by_key(|(name, body)| format!("{name}{body}"));
    calls
}

/// A batch of two server tools chunked by `mode`, then a text answer: both tools run with their arguments,
/// and their results go back paired with the calls.
async fn two_tools_in(mode: StreamMode) -> (TestGateway, Checked) {
    let (gw, tenant) = gateway_with_tools(&["add", "echo"]).await;
    gw.model.push(
        Reply::tool_calls(vec![
            Call::new("add", json!({"a": 20, "b": 22})),
            Call::new("echo", json!({"text": "hé, \"quoted\"", "n": [1, 2]})),
        ])
        .stream_mode(mode),
    );
    gw.model
        .push(Reply::text("Both tools answered.").stream_mode(mode));

    let checked = stream(&gw, &tenant, "use both tools").await;

    assert_eq!(checked.terminal["status"], "completed", "{mode:?}");
    assert_eq!(
        checked.item_kinds(),
        ["mcp_call:add", "mcp_call:echo", "message"],
        "{mode:?}"
    );
    let output = |i: usize| parse(checked.items[i].done["output"].as_str().unwrap());
    assert_eq!(output(0), json!({"sum": 42}), "{mode:?}");
    assert_eq!(
        output(1),
        json!({"echo": {"text": "hé, \"quoted\"", "n": [1, 2]}}),
        "{mode:?}"
    );
    assert_eq!(
        tool_bodies(&gw),
        [
            ("add".to_owned(), json!({"a": 20, "b": 22})),
            (
                "echo".to_owned(),
                json!({"text": "hé, \"quoted\"", "n": [1, 2]})
            ),
        ],
        "{mode:?}"
    );
    assert_eq!(checked.terminal["output_text"], "Both tools answered.");
    let requests = gw.model.requests();
    assert_eq!(requests.len(), 2, "{mode:?}");
    assert_calls_paired(&requests[1]);
    let calls = assistant_tool_calls(&requests[1]);
    assert_eq!(
        calls.iter().map(|c| parse(&c.2)).collect::<Vec<_>>(),
        [
            json!({"a": 20, "b": 22}),
            json!({"text": "hé, \"quoted\"", "n": [1, 2]})
        ]
    );
    (gw, checked)
}

#[tokio::test]
async fn normal_chunking_runs_both_tools_with_their_arguments() {
    let (_gw, checked) = two_tools_in(StreamMode::Normal).await;
    assert_eq!(checked.terminal["usage"]["total_tokens"], 30);
}

#[tokio::test]
async fn whole_calls_in_one_chunk_run_both_tools_with_their_arguments() {
    two_tools_in(StreamMode::WholeCallsInOneChunk).await;
}

#[tokio::test]
async fn tool_call_deltas_without_an_index_run_both_tools_with_their_arguments() {
    two_tools_in(StreamMode::MissingIndex).await;
}

#[tokio::test]
async fn names_and_arguments_in_separate_deltas_run_both_tools_with_their_arguments() {
    two_tools_in(StreamMode::NameAndArgsSeparate).await;
}

#[tokio::test]
async fn an_upstream_stream_without_a_usage_chunk_counts_zero_usage_for_its_calls() {
    let (_gw, checked) = two_tools_in(StreamMode::NoUsageChunk).await;
    let usage = &checked.terminal["usage"];
    assert_eq!(usage["input_tokens"], 0, "{usage:#}");
    assert_eq!(usage["output_tokens"], 0, "{usage:#}");
    assert_eq!(usage["total_tokens"], 0, "{usage:#}");
}

#[tokio::test]
async fn arguments_sent_as_an_object_are_passed_to_the_tool_and_shown_as_a_json_string() {
    let (gw, tenant) = gateway_with_tools(&["add"]).await;
    gw.model.push(Reply::tool_calls(vec![Call::new(
        "add",
        json!({"a": 1.5, "b": 2}),
    )
    .arguments_as_object()]));
    gw.model.push(Reply::text("3.5"));

    let checked = stream(&gw, &tenant, "add as object").await;

    let mcp = &checked.items[0];
    assert_eq!(
        parse(mcp.done["arguments"].as_str().unwrap()),
        json!({"a": 1.5, "b": 2})
    );
    assert_eq!(
        parse(mcp.done["output"].as_str().unwrap()),
        json!({"sum": 3.5})
    );
    assert_eq!(
        tool_bodies(&gw),
        [("add".to_owned(), json!({"a": 1.5, "b": 2}))]
    );
    let calls = assistant_tool_calls(&gw.model.requests()[1]);
    assert_eq!(parse(&calls[0].2), json!({"a": 1.5, "b": 2}));
}

#[tokio::test]
async fn calls_with_a_missing_or_empty_id_get_distinct_stable_ids_that_pair_with_their_results() {
    let (gw, tenant) = gateway_with_tools(&["add"]).await;
    gw.model.push(
        Reply::tool_calls(vec![
            Call::new("add", json!({"a": 1, "b": 1})).without_id(),
            Call::new("add", json!({"a": 2, "b": 2})).with_empty_id(),
        ])
        .stream_mode(StreamMode::MissingIndex),
    );
    gw.model.push(Reply::text("2 and 4"));

    let checked = stream(&gw, &tenant, "add twice").await;

    let ids: Vec<&str> = checked.items[..2]
        .iter()
        .map(|t| t.done["call_id"].as_str().unwrap())
        .collect();
    assert!(
        ids.iter().all(|id| id.starts_with("call_") && id.len() > 5),
        "{ids:?}"
    );
    assert_ne!(ids[0], ids[1]);
    let outputs: Vec<Value> = checked.items[..2]
        .iter()
        .map(|t| parse(t.done["output"].as_str().unwrap()))
        .collect();
    assert_eq!(outputs, [json!({"sum": 2}), json!({"sum": 4})]);
    // Upstream, each synthesised id pairs the call with its own result.
    let second = &gw.model.requests()[1];
    assert_calls_paired(second);
    assert_eq!(parse(&tool_result(second, ids[0])), json!({"sum": 2}));
    assert_eq!(parse(&tool_result(second, ids[1])), json!({"sum": 4}));
    // The stored steps keep the same ids: a later GET shows them unchanged.
    let stored = get_response(&gw, &tenant.key, &checked.id()).await;
    assert_eq!(stored.body["output"][0]["call_id"], ids[0]);
}

#[tokio::test]
async fn finish_reason_stop_with_tool_calls_still_runs_the_calls() {
    let (gw, tenant) = gateway_with_tools(&["add"]).await;
    gw.model.push(
        Reply::tool_calls(vec![Call::new("add", json!({"a": 3, "b": 4}))])
            .with_finish_reason("stop"),
    );
    gw.model.push(Reply::text("7"));

    let checked = stream(&gw, &tenant, "add despite stop").await;

    assert_eq!(checked.item_kinds(), ["mcp_call:add", "message"]);
    assert_eq!(
        tool_bodies(&gw),
        [("add".to_owned(), json!({"a": 3, "b": 4}))]
    );
    assert_eq!(checked.terminal["output_text"], "7");
}

#[tokio::test]
async fn finish_reason_stop_with_client_tool_calls_still_hands_them_back() {
    let (gw, tenant) = gateway().await;
    gw.model.push(
        Reply::tool_calls(vec![
            Call::new("get_time", json!({"zone": "UTC"})).without_id()
        ])
        .with_finish_reason("stop")
        .stream_mode(StreamMode::NameAndArgsSeparate),
    );
    let tools = json!([{"type": "function", "name": "get_time", "parameters": {"type": "object"}}]);

    let checked = check_stream(
        post_stream(
            &gw,
            &tenant.key,
            json!({"model": "mock", "input": "time?", "tools": tools}),
        )
        .await,
    );

    assert_eq!(checked.item_kinds(), ["function_call:get_time"]);
    let call = &checked.items[0];
    assert_eq!(
        parse(&call.deltas("response.function_call_arguments.delta")),
        json!({"zone": "UTC"})
    );
    assert!(call.done["call_id"].as_str().unwrap().starts_with("call_"));
}

#[tokio::test]
async fn text_streams_as_deltas_in_every_chunking_mode() {
    let (gw, tenant) = gateway().await;
    for mode in [
        StreamMode::Normal,
        StreamMode::WholeCallsInOneChunk,
        StreamMode::MissingIndex,
        StreamMode::NameAndArgsSeparate,
        StreamMode::NoUsageChunk,
    ] {
        gw.model
            .push(Reply::text("Ünïcode text, split — anywhere.").stream_mode(mode));
        let checked = stream(&gw, &tenant, "talk").await;
        assert_eq!(checked.item_kinds(), ["message"], "{mode:?}");
        assert_eq!(
            checked.items[0].deltas("response.output_text.delta"),
            "Ünïcode text, split — anywhere.",
            "{mode:?}"
        );
        let deltas = checked.items[0]
            .kinds()
            .iter()
            .filter(|k| **k == "response.output_text.delta")
            .count();
        assert!(deltas > 1, "{mode:?}: text arrives in pieces, as produced");
    }
}

/// Asserts a stream that failed because of the upstream: a server_error event, then response.failed.
fn assert_failed_upstream(checked: &Checked) {
    assert_eq!(checked.terminal_kind(), "response.failed");
    let error = checked.error_event().unwrap();
    assert_eq!(error["code"], "server_error", "{error:#}");
    assert_eq!(checked.terminal["error"]["code"], "server_error");
    let message = error["message"].as_str().unwrap();
    assert!(
        !message.contains("exploded"),
        "upstream text leaked: {message}"
    );
}

#[tokio::test]
async fn an_upstream_stream_cut_after_some_text_fails_the_response_and_keeps_the_text_seen() {
    let (gw, tenant) = gateway().await;
    gw.model
        .push(Reply::text("Half an answer and then").stream_mode(StreamMode::CutMidStream));

    let checked = stream(&gw, &tenant, "talk").await;

    assert_failed_upstream(&checked);
    assert!(checked.error_event().unwrap()["message"]
        .as_str()
        .unwrap()
        .contains("broke off"));
    let [message] = checked.items.as_slice() else {
        panic!("{:#?}", checked.items)
    };
    assert_eq!(message.done["status"], "incomplete");
    assert!("Half an answer and then"
        .starts_with(message.deltas("response.output_text.delta").as_str()));
    assert_eq!(gw.model.requests().len(), 1, "text was shown, so no retry");
}

#[tokio::test]
async fn an_upstream_stream_cut_before_any_text_is_retried_and_the_tools_run_once() {
    let (gw, tenant) = gateway_with_tools(&["add"]).await;
    let calls = || vec![Call::new("add", json!({"a": 5, "b": 6})).with_id("call_cut")];
    gw.model
        .push(Reply::tool_calls(calls()).stream_mode(StreamMode::CutMidStream));
    gw.model.push(Reply::tool_calls(calls()));
    gw.model.push(Reply::text("11"));

    let checked = stream(&gw, &tenant, "add").await;

    assert_eq!(checked.terminal["status"], "completed");
    assert_eq!(checked.item_kinds(), ["mcp_call:add", "message"]);
    assert_eq!(
        tool_bodies(&gw),
        [("add".to_owned(), json!({"a": 5, "b": 6}))]
    );
    assert_eq!(gw.model.requests().len(), 3);
    assert_eq!(
        gw.model.requests()[0],
        gw.model.requests()[1],
        "the same call, retried"
    );
}

#[tokio::test]
async fn an_upstream_error_chunk_before_any_text_is_retried() {
    let (gw, tenant) = gateway_with_tools(&["add"]).await;
    gw.model.push(
        Reply::tool_calls(vec![Call::new("add", json!({"a": 1, "b": 2}))])
            .stream_mode(StreamMode::ErrorMidStream),
    );
    gw.model.push(Reply::tool_calls(vec![Call::new(
        "add",
        json!({"a": 1, "b": 2}),
    )]));
    gw.model.push(Reply::text("3"));

    let checked = stream(&gw, &tenant, "add").await;

    assert_eq!(checked.terminal["status"], "completed");
    assert_eq!(checked.item_kinds(), ["mcp_call:add", "message"]);
    assert_eq!(gw.tools.calls().len(), 1);
}

#[tokio::test]
async fn an_upstream_error_chunk_on_every_attempt_fails_the_response_after_the_retries() {
    let (gw, tenant) = gateway_with_tools(&["add"]).await;
    for _ in 0..3 {
        gw.model.push(
            Reply::tool_calls(vec![Call::new("add", json!({"a": 1, "b": 2}))])
                .stream_mode(StreamMode::ErrorMidStream),
        );
    }

    let checked = stream(&gw, &tenant, "add").await;

    assert_failed_upstream(&checked);
    assert!(checked.items.is_empty(), "{:#?}", checked.items);
    assert_eq!(checked.terminal["output"], json!([]));
    assert_eq!(gw.model.requests().len(), 3, "one attempt and two retries");
    assert!(gw.tools.calls().is_empty(), "no half-read call was run");
}

#[tokio::test]
async fn an_upstream_error_chunk_after_some_text_fails_at_once() {
    let (gw, tenant) = gateway().await;
    gw.model
        .push(Reply::text("Some text first").stream_mode(StreamMode::ErrorMidStream));
    gw.model.push(Reply::text("never used"));

    let checked = stream(&gw, &tenant, "talk").await;

    assert_failed_upstream(&checked);
    assert_eq!(checked.items.len(), 1);
    assert_eq!(checked.items[0].done["status"], "incomplete");
    assert_eq!(gw.model.requests().len(), 1);
    assert_eq!(gw.model.pending(), 1);
}

#[tokio::test]
async fn an_upstream_500_then_a_good_stream_is_retried_transparently() {
    let (gw, tenant) = gateway().await;
    gw.model.push(Reply::error(503, "busy"));
    gw.model.push(Reply::text("Second time lucky."));

    let checked = stream(&gw, &tenant, "talk").await;

    assert_eq!(checked.terminal["status"], "completed");
    assert_eq!(checked.terminal["output_text"], "Second time lucky.");
    assert_eq!(gw.model.requests().len(), 2);
}

#[tokio::test]
async fn a_truncated_streamed_answer_ends_incomplete_with_max_output_tokens() {
    let (gw, tenant) = gateway().await;
    gw.model
        .push(Reply::text("cut sho").with_finish_reason("length"));

    let checked = stream(&gw, &tenant, "talk").await;

    assert_eq!(checked.terminal_kind(), "response.incomplete");
    assert_eq!(
        checked.terminal["incomplete_details"]["reason"],
        "max_output_tokens"
    );
    assert_eq!(
        checked.items[0].deltas("response.output_text.delta"),
        "cut sho"
    );
}

/// A complete streamed answer calling `add` with `{"a": 2, "b": 5}`, as raw SSE.
fn add_call_stream(finish: bool, done: bool) -> String {
    let mut body = chunk(
        json!({"role": "assistant", "tool_calls": [{"index": 0, "id": "call_raw", "type": "function",
            "function": {"name": "add", "arguments": "{\"a\": 2, \"b\": 5}"}}]}),
        None,
    );
    if finish {
        body.push_str(&chunk(json!({}), Some("tool_calls")));
    }
    if done {
        body.push_str("data: [DONE]\n\n");
    }
    body
}

#[tokio::test]
async fn an_upstream_body_that_ends_cleanly_before_any_finish_reason_is_broken_and_retried() {
    let (gw, tenant) = gateway_with_tools(&["add"]).await;
    let (base_url, served) = raw_upstream(vec![
        // Closed cleanly after the call, but before the answer said it was finished.
        add_call_stream(false, false),
        add_call_stream(true, true),
        chunk(json!({"content": "Seven."}), None)
            + &chunk(json!({}), Some("stop"))
            + "data: [DONE]\n\n",
    ])
    .await;
    add_deployment(&gw, &tenant.group_id, "raw", &base_url).await;

    let checked =
        check_stream(post_stream(&gw, &tenant.key, json!({"model": "raw", "input": "add"})).await);

    assert_eq!(
        checked.terminal["status"], "completed",
        "{:#}",
        checked.terminal
    );
    assert_eq!(checked.item_kinds(), ["mcp_call:add", "message"]);
    assert_replay_equals_stream(&gw, &tenant.key, &checked).await;
    assert_eq!(
        tool_bodies(&gw),
        [("add".to_owned(), json!({"a": 2, "b": 5}))]
    );
    assert_eq!(served.load(std::sync::atomic::Ordering::SeqCst), 3);
}

#[tokio::test]
async fn an_upstream_body_that_ends_cleanly_mid_text_fails_the_stream_with_the_text_seen() {
    let (gw, tenant) = gateway().await;
    let (base_url, _) = raw_upstream(vec![
        chunk(json!({"role": "assistant", "content": "Cut mid"}), None),
        chunk(json!({"content": "never asked"}), Some("stop")),
    ])
    .await;
    add_deployment(&gw, &tenant.group_id, "raw", &base_url).await;

    let checked =
        check_stream(post_stream(&gw, &tenant.key, json!({"model": "raw", "input": "talk"})).await);

    assert_failed_upstream(&checked);
    assert_eq!(checked.items.len(), 1);
    assert_eq!(checked.items[0].done["status"], "incomplete");
    assert_eq!(checked.terminal["output_text"], "Cut mid");
    assert_replay_equals_stream(&gw, &tenant.key, &checked).await;
}

#[tokio::test]
async fn an_upstream_body_without_done_but_with_a_finish_reason_is_complete() {
    let (gw, tenant) = gateway().await;
    let (base_url, _) = raw_upstream(vec![
        chunk(json!({"role": "assistant", "content": "No DONE, "}), None)
            + &chunk(json!({"content": "still whole."}), Some("stop")),
    ])
    .await;
    add_deployment(&gw, &tenant.group_id, "raw", &base_url).await;

    let checked =
        check_stream(post_stream(&gw, &tenant.key, json!({"model": "raw", "input": "talk"})).await);

    assert_eq!(checked.terminal["status"], "completed");
    assert_eq!(checked.terminal["output_text"], "No DONE, still whole.");
    assert_eq!(
        checked.terminal["usage"]["total_tokens"], 0,
        "no usage reported"
    );
}

#[tokio::test]
async fn an_upstream_that_stalls_past_the_deadline_ends_incomplete_with_the_text_it_showed() {
    let gw = TestGateway::start_with(|c| c.limits.response_deadline_ms = 1_000).await;
    let tenant = gw.tenant("acme").await;
    gw.model
        .push(Reply::text("Half an answer and then").stream_mode(StreamMode::StallMidStream));

    let checked = stream(&gw, &tenant, "talk").await;

    assert_eq!(checked.terminal_kind(), "response.incomplete");
    assert_eq!(
        checked.terminal["incomplete_details"],
        json!({"reason": "deadline"})
    );
    // The reader keeps what it was shown: the message, as it was cut, in the stream and in what is stored.
    let [message] = checked.items.as_slice() else {
        panic!("{:#?}", checked.items)
    };
    assert_eq!(message.done["status"], "incomplete");
    let shown = message.deltas("response.output_text.delta");
    assert!(!shown.is_empty());
    assert!("Half an answer and then".starts_with(shown.as_str()));
    assert_eq!(
        checked.terminal["output"][0]["content"][0]["text"],
        json!(shown),
        "{:#}",
        checked.terminal
    );
}
