//! Client tools handed back as `function_call` items, and continuing with `previous_response_id`.

use crate::common::*;
use gateway_e2e::{items_of, Tenant, TestGateway};
use gateway_testkit::{Call, Reply};
use serde_json::{json, Value};

/// A client-side function tool, declared in the request.
fn lookup_tool() -> Value {
    json!({"type": "function", "name": "lookup", "description": "Look a word up.",
        "parameters": {"type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"]}})
}

#[tokio::test]
async fn a_client_tool_call_is_handed_back_as_a_function_call_item() {
    let (gw, tenant) = gateway().await;
    gw.model.push(Reply::tool_calls(vec![Call::new(
        "lookup",
        json!({"word": "gateway"}),
    )
    .with_id("call_lookup")]));

    let body = create_ok(
        &gw,
        &tenant.key,
        json!({"model": "mock", "input": "define gateway", "tools": [lookup_tool()]}),
    )
    .await;

    assert_eq!(body["status"], "completed", "{body:#}");
    let output = body["output"].as_array().expect("output");
    assert_eq!(output.len(), 1, "{body:#}");
    let call = &output[0];
    assert_eq!(call["type"], "function_call");
    assert!(
        call["id"].as_str().is_some_and(|id| id.starts_with("fc_")),
        "{call:#}"
    );
    assert_eq!(call["call_id"], "call_lookup");
    assert_eq!(call["name"], "lookup");
    assert_eq!(
        parse(call["arguments"].as_str().expect("arguments is a string")),
        json!({"word": "gateway"})
    );
    assert_eq!(call["status"], "completed");
    assert_eq!(body["tools"][0]["name"], "lookup");
    for key in ["description", "parameters", "strict"] {
        assert!(
            body["tools"][0].get(key).is_some(),
            "tools[0].{key} missing: {body:#}"
        );
    }
    assert_eq!(offered_tools(&gw.model.requests()[0]), ["lookup"]);
    assert_eq!(
        get_response(&gw, &tenant.key, &id_of(&body)).await.body,
        body
    );
}

/// Creates the first turn: the model calls the registered `add` and the client's `lookup` in one batch.
async fn mixed_batch(gw: &TestGateway, tenant: &Tenant) -> Value {
    gw.model.push(Reply::tool_calls(vec![
        Call::new("add", json!({"a": 20, "b": 22})).with_id("call_add"),
        Call::new("lookup", json!({"word": "answer"})).with_id("call_lookup"),
    ]));
    create_ok(
        gw,
        &tenant.key,
        json!({"model": "mock", "input": "sum and look up", "tools": [lookup_tool()]}),
    )
    .await
}

#[tokio::test]
async fn a_mixed_batch_is_handed_back_whole_without_running_the_server_tool() {
    let (gw, tenant) = gateway_with_tools(&["add"]).await;

    let body = mixed_batch(&gw, &tenant).await;

    assert_eq!(body["status"], "completed", "{body:#}");
    let calls = items_of(&body, "function_call");
    assert_eq!(calls.len(), 2, "{body:#}");
    assert_eq!(calls[0]["call_id"], "call_add");
    assert_eq!(calls[0]["name"], "add");
    assert_eq!(calls[1]["call_id"], "call_lookup");
    assert_eq!(calls[1]["name"], "lookup");
    assert!(calls
        .iter()
        .all(|c| c["status"] == "completed"
            && c["id"].as_str().is_some_and(|id| id.starts_with("fc_"))));
    assert!(items_of(&body, "mcp_call").is_empty(), "{body:#}");
    assert!(
        gw.tools.calls().is_empty(),
        "the tool server was called: {:#?}",
        gw.tools.calls()
    );
    let mut offered = offered_tools(&gw.model.requests()[0]);
    offered.sort();
    assert_eq!(offered, ["add", "lookup"]);
}

#[tokio::test]
async fn continuing_with_every_output_in_any_order_runs_nothing_and_the_model_sees_both_outputs() {
    let (gw, tenant) = gateway_with_tools(&["add"]).await;
    let first = mixed_batch(&gw, &tenant).await;
    gw.model.push(Reply::text("42, and the answer is a reply."));

    let second = create_ok(
        &gw,
        &tenant.key,
        json!({"model": "mock", "previous_response_id": id_of(&first), "tools": [lookup_tool()], "input": [
            {"type": "function_call_output", "call_id": "call_lookup", "output": "a reply"},
            {"type": "function_call_output", "call_id": "call_add", "output": "{\"sum\":42}"}
        ]}),
    )
    .await;

    assert_eq!(second["status"], "completed", "{second:#}");
    assert_eq!(second["previous_response_id"], first["id"]);
    assert!(
        gw.tools.calls().is_empty(),
        "outputs sent by the client are used as given"
    );
    assert!(items_of(&second, "mcp_call").is_empty(), "{second:#}");
    assert_eq!(second["output_text"], "42, and the answer is a reply.");
    assert_eq!(
        second["usage"]["input_tokens"], 10,
        "usage counts only this response's model call"
    );

    let requests = gw.model.requests();
    assert_eq!(requests.len(), 2);
    let calls: Vec<String> = assistant_tool_calls(&requests[1])
        .into_iter()
        .map(|c| c.0)
        .collect();
    assert_eq!(calls, ["call_add", "call_lookup"]);
    assert_eq!(tool_result(&requests[1], "call_add"), "{\"sum\":42}");
    assert_eq!(tool_result(&requests[1], "call_lookup"), "a reply");
    assert_calls_paired(&requests[1]);
    assert_eq!(
        last_text_of(&requests[1], "user"),
        "sum and look up",
        "the first turn's input is kept"
    );
}

