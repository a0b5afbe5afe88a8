//! Logging and traces: the global subscriber (log lines, and OpenTelemetry spans over OTLP when configured,
//! SPEC 14), the per-request span with its request id, and the W3C trace context taken in and sent on.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::OnceLock;
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderMap, HeaderName, Method, Request};
use gateway_core::output::{push_json_string, push_json_string_contents};
use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::{TraceContextExt as _, TracerProvider as _};
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, Sampler, SdkTracerProvider,
};
use opentelemetry_sdk::Resource;
use secrecy::ExposeSecret;
use tower::Service;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::field::RecordFields;
use tracing_subscriber::filter::{filter_fn, EnvFilter};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FormatFields, FormattedFields};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::Layer;

use crate::config::{LogConfig, TelemetryConfig};

/// Set once traces are exported: what the spans may hold.
static TRACES: OnceLock<TraceSettings> = OnceLock::new();

struct TraceSettings {
    capture_content: bool,
}

/// Whether spans are exported: without it no span of a model or tool call is made and no `traceparent` sent.
pub fn traces_on() -> bool {
    TRACES.get().is_some()
}

/// Whether prompts, outputs and tool arguments and results go on spans (`telemetry.capture_content`).
pub fn capture_content() -> bool {
    TRACES.get().is_some_and(|t| t.capture_content)
}

/// Holds the span exporter; [`Telemetry::shutdown`] exports the spans still waiting.
#[must_use = "spans still waiting are exported by `shutdown`"]
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Telemetry {
    /// Exports the spans still waiting (bounded by the exporter's timeout) and stops the exporter.
    pub fn shutdown(self) {
        if let Some(provider) = self.provider {
            // The batch processor's thread does the export; this waits for it, off any async worker.
            let stopped = std::thread::spawn(move || provider.shutdown()).join();
            if !matches!(stopped, Ok(Ok(()))) {
                eprintln!("could not export the last spans");
            }
        }
    }
}

/// Installs the global subscriber: pretty or JSON lines, filtered by `RUST_LOG` when it is set (the variable
/// every Rust service honours), else by the config's `log.filter` (`GATEWAY__LOG__FILTER`); and, when
/// `telemetry.otlp_endpoint` is set, the gateway's spans exported over OTLP/HTTP, whatever the log filter.
pub fn init(log: &LogConfig, telemetry: &TelemetryConfig) -> anyhow::Result<Telemetry> {
    let directives = std::env::var("RUST_LOG")
        .ok()
        .filter(|v| !v.trim().is_empty())
        .unwrap_or_else(|| log.filter.clone());
    let filter = log_filter(&directives).unwrap_or_else(|e| {
        eprintln!("invalid log filter '{directives}' ({e}); logging at info");
        log_filter("info").unwrap_or_else(|_| EnvFilter::new("info"))
    });
    // Concrete layers (no boxing): per-layer filters only work when the subscriber can see them. Without traces
    // the log filter is the subscriber's own: spans and events it turns away are never made, and those it lets
    // through skip the per-layer filters' bookkeeping (a few percent of an unstored request's CPU). With traces,
    // the exporter sees the gateway's spans whatever the log filter says, so the filter is the log lines' own.
    let json = log.format == "json";
    let per_layer = telemetry.otlp_endpoint.is_some();
    let global = (!per_layer).then(|| filter.clone());
    // (Each layer is made where it is used: its type names the layers under it.)
    let json_lines = (json && !per_layer).then(|| {
        tracing_subscriber::fmt::layer()
            .json()
            .fmt_fields(SpanFieldsAsJson)
    });
    let filtered_json_lines = (json && per_layer).then(|| {
        tracing_subscriber::fmt::layer()
            .json()
            .fmt_fields(SpanFieldsAsJson)
            .with_filter(filter.clone())
    });
    // Colours only for a terminal: a redirected file gets plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stdout());
    let pretty_lines =
        (!json && !per_layer).then(|| tracing_subscriber::fmt::layer().with_ansi(ansi));
    let filtered_pretty_lines = (!json && per_layer).then(|| {
        tracing_subscriber::fmt::layer()
            .with_ansi(ansi)
            .with_filter(filter)
    });
    let (spans, provider) = match &telemetry.otlp_endpoint {
        Some(endpoint) => {
            let provider = tracer_provider(endpoint, telemetry)?;
            let tracer = provider.tracer("gateway");
            // Only the gateway's own spans are exported; log events stay log lines.
            let layer = tracing_opentelemetry::layer()
                .with_tracer(tracer)
                .with_location(false)
                .with_threads(false)
                .with_tracked_inactivity(false)
                .with_target(false)
                .with_filter(filter_fn(|meta| {
                    meta.is_span() && meta.target().starts_with("gateway")
                }));
            (Some(layer), Some(provider))
        }
        None => (None, None),
    };
    let installed = tracing_subscriber::registry()
        .with(global)
        .with(json_lines)
        .with(filtered_json_lines)
        .with(pretty_lines)
        .with(filtered_pretty_lines)
        .with(spans)
        .try_init();
    if installed.is_ok() && provider.is_some() {
        let _ = TRACES.set(TraceSettings {
            capture_content: telemetry.capture_content,
        });
    }
    Ok(Telemetry { provider })
}

