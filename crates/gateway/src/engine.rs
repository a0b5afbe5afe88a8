//! The driver of the loop: load steps, ask `decide_next_action`, persist, execute, repeat.

use std::collections::{BTreeSet, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use gateway_core::context::{make_call_ids_unique, model_conversation, pair_calls, PairingError};
use gateway_core::decide::LoopInput;
use gateway_core::output::{render_output, response_object, ResponseRecord, ResponseStatus};
use gateway_core::request::{FunctionTool, ValidRequest};
use gateway_core::steps::{
    total_usage, ModelDelta, ModelStep, Step, StepBody, StepState, ToolCall, ToolStep,
    UpstreamFailure,
};
use gateway_core::{decide_next_action, Item, Limits, NextAction};
use serde_json::Value;
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};

use crate::api::error::ApiError;
use crate::clock::now;
use crate::config::LimitsConfig;
use crate::ids::new_id;
use crate::resolver::Resolver;
use crate::store::responses::{Durability, Ending, NewResponse, StepWrite};
use crate::store::tenancy::{Deployment, ToolSource};
use crate::store::{Store, StoreError};
use crate::stream::{StreamSink, STREAM_BUFFER};
use crate::tools::{CallRef, ToolExecutor};
use crate::upstream::{Live, ModelRequest, Upstream};

/// How long a write that need not wait for the disk lingers for more to write with it: the write before a model
/// call waits this long for the call to end (a model that answers sooner has it folded into the next write), and
/// an ended tool call of a batch whose siblings still run waits this long for them.
const WRITE_LINGER: Duration = Duration::from_millis(5);

/// Runs responses: creation, validation against the context, and the loop itself.
#[derive(Debug, Clone)]
pub struct Engine {
    pub store: Store,
    pub resolver: Resolver,
    pub upstream: Upstream,
    pub tools: ToolExecutor,
    pub limits: LimitsConfig,
    /// Every step boundary waits for its commit to reach the disk, not only those that must
    /// (`database.flush_every_step`).
    pub flush_every_step: bool,
    /// One permit per response running (`server.max_active_responses`).
    pub admission: Arc<Semaphore>,
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
    /// `store: false` responses run entirely in memory.
    persist: bool,
    /// The project of a stored response whose row is not written yet: it is written with the first step
    /// boundary (see `prepare`).
    unwritten: Option<String>,
    /// How many of `steps` (the first ones) are in the store.
    stored: usize,
    /// Stored steps changed since the last write, by index.
    changed: BTreeSet<usize>,
    /// This response's place among those running; given back when the run ends.
    _admitted: OwnedSemaphorePermit,
}

/// A response that ended; `record` carries its final status.
pub struct Finished {
    pub record: ResponseRecord,
    pub output: Vec<Item>,
}

impl Finished {
    pub fn object(&self) -> Value {
        response_object(&self.record, &self.output)
    }
}

impl Run {
    pub fn response_id(&self) -> &str {
        &self.record.id
    }

    /// Notes that step `index` changed, so that the next write records it.
    fn touch(&mut self, index: usize) {
        if index < self.stored {
            self.changed.insert(index);
        }
    }
}

impl Engine {
    /// Prepares and runs a response to its end. The loop runs on its own task, so a client that goes away
    /// does not abandon the response halfway.
    pub async fn create(
        &self,
        project_id: &str,
        request: ValidRequest,
        idempotency_key: Option<&str>,
    ) -> Result<Finished, ApiError> {
        let run = self.prepare(project_id, request, idempotency_key).await?;
        let engine = self.clone();
        // The task keeps the request's span, so its log lines carry the request id.
        tokio::spawn(tracing::Instrument::in_current_span(async move {
            engine.run(run, None).await
        }))
        .await
        .map_err(|e| {
            tracing::error!(error = %e, "response task failed");
            ApiError::server("The response's task failed.")
        })?
    }

