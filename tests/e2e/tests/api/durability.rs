//! Background responses, cancel, delete of a running response, re-attaching to a stream, and creates repeated
//! with an `Idempotency-Key` while the first still runs: the durability API in one gateway process (the
//! gateway's `replicas` tests kill and restart real processes).

use std::time::Duration;

use gateway_testkit::mock_model::Call;
use gateway_testkit::{Reply, ToolServer};
use reqwest::Method;
use serde_json::{json, Value};

use crate::common::sse::{assert_replay_equals_stream, check_stream, parse_frames, FrameReader};
use crate::common::*;
use gateway_e2e::{items_of, Tenant, TestGateway};

/// How long a test waits for something that must happen, before it fails.
const PATIENCE: Duration = Duration::from_secs(30);

/// Waits until `n` calls of the testkit's `gate` tool are held.
async fn gate_calls(tools: &ToolServer, n: usize) {
    assert!(
        tools.wait_for_calls("gate", n, PATIENCE).await.is_some(),
        "{n} gate call(s) never arrived"
    );
}

/// A background response of `tenant` calling the `gate` tool; returns the answer to its create.
async fn background_gate_call(gw: &TestGateway, tenant: &Tenant) -> Value {
    create_ok(
        gw,
        &tenant.key,
        json!({"model": "mock", "input": "!call gate {}", "background": true}),
    )
    .await
}

/// The events of response `id` after `after`, read to the response's end.
async fn follow(gw: &TestGateway, key: &str, id: &str, after: Option<u64>) -> Vec<Value> {
    let query = after.map_or(String::new(), |n| format!("&starting_after={n}"));
    let response = gw
        .public(
            Method::GET,
            &format!("/responses/{id}?stream=true{query}"),
            key,
        )
        .send()
        .await
        .expect("re-attach");
    assert_eq!(response.status(), 200);
    let body = response.text().await.expect("the stream to its end");
    if body.is_empty() {
        return Vec::new();
    }
    parse_frames(&body)
}

#[tokio::test]
async fn a_background_response_answers_queued_at_once_then_runs_to_its_end() {
    let (gw, tenant) = gateway_with_tools(&["gate"]).await;

    let created = background_gate_call(&gw, &tenant).await;

    assert_eq!(created["status"], "queued", "{created:#}");
    assert_eq!(created["background"], true);
    assert_eq!(created["output"], json!([]));
    let id = id_of(&created);
    gate_calls(&gw.tools, 1).await;
    let running = get_response(&gw, &tenant.key, &id).await;
    assert_eq!(running.body["status"], "in_progress", "{:#}", running.body);
    gw.tools.open_gate();
    let events = follow(&gw, &tenant.key, &id, None).await;
    let checked = check_stream(events);
    assert_eq!(checked.terminal["status"], "completed");
    assert_eq!(checked.item_kinds(), ["mcp_call:gate", "message"]);
    assert_eq!(
        get_response(&gw, &tenant.key, &id).await.body,
        checked.terminal
    );
}

#[tokio::test]
async fn a_background_stream_starts_queued_streams_to_its_end_and_replays_the_same() {
    let (gw, tenant) = gateway_with_tools(&["add"]).await;

    let events = crate::common::sse::post_stream(
        &gw,
        &tenant.key,
        json!({"model": "mock", "input": "!call add {\"a\": 2, \"b\": 3}", "background": true}),
    )
    .await;

    let checked = check_stream(events);
    assert_eq!(
        checked.kinds()[..3],
        [
            "response.created",
            "response.queued",
            "response.in_progress"
        ]
    );
    assert_eq!(checked.terminal["status"], "completed");
    assert_eq!(checked.terminal["background"], true);
    assert_replay_equals_stream(&gw, &tenant.key, &checked).await;
}

#[tokio::test]
async fn a_stream_re_attached_after_a_disconnect_goes_on_with_the_same_sequence_numbers() {
    let (gw, tenant) = gateway_with_tools(&["gate"]).await;
    let stream = gw
        .public(Method::POST, "/responses", &tenant.key)
        .json(
            &json!({"model": "mock", "input": "!call gate {}", "stream": true, "background": true}),
        )
        .send()
        .await
        .expect("stream");
    let mut reader = FrameReader::new(stream);
    let seen = reader
        .until(|e| e["type"] == "response.mcp_call.in_progress")
        .await;
    drop(reader);
    let id = seen[0]["response"]["id"].as_str().expect("id").to_owned();
    let last = seen.last().expect("events")["sequence_number"]
        .as_u64()
        .expect("number");

    let rest = tokio::spawn({
        let (gw_url, key, id) = (gw.base_url.clone(), tenant.key.clone(), id.clone());
        async move {
            let response = reqwest::Client::new()
                .get(format!(
                    "{gw_url}/v1/responses/{id}?stream=true&starting_after={last}"
                ))
                .bearer_auth(key)
                .send()
                .await
                .expect("re-attach");
            parse_frames(&response.text().await.expect("to the end"))
        }
    });
    gw.tools.open_gate();
    let rest = rest.await.expect("follower");

    assert_eq!(rest[0]["sequence_number"], last + 1, "{rest:#?}");
    let whole: Vec<Value> = seen.into_iter().chain(rest).collect();
    let checked = check_stream(whole);
    assert_eq!(checked.terminal["status"], "completed");
    assert_replay_equals_stream(&gw, &tenant.key, &checked).await;
}

