//! The shared counts of `rpm`, `tpm` and budgets, kept per replica between trips to the store: requests are taken
//! from slices leased from a shared minute that never passes its limit; tokens (per minute) and spend (per budget
//! period, in nano-dollars) are added to a shared window and the other replicas' read back, at most every `sync`,
//! each part once: it goes under a token, and a part whose write failed is sent again under the same one.

use foldhash::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot, Notify};

use gateway_core::governance::{window_start, Standing, WINDOW_SECS};

use crate::duty;
use crate::store::governance::{addition_token, WindowAddition};
use crate::store::{Store, StoreError};

/// The requests of a window leased at once to begin with: a twentieth of the limit, between 1 and 100.
fn slice(limit: u64) -> u64 {
    (limit / 20).clamp(1, 100)
}

/// A replica that asks for its next slice within this long of the last one's grant takes requests faster than
/// slices of that size serve: the next is twice as large (up to a twentieth of the limit), so that leases come
/// at most about this often however fast requests come, rather than one trip per 100 requests.
const QUICK_LEASE: Duration = Duration::from_millis(100);

/// The size of the next slice of a window whose last slice was `last` (0 before the first) and granted at
/// `granted_at`, asked for at `now`: twice the last when it was granted within [`QUICK_LEASE`], up to a twentieth
/// of the limit; otherwise the first size again.
fn next_slice(limit: u64, last: u64, granted_at: Option<Instant>, now: Instant) -> u64 {
    let first = slice(limit);
    let quick = granted_at.is_some_and(|at| now.saturating_duration_since(at) < QUICK_LEASE);
    if quick {
        last.saturating_mul(2).clamp(first, (limit / 20).max(first))
    } else {
        first
    }
}

/// The tokens of a window that matter at once: counted here, they are added to the shared window without waiting
/// for `sync`; within them of the limit, every admission reads the shared window afresh. A twentieth of the limit.
fn token_slice(limit: u64) -> u64 {
    (limit / 20).max(1)
}

/// What a request does next with the requests this replica holds of a window.
enum Take {
    /// One was taken: its standing, and whether the next slice should be leased ahead now.
    Taken(Standing, bool),
    /// None is left here and the window is full.
    Refused(Standing),
    /// None is left here and a lease is on its way: wait for it (the window's leases ended so far, to tell
    /// whether it failed).
    Wait(tokio::sync::futures::OwnedNotified, u64),
    /// None is left here: lease a slice.
    Lease,
    /// The lease waited for failed.
    Failed,
}

/// The standing of a `limit` of requests as `window` knows it at `now`.
fn standing(window: &Window, limit: u64, now: i64) -> Standing {
    Standing {
        limit,
        remaining: limit.saturating_sub(window.shared) + (window.leased - window.taken),
        reset_secs: reset_secs(now),
    }
}

/// What a task of the counters answered: a panic goes on as a panic; a task cancelled because the runtime is
/// shutting down answers as a busy store.
async fn joined<T>(task: tokio::task::JoinHandle<T>) -> Result<T, StoreError> {
    match task.await {
        Ok(answer) => Ok(answer),
        Err(e) => match e.try_into_panic() {
            Ok(panic) => std::panic::resume_unwind(panic),
            Err(_) => Err(StoreError::Busy),
        },
    }
}

/// Whether a shared count is read before it is used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Read {
    /// Before the count is used: it was never read, the last read is `sync` old, or it is within a slice of
    /// its limit.
    Wait,
    /// Beside: the last read is half of `sync` old, and the next use should find a fresh one.
    Ahead,
}

/// Whether a count `used` of `limit`, last read `age` ago (`None`: never), is read again, and how.
fn read_due(age: Option<Duration>, used: u64, limit: u64, sync: Duration) -> Option<Read> {
    let near_limit = limit.saturating_sub(used) < token_slice(limit);
    match age {
        _ if near_limit => Some(Read::Wait),
        None => Some(Read::Wait),
        Some(age) if age >= sync => Some(Read::Wait),
        Some(age) if age >= sync / 2 => Some(Read::Ahead),
        Some(_) => None,
    }
}

/// What this replica knows of one window of one counter.
#[derive(Debug, Default)]
struct Window {
    start: i64,
    /// Requests leased from the shared window, and taken of those.
    leased: u64,
    taken: u64,
    /// The size of the last slice granted (see [`next_slice`]), when it was granted, and the limit it was
    /// asked for under: a limit lowered since lets go of what is left of it.
    slice: u64,
    granted_at: Option<Instant>,
    leased_under: u64,
    /// Leases ended (granted or failed), and which of them last failed (0: none): a request that waited for a
    /// lease that failed answers with the failure rather than asking the store again itself, so that requests
    /// waiting together on a store that does not answer fail together, not one timeout after another.
    leases_ended: u64,
    failed_lease: u64,
    /// The shared window's count as last read (every replica's leases or tokens).
    shared: u64,
    /// Tokens counted here and not yet added to the shared window.
    unsynced: u64,
    /// Tokens on their way to the shared window: counted here until the write that adds them answers.
    syncing: u64,
    /// Parts whose write failed (each may have been added, or not), with the token each was sent under: counted
    /// here, and sent again under their tokens, which the store adds once, before anything else is.
    in_doubt: Vec<Part>,
    /// The parts in doubt are being sent again.
    resending: bool,
    /// A task sends the parts in doubt again until they are settled (`Counters::settle_in_doubt`).
    settling: bool,
    synced_at: Option<Instant>,
    /// A write of the unsynced part is scheduled.
    flushing: bool,
    /// A read of the shared window is on its way.
    reading: bool,
    /// A lease of requests is on its way.
    leasing: bool,
}

