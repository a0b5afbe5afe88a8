//! The WebSocket transport of `/v1/responses` (SPEC 11), driven by a real WebSocket client: turns streamed as
//! SSE streams them, `store: false` chains on one socket, one turn at a time, error envelopes, the time limit.

use std::time::Duration;

use crate::common::sse::check_stream;
use crate::common::*;
use futures::{SinkExt, StreamExt};
use gateway_e2e::{items_of, TestGateway};
use gateway_testkit::{Call, Reply};
use reqwest::Method;
use serde_json::{json, Value};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

/// The terminal events of a turn that ran.
const TERMINAL: [&str; 3] = [
    "response.completed",
    "response.incomplete",
    "response.failed",
];

/// A test's bound on waiting for one message (never reached when the gateway works).
const PATIENCE: Duration = Duration::from_secs(30);

/// A client's socket to `/v1/responses`.
pub struct Socket {
    ws: WebSocketStream<MaybeTlsStream<TcpStream>>,
}

/// What one turn got: its events, or the error envelope that refused it.
#[derive(Debug)]
pub enum Turn {
    Events(Vec<Value>),
    Refused(Value),
}

impl Turn {
    /// The events of a turn that ran; fails on an error envelope.
    pub fn events(self) -> Vec<Value> {
        match self {
            Turn::Events(events) => events,
            Turn::Refused(envelope) => panic!("the turn was refused: {envelope:#}"),
        }
    }

    /// The error envelope of a refused turn; fails when it ran.
    pub fn refused(self) -> Value {
        match self {
            Turn::Refused(envelope) => envelope,
            Turn::Events(events) => panic!("the turn ran: {events:#?}"),
        }
    }

    /// The response of a turn's terminal event.
    pub fn response(self) -> Value {
        let events = self.events();
        events.last().expect("no events")["response"].clone()
    }
}

/// The `ws://` address of the gateway's `/v1/responses`.
pub fn ws_url(gw: &TestGateway) -> String {
    format!("{}/v1/responses", gw.base_url.replacen("http", "ws", 1))
}

/// Opens a socket with `key`; the connection error when the gateway refuses it.
pub async fn try_connect(gw: &TestGateway, key: Option<&str>) -> Result<Socket, WsError> {
    let mut request = ws_url(gw).into_client_request()?;
    if let Some(key) = key {
        request.headers_mut().insert(
            "authorization",
            format!("Bearer {key}").parse().expect("header"),
        );
    }
    let (ws, _) = tokio_tungstenite::connect_async(request).await?;
    Ok(Socket { ws })
}

/// Opens a socket with `key`.
pub async fn connect(gw: &TestGateway, key: &str) -> Socket {
    try_connect(gw, Some(key)).await.expect("connect")
}

impl Socket {
    /// Sends a JSON message.
    pub async fn send(&mut self, message: Value) {
        self.send_text(message.to_string()).await;
    }

    pub async fn send_text(&mut self, text: String) {
        self.ws.send(Message::text(text)).await.expect("send");
    }

    /// The next message, parsed; `None` once the gateway closed the socket.
    pub async fn next(&mut self) -> Option<Value> {
        loop {
            let message = tokio::time::timeout(PATIENCE, self.ws.next())
                .await
                .expect("a message in time")?;
            match message.expect("read") {
                Message::Text(text) => {
                    return Some(serde_json::from_str(text.as_str()).expect("JSON message"))
                }
                Message::Close(_) => return None,
                Message::Ping(_) | Message::Pong(_) | Message::Frame(_) => {}
                Message::Binary(_) => panic!("a binary message"),
            }
        }
    }

    /// Reads one turn: its events up to the terminal one, or its error envelope.
    pub async fn turn(&mut self) -> Turn {
        let mut events = Vec::new();
        loop {
            let message = self.next().await.expect("the socket closed mid-turn");
            if message["type"] == "error" && message.get("status").is_some() {
                assert!(events.is_empty(), "an envelope mid-turn: {events:#?}");
                return Turn::Refused(message);
            }
            let terminal = TERMINAL.iter().any(|t| message["type"] == *t);
            events.push(message);
            if terminal {
                return Turn::Events(events);
            }
        }
    }

    /// Sends `message` as a `response.create` and reads its turn.
    pub async fn create(&mut self, mut body: Value) -> Turn {
        body["type"] = json!("response.create");
        self.send(body).await;
        self.turn().await
    }
}

