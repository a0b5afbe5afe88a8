//! `ApiError`: every non-2xx answer, rendered in OpenAI's `{"error": {...}}` shape.

use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use gateway_core::context::PairingError;
use gateway_core::request::InvalidRequest;
use serde_json::json;

use crate::engine::EngineError;
use crate::store::StoreError;

/// An error answer: status, OpenAI error fields, and whether SDKs may retry it.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    pub kind: &'static str,
    pub message: String,
    pub param: Option<String>,
    pub code: Option<String>,
    /// Whether an SDK may retry the same request (`x-should-retry`).
    pub retryable: bool,
    /// Seconds to wait before retrying (`Retry-After`), when the gateway knows.
    pub retry_after_secs: Option<u64>,
    /// The standings a `429` tells in its `x-ratelimit-*` headers (boxed: most errors have none).
    pub rate_limits: Option<Box<crate::governance::RateHeaders>>,
}

impl ApiError {
    pub fn invalid(
        message: impl Into<String>,
        param: Option<&str>,
        code: Option<&str>,
    ) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            kind: "invalid_request_error",
            message: message.into(),
            param: param.map(str::to_owned),
            code: code.map(str::to_owned),
            retryable: false,
            retry_after_secs: None,
            rate_limits: None,
        }
    }

    pub fn not_found(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::NOT_FOUND,
            ..ApiError::invalid(message, None, None)
        }
    }

    pub fn response_not_found(id: &str) -> ApiError {
        ApiError::not_found(format!("Response with id '{id}' not found."))
    }

    /// No conversation `id` in the caller's project; `param` names where the request gave it.
    pub fn conversation_not_found(id: &str, param: &str) -> ApiError {
        ApiError {
            param: Some(param.to_owned()),
            code: Some("conversation_not_found".to_owned()),
            ..ApiError::not_found(format!("Conversation with id '{id}' not found."))
        }
    }

    pub fn unauthorized(message: impl Into<String>, code: Option<&str>) -> ApiError {
        ApiError {
            status: StatusCode::UNAUTHORIZED,
            ..ApiError::invalid(message, None, code)
        }
    }

    pub fn conflict(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::CONFLICT,
            ..ApiError::invalid(message, None, Some("conflict"))
        }
    }

    /// A create whose `Idempotency-Key` is still being answered: SDKs retry 409, which is what we want.
    pub fn idempotency_in_progress() -> ApiError {
        ApiError {
            retryable: true,
            ..ApiError::conflict(
                "A request with this Idempotency-Key is still running; retry shortly.",
            )
        }
    }

    /// A create repeated under an `Idempotency-Key` whose first create (of response `first`) sent another body.
    pub fn idempotency_key_reused(first: &str) -> ApiError {
        ApiError::invalid(
            format!(
                "This Idempotency-Key was first used with a different request body (it created response \
                 '{first}'); a new request needs a new key."
            ),
            None,
            Some("idempotency_key_reused"),
        )
    }

    pub fn payload_too_large(limit: usize) -> ApiError {
        ApiError {
            status: StatusCode::PAYLOAD_TOO_LARGE,
            ..ApiError::invalid(
                format!("The request body is larger than the limit of {limit} bytes."),
                None,
                Some("request_too_large"),
            )
        }
    }

    /// A URL longer than the gateway reads (`414`); `length` when it was read, to say how long it was.
    pub fn url_too_long(length: Option<usize>) -> ApiError {
        let limit = super::MAX_URL_BYTES;
        let message = match length {
            Some(length) => format!(
                "The request URL is {length} bytes long; the gateway reads URLs of at most {limit} bytes."
            ),
            None => format!(
                "The request URL is too long; the gateway reads URLs of at most {limit} bytes."
            ),
        };
        ApiError {
            status: StatusCode::URI_TOO_LONG,
            ..ApiError::invalid(message, None, Some("url_too_long"))
        }
    }

    /// Request headers larger than the gateway reads (`431`); `size` when they were read, to say how large.
    pub fn headers_too_large(size: Option<usize>) -> ApiError {
        let limit = super::MAX_HEADER_BYTES;
        let count = super::MAX_HEADERS;
        let message = match size {
            Some(size) => format!(
                "The request headers are {size} bytes; the gateway reads at most {limit} bytes of headers."
            ),
            None => format!(
                "The request's URL and headers are too large to read; the gateway reads URLs of at most {} bytes, at most {limit} bytes of headers, and at most {count} headers.",
                super::MAX_URL_BYTES
            ),
        };
        ApiError {
            status: StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            ..ApiError::invalid(message, None, Some("headers_too_large"))
        }
    }

    /// The body of this error: `{"error": {"message", "type", "param", "code"}}`.
    pub fn body(&self) -> serde_json::Value {
        let code = self
            .code
            .as_deref()
            .unwrap_or_else(|| default_code(self.status));
        json!({"error": {"message": self.message, "type": self.kind, "param": self.param, "code": code}})
    }

    /// A fault of ours or of the upstream; the detail is logged where it happened, never returned.
    /// Response `id`'s run ended without an answer (it panicked); a stored response is resumed from its stored
    /// steps.
    pub fn run_panicked(id: &str) -> ApiError {
        ApiError::server(format!(
            "The gateway failed while running response '{id}'; when stored, it is resumed: read it with GET /v1/responses/{id}."
        ))
    }

    pub fn server(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            kind: "server_error",
            message: message.into(),
            param: None,
            code: Some("server_error".into()),
            retryable: false,
            retry_after_secs: None,
            rate_limits: None,
        }
    }

    /// The gateway has no room for this request now; nothing was done, and SDKs retry it after a pause.
    pub fn overloaded(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            code: Some("server_overloaded".into()),
            retryable: true,
            retry_after_secs: Some(1),
            ..ApiError::server(message)
        }
    }
}