/// The JSON log lines' span fields, kept as the text of a JSON object: written once when a span opens, with a
/// field recorded later (a request's `response.id`) appended to the object's text. tracing-subscriber's own
/// `JsonFields` parses the whole object and writes it again on every record, which cost every request a few
/// percent of its CPU. Log lines read them as before.
struct SpanFieldsAsJson;

impl<'writer> FormatFields<'writer> for SpanFieldsAsJson {
    fn format_fields<R: RecordFields>(
        &self,
        mut writer: Writer<'writer>,
        fields: R,
    ) -> std::fmt::Result {
        // The whole object in one buffer of the size a request's span takes, handed on in one piece: the text
        // the writer holds grows once.
        let mut object = JsonMembers(Vec::with_capacity(256));
        object.0.push(b'{');
        fields.record(&mut object);
        object.0.push(b'}');
        writer.write_str(object.text())
    }

    fn add_fields(
        &self,
        current: &'writer mut FormattedFields<Self>,
        fields: &tracing::span::Record<'_>,
    ) -> std::fmt::Result {
        let mut members = JsonMembers(Vec::with_capacity(64));
        fields.record(&mut members);
        if members.0.is_empty() {
            return Ok(());
        }
        let text = &mut current.fields;
        match text.pop() {
            Some('}') if text.len() > 1 => text.push(','),
            Some('}') => {}
            // Not an object of ours (nothing was written yet): start one.
            _ => {
                text.clear();
                text.push('{');
            }
        }
        text.push_str(members.text());
        text.push('}');
        Ok(())
    }
}

/// Fields as the members of a JSON object (`"name":value,…`), after an opening `{` when it holds one, as
/// `JsonFields` would write them: numbers and booleans as such, anything else as a string (its `Debug`, which for
/// `%value` fields is its `Display`). Each member is written straight into the one buffer, strings copied as they
/// are unless they need escaping (a `Debug` value escaped as it is formatted): every request's span opens with
/// three such fields, and serde_json's writer, escaping byte by byte into a growing buffer, made them a few
/// percent of a request's CPU.
struct JsonMembers(Vec<u8>);

impl JsonMembers {
    /// Starts the member `name`: a comma after any member before it, the name, the colon.
    fn name(&mut self, field: &tracing::field::Field) {
        let name = field.name();
        let name = name.strip_prefix("r#").unwrap_or(name);
        if !matches!(self.0.last(), None | Some(b'{')) {
            self.0.push(b',');
        }
        push_json_string(&mut self.0, name);
        self.0.push(b':');
    }

    /// Appends `"name":value`; a value that fails to serialise leaves nothing behind.
    fn member(&mut self, field: &tracing::field::Field, value: impl serde::Serialize) {
        let start = self.0.len();
        self.name(field);
        if serde_json::to_writer(&mut self.0, &value).is_err() {
            self.0.truncate(start);
        }
    }

    /// The text written (only ever UTF-8: names and strings are copied or escaped whole).
    fn text(&self) -> &str {
        std::str::from_utf8(&self.0).unwrap_or_default()
    }
}

/// A string being formatted into a JSON text, escaped piece by piece.
struct EscapedInto<'a>(&'a mut Vec<u8>);

