//! Rejected requests: each answers OpenAI's error shape with the right status, `param` and `code`, and stores nothing.

use crate::common::*;
use gateway_e2e::{Answer, TestGateway};
use gateway_testkit::{Call, Reply};
use reqwest::Method;
use serde_json::{json, Value};

/// Sends a raw body to `POST /v1/responses`.
async fn post_raw(gw: &TestGateway, key: &str, body: &'static str) -> Answer {
    gw.call(
        gw.public(Method::POST, "/responses", key)
            .header("content-type", "application/json")
            .body(body),
    )
    .await
}

/// Asserts the rejection and that the response tables did not change.
async fn rejected(
    gw: &TestGateway,
    before: (i64, i64, i64),
    answer: &Answer,
    status: u16,
    param: Option<&str>,
    code: Option<&str>,
) {
    assert_error(answer, status, param, code);
    assert_eq!(
        answer
            .headers
            .get("x-should-retry")
            .and_then(|v| v.to_str().ok()),
        Some("false")
    );
    assert_eq!(
        stored_rows(gw).await,
        before,
        "a rejected request stored something"
    );
}

#[tokio::test]
async fn malformed_json_is_a_400_invalid_json() {
    let (gw, tenant) = gateway().await;

    let answer = post_raw(&gw, &tenant.key, "{\"model\": \"mock\", \"input\": ").await;

    rejected(&gw, (0, 0, 0), &answer, 400, None, Some("invalid_json")).await;
    assert!(gw.model.requests().is_empty());
}

#[tokio::test]
async fn an_empty_body_is_a_400() {
    let (gw, tenant) = gateway().await;

    let answer = post_raw(&gw, &tenant.key, "").await;

    rejected(&gw, (0, 0, 0), &answer, 400, None, Some("empty_body")).await;
}

#[tokio::test]
async fn an_empty_object_is_a_400_naming_model() {
    let (gw, tenant) = gateway().await;

    let answer = post_raw(&gw, &tenant.key, "{}").await;

    rejected(&gw, (0, 0, 0), &answer, 400, Some("model"), None).await;
}

#[tokio::test]
async fn a_missing_model_is_a_400_naming_model() {
    let (gw, tenant) = gateway().await;

    let answer = gw.create(&tenant.key, json!({"input": "hi"})).await;

    rejected(
        &gw,
        (0, 0, 0),
        &answer,
        400,
        Some("model"),
        Some("missing_required_parameter"),
    )
    .await;
}

#[tokio::test]
async fn an_unknown_model_is_a_404_model_not_found() {
    let (gw, tenant) = gateway().await;

    let answer = gw
        .create(
            &tenant.key,
            json!({"model": "no-such-model", "input": "hi"}),
        )
        .await;

    rejected(
        &gw,
        (0, 0, 0),
        &answer,
        404,
        Some("model"),
        Some("model_not_found"),
    )
    .await;
    assert!(answer.error()["message"]
        .as_str()
        .unwrap_or_default()
        .contains("no-such-model"));
}

#[tokio::test]
async fn a_model_the_project_may_not_use_is_a_404_exactly_like_an_unknown_one() {
    let (gw, tenant) = gateway().await;
    let other = gw.tenant("other").await;
    // A deployment in a group granted only to the other project.
    let deployment = gw
        .admin_ok(
            Method::POST,
            "/deployments",
            Some(json!({"name": "private", "provider": {"kind": "openai_chat", "base_url": gw.model.base_url(), "model": "mock-model"}})),
        )
        .await;
    let group = gw
        .admin_ok(
            Method::POST,
            "/deployment_groups",
            Some(json!({"name": "private-group"})),
        )
        .await;
    let group_id = id_of(&group);
    gw.admin_ok(
        Method::PUT,
        &format!(
            "/deployment_groups/{group_id}/deployments/{}",
            id_of(&deployment)
        ),
        None,
    )
    .await;
    gw.admin_ok(
        Method::PUT,
        &format!(
            "/deployment_groups/{group_id}/projects/{}",
            other.project_id
        ),
        None,
    )
    .await;
    gw.model.push(Reply::text("only for the other project"));
    create_ok(&gw, &other.key, json!({"model": "private", "input": "hi"})).await;
    let before = stored_rows(&gw).await;

    let denied = gw
        .create(&tenant.key, json!({"model": "private", "input": "hi"}))
        .await;
    let unknown = gw
        .create(&tenant.key, json!({"model": "nonexistent", "input": "hi"}))
        .await;

    rejected(
        &gw,
        before,
        &denied,
        404,
        Some("model"),
        Some("model_not_found"),
    )
    .await;
    assert_eq!(
        denied.error()["message"]
            .as_str()
            .map(|m| m.replace("private", "X")),
        unknown.error()["message"]
            .as_str()
            .map(|m| m.replace("nonexistent", "X")),
        "a forbidden model is indistinguishable from a missing one"
    );
    assert_eq!(gw.model.requests().len(), 1);
}

