//! The driver loop: ask `decide_next_action`, carry the action out (a model call, a batch of tool calls, or the
//! end), write at each step boundary, report progress, repeat.

use std::time::{Duration, Instant};

use futures::StreamExt;
use gateway_core::chat::scrub_nul;
use gateway_core::context::{make_call_ids_unique, model_conversation};
use gateway_core::decide::LoopInput;
use gateway_core::events::Progress;
use gateway_core::output::{render_output, tool_item_prefix};
use gateway_core::response::{Ending, FailureCode, ResponseState};
use gateway_core::steps::{
    total_usage, Approval, AssistantMessage, ModelDelta, ModelOutput, ModelStep, Step, StepBody,
    StepState, ToolCall, ToolOutcome, ToolStep, UpstreamFailure,
};
use gateway_core::toolset::{flatten_namespaces, name_calls, offered_client_tools, OfferedTool};
use gateway_core::{decide_next_action, IncompleteReason, NextAction};
use tokio::sync::mpsc;

use super::journal::WRITE_LINGER;
use super::{Engine, EngineError, Finished, Origin, ProgressSink, Run, Stop};
use crate::clock::{now, now_ms};
use crate::ids::{item_id, new_id};
use crate::store::responses::Durability;
use crate::store::tenancy::{Deployment, ToolSource};
use crate::store::StoreError;
use crate::tools::CallRef;
use crate::upstream::{Live, ModelRequest, UpstreamError};

/// Model text waiting for a slow reader: the upstream read waits when this many pieces are queued.
const TEXT_BUFFER: usize = 64;

/// How long a failing run may wait on its sink to tell a slow reader why the response ends.
const TELL_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a run stopped without an ending of its own.
enum Interrupted {
    /// This replica gave the response up: it shuts down, another replica took the response over, or the response
    /// was deleted. Nothing more is written.
    GivenUp,
    /// The store failed.
    Store(StoreError),
}

impl From<StoreError> for Interrupted {
    fn from(error: StoreError) -> Interrupted {
        match error {
            StoreError::NotOwner => Interrupted::GivenUp,
            other => Interrupted::Store(other),
        }
    }
}

impl Engine {
    /// Runs a prepared (or resumed) response to its end, reporting its progress to `sink`.
    pub async fn run<S: ProgressSink>(
        &self,
        mut run: Run,
        mut sink: S,
    ) -> Result<Finished, EngineError> {
        sink.follow_with(std::sync::Arc::clone(&run.registration.hub));
        let source = match self.drive(&mut run, &mut sink).await {
            Ok(finished) => return Ok(finished),
            Err(Interrupted::GivenUp) => return Err(self.given_up(&run).await),
            Err(Interrupted::Store(source))
                if source.is_transient() && !run.journal.nothing_stored() =>
            {
                // The store did not answer for a lease: give the response up, and release it once the store
                // answers again, so that a replica (maybe this one) resumes it from its stored steps.
                tracing::warn!(response.id = %run.record.id, error = %source, "the store stopped answering; handing the response over");
                self.replica
                    .release_later(&run.record.id, run.registration.epoch);
                return Err(self.given_up(&run).await);
            }
            Err(Interrupted::Store(source)) => source,
        };
        tracing::error!(response.id = %run.record.id, error = %source, "store failed while running a response");
        let message = format!(
            "The gateway's store failed while running response '{}'; it was left unfinished.",
            run.record.id
        );
        // A response whose row was never written left nothing behind and ran no tool (its first tool request
        // waits for that write): the client may simply send it again.
        let nothing_stored = run.journal.nothing_stored();
        run.record.end(
            Ending::server_error(message.clone()),
            total_usage(&run.steps),
            now(),
        );
        if run.journal.is_written() {
            // A response must not stay in progress for ever when its loop gave up: the steps not yet written go
            // with its ending; failing that, the ending alone; failing that too, the response is handed back, so
            // that a replica resumes it and ends it.
            if let Err(again) = self.write(&mut run, Durability::Flush).await {
                tracing::error!(response.id = %run.record.id, error = %again, "could not record the failure with its steps");
                let ended = self
                    .store
                    .end_unreadable(
                        &run.record.id,
                        &self.replica.id,
                        run.registration.epoch,
                        &FailureCode::ServerError,
                        &message,
                        now(),
                    )
                    .await;
                if let Err(again) = ended {
                    tracing::error!(response.id = %run.record.id, error = %again, "could not record the failure either; handing the response over");
                    self.replica
                        .release_later(&run.record.id, run.registration.epoch);
                }
            }
        }
        // Best effort, bounded for a reader that takes nothing: it learns why its stream ends here, and the
        // stream still ends with its one terminal event.
        let output = render_output(&run.steps, false);
        let tell = sink.report(Progress::Ended {
            record: &run.record,
            output: &output,
        });
        let _ = tokio::time::timeout(TELL_TIMEOUT, tell).await;
        Err(if nothing_stored {
            EngineError::NothingStored(source)
        } else {
            EngineError::Unfinished {
                response_id: run.record.id.clone(),
                source,
            }
        })
    }

