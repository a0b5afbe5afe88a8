//! Resuming a response from its stored steps, on the replica that took it: a model call that never ended is made
//! again, a tool call that was in flight is sent again under the same `Idempotency-Key`, pending steps run, all
//! through `decide_next_action`. A queued background response starts the same way.

use std::sync::Arc;
use std::time::{Duration, Instant};

use gateway_core::response::{Ending, FailureCode, ResponseStatus};
use gateway_core::steps::total_usage;
use tokio::sync::OwnedSemaphorePermit;

use super::journal::Journal;
use super::runs::Registration;
use super::server_tools::{
    bind_hosted_tools, restored, source_of, stored_remote_tools, stored_source_ids,
};
use super::{Engine, EventSink, Origin, Run, Stop};
use crate::clock::now;
use crate::governance::{Payer, Scope, StartRefused};
use crate::store::ownership::{Alike, Claimed};
use crate::store::responses::{Durability, Started, StepWrite, StoredRun};
use crate::store::StoreError;
use crate::tools::ServerTools;

/// How long a queued response whose key or project runs as many as `max_concurrent` allows waits before it is
/// tried again (as the `Retry-After` of a create refused for it).
const START_RETRY_MS: i64 = 1000;

impl Engine {
    /// Resumes (or starts) a response this replica claimed, on its own task, in the place `admitted` holds and
    /// under the `registration` its claimer made for it.
    pub(super) async fn resume(
        &self,
        claimed: Claimed,
        admitted: OwnedSemaphorePermit,
        registration: Registration,
    ) -> Result<(), StoreError> {
        // What it stored, and who pays for it, read back together: a failure of either is the same failure to
        // read the response back.
        let (stored, payer) = match self.read_back(&claimed).await {
            Ok(Some(read)) => read,
            Ok(None) => return Ok(()), // deleted, or ended, meanwhile
            // Whatever holds it cannot be read, and never will be: it ends now rather than being claimed and
            // released for ever (SPEC 9).
            Err(e) if !e.is_transient() => {
                tracing::warn!(response.id = %claimed.id, error = %e, "a running response cannot be read back; ending it failed");
                return self
                    .end_unreadable(
                        &claimed,
                        "What the gateway stored of this response cannot be read back; it cannot be resumed.",
                    )
                    .await;
            }
            // A read that failed for a passing reason is given back, and the next claim tries again. Each such
            // failure counts as a start when the database answers the count (it is up, so the failure is this
            // response's read, a statement that times out every time, say): one that fails more often than
            // `durability.max_resumes` ends rather than being claimed and released for ever (SPEC 9). A database
            // that answers nothing counts nothing.
            Err(e) => {
                let counted = self
                    .store
                    .count_resume(&claimed.id, &self.replica.id, claimed.epoch)
                    .await;
                return match counted.map(|started| started.starts) {
                    Ok(resumes) if resumes > self.replica.max_resumes => {
                        tracing::warn!(response.id = %claimed.id, error = %e, resumes, "a running response failed to be read back too often; ending it failed");
                        let message = format!(
                            "What the gateway stored of this response could not be read back, try after try \
                             ({resumes} starts and tries in all, more than the gateway allows); it is not resumed \
                             again."
                        );
                        self.end_unreadable(&claimed, &message).await
                    }
                    Err(StoreError::NotOwner) => Ok(()), // taken by another replica, or ended, meanwhile
                    _ => Err(e),
                };
            }
        };
        let origin = if stored.record.status() == ResponseStatus::Queued {
            Origin::Queued
        } else {
            Origin::Resumed
        };
        // A queued response gave its place back when it was left queued: it takes one again within the counts,
        // as a create does, or waits queued (not counted as a start) until a place may be free.
        let queued_place = match origin {
            Origin::Queued => match self.governor.take_running_to_start(&payer).await {
                Ok(place) => Some(place),
                Err(refused) => {
                    let alike = match &refused {
                        StartRefused::Full { scope, owner } => {
                            tracing::debug!(
                                response.id = %claimed.id, scope = scope.as_str(), owner = %owner,
                                "a queued response waits for a running place"
                            );
                            Some(match scope {
                                Scope::Key => Alike::Key(owner),
                                Scope::Project => Alike::Project(owner),
                            })
                        }
                        StartRefused::Store(e) => {
                            tracing::warn!(
                                response.id = %claimed.id, error = %e,
                                "could not take a running place for a queued response; it waits"
                            );
                            None
                        }
                    };
                    let deferred = self
                        .store
                        .defer_start(
                            &claimed.id,
                            &self.replica.id,
                            claimed.epoch,
                            START_RETRY_MS,
                            alike,
                        )
                        .await?;
                    if deferred {
                        // Its room is free again: another queued response (another key's or project's, since
                        // this one's were put off with it) may be taken at once. Not after a store that failed:
                        // the next sweep tries again, rather than every queued response in turn at once.
                        drop(admitted);
                        if matches!(refused, StartRefused::Full { .. }) {
                            self.replica.work.notify_one();
                        }
                        return Ok(());
                    }
                    // Asked to cancel meanwhile (or no longer this claim's): it starts without a place, and its
                    // start finds the cancel and ends it at once.
                    Some(None)
                }
            },
            Origin::Resumed | Origin::New => None,
        };
        // Every start from the store is counted (a resume that failed before this point is not): a response whose
        // runs keep dying where they run (a crash or a panic each time, or hand-overs without end) ends here
        // rather than be resumed again (SPEC 9).
        let Started {
            starts: resumes,
            cancel_requested,
        } = match self
            .store
            .count_resume(&claimed.id, &self.replica.id, claimed.epoch)
            .await
        {
            Ok(started) => started,
            Err(StoreError::NotOwner) => return Ok(()), // taken by another replica meanwhile
            Err(e) => return Err(e),
        };
        if resumes > self.replica.max_resumes {
            let message = format!(
                "This response was started {} times from what the gateway stored of it without finishing (its \
                 run kept stopping where it ran), more than the gateway allows; it is not resumed again.",
                resumes - 1
            );
            return self
                .end_unresumable(
                    stored,
                    claimed.epoch,
                    FailureCode::ResumedTooOften,
                    &message,
                )
                .await;
        }
        crate::metrics::response_resumed(origin == Origin::Queued, claimed.taken_over);
        tracing::info!(
            response.id = %claimed.id,
            taken_over = claimed.taken_over,
            queued = origin == Origin::Queued,
            "resuming a response"
        );
        let deployment = match &stored.deployment_id {
            Some(id) => self.store.deployment_by_id(id).await?,
            None => None,
        };
        let Some(deployment) = deployment else {
            return self
                .end_unresumable(
                    stored,
                    claimed.epoch,
                    FailureCode::DeploymentGone,
                    "The deployment this response ran on no longer exists; it cannot be resumed.",
                )
                .await;
        };
        let server_tools = self.restore_tools(&stored).await?;
        // The time left was read off the database's clock, as the deadline was set (SPEC 9).
        let remaining_ms = stored.deadline_in_ms.map_or(0, |left| left.max(0));
        let sink = EventSink::for_followers(&stored.record, &stored.steps);
        // A resumed one was admitted, and ran: it runs whatever the counts say, and counts while it runs.
        let running = match queued_place {
            Some(place) => place,
            None => self.governor.hold_running(&payer).await,
        };
        let run = Run {
            limits: self.limits_for(stored.record.params.max_tool_calls),
            project_id: stored.project_id,
            keyed: stored.keyed,
            deployment: Arc::new(deployment),
            server_tools,
            context: stored.context,
            journal: Journal::resumed(stored.steps.len()),
            steps: stored.steps,
            deadline: Instant::now() + Duration::from_millis(remaining_ms.unsigned_abs()),
            record: stored.record,
            origin,
            registration,
            // A cancel asked for while no replica ran the response (its owner dead, the cancel's word to it
            // lost): heeded before the run sends anything again, not at its first write. (One with no step stored
            // then reads, in the store, as a response that never ran; a follower that saw it start is told its
            // end all the same, `stream.rs`.)
            store_says: cancel_requested.then_some(Stop::Cancel),
            _admitted: admitted,
            payer,
            unrecorded_usage: Vec::new(),
            running,
            trace_context: stored.trace_context,
        };
        self.spawn(run, sink);
        Ok(())
    }

