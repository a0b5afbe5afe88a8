//! Each policy value is bounded; unset ones take the gateway's defaults.

use super::*;

#[test]
fn policy_values_out_of_range_are_refused_and_defaults_apply() {
    assert!(ToolPolicy::parse_max_in_flight(0, "max_in_flight").is_err());
    assert_eq!(
        ToolPolicy::parse_max_in_flight(4, "max_in_flight").unwrap(),
        4
    );
    assert!(ToolPolicy::parse_max_output_bytes(10, "max_output_bytes").is_err());
    assert!(ToolPolicy::parse_max_output_bytes(-1, "max_output_bytes").is_err());
    assert!(ToolPolicy::parse_breaker_failures(0, "breaker_failures").is_err());
    assert!(ToolPolicy::parse_breaker_cooldown_ms(3_600_001, "breaker_cooldown_ms").is_err());
    let policy = ToolPolicy::default();
    assert_eq!(policy.max_output_bytes(), 1024 * 1024);
    assert_eq!(policy.breaker_failures(), 5);
    assert_eq!(policy.breaker_cooldown_ms(), 30_000);
}
