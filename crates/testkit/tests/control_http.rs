//! Tests of the HTTP control surfaces (`/_mock/*`, `/_tools/*`) and of the binaries' readiness
//! line, which out-of-process tests (the Python client suite) rely on.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use gateway_testkit::{MockModel, ToolServer};
use serde_json::{json, Value};

mod common;
use common::{chat, complete, send, TestResult};

async fn script(model: &MockModel, specs: Value) -> anyhow::Result<(u16, Value)> {
    send(
        reqwest::Client::new()
            .post(format!("http://{}/_mock/script", model.addr()))
            .json(&specs),
    )
    .await
}

#[tokio::test]
async fn posted_specs_are_served_in_order_before_the_rules() -> TestResult {
    let model = MockModel::start().await?;
    let (status, body) = script(
        &model,
        json!([
            {"text": "first"},
            {"tool_calls": [{"name": "add", "arguments": {"a": 1, "b": 2}, "id": "call_given"}, {"name": "fail"}]},
        ]),
    )
    .await?;
    assert_eq!((status, body), (200, json!({"pending": 2})));
    let (status, body) = script(
        &model,
        json!([{"tool_calls": [{"name": "echo"}], "text": "calling", "finish_reason": "stop"}]),
    )
    .await?;
    assert_eq!((status, body), (200, json!({"pending": 3})));

    let (_, first) = complete(&model, &chat("a")).await?;
    assert_eq!(first["choices"][0]["message"]["content"], "first");
    assert_eq!(first["choices"][0]["finish_reason"], "stop");

    let (_, second) = complete(&model, &chat("b")).await?;
    assert_eq!(second["choices"][0]["finish_reason"], "tool_calls");
    let calls = &second["choices"][0]["message"]["tool_calls"];
    assert_eq!(calls[0]["id"], "call_given");
    assert_eq!(calls[0]["function"]["name"], "add");
    assert_eq!(calls[0]["function"]["arguments"], "{\"a\":1,\"b\":2}");
    assert_eq!(calls[1]["function"]["name"], "fail");
    assert_eq!(calls[1]["function"]["arguments"], "{}");
    assert!(calls[1]["id"]
        .as_str()
        .is_some_and(|id| id.starts_with("call_")));

    let (_, third) = complete(&model, &chat("c")).await?;
    assert_eq!(third["choices"][0]["message"]["content"], "calling");
    assert_eq!(
        third["choices"][0]["message"]["tool_calls"][0]["function"]["name"],
        "echo"
    );
    assert_eq!(third["choices"][0]["finish_reason"], "stop");

    let (_, fourth) = complete(&model, &chat("d")).await?;
    assert_eq!(fourth["choices"][0]["message"]["content"], "Echo: d");
    assert_eq!(model.pending(), 0);
    Ok(())
}

#[tokio::test]
async fn a_posted_error_spec_answers_with_its_status_and_an_openai_error_body() -> TestResult {
    let model = MockModel::start().await?;
    script(
        &model,
        json!([{"error": {"status": 503, "message": "overloaded"}}]),
    )
    .await?;
    let (status, body) = complete(&model, &chat("x")).await?;
    assert_eq!(status, 503);
    assert_eq!(body["error"]["message"], "overloaded");
    assert_eq!(body["error"]["type"], "server_error");
    Ok(())
}

#[tokio::test]
async fn a_posted_delay_ms_holds_the_answer_back_that_long() -> TestResult {
    let model = MockModel::start().await?;
    let (status, _) = script(
        &model,
        json!([{"text": "late", "delay_ms": 300}, {"text": "prompt"}]),
    )
    .await?;
    assert_eq!(status, 200);

    let started = std::time::Instant::now();
    let (status, body) = complete(&model, &chat("a")).await?;
    assert_eq!(status, 200);
    assert_eq!(body["choices"][0]["message"]["content"], "late");
    assert!(
        started.elapsed() >= std::time::Duration::from_millis(300),
        "answered after {:?}",
        started.elapsed()
    );

    // The delay belongs to that one reply: the next one answers at once.
    let started = std::time::Instant::now();
    let (_, body) = complete(&model, &chat("b")).await?;
    assert_eq!(body["choices"][0]["message"]["content"], "prompt");
    assert!(
        started.elapsed() < std::time::Duration::from_millis(300),
        "answered after {:?}",
        started.elapsed()
    );
    Ok(())
}

