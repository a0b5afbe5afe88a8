//! The store's side of governance (SPEC 13): what a key is granted (its project, limits and budgets), the shared
//! counters that hold limits across replicas, the spend of a budget's period, and usage records.

use gateway_core::governance::{Budget, BudgetPeriod, Governance, RateLimits};
use serde::Serialize;

use super::tenancy::hash_key;
use super::{Backend, Store, StoreError};

mod usage;

pub use usage::{UsageBucket, UsageGroup, UsageQuery};

/// The most rows `prune_windows` deletes in one statement.
const PRUNE_BATCH: i64 = 10_000;

/// The condition on `rate_windows` rows whose window ended long before `$now` (an SQL expression of seconds): see
/// `Store::prune_windows`. Scopes are named `<owner>:<id>:rpm`, `…:tpm`, `…:spend:day`, `…:spend:month`.
macro_rules! ended_windows {
    ($($now:tt)+) => {
        concat!(
            "window_start > 0 AND (
                (window_start < ", $($now)+, " - 3600 AND (scope LIKE '%:rpm' OR scope LIKE '%:tpm'))
                OR (window_start < ", $($now)+, " - 172800 AND scope LIKE '%:spend:day')
                OR (window_start < ", $($now)+, " - 5356800 AND scope LIKE '%:spend:month'))"
        )
    };
}

/// A live key as the gateway admits it: its project, when it expires, and what the key and project are held to.
#[derive(Debug, Clone, PartialEq)]
pub struct KeyGrant {
    pub key_id: String,
    pub project_id: String,
    /// A revoked key is refused like an unknown one; its grant is read so that the refusal names the key's id.
    pub revoked: bool,
    /// Unix seconds; the key is refused from then on.
    pub expires_at: Option<i64>,
    pub key: Governance,
    pub project: Governance,
}

impl KeyGrant {
    /// Whether the key has expired at `now` (Unix seconds).
    pub fn expired(&self, now: i64) -> bool {
        self.expires_at.is_some_and(|at| at <= now)
    }
}

/// One model call's usage (`tool_source` `None`) or one server tool call (`tool_source` set, no tokens), as
/// recorded with the step it belongs to.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct UsageRecord {
    pub response_id: String,
    pub seq: i32,
    pub project_id: String,
    pub api_key_id: Option<String>,
    pub deployment: String,
    pub provider_kind: String,
    pub tool_source: Option<String>,
    pub input_tokens: i64,
    pub cached_tokens: i64,
    pub output_tokens: i64,
    pub reasoning_tokens: i64,
    pub cost_usd: f64,
    pub created_at: i64,
    /// The calls this record sums: 1, or more for a batch of unstored responses' usage summed into one row.
    pub calls: i64,
}

/// What a lease of a counted window gave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    pub granted: u64,
    /// What the shared window holds after the lease, every replica's leases included.
    pub used: u64,
}

/// How long the token of an addition to a counted window is kept after it was made.
const ADDITION_TOKENS_KEPT: std::time::Duration = std::time::Duration::from_secs(86_400);

/// A new token for an addition to a counted window: a UUIDv7 as 32 lowercase hex digits, which sort by the time
/// it was made (so that old ones are pruned by comparison).
pub fn addition_token() -> String {
    uuid::Uuid::now_v7().simple().to_string()
}

/// A token as [`addition_token`] would have made it at `at`: every token made a millisecond or more before `at`
/// sorts before it.
pub(crate) fn addition_token_at(at: std::time::SystemTime) -> String {
    let since = at.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let timestamp = uuid::Timestamp::from_unix(uuid::NoContext, since.as_secs(), 0);
    uuid::Uuid::new_v7(timestamp).simple().to_string()
}

/// An amount to add to a counted window, under the token that makes it count once (`Store::add_to_windows`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowAddition<'a> {
    /// Made by the replica for this part of its count, and sent again with it after a lost reply. `None` for an
    /// addition that may count more than once (reading a window by adding nothing).
    pub token: Option<&'a str>,
    pub scope: &'a str,
    pub window_start: i64,
    pub amount: u64,
}

/// A window's count plus the amount added to it, held at the most a `BIGINT` holds: an amount no limit can reach
/// (an upstream that reported absurd usage) fills its window instead of failing the statement, and with it every
/// other window written in the same batch. Amounts are never negative ([`column_amount`]).
macro_rules! saturating_sum {
    () => {
        "CASE WHEN rate_windows.used > 9223372036854775807 - excluded.used THEN 9223372036854775807
              ELSE rate_windows.used + excluded.used END"
    };
}

