//! What the behaviours share: test keys and scopes, fingerprints, claims as a caller or
//! another caller makes them, the leases and ttls of the suite, and the test servers' URLs.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;

use super::skips::skip;
use crate::{Claim, Fence, Fingerprint, Key, Store, StoreError, Token};

/// A lease long enough that it does not end during a test.
pub(super) const LONG: Duration = Duration::from_secs(30);
/// A lease or ttl short enough to watch it end.
pub(super) const SHORT: Duration = Duration::from_millis(300);
/// Past `SHORT`, with margin for a store's clock granularity.
pub(super) const PAST_SHORT: Duration = Duration::from_millis(700);

pub(super) static COUNTER: AtomicU64 = AtomicU64::new(0);

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

pub(super) fn key(scope: &str, id: &str) -> Key {
    Key::new(scope, id).expect("valid test key")
}

pub(super) fn fp(n: u8) -> Fingerprint {
    Fingerprint::of(&n)
}

/// Claims `k` with a new token and checks that the store kept that token.
pub(super) async fn acquire(store: &dyn Store, k: &Key, f: &Fingerprint, lease: Duration) -> Token {
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
pub(super) async fn claim_anew(
    store: &dyn Store,
    k: &Key,
    f: &Fingerprint,
    lease: Duration,
) -> Result<Claim, StoreError> {
    store.claim(k, f, Token::random(), lease).await
}

pub(super) async fn completed_payload(store: &dyn Store, k: &Key) -> Bytes {
    match claim_anew(store, k, &Fingerprint::NONE, LONG)
        .await
        .expect("claim")
    {
        Claim::Completed { payload, .. } => payload,
        other => panic!("expected Completed for {k}, got {other:?}"),
    }
}

pub(super) fn assert_fenced(res: Result<(), StoreError>, what: &str) {
    match res {
        Err(StoreError::Fenced) => {}
        other => panic!("{what}: expected StoreError::Fenced, got {other:?}"),
    }
}

/// A claim with `token` that must acquire `k`: its fence.
pub(super) async fn fence_of(
    store: &dyn Store,
    k: &Key,
    token: Token,
    lease: Duration,
    what: &str,
) -> Fence {
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
/// increasing where the store [assigns fences](crate::Capabilities::assigns_fences), all
/// [`Fence::NONE`] where it does not.
pub(super) fn assert_fences(store: &dyn Store, fences: &[(&str, Fence)]) {
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
