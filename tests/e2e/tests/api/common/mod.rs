//! Helpers shared by the end-to-end test files: error-shape checks, store counts, and readers of the
//! Chat Completions requests the mock model received.
#![allow(dead_code, clippy::expect_used, clippy::unwrap_used, clippy::panic)]

pub mod sse;

use gateway_e2e::{Answer, Tenant, TestGateway};
use reqwest::Method;
use serde_json::{json, Value};

/// A gateway with one tenant (`acme`) that may use the `mock` deployment.
pub async fn gateway() -> (TestGateway, Tenant) {
    let gw = TestGateway::start().await;
    let tenant = gw.tenant("acme").await;
    (gw, tenant)
}

/// A gateway with one tenant whose group has these server tools attached.
pub async fn gateway_with_tools(tools: &[&str]) -> (TestGateway, Tenant) {
    let (gw, tenant) = gateway().await;
    for tool in tools {
        gw.attach_tool(&tenant.group_id, tool).await;
    }
    (gw, tenant)
}

/// Like `gateway`, on the embedded store.
pub async fn embedded_gateway() -> (TestGateway, Tenant) {
    let gw = TestGateway::start_embedded().await;
    let tenant = gw.tenant("acme").await;
    (gw, tenant)
}

/// Like `gateway_with_tools`, on the embedded store.
pub async fn embedded_gateway_with_tools(tools: &[&str]) -> (TestGateway, Tenant) {
    let (gw, tenant) = embedded_gateway().await;
    for tool in tools {
        gw.attach_tool(&tenant.group_id, tool).await;
    }
    (gw, tenant)
}

/// Rows in the response tables: `(responses, response_input_items, steps)`.
pub async fn stored_rows(gw: &TestGateway) -> (i64, i64, i64) {
    (
        gw.fetch_i64("SELECT count(*) FROM responses").await,
        gw.fetch_i64("SELECT count(*) FROM response_input_items")
            .await,
        gw.fetch_i64("SELECT count(*) FROM steps").await,
    )
}

