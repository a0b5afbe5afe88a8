//! What the testkit's HTTP tests share: a chat request, sending a request for its status and JSON
//! body, and reading a response's content type.

// Each test binary uses its own part of this module.
#![allow(dead_code)]

use gateway_testkit::MockModel;
use serde_json::{json, Value};

pub type TestResult = anyhow::Result<()>;

/// A Chat Completions request with one user message.
pub fn chat(content: &str) -> Value {
    json!({"model": "gpt-test", "messages": [{"role": "user", "content": content}]})
}

/// Sends `request` and returns its status and JSON body.
pub async fn send(request: reqwest::RequestBuilder) -> anyhow::Result<(u16, Value)> {
    let response = request.send().await?;
    let status = response.status().as_u16();
    Ok((status, response.json().await?))
}

/// A POST to the mock model's `/chat/completions`, to be given a body.
pub fn completions(model: &MockModel) -> reqwest::RequestBuilder {
    reqwest::Client::new().post(format!("{}/chat/completions", model.base_url()))
}

/// Posts `body` to the mock model's `/chat/completions`.
pub async fn complete(model: &MockModel, body: &Value) -> anyhow::Result<(u16, Value)> {
    send(completions(model).json(body)).await
}

/// The response's `content-type`, empty when it has none.
pub fn content_type(response: &reqwest::Response) -> String {
    response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned()
}
