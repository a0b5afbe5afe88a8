//! The driver loop: ask `decide_next_action`, carry the action out (a model call, a batch of tool calls, or the
//! end), write at each step boundary, report progress, repeat.

use std::time::{Duration, Instant};

use gateway_core::decide::LoopInput;
use gateway_core::events::Progress;
use gateway_core::output::render_output;
use gateway_core::response::{Ending, FailureCode, ResponseState};
use gateway_core::steps::{total_usage, ModelStep, Step, StepBody, StepState};
use gateway_core::{decide_next_action, IncompleteReason, NextAction};

use super::server_tools::unsent_step;
use super::{Engine, EngineError, Finished, Origin, ProgressSink, Run, Stop};
use crate::clock::now;
use crate::store::responses::Durability;
use crate::store::StoreError;

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
        let span = super::spans::run_span(&run, &self.replica.id);
        // The loop's future is boxed (and so are the rare paths below): a run's future is moved into its task and
        // out of it whole, and unboxed it was 16 KB, most of it the loop's.
        let driven = tracing::Instrument::instrument(
            Box::pin(self.drive(&mut run, &mut sink)),
            span.clone(),
        )
        .await;
        super::spans::run_ended(&span, run.record.status().as_str());
        let source = match driven {
            // The run ends here: its record is moved out rather than copied.
            Ok(Ended { output }) => {
                return Ok(Finished {
                    record: run.record,
                    output,
                })
            }
            Err(Interrupted::GivenUp) => return Err(Box::pin(self.given_up(&run)).await),
            Err(Interrupted::Store(source))
                if source.is_transient() && !run.journal.nothing_stored() =>
            {
                // The store did not answer for a lease: give the response up, and release it once the store
                // answers again, so that a replica (maybe this one) resumes it from its stored steps.
                tracing::warn!(response.id = %run.record.id, error = %source, "the store stopped answering; handing the response over");
                self.replica
                    .release_later(&run.record.id, run.registration.epoch);
                return Err(Box::pin(self.given_up(&run)).await);
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
            // A background response's ending is told to the project's webhooks, as every other ending is: queued
            // first (best effort, the store failing), and sent only once the response reads `failed`.
            let queued = run.record.background
                && Box::pin(self.queue_ending_event(
                    &run.project_id,
                    &run.record.id,
                    gateway_core::webhook::WebhookEvent::ResponseFailed,
                ))
                .await
                .unwrap_or_else(|error| {
                    tracing::warn!(response.id = %run.record.id, %error, "could not queue the webhook event of the failure");
                    false
                });
            // A response must not stay in progress for ever when its loop gave up: the steps not yet written go
            // with its ending; failing that, the ending alone; failing that too, the response is handed back, so
            // that a replica resumes it and ends it.
            let mut ended = true;
            if let Err(again) = Box::pin(self.write(&mut run, Durability::Flush)).await {
                tracing::error!(response.id = %run.record.id, error = %again, "could not record the failure with its steps");
                let ended_alone = Box::pin(self.store.end_failed_without_steps(
                    &run.record.id,
                    &self.replica.id,
                    run.registration.epoch,
                    &FailureCode::ServerError,
                    &message,
                    now(),
                ))
                .await;
                if let Err(again) = ended_alone {
                    tracing::error!(response.id = %run.record.id, error = %again, "could not record the failure either; handing the response over");
                    self.replica
                        .release_later(&run.record.id, run.registration.epoch);
                    ended = false;
                }
            }
            if queued && ended {
                self.deliverer.wake();
            }
        }
        // Best effort, bounded for a reader that takes nothing: it learns why its stream ends here, and the
        // stream still ends with its one terminal event.
        let output = render_output(&run.steps, false);
        let tell = sink.report(Progress::Ended {
            record: &run.record,
            output: &output,
        });
        let _ = tokio::time::timeout(TELL_TIMEOUT, Box::pin(tell)).await;
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

    /// Reports how the run starts, then carries out what `decide_next_action` says until the response ends.
    async fn drive<S: ProgressSink>(
        &self,
        run: &mut Run,
        sink: &mut S,
    ) -> Result<Ended, Interrupted> {
        self.begin(run, sink).await?;
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
            let budget_spent = self.governor.budget_spent(&run.payer).await;
            let action = decide_next_action(&LoopInput {
                steps: &run.steps,
                registered: run.server_tools.names(),
                limits: run.limits,
                deadline_passed: Instant::now() >= run.deadline,
                budget_spent,
            });
            tracing::debug!(response.id = %run.record.id, action = action.kind(), "next action");
            if let Some(ending) = self.act(run, action, sink).await? {
                return self.finish(run, ending, sink).await;
            }
        }
    }

    /// Reports a run's start as its origin asks: a new run its creation and start, a queued one its start (its
    /// deadline runs from now, by the database's clock as every replica reads it), a resumed one nothing.
    async fn begin<S: ProgressSink>(&self, run: &mut Run, sink: &mut S) -> Result<(), StoreError> {
        match run.origin {
            Origin::New => {
                sink.report(Progress::Created {
                    record: &run.record,
                })
                .await;
            }
            Origin::Queued => {
                run.deadline =
                    Instant::now() + Duration::from_millis(self.limits.response_deadline_ms);
                let cancelled = self
                    .store
                    .start_queued(
                        &run.record.id,
                        &self.replica.id,
                        run.registration.epoch,
                        self.deadline_ms(),
                    )
                    .await?;
                if cancelled {
                    run.heard(Stop::Cancel);
                }
                if run.stop().is_some() {
                    return Ok(());
                }
                run.record.state = ResponseState::InProgress;
            }
            Origin::Resumed => return Ok(()),
        }
        sink.report(Progress::Running {
            record: &run.record,
        })
        .await;
        for step in run.steps.iter().filter(|s| s.listing().is_some()) {
            sink.report(Progress::Listed { step }).await;
        }
        Ok(())
    }

    /// Carries out `action`; answers the response's ending when it is one.
    async fn act<S: ProgressSink>(
        &self,
        run: &mut Run,
        action: NextAction,
        sink: &mut S,
    ) -> Result<Option<Ending>, Interrupted> {
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
            return Ok(Some(Ending::Incomplete {
                reason: IncompleteReason::ClientDisconnected,
            }));
        }
        let ending = match action {
            NextAction::CallModel => {
                let seq = run.steps.len();
                run.steps.push(Step {
                    seq: seq as u32,
                    state: StepState::Running,
                    body: StepBody::Model(ModelStep::default()),
                });
                self.write_and_call_model(run, seq, sink).await;
                return Ok(None);
            }
            NextAction::ResumeModelCall { seq } => {
                self.write_and_call_model(run, seq as usize, sink).await;
                return Ok(None);
            }
            NextAction::DispatchBatch { batch, calls } => {
                // Recorded with the next write, right before they run.
                for call in calls {
                    let mut step =
                        unsent_step(&run.server_tools, call, batch, true, &run.record.id);
                    step.seq = run.steps.len() as u32;
                    run.steps.push(step);
                }
                return Ok(None);
            }
            NextAction::RunTools { seqs } => {
                self.run_tools(run, &seqs, sink).await?;
                return Ok(None);
            }
            NextAction::Complete => Ending::Completed { handed_back: false },
            NextAction::HandBack { calls } => {
                sink.report(Progress::HandedBack { calls: &calls }).await;
                Ending::Completed { handed_back: true }
            }
            NextAction::Incomplete { reason } => Ending::Incomplete { reason },
            NextAction::Fail { code, message } => Ending::Failed { code, message },
        };
        Ok(Some(ending))
    }

    /// Makes sure this replica still holds its lease before the run acts (a model call, a tool request): a
    /// process that was paused or cut off for longer than a lease waits for its next beat, which tells the runs
    /// whose response another replica took to give it up (SPEC 9). A lease that does not come back within a lease
    /// means the store is out of reach: the run gives its response up, to be released once the store answers.
    pub(super) async fn check_lease(&self, run: &mut Run) {
        if !self.replica.hold_lease().await {
            self.give_up_lapsed(run);
        }
    }

    /// Gives the response of `run` up, its replica's lease lapsed and not come back within a lease: it is released
    /// once the store answers, for another replica (or this one) to take over.
    pub(super) fn give_up_lapsed(&self, run: &mut Run) {
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
    ) -> Result<Ended, Interrupted> {
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
        let keeps_turn = matches!(ending, Ending::Completed { .. } | Ending::Incomplete { .. })
            && run.record.params.conversation.is_some();
        if keeps_turn {
            // The output appended to the conversation must be the output any run of this response ends with: its
            // steps are written first (fenced), so that a run resumed after this replica stops renders the same
            // items, which the conversation then holds already, instead of calling the model again and appending
            // a second answer. A replica that lost the response stops here, before appending anything.
            self.write(run, Durability::Flush).await?;
        }
        run.record.end(ending, total_usage(&run.steps), now());
        if keeps_turn {
            // Before the ending is written: should this replica stop in between, the run resumed elsewhere
            // appends again, and what is there already is skipped.
            // Boxed: a response outside a conversation should not carry this future's size.
            Box::pin(self.append_to_conversation(run, handed_back)).await?;
        }
        // Likewise before the ending: its event is queued once whoever writes the ending, and delivered only once
        // the ending is there to be read.
        let queued_events = self.queue_webhook_event(run).await?;
        // Clients see this ending: it waits for the disk, and so makes every earlier write durable too.
        self.write(run, Durability::Flush).await?;
        if queued_events {
            self.deliverer.wake();
        }
        // Its places are free before anyone can know it ended: a client that waited for it and creates the next
        // response finds them given back.
        if let Some(running) = run.running.take() {
            running.give_back().await;
        }
        let output = render_output(&run.steps, handed_back);
        crate::metrics::response_finished(run.record.status().as_str(), &run.steps);
        sink.report(Progress::Ended {
            record: &run.record,
            output: &output,
        })
        .await;
        Ok(Ended { output })
    }
}

/// A run's loop reached the response's end, recorded: the output clients see (the record is the run's).
pub(super) struct Ended {
    output: Vec<gateway_core::Item>,
}

/// What a cancelled model or tool call records as its failure.
pub(super) const CANCELLED: &str = "The response was cancelled before this call ended.";

/// Resolves once `run` is told to stop (at once if it was already).
pub(super) fn told_to_stop(run: &Run) -> impl std::future::Future<Output = ()> + Send + 'static {
    let mut stop = run.registration.stop.clone();
    async move {
        if stop.wait_for(Option::is_some).await.is_err() {
            // The registration outlives the run; should it go, nothing will tell the run to stop.
            std::future::pending::<()>().await;
        }
    }
}