impl Window {
    /// Whether nothing of this window is on its way to or from the store, or owed to it: letting it go loses
    /// nothing the store does not hold.
    fn idle(&self) -> bool {
        self.unsynced == 0
            && self.syncing == 0
            && self.in_doubt.is_empty()
            && !self.resending
            && !self.settling
            && !self.flushing
            && !self.reading
            && !self.leasing
    }

    /// What the window holds as this replica knows it: the shared count as last read, and its own part not yet
    /// known to be in it.
    fn used(&self) -> u64 {
        let in_doubt = self
            .in_doubt
            .iter()
            .fold(0u64, |sum, part| sum.saturating_add(part.amount));
        self.shared
            .saturating_add(self.unsynced)
            .saturating_add(self.syncing)
            .saturating_add(in_doubt)
    }

    fn at(&mut self, start: i64) -> &mut Window {
        if self.start != start {
            *self = Window {
                start,
                ..Window::default()
            };
        }
        self
    }
}

/// Seconds from `now` until the window that holds it ends.
fn reset_secs(now: i64) -> u64 {
    (window_start(now) + WINDOW_SECS - now) as u64
}

/// What this replica knows of one counter's window, shared by every handle of the counter.
type SharedWindow = Arc<Mutex<Window>>;

/// One counter: its name in the store, and what this replica knows of its window. Got once per name from
/// [`Counters::counter`] and kept by whoever counts with it, so that counting looks nothing up.
#[derive(Debug, Clone)]
pub(super) struct Counter {
    name: Arc<str>,
    window: SharedWindow,
}

/// The windows of the counters this replica has used, by name; those nobody holds any more are let go as it grows.
struct WindowBook {
    windows: HashMap<Arc<str>, SharedWindow>,
    /// How many windows the book holds before it lets go of those nobody holds.
    prune_at: usize,
}

/// The fewest windows a book holds before it looks for some to let go.
const MIN_PRUNE_AT: usize = 1024;

impl Default for WindowBook {
    fn default() -> WindowBook {
        WindowBook {
            windows: HashMap::default(),
            prune_at: MIN_PRUNE_AT,
        }
    }
}

impl WindowBook {
    /// Lets go of every window that no counter holds and that owes the shared window nothing, and sets the size
    /// of the next look at twice what is left, so that looking costs a constant share of the names added.
    /// Nothing is lost: a window let go is read or leased afresh from the store when its name is used again (a
    /// slice leased and not used is lost for its window, as it is at the turn of the minute).
    fn prune(&mut self) {
        self.windows.retain(|_, window| {
            // Only the book holds it, and the book is locked: nobody can take it while it is looked at.
            Arc::strong_count(window) > 1
                || !window.lock().unwrap_or_else(|e| e.into_inner()).idle()
        });
        self.prune_at = (self.windows.len() * 2).max(MIN_PRUNE_AT);
    }
}

/// Every counter this replica has used, by name.
#[derive(Clone)]
pub(super) struct Counters {
    store: Store,
    sync: Duration,
    windows: Arc<Mutex<WindowBook>>,
    /// Told whenever a lease of requests answered (or failed).
    leased: Arc<Notify>,
    /// The writer of additions to shared windows, started with the first one.
    additions: Arc<OnceLock<mpsc::UnboundedSender<Addition>>>,
}

/// A part of one replica's count of a window, as it is sent to the shared window.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Part {
    /// What makes the part count once however often it is sent (none for a read, which adds nothing).
    token: Option<String>,
    amount: u64,
}

impl Part {
    /// Adds nothing: the shared window's total is read.
    const READ: Part = Part {
        token: None,
        amount: 0,
    };
}

/// A part of a count on its way to its shared window, and who waits for the window's total.
struct Addition {
    /// What makes the part count once however often it is sent (none for a read, which adds nothing).
    token: Option<String>,
    name: Arc<str>,
    start: i64,
    amount: u64,
    answer: oneshot::Sender<Result<u64, StoreError>>,
}

/// The most additions written in one statement.
const MAX_ADDITIONS: usize = 256;

/// Writes the additions to shared windows one statement at a time: each statement takes every addition handed in
/// while the last one ran (a request's counters come due together: its key's and its project's tokens and spend),
/// and answers each with its window's total. Ends when the counters are gone.
async fn write_additions(store: Store, pending: &mut mpsc::UnboundedReceiver<Addition>) {
    let mut batch = Vec::new();
    while pending.recv_many(&mut batch, MAX_ADDITIONS).await > 0 {
        let rows: Vec<WindowAddition<'_>> = batch
            .iter()
            .map(|addition| WindowAddition {
                token: addition.token.as_deref(),
                scope: &addition.name,
                window_start: addition.start,
                amount: addition.amount,
            })
            .collect();
        let written = store.add_to_windows(&rows).await;
        drop(rows);
        match written {
            Ok(totals) => {
                for (addition, total) in batch.drain(..).zip(totals) {
                    let _ = addition.answer.send(Ok(total));
                }
            }
            Err(e) => {
                // The first addition gets the error itself; the others, which an error cannot be cloned for, its
                // kind (a busy store) or its text.
                let busy = matches!(e, StoreError::Busy);
                let message = e.to_string();
                let mut error = Some(e);
                for addition in batch.drain(..) {
                    let error = error.take().unwrap_or_else(|| {
                        if busy {
                            StoreError::Busy
                        } else {
                            StoreError::Database(sqlx::Error::Protocol(message.clone()))
                        }
                    });
                    let _ = addition.answer.send(Err(error));
                }
            }
        }
    }
}

impl Counters {
    pub(super) fn new(store: Store, sync: Duration) -> Counters {
        Counters {
            store,
            sync,
            windows: Arc::default(),
            leased: Arc::default(),
            additions: Arc::default(),
        }
    }

