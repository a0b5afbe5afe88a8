//! The engine: prepares responses and drives their loop over stored steps, on whichever replica owns them.
//!
//! * [`prepare`](Engine::prepare) (in `prepare.rs`) checks a request against the project's deployments, tools and
//!   stored responses and builds the [`Run`], storing nothing when it fails;
//! * [`run`](Engine::run) (in `driver.rs`) drives it to its end: ask `decide_next_action`, carry the action out,
//!   report progress to a [`ProgressSink`], repeat (a model call in `model_call.rs`, a batch of tool calls in
//!   `tool_batch.rs`); it stops early when told to (`runs.rs`);
//! * `journal.rs` decides what is written when (the step boundaries, their durability and linger), and only
//!   while this replica owns the response;
//! * `worker.rs` keeps this replica's lease, takes over the responses of replicas that stopped beating and
//!   the background responses nobody took, and hands its own over on shutdown; `resume.rs` rebuilds a run from
//!   its stored steps.

mod accounting;
mod check;
mod compact;
mod conversation;
mod count;
mod driver;
mod error;
mod journal;
mod model_call;
mod outlive;
mod prepare;
mod progress;
mod remote;
mod replica;
mod resume;
mod runs;
mod server_tools;
mod spans;
mod tool_batch;
mod worker;

use std::sync::Arc;
use std::time::{Duration, Instant};

use gateway_core::output::ResponseObject;
use gateway_core::response::ResponseRecord;
use gateway_core::{Item, Limits, Step};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

pub use check::DeploymentCheck;
pub use compact::Compacted;
pub use error::{EngineError, StartError};
pub use progress::{EventSink, ProgressSink, Silent};
pub use replica::Replica;
pub use runs::Stop;
pub use worker::Worker;

use crate::config::Config;
use crate::governance::{Governor, Payer, RunningPlace};
use crate::resolver::Resolver;
use crate::store::governance::UsageRecord;
use crate::store::notify::Notification;
use crate::store::tenancy::{Deployment, ToolSource};
use crate::store::{Store, StoreError};
use crate::tools::ServerTools;
use crate::tools::ToolExecutor;
use crate::upstream::Upstream;
use journal::Journal;
use outlive::Outliving;
use runs::Registration;

/// Runs responses: preparation against the tenancy and the stored context, and the loop itself. Cheap to clone:
/// one reference count for all of its parts (a request clones it several times, every run once).
#[derive(Debug, Clone)]
pub struct Engine(Arc<Parts>);

impl std::ops::Deref for Engine {
    type Target = Parts;

    fn deref(&self) -> &Parts {
        &self.0
    }
}

/// What an engine holds.
#[derive(Debug)]
pub struct Parts {
    store: Store,
    resolver: Resolver,
    upstream: Upstream,
    tools: ToolExecutor,
    limits: crate::config::LimitsConfig,
    /// Every step boundary waits for its commit to reach the disk, not only those that must
    /// (`database.flush_every_step`).
    flush_every_step: bool,
    /// One permit per response running (`server.max_active_responses`).
    admission: Arc<Semaphore>,
    replica: Arc<Replica>,
    /// Seals and opens compaction items (SPEC 11).
    sealer: Arc<crate::compaction::Sealer>,
    /// Limits, budgets and usage (SPEC 13).
    governor: Arc<Governor>,
    /// Delivers the webhook events of background responses (SPEC 15).
    deliverer: crate::webhooks::Deliverer,
}

/// A create let through governance: who pays for it, and its places under `max_concurrent` limits.
#[derive(Debug)]
pub struct Admitted {
    pub payer: Payer,
    pub running: Option<RunningPlace>,
}

/// How a run came to be, which decides what it reports first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Origin {
    /// Prepared from a request: it reports its creation and start.
    New,
    /// A queued background response that starts now: its creation was reported when it was queued.
    Queued,
    /// Resumed from its stored steps after its replica stopped: what they hold was reported before.
    Resumed,
}