    /// Validates `request` against the project's deployments, tools and stored responses, and stores the
    /// new response with its context. Nothing is stored when validation fails.
    pub async fn prepare(
        &self,
        project_id: &str,
        request: ValidRequest,
        idempotency_key: Option<&str>,
    ) -> Result<Run, ApiError> {
        // A full gateway says so at once, before any work, rather than letting requests queue without bound.
        let admitted = Arc::clone(&self.admission)
            .try_acquire_owned()
            .map_err(|_| {
                crate::metrics::response_refused("overloaded");
                ApiError::overloaded(
                    "The gateway is running as many responses as it may at once; retry shortly.",
                )
            })?;
        let resolution = self
            .resolver
            .resolve(project_id, &request.model)
            .await?
            .ok_or_else(|| ApiError {
                status: axum::http::StatusCode::NOT_FOUND,
                ..ApiError::invalid(
                    format!(
                        "The model '{}' does not exist or you do not have access to it.",
                        request.model
                    ),
                    Some("model"),
                    Some("model_not_found"),
                )
            })?;
        let registered: BTreeSet<String> =
            resolution.tools.iter().map(|t| t.name.clone()).collect();
        if let Some(index) = request
            .params
            .tools
            .iter()
            .position(|t| registered.contains(&t.name))
        {
            let name = &request.params.tools[index].name;
            return Err(ApiError::invalid(
                format!("Tool '{name}' clashes with a server tool of the same name that this key may use; rename the client tool."),
                Some(&format!("tools[{index}].name")),
                Some("tool_name_conflict"),
            ));
        }

        let mut context = match &request.previous_response_id {
            Some(previous_id) => self.previous_context(project_id, previous_id).await?,
            None => Vec::new(),
        };
        let mut taken: HashSet<String> = context
            .iter()
            .filter_map(|i| i.id().map(str::to_owned))
            .collect();
        let first_new = context.len();
        for mut item in request.input {
            let keep = item
                .id()
                .is_some_and(|id| !id.is_empty() && !taken.contains(id));
            if !keep {
                item.set_id(new_id(item.id_prefix()));
            }
            taken.insert(item.id().unwrap_or_default().to_owned());
            context.push(item);
        }
        let carried = pair_calls(&context, &registered).map_err(|e| pairing_error(e, first_new))?;

        let limits = Limits {
            max_tool_calls: Some(
                request
                    .params
                    .max_tool_calls
                    .map_or(self.limits.max_tool_calls, |n| {
                        n.min(self.limits.max_tool_calls)
                    }),
            ),
            max_model_calls: self.limits.max_model_calls,
            max_failing_batches: self.limits.max_failing_batches,
        };
        let mut steps: Vec<Step> = carried
            .into_iter()
            .enumerate()
            .map(|(seq, call)| Step {
                seq: seq as u32,
                state: StepState::Pending,
                body: StepBody::Tool(ToolStep {
                    item_id: new_id("mcp"),
                    call,
                    batch: None,
                    outcome: None,
                }),
            })
            .collect();
        let first = decide_next_action(&LoopInput {
            steps: &steps,
            registered: &registered,
            limits,
            deadline_passed: false,
        });
        if first == NextAction::CallModel {
            // The first model call is recorded with the response itself: one write instead of two.
            steps.push(Step {
                seq: steps.len() as u32,
                state: StepState::Running,
                body: StepBody::Model(ModelStep::default()),
            });
        }
        let record = ResponseRecord {
            id: new_id("resp"),
            created_at: now(),
            completed_at: None,
            status: ResponseStatus::InProgress,
            model: request.model,
            params: request.params,
            previous_response_id: request.previous_response_id,
            store: request.store,
            background: request.background,
            error: None,
            incomplete_reason: None,
            usage: None,
        };
        // A response that someone may look for while it runs (its stream told the client its id) or that
        // must be found by its Idempotency-Key is written now. Any other is written with its first step
        // boundary: before a tool request goes out, or with its ending. Until then nothing outside this call
        // knows it, and a crash leaves nothing half-done behind (the client, cut off, sends it again).
        let write_now =
            request.store && (request.stream || request.background || idempotency_key.is_some());
        if write_now {
            self.store
                .create_response(
                    &NewResponse {
                        record: &record,
                        project_id,
                        deployment_id: &resolution.deployment.id,
                        server_tools: &resolution.tools,
                        context: &context,
                        steps: &steps,
                        handed_back: false,
                        idempotency_key,
                    },
                    self.relaxed(),
                )
                .await
                .map_err(|e| match e {
                    // Two creates with one Idempotency-Key raced: the other one is running it.
                    StoreError::Conflict(_) => ApiError::idempotency_in_progress(),
                    other => other.into(),
                })?;
        }
        let unwritten = (request.store && !write_now).then(|| project_id.to_owned());
        let steps_len = if write_now { steps.len() } else { 0 };
        Ok(Run {
            record,
            deployment: resolution.deployment.clone(),
            server_tools: resolution.tools.clone(),
            registered,
            context,
            steps,
            limits,
            deadline: Instant::now() + Duration::from_millis(self.limits.response_deadline_ms),
            persist: request.store,
            unwritten,
            stored: steps_len,
            changed: BTreeSet::new(),
            _admitted: admitted,
        })
    }