    /// What the client of a run that gave its response up is told: it was deleted, or another replica finishes it.
    async fn given_up(&self, run: &Run) -> EngineError {
        let response_id = run.record.id.clone();
        tracing::info!(response.id = %response_id, "response handed over before it ended");
        if run.journal.is_written() {
            if let Ok(None) = self
                .store
                .load_response(&run.project_id, &response_id)
                .await
            {
                return EngineError::Deleted { response_id };
            }
        }
        EngineError::HandedOver {
            retry_safe: run.journal.nothing_stored() || run.keyed,
            response_id,
        }
    }

    async fn drive<S: ProgressSink>(
        &self,
        run: &mut Run,
        sink: &mut S,
    ) -> Result<Finished, Interrupted> {
        match run.origin {
            Origin::New => {
                sink.report(Progress::Created {
                    record: &run.record,
                })
                .await;
                sink.report(Progress::Running {
                    record: &run.record,
                })
                .await;
                report_listings(run, sink).await;
            }
            Origin::Queued => {
                // Its deadline runs from now (the database's clock, as every replica reads it).
                run.deadline =
                    Instant::now() + Duration::from_millis(self.limits.response_deadline_ms);
                if self
                    .store
                    .start_queued(
                        &run.record.id,
                        &self.replica.id,
                        run.registration.epoch,
                        self.deadline_ms(),
                    )
                    .await?
                {
                    run.heard(Stop::Cancel);
                }
                if run.stop().is_none() {
                    run.record.state = ResponseState::InProgress;
                    sink.report(Progress::Running {
                        record: &run.record,
                    })
                    .await;
                    report_listings(run, sink).await;
                }
            }
            Origin::Resumed => {}
        }
        loop {
            self.check_lease(run).await;
            match run.stop() {
                Some(Stop::Cancel) => {
                    tracing::info!(response.id = %run.record.id, "response cancelled");
                    return self.finish(run, Ending::Cancelled, sink).await;
                }
                Some(Stop::Abandon) => return Err(Interrupted::GivenUp),
                None => {}
            }
            let action = decide_next_action(&LoopInput {
                steps: &run.steps,
                registered: &run.registered,
                limits: run.limits,
                deadline_passed: Instant::now() >= run.deadline,
            });
            tracing::debug!(response.id = %run.record.id, action = action.kind(), "next action");
            // The client of a stream went away: stop before starting new work and say why. A response whose work
            // is done ends as it would have; tool steps already recorded are run first, so that none is left
            // pending.
            let starts_work = matches!(
                action,
                NextAction::CallModel
                    | NextAction::ResumeModelCall { .. }
                    | NextAction::DispatchBatch { .. }
            );
            if starts_work && sink.is_closed() {
                tracing::info!(response.id = %run.record.id, "stream client disconnected; stopping");
                let ending = Ending::Incomplete {
                    reason: IncompleteReason::ClientDisconnected,
                };
                return self.finish(run, ending, sink).await;
            }
            let ending = match action {
                NextAction::CallModel => {
                    let seq = run.steps.len() as u32;
                    run.steps.push(Step {
                        seq,
                        state: StepState::Running,
                        body: StepBody::Model(ModelStep::default()),
                    });
                    self.write_and_call_model(run, seq as usize, sink).await;
                    continue;
                }
                NextAction::ResumeModelCall { seq } => {
                    self.write_and_call_model(run, seq as usize, sink).await;
                    continue;
                }
                NextAction::DispatchBatch { batch, calls } => {
                    let first = run.steps.len() as u32;
                    let server_tools = &run.server_tools;
                    let record_id = &run.record.id;
                    // Recorded with the next write, right before they run.
                    run.steps
                        .extend(calls.into_iter().enumerate().map(|(i, call)| Step {
                            seq: first + i as u32,
                            state: StepState::Pending,
                            body: {
                                let source = server_tools.iter().find(|s| s.name == call.name);
                                let hosted_type = source.and_then(|s| s.hosted_type.clone());
                                StepBody::Tool(ToolStep {
                                    item_id: item_id(
                                        tool_item_prefix(hosted_type.as_deref()),
                                        record_id,
                                    ),
                                    server_label: source.and_then(|s| s.server_label.clone()),
                                    hosted_type,
                                    call,
                                    batch,
                                    outcome: None,
                                    ended_rank: None,
                                    notes: Default::default(),
                                    started_at_ms: None,
                                    ended_at_ms: None,
                                })
                            },
                        }));
                    continue;
                }
                NextAction::RunTools { seqs } => {
                    self.run_tools(run, &seqs, sink).await?;
                    continue;
                }
                NextAction::Complete => Ending::Completed { handed_back: false },
                NextAction::HandBack { calls } => {
                    sink.report(Progress::HandedBack { calls: &calls }).await;
                    Ending::Completed { handed_back: true }
                }
                NextAction::Incomplete { reason } => Ending::Incomplete { reason },
                NextAction::Fail { code, message } => Ending::Failed { code, message },
            };
            return self.finish(run, ending, sink).await;
        }
    }

