//! [`IdemBuilder`]: the store and the defaults of an engine, checked once when it is built.

use std::sync::Arc;
use std::time::Duration;

use super::{
    Idem, InProgress, Inner, LeaseLoss, DEFAULT_LEASE, DEFAULT_STORE_TIMEOUT, DEFAULT_TTL,
    DEFAULT_WAIT_TIMEOUT, MAX_DURATION, MIN_DURATION,
};
use crate::cache::LocalCache;
use crate::codec::BuiltinCodec;
use crate::error::Error;
use crate::store::Store;

use super::resolve::{Reconciler, Resolution, Unresolved};

/// Builds an [`Idem`]: `Idem::builder().store(s).ttl(...).build()`.
///
/// Every duration (`ttl`, `lease`, `wait_timeout`, `store_timeout`, `retry_after`) must lie
/// between 1 ms and 100 years; `build` refuses one that does not.
#[derive(Debug, Default)]
#[must_use]
pub struct IdemBuilder {
    store: Option<Arc<dyn Store>>,
    codec: BuiltinCodec,
    ttl: Option<Duration>,
    lease: Option<Duration>,
    in_progress: InProgress,
    wait_timeout: Option<Duration>,
    store_timeout: Option<Duration>,
    retry_after: Option<Duration>,
    lease_loss: LeaseLoss,
    local_cache: Option<(usize, Duration)>,
    reconciler: Option<Hook>,
    hold_ttl: Option<Duration>,
}

/// The reconcile hook, as the builder keeps it (its `Debug` does not show the closure).
#[derive(Clone)]
struct Hook(Reconciler);

