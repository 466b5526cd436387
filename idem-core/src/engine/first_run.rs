//! A first run, under the claim it took: an at-most-once body marked as started, the body
//! under a heartbeat with its journal and fence, then the claim given back (an error not
//! to keep), the key held (a step's outcome unknown), or the outcome checked and stored.

use std::future::Future;
use std::sync::Arc;

use bytes::Bytes;
use serde::{de::DeserializeOwned, Serialize};
use tokio::time::Instant;

use super::complete::{check_round_trip, decode, store_result, ErrorPolicy, ValueOps};
use super::context::with_fence;
use super::execute::Happened;
use super::heartbeat::with_heartbeat;
use super::journal::{Ending, Journal, Started, CALL_STEP};
use super::observe::StoreClock;
use super::release::ReleaseGuard;
use super::store_op::StoreOps;
use crate::cache::LocalCache;
use crate::codec::{Codec, Json};
use crate::envelope::{self, Kind};
use crate::error::Error;
use crate::key::Key;
use crate::store::{Fence, Fingerprint, Store, Token};

/// What a call does with an outcome: its codec and result version, which errors it keeps,
/// what it knows of the value's type, and the local cache (with what it keeps of the
/// payload), if the engine has one.
pub(super) struct Results<'c, C, P, T> {
    pub(super) codec: &'c C,
    pub(super) version: u64,
    pub(super) policy: P,
    pub(super) ops: ValueOps<T>,
    pub(super) cache: Option<(&'c LocalCache, Option<Bytes>)>,
}

impl<C: Codec, P, T: Serialize + DeserializeOwned> Results<'_, C, P, T> {
    /// A stored outcome, decoded.
    pub(super) fn decode<E>(&self, key: &Key, payload: &[u8]) -> Result<Result<T, E>, Error>
    where
        P: ErrorPolicy<E>,
    {
        decode(self.codec, &self.policy, self.version, key.clone(), payload)
    }

    /// The body's outcome sealed, and checked to come back unchanged through the codec:
    /// the bytes to store and the outcome as decoded from them.
    fn seal<E>(&self, key: &Key, out: Result<T, E>) -> Result<(Bytes, Result<T, E>), Error>
    where
        P: ErrorPolicy<E>,
    {
        let (codec, policy, version) = (self.codec, &self.policy, self.version);
        let sealed = match &out {
            Ok(value) => envelope::seal(codec, Kind::Value, version, value),
            Err(e) => policy.seal(codec, version, e),
        };
        check_round_trip(codec, policy, version, key, out, sealed, self.ops.eq)
    }

    /// Keeps a stored outcome in the local cache, if there is one.
    pub(super) fn keep<E>(
        &self,
        call: &StoreOps<'_>,
        fingerprint: Fingerprint,
        payload: Bytes,
        out: &Result<T, E>,
    ) {
        if let Some((cache, request)) = &self.cache {
            let value = self.ops.keep(out);
            let key = call.key.clone();
            cache.insert(key, fingerprint, request.clone(), payload, value, call.ttl);
        }
    }
}

/// What a first run holds besides the call: the store, the call's clock, how long a hold
/// lives, and the claim `(token, leased_at, fence)`.
pub(super) struct Run {
    pub(super) store: Arc<dyn Store>,
    pub(super) clock: Arc<StoreClock>,
    pub(super) hold_ttl: std::time::Duration,
    /// The body is marked as started before it runs ([`Call::at_most_once`](super::Call::at_most_once)).
    pub(super) at_most_once: bool,
    pub(super) claim: (Token, Instant, Option<Fence>),
}

