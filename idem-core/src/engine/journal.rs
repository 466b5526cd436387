//! Steps inside one call: the journal of a body's side effects, so that a later attempt of
//! the same key (after an `Err`, a panic, or a crash and a takeover) runs only the steps
//! that did not complete, and a step whose outcome nobody knows holds the key until it is
//! resolved.
//!
//! A step's record is an ordinary record under a key of its own, derived from the call's:
//! the scope `<scope>#step:<name>` and the call's id (`billing::checkout#step:charge/o-1`).
//! A step claims that key, runs, and completes it with its value (the JSON codec, result
//! version 0), so every store keeps step records as it keeps results, and two attempts that
//! overlap (a holder whose lease was taken over and its successor) never run one step at
//! once: the second waits for the first's record. Step records live as long as results
//! (the call's `ttl`); once the call's result is stored they are deleted.
//!
//! A step that fails in a way that leaves its outcome unknown ([`Step::unknown_if`](super::Step::unknown_if)) is
//! completed with a hold instead of a value, and so is the call's own key: every later
//! call of the key answers [`Error::OutcomeUnknown`] without running the body, until the
//! step is resolved ([`Idem::resolve`](super::Idem::resolve), the engine's reconcile hook, or `idem resolve`).
//!
//! This file holds the journal itself (what one attempt's steps share and leave, and the
//! marks of at-most-once calls); [`step`](mod@super::step) holds the API a body calls, and
//! [`step_run`](super::step_run) what running one step does against the store.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;

use super::claim::{claim_or_wait, Claimed};
use super::complete::store_result;
use super::heartbeat::LeaseMark;
use super::observe::StoreClock;
use super::store_op::{store_error, store_op, StoreOps};
use super::{InProgress, LeaseLoss};
use crate::envelope;
use crate::error::Error;
use crate::key::construct::step_record_key;
use crate::key::Key;
use crate::store::{Fingerprint, Record, Store, Token};

/// The step whose record says that the body of an [at-most-once](super::Call::at_most_once)
/// call started.
pub(super) const CALL_STEP: &str = "call";

/// What an at-most-once call found when it marked its body as started.
pub(super) enum Started {
    /// The mark is written: the body may run.
    Marked,
    /// An earlier attempt's body started and left no result: the key is to be held.
    Held,
    /// That earlier body was resolved as ran: its result, as the step's JSON envelope.
    Resolved(Bytes),
}

tokio::task_local! {
    /// The journal of the call whose body this task is running; `None` in a body run
    /// without a key (`missing_key = "run"`), whose steps simply run.
    static JOURNAL: Option<Arc<Journal>>;
}

/// What the steps of one attempt share: the call's store and key, its lease and ttl, and
/// what the attempt's steps did.
pub(super) struct Journal {
    pub(super) store: Arc<dyn Store>,
    pub(super) key: Key,
    /// The call's fingerprint: each step's record carries it, so that an attempt with
    /// another payload is refused at its first step instead of replaying another's.
    pub(super) fingerprint: Fingerprint,
    /// The call's clock: its steps' store time counts in the call's span.
    pub(super) clock: Arc<StoreClock>,
    /// The call's claim: its token, and when it was sent (its lease ends no sooner than a
    /// lease after that).
    pub(super) token: Token,
    pub(super) claimed_at: Instant,
    /// When the call's lease last secured began, by this process's clock: the claim, then
    /// each extend the store confirmed.
    pub(super) call_lease: LeaseMark,
    pub(super) ttl: Duration,
    /// How long a hold lives, unresolved.
    pub(super) hold_ttl: Duration,
    pub(super) lease: Duration,
    pub(super) store_timeout: Duration,
    pub(super) lease_loss: LeaseLoss,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// The names of the steps this attempt reached, in order.
    names: Vec<String>,
    /// The step whose outcome is unknown, once one is.
    held: Option<String>,
    /// A step may have taken effect without its record being stored: the call's claim must
    /// not be given back (a retry at once would run the step again), only end with its lease.
    unrecorded: bool,
    /// A step's record belongs to another payload: the call is [`Error::KeyReuse`].
    reused: bool,
    /// An at-most-once step's body is running: its record says it started.
    started: bool,
    /// The held step's own record could not be given its hold.
    hold_not_on_step: bool,
}

/// How a body's attempt ended, as its steps left it.
pub(super) enum Ending {
    /// No step is in doubt.
    Clean,
    /// The outcome of this step is unknown: the key is to be held (the flag: whether the
    /// step's own record holds too).
    Held(String, bool),
    /// A step's record belongs to another payload of the key.
    Reused {
        /// A step of this attempt may also have taken effect without its record.
        unrecorded: bool,
    },
    /// A step may have taken effect without its record: keep the claim until its lease ends.
    Unrecorded,
}

