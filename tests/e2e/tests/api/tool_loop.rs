//! The server-side tool loop: server tools run by the gateway, batches, failures and limits.

use crate::common::*;
use gateway_e2e::{items_of, TestGateway};
use gateway_testkit::{Call, Reply};
use reqwest::Method;
use serde_json::json;

#[tokio::test]
async fn a_server_tool_runs_and_the_model_sees_its_result_paired_by_call_id() {
    let (gw, tenant) = gateway_with_tools(&["add"]).await;
    gw.model.push(
        Reply::tool_calls(vec![
            Call::new("add", json!({"a": 40, "b": 2})).with_id("call_add_1")
        ])
        .with_usage(10, 5),
    );
    gw.model
        .push(Reply::text("The sum is 42.").with_usage(20, 8));

    let body = create_ok(
        &gw,
        &tenant.key,
        json!({"model": "mock", "input": "What is 40 + 2?"}),
    )
    .await;

    assert_eq!(body["status"], "completed", "{body:#}");
    let output = body["output"].as_array().expect("output");
    assert_eq!(output.len(), 2, "{body:#}");
    let mcp = &output[0];
    assert_eq!(mcp["type"], "mcp_call");
    assert!(
        mcp["id"].as_str().is_some_and(|id| id.starts_with("mcp_")),
        "{mcp:#}"
    );
    assert_eq!(mcp["name"], "add");
    assert_eq!(mcp["server_label"], "gateway");
    assert_eq!(mcp["call_id"], "call_add_1");
    assert_eq!(
        parse(mcp["arguments"].as_str().expect("arguments string")),
        json!({"a": 40, "b": 2})
    );
    assert_eq!(
        parse(mcp["output"].as_str().expect("output string")),
        json!({"sum": 42})
    );
    assert_eq!(mcp["error"], serde_json::Value::Null);
    assert_eq!(mcp["status"], "completed");
    assert_eq!(output[1]["type"], "message");
    assert_eq!(body["output_text"], "The sum is 42.");
    assert!(
        items_of(&body, "function_call").is_empty(),
        "server calls are not function_call items: {body:#}"
    );

    // Usage sums both model calls.
    assert_eq!(body["usage"]["input_tokens"], 30);
    assert_eq!(body["usage"]["output_tokens"], 13);
    assert_eq!(body["usage"]["total_tokens"], 43);

    let requests = gw.model.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(
        offered_tools(&requests[0]),
        ["add"],
        "the model is offered the server tool"
    );
    let calls = assistant_tool_calls(&requests[1]);
    assert_eq!(calls.len(), 1, "{:#}", requests[1]);
    assert_eq!(calls[0].0, "call_add_1");
    assert_eq!(calls[0].1, "add");
    assert_eq!(parse(&calls[0].2), json!({"a": 40, "b": 2}));
    assert_eq!(
        parse(&tool_result(&requests[1], "call_add_1")),
        json!({"sum": 42})
    );
    assert_calls_paired(&requests[1]);

    // The stored response reads back the same.
    assert_eq!(
        get_response(&gw, &tenant.key, &id_of(&body)).await.body,
        body
    );
}

#[tokio::test]
async fn the_tool_endpoint_receives_the_arguments_as_body_and_the_gateway_headers() {
    let (gw, tenant) = gateway_with_tools(&["add"]).await;
    gw.model.push(Reply::tool_calls(vec![Call::new(
        "add",
        json!({"a": 1, "b": 2}),
    )
    .with_id("call_hdr")]));
    gw.model.push(Reply::text("3"));

    let body = create_ok(&gw, &tenant.key, json!({"model": "mock", "input": "1+2"})).await;

    let calls = gw.tools.calls();
    assert_eq!(calls.len(), 1, "{calls:#?}");
    let call = &calls[0];
    assert_eq!(call.tool, "add");
    assert_eq!(call.body, json!({"a": 1, "b": 2}));
    assert!(
        call.header("content-type")
            .is_some_and(|v| v.starts_with("application/json")),
        "{call:#?}"
    );
    assert!(
        call.header("idempotency-key")
            .is_some_and(|v| !v.is_empty()),
        "{call:#?}"
    );
    assert_eq!(call.header("x-gateway-tool-name"), Some("add"));
    assert_eq!(call.header("x-gateway-call-id"), Some("call_hdr"));
    assert_eq!(call.header("x-gateway-response-id"), body["id"].as_str());
    assert_eq!(
        call.header("authorization"),
        None,
        "no secret, no authorization header"
    );
}

