//! [`ReleaseGuard`]: gives a claim back when its call ends without a result to store.

use std::sync::Arc;
use std::time::Duration;

use super::observe::StoreClock;
use super::store_op::store_op;
use crate::key::Key;
use crate::store::{Store, Token};

/// Releases a claim that was neither completed nor released: on an early return, a panic in
/// the body, or the caller dropping the future.
pub(super) struct ReleaseGuard {
    store: Arc<dyn Store>,
    store_timeout: Duration,
    key: Key,
    token: Option<Token>,
    /// Asked before a release on a drop or a panic: `true` keeps the claim instead.
    keep: Option<Box<dyn Fn() -> bool + Send + Sync>>,
}

impl ReleaseGuard {
    /// A guard that releases `token`'s claim of `key` unless disarmed.
    pub(super) fn new(
        store: Arc<dyn Store>,
        store_timeout: Duration,
        key: Key,
        token: Token,
    ) -> Self {
        ReleaseGuard {
            store,
            store_timeout,
            key,
            token: Some(token),
            keep: None,
        }
    }

    /// A drop or a panic keeps the claim, rather than releasing it, whenever `keep`
    /// answers true then (a step of the body acted without its record).
    pub(super) fn keep_when(&mut self, keep: impl Fn() -> bool + Send + Sync + 'static) {
        self.keep = Some(Box::new(keep));
    }

    /// From here on the claim is kept until its lease ends, whatever happens (a panic, an
    /// error, the future dropped): for a body that has run and whose result is to be kept.
    pub(super) fn disarm(&mut self) {
        self.token = None;
    }

    /// Runs `f` with the guard disarmed, and arms it again when `f` returns: a panic in
    /// `f` (user code that runs after the body, such as the predicate of the errors to
    /// keep) keeps the claim until its lease ends instead of releasing it.
    pub(super) fn held_while<R>(&mut self, f: impl FnOnce() -> R) -> R {
        let token = self.token.take();
        let out = f();
        self.token = token;
        out
    }

    pub(super) async fn release(&mut self, clock: &StoreClock) {
        // The token is cleared only once the release has answered: dropped mid-way, the
        // guard still releases in the background.
        if let Some(token) = self.token {
            let store = &*self.store;
            let res = store_op(
                store,
                clock,
                "release",
                self.store_timeout,
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
        if self.keep.as_ref().is_some_and(|keep| keep()) {
            tracing::warn!(target: "idem", key = %self.key, token = %token,
                "the call was dropped or panicked after a step that may have acted without its record; its claim ends with its lease");
            return;
        }
        let (store, key, limit) = (self.store.clone(), self.key.clone(), self.store_timeout);
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                handle.spawn(async move {
                    let store = &*store;
                    let clock = StoreClock::default();
                    match store_op(store, &clock, "release", limit, store.release(&key, token))
                        .await
                    {
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
