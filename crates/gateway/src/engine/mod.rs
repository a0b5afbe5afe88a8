//! The engine: prepares responses and drives their loop over stored steps.
//!
//! * [`prepare`](Engine::prepare) (in `prepare.rs`) checks a request against the project's deployments, tools and
//!   stored responses and builds the [`Run`], storing nothing when it fails;
//! * [`run`](Engine::run) (in `driver.rs`) drives it to its end: ask `decide_next_action`, carry the action out,
//!   report progress to a [`ProgressSink`], repeat;
//! * `journal.rs` decides what is written when (the step boundaries, their durability and linger).

mod driver;
mod error;
mod journal;
mod prepare;
mod progress;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gateway_core::output::response_object;
use gateway_core::response::ResponseRecord;
use gateway_core::{Item, Limits, Step};
use serde_json::Value;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

pub use error::EngineError;
pub use progress::{ProgressSink, Silent};

use crate::config::Config;
use crate::resolver::Resolver;
use crate::store::tenancy::{Deployment, ToolSource};
use crate::store::{Store, StoreError};
use crate::tools::ToolExecutor;
use crate::upstream::Upstream;
use journal::Journal;

/// Runs responses: preparation against the tenancy and the stored context, and the loop itself. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Engine {
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
}

/// One response being driven: everything the loop needs, held in memory while it runs.
pub struct Run {
    record: ResponseRecord,
    deployment: Deployment,
    server_tools: Vec<ToolSource>,
    registered: BTreeSet<String>,
    context: Vec<Item>,
    steps: Vec<Step>,
    limits: Limits,
    deadline: Instant,
    /// What of this run is in the store, and what is still to write.
    journal: Journal,
    /// This response's place among those running; given back when the run ends.
    _admitted: OwnedSemaphorePermit,
}

impl Run {
    pub fn response_id(&self) -> &str {
        &self.record.id
    }
}

/// A response that ended; `record` says how.
#[derive(Debug, Clone)]
pub struct Finished {
    pub record: ResponseRecord,
    pub output: Vec<Item>,
}

impl Finished {
    /// The `Response` object clients see.
    pub fn object(&self) -> Value {
        response_object(&self.record, &self.output)
    }
}

impl Engine {
    /// An engine on `store`, with the upstream, tool and tenancy settings of `config`.
    pub fn new(store: Store, config: &Config) -> Result<Engine, reqwest::Error> {
        Ok(Engine {
            resolver: Resolver::new(
                store.clone(),
                Duration::from_millis(config.tenancy.cache_ttl_ms),
            ),
            upstream: Upstream::new(config.upstream.clone())?,
            tools: ToolExecutor::new(config.tools.clone())?,
            limits: config.limits.clone(),
            flush_every_step: config.database.flush_every_step,
            admission: Arc::new(Semaphore::new(config.server.max_active_responses)),
            store,
        })
    }

    /// The project of a live API key.
    pub async fn project_for_key(&self, key: &str) -> Result<Option<String>, StoreError> {
        self.resolver.project_for_key(key).await
    }

    /// Forgets cached key and model resolutions (after an admin write).
    pub fn forget_cached_tenancy(&self) {
        self.resolver.invalidate();
    }

    /// Prepares and runs a response to its end, reporting to nobody. The loop runs on its own task, so a client
    /// that goes away does not abandon the response halfway.
    pub async fn create(
        &self,
        project_id: &str,
        request: gateway_core::request::ValidRequest,
        idempotency_key: Option<&str>,
    ) -> Result<Finished, EngineError> {
        let run = self.prepare(project_id, request, idempotency_key).await?;
        let engine = self.clone();
        // The task keeps the request's span, so its log lines carry the request id.
        tokio::spawn(tracing::Instrument::in_current_span(async move {
            engine.run(run, Silent).await
        }))
        .await
        .map_err(|e| {
            tracing::error!(error = %e, "response task failed");
            EngineError::TaskFailed
        })?
    }
}
