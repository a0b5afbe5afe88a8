//! Governance at run time (SPEC 13): a create admitted against its key's and project's limits and budgets, the
//! counts that hold them across replicas (Postgres is the only coordination), and the usage of every model and
//! server tool call recorded and measured.
//!
//! How each limit holds across replicas (`docs/behaviour.md`, "Limits across replicas"):
//! * `rpm`: each replica leases slices of a window's count from a shared counter that never passes the limit, so
//!   replicas together never admit more than the limit in a window; the next slice is leased ahead while a quarter
//!   of the last is left, and a slice leased and not used is lost for that window (at most
//!   `replicas × (slice + slice/4 − 1)` creates fewer than the limit).
//! * `tpm`: each replica adds the tokens its model calls used to a shared counter, and reads the others' back, at
//!   most every `governance.sync_ms` (renewed beside use once half that old, so that admission rarely waits); a
//!   replica does not see the last `sync_ms` of the others' tokens.
//! * `max_concurrent`: one shared count per scope, taken and given back in one statement each.
//! * budgets: each replica adds what its model calls cost (in nano-dollars) to shared counters per key and project
//!   and per period (day, month, all time), and reads the others' back, as for `tpm`; the usage records stay
//!   the account of who spent what.

mod counters;
mod running;
mod usage;

use foldhash::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use gateway_core::governance::{Budget, BudgetPeriod, Governance, Pricing, Standing};
use gateway_core::steps::Usage;

pub use running::RunningPlace;
pub use usage::UsageWriter;

use crate::clock::now;
use crate::store::governance::{KeyGrant, UsageRecord};
use crate::store::{Store, StoreError};
use counters::{Counter, Counters};

/// Which of a key's scopes a limit or budget belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    Key,
    Project,
}

impl Scope {
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Key => "API key",
            Scope::Project => "project",
        }
    }
}

/// Which limit refused a create.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitKind {
    RequestsPerMinute,
    TokensPerMinute,
    Concurrent,
}

/// The `x-ratelimit-*` standings of a create: the tighter of the key's and the project's, per kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RateHeaders {
    pub requests: Option<Standing>,
    pub tokens: Option<Standing>,
}

/// A create let through: its standings, and its place among the responses running when a `max_concurrent` counts
/// it (given back when dropped).
#[derive(Debug, Default)]
pub struct Admission {
    pub headers: RateHeaders,
    pub running: Option<RunningPlace>,
}

/// Why a create was refused.
#[derive(Debug)]
pub enum Refusal {
    /// Over a rate limit: retried after `retry_after_secs`.
    Limited {
        kind: LimitKind,
        scope: Scope,
        owner: String,
        limit: u64,
        headers: RateHeaders,
        retry_after_secs: u64,
    },
    /// The budget is spent for its period: not retried.
    BudgetSpent {
        scope: Scope,
        owner: String,
        budget: Budget,
    },
    Store(StoreError),
}

impl From<StoreError> for Refusal {
    fn from(error: StoreError) -> Refusal {
        Refusal::Store(error)
    }
}

/// Why a queued background response is not started now: it waits queued, and is tried again.
#[derive(Debug)]
pub enum StartRefused {
    /// A `max_concurrent` count of its key or project is full.
    Full {
        scope: Scope,
        owner: String,
    },
    Store(StoreError),
}

/// The key and project a run's usage counts against, and what they are held to.
#[derive(Debug, Clone)]
pub struct Payer {
    pub project_id: String,
    pub key_id: Option<String>,
    pub key: Governance,
    pub project: Governance,
    /// Each scope's counters, got from the governor's name book the first time they are used and kept with the
    /// payer for the rest of its run (admission, the budget checks before each model call, the usage after it).
    counters: OnceLock<ScopeCounters>,
}

/// The counters of a payer's key (when it has one) and project.
#[derive(Debug, Clone)]
struct ScopeCounters {
    key: Option<Arc<CounterNames>>,
    project: Arc<CounterNames>,
}

impl Payer {
    pub fn of(grant: &KeyGrant) -> Payer {
        Payer {
            project_id: grant.project_id.clone(),
            key_id: Some(grant.key_id.clone()),
            key: grant.key,
            project: grant.project,
            counters: OnceLock::new(),
        }
    }

