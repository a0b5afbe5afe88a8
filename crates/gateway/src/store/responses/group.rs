//! Group commit: the writes of many concurrent runs (a response's first write, a step boundary) gathered into
//! one batch, written in one statement per kind on Postgres and one transaction on the embedded store, each
//! caller answered once its batch has committed (and, when any of its writes must, reached the disk).
//!
//! A writer takes whatever is queued whenever one of its batch slots is free: alone under light load (no wait
//! is added), many together under heavy load. Every write keeps its own fence (owner and claim epoch) and its own
//! answer; a batch the database refuses as a whole for what one write holds is written again one write at a time,
//! so one bad write fails alone; a batch whose reply was lost leaves each of its writes in doubt, as a lost reply
//! of its own would; a batch that failed for a passing reason (no connection in time, a deadlock) answers every
//! write with it at once.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, Semaphore};

use super::rows::StepRow;
use super::writes::{EndingColumns, CREATE_CONFLICT, STEP_CONFLICT};
use super::Durability;
use crate::duty;
use crate::store::governance::UsageRecord;
use crate::store::json_text::JsonText;
use crate::store::observe::StoreObserver;
use crate::store::{Backend, StoreError};

/// A response's first write, owned so that it can wait in a batch: the row, its context items, its steps and
/// their usage.
#[derive(Debug)]
pub(super) struct CreateRows {
    pub(super) id: String,
    pub(super) project_id: String,
    pub(super) deployment_id: String,
    pub(super) model: String,
    pub(super) status: &'static str,
    pub(super) params: JsonText,
    pub(super) server_tools: JsonText,
    pub(super) previous_response_id: Option<String>,
    pub(super) store: bool,
    pub(super) background: bool,
    pub(super) created_at: i64,
    pub(super) idempotency_key: Option<String>,
    pub(super) idempotency_digest: Option<String>,
    pub(super) usage: Option<JsonText>,
    pub(super) ending: EndingColumns,
    pub(super) owner: Option<String>,
    pub(super) deadline_in_ms: Option<i64>,
    pub(super) api_key_id: Option<String>,
    pub(super) trace_context: Option<String>,
    /// The context: position, item id, item.
    pub(super) items: Vec<(i32, String, JsonText)>,
    pub(super) steps: Vec<StepRow>,
    pub(super) usage_records: Vec<UsageRecord>,
}

impl CreateRows {
    /// `updated_at` of the row and of its steps: the ending time of a response written when it ended.
    fn updated_at(&self) -> i64 {
        self.ending.completed_at.unwrap_or(self.created_at)
    }
}

/// One step boundary of a running response, owned: fenced on `owner` and `epoch`.
#[derive(Debug)]
pub(super) struct BoundaryRows {
    pub(super) id: String,
    pub(super) owner: String,
    pub(super) epoch: i64,
    pub(super) at: i64,
    pub(super) ending: EndingColumns,
    pub(super) usage: Option<JsonText>,
    pub(super) notify: bool,
    /// Stored steps changed, whole: a step whose earlier write was lost (a relaxed commit that a crash of the
    /// database server took back) is written again from them.
    pub(super) changed: Vec<StepRow>,
    pub(super) added: Vec<StepRow>,
    pub(super) usage_records: Vec<UsageRecord>,
}

/// One write of a batch.
#[derive(Debug)]
pub(super) enum Write {
    Create(Box<CreateRows>),
    Boundary(Box<BoundaryRows>),
}

impl Write {
    /// The response it writes.
    fn response_id(&self) -> &str {
        match self {
            Write::Create(rows) => &rows.id,
            Write::Boundary(rows) => &rows.id,
        }
    }
}

/// What a write did: a boundary answers whether a cancel asked the response to stop, or `None` when this
/// replica no longer drives it (nothing was written).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Written {
    Created,
    /// A create whose row was there already (its first write, whose reply was lost, made it) and is another's
    /// now, or under a later claim: nothing was written.
    Taken,
    Boundary(Option<bool>),
}

/// A write waiting for its batch, and where its answer goes.
struct Queued {
    write: Write,
    durability: Durability,
    answer: oneshot::Sender<Result<Written, StoreError>>,
}

/// The most writes one batch holds.
const MAX_BATCH: usize = 128;

/// The queue into the store's writer; cheap to clone (the store's clones share it).
#[derive(Debug, Clone)]
pub(crate) struct GroupCommit {
    queue: mpsc::UnboundedSender<Queued>,
}

impl std::fmt::Debug for Queued {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Queued").finish_non_exhaustive()
    }
}

impl GroupCommit {
    /// Starts the writer of `backend`, with at most `in_flight` batches being written at once (one on the
    /// embedded store, whose file takes one writer at a time). It ends when every handle to the queue is gone.
    pub(crate) fn start(
        backend: Backend,
        observer: Arc<dyn StoreObserver>,
        in_flight: usize,
        wait: Duration,
    ) -> GroupCommit {
        let in_flight = match backend {
            Backend::Sqlite(_) => 1,
            Backend::Postgres(_) => in_flight.max(1),
        };
        let (queue, jobs) = mpsc::unbounded_channel();
        let jobs = duty::Queue::new(jobs);
        let told = Arc::clone(&observer);
        let restarted = move |duty: &'static str| told.duty_restarted(duty);
        duty::spawn("group_commit", restarted, move || {
            let (backend, observer, jobs) = (backend.clone(), Arc::clone(&observer), jobs.clone());
            async move {
                write_batches(backend, observer, &mut *jobs.take().await, in_flight, wait).await
            }
        });
        GroupCommit { queue }
    }

