//! What the console browses: responses across projects (filtered, newest first, a page at a time), and each
//! step's bookkeeping (times, re-sends) with the usage recorded for it; and recent tool calls, for health.

use crate::store::{Store, StoreError};

/// A response as the admin list shows it, with the usage recorded for it summed.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct ResponseSummary {
    pub id: String,
    pub project_id: String,
    pub api_key_id: Option<String>,
    pub deployment_id: Option<String>,
    pub model: String,
    pub status: String,
    pub background: bool,
    pub handed_back: bool,
    pub error_code: Option<String>,
    pub created_at: i64,
    pub completed_at: Option<i64>,
    /// The replica running it now, if any.
    pub owner: Option<String>,
    /// How many times a replica took it over.
    pub claim_epoch: i64,
    pub input_tokens: i64,
    pub output_tokens: i64,
    pub cost_usd: f64,
}

/// Which responses to list: every filter given must match; `created_at` in `[created_after, created_before)`.
#[derive(Debug, Clone, Default)]
pub struct ResponseFilter {
    pub project_id: Option<String>,
    pub api_key_id: Option<String>,
    pub model: Option<String>,
    pub status: Option<String>,
    pub created_after: Option<i64>,
    pub created_before: Option<i64>,
    /// The last response of the previous page (its `created_at` and id): this page starts after it.
    pub after: Option<(i64, String)>,
    pub limit: i64,
}

/// A step's bookkeeping and the usage recorded for it (`None` where no usage was recorded).
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct StepLedger {
    pub seq: i64,
    pub created_at: i64,
    pub updated_at: i64,
    /// How often the step was sent.
    pub attempts: i64,
    pub deployment: Option<String>,
    pub tool_source: Option<String>,
    pub input_tokens: Option<i64>,
    pub cached_tokens: Option<i64>,
    pub output_tokens: Option<i64>,
    pub reasoning_tokens: Option<i64>,
    pub cost_usd: Option<f64>,
}

/// One server tool call recorded in a window: its source's name, and its step as stored.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct ToolCallSample {
    pub tool_source: String,
    pub body: serde_json::Value,
}

/// The most tool calls a health read looks at: the newest, when a window holds more.
pub const MAX_TOOL_SAMPLES: i64 = 20_000;

/// The columns of `ResponseSummary`, read from `responses r` with its usage summed.
macro_rules! summary_select {
    () => {
        "SELECT r.id, r.project_id, r.api_key_id, r.deployment_id, r.model, r.status,
            r.background, r.handed_back, r.error_code, r.created_at, r.completed_at, r.owner,
            CAST(r.claim_epoch AS BIGINT) AS claim_epoch,
            CAST(COALESCE((SELECT SUM(u.input_tokens) FROM usage_records u WHERE u.response_id = r.id), 0)
                AS BIGINT) AS input_tokens,
            CAST(COALESCE((SELECT SUM(u.output_tokens) FROM usage_records u WHERE u.response_id = r.id), 0)
                AS BIGINT) AS output_tokens,
            CAST(COALESCE((SELECT SUM(u.cost_usd) FROM usage_records u WHERE u.response_id = r.id), 0.0)
                AS DOUBLE PRECISION) AS cost_usd
         FROM responses r"
    };
}

/// The list: filters `$1`..`$6` (`NULL` for "any"), the cursor `$7`/`$8`, the limit `$9`.
const LIST_RESPONSES: &str = concat!(
    summary_select!(),
    " WHERE ($1 IS NULL OR r.project_id = $1) AND ($2 IS NULL OR r.api_key_id = $2)
       AND ($3 IS NULL OR r.model = $3) AND ($4 IS NULL OR r.status = $4)
       AND r.created_at >= $5 AND r.created_at < $6
       AND (r.created_at < $7 OR (r.created_at = $7 AND r.id < $8))
     ORDER BY r.created_at DESC, r.id DESC LIMIT $9"
);

const RESPONSE_SUMMARY: &str = concat!(summary_select!(), " WHERE r.id = $1");

impl Store {
    /// One page of responses across projects, newest first (ties by id, descending).
    pub async fn list_responses(
        &self,
        filter: &ResponseFilter,
    ) -> Result<Vec<ResponseSummary>, StoreError> {
        let _timer = self.timed("list_responses");
        let (after_at, after_id) = filter
            .after
            .as_ref()
            .map_or((i64::MAX, ""), |(at, id)| (*at, id.as_str()));
        Ok(with_read_pool!(self, |pool| {
            sqlx::query_as::<_, ResponseSummary>(LIST_RESPONSES)
                .bind(filter.project_id.as_deref())
                .bind(filter.api_key_id.as_deref())
                .bind(filter.model.as_deref())
                .bind(filter.status.as_deref())
                .bind(filter.created_after.unwrap_or(i64::MIN))
                .bind(filter.created_before.unwrap_or(i64::MAX))
                .bind(after_at)
                .bind(after_id)
                .bind(filter.limit)
                .fetch_all(pool)
                .await
        })?)
    }

    /// One response, whichever project owns it.
    pub async fn response_summary(&self, id: &str) -> Result<Option<ResponseSummary>, StoreError> {
        Ok(with_read_pool!(self, |pool| {
            sqlx::query_as::<_, ResponseSummary>(RESPONSE_SUMMARY)
                .bind(id)
                .fetch_optional(pool)
                .await
        })?)
    }

    /// The bookkeeping and usage of every step of a response, in order.
    pub async fn step_ledgers(&self, response_id: &str) -> Result<Vec<StepLedger>, StoreError> {
        Ok(with_read_pool!(self, |pool| {
            sqlx::query_as::<_, StepLedger>(
            "SELECT CAST(s.seq AS BIGINT) AS seq, s.created_at, s.updated_at,
                CAST(s.attempts AS BIGINT) AS attempts, u.deployment, u.tool_source,
                CAST(u.input_tokens AS BIGINT) AS input_tokens, CAST(u.cached_tokens AS BIGINT) AS cached_tokens,
                CAST(u.output_tokens AS BIGINT) AS output_tokens,
                CAST(u.reasoning_tokens AS BIGINT) AS reasoning_tokens,
                CAST(u.cost_usd AS DOUBLE PRECISION) AS cost_usd
             FROM steps s LEFT JOIN usage_records u ON u.response_id = s.response_id AND u.seq = s.seq
             WHERE s.response_id = $1 ORDER BY s.seq"
        )
        .bind(response_id)
        .fetch_all(pool)
        .await
        })?)
    }

    /// The newest server tool calls recorded since `since` (Unix seconds), at most [`MAX_TOOL_SAMPLES`].
    pub async fn tool_call_samples(&self, since: i64) -> Result<Vec<ToolCallSample>, StoreError> {
        let _timer = self.timed("tool_call_samples");
        Ok(with_read_pool!(self, |pool| {
            sqlx::query_as::<_, ToolCallSample>(
                "SELECT u.tool_source, s.body FROM usage_records u
             JOIN steps s ON s.response_id = u.response_id AND s.seq = u.seq
             WHERE u.tool_source IS NOT NULL AND u.created_at >= $1
             ORDER BY u.created_at DESC LIMIT $2",
            )
            .bind(since)
            .bind(MAX_TOOL_SAMPLES)
            .fetch_all(pool)
            .await
        })?)
    }
}
