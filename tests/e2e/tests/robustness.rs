//! Inputs that stores or parsers choke on: NUL characters, deleting a running response, unknown methods.

mod common;

use common::*;
use gateway_testkit::Reply;
use reqwest::Method;
use serde_json::json;

#[tokio::test]
async fn a_nul_character_in_the_request_is_a_400_and_stores_nothing() {
    let (gw, tenant) = gateway().await;

    let answer = gw
        .call(
            gw.public(Method::POST, "/responses", &tenant.key)
                .header("content-type", "application/json")
                .body(r#"{"model": "mock", "input": "a\u0000b"}"#),
        )
        .await;

    assert_error(&answer, 400, None, Some("invalid_nul_character"));
    assert_eq!(stored_rows(&gw).await.0, 0);
}

#[tokio::test]
async fn a_nul_character_from_the_model_is_replaced_and_the_response_completes() {
    for gw in [
        gateway_e2e::TestGateway::start().await,
        gateway_e2e::TestGateway::start_embedded().await,
    ] {
        let tenant = gw.tenant("acme").await;
        gw.model.push(Reply::text("a\u{0}b"));

        let body = create_ok(&gw, &tenant.key, json!({"model": "mock", "input": "hi"})).await;

        assert_eq!(body["status"], "completed");
        assert_eq!(body["output_text"], "a\u{FFFD}b");
        let stored = get_response(&gw, &tenant.key, body["id"].as_str().expect("id")).await;
        assert_eq!(stored.body["output_text"], "a\u{FFFD}b");
    }
}

#[tokio::test]
async fn a_running_response_cannot_be_deleted() {
    let (gw, tenant) = gateway().await;
    gw.model.push(Reply::text("done"));
    let body = create_ok(&gw, &tenant.key, json!({"model": "mock", "input": "hi"})).await;
    let id = body["id"].as_str().expect("id");
    // Stand in for a response whose loop is still running.
    gw.execute(
        "UPDATE responses SET status = 'in_progress' WHERE id = $1",
        id,
    )
    .await;

    let answer = delete_response(&gw, &tenant.key, id).await;

    assert_error(&answer, 400, None, Some("response_in_progress"));
    assert_eq!(stored_rows(&gw).await.0, 1);
}

#[tokio::test]
async fn an_unsupported_method_is_a_405_in_the_openai_shape() {
    let (gw, tenant) = gateway().await;

    let answer = gw
        .call(gw.public(Method::GET, "/responses", &tenant.key))
        .await;

    assert_error(&answer, 405, None, Some("method_not_allowed"));
}
