//! Anthropic Messages and native Responses upstreams (SPEC 8): the same scripted mock model answers in each
//! provider's shape; every test checks what the client got and what the upstream was sent, in its own shape.

use crate::common::sse::{check_stream, post_stream};
use crate::common::*;
use gateway_e2e::{items_of, Tenant, TestGateway};
use gateway_testkit::{Call, Reply, StreamMode};
use reqwest::Method;
use serde_json::{json, Value};

/// The upstream key the provider deployments are created with.
const UPSTREAM_KEY: &str = "upstream-key-123";

/// Adds deployment `name` of `kind` on the mock model (with its own base URL convention) to the tenant's group.
pub async fn add_provider(
    gw: &TestGateway,
    tenant: &Tenant,
    name: &str,
    kind: &str,
    extra: Value,
) -> Value {
    let base_url = match kind {
        "anthropic" => gw.model.root_url(),
        _ => gw.model.base_url(),
    };
    let mut body = json!({"name": name, "provider": {"kind": kind, "base_url": base_url, "model": format!("{kind}-model"), "api_key": UPSTREAM_KEY}});
    if let (Value::Object(body), Value::Object(extra)) = (&mut body, extra) {
        body.extend(extra);
    }
    let deployment = gw.admin_ok(Method::POST, "/deployments", Some(body)).await;
    let id = deployment["id"].as_str().expect("deployment id");
    gw.admin_ok(
        Method::PUT,
        &format!("/deployment_groups/{}/deployments/{id}", tenant.group_id),
        None,
    )
    .await;
    deployment
}

/// A gateway whose tenant sees the `add` and `fail` tools and a `claude` (anthropic) deployment.
async fn claude() -> (TestGateway, Tenant) {
    let (gw, tenant) = gateway_with_tools(&["add", "fail"]).await;
    add_provider(&gw, &tenant, "claude", "anthropic", json!({})).await;
    (gw, tenant)
}

fn lookup_tool() -> Value {
    json!({"type": "function", "name": "lookup", "description": "Look a word up.",
        "parameters": {"type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"]}})
}

/// The blocks of the message at `index` of an Anthropic request, as `type` or `type:detail`.
fn blocks(request: &Value, index: usize) -> Vec<String> {
    request["messages"][index]["content"]
        .as_array()
        .unwrap_or_else(|| panic!("no content at {index}: {request:#}"))
        .iter()
        .map(|b| match b["type"].as_str().unwrap_or_default() {
            "text" => format!("text:{}", b["text"].as_str().unwrap_or_default()),
            "tool_use" => format!(
                "tool_use:{}:{}:{}",
                b["id"].as_str().unwrap_or_default(),
                b["name"].as_str().unwrap_or_default(),
                b["input"]
            ),
            "tool_result" => format!(
                "tool_result:{}:{}{}",
                b["tool_use_id"].as_str().unwrap_or_default(),
                b["content"].as_str().unwrap_or_default(),
                if b["is_error"] == true { ":error" } else { "" }
            ),
            "thinking" => format!(
                "thinking:{}:{}",
                b["thinking"].as_str().unwrap_or_default(),
                b["signature"].as_str().unwrap_or_default()
            ),
            other => other.to_owned(),
        })
        .collect()
}

