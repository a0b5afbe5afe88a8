//! What the console reads of responses: `GET /responses` (across projects, filtered, newest first, a page at a
//! time) and `GET /responses/{id}/steps` (every step with its timing, tokens, cost, deployment, tool source,
//! outcome, re-sends and batch, and the response's takeovers). Arguments, results and errors are shown: this is
//! the operator's API.

use std::collections::{BTreeSet, HashMap};

use axum::extract::State;
use axum::Json;
use gateway_core::steps::{Step, StepBody, ToolOutcome};
use serde::Serialize;
use serde_json::Value;

use super::tool_calls::{query_limit, query_number};
use super::{found, only_params, ApiPath};
use crate::api::error::ApiError;
use crate::api::extract::ApiQuery;
use crate::api::AppState;
use crate::store::admin::{ResponseFilter, ResponseSummary, StepLedger};

const DEFAULT_LIMIT: i64 = 20;
const MAX_LIMIT: i64 = 100;
const STATUSES: [&str; 6] = [
    "queued",
    "in_progress",
    "completed",
    "incomplete",
    "failed",
    "cancelled",
];

/// A response as the admin list shows it.
#[derive(Debug, Serialize)]
pub struct ResponseObject {
    id: String,
    object: &'static str,
    project_id: String,
    api_key_id: Option<String>,
    deployment_id: Option<String>,
    /// The model the client asked for.
    model: String,
    status: String,
    background: bool,
    /// Whether it ended by handing tool calls back to the client.
    handed_back: bool,
    error_code: Option<String>,
    created_at: i64,
    completed_at: Option<i64>,
    /// The replica running it now, if any.
    owner: Option<String>,
    /// How many times a replica took it over.
    claim_epoch: i64,
    input_tokens: i64,
    output_tokens: i64,
    cost_usd: f64,
}

impl From<ResponseSummary> for ResponseObject {
    fn from(row: ResponseSummary) -> ResponseObject {
        ResponseObject {
            id: row.id,
            object: "admin.response",
            project_id: row.project_id,
            api_key_id: row.api_key_id,
            deployment_id: row.deployment_id,
            model: row.model,
            status: row.status,
            background: row.background,
            handed_back: row.handed_back,
            error_code: row.error_code,
            created_at: row.created_at,
            completed_at: row.completed_at,
            owner: row.owner,
            claim_epoch: row.claim_epoch,
            input_tokens: row.input_tokens,
            output_tokens: row.output_tokens,
            cost_usd: row.cost_usd,
        }
    }
}

/// `{"object": "list", "data", "has_more", "last_id"}`.
#[derive(Debug, Serialize)]
pub struct ResponsePage {
    object: &'static str,
    data: Vec<ResponseObject>,
    has_more: bool,
    /// The cursor of the next page (`after`), when there is one.
    last_id: Option<String>,
}

/// `GET /responses?project_id=&api_key_id=&model=&status=&created_after=&created_before=&limit=&after=`:
/// newest first; `created_after <= created_at < created_before` (Unix seconds); `after` is the id of the last
/// response of the previous page.
pub async fn list_responses(
    State(state): State<AppState>,
    ApiQuery(query): ApiQuery<HashMap<String, String>>,
) -> Result<Json<ResponsePage>, ApiError> {
    only_params(
        &query,
        &[
            "project_id",
            "api_key_id",
            "model",
            "status",
            "created_after",
            "created_before",
            "limit",
            "after",
        ],
    )?;
    if let Some(status) = query.get("status") {
        if !STATUSES.contains(&status.as_str()) {
            return Err(ApiError::invalid(
                format!(
                    "Unknown 'status' '{status}': expected one of {}.",
                    STATUSES.join(", ")
                ),
                Some("status"),
                Some("invalid_value"),
            ));
        }
    }
    let limit = query_limit(&query, DEFAULT_LIMIT, MAX_LIMIT)?;
    let after = match query.get("after") {
        None => None,
        Some(id) => {
            let Some(row) = state.store.response_summary(id).await? else {
                return Err(ApiError::invalid(
                    format!("'after' names no response: '{id}'."),
                    Some("after"),
                    Some("invalid_value"),
                ));
            };
            Some((row.created_at, row.id))
        }
    };
    let mut rows = state
        .store
        .list_responses(&ResponseFilter {
            project_id: query.get("project_id").cloned(),
            api_key_id: query.get("api_key_id").cloned(),
            model: query.get("model").cloned(),
            status: query.get("status").cloned(),
            created_after: query_number(&query, "created_after")?,
            created_before: query_number(&query, "created_before")?,
            after,
            limit: limit + 1,
        })
        .await?;
    let has_more = rows.len() as i64 > limit;
    rows.truncate(usize::try_from(limit).unwrap_or(0));
    let last_id = if has_more {
        rows.last().map(|r| r.id.clone())
    } else {
        None
    };
    Ok(Json(ResponsePage {
        object: "list",
        data: rows.into_iter().map(ResponseObject::from).collect(),
        has_more,
        last_id,
    }))
}

