//! One batch of server tool calls of a run: recorded as started on disk before any request goes out, run
//! concurrently (bounded), each result recorded (and its note rendered) as it arrives.

use futures::StreamExt;
use gateway_core::events::Progress;
use gateway_core::steps::{Step, StepBody, StepState, ToolCall, ToolOutcome, ToolStep};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;

use super::driver::{told_to_stop, CANCELLED};
use super::journal::WRITE_LINGER;
use super::{Engine, ProgressSink, Run, Stop};
use crate::clock::now_ms;
use crate::store::responses::Durability;
use crate::store::StoreError;
use crate::tools::{CallRef, ServerTool, ServerTools};

/// One call to make: its step, the call, its tool (if still available) and its step's Idempotency-Key.
type Job = (usize, ToolCall, Option<ServerTool>, String);

impl Engine {
    /// Runs the tool steps `seqs` concurrently (bounded), recording each result as it arrives.
    pub(super) async fn run_tools<S: ProgressSink>(
        &self,
        run: &mut Run,
        seqs: &[u32],
        sink: &mut S,
    ) -> Result<(), StoreError> {
        self.start_tools(run, seqs, sink).await?;
        let mut next_rank = next_ended_rank(&run.steps, seqs);
        if run.stop().is_some() {
            // The write that recorded the calls as started learnt of a cancel whose notification never came:
            // none goes out.
            stop_batch(run, seqs, &mut next_rank, sink).await;
            return Ok(());
        }
        let jobs = jobs(run, seqs);
        let calls = jobs.len();
        let (mut calling, mut results) =
            self.spawn_calls(jobs, run.record.id.clone(), run.registration.stop.clone());
        let mut ended = 0;
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
                    calling.halt();
                    stop_batch(run, seqs, &mut next_rank, sink).await;
                    break;
                }
                () = lingering => {
                    linger_until = None;
                    self.write_relaxed(run).await;
                    // The write may have learnt that the response is no longer this run's, or was cancelled.
                    if run.stop().is_some() {
                        calling.halt();
                        stop_batch(run, seqs, &mut next_rank, sink).await;
                        break;
                    }
                    continue;
                }
                next = results.recv() => next,
            };
            let Some((index, outcome)) = next else {
                if ended < calls {
                    // The calls' task ended before every call did: it panicked. The run goes down with it, as
                    // when the calls ran on its own task, and is handed over and resumed (or ended, once it was
                    // started too often).
                    calling.rethrow_panic().await;
                }
                break;
            };
            let Some(outcome) = outcome else {
                // A call kept from going out: the run was told to stop, or the lease did not come back.
                calling.halt();
                if run.stop().is_none() {
                    self.give_up_lapsed(run);
                }
                stop_batch(run, seqs, &mut next_rank, sink).await;
                break;
            };
            ended += 1;
            record_end(run, index, outcome, &mut next_rank, sink).await;
            self.account_tool_call(run, index);
            if ended < calls && linger_until.is_none() {
                linger_until = Some(tokio::time::Instant::now() + WRITE_LINGER);
            }
        }
        Ok(())
    }

    /// Runs the calls of a batch on a task of their own, at most `limits.tool_concurrency` at a time, and hands each
    /// result to the receiver as it arrives (its step's index, and `None` for a call kept from going out). The run
    /// may meanwhile wait on a write or on a slow reader of its stream without leaving a call unpolled: a call's
    /// timeout runs whether or not it is polled, and an answer read late would be taken for a timeout. The task
    /// (and every call still running) ends when the set is dropped.
    fn spawn_calls(
        &self,
        jobs: Vec<Job>,
        response_id: String,
        stop: watch::Receiver<Option<Stop>>,
    ) -> (
        Calling,
        mpsc::UnboundedReceiver<(usize, Option<ToolOutcome>)>,
    ) {
        let (ended, results) = mpsc::unbounded_channel();
        let (halted, halt_seen) = watch::channel(false);
        let engine = self.clone();
        let calls = async move {
            let (engine, response_id) = (&engine, &response_id);
            let replica = &engine.replica;
            let mut results = futures::stream::iter(jobs)
                .map(|(index, call, tool, key)| {
                    // A call may wait for its place (the batch's concurrency, its source's calls in flight) past a
                    // pause of this process: it goes out only while this replica still holds its lease (waiting
                    // for the next beat, which first tells the runs whose response another replica took) and the
                    // run was not told to stop.
                    let (stop, halt_seen) = (stop.clone(), halt_seen.clone());
                    let may_send = async move {
                        replica.hold_lease().await
                            && stop.borrow().is_none()
                            && !*halt_seen.borrow()
                    };
                    async move {
                        let outcome = match &tool {
                            Some(tool) => {
                                let at = CallRef {
                                    response_id,
                                    idempotency_key: &key,
                                };
                                let span = super::spans::tool_call(tool, &call);
                                let execution = engine.tools.execute(tool, &call, at, may_send);
                                let outcome =
                                    tracing::Instrument::instrument(execution, span.clone()).await;
                                if let Some(outcome) = &outcome {
                                    super::spans::tool_ended(&span, outcome);
                                }
                                outcome
                            }
                            None => Some(ToolOutcome::error(format!(
                                "Tool '{}' is no longer available.",
                                call.name
                            ))),
                        };
                        (index, outcome)
                    }
                })
                .buffer_unordered(engine.limits.tool_concurrency.max(1));
            while let Some(result) = results.next().await {
                // A call kept from going out stops the batch: the others are dropped with the stream.
                let kept_from_going_out = result.1.is_none();
                if ended.send(result).is_err() || kept_from_going_out {
                    return;
                }
            }
        };
        let mut task = JoinSet::new();
        // The calls' spans stay children of the run's.
        task.spawn(tracing::Instrument::instrument(
            calls,
            tracing::Span::current(),
        ));
        (Calling { task, halted }, results)
    }

    /// Records the calls `seqs` as started, their notes rendered, on disk before any request goes out (a
    /// restarted loop must never send a different call under the same step's Idempotency-Key), and reports
    /// them; `NotOwner` when the response was lost meanwhile, and nothing may go out.
    async fn start_tools<S: ProgressSink>(
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
                render_request_note(&run.server_tools, tool);
            }
            run.journal.touch(seq as usize);
        }
        // With the calls goes the model answer that asked for them, as ended.
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
        Ok(())
    }
}