#[tokio::test]
async fn re_attaching_to_an_ended_response_replays_it_and_starting_after_skips_what_was_seen() {
    let (gw, tenant) = gateway().await;
    gw.model.push(Reply::text("Done and dusted."));
    let created = create_ok(&gw, &tenant.key, json!({"model": "mock", "input": "Hi"})).await;
    let id = id_of(&created);

    let all = follow(&gw, &tenant.key, &id, None).await;
    let checked = check_stream(all.clone());
    assert_eq!(checked.terminal, created);
    let tail = follow(&gw, &tenant.key, &id, Some(3)).await;
    assert_eq!(tail, all[4..].to_vec());
    assert!(follow(&gw, &tenant.key, &id, Some(10_000)).await.is_empty());
}

#[tokio::test]
async fn a_cancel_stops_a_background_response_and_aborts_its_tool_call_and_is_idempotent() {
    let (gw, tenant) = gateway_with_tools(&["gate"]).await;
    let id = id_of(&background_gate_call(&gw, &tenant).await);
    gate_calls(&gw.tools, 1).await;

    let cancelled = cancel(&gw, &tenant.key, &id).await;

    assert_eq!(cancelled.status, 200, "{:#}", cancelled.body);
    assert_eq!(cancelled.body["status"], "cancelled");
    assert_eq!(cancelled.body["output"][0]["status"], "failed");
    assert_eq!(
        get_response(&gw, &tenant.key, &id).await.body,
        cancelled.body
    );
    let again = cancel(&gw, &tenant.key, &id).await;
    assert_eq!(
        again.body, cancelled.body,
        "cancelling twice changes nothing"
    );
    gw.tools.open_gate();
    assert_eq!(
        gw.model.requests().len(),
        1,
        "the model is not called again"
    );
    let events = follow(&gw, &tenant.key, &id, None).await;
    assert_eq!(events.last().expect("events")["type"], "response.cancelled");
}

#[tokio::test]
async fn only_a_background_response_may_be_cancelled_and_an_unknown_or_foreign_one_is_404() {
    let (gw, tenant) = gateway().await;
    let other = gw.tenant("globex").await;
    gw.model.push(Reply::text("Foreground."));
    let foreground = create_ok(&gw, &tenant.key, json!({"model": "mock", "input": "Hi"})).await;
    let id = id_of(&foreground);

    assert_error(&cancel(&gw, &tenant.key, &id).await, 400, None, None);
    assert_error(&cancel(&gw, &other.key, &id).await, 404, None, None);
    assert_error(
        &cancel(&gw, &tenant.key, "resp_unknown").await,
        404,
        None,
        None,
    );
    assert_eq!(
        get_response(&gw, &tenant.key, &id).await.body["status"],
        "completed"
    );
}

#[tokio::test]
async fn a_queued_background_response_waits_for_room_and_a_cancel_ends_it_where_it_waits() {
    let (gw, tenant) = {
        let gw = TestGateway::start_with(|c| c.server.max_active_responses = 1).await;
        let tenant = gw.tenant("acme").await;
        gw.attach_tool(&tenant.group_id, "gate").await;
        (gw, tenant)
    };
    let running = id_of(&background_gate_call(&gw, &tenant).await);
    gate_calls(&gw.tools, 1).await;

    // No room: the next one waits in the store, queued, and a cancel ends it there.
    let waiting = create_ok(
        &gw,
        &tenant.key,
        json!({"model": "mock", "input": "later", "background": true}),
    )
    .await;
    assert_eq!(waiting["status"], "queued");
    let cancelled = cancel(&gw, &tenant.key, &id_of(&waiting)).await;
    assert_eq!(
        cancelled.body["status"], "cancelled",
        "{:#}",
        cancelled.body
    );
    assert_eq!(cancelled.body["output"], json!([]));
    // Another one waits, and runs once the first makes room.
    let queued = id_of(
        &create_ok(
            &gw,
            &tenant.key,
            json!({"model": "mock", "input": "Waited.", "background": true}),
        )
        .await,
    );
    assert_eq!(
        get_response(&gw, &tenant.key, &queued).await.body["status"],
        "queued"
    );
    gw.tools.open_gate();

    let done = check_stream(follow(&gw, &tenant.key, &queued, None).await);
    assert_eq!(done.terminal["status"], "completed");
    assert_eq!(done.terminal["output_text"], "Echo: Waited.");
    let first = check_stream(follow(&gw, &tenant.key, &running, None).await);
    assert_eq!(first.terminal["status"], "completed");
}