#[tokio::test]
async fn a_batch_of_server_tools_runs_concurrently_and_each_result_pairs_with_its_call() {
    let (gw, tenant) = gateway_with_tools(&["barrier"]).await;
    gw.model.push(Reply::tool_calls(vec![
        Call::new("barrier", json!({"n": 3})).with_id("call_b1"),
        Call::new("barrier", json!({"n": 3})).with_id("call_b2"),
        Call::new("barrier", json!({"n": 3})).with_id("call_b3"),
    ]));
    gw.model.push(Reply::text("all released"));

    let body = create_ok(
        &gw,
        &tenant.key,
        json!({"model": "mock", "input": "meet at the barrier"}),
    )
    .await;

    assert_eq!(body["status"], "completed", "{body:#}");
    let mcp = items_of(&body, "mcp_call");
    assert_eq!(mcp.len(), 3, "{body:#}");
    let mut call_ids: Vec<&str> = mcp
        .iter()
        .map(|i| i["call_id"].as_str().unwrap_or_default())
        .collect();
    call_ids.sort_unstable();
    assert_eq!(call_ids, ["call_b1", "call_b2", "call_b3"]);
    for item in &mcp {
        assert_eq!(
            item["status"], "completed",
            "a barrier call failed, so the batch did not run concurrently: {item:#}"
        );
        assert_eq!(
            parse(item["output"].as_str().unwrap_or("null")),
            json!({"released": true, "n": 3})
        );
    }
    assert!(
        gw.tools.max_in_flight() >= 3,
        "max in flight: {}",
        gw.tools.max_in_flight()
    );
    assert_eq!(gw.tools.calls().len(), 3);

    let requests = gw.model.requests();
    assert_eq!(requests.len(), 2);
    let calls = assistant_tool_calls(&requests[1]);
    let ids: Vec<&str> = calls.iter().map(|c| c.0.as_str()).collect();
    assert_eq!(
        ids,
        ["call_b1", "call_b2", "call_b3"],
        "one assistant message carries the whole batch in order"
    );
    for id in ["call_b1", "call_b2", "call_b3"] {
        assert_eq!(
            parse(&tool_result(&requests[1], id)),
            json!({"released": true, "n": 3})
        );
    }
    assert_calls_paired(&requests[1]);
    // Each tool step sent its own idempotency key.
    let mut keys: Vec<String> = gw
        .tools
        .calls()
        .iter()
        .map(|c| c.header("idempotency-key").unwrap_or_default().to_owned())
        .collect();
    keys.sort();
    keys.dedup();
    assert_eq!(keys.len(), 3, "{keys:?}");
}

