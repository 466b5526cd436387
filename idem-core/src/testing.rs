//! The conformance suite: every store backend passes it (feature `testing`).
//!
//! Each behaviour of the store contract is one async function of this module that takes
//! the store as an `Arc<dyn Store>` and panics when the store breaks the contract; its
//! name is in [`BEHAVIOURS`] and its doc comment in this file's source says what it
//! checks. [`conformance_tests!`](crate::conformance_tests) stamps one named
//! `#[tokio::test]` per behaviour for a backend, so that its tests read
//! `memory::lease_takeover_after_lease_ends`, `redis::fencing_stale_token_cannot_complete`,
//! and so on. The functions are hidden from the API: a store runs them through the macro.
//!
//! To run it against your own store, depend on `idem` with the `testing` feature and on
//! `tokio` with the features the stamped tests use, in your dev-dependencies:
//!
//! ```toml
//! [dev-dependencies]
//! idem = { package = "idemkit", version = "0.1", features = ["testing"] }
//! tokio = { version = "1", features = ["macros", "rt-multi-thread"] }
//! ```
//!
//! then, in a test file (`tests/conformance.rs`), one line per store:
//!
//! ```text
//! idem::conformance_tests!(my_store, async { Some(MyStore::connect().await) });
//! ```
//!
//! The second argument is a future that yields `Option<store>`: `None` skips the test (a
//! backend whose server is not configured prints why, and panics instead when
//! `IDEM_REQUIRE_BACKENDS=1`; see [`backend_url`]).
//!
//! Behaviours that only some backends offer are [`Capabilities`] flags; the suite checks
//! each flag both ways rather than skipping.
//!
//! Timing: leases and ttls in the suite are a few hundred milliseconds of real time, so the
//! suite runs against remote stores whose clock is their own.

mod replace;
mod skips;

#[doc(hidden)]
pub use replace::*;

pub use skips::skip;
#[doc(hidden)]
pub use skips::skipped;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::{
    Capabilities, Claim, Error, Fence, Fingerprint, Idem, InProgress, Key, Record, Store,
    StoreError, StoreWrapper, Token,
};

/// A lease long enough that it does not end during a test step.
const LONG: Duration = Duration::from_secs(30);
/// A lease or ttl short enough to watch it end.
const SHORT: Duration = Duration::from_millis(300);
/// Past `SHORT`, with margin for a store's clock granularity.
const PAST_SHORT: Duration = Duration::from_millis(700);

