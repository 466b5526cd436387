//! An optional in-process cache of completed records in front of the store.

use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;

use crate::key::Key;
use crate::store::Fingerprint;

/// A decoded result held by the local cache.
pub type SharedValue = std::sync::Arc<dyn std::any::Any + Send + Sync>;

#[derive(Clone)]
pub(crate) struct Hit {
    pub fingerprint: Fingerprint,
    /// The canonical encoding of a payload with that fingerprint, when the caller that
    /// filled the entry held it: a later caller with the same encoding matches unhashed.
    pub request: Option<Bytes>,
    /// The sealed record, as the store holds it.
    pub payload: Bytes,
    /// The record's value, decoded, for a type the caller can clone out of it.
    pub value: Option<SharedValue>,
    expires_at: Instant,
}

pub(crate) struct LocalCache {
    entries: quick_cache::sync::Cache<Key, Hit>,
    max_age: Duration,
}

impl LocalCache {
    pub fn new(capacity: usize, max_age: Duration) -> Self {
        LocalCache {
            entries: quick_cache::sync::Cache::new(capacity),
            max_age,
        }
    }

    pub fn get(&self, key: &Key) -> Option<Hit> {
        let hit = self.entries.get(key)?;
        if Instant::now() >= hit.expires_at {
            self.entries.remove(key);
            return None;
        }
        Some(hit)
    }

    pub fn insert(
        &self,
        key: Key,
        fingerprint: Fingerprint,
        request: Option<Bytes>,
        payload: Bytes,
        value: Option<SharedValue>,
        ttl: Duration,
    ) {
        let Some(expires_at) = Instant::now().checked_add(ttl.min(self.max_age)) else {
            return;
        };
        self.entries.insert(
            key,
            Hit {
                fingerprint,
                request,
                payload,
                value,
                expires_at,
            },
        );
    }

    pub fn remove(&self, key: &Key) {
        self.entries.remove(key);
    }
}
