//! The errors of idem: [`Error`] for callers, [`StoreError`] for store backends.

use std::time::Duration;

use crate::key::Key;

/// A boxed error source, kept whole so that `Error::source()` chains reach it.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// What went wrong with an idempotent call. Every message names the key.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Another call holds the key and is still running; `in_progress = "reject"` answers so.
    #[error("idempotency key `{key}` is in progress in another call; retry after {retry_after:?}")]
    InProgress {
        /// The key.
        key: Key,
        /// How long to wait before trying again: a short hint (by default the smaller of
        /// 1 second and a tenth of the lease; `IdemBuilder::retry_after` and
        /// `Call::retry_after` choose another), never beyond what remains of the holder's
        /// lease, never zero. The first call may still run by then.
        retry_after: Duration,
    },
    /// The key was first used with a different request payload (fingerprint).
    #[error("idempotency key `{key}` was first used with a different request payload")]
    KeyReuse {
        /// The key.
        key: Key,
    },
    /// The lease ended and another caller took the key over before this call stored its result.
    #[error("the lease on idempotency key `{key}` was lost to another caller before the result was stored")]
    LeaseLost {
        /// The key.
        key: Key,
    },
    /// The stored result for the key could not be decoded into the expected type.
    #[error("the stored result for idempotency key `{key}` could not be decoded")]
    Decode {
        /// The key.
        key: Key,
        /// Why it could not be decoded.
        #[source]
        source: DecodeError,
    },
    /// The result could not be encoded by the codec; nothing was stored.
    #[error("the result for idempotency key `{key}` could not be encoded")]
    Encode {
        /// The key.
        key: Key,
        /// The codec's error.
        #[source]
        source: BoxError,
    },
    /// The store failed or could not be reached; the body did not run (fail closed).
    #[error("the idempotency store failed for key `{key}`")]
    Store {
        /// The key.
        key: Key,
        /// The store's error, with its source chain.
        #[source]
        source: StoreError,
    },
    /// The key is not valid (empty, too long, a scope with a `/`, or a key value that could
    /// not be serialized). Like the other variants it names the key: its scope and its id
    /// as given, whole; the message prints them escaped, and only a part over its length
    /// limit shortened (its head, its tail and its length).
    #[error("invalid idempotency key `{}`: {reason}", crate::key::shown_invalid(scope, id.as_deref()))]
    InvalidKey {
        /// The scope as given.
        scope: String,
        /// The id as given, or `None` when the key value could not be serialized into one.
        id: Option<String>,
        /// What is wrong with it.
        reason: String,
    },
    /// The key expression yielded no key (`None`), and the call was not told to run without
    /// idempotency then (`missing_key = "run"`).
    #[error("no idempotency key for a call of `{scope}`: its key expression yielded `None`; the body did not run (pass a key, or use `missing_key = \"run\"` to run such calls without idempotency)")]
    MissingKey {
        /// The scope of the call (the function, by default).
        scope: String,
    },
    /// An option of the call is not valid (a zero ttl or lease, for example).
    #[error("invalid option `{option}` for idempotency key `{key}`: {reason}")]
    InvalidOption {
        /// The key.
        key: Key,
        /// The option's name, as the macro spells it.
        option: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// `in_progress = "wait"` waited for `wait_timeout` and the first call had still not finished.
    #[error("gave up after {waited:?} waiting for idempotency key `{key}` held by another call")]
    WaitTimeout {
        /// The key.
        key: Key,
        /// How long this call waited.
        waited: Duration,
    },
    /// The configuration is not valid, so nothing was connected or run: a builder option out
    /// of range (a zero `ttl`), a builder without a store, a store URL that names no known
    /// scheme or one whose cargo feature is off, a malformed URL. Fix the code or the
    /// settings; retrying cannot help.
    #[error("invalid idem configuration: {message}")]
    Config {
        /// What is wrong, naming the option, the URL scheme or the cargo feature.
        message: String,
        /// The underlying error (a URL parser's), when there is one.
        #[source]
        source: Option<BoxError>,
    },
    /// A step of the key's operation failed in a way that leaves its outcome unknown (a
    /// timeout after the request was sent, say: the charge may have happened), so the key
    /// is held: its body neither runs again nor replays until the step is resolved as ran
    /// or not ran, by the engine's reconcile hook ([`IdemBuilder::reconcile`](crate::IdemBuilder::reconcile)),
    /// by [`Idem::resolve`](crate::Idem::resolve), or by the admin command (`idem resolve`).
    #[error("the outcome of step `{step}` of idempotency key `{key}` is unknown; the key is held until the step is resolved as ran or not ran (`idem resolve`)")]
    OutcomeUnknown {
        /// The key of the whole operation.
        key: Key,
        /// The step whose outcome is unknown.
        step: String,
    },
    /// A step's outcome is unknown, as for [`Error::OutcomeUnknown`], but the key could not
    /// be held for it: the store refused or failed the hold's write for as long as the
    /// claim's lease lasted. Nothing stops a retry after that lease from running the step
    /// again, so find out what the step did (under its [`step_key`](crate::step_key)) before
    /// retrying; `source` is the store's error.
    #[error("the outcome of step `{step}` of idempotency key `{key}` is unknown, and the key could not be held for it: a retry after the claim's lease may run the step again")]
    OutcomeNotHeld {
        /// The key of the whole operation.
        key: Key,
        /// The step whose outcome is unknown.
        step: String,
        /// Why the hold was not stored.
        #[source]
        source: Box<Error>,
    },
    /// A step ([`step`](crate::step)) that cannot run as written: outside the body of an
    /// idempotent call, a name that is not valid, or a name the body already used.
    #[error("step `{}` {}: {reason}", crate::key::shown(step), key.as_ref().map(|k| format!("of idempotency key `{k}`")).unwrap_or_else(|| "outside any idempotent call".into()))]
    Step {
        /// The key of the call whose body ran it; `None` outside any call.
        key: Option<Key>,
        /// The step's name, as given.
        step: String,
        /// What is wrong.
        reason: String,
    },
    /// A store could not be reached or set up while connecting (refused, timed out, a bad
    /// password, a table that could not be created).
    #[error("cannot connect an idempotency store: {message}")]
    Connect {
        /// What failed, naming the URL (its password hidden) and the step.
        message: String,
        /// The underlying error, when there is one.
        #[source]
        source: Option<BoxError>,
    },
}