/// An amount to add as the column holds it: at the most `i64::MAX`, never wrapped to a negative number.
fn column_amount(amount: u64) -> i64 {
    i64::try_from(amount).unwrap_or(i64::MAX)
}

/// Adds an amount to one counted window and answers what it holds then (`$1` scope, `$2` window start, `$3` amount).
const ADD_TO_WINDOW: &str = concat!(
    "INSERT INTO rate_windows (scope, window_start, used) VALUES ($1, $2, $3)
     ON CONFLICT (scope, window_start) DO UPDATE SET used = ",
    saturating_sum!(),
    " RETURNING used"
);

/// Reads a limit column: writers keep it at zero or more; anything else reads as no limit.
fn limit(column: Option<i64>) -> Option<u64> {
    column.and_then(|n| u64::try_from(n).ok())
}

/// A key's or project's governance from its columns.
pub fn governance(
    rpm: Option<i64>,
    tpm: Option<i64>,
    max_concurrent: Option<i64>,
    budget_usd: Option<f64>,
    budget_period: Option<&str>,
) -> Governance {
    Governance {
        limits: RateLimits {
            rpm: limit(rpm),
            tpm: limit(tpm),
            max_concurrent: limit(max_concurrent),
        },
        budget: budget_usd
            .zip(budget_period.and_then(BudgetPeriod::parse))
            .map(|(usd, period)| Budget { usd, period }),
    }
}

/// A key and its project's governance, as one row.
#[derive(sqlx::FromRow)]
struct GrantRow {
    key_id: String,
    project_id: String,
    revoked: bool,
    expires_at: Option<i64>,
    k_rpm: Option<i64>,
    k_tpm: Option<i64>,
    k_concurrent: Option<i64>,
    k_usd: Option<f64>,
    k_period: Option<String>,
    p_rpm: Option<i64>,
    p_tpm: Option<i64>,
    p_concurrent: Option<i64>,
    p_usd: Option<f64>,
    p_period: Option<String>,
}

impl From<GrantRow> for KeyGrant {
    fn from(row: GrantRow) -> KeyGrant {
        KeyGrant {
            key: governance(
                row.k_rpm,
                row.k_tpm,
                row.k_concurrent,
                row.k_usd,
                row.k_period.as_deref(),
            ),
            project: governance(
                row.p_rpm,
                row.p_tpm,
                row.p_concurrent,
                row.p_usd,
                row.p_period.as_deref(),
            ),
            key_id: row.key_id,
            project_id: row.project_id,
            revoked: row.revoked,
            expires_at: row.expires_at,
        }
    }
}

/// A key joined with its project, as `GrantRow` reads it.
macro_rules! grant_select {
    ($where:literal) => {
        concat!(
            "SELECT k.id AS key_id, k.project_id, k.revoked_at IS NOT NULL AS revoked, k.expires_at,
                k.rpm_limit AS k_rpm, k.tpm_limit AS k_tpm, k.max_concurrent AS k_concurrent,
                k.budget_usd AS k_usd, k.budget_period AS k_period,
                p.rpm_limit AS p_rpm, p.tpm_limit AS p_tpm, p.max_concurrent AS p_concurrent,
                p.budget_usd AS p_usd, p.budget_period AS p_period
             FROM api_keys k JOIN projects p ON p.id = k.project_id WHERE ",
            $where
        )
    };
}

/// Postgres: takes one place of a `max_concurrent` count if it has room, and notes it as the replica's.
const PG_ACQUIRE_RUNNING: &str = "
WITH gate AS (
    INSERT INTO rate_windows (scope, window_start, used) VALUES ($1, 0, 1)
    ON CONFLICT (scope, window_start) DO UPDATE SET used = rate_windows.used + 1 WHERE rate_windows.used < $3
    RETURNING used
), mine AS (
    INSERT INTO running_counts (scope, replica_id, running) SELECT $1, $2, 1 FROM gate
    ON CONFLICT (scope, replica_id) DO UPDATE SET running = running_counts.running + 1
)
SELECT COUNT(*) FROM gate";

