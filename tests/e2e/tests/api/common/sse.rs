//! A strict reader of the Responses event stream (SSE), and the checks every stream must pass: framing,
//! sequence numbers, the start and terminal events, per-item event order, output indices, and that the
//! deltas add up to what the `.done` events and the final response say.
#![allow(dead_code, clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use gateway_e2e::TestGateway;
use reqwest::Method;
use serde_json::{json, Value};

/// The terminal events: exactly one of them ends every stream.
pub const TERMINAL: [&str; 3] = [
    "response.completed",
    "response.incomplete",
    "response.failed",
];

/// `POST /v1/responses` with `stream: true`; asserts a 200 `text/event-stream` answer and returns its
/// events, each checked frame by frame (see [`parse_frames`]).
pub async fn post_stream(gw: &TestGateway, key: &str, mut body: Value) -> Vec<Value> {
    body["stream"] = json!(true);
    let response = gw
        .public(Method::POST, "/responses", key)
        .json(&body)
        .send()
        .await
        .expect("streamed create");
    let status = response.status();
    let content_type = content_type(&response);
    let text = response.text().await.expect("stream body");
    assert_eq!(status.as_u16(), 200, "streamed create failed: {text}");
    assert!(
        content_type.starts_with("text/event-stream"),
        "content type {content_type:?} of {text}"
    );
    parse_frames(&text)
}

/// The `Content-Type` of an answer, or `""`.
pub fn content_type(response: &reqwest::Response) -> String {
    response
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned()
}

/// Splits a whole SSE body into events: every frame is exactly `event: X\ndata: <one line of JSON>`
/// whose `type` is X, frames are separated by one blank line, there is no `\r` and no `[DONE]`.
pub fn parse_frames(text: &str) -> Vec<Value> {
    assert!(!text.contains('\r'), "a frame uses \\r: {text:?}");
    assert!(
        text.ends_with("\n\n"),
        "the stream does not end with a whole frame: {text:?}"
    );
    text[..text.len() - 2]
        .split("\n\n")
        .map(parse_frame)
        .collect()
}

/// One frame (without its blank line), checked and parsed.
pub fn parse_frame(frame: &str) -> Value {
    let (event_line, data_line) = frame
        .split_once('\n')
        .unwrap_or_else(|| panic!("frame is not two lines: {frame:?}"));
    assert!(
        !data_line.contains('\n'),
        "frame is more than `event:` and one `data:` line: {frame:?}"
    );
    let kind = event_line
        .strip_prefix("event: ")
        .unwrap_or_else(|| panic!("frame does not start with `event: `: {frame:?}"));
    let data = data_line
        .strip_prefix("data: ")
        .unwrap_or_else(|| panic!("second line is not `data: `: {frame:?}"));
    assert_ne!(data.trim(), "[DONE]", "Responses streams send no [DONE]");
    let value: Value =
        serde_json::from_str(data).unwrap_or_else(|e| panic!("data is not JSON ({e}): {frame:?}"));
    assert_eq!(
        value["type"], kind,
        "`type` differs from `event:` in {frame:?}"
    );
    value
}

/// Reads a stream frame by frame as it arrives, so a test can act in the middle of it.
pub struct FrameReader {
    response: reqwest::Response,
    buffer: String,
}

impl FrameReader {
    pub fn new(response: reqwest::Response) -> FrameReader {
        FrameReader {
            response,
            buffer: String::new(),
        }
    }

    /// The next event, or `None` at the end of the stream.
    pub async fn next(&mut self) -> Option<Value> {
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let frame: String = self.buffer.drain(..end + 2).collect();
                return Some(parse_frame(&frame[..end]));
            }
            let chunk = self.response.chunk().await.expect("stream chunk")?;
            self.buffer
                .push_str(std::str::from_utf8(&chunk).expect("UTF-8 chunk"));
        }
    }

    /// Reads until an event satisfies `found`; returns every event read, that one last.
    pub async fn until(&mut self, found: impl Fn(&Value) -> bool) -> Vec<Value> {
        let mut events = Vec::new();
        loop {
            let event = self.next().await.unwrap_or_else(|| {
                panic!("the stream ended before the awaited event: {events:#?}")
            });
            let hit = found(&event);
            events.push(event);
            if hit {
                return events;
            }
        }
    }
}

