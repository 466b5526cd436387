//! Store operations: the time bound on every round trip the engine makes to its store, and
//! how a store failure reads to the caller.

use std::future::Future;
use std::pin::{pin, Pin};
use std::task::Poll;
use std::time::Duration;

use crate::error::{DecodeError, Error, StoreError};
use crate::key::Key;
use crate::store::{Fingerprint, Store};

use super::observe::StoreClock;
use super::{InProgress, LeaseLoss};

/// One call as its store operations see it: the store, the call's clock and store timeout, the
/// key, and the call's options with the engine's defaults filled in. Built once by
/// [`execute`](super::execute) and lent to every part (the claim, the heartbeat, the
/// complete), so that each takes the call and what it alone adds.
pub(super) struct StoreOps<'c> {
    pub(super) store: &'c dyn Store,
    pub(super) clock: &'c StoreClock,
    pub(super) store_timeout: Duration,
    pub(super) key: &'c Key,
    pub(super) fingerprint: Fingerprint,
    pub(super) ttl: Duration,
    pub(super) lease: Duration,
    pub(super) mode: InProgress,
    pub(super) wait_timeout: Duration,
    /// The retry-after hint asked for (by the call or the builder), if any.
    pub(super) retry_after: Option<Duration>,
    /// What the body does if its lease is lost.
    pub(super) lease_loss: LeaseLoss,
}

impl StoreOps<'_> {
    /// Runs one store operation of this call under the store timeout (see [`store_op`]).
    pub(super) async fn run<T>(
        &self,
        name: &'static str,
        call: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        store_op(self.store, self.clock, name, self.store_timeout, call).await
    }

    /// A store failure of this call's key, as the caller sees it.
    pub(super) fn error(&self, source: StoreError) -> Error {
        store_error(self.key, source)
    }
}

/// A store failure as the caller sees it. A value under the key that is not an idem record
/// is a decode failure of that key, not an outage.
pub(super) fn store_error(key: &Key, source: StoreError) -> Error {
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

/// Runs one store operation under `limit`: every store call of the engine goes through here,
/// so that an outage, a lost connection or a lock held elsewhere costs a caller at most this
/// long per operation, and the error says which operation of which backend ran out of time.
///
/// The operation is polled once before its timer is made: a store that answers at once (the
/// memory store, a cache) costs no timer. A store that bounds its operations itself within
/// `limit` ([`Store::step_bound`]) gets no timer from here either: one is enough. Its time
/// is added to `clock`.
pub(super) async fn store_op<T>(
    store: &dyn Store,
    clock: &StoreClock,
    name: &'static str,
    limit: Duration,
    call: impl Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    let bounded = store.step_bound().is_some_and(|bound| bound <= limit);
    timed(store, clock, name, limit, bounded, call).await
}

/// [`store_op`] for [`Store::wait`], which a store's bound does not cover (it waits as long as
/// it is told): always under the engine's timer.
pub(super) async fn wait_op(
    store: &dyn Store,
    clock: &StoreClock,
    limit: Duration,
    call: impl Future<Output = Result<(), StoreError>>,
) -> Result<(), StoreError> {
    timed(store, clock, "wait", limit, false, call).await
}

/// Runs an operation under `limit`, or, when `bounded` (the store bounds it within `limit`),
/// under the store's bound alone.
async fn timed<T>(
    store: &dyn Store,
    clock: &StoreClock,
    name: &'static str,
    limit: Duration,
    bounded: bool,
    call: impl Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    let started = clock.start();
    let res = if bounded {
        Ok(call.await)
    } else {
        let mut call = pin!(call);
        match poll_once(call.as_mut()).await {
            Poll::Ready(res) => Ok(res),
            // Boxed: the timer is large, and an operation that needs it waits on the network.
            Poll::Pending => Box::pin(tokio::time::timeout(limit, call)).await,
        }
    };
    if let Some(started) = started {
        super::observe::time_store_op(clock, store.backend(), name, started.elapsed());
    }
    match res {
        Ok(res) => res,
        Err(_) => Err(StoreError::Timeout {
            backend: store.backend(),
            step: name,
            after: limit,
        }),
    }
}

/// Polls `fut` once: its output if it is ready at once, `Pending` (with the task's waker
/// registered) if not, so that the caller decides what the wait needs (a timer, a heartbeat).
pub(super) async fn poll_once<F: Future>(fut: Pin<&mut F>) -> Poll<F::Output> {
    let mut fut = fut;
    std::future::poll_fn(|cx| Poll::Ready(fut.as_mut().poll(cx))).await
}