impl std::fmt::Write for EscapedInto<'_> {
    fn write_str(&mut self, piece: &str) -> std::fmt::Result {
        push_json_string_contents(self.0, piece);
        Ok(())
    }
}

impl tracing::field::Visit for JsonMembers {
    fn record_f64(&mut self, field: &tracing::field::Field, value: f64) {
        self.member(field, value);
    }

    fn record_i64(&mut self, field: &tracing::field::Field, value: i64) {
        self.member(field, value);
    }

    fn record_u64(&mut self, field: &tracing::field::Field, value: u64) {
        self.member(field, value);
    }

    fn record_bool(&mut self, field: &tracing::field::Field, value: bool) {
        self.member(field, value);
    }

    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.name(field);
        push_json_string(&mut self.0, value);
    }

    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        let start = self.0.len();
        self.name(field);
        self.0.push(b'"');
        if std::fmt::Write::write_fmt(&mut EscapedInto(&mut self.0), format_args!("{value:?}"))
            .is_err()
        {
            self.0.truncate(start);
            return;
        }
        self.0.push(b'"');
    }
}

/// The exporter: batches of spans to `{endpoint}/v1/traces`, sampled by ratio unless the parent decided.
fn tracer_provider(
    endpoint: &str,
    telemetry: &TelemetryConfig,
) -> anyhow::Result<SdkTracerProvider> {
    let headers: HashMap<String, String> = telemetry
        .otlp_headers
        .iter()
        .map(|(name, value)| (name.clone(), value.expose_secret().to_owned()))
        .collect();
    // The blocking client runs a runtime of its own: it is made (and dropped) off the async workers.
    let client = std::thread::spawn(crate::tools::remote::blocking_http_client)
        .join()
        .map_err(|_| anyhow::anyhow!("could not build the OTLP client"))??;
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_http_client(client)
        .with_endpoint(format!("{}/v1/traces", endpoint.trim_end_matches('/')))
        .with_headers(headers)
        .with_timeout(Duration::from_secs(10))
        .build()?;
    let batches = BatchConfigBuilder::default()
        .with_scheduled_delay(Duration::from_millis(telemetry.export_delay_ms))
        .build();
    let processor = BatchSpanProcessor::builder(exporter)
        .with_batch_config(batches)
        .build();
    let resource = Resource::builder()
        .with_service_name(telemetry.service_name.clone())
        .with_attribute(opentelemetry::KeyValue::new(
            "service.version",
            env!("CARGO_PKG_VERSION"),
        ))
        .build();
    Ok(SdkTracerProvider::builder()
        .with_span_processor(processor)
        .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
            telemetry.sampling_ratio,
        ))))
        .with_resource(resource)
        .build())
}

/// The filter of `directives`, with libraries' chatter lowered and rmcp's transport worker silenced: it logs its fatal errors with the whole URL
/// of the MCP server, whose path and query may hold a token (SPEC 12). The gateway logs each such failure itself,
/// with the URL cut to `scheme://host[:port]`.
pub fn log_filter(directives: &str) -> Result<EnvFilter, tracing_subscriber::filter::ParseError> {
    // Libraries' chatter stays below `info` unless asked for by name: rmcp's peer dumps, and the notices Postgres
    // sends back (`relation "_sqlx_migrations" already exists, skipping` on every start). A directive of the
    // operator's for the same target comes later and wins.
    let quiet = format!("rmcp=warn,sqlx::postgres::notice=warn,{directives}");
    Ok(EnvFilter::try_new(quiet)?.add_directive("rmcp::transport::worker=off".parse()?))
}

/// Gives every request an `x-request-id` (the client's, or a new UUID), returns it in the answer, and opens a
/// span carrying it, with the method and path; bodies and headers are never logged. With traces on, the span is
/// the request's server span, a child of the client's `traceparent` when it sent one, named by its route once
/// the router matched one ([`name_request_span`]).
///
/// Wrapped around the whole service rather than added to the `Router`: a router's layer is applied to every route,
/// each boxed again, so each of them cost a box for the service and one for its future on every request. One
/// service of the gateway's own, where tower-http's three (set the id, copy it to the answer, trace) wrapped the
/// request's future three times and its answer's body once more, in a box.
pub fn with_request_ids<S>(service: S) -> RequestIds<S>
where
    S: Service<Request<Body>, Response = axum::response::Response, Error = Infallible> + Clone,
    S::Future: Unpin,
{
    RequestIds { inner: service }
}