#[tokio::test]
async fn a_field_of_the_wrong_type_is_a_400_naming_the_field() {
    let (gw, tenant) = gateway().await;
    let cases = [
        (
            json!({"model": "mock", "input": "hi", "temperature": "hot"}),
            "temperature",
        ),
        (
            json!({"model": "mock", "input": "hi", "stream": "yes"}),
            "stream",
        ),
        (
            json!({"model": "mock", "input": "hi", "max_tool_calls": "many"}),
            "max_tool_calls",
        ),
        (json!({"model": 7, "input": "hi"}), "model"),
        (json!({"model": "mock", "input": 5}), "input"),
        (
            json!({"model": "mock", "input": "hi", "metadata": {"k": 1}}),
            "metadata.k",
        ),
    ];
    for (body, param) in cases {
        let answer = gw.create(&tenant.key, body.clone()).await;
        assert_eq!(answer.status.as_u16(), 400, "{body} → {:#}", answer.body);
        rejected(&gw, (0, 0, 0), &answer, 400, Some(param), None).await;
    }
}

#[tokio::test]
async fn out_of_range_values_are_a_400_naming_the_field() {
    let (gw, tenant) = gateway().await;
    let cases = [
        (
            json!({"model": "mock", "input": "hi", "temperature": 3}),
            "temperature",
        ),
        (
            json!({"model": "mock", "input": "hi", "temperature": -0.5}),
            "temperature",
        ),
        (
            json!({"model": "mock", "input": "hi", "top_p": 1.5}),
            "top_p",
        ),
        (
            json!({"model": "mock", "input": "hi", "max_output_tokens": 8}),
            "max_output_tokens",
        ),
        (
            json!({"model": "mock", "input": "hi", "max_tool_calls": 0}),
            "max_tool_calls",
        ),
        (
            json!({"model": "mock", "input": "hi", "tool_choice": "sometimes"}),
            "tool_choice",
        ),
        (
            json!({"model": "mock", "input": [{"type": "computer_call"}]}),
            "input[0]",
        ),
        (
            json!({"model": "mock", "input": "hi", "tools": [{"type": "function", "name": "bad name"}]}),
            "tools[0].name",
        ),
    ];
    for (body, param) in cases {
        let answer = gw.create(&tenant.key, body.clone()).await;
        assert_eq!(answer.status.as_u16(), 400, "{body} → {:#}", answer.body);
        rejected(&gw, (0, 0, 0), &answer, 400, Some(param), None).await;
    }
    assert!(gw.model.requests().is_empty());
}

#[tokio::test]
async fn an_unknown_previous_response_id_is_a_400_previous_response_not_found() {
    let (gw, tenant) = gateway().await;

    let answer = gw
        .create(
            &tenant.key,
            json!({"model": "mock", "input": "hi", "previous_response_id": "resp_nope"}),
        )
        .await;

    rejected(
        &gw,
        (0, 0, 0),
        &answer,
        400,
        Some("previous_response_id"),
        Some("previous_response_not_found"),
    )
    .await;
    assert!(answer.error()["message"]
        .as_str()
        .unwrap_or_default()
        .contains("resp_nope"));
}

#[tokio::test]
async fn a_deleted_previous_response_id_is_a_400_previous_response_not_found() {
    let (gw, tenant) = gateway().await;
    gw.model.push(Reply::text("first"));
    let first = create_ok(&gw, &tenant.key, json!({"model": "mock", "input": "hi"})).await;
    assert_eq!(
        delete_response(&gw, &tenant.key, &id_of(&first))
            .await
            .status
            .as_u16(),
        200
    );
    let before = stored_rows(&gw).await;

    let answer = gw
        .create(
            &tenant.key,
            json!({"model": "mock", "input": "again", "previous_response_id": id_of(&first)}),
        )
        .await;

    rejected(
        &gw,
        before,
        &answer,
        400,
        Some("previous_response_id"),
        Some("previous_response_not_found"),
    )
    .await;
}

