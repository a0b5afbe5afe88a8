//! `GET /usage`: sums of the recorded usage (tokens by kind, model and tool calls, cost), filtered by time,
//! project, key and deployment, grouped by `day`, `hour`, `project`, `api_key`, `deployment` or `tool_source`
//! (several, comma-separated), a page at a time (SPEC 13).

use std::collections::HashMap;

use axum::extract::State;
use axum::Json;
use serde::Serialize;

use super::tool_calls::{query_limit, query_number};
use crate::api::error::ApiError;
use crate::api::extract::ApiQuery;
use crate::api::AppState;
use crate::clock::now;
use crate::store::governance::{UsageBucket, UsageGroup, UsageQuery};

const DEFAULT_LIMIT: i64 = 100;
const MAX_LIMIT: i64 = 1000;

/// One group of usage as the admin API shows it: the group's keys (those grouped by), then its sums.
#[derive(Debug, Serialize, PartialEq)]
pub struct UsageObject {
    object: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    start_time: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    end_time: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    project_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    api_key_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    deployment: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_source: Option<String>,
    input_tokens: i64,
    cached_input_tokens: i64,
    output_tokens: i64,
    reasoning_tokens: i64,
    total_tokens: i64,
    model_calls: i64,
    tool_calls: i64,
    cost_usd: f64,
}

fn usage_object(bucket: UsageBucket, groups: &[UsageGroup]) -> UsageObject {
    let width = if groups.contains(&UsageGroup::Hour) {
        3600
    } else {
        86_400
    };
    UsageObject {
        object: "usage.bucket",
        start_time: bucket.bucket_start,
        end_time: bucket.bucket_start.map(|start| start + width),
        project_id: bucket.project_id,
        api_key_id: bucket.api_key_id,
        deployment: bucket.deployment,
        tool_source: bucket.tool_source,
        input_tokens: bucket.input_tokens,
        cached_input_tokens: bucket.cached_tokens,
        output_tokens: bucket.output_tokens,
        reasoning_tokens: bucket.reasoning_tokens,
        total_tokens: bucket.input_tokens.saturating_add(bucket.output_tokens),
        model_calls: bucket.model_calls,
        tool_calls: bucket.tool_calls,
        cost_usd: bucket.cost_usd,
    }
}

/// `{"object": "page", "data", "has_more", "next_page"}`.
#[derive(Debug, Serialize)]
pub struct UsagePage {
    object: &'static str,
    data: Vec<UsageObject>,
    has_more: bool,
    /// The cursor of the next page (`page`), when there is one.
    next_page: Option<String>,
}

/// `GET /usage?start=&end=&project_id=&api_key_id=&deployment=&group_by=&limit=&page=`: `[start, end)` in Unix
/// seconds (the last 30 days by default).
pub async fn usage(
    State(state): State<AppState>,
    ApiQuery(query): ApiQuery<HashMap<String, String>>,
) -> Result<Json<UsagePage>, ApiError> {
    super::only_params(
        &query,
        &[
            "start",
            "end",
            "project_id",
            "api_key_id",
            "deployment",
            "group_by",
            "limit",
            "page",
        ],
    )?;
    let end = query_number(&query, "end")?.unwrap_or(now() + 1);
    let start = query_number(&query, "start")?.unwrap_or(end.saturating_sub(30 * 86_400));
    if start > end {
        return Err(ApiError::invalid(
            "'start' must not be after 'end'.",
            Some("start"),
            Some("invalid_value"),
        ));
    }
    let mut group_by = Vec::new();
    for name in query
        .get("group_by")
        .map(|g| g.split(',').map(str::trim).collect::<Vec<_>>())
        .unwrap_or_default()
    {
        let group = UsageGroup::parse(name).ok_or_else(|| {
            ApiError::invalid(
                format!("Unknown 'group_by' value '{name}': expected day, hour, project, api_key, deployment or tool_source (comma-separated)."),
                Some("group_by"),
                Some("invalid_value"),
            )
        })?;
        group_by.push(group);
    }
    let limit = query_limit(&query, DEFAULT_LIMIT, MAX_LIMIT)?;
    let limit = limit as u32;
    let offset = match query.get("page") {
        None => 0,
        Some(page) => page
            .strip_prefix("page_")
            .and_then(|n| n.parse::<u32>().ok())
            .ok_or_else(|| {
                ApiError::invalid(
                    "'page' must be a 'next_page' this endpoint answered.",
                    Some("page"),
                    Some("invalid_value"),
                )
            })?,
    };
    let mut buckets = state
        .store
        .usage_report(&UsageQuery {
            start,
            end,
            project_id: query.get("project_id").cloned(),
            api_key_id: query.get("api_key_id").cloned(),
            deployment: query.get("deployment").cloned(),
            group_by: group_by.clone(),
            offset,
            limit: limit + 1,
        })
        .await?;
    let has_more = buckets.len() as u32 > limit;
    buckets.truncate(limit as usize);
    Ok(Json(UsagePage {
        object: "page",
        data: buckets
            .into_iter()
            .map(|bucket| usage_object(bucket, &group_by))
            .collect(),
        has_more,
        next_page: has_more.then(|| format!("page_{}", offset.saturating_add(limit))),
    }))
}
