//! The conformance suite as a user of the facade runs it: `idem::conformance_tests!` with
//! `idem` (feature `testing`) and `tokio` as the only dev-dependencies, on the memory store
//! and on a `StoreWrapper` around it, which must keep the contract the memory store keeps.
//! (That it keeps the memory store's wake-ups too is `tests/engine_duplicates.rs`'s to
//! check: the suite only checks that a store which claims a capability has it.)
#![cfg(feature = "testing")]

mod support;

use idem::MemoryStore;
use support::stores::CountingClaims;

idem::conformance_tests!(memory, async { Some(MemoryStore::new()) });
idem::conformance_tests!(wrapped_memory, async { Some(CountingClaims::default()) });
