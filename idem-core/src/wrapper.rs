//! [`StoreWrapper`]: a store that wraps another (to count, log, or inject faults) and
//! forwards every operation it does not override, so that forgetting one cannot change what the
//! store offers.

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;

use crate::error::StoreError;
use crate::key::Key;
use crate::store::{Capabilities, Claim, Fingerprint, Record, Store, Token};

/// A [`Store`] made of another one: implement [`inner`](StoreWrapper::inner) and override
/// only the operations the wrapper changes; every other operation, [`capabilities`](Store::capabilities)
/// and [`backend`](Store::backend) included, is the inner store's. Every `StoreWrapper` is a
/// `Store`.
///
/// Writing `impl Store` for a wrapper instead means forwarding each method by hand, and a
/// forgotten `capabilities` silently turns the inner store's wake-ups into polling, a
/// forgotten `backend` names the wrong backend in timeouts.
///
/// ```
/// use std::sync::atomic::{AtomicU32, Ordering};
/// use std::time::Duration;
/// use idem::{store::async_trait, store::Claim, Fingerprint, Idem, Key, MemoryStore, store::Store, store::StoreError, store::StoreWrapper, store::Token};
///
/// /// Counts claims; everything else is the inner store's.
/// #[derive(Debug)]
/// struct CountingClaims<S> {
///     inner: S,
///     claims: AtomicU32,
/// }
///
/// #[async_trait]
/// impl<S: Store> StoreWrapper for CountingClaims<S> {
///     type Inner = S;
///     fn inner(&self) -> &S {
///         &self.inner
///     }
///     async fn claim(&self, key: &Key, fp: &Fingerprint, token: Token, lease: Duration) -> Result<Claim, StoreError> {
///         self.claims.fetch_add(1, Ordering::Relaxed);
///         self.inner.claim(key, fp, token, lease).await
///     }
/// }
///
/// let store = CountingClaims { inner: MemoryStore::new(), claims: AtomicU32::new(0) };
/// // The memory store's capabilities and name come through untouched.
/// assert!(Store::capabilities(&store).wakes_waiters);
/// assert_eq!(Store::backend(&store), "memory");
/// let idem = Idem::new(store);
/// ```
///
/// A type that implements both traits has each operation twice; with both traits in scope, call
/// the store's as `Store::claim(&wrapper, ...)`.
#[async_trait]
pub trait StoreWrapper: Send + Sync + fmt::Debug + 'static {
    /// The wrapped store.
    type Inner: Store + ?Sized;

    /// The wrapped store, which every operation not overridden goes to.
    fn inner(&self) -> &Self::Inner;

    /// [`Store::claim`]; the inner store's unless overridden.
    async fn claim(
        &self,
        key: &Key,
        fingerprint: &Fingerprint,
        token: Token,
        lease: Duration,
    ) -> Result<Claim, StoreError> {
        self.inner().claim(key, fingerprint, token, lease).await
    }

    /// [`Store::complete`]; the inner store's unless overridden.
    async fn complete(
        &self,
        key: &Key,
        token: Token,
        payload: Bytes,
        ttl: Duration,
    ) -> Result<(), StoreError> {
        self.inner().complete(key, token, payload, ttl).await
    }

    /// [`Store::release`]; the inner store's unless overridden.
    async fn release(&self, key: &Key, token: Token) -> Result<(), StoreError> {
        self.inner().release(key, token).await
    }

    /// [`Store::extend`]; the inner store's unless overridden.
    async fn extend(&self, key: &Key, token: Token, lease: Duration) -> Result<(), StoreError> {
        self.inner().extend(key, token, lease).await
    }

    /// [`Store::get`]; the inner store's unless overridden.
    async fn get(&self, key: &Key) -> Result<Option<Record>, StoreError> {
        self.inner().get(key).await
    }

    /// [`Store::delete`]; the inner store's unless overridden.
    async fn delete(&self, key: &Key) -> Result<bool, StoreError> {
        self.inner().delete(key).await
    }

    /// [`Store::replace`]; the inner store's unless overridden.
    async fn replace(
        &self,
        key: &Key,
        expected: &[u8],
        new: Option<(Bytes, Duration)>,
    ) -> Result<bool, StoreError> {
        self.inner().replace(key, expected, new).await
    }

    /// [`Store::wait`]; the inner store's unless overridden.
    async fn wait(&self, key: &Key, at_most: Duration) -> Result<(), StoreError> {
        self.inner().wait(key, at_most).await
    }

    /// [`Store::capabilities`]; the inner store's unless overridden.
    fn capabilities(&self) -> Capabilities {
        self.inner().capabilities()
    }

    /// [`Store::backend`]; the inner store's unless overridden.
    fn backend(&self) -> &'static str {
        self.inner().backend()
    }

    /// [`Store::step_bound`]; none unless overridden, and not the inner store's: what a
    /// wrapper adds around an operation (a retry, a delay, a second call) is outside the inner
    /// store's bound. A wrapper that adds no time may forward it.
    fn step_bound(&self) -> Option<Duration> {
        None
    }
}

#[async_trait]
impl<W: StoreWrapper> Store for W {
    async fn claim(
        &self,
        key: &Key,
        fingerprint: &Fingerprint,
        token: Token,
        lease: Duration,
    ) -> Result<Claim, StoreError> {
        StoreWrapper::claim(self, key, fingerprint, token, lease).await
    }
    async fn complete(
        &self,
        key: &Key,
        token: Token,
        payload: Bytes,
        ttl: Duration,
    ) -> Result<(), StoreError> {
        StoreWrapper::complete(self, key, token, payload, ttl).await
    }
    async fn release(&self, key: &Key, token: Token) -> Result<(), StoreError> {
        StoreWrapper::release(self, key, token).await
    }
    async fn extend(&self, key: &Key, token: Token, lease: Duration) -> Result<(), StoreError> {
        StoreWrapper::extend(self, key, token, lease).await
    }
    async fn get(&self, key: &Key) -> Result<Option<Record>, StoreError> {
        StoreWrapper::get(self, key).await
    }
    async fn delete(&self, key: &Key) -> Result<bool, StoreError> {
        StoreWrapper::delete(self, key).await
    }
    async fn replace(
        &self,
        key: &Key,
        expected: &[u8],
        new: Option<(Bytes, Duration)>,
    ) -> Result<bool, StoreError> {
        StoreWrapper::replace(self, key, expected, new).await
    }
    async fn wait(&self, key: &Key, at_most: Duration) -> Result<(), StoreError> {
        StoreWrapper::wait(self, key, at_most).await
    }
    fn capabilities(&self) -> Capabilities {
        StoreWrapper::capabilities(self)
    }
    fn backend(&self) -> &'static str {
        StoreWrapper::backend(self)
    }
    fn step_bound(&self) -> Option<Duration> {
        StoreWrapper::step_bound(self)
    }
}

/// A boxed store is a wrapper of what it holds (an impl of its own would overlap with the
/// one above, since `Box` is a fundamental type).
impl<S: Store + ?Sized> StoreWrapper for Box<S> {
    type Inner = S;
    fn inner(&self) -> &S {
        self
    }
    fn step_bound(&self) -> Option<Duration> {
        (**self).step_bound()
    }
}
