//! HTTP surface: the public Responses API, the admin API, health; routes and shared state.

pub mod admin;
pub mod error;
pub mod extract;
pub mod responses;

use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use axum::Router;
use secrecy::SecretString;

use crate::engine::Engine;
use crate::store::Store;

/// What every handler can reach.
#[derive(Clone)]
pub struct AppState {
    pub store: Store,
    pub engine: Engine,
    pub admin_token: Option<Arc<SecretString>>,
}

/// The whole router.
pub fn router(state: AppState, body_limit_bytes: usize) -> Router {
    Router::new()
        .route("/v1/responses", post(responses::create_response))
        .route(
            "/v1/responses/{id}",
            get(responses::get_response).delete(responses::delete_response),
        )
        .route(
            "/v1/responses/{id}/input_items",
            get(responses::list_input_items),
        )
        .nest("/admin/v1", admin::routes())
        .route("/healthz", get(health))
        .route("/readyz", get(ready))
        .route("/metrics", get(crate::metrics::render))
        .route_layer(axum::middleware::from_fn(crate::metrics::track_requests))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(body_limit_bytes))
        .with_state(state)
}

async fn health() -> &'static str {
    "ok"
}

/// Ready when the store answers and its migrations are applied.
async fn ready(
    axum::extract::State(state): axum::extract::State<AppState>,
) -> Result<&'static str, error::ApiError> {
    if !state.store.migrations_applied().await? {
        return Err(error::ApiError {
            status: axum::http::StatusCode::SERVICE_UNAVAILABLE,
            ..error::ApiError::server("The store's migrations are not all applied.")
        });
    }
    Ok("ready")
}

async fn not_found(uri: axum::http::Uri) -> error::ApiError {
    error::ApiError::not_found(format!("Unknown route: {}.", uri.path()))
}
