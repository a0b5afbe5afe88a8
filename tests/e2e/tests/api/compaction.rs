//! `POST /v1/responses/compact` (SPEC 11): the deployment's model summarises a window into a sealed `compaction`
//! item; the item comes back as input and the model reads the summary; tampered or foreign items are refused.

use crate::common::*;
use gateway_e2e::{items_of, TestGateway};
use gateway_testkit::Reply;
use reqwest::Method;
use serde_json::{json, Value};

const SUMMARY: &str = "SUMMARY: launch on Tuesday, notify support first.";

/// `POST /v1/responses/compact` with `key`.
async fn compact(gw: &TestGateway, key: &str, body: Value) -> gateway_e2e::Answer {
    gw.call(
        gw.public(Method::POST, "/responses/compact", key)
            .json(&body),
    )
    .await
}

/// A compaction that must succeed; its body.
async fn compact_ok(gw: &TestGateway, key: &str, body: Value) -> Value {
    let answer = compact(gw, key, body).await;
    assert_eq!(answer.status.as_u16(), 200, "{:#}", answer.body);
    answer.body
}

fn window() -> Value {
    json!([
        {"type": "message", "role": "user", "content": "We agreed to launch on Tuesday."},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Understood: Tuesday."}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "And notify support first."}]},
    ])
}

/// The texts of the user messages of a Chat Completions request.
fn user_texts(request: &Value) -> Vec<String> {
    messages(request)
        .iter()
        .filter(|m| m["role"] == "user")
        .map(|m| m["content"].as_str().unwrap_or_default().to_owned())
        .collect()
}

#[tokio::test]
async fn a_window_is_compacted_into_its_user_messages_and_a_sealed_summary() {
    let (gw, tenant) = gateway().await;
    gw.model.push(Reply::text(SUMMARY));

    let body = compact_ok(
        &gw,
        &tenant.key,
        json!({"model": "mock", "input": window(), "instructions": "Be terse.", "prompt_cache_key": "k"}),
    )
    .await;

    assert_eq!(body["object"], "response.compaction");
    assert!(body["id"]
        .as_str()
        .is_some_and(|id| id.starts_with("resp_")));
    assert!(body["created_at"].is_i64());
    assert!(body["usage"]["total_tokens"].is_u64(), "{body:#}");
    let output = body["output"].as_array().expect("output");
    assert_eq!(output.len(), 3, "{body:#}");
    for (kept, text) in output[..2].iter().zip([
        "We agreed to launch on Tuesday.",
        "And notify support first.",
    ]) {
        assert_eq!(kept["type"], "message");
        assert_eq!(kept["role"], "user");
        assert_eq!(kept["status"], "completed");
        assert!(
            kept["id"].as_str().is_some_and(|id| id.starts_with("msg_")),
            "{kept:#}"
        );
        assert_eq!(
            kept["content"],
            json!([{"type": "input_text", "text": text}])
        );
    }
    let compaction = &output[2];
    assert_eq!(compaction["type"], "compaction");
    assert!(compaction["id"]
        .as_str()
        .is_some_and(|id| id.starts_with("cmp_")));
    let sealed = compaction["encrypted_content"].as_str().expect("sealed");
    assert!(!sealed.contains("Tuesday") && !sealed.is_empty());
    // The model saw the window, then the request to summarise it, under the request's instructions.
    let request = &gw.model.requests()[0];
    let sent = messages(request);
    assert_eq!(sent[0]["role"], "system");
    assert_eq!(sent[0]["content"], "Be terse.");
    assert_eq!(last_text_of(request, "assistant"), "Understood: Tuesday.");
    assert!(last_text_of(request, "user").starts_with("Summarize the conversation"));
    assert_eq!(stored_rows(&gw).await, (0, 0, 0), "nothing is stored");
}

#[tokio::test]
async fn a_compacted_window_continues_and_the_model_reads_the_summary() {
    let (gw, tenant) = gateway().await;
    gw.model.push(Reply::text(SUMMARY));
    gw.model.push(Reply::text("Tuesday."));
    gw.model.push(Reply::text("Support."));
    let compacted = compact_ok(
        &gw,
        &tenant.key,
        json!({"model": "mock", "input": window()}),
    )
    .await;

    let mut input = compacted["output"].as_array().expect("output").clone();
    input.push(json!({"type": "message", "role": "user", "content": "Which day?"}));
    let next = create_ok(&gw, &tenant.key, json!({"model": "mock", "input": input})).await;
    assert_eq!(next["output_text"], "Tuesday.");
    let seen = user_texts(&gw.model.requests()[1]);
    assert_eq!(
        seen,
        [
            "We agreed to launch on Tuesday.".to_owned(),
            "And notify support first.".to_owned(),
            format!("Summary of the earlier conversation, which was compacted:\n{SUMMARY}"),
            "Which day?".to_owned(),
        ]
    );
    // What is stored and shown is the sealed item, never the summary.
    let items = input_items(&gw, &tenant.key, &id_of(&next), "?order=asc").await;
    let shown = items.body["data"].as_array().expect("data");
    assert_eq!(shown[2]["type"], "compaction", "{:#}", items.body);
    assert_eq!(
        shown[2]["encrypted_content"],
        compacted["output"][2]["encrypted_content"]
    );
    assert!(!items.body.to_string().contains("SUMMARY"));

    // A chain from there opens the stored item again.
    create_ok(
        &gw,
        &tenant.key,
        json!({"model": "mock", "previous_response_id": id_of(&next), "input": "Who first?"}),
    )
    .await;
    assert!(user_texts(&gw.model.requests()[2])
        .iter()
        .any(|text| text.ends_with(SUMMARY)));
}