/// Postgres: gives back one place the replica holds; nothing when its part was taken back already. The count's
/// row is locked before the replica's part, in the order taking a place locks them, so that a give-back and a
/// take of the same count never wait for each other (a deadlock Postgres would break only after a second).
const PG_RELEASE_RUNNING: &str = "
WITH gate AS (
    SELECT 1 FROM rate_windows WHERE scope = $1 AND window_start = 0 FOR UPDATE
), mine AS (
    UPDATE running_counts SET running = running - 1
    WHERE scope = $1 AND replica_id = $2 AND running > 0 AND (SELECT COUNT(*) FROM gate) >= 0
    RETURNING 1
)
UPDATE rate_windows SET used = used - 1
WHERE scope = $1 AND window_start = 0 AND used > 0 AND EXISTS (SELECT 1 FROM mine)";

/// Postgres: sets a replica's part of a `max_concurrent` count (`$3` places), moving the count by the difference
/// from the part it had (read under the row's lock, taken after the count's, as taking a place takes them).
const PG_SET_RUNNING_PART: &str = "
WITH gate AS (
    SELECT 1 FROM rate_windows WHERE scope = $1 AND window_start = 0 FOR UPDATE
), old AS (
    SELECT COALESCE((SELECT running FROM running_counts
        WHERE scope = $1 AND replica_id = $2 AND (SELECT COUNT(*) FROM gate) >= 0 FOR UPDATE), 0) AS n
), mine AS (
    INSERT INTO running_counts (scope, replica_id, running) SELECT $1, $2, $3 FROM old
    ON CONFLICT (scope, replica_id) DO UPDATE SET running = excluded.running
)
UPDATE rate_windows SET used = GREATEST(0, used + $3 - (SELECT n FROM old))
WHERE scope = $1 AND window_start = 0";

impl Store {
    /// The grant of a key, revoked or expired or not: the caller refuses a revoked one and compares `expires_at`
    /// with its clock.
    pub async fn grant_for_key(&self, key: &str) -> Result<Option<KeyGrant>, StoreError> {
        let _timer = self.timed("project_for_key");
        let row = with_pool!(self, |pool| sqlx::query_as::<_, GrantRow>(grant_select!(
            "k.key_hash = $1"
        ))
        .bind(hash_key(key))
        .fetch_optional(pool)
        .await)?;
        Ok(row.map(KeyGrant::from))
    }

    /// The project of a live (unrevoked) key, expired or not.
    pub async fn project_for_key(&self, key: &str) -> Result<Option<String>, StoreError> {
        Ok(self
            .grant_for_key(key)
            .await?
            .filter(|grant| !grant.revoked)
            .map(|grant| grant.project_id))
    }

    /// Notes that key `key_id` was used at `now` (Unix seconds).
    pub async fn touch_api_key(&self, key_id: &str, now: i64) -> Result<(), StoreError> {
        with_pool!(self, |pool| sqlx::query(
            "UPDATE api_keys SET last_used_at = $2 WHERE id = $1"
        )
        .bind(key_id)
        .bind(now)
        .execute(pool)
        .await
        .map(drop))?;
        Ok(())
    }

    /// The grant of a key by id, revoked or not: what a response resumed on another replica is held to.
    pub async fn grant_by_key_id(&self, key_id: &str) -> Result<Option<KeyGrant>, StoreError> {
        let row = with_pool!(self, |pool| sqlx::query_as::<_, GrantRow>(grant_select!(
            "k.id = $1"
        ))
        .bind(key_id)
        .fetch_optional(pool)
        .await)?;
        Ok(row.map(KeyGrant::from))
    }

    /// Leases up to `slice` of the `limit` of a counted window (`rpm`): answers how many were granted (none when
    /// the window is used up) and what the window holds now. The shared counter passes the limit only by the part
    /// of the last slice that was not granted, which nobody uses.
    pub async fn lease_window(
        &self,
        scope: &str,
        window_start: i64,
        slice: u64,
        limit: u64,
    ) -> Result<Lease, StoreError> {
        if limit == 0 || slice == 0 {
            return Ok(Lease {
                granted: 0,
                used: limit,
            });
        }
        let used: Option<i64> = with_pool!(self, |pool| {
            sqlx::query_scalar(
            "INSERT INTO rate_windows (scope, window_start, used) VALUES ($1, $2, $3)
             ON CONFLICT (scope, window_start) DO UPDATE SET used = rate_windows.used + excluded.used
             WHERE rate_windows.used < $4
             RETURNING used"
        )
        .bind(scope)
        .bind(window_start)
        .bind(slice as i64)
        .bind(limit as i64)
        .fetch_optional(pool)
        .await
        })?;
        let Some(used) = used else {
            return Ok(Lease {
                granted: 0,
                used: limit,
            });
        };
        let used = u64::try_from(used).unwrap_or(0);
        let before = used.saturating_sub(slice);
        Ok(Lease {
            granted: slice.min(limit.saturating_sub(before)),
            used,
        })
    }