    /// Makes sure this replica still holds its lease before the run acts (a model call, a tool request): a
    /// process that was paused or cut off for longer than a lease waits for its next beat, which tells the runs
    /// whose response another replica took to give it up (SPEC 9). A lease that does not come back within a lease
    /// means the store is out of reach: the run gives its response up, to be released once the store answers.
    async fn check_lease(&self, run: &mut Run) {
        if self.replica.hold_lease().await {
            return;
        }
        tracing::warn!(response.id = %run.record.id, "this replica's lease lapsed; giving the response up");
        if !run.journal.nothing_stored() {
            self.replica
                .release_later(&run.record.id, run.registration.epoch);
        }
        run.heard(Stop::Abandon);
    }

    /// Records how the response ended (waiting for the disk: clients see it), and reports it.
    async fn finish<S: ProgressSink>(
        &self,
        run: &mut Run,
        ending: Ending,
        sink: &mut S,
    ) -> Result<Finished, Interrupted> {
        // A model call recorded with the response but never made (the stream's client left first) did not
        // start: the store says so.
        for index in 0..run.steps.len() {
            let step = &mut run.steps[index];
            let never_called = matches!(&step.body, StepBody::Model(m) if m.output.is_none() && m.failure.is_none());
            if step.state == StepState::Running && never_called {
                step.state = StepState::Pending;
                run.journal.touch(index);
            }
        }
        let handed_back = ending.handed_back();
        run.record.end(ending, total_usage(&run.steps), now());
        // Clients see this ending: it waits for the disk, and so makes every earlier write durable too.
        self.write(run, Durability::Flush).await?;
        let finished = Finished {
            record: run.record.clone(),
            output: render_output(&run.steps, handed_back),
        };
        crate::metrics::response_finished(finished.record.status().as_str(), &run.steps);
        sink.report(Progress::Ended {
            record: &finished.record,
            output: &finished.output,
        })
        .await;
        Ok(finished)
    }