#[tokio::test]
async fn a_tampered_compaction_item_is_refused_naming_it() {
    let (gw, tenant) = gateway().await;
    gw.model.push(Reply::text(SUMMARY));
    let compacted = compact_ok(
        &gw,
        &tenant.key,
        json!({"model": "mock", "input": window()}),
    )
    .await;
    let mut item = compacted["output"][2].clone();
    let sealed = item["encrypted_content"]
        .as_str()
        .expect("sealed")
        .to_owned();
    let middle = sealed.len() / 2;
    let flipped = if &sealed[middle..=middle] == "A" {
        "B"
    } else {
        "A"
    };
    item["encrypted_content"] = json!(format!(
        "{}{flipped}{}",
        &sealed[..middle],
        &sealed[middle + 1..]
    ));

    let answer = gw
        .create(
            &tenant.key,
            json!({"model": "mock", "input": [{"role": "user", "content": "hi"}, item]}),
        )
        .await;

    assert_error(
        &answer,
        400,
        Some("input[1]"),
        Some("invalid_encrypted_content"),
    );
    assert_eq!(gw.model.requests().len(), 1, "the model was not called");
    assert_eq!(stored_rows(&gw).await, (0, 0, 0));
}

#[tokio::test]
async fn another_projects_compaction_item_is_refused() {
    let (gw, tenant) = gateway().await;
    let other = gw.tenant("globex").await;
    gw.model.push(Reply::text(SUMMARY));
    let compacted = compact_ok(
        &gw,
        &tenant.key,
        json!({"model": "mock", "input": window()}),
    )
    .await;
    let item = compacted["output"][2].clone();

    let answer = gw
        .create(
            &other.key,
            json!({"model": "mock", "input": [item.clone()]}),
        )
        .await;
    assert_error(
        &answer,
        400,
        Some("input[0]"),
        Some("invalid_encrypted_content"),
    );
    // Compacting it again elsewhere is refused the same way.
    let again = compact(&gw, &other.key, json!({"model": "mock", "input": [item]})).await;
    assert_error(
        &again,
        400,
        Some("input[0]"),
        Some("invalid_encrypted_content"),
    );
    assert_eq!(gw.model.requests().len(), 1);
}

#[tokio::test]
async fn a_previous_response_is_compacted_with_the_new_input() {
    let (gw, tenant) = gateway().await;
    gw.model.push(Reply::text("Hello, Ada."));
    gw.model.push(Reply::text(SUMMARY));
    let first = create_ok(
        &gw,
        &tenant.key,
        json!({"model": "mock", "input": "I am Ada."}),
    )
    .await;

    let body = compact_ok(
        &gw,
        &tenant.key,
        json!({"model": "mock", "previous_response_id": id_of(&first), "input": "Remember that."}),
    )
    .await;

    let output = body["output"].as_array().expect("output");
    let kept: Vec<&Value> = output.iter().filter(|i| i["type"] == "message").collect();
    assert_eq!(kept.len(), 2, "{body:#}");
    assert_eq!(items_of(&body, "compaction").len(), 1);
    let request = &gw.model.requests()[1];
    let texts = user_texts(request);
    assert_eq!(texts[0], "I am Ada.");
    assert_eq!(texts[1], "Remember that.");
    assert_eq!(last_text_of(request, "assistant"), "Hello, Ada.");
}

#[tokio::test]
async fn compaction_requests_are_checked_like_creates() {
    let (gw, tenant) = gateway().await;

    let no_model = compact(&gw, &tenant.key, json!({"input": window()})).await;
    assert_error(
        &no_model,
        400,
        Some("model"),
        Some("missing_required_parameter"),
    );
    let nothing = compact(&gw, &tenant.key, json!({"model": "mock"})).await;
    assert_error(&nothing, 400, Some("input"), None);
    let unknown = compact(
        &gw,
        &tenant.key,
        json!({"model": "mock", "previous_response_id": "resp_nope", "input": "x"}),
    )
    .await;
    assert_error(
        &unknown,
        400,
        Some("previous_response_id"),
        Some("previous_response_not_found"),
    );
    let no_key = gw
        .call(
            gw.public(Method::POST, "/responses/compact", "sk-wrong")
                .json(&json!({"model": "mock"})),
        )
        .await;
    assert_eq!(no_key.status.as_u16(), 401);
    assert_eq!(gw.model.requests().len(), 0);
}

#[tokio::test]
async fn a_model_that_fails_to_summarise_is_a_retryable_server_error() {
    let (gw, tenant) = gateway().await;
    for _ in 0..3 {
        gw.model.push(Reply::error(500, "upstream secret"));
    }
    let answer = compact(
        &gw,
        &tenant.key,
        json!({"model": "mock", "input": window()}),
    )
    .await;
    assert_error(&answer, 500, None, Some("server_error"));
    assert!(!answer.body.to_string().contains("secret"));
    assert_eq!(answer.headers["x-should-retry"], "true");
}

#[tokio::test]
async fn a_compaction_the_provider_refuses_is_a_400_upstream_rejected_not_to_be_retried() {
    let (gw, tenant) = gateway().await;
    gw.model.push(Reply::error(
        400,
        "This model's maximum context length is 10 tokens.",
    ));
    let answer = compact(
        &gw,
        &tenant.key,
        json!({"model": "mock", "input": window()}),
    )
    .await;
    assert_error(&answer, 400, None, Some("upstream_rejected"));
    assert_eq!(
        answer
            .headers
            .get("x-should-retry")
            .and_then(|v| v.to_str().ok()),
        Some("false")
    );
    assert!(answer.error()["message"]
        .as_str()
        .unwrap_or_default()
        .contains("maximum context length"));
    assert_eq!(gw.model.requests().len(), 1, "not retried");
}
