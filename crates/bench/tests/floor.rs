//! `gateway-floor`, the bench's floor: the real binary, in front of the testkit's mock model, answers a create with
//! a completed response holding the model's text, after one Chat call carrying the input; and refuses what it
//! cannot read with an error instead of calling the model.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use gateway_testkit::MockModel;
use serde_json::{json, Value};

/// The floor process, killed when dropped.
struct Floor {
    child: Child,
    url: String,
}

impl Drop for Floor {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_floor(upstream: &str) -> anyhow::Result<Floor> {
    let mut child = Command::new(env!("CARGO_BIN_EXE_gateway-floor"))
        .args(["--bind", "127.0.0.1:0", "--upstream", upstream])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()?;
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| anyhow::anyhow!("no stdout"))?;
    let mut line = String::new();
    let read = BufReader::new(stdout).read_line(&mut line);
    let floor = Floor {
        child,
        url: line
            .trim()
            .strip_prefix("listening on ")
            .unwrap_or_default()
            .to_owned(),
    };
    read?;
    anyhow::ensure!(!floor.url.is_empty(), "unexpected first line {line:?}");
    Ok(floor)
}

#[tokio::test]
async fn the_floor_answers_a_create_with_the_models_text_after_one_chat_call() -> anyhow::Result<()>
{
    let mock = MockModel::start().await?;
    let floor = start_floor(&mock.base_url())?;
    let http = reqwest::Client::new();

    let answer = http
        .post(format!("{}/v1/responses", floor.url))
        .json(&json!({"model": "mock", "input": "Say hello to the floor.", "store": false}))
        .send()
        .await?;
    assert_eq!(answer.status(), 200);
    let response: Value = answer.json().await?;
    assert_eq!(response["object"], "response");
    assert_eq!(response["status"], "completed");
    assert_eq!(response["output"][0]["type"], "message");
    let text = response["output"][0]["content"][0]["text"]
        .as_str()
        .unwrap_or_default();
    assert!(
        text.contains("Say hello to the floor."),
        "the model's echo, got {text:?}"
    );
    assert_eq!(response["output_text"], text);

    let calls = mock.requests();
    assert_eq!(calls.len(), 1, "one Chat call per create: {calls:?}");
    assert_eq!(calls[0]["model"], "mock");
    assert_eq!(calls[0]["messages"][0]["role"], "user");
    assert_eq!(
        calls[0]["messages"][0]["content"],
        "Say hello to the floor."
    );

    let refused = http
        .post(format!("{}/v1/responses", floor.url))
        .json(&json!({"model": "mock", "input": [{"role": "user", "content": "a list"}]}))
        .send()
        .await?;
    assert_eq!(refused.status(), 400);
    let error: Value = refused.json().await?;
    assert!(error["error"]["message"].is_string(), "{error}");
    assert_eq!(
        mock.requests().len(),
        1,
        "nothing sent for a refused create"
    );
    Ok(())
}
