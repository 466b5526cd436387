//! Leases and fencing: a lease ends and is taken over, an extend keeps it, a stale or
//! unknown token is refused, and each claim's fence is larger than the one before.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::support::*;
use crate::{Claim, Key, Record, Store, Token};

/// Once a lease ends, another claim takes the key over with its own token, and says it
/// recovered the key exactly when the store claims [`Capabilities::reports_recovery`].
#[doc(hidden)]
pub async fn lease_takeover_after_lease_ends(store: Arc<dyn Store>) {
    let k = key(&unique_scope("takeover"), "k");
    // A lease long enough that the second claim surely lands inside it on a loaded machine
    // (or behind a durable store's replica wait); the sleep counts from when the first
    // claim returned, after the store started its lease.
    let lease = SHORT * 4;
    let t1 = acquire(&*store, &k, &fp(1), lease).await;
    let claimed_at = Instant::now();
    assert!(matches!(
        claim_anew(&*store, &k, &fp(1), LONG).await.unwrap(),
        Claim::InProgress { .. }
    ));
    tokio::time::sleep(
        (claimed_at + lease + (PAST_SHORT - SHORT)).saturating_duration_since(Instant::now()),
    )
    .await;
    let t2 = Token::random();
    match store.claim(&k, &fp(1), t2, LONG).await.unwrap() {
        Claim::Acquired {
            token, recovered, ..
        } => {
            assert_eq!(token, t2, "the successor holds the key under its own token");
            assert_ne!(token, t1);
            assert_eq!(
                recovered,
                store.capabilities().reports_recovery,
                "a takeover of an ended lease is `recovered` exactly when the store reports recovery"
            );
        }
        other => panic!("expected a takeover, got {other:?}"),
    }
}

/// A holder that extends its lease keeps the key past the original lease.
#[doc(hidden)]
pub async fn extend_keeps_lease_alive(store: Arc<dyn Store>) {
    // The lease here is longer than `SHORT`: each extension must land while
    // the lease still runs, and on a loaded two-core CI machine a sleep plus a
    // round trip has overrun 300 ms. 800 ms of slack per extension keeps the test
    // about the store, not the scheduler.
    let lease = Duration::from_millis(1_200);
    let k = key(&unique_scope("extend"), "k");
    let t = acquire(&*store, &k, &fp(1), lease).await;
    for _ in 0..4 {
        tokio::time::sleep(lease / 3).await;
        store
            .extend(&k, t, lease)
            .await
            .expect("extend by the holder");
    }
    // 4 * lease/3 > lease: without the extensions the lease would have ended.
    assert!(matches!(
        claim_anew(&*store, &k, &fp(1), LONG).await.unwrap(),
        Claim::InProgress { .. }
    ));
    store
        .complete(&k, t, Bytes::from_static(b"ok"), LONG)
        .await
        .expect("complete after extensions");
}

async fn stale_and_current(store: &dyn Store, k: &Key) -> (Token, Token) {
    let stale = acquire(store, k, &fp(1), SHORT).await;
    tokio::time::sleep(PAST_SHORT).await;
    let current = acquire(store, k, &fp(1), LONG).await;
    (stale, current)
}

/// A holder whose lease was taken over cannot store its result; the successor can.
#[doc(hidden)]
pub async fn fencing_stale_token_cannot_complete(store: Arc<dyn Store>) {
    let k = key(&unique_scope("fence-complete"), "k");
    let (stale, current) = stale_and_current(&*store, &k).await;
    assert_fenced(
        store
            .complete(&k, stale, Bytes::from_static(b"stale"), LONG)
            .await,
        "complete with a stale token",
    );
    assert!(
        matches!(store.get(&k).await.unwrap(), Some(Record::InProgress { token, .. }) if token == current)
    );
    store
        .complete(&k, current, Bytes::from_static(b"fresh"), LONG)
        .await
        .unwrap();
    assert_eq!(
        completed_payload(&*store, &k).await,
        Bytes::from_static(b"fresh")
    );
}

/// A stale token cannot extend the successor's lease.
#[doc(hidden)]
pub async fn fencing_stale_token_cannot_extend(store: Arc<dyn Store>) {
    let k = key(&unique_scope("fence-extend"), "k");
    let (stale, current) = stale_and_current(&*store, &k).await;
    assert_fenced(
        store.extend(&k, stale, LONG).await,
        "extend with a stale token",
    );
    store.extend(&k, current, LONG).await.unwrap();
}

