//! Logging set-up and the per-request span (with a request id) that every log line of a request carries.

use axum::http::{HeaderName, Request};
use axum::Router;
use tower_http::request_id::{
    MakeRequestUuid, PropagateRequestIdLayer, RequestId, SetRequestIdLayer,
};
use tower_http::trace::TraceLayer;
use tracing_subscriber::EnvFilter;

use crate::config::LogConfig;

/// Installs the global subscriber: pretty or JSON lines, filtered by `RUST_LOG` when it is set (the variable
/// every Rust service honours), else by the config's `log.filter` (`GATEWAY__LOG__FILTER`).
pub fn init(config: &LogConfig) {
    let directives = std::env::var("RUST_LOG")
        .ok()
        .filter(|v| !v.trim().is_empty())
        .unwrap_or_else(|| config.filter.clone());
    let filter = log_filter(&directives).unwrap_or_else(|e| {
        eprintln!("invalid log filter '{directives}' ({e}); logging at info");
        log_filter("info").unwrap_or_else(|_| EnvFilter::new("info"))
    });
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    let _ = if config.format == "json" {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
}

/// The filter of `directives`, with rmcp's transport worker silenced: it logs its fatal errors with the whole URL
/// of the MCP server, whose path and query may hold a token (SPEC 12). The gateway logs each such failure itself,
/// with the URL cut to `scheme://host[:port]`.
pub fn log_filter(directives: &str) -> Result<EnvFilter, tracing_subscriber::filter::ParseError> {
    Ok(EnvFilter::try_new(directives)?.add_directive("rmcp::transport::worker=off".parse()?))
}

/// Gives every request an `x-request-id` (the client's, or a new UUID), returns it in the answer, and opens a
/// span carrying it, with the method and path; bodies and headers are never logged.
pub fn with_request_ids(router: Router) -> Router {
    let header = HeaderName::from_static("x-request-id");
    let trace = TraceLayer::new_for_http().make_span_with(|request: &Request<axum::body::Body>| {
        let id = request
            .extensions()
            .get::<RequestId>()
            .and_then(|id| id.header_value().to_str().ok())
            .unwrap_or_default();
        tracing::info_span!(
            "request",
            request.id = %id,
            http.method = %request.method(),
            http.path = %request.uri().path(),
        )
    });
    // The last layer added runs first: set the id, then trace, and copy the id to the answer.
    router
        .layer(trace)
        .layer(PropagateRequestIdLayer::new(header.clone()))
        .layer(SetRequestIdLayer::new(header, MakeRequestUuid))
}
