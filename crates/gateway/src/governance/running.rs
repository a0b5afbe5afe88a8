//! A response's places among those running under `max_concurrent` limits: taken at admission, given back when
//! the place is dropped (the run ended, or the create failed before it ran). What the store counts for this
//! replica is kept true by [`Places`]: a take whose answer was lost (taken or not?) or a give-back the store did
//! not get leaves its count in doubt, and the replica then writes its part of that count afresh, from the places
//! it holds, until the store takes it.

use foldhash::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::store::{Store, StoreError};

/// How long a replica waits before it writes a count in doubt again, at least.
const MIN_RECONCILE: Duration = Duration::from_millis(200);

/// This replica's places, per count: how many it holds now, how many takes and give-backs are on their way to
/// the store, and whether the store's part may differ.
#[derive(Debug, Default)]
struct Part {
    held: u64,
    pending: u64,
    in_doubt: bool,
    /// Takes and give-backs started, ever: a rewrite of the part clears the doubt only if none started while it
    /// was on its way (one could have landed before it, and another after).
    moves: u64,
}

/// The places this replica holds in each `max_concurrent` count; cheap to clone (once per governed create).
#[derive(Debug, Clone)]
pub(super) struct Places {
    store: Store,
    replica_id: Arc<str>,
    parts: Arc<Mutex<HashMap<String, Part>>>,
}

impl Places {
    /// The places of `replica_id`, with a task that writes the counts in doubt every `every` (at least
    /// `MIN_RECONCILE`) until the store takes them.
    pub(super) fn start(store: Store, replica_id: String, every: Duration) -> Places {
        let places = Places {
            store,
            replica_id: replica_id.into(),
            parts: Arc::default(),
        };
        let reconciler = places.clone();
        crate::duty::spawn(
            "reconcile_running",
            crate::metrics::duty_restarted,
            move || {
                let reconciler = reconciler.clone();
                async move {
                    let mut tick = tokio::time::interval(every.max(MIN_RECONCILE));
                    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                    loop {
                        tick.tick().await;
                        reconciler.reconcile().await;
                    }
                }
            },
        );
        places
    }

    fn with<T>(&self, count: &str, f: impl FnOnce(&mut Part) -> T) -> T {
        let mut parts = self.parts.lock().unwrap_or_else(|e| e.into_inner());
        match parts.get_mut(count) {
            Some(part) => f(part),
            None => f(parts.entry(count.to_owned()).or_default()),
        }
    }

    /// Writes this replica's part of every count in doubt as the places it holds say.
    async fn reconcile(&self) {
        let doubtful: Vec<(String, u64, u64)> = {
            let parts = self.parts.lock().unwrap_or_else(|e| e.into_inner());
            parts
                .iter()
                // A take or give-back on its way would land after the part written and undo it: wait for it.
                .filter(|(_, part)| part.in_doubt && part.pending == 0)
                .map(|(count, part)| (count.clone(), part.held, part.moves))
                .collect()
        };
        for (count, held, moves) in doubtful {
            match self
                .store
                .set_running_part(&count, &self.replica_id, held)
                .await
            {
                // A take or give-back that started meanwhile may have landed before or after the part written (a
                // take before it and a give-back after leave the books as they were, and the store one low): the
                // count stays in doubt, and is written again, unless nothing moved.
                Ok(()) => self.with(&count, |part| {
                    if part.moves == moves {
                        part.in_doubt = false;
                    }
                }),
                Err(e) => {
                    tracing::debug!(count = %count, error = %e, "could not write a running count yet")
                }
            }
        }
    }

    /// Leaves in doubt every count this replica holds places in: its lease lapsed, so another replica may have
    /// taken its parts back from the counts (as a dead replica's) while its runs went on. Written afresh from the
    /// places held, the counts again say what runs.
    pub(super) fn doubt_held(&self) {
        let mut parts = self.parts.lock().unwrap_or_else(|e| e.into_inner());
        for part in parts.values_mut() {
            if part.held > 0 {
                part.in_doubt = true;
            }
        }
    }

    /// A place of this replica's, none taken yet.
    pub(super) fn place(&self) -> RunningPlace {
        RunningPlace {
            places: self.clone(),
            counts: Vec::new(),
        }
    }
}

/// The `max_concurrent` counts a response holds a place in.
#[derive(Debug)]
pub struct RunningPlace {
    places: Places,
    counts: Vec<String>,
}

