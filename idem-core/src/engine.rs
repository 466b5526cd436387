//! The `Idem` engine: claim, run once, store, replay.

use std::convert::Infallible;
use std::future::Future;
use std::pin::{pin, Pin};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde::{de::DeserializeOwned, Serialize};
use tokio::time::Instant;

use crate::cache::LocalCache;
use crate::codec::{BuiltinCodec, Codec};
use crate::digest;
use crate::envelope::{self, Kind};
use crate::error::{BoxError, DecodeError, Error, StoreError};
use crate::key::Key;
use crate::store::{Claim, Fingerprint, Store, Token};

/// The default time a stored result lives: 24 hours.
pub const DEFAULT_TTL: Duration = Duration::from_secs(24 * 60 * 60);
/// The default lease of a claim: 30 seconds, extended in the background while the body runs.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);
/// The default longest wait for a concurrent duplicate in `InProgress::Wait` mode.
pub const DEFAULT_WAIT_TIMEOUT: Duration = Duration::from_secs(10);
/// The default longest wait for one store step (claim, complete, extend, release, get,
/// delete), the store's wait for a free connection included.
pub const DEFAULT_STEP_TIMEOUT: Duration = Duration::from_secs(5);

/// The shortest ttl or lease accepted: stores keep time in milliseconds.
const MIN_DURATION: Duration = Duration::from_millis(1);
/// The longest ttl, lease or wait accepted: 100 years. Longer ones would overflow clocks
/// (`Instant + Duration`, Redis `PX`); no idempotency record needs to outlive that.
pub const MAX_DURATION: Duration = Duration::from_secs(100 * 365 * 24 * 60 * 60);
/// Longest pause between two claims of a waiting caller on a store that does not wake waiters.
const MAX_POLL: Duration = Duration::from_millis(250);
const FIRST_POLL: Duration = Duration::from_millis(5);
/// The first pause between two attempts to store a result; it doubles up to
/// `MAX_COMPLETE_BACKOFF`. Attempts go on while the lease runs: past it, the result could
/// no longer be stored anyway.
const FIRST_COMPLETE_BACKOFF: Duration = Duration::from_millis(20);
const MAX_COMPLETE_BACKOFF: Duration = Duration::from_millis(500);

/// What a call does when another call holds its key and is still running.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum InProgress {
    /// Answer at once with [`Error::InProgress`] and a retry-after hint.
    #[default]
    Reject,
    /// Wait (up to the wait timeout) for the first call's result and return it.
    Wait,
}

/// What a call does when its key expression yields nothing (`key = req.request_id` with a
/// `None` id): see [`Call::missing_key`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum MissingKey {
    /// Answer [`Error::MissingKey`] naming the scope; the body does not run.
    #[default]
    Error,
    /// Run the body without idempotency (no claim, nothing stored), and say so in a `warn`
    /// event of the `idem` target.
    Run,
}

/// The idempotency engine: a store plus defaults. Cheap to clone; share one per process.
///
/// See the `idem` crate's documentation for a runnable example on the memory store.
#[derive(Clone)]
pub struct Idem {
    inner: Arc<Inner>,
}

struct Inner {
    store: Arc<dyn Store>,
    codec: BuiltinCodec,
    ttl: Duration,
    lease: Duration,
    in_progress: InProgress,
    wait_timeout: Duration,
    step_timeout: Duration,
    cache: Option<LocalCache>,
}

impl std::fmt::Debug for Idem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Idem")
            .field("store", &self.inner.store)
            .field("codec", &self.inner.codec)
            .field("ttl", &self.inner.ttl)
            .field("lease", &self.inner.lease)
            .field("in_progress", &self.inner.in_progress)
            .field("wait_timeout", &self.inner.wait_timeout)
            .field("step_timeout", &self.inner.step_timeout)
            .field("local_cache", &self.inner.cache.is_some())
            .finish()
    }
}

/// Builds an [`Idem`]: `Idem::builder().store(s).ttl(...).build()`.
#[derive(Debug, Default)]
#[must_use]
pub struct IdemBuilder {
    store: Option<Arc<dyn Store>>,
    codec: BuiltinCodec,
    ttl: Option<Duration>,
    lease: Option<Duration>,
    in_progress: InProgress,
    wait_timeout: Option<Duration>,
    step_timeout: Option<Duration>,
    local_cache: Option<(usize, Duration)>,
}

