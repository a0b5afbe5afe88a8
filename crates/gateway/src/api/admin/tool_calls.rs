//! The tool-call audit: a response's tool calls as canonical records (the core's walk), with status, timings,
//! dispatch attempts and the `Idempotency-Key` the tool received; and the same for a project's responses in a
//! time range, a page of responses at a time. Arguments and results are shown: this is the operator's API.

use std::collections::HashMap;

use axum::extract::State;
use axum::Json;
use gateway_core::steps::{Step, StepState};
use gateway_core::walk::{calls_of_response, CallRecord, Position, Shape};
use serde::Serialize;

use super::{found, not_found, ApiPath};
use crate::api::error::ApiError;
use crate::api::extract::ApiQuery;
use crate::api::AppState;
use crate::clock::now;
use crate::store::admin::AuditedResponse;

/// One tool call as the audit shows it.
#[derive(Debug, Serialize)]
pub struct ToolCallObject {
    object: &'static str,
    response_id: String,
    /// The model the client asked for.
    model: String,
    call_id: String,
    name: String,
    arguments: String,
    result: Option<String>,
    /// `completed`, `failed`, `in_progress`, `pending` (recorded, not sent), or `handed_back` (the client's to run).
    status: &'static str,
    /// `server` (the gateway ran it) or `client`.
    runner: &'static str,
    completed: bool,
    call_at: Position,
    result_at: Option<Position>,
    shape: Shape,
    /// How often the gateway sent it (more than once when a replica resumed the response).
    attempts: u32,
    started_at_ms: Option<i64>,
    ended_at_ms: Option<i64>,
    duration_ms: Option<i64>,
    /// What the tool source received as `Idempotency-Key`.
    idempotency_key: Option<String>,
}

/// `{"object": "list", "data", "has_more", "last_id"}`.
#[derive(Debug, Serialize)]
pub struct AuditPage {
    object: &'static str,
    data: Vec<ToolCallObject>,
    has_more: bool,
    /// The cursor for the next page (`after`), when there is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    next_after: Option<String>,
}

fn audit_object(
    response: &AuditedResponse,
    record: CallRecord,
    step: Option<&Step>,
    attempts: &HashMap<i64, i64>,
) -> ToolCallObject {
    let tool = step.and_then(Step::tool);
    let status = match (step, record.completed) {
        (None, true) => "completed",
        (None, false) => "handed_back",
        (Some(s), _) => match s.state {
            StepState::Succeeded => "completed",
            StepState::Failed => "failed",
            StepState::Running => "in_progress",
            StepState::Pending => "pending",
        },
    };
    let started_at_ms = tool.and_then(|t| t.started_at_ms);
    let ended_at_ms = tool.and_then(|t| t.ended_at_ms);
    ToolCallObject {
        object: "tool_call",
        response_id: response.id.clone(),
        model: response.model.clone(),
        call_id: record.call_id,
        name: record.name,
        arguments: record.arguments,
        result: record.result,
        status,
        runner: if step.is_some() { "server" } else { "client" },
        completed: record.completed,
        call_at: record.call_at,
        result_at: record.result_at,
        shape: record.shape,
        attempts: step
            .and_then(|s| attempts.get(&i64::from(s.seq)))
            .map_or(0, |n| u32::try_from(*n).unwrap_or(0)),
        started_at_ms,
        ended_at_ms,
        duration_ms: started_at_ms.zip(ended_at_ms).map(|(s, e)| e - s),
        // As the engine sends it: the response id and the step's position.
        idempotency_key: step.map(|s| format!("{}:{}", response.id, s.seq)),
    }
}

/// The audit records of one response.
async fn response_records(
    state: &AppState,
    response: &AuditedResponse,
) -> Result<Vec<ToolCallObject>, ApiError> {
    let steps = state
        .store
        .load_steps(&response.project_id, &response.id)
        .await?;
    let attempts: HashMap<i64, i64> = state
        .store
        .step_attempts(&response.id)
        .await?
        .into_iter()
        .map(|a| (a.seq, a.attempts))
        .collect();
    Ok(calls_of_response(&steps)
        .into_iter()
        .map(|(record, step)| audit_object(response, record, step, &attempts))
        .collect())
}

