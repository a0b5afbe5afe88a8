//! A response's turn kept in its conversation (SPEC 15): when a response created with `conversation` ends
//! completed or incomplete, its input and output are appended to the conversation, as the client sees them when
//! it lists them (server tool calls included).

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
    /// (the items the response started from, or an append made before this replica stopped) are skipped, so it
    /// may be made again. A store that fails for a moment is tried again for as long as the lease lasts.
    pub(super) async fn append_to_conversation(
        &self,
        run: &Run,
        handed_back: bool,
    ) -> Result<(), StoreError> {
        let Some(conversation_id) = run.record.params.conversation.as_deref() else {
            return Ok(());
        };
        let give_up_at = tokio::time::Instant::now() + self.replica.lease;
        let mut waits = RetryPolicy::new(u32::MAX, STORE_RETRY_BASE_MS).waits();
        loop {
            let failure = match self.append_once(run, conversation_id, handed_back).await {
                Ok(()) => return Ok(()),
                Err(AppendError::NotFound) => {
                    tracing::warn!(response.id = %run.record.id, conversation.id = %conversation_id, "the conversation was deleted while the response ran; its turn is not kept");
                    return Ok(());
                }
                Err(AppendError::TakenId(_)) => return Ok(()),
                Err(AppendError::Store(failure)) => failure,
            };
            let wait = waits.next().filter(|wait| {
                failure.is_transient() && tokio::time::Instant::now() + *wait < give_up_at
            });
            let Some(wait) = wait else {
                return Err(failure);
            };
            tracing::warn!(response.id = %run.record.id, error = %failure, "appending to a conversation failed; trying again");
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
        let items: Vec<NewConversationItem> = run
            .context
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
