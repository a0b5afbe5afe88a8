//! An upstream's 4xx that is the client's problem (SPEC 8): `400 upstream_rejected` with the provider's message,
//! secrets stripped; never retried; stored as `failed`; in a stream an `error` event, then `response.failed`.

use crate::common::sse::{check_stream, post_stream};
use crate::common::*;
use gateway_testkit::Reply;
use serde_json::json;

const LEAKY: &str = "This model's maximum context length is 10 tokens. Key sk-proj-0123456789abcdef, header Bearer abcdefghijklmnopqrstu";

fn assert_provider_message_without_secrets(message: &str) {
    assert!(
        message.contains("maximum context length is 10 tokens"),
        "the provider's message is passed on: {message}"
    );
    assert!(!message.contains("sk-proj"), "a key leaked: {message}");
    assert!(
        !message.contains("abcdefghijklmnopqrstu"),
        "a token leaked: {message}"
    );
}

#[tokio::test]
async fn an_upstream_400_is_a_client_400_upstream_rejected_with_the_providers_message_and_no_retry()
{
    let (gw, tenant) = gateway().await;
    gw.model.push(Reply::error(400, LEAKY));
    gw.model.push(Reply::text("never used"));

    let answer = gw
        .create(&tenant.key, json!({"model": "mock", "input": "hi"}))
        .await;

    assert_error(&answer, 400, None, Some("upstream_rejected"));
    assert_eq!(
        answer
            .headers
            .get("x-should-retry")
            .and_then(|v| v.to_str().ok()),
        Some("false")
    );
    assert_provider_message_without_secrets(answer.error()["message"].as_str().unwrap());
    assert_eq!(gw.model.requests().len(), 1, "not retried");
    assert_eq!(gw.model.pending(), 1);
    let stored = stored_statuses(&gw).await;
    assert_eq!(stored.len(), 1, "{stored:?}");
    assert_eq!(stored[0].1, "failed");
    let read = get_response(&gw, &tenant.key, &stored[0].0).await;
    assert_eq!(
        read.body["error"]["code"], "upstream_rejected",
        "{:#}",
        read.body
    );
}

#[tokio::test]
async fn other_client_statuses_are_rejections_but_408_409_and_429_are_retried() {
    let (gw, tenant) = gateway().await;
    gw.model.push(Reply::error(422, "unprocessable schema"));
    let answer = gw
        .create(&tenant.key, json!({"model": "mock", "input": "hi"}))
        .await;
    assert_error(&answer, 400, None, Some("upstream_rejected"));
    assert!(answer.error()["message"]
        .as_str()
        .unwrap()
        .contains("unprocessable schema"));

    for status in [408, 409, 429] {
        gw.model.push(Reply::error(status, "try later"));
        gw.model.push(Reply::text("fine now"));
        let body = create_ok(&gw, &tenant.key, json!({"model": "mock", "input": "hi"})).await;
        assert_eq!(body["output_text"], "fine now", "{status}");
    }
}

#[tokio::test]
async fn a_streamed_upstream_400_is_an_error_event_then_response_failed() {
    let (gw, tenant) = gateway().await;
    gw.model.push(Reply::error(400, LEAKY));
    gw.model.push(Reply::text("never used"));

    let checked =
        check_stream(post_stream(&gw, &tenant.key, json!({"model": "mock", "input": "hi"})).await);

    assert_eq!(checked.terminal_kind(), "response.failed");
    let error = checked.error_event().expect("an error event");
    assert_eq!(error["code"], "upstream_rejected", "{error:#}");
    assert_eq!(error["error"]["type"], "invalid_request_error", "{error:#}");
    assert_provider_message_without_secrets(error["message"].as_str().unwrap());
    assert_eq!(checked.terminal["error"]["code"], "upstream_rejected");
    assert_eq!(gw.model.requests().len(), 1, "not retried");
    let stored = get_response(&gw, &tenant.key, &checked.id()).await;
    assert_eq!(stored.body["status"], "failed");
    assert_eq!(stored.body["error"]["code"], "upstream_rejected");
}
