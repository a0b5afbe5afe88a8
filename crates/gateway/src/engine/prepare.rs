//! Preparing a response: the request checked against the project's deployment, server tools and stored
//! responses, its context assembled, and (for responses someone may look for while they run) its row written.
//! Nothing is stored when any check fails.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use foldhash::HashSet;

use gateway_core::context::pair_calls;
use gateway_core::decide::LoopInput;
use gateway_core::events::Event;
use gateway_core::items::InputItem;
use gateway_core::output::render_output;
use gateway_core::preparation::{
    apply_ignored_params, apply_unsupported_tools, check_remote_names, check_tools, pairing_param,
    referenced_ids, resolve_input,
};
use gateway_core::request::{ResponseParams, ValidRequest};
use gateway_core::response::{ResponseRecord, ResponseState};
use gateway_core::steps::{ListingStep, ModelStep, Step, StepBody, StepState};
use gateway_core::{decide_next_action, Item, Limits, NextAction};
use tokio::sync::{broadcast, OwnedSemaphorePermit};

use crate::store::notify::Notification;

use super::journal::{Journal, RowUnwritten};
use super::runs::Registration;
use super::server_tools::{bind_hosted_tools, remote_names, source_of, stored, unsent_step};
use super::{Admitted, Engine, EngineError, Origin, Run};
use crate::clock::now;
use crate::ids::{item_id, new_id};
use crate::store::responses::{Durability, IdempotencyKey, NewResponse};
use crate::store::tenancy::{Deployment, Resolution};
use crate::store::StoreError;
use crate::tools::ServerTools;

/// What preparing a request gave.
// It lives for the length of one call, moved once: boxing the run would cost an allocation for nothing.
#[allow(clippy::large_enum_variant)]
pub enum Prepared {
    /// A run to start now.
    Run(Run),
    /// A background response stored as queued, for the first replica with room to take.
    Queued(ResponseRecord),
}

impl Engine {
    /// Validates a foreground `request` against the project's deployments, tools and stored responses, and
    /// builds the run. A streamed response, and one created with an `Idempotency-Key`, are stored now; any other
    /// stored response with its first step boundary that waits for the disk (see `journal.rs`).
    pub async fn prepare(
        &self,
        admitted: Admitted,
        request: ValidRequest,
        idempotency_key: Option<IdempotencyKey<'_>>,
    ) -> Result<Run, EngineError> {
        match self
            .prepare_any(admitted, request, idempotency_key, None)
            .await?
        {
            Prepared::Run(run) => Ok(run),
            // Only a background request is queued.
            Prepared::Queued(_) => Err(EngineError::Overloaded),
        }
    }

    /// Like [`prepare`](Engine::prepare) for a foreground request whose previous response is given rather than
    /// read from the store: `previous` is its whole context, output included (a WebSocket connection keeps the
    /// last `store: false` response in memory, SPEC 11).
    pub async fn prepare_continuing(
        &self,
        admitted: Admitted,
        request: ValidRequest,
        previous: Vec<Item>,
    ) -> Result<Run, EngineError> {
        match self
            .prepare_any(admitted, request, None, Some(previous))
            .await?
        {
            Prepared::Run(run) => Ok(run),
            Prepared::Queued(_) => Err(EngineError::Overloaded),
        }
    }

    /// Stores a background request as queued and starts it when this replica has room; otherwise the first
    /// replica with room takes it. Answers the response as it was stored, and (with `follow`) its live events
    /// when it runs here.
    pub async fn submit(
        &self,
        admitted: Admitted,
        request: ValidRequest,
        idempotency_key: Option<IdempotencyKey<'_>>,
        follow: bool,
    ) -> Result<(ResponseRecord, Option<broadcast::Receiver<Event>>), EngineError> {
        match self
            .prepare_any(admitted, request, idempotency_key, None)
            .await?
        {
            Prepared::Run(run) => {
                let record = run.record.clone();
                // Following before the run starts, so that no live event is missed.
                let live = follow
                    .then(|| self.replica.runs.follow(&record.id))
                    .flatten();
                let sink = super::EventSink::for_followers(&run.record, &run.steps);
                self.spawn(run, sink);
                Ok((record, live))
            }
            Prepared::Queued(record) => {
                // No room here: whichever replica has room takes it.
                self.tell_all(Notification::Work).await;
                Ok((record, None))
            }
        }
    }

