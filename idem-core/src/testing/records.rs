//! The record round trips: a claim, a complete, a release, a `get`, a `delete` and a `wait`
//! each do what the contract says; a completed record lives for its ttl; concurrent claims
//! have one winner.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::support::*;
use crate::{Capabilities, Claim, Record, Store, Token};

/// A fresh key is acquired, not recovered.
#[doc(hidden)]
pub async fn claim_fresh_key_is_acquired(store: Arc<dyn Store>) {
    let k = key(&unique_scope("fresh"), "k");
    let mine = Token::random();
    match store.claim(&k, &fp(1), mine, LONG).await.unwrap() {
        Claim::Acquired {
            token, recovered, ..
        } => {
            assert_eq!(token, mine, "the claim's token is the one the caller gave");
            assert!(!recovered, "a fresh key is not a recovery");
        }
        other => panic!("expected Acquired, got {other:?}"),
    }
}

/// A held key answers InProgress with a retry-after within the lease.
#[doc(hidden)]
pub async fn claim_held_key_is_in_progress(store: Arc<dyn Store>) {
    let k = key(&unique_scope("held"), "k");
    acquire(&*store, &k, &fp(1), LONG).await;
    match claim_anew(&*store, &k, &fp(1), LONG).await.unwrap() {
        Claim::InProgress { retry_after, .. } => {
            assert!(
                retry_after <= LONG,
                "retry_after {retry_after:?} exceeds the lease"
            );
            assert!(
                retry_after >= LONG / 2,
                "retry_after {retry_after:?} is far below the lease"
            );
        }
        other => panic!("expected InProgress, got {other:?}"),
    }
}

/// After complete, a claim answers Completed with the exact payload.
#[doc(hidden)]
pub async fn complete_then_claim_replays_payload(store: Arc<dyn Store>) {
    let k = key(&unique_scope("replay"), "k");
    let t = acquire(&*store, &k, &fp(1), LONG).await;
    store
        .complete(&k, t, Bytes::from_static(b"result-1"), LONG)
        .await
        .unwrap();
    for _ in 0..3 {
        assert_eq!(
            completed_payload(&*store, &k).await,
            Bytes::from_static(b"result-1")
        );
    }
}

/// Release deletes the claim: the next claim acquires, with its own token.
#[doc(hidden)]
pub async fn release_lets_next_claim_acquire(store: Arc<dyn Store>) {
    let k = key(&unique_scope("release"), "k");
    let t1 = acquire(&*store, &k, &fp(1), LONG).await;
    store.release(&k, t1).await.unwrap();
    assert!(
        store.get(&k).await.unwrap().is_none(),
        "a released key has no record"
    );
    let t2 = acquire(&*store, &k, &fp(1), LONG).await;
    assert_ne!(t1, t2, "two claims, two tokens");
}

/// `get` of a key never used is None.
#[doc(hidden)]
pub async fn get_missing_is_none(store: Arc<dyn Store>) {
    let k = key(&unique_scope("get-missing"), "nothing-here");
    assert!(store.get(&k).await.unwrap().is_none());
}

/// `get` sees the in-progress record with its token, then the completed one.
#[doc(hidden)]
pub async fn get_sees_in_progress_then_completed(store: Arc<dyn Store>) {
    let k = key(&unique_scope("get"), "k");
    let t = acquire(&*store, &k, &fp(3), LONG).await;
    match store.get(&k).await.unwrap() {
        Some(Record::InProgress {
            token,
            fingerprint,
            lease_remaining,
        }) => {
            assert_eq!(token, t);
            assert_eq!(fingerprint, fp(3));
            assert!(lease_remaining <= LONG && lease_remaining > Duration::ZERO);
        }
        other => panic!("expected InProgress, got {other:?}"),
    }
    store
        .complete(&k, t, Bytes::from_static(b"done"), LONG)
        .await
        .unwrap();
    match store.get(&k).await.unwrap() {
        Some(Record::Completed {
            payload,
            fingerprint,
        }) => {
            assert_eq!(payload, Bytes::from_static(b"done"));
            assert_eq!(fingerprint, fp(3));
        }
        other => panic!("expected Completed, got {other:?}"),
    }
}

/// `delete` removes a completed record: the next claim acquires.
#[doc(hidden)]
pub async fn delete_removes_record(store: Arc<dyn Store>) {
    let k = key(&unique_scope("delete"), "k");
    let t = acquire(&*store, &k, &fp(1), LONG).await;
    store
        .complete(&k, t, Bytes::from_static(b"x"), LONG)
        .await
        .unwrap();
    assert!(
        store.delete(&k).await.unwrap(),
        "delete of a live record answers true"
    );
    assert!(store.get(&k).await.unwrap().is_none());
    acquire(&*store, &k, &fp(1), LONG).await;
}

