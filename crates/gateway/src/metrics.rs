//! Prometheus metrics: the recorder, the `/metrics` answer, and the HTTP request middleware.
//!
//! Names (all prefixed `gateway_`): `http_requests_total{route,method,status}`,
//! `http_request_duration_seconds{route}`, `upstream_calls_total{deployment,outcome}`,
//! `upstream_call_duration_seconds{deployment}`, `upstream_fallbacks_total{deployment,fallback}`,
//! `tool_calls_total{tool,source,outcome}`,
//! `tool_call_duration_seconds{tool,source}`, `tool_breaker_open{tool}`, `tool_calls_waiting{tool}`, `loop_model_calls{status}` (model calls per response),
//! `responses_total{status}`, `active_streams`, `store_duration_seconds{op}`, `responses_refused_total{reason}`,
//! `responses_resumed_total{reason}`, `leases_taken_over_total`, `queue_depth`, `queue_oldest_age_seconds`,
//! `webhook_tries_total{outcome}`.

use foldhash::HashMap;
use std::borrow::Borrow;
use std::hash::Hash;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use axum::extract::{MatchedPath, Request};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();

/// Installs the process-wide recorder once (several gateways in one test process share it).
pub fn install() -> Option<PrometheusHandle> {
    HANDLE
        .get_or_init(|| {
            let buckets = [
                0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                10.0, 30.0,
            ];
            let builder = PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &buckets)
                .and_then(|b| {
                    b.set_buckets_for_metric(
                        Matcher::Full("gateway_loop_model_calls".into()),
                        &[1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0],
                    )
                });
            match builder.and_then(|b| b.install_recorder()) {
                Ok(handle) => Some(handle),
                Err(e) => {
                    tracing::warn!(error = %e, "metrics recorder not installed");
                    None
                }
            }
        })
        .clone()
}

/// How often the recorder's histograms fold the samples recorded since into their buckets.
const UPKEEP_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// Installs the recorder (once), and its upkeep (once per process): every histogram keeps each sample recorded
/// until it is folded into its buckets, which only a scrape of `/metrics` or this does. Without it, a gateway
/// whose metrics nobody scrapes grew by every request's samples for good (about 60 bytes a request).
pub fn install_with_upkeep() {
    static UPKEEP: OnceLock<()> = OnceLock::new();
    let Some(handle) = install() else {
        return;
    };
    UPKEEP.get_or_init(|| {
        // A thread of its own, for the process's life: not tied to a runtime that may end (a test's), and never
        // on a request's worker.
        let spawned = std::thread::Builder::new()
            .name("metrics-upkeep".into())
            .spawn(move || loop {
                std::thread::sleep(UPKEEP_EVERY);
                handle.run_upkeep();
            });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "could not start the metrics upkeep; histograms grow until /metrics is read");
        }
    });
}

/// `GET /metrics`, in Prometheus' text format.
pub async fn render() -> Response {
    let body = install().map(|h| h.render()).unwrap_or_default();
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], body).into_response()
}

/// Counts every request and times it, labelled by its route pattern (never the raw path, which holds ids), and
/// names the request's span by that pattern.
pub async fn track_requests(request: Request, next: Next) -> Response {
    let route = request.extensions().get::<MatchedPath>().cloned();
    let method = request.method().clone();
    if let Some(route) = &route {
        crate::telemetry::name_request_span(&method, route.as_str());
    }
    let started = Instant::now();
    let response = next.run(request).await;
    let route = route.as_ref().map_or("unmatched", MatchedPath::as_str);
    let status = response.status().as_u16();
    let handles = REQUEST_HANDLES.get(route, &(method, status), |(method, status)| {
        RequestHandles {
            count: metrics::counter!("gateway_http_requests_total", "route" => route.to_owned(), "method" => method.as_str().to_owned(), "status" => status.to_string()),
            duration: metrics::histogram!("gateway_http_request_duration_seconds", "route" => route.to_owned()),
        }
    });
    handles.count.increment(1);
    handles.duration.record(started.elapsed().as_secs_f64());
    response
}

/// The metrics of the requests of one route, method and status.
struct RequestHandles {
    count: metrics::Counter,
    duration: metrics::Histogram,
}

static REQUEST_HANDLES: HandleBook<(axum::http::Method, u16), RequestHandles> = HandleBook::new();

