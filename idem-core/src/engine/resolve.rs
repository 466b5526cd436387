//! Resolving a step whose outcome is unknown: [`Idem::resolve`], and the engine's reconcile
//! hook asked by a call that finds its key held.
//!
//! A hold sits on two records: the step's (`<scope>#step:<name>/<id>`) and the call's key.
//! A resolution replaces the step's hold by the value it ran with (or deletes it: not ran),
//! then deletes the key's hold. Each of the two is a [`Store::replace`](crate::Store::replace) that compares the
//! record with the hold it read, so a resolution never overwrites what another resolution
//! wrote, and never deletes the claim of an attempt that started since: of many resolvers
//! racing, one writes and the others find the step no longer held. In one process the hook
//! runs once per held key at a time; the other callers of that key wait for its answer.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use serde::Serialize;
use tokio::time::Instant;

use super::journal::provider_key;
use super::observe::StoreClock;
use super::resolver::{Pinned, Resolver};
use super::store_op::{store_error, store_op};
use super::Idem;
use crate::codec::Json;
use crate::envelope::{self, Kind};
use crate::error::Error;
use crate::key::Key;
use crate::store::Record;

/// How often a resolution looks again when a record changed between its look and its write.
const RESOLVE_ATTEMPTS: u32 = 5;

/// How a step whose outcome was unknown is resolved: see [`Idem::resolve`].
#[derive(Debug, Clone, PartialEq)]
pub enum Resolution {
    /// The step took effect, with this value (what the step would have returned, as JSON):
    /// later attempts get it as the step's value.
    Ran(serde_json::Value),
    /// The step did not take effect: the next attempt runs it.
    NotRan,
}

impl Resolution {
    /// [`Resolution::Ran`] with `value`, as JSON.
    pub fn ran<T: Serialize + ?Sized>(value: &T) -> Result<Resolution, serde_json::Error> {
        serde_json::to_value(value).map(Resolution::Ran)
    }
}

/// A step whose outcome is unknown, as the reconcile hook sees it
/// ([`IdemBuilder::reconcile`](crate::IdemBuilder::reconcile)).
#[derive(Debug, Clone)]
pub struct Unresolved {
    pub(super) key: Key,
    pub(super) step: String,
}

impl Unresolved {
    /// The call's key.
    pub fn key(&self) -> &Key {
        &self.key
    }

    /// The step's name.
    pub fn step(&self) -> &str {
        &self.step
    }

    /// The key the step handed on, if it used [`step_key`](crate::step_key): ask the system
    /// it called what happened under it.
    pub fn step_key(&self) -> String {
        provider_key(&self.key, &self.step).unwrap_or_default()
    }
}

/// The engine's reconcile hook, type-erased.
pub(super) type Reconciler = Arc<
    dyn Fn(Unresolved) -> Pin<Box<dyn Future<Output = Option<Resolution>> + Send>> + Send + Sync,
>;

/// The held keys whose reconcile hook runs in this process now, each with the lock its
/// other callers wait on.
#[derive(Default)]
pub(super) struct Reconciling {
    keys: Mutex<HashMap<Key, Arc<tokio::sync::Mutex<()>>>>,
}

impl Reconciling {
    fn lock_of(&self, key: &Key) -> Arc<tokio::sync::Mutex<()>> {
        let mut keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
        keys.entry(key.clone()).or_default().clone()
    }

    /// Drops the key's lock from the map once no caller holds or waits on it.
    fn done(&self, key: &Key, lock: Arc<tokio::sync::Mutex<()>>) {
        let mut keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
        // The map's reference and this one: nobody else has it, nor can get it now.
        if Arc::strong_count(&lock) == 2 {
            keys.remove(key);
        }
    }
}

/// What [`Idem::resolve`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Resolved {
    /// This resolution wrote the step's record (its value, or its deletion) and lifted the
    /// key's hold: the key's next call runs the body, which replays the steps that completed
    /// and runs the rest.
    Resolved,
    /// Another resolution had already written the step's record, which this one left as it
    /// found it; this one lifted only the key's hold that resolution had not yet lifted.
    AlreadyResolved,
    /// Neither the step nor the key was held: nothing was changed (another resolution may
    /// have finished first).
    NotHeld,
}

