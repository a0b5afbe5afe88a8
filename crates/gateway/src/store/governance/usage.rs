//! Sums of the usage records for `GET /admin/v1/usage`: filtered by time, project, key and deployment, grouped
//! by time buckets and by who used what, a page at a time.

use super::super::{Backend, Store, StoreError};

/// What usage may be grouped by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UsageGroup {
    Hour,
    Day,
    Project,
    ApiKey,
    Deployment,
    ToolSource,
}

impl UsageGroup {
    pub fn parse(name: &str) -> Option<UsageGroup> {
        match name {
            "hour" => Some(UsageGroup::Hour),
            "day" => Some(UsageGroup::Day),
            "project" => Some(UsageGroup::Project),
            "api_key" => Some(UsageGroup::ApiKey),
            "deployment" => Some(UsageGroup::Deployment),
            "tool_source" => Some(UsageGroup::ToolSource),
            _ => None,
        }
    }
}

/// A usage read: records with `start <= created_at < end`, matching every filter given.
#[derive(Debug, Clone, Default)]
pub struct UsageQuery {
    pub start: i64,
    pub end: i64,
    pub project_id: Option<String>,
    pub api_key_id: Option<String>,
    pub deployment: Option<String>,
    pub group_by: Vec<UsageGroup>,
    /// Buckets skipped (the page's place) and answered at the most.
    pub offset: u32,
    pub limit: u32,
}

/// The sums of one group of usage records; a field that is not grouped by is `None`.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct UsageBucket {
    /// The start of the hour or day (Unix seconds), when grouped by one.
    pub bucket_start: Option<i64>,
    pub project_id: Option<String>,
    pub api_key_id: Option<String>,
    pub deployment: Option<String>,
    pub tool_source: Option<String>,
    pub input_tokens: i64,
    pub cached_tokens: i64,
    pub output_tokens: i64,
    pub reasoning_tokens: i64,
    pub model_calls: i64,
    pub tool_calls: i64,
    pub cost_usd: f64,
}

/// The SQL of a usage read grouped by `groups`; parameters `$1`..`$7`: start, end, project, key, deployment,
/// limit, offset.
fn usage_sql(groups: &[UsageGroup], backend: &Backend) -> String {
    // A sum held at the most a `BIGINT` holds, never failing the read: an upstream that reported absurd usage
    // fills its own total. Postgres sums `BIGINT`s as `NUMERIC`; SQLite's `TOTAL` sums as a float (exact up to
    // 2^53) where its `SUM` would fail on overflow.
    let total = |expression: &str| match backend {
        Backend::Postgres(_) => {
            format!("CAST(LEAST(COALESCE(SUM({expression}), 0), 9223372036854775807) AS BIGINT)")
        }
        Backend::Sqlite(_) => {
            format!("CAST(MIN(TOTAL({expression}), 9223372036854775807.0) AS INTEGER)")
        }
    };
    let has = |group| groups.contains(&group);
    let bucket = if has(UsageGroup::Hour) {
        "(created_at / 3600) * 3600"
    } else if has(UsageGroup::Day) {
        "(created_at / 86400) * 86400"
    } else {
        "CAST(NULL AS BIGINT)"
    };
    let column = |group, name: &'static str| -> String {
        if has(group) {
            name.to_owned()
        } else {
            format!("CAST(NULL AS TEXT) AS {name}")
        }
    };
    let mut keys: Vec<&str> = Vec::new();
    if has(UsageGroup::Hour) || has(UsageGroup::Day) {
        keys.push("bucket_start");
    }
    for (group, name) in [
        (UsageGroup::Project, "project_id"),
        (UsageGroup::ApiKey, "api_key_id"),
        (UsageGroup::Deployment, "deployment"),
        (UsageGroup::ToolSource, "tool_source"),
    ] {
        if has(group) {
            keys.push(name);
        }
    }
    let (group_by, order_by) = if keys.is_empty() {
        (String::new(), String::new())
    } else {
        let keys = keys.join(", ");
        (format!(" GROUP BY {keys}"), format!(" ORDER BY {keys}"))
    };
    format!(
        "SELECT {bucket} AS bucket_start, {project}, {key}, {deployment}, {source},
            {input} AS input_tokens, {cached} AS cached_tokens, {output} AS output_tokens,
            {reasoning} AS reasoning_tokens,
            {model_calls} AS model_calls,
            {tool_calls} AS tool_calls,
            CAST(COALESCE(SUM(cost_usd), 0.0) AS DOUBLE PRECISION) AS cost_usd
         FROM usage_records
         WHERE created_at >= $1 AND created_at < $2
            AND ($3 IS NULL OR project_id = $3) AND ($4 IS NULL OR api_key_id = $4)
            AND ($5 IS NULL OR deployment = $5){group_by}{order_by}
         LIMIT $6 OFFSET $7",
        project = column(UsageGroup::Project, "project_id"),
        key = column(UsageGroup::ApiKey, "api_key_id"),
        deployment = column(UsageGroup::Deployment, "deployment"),
        source = column(UsageGroup::ToolSource, "tool_source"),
        input = total("input_tokens"),
        cached = total("cached_tokens"),
        output = total("output_tokens"),
        reasoning = total("reasoning_tokens"),
        model_calls = total("CASE WHEN tool_source IS NULL THEN calls ELSE 0 END"),
        tool_calls = total("CASE WHEN tool_source IS NULL THEN 0 ELSE calls END"),
    )
}

impl Store {
    /// One page of usage sums, in the order of the groups' keys.
    pub async fn usage_report(&self, query: &UsageQuery) -> Result<Vec<UsageBucket>, StoreError> {
        let _timer = self.timed("usage_report");
        let sql = usage_sql(&query.group_by, &self.backend);
        let buckets = with_read_pool!(self, |pool| sqlx::query_as::<_, UsageBucket>(&sql)
            .bind(query.start)
            .bind(query.end)
            .bind(&query.project_id)
            .bind(&query.api_key_id)
            .bind(&query.deployment)
            .bind(i64::from(query.limit))
            .bind(i64::from(query.offset))
            .fetch_all(pool)
            .await)?;
        Ok(buckets)
    }
}
