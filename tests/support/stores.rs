//! Store wrappers the tests share, each around a `MemoryStore`: one that counts every step
//! and fails on demand (`Faulty`), one that counts claims alone (`CountingClaims`), one whose
//! steps hang on demand (`Hanging`), ones that bound their steps or not (`SelfBounded`,
//! `Passing`, `BoundedButWaitHangs`), and ones that name their backend otherwise (`Unnamed`,
//! `NamedAs`).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use idem::{
    store::Bytes, store::Claim, store::Record, store::Store, store::StoreError,
    store::StoreWrapper, store::Token, Fingerprint, Key, MemoryStore,
};

// --- taking a key directly ---------------------------------------------------------------

/// `claim` as another caller takes a key: no fingerprint, a fresh token.
pub trait ClaimFresh {
    fn claim_fresh<'a>(&'a self, key: &'a Key, lease: Duration) -> ClaimFuture<'a>;
}

pub type ClaimFuture<'a> = Pin<Box<dyn Future<Output = Result<Claim, StoreError>> + Send + 'a>>;

impl<S: Store + ?Sized> ClaimFresh for S {
    fn claim_fresh<'a>(&'a self, key: &'a Key, lease: Duration) -> ClaimFuture<'a> {
        Box::pin(async move {
            self.claim(key, &Fingerprint::NONE, Token::random(), lease)
                .await
        })
    }
}

// --- counting and failing -------------------------------------------------------------

/// A memory store that counts calls and can fail on demand.
#[derive(Debug, Default)]
pub struct Faulty {
    pub inner: MemoryStore,
    pub calls: AtomicU32,
    pub claims: AtomicU32,
    pub completes: AtomicU32,
    pub fail_claims: AtomicBool,
    pub fail_completes: AtomicU32,
    /// Completes that are stored, but whose answer is lost on the way back.
    pub lose_complete_answers: AtomicU32,
    /// After the next lost answer, another caller takes the key over and stores the very
    /// same bytes under its own token.
    pub take_over_after_lost_answer: AtomicBool,
    /// Milliseconds each complete and release takes before reaching the store.
    pub complete_delay_ms: AtomicU32,
    pub release_delay_ms: AtomicU32,
    pub extends: AtomicU32,
    /// Extends fail as an unreachable store does (nothing reaches the store).
    pub fail_extends: AtomicBool,
}

async fn delay(ms: &AtomicU32) {
    let ms = ms.load(Ordering::SeqCst);
    if ms > 0 {
        tokio::time::sleep(Duration::from_millis(ms.into())).await;
    }
}

pub fn unavailable() -> StoreError {
    StoreError::Unavailable {
        backend: "faulty",
        source: Box::new(std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            "connection refused (injected)",
        )),
    }
}

#[idem::store::async_trait]
impl StoreWrapper for Faulty {
    type Inner = MemoryStore;
    fn inner(&self) -> &MemoryStore {
        &self.inner
    }
    async fn claim(
        &self,
        key: &Key,
        fp: &Fingerprint,
        token: Token,
        lease: Duration,
    ) -> Result<Claim, StoreError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.claims.fetch_add(1, Ordering::SeqCst);
        if self.fail_claims.load(Ordering::SeqCst) {
            return Err(unavailable());
        }
        self.inner.claim(key, fp, token, lease).await
    }
    async fn complete(
        &self,
        key: &Key,
        token: Token,
        payload: Bytes,
        ttl: Duration,
    ) -> Result<(), StoreError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.completes.fetch_add(1, Ordering::SeqCst);
        delay(&self.complete_delay_ms).await;
        if self
            .fail_completes
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            return Err(unavailable());
        }
        self.inner
            .complete(key, token, payload.clone(), ttl)
            .await?;
        if self
            .lose_complete_answers
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            if self
                .take_over_after_lost_answer
                .swap(false, Ordering::SeqCst)
            {
                self.inner.delete(key).await?;
                let other = Token::random();
                self.inner
                    .claim(key, &Fingerprint::NONE, other, Duration::from_secs(5))
                    .await?;
                self.inner.complete(key, other, payload, ttl).await?;
            }
            return Err(unavailable());
        }
        Ok(())
    }
    async fn release(&self, key: &Key, token: Token) -> Result<(), StoreError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        delay(&self.release_delay_ms).await;
        self.inner.release(key, token).await
    }
    async fn extend(&self, key: &Key, token: Token, lease: Duration) -> Result<(), StoreError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.extends.fetch_add(1, Ordering::SeqCst);
        if self.fail_extends.load(Ordering::SeqCst) {
            return Err(unavailable());
        }
        self.inner.extend(key, token, lease).await
    }
}

