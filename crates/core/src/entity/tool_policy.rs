//! A tool source's policy (SPEC 7): concurrency, output cap and circuit breaker, each bounded.

use serde::{Deserialize, Serialize};

use super::invalid;
use crate::request::InvalidRequest;

/// A tool source's policy (SPEC 7): how many of its calls may run at once across the gateway, how much of an
/// output is kept, and when its circuit breaker opens. `None` is the gateway's default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ToolPolicy {
    pub max_in_flight: Option<u32>,
    pub max_output_bytes: Option<u64>,
    pub breaker_failures: Option<u32>,
    pub breaker_cooldown_ms: Option<u64>,
}

impl ToolPolicy {
    /// The output cap when a source names none: 1 MiB.
    pub const DEFAULT_MAX_OUTPUT_BYTES: u64 = 1024 * 1024;
    /// The smallest output cap: room for the truncation marker and some output.
    pub const MIN_MAX_OUTPUT_BYTES: i64 = 256;
    /// The largest output cap: 64 MiB.
    pub const MAX_MAX_OUTPUT_BYTES: i64 = 64 * 1024 * 1024;
    /// Consecutive failures that open the breaker when a source names no number.
    pub const DEFAULT_BREAKER_FAILURES: u32 = 5;
    /// How long an open breaker fails calls fast when a source names no cool-down.
    pub const DEFAULT_BREAKER_COOLDOWN_MS: u64 = 30_000;

    pub fn max_output_bytes(&self) -> u64 {
        self.max_output_bytes
            .unwrap_or(ToolPolicy::DEFAULT_MAX_OUTPUT_BYTES)
    }

    pub fn breaker_failures(&self) -> u32 {
        self.breaker_failures
            .unwrap_or(ToolPolicy::DEFAULT_BREAKER_FAILURES)
    }

    pub fn breaker_cooldown_ms(&self) -> u64 {
        self.breaker_cooldown_ms
            .unwrap_or(ToolPolicy::DEFAULT_BREAKER_COOLDOWN_MS)
    }

    /// `max_in_flight`: 1 to 10 000.
    pub fn parse_max_in_flight(value: i64, param: &str) -> Result<u32, InvalidRequest> {
        bounded(value, param, 1, 10_000).map(|v| u32::try_from(v).unwrap_or(u32::MAX))
    }

    /// `max_output_bytes`: 256 bytes to 64 MiB.
    pub fn parse_max_output_bytes(value: i64, param: &str) -> Result<u64, InvalidRequest> {
        bounded(
            value,
            param,
            ToolPolicy::MIN_MAX_OUTPUT_BYTES,
            ToolPolicy::MAX_MAX_OUTPUT_BYTES,
        )
        .map(|v| u64::try_from(v).unwrap_or(0))
    }

    /// `breaker_failures`: 1 to 1000.
    pub fn parse_breaker_failures(value: i64, param: &str) -> Result<u32, InvalidRequest> {
        bounded(value, param, 1, 1000).map(|v| u32::try_from(v).unwrap_or(u32::MAX))
    }

    /// `breaker_cooldown_ms`: 1 ms to one hour.
    pub fn parse_breaker_cooldown_ms(value: i64, param: &str) -> Result<u64, InvalidRequest> {
        bounded(value, param, 1, 3_600_000).map(|v| u64::try_from(v).unwrap_or(0))
    }
}

fn bounded(value: i64, param: &str, min: i64, max: i64) -> Result<i64, InvalidRequest> {
    if (min..=max).contains(&value) {
        Ok(value)
    } else {
        Err(invalid(
            format!("Invalid '{param}': {value}; expected an integer between {min} and {max}."),
            param,
        ))
    }
}

#[cfg(test)]
mod tests;