    /// Adds `amount` to a counted window (`tpm`) and answers what it holds now, every replica's part included.
    pub async fn add_to_window(
        &self,
        scope: &str,
        window_start: i64,
        amount: u64,
    ) -> Result<u64, StoreError> {
        let used: i64 = with_pool!(self, |pool| {
            sqlx::query_scalar(ADD_TO_WINDOW)
                .bind(scope)
                .bind(window_start)
                .bind(column_amount(amount))
                .fetch_one(pool)
                .await
        })?;
        Ok(u64::try_from(used).unwrap_or(0))
    }

    /// Adds each addition to its counted window in one statement (or, on the embedded store, one transaction), and
    /// answers what each window holds now, in the order given. The same window named twice gets both amounts, and
    /// both answers are its total. An addition with a token is applied once: its token is recorded with it, and an
    /// addition whose token is already recorded (sent again after its reply was lost, or named earlier in the same
    /// batch) adds nothing, but is answered its window's total; one that waits for the first sending of its token
    /// to commit adds nothing once it has.
    /// On Postgres, rows are taken in one order (tokens, then scope and window), so that two replicas' batches over
    /// the same windows wait for each other instead of deadlocking.
    pub async fn add_to_windows(
        &self,
        additions: &[WindowAddition<'_>],
    ) -> Result<Vec<u64>, StoreError> {
        let mut used: std::collections::HashMap<(String, i64), u64> =
            std::collections::HashMap::with_capacity(additions.len());
        match &self.backend {
            Backend::Postgres(pool) => answered!(self, {
                let mut tokens = Vec::with_capacity(additions.len());
                let mut scopes = Vec::with_capacity(additions.len());
                let mut starts = Vec::with_capacity(additions.len());
                let mut amounts = Vec::with_capacity(additions.len());
                // A token named twice in one batch counts once, as on the embedded store: its later additions
                // are sent without their amount, so that their windows are still answered.
                let mut seen = std::collections::HashSet::with_capacity(additions.len());
                for addition in additions {
                    let again = addition.token.is_some_and(|token| !seen.insert(token));
                    tokens.push(if again { None } else { addition.token });
                    scopes.push(addition.scope);
                    starts.push(addition.window_start);
                    amounts.push(if again {
                        0
                    } else {
                        column_amount(addition.amount)
                    });
                }
                let rows: Vec<(String, i64, i64)> = sqlx::query_as(concat!(
                    "WITH added AS (
                        SELECT * FROM UNNEST($1::text[], $2::text[], $3::bigint[], $4::bigint[])
                            AS added(token, scope, window_start, amount)
                     ), applied AS (
                        INSERT INTO counter_additions (token)
                        SELECT token FROM added WHERE token IS NOT NULL ORDER BY token
                        ON CONFLICT (token) DO NOTHING
                        RETURNING token
                     ), sums AS (
                        SELECT added.scope, added.window_start,
                               LEAST(SUM(CASE WHEN added.token IS NULL OR applied.token IS NOT NULL
                                              THEN added.amount ELSE 0 END),
                                     9223372036854775807)::bigint AS amount
                        FROM added LEFT JOIN applied ON applied.token = added.token
                        GROUP BY added.scope, added.window_start
                     )
                     INSERT INTO rate_windows (scope, window_start, used)
                     SELECT scope, window_start, amount FROM sums
                     ORDER BY scope, window_start
                     ON CONFLICT (scope, window_start) DO UPDATE SET used = ",
                    saturating_sum!(),
                    " RETURNING scope, window_start, used"
                ))
                .bind(&tokens)
                .bind(&scopes)
                .bind(&starts)
                .bind(&amounts)
                .fetch_all(pool)
                .await?;
                for (scope, start, total) in rows {
                    used.insert((scope, start), u64::try_from(total).unwrap_or(0));
                }
            }),
            Backend::Sqlite(pool) => {
                let mut totals: std::collections::BTreeMap<(&str, i64), u64> =
                    std::collections::BTreeMap::new();
                let mut transaction = pool.begin().await?;
                for addition in additions {
                    let applied = match addition.token {
                        None => true,
                        Some(token) => {
                            sqlx::query(
                                "INSERT INTO counter_additions (token) VALUES ($1)
                                 ON CONFLICT (token) DO NOTHING",
                            )
                            .bind(token)
                            .execute(&mut *transaction)
                            .await?
                            .rows_affected()
                                == 1
                        }
                    };
                    let total = totals
                        .entry((addition.scope, addition.window_start))
                        .or_default();
                    if applied {
                        *total = total.saturating_add(addition.amount);
                    }
                }
                for (&(scope, start), &amount) in &totals {
                    let total: i64 = sqlx::query_scalar(ADD_TO_WINDOW)
                        .bind(scope)
                        .bind(start)
                        .bind(column_amount(amount))
                        .fetch_one(&mut *transaction)
                        .await?;
                    used.insert((scope.to_owned(), start), u64::try_from(total).unwrap_or(0));
                }
                transaction.commit().await?;
            }
        }
        additions
            .iter()
            .map(|addition| {
                used.get(&(addition.scope.to_owned(), addition.window_start))
                    .copied()
                    .ok_or_else(|| {
                        StoreError::Corrupt(format!(
                            "no total answered for the window {} at {}",
                            addition.scope, addition.window_start
                        ))
                    })
            })
            .collect()
    }