impl From<InvalidRequest> for ApiError {
    fn from(e: InvalidRequest) -> ApiError {
        ApiError::invalid(e.message, e.param.as_deref(), e.code.as_deref())
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> ApiError {
        match e {
            StoreError::NotFound => ApiError::not_found("Not found."),
            StoreError::Conflict(what) => ApiError::conflict(what),
            StoreError::Busy => {
                tracing::warn!("no store connection became free in time");
                ApiError::overloaded("The gateway's store is busy; retry shortly.")
            }
            other => {
                tracing::error!(error = %other, "store failed");
                ApiError {
                    retryable: true,
                    ..ApiError::server("The gateway's store failed; please try again.")
                }
            }
        }
    }
}

impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> ApiError {
        match e {
            EngineError::Overloaded => ApiError::overloaded(
                "The gateway is running as many responses as it may at once; retry shortly.",
            ),
            EngineError::ShuttingDown => ApiError::overloaded(
                "This gateway is shutting down; retry shortly (another replica takes the request).",
            ),
            // Another replica finishes the response from its stored steps; a create with an Idempotency-Key
            // (or one of which nothing was stored) may be sent again, and then answers its end.
            EngineError::HandedOver {
                response_id,
                retry_safe,
            } => ApiError {
                retryable: retry_safe,
                ..ApiError::server(format!(
                    "Response '{response_id}' was handed over to another replica before it ended; read it with GET /v1/responses/{response_id}."
                ))
            },
            EngineError::Deleted { response_id } => {
                ApiError::not_found(format!("Response '{response_id}' was deleted while it ran."))
            }
            EngineError::ModelNotFound { model } => ApiError {
                status: StatusCode::NOT_FOUND,
                ..ApiError::invalid(
                    format!("The model '{model}' does not exist or you do not have access to it."),
                    Some("model"),
                    Some("model_not_found"),
                )
            },
            EngineError::ToolNameConflict { name, index } => ApiError::invalid(
                format!("Tool '{name}' clashes with a server tool of the same name that this key may use; rename the client tool."),
                Some(&format!("tools[{index}].name")),
                Some("tool_name_conflict"),
            ),
            EngineError::UnsupportedTool { kind, index } => ApiError::invalid(
                format!("Tools of type '{kind}' are not supported by this deployment (its 'unsupported_tools' policy is 'reject'); remove the tool or use another model."),
                Some(&format!("tools[{index}].type")),
                Some("unsupported_tool_type"),
            ),
            EngineError::UnsupportedParam { param } => ApiError::invalid(
                format!("'{param}' is not supported by this deployment's provider (its 'unsupported_params' policy is 'reject'); leave it out or use another model."),
                Some(param),
                Some("unsupported_parameter"),
            ),
            EngineError::RemoteMcpRefused { index, message } => ApiError::invalid(
                format!("The MCP server of 'tools[{index}]' may not be used: {message}."),
                Some(&format!("tools[{index}].server_url")),
                Some("mcp_server_not_allowed"),
            ),
            // As OpenAI answers a server that does not list: 424, the request depended on it.
            EngineError::RemoteMcpUnlisted { index, message } => ApiError {
                status: StatusCode::FAILED_DEPENDENCY,
                kind: "external_connector_error",
                ..ApiError::invalid(
                    format!("Error retrieving tool list from the MCP server of 'tools[{index}]': {message}"),
                    Some(&format!("tools[{index}]")),
                    Some("mcp_list_tools_failed"),
                )
            },
            EngineError::RemoteToolClash {
                name,
                server_label,
                index,
            } => ApiError::invalid(
                format!("Tool '{name}' of MCP server '{server_label}' has the name of another tool of this request or of a server tool this key may use; leave one out with 'allowed_tools'."),
                Some(&format!("tools[{index}].allowed_tools")),
                Some("tool_name_conflict"),
            ),
            EngineError::UnknownToolChoice { name } => ApiError::invalid(
                format!("Tool choice '{name}' not found in 'tools' parameter."),
                Some("tool_choice"),
                None,
            ),
            EngineError::ItemNotFound { id, index } => ApiError::invalid(
                format!("Item with id '{id}' not found."),
                Some(&format!("input[{index}]")),
                Some("item_not_found"),
            ),
            EngineError::Pairing { error, param } => {
                let code = match &error {
                    PairingError::OrphanOutput { .. } => "function_call_output_without_call",
                    PairingError::UnansweredCall { .. } => "function_call_output_missing",
                    PairingError::DuplicateCall { .. } => "duplicate_call_id",
                    PairingError::DuplicateOutput { .. } => "duplicate_function_call_output",
                    PairingError::OrphanApproval { .. } => "mcp_approval_request_not_found",
                    PairingError::DuplicateApproval { .. } => "duplicate_mcp_approval_response",
                    PairingError::UnansweredApproval { .. } => "mcp_approval_response_missing",
                    PairingError::ApprovedToolUnavailable { .. } => "mcp_tool_not_declared",
                };
                ApiError::invalid(error.to_string(), Some(&param), Some(code))
            }
            EngineError::CompactionRefused { param } => ApiError::invalid(
                "The compaction item could not be opened: its encrypted_content was altered, or it was made for another project or under a key this gateway no longer has.",
                Some(&param),
                Some("invalid_encrypted_content"),
            ),
            // The provider refused the request as the client's problem: asking again gets the same answer.
            EngineError::SummaryFailed { message, rejected: true }
            | EngineError::CountFailed { message, rejected: true } => {
                ApiError::invalid(message, None, Some("upstream_rejected"))
            }
            // Nothing was stored and no tool ran: asking again is safe.
            EngineError::SummaryFailed { message, rejected: false } => ApiError {
                retryable: true,
                ..ApiError::server(message)
            },
            EngineError::CountFailed { message, rejected: false } => ApiError {
                retryable: true,
                ..ApiError::server(message)
            },
            EngineError::ConversationNotFound { id } => ApiError::conversation_not_found(&id, "conversation"),
            EngineError::PreviousNotFound { id } => ApiError::invalid(
                format!("Previous response with id '{id}' not found."),
                Some("previous_response_id"),
                Some("previous_response_not_found"),
            ),
            EngineError::PreviousInProgress { id, status } => ApiError::invalid(
                format!(
                    "Previous response with id '{id}' is still {}; wait until it ends.",
                    status.as_str()
                ),
                Some("previous_response_id"),
                Some("previous_response_in_progress"),
            ),
            EngineError::IdempotencyInProgress => ApiError::idempotency_in_progress(),
            // Nothing was stored and no tool ran: the SDK may send it again.
            EngineError::NothingStored(StoreError::Busy) => ApiError::overloaded(
                "The gateway's store is busy; nothing was stored, retry shortly.",
            ),
            EngineError::NothingStored(_) => ApiError {
                retryable: true,
                ..ApiError::server("The gateway's store failed; nothing was stored, please try again.")
            },
            // Server tools may have run: the SDK must not repeat the request.
            EngineError::Unfinished { response_id, .. } => ApiError::server(format!(
                "The gateway's store failed while running response '{response_id}'; it was left unfinished."
            )),
            EngineError::Store(e) => e.into(),
            EngineError::TaskFailed => ApiError::server("The response's task failed."),
        }
    }
}

