//! `gateway-floor`: the least a Responses-to-Chat proxy does on the gateway's own stack, the floor its unstored
//! path is measured against (`gateway-bench --baseline-floor`). Not a product and not a mock of one: no keys, no
//! tenancy, no limits, no store, no logs, no metrics, no spans. Each `POST /v1/responses` is read into a typed
//! request, sent as one Chat call over hyper's pooled client, and answered with a response object of the
//! gateway's field set, written by serde; the runtime, server (axum), client and allocator are the gateway's.

use std::net::SocketAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, HeaderValue, Method, Request, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::serve::ListenerExt;
use axum::Router;
use clap::Parser;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde::{Deserialize, Serialize};

// The gateway's allocator (jemalloc), linked for its global allocator.
use gateway_allocator as _;

#[derive(Debug, Parser)]
struct Args {
    /// Where to listen.
    #[arg(long, default_value = "127.0.0.1:0")]
    bind: SocketAddr,
    /// The Chat base URL the calls go to (`…/v1`, as a deployment's URL).
    #[arg(long)]
    upstream: String,
}

#[derive(Clone)]
struct Upstream {
    client: Client<HttpConnector, Full<Bytes>>,
    chat: Uri,
}

/// The part of a create the floor reads: a model and a text input.
#[derive(Deserialize)]
struct Create<'a> {
    #[serde(borrow)]
    model: &'a str,
    #[serde(borrow)]
    input: std::borrow::Cow<'a, str>,
}

#[derive(Serialize)]
struct ChatRequest<'a> {
    model: &'a str,
    messages: [ChatMessage<'a>; 1],
}

#[derive(Serialize)]
struct ChatMessage<'a> {
    role: &'static str,
    content: &'a str,
}

#[derive(Deserialize)]
struct ChatAnswer {
    choices: Vec<Choice>,
    #[serde(default)]
    usage: ChatUsage,
}

#[derive(Deserialize)]
struct Choice {
    message: AnswerMessage,
}

#[derive(Deserialize)]
struct AnswerMessage {
    #[serde(default)]
    content: Option<String>,
}

#[derive(Deserialize, Default)]
struct ChatUsage {
    #[serde(default)]
    prompt_tokens: u64,
    #[serde(default)]
    completion_tokens: u64,
}

/// A completed response with one message, with the fields (and so about the bytes) the gateway answers with.
#[derive(Serialize)]
struct ResponseObject<'a> {
    id: &'a str,
    object: &'static str,
    created_at: u64,
    completed_at: u64,
    conversation: Option<()>,
    status: &'static str,
    background: bool,
    error: Option<()>,
    incomplete_details: Option<()>,
    instructions: Option<()>,
    max_output_tokens: Option<()>,
    max_tool_calls: Option<()>,
    model: &'a str,
    output: [Message<'a>; 1],
    output_text: &'a str,
    parallel_tool_calls: bool,
    previous_response_id: Option<()>,
    prompt_cache_key: Option<()>,
    reasoning: Reasoning,
    safety_identifier: Option<()>,
    service_tier: &'static str,
    store: bool,
    temperature: f64,
    text: serde_json::Value,
    tool_choice: &'static str,
    tools: [(); 0],
    top_logprobs: u32,
    top_p: f64,
    truncation: &'static str,
    presence_penalty: f64,
    frequency_penalty: f64,
    usage: Usage,
    user: Option<()>,
    metadata: serde_json::Map<String, serde_json::Value>,
}

#[derive(Serialize)]
struct Reasoning {
    effort: Option<()>,
    summary: Option<()>,
}

#[derive(Serialize)]
struct Message<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    id: &'a str,
    role: &'static str,
    content: [OutputText<'a>; 1],
    status: &'static str,
}

#[derive(Serialize)]
struct OutputText<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    text: &'a str,
    annotations: [(); 0],
    logprobs: [(); 0],
}

#[derive(Serialize)]
struct Usage {
    input_tokens: u64,
    input_tokens_details: InputDetails,
    output_tokens: u64,
    output_tokens_details: OutputDetails,
    total_tokens: u64,
}

#[derive(Serialize)]
struct InputDetails {
    cache_write_tokens: u64,
    cached_tokens: u64,
}

#[derive(Serialize)]
struct OutputDetails {
    reasoning_tokens: u64,
}

