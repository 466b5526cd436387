//! The state machine every run goes through, top to bottom: key, options, local cache,
//! claim (or replay, or wait), the body under a heartbeat, then release or check and store.
//! It answers what happened ([`Happened`]); the span's outcome, the metric's label and the
//! run method's answer are each read from that.

use std::future::Future;

use serde::{de::DeserializeOwned, Serialize};

use super::builder::check_duration;
use super::call::Options;
use super::claim::{claim_or_wait, Claimed};
use super::complete::{check_round_trip, decode, store_result, ErrorPolicy, ValueOps};
use super::context::with_fence;
use super::heartbeat::with_heartbeat;
use super::journal::{self, Ending, Journal, Started, CALL_STEP};
use super::observe::{count_call, count_held, outcome_label, InFlight, StoreClock};
use super::release::ReleaseGuard;
use super::store_op::StoreOps;
use super::{Call, InProgress, Inner, MissingKey, Origin, RequestPrint};
use bytes::Bytes;
use std::sync::Arc;
use tokio::time::Instant;

use crate::cache::LocalCache;
use crate::store::{Fence, Store, Token};

use crate::codec::{Codec, Json};
use crate::envelope::{self, Kind};
use crate::error::Error;
use crate::key::{shown, Key};
use crate::store::Fingerprint;
use tracing::Instrument;

/// What a call did, with the outcome it answers (the body's, or the one stored).
pub(super) enum Happened<T, E> {
    /// This call ran the body and stored its outcome: a value, or an error to keep.
    Ran(Result<T, E>),
    /// This call ran the body, which failed with an error not to keep: the claim was given
    /// back, so that a retry runs the body again.
    Released(E),
    /// The key was missing and the call ran the body without idempotency
    /// ([`MissingKey::Run`]).
    Unkeyed(Result<T, E>),
    /// Another call's stored outcome, read from the store.
    Replayed(Result<T, E>),
    /// Another call's stored outcome, from the engine's local cache.
    ReplayedLocal(Result<T, E>),
}

impl<T, E> Happened<T, E> {
    /// The outcome, and where it came from.
    pub(super) fn into_parts(self) -> (Result<T, E>, Origin) {
        match self {
            Happened::Ran(out) | Happened::Unkeyed(out) => (out, Origin::Ran),
            Happened::Released(e) => (Err(e), Origin::Ran),
            Happened::Replayed(out) => (out, Origin::Store),
            Happened::ReplayedLocal(out) => (out, Origin::LocalCache),
        }
    }
}

