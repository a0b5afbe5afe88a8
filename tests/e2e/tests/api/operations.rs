//! Operations: health, readiness, metrics, request ids.

use crate::common::*;
use gateway_testkit::{Call, Reply};
use reqwest::Method;
use serde_json::json;

#[tokio::test]
async fn health_and_readiness_answer_on_both_stores() {
    for gw in [
        gateway_e2e::TestGateway::start().await,
        gateway_e2e::TestGateway::start_embedded().await,
    ] {
        let health = gw
            .http
            .get(format!("{}/healthz", gw.base_url))
            .send()
            .await
            .expect("healthz");
        assert_eq!(health.status(), 200);
        let ready = gw
            .http
            .get(format!("{}/readyz", gw.base_url))
            .send()
            .await
            .expect("readyz");
        assert_eq!(ready.status(), 200);
        assert_eq!(ready.text().await.expect("body"), "ready");
    }
}

#[tokio::test]
async fn every_answer_carries_a_request_id_and_keeps_the_clients() {
    let (gw, tenant) = gateway().await;
    let mine = gw
        .http
        .get(format!("{}/v1/responses/resp_x", gw.base_url))
        .bearer_auth(&tenant.key)
        .header("x-request-id", "trace-me-1")
        .send()
        .await
        .expect("request");
    assert_eq!(mine.headers()["x-request-id"], "trace-me-1");
    let fresh = gw
        .http
        .get(format!("{}/healthz", gw.base_url))
        .send()
        .await
        .expect("request");
    assert!(!fresh.headers()["x-request-id"].is_empty());
}

/// The value of the sample of `name` whose labels contain every one of `labels`, or 0.
#[tokio::test]
async fn a_request_moves_the_counters_it_should() {
    let (gw, tenant) = gateway_with_tools(&["add"]).await;
    let before = metrics_text(&gw).await;
    gw.model.push(Reply::tool_calls(vec![Call::new(
        "add",
        json!({"a": 1, "b": 2}),
    )]));
    gw.model.push(Reply::text("3"));

    let answer = gw
        .call(
            gw.public(Method::POST, "/responses", &tenant.key)
                .json(&json!({"model": "mock", "input": "add"})),
        )
        .await;
    assert_eq!(answer.status, 200);
    let after = metrics_text(&gw).await;

    let moved =
        |name: &str, labels: &[&str]| sample(&after, name, labels) - sample(&before, name, labels);
    assert_eq!(
        moved(
            "gateway_http_requests_total",
            &["route=\"/v1/responses\"", "status=\"200\""]
        ),
        1.0,
        "{after}"
    );
    assert_eq!(
        moved(
            "gateway_tool_calls_total",
            &["tool=\"add\"", "outcome=\"ok\""]
        ),
        1.0,
        "{after}"
    );
    assert_eq!(
        moved(
            "gateway_upstream_calls_total",
            &["deployment=\"mock\"", "outcome=\"ok\""]
        ),
        2.0,
        "{after}"
    );
    assert_eq!(
        moved("gateway_responses_total", &["status=\"completed\""]),
        1.0,
        "{after}"
    );
    assert!(
        moved("gateway_loop_model_calls_count", &[]) >= 1.0,
        "{after}"
    );
    assert!(
        moved(
            "gateway_tool_call_duration_seconds_count",
            &["tool=\"add\""]
        ) >= 1.0,
        "{after}"
    );
    assert!(
        moved(
            "gateway_store_duration_seconds_count",
            &["op=\"create_response\""]
        ) >= 1.0,
        "{after}"
    );
    assert!(
        moved(
            "gateway_upstream_call_duration_seconds_count",
            &["deployment=\"mock\""]
        ) >= 2.0,
        "{after}"
    );
}