#[tokio::test]
async fn a_running_response_is_cancelled_then_deleted_with_everything_it_stored() {
    let (gw, tenant) = gateway_with_tools(&["gate"]).await;
    let id = id_of(&background_gate_call(&gw, &tenant).await);
    gate_calls(&gw.tools, 1).await;

    let deleted = delete_response(&gw, &tenant.key, &id).await;

    assert_eq!(deleted.status, 200, "{:#}", deleted.body);
    assert_eq!(stored_rows(&gw).await, (0, 0, 0));
    assert_eq!(get_response(&gw, &tenant.key, &id).await.status, 404);
    gw.tools.open_gate();
    assert_eq!(gw.model.requests().len(), 1, "the run stopped");
}

/// The stream of a running response that calls the `gate` tool, read to its end after the response is deleted.
/// (A follower's stream is held to the same in the gateway's `faults` tests, where the run cannot race the delete.)
async fn stream_of_a_response_deleted_while_it_runs() -> (String, Vec<Value>) {
    let (gw, tenant) = gateway_with_tools(&["gate"]).await;
    let stream = gw
        .public(Method::POST, "/responses", &tenant.key)
        .json(&json!({"model": "mock", "input": "!call gate {}", "stream": true}))
        .send()
        .await
        .expect("stream");
    let mut reader = FrameReader::new(stream);
    let mut seen = reader
        .until(|e| e["type"] == "response.mcp_call.in_progress")
        .await;
    let id = seen[0]["response"]["id"].as_str().expect("id").to_owned();

    let deleted = delete_response(&gw, &tenant.key, &id).await;
    assert_eq!(deleted.status, 200, "{:#}", deleted.body);
    gw.tools.open_gate();
    while let Some(event) = tokio::time::timeout(PATIENCE, reader.next())
        .await
        .expect("the stream ends in time")
    {
        seen.push(event);
    }
    (id, seen)
}

/// The stream's last event tells that response `id` was deleted, numbered after the one before it, and no event
/// claims an end the response never had.
fn assert_ends_told_deleted(id: &str, events: &[Value]) {
    let last = events.last().expect("events");
    // A delete cancels the response first: in the rare case that the run writes that end before the delete
    // lands, the stream tells it, which is an end too.
    if last["type"] == "response.cancelled" {
        return;
    }
    assert_eq!(last["type"], "error", "{events:#?}");
    let message = last["message"].as_str().expect("a message");
    assert!(
        message.contains(id) && message.contains("deleted"),
        "{last:#}"
    );
    assert_eq!(last["error"]["type"], "invalid_request_error", "{last:#}");
    assert_eq!(
        last["sequence_number"].as_u64(),
        events[events.len() - 2]["sequence_number"]
            .as_u64()
            .map(|n| n + 1),
        "{events:#?}"
    );
    let ends = [
        "response.completed",
        "response.failed",
        "response.incomplete",
    ];
    assert!(
        !events
            .iter()
            .any(|e| ends.iter().any(|end| e["type"] == *end)),
        "{events:#?}"
    );
}

#[tokio::test]
async fn a_foreground_stream_of_a_response_deleted_while_it_runs_ends_with_an_error_event() {
    let (id, events) = stream_of_a_response_deleted_while_it_runs().await;
    assert_ends_told_deleted(&id, &events);
}

#[tokio::test]
async fn a_create_repeated_with_its_idempotency_key_while_the_first_runs_answers_the_first_once_it_ends(
) {
    let (gw, tenant) = gateway_with_tools(&["gate"]).await;
    let create = || {
        gw.public(Method::POST, "/responses", &tenant.key)
            .header("Idempotency-Key", "once")
            .json(&json!({"model": "mock", "input": "!call gate {}"}))
            .send()
    };
    let first = tokio::spawn(create());
    gate_calls(&gw.tools, 1).await;

    let repeat = tokio::spawn(create());
    gw.tools.open_gate();
    let first: Value = first
        .await
        .expect("task")
        .expect("first")
        .json()
        .await
        .expect("json");
    let repeat = repeat.await.expect("task").expect("repeat");

    assert_eq!(repeat.status(), 200);
    assert_eq!(repeat.json::<Value>().await.expect("json"), first);
    assert_eq!(gw.tools.calls().len(), 1, "the tool ran once");
}