    /// Adds each of `parts` to the shared window of `name` that starts at `start`, in the next statement of the
    /// writer of additions (one part in one statement, the next in another, when a batch splits them), each once
    /// per token, and answers each part with what the window held then.
    async fn add_to_shared(
        &self,
        name: &Arc<str>,
        start: i64,
        parts: Vec<Part>,
    ) -> Vec<(Part, Result<u64, StoreError>)> {
        let additions = self.additions.get_or_init(|| {
            let (sender, receiver) = mpsc::unbounded_channel();
            let (store, queue) = (self.store.clone(), duty::Queue::new(receiver));
            duty::spawn(
                "counter_additions",
                crate::metrics::duty_restarted,
                move || {
                    let (store, queue) = (store.clone(), queue.clone());
                    async move { write_additions(store, &mut *queue.take().await).await }
                },
            );
            sender
        });
        let mut answers = Vec::with_capacity(parts.len());
        for part in parts {
            let (answer, total) = oneshot::channel();
            let addition = Addition {
                token: part.token.clone(),
                name: Arc::clone(name),
                start,
                amount: part.amount,
                answer,
            };
            let total = additions.send(addition).is_ok().then_some(total);
            answers.push((part, total));
        }
        let mut added = Vec::with_capacity(answers.len());
        for (part, total) in answers {
            // A writer gone, or stopped by the runtime's shutdown (it drops the answer): the store is as good as
            // busy.
            let total = match total {
                Some(total) => total.await.unwrap_or(Err(StoreError::Busy)),
                None => Err(StoreError::Busy),
            };
            added.push((part, total));
        }
        added
    }

    /// The counter `name`: the same window for every caller that names it.
    pub(super) fn counter(&self, name: String) -> Counter {
        let mut book = self.windows.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((name, window)) = book.windows.get_key_value(name.as_str()) {
            return Counter {
                name: Arc::clone(name),
                window: Arc::clone(window),
            };
        }
        if book.windows.len() >= book.prune_at {
            book.prune();
        }
        let counter = Counter {
            name: Arc::from(name),
            window: Arc::default(),
        };
        book.windows
            .insert(Arc::clone(&counter.name), Arc::clone(&counter.window));
        counter
    }

    /// Runs `f` on the counter's window that starts at `start`. A window older than the one the counter is at
    /// (a trip to the store that began before the minute turned) is a throwaway: its results no longer count.
    fn with<T>(&self, counter: &Counter, start: i64, f: impl FnOnce(&mut Window) -> T) -> T {
        let mut window = counter.window.lock().unwrap_or_else(|e| e.into_inner());
        if window.start > start {
            return f(&mut Window {
                start,
                ..Window::default()
            });
        }
        f(window.at(start))
    }

    /// Counts one request against `limit` in the window of `now`: its standing after it, or (as `Err`) the
    /// standing that refuses it. A request waits on the store only when this replica's slice is used up and no
    /// lease is on its way yet to be answered: the next slice is leased ahead, in one trip at a time, while a
    /// quarter of the last one is left.
    pub(super) async fn request(
        &self,
        counter: &Counter,
        limit: u64,
        now: i64,
    ) -> Result<Result<Standing, Standing>, StoreError> {
        let start = window_start(now);
        // The leases this request found ended when it began to wait for one.
        let mut waited: Option<u64> = None;
        loop {
            let next = self.with(counter, start, |window| {
                if waited.is_some_and(|ended| window.failed_lease > ended) {
                    return Take::Failed;
                }
                // A limit lowered within the minute: what is left of slices leased under the higher one is not
                // this replica's to give any more (it stays counted in the shared window).
                if limit < window.leased_under {
                    window.leased = window.taken;
                    window.leased_under = limit;
                }
                if window.taken < window.leased {
                    window.taken += 1;
                    let ahead = window.slice.max(slice(limit)) / 4;
                    let lease_ahead = ahead > 0
                        && window.leased - window.taken <= ahead
                        && window.shared < limit
                        && !std::mem::replace(&mut window.leasing, true);
                    return Take::Taken(standing(window, limit, now), lease_ahead);
                }
                // The shared window never goes down within its minute: once it holds the limit, nothing more
                // is granted, and the store need not be asked again.
                if window.shared >= limit {
                    return Take::Refused(standing(window, limit, now));
                }
                if window.leasing {
                    return Take::Wait(
                        Arc::clone(&self.leased).notified_owned(),
                        window.leases_ended,
                    );
                }
                window.leasing = true;
                Take::Lease
            });
            match next {
                Take::Taken(standing, lease_ahead) => {
                    if lease_ahead {
                        let lease = self.spawn_lease(counter, start, limit, now, false);
                        let name = Arc::clone(&counter.name);
                        tokio::spawn(async move {
                            if let Ok(Err(e)) = lease.await {
                                tracing::warn!(counter = %name, error = %e, "could not lease requests ahead");
                            }
                        });
                    }
                    return Ok(Ok(standing));
                }
                Take::Refused(standing) => return Ok(Err(standing)),
                // The lease waited for failed: the store did not answer it in time, or at all.
                Take::Failed => return Err(StoreError::Busy),
                Take::Wait(leased, ended) => {
                    leased.await;
                    waited = Some(ended);
                }
                Take::Lease => {
                    if let Some(taken) =
                        joined(self.spawn_lease(counter, start, limit, now, true)).await??
                    {
                        return Ok(taken);
                    }
                }
            }
        }
    }