/// The calls of a batch, running on a task of their own ([`Engine::spawn_calls`]).
struct Calling {
    task: JoinSet<()>,
    /// Set once the run stops the batch: a call still waiting for its place then never goes out, even if its
    /// task is polled once more before it is aborted.
    halted: watch::Sender<bool>,
}

impl Calling {
    /// Stops the batch's calls: none that has not gone out goes out, and those running are dropped (the run
    /// may stop because the store told it, which its calls' stop signal does not carry).
    fn halt(&mut self) {
        self.halted.send_replace(true);
        self.task.abort_all();
    }

    /// Unwinds with the panic of the calls' task, if it panicked.
    async fn rethrow_panic(&mut self) {
        if let Some(Err(ended)) = self.task.join_next().await {
            if ended.is_panic() {
                std::panic::resume_unwind(ended.into_panic());
            }
        }
    }
}

/// The calls of `seqs` to make, each with its tool as the run holds it now.
fn jobs(run: &Run, seqs: &[u32]) -> Vec<Job> {
    seqs.iter()
        .filter_map(|&seq| {
            let tool = run.steps[seq as usize].tool()?;
            Some((
                seq as usize,
                tool.call.clone(),
                run.server_tools.get(&tool.call.name).cloned(),
                format!("{}:{}", run.record.id, seq),
            ))
        })
        .collect()
}

/// The note a call shows as it goes out, from its tool's template.
fn render_request_note(server_tools: &ServerTools, step: &mut ToolStep) {
    let template = server_tools
        .get(&step.call.name)
        .and_then(|t| t.notes.on_request.as_ref());
    if let Some(template) = template {
        let arguments =
            serde_json::from_str(&step.call.arguments).unwrap_or(serde_json::Value::Null);
        step.notes.on_request = Some(template.render(&arguments));
    }
}

/// Records how the call of step `index` ended (its note rendered, its rank among the batch's ends taken), and
/// reports it.
async fn record_end<S: ProgressSink>(
    run: &mut Run,
    index: usize,
    outcome: ToolOutcome,
    next_rank: &mut u32,
    sink: &mut S,
) {
    let step = &mut run.steps[index];
    step.state = if outcome.is_error() {
        StepState::Failed
    } else {
        StepState::Succeeded
    };
    if let StepBody::Tool(tool) = &mut step.body {
        tracing::debug!(response.id = %run.record.id, tool.name = %tool.call.name, failed = outcome.is_error(), "tool call ended");
        let template = run
            .server_tools
            .get(&tool.call.name)
            .and_then(|t| t.notes.on_result.as_ref());
        if let Some(template) = template {
            tool.notes.on_result =
                Some(template.render(&outcome.note_values(&tool.call.arguments)));
        }
        tool.outcome = Some(outcome);
        tool.ended_rank = Some(*next_rank);
        tool.ended_at_ms = Some(now_ms());
        *next_rank += 1;
    }
    sink.report(Progress::ToolEnded { step }).await;
    run.journal.touch(index);
}

/// Ends a batch whose run was told to stop. The calls still running are dropped, and their connections with them.
/// A cancel records every call not ended as failed; a replica giving the response up leaves them running, to be
/// sent again (under the same Idempotency-Key) by whoever resumes it.
async fn stop_batch<S: ProgressSink>(
    run: &mut Run,
    seqs: &[u32],
    next_rank: &mut u32,
    sink: &mut S,
) {
    if run.stop() == Some(Stop::Cancel) {
        for &seq in seqs {
            record_cancelled(run, seq as usize, next_rank, sink).await;
        }
    }
}

/// Records the call of step `index`, unless it ended, as failed by a cancel, and reports it.
async fn record_cancelled<S: ProgressSink>(
    run: &mut Run,
    index: usize,
    next_rank: &mut u32,
    sink: &mut S,
) {
    let step = &mut run.steps[index];
    if step.state.is_ended() {
        return;
    }
    step.state = StepState::Failed;
    if let StepBody::Tool(tool) = &mut step.body {
        if let Some(server_tool) = run.server_tools.get(&tool.call.name) {
            crate::metrics::tool_call_cancelled(
                server_tool.metric_label(),
                server_tool.metric_source(),
            );
        }
        tool.outcome = Some(ToolOutcome::error(CANCELLED));
        tool.ended_rank = Some(*next_rank);
        *next_rank += 1;
    }
    sink.report(Progress::ToolEnded { step }).await;
    run.journal.touch(index);
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