fn roles(request: &Value) -> Vec<String> {
    request["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|m| m["role"].as_str().unwrap_or_default().to_owned())
        .collect()
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
}

#[tokio::test]
async fn anthropic_text_goes_with_system_max_tokens_and_its_own_headers() {
    let (gw, tenant) = claude().await;
    gw.model
        .push(Reply::text("Hello from Claude").with_usage(12, 4));

    let body = create_ok(
        &gw,
        &tenant.key,
        json!({"model": "claude", "instructions": "Be brief.", "input": "hi"}),
    )
    .await;

    assert_eq!(body["status"], "completed", "{body:#}");
    assert_eq!(body["output_text"], "Hello from Claude");
    assert_eq!(body["model"], "claude");
    assert_eq!(body["usage"]["input_tokens"], 12);
    assert_eq!(body["usage"]["output_tokens"], 4);
    let request = &gw.model.requests()[0];
    assert_eq!(request["model"], "anthropic-model");
    assert_eq!(request["system"], "Be brief.");
    assert_eq!(
        request["max_tokens"], 4096,
        "the default when the request sets none"
    );
    assert_eq!(
        request["messages"],
        json!([{"role": "user", "content": [{"type": "text", "text": "hi"}]}])
    );
    let headers = &gw.model.request_headers()[0];
    assert_eq!(header(headers, "x-api-key"), Some(UPSTREAM_KEY));
    assert_eq!(header(headers, "anthropic-version"), Some("2023-06-01"));
    assert_eq!(header(headers, "authorization"), None);
}

#[tokio::test]
async fn an_anthropic_server_tool_round_and_parallel_batch_pair_tool_use_with_tool_result() {
    let (gw, tenant) = claude().await;
    gw.model.push(Reply::text_and_tool_calls(
        "Adding.",
        vec![
            Call::new("add", json!({"a": 1, "b": 2})).with_id("toolu_1"),
            Call::new("fail", json!({})).with_id("toolu_2"),
        ],
    ));
    gw.model.push(Reply::text("3, and one failed"));

    let body = create_ok(
        &gw,
        &tenant.key,
        json!({"model": "claude", "input": "add and fail", "max_output_tokens": 300}),
    )
    .await;

    assert_eq!(body["output_text"], "Adding.3, and one failed", "{body:#}");
    assert_eq!(items_of(&body, "mcp_call").len(), 2);
    let requests = gw.model.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(requests[0]["max_tokens"], 300);
    let offered: Vec<&str> = requests[0]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(offered, ["add", "fail"]);
    assert!(requests[0]["tools"][0]["input_schema"].is_object());
    let second = &requests[1];
    assert_eq!(roles(second), ["user", "assistant", "user"]);
    assert_eq!(
        blocks(second, 1),
        [
            "text:Adding.",
            "tool_use:toolu_1:add:{\"a\":1,\"b\":2}",
            "tool_use:toolu_2:fail:{}"
        ]
    );
    let results = blocks(second, 2);
    assert_eq!(results.len(), 2, "{results:?}");
    assert_eq!(results[0], "tool_result:toolu_1:{\"sum\":3}");
    assert!(
        results[1].starts_with("tool_result:toolu_2:{\"error\"") && results[1].ends_with(":error"),
        "a failed tool is an is_error result: {results:?}"
    );
}

#[tokio::test]
async fn an_anthropic_client_tool_is_handed_back_and_continued_with_its_output() {
    let (gw, tenant) = claude().await;
    gw.model.push(Reply::tool_calls(vec![
        Call::new("lookup", json!({"word": "gateway"})).with_id("toolu_c"),
        Call::new("add", json!({"a": 2, "b": 2})).with_id("toolu_s"),
    ]));
    gw.model.push(Reply::text("A gateway is a door; 4."));

    let first = create_ok(
        &gw,
        &tenant.key,
        json!({"model": "claude", "input": "define gateway, add 2+2", "tools": [lookup_tool()]}),
    )
    .await;
    let handed: Vec<&Value> = items_of(&first, "function_call");
    assert_eq!(
        handed.len(),
        2,
        "a mixed batch is handed back whole: {first:#}"
    );
    assert_eq!(handed[0]["call_id"], "toolu_c");

    let second = create_ok(
        &gw,
        &tenant.key,
        json!({"model": "claude", "previous_response_id": id_of(&first), "tools": [lookup_tool()],
               "input": [{"type": "function_call_output", "call_id": "toolu_c", "output": "a door"},
                         {"type": "function_call_output", "call_id": "toolu_s", "output": "{\"sum\":4}"}]}),
    )
    .await;

    assert_eq!(second["output_text"], "A gateway is a door; 4.");
    let request = &gw.model.requests()[1];
    assert_eq!(roles(request), ["user", "assistant", "user"]);
    let mut uses = blocks(request, 1);
    uses.sort();
    assert_eq!(
        uses,
        [
            "tool_use:toolu_c:lookup:{\"word\":\"gateway\"}",
            "tool_use:toolu_s:add:{\"a\":2,\"b\":2}"
        ]
    );
    let mut results = blocks(request, 2);
    results.sort();
    assert_eq!(
        results,
        [
            "tool_result:toolu_c:a door",
            "tool_result:toolu_s:{\"sum\":4}"
        ]
    );
}

/// The items of a response as `(type, text or name)`, ignoring ids.
fn shape(response: &Value) -> Vec<(String, String)> {
    response["output"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            let detail = match i["type"].as_str().unwrap() {
                "message" => i["content"][0]["text"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                "reasoning" => i["summary"][0]["text"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                _ => format!(
                    "{}:{}",
                    i["name"].as_str().unwrap_or_default(),
                    i["output"].as_str().unwrap_or_default()
                ),
            };
            (i["type"].as_str().unwrap().to_owned(), detail)
        })
        .collect()
}

fn script_round(gw: &TestGateway, mode: StreamMode) {
    gw.model.push(
        Reply::tool_calls(vec![
            Call::new("add", json!({"a": 1, "b": 1})).with_id("toolu_a"),
            Call::new("add", json!({"a": 2, "b": 2})).with_id("toolu_b"),
        ])
        .with_thinking("Two sums.", "SIG_1")
        .stream_mode(mode),
    );
    gw.model
        .push(Reply::text("2 and 4, done.").stream_mode(mode));
}

/// A streamed tool round over `model` gives the same output, usage and upstream requests as a whole one.
pub async fn streaming_equals_whole(gw: &TestGateway, tenant: &Tenant, model: &str) {
    let request = json!({"model": model, "input": "two sums"});
    script_round(gw, StreamMode::Normal);
    let whole = create_ok(gw, &tenant.key, request.clone()).await;
    // The upstream numbers its reasoning items per answer: their ids differ between the two runs.
    let without_reasoning_ids = |mut requests: Vec<Value>| {
        for request in &mut requests {
            request.as_object_mut().unwrap().remove("stream");
            for item in request["input"].as_array_mut().into_iter().flatten() {
                if item["type"] == "reasoning" {
                    item.as_object_mut().unwrap().remove("id");
                }
            }
        }
        requests
    };
    let whole_requests = without_reasoning_ids(gw.model.requests());
    gw.model.reset();
    script_round(gw, StreamMode::Normal);

    let checked = check_stream(post_stream(gw, &tenant.key, request).await);

    assert_eq!(checked.terminal_kind(), "response.completed");
    assert_eq!(
        shape(&checked.terminal),
        shape(&whole),
        "{:#}",
        checked.terminal
    );
    assert_eq!(checked.terminal["usage"], whole["usage"]);
    let stored = get_response(gw, &tenant.key, &checked.id()).await;
    assert_eq!(stored.body, checked.terminal);
    let streamed_requests = without_reasoning_ids(gw.model.requests());
    assert_eq!(
        streamed_requests, whole_requests,
        "the same requests, streamed or not"
    );
}

#[tokio::test]
async fn an_anthropic_stream_equals_the_whole_answer() {
    let (gw, tenant) = claude().await;
    streaming_equals_whole(&gw, &tenant, "claude").await;
    let text_deltas = gw.model.requests().len();
    assert_eq!(text_deltas, 2);
}

#[tokio::test]
async fn anthropic_thinking_is_replayed_unchanged_on_turn_two_and_dropped_for_chat() {
    let (gw, tenant) = claude().await;
    gw.model
        .push(Reply::text("42").with_thinking("Deep thought.", "SIG_deep"));
    gw.model.push(Reply::text("Still 42."));
    gw.model.push(Reply::text("Chat says 42."));

    let first = create_ok(
        &gw,
        &tenant.key,
        json!({"model": "claude", "input": "answer?"}),
    )
    .await;
    let reasoning = items_of(&first, "reasoning");
    assert_eq!(reasoning.len(), 1, "{first:#}");
    assert_eq!(reasoning[0]["summary"][0]["text"], "Deep thought.");
    assert!(
        reasoning[0].get("encrypted_content").is_none(),
        "shown only when included: {first:#}"
    );
    let second = create_ok(
        &gw,
        &tenant.key,
        json!({"model": "claude", "previous_response_id": id_of(&first), "input": "sure?",
               "include": ["reasoning.encrypted_content"]}),
    )
    .await;
    let third = create_ok(
        &gw,
        &tenant.key,
        json!({"model": "mock", "previous_response_id": id_of(&second), "input": "chat?"}),
    )
    .await;
    assert_eq!(third["output_text"], "Chat says 42.");

    let requests = gw.model.requests();
    assert_eq!(roles(&requests[1]), ["user", "assistant", "user"]);
    assert_eq!(
        blocks(&requests[1], 1),
        ["thinking:Deep thought.:SIG_deep", "text:42"],
        "the thinking block first, with its signature"
    );
    let chat = requests[2].to_string();
    assert!(
        !chat.contains("SIG_deep") && !chat.contains("Deep thought"),
        "{chat}"
    );
    assert_eq!(second["output_text"], "Still 42.");
}

#[tokio::test]
async fn an_overloaded_anthropic_upstream_is_retried_and_a_400_is_passed_on() {
    let (gw, tenant) = claude().await;
    gw.model.push(Reply::error(529, "Overloaded"));
    gw.model.push(Reply::error(429, "Rate limited"));
    gw.model.push(Reply::text("made it"));

    let body = create_ok(&gw, &tenant.key, json!({"model": "claude", "input": "hi"})).await;
    assert_eq!(body["output_text"], "made it");
    assert_eq!(gw.model.requests().len(), 3);

    gw.model.push(Reply::error(
        400,
        "prompt is too long: 250000 tokens > 200000 maximum",
    ));
    let answer = gw
        .create(&tenant.key, json!({"model": "claude", "input": "too long"}))
        .await;
    assert_error(&answer, 400, None, Some("upstream_rejected"));
    assert!(answer.error()["message"]
        .as_str()
        .unwrap()
        .contains("prompt is too long: 250000 tokens > 200000 maximum"));
    assert_eq!(gw.model.requests().len(), 4, "not retried");
}

#[tokio::test]
async fn an_anthropic_error_event_mid_stream_fails_the_streamed_response() {
    let (gw, tenant) = claude().await;
    gw.model
        .push(Reply::text("Half an answer").stream_mode(StreamMode::ErrorMidStream));

    let checked = check_stream(
        post_stream(&gw, &tenant.key, json!({"model": "claude", "input": "hi"})).await,
    );

    assert_eq!(checked.terminal_kind(), "response.failed");
    assert_eq!(checked.error_event().unwrap()["code"], "server_error");
    assert_eq!(gw.model.requests().len(), 1, "text was shown: no retry");
}

// ---- openai_responses ----------------------------------------------------------------------------------

/// A gateway whose tenant sees the `add` tool and an `oai` (openai_responses) deployment.
async fn oai() -> (TestGateway, Tenant) {
    let (gw, tenant) = gateway_with_tools(&["add"]).await;
    add_provider(&gw, &tenant, "oai", "openai_responses", json!({})).await;
    (gw, tenant)
}

/// The input items of a Responses request as `type:detail`.
fn input_items(request: &Value) -> Vec<String> {
    request["input"]
        .as_array()
        .unwrap_or_else(|| panic!("no input: {request:#}"))
        .iter()
        .map(|i| match i["type"].as_str().unwrap_or_default() {
            "message" => format!(
                "message:{}:{}",
                i["role"].as_str().unwrap_or_default(),
                match &i["content"] {
                    Value::String(s) => s.clone(),
                    other => other[0]["text"].as_str().unwrap_or_default().to_owned(),
                }
            ),
            "function_call" => format!(
                "function_call:{}:{}:{}",
                i["call_id"].as_str().unwrap_or_default(),
                i["name"].as_str().unwrap_or_default(),
                i["arguments"].as_str().unwrap_or_default()
            ),
            "function_call_output" => format!(
                "function_call_output:{}:{}",
                i["call_id"].as_str().unwrap_or_default(),
                i["output"].as_str().unwrap_or_default()
            ),
            "reasoning" => format!(
                "reasoning:{}:{}",
                i["id"].as_str().unwrap_or_default(),
                i["encrypted_content"].as_str().unwrap_or_default()
            ),
            other => other.to_owned(),
        })
        .collect()
}

#[tokio::test]
async fn a_responses_upstream_is_called_statelessly_and_its_tool_round_pairs_items() {
    let (gw, tenant) = oai().await;
    gw.model.push(Reply::tool_calls(vec![
        Call::new("add", json!({"a": 1, "b": 2})).with_id("call_1"),
        Call::new("add", json!({"a": 3, "b": 4})).with_id("call_2"),
    ]));
    gw.model.push(Reply::text("3 and 7"));

    let body = create_ok(
        &gw,
        &tenant.key,
        json!({"model": "oai", "instructions": "Be brief.", "input": "two sums"}),
    )
    .await;

    assert_eq!(body["output_text"], "3 and 7", "{body:#}");
    assert_eq!(items_of(&body, "mcp_call").len(), 2);
    let requests = gw.model.requests();
    assert_eq!(requests[0]["store"], false);
    assert_eq!(
        requests[0]["include"],
        json!(["reasoning.encrypted_content"])
    );
    assert_eq!(requests[0]["instructions"], "Be brief.");
    assert_eq!(requests[0]["tools"][0]["type"], "function");
    assert_eq!(
        input_items(&requests[1]),
        [
            "message:user:two sums",
            "function_call:call_1:add:{\"a\":1,\"b\":2}",
            "function_call:call_2:add:{\"a\":3,\"b\":4}",
            "function_call_output:call_1:{\"sum\":3}",
            "function_call_output:call_2:{\"sum\":7}",
        ],
        "the whole input, every step"
    );
    let headers = &gw.model.request_headers()[0];
    assert_eq!(
        header(headers, "authorization"),
        Some(format!("Bearer {UPSTREAM_KEY}").as_str())
    );
}

#[tokio::test]
async fn a_responses_stream_equals_the_whole_answer() {
    let (gw, tenant) = oai().await;
    streaming_equals_whole(&gw, &tenant, "oai").await;
}

#[tokio::test]
async fn responses_reasoning_is_replayed_with_its_encrypted_content_and_errors_map() {
    let (gw, tenant) = oai().await;
    gw.model
        .push(Reply::text("42").with_thinking("pondering", "gAAAA-enc"));
    gw.model.push(Reply::error(503, "busy"));
    gw.model.push(Reply::text("Yes, 42."));

    let first = create_ok(
        &gw,
        &tenant.key,
        json!({"model": "oai", "input": "answer?", "include": ["reasoning.encrypted_content"]}),
    )
    .await;
    let reasoning = items_of(&first, "reasoning");
    assert_eq!(reasoning[0]["summary"][0]["text"], "pondering", "{first:#}");
    assert!(
        reasoning[0]["encrypted_content"]
            .as_str()
            .is_some_and(|c| c.ends_with("gAAAA-enc")),
        "included when asked: {first:#}"
    );
    let second = create_ok(
        &gw,
        &tenant.key,
        json!({"model": "oai", "previous_response_id": id_of(&first), "input": "sure?"}),
    )
    .await;
    assert_eq!(second["output_text"], "Yes, 42.");
    let requests = gw.model.requests();
    assert_eq!(requests.len(), 3, "the 503 was retried");
    assert_eq!(
        input_items(&requests[2]),
        [
            "message:user:answer?",
            "reasoning:rs_mock_1:gAAAA-enc",
            "message:assistant:42",
            "message:user:sure?"
        ]
    );

    gw.model
        .push(Reply::error(400, "Invalid schema for function 'add'"));
    let answer = gw
        .create(&tenant.key, json!({"model": "oai", "input": "x"}))
        .await;
    assert_error(&answer, 400, None, Some("upstream_rejected"));
    assert!(answer.error()["message"]
        .as_str()
        .unwrap()
        .contains("Invalid schema for function 'add'"));
}

// ---- across providers ---------------------------------------------------------------------------------

#[tokio::test]
async fn a_chain_across_chat_anthropic_and_responses_pairs_every_call_in_each_providers_shape() {
    let (gw, tenant) = gateway_with_tools(&["add"]).await;
    add_provider(&gw, &tenant, "claude", "anthropic", json!({})).await;
    add_provider(&gw, &tenant, "oai", "openai_responses", json!({})).await;
    // Turn 1, Chat: a server tool, and a call without an id (synthesised).
    gw.model.push(Reply::tool_calls(vec![Call::new(
        "add",
        json!({"a": 1, "b": 1}),
    )
    .without_id()]));
    gw.model.push(Reply::text("2."));
    // Turn 2, Anthropic: thinking, a server tool.
    gw.model.push(
        Reply::tool_calls(vec![
            Call::new("add", json!({"a": 2, "b": 2})).with_id("toolu_2")
        ])
        .with_thinking("Again.", "SIG_2"),
    );
    gw.model.push(Reply::text("4."));
    // Turn 3, Responses.
    gw.model.push(Reply::text("All done."));

    let first = create_ok(&gw, &tenant.key, json!({"model": "mock", "input": "1+1"})).await;
    let synthesised = items_of(&first, "mcp_call")[0]["call_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let second = create_ok(
        &gw,
        &tenant.key,
        json!({"model": "claude", "previous_response_id": id_of(&first), "input": "2+2"}),
    )
    .await;
    let third = create_ok(
        &gw,
        &tenant.key,
        json!({"model": "oai", "previous_response_id": id_of(&second), "input": "done?"}),
    )
    .await;
    assert_eq!(third["output_text"], "All done.");

    let requests = gw.model.requests();
    assert_eq!(requests.len(), 5);
    // Anthropic saw turn 1's call and result as tool_use / tool_result under the synthesised id.
    let anthropic_first = &requests[2];
    assert_eq!(
        roles(anthropic_first),
        ["user", "assistant", "user", "assistant", "user"]
    );
    assert_eq!(
        blocks(anthropic_first, 1),
        [format!("tool_use:{synthesised}:add:{{\"a\":1,\"b\":1}}")]
    );
    assert_eq!(
        blocks(anthropic_first, 2),
        [format!("tool_result:{synthesised}:{{\"sum\":2}}")]
    );
    // The Responses upstream saw both turns' calls and results as items, and no Anthropic thinking.
    let items = input_items(&requests[4]);
    assert_eq!(
        items,
        [
            "message:user:1+1".to_owned(),
            format!("function_call:{synthesised}:add:{{\"a\":1,\"b\":1}}"),
            format!("function_call_output:{synthesised}:{{\"sum\":2}}"),
            "message:assistant:2.".to_owned(),
            "message:user:2+2".to_owned(),
            "function_call:toolu_2:add:{\"a\":2,\"b\":2}".to_owned(),
            "function_call_output:toolu_2:{\"sum\":4}".to_owned(),
            "message:assistant:4.".to_owned(),
            "message:user:done?".to_owned(),
        ]
    );
    assert!(!requests[4].to_string().contains("SIG_2"));
}

// ---- fallbacks and deployment settings ------------------------------------------------------------------

/// The deployment each model step recorded as having answered, when a fallback did.
async fn answered_by(gw: &TestGateway, tenant: &Tenant, response_id: &str) -> Vec<Option<String>> {
    gw.store
        .load_steps(&tenant.project_id, response_id)
        .await
        .unwrap()
        .into_iter()
        .filter_map(|s| s.model().map(|m| m.deployment.clone()))
        .collect()
}

#[tokio::test]
async fn a_fallback_takes_over_when_the_deployment_fails_after_its_retries() {
    let (gw, tenant) = gateway().await;
    // `claude` falls back to `mock` (chat), which need not be in the project's groups.
    let _ = add_provider(
        &gw,
        &tenant,
        "claude",
        "anthropic",
        json!({"fallbacks": ["mock"]}),
    )
    .await;
    for _ in 0..3 {
        gw.model.push(Reply::error(529, "Overloaded"));
    }
    gw.model.push(Reply::text("from the fallback"));

    let body = create_ok(&gw, &tenant.key, json!({"model": "claude", "input": "hi"})).await;

    assert_eq!(body["status"], "completed", "{body:#}");
    assert_eq!(body["output_text"], "from the fallback");
    assert_eq!(
        body["model"], "claude",
        "the response keeps the model asked for"
    );
    let requests = gw.model.requests();
    assert_eq!(requests.len(), 4, "three attempts, then the fallback");
    assert!(
        requests[2].get("max_tokens").is_some(),
        "an Anthropic request"
    );
    assert_eq!(
        requests[3]["messages"][0]["content"], "hi",
        "a Chat request"
    );
    assert_eq!(
        answered_by(&gw, &tenant, &id_of(&body)).await,
        [Some("mock".to_owned())]
    );

    // A rejection is not passed on: the fallback would refuse it too.
    gw.model.reset();
    gw.model.push(Reply::error(400, "bad input"));
    gw.model.push(Reply::text("never used"));
    let answer = gw
        .create(&tenant.key, json!({"model": "claude", "input": "x"}))
        .await;
    assert_error(&answer, 400, None, Some("upstream_rejected"));
    assert_eq!(gw.model.requests().len(), 1);
}

#[tokio::test]
async fn no_fallback_once_streamed_text_reached_the_client() {
    let (gw, tenant) = gateway().await;
    let _ = add_provider(
        &gw,
        &tenant,
        "claude",
        "anthropic",
        json!({"fallbacks": ["mock"]}),
    )
    .await;
    gw.model
        .push(Reply::text("Half an answer").stream_mode(StreamMode::CutMidStream));
    gw.model.push(Reply::text("never used"));

    let checked = check_stream(
        post_stream(&gw, &tenant.key, json!({"model": "claude", "input": "hi"})).await,
    );

    assert_eq!(checked.terminal_kind(), "response.failed");
    assert_eq!(gw.model.requests().len(), 1);
}

#[tokio::test]
async fn deployment_settings_are_validated_shown_and_used() {
    let (gw, tenant) = gateway().await;
    let created = add_provider(
        &gw,
        &tenant,
        "claude",
        "anthropic",
        json!({"fallbacks": ["mock"], "unsupported_tools": "reject", "provider": {"kind": "anthropic",
               "base_url": gw.model.root_url(), "model": "c", "max_tokens": 1234}}),
    )
    .await;
    assert_eq!(created["fallbacks"], json!(["mock"]));
    assert_eq!(created["unsupported_tools"], "reject");
    assert_eq!(created["provider"]["max_tokens"], 1234);
    let id = created["id"].as_str().unwrap();
    let read = gw
        .admin_ok(Method::GET, &format!("/deployments/{id}"), None)
        .await;
    assert_eq!(read, created);

    gw.model.push(Reply::text("ok"));
    create_ok(&gw, &tenant.key, json!({"model": "claude", "input": "hi"})).await;
    assert_eq!(gw.model.requests()[0]["max_tokens"], 1234);

    let patched = gw
        .admin_ok(
            Method::PATCH,
            &format!("/deployments/{id}"),
            Some(json!({"fallbacks": [], "unsupported_tools": "ignore", "provider": {"max_tokens": null}})),
        )
        .await;
    assert_eq!(patched["fallbacks"], json!([]));
    assert_eq!(patched["unsupported_tools"], "ignore");
    assert_eq!(patched["provider"]["max_tokens"], 4096);

    let bad = [
        (json!({"fallbacks": ["nope"]}), "fallbacks[0]"),
        (json!({"fallbacks": ["claude"]}), "fallbacks[0]"),
        (json!({"fallbacks": ["mock", "mock"]}), "fallbacks[1]"),
        (json!({"unsupported_tools": "explode"}), "unsupported_tools"),
        (
            json!({"provider": {"max_tokens": 0}}),
            "provider.max_tokens",
        ),
    ];
    for (body, param) in bad {
        let answer = gw
            .call(
                gw.admin(Method::PATCH, &format!("/deployments/{id}"))
                    .json(&body),
            )
            .await;
        assert_error(&answer, 400, Some(param), Some("invalid_value"));
    }
    let read = gw
        .admin_ok(Method::GET, &format!("/deployments/{id}"), None)
        .await;
    assert_eq!(read, patched, "a refused change changes nothing");
}