    /// Leases a slice of the window that starts at `start` in a task of its own, so that a request dropped while
    /// it waits leaves neither the lease nor its `leasing` mark behind; wakes whoever waits for it. With `take`, one
    /// request of the slice is taken for the caller in the same step, and its standing returned: `Ok(Err(_))` when
    /// nothing was granted.
    fn spawn_lease(
        &self,
        counter: &Counter,
        start: i64,
        limit: u64,
        now: i64,
        take: bool,
    ) -> tokio::task::JoinHandle<Result<Option<Result<Standing, Standing>>, StoreError>> {
        let counters = self.clone();
        let counter = counter.clone();
        tokio::spawn(async move {
            let size = counters.with(&counter, start, |window| {
                next_slice(limit, window.slice, window.granted_at, Instant::now())
            });
            let lease = counters
                .store
                .lease_window(&counter.name, start, size, limit)
                .await;
            let taken = counters.with(&counter, start, |window| {
                window.leasing = false;
                window.leases_ended += 1;
                let Ok(lease) = &lease else {
                    window.failed_lease = window.leases_ended;
                    return None;
                };
                // Only a granted slice sizes the next: failures in a row do not grow it.
                window.slice = size;
                window.leased_under = limit;
                window.granted_at = Some(Instant::now());
                window.leased += lease.granted;
                window.shared = window.shared.max(lease.used.min(limit));
                if !take {
                    return None;
                }
                if window.taken >= window.leased {
                    return Some(Err(standing(window, limit, now)));
                }
                window.taken += 1;
                Some(Ok(standing(window, limit, now)))
            });
            counters.leased.notify_waiters();
            lease.map(|_| taken)
        })
    }

    /// The standing of `limit` tokens in the minute of `now` (see [`Counters::total`]; `at` is the same moment on
    /// this process's monotonic clock).
    pub(super) async fn tokens(
        &self,
        counter: &Counter,
        limit: u64,
        now: i64,
        at: Instant,
    ) -> Result<Standing, StoreError> {
        let used = self.total(counter, window_start(now), limit, at).await?;
        Ok(Standing {
            limit,
            remaining: limit.saturating_sub(used),
            reset_secs: reset_secs(now),
        })
    }

    /// What `counter` holds in the window that starts at `start`, every replica's part included, never
    /// older than `sync`: read from the shared window when the last read is older than `sync`, when the count is
    /// within a slice of `limit`, or when it was never read (this replica's unsynced part added to it on the
    /// way). Read ahead, without waiting, once the last read is half of `sync` old, so that under steady use no
    /// caller waits. One read at a time: while one is on its way, others use what is known. The last read's
    /// age is taken at `at`, read once by a caller that checks several counters.
    pub(super) async fn total(
        &self,
        counter: &Counter,
        start: i64,
        limit: u64,
        at: Instant,
    ) -> Result<u64, StoreError> {
        let read = self.with(counter, start, |window| {
            let used = window.used();
            let due = read_due(
                window
                    .synced_at
                    .map(|synced| at.saturating_duration_since(synced)),
                used,
                limit,
                self.sync,
            );
            due.filter(|_| !std::mem::replace(&mut window.reading, true))
        });
        if read.is_some() {
            let counters = self.clone();
            let owned = counter.clone();
            let reading = tokio::spawn(async move {
                let read = counters.sync(&owned, start).await;
                counters.with(&owned, start, |window| window.reading = false);
                if let Err(e) = &read {
                    tracing::warn!(counter = %owned.name, error = %e, "could not read a shared count");
                    counters.settle_in_doubt(&owned, start);
                }
                read
            });
            if read == Some(Read::Wait) {
                joined(reading).await??;
            }
        }
        Ok(self.with(counter, start, |window| window.used()))
    }

    /// Adds this replica's unsynced part to the shared window and reads back what it holds. A part whose write
    /// failed is in doubt from then on (it may have been added, or not), and is sent again under its token, which
    /// the store adds once. While parts are in doubt, they alone are sent, one sync at a time: the unsynced part
    /// follows, in a second write, once they are settled; a sync that finds them being sent only reads.
    async fn sync(&self, counter: &Counter, start: i64) -> Result<(), StoreError> {
        loop {
            let (parts, resent) = self.with(counter, start, |window| {
                if window.resending {
                    return (vec![Part::READ], false);
                }
                if !window.in_doubt.is_empty() {
                    window.resending = true;
                    let parts = std::mem::take(&mut window.in_doubt);
                    for part in &parts {
                        window.syncing = window.syncing.saturating_add(part.amount);
                    }
                    return (parts, true);
                }
                let amount = std::mem::take(&mut window.unsynced);
                window.syncing = window.syncing.saturating_add(amount);
                let token = (amount > 0).then(addition_token);
                (vec![Part { token, amount }], false)
            });
            let added = self.add_to_shared(&counter.name, start, parts).await;
            let (more, failed) = self.with(counter, start, |window| {
                if resent {
                    window.resending = false;
                }
                let mut failed = None;
                for (part, added) in added {
                    window.syncing -= part.amount.min(window.syncing);
                    match added {
                        // What the shared window holds now includes this part.
                        Ok(used) => {
                            window.shared = window.shared.max(used);
                            window.synced_at = Some(Instant::now());
                        }
                        Err(e) => {
                            if part.token.is_some() {
                                window.in_doubt.push(part);
                            }
                            failed.get_or_insert(e);
                        }
                    }
                }
                (resent && failed.is_none() && window.unsynced > 0, failed)
            });
            if let Some(e) = failed {
                return Err(e);
            }
            if !more {
                return Ok(());
            }
        }
    }

    /// Counts `tokens` a model call used in the minute of `now` against `limit` (see [`Counters::add`]).
    pub(super) fn add_tokens(&self, counter: &Counter, tokens: u64, limit: u64, now: i64) {
        self.add(counter, tokens, limit, window_start(now));
    }

