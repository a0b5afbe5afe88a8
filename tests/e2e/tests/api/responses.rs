//! The Responses API's basic life cycle: create a text answer, read it back, list its input items, delete it.

use crate::common::*;
use gateway_e2e::items_of;
use gateway_testkit::Reply;
use serde_json::{json, Value};

/// Every key of OpenAI's `Response` object (and of the stricter Open Responses schema).
const RESPONSE_KEYS: &[&str] = &[
    "id",
    "object",
    "created_at",
    "completed_at",
    "status",
    "background",
    "error",
    "incomplete_details",
    "instructions",
    "max_output_tokens",
    "max_tool_calls",
    "model",
    "output",
    "output_text",
    "parallel_tool_calls",
    "previous_response_id",
    "presence_penalty",
    "frequency_penalty",
    "prompt_cache_key",
    "reasoning",
    "safety_identifier",
    "service_tier",
    "store",
    "temperature",
    "text",
    "tool_choice",
    "tools",
    "top_logprobs",
    "top_p",
    "truncation",
    "usage",
    "user",
    "metadata",
];

#[tokio::test]
async fn a_text_answer_is_a_complete_openai_response_object() {
    let (gw, tenant) = gateway().await;
    gw.model.push(Reply::text("Hello there!").with_usage(7, 3));

    let body = create_ok(
        &gw,
        &tenant.key,
        json!({"model": "mock", "input": "Say hello", "instructions": "Be brief.", "metadata": {"k": "v"}}),
    )
    .await;

    for key in RESPONSE_KEYS {
        assert!(
            body.get(*key).is_some(),
            "key '{key}' missing from {body:#}"
        );
    }
    assert!(
        body["id"]
            .as_str()
            .is_some_and(|id| id.starts_with("resp_") && id.len() > 5),
        "{body:#}"
    );
    assert_eq!(body["object"], "response");
    assert_eq!(body["status"], "completed");
    assert_eq!(body["model"], "mock");
    assert_eq!(body["error"], Value::Null);
    assert_eq!(body["incomplete_details"], Value::Null);
    assert_eq!(body["instructions"], "Be brief.");
    assert_eq!(body["previous_response_id"], Value::Null);
    assert_eq!(body["store"], true);
    assert_eq!(body["background"], false);
    assert_eq!(body["metadata"], json!({"k": "v"}));
    assert_eq!(body["tools"], json!([]));
    assert_eq!(body["tool_choice"], "auto");
    assert_eq!(body["text"], json!({"format": {"type": "text"}}));
    let created_at = body["created_at"]
        .as_i64()
        .expect("created_at is an integer");
    let completed_at = body["completed_at"]
        .as_i64()
        .expect("completed_at is an integer");
    assert!(
        created_at > 1_600_000_000 && completed_at >= created_at,
        "{body:#}"
    );

    let output = body["output"].as_array().expect("output");
    assert_eq!(output.len(), 1, "{body:#}");
    let message = &output[0];
    assert_eq!(message["type"], "message");
    assert!(
        message["id"]
            .as_str()
            .is_some_and(|id| id.starts_with("msg_")),
        "{message:#}"
    );
    assert_eq!(message["role"], "assistant");
    assert_eq!(message["status"], "completed");
    assert_eq!(
        message["content"],
        json!([{"type": "output_text", "text": "Hello there!", "annotations": [], "logprobs": []}])
    );
    assert_eq!(body["output_text"], "Hello there!");

    assert_eq!(body["usage"]["input_tokens"], 7);
    assert_eq!(body["usage"]["output_tokens"], 3);
    assert_eq!(body["usage"]["total_tokens"], 10);
    assert_eq!(body["usage"]["input_tokens_details"]["cached_tokens"], 0);
    assert_eq!(
        body["usage"]["input_tokens_details"]["cache_write_tokens"],
        0
    );
    assert_eq!(
        body["usage"]["output_tokens_details"]["reasoning_tokens"],
        0
    );

    // The upstream got the instructions as a system message, then the input as a user message.
    let requests = gw.model.requests();
    assert_eq!(requests.len(), 1);
    assert_eq!(requests[0]["model"], "mock-model");
    assert_eq!(
        messages(&requests[0]),
        &vec![
            json!({"role": "system", "content": "Be brief."}),
            json!({"role": "user", "content": "Say hello"})
        ]
    );
}

#[tokio::test]
async fn a_stored_response_reads_back_by_get_exactly_as_it_was_created() {
    let (gw, tenant) = gateway().await;
    gw.model.push(Reply::text("Stored answer"));
    let created = create_ok(
        &gw,
        &tenant.key,
        json!({"model": "mock", "input": "hi", "temperature": 0.5, "presence_penalty": 1.5, "frequency_penalty": -0.5}),
    )
    .await;

    let read = get_response(&gw, &tenant.key, &id_of(&created)).await;

    assert_eq!(read.status.as_u16(), 200, "{:#}", read.body);
    assert_eq!(read.body, created);
    assert_eq!(read.body["temperature"], 0.5);
    assert_eq!(read.body["presence_penalty"], 1.5);
    assert_eq!(read.body["frequency_penalty"], -0.5);
}

