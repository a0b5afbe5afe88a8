//! `stream: true`: the full Responses event stream across the tool loop. Every stream is checked as a
//! strict client reads it (see `common::sse`), compared with the stored response (`GET`) and with the same
//! script run without streaming.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::common::sse::{
    add_deployment, assert_replay_equals_stream, check_stream, content_type, post_stream,
    read_http_request, summary, Checked, FrameReader, SSE_HEAD,
};
use crate::common::*;
use gateway_e2e::TestGateway;
use gateway_testkit::{Call, MockModel, Reply, StreamMode};
use reqwest::Method;
use serde_json::{json, Value};

fn clock_tool() -> Value {
    json!({
        "type": "function",
        "name": "get_time",
        "description": "The time in a time zone.",
        "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]},
    })
}

/// Streams `body` after queueing `script`; checks the stream, that `GET` answers exactly the response of the
/// terminal event, and that replaying the stored steps gives the very same events.
async fn streamed(
    gw: &TestGateway,
    key: &str,
    body: &Value,
    script: &dyn Fn(&MockModel),
) -> Checked {
    script(&gw.model);
    let checked = check_stream(post_stream(gw, key, body.clone()).await);
    assert_eq!(gw.model.pending(), 0, "the script was not used up");
    let stored = get_response(gw, key, &checked.id()).await;
    assert_eq!(stored.status.as_u16(), 200, "{:#}", stored.body);
    assert_eq!(
        stored.body, checked.terminal,
        "GET differs from the terminal event"
    );
    assert_replay_equals_stream(gw, key, &checked).await;
    checked
}

/// Runs the same request and script without streaming; the client sees the same items and outcome.
async fn assert_same_when_not_streamed(
    gw: &TestGateway,
    key: &str,
    body: &Value,
    script: &dyn Fn(&MockModel),
    checked: &Checked,
) {
    script(&gw.model);
    let plain = create_ok(gw, key, body.clone()).await;
    let streamed = &checked.terminal;
    assert_eq!(
        summary(&plain),
        summary(streamed),
        "{plain:#}\n{streamed:#}"
    );
    for key in [
        "status",
        "output_text",
        "usage",
        "incomplete_details",
        "error",
    ] {
        assert_eq!(plain[key], streamed[key], "{key}");
    }
}

#[tokio::test]
async fn a_streamed_text_answer_is_the_full_event_sequence_and_matches_the_stored_and_non_streamed_response(
) {
    let (gw, tenant) = gateway().await;
    let body = json!({"model": "mock", "input": "say hello", "metadata": {"run": "stream"}});
    let script = |m: &MockModel| m.push(Reply::text("Hello from the gateway, streamed in pieces."));

    let checked = streamed(&gw, &tenant.key, &body, &script).await;

    assert_eq!(
        checked.kinds(),
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
            "response.output_text.delta",
            "response.output_text.delta",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.completed",
        ]
    );
    let message = &checked.items[0];
    assert!(message.id.starts_with("msg_"), "{}", message.id);
    assert_eq!(
        message.deltas("response.output_text.delta"),
        "Hello from the gateway, streamed in pieces."
    );
    let terminal = &checked.terminal;
    assert_eq!(terminal["status"], "completed");
    assert_eq!(
        terminal["output_text"],
        "Hello from the gateway, streamed in pieces."
    );
    assert_eq!(terminal["metadata"], json!({"run": "stream"}));
    assert_eq!(terminal["usage"]["total_tokens"], 15);
    assert!(terminal["completed_at"].is_i64(), "{terminal:#}");
    // The created event already describes the request.
    let created = &checked.events[0]["response"];
    assert_eq!(created["model"], "mock");
    assert_eq!(created["metadata"], json!({"run": "stream"}));
    assert_eq!(created["completed_at"], Value::Null);
    // The gateway asked the upstream for a stream with usage.
    let request = &gw.model.requests()[0];
    assert_eq!(request["stream"], true);
    assert_eq!(request["stream_options"]["include_usage"], true);

    assert_same_when_not_streamed(&gw, &tenant.key, &body, &script, &checked).await;
}