    /// Queues `write` and waits for its batch.
    pub(super) async fn write(
        &self,
        write: Write,
        durability: Durability,
    ) -> Result<Written, StoreError> {
        let (answer, answered) = oneshot::channel();
        self.queue
            .send(Queued {
                write,
                durability,
                answer,
            })
            .map_err(|_| StoreError::Database(sqlx::Error::PoolClosed))?;
        // The writer went away with the write (the runtime is shutting down): whether it committed is unknown.
        answered
            .await
            .unwrap_or(Err(StoreError::Database(sqlx::Error::WorkerCrashed)))
    }
}

/// The writer: whenever a batch slot is free, takes everything queued (up to `MAX_BATCH`) and writes it.
async fn write_batches(
    backend: Backend,
    observer: Arc<dyn StoreObserver>,
    jobs: &mut mpsc::UnboundedReceiver<Queued>,
    in_flight: usize,
    wait: Duration,
) {
    let slots = Arc::new(Semaphore::new(in_flight));
    // A write held back from the last batch: it starts the next one.
    let mut held: Option<Queued> = None;
    loop {
        let Ok(slot) = Arc::clone(&slots).acquire_owned().await else {
            return;
        };
        let first = match held.take() {
            Some(queued) => queued,
            None => match jobs.recv().await {
                Some(queued) => queued,
                None => return,
            },
        };
        // One write per response in a batch: a batch's statements fence and answer by response, so a second
        // write of the same response (a run that lost it and the run that took it back, on this replica) waits
        // for the next batch, where its own fence decides.
        let mut responses = HashSet::from([first.write.response_id().to_owned()]);
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            let Ok(queued) = jobs.try_recv() else {
                break;
            };
            if !responses.insert(queued.write.response_id().to_owned()) {
                held = Some(queued);
                break;
            }
            batch.push(queued);
        }
        let backend = backend.clone();
        let observer = Arc::clone(&observer);
        tokio::spawn(async move {
            observer.batch(batch.len());
            write_and_answer(&backend, batch, wait).await;
            drop(slot);
        });
    }
}

/// Writes `batch` and answers each of its writes. On Postgres the creates and the step boundaries are two
/// statements, each its own commit: they are written and answered as two batches, so that a boundary statement
/// that fails never answers creates already committed as failed (a background create told "nothing was stored"
/// would be sent again, and run twice). The embedded store writes both kinds in one transaction.
async fn write_and_answer(backend: &Backend, batch: Vec<Queued>, wait: Duration) {
    if matches!(backend, Backend::Postgres(_)) {
        let (creates, boundaries): (Vec<Queued>, Vec<Queued>) = batch
            .into_iter()
            .partition(|queued| matches!(queued.write, Write::Create(_)));
        for part in [creates, boundaries] {
            if !part.is_empty() {
                write_part_and_answer(backend, part, wait).await;
            }
        }
    } else {
        write_part_and_answer(backend, batch, wait).await;
    }
}

/// Writes `batch` as one and answers each of its writes.
async fn write_part_and_answer(backend: &Backend, batch: Vec<Queued>, wait: Duration) {
    let durability = if batch.iter().any(|q| q.durability == Durability::Flush) {
        Durability::Flush
    } else {
        Durability::Relaxed
    };
    let writes: Vec<&Write> = batch.iter().map(|q| &q.write).collect();
    match write_batch(backend, &writes, durability, wait).await {
        Ok(written) => {
            for (queued, written) in batch.into_iter().zip(written) {
                let _ = queued.answer.send(Ok(written));
            }
        }
        Err(failure)
            if batch.len() == 1 || failure.may_have_committed() || failure.is_transient() =>
        {
            // Every write of the batch shares its fate: a reply lost leaves each in doubt; a passing failure (no
            // connection free in time, a deadlock, a server restarting) wrote none of them, and writing them
            // again one at a time would only meet it again, once per write (a full pool: the wait for a
            // connection, times the batch's size).
            let shared = shared_failure(&failure);
            let mut failure = Some(failure);
            for queued in batch {
                let error = failure.take().unwrap_or_else(&shared);
                let _ = queued.answer.send(Err(error));
            }
        }
        Err(_) => {
            // Refused as a whole by what one write holds (a conflict on its Idempotency-Key aborts the
            // statement): each is written alone, so that the refusal reaches only the write it belongs to.
            for queued in batch {
                let written = write_batch(backend, &[&queued.write], queued.durability, wait)
                    .await
                    .map(|mut written| written.remove(0));
                let _ = queued.answer.send(written);
            }
        }
    }
}

/// The failure of a batch as each of its writes after the first is told it (the first gets `failure` itself):
/// in doubt when the batch's commit is, else as passing and as surely unwritten as the batch's.
fn shared_failure(failure: &StoreError) -> impl Fn() -> StoreError {
    let in_doubt = failure.may_have_committed();
    let busy = matches!(failure, StoreError::Busy);
    let cause = failure.to_string();
    move || {
        if in_doubt {
            StoreError::Database(sqlx::Error::Io(std::io::Error::new(
                std::io::ErrorKind::ConnectionAborted,
                format!("the batch this write was in failed: {cause}"),
            )))
        } else if busy {
            StoreError::Busy
        } else {
            StoreError::BatchFailed(cause.clone())
        }
    }
}

