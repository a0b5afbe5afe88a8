//! Webhook endpoints per project and the outbox of their deliveries (SPEC 15): deliveries are written when a
//! background response ends, taken by one replica at a time under a lock that lapses by the database's clock,
//! and marked delivered, retried later, or given up.

use serde_json::Value;

use super::{Store, StoreError};

/// A registered endpoint.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct WebhookEndpoint {
    pub id: String,
    pub project_id: String,
    pub url: String,
    /// Event type names, as a JSON array.
    pub events: Value,
    pub secret: String,
    pub created_at: i64,
}

impl WebhookEndpoint {
    /// Whether the endpoint is sent events of type `event`.
    pub fn wants(&self, event: &str) -> bool {
        self.events
            .as_array()
            .is_some_and(|events| events.iter().any(|e| e == event))
    }
}

/// A delivery as listed for an operator.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct DeliveryRow {
    pub id: String,
    pub event_id: String,
    pub event_type: String,
    pub response_id: String,
    pub status: String,
    pub attempts: i64,
    pub next_attempt_at: i64,
    pub last_error: Option<String>,
    pub last_status: Option<i64>,
    pub created_at: i64,
    pub delivered_at: Option<i64>,
}

/// A delivery a replica took: what to send, where, and the state of its response now.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct DueDelivery {
    pub id: String,
    pub event_id: String,
    pub event_type: String,
    pub response_id: String,
    pub payload: Value,
    /// Tries so far, this one included.
    pub attempts: i64,
    pub url: String,
    pub secret: String,
    /// The response's status now; `None` when it was deleted.
    pub response_status: Option<String>,
    /// When this take's lock lapses, by the database's clock: the try is recorded only while the delivery is
    /// still held under it, so that a replica that outlived its lock (paused, or slow) records nothing over the
    /// try of the replica that took the delivery after it.
    pub locked_until: i64,
}

/// How a try ended.
#[derive(Debug, Clone, PartialEq)]
pub enum TryOutcome {
    Delivered {
        status: u16,
    },
    /// Failed; tried again after `retry_in_ms` unless the tries are spent (`give_up`).
    Failed {
        status: Option<u16>,
        error: String,
        retry_in_ms: i64,
        give_up: bool,
    },
    /// Its response has not ended yet (its ending is being written): looked at again after `retry_in_ms`,
    /// without counting a try.
    NotYet {
        retry_in_ms: i64,
    },
    /// Its response ended otherwise than the event says (resumed elsewhere after a crash, to another end).
    Superseded,
}

impl Store {
    pub async fn create_webhook_endpoint(
        &self,
        endpoint: &WebhookEndpoint,
    ) -> Result<(), StoreError> {
        let _timer = self.timed("create_webhook_endpoint");
        with_pool!(self, |pool| sqlx::query(
            "INSERT INTO webhook_endpoints (id, project_id, url, events, secret, created_at)
             VALUES ($1, $2, $3, $4, $5, $6)",
        )
        .bind(&endpoint.id)
        .bind(&endpoint.project_id)
        .bind(&endpoint.url)
        .bind(&endpoint.events)
        .bind(&endpoint.secret)
        .bind(endpoint.created_at)
        .execute(pool)
        .await
        .map(drop))?;
        Ok(())
    }

    /// The endpoints of `project_id`, oldest first.
    pub async fn webhook_endpoints(
        &self,
        project_id: &str,
    ) -> Result<Vec<WebhookEndpoint>, StoreError> {
        let _timer = self.timed("webhook_endpoints");
        Ok(with_pool!(self, |pool| {
            sqlx::query_as::<_, WebhookEndpoint>(
                "SELECT id, project_id, url, events, secret, created_at FROM webhook_endpoints
             WHERE project_id = $1 ORDER BY created_at, id",
            )
            .bind(project_id)
            .fetch_all(pool)
            .await?
        }))
    }

    /// Deletes an endpoint of `project_id` and its deliveries; whether there was one.
    pub async fn delete_webhook_endpoint(
        &self,
        project_id: &str,
        id: &str,
    ) -> Result<bool, StoreError> {
        let _timer = self.timed("delete_webhook_endpoint");
        self.delete_with_children(
            &[],
            "DELETE FROM webhook_endpoints WHERE id = $1 AND project_id = $2",
            &["DELETE FROM webhook_deliveries WHERE endpoint_id = $1"],
            id,
            project_id,
        )
        .await
    }