    /// Calls the model for step `index` (already recorded as running) and records what came back.
    pub(super) async fn call_model<S: ProgressSink>(
        &self,
        run: &mut Run,
        index: usize,
        sink: &mut S,
    ) {
        let mut conversation = model_conversation(&run.context, &run.steps[..index]);
        flatten_namespaces(&mut conversation);
        let mut tools = offered_client_tools(&run.record.params.tools);
        tools.extend(run.server_tools.iter().map(|t| OfferedTool {
            name: t.name.clone(),
            description: Some(t.description.clone()),
            input: gateway_core::toolset::ToolInput::Json {
                parameters: t.parameters.clone(),
                strict: Some(t.strict),
            },
        }));
        let request = ModelRequest {
            response_id: &run.record.id,
            params: &run.record.params,
            conversation: &conversation,
            tools: &tools,
        };
        let started = Instant::now();
        // The text a reader was shown while the call ran, as it was cut.
        let mut shown = Shown::default();
        let message_id = item_id("msg", &run.record.id);
        let call = async {
            let primary = &run.deployment;
            let mut result = self
                .call_deployment(primary, &request, &message_id, &mut *sink, &mut shown)
                .await;
            let mut answered_by = None;
            // SPEC 8: the fallbacks, in order, one level deep, only while nothing of the call reached the client;
            // never for a request the provider refused.
            for name in &primary.fallbacks {
                let may_fall_back = matches!(&result, Err(e) if e.failure_code() != FailureCode::UpstreamRejected)
                    && shown.text.is_empty();
                if !may_fall_back {
                    break;
                }
                let fallback = match self.store.deployment_by_name(name).await {
                    Ok(Some(fallback)) => fallback,
                    Ok(None) => continue,
                    Err(e) => {
                        tracing::warn!(deployment = %name, error = %e, "could not load a fallback deployment");
                        continue;
                    }
                };
                if let Err(e) = &result {
                    tracing::warn!(response.id = %run.record.id, deployment = %primary.name, fallback = %fallback.name, error = %e, "model call failed; trying a fallback");
                }
                result = self
                    .call_deployment(&fallback, &request, &message_id, &mut *sink, &mut shown)
                    .await;
                if result.is_ok() {
                    answered_by = Some(fallback.name.clone());
                }
            }
            (result, answered_by)
        };
        let told_to_stop = told_to_stop(run);
        let result = tokio::select! {
            result = call => Some(result),
            () = told_to_stop => None,
        };
        shown.item_id = message_id;
        let Some((result, answered_by)) = result else {
            // Told to stop mid-call: the call is dropped, and its connection with it. A cancel records it as
            // failed; a replica giving the response up leaves it running, to be made again by whoever resumes it.
            if run.stop() == Some(Stop::Cancel) {
                let partial = shown.into_message();
                sink.report(Progress::ModelFailed {
                    partial: partial.as_ref(),
                })
                .await;
                run.steps[index].state = StepState::Failed;
                run.steps[index].body = StepBody::Model(ModelStep {
                    deployment: None,
                    output: None,
                    failure: Some(UpstreamFailure {
                        message: CANCELLED.into(),
                        code: Default::default(),
                        partial,
                    }),
                });
                run.journal.touch(index);
            }
            return;
        };
        crate::metrics::upstream_call(&run.deployment.name, started, result.is_ok());
        let step = &mut run.steps[index];
        match result {
            Ok(mut output) => {
                // Upstreams that number calls per answer reuse ids; pairing by call_id needs them unique.
                make_call_ids_unique(&mut output.tool_calls, &conversation, || new_id("call"));
                // The model called tools by the flat names it was offered; the client sees its own.
                name_calls(&run.record.params.tools, &mut output.tool_calls);
                mark_approvals(&run.server_tools, &run.record.id, &mut output.tool_calls);
                if let Some(message) = &mut output.message {
                    message.deltas = shown.deltas;
                }
                sink.report(Progress::ModelEnded { output: &output }).await;
                step.state = StepState::Succeeded;
                step.body = StepBody::Model(ModelStep {
                    output: Some(output),
                    failure: None,
                    deployment: answered_by,
                });
            }
            Err(e) => {
                tracing::warn!(response.id = %run.record.id, deployment = %run.deployment.name, error = %e, "model call failed");
                let partial = shown.into_message();
                sink.report(Progress::ModelFailed {
                    partial: partial.as_ref(),
                })
                .await;
                step.state = StepState::Failed;
                step.body = StepBody::Model(ModelStep {
                    deployment: None,
                    output: None,
                    failure: Some(UpstreamFailure {
                        message: e.public_message(),
                        code: e.failure_code(),
                        partial,
                    }),
                });
            }
        }
        // Recorded with the next write, which comes before any other side effect.
        run.journal.touch(index);
    }