impl IdemBuilder {
    /// The store (required). Any `Store`, including an `Arc<dyn Store>`.
    pub fn store<S: Store>(mut self, store: S) -> Self {
        self.store = Some(Arc::new(store));
        self
    }

    /// A store already shared as `Arc<dyn Store>`.
    pub fn shared_store(mut self, store: Arc<dyn Store>) -> Self {
        self.store = Some(store);
        self
    }

    /// The codec of stored results (default JSON).
    pub fn codec(mut self, codec: BuiltinCodec) -> Self {
        self.codec = codec;
        self
    }

    /// How long a stored result lives (default 24 hours).
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// How long a claim holds its key before another caller may take it over (default 30
    /// seconds). The engine extends it every third of its length while the body runs.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = Some(lease);
        self
    }

    /// What a concurrent duplicate does (default [`InProgress::Reject`]).
    pub fn in_progress(mut self, mode: InProgress) -> Self {
        self.in_progress = mode;
        self
    }

    /// How long a duplicate waits in [`InProgress::Wait`] mode (default 10 seconds).
    pub fn wait_timeout(mut self, timeout: Duration) -> Self {
        self.wait_timeout = Some(timeout);
        self
    }

    /// The longest wait for one store step (default 5 seconds): a claim, a complete, an
    /// extend, a release (also the background release of a dropped call), the delete of
    /// [`Idem::forget`], and the get that checks a complete whose answer was lost; a
    /// waiting duplicate's [`Store::wait`] gets its pause plus this. A step that runs out
    /// of time is abandoned and answers
    /// [`StoreError::Timeout`] naming the step and the backend, a temporary failure. The
    /// heartbeat tries again at its next beat; a complete is tried again while the lease
    /// runs. Keep the store's own timeouts (pool acquire, connect, command) at or below it.
    pub fn step_timeout(mut self, timeout: Duration) -> Self {
        self.step_timeout = Some(timeout);
        self
    }

    /// Keeps up to `capacity` completed results in process memory for at most `max_age`,
    /// so that replays of hot keys skip the store. A record deleted from the store through
    /// another process, or expired there, may still be replayed from here until `max_age`
    /// passes: keep `max_age` short next to the ttl.
    pub fn local_cache(mut self, capacity: usize, max_age: Duration) -> Self {
        self.local_cache = Some((capacity, max_age));
        self
    }

    /// Builds the engine. Fails when no store was given or a duration is zero (or over 100
    /// years).
    pub fn build(self) -> Result<Idem, Error> {
        let store = self.store.ok_or_else(|| Error::Connect {
            message: "Idem::builder() needs a store: call .store(...) before .build()".into(),
            source: None,
        })?;
        let ttl = self.ttl.unwrap_or(DEFAULT_TTL);
        let lease = self.lease.unwrap_or(DEFAULT_LEASE);
        let wait_timeout = self.wait_timeout.unwrap_or(DEFAULT_WAIT_TIMEOUT);
        let step_timeout = self.step_timeout.unwrap_or(DEFAULT_STEP_TIMEOUT);
        for (name, d) in [
            ("ttl", ttl),
            ("lease", lease),
            ("wait_timeout", wait_timeout),
            ("step_timeout", step_timeout),
        ] {
            if let Err(reason) = check_duration(d) {
                return Err(Error::Connect {
                    message: format!("Idem::builder(): `{name}` is {d:?}; {reason}"),
                    source: None,
                });
            }
        }
        Ok(Idem {
            inner: Arc::new(Inner {
                store,
                codec: self.codec,
                ttl,
                lease,
                in_progress: self.in_progress,
                wait_timeout,
                step_timeout,
                cache: self
                    .local_cache
                    .filter(|(capacity, _)| *capacity > 0)
                    .map(|(capacity, max_age)| LocalCache::new(capacity, max_age)),
            }),
        })
    }
}

impl Idem {
    /// An engine on `store` with every default.
    pub fn new<S: Store>(store: S) -> Idem {
        Idem::builder()
            .store(store)
            .build()
            .expect("the defaults are valid")
    }

    /// A builder.
    pub fn builder() -> IdemBuilder {
        IdemBuilder::default()
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.inner.store
    }

