//! Handlers of `/v1/responses`: create (foreground, streamed or background), read (or re-attach to its stream),
//! cancel, delete, and list input items.

use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use gateway_core::output::{listed_input_item, render_output, response_object};
use gateway_core::request::{validate, CreateResponseBody, ValidRequest};
use gateway_core::response::{Ending, FailureCode, ResponseRecord};
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::broadcast;
use tokio::time::Instant;

use super::error::ApiError;
use super::extract::{ApiPath, ApiQuery, KeyedJson, ProjectKey};
use super::governance::{admit, with_rate_headers};
use super::stream::{event_stream, follow, Following};
use super::AppState;
use crate::clock::now;
use crate::engine::Admitted;
use crate::store::notify::Notification;
use crate::store::responses::{IdempotencyKey, Order, StoredResponse};

/// A waiting request reads the store again after this long without a sign of progress.
const WAIT_POLL: Duration = Duration::from_millis(500);

/// `POST /v1/responses`: a JSON answer, or with `stream: true` the Responses event stream.
///
/// A non-streaming create that carries an `Idempotency-Key` header runs once per project and key: a repeat, even
/// one sent at the same moment, answers what the first one answered (after waiting for its end at most
/// `durability.wait_ms`; then 409, which SDKs retry, while the first is still running).
pub async fn create_response(
    State(state): State<AppState>,
    ProjectKey(project, grant): ProjectKey,
    KeyedJson {
        body,
        idempotency_key: key_header,
        digest,
    }: KeyedJson<CreateResponseBody>,
) -> Result<Response, ApiError> {
    let request = validate(body)?;
    let idempotency_key = idempotency_key(key_header.as_ref())?
        .filter(|_| !request.stream)
        .map(|key| IdempotencyKey {
            key,
            request_digest: digest.as_deref().unwrap_or_default(),
        });
    if idempotency_key.is_some() && !request.store {
        return Err(ApiError::invalid(
            "An Idempotency-Key needs a stored response to answer repeats with: it cannot be used with 'store': false.",
            Some("store"),
            None,
        ));
    }
    if let Some(key) = idempotency_key {
        // Boxed, as the lookup below: a create without a key should not carry the query's future.
        if let Some(first) =
            Box::pin(state.store.response_for_idempotency_key(&project, key.key)).await?
        {
            // Boxed, as `submit` below: a rare path's future would make every create's kilobytes larger.
            return Box::pin(repeat(&state, &project, key, first)).await;
        }
    }
    let (admitted, standings) = admit(&state, &grant).await?;
    let answer = match start(&state, admitted, request, idempotency_key).await {
        Err(error) if error.status == StatusCode::CONFLICT => {
            // Two creates with one Idempotency-Key raced and the other's row went in first: this one is a repeat
            // of it, and waits for its end as a later repeat does.
            let Some(key) = idempotency_key else {
                return Err(error);
            };
            let Some(first) =
                Box::pin(state.store.response_for_idempotency_key(&project, key.key)).await?
            else {
                return Err(error);
            };
            return Box::pin(repeat(&state, &project, key, first)).await;
        }
        answer => answer?,
    };
    Ok(with_rate_headers(answer, &standings))
}

/// Runs an admitted create: answered at once when in the background, as its event stream when streamed, else
/// when it ends.
async fn start(
    state: &AppState,
    admitted: Admitted,
    request: ValidRequest,
    idempotency_key: Option<IdempotencyKey<'_>>,
) -> Result<Response, ApiError> {
    if request.background {
        // Answered at once; a background stream follows the response from its first event.
        let stream = request.stream;
        let project = admitted.payer.project_id.clone();
        let (record, live) = Box::pin(state.engine.submit(
            admitted,
            request,
            idempotency_key,
            stream,
        ))
        .await?;
        if stream {
            let engine = state.engine.clone();
            let following = Following {
                project,
                id: record.id,
                after: None,
                live,
                place: None,
            };
            return Ok(follow(
                engine,
                state.reads.clone(),
                following,
                state.streams,
            ));
        }
        return Ok(Json(response_object(&record, &[])).into_response());
    }
    if request.stream {
        // Errors found before the stream starts are plain JSON errors (from `prepare`).
        let run = state.engine.prepare(admitted, request, None).await?;
        return Ok(event_stream(&state.engine, run, state.streams));
    }
    let finished = state
        .engine
        .create(admitted, request, idempotency_key)
        .await?;
    answer(&finished.record, |out| finished.view().write_json(out))
}