    /// A payer without a key (a response stored before keys were recorded): only its project counts.
    pub fn project_only(project_id: &str, project: Governance) -> Payer {
        Payer {
            project_id: project_id.to_owned(),
            key_id: None,
            key: Governance::default(),
            project,
            counters: OnceLock::new(),
        }
    }

    /// Each scope with an owner, with what it is held to.
    fn scopes(&self) -> impl Iterator<Item = (Scope, &str, &Governance)> {
        let key = self.key_id.as_deref().map(|id| (Scope::Key, id, &self.key));
        key.into_iter().chain(std::iter::once((
            Scope::Project,
            self.project_id.as_str(),
            &self.project,
        )))
    }
}

/// One owner's counters (named `key:<id>:rpm`, `project:<id>:spend:month`), got once per owner and replica
/// rather than looked up by name on every create.
#[derive(Debug)]
struct CounterNames {
    tpm: Counter,
    rpm: Counter,
    running: String,
    /// What was spent per budget period, in nano-dollars: day, month, total.
    spend: [Counter; 3],
}

impl CounterNames {
    fn of(counters: &Counters, scope: Scope, owner: &str) -> CounterNames {
        let prefix = match scope {
            Scope::Key => "key",
            Scope::Project => "project",
        };
        let name = |what: &str| format!("{prefix}:{owner}:{what}");
        CounterNames {
            tpm: counters.counter(name("tpm")),
            rpm: counters.counter(name("rpm")),
            running: name("running"),
            spend: BudgetPeriod::ALL
                .map(|period| counters.counter(name(&format!("spend:{}", period.as_str())))),
        }
    }

    fn spend(&self, period: BudgetPeriod) -> &Counter {
        let index = match period {
            BudgetPeriod::Day => 0,
            BudgetPeriod::Month => 1,
            BudgetPeriod::Total => 2,
        };
        &self.spend[index]
    }
}

/// The counter names of every owner seen, by scope and owner id.
#[derive(Default)]
struct NameBook {
    keys: HashMap<String, Arc<CounterNames>>,
    projects: HashMap<String, Arc<CounterNames>>,
}

/// Owners whose names are kept at the most; past it the book starts again.
const MAX_NAMED_OWNERS: usize = 100_000;

/// An amount in USD as the counters hold it: whole nano-dollars.
fn nanos(usd: f64) -> u64 {
    (usd * 1e9).round() as u64
}

/// The gateway's governance: admission, the shared counts, and usage; cheap to share.
pub struct Governor {
    store: Store,
    replica_id: String,
    counters: Counters,
    places: running::Places,
    unstored: UsageWriter,
    names: Mutex<NameBook>,
}

impl std::fmt::Debug for Governor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Governor")
            .field("replica_id", &self.replica_id)
            .finish()
    }
}

impl Governor {
    /// A governor that reads and writes the shared counts at most every `sync`, and writes the usage of
    /// unstored responses every `flush`.
    pub fn new(store: Store, replica_id: String, sync: Duration, flush: Duration) -> Arc<Governor> {
        Arc::new(Governor {
            counters: Counters::new(store.clone(), sync),
            places: running::Places::start(store.clone(), replica_id.clone(), sync),
            unstored: UsageWriter::start(store.clone(), flush),
            names: Mutex::default(),
            store,
            replica_id,
        })
    }

    /// The names of `owner`'s counters.
    fn names(&self, scope: Scope, owner: &str) -> Arc<CounterNames> {
        let mut book = self.names.lock().unwrap_or_else(|e| e.into_inner());
        let owners = match scope {
            Scope::Key => &mut book.keys,
            Scope::Project => &mut book.projects,
        };
        if let Some(names) = owners.get(owner) {
            return Arc::clone(names);
        }
        if owners.len() >= MAX_NAMED_OWNERS {
            owners.clear();
        }
        let names = Arc::new(CounterNames::of(&self.counters, scope, owner));
        owners.insert(owner.to_owned(), Arc::clone(&names));
        names
    }

