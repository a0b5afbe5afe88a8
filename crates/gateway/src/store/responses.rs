//! Stored responses: the response row, the context items it saw, and its steps.

use gateway_core::output::{ResponseRecord, ResponseStatus};
use gateway_core::request::ResponseParams;
use gateway_core::steps::{Step, StepBody, StepState, Usage};
use gateway_core::Item;
use serde_json::Value;
use sqlx::postgres::PgConnection;
use sqlx::sqlite::SqliteConnection;
use sqlx::types::Json;

use super::backend::Fields;
use super::tenancy::ToolSource;
use super::{now, Backend, Store, StoreError};

/// A response to create, with the context it starts from.
#[derive(Debug, Clone)]
pub struct NewResponse<'a> {
    pub record: &'a ResponseRecord,
    pub project_id: &'a str,
    pub deployment_id: &'a str,
    pub server_tools: &'a [ToolSource],
    /// The whole context, every item with its id.
    pub context: &'a [Item],
    /// Tool steps to run before the first model call (calls carried over from a passed-through batch).
    pub carried_steps: &'a [Step],
    /// The client's `Idempotency-Key`, unique per project.
    pub idempotency_key: Option<&'a str>,
}

/// A stored response and what is needed to continue or show it.
#[derive(Debug, Clone)]
pub struct StoredResponse {
    pub record: ResponseRecord,
    pub handed_back: bool,
    pub deployment_id: Option<String>,
}

/// How a response ended.
#[derive(Debug, Clone)]
pub struct Ending {
    pub status: ResponseStatus,
    pub usage: Option<Usage>,
    pub handed_back: bool,
    pub error: Option<(String, String)>,
    pub incomplete_reason: Option<String>,
}

/// Listing order of `input_items`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Order {
    Asc,
    Desc,
}

/// Inserts `StepRow`s inside `$tx`, a transaction of either backend.
macro_rules! insert_step_rows {
    ($tx:ident, $response_id:expr, $rows:expr, $created:expr) => {
        for row in $rows {
            sqlx::query(
                "INSERT INTO steps (response_id, seq, kind, state, body, call_id, tool_name, created_at, updated_at)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $8)",
            )
            .bind($response_id)
            .bind(row.seq)
            .bind(row.kind)
            .bind(row.state)
            .bind(&row.body)
            .bind(row.call_id)
            .bind(row.tool_name)
            .bind($created)
            .execute(&mut *$tx)
            .await?;
        }
    };
}

