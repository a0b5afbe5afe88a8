//! `EngineError`: why the engine could not start or finish a response, for the API to render; `StartError`: why
//! an engine could not be built.

use gateway_core::context::PairingError;
use gateway_core::response::ResponseStatus;

use crate::store::StoreError;

/// Why a response could not be created or run. The API maps each variant to its OpenAI error.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// `server.max_active_responses` responses are running; nothing was done.
    #[error("the gateway is running as many responses as it may at once")]
    Overloaded,
    /// The replica is shutting down and takes no new work; nothing was done.
    #[error("the gateway is shutting down")]
    ShuttingDown,
    /// The project may use no deployment of this name (or there is none).
    #[error("model '{model}' not found")]
    ModelNotFound { model: String },
    /// A client tool has the name of a server tool the key may use.
    #[error("client tool '{name}' clashes with a server tool")]
    ToolNameConflict { name: String, index: usize },
    /// The deployment refuses tools of a type it cannot serve (`unsupported_tools: reject`).
    #[error("tools of type '{kind}' are not supported by this deployment")]
    UnsupportedTool { kind: String, index: usize },
    /// The deployment refuses a parameter its provider kind cannot honour (`unsupported_params: reject`).
    #[error("parameter '{param}' is not supported by this deployment")]
    UnsupportedParam { param: &'static str },
    /// A remote MCP server the request names may not be reached (neither `tools.mcp_allowed_urls` nor
    /// `tools.mcp_allowed_private_urls` admits it, a private address, a malformed URL); `message` says why.
    #[error("MCP server refused: {message}")]
    RemoteMcpRefused { index: usize, message: String },
    /// A remote MCP server the request names did not list its tools.
    #[error("MCP server did not list its tools: {message}")]
    RemoteMcpUnlisted { index: usize, message: String },
    /// A tool of a remote MCP server has the name of another tool of the request or of the key.
    #[error("MCP tool '{name}' of '{server_label}' clashes with another tool")]
    RemoteToolClash {
        name: String,
        server_label: String,
        index: usize,
    },
    /// `tool_choice` names a tool that is not among the tools.
    #[error("tool_choice names '{name}', which is not among the tools")]
    UnknownToolChoice { name: String },
    /// An `item_reference` names no stored item of this project.
    #[error("item '{id}' not found")]
    ItemNotFound { id: String, index: usize },
    /// The context's tool calls and outputs do not pair; `param` names the offending input.
    #[error("{error}")]
    Pairing { error: PairingError, param: String },
    /// A compaction item does not open (altered, another project's, or sealed with an unknown key); `param`
    /// names it.
    #[error("a compaction item could not be opened")]
    CompactionRefused { param: String },
    /// The model did not give a summary for a compaction; `message` says why, for the client: the provider
    /// refused the request (`rejected`, with its words), or failed.
    #[error("the compaction's summary failed: {message}")]
    SummaryFailed { message: String, rejected: bool },
    /// The provider could not count a request's input tokens: it refused the request (`rejected`, with its
    /// words), or failed.
    #[error("the token count failed: {message}")]
    CountFailed { message: String, rejected: bool },
    /// `conversation` names no conversation of this project.
    #[error("conversation '{id}' not found")]
    ConversationNotFound { id: String },
    /// `previous_response_id` names no response of this project.
    #[error("previous response '{id}' not found")]
    PreviousNotFound { id: String },
    /// `previous_response_id` names a response that has not ended.
    #[error("previous response '{id}' is still {}", status.as_str())]
    PreviousInProgress { id: String, status: ResponseStatus },
    /// Another create with the same `Idempotency-Key` is running the response.
    #[error("a create with this Idempotency-Key is still running")]
    IdempotencyInProgress,
    /// The store failed before anything of the response was stored or done: sending it again is safe.
    #[error("store failed before the response was stored: {0}")]
    NothingStored(#[source] StoreError),
    /// The store failed while the response ran; it was recorded as failed where the store allowed.
    #[error("store failed while running response '{response_id}': {source}")]
    Unfinished {
        response_id: String,
        #[source]
        source: StoreError,
    },
    /// This replica gave the response up before it ended (it shut down, lost the response to another replica, or
    /// the store stopped answering): another replica finishes it from its stored steps.
    #[error("response '{response_id}' was handed over before it ended")]
    HandedOver {
        response_id: String,
        /// Whether the client may send its create again (it carried an `Idempotency-Key`, or nothing was stored).
        retry_safe: bool,
    },
    /// The response was deleted while it ran.
    #[error("response '{response_id}' was deleted while it ran")]
    Deleted { response_id: String },
    /// A read of the store failed while preparing the response.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The response's run ended without an answer (it panicked), on the request's task or its own.
    #[error("the response's task failed")]
    TaskFailed,
}

impl From<gateway_core::preparation::PreparationError> for EngineError {
    fn from(error: gateway_core::preparation::PreparationError) -> EngineError {
        use gateway_core::preparation::PreparationError as Refused;
        match error {
            Refused::ToolNameConflict { name, index } => {
                EngineError::ToolNameConflict { name, index }
            }
            Refused::UnknownToolChoice { name } => EngineError::UnknownToolChoice { name },
            Refused::UnsupportedTool { kind, index } => {
                EngineError::UnsupportedTool { kind, index }
            }
            Refused::UnsupportedParam { param } => EngineError::UnsupportedParam { param },
            Refused::RemoteToolClash {
                name,
                server_label,
                index,
            } => EngineError::RemoteToolClash {
                name,
                server_label,
                index,
            },
            Refused::ItemNotFound { id, index } => EngineError::ItemNotFound { id, index },
        }
    }
}

/// Why an engine could not be built: the HTTP client of the upstream or of the tools could not be made (no TLS
/// backend, say). The client's own error is kept as text, so that no reqwest type leaves its module.
#[derive(Debug, thiserror::Error)]
#[error("the {part} HTTP client could not be built: {detail}")]
pub struct StartError {
    /// Whose client: `upstream` or `tools`.
    part: &'static str,
    detail: String,
}

impl StartError {
    /// Maps the failure to build `part`'s HTTP client.
    pub(super) fn http_client<E: std::fmt::Display>(
        part: &'static str,
    ) -> impl FnOnce(E) -> StartError {
        move |error| StartError {
            part,
            detail: error.to_string(),
        }
    }
}
