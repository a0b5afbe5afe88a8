//! The replica's duties besides serving requests: it beats (keeping its lease on the responses it drives), takes
//! what needs a replica (queued background responses nobody took, the responses of a replica that stopped
//! beating, whatever an earlier process left unfinished), hears the other replicas (Postgres `LISTEN`), and on
//! shutdown lets its runs finish within the grace, then hands the rest over at once. It also delivers webhooks
//! from the outbox (`crate::webhooks`).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;

use super::{Engine, Stop};
use crate::duty;
use crate::store::notify::{Listener, Notification};
use crate::store::{Store, StoreError};

/// Responses a replica takes at once, at most (it takes no more than it has room for).
const CLAIM_BATCH: usize = 32;

/// How often a replica deletes the counted windows (`rate_windows`) that ended long ago.
const PRUNE_EVERY: Duration = Duration::from_secs(600);

/// How long runs that were told to give their response up may take to stop, at shutdown.
const ABANDON_WAIT: Duration = Duration::from_secs(5);

/// The running duties of a replica; `shutdown` ends them.
pub struct Worker {
    engine: Engine,
    /// The store on the replica's own connections, for beats, claims and releases.
    ownership: Store,
    tasks: Vec<JoinHandle<()>>,
}

impl Worker {
    /// Registers the replica and starts its duties. It looks for work at once, so a process that starts on a
    /// store with unfinished responses resumes them.
    pub async fn start(engine: Engine) -> Result<Worker, StoreError> {
        let replica = Arc::clone(&engine.replica);
        // A beat must be able to fail once and the next still land within the lease.
        let ownership = engine.store.for_ownership(replica.lease / 3);
        let sent = tokio::time::Instant::now();
        ownership.heartbeat(&replica.id, replica.lease_ms()).await?;
        replica.lease_renewed(sent);
        if engine.store.is_embedded() {
            // The embedded store serves one process: any other that used it is gone.
            engine.store.forget_other_replicas(&replica.id).await?;
            replica.set_exclusive();
        }
        let mut tasks = vec![
            duty::spawn("beat", crate::metrics::duty_restarted, {
                let (engine, ownership) = (engine.clone(), ownership.clone());
                move || beat(engine.clone(), ownership.clone())
            }),
            duty::spawn("claim", crate::metrics::duty_restarted, {
                let (engine, ownership) = (engine.clone(), ownership.clone());
                move || claim(engine.clone(), ownership.clone())
            }),
            duty::spawn("reclaim_counts", crate::metrics::duty_restarted, {
                let engine = engine.clone();
                move || reclaim_counts(engine.clone())
            }),
            duty::spawn("deliver_webhooks", crate::metrics::duty_restarted, {
                let deliverer = engine.deliverer.clone();
                move || deliverer.clone().run()
            }),
        ];
        if let Some(listener) = engine.store.listen() {
            // A listener that panicked is opened afresh.
            let mut first = Some(listener);
            let engine = engine.clone();
            tasks.push(duty::spawn(
                "listen",
                crate::metrics::duty_restarted,
                move || {
                    let listener = first.take().or_else(|| engine.store.listen());
                    listen(engine.clone(), listener)
                },
            ));
        }
        replica.work.notify_one();
        tracing::info!(replica.id = %replica.id, "replica started");
        Ok(Worker {
            engine,
            ownership,
            tasks,
        })
    }

    /// The replica's id.
    pub fn replica_id(&self) -> &str {
        &self.engine.replica.id
    }

