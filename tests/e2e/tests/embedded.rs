//! The core scenarios on the embedded store: the real gateway on a fresh SQLite file, found through the
//! database URL of its config, with the testkit's mock model and tool server.

mod common;

use common::*;
use gateway::store::Backend;
use gateway_e2e::items_of;
use gateway_testkit::{Call, Reply};
use reqwest::Method;
use serde_json::{json, Value};

fn lookup_tool() -> Value {
    json!({"type": "function", "name": "lookup", "description": "Look a word up.",
        "parameters": {"type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"]}})
}

#[tokio::test]
async fn the_embedded_gateway_runs_on_sqlite() {
    let (gw, _) = embedded_gateway().await;

    assert!(matches!(gw.store.backend(), Backend::Sqlite(_)));
    let ready = gw
        .http
        .get(format!("{}/readyz", gw.base_url))
        .send()
        .await
        .expect("readyz");
    assert!(ready.status().is_success(), "{}", ready.status());
}

#[tokio::test]
async fn a_text_answer_reads_back_by_get_and_its_input_items_page_with_after() {
    let (gw, tenant) = embedded_gateway().await;
    gw.model.push(Reply::text("Hello there!").with_usage(7, 3));
    let input = json!([
        {"role": "user", "content": "one"},
        {"role": "user", "content": "two"},
        {"role": "user", "content": "three"}
    ]);

    let body = create_ok(
        &gw,
        &tenant.key,
        json!({"model": "mock", "input": input, "instructions": "Be brief.", "metadata": {"k": "v"}}),
    )
    .await;

    assert_eq!(body["status"], "completed", "{body:#}");
    assert_eq!(body["output_text"], "Hello there!");
    assert_eq!(body["instructions"], "Be brief.");
    assert_eq!(body["metadata"], json!({"k": "v"}));
    assert_eq!(body["usage"]["total_tokens"], 10);
    let id = id_of(&body);
    let read = get_response(&gw, &tenant.key, &id).await;
    assert_eq!(read.status.as_u16(), 200, "{:#}", read.body);
    assert_eq!(read.body, body, "GET answers exactly what the create did");

    let first = input_items(&gw, &tenant.key, &id, "?limit=2&order=asc").await;
    assert_eq!(first.status.as_u16(), 200, "{:#}", first.body);
    let texts = |page: &Value| -> Vec<String> {
        page["data"]
            .as_array()
            .map(|items| {
                items
                    .iter()
                    .map(|i| i["content"].as_str().unwrap_or("").to_owned())
                    .collect()
            })
            .unwrap_or_default()
    };
    assert_eq!(texts(&first.body), ["one", "two"], "{:#}", first.body);
    assert_eq!(first.body["has_more"], true);
    let last = first.body["last_id"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let second = input_items(
        &gw,
        &tenant.key,
        &id,
        &format!("?limit=2&order=asc&after={last}"),
    )
    .await;
    assert_eq!(texts(&second.body), ["three"], "{:#}", second.body);
    assert_eq!(second.body["has_more"], false);
    let newest = input_items(&gw, &tenant.key, &id, "?limit=1").await;
    assert_eq!(texts(&newest.body), ["three"], "newest first by default");
    assert_error(
        &input_items(&gw, &tenant.key, &id, "?after=msg_unknown").await,
        400,
        Some("after"),
        None,
    );

    let deleted = delete_response(&gw, &tenant.key, &id).await;
    assert_eq!(deleted.status.as_u16(), 200, "{:#}", deleted.body);
    assert_eq!(
        get_response(&gw, &tenant.key, &id).await.status.as_u16(),
        404
    );
    assert_eq!(
        stored_rows(&gw).await,
        (0, 0, 0),
        "deleting a response removes its items and steps"
    );
}

#[tokio::test]
async fn a_server_tool_runs_and_the_model_sees_its_result() {
    let (gw, tenant) = embedded_gateway_with_tools(&["add"]).await;
    gw.model.push(Reply::tool_calls(vec![Call::new(
        "add",
        json!({"a": 40, "b": 2}),
    )
    .with_id("call_add_1")]));
    gw.model.push(Reply::text("The sum is 42."));

    let body = create_ok(
        &gw,
        &tenant.key,
        json!({"model": "mock", "input": "What is 40 + 2?"}),
    )
    .await;

    assert_eq!(body["status"], "completed", "{body:#}");
    let mcp = items_of(&body, "mcp_call");
    assert_eq!(mcp.len(), 1, "{body:#}");
    assert_eq!(mcp[0]["call_id"], "call_add_1");
    assert_eq!(mcp[0]["status"], "completed");
    assert_eq!(
        parse(mcp[0]["output"].as_str().unwrap_or("null")),
        json!({"sum": 42})
    );
    assert_eq!(body["output_text"], "The sum is 42.");
    let requests = gw.model.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(
        parse(&tool_result(&requests[1], "call_add_1")),
        json!({"sum": 42})
    );
    assert_calls_paired(&requests[1]);
    assert_eq!(
        get_response(&gw, &tenant.key, &id_of(&body)).await.body,
        body
    );
}

#[tokio::test]
async fn parallel_batches_run_concurrently_and_their_steps_are_written_without_locking() {
    let (gw, tenant) = embedded_gateway_with_tools(&["barrier"]).await;
    // Several rounds: each batch's three steps are marked running and finished at the same moment, so a
    // store that cannot take concurrent writes fails one of them sooner or later.
    for round in 0..5 {
        let ids: Vec<String> = (1..=3).map(|n| format!("call_{round}_{n}")).collect();
        gw.model.push(Reply::tool_calls(
            ids.iter()
                .map(|id| Call::new("barrier", json!({"n": 3})).with_id(id))
                .collect(),
        ));
        gw.model.push(Reply::text("all released"));

        let body = create_ok(
            &gw,
            &tenant.key,
            json!({"model": "mock", "input": format!("round {round}")}),
        )
        .await;

        assert_eq!(body["status"], "completed", "round {round}: {body:#}");
        let mcp = items_of(&body, "mcp_call");
        assert_eq!(mcp.len(), 3, "round {round}: {body:#}");
        for item in &mcp {
            assert_eq!(
                item["status"], "completed",
                "round {round}: a barrier call failed, so the batch did not run concurrently: {item:#}"
            );
            assert_eq!(
                parse(item["output"].as_str().unwrap_or("null")),
                json!({"released": true, "n": 3})
            );
        }
        let requests = gw.model.requests();
        let last = requests.last().expect("second model call");
        for id in &ids {
            assert_eq!(
                parse(&tool_result(last, id)),
                json!({"released": true, "n": 3})
            );
        }
        assert_calls_paired(last);
        assert_eq!(
            get_response(&gw, &tenant.key, &id_of(&body)).await.body,
            body,
            "round {round}: the stored steps read back the same"
        );
    }
    assert!(
        gw.tools.max_in_flight() >= 3,
        "max in flight: {}",
        gw.tools.max_in_flight()
    );
    assert_eq!(gw.tools.calls().len(), 15);
    // Every tool step of every round ended succeeded.
    let failed_steps = gw
        .fetch_i64("SELECT count(*) FROM steps WHERE state <> 'succeeded'")
        .await;
    assert_eq!(failed_steps, 0);
}

#[tokio::test]
async fn a_mixed_batch_is_handed_back_and_continuing_with_only_the_client_output_runs_the_registered_call(
) {
    let (gw, tenant) = embedded_gateway_with_tools(&["add"]).await;
    gw.model.push(Reply::tool_calls(vec![
        Call::new("add", json!({"a": 20, "b": 22})).with_id("call_add"),
        Call::new("lookup", json!({"word": "answer"})).with_id("call_lookup"),
    ]));
    let first = create_ok(
        &gw,
        &tenant.key,
        json!({"model": "mock", "input": "sum and look up", "tools": [lookup_tool()]}),
    )
    .await;
    let calls = items_of(&first, "function_call");
    assert_eq!(calls.len(), 2, "the whole batch is handed back: {first:#}");
    assert!(gw.tools.calls().is_empty(), "nothing ran yet");
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
    assert_eq!(tool_calls[0].header("x-gateway-call-id"), Some("call_add"));
    let output = second["output"].as_array().expect("output");
    assert_eq!(output[0]["type"], "mcp_call", "{second:#}");
    assert_eq!(output[0]["call_id"], "call_add");
    let requests = gw.model.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(
        parse(&tool_result(&requests[1], "call_add")),
        json!({"sum": 42})
    );
    assert_eq!(tool_result(&requests[1], "call_lookup"), "a reply");
    assert_calls_paired(&requests[1]);
    assert_eq!(
        last_text_of(&requests[1], "user"),
        "sum and look up",
        "the first turn's context is carried"
    );
}

#[tokio::test]
async fn a_failing_tool_gives_the_model_an_error_output_and_its_sibling_keeps_its_result() {
    let (gw, tenant) = embedded_gateway_with_tools(&["add", "fail"]).await;
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
    let failed = mcp
        .iter()
        .find(|i| i["call_id"] == "call_fail")
        .expect("failed call item");
    assert_eq!(failed["status"], "failed");
    assert!(!failed["error"].is_null(), "{failed:#}");
    let ok = mcp
        .iter()
        .find(|i| i["call_id"] == "call_ok")
        .expect("succeeded call item");
    assert_eq!(ok["status"], "completed");
    assert_eq!(
        parse(ok["output"].as_str().unwrap_or("null")),
        json!({"sum": 5})
    );
    let requests = gw.model.requests();
    assert!(parse(&tool_result(&requests[1], "call_fail"))["error"]["message"].is_string());
    assert_eq!(
        parse(&tool_result(&requests[1], "call_ok")),
        json!({"sum": 5})
    );
    assert_eq!(
        get_response(&gw, &tenant.key, &id_of(&body)).await.body,
        body
    );
}

#[tokio::test]
async fn rejected_requests_store_nothing() {
    let (gw, tenant) = embedded_gateway().await;

    let malformed = gw
        .call(
            gw.public(Method::POST, "/responses", &tenant.key)
                .header("content-type", "application/json")
                .body("{\"model\": "),
        )
        .await;
    assert_error(&malformed, 400, None, Some("invalid_json"));
    let unknown_model = gw
        .create(&tenant.key, json!({"model": "nope", "input": "hi"}))
        .await;
    assert_error(&unknown_model, 404, Some("model"), Some("model_not_found"));
    let unknown_previous = gw
        .create(
            &tenant.key,
            json!({"model": "mock", "input": "hi", "previous_response_id": "resp_unknown"}),
        )
        .await;
    assert_error(
        &unknown_previous,
        400,
        Some("previous_response_id"),
        Some("previous_response_not_found"),
    );
    let orphan_output = gw
        .create(
            &tenant.key,
            json!({"model": "mock", "input": [{"type": "function_call_output", "call_id": "call_x", "output": "1"}]}),
        )
        .await;
    assert_eq!(
        orphan_output.status.as_u16(),
        400,
        "{:#}",
        orphan_output.body
    );

    assert_eq!(stored_rows(&gw).await, (0, 0, 0));
    assert!(gw.model.requests().is_empty());
}

#[tokio::test]
async fn another_projects_key_gets_404_on_get_delete_and_input_items() {
    let (gw, owner) = embedded_gateway().await;
    let stranger = gw.tenant("stranger").await;
    gw.model.push(Reply::text("private answer"));
    let created = create_ok(&gw, &owner.key, json!({"model": "mock", "input": "secret"})).await;
    let id = id_of(&created);

    assert_error(
        &get_response(&gw, &stranger.key, &id).await,
        404,
        None,
        None,
    );
    assert_error(
        &delete_response(&gw, &stranger.key, &id).await,
        404,
        None,
        None,
    );
    assert_error(
        &input_items(&gw, &stranger.key, &id, "").await,
        404,
        None,
        None,
    );
    let read = get_response(&gw, &owner.key, &id).await;
    assert_eq!(read.status.as_u16(), 200);
    assert_eq!(read.body, created);
    assert_eq!(stored_rows(&gw).await.0, 1);
}

#[tokio::test]
async fn the_admin_api_manages_every_kind_and_a_revoked_key_stops_working() {
    let (gw, tenant) = embedded_gateway_with_tools(&["add"]).await;

    let projects = gw.admin_ok(Method::GET, "/projects", None).await;
    assert_eq!(projects["data"][0]["name"], "acme", "{projects:#}");
    let renamed = gw
        .admin_ok(
            Method::PATCH,
            &format!("/projects/{}", tenant.project_id),
            Some(json!({"name": "acme-renamed"})),
        )
        .await;
    assert_eq!(renamed["name"], "acme-renamed");
    let duplicate = gw
        .admin(Method::POST, "/projects")
        .json(&json!({"name": "acme-renamed"}))
        .send()
        .await
        .expect("duplicate");
    assert_eq!(duplicate.status().as_u16(), 409);

    let deployment = gw
        .admin_ok(
            Method::PATCH,
            &format!("/deployments/{}", tenant.deployment_id),
            Some(json!({"provider": {"api_key": "sk-upstream"}})),
        )
        .await;
    assert_eq!(deployment["name"], "mock", "{deployment:#}");
    let groups = gw.admin_ok(Method::GET, "/deployment_groups", None).await;
    let group = &groups["data"][0];
    assert_eq!(group["name"], "default");
    assert_eq!(
        group["project_ids"],
        json!([tenant.project_id]),
        "{group:#}"
    );
    assert_eq!(group["deployment_ids"], json!([tenant.deployment_id]));
    assert_eq!(group["tool_source_ids"].as_array().map(Vec::len), Some(1));
    let sources = gw.admin_ok(Method::GET, "/tool_sources", None).await;
    assert_eq!(sources["data"][0]["name"], "add");
    assert_eq!(sources["data"][0]["parameters"]["type"], "object");

    gw.model.push(Reply::text("before revocation"));
    create_ok(&gw, &tenant.key, json!({"model": "mock", "input": "hi"})).await;
    gw.admin_ok(
        Method::DELETE,
        &format!("/api_keys/{}", tenant.key_id),
        None,
    )
    .await;
    let refused = gw
        .create(&tenant.key, json!({"model": "mock", "input": "hi"}))
        .await;
    assert_error(&refused, 401, None, Some("invalid_api_key"));

    let source_id = sources["data"][0]["id"].as_str().expect("id").to_owned();
    gw.admin_ok(Method::DELETE, &format!("/tool_sources/{source_id}"), None)
        .await;
    gw.admin_ok(
        Method::DELETE,
        &format!("/projects/{}", tenant.project_id),
        None,
    )
    .await;
    let group = gw
        .admin_ok(
            Method::GET,
            &format!("/deployment_groups/{}", tenant.group_id),
            None,
        )
        .await;
    assert_eq!(group["project_ids"], json!([]), "{group:#}");
    assert_eq!(group["tool_source_ids"], json!([]), "{group:#}");
    assert_eq!(
        stored_rows(&gw).await,
        (0, 0, 0),
        "deleting the project deleted its responses"
    );
}