#[tokio::test]
async fn a_streamed_server_tool_shows_an_mcp_call_in_progress_then_completed_then_the_answer() {
    let (gw, tenant) = gateway_with_tools(&["add"]).await;
    let body = json!({"model": "mock", "input": "What is 40 + 2?"});
    let script = |m: &MockModel| {
        m.push(
            Reply::tool_calls(vec![Call::new("add", json!({"a": 40, "b": 2}))]).with_usage(10, 5),
        );
        m.push(Reply::text("The sum is 42.").with_usage(20, 8));
    };

    let checked = streamed(&gw, &tenant.key, &body, &script).await;

    assert_eq!(checked.item_kinds(), ["mcp_call:add", "message"]);
    let mcp = &checked.items[0];
    assert!(mcp.id.starts_with("mcp_"), "{}", mcp.id);
    assert_eq!(mcp.added["name"], "add");
    assert_eq!(
        mcp.added["arguments"], "",
        "arguments follow the added item"
    );
    assert_eq!(
        parse(mcp.done["arguments"].as_str().unwrap()),
        json!({"a": 40, "b": 2})
    );
    assert_eq!(
        parse(mcp.done["output"].as_str().unwrap()),
        json!({"sum": 42})
    );
    // The tool ran between the two model calls: its item ended before the message item began.
    let kinds = checked.kinds();
    let mcp_done = kinds
        .iter()
        .position(|k| *k == "response.mcp_call.completed")
        .unwrap();
    let message_added = kinds
        .iter()
        .rposition(|k| *k == "response.output_item.added")
        .unwrap();
    assert!(mcp_done < message_added, "{kinds:?}");
    assert_eq!(checked.terminal["output_text"], "The sum is 42.");
    assert_eq!(checked.terminal["usage"]["input_tokens"], 30);
    assert_eq!(checked.terminal["usage"]["output_tokens"], 13);
    assert_eq!(gw.tools.calls().len(), 1);

    assert_same_when_not_streamed(&gw, &tenant.key, &body, &script, &checked).await;
}

#[tokio::test]
async fn a_streamed_parallel_batch_shows_one_mcp_call_per_tool_all_started_before_any_ended() {
    let (gw, tenant) = gateway_with_tools(&["barrier"]).await;
    let body = json!({"model": "mock", "input": "meet at the barrier"});
    let script = |m: &MockModel| {
        m.push(Reply::tool_calls(vec![
            Call::new("barrier", json!({"n": 3})),
            Call::new("barrier", json!({"n": 3})),
            Call::new("barrier", json!({"n": 3})),
        ]));
        m.push(Reply::text("All three met."));
    };

    let checked = streamed(&gw, &tenant.key, &body, &script).await;

    let kinds: Vec<&str> = checked.items.iter().map(|t| t.kind.as_str()).collect();
    assert_eq!(kinds, ["mcp_call", "mcp_call", "mcp_call", "message"]);
    for mcp in &checked.items[..3] {
        assert_eq!(mcp.done["status"], "completed", "{:#}", mcp.done);
        assert_eq!(
            parse(mcp.done["output"].as_str().unwrap()),
            json!({"released": true, "n": 3})
        );
    }
    // The batch ran concurrently: all three items were added before the first one ended.
    let events = checked.kinds();
    let last_added = events
        .iter()
        .enumerate()
        .filter(|(i, k)| {
            **k == "response.output_item.added" && checked.events[*i]["item"]["type"] == "mcp_call"
        })
        .map(|(i, _)| i)
        .max()
        .unwrap();
    let first_completed = events
        .iter()
        .position(|k| *k == "response.mcp_call.completed")
        .unwrap();
    assert!(last_added < first_completed, "{events:?}");
    let call_ids: std::collections::BTreeSet<&str> = checked.items[..3]
        .iter()
        .map(|t| t.done["call_id"].as_str().unwrap())
        .collect();
    assert_eq!(call_ids.len(), 3);

    assert_same_when_not_streamed(&gw, &tenant.key, &body, &script, &checked).await;
}