/// The `x-request-id` header.
const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// The service of [`with_request_ids`].
#[derive(Clone)]
pub struct RequestIds<S> {
    inner: S,
}

impl<S> Service<Request<Body>> for RequestIds<S>
where
    S: Service<Request<Body>, Response = axum::response::Response, Error = Infallible>,
    S::Future: Unpin,
{
    type Response = axum::response::Response;
    type Error = Infallible;
    type Future = WithRequestId<S::Future>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        // The client's id when it sent one, as it sent it, else a new one; logged as text, any byte that is not
        // UTF-8 replaced.
        let id = request
            .headers()
            .get(&REQUEST_ID)
            .cloned()
            .unwrap_or_else(new_request_id);
        let span = request_span(&request, &String::from_utf8_lossy(id.as_bytes()));
        let future = span.in_scope(|| self.inner.call(request));
        WithRequestId {
            future,
            span,
            id: Some(id),
        }
    }
}

/// A fresh request id: a random UUID, hyphenated.
fn new_request_id() -> axum::http::HeaderValue {
    let mut text = uuid::Uuid::encode_buffer();
    let text = uuid::Uuid::new_v4().hyphenated().encode_lower(&mut text);
    axum::http::HeaderValue::from_str(text)
        .unwrap_or_else(|_| axum::http::HeaderValue::from_static("unknown"))
}

/// The span of one request: its id, method and path, and (recorded later) the response it made; with traces on,
/// the server span of its trace.
fn request_span(request: &Request<Body>, id: &str) -> tracing::Span {
    let span = tracing::info_span!(
        "request",
        request.id = %id,
        http.method = %request.method(),
        http.path = %request.uri().path(),
        response.id = tracing::field::Empty,
        otel.name = tracing::field::Empty,
        otel.kind = tracing::field::Empty,
        http.route = tracing::field::Empty,
        http.response.status_code = tracing::field::Empty,
    );
    if traces_on() {
        // Named by the path until the router names it by the route it matched.
        let path = request.uri().path();
        span.record("otel.name", format!("{} {path}", request.method()));
        span.record("otel.kind", "server");
        span.record("http.route", path);
        let _ = span.set_parent(context_of(request.headers()));
    }
    span
}

/// A request's answer on its way, polled within its span, and given the request's id when it comes.
pub struct WithRequestId<F> {
    future: F,
    span: tracing::Span,
    id: Option<axum::http::HeaderValue>,
}

impl<F> std::future::Future for WithRequestId<F>
where
    F: std::future::Future<Output = Result<axum::response::Response, Infallible>> + Unpin,
{
    type Output = Result<axum::response::Response, Infallible>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        let this = &mut *self;
        let answered = {
            let _entered = this.span.enter();
            std::pin::Pin::new(&mut this.future).poll(cx)
        };
        let std::task::Poll::Ready(Ok(mut response)) = answered else {
            return answered;
        };
        if traces_on() {
            this.span.record(
                "http.response.status_code",
                i64::from(response.status().as_u16()),
            );
            // The server span ends with the answer's body (a stream's last event), as tower-http's did.
            let span = this.span.clone();
            response = response.map(|body| Body::new(SpanUntilEnd { body, _span: span }));
        }
        if let Some(id) = this.id.take() {
            response.headers_mut().insert(REQUEST_ID, id);
        }
        std::task::Poll::Ready(Ok(response))
    }
}

/// An answer's body that keeps its request's span open until it is read to its end (or dropped).
struct SpanUntilEnd {
    body: Body,
    _span: tracing::Span,
}

impl axum::body::HttpBody for SpanUntilEnd {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        std::pin::Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}

/// Names the current request's span by the route the router matched (`POST /v1/responses`, not the path with
/// its ids), when traces are exported.
pub fn name_request_span(method: &Method, route: &str) {
    if traces_on() {
        let span = tracing::Span::current();
        span.record("http.route", route);
        // Started when first entered, the span takes a new name only through OpenTelemetry itself: a later
        // `otel.name` is not read.
        span.context()
            .span()
            .update_name(format!("{method} {route}"));
    }
}