    /// Takes one place of the `max_concurrent` count `scope` for `replica`, if fewer than `limit` run: `false`
    /// when it is full. One statement on Postgres (the counter's row lock orders replicas).
    pub async fn acquire_running(
        &self,
        scope: &str,
        replica: &str,
        limit: u64,
    ) -> Result<bool, StoreError> {
        if limit == 0 {
            return Ok(false);
        }
        match &self.backend {
            Backend::Postgres(pool) => answered!(self, {
                let taken: i64 = sqlx::query_scalar(PG_ACQUIRE_RUNNING)
                    .bind(scope)
                    .bind(replica)
                    .bind(limit as i64)
                    .fetch_one(pool)
                    .await?;
                Ok(taken > 0)
            }),
            Backend::Sqlite(pool) => {
                let mut tx = pool.begin().await?;
                let gate: Option<i64> = sqlx::query_scalar(
                    "INSERT INTO rate_windows (scope, window_start, used) VALUES ($1, 0, 1)
                     ON CONFLICT (scope, window_start) DO UPDATE SET used = rate_windows.used + 1
                     WHERE rate_windows.used < $2
                     RETURNING used",
                )
                .bind(scope)
                .bind(limit as i64)
                .fetch_optional(&mut *tx)
                .await?;
                if gate.is_none() {
                    return Ok(false);
                }
                sqlx::query(
                    "INSERT INTO running_counts (scope, replica_id, running) VALUES ($1, $2, 1)
                     ON CONFLICT (scope, replica_id) DO UPDATE SET running = running_counts.running + 1",
                )
                .bind(scope)
                .bind(replica)
                .execute(&mut *tx)
                .await?;
                tx.commit().await?;
                Ok(true)
            }
        }
    }

    /// Gives back a place `replica` took with [`acquire_running`](Store::acquire_running); nothing when its part
    /// of the count was taken back already (its lease lapsed meanwhile).
    pub async fn release_running(&self, scope: &str, replica: &str) -> Result<(), StoreError> {
        match &self.backend {
            Backend::Postgres(pool) => answered!(self, {
                sqlx::query(PG_RELEASE_RUNNING)
                    .bind(scope)
                    .bind(replica)
                    .execute(pool)
                    .await?;
            }),
            Backend::Sqlite(pool) => {
                let mut tx = pool.begin().await?;
                let mine = sqlx::query(
                    "UPDATE running_counts SET running = running - 1
                     WHERE scope = $1 AND replica_id = $2 AND running > 0",
                )
                .bind(scope)
                .bind(replica)
                .execute(&mut *tx)
                .await?;
                if mine.rows_affected() > 0 {
                    sqlx::query(
                        "UPDATE rate_windows SET used = used - 1
                         WHERE scope = $1 AND window_start = 0 AND used > 0",
                    )
                    .bind(scope)
                    .execute(&mut *tx)
                    .await?;
                }
                tx.commit().await?;
            }
        }
        Ok(())
    }

