//! [`Call`]: one call's key, fingerprint and options, set one by one before it runs.

use std::marker::PhantomData;
use std::time::Duration;

use super::builder::check_duration;
use super::observe::StoreClock;
use super::store_op::StoreOps;
use super::{Idem, Inner, Origin, Outcome};
use crate::codec::{BuiltinCodec, Codec};
use crate::error::Error;
use crate::key::Key;
use crate::store::Fingerprint;

/// What a call does when another call holds its key and is still running.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum InProgress {
    /// Answer at once with [`Error::InProgress`] and a retry-after hint.
    #[default]
    Reject,
    /// Wait (up to the wait timeout) for the first call's result and return it.
    Wait,
}

/// What a running body does when its lease is lost: when the store refuses to extend it
/// (another caller took the key over), or when a whole lease passed without an extend the
/// store confirmed. Either way the result can no longer be stored (the store takes it only
/// from the current holder), and the key is, or may at any moment be, another caller's,
/// whose body runs the side effect again.
///
/// Cancelling drops the body's future at its next `.await`: what it has not begun does not
/// happen beside its successor. It cannot undo what already happened, stop work the body
/// handed to a task of its own (`tokio::spawn`) or to another thread, or interrupt a
/// blocking call; a body whose steps must not stop half-way should be cancel-safe (a
/// database transaction not committed rolls back when dropped) or ask for
/// [`LeaseLoss::Finish`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum LeaseLoss {
    /// Drop the body and answer [`Error::LeaseLost`] (the default).
    #[default]
    Cancel,
    /// Let the body run to its end beside its successor. A lease the store fenced answers
    /// [`Error::LeaseLost`] and stores nothing; after extends that only went unanswered,
    /// the result is offered to the store, which takes it if the lease was in fact still
    /// this call's. Only the fenced case is noticed while the body runs.
    Finish,
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

/// What a call knows of its payload: its fingerprint, or the canonical encoding it is
/// the digest of. `#[idempotent]` keeps the encoding when the engine has a local cache, so
/// that a hit compares encodings instead of hashing this one; the hash is taken only when
/// the call goes on to the store.
pub enum RequestPrint {
    /// The fingerprint, already taken.
    Fingerprint(Fingerprint),
    /// The canonical encoding of the payload.
    Encoded(Box<[u8]>),
}

impl RequestPrint {
    /// The fingerprint (hashing the encoding, if that is what is held).
    pub(crate) fn fingerprint(&self) -> Fingerprint {
        match self {
            RequestPrint::Fingerprint(fp) => *fp,
            RequestPrint::Encoded(encoding) => Fingerprint::of_encoding(encoding),
        }
    }

    /// The encoding, if held.
    pub(crate) fn encoding(&self) -> Option<&[u8]> {
        match self {
            RequestPrint::Fingerprint(_) => None,
            RequestPrint::Encoded(encoding) => Some(encoding),
        }
    }
}

impl From<Fingerprint> for RequestPrint {
    fn from(fp: Fingerprint) -> Self {
        RequestPrint::Fingerprint(fp)
    }
}

/// One idempotent call: its key, fingerprint and options. Built by [`Idem::call`]; `C` is
/// the codec of its result, `A` what its run methods answer: the bare value ([`Bare`], the
/// default), or after [`with_outcome`](Call::with_outcome) an [`Outcome`] that also says
/// whether the value is a first run's or a replay ([`WithOutcome`]).
#[must_use = "a call does nothing until `.run(...)` is awaited"]
pub struct Call<'a, C = BuiltinCodec, A = Bare> {
    pub(super) idem: &'a Idem,
    pub(super) key: Result<Key, Error>,
    pub(super) print: RequestPrint,
    pub(super) options: Options,
    pub(super) version: u64,
    pub(super) missing_key: MissingKey,
    pub(super) codec: C,
    pub(super) answer: PhantomData<fn() -> A>,
}

/// A [`Call`] whose run methods answer an [`Outcome`]: made by [`Call::with_outcome`] and
/// [`Idem::consume`].
pub type CallWithOutcome<'a, C = BuiltinCodec> = Call<'a, C, WithOutcome>;

/// What a [`Call`]'s run methods answer for its value: [`Bare`] or [`WithOutcome`].
pub trait Answer: sealed::Sealed + Send + Sync + 'static {
    /// The answer for a value `T`.
    type Out<T>;
    /// The answer for `value`, which came from `origin`.
    #[doc(hidden)]
    fn answer<T>(value: T, origin: Origin) -> Self::Out<T>;
}