/// Starts a create whose model calls the `barrier` tool (which must be attached) and then answers "Released.";
/// returns once that tool call is in flight, with the create's answer to come.
pub async fn create_waiting_in_barrier(
    gw: &TestGateway,
    key: &str,
) -> tokio::task::JoinHandle<Result<reqwest::Response, reqwest::Error>> {
    gw.model.push(gateway_testkit::Reply::tool_calls(vec![
        gateway_testkit::Call::new("barrier", json!({"n": 2})),
    ]));
    gw.model.push(gateway_testkit::Reply::text("Released."));
    let first = tokio::spawn(
        gw.public(Method::POST, "/responses", key)
            .json(&json!({"model": "mock", "input": "Wait."}))
            .send(),
    );
    let in_flight = async {
        while gw.tools.calls().is_empty() {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(8), in_flight)
        .await
        .expect("the first response reaches its tool call");
    first
}

/// Sends the testkit tool server the `barrier` call that lets `n - 1` waiting ones through.
pub async fn release_barrier(gw: &TestGateway, n: u64) {
    let release = gw
        .http
        .post(gw.tools.url("barrier"))
        .json(&json!({"n": n}))
        .send()
        .await
        .expect("release the barrier");
    assert!(release.status().is_success(), "{release:?}");
}

/// The gateway's `/metrics` text.
pub async fn metrics_text(gw: &TestGateway) -> String {
    gw.http
        .get(format!("{}/metrics", gw.base_url))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("metrics text")
}

/// The sum of the samples of metric `name` whose labels include every one of `labels`, in a `/metrics` text.
pub fn sample(text: &str, name: &str, labels: &[&str]) -> f64 {
    text.lines()
        .filter(|line| {
            line.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with([' ', '{']))
                && labels.iter().all(|l| line.contains(l))
        })
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Stages response `id` as still running on another replica, one that beats: in progress and owned by it. (A
/// response this gateway owned and ran nowhere would be handed over and resumed by its sweep.)
pub async fn running_elsewhere(gw: &TestGateway, id: &str) {
    gw.execute(
        "INSERT INTO replicas (id, started_at, heartbeat_at) VALUES ($1, 0, 9000000000000000)
         ON CONFLICT (id) DO NOTHING",
        "replica_elsewhere",
    )
    .await;
    gw.execute(
        "UPDATE responses SET status = 'in_progress', completed_at = NULL, owner = 'replica_elsewhere'
         WHERE id = $1",
        id,
    )
    .await;
}

/// `(id, status)` of every stored response.
pub async fn stored_statuses(gw: &TestGateway) -> Vec<(String, String)> {
    gw.fetch_text_pairs("SELECT id, status FROM responses ORDER BY created_at, id")
        .await
}

/// Asserts an OpenAI error answer: status, exactly the four error keys, a message, the type, `param` and `code`.
pub fn assert_error(answer: &Answer, status: u16, param: Option<&str>, code: Option<&str>) {
    assert_eq!(
        answer.status.as_u16(),
        status,
        "unexpected status; body: {:#}",
        answer.body
    );
    let error = answer.body["error"]
        .as_object()
        .unwrap_or_else(|| panic!("no error object in {:#}", answer.body));
    let mut keys: Vec<&str> = error.keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        ["code", "message", "param", "type"],
        "error keys of {:#}",
        answer.body
    );
    let message = error["message"].as_str().unwrap_or_default();
    assert!(
        !message.is_empty(),
        "empty error message: {:#}",
        answer.body
    );
    let expected_type = if status >= 500 {
        "server_error"
    } else {
        "invalid_request_error"
    };
    assert_eq!(error["type"], expected_type, "{:#}", answer.body);
    assert_eq!(error["param"], json!(param), "param of {:#}", answer.body);
    if let Some(code) = code {
        assert_eq!(error["code"], code, "code of {:#}", answer.body);
    } else {
        assert!(
            error["code"].is_null() || error["code"].is_string(),
            "{:#}",
            answer.body
        );
    }
}

/// `GET /v1/responses/{id}` with `key`.
pub async fn get_response(gw: &TestGateway, key: &str, id: &str) -> Answer {
    gw.call(gw.public(Method::GET, &format!("/responses/{id}"), key))
        .await
}

/// `POST /v1/responses/{id}/cancel`.
pub async fn cancel(gw: &TestGateway, key: &str, id: &str) -> Answer {
    gw.call(gw.public(Method::POST, &format!("/responses/{id}/cancel"), key))
        .await
}

/// `DELETE /v1/responses/{id}` with `key`.
pub async fn delete_response(gw: &TestGateway, key: &str, id: &str) -> Answer {
    gw.call(gw.public(Method::DELETE, &format!("/responses/{id}"), key))
        .await
}

/// `GET /v1/responses/{id}/input_items{query}` with `key`.
pub async fn input_items(gw: &TestGateway, key: &str, id: &str, query: &str) -> Answer {
    gw.call(gw.public(
        Method::GET,
        &format!("/responses/{id}/input_items{query}"),
        key,
    ))
    .await
}

/// Creates a response that must succeed with HTTP 200; returns its body.
pub async fn create_ok(gw: &TestGateway, key: &str, body: Value) -> Value {
    let answer = gw.create(key, body).await;
    assert_eq!(
        answer.status.as_u16(),
        200,
        "create failed: {:#}",
        answer.body
    );
    answer.body
}

/// The `id` of a JSON object, as a string.
pub fn id_of(value: &Value) -> String {
    value["id"]
        .as_str()
        .unwrap_or_else(|| panic!("no id in {value:#}"))
        .to_owned()
}

/// The `messages` of a Chat Completions request.
pub fn messages(request: &Value) -> &Vec<Value> {
    request["messages"]
        .as_array()
        .unwrap_or_else(|| panic!("no messages in {request:#}"))
}

/// Every `tool` message of a request, as `(tool_call_id, content)`, in order.
pub fn tool_messages(request: &Value) -> Vec<(String, String)> {
    messages(request)
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| {
            (
                m["tool_call_id"].as_str().unwrap_or_default().to_owned(),
                m["content"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

/// The content of the `tool` message answering `call_id`; fails when there is not exactly one.
pub fn tool_result(request: &Value, call_id: &str) -> String {
    let found: Vec<String> = tool_messages(request)
        .into_iter()
        .filter(|(id, _)| id == call_id)
        .map(|(_, content)| content)
        .collect();
    assert_eq!(
        found.len(),
        1,
        "expected one tool message for {call_id} in {:#}",
        request["messages"]
    );
    found.into_iter().next().unwrap_or_default()
}

/// Every tool call of every assistant message of a request, as `(id, name, arguments)`, in order.
pub fn assistant_tool_calls(request: &Value) -> Vec<(String, String, String)> {
    messages(request)
        .iter()
        .filter(|m| m["role"] == "assistant")
        .filter_map(|m| m["tool_calls"].as_array())
        .flatten()
        .map(|c| {
            assert_eq!(c["type"], "function", "{c:#}");
            (
                c["id"].as_str().unwrap_or_default().to_owned(),
                c["function"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                c["function"]["arguments"]
                    .as_str()
                    .unwrap_or_else(|| panic!("arguments not a string: {c:#}"))
                    .to_owned(),
            )
        })
        .collect()
}

/// Asserts that each assistant message with tool calls is immediately followed by exactly one `tool`
/// message per call, with the same ids (the pairing Chat Completions upstreams demand).
pub fn assert_calls_paired(request: &Value) {
    let messages = messages(request);
    for (index, message) in messages.iter().enumerate() {
        let Some(calls) = message["tool_calls"].as_array() else {
            continue;
        };
        let mut call_ids: Vec<&str> = calls
            .iter()
            .map(|c| c["id"].as_str().unwrap_or_default())
            .collect();
        let mut answered: Vec<&str> = messages[index + 1..]
            .iter()
            .take_while(|m| m["role"] == "tool")
            .map(|m| m["tool_call_id"].as_str().unwrap_or_default())
            .collect();
        call_ids.sort_unstable();
        answered.sort_unstable();
        assert_eq!(
            call_ids, answered,
            "tool calls and tool messages do not pair in {messages:#?}"
        );
    }
}

/// The names of the tools offered in a request.
pub fn offered_tools(request: &Value) -> Vec<String> {
    request["tools"]
        .as_array()
        .map(|tools| {
            tools
                .iter()
                .filter_map(|t| t["function"]["name"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// The text of the last message of a request whose role is `role`.
pub fn last_text_of(request: &Value, role: &str) -> String {
    messages(request)
        .iter()
        .rev()
        .find(|m| m["role"] == role)
        .and_then(|m| m["content"].as_str())
        .unwrap_or_default()
        .to_owned()
}

/// Parses a JSON text (a tool output) into a value.
pub fn parse(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

/// Everything the process logs from now on (every level, through the gateway's own filter), for tests that check what never reaches the logs.
/// nextest runs each test in its own process, so the capture holds that test's logs; under `cargo test` the
/// first test to ask installs it, and later ones read a shared capture (still enough to check an absence).
pub fn capture_logs() -> LogCapture {
    static CAPTURE: std::sync::OnceLock<LogCapture> = std::sync::OnceLock::new();
    CAPTURE
        .get_or_init(|| {
            let capture = LogCapture::default();
            let writer = capture.clone();
            let _ = tracing_subscriber::fmt()
                .with_env_filter(gateway::telemetry::log_filter("trace").expect("filter"))
                .with_ansi(false)
                .with_writer(move || writer.clone())
                .try_init();
            capture
        })
        .clone()
}

/// The text logged since [`capture_logs`] was first called.
#[derive(Debug, Clone, Default)]
pub struct LogCapture(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl LogCapture {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

impl std::io::Write for LogCapture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