    /// The default time to live of stored results.
    pub fn ttl(&self) -> Duration {
        self.inner.ttl
    }

    /// The default lease.
    pub fn lease(&self) -> Duration {
        self.inner.lease
    }

    /// The longest wait for one store step.
    pub fn step_timeout(&self) -> Duration {
        self.inner.step_timeout
    }

    /// Starts a call under `key`, whose options can then be set one by one.
    pub fn call(&self, key: Key) -> Call<'_, BuiltinCodec> {
        self.call_checked(Ok(key))
    }

    /// Starts a call whose key may have failed to build; the error is returned when the
    /// call runs, before any store access. This is what `#[idempotent]` expands to.
    pub fn call_checked(&self, key: Result<Key, Error>) -> Call<'_, BuiltinCodec> {
        Call {
            idem: self,
            key,
            fingerprint: Fingerprint::NONE,
            ttl: None,
            lease: None,
            in_progress: None,
            wait_timeout: None,
            version: 0,
            missing_key: MissingKey::Error,
            codec: self.inner.codec,
        }
    }

    /// Runs `body` at most once for `key` and returns its (stored) result.
    /// Shorthand for `self.call(key).fingerprint(fingerprint).run(body)`.
    pub async fn run<T, F, Fut>(
        &self,
        key: Key,
        fingerprint: Fingerprint,
        body: F,
    ) -> Result<T, Error>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = T>,
        T: Serialize + DeserializeOwned,
    {
        self.call(key).fingerprint(fingerprint).run(body).await
    }

    /// Deletes the record under `key` from the store and from the local cache, so that the
    /// next call runs the body again.
    pub async fn forget(&self, key: &Key) -> Result<bool, Error> {
        if let Some(cache) = &self.inner.cache {
            cache.remove(key);
        }
        let store = &*self.inner.store;
        step(store, "delete", self.inner.step_timeout, store.delete(key))
            .await
            .map_err(|source| Error::Store {
                key: key.clone(),
                source,
            })
    }
}

/// One idempotent call: its key, fingerprint and options. Built by [`Idem::call`].
#[must_use = "a call does nothing until `.run(...)` is awaited"]
pub struct Call<'a, C = BuiltinCodec> {
    idem: &'a Idem,
    key: Result<Key, Error>,
    fingerprint: Fingerprint,
    ttl: Option<Duration>,
    lease: Option<Duration>,
    in_progress: Option<InProgress>,
    wait_timeout: Option<Duration>,
    version: u64,
    missing_key: MissingKey,
    codec: C,
}

impl<'a, C: Codec> Call<'a, C> {
    /// The fingerprint of the request (default [`Fingerprint::NONE`]: no check).
    pub fn fingerprint(mut self, fingerprint: Fingerprint) -> Self {
        self.fingerprint = fingerprint;
        self
    }

