//! Stored responses: the response row, the context items it saw, and its steps.

use gateway_core::output::{ResponseRecord, ResponseStatus};
use gateway_core::request::ResponseParams;
use gateway_core::steps::{Step, StepBody, StepState, Usage};
use gateway_core::Item;
use serde_json::Value;

use super::backend::Fields;
use super::tenancy::ToolSource;
use super::{Backend, Store, StoreError};

/// A response to create, with the context it starts from.
#[derive(Debug, Clone)]
pub struct NewResponse<'a> {
    pub record: &'a ResponseRecord,
    pub project_id: &'a str,
    pub deployment_id: &'a str,
    pub server_tools: &'a [ToolSource],
    /// The whole context, every item with its id.
    pub context: &'a [Item],
    /// The first steps: tool calls carried over from a passed-through batch (pending), or the first model
    /// call (running).
    pub steps: &'a [Step],
    /// Whether the response handed its last batch back (a response written when it ended).
    pub handed_back: bool,
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

impl Durability {
    /// The `synchronous_commit` value for this write; `None` keeps the server's own setting.
    fn synchronous_commit(self) -> Option<&'static str> {
        match self {
            Durability::Flush => None,
            Durability::Relaxed => Some("off"),
        }
    }
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
    pub ending: Option<&'a Ending>,
    /// `updated_at` of everything written, `created_at` of added steps and `completed_at` of an ending.
    pub at: i64,
    pub durability: Durability,
}

/// Inserts `StepRow`s inside `$tx`, a SQLite transaction.
macro_rules! insert_step_rows {
    ($tx:ident, $response_id:expr, $rows:expr, $created:expr, $updated:expr) => {
        for row in $rows {
            sqlx::query(
                "INSERT INTO steps (response_id, seq, kind, state, body, call_id, tool_name, attempts, created_at, updated_at)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
            )
            .bind($response_id)
            .bind(row.seq)
            .bind(row.kind)
            .bind(row.state)
            .bind(&row.body)
            .bind(row.call_id)
            .bind(row.tool_name)
            .bind(row.attempts())
            .bind($created)
            .bind($updated)
            .execute(&mut *$tx)
            .await?;
        }
    };
}

/// The response row's insert, shared by both backends: parameters `$1`..`$18` in the order `bind_response_row!`
/// binds them. A deployment deleted while the response ran is recorded as none, as `ON DELETE SET NULL` does
/// for rows written earlier; `updated_at` is the ending time of a response written when it ended.
macro_rules! insert_response_row {
    () => {
        "INSERT INTO responses (id, project_id, deployment_id, model, status, params, server_tools,
            previous_response_id, store, background, created_at, updated_at, idempotency_key,
            usage, handed_back, error_code, error_message, incomplete_reason, completed_at)
         VALUES ($1, $2, (SELECT id FROM deployments WHERE id = $3), $4, $5, $6, $7, $8, $9, $10, $11,
            COALESCE($18, $11), $12, $13, $14, $15, $16, $17, $18)"
    };
}

/// Binds `insert_response_row!`'s parameters.
macro_rules! bind_response_row {
    ($query:expr, $new:expr, $params:expr, $tools:expr, $usage:expr) => {{
        let new = $new;
        let record = new.record;
        $query
            .bind(&record.id)
            .bind(new.project_id)
            .bind(new.deployment_id)
            .bind(&record.model)
            .bind(record.status.as_str())
            .bind($params)
            .bind($tools)
            .bind(&record.previous_response_id)
            .bind(record.store)
            .bind(record.background)
            .bind(record.created_at)
            .bind(new.idempotency_key)
            .bind($usage)
            .bind(new.handed_back)
            .bind(record.error.as_ref().map(|e| &e.0))
            .bind(record.error.as_ref().map(|e| &e.1))
            .bind(&record.incomplete_reason)
            .bind(record.completed_at)
    }};
}

/// Postgres: the response row, its context items and its first steps, as one statement (one round trip,
/// one commit). The foreign keys of the items and steps are checked at the end of the statement, when the
/// response row exists.
const PG_CREATE_RESPONSE: &str = concat!(
    "WITH response AS (",
    insert_response_row!(),
    "), items AS (
    INSERT INTO response_input_items (response_id, position, item_id, item)
    SELECT $1, * FROM UNNEST($19::int4[], $20::text[], $21::jsonb[])
), added AS (
    INSERT INTO steps (response_id, seq, kind, state, body, call_id, tool_name, attempts, created_at, updated_at)
    SELECT $1, s.seq, s.kind, s.state, s.body, s.call_id, s.tool_name,
           CASE WHEN s.state = 'pending' THEN 0 ELSE 1 END, $11, COALESCE($18, $11)
    FROM UNNEST($22::int4[], $23::text[], $24::text[], $25::jsonb[], $26::text[], $27::text[])
        AS s(seq, kind, state, body, call_id, tool_name)
)
SELECT set_config('synchronous_commit', COALESCE($28, current_setting('synchronous_commit')), true)"
);