#[tokio::test]
async fn a_failing_tool_gives_the_model_an_error_output_and_its_sibling_keeps_its_result() {
    let (gw, tenant) = gateway_with_tools(&["add", "fail"]).await;
    gw.model.push(Reply::tool_calls(vec![
        Call::new("fail", json!({})).with_id("call_fail"),
        Call::new("add", json!({"a": 2, "b": 3})).with_id("call_ok"),
    ]));
    gw.model.push(Reply::text("One tool failed; the sum is 5."));

    let body = create_ok(
        &gw,
        &tenant.key,
        json!({"model": "mock", "input": "try both"}),
    )
    .await;

    assert_eq!(body["status"], "completed", "{body:#}");
    let mcp = items_of(&body, "mcp_call");
    assert_eq!(mcp.len(), 2, "{body:#}");
    let failed = mcp
        .iter()
        .find(|i| i["call_id"] == "call_fail")
        .expect("failed call item");
    assert_eq!(failed["status"], "failed");
    assert_eq!(failed["output"], serde_json::Value::Null);
    // The error's shape (string or object) is the item's business; it must be there and say what happened.
    assert!(!failed["error"].is_null(), "{failed:#}");
    assert!(failed["error"].to_string().contains("500"), "{failed:#}");
    let ok = mcp
        .iter()
        .find(|i| i["call_id"] == "call_ok")
        .expect("succeeded call item");
    assert_eq!(ok["status"], "completed");
    assert_eq!(ok["error"], serde_json::Value::Null);
    assert_eq!(
        parse(ok["output"].as_str().unwrap_or("null")),
        json!({"sum": 5})
    );

    let requests = gw.model.requests();
    assert_eq!(requests.len(), 2);
    let error_output = parse(&tool_result(&requests[1], "call_fail"));
    assert!(
        error_output["error"]["message"].is_string(),
        "the model sees {{\"error\":...}}: {error_output:#}"
    );
    assert_eq!(
        parse(&tool_result(&requests[1], "call_ok")),
        json!({"sum": 5})
    );
    assert_calls_paired(&requests[1]);
}

