//! Traces (SPEC 14), tried with the real binary against the testkit's OTLP receiver: a tool round is one trace
//! under the client's `traceparent`, with `chat` and `execute_tool` spans carrying the GenAI attributes; the
//! model and the tool get `traceparent`; a response taken over after a kill continues its trace; content goes on
//! spans only when asked; sampling is honoured; with traces off nothing is sent.

#![allow(clippy::panic, clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{Cluster, Replica, PATIENCE};
use gateway_testkit::{OtlpReceiver, ReceivedSpan};
use serde_json::{json, Value};

/// The client's trace: a sampled parent.
const CLIENT_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CLIENT_SPAN: &str = "00f067aa0ba902b7";

/// A replica that exports its spans to `receiver` at once, with `extra` settings.
fn traced(cluster: &Cluster, receiver: &OtlpReceiver, extra: &[(&str, &str)]) -> Replica {
    let endpoint = receiver.endpoint();
    let mut settings = vec![
        ("GATEWAY__TELEMETRY__OTLP_ENDPOINT", endpoint.as_str()),
        ("GATEWAY__TELEMETRY__EXPORT_DELAY_MS", "20"),
    ];
    settings.extend_from_slice(extra);
    cluster.replica(&settings)
}

/// `POST /v1/responses` on `replica`, with a `traceparent` when given.
async fn create(
    cluster: &Cluster,
    replica: &Replica,
    body: Value,
    traceparent: Option<&str>,
) -> Value {
    let mut request = cluster
        .http
        .post(format!("{}/v1/responses", replica.base_url))
        .bearer_auth(&cluster.key)
        .json(&body);
    if let Some(traceparent) = traceparent {
        request = request.header("traceparent", traceparent);
    }
    common::json(request.send().await).await
}

/// The spans of `trace` once `done` holds for them.
async fn spans_of(
    receiver: &OtlpReceiver,
    trace: &str,
    done: impl Fn(&[&ReceivedSpan]) -> bool,
) -> Vec<ReceivedSpan> {
    let waited = receiver
        .wait_until(PATIENCE, |spans| {
            let of_trace: Vec<&ReceivedSpan> =
                spans.iter().filter(|s| s.trace_id == trace).collect();
            done(&of_trace)
        })
        .await;
    let spans = waited.unwrap_or_else(|| {
        panic!(
            "the spans of trace {trace} never arrived; received: {:#?}",
            receiver.spans()
        )
    });
    spans.into_iter().filter(|s| s.trace_id == trace).collect()
}

fn named<'a>(spans: &'a [ReceivedSpan], name: &str) -> Vec<&'a ReceivedSpan> {
    spans.iter().filter(|s| s.name == name).collect()
}

fn count(spans: &[&ReceivedSpan], name: &str) -> usize {
    spans.iter().filter(|s| s.name == name).count()
}

/// The `(trace id, parent span id)` a `traceparent` names.
fn parts(traceparent: &str) -> (String, String) {
    let fields: Vec<&str> = traceparent.split('-').collect();
    assert_eq!(fields.len(), 4, "a W3C traceparent: {traceparent}");
    (fields[1].to_owned(), fields[2].to_owned())
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
}

