//! The gateway: an OpenAI Responses-compatible server that runs server-side tools in a stored-step loop.

pub mod api;
pub mod app;
pub mod clock;
pub mod compaction;
pub mod config;
#[cfg(feature = "demo")]
pub mod demo;
pub mod duty;
pub mod engine;
pub mod governance;
pub mod ids;
pub mod listener;
pub mod memory;
pub mod metrics;
pub mod resolver;
pub mod retry;
pub mod seed;
pub mod store;
pub mod telemetry;
pub mod tools;
pub mod upstream;
pub mod webhooks;

pub use app::Application;
pub use config::Config;