    /// Runs a prepared response to its end, streaming its events into `sink` when there is one.
    pub async fn run(
        &self,
        mut run: Run,
        mut sink: Option<StreamSink>,
    ) -> Result<Finished, ApiError> {
        let result = self.drive(&mut run, &mut sink).await;
        match result {
            Ok(finished) => Ok(finished),
            Err(e) => {
                tracing::error!(response.id = %run.record.id, error = %e, "store failed while running a response");
                // A response whose row was never written left nothing behind and ran no tool (its first tool
                // request waits for that write): the client may simply send it again.
                let nothing_stored = run.unwritten.is_some();
                if nothing_stored && sink.is_none() {
                    return Err(match e {
                        StoreError::Database(sqlx::Error::PoolTimedOut) => ApiError::overloaded(
                            "The gateway's store is busy; nothing was stored, retry shortly.",
                        ),
                        _ => ApiError {
                            retryable: true,
                            ..ApiError::server(
                                "The gateway's store failed; nothing was stored, please try again.",
                            )
                        },
                    });
                }
                let message = format!(
                    "The gateway's store failed while running response '{}'; it was left unfinished.",
                    run.record.id
                );
                if run.persist && !nothing_stored {
                    // Best effort: a response must not stay in progress for ever when its loop gave up; the steps
                    // not yet written go with its ending.
                    let ending = Ending {
                        error: Some(("server_error".into(), message.clone())),
                        usage: Some(total_usage(&run.steps)),
                        ..Ending::simple(ResponseStatus::Failed)
                    };
                    if let Err(again) = self
                        .write(&mut run, Some((&ending, now())), Durability::Flush)
                        .await
                    {
                        tracing::error!(response.id = %run.record.id, error = %again, "could not record the failure either");
                    }
                }
                if let Some(sink) = sink.as_mut() {
                    // Best effort, bounded for a client that reads nothing: the client learns why its
                    // stream ends here, and the stream still ends with its one terminal event.
                    run.record.status = ResponseStatus::Failed;
                    run.record.error = Some(("server_error".into(), message.clone()));
                    let failed = response_object(&run.record, &render_output(&run.steps, false));
                    let tell = async {
                        sink.error("server_error", &message).await;
                        sink.finished(&failed).await;
                    };
                    let _ = tokio::time::timeout(Duration::from_secs(5), tell).await;
                }
                Err(ApiError::server(message))
            }
        }
    }

    /// The context a chained response starts from: the previous response's context, then its output.
    async fn previous_context(
        &self,
        project_id: &str,
        previous_id: &str,
    ) -> Result<Vec<Item>, ApiError> {
        let not_found = || {
            ApiError::invalid(
                format!("Previous response with id '{previous_id}' not found."),
                Some("previous_response_id"),
                Some("previous_response_not_found"),
            )
        };
        let previous = self
            .store
            .load_response(project_id, previous_id)
            .await?
            .ok_or_else(not_found)?;
        if !previous.record.status.is_terminal() {
            return Err(ApiError::invalid(
                format!(
                    "Previous response with id '{previous_id}' is still {}; wait until it ends.",
                    previous.record.status.as_str()
                ),
                Some("previous_response_id"),
                Some("previous_response_in_progress"),
            ));
        }
        let mut context = self.store.load_context(previous_id).await?;
        let steps = self.store.load_steps(previous_id).await?;
        context.extend(render_output(&steps, previous.handed_back));
        Ok(context)
    }