/// The code of an error that names none of its own: every error has one, so that a client can branch on it.
fn default_code(status: StatusCode) -> &'static str {
    match status.as_u16() {
        401 => "unauthorized",
        403 => "forbidden",
        404 => "not_found",
        405 => "method_not_allowed",
        409 => "conflict",
        413 => "request_too_large",
        429 => "rate_limit_exceeded",
        500..=599 => "server_error",
        _ => "invalid_request",
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        // A refused client leaves a trace (at `info`: it is the client's doing); the gateway's own failures
        // are logged where they happen, with their cause.
        if self.status.is_client_error() {
            tracing::info!(
                status = self.status.as_u16(),
                code = self.code.as_deref().unwrap_or(""),
                param = self.param.as_deref().unwrap_or(""),
                // Not the message: it may quote the client's input (serde) or the provider's words about it.
                "request refused"
            );
        } else {
            tracing::warn!(
                status = self.status.as_u16(),
                code = self.code.as_deref().unwrap_or(""),
                message = %self.message,
                "request failed"
            );
        }
        let body = self.body();
        let mut response = (self.status, axum::Json(body)).into_response();
        // SDKs retry 408/409/429/5xx; a repeated create could run server tools twice, so errors say
        // explicitly whether a retry is safe.
        let retry = if self.retryable { "true" } else { "false" };
        let headers = response.headers_mut();
        headers.insert("x-should-retry", HeaderValue::from_static(retry));
        if let Some(seconds) = self.retry_after_secs {
            headers.insert("retry-after", HeaderValue::from(seconds));
        }
        if let Some(standings) = self.rate_limits {
            headers.extend(super::governance::rate_headers(&standings));
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_store_without_a_free_connection_is_a_retryable_503_with_retry_after() {
        let error = ApiError::from(StoreError::Busy);
        assert_eq!(error.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(error.code.as_deref(), Some("server_overloaded"));
        let response = error.into_response();
        assert_eq!(response.headers()["retry-after"], "1");
        assert_eq!(response.headers()["x-should-retry"], "true");
    }

    #[test]
    fn other_store_faults_are_a_retryable_500_without_retry_after() {
        let error = ApiError::from(StoreError::Corrupt("bad row".into()));
        assert_eq!(error.status, StatusCode::INTERNAL_SERVER_ERROR);
        let response = error.into_response();
        assert!(response.headers().get("retry-after").is_none());
        assert_eq!(response.headers()["x-should-retry"], "true");
    }
}
