//! Logging set-up and the per-request span (with a request id) that every log line of a request carries.

use axum::http::Request;
use tower_http::trace::TraceLayer;
use tracing_subscriber::EnvFilter;

use crate::config::LogConfig;

/// Installs the global subscriber: pretty or JSON lines, filtered by the config.
pub fn init(config: &LogConfig) {
    let filter = EnvFilter::try_new(&config.filter).unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    let _ = if config.format == "json" {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
}

/// A span per request with its method, path and a fresh request id; bodies and headers are never logged.
pub fn request_span_layer() -> TraceLayer<
    tower_http::classify::SharedClassifier<tower_http::classify::ServerErrorsAsFailures>,
    impl Fn(&Request<axum::body::Body>) -> tracing::Span + Clone,
> {
    TraceLayer::new_for_http().make_span_with(|request: &Request<axum::body::Body>| {
        tracing::info_span!(
            "request",
            request.id = %uuid::Uuid::new_v4().simple(),
            http.method = %request.method(),
            http.path = %request.uri().path(),
        )
    })
}