    /// The time to live of this call's result.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// The lease of this call's claim.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = Some(lease);
        self
    }

    /// What a concurrent duplicate of this call does.
    pub fn in_progress(mut self, mode: InProgress) -> Self {
        self.in_progress = Some(mode);
        self
    }

    /// How long this call waits for a concurrent duplicate in wait mode.
    pub fn wait_timeout(mut self, timeout: Duration) -> Self {
        self.wait_timeout = Some(timeout);
        self
    }

    /// The version of this call's result format (default 0), written into each record it
    /// stores. Raise it when a change of the result type must not read records written
    /// before it (with JSON, a compatible change such as a new `#[serde(default)]` field needs
    /// none): a record of another version is then refused with
    /// [`DecodeError::ResultVersion`] until it expires, and never decoded into the new type.
    pub fn version(mut self, version: u64) -> Self {
        self.version = version;
        self
    }

    /// What the call does when its key is missing ([`Error::MissingKey`], from a key
    /// expression that yields `None`): fail (the default) or run without idempotency.
    pub fn missing_key(mut self, mode: MissingKey) -> Self {
        self.missing_key = mode;
        self
    }

    /// The codec of this call's result.
    pub fn codec<C2: Codec>(self, codec: C2) -> Call<'a, C2> {
        Call {
            idem: self.idem,
            key: self.key,
            fingerprint: self.fingerprint,
            ttl: self.ttl,
            lease: self.lease,
            in_progress: self.in_progress,
            wait_timeout: self.wait_timeout,
            version: self.version,
            missing_key: self.missing_key,
            codec,
        }
    }

    /// Runs a body that cannot fail: its value is stored and replayed.
    pub async fn run<T, F, Fut>(self, body: F) -> Result<T, Error>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = T>,
        T: Serialize + DeserializeOwned,
    {
        self.run_eq(None, body).await
    }

    /// [`run`](Self::run), also comparing the decoded result with `==` when `#[idempotent]`
    /// found that its type has one.
    pub(crate) async fn run_eq<T, F, Fut>(self, eq: ValueEq<T>, body: F) -> Result<T, Error>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = T>,
        T: Serialize + DeserializeOwned,
    {
        let out = self
            .execute(|| async { Ok::<T, Infallible>(body().await) }, NoCache, eq)
            .await?;
        match out {
            Ok(v) => Ok(v),
            Err(never) => match never {},
        }
    }

    /// Runs a fallible body: `Ok` is stored and replayed, `Err` releases the claim so that a
    /// retry runs the body again.
    pub async fn run_fallible<T, E, F, Fut>(self, body: F) -> Result<T, E>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
        T: Serialize + DeserializeOwned,
        E: From<Error>,
    {
        self.run_fallible_eq(None, body).await
    }

    /// [`run_fallible`](Self::run_fallible) with the `==` of the result type, if known.
    pub(crate) async fn run_fallible_eq<T, E, F, Fut>(self, eq: ValueEq<T>, body: F) -> Result<T, E>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
        T: Serialize + DeserializeOwned,
        E: From<Error>,
    {
        match self.execute(body, NoCache, eq).await {
            Ok(out) => out,
            Err(e) => Err(E::from(e)),
        }
    }

    /// Like [`run_fallible`](Self::run_fallible), but an `Err` for which `cache_if` answers
    /// true is stored and replayed like a success (a declined card stays declined).
    pub async fn run_caching_errors<T, E, F, Fut, P>(self, cache_if: P, body: F) -> Result<T, E>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
        T: Serialize + DeserializeOwned,
        E: From<Error> + Serialize + DeserializeOwned,
        P: Fn(&E) -> bool,
    {
        self.run_caching_errors_eq(cache_if, (None, None), body)
            .await
    }

    /// [`run_caching_errors`](Self::run_caching_errors) with the `==` of the result and
    /// error types, if known.
    pub(crate) async fn run_caching_errors_eq<T, E, F, Fut, P>(
        self,
        cache_if: P,
        (eq, error_eq): (ValueEq<T>, ValueEq<E>),
        body: F,
    ) -> Result<T, E>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
        T: Serialize + DeserializeOwned,
        E: From<Error> + Serialize + DeserializeOwned,
        P: Fn(&E) -> bool,
    {
        match self.execute(body, CacheIf(cache_if, error_eq), eq).await {
            Ok(out) => out,
            Err(e) => Err(E::from(e)),
        }
    }

    async fn execute<T, E, F, Fut, P>(
        self,
        body: F,
        policy: P,
        eq: ValueEq<T>,
    ) -> Result<Result<T, E>, Error>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
        T: Serialize + DeserializeOwned,
        P: ErrorPolicy<E>,
    {
        let key = match self.key {
            Ok(key) => key,
            Err(Error::MissingKey { scope }) if self.missing_key == MissingKey::Run => {
                tracing::warn!(target: "idem", scope = %scope,
                    "no idempotency key for this call: running it without idempotency");
                return Ok(body().await);
            }
            Err(e) => return Err(e),
        };
        let inner = &*self.idem.inner;
        let ttl = self.ttl.unwrap_or(inner.ttl);
        let lease = self.lease.unwrap_or(inner.lease);
        let mode = self.in_progress.unwrap_or(inner.in_progress);
        let wait_timeout = self.wait_timeout.unwrap_or(inner.wait_timeout);
        for (option, d) in [
            ("ttl", ttl),
            ("lease", lease),
            ("wait_timeout", wait_timeout),
        ] {
            if let Err(reason) = check_duration(d) {
                return Err(Error::InvalidOption {
                    key,
                    option,
                    reason: format!("{d:?}: {reason}"),
                });
            }
        }
        let fp = self.fingerprint;
        let version = self.version;
        let codec = &self.codec;
        let store = &*inner.store;

        if let Some(hit) = inner.cache.as_ref().and_then(|c| c.get(&key)) {
            if !fp.matches(&hit.fingerprint) {
                return Err(Error::KeyReuse { key });
            }
            tracing::debug!(target: "idem", key = %key, "replay from the local cache");
            return decode(codec, &policy, version, key, &hit.payload);
        }

        let step_timeout = inner.step_timeout;
        let started = Instant::now();
        let mut poll = FIRST_POLL;
        // One token for the whole call: a claim the store answered but whose reply was lost
        // and that is sent again (by a retrying client) is then recognised as this call's.
        let ours = Token::random();
        let (token, leased_at) = loop {
            // Taken before the claim is sent, so that the lease the store grants never ends
            // before this instant plus `lease`.
            let sent_at = Instant::now();
            let claim = step(
                store,
                "claim",
                step_timeout,
                store.claim(&key, &fp, ours, lease),
            )
            .await
            .map_err(|source| store_error(&key, source))?;
            match claim {
                Claim::Acquired { token, recovered } => {
                    if recovered {
                        tracing::warn!(target: "idem", key = %key, token = %token,
                            "took over a claim whose lease had ended: its holder stopped or stalled");
                    } else {
                        tracing::debug!(target: "idem", key = %key, token = %token, "claimed");
                    }
                    break (token, sent_at);
                }
                Claim::Completed {
                    fingerprint,
                    payload,
                } => {
                    if !fp.matches(&fingerprint) {
                        return Err(Error::KeyReuse { key });
                    }
                    tracing::debug!(target: "idem", key = %key, "replay");
                    if let Some(cache) = &inner.cache {
                        cache.insert(key.clone(), fingerprint, payload.clone(), ttl);
                    }
                    return decode(codec, &policy, version, key, &payload);
                }
                Claim::InProgress {
                    fingerprint,
                    retry_after,
                } => {
                    if !fp.matches(&fingerprint) {
                        return Err(Error::KeyReuse { key });
                    }
                    if mode == InProgress::Reject {
                        return Err(Error::InProgress { key, retry_after });
                    }
                    let waited = started.elapsed();
                    if waited >= wait_timeout {
                        return Err(Error::WaitTimeout { key, waited });
                    }
                    let left = wait_timeout - waited;
                    let pause = if store.capabilities().wakes_waiters {
                        // Woken on change; the lease end is the latest useful look.
                        retry_after.max(MIN_DURATION).min(left)
                    } else {
                        poll.min(retry_after.max(MIN_DURATION)).min(left)
                    };
                    poll = (poll * 2).min(MAX_POLL);
                    tracing::trace!(target: "idem", key = %key, ?pause, "waiting for the holder");
                    // The store's wait is told to return within `pause`; the step timeout
                    // on top bounds one that does not.
                    step(store, "wait", pause + step_timeout, store.wait(&key, pause))
                        .await
                        .map_err(|source| store_error(&key, source))?;
                }
            }
        };

        // From here until the record is completed or released, dropping this future (or a
        // panic in the body) releases the claim in the background.
        let mut guard = ReleaseGuard {
            store: inner.store.clone(),
            step_timeout,
            key: key.clone(),
            token: Some(token),
        };
        let beat = with_heartbeat(store, step_timeout, &key, token, lease, leased_at, body()).await;
        let (out, lease_lost, leased_at) = (beat.out, beat.lost, beat.leased_at);

        let sealed = match &out {
            Ok(value) => envelope::seal(codec, Kind::Value, version, value),
            Err(e) if policy.cache(e) => policy.seal(codec, version, e),
            Err(_) => {
                guard.release().await;
                return Ok(out);
            }
        };
        // The body succeeded (or failed in a way to keep): from here on a release would
        // invite a second run of its side effect. If the result is not stored, the claim
        // ends with its lease instead, also when this future is dropped mid-way.
        guard.disarm();
        // Every caller gets the result as decoded from the store, the first one included,
        // so a value that does not come back unchanged through its codec is refused now,
        // not answered with another value: decoding is not enough (JSON writes `Some(())`
        // and `None` alike, and decodes both as `None`), the decoded value must also be the
        // same value as serde sees it.
        let checked = sealed.and_then(|bytes| {
            let decoded = match decode::<C, T, E, P>(codec, &policy, version, key.clone(), &bytes)
            {
                Ok(decoded) => decoded,
                Err(Error::Decode { source, .. }) => return Err(source.into()),
                Err(other) => return Err(other.into()),
            };
            if !policy.same(&out, &decoded, eq) {
                return Err(format!(
                    "the {} codec does not give this value back unchanged, so every caller would get another value (JSON, for one, writes `Some(())`, `Some(None)`, NaN and infinity as `null`, and an untagged enum comes back as the first variant that fits)",
                    codec.name()
                )
                .into());
            }
            Ok((Bytes::from(bytes), decoded))
        });
        let (sealed, out) = match checked {
            Ok(pair) => pair,
            Err(source) => {
                tracing::warn!(target: "idem", key = %key, error = %source,
                    "the result does not survive its codec; it is not stored, and the claim ends with its lease");
                return Err(Error::Encode { key, source });
            }
        };
        if lease_lost {
            return Err(Error::LeaseLost { key });
        }
        store_result(
            store,
            step_timeout,
            &key,
            token,
            &sealed,
            ttl,
            leased_at + lease,
        )
        .await?;
        tracing::debug!(target: "idem", key = %key, token = %token, "completed");
        if let Some(cache) = &inner.cache {
            cache.insert(key, fp, sealed, ttl);
        }
        Ok(out)
    }
}