    /// Sets replica `replica`'s part of count `scope` to `held` places, and moves the count by the difference:
    /// how a replica repairs a count it is in doubt about (a take whose answer was lost, a give-back that failed).
    pub async fn set_running_part(
        &self,
        scope: &str,
        replica: &str,
        held: u64,
    ) -> Result<(), StoreError> {
        let held = i64::try_from(held).unwrap_or(i64::MAX);
        match &self.backend {
            Backend::Postgres(pool) => answered!(self, {
                sqlx::query(PG_SET_RUNNING_PART)
                    .bind(scope)
                    .bind(replica)
                    .bind(held)
                    .execute(pool)
                    .await?;
            }),
            Backend::Sqlite(pool) => {
                let mut tx = pool.begin().await?;
                let old: Option<i64> = sqlx::query_scalar(
                    "SELECT running FROM running_counts WHERE scope = $1 AND replica_id = $2",
                )
                .bind(scope)
                .bind(replica)
                .fetch_optional(&mut *tx)
                .await?;
                sqlx::query(
                    "INSERT INTO running_counts (scope, replica_id, running) VALUES ($1, $2, $3)
                     ON CONFLICT (scope, replica_id) DO UPDATE SET running = excluded.running",
                )
                .bind(scope)
                .bind(replica)
                .bind(held)
                .execute(&mut *tx)
                .await?;
                sqlx::query(
                    "UPDATE rate_windows SET used = MAX(0, used + $2) WHERE scope = $1 AND window_start = 0",
                )
                .bind(scope)
                .bind(held - old.unwrap_or(0))
                .execute(&mut *tx)
                .await?;
                tx.commit().await?;
            }
        }
        Ok(())
    }