    async fn drive(
        &self,
        run: &mut Run,
        sink: &mut Option<StreamSink>,
    ) -> Result<Finished, StoreError> {
        if let Some(sink) = sink.as_mut() {
            sink.started(&response_object(&run.record, &[])).await;
        }
        loop {
            let action = decide_next_action(&LoopInput {
                steps: &run.steps,
                registered: &run.registered,
                limits: run.limits,
                deadline_passed: Instant::now() >= run.deadline,
            });
            tracing::debug!(response.id = %run.record.id, action = action.kind(), "next action");
            // The client of a stream went away: stop before starting new work and say why. A response
            // whose work is done ends as it would have; tool steps already recorded are run first, so that
            // none is left pending.
            let starts_work = matches!(
                action,
                NextAction::CallModel
                    | NextAction::ResumeModelCall { .. }
                    | NextAction::DispatchBatch { .. }
            );
            if starts_work && sink.as_ref().is_some_and(StreamSink::is_closed) {
                tracing::info!(response.id = %run.record.id, "stream client disconnected; stopping");
                let ending = Ending {
                    incomplete_reason: Some("client_disconnected".into()),
                    ..Ending::simple(ResponseStatus::Incomplete)
                };
                return self.finish(run, ending, sink).await;
            }
            let ending = match action {
                NextAction::CallModel => {
                    let seq = run.steps.len() as u32;
                    let step = Step {
                        seq,
                        state: StepState::Running,
                        body: StepBody::Model(ModelStep::default()),
                    };
                    run.steps.push(step);
                    self.write_and_call_model(run, seq as usize, sink).await?;
                    continue;
                }
                NextAction::ResumeModelCall { seq } => {
                    self.write_and_call_model(run, seq as usize, sink).await?;
                    continue;
                }
                NextAction::DispatchBatch { batch, calls } => {
                    let first = run.steps.len() as u32;
                    let new_steps: Vec<Step> = calls
                        .into_iter()
                        .enumerate()
                        .map(|(i, call)| Step {
                            seq: first + i as u32,
                            state: StepState::Pending,
                            body: StepBody::Tool(ToolStep {
                                item_id: new_id("mcp"),
                                call,
                                batch,
                                outcome: None,
                            }),
                        })
                        .collect();
                    // Recorded with the next write, right before they run.
                    run.steps.extend(new_steps);
                    continue;
                }
                NextAction::RunTools { seqs } => {
                    self.run_tools(run, &seqs, sink).await?;
                    continue;
                }
                NextAction::Complete => Ending::simple(ResponseStatus::Completed),
                NextAction::HandBack { calls } => {
                    if let Some(sink) = sink.as_mut() {
                        sink.handed_back(&calls).await;
                    }
                    Ending {
                        handed_back: true,
                        ..Ending::simple(ResponseStatus::Completed)
                    }
                }
                NextAction::Incomplete { reason } => Ending {
                    incomplete_reason: Some(reason.as_str().into()),
                    ..Ending::simple(ResponseStatus::Incomplete)
                },
                NextAction::Fail { message } => {
                    if let Some(sink) = sink.as_mut() {
                        sink.error("server_error", &message).await;
                    }
                    Ending {
                        error: Some(("server_error".into(), message)),
                        ..Ending::simple(ResponseStatus::Failed)
                    }
                }
            };
            return self.finish(run, ending, sink).await;
        }
    }

    async fn finish(
        &self,
        run: &mut Run,
        mut ending: Ending,
        sink: &mut Option<StreamSink>,
    ) -> Result<Finished, StoreError> {
        let usage = total_usage(&run.steps);
        ending.usage = Some(usage);
        // A model call recorded with the response but never made (the stream's client left first) did not
        // start: the store says so.
        for index in 0..run.steps.len() {
            let step = &mut run.steps[index];
            let never_called = matches!(&step.body, StepBody::Model(m) if m.output.is_none() && m.failure.is_none());
            if step.state == StepState::Running && never_called {
                step.state = StepState::Pending;
                run.touch(index);
            }
        }
        let completed_at = now();
        let record = &mut run.record;
        record.status = ending.status;
        record.usage = ending.usage;
        record.error = ending.error.clone();
        record.incomplete_reason = ending.incomplete_reason.clone();
        record.completed_at = Some(completed_at);
        // Clients see this ending: it waits for the disk, and so makes every earlier write durable too.
        self.write(run, Some((&ending, completed_at)), Durability::Flush)
            .await?;
        let record = &run.record;
        let finished = Finished {
            record: record.clone(),
            output: render_output(&run.steps, ending.handed_back),
        };
        crate::metrics::response_finished(record.status.as_str(), &run.steps);
        if let Some(sink) = sink.as_mut() {
            sink.finished(&finished.object()).await;
        }
        Ok(finished)
    }