#[tokio::test]
async fn a_full_gateway_refuses_a_new_response_at_once_and_takes_the_next_one_after() {
    let gw = gateway_e2e::TestGateway::start_with(|c| c.server.max_active_responses = 1).await;
    let tenant = gw.tenant("acme").await;
    gw.attach_tool(&tenant.group_id, "barrier").await;
    // The first response waits in a barrier tool call until the test releases it.
    let first = create_waiting_in_barrier(&gw, &tenant.key).await;

    let refused = gw
        .create(&tenant.key, json!({"model": "mock", "input": "Hi"}))
        .await;
    assert_error(&refused, 503, None, Some("server_overloaded"));
    assert_eq!(refused.error()["type"], "server_error");
    assert_eq!(refused.headers["retry-after"], "1");
    assert_eq!(refused.headers["x-should-retry"], "true");
    assert_eq!(gw.model.requests().len(), 1, "the refused one did no work");
    assert_eq!(stored_rows(&gw).await.0, 1, "and stored nothing");
    let metrics = metrics_text(&gw).await;
    assert_eq!(
        sample(
            &metrics,
            "gateway_responses_refused_total",
            &["reason=\"overloaded\""]
        ),
        1.0
    );

    release_barrier(&gw, 2).await;
    let first = first.await.expect("task").expect("first create");
    assert_eq!(first.status(), 200);
    gw.model.push(Reply::text("Room again."));
    let next = gw
        .create(&tenant.key, json!({"model": "mock", "input": "Hi"}))
        .await;
    assert_eq!(next.status, 200, "{:#}", next.body);
}

#[tokio::test]
async fn a_stream_waiting_on_a_slow_tool_sends_keep_alive_comments() {
    let gw = gateway_e2e::TestGateway::start_with(|config| config.server.keep_alive_ms = 20).await;
    let tenant = gw.tenant("acme").await;
    gw.attach_tool(&tenant.group_id, "gate").await;
    gw.model.push(Reply::tool_calls(vec![
        Call::new("gate", json!({})).with_id("call_gate")
    ]));
    gw.model.push(Reply::text("Through."));
    let mut response = gw
        .public(Method::POST, "/responses", &tenant.key)
        .json(&json!({"model": "mock", "input": "wait", "stream": true}))
        .send()
        .await
        .expect("stream");
    let mut seen = String::new();
    // The tool holds the response until the gate opens: only keep-alives can arrive meanwhile.
    let keep_alive_while_the_tool_runs = |seen: &str| {
        seen.find("response.mcp_call.in_progress")
            .is_some_and(|at| seen[at..].contains(": keep-alive\n\n"))
    };
    while !keep_alive_while_the_tool_runs(&seen) {
        let chunk = response
            .chunk()
            .await
            .expect("chunk")
            .expect("the stream stays open");
        seen.push_str(&String::from_utf8_lossy(&chunk));
        assert!(
            !seen.contains("response.completed"),
            "the gate is still closed: {seen}"
        );
    }
    gw.tools.open_gate();
    while let Some(chunk) = response.chunk().await.expect("chunk") {
        seen.push_str(&String::from_utf8_lossy(&chunk));
    }
    assert!(seen.contains("event: response.completed"), "{seen}");
}

#[tokio::test]
async fn metrics_ask_for_their_token_when_one_is_set() {
    let gw = gateway_e2e::TestGateway::start_with(|config| {
        config.admin.metrics_token = Some("scrape-me".to_owned().into());
    })
    .await;
    let url = format!("{}/metrics", gw.base_url);
    let open = gw.http.get(&url).send().await.expect("metrics");
    assert_eq!(open.status(), 401);
    let body: serde_json::Value = open.json().await.expect("json");
    assert_eq!(body["error"]["code"], "invalid_metrics_token");
    let wrong = gw
        .http
        .get(&url)
        .bearer_auth("nope")
        .send()
        .await
        .expect("metrics");
    assert_eq!(wrong.status(), 401);
    let scraped = gw
        .http
        .get(&url)
        .bearer_auth("scrape-me")
        .send()
        .await
        .expect("metrics");
    assert_eq!(scraped.status(), 200);
    assert!(scraped.text().await.expect("text").contains("# TYPE"));
}