#[tokio::test]
async fn a_tool_that_times_out_gives_the_model_a_timeout_error() {
    let (gw, tenant) = gateway().await;
    gw.attach_tool_with(&tenant.group_id, "slow", json!({"timeout_ms": 50}))
        .await;
    gw.model.push(Reply::tool_calls(vec![Call::new(
        "slow",
        json!({"ms": 5000}),
    )
    .with_id("call_slow")]));
    gw.model.push(Reply::text("The tool timed out."));

    let body = create_ok(
        &gw,
        &tenant.key,
        json!({"model": "mock", "input": "be slow"}),
    )
    .await;

    assert_eq!(body["status"], "completed", "{body:#}");
    let mcp = items_of(&body, "mcp_call");
    assert_eq!(mcp.len(), 1);
    assert_eq!(mcp[0]["status"], "failed");
    assert!(!mcp[0]["error"].is_null(), "{:#}", mcp[0]);
    assert!(
        mcp[0]["error"].to_string().contains("timed out"),
        "{:#}",
        mcp[0]
    );
    let requests = gw.model.requests();
    assert_eq!(requests.len(), 2);
    let seen = parse(&tool_result(&requests[1], "call_slow"));
    assert!(
        seen["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("timed out")),
        "{seen:#}"
    );
}

#[tokio::test]
async fn arguments_that_do_not_match_the_tool_schema_give_the_model_an_error_without_calling_the_tool(
) {
    let (gw, tenant) = gateway_with_tools(&["add"]).await;
    gw.model.push(Reply::tool_calls(vec![Call::new(
        "add",
        json!({"a": "two"}),
    )
    .with_id("call_bad")]));
    gw.model.push(Reply::text("I passed bad arguments."));

    let body = create_ok(&gw, &tenant.key, json!({"model": "mock", "input": "add"})).await;

    assert_eq!(body["status"], "completed", "{body:#}");
    assert!(
        gw.tools.calls().is_empty(),
        "the tool endpoint is not called with invalid arguments"
    );
    let requests = gw.model.requests();
    let seen = parse(&tool_result(&requests[1], "call_bad"));
    assert!(seen["error"]["message"].is_string(), "{seen:#}");
}

#[tokio::test]
async fn max_tool_calls_below_the_batch_size_ends_the_response_incomplete_without_running_it() {
    let (gw, tenant) = gateway_with_tools(&["add"]).await;
    gw.model.push(Reply::tool_calls(vec![
        Call::new("add", json!({"a": 1, "b": 1})),
        Call::new("add", json!({"a": 2, "b": 2})),
    ]));

    let body = create_ok(
        &gw,
        &tenant.key,
        json!({"model": "mock", "input": "two sums", "max_tool_calls": 1}),
    )
    .await;

    assert_eq!(body["status"], "incomplete", "{body:#}");
    assert_eq!(
        body["incomplete_details"],
        json!({"reason": "max_tool_calls"})
    );
    assert_eq!(body["max_tool_calls"], 1);
    assert!(gw.tools.calls().is_empty(), "the batch is not run");
    assert!(items_of(&body, "mcp_call").is_empty());
    assert_eq!(gw.model.requests().len(), 1);
    assert_eq!(
        get_response(&gw, &tenant.key, &id_of(&body)).await.body["status"],
        "incomplete"
    );
}

/// A gateway that stops after two failing batches, with the `fail` tool attached.
async fn failing_gateway() -> (TestGateway, gateway_e2e::Tenant) {
    let gw = TestGateway::start_with(|c| c.limits.max_failing_batches = 2).await;
    let tenant = gw.tenant("acme").await;
    gw.attach_tool(&tenant.group_id, "fail").await;
    (gw, tenant)
}

#[tokio::test]
async fn consecutive_failing_batches_end_the_response_incomplete() {
    let (gw, tenant) = failing_gateway().await;
    for _ in 0..4 {
        gw.model
            .push(Reply::tool_calls(vec![Call::new("fail", json!({}))]));
    }

    let body = create_ok(
        &gw,
        &tenant.key,
        json!({"model": "mock", "input": "keep failing"}),
    )
    .await;

    assert_eq!(body["status"], "incomplete", "{body:#}");
    assert_eq!(
        body["incomplete_details"],
        json!({"reason": "max_failing_tool_batches"})
    );
    assert_eq!(
        gw.model.requests().len(),
        2,
        "the loop stops after the second failing batch"
    );
    assert_eq!(gw.tools.calls().len(), 2);
    let mcp = items_of(&body, "mcp_call");
    assert_eq!(mcp.len(), 2);
    assert!(mcp.iter().all(|i| i["status"] == "failed"), "{body:#}");
}

#[tokio::test]
async fn a_succeeding_batch_resets_the_count_of_failing_batches() {
    let (gw, tenant) = failing_gateway().await;
    gw.attach_tool(&tenant.group_id, "add").await;
    gw.model
        .push(Reply::tool_calls(vec![Call::new("fail", json!({}))]));
    gw.model.push(Reply::tool_calls(vec![Call::new(
        "add",
        json!({"a": 1, "b": 1}),
    )]));
    gw.model
        .push(Reply::tool_calls(vec![Call::new("fail", json!({}))]));
    gw.model.push(Reply::text("done"));

    let body = create_ok(
        &gw,
        &tenant.key,
        json!({"model": "mock", "input": "mixed luck"}),
    )
    .await;

    assert_eq!(body["status"], "completed", "{body:#}");
    assert_eq!(gw.model.requests().len(), 4);
}

#[tokio::test]
async fn the_model_call_ceiling_ends_the_response_incomplete() {
    let gw = TestGateway::start_with(|c| c.limits.max_model_calls = 2).await;
    let tenant = gw.tenant("acme").await;
    gw.attach_tool(&tenant.group_id, "add").await;
    for i in 0..3 {
        gw.model.push(Reply::tool_calls(vec![Call::new(
            "add",
            json!({"a": i, "b": 1}),
        )]));
    }

    let body = create_ok(
        &gw,
        &tenant.key,
        json!({"model": "mock", "input": "loop forever"}),
    )
    .await;

    assert_eq!(body["status"], "incomplete", "{body:#}");
    assert_eq!(
        body["incomplete_details"],
        json!({"reason": "max_model_calls"})
    );
    assert_eq!(gw.model.requests().len(), 2);
    assert_eq!(
        items_of(&body, "mcp_call").len(),
        2,
        "both batches ran before the ceiling: {body:#}"
    );
    assert_eq!(
        body["usage"]["input_tokens"], 20,
        "usage sums the two model calls"
    );
}

#[tokio::test]
async fn a_tool_source_secret_is_sent_as_bearer_to_the_tool_and_never_to_the_model_or_the_client() {
    let (gw, tenant) = gateway().await;
    gw.attach_tool_with(
        &tenant.group_id,
        "echo",
        json!({"secret": "tool-secret-123"}),
    )
    .await;
    gw.model.push(Reply::tool_calls(vec![
        Call::new("echo", json!({"x": 1})).with_id("call_echo")
    ]));
    gw.model.push(Reply::text("echoed"));

    let body = create_ok(&gw, &tenant.key, json!({"model": "mock", "input": "echo"})).await;

    let calls = gw.tools.calls();
    assert_eq!(calls.len(), 1);
    assert_eq!(
        calls[0].header("authorization"),
        Some("Bearer tool-secret-123")
    );
    assert_eq!(calls[0].body, json!({"x": 1}));
    for request in gw.model.requests() {
        assert!(
            !request.to_string().contains("tool-secret-123"),
            "the secret reached the model: {request:#}"
        );
    }
    assert!(
        !body.to_string().contains("tool-secret-123"),
        "the secret reached the client: {body:#}"
    );
    assert_eq!(
        parse(&tool_result(&gw.model.requests()[1], "call_echo")),
        json!({"echo": {"x": 1}})
    );
}

#[tokio::test]
async fn a_text_body_from_a_tool_becomes_the_output_text_as_is() {
    let (gw, tenant) = gateway_with_tools(&["plain_text"]).await;
    gw.model.push(Reply::tool_calls(vec![
        Call::new("plain_text", json!({})).with_id("call_plain")
    ]));
    gw.model.push(Reply::text("got text"));

    let body = create_ok(
        &gw,
        &tenant.key,
        json!({"model": "mock", "input": "text please"}),
    )
    .await;

    assert_eq!(
        items_of(&body, "mcp_call")[0]["output"],
        "plain text answer"
    );
    assert_eq!(
        tool_result(&gw.model.requests()[1], "call_plain"),
        "plain text answer"
    );
}

#[tokio::test]
async fn the_tools_of_a_batch_run_at_most_tool_concurrency_at_a_time() {
    let gw = TestGateway::start_with(|c| c.limits.tool_concurrency = 2).await;
    let tenant = gw.tenant("acme").await;
    gw.attach_tool(&tenant.group_id, "slow").await;
    gw.model.push(Reply::tool_calls(
        (0..4)
            .map(|i| Call::new("slow", json!({"ms": 30})).with_id(&format!("call_s{i}")))
            .collect(),
    ));
    gw.model.push(Reply::text("done"));

    let body = create_ok(
        &gw,
        &tenant.key,
        json!({"model": "mock", "input": "four slow calls"}),
    )
    .await;

    let mcp = items_of(&body, "mcp_call");
    assert_eq!(mcp.len(), 4, "{body:#}");
    assert!(mcp.iter().all(|i| i["status"] == "completed"), "{body:#}");
    assert_eq!(gw.tools.calls().len(), 4);
    assert!(
        gw.tools.max_in_flight() <= 2,
        "max in flight: {}",
        gw.tools.max_in_flight()
    );
}

#[tokio::test]
async fn an_unreachable_tool_gives_the_model_an_error_output() {
    let (gw, tenant) = gateway().await;
    let definition = gateway_testkit::tool_definitions()
        .into_iter()
        .find(|d| d.name == "add")
        .expect("add");
    // A port that was just free: nothing listens there, so the connection is refused.
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.local_addr().expect("addr").port()
    };
    let source = gw
        .admin_ok(
            reqwest::Method::POST,
            "/tool_sources",
            Some(json!({"name": "add", "description": definition.description, "parameters": definition.parameters,
                "url": format!("http://127.0.0.1:{port}/tools/add")})),
        )
        .await;
    gw.admin_ok(
        reqwest::Method::PUT,
        &format!(
            "/deployment_groups/{}/tool_sources/{}",
            tenant.group_id,
            id_of(&source)
        ),
        None,
    )
    .await;
    gw.model.push(Reply::tool_calls(vec![Call::new(
        "add",
        json!({"a": 1, "b": 1}),
    )
    .with_id("call_down")]));
    gw.model.push(Reply::text("the tool is down"));

    let body = create_ok(&gw, &tenant.key, json!({"model": "mock", "input": "add"})).await;

    assert_eq!(body["status"], "completed", "{body:#}");
    assert_eq!(items_of(&body, "mcp_call")[0]["status"], "failed");
    let seen = parse(&tool_result(&gw.model.requests()[1], "call_down"));
    assert!(seen["error"]["message"].is_string(), "{seen:#}");
}

