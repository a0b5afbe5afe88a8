//! What the tool-call audit reads: a response's owner, its steps' dispatch counts, and a project's responses
//! in a time range, a page at a time.

use crate::store::{Store, StoreError};

/// A response as the audit lists it.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct AuditedResponse {
    pub id: String,
    pub project_id: String,
    pub model: String,
    pub created_at: i64,
}

/// How often a step was sent (a resumed response sends a running step again, under the same Idempotency-Key).
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct StepAttempts {
    pub seq: i64,
    pub attempts: i64,
}

impl Store {
    /// One response, whichever project owns it.
    pub async fn audited_response(&self, id: &str) -> Result<Option<AuditedResponse>, StoreError> {
        Ok(with_pool!(self, |pool| {
            sqlx::query_as::<_, AuditedResponse>(
                "SELECT id, project_id, model, created_at FROM responses WHERE id = $1",
            )
            .bind(id)
            .fetch_optional(pool)
            .await
        })?)
    }

    /// The dispatch counts of a response's tool steps.
    pub async fn step_attempts(&self, response_id: &str) -> Result<Vec<StepAttempts>, StoreError> {
        Ok(with_pool!(self, |pool| sqlx::query_as::<_, StepAttempts>(
            "SELECT CAST(seq AS BIGINT) AS seq, CAST(attempts AS BIGINT) AS attempts
             FROM steps WHERE response_id = $1 AND kind = 'tool' ORDER BY seq"
        )
        .bind(response_id)
        .fetch_all(pool)
        .await)?)
    }

    /// A project's responses created in `[since, until)` (Unix seconds), oldest first, after the response
    /// `after` (its `created_at` and id), at most `limit`.
    pub async fn audited_responses(
        &self,
        project_id: &str,
        since: i64,
        until: i64,
        after: Option<(i64, &str)>,
        limit: i64,
    ) -> Result<Vec<AuditedResponse>, StoreError> {
        let (after_at, after_id) = after.unwrap_or((i64::MIN, ""));
        Ok(with_pool!(self, |pool| {
            sqlx::query_as::<_, AuditedResponse>(
                "SELECT id, project_id, model, created_at FROM responses
             WHERE project_id = $1 AND created_at >= $2 AND created_at < $3
               AND (created_at > $4 OR (created_at = $4 AND id > $5))
             ORDER BY created_at, id LIMIT $6",
            )
            .bind(project_id)
            .bind(since)
            .bind(until)
            .bind(after_at)
            .bind(after_id)
            .bind(limit)
            .fetch_all(pool)
            .await
        })?)
    }
}