/// Writes `writes` as one batch; answers in their order. Written directly (as a batch of one) when the store has
/// no writer of its own.
///
/// A database that has not answered within `wait` leaves every write in doubt, as a lost reply does: over a
/// connection whose database vanished without closing it, the answer would never come, and the writer (every
/// later write of this replica, once its batches in flight all wait so) with it. The statement is abandoned on
/// its connection, which the pool tests before it lends it again.
pub(super) async fn write_batch(
    backend: &Backend,
    writes: &[&Write],
    durability: Durability,
    wait: Duration,
) -> Result<Vec<Written>, StoreError> {
    let written = async {
        match backend {
            Backend::Postgres(pool) => postgres::write(pool, writes, durability).await,
            Backend::Sqlite(pool) => sqlite::write(pool, writes).await,
        }
    };
    crate::store::answered_within(wait, written).await
}

/// The creates and the step boundaries of a batch, apart.
fn by_kind<'a>(writes: &[&'a Write]) -> (Vec<&'a CreateRows>, Vec<&'a BoundaryRows>) {
    let mut creates = Vec::new();
    let mut boundaries = Vec::new();
    for write in writes {
        match write {
            Write::Create(rows) => creates.push(&**rows),
            Write::Boundary(rows) => boundaries.push(&**rows),
        }
    }
    (creates, boundaries)
}

/// What each write of a batch did, in its order: `taken` holds the creates whose row was another's already,
/// `owned` the responses whose boundaries were written (their replica still drove them), each with whether a
/// cancel asked it to stop.
fn answers(
    writes: &[&Write],
    taken: &HashSet<String>,
    owned: &HashMap<String, bool>,
) -> Vec<Written> {
    writes
        .iter()
        .map(|w| match w {
            Write::Create(rows) if taken.contains(&rows.id) => Written::Taken,
            Write::Create(_) => Written::Created,
            Write::Boundary(rows) => Written::Boundary(owned.get(rows.id.as_str()).copied()),
        })
        .collect()
}

mod postgres {
    //! A batch on Postgres: the creates in one statement, the step boundaries in another.

    use std::collections::{HashMap, HashSet};

    use sqlx::postgres::PgPool;

    use super::{BoundaryRows, CreateRows, Write, Written};
    use crate::store::json_text::JsonText;
    use crate::store::responses::rows::StepRow;
    use crate::store::responses::Durability;
    use crate::store::StoreError;

