//! [`Call`]: one call's key, fingerprint and options, set one by one before it runs.

use std::marker::PhantomData;
use std::time::Duration;

use super::outcome::{Answer, Bare, WithOutcome};
use super::Idem;
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

/// One idempotent call: its key, fingerprint and options. Built by [`Idem::call`].
///
/// `C` is the codec of its result; `R` says what its run methods answer: the bare value
/// ([`Bare`], the default), or an [`Outcome`](crate::Outcome) that also tells a first run
/// from a replay ([`WithOutcome`], after [`with_outcome`](Call::with_outcome)).
#[must_use = "a call does nothing until `.run(...)` is awaited"]
pub struct Call<'a, C = BuiltinCodec, R = Bare> {
    pub(super) idem: &'a Idem,
    pub(super) key: Result<Key, Error>,
    pub(super) print: RequestPrint,
    pub(super) ttl: Option<Duration>,
    pub(super) lease: Option<Duration>,
    pub(super) in_progress: Option<InProgress>,
    pub(super) wait_timeout: Option<Duration>,
    pub(super) version: u64,
    pub(super) missing_key: MissingKey,
    pub(super) codec: C,
    pub(super) answer: PhantomData<fn() -> R>,
}

impl<'a, C: Codec, R: Answer> Call<'a, C, R> {
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
    pub fn codec<C2: Codec>(self, codec: C2) -> Call<'a, C2, R> {
        Call {
            idem: self.idem,
            key: self.key,
            print: self.print,
            ttl: self.ttl,
            lease: self.lease,
            in_progress: self.in_progress,
            wait_timeout: self.wait_timeout,
            version: self.version,
            missing_key: self.missing_key,
            codec,
            answer: PhantomData,
        }
    }

    /// Makes the run methods answer an [`Outcome`](crate::Outcome): the value and its
    /// [`Origin`](crate::Origin), which tells a first run ([`Origin::Ran`](crate::Origin::Ran))
    /// from a replay read from the store or from the local cache. A fallible body answers
    /// `Result<Outcome<T>, E>`; its `Err` is the body's own error or idem's (with
    /// [`run_caching_errors`](Call::run_caching_errors), a replayed error is an `Err` too,
    /// and carries no origin).
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
    pub fn with_outcome(self) -> Call<'a, C, WithOutcome> {
        Call {
            idem: self.idem,
            key: self.key,
            print: self.print,
            ttl: self.ttl,
            lease: self.lease,
            in_progress: self.in_progress,
            wait_timeout: self.wait_timeout,
            version: self.version,
            missing_key: self.missing_key,
            codec: self.codec,
            answer: PhantomData,
        }
    }
}
