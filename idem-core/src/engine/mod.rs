//! The `Idem` engine: claim, run once, store, replay.
//!
//! Each file holds one part:
//!
//! - [`builder`]: the engine's defaults and their checks.
//! - [`call`]: one call's options, and those options resolved against the defaults.
//! - [`run`]: the ways to run a body (`run`, `run_fallible`, ...).
//! - [`execute`]: the state machine every run goes through: key, options, local cache,
//!   claim, replay or first run.
//! - [`first_run`]: a run under the claim it took: the body, then the claim given back,
//!   the key held, or the outcome stored.
//! - [`claim`]: the claim, and the wait for a concurrent holder.
//! - [`context`]: what a running body can ask of its call (its fence).
//! - [`complete`]: how an outcome is checked and stored.
//! - [`release`]: the guard that gives a claim back.
//! - [`heartbeat`]: the lease extension while the body runs.
//! - [`store_op`](mod@store_op): a store operation: the time bound on every round trip to the store,
//!   and how a store failure reads to the caller.
//! - [`journal`]: what the user's steps inside one attempt share and leave, and the marks
//!   of at-most-once calls.
//! - [`step`](mod@step): the step API a body calls ([`step()`], [`Step`], [`step_key`],
//!   [`step_record`]).
//! - [`step_run`]: what running one step does against the store.
//! - [`resolve`]: how a step whose outcome is unknown is resolved, by a person or the
//!   reconcile hook; [`resolver`] the compare-and-set writes of one resolution.
//! - [`observe`]: the span's outcome and the metrics.
//! - [`outcome`]: the replay signal ([`Outcome`], [`Origin`]).

use std::sync::Arc;
use std::time::Duration;

use crate::cache::LocalCache;
use crate::codec::BuiltinCodec;
use crate::error::Error;
use crate::key::Key;
use crate::store::{Fingerprint, Record, Store};

mod builder;
mod call;
mod claim;
mod complete;
mod context;
mod execute;
mod first_run;
mod heartbeat;
mod journal;
mod observe;
mod outcome;
mod release;
mod resolve;
mod resolver;
pub(crate) mod run;
mod step;
mod step_run;
mod store_op;

pub use builder::IdemBuilder;
pub use call::{
    Answer, Answers, Bare, Call, CallWithOutcome, InProgress, LeaseLoss, MissingKey, RequestPrint,
    WithOutcome,
};
pub use complete::{Share, ValueEq, ValueOps};
pub use context::fence;
pub use outcome::{Origin, Outcome};
pub use resolve::{Resolution, Resolved, Unresolved};
pub use step::{step, step_key, step_record, Ambiguous, NeverUnknown, Step, StepRecord};

use store_op::store_op;

/// The default time a stored result lives: 24 hours.
pub const DEFAULT_TTL: Duration = Duration::from_secs(24 * 60 * 60);
/// The default lease of a claim: 30 seconds, extended in the background while the body runs.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);
/// The default longest wait for a concurrent duplicate in `InProgress::Wait` mode.
pub const DEFAULT_WAIT_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest retry-after hint an [`Error::InProgress`] gives by default: 1 second, or a
/// tenth of the call's lease when that is shorter (see [`IdemBuilder::retry_after`]).
pub const DEFAULT_RETRY_AFTER: Duration = Duration::from_secs(1);
/// The default longest wait for one store operation (claim, complete, extend, release, get,
/// delete), the store's wait for a free connection included.
pub const DEFAULT_STORE_TIMEOUT: Duration = Duration::from_secs(5);

/// The shortest ttl or lease accepted: stores keep time in milliseconds.
const MIN_DURATION: Duration = Duration::from_millis(1);
/// The longest ttl, lease or wait accepted: 100 years. Longer ones would overflow clocks
/// (`Instant + Duration`, Redis `PX`); no idempotency record needs to outlive that.
pub const MAX_DURATION: Duration = Duration::from_secs(100 * 365 * 24 * 60 * 60);