#[tokio::test]
async fn continuing_with_only_the_client_outputs_runs_the_registered_call_in_the_gateway() {
    let (gw, tenant) = gateway_with_tools(&["add"]).await;
    let first = mixed_batch(&gw, &tenant).await;
    gw.model.push(Reply::text("Sum 42; lookup done."));

    let second = create_ok(
        &gw,
        &tenant.key,
        json!({"model": "mock", "previous_response_id": id_of(&first), "tools": [lookup_tool()], "input": [
            {"type": "function_call_output", "call_id": "call_lookup", "output": "a reply"}
        ]}),
    )
    .await;

    assert_eq!(second["status"], "completed", "{second:#}");
    let tool_calls = gw.tools.calls();
    assert_eq!(tool_calls.len(), 1, "{tool_calls:#?}");
    assert_eq!(tool_calls[0].tool, "add");
    assert_eq!(tool_calls[0].body, json!({"a": 20, "b": 22}));
    assert_eq!(tool_calls[0].header("x-gateway-call-id"), Some("call_add"));
    assert_eq!(
        tool_calls[0].header("x-gateway-response-id"),
        second["id"].as_str()
    );

    let output = second["output"].as_array().expect("output");
    assert_eq!(
        output[0]["type"], "mcp_call",
        "the gateway's run comes first: {second:#}"
    );
    assert_eq!(output[0]["call_id"], "call_add");
    assert_eq!(output[0]["status"], "completed");
    assert_eq!(
        parse(output[0]["output"].as_str().unwrap_or("null")),
        json!({"sum": 42})
    );
    assert_eq!(
        output.last().map(|i| i["type"].clone()),
        Some(json!("message"))
    );

    let requests = gw.model.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(
        parse(&tool_result(&requests[1], "call_add")),
        json!({"sum": 42})
    );
    assert_eq!(tool_result(&requests[1], "call_lookup"), "a reply");
    assert_calls_paired(&requests[1]);
}

#[tokio::test]
async fn a_third_turn_still_carries_the_first_turns_tool_results() {
    let (gw, tenant) = gateway_with_tools(&["add"]).await;
    let first = mixed_batch(&gw, &tenant).await;
    gw.model.push(Reply::text("Sum 42; lookup done."));
    let second = create_ok(
        &gw,
        &tenant.key,
        json!({"model": "mock", "previous_response_id": id_of(&first), "tools": [lookup_tool()], "input": [
            {"type": "function_call_output", "call_id": "call_lookup", "output": "a reply"}
        ]}),
    )
    .await;
    gw.model.push(Reply::text("You asked about a sum."));

    let third = create_ok(
        &gw,
        &tenant.key,
        json!({"model": "mock", "previous_response_id": id_of(&second), "input": "what did I ask?"}),
    )
    .await;

    assert_eq!(third["status"], "completed", "{third:#}");
    assert_eq!(
        gw.tools.calls().len(),
        1,
        "the third turn runs no tool again"
    );
    let requests = gw.model.requests();
    assert_eq!(requests.len(), 3);
    let third_request = &requests[2];
    let calls: Vec<String> = assistant_tool_calls(third_request)
        .into_iter()
        .map(|c| c.0)
        .collect();
    assert_eq!(
        calls,
        ["call_add", "call_lookup"],
        "each call appears once: {:#}",
        third_request
    );
    assert_eq!(
        parse(&tool_result(third_request, "call_add")),
        json!({"sum": 42})
    );
    assert_eq!(tool_result(third_request, "call_lookup"), "a reply");
    assert_calls_paired(third_request);
    assert_eq!(
        last_text_of(third_request, "assistant"),
        "Sum 42; lookup done."
    );
    assert_eq!(last_text_of(third_request, "user"), "what did I ask?");
    let roles: Vec<&str> = messages(third_request)
        .iter()
        .filter_map(|m| m["role"].as_str())
        .collect();
    assert_eq!(
        roles,
        ["user", "assistant", "tool", "tool", "assistant", "user"]
    );
}

