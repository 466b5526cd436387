//! [`Call`]: one call's key, fingerprint and options, set one by one before it runs.

use std::time::Duration;

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

/// One idempotent call: its key, fingerprint and options. Built by [`Idem::call`].
#[must_use = "a call does nothing until `.run(...)` is awaited"]
pub struct Call<'a, C = BuiltinCodec> {
    pub(super) idem: &'a Idem,
    pub(super) key: Result<Key, Error>,
    pub(super) fingerprint: Fingerprint,
    pub(super) ttl: Option<Duration>,
    pub(super) lease: Option<Duration>,
    pub(super) in_progress: Option<InProgress>,
    pub(super) wait_timeout: Option<Duration>,
    pub(super) version: u64,
    pub(super) missing_key: MissingKey,
    pub(super) codec: C,
}

impl<'a, C: Codec> Call<'a, C> {
    /// The fingerprint of the request (default [`Fingerprint::NONE`]: no check).
    pub fn fingerprint(mut self, fingerprint: Fingerprint) -> Self {
        self.fingerprint = fingerprint;
        self
    }

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
    pub fn codec<C2: Codec>(self, codec: C2) -> Call<'a, C2> {
        Call {
            idem: self.idem,
            key: self.key,
            fingerprint: self.fingerprint,
            ttl: self.ttl,
            lease: self.lease,
            in_progress: self.in_progress,
            wait_timeout: self.wait_timeout,
            version: self.version,
            missing_key: self.missing_key,
            codec,
        }
    }
}
