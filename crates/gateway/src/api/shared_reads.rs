//! One store read shared by every follower of a response on this replica (SPEC 9: many followers must not load
//! the store): followers woken by the same progress join the read already under way, when it started after they
//! were woken, instead of each opening a transaction of its own.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures::future::{BoxFuture, FutureExt, Shared};
use gateway_core::Step;
use tokio::time::Instant;

use crate::store::responses::StoredResponse;
use crate::store::{Store, StoreError};

/// A response of a project and its steps as of one moment; `None` when it is gone.
pub type Snapshot = Option<Arc<(StoredResponse, Vec<Step>)>>;

type Read = Shared<BoxFuture<'static, Result<Snapshot, Arc<StoreError>>>>;

/// The reads under way, by response id, each with when it started.
#[derive(Clone)]
pub struct SharedReads {
    store: Store,
    under_way: Arc<Mutex<HashMap<String, (Instant, Read)>>>,
}

impl SharedReads {
    pub fn new(store: Store) -> SharedReads {
        SharedReads {
            store,
            under_way: Arc::default(),
        }
    }

    /// Response `id` of `project` and its steps, read at `woken` or later: a read of it already under way that
    /// started no earlier is joined; otherwise one starts.
    pub async fn load(
        &self,
        project: &str,
        id: &str,
        woken: Instant,
    ) -> Result<Snapshot, Arc<StoreError>> {
        let read = {
            let mut under_way = self
                .under_way
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            match under_way.get(id) {
                Some((started, read)) if *started >= woken => read.clone(),
                _ => {
                    let started = Instant::now();
                    let read = self.start(project, id, started);
                    under_way.insert(id.to_owned(), (started, read.clone()));
                    read
                }
            }
        };
        read.await
    }

    /// A read of response `id`, started at `started`, that forgets itself once done (unless a later read took its
    /// place meanwhile).
    fn start(&self, project: &str, id: &str, started: Instant) -> Read {
        let (store, under_way) = (self.store.clone(), Arc::clone(&self.under_way));
        let (project, id) = (project.to_owned(), id.to_owned());
        async move {
            let loaded = store.load_with_steps(&project, &id).await;
            let mut under_way = under_way
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if under_way.get(&id).is_some_and(|(at, _)| *at == started) {
                under_way.remove(&id);
            }
            drop(under_way);
            loaded.map(|found| found.map(Arc::new)).map_err(Arc::new)
        }
        .boxed()
        .shared()
    }
}