    /// New responses, their context items, first steps and usage, as one statement (one round trip, one
    /// commit). A deployment deleted meanwhile is recorded as none (as `ON DELETE SET NULL` does for rows
    /// written earlier); the deadline runs from the database's clock. Response ids are unique (the time, then 74
    /// random bits), so a row already there under the same id is this very write made again after its reply was
    /// lost: it is written over while the same replica still owns it at the first epoch, and left alone
    /// otherwise; its steps likewise. The ids left alone are answered (`taken`): another replica took them.
    const CREATE: &str = concat!(
        "WITH r AS (
    SELECT * FROM UNNEST($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::jsonb[], $7::jsonb[],
        $8::text[], $9::bool[], $10::bool[], $11::int8[], $12::text[], $13::jsonb[], $14::bool[], $15::text[],
        $16::text[], $17::text[], $18::int8[], $19::text[], $20::int8[], $21::text[], $22::text[], $36::text[])
    AS r(id, project_id, deployment_id, model, status, params, server_tools, previous_response_id, store,
        background, created_at, idempotency_key, usage, handed_back, error_code, error_message,
        incomplete_reason, completed_at, owner, deadline_in_ms, api_key_id, trace_context, idempotency_digest)
), response AS (
    INSERT INTO responses (id, project_id, deployment_id, model, status, params, server_tools,
        previous_response_id, store, background, created_at, updated_at, idempotency_key, usage, handed_back,
        error_code, error_message, incomplete_reason, completed_at, owner, deadline_at, api_key_id, trace_context,
        idempotency_digest)
    SELECT r.id, r.project_id, d.id, r.model, r.status, r.params, r.server_tools, r.previous_response_id,
        r.store, r.background, r.created_at, COALESCE(r.completed_at, r.created_at), r.idempotency_key, r.usage,
        r.handed_back, r.error_code, r.error_message, r.incomplete_reason, r.completed_at, r.owner, ",
        pg_now_ms!(),
        " + r.deadline_in_ms, r.api_key_id, r.trace_context, r.idempotency_digest
    FROM r LEFT JOIN deployments d ON d.id = r.deployment_id
    ON CONFLICT (id) DO UPDATE SET status = excluded.status, usage = excluded.usage,
        handed_back = excluded.handed_back, error_code = excluded.error_code,
        error_message = excluded.error_message, incomplete_reason = excluded.incomplete_reason,
        completed_at = excluded.completed_at, updated_at = excluded.updated_at
    WHERE responses.owner IS NOT DISTINCT FROM excluded.owner AND responses.claim_epoch = 0
    RETURNING id
), items AS (
    INSERT INTO response_input_items (response_id, position, item_id, item)
    SELECT * FROM UNNEST($23::text[], $24::int4[], $25::text[], $26::jsonb[])
    ON CONFLICT DO NOTHING
), added AS (
    INSERT INTO steps (response_id, seq, kind, state, body, call_id, tool_name, attempts, created_at, updated_at,
        started_epoch)
    SELECT s.response_id, s.seq, s.kind, s.state, s.body, s.call_id, s.tool_name,
           CASE WHEN s.state = 'pending' THEN 0 ELSE 1 END, r.created_at, COALESCE(r.completed_at, r.created_at), 0
    FROM UNNEST($27::text[], $28::int4[], $29::text[], $30::text[], $31::jsonb[], $32::text[], $33::text[])
        AS s(response_id, seq, kind, state, body, call_id, tool_name)
    JOIN r ON r.id = s.response_id
    ON CONFLICT (response_id, seq) DO UPDATE SET state = excluded.state, body = excluded.body,
        updated_at = excluded.updated_at
    WHERE EXISTS (SELECT 1 FROM responses x JOIN r ON r.id = x.id WHERE x.id = excluded.response_id
        AND x.owner IS NOT DISTINCT FROM r.owner AND x.claim_epoch = 0)
), usage AS (
    INSERT INTO usage_records SELECT * FROM ",
        usage_recordset!("$34"),
        " ON CONFLICT DO NOTHING
)
SELECT set_config('synchronous_commit', COALESCE($35, current_setting('synchronous_commit')), true) AS commit,
       ARRAY(SELECT r.id FROM r WHERE r.id NOT IN (SELECT id FROM response)) AS taken"
    );

    /// Step boundaries of running responses as one statement, each written only while its replica owns the
    /// response under its claim epoch (the rows are locked for the statement, in the order `claims_of` locks
    /// them, so the two never deadlock, and a takeover waits for it): a run that lost its response writes nothing, and learns it from its response missing among the
    /// rows answered, even when the response came back to its replica under a later claim. A step already
    /// there is the run's own write made again (its reply was lost): it is written over, never a conflict.
    /// Changed steps count an attempt when they start running, but for a step stored running under the same
    /// epoch (the same start made again after a lost reply); a response row changes only when it ends. The
    /// followers of the responses that ask for it are told they progressed.
    const BOUNDARIES: &str = concat!(
        "WITH w AS (
    SELECT * FROM UNNEST($1::text[], $2::text[], $3::int8[], $4::int8[], $5::text[], $6::jsonb[], $7::bool[],
        $8::text[], $9::text[], $10::text[], $11::int8[], $12::bool[])
    AS w(id, owner, epoch, at, status, usage, handed_back, error_code, error_message, incomplete_reason,
        completed_at, notify)
), owned AS (
    SELECT r.id, r.cancel_requested FROM responses r JOIN w ON r.id = w.id AND r.owner = w.owner
        AND r.claim_epoch = w.epoch
    ORDER BY r.created_at, r.id FOR UPDATE OF r
), changed AS (
    INSERT INTO steps (response_id, seq, kind, state, body, call_id, tool_name, attempts, created_at, updated_at,
        started_epoch)
    SELECT u.response_id, u.seq, u.kind, u.state, u.body, u.call_id, u.tool_name,
           CASE WHEN u.state = 'pending' THEN 0 ELSE 1 END, w.at, w.at, w.epoch
    FROM UNNEST($13::text[], $14::int4[], $15::text[], $16::text[], $17::jsonb[], $18::text[], $19::text[])
        AS u(response_id, seq, kind, state, body, call_id, tool_name)
    JOIN w ON w.id = u.response_id
    WHERE u.response_id IN (SELECT id FROM owned)
    ON CONFLICT (response_id, seq) DO UPDATE SET state = excluded.state, body = excluded.body,
        updated_at = excluded.updated_at,
        attempts = steps.attempts + CASE WHEN excluded.state = 'running' AND (steps.state <> 'running'
            OR steps.started_epoch IS DISTINCT FROM excluded.started_epoch) THEN 1 ELSE 0 END,
        started_epoch = CASE WHEN excluded.state = 'running' THEN excluded.started_epoch
            ELSE steps.started_epoch END
), added AS (
    INSERT INTO steps (response_id, seq, kind, state, body, call_id, tool_name, attempts, created_at, updated_at,
        started_epoch)
    SELECT s.response_id, s.seq, s.kind, s.state, s.body, s.call_id, s.tool_name,
           CASE WHEN s.state = 'pending' THEN 0 ELSE 1 END, w.at, w.at, w.epoch
    FROM UNNEST($20::text[], $21::int4[], $22::text[], $23::text[], $24::jsonb[], $25::text[], $26::text[])
        AS s(response_id, seq, kind, state, body, call_id, tool_name)
    JOIN w ON w.id = s.response_id
    WHERE s.response_id IN (SELECT id FROM owned)
    ON CONFLICT (response_id, seq) DO UPDATE SET state = excluded.state, body = excluded.body,
        updated_at = excluded.updated_at
), ended AS (
    UPDATE responses SET status = w.status, usage = w.usage, handed_back = w.handed_back,
        error_code = w.error_code, error_message = w.error_message, incomplete_reason = w.incomplete_reason,
        completed_at = w.completed_at, updated_at = w.at
    FROM w WHERE responses.id = w.id AND w.status IS NOT NULL AND w.id IN (SELECT id FROM owned)
), notified AS (
    SELECT pg_notify('gateway_progress', o.id) FROM owned o JOIN w ON w.id = o.id WHERE w.notify
), usage AS (
    INSERT INTO usage_records SELECT * FROM ",
        usage_recordset!("$27"),
        " WHERE u.response_id IN (SELECT id FROM owned) ON CONFLICT DO NOTHING
)
SELECT o.id, o.cancel_requested, (SELECT COUNT(*) FROM notified) AS notified,
       set_config('synchronous_commit', COALESCE($28, current_setting('synchronous_commit')), true) AS commit