#[tokio::test]
async fn a_streamed_client_tool_call_is_handed_back_as_a_function_call_after_the_text() {
    let (gw, tenant) = gateway().await;
    let body = json!({"model": "mock", "input": "what time is it?", "tools": [clock_tool()]});
    let script = |m: &MockModel| {
        m.push(Reply::text_and_tool_calls(
            "Let me check.",
            vec![Call::new("get_time", json!({"zone": "UTC"}))],
        ))
    };

    let checked = streamed(&gw, &tenant.key, &body, &script).await;

    assert_eq!(checked.item_kinds(), ["message", "function_call:get_time"]);
    let call = &checked.items[1];
    assert!(call.id.starts_with("fc_"), "{}", call.id);
    assert_eq!(call.added["status"], "in_progress");
    assert_eq!(call.added["name"], "get_time");
    assert_eq!(
        parse(&call.deltas("response.function_call_arguments.delta")),
        json!({"zone": "UTC"})
    );
    assert_eq!(
        call.event("response.function_call_arguments.done")["name"],
        "get_time"
    );
    assert_eq!(checked.terminal["status"], "completed");
    assert_eq!(checked.terminal["output_text"], "Let me check.");
    assert!(gw.tools.calls().is_empty());

    assert_same_when_not_streamed(&gw, &tenant.key, &body, &script, &checked).await;
}

#[tokio::test]
async fn a_streamed_mixed_batch_hands_back_every_call_and_the_continuation_streams_the_server_tool_it_runs(
) {
    let (gw, tenant) = gateway_with_tools(&["add"]).await;
    let body = json!({"model": "mock", "input": "add and tell the time", "tools": [clock_tool()]});
    let script = |m: &MockModel| {
        m.push(Reply::tool_calls(vec![
            Call::new("add", json!({"a": 1, "b": 2})),
            Call::new("get_time", json!({"zone": "CET"})),
        ]))
    };

    let checked = streamed(&gw, &tenant.key, &body, &script).await;

    assert_eq!(
        checked.item_kinds(),
        ["function_call:add", "function_call:get_time"],
        "the whole batch is handed back, the registered call too"
    );
    assert!(gw.tools.calls().is_empty(), "no server tool ran");
    assert_same_when_not_streamed(&gw, &tenant.key, &body, &script, &checked).await;

    // The client answers only its own call: the gateway runs `add` now, in the continuation's stream.
    let time_call = checked.items[1].done["call_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let next = json!({
        "model": "mock",
        "previous_response_id": checked.id(),
        "tools": [clock_tool()],
        "input": [{"type": "function_call_output", "call_id": time_call, "output": "12:00"}],
    });
    let continued = streamed(&gw, &tenant.key, &next, &|m: &MockModel| {
        m.push(Reply::text("It is 12:00 and 1 + 2 = 3."))
    })
    .await;

    assert_eq!(continued.item_kinds(), ["mcp_call:add", "message"]);
    assert_eq!(
        parse(continued.items[0].done["output"].as_str().unwrap()),
        json!({"sum": 3})
    );
    assert_eq!(
        continued.terminal["previous_response_id"],
        checked.id().as_str()
    );
    assert_eq!(gw.tools.calls().len(), 1);
    let last = gw.model.requests().pop().unwrap();
    assert_calls_paired(&last);
    assert_eq!(tool_result(&last, &time_call), "12:00");
}

#[tokio::test]
async fn a_failing_tool_streams_as_a_failed_mcp_call_beside_its_completed_sibling() {
    let (gw, tenant) = gateway_with_tools(&["fail", "add"]).await;
    let body = json!({"model": "mock", "input": "try both"});
    let script = |m: &MockModel| {
        m.push(Reply::tool_calls(vec![
            Call::new("fail", json!({})),
            Call::new("add", json!({"a": 2, "b": 2})),
        ]));
        m.push(Reply::text("One failed, one gave 4."));
    };

    let checked = streamed(&gw, &tenant.key, &body, &script).await;

    let by_name = |name: &str| {
        checked
            .items
            .iter()
            .find(|t| t.done["name"] == name)
            .unwrap()
    };
    let failed = by_name("fail");
    assert_eq!(failed.done["status"], "failed");
    assert_eq!(
        failed.done["error"]["type"], "http_error",
        "{:#}",
        failed.done
    );
    assert_eq!(failed.done["error"]["code"], 500);
    assert!(failed.kinds().contains(&"response.mcp_call.failed"));
    let added = by_name("add");
    assert_eq!(added.done["status"], "completed");
    assert_eq!(
        parse(added.done["output"].as_str().unwrap()),
        json!({"sum": 4})
    );
    assert_eq!(checked.items.last().unwrap().kind, "message");
    assert_eq!(checked.terminal["status"], "completed");
    // The model saw both results: the error and the sum.
    let second = &gw.model.requests()[1];
    assert_calls_paired(second);
    let results: Vec<String> = tool_messages(second).into_iter().map(|(_, c)| c).collect();
    assert!(
        results.iter().any(|r| parse(r).get("error").is_some()),
        "{results:?}"
    );
    assert!(
        results.iter().any(|r| parse(r) == json!({"sum": 4})),
        "{results:?}"
    );

    assert_same_when_not_streamed(&gw, &tenant.key, &body, &script, &checked).await;
}