impl<C: Codec> Call<'_, C> {
    /// Runs the call inside its `idem.call` span (entered around the body too, so that the
    /// body's own spans nest under it), and records its outcome, its time in the store and,
    /// with `metrics`, its counters.
    pub(super) async fn execute<T, E, F, Fut, P>(
        self,
        body: F,
        policy: P,
        ops: ValueOps<T>,
    ) -> Result<Happened<T, E>, Error>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
        T: Serialize + DeserializeOwned,
        P: ErrorPolicy<E>,
    {
        // What names the call in its span and metrics, borrowed from the key (an `Arc`
        // clone) rather than copied: most spans are disabled, and then nothing is formatted.
        let label: Result<Key, String> = match &self.key {
            Ok(key) => Ok(key.clone()),
            Err(Error::MissingKey { scope } | Error::InvalidKey { scope, .. }) => {
                Err(scope.clone())
            }
            Err(_) => Err(String::new()),
        };
        let scope = match &label {
            Ok(key) => key.scope(),
            Err(scope) => scope.as_str(),
        };
        let span = tracing::info_span!(target: "idem", "idem.call",
            scope = %shown(scope),
            key = tracing::field::Empty,
            outcome = tracing::field::Empty,
            store_seconds = tracing::field::Empty,
        );
        if let Ok(key) = &label {
            if !span.is_disabled() {
                span.record("key", tracing::field::display(shown(key.id())));
            }
        }
        let _in_flight = InFlight::start();
        let clock = Arc::new(StoreClock::for_span(&span));
        // Without a local cache there is nothing to look up: the span is not entered for it
        // (entering and leaving a span costs a replay more than the check, also with no
        // subscriber, when `tracing`'s `log` feature is on).
        let hit = match self.idem.inner.cache {
            Some(_) => span.in_scope(|| self.local_hit(&policy, &ops)),
            None => None,
        };
        let happened = match hit {
            Some(hit) => hit,
            None => {
                let run = self.execute_in_span(body, policy, ops, &clock);
                run.instrument(span.clone()).await
            }
        };
        let outcome = outcome_label(&happened);
        if !span.is_disabled() {
            span.record("outcome", outcome);
            span.record("store_seconds", clock.total().as_secs_f64());
        }
        count_call(scope, outcome);
        happened
    }

    /// The answer of the local cache, when it has the key: checked before anything else is
    /// built, so that a hit costs a lookup and a clone of the decoded value (or, for a type
    /// that cannot be kept decoded, a decode). `None` sends the call on to the store (also
    /// when an option is invalid: the full path refuses it).
    fn local_hit<T, E, P>(
        &self,
        policy: &P,
        ops: &ValueOps<T>,
    ) -> Option<Result<Happened<T, E>, Error>>
    where
        T: DeserializeOwned,
        P: ErrorPolicy<E>,
    {
        let cache = self.idem.inner.cache.as_ref()?;
        let key = self.key.as_ref().ok()?;
        let o = &self.options;
        let options = [o.ttl, o.lease, o.wait_timeout, o.retry_after];
        if !options
            .into_iter()
            .flatten()
            .all(|d| check_duration(d).is_ok())
        {
            return None;
        }
        let hit = cache.get(key)?;
        // The same encoding as the entry's is the same payload; anything else is judged by
        // its fingerprint, hashed only now.
        let same_request = matches!(
            (self.print.encoding(), &hit.request),
            (Some(mine), Some(theirs)) if mine == &theirs[..]
        );
        if !same_request && !self.print.fingerprint().matches(&hit.fingerprint) {
            return Some(Err(Error::KeyReuse { key: key.clone() }));
        }
        tracing::debug!(target: "idem", key = %key, "replay from the local cache");
        if let (Some(shared), Some(share)) = (&hit.value, &ops.share) {
            // The envelope's header still decides (its codec and version must be the
            // call's), so that a hit answers what the store would have.
            let header = envelope::open(&self.codec, self.version, &hit.payload);
            if let (Ok((Kind::Value, _)), Some(v)) = (header, (share.clone_out)(shared)) {
                return Some(Ok(Happened::ReplayedLocal(Ok(v))));
            }
        }
        let out = decode(&self.codec, policy, self.version, key.clone(), &hit.payload);
        Some(out.map(Happened::ReplayedLocal))
    }

    /// Runs the call past the local cache: the claim, then a replay (another call's stored
    /// outcome) or a first run.
    async fn execute_in_span<T, E, F, Fut, P>(
        self,
        body: F,
        policy: P,
        ops: ValueOps<T>,
        clock: &Arc<StoreClock>,
    ) -> Result<Happened<T, E>, Error>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
        T: Serialize + DeserializeOwned,
        P: ErrorPolicy<E>,
    {
        let key = match self.key {
            Ok(key) => key,
            Err(Error::MissingKey { scope }) if self.missing_key == MissingKey::Run => {
                tracing::warn!(target: "idem", scope = %scope,
                    "no idempotency key for this call: running it without idempotency");
                return Ok(Happened::Unkeyed(journal::unkeyed(body()).await));
            }
            Err(e) => return Err(e),
        };
        let inner = &*self.idem.inner;
        let fingerprint = self.print.fingerprint();
        let call = self.options.resolve(inner, &key, fingerprint, clock)?;
        // What the local cache keeps of this payload: its encoding, when the call holds it.
        let request = match (&inner.cache, self.print) {
            (Some(_), RequestPrint::Encoded(encoding)) => Some(Bytes::from(encoding)),
            _ => None,
        };
        let results = Results {
            codec: &self.codec,
            version: self.version,
            policy,
            ops,
            cache: inner.cache.as_ref().map(|cache| (cache, request)),
        };
        let idem = self.idem;
        let mut reconciled = false;
        loop {
            match claim_or_wait(&call).await? {
                Claimed::Completed {
                    fingerprint,
                    payload,
                } => match results.decode(&key, &payload) {
                    // The key is held by a step whose outcome is unknown: the engine's
                    // reconcile hook, if it knows what happened, resolves it, and the call
                    // claims again (once).
                    Err(Error::OutcomeUnknown { step, .. }) if !reconciled => {
                        count_held(&key, &step);
                        let wait = (call.mode == InProgress::Wait).then_some(call.wait_timeout);
                        let reconcile = idem.reconcile(&key, &step, &payload, wait);
                        if !Box::pin(reconcile).await? {
                            return Err(Error::OutcomeUnknown { key, step });
                        }
                        reconciled = true;
                    }
                    out => {
                        let out = out?;
                        results.keep(&call, fingerprint, payload, &out);
                        return Ok(Happened::Replayed(out));
                    }
                },
                // Boxed, so that the future of a replay, which never gets there, stays small
                // (moving a large future costs a replay more than this allocation costs a run).
                Claimed::Ours {
                    token,
                    leased_at,
                    fence,
                } => {
                    let run = Run {
                        store: inner.store.clone(),
                        clock: clock.clone(),
                        hold_ttl: inner.hold_ttl,
                        at_most_once: self.options.at_most_once,
                        claim: (token, leased_at, fence),
                    };
                    return Box::pin(first_run(&call, results, run, body)).await;
                }
            }
        }
    }
}

