//! A test OTLP/HTTP trace receiver: it accepts `POST /v1/traces` (protobuf, as the gateway's exporter sends
//! them), keeps every span it was sent, flattened, and lets a test wait for the spans it expects.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use axum::Router;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use prost::Message;
use serde_json::Value;
use tokio::sync::Notify;

use crate::server::{lock, spawn, ServerGuard};

/// One received span, with ids in lower-case hex (an empty `parent_span_id` for a root).
#[derive(Debug, Clone)]
pub struct ReceivedSpan {
    pub trace_id: String,
    pub span_id: String,
    pub parent_span_id: String,
    pub name: String,
    /// `SPAN_KIND_SERVER`, `SPAN_KIND_CLIENT`, `SPAN_KIND_INTERNAL`...
    pub kind: String,
    /// `STATUS_CODE_UNSET`, `STATUS_CODE_OK` or `STATUS_CODE_ERROR`.
    pub status: String,
    /// The span's attributes: strings, numbers and booleans as JSON values, arrays as JSON arrays.
    pub attributes: BTreeMap<String, Value>,
    /// The `service.name` of the resource that sent it.
    pub service: String,
}

impl ReceivedSpan {
    /// The attribute `key`, or `Null`.
    pub fn attribute(&self, key: &str) -> &Value {
        self.attributes.get(key).unwrap_or(&Value::Null)
    }
}

#[derive(Default)]
struct Received {
    spans: Mutex<Vec<ReceivedSpan>>,
    /// Export requests received, including empty ones.
    exports: Mutex<usize>,
    added: Notify,
}

/// The running receiver; it stops when the last clone is dropped.
#[derive(Clone)]
pub struct OtlpReceiver {
    received: Arc<Received>,
    guard: ServerGuard,
}

impl OtlpReceiver {
    /// Starts the receiver on a free local port.
    pub async fn start() -> anyhow::Result<OtlpReceiver> {
        let received = Arc::new(Received::default());
        let router = Router::new()
            .route("/v1/traces", post(receive))
            .with_state(Arc::clone(&received));
        let addr: SocketAddr = ([127, 0, 0, 1], 0).into();
        let guard = spawn("otlp-receiver", addr, router).await?;
        Ok(OtlpReceiver { received, guard })
    }

    /// The endpoint to configure as `telemetry.otlp_endpoint` (the exporter appends `/v1/traces`).
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.guard.addr())
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<ReceivedSpan> {
        lock(&self.received.spans).clone()
    }

    /// How many export requests arrived.
    pub fn exports(&self) -> usize {
        *lock(&self.received.exports)
    }

    /// Waits (at most `patience`) until the received spans satisfy `done`; answers them, or `None` on timeout.
    pub async fn wait_until(
        &self,
        patience: Duration,
        done: impl Fn(&[ReceivedSpan]) -> bool,
    ) -> Option<Vec<ReceivedSpan>> {
        let waiting = async {
            loop {
                let added = self.received.added.notified();
                let spans = self.spans();
                if done(&spans) {
                    return spans;
                }
                added.await;
            }
        };
        tokio::time::timeout(patience, waiting).await.ok()
    }
}

async fn receive(State(received): State<Arc<Received>>, body: Bytes) -> StatusCode {
    let Ok(request) = ExportTraceServiceRequest::decode(body) else {
        return StatusCode::BAD_REQUEST;
    };
    let mut spans = Vec::new();
    for resource in request.resource_spans {
        let service = resource
            .resource
            .as_ref()
            .and_then(|r| attributes(&r.attributes).remove("service.name"))
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default();
        for scope in resource.scope_spans {
            for span in scope.spans {
                spans.push(ReceivedSpan {
                    trace_id: hex(&span.trace_id),
                    span_id: hex(&span.span_id),
                    parent_span_id: hex(&span.parent_span_id),
                    kind: span.kind().as_str_name().to_owned(),
                    status: span
                        .status
                        .as_ref()
                        .map(|s| s.code().as_str_name().to_owned())
                        .unwrap_or_else(|| "STATUS_CODE_UNSET".to_owned()),
                    attributes: attributes(&span.attributes),
                    name: span.name,
                    service: service.clone(),
                });
            }
        }
    }
    *lock(&received.exports) += 1;
    lock(&received.spans).extend(spans);
    received.added.notify_waiters();
    StatusCode::OK
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn attributes(pairs: &[KeyValue]) -> BTreeMap<String, Value> {
    pairs
        .iter()
        .map(|pair| {
            let value = pair
                .value
                .as_ref()
                .and_then(|v| v.value.as_ref())
                .map(json_of)
                .unwrap_or(Value::Null);
            (pair.key.clone(), value)
        })
        .collect()
}

fn json_of(value: &AnyValue) -> Value {
    match value {
        AnyValue::StringValue(s) => Value::from(s.as_str()),
        AnyValue::BoolValue(b) => Value::from(*b),
        AnyValue::IntValue(i) => Value::from(*i),
        AnyValue::DoubleValue(d) => Value::from(*d),
        AnyValue::ArrayValue(array) => Value::Array(
            array
                .values
                .iter()
                .filter_map(|v| v.value.as_ref().map(json_of))
                .collect(),
        ),
        other => Value::from(format!("{other:?}")),
    }
}
