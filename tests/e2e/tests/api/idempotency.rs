//! Creates carrying an `Idempotency-Key` run once: a repeat answers what the first answered.

use crate::common::*;
use gateway_testkit::{Call, Reply};
use reqwest::Method;
use serde_json::json;

#[tokio::test]
async fn a_repeated_create_with_the_same_key_answers_the_first_response_without_running_again() {
    let (gw, tenant) = gateway_with_tools(&["add"]).await;
    gw.model.push(Reply::tool_calls(vec![Call::new(
        "add",
        json!({"a": 2, "b": 3}),
    )]));
    gw.model.push(Reply::text("five"));
    let body = json!({"model": "mock", "input": "add"});
    let send = || {
        gw.call(
            gw.public(Method::POST, "/responses", &tenant.key)
                .header("Idempotency-Key", "order-17")
                .json(&body),
        )
    };

    let first = send().await;
    let second = send().await;

    assert_eq!(first.status, 200, "{:#}", first.body);
    assert_eq!(second.status, 200, "{:#}", second.body);
    assert_eq!(first.body, second.body);
    assert_eq!(gw.tools.calls().len(), 1);
    assert_eq!(gw.model.requests().len(), 2);
    assert_eq!(stored_rows(&gw).await.0, 1);
}

#[tokio::test]
async fn the_same_key_in_another_project_is_another_request() {
    let (gw, tenant) = gateway().await;
    let other = gw.tenant("other").await;
    gw.model.push(Reply::text("one"));
    gw.model.push(Reply::text("two"));
    let create = |key: &str| {
        gw.call(
            gw.public(Method::POST, "/responses", key)
                .header("Idempotency-Key", "shared")
                .json(&json!({"model": "mock", "input": "hi"})),
        )
    };

    let mine = create(&tenant.key).await;
    let theirs = create(&other.key).await;

    assert_eq!(mine.body["output_text"], "one");
    assert_eq!(theirs.body["output_text"], "two");
    assert_ne!(mine.body["id"], theirs.body["id"]);
}

#[tokio::test]
async fn a_repeated_create_of_a_failed_response_answers_the_same_error_without_calling_upstream() {
    let (gw, tenant) = gateway().await;
    for _ in 0..3 {
        gw.model.push(Reply::error(500, "upstream down"));
    }
    let send = || {
        gw.call(
            gw.public(Method::POST, "/responses", &tenant.key)
                .header("Idempotency-Key", "k-1")
                .json(&json!({"model": "mock", "input": "hi"})),
        )
    };

    let first = send().await;
    let calls_after_first = gw.model.requests().len();
    let second = send().await;

    assert_eq!(first.status, 500);
    assert_eq!(second.status, 500);
    assert_eq!(first.body, second.body);
    assert_eq!(second.headers["x-should-retry"], "false");
    assert_eq!(gw.model.requests().len(), calls_after_first);
}

#[tokio::test]
async fn a_key_that_is_not_visible_ascii_is_a_400_and_stores_nothing() {
    let (gw, tenant) = gateway().await;

    let answer = gw
        .call(
            gw.public(Method::POST, "/responses", &tenant.key)
                .header("Idempotency-Key", "has space")
                .json(&json!({"model": "mock", "input": "hi"})),
        )
        .await;

    assert_error(&answer, 400, None, Some("invalid_idempotency_key"));
    assert_eq!(stored_rows(&gw).await.0, 0);
    assert!(gw.model.requests().is_empty());
}

#[tokio::test]
async fn a_repeat_while_the_first_still_runs_is_a_retryable_409() {
    let (gw, tenant) = gateway().await;
    gw.model.push(Reply::text("done"));
    let send = || {
        gw.call(
            gw.public(Method::POST, "/responses", &tenant.key)
                .header("Idempotency-Key", "slow-one")
                .json(&json!({"model": "mock", "input": "hi"})),
        )
    };
    let first = send().await;
    // Stand in for a create that is still running, as a slow one would be.
    running_elsewhere(&gw, first.body["id"].as_str().expect("id")).await;

    let second = send().await;

    assert_error(&second, 409, None, Some("conflict"));
    assert_eq!(second.headers["x-should-retry"], "true");
}

#[tokio::test]
async fn a_key_on_an_unstored_response_is_a_400() {
    let (gw, tenant) = gateway().await;

    let answer = gw
        .call(
            gw.public(Method::POST, "/responses", &tenant.key)
                .header("Idempotency-Key", "k")
                .json(&json!({"model": "mock", "input": "hi", "store": false})),
        )
        .await;

    assert_error(&answer, 400, Some("store"), None);
    assert!(gw.model.requests().is_empty());
}

#[tokio::test]
async fn creates_sent_together_with_one_key_run_once_and_all_answer_its_response() {
    let (gw, tenant) = gateway().await;
    // Slow enough that every repeat arrives while the first still runs.
    gw.model
        .push(Reply::text("once").with_delay(std::time::Duration::from_millis(500)));
    let send = || {
        gw.call(
            gw.public(Method::POST, "/responses", &tenant.key)
                .header("Idempotency-Key", "together")
                .json(&json!({"model": "mock", "input": "hi"})),
        )
    };

    let answers = futures::future::join_all((0..6).map(|_| send())).await;

    for answer in &answers {
        assert_eq!(answer.status, 200, "{:#}", answer.body);
        assert_eq!(answer.body, answers[0].body);
    }
    assert_eq!(answers[0].body["output_text"], "once");
    assert_eq!(gw.model.requests().len(), 1);
    assert_eq!(stored_rows(&gw).await.0, 1);
}

#[tokio::test]
async fn a_key_used_again_with_another_body_is_refused_and_runs_nothing() {
    let (gw, tenant) = gateway().await;
    gw.model.push(Reply::text("Hello"));
    let send = |input: &str| {
        gw.call(
            gw.public(Method::POST, "/responses", &tenant.key)
                .header("Idempotency-Key", "order-18")
                .json(&json!({"model": "mock", "input": input})),
        )
    };

    let first = send("hi").await;
    let other = send("something else").await;
    let again = send("hi").await;

    assert_eq!(first.status, 200, "{:#}", first.body);
    // Not the first response, which answered another request; not retryable either.
    assert_error(&other, 400, None, Some("idempotency_key_reused"));
    assert_eq!(
        other
            .headers
            .get("x-should-retry")
            .and_then(|v| v.to_str().ok()),
        Some("false")
    );
    let first_id = first.body["id"].as_str().expect("id");
    assert!(
        other.error()["message"]
            .as_str()
            .is_some_and(|m| m.contains(first_id)),
        "{:#}",
        other.body
    );
    // The same body is still a repeat.
    assert_eq!(again.status, 200, "{:#}", again.body);
    assert_eq!(again.body, first.body);
    assert_eq!(gw.model.requests().len(), 1);
    assert_eq!(stored_rows(&gw).await.0, 1);
}
