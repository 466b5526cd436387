//! The conformance suite as a user of the facade runs it: `idem::conformance_tests!` with
//! `idem` (feature `testing`) and `tokio` as the only dev-dependencies, on the memory store
//! and on a `StoreWrapper` around it, which must keep the contract the memory store keeps.
//! (That it keeps the memory store's wake-ups too is `tests/engine_duplicates.rs`'s to
//! check: the suite only checks that a store which claims a capability has it.) A store
//! written before fences (no `assigns_fences`, `Fence::NONE` in every claim) passes it too,
//! and one that claims the capability but answers a constant fence fails it.
#![cfg(feature = "testing")]

mod support;

use idem::MemoryStore;
use support::stores::CountingClaims;

idem::conformance_tests!(memory, async { Some(MemoryStore::new()) });
idem::conformance_tests!(wrapped_memory, async { Some(CountingClaims::default()) });
idem::conformance_tests!(without_fences, async {
    Some(WithFence::<false>::default())
});

use std::sync::Arc;
use std::time::Duration;

use idem::{
    store::async_trait, store::Capabilities, store::Claim, store::Store, store::StoreError, Fence,
    Fingerprint, Key,
};
use idem::{store::StoreWrapper, store::Token};

/// The memory store with its fences replaced. `WithFence<false>`: as a custom store
/// written before fences is, `Fence::NONE` in every claim and no `assigns_fences`.
/// `WithFence<true>`: a broken store, claiming the capability and answering fence 42 to
/// every claim.
#[derive(Debug, Default)]
struct WithFence<const CONSTANT: bool>(MemoryStore);

#[async_trait]
impl<const CONSTANT: bool> StoreWrapper for WithFence<CONSTANT> {
    type Inner = MemoryStore;

    fn inner(&self) -> &MemoryStore {
        &self.0
    }

    async fn claim(
        &self,
        key: &Key,
        fingerprint: &Fingerprint,
        token: Token,
        lease: Duration,
    ) -> Result<Claim, StoreError> {
        let mut claim = self.0.claim(key, fingerprint, token, lease).await?;
        if let Claim::Acquired { fence, .. } = &mut claim {
            *fence = if CONSTANT {
                Fence::from_u64(42)
            } else {
                Fence::NONE
            };
        }
        Ok(claim)
    }

    fn capabilities(&self) -> Capabilities {
        Store::capabilities(&self.0).with_assigns_fences(CONSTANT)
    }
}

#[tokio::test(start_paused = true)]
#[should_panic(expected = "fences must increase with every claim of a key")]
async fn a_constant_fence_fails_the_store_behaviour() {
    idem::testing::fences_increase_with_every_claim(Arc::new(WithFence::<true>::default())).await;
}

#[tokio::test(start_paused = true)]
#[should_panic(expected = "fences must increase with every claim of a key")]
async fn a_constant_fence_fails_the_engine_behaviour() {
    idem::testing::engine_body_sees_its_fence(Arc::new(WithFence::<true>::default())).await;
}