/// The events of one output item, from its `output_item.added` to its `output_item.done`.
#[derive(Debug, Clone)]
pub struct ItemTrace {
    pub id: String,
    pub kind: String,
    /// The item as `output_item.added` showed it.
    pub added: Value,
    /// The item as `output_item.done` showed it.
    pub done: Value,
    /// The events between `added` and `done`, `done` included.
    pub events: Vec<Value>,
}

impl ItemTrace {
    pub fn kinds(&self) -> Vec<&str> {
        self.events
            .iter()
            .map(|e| e["type"].as_str().unwrap_or_default())
            .collect()
    }

    /// The `delta`s of the events of this kind, concatenated.
    pub fn deltas(&self, kind: &str) -> String {
        self.events
            .iter()
            .filter(|e| e["type"] == kind)
            .map(|e| e["delta"].as_str().expect("delta is a string"))
            .collect()
    }

    pub fn event(&self, kind: &str) -> &Value {
        self.events
            .iter()
            .find(|e| e["type"] == kind)
            .unwrap_or_else(|| panic!("no {kind} for item {}: {:#?}", self.id, self.events))
    }
}

/// A stream that passed every check of [`check_stream`].
#[derive(Debug, Clone)]
pub struct Checked {
    pub events: Vec<Value>,
    pub items: Vec<ItemTrace>,
    /// The response carried by the terminal event.
    pub terminal: Value,
}

impl Checked {
    pub fn kinds(&self) -> Vec<&str> {
        self.events
            .iter()
            .map(|e| e["type"].as_str().unwrap_or_default())
            .collect()
    }

    pub fn terminal_kind(&self) -> &str {
        self.events
            .last()
            .and_then(|e| e["type"].as_str())
            .unwrap_or_default()
    }

    pub fn id(&self) -> String {
        self.terminal["id"]
            .as_str()
            .expect("response id")
            .to_owned()
    }

    /// The `error` event, if there is one.
    pub fn error_event(&self) -> Option<&Value> {
        self.events.iter().find(|e| e["type"] == "error")
    }

    /// Every item as `type` or `type:name`, in output order.
    pub fn item_kinds(&self) -> Vec<String> {
        self.items
            .iter()
            .map(|t| match t.done["name"].as_str() {
                Some(name) => format!("{}:{name}", t.kind),
                None => t.kind.clone(),
            })
            .collect()
    }
}

