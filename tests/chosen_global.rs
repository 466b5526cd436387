//! `idem::set_global` with the memory store: a choice made in plain sight, which neither
//! warns nor is refused beside a shared store. In a binary of its own: the global engine
//! is process-wide.

#[path = "support/log.rs"]
mod log;

use std::sync::atomic::{AtomicU32, Ordering};

use idem::{idempotent, Idem, MemoryStore, StoreWrapper};

static RUNS: AtomicU32 = AtomicU32::new(0);

#[idempotent(key = id, scope = "chosen_global::charge")]
async fn charge(id: u32) -> u32 {
    RUNS.fetch_add(1, Ordering::SeqCst);
    id
}

#[derive(Debug, Default)]
struct Shared(MemoryStore);

impl StoreWrapper for Shared {
    type Inner = MemoryStore;
    fn inner(&self) -> &MemoryStore {
        &self.0
    }
    fn backend(&self) -> &'static str {
        "redis"
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_global_engine_chosen_with_set_global_runs_beside_a_shared_store_without_warning() {
    let (events, _guard) = log::capture(tracing::Level::WARN);

    idem::set_global(Idem::new(MemoryStore::new())).unwrap();
    let _redis = Idem::new(Shared::default());
    assert_eq!(charge(1).await.unwrap(), 1);
    assert_eq!(charge(1).await.unwrap(), 1);
    assert_eq!(RUNS.load(Ordering::SeqCst), 1);
    let events = events.0.lock().unwrap();
    assert!(events.is_empty(), "{events:?}");
}