#[tokio::test]
async fn an_invalid_script_is_a_400_and_appends_nothing() -> TestResult {
    let model = MockModel::start().await?;
    for bad in [
        json!({"text": "not an array"}),
        json!([{"text": "fine"}, {"nothing": true}]),
        json!([{"text": "fine"}, {}]),
        json!([{"error": {"status": 500, "message": "x"}, "text": "both"}]),
    ] {
        let (status, body) = script(&model, bad.clone()).await?;
        assert_eq!(status, 400, "{bad}");
        assert!(body["error"]["message"].is_string(), "{bad}: {body}");
        assert_eq!(model.pending(), 0, "{bad}");
    }
    Ok(())
}

#[tokio::test]
async fn requests_are_listed_and_reset_clears_them_with_the_script() -> TestResult {
    let model = MockModel::start().await?;
    let http = reqwest::Client::new();
    let requests_url = format!("http://{}/_mock/requests", model.addr());

    let (status, body) = send(http.get(&requests_url)).await?;
    assert_eq!((status, body), (200, json!([])));

    complete(&model, &chat("one")).await?;
    complete(&model, &chat("two")).await?;
    let (_, body) = send(http.get(&requests_url)).await?;
    assert_eq!(body, json!([chat("one"), chat("two")]));

    script(&model, json!([{"text": "left over"}])).await?;
    let (status, _) = send(http.post(format!("http://{}/_mock/reset", model.addr()))).await?;
    assert_eq!(status, 200);
    assert_eq!(model.pending(), 0);
    let (_, body) = send(http.get(&requests_url)).await?;
    assert_eq!(body, json!([]));
    let (_, answer) = complete(&model, &chat("three")).await?;
    assert_eq!(answer["choices"][0]["message"]["content"], "Echo: three");
    Ok(())
}

#[tokio::test]
async fn tool_calls_are_listed_with_headers_and_body_and_reset_clears_them() -> TestResult {
    let tools = ToolServer::start().await?;
    let http = reqwest::Client::new();
    let calls_url = format!("http://{}/_tools/calls", tools.addr());

    let (status, body) = send(http.get(&calls_url)).await?;
    assert_eq!((status, body), (200, json!([])));

    http.post(tools.url("add"))
        .header("Idempotency-Key", "resp_1:1")
        .json(&json!({"a": 2, "b": 3}))
        .send()
        .await?;
    http.post(tools.url("fail")).json(&json!({})).send().await?;

    let (_, body) = send(http.get(&calls_url)).await?;
    let calls = body.as_array().cloned().unwrap_or_default();
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[0]["tool"], "add");
    assert_eq!(calls[0]["body"], json!({"a": 2, "b": 3}));
    assert_eq!(calls[0]["headers"]["idempotency-key"], "resp_1:1");
    assert_eq!(calls[0]["headers"]["content-type"], "application/json");
    assert_eq!(calls[1]["tool"], "fail");
    // Listing is not a call.
    assert_eq!(tools.calls().len(), 2);

    let (status, _) = send(http.post(format!("http://{}/_tools/reset", tools.addr()))).await?;
    assert_eq!(status, 200);
    assert!(tools.calls().is_empty());
    let (_, body) = send(http.get(&calls_url)).await?;
    assert_eq!(body, json!([]));
    Ok(())
}

/// Kills the child on drop, so a failing assertion does not leave it running.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `binary --bind 127.0.0.1:0` and returns it with the address of its readiness line.
fn start_binary(binary: &str) -> anyhow::Result<(Running, String)> {
    let mut child = Running(
        Command::new(binary)
            .args(["--bind", "127.0.0.1:0"])
            .env("RUST_LOG", "info")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()?,
    );
    let stdout = child
        .0
        .stdout
        .take()
        .ok_or_else(|| anyhow::anyhow!("no stdout"))?;
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line)?;
    let address = line
        .trim_end()
        .strip_prefix("listening on ")
        .ok_or_else(|| anyhow::anyhow!("unexpected first line {line:?}"))?
        .to_owned();
    Ok((child, address))
}

#[tokio::test]
async fn the_binaries_print_their_address_first_on_stdout_when_bound_to_port_0() -> TestResult {
    for (binary, health) in [
        (env!("CARGO_BIN_EXE_mock-model"), "/health"),
        (env!("CARGO_BIN_EXE_example-tools"), "/health"),
    ] {
        let (_child, address) = tokio::task::spawn_blocking(move || start_binary(binary)).await??;
        assert!(address.starts_with("http://127.0.0.1:"), "{address}");
        assert!(!address.ends_with(":0"), "{address}");
        let (status, body) = send(reqwest::Client::new().get(format!("{address}{health}"))).await?;
        assert_eq!((status, body), (200, json!({"status": "ok"})), "{binary}");
    }
    Ok(())
}