FROM owned o"
    );

    /// Steps of several responses as one array per column (the response's id first), for `UNNEST`.
    #[derive(Default)]
    struct StepColumns<'a> {
        response_id: Vec<&'a str>,
        seq: Vec<i32>,
        kind: Vec<&'static str>,
        state: Vec<&'static str>,
        body: Vec<&'a JsonText>,
        call_id: Vec<Option<&'a str>>,
        tool_name: Vec<Option<&'a str>>,
    }

    impl<'a> StepColumns<'a> {
        fn push(&mut self, response_id: &'a str, row: &'a StepRow) {
            self.response_id.push(response_id);
            self.seq.push(row.seq);
            self.kind.push(row.kind);
            self.state.push(row.state);
            self.body.push(&row.body);
            self.call_id.push(row.call_id.as_deref());
            self.tool_name.push(row.tool_name.as_deref());
        }
    }

    /// Binds a `StepColumns`' seven columns as the next seven array parameters of `$query` (a macro, because
    /// sqlx's statement types have no common trait for `bind`).
    macro_rules! bind_step_columns {
        ($query:expr, $columns:expr) => {{
            let columns = &$columns;
            $query
                .bind(&columns.response_id)
                .bind(&columns.seq)
                .bind(&columns.kind)
                .bind(&columns.state)
                .bind(&columns.body)
                .bind(&columns.call_id)
                .bind(&columns.tool_name)
        }};
    }

    pub(super) async fn write(
        pool: &PgPool,
        writes: &[&Write],
        durability: Durability,
    ) -> Result<Vec<Written>, StoreError> {
        let (creates, boundaries) = super::by_kind(writes);
        let synchronous_commit = durability.synchronous_commit();
        let mut taken = HashSet::new();
        if !creates.is_empty() {
            taken = create(pool, &creates, synchronous_commit).await?;
        }
        let mut owned = HashMap::new();
        if !boundaries.is_empty() {
            owned = boundary(pool, &boundaries, synchronous_commit).await?;
        }
        Ok(super::answers(writes, &taken, &owned))
    }

    /// Writes the creates; the ids of those whose row was another's already (see [`Written::Taken`]).
    async fn create(
        pool: &PgPool,
        creates: &[&CreateRows],
        synchronous_commit: Option<&str>,
    ) -> Result<HashSet<String>, StoreError> {
        let column = |f: fn(&CreateRows) -> &str| creates.iter().map(|c| f(c)).collect::<Vec<_>>();
        let optional =
            |f: fn(&CreateRows) -> Option<&str>| creates.iter().map(|c| f(c)).collect::<Vec<_>>();
        let mut item_response = Vec::new();
        let mut item_position = Vec::new();
        let mut item_id = Vec::new();
        let mut item = Vec::new();
        let mut steps = StepColumns::default();
        let mut usage = Vec::new();
        for c in creates {
            for (position, id, body) in &c.items {
                item_response.push(c.id.as_str());
                item_position.push(*position);
                item_id.push(id.as_str());
                item.push(body);
            }
            for row in &c.steps {
                steps.push(&c.id, row);
            }
            usage.extend(c.usage_records.iter());
        }
        let query = sqlx::query(CREATE)
            .bind(column(|c| &c.id))
            .bind(column(|c| &c.project_id))
            .bind(column(|c| &c.deployment_id))
            .bind(column(|c| &c.model))
            .bind(creates.iter().map(|c| c.status).collect::<Vec<_>>())
            .bind(creates.iter().map(|c| &c.params).collect::<Vec<_>>())
            .bind(creates.iter().map(|c| &c.server_tools).collect::<Vec<_>>())
            .bind(optional(|c| c.previous_response_id.as_deref()))
            .bind(creates.iter().map(|c| c.store).collect::<Vec<_>>())
            .bind(creates.iter().map(|c| c.background).collect::<Vec<_>>())
            .bind(creates.iter().map(|c| c.created_at).collect::<Vec<_>>())
            .bind(optional(|c| c.idempotency_key.as_deref()))
            .bind(creates.iter().map(|c| c.usage.as_ref()).collect::<Vec<_>>())
            .bind(
                creates
                    .iter()
                    .map(|c| c.ending.handed_back)
                    .collect::<Vec<_>>(),
            )
            .bind(
                creates
                    .iter()
                    .map(|c| c.ending.error_code)
                    .collect::<Vec<_>>(),
            )
            .bind(optional(|c| c.ending.error_message.as_deref()))
            .bind(
                creates
                    .iter()
                    .map(|c| c.ending.incomplete_reason)
                    .collect::<Vec<_>>(),
            )
            .bind(
                creates
                    .iter()
                    .map(|c| c.ending.completed_at)
                    .collect::<Vec<_>>(),
            )
            .bind(optional(|c| c.owner.as_deref()))
            .bind(creates.iter().map(|c| c.deadline_in_ms).collect::<Vec<_>>())
            .bind(optional(|c| c.api_key_id.as_deref()))
            .bind(optional(|c| c.trace_context.as_deref()))
            .bind(&item_response)
            .bind(&item_position)
            .bind(&item_id)
            .bind(&item);
        let written = bind_step_columns!(query, steps)
            .bind(super::super::writes::usage_json(usage)?)
            .bind(synchronous_commit)
            .bind(optional(|c| c.idempotency_digest.as_deref()))
            .fetch_one(pool)
            .await
            .map_err(|e| StoreError::from_write(e, super::CREATE_CONFLICT))?;
        let taken: Vec<String> = sqlx::Row::try_get(&written, "taken")?;
        Ok(taken.into_iter().collect())
    }

    async fn boundary(
        pool: &PgPool,
        boundaries: &[&BoundaryRows],
        synchronous_commit: Option<&str>,
    ) -> Result<HashMap<String, bool>, StoreError> {
        let mut changed = StepColumns::default();
        let mut added = StepColumns::default();
        let mut usage = Vec::new();
        for b in boundaries {
            for row in &b.changed {
                changed.push(&b.id, row);
            }
            for row in &b.added {
                added.push(&b.id, row);
            }
            usage.extend(b.usage_records.iter());
        }
        let query = sqlx::query_as::<_, (String, bool, i64, String)>(BOUNDARIES)
            .bind(boundaries.iter().map(|b| b.id.as_str()).collect::<Vec<_>>())
            .bind(
                boundaries
                    .iter()
                    .map(|b| b.owner.as_str())
                    .collect::<Vec<_>>(),
            )
            .bind(boundaries.iter().map(|b| b.epoch).collect::<Vec<_>>())
            .bind(boundaries.iter().map(|b| b.at).collect::<Vec<_>>())
            .bind(
                boundaries
                    .iter()
                    .map(|b| b.ending.status)
                    .collect::<Vec<_>>(),
            )
            .bind(
                boundaries
                    .iter()
                    .map(|b| b.usage.as_ref())
                    .collect::<Vec<_>>(),
            )
            .bind(
                boundaries
                    .iter()
                    .map(|b| b.ending.handed_back)
                    .collect::<Vec<_>>(),
            )
            .bind(
                boundaries
                    .iter()
                    .map(|b| b.ending.error_code)
                    .collect::<Vec<_>>(),
            )
            .bind(
                boundaries
                    .iter()
                    .map(|b| b.ending.error_message.as_deref())
                    .collect::<Vec<_>>(),
            )
            .bind(
                boundaries
                    .iter()
                    .map(|b| b.ending.incomplete_reason)
                    .collect::<Vec<_>>(),
            )
            .bind(
                boundaries
                    .iter()
                    .map(|b| b.ending.completed_at)
                    .collect::<Vec<_>>(),
            )
            .bind(boundaries.iter().map(|b| b.notify).collect::<Vec<_>>());
        let query = bind_step_columns!(query, changed);
        let owned = bind_step_columns!(query, added)
            .bind(super::super::writes::usage_json(usage)?)
            .bind(synchronous_commit)
            .fetch_all(pool)
            .await
            .map_err(|e| StoreError::from_write(e, super::STEP_CONFLICT))?;
        Ok(owned
            .into_iter()
            .map(|(id, cancel_requested, _, _)| (id, cancel_requested))
            .collect())
    }
}