#[tokio::test]
async fn a_create_whose_client_leaves_runs_on_to_its_end_and_calls_its_tool_once() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (gw, tenant) = gateway_with_tools(&["gate"]).await;
    gw.model
        .push(Reply::tool_calls(vec![Call::new("gate", json!({}))]));
    gw.model.push(Reply::text("Through the gate."));
    let body = json!({"model": "mock", "input": "Go through the gate."}).to_string();
    let head = format!(
        "POST /v1/responses HTTP/1.1\r\nhost: gateway\r\nauthorization: Bearer {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        tenant.key,
        body.len()
    );
    let mut client = tokio::net::TcpStream::connect(gw.base_url.trim_start_matches("http://"))
        .await
        .expect("connect");
    client.write_all(head.as_bytes()).await.expect("send");
    gate_calls(&gw.tools, 1).await;

    // The client stops sending; the gateway, seeing the end of its input mid-request, drops the connection and
    // the request with it, before any answer: the read ends with nothing.
    client.shutdown().await.expect("half-close");
    let mut answer = Vec::new();
    tokio::time::timeout(PATIENCE, client.read_to_end(&mut answer))
        .await
        .expect("the gateway closes the connection")
        .expect("read");
    assert!(
        answer.is_empty(),
        "answered: {}",
        String::from_utf8_lossy(&answer)
    );

    // The response was not abandoned with its request: its tool call answers into it and it ends.
    let statuses = stored_statuses(&gw).await;
    assert_eq!(statuses.len(), 1, "{statuses:?}");
    let id = statuses[0].0.clone();
    gw.tools.open_gate();
    follow(&gw, &tenant.key, &id, None).await;
    let response = get_response(&gw, &tenant.key, &id).await;
    assert_eq!(response.body["status"], "completed", "{:#}", response.body);
    let texts: Vec<&Value> = items_of(&response.body, "message")
        .into_iter()
        .map(|m| &m["content"][0]["text"])
        .collect();
    assert_eq!(texts, [&json!("Through the gate.")], "{:#}", response.body);
    // Had the run been dropped with the request, a takeover would have sent the held call again.
    assert_eq!(gw.tools.calls().len(), 1, "the tool ran once");
    assert_eq!(gw.model.requests().len(), 2);
}

#[tokio::test]
async fn a_get_with_a_bad_stream_or_starting_after_is_a_400_naming_it() {
    let (gw, tenant) = gateway().await;
    gw.model.push(Reply::text("x"));
    let id = id_of(&create_ok(&gw, &tenant.key, json!({"model": "mock", "input": "Hi"})).await);

    for (query, param) in [
        ("stream=maybe", "stream"),
        ("stream=true&starting_after=-1", "starting_after"),
        ("stream=true&starting_after=ten", "starting_after"),
    ] {
        let answer = gw
            .call(gw.public(
                Method::GET,
                &format!("/responses/{id}?{query}"),
                &tenant.key,
            ))
            .await;
        assert_error(&answer, 400, Some(param), None);
    }
}

#[tokio::test]
async fn the_queue_and_the_responses_taken_from_it_show_in_the_metrics() {
    let gw = TestGateway::start_with(|c| c.server.max_active_responses = 1).await;
    let tenant = gw.tenant("acme").await;
    gw.attach_tool(&tenant.group_id, "gate").await;
    let before = metrics_text(&gw).await;
    background_gate_call(&gw, &tenant).await;
    gate_calls(&gw.tools, 1).await;
    let queued = id_of(
        &create_ok(
            &gw,
            &tenant.key,
            json!({"model": "mock", "input": "Waited.", "background": true}),
        )
        .await,
    );

    let waiting = metrics_text(&gw).await;
    assert_eq!(
        sample(&waiting, "gateway_queue_depth", &[]),
        1.0,
        "{waiting}"
    );
    assert!(sample(&waiting, "gateway_queue_oldest_age_seconds", &[]) >= 0.0);
    gw.tools.open_gate();
    follow(&gw, &tenant.key, &queued, None).await;

    let after = metrics_text(&gw).await;
    assert_eq!(sample(&after, "gateway_queue_depth", &[]), 0.0, "{after}");
    let taken = |text: &str| {
        sample(
            text,
            "gateway_responses_resumed_total",
            &["reason=\"queued\""],
        )
    };
    assert_eq!(taken(&after) - taken(&before), 1.0, "{after}");
}