/// A stale token cannot release the successor's claim.
#[doc(hidden)]
pub async fn fencing_stale_token_cannot_release(store: Arc<dyn Store>) {
    let k = key(&unique_scope("fence-release"), "k");
    let (stale, current) = stale_and_current(&*store, &k).await;
    assert_fenced(store.release(&k, stale).await, "release with a stale token");
    assert!(
        matches!(store.get(&k).await.unwrap(), Some(Record::InProgress { token, .. }) if token == current)
    );
}

/// complete and extend of a key never claimed are refused; a release of it has nothing to
/// delete (as for a repeated release) and writes nothing either.
#[doc(hidden)]
pub async fn fencing_unknown_token_is_refused(store: Arc<dyn Store>) {
    let k = key(&unique_scope("fence-unknown"), "k");
    let t = Token(0x5eed);
    assert_fenced(
        store.complete(&k, t, Bytes::from_static(b"x"), LONG).await,
        "complete without a claim",
    );
    assert_fenced(store.extend(&k, t, LONG).await, "extend without a claim");
    store
        .release(&k, t)
        .await
        .expect("a release where no record is has nothing to do");
    assert!(
        store.get(&k).await.unwrap().is_none(),
        "nothing was written"
    );
    // A held key refuses another token too.
    let held = acquire(&*store, &k, &fp(1), LONG).await;
    let other = Token(held.0.wrapping_add(1));
    assert_fenced(
        store
            .complete(&k, other, Bytes::from_static(b"x"), LONG)
            .await,
        "complete with a wrong token",
    );
}

/// Successive claims of one key carry strictly increasing fences where the store
/// [assigns fences](Capabilities::assigns_fences) (and [`Fence::NONE`] where it does not):
/// a takeover after a lease ended, a claim after a release, after the result expired and
/// after a delete, and claims in quick succession (release, claim again, as fast as the
/// store answers: a store whose clock counts milliseconds fails here). A claim resent with
/// its token answers the fence it was first given.
#[doc(hidden)]
pub async fn fences_increase_with_every_claim(store: Arc<dyn Store>) {
    let k = key(&unique_scope("fence-increases"), "k");
    let mut fences = Vec::new();

    let first = Token::random();
    let f = fence_of(&*store, &k, first, SHORT, "the first claim").await;
    let resent = fence_of(&*store, &k, first, SHORT, "the first claim, resent").await;
    assert_eq!(
        resent, f,
        "a resent claim answers the fence it was first given"
    );
    fences.push(("the first claim", f));

    tokio::time::sleep(PAST_SHORT).await;
    let successor = Token::random();
    let f = fence_of(&*store, &k, successor, LONG, "the takeover").await;
    fences.push(("the takeover of the ended lease", f));
    let resent = fence_of(&*store, &k, successor, LONG, "the takeover, resent").await;
    assert_eq!(
        resent, f,
        "a resent takeover answers the fence it was first given"
    );
    assert_fenced(
        store
            .complete(&k, first, Bytes::from_static(b"stale"), LONG)
            .await,
        "the first holder after the takeover",
    );

    store.release(&k, successor).await.unwrap();
    let t = Token::random();
    fences.push((
        "the claim after a release",
        fence_of(&*store, &k, t, LONG, "after release").await,
    ));

    store
        .complete(&k, t, Bytes::from_static(b"short-lived"), SHORT)
        .await
        .unwrap();
    tokio::time::sleep(PAST_SHORT).await;
    let t = Token::random();
    fences.push((
        "the claim after the result expired",
        fence_of(&*store, &k, t, LONG, "after expiry").await,
    ));

    store
        .complete(&k, t, Bytes::from_static(b"deleted"), LONG)
        .await
        .unwrap();
    assert!(store.delete(&k).await.unwrap());
    let mut t = Token::random();
    fences.push((
        "the claim after a delete",
        fence_of(&*store, &k, t, LONG, "after delete").await,
    ));

    const QUICK: [&str; 8] = [
        "quick claim 1",
        "quick claim 2",
        "quick claim 3",
        "quick claim 4",
        "quick claim 5",
        "quick claim 6",
        "quick claim 7",
        "quick claim 8",
    ];
    for what in QUICK {
        store.release(&k, t).await.unwrap();
        t = Token::random();
        fences.push((what, fence_of(&*store, &k, t, LONG, what).await));
    }

    // Another key has fences of its own, and they increase too.
    let other = key(&unique_scope("fence-increases"), "other");
    let o = Token::random();
    let a = fence_of(&*store, &other, o, LONG, "another key").await;
    store.release(&other, o).await.unwrap();
    let b = fence_of(&*store, &other, Token::random(), LONG, "another key again").await;

    assert_fences(&*store, &fences);
    assert_fences(&*store, &[("another key", a), ("another key again", b)]);
}