/// One response being driven: everything the loop needs, held in memory while it runs.
pub struct Run {
    record: ResponseRecord,
    project_id: String,
    /// Created with an `Idempotency-Key`: a repeated create may wait for its end.
    keyed: bool,
    deployment: Arc<Deployment>,
    /// The server tools it may call, by name; the other tools are the client's.
    server_tools: ServerTools,
    context: Vec<Item>,
    steps: Vec<Step>,
    limits: Limits,
    deadline: Instant,
    origin: Origin,
    /// What of this run is in the store, and what is still to write.
    journal: Journal,
    /// Its place among this replica's runs: how it is told to stop.
    registration: Registration,
    /// What a write learnt: a cancel asked the response to stop (a notification may not have arrived), or this
    /// replica no longer drives it.
    store_says: Option<Stop>,
    /// This response's place among those running; given back when the run ends.
    _admitted: OwnedSemaphorePermit,
    /// The key and project its usage counts against (SPEC 13).
    payer: Payer,
    /// Usage of its calls not yet written: it goes with the next step write.
    unrecorded_usage: Vec<UsageRecord>,
    /// Its places under `max_concurrent` limits; given back once its ending is written, before it is reported.
    running: Option<RunningPlace>,
    /// The W3C `traceparent` of the trace it was created in (SPEC 14): its run's spans continue that trace.
    trace_context: Option<String>,
}

/// Whether `run` goes on after the request that started it was answered: a background response.
fn run_outlives_request(run: &Run) -> bool {
    run.record.background
}

impl Run {
    /// The id of the response this run drives.
    pub fn response_id(&self) -> &str {
        &self.record.id
    }

    /// The context the response starts from: the previous response's context and output, then its input.
    pub fn context(&self) -> &[Item] {
        &self.context
    }

    /// Why the run must stop now, if it must; giving the response up wins over a cancel.
    fn stop(&self) -> Option<Stop> {
        let told = *self.registration.stop.borrow();
        match (told, self.store_says) {
            (Some(Stop::Abandon), _) | (_, Some(Stop::Abandon)) => Some(Stop::Abandon),
            (told, said) => told.or(said),
        }
    }

    /// Notes what a write learnt about the response.
    fn heard(&mut self, stop: Stop) {
        if self.store_says != Some(Stop::Abandon) {
            self.store_says = Some(stop);
        }
    }
}

/// A response that ended; `record` says how.
#[derive(Debug, Clone)]
pub struct Finished {
    pub record: ResponseRecord,
    pub output: Vec<Item>,
}

impl Finished {
    /// The `Response` object clients see, borrowed (written out without a `Value` tree on the way).
    pub fn view(&self) -> ResponseObject<'_> {
        ResponseObject::new(&self.record, &self.output)
    }
}

impl Engine {
    /// The server tool names each of `sources` offers now (an MCP source: its server's tools as listed,
    /// filtered and prefixed), as `(tool name, source name)`.
    pub async fn offered_tool_names(&self, sources: Vec<ToolSource>) -> Vec<(String, String)> {
        let mut names = Vec::new();
        for source in sources {
            let source_name = source.name.clone();
            for tool in self
                .tools
                .expand(vec![server_tools::source_of(source)])
                .await
            {
                names.push((tool.name, source_name.clone()));
            }
        }
        names
    }

    /// The server tools `source` offers now (an MCP source: its server's tools as listed, filtered and prefixed).
    pub async fn source_tools(&self, source: ToolSource) -> Vec<crate::tools::ServerTool> {
        self.tools
            .expand(vec![server_tools::source_of(source)])
            .await
    }

    /// An engine on `store`, with the upstream, tool, tenancy and durability settings of `config`.
    pub fn new(store: Store, config: &Config) -> Result<Engine, StartError> {
        let replica = Arc::new(Replica::new(&config.durability));
        Ok(Engine(Arc::new(Parts {
            governor: Governor::new(
                store.clone(),
                replica.id.clone(),
                Duration::from_millis(config.governance.sync_ms),
                Duration::from_millis(config.governance.usage_flush_ms),
            ),
            resolver: Resolver::new(
                store.clone(),
                Duration::from_millis(config.tenancy.cache_ttl_ms),
            ),
            upstream: Upstream::new(config.upstream.clone())
                .map_err(StartError::http_client("upstream"))?,
            tools: ToolExecutor::new(config.tools.clone())
                .map_err(StartError::http_client("tools"))?,
            limits: config.limits.clone(),
            flush_every_step: config.database.flush_every_step,
            admission: Arc::new(Semaphore::new(config.server.max_active_responses)),
            replica,
            sealer: Arc::new(crate::compaction::Sealer::new(
                store.clone(),
                &config.compaction,
            )),
            deliverer: crate::webhooks::Deliverer::new(store.clone(), config.webhooks.clone())
                .map_err(StartError::http_client("webhooks"))?,
            store,
        })))
    }