    /// Stops taking work, lets the runs finish within `grace`, tells the rest to give their response up, and
    /// hands every unfinished response over, so that another replica takes it at once.
    pub async fn shutdown(self, grace: Duration) {
        let replica = &self.engine.replica;
        replica.stop_accepting();
        let runs = &replica.runs;
        tracing::info!(
            running = runs.len(),
            "replica takes no new work; letting the responses running here finish"
        );
        if tokio::time::timeout(grace, runs.wait_empty())
            .await
            .is_err()
        {
            tracing::warn!(
                running = runs.len(),
                "shutdown grace over; handing the responses still running over"
            );
            runs.stop_all(Stop::Abandon);
            let _ = tokio::time::timeout(ABANDON_WAIT, runs.wait_empty()).await;
        }
        for task in &self.tasks {
            task.abort();
        }
        let store = &self.ownership;
        match store.release(&replica.id).await {
            Ok(released) => {
                tracing::info!(released, "handed the unfinished responses over");
                if released > 0 {
                    let _ = store.notify(&Notification::Work).await;
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "could not hand the unfinished responses over; they are taken when the lease expires")
            }
        }
    }
}

/// Keeps the lease: beats every third of it. A beat that finds the lease lapsed since the previous one (the
/// process was paused, or cut off from the store, for longer than a lease) first tells the runs whose response
/// another replica claimed meanwhile to give it up, and only then lets the runs act again. Each beat also
/// releases what runs gave up while the store did not answer, and heeds cancels whose notification was missed.
async fn beat(engine: Engine, ownership: Store) {
    let replica = Arc::clone(&engine.replica);
    let mut ticks = tokio::time::interval(replica.lease / 3);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // A lapse stays to be checked until a check went through: the next beat compares with this one's fresh
    // heartbeat and would find the lease kept.
    let mut lapse_unchecked = false;
    loop {
        ticks.tick().await;
        let sent = tokio::time::Instant::now();
        let beat = match ownership.heartbeat(&replica.id, replica.lease_ms()).await {
            Ok(beat) => beat,
            Err(e) => {
                tracing::warn!(error = %e, "heartbeat failed");
                continue;
            }
        };
        // The database judged the lease as it wrote the beat, but the others see the beat only once it commits:
        // an answer that comes after the lease ran out here may have committed after another replica found the
        // lease lapsed and claimed. (This replica's lease ends no later than the database's, which counts from a
        // beat written after the one this replica counts from.) So the lease is kept only if the answer came in
        // time, as well.
        let answered_in_time = replica.holds_lease();
        if !beat.lease_kept || !answered_in_time {
            tracing::warn!(replica.id = %replica.id, "this replica's lease lapsed; checking which responses are still its own");
            engine.governor.lease_lapsed();
            lapse_unchecked = true;
        }
        if lapse_unchecked {
            if let Err(e) = give_up_lost_responses(&engine, &ownership).await {
                tracing::warn!(error = %e, "could not check which responses are still this replica's");
                continue;
            }
            lapse_unchecked = false;
        }
        replica.lease_renewed(sent);
        let mut released = false;
        for (id, epoch) in replica.take_to_release() {
            match ownership.release_one(&id, &replica.id, epoch).await {
                Ok(()) => released = true,
                Err(_) => replica.release_later(&id, epoch),
            }
        }
        if released {
            replica.work.notify_one();
            let _ = ownership.notify(&Notification::Work).await;
        }
        match ownership.cancels_requested(&replica.id).await {
            Ok(ids) => {
                for id in ids {
                    replica.runs.stop(&id, Stop::Cancel);
                }
            }
            Err(e) => tracing::warn!(error = %e, "could not read cancel requests"),
        }
    }
}

/// Tells every run here whose response is now driven by another replica, or under a later claim, or has ended
/// meanwhile, to give it up.
async fn give_up_lost_responses(engine: &Engine, ownership: &Store) -> Result<(), StoreError> {
    let replica = &engine.replica;
    let running = replica.runs.epochs();
    if running.is_empty() {
        return Ok(());
    }
    let ids: Vec<String> = running.iter().map(|(id, _)| id.clone()).collect();
    let claims = ownership.claims_of(&ids).await?;
    for (id, epoch) in running {
        // A response with no row is not stored yet (or was deleted): its run's writes say the rest.
        let Some(claim) = claims.iter().find(|c| c.id == id) else {
            continue;
        };
        let still_ours = claim.running
            && claim.owner.as_deref() == Some(replica.id.as_str())
            && claim.epoch == epoch;
        if !still_ours {
            tracing::warn!(response.id = %id, "another replica took this response over while this one's lease lapsed; giving it up");
            replica.runs.stop(&id, Stop::Abandon);
        }
    }
    Ok(())
}

