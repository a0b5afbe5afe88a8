//! Tests of the example tool server over real HTTP.

use gateway_testkit::{tool_definitions, ToolServer};
use serde_json::{json, Value};

mod common;
use common::{content_type, send, TestResult};

async fn call(tools: &ToolServer, tool: &str, args: Value) -> anyhow::Result<(u16, Value)> {
    send(reqwest::Client::new().post(tools.url(tool)).json(&args)).await
}

#[tokio::test]
async fn get_weather_is_deterministic_and_depends_on_the_city() -> TestResult {
    let tools = ToolServer::start().await?;
    let (status, paris) = call(&tools, "get_weather", json!({"city": "Paris"})).await?;
    assert_eq!(status, 200);
    assert_eq!(paris["city"], "Paris");
    assert_eq!(paris["forecast"], "sunny");
    assert!(paris["temperature_c"].is_i64());
    let (_, again) = call(&tools, "get_weather", json!({"city": "Paris"})).await?;
    assert_eq!(paris, again);
    let (_, oslo) = call(&tools, "get_weather", json!({"city": "Oslo"})).await?;
    assert_ne!(paris["temperature_c"], oslo["temperature_c"]);
    let (status, body) = call(&tools, "get_weather", json!({})).await?;
    assert_eq!(status, 400);
    assert!(body["error"].is_string());
    Ok(())
}

#[tokio::test]
async fn add_sums_numbers_and_rejects_missing_or_invalid_arguments() -> TestResult {
    let tools = ToolServer::start().await?;
    assert_eq!(
        call(&tools, "add", json!({"a": 2, "b": 40})).await?,
        (200, json!({"sum": 42}))
    );
    assert_eq!(
        call(&tools, "add", json!({"a": 1.5, "b": 1})).await?,
        (200, json!({"sum": 2.5}))
    );
    let (status, body) = call(&tools, "add", json!({"a": 1})).await?;
    assert_eq!(status, 400);
    assert!(body["error"].is_string());
    let (status, _) = call(&tools, "add", json!({"a": "1", "b": 2})).await?;
    assert_eq!(status, 400);
    Ok(())
}

#[tokio::test]
async fn echo_returns_the_arguments_and_fail_and_unknown_tools_return_errors() -> TestResult {
    let tools = ToolServer::start().await?;
    let args = json!({"nested": {"list": [1, "two", null]}});
    assert_eq!(
        call(&tools, "echo", args.clone()).await?,
        (200, json!({"echo": args}))
    );
    assert_eq!(
        call(&tools, "fail", json!({})).await?,
        (500, json!({"error": "tool exploded"}))
    );
    assert_eq!(
        call(&tools, "nope", json!({})).await?,
        (404, json!({"error": "unknown tool"}))
    );
    Ok(())
}

#[tokio::test]
async fn plain_text_answers_with_a_text_plain_body() -> TestResult {
    let tools = ToolServer::start().await?;
    let response = reqwest::Client::new()
        .post(tools.url("plain_text"))
        .json(&json!({}))
        .send()
        .await?;
    assert_eq!(response.status().as_u16(), 200);
    let content_type = content_type(&response);
    assert!(content_type.starts_with("text/plain"), "{content_type}");
    assert_eq!(response.text().await?, "plain text answer");
    Ok(())
}

#[tokio::test]
async fn slow_answers_after_the_requested_time() -> TestResult {
    let tools = ToolServer::start().await?;
    let started = std::time::Instant::now();
    assert_eq!(
        call(&tools, "slow", json!({"ms": 50})).await?,
        (200, json!({"slept_ms": 50}))
    );
    assert!(started.elapsed() >= std::time::Duration::from_millis(50));
    let (status, _) = call(&tools, "slow", json!({"ms": -1})).await?;
    assert_eq!(status, 400);
    Ok(())
}

#[tokio::test]
async fn a_barrier_of_three_releases_three_concurrent_calls() -> TestResult {
    let tools = ToolServer::start().await?;
    let (a, b, c) = tokio::join!(
        call(&tools, "barrier", json!({"n": 3})),
        call(&tools, "barrier", json!({"n": 3})),
        call(&tools, "barrier", json!({"n": 3})),
    );
    for result in [a?, b?, c?] {
        assert_eq!(result, (200, json!({"released": true, "n": 3})));
    }
    assert!(
        tools.max_in_flight() >= 3,
        "max in flight {}",
        tools.max_in_flight()
    );
    assert_eq!(tools.calls().len(), 3);
    Ok(())
}