#[tokio::test]
async fn a_chained_response_survives_the_deletion_of_its_ancestor() {
    let (gw, tenant) = gateway().await;
    gw.model.push(Reply::text("first"));
    gw.model.push(Reply::text("second"));
    gw.model.push(Reply::text("third"));
    let first = create_ok(&gw, &tenant.key, json!({"model": "mock", "input": "one"})).await;
    let second = create_ok(
        &gw,
        &tenant.key,
        json!({"model": "mock", "input": "two", "previous_response_id": id_of(&first)}),
    )
    .await;
    assert_eq!(
        delete_response(&gw, &tenant.key, &id_of(&first))
            .await
            .status
            .as_u16(),
        200
    );

    let third = create_ok(
        &gw,
        &tenant.key,
        json!({"model": "mock", "input": "three", "previous_response_id": id_of(&second)}),
    )
    .await;

    assert_eq!(third["status"], "completed");
    let texts: Vec<Value> = messages(&gw.model.requests()[2])
        .iter()
        .map(|m| m["content"].clone())
        .collect();
    assert_eq!(
        texts,
        [
            json!("one"),
            json!("first"),
            json!("two"),
            json!("second"),
            json!("three")
        ]
    );
}

#[tokio::test]
async fn a_function_call_output_without_a_matching_call_is_a_400() {
    let (gw, tenant) = gateway().await;

    let answer = gw
        .create(
            &tenant.key,
            json!({"model": "mock", "input": [
                {"role": "user", "content": "hi"},
                {"type": "function_call_output", "call_id": "call_orphan", "output": "x"}
            ]}),
        )
        .await;

    rejected(
        &gw,
        (0, 0, 0),
        &answer,
        400,
        Some("input[1]"),
        Some("function_call_output_without_call"),
    )
    .await;
    assert!(answer.error()["message"]
        .as_str()
        .unwrap_or_default()
        .contains("call_orphan"));
}

#[tokio::test]
async fn a_function_call_output_answering_no_call_of_the_previous_response_is_a_400() {
    let (gw, tenant) = gateway().await;
    gw.model.push(Reply::text("plain"));
    let first = create_ok(&gw, &tenant.key, json!({"model": "mock", "input": "hi"})).await;
    let before = stored_rows(&gw).await;

    let answer = gw
        .create(
            &tenant.key,
            json!({"model": "mock", "previous_response_id": id_of(&first),
                "input": [{"type": "function_call_output", "call_id": "call_ghost", "output": "x"}]}),
        )
        .await;

    rejected(
        &gw,
        before,
        &answer,
        400,
        Some("input[0]"),
        Some("function_call_output_without_call"),
    )
    .await;
}

#[tokio::test]
async fn an_unregistered_call_left_unanswered_on_continuation_is_a_400_naming_the_call_id() {
    let (gw, tenant) = gateway().await;
    let tools = json!([{"type": "function", "name": "lookup", "parameters": {"type": "object"}},
                       {"type": "function", "name": "translate", "parameters": {"type": "object"}}]);
    gw.model.push(Reply::tool_calls(vec![
        Call::new("lookup", json!({})).with_id("call_answered"),
        Call::new("translate", json!({})).with_id("call_forgotten"),
    ]));
    let first = create_ok(
        &gw,
        &tenant.key,
        json!({"model": "mock", "input": "go", "tools": tools}),
    )
    .await;
    let before = stored_rows(&gw).await;

    let answer = gw
        .create(
            &tenant.key,
            json!({"model": "mock", "previous_response_id": id_of(&first), "tools": tools,
                "input": [{"type": "function_call_output", "call_id": "call_answered", "output": "ok"}]}),
        )
        .await;

    assert_error(
        &answer,
        400,
        Some("input"),
        Some("function_call_output_missing"),
    );
    let message = answer.error()["message"].as_str().unwrap_or_default();
    assert!(message.contains("call_forgotten"), "{message}");
    assert_eq!(stored_rows(&gw).await, before);
    assert_eq!(gw.model.requests().len(), 1, "the model is not called");

    let with_text_only = gw
        .create(
            &tenant.key,
            json!({"model": "mock", "previous_response_id": id_of(&first), "input": "just text"}),
        )
        .await;
    assert_error(
        &with_text_only,
        400,
        Some("input"),
        Some("function_call_output_missing"),
    );
    assert_eq!(stored_rows(&gw).await, before);
}

