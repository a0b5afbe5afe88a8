//! What an admin write or a seed asks to change in a key's or project's governance: each setting kept, removed
//! or set, read with the same rules wherever it comes from.

use serde_json::Value;

use super::{invalid, RateLimits};
use crate::request::InvalidRequest;

/// A change to one setting that may be unset: `None` keeps it, `Some(None)` removes it, `Some(Some(v))` sets it.
pub type Change<T> = Option<Option<T>>;

/// The largest limit the store can hold (its columns are signed 64-bit integers).
pub const MAX_LIMIT: u64 = i64::MAX as u64;

/// What a `limits` field changes, limit by limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LimitChanges {
    pub rpm: Change<u64>,
    pub tpm: Change<u64>,
    pub max_concurrent: Change<u64>,
}

impl LimitChanges {
    /// Reads a `limits` field with [`RateLimits::patched`]'s rules: a limit given sets it, a limit given as `null`
    /// removes it, a limit left out is kept, and `limits: null` removes them all. Every error names its field.
    pub fn parse(value: &Value) -> Result<LimitChanges, InvalidRequest> {
        let given = RateLimits::default().patched(value)?;
        let change = |field: &str, limit: Option<u64>| {
            if !value.is_null() && value.get(field).is_none() {
                return Ok(None);
            }
            match limit {
                Some(n) if n > MAX_LIMIT => Err(invalid(
                    format!("'limits.{field}' must be at most {MAX_LIMIT}."),
                    &format!("limits.{field}"),
                )),
                limit => Ok(Some(limit)),
            }
        };
        Ok(LimitChanges {
            rpm: change("rpm", given.rpm)?,
            tpm: change("tpm", given.tpm)?,
            max_concurrent: change("max_concurrent", given.max_concurrent)?,
        })
    }

    /// Changes that make the limits exactly `limits`, whatever they were.
    pub fn replacing(limits: RateLimits) -> LimitChanges {
        LimitChanges {
            rpm: Some(limits.rpm),
            tpm: Some(limits.tpm),
            max_concurrent: Some(limits.max_concurrent),
        }
    }

    /// `limits` with these changes made.
    pub fn applied_to(self, limits: RateLimits) -> RateLimits {
        RateLimits {
            rpm: self.rpm.unwrap_or(limits.rpm),
            tpm: self.tpm.unwrap_or(limits.tpm),
            max_concurrent: self.max_concurrent.unwrap_or(limits.max_concurrent),
        }
    }
}

/// Checks a key's `expires_at` (Unix seconds): zero or more. A time already past is allowed: the key stops
/// working at once.
pub fn check_expires_at(at: i64, param: &str) -> Result<i64, InvalidRequest> {
    if at < 0 {
        return Err(invalid(
            format!("'{param}' must be a Unix time in seconds (zero or more), or null for never."),
            param,
        ));
    }
    Ok(at)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn limits_given_set_null_removes_and_absent_keeps() {
        let cases = [
            (json!({"rpm": 10}), (Some(Some(10)), None, None)),
            (
                json!({"rpm": null, "tpm": 5}),
                (Some(None), Some(Some(5)), None),
            ),
            (json!({}), (None, None, None)),
            (json!(null), (Some(None), Some(None), Some(None))),
            (json!({"max_concurrent": 0}), (None, None, Some(Some(0)))),
        ];
        for (given, (rpm, tpm, max_concurrent)) in cases {
            let expected = LimitChanges {
                rpm,
                tpm,
                max_concurrent,
            };
            assert_eq!(LimitChanges::parse(&given), Ok(expected), "{given}");
        }
    }

    #[test]
    fn bad_limits_name_their_field() {
        let cases = [
            (json!({"rpm": -1}), "limits.rpm"),
            (json!({"tpm": "many"}), "limits.tpm"),
            (json!({"max_concurrent": 1.5}), "limits.max_concurrent"),
            (json!({"rpm": u64::MAX}), "limits.rpm"),
            (json!({"rps": 1}), "limits.rps"),
            (json!(7), "limits"),
        ];
        for (given, param) in cases {
            let error = LimitChanges::parse(&given).expect_err("refused");
            assert_eq!(error.param.as_deref(), Some(param), "{given}");
        }
    }

    #[test]
    fn changes_apply_over_what_is_there() {
        let before = RateLimits {
            rpm: Some(1),
            tpm: Some(2),
            max_concurrent: Some(3),
        };
        let changes = LimitChanges::parse(&json!({"rpm": 10, "tpm": null})).unwrap();
        assert_eq!(
            changes.applied_to(before),
            RateLimits {
                rpm: Some(10),
                tpm: None,
                max_concurrent: Some(3)
            }
        );
        let only = RateLimits {
            rpm: Some(7),
            ..RateLimits::default()
        };
        assert_eq!(LimitChanges::replacing(only).applied_to(before), only);
    }

    #[test]
    fn an_expiry_is_zero_or_more() {
        assert_eq!(check_expires_at(0, "expires_at"), Ok(0));
        assert_eq!(
            check_expires_at(1_800_000_000, "expires_at"),
            Ok(1_800_000_000)
        );
        let error = check_expires_at(-1, "expires_at").expect_err("refused");
        assert_eq!(error.param.as_deref(), Some("expires_at"));
    }
}
