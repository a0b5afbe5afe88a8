//! The writes of stored responses: a response created with its context and first steps, each step boundary
//! (both through group commit, `group`: many runs' writes in one statement on Postgres, one transaction on the
//! embedded store), and the row's own changes (start, ending, cancel, delete).

use gateway_core::response::{Ending, FailureCode, ResponseRecord, ResponseState};

use super::group::{self, BoundaryRows, CreateRows, Write, Written};
use super::rows::{step_rows, to_json};
use super::{Durability, NewResponse, StepWrite, WriteOutcome};
use crate::store::governance::UsageRecord;
use crate::store::json_text::JsonText;
use crate::store::{Store, StoreError};

/// What a refused create clashed with.
pub(super) const CREATE_CONFLICT: &str = "a response with this Idempotency-Key is being created";

/// What a refused step boundary clashed with.
pub(super) const STEP_CONFLICT: &str = "step already recorded";

impl Durability {
    /// The `synchronous_commit` value for this write; `None` keeps the server's own setting.
    pub(super) fn synchronous_commit(self) -> Option<&'static str> {
        match self {
            Durability::Flush => None,
            Durability::Relaxed => Some("off"),
        }
    }
}

/// How a response ended, as the columns of its row hold it.
#[derive(Debug, Clone, Default)]
pub(super) struct EndingColumns {
    pub(super) status: Option<&'static str>,
    pub(super) handed_back: bool,
    pub(super) error_code: Option<&'static str>,
    pub(super) error_message: Option<String>,
    pub(super) incomplete_reason: Option<&'static str>,
    pub(super) completed_at: Option<i64>,
}

impl EndingColumns {
    fn of(record: &ResponseRecord) -> EndingColumns {
        let ResponseState::Ended {
            ending,
            completed_at,
        } = &record.state
        else {
            return EndingColumns::default();
        };
        let (error_code, error_message) = match ending {
            Ending::Failed { code, message } => (Some(code.as_str()), Some(message.clone())),
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

/// Usage records as the JSON array `usage_recordset!` reads.
pub(super) fn usage_json<'a>(
    records: impl IntoIterator<Item = &'a UsageRecord>,
) -> Result<JsonText, StoreError> {
    to_json(&records.into_iter().collect::<Vec<_>>())
}

/// A start of a response from its stored steps, counted ([`Store::count_resume`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Started {
    /// The starts there were, this one included.
    pub starts: i64,
    /// A cancel was asked for before this start.
    pub cancel_requested: bool,
}

impl Store {
    /// Writes a new response, its context items and first steps at once, in one batch of group commit. The
    /// record may already carry its ending (a response written when it ended).
    pub async fn create_response(
        &self,
        new: &NewResponse<'_>,
        durability: Durability,
    ) -> Result<(), StoreError> {
        let _timer = self.timed("create_response");
        let record = new.record;
        let mut items = Vec::with_capacity(new.context.len());
        for (position, item) in new.context.iter().enumerate() {
            items.push((
                position as i32,
                item.id().unwrap_or_default().to_owned(),
                to_json(item)?,
            ));
        }
        let rows = CreateRows {
            id: record.id.clone(),
            project_id: new.project_id.to_owned(),
            deployment_id: new.deployment_id.to_owned(),
            model: record.model.clone(),
            status: record.status().as_str(),
            params: to_json(&record.params)?,
            server_tools: to_json(&new.server_tools)?,
            previous_response_id: record.previous_response_id.clone(),
            store: record.store,
            background: record.background,
            created_at: record.created_at,
            idempotency_key: new.idempotency_key.map(|k| k.key.to_owned()),
            idempotency_digest: new.idempotency_key.map(|k| k.request_digest.to_owned()),
            usage: record.usage.as_ref().map(to_json).transpose()?,
            ending: EndingColumns::of(record),
            owner: new.owner.map(str::to_owned),
            deadline_in_ms: new.deadline_in_ms,
            api_key_id: new.api_key_id.map(str::to_owned),
            trace_context: new.trace_context.map(str::to_owned),
            items,
            steps: step_rows(new.steps)?,
            usage_records: new.usage.to_vec(),
        };
        match self
            .write_grouped(Write::Create(Box::new(rows)), durability)
            .await?
        {
            Written::Created => Ok(()),
            // Made by this very write, whose reply was lost, and taken over by another replica since.
            Written::Taken | Written::Boundary(_) => Err(StoreError::NotOwner),
        }
    }