#[tokio::test]
async fn a_tool_round_is_one_trace_under_the_clients_traceparent_with_chat_and_execute_tool_spans()
{
    let receiver = OtlpReceiver::start().await.expect("receiver");
    let mut cluster = Cluster::postgres().await;
    let replica = traced(&cluster, &receiver, &[]);
    cluster.configure(&replica).await;

    let traceparent = format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}-01");
    let response = create(
        &cluster,
        &replica,
        json!({"model": "mock", "input": "!call add {\"a\": 2, \"b\": 3}"}),
        Some(&traceparent),
    )
    .await;
    assert_eq!(response["status"], "completed", "{response:#}");
    // Read back in the same trace: a path holding an id is named by its route.
    let id = response["id"].as_str().unwrap();
    let fetched = cluster
        .http
        .get(format!("{}/v1/responses/{id}", replica.base_url))
        .bearer_auth(&cluster.key)
        .header("traceparent", &traceparent)
        .send()
        .await
        .unwrap();
    assert_eq!(fetched.status(), 200);

    let spans = spans_of(&receiver, CLIENT_TRACE, |spans| {
        count(spans, "chat mock-model") == 2
            && count(spans, "execute_tool add") == 1
            && count(spans, "invoke_agent gateway") == 1
            && count(spans, "POST /v1/responses") == 1
            && count(spans, "GET /v1/responses/{response_id}") == 1
    })
    .await;
    let read = named(&spans, "GET /v1/responses/{response_id}")[0];
    assert_eq!(read.attribute("http.route"), "/v1/responses/{response_id}");
    assert_eq!(read.parent_span_id, CLIENT_SPAN);

    // The request is the client's child, the run the request's, the calls the run's.
    let request = named(&spans, "POST /v1/responses")[0];
    assert_eq!(request.parent_span_id, CLIENT_SPAN);
    assert_eq!(request.kind, "SPAN_KIND_SERVER");
    assert_eq!(request.attribute("http.route"), "/v1/responses");
    assert_eq!(request.attribute("http.response.status_code"), 200);
    assert_eq!(request.service, "gateway");
    let run = named(&spans, "invoke_agent gateway")[0];
    assert_eq!(run.parent_span_id, request.span_id);
    assert_eq!(run.attribute("gen_ai.response.id"), &response["id"]);
    assert_eq!(run.attribute("gateway.run.origin"), "new");
    assert_eq!(run.attribute("gateway.response.status"), "completed");

    let chats = named(&spans, "chat mock-model");
    for chat in &chats {
        assert_eq!(chat.parent_span_id, run.span_id, "{chat:#?}");
        assert_eq!(chat.kind, "SPAN_KIND_CLIENT");
        assert_eq!(chat.attribute("gen_ai.operation.name"), "chat");
        assert_eq!(chat.attribute("gen_ai.provider.name"), "openai");
        assert_eq!(chat.attribute("gen_ai.request.model"), "mock-model");
        assert_eq!(chat.attribute("gen_ai.response.model"), "mock-model");
        assert_eq!(chat.attribute("gen_ai.response.id"), &response["id"]);
        assert_eq!(chat.attribute("gateway.deployment"), "mock");
        assert!(
            chat.attribute("gen_ai.usage.input_tokens").as_i64() > Some(0),
            "{chat:#?}"
        );
        assert!(
            chat.attribute("gen_ai.usage.output_tokens").as_i64() > Some(0),
            "{chat:#?}"
        );
        assert!(
            !chat.attributes.contains_key("gen_ai.input.messages"),
            "no content unless asked: {chat:#?}"
        );
    }
    let finishes: Vec<&Value> = chats
        .iter()
        .map(|c| c.attribute("gen_ai.response.finish_reasons"))
        .collect();
    assert!(finishes.contains(&&json!(["tool_calls"])), "{finishes:?}");
    assert!(finishes.contains(&&json!(["stop"])), "{finishes:?}");

    let tool = named(&spans, "execute_tool add")[0];
    assert_eq!(tool.parent_span_id, run.span_id);
    assert_eq!(tool.attribute("gen_ai.operation.name"), "execute_tool");
    assert_eq!(tool.attribute("gen_ai.tool.name"), "add");
    assert_eq!(tool.attribute("gen_ai.tool.type"), "function");
    assert!(tool
        .attribute("gen_ai.tool.call.id")
        .as_str()
        .is_some_and(|id| !id.is_empty()));
    assert_eq!(tool.attribute("gateway.tool.source"), "add");
    assert_eq!(tool.attribute("gateway.tool.outcome"), "ok");
    assert!(!tool.attributes.contains_key("gen_ai.tool.call.arguments"));

    // The model and the tool were called with the spans of their calls as parents.
    let sent_to_model: Vec<(String, String)> = cluster
        .model
        .request_headers()
        .iter()
        .map(|headers| parts(header(headers, "traceparent").expect("a traceparent to the model")))
        .collect();
    assert_eq!(sent_to_model.len(), 2);
    for (sent, chat) in sent_to_model.iter().zip(&chats) {
        assert_eq!(sent.0, CLIENT_TRACE);
        assert!(
            chats.iter().any(|c| c.span_id == sent.1),
            "{sent:?} names no chat span ({chat:#?})"
        );
    }
    let tool_calls = cluster.tools.calls();
    let to_tool = tool_calls
        .iter()
        .find(|c| c.tool == "add")
        .expect("the add call");
    let (trace, parent) = parts(
        to_tool
            .header("traceparent")
            .expect("a traceparent to the tool"),
    );
    assert_eq!(
        (trace.as_str(), parent.as_str()),
        (CLIENT_TRACE, tool.span_id.as_str())
    );
}