    /// Calls the model for step `index` (already recorded as running) and records what came back.
    async fn call_model(
        &self,
        run: &mut Run,
        index: usize,
        sink: &mut Option<StreamSink>,
    ) -> Result<(), StoreError> {
        let conversation = model_conversation(&run.context, &run.steps[..index]);
        let mut tools: Vec<FunctionTool> = run.record.params.tools.clone();
        tools.extend(run.server_tools.iter().map(|t| FunctionTool {
            name: t.name.clone(),
            description: Some(t.description.clone()),
            parameters: Some(t.parameters.clone()),
            strict: Some(t.strict),
        }));
        let request = ModelRequest {
            params: &run.record.params,
            conversation: &conversation,
            tools: &tools,
        };
        // Text a streaming client already saw when the call failed.
        let mut partial = None;
        let started = Instant::now();
        let result = match sink.as_mut() {
            None => self.upstream.call(&run.deployment, &request, None).await,
            Some(sink) => {
                // Text is passed on as the model produces it; the driver keeps the upstream call and the
                // client's stream moving together, so a slow client slows the upstream read (backpressure).
                let message_id = &new_id("msg");
                let (delta_tx, mut delta_rx) = mpsc::channel::<ModelDelta>(STREAM_BUFFER);
                let (deployment, request) = (&run.deployment, &request);
                let call = async move {
                    let live = Live {
                        message_id,
                        deltas: &delta_tx,
                    };
                    // The sender is dropped with this block, which ends the forwarding below.
                    self.upstream.call(deployment, request, Some(live)).await
                };
                let forward = async {
                    while let Some(delta) = delta_rx.recv().await {
                        match delta {
                            ModelDelta::Text(text) => sink.text_delta(message_id, &text).await,
                        }
                    }
                };
                let (result, ()) = tokio::join!(call, forward);
                if result.is_err() {
                    partial = sink.abandon_message().await;
                }
                result
            }
        };
        crate::metrics::upstream_call(&run.deployment.name, started, result.is_ok());
        let step = &mut run.steps[index];
        match result {
            Ok(mut output) => {
                // Upstreams that number calls per answer reuse ids; pairing by call_id needs them unique.
                make_call_ids_unique(&mut output.tool_calls, &conversation, || new_id("call"));
                if let Some(sink) = sink.as_mut() {
                    sink.model_ended(&output).await;
                }
                step.state = StepState::Succeeded;
                step.body = StepBody::Model(ModelStep {
                    output: Some(output),
                    failure: None,
                });
            }
            Err(e) => {
                tracing::warn!(response.id = %run.record.id, deployment = %run.deployment.name, error = %e, "model call failed");
                step.state = StepState::Failed;
                step.body = StepBody::Model(ModelStep {
                    output: None,
                    failure: Some(UpstreamFailure {
                        message: e.public_message(),
                        partial,
                    }),
                });
            }
        }
        // Recorded with the next write, which comes before any other side effect.
        run.touch(index);
        Ok(())
    }

