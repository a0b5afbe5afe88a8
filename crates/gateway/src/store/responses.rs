//! Stored responses: the response row, the context items it saw, and its steps. The reads are here; the writes
//! (one statement per step boundary on Postgres) are in `writes`, the rows as the tables hold them in `rows`.

mod group;
mod rows;
mod writes;
pub use writes::Started;

pub(crate) use group::GroupCommit;

use gateway_core::response::ResponseRecord;
use gateway_core::steps::Step;
use gateway_core::Item;
use serde_json::Value;

use super::governance::UsageRecord;
use super::stored_tools::StoredTool;
use super::{Backend, Store, StoreError};
use rows::{from_json, ResponseRow, StepReadRow, RESPONSE_BY_ID, STEPS_OF_RESPONSE};

/// A client's `Idempotency-Key`, and the digest (SHA-256, hex) of the request body it came with: a repeat under
/// the key is answered only when its body is the same.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdempotencyKey<'a> {
    pub key: &'a str,
    pub request_digest: &'a str,
}

/// A response to create, with the context it starts from.
#[derive(Debug, Clone)]
pub struct NewResponse<'a> {
    pub record: &'a ResponseRecord,
    pub project_id: &'a str,
    pub deployment_id: &'a str,
    pub server_tools: &'a [StoredTool],
    /// The whole context, every item with its id.
    pub context: &'a [Item],
    /// The first steps: tool calls carried over from a passed-through batch (pending), or the first model
    /// call (running); every step, for a response written when it ended.
    pub steps: &'a [Step],
    /// The client's `Idempotency-Key`, unique per project, with the digest of the request it came with.
    pub idempotency_key: Option<IdempotencyKey<'a>>,
    /// The replica that drives it; `None` for a background response left queued for any replica.
    pub owner: Option<&'a str>,
    /// How long it has until its deadline passes (milliseconds, counted from the database's clock when the row
    /// is written); `None` until it starts (a queued background response).
    pub deadline_in_ms: Option<i64>,
    /// The API key that created it: its usage counts against that key.
    pub api_key_id: Option<&'a str>,
    /// Usage of the calls among `steps` (SPEC 13), recorded with them.
    pub usage: &'a [UsageRecord],
    /// The W3C `traceparent` of the trace it was created in (SPEC 14), when traces are on.
    pub trace_context: Option<&'a str>,
}

/// A stored response and what is needed to continue or show it.
#[derive(Debug, Clone)]
pub struct StoredResponse {
    pub record: ResponseRecord,
    pub deployment_id: Option<String>,
}

/// Everything stored about a running response that a replica needs to resume it.
#[derive(Debug, Clone)]
pub struct StoredRun {
    pub record: ResponseRecord,
    pub project_id: String,
    pub deployment_id: Option<String>,
    /// The server tools it started with, as resolved then (without their secrets).
    pub server_tools: Vec<StoredTool>,
    /// How long it has left until its deadline (milliseconds, by the database's clock; negative once passed);
    /// `None` for a queued response that has not started.
    pub deadline_in_ms: Option<i64>,
    /// Whether it was created with an `Idempotency-Key` (a repeated create may be waiting for it).
    pub keyed: bool,
    /// The API key it was created with (`None` for responses stored before keys were recorded).
    pub api_key_id: Option<String>,
    /// The W3C `traceparent` of the trace it was created in: a resumed run continues that trace.
    pub trace_context: Option<String>,
    pub context: Vec<Item>,
    pub steps: Vec<Step>,
}

/// Listing order of `input_items`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Order {
    Asc,
    Desc,
}

/// Whether a write waits for its commit to reach the disk (Postgres; the embedded store always does).
///
/// A `Relaxed` write is visible at once and on disk a fraction of a second later: only a crash of the
/// database server in between loses it, and any later `Flush` write (a WAL flush covers everything before it)
/// makes it durable too. The engine relaxes only writes whose loss is harmless (see `docs/behaviour.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    Flush,
    Relaxed,
}

/// What one step boundary writes, in one statement: steps added and steps changed since the last boundary,
/// and, at the last boundary, how the response ended.
#[derive(Debug, Clone)]
pub struct StepWrite<'a> {
    pub response_id: &'a str,
    /// Steps not yet stored.
    pub added: &'a [Step],
    /// Stored steps whose state or body changed.
    pub changed: &'a [&'a Step],
    /// The response, when this boundary is its end: its ending, usage and completion time are recorded.
    pub ended: Option<&'a ResponseRecord>,
    /// `updated_at` of everything written and `created_at` of added steps.
    pub at: i64,
    pub durability: Durability,
    /// The replica that drives the response and the epoch of its claim: nothing is written unless both still
    /// hold (SPEC 9, fencing).
    pub owner: &'a str,
    pub epoch: i64,
    /// Whether followers of the response (a re-attached stream, a repeated create) are told it progressed.
    pub notify: bool,
    /// Usage of the calls among the steps written (SPEC 13), recorded with them once.
    pub usage: &'a [UsageRecord],
}