/// Checks a whole stream, as strict clients (openai-python's `responses.stream()`, Open Responses) read it.
pub fn check_stream(events: Vec<Value>) -> Checked {
    let last = events.len().checked_sub(1).expect("an empty stream");
    assert!(events.len() >= 3, "too short a stream: {events:#?}");
    for (position, event) in events.iter().enumerate() {
        assert_eq!(
            event["sequence_number"],
            json!(position),
            "sequence numbers are not contiguous from 0 at {position}: {events:#?}"
        );
    }

    // The start: created, then in_progress, both with the response as it starts; a background response is
    // created queued, and says so before it starts.
    let background = events[1]["type"] == "response.queued";
    let start = if background { 3 } else { 2 };
    assert_eq!(events[0]["type"], "response.created", "{events:#?}");
    assert_eq!(
        events[start - 1]["type"],
        "response.in_progress",
        "{events:#?}"
    );
    let created = &events[0]["response"];
    assert_eq!(created["object"], "response", "{created:#}");
    let created_status = if background { "queued" } else { "in_progress" };
    assert_eq!(created["status"], created_status, "{created:#}");
    assert_eq!(created["output"], json!([]), "{created:#}");
    assert_eq!(created["usage"], Value::Null, "{created:#}");
    let id = created["id"].as_str().expect("response id").to_owned();
    assert!(id.starts_with("resp_"), "{created:#}");
    for event in &events[1..start] {
        assert_eq!(event["response"]["id"], id.as_str());
    }
    assert_eq!(events[start - 1]["response"]["status"], "in_progress");

    // Exactly one terminal event, last, carrying the response with the matching status.
    let terminals: Vec<usize> = events
        .iter()
        .enumerate()
        .filter(|(_, e)| TERMINAL.iter().any(|t| e["type"] == *t))
        .map(|(i, _)| i)
        .collect();
    assert_eq!(terminals, vec![last], "terminal events: {events:#?}");
    let terminal = events[last]["response"].clone();
    assert_eq!(terminal["id"], id.as_str());
    let expected_status = match events[last]["type"].as_str() {
        Some("response.completed") => "completed",
        Some("response.incomplete") => "incomplete",
        _ => "failed",
    };
    assert_eq!(terminal["status"], expected_status, "{terminal:#}");
    assert!(
        events[start..]
            .iter()
            .all(|e| e["type"] != "response.created"
                && e["type"] != "response.queued"
                && e["type"] != "response.in_progress"),
        "created / queued / in_progress repeated: {events:#?}"
    );

    // An error event: nested and flat, only in a failed stream, right before response.failed.
    let errors: Vec<usize> = events
        .iter()
        .enumerate()
        .filter(|(_, e)| e["type"] == "error")
        .map(|(i, _)| i)
        .collect();
    if expected_status == "failed" {
        assert_eq!(
            errors,
            vec![last - 1],
            "a failed stream has one error event, right before response.failed: {events:#?}"
        );
        let error = &events[last - 1];
        assert!(error["error"].is_object(), "{error:#}");
        let code = error["error"]["code"].as_str().expect("error.code");
        let message = error["error"]["message"].as_str().expect("error.message");
        assert!(!message.is_empty(), "{error:#}");
        assert_eq!(error["code"], code, "top-level code: {error:#}");
        assert_eq!(error["message"], message, "top-level message: {error:#}");
        assert_eq!(terminal["error"]["code"], code, "{terminal:#}");
        assert_eq!(terminal["error"]["message"], message, "{terminal:#}");
    } else {
        assert!(
            errors.is_empty(),
            "error event in a {expected_status} stream: {events:#?}"
        );
        assert_eq!(terminal["error"], Value::Null, "{terminal:#}");
    }

    // Items: added first, done last, indices 0..n in order of first appearance, one item id per index.
    let mut items: Vec<ItemTrace> = Vec::new();
    let mut open: Vec<bool> = Vec::new();
    for event in &events[start..last] {
        let kind = event["type"].as_str().unwrap_or_default();
        if kind == "error" {
            continue;
        }
        let index = event["output_index"].as_u64().unwrap_or_else(|| {
            panic!("an event between start and end without output_index: {event:#}")
        }) as usize;
        if kind == "response.output_item.added" {
            assert_eq!(
                index,
                items.len(),
                "output indices are not 0..n in order of first appearance: {events:#?}"
            );
            let item = event["item"].clone();
            let item_id = item["id"].as_str().expect("item id").to_owned();
            assert!(
                items.iter().all(|t| t.id != item_id),
                "item id {item_id} added twice"
            );
            // Listings and approval requests carry no status (as OpenAI's); every other item starts in progress.
            if !matches!(
                item["type"].as_str(),
                Some("mcp_list_tools" | "mcp_approval_request")
            ) {
                assert_eq!(item["status"], "in_progress", "added item: {item:#}");
            }
            items.push(ItemTrace {
                id: item_id,
                kind: item["type"].as_str().expect("item type").to_owned(),
                added: item,
                done: Value::Null,
                events: Vec::new(),
            });
            open.push(true);
            continue;
        }
        let trace = items.get_mut(index).unwrap_or_else(|| {
            panic!("{kind} for output index {index} before its output_item.added: {events:#?}")
        });
        assert!(
            open[index],
            "{kind} for output index {index} after its output_item.done: {events:#?}"
        );
        let item_id = if kind == "response.output_item.done" {
            &event["item"]["id"]
        } else {
            &event["item_id"]
        };
        assert_eq!(
            item_id,
            trace.id.as_str(),
            "output index {index} names another item: {event:#}"
        );
        trace.events.push(event.clone());
        if kind == "response.output_item.done" {
            trace.done = event["item"].clone();
            open[index] = false;
        }
    }
    for trace in &items {
        assert!(
            !trace.done.is_null(),
            "item {} has no output_item.done: {events:#?}",
            trace.id
        );
        assert_eq!(trace.done["type"], trace.kind.as_str());
        match trace.kind.as_str() {
            "message" => check_message(trace),
            "function_call" => check_function_call(trace),
            "mcp_call" => check_mcp_call(trace),
            "web_search_call" => check_web_search_call(trace),
            "mcp_list_tools" => check_mcp_list_tools(trace),
            "mcp_approval_request" => check_mcp_approval_request(trace),
            "reasoning" => check_reasoning(trace),
            other => panic!("unexpected item type {other}: {:#}", trace.added),
        }
    }

    // The terminal response's output is exactly the streamed items, as their output_item.done showed them.
    let output = terminal["output"].as_array().expect("output array");
    assert_eq!(
        output.len(),
        items.len(),
        "the final output and the streamed items differ: {terminal:#} vs {events:#?}"
    );
    for (index, trace) in items.iter().enumerate() {
        assert_eq!(output[index]["id"], trace.id.as_str(), "output[{index}]");
        assert_eq!(
            output[index], trace.done,
            "output[{index}] differs from its output_item.done"
        );
    }
    Checked {
        events,
        items,
        terminal,
    }
}