#[tokio::test]
async fn an_upstream_error_mid_stream_is_an_error_event_then_response_failed_with_the_partial_message(
) {
    let (gw, tenant) = gateway().await;
    let body = json!({"model": "mock", "input": "start talking"});

    let checked = streamed(&gw, &tenant.key, &body, &|m: &MockModel| {
        m.push(Reply::text("This answer breaks off").stream_mode(StreamMode::ErrorMidStream))
    })
    .await;

    assert_eq!(checked.terminal_kind(), "response.failed");
    let error = checked.error_event().unwrap();
    assert_eq!(error["error"]["code"], "server_error");
    assert!(
        !error["message"].as_str().unwrap().contains("exploded"),
        "upstream error text is not passed on: {error:#}"
    );
    // The text already streamed stays visible, as an incomplete message, in the stream and the response.
    let [message] = checked.items.as_slice() else {
        panic!("{:#?}", checked.items)
    };
    assert_eq!(message.done["status"], "incomplete");
    let partial = message.deltas("response.output_text.delta");
    assert!(
        !partial.is_empty() && "This answer breaks off".starts_with(&partial),
        "{partial}"
    );
    assert_eq!(checked.terminal["output_text"], partial.as_str());
    // Text had reached the client, so the call was not retried.
    assert_eq!(gw.model.requests().len(), 1);
}

#[tokio::test]
async fn an_upstream_error_after_a_server_tool_keeps_the_mcp_call_and_ends_failed() {
    let (gw, tenant) = gateway_with_tools(&["add"]).await;
    let body = json!({"model": "mock", "input": "add, then explain"});

    let checked = streamed(&gw, &tenant.key, &body, &|m: &MockModel| {
        m.push(Reply::tool_calls(vec![Call::new(
            "add",
            json!({"a": 5, "b": 5}),
        )]));
        m.push(Reply::text("The answer is").stream_mode(StreamMode::ErrorMidStream));
    })
    .await;

    assert_eq!(checked.terminal_kind(), "response.failed");
    let kinds: Vec<&str> = checked.items.iter().map(|t| t.kind.as_str()).collect();
    assert_eq!(kinds, ["mcp_call", "message"]);
    assert_eq!(checked.items[0].done["status"], "completed");
    assert_eq!(checked.items[1].done["status"], "incomplete");
    assert_eq!(
        checked.terminal["usage"]["total_tokens"], 15,
        "the failed call reported no usage"
    );
    assert_eq!(gw.tools.calls().len(), 1);
}

#[tokio::test]
async fn an_upstream_that_answers_500_on_every_attempt_streams_an_error_event_then_response_failed()
{
    let (gw, tenant) = gateway().await;
    let body = json!({"model": "mock", "input": "anyone there?"});

    let checked = streamed(&gw, &tenant.key, &body, &|m: &MockModel| {
        for _ in 0..3 {
            m.push(Reply::error(500, "upstream secret detail"));
        }
    })
    .await;

    assert_eq!(
        checked.kinds(),
        [
            "response.created",
            "response.in_progress",
            "error",
            "response.failed"
        ]
    );
    let error = checked.error_event().unwrap();
    assert_eq!(error["code"], "server_error");
    assert_eq!(error["error"]["code"], "server_error");
    let message = error["message"].as_str().unwrap();
    assert!(message.contains("500"), "{message}");
    assert!(!message.contains("secret"), "{message}");
    assert_eq!(checked.terminal["output"], json!([]));
    assert_eq!(gw.model.requests().len(), 3, "one attempt and two retries");
}

