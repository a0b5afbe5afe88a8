//! Tool types beyond `function` (SPEC 12) and `item_reference` inputs (SPEC 5), as Codex CLI and the AI SDK
//! send them: custom tools, namespaces, hosted types under the deployment's policy.

use crate::common::sse::post_stream;
use crate::common::*;
use gateway_e2e::items_of;
use gateway_testkit::{Call, Reply};
use serde_json::{json, Value};

fn apply_patch_tool() -> Value {
    json!({"type": "custom", "name": "apply_patch", "description": "Apply a patch to files.",
           "format": {"type": "grammar", "syntax": "lark", "definition": "start: \"*** Begin Patch\" /(.|\\n)*/"}})
}

fn namespace_tool() -> Value {
    json!({"type": "namespace", "name": "mcp__fs", "description": "Files on the user's machine.", "tools": [
        {"type": "function", "name": "read_file", "description": "Read a file.",
         "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}
    ]})
}

/// The `tools` a Chat request offered, whole.
fn offered(request: &Value) -> Vec<Value> {
    request["tools"].as_array().cloned().unwrap_or_default()
}

#[tokio::test]
async fn a_custom_tool_is_offered_as_a_function_of_one_string_and_handed_back_as_custom_tool_call()
{
    let (gw, tenant) = gateway().await;
    gw.model.push(Reply::tool_calls(vec![Call::new(
        "apply_patch",
        json!({"input": "*** Begin Patch\n*** End Patch"}),
    )
    .with_id("call_patch")]));

    let first = create_ok(
        &gw,
        &tenant.key,
        json!({"model": "mock", "input": "fix it", "tools": [apply_patch_tool()]}),
    )
    .await;

    let requests = gw.model.requests();
    let tools = offered(&requests[0]);
    assert_eq!(tools.len(), 1, "{tools:#?}");
    assert_eq!(tools[0]["function"]["name"], "apply_patch");
    assert_eq!(
        tools[0]["function"]["parameters"]["properties"]["input"]["type"], "string",
        "a Chat provider sees one string parameter: {tools:#?}"
    );
    let calls = items_of(&first, "custom_tool_call");
    assert_eq!(calls.len(), 1, "{first:#}");
    assert_eq!(calls[0]["name"], "apply_patch");
    assert_eq!(calls[0]["call_id"], "call_patch");
    assert_eq!(calls[0]["input"], "*** Begin Patch\n*** End Patch");
    assert!(
        calls[0]["id"]
            .as_str()
            .is_some_and(|id| id.starts_with("ctc_")),
        "{first:#}"
    );
    assert!(items_of(&first, "function_call").is_empty(), "{first:#}");
    assert_eq!(
        first["tools"][0]["type"], "custom",
        "the response echoes the tool as declared"
    );

    gw.model.push(Reply::text("Patched."));
    let second = create_ok(
        &gw,
        &tenant.key,
        json!({"model": "mock", "previous_response_id": id_of(&first), "tools": [apply_patch_tool()],
               "input": [{"type": "custom_tool_call_output", "call_id": "call_patch", "output": "Done!"}]}),
    )
    .await;
    assert_eq!(second["status"], "completed", "{second:#}");
    let requests = gw.model.requests();
    assert_eq!(tool_result(&requests[1], "call_patch"), "Done!");
    let calls = assistant_tool_calls(&requests[1]);
    assert_eq!(calls[0].1, "apply_patch");
    assert_eq!(
        parse(&calls[0].2),
        json!({"input": "*** Begin Patch\n*** End Patch"}),
        "the earlier call goes back in the provider's shape"
    );
    assert_calls_paired(&requests[1]);
}

#[tokio::test]
async fn a_custom_tool_call_streams_its_input_events() {
    let (gw, tenant) = gateway().await;
    gw.model.push(Reply::tool_calls(vec![Call::new(
        "apply_patch",
        json!({"input": "patch text"}),
    )
    .with_id("call_patch")]));
    let events = post_stream(
        &gw,
        &tenant.key,
        json!({"model": "mock", "input": "fix it", "tools": [apply_patch_tool()], "stream": true}),
    )
    .await;
    let types: Vec<&str> = events.iter().filter_map(|e| e["type"].as_str()).collect();
    assert!(
        types.contains(&"response.custom_tool_call_input.delta")
            && types.contains(&"response.custom_tool_call_input.done"),
        "{types:?}"
    );
    let done = events
        .iter()
        .find(|e| e["type"] == "response.custom_tool_call_input.done")
        .expect("done event");
    assert_eq!(done["input"], "patch text");
    let completed = events.last().expect("events");
    assert_eq!(
        completed["response"]["output"][0]["type"], "custom_tool_call",
        "{completed:#}"
    );
}

#[tokio::test]
async fn namespaced_functions_are_flattened_for_the_provider_and_mapped_back() {
    let (gw, tenant) = gateway().await;
    gw.model.push(Reply::tool_calls(vec![Call::new(
        "mcp__fs__read_file",
        json!({"path": "README.md"}),
    )
    .with_id("call_read")]));
    let first = create_ok(
        &gw,
        &tenant.key,
        json!({"model": "mock", "input": "read the readme", "tools": [namespace_tool()]}),
    )
    .await;

    let requests = gw.model.requests();
    assert_eq!(offered_tools(&requests[0]), ["mcp__fs__read_file"]);
    let calls = items_of(&first, "function_call");
    assert_eq!(calls.len(), 1, "{first:#}");
    assert_eq!(calls[0]["name"], "read_file", "{first:#}");
    assert_eq!(calls[0]["namespace"], "mcp__fs", "{first:#}");

    gw.model.push(Reply::text("It is a readme."));
    let second = create_ok(
        &gw,
        &tenant.key,
        json!({"model": "mock", "previous_response_id": id_of(&first), "tools": [namespace_tool()],
               "input": [{"type": "function_call_output", "call_id": "call_read", "output": "# Title"}]}),
    )
    .await;
    assert_eq!(second["status"], "completed", "{second:#}");
    let requests = gw.model.requests();
    assert_eq!(
        assistant_tool_calls(&requests[1])[0].1,
        "mcp__fs__read_file",
        "the provider sees the flat name it called"
    );
    assert_eq!(tool_result(&requests[1], "call_read"), "# Title");
}

#[tokio::test]
async fn a_codex_style_history_sent_whole_with_store_false_pairs_namespaced_and_custom_calls() {
    let (gw, tenant) = gateway().await;
    gw.model.push(Reply::text("All done."));
    let body = create_ok(
        &gw,
        &tenant.key,
        json!({"model": "mock", "store": false, "tools": [namespace_tool(), apply_patch_tool(), {"type": "web_search"}],
               "input": [
                   {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "be careful"}]},
                   {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "go"}]},
                   {"type": "function_call", "call_id": "c1", "name": "read_file", "namespace": "mcp__fs", "arguments": "{\"path\":\"a\"}"},
                   {"type": "function_call_output", "call_id": "c1", "output": "A"},
                   {"type": "custom_tool_call", "call_id": "c2", "name": "apply_patch", "input": "P"},
                   {"type": "custom_tool_call_output", "call_id": "c2", "output": "ok"}
               ]}),
    )
    .await;
    assert_eq!(body["status"], "completed", "{body:#}");
    let request = &gw.model.requests()[0];
    let names: Vec<String> = assistant_tool_calls(request)
        .into_iter()
        .map(|c| c.1)
        .collect();
    assert_eq!(names, ["mcp__fs__read_file", "apply_patch"]);
    assert_eq!(tool_result(request, "c1"), "A");
    assert_eq!(tool_result(request, "c2"), "ok");
    assert_calls_paired(request);
}