impl Journal {
    pub(super) fn new(
        call: &StoreOps<'_>,
        store: Arc<dyn Store>,
        clock: Arc<StoreClock>,
        (token, claimed_at): (Token, Instant),
        hold_ttl: Duration,
    ) -> Arc<Journal> {
        Arc::new(Journal {
            store,
            key: call.key.clone(),
            fingerprint: call.fingerprint,
            clock,
            token,
            claimed_at,
            call_lease: LeaseMark::new(claimed_at),
            ttl: call.ttl,
            hold_ttl,
            lease: call.lease,
            store_timeout: call.store_timeout,
            lease_loss: call.lease_loss,
            state: Mutex::new(State::default()),
        })
    }

    /// Runs `body` with this journal as what its steps see.
    pub(super) fn scope<F: Future>(self: &Arc<Self>, body: F) -> impl Future<Output = F::Output> {
        JOURNAL.scope(Some(self.clone()), body)
    }

    /// The id of the holds this attempt writes: its claim's token.
    pub(super) fn hold_id(&self) -> u64 {
        self.token.0
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // A step's bookkeeping never panics while it holds the lock.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// What the attempt's steps left.
    pub(super) fn ending(&self) -> Ending {
        let state = self.state();
        match (&state.held, state.reused, state.unrecorded) {
            (Some(step), _, _) => Ending::Held(step.clone(), !state.hold_not_on_step),
            (None, true, unrecorded) => Ending::Reused { unrecorded },
            (None, false, true) => Ending::Unrecorded,
            (None, false, false) => Ending::Clean,
        }
    }

    /// Whether a step of this attempt may have acted without its record, or left its
    /// outcome unknown: then the call's claim is never given back, not even by a panic or
    /// a drop, only left to end with its lease.
    pub(super) fn in_doubt(&self) -> bool {
        let state = self.state();
        state.held.is_some() || state.unrecorded || state.started
    }

    /// Marks the body of an at-most-once call as started: the record of the step
    /// [`CALL_STEP`] claimed and completed with a hold, unless an earlier attempt's is there.
    pub(super) async fn mark_started(&self) -> Result<Started, Error> {
        let key = self.key.step(CALL_STEP)?;
        self.enter(CALL_STEP)?;
        let call = self.store_ops(&key);
        let (token, leased_at) = match claim_or_wait(&call).await {
            Ok(Claimed::Completed { payload, .. }) => {
                if envelope::held_step(&payload).is_some() {
                    self.hold(CALL_STEP);
                    return Ok(Started::Held);
                }
                return Ok(Started::Resolved(payload));
            }
            Ok(Claimed::Ours {
                token, leased_at, ..
            }) => (token, leased_at),
            Err(Error::KeyReuse { .. }) => {
                return Err(Error::KeyReuse {
                    key: self.key.clone(),
                })
            }
            Err(e) => return Err(e),
        };
        let hold = Bytes::from(envelope::seal_held(CALL_STEP, self.token.0, true));
        let held = StoreOps {
            ttl: self.hold_ttl,
            ..self.store_ops(&key)
        };
        store_result(&held, token, &hold, leased_at + held.lease).await?;
        self.started(true);
        Ok(Started::Marked)
    }

    /// Turns the `call` record's undecodable resolved value `payload` back into a hold, so
    /// that the body's result can be resolved again.
    pub(super) async fn rehold_started(&self, payload: &[u8]) {
        let Ok(key) = self.key.step(CALL_STEP) else {
            return;
        };
        let hold = Bytes::from(envelope::seal_held(CALL_STEP, self.token.0, true));
        let store = &*self.store;
        let replace = store.replace(&key, payload, Some((hold, self.hold_ttl)));
        if let Err(e) = store_op(store, &self.clock, "replace", self.store_timeout, replace).await {
            tracing::warn!(target: "idem", key = %self.key, error = %e,
                "could not hold the body's record again over its undecodable value");
        }
    }

    /// Clears the mark of an at-most-once call whose body ended with nothing to keep, so
    /// that the next attempt runs it: only while it is still this attempt's mark.
    pub(super) async fn clear_started(&self) {
        self.started(false);
        let Ok(key) = self.key.step(CALL_STEP) else {
            return;
        };
        let hold = envelope::seal_held(CALL_STEP, self.token.0, true);
        let store = &*self.store;
        let replace = store.replace(&key, &hold, None);
        let cleared = store_op(store, &self.clock, "replace", self.store_timeout, replace).await;
        if !matches!(cleared, Ok(true)) {
            tracing::warn!(target: "idem", key = %self.key,
                "could not clear the mark of a body that ended with nothing to keep; the next attempt finds the key held");
        }
    }

    /// The call's lease, as its heartbeat secures it.
    pub(super) fn call_lease(&self) -> &LeaseMark {
        &self.call_lease
    }

    /// Deletes the step records of this attempt, now that the call's result is stored: in
    /// the background, each bounded by the store timeout. One left behind (the store failed)
    /// expires with its ttl, and no call reads it while the result lives.
    pub(super) fn forget_steps(&self) {
        let names = std::mem::take(&mut self.state().names);
        if names.is_empty() {
            return;
        }
        let keys: Vec<Key> = names
            .iter()
            .filter_map(|name| step_record_key(&self.key, name).ok())
            .collect();
        let (store, limit) = (self.store.clone(), self.store_timeout);
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        runtime.spawn(async move {
            for key in keys {
                if let Ok(Err(e)) = tokio::time::timeout(limit, store.delete(&key)).await {
                    tracing::debug!(target: "idem", key = %key, error = %e,
                        "a step record was not deleted; it expires with its ttl");
                }
            }
        });
    }

    pub(super) fn store_ops<'c>(&'c self, key: &'c Key) -> StoreOps<'c> {
        StoreOps {
            store: &*self.store,
            clock: &self.clock,
            store_timeout: self.store_timeout,
            key,
            fingerprint: self.fingerprint,
            ttl: self.ttl,
            lease: self.lease,
            // An earlier attempt may still be in this step (its holder was taken over but
            // runs on): wait for its record rather than run the step beside it.
            mode: InProgress::Wait,
            wait_timeout: self
                .lease
                .saturating_mul(2)
                .saturating_add(self.store_timeout),
            retry_after: None,
            lease_loss: self.lease_loss,
        }
    }

    pub(super) fn error(&self, step: &str, reason: impl Into<String>) -> Error {
        Error::Step {
            key: Some(self.key.clone()),
            step: step.to_owned(),
            reason: reason.into(),
        }
    }

    /// Records that the attempt reached step `name`: refused if it already did.
    pub(super) fn enter(&self, name: &str) -> Result<(), Error> {
        let mut state = self.state();
        if state.names.iter().any(|n| n == name) {
            return Err(self.error(
                name,
                "this body already ran a step of this name; each step needs its own (in a loop, number them: `email.0`, `email.1`)",
            ));
        }
        if let Some(held) = &state.held {
            return Err(Error::OutcomeUnknown {
                key: self.key.clone(),
                step: held.clone(),
            });
        }
        state.names.push(name.to_owned());
        Ok(())
    }

    /// Whether the call is still this attempt's, before a step it claimed runs. An attempt
    /// younger than a lease is (no successor can have taken the key over yet). An older
    /// one may have lost it (its extends went unanswered, or it runs on with
    /// [`LeaseLoss::Finish`]) to a successor that ran this step, stored the call's result
    /// and deleted the step's record: the step's claim alone does not tell, so the call's
    /// record is read, and unless this attempt still holds it, the step does not run.
    pub(super) async fn still_ours(&self) -> Result<(), Error> {
        if Instant::now() < self.claimed_at + self.lease {
            return Ok(());
        }
        let store = &*self.store;
        let get = store.get(&self.key);
        match store_op(store, &self.clock, "get", self.store_timeout, get)
            .await
            .map_err(|source| store_error(&self.key, source))?
        {
            Some(Record::InProgress { token, .. }) if token == self.token => Ok(()),
            _ => Err(Error::LeaseLost {
                key: self.key.clone(),
            }),
        }
    }

    pub(super) fn hold(&self, name: &str) {
        let mut state = self.state();
        state.held.get_or_insert_with(|| name.to_owned());
    }

    pub(super) fn unrecorded(&self) {
        self.state().unrecorded = true;
    }

    pub(super) fn reused(&self) {
        self.state().reused = true;
    }

    /// Records that the attempt reached step `name`, if it had not yet.
    pub(super) fn note(&self, name: &str) {
        let mut state = self.state();
        if !state.names.iter().any(|n| n == name) {
            state.names.push(name.to_owned());
        }
    }

    /// The held step's own record could not be given its hold: the key's hold says so.
    pub(super) fn hold_not_on_step(&self) {
        self.state().hold_not_on_step = true;
    }

    pub(super) fn started(&self, running: bool) {
        self.state().started = running;
    }

    /// Whether both the step's claim (leased at `step_leased_at`) and the call's are live
    /// now by this process's clock: a store's answer that arrived late (a claim, a `get`)
    /// may describe a lease that has ended since, and a successor may run the step.
    pub(super) fn both_leases_live(&self, step_leased_at: Instant) -> bool {
        let now = Instant::now();
        now < step_leased_at + self.lease && now < self.call_lease.get() + self.lease
    }
}

/// A key for step `name` of the call keyed `parent`, to hand on to the system the step
/// calls (a payment provider's own idempotency key): 32 lowercase hex digits, the 128-bit
/// digest of the step record's key. Stable across releases, like every digest of idem.
pub(crate) fn provider_key(parent: &Key, name: &str) -> Result<String, String> {
    let key = step_record_key(parent, name)?;
    Ok(crate::digest_hex(key.as_str()))
}

/// Runs `body`, a call's body run without a key and so without idempotency
/// ([`MissingKey::Run`](super::MissingKey::Run)): its steps run as plain code, nothing
/// recorded.
pub(super) fn unkeyed<F: Future>(body: F) -> impl Future<Output = F::Output> {
    JOURNAL.scope(None, body)
}

/// The journal of the call whose body is running (`None` for a body run without a key),
/// or the error for a step outside any.
pub(super) fn current(name: &str) -> Result<Option<Arc<Journal>>, Error> {
    JOURNAL.try_with(Clone::clone).map_err(|_| Error::Step {
        key: None,
        step: name.to_owned(),
        reason: "a step runs only in the body of an idempotent call, in the body's own task (a task the body spawns does not see the call)".into(),
    })
}