/// What a step write learnt about the response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteOutcome {
    /// A cancel (or the delete of the response) asked it to stop.
    pub cancel_requested: bool,
}

impl Store {
    /// A live response of `project_id`; another project's response is `None`, exactly like a missing one.
    pub async fn load_response(
        &self,
        project_id: &str,
        id: &str,
    ) -> Result<Option<StoredResponse>, StoreError> {
        let _timer = self.timed("load_response");
        let row: Option<ResponseRow> = with_read_pool!(self, |pool| {
            sqlx::query_as(RESPONSE_BY_ID)
                .bind(id)
                .bind(project_id)
                .fetch_optional(pool)
                .await
        })?;
        row.map(StoredResponse::try_from).transpose()
    }

    /// A response of `project_id` and its steps as of one moment (one snapshot): what its events and its output
    /// are projected from. Two reads apart could pair a row with steps written after it (a `queued` row with the
    /// steps of the run that started meanwhile).
    pub async fn load_with_steps(
        &self,
        project_id: &str,
        id: &str,
    ) -> Result<Option<(StoredResponse, Vec<Step>)>, StoreError> {
        let _timer = self.timed("load_with_steps");
        let (row, steps): (Option<ResponseRow>, Vec<StepReadRow>) =
            with_read_pool!(self, |pool| {
                let mut tx = pool.begin().await?;
                // SQLite reads a snapshot in a transaction already; Postgres needs to be asked.
                if matches!(self.backend, Backend::Postgres(_)) {
                    sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                        .execute(&mut *tx)
                        .await?;
                }
                let row = sqlx::query_as(RESPONSE_BY_ID)
                    .bind(id)
                    .bind(project_id)
                    .fetch_optional(&mut *tx)
                    .await?;
                let steps = match row {
                    Some(_) => {
                        sqlx::query_as(STEPS_OF_RESPONSE)
                            .bind(id)
                            .bind(project_id)
                            .fetch_all(&mut *tx)
                            .await?
                    }
                    None => Vec::new(),
                };
                tx.commit().await?;
                Ok::<_, sqlx::Error>((row, steps))
            })?;
        let Some(row) = row else { return Ok(None) };
        let steps = steps
            .into_iter()
            .map(Step::try_from)
            .collect::<Result<_, _>>()?;
        Ok(Some((StoredResponse::try_from(row)?, steps)))
    }

    /// Everything needed to resume a response of `project_id` that this replica took over.
    pub async fn load_run(
        &self,
        project_id: &str,
        id: &str,
    ) -> Result<Option<StoredRun>, StoreError> {
        let _timer = self.timed("load_run");
        let Some(stored) = self.load_response(project_id, id).await? else {
            return Ok(None);
        };
        // The time left is read off the database's clock, as the deadline was set.
        let sql = with_clock!(
            self,
            "SELECT server_tools, deadline_at - ",
            ", idempotency_key IS NOT NULL, api_key_id, trace_context FROM responses WHERE id = $1"
        );
        let (server_tools, deadline_in_ms, keyed, api_key_id, trace_context): (
            Value,
            Option<i64>,
            bool,
            Option<String>,
            Option<String>,
        ) = with_read_pool!(self, |pool| sqlx::query_as(sql)
            .bind(id)
            .fetch_one(pool)
            .await)?;
        let server_tools = serde_json::from_value(server_tools)
            .map_err(|e| StoreError::Corrupt(format!("server tools of '{id}': {e}")))?;
        Ok(Some(StoredRun {
            record: stored.record,
            project_id: project_id.to_owned(),
            deployment_id: stored.deployment_id,
            server_tools,
            deadline_in_ms,
            keyed,
            api_key_id,
            trace_context,
            context: self.load_context(project_id, id).await?,
            steps: self.load_steps(project_id, id).await?,
        }))
    }

    /// Whether response `id` runs in the background, read from its own column (which reads back when the rest
    /// of what is stored of it does not); `None` when there is no such response.
    pub async fn is_background(&self, id: &str) -> Result<Option<bool>, StoreError> {
        let background = with_pool!(self, |pool| sqlx::query_scalar(
            "SELECT background FROM responses WHERE id = $1",
        )
        .bind(id)
        .fetch_optional(pool)
        .await?);
        Ok(background)
    }

    /// The id of the response that `project_id` created with this `Idempotency-Key`, if any, and the digest of
    /// the request it was created by (`None` for a row written before digests were kept).
    pub async fn response_for_idempotency_key(
        &self,
        project_id: &str,
        key: &str,
    ) -> Result<Option<(String, Option<String>)>, StoreError> {
        let id = with_read_pool!(self, |pool| {
            sqlx::query_as(
            "SELECT id, idempotency_digest FROM responses WHERE project_id = $1 AND idempotency_key = $2",
        )
        .bind(project_id)
        .bind(key)
        .fetch_optional(pool)
        .await?
        });
        Ok(id)
    }

