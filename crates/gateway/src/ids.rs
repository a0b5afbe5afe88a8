//! Opaque ids with a kind prefix (`resp_…`, `msg_…`, `call_…`), drawn from a userspace RNG.

/// A new opaque id with a kind prefix, e.g. `resp_3f2a...`.
pub fn new_id(prefix: &str) -> String {
    format!("{prefix}_{}", uuid::Uuid::new_v4().simple())
}
