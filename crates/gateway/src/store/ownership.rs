//! Who drives each running response (SPEC 9): replicas with heartbeats, ownership, takeover, release on
//! shutdown and cancel requests (the notifications between replicas are `notify`'s).
//!
//! Postgres is the coordination engine: a replica owns the responses it drives for as long as it keeps beating
//! (its lease); any replica takes over the running responses of one that stopped beating, claiming them with
//! `FOR UPDATE SKIP LOCKED` so that two replicas never take the same one. Times are milliseconds of the
//! database's clock, so replicas whose clocks disagree still agree on who is alive. The embedded store serves
//! one process, which takes over at start-up whatever an earlier process left unfinished.

use super::{Backend, Store, StoreError};

/// A running response a replica took to drive.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct Claimed {
    pub id: String,
    pub project_id: String,
    /// Whether another replica drove it before (and stopped beating); `false` for a queued response nobody took.
    pub taken_over: bool,
    /// The epoch of this claim: every write of the run is fenced on it (SPEC 9).
    pub epoch: i64,
}

/// Who drives a running response now.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct Claim {
    pub id: String,
    /// `None` while no replica drives it (queued, or released).
    pub owner: Option<String>,
    pub epoch: i64,
    /// Whether it is still queued or in progress.
    pub running: bool,
}

/// The key or project whose `max_concurrent` count a queued response waits for.
#[derive(Debug, Clone, Copy)]
pub enum Alike<'a> {
    Key(&'a str),
    Project(&'a str),
}

/// What a heartbeat found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Beat {
    /// The replica's previous beat was within the lease: no other replica can have taken any of its responses
    /// since. `false` after a pause, a partition or a store outage longer than the lease (or on the first beat).
    pub lease_kept: bool,
}

/// How many background responses wait for a replica, and since when the oldest does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QueueDepth {
    pub queued: i64,
    /// `created_at` (seconds) of the oldest queued response.
    pub oldest_created_at: Option<i64>,
}

impl Store {
    /// Records that `replica` is alive now (registering it the first time), and says whether its lease held since
    /// its previous beat.
    pub async fn heartbeat(&self, replica: &str, lease_ms: i64) -> Result<Beat, StoreError> {
        let _timer = self.timed("heartbeat");
        // The previous beat is read in the transaction that replaces it; only this replica beats its row (Postgres
        // locks it all the same; the embedded store's one writer needs no lock).
        let read_previous = match &self.backend {
            Backend::Postgres(_) => "SELECT heartbeat_at FROM replicas WHERE id = $1 FOR UPDATE",
            Backend::Sqlite(_) => "SELECT heartbeat_at FROM replicas WHERE id = $1",
        };
        let beat = with_clock!(
            self,
            "INSERT INTO replicas (id, started_at, heartbeat_at) VALUES ($1, ",
            ", ",
            ") ON CONFLICT (id) DO UPDATE SET heartbeat_at = excluded.heartbeat_at RETURNING heartbeat_at"
        );
        let previous: Option<i64> = with_pool!(self, |pool| {
            let mut tx = pool.begin().await?;
            let previous: Option<i64> = sqlx::query_scalar(read_previous)
                .bind(replica)
                .fetch_optional(&mut *tx)
                .await?;
            let now: i64 = sqlx::query_scalar(beat)
                .bind(replica)
                .fetch_one(&mut *tx)
                .await?;
            tx.commit().await?;
            Ok::<_, sqlx::Error>(previous.map(|at| now - at))
        })?;
        Ok(Beat {
            lease_kept: previous.is_some_and(|since| since < lease_ms),
        })
    }

    /// Who drives each of the stored responses among `ids` now, under which claim epoch, and whether it still
    /// runs (a deleted one, or one not stored yet, is left out). On Postgres the rows are locked while read (in the
    /// order claims lock them, so the two never deadlock), so a claim by another replica that is under way is seen
    /// once it committed.
    pub async fn claims_of(&self, ids: &[String]) -> Result<Vec<Claim>, StoreError> {
        let _timer = self.timed("claims_of");
        let claims: Vec<Claim> = match &self.backend {
            Backend::Postgres(pool) => answered!(self, {
                sqlx::query_as(
                    "SELECT id, owner, claim_epoch AS epoch, status IN ('queued', 'in_progress') AS running
                     FROM responses WHERE id = ANY($1) ORDER BY created_at, id FOR UPDATE",
                )
                .bind(ids)
                .fetch_all(pool)
                .await?
            }),
            Backend::Sqlite(pool) => {
                let mut claims = Vec::with_capacity(ids.len());
                for id in ids {
                    let claim: Option<Claim> = sqlx::query_as(
                        "SELECT id, owner, claim_epoch AS epoch, status IN ('queued', 'in_progress') AS running
                         FROM responses WHERE id = $1",
                    )
                    .bind(id)
                    .fetch_optional(pool)
                    .await?;
                    claims.extend(claim);
                }
                claims
            }
        };
        Ok(claims)
    }