#[tokio::test]
async fn hosted_tools_are_left_out_and_listed_in_metadata_by_default() {
    let (gw, tenant) = gateway().await;
    gw.model.push(Reply::text("No search needed."));
    let body = create_ok(
        &gw,
        &tenant.key,
        json!({"model": "mock", "input": "hi", "metadata": {"team": "a"},
               "tools": [{"type": "web_search"}, {"type": "tool_search"},
                         {"type": "function", "name": "lookup", "parameters": {"type": "object"}}]}),
    )
    .await;
    assert_eq!(body["status"], "completed", "{body:#}");
    assert_eq!(
        body["metadata"],
        json!({"team": "a", "gateway_ignored_tools": "web_search,tool_search"})
    );
    assert_eq!(offered_tools(&gw.model.requests()[0]), ["lookup"]);
}

#[tokio::test]
async fn an_item_reference_brings_back_a_stored_item_by_its_id() {
    let (gw, tenant) = gateway().await;
    gw.model.push(Reply::text("Paris."));
    let first = create_ok(
        &gw,
        &tenant.key,
        json!({"model": "mock", "input": "Capital of France?"}),
    )
    .await;
    let message_id = items_of(&first, "message")[0]["id"]
        .as_str()
        .expect("message id")
        .to_owned();
    let listed = input_items(&gw, &tenant.key, &id_of(&first), "").await;
    let question_id = listed.body["data"][0]["id"]
        .as_str()
        .expect("input item id")
        .to_owned();

    gw.model.push(Reply::text("Berlin."));
    let second = create_ok(
        &gw,
        &tenant.key,
        json!({"model": "mock", "input": [
            {"type": "item_reference", "id": question_id},
            {"id": message_id},
            {"role": "user", "content": "And Germany?"}
        ]}),
    )
    .await;
    assert_eq!(second["status"], "completed", "{second:#}");
    let request = &gw.model.requests()[1];
    let texts: Vec<(String, String)> = messages(request)
        .iter()
        .map(|m| {
            (
                m["role"].as_str().unwrap_or_default().to_owned(),
                m["content"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        texts,
        [
            ("user".to_owned(), "Capital of France?".to_owned()),
            ("assistant".to_owned(), "Paris.".to_owned()),
            ("user".to_owned(), "And Germany?".to_owned())
        ]
    );
}

#[tokio::test]
async fn an_unknown_or_foreign_item_reference_is_a_400_and_stores_nothing() {
    let (gw, tenant) = gateway().await;
    let other = gw.tenant("other").await;
    gw.model.push(Reply::text("Paris."));
    let theirs = create_ok(&gw, &other.key, json!({"model": "mock", "input": "secret"})).await;
    let their_message = items_of(&theirs, "message")[0]["id"]
        .as_str()
        .expect("id")
        .to_owned();
    let before = stored_rows(&gw).await;

    for id in [
        their_message.as_str(),
        "msg_doesnotexist",
        "msg_0123456789abcdef0123456789abcdef01234567",
    ] {
        let answer = gw
            .create(
                &tenant.key,
                json!({"model": "mock", "input": [{"role": "user", "content": "x"}, {"type": "item_reference", "id": id}]}),
            )
            .await;
        assert_error(&answer, 400, Some("input[1]"), Some("item_not_found"));
        assert!(
            !answer.body.to_string().contains("secret"),
            "nothing of the other project leaks"
        );
    }
    assert_eq!(stored_rows(&gw).await, before);
}

#[tokio::test]
async fn repeated_call_ids_and_outputs_in_the_input_are_refused_with_their_position() {
    let (gw, tenant) = gateway().await;
    let twice_answered = gw
        .create(
            &tenant.key,
            json!({"model": "mock", "input": [
                {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c", "output": "1"},
                {"type": "function_call_output", "call_id": "c", "output": "2"}
            ]}),
        )
        .await;
    assert_error(
        &twice_answered,
        400,
        Some("input[2]"),
        Some("duplicate_function_call_output"),
    );
    let twice_called = gw
        .create(
            &tenant.key,
            json!({"model": "mock", "input": [
                {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
                {"type": "function_call", "call_id": "c", "name": "g", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c", "output": "1"}
            ]}),
        )
        .await;
    assert_error(
        &twice_called,
        400,
        Some("input[1]"),
        Some("duplicate_call_id"),
    );
    assert_eq!(stored_rows(&gw).await, (0, 0, 0));
    assert!(gw.model.requests().is_empty());
}

#[tokio::test]
async fn tool_definitions_the_provider_would_refuse_are_400s_with_their_param() {
    let (gw, tenant) = gateway().await;
    let cases = [
        (
            json!([{"type": "function", "name": "f", "parameters": {"type": "nonsense", "properties": 5}}]),
            "tools[0].parameters",
        ),
        (
            json!([{"type": "function", "name": "f", "parameters": {"type": "object"}},
                   {"type": "function", "name": "f", "parameters": {"type": "object"}}]),
            "tools[1].name",
        ),
        (
            json!([{"type": "namespace", "name": "ns", "tools": "x"}]),
            "tools[0].tools",
        ),
        (json!([{"type": "mcp"}]), "tools[0].server_label"),
    ];
    for (tools, param) in cases {
        let answer = gw
            .create(
                &tenant.key,
                json!({"model": "mock", "input": "x", "tools": tools}),
            )
            .await;
        assert_error(&answer, 400, Some(param), None);
    }
    let unknown_choice = gw
        .create(
            &tenant.key,
            json!({"model": "mock", "input": "x", "tool_choice": {"type": "function", "name": "nope"},
                   "tools": [{"type": "function", "name": "f"}]}),
        )
        .await;
    assert_error(&unknown_choice, 400, Some("tool_choice"), None);
    assert_eq!(stored_rows(&gw).await, (0, 0, 0));
}

#[tokio::test]
async fn input_items_list_string_content_as_text_parts() {
    let (gw, tenant) = gateway().await;
    gw.model.push(Reply::text("ok"));
    let body = create_ok(&gw, &tenant.key, json!({"model": "mock", "input": "hello"})).await;
    let listed = input_items(&gw, &tenant.key, &id_of(&body), "").await;
    assert_eq!(
        listed.body["data"][0]["content"],
        json!([{"type": "input_text", "text": "hello"}]),
        "{:#}",
        listed.body
    );
    assert_eq!(listed.body["data"][0]["type"], "message");
}

#[tokio::test]
async fn a_deployment_that_rejects_unsupported_tools_refuses_hosted_ones_with_their_param() {
    let (gw, tenant) = gateway().await;
    gw.admin_ok(
        reqwest::Method::PATCH,
        &format!("/deployments/{}", tenant.deployment_id),
        Some(json!({"unsupported_tools": "reject"})),
    )
    .await;
    let answer = gw
        .create(
            &tenant.key,
            json!({"model": "mock", "input": "hi",
                   "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}, {"type": "web_search"}]}),
        )
        .await;
    assert_error(
        &answer,
        400,
        Some("tools[1].type"),
        Some("unsupported_tool_type"),
    );
    assert_eq!(stored_rows(&gw).await, (0, 0, 0));
    assert!(gw.model.requests().is_empty());
}