#[tokio::test]
async fn validation_errors_with_stream_true_are_plain_json_errors_not_event_streams() {
    let (gw, tenant) = gateway().await;
    let cases = [
        (
            json!({"model": "mock", "input": "x", "stream": true, "temperature": 3}),
            400,
            Some("temperature"),
            None,
        ),
        (
            json!({"model": "no-such-model", "input": "x", "stream": true}),
            404,
            Some("model"),
            Some("model_not_found"),
        ),
        (
            json!({"model": "mock", "input": "x", "stream": true, "previous_response_id": "resp_nowhere"}),
            400,
            Some("previous_response_id"),
            Some("previous_response_not_found"),
        ),
        (
            json!({"model": "mock", "stream": true,
                   "input": [{"type": "function_call_output", "call_id": "call_nowhere", "output": "1"}]}),
            400,
            Some("input[0]"),
            Some("function_call_output_without_call"),
        ),
    ];
    for (body, status, param, code) in cases {
        let response = gw
            .public(Method::POST, "/responses", &tenant.key)
            .json(&body)
            .send()
            .await
            .unwrap();
        let kind = content_type(&response);
        assert!(kind.starts_with("application/json"), "{body}: {kind}");
        let answer = gateway_e2e::Answer {
            status: response.status(),
            headers: response.headers().clone(),
            body: response.json().await.unwrap(),
        };
        assert_error(&answer, status, param, code);
    }
    assert!(gw.model.requests().is_empty());
    assert_eq!(stored_rows(&gw).await.0, 0, "nothing stored");
}

#[tokio::test]
async fn an_unstored_streamed_response_streams_in_full_and_cannot_be_read_back() {
    let (gw, tenant) = gateway_with_tools(&["add"]).await;
    gw.model.push(Reply::tool_calls(vec![Call::new(
        "add",
        json!({"a": 1, "b": 1}),
    )]));
    gw.model.push(Reply::text("Two."));

    let checked = check_stream(
        post_stream(
            &gw,
            &tenant.key,
            json!({"model": "mock", "input": "1+1", "store": false}),
        )
        .await,
    );

    assert_eq!(checked.terminal["store"], false);
    assert_eq!(checked.item_kinds(), ["mcp_call:add", "message"]);
    assert_eq!(
        get_response(&gw, &tenant.key, &checked.id())
            .await
            .status
            .as_u16(),
        404
    );
    assert_eq!(stored_rows(&gw).await, (0, 0, 0));
}

#[tokio::test]
async fn a_limit_reached_mid_stream_ends_with_response_incomplete_naming_the_limit() {
    let (gw, tenant) = gateway_with_tools(&["add"]).await;
    let body = json!({"model": "mock", "input": "add a lot", "max_tool_calls": 2});
    let script = |m: &MockModel| {
        m.push(Reply::tool_calls(vec![Call::new(
            "add",
            json!({"a": 1, "b": 1}),
        )]));
        m.push(Reply::text_and_tool_calls(
            "Two more.",
            vec![
                Call::new("add", json!({"a": 2, "b": 2})),
                Call::new("add", json!({"a": 3, "b": 3})),
            ],
        ));
    };

    let checked = streamed(&gw, &tenant.key, &body, &script).await;

    assert_eq!(checked.terminal_kind(), "response.incomplete");
    assert_eq!(
        checked.terminal["incomplete_details"]["reason"],
        "max_tool_calls"
    );
    // The batch that would pass the limit is not run, and not shown.
    assert_eq!(checked.item_kinds(), ["mcp_call:add", "message"]);
    assert_eq!(gw.tools.calls().len(), 1);

    assert_same_when_not_streamed(&gw, &tenant.key, &body, &script, &checked).await;
}