    /// Runs the tool steps `seqs` concurrently (bounded), recording each result as it arrives.
    async fn run_tools(
        &self,
        run: &mut Run,
        seqs: &[u32],
        sink: &mut Option<StreamSink>,
    ) -> Result<(), StoreError> {
        for &seq in seqs {
            let index = seq as usize;
            run.steps[index].state = StepState::Running;
            run.touch(index);
        }
        // The calls are recorded as started, and the model answer that asked for them as ended, on disk before
        // any request goes out: a restarted loop must never send a different call under the same step's
        // Idempotency-Key.
        if let Err(e) = self.write(run, None, Durability::Flush).await {
            // Nothing went out: the failure's ending must not record these calls as started.
            for &seq in seqs {
                run.steps[seq as usize].state = StepState::Pending;
            }
            return Err(e);
        }
        if let Some(sink) = sink.as_mut() {
            let started: Vec<&Step> = seqs
                .iter()
                .filter_map(|s| run.steps.get(*s as usize))
                .collect();
            sink.tools_started(&started).await;
        }
        let mut jobs: Vec<(usize, ToolCall, Option<ToolSource>, String)> = Vec::new();
        for &seq in seqs {
            let index = seq as usize;
            let step = &run.steps[index];
            let Some(tool) = step.tool() else { continue };
            let source = run
                .server_tools
                .iter()
                .find(|s| s.name == tool.call.name)
                .cloned();
            jobs.push((
                index,
                tool.call.clone(),
                source,
                format!("{}:{}", run.record.id, seq),
            ));
        }
        let response_id = run.record.id.clone();
        let calls = jobs.len();
        let mut ended = 0;
        let mut results = futures::stream::iter(jobs)
            .map(|(index, call, source, key)| {
                let response_id = &response_id;
                async move {
                    let outcome = match &source {
                        Some(source) => {
                            let at = CallRef {
                                response_id,
                                idempotency_key: &key,
                            };
                            self.tools.execute(source, &call, at).await
                        }
                        None => gateway_core::ToolOutcome::error(format!(
                            "Tool '{}' is no longer available.",
                            call.name
                        )),
                    };
                    (index, outcome)
                }
            })
            .buffer_unordered(self.limits.tool_concurrency.max(1));
        // While siblings still run, an ended call is recorded soon, so that a restarted loop does not send it
        // again: `WRITE_LINGER` after it ended, together with any that ended meanwhile. Calls of a batch that
        // all end within the linger, and the batch's last results, go with the next write.
        let mut linger_until: Option<tokio::time::Instant> = None;
        loop {
            let next = match linger_until {
                None => results.next().await,
                Some(deadline) => match tokio::time::timeout_at(deadline, results.next()).await {
                    Ok(next) => next,
                    Err(_) => {
                        linger_until = None;
                        self.write_relaxed(run).await;
                        continue;
                    }
                },
            };
            let Some((index, outcome)) = next else {
                break;
            };
            ended += 1;
            let step = &mut run.steps[index];
            step.state = if outcome.is_error() {
                StepState::Failed
            } else {
                StepState::Succeeded
            };
            if let StepBody::Tool(tool) = &mut step.body {
                tracing::debug!(response.id = %response_id, tool.name = %tool.call.name, failed = outcome.is_error(), "tool call ended");
                tool.outcome = Some(outcome);
            }
            if let Some(sink) = sink.as_mut() {
                sink.tool_ended(step).await;
            }
            run.touch(index);
            if ended < calls && linger_until.is_none() {
                linger_until = Some(tokio::time::Instant::now() + WRITE_LINGER);
            }
        }
        Ok(())
    }
}

impl Engine {
    /// The durability of a write whose loss in a crash of the database server is harmless: a model call is
    /// made again, a tool call is sent again under its Idempotency-Key.
    fn relaxed(&self) -> Durability {
        if self.flush_every_step {
            Durability::Flush
        } else {
            Durability::Relaxed
        }
    }

    /// The step boundary before a model call, then the call. A model call changes nothing outside the
    /// gateway, so the (relaxed) write runs alongside it instead of before it, and only once the call has taken
    /// `WRITE_LINGER`: a model that answers sooner has its boundary written together with the next one. A
    /// response whose row is not written yet stays so until its first tool request or its ending.
    async fn write_and_call_model(
        &self,
        run: &mut Run,
        index: usize,
        sink: &mut Option<StreamSink>,
    ) -> Result<(), StoreError> {
        let changes = if run.unwritten.is_none() {
            run.take_changes()
        } else {
            Changes::default()
        };
        if changes.is_empty() {
            return self.call_model(run, index, sink).await;
        }
        let sent = AtomicBool::new(false);
        let (called, written) = {
            let write = async {
                tokio::time::sleep(WRITE_LINGER).await;
                sent.store(true, Ordering::Relaxed);
                changes.save(&self.store, None, self.relaxed()).await
            };
            let call = self.call_model(run, index, sink);
            tokio::pin!(write, call);
            tokio::select! {
                called = &mut call => {
                    // A write already sent is awaited (never abandoned halfway); one still lingering is dropped.
                    let written = if sent.load(Ordering::Relaxed) { Some(write.await) } else { None };
                    (called, written)
                }
                written = &mut write => (call.await, Some(written)),
            }
        };
        match written {
            Some(Ok(())) => {}
            None => run.give_back(changes),
            Some(Err(e)) => {
                tracing::warn!(response.id = %run.record.id, error = %e, "a step write failed; retrying it with the next one");
                run.give_back(changes);
            }
        }
        called
    }