#[tokio::test]
async fn a_response_past_its_deadline_ends_incomplete() {
    let gw = TestGateway::start_with(|c| c.limits.response_deadline_ms = 0).await;
    let tenant = gw.tenant("acme").await;
    gw.model.push(Reply::text("too late"));

    let body = create_ok(&gw, &tenant.key, json!({"model": "mock", "input": "hi"})).await;

    assert_eq!(body["status"], "incomplete", "{body:#}");
    assert_eq!(body["incomplete_details"], json!({"reason": "deadline"}));
    assert!(gw.model.requests().is_empty());
}

#[tokio::test]
async fn a_model_call_still_running_when_the_deadline_passes_ends_the_response_incomplete() {
    let gw = TestGateway::start_with(|c| c.limits.response_deadline_ms = 1_000).await;
    let tenant = gw.tenant("acme").await;
    gw.model
        .push(Reply::text("far too late").with_delay(std::time::Duration::from_secs(10)));

    let body = create_ok(&gw, &tenant.key, json!({"model": "mock", "input": "hi"})).await;

    assert_eq!(body["status"], "incomplete", "{body:#}");
    assert_eq!(body["incomplete_details"], json!({"reason": "deadline"}));
}

#[tokio::test]
async fn arguments_that_are_not_json_give_the_model_an_error_without_calling_the_tool() {
    let (gw, tenant) = gateway_with_tools(&["add"]).await;
    gw.model
        .push(Reply::tool_calls(vec![Call::new("add", json!({}))
            .raw_arguments("{\"a\": 1,")
            .with_id("call_broken")]));
    gw.model.push(Reply::text("My arguments were broken."));

    let body = create_ok(&gw, &tenant.key, json!({"model": "mock", "input": "add"})).await;

    assert_eq!(body["status"], "completed", "{body:#}");
    assert!(gw.tools.calls().is_empty());
    assert_eq!(items_of(&body, "mcp_call")[0]["status"], "failed");
    let seen = parse(&tool_result(&gw.model.requests()[1], "call_broken"));
    assert!(seen["error"]["message"].is_string(), "{seen:#}");
}

