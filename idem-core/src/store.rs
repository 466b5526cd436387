//! The store contract: what every backend implements.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;

use crate::error::StoreError;
use crate::key::Key;

mod fencing;
mod fingerprint;

pub use fencing::{Fence, Token};
pub use fingerprint::Fingerprint;

/// The answer of [`Store::claim`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Claim {
    /// The caller now holds the key under a lease and must run the body.
    Acquired {
        /// The fencing token of this claim: the one the caller gave.
        token: Token,
        /// Whether an earlier claim's lease had ended and this one took the key over.
        recovered: bool,
        /// The claim's fence, assigned by the store: larger than the fence of every earlier
        /// claim of the key (see [`Fence`]), the same for a resent claim.
        /// [`Fence::NONE`] from a store without [`Capabilities::assigns_fences`].
        fence: Fence,
    },
    /// Another claim holds the key and its lease has not ended.
    InProgress {
        /// The fingerprint of the request holding the key.
        fingerprint: Fingerprint,
        /// How long that claim's lease still runs. (The engine's
        /// [`Error::InProgress`](crate::Error::InProgress) gives a shorter hint, bounded
        /// by this one.)
        retry_after: Duration,
    },
    /// The key has a stored result.
    Completed {
        /// The fingerprint of the request that stored it.
        fingerprint: Fingerprint,
        /// The stored bytes (a record envelope).
        payload: Bytes,
    },
}

/// What [`Store::get`] sees under a key.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Record {
    /// Held by a claim whose lease has not ended.
    InProgress {
        /// The fingerprint of the request holding the key.
        fingerprint: Fingerprint,
        /// The current fencing token.
        token: Token,
        /// How long the lease still runs.
        lease_remaining: Duration,
    },
    /// A stored result within its time to live.
    Completed {
        /// The fingerprint of the request that stored it.
        fingerprint: Fingerprint,
        /// The stored bytes.
        payload: Bytes,
    },
}

/// What a backend can and cannot do beyond the contract. The conformance suite checks
/// each flag both ways.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Capabilities {
    /// [`Store::wait`] returns as soon as a record completes or is released, instead of
    /// sleeping out its time (callers then poll with backoff).
    pub wakes_waiters: bool,
    /// A claim that takes over an in-progress record whose lease ended answers
    /// `Claim::Acquired { recovered: true }`: the store keeps an ended lease long enough to
    /// tell a takeover from a fresh key. Without it, such a takeover answers
    /// `recovered: false`, as for a key never used.
    pub reports_recovery: bool,
    /// Every `Claim::Acquired` carries a [`Fence`] larger than that of every earlier claim
    /// of the key, and a resent claim the same fence again: the promise [`Fence`] spells
    /// out. Every built-in store assigns fences. Without it (the default, for a store
    /// written before fences existed), claims answer [`Fence::NONE`] and a body's
    /// [`fence()`](crate::fence) is `None`: there is nothing to fence its writes with.
    pub assigns_fences: bool,
    /// [`Store::replace`] swaps a completed record for another, or deletes it, in one atomic
    /// operation that compares its payload first. Every built-in store replaces records; the
    /// engine needs it to resolve a step's unknown outcome ([`Idem::resolve`](crate::Idem::resolve)),
    /// and refuses to resolve on a store without it rather than risk deleting what another
    /// resolution or a running attempt wrote.
    pub replaces_records: bool,
}

impl Capabilities {
    /// No optional capability.
    pub const NONE: Capabilities = Capabilities {
        wakes_waiters: false,
        reports_recovery: false,
        assigns_fences: false,
        replaces_records: false,
    };

    /// Sets [`Capabilities::replaces_records`].
    pub const fn with_replaces_records(mut self, yes: bool) -> Self {
        self.replaces_records = yes;
        self
    }

    /// Sets [`Capabilities::assigns_fences`].
    pub const fn with_assigns_fences(mut self, yes: bool) -> Self {
        self.assigns_fences = yes;
        self
    }