/// The retry-after hint of an [`Error::InProgress`] whose holder's lease still runs for
/// `remaining`: the hint asked for (`asked`, by the call or the builder), else the smaller
/// of [`DEFAULT_RETRY_AFTER`] and a tenth of `lease`; never beyond `remaining` (later, the
/// key is free or taken over anyway), and never under 1 ms.
///
/// The store answers the remaining lease, but a holder usually finishes long before its
/// lease ends (the lease is what a crashed holder costs, not how long a body runs): a
/// consumer that requeued a message for the whole remaining lease would stall it for most
/// of a lease each time.
pub(crate) fn retry_hint(
    asked: Option<Duration>,
    lease: Duration,
    remaining: Duration,
) -> Duration {
    asked
        .unwrap_or_else(|| DEFAULT_RETRY_AFTER.min(lease / 10))
        .min(remaining)
        .max(MIN_DURATION)
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
    store_timeout: Duration,
    /// The retry-after hint asked for, if any; else [`retry_hint`]'s default.
    retry_after: Option<Duration>,
    lease_loss: LeaseLoss,
    /// The hook that reconciles steps whose outcome is unknown, if any.
    reconciler: Option<resolve::Reconciler>,
    /// The held keys whose hook runs now.
    reconciling: resolve::Reconciling,
    /// How long a hold lives unresolved.
    hold_ttl: Duration,
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
            .field("store_timeout", &self.inner.store_timeout)
            .field("retry_after", &self.inner.retry_after)
            .field("lease_loss", &self.inner.lease_loss)
            .field("local_cache", &self.inner.cache.is_some())
            .field("reconcile", &self.inner.reconciler.is_some())
            .finish()
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

    /// The longest wait for one store operation.
    pub fn store_timeout(&self) -> Duration {
        self.inner.store_timeout
    }

    /// Starts a call under `key` whose payload is `fingerprint`; its other options can
    /// then be set one by one, and one of its run methods runs it.
    ///
    /// The fingerprint is what makes the same key with another payload an
    /// [`Error::KeyReuse`] rather than the first payload's result: pass
    /// `Fingerprint::of(&request)` (what `#[idempotent]` does with the arguments), or
    /// [`Fingerprint::NONE`] to turn that check off knowingly.
    ///
    /// ```
    /// # use idem::{Fingerprint, Idem, Key, MemoryStore};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), idem::Error> {
    /// # let idem = Idem::new(MemoryStore::new());
    /// # #[derive(serde::Serialize)] struct Charge { order_id: String, cents: u64 }
    /// let req = Charge { order_id: "o-1".into(), cents: 1250 };
    /// let key = Key::new("billing::charge", &req.order_id)?;
    /// let receipt: String = idem
    ///     .call(key, Fingerprint::of(&req))
    ///     .run(|| async { format!("charged {}", req.cents) })
    ///     .await?;
    /// # assert_eq!(receipt, "charged 1250");
    /// # Ok(()) }
    /// ```
    pub fn call(&self, key: Key, fingerprint: Fingerprint) -> Call<'_, BuiltinCodec> {
        self.call_print(Ok(key), RequestPrint::Fingerprint(fingerprint))
    }

    /// A call whose key may have failed to build (the error is returned when the call
    /// runs, before any store access), with the payload as `#[idempotent]` holds it.
    pub(crate) fn call_print(
        &self,
        key: Result<Key, Error>,
        print: RequestPrint,
    ) -> Call<'_, BuiltinCodec> {
        Call {
            idem: self,
            key,
            print,
            options: call::Options::default(),
            version: 0,
            missing_key: MissingKey::Error,
            codec: self.inner.codec,
            answer: std::marker::PhantomData,
        }
    }

    /// Whether this engine has a local cache.
    pub(crate) fn has_local_cache(&self) -> bool {
        self.inner.cache.is_some()
    }

    /// Deletes the stored result under `key` from the store and from the local cache, so
    /// that the next call runs the body again; `true` if there was one. A key held by a
    /// step whose outcome is unknown loses its hold and that step's record with it (the
    /// next call runs the step). A live claim is refused ([`Error::InProgress`]): its body
    /// may be running, and deleting its claim would let a second run start beside it; use
    /// [`forget_forced`](Idem::forget_forced) to delete it anyway. Records of steps that
    /// completed in an attempt whose result was never stored are deleted by
    /// [`forget_steps`](Idem::forget_steps).
    pub async fn forget(&self, key: &Key) -> Result<bool, Error> {
        self.forget_record(key, false).await
    }

    /// [`forget`](Idem::forget), a live claim included. Only for a holder known to be dead
    /// or stuck: a body still running goes on, its extend and complete are refused
    /// ([`Error::LeaseLost`]), but a step it starts within its first lease is not checked
    /// against the call's record and may run beside the next caller's.
    pub async fn forget_forced(&self, key: &Key) -> Result<bool, Error> {
        self.forget_record(key, true).await
    }

    /// Deletes the records of the steps named `steps` of the call keyed `key` (the names
    /// its body gives them; `idem steps` shows them), so that its next attempt runs them
    /// again; how many there were. A step record still claimed (the step runs now) is
    /// refused ([`Error::InProgress`], nothing deleted after it); a completed one is deleted
    /// only as it was read, not a value written since.
    pub async fn forget_steps(&self, key: &Key, steps: &[&str]) -> Result<usize, Error> {
        let mut deleted = 0;
        for step in steps {
            let record = key.step(step)?;
            if self.forget_step_record(key, &record, false).await? {
                deleted += 1;
            }
        }
        Ok(deleted)
    }

    /// Deletes the step record `record` of `key`: refused while claimed, a completed one
    /// by compare-and-set, an ended one outright. With `holds_only`, only a hold is
    /// deleted, and anything else (a value a resolution stored, a step running) is left.
    async fn forget_step_record(
        &self,
        key: &Key,
        record: &Key,
        holds_only: bool,
    ) -> Result<bool, Error> {
        let (store, clock) = (&*self.inner.store, observe::StoreClock::default());
        let limit = self.inner.store_timeout;
        let on = |source| store_op::store_error(record, source);
        match store_op(store, &clock, "get", limit, store.get(record))
            .await
            .map_err(on)?
        {
            Some(Record::InProgress { .. }) | None if holds_only => Ok(false),
            Some(Record::InProgress {
                lease_remaining, ..
            }) => Err(Error::InProgress {
                key: key.clone(),
                retry_after: lease_remaining,
            }),
            Some(Record::Completed { payload, .. }) => {
                if holds_only && crate::envelope::held_step(&payload).is_none() {
                    return Ok(false);
                }
                if !store.capabilities().replaces_records {
                    let delete = store.delete(record);
                    return store_op(store, &clock, "delete", limit, delete)
                        .await
                        .map_err(on);
                }
                let replace = store.replace(record, &payload, None);
                store_op(store, &clock, "replace", limit, replace)
                    .await
                    .map_err(on)
            }
            None => store_op(store, &clock, "delete", limit, store.delete(record))
                .await
                .map_err(on)
                .map(|_| false),
        }
    }

    async fn forget_record(&self, key: &Key, force: bool) -> Result<bool, Error> {
        if let Some(cache) = &self.inner.cache {
            cache.remove(key);
        }
        let store = &*self.inner.store;
        let (clock, limit) = (observe::StoreClock::default(), self.inner.store_timeout);
        let on = |source| store_op::store_error(key, source);
        let record = store_op(store, &clock, "get", limit, store.get(key))
            .await
            .map_err(on)?;
        let held = match &record {
            Some(Record::InProgress {
                lease_remaining, ..
            }) if !force => {
                return Err(Error::InProgress {
                    key: key.clone(),
                    retry_after: *lease_remaining,
                })
            }
            Some(Record::Completed { payload, .. }) => crate::envelope::held_step(payload),
            _ => None,
        };
        let deleted = match record {
            // Only the result that was read: a claim taken since is not deleted with it.
            Some(Record::Completed { payload, .. }) if store.capabilities().replaces_records => {
                let replace = store.replace(key, &payload, None);
                store_op(store, &clock, "replace", limit, replace)
                    .await
                    .map_err(on)?
            }
            _ => store_op(store, &clock, "delete", limit, store.delete(key))
                .await
                .map_err(on)?,
        };
        // The held step's record goes too, but only while it is a hold: a resolution may have
        // stored its value since.
        if let Some(step) = held {
            self.forget_step_record(key, &key.step(&step)?, true)
                .await?;
        }
        Ok(deleted)
    }
}