/// Postgres: one step boundary as one statement. Changed steps count an attempt when they start running;
/// the response row is touched only when `$12` (its ending status) is set.
const PG_WRITE_STEPS: &str = "
WITH changed AS (
    UPDATE steps SET state = u.state, body = u.body, updated_at = $2,
        attempts = steps.attempts + CASE WHEN u.state = 'running' THEN 1 ELSE 0 END
    FROM UNNEST($3::int4[], $4::text[], $5::jsonb[]) AS u(seq, state, body)
    WHERE steps.response_id = $1 AND steps.seq = u.seq
), added AS (
    INSERT INTO steps (response_id, seq, kind, state, body, call_id, tool_name, attempts, created_at, updated_at)
    SELECT $1, s.seq, s.kind, s.state, s.body, s.call_id, s.tool_name,
           CASE WHEN s.state = 'pending' THEN 0 ELSE 1 END, $2, $2
    FROM UNNEST($6::int4[], $7::text[], $8::text[], $9::jsonb[], $10::text[], $11::text[])
        AS s(seq, kind, state, body, call_id, tool_name)
), ended AS (
    UPDATE responses SET status = $12, usage = $13, handed_back = $14, error_code = $15, error_message = $16,
        incomplete_reason = $17, completed_at = $2, updated_at = $2
    WHERE id = $1 AND $12::text IS NOT NULL
)
SELECT set_config('synchronous_commit', COALESCE($18, current_setting('synchronous_commit')), true)";