impl Store {
    /// Writes a new response, its context items and carried steps in one transaction.
    pub async fn create_response(&self, new: &NewResponse<'_>) -> Result<(), StoreError> {
        let _timer = crate::metrics::StoreTimer::start("create_response");
        let record = new.record;
        let params =
            serde_json::to_value(&record.params).map_err(|e| StoreError::Corrupt(e.to_string()))?;
        let tools = serde_json::to_value(new.server_tools)
            .map_err(|e| StoreError::Corrupt(e.to_string()))?;
        let mut positions = Vec::with_capacity(new.context.len());
        let mut ids = Vec::with_capacity(new.context.len());
        let mut items = Vec::with_capacity(new.context.len());
        for (position, item) in new.context.iter().enumerate() {
            positions.push(position as i32);
            ids.push(item.id().unwrap_or_default().to_owned());
            items.push(serde_json::to_value(item).map_err(|e| StoreError::Corrupt(e.to_string()))?);
        }
        let steps = step_rows(new.carried_steps)?;
        let created = now();
        with_pool!(self, |pool| {
            let mut tx = pool.begin().await?;
            sqlx::query(
                "INSERT INTO responses (id, project_id, deployment_id, model, status, params, server_tools,
                    previous_response_id, store, background, created_at, updated_at, idempotency_key)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $11, $12)",
            )
            .bind(&record.id)
            .bind(new.project_id)
            .bind(new.deployment_id)
            .bind(&record.model)
            .bind(record.status.as_str())
            .bind(&params)
            .bind(&tools)
            .bind(&record.previous_response_id)
            .bind(record.store)
            .bind(record.background)
            .bind(record.created_at)
            .bind(new.idempotency_key)
            .execute(&mut *tx)
            .await.map_err(|e| StoreError::from_write(e, "a response with this Idempotency-Key is being created"))?;
            tx.insert_context(&record.id, &positions, &ids, &items)
                .await?;
            insert_step_rows!(tx, &record.id, &steps, created);
            tx.commit().await?;
        });
        Ok(())
    }

    /// A live response of `project_id`; another project's response is `None`, exactly like a missing one.
    pub async fn load_response(
        &self,
        project_id: &str,
        id: &str,
    ) -> Result<Option<StoredResponse>, StoreError> {
        let _timer = crate::metrics::StoreTimer::start("load_response");
        with_pool!(self, |pool| {
            let row = sqlx::query(
                "SELECT id, deployment_id, model, status, params, previous_response_id, store, background, handed_back,
                        error_code, error_message, incomplete_reason, usage, created_at, completed_at
                 FROM responses WHERE id = $1 AND project_id = $2 AND deleted_at IS NULL",
            )
            .bind(id)
            .bind(project_id)
            .fetch_optional(pool)
            .await?;
            row.map(|r| stored_response(&r)).transpose()
        })
    }

    /// The id of the response that `project_id` created with this `Idempotency-Key`, if any.
    pub async fn response_for_idempotency_key(
        &self,
        project_id: &str,
        key: &str,
    ) -> Result<Option<String>, StoreError> {
        let id = with_pool!(self, |pool| sqlx::query_scalar(
            "SELECT id FROM responses WHERE project_id = $1 AND idempotency_key = $2",
        )
        .bind(project_id)
        .bind(key)
        .fetch_optional(pool)
        .await?);
        Ok(id)
    }

    /// Deletes a response with its items and steps; `false` when there was none for this project.
    pub async fn delete_response(&self, project_id: &str, id: &str) -> Result<bool, StoreError> {
        let _timer = crate::metrics::StoreTimer::start("delete_response");
        let deleted = with_pool!(self, |pool| sqlx::query(
            "DELETE FROM responses WHERE id = $1 AND project_id = $2"
        )
        .bind(id)
        .bind(project_id)
        .execute(pool)
        .await?
        .rows_affected());
        Ok(deleted > 0)
    }

    /// Every context item of a response, in order.
    pub async fn load_context(&self, response_id: &str) -> Result<Vec<Item>, StoreError> {
        let _timer = crate::metrics::StoreTimer::start("load_context");
        let items: Vec<Value> = with_pool!(self, |pool| sqlx::query_scalar(
            "SELECT item FROM response_input_items WHERE response_id = $1 ORDER BY position",
        )
        .bind(response_id)
        .fetch_all(pool)
        .await?);
        items
            .into_iter()
            .map(|item| {
                serde_json::from_value(item).map_err(|e| StoreError::Corrupt(e.to_string()))
            })
            .collect()
    }

    /// One page of context items: `limit` items after the item `after` (in the listing's order),
    /// and whether more follow. `Ok(None)` when `after` names no item of this response.
    pub async fn input_items_page(
        &self,
        response_id: &str,
        after: Option<&str>,
        limit: i64,
        order: Order,
    ) -> Result<Option<(Vec<Value>, bool)>, StoreError> {
        let _timer = crate::metrics::StoreTimer::start("input_items_page");
        let start = match after {
            None => None,
            Some(item_id) => {
                let position: Option<i32> = with_pool!(self, |pool| {
                    sqlx::query_scalar(
                    "SELECT position FROM response_input_items WHERE response_id = $1 AND item_id = $2",
                )
                .bind(response_id)
                .bind(item_id)
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
            Order::Asc => "SELECT item FROM response_input_items WHERE response_id = $1 AND position > COALESCE($2, -1)
                 ORDER BY position ASC LIMIT $3",
            Order::Desc => "SELECT item FROM response_input_items WHERE response_id = $1 AND position < COALESCE($2, 2147483647)
                 ORDER BY position DESC LIMIT $3",
        };
        let mut items: Vec<Value> = with_pool!(self, |pool| sqlx::query_scalar(query)
            .bind(response_id)
            .bind(start)
            .bind(limit + 1)
            .fetch_all(pool)
            .await?);
        let has_more = items.len() as i64 > limit;
        items.truncate(limit as usize);
        Ok(Some((items, has_more)))
    }

    /// Every step of a response, in order.
    pub async fn load_steps(&self, response_id: &str) -> Result<Vec<Step>, StoreError> {
        let _timer = crate::metrics::StoreTimer::start("load_steps");
        with_pool!(self, |pool| {
            let rows = sqlx::query(
                "SELECT seq, state, body FROM steps WHERE response_id = $1 ORDER BY seq",
            )
            .bind(response_id)
            .fetch_all(pool)
            .await?;
            rows.iter().map(step).collect()
        })
    }

    /// Records new steps (one transaction for all of them).
    pub async fn insert_steps(&self, response_id: &str, steps: &[Step]) -> Result<(), StoreError> {
        let _timer = crate::metrics::StoreTimer::start("insert_steps");
        let steps = step_rows(steps)?;
        let created = now();
        with_pool!(self, |pool| {
            if steps.len() == 1 {
                // One row is atomic by itself: no BEGIN/COMMIT round trips on the hot path.
                let mut conn = pool.acquire().await?;
                insert_step_rows!(conn, response_id, &steps, created);
            } else {
                let mut tx = pool.begin().await?;
                insert_step_rows!(tx, response_id, &steps, created);
                tx.commit().await?;
            }
        });
        Ok(())
    }

    /// Writes a step's new state and body.
    pub async fn update_step(&self, response_id: &str, step: &Step) -> Result<(), StoreError> {
        let _timer = crate::metrics::StoreTimer::start("update_step");
        let body =
            serde_json::to_value(&step.body).map_err(|e| StoreError::Corrupt(e.to_string()))?;
        with_pool!(self, |pool| {
            sqlx::query("UPDATE steps SET state = $3, body = $4, updated_at = $5 WHERE response_id = $1 AND seq = $2")
            .bind(response_id)
            .bind(step.seq as i32)
            .bind(step.state.as_str())
            .bind(&body)
            .bind(now())
            .execute(pool)
            .await?
            .rows_affected()
        });
        Ok(())
    }

    /// Marks steps as started (their side effect may now be in flight) and counts the attempt.
    pub async fn mark_running(&self, response_id: &str, seqs: &[u32]) -> Result<(), StoreError> {
        let _timer = crate::metrics::StoreTimer::start("mark_running");
        let seqs: Vec<i32> = seqs.iter().map(|s| *s as i32).collect();
        match &self.backend {
            Backend::Postgres(pool) => {
                sqlx::query(
                    "UPDATE steps SET state = 'running', attempts = attempts + 1, updated_at = $3
                     WHERE response_id = $1 AND seq = ANY($2)",
                )
                .bind(response_id)
                .bind(&seqs)
                .bind(now())
                .execute(pool)
                .await?;
            }
            // SQLite has no arrays: the seqs travel as one JSON array parameter, unpacked by `json_each`.
            Backend::Sqlite(pool) => {
                sqlx::query(
                    "UPDATE steps SET state = 'running', attempts = attempts + 1, updated_at = $3
                     WHERE response_id = $1 AND seq IN (SELECT value FROM json_each($2))",
                )
                .bind(response_id)
                .bind(Json(&seqs))
                .bind(now())
                .execute(pool)
                .await?;
            }
        }
        Ok(())
    }

    /// Records how a response ended.
    pub async fn finish_response(
        &self,
        response_id: &str,
        ending: &Ending,
        completed_at: i64,
    ) -> Result<(), StoreError> {
        let _timer = crate::metrics::StoreTimer::start("finish_response");
        let usage = ending
            .usage
            .map(|u| serde_json::to_value(u).unwrap_or(Value::Null));
        with_pool!(self, |pool| {
            sqlx::query(
            "UPDATE responses SET status = $2, usage = $3, handed_back = $4, error_code = $5, error_message = $6,
                incomplete_reason = $7, completed_at = $8, updated_at = $8
             WHERE id = $1",
        )
        .bind(response_id)
        .bind(ending.status.as_str())
        .bind(&usage)
        .bind(ending.handed_back)
        .bind(ending.error.as_ref().map(|e| &e.0))
        .bind(ending.error.as_ref().map(|e| &e.1))
        .bind(&ending.incomplete_reason)
        .bind(completed_at)
        .execute(pool)
        .await?
        .rows_affected()
        });
        Ok(())
    }
}

/// Writes context items: the one statement of `create_response` that differs between the backends, picked
/// by the type of the transaction's connection.
trait InsertContext {
    async fn insert_context(
        &mut self,
        response_id: &str,
        positions: &[i32],
        ids: &[String],
        items: &[Value],
    ) -> Result<(), sqlx::Error>;
}

impl InsertContext for PgConnection {
    async fn insert_context(
        &mut self,
        response_id: &str,
        positions: &[i32],
        ids: &[String],
        items: &[Value],
    ) -> Result<(), sqlx::Error> {
        sqlx::query(
            "INSERT INTO response_input_items (response_id, position, item_id, item)
             SELECT $1, * FROM UNNEST($2::int4[], $3::text[], $4::jsonb[])",
        )
        .bind(response_id)
        .bind(positions)
        .bind(ids)
        .bind(items)
        .execute(self)
        .await?;
        Ok(())
    }
}

impl InsertContext for SqliteConnection {
    /// One statement per item (SQLite has no arrays to unnest); inside the caller's transaction they cost
    /// one commit together.
    async fn insert_context(
        &mut self,
        response_id: &str,
        positions: &[i32],
        ids: &[String],
        items: &[Value],
    ) -> Result<(), sqlx::Error> {
        for ((position, id), item) in positions.iter().zip(ids).zip(items) {
            sqlx::query(
                "INSERT INTO response_input_items (response_id, position, item_id, item)
                 VALUES ($1, $2, $3, $4)",
            )
            .bind(response_id)
            .bind(position)
            .bind(id)
            .bind(item)
            .execute(&mut *self)
            .await?;
        }
        Ok(())
    }
}

/// A step as the `steps` table holds it.
struct StepRow<'a> {
    seq: i32,
    kind: &'static str,
    state: &'static str,
    body: Value,
    call_id: Option<&'a str>,
    tool_name: Option<&'a str>,
}

fn step_rows(steps: &[Step]) -> Result<Vec<StepRow<'_>>, StoreError> {
    steps
        .iter()
        .map(|step| {
            let (kind, call_id, tool_name) = match &step.body {
                StepBody::Model(_) => ("model", None, None),
                StepBody::Tool(tool) => (
                    "tool",
                    Some(tool.call.call_id.as_str()),
                    Some(tool.call.name.as_str()),
                ),
            };
            Ok(StepRow {
                seq: step.seq as i32,
                kind,
                state: step.state.as_str(),
                body: serde_json::to_value(&step.body)
                    .map_err(|e| StoreError::Corrupt(e.to_string()))?,
                call_id,
                tool_name,
            })
        })
        .collect()
}