impl std::fmt::Debug for Hook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<reconcile hook>")
    }
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

    /// What a running body does when its lease is lost (default [`LeaseLoss::Cancel`]: it
    /// is dropped at its next `.await`, and the call answers
    /// [`Error::LeaseLost`]). See [`LeaseLoss`] for what cancelling can and cannot stop.
    pub fn lease_loss(mut self, mode: LeaseLoss) -> Self {
        self.lease_loss = mode;
        self
    }

    /// How long a duplicate waits in [`InProgress::Wait`] mode (default 10 seconds).
    pub fn wait_timeout(mut self, timeout: Duration) -> Self {
        self.wait_timeout = Some(timeout);
        self
    }

    /// The retry-after hint of [`Error::InProgress`], the answer to a duplicate that
    /// arrives while the first call still runs (in [`InProgress::Reject`] mode): how long
    /// the duplicate should wait before it tries again (a consumer requeueing the message,
    /// an HTTP `Retry-After`). By default the smaller of [`DEFAULT_RETRY_AFTER`](crate::DEFAULT_RETRY_AFTER) (1
    /// second) and a tenth of the call's lease. The hint is never longer than what remains
    /// of the holder's lease (by then the key is free, or taken over), and never under
    /// 1 ms. A call can ask for its own with [`Call::retry_after`](crate::Call::retry_after).
    ///
    /// It is a hint, not a promise that the first call is done by then: a retry may get
    /// `InProgress` again. [`InProgress::Wait`] mode does not use it; a waiting duplicate
    /// watches the record instead.
    pub fn retry_after(mut self, hint: Duration) -> Self {
        self.retry_after = Some(hint);
        self
    }

    /// The longest wait for one store operation (default 5 seconds): a claim, a complete, an
    /// extend, a release (also the background release of a dropped call), and the delete of
    /// [`Idem::forget`]; a waiting duplicate's [`Store::wait`] gets its pause plus this. An operation that runs
    /// out of time is abandoned and answers
    /// [`StoreError::Timeout`](crate::StoreError::Timeout) naming the operation and the backend, a temporary failure. The
    /// heartbeat tries again at its next beat; a complete is tried again while the lease
    /// runs. Keep the store's own timeouts (pool acquire, connect, command) at or below it:
    /// a store that bounds each operation itself within it ([`Store::step_bound`], the
    /// Redis store by its command timeout) then runs each one under that bound alone, without a
    /// second timer.
    pub fn store_timeout(mut self, timeout: Duration) -> Self {
        self.store_timeout = Some(timeout);
        self
    }

    /// Keeps up to `capacity` completed results in process memory for at most `max_age`,
    /// so that replays of hot keys skip the store. A record deleted from the store through
    /// another process, or expired there, may still be replayed from here until `max_age`
    /// passes: keep `max_age` short next to the ttl.
    ///
    /// A hit still checks the payload and the record's version and codec. Under
    /// `#[idempotent]` with its default fingerprint, the payload check compares the
    /// arguments' encoding with the one that filled the entry (up to 1 KiB; hashing it only
    /// when they differ); elsewhere it compares fingerprints. A hit decodes the cached
    /// record, or with `#[idempotent(clone_cached)]` clones the value it keeps decoded.
    pub fn local_cache(mut self, capacity: usize, max_age: Duration) -> Self {
        self.local_cache = Some((capacity, max_age));
        self
    }

    /// How long a hold lives unresolved: the records that hold a key whose step's outcome
    /// is unknown ([`Step::unknown_if`](crate::Step::unknown_if)). By default a hold lives
    /// until it is resolved (100 years, the longest duration), since a hold that expired
    /// would let the next call run the ambiguous step again: a person or the reconcile hook
    /// decides, never the clock. Set one only where a step run twice is acceptable after
    /// that long.
    pub fn hold_ttl(mut self, ttl: Duration) -> Self {
        self.hold_ttl = Some(ttl);
        self
    }

    /// The reconcile hook: user code that finds out what happened to a step whose outcome
    /// was unknown ([`Step::unknown_if`](crate::Step::unknown_if)), usually by asking the
    /// system the step called under its [`step_key`](crate::step_key). A call that finds
    /// its key held asks the hook first: `Some` resolution resolves the step (as
    /// [`Idem::resolve`] does) and the call goes on, running the body, which replays the
    /// steps that completed and runs the rest; `None` (the hook does not know yet) answers
    /// [`Error::OutcomeUnknown`] as without a hook.
    ///
    /// In one process the hook runs once per held key at a time: the key's other callers
    /// meanwhile wait for its answer (and claim again if it resolved the key). Across
    /// processes each may ask its own hook; one resolution is stored, and the others find
    /// the step resolved ([`Idem::resolve`]).
    ///
    /// ```
    /// use idem::{Idem, MemoryStore, steps::Resolution};
    /// let idem = Idem::builder()
    ///     .store(MemoryStore::new())
    ///     .reconcile(|unresolved| async move {
    ///         match unresolved.step() {
    ///             // Ask the provider under the key the step handed on.
    ///             "charge" => Resolution::ran(&format!("found {}", unresolved.step_key())).ok(),
    ///             _ => None,
    ///         }
    ///     })
    ///     .build()?;
    /// # Ok::<(), idem::Error>(())
    /// ```
    pub fn reconcile<F, Fut>(mut self, hook: F) -> Self
    where
        F: Fn(Unresolved) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = Option<Resolution>> + Send + 'static,
    {
        self.reconciler = Some(Hook(Arc::new(move |u| Box::pin(hook(u)))));
        self
    }

    /// Builds the engine. Fails with [`Error::Config`] when no store was given or a
    /// duration is under 1 ms or over 100 years.
    pub fn build(self) -> Result<Idem, Error> {
        let store = self.store.ok_or_else(|| Error::Config {
            message: "Idem::builder() needs a store: call .store(...) before .build()".into(),
            source: None,
        })?;
        let ttl = self.ttl.unwrap_or(DEFAULT_TTL);
        let lease = self.lease.unwrap_or(DEFAULT_LEASE);
        let wait_timeout = self.wait_timeout.unwrap_or(DEFAULT_WAIT_TIMEOUT);
        let store_timeout = self.store_timeout.unwrap_or(DEFAULT_STORE_TIMEOUT);
        let hold_ttl = self.hold_ttl.unwrap_or(MAX_DURATION);
        let retry_after = self.retry_after.map(|d| ("retry_after", d));
        for (name, d) in [
            ("ttl", ttl),
            ("lease", lease),
            ("wait_timeout", wait_timeout),
            ("store_timeout", store_timeout),
            ("hold_ttl", hold_ttl),
        ]
        .into_iter()
        .chain(retry_after)
        {
            if let Err(reason) = check_duration(d) {
                return Err(Error::Config {
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
                store_timeout,
                retry_after: self.retry_after,
                lease_loss: self.lease_loss,
                reconciler: self.reconciler.map(|hook| hook.0),
                reconciling: Default::default(),
                hold_ttl,
                cache: self
                    .local_cache
                    .filter(|(capacity, _)| *capacity > 0)
                    .map(|(capacity, max_age)| LocalCache::new(capacity, max_age)),
            }),
        })
    }
}

/// Whether a ttl, lease or timeout is within what stores and clocks can keep.
pub(super) fn check_duration(d: Duration) -> Result<(), &'static str> {
    if d < MIN_DURATION {
        Err("it must be at least 1ms")
    } else if d > MAX_DURATION {
        Err("it must be at most 100 years")
    } else {
        Ok(())
    }
}
