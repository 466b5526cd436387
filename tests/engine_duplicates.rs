//! Duplicates of a call that still runs, through the facade: wait mode gets the first
//! result or gives up after its timeout, reject mode refuses with a short retry-after hint,
//! another payload is `KeyReuse` even while in progress, and a wrapped store keeps waking
//! its waiters.

mod support;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idem::{store::Claim, store::Store, Error, Fingerprint, Idem, InProgress, Key, MemoryStore};
use support::engine::{key, setup, PayError};
use support::stores::{ClaimFresh, CountingClaims, Faulty};

// On tokio's paused clock: the head start below is exact, not a hope.
#[tokio::test(start_paused = true)]
async fn wait_mode_returns_the_first_result_and_reject_mode_refuses() {
    let (_, idem) = setup();
    let k = key("wait");
    let runs = Arc::new(AtomicU32::new(0));
    let call = |mode| {
        let (idem, k, runs) = (idem.clone(), k.clone(), runs.clone());
        tokio::spawn(async move {
            idem.call(k, Fingerprint::NONE)
                .in_progress(mode)
                .run(|| async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    42u64
                })
                .await
        })
    };
    let first = call(InProgress::Reject);
    tokio::time::sleep(Duration::from_millis(50)).await;
    let rejected = call(InProgress::Reject).await.unwrap();
    match rejected {
        Err(Error::InProgress {
            retry_after,
            ref key,
        }) => {
            assert!(retry_after > Duration::ZERO);
            assert_eq!(key.id(), "wait");
            assert!(rejected
                .as_ref()
                .unwrap_err()
                .to_string()
                .contains("engine-tests/wait"));
        }
        other => panic!("expected InProgress, got {other:?}"),
    }
    let waited = call(InProgress::Wait).await.unwrap().unwrap();
    assert_eq!(waited, 42);
    assert_eq!(first.await.unwrap().unwrap(), 42);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

