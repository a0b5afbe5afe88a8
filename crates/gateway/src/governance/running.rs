//! A response's places among those running under `max_concurrent` limits: taken at admission, given back when
//! the place is dropped (the run ended, or the create failed before it ran).

use crate::store::{Store, StoreError};

/// The `max_concurrent` counts a response holds a place in.
#[derive(Debug)]
pub struct RunningPlace {
    store: Store,
    replica_id: String,
    counts: Vec<String>,
}

impl RunningPlace {
    pub(super) fn new(store: Store, replica_id: String) -> RunningPlace {
        RunningPlace {
            store,
            replica_id,
            counts: Vec::new(),
        }
    }

    /// Takes a place in `count` if fewer than `limit` run: `false` when it is full (places taken so far are
    /// given back when this is dropped).
    pub(super) async fn take(&mut self, count: String, limit: u64) -> Result<bool, StoreError> {
        let taken = self
            .store
            .acquire_running(&count, &self.replica_id, limit)
            .await?;
        if taken {
            self.counts.push(count);
        }
        Ok(taken)
    }

    pub(super) fn holds_any(&self) -> bool {
        !self.counts.is_empty()
    }
}

impl Drop for RunningPlace {
    fn drop(&mut self) {
        if self.counts.is_empty() {
            return;
        }
        let counts = std::mem::take(&mut self.counts);
        let store = self.store.clone();
        let replica_id = std::mem::take(&mut self.replica_id);
        let give_back = async move {
            for count in counts {
                // A place not given back is taken back once this replica's lease lapses, or at its next start.
                if let Err(e) = store.release_running(&count, &replica_id).await {
                    tracing::warn!(count = %count, error = %e, "could not give back a running place");
                }
            }
        };
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(give_back);
        }
    }
}
