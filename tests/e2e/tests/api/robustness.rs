//! Inputs that stores or parsers choke on: NUL characters, deleting a running response, unknown methods.

use crate::common::*;
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
async fn a_response_recorded_as_running_is_deleted_with_everything_it_stored() {
    let (gw, tenant) = gateway().await;
    gw.model.push(Reply::text("done"));
    let body = create_ok(&gw, &tenant.key, json!({"model": "mock", "input": "hi"})).await;
    let id = body["id"].as_str().expect("id");
    // Stand in for a response whose loop runs elsewhere (`durability` deletes one that really runs).
    running_elsewhere(&gw, id).await;

    let answer = delete_response(&gw, &tenant.key, id).await;

    assert_eq!(answer.status, 200, "{:#}", answer.body);
    assert_eq!(answer.body["deleted"], true);
    assert_eq!(stored_rows(&gw).await, (0, 0, 0));
    assert_eq!(get_response(&gw, &tenant.key, id).await.status, 404);
}

#[tokio::test]
async fn an_unsupported_method_is_a_405_in_the_openai_shape() {
    let (gw, tenant) = gateway().await;

    let answer = gw
        .call(gw.public(Method::GET, "/responses", &tenant.key))
        .await;

    assert_error(&answer, 405, None, Some("method_not_allowed"));
}

#[tokio::test]
async fn a_deployment_deleted_while_its_response_runs_leaves_the_response_whole() {
    let (gw, tenant) = gateway().await;
    gw.model
        .push(Reply::text("Still here.").with_delay(std::time::Duration::from_secs(2)));
    let created = tokio::spawn(
        gw.public(Method::POST, "/responses", &tenant.key)
            .json(&json!({"model": "mock", "input": "Hi"}))
            .send(),
    );
    let reached = async {
        while gw.model.requests().is_empty() {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(8), reached)
        .await
        .expect("the model call starts");
    gw.admin_ok(
        Method::DELETE,
        &format!("/deployments/{}?force=true", tenant.deployment_id),
        None,
    )
    .await;

    let answer = created.await.expect("task").expect("create");
    assert_eq!(answer.status(), 200);
    let body: serde_json::Value = answer.json().await.expect("body");
    assert_eq!(body["output_text"], "Still here.");
    let stored = get_response(&gw, &tenant.key, &id_of(&body)).await;
    assert_eq!(stored.status, 200, "{:#}", stored.body);
    assert_eq!(stored.body["status"], "completed");
}

#[tokio::test]
async fn a_store_with_no_free_connection_at_the_end_is_a_retryable_503_that_stored_nothing() {
    let gw = gateway_e2e::TestGateway::start_with(|c| {
        c.database.max_connections = 1;
        c.database.acquire_timeout_ms = 200;
    })
    .await;
    let tenant = gw.tenant("acme").await;
    // Resolve the key and model once, so that the next request needs the store only for its one write.
    gw.model.push(Reply::text("Warm."));
    assert_eq!(
        gw.create(&tenant.key, json!({"model": "mock", "input": "Hi"}))
            .await
            .status,
        200
    );
    let before = stored_rows(&gw).await;
    let gateway::store::Backend::Postgres(pool) = gw.store.backend() else {
        // The embedded store's pool is not shared this way; the Postgres run covers it.
        return;
    };
    let held = pool.acquire().await.expect("the pool's one connection");

    gw.model.push(Reply::text("Lost."));
    let answer = gw
        .create(&tenant.key, json!({"model": "mock", "input": "Hi"}))
        .await;
    drop(held);

    assert_error(&answer, 503, None, Some("server_overloaded"));
    assert_eq!(answer.headers["x-should-retry"], "true");
    assert_eq!(answer.headers["retry-after"], "1");
    assert_eq!(stored_rows(&gw).await, before, "nothing was stored");
}