/// `(seq:kind, state:attempts)` of every stored step, in order.
async fn stored_steps(gw: &TestGateway) -> Vec<(String, String)> {
    gw.fetch_text_pairs(
        "SELECT seq || ':' || kind, state || ':' || attempts FROM steps ORDER BY response_id, seq",
    )
    .await
}

#[tokio::test]
async fn every_step_of_a_round_is_stored_ended_with_one_attempt() {
    let (gw, tenant) = gateway_with_tools(&["add", "echo"]).await;
    gw.model.push(Reply::tool_calls(vec![
        Call::new("add", json!({"a": 1, "b": 2})),
        Call::new("echo", json!({"x": 1})),
    ]));
    gw.model.push(Reply::text("Done."));

    let body = create_ok(&gw, &tenant.key, json!({"model": "mock", "input": "Go."})).await;

    assert_eq!(body["status"], "completed", "{body:#}");
    let pairs = |rows: &[(&str, &str)]| -> Vec<(String, String)> {
        rows.iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    };
    assert_eq!(
        stored_steps(&gw).await,
        pairs(&[
            ("0:model", "succeeded:1"),
            ("1:tool", "succeeded:1"),
            ("2:tool", "succeeded:1"),
            ("3:model", "succeeded:1"),
        ])
    );
}