/// `GET /responses/{response_id}/tool_calls`.
pub async fn response_tool_calls(
    State(state): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<AuditPage>, ApiError> {
    let response = found(state.store.audited_response(&id).await?, "response", &id)?;
    Ok(Json(AuditPage {
        object: "list",
        data: response_records(&state, &response).await?,
        has_more: false,
        next_after: None,
    }))
}

/// Most responses read per page.
const MAX_LIMIT: i64 = 100;
const DEFAULT_LIMIT: i64 = 20;

/// The page size `limit` of the query: `default` when absent, else between 1 and `max`, or a 400 naming it.
pub(super) fn query_limit(
    query: &HashMap<String, String>,
    default: i64,
    max: i64,
) -> Result<i64, ApiError> {
    let limit = query_number(query, "limit")?.unwrap_or(default);
    if !(1..=max).contains(&limit) {
        return Err(ApiError::invalid(
            format!("'limit' must be between 1 and {max}; got {limit}."),
            Some("limit"),
            Some("invalid_value"),
        ));
    }
    Ok(limit)
}

pub(super) fn query_number(
    query: &HashMap<String, String>,
    key: &str,
) -> Result<Option<i64>, ApiError> {
    query
        .get(key)
        .map(|v| {
            v.parse::<i64>().map_err(|_| {
                ApiError::invalid(
                    format!("'{key}' must be an integer; got '{v}'."),
                    Some(key),
                    Some("invalid_value"),
                )
            })
        })
        .transpose()
}

/// `GET /projects/{project_id}/tool_calls?since=&until=&limit=&after=`: the records of the project's responses
/// created in `[since, until)` (Unix seconds; the last day by default), oldest first; `limit` responses per page
/// (1..100, 20 by default); `after` is the previous page's `next_after`.
pub async fn project_tool_calls(
    State(state): State<AppState>,
    ApiPath(project_id): ApiPath<String>,
    ApiQuery(query): ApiQuery<HashMap<String, String>>,
) -> Result<Json<AuditPage>, ApiError> {
    if state.store.get_project(&project_id).await?.is_none() {
        return Err(not_found("project", &project_id));
    }
    let until = query_number(&query, "until")?.unwrap_or_else(|| now() + 1);
    let since = query_number(&query, "since")?.unwrap_or(until.saturating_sub(86_400));
    let limit = query_limit(&query, DEFAULT_LIMIT, MAX_LIMIT)?;
    if since > until {
        return Err(ApiError::invalid(
            "'since' must not be after 'until'.",
            Some("since"),
            Some("invalid_value"),
        ));
    }
    let after = match query.get("after") {
        Some(cursor) => Some(parse_cursor(cursor)?),
        None => None,
    };
    let mut responses = state
        .store
        .audited_responses(
            &project_id,
            since,
            until,
            after.as_ref().map(|(at, id)| (*at, id.as_str())),
            limit + 1,
        )
        .await?;
    let has_more = responses.len() as i64 > limit;
    responses.truncate(limit as usize);
    let mut data = Vec::new();
    for response in &responses {
        data.extend(response_records(&state, response).await?);
    }
    let next_after = has_more
        .then(|| {
            responses
                .last()
                .map(|r| format!("{}:{}", r.created_at, r.id))
        })
        .flatten();
    Ok(Json(AuditPage {
        object: "list",
        data,
        has_more,
        next_after,
    }))
}

/// `created_at:response_id`, as `next_after` gives it.
fn parse_cursor(cursor: &str) -> Result<(i64, String), ApiError> {
    cursor
        .split_once(':')
        .and_then(|(at, id)| Some((at.parse().ok()?, id.to_owned())))
        .ok_or_else(|| {
            ApiError::invalid(
                "'after' is not a cursor this API gave.",
                Some("after"),
                Some("invalid_value"),
            )
        })
}