/// `delete` of a key never used answers false.
#[doc(hidden)]
pub async fn delete_missing_is_false(store: Arc<dyn Store>) {
    let k = key(&unique_scope("delete-missing"), "k");
    assert!(!store.delete(&k).await.unwrap());
}

/// A completed record is gone once its ttl ends: the next claim acquires afresh.
#[doc(hidden)]
pub async fn completed_record_expires_after_ttl(store: Arc<dyn Store>) {
    let k = key(&unique_scope("expiry"), "k");
    let t = acquire(&*store, &k, &fp(1), LONG).await;
    // Long enough that the record is surely read back before it ends on a loaded machine,
    // short enough to watch it end.
    let ttl = SHORT * 4;
    store
        .complete(&k, t, Bytes::from_static(b"x"), ttl)
        .await
        .unwrap();
    // After the store set the expiry, so the wait below is surely past it.
    let completed_at = Instant::now();
    assert!(matches!(
        store.get(&k).await.unwrap(),
        Some(Record::Completed { .. })
    ));
    tokio::time::sleep(
        (completed_at + ttl + (PAST_SHORT - SHORT)).saturating_duration_since(Instant::now()),
    )
    .await;
    assert!(
        store.get(&k).await.unwrap().is_none(),
        "the record outlived its ttl"
    );
    match claim_anew(&*store, &k, &fp(2), LONG).await.unwrap() {
        Claim::Acquired { recovered, .. } => {
            assert!(!recovered, "an expired result is not a recovery")
        }
        other => panic!("expected Acquired after expiry, got {other:?}"),
    }
}

/// A record completed under a short lease lives for its ttl, not its lease.
#[doc(hidden)]
pub async fn completed_record_outlives_its_lease(store: Arc<dyn Store>) {
    let k = key(&unique_scope("outlives-lease"), "k");
    // Long enough for the complete to land inside it on a loaded machine.
    let lease = SHORT * 4;
    let t = acquire(&*store, &k, &fp(1), lease).await;
    let claimed_at = Instant::now();
    store
        .complete(&k, t, Bytes::from_static(b"kept"), LONG)
        .await
        .unwrap();
    tokio::time::sleep(
        (claimed_at + lease + (PAST_SHORT - SHORT)).saturating_duration_since(Instant::now()),
    )
    .await;
    assert_eq!(
        completed_payload(&*store, &k).await,
        Bytes::from_static(b"kept")
    );
}

/// 100 tasks claim one key at once: exactly one acquires, the others see it in progress.
#[doc(hidden)]
pub async fn concurrent_claims_have_one_winner(store: Arc<dyn Store>) {
    let k = key(&unique_scope("race"), "k");
    let barrier = Arc::new(tokio::sync::Barrier::new(100));
    let tasks: Vec<_> = (0..100)
        .map(|_| {
            let (store, k, barrier) = (store.clone(), k.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                claim_anew(&*store, &k, &fp(1), LONG).await.unwrap()
            })
        })
        .collect();
    let (mut won, mut busy) = (0, 0);
    for t in tasks {
        match t.await.unwrap() {
            Claim::Acquired { .. } => won += 1,
            Claim::InProgress { .. } => busy += 1,
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!((won, busy), (1, 99), "exactly one winner");
}

/// `wait` returns within its bound. A store that claims `wakes_waiters` returns soon after
/// a completion; one that does not may sleep its whole bound, and callers poll.
#[doc(hidden)]
pub async fn wait_capability_is_honest(store: Arc<dyn Store>) {
    let k = key(&unique_scope("wait"), "k");
    let t = acquire(&*store, &k, &fp(1), LONG).await;
    let started = Instant::now();
    store.wait(&k, Duration::from_millis(200)).await.unwrap();
    let waited = started.elapsed();
    assert!(
        waited < Duration::from_secs(5),
        "wait ignored its bound: {waited:?}"
    );

    // A store that wakes waiters returns about 100ms in, when the record completes; one
    // that does not sleeps out the bound. The bound is short so that polling stores do not
    // slow the suite, and long enough that a wake is told from a sleep on a busy machine.
    let bound = Duration::from_secs(3);
    let caps: Capabilities = store.capabilities();
    let waiter = {
        let (store, k) = (store.clone(), k.clone());
        tokio::spawn(async move {
            let started = Instant::now();
            store.wait(&k, bound).await.unwrap();
            started.elapsed()
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    store
        .complete(&k, t, Bytes::from_static(b"x"), LONG)
        .await
        .unwrap();
    let waited = tokio::time::timeout(bound * 3, waiter)
        .await
        .expect("wait hung")
        .unwrap();
    if caps.wakes_waiters {
        assert!(
            waited < bound * 2 / 3,
            "the store says it wakes waiters, but a waiter slept {waited:?} after the completion"
        );
    } else {
        assert!(
            waited >= Duration::from_millis(100),
            "returned before anything changed: {waited:?}"
        );
    }
}