impl RunningPlace {
    /// Takes a place in `count` if fewer than `limit` run: `false` when it is full (places taken so far are
    /// given back when this is dropped). A store that did not answer may have taken it: the count is then in
    /// doubt until this replica writes its part again.
    ///
    /// The store's answer is awaited on a task of its own, which keeps the books and hands a place taken over as
    /// a place of its own: a caller dropped meanwhile (its client went away during admission) drops that place
    /// with the answer, which gives it back, instead of leaving it taken and its take pending for ever.
    pub(super) async fn take(&mut self, count: String, limit: u64) -> Result<bool, StoreError> {
        let places = self.places.clone();
        places.with(&count, |part| {
            part.pending += 1;
            part.moves += 1;
        });
        let (answer, answered) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            let taken = places
                .store
                .acquire_running(&count, &places.replica_id, limit)
                .await;
            places.with(&count, |part| {
                part.pending -= 1;
                match taken {
                    Ok(true) => part.held += 1,
                    Ok(false) => {}
                    Err(_) => part.in_doubt = true,
                }
            });
            let place = taken.map(|taken| {
                taken.then(|| RunningPlace {
                    places,
                    counts: vec![count],
                })
            });
            // Refused only when the caller is gone: the place dropped with the answer is given back.
            let _ = answer.send(place);
        });
        match answered.await {
            Ok(Ok(Some(mut place))) => {
                self.counts.append(&mut place.counts);
                Ok(true)
            }
            Ok(Ok(None)) => Ok(false),
            Ok(Err(e)) => Err(e),
            // The task ended without an answer: the runtime is shutting down.
            Err(_) => Err(StoreError::Busy),
        }
    }

    pub(super) fn holds_any(&self) -> bool {
        !self.counts.is_empty()
    }
}

impl RunningPlace {
    /// Gives the places back and waits for the store to have them, so that whatever follows (a client told its
    /// response ended or was left queued, who then creates another) finds them free. The give-back runs on a task
    /// of its own, as a drop's does: a caller dropped meanwhile leaves it to land all the same.
    pub async fn give_back(mut self) {
        if let Some(given) = self.start_give_back() {
            // A give-back the store did not get leaves the count in doubt (written again); a task that did not
            // end (the runtime is shutting down) leaves nothing to wait for.
            let _ = given.await;
        }
    }

    /// Starts giving the places back: the books say so at once, the store once the task has written it.
    fn start_give_back(&mut self) -> Option<tokio::task::JoinHandle<()>> {
        if self.counts.is_empty() {
            return None;
        }
        let counts = std::mem::take(&mut self.counts);
        let runtime = tokio::runtime::Handle::try_current().ok()?;
        for count in &counts {
            self.places.with(count, |part| {
                part.held = part.held.saturating_sub(1);
                part.pending += 1;
                part.moves += 1;
            });
        }
        let places = self.places.clone();
        Some(runtime.spawn(async move {
            for count in counts {
                let given = places
                    .store
                    .release_running(&count, &places.replica_id)
                    .await;
                if let Err(e) = &given {
                    // Written again, from the places held, once the store answers.
                    tracing::warn!(count = %count, error = %e, "could not give back a running place; its count will be written again");
                }
                places.with(&count, |part| {
                    part.pending -= 1;
                    part.in_doubt |= given.is_err();
                });
            }
        }))
    }
}

impl Drop for RunningPlace {
    fn drop(&mut self) {
        // Dropped without waiting: the give-back lands on its own task.
        drop(self.start_give_back());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Backend;
    use gateway_testkit::scratch::{until_statements_wait_on_a_lock, ScratchDatabase};

    const COUNT: &str = "key:k:running";

    /// The count's places taken, as the store has them: (all replicas', this replica's).
    async fn taken(pool: &sqlx::PgPool) -> (i64, i64) {
        sqlx::query_as(
            "SELECT (SELECT used FROM rate_windows WHERE scope = $1 AND window_start = 0),
                    COALESCE((SELECT running FROM running_counts WHERE scope = $1 AND replica_id = 'replica_a'), 0)",
        )
        .bind(COUNT)
        .fetch_one(pool)
        .await
        .expect("count")
    }

    /// This replica's books of the count: (places held, takes and give-backs on their way to the store).
    fn books(places: &Places) -> (u64, u64) {
        places.with(COUNT, |part| (part.held, part.pending))
    }

    /// Polls until nothing is on its way to the store and the count's places are `expected` in the books and in
    /// the store, failing after about ten seconds.
    async fn until_settled(places: &Places, pool: &sqlx::PgPool, expected: (i64, i64)) {
        let held = u64::try_from(expected.1).expect("places");
        let mut now = (books(places), taken(pool).await);
        for _ in 0..500 {
            if now == ((held, 0), expected) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
            now = (books(places), taken(pool).await);
        }
        assert_eq!(
            now,
            ((held, 0), expected),
            "(held, pending) in the books, (all, this replica's) in the store"
        );
    }

    /// A transaction of another session that holds the count's row, as a statement under way would.
    async fn hold_the_count(pool: &sqlx::PgPool) -> sqlx::Transaction<'static, sqlx::Postgres> {
        let mut holder = pool.begin().await.expect("begin");
        sqlx::query("SELECT 1 FROM rate_windows WHERE scope = $1 AND window_start = 0 FOR UPDATE")
            .bind(COUNT)
            .execute(&mut *holder)
            .await
            .expect("hold the count");
        holder
    }