/// Takes what needs a replica, as much as this one has room for: every sweep interval, and at once when told a
/// response is waiting. Every sweep interval it also hands over what this replica owns but runs nowhere
/// (`hand_over_unrun`), then takes it back (or another replica does) like any other.
async fn claim(engine: Engine, ownership: Store) {
    let replica = Arc::clone(&engine.replica);
    let mut unrun = HashSet::new();
    let mut next_look = tokio::time::Instant::now();
    loop {
        tokio::select! {
            () = tokio::time::sleep(replica.sweep_interval) => {}
            () = replica.work.notified() => {}
        }
        if !replica.is_accepting() {
            continue;
        }
        if tokio::time::Instant::now() >= next_look {
            next_look = tokio::time::Instant::now() + replica.sweep_interval;
            if hand_over_unrun(&engine, &ownership, &mut unrun).await {
                let _ = ownership.notify(&Notification::Work).await;
            }
        }
        // As many as there is room for now; each takes its place when it starts. Holding places before knowing
        // whether anything waits would turn requests away for nothing.
        let room = engine.admission.available_permits().min(CLAIM_BATCH);
        if room == 0 {
            continue;
        }
        let limit = room as i64;
        let claimed = match ownership
            .claim(&replica.id, replica.lease_ms(), limit)
            .await
        {
            Ok(claimed) => claimed,
            Err(e) => {
                tracing::warn!(error = %e, "could not look for responses to take");
                continue;
            }
        };
        if claimed.len() as i64 == limit {
            // There may be more: look again at once.
            replica.work.notify_one();
        }
        for taken in claimed {
            let Ok(admitted) = Arc::clone(&engine.admission).try_acquire_owned() else {
                // Requests took the room meanwhile: give it back for another replica (or this one, later).
                if let Err(e) = ownership
                    .release_one(&taken.id, &replica.id, taken.epoch)
                    .await
                {
                    tracing::warn!(response.id = %taken.id, error = %e, "could not give a response back");
                    replica.release_later(&taken.id, taken.epoch);
                }
                continue;
            };
            // Registered here, before anything else is awaited: a response this replica owns is then always either
            // registered or truly run nowhere (see `hand_over_unrun`).
            let Some(registration) = replica.runs.register(&taken.id, taken.epoch) else {
                continue; // it runs here already, under this claim
            };
            let engine = engine.clone();
            tokio::spawn(async move {
                let (id, epoch) = (taken.id.clone(), taken.epoch);
                if let Err(e) = engine.resume(taken, admitted, registration).await {
                    tracing::warn!(response.id = %id, error = %e, "could not resume a response; releasing it");
                    engine.replica.release_later(&id, epoch);
                }
            });
        }
    }
}

/// Gives the `max_concurrent` places of replicas that stopped beating back to their counts (SPEC 13), every sweep
/// interval, and deletes counted windows that ended long ago and the sign-outs of console sessions that expired,
/// every ten minutes. A duty of its own, on the
/// requests' pool: a full pool or a silent connection delays these, never the claims of dead replicas'
/// responses.
async fn reclaim_counts(engine: Engine) {
    let replica = Arc::clone(&engine.replica);
    let mut next_prune = tokio::time::Instant::now();
    // The first pass at once: a replica that starts after others died takes their places back before it waits.
    let mut first = true;
    loop {
        if !std::mem::take(&mut first) {
            tokio::time::sleep(replica.sweep_interval).await;
        }
        if let Err(e) = engine.governor.reclaim_running(replica.lease_ms()).await {
            tracing::warn!(error = %e, "could not take back the running places of stopped replicas");
        }
        if tokio::time::Instant::now() >= next_prune {
            next_prune = tokio::time::Instant::now() + PRUNE_EVERY;
            match engine.governor.prune_windows().await {
                Ok(0) => {}
                Ok(pruned) => {
                    tracing::debug!(pruned, "deleted counted windows that ended long ago")
                }
                Err(e) => {
                    tracing::warn!(error = %e, "could not delete the counted windows that ended long ago")
                }
            }
            // An hour late, so that a replica whose clock runs behind this one's never takes a session that
            // expired here but not yet there.
            let expired_before = crate::clock::now() - 3600;
            if let Err(e) = engine.store.prune_console_sign_outs(expired_before).await {
                tracing::warn!(error = %e, "could not forget the sign-outs of expired console sessions");
            }
        }
    }
}