    /// Deletes the counted windows that ended long ago: a minute of `rpm` or `tpm` an hour after it ended, a day of
    /// spend two days after it began, a month of spend 62 days after. Counts that never end (`running`, spend in
    /// `total`, at window 0) are kept. Deletes at most `PRUNE_BATCH` rows a statement, until none is left, so that
    /// no statement holds many locks; nobody writes such old windows any more. Then, the same way, the tokens of
    /// additions made more than a day ago. Answers how many rows it deleted.
    pub async fn prune_windows(&self) -> Result<u64, StoreError> {
        let _timer = self.timed("prune_windows");
        let delete = match &self.backend {
            Backend::Postgres(_) => concat!(
                "DELETE FROM rate_windows WHERE ctid = ANY(ARRAY(SELECT ctid FROM rate_windows WHERE ",
                ended_windows!(concat!("(", pg_now_ms!(), " / 1000)")),
                " LIMIT $1))"
            ),
            Backend::Sqlite(_) => concat!(
                "DELETE FROM rate_windows WHERE rowid IN (SELECT rowid FROM rate_windows WHERE ",
                ended_windows!(concat!("(", sqlite_now_ms!(), " / 1000)")),
                " LIMIT $1)"
            ),
        };
        let mut deleted = 0;
        loop {
            let done = with_pool!(self, |pool| sqlx::query(delete)
                .bind(PRUNE_BATCH)
                .execute(pool)
                .await
                .map(|done| done.rows_affected()))?;
            deleted += done;
            if done < PRUNE_BATCH as u64 {
                break;
            }
        }
        // The tokens of additions made more than a day ago: an addition is sent again within its window's
        // sync, or once the store answers again, and a day is far beyond either.
        let before = addition_token_at(std::time::SystemTime::now() - ADDITION_TOKENS_KEPT);
        let delete = match &self.backend {
            Backend::Postgres(_) => {
                "DELETE FROM counter_additions WHERE token = ANY(ARRAY(
                    SELECT token FROM counter_additions WHERE token < $2 LIMIT $1))"
            }
            Backend::Sqlite(_) => {
                "DELETE FROM counter_additions WHERE token IN (
                    SELECT token FROM counter_additions WHERE token < $2 LIMIT $1)"
            }
        };
        loop {
            let done = with_pool!(self, |pool| sqlx::query(delete)
                .bind(PRUNE_BATCH)
                .bind(&before)
                .execute(pool)
                .await
                .map(|done| done.rows_affected()))?;
            deleted += done;
            if done < PRUNE_BATCH as u64 {
                return Ok(deleted);
            }
        }
    }

    /// Takes back from every `max_concurrent` count the places held by replicas that have not beaten for
    /// `lease_ms` (they crashed or were cut off: their runs are taken over, and counted again there). Answers how
    /// many replicas' parts were taken back.
    pub async fn reclaim_running(&self, lease_ms: i64) -> Result<u64, StoreError> {
        let _timer = self.timed("reclaim_running");
        match &self.backend {
            Backend::Postgres(pool) => answered!(self, {
                // The counts' rows are locked first, in one order, as every other statement on places locks
                // a count before a replica's part of it; a part whose replica died meanwhile waits for the
                // next sweep.
                let forgotten: i64 = sqlx::query_scalar(concat!(
                    "WITH gates AS (
                        SELECT g.scope FROM rate_windows g WHERE g.window_start = 0 AND g.scope IN (
                            SELECT c.scope FROM running_counts c WHERE NOT EXISTS (
                                SELECT 1 FROM replicas p WHERE p.id = c.replica_id AND p.heartbeat_at > ",
                    pg_now_ms!(),
                    " - $1))
                        ORDER BY g.scope FOR UPDATE
                    ), dead AS (
                        DELETE FROM running_counts c
                        WHERE (SELECT COUNT(*) FROM gates) >= 0 AND c.scope IN (SELECT scope FROM gates) AND NOT EXISTS (
                            SELECT 1 FROM replicas p WHERE p.id = c.replica_id AND p.heartbeat_at > ",
                    pg_now_ms!(),
                    " - $1)
                        RETURNING scope, running
                    ), totals AS (
                        SELECT scope, SUM(running) AS n FROM dead GROUP BY scope
                    ), subtracted AS (
                        UPDATE rate_windows g SET used = GREATEST(0, g.used - t.n)
                        FROM totals t WHERE g.scope = t.scope AND g.window_start = 0
                    )
                    SELECT COUNT(*) FROM dead"
                ))
                .bind(lease_ms)
                .fetch_one(pool)
                .await?;
                Ok(forgotten as u64)
            }),
            Backend::Sqlite(pool) => {
                // One process serves the embedded store: nothing runs beside this transaction.
                let dead = concat!(
                    "NOT EXISTS (SELECT 1 FROM replicas p WHERE p.id = c.replica_id AND p.heartbeat_at > ",
                    sqlite_now_ms!(),
                    " - $1)"
                );
                let mut tx = pool.begin().await?;
                sqlx::query(&format!(
                    "UPDATE rate_windows SET used = MAX(0, used - (
                        SELECT COALESCE(SUM(c.running), 0) FROM running_counts c
                        WHERE c.scope = rate_windows.scope AND {dead}))
                     WHERE window_start = 0"
                ))
                .bind(lease_ms)
                .execute(&mut *tx)
                .await?;
                let forgotten =
                    sqlx::query(&format!("DELETE FROM running_counts AS c WHERE {dead}"))
                        .bind(lease_ms)
                        .execute(&mut *tx)
                        .await?
                        .rows_affected();
                tx.commit().await?;
                Ok(forgotten)
            }
        }
    }

    /// Records usage outside a step's write (the usage of `store: false` responses, in batches); a record
    /// already there is kept.
    pub async fn record_usage(&self, records: &[UsageRecord]) -> Result<(), StoreError> {
        if records.is_empty() {
            return Ok(());
        }
        let _timer = self.timed("record_usage");
        match &self.backend {
            Backend::Postgres(pool) => answered!(self, {
                sqlx::query(concat!(
                    "INSERT INTO usage_records SELECT * FROM ",
                    usage_recordset!("$1"),
                    " ON CONFLICT DO NOTHING"
                ))
                .bind(serde_json::to_value(records).unwrap_or_default())
                .execute(pool)
                .await?;
            }),
            Backend::Sqlite(pool) => {
                let records: Vec<&UsageRecord> = records.iter().collect();
                let mut tx = pool.begin().await?;
                super::multirow::insert_usage(&mut tx, &records).await?;
                tx.commit().await?;
            }
        }
        Ok(())
    }
}