// The paused clock jumps to the barrier's 10 s deadline as soon as nothing else can progress.
#[tokio::test(start_paused = true)]
async fn a_barrier_that_is_never_reached_answers_504_after_its_timeout() -> TestResult {
    let tools = ToolServer::start().await?;
    assert_eq!(
        call(&tools, "barrier", json!({"n": 2})).await?,
        (504, json!({"error": "barrier not reached"}))
    );
    // The timed-out call left the barrier: two new calls are released together.
    let (a, b) = tokio::join!(
        call(&tools, "barrier", json!({"n": 2})),
        call(&tools, "barrier", json!({"n": 2})),
    );
    assert_eq!(a?, (200, json!({"released": true, "n": 2})));
    assert_eq!(b?, (200, json!({"released": true, "n": 2})));
    Ok(())
}

#[tokio::test]
async fn a_barrier_of_one_releases_at_once() -> TestResult {
    let tools = ToolServer::start().await?;
    assert_eq!(
        call(&tools, "barrier", json!({"n": 1})).await?,
        (200, json!({"released": true, "n": 1}))
    );
    assert_eq!(tools.max_in_flight(), 1);
    Ok(())
}

#[tokio::test]
async fn every_call_is_recorded_in_order_with_headers_and_body() -> TestResult {
    let tools = ToolServer::start().await?;
    let client = reqwest::Client::new();
    client
        .post(tools.url("echo"))
        .header("Authorization", "Bearer tool-secret")
        .header("X-Request-Id", "req-1")
        .json(&json!({"x": 1}))
        .send()
        .await?;
    client
        .post(tools.url("fail"))
        .json(&json!({}))
        .send()
        .await?;
    client
        .post(tools.url("echo"))
        .body("not json")
        .send()
        .await?;

    let calls = tools.calls();
    assert_eq!(calls.len(), 3);
    assert_eq!(calls[0].tool, "echo");
    assert_eq!(calls[0].body, json!({"x": 1}));
    assert_eq!(calls[0].header("authorization"), Some("Bearer tool-secret"));
    assert_eq!(calls[0].header("X-Request-ID"), Some("req-1"));
    assert!(calls[0]
        .headers
        .iter()
        .all(|(n, _)| *n == n.to_ascii_lowercase()));
    assert_eq!(calls[1].tool, "fail");
    assert_eq!(calls[2].body, Value::Null);
    assert_eq!(calls[2].header("authorization"), None);
    Ok(())
}

#[tokio::test]
async fn tool_definitions_describe_every_tool_with_an_object_schema() -> TestResult {
    let definitions = tool_definitions();
    let names: Vec<&str> = definitions.iter().map(|d| d.name).collect();
    assert_eq!(
        names,
        vec![
            "get_weather",
            "add",
            "echo",
            "plain_text",
            "fail",
            "slow",
            "gate",
            "barrier"
        ]
    );
    for definition in &definitions {
        assert_eq!(
            definition.parameters["type"], "object",
            "{}",
            definition.name
        );
        assert!(!definition.description.is_empty());
    }
    // Every defined tool is served.
    let tools = ToolServer::start().await?;
    tools.open_gate();
    for definition in &definitions {
        let (status, _) = match definition.name {
            "plain_text" => (200, Value::Null),
            "barrier" => call(&tools, "barrier", json!({"n": 1})).await?,
            "slow" => call(&tools, "slow", json!({"ms": 0})).await?,
            "get_weather" => call(&tools, "get_weather", json!({"city": "X"})).await?,
            "add" => call(&tools, "add", json!({"a": 0, "b": 0})).await?,
            other => call(&tools, other, json!({})).await?,
        };
        assert_ne!(status, 404, "{}", definition.name);
    }
    Ok(())
}

#[tokio::test]
async fn a_gate_call_waits_until_the_gate_opens_and_later_ones_pass_at_once() -> TestResult {
    let tools = ToolServer::start().await?;
    let waiting = tokio::spawn({
        let tools = tools.clone();
        async move { call(&tools, "gate", json!({})).await }
    });
    let arrived = tools
        .wait_for_calls("gate", 1, std::time::Duration::from_secs(10))
        .await
        .expect("the call arrives");
    assert_eq!(arrived.len(), 1);
    assert!(!waiting.is_finished(), "the gate is closed");

    tools.open_gate();
    assert_eq!(waiting.await??, (200, json!({"gate": "open"})));
    assert_eq!(call(&tools, "gate", json!({})).await?.0, 200);
    Ok(())
}