    /// A stored item of `project_id` by its id: an input or output item of any of its responses (SPEC 5). An id
    /// the gateway issued leads to its response; another (a client's own) is looked up among stored inputs.
    pub async fn find_item(
        &self,
        project_id: &str,
        item_id: &str,
    ) -> Result<Option<Item>, StoreError> {
        if let Some(response_id) = crate::ids::response_of_item(item_id) {
            if let Some((stored, steps)) = self.load_with_steps(project_id, &response_id).await? {
                let handed_back = stored.record.ending().is_some_and(|e| e.handed_back());
                let output = gateway_core::output::render_output(&steps, handed_back);
                if let Some(item) = output.into_iter().find(|i| i.id() == Some(item_id)) {
                    return Ok(Some(item));
                }
            }
        }
        let _timer = self.timed("find_item");
        let item: Option<Value> = with_read_pool!(self, |pool| sqlx::query_scalar(
            "SELECT i.item FROM response_input_items i JOIN responses r ON r.id = i.response_id
             WHERE i.item_id = $1 AND r.project_id = $2 LIMIT 1",
        )
        .bind(item_id)
        .bind(project_id)
        .fetch_optional(pool)
        .await?);
        item.map(from_json).transpose()
    }

    /// Every context item of a response of `project_id`, in order (none for another project's response).
    pub async fn load_context(
        &self,
        project_id: &str,
        response_id: &str,
    ) -> Result<Vec<Item>, StoreError> {
        let _timer = self.timed("load_context");
        let items: Vec<Value> = with_read_pool!(self, |pool| sqlx::query_scalar(
            "SELECT i.item FROM response_input_items i JOIN responses r ON r.id = i.response_id
             WHERE i.response_id = $1 AND r.project_id = $2 ORDER BY i.position",
        )
        .bind(response_id)
        .bind(project_id)
        .fetch_all(pool)
        .await?);
        items.into_iter().map(from_json).collect()
    }

    /// One page of the context items of a response of `project_id`: `limit` items after the item `after` (in
    /// the listing's order), and whether more follow. `Ok(None)` when `after` names no item of this response.
    pub async fn input_items_page(
        &self,
        project_id: &str,
        response_id: &str,
        after: Option<&str>,
        limit: i64,
        order: Order,
    ) -> Result<Option<(Vec<Value>, bool)>, StoreError> {
        let _timer = self.timed("input_items_page");
        let start = match after {
            None => None,
            Some(item_id) => {
                let position: Option<i32> = with_read_pool!(self, |pool| {
                    sqlx::query_scalar(
                    "SELECT i.position FROM response_input_items i JOIN responses r ON r.id = i.response_id
                     WHERE i.response_id = $1 AND i.item_id = $2 AND r.project_id = $3",
                )
                .bind(response_id)
                .bind(item_id)
                .bind(project_id)
                .fetch_optional(pool)
                .await?
                });
                match position {
                    Some(position) => Some(position),
                    None => return Ok(None),
                }
            }
        };
        let query = match order {
            Order::Asc => "SELECT i.item FROM response_input_items i JOIN responses r ON r.id = i.response_id
                 WHERE i.response_id = $1 AND r.project_id = $4 AND i.position > COALESCE($2, -1)
                 ORDER BY i.position ASC LIMIT $3",
            Order::Desc => "SELECT i.item FROM response_input_items i JOIN responses r ON r.id = i.response_id
                 WHERE i.response_id = $1 AND r.project_id = $4 AND i.position < COALESCE($2, 2147483647)
                 ORDER BY i.position DESC LIMIT $3",
        };
        let mut items: Vec<Value> = with_read_pool!(self, |pool| sqlx::query_scalar(query)
            .bind(response_id)
            .bind(start)
            .bind(limit + 1)
            .bind(project_id)
            .fetch_all(pool)
            .await?);
        let has_more = items.len() as i64 > limit;
        items.truncate(limit as usize);
        Ok(Some((items, has_more)))
    }

    /// Every step of a response of `project_id`, in order (none for another project's response).
    pub async fn load_steps(
        &self,
        project_id: &str,
        response_id: &str,
    ) -> Result<Vec<Step>, StoreError> {
        let _timer = self.timed("load_steps");
        let rows: Vec<StepReadRow> = with_read_pool!(self, |pool| {
            sqlx::query_as(STEPS_OF_RESPONSE)
                .bind(response_id)
                .bind(project_id)
                .fetch_all(pool)
                .await
        })?;
        rows.into_iter().map(Step::try_from).collect()
    }
}