/// The answer to a finished create: the response, or, when it failed upstream, a 500 naming it that SDKs
/// must not retry (server tools may already have run); a 400 `upstream_rejected` when the provider refused the
/// request as the client's problem.
fn answer(
    record: &ResponseRecord,
    write: impl FnOnce(&mut Vec<u8>) -> serde_json::Result<()>,
) -> Result<Response, ApiError> {
    if let Some(Ending::Failed {
        code: FailureCode::UpstreamRejected,
        message,
    }) = record.ending()
    {
        return Err(ApiError::invalid(
            message.clone(),
            None,
            Some(FailureCode::UpstreamRejected.as_str()),
        ));
    }
    if let Some(Ending::Failed { message, .. }) = record.ending() {
        return Err(ApiError::server(format!(
            "{message} The response '{}' failed.",
            record.id
        )));
    }
    Ok(json_answer(write))
}

/// A response object as the JSON answer, written by `write` into one buffer sized for a typical response: axum's
/// `Json` starts at 128 bytes and grows its buffer several times on the way, a copy each time.
fn json_answer(write: impl FnOnce(&mut Vec<u8>) -> serde_json::Result<()>) -> Response {
    let mut body = Vec::with_capacity(4096);
    if let Err(e) = write(&mut body) {
        return ApiError::server(format!("the response could not be written as JSON: {e}"))
            .into_response();
    }
    let mut response = Response::new(axum::body::Body::from(body));
    let headers = response.headers_mut();
    // Room for the `x-ratelimit-*` headers added after, so that the map is not grown on the way.
    headers.reserve(8);
    headers.insert(
        axum::http::header::CONTENT_TYPE,
        axum::http::HeaderValue::from_static("application/json"),
    );
    response
}

/// Answers a repeated create with what the first one answered: a background response as it stands now; a
/// foreground one once it has ended (waiting a while for it, then a `409` that SDKs retry). `first` is the
/// response the key's first create made, and the digest of its body: a repeat with another body is refused.
async fn repeat(
    state: &AppState,
    project: &str,
    key: IdempotencyKey<'_>,
    (id, first_digest): (String, Option<String>),
) -> Result<Response, ApiError> {
    // A row written before digests were kept has none: it is answered as before.
    if first_digest.is_some_and(|digest| digest != key.request_digest) {
        return Err(ApiError::idempotency_key_reused(&id));
    }
    let id = id.as_str();
    let stored = find_response(state, project, id).await?;
    let stored = if stored.record.background || stored.record.ending().is_some() {
        stored
    } else {
        wait_for_end(state, project, id)
            .await?
            .ok_or_else(ApiError::idempotency_in_progress)?
    };
    let (record, object) = response_json(state, project, &stored.record.id).await?;
    if record.background {
        return Ok(Json(object).into_response());
    }
    answer(&record, |out| serde_json::to_writer(out, &object))
}

/// Waits, for at most `durability.wait_ms`, until response `id` ends, whichever replica runs it; `None` when it
/// has not ended by then.
async fn wait_for_end(
    state: &AppState,
    project: &str,
    id: &str,
) -> Result<Option<StoredResponse>, ApiError> {
    let replica = state.engine.replica();
    let mut progress = replica.watch_progress();
    let give_up = Instant::now() + replica.wait;
    loop {
        // The replica that runs it (if another) tells of its progress while somebody waits.
        state.engine.follow(id).await;
        let stored = find_response(state, project, id).await?;
        if stored.record.ending().is_some() {
            return Ok(Some(stored));
        }
        let now = Instant::now();
        if now >= give_up {
            return Ok(None);
        }
        let poll = tokio::time::sleep((give_up - now).min(WAIT_POLL));
        tokio::select! {
            () = poll => {}
            () = progressed(&mut progress, id) => {}
        }
    }
}

/// Resolves when response `id` may have progressed.
async fn progressed(progress: &mut broadcast::Receiver<std::sync::Arc<str>>, id: &str) {
    loop {
        match progress.recv().await {
            Ok(seen) if *seen == *id => return,
            Ok(_) => {}
            Err(broadcast::error::RecvError::Lagged(_)) => return,
            Err(broadcast::error::RecvError::Closed) => std::future::pending().await,
        }
    }
}