/// A reasoning item is shown whole once its model call ended: added, then done, with its summary.
fn check_reasoning(trace: &ItemTrace) {
    assert_eq!(trace.kinds(), ["response.output_item.done"], "{}", trace.id);
    assert!(trace.done["summary"].is_array(), "{:#}", trace.done);
    assert_eq!(trace.done["status"], "completed", "{:#}", trace.done);
}

fn check_message(trace: &ItemTrace) {
    let added = &trace.added;
    assert_eq!(added["role"], "assistant", "{added:#}");
    assert_eq!(added["content"], json!([]), "{added:#}");
    let kinds = trace.kinds();
    let deltas = kinds
        .iter()
        .filter(|k| **k == "response.output_text.delta")
        .count();
    assert!(deltas >= 1, "a message without text deltas: {kinds:?}");
    let mut expected = vec!["response.content_part.added"];
    expected.extend(std::iter::repeat_n("response.output_text.delta", deltas));
    expected.extend([
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
    ]);
    assert_eq!(kinds, expected, "message events of {}", trace.id);
    for event in &trace.events[..trace.events.len() - 1] {
        assert_eq!(event["content_index"], 0, "{event:#}");
    }
    assert_eq!(
        trace.event("response.content_part.added")["part"],
        json!({"type": "output_text", "text": "", "annotations": [], "logprobs": []})
    );
    let text = trace.deltas("response.output_text.delta");
    assert_eq!(
        trace.event("response.output_text.done")["text"],
        text.as_str()
    );
    assert_eq!(
        trace.event("response.content_part.done")["part"],
        json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
    );
    let done = &trace.done;
    assert_eq!(done["content"][0]["text"], text.as_str(), "{done:#}");
    assert_eq!(
        done["content"].as_array().map(Vec::len),
        Some(1),
        "{done:#}"
    );
    assert!(
        done["status"] == "completed" || done["status"] == "incomplete",
        "{done:#}"
    );
}

fn check_function_call(trace: &ItemTrace) {
    let added = &trace.added;
    assert_eq!(added["arguments"], "", "{added:#}");
    assert!(
        added["call_id"].as_str().is_some_and(|c| !c.is_empty()),
        "{added:#}"
    );
    let kinds = trace.kinds();
    let deltas = kinds
        .iter()
        .filter(|k| **k == "response.function_call_arguments.delta")
        .count();
    let mut expected = vec!["response.function_call_arguments.delta"; deltas];
    expected.extend([
        "response.function_call_arguments.done",
        "response.output_item.done",
    ]);
    assert_eq!(kinds, expected, "function call events of {}", trace.id);
    let arguments = trace.deltas("response.function_call_arguments.delta");
    let done_event = trace.event("response.function_call_arguments.done");
    assert_eq!(done_event["arguments"], arguments.as_str());
    assert_eq!(done_event["name"], added["name"], "{done_event:#}");
    let done = &trace.done;
    assert_eq!(done["arguments"], arguments.as_str(), "{done:#}");
    assert_eq!(done["name"], added["name"]);
    assert_eq!(done["call_id"], added["call_id"]);
    assert_eq!(done["status"], "completed", "{done:#}");
}

/// A bound `web_search` call, as OpenAI streams one: added in progress, in progress, searching, completed (a
/// failed one has no event of its own: its done item says so), done. No output is shown, as OpenAI shows none.
/// As OpenAI streams a listing: added without its tools, in progress, completed, done with them.
fn check_mcp_list_tools(trace: &ItemTrace) {
    assert_eq!(trace.added["tools"], json!([]), "{:#}", trace.added);
    assert!(trace.done["tools"].is_array(), "{:#}", trace.done);
    assert_eq!(trace.added["server_label"], trace.done["server_label"]);
    assert_eq!(
        trace.kinds(),
        [
            "response.mcp_list_tools.in_progress",
            "response.mcp_list_tools.completed",
            "response.output_item.done"
        ],
        "mcp_list_tools events of {}",
        trace.id
    );
}

