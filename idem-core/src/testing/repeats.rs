//! Requests resent after a lost reply: a claim, a complete, an extend or a release repeated
//! with its token answers as the first did and changes nothing the first did not.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;

use super::support::*;
use crate::{Claim, Record, Store, Token};

/// A claim resent with the token it was made with (its reply was lost) is the same claim:
/// `Acquired` again, not a recovery, and the record is left as the first claim (and the
/// extend after it) wrote it, lease included.
#[doc(hidden)]
pub async fn claim_repeated_with_same_token_is_acquired_again(store: Arc<dyn Store>) {
    let k = key(&unique_scope("claim-repeated"), "k");
    let t = acquire(&*store, &k, &fp(4), LONG / 3).await;
    store
        .extend(&k, t, LONG)
        .await
        .expect("extend by the holder");
    // The resend asks for a short lease again: were it a new claim, the lease would shrink.
    for _ in 0..2 {
        match store.claim(&k, &fp(4), t, SHORT).await.unwrap() {
            Claim::Acquired {
                token, recovered, ..
            } => {
                assert_eq!(token, t);
                assert!(!recovered, "a resent claim is not a recovery");
            }
            other => panic!("a resent claim must be Acquired again, got {other:?}"),
        }
    }
    match store.get(&k).await.unwrap() {
        Some(Record::InProgress {
            token,
            fingerprint,
            lease_remaining,
        }) => {
            assert_eq!(token, t);
            assert_eq!(fingerprint, fp(4));
            assert!(
                lease_remaining > LONG / 2,
                "the resent claim rewrote the lease: {lease_remaining:?} left"
            );
        }
        other => panic!("expected the claim in progress, got {other:?}"),
    }
    store
        .complete(&k, t, Bytes::from_static(b"once"), LONG)
        .await
        .expect("the holder of a resent claim completes");
    assert_eq!(
        completed_payload(&*store, &k).await,
        Bytes::from_static(b"once")
    );
}

/// A claim with another token while the key is held is another caller: `InProgress`, and
/// the holder keeps the key (its token, its fingerprint).
#[doc(hidden)]
pub async fn claim_with_another_token_while_held_is_in_progress(store: Arc<dyn Store>) {
    let k = key(&unique_scope("claim-other-token"), "k");
    let t = acquire(&*store, &k, &fp(5), LONG).await;
    let other = Token(t.0 ^ 1);
    for f in [fp(5), fp(6)] {
        match store.claim(&k, &f, other, LONG).await.unwrap() {
            Claim::InProgress { fingerprint, .. } => assert_eq!(fingerprint, fp(5)),
            answer => panic!("a claim with another token while held: {answer:?}"),
        }
    }
    assert!(
        matches!(store.get(&k).await.unwrap(), Some(Record::InProgress { token, .. }) if token == t),
        "the holder lost the key to another token"
    );
    assert_fenced(
        store
            .complete(&k, other, Bytes::from_static(b"other"), LONG)
            .await,
        "complete with the token that was answered InProgress",
    );
    store
        .complete(&k, t, Bytes::from_static(b"holder"), LONG)
        .await
        .unwrap();
}

/// A complete resent after it succeeded answers `Ok` and changes nothing: the first
/// payload and its expiry stand, whatever the resend carries. Another token is still fenced.
#[doc(hidden)]
pub async fn complete_repeated_with_same_token_keeps_the_first_result(store: Arc<dyn Store>) {
    let k = key(&unique_scope("complete-repeated"), "k");
    let t = acquire(&*store, &k, &fp(1), LONG).await;
    // Long enough for the checks below on a busy machine, short enough to watch it end.
    let ttl = SHORT * 8;
    store
        .complete(&k, t, Bytes::from_static(b"first"), ttl)
        .await
        .unwrap();
    // After the store set the expiry, so the wait at the end is surely past it.
    let completed_at = Instant::now();
    store
        .complete(&k, t, Bytes::from_static(b"first"), ttl)
        .await
        .expect("a repeated complete is answered like the first");
    store
        .complete(&k, t, Bytes::from_static(b"second"), LONG)
        .await
        .expect("a repeated complete is answered like the first");
    assert_eq!(
        completed_payload(&*store, &k).await,
        Bytes::from_static(b"first")
    );
    assert_fenced(
        store
            .complete(&k, Token(t.0 ^ 1), Bytes::from_static(b"other"), LONG)
            .await,
        "complete of a completed record with another token",
    );
    // The repeat with a long ttl did not extend the record: it ends with the first ttl.
    tokio::time::sleep(
        (completed_at + ttl + (PAST_SHORT - SHORT)).saturating_duration_since(Instant::now()),
    )
    .await;
    assert!(
        store.get(&k).await.unwrap().is_none(),
        "a repeated complete changed the record's expiry"
    );
}