    /// Each of `payer`'s scopes with an owner, with what it is held to and its counters (looked up in the name
    /// book once per payer).
    fn counted_scopes<'p>(
        &self,
        payer: &'p Payer,
    ) -> impl Iterator<Item = (Scope, &'p str, &'p Governance, &'p CounterNames)> {
        let counters = payer.counters.get_or_init(|| ScopeCounters {
            key: payer.key_id.as_deref().map(|id| self.names(Scope::Key, id)),
            project: self.names(Scope::Project, &payer.project_id),
        });
        payer
            .scopes()
            .zip(
                counters
                    .key
                    .iter()
                    .chain(std::iter::once(&counters.project)),
            )
            .map(|((scope, owner, governance), names)| (scope, owner, governance, &**names))
    }

    /// Admits a create of `payer`'s, or says why not: budgets first, then tokens per minute, requests per minute
    /// (which counts the create), and the responses running (which takes a place). Nothing is counted for a
    /// key and project without limits or budgets.
    pub async fn admit(&self, payer: &Payer) -> Result<Admission, Refusal> {
        if payer.key.is_empty() && payer.project.is_empty() {
            return Ok(Admission::default());
        }
        let now = now();
        let at = Instant::now();
        for (scope, owner, governance, names) in self.counted_scopes(payer) {
            if let Some(budget) = governance.budget {
                if self.spent(names, budget, now, at).await? {
                    return Err(Refusal::BudgetSpent {
                        scope,
                        owner: owner.to_string(),
                        budget,
                    });
                }
            }
        }
        let mut headers = RateHeaders::default();
        let mut tokens = Vec::new();
        for (scope, owner, governance, names) in self.counted_scopes(payer) {
            if let Some(limit) = governance.limits.tpm {
                let standing = self.counters.tokens(&names.tpm, limit, now, at).await?;
                tokens.push((scope, owner, limit, standing));
                headers.tokens = Standing::tighter(headers.tokens, Some(standing));
            }
        }
        for (scope, owner, limit, standing) in &tokens {
            if standing.remaining == 0 {
                return Err(Refusal::Limited {
                    kind: LimitKind::TokensPerMinute,
                    scope: *scope,
                    owner: owner.to_string(),
                    limit: *limit,
                    headers,
                    retry_after_secs: standing.reset_secs.max(1),
                });
            }
        }
        for (scope, owner, governance, names) in self.counted_scopes(payer) {
            if let Some(limit) = governance.limits.rpm {
                let standing = self.counters.request(&names.rpm, limit, now).await?;
                headers.requests = Standing::tighter(headers.requests, standing.ok());
                if let Err(standing) = standing {
                    headers.requests = Some(standing);
                    return Err(Refusal::Limited {
                        kind: LimitKind::RequestsPerMinute,
                        scope,
                        owner: owner.to_string(),
                        limit,
                        headers,
                        retry_after_secs: standing.reset_secs.max(1),
                    });
                }
            }
        }
        let mut running = self.places.place();
        for (scope, owner, governance, names) in self.counted_scopes(payer) {
            if let Some(limit) = governance.limits.max_concurrent {
                if !running.take(names.running.clone(), limit).await? {
                    return Err(Refusal::Limited {
                        kind: LimitKind::Concurrent,
                        scope,
                        owner: owner.to_string(),
                        limit,
                        headers,
                        retry_after_secs: 1,
                    });
                }
            }
        }
        Ok(Admission {
            headers,
            running: running.holds_any().then_some(running),
        })
    }

    /// Places for a queued background response a replica is about to start: it gave its place back when it was
    /// left queued, and takes one again within the counts, as a create does. `Ok(None)` when no `max_concurrent`
    /// applies; `Err` when a count is full or the store did not answer (it stays queued, and is tried again).
    pub async fn take_running_to_start(
        &self,
        payer: &Payer,
    ) -> Result<Option<RunningPlace>, StartRefused> {
        let mut running = self.places.place();
        for (scope, owner, governance, names) in self.counted_scopes(payer) {
            if let Some(limit) = governance.limits.max_concurrent {
                match running.take(names.running.clone(), limit).await {
                    Ok(true) => {}
                    Ok(false) => {
                        return Err(StartRefused::Full {
                            scope,
                            owner: owner.to_string(),
                        })
                    }
                    Err(e) => return Err(StartRefused::Store(e)),
                }
            }
        }
        Ok(running.holds_any().then_some(running))
    }

    /// Places for a response admitted before that now runs here (resumed after its replica stopped): taken
    /// whatever the counts stand at, since it was admitted already and ran, so that the counts keep saying how
    /// many run and new creates wait for it. `None` when no `max_concurrent` applies; a store that does not answer
    /// leaves the response running without a place (logged).
    pub async fn hold_running(&self, payer: &Payer) -> Option<RunningPlace> {
        let mut running = self.places.place();
        for (_, _, governance, names) in self.counted_scopes(payer) {
            if governance.limits.max_concurrent.is_some() {
                let name = names.running.clone();
                if let Err(e) = running.take(name, i64::MAX as u64).await {
                    tracing::warn!(error = %e, "could not take a running place for a resumed response");
                }
            }
        }
        running.holds_any().then_some(running)
    }

    /// Whether `payer`'s key or project has spent its budget: a running response makes no further model call.
    pub async fn budget_spent(&self, payer: &Payer) -> bool {
        let now = now();
        let at = Instant::now();
        for (_, _, governance, names) in self.counted_scopes(payer) {
            if let Some(budget) = governance.budget {
                match self.spent(names, budget, now, at).await {
                    Ok(true) => return true,
                    Ok(false) => {}
                    // A store that does not answer does not stop a running response: the next check may.
                    Err(e) => tracing::warn!(error = %e, "could not read a budget's spend"),
                }
            }
        }
        false
    }

    /// Whether the owner of `names` has spent `budget` in the period that holds `now`.
    async fn spent(
        &self,
        names: &CounterNames,
        budget: Budget,
        now: i64,
        at: Instant,
    ) -> Result<bool, StoreError> {
        let limit = nanos(budget.usd);
        let spent = self
            .counters
            .total(
                names.spend(budget.period),
                budget.period.start(now),
                limit,
                at,
            )
            .await?;
        Ok(spent >= limit)
    }

    /// Counts a model call's usage and cost against `payer`'s limits and budgets, and in the metrics.
    pub fn count_model_call(&self, payer: &Payer, deployment: &str, usage: &Usage, cost: f64) {
        let now = now();
        crate::metrics::model_usage(&payer.project_id, deployment, usage, cost);
        let period_starts = BudgetPeriod::ALL.map(|period| (period, period.start(now)));
        for (_, _, governance, names) in self.counted_scopes(payer) {
            if let Some(limit) = governance.limits.tpm {
                self.counters
                    .add_tokens(&names.tpm, usage.total_tokens(), limit, now);
            }
            if cost > 0.0 {
                // Every period is counted, so that a budget set later, or of another period, finds its spend.
                for (period, start) in period_starts {
                    let limit = match governance.budget {
                        Some(budget) if budget.period == period => nanos(budget.usd),
                        _ => u64::MAX,
                    };
                    self.counters
                        .add(names.spend(period), nanos(cost), limit, start);
                }
            }
        }
    }

    /// Hands the usage of an unstored response to the writer that records it in batches.
    pub fn record_unstored(&self, records: Vec<UsageRecord>) {
        self.unstored.send(records);
    }

    /// This replica's lease lapsed: its parts of the `max_concurrent` counts may have been taken back by another
    /// replica, so they are written again from the places its runs hold.
    pub fn lease_lapsed(&self) {
        self.places.doubt_held();
    }

    /// Deletes the shared windows of `rpm`, `tpm` and spend that ended long ago, so that the table holds what
    /// is counted now rather than every minute ever counted.
    pub async fn prune_windows(&self) -> Result<u64, StoreError> {
        self.store.prune_windows().await
    }

    /// Takes back the `max_concurrent` places held by replicas whose lease lapsed.
    pub async fn reclaim_running(&self, lease_ms: i64) -> Result<u64, StoreError> {
        self.store.reclaim_running(lease_ms).await
    }
}

/// What a model call cost at `pricing` (nothing without one).
pub fn cost(pricing: Option<&Pricing>, usage: &Usage) -> f64 {
    pricing.map_or(0.0, |pricing| pricing.cost(usage))
}