    /// Counts `amount` in the window of `counter` that starts at `start`: it reaches the shared window within
    /// `sync`, or at once when this replica's unsynced part makes a slice of `limit`.
    pub(super) fn add(&self, counter: &Counter, amount: u64, limit: u64, start: i64) {
        let (schedule, at_once) = self.with(counter, start, |window| {
            window.unsynced = window.unsynced.saturating_add(amount);
            let at_once = window.unsynced >= token_slice(limit);
            (!std::mem::replace(&mut window.flushing, true), at_once)
        });
        if !schedule {
            return;
        }
        let counters = self.clone();
        let counter = counter.clone();
        tokio::spawn(async move {
            if !at_once {
                tokio::time::sleep(counters.sync).await;
            }
            counters.with(&counter, start, |window| window.flushing = false);
            if let Err(e) = counters.sync(&counter, start).await {
                tracing::warn!(counter = %counter.name, error = %e, "could not add to a shared count");
                counters.settle_in_doubt(&counter, start);
            }
        });
    }

    /// Sends the parts of the window in doubt again, on a task of its own, until none is left (or the window has
    /// moved on): waiting first `sync`, then twice as long after each failure, at most `MAX_SETTLE_WAIT`. A part
    /// left in doubt would otherwise wait for the counter's next use, which may come after its token was pruned.
    /// One such task per window at a time.
    fn settle_in_doubt(&self, counter: &Counter, start: i64) {
        let due = self.with(counter, start, |window| {
            !window.in_doubt.is_empty() && !std::mem::replace(&mut window.settling, true)
        });
        if !due {
            return;
        }
        let counters = self.clone();
        let counter = counter.clone();
        tokio::spawn(async move {
            let mut wait = counters.sync.max(MIN_SETTLE_WAIT);
            loop {
                tokio::time::sleep(wait).await;
                let left = counters.with(&counter, start, |window| {
                    let left = !window.in_doubt.is_empty() || window.resending;
                    if !left {
                        window.settling = false;
                    }
                    left
                });
                if !left {
                    return;
                }
                if let Err(e) = counters.sync(&counter, start).await {
                    tracing::warn!(counter = %counter.name, error = %e, "could not settle a shared count's part in doubt");
                    wait = (wait * 2).min(MAX_SETTLE_WAIT);
                }
            }
        });
    }
}

/// The least and the most a part in doubt waits before it is sent again.
const MIN_SETTLE_WAIT: Duration = Duration::from_millis(200);
const MAX_SETTLE_WAIT: Duration = Duration::from_secs(30);

#[cfg(test)]
mod tests {
    use super::*;
    use gateway_testkit::scratch::{until_statements_wait_on_a_lock, ScratchDatabase};

    #[test]
    fn slices_are_a_twentieth_of_the_limit_within_bounds() {
        for (limit, expected) in [(1, 1), (19, 1), (60, 3), (1000, 50), (100_000, 100)] {
            assert_eq!(slice(limit), expected, "limit {limit}");
        }
    }

    #[test]
    fn slices_asked_for_quickly_after_the_last_double_up_to_a_twentieth_of_the_limit() {
        let granted = Instant::now();
        let soon = granted + Duration::from_millis(10);
        let late = granted + QUICK_LEASE + Duration::from_millis(1);
        // The first, and one asked for long after the last: the first size.
        assert_eq!(next_slice(1_000_000, 0, None, soon), 100);
        assert_eq!(next_slice(1_000_000, 6_400, Some(granted), late), 100);
        // Soon after: twice the last, until a twentieth of the limit.
        assert_eq!(next_slice(1_000_000, 100, Some(granted), soon), 200);
        assert_eq!(next_slice(1_000_000, 40_000, Some(granted), soon), 50_000);
        assert_eq!(next_slice(1_000_000, 50_000, Some(granted), soon), 50_000);
        // A limit whose twentieth is within the first size never grows past it.
        assert_eq!(next_slice(1000, 50, Some(granted), soon), 50);
        assert_eq!(next_slice(60, 3, Some(granted), soon), 3);
    }

    #[test]
    fn a_count_is_read_before_use_when_stale_or_near_its_limit_and_beside_use_when_half_stale() {
        let sync = Duration::from_millis(200);
        let ms = Duration::from_millis;
        for (age, used, expected) in [
            (None, 0, Some(Read::Wait)),
            (Some(ms(0)), 0, None),
            (Some(ms(99)), 0, None),
            (Some(ms(100)), 0, Some(Read::Ahead)),
            (Some(ms(199)), 0, Some(Read::Ahead)),
            (Some(ms(200)), 0, Some(Read::Wait)),
            // Within a twentieth of the limit (50 of 1,000), every use reads afresh.
            (Some(ms(0)), 951, Some(Read::Wait)),
            (Some(ms(0)), 950, None),
        ] {
            assert_eq!(read_due(age, used, 1000, sync), expected, "{age:?} {used}");
        }
    }

    async fn counters() -> (ScratchDatabase, Store, Counters) {
        let db = ScratchDatabase::sqlite();
        let store = Store::connect(db.url(), 2).await.expect("store");
        store.migrate().await.expect("migrate");
        let counters = Counters::new(store.clone(), Duration::from_secs(3600));
        (db, store, counters)
    }

    /// What the shared window holds (adding nothing to it).
    async fn shared(store: &Store, name: &str, now: i64) -> u64 {
        let start = window_start(now);
        store.add_to_window(name, start, 0).await.expect("read")
    }

    const NOW: i64 = 1_800_000_000;

    /// Takes `n` requests of a limit of 1,000, each admitted.
    async fn take(counters: &Counters, n: usize) {
        for _ in 0..n {
            let taken = counters
                .request(&counters.counter("rpm".into()), 1000, NOW)
                .await
                .expect("store");
            assert!(taken.is_ok());
        }
    }

