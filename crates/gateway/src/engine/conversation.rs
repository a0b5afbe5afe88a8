//! What a response's ending leaves behind (SPEC 15): the webhook events of a background response's ending, and
//! its turn in its conversation: when a response created with `conversation` ends completed or incomplete, its
//! input and output are appended to the conversation, as the client sees them when it lists them (server tool
//! calls included).

use std::collections::HashSet;

use serde_json::Value;

use super::journal::STORE_RETRY_BASE_MS;
use super::{Engine, Run};
use crate::clock::now;
use crate::retry::RetryPolicy;
use crate::store::conversations::{AppendError, NewConversationItem, OnTakenId};
use crate::store::StoreError;
use gateway_core::output::render_output;

impl Engine {
    /// Appends `run`'s input and output to its conversation, if it has one. Items the conversation holds already
    /// (an append made before this replica stopped) are skipped, so it may be made again. A store that fails for a
    /// moment is tried again for as long as the lease lasts.
    pub(super) async fn append_to_conversation(
        &self,
        run: &Run,
        handed_back: bool,
    ) -> Result<(), StoreError> {
        let Some(conversation_id) = run.record.params.conversation.as_deref() else {
            return Ok(());
        };
        let appended = self
            .while_leased(run, "appending to a conversation", || async {
                match self.append_once(run, conversation_id, handed_back).await {
                    Ok(()) | Err(AppendError::TakenId(_)) => Ok(true),
                    Err(AppendError::NotFound) => Ok(false),
                    Err(AppendError::Store(failure)) => Err(failure),
                }
            })
            .await?;
        if !appended {
            tracing::warn!(response.id = %run.record.id, conversation.id = %conversation_id, "the conversation was deleted while the response ran; its turn is not kept");
        }
        Ok(())
    }

    /// Runs `attempt` until it succeeds or fails for good: a store that fails for a moment is tried again, with
    /// backoff, for as long as the run's lease lasts.
    async fn while_leased<T, Fut>(
        &self,
        run: &Run,
        what: &str,
        mut attempt: impl FnMut() -> Fut,
    ) -> Result<T, StoreError>
    where
        Fut: std::future::Future<Output = Result<T, StoreError>>,
    {
        let give_up_at = tokio::time::Instant::now() + self.replica.lease;
        let mut waits = RetryPolicy::new(u32::MAX, STORE_RETRY_BASE_MS).waits();
        loop {
            let failure = match attempt().await {
                Ok(done) => return Ok(done),
                Err(failure) => failure,
            };
            let wait = waits.next().filter(|wait| {
                failure.is_transient() && tokio::time::Instant::now() + *wait < give_up_at
            });
            let Some(wait) = wait else {
                return Err(failure);
            };
            tracing::warn!(response.id = %run.record.id, error = %failure, "{what} failed; trying again");
            tokio::time::sleep(wait).await;
        }
    }

    async fn append_once(
        &self,
        run: &Run,
        conversation_id: &str,
        handed_back: bool,
    ) -> Result<(), AppendError> {
        let held: HashSet<String> = self
            .store
            .conversation_item_ids(&run.project_id, conversation_id)
            .await
            .map_err(AppendError::Store)?
            .ok_or(AppendError::NotFound)?;
        let output = render_output(&run.steps, handed_back);
        // The response's turn: its input and output, never the conversation's items it started from (one deleted
        // meanwhile stays deleted). A response stored before the turn's start was recorded skips them by id.
        let turn_from = run
            .record
            .params
            .conversation_turn_from
            .unwrap_or(0)
            .min(run.context.len());
        let items: Vec<NewConversationItem> = run.context[turn_from..]
            .iter()
            .chain(output.iter())
            .filter_map(|item| {
                let id = item
                    .id()
                    .filter(|id| !id.is_empty() && !held.contains(*id))?;
                let stored = serde_json::to_value(item).unwrap_or(Value::Null);
                (!stored.is_null()).then(|| NewConversationItem {
                    id: id.to_owned(),
                    item: stored,
                })
            })
            .collect();
        if items.is_empty() {
            return Ok(());
        }
        self.store
            .append_conversation_items(
                &run.project_id,
                conversation_id,
                &items,
                Some(&run.record.id),
                OnTakenId::Skip,
                now(),
            )
            .await
            .map(drop)
    }
}

impl Engine {
    /// Queues the webhook event of a background response's ending for the project's endpoints that want it;
    /// whether any was queued. A store that fails for a moment is tried again for as long as the lease lasts.
    pub(super) async fn queue_webhook_event(&self, run: &Run) -> Result<bool, StoreError> {
        use gateway_core::webhook::WebhookEvent;
        if !run.record.background {
            return Ok(false);
        }
        let Some(event) = WebhookEvent::of_status(run.record.status()) else {
            return Ok(false);
        };
        // Boxed: a foreground response, which never gets here, should not carry the queueing's future.
        Box::pin(self.while_leased(run, "queueing a webhook event", || {
            self.queue_ending_event(&run.project_id, &run.record.id, event)
        }))
        .await
    }

    /// Queues event `event` of background response `response_id` of `project_id` for the project's endpoints
    /// that want it; whether any was queued. Queued before the ending it tells is written (whoever writes it), kept
    /// once under its id, and sent only once the response reads that way: superseded when it ended otherwise.
    pub async fn queue_ending_event(
        &self,
        project_id: &str,
        response_id: &str,
        event: gateway_core::webhook::WebhookEvent,
    ) -> Result<bool, StoreError> {
        use gateway_core::webhook::{event_id, event_payload};
        let id = event_id(response_id, event);
        let payload = event_payload(&id, event, now(), response_id);
        let queued = self
            .store
            .enqueue_webhook_event(
                project_id,
                response_id,
                &id,
                event.as_str(),
                &payload,
                now(),
            )
            .await?;
        Ok(queued > 0)
    }

    /// Lets the webhook deliverer look for due deliveries now.
    pub fn wake_deliverer(&self) {
        self.deliverer.wake();
    }
}