mod sqlite {
    //! A batch on the embedded store: every write in one transaction, so one commit (and one sync of the file)
    //! for all, and one statement per kind of row for the whole batch (`multirow`).

    use std::collections::{HashMap, HashSet};

    use sqlx::sqlite::{Sqlite, SqliteConnection, SqlitePool};
    use sqlx::QueryBuilder;

    use super::{BoundaryRows, CreateRows, EndingColumns, Write, Written};
    use crate::store::governance::UsageRecord;
    use crate::store::json_text::JsonText;
    use crate::store::multirow::{in_statements, insert_usage, parts, values};
    use crate::store::responses::rows::StepRow;
    use crate::store::StoreError;

    pub(super) async fn write(
        pool: &SqlitePool,
        writes: &[&Write],
    ) -> Result<Vec<Written>, StoreError> {
        let conflict = match writes {
            [Write::Create(_)] => super::CREATE_CONFLICT,
            _ => super::STEP_CONFLICT,
        };
        let (creates, boundaries) = super::by_kind(writes);
        let written: Result<(HashSet<String>, HashMap<String, bool>), sqlx::Error> = async {
            let mut tx = pool.begin().await?;
            // The ownership check writes first, so that the transaction holds the write lock from its first
            // statement; a boundary whose replica no longer owns its response writes nothing else.
            let owned = claim_boundaries(&mut tx, &boundaries).await?;
            let boundaries: Vec<&BoundaryRows> = boundaries
                .into_iter()
                .filter(|b| owned.contains_key(&b.id))
                .collect();
            let taken = insert_responses(&mut tx, &creates).await?;
            // Nothing of a create whose row is another's is written: its items and steps neither.
            let creates: Vec<&CreateRows> = creates
                .into_iter()
                .filter(|c| !taken.contains(&c.id))
                .collect();
            let items: Vec<(&str, &(i32, String, JsonText))> = creates
                .iter()
                .flat_map(|c| c.items.iter().map(|item| (c.id.as_str(), item)))
                .collect();
            insert_items(&mut tx, &items).await?;
            let changed: Vec<(&BoundaryRows, &StepRow)> = boundaries
                .iter()
                .flat_map(|b| b.changed.iter().map(move |change| (*b, change)))
                .collect();
            update_steps(&mut tx, &changed).await?;
            let steps: Vec<AddedStep<'_>> = creates
                .iter()
                .flat_map(|c| {
                    c.steps.iter().map(|row| AddedStep {
                        response_id: &c.id,
                        row,
                        created_at: c.created_at,
                        updated_at: c.updated_at(),
                        epoch: 0,
                    })
                })
                .chain(boundaries.iter().flat_map(|b| {
                    b.added.iter().map(|row| AddedStep {
                        response_id: &b.id,
                        row,
                        created_at: b.at,
                        updated_at: b.at,
                        epoch: b.epoch,
                    })
                }))
                .collect();
            insert_steps(&mut tx, &steps).await?;
            let usage: Vec<&UsageRecord> = creates
                .iter()
                .flat_map(|c| c.usage_records.iter())
                .chain(boundaries.iter().flat_map(|b| b.usage_records.iter()))
                .collect();
            insert_usage(&mut tx, &usage).await?;
            let endings: Vec<&BoundaryRows> = boundaries
                .iter()
                .copied()
                .filter(|b| b.ending.status.is_some())
                .collect();
            end_responses(&mut tx, &endings).await?;
            tx.commit().await?;
            Ok((taken, owned))
        }
        .await;
        let (taken, owned) = written.map_err(|e| StoreError::from_write(e, conflict))?;
        Ok(super::answers(writes, &taken, &owned))
    }

