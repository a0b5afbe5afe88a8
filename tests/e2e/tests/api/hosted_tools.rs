//! Hosted tool types bound to tool sources (SPEC 12): a source with `hosted_type: "web_search"` serves the
//! `web_search` tool a request declares; the client sees `web_search_call` items, the model the tool's output.

use crate::common::sse::{assert_replay_equals_stream, check_stream, post_stream};
use crate::common::*;
use gateway_e2e::{items_of, Tenant, TestGateway};
use gateway_testkit::{Call, Reply};
use reqwest::Method;
use serde_json::{json, Value};

/// Binds the testkit's `echo` tool (which answers with its arguments) to `web_search` in `group_id`.
async fn bind_web_search(gw: &TestGateway, group_id: &str) {
    gw.attach_tool_with(
        group_id,
        "echo",
        json!({"hosted_type": "web_search", "description": "Search the web.",
               "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}),
    )
    .await;
}

async fn gateway_with_web_search() -> (TestGateway, Tenant) {
    let (gw, tenant) = gateway().await;
    bind_web_search(&gw, &tenant.group_id).await;
    (gw, tenant)
}

fn search_call(query: &str, call_id: &str) -> Reply {
    Reply::tool_calls(vec![
        Call::new("web_search", json!({"query": query})).with_id(call_id)
    ])
}

fn declaring_web_search(input: &str) -> Value {
    json!({"model": "mock", "input": input, "tools": [{"type": "web_search"}]})
}

#[tokio::test]
async fn a_declared_web_search_runs_the_bound_source_and_shows_a_web_search_call() {
    let (gw, tenant) = gateway_with_web_search().await;
    gw.model.push(search_call("rust gateways", "call_ws"));
    gw.model.push(Reply::text("Here is what I found."));

    let body = create_ok(&gw, &tenant.key, declaring_web_search("search")).await;

    // The model is offered the hosted type's name with the source's description and parameters.
    let requests = gw.model.requests();
    assert_eq!(offered_tools(&requests[0]), ["web_search"]);
    let offered = &requests[0]["tools"][0]["function"];
    assert_eq!(offered["description"], "Search the web.");
    assert_eq!(offered["parameters"]["required"], json!(["query"]));
    // The bound tool ran with the model's arguments.
    let calls = gw.tools.calls();
    assert_eq!(calls.len(), 1, "{calls:#?}");
    assert_eq!(calls[0].tool, "echo");
    assert_eq!(calls[0].body, json!({"query": "rust gateways"}));
    // The client sees a web_search_call, then the message; no mcp_call, nothing ignored.
    assert_eq!(body["status"], "completed", "{body:#}");
    let output = body["output"].as_array().expect("output");
    assert_eq!(output.len(), 2, "{body:#}");
    let id = output[0]["id"].as_str().expect("id");
    assert!(id.starts_with("ws_"), "{body:#}");
    assert_eq!(
        output[0],
        json!({"id": id, "type": "web_search_call", "status": "completed",
               "action": {"type": "search", "query": "rust gateways"}})
    );
    assert_eq!(output[1]["type"], "message");
    assert_eq!(body["output_text"], "Here is what I found.");
    assert!(items_of(&body, "mcp_call").is_empty(), "{body:#}");
    assert!(
        body["metadata"].get("gateway_ignored_tools").is_none(),
        "{body:#}"
    );
    // The model saw the tool's output as the call's result.
    assert!(
        tool_result(&requests[1], "call_ws").contains("rust gateways"),
        "{:#}",
        requests[1]
    );
    assert_calls_paired(&requests[1]);

    // Retrieved, the stored response shows the same.
    let stored = gw
        .call(gw.public(
            Method::GET,
            &format!("/responses/{}", id_of(&body)),
            &tenant.key,
        ))
        .await;
    assert_eq!(stored.body["output"], body["output"]);
}

#[tokio::test]
async fn a_continuation_after_a_web_search_call_gives_the_model_the_call_and_its_result() {
    let (gw, tenant) = gateway_with_web_search().await;
    gw.model.push(search_call("weather in Oslo", "call_ws"));
    gw.model.push(Reply::text("It is cold."));
    gw.model.push(Reply::text("Bring a coat."));
    let first = create_ok(&gw, &tenant.key, declaring_web_search("weather?")).await;
    assert_eq!(first["output"][0]["type"], "web_search_call", "{first:#}");

    let second = create_ok(
        &gw,
        &tenant.key,
        json!({"model": "mock", "previous_response_id": id_of(&first), "input": "what should I wear?",
               "tools": [{"type": "web_search"}]}),
    )
    .await;
    assert_eq!(second["output_text"], "Bring a coat.", "{second:#}");
    let requests = gw.model.requests();
    let request = &requests[2];
    let calls = assistant_tool_calls(request);
    assert_eq!(calls.len(), 1, "{request:#}");
    assert_eq!(calls[0].0, "call_ws");
    assert_eq!(calls[0].1, "web_search");
    assert_eq!(parse(&calls[0].2), json!({"query": "weather in Oslo"}));
    assert!(tool_result(request, "call_ws").contains("weather in Oslo"));
    assert_calls_paired(request);
}

#[tokio::test]
async fn a_web_search_call_sent_back_as_history_stands_for_the_stored_call_and_its_result() {
    let (gw, tenant) = gateway_with_web_search().await;
    gw.model.push(search_call("weather in Oslo", "call_ws"));
    gw.model.push(Reply::text("It is cold."));
    gw.model.push(Reply::text("Bring a coat."));
    let first = create_ok(&gw, &tenant.key, declaring_web_search("weather?")).await;

    // A stateless client sends the whole history back, the output items as it was shown them.
    let mut input = vec![json!({"role": "user", "content": "weather?"})];
    input.extend(first["output"].as_array().expect("output").iter().cloned());
    input.push(json!({"role": "user", "content": "what should I wear?"}));
    let second = create_ok(
        &gw,
        &tenant.key,
        json!({"model": "mock", "input": input, "tools": [{"type": "web_search"}]}),
    )
    .await;
    assert_eq!(second["output_text"], "Bring a coat.", "{second:#}");
    let requests = gw.model.requests();
    let request = &requests[2];
    let calls = assistant_tool_calls(request);
    assert_eq!(calls.len(), 1, "{request:#}");
    assert_eq!(calls[0].1, "web_search");
    assert!(tool_result(request, "call_ws").contains("weather in Oslo"));
    assert_calls_paired(request);
    // Listed back, the input shows the hosted item as the client sent it.
    let listed = gw
        .call(gw.public(
            Method::GET,
            &format!("/responses/{}/input_items?order=asc", id_of(&second)),
            &tenant.key,
        ))
        .await;
    assert_eq!(
        listed.body["data"][1], first["output"][0],
        "{:#}",
        listed.body
    );
}

#[tokio::test]
async fn a_streamed_web_search_call_shows_openai_s_events_in_order_and_replays_the_same() {
    let (gw, tenant) = gateway_with_web_search().await;
    gw.model.push(search_call("rust", "call_ws"));
    gw.model.push(Reply::text("Found it."));
    let checked = check_stream(post_stream(&gw, &tenant.key, declaring_web_search("search")).await);
    assert_eq!(checked.item_kinds(), ["web_search_call", "message"]);
    let search = &checked.items[0];
    assert_eq!(search.added["type"], "web_search_call");
    assert_eq!(search.added["status"], "in_progress");
    // The events after `output_item.added`.
    assert_eq!(
        search.kinds(),
        [
            "response.web_search_call.in_progress",
            "response.web_search_call.searching",
            "response.web_search_call.completed",
            "response.output_item.done",
        ]
    );
    assert_eq!(search.done["action"]["query"], "rust");
    assert_eq!(search.done["status"], "completed");
    assert_replay_equals_stream(&gw, &tenant.key, &checked).await;
}

#[tokio::test]
async fn a_bound_source_is_not_offered_when_the_request_does_not_declare_its_type() {
    let (gw, tenant) = gateway_with_web_search().await;
    gw.attach_tool(&tenant.group_id, "add").await;
    gw.model.push(Reply::text("No tools needed."));
    gw.model.push(Reply::text("Still none."));
    create_ok(&gw, &tenant.key, json!({"model": "mock", "input": "hi"})).await;
    create_ok(
        &gw,
        &tenant.key,
        json!({"model": "mock", "input": "hi", "tools": [{"type": "file_search"}]}),
    )
    .await;
    let requests = gw.model.requests();
    assert_eq!(offered_tools(&requests[0]), ["add"], "{:#}", requests[0]);
    assert_eq!(offered_tools(&requests[1]), ["add"], "{:#}", requests[1]);
    assert!(gw.tools.calls().is_empty());
}

#[tokio::test]
async fn a_key_that_cannot_see_the_bound_source_gets_the_deployment_policy() {
    let (gw, owner) = gateway().await;
    // The binding lives in a second group, granted only to `owner`'s project.
    let group = gw
        .admin_ok(
            Method::POST,
            "/deployment_groups",
            Some(json!({"name": "with-search"})),
        )
        .await;
    let group_id = id_of(&group);
    gw.admin_ok(
        Method::PUT,
        &format!(
            "/deployment_groups/{group_id}/deployments/{}",
            owner.deployment_id
        ),
        None,
    )
    .await;
    gw.admin_ok(
        Method::PUT,
        &format!(
            "/deployment_groups/{group_id}/projects/{}",
            owner.project_id
        ),
        None,
    )
    .await;
    bind_web_search(&gw, &group_id).await;
    let outsider = gw.tenant("outsider").await;
    gw.model.push(Reply::text("owner"));
    gw.model.push(Reply::text("outsider"));

    let owned = create_ok(&gw, &owner.key, declaring_web_search("hi")).await;
    let outside = create_ok(&gw, &outsider.key, declaring_web_search("hi")).await;

    let requests = gw.model.requests();
    assert_eq!(offered_tools(&requests[0]), ["web_search"]);
    assert!(owned["metadata"].get("gateway_ignored_tools").is_none());
    assert!(offered_tools(&requests[1]).is_empty(), "{:#}", requests[1]);
    assert_eq!(
        outside["metadata"]["gateway_ignored_tools"], "web_search",
        "{outside:#}"
    );
}

#[tokio::test]
async fn choosing_a_bound_hosted_type_forces_its_tool_and_an_unbound_one_is_auto() {
    let (gw, tenant) = gateway_with_web_search().await;
    gw.model.push(Reply::text("forced"));
    gw.model.push(Reply::text("not bound"));
    let mut body = declaring_web_search("search");
    body["tool_choice"] = json!({"type": "web_search"});
    create_ok(&gw, &tenant.key, body).await;
    create_ok(
        &gw,
        &tenant.key,
        json!({"model": "mock", "input": "search", "tools": [{"type": "file_search"}],
               "tool_choice": {"type": "file_search"}}),
    )
    .await;
    let requests = gw.model.requests();
    assert_eq!(
        requests[0]["tool_choice"],
        json!({"type": "function", "function": {"name": "web_search"}}),
        "{:#}",
        requests[0]
    );
    assert_ne!(
        requests[1]["tool_choice"]["type"], "function",
        "{:#}",
        requests[1]
    );
}