impl Idem {
    /// Resolves the step `step` of `key`, whose outcome was unknown: as [`Resolution::Ran`]
    /// (with the value later attempts get) or [`Resolution::NotRan`] (the next attempt runs
    /// it). The key is then no longer held, and its next call runs the body, which replays
    /// the steps that completed and runs the rest.
    ///
    /// The step's record is written first and the key's hold lifted after, each only while
    /// it is still the hold that was read ([`Store::replace`](crate::Store::replace)): a resolution cut short is
    /// repeated safely, two resolutions racing each other write once (the other answers
    /// [`Resolved::NotHeld`] or [`Resolved::AlreadyResolved`]), and a resolution never touches
    /// the claim of an attempt that started since. A value written for `Ran` lives for the
    /// engine's ttl.
    ///
    /// An error, and the key stays held, when the value cannot be stored: the store fails,
    /// or the step's record is still claimed by the attempt that found its outcome unknown
    /// (its hold of the step could not be written; resolve again once its lease has ended).
    /// A store that cannot replace records ([`Capabilities::replaces_records`](crate::Capabilities::replaces_records))
    /// is an [`Error::Config`]: resolving there could delete what another resolution wrote.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), idem::Error> {
    /// use idem::{Error, Fingerprint, Idem, Key, MemoryStore, steps::Resolution, steps::Resolved, steps::Step};
    /// let idem = Idem::new(MemoryStore::new());
    /// let key = Key::new("shop::checkout", "o-1")?;
    /// let checkout = |fail: bool| {
    ///     idem.call(key.clone(), Fingerprint::NONE).run_fallible(move || async move {
    ///         Step::new("charge")
    ///             .unknown_if(|e: &Error| matches!(e, Error::WaitTimeout { .. }))
    ///             .run(|| async move {
    ///                 if fail {
    ///                     return Err(Error::WaitTimeout { key: Key::new("gateway", "x")?, waited: Default::default() });
    ///                 }
    ///                 Ok("ch_new".to_string())
    ///             })
    ///             .await
    ///     })
    /// };
    /// assert!(checkout(true).await.is_err());
    /// assert!(matches!(checkout(false).await, Err(Error::OutcomeUnknown { .. })), "held");
    /// let ran = Resolution::ran("ch_1").unwrap();
    /// assert_eq!(idem.resolve(&key, "charge", ran.clone()).await?, Resolved::Resolved);
    /// assert_eq!(idem.resolve(&key, "charge", ran).await?, Resolved::NotHeld, "once");
    /// assert_eq!(checkout(false).await?, "ch_1", "the resolved value, not a second charge");
    /// # Ok(()) }
    /// ```
    pub async fn resolve(
        &self,
        key: &Key,
        step: &str,
        resolution: Resolution,
    ) -> Result<Resolved, Error> {
        self.resolve_hold(key, step, None, resolution).await
    }