fn check_duration(d: Duration) -> Result<(), &'static str> {
    if d < MIN_DURATION {
        Err("it must be at least 1ms")
    } else if d > MAX_DURATION {
        Err("it must be at most 100 years")
    } else {
        Ok(())
    }
}

/// A store failure as the caller sees it. A value under the key that is not an idem record
/// is a decode failure of that key, not an outage.
fn store_error(key: &Key, source: StoreError) -> Error {
    match source {
        StoreError::Corrupt { reason, .. } => Error::Decode {
            key: key.clone(),
            source: DecodeError::Corrupt { reason },
        },
        source => Error::Store {
            key: key.clone(),
            source,
        },
    }
}

/// Runs one store step under `limit`: every store call of the engine goes through here, so
/// that an outage, a lost connection or a lock held elsewhere costs a caller at most this
/// long per step, and the error says which step of which backend ran out of time.
async fn step<T>(
    store: &dyn Store,
    name: &'static str,
    limit: Duration,
    call: impl Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    match tokio::time::timeout(limit, call).await {
        Ok(res) => res,
        Err(_) => Err(StoreError::Timeout {
            backend: store.backend(),
            step: name,
            after: limit,
        }),
    }
}

/// Stores the sealed result: each attempt bounded by the step timeout, temporary failures
/// tried again with short backoff until `lease_ends` (the end of the lease as this process
/// last secured it). Past that, another caller may hold the key, and the store fences a late
/// attempt anyway; the caller then sees `Error::Store` and the record stays unfinished until
/// its lease ends. The first attempt is always made, since an extend whose answer was lost
/// may have kept the lease alive.
async fn store_result(
    store: &dyn Store,
    step_timeout: Duration,
    key: &Key,
    token: Token,
    sealed: &Bytes,
    ttl: Duration,
    lease_ends: Instant,
) -> Result<(), Error> {
    let mut attempt = 1u32;
    let mut backoff = FIRST_COMPLETE_BACKOFF;
    loop {
        let left = lease_ends.saturating_duration_since(Instant::now());
        let limit = if attempt == 1 && left.is_zero() {
            step_timeout
        } else {
            step_timeout.min(left)
        };
        let res = step(
            store,
            "complete",
            limit,
            store.complete(key, token, sealed.clone(), ttl),
        )
        .await;
        match res {
            Ok(()) => return Ok(()),
            Err(StoreError::Fenced) => {
                // Not a lost answer of an earlier attempt: a complete repeated with our
                // token is answered Ok by the store. Another claim holds the key.
                tracing::warn!(target: "idem", key = %key, token = %token,
                    "lease lost before the result was stored");
                return Err(Error::LeaseLost { key: key.clone() });
            }
            Err(e) if e.is_temporary() => {
                let left = lease_ends.saturating_duration_since(Instant::now());
                if left <= backoff {
                    // No time for another attempt within the lease. Releasing would invite
                    // a second run at once; the lease ends on its own instead.
                    tracing::warn!(target: "idem", key = %key, token = %token, attempt, error = %e,
                        "the result could not be stored within the lease; the claim ends with its lease");
                    return Err(store_error(key, e));
                }
                tracing::warn!(target: "idem", key = %key, attempt, error = %e,
                    "storing the result failed; retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_COMPLETE_BACKOFF);
                attempt += 1;
            }
            Err(source) => {
                // The body ran but its result is not stored. Releasing would invite a
                // second run at once; the lease ends on its own instead.
                return Err(store_error(key, source));
            }
        }
    }
}

fn decode<C: Codec, T: DeserializeOwned, E, P: ErrorPolicy<E>>(
    codec: &C,
    policy: &P,
    version: u64,
    key: Key,
    bytes: &[u8],
) -> Result<Result<T, E>, Error> {
    let res = envelope::open(codec, version, bytes).and_then(|(kind, payload)| match kind {
        Kind::Value => envelope::decode_payload(codec, payload).map(Ok),
        Kind::Error => policy.decode(codec, payload).map(Err),
    });
    res.map_err(|source| Error::Decode { key, source })
}

/// The `==` of a result type, when the caller knows it has one (`#[idempotent]` finds out
/// at compile time); the engine alone only sees `Serialize`.
pub(crate) type ValueEq<T> = Option<fn(&T, &T) -> bool>;

/// Whether a value and its copy decoded from the store are the same: as serde sees them
/// (their canonical encodings match), and by `==` when there is one. serde alone cannot
/// see every difference: an untagged enum serializes its variants' contents only, so
/// `Units(5)` and `Cents(5)` look alike to it. A value that is not equal to itself (one
/// holding a NaN) is judged by serde's view alone.
fn same_value<T: Serialize + ?Sized>(a: &T, b: &T, eq: Option<fn(&T, &T) -> bool>) -> bool {
    let serde_same = match (digest::canonical(a), digest::canonical(b)) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    };
    serde_same
        && match eq {
            Some(eq) => eq(a, b) || !eq(a, a),
            None => true,
        }
}