    /// The server tools a response started with, as they are now (with their secrets): its sources read again
    /// (one deleted since is "no longer available" to the loop), bound as when it started (a hosted tool it
    /// declared is served under the hosted type's name), and its own MCP servers reached again the way its
    /// request declares them.
    async fn restore_tools(&self, stored: &StoredRun) -> Result<ServerTools, StoreError> {
        let rows = self
            .store
            .tool_sources_by_id(&stored_source_ids(&stored.server_tools))
            .await?;
        let expanded = self
            .tools
            .expand(rows.into_iter().map(source_of).collect())
            .await;
        let declared = &stored.record.params.tools;
        let (bound, _) = bind_hosted_tools(expanded, declared);
        let remote = self
            .reattach_remote(declared, stored_remote_tools(&stored.server_tools))
            .await;
        Ok(restored(
            &stored.server_tools,
            bound.into_iter().chain(remote).collect(),
        ))
    }

    /// A claimed response's stored run and who pays for it; `None` when it was deleted or has ended meanwhile.
    async fn read_back(&self, claimed: &Claimed) -> Result<Option<(StoredRun, Payer)>, StoreError> {
        let Some(stored) = self
            .store
            .load_run(&claimed.project_id, &claimed.id)
            .await?
        else {
            return Ok(None);
        };
        if stored.record.ending().is_some() {
            return Ok(None);
        }
        let payer = self.payer_of(&stored).await?;
        Ok(Some((stored, payer)))
    }