    /// [`resolve`](Idem::resolve), of the key's hold `asked` when given (the one a reconcile
    /// hook was asked about): a newer hold of the key is not resolved by an answer about an
    /// older one, and answers [`Resolved::NotHeld`].
    async fn resolve_hold(
        &self,
        key: &Key,
        step: &str,
        asked: Option<&[u8]>,
        resolution: Resolution,
    ) -> Result<Resolved, Error> {
        let record_key = key.step(step)?;
        let inner = &*self.inner;
        let store = &*inner.store;
        if !store.capabilities().replaces_records {
            return Err(Error::Config {
                message: format!(
                    "the {} store cannot replace a record only while it is the one read (`Capabilities::replaces_records`), so it cannot resolve the held key `{key}` without risking what another resolution wrote",
                    store.backend()
                ),
                source: None,
            });
        }
        let value = match &resolution {
            Resolution::Ran(value) => Some(Bytes::from(
                envelope::seal(&Json, Kind::Value, 0, value).map_err(|source| Error::Encode {
                    key: record_key.clone(),
                    source,
                })?,
            )),
            Resolution::NotRan => None,
        };
        let resolver = Resolver {
            store,
            clock: StoreClock::default(),
            limit: inner.store_timeout,
            lease: inner.lease,
            ttl: inner.ttl,
        };
        // The holds this resolution is about: the first ones it reads (or the one a hook was
        // asked about). A record that changed between a read and a write is read again, and
        // a newer hold found then is another attempt's, not this resolution's.
        let mut pinned = Pinned {
            key: asked.map(Bytes::copy_from_slice),
            step: None,
            read: asked.is_some(),
        };
        for _ in 0..RESOLVE_ATTEMPTS {
            let attempt = resolver.attempt(key, &record_key, step, &mut pinned, &value);
            let Some(done) = attempt.await? else {
                continue;
            };
            if done != Resolved::NotHeld {
                if let Some(cache) = &inner.cache {
                    cache.remove(key);
                }
            }
            if done == Resolved::Resolved {
                tracing::info!(target: "idem", key = %key, step, ran = value.is_some(),
                    "the step's unknown outcome is resolved");
            }
            return Ok(done);
        }
        Err(Error::Step {
            key: Some(key.clone()),
            step: step.to_owned(),
            reason: format!(
                "its records changed {RESOLVE_ATTEMPTS} times between reading and resolving them; the key stays held"
            ),
        })
    }

    /// Asks the engine's reconcile hook about the step holding `key`, and resolves it when
    /// the hook knows: `true` if the key is no longer held. In this process the hook runs
    /// once per key at a time; a caller that waited for another's answer looks again
    /// instead of asking the hook a second time.
    /// `hold` is the key's hold as the caller read it: the hook's answer resolves that hold
    /// only. A caller in `Reject` mode does not wait for another's hook (`None` for
    /// `wait`); one in `Wait` mode waits at most `wait`.
    pub(super) async fn reconcile(
        &self,
        key: &Key,
        step: &str,
        hold: &[u8],
        wait: Option<Duration>,
    ) -> Result<bool, Error> {
        let Some(hook) = &self.inner.reconciler else {
            return Ok(false);
        };
        let reconciling = &self.inner.reconciling;
        let lock = reconciling.lock_of(key);
        let out = async {
            let guard = match lock.try_lock() {
                Ok(guard) => guard,
                Err(_) => {
                    // Another caller of this process asks the hook: its answer is what
                    // this one gets, read from the store, if it comes in time.
                    let Some(wait) = wait else { return Ok(false) };
                    let Ok(_guard) = tokio::time::timeout(wait, lock.lock()).await else {
                        return Ok(false);
                    };
                    return self.held_by(key, step).await.map(|held| !held);
                }
            };
            let unresolved = Unresolved {
                key: key.clone(),
                step: step.to_owned(),
            };
            let started = Instant::now();
            let Some(resolution) = hook(unresolved).await else {
                tracing::debug!(target: "idem", key = %key, step, "the reconcile hook does not know the step's outcome");
                return Ok(false);
            };
            tracing::debug!(target: "idem", key = %key, step, took = ?started.elapsed(), "reconciled");
            let resolved = self.resolve_hold(key, step, Some(hold), resolution).await;
            drop(guard);
            match resolved {
                Ok(_) => Ok(true),
                Err(e) => {
                    tracing::warn!(target: "idem", key = %key, step, error = %e,
                        "the reconcile hook's answer could not be stored; the key stays held");
                    Ok(false)
                }
            }
        }
        .await;
        reconciling.done(key, lock);
        out
    }

    /// Whether `key` is still held by `step`.
    async fn held_by(&self, key: &Key, step: &str) -> Result<bool, Error> {
        let store = &*self.inner.store;
        let clock = StoreClock::default();
        let get = store.get(key);
        let record = store_op(store, &clock, "get", self.inner.store_timeout, get)
            .await
            .map_err(|source| store_error(key, source))?;
        Ok(matches!(record, Some(Record::Completed { payload, .. })
            if envelope::held_step(&payload).as_deref() == Some(step)))
    }
}
