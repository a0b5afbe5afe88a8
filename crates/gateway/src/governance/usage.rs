//! The usage of unstored responses, recorded in batches: runs hand their records to a channel, and one task
//! writes what gathered every `flush`, summed per project, key, deployment and tool source, in one statement. A
//! crash loses at most the last `flush` of them.

use foldhash::HashMap;
use std::time::Duration;

use tokio::sync::mpsc;

use crate::store::governance::UsageRecord;
use crate::store::Store;

/// Records handed to the writer and not yet written, at the most; beyond it they are dropped with a warning.
const MAX_QUEUED: usize = 100_000;

/// The sending side of the batch writer.
#[derive(Debug, Clone)]
pub struct UsageWriter {
    sender: mpsc::Sender<Vec<UsageRecord>>,
}

impl UsageWriter {
    /// Starts the writing task on the current runtime.
    pub fn start(store: Store, flush: Duration) -> UsageWriter {
        let (sender, receiver) = mpsc::channel::<Vec<UsageRecord>>(MAX_QUEUED);
        let queue = crate::duty::Queue::new(receiver);
        crate::duty::spawn(
            "unstored_usage",
            crate::metrics::duty_restarted,
            move || {
                let (store, queue) = (store.clone(), queue.clone());
                async move { write_usage(store, &mut *queue.take().await, flush).await }
            },
        );
        UsageWriter { sender }
    }

    pub fn send(&self, records: Vec<UsageRecord>) {
        if records.is_empty() {
            return;
        }
        if let Err(e) = self.sender.try_send(records) {
            tracing::warn!(error = %e, "the usage writer is behind; usage of an unstored response was not recorded");
        }
    }
}

/// Writes the usage handed in, a batch every `flush`, until every sender is gone.
async fn write_usage(
    store: Store,
    receiver: &mut mpsc::Receiver<Vec<UsageRecord>>,
    flush: Duration,
) {
    // Rows whose write failed: written again as they are (same ids), so that a write whose answer was lost is not
    // counted twice.
    let mut unwritten: Vec<UsageRecord> = Vec::new();
    loop {
        let Some(first) = receiver.recv().await else {
            return;
        };
        let mut batch = first;
        tokio::time::sleep(flush).await;
        while let Ok(more) = receiver.try_recv() {
            batch.extend(more);
        }
        unwritten.extend(summed(batch));
        if let Err(e) = store.record_usage(&unwritten).await {
            tracing::warn!(rows = unwritten.len(), error = %e, "could not record the usage of unstored responses; trying again with the next batch");
            if unwritten.len() > MAX_QUEUED {
                unwritten.clear();
            }
            continue;
        }
        unwritten.clear();
    }
}

/// `records` summed into one row per project, key, deployment, provider kind and tool source, each under an id of
/// its own (`usage_…`, seq 0) and the time of its latest record.
fn summed(records: Vec<UsageRecord>) -> Vec<UsageRecord> {
    type Group = (String, Option<String>, String, String, Option<String>);
    let mut sums: HashMap<Group, UsageRecord> = HashMap::default();
    for record in records {
        let group = (
            record.project_id.clone(),
            record.api_key_id.clone(),
            record.deployment.clone(),
            record.provider_kind.clone(),
            record.tool_source.clone(),
        );
        match sums.get_mut(&group) {
            Some(sum) => {
                sum.input_tokens = sum.input_tokens.saturating_add(record.input_tokens);
                sum.cached_tokens = sum.cached_tokens.saturating_add(record.cached_tokens);
                sum.output_tokens = sum.output_tokens.saturating_add(record.output_tokens);
                sum.reasoning_tokens = sum.reasoning_tokens.saturating_add(record.reasoning_tokens);
                sum.cost_usd += record.cost_usd;
                sum.created_at = sum.created_at.max(record.created_at);
                sum.calls = sum.calls.saturating_add(record.calls);
            }
            None => {
                sums.insert(
                    group,
                    UsageRecord {
                        response_id: crate::ids::new_id("usage"),
                        seq: 0,
                        ..record
                    },
                );
            }
        }
    }
    sums.into_values().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(
        response: &str,
        key: Option<&str>,
        tool_source: Option<&str>,
        tokens: i64,
    ) -> UsageRecord {
        UsageRecord {
            response_id: response.to_owned(),
            seq: 1,
            project_id: "proj_1".to_owned(),
            api_key_id: key.map(str::to_owned),
            deployment: "d".to_owned(),
            provider_kind: "openai_chat".to_owned(),
            tool_source: tool_source.map(str::to_owned),
            input_tokens: tokens,
            cached_tokens: 1,
            output_tokens: 2 * tokens,
            reasoning_tokens: 0,
            cost_usd: 0.5,
            created_at: tokens,
            calls: 1,
        }
    }

    #[test]
    fn records_are_summed_per_payer_deployment_and_source() {
        let mut rows = summed(vec![
            record("resp_a", Some("k1"), None, 10),
            record("resp_b", Some("k1"), None, 20),
            record("resp_b", Some("k1"), Some("tools"), 0),
            record("resp_c", Some("k2"), None, 5),
        ]);
        rows.sort_by_key(|row| (row.api_key_id.clone(), row.tool_source.clone()));
        let shape: Vec<_> = rows
            .iter()
            .map(|row| {
                (
                    row.api_key_id.as_deref(),
                    row.tool_source.as_deref(),
                    row.input_tokens,
                    row.output_tokens,
                    row.cached_tokens,
                    row.calls,
                    row.cost_usd,
                    row.created_at,
                )
            })
            .collect();
        assert_eq!(
            shape,
            vec![
                (Some("k1"), None, 30, 60, 2, 2, 1.0, 20),
                (Some("k1"), Some("tools"), 0, 0, 1, 1, 0.5, 0),
                (Some("k2"), None, 5, 10, 1, 1, 0.5, 5),
            ]
        );
        assert!(rows
            .iter()
            .all(|row| row.response_id.starts_with("usage_") && row.seq == 0));
        let ids: std::collections::HashSet<_> = rows.iter().map(|row| &row.response_id).collect();
        assert_eq!(ids.len(), 3, "each row has an id of its own");
    }
}