#[tokio::test]
async fn a_response_taken_over_after_a_kill_continues_its_trace_on_the_other_replica() {
    let receiver = OtlpReceiver::start().await.expect("receiver");
    let mut cluster = Cluster::postgres().await;
    let mut first = traced(&cluster, &receiver, &[]);
    cluster.configure(&first).await;
    let id = cluster.background_gate_call(&first).await;
    cluster.gate_calls(1).await;
    // The request's span ended with its answer: it is exported while the run goes on.
    let created = receiver
        .wait_until(PATIENCE, |spans| {
            spans.iter().any(|s| s.name == "POST /v1/responses")
        })
        .await
        .expect("the create's span");
    let request = created
        .into_iter()
        .find(|s| s.name == "POST /v1/responses")
        .expect("span");

    first.kill();
    let second = traced(&cluster, &receiver, &[]);
    cluster.gate_calls(2).await;
    cluster.tools.open_gate();
    let ended = cluster.ended(&second, &id).await;
    assert_eq!(ended["status"], "completed", "{ended:#}");

    let spans = spans_of(&receiver, &request.trace_id, |spans| {
        spans.iter().any(|s| {
            s.name == "invoke_agent gateway"
                && s.attribute("gateway.run.origin") == "resumed"
                && s.attribute("gateway.response.status") == "completed"
        }) && count(spans, "execute_tool gate") >= 1
            && count(spans, "chat mock-model") >= 1
    })
    .await;
    let resumed = spans
        .iter()
        .find(|s| {
            s.name == "invoke_agent gateway" && s.attribute("gateway.run.origin") == "resumed"
        })
        .expect("the resumed run");
    assert_eq!(
        resumed.parent_span_id, request.span_id,
        "the resumed run hangs under the request that created the response"
    );
    assert_eq!(resumed.attribute("gen_ai.response.id"), id.as_str());
    let gate = named(&spans, "execute_tool gate");
    assert!(
        gate.iter()
            .any(|g| g.parent_span_id == resumed.span_id
                && g.attribute("gateway.tool.outcome") == "ok"),
        "the gate call sent again is the resumed run's child: {gate:#?}"
    );
    let calls = cluster.gate_calls(2).await;
    let (trace, _) = parts(calls[1].header("traceparent").expect("traceparent"));
    assert_eq!(
        trace, request.trace_id,
        "the call sent again carries the same trace"
    );
}