/// A first run, under the claim `(token, leased_at, fence)`: the body under a heartbeat
/// (and with its fence for [`fence()`](crate::fence)), then the
/// claim given back (an error not to keep) or the outcome checked and stored. It owns
/// `results`, so that its future is `Send` whenever they are (a predicate of the errors to
/// keep need not be `Sync`).
pub(super) async fn first_run<C, T, E, F, Fut, P>(
    call: &StoreOps<'_>,
    results: Results<'_, C, P, T>,
    run: Run,
    body: F,
) -> Result<Happened<T, E>, Error>
where
    C: Codec,
    F: FnOnce() -> Fut,
    Fut: Future<Output = Result<T, E>>,
    T: Serialize + DeserializeOwned,
    P: ErrorPolicy<E>,
{
    let key = call.key;
    let Run {
        store,
        clock,
        hold_ttl,
        at_most_once,
        claim: (token, leased_at, fence),
    } = run;
    // What the body's steps record, and what they left at its end.
    let journal = Journal::new(call, store.clone(), clock, (token, leased_at), hold_ttl);
    // From here until the record is completed or released, dropping this future (or a panic
    // in the body) releases the claim in the background, unless a step may have acted
    // without its record: a retry at once would run it again.
    let mut guard = ReleaseGuard::new(store, call.store_timeout, key.clone(), token);
    let in_doubt = journal.clone();
    guard.keep_when(move || in_doubt.in_doubt());
    let held = StoreOps {
        ttl: hold_ttl,
        ..*call
    };
    if at_most_once {
        let claim = (token, leased_at);
        let started = start_at_most_once(call, &results, &journal, &held, &mut guard, claim);
        if let Some(done) = started.await? {
            return Ok(done);
        }
    }
    let body = journal.scope(with_fence(fence, body()));
    let mark = Some(journal.call_lease());
    let beat = with_heartbeat(call, token, leased_at, mark, body).await;
    let Some(out) = beat.out else {
        // The lease was lost and the body dropped before its end: the key is another
        // caller's, or may be at any moment, so there is nothing of ours to give back.
        guard.disarm();
        return Err(Error::LeaseLost { key: key.clone() });
    };

    // The body has run. Only an error it returned, and that is not one to keep, gives the
    // claim back. Asking whether to keep it runs the user's predicate: a panic there keeps
    // the claim, as an error that cannot be judged may be one whose effect happened.
    let out = match (journal.ending(), out) {
        // A step's outcome is unknown: whatever the body answered, the key is held (its
        // result is not stored, its claim not given back) until the step is resolved.
        // An at-most-once body's mark stays: what it did outside its steps happened, and
        // the next attempt holds the key on `call` too rather than run it again.
        (Ending::Held(step, step_record), _) => {
            guard.disarm();
            let hold = (step, journal.hold_id(), step_record);
            return hold_key(&held, token, hold, beat.leased_at).await;
        }
        // A step's record belongs to another payload of the key: this payload is refused,
        // whatever the body answered.
        (Ending::Reused { unrecorded }, _) => {
            give_back(call, &journal, &mut guard, at_most_once, unrecorded).await;
            return Err(Error::KeyReuse { key: key.clone() });
        }
        (ending, Err(e)) if !guard.held_while(|| results.policy.cache(&e)) => {
            let unrecorded = matches!(ending, Ending::Unrecorded);
            give_back(call, &journal, &mut guard, at_most_once, unrecorded).await;
            return Ok(Happened::Released(e));
        }
        (_, out) => out,
    };
    // The body succeeded (or failed in a way to keep): from here on a release would invite
    // a second run of its side effect. If the outcome is not stored, the claim ends with its
    // lease instead: also when sealing it fails or panics (its `Serialize`, the codec), and
    // when this future is dropped mid-way.
    guard.disarm();
    let out = store_outcome(
        call,
        &results,
        &journal,
        token,
        (beat.leased_at, beat.lost),
        out,
    );
    let out = out.await?;
    tracing::debug!(target: "idem", key = %key, token = %token, "completed");
    Ok(Happened::Ran(out))
}

/// Gives the claim `guard` guards back after a body whose outcome is not stored, unless
/// one of its steps may have taken effect without its record (`unrecorded`): giving the
/// claim back would let a retry run it again at once, so it ends with its lease instead
/// (and an at-most-once body's mark stays: the next attempt holds the key).
async fn give_back(
    call: &StoreOps<'_>,
    journal: &Journal,
    guard: &mut ReleaseGuard,
    at_most_once: bool,
    unrecorded: bool,
) {
    if unrecorded {
        guard.disarm();
        return;
    }
    if at_most_once {
        journal.clear_started().await;
    }
    guard.release(call.clock).await
}

