//! The conformance suite as a user of the facade runs it: `idem::conformance_tests!` with
//! `idem` (feature `testing`) and `tokio` as the only dev-dependencies, on the memory store
//! and on a `StoreWrapper` around it, which must keep the contract the memory store keeps.
//! (That it keeps the memory store's wake-ups too is `tests/engine.rs`'s to check: the
//! suite only checks that a store which claims a capability has it.)
#![cfg(feature = "testing")]

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use idem::{Claim, Fingerprint, Key, MemoryStore, Store, StoreError, StoreWrapper, Token};

/// Counts claims and changes nothing else.
#[derive(Debug, Default)]
struct CountingClaims {
    inner: MemoryStore,
    claims: AtomicU64,
}

#[idem::async_trait]
impl StoreWrapper for CountingClaims {
    type Inner = MemoryStore;
    fn inner(&self) -> &MemoryStore {
        &self.inner
    }
    async fn claim(
        &self,
        key: &Key,
        fp: &Fingerprint,
        token: Token,
        lease: Duration,
    ) -> Result<Claim, StoreError> {
        self.claims.fetch_add(1, Ordering::Relaxed);
        self.inner.claim(key, fp, token, lease).await
    }
}

idem::conformance_tests!(memory, async { Some(MemoryStore::new()) });
idem::conformance_tests!(wrapped_memory, async { Some(CountingClaims::default()) });
