//! What happens to a body's outcome: which errors are kept ([`ErrorPolicy`]), the check that
//! a result comes back unchanged through its codec, and the bounded retries of the complete
//! operation that stores it.

use std::time::Duration;

use bytes::Bytes;
use serde::{de::DeserializeOwned, Serialize};
use tokio::time::Instant;

use super::store_op::{store_error, store_op, StoreOps};
use crate::cache::SharedValue;
use crate::codec::Codec;
use crate::digest;
use crate::envelope::{self, Kind};
use crate::error::{BoxError, DecodeError, Error, StoreError};
use crate::key::Key;
use crate::store::Token;

/// The first pause between two attempts to store a result; it doubles up to
/// `MAX_COMPLETE_BACKOFF`. Attempts go on while the lease runs: past it, the result could
/// no longer be stored anyway.
const FIRST_COMPLETE_BACKOFF: Duration = Duration::from_millis(20);
const MAX_COMPLETE_BACKOFF: Duration = Duration::from_millis(500);

/// Every caller gets the result as decoded from the store, the first one included, so a
/// value that does not come back unchanged through its codec is refused now, not answered
/// with another value: decoding is not enough (JSON writes `Some(())` and `None` alike, and
/// decodes both as `None`), the decoded value must also be the same value as serde sees it.
/// Answers the sealed bytes and the decoded outcome, which is what the caller gets.
pub(super) fn check_round_trip<C: Codec, T, E, P>(
    codec: &C,
    policy: &P,
    version: u64,
    key: &Key,
    out: Result<T, E>,
    sealed: Result<Vec<u8>, BoxError>,
    eq: ValueEq<T>,
) -> Result<(Bytes, Result<T, E>), Error>
where
    T: Serialize + DeserializeOwned,
    P: ErrorPolicy<E>,
{
    let checked = sealed.and_then(|bytes| {
        let decoded = match decode::<C, T, E, P>(codec, policy, version, key.clone(), &bytes) {
            Ok(decoded) => decoded,
            Err(Error::Decode { source, .. }) => return Err(source.into()),
            Err(other) => return Err(other.into()),
        };
        if !policy.same(&out, &decoded, eq) {
            return Err(format!(
                "the {} codec does not give this value back unchanged, so every caller would get another value (JSON, for one, writes `Some(())`, `Some(None)`, NaN and infinity as `null`, and an untagged enum comes back as the first variant that fits)",
                codec.name()
            )
            .into());
        }
        Ok((Bytes::from(bytes), decoded))
    });
    checked.map_err(|source| {
        tracing::warn!(target: "idem", key = %key, error = %source,
            "the result does not survive its codec; it is not stored, and the claim ends with its lease");
        Error::Encode {
            key: key.clone(),
            source,
        }
    })
}

/// Stores the sealed result: each attempt bounded by the store timeout, temporary failures
/// tried again with short backoff until `lease_ends` (the end of the lease as this process
/// last secured it). Past that, another caller may hold the key, and the store fences a late
/// attempt anyway; the caller then sees `Error::Store` and the record stays unfinished until
/// its lease ends. The first attempt is always made, since an extend whose answer was lost
/// may have kept the lease alive.
pub(super) async fn store_result(
    call: &StoreOps<'_>,
    token: Token,
    sealed: &Bytes,
    lease_ends: Instant,
) -> Result<(), Error> {
    let (store, key, store_timeout) = (call.store, call.key, call.store_timeout);
    let mut attempt = 1u32;
    let mut backoff = FIRST_COMPLETE_BACKOFF;
    // The error of the attempt before, if it failed: the cause a later attempt cut short by
    // the lease's end would otherwise hide behind its timeout.
    let mut earlier: Option<StoreError> = None;
    loop {
        let left = lease_ends.saturating_duration_since(Instant::now());
        let limit = if attempt == 1 && left.is_zero() {
            store_timeout
        } else {
            store_timeout.min(left)
        };
        let cut = limit < store_timeout;
        let complete = store.complete(key, token, sealed.clone(), call.ttl);
        let res = store_op(store, call.clock, "complete", limit, complete).await;
        match res {
            Ok(()) => return Ok(()),
            Err(StoreError::Fenced) => {
                // Not a lost answer of an earlier attempt: a complete repeated with our
                // token is answered Ok by the store. Another claim holds the key.
                tracing::warn!(target: "idem", key = %key, token = %token,
                    "lease lost before the result was stored");
                return Err(Error::LeaseLost { key: key.clone() });
            }
            Err(e) if e.is_temporary() => {
                let e = match (e, earlier.take()) {
                    (StoreError::Timeout { .. }, Some(cause)) if cut => cause,
                    (e, _) => e,
                };
                let left = lease_ends.saturating_duration_since(Instant::now());
                if left <= backoff {
                    // No time for another attempt within the lease. Releasing would invite
                    // a second run at once; the lease ends on its own instead.
                    tracing::warn!(target: "idem", key = %key, token = %token, attempt, error = %e,
                        "the result could not be stored within the lease; the claim ends with its lease");
                    return Err(store_error(key, e));
                }
                tracing::warn!(target: "idem", key = %key, attempt, error = %e,
                    "storing the result failed; retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_COMPLETE_BACKOFF);
                attempt += 1;
                earlier = Some(e);
            }
            Err(source) => {
                // The body ran but its result is not stored. Releasing would invite a
                // second run at once; the lease ends on its own instead.
                return Err(store_error(key, source));
            }
        }
    }
}

pub(super) fn decode<C: Codec, T: DeserializeOwned, E, P: ErrorPolicy<E>>(
    codec: &C,
    policy: &P,
    version: u64,
    key: Key,
    bytes: &[u8],
) -> Result<Result<T, E>, Error> {
    let res = envelope::open(codec, version, bytes).and_then(|(kind, payload)| match kind {
        Kind::Value => envelope::decode_payload(codec, payload).map(|v| Some(Ok(v))),
        Kind::Error => policy.decode(codec, payload).map(|e| Some(Err(e))),
        Kind::Held => Ok(None),
    });
    match res {
        Ok(Some(out)) => Ok(out),
        // The key is held: one of its steps has an unknown outcome.
        Ok(None) => Err(Error::OutcomeUnknown {
            key,
            step: envelope::held_step(bytes).unwrap_or_default(),
        }),
        Err(source) => Err(Error::Decode { key, source }),
    }
}

/// The `==` of a result type, when the caller knows it has one (`#[idempotent]` finds out
/// at compile time); the engine alone only sees `Serialize`.
pub type ValueEq<T> = Option<fn(&T, &T) -> bool>;

/// What the caller knows of a result type beyond serde: its `==`, and
/// whether the local cache may keep it decoded and clone it out (`clone_cached`, for a
/// `Clone + Send + Sync + 'static` type). The engine API alone knows neither.
pub struct ValueOps<T> {
    pub(crate) eq: ValueEq<T>,
    pub(crate) share: Option<Share<T>>,
}

impl<T> ValueOps<T> {
    /// Nothing known beyond serde.
    pub(crate) const NONE: ValueOps<T> = ValueOps {
        eq: None,
        share: None,
    };

    /// From the `==` and the sharing functions of the type, when it has them.
    pub fn new(eq: ValueEq<T>, share: Option<Share<T>>) -> Self {
        ValueOps { eq, share }
    }

    /// The decoded value to keep in the local cache beside the record, if the type allows
    /// it and the outcome is a value.
    pub(crate) fn keep<E>(&self, out: &Result<T, E>) -> Option<SharedValue> {
        match (out, &self.share) {
            (Ok(v), Some(share)) => Some((share.keep)(v)),
            _ => None,
        }
    }
}

/// How a result is kept decoded in the local cache: put behind an `Arc` once, when it is
/// stored or first read from the store, then cloned out of it on each hit, instead of
/// decoding the cached bytes every time. Only a value that has come back unchanged through
/// its codec gets there (a first run's value after the round-trip check, or the value the
/// store's bytes decoded to), so a clone is what decoding would have answered.
pub struct Share<T> {
    pub(crate) keep: fn(&T) -> SharedValue,
    pub(crate) clone_out: fn(&SharedValue) -> Option<T>,
}

impl<T: Clone + Send + Sync + 'static> Share<T> {
    /// The sharing functions of `T`.
    pub fn of() -> Self {
        Share {
            keep: |v| std::sync::Arc::new(v.clone()),
            clone_out: |shared| shared.downcast_ref::<T>().cloned(),
        }
    }
}