    /// Queues the event of a response's ending for every endpoint of `project_id` that wants it; an event queued
    /// already for an endpoint is kept as it is.
    pub async fn enqueue_webhook_event(
        &self,
        project_id: &str,
        response_id: &str,
        event_id: &str,
        event_type: &str,
        payload: &Value,
        now: i64,
    ) -> Result<usize, StoreError> {
        let endpoints = self.webhook_endpoints(project_id).await?;
        let wanted: Vec<&WebhookEndpoint> =
            endpoints.iter().filter(|e| e.wants(event_type)).collect();
        if wanted.is_empty() {
            return Ok(0);
        }
        let _timer = self.timed("enqueue_webhook_event");
        // Only for an endpoint still there: one deleted since it was read queues nothing, rather than failing the
        // ending of the response on its foreign key. Only for a response still there: a run that learns of its
        // response's delete too late (it was stopped, and ends all the same) queues nothing for it. On Postgres
        // the response's row is read under a share lock, so a delete under way (which locks the row first) is
        // waited for and then seen.
        macro_rules! insert {
            ($now:expr, $lock:literal) => {
                concat!(
                    "INSERT INTO webhook_deliveries (id, endpoint_id, project_id, event_id, event_type,
                        response_id, payload, status, attempts, next_attempt_at, created_at)
                     SELECT $1, e.id, $3, $4, $5, $6, $7, 'pending', 0, ",
                    $now,
                    ", $8 FROM webhook_endpoints e WHERE e.id = $2
                        AND EXISTS (SELECT 1 FROM responses r WHERE r.id = $6",
                    $lock,
                    ") ON CONFLICT (endpoint_id, event_id) DO NOTHING"
                )
            };
        }
        let insert = match &self.backend {
            super::Backend::Postgres(_) => insert!(pg_now_ms!(), " FOR SHARE"),
            super::Backend::Sqlite(_) => insert!(sqlite_now_ms!(), ""),
        };
        with_pool!(self, |pool| {
            let mut tx = pool.begin().await?;
            for endpoint in &wanted {
                sqlx::query(insert)
                    .bind(crate::ids::new_id("whd"))
                    .bind(&endpoint.id)
                    .bind(project_id)
                    .bind(event_id)
                    .bind(event_type)
                    .bind(response_id)
                    .bind(payload)
                    .bind(now)
                    .execute(&mut *tx)
                    .await?;
            }
            tx.commit().await
        })?;
        Ok(wanted.len())
    }

    /// Takes up to `limit` deliveries that are due and held by nobody, for `lock_ms` by the database's clock,
    /// counting the try, and reads what to send, in one transaction; two replicas never take the same one while
    /// its lock holds.
    pub async fn take_due_deliveries(
        &self,
        limit: i64,
        lock_ms: i64,
    ) -> Result<Vec<DueDelivery>, StoreError> {
        let _timer = self.timed("take_due_deliveries");
        let take = match &self.backend {
            super::Backend::Postgres(_) => concat!(
                "WITH clock AS (SELECT ",
                pg_now_ms!(),
                " AS now)
                 UPDATE webhook_deliveries SET locked_until = (SELECT now FROM clock) + $2, attempts = attempts + 1
                 WHERE id IN (SELECT id FROM webhook_deliveries
                     WHERE status = 'pending' AND next_attempt_at <= (SELECT now FROM clock)
                       AND (locked_until IS NULL OR locked_until < (SELECT now FROM clock))
                     ORDER BY next_attempt_at LIMIT $1 FOR UPDATE SKIP LOCKED)
                 RETURNING id, locked_until"
            ),
            super::Backend::Sqlite(_) => concat!(
                "WITH clock AS (SELECT ",
                sqlite_now_ms!(),
                " AS now)
                 UPDATE webhook_deliveries SET locked_until = (SELECT now FROM clock) + $2, attempts = attempts + 1
                 WHERE id IN (SELECT id FROM webhook_deliveries
                     WHERE status = 'pending' AND next_attempt_at <= (SELECT now FROM clock)
                       AND (locked_until IS NULL OR locked_until < (SELECT now FROM clock))
                     ORDER BY next_attempt_at LIMIT $1)
                 RETURNING id, locked_until"
            ),
        };
        // One transaction: a take whose reads fail leaves nothing locked and no try counted.
        let due = with_pool!(self, |pool| {
            let mut tx = pool.begin().await?;
            let taken: Vec<(String, i64)> = sqlx::query_as(take)
                .bind(limit)
                .bind(lock_ms)
                .fetch_all(&mut *tx)
                .await?;
            let mut due = Vec::with_capacity(taken.len());
            for (id, locked_until) in taken {
                let found = sqlx::query_as::<_, DueDelivery>(
                    "SELECT d.id, d.event_id, d.event_type, d.response_id, d.payload,
                        CAST(d.attempts AS BIGINT) AS attempts, e.url, e.secret, r.status AS response_status,
                        CAST($2 AS BIGINT) AS locked_until
                     FROM webhook_deliveries d JOIN webhook_endpoints e ON e.id = d.endpoint_id
                     LEFT JOIN responses r ON r.id = d.response_id
                     WHERE d.id = $1",
                )
                .bind(&id)
                .bind(locked_until)
                .fetch_optional(&mut *tx)
                .await?;
                due.extend(found);
            }
            tx.commit().await?;
            Ok::<_, sqlx::Error>(due)
        })?;
        Ok(due)
    }

