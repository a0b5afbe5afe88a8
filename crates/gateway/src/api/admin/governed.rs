//! The governance fields keys and projects share in the admin API (SPEC 13): `limits` and `budget` as bodies
//! give them and as answers show them.

use gateway_core::governance::{Budget, Governance, LimitChanges, RateLimits};
use serde::Serialize;
use serde_json::Value;

use crate::api::error::ApiError;
use crate::store::admin::{GovernanceChanges, GovernanceColumns};

/// What a PATCH's `limits` and `budget` change: limits are merged (a limit given sets it, `null` removes it,
/// one left out is kept; `limits: null` removes them all); a budget object replaces the budget, `null` removes
/// it. Both are checked before anything is written.
pub(super) fn governance_changes(
    limits: Option<Value>,
    budget: Option<Value>,
) -> Result<GovernanceChanges, ApiError> {
    Ok(GovernanceChanges {
        limits: limits
            .map(|limits| LimitChanges::parse(&limits))
            .transpose()?
            .unwrap_or_default(),
        budget: budget.map(|budget| Budget::parse(&budget)).transpose()?,
    })
}

/// What a create's `limits` and `budget` hold the new key or project to; left out or `null`, nothing.
pub(super) fn governance(
    limits: Option<Value>,
    budget: Option<Value>,
) -> Result<Governance, ApiError> {
    Ok(governance_changes(limits, budget)?.applied_to(Governance::default()))
}

/// `limits` (always an object, `null` for each limit not set) and `budget` (`null` when none) of an answer.
#[derive(Debug, Serialize)]
pub struct GovernanceObject {
    limits: RateLimits,
    budget: Option<Budget>,
}

impl From<&GovernanceColumns> for GovernanceObject {
    fn from(columns: &GovernanceColumns) -> GovernanceObject {
        let Governance { limits, budget } = columns.governance();
        GovernanceObject { limits, budget }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gateway_core::governance::BudgetPeriod;
    use serde_json::json;

    #[test]
    fn a_patch_tells_a_limit_left_out_from_one_removed() {
        let changes =
            governance_changes(Some(json!({"rpm": 5, "tpm": null})), Some(Value::Null)).unwrap();
        assert_eq!(
            changes.limits,
            LimitChanges {
                rpm: Some(Some(5)),
                tpm: Some(None),
                max_concurrent: None
            }
        );
        assert_eq!(changes.budget, Some(None), "null removes the budget");
        assert_eq!(
            governance_changes(None, None).unwrap(),
            GovernanceChanges::default()
        );
    }

    #[test]
    fn a_create_is_held_to_what_it_gives() {
        let given = governance(
            Some(json!({"max_concurrent": 3})),
            Some(json!({"usd": 2, "period": "total"})),
        )
        .unwrap();
        assert_eq!(
            given,
            Governance {
                limits: RateLimits {
                    max_concurrent: Some(3),
                    ..RateLimits::default()
                },
                budget: Some(Budget {
                    usd: 2.0,
                    period: BudgetPeriod::Total
                }),
            }
        );
        assert_eq!(
            governance(Some(Value::Null), Some(Value::Null)).unwrap(),
            Governance::default()
        );
        let error = governance(None, Some(json!({"usd": 1, "period": "week"}))).unwrap_err();
        assert_eq!(error.param.as_deref(), Some("budget.period"));
    }
}