/// An approval request is added and done whole.
fn check_mcp_approval_request(trace: &ItemTrace) {
    assert_eq!(trace.added, trace.done);
    for field in ["server_label", "name", "arguments"] {
        assert!(trace.done[field].is_string(), "{field}: {:#}", trace.done);
    }
    assert_eq!(trace.kinds(), ["response.output_item.done"]);
}

fn check_web_search_call(trace: &ItemTrace) {
    assert_eq!(trace.added["status"], "in_progress", "{:#}", trace.added);
    assert_eq!(trace.added["action"]["type"], "search", "{:#}", trace.added);
    let done = &trace.done;
    assert!(done.get("output").is_none(), "{done:#}");
    let mut expected = vec![
        "response.web_search_call.in_progress",
        "response.web_search_call.searching",
    ];
    match done["status"].as_str() {
        Some("completed") => expected.push("response.web_search_call.completed"),
        Some("failed") => {}
        _ => panic!("web_search_call ended neither completed nor failed: {done:#}"),
    }
    expected.push("response.output_item.done");
    let kinds: Vec<&str> = trace
        .kinds()
        .into_iter()
        .filter(|k| *k != "gateway:tool_note")
        .collect();
    assert_eq!(kinds, expected, "web_search_call events of {}", trace.id);
}

fn check_mcp_call(trace: &ItemTrace) {
    let added = &trace.added;
    // "gateway" for HTTP tools; the source's or the request's server otherwise.
    assert!(added["server_label"].is_string(), "{added:#}");
    assert_eq!(added["server_label"], trace.done["server_label"]);
    assert!(
        added["output"].is_null() && added["error"].is_null(),
        "{added:#}"
    );
    let done = &trace.done;
    let outcome = match done["status"].as_str() {
        Some("completed") => {
            assert!(done["output"].is_string(), "{done:#}");
            assert!(done["error"].is_null(), "{done:#}");
            "response.mcp_call.completed"
        }
        Some("failed") => {
            assert!(done["output"].is_null(), "{done:#}");
            assert!(!done["error"].is_null(), "{done:#}");
            "response.mcp_call.failed"
        }
        _ => panic!("mcp_call ended neither completed nor failed: {done:#}"),
    };
    // As OpenAI streams an `mcp_call`: added with empty arguments, the arguments in deltas and a done, then
    // in progress, then completed or failed.
    assert_eq!(added["arguments"], "", "{added:#}");
    // Progress notes (`gateway:tool_note`) may follow in_progress and the outcome; they are checked apart.
    for note in trace
        .events
        .iter()
        .filter(|e| e["type"] == "gateway:tool_note")
    {
        assert!(note["label"].is_string(), "{note:#}");
        let phase = note["phase"].as_str().expect("phase");
        let expected_detail = match phase {
            "request" => "in_progress",
            "result" => done["status"].as_str().unwrap_or_default(),
            other => panic!("unknown note phase {other}: {note:#}"),
        };
        assert_eq!(note["detail"], expected_detail, "{note:#}");
    }
    let kinds: Vec<&str> = trace
        .kinds()
        .into_iter()
        .filter(|k| *k != "gateway:tool_note")
        .collect();
    let deltas = kinds
        .iter()
        .filter(|k| **k == "response.mcp_call_arguments.delta")
        .count();
    assert!(
        deltas >= 1,
        "an mcp_call without argument deltas: {kinds:?}"
    );
    let mut expected = vec!["response.mcp_call_arguments.delta"; deltas];
    expected.extend([
        "response.mcp_call_arguments.done",
        "response.mcp_call.in_progress",
        outcome,
        "response.output_item.done",
    ]);
    assert_eq!(kinds, expected, "mcp_call events of {}", trace.id);
    let streamed: String = trace
        .events
        .iter()
        .filter(|e| e["type"] == "response.mcp_call_arguments.delta")
        .map(|e| e["delta"].as_str().expect("delta string"))
        .collect();
    assert_eq!(done["arguments"], streamed.as_str(), "{done:#}");
    let arguments_done = trace
        .events
        .iter()
        .find(|e| e["type"] == "response.mcp_call_arguments.done")
        .expect("arguments done");
    assert_eq!(arguments_done["arguments"], done["arguments"]);
    for key in ["name", "call_id", "server_label"] {
        assert_eq!(
            done[key], added[key],
            "{key} changed: {added:#} -> {done:#}"
        );
    }
}

