//! A function without `store = ...` runs on the global engine `idem::set_global` chose, and
//! nothing else decides it: before one is set its calls are refused (`Error::Config`, the
//! body not run) whatever engines the process builds, and after, they run on it, also
//! beside an engine on a shared store. In a binary of its own: the global engine is
//! process-wide.

mod support;

use std::sync::atomic::{AtomicU32, Ordering};

use idem::{idempotent, Error, Idem, Key, MemoryStore};
use support::stores::NamedAs;

static RUNS: AtomicU32 = AtomicU32::new(0);

#[idempotent(key = id, scope = "implicit_global::charge")]
async fn charge(id: u32) -> u32 {
    RUNS.fetch_add(1, Ordering::SeqCst);
    id
}

/// The call is refused before its body, and the error names the fn and both fixes.
async fn assert_refused(id: u32) {
    let err = charge(id).await.unwrap_err();
    assert!(matches!(err, Error::Config { .. }), "{err:?}");
    let message = err.to_string();
    for part in [
        "`implicit_global::charge` has no `store = ...`",
        "no global engine is set",
        "idem::set_global",
    ] {
        assert!(message.contains(part), "{part:?} not in {message}");
    }
}

#[tokio::test(flavor = "current_thread")]
async fn without_a_global_engine_calls_are_refused_and_once_one_is_set_they_run_on_it() {
    assert!(idem::global().is_none());
    assert_refused(1).await;
    // Engines built elsewhere, on any store, choose nothing for these functions.
    let _memory = Idem::new(MemoryStore::new());
    let _postgres = Idem::new(NamedAs::new("postgres"));
    assert_refused(1).await;
    assert_eq!(RUNS.load(Ordering::SeqCst), 0, "no body ran");

    // The one choice, in plain sight: the calls run once per key on it.
    let global = Idem::new(MemoryStore::new());
    idem::set_global(global.clone()).unwrap();
    assert_eq!(charge(1).await.unwrap(), 1);
    assert_eq!(charge(1).await.unwrap(), 1);
    assert_eq!(charge(2).await.unwrap(), 2);
    assert_eq!(RUNS.load(Ordering::SeqCst), 2);
    let key = Key::new("implicit_global::charge", "1").unwrap();
    assert!(global.store().get(&key).await.unwrap().is_some());

    // Another engine on a shared store changes nothing, and the choice is made once.
    let _redis = Idem::new(NamedAs::new("postgres"));
    assert_eq!(charge(1).await.unwrap(), 1);
    assert_eq!(charge(3).await.unwrap(), 3);
    assert_eq!(RUNS.load(Ordering::SeqCst), 3);
    assert!(idem::set_global(Idem::new(NamedAs::new("postgres"))).is_err());
    assert_eq!(charge(3).await.unwrap(), 3);
    assert_eq!(RUNS.load(Ordering::SeqCst), 3);
}