/// An extend resent with the holder's token is answered `Ok` each time and sets the lease
/// from now: repeats do not add up.
#[doc(hidden)]
pub async fn extend_repeated_with_same_token_is_ok(store: Arc<dyn Store>) {
    let k = key(&unique_scope("extend-repeated"), "k");
    let t = acquire(&*store, &k, &fp(1), LONG / 3).await;
    for _ in 0..3 {
        store
            .extend(&k, t, LONG)
            .await
            .expect("a repeated extend by the holder");
    }
    match store.get(&k).await.unwrap() {
        Some(Record::InProgress {
            token,
            lease_remaining,
            ..
        }) => {
            assert_eq!(token, t);
            assert!(
                lease_remaining > LONG / 2 && lease_remaining <= LONG,
                "three extends by {LONG:?} left {lease_remaining:?}"
            );
        }
        other => panic!("expected the claim in progress, got {other:?}"),
    }
    store
        .complete(&k, t, Bytes::from_static(b"ok"), LONG)
        .await
        .unwrap();
}

/// A release resent after it deleted the claim finds no record and answers `Ok`; once
/// another caller holds the key, the same release is fenced and leaves that claim alone.
#[doc(hidden)]
pub async fn release_repeated_with_same_token_is_ok(store: Arc<dyn Store>) {
    let k = key(&unique_scope("release-repeated"), "k");
    let t = acquire(&*store, &k, &fp(1), LONG).await;
    store.release(&k, t).await.unwrap();
    store
        .release(&k, t)
        .await
        .expect("a repeated release finds nothing left to delete");
    assert!(store.get(&k).await.unwrap().is_none());
    let next = acquire(&*store, &k, &fp(1), LONG).await;
    assert_fenced(
        store.release(&k, t).await,
        "a late release once another caller holds the key",
    );
    assert!(
        matches!(store.get(&k).await.unwrap(), Some(Record::InProgress { token, .. }) if token == next)
    );
}

/// Deleting a key whose claim has ended leaves nothing of it: the old holder's late release
/// then finds nothing (as a release repeated after a delete does), and the key is fresh.
/// Found by the model-based test: a SQL store once kept the ended row, and answered that
/// release with `Fenced`.
#[doc(hidden)]
pub async fn delete_of_an_ended_claim_leaves_nothing(store: Arc<dyn Store>) {
    let k = key(&unique_scope("delete-ended"), "k");
    let t = acquire(&*store, &k, &fp(1), SHORT).await;
    tokio::time::sleep(PAST_SHORT).await;
    assert!(
        !store.delete(&k).await.unwrap(),
        "an ended claim is no record to delete"
    );
    store
        .release(&k, t)
        .await
        .expect("after a delete, a late release finds nothing under the key");
    assert!(store.get(&k).await.unwrap().is_none());
    match store
        .claim(&k, &fp(2), Token::random(), LONG)
        .await
        .unwrap()
    {
        Claim::Acquired { recovered, .. } => {
            assert!(
                !recovered,
                "a deleted key is claimed afresh, not taken over"
            )
        }
        other => panic!("expected Acquired, got {other:?}"),
    }
}

/// A stored result cannot be released by its former holder.
#[doc(hidden)]
pub async fn release_after_complete_is_fenced(store: Arc<dyn Store>) {
    let k = key(&unique_scope("release-completed"), "k");
    let t = acquire(&*store, &k, &fp(1), LONG).await;
    store
        .complete(&k, t, Bytes::from_static(b"kept"), LONG)
        .await
        .unwrap();
    assert_fenced(store.release(&k, t).await, "release after complete");
    assert_eq!(
        completed_payload(&*store, &k).await,
        Bytes::from_static(b"kept")
    );
}