#[tokio::test]
async fn a_deleted_response_answers_the_delete_object_and_is_gone_afterwards() {
    let (gw, tenant) = gateway().await;
    gw.model.push(Reply::text("soon gone"));
    let created = create_ok(&gw, &tenant.key, json!({"model": "mock", "input": "hi"})).await;
    let id = id_of(&created);

    let deleted = delete_response(&gw, &tenant.key, &id).await;

    assert_eq!(deleted.status.as_u16(), 200, "{:#}", deleted.body);
    assert_eq!(
        deleted.body,
        json!({"id": id, "object": "response", "deleted": true})
    );
    assert_error(&get_response(&gw, &tenant.key, &id).await, 404, None, None);
    assert_error(
        &input_items(&gw, &tenant.key, &id, "").await,
        404,
        None,
        None,
    );
    assert_error(
        &delete_response(&gw, &tenant.key, &id).await,
        404,
        None,
        None,
    );
    assert_eq!(
        stored_rows(&gw).await,
        (0, 0, 0),
        "the items and steps are deleted with the response"
    );
}

#[tokio::test]
async fn an_unknown_response_id_is_a_404_in_the_openai_error_shape() {
    let (gw, tenant) = gateway().await;

    let answer = get_response(&gw, &tenant.key, "resp_doesnotexist").await;

    assert_error(&answer, 404, None, None);
    assert!(
        answer.error()["message"]
            .as_str()
            .unwrap_or_default()
            .contains("resp_doesnotexist"),
        "{:#}",
        answer.body
    );
}

/// Five input items: three without ids, one with a client id, one assistant message.
fn five_items() -> Value {
    json!([
        {"role": "user", "content": "one"},
        {"type": "message", "role": "assistant", "content": "two"},
        {"type": "message", "role": "user", "id": "msg_client_chosen", "content": "three"},
        {"role": "user", "content": [{"type": "input_text", "text": "four"}]},
        {"role": "user", "content": "five"}
    ])
}

/// The text of a listed message item.
#[allow(clippy::panic, clippy::expect_used)] // test helper: a wrong page fails the test
fn item_text(item: &Value) -> String {
    match &item["content"] {
        Value::String(text) => text.clone(),
        Value::Array(parts) => parts.iter().filter_map(|p| p["text"].as_str()).collect(),
        other => panic!("unexpected content {other}"),
    }
}

/// Walks every page with `after = last_id` and returns the texts seen, checking each page's fields.
#[allow(clippy::panic, clippy::expect_used)] // test helper: a wrong page fails the test
async fn walk(
    gw: &gateway_e2e::TestGateway,
    key: &str,
    id: &str,
    order: Option<&str>,
    limit: usize,
) -> Vec<String> {
    let mut seen = Vec::new();
    let mut ids = Vec::new();
    let mut after: Option<String> = None;
    for _ in 0..10 {
        let mut query = format!("?limit={limit}");
        if let Some(order) = order {
            query.push_str(&format!("&order={order}"));
        }
        if let Some(after) = &after {
            query.push_str(&format!("&after={after}"));
        }
        let page = input_items(gw, key, id, &query).await;
        assert_eq!(page.status.as_u16(), 200, "{:#}", page.body);
        assert_eq!(page.body["object"], "list");
        let data = page.body["data"].as_array().expect("data").clone();
        assert!(data.len() <= limit, "{:#}", page.body);
        for item in &data {
            let item_id = item["id"]
                .as_str()
                .unwrap_or_else(|| panic!("listed item without id: {item:#}"));
            assert!(!item_id.is_empty());
            ids.push(item_id.to_owned());
            seen.push(item_text(item));
        }
        assert_eq!(
            page.body["first_id"],
            data.first().map_or(Value::Null, |i| i["id"].clone()),
            "{:#}",
            page.body
        );
        assert_eq!(
            page.body["last_id"],
            data.last().map_or(Value::Null, |i| i["id"].clone()),
            "{:#}",
            page.body
        );
        if page.body["has_more"] != true {
            assert_eq!(page.body["has_more"], false);
            let mut unique = ids.clone();
            unique.sort();
            unique.dedup();
            assert_eq!(unique.len(), ids.len(), "an item was listed twice: {ids:?}");
            return seen;
        }
        assert_eq!(data.len(), limit, "a page with more after it is full");
        after = Some(
            data.last()
                .map(id_of)
                .expect("a page with has_more is not empty"),
        );
    }
    panic!("pagination did not end");
}

