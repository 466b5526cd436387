//! The steps a body runs: [`step`], [`Step`] with its options, [`step_key`] for the system
//! a step calls, and [`step_record`] for a store that writes a step's record itself. What a
//! step does against the store is in [`step_run`](super::step_run); what the steps of one
//! attempt share, in [`journal`](super::journal).

use std::future::Future;
use std::time::Duration;

use serde::{de::DeserializeOwned, Serialize};

use super::journal::{current, provider_key};
use super::step_run::run_step;
use crate::error::Error;
use crate::key::Key;
use crate::store::Fingerprint;

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
///     .run_fallible(|| async { Ok::<_, idem::Error>((idem::steps::step_key("charge")?, idem::steps::step_key("email")?)) })
///     .await?;
/// assert_eq!(a.len(), 32);
/// assert_ne!(a, b);
/// assert!(idem::steps::step_key("charge").is_err(), "no call runs here");
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