/// Marks an at-most-once body as started before it runs, under the claim `token` (leased
/// at `leased_at`) that `guard` gives back. `Some` answer when the body must not run: an earlier attempt's
/// body started and left no result (the key is held, on `held`), or a person said what it
/// returned (that is the call's result).
async fn start_at_most_once<C, T, E, P>(
    call: &StoreOps<'_>,
    results: &Results<'_, C, P, T>,
    journal: &Journal,
    held: &StoreOps<'_>,
    guard: &mut ReleaseGuard,
    (token, leased_at): (Token, Instant),
) -> Result<Option<Happened<T, E>>, Error>
where
    C: Codec,
    T: Serialize + DeserializeOwned,
    P: ErrorPolicy<E>,
{
    let key = call.key;
    match journal.mark_started().await {
        Ok(Started::Marked) => Ok(None),
        // An earlier attempt's body started and left no result: it is not run again.
        Ok(Started::Held) => {
            guard.disarm();
            let hold = (CALL_STEP.to_owned(), journal.hold_id(), true);
            hold_key(held, token, hold, leased_at).await.map(Some)
        }
        // ... and a person said what it returned: that is the call's result.
        Ok(Started::Resolved(payload)) => {
            guard.disarm();
            let value = match envelope::open_value(&Json, 0, &payload) {
                Ok(value) => value,
                // A resolution of the wrong type: held again, so that another one can
                // put it right.
                Err(error) => {
                    tracing::warn!(target: "idem", key = %key, %error,
                        "the body's resolved result does not decode into its type: the key is held until it is resolved again");
                    journal.rehold_started(&payload).await;
                    let hold = (CALL_STEP.to_owned(), journal.hold_id(), true);
                    return hold_key(held, token, hold, leased_at).await.map(Some);
                }
            };
            let out = store_outcome(call, results, journal, token, (leased_at, false), Ok(value));
            Ok(Some(Happened::Replayed(out.await?)))
        }
        Err(e) => {
            guard.release(call.clock).await;
            Err(e)
        }
    }
}

/// Seals the outcome `out`, stores it under the claim `token` (leased at `leased_at`;
/// `lost`: the lease was lost meanwhile, and nothing is stored), lets the body's step
/// records go, and keeps the outcome in the local cache: the outcome as decoded back.
async fn store_outcome<C, T, E, P>(
    call: &StoreOps<'_>,
    results: &Results<'_, C, P, T>,
    journal: &Journal,
    token: Token,
    (leased_at, lost): (Instant, bool),
    out: Result<T, E>,
) -> Result<Result<T, E>, Error>
where
    C: Codec,
    T: Serialize + DeserializeOwned,
    P: ErrorPolicy<E>,
{
    let (sealed, out) = results.seal(call.key, out)?;
    if lost {
        return Err(Error::LeaseLost {
            key: call.key.clone(),
        });
    }
    store_result(call, token, &sealed, leased_at + call.lease).await?;
    journal.forget_steps();
    results.keep(call, call.fingerprint, sealed, &out);
    Ok(out)
}

/// Holds the call's key for `step`, whose outcome is unknown: its record completed with a
/// hold (`id`, and whether the step's own record holds too) under the claim `token`, whose
/// lease began no earlier than `leased_at`. The call then answers
/// [`Error::OutcomeUnknown`], or [`Error::OutcomeNotHeld`] if the hold could not be written.
async fn hold_key<T, E>(
    held: &StoreOps<'_>,
    token: Token,
    (step, id, step_record): (String, u64, bool),
    leased_at: Instant,
) -> Result<Happened<T, E>, Error> {
    let key = held.key;
    let hold = Bytes::from(envelope::seal_held(&step, id, step_record));
    if let Err(e) = store_result(held, token, &hold, leased_at + held.lease).await {
        tracing::error!(target: "idem", key = %key, step = %step, error = %e,
            "the step's outcome is unknown and the key could not be held for it: a retry after the lease may run it again");
        return Err(Error::OutcomeNotHeld {
            key: key.clone(),
            step,
            source: Box::new(e),
        });
    }
    Err(Error::OutcomeUnknown {
        key: key.clone(),
        step,
    })
}