/// What a call does with an outcome: its codec and result version, which errors it keeps,
/// what it knows of the value's type, and the local cache (with what it keeps of the
/// payload), if the engine has one.
struct Results<'c, C, P, T> {
    codec: &'c C,
    version: u64,
    policy: P,
    ops: ValueOps<T>,
    cache: Option<(&'c LocalCache, Option<Bytes>)>,
}

impl<C: Codec, P, T: Serialize + DeserializeOwned> Results<'_, C, P, T> {
    /// A stored outcome, decoded.
    fn decode<E>(&self, key: &Key, payload: &[u8]) -> Result<Result<T, E>, Error>
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
    fn keep<E>(
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
struct Run {
    store: Arc<dyn Store>,
    clock: Arc<StoreClock>,
    hold_ttl: std::time::Duration,
    /// The body is marked as started before it runs ([`Call::at_most_once`]).
    at_most_once: bool,
    claim: (Token, Instant, Option<Fence>),
}

/// A first run, under the claim `(token, leased_at, fence)`: the body under a heartbeat
/// (and with its fence for [`fence()`](crate::fence)), then the
/// claim given back (an error not to keep) or the outcome checked and stored. It owns
/// `results`, so that its future is `Send` whenever they are (a predicate of the errors to
/// keep need not be `Sync`).
async fn first_run<C, T, E, F, Fut, P>(
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
        match journal.mark_started().await {
            Ok(Started::Marked) => {}
            // An earlier attempt's body started and left no result: it is not run again.
            Ok(Started::Held) => {
                guard.disarm();
                let hold = (CALL_STEP.to_owned(), journal.hold_id(), true);
                return hold_key(&held, token, hold, leased_at).await;
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
                        return hold_key(&held, token, hold, leased_at).await;
                    }
                };
                let (sealed, out) = results.seal(key, Ok(value))?;
                store_result(call, token, &sealed, leased_at + call.lease).await?;
                journal.forget_steps();
                results.keep(call, call.fingerprint, sealed, &out);
                return Ok(Happened::Replayed(out));
            }
            Err(e) => {
                guard.release(call.clock).await;
                return Err(e);
            }
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
            match unrecorded {
                true => guard.disarm(),
                false => {
                    if at_most_once {
                        journal.clear_started().await;
                    }
                    guard.release(call.clock).await
                }
            }
            return Err(Error::KeyReuse { key: key.clone() });
        }
        (ending, Err(e)) if !guard.held_while(|| results.policy.cache(&e)) => {
            match ending {
                // A step may have taken effect without its record: giving the claim back
                // would let a retry run it again at once, so it ends with its lease instead
                // (and an at-most-once body's mark stays: the next attempt holds the key).
                Ending::Unrecorded => guard.disarm(),
                _ => {
                    if at_most_once {
                        journal.clear_started().await;
                    }
                    guard.release(call.clock).await
                }
            }
            return Ok(Happened::Released(e));
        }
        (_, out) => out,
    };
    // The body succeeded (or failed in a way to keep): from here on a release would invite
    // a second run of its side effect. If the outcome is not stored, the claim ends with its
    // lease instead: also when sealing it fails or panics (its `Serialize`, the codec), and
    // when this future is dropped mid-way.
    guard.disarm();
    let (sealed, out) = results.seal(key, out)?;
    if beat.lost {
        return Err(Error::LeaseLost { key: key.clone() });
    }
    store_result(call, token, &sealed, beat.leased_at + call.lease).await?;
    tracing::debug!(target: "idem", key = %key, token = %token, "completed");
    journal.forget_steps();
    results.keep(call, call.fingerprint, sealed, &out);
    Ok(Happened::Ran(out))
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

impl Options {
    /// The context of the call's store operations: these options with the engine's defaults
    /// filled in, each within what stores and clocks keep ([`Error::InvalidOption`] if not).
    fn resolve<'c>(
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
