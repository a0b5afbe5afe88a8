//! Stored responses: the response row, the context items it saw, and its steps.

use gateway_core::response::{Ending, FailureCode, ResponseRecord, ResponseState, ResponseStatus};
use gateway_core::steps::{Step, StepBody, StepState, Usage};
use gateway_core::{IncompleteReason, Item};
use serde_json::Value;

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
    /// call (running); every step, for a response written when it ended.
    pub steps: &'a [Step],
    /// The client's `Idempotency-Key`, unique per project.
    pub idempotency_key: Option<&'a str>,
    /// The replica that drives it; `None` for a background response left queued for any replica.
    pub owner: Option<&'a str>,
    /// How long it has until its deadline passes (milliseconds, counted from the database's clock when the row
    /// is written); `None` until it starts (a queued background response).
    pub deadline_in_ms: Option<i64>,
}

/// A response row of a project: `$1` its id, `$2` the project.
const RESPONSE_BY_ID: &str =
    "SELECT id, deployment_id, model, status, params, previous_response_id, store, background,
        handed_back, error_code, error_message, incomplete_reason, usage, created_at, completed_at
     FROM responses WHERE id = $1 AND project_id = $2";

/// The steps of a response of a project, in order: `$1` its id, `$2` the project.
const STEPS_OF_RESPONSE: &str =
    "SELECT s.seq, s.state, s.body FROM steps s JOIN responses r ON r.id = s.response_id
     WHERE s.response_id = $1 AND r.project_id = $2 ORDER BY s.seq";

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
    pub server_tools: Vec<ToolSource>,
    /// How long it has left until its deadline (milliseconds, by the database's clock; negative once passed);
    /// `None` for a queued response that has not started.
    pub deadline_in_ms: Option<i64>,
    /// Whether it was created with an `Idempotency-Key` (a repeated create may be waiting for it).
    pub keyed: bool,
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
}

/// What a step write learnt about the response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteOutcome {
    /// A cancel (or the delete of the response) asked it to stop.
    pub cancel_requested: bool,
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
/// `$1`..`$20` in the order `bind_response_row!` binds them. A deployment deleted while the response ran is
/// recorded as none, as `ON DELETE SET NULL` does for rows written earlier; `updated_at` is the ending time of a
/// response written when it ended; the deadline runs from the database's clock. Response ids are random, so a row
/// already there under the same id is this very write, made again because its reply was lost: it is written
/// over while the same replica still owns it at the first epoch, and is otherwise left alone.
macro_rules! insert_response_row {
    ($now:expr) => {
        concat!(
            "INSERT INTO responses (id, project_id, deployment_id, model, status, params, server_tools,
            previous_response_id, store, background, created_at, updated_at, idempotency_key,
            usage, handed_back, error_code, error_message, incomplete_reason, completed_at, owner, deadline_at)
         VALUES ($1, $2, (SELECT id FROM deployments WHERE id = $3), $4, $5, $6, $7, $8, $9, $10, $11,
            COALESCE($18, $11), $12, $13, $14, $15, $16, $17, $18, $19, ",
            $now,
            " + $20)
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
    }};
}

/// Postgres: the response row, its context items and its first steps, as one statement (one round trip,
/// one commit). The foreign keys of the items and steps are checked at the end of the statement, when the
/// response row exists.
const PG_CREATE_RESPONSE: &str = concat!(
    "WITH response AS (",
    insert_response_row!(pg_now_ms!()),
    "), items AS (
    INSERT INTO response_input_items (response_id, position, item_id, item)
    SELECT $1, * FROM UNNEST($21::int4[], $22::text[], $23::jsonb[])
    ON CONFLICT DO NOTHING
), added AS (
    INSERT INTO steps (response_id, seq, kind, state, body, call_id, tool_name, attempts, created_at, updated_at)
    SELECT $1, s.seq, s.kind, s.state, s.body, s.call_id, s.tool_name,
           CASE WHEN s.state = 'pending' THEN 0 ELSE 1 END, $11, COALESCE($18, $11)
    FROM UNNEST($24::int4[], $25::text[], $26::text[], $27::jsonb[], $28::text[], $29::text[])
        AS s(seq, kind, state, body, call_id, tool_name)
    ON CONFLICT (response_id, seq) DO UPDATE SET state = excluded.state, body = excluded.body,
        updated_at = excluded.updated_at
    WHERE EXISTS (SELECT 1 FROM responses r WHERE r.id = $1 AND r.owner IS NOT DISTINCT FROM $19
        AND r.claim_epoch = 0)
)
SELECT set_config('synchronous_commit', COALESCE($30, current_setting('synchronous_commit')), true)"
);