/// Whether a value and its copy decoded from the store are the same: as serde sees them
/// (their canonical encodings match), and by `==` when there is one. serde alone cannot
/// see every difference: an untagged enum serializes its variants' contents only, so
/// `Units(5)` and `Cents(5)` look alike to it. A value that is not equal to itself (one
/// holding a NaN) is judged by serde's view alone.
fn same_value<T: Serialize + ?Sized>(a: &T, b: &T, eq: Option<fn(&T, &T) -> bool>) -> bool {
    digest::same_canonical(a, b)
        && match eq {
            Some(eq) => eq(a, b) || !eq(a, a),
            None => true,
        }
}

/// Whether and how errors of a body are stored.
pub(super) trait ErrorPolicy<E> {
    fn cache(&self, e: &E) -> bool;
    fn seal<C: Codec>(&self, codec: &C, version: u64, e: &E) -> Result<Vec<u8>, BoxError>;
    fn decode<C: Codec>(&self, codec: &C, payload: &[u8]) -> Result<E, DecodeError>;
    /// Whether a stored error is the same value as the one the body returned.
    fn same_error(&self, a: &E, b: &E) -> bool;

    /// Whether a body's outcome and its decoded copy are the same.
    fn same<T: Serialize>(&self, a: &Result<T, E>, b: &Result<T, E>, eq: ValueEq<T>) -> bool {
        match (a, b) {
            (Ok(a), Ok(b)) => same_value(a, b, eq),
            (Err(a), Err(b)) => self.same_error(a, b),
            _ => false,
        }
    }
}

pub(super) struct NoCache;

impl<E> ErrorPolicy<E> for NoCache {
    fn cache(&self, _: &E) -> bool {
        false
    }
    fn seal<C: Codec>(&self, _: &C, _: u64, _: &E) -> Result<Vec<u8>, BoxError> {
        Err("this call does not cache errors".into())
    }
    fn decode<C: Codec>(&self, _: &C, _: &[u8]) -> Result<E, DecodeError> {
        Err(DecodeError::UnexpectedError)
    }
    fn same_error(&self, _: &E, _: &E) -> bool {
        false
    }
}

pub(super) struct CacheIf<P, E>(pub(super) P, pub(super) ValueEq<E>);

impl<E: Serialize + DeserializeOwned, P: Fn(&E) -> bool> ErrorPolicy<E> for CacheIf<P, E> {
    fn cache(&self, e: &E) -> bool {
        (self.0)(e)
    }
    fn seal<C: Codec>(&self, codec: &C, version: u64, e: &E) -> Result<Vec<u8>, BoxError> {
        envelope::seal(codec, Kind::Error, version, e)
    }
    fn decode<C: Codec>(&self, codec: &C, payload: &[u8]) -> Result<E, DecodeError> {
        envelope::decode_payload(codec, payload)
    }
    fn same_error(&self, a: &E, b: &E) -> bool {
        same_value(a, b, self.1)
    }
}