#[tokio::test]
async fn a_call_that_ended_is_stored_while_its_sibling_still_runs() {
    let (gw, tenant) = gateway_with_tools(&["add", "barrier"]).await;
    // `barrier` with n = 2 answers only once a second barrier call is in flight: the test sends that one
    // itself, after it has seen `add`'s result in the store.
    gw.model.push(Reply::tool_calls(vec![
        Call::new("add", json!({"a": 1, "b": 2})),
        Call::new("barrier", json!({"n": 2})),
    ]));
    gw.model.push(Reply::text("Both ended."));
    let request = gw
        .public(Method::POST, "/responses", &tenant.key)
        .json(&json!({"model": "mock", "input": "Go."}));
    let created = tokio::spawn(request.send());

    let seen = async {
        loop {
            let tools = gw
                .fetch_text_pairs(
                    "SELECT tool_name, state FROM steps WHERE kind = 'tool' ORDER BY seq",
                )
                .await;
            let state = |name: &str| {
                tools
                    .iter()
                    .find(|(tool, _)| tool == name)
                    .map(|(_, state)| state.clone())
            };
            if state("add").as_deref() == Some("succeeded") {
                return state("barrier");
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    };
    let barrier_state = tokio::time::timeout(std::time::Duration::from_secs(8), seen)
        .await
        .expect("add's result is stored before the batch ends");
    assert_eq!(barrier_state.as_deref(), Some("running"));

    release_barrier(&gw, 2).await;
    let answer = created.await.expect("task").expect("create");
    let body: serde_json::Value = answer.json().await.expect("body");
    assert_eq!(body["status"], "completed", "{body:#}");
    let calls = items_of(&body, "mcp_call");
    assert!(calls.iter().all(|c| c["status"] == "completed"), "{body:#}");
}

#[tokio::test]
async fn while_a_slow_model_thinks_the_batch_results_and_its_call_are_already_stored() {
    let (gw, tenant) = gateway_with_tools(&["add"]).await;
    gw.model.push(Reply::tool_calls(vec![Call::new(
        "add",
        json!({"a": 1, "b": 2}),
    )]));
    gw.model
        .push(Reply::text("Slow answer.").with_delay(std::time::Duration::from_secs(2)));
    let created = tokio::spawn(
        gw.public(Method::POST, "/responses", &tenant.key)
            .json(&json!({"model": "mock", "input": "Go."}))
            .send(),
    );

    let seen = async {
        loop {
            let steps = stored_steps(&gw).await;
            if steps.len() == 3 {
                return steps;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    };
    let steps = tokio::time::timeout(std::time::Duration::from_millis(1500), seen)
        .await
        .expect("the boundary is written while the model still thinks");
    let expected: Vec<(String, String)> = [
        ("0:model", "succeeded:1"),
        ("1:tool", "succeeded:1"),
        ("2:model", "running:1"),
    ]
    .iter()
    .map(|(a, b)| (a.to_string(), b.to_string()))
    .collect();
    assert_eq!(steps, expected);

    let answer = created.await.expect("task").expect("create");
    assert_eq!(answer.status(), 200);
    assert_eq!(
        stored_steps(&gw).await.last().map(|s| s.1.clone()),
        Some("succeeded:1".to_string())
    );
}