// On tokio's paused clock: the head start below is exact, not a hope.
#[tokio::test(start_paused = true)]
async fn a_waiter_runs_the_body_itself_when_the_first_call_fails() {
    let (_, idem) = setup();
    let k = key("wait-then-run");
    let first = {
        let (idem, k) = (idem.clone(), k.clone());
        tokio::spawn(async move {
            idem.call(k, Fingerprint::NONE)
                .run_fallible(|| async {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    Err::<u32, _>(PayError::Timeout)
                })
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    let waiter: Result<u32, PayError> = idem
        .call(k, Fingerprint::NONE)
        .in_progress(InProgress::Wait)
        .run_fallible(|| async { Ok(9) })
        .await;
    assert_eq!(first.await.unwrap(), Err(PayError::Timeout));
    assert_eq!(waiter, Ok(9));
}

// On tokio's paused clock: the head start below is exact, not a hope.
#[tokio::test(start_paused = true)]
async fn wait_mode_gives_up_after_its_timeout() {
    let (_, idem) = setup();
    let k = key("wait-timeout");
    let _holder = {
        let (idem, k) = (idem.clone(), k.clone());
        tokio::spawn(async move {
            idem.call(k, Fingerprint::NONE)
                .run(std::future::pending::<u8>)
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    let out = idem
        .call(k, Fingerprint::NONE)
        .in_progress(InProgress::Wait)
        .wait_timeout(Duration::from_millis(150))
        .run(|| async { 1u8 })
        .await;
    match out {
        Err(Error::WaitTimeout { waited, .. }) => assert!(waited >= Duration::from_millis(150)),
        other => panic!("expected WaitTimeout, got {other:?}"),
    }
}

// On tokio's paused clock: the head start below is exact, not a hope.
#[tokio::test(start_paused = true)]
async fn key_reuse_is_refused_while_in_progress_too() {
    let (_, idem) = setup();
    let k = key("reuse-in-progress");
    let _holder = {
        let (idem, k) = (idem.clone(), k.clone());
        tokio::spawn(async move {
            idem.call(k, Fingerprint::of(&1))
                .run(std::future::pending::<u8>)
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    let out = idem
        .call(k, Fingerprint::of(&2))
        .in_progress(InProgress::Wait)
        .run(|| async { 1u8 })
        .await;
    assert!(matches!(out, Err(Error::KeyReuse { .. })), "{out:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_wrapper_that_overrides_one_step_keeps_the_inner_store_s_wake_ups() {
    let store = Arc::new(CountingClaims::default());
    assert_eq!(
        Store::capabilities(&*store),
        MemoryStore::new().capabilities()
    );
    assert_eq!(Store::backend(&*store), "memory");
    let idem = Idem::builder()
        .store(store.clone())
        .wait_timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let (release_tx, release_rx) = tokio::sync::oneshot::channel::<()>();
    let holder = {
        let idem = idem.clone();
        tokio::spawn(async move {
            idem.call(key("woken"), Fingerprint::NONE)
                .run(|| async move {
                    release_rx.await.unwrap();
                    1u32
                })
                .await
        })
    };
    while store.claims.load(Ordering::SeqCst) == 0 {
        tokio::task::yield_now().await;
    }
    let waiters: Vec<_> = (0..10)
        .map(|_| {
            let idem = idem.clone();
            tokio::spawn(async move {
                idem.call(key("woken"), Fingerprint::NONE)
                    .in_progress(InProgress::Wait)
                    .run(|| async { 2u32 })
                    .await
            })
        })
        .collect();
    // The waiters claim once, find the key held, and wait: woken by the memory store, not
    // polling. With a 400 ms hold, polling (5 ms doubling to 250 ms) would claim about six
    // times per waiter; woken waiters claim once before and once after. Every waiter has
    // made its first claim before the hold starts counting, however late it was scheduled.
    while store.claims.load(Ordering::SeqCst) < 1 + 10 {
        tokio::task::yield_now().await;
    }
    tokio::time::sleep(Duration::from_millis(400)).await;
    release_tx.send(()).unwrap();
    assert_eq!(holder.await.unwrap().unwrap(), 1);
    for waiter in waiters {
        assert_eq!(waiter.await.unwrap().unwrap(), 1);
    }
    assert_eq!(store.claims.load(Ordering::SeqCst), 1 + 10 * 2);
}

/// Holds `k` in a call on `idem` whose body never ends, so that every other call of the key
/// is a duplicate while it runs.
async fn hold(idem: &Idem, k: &Key) -> tokio::task::JoinHandle<Result<u8, Error>> {
    let started = Arc::new(tokio::sync::Notify::new());
    let task = {
        let (idem, k, started) = (idem.clone(), k.clone(), started.clone());
        tokio::spawn(async move {
            idem.call(k, Fingerprint::NONE)
                .run(|| async move {
                    started.notify_one();
                    std::future::pending::<u8>().await
                })
                .await
        })
    };
    started.notified().await;
    task
}

/// The retry-after hint a duplicate of `k` gets from `call`.
async fn hint_of(call: idem::Call<'_>) -> Duration {
    match call.run(|| async { 0u8 }).await {
        Err(Error::InProgress { retry_after, .. }) => retry_after,
        other => panic!("expected InProgress, got {other:?}"),
    }
}

// On tokio's paused clock: the remaining lease is exact.
#[tokio::test(start_paused = true)]
async fn a_duplicate_s_retry_after_is_a_short_hint_not_the_whole_lease() {
    let store = Arc::new(Faulty::default());
    let lease = Duration::from_secs(60);
    let idem = Idem::builder()
        .store(store.clone())
        .lease(lease)
        .build()
        .unwrap();
    let k = key("retry-after-default");
    let holder = hold(&idem, &k).await;
    // The holder started a moment ago: its lease runs for almost a minute more. The hint
    // is the default all the same.
    let hint = hint_of(idem.call(k.clone(), Fingerprint::NONE)).await;
    assert_eq!(hint, idem::DEFAULT_RETRY_AFTER, "under a {lease:?} lease");
    // A short lease: a tenth of it.
    let hint = hint_of(
        idem.call(k.clone(), Fingerprint::NONE)
            .lease(Duration::from_millis(500)),
    )
    .await;
    assert_eq!(hint, Duration::from_millis(50));
    // Asked for: the engine's, then the call's, honoured.
    let tuned = Idem::builder()
        .store(store.clone())
        .lease(lease)
        .retry_after(Duration::from_millis(250))
        .build()
        .unwrap();
    let hint = hint_of(tuned.call(k.clone(), Fingerprint::NONE)).await;
    assert_eq!(hint, Duration::from_millis(250));
    let hint = hint_of(
        tuned
            .call(k.clone(), Fingerprint::NONE)
            .retry_after(Duration::from_secs(3)),
    )
    .await;
    assert_eq!(hint, Duration::from_secs(3));
    holder.abort();
}

// On tokio's paused clock: the remaining lease is exact.
#[tokio::test(start_paused = true)]
async fn a_retry_after_hint_never_exceeds_the_remaining_lease_nor_is_zero() {
    let store = Arc::new(Faulty::default());
    let idem = Idem::builder()
        .store(store.clone())
        .retry_after(Duration::from_secs(600))
        .build()
        .unwrap();
    // A holder (without heartbeat) whose 300 ms lease has 100 ms left.
    let k = key("retry-after-bounded");
    let claim = store
        .claim_fresh(&k, Duration::from_millis(300))
        .await
        .unwrap();
    assert!(matches!(claim, Claim::Acquired { .. }), "{claim:?}");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let hint = hint_of(idem.call(k.clone(), Fingerprint::NONE)).await;
    assert_eq!(hint, Duration::from_millis(100), "the remaining lease");
    // The tenth of a 1 ms lease is 100 µs: the hint is 1 ms, never zero.
    let k = key("retry-after-tiny-lease");
    let _holder = hold(&idem, &k).await;
    let hint = hint_of(
        Idem::new(store.clone())
            .call(k.clone(), Fingerprint::NONE)
            .lease(Duration::from_millis(1)),
    )
    .await;
    assert_eq!(hint, Duration::from_millis(1));
}
