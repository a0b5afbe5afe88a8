//! HTTP surface: the public Responses API, the admin API, the console, health; routes and shared state.

pub mod admin;
pub mod compact;
pub mod console;
pub mod conversations;
pub mod error;
pub mod extract;
pub mod governance;
pub mod input_tokens;
pub mod responses;
pub mod shared_reads;
pub mod stream;
pub mod ws;

use std::convert::Infallible;
use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use axum::Router;
use secrecy::SecretString;

use crate::engine::Engine;
use crate::store::governance::KeyGrant;
use crate::store::Store;

/// The longest URL (path and query, and authority when sent) the gateway reads; a longer one is `414`. Ids and
/// query values are at most [`extract::MAX_ID_LEN`] characters, so no valid request comes near it. Beyond
/// 65,534 bytes a URL cannot be parsed at all (the `http` crate's `Uri` bound) and hyper refuses it before the
/// router; [`crate::listener`] gives that refusal the same shape.
pub const MAX_URL_BYTES: usize = 16 * 1024;

/// The most header bytes (names, values and separators, as sent) the gateway reads; more is `431`. Past about
/// 400 KiB for the whole request head, or past [`MAX_HEADERS`] headers, hyper refuses it before the router.
pub const MAX_HEADER_BYTES: usize = 64 * 1024;

/// The most headers hyper parses in one request (its default); more is `431`, from hyper.
pub const MAX_HEADERS: usize = 100;

/// What every handler can reach; one reference count to clone, since axum clones it for every extractor and
/// middleware that takes it (cloned field by field, it was a dozen).
#[derive(Clone)]
pub struct AppState(Arc<Shared>);

impl AppState {
    pub fn new(shared: Shared) -> AppState {
        AppState(Arc::new(shared))
    }
}

impl std::ops::Deref for AppState {
    type Target = Shared;

    fn deref(&self) -> &Shared {
        &self.0
    }
}

/// The parts of [`AppState`].
pub struct Shared {
    pub store: Store,
    pub engine: Engine,
    /// Store reads shared by the followers of one response (re-attached streams).
    pub reads: shared_reads::SharedReads,
    pub admin_token: Option<Arc<SecretString>>,
    /// The token `GET /metrics` asks for, when the operator set one.
    pub metrics_token: Option<Arc<SecretString>>,
    /// How long an event stream may stay silent before a keep-alive comment goes out, and how long its client
    /// may take nothing of it before it is treated as gone.
    pub streams: stream::StreamTimings,
    /// How long a WebSocket connection may live (`websocket.max_connection_ms`).
    pub websocket_max_age: std::time::Duration,
    /// The largest WebSocket message, and the most context a connection remembers: the HTTP body limit.
    pub websocket_message_limit: usize,
    /// The WebSocket connections open per API key, and how many each may hold.
    pub websockets: ws::OpenSockets,
}

impl AppState {
    /// The grant of a live API key (expired or not).
    pub async fn grant_for_key(
        &self,
        key: &str,
    ) -> Result<Option<std::sync::Arc<KeyGrant>>, crate::store::StoreError> {
        self.engine.grant_for_key(key).await
    }

    /// Forgets cached key and model resolutions here and on every replica, so that an admin write holds from the
    /// next request on.
    pub async fn forget_cached_tenancy(&self) {
        self.engine.forget_cached_tenancy().await;
    }
}

/// The whole router; [`bounded`] puts the limits of the head and the body in front of it.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route(
            "/v1/responses",
            post(responses::create_response).get(ws::open_socket),
        )
        .route("/v1/responses/compact", post(compact::compact_response))
        .route(
            "/v1/responses/input_tokens",
            post(input_tokens::count_input_tokens),
        )
        .route(
            "/v1/responses/{response_id}",
            get(responses::get_response).delete(responses::delete_response),
        )
        .route(
            "/v1/responses/{response_id}/input_items",
            get(responses::list_input_items),
        )
        .route(
            "/v1/responses/{response_id}/cancel",
            post(responses::cancel_response),
        )
        .route(
            "/v1/conversations",
            post(conversations::create_conversation),
        )
        .route(
            "/v1/conversations/{conversation_id}",
            get(conversations::get_conversation)
                .post(conversations::update_conversation)
                .delete(conversations::delete_conversation),
        )
        .route(
            "/v1/conversations/{conversation_id}/items",
            get(conversations::list_items).post(conversations::add_items),
        )
        .route(
            "/v1/conversations/{conversation_id}/items/{item_id}",
            get(conversations::get_item).delete(conversations::delete_item),
        )
        .nest(
            "/admin/v1",
            admin::routes(state.clone()).layer(axum::middleware::from_fn_with_state(
                state.clone(),
                forget_cached_tenancy,
            )),
        )
        .nest("/console", console::routes())
        .route("/healthz", get(health))
        .route("/readyz", get(ready))
        .route("/metrics", get(metrics))
        .route_layer(axum::middleware::from_fn(crate::metrics::track_requests))
        .fallback(not_found)
        .method_not_allowed_fallback(admin::method_not_allowed)
        .with_state(state)
}