    /// Takes one request of a limit of 1,000 that leaves `remaining`, and waits for the lease it started ahead.
    async fn take_one_that_leases_ahead(counters: &Counters, remaining: u64) {
        let leased = Arc::clone(&counters.leased).notified_owned();
        let standing = counters
            .request(&counters.counter("rpm".into()), 1000, NOW)
            .await
            .expect("store");
        assert_eq!(standing.expect("admitted").remaining, remaining);
        tokio::time::timeout(Duration::from_secs(30), leased)
            .await
            .expect("the request leased the next slice ahead");
    }

    #[tokio::test]
    async fn the_next_slice_is_leased_ahead_while_a_quarter_of_the_last_is_left() {
        let (_db, store, counters) = counters().await;
        // A limit of 1,000: slices of 50, the next leased once 12 are left.
        take(&counters, 37).await;
        assert_eq!(shared(&store, "rpm", NOW).await, 50);
        // The 38th leaves 12 of the first slice.
        take_one_that_leases_ahead(&counters, 1000 - 50 + 12).await;
        assert_eq!(shared(&store, "rpm", NOW).await, 100);
        // 62 of the two slices are left: all but 13 are taken without another lease...
        take(&counters, 49).await;
        assert_eq!(shared(&store, "rpm", NOW).await, 100);
        // ...and the one that leaves 12 leases the third slice.
        take_one_that_leases_ahead(&counters, 1000 - 100 + 12).await;
        assert_eq!(shared(&store, "rpm", NOW).await, 150);
    }

    #[tokio::test]
    async fn requests_that_find_the_slice_used_up_together_lease_one_slice() {
        let (_db, store, counters) = counters().await;
        // Each with a counter of its own for the same name: they share its window.
        let handles: Vec<Counter> = (0..10).map(|_| counters.counter("rpm".into())).collect();
        let requests = handles.iter().map(|rpm| counters.request(rpm, 1000, NOW));
        for taken in futures::future::join_all(requests).await {
            assert!(taken.expect("store").is_ok());
        }
        assert_eq!(shared(&store, "rpm", NOW).await, 50);
    }

    #[tokio::test]
    async fn a_request_dropped_while_its_lease_is_on_its_way_leaves_the_lease_to_the_next() {
        let (_db, store, counters) = counters().await;
        let rpm = counters.counter("rpm".into());
        let mut first = Box::pin(counters.request(&rpm, 1000, NOW));
        assert!(futures::poll!(&mut first).is_pending());
        drop(first);
        let standing = counters
            .request(&counters.counter("rpm".into()), 1000, NOW)
            .await
            .expect("store");
        // The dropped request's lease came through and was used: one slice, two requests taken of it.
        assert_eq!(shared(&store, "rpm", NOW).await, 50);
        assert_eq!(standing.expect("admitted").remaining, 1000 - 50 + 48);
    }

    #[tokio::test]
    async fn a_full_window_refuses_without_asking_the_store_again() {
        let (_db, store, counters) = counters().await;
        for expected in [true, true, false] {
            let taken = counters
                .request(&counters.counter("rpm".into()), 2, NOW)
                .await
                .expect("store");
            assert_eq!(taken.is_ok(), expected);
        }
        store.close().await;
        let refused = counters
            .request(&counters.counter("rpm".into()), 2, NOW)
            .await
            .expect("no trip to the store");
        assert_eq!(refused.expect_err("refused").remaining, 0);
    }

    #[tokio::test]
    async fn a_limit_lowered_within_the_minute_lets_go_of_what_is_left_of_the_slices() {
        let (_db, store, counters) = counters().await;
        let rpm = counters.counter("rpm".into());
        // At a limit of 4,000 the first request leases a slice of 100 and takes one of it.
        let first = counters.request(&rpm, 4000, NOW).await.expect("store");
        assert!(first.is_ok());
        assert_eq!(shared(&store, "rpm", NOW).await, 100);
        // Lowered to 50, below what the shared minute already holds: the 99 left here are not given.
        let lowered = counters.request(&rpm, 50, NOW).await.expect("store");
        assert_eq!(lowered.expect_err("refused").remaining, 0);
        assert_eq!(shared(&store, "rpm", NOW).await, 100);
        // Raised to 150: a slice of 7 is leased from the 50 below it, and one taken.
        let raised = counters.request(&rpm, 150, NOW).await.expect("store");
        assert_eq!(raised.expect("admitted").remaining, 150 - 107 + 6);
        assert_eq!(shared(&store, "rpm", NOW).await, 107);
    }

    #[tokio::test]
    async fn a_lease_that_fails_does_not_size_the_next() {
        let (_db, store, counters) = counters().await;
        let rpm = counters.counter("rpm".into());
        // A slice of 100 just granted: the next, asked for soon, would be 200 once granted.
        counters.with(&rpm, window_start(NOW), |window| {
            window.slice = 100;
            window.granted_at = Some(Instant::now());
        });
        store.close().await;
        counters
            .request(&rpm, 1_000_000, NOW)
            .await
            .expect_err("the store is closed");
        let slice = counters.with(&rpm, window_start(NOW), |window| window.slice);
        assert_eq!(slice, 100);
    }

    #[tokio::test]
    async fn requests_waiting_for_a_lease_that_fails_fail_with_it() {
        // Failing one reply's wait after another, the last of ten would take seconds; a minute is far beyond need.
        tokio::time::timeout(
            Duration::from_secs(60),
            requests_waiting_for_a_failed_lease(),
        )
        .await
        .expect("every request answered within a minute");
    }