    /// One write through the store's group commit, or alone when it has none.
    async fn write_grouped(
        &self,
        write: Write,
        durability: Durability,
    ) -> Result<Written, StoreError> {
        match &self.group {
            Some(group) => group.write(write, durability).await,
            // Boxed: the statements' futures are kilobytes, which every write's caller, up to the run's, would
            // otherwise hold (and move) though a store with a writer never takes this way.
            None => Box::pin(group::write_batch(
                &self.backend,
                &[&write],
                durability,
                self.reply_wait,
            ))
            .await
            .map(|mut written| written.remove(0)),
        }
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

    /// Counts one more start of running response `id` from its stored steps (a resume, or a queued response's
    /// first start) by `owner` under claim `epoch`, and answers how many there were, this one included, and
    /// whether a cancel was asked for (before this start: a cancel that no replica ran when it came).
    /// `StoreError::NotOwner` when the claim no longer holds.
    pub async fn count_resume(
        &self,
        id: &str,
        owner: &str,
        epoch: i64,
    ) -> Result<Started, StoreError> {
        let _timer = self.timed("count_resume");
        let started: Option<(i64, bool)> = with_pool!(self, |pool| {
            sqlx::query_as(
            "UPDATE responses SET resumes = resumes + 1
             WHERE id = $1 AND owner = $2 AND claim_epoch = $3 AND status IN ('queued', 'in_progress')
             RETURNING CAST(resumes AS BIGINT), cancel_requested",
        )
        .bind(id)
        .bind(owner)
        .bind(epoch)
        .fetch_optional(pool)
        .await
        })?;
        let (starts, cancel_requested) = started.ok_or(StoreError::NotOwner)?;
        Ok(Started {
            starts,
            cancel_requested,
        })
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
        self.delete_with_children(
            // The row is locked first (on Postgres): an ending written meanwhile, and an event queued meanwhile,
            // wait for the delete and then find the response gone. An event queued for an ending that was never
            // written (its replica died in between) never happened: it is superseded with the response, rather
            // than sent for it. The events of an ending that was written are kept, and sent.
            &[
                "UPDATE responses SET id = id WHERE id = $1 AND project_id = $2",
                "UPDATE webhook_deliveries SET status = 'superseded', locked_until = NULL
               WHERE response_id = $1 AND status = 'pending' AND EXISTS (
                   SELECT 1 FROM responses
                   WHERE id = $1 AND project_id = $2 AND status IN ('queued', 'in_progress'))",
            ],
            "DELETE FROM responses WHERE id = $1 AND project_id = $2",
            // No foreign key cascades to the steps and items on Postgres (migration 0016): they go explicitly.
            &[
                "DELETE FROM steps WHERE response_id = $1",
                "DELETE FROM response_input_items WHERE response_id = $1",
            ],
            id,
            project_id,
        )
        .await
    }

    /// Writes one step boundary: new steps, changed steps and the response's ending, all or nothing, in one
    /// batch of group commit.
    pub async fn write_steps(&self, write: &StepWrite<'_>) -> Result<WriteOutcome, StoreError> {
        let _timer = self.timed(if write.ended.is_some() {
            "finish_response"
        } else {
            "write_steps"
        });
        let rows = BoundaryRows {
            id: write.response_id.to_owned(),
            owner: write.owner.to_owned(),
            epoch: write.epoch,
            at: write.at,
            ending: write.ended.map(EndingColumns::of).unwrap_or_default(),
            usage: write
                .ended
                .and_then(|r| r.usage)
                .map(|u| to_json(&u))
                .transpose()?,
            notify: write.notify,
            changed: step_rows(write.changed.iter().copied())?,
            added: step_rows(write.added)?,
            usage_records: write.usage.to_vec(),
        };
        match self
            .write_grouped(Write::Boundary(Box::new(rows)), write.durability)
            .await?
        {
            Written::Boundary(Some(cancel_requested)) => Ok(WriteOutcome { cancel_requested }),
            Written::Boundary(None) | Written::Created | Written::Taken => {
                Err(StoreError::NotOwner)
            }
        }
    }
}