    /// The running responses `replica` owns, each with the claim epoch it owns it under.
    pub async fn owned_by(&self, replica: &str) -> Result<Vec<(String, i64)>, StoreError> {
        let _timer = self.timed("owned_by");
        let owned = with_pool!(self, |pool| sqlx::query_as(
            "SELECT id, claim_epoch FROM responses
             WHERE owner = $1 AND status IN ('queued', 'in_progress')"
        )
        .bind(replica)
        .fetch_all(pool)
        .await)?;
        Ok(owned)
    }

    /// Takes up to `limit` running responses that no live replica drives, oldest first (a queued one put off to wait
    /// for a running place counts from when it may start, so that those queued meanwhile go before it): queued ones nobody took,
    /// and those whose owner has not beaten for `lease_ms`. Two replicas never take the same one, and a replica
    /// never takes its own: a process paused past its lease (or whose clock jumped) that comes back runs them
    /// still, and would otherwise start them again beside those runs (what it owns but runs nowhere it hands
    /// over first, `hand_over_unrun`).
    pub async fn claim(
        &self,
        replica: &str,
        lease_ms: i64,
        limit: i64,
    ) -> Result<Vec<Claimed>, StoreError> {
        let _timer = self.timed("claim");
        let claimed = match &self.backend {
            Backend::Postgres(pool) => answered!(self, {
                sqlx::query_as(concat!(
                    "WITH candidates AS (
                        SELECT r.id, r.owner FROM responses r
                        WHERE r.status IN ('queued', 'in_progress') AND r.owner IS DISTINCT FROM $1
                          AND (r.start_after IS NULL OR r.start_after <= ",
                    pg_now_ms!(),
                    ")
                          AND (r.owner IS NULL OR NOT EXISTS (
                              SELECT 1 FROM replicas p
                              WHERE p.id = r.owner AND p.heartbeat_at > ",
                    pg_now_ms!(),
                    " - $2))
                        ORDER BY COALESCE(r.start_after, r.created_at * 1000), r.id
                        LIMIT $3
                        FOR UPDATE OF r SKIP LOCKED)
                    UPDATE responses r SET owner = $1, claim_epoch = r.claim_epoch + 1
                    FROM candidates c WHERE r.id = c.id
                    RETURNING r.id, r.project_id, c.owner IS NOT NULL AS taken_over, r.claim_epoch AS epoch"
                ))
                .bind(replica)
                .bind(lease_ms)
                .bind(limit)
                .fetch_all(pool)
                .await?
            }),
            Backend::Sqlite(pool) => {
                // One process writes this store: the candidates read in the transaction stay candidates.
                let mut tx = pool.begin().await?;
                let mut candidates: Vec<Claimed> = sqlx::query_as(concat!(
                    "SELECT r.id, r.project_id, r.owner IS NOT NULL AS taken_over, r.claim_epoch + 1 AS epoch
                     FROM responses r
                     WHERE r.status IN ('queued', 'in_progress') AND r.owner IS NOT $3
                       AND (r.start_after IS NULL OR r.start_after <= ",
                    sqlite_now_ms!(),
                    ")
                       AND (r.owner IS NULL OR NOT EXISTS (
                           SELECT 1 FROM replicas p WHERE p.id = r.owner AND p.heartbeat_at > ",
                    sqlite_now_ms!(),
                    " - $1))
                     ORDER BY COALESCE(r.start_after, r.created_at * 1000), r.id LIMIT $2"
                ))
                .bind(lease_ms)
                .bind(limit)
                .bind(replica)
                .fetch_all(&mut *tx)
                .await?;
                for candidate in &mut candidates {
                    candidate.epoch = sqlx::query_scalar(
                        "UPDATE responses SET owner = $2, claim_epoch = claim_epoch + 1 WHERE id = $1
                         RETURNING claim_epoch",
                    )
                    .bind(&candidate.id)
                    .bind(replica)
                    .fetch_one(&mut *tx)
                    .await?;
                }
                tx.commit().await?;
                candidates
            }
        };
        Ok(claimed)
    }

    /// Forgets every other replica: the embedded store serves one process, so any other that used it is gone,
    /// and what it left unfinished may be taken at once.
    pub async fn forget_other_replicas(&self, replica: &str) -> Result<(), StoreError> {
        with_pool!(self, |pool| sqlx::query(
            "DELETE FROM replicas WHERE id <> $1"
        )
        .bind(replica)
        .execute(pool)
        .await
        .map(|done| done.rows_affected()))?;
        Ok(())
    }

    /// Gives up every running response `replica` drives and forgets the replica (a graceful shutdown): another
    /// replica takes them over without waiting for the lease to expire. Returns how many it gave up.
    pub async fn release(&self, replica: &str) -> Result<u64, StoreError> {
        let _timer = self.timed("release");
        let released = with_pool!(self, |pool| {
            let mut tx = pool.begin().await?;
            let released = sqlx::query(
                "UPDATE responses SET owner = NULL
                 WHERE owner = $1 AND status IN ('queued', 'in_progress')",
            )
            .bind(replica)
            .execute(&mut *tx)
            .await?
            .rows_affected();
            sqlx::query("DELETE FROM replicas WHERE id = $1")
                .bind(replica)
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
            Ok::<u64, sqlx::Error>(released)
        })?;
        Ok(released)
    }

    /// Gives up one running response `replica` drives under claim `epoch`, so that a replica resumes it from its
    /// stored steps. A later claim of the same response (by this replica too) is left alone.
    pub async fn release_one(&self, id: &str, replica: &str, epoch: i64) -> Result<(), StoreError> {
        with_pool!(self, |pool| {
            sqlx::query(
            "UPDATE responses SET owner = NULL
             WHERE id = $1 AND owner = $2 AND claim_epoch = $3 AND status IN ('queued', 'in_progress')"
        )
        .bind(id)
        .bind(replica)
        .bind(epoch)
        .execute(pool)
        .await
        .map(|done| done.rows_affected())
        })?;
        Ok(())
    }

    /// Gives back a queued response that `replica` claimed under `epoch` and could not start, to be taken again no
    /// sooner than `wait_ms` from now, by the database's clock. When its key's or project's `max_concurrent` was
    /// full (`alike` names that key or project), it puts off the other queued responses of that key or project as
    /// long: each would meet the same full count, and the claims, oldest first by when each may start, take
    /// others' meanwhile. `false`, and nothing changed, when it was asked to cancel meanwhile (it is started, to end
    /// at once) or is not this claim's any more.
    pub async fn defer_start(
        &self,
        id: &str,
        replica: &str,
        epoch: i64,
        wait_ms: i64,
        alike: Option<Alike<'_>>,
    ) -> Result<bool, StoreError> {
        let this = with_clock!(
            self,
            "UPDATE responses SET owner = NULL, start_after = ",
            " + $4 WHERE id = $1 AND owner = $2 AND claim_epoch = $3 AND status = 'queued'
               AND NOT cancel_requested"
        );
        let others = alike.map(|alike| match alike {
            // Only those not put off already: the first refusal of a round puts the backlog off, and the others
            // of the same round (a claim takes several at once) touch nothing.
            Alike::Key(_) => with_clock!(
                self,
                "UPDATE responses SET start_after = ",
                " + $2 WHERE status = 'queued' AND owner IS NULL AND api_key_id = $1 AND NOT cancel_requested
                   AND (start_after IS NULL OR start_after <= ",
                ")"
            ),
            Alike::Project(_) => with_clock!(
                self,
                "UPDATE responses SET start_after = ",
                " + $2 WHERE status = 'queued' AND owner IS NULL AND project_id = $1 AND NOT cancel_requested
                   AND (start_after IS NULL OR start_after <= ",
                ")"
            ),
        });
        let owner = alike.map(|(Alike::Key(owner) | Alike::Project(owner))| owner);
        let deferred = with_pool!(self, |pool| {
            let deferred = sqlx::query(this)
                .bind(id)
                .bind(replica)
                .bind(epoch)
                .bind(wait_ms)
                .execute(pool)
                .await?
                .rows_affected()
                > 0;
            if let (true, Some(others)) = (deferred, others) {
                sqlx::query(others)
                    .bind(owner)
                    .bind(wait_ms)
                    .execute(pool)
                    .await?;
            }
            Ok::<_, sqlx::Error>(deferred)
        })?;
        Ok(deferred)
    }

    /// The running responses `replica` drives that a cancel (or delete) asked to stop: the fallback for a
    /// notification that did not arrive.
    pub async fn cancels_requested(&self, replica: &str) -> Result<Vec<String>, StoreError> {
        let ids = with_pool!(self, |pool| sqlx::query_scalar(
            "SELECT id FROM responses
             WHERE owner = $1 AND cancel_requested AND status IN ('queued', 'in_progress')"
        )
        .bind(replica)
        .fetch_all(pool)
        .await)?;
        Ok(ids)
    }

    /// Asks a running response of `project_id` to stop; `false` when none is running under that id.
    pub async fn request_cancel(&self, project_id: &str, id: &str) -> Result<bool, StoreError> {
        let updated = with_pool!(self, |pool| sqlx::query(
            "UPDATE responses SET cancel_requested = TRUE
             WHERE id = $1 AND project_id = $2 AND status IN ('queued', 'in_progress')"
        )
        .bind(id)
        .bind(project_id)
        .execute(pool)
        .await
        .map(|done| done.rows_affected()))?;
        Ok(updated > 0)
    }

    /// The background responses waiting for a replica.
    pub async fn queue_depth(&self) -> Result<QueueDepth, StoreError> {
        let (queued, oldest_created_at): (i64, Option<i64>) = with_pool!(self, |pool| {
            sqlx::query_as(
                "SELECT COUNT(*), MIN(created_at) FROM responses WHERE status = 'queued'",
            )
            .fetch_one(pool)
            .await
        })?;
        Ok(QueueDepth {
            queued,
            oldest_created_at,
        })
    }
}