/// A call answers its value alone: `T`.
#[derive(Debug)]
pub enum Bare {}

/// A call answers its value with where it came from: [`Outcome<T>`](Outcome).
#[derive(Debug)]
pub enum WithOutcome {}

mod sealed {
    pub trait Sealed {}
    impl Sealed for super::Bare {}
    impl Sealed for super::WithOutcome {}
}

impl Answer for Bare {
    type Out<T> = T;
    fn answer<T>(value: T, _: Origin) -> T {
        value
    }
}

impl Answer for WithOutcome {
    type Out<T> = Outcome<T>;
    fn answer<T>(value: T, origin: Origin) -> Outcome<T> {
        Outcome::new(value, origin)
    }
}

/// The options a call sets one by one; `None` leaves the engine's.
#[derive(Clone, Copy, Default)]
pub(super) struct Options {
    pub(super) ttl: Option<Duration>,
    pub(super) lease: Option<Duration>,
    pub(super) in_progress: Option<InProgress>,
    pub(super) wait_timeout: Option<Duration>,
    pub(super) retry_after: Option<Duration>,
    pub(super) lease_loss: Option<LeaseLoss>,
    pub(super) at_most_once: bool,
}

impl<'a, C: Codec, A: Answer> Call<'a, C, A> {
    /// The time to live of this call's result.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.options.ttl = Some(ttl);
        self
    }

    /// The lease of this call's claim.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.options.lease = Some(lease);
        self
    }

    /// What a concurrent duplicate of this call does.
    pub fn in_progress(mut self, mode: InProgress) -> Self {
        self.options.in_progress = Some(mode);
        self
    }

    /// How long this call waits for a concurrent duplicate in wait mode.
    pub fn wait_timeout(mut self, timeout: Duration) -> Self {
        self.options.wait_timeout = Some(timeout);
        self
    }

    /// The retry-after hint of this call's [`Error::InProgress`], when it finds its key
    /// held by another call that still runs (the engine's
    /// [`retry_after`](crate::IdemBuilder::retry_after) otherwise): never beyond what
    /// remains of the holder's lease, never under 1 ms.
    pub fn retry_after(mut self, hint: Duration) -> Self {
        self.options.retry_after = Some(hint);
        self
    }

    /// What this call's body does if its lease is lost while it runs (the engine's
    /// [`lease_loss`](crate::IdemBuilder::lease_loss) otherwise, by default
    /// [`LeaseLoss::Cancel`]).
    pub fn lease_loss(mut self, mode: LeaseLoss) -> Self {
        self.options.lease_loss = Some(mode);
        self
    }

    /// Runs the body at most once per key, even across a crash: before the body runs, a
    /// record says it started (a hold of the step `call`, under
    /// [`Key::step`](crate::Key::step)`("call")`); once its result is stored, that record
    /// goes. A takeover that finds it (the body's process died, or its result could not be
    /// stored before its lease ended) does not run the body again: the key is held
    /// ([`Error::OutcomeUnknown`] naming the step `call`) until it is resolved, with the
    /// body's result as the value when it ran (`idem resolve <url> <key> call --ran
    /// --value '<result as JSON>'`). A body that returned an error not to keep clears the
    /// record, so the next attempt runs it.
    ///
    /// It costs two store round trips more per first call; `call` is then not a name the
    /// body's own steps can use (a body whose plain step was named `call` before its call
    /// became at most once renames it: that step's value would read as the body's result).
    /// A step of the body whose outcome is unknown holds the key on that step and keeps the
    /// mark: once the step is resolved, the next attempt holds the key on `call`, since
    /// what the body did outside its steps happened.
    pub fn at_most_once(mut self) -> Self {
        self.options.at_most_once = true;
        self
    }

    /// The version of this call's result format (default 0), written into each record it
    /// stores. Raise it when a change of the result type must not read records written
    /// before it (with JSON, a compatible change such as a new `#[serde(default)]` field needs
    /// none): a record of another version is then refused with
    /// [`DecodeError::ResultVersion`](crate::DecodeError::ResultVersion) until it expires, and never decoded into the new type.
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
    pub fn codec<C2: Codec>(self, codec: C2) -> Call<'a, C2, A> {
        self.recast(|_| codec)
    }

    /// This call, answering as `A2` does.
    fn answering<A2: Answer>(self) -> Call<'a, C, A2> {
        self.recast(|codec| codec)
    }

    /// This call with its codec mapped by `codec` and answering as `A2` does; every option
    /// kept.
    fn recast<C2: Codec, A2: Answer>(self, codec: impl FnOnce(C) -> C2) -> Call<'a, C2, A2> {
        Call {
            idem: self.idem,
            key: self.key,
            print: self.print,
            options: self.options,
            version: self.version,
            missing_key: self.missing_key,
            codec: codec(self.codec),
            answer: PhantomData,
        }
    }

    /// This call, answering an [`Outcome`]: the value and its [`Origin`], which tells a
    /// first run ([`Origin::Ran`]) from a replay read from the store or from the local
    /// cache. A fallible body answers `Result<Outcome<T>, E>`; its `Err` is the body's own
    /// error or idem's (with
    /// [`run_caching_errors`](Call::run_caching_errors), a replayed error is an
    /// `Err` too, and carries no origin).
    ///
    /// ```
    /// # use idem::{Fingerprint, Idem, Key, MemoryStore, Origin};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), idem::Error> {
    /// let idem = Idem::new(MemoryStore::new());
    /// let charge = || async { Ok::<u64, idem::Error>(1000) };
    /// let key = Key::new("billing::charge", "o-1")?;
    /// let first = idem.call(key.clone(), Fingerprint::NONE).with_outcome().run_fallible(charge).await?;
    /// let again = idem.call(key, Fingerprint::NONE).with_outcome().run_fallible(charge).await?;
    /// assert_eq!((first.origin(), *first.value()), (Origin::Ran, 1000));
    /// assert_eq!((again.origin(), again.is_replay()), (Origin::Store, true));
    /// # Ok(()) }
    /// ```
    pub fn with_outcome(self) -> CallWithOutcome<'a, C> {
        self.answering()
    }
}

