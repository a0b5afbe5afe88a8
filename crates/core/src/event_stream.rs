//! The accumulator of a streamed answer that comes as typed events (Anthropic Messages, OpenAI Responses): what
//! one reader of either provider's events needs of it.

use serde_json::Value;

use crate::chat::{IdSource, ParseError};
use crate::steps::{ModelDelta, ModelOutput};

/// One streamed answer of typed events (`{"type": ...}`), read event by event until its terminal event.
pub trait TypedEventStream: Default {
    /// Why a body that ended before the terminal event is cut short, for the log.
    const CUT_SHORT: &'static str;
    /// A `data` that is no event and is passed over, if the provider's servers send one.
    const NOT_AN_EVENT: Option<&'static str>;

    /// Reads one event, giving what the client may see at once. An error event is an error: the upstream gave up
    /// mid-answer.
    fn push(&mut self, event: &Value) -> Result<Vec<ModelDelta>, ParseError>;

    /// Whether the terminal event came: a complete answer ends with it, a cut one does not.
    fn is_complete(&self) -> bool;

    /// The normalised output once the stream has ended.
    fn finish(self, ids: &mut dyn IdSource) -> Result<ModelOutput, ParseError>;
}