/// The metrics of one deployment's model calls, by outcome.
struct UpstreamHandles {
    count: metrics::Counter,
    duration: metrics::Histogram,
}

static UPSTREAM_HANDLES: HandleBook<bool, UpstreamHandles> = HandleBook::new();

/// One upstream model call ended (after the adapter's retries).
pub fn upstream_call(deployment: &str, started: Instant, ok: bool) {
    let handles = UPSTREAM_HANDLES.get(deployment, &ok, |ok| {
        let outcome = if *ok { "ok" } else { "error" };
        UpstreamHandles {
            count: metrics::counter!("gateway_upstream_calls_total", "deployment" => deployment.to_owned(), "outcome" => outcome),
            duration: metrics::histogram!("gateway_upstream_call_duration_seconds", "deployment" => deployment.to_owned()),
        }
    });
    handles.count.increment(1);
    handles.duration.record(started.elapsed().as_secs_f64());
}

/// Metric handles by two of their labels, made once and then looked up without building labels: the registry's
/// own lookup builds every label (allocating) and hashes them all on each use, which with several metrics per
/// request took a fiftieth of an unstored create's CPU.
struct HandleBook<K, V>(Mutex<Option<BookPages<K, V>>>);

/// A book's handles, by the first label, then the second.
type BookPages<K, V> = HashMap<String, HashMap<K, Arc<V>>>;

/// Handles a book keeps at the most; past it the book starts again.
const MAX_BOOK_HANDLES: usize = 10_000;

impl<K: Hash + Eq, V> HandleBook<K, V> {
    const fn new() -> Self {
        HandleBook(Mutex::new(None))
    }

    /// The handles under `outer` and `inner`, made by `make` the first time.
    fn get<Q>(&self, outer: &str, inner: &Q, make: impl FnOnce(&Q) -> V) -> Arc<V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        // Handles made before the recorder is installed would count nowhere: only keep those made after.
        if !matches!(HANDLE.get(), Some(Some(_))) {
            return Arc::new(make(inner));
        }
        let mut book = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let book = book.get_or_insert_with(HashMap::default);
        if let Some(handles) = book.get(outer).and_then(|inners| inners.get(inner)) {
            return Arc::clone(handles);
        }
        if book.values().map(HashMap::len).sum::<usize>() >= MAX_BOOK_HANDLES {
            book.clear();
        }
        let handles = Arc::new(make(inner));
        book.entry(outer.to_owned())
            .or_default()
            .insert(inner.to_owned(), Arc::clone(&handles));
        handles
    }
}

/// A model call's usage and cost (SPEC 13): `gateway_tokens_total` by project, deployment and kind, and
/// `gateway_cost_usd_total` by project and deployment (a gauge that only grows: Prometheus counters of this
/// exporter count whole numbers).
pub fn model_usage(project: &str, deployment: &str, usage: &gateway_core::steps::Usage, cost: f64) {
    let handles = usage_handles(project, deployment);
    for (counter, tokens) in handles.tokens.iter().zip([
        usage.input_tokens,
        usage.cached_tokens,
        usage.output_tokens,
        usage.reasoning_tokens,
    ]) {
        counter.increment(tokens);
    }
    handles.cost.increment(cost);
}

/// The usage metrics of one project and deployment.
struct UsageHandles {
    /// `gateway_tokens_total` of kind input, cached_input, output, reasoning.
    tokens: [metrics::Counter; 4],
    cost: metrics::Gauge,
}

static USAGE_HANDLES: HandleBook<String, UsageHandles> = HandleBook::new();

fn usage_handles(project: &str, deployment: &str) -> Arc<UsageHandles> {
    USAGE_HANDLES.get(project, deployment, |deployment| {
        let kind = |kind: &'static str| metrics::counter!("gateway_tokens_total", "project" => project.to_owned(), "deployment" => deployment.to_owned(), "kind" => kind);
        UsageHandles {
            tokens: [
                kind("input"),
                kind("cached_input"),
                kind("output"),
                kind("reasoning"),
            ],
            cost: metrics::gauge!("gateway_cost_usd_total", "project" => project.to_owned(), "deployment" => deployment.to_owned()),
        }
    })
}

/// One try of a webhook delivery ended (`delivered`, `failed`, `given_up`, `not_yet`, `superseded`).
pub fn webhook_try(outcome: &'static str) {
    metrics::counter!("gateway_webhook_tries_total", "outcome" => outcome).increment(1);
}