impl Store {
    /// Writes a new response, its context items and first steps at once: one statement on Postgres, one
    /// transaction on the embedded store. The record may already carry its ending (a response written when
    /// it ended).
    pub async fn create_response(
        &self,
        new: &NewResponse<'_>,
        durability: Durability,
    ) -> Result<(), StoreError> {
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
        let usage = record
            .usage
            .map(|u| serde_json::to_value(u).map_err(|e| StoreError::Corrupt(e.to_string())))
            .transpose()?;
        let steps = step_rows(new.steps)?;
        let conflict =
            |e| StoreError::from_write(e, "a response with this Idempotency-Key is being created");
        match &self.backend {
            Backend::Postgres(pool) => {
                let columns = StepColumns::from(&steps);
                let query = bind_response_row!(
                    sqlx::query(PG_CREATE_RESPONSE),
                    new,
                    &params,
                    &tools,
                    &usage
                )
                .bind(&positions)
                .bind(&ids)
                .bind(&items);
                columns
                    .bind(query)
                    .bind(durability.synchronous_commit())
                    .execute(pool)
                    .await
                    .map_err(conflict)?;
            }
            Backend::Sqlite(pool) => {
                let written: Result<(), sqlx::Error> = async {
                    let mut tx = pool.begin().await?;
                    bind_response_row!(
                        sqlx::query(insert_response_row!()),
                        new,
                        &params,
                        &tools,
                        &usage
                    )
                    .execute(&mut *tx)
                    .await?;
                    for ((position, id), item) in positions.iter().zip(&ids).zip(&items) {
                        sqlx::query(
                            "INSERT INTO response_input_items (response_id, position, item_id, item)
                             VALUES ($1, $2, $3, $4)",
                        )
                        .bind(&record.id)
                        .bind(position)
                        .bind(id)
                        .bind(item)
                        .execute(&mut *tx)
                        .await?;
                    }
                    insert_step_rows!(
                        tx,
                        &record.id,
                        &steps,
                        record.created_at,
                        record.completed_at.unwrap_or(record.created_at)
                    );
                    tx.commit().await
                }
                .await;
                written.map_err(conflict)?;
            }
        }
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

    /// Writes one step boundary: new steps, changed steps and the response's ending, all or nothing.
    pub async fn write_steps(&self, write: &StepWrite<'_>) -> Result<(), StoreError> {
        let _timer = crate::metrics::StoreTimer::start(if write.ending.is_some() {
            "finish_response"
        } else {
            "write_steps"
        });
        let added = step_rows(write.added)?;
        let mut changed = Vec::with_capacity(write.changed.len());
        for step in write.changed {
            changed.push((
                step.seq as i32,
                step.state.as_str(),
                serde_json::to_value(&step.body).map_err(|e| StoreError::Corrupt(e.to_string()))?,
            ));
        }
        let ending = write.ending;
        let usage = ending
            .and_then(|e| e.usage)
            .map(|u| serde_json::to_value(u).unwrap_or(Value::Null));
        let id = write.response_id;
        let written = |e| StoreError::from_write(e, "step already recorded");
        match &self.backend {
            Backend::Postgres(pool) => {
                let columns = StepColumns::from(&added);
                let changed_seq: Vec<i32> = changed.iter().map(|c| c.0).collect();
                let changed_state: Vec<&str> = changed.iter().map(|c| c.1).collect();
                let changed_body: Vec<&Value> = changed.iter().map(|c| &c.2).collect();
                let query = sqlx::query(PG_WRITE_STEPS)
                    .bind(id)
                    .bind(write.at)
                    .bind(&changed_seq)
                    .bind(&changed_state)
                    .bind(&changed_body);
                columns
                    .bind(query)
                    .bind(ending.map(|e| e.status.as_str()))
                    .bind(&usage)
                    .bind(ending.is_some_and(|e| e.handed_back))
                    .bind(ending.and_then(|e| e.error.as_ref().map(|e| &e.0)))
                    .bind(ending.and_then(|e| e.error.as_ref().map(|e| &e.1)))
                    .bind(ending.and_then(|e| e.incomplete_reason.as_ref()))
                    .bind(write.durability.synchronous_commit())
                    .execute(pool)
                    .await
                    .map_err(written)?;
            }
            Backend::Sqlite(pool) => {
                let saved: Result<(), sqlx::Error> = async {
                let mut tx = pool.begin().await?;
                for (seq, state, body) in &changed {
                    sqlx::query(
                        "UPDATE steps SET state = $3, body = $4, updated_at = $5,
                            attempts = attempts + CASE WHEN $3 = 'running' THEN 1 ELSE 0 END
                         WHERE response_id = $1 AND seq = $2",
                    )
                    .bind(id)
                    .bind(seq)
                    .bind(state)
                    .bind(body)
                    .bind(write.at)
                    .execute(&mut *tx)
                    .await?;
                }
                insert_step_rows!(tx, id, &added, write.at, write.at);
                if let Some(ending) = ending {
                    sqlx::query(
                        "UPDATE responses SET status = $2, usage = $3, handed_back = $4, error_code = $5,
                            error_message = $6, incomplete_reason = $7, completed_at = $8, updated_at = $8
                         WHERE id = $1",
                    )
                    .bind(id)
                    .bind(ending.status.as_str())
                    .bind(&usage)
                    .bind(ending.handed_back)
                    .bind(ending.error.as_ref().map(|e| &e.0))
                    .bind(ending.error.as_ref().map(|e| &e.1))
                    .bind(&ending.incomplete_reason)
                    .bind(write.at)
                    .execute(&mut *tx)
                    .await?;
                }
                tx.commit().await
                }
                .await;
                saved.map_err(written)?;
            }
        }
        Ok(())
    }

    /// Records how a response ended, and nothing else (durably).
    pub async fn finish_response(
        &self,
        response_id: &str,
        ending: &Ending,
        completed_at: i64,
    ) -> Result<(), StoreError> {
        self.write_steps(&StepWrite {
            response_id,
            added: &[],
            changed: &[],
            ending: Some(ending),
            at: completed_at,
            durability: Durability::Flush,
        })
        .await
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

impl StepRow<'_> {
    /// A step stored in any state but pending has been started once.
    fn attempts(&self) -> i32 {
        i32::from(self.state != "pending")
    }
}

/// `StepRow`s as one array per column, for Postgres' `UNNEST`.
struct StepColumns<'a> {
    seq: Vec<i32>,
    kind: Vec<&'static str>,
    state: Vec<&'static str>,
    body: Vec<&'a Value>,
    call_id: Vec<Option<&'a str>>,
    tool_name: Vec<Option<&'a str>>,
}

impl<'a> StepColumns<'a> {
    /// Binds the six columns as the next six array parameters, in the order `UNNEST` reads them.
    fn bind(&'a self, query: PgQuery<'a>) -> PgQuery<'a> {
        query
            .bind(&self.seq)
            .bind(&self.kind)
            .bind(&self.state)
            .bind(&self.body)
            .bind(&self.call_id)
            .bind(&self.tool_name)
    }
}

/// A Postgres statement being bound.
type PgQuery<'q> = sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>;

impl<'a> From<&'a Vec<StepRow<'a>>> for StepColumns<'a> {
    fn from(rows: &'a Vec<StepRow<'a>>) -> StepColumns<'a> {
        StepColumns {
            seq: rows.iter().map(|r| r.seq).collect(),
            kind: rows.iter().map(|r| r.kind).collect(),
            state: rows.iter().map(|r| r.state).collect(),
            body: rows.iter().map(|r| &r.body).collect(),
            call_id: rows.iter().map(|r| r.call_id).collect(),
            tool_name: rows.iter().map(|r| r.tool_name).collect(),
        }
    }
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
