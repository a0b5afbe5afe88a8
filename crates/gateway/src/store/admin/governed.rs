//! The governance columns keys and projects share (SPEC 13): their limits and budget as read, and the changes
//! an admin write or a seed makes to them.

use gateway_core::governance::{Budget, Change, Governance, LimitChanges};

use crate::store::governance::governance;

/// The limit and budget columns of a key or a project, as read.
#[derive(Debug, Clone, Default, PartialEq, sqlx::FromRow)]
pub struct GovernanceColumns {
    pub rpm_limit: Option<i64>,
    pub tpm_limit: Option<i64>,
    pub max_concurrent: Option<i64>,
    pub budget_usd: Option<f64>,
    pub budget_period: Option<String>,
}

impl GovernanceColumns {
    /// What the key or project is held to.
    pub fn governance(&self) -> Governance {
        governance(
            self.rpm_limit,
            self.tpm_limit,
            self.max_concurrent,
            self.budget_usd,
            self.budget_period.as_deref(),
        )
    }
}

/// Changes to a key's or project's limits and budget; the default changes nothing.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct GovernanceChanges {
    pub limits: LimitChanges,
    /// `Some(None)` removes the budget, `Some(Some(b))` replaces it.
    pub budget: Change<Budget>,
}

impl GovernanceChanges {
    /// Changes that make a key or project held to exactly `governance`.
    pub fn replacing(governance: Governance) -> GovernanceChanges {
        GovernanceChanges {
            limits: LimitChanges::replacing(governance.limits),
            budget: Some(governance.budget),
        }
    }

    /// `governance` with these changes made.
    pub fn applied_to(self, governance: Governance) -> Governance {
        Governance {
            limits: self.limits.applied_to(governance.limits),
            budget: self.budget.unwrap_or(governance.budget),
        }
    }
}

/// A limit as its column holds it. Limits are parsed to at most `MAX_LIMIT`, which fits.
pub(super) fn limit_column(limit: Option<u64>) -> Option<i64> {
    limit.map(|n| i64::try_from(n).unwrap_or(i64::MAX))
}