/// Whether and how errors of a body are stored.
trait ErrorPolicy<E> {
    fn cache(&self, e: &E) -> bool;
    fn seal<C: Codec>(&self, codec: &C, version: u64, e: &E) -> Result<Vec<u8>, BoxError>;
    fn decode<C: Codec>(&self, codec: &C, payload: &[u8]) -> Result<E, DecodeError>;
    /// Whether a stored error is the same value as the one the body returned.
    fn same_error(&self, a: &E, b: &E) -> bool;

    /// Whether a body's outcome and its decoded copy are the same.
    fn same<T: Serialize>(&self, a: &Result<T, E>, b: &Result<T, E>, eq: ValueEq<T>) -> bool {
        match (a, b) {
            (Ok(a), Ok(b)) => same_value(a, b, eq),
            (Err(a), Err(b)) => self.same_error(a, b),
            _ => false,
        }
    }
}

struct NoCache;

impl<E> ErrorPolicy<E> for NoCache {
    fn cache(&self, _: &E) -> bool {
        false
    }
    fn seal<C: Codec>(&self, _: &C, _: u64, _: &E) -> Result<Vec<u8>, BoxError> {
        Err("this call does not cache errors".into())
    }
    fn decode<C: Codec>(&self, _: &C, _: &[u8]) -> Result<E, DecodeError> {
        Err(DecodeError::UnexpectedError)
    }
    fn same_error(&self, _: &E, _: &E) -> bool {
        false
    }
}