/// Asks running response `id` to stop, on whichever replica runs it; ends it here when it is queued and no
/// replica took it.
async fn stop_response(state: &AppState, project: &str, id: &str) -> Result<(), ApiError> {
    state.store.request_cancel(project, id).await?;
    state
        .engine
        .tell_all(Notification::Cancel(id.to_owned()))
        .await;
    if state.store.cancel_queued(project, id, now()).await? {
        state
            .engine
            .tell_all(Notification::Progress(id.to_owned()))
            .await;
    }
    Ok(())
}

/// A response of `project`; another project's is a 404, exactly like a missing one.
async fn find_response(
    state: &AppState,
    project: &str,
    id: &str,
) -> Result<StoredResponse, ApiError> {
    state
        .store
        .load_response(project, id)
        .await?
        .ok_or_else(|| ApiError::response_not_found(id))
}

/// A response of `project` as the API shows it, its output rendered from its steps, both read at one moment;
/// another project's is a 404, exactly like a missing one.
async fn response_json(
    state: &AppState,
    project: &str,
    id: &str,
) -> Result<(ResponseRecord, Value), ApiError> {
    let (stored, steps) = state
        .store
        .load_with_steps(project, id)
        .await?
        .ok_or_else(|| ApiError::response_not_found(id))?;
    let record = stored.record;
    let handed_back = record.ending().is_some_and(Ending::handed_back);
    let object = response_object(&record, &render_output(&steps, handed_back));
    Ok((record, object))
}

/// The `Idempotency-Key` header, when present: 1 to 255 visible ASCII characters.
fn idempotency_key(header: Option<&HeaderValue>) -> Result<Option<&str>, ApiError> {
    let Some(value) = header else {
        return Ok(None);
    };
    match value.to_str() {
        Ok(key)
            if !key.is_empty() && key.len() <= 255 && key.bytes().all(|b| b.is_ascii_graphic()) =>
        {
            Ok(Some(key))
        }
        _ => Err(ApiError::invalid(
            "The Idempotency-Key header must be 1 to 255 visible ASCII characters.",
            None,
            Some("invalid_idempotency_key"),
        )),
    }
}

/// Query of `GET /v1/responses/{id}`.
#[derive(Debug, Deserialize)]
pub struct GetQuery {
    stream: Option<String>,
    starting_after: Option<String>,
}

/// `GET /v1/responses/{id}`: the response; with `stream=true`, its events after `starting_after` (all without
/// it), replayed from the store with their original sequence numbers, then the live ones until it ends.
pub async fn get_response(
    State(state): State<AppState>,
    ProjectKey(project, _): ProjectKey,
    ApiPath(id): ApiPath<String>,
    ApiQuery(query): ApiQuery<GetQuery>,
) -> Result<Response, ApiError> {
    let stream = match query.stream.as_deref() {
        None | Some("false") | Some("0") => false,
        Some("true") | Some("1") => true,
        Some(other) => {
            return Err(ApiError::invalid(
                format!("Invalid 'stream': expected true or false, got '{other}'."),
                Some("stream"),
                None,
            ))
        }
    };
    let starting_after = match query.starting_after.as_deref() {
        None => None,
        Some(text) => Some(text.parse::<u64>().map_err(|_| {
            ApiError::invalid(
                format!("Invalid 'starting_after': expected a sequence number (an integer >= 0), got '{text}'."),
                Some("starting_after"),
                None,
            )
        })?),
    };
    if stream {
        find_response(&state, &project, &id).await?;
        let place = state.engine.replica().admit_follower().ok_or_else(|| {
            ApiError::overloaded(
                "This gateway replica follows as many streams as it may; re-attach again shortly.",
            )
        })?;
        let live = state.engine.replica().runs.follow(&id);
        let engine = state.engine.clone();
        let following = Following {
            project,
            id,
            after: starting_after,
            live,
            place: Some(place),
        };
        return Ok(follow(
            engine,
            state.reads.clone(),
            following,
            state.streams,
        ));
    }
    Ok(Json(response_json(&state, &project, &id).await?.1).into_response())
}

