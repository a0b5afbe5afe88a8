//! `GET /tool_sources/health`: each tool source's calls, errors and latency (mean and percentiles) over a
//! window, from the tool steps and usage records stored, with its circuit breaker as this replica sees it
//! (breakers are kept per replica, in memory).

use std::collections::HashMap;

use axum::extract::State;
use axum::Json;
use gateway_core::steps::{StepBody, ToolOutcome};
use serde::Serialize;

use super::only_params;
use super::tool_calls::query_number;
use crate::api::error::ApiError;
use crate::api::extract::ApiQuery;
use crate::api::AppState;
use crate::clock::now;
use crate::store::admin::ToolCallSample;

const DEFAULT_WINDOW_SECS: i64 = 86_400;
const MAX_WINDOW_SECS: i64 = 30 * 86_400;

/// One source's health.
#[derive(Debug, Serialize, PartialEq)]
pub struct HealthObject {
    object: &'static str,
    tool_source_id: String,
    tool_source: String,
    calls: u64,
    errors: u64,
    mean_ms: Option<f64>,
    p50_ms: Option<i64>,
    p95_ms: Option<i64>,
    p99_ms: Option<i64>,
    /// `open` or `closed`, on the replica that answered.
    breaker: &'static str,
}

/// `{"object": "list", "window_seconds", "data"}`.
#[derive(Debug, Serialize)]
pub struct HealthList {
    object: &'static str,
    window_seconds: i64,
    data: Vec<HealthObject>,
}

/// Calls, errors and sorted durations (ms) of one source.
#[derive(Debug, Default)]
struct Tally {
    calls: u64,
    errors: u64,
    durations: Vec<i64>,
}

fn tally(samples: Vec<ToolCallSample>) -> HashMap<String, Tally> {
    let mut by_source: HashMap<String, Tally> = HashMap::new();
    for sample in samples {
        let tally = by_source.entry(sample.tool_source).or_default();
        tally.calls += 1;
        // A body this build cannot read still counts as a call.
        let Ok(StepBody::Tool(tool)) = serde_json::from_value::<StepBody>(sample.body) else {
            continue;
        };
        if matches!(tool.outcome, Some(ToolOutcome::Error { .. })) {
            tally.errors += 1;
        }
        if let Some((start, end)) = tool.started_at_ms.zip(tool.ended_at_ms) {
            tally.durations.push((end - start).max(0));
        }
    }
    for tally in by_source.values_mut() {
        tally.durations.sort_unstable();
    }
    by_source
}

/// The nearest-rank percentile `p` (0..=100) of sorted values.
fn percentile(sorted: &[i64], p: usize) -> Option<i64> {
    let rank = (sorted.len() * p).div_ceil(100).max(1);
    sorted.get(rank - 1).copied()
}

/// `GET /tool_sources/health?window=` (seconds, the last day by default, at most 30 days).
pub async fn tool_source_health(
    State(state): State<AppState>,
    ApiQuery(query): ApiQuery<HashMap<String, String>>,
) -> Result<Json<HealthList>, ApiError> {
    only_params(&query, &["window"])?;
    let window = query_number(&query, "window")?.unwrap_or(DEFAULT_WINDOW_SECS);
    if !(1..=MAX_WINDOW_SECS).contains(&window) {
        return Err(ApiError::invalid(
            format!("'window' must be between 1 and {MAX_WINDOW_SECS} seconds; got {window}."),
            Some("window"),
            Some("invalid_value"),
        ));
    }
    let sources = state.store.list_tool_sources().await?;
    let mut tallies = tally(state.store.tool_call_samples(now() - window).await?);
    let data = sources
        .into_iter()
        .map(|source| {
            let tally = tallies.remove(&source.name).unwrap_or_default();
            let durations = &tally.durations;
            HealthObject {
                object: "tool_source.health",
                breaker: if state.engine.tool_breaker_open(&source.id) {
                    "open"
                } else {
                    "closed"
                },
                tool_source_id: source.id,
                tool_source: source.name,
                calls: tally.calls,
                errors: tally.errors,
                mean_ms: (!durations.is_empty())
                    .then(|| durations.iter().sum::<i64>() as f64 / durations.len() as f64),
                p50_ms: percentile(durations, 50),
                p95_ms: percentile(durations, 95),
                p99_ms: percentile(durations, 99),
            }
        })
        .collect();
    Ok(Json(HealthList {
        object: "list",
        window_seconds: window,
        data,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_take_the_nearest_rank() {
        let values: Vec<i64> = (1..=100).collect();
        assert_eq!(percentile(&values, 50), Some(50));
        assert_eq!(percentile(&values, 95), Some(95));
        assert_eq!(percentile(&values, 99), Some(99));
        assert_eq!(percentile(&[7], 95), Some(7));
        assert_eq!(percentile(&[], 50), None);
    }
}
