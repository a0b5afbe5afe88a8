//! A response's own record: its parameters, where it stands (queued, in progress, or how it ended), and usage.

use serde::{Deserialize, Serialize};

use crate::decide::IncompleteReason;
use crate::request::ResponseParams;
use crate::steps::Usage;

/// A response's lifecycle status, as the API names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ResponseStatus {
    Queued,
    InProgress,
    Completed,
    Incomplete,
    Failed,
    Cancelled,
}

impl ResponseStatus {
    pub const ALL: [ResponseStatus; 6] = [
        ResponseStatus::Queued,
        ResponseStatus::InProgress,
        ResponseStatus::Completed,
        ResponseStatus::Incomplete,
        ResponseStatus::Failed,
        ResponseStatus::Cancelled,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ResponseStatus::Queued => "queued",
            ResponseStatus::InProgress => "in_progress",
            ResponseStatus::Completed => "completed",
            ResponseStatus::Incomplete => "incomplete",
            ResponseStatus::Failed => "failed",
            ResponseStatus::Cancelled => "cancelled",
        }
    }

    pub fn parse(text: &str) -> Option<ResponseStatus> {
        ResponseStatus::ALL.into_iter().find(|s| s.as_str() == text)
    }

    pub fn is_terminal(self) -> bool {
        !matches!(self, ResponseStatus::Queued | ResponseStatus::InProgress)
    }
}

/// Why a response failed, as its `error.code` says.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureCode {
    /// The upstream model failed for good, or the gateway itself did.
    #[default]
    ServerError,
    /// The upstream model refused the request as the client's problem (a 4xx other than 408/409/429): not retried,
    /// not passed to fallbacks (SPEC 8).
    UpstreamRejected,
    /// A running response could not be resumed because the deployment it ran on was deleted since (SPEC 9:
    /// nothing loops for ever).
    DeploymentGone,
    /// A running response could not be resumed because what the store holds of it cannot be read.
    UnreadableState,
    /// A running response was started from its stored steps more often than `durability.max_resumes` allows (its
    /// run crashed or panicked its replica every time, or it was handed over that often): it ends rather than loop
    /// for ever.
    ResumedTooOften,
}

impl FailureCode {
    pub const ALL: [FailureCode; 5] = [
        FailureCode::ServerError,
        FailureCode::UpstreamRejected,
        FailureCode::DeploymentGone,
        FailureCode::UnreadableState,
        FailureCode::ResumedTooOften,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            FailureCode::ServerError => "server_error",
            FailureCode::UpstreamRejected => "upstream_rejected",
            FailureCode::DeploymentGone => "deployment_gone",
            FailureCode::UnreadableState => "unreadable_state",
            FailureCode::ResumedTooOften => "resumed_too_often",
        }
    }

    /// The OpenAI error `type` of a failure with this code: the client's problem or the server's.
    pub fn error_type(self) -> &'static str {
        match self {
            FailureCode::ServerError
            | FailureCode::DeploymentGone
            | FailureCode::UnreadableState
            | FailureCode::ResumedTooOften => "server_error",
            FailureCode::UpstreamRejected => "invalid_request_error",
        }
    }

    pub fn is_server_error(&self) -> bool {
        *self == FailureCode::ServerError
    }

    pub fn parse(text: &str) -> Option<FailureCode> {
        FailureCode::ALL.into_iter().find(|c| c.as_str() == text)
    }
}

/// How a response ended: the one terminal state, whatever ended it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum Ending {
    /// The model answered; `handed_back` when its last batch of tool calls went to the client.
    Completed {
        handed_back: bool,
    },
    /// A limit was reached, the model stopped short, or the stream's client left.
    Incomplete {
        reason: IncompleteReason,
    },
    Failed {
        code: FailureCode,
        message: String,
    },
    Cancelled,
}

impl Ending {
    pub fn status(&self) -> ResponseStatus {
        match self {
            Ending::Completed { .. } => ResponseStatus::Completed,
            Ending::Incomplete { .. } => ResponseStatus::Incomplete,
            Ending::Failed { .. } => ResponseStatus::Failed,
            Ending::Cancelled => ResponseStatus::Cancelled,
        }
    }