    /// One step boundary: writes the steps added and changed since the last one, and the response's
    /// ending if it has one, in one statement. Nothing is written for a response that is not stored.
    async fn write(
        &self,
        run: &mut Run,
        ending: Option<(&Ending, i64)>,
        durability: Durability,
    ) -> Result<(), StoreError> {
        if let Some(project_id) = &run.unwritten {
            // The first write of a response whose row was put off: the row (with its ending, if this is it),
            // its context and every step so far, at once.
            self.store
                .create_response(
                    &NewResponse {
                        record: &run.record,
                        project_id,
                        deployment_id: &run.deployment.id,
                        server_tools: &run.server_tools,
                        context: &run.context,
                        steps: &run.steps,
                        handed_back: ending.is_some_and(|(e, _)| e.handed_back),
                        idempotency_key: None,
                    },
                    durability,
                )
                .await?;
            run.unwritten = None;
            run.stored = run.steps.len();
            run.changed.clear();
            return Ok(());
        }
        let changes = run.take_changes();
        if !changes.is_empty() || (run.persist && ending.is_some()) {
            if let Err(e) = changes.save(&self.store, ending, durability).await {
                run.give_back(changes);
                return Err(e);
            }
        }
        Ok(())
    }

    /// A write whose loss is harmless (see `relaxed`): when it fails, what it held goes with the next write, and
    /// the loop goes on.
    async fn write_relaxed(&self, run: &mut Run) {
        if let Err(e) = self.write(run, None, self.relaxed()).await {
            tracing::warn!(response.id = %run.record.id, error = %e, "a step write failed; retrying it with the next one");
        }
    }
}

/// What changed in a stored run since its last write, taken out of it so that it can be written while the run
/// goes on. Empty for a response that is not stored.
#[derive(Default)]
struct Changes {
    response_id: String,
    added: Vec<Step>,
    changed: Vec<Step>,
}

impl Changes {
    fn is_empty(&self) -> bool {
        self.added.is_empty() && self.changed.is_empty()
    }

    async fn save(
        &self,
        store: &Store,
        ending: Option<(&Ending, i64)>,
        durability: Durability,
    ) -> Result<(), StoreError> {
        let changed: Vec<&Step> = self.changed.iter().collect();
        store
            .write_steps(&StepWrite {
                response_id: &self.response_id,
                added: &self.added,
                changed: &changed,
                ending: ending.map(|(e, _)| e),
                at: ending.map_or_else(now, |(_, at)| at),
                durability,
            })
            .await
    }
}

impl Run {
    /// Changes whose write failed: they are written again with the next write.
    fn give_back(&mut self, changes: Changes) {
        let first_added = changes
            .added
            .first()
            .map_or(self.stored, |step| step.seq as usize);
        self.stored = self.stored.min(first_added);
        for step in &changes.changed {
            self.changed.insert(step.seq as usize);
        }
        self.changed.retain(|&index| index < self.stored);
    }

    /// The steps added and changed since the last write, now counted as written.
    fn take_changes(&mut self) -> Changes {
        let changes = if self.persist {
            Changes {
                response_id: self.record.id.clone(),
                added: self.steps[self.stored..].to_vec(),
                changed: self
                    .changed
                    .iter()
                    .map(|&i| self.steps[i].clone())
                    .collect(),
            }
        } else {
            Changes::default()
        };
        self.stored = self.steps.len();
        self.changed.clear();
        changes
    }
}

impl Ending {
    fn simple(status: ResponseStatus) -> Ending {
        Ending {
            status,
            usage: None,
            handed_back: false,
            error: None,
            incomplete_reason: None,
        }
    }
}

fn pairing_error(error: PairingError, first_new: usize) -> ApiError {
    let param = match &error {
        PairingError::OrphanOutput { index, .. } if *index >= first_new => {
            format!("input[{}]", index - first_new)
        }
        _ => "input".to_owned(),
    };
    let code = match &error {
        PairingError::OrphanOutput { .. } => "function_call_output_without_call",
        PairingError::UnansweredCall { .. } => "function_call_output_missing",
    };
    ApiError::invalid(error.to_string(), Some(&param), Some(code))
}