/// Asserts an error envelope: `type`, `status`, and the error's `code` and `param`.
pub fn assert_envelope(envelope: &Value, status: u16, code: &str, param: Option<&str>) {
    assert_eq!(envelope["type"], "error", "{envelope:#}");
    assert_eq!(envelope["status"], status, "{envelope:#}");
    assert_eq!(envelope["error"]["code"], code, "{envelope:#}");
    assert_eq!(envelope["error"]["param"], json!(param), "{envelope:#}");
    assert!(
        envelope["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()),
        "{envelope:#}"
    );
}

/// The texts of a Chat Completions request's messages, as `(role, content)`.
fn conversation(request: &Value) -> Vec<(String, String)> {
    messages(request)
        .iter()
        .map(|m| {
            (
                m["role"].as_str().unwrap_or_default().to_owned(),
                m["content"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

fn pair(role: &str, content: &str) -> (String, String) {
    (role.to_owned(), content.to_owned())
}

#[tokio::test]
async fn a_turn_streams_the_same_events_as_sse_and_is_stored() {
    let (gw, tenant) = gateway().await;
    gw.model.push(Reply::text("one, two, three"));
    let mut socket = connect(&gw, &tenant.key).await;

    let events = socket
        .create(json!({"model": "mock", "input": "Count from 1 to 3."}))
        .await
        .events();

    // Checked as a strict SSE client checks a stream: order, sequence numbers from 0, item lifecycles.
    let checked = check_stream(events.clone());
    assert_eq!(events[0]["sequence_number"], 0);
    assert_eq!(checked.terminal_kind(), "response.completed");
    assert_eq!(checked.terminal["output_text"], "one, two, three");
    let stored = get_response(&gw, &tenant.key, &checked.id()).await;
    assert_eq!(stored.body, checked.terminal);
}

#[tokio::test]
async fn a_store_false_chain_continues_on_the_same_socket_without_storing_anything() {
    let (gw, tenant) = gateway().await;
    gw.model.push(Reply::text("OK"));
    gw.model.push(Reply::text("cobalt"));
    let mut socket = connect(&gw, &tenant.key).await;

    let first = socket
        .create(
            json!({"model": "mock", "store": false, "input": "Remember the code word: cobalt."}),
        )
        .await
        .response();
    let second = socket
        .create(
            json!({"model": "mock", "store": false, "previous_response_id": id_of(&first),
            "input": "What was the code word?"}),
        )
        .await
        .events();

    assert_eq!(
        second[0]["sequence_number"], 0,
        "each response numbers from 0"
    );
    let second = check_stream(second);
    assert_eq!(second.terminal["status"], "completed");
    assert_eq!(second.terminal["previous_response_id"], id_of(&first));
    assert_eq!(
        conversation(&gw.model.requests()[1]),
        [
            pair("user", "Remember the code word: cobalt."),
            pair("assistant", "OK"),
            pair("user", "What was the code word?"),
        ]
    );
    assert_eq!(stored_rows(&gw).await, (0, 0, 0));
}

#[tokio::test]
async fn a_store_false_response_is_not_found_after_a_reconnect_and_the_new_socket_goes_on() {
    let (gw, tenant) = gateway().await;
    gw.model.push(Reply::text("OK"));
    gw.model.push(Reply::text("a fresh start"));
    let mut first_socket = connect(&gw, &tenant.key).await;
    let first = first_socket
        .create(json!({"model": "mock", "store": false, "input": "Remember: copper."}))
        .await
        .response();
    drop(first_socket);

    let mut socket = connect(&gw, &tenant.key).await;
    let envelope = socket
        .create(
            json!({"model": "mock", "store": false, "previous_response_id": id_of(&first),
            "input": "What was it?"}),
        )
        .await
        .refused();

    assert_envelope(
        &envelope,
        400,
        "previous_response_not_found",
        Some("previous_response_id"),
    );
    // The socket stays open: a new chain with the full context starts on it.
    let recovered = socket
        .create(json!({"model": "mock", "store": false, "input": [
            {"type": "message", "role": "user", "content": "Remember: copper."},
            {"type": "message", "role": "user", "content": "What was it?"}]}))
        .await
        .response();
    assert_eq!(recovered["status"], "completed");
    assert_eq!(gw.model.requests().len(), 2);
}

#[tokio::test]
async fn a_failed_continuation_evicts_the_response_it_continued() {
    let (gw, tenant) = gateway().await;
    gw.model.push(Reply::text("OK"));
    let mut socket = connect(&gw, &tenant.key).await;
    let first = socket
        .create(json!({"model": "mock", "store": false, "input": "Remember: ember."}))
        .await
        .response();

    let failed = socket
        .create(json!({"model": "mock", "store": false, "previous_response_id": id_of(&first),
            "input": [{"type": "function_call_output", "call_id": "call_missing", "output": "nothing"}]}))
        .await
        .refused();
    assert_eq!(failed["status"], 400, "{failed:#}");
    assert_eq!(failed["error"]["param"], "input[0]", "{failed:#}");

    let stale = socket
        .create(
            json!({"model": "mock", "store": false, "previous_response_id": id_of(&first),
            "input": "Try again."}),
        )
        .await
        .refused();
    assert_envelope(
        &stale,
        400,
        "previous_response_not_found",
        Some("previous_response_id"),
    );
    assert_eq!(gw.model.requests().len(), 1);
}

#[tokio::test]
async fn a_continuation_that_fails_upstream_is_an_error_event_then_failed_and_evicts() {
    let (gw, tenant) = gateway().await;
    gw.model.push(Reply::text("OK"));
    for _ in 0..3 {
        gw.model.push(Reply::error(500, "upstream detail"));
    }
    let mut socket = connect(&gw, &tenant.key).await;
    let first = socket
        .create(json!({"model": "mock", "store": false, "input": "Remember: ember."}))
        .await
        .response();

    let failed = socket
        .create(
            json!({"model": "mock", "store": false, "previous_response_id": id_of(&first),
            "input": "Go on."}),
        )
        .await
        .events();
    let kinds: Vec<&str> = failed.iter().filter_map(|e| e["type"].as_str()).collect();
    assert_eq!(
        kinds,
        [
            "response.created",
            "response.in_progress",
            "error",
            "response.failed"
        ]
    );

    let stale = socket
        .create(
            json!({"model": "mock", "store": false, "previous_response_id": id_of(&first),
            "input": "Once more."}),
        )
        .await
        .refused();
    assert_envelope(
        &stale,
        400,
        "previous_response_not_found",
        Some("previous_response_id"),
    );
}

#[tokio::test]
async fn turns_sent_together_run_one_after_the_other() {
    let (gw, tenant) = gateway().await;
    // The first reply is slow: a second turn run alongside would overtake it.
    gw.model
        .push(Reply::text("first").with_delay(Duration::from_millis(300)));
    gw.model.push(Reply::text("second"));
    let mut socket = connect(&gw, &tenant.key).await;

    for word in ["first", "second"] {
        socket
            .send(
                json!({"type": "response.create", "model": "mock", "store": false,
                "input": format!("Reply with exactly: {word}")}),
            )
            .await;
    }
    let first = socket.turn().await.events();
    let second = socket.turn().await.events();

    for (events, word) in [(&first, "first"), (&second, "second")] {
        let checked = check_stream(events.clone());
        assert_eq!(checked.terminal["output_text"], word);
        let ids: Vec<&str> = events
            .iter()
            .filter_map(|e| e["response"]["id"].as_str())
            .collect();
        assert!(ids.iter().all(|id| *id == ids[0]), "interleaved: {ids:?}");
    }
    assert_eq!(
        last_text_of(&gw.model.requests()[0], "user"),
        "Reply with exactly: first"
    );
}

#[tokio::test]
async fn a_stored_chain_crosses_from_the_socket_to_http_and_back() {
    let (gw, tenant) = gateway().await;
    gw.model.push(Reply::text("socket one"));
    gw.model.push(Reply::text("http two"));
    gw.model.push(Reply::text("socket three"));
    let mut socket = connect(&gw, &tenant.key).await;

    let first = socket
        .create(json!({"model": "mock", "input": "turn one"}))
        .await
        .response();
    let second = create_ok(
        &gw,
        &tenant.key,
        json!({"model": "mock", "previous_response_id": id_of(&first), "input": "turn two"}),
    )
    .await;
    // A new socket: a stored response is read from the store, not from a connection's memory.
    let mut other = connect(&gw, &tenant.key).await;
    let third = other
        .create(
            json!({"model": "mock", "previous_response_id": id_of(&second), "input": "turn three"}),
        )
        .await
        .response();

    assert_eq!(third["status"], "completed");
    assert_eq!(
        conversation(&gw.model.requests()[2]),
        [
            pair("user", "turn one"),
            pair("assistant", "socket one"),
            pair("user", "turn two"),
            pair("assistant", "http two"),
            pair("user", "turn three"),
        ]
    );
    let stored = get_response(&gw, &tenant.key, &id_of(&third)).await;
    assert_eq!(stored.body, third);
}

#[tokio::test]
async fn bad_messages_get_an_error_envelope_and_the_socket_stays_open() {
    let (gw, tenant) = gateway().await;
    gw.model.push(Reply::text("still here"));
    let mut socket = connect(&gw, &tenant.key).await;

    let cases: [(String, &str, Option<&str>); 6] = [
        ("{not json".into(), "invalid_json", None),
        (
            json!({"type": "response.cancel"}).to_string(),
            "unknown_message_type",
            Some("type"),
        ),
        (
            json!({"model": "mock", "input": "no type"}).to_string(),
            "missing_required_parameter",
            Some("type"),
        ),
        (
            json!({"type": "response.create", "model": "mock", "input": "x", "stream": true})
                .to_string(),
            "unsupported_parameter",
            Some("stream"),
        ),
        (
            json!({"type": "response.create", "model": "mock", "input": "x", "background": true})
                .to_string(),
            "unsupported_parameter",
            Some("background"),
        ),
        (
            json!({"type": "response.create", "model": "nope", "input": "x"}).to_string(),
            "model_not_found",
            Some("model"),
        ),
    ];
    for (text, code, param) in cases {
        socket.send_text(text.clone()).await;
        let envelope = socket.turn().await.refused();
        let status = if code == "model_not_found" { 404 } else { 400 };
        assert_envelope(&envelope, status, code, param);
    }
    socket
        .ws
        .send(Message::binary(vec![1, 2, 3]))
        .await
        .expect("send");
    assert_envelope(&socket.turn().await.refused(), 400, "invalid_message", None);

    let response = socket
        .create(json!({"model": "mock", "input": "are you there?"}))
        .await
        .response();
    assert_eq!(response["output_text"], "still here");
    assert_eq!(stored_rows(&gw).await.0, 1, "only the good turn was stored");
}

#[tokio::test]
async fn a_socket_without_a_valid_key_is_refused_before_the_upgrade() {
    let (gw, tenant) = gateway().await;

    for (key, code) in [
        (None, json!("missing_api_key")),
        (Some("sk-wrong"), json!("invalid_api_key")),
    ] {
        let refused = try_connect(&gw, key).await.err().expect("refused");
        let WsError::Http(response) = refused else {
            panic!("not an HTTP refusal: {refused:?}");
        };
        assert_eq!(response.status().as_u16(), 401);
        let body: Value =
            serde_json::from_slice(response.body().as_deref().expect("a body")).expect("JSON");
        assert_eq!(body["error"]["type"], "invalid_request_error", "{body:#}");
        assert_eq!(body["error"]["code"], code, "{body:#}");
    }
    // A plain GET (no upgrade) with a good key is the wrong method, in the OpenAI shape.
    let plain = gw
        .call(gw.public(Method::GET, "/responses", &tenant.key))
        .await;
    assert_error(&plain, 405, None, Some("method_not_allowed"));
    assert_eq!(gw.model.requests().len(), 0);
}

#[tokio::test]
async fn a_key_revoked_while_its_socket_is_open_is_refused_on_the_next_turn_and_the_socket_closes()
{
    let (gw, tenant) = gateway().await;
    let mut socket = connect(&gw, &tenant.key).await;
    let first = socket
        .create(json!({"model": "mock", "store": false, "input": "hi"}))
        .await
        .response();
    assert_eq!(first["status"], "completed", "{first:#}");

    gw.admin_ok(
        Method::DELETE,
        &format!("/api_keys/{}", tenant.key_id),
        None,
    )
    .await;

    // The next turn is refused as a request with that key would be, and the socket it opened ends.
    let envelope = socket
        .create(json!({"model": "mock", "store": false, "input": "again"}))
        .await
        .refused();
    assert_envelope(&envelope, 401, "invalid_api_key", None);
    assert!(socket.next().await.is_none(), "the socket closes");
    assert_eq!(
        gw.model.requests().len(),
        1,
        "the refused turn called no model"
    );
}

#[tokio::test]
async fn a_connection_at_its_time_limit_is_told_so_and_closed() {
    let gw = TestGateway::start_with(|config| config.websocket.max_connection_ms = 200).await;
    let tenant = gw.tenant("acme").await;
    let mut socket = connect(&gw, &tenant.key).await;

    // Nothing is sent: the next message is the limit's envelope, then the socket closes.
    let envelope = socket.next().await.expect("the limit envelope");
    assert_envelope(&envelope, 400, "websocket_connection_limit_reached", None);
    assert!(socket.next().await.is_none(), "the socket closes");
}

#[tokio::test]
async fn a_client_tool_call_is_handed_back_and_answered_on_the_socket() {
    let (gw, tenant) = gateway().await;
    gw.model.push(Reply::tool_calls(vec![Call::new(
        "lookup",
        json!({"word": "socket"}),
    )
    .with_id("call_lookup")]));
    gw.model.push(Reply::text("A socket is an endpoint."));
    let tool = json!({"type": "function", "name": "lookup", "description": "Look a word up.",
        "parameters": {"type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"]}});
    let mut socket = connect(&gw, &tenant.key).await;

    let first = socket
        .create(json!({"model": "mock", "store": false, "input": "define socket", "tools": [tool]}))
        .await
        .response();
    let calls = items_of(&first, "function_call");
    assert_eq!(calls.len(), 1, "{first:#}");
    assert_eq!(calls[0]["call_id"], "call_lookup");

    let second = socket
        .create(json!({"model": "mock", "store": false, "previous_response_id": id_of(&first),
            "tools": [tool],
            "input": [{"type": "function_call_output", "call_id": "call_lookup", "output": "an endpoint"}]}))
        .await
        .response();

    assert_eq!(second["output_text"], "A socket is an endpoint.");
    let request = &gw.model.requests()[1];
    assert_calls_paired(request);
    assert_eq!(tool_result(request, "call_lookup"), "an endpoint");
    assert_eq!(stored_rows(&gw).await, (0, 0, 0));
}

#[tokio::test]
async fn a_client_leaving_mid_turn_leaves_nothing_in_progress() {
    let (gw, tenant) = gateway_with_tools(&["slow"]).await;
    gw.model.push(Reply::tool_calls(vec![Call::new(
        "slow",
        json!({"ms": 1000}),
    )]));
    gw.model.push(Reply::text("nobody is listening"));
    let mut socket = connect(&gw, &tenant.key).await;
    socket
        .send(json!({"type": "response.create", "model": "mock", "input": "take your time"}))
        .await;
    let created = socket.next().await.expect("response.created");
    let id = created["response"]["id"].as_str().expect("id").to_owned();
    loop {
        let event = socket.next().await.expect("events");
        if event["type"] == "response.output_item.added" && event["item"]["type"] == "mcp_call" {
            break;
        }
    }
    drop(socket);

    let stored = terminal_response(&gw, &tenant.key, &id).await;
    assert_eq!(stored["status"], "incomplete", "{stored:#}");
    assert_eq!(
        stored["incomplete_details"]["reason"],
        "client_disconnected"
    );
    assert_eq!(
        gw.model.requests().len(),
        1,
        "the model was not called again"
    );
    assert_eq!(stored_statuses(&gw).await, [(id, "incomplete".to_owned())]);
}

/// The stored response `id`, once it is no longer in progress (bounded wait).
async fn terminal_response(gw: &TestGateway, key: &str, id: &str) -> Value {
    for _ in 0..200 {
        let answer = get_response(gw, key, id).await;
        assert_eq!(answer.status.as_u16(), 200, "{:#}", answer.body);
        if answer.body["status"] != "in_progress" {
            return answer.body;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("response {id} stayed in progress");
}

#[tokio::test]
async fn a_compacted_window_starts_a_new_chain_on_the_socket() {
    let (gw, tenant) = gateway().await;
    gw.model
        .push(Reply::text("SUMMARY: the code word is slate."));
    gw.model.push(Reply::text("compacted"));
    let compacted = gw
        .call(
            gw.public(Method::POST, "/responses/compact", &tenant.key)
                .json(&json!({"model": "mock", "input": [
                    {"type": "message", "role": "user", "content": "Remember the code word: slate."},
                    {"type": "message", "role": "assistant", "content": "OK."}]})),
        )
        .await;
    assert_eq!(compacted.status.as_u16(), 200, "{:#}", compacted.body);
    let mut input = compacted.body["output"].as_array().expect("output").clone();
    input.push(json!({"type": "message", "role": "user", "content": "Continue. Reply with exactly: compacted"}));
    let mut socket = connect(&gw, &tenant.key).await;

    let response = socket
        .create(json!({"model": "mock", "store": false, "input": input, "tools": []}))
        .await
        .response();

    assert_eq!(response["status"], "completed");
    assert_eq!(response["output_text"], "compacted");
    assert!(
        messages(&gw.model.requests()[1])
            .iter()
            .any(|m| m["content"]
                .as_str()
                .is_some_and(|t| t.ends_with("SUMMARY: the code word is slate."))),
        "the model read the summary"
    );
}

/// A message of exactly `size` bytes: a `response.create` whose input is padded to reach it.
fn create_of_size(size: usize) -> String {
    let empty = json!({"type": "response.create", "model": "mock", "input": ""}).to_string();
    let padding = "x".repeat(size - empty.len());
    json!({"type": "response.create", "model": "mock", "input": padding}).to_string()
}

/// The body limit of the gateways that test the bounds: small, so that tests send little.
const SMALL_LIMIT: usize = 64 * 1024;

/// Sends `text` while reading what comes back, up to the close: the envelopes received and the close frame's code.
/// The send may fail once the gateway stops reading the message; what the gateway said still arrives.
async fn send_until_closed(socket: Socket, text: String) -> (Vec<Value>, Option<u16>) {
    let (mut sink, mut stream) = socket.ws.split();
    let sending = async move {
        let _ = sink.send(Message::text(text)).await;
        sink
    };
    let reading = async move {
        let mut received = Vec::new();
        loop {
            let message = tokio::time::timeout(PATIENCE, stream.next())
                .await
                .expect("a message or the close in time");
            match message {
                Some(Ok(Message::Text(text))) => {
                    received.push(serde_json::from_str(text.as_str()).expect("JSON"))
                }
                Some(Ok(Message::Close(frame))) => {
                    return (received, frame.map(|f| u16::from(f.code)))
                }
                Some(Ok(_)) => {}
                Some(Err(_)) | None => return (received, None),
            }
        }
    };
    let (_sink, read) = tokio::join!(sending, reading);
    read
}

#[tokio::test]
async fn a_message_over_the_body_limit_is_refused_with_close_code_1009_and_one_just_under_is_answered(
) {
    let gw = TestGateway::start_with(|config| config.server.body_limit_bytes = SMALL_LIMIT).await;
    let tenant = gw.tenant("acme").await;
    gw.model.push(Reply::text("read it"));
    let mut socket = connect(&gw, &tenant.key).await;

    socket.send_text(create_of_size(SMALL_LIMIT)).await;
    let answered = socket.turn().await.response();
    assert_eq!(answered["status"], "completed", "{answered:#}");

    let (received, close) = send_until_closed(socket, create_of_size(SMALL_LIMIT + 1)).await;
    assert_eq!(received.len(), 1, "{received:#?}");
    assert_envelope(&received[0], 413, "request_too_large", None);
    assert_eq!(close, Some(1009), "closed as 'message too big'");
    assert_eq!(gw.model.requests().len(), 1, "the large one never ran");
}

#[tokio::test]
async fn a_message_far_over_the_limit_is_refused_before_it_is_read() {
    let gw = TestGateway::start_with(|config| config.server.body_limit_bytes = SMALL_LIMIT).await;
    let tenant = gw.tenant("acme").await;
    let socket = connect(&gw, &tenant.key).await;

    // Far more than the socket buffers hold: the gateway refuses it from the frame's header.
    let (received, close) = send_until_closed(socket, create_of_size(16 * 1024 * 1024)).await;

    assert_eq!(received.len(), 1, "{received:#?}");
    assert_envelope(&received[0], 413, "request_too_large", None);
    assert_eq!(close, Some(1009));
    assert_eq!(gw.model.requests().len(), 0);
}

#[tokio::test]
async fn a_store_false_context_larger_than_a_connection_keeps_cannot_be_continued_and_says_why() {
    let gw = TestGateway::start_with(|config| config.server.body_limit_bytes = SMALL_LIMIT).await;
    let tenant = gw.tenant("acme").await;
    // Input and output each fit the limit; together they do not.
    gw.model.push(Reply::text("y".repeat(SMALL_LIMIT / 2)));
    gw.model.push(Reply::text("still open"));
    let mut socket = connect(&gw, &tenant.key).await;
    let first = socket
        .create(json!({"model": "mock", "store": false, "input": "x".repeat(SMALL_LIMIT / 2)}))
        .await
        .response();

    let refused = socket
        .create(
            json!({"model": "mock", "store": false, "previous_response_id": id_of(&first),
            "input": "go on"}),
        )
        .await
        .refused();

    assert_envelope(
        &refused,
        400,
        "previous_response_not_found",
        Some("previous_response_id"),
    );
    let message = refused["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("larger than") && message.contains(&SMALL_LIMIT.to_string()),
        "{message}"
    );
    let next = socket
        .create(json!({"model": "mock", "store": false, "input": "a new chain"}))
        .await
        .response();
    assert_eq!(next["status"], "completed", "the socket stays open");
    assert_eq!(gw.model.requests().len(), 2, "the refused turn never ran");
}

#[tokio::test]
async fn a_key_holding_its_most_connections_gets_429_until_one_closes() {
    let gw = TestGateway::start_with(|config| config.websocket.max_connections_per_key = 2).await;
    let tenant = gw.tenant("acme").await;
    let other = gw.tenant("globex").await;
    let _first = connect(&gw, &tenant.key).await;
    let mut second = connect(&gw, &tenant.key).await;

    let refused = try_connect(&gw, Some(&tenant.key))
        .await
        .err()
        .expect("refused");
    let WsError::Http(response) = refused else {
        panic!("not an HTTP refusal: {refused:?}");
    };
    assert_eq!(response.status().as_u16(), 429);
    let body: Value =
        serde_json::from_slice(response.body().as_deref().expect("a body")).expect("JSON");
    assert_eq!(body["error"]["type"], "invalid_request_error", "{body:#}");
    assert_eq!(
        body["error"]["code"], "too_many_websocket_connections",
        "{body:#}"
    );
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains('2')),
        "{body:#}"
    );
    let _another_key = connect(&gw, &other.key).await;

    second.ws.close(None).await.expect("close");
    // Read up to the gateway's close reply (then the stream ends).
    while let Some(Ok(_)) = second.ws.next().await {}
    // The place is given back once the gateway has ended the connection, just after its close reply: connect
    // again until it is (each attempt is a round trip, not a sleep).
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while try_connect(&gw, Some(&tenant.key)).await.is_err() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the place never came back"
        );
    }
}

/// A socket whose receive window is a few KiB: a client that stops reading is felt by the gateway at once.
async fn connect_with_a_small_window(gw: &TestGateway, key: &str) -> Socket {
    let address = gw
        .base_url
        .trim_start_matches("http://")
        .parse()
        .expect("address");
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket.set_recv_buffer_size(4096).expect("buffer size");
    let stream = socket.connect(address).await.expect("connect");
    let mut request = ws_url(gw).into_client_request().expect("request");
    request.headers_mut().insert(
        "authorization",
        format!("Bearer {key}").parse().expect("header"),
    );
    let (ws, _) = tokio_tungstenite::client_async(request, MaybeTlsStream::Plain(stream))
        .await
        .expect("upgrade");
    Socket { ws }
}

/// A client that stops reading (its process paused, say) while its turn's events are more than the socket's
/// buffers hold: after `server.stream_stall_timeout_ms` the gateway treats it as gone and ends the connection,
/// which gives back its key's place among the connections.
#[tokio::test]
async fn a_client_that_stops_reading_gives_back_its_connection_place_after_the_stall_timeout() {
    let gw = TestGateway::start_with(|config| {
        config.websocket.max_connections_per_key = 1;
        config.server.stream_stall_timeout_ms = 2000;
    })
    .await;
    let tenant = gw.tenant("acme").await;
    gw.model.push(Reply::text("x".repeat(4 * 1024 * 1024)));
    let mut stalled = connect_with_a_small_window(&gw, &tenant.key).await;
    stalled
        .send(json!({"type": "response.create", "model": "mock", "input": "go"}))
        .await;
    // It reads nothing from here on; its one place is held until the gateway gives up on it.
    assert!(try_connect(&gw, Some(&tenant.key)).await.is_err());

    let deadline = tokio::time::Instant::now() + PATIENCE;
    while try_connect(&gw, Some(&tenant.key)).await.is_err() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the stalled connection kept its place"
        );
    }
    drop(stalled);
}