    /// Records how a try of `delivery` ended, and lets it go; only while the delivery is held under the lock of
    /// that take. Whether it was recorded: not when the lock had lapsed and another replica took the delivery
    /// since (its try, not this one, is recorded).
    pub async fn record_delivery_try(
        &self,
        delivery: &DueDelivery,
        outcome: &TryOutcome,
    ) -> Result<bool, StoreError> {
        let _timer = self.timed("record_delivery_try");
        let (id, lock) = (&delivery.id, delivery.locked_until);
        let recorded = match outcome {
            TryOutcome::Delivered { status } => {
                let sql = with_clock!(
                    self,
                    "UPDATE webhook_deliveries SET status = 'delivered', locked_until = NULL, last_error = NULL,
                        last_status = $2, delivered_at = (",
                    ") / 1000 WHERE id = $1 AND locked_until = $3"
                );
                with_pool!(self, |pool| sqlx::query(sql)
                    .bind(id)
                    .bind(i64::from(*status))
                    .bind(lock)
                    .execute(pool)
                    .await
                    .map(|done| done.rows_affected()))?
            }
            TryOutcome::Failed {
                status,
                error,
                retry_in_ms,
                give_up,
            } => {
                let sql = with_clock!(
                    self,
                    "UPDATE webhook_deliveries SET status = $2, locked_until = NULL, last_error = $3, last_status = $4,
                        next_attempt_at = ",
                    " + $5 WHERE id = $1 AND locked_until = $6"
                );
                with_pool!(self, |pool| sqlx::query(sql)
                    .bind(id)
                    .bind(if *give_up { "failed" } else { "pending" })
                    .bind(error)
                    .bind(status.map(i64::from))
                    .bind(*retry_in_ms)
                    .bind(lock)
                    .execute(pool)
                    .await
                    .map(|done| done.rows_affected()))?
            }
            TryOutcome::NotYet { retry_in_ms } => {
                let sql = with_clock!(
                    self,
                    "UPDATE webhook_deliveries SET locked_until = NULL, attempts = attempts - 1, next_attempt_at = ",
                    " + $2 WHERE id = $1 AND locked_until = $3"
                );
                with_pool!(self, |pool| sqlx::query(sql)
                    .bind(id)
                    .bind(*retry_in_ms)
                    .bind(lock)
                    .execute(pool)
                    .await
                    .map(|done| done.rows_affected()))?
            }
            TryOutcome::Superseded => with_pool!(self, |pool| {
                sqlx::query(
                    "UPDATE webhook_deliveries SET status = 'superseded', locked_until = NULL, attempts = attempts - 1
                     WHERE id = $1 AND locked_until = $2",
                )
                .bind(id)
                .bind(lock)
                .execute(pool)
                .await
                .map(|done| done.rows_affected())
            })?,
        };
        Ok(recorded > 0)
    }

    /// The deliveries to endpoint `endpoint_id` of `project_id`, newest first, at most `limit`.
    pub async fn webhook_deliveries(
        &self,
        project_id: &str,
        endpoint_id: &str,
        limit: i64,
    ) -> Result<Vec<DeliveryRow>, StoreError> {
        let _timer = self.timed("webhook_deliveries");
        Ok(with_pool!(self, |pool| {
            sqlx::query_as::<_, DeliveryRow>(
            "SELECT id, event_id, event_type, response_id, status, CAST(attempts AS BIGINT) AS attempts,
                    next_attempt_at, last_error, CAST(last_status AS BIGINT) AS last_status, created_at, delivered_at
             FROM webhook_deliveries WHERE endpoint_id = $1 AND project_id = $2
             ORDER BY created_at DESC, id LIMIT $3",
        )
        .bind(endpoint_id)
        .bind(project_id)
        .bind(limit)
        .fetch_all(pool)
        .await?
        }))
    }
}