/// The trace context a client sent (`traceparent`, `tracestate`).
fn context_of(headers: &HeaderMap) -> opentelemetry::Context {
    TraceContextPropagator::new().extract(&Headers(headers))
}

struct Headers<'a>(&'a HeaderMap);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(HeaderName::as_str).collect()
    }
}

/// The W3C trace context of the current span (`traceparent` and, if any, `tracestate`), when traces are on.
pub fn current_trace_headers() -> Vec<(String, String)> {
    if !traces_on() {
        return Vec::new();
    }
    let mut carrier = HashMap::new();
    TraceContextPropagator::new().inject_context(&tracing::Span::current().context(), &mut carrier);
    carrier.into_iter().collect()
}

/// The `traceparent` of the current span, when traces are on: stored with a response so that whoever resumes
/// it continues its trace.
pub fn current_traceparent() -> Option<String> {
    current_trace_headers()
        .into_iter()
        .find_map(|(name, value)| (name == "traceparent").then_some(value))
}

/// `request` with the current span's trace context in its headers (SPEC 14), when traces are on.
pub fn with_trace_headers(request: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
    let mut headers = HeaderMap::new();
    add_trace_headers(&mut headers);
    if headers.is_empty() {
        return request;
    }
    request.headers(headers)
}

/// Adds the current span's trace context to `headers` (SPEC 14), when traces are on.
pub fn add_trace_headers(headers: &mut HeaderMap) {
    for (name, value) in current_trace_headers() {
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.as_bytes()),
            axum::http::HeaderValue::from_str(&value),
        ) {
            headers.insert(name, value);
        }
    }
}

/// The context a stored `traceparent` names, to parent a resumed run's spans.
pub fn context_from_traceparent(traceparent: &str) -> opentelemetry::Context {
    let carrier = HashMap::from([("traceparent".to_owned(), traceparent.to_owned())]);
    TraceContextPropagator::new().extract(&carrier)
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::SpanFieldsAsJson;

    /// A log destination in memory.
    #[derive(Clone, Default)]
    struct Lines(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Lines {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// A value whose `Debug` fails after writing part of itself.
    struct FailingDebug;

    impl std::fmt::Debug for FailingDebug {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("half \"written")?;
            Err(std::fmt::Error)
        }
    }

    /// The JSON log lines `log` writes, each parsed.
    fn json_log_lines(log: impl FnOnce()) -> Vec<serde_json::Value> {
        let lines = Lines::default();
        let writer = lines.clone();
        let subscriber = tracing_subscriber::fmt()
            .json()
            .fmt_fields(SpanFieldsAsJson)
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, log);
        let text = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
        text.lines()
            .map(|line| serde_json::from_str(line).unwrap())
            .collect()
    }

    #[test]
    fn a_field_that_cannot_be_formatted_is_left_out_and_a_raw_name_loses_its_prefix() {
        let lines = json_log_lines(|| {
            let span = tracing::info_span!(
                "request",
                first = ?FailingDebug,
                r#type = "a\u{1}b",
                last = ?FailingDebug,
            );
            let _entered = span.enter();
            tracing::info!("inside");
        });
        assert_eq!(
            lines[0]["span"],
            serde_json::json!({"name": "request", "type": "a\u{1}b"})
        );
    }

    #[test]
    fn a_field_recorded_after_the_span_opened_is_in_the_json_log_lines_with_the_others() {
        let lines = json_log_lines(|| {
            let span = tracing::info_span!(
                "request",
                request.id = %"req \"1\"",
                attempts = 2_u64,
                kinds = ?["a\tb", "c"],
                response.id = tracing::field::Empty,
                later = tracing::field::Empty,
            );
            let _entered = span.enter();
            tracing::info!("before");
            span.record("response.id", "resp_1");
            span.record("later", true);
            tracing::info!("after");
        });
        assert_eq!(
            lines[0]["span"],
            serde_json::json!({
                "name": "request", "request.id": "req \"1\"", "attempts": 2, "kinds": "[\"a\\tb\", \"c\"]"
            })
        );
        assert_eq!(
            lines[1]["span"],
            serde_json::json!({
                "name": "request", "request.id": "req \"1\"", "attempts": 2, "kinds": "[\"a\\tb\", \"c\"]",
                "response.id": "resp_1", "later": true
            })
        );
    }
}