fn error(status: StatusCode, message: &str) -> Response {
    let body = serde_json::json!({"error": {"message": message, "type": "invalid_request_error"}});
    (status, axum::Json(body)).into_response()
}

async fn create(State(upstream): State<Upstream>, body: Bytes) -> Response {
    let Ok(create) = serde_json::from_slice::<Create>(&body) else {
        return error(
            StatusCode::BAD_REQUEST,
            "the floor reads only {model, input: string}",
        );
    };
    let chat = ChatRequest {
        model: create.model,
        messages: [ChatMessage {
            role: "user",
            content: &create.input,
        }],
    };
    let Ok(chat) = serde_json::to_vec(&chat) else {
        return error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "could not write the call",
        );
    };
    let mut request = Request::new(Full::new(Bytes::from(chat)));
    *request.method_mut() = Method::POST;
    *request.uri_mut() = upstream.chat.clone();
    request.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    let answer = match upstream.client.request(request).await {
        Ok(answer) if answer.status().is_success() => answer,
        Ok(answer) => return error(StatusCode::BAD_GATEWAY, answer.status().as_str()),
        Err(e) => return error(StatusCode::BAD_GATEWAY, &e.to_string()),
    };
    let bytes = match answer.into_body().collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e) => return error(StatusCode::BAD_GATEWAY, &e.to_string()),
    };
    let Ok(answer) = serde_json::from_slice::<ChatAnswer>(&bytes) else {
        return error(StatusCode::BAD_GATEWAY, "an answer that is not Chat's");
    };
    let text = answer
        .choices
        .into_iter()
        .next()
        .and_then(|choice| choice.message.content)
        .unwrap_or_default();
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_secs();
    let id = uuid::Uuid::new_v4().simple();
    let response_id = format!("resp_{id}");
    let message_id = format!("msg_{id}");
    let object = ResponseObject {
        id: &response_id,
        object: "response",
        created_at: now,
        completed_at: now,
        conversation: None,
        status: "completed",
        background: false,
        error: None,
        incomplete_details: None,
        instructions: None,
        max_output_tokens: None,
        max_tool_calls: None,
        model: create.model,
        output: [Message {
            kind: "message",
            id: &message_id,
            role: "assistant",
            content: [OutputText {
                kind: "output_text",
                text: &text,
                annotations: [],
                logprobs: [],
            }],
            status: "completed",
        }],
        output_text: &text,
        parallel_tool_calls: true,
        previous_response_id: None,
        prompt_cache_key: None,
        reasoning: Reasoning {
            effort: None,
            summary: None,
        },
        safety_identifier: None,
        service_tier: "default",
        store: false,
        temperature: 1.0,
        text: serde_json::json!({"format": {"type": "text"}}),
        tool_choice: "auto",
        tools: [],
        top_logprobs: 0,
        top_p: 1.0,
        truncation: "disabled",
        presence_penalty: 0.0,
        frequency_penalty: 0.0,
        usage: Usage {
            input_tokens: answer.usage.prompt_tokens,
            input_tokens_details: InputDetails {
                cache_write_tokens: 0,
                cached_tokens: 0,
            },
            output_tokens: answer.usage.completion_tokens,
            output_tokens_details: OutputDetails {
                reasoning_tokens: 0,
            },
            total_tokens: answer.usage.prompt_tokens + answer.usage.completion_tokens,
        },
        user: None,
        metadata: serde_json::Map::new(),
    };
    match serde_json::to_vec(&object) {
        Ok(body) => (
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            )],
            body,
        )
            .into_response(),
        Err(_) => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "could not write the answer",
        ),
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let chat: Uri = format!("{}/chat/completions", args.upstream.trim_end_matches('/'))
        .parse()
        .context("--upstream is not a URL")?;
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let upstream = Upstream {
        client: Client::builder(TokioExecutor::new()).build(connector),
        chat,
    };
    let app = Router::new()
        .route("/v1/responses", post(create))
        .with_state(upstream);
    let listener = tokio::net::TcpListener::bind(args.bind)
        .await
        .with_context(|| format!("bind {}", args.bind))?;
    println!("listening on http://{}", listener.local_addr()?);
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    axum::serve(listener, app).await?;
    Ok(())
}
