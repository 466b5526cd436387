//! What running one step does against the store: claim its record or replay an earlier
//! attempt's, run it under the heartbeat, then store its value, or a hold when its outcome
//! is unknown; and the at-most-once variant, whose record says "started" before it runs.

use std::future::Future;
use std::time::Duration;

use bytes::Bytes;
use serde::{de::DeserializeOwned, Serialize};
use tokio::time::Instant;

use super::claim::{claim_or_wait, Claimed};
use super::complete::store_result;
use super::heartbeat::with_heartbeat;
use super::journal::{current, Journal};
use super::release::ReleaseGuard;
use super::step::Ambiguous;
use super::store_op::{store_error, store_op, StoreOps};
use crate::codec::Json;
use crate::envelope::{self, Kind};
use crate::error::Error;
use crate::key::{check_step_name, Key};
use crate::store::Token;

/// Runs `f` as the step `name` of the call whose body is running (see [`Step::run`](super::Step::run)).
pub(super) async fn run_step<T, E, F, Fut, P>(
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
    let (token, leased_at) = match claim_step(&journal, name, &call).await? {
        StepClaim::Replayed(value) => return Ok(value),
        StepClaim::Ours(token, leased_at) => (token, leased_at),
    };
    // Dropped or panicking before its record is written, the step gives its claim back,
    // as the call does: a later attempt runs it again.
    let mut guard = ReleaseGuard::new(
        journal.store.clone(),
        journal.store_timeout,
        key.clone(),
        token,
    );
    if let Err(e) = may_start(&journal, &key, leased_at).await {
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
            return record_value(&journal, &call, token, &value, lease_ends)
                .await
                .map_err(E::from);
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
    hold_step(&journal, name, &call, token, lease_ends).await;
    Err(e)
}

/// What claiming a step's record found.
enum StepClaim<T> {
    /// An earlier attempt's value of the step.
    Replayed(T),
    /// The record is this attempt's to run the step under: its token, and when it was
    /// leased.
    Ours(Token, Instant),
}

/// Claims the record of step `name` (`call` is its key's), or replays an earlier attempt's.
async fn claim_step<T: DeserializeOwned>(
    journal: &Journal,
    name: &str,
    call: &StoreOps<'_>,
) -> Result<StepClaim<T>, Error> {
    match claim_or_wait(call).await {
        Ok(Claimed::Completed { payload, .. }) => replay(journal, name, call.key, payload)
            .await
            .map(StepClaim::Replayed),
        Ok(Claimed::Ours {
            token, leased_at, ..
        }) => Ok(StepClaim::Ours(token, leased_at)),
        Err(Error::KeyReuse { .. }) => {
            // The step's record was written by an attempt with another payload.
            journal.reused();
            Err(Error::KeyReuse {
                key: journal.key.clone(),
            })
        }
        Err(e) => Err(e),
    }
}

/// Whether a step claimed at `leased_at` (its record keyed `key`) may start: the call is
/// still this attempt's, and both leases are live.
async fn may_start(journal: &Journal, key: &Key, leased_at: Instant) -> Result<(), Error> {
    journal.still_ours().await?;
    if journal.both_leases_live(leased_at) {
        return Ok(());
    }
    tracing::warn!(target: "idem", key = %key,
        "the step does not run: its claim or the call's lease ended while the store answered");
    Err(Error::LeaseLost {
        key: journal.key.clone(),
    })
}

/// Stores the value of a step that ran (its record keyed `call.key`, claimed as `token`),
/// and gives the body the value as decoded back. A value not stored leaves the step
/// unrecorded.
async fn record_value<T: Serialize + DeserializeOwned>(
    journal: &Journal,
    call: &StoreOps<'_>,
    token: Token,
    value: &T,
    lease_ends: Instant,
) -> Result<T, Error> {
    let key = call.key;
    let stored = match seal_step(key, value) {
        Ok((sealed, value)) => store_result(call, token, &sealed, lease_ends)
            .await
            .map(|()| value),
        // The step ran, and its value cannot be kept.
        Err(e) => Err(e),
    };
    match &stored {
        Ok(_) => tracing::debug!(target: "idem", key = %key, "step completed"),
        Err(_) => journal.unrecorded(),
    }
    stored
}

/// Completes the record of step `name` (keyed `call.key`, claimed as `token`) with a hold:
/// its outcome is unknown, and the call's key is to be held until it is resolved.
async fn hold_step(
    journal: &Journal,
    name: &str,
    call: &StoreOps<'_>,
    token: Token,
    lease_ends: Instant,
) {
    tracing::warn!(target: "idem", key = %journal.key, step = name,
        "the step's outcome is unknown: the key is held until it is resolved");
    let hold = Bytes::from(envelope::seal_held(name, journal.token.0, true));
    let held = StoreOps {
        ttl: journal.hold_ttl,
        ..journal.store_ops(call.key)
    };
    if store_result(&held, token, &hold, lease_ends).await.is_err() {
        journal.unrecorded();
        // The key's hold says so: a resolution as ran then writes the step's value itself.
        journal.hold_not_on_step();
    }
    journal.hold(name);
}

/// Runs `f` as an [at-most-once](super::Step::at_most_once) step, under the step's claim
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