#[tokio::test]
async fn a_client_tool_named_like_a_visible_server_tool_is_a_400_naming_the_tool() {
    let (gw, tenant) = gateway_with_tools(&["add"]).await;

    let answer = gw
        .create(
            &tenant.key,
            json!({"model": "mock", "input": "hi", "tools": [{"type": "function", "name": "add", "parameters": {"type": "object"}}]}),
        )
        .await;

    rejected(
        &gw,
        (0, 0, 0),
        &answer,
        400,
        Some("tools[0].name"),
        Some("tool_name_conflict"),
    )
    .await;
    assert!(gw.model.requests().is_empty());
}

#[tokio::test]
async fn a_body_over_the_configured_limit_is_a_413() {
    let gw = TestGateway::start_with(|c| c.server.body_limit_bytes = 1024).await;
    let tenant = gw.tenant("acme").await;

    let answer = gw
        .create(
            &tenant.key,
            json!({"model": "mock", "input": "x".repeat(4096)}),
        )
        .await;

    rejected(
        &gw,
        (0, 0, 0),
        &answer,
        413,
        None,
        Some("request_too_large"),
    )
    .await;
    assert!(gw.model.requests().is_empty());

    gw.model.push(Reply::text("small is fine"));
    assert_eq!(
        create_ok(&gw, &tenant.key, json!({"model": "mock", "input": "x"})).await["status"],
        "completed"
    );
}

#[tokio::test]
async fn a_missing_api_key_is_a_401() {
    let (gw, _tenant) = gateway().await;

    let answer = gw
        .call(
            gw.http
                .post(format!("{}/v1/responses", gw.base_url))
                .json(&json!({"model": "mock", "input": "hi"})),
        )
        .await;

    rejected(&gw, (0, 0, 0), &answer, 401, None, None).await;
    assert!(gw.model.requests().is_empty());
}

#[tokio::test]
async fn an_invalid_api_key_is_a_401_invalid_api_key() {
    let (gw, _tenant) = gateway().await;

    let answer = gw
        .create("sk-not-a-real-key", json!({"model": "mock", "input": "hi"}))
        .await;
    let get = get_response(&gw, "sk-not-a-real-key", "resp_x").await;

    rejected(&gw, (0, 0, 0), &answer, 401, None, Some("invalid_api_key")).await;
    assert_error(&get, 401, None, Some("invalid_api_key"));
    assert!(gw.model.requests().is_empty());
}

#[tokio::test]
async fn a_revoked_api_key_stops_working_at_once() {
    let (gw, tenant) = gateway().await;
    gw.model.push(Reply::text("before revocation"));
    create_ok(&gw, &tenant.key, json!({"model": "mock", "input": "hi"})).await;
    gw.admin_ok(
        Method::DELETE,
        &format!("/api_keys/{}", tenant.key_id),
        None,
    )
    .await;
    let before = stored_rows(&gw).await;

    let answer = gw
        .create(&tenant.key, json!({"model": "mock", "input": "hi"}))
        .await;

    rejected(&gw, before, &answer, 401, None, Some("invalid_api_key")).await;
}

#[tokio::test]
async fn invalid_input_items_paging_parameters_are_a_400() {
    let (gw, tenant) = gateway().await;
    gw.model.push(Reply::text("ok"));
    let id = id_of(&create_ok(&gw, &tenant.key, json!({"model": "mock", "input": "hi"})).await);

    assert_error(
        &input_items(&gw, &tenant.key, &id, "?limit=0").await,
        400,
        Some("limit"),
        None,
    );
    assert_error(
        &input_items(&gw, &tenant.key, &id, "?limit=101").await,
        400,
        Some("limit"),
        None,
    );
    assert_error(
        &input_items(&gw, &tenant.key, &id, "?order=sideways").await,
        400,
        Some("order"),
        None,
    );
    assert_error(
        &input_items(&gw, &tenant.key, &id, "?after=msg_unknown").await,
        400,
        Some("after"),
        None,
    );
}

#[tokio::test]
async fn a_previous_response_still_in_progress_is_a_400() {
    let (gw, tenant) = gateway().await;
    gw.model.push(Reply::text("first"));
    let first = create_ok(&gw, &tenant.key, json!({"model": "mock", "input": "hi"})).await;
    // Simulates a response another replica is still running.
    running_elsewhere(&gw, &id_of(&first)).await;
    let before = stored_rows(&gw).await;

    let answer = gw
        .create(
            &tenant.key,
            json!({"model": "mock", "input": "next", "previous_response_id": id_of(&first)}),
        )
        .await;

    rejected(
        &gw,
        before,
        &answer,
        400,
        Some("previous_response_id"),
        None,
    )
    .await;
}
