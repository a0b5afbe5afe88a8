//! `/projects/{project_id}/webhooks`: the endpoints a project's background responses' endings are delivered to
//! (SPEC 15): registered with a signing secret shown once, listed, deleted, and their deliveries listed.

use axum::extract::State;
use axum::Json;
use gateway_core::webhook::{read_events, read_url};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{found, list, AdminJson, ApiPath, List};
use crate::api::error::ApiError;
use crate::api::AppState;
use crate::store::webhooks::{DeliveryRow, WebhookEndpoint};

/// Deliveries listed at the most, newest first.
const DELIVERIES_LISTED: i64 = 100;

/// `{"url", "events"}` of a new endpoint.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhookBody {
    url: Option<String>,
    events: Option<Value>,
}

/// An endpoint as the admin API shows it: its secret only in the answer that created it.
#[derive(Debug, Serialize)]
pub struct WebhookObject {
    id: String,
    object: &'static str,
    project_id: String,
    url: String,
    events: Value,
    created_at: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    secret: Option<String>,
}

impl From<WebhookEndpoint> for WebhookObject {
    fn from(row: WebhookEndpoint) -> WebhookObject {
        WebhookObject {
            id: row.id,
            object: "webhook_endpoint",
            project_id: row.project_id,
            url: row.url,
            events: row.events,
            created_at: row.created_at,
            secret: None,
        }
    }
}

/// A delivery as the admin API shows it.
#[derive(Debug, Serialize)]
pub struct DeliveryObject {
    id: String,
    object: &'static str,
    event_id: String,
    event_type: String,
    response_id: String,
    /// `pending`, `delivered`, `failed` (its tries ran out) or `superseded` (its response ended otherwise).
    status: String,
    attempts: i64,
    /// When the next try is due (milliseconds, the database's clock), while `pending`.
    next_attempt_at: Option<i64>,
    last_error: Option<String>,
    last_status: Option<i64>,
    created_at: i64,
    delivered_at: Option<i64>,
}

impl From<DeliveryRow> for DeliveryObject {
    fn from(row: DeliveryRow) -> DeliveryObject {
        DeliveryObject {
            next_attempt_at: (row.status == "pending").then_some(row.next_attempt_at),
            id: row.id,
            object: "webhook_delivery",
            event_id: row.event_id,
            event_type: row.event_type,
            response_id: row.response_id,
            status: row.status,
            attempts: row.attempts,
            last_error: row.last_error,
            last_status: row.last_status,
            created_at: row.created_at,
            delivered_at: row.delivered_at,
        }
    }
}

/// `POST /projects/{project_id}/webhooks`: the only answer that shows the signing secret.
pub async fn create_webhook(
    State(state): State<AppState>,
    ApiPath(project_id): ApiPath<String>,
    AdminJson(body): AdminJson<WebhookBody>,
) -> Result<Json<WebhookObject>, ApiError> {
    let url = read_url(body.url.as_deref())?;
    let events = read_events(body.events.as_ref())?;
    found(
        state.store.get_project(&project_id).await?,
        "project",
        &project_id,
    )?;
    let endpoint = WebhookEndpoint {
        id: crate::ids::new_id("wh"),
        project_id,
        url,
        events: Value::Array(events.iter().map(|e| Value::from(e.as_str())).collect()),
        secret: crate::webhooks::new_secret(),
        created_at: crate::clock::now(),
    };
    state.store.create_webhook_endpoint(&endpoint).await?;
    tracing::info!(project.id = %endpoint.project_id, webhook.id = %endpoint.id, webhook.origin = %crate::tools::failure::origin(&endpoint.url), "webhook endpoint registered");
    let secret = endpoint.secret.clone();
    Ok(Json(WebhookObject {
        secret: Some(secret),
        ..endpoint.into()
    }))
}

/// `GET /projects/{project_id}/webhooks`.
pub async fn list_webhooks(
    State(state): State<AppState>,
    ApiPath(project_id): ApiPath<String>,
) -> Result<Json<List<WebhookObject>>, ApiError> {
    found(
        state.store.get_project(&project_id).await?,
        "project",
        &project_id,
    )?;
    Ok(list(state.store.webhook_endpoints(&project_id).await?))
}

/// `DELETE /projects/{project_id}/webhooks/{webhook_id}`: the endpoint and its deliveries.
pub async fn delete_webhook(
    State(state): State<AppState>,
    ApiPath((project_id, webhook_id)): ApiPath<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    if !state
        .store
        .delete_webhook_endpoint(&project_id, &webhook_id)
        .await?
    {
        return Err(ApiError::not_found(format!(
            "No webhook endpoint with id '{webhook_id}' in project '{project_id}'."
        )));
    }
    Ok(Json(
        serde_json::json!({"id": webhook_id, "object": "webhook_endpoint", "deleted": true}),
    ))
}

/// `GET /projects/{project_id}/webhooks/{webhook_id}/deliveries`: the newest hundred, newest first.
pub async fn list_deliveries(
    State(state): State<AppState>,
    ApiPath((project_id, webhook_id)): ApiPath<(String, String)>,
) -> Result<Json<List<DeliveryObject>>, ApiError> {
    let endpoints = state.store.webhook_endpoints(&project_id).await?;
    if !endpoints.iter().any(|e| e.id == webhook_id) {
        return Err(ApiError::not_found(format!(
            "No webhook endpoint with id '{webhook_id}' in project '{project_id}'."
        )));
    }
    Ok(list(
        state
            .store
            .webhook_deliveries(&project_id, &webhook_id, DELIVERIES_LISTED)
            .await?,
    ))
}
