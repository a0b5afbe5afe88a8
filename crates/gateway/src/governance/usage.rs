//! The usage of unstored responses, recorded in batches: runs hand their records to a channel, and one task
//! writes what gathered every `flush` in one statement. A crash loses at most the last `flush` of them.

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
        let (sender, mut receiver) = mpsc::channel::<Vec<UsageRecord>>(MAX_QUEUED);
        tokio::spawn(async move {
            let mut batch = Vec::new();
            loop {
                let Some(first) = receiver.recv().await else {
                    return;
                };
                batch.extend(first);
                tokio::time::sleep(flush).await;
                while let Ok(more) = receiver.try_recv() {
                    batch.extend(more);
                }
                if let Err(e) = store.record_usage(&batch).await {
                    tracing::warn!(records = batch.len(), error = %e, "could not record the usage of unstored responses; trying again with the next batch");
                    if batch.len() > MAX_QUEUED {
                        batch.clear();
                    }
                    continue;
                }
                batch.clear();
            }
        });
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