/// One step as the timeline shows it.
#[derive(Debug, Serialize)]
pub struct StepObject {
    object: &'static str,
    seq: u32,
    /// `model`, `tool` or `listing`.
    kind: &'static str,
    state: &'static str,
    /// When the step was written and last changed (Unix seconds).
    created_at: i64,
    updated_at: i64,
    /// When a tool call was last sent and when it ended (Unix milliseconds).
    started_at_ms: Option<i64>,
    ended_at_ms: Option<i64>,
    duration_ms: Option<i64>,
    /// How often the gateway sent it (more than once when a replica resumed the response).
    attempts: i64,
    /// The model step whose batch a tool call belongs to.
    batch: Option<u32>,
    /// The deployment that answered a model call (a fallback's, or the response's).
    deployment: Option<String>,
    tool_name: Option<String>,
    tool_call_id: Option<String>,
    /// The source that ran a tool call: its name as usage records it, else its `server_label`.
    tool_source: Option<String>,
    /// `output`, `error`, `tool_calls` (a model step that asked for tools), `message`, or none yet.
    outcome: Option<&'static str>,
    error: Option<String>,
    /// Calls of this model step that the client runs (handed back), by `call_id`.
    handed_back: Vec<String>,
    input_tokens: Option<i64>,
    cached_input_tokens: Option<i64>,
    output_tokens: Option<i64>,
    reasoning_tokens: Option<i64>,
    cost_usd: Option<f64>,
    /// The step as stored: the request (tool arguments), the result, the error, the model's output.
    body: Value,
}

/// `{"object": "list", "response", "data"}`: a response's steps, with the response itself (owner, takeovers).
#[derive(Debug, Serialize)]
pub struct StepsPage {
    object: &'static str,
    response: ResponseObject,
    data: Vec<StepObject>,
}

fn step_object(
    step: Step,
    ledger: Option<&StepLedger>,
    server_calls: &BTreeSet<String>,
    response_deployment: Option<&str>,
) -> StepObject {
    let mut object = StepObject {
        object: "admin.response.step",
        seq: step.seq,
        kind: "model",
        state: step.state.as_str(),
        created_at: ledger.map_or(0, |l| l.created_at),
        updated_at: ledger.map_or(0, |l| l.updated_at),
        started_at_ms: None,
        ended_at_ms: None,
        duration_ms: None,
        attempts: ledger.map_or(0, |l| l.attempts),
        batch: None,
        deployment: ledger.and_then(|l| l.deployment.clone()),
        tool_name: None,
        tool_call_id: None,
        tool_source: ledger.and_then(|l| l.tool_source.clone()),
        outcome: None,
        error: None,
        handed_back: Vec::new(),
        input_tokens: ledger.and_then(|l| l.input_tokens),
        cached_input_tokens: ledger.and_then(|l| l.cached_tokens),
        output_tokens: ledger.and_then(|l| l.output_tokens),
        reasoning_tokens: ledger.and_then(|l| l.reasoning_tokens),
        cost_usd: ledger.and_then(|l| l.cost_usd),
        body: serde_json::to_value(&step.body).unwrap_or(Value::Null),
    };
    match &step.body {
        StepBody::Model(model) => {
            object.deployment = model
                .deployment
                .clone()
                .or(object.deployment)
                .or_else(|| response_deployment.map(str::to_owned));
            if let Some(failure) = &model.failure {
                object.outcome = Some("error");
                object.error = Some(failure.message.clone());
            } else if let Some(output) = &model.output {
                object.outcome = Some(if output.tool_calls.is_empty() {
                    "message"
                } else {
                    "tool_calls"
                });
                object.handed_back = output
                    .tool_calls
                    .iter()
                    .filter(|call| !server_calls.contains(&call.call_id))
                    .map(|call| call.call_id.clone())
                    .collect();
            }
        }
        StepBody::Tool(tool) => {
            object.kind = "tool";
            object.deployment = None;
            object.started_at_ms = tool.started_at_ms;
            object.ended_at_ms = tool.ended_at_ms;
            object.duration_ms = tool.started_at_ms.zip(tool.ended_at_ms).map(|(s, e)| e - s);
            object.batch = tool.batch;
            object.tool_name = Some(tool.call.name.clone());
            object.tool_call_id = Some(tool.call.call_id.clone());
            object.tool_source = object.tool_source.or_else(|| tool.server_label.clone());
            match &tool.outcome {
                Some(ToolOutcome::Output { .. }) => object.outcome = Some("output"),
                Some(ToolOutcome::Error { message, .. }) => {
                    object.outcome = Some("error");
                    object.error = Some(message.clone());
                }
                None => {}
            }
        }
        StepBody::Listing(listing) => {
            object.kind = "listing";
            object.deployment = None;
            object.tool_source = Some(listing.server_label.clone());
        }
    }
    object
}

/// `GET /responses/{response_id}/steps`.
pub async fn response_steps(
    State(state): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<StepsPage>, ApiError> {
    let response = found(state.store.response_summary(&id).await?, "response", &id)?;
    let steps = state.store.load_steps(&response.project_id, &id).await?;
    let ledgers: HashMap<i64, StepLedger> = state
        .store
        .step_ledgers(&id)
        .await?
        .into_iter()
        .map(|l| (l.seq, l))
        .collect();
    let server_calls: BTreeSet<String> = steps
        .iter()
        .filter_map(Step::tool)
        .map(|t| t.call.call_id.clone())
        .collect();
    let deployment = response.deployment_id.clone();
    let data = steps
        .into_iter()
        .map(|step| {
            let ledger = ledgers.get(&i64::from(step.seq));
            step_object(step, ledger, &server_calls, deployment.as_deref())
        })
        .collect();
    Ok(Json(StepsPage {
        object: "list",
        response: response.into(),
        data,
    }))
}