impl Error {
    /// The key this error is about, when it is about one.
    pub fn key(&self) -> Option<&Key> {
        match self {
            Error::InProgress { key, .. }
            | Error::KeyReuse { key }
            | Error::LeaseLost { key }
            | Error::Decode { key, .. }
            | Error::Encode { key, .. }
            | Error::Store { key, .. }
            | Error::InvalidOption { key, .. }
            | Error::OutcomeUnknown { key, .. }
            | Error::OutcomeNotHeld { key, .. }
            | Error::WaitTimeout { key, .. } => Some(key),
            Error::Step { key, .. } => key.as_ref(),
            Error::InvalidKey { .. }
            | Error::MissingKey { .. }
            | Error::Config { .. }
            | Error::Connect { .. } => None,
        }
    }

    /// Whether calling again with the same key may succeed: true for in-progress, wait
    /// timeouts, lost leases and temporary store failures.
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::InProgress { .. } | Error::WaitTimeout { .. } | Error::LeaseLost { .. } => true,
            Error::Store { source, .. } => source.is_temporary(),
            _ => false,
        }
    }
}

/// Why a stored record could not be turned back into a result.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// The bytes are not an idem record envelope (too short, wrong magic).
    #[error("the stored value is not an idem record envelope")]
    NotAnEnvelope,
    /// The envelope was written by a newer or unknown format version.
    #[error(
        "record format version {found} is not supported (this build reads version {expected})"
    )]
    Version {
        /// The version in the record.
        found: u8,
        /// The version this build reads.
        expected: u8,
    },
    /// The record was written by another codec.
    #[error("record was written by codec {found} but this call decodes with codec {expected}")]
    Codec {
        /// The codec id in the record.
        found: u8,
        /// The codec id of this call.
        expected: u8,
    },
    /// The record was written under another result `version` than this call declares.
    #[error("the record was written for result version {found}, but this call reads version {expected}; records of another version are refused until they expire")]
    ResultVersion {
        /// The version in the record.
        found: u64,
        /// The version this call declares.
        expected: u64,
    },
    /// The record holds a cached error, but this call does not cache errors.
    #[error("record holds a cached error, but this call does not cache errors")]
    UnexpectedError,
    /// The codec failed on the payload.
    #[error("the {codec} codec could not decode the payload")]
    Payload {
        /// The codec's name.
        codec: &'static str,
        /// The codec's error.
        #[source]
        source: BoxError,
    },
    /// The store holds something under the key that is not an idem record.
    #[error("the store holds a value under this key that is not an idem record: {reason}")]
    Corrupt {
        /// What the store found.
        reason: String,
    },
}