/// What the run methods of a call answer for a value `T`, as the engine's run functions
/// and `#[idempotent]`'s expansion take it. Not a public API. It has no lifetime of its own
/// (the call's is reached through `Self: 'a`), so that a future with this bound stays
/// `Send` where a spawned task needs it to be.
#[doc(hidden)]
pub trait Answers: Sized {
    /// The codec of the call's result.
    type Codec: Codec;
    /// The answer for a value `T`.
    type Out<T>;
    /// The call itself, answering its bare value.
    fn into_call<'a>(self) -> Call<'a, Self::Codec>
    where
        Self: 'a;
    /// The answer for `value`, which came from `origin`.
    fn answer<T>(value: T, origin: Origin) -> Self::Out<T>;
}

impl<C: Codec, A: Answer> Answers for Call<'_, C, A> {
    type Codec = C;
    type Out<T> = A::Out<T>;
    fn into_call<'a>(self) -> Call<'a, C>
    where
        Self: 'a,
    {
        self.answering()
    }
    fn answer<T>(value: T, origin: Origin) -> A::Out<T> {
        A::answer(value, origin)
    }
}

impl Options {
    /// The context of the call's store operations: these options with the engine's defaults
    /// filled in, each within what stores and clocks keep ([`Error::InvalidOption`] if not).
    pub(super) fn resolve<'c>(
        &self,
        inner: &'c Inner,
        key: &'c Key,
        fingerprint: Fingerprint,
        clock: &'c StoreClock,
    ) -> Result<StoreOps<'c>, Error> {
        let call = StoreOps {
            store: &*inner.store,
            clock,
            store_timeout: inner.store_timeout,
            key,
            fingerprint,
            ttl: self.ttl.unwrap_or(inner.ttl),
            lease: self.lease.unwrap_or(inner.lease),
            mode: self.in_progress.unwrap_or(inner.in_progress),
            wait_timeout: self.wait_timeout.unwrap_or(inner.wait_timeout),
            retry_after: self.retry_after.or(inner.retry_after),
            lease_loss: self.lease_loss.unwrap_or(inner.lease_loss),
        };
        // Only the call's own: the engine's were checked when it was built.
        let asked = [
            ("ttl", self.ttl),
            ("lease", self.lease),
            ("wait_timeout", self.wait_timeout),
            ("retry_after", self.retry_after),
        ];
        for (option, d) in asked.into_iter().filter_map(|(o, d)| Some((o, d?))) {
            if let Err(reason) = check_duration(d) {
                return Err(Error::InvalidOption {
                    key: key.clone(),
                    option,
                    reason: format!("{d:?}: {reason}"),
                });
            }
        }
        Ok(call)
    }
}