    /// Sets [`Capabilities::reports_recovery`].
    pub const fn with_reports_recovery(mut self, yes: bool) -> Self {
        self.reports_recovery = yes;
        self
    }

    /// Sets [`Capabilities::wakes_waiters`].
    pub const fn with_wakes_waiters(mut self, yes: bool) -> Self {
        self.wakes_waiters = yes;
        self
    }
}

/// Where idempotency records live. Every operation is atomic on one key.
///
/// Time (lease and record expiry) is the store's own clock: Redis `PX`, Postgres `now()`,
/// tokio's clock in memory; never one client's wall clock.
///
/// An operation repeated with the same token has the effect of one: a client or a network that
/// resends a claim, complete, extend or release after losing its reply gets the answer of
/// the first, and the record is as the first left it.
///
/// Every backend passes the conformance suite in `idem::testing` (feature `testing`).
#[async_trait]
pub trait Store: Send + Sync + fmt::Debug + 'static {
    /// In one atomic operation: no live record, or an in-progress record whose lease has ended,
    /// becomes an in-progress record held for `lease` under `token` (`Acquired`,
    /// `recovered` when a lease was taken over); a live in-progress record answers
    /// `InProgress`, unless it is held by `token` itself: then this is a resent claim,
    /// answered `Acquired { token, recovered: false, fence }` with the fence it was first
    /// given, and the record left unchanged; a completed record answers `Completed` with its
    /// payload.
    ///
    /// `token` must be new for every call ([`Token::random`]); it is the claim's fencing
    /// token. A store that [assigns fences](Capabilities::assigns_fences) gives each claim
    /// that acquires the key a [`Fence`] larger than the one before, in the same atomic
    /// operation; any other store answers [`Fence::NONE`].
    async fn claim(
        &self,
        key: &Key,
        fingerprint: &Fingerprint,
        token: Token,
        lease: Duration,
    ) -> Result<Claim, StoreError>;

    /// Stores the result for `ttl` if `token` is current; [`StoreError::Fenced`] otherwise.
    /// Repeated after it succeeded (the record is completed under `token` and live), it
    /// answers `Ok` and leaves the stored record (payload and expiry) as it is.
    async fn complete(
        &self,
        key: &Key,
        token: Token,
        payload: Bytes,
        ttl: Duration,
    ) -> Result<(), StoreError>;

    /// Deletes the in-progress record if `token` is current, so that a retry runs again.
    /// When the key holds no record at all (a repeat: the first release deleted it), `Ok`;
    /// [`StoreError::Fenced`] when it holds anything else: another token's claim, an ended
    /// lease, or a completed record.
    async fn release(&self, key: &Key, token: Token) -> Result<(), StoreError>;

    /// Sets the lease of the in-progress record to `lease` from now if `token` is current
    /// (so a repeat sets the same deadline again, it does not add up);
    /// [`StoreError::Fenced`] otherwise.
    async fn extend(&self, key: &Key, token: Token, lease: Duration) -> Result<(), StoreError>;

    /// The live record under `key`, if any.
    async fn get(&self, key: &Key) -> Result<Option<Record>, StoreError>;

    /// Deletes whatever lives under `key`; whether there was something.
    async fn delete(&self, key: &Key) -> Result<bool, StoreError>;

    /// In one atomic operation: when the live record under `key` is a completed one whose payload
    /// is exactly `expected`, replaces it by `new` and answers `true`; anything else (no live
    /// record, an in-progress claim, another payload) is left as it is and answers `false`.
    /// `new` is the payload that takes its place (the record keeps its fingerprint and lives
    /// for the duration given, from now), or `None` to delete it.
    ///
    /// This is how a step's unknown outcome is resolved without ever deleting what another
    /// resolution, or an attempt that started since, wrote. A store that offers it sets
    /// [`Capabilities::replaces_records`]; the default answers a [`StoreError::Backend`]
    /// saying it does not.
    async fn replace(
        &self,
        key: &Key,
        expected: &[u8],
        new: Option<(Bytes, Duration)>,
    ) -> Result<bool, StoreError> {
        let _ = (key, expected, new);
        Err(StoreError::Backend {
            backend: self.backend(),
            source: "this store does not replace records (`Store::replace`)".into(),
        })
    }

    /// Waits up to `at_most` for the record under `key` to change (complete or release).
    /// It may return early for no reason; callers claim again after it. The default sleeps
    /// `at_most`, and callers poll with capped backoff.
    async fn wait(&self, key: &Key, at_most: Duration) -> Result<(), StoreError> {
        let _ = key;
        tokio::time::sleep(at_most).await;
        Ok(())
    }

    /// What this backend offers beyond the contract.
    fn capabilities(&self) -> Capabilities {
        Capabilities::NONE
    }

    /// The backend's name, as errors and logs show it: `"memory"`, `"sqlite"`,
    /// `"postgres"`, `"mysql"`, `"redis"`, `"redis-cluster"`; `"custom"` unless a store says
    /// otherwise.
    /// The engine names it in the [`StoreError::Timeout`] of an operation that ran out of time.
    fn backend(&self) -> &'static str {
        "custom"
    }

    /// How long an operation of this store takes at most, when the store bounds each one itself:
    /// `Some(d)` promises that [`claim`](Store::claim), [`complete`](Store::complete),
    /// [`release`](Store::release), [`extend`](Store::extend), [`get`](Store::get) and
    /// [`delete`](Store::delete) each answer within `d`, with a [`StoreError::Timeout`]
    /// naming the operation if nothing else. The engine then runs such an operation under no
    /// timer of its own when `d` is within its limit (the store timeout; for a complete, also
    /// no more than what is left of the lease), rather than under two (the Redis store
    /// bounds each script by its command timeout). [`wait`](Store::wait) is not covered: it
    /// is always timed by the engine. `None`, the default, promises nothing.
    fn step_bound(&self) -> Option<Duration> {
        None
    }
}

