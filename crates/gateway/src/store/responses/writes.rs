//! The writes of stored responses: a response created with its context and first steps, each step boundary,
//! and the row's own changes (start, ending, cancel, delete). Postgres writes each in one statement; the embedded
//! store in one transaction.

use gateway_core::response::{Ending, FailureCode, ResponseRecord, ResponseState};
use serde_json::Value;

use super::rows::{step_rows, to_json, StepColumns};
use super::{Durability, NewResponse, StepWrite, WriteOutcome};
use crate::store::governance::UsageRecord;
use crate::store::{Backend, Store, StoreError};

impl Durability {
    /// The `synchronous_commit` value for this write; `None` keeps the server's own setting.
    fn synchronous_commit(self) -> Option<&'static str> {
        match self {
            Durability::Flush => None,
            Durability::Relaxed => Some("off"),
        }
    }
}

/// How a response ended, as the columns of its row hold it.
#[derive(Debug, Clone, Copy, Default)]
struct EndingColumns<'a> {
    status: Option<&'static str>,
    handed_back: bool,
    error_code: Option<&'static str>,
    error_message: Option<&'a str>,
    incomplete_reason: Option<&'static str>,
    completed_at: Option<i64>,
}

impl<'a> EndingColumns<'a> {
    fn of(record: &'a ResponseRecord) -> EndingColumns<'a> {
        let ResponseState::Ended {
            ending,
            completed_at,
        } = &record.state
        else {
            return EndingColumns::default();
        };
        let (error_code, error_message) = match ending {
            Ending::Failed { code, message } => (Some(code.as_str()), Some(message.as_str())),
            _ => (None, None),
        };
        EndingColumns {
            status: Some(ending.status().as_str()),
            handed_back: ending.handed_back(),
            error_code,
            error_message,
            incomplete_reason: match ending {
                Ending::Incomplete { reason } => Some(reason.as_str()),
                _ => None,
            },
            completed_at: Some(*completed_at),
        }
    }
}

/// Inserts `StepRow`s inside `$tx`, a SQLite transaction.
macro_rules! insert_step_rows {
    ($tx:ident, $response_id:expr, $rows:expr, $created:expr, $updated:expr) => {
        for row in $rows {
            sqlx::query(
                "INSERT INTO steps (response_id, seq, kind, state, body, call_id, tool_name, attempts, created_at, updated_at)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
                 ON CONFLICT (response_id, seq) DO UPDATE SET state = excluded.state, body = excluded.body,
                    updated_at = excluded.updated_at",
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

/// Binds a `StepColumns`' six columns as the next six array parameters of `$query`, in the order `UNNEST` reads
/// them (a macro, because sqlx's statement types have no common trait for `bind`).
macro_rules! bind_step_columns {
    ($query:expr, $columns:expr) => {{
        let columns = &$columns;
        $query
            .bind(&columns.seq)
            .bind(&columns.kind)
            .bind(&columns.state)
            .bind(&columns.body)
            .bind(&columns.call_id)
            .bind(&columns.tool_name)
    }};
}

/// The response row's insert, shared by both backends (`$now` the database clock in milliseconds): parameters
/// `$1`..`$21` in the order `bind_response_row!` binds them, and `$trace` the response's trace context. A deployment deleted while the response ran is
/// recorded as none, as `ON DELETE SET NULL` does for rows written earlier; `updated_at` is the ending time of a
/// response written when it ended; the deadline runs from the database's clock. Response ids are random, so a row
/// already there under the same id is this very write, made again because its reply was lost: it is written
/// over while the same replica still owns it at the first epoch, and is otherwise left alone.
macro_rules! insert_response_row {
    ($now:expr, $trace:literal) => {
        concat!(
            "INSERT INTO responses (id, project_id, deployment_id, model, status, params, server_tools,
            previous_response_id, store, background, created_at, updated_at, idempotency_key,
            usage, handed_back, error_code, error_message, incomplete_reason, completed_at, owner, deadline_at,
            api_key_id, trace_context)
         VALUES ($1, $2, (SELECT id FROM deployments WHERE id = $3), $4, $5, $6, $7, $8, $9, $10, $11,
            COALESCE($18, $11), $12, $13, $14, $15, $16, $17, $18, $19, ",
            $now,
            " + $20, $21, ",
            $trace,
            ")
         ON CONFLICT (id) DO UPDATE SET status = excluded.status, usage = excluded.usage,
            handed_back = excluded.handed_back, error_code = excluded.error_code,
            error_message = excluded.error_message, incomplete_reason = excluded.incomplete_reason,
            completed_at = excluded.completed_at, updated_at = excluded.updated_at
         WHERE responses.owner IS NOT DISTINCT FROM excluded.owner AND responses.claim_epoch = 0"
        )
    };
}

/// Binds `insert_response_row!`'s parameters.
macro_rules! bind_response_row {
    ($query:expr, $new:expr, $params:expr, $tools:expr, $usage:expr) => {{
        let new = $new;
        let record = new.record;
        let ended = EndingColumns::of(record);
        $query
            .bind(&record.id)
            .bind(new.project_id)
            .bind(new.deployment_id)
            .bind(&record.model)
            .bind(record.status().as_str())
            .bind($params)
            .bind($tools)
            .bind(&record.previous_response_id)
            .bind(record.store)
            .bind(record.background)
            .bind(record.created_at)
            .bind(new.idempotency_key)
            .bind($usage)
            .bind(ended.handed_back)
            .bind(ended.error_code)
            .bind(ended.error_message)
            .bind(ended.incomplete_reason)
            .bind(ended.completed_at)
            .bind(new.owner)
            .bind(new.deadline_in_ms)
            .bind(new.api_key_id)
    }};
}

/// Postgres: the response row, its context items and its first steps, as one statement (one round trip,
/// one commit). The foreign keys of the items and steps are checked at the end of the statement, when the
/// response row exists.
const PG_CREATE_RESPONSE: &str = concat!(
    "WITH response AS (",
    insert_response_row!(pg_now_ms!(), "$33"),
    "), items AS (
    INSERT INTO response_input_items (response_id, position, item_id, item)
    SELECT $1, * FROM UNNEST($22::int4[], $23::text[], $24::jsonb[])
    ON CONFLICT DO NOTHING
), added AS (
    INSERT INTO steps (response_id, seq, kind, state, body, call_id, tool_name, attempts, created_at, updated_at)
    SELECT $1, s.seq, s.kind, s.state, s.body, s.call_id, s.tool_name,
           CASE WHEN s.state = 'pending' THEN 0 ELSE 1 END, $11, COALESCE($18, $11)
    FROM UNNEST($25::int4[], $26::text[], $27::text[], $28::jsonb[], $29::text[], $30::text[])
        AS s(seq, kind, state, body, call_id, tool_name)
    ON CONFLICT (response_id, seq) DO UPDATE SET state = excluded.state, body = excluded.body,
        updated_at = excluded.updated_at
    WHERE EXISTS (SELECT 1 FROM responses r WHERE r.id = $1 AND r.owner IS NOT DISTINCT FROM $19
        AND r.claim_epoch = 0)
), usage AS (
    INSERT INTO usage_records SELECT * FROM ",
    usage_recordset!("$32"),
    " ON CONFLICT DO NOTHING
)
SELECT set_config('synchronous_commit', COALESCE($31, current_setting('synchronous_commit')), true)"
);

/// Postgres: one step boundary as one statement, written only while replica `$20` owns the response under the
/// claim epoch `$22` (the row is locked for the statement, so a takeover waits for it): a run that lost the
/// response writes nothing, and learns it from `cancel_requested` being NULL, even when the response came back
/// to its replica under a later claim. A step already there is this run's own write made again (its reply was
/// lost): it is written over, never a conflict. Changed steps count an attempt when they start running; the
/// response row is changed only when `$12` (its ending status) is set. With `$21`, followers of the response
/// are told it progressed.
const PG_WRITE_STEPS: &str = concat!(
    "
WITH owned AS (
    SELECT cancel_requested FROM responses WHERE id = $1 AND owner = $20 AND claim_epoch = $22 FOR UPDATE
), changed AS (
    UPDATE steps SET state = u.state, body = u.body, updated_at = $2,
        attempts = steps.attempts + CASE WHEN u.state = 'running' THEN 1 ELSE 0 END
    FROM UNNEST($3::int4[], $4::text[], $5::jsonb[]) AS u(seq, state, body)
    WHERE steps.response_id = $1 AND steps.seq = u.seq AND EXISTS (SELECT 1 FROM owned)
), added AS (
    INSERT INTO steps (response_id, seq, kind, state, body, call_id, tool_name, attempts, created_at, updated_at)
    SELECT $1, s.seq, s.kind, s.state, s.body, s.call_id, s.tool_name,
           CASE WHEN s.state = 'pending' THEN 0 ELSE 1 END, $2, $2
    FROM UNNEST($6::int4[], $7::text[], $8::text[], $9::jsonb[], $10::text[], $11::text[])
        AS s(seq, kind, state, body, call_id, tool_name)
    WHERE EXISTS (SELECT 1 FROM owned)
    ON CONFLICT (response_id, seq) DO UPDATE SET state = excluded.state, body = excluded.body,
        updated_at = excluded.updated_at
), ended AS (
    UPDATE responses SET status = $12, usage = $13, handed_back = $14, error_code = $15, error_message = $16,
        incomplete_reason = $17, completed_at = $19, updated_at = $2
    WHERE id = $1 AND $12::text IS NOT NULL AND EXISTS (SELECT 1 FROM owned)
), notified AS (
    SELECT pg_notify('gateway_progress', $1) FROM owned WHERE $21
), usage AS (
    INSERT INTO usage_records SELECT * FROM ",
    usage_recordset!("$23"),
    " WHERE EXISTS (SELECT 1 FROM owned) ON CONFLICT DO NOTHING
)
SELECT (SELECT cancel_requested FROM owned) AS cancel_requested,
       (SELECT COUNT(*) FROM notified) AS notified,
       set_config('synchronous_commit', COALESCE($18, current_setting('synchronous_commit')), true) AS commit"
);

/// Usage records as the JSON array `usage_recordset!` reads.
fn usage_json(records: &[UsageRecord]) -> Value {
    serde_json::to_value(records).unwrap_or_else(|_| Value::Array(Vec::new()))
}

impl Store {
    /// Writes a new response, its context items and first steps at once: one statement on Postgres, one
    /// transaction on the embedded store. The record may already carry its ending (a response written when
    /// it ended).
    pub async fn create_response(
        &self,
        new: &NewResponse<'_>,
        durability: Durability,
    ) -> Result<(), StoreError> {
        let _timer = self.timed("create_response");
        let record = new.record;
        let params = to_json(&record.params)?;
        let tools = to_json(&new.server_tools)?;
        let mut positions = Vec::with_capacity(new.context.len());
        let mut ids = Vec::with_capacity(new.context.len());
        let mut items = Vec::with_capacity(new.context.len());
        for (position, item) in new.context.iter().enumerate() {
            positions.push(position as i32);
            ids.push(item.id().unwrap_or_default().to_owned());
            items.push(to_json(item)?);
        }
        let usage = record.usage.as_ref().map(to_json).transpose()?;
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
                bind_step_columns!(query, columns)
                    .bind(durability.synchronous_commit())
                    .bind(usage_json(new.usage))
                    .bind(new.trace_context)
                    .execute(pool)
                    .await
                    .map_err(conflict)?;
            }
            Backend::Sqlite(pool) => {
                let written: Result<(), sqlx::Error> = async {
                    let mut tx = pool.begin().await?;
                    bind_response_row!(
                        sqlx::query(insert_response_row!(sqlite_now_ms!(), "$22")),
                        new,
                        &params,
                        &tools,
                        &usage
                    )
                    .bind(new.trace_context)
                    .execute(&mut *tx)
                    .await?;
                    for ((position, id), item) in positions.iter().zip(&ids).zip(&items) {
                        sqlx::query(
                            "INSERT INTO response_input_items (response_id, position, item_id, item)
                             VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING",
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
                        EndingColumns::of(record)
                            .completed_at
                            .unwrap_or(record.created_at)
                    );
                    insert_usage_rows!(tx, new.usage);
                    tx.commit().await
                }
                .await;
                written.map_err(conflict)?;
            }
        }
        Ok(())
    }

    /// Starts a queued background response that `owner` took under claim `epoch`: it is in progress from now,
    /// with its deadline `deadline_in_ms` from now by the database's clock. Answers whether a cancel already asked
    /// it to stop; `NotOwner` when the run no longer drives it.
    pub async fn start_queued(
        &self,
        id: &str,
        owner: &str,
        epoch: i64,
        deadline_in_ms: i64,
    ) -> Result<bool, StoreError> {
        let sql = with_clock!(
            self,
            "UPDATE responses SET status = 'in_progress', deadline_at = ",
            " + $4 WHERE id = $1 AND owner = $2 AND claim_epoch = $3 AND status IN ('queued', 'in_progress')
             RETURNING cancel_requested"
        );
        let cancel_requested: Option<bool> = with_pool!(self, |pool| sqlx::query_scalar(sql)
            .bind(id)
            .bind(owner)
            .bind(epoch)
            .bind(deadline_in_ms)
            .fetch_optional(pool)
            .await)?;
        cancel_requested.ok_or(StoreError::NotOwner)
    }

    /// Ends as `failed` (`code`, `message`) a running response that `owner` drives under claim `epoch`, writing
    /// only the row's columns and parsing nothing: for a response whose stored state cannot be read back, and for
    /// a failure that could not be recorded together with its steps.
    pub async fn end_failed_without_steps(
        &self,
        id: &str,
        owner: &str,
        epoch: i64,
        code: &FailureCode,
        message: &str,
        at: i64,
    ) -> Result<(), StoreError> {
        with_pool!(self, |pool| {
            sqlx::query(
            "UPDATE responses SET status = 'failed', error_code = $4, error_message = $5, completed_at = $6,
                updated_at = $6
             WHERE id = $1 AND owner = $2 AND claim_epoch = $3 AND status IN ('queued', 'in_progress')",
        )
        .bind(id)
        .bind(owner)
        .bind(epoch)
        .bind(code.as_str())
        .bind(message)
        .bind(at)
        .execute(pool)
        .await
        .map(|done| done.rows_affected())
        })?;
        Ok(())
    }

    /// Ends as `cancelled` a queued background response of `project_id` that no replica took: nobody else will.
    /// `false` when it is not (or no longer) such a response.
    pub async fn cancel_queued(
        &self,
        project_id: &str,
        id: &str,
        at: i64,
    ) -> Result<bool, StoreError> {
        let ended = with_pool!(self, |pool| sqlx::query(
            "UPDATE responses SET status = 'cancelled', completed_at = $3, updated_at = $3
             WHERE id = $1 AND project_id = $2 AND status = 'queued' AND owner IS NULL",
        )
        .bind(id)
        .bind(project_id)
        .bind(at)
        .execute(pool)
        .await
        .map(|done| done.rows_affected()))?;
        Ok(ended > 0)
    }

    /// Deletes a response with its items and steps; `false` when there was none for this project.
    pub async fn delete_response(&self, project_id: &str, id: &str) -> Result<bool, StoreError> {
        let _timer = self.timed("delete_response");
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

    /// Writes one step boundary: new steps, changed steps and the response's ending, all or nothing.
    pub async fn write_steps(&self, write: &StepWrite<'_>) -> Result<WriteOutcome, StoreError> {
        let _timer = self.timed(if write.ended.is_some() {
            "finish_response"
        } else {
            "write_steps"
        });
        let added = step_rows(write.added)?;
        let mut changed = Vec::with_capacity(write.changed.len());
        for step in write.changed {
            changed.push((step.seq as i32, step.state.as_str(), to_json(&step.body)?));
        }
        let ended = write.ended.map(EndingColumns::of).unwrap_or_default();
        let usage = write
            .ended
            .and_then(|r| r.usage)
            .map(|u| serde_json::to_value(u).unwrap_or(Value::Null));
        let id = write.response_id;
        let written = |e| StoreError::from_write(e, "step already recorded");
        let cancel_requested: Option<bool> = match &self.backend {
            Backend::Postgres(pool) => {
                let columns = StepColumns::from(&added);
                let changed_seq: Vec<i32> = changed.iter().map(|c| c.0).collect();
                let changed_state: Vec<&str> = changed.iter().map(|c| c.1).collect();
                let changed_body: Vec<&Value> = changed.iter().map(|c| &c.2).collect();
                let query = sqlx::query_scalar(PG_WRITE_STEPS)
                    .bind(id)
                    .bind(write.at)
                    .bind(&changed_seq)
                    .bind(&changed_state)
                    .bind(&changed_body);
                bind_step_columns!(query, columns)
                    .bind(ended.status)
                    .bind(&usage)
                    .bind(ended.handed_back)
                    .bind(ended.error_code)
                    .bind(ended.error_message)
                    .bind(ended.incomplete_reason)
                    .bind(write.durability.synchronous_commit())
                    .bind(ended.completed_at)
                    .bind(write.owner)
                    .bind(write.notify)
                    .bind(write.epoch)
                    .bind(usage_json(write.usage))
                    .fetch_one(pool)
                    .await
                    .map_err(written)?
            }
            Backend::Sqlite(pool) => {
                let saved: Result<Option<bool>, sqlx::Error> = async {
                    let mut tx = pool.begin().await?;
                    // The ownership check writes the row first, so that the transaction holds the write lock from
                    // its first statement.
                    let owned: Option<bool> = sqlx::query_scalar(
                        "UPDATE responses SET updated_at = $3 WHERE id = $1 AND owner = $2 AND claim_epoch = $4
                         RETURNING cancel_requested",
                    )
                    .bind(id)
                    .bind(write.owner)
                    .bind(write.at)
                    .bind(write.epoch)
                    .fetch_optional(&mut *tx)
                    .await?;
                    if owned.is_none() {
                        return Ok(None);
                    }
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
                    insert_usage_rows!(tx, write.usage);
                    if let Some(status) = ended.status {
                        sqlx::query(
                            "UPDATE responses SET status = $2, usage = $3, handed_back = $4, error_code = $5,
                                error_message = $6, incomplete_reason = $7, completed_at = $8, updated_at = $9
                             WHERE id = $1",
                        )
                        .bind(id)
                        .bind(status)
                        .bind(&usage)
                        .bind(ended.handed_back)
                        .bind(ended.error_code)
                        .bind(ended.error_message)
                        .bind(ended.incomplete_reason)
                        .bind(ended.completed_at)
                        .bind(write.at)
                        .execute(&mut *tx)
                        .await?;
                    }
                    tx.commit().await?;
                    Ok(owned)
                }
                .await;
                saved.map_err(written)?
            }
        };
        match cancel_requested {
            Some(cancel_requested) => Ok(WriteOutcome { cancel_requested }),
            None => Err(StoreError::NotOwner),
        }
    }
}
