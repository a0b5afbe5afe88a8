//! Follows the README's quickstart: `gateway demo` on a fresh directory (embedded store, no database
//! server), then a text answer, a server tool result and a passthrough round trip, as the README shows them.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use serde_json::{json, Value};

const DEMO_KEY: &str = "sk-demo-local-only-0000000000000000";

/// The demo process, killed when the test ends.
struct Demo {
    child: Child,
    base_url: String,
    dir: std::path::PathBuf,
}

impl Drop for Demo {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Starts `gateway demo` in an empty directory, with no database configured, on a free port.
fn start_demo() -> Demo {
    let dir = std::env::temp_dir().join(format!("gateway-quickstart-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_gateway"))
        .arg("demo")
        .current_dir(&dir)
        .env_remove("DATABASE_URL")
        .env("GATEWAY__SERVER__BIND", "127.0.0.1:0")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start gateway demo");
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = BufReader::new(stdout).lines();
    let base_url = loop {
        let line = lines
            .next()
            .expect("the demo printed its address")
            .expect("read stdout");
        if let Some(url) = line.strip_prefix("listening on ") {
            break url.trim().to_owned();
        }
    };
    // Keep reading what the demo prints, so it never writes to a closed pipe.
    std::thread::spawn(move || lines.for_each(drop));
    Demo {
        child,
        base_url,
        dir,
    }
}

async fn create(demo: &Demo, body: Value) -> Value {
    let answer = reqwest::Client::new()
        .post(format!("{}/v1/responses", demo.base_url))
        .bearer_auth(DEMO_KEY)
        .json(&body)
        .send()
        .await
        .expect("request");
    assert!(answer.status().is_success(), "{}", answer.status());
    answer.json().await.expect("json")
}

#[tokio::test]
async fn the_readme_quickstart_answers_text_runs_a_server_tool_and_passes_a_client_tool_through() {
    let demo = start_demo();

    // 1. A text answer.
    let text = create(&demo, json!({"model": "mock", "input": "Hello!"})).await;
    assert_eq!(text["status"], "completed");
    assert_eq!(text["output_text"], "Echo: Hello!");

    // 2. A server tool: the gateway runs get_weather and the model sees its result.
    let tool = create(
        &demo,
        json!({"model": "mock", "input": "!call get_weather {\"city\": \"Paris\"}"}),
    )
    .await;
    assert_eq!(tool["output"][0]["type"], "mcp_call");
    assert_eq!(tool["output"][0]["name"], "get_weather");
    assert!(
        tool["output_text"].as_str().unwrap().contains("sunny"),
        "{tool:#}"
    );

    // 2b. A tool of the demo's MCP source, discovered and called over MCP.
    let mcp = create(
        &demo,
        json!({"model": "mock", "input": "!call calc_add {\"a\": 2, \"b\": 3}"}),
    )
    .await;
    assert_eq!(mcp["output"][0]["type"], "mcp_call", "{mcp:#}");
    assert_eq!(mcp["output"][0]["server_label"], "calc");
    assert_eq!(mcp["output"][0]["status"], "completed", "{mcp:#}");
    assert_eq!(mcp["output_text"], "Tool results: {\"sum\":5}");

    // 3. A client tool, handed back, then continued with previous_response_id.
    let lookup = json!({"type": "function", "name": "lookup", "parameters": {"type": "object", "properties": {"word": {"type": "string"}}}});
    let first = create(&demo, json!({"model": "mock", "input": "!call lookup {\"word\": \"gateway\"}", "tools": [lookup]})).await;
    let call = &first["output"][0];
    assert_eq!(call["type"], "function_call");
    let second = create(
        &demo,
        json!({"model": "mock", "previous_response_id": first["id"], "tools": [lookup],
               "input": [{"type": "function_call_output", "call_id": call["call_id"], "output": "a server in the middle"}]}),
    )
    .await;
    assert_eq!(second["status"], "completed");
    assert_eq!(
        second["output_text"],
        "Tool results: a server in the middle"
    );

    // 4. The same server tool over the Anthropic and Responses deployments, continuing the chain across them.
    let mut previous = second["id"].clone();
    for model in ["mock-anthropic", "mock-responses"] {
        let answer = create(
            &demo,
            json!({"model": model, "previous_response_id": previous, "input": "!call add {\"a\": 2, \"b\": 3}"}),
        )
        .await;
        assert_eq!(answer["status"], "completed", "{model}: {answer:#}");
        assert_eq!(
            answer["output"][0]["type"], "mcp_call",
            "{model}: {answer:#}"
        );
        assert!(
            answer["output_text"].as_str().unwrap().contains("5"),
            "{model}: {answer:#}"
        );
        previous = answer["id"].clone();
    }
}
