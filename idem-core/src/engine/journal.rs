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
//! A step that fails in a way that leaves its outcome unknown ([`Step::unknown_if`]) is
//! completed with a hold instead of a value, and so is the call's own key: every later
//! call of the key answers [`Error::OutcomeUnknown`] without running the body, until the
//! step is resolved ([`Idem::resolve`], the engine's reconcile hook, or `idem resolve`).

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use serde::{de::DeserializeOwned, Serialize};
use tokio::time::Instant;

use super::claim::{claim_or_wait, Claimed};
use super::complete::store_result;
use super::heartbeat::{with_heartbeat, LeaseMark};
use super::observe::StoreClock;
use super::release::ReleaseGuard;
use super::store_op::{store_error, store_op, StoreOps};
use super::{InProgress, LeaseLoss};
use crate::codec::Json;
use crate::envelope::{self, Kind};
use crate::error::Error;
use crate::key::{check_step_name, step_record_key, Key};
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
    store: Arc<dyn Store>,
    key: Key,
    /// The call's fingerprint: each step's record carries it, so that an attempt with
    /// another payload is refused at its first step instead of replaying another's.
    fingerprint: Fingerprint,
    /// The call's clock: its steps' store time counts in the call's span.
    clock: Arc<StoreClock>,
    /// The call's claim: its token, and when it was sent (its lease ends no sooner than a
    /// lease after that).
    token: Token,
    claimed_at: Instant,
    /// When the call's lease last secured began, by this process's clock: the claim, then
    /// each extend the store confirmed.
    call_lease: LeaseMark,
    ttl: Duration,
    /// How long a hold lives, unresolved.
    hold_ttl: Duration,
    lease: Duration,
    store_timeout: Duration,
    lease_loss: LeaseLoss,
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

    fn store_ops<'c>(&'c self, key: &'c Key) -> StoreOps<'c> {
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

    fn error(&self, step: &str, reason: impl Into<String>) -> Error {
        Error::Step {
            key: Some(self.key.clone()),
            step: step.to_owned(),
            reason: reason.into(),
        }
    }

    /// Records that the attempt reached step `name`: refused if it already did.
    fn enter(&self, name: &str) -> Result<(), Error> {
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
    async fn still_ours(&self) -> Result<(), Error> {
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

    fn hold(&self, name: &str) {
        let mut state = self.state();
        state.held.get_or_insert_with(|| name.to_owned());
    }

    fn unrecorded(&self) {
        self.state().unrecorded = true;
    }

    fn reused(&self) {
        self.state().reused = true;
    }

    /// Records that the attempt reached step `name`, if it had not yet.
    fn note(&self, name: &str) {
        let mut state = self.state();
        if !state.names.iter().any(|n| n == name) {
            state.names.push(name.to_owned());
        }
    }

    pub(super) fn started(&self, running: bool) {
        self.state().started = running;
    }

    /// Whether both the step's claim (leased at `step_leased_at`) and the call's are live
    /// now by this process's clock: a store's answer that arrived late (a claim, a `get`)
    /// may describe a lease that has ended since, and a successor may run the step.
    fn both_leases_live(&self, step_leased_at: Instant) -> bool {
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
fn current(name: &str) -> Result<Option<Arc<Journal>>, Error> {
    JOURNAL.try_with(Clone::clone).map_err(|_| Error::Step {
        key: None,
        step: name.to_owned(),
        reason: "a step runs only in the body of an idempotent call, in the body's own task (a task the body spawns does not see the call)".into(),
    })
}

/// A stable key for step `name` of the idempotent call whose body is running: pass it on as
/// the idempotency key of the system the step calls (Stripe's `Idempotency-Key`, say), so
/// that a step run again after a crash is answered by that system instead of repeated. It is
/// 32 lowercase hex digits, the same for every attempt of the call's key, different for each
/// step and key. An [`Error::Step`] outside a call's body or for a name that is not valid.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), idem::Error> {
/// let idem = idem::Idem::new(idem::MemoryStore::new());
/// let key = idem::Key::new("shop::checkout", "o-1")?;
/// let (a, b) = idem
///     .call(key.clone(), idem::Fingerprint::NONE)
///     .run_fallible(|| async { Ok::<_, idem::Error>((idem::step_key("charge")?, idem::step_key("email")?)) })
///     .await?;
/// assert_eq!(a.len(), 32);
/// assert_ne!(a, b);
/// assert!(idem::step_key("charge").is_err(), "no call runs here");
/// # Ok(()) }
/// ```
pub fn step_key(name: &str) -> Result<String, Error> {
    let Some(journal) = current(name)? else {
        return Err(Error::Step {
            key: None,
            step: name.to_owned(),
            reason: "this body runs without an idempotency key (`missing_key = \"run\"`), so its steps have no key to hand on".into(),
        });
    };
    provider_key(&journal.key, name).map_err(|reason| journal.error(name, reason))
}

/// The record of step `name` of the idempotent call whose body is running, for a store
/// that writes it itself inside the caller's own transaction (`SqlStore::record_step_in`
/// in `idem::stores`): its key, the call's fingerprint it carries, and how long it lives.
/// The step counts as one of the body's (its record is deleted with the others once the
/// call's result is stored). An [`Error::Step`] outside a call's body, in a body run
/// without a key, or for a name that is not valid.
pub fn step_record(name: &str) -> Result<StepRecord, Error> {
    let Some(journal) = current(name)? else {
        return Err(Error::Step {
            key: None,
            step: name.to_owned(),
            reason: "this body runs without an idempotency key (`missing_key = \"run\"`), so its steps have no record".into(),
        });
    };
    let key = journal.key.step(name)?;
    journal.note(name);
    Ok(StepRecord {
        key,
        call: journal.key.clone(),
        fingerprint: journal.fingerprint,
        ttl: journal.ttl,
    })
}

/// Where and how a step's record is written: see [`step_record`].
#[derive(Debug, Clone)]
pub struct StepRecord {
    key: Key,
    call: Key,
    fingerprint: Fingerprint,
    ttl: Duration,
}

impl StepRecord {
    /// The step record's key, `<scope>#step:<name>/<id>`.
    pub fn key(&self) -> &Key {
        &self.key
    }

    /// The key of the call the step belongs to.
    pub fn call_key(&self) -> &Key {
        &self.call
    }

    /// The call's fingerprint, which the record carries.
    pub fn fingerprint(&self) -> Fingerprint {
        self.fingerprint
    }

    /// How long the record lives: the call's ttl.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }
}

/// Runs `f` as the step `name` of the idempotent call whose body is running: once per key,
/// however many attempts the call takes. Short for [`Step::new(name).run(f)`](Step::run).
///
/// A step's value is stored as soon as it completes; a later attempt of the key (after the
/// body returned an `Err`, panicked, or its process died and the lease was taken over) gets
/// it from the store instead of running `f` again, and runs only the steps after it. A
/// step outside an idempotent call's body, or a name the body already used, is an
/// [`Error::Step`].
///
/// A step's record belongs to its call's payload: an attempt of the key with another
/// payload gets [`Error::KeyReuse`] from its first step that has a record (and the call
/// answers `KeyReuse`), never the other payload's value. A step starts only while its claim
/// and the call's lease are both live by this process's clock; a stored value that no
/// longer decodes into `T` holds the key ([`Error::OutcomeUnknown`]) rather than run `f`
/// again. What `f` did before a crash that stopped it ahead of its record is run again by
/// the next attempt: hand the system it calls [`step_key`], or mark the errors that leave
/// its outcome unknown with [`Step::unknown_if`].
///
/// An idempotent call made inside the body (an `#[idempotent]` function, another
/// `Idem::call`) is a call of its own: it keeps the key its arguments give it (none is
/// derived from the enclosing call's), and the steps in its own body are its steps. To run
/// it once per key of the enclosing call, wrap it in a step; to derive its key from the
/// enclosing call's, give it [`step_key`] as its key.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), idem::Error> {
/// use std::sync::atomic::{AtomicBool, AtomicU32, Ordering::SeqCst};
/// let idem = idem::Idem::new(idem::MemoryStore::new());
/// let (charges, mail_up) = (AtomicU32::new(0), AtomicBool::new(false));
/// let checkout = || {
///     let key = idem::Key::new("shop::checkout", "o-1").unwrap();
///     idem.call(key, idem::Fingerprint::NONE).run_fallible(|| async {
///         let receipt = idem::step("charge", || async {
///             charges.fetch_add(1, SeqCst);
///             Ok::<_, idem::Error>("ch_1".to_string())
///         })
///         .await?;
///         idem::step("email", || async {
///             match mail_up.load(SeqCst) {
///                 true => Ok(()),
///                 false => Err(idem::Error::Config { message: "mail server down".into(), source: None }),
///             }
///         })
///         .await?;
///         Ok(receipt)
///     })
/// };
/// assert!(checkout().await.is_err(), "charged, then the email failed: the claim is given back");
/// mail_up.store(true, SeqCst);
/// assert_eq!(checkout().await?, "ch_1", "the retry gets the charge's record, and sends the email");
/// assert_eq!(charges.load(SeqCst), 1);
/// # Ok(()) }
/// ```
pub async fn step<T, E, F, Fut>(name: &str, f: F) -> Result<T, E>
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = Result<T, E>>,
    T: Serialize + DeserializeOwned,
    E: From<Error>,
{
    run_step(name, NeverUnknown, false, f).await
}

/// Which errors of a step leave its outcome unknown: see [`Step::unknown_if`]. Implemented
/// by every `FnOnce(&E) -> bool`, and by [`NeverUnknown`].
pub trait Ambiguous<E> {
    /// Whether `err` leaves the step's outcome unknown.
    fn ambiguous(self, err: &E) -> bool;
}

impl<E, F: FnOnce(&E) -> bool> Ambiguous<E> for F {
    fn ambiguous(self, err: &E) -> bool {
        self(err)
    }
}

/// A step none of whose errors leaves its outcome unknown: what [`Step::new`] starts with.
#[derive(Debug, Clone, Copy, Default)]
pub struct NeverUnknown;

impl<E> Ambiguous<E> for NeverUnknown {
    fn ambiguous(self, _: &E) -> bool {
        false
    }
}

/// A step with its options: [`Step::new`], then [`unknown_if`](Step::unknown_if), then
/// [`run`](Step::run). See [`step`], and the guide's chapter on steps.
#[derive(Debug, Clone)]
pub struct Step<'n, P = NeverUnknown> {
    name: &'n str,
    unknown_if: P,
    at_most_once: bool,
}

impl<'n> Step<'n> {
    /// The step `name` (1 to 64 bytes of ASCII letters, digits, `_`, `-` and `.`; unique
    /// within the body).
    pub fn new(name: &'n str) -> Self {
        Step {
            name,
            unknown_if: NeverUnknown,
            at_most_once: false,
        }
    }

    /// Marks the step's outcome unknown when it fails with an error for which `ambiguous`
    /// answers true: a timeout or a connection lost after the request was sent, when the
    /// other side may have acted. The step's error is returned to the body as usual; the
    /// call then stores no result and gives nothing back, but holds the key: every later
    /// call answers [`Error::OutcomeUnknown`] until the step is resolved.
    ///
    /// A hold lives until it is resolved (the reconcile hook on the next call,
    /// [`Idem::resolve`](crate::Idem::resolve), or `idem resolve` by hand), not for the
    /// call's `ttl`; or for [`IdemBuilder::hold_ttl`](crate::IdemBuilder::hold_ttl) when the
    /// engine sets one. When the hold cannot be written, the call answers
    /// [`Error::OutcomeNotHeld`] instead.
    pub fn unknown_if<E, P: FnOnce(&E) -> bool>(self, ambiguous: P) -> Step<'n, P> {
        Step {
            name: self.name,
            unknown_if: ambiguous,
            at_most_once: self.at_most_once,
        }
    }
}

impl<P> Step<'_, P> {
    /// Runs the step at most once per key, even across a crash inside it: before `f` runs,
    /// the step's record is written as a hold (its outcome unknown), and replaced by its
    /// value once `f` returns. An attempt that finds that hold (its predecessor died, or
    /// was cut off, between the two) does not run `f`: the key is held
    /// ([`Error::OutcomeUnknown`]) until the step is resolved, as for an
    /// [ambiguous error](Step::unknown_if). An `Err` that is not ambiguous deletes the hold,
    /// so the next attempt runs the step.
    ///
    /// For a system that takes no idempotency key (an email, a provider without
    /// [`step_key`]): a crash then costs a person's decision instead of a second run. It
    /// costs one more store round trip per step.
    pub fn at_most_once(mut self) -> Self {
        self.at_most_once = true;
        self
    }

    /// Runs `f` as this step: the value of an earlier attempt's run when the store has its
    /// record, else `f`'s, stored before it is returned. An `Err` stores nothing, so a
    /// later attempt runs the step again (unless [`unknown_if`](Step::unknown_if) calls it
    /// ambiguous). The value goes through the JSON codec, and the body gets it decoded, on
    /// the first run as on the others.
    pub async fn run<T, E, F, Fut>(self, f: F) -> Result<T, E>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
        T: Serialize + DeserializeOwned,
        E: From<Error>,
        P: Ambiguous<E>,
    {
        run_step(self.name, self.unknown_if, self.at_most_once, f).await
    }
}

async fn run_step<T, E, F, Fut, P>(
    name: &str,
    unknown_if: P,
    at_most_once: bool,
    f: F,
) -> Result<T, E>
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = Result<T, E>>,
    T: Serialize + DeserializeOwned,
    E: From<Error>,
    P: Ambiguous<E>,
{
    let Some(journal) = current(name)? else {
        // A body run without a key: no idempotency, so the step is plain code.
        check_step_name(name).map_err(|reason| Error::Step {
            key: None,
            step: name.to_owned(),
            reason,
        })?;
        return f().await;
    };
    let key = journal.key.step(name)?;
    journal.enter(name)?;
    let call = journal.store_ops(&key);
    let (token, leased_at) = match claim_or_wait(&call).await {
        Ok(Claimed::Completed { payload, .. }) => {
            return replay(&journal, name, &key, payload).await.map_err(E::from)
        }
        Ok(Claimed::Ours {
            token, leased_at, ..
        }) => (token, leased_at),
        Err(Error::KeyReuse { .. }) => {
            // The step's record was written by an attempt with another payload.
            journal.reused();
            return Err(Error::KeyReuse {
                key: journal.key.clone(),
            }
            .into());
        }
        Err(e) => return Err(e.into()),
    };
    // Dropped or panicking before its record is written, the step gives its claim back,
    // as the call does: a later attempt runs it again.
    let mut guard = ReleaseGuard::new(
        journal.store.clone(),
        journal.store_timeout,
        key.clone(),
        token,
    );
    let live = match journal.still_ours().await {
        Ok(()) if journal.both_leases_live(leased_at) => Ok(()),
        Ok(()) => {
            tracing::warn!(target: "idem", key = %key,
                "the step does not run: its claim or the call's lease ended while the store answered");
            Err(Error::LeaseLost {
                key: journal.key.clone(),
            })
        }
        Err(e) => Err(e),
    };
    if let Err(e) = live {
        guard.release(call.clock).await;
        return Err(e.into());
    }
    if at_most_once {
        return run_at_most_once(
            &journal,
            name,
            &key,
            (token, leased_at),
            guard,
            unknown_if,
            f,
        )
        .await;
    }
    let beat = with_heartbeat(&call, token, leased_at, None, f()).await;
    let Some(out) = beat.out else {
        guard.disarm();
        journal.unrecorded();
        return Err(Error::LeaseLost {
            key: journal.key.clone(),
        }
        .into());
    };
    let lease_ends = beat.leased_at + call.lease;
    let e = match out {
        Ok(value) => {
            guard.disarm();
            return match seal_step(&key, &value) {
                Ok((sealed, value)) => {
                    match store_result(&call, token, &sealed, lease_ends).await {
                        Ok(()) => {
                            tracing::debug!(target: "idem", key = %key, "step completed");
                            Ok(value)
                        }
                        Err(e) => {
                            journal.unrecorded();
                            Err(e.into())
                        }
                    }
                }
                Err(e) => {
                    // The step ran, and its value cannot be kept.
                    journal.unrecorded();
                    Err(e.into())
                }
            };
        }
        Err(e) => e,
    };
    // Asking runs the user's predicate: a panic there keeps the step's claim, as an error
    // that cannot be judged may be one whose effect happened.
    if !guard.held_while(|| unknown_if.ambiguous(&e)) {
        guard.release(call.clock).await;
        return Err(e);
    }
    guard.disarm();
    tracing::warn!(target: "idem", key = %journal.key, step = name,
        "the step's outcome is unknown: the key is held until it is resolved");
    let hold = Bytes::from(envelope::seal_held(name, journal.token.0, true));
    let held = StoreOps {
        ttl: journal.hold_ttl,
        ..journal.store_ops(&key)
    };
    if store_result(&held, token, &hold, lease_ends).await.is_err() {
        journal.unrecorded();
        // The key's hold says so: a resolution as ran then writes the step's value itself.
        journal.state().hold_not_on_step = true;
    }
    journal.hold(name);
    Err(e)
}

/// Runs `f` as an [at-most-once](Step::at_most_once) step, under the step's claim
/// `(token, leased_at)`: its record completed with a hold first, then that hold replaced by
/// the value, deleted after an `Err` that is not ambiguous, or left for a person after an
/// ambiguous one, a crash, a drop or a panic.
async fn run_at_most_once<T, E, F, Fut, P>(
    journal: &Journal,
    name: &str,
    key: &Key,
    (token, leased_at): (Token, Instant),
    mut guard: ReleaseGuard,
    unknown_if: P,
    f: F,
) -> Result<T, E>
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = Result<T, E>>,
    T: Serialize + DeserializeOwned,
    E: From<Error>,
    P: Ambiguous<E>,
{
    let hold = Bytes::from(envelope::seal_held(name, journal.token.0, true));
    let held = StoreOps {
        ttl: journal.hold_ttl,
        ..journal.store_ops(key)
    };
    if let Err(e) = store_result(&held, token, &hold, leased_at + held.lease).await {
        // Nothing ran: the claim is given back (or ends with its lease).
        guard.release(held.clock).await;
        return Err(e.into());
    }
    guard.disarm();
    // From here the record says "started": whatever stops this attempt leaves the step
    // held, and the call's claim is kept rather than given back.
    journal.started(true);
    let out = f().await;
    journal.started(false);
    let store = &*journal.store;
    let replace = |new: Option<(Bytes, Duration)>| {
        let replace = store.replace(key, &hold, new);
        store_op(
            store,
            &journal.clock,
            "replace",
            journal.store_timeout,
            replace,
        )
    };
    let e = match out {
        Ok(value) => {
            let (sealed, value) = match seal_step(key, &value) {
                Ok(sealed) => sealed,
                Err(e) => {
                    journal.hold(name);
                    return Err(e.into());
                }
            };
            return match replace(Some((sealed, journal.ttl))).await {
                Ok(true) => Ok(value),
                // Resolved meanwhile, or not stored: the step stays in the hands of its
                // resolution.
                Ok(false) => {
                    journal.hold(name);
                    Err(Error::OutcomeUnknown {
                        key: journal.key.clone(),
                        step: name.to_owned(),
                    }
                    .into())
                }
                Err(source) => {
                    journal.hold(name);
                    Err(store_error(key, source).into())
                }
            };
        }
        Err(e) => e,
    };
    let nothing_happened = !unknown_if.ambiguous(&e);
    if !(nothing_happened && matches!(replace(None).await, Ok(true))) {
        tracing::warn!(target: "idem", key = %journal.key, step = name,
            "the step's outcome is unknown: the key is held until it is resolved");
        journal.hold(name);
    }
    Err(e)
}

/// A step's value sealed (JSON, result version 0) and decoded back: the bytes to store and
/// the value the body gets.
fn seal_step<T: Serialize + DeserializeOwned>(key: &Key, value: &T) -> Result<(Bytes, T), Error> {
    envelope::seal(&Json, Kind::Value, 0, value)
        .and_then(|bytes| {
            let back = envelope::open_value::<_, T>(&Json, 0, &bytes)?;
            Ok((Bytes::from(bytes), back))
        })
        .map_err(|source| Error::Encode {
            key: key.clone(),
            source,
        })
}

/// An earlier attempt's record of a step: its value, or its hold. A value that does not
/// decode into the step's type (a resolution that wrote the wrong type, say) is not taken
/// for "no record", which would run the step again: its record becomes a hold (only if it
/// still holds that value), and the key is held for the step.
async fn replay<T: DeserializeOwned>(
    journal: &Journal,
    name: &str,
    key: &Key,
    payload: Bytes,
) -> Result<T, Error> {
    let held = || Error::OutcomeUnknown {
        key: journal.key.clone(),
        step: name.to_owned(),
    };
    if envelope::held_step(&payload).is_some() {
        journal.hold(name);
        return Err(held());
    }
    let error = match envelope::open_value(&Json, 0, &payload) {
        Ok(value) => {
            tracing::debug!(target: "idem", key = %key, "step replayed");
            return Ok(value);
        }
        Err(error) => error,
    };
    tracing::warn!(target: "idem", key = %journal.key, step = name, %error,
        "the step's stored value does not decode into its type: the key is held until the step is resolved");
    journal.hold(name);
    let store = &*journal.store;
    if store.capabilities().replaces_records {
        let hold = Bytes::from(envelope::seal_held(name, journal.token.0, true));
        let replace = store.replace(key, &payload, Some((hold, journal.hold_ttl)));
        let replaced = store_op(
            store,
            &journal.clock,
            "replace",
            journal.store_timeout,
            replace,
        );
        if let Err(e) = replaced.await {
            tracing::warn!(target: "idem", key = %key, error = %e,
                "could not write the step's hold over its undecodable value");
        }
    }
    Err(held())
}