/// A response ended with `status` after these steps.
pub fn response_finished(status: &'static str, steps: &[gateway_core::Step]) {
    let handles = FINISHED_HANDLES.get(status, &(), |()| FinishedHandles {
        count: metrics::counter!("gateway_responses_total", "status" => status),
        model_calls: metrics::histogram!("gateway_loop_model_calls", "status" => status),
    });
    handles.count.increment(1);
    let model_calls = steps.iter().filter(|s| s.model().is_some()).count();
    handles.model_calls.record(model_calls as f64);
}

/// The metrics of the responses that ended with one status.
struct FinishedHandles {
    count: metrics::Counter,
    model_calls: metrics::Histogram,
}

static FINISHED_HANDLES: HandleBook<(), FinishedHandles> = HandleBook::new();

/// A replica took a response to run: a queued background one, or one it took over from a replica that stopped
/// beating (or a process before it).
pub fn response_resumed(queued: bool, taken_over: bool) {
    let reason = if queued { "queued" } else { "resumed" };
    metrics::counter!("gateway_responses_resumed_total", "reason" => reason).increment(1);
    if taken_over {
        metrics::counter!("gateway_leases_taken_over_total").increment(1);
    }
}

/// A background duty (`duty::spawn`) panicked and was started again.
pub fn duty_restarted(duty: &'static str) {
    metrics::counter!("gateway_duty_restarts_total", "duty" => duty).increment(1);
}

/// What the allocator holds: in live allocations, and resident (what the process's memory is made of).
pub fn memory(allocated: usize, resident: usize) {
    metrics::gauge!("gateway_memory_allocated_bytes").set(allocated as f64);
    metrics::gauge!("gateway_memory_resident_bytes").set(resident as f64);
}

/// How many background responses wait for a replica, and for how long the oldest has (seconds; 0 when none).
pub fn queue_depth(depth: crate::store::ownership::QueueDepth, now: i64) {
    metrics::gauge!("gateway_queue_depth").set(depth.queued as f64);
    let age = depth
        .oldest_created_at
        .map_or(0, |created| (now - created).max(0));
    metrics::gauge!("gateway_queue_oldest_age_seconds").set(age as f64);
}

/// A create was refused before any work (`reason`: `overloaded`, `shutting_down`).
pub fn response_refused(reason: &'static str) {
    metrics::counter!("gateway_responses_refused_total", "reason" => reason).increment(1);
}

static STORE_HANDLES: HandleBook<(), metrics::Histogram> = HandleBook::new();

/// Counts an open response stream for as long as this guard lives.
pub struct ActiveStream;

impl ActiveStream {
    pub fn open() -> ActiveStream {
        metrics::gauge!("gateway_active_streams").increment(1.0);
        ActiveStream
    }
}

impl Drop for ActiveStream {
    fn drop(&mut self) {
        metrics::gauge!("gateway_active_streams").decrement(1.0);
    }
}

/// Times the store's operations (`store_duration_seconds{op}`): the store reports them through the
/// `StoreObserver` it was given, and never imports this module.
#[derive(Debug, Clone, Copy, Default)]
pub struct StoreMetrics;

impl crate::store::StoreObserver for StoreMetrics {
    fn statement(&self, name: &'static str, elapsed: std::time::Duration) {
        STORE_HANDLES
            .get(
                name,
                &(),
                |()| metrics::histogram!("gateway_store_duration_seconds", "op" => name),
            )
            .record(elapsed.as_secs_f64());
    }

    fn batch(&self, writes: usize) {
        metrics::histogram!("gateway_store_batch_writes").record(writes as f64);
    }

    fn duty_restarted(&self, duty: &'static str) {
        duty_restarted(duty);
    }
}

/// A server tool call in flight when its response was cancelled (`outcome="cancelled"`).
pub fn tool_call_cancelled(tool: String, source: String) {
    metrics::counter!("gateway_tool_calls_total", "tool" => tool, "source" => source, "outcome" => "cancelled")
        .increment(1);
}

/// A model call that `deployment` failed, tried again on its fallback `fallback`.
pub fn fallback_tried(deployment: &str, fallback: &str) {
    metrics::counter!(
        "gateway_upstream_fallbacks_total",
        "deployment" => deployment.to_owned(),
        "fallback" => fallback.to_owned()
    )
    .increment(1);
}