struct CacheIf<P, E>(P, ValueEq<E>);

impl<E: Serialize + DeserializeOwned, P: Fn(&E) -> bool> ErrorPolicy<E> for CacheIf<P, E> {
    fn cache(&self, e: &E) -> bool {
        (self.0)(e)
    }
    fn seal<C: Codec>(&self, codec: &C, version: u64, e: &E) -> Result<Vec<u8>, BoxError> {
        envelope::seal(codec, Kind::Error, version, e)
    }
    fn decode<C: Codec>(&self, codec: &C, payload: &[u8]) -> Result<E, DecodeError> {
        envelope::decode_payload(codec, payload)
    }
    fn same_error(&self, a: &E, b: &E) -> bool {
        same_value(a, b, self.1)
    }
}

/// Releases a claim that was neither completed nor released: on an early return, a panic in
/// the body, or the caller dropping the future.
struct ReleaseGuard {
    store: Arc<dyn Store>,
    step_timeout: Duration,
    key: Key,
    token: Option<Token>,
}

impl ReleaseGuard {
    fn disarm(&mut self) {
        self.token = None;
    }

    async fn release(&mut self) {
        // The token is cleared only once the release has answered: dropped mid-way, the
        // guard still releases in the background.
        if let Some(token) = self.token {
            let store = &*self.store;
            let res = step(
                store,
                "release",
                self.step_timeout,
                store.release(&self.key, token),
            )
            .await;
            self.token = None;
            match res {
                Ok(()) => {
                    tracing::debug!(target: "idem", key = %self.key, token = %token, "released")
                }
                Err(e) => {
                    tracing::warn!(target: "idem", key = %self.key, token = %token, error = %e,
                    "could not release the claim; it ends with its lease")
                }
            }
        }
    }
}