/// Counts claims and nothing else: every other step, `wait` and `capabilities` included,
/// comes from the memory store through `StoreWrapper`'s defaults.
#[derive(Debug, Default)]
pub struct CountingClaims {
    pub inner: MemoryStore,
    pub claims: AtomicU32,
}

#[idem::store::async_trait]
impl StoreWrapper for CountingClaims {
    type Inner = MemoryStore;
    fn inner(&self) -> &MemoryStore {
        &self.inner
    }
    async fn claim(
        &self,
        key: &Key,
        fp: &Fingerprint,
        token: Token,
        lease: Duration,
    ) -> Result<Claim, StoreError> {
        self.claims.fetch_add(1, Ordering::SeqCst);
        self.inner.claim(key, fp, token, lease).await
    }
}

// --- hanging and bounded steps --------------------------------------------------------

/// How many of the next calls of one step hang.
#[derive(Debug, Default)]
pub struct Hang {
    next: AtomicU32,
    calls: AtomicU32,
    /// Hanging calls the engine gave up on (their future was dropped).
    abandoned: AtomicU32,
}

impl Hang {
    /// Counts the call; hangs until dropped when a hang is due.
    pub async fn maybe(&self) {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let due = self
            .next
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if due {
            let _noted = Abandoned(&self.abandoned);
            std::future::pending::<()>().await;
        }
    }

    pub fn set(&self, n: u32) {
        self.next.store(n, Ordering::SeqCst);
    }

    pub fn calls(&self) -> u32 {
        self.calls.load(Ordering::SeqCst)
    }

    pub fn abandoned(&self) -> u32 {
        self.abandoned.load(Ordering::SeqCst)
    }
}

/// Counts a hanging call when its future is dropped: only the engine's timeout ends one.
struct Abandoned<'a>(&'a AtomicU32);

impl Drop for Abandoned<'_> {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// A memory store whose steps can be made to hang.
#[derive(Debug, Default)]
pub struct Hanging {
    pub inner: MemoryStore,
    pub claim: Hang,
    pub complete: Hang,
    pub release: Hang,
    pub extend: Hang,
    pub delete: Hang,
}

#[idem::store::async_trait]
impl StoreWrapper for Hanging {
    type Inner = MemoryStore;
    fn inner(&self) -> &MemoryStore {
        &self.inner
    }
    async fn claim(
        &self,
        key: &Key,
        fp: &Fingerprint,
        token: Token,
        lease: Duration,
    ) -> Result<Claim, StoreError> {
        self.claim.maybe().await;
        self.inner.claim(key, fp, token, lease).await
    }
    async fn complete(
        &self,
        key: &Key,
        token: Token,
        payload: Bytes,
        ttl: Duration,
    ) -> Result<(), StoreError> {
        self.complete.maybe().await;
        self.inner.complete(key, token, payload, ttl).await
    }
    async fn release(&self, key: &Key, token: Token) -> Result<(), StoreError> {
        self.release.maybe().await;
        self.inner.release(key, token).await
    }
    async fn extend(&self, key: &Key, token: Token, lease: Duration) -> Result<(), StoreError> {
        self.extend.maybe().await;
        self.inner.extend(key, token, lease).await
    }
    async fn delete(&self, key: &Key) -> Result<bool, StoreError> {
        self.delete.maybe().await;
        self.inner.delete(key).await
    }
}