/// What a client sees of an output, comparable between a streamed and a non-streamed run of one script:
/// `(type, name, arguments, text or output or error)`.
pub fn summary(response: &Value) -> Vec<(String, String, String, String)> {
    response["output"]
        .as_array()
        .expect("output")
        .iter()
        .map(|item| {
            let text = |v: &Value| {
                v.as_str()
                    .map(str::to_owned)
                    .unwrap_or_else(|| v.to_string())
            };
            let kind = text(&item["type"]);
            let content = match kind.as_str() {
                "message" => text(&item["content"][0]["text"]),
                "mcp_call" if item["status"] == "failed" => format!("error: {}", item["error"]),
                "mcp_call" => text(&item["output"]),
                _ => String::new(),
            };
            let name = item["name"].as_str().unwrap_or_default().to_owned();
            let arguments = item["arguments"].as_str().unwrap_or_default().to_owned();
            (kind, name, arguments, content)
        })
        .collect()
}

/// Adds a deployment `name` backed by the Chat Completions server at `base_url` to the tenant's group.
pub async fn add_deployment(gw: &TestGateway, group_id: &str, name: &str, base_url: &str) {
    let deployment = gw
        .admin_ok(
            Method::POST,
            "/deployments",
            Some(json!({"name": name, "provider": {"kind": "openai_chat", "base_url": base_url, "model": "m"}})),
        )
        .await;
    let id = deployment["id"].as_str().expect("deployment id");
    gw.admin_ok(
        Method::PUT,
        &format!("/deployment_groups/{group_id}/deployments/{id}"),
        None,
    )
    .await;
}

/// Reads one HTTP/1.1 request from `socket`: its head, then as many body bytes as it announces.
pub async fn read_http_request(socket: &mut tokio::net::TcpStream) {
    use tokio::io::AsyncReadExt;

    let mut request = Vec::new();
    let mut buffer = [0_u8; 8192];
    let body_start = loop {
        let n = socket.read(&mut buffer).await.expect("read request");
        assert!(n > 0, "request cut");
        request.extend_from_slice(&buffer[..n]);
        if let Some(end) = request.windows(4).position(|w| w == b"\r\n\r\n") {
            break end + 4;
        }
    };
    let head = String::from_utf8_lossy(&request[..body_start]).to_lowercase();
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .map(|v| v.trim().parse().expect("content-length"))
        .unwrap_or(0);
    while request.len() < body_start + length {
        let n = socket.read(&mut buffer).await.expect("read request body");
        assert!(n > 0, "request body cut");
        request.extend_from_slice(&buffer[..n]);
    }
}

/// The head of a streamed answer whose body ends when the connection closes.
pub const SSE_HEAD: &[u8] =
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n";

/// A Chat Completions server that answers each connection, in turn, with the next of `bodies` (raw SSE
/// text), then closes it cleanly. Returns its base URL and the number of requests it served.
pub async fn raw_upstream(
    bodies: Vec<String>,
) -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use tokio::io::AsyncWriteExt;

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let base_url = format!("http://{}/v1", listener.local_addr().expect("address"));
    let served = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = std::sync::Arc::clone(&served);
    tokio::spawn(async move {
        for body in bodies {
            let Ok((mut socket, _)) = listener.accept().await else {
                return;
            };
            read_http_request(&mut socket).await;
            count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let _ = socket.write_all(SSE_HEAD).await;
            let _ = socket.write_all(body.as_bytes()).await;
            let _ = socket.shutdown().await;
        }
    });
    (base_url, served)
}

/// One Chat Completions chunk as an SSE frame.
pub fn chunk(delta: Value, finish_reason: Option<&str>) -> String {
    let chunk = json!({"object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}]});
    format!("data: {chunk}\n\n")
}

/// Asserts that the events a client saw are exactly the core's replay of what the store holds for the
/// response: the stream is a pure projection of the stored steps, sequence numbers included.
pub async fn assert_replay_equals_stream(gw: &TestGateway, key: &str, checked: &Checked) {
    let project = gw
        .store
        .project_for_key(key)
        .await
        .unwrap()
        .expect("a live key");
    let id = checked.id();
    let stored = gw
        .store
        .load_response(&project, &id)
        .await
        .unwrap()
        .expect("the streamed response is stored");
    let steps = gw.store.load_steps(&project, &id).await.unwrap();
    let replayed: Vec<Value> = gateway_core::events::replay(&stored.record, &steps)
        .into_iter()
        .map(|e| e.data)
        .collect();
    assert_eq!(
        replayed, checked.events,
        "the replay of the stored steps differs from the stream"
    );
}