    /// Prepares any request (see [`Engine::prepare_phases`]), boxed: its state is kilobytes, and the futures that
    /// would hold it inline (a create's, the handler's) are moved whole.
    fn prepare_any<'a>(
        &'a self,
        governed: Admitted,
        request: ValidRequest,
        idempotency_key: Option<IdempotencyKey<'a>>,
        known_previous: Option<Vec<Item>>,
    ) -> futures::future::BoxFuture<'a, Result<Prepared, EngineError>> {
        Box::pin(self.prepare_phases(governed, request, idempotency_key, known_previous))
    }

    /// Prepares any request, in phases: admission, the tools it may use, its context, the tools of its own MCP
    /// servers, its first steps, its row (written now when someone may look for it), and its run.
    async fn prepare_phases(
        &self,
        governed: Admitted,
        mut request: ValidRequest,
        idempotency_key: Option<IdempotencyKey<'_>>,
        known_previous: Option<Vec<Item>>,
    ) -> Result<Prepared, EngineError> {
        let project_id = governed.payer.project_id.clone();
        let project_id = project_id.as_str();
        let admitted = self.admit(request.background)?;
        let resolution = self.resolution(project_id, &request.model).await?;
        let mut server_tools = self.tools_for(&resolution, &mut request).await?;
        let response_id = new_id("resp");
        // From here on, every line the request logs names its response.
        tracing::Span::current().record("response.id", response_id.as_str());
        let input = std::mem::take(&mut request.input);
        let (context, first_new) = self
            .starting_context(
                project_id,
                input,
                Start::of(&request, known_previous),
                &response_id,
            )
            .await?;
        if request.params.conversation.is_some() {
            request.params.conversation_turn_from = Some(first_new);
        }
        let listings = self
            .add_remote_tools(&request.params, &context, &response_id, &mut server_tools)
            .await?;
        let limits = self.limits_for(request.params.max_tool_calls);
        let steps = first_steps(
            &request,
            &server_tools,
            (&context, first_new),
            listings,
            limits,
            &response_id,
        )?;
        let plan = Plan {
            project_id,
            idempotency_key,
            // A response that someone may look for while it runs (its stream told the client its id) or that
            // must be found by its Idempotency-Key is written now. Any other is written with its first step
            // boundary: before a tool request goes out, or with its ending. Until then nothing outside this call
            // knows it, and a crash leaves nothing half-done behind (the client, cut off, sends it again).
            write_now: request.store
                && (request.stream || request.background || idempotency_key.is_some()),
            record: new_record(response_id, request),
            deployment: Arc::clone(&resolution.deployment),
            server_tools,
            context,
            steps,
            limits,
            governed,
        };
        // A run here is registered before its row is written: a running row this replica owns and runs nowhere
        // here is then one whose request went away while its write was queued (the write lands all the same), or
        // whose run panicked, and the replica hands it over (`worker.rs`, `hand_over_unrun`).
        let place = match admitted {
            Some(permit) => Some((permit, self.register_new(&plan.record.id)?)),
            None => None,
        };
        if plan.write_now {
            self.store_new(&plan, place.is_some()).await?;
        }
        match place {
            Some((permit, registration)) => {
                Ok(Prepared::Run(self.start(plan, permit, registration)))
            }
            None => {
                // Left queued, it gives its places back before it is answered (it takes them again to start), so
                // that its key's next create finds them free.
                if let Some(running) = plan.governed.running {
                    running.give_back().await;
                }
                Ok(Prepared::Queued(plan.record))
            }
        }
    }

    /// The place among this replica's runs of a new response, `id`, under the first claim.
    fn register_new(&self, id: &str) -> Result<Registration, EngineError> {
        // A fresh id runs nowhere yet.
        self.replica
            .runs
            .register(id, 0)
            .ok_or(EngineError::TaskFailed)
    }

    /// A place among the responses running, or `None` for a background request that waits in the store for a
    /// replica with room; a full gateway says so at once, before any work, rather than letting requests queue
    /// without bound.
    fn admit(&self, background: bool) -> Result<Option<OwnedSemaphorePermit>, EngineError> {
        if !self.replica.is_accepting() {
            crate::metrics::response_refused("shutting_down");
            return Err(EngineError::ShuttingDown);
        }
        match Arc::clone(&self.admission).try_acquire_owned() {
            Ok(permit) => Ok(Some(permit)),
            Err(_) if background => Ok(None),
            Err(_) => {
                crate::metrics::response_refused("overloaded");
                Err(EngineError::Overloaded)
            }
        }
    }

    /// The deployment the project may use under `model`, with its tool sources.
    pub(super) async fn resolution(
        &self,
        project_id: &str,
        model: &str,
    ) -> Result<Arc<Resolution>, EngineError> {
        let resolution = self.resolver.resolve(project_id, model).await?;
        resolution.ok_or_else(|| EngineError::ModelNotFound {
            model: model.to_owned(),
        })
    }

    /// The server tools the request may use: MCP sources become the tools their servers list now (cached per
    /// source), sources bound to a hosted type serve it only when the request declares it, and declared tools
    /// nothing serves go as the deployment's policy says.
    pub(super) async fn tools_for(
        &self,
        resolution: &Resolution,
        request: &mut ValidRequest,
    ) -> Result<ServerTools, EngineError> {
        let sources = resolution.tools.iter().cloned().map(source_of).collect();
        let expanded = self.tools.expand(sources).await;
        let (server_tools, served) = bind_hosted_tools(expanded, &request.params.tools);
        let policy = resolution.deployment.unsupported_tools;
        if let Some(listed) = apply_unsupported_tools(&mut request.params, &served, policy)? {
            tracing::info!(model = %request.model, tools.ignored = %listed, "tools of types nothing serves are left out");
        }
        let kind = resolution.deployment.provider_kind;
        let params_policy = resolution.deployment.unsupported_params;
        if let Some(listed) =
            apply_ignored_params(&mut request.params, &request.input, kind, params_policy)?
        {
            tracing::info!(model = %request.model, params.ignored = %listed, provider = kind.as_str(), "parameters the provider kind cannot honour are left out");
        }
        Ok(server_tools)
    }

    /// The context a response starts from, and where its input starts in it: the previous response's context and
    /// output (`known` when the caller holds it) or the conversation's items, then the input, references
    /// resolved and compactions opened.
    pub(super) async fn starting_context(
        &self,
        project_id: &str,
        input: Vec<InputItem>,
        start: Start<'_>,
        response_id: &str,
    ) -> Result<(Vec<Item>, usize), EngineError> {
        let input = self.resolve_references(project_id, input).await?;
        // What a stored compaction that does not open is named by, when it is not one of the input's.
        let earlier = match start {
            Start::Conversation(_) => "conversation",
            _ => "previous_response_id",
        };
        let mut context = match start {
            Start::Previous {
                known: Some(known), ..
            } => known,
            Start::Previous { id, known: None } => self.previous_context(project_id, id).await?,
            Start::Conversation(id) => self.conversation_context(project_id, id).await?,
            Start::Fresh => Vec::new(),
        };
        let first_new = context.len();
        add_input(&mut context, input, response_id);
        self.open_compactions(project_id, &mut context, first_new, earlier)
            .await?;
        Ok((context, first_new))
    }

    /// Adds the tools of the request's own MCP servers (listed now unless the chain already holds their listing)
    /// to `server_tools`, once their names are checked; answers the listings made.
    async fn add_remote_tools(
        &self,
        params: &ResponseParams,
        context: &[Item],
        response_id: &str,
        server_tools: &mut ServerTools,
    ) -> Result<Vec<ListingStep>, EngineError> {
        let remote = self
            .remote_tools(&params.tools, context, response_id)
            .await?;
        check_remote_names(params, server_tools.names(), &remote_names(&remote.tools))?;
        server_tools.extend(remote.tools);
        Ok(remote.listings)
    }

    /// Writes a response's row now, with its first steps.
    async fn store_new(&self, plan: &Plan<'_>, owned: bool) -> Result<(), EngineError> {
        let owner = owned.then_some(self.replica.id.as_str());
        let background = plan.record.background;
        self.create_row(
            &NewResponse {
                record: &plan.record,
                project_id: plan.project_id,
                deployment_id: &plan.deployment.id,
                server_tools: &stored(&plan.server_tools),
                context: &plan.context,
                steps: &plan.steps,
                idempotency_key: plan.idempotency_key,
                owner,
                // A foreground response's deadline runs from now; a background one's from when a replica
                // starts it.
                deadline_in_ms: (!background).then(|| self.deadline_ms()),
                api_key_id: plan.governed.payer.key_id.as_deref(),
                usage: &[],
                trace_context: crate::telemetry::current_traceparent().as_deref(),
            },
            // A background response is answered `queued` at once: it must outlive a crash of the database
            // server from then on. The others run on, and their next writes make this one durable before
            // anything else happens.
            if background {
                Durability::Flush
            } else {
                self.relaxed()
            },
        )
        .await
        .map_err(|RowUnwritten { failure, in_doubt }| match failure {
            // Two creates with one Idempotency-Key raced: the other one is running it.
            StoreError::Conflict(_) => EngineError::IdempotencyInProgress,
            // Another's already: an earlier try made the row (its reply lost), and another replica took it.
            failure if in_doubt || matches!(failure, StoreError::NotOwner) => {
                // A try may have committed with its reply lost, whatever the last one met: the response may be
                // stored, and is run by whichever replica claims it (once the store answers, this one hands it
                // over), never left owned by nobody running. Its client is told so, not that nothing was stored.
                tracing::warn!(response.id = %plan.record.id, error = %failure, "a new response may be stored though writing it failed; handing it over");
                if owned {
                    self.replica.release_later(&plan.record.id, 0);
                }
                EngineError::HandedOver {
                    response_id: plan.record.id.clone(),
                    retry_safe: plan.idempotency_key.is_some(),
                }
            }
            failure => EngineError::NothingStored(failure),
        })
    }

    /// The run of a prepared response, in its place among this replica's runs.
    fn start(
        &self,
        plan: Plan<'_>,
        admitted: OwnedSemaphorePermit,
        registration: Registration,
    ) -> Run {
        let store = plan.record.store;
        Run {
            project_id: plan.project_id.to_owned(),
            keyed: plan.idempotency_key.is_some(),
            deployment: plan.deployment,
            server_tools: plan.server_tools,
            journal: Journal::new(store, plan.project_id, plan.write_now, plan.steps.len()),
            context: plan.context,
            steps: plan.steps,
            limits: plan.limits,
            deadline: Instant::now() + Duration::from_millis(self.limits.response_deadline_ms),
            origin: if plan.record.background {
                Origin::Queued
            } else {
                Origin::New
            },
            record: plan.record,
            registration,
            store_says: None,
            _admitted: admitted,
            payer: plan.governed.payer,
            unrecorded_usage: Vec::new(),
            running: plan.governed.running,
            trace_context: crate::telemetry::current_traceparent(),
        }
    }

    /// The loop's limits for a request that asked for `max_tool_calls`: it may lower the operator's ceiling, not
    /// raise it.
    pub(super) fn limits_for(&self, max_tool_calls: Option<u32>) -> Limits {
        let ceiling = self.limits.max_tool_calls;
        Limits {
            max_tool_calls: Some(max_tool_calls.map_or(ceiling, |n| n.min(ceiling))),
            max_model_calls: self.limits.max_model_calls,
            max_failing_batches: self.limits.max_failing_batches,
        }
    }

    /// The whole-response deadline, in milliseconds.
    pub(super) fn deadline_ms(&self) -> i64 {
        i64::try_from(self.limits.response_deadline_ms).unwrap_or(i64::MAX)
    }

    /// The items of a conversation of `project_id`, as a response that names it starts from.
    pub(super) async fn conversation_context(
        &self,
        project_id: &str,
        conversation_id: &str,
    ) -> Result<Vec<Item>, EngineError> {
        let items = self
            .store
            .conversation_items(project_id, conversation_id)
            .await?
            .ok_or_else(|| EngineError::ConversationNotFound {
                id: conversation_id.to_owned(),
            })?;
        items
            .into_iter()
            .map(|item| {
                serde_json::from_value(item)
                    .map_err(|e| EngineError::Store(StoreError::Corrupt(e.to_string())))
            })
            .collect()
    }

    /// The context a chained response starts from: the previous response's context, then its output.
    pub(super) async fn previous_context(
        &self,
        project_id: &str,
        previous_id: &str,
    ) -> Result<Vec<Item>, EngineError> {
        let previous = self
            .store
            .load_response(project_id, previous_id)
            .await?
            .ok_or_else(|| EngineError::PreviousNotFound {
                id: previous_id.to_owned(),
            })?;
        let Some(ending) = previous.record.ending() else {
            return Err(EngineError::PreviousInProgress {
                id: previous_id.to_owned(),
                status: previous.record.status(),
            });
        };
        let mut context = self.store.load_context(project_id, previous_id).await?;
        let steps = self.store.load_steps(project_id, previous_id).await?;
        context.extend(render_output(&steps, ending.handed_back()));
        Ok(context)
    }

    /// The input with each `item_reference` replaced by the stored item it names (SPEC 5).
    pub async fn resolve_references(
        &self,
        project_id: &str,
        input: Vec<InputItem>,
    ) -> Result<Vec<Item>, EngineError> {
        let mut found = HashMap::new();
        for id in referenced_ids(&input) {
            // Boxed: a request without references (most) should not carry the query's kilobytes of future.
            if let Some(item) = Box::pin(self.store.find_item(project_id, id)).await? {
                found.insert(id.to_owned(), item);
            }
        }
        Ok(resolve_input(input, &found)?)
    }
}

