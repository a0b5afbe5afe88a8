//! The end-to-end suite as one test binary: the real gateway on port 0, a fresh database per test, the
//! testkit's mock model and tool server over real HTTP. One module per area of the product.
//!
//! Test-support code: a setup step that fails must fail the test at once, so `expect` is the right tool here.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

mod common;

mod admin;
mod admin_governance;
mod audit;
mod bad_input;
mod chaining;
mod compaction;
mod console;
mod conversations;
mod durability;
mod embedded;
mod governance;
mod hosted_tools;
mod idempotency;
mod mcp_sources;
mod operations;
mod providers;
mod remote_mcp;
mod responses;
mod robustness;
mod seeding;
mod streaming;
mod streaming_upstream;
mod tenancy;
mod tool_loop;
mod tool_policy;
mod tool_types;
mod upstream;
mod upstream_rejected;
mod validation;
mod webhooks;
mod websocket;