    /// Whether the last batch of tool calls was handed to the client as `function_call` items.
    pub fn handed_back(&self) -> bool {
        matches!(self, Ending::Completed { handed_back: true })
    }

    /// A failure of the gateway or its upstream, with the message clients see.
    pub fn server_error(message: impl Into<String>) -> Ending {
        Ending::Failed {
            code: FailureCode::ServerError,
            message: message.into(),
        }
    }
}

/// Where a response stands.
#[derive(Debug, Clone, PartialEq)]
pub enum ResponseState {
    /// A background response that no worker has started yet.
    Queued,
    InProgress,
    Ended {
        ending: Ending,
        completed_at: i64,
    },
}

impl ResponseState {
    pub fn status(&self) -> ResponseStatus {
        match self {
            ResponseState::Queued => ResponseStatus::Queued,
            ResponseState::InProgress => ResponseStatus::InProgress,
            ResponseState::Ended { ending, .. } => ending.status(),
        }
    }

    pub fn ending(&self) -> Option<&Ending> {
        match self {
            ResponseState::Ended { ending, .. } => Some(ending),
            ResponseState::Queued | ResponseState::InProgress => None,
        }
    }
}

/// What a response says about itself, apart from its items.
#[derive(Debug, Clone, PartialEq)]
pub struct ResponseRecord {
    pub id: String,
    pub created_at: i64,
    pub model: String,
    pub params: ResponseParams,
    pub previous_response_id: Option<String>,
    pub store: bool,
    pub background: bool,
    pub state: ResponseState,
    /// The summed usage of its model calls, once it ended.
    pub usage: Option<Usage>,
}

impl ResponseRecord {
    pub fn status(&self) -> ResponseStatus {
        self.state.status()
    }

    pub fn ending(&self) -> Option<&Ending> {
        self.state.ending()
    }

    /// Records how the response ended.
    pub fn end(&mut self, ending: Ending, usage: Usage, completed_at: i64) {
        self.state = ResponseState::Ended {
            ending,
            completed_at,
        };
        self.usage = Some(usage);
    }

    /// The record as it was when the response started: what `response.created` showed.
    pub fn as_started(&self) -> ResponseRecord {
        ResponseRecord {
            state: if self.background {
                ResponseState::Queued
            } else {
                ResponseState::InProgress
            },
            usage: None,
            ..self.clone()
        }
    }

    /// The record while its loop runs: what `response.in_progress` showed.
    pub fn as_in_progress(&self) -> ResponseRecord {
        ResponseRecord {
            state: ResponseState::InProgress,
            usage: None,
            ..self.clone()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_and_failure_codes_round_trip_through_their_wire_names() {
        for status in ResponseStatus::ALL {
            assert_eq!(ResponseStatus::parse(status.as_str()), Some(status));
        }
        for code in FailureCode::ALL {
            assert_eq!(FailureCode::parse(code.as_str()), Some(code));
        }
        assert_eq!(ResponseStatus::parse("done"), None);
    }

    #[test]
    fn each_ending_has_its_status_and_only_a_completed_one_may_hand_back() {
        let table = [
            (
                Ending::Completed { handed_back: true },
                ResponseStatus::Completed,
                true,
            ),
            (
                Ending::Completed { handed_back: false },
                ResponseStatus::Completed,
                false,
            ),
            (
                Ending::Incomplete {
                    reason: IncompleteReason::ClientDisconnected,
                },
                ResponseStatus::Incomplete,
                false,
            ),
            (Ending::server_error("boom"), ResponseStatus::Failed, false),
            (Ending::Cancelled, ResponseStatus::Cancelled, false),
        ];
        for (ending, status, handed_back) in table {
            assert_eq!(ending.status(), status, "{ending:?}");
            assert!(status.is_terminal());
            assert_eq!(ending.handed_back(), handed_back, "{ending:?}");
        }
    }
}