    /// A fresh Postgres store and the places of `replica_a` on it (whose reconciler stays idle).
    async fn replica_a() -> (ScratchDatabase, Store, sqlx::PgPool, Places) {
        let db = ScratchDatabase::postgres().await.expect("database");
        let store = Store::connect(db.url(), 4).await.expect("store");
        store.migrate().await.expect("migrate");
        let Backend::Postgres(pool) = store.backend().clone() else {
            unreachable!("Postgres")
        };
        let places = Places::start(store.clone(), "replica_a".into(), Duration::from_secs(3600));
        (db, store, pool, places)
    }

    #[tokio::test]
    async fn a_take_whose_caller_went_away_while_the_store_answered_gives_its_place_back() {
        // A take left pending for ever would hang the test rather than fail it: a minute is far beyond need.
        tokio::time::timeout(Duration::from_secs(60), a_take_whose_caller_went_away())
            .await
            .expect("the take settled within a minute");
    }

    async fn a_take_whose_caller_went_away() {
        let (_db, _store, pool, places) = replica_a().await;
        // The count's row, made by a take given back.
        let mut first = places.place();
        assert!(first.take(COUNT.into(), 1).await.expect("taken"));
        drop(first);
        until_settled(&places, &pool, (0, 0)).await;

        // A take that waits for the store (another transaction holds the count) is dropped, as a create's
        // admission is when its client goes away; then the store takes the place.
        let holder = hold_the_count(&pool).await;
        let mut place = places.place();
        {
            let take = place.take(COUNT.into(), 1);
            tokio::pin!(take);
            assert!(futures::poll!(&mut take).is_pending());
            until_statements_wait_on_a_lock(&pool, 1)
                .await
                .expect("activity");
        }
        drop(place);
        holder.rollback().await.expect("rollback");

        // Taken by the store after its caller left, and given back: the count has room again.
        until_settled(&places, &pool, (0, 0)).await;
        let mut again = places.place();
        assert!(again.take(COUNT.into(), 1).await.expect("taken"));
        assert_eq!(taken(&pool).await, (1, 1));
    }

    #[tokio::test]
    async fn a_rewrite_that_a_take_and_a_give_back_went_around_leaves_the_count_in_doubt() {
        tokio::time::timeout(Duration::from_secs(60), a_rewrite_gone_around())
            .await
            .expect("the rewrite settled within a minute");
    }

    async fn a_rewrite_gone_around() {
        let (_db, _store, pool, places) = replica_a().await;
        let mut place = places.place();
        assert!(place.take(COUNT.into(), 5).await.expect("taken"));
        places.doubt_held();

        // The rewrite of this replica's part waits for the count, which another transaction holds.
        let holder = hold_the_count(&pool).await;
        let reconciling = tokio::spawn({
            let places = places.clone();
            async move { places.reconcile().await }
        });
        until_statements_wait_on_a_lock(&pool, 1)
            .await
            .expect("activity");
        // Meanwhile a take starts and ends, and a give-back: the books hold what they held before, but whether
        // each landed before or after the rewrite, nobody here knows.
        places.with(COUNT, |part| {
            part.pending += 1;
            part.moves += 1;
        });
        places.with(COUNT, |part| {
            part.pending -= 1;
            part.held += 1;
        });
        places.with(COUNT, |part| {
            part.held -= 1;
            part.pending += 1;
            part.moves += 1;
        });
        places.with(COUNT, |part| part.pending -= 1);
        holder.rollback().await.expect("rollback");
        reconciling.await.expect("reconciled");

        assert!(
            places.with(COUNT, |part| part.in_doubt),
            "the count must be written again"
        );
        drop(place);
        until_settled(&places, &pool, (0, 0)).await;
    }

    #[tokio::test]
    async fn places_taken_back_while_this_replica_was_cut_off_are_counted_again_once_doubted() {
        let (_db, store, pool, places) = replica_a().await;
        let mut place = places.place();
        assert!(place.take(COUNT.into(), 5).await.expect("taken"));
        // Its lease lapsed: another replica took its part back, as a dead replica's (this one never beat).
        assert_eq!(store.reclaim_running(1).await.expect("reclaimed"), 1);
        assert_eq!(taken(&pool).await, (0, 0));

        places.doubt_held();
        places.reconcile().await;
        assert_eq!(
            taken(&pool).await,
            (1, 1),
            "the place still held is counted again"
        );
        drop(place);
        until_settled(&places, &pool, (0, 0)).await;
    }
}