/// What a response's context starts from, before its input.
pub(super) enum Start<'a> {
    /// A new context.
    Fresh,
    /// The previous response's context and output (`known` when the caller holds them).
    Previous {
        id: &'a str,
        known: Option<Vec<Item>>,
    },
    /// The items of a conversation.
    Conversation(&'a str),
}

impl<'a> Start<'a> {
    pub(super) fn of(request: &'a ValidRequest, known: Option<Vec<Item>>) -> Start<'a> {
        match (&request.previous_response_id, &request.params.conversation) {
            (Some(id), _) => Start::Previous { id, known },
            (None, Some(conversation)) => Start::Conversation(conversation),
            (None, None) => Start::Fresh,
        }
    }
}

/// A prepared response before it runs: what its row and its run start from.
struct Plan<'a> {
    project_id: &'a str,
    idempotency_key: Option<IdempotencyKey<'a>>,
    /// Its row is written as it is prepared.
    write_now: bool,
    record: ResponseRecord,
    deployment: Arc<Deployment>,
    server_tools: ServerTools,
    context: Vec<Item>,
    steps: Vec<Step>,
    limits: Limits,
    /// Who pays, and its places under `max_concurrent` limits (a queued response gives them back).
    governed: Admitted,
}

/// The steps a response starts with, once the request's tools and its context's calls check out: the listings
/// of its own MCP servers, as they happened; then the calls carried over from the client's answer (an approval,
/// say); then, when the loop would call the model first, that call (recorded with the response itself: one write
/// instead of two; a background response records it when a replica starts it).
fn first_steps(
    request: &ValidRequest,
    server_tools: &ServerTools,
    (context, first_new): (&[Item], usize),
    listings: Vec<ListingStep>,
    limits: Limits,
    response_id: &str,
) -> Result<Vec<Step>, EngineError> {
    check_tools(&request.params, server_tools.names())?;
    let carried = pair_calls(context, first_new, server_tools.names()).map_err(|error| {
        let earlier = if request.params.conversation.is_some() {
            "conversation"
        } else {
            "input"
        };
        let param = pairing_param(&error, first_new, earlier);
        EngineError::Pairing { error, param }
    })?;
    let mut steps: Vec<Step> = listings
        .into_iter()
        .map(|listing| Step {
            seq: 0,
            state: StepState::Succeeded,
            body: StepBody::Listing(listing),
        })
        .collect();
    steps.extend(
        carried
            .into_iter()
            .map(|call| unsent_step(server_tools, call, None, false, response_id)),
    );
    for (seq, step) in steps.iter_mut().enumerate() {
        step.seq = seq as u32;
    }
    let first = decide_next_action(&LoopInput {
        steps: &steps,
        registered: server_tools.names(),
        limits,
        deadline_passed: false,
        budget_spent: false,
    });
    if first == NextAction::CallModel && !request.background {
        steps.push(Step {
            seq: steps.len() as u32,
            state: StepState::Running,
            body: StepBody::Model(ModelStep::default()),
        });
    }
    Ok(steps)
}

/// The record of a new response: queued when it runs in the background, in progress otherwise.
fn new_record(id: String, request: ValidRequest) -> ResponseRecord {
    ResponseRecord {
        id,
        created_at: now(),
        model: request.model,
        params: request.params,
        previous_response_id: request.previous_response_id,
        store: request.store,
        background: request.background,
        state: if request.background {
            ResponseState::Queued
        } else {
            ResponseState::InProgress
        },
        usage: None,
    }
}

/// Appends the request's input to the context. Ids that clients send are kept when unique within the context,
/// and replaced otherwise; items without one get a fresh id of the response's.
pub(super) fn add_input(context: &mut Vec<Item>, input: Vec<Item>, response_id: &str) {
    let mut taken: HashSet<String> = context
        .iter()
        .filter_map(|i| i.id().map(str::to_owned))
        .collect();
    for mut item in input {
        let keep = item
            .id()
            .is_some_and(|id| !id.is_empty() && !taken.contains(id));
        if !keep {
            item.set_id(item_id(item.id_prefix(), response_id));
        }
        taken.insert(item.id().unwrap_or_default().to_owned());
        context.push(item);
    }
}
