//! The state machine every run goes through, top to bottom: key, options, local cache,
//! claim (or replay, or wait), the body under a heartbeat, then release or check and store.
//! It answers what happened ([`Happened`]); the span's outcome, the metric's label and the
//! run method's answer are each read from that.

use std::future::Future;

use serde::{de::DeserializeOwned, Serialize};

use super::builder::check_duration;
use super::claim::{claim_or_wait, Claimed};
use super::complete::{decode, ErrorPolicy, ValueOps};
use super::first_run::{first_run, Results, Run};
use super::journal::{self};
use super::observe::{count_call, count_held, outcome_label, InFlight, StoreClock};
use super::{Call, InProgress, MissingKey, Origin, RequestPrint};
use bytes::Bytes;
use std::sync::Arc;

use crate::codec::Codec;
use crate::envelope::{self, Kind};
use crate::error::Error;
use crate::key::{shown, Key};
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