#[tokio::test]
async fn a_streamed_server_tool_on_the_embedded_store_matches_its_stored_copy() {
    let (gw, tenant) = embedded_gateway_with_tools(&["add", "fail"]).await;
    let body = json!({"model": "mock", "input": "add on sqlite"});
    let script = |m: &MockModel| {
        m.push(Reply::tool_calls(vec![
            Call::new("add", json!({"a": 4, "b": 5})),
            Call::new("fail", json!({})),
        ]));
        m.push(Reply::text("9, and one failure."));
    };

    let checked = streamed(&gw, &tenant.key, &body, &script).await;

    assert_eq!(checked.terminal["status"], "completed");
    assert_eq!(checked.items.len(), 3);
    assert_eq!(checked.terminal["output_text"], "9, and one failure.");
    assert_same_when_not_streamed(&gw, &tenant.key, &body, &script, &checked).await;
}

/// The stored response `id`, once it is no longer in progress (bounded wait).
async fn terminal_response(gw: &TestGateway, key: &str, id: &str) -> Value {
    for _ in 0..200 {
        let answer = get_response(gw, key, id).await;
        assert_eq!(answer.status.as_u16(), 200, "{:#}", answer.body);
        if answer.body["status"] != "in_progress" {
            return answer.body;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("response {id} stayed in progress");
}

#[tokio::test]
async fn a_client_that_disconnects_mid_stream_leaves_the_response_incomplete_and_the_model_is_not_called_again(
) {
    let (gw, tenant) = gateway_with_tools(&["slow"]).await;
    gw.model.push(Reply::tool_calls(vec![Call::new(
        "slow",
        json!({"ms": 2000}),
    )]));
    gw.model.push(Reply::text("nobody is listening"));

    let response = gw
        .public(Method::POST, "/responses", &tenant.key)
        .json(&json!({"model": "mock", "input": "take your time", "stream": true}))
        .send()
        .await
        .unwrap();
    let mut reader = FrameReader::new(response);
    let seen = reader
        .until(|e| e["type"] == "response.output_item.added" && e["item"]["type"] == "mcp_call")
        .await;
    let id = seen[0]["response"]["id"].as_str().unwrap().to_owned();
    drop(reader);

    let stored = terminal_response(&gw, &tenant.key, &id).await;
    assert_eq!(stored["status"], "incomplete", "{stored:#}");
    assert_eq!(
        stored["incomplete_details"]["reason"],
        "client_disconnected"
    );
    assert_eq!(
        gw.model.requests().len(),
        1,
        "the model was not called after the tool"
    );
    assert_eq!(gw.model.pending(), 1);
    // The tool that was running finished and was recorded; nothing is left in progress.
    let output = stored["output"].as_array().unwrap();
    assert_eq!(output.len(), 1, "{stored:#}");
    assert_eq!(output[0]["type"], "mcp_call");
    assert_eq!(output[0]["status"], "completed");
    let steps = gw.store.load_steps(&tenant.project_id, &id).await.unwrap();
    assert_eq!(steps.len(), 2, "{steps:#?}");
    assert!(steps.iter().all(|s| s.state.is_ended()), "{steps:#?}");
    assert_eq!(stored_statuses(&gw).await, [(id, "incomplete".to_owned())]);
    assert_eq!(gw.tools.calls().len(), 1);
}

/// A Chat Completions upstream that streams text chunk after chunk, counting what it managed to write,
/// until told to stop (or until `cap` chunks): then it ends the stream properly.
struct EndlessUpstream {
    base_url: String,
    written: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
}

const CHUNK_TEXT_LEN: usize = 1024;

fn chunk_text(n: usize) -> String {
    format!("{n:08}{}", "x".repeat(CHUNK_TEXT_LEN - 8))
}

async fn endless_upstream(cap: usize) -> EndlessUpstream {
    use tokio::io::AsyncWriteExt;

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base_url = format!("http://{}/v1", listener.local_addr().unwrap());
    let written = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let (counter, stopped) = (Arc::clone(&written), Arc::clone(&stop));
    tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.unwrap();
        read_http_request(&mut socket).await;
        socket.write_all(SSE_HEAD).await.unwrap();
        let mut n = 0;
        while n < cap && !stopped.load(Ordering::SeqCst) {
            let chunk = json!({"choices": [{"index": 0, "delta": {"content": chunk_text(n)}, "finish_reason": null}]});
            if socket
                .write_all(format!("data: {chunk}\n\n").as_bytes())
                .await
                .is_err()
            {
                return;
            }
            n += 1;
            counter.store(n, Ordering::SeqCst);
        }
        let end = json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]});
        let _ = socket
            .write_all(format!("data: {end}\n\ndata: [DONE]\n\n").as_bytes())
            .await;
        let _ = socket.shutdown().await;
    });
    EndlessUpstream {
        base_url,
        written,
        stop,
    }
}