/// Postgres: one step boundary as one statement, written only while replica `$20` owns the response under the
/// claim epoch `$22` (the row is locked for the statement, so a takeover waits for it): a run that lost the
/// response writes nothing, and learns it from `cancel_requested` being NULL, even when the response came back
/// to its replica under a later claim. A step already there is this run's own write made again (its reply was
/// lost): it is written over, never a conflict. Changed steps count an attempt when they start running; the
/// response row is changed only when `$12` (its ending status) is set. With `$21`, followers of the response
/// are told it progressed.
const PG_WRITE_STEPS: &str = "
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
)
SELECT (SELECT cancel_requested FROM owned) AS cancel_requested,
       (SELECT COUNT(*) FROM notified) AS notified,
       set_config('synchronous_commit', COALESCE($18, current_setting('synchronous_commit')), true) AS commit";

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
                bind_step_columns!(query, columns)
                    .bind(durability.synchronous_commit())
                    .execute(pool)
                    .await
                    .map_err(conflict)?;
            }
            Backend::Sqlite(pool) => {
                let written: Result<(), sqlx::Error> = async {
                    let mut tx = pool.begin().await?;
                    bind_response_row!(
                        sqlx::query(insert_response_row!(sqlite_now_ms!())),
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
        let _timer = self.timed("load_response");
        let row: Option<ResponseRow> = with_pool!(self, |pool| {
            sqlx::query_as(
            "SELECT id, deployment_id, model, status, params, previous_response_id, store, background, handed_back,
                    error_code, error_message, incomplete_reason, usage, created_at, completed_at
             FROM responses WHERE id = $1 AND project_id = $2",
        )
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
        let (row, steps): (Option<ResponseRow>, Vec<StepReadRow>) = with_pool!(self, |pool| {
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
            ", idempotency_key IS NOT NULL FROM responses WHERE id = $1"
        );
        let (server_tools, deadline_in_ms, keyed): (Value, Option<i64>, bool) =
            with_pool!(self, |pool| sqlx::query_as(sql)
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
            context: self.load_context(project_id, id).await?,
            steps: self.load_steps(project_id, id).await?,
        }))
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

    /// Ends as `failed` (`code`, `message`) a running response that `owner` claimed under `epoch` but cannot
    /// resume because what is stored of it cannot be read: only the row's columns are written, nothing is parsed.
    pub async fn end_unreadable(
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
        let item: Option<Value> = with_pool!(self, |pool| sqlx::query_scalar(
            "SELECT i.item FROM response_input_items i JOIN responses r ON r.id = i.response_id
             WHERE i.item_id = $1 AND r.project_id = $2 LIMIT 1",
        )
        .bind(item_id)
        .bind(project_id)
        .fetch_optional(pool)
        .await?);
        item.map(|item| {
            serde_json::from_value(item).map_err(|e| StoreError::Corrupt(e.to_string()))
        })
        .transpose()
    }

    /// Every context item of a response of `project_id`, in order (none for another project's response).
    pub async fn load_context(
        &self,
        project_id: &str,
        response_id: &str,
    ) -> Result<Vec<Item>, StoreError> {
        let _timer = self.timed("load_context");
        let items: Vec<Value> = with_pool!(self, |pool| sqlx::query_scalar(
            "SELECT i.item FROM response_input_items i JOIN responses r ON r.id = i.response_id
             WHERE i.response_id = $1 AND r.project_id = $2 ORDER BY i.position",
        )
        .bind(response_id)
        .bind(project_id)
        .fetch_all(pool)
        .await?);
        items
            .into_iter()
            .map(|item| {
                serde_json::from_value(item).map_err(|e| StoreError::Corrupt(e.to_string()))
            })
            .collect()
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
                let position: Option<i32> = with_pool!(self, |pool| {
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
        let mut items: Vec<Value> = with_pool!(self, |pool| sqlx::query_scalar(query)
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
        let rows: Vec<StepReadRow> = with_pool!(self, |pool| {
            sqlx::query_as(
            "SELECT s.seq, s.state, s.body FROM steps s JOIN responses r ON r.id = s.response_id
             WHERE s.response_id = $1 AND r.project_id = $2 ORDER BY s.seq",
        )
        .bind(response_id)
        .bind(project_id)
        .fetch_all(pool)
        .await
        })?;
        rows.into_iter().map(Step::try_from).collect()
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
            changed.push((
                step.seq as i32,
                step.state.as_str(),
                serde_json::to_value(&step.body).map_err(|e| StoreError::Corrupt(e.to_string()))?,
            ));
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
                StepBody::Listing(_) => ("listing", None, None),
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

/// A step as read back.
#[derive(sqlx::FromRow)]
struct StepReadRow {
    seq: i32,
    state: String,
    body: Value,
}

impl TryFrom<StepReadRow> for Step {
    type Error = StoreError;

    fn try_from(row: StepReadRow) -> Result<Step, StoreError> {
        Ok(Step {
            seq: row.seq as u32,
            state: StepState::parse(&row.state)
                .ok_or_else(|| StoreError::Corrupt(format!("step state '{}'", row.state)))?,
            body: serde_json::from_value(row.body)
                .map_err(|e| StoreError::Corrupt(e.to_string()))?,
        })
    }
}

/// A response row as read back.
#[derive(sqlx::FromRow)]
struct ResponseRow {
    id: String,
    deployment_id: Option<String>,
    model: String,
    status: String,
    params: Value,
    previous_response_id: Option<String>,
    store: bool,
    background: bool,
    handed_back: bool,
    error_code: Option<String>,
    error_message: Option<String>,
    incomplete_reason: Option<String>,
    usage: Option<Value>,
    created_at: i64,
    completed_at: Option<i64>,
}

impl TryFrom<ResponseRow> for StoredResponse {
    type Error = StoreError;

    fn try_from(row: ResponseRow) -> Result<StoredResponse, StoreError> {
        let corrupt = |what: String| StoreError::Corrupt(format!("response '{}': {what}", row.id));
        let status = ResponseStatus::parse(&row.status)
            .ok_or_else(|| corrupt(format!("status '{}'", row.status)))?;
        let ending = match status {
            ResponseStatus::Queued | ResponseStatus::InProgress => None,
            ResponseStatus::Completed => Some(Ending::Completed {
                handed_back: row.handed_back,
            }),
            ResponseStatus::Cancelled => Some(Ending::Cancelled),
            ResponseStatus::Incomplete => {
                let reason = row.incomplete_reason.as_deref().unwrap_or_default();
                Some(Ending::Incomplete {
                    reason: IncompleteReason::parse(reason)
                        .ok_or_else(|| corrupt(format!("incomplete reason '{reason}'")))?,
                })
            }
            ResponseStatus::Failed => {
                let code = row.error_code.as_deref().unwrap_or_default();
                Some(Ending::Failed {
                    code: FailureCode::parse(code)
                        .ok_or_else(|| corrupt(format!("error code '{code}'")))?,
                    message: row.error_message.clone().unwrap_or_default(),
                })
            }
        };
        let state = match (ending, status) {
            (Some(ending), _) => ResponseState::Ended {
                ending,
                completed_at: row.completed_at.unwrap_or(row.created_at),
            },
            (None, ResponseStatus::Queued) => ResponseState::Queued,
            (None, _) => ResponseState::InProgress,
        };
        let params = serde_json::from_value(row.params).map_err(|e| corrupt(e.to_string()))?;
        let usage: Option<Usage> = row
            .usage
            .map(serde_json::from_value)
            .transpose()
            .map_err(|e| corrupt(e.to_string()))?;
        Ok(StoredResponse {
            record: ResponseRecord {
                id: row.id,
                created_at: row.created_at,
                model: row.model,
                params,
                previous_response_id: row.previous_response_id,
                store: row.store,
                background: row.background,
                state,
                usage,
            },
            deployment_id: row.deployment_id,
        })
    }
}