    /// Limits, budgets and usage.
    pub fn governor(&self) -> &Governor {
        &self.governor
    }

    /// Whether a tool source's circuit breaker is open on this replica.
    pub fn tool_breaker_open(&self, source_id: &str) -> bool {
        self.tools.breaker_open(source_id)
    }

    /// This replica.
    pub fn replica(&self) -> &Replica {
        &self.replica
    }

    /// The project of a live API key.
    pub async fn grant_for_key(
        &self,
        key: &str,
    ) -> Result<Option<Arc<crate::store::governance::KeyGrant>>, StoreError> {
        self.resolver.grant_for_key(key).await
    }

    /// Notes that API key `key_id` was just used (its `last_used_at`, written at most once a minute).
    pub fn note_key_used(&self, key_id: &str) {
        self.resolver.note_used(key_id);
    }

    /// Forgets cached key and model resolutions (after an admin write), here and on every other replica.
    pub async fn forget_cached_tenancy(&self) {
        self.tell_all(Notification::Tenancy).await;
    }

    /// Prepares and runs a response to its end, reporting to nobody. The loop is polled on the request's task,
    /// and goes on on a task of its own if the request is dropped (its client went away), so that a client that
    /// leaves does not abandon the response halfway.
    pub async fn create(
        &self,
        admitted: Admitted,
        request: gateway_core::request::ValidRequest,
        idempotency_key: Option<crate::store::responses::IdempotencyKey<'_>>,
    ) -> Result<Finished, EngineError> {
        let run = self.prepare(admitted, request, idempotency_key).await?;
        let engine = self.clone();
        // Left behind, it keeps the request's span, so its log lines carry the request id. Boxed inside, so that
        // the request's future stays small.
        Outliving::new(async move { engine.run(run, Silent).await })
            .await
            .map_err(|outlive::Unanswered| {
                tracing::error!("response task failed: the run panicked");
                EngineError::TaskFailed
            })?
    }

    /// Starts `run` on its own task, reporting to `sink`; the handle answers how it ended, for a caller that must
    /// tell its client (errors are recorded with the response and logged where they happened, so dropping the
    /// handle loses nothing).
    pub fn spawn<S: ProgressSink + 'static>(
        &self,
        run: Run,
        sink: S,
    ) -> tokio::task::JoinHandle<Result<Finished, EngineError>> {
        let engine = self.clone();
        // A background run outlives its request: with traces on, it must not hold the request's span open (a
        // span is exported when it closes); its own span joins the trace through the stored trace context.
        let detached = run_outlives_request(&run) && crate::telemetry::traces_on();
        // Boxed, as in `create`.
        let task = Box::pin(async move { engine.run(run, sink).await });
        if detached {
            tokio::spawn(task)
        } else {
            tokio::spawn(tracing::Instrument::in_current_span(task))
        }
    }
}

#[cfg(test)]
mod future_sizes {
    //! The futures a create moves whole (into its task, out of it when it ends, into axum's box) stay small: the
    //! loop's and the preparation's are boxed once instead.

    use super::*;

    /// The size of what `f` returns, without calling it.
    fn returned<A, B, C, R, F: Fn(A, B, C) -> R>(_: &F) -> usize {
        std::mem::size_of::<R>()
    }

    #[test]
    fn a_run_and_a_create_are_futures_of_a_few_kilobytes() {
        let run = |e: Engine, r: Run, _: ()| async move { e.run(r, Silent).await };
        let create = |e: Engine, a: Admitted, q: gateway_core::request::ValidRequest| async move {
            e.create(a, q, None).await
        };
        // Unboxed they were 15,920 and 10,480 bytes (the loop's and the preparation's states inline).
        assert!(returned(&run) < 8 * 1024, "run: {} bytes", returned(&run));
        assert!(
            returned(&create) < 4 * 1024,
            "create: {} bytes",
            returned(&create)
        );
    }
}