    /// One model call to `deployment`: streamed to `sink` (text recorded in `shown` as it is reported) when it takes
    /// text deltas, whole otherwise.
    async fn call_deployment<S: ProgressSink>(
        &self,
        deployment: &Deployment,
        request: &ModelRequest<'_>,
        message_id: &str,
        sink: &mut S,
        shown: &mut Shown,
    ) -> Result<ModelOutput, UpstreamError> {
        if !sink.wants_text_deltas() {
            return self.upstream.call(deployment, request, None).await;
        }
        // Text is passed on as the model produces it; the upstream read and the reader move together, so a
        // slow reader slows the upstream read (backpressure).
        let (delta_tx, mut delta_rx) = mpsc::channel::<ModelDelta>(TEXT_BUFFER);
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
                    ModelDelta::Text(text) => {
                        let text = scrub_nul(text);
                        sink.report(Progress::TextDelta {
                            item_id: message_id,
                            delta: &text,
                        })
                        .await;
                        shown.push(&text);
                    }
                }
            }
        };
        let (result, ()) = tokio::join!(call, forward);
        result
    }

    /// Runs the tool steps `seqs` concurrently (bounded), recording each result as it arrives.
    async fn run_tools<S: ProgressSink>(
        &self,
        run: &mut Run,
        seqs: &[u32],
        sink: &mut S,
    ) -> Result<(), StoreError> {
        let started_at_ms = now_ms();
        for &seq in seqs {
            let step = &mut run.steps[seq as usize];
            step.state = StepState::Running;
            // Rendered before the calls are recorded as started, so that the stored step replays the note.
            if let StepBody::Tool(tool) = &mut step.body {
                tool.started_at_ms = Some(started_at_ms);
                let template = run
                    .server_tools
                    .iter()
                    .find(|s| s.name == tool.call.name)
                    .and_then(|s| s.note_on_request.as_ref());
                if let Some(template) = template {
                    let arguments = serde_json::from_str(&tool.call.arguments)
                        .unwrap_or(serde_json::Value::Null);
                    tool.notes.on_request = Some(template.render(&arguments));
                }
            }
            run.journal.touch(seq as usize);
        }
        // The calls are recorded as started, and the model answer that asked for them as ended, on disk before
        // any request goes out: a restarted loop must never send a different call under the same step's
        // Idempotency-Key.
        if let Err(e) = self.write(run, Durability::Flush).await {
            // Nothing went out: the failure's ending must not record these calls as started.
            for &seq in seqs {
                run.steps[seq as usize].state = StepState::Pending;
            }
            return Err(e);
        }
        // A process paused since that write may have lost the response meanwhile: no request goes out then.
        self.check_lease(run).await;
        if run.stop() == Some(Stop::Abandon) {
            return Err(StoreError::NotOwner);
        }
        let started: Vec<&Step> = seqs
            .iter()
            .filter_map(|s| run.steps.get(*s as usize))
            .collect();
        sink.report(Progress::ToolsStarted { steps: &started })
            .await;
        let mut next_rank = next_ended_rank(&run.steps, seqs);
        let mut jobs = Vec::with_capacity(seqs.len());
        for &seq in seqs {
            let Some(tool) = run.steps[seq as usize].tool() else {
                continue;
            };
            let source = run
                .server_tools
                .iter()
                .find(|s| s.name == tool.call.name)
                .cloned();
            jobs.push((
                seq as usize,
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
                        None => ToolOutcome::error(format!(
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
        let mut told_to_stop = std::pin::pin!(told_to_stop(run));
        loop {
            let lingering = async {
                match linger_until {
                    Some(deadline) => tokio::time::sleep_until(deadline).await,
                    None => std::future::pending().await,
                }
            };
            let next = tokio::select! {
                () = &mut told_to_stop => {
                    // The calls still running are dropped, and their connections with them. A cancel records them
                    // as failed; a replica giving the response up leaves them running, to be sent again (under the
                    // same Idempotency-Key) by whoever resumes it.
                    if run.stop() == Some(Stop::Cancel) {
                        for &seq in seqs {
                            let index = seq as usize;
                            let step = &mut run.steps[index];
                            if step.state.is_ended() {
                                continue;
                            }
                            step.state = StepState::Failed;
                            if let StepBody::Tool(tool) = &mut step.body {
                                tool.outcome = Some(ToolOutcome::error(CANCELLED));
                                tool.ended_rank = Some(next_rank);
                                next_rank += 1;
                            }
                            sink.report(Progress::ToolEnded { step }).await;
                            run.journal.touch(index);
                        }
                    }
                    break;
                }
                () = lingering => {
                    linger_until = None;
                    self.write_relaxed(run).await;
                    continue;
                }
                next = results.next() => next,
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
                let template = run
                    .server_tools
                    .iter()
                    .find(|s| s.name == tool.call.name)
                    .and_then(|s| s.note_on_result.as_ref());
                if let Some(template) = template {
                    tool.notes.on_result =
                        Some(template.render(&outcome.note_values(&tool.call.arguments)));
                }
                tool.outcome = Some(outcome);
                tool.ended_rank = Some(next_rank);
                tool.ended_at_ms = Some(now_ms());
                next_rank += 1;
            }
            sink.report(Progress::ToolEnded { step }).await;
            run.journal.touch(index);
            if ended < calls && linger_until.is_none() {
                linger_until = Some(tokio::time::Instant::now() + WRITE_LINGER);
            }
        }
        Ok(())
    }
}

/// What a cancelled model or tool call records as its failure.
const CANCELLED: &str = "The response was cancelled before this call ended.";

/// Resolves once `run` is told to stop (at once if it was already).
fn told_to_stop(run: &Run) -> impl std::future::Future<Output = ()> + Send + 'static {
    let mut stop = run.registration.stop.clone();
    async move {
        if stop.wait_for(Option::is_some).await.is_err() {
            // The registration outlives the run; should it go, nothing will tell the run to stop.
            std::future::pending::<()>().await;
        }
    }
}

/// The rank the next call of `seqs`' batch to end gets: after every call of that batch that ended before (a
/// run resumed after a crash continues the order its stream showed).
fn next_ended_rank(steps: &[Step], seqs: &[u32]) -> u32 {
    let batch = seqs
        .first()
        .and_then(|s| steps.get(*s as usize))
        .and_then(Step::tool)
        .map(|t| t.batch);
    steps
        .iter()
        .filter_map(Step::tool)
        .filter(|t| Some(t.batch) == batch)
        .filter_map(|t| t.ended_rank)
        .map(|rank| rank + 1)
        .max()
        .unwrap_or(0)
}

/// The text of a model call shown to a reader as it streamed, and how it was cut.
#[derive(Default)]
struct Shown {
    item_id: String,
    text: String,
    deltas: Vec<u32>,
}

impl Shown {
    fn push(&mut self, delta: &str) {
        self.text.push_str(delta);
        self.deltas.push(delta.chars().count() as u32);
    }

    /// The text shown, as the message that ends `incomplete` when the call failed; `None` when nothing was.
    fn into_message(self) -> Option<AssistantMessage> {
        (!self.text.is_empty()).then_some(AssistantMessage {
            item_id: self.item_id,
            text: self.text,
            deltas: self.deltas,
        })
    }
}

/// Reports the listings of the request's own MCP servers, made when the response was created.
async fn report_listings<S: ProgressSink>(run: &Run, sink: &mut S) {
    for step in run.steps.iter().filter(|s| s.listing().is_some()) {
        sink.report(Progress::Listed { step }).await;
    }
}

/// Marks the calls of remote MCP tools that wait for the client's approval (SPEC 12): they are handed back as
/// `mcp_approval_request` items, with ids of their own.
fn mark_approvals(server_tools: &[ToolSource], response_id: &str, calls: &mut [ToolCall]) {
    for call in calls {
        if call.namespace.is_some() || !call.kind.is_function() {
            continue;
        }
        let source = server_tools.iter().find(|s| s.name == call.name);
        let Some(source) = source.filter(|s| s.approval_required) else {
            continue;
        };
        call.approval = Some(Approval::Required {
            server_label: source.server_label.clone().unwrap_or_default(),
        });
        call.item_id = item_id("mcpr", response_id);
    }
}
