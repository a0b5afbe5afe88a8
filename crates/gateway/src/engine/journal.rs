//! The write journal: what of a run is written when, and how durably (`docs/behaviour.md`, "How steps are
//! written").
//!
//! A run writes at step boundaries, each one statement: the steps added and changed since the last boundary,
//! and at the end how the response ended. The write before tool requests go out, and the end, wait for the
//! disk; the others are relaxed (their loss is harmless: a model call is made again, a tool call is sent again
//! under its `Idempotency-Key`). The write before a model call lingers alongside the call, and a finished tool
//! call whose siblings still run lingers for company.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use gateway_core::Step;

use super::{Engine, ProgressSink, Run, Stop};
use crate::clock::now;
use crate::retry::RetryPolicy;
use crate::store::governance::UsageRecord;
use crate::store::responses::{Durability, NewResponse, StepWrite, WriteOutcome};
use crate::store::{Store, StoreError};

/// How long a write that need not wait for the disk lingers for more to write with it: the write before a model
/// call waits this long for the call to end (a model that answers sooner has it folded into the next write), and
/// an ended tool call of a batch whose siblings still run waits this long for them.
pub(super) const WRITE_LINGER: Duration = Duration::from_millis(5);

/// The first wait before a write that must land is tried again, after the store failed for a moment.
pub(super) const STORE_RETRY_BASE_MS: u64 = 100;

/// A new response's row that could not be written.
#[derive(Debug)]
pub(super) struct RowUnwritten {
    /// Why the last try failed.
    pub(super) failure: StoreError,
    /// Some try failed in a way that leaves it unknown whether it committed (its reply was lost): the row may be
    /// in the store, whatever the tries after it met.
    pub(super) in_doubt: bool,
}

/// What of a run is in the store.
#[derive(Debug)]
pub(super) struct Journal {
    /// `store: false` responses run entirely in memory.
    persist: bool,
    /// The project of a stored response whose row is not written yet: it is written with the first boundary
    /// that waits for the disk.
    unwritten: Option<String>,
    /// How many of the run's steps (the first ones) are in the store.
    stored: usize,
    /// Stored steps changed since the last write, by index.
    changed: BTreeSet<usize>,
    /// The first write of the row failed in a way that leaves it unknown whether it committed (its reply was
    /// lost): the response may be in the store.
    in_doubt: bool,
}

impl Journal {
    /// The journal of a new run: `written` when its row and first `steps` were stored as it was prepared.
    pub(super) fn new(persist: bool, project_id: &str, written: bool, steps: usize) -> Journal {
        Journal {
            persist,
            unwritten: (persist && !written).then(|| project_id.to_owned()),
            stored: if written { steps } else { 0 },
            changed: BTreeSet::new(),
            in_doubt: false,
        }
    }

    /// The journal of a run resumed from the store, where all of its `steps` are.
    pub(super) fn resumed(steps: usize) -> Journal {
        Journal {
            persist: true,
            unwritten: None,
            stored: steps,
            changed: BTreeSet::new(),
            in_doubt: false,
        }
    }

    /// Whether nothing of the run is in the store yet (a stored response whose row was put off, or an unstored
    /// one): a failure then left nothing behind, and no tool ran.
    pub(super) fn nothing_stored(&self) -> bool {
        !self.persist || (self.unwritten.is_some() && !self.in_doubt)
    }

    /// Whether the response is stored and its row written.
    pub(super) fn is_written(&self) -> bool {
        self.persist && self.unwritten.is_none()
    }

    /// Whether the run is stored (its usage goes with its step writes).
    pub(super) fn persists(&self) -> bool {
        self.persist
    }

    /// Notes that step `index` changed, so that the next write records it.
    pub(super) fn touch(&mut self, index: usize) {
        if index < self.stored {
            self.changed.insert(index);
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
    usage: Vec<UsageRecord>,
}

/// How one write goes out: as which replica and claim, how durably, told to followers or not.
#[derive(Clone, Copy)]
struct Writing<'a> {
    owner: &'a str,
    epoch: i64,
    durability: Durability,
    notify: bool,
}

impl Changes {
    fn is_empty(&self) -> bool {
        self.added.is_empty() && self.changed.is_empty() && self.usage.is_empty()
    }