/// `POST /v1/responses/{id}/cancel`: stops a background response at its next step boundary (aborting tool
/// calls in flight), on whichever replica runs it, and answers it `cancelled`. A response that already ended is
/// answered as it is; a foreground one cannot be cancelled.
pub async fn cancel_response(
    State(state): State<AppState>,
    ProjectKey(project, _): ProjectKey,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<Value>, ApiError> {
    let stored = find_response(&state, &project, &id).await?;
    if !stored.record.background {
        return Err(ApiError::invalid(
            format!("Only background responses can be cancelled; response '{id}' was created without 'background': true."),
            None,
            Some("not_background"),
        ));
    }
    let stored = if stored.record.ending().is_some() {
        stored
    } else {
        // Before the cancel: a response cancelled while still queued is ended here, by no run that would queue
        // its event. A run that ends it queues the same event (kept once); one that ended it otherwise first
        // supersedes it.
        let queued = state
            .engine
            .queue_ending_event(
                &project,
                &id,
                gateway_core::webhook::WebhookEvent::ResponseCancelled,
            )
            .await?;
        stop_response(&state, &project, &id).await?;
        if queued {
            state.engine.wake_deliverer();
        }
        match wait_for_end(&state, &project, &id).await? {
            Some(stored) => stored,
            None => find_response(&state, &project, &id).await?,
        }
    };
    Ok(Json(
        response_json(&state, &project, &stored.record.id).await?.1,
    ))
}

/// `DELETE /v1/responses/{id}`: a response still running is cancelled first, wherever it runs.
pub async fn delete_response(
    State(state): State<AppState>,
    ProjectKey(project, _): ProjectKey,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<Value>, ApiError> {
    let stored = find_response(&state, &project, &id).await?;
    if stored.record.ending().is_none() {
        // Its run stops at once; whatever it tries to write afterwards finds the response gone.
        stop_response(&state, &project, &id).await?;
    }
    if !state.store.delete_response(&project, &id).await? {
        return Err(ApiError::response_not_found(&id));
    }
    state
        .engine
        .tell_all(Notification::Progress(id.clone()))
        .await;
    Ok(Json(
        json!({"id": id, "object": "response", "deleted": true}),
    ))
}

/// Query of a listing paginated as OpenAI paginates (`input_items`, a conversation's items).
#[derive(Debug, Deserialize)]
pub struct ListQuery {
    limit: Option<String>,
    order: Option<String>,
    pub(super) after: Option<String>,
}

impl ListQuery {
    /// The page size (1 to 100, 20 when not given) and the order (`desc` when not given).
    pub(super) fn page(&self) -> Result<(i64, Order), ApiError> {
        let limit = match self.limit.as_deref() {
            None => 20,
            Some(text) => match text.parse::<i64>() {
                Ok(n) if (1..=100).contains(&n) => n,
                _ => {
                    return Err(ApiError::invalid(
                        format!(
                            "Invalid 'limit': expected an integer between 1 and 100, got '{text}'."
                        ),
                        Some("limit"),
                        None,
                    ))
                }
            },
        };
        let order = match self.order.as_deref() {
            None | Some("desc") => Order::Desc,
            Some("asc") => Order::Asc,
            Some(other) => {
                return Err(ApiError::invalid(
                    format!("Invalid 'order': expected 'asc' or 'desc', got '{other}'."),
                    Some("order"),
                    None,
                ))
            }
        };
        Ok((limit, order))
    }
}

/// A page of a listing in OpenAI's shape: `{"object": "list", "data", "first_id", "last_id", "has_more"}`.
pub(super) fn list_page(data: Vec<Value>, has_more: bool) -> Value {
    let id_of = |item: Option<&Value>| {
        item.and_then(|i| i.get("id"))
            .cloned()
            .unwrap_or(Value::Null)
    };
    let (first_id, last_id) = (id_of(data.first()), id_of(data.last()));
    json!({"object": "list", "data": data, "first_id": first_id, "last_id": last_id, "has_more": has_more})
}

/// `GET /v1/responses/{id}/input_items`: the full context the response saw, paginated as OpenAI does.
pub async fn list_input_items(
    State(state): State<AppState>,
    ProjectKey(project, _): ProjectKey,
    ApiPath(id): ApiPath<String>,
    ApiQuery(query): ApiQuery<ListQuery>,
) -> Result<Json<Value>, ApiError> {
    let (limit, order) = query.page()?;
    find_response(&state, &project, &id).await?;
    let (data, has_more) = state
        .store
        .input_items_page(&project, &id, query.after.as_deref(), limit, order)
        .await?
        .ok_or_else(|| {
            ApiError::invalid(
                format!(
                    "Invalid 'after': no input item with id '{}' in response '{id}'.",
                    query.after.as_deref().unwrap_or_default()
                ),
                Some("after"),
                None,
            )
        })?;
    let data: Vec<Value> = data.into_iter().map(listed_input_item).collect();
    Ok(Json(list_page(data, has_more)))
}