#[tokio::test]
async fn content_goes_on_spans_only_when_asked_and_sampling_keeps_a_clients_decision() {
    let receiver = OtlpReceiver::start().await.expect("receiver");
    let mut cluster = Cluster::sqlite().await;
    let replica = traced(
        &cluster,
        &receiver,
        &[
            ("GATEWAY__TELEMETRY__CAPTURE_CONTENT", "true"),
            ("GATEWAY__TELEMETRY__SAMPLING_RATIO", "0"),
        ],
    );
    cluster.configure(&replica).await;

    // A new trace is kept with probability 0: this one is not exported.
    let unsampled = create(
        &cluster,
        &replica,
        json!({"model": "mock", "input": "not kept"}),
        None,
    )
    .await;
    assert_eq!(unsampled["status"], "completed", "{unsampled:#}");
    // A client's sampled trace is followed whatever the ratio.
    let traceparent = format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}-01");
    let kept = create(
        &cluster,
        &replica,
        json!({"model": "mock", "input": "!call add {\"a\": 2, \"b\": 3}"}),
        Some(&traceparent),
    )
    .await;
    assert_eq!(kept["status"], "completed", "{kept:#}");

    let spans = spans_of(&receiver, CLIENT_TRACE, |spans| {
        count(spans, "chat mock-model") == 2 && count(spans, "execute_tool add") == 1
    })
    .await;
    let chat = named(&spans, "chat mock-model")
        .into_iter()
        .find(|c| c.attribute("gen_ai.response.finish_reasons") == &json!(["tool_calls"]))
        .expect("the first model call");
    let messages = chat
        .attribute("gen_ai.input.messages")
        .as_str()
        .unwrap_or_default();
    assert!(
        messages.contains("!call add"),
        "the prompt is on the span: {chat:#?}"
    );
    let tool = named(&spans, "execute_tool add")[0];
    assert!(
        tool.attribute("gen_ai.tool.call.arguments")
            .as_str()
            .is_some_and(|a| a.contains("\"a\"")),
        "{tool:#?}"
    );
    assert_eq!(tool.attribute("gen_ai.tool.call.result"), "{\"sum\":5}");
    // Spans are exported in the order they end: the unsampled response's would have come first.
    let others: Vec<ReceivedSpan> = receiver
        .spans()
        .into_iter()
        .filter(|s| s.trace_id != CLIENT_TRACE)
        .collect();
    assert!(
        others.is_empty(),
        "only the sampled trace is exported: {others:#?}"
    );
    // Its trace context still went on, marked not sampled.
    let first_call = &cluster.model.request_headers()[0];
    let sent = header(first_call, "traceparent").expect("traceparent");
    assert!(sent.ends_with("-00"), "{sent}");
}

#[tokio::test]
async fn with_traces_off_no_trace_context_is_sent_to_models_or_tools() {
    let mut cluster = Cluster::postgres().await;
    let replica = cluster.replica(&[]);
    cluster.configure(&replica).await;
    let traceparent = format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}-01");
    let response = create(
        &cluster,
        &replica,
        json!({"model": "mock", "input": "!call add {\"a\": 2, \"b\": 3}"}),
        Some(&traceparent),
    )
    .await;
    assert_eq!(response["status"], "completed", "{response:#}");

    for headers in cluster.model.request_headers() {
        assert_eq!(header(&headers, "traceparent"), None, "{headers:?}");
    }
    for call in cluster.tools.calls() {
        assert_eq!(call.header("traceparent"), None, "{:?}", call.headers);
    }
}

#[tokio::test]
async fn an_mcp_server_gets_the_tool_calls_trace_context_in_the_calls_meta() {
    let receiver = OtlpReceiver::start().await.expect("receiver");
    let mcp = gateway_testkit::McpServer::start()
        .await
        .expect("mcp server");
    let mut cluster = Cluster::postgres().await;
    let replica = traced(&cluster, &receiver, &[]);
    cluster.configure(&replica).await;
    cluster
        .attach_tool_source(
            &replica,
            json!({"kind": "mcp", "name": "calc", "url": mcp.url(), "name_prefix": "calc_"}),
        )
        .await;

    let traceparent = format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}-01");
    let response = create(
        &cluster,
        &replica,
        json!({"model": "mock", "input": "!call calc_add {\"a\": 2, \"b\": 3}"}),
        Some(&traceparent),
    )
    .await;
    assert_eq!(response["status"], "completed", "{response:#}");

    let spans = spans_of(&receiver, CLIENT_TRACE, |spans| {
        count(spans, "execute_tool calc_add") == 1
    })
    .await;
    let tool = named(&spans, "execute_tool calc_add")[0];
    assert_eq!(tool.attribute("gateway.tool.source"), "calc");
    let metas = mcp.call_metas();
    assert_eq!(metas.len(), 1, "{metas:?}");
    let sent = metas[0]["traceparent"].as_str().expect("_meta.traceparent");
    assert_eq!(parts(sent), (CLIENT_TRACE.to_owned(), tool.span_id.clone()));
    assert!(metas[0]["idempotencyKey"].is_string(), "{metas:?}");
}