    /// Who pays for a resumed response: the key that created it, as it is held now (revoked or not); a response
    /// stored before keys were recorded counts against its project alone, without limits.
    async fn payer_of(&self, stored: &StoredRun) -> Result<Payer, StoreError> {
        let grant = match &stored.api_key_id {
            Some(key_id) => self.store.grant_by_key_id(key_id).await?,
            None => None,
        };
        Ok(match grant {
            Some(grant) => Payer::of(&grant),
            None => Payer::project_only(&stored.project_id, Default::default()),
        })
    }

    /// Ends a claimed response whose stored state could not be read back, failed (`unreadable_state`) with
    /// `message`, its webhooks told first (best effort, as on a run's store-error path, so that a queue that keeps
    /// failing cannot keep the response from ending).
    async fn end_unreadable(&self, claimed: &Claimed, message: &str) -> Result<(), StoreError> {
        let queued = self
            .queue_unreadable_failure(claimed)
            .await
            .unwrap_or_else(|error| {
                tracing::warn!(response.id = %claimed.id, %error, "could not queue the webhook event of the failure");
                false
            });
        self.store
            .end_failed_without_steps(
                &claimed.id,
                &self.replica.id,
                claimed.epoch,
                &FailureCode::UnreadableState,
                message,
                now(),
            )
            .await?;
        self.replica.progressed(&claimed.id);
        if queued {
            self.wake_deliverer();
        }
        Ok(())
    }

    /// Queues the `response.failed` event of a claimed response whose stored state cannot be read, when it runs
    /// in the background; whether one was queued.
    async fn queue_unreadable_failure(&self, claimed: &Claimed) -> Result<bool, StoreError> {
        if self.store.is_background(&claimed.id).await? != Some(true) {
            return Ok(false);
        }
        self.queue_ending_event(
            &claimed.project_id,
            &claimed.id,
            gateway_core::webhook::WebhookEvent::ResponseFailed,
        )
        .await
    }

    /// Ends a taken response that is not resumed (its deployment is gone, or it was claimed too often), failed
    /// with `code` and `message`.
    async fn end_unresumable(
        &self,
        stored: StoredRun,
        epoch: i64,
        code: FailureCode,
        message: &str,
    ) -> Result<(), StoreError> {
        tracing::warn!(response.id = %stored.record.id, "{message}");
        // A background response's ending is told to the project's webhooks, as any other ending is.
        let queued = stored.record.background
            && self
                .queue_ending_event(
                    &stored.project_id,
                    &stored.record.id,
                    gateway_core::webhook::WebhookEvent::ResponseFailed,
                )
                .await?;
        let mut record = stored.record;
        record.end(
            Ending::Failed {
                code,
                message: message.to_owned(),
            },
            total_usage(&stored.steps),
            now(),
        );
        self.store
            .write_steps(&StepWrite {
                response_id: &record.id,
                added: &[],
                changed: &[],
                ended: Some(&record),
                at: now(),
                durability: Durability::Flush,
                owner: &self.replica.id,
                epoch,
                notify: true,
                usage: &[],
            })
            .await?;
        self.replica.progressed(&record.id);
        if queued {
            self.wake_deliverer();
        }
        Ok(())
    }
}