/// The router behind the limits every request meets before routing: the head's size ([`BoundedHead`]) and the
/// body's (`DefaultBodyLimit`, which the body extractors read).
///
/// Wrapped around the router rather than added to it: a router's layer is applied to every route, each boxed
/// again, at the cost of a box for the service and one for its future on every request.
pub fn bounded(
    router: Router,
    body_limit_bytes: usize,
) -> BoundedHead<DefaultBodyLimitService<Router>> {
    BoundedHead {
        inner: tower::Layer::layer(&DefaultBodyLimit::max(body_limit_bytes), router),
    }
}

/// The service [`DefaultBodyLimit`] makes.
pub type DefaultBodyLimitService<S> = <DefaultBodyLimit as tower::Layer<S>>::Service;

/// Refuses a request whose URL or headers are larger than the gateway reads, in OpenAI's error shape, before
/// any route sees it.
#[derive(Clone)]
pub struct BoundedHead<S> {
    inner: S,
}

impl<S> tower::Service<axum::extract::Request> for BoundedHead<S>
where
    S: tower::Service<
        axum::extract::Request,
        Response = axum::response::Response,
        Error = Infallible,
    >,
{
    type Response = axum::response::Response;
    type Error = Infallible;
    type Future = futures::future::Either<
        std::future::Ready<Result<axum::response::Response, Infallible>>,
        S::Future,
    >;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: axum::extract::Request) -> Self::Future {
        use axum::response::IntoResponse;
        match head_refusal(&request) {
            Some(refusal) => {
                futures::future::Either::Left(std::future::ready(Ok(refusal.into_response())))
            }
            None => futures::future::Either::Right(self.inner.call(request)),
        }
    }
}

/// Why a request's URL or headers are too large to read, if they are.
fn head_refusal(request: &axum::extract::Request) -> Option<error::ApiError> {
    let uri = request.uri();
    let url = uri.path_and_query().map_or(0, |p| p.as_str().len())
        + uri.authority().map_or(0, |a| a.as_str().len());
    if url > MAX_URL_BYTES {
        return Some(error::ApiError::url_too_long(Some(url)));
    }
    // As sent: `name: value\r\n`.
    let headers: usize = request
        .headers()
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len() + 4)
        .sum();
    if headers > MAX_HEADER_BYTES {
        return Some(error::ApiError::headers_too_large(Some(headers)));
    }
    None
}

/// After an admin write, cached key and model resolutions are dropped, so the change holds from the next
/// request on.
async fn forget_cached_tenancy(
    axum::extract::State(state): axum::extract::State<AppState>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let writes = request.method() != axum::http::Method::GET;
    let response = next.run(request).await;
    if writes && response.status().is_success() {
        state.forget_cached_tenancy().await;
    }
    response
}

/// `GET /metrics`: the counters and histograms kept as the gateway works, and the queue of background responses
/// as the store holds it now.
async fn metrics(
    axum::extract::State(state): axum::extract::State<AppState>,
    headers: axum::http::HeaderMap,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    use secrecy::ExposeSecret;
    if let Some(expected) = &state.metrics_token {
        let given = extract::bearer(&headers).unwrap_or_default();
        if !admin::same_secret(given, expected.expose_secret()) {
            return error::ApiError::unauthorized(
                "The metrics need 'Authorization: Bearer <admin.metrics_token>'.",
                Some("invalid_metrics_token"),
            )
            .into_response();
        }
    }
    match state.store.queue_depth().await {
        Ok(depth) => crate::metrics::queue_depth(depth, crate::clock::now()),
        Err(e) => tracing::warn!(error = %e, "could not read the queue depth"),
    }
    crate::metrics::render().await
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
