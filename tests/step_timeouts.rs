//! Every store step the engine makes is bounded by the step timeout: a store whose steps
//! hang (a dead connection, a lock held elsewhere) costs a caller at most that long per
//! step, and the error names the step and the backend. Driven by tokio's paused clock, so
//! the bounds are exact and the tests take no real time.

mod support;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idem::{store::Store, store::StoreError, Error, Fingerprint, Idem, Key, MemoryStore};
use support::stores::{BoundedButWaitHangs, Hanging, Passing, SelfBounded, Unnamed};
use tokio::time::Instant;

const STEP: Duration = Duration::from_millis(500);

fn setup() -> (Arc<Hanging>, Idem) {
    let store = Arc::new(Hanging::default());
    let idem = Idem::builder()
        .store(store.clone())
        .store_timeout(STEP)
        .build()
        .unwrap();
    (store, idem)
}

fn key(id: &str) -> Key {
    Key::new("step-timeouts", id).unwrap()
}

/// The error is a temporary store timeout of `step` on the memory store, after `after`.
fn assert_timeout(err: &Error, step: &str, after: Duration) {
    match err {
        Error::Store {
            source:
                source @ StoreError::Timeout {
                    backend,
                    step: s,
                    after: a,
                },
            ..
        } => {
            assert_eq!((*backend, *s, *a), ("memory", step, after), "{err:?}");
            assert!(source.is_temporary());
            assert!(err.is_retryable());
            let text = source.to_string();
            assert!(
                text.contains(step) && text.contains("memory"),
                "the message names the step and the backend: {text}"
            );
        }
        other => panic!("expected a {step} timeout, got {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn a_hanging_claim_times_out_and_the_body_does_not_run() {
    let (store, idem) = setup();
    store.claim.set(1);
    let runs = AtomicU32::new(0);
    let started = Instant::now();
    let err = idem
        .call(key("claim"), Fingerprint::NONE)
        .run(|| async { runs.fetch_add(1, Ordering::SeqCst) })
        .await
        .unwrap_err();
    assert_eq!(started.elapsed(), STEP);
    assert_timeout(&err, "claim", STEP);
    assert_eq!(
        runs.load(Ordering::SeqCst),
        0,
        "the body ran without a claim"
    );
    assert_eq!(store.claim.abandoned(), 1);
    // The store answers again: the next call runs.
    idem.call(key("claim"), Fingerprint::NONE)
        .run(|| async { runs.fetch_add(1, Ordering::SeqCst) })
        .await
        .unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn the_heartbeat_keeps_beating_while_one_extend_hangs() {
    let (store, idem) = setup();
    store.extend.set(1);
    let lease = Duration::from_secs(3);
    // Beats every second for ten seconds; the first hangs and is abandoned at the step
    // timeout, and without the next beats the lease would end at 3 s and the result would
    // be refused as a lost lease.
    let v: u32 = idem
        .call(key("heartbeat"), Fingerprint::NONE)
        .lease(lease)
        .run(|| async {
            tokio::time::sleep(Duration::from_secs(10)).await;
            7
        })
        .await
        .unwrap();
    assert_eq!(v, 7);
    assert_eq!(
        store.extend.abandoned(),
        1,
        "the hanging extend was abandoned"
    );
    let extends = store.extend.calls();
    assert!(
        (8..=11).contains(&extends),
        "one extend a second for ten seconds: {extends}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_hanging_complete_answers_a_store_error_before_the_lease_ends() {
    let (store, idem) = setup();
    store.complete.set(u32::MAX);
    let lease = Duration::from_secs(2);
    let runs = AtomicU32::new(0);
    let started = Instant::now();
    let err = idem
        .call(key("complete"), Fingerprint::NONE)
        .lease(lease)
        .run(|| async { runs.fetch_add(1, Ordering::SeqCst) })
        .await
        .unwrap_err();
    let took = started.elapsed();
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert!(took <= lease, "the caller waited past the lease: {took:?}");
    match &err {
        Error::Store {
            source: StoreError::Timeout { step, after, .. },
            ..
        } => {
            assert_eq!(*step, "complete");
            assert!(*after <= STEP, "{after:?}");
        }
        other => panic!("expected a complete timeout, got {other:?}"),
    }
    let attempts = store.complete.calls();
    assert!(
        (3..=5).contains(&attempts),
        "attempts of 500 ms with short pauses fill a 2 s lease: {attempts}"
    );
    assert_eq!(store.complete.abandoned(), attempts);
}

#[tokio::test(start_paused = true)]
async fn a_hanging_release_is_abandoned_and_the_body_error_returned() {
    let (store, idem) = setup();
    store.release.set(1);
    let started = Instant::now();
    let out: Result<u8, Error> = idem
        .call(key("release"), Fingerprint::NONE)
        .run_fallible(|| async {
            Err(Error::MissingKey {
                scope: "the body failed".into(),
            })
        })
        .await;
    assert!(matches!(out, Err(Error::MissingKey { .. })), "{out:?}");
    assert_eq!(started.elapsed(), STEP);
    assert_eq!(store.release.abandoned(), 1);
}

#[tokio::test(start_paused = true)]
async fn the_background_release_of_a_dropped_call_is_bounded() {
    let (store, idem) = setup();
    store.release.set(1);
    let call = idem
        .call(key("dropped"), Fingerprint::NONE)
        .run(|| async { std::future::pending::<u8>().await });
    assert!(tokio::time::timeout(Duration::from_millis(100), call)
        .await
        .is_err());
    assert_eq!(store.release.calls(), 0, "released in a task of its own");
    tokio::time::sleep(STEP + Duration::from_millis(100)).await;
    assert_eq!(store.release.calls(), 1);
    assert_eq!(
        store.release.abandoned(),
        1,
        "the background release still hangs"
    );
}

#[tokio::test(start_paused = true)]
async fn forget_is_bounded() {
    let (store, idem) = setup();
    store.delete.set(1);
    let started = Instant::now();
    let err = idem.forget(&key("forget")).await.unwrap_err();
    assert_eq!(started.elapsed(), STEP);
    assert_timeout(&err, "delete", STEP);
    assert!(!idem.forget(&key("forget")).await.unwrap());
}

#[test]
fn the_store_timeout_is_validated_and_defaults_to_five_seconds() {
    for bad in [Duration::ZERO, Duration::from_secs(200 * 365 * 24 * 3600)] {
        let err = Idem::builder()
            .store(MemoryStore::new())
            .store_timeout(bad)
            .build()
            .unwrap_err();
        assert!(err.to_string().contains("store_timeout"), "{err}");
    }
    let idem = Idem::new(MemoryStore::new());
    assert_eq!(idem.store_timeout(), idem::DEFAULT_STORE_TIMEOUT);
    assert_eq!(idem::DEFAULT_STORE_TIMEOUT, Duration::from_secs(5));
}

#[test]
fn backends_are_named_and_wrappers_forward_the_name() {
    assert_eq!(MemoryStore::new().backend(), "memory");
    assert_eq!(Unnamed::default().backend(), "custom");
    let shared: Arc<dyn Store> = Arc::new(MemoryStore::new());
    assert_eq!(shared.backend(), "memory");
    // A `Box` is a `StoreWrapper` as well as a `Store`: with both traits in scope, say which.
    assert_eq!(Store::backend(&Box::new(shared)), "memory");
    assert_eq!(Arc::new(Unnamed::default()).backend(), "custom");
    // A wrapper that overrides steps but not the name still names its inner store.
    assert_eq!(Store::backend(&Hanging::default()), "memory");
}

fn self_bounded(bound: Duration, claim_takes: Duration) -> Idem {
    let store = SelfBounded {
        inner: MemoryStore::new(),
        bound,
        claim_takes,
    };
    Idem::builder()
        .store(store)
        .store_timeout(STEP)
        .build()
        .unwrap()
}

/// A store that bounds its own steps within the step timeout (the Redis store, by its
/// command timeout) is timed by that bound alone: the engine adds no timer of its own. So a
/// claim that (against its word) outlasts the step timeout is not cut off by the engine.
#[tokio::test(start_paused = true)]
async fn a_store_bounding_its_steps_within_the_store_timeout_gets_no_second_timer() {
    let idem = self_bounded(STEP / 2, STEP * 2);
    let started = Instant::now();
    let v: u32 = idem
        .call(key("self-bounded"), Fingerprint::NONE)
        .run(|| async { 5 })
        .await
        .unwrap();
    assert_eq!((v, started.elapsed()), (5, STEP * 2));
}

/// A bound longer than the step timeout changes nothing: the step timeout still holds.
#[tokio::test(start_paused = true)]
async fn a_store_bound_past_the_store_timeout_is_not_trusted() {
    let idem = self_bounded(STEP * 4, STEP * 2);
    let started = Instant::now();
    let err = idem
        .call(key("loosely-bounded"), Fingerprint::NONE)
        .run(|| async { 5u32 })
        .await
        .unwrap_err();
    assert_eq!(started.elapsed(), STEP);
    assert_timeout(&err, "claim", STEP);
}

/// A wrapper does not inherit the bound of the store it wraps (what it adds is outside
/// it); a boxed store is its store and keeps it; the Redis store's is its command timeout.
#[test]
fn wrappers_do_not_inherit_a_step_bound_and_boxes_do() {
    let bounded = SelfBounded {
        inner: MemoryStore::new(),
        bound: STEP,
        claim_takes: Duration::ZERO,
    };
    assert_eq!(Store::step_bound(&bounded), Some(STEP));
    let wrapped = Passing(bounded);
    assert_eq!(Store::step_bound(&wrapped), None);
    let Passing(bounded) = wrapped;
    let boxed: Box<dyn Store> = Box::new(bounded);
    assert_eq!(Store::step_bound(&boxed), Some(STEP));
    assert_eq!(Store::step_bound(&Arc::new(boxed)), Some(STEP));
}

#[tokio::test(start_paused = true)]
async fn a_hanging_wait_is_timed_by_the_engine_even_when_the_store_bounds_its_steps() {
    let idem = Idem::builder()
        .store(BoundedButWaitHangs {
            inner: MemoryStore::new(),
            bound: STEP / 2,
        })
        .store_timeout(STEP)
        .build()
        .unwrap();
    let k = key("bounded-wait");
    let _holder = {
        let (idem, k) = (idem.clone(), k.clone());
        tokio::spawn(async move {
            idem.call(k, Fingerprint::NONE)
                .lease(Duration::from_secs(60))
                .run(std::future::pending::<u8>)
                .await
        })
    };
    tokio::task::yield_now().await;
    let waiting = idem
        .call(k, Fingerprint::NONE)
        .in_progress(idem::InProgress::Wait)
        .wait_timeout(Duration::from_secs(2))
        .run(|| async { 1u8 });
    let res = tokio::time::timeout(Duration::from_secs(60), waiting)
        .await
        .expect("the hanging wait was cut off by the engine");
    match res {
        Err(Error::Store {
            source: StoreError::Timeout { step: "wait", .. },
            ..
        }) => {}
        other => panic!("expected a wait timeout, got {other:?}"),
    }
}