#[tokio::test]
async fn a_chained_response_sees_the_previous_turn_but_not_its_instructions() {
    let (gw, tenant) = gateway().await;
    gw.model.push(Reply::text("Paris."));
    gw.model.push(Reply::text("About 2 million."));
    let first = create_ok(
        &gw,
        &tenant.key,
        json!({"model": "mock", "instructions": "Answer in one word.", "input": "Capital of France?"}),
    )
    .await;

    let second = create_ok(
        &gw,
        &tenant.key,
        json!({"model": "mock", "previous_response_id": id_of(&first), "input": "Its population?"}),
    )
    .await;

    assert_eq!(second["instructions"], Value::Null);
    let requests = gw.model.requests();
    assert_eq!(
        messages(&requests[1]),
        &vec![
            json!({"role": "user", "content": "Capital of France?"}),
            json!({"role": "assistant", "content": "Paris."}),
            json!({"role": "user", "content": "Its population?"}),
        ]
    );
}

#[tokio::test]
async fn a_client_replaying_history_with_foreign_ids_and_mcp_calls_is_accepted() {
    let (gw, tenant) = gateway().await;
    gw.model.push(Reply::text("replayed"));

    let body = create_ok(
        &gw,
        &tenant.key,
        json!({"model": "mock", "tools": [lookup_tool()], "input": [
            {"role": "user", "content": "hi"},
            {"type": "mcp_call", "id": "mcp_elsewhere", "call_id": "call_srv", "server_label": "gateway",
             "name": "add", "arguments": "{\"a\":1,\"b\":1}", "output": "{\"sum\":2}", "error": null},
            {"type": "function_call", "id": "fc_elsewhere", "call_id": "call_cli", "name": "lookup",
             "arguments": "{\"word\":\"x\"}", "status": "completed"},
            {"type": "function_call_output", "call_id": "call_cli", "output": "found"}
        ]}),
    )
    .await;

    assert_eq!(body["status"], "completed", "{body:#}");
    let request = &gw.model.requests()[0];
    assert_eq!(tool_result(request, "call_srv"), "{\"sum\":2}");
    assert_eq!(tool_result(request, "call_cli"), "found");
    assert_calls_paired(request);
    let listed = input_items(&gw, &tenant.key, &id_of(&body), "?order=asc").await;
    let ids: Vec<&str> = listed.body["data"]
        .as_array()
        .expect("data")
        .iter()
        .filter_map(|i| i["id"].as_str())
        .collect();
    assert_eq!(ids.len(), 4, "{:#}", listed.body);
    assert_eq!(ids[1], "mcp_elsewhere");
    assert_eq!(ids[2], "fc_elsewhere");
}

#[tokio::test]
async fn a_client_output_given_as_content_parts_reaches_the_model_as_text() {
    let (gw, tenant) = gateway().await;
    gw.model.push(Reply::tool_calls(vec![Call::new(
        "lookup",
        json!({"word": "w"}),
    )
    .with_id("call_parts")]));
    gw.model.push(Reply::text("thanks"));
    let first = create_ok(
        &gw,
        &tenant.key,
        json!({"model": "mock", "input": "look", "tools": [lookup_tool()]}),
    )
    .await;

    create_ok(
        &gw,
        &tenant.key,
        json!({"model": "mock", "previous_response_id": id_of(&first), "tools": [lookup_tool()], "input": [
            {"type": "function_call_output", "call_id": "call_parts",
             "output": [{"type": "input_text", "text": "part one, "}, {"type": "input_text", "text": "part two"}]}
        ]}),
    )
    .await;

    assert_eq!(
        tool_result(&gw.model.requests()[1], "call_parts"),
        "part one, part two"
    );
}

#[tokio::test]
async fn input_items_reusing_ids_of_the_context_or_of_each_other_are_accepted_with_unique_ids() {
    let (gw, tenant) = gateway().await;
    gw.model.push(Reply::text("first"));
    gw.model.push(Reply::text("second"));
    let first = create_ok(
        &gw,
        &tenant.key,
        json!({"model": "mock", "input": [
            {"role": "user", "id": "msg_same", "content": "a"},
            {"role": "user", "id": "msg_same", "content": "b"}
        ]}),
    )
    .await;
    let output_id = id_of(&first["output"][0]);

    let second = create_ok(
        &gw,
        &tenant.key,
        json!({"model": "mock", "previous_response_id": id_of(&first), "input": [
            {"type": "message", "role": "assistant", "id": output_id, "content": "first"},
            {"role": "user", "id": "msg_same", "content": "c"}
        ]}),
    )
    .await;

    let listed = input_items(&gw, &tenant.key, &id_of(&second), "?order=asc").await;
    let data = listed.body["data"].as_array().expect("data");
    assert_eq!(data.len(), 5, "{:#}", listed.body);
    let mut ids: Vec<&str> = data.iter().filter_map(|i| i["id"].as_str()).collect();
    assert_eq!(ids[0], "msg_same", "the first use of a client id is kept");
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), 5, "every listed id is unique: {:#}", listed.body);
}