macro_rules! forward_store {
    ($($ty:ty),*) => {$(
        #[async_trait]
        impl<S: Store + ?Sized> Store for $ty {
            async fn claim(&self, key: &Key, fingerprint: &Fingerprint, token: Token, lease: Duration) -> Result<Claim, StoreError> {
                (**self).claim(key, fingerprint, token, lease).await
            }
            async fn complete(&self, key: &Key, token: Token, payload: Bytes, ttl: Duration) -> Result<(), StoreError> {
                (**self).complete(key, token, payload, ttl).await
            }
            async fn release(&self, key: &Key, token: Token) -> Result<(), StoreError> {
                (**self).release(key, token).await
            }
            async fn extend(&self, key: &Key, token: Token, lease: Duration) -> Result<(), StoreError> {
                (**self).extend(key, token, lease).await
            }
            async fn get(&self, key: &Key) -> Result<Option<Record>, StoreError> {
                (**self).get(key).await
            }
            async fn delete(&self, key: &Key) -> Result<bool, StoreError> {
                (**self).delete(key).await
            }
            async fn replace(&self, key: &Key, expected: &[u8], new: Option<(Bytes, Duration)>) -> Result<bool, StoreError> {
                (**self).replace(key, expected, new).await
            }
            async fn wait(&self, key: &Key, at_most: Duration) -> Result<(), StoreError> {
                (**self).wait(key, at_most).await
            }
            fn capabilities(&self) -> Capabilities {
                (**self).capabilities()
            }
            fn backend(&self) -> &'static str {
                (**self).backend()
            }
            fn step_bound(&self) -> Option<Duration> {
                (**self).step_bound()
            }
        }
    )*};
}
// `Box<S>` is a `StoreWrapper` (see wrapper.rs), and a store through it.
forward_store!(Arc<S>);