#[tokio::test]
async fn a_client_that_reads_nothing_holds_back_the_upstream_stream_instead_of_buffering_it() {
    let (gw, tenant) = gateway().await;
    // 64 MiB of text at most: far more than every socket and channel buffer on the way can hold.
    let cap = 64 * 1024;
    let upstream = endless_upstream(cap).await;
    add_deployment(&gw, &tenant.group_id, "endless", &upstream.base_url).await;

    let response = gw
        .public(Method::POST, "/responses", &tenant.key)
        .json(&json!({"model": "endless", "input": "talk forever", "stream": true}))
        .send()
        .await
        .unwrap();
    let mut reader = FrameReader::new(response);
    let mut events = reader
        .until(|e| e["type"] == "response.output_text.delta")
        .await;

    // The client reads nothing more. Wait (bounded) until the upstream can write no more: with
    // backpressure it stalls once the buffers between it and the client are full, far below the cap.
    let mut last = usize::MAX;
    let mut still = 0;
    for _ in 0..400 {
        let now = upstream.written.load(Ordering::SeqCst);
        if now == cap {
            break;
        }
        still = if now == last { still + 1 } else { 0 };
        if still == 10 {
            break;
        }
        last = now;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let stalled_at = upstream.written.load(Ordering::SeqCst);
    assert!(
        stalled_at < cap / 2,
        "the gateway read {stalled_at} of {cap} chunks for a client that read nothing"
    );

    // Let the upstream end; the client then gets every chunk, in order, and the response completes.
    upstream.stop.store(true, Ordering::SeqCst);
    while let Some(event) = reader.next().await {
        events.push(event);
    }
    let checked = check_stream(events);
    assert_eq!(checked.terminal["status"], "completed");
    let written = upstream.written.load(Ordering::SeqCst);
    assert!(written >= stalled_at);
    let text = checked.items[0].deltas("response.output_text.delta");
    assert_eq!(text.len(), written * CHUNK_TEXT_LEN);
    let expected: String = (0..written).map(chunk_text).collect();
    assert!(
        text == expected,
        "the streamed text is not the upstream's chunks in order"
    );
}

#[tokio::test]
async fn progress_notes_stream_as_gateway_tool_note_events_rendered_over_arguments_and_result() {
    let (gw, tenant) = gateway().await;
    gw.attach_tool_with(
        &tenant.group_id,
        "get_weather",
        json!({"note_on_request": "Looking up the weather in {city}{country}",
               "note_on_result": "{result.forecast} in {city}, {result.temperature_c} degrees"}),
    )
    .await;
    let body = json!({"model": "mock", "input": "Weather in Oslo?"});
    let script = |m: &MockModel| {
        m.push(Reply::tool_calls(vec![Call::new(
            "get_weather",
            json!({"city": "Oslo"}),
        )]));
        m.push(Reply::text("Sunny."));
    };

    let checked = streamed(&gw, &tenant.key, &body, &script).await;

    let notes: Vec<&Value> = checked
        .events
        .iter()
        .filter(|e| e["type"] == "gateway:tool_note")
        .collect();
    assert_eq!(notes.len(), 2, "{:#?}", checked.events);
    let mcp = &checked.items[0];
    assert_eq!(notes[0]["item_id"], mcp.id.as_str());
    assert_eq!(notes[0]["phase"], "request");
    assert_eq!(
        notes[0]["label"], "Looking up the weather in Oslo",
        "a missing field renders as nothing"
    );
    assert_eq!(notes[1]["phase"], "result");
    assert_eq!(notes[1]["label"], "sunny in Oslo, 19 degrees");
    assert_eq!(notes[1]["detail"], "completed");
    assert!(notes.iter().all(|n| n["sequence_number"].is_u64()));
    // The notes are for the stream only: the response's items do not carry them.
    assert!(checked.terminal["output"][0].get("label").is_none());
    assert_same_when_not_streamed(&gw, &tenant.key, &body, &script, &checked).await;
}