/// A failure reported by a [`Store`](crate::Store) backend.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The fencing token is not the current one: another claim holds the key, or the record
    /// is completed, released or gone. Not a fault of the store.
    #[error("the fencing token is not current for this key")]
    Fenced,
    /// The store could not be reached (connection refused, dropped, reset). Temporary.
    #[error("the {backend} store is unavailable")]
    Unavailable {
        /// Which backend (`"redis"`, `"postgres"`, ...).
        backend: &'static str,
        /// The client's error.
        #[source]
        source: BoxError,
    },
    /// A store operation did not answer in time. Temporary.
    #[error("the {backend} store did not answer the {step} step within {after:?}")]
    Timeout {
        /// Which backend ([`Store::backend`](crate::Store::backend)).
        backend: &'static str,
        /// Which store operation: `"claim"`, `"complete"`, `"extend"`, `"release"`, `"get"`,
        /// `"delete"` or `"wait"`.
        step: &'static str,
        /// How long the operation was waited for.
        after: Duration,
    },
    /// The store answered with an error.
    #[error("the {backend} store failed")]
    Backend {
        /// Which backend.
        backend: &'static str,
        /// The client's error.
        #[source]
        source: BoxError,
    },
    /// The step was applied on the primary, but fewer replicas than the store requires
    /// acknowledged it within the store's replica timeout (Redis `WAIT`). Temporary: a claim
    /// answered this way does not run the body, a complete answered this way is tried again
    /// (a repeated complete keeps the first result and waits for the replicas again).
    #[error("the {backend} store applied the {step} step, but only {acknowledged} of the {required} replicas it requires acknowledged it within {after:?}")]
    NotReplicated {
        /// Which backend.
        backend: &'static str,
        /// Which step: `"claim"` or `"complete"`.
        step: &'static str,
        /// How many replicas acknowledged the write.
        acknowledged: u32,
        /// How many the store requires.
        required: u32,
        /// How long the store waited for them.
        after: Duration,
    },
    /// The store noticed that it lost every record written before a moment (a Redis
    /// without persistence restarted, was flushed or failed over to an empty replica), and
    /// refuses a claim that found no record: the key may have completed before the loss, and
    /// a claim now would run its body again. `retry_after` is how long the store goes on
    /// refusing such claims; `None` until the loss is acknowledged (then not temporary).
    #[error("the {backend} store lost its records (a restart without persistence, a flush or a failover to an empty replica) and refuses claims of keys it holds no record for {}", match .retry_after { Some(d) => format!("{d:?} more"), None => "until the loss is acknowledged".to_string() })]
    RecordsLost {
        /// Which backend.
        backend: &'static str,
        /// How long such claims are still refused; `None`: until acknowledged.
        retry_after: Option<Duration>,
    },
    /// The store holds a value under the key that is not an idem record.
    #[error("the {backend} store holds a value that is not an idem record: {reason}")]
    Corrupt {
        /// Which backend.
        backend: &'static str,
        /// What was found.
        reason: String,
    },
    /// The store is not set up (a missing table, for example); the message says what to do.
    #[error("the {backend} store is not set up: {message}")]
    NotSetUp {
        /// Which backend.
        backend: &'static str,
        /// What is missing and how to fix it (e.g. "call migrate()").
        message: String,
    },
}

impl StoreError {
    /// Whether trying again later may succeed.
    pub fn is_temporary(&self) -> bool {
        matches!(
            self,
            StoreError::Unavailable { .. }
                | StoreError::Timeout { .. }
                | StoreError::NotReplicated { .. }
                | StoreError::RecordsLost {
                    retry_after: Some(_),
                    ..
                }
        )
    }
}
