//! Key → grant (project, expiry, limits, budgets) and (project, model) → deployment and server tools: read from the store, reused briefly.
//!
//! Only positive answers are cached (an unknown key costs a query each time, so random keys cannot fill the
//! cache), for `tenancy.cache_ttl_ms`. Admin writes through this gateway clear the cache at once.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use moka::future::Cache;

use crate::store::governance::KeyGrant;
use crate::store::tenancy::{key_digest, Resolution};
use crate::store::{Store, StoreError};

const MAX_ENTRIES: u64 = 100_000;

/// The caches' hasher: keyed per process, and a fraction of SipHash's cost on every request's lookups.
type Hasher = foldhash::fast::RandomState;

/// The store's tenancy answers behind a short-lived cache; cheap to clone.
#[derive(Clone)]
pub struct Resolver {
    store: Store,
    /// Keys whose use was written within `LAST_USED_EVERY`.
    recently_used: moka::sync::Cache<String, (), Hasher>,
    /// `None` when caching is disabled (`cache_ttl_ms = 0`).
    caches: Option<Caches>,
}

#[derive(Clone)]
struct Caches {
    /// SHA-256 of a key → its grant (project, expiry, limits, budgets).
    grants: Cache<[u8; 32], Arc<KeyGrant>, Hasher>,
    /// (project, model) → what that project may use with that model.
    resolutions: Cache<(String, String), Arc<Resolution>, Hasher>,
    /// Bumped by every invalidation: an answer read before one is not cached after it.
    epoch: Arc<AtomicU64>,
}

/// How often a replica writes a key's `last_used_at`, at most.
const LAST_USED_EVERY: Duration = Duration::from_secs(60);

impl std::fmt::Debug for Resolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Resolver")
            .field("cached", &self.caches.is_some())
            .finish()
    }
}

impl Resolver {
    pub fn new(store: Store, ttl: Duration) -> Resolver {
        let caches = (!ttl.is_zero()).then(|| Caches {
            grants: Cache::builder()
                .max_capacity(MAX_ENTRIES)
                .time_to_live(ttl)
                .build_with_hasher(Hasher::default()),
            resolutions: Cache::builder()
                .max_capacity(MAX_ENTRIES)
                .time_to_live(ttl)
                .build_with_hasher(Hasher::default()),
            epoch: Arc::new(AtomicU64::new(0)),
        });
        let recently_used = moka::sync::Cache::builder()
            .max_capacity(MAX_ENTRIES)
            .time_to_live(LAST_USED_EVERY)
            .build_with_hasher(Hasher::default());
        Resolver {
            store,
            recently_used,
            caches,
        }
    }

    /// Notes that key `key_id` was just used: its `last_used_at` is written, off the request's path, at most once
    /// every `LAST_USED_EVERY` per replica.
    pub fn note_used(&self, key_id: &str) {
        if self.recently_used.contains_key(key_id) {
            return;
        }
        self.recently_used.insert(key_id.to_owned(), ());
        let store = self.store.clone();
        let key_id = key_id.to_owned();
        tokio::spawn(async move {
            if let Err(e) = store.touch_api_key(&key_id, crate::clock::now()).await {
                tracing::debug!(api_key.id = %key_id, error = %e, "could not note the key's last use");
            }
        });
    }

    /// The grant of a key, revoked or expired or not: the caller refuses a revoked one and compares its expiry with
    /// the clock, so a cached grant expires on time.
    pub async fn grant_for_key(&self, key: &str) -> Result<Option<Arc<KeyGrant>>, StoreError> {
        let Some(caches) = &self.caches else {
            return Ok(self.store.grant_for_key(key).await?.map(Arc::new));
        };
        let hash = key_digest(key);
        if let Some(grant) = caches.grants.get(&hash).await {
            return Ok(Some(grant));
        }
        let epoch = caches.epoch.load(Ordering::Acquire);
        let found = self.store.grant_for_key(key).await?.map(Arc::new);
        if let Some(grant) = &found {
            if caches.epoch.load(Ordering::Acquire) == epoch {
                caches.grants.insert(hash, Arc::clone(grant)).await;
            }
        }
        Ok(found)
    }

    /// What `project_id` may use when it names `model`; `None` when it may use no such model.
    pub async fn resolve(
        &self,
        project_id: &str,
        model: &str,
    ) -> Result<Option<Arc<Resolution>>, StoreError> {
        let Some(caches) = &self.caches else {
            return Ok(self.store.resolve(project_id, model).await?.map(Arc::new));
        };
        let key = (project_id.to_owned(), model.to_owned());
        if let Some(resolution) = caches.resolutions.get(&key).await {
            return Ok(Some(resolution));
        }
        let epoch = caches.epoch.load(Ordering::Acquire);
        let found = self.store.resolve(project_id, model).await?.map(Arc::new);
        if let Some(resolution) = &found {
            if caches.epoch.load(Ordering::Acquire) == epoch {
                caches.resolutions.insert(key, Arc::clone(resolution)).await;
            }
        }
        Ok(found)
    }

    /// Forgets every cached answer (after an admin write).
    pub fn invalidate(&self) {
        if let Some(caches) = &self.caches {
            caches.epoch.fetch_add(1, Ordering::AcqRel);
            caches.grants.invalidate_all();
            caches.resolutions.invalidate_all();
        }
    }
}
