//! The store contract: what every backend implements.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use serde::Serialize;

use crate::digest;
use crate::error::StoreError;
use crate::key::Key;

/// A fencing token: issued by the store with each successful claim, different from every
/// token issued earlier for the same key. The store accepts `complete`, `extend` and
/// `release` only with the current token, so a holder that outlived its lease cannot
/// overwrite its successor's result.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Token(pub u64);

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Token({:#018x})", self.0)
    }
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

/// A 128-bit digest of a request's payload. The same key with a different fingerprint is
/// refused ([`Error::KeyReuse`](crate::Error::KeyReuse)). [`Fingerprint::NONE`] turns the
/// check off: it matches every fingerprint.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint(pub [u8; 16]);

impl Fingerprint {
    /// No fingerprint: matches any other.
    pub const NONE: Fingerprint = Fingerprint([0; 16]);

    /// The fingerprint of a value, through the same fixed encoding as key digests (but a
    /// different blake3 context, so the two never coincide).
    pub fn of<T: Serialize + ?Sized>(value: &T) -> Fingerprint {
        let mut bytes = digest::fingerprint_bytes(value);
        if bytes == [0; 16] {
            // Keep NONE reserved; a real digest of zero has odds of 2^-128.
            bytes[15] = 1;
        }
        Fingerprint(bytes)
    }

    /// Whether a request with this fingerprint may use a record with `other`.
    pub fn matches(&self, other: &Fingerprint) -> bool {
        *self == Fingerprint::NONE || *other == Fingerprint::NONE || self == other
    }

    /// The raw bytes.
    pub fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }

    /// Builds a fingerprint from 16 bytes read back from a store.
    pub fn from_slice(bytes: &[u8]) -> Option<Fingerprint> {
        <[u8; 16]>::try_from(bytes).ok().map(Fingerprint)
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Fingerprint(")?;
        for b in &self.0[..6] {
            write!(f, "{b:02x}")?;
        }
        f.write_str("..)")
    }
}

/// The answer of [`Store::claim`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Claim {
    /// The caller now holds the key under a lease and must run the body.
    Acquired {
        /// The fencing token of this claim.
        token: Token,
        /// Whether an earlier claim's lease had ended and this one took the key over.
        recovered: bool,
    },
    /// Another claim holds the key and its lease has not ended.
    InProgress {
        /// The fingerprint of the request holding the key.
        fingerprint: Fingerprint,
        /// How long that claim's lease still runs.
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
}

impl Capabilities {
    /// No optional capability.
    pub const NONE: Capabilities = Capabilities {
        wakes_waiters: false,
    };

    /// Sets [`Capabilities::wakes_waiters`].
    pub const fn with_wakes_waiters(mut self, yes: bool) -> Self {
        self.wakes_waiters = yes;
        self
    }
}

/// Where idempotency records live. Every step is atomic on one key.
///
/// Time (lease and record expiry) is the store's own clock: Redis `PX`, Postgres `now()`,
/// tokio's clock in memory; never one client's wall clock.
///
/// Every backend passes the conformance suite in `idem_core::testing` (feature `testing`).
#[async_trait]
pub trait Store: Send + Sync + fmt::Debug + 'static {
    /// In one atomic step: no live record, or an in-progress record whose lease has ended,
    /// becomes an in-progress record held for `lease` under a new token (`Acquired`,
    /// `recovered` when a lease was taken over); a live in-progress record answers
    /// `InProgress`; a completed record answers `Completed` with its payload.
    async fn claim(
        &self,
        key: &Key,
        fingerprint: &Fingerprint,
        lease: Duration,
    ) -> Result<Claim, StoreError>;

    /// Stores the result for `ttl` if `token` is current; [`StoreError::Fenced`] otherwise.
    async fn complete(
        &self,
        key: &Key,
        token: Token,
        payload: Bytes,
        ttl: Duration,
    ) -> Result<(), StoreError>;

    /// Deletes the in-progress record if `token` is current, so that a retry runs again;
    /// [`StoreError::Fenced`] otherwise.
    async fn release(&self, key: &Key, token: Token) -> Result<(), StoreError>;

    /// Sets the lease of the in-progress record to `lease` from now if `token` is current;
    /// [`StoreError::Fenced`] otherwise.
    async fn extend(&self, key: &Key, token: Token, lease: Duration) -> Result<(), StoreError>;

    /// The live record under `key`, if any.
    async fn get(&self, key: &Key) -> Result<Option<Record>, StoreError>;

    /// Deletes whatever lives under `key`; whether there was something.
    async fn delete(&self, key: &Key) -> Result<bool, StoreError>;

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
    /// `"postgres"`, `"redis"`, `"redis-cluster"`; `"custom"` unless a store says otherwise.
    /// The engine names it in the [`StoreError::Timeout`] of a step that ran out of time.
    fn backend(&self) -> &'static str {
        "custom"
    }
}

macro_rules! forward_store {
    ($($ty:ty),*) => {$(
        #[async_trait]
        impl<S: Store + ?Sized> Store for $ty {
            async fn claim(&self, key: &Key, fingerprint: &Fingerprint, lease: Duration) -> Result<Claim, StoreError> {
                (**self).claim(key, fingerprint, lease).await
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
            async fn wait(&self, key: &Key, at_most: Duration) -> Result<(), StoreError> {
                (**self).wait(key, at_most).await
            }
            fn capabilities(&self) -> Capabilities {
                (**self).capabilities()
            }
            fn backend(&self) -> &'static str {
                (**self).backend()
            }
        }
    )*};
}
forward_store!(Arc<S>, Box<S>);