/// A store that does not name its backend.
#[derive(Debug, Default)]
pub struct Unnamed(pub MemoryStore);

#[idem::store::async_trait]
impl Store for Unnamed {
    async fn claim(
        &self,
        key: &Key,
        fp: &Fingerprint,
        token: Token,
        lease: Duration,
    ) -> Result<Claim, StoreError> {
        self.0.claim(key, fp, token, lease).await
    }
    async fn complete(
        &self,
        key: &Key,
        token: Token,
        payload: Bytes,
        ttl: Duration,
    ) -> Result<(), StoreError> {
        self.0.complete(key, token, payload, ttl).await
    }
    async fn release(&self, key: &Key, token: Token) -> Result<(), StoreError> {
        self.0.release(key, token).await
    }
    async fn extend(&self, key: &Key, token: Token, lease: Duration) -> Result<(), StoreError> {
        self.0.extend(key, token, lease).await
    }
    async fn get(&self, key: &Key) -> Result<Option<Record>, StoreError> {
        self.0.get(key).await
    }
    async fn delete(&self, key: &Key) -> Result<bool, StoreError> {
        self.0.delete(key).await
    }
}

/// A memory store that says it bounds each of its steps by `bound` ([`Store::step_bound`]),
/// and whose claims take `claim_takes`.
#[derive(Debug)]
pub struct SelfBounded {
    pub inner: MemoryStore,
    pub bound: Duration,
    pub claim_takes: Duration,
}

#[idem::store::async_trait]
impl StoreWrapper for SelfBounded {
    type Inner = MemoryStore;
    fn inner(&self) -> &MemoryStore {
        &self.inner
    }
    async fn claim(
        &self,
        key: &Key,
        fp: &Fingerprint,
        token: Token,
        lease: Duration,
    ) -> Result<Claim, StoreError> {
        tokio::time::sleep(self.claim_takes).await;
        self.inner.claim(key, fp, token, lease).await
    }
    fn step_bound(&self) -> Option<Duration> {
        Some(self.bound)
    }
}

/// A wrapper that overrides nothing.
#[derive(Debug)]
pub struct Passing<S>(pub S);

impl<S: Store> StoreWrapper for Passing<S> {
    type Inner = S;
    fn inner(&self) -> &S {
        &self.0
    }
}

/// A store that bounds its steps by `bound`, and whose `wait` never returns: `wait` is not
/// one of the steps its bound covers, so the engine times it whatever the store says.
#[derive(Debug)]
pub struct BoundedButWaitHangs {
    pub inner: MemoryStore,
    pub bound: Duration,
}

#[idem::store::async_trait]
impl StoreWrapper for BoundedButWaitHangs {
    type Inner = MemoryStore;
    fn inner(&self) -> &MemoryStore {
        &self.inner
    }
    async fn wait(&self, _key: &Key, _at_most: Duration) -> Result<(), StoreError> {
        std::future::pending().await
    }
    fn step_bound(&self) -> Option<Duration> {
        Some(self.bound)
    }
}

/// A memory store under another backend's name: stands for a Postgres or Redis store
/// beside the memory store.
#[derive(Debug)]
pub struct NamedAs {
    pub inner: MemoryStore,
    pub backend: &'static str,
}

impl NamedAs {
    /// A fresh memory store named `backend`.
    pub fn new(backend: &'static str) -> Self {
        NamedAs {
            inner: MemoryStore::new(),
            backend,
        }
    }
}

impl StoreWrapper for NamedAs {
    type Inner = MemoryStore;
    fn inner(&self) -> &MemoryStore {
        &self.inner
    }
    fn backend(&self) -> &'static str {
        self.backend
    }
}
