//! Pure domain of the gateway: items, steps, the loop's decision, the conversation a model sees, provider
//! translation, output assembly and stream events.
//!
//! Nothing here performs IO, reads a clock or draws random numbers: ids and timestamps are passed in,
//! so every function is deterministic and tested by tables.

pub mod anthropic;
pub mod chat;
pub mod chat_stream;
pub mod context;
pub mod conversation;
pub mod decide;
pub mod entity;
pub mod event_stream;
pub mod events;
pub mod governance;
pub mod items;
pub mod json;
pub mod openai_responses;
pub mod output;
pub mod preparation;
pub mod reasoning;
pub mod remote_mcp;
pub mod request;
pub mod response;
pub mod steps;
pub mod toolset;
pub mod walk;
pub mod webhook;

#[cfg(test)]
mod test_support;

pub use decide::{decide_next_action, IncompleteReason, Limits, NextAction};
pub use items::Item;
pub use steps::{ModelOutput, Step, StepBody, StepState, ToolCall, ToolOutcome};
