//! Stored responses as their tables hold them: the rows read back and their conversions, the steps as written
//! (and as one array per column for Postgres' `UNNEST`), and the JSON columns.

use gateway_core::response::{Ending, FailureCode, ResponseRecord, ResponseState, ResponseStatus};
use gateway_core::steps::{Step, StepBody, StepState, Usage};
use gateway_core::IncompleteReason;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

use super::StoredResponse;
use crate::store::json_text::JsonText;
use crate::store::StoreError;

/// A response row of a project: `$1` its id, `$2` the project.
pub(super) const RESPONSE_BY_ID: &str =
    "SELECT id, deployment_id, model, status, params, previous_response_id, store, background,
        handed_back, error_code, error_message, incomplete_reason, usage, created_at, completed_at
     FROM responses WHERE id = $1 AND project_id = $2";

/// The steps of a response of a project, in order: `$1` its id, `$2` the project.
pub(super) const STEPS_OF_RESPONSE: &str =
    "SELECT s.seq, s.state, s.body FROM steps s JOIN responses r ON r.id = s.response_id
     WHERE s.response_id = $1 AND r.project_id = $2 ORDER BY s.seq";

/// A step as the `steps` table holds it, owned, so that a batch of writes can carry it to the writer.
#[derive(Debug)]
pub(super) struct StepRow {
    pub(super) seq: i32,
    pub(super) kind: &'static str,
    pub(super) state: &'static str,
    pub(super) body: JsonText,
    pub(super) call_id: Option<String>,
    pub(super) tool_name: Option<String>,
}

impl StepRow {
    /// A step stored in any state but pending has been started once.
    pub(super) fn attempts(&self) -> i32 {
        i32::from(self.state != "pending")
    }
}

/// The rows of `steps`, as written.
pub(super) fn step_rows<'a>(
    steps: impl IntoIterator<Item = &'a Step>,
) -> Result<Vec<StepRow>, StoreError> {
    steps
        .into_iter()
        .map(|step| {
            let (kind, call_id, tool_name) = match &step.body {
                StepBody::Model(_) => ("model", None, None),
                StepBody::Listing(_) => ("listing", None, None),
                StepBody::Tool(tool) => (
                    "tool",
                    Some(tool.call.call_id.clone()),
                    Some(tool.call.name.clone()),
                ),
            };
            Ok(StepRow {
                seq: step.seq as i32,
                kind,
                state: step.state.as_str(),
                body: to_json(&step.body)?,
                call_id,
                tool_name,
            })
        })
        .collect()
}

/// A step as read back.
#[derive(sqlx::FromRow)]
pub(super) struct StepReadRow {
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
            body: from_json(row.body)?,
        })
    }
}

/// A response row as read back.
#[derive(sqlx::FromRow)]
pub(super) struct ResponseRow {
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

/// `value` as a JSON column; a value that cannot be written as JSON is corrupt.
pub(super) fn to_json<T: Serialize + ?Sized>(value: &T) -> Result<JsonText, StoreError> {
    JsonText::of(value).map_err(|e| StoreError::Corrupt(e.to_string()))
}

/// A JSON column read back as `T`; one that does not read is corrupt.
pub(super) fn from_json<T: DeserializeOwned>(value: Value) -> Result<T, StoreError> {
    serde_json::from_value(value).map_err(|e| StoreError::Corrupt(e.to_string()))
}