    async fn requests_waiting_for_a_failed_lease() {
        let db = ScratchDatabase::postgres().await.expect("database");
        let store = Store::connect(db.url(), 4).await.expect("store");
        store.migrate().await.expect("migrate");
        let start = window_start(NOW);
        store
            .lease_window("rpm", start, 1, 1000)
            .await
            .expect("the window's row");
        let store = store.with_reply_wait(Duration::from_millis(200));
        let counters = Counters::new(store, Duration::from_secs(3600));
        // Another transaction holds the window's row: a lease waits for it past the reply's wait, and is given up.
        let observer = sqlx::PgPool::connect(db.url()).await.expect("observer");
        let mut holder = observer.begin().await.expect("begin");
        sqlx::query("SELECT used FROM rate_windows WHERE scope = 'rpm' FOR UPDATE")
            .execute(&mut *holder)
            .await
            .expect("lock");
        let handles: Vec<Counter> = (0..10).map(|_| counters.counter("rpm".into())).collect();
        let requests = handles.iter().map(|rpm| counters.request(rpm, 1000, NOW));
        for taken in futures::future::join_all(requests).await {
            taken.expect_err("the store did not answer the lease");
        }
        // One lease was sent (it still waits for the row): the nine that waited for it failed with it rather
        // than each sending its own.
        let waiting: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM pg_stat_activity
             WHERE datname = current_database() AND wait_event_type = 'Lock'",
        )
        .fetch_one(&observer)
        .await
        .expect("activity");
        assert_eq!(waiting, 1);
        holder.commit().await.expect("commit");
    }

    #[tokio::test]
    async fn windows_nobody_holds_are_let_go_as_the_book_grows_and_the_rest_kept() {
        let (_db, store, counters) = counters().await;
        let held = counters.counter("held".into());
        counters
            .request(&held, 1000, NOW)
            .await
            .expect("store")
            .expect("admitted");
        // Tokens counted and not yet written (the flush waits an hour): the window owes the store.
        let owing = counters.counter("owing".into());
        counters.add_tokens(&owing, 7, 1_000_000, NOW);
        drop(owing);
        // A window nobody holds whose last write failed: its tokens wait for the next use of its name.
        let unsynced = Window {
            start: window_start(NOW),
            unsynced: 3,
            ..Window::default()
        };
        counters
            .windows
            .lock()
            .unwrap()
            .windows
            .insert(Arc::from("unsynced"), Arc::new(Mutex::new(unsynced)));
        for i in 0..MIN_PRUNE_AT * 3 {
            drop(counters.counter(format!("passing-{i}")));
        }
        let kept = {
            let book = counters.windows.lock().unwrap();
            assert!(
                book.windows.len() < MIN_PRUNE_AT + 2,
                "{} windows kept",
                book.windows.len()
            );
            assert!(
                book.windows.contains_key("owing"),
                "a window being flushed is kept"
            );
            assert!(
                book.windows.contains_key("unsynced"),
                "a window that owes tokens is kept"
            );
            Arc::clone(&book.windows["held"])
        };
        assert!(
            Arc::ptr_eq(&kept, &held.window),
            "a held window is the one kept"
        );
        // The held counter goes on where it was: one slice leased, two requests taken of it.
        let standing = counters.request(&held, 1000, NOW).await.expect("store");
        assert_eq!(standing.expect("admitted").remaining, 1000 - 50 + 48);
        assert_eq!(shared(&store, "held", NOW).await, 50);
    }

    #[test]
    fn a_new_window_forgets_the_last_one() {
        let mut window = Window {
            start: 60,
            leased: 5,
            taken: 5,
            shared: 9,
            unsynced: 3,
            ..Window::default()
        };
        assert_eq!(window.at(60).leased, 5);
        let next = window.at(120);
        assert_eq!(
            (next.start, next.leased, next.shared, next.unsynced),
            (120, 0, 0, 0)
        );
    }

    /// Adds `amount` to `scope`'s window at `NOW` under `token` (none: an addition that counts every time).
    async fn add_under(store: &Store, token: Option<&str>, scope: &str, amount: u64) -> u64 {
        let addition = WindowAddition {
            token,
            scope,
            window_start: window_start(NOW),
            amount,
        };
        store.add_to_windows(&[addition]).await.expect("added")[0]
    }

    async fn an_addition_sent_again_under_its_token_counts_once_on(db: ScratchDatabase) {
        let store = Store::connect(db.url(), 2).await.expect("store");
        store.migrate().await.expect("migrate");
        assert_eq!(add_under(&store, Some("t1"), "tpm", 5).await, 5);
        // Sent again (its reply was lost): answered the total, adding nothing.
        assert_eq!(add_under(&store, Some("t1"), "tpm", 5).await, 5);
        assert_eq!(add_under(&store, Some("t2"), "tpm", 7).await, 12);
        // Without a token, every sending counts.
        assert_eq!(add_under(&store, None, "tpm", 1).await, 13);
        assert_eq!(add_under(&store, None, "tpm", 1).await, 14);
        // In one batch, the new part counts and the old one does not, for the same window and for another.
        let batch = [
            WindowAddition {
                token: Some("t2"),
                scope: "tpm",
                window_start: window_start(NOW),
                amount: 7,
            },
            WindowAddition {
                token: Some("t3"),
                scope: "tpm",
                window_start: window_start(NOW),
                amount: 3,
            },
            WindowAddition {
                token: Some("t1"),
                scope: "spend",
                window_start: window_start(NOW),
                amount: 9,
            },
        ];
        assert_eq!(
            store.add_to_windows(&batch).await.expect("added"),
            [17, 17, 0]
        );
        // A token named twice in one batch counts once, and both are answered the window's total.
        let twice = WindowAddition {
            token: Some("t4"),
            scope: "tpm",
            window_start: window_start(NOW),
            amount: 2,
        };
        assert_eq!(
            store.add_to_windows(&[twice, twice]).await.expect("added"),
            [19, 19]
        );
    }

    #[tokio::test]
    async fn an_addition_sent_again_under_its_token_counts_once() {
        an_addition_sent_again_under_its_token_counts_once_on(ScratchDatabase::sqlite()).await;
        let postgres = ScratchDatabase::postgres().await.expect("database");
        an_addition_sent_again_under_its_token_counts_once_on(postgres).await;
    }

    #[tokio::test]
    async fn the_tokens_of_additions_are_kept_a_day() {
        let (_db, store, _counters) = counters().await;
        let old = crate::store::governance::addition_token_at(
            std::time::SystemTime::now() - Duration::from_secs(86_400 + 60),
        );
        let new = addition_token();
        for token in [&old, &new] {
            add_under(&store, Some(token), "tpm", 1).await;
        }
        store.prune_windows().await.expect("pruned");
        let crate::store::Backend::Sqlite(pool) = store.backend() else {
            unreachable!("the embedded store")
        };
        let kept: Vec<String> = sqlx::query_scalar("SELECT token FROM counter_additions")
            .fetch_all(pool)
            .await
            .expect("tokens");
        assert_eq!(kept, [new]);
    }

    /// Waits until no statement of the scratch database but this one runs.
    async fn until_no_other_statement_runs(pool: &sqlx::PgPool) {
        loop {
            let running: i64 = sqlx::query_scalar(
                "SELECT COUNT(*) FROM pg_stat_activity
                 WHERE datname = current_database() AND state = 'active' AND pid <> pg_backend_pid()",
            )
            .fetch_one(pool)
            .await
            .expect("activity");
            if running == 0 {
                return;
            }
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test]
    async fn a_part_whose_reply_was_lost_is_counted_once_when_it_was_added_meanwhile() {
        // A sync left waiting for ever would hang the test rather than fail it: a minute is far beyond need.
        tokio::time::timeout(Duration::from_secs(60), a_part_whose_reply_was_lost())
            .await
            .expect("the part settled within a minute");
    }

    /// A Postgres store whose replies are waited for a fifth of a second (a statement that waits longer is given
    /// up, not cancelled), counters syncing every `sync` on it with `tpm` at 1 already in the shared window, and
    /// another transaction holding that window's row.
    struct HeldWindow {
        _db: ScratchDatabase,
        store: Store,
        pool: sqlx::PgPool,
        counters: Counters,
        tpm: Counter,
        holder: sqlx::Transaction<'static, sqlx::Postgres>,
    }

    async fn held_window(sync: Duration) -> HeldWindow {
        let db = ScratchDatabase::postgres().await.expect("database");
        let store = Store::connect(db.url(), 4).await.expect("store");
        store.migrate().await.expect("migrate");
        let crate::store::Backend::Postgres(pool) = store.backend().clone() else {
            unreachable!("Postgres")
        };
        let store = store.with_reply_wait(Duration::from_millis(200));
        let counters = Counters::new(store.clone(), sync);
        let tpm = counters.counter("tpm".into());
        let start = window_start(NOW);
        counters.with(&tpm, start, |window| window.unsynced = 1);
        counters.sync(&tpm, start).await.expect("synced");
        let mut holder = pool.begin().await.expect("begin");
        sqlx::query("SELECT used FROM rate_windows WHERE scope = 'tpm' FOR UPDATE")
            .execute(&mut *holder)
            .await
            .expect("lock");
        HeldWindow {
            _db: db,
            store,
            pool,
            counters,
            tpm,
            holder,
        }
    }

    async fn a_part_whose_reply_was_lost() {
        // The addition waits for the held row past the reply's wait, and so does the addition sent again; both
        // statements stay (each was sent whole: the database has all it needs to run it and commit), and run once
        // the row is let go.
        let HeldWindow {
            _db,
            store,
            pool,
            counters,
            tpm,
            holder,
        } = held_window(Duration::from_secs(3600)).await;
        let start = window_start(NOW);
        counters.with(&tpm, start, |window| window.unsynced = 100);
        counters
            .sync(&tpm, start)
            .await
            .expect_err("the reply was not waited for");
        until_statements_wait_on_a_lock(&pool, 1)
            .await
            .expect("activity");
        counters
            .sync(&tpm, start)
            .await
            .expect_err("the reply was not waited for");
        until_statements_wait_on_a_lock(&pool, 2)
            .await
            .expect("activity");
        // Counted here meanwhile, once.
        assert_eq!(counters.with(&tpm, start, |window| window.used()), 101);
        holder.commit().await.expect("commit");
        until_no_other_statement_runs(&pool).await;

        // Both statements ran: the part was added once, and a third sending settles it without adding it again.
        counters.sync(&tpm, start).await.expect("synced");
        assert_eq!(shared(&store, "tpm", NOW).await, 101);
        let window = counters.with(&tpm, start, |window| (window.used(), window.idle()));
        assert_eq!(window, (101, true));
    }

    #[tokio::test]
    async fn a_part_left_in_doubt_is_settled_without_the_counter_being_used_again() {
        tokio::time::timeout(Duration::from_secs(60), a_part_left_in_doubt())
            .await
            .expect("the part settled within a minute");
    }

    async fn a_part_left_in_doubt() {
        // A slice of the limit counted at once while the row is held: its write is given up, and the part is in
        // doubt.
        let HeldWindow {
            _db,
            store,
            pool,
            counters,
            tpm,
            holder,
        } = held_window(Duration::from_millis(100)).await;
        let start = window_start(NOW);
        counters.add(&tpm, 100, 1000, start);
        until_statements_wait_on_a_lock(&pool, 2)
            .await
            .expect("activity");
        holder.commit().await.expect("commit");

        // Nobody uses the counter again: the part is sent again on its own, and settled once.
        loop {
            let window = counters.with(&tpm, start, |window| (window.idle(), window.used()));
            if window.0 {
                assert_eq!(window.1, 101);
                break;
            }
            tokio::task::yield_now().await;
        }
        assert_eq!(shared(&store, "tpm", NOW).await, 101);
    }
}
