//! A function without `store = ...` on the implicit in-process engine: a `warn` naming it at
//! its first call, and a refusal (`Error::Config`, the body not run) once the process uses
//! a shared store. In a binary of its own: the global engine and the "a shared store is in
//! use" mark are process-wide, and tracing caches callsite interest process-wide.

#[path = "support/log.rs"]
mod log;

use std::sync::atomic::{AtomicU32, Ordering};

use idem::{idempotent, Error, Idem, MemoryStore, StoreWrapper};

static RUNS: AtomicU32 = AtomicU32::new(0);

#[idempotent(key = id, scope = "implicit_global::charge")]
async fn charge(id: u32) -> u32 {
    RUNS.fetch_add(1, Ordering::SeqCst);
    id
}

/// Stands for a Postgres or Redis store: any backend but the memory store's.
#[derive(Debug, Default)]
struct Shared(MemoryStore);

impl StoreWrapper for Shared {
    type Inner = MemoryStore;
    fn inner(&self) -> &MemoryStore {
        &self.0
    }
    fn backend(&self) -> &'static str {
        "postgres"
    }
}

#[tokio::test(flavor = "current_thread")]
async fn the_implicit_engine_warns_once_per_fn_then_is_refused_beside_a_shared_store() {
    let (events, _guard) = log::capture(tracing::Level::WARN);

    // Tests keep their one-line default: no engine anywhere, the calls run once per key.
    assert_eq!(charge(1).await.unwrap(), 1);
    assert_eq!(charge(1).await.unwrap(), 1);
    assert_eq!(charge(2).await.unwrap(), 2);
    assert_eq!(RUNS.load(Ordering::SeqCst), 2);
    let warnings: Vec<String> = events
        .0
        .lock()
        .unwrap()
        .iter()
        .filter(|e| e.contains("implicit in-process memory engine"))
        .cloned()
        .collect();
    assert_eq!(warnings.len(), 1, "one warning per fn: {warnings:?}");
    assert!(warnings[0].contains("WARN"), "{}", warnings[0]);
    assert!(
        warnings[0].contains("scope=implicit_global::charge"),
        "{}",
        warnings[0]
    );

    // Engines on the memory store change nothing.
    let _memory = Idem::new(MemoryStore::new());
    assert_eq!(charge(3).await.unwrap(), 3);
    assert_eq!(RUNS.load(Ordering::SeqCst), 3);

    // Once the process has an engine on a shared store, the implicit engine is refused:
    // the body does not run, and the error names the fn and both fixes.
    let _postgres = Idem::new(Shared::default());
    let err = charge(4).await.unwrap_err();
    assert!(matches!(err, Error::Config { .. }), "{err:?}");
    let message = err.to_string();
    for part in [
        "`implicit_global::charge` has no `store = ...`",
        "postgres store",
        "idem::set_global",
    ] {
        assert!(message.contains(part), "{part:?} not in {message}");
    }
    assert_eq!(RUNS.load(Ordering::SeqCst), 3, "the body did not run");
    // Replays of what the implicit engine holds are refused as well: nothing is served
    // from a store other instances cannot see.
    assert!(matches!(charge(1).await, Err(Error::Config { .. })));
}