#[tokio::test]
async fn input_items_are_listed_newest_first_by_default_and_pages_walk_with_after() {
    let (gw, tenant) = gateway().await;
    gw.model.push(Reply::text("ok"));
    let created = create_ok(
        &gw,
        &tenant.key,
        json!({"model": "mock", "input": five_items()}),
    )
    .await;
    let id = id_of(&created);

    let first = input_items(&gw, &tenant.key, &id, "?limit=2").await;
    assert_eq!(first.status.as_u16(), 200, "{:#}", first.body);
    let texts: Vec<String> = first.body["data"]
        .as_array()
        .expect("data")
        .iter()
        .map(item_text)
        .collect();
    assert_eq!(texts, ["five", "four"]);
    assert_eq!(first.body["has_more"], true);

    let all = input_items(&gw, &tenant.key, &id, "").await;
    let data = all.body["data"].as_array().expect("data");
    assert_eq!(
        data.len(),
        5,
        "the default limit (20) lists all five: {:#}",
        all.body
    );
    assert_eq!(all.body["has_more"], false);
    assert!(
        data.iter().any(|i| i["id"] == "msg_client_chosen"),
        "a client id is kept: {:#}",
        all.body
    );

    assert_eq!(
        walk(&gw, &tenant.key, &id, None, 2).await,
        ["five", "four", "three", "two", "one"]
    );
    assert_eq!(
        walk(&gw, &tenant.key, &id, Some("desc"), 3).await,
        ["five", "four", "three", "two", "one"]
    );
}

#[tokio::test]
async fn input_items_in_ascending_order_walk_oldest_first_and_visit_every_item_once() {
    let (gw, tenant) = gateway().await;
    gw.model.push(Reply::text("ok"));
    let created = create_ok(
        &gw,
        &tenant.key,
        json!({"model": "mock", "input": five_items()}),
    )
    .await;
    let id = id_of(&created);

    let first = input_items(&gw, &tenant.key, &id, "?order=asc&limit=2").await;
    let texts: Vec<String> = first.body["data"]
        .as_array()
        .expect("data")
        .iter()
        .map(item_text)
        .collect();
    assert_eq!(texts, ["one", "two"]);
    assert_eq!(first.body["has_more"], true);

    assert_eq!(
        walk(&gw, &tenant.key, &id, Some("asc"), 2).await,
        ["one", "two", "three", "four", "five"]
    );
    assert_eq!(
        walk(&gw, &tenant.key, &id, Some("asc"), 5).await,
        ["one", "two", "three", "four", "five"]
    );
    assert_eq!(
        walk(&gw, &tenant.key, &id, Some("asc"), 1).await,
        ["one", "two", "three", "four", "five"]
    );
}

#[tokio::test]
async fn input_items_of_a_chained_response_list_the_previous_context_and_output_then_the_new_input()
{
    let (gw, tenant) = gateway().await;
    gw.model.push(Reply::text("first answer"));
    gw.model.push(Reply::text("second answer"));
    let first = create_ok(
        &gw,
        &tenant.key,
        json!({"model": "mock", "input": "first question"}),
    )
    .await;
    let second = create_ok(
        &gw,
        &tenant.key,
        json!({"model": "mock", "input": "second question", "previous_response_id": id_of(&first)}),
    )
    .await;

    let listed = input_items(&gw, &tenant.key, &id_of(&second), "?order=asc").await;

    let data = listed.body["data"].as_array().expect("data");
    let texts: Vec<String> = data.iter().map(item_text).collect();
    assert_eq!(
        texts,
        ["first question", "first answer", "second question"],
        "{:#}",
        listed.body
    );
    assert_eq!(
        data[1]["id"], first["output"][0]["id"],
        "the previous output keeps its id"
    );
    assert!(data
        .iter()
        .all(|i| i["id"].as_str().is_some_and(|id| !id.is_empty())));
}

#[tokio::test]
async fn a_response_with_store_false_is_answered_but_cannot_be_read_afterwards() {
    let (gw, tenant) = gateway().await;
    gw.model.push(Reply::text("ephemeral"));

    let body = create_ok(
        &gw,
        &tenant.key,
        json!({"model": "mock", "input": "hi", "store": false}),
    )
    .await;

    assert_eq!(body["status"], "completed");
    assert_eq!(body["store"], false);
    assert_eq!(items_of(&body, "message").len(), 1);
    assert_eq!(body["output_text"], "ephemeral");
    assert_error(
        &get_response(&gw, &tenant.key, &id_of(&body)).await,
        404,
        None,
        None,
    );
    assert_eq!(stored_rows(&gw).await, (0, 0, 0));
}