fn step(row: &impl Fields) -> Result<Step, StoreError> {
    let state: String = row.field("state")?;
    Ok(Step {
        seq: row.field::<i32>("seq")? as u32,
        state: StepState::parse(&state)
            .ok_or_else(|| StoreError::Corrupt(format!("step state '{state}'")))?,
        body: serde_json::from_value(row.field::<Value>("body")?)
            .map_err(|e| StoreError::Corrupt(e.to_string()))?,
    })
}

fn stored_response(row: &impl Fields) -> Result<StoredResponse, StoreError> {
    let status: String = row.field("status")?;
    let params: ResponseParams = serde_json::from_value(row.field::<Value>("params")?)
        .map_err(|e| StoreError::Corrupt(e.to_string()))?;
    let usage: Option<Usage> = row
        .field::<Option<Value>>("usage")?
        .map(serde_json::from_value)
        .transpose()
        .map_err(|e| StoreError::Corrupt(e.to_string()))?;
    let error = match (
        row.field::<Option<String>>("error_code")?,
        row.field::<Option<String>>("error_message")?,
    ) {
        (Some(code), Some(message)) => Some((code, message)),
        _ => None,
    };
    Ok(StoredResponse {
        record: ResponseRecord {
            id: row.field("id")?,
            created_at: row.field("created_at")?,
            completed_at: row.field("completed_at")?,
            status: ResponseStatus::parse(&status)
                .ok_or_else(|| StoreError::Corrupt(format!("status '{status}'")))?,
            model: row.field("model")?,
            params,
            previous_response_id: row.field("previous_response_id")?,
            store: row.field("store")?,
            background: row.field("background")?,
            error,
            incomplete_reason: row.field("incomplete_reason")?,
            usage,
        },
        handed_back: row.field("handed_back")?,
        deployment_id: row.field("deployment_id")?,
    })
}
