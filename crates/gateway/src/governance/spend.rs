//! The spend of budgets: summed from the usage records of the period at most every `sync`, plus what this
//! replica counted since that read.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use gateway_core::governance::BudgetPeriod;

use crate::store::governance::Spender;
use crate::store::{Store, StoreError};

/// What this replica knows of one spender's spend.
#[derive(Debug, Default)]
struct Spend {
    period_start: i64,
    /// The period's spend as the usage records held it at the last read.
    read: f64,
    /// What this replica counted since it started that read.
    since: f64,
    read_at: Option<Instant>,
}

/// Every spender this replica has checked, by (is a key, id).
pub(super) struct Spends {
    store: Store,
    sync: Duration,
    spends: Mutex<HashMap<(bool, String), Spend>>,
}

fn slot(spender: Spender<'_>) -> (bool, String) {
    match spender {
        Spender::Key(id) => (true, id.to_owned()),
        Spender::Project(id) => (false, id.to_owned()),
    }
}

impl Spends {
    pub(super) fn new(store: Store, sync: Duration) -> Spends {
        Spends {
            store,
            sync,
            spends: Mutex::default(),
        }
    }

    fn with<T>(&self, spender: Spender<'_>, f: impl FnOnce(&mut Spend) -> T) -> T {
        let mut spends = self.spends.lock().unwrap_or_else(|e| e.into_inner());
        f(spends.entry(slot(spender)).or_default())
    }

    /// What `spender` spent in the `period` that holds `now`, in USD.
    pub(super) async fn spent(
        &self,
        spender: Spender<'_>,
        period: BudgetPeriod,
        now: i64,
    ) -> Result<f64, StoreError> {
        let period_start = period.start(now);
        let counted = self.with(spender, |spend| {
            let fresh = spend.period_start == period_start
                && spend.read_at.is_some_and(|at| at.elapsed() < self.sync);
            if fresh {
                return Ok(spend.read + spend.since);
            }
            Err(spend.since)
        });
        let counted_before = match counted {
            Ok(spent) => return Ok(spent),
            Err(since) => since,
        };
        let read = self.store.spend_since(spender, period_start).await?;
        Ok(self.with(spender, |spend| {
            if spend.period_start != period_start {
                spend.since = 0.0;
            }
            // What was counted before the read began is in it (or in a write still on its way, counted once it
            // lands); what was counted during the read stays counted here until the next read.
            spend.since = (spend.since - counted_before).max(0.0);
            spend.period_start = period_start;
            spend.read = read;
            spend.read_at = Some(Instant::now());
            spend.read + spend.since
        }))
    }

    /// Counts `cost` spent by `spender` on this replica.
    pub(super) fn add(&self, spender: Spender<'_>, cost: f64) {
        self.with(spender, |spend| spend.since += cost);
    }
}