    async fn save(
        &self,
        store: &Store,
        ended: Option<&gateway_core::response::ResponseRecord>,
        writing: Writing<'_>,
    ) -> Result<WriteOutcome, StoreError> {
        let changed: Vec<&Step> = self.changed.iter().collect();
        store
            .write_steps(&StepWrite {
                response_id: &self.response_id,
                added: &self.added,
                changed: &changed,
                ended,
                at: now(),
                durability: writing.durability,
                owner: writing.owner,
                epoch: writing.epoch,
                notify: writing.notify,
                usage: &self.usage,
            })
            .await
    }
}

impl Run {
    /// The steps added and changed since the last write, now counted as written.
    fn take_changes(&mut self) -> Changes {
        let journal = &mut self.journal;
        let changes = if journal.persist {
            Changes {
                response_id: self.record.id.clone(),
                added: self.steps[journal.stored..].to_vec(),
                changed: journal
                    .changed
                    .iter()
                    .map(|&i| self.steps[i].clone())
                    .collect(),
                usage: std::mem::take(&mut self.unrecorded_usage),
            }
        } else {
            Changes::default()
        };
        journal.stored = self.steps.len();
        journal.changed.clear();
        changes
    }

    /// Changes whose write failed: they are written again with the next write.
    fn give_back(&mut self, mut changes: Changes) {
        self.unrecorded_usage.append(&mut changes.usage);
        let journal = &mut self.journal;
        let first_added = changes
            .added
            .first()
            .map_or(journal.stored, |step| step.seq as usize);
        journal.stored = journal.stored.min(first_added);
        for step in &changes.changed {
            journal.changed.insert(step.seq as usize);
        }
        let stored = journal.stored;
        journal.changed.retain(|&index| index < stored);
    }
}

impl Engine {
    /// The durability of a write whose loss in a crash of the database server is harmless: a model call is
    /// made again, a tool call is sent again under its Idempotency-Key.
    pub(super) fn relaxed(&self) -> Durability {
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
    pub(super) async fn write_and_call_model<S: ProgressSink>(
        &self,
        run: &mut Run,
        index: usize,
        sink: &mut S,
    ) {
        let changes = if run.journal.unwritten.is_none() {
            run.take_changes()
        } else {
            Changes::default()
        };
        // The call's future is boxed: held inline beside the write's, it made this future (and so the loop's,
        // which is moved whole into its box) 13 KB, copied on every step.
        if changes.is_empty() {
            return Box::pin(self.call_model(run, index, sink)).await;
        }
        let sent = AtomicBool::new(false);
        let writing = Writing {
            owner: &self.replica.id,
            epoch: run.registration.epoch,
            durability: self.relaxed(),
            notify: run.registration.is_followed(),
        };
        let written = {
            let write = async {
                tokio::time::sleep(WRITE_LINGER).await;
                sent.store(true, Ordering::Relaxed);
                changes.save(&self.store, None, writing).await
            };
            let mut call = Box::pin(self.call_model(run, index, sink));
            tokio::pin!(write);
            tokio::select! {
                () = &mut call => {
                    // A write already sent is awaited (never abandoned halfway); one still lingering is dropped.
                    if sent.load(Ordering::Relaxed) { Some(write.await) } else { None }
                }
                written = &mut write => {
                    call.await;
                    Some(written)
                }
            }
        };
        match written {
            Some(Ok(outcome)) => self.took(run, outcome),
            None => run.give_back(changes),
            Some(Err(StoreError::NotOwner)) => run.heard(Stop::Abandon),
            Some(Err(e)) => {
                tracing::warn!(response.id = %run.record.id, error = %e, "a step write failed; retrying it with the next one");
                run.give_back(changes);
            }
        }
    }

    /// What a write that went through means for the run: followers on this replica are told, and a cancel is
    /// heeded, by a model call under way too (the write may land while one runs). (Followers elsewhere were told
    /// by the write itself, when there were any.)
    fn took(&self, run: &mut Run, outcome: WriteOutcome) {
        if outcome.cancel_requested {
            run.heard(Stop::Cancel);
            self.replica.runs.stop(&run.record.id, Stop::Cancel);
        }
        self.replica.progressed(&run.record.id);
    }

    /// One step boundary: writes the steps added and changed since the last one, and the response's ending if
    /// it has ended, in one statement. Nothing is written for a response that is not stored. A write that must
    /// reach the disk, of a response already in the store, is tried again while the store fails for a moment, for
    /// at most a lease: by then another replica may take the response over. A replica that no longer drives the
    /// response writes nothing (`NotOwner`).
    pub(super) async fn write(
        &self,
        run: &mut Run,
        durability: Durability,
    ) -> Result<(), StoreError> {
        let give_up_at = tokio::time::Instant::now() + self.replica.lease;
        let mut waits = RetryPolicy::new(u32::MAX, STORE_RETRY_BASE_MS).waits();
        loop {
            let failure = match self.write_once(run, durability).await {
                Ok(()) => return Ok(()),
                Err(failure) => failure,
            };
            // A write that must land is tried again while the store fails for a moment: a write whose commit
            // succeeded but whose reply was lost is recognised as the same write (the first write of a response's
            // row included), never a conflict.
            // A response not yet in the store, whose write surely did not commit, left nothing behind: its client
            // is better told at once (and may send it again) than kept waiting.
            let retry = durability == Durability::Flush
                && failure.is_transient()
                && !run.journal.nothing_stored()
                && run.stop() != Some(Stop::Abandon);
            let wait = waits
                .next()
                .filter(|wait| retry && tokio::time::Instant::now() + *wait < give_up_at);
            let Some(wait) = wait else {
                return Err(failure);
            };
            tracing::warn!(response.id = %run.record.id, error = %failure, "a step write failed; trying again");
            tokio::time::sleep(wait).await;
        }
    }

    async fn write_once(&self, run: &mut Run, durability: Durability) -> Result<(), StoreError> {
        let ends = run.record.ending().is_some();
        if let Some(project_id) = &run.journal.unwritten {
            // The first write of a response whose row was put off: the row (with its ending, if this is it),
            // its context and every step so far, at once.
            let written = self
                .store
                .create_response(
                    &NewResponse {
                        record: &run.record,
                        project_id,
                        deployment_id: &run.deployment.id,
                        server_tools: &super::server_tools::stored(&run.server_tools),
                        context: &run.context,
                        steps: &run.steps,
                        idempotency_key: None,
                        owner: Some(&self.replica.id),
                        deadline_in_ms: Some(remaining_ms(run.deadline)),
                        api_key_id: run.payer.key_id.as_deref(),
                        usage: &run.unrecorded_usage,
                        trace_context: run.trace_context.as_deref(),
                    },
                    durability,
                )
                .await;
            if let Err(e) = written {
                run.journal.in_doubt |= e.may_have_committed();
                if matches!(e, StoreError::NotOwner) {
                    // Its first write landed after all (its reply was lost), and another replica took the
                    // response over since: this run gives it up.
                    run.journal.unwritten = None;
                    run.heard(Stop::Abandon);
                }
                return Err(e);
            }
            run.journal.unwritten = None;
            run.unrecorded_usage.clear();
            run.journal.stored = run.steps.len();
            run.journal.changed.clear();
            return Ok(());
        }
        let changes = run.take_changes();
        if !changes.is_empty() || (run.journal.persist && ends) {
            let ended = ends.then_some(&run.record);
            let writing = Writing {
                owner: &self.replica.id,
                epoch: run.registration.epoch,
                durability,
                notify: run.registration.is_followed(),
            };
            match changes.save(&self.store, ended, writing).await {
                Ok(outcome) => self.took(run, outcome),
                Err(StoreError::NotOwner) => {
                    run.heard(Stop::Abandon);
                    return Err(StoreError::NotOwner);
                }
                Err(e) => {
                    run.give_back(changes);
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    /// Writes a new response's row; a write whose reply was lost is tried again (for at most a lease), and
    /// recognised when its commit had succeeded.
    pub(super) async fn create_row(
        &self,
        new: &NewResponse<'_>,
        durability: Durability,
    ) -> Result<(), RowUnwritten> {
        let give_up_at = tokio::time::Instant::now() + self.replica.lease;
        let mut waits = RetryPolicy::new(u32::MAX, STORE_RETRY_BASE_MS).waits();
        let mut in_doubt = false;
        loop {
            let failure = match self.store.create_response(new, durability).await {
                Ok(()) => return Ok(()),
                Err(failure) => failure,
            };
            // Once in doubt, always: a later try that surely wrote nothing says nothing of the earlier one.
            in_doubt |= failure.may_have_committed();
            // A write that surely did not commit is answered at once.
            let wait = waits.next().filter(|wait| {
                failure.may_have_committed() && tokio::time::Instant::now() + *wait < give_up_at
            });
            let Some(wait) = wait else {
                return Err(RowUnwritten { failure, in_doubt });
            };
            tracing::warn!(response.id = %new.record.id, error = %failure, "writing a new response failed; trying again");
            tokio::time::sleep(wait).await;
        }
    }

    /// A write whose loss is harmless (see `relaxed`): when it fails, what it held goes with the next write, and
    /// the loop goes on.
    pub(super) async fn write_relaxed(&self, run: &mut Run) {
        if let Err(e) = self.write(run, self.relaxed()).await {
            tracing::warn!(response.id = %run.record.id, error = %e, "a step write failed; retrying it with the next one");
        }
    }
}

/// What is left of a run's deadline, in milliseconds: the store adds it to the database's clock.
pub(super) fn remaining_ms(deadline: std::time::Instant) -> i64 {
    let left = deadline.saturating_duration_since(std::time::Instant::now());
    i64::try_from(left.as_millis()).unwrap_or(i64::MAX)
}