    /// Takes the step boundaries whose replica still owns their response under their claim epoch: their rows'
    /// `updated_at` written, and whether a cancel asked each of them to stop.
    async fn claim_boundaries(
        tx: &mut SqliteConnection,
        boundaries: &[&BoundaryRows],
    ) -> Result<HashMap<String, bool>, sqlx::Error> {
        let mut owned = HashMap::with_capacity(boundaries.len());
        for part in parts(boundaries, 4) {
            let mut query =
                QueryBuilder::<Sqlite>::new("UPDATE responses SET updated_at = v.column3 FROM (");
            values(&mut query, part, |row, b| {
                row.push_bind(&b.id)
                    .push_bind(&b.owner)
                    .push_bind(b.at)
                    .push_bind(b.epoch);
            });
            query.push(
                ") AS v WHERE responses.id = v.column1 AND responses.owner = v.column2
                    AND responses.claim_epoch = v.column4
                 RETURNING id, cancel_requested",
            );
            let rows: Vec<(String, bool)> = query.build_query_as().fetch_all(&mut *tx).await?;
            owned.extend(rows);
        }
        Ok(owned)
    }

    /// The response rows (each written over only by the same write made again: same owner, first epoch). A
    /// deployment deleted meanwhile is recorded as none; the deadline runs from the database's clock.
    /// New responses' rows; the ids of those whose row was another's already (see [`Written::Taken`]), which are
    /// left alone.
    async fn insert_responses(
        tx: &mut SqliteConnection,
        creates: &[&CreateRows],
    ) -> Result<HashSet<String>, sqlx::Error> {
        let mut written = HashSet::with_capacity(creates.len());
        for part in parts(creates, 25) {
            let mut query = QueryBuilder::<Sqlite>::new("");
            query.push(
                "INSERT INTO responses (id, project_id, deployment_id, model, status, params, server_tools,
                    previous_response_id, store, background, created_at, updated_at, idempotency_key, usage,
                    handed_back, error_code, error_message, incomplete_reason, completed_at, owner, deadline_at,
                    api_key_id, trace_context, idempotency_digest) ",
            );
            values(&mut query, part, |row, c| {
                row.push_bind(&c.id).push_bind(&c.project_id);
                row.push("(SELECT id FROM deployments WHERE id = ")
                    .push_bind_unseparated(&c.deployment_id)
                    .push_unseparated(")");
                row.push_bind(&c.model)
                    .push_bind(c.status)
                    .push_bind(&c.params)
                    .push_bind(&c.server_tools)
                    .push_bind(&c.previous_response_id)
                    .push_bind(c.store)
                    .push_bind(c.background)
                    .push_bind(c.created_at)
                    .push_bind(c.updated_at())
                    .push_bind(&c.idempotency_key)
                    .push_bind(&c.usage);
                push_ending(row, &c.ending);
                row.push_bind(&c.owner);
                row.push(sqlite_now_ms!())
                    .push_unseparated(" + ")
                    .push_bind_unseparated(c.deadline_in_ms);
                row.push_bind(&c.api_key_id)
                    .push_bind(&c.trace_context)
                    .push_bind(&c.idempotency_digest);
            });
            query.push(
                " ON CONFLICT (id) DO UPDATE SET status = excluded.status, usage = excluded.usage,
                    handed_back = excluded.handed_back, error_code = excluded.error_code,
                    error_message = excluded.error_message, incomplete_reason = excluded.incomplete_reason,
                    completed_at = excluded.completed_at, updated_at = excluded.updated_at
                 WHERE responses.owner IS NOT DISTINCT FROM excluded.owner AND responses.claim_epoch = 0
                 RETURNING id",
            );
            let ids: Vec<String> = query.build_query_scalar().fetch_all(&mut *tx).await?;
            written.extend(ids);
        }
        Ok(creates
            .iter()
            .filter(|c| !written.contains(&c.id))
            .map(|c| c.id.clone())
            .collect())
    }

    /// New responses' context items: response, (position, item id, item).
    async fn insert_items(
        tx: &mut SqliteConnection,
        items: &[(&str, &(i32, String, JsonText))],
    ) -> Result<(), sqlx::Error> {
        in_statements(tx, items, 4, |query, part| {
            query.push("INSERT INTO response_input_items (response_id, position, item_id, item) ");
            values(query, part, |row, (response_id, (position, id, item))| {
                row.push_bind(*response_id)
                    .push_bind(*position)
                    .push_bind(id)
                    .push_bind(item);
            });
            query.push(" ON CONFLICT DO NOTHING");
        })
        .await
    }

    /// Stored steps changed at a boundary, written whole (one missing is written again); one that starts running
    /// counts an attempt, unless it is stored running under the same epoch already.
    async fn update_steps(
        tx: &mut SqliteConnection,
        changed: &[(&BoundaryRows, &StepRow)],
    ) -> Result<(), sqlx::Error> {
        in_statements(tx, changed, 11, |query, part| {
            query.push(
                "INSERT INTO steps (response_id, seq, kind, state, body, call_id, tool_name, attempts, created_at,
                    updated_at, started_epoch) ",
            );
            values(query, part, |row, (b, step)| {
                row.push_bind(&b.id)
                    .push_bind(step.seq)
                    .push_bind(step.kind)
                    .push_bind(step.state)
                    .push_bind(&step.body)
                    .push_bind(&step.call_id)
                    .push_bind(&step.tool_name)
                    .push_bind(step.attempts())
                    .push_bind(b.at)
                    .push_bind(b.at)
                    .push_bind(b.epoch);
            });
            query.push(
                " ON CONFLICT (response_id, seq) DO UPDATE SET state = excluded.state, body = excluded.body,
                    updated_at = excluded.updated_at,
                    attempts = steps.attempts + CASE WHEN excluded.state = 'running' AND (steps.state <> 'running'
                        OR steps.started_epoch IS NOT excluded.started_epoch) THEN 1 ELSE 0 END,
                    started_epoch = CASE WHEN excluded.state = 'running' THEN excluded.started_epoch
                        ELSE steps.started_epoch END",
            );
        })
        .await
    }

    /// A step row to insert, with its response and times.
    struct AddedStep<'a> {
        response_id: &'a str,
        row: &'a StepRow,
        created_at: i64,
        updated_at: i64,
        /// The claim epoch it is written under (a create's: 0).
        epoch: i64,
    }

    /// New steps; one already there is the same write made again (its reply was lost) and is written over.
    async fn insert_steps(
        tx: &mut SqliteConnection,
        steps: &[AddedStep<'_>],
    ) -> Result<(), sqlx::Error> {
        in_statements(tx, steps, 11, |query, part| {
            query.push(
                "INSERT INTO steps (response_id, seq, kind, state, body, call_id, tool_name, attempts, created_at,
                    updated_at, started_epoch) ",
            );
            values(query, part, |row, step| {
                row.push_bind(step.response_id)
                    .push_bind(step.row.seq)
                    .push_bind(step.row.kind)
                    .push_bind(step.row.state)
                    .push_bind(&step.row.body)
                    .push_bind(&step.row.call_id)
                    .push_bind(&step.row.tool_name)
                    .push_bind(step.row.attempts())
                    .push_bind(step.created_at)
                    .push_bind(step.updated_at)
                    .push_bind(step.epoch);
            });
            query.push(
                " ON CONFLICT (response_id, seq) DO UPDATE SET state = excluded.state, body = excluded.body,
                    updated_at = excluded.updated_at",
            );
        })
        .await
    }

    /// How a response ended, as the row's columns hold it: handed back, error code and message, why it is
    /// incomplete, when it ended.
    fn push_ending<'q>(
        row: &mut sqlx::query_builder::Separated<'_, 'q, Sqlite, &'static str>,
        ending: &'q EndingColumns,
    ) {
        row.push_bind(ending.handed_back)
            .push_bind(ending.error_code)
            .push_bind(&ending.error_message)
            .push_bind(ending.incomplete_reason)
            .push_bind(ending.completed_at);
    }

    /// The rows of the responses that ended at their boundary.
    async fn end_responses(
        tx: &mut SqliteConnection,
        endings: &[&BoundaryRows],
    ) -> Result<(), sqlx::Error> {
        in_statements(tx, endings, 9, |query, part| {
            query.push(
                "UPDATE responses SET status = v.column2, usage = v.column3, handed_back = v.column4,
                    error_code = v.column5, error_message = v.column6, incomplete_reason = v.column7,
                    completed_at = v.column8, updated_at = v.column9 FROM (",
            );
            values(query, part, |row, b| {
                row.push_bind(&b.id)
                    .push_bind(b.ending.status)
                    .push_bind(&b.usage);
                push_ending(row, &b.ending);
                row.push_bind(b.at);
            });
            query.push(") AS v WHERE responses.id = v.column1");
        })
        .await
    }
}