/// Every behaviour, by name: what [`conformance_tests!`](crate::conformance_tests) stamps.
pub const BEHAVIOURS: &[&str] = crate::__conformance_behaviours!(__behaviour_names!());

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// A scope no other test, process or earlier run uses, so backends on a shared server do
/// not see each other's keys.
pub fn unique_scope(behaviour: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!(
        "conformance.{behaviour}.{}.{nanos:x}.{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// The URL of a backend's test server, from the environment variable `var`.
///
/// Unset: [`skip`]s the test (it prints why, and the binary's skips are summed up when it
/// exits) and returns `None`; but when `IDEM_REQUIRE_BACKENDS=1` a missing server is a
/// failure, so it panics instead.
pub fn backend_url(var: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(url) if !url.is_empty() => Some(url),
        _ => {
            if std::env::var("IDEM_REQUIRE_BACKENDS").as_deref() == Ok("1") {
                panic!("IDEM_REQUIRE_BACKENDS=1 but {var} is not set: this backend test needs its server");
            }
            skip(&format!("{var} is not set"));
            None
        }
    }
}

fn key(scope: &str, id: &str) -> Key {
    Key::new(scope, id).expect("valid test key")
}

fn fp(n: u8) -> Fingerprint {
    Fingerprint::of(&n)
}

/// Claims `k` with a new token and checks that the store kept that token.
async fn acquire(store: &dyn Store, k: &Key, f: &Fingerprint, lease: Duration) -> Token {
    let mine = Token::random();
    match store.claim(k, f, mine, lease).await.expect("claim") {
        Claim::Acquired { token, .. } => {
            assert_eq!(token, mine, "the claim's token is the one the caller gave");
            token
        }
        other => panic!("expected Acquired for {k}, got {other:?}"),
    }
}

/// A claim as another caller makes it: with a token of its own.
async fn claim_anew(
    store: &dyn Store,
    k: &Key,
    f: &Fingerprint,
    lease: Duration,
) -> Result<Claim, StoreError> {
    store.claim(k, f, Token::random(), lease).await
}

async fn completed_payload(store: &dyn Store, k: &Key) -> Bytes {
    match claim_anew(store, k, &Fingerprint::NONE, LONG)
        .await
        .expect("claim")
    {
        Claim::Completed { payload, .. } => payload,
        other => panic!("expected Completed for {k}, got {other:?}"),
    }
}

fn assert_fenced(res: Result<(), StoreError>, what: &str) {
    match res {
        Err(StoreError::Fenced) => {}
        other => panic!("{what}: expected StoreError::Fenced, got {other:?}"),
    }
}

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
    // round trip has overrun 300 ms. 800 ms of slack per step keeps the test
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

/// An empty payload is stored and replayed as empty, not as missing.
#[doc(hidden)]
pub async fn empty_payload_round_trips(store: Arc<dyn Store>) {
    let k = key(&unique_scope("empty"), "k");
    let t = acquire(&*store, &k, &fp(1), LONG).await;
    store.complete(&k, t, Bytes::new(), LONG).await.unwrap();
    assert_eq!(completed_payload(&*store, &k).await, Bytes::new());
}

/// A 1 MiB payload round-trips byte for byte.
#[doc(hidden)]
pub async fn large_payload_round_trips(store: Arc<dyn Store>) {
    let k = key(&unique_scope("large"), "k");
    let payload: Bytes = (0..(1usize << 20))
        .map(|i| (i * 31 % 251) as u8)
        .collect::<Vec<_>>()
        .into();
    let t = acquire(&*store, &k, &fp(1), LONG).await;
    store.complete(&k, t, payload.clone(), LONG).await.unwrap();
    let back = completed_payload(&*store, &k).await;
    assert_eq!(back.len(), payload.len());
    assert!(back == payload, "1 MiB payload changed on the way");
}

/// Every byte value, NUL and invalid UTF-8 included, round-trips.
#[doc(hidden)]
pub async fn binary_payload_round_trips(store: Arc<dyn Store>) {
    let k = key(&unique_scope("binary"), "k");
    let mut payload: Vec<u8> = (0..=255u8).collect();
    payload.extend_from_slice(&[0, 0, 0xff, 0xfe, 0xc3, 0x28]);
    let t = acquire(&*store, &k, &fp(1), LONG).await;
    store
        .complete(&k, t, Bytes::from(payload.clone()), LONG)
        .await
        .unwrap();
    assert_eq!(completed_payload(&*store, &k).await, Bytes::from(payload));
}

async fn distinct_ids(store: &dyn Store, scope: &str, ids: &[String]) {
    for (i, id) in ids.iter().enumerate() {
        let k = key(scope, id);
        let t = acquire(store, &k, &fp(1), LONG).await;
        store
            .complete(&k, t, Bytes::from(i.to_string()), LONG)
            .await
            .unwrap();
    }
    for (i, id) in ids.iter().enumerate() {
        let k = key(scope, id);
        assert_eq!(
            completed_payload(store, &k).await,
            Bytes::from(i.to_string()),
            "key {id:?} reached another key's record"
        );
    }
}

/// Unicode keys that differ only in normalisation or case stay distinct.
#[doc(hidden)]
pub async fn unicode_keys_are_distinct(store: Arc<dyn Store>) {
    let ids: Vec<String> = [
        "café",
        "cafe\u{301}",
        "CAFÉ",
        "日本語",
        "🦀",
        "\u{2126}",
        "\u{3a9}",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    distinct_ids(&*store, &unique_scope("unicode"), &ids).await;
}

/// 1 KiB keys that differ only in their last byte stay distinct.
#[doc(hidden)]
pub async fn long_keys_are_distinct(store: Arc<dyn Store>) {
    let base = "x".repeat(crate::MAX_ID_LEN - 1);
    let ids: Vec<String> = ["a", "b", "c"]
        .iter()
        .map(|s| format!("{base}{s}"))
        .collect();
    distinct_ids(&*store, &unique_scope("long"), &ids).await;
}

/// Keys with spaces, glob and hash-tag characters, separators and newlines stay distinct
/// and reach no other key.
#[doc(hidden)]
pub async fn special_character_keys_are_distinct(store: Arc<dyn Store>) {
    let ids: Vec<String> = [
        "a b",
        "a*",
        "*",
        "{a}",
        "{",
        "}",
        "a:b",
        "a/b",
        "a\nb",
        "a\r\nb",
        "'; DROP TABLE x; --",
        "%",
        "_",
        "\\",
        "\"",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    distinct_ids(&*store, &unique_scope("special"), &ids).await;
}

/// Ids holding NUL, every other C0 control character and DEL are keys like any other: each
/// is stored and stays apart from the rest, `"a\0b"` from `"a%00b"` and `"a"` included (a
/// store that escapes such bytes must not map two ids onto one record).
#[doc(hidden)]
pub async fn control_character_keys_are_distinct(store: Arc<dyn Store>) {
    let mut ids: Vec<String> = [
        "a\0b", "a%00b", "a", "a%", "a%25", "a%2500b", "\0", "\0\0", "%00", "%2500", "%",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    ids.extend(
        (0x01u8..=0x1f)
            .chain([0x7f])
            .map(|c| format!("a{}b", char::from(c))),
    );
    distinct_ids(&*store, &unique_scope("control"), &ids).await;
}

/// Equal ids in two scopes are two keys.
#[doc(hidden)]
pub async fn scopes_keep_equal_ids_apart(store: Arc<dyn Store>) {
    let (a, b) = (unique_scope("scope-a"), unique_scope("scope-b"));
    let ka = key(&a, "same-id");
    let kb = key(&b, "same-id");
    let t = acquire(&*store, &ka, &fp(1), LONG).await;
    store
        .complete(&ka, t, Bytes::from_static(b"a"), LONG)
        .await
        .unwrap();
    acquire(&*store, &kb, &fp(1), LONG).await;
}

/// The claim's fingerprint is kept and reported by InProgress, Completed and get.
#[doc(hidden)]
pub async fn fingerprint_is_kept(store: Arc<dyn Store>) {
    let k = key(&unique_scope("fingerprint"), "k");
    let t = acquire(&*store, &k, &fp(7), LONG).await;
    match claim_anew(&*store, &k, &fp(8), LONG).await.unwrap() {
        Claim::InProgress { fingerprint, .. } => assert_eq!(fingerprint, fp(7)),
        other => panic!("expected InProgress, got {other:?}"),
    }
    store
        .complete(&k, t, Bytes::from_static(b"x"), LONG)
        .await
        .unwrap();
    match claim_anew(&*store, &k, &fp(8), LONG).await.unwrap() {
        Claim::Completed { fingerprint, .. } => assert_eq!(fingerprint, fp(7)),
        other => panic!("expected Completed, got {other:?}"),
    }
    let none = key(&unique_scope("fingerprint-none"), "k");
    let t = acquire(&*store, &none, &Fingerprint::NONE, LONG).await;
    store
        .complete(&none, t, Bytes::from_static(b"x"), LONG)
        .await
        .unwrap();
    match store.get(&none).await.unwrap() {
        Some(Record::Completed { fingerprint, .. }) => assert_eq!(fingerprint, Fingerprint::NONE),
        other => panic!("expected Completed, got {other:?}"),
    }
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

/// A claim with `token` that must acquire `k`: its fence.
async fn fence_of(store: &dyn Store, k: &Key, token: Token, lease: Duration, what: &str) -> Fence {
    match store.claim(k, &fp(1), token, lease).await.expect("claim") {
        Claim::Acquired {
            token: t, fence, ..
        } => {
            assert_eq!(
                t, token,
                "{what}: the claim's token is the one the caller gave"
            );
            fence
        }
        other => panic!("{what}: expected Acquired for {k}, got {other:?}"),
    }
}

/// Checks fences given in this order, each named by the claim that got it: strictly
/// increasing where the store [assigns fences](Capabilities::assigns_fences), all
/// [`Fence::NONE`] where it does not.
fn assert_fences(store: &dyn Store, fences: &[(&str, Fence)]) {
    if !store.capabilities().assigns_fences {
        for (what, fence) in fences {
            assert_eq!(
                *fence,
                Fence::NONE,
                "{what}: a store that does not claim `assigns_fences` answers Fence::NONE"
            );
        }
        return;
    }
    for (what, fence) in fences {
        assert_ne!(
            *fence,
            Fence::NONE,
            "{what}: a store that assigns fences gave none"
        );
    }
    for pair in fences.windows(2) {
        let ((before, earlier), (after, later)) = (pair[0], pair[1]);
        assert!(
            later > earlier,
            "fences must increase with every claim of a key: {after} got {later:?}, \
             not above {earlier:?} of {before} (all: {fences:?})"
        );
    }
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

/// Records the fence of every claim that acquires: what the store gave, to compare with
/// what the body saw.
#[derive(Debug)]
struct FenceRecorder {
    inner: Arc<dyn Store>,
    given: std::sync::Mutex<Vec<Fence>>,
}

#[crate::async_trait]
impl StoreWrapper for FenceRecorder {
    type Inner = dyn Store;

    fn inner(&self) -> &dyn Store {
        &*self.inner
    }

    async fn claim(
        &self,
        key: &Key,
        fingerprint: &Fingerprint,
        token: Token,
        lease: Duration,
    ) -> Result<Claim, StoreError> {
        let claim = self.inner.claim(key, fingerprint, token, lease).await?;
        if let Claim::Acquired { fence, .. } = &claim {
            self.given.lock().unwrap().push(*fence);
        }
        Ok(claim)
    }
}

/// What a body of [`engine_body_sees_its_fence`] answers: the fence it saw, as an error
/// (so that the claim is released) or a value.
#[derive(Debug)]
enum Seen {
    Idem(#[allow(dead_code)] Error),
    Released(Option<u64>),
}

impl From<Error> for Seen {
    fn from(e: Error) -> Self {
        Seen::Idem(e)
    }
}

/// Through the engine: a body reads its claim's fence with [`crate::fence()`], and it is the
/// fence the store gave that claim (`None` where the store assigns none, and outside a
/// body). After a holder that crashed (its lease ended), the call taking the key over sees a
/// larger fence than the crashed holder's; it fails, and the next call's body sees a larger
/// one still; a replay runs no body.
#[doc(hidden)]
pub async fn engine_body_sees_its_fence(store: Arc<dyn Store>) {
    let assigns = store.capabilities().assigns_fences;
    let recorder = Arc::new(FenceRecorder {
        inner: store.clone(),
        given: Default::default(),
    });
    let idem = Idem::builder()
        .shared_store(recorder.clone())
        .build()
        .unwrap();
    let k = key(&unique_scope("engine-fence"), "k");
    assert_eq!(crate::fence(), None, "no body runs here");

    // A holder that crashed: claimed, and never extended nor completed.
    let crashed = fence_of(&*store, &k, Token::random(), SHORT, "the crashed holder").await;
    tokio::time::sleep(PAST_SHORT).await;

    let failed = idem
        .call(k.clone(), fp(1))
        .run_fallible(|| async {
            Err::<Option<u64>, _>(Seen::Released(crate::fence().map(Fence::get)))
        })
        .await;
    let Err(Seen::Released(first)) = failed else {
        panic!("the first body's error comes back: {failed:?}")
    };
    let ran = idem
        .call(k.clone(), fp(1))
        .run_fallible(|| async { Ok::<_, Seen>(crate::fence().map(Fence::get)) })
        .await
        .unwrap();
    let replayed = idem
        .call(k.clone(), fp(1))
        .run_fallible(|| async { Ok::<_, Seen>(Some(u64::MAX)) })
        .await
        .unwrap();
    assert_eq!(replayed, ran, "a replay answers the stored value");

    let given = recorder.given.lock().unwrap().clone();
    assert_eq!(given.len(), 2, "two claims acquired: {given:?}");
    if assigns {
        assert_eq!(
            first,
            Some(given[0].get()),
            "the body sees the fence its claim got"
        );
        assert_eq!(
            ran,
            Some(given[1].get()),
            "the body sees the fence its claim got"
        );
    } else {
        assert_eq!(
            (first, ran),
            (None, None),
            "no fence where the store assigns none"
        );
    }
    assert_fences(
        &*store,
        &[
            ("the crashed holder", crashed),
            ("the takeover by a call", given[0]),
            ("the call after its release", given[1]),
        ],
    );
}

/// Through the engine: the body runs once, every caller gets its value.
#[doc(hidden)]
pub async fn engine_runs_once_and_replays(store: Arc<dyn Store>) {
    let idem = Idem::builder().shared_store(store).build().unwrap();
    let k = key(&unique_scope("engine"), "k");
    let runs = AtomicU64::new(0);
    for _ in 0..5 {
        let v: Vec<String> = idem
            .call(k.clone(), fp(1))
            .run(|| async {
                runs.fetch_add(1, Ordering::SeqCst);
                vec!["a".to_string(), "é".to_string()]
            })
            .await
            .unwrap();
        assert_eq!(v, vec!["a", "é"]);
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let reuse = idem
        .call(k.clone(), fp(2))
        .run(|| async { vec![String::new()] })
        .await;
    assert!(matches!(reuse, Err(Error::KeyReuse { .. })), "{reuse:?}");
}

/// Through the engine: a stored result that is not an idem record (a foreign writer, a
/// damaged row) is `Error::Decode` naming the key, never a value and never a second run.
#[doc(hidden)]
pub async fn engine_undecodable_result_is_a_decode_error_naming_the_key(store: Arc<dyn Store>) {
    let k = key(&unique_scope("junk"), "k");
    let t = acquire(&*store, &k, &fp(1), LONG).await;
    store
        .complete(&k, t, Bytes::from_static(b"not an envelope"), LONG)
        .await
        .unwrap();
    let idem = Idem::builder().shared_store(store).build().unwrap();
    let runs = AtomicU64::new(0);
    let err = idem
        .call(k.clone(), Fingerprint::NONE)
        .run(|| async {
            runs.fetch_add(1, Ordering::SeqCst);
            1u8
        })
        .await
        .unwrap_err();
    assert_eq!(runs.load(Ordering::SeqCst), 0, "the body ran again");
    assert!(
        matches!(&err, Error::Decode { key, .. } if *key == k),
        "{err:?}"
    );
    assert!(err.to_string().contains(k.as_str()), "{err}");
}

/// Through the engine: 20 concurrent duplicates in wait mode, one execution, one value.
#[doc(hidden)]
pub async fn engine_concurrent_duplicates_wait_for_one_run(store: Arc<dyn Store>) {
    let idem = Idem::builder()
        .shared_store(store)
        .in_progress(InProgress::Wait)
        .wait_timeout(Duration::from_secs(20))
        .build()
        .unwrap();
    let k = key(&unique_scope("engine-wait"), "k");
    let runs = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..20)
        .map(|i| {
            let (idem, k, runs) = (idem.clone(), k.clone(), runs.clone());
            tokio::spawn(async move {
                idem.call(k, fp(1))
                    .run(|| async move {
                        runs.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        i
                    })
                    .await
                    .unwrap()
            })
        })
        .collect();
    let mut values = Vec::new();
    for t in tasks {
        values.push(t.await.unwrap());
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the body ran more than once"
    );
    assert!(
        values.iter().all(|v| *v == values[0]),
        "callers got different values: {values:?}"
    );
}

/// Consumer dedup: the first mark of a key is [`Origin::Ran`](crate::Origin::Ran),
/// every later one [`Origin::Store`](crate::Origin::Store); a handler run
/// through `consume` runs once, and its key then reads as processed to `mark_processed`.
#[doc(hidden)]
pub async fn dedup_marks_once_and_tells_duplicates(store: Arc<dyn Store>) {
    use crate::Origin;
    let idem = Idem::builder().shared_store(store).build().unwrap();
    let scope = unique_scope("dedup");
    let k = key(&scope, "orders:3:1042");
    assert!(!idem.is_processed(&k).await.unwrap());
    assert_eq!(
        idem.mark_processed(k.clone(), Fingerprint::NONE)
            .await
            .unwrap(),
        Origin::Ran
    );
    for _ in 0..3 {
        assert_eq!(
            idem.mark_processed(k.clone(), Fingerprint::NONE)
                .await
                .unwrap(),
            Origin::Store
        );
    }
    assert!(idem.is_processed(&k).await.unwrap());
    // Another key of the same scope is its own message.
    let other = key(&scope, "orders:3:1043");
    assert_eq!(
        idem.mark_processed(other, Fingerprint::NONE).await.unwrap(),
        Origin::Ran
    );

    let runs = AtomicU64::new(0);
    let handled = key(&scope, "order-confirmation:o-7:1");
    let mut deliveries = Vec::new();
    for _ in 0..3 {
        let outcome = idem
            .consume(handled.clone(), Fingerprint::NONE)
            .run(|| async {
                runs.fetch_add(1, Ordering::SeqCst);
            })
            .await
            .unwrap();
        deliveries.push(outcome.origin());
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(deliveries, [Origin::Ran, Origin::Store, Origin::Store]);
    assert_eq!(
        idem.mark_processed(handled, Fingerprint::NONE)
            .await
            .unwrap(),
        Origin::Store
    );
}

/// Consumer dedup with the message's fingerprint: a redelivery of the same payload is a
/// duplicate; the same id with another payload is [`Error::KeyReuse`] through
/// `mark_processed` and `consume` alike, and its handler does not run; a record marked
/// without a fingerprint matches any payload.
#[doc(hidden)]
pub async fn dedup_refuses_a_reused_id_with_another_payload(store: Arc<dyn Store>) {
    use crate::Origin;
    let idem = Idem::builder().shared_store(store).build().unwrap();
    let scope = unique_scope("dedup-reuse");
    let (a, b) = (Fingerprint::of("payload a"), Fingerprint::of("payload b"));

    let marked = key(&scope, "evt-1");
    assert_eq!(
        idem.mark_processed(marked.clone(), a).await.unwrap(),
        Origin::Ran
    );
    assert_eq!(
        idem.mark_processed(marked.clone(), a).await.unwrap(),
        Origin::Store
    );
    assert!(matches!(
        idem.mark_processed(marked.clone(), b).await,
        Err(Error::KeyReuse { .. })
    ));

    let runs = AtomicU64::new(0);
    let handled = key(&scope, "evt-2");
    let run = || async {
        runs.fetch_add(1, Ordering::SeqCst);
    };
    let first = idem.consume(handled.clone(), a).run(run).await.unwrap();
    assert_eq!(first.origin(), Origin::Ran);
    let again = idem.consume(handled.clone(), a).run(run).await.unwrap();
    assert_eq!(again.origin(), Origin::Store);
    let reused = idem.consume(handled.clone(), b).run(run).await;
    assert!(matches!(reused, Err(Error::KeyReuse { .. })), "{reused:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the reused id did not run");
    // Each path sees the other's fingerprint.
    assert!(matches!(
        idem.mark_processed(handled, b).await,
        Err(Error::KeyReuse { .. })
    ));

    // Marked without a fingerprint: any payload is a duplicate of it.
    let trusted = key(&scope, "evt-3");
    idem.mark_processed(trusted.clone(), Fingerprint::NONE)
        .await
        .unwrap();
    assert_eq!(
        idem.mark_processed(trusted, b).await.unwrap(),
        Origin::Store
    );
}

/// Consumer dedup under real concurrency: 20 deliveries of one key marked at once, exactly
/// one is the first.
#[doc(hidden)]
pub async fn dedup_concurrent_deliveries_have_one_first(store: Arc<dyn Store>) {
    use crate::Origin;
    let idem = Idem::builder().shared_store(store).build().unwrap();
    let k = key(&unique_scope("dedup-concurrent"), "msg-1");
    let mut tasks = Vec::new();
    for _ in 0..20 {
        let idem = idem.clone();
        let k = k.clone();
        tasks.push(tokio::spawn(async move {
            // A duplicate that finds the first still running retries, as a consumer
            // requeueing it would.
            loop {
                match idem.mark_processed(k.clone(), Fingerprint::NONE).await {
                    Err(Error::InProgress { .. }) => tokio::task::yield_now().await,
                    other => return other.unwrap(),
                }
            }
        }));
    }
    let mut firsts = 0;
    for t in tasks {
        if t.await.unwrap() == Origin::Ran {
            firsts += 1;
        }
    }
    assert_eq!(
        firsts, 1,
        "exactly one of 20 concurrent deliveries is the first"
    );
}

/// Stamps one `#[tokio::test]` per conformance behaviour into a module named `$backend`.
///
/// `$make` is an expression, evaluated once per test, of a future that yields
/// `Option<S>` for a `S: Store` (`None` skips, see [`backend_url`]). The crate using it
/// needs `tokio` with the `macros` and `rt-multi-thread` features among its dev-dependencies
/// (the stamped tests are `#[tokio::test]`s); see the [module documentation](crate::testing).
///
/// ```text
/// idem::conformance_tests!(memory, async { Some(idem::MemoryStore::new()) });
/// ```
///
/// A store on tokio's clock (the memory store) can run the suite on a paused clock:
/// `conformance_tests!(memory, paused, async { ... })` stamps
/// `#[tokio::test(start_paused = true)]` tests instead, so that its leases and expiries
/// end exactly when the suite says rather than after real sleeps.
#[macro_export]
macro_rules! conformance_tests {
    ($backend:ident, paused, $make:expr) => {
        $crate::__conformance_behaviours!(__conformance_tests!(
            $backend,
            $make,
            (start_paused = true),
        ));
    };
    ($backend:ident, $make:expr) => {
        $crate::__conformance_behaviours!(__conformance_tests!(
            $backend,
            $make,
            (flavor = "multi_thread", worker_threads = 4),
        ));
    };
}

/// The one list of behaviours: hands it to the macro named in its argument, after that
/// macro's own arguments. `BEHAVIOURS` and `conformance_tests!` both read it from here.
#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_behaviours {
    ($callback:ident!($($args:tt)*)) => {
        $crate::$callback! {$($args)* [
            claim_fresh_key_is_acquired,
            claim_held_key_is_in_progress,
            complete_then_claim_replays_payload,
            release_lets_next_claim_acquire,
            get_missing_is_none,
            get_sees_in_progress_then_completed,
            delete_removes_record,
            delete_missing_is_false,
            completed_record_expires_after_ttl,
            completed_record_outlives_its_lease,
            lease_takeover_after_lease_ends,
            extend_keeps_lease_alive,
            fencing_stale_token_cannot_complete,
            fencing_stale_token_cannot_extend,
            fencing_stale_token_cannot_release,
            fencing_unknown_token_is_refused,
            fences_increase_with_every_claim,
            claim_repeated_with_same_token_is_acquired_again,
            claim_with_another_token_while_held_is_in_progress,
            complete_repeated_with_same_token_keeps_the_first_result,
            extend_repeated_with_same_token_is_ok,
            release_repeated_with_same_token_is_ok,
            release_after_complete_is_fenced,
            delete_of_an_ended_claim_leaves_nothing,
            concurrent_claims_have_one_winner,
            empty_payload_round_trips,
            large_payload_round_trips,
            binary_payload_round_trips,
            unicode_keys_are_distinct,
            long_keys_are_distinct,
            special_character_keys_are_distinct,
            control_character_keys_are_distinct,
            scopes_keep_equal_ids_apart,
            fingerprint_is_kept,
            wait_capability_is_honest,
            engine_runs_once_and_replays,
            engine_undecodable_result_is_a_decode_error_naming_the_key,
            engine_concurrent_duplicates_wait_for_one_run,
            engine_body_sees_its_fence,
            dedup_marks_once_and_tells_duplicates,
            dedup_concurrent_deliveries_have_one_first,
            dedup_refuses_a_reused_id_with_another_payload,
            replace_swaps_only_the_completed_payload_it_expects,
            replace_sets_the_new_records_ttl,
            concurrent_replaces_have_one_winner,
        ]}
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __behaviour_names {
    ([$($name:ident),* $(,)?]) => {
        &[$(stringify!($name)),*]
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_tests {
    ($backend:ident, $make:expr, $flavor:tt, [$($name:ident),* $(,)?]) => {
        mod $backend {
            #[allow(unused_imports)]
            use super::*;
            $(
                #[::tokio::test $flavor]
                async fn $name() {
                    let Some(store) = ($make).await else { return };
                    let store: ::std::sync::Arc<dyn $crate::Store> = ::std::sync::Arc::new(store);
                    $crate::testing::$name(store).await;
                }
            )*
        }
    };
}

#[cfg(test)]
mod tests {
    /// Every scenario function is in the list that `conformance_tests!` stamps.
    #[test]
    fn every_scenario_is_stamped() {
        let src = [
            include_str!("testing.rs"),
            include_str!("testing/replace.rs"),
        ];
        let scenarios: Vec<&str> = src
            .iter()
            .flat_map(|file| file.lines())
            .filter_map(|l| l.strip_prefix("pub async fn "))
            .filter_map(|l| l.split('(').next())
            .collect();
        assert!(scenarios.len() >= 20, "{scenarios:?}");
        for name in &scenarios {
            assert!(
                super::BEHAVIOURS.contains(name),
                "{name} is not in the conformance list"
            );
        }
        assert_eq!(scenarios.len(), super::BEHAVIOURS.len());
    }
}