/// Hands over the running responses this replica owns but runs nowhere here, so that a replica (maybe this one)
/// resumes them: the row of a create whose request went away while its first write was queued (the write lands
/// all the same), of a run that panicked, of a resume that failed. Nothing else would: the other replicas see it
/// owned by a live replica, and this one only watches the runs it knows. Answers whether it handed any over.
///
/// A run is registered before its row is written (a create) or, on this task, right after its claim (a
/// takeover), and the registry is read after the rows: a row read here whose run is not registered has no run
/// about to start. As a margin against a path that writes first, a response is handed over only when two looks
/// in a row, a sweep interval apart, found it so under the same claim (`unrun` holds what the last look found);
/// the release is fenced on that claim.
async fn hand_over_unrun(
    engine: &Engine,
    ownership: &Store,
    unrun: &mut HashSet<(String, i64)>,
) -> bool {
    let replica = &engine.replica;
    let owned = match ownership.owned_by(&replica.id).await {
        Ok(owned) => owned,
        Err(e) => {
            tracing::warn!(error = %e, "could not read which responses this replica owns");
            return false;
        }
    };
    let running: HashMap<String, i64> = replica.runs.epochs().into_iter().collect();
    let found: HashSet<(String, i64)> = owned
        .into_iter()
        .filter(|(id, epoch)| running.get(id).is_none_or(|running| running < epoch))
        .collect();
    let mut handed_over = false;
    for (id, epoch) in found.intersection(unrun) {
        tracing::warn!(response.id = %id, "a response this replica owns runs nowhere here; handing it over");
        match ownership.release_one(id, &replica.id, *epoch).await {
            Ok(()) => handed_over = true,
            // The next look finds it again.
            Err(e) => {
                tracing::warn!(response.id = %id, error = %e, "could not hand a response over")
            }
        }
    }
    *unrun = found;
    handed_over
}

/// Hears the other replicas: progress for followers, cancels, work waiting, admin changes.
async fn listen(engine: Engine, listener: Option<Listener>) {
    let Some(mut listener) = listener else {
        return;
    };
    loop {
        let notification = listener.next().await;
        engine.hear(&notification);
    }
}

impl Engine {
    /// Acts on a notification, from another replica or from this one.
    pub(super) fn hear(&self, notification: &Notification) {
        match notification {
            Notification::Progress(id) => self.replica.progressed(id),
            Notification::Cancel(id) => {
                self.replica.runs.stop(id, Stop::Cancel);
            }
            Notification::Work => self.replica.work.notify_one(),
            Notification::Tenancy => self.resolver.invalidate(),
            Notification::Follow(id) => self.replica.runs.mark_followed(id),
        }
    }

    /// Says that somebody on this replica waits for response `id`'s progress: the replica that runs it (if
    /// another) notifies each of its step writes for a while. Waiters say it again as they wait.
    pub async fn follow(&self, id: &str) {
        // Followers of one response here share one notification a while (SPEC 9: many followers must not load
        // the store).
        if self.replica.runs.follow(id).is_none()
            && self
                .replica
                .should_tell_following(id, super::runs::FOLLOWED_FOR / 5)
        {
            self.tell_all(Notification::Follow(id.to_owned())).await;
        }
    }

    /// Tells this replica and every other one: acted on here at once, and sent to the others through the store.
    pub async fn tell_all(&self, notification: Notification) {
        self.hear(&notification);
        if let Err(e) = self.store.notify(&notification).await {
            tracing::warn!(error = %e, channel = notification.channel(), "could not notify the other replicas");
        }
    }
}
