//! `idem::set_global` with the memory store: a choice made in plain sight, which neither
//! warns nor is refused beside an engine on a shared store. In a binary of its own: the global engine
//! is process-wide.

mod support;

use std::sync::atomic::{AtomicU32, Ordering};

use idem::{idempotent, Idem, MemoryStore};
use support::stores::NamedAs;

static RUNS: AtomicU32 = AtomicU32::new(0);

#[idempotent(key = id, scope = "chosen_global::charge")]
async fn charge(id: u32) -> u32 {
    RUNS.fetch_add(1, Ordering::SeqCst);
    id
}

#[tokio::test(flavor = "current_thread")]
async fn a_global_engine_chosen_with_set_global_runs_beside_a_shared_store_without_warning() {
    let (events, _guard) = support::log::capture(tracing::Level::WARN);

    idem::set_global(Idem::new(MemoryStore::new())).unwrap();
    let _redis = Idem::new(NamedAs::new("redis"));
    assert_eq!(charge(1).await.unwrap(), 1);
    assert_eq!(charge(1).await.unwrap(), 1);
    assert_eq!(RUNS.load(Ordering::SeqCst), 1);
    let events = events.0.lock().unwrap();
    assert!(events.is_empty(), "{events:?}");
}