impl Drop for ReleaseGuard {
    fn drop(&mut self) {
        let Some(token) = self.token.take() else {
            return;
        };
        let (store, key, limit) = (self.store.clone(), self.key.clone(), self.step_timeout);
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                handle.spawn(async move {
                    let store = &*store;
                    match step(store, "release", limit, store.release(&key, token)).await {
                        Ok(()) => tracing::debug!(target: "idem", key = %key, token = %token,
                            "released after the call was dropped or panicked"),
                        Err(e) => {
                            tracing::warn!(target: "idem", key = %key, token = %token, error = %e,
                            "could not release a dropped call's claim; it ends with its lease")
                        }
                    }
                });
            }
            Err(_) => tracing::warn!(target: "idem", key = %key,
                "a call was dropped outside a tokio runtime; its claim ends with its lease"),
        }
    }
}

type Extending<'s> = Pin<Box<dyn Future<Output = Result<(), StoreError>> + Send + 's>>;

/// What the heartbeat hands back with the body's output.
struct Beat<O> {
    out: O,
    /// The store fenced an extend: another caller took the key over.
    lost: bool,
    /// When the lease last secured began, at the latest: the start of the last extend that
    /// succeeded, or the claim's.
    leased_at: Instant,
}

/// Polls `body` to completion while extending the lease every third of its length. Each
/// extend is bounded by the step timeout: one that hangs is abandoned, and the next beat
/// tries again, so one stuck connection does not stop the heartbeat.
async fn with_heartbeat<O>(
    store: &dyn Store,
    step_timeout: Duration,
    key: &Key,
    token: Token,
    lease: Duration,
    leased_at: Instant,
    body: impl Future<Output = O>,
) -> Beat<O> {
    let period = (lease / 3).max(MIN_DURATION);
    let mut body = pin!(body);
    let mut ticker = tokio::time::interval_at(Instant::now() + period, period);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut extending: Option<(Instant, Extending<'_>)> = None;
    let mut lost = false;
    let mut leased_at = leased_at;
    loop {
        tokio::select! {
            biased;
            out = &mut body => return Beat { out, lost, leased_at },
            res = async { extending.as_mut().expect("guarded by is_some").1.as_mut().await }, if extending.is_some() => {
                let (sent_at, _) = extending.take().expect("guarded by is_some");
                match res {
                    Ok(()) => {
                        leased_at = sent_at;
                        tracing::trace!(target: "idem", key = %key, "lease extended");
                    }
                    Err(StoreError::Fenced) => {
                        lost = true;
                        tracing::warn!(target: "idem", key = %key, token = %token,
                            "lease lost while the body runs: another caller took the key over");
                    }
                    Err(e) => tracing::warn!(target: "idem", key = %key, error = %e,
                        "could not extend the lease; trying again at the next beat"),
                }
            }
            _ = ticker.tick(), if extending.is_none() && !lost => {
                let sent_at = Instant::now();
                extending = Some((sent_at, Box::pin(step(store, "extend", step_timeout, store.extend(key, token, lease)))));
            }
        }
    }
}
