//! The state machine every run goes through, top to bottom: key, options, local cache,
//! claim (or replay, or wait), the body under a heartbeat, then release or check and store.

use std::future::Future;

use serde::{de::DeserializeOwned, Serialize};

use super::builder::check_duration;
use super::claim::{claim_or_wait, Claimed};
use super::complete::{check_round_trip, decode, store_result, ErrorPolicy, ValueOps};
use super::heartbeat::with_heartbeat;
use super::observe::{count_call, outcome_label, InFlight, StoreClock};
use super::release::ReleaseGuard;
use super::{Call, MissingKey, Origin, RequestPrint};
use bytes::Bytes;

use crate::codec::Codec;
use crate::envelope::{self, Kind};
use crate::error::Error;
use crate::key::{shown, Key};
use tracing::Instrument;

/// What a run ends with: the body's outcome (or the stored one) and where it came from, or
/// idem's own error.
type Executed<T, E> = Result<(Result<T, E>, Origin), Error>;

impl<C: Codec, R> Call<'_, C, R> {
    /// Runs the call inside its `idem.call` span (entered around the body too, so that the
    /// body's own spans nest under it), and records its outcome, its time in the store and,
    /// with `metrics`, its counters.
    ///
    /// `finish` turns the result into what the run method answers, inside this one future:
    /// the run methods are plain functions that return it, so that a call is not a tower of
    /// futures each holding a copy of the one below it.
    pub(super) async fn execute<T, E, F, Fut, P, O>(
        self,
        body: F,
        policy: P,
        ops: ValueOps<T>,
        finish: impl FnOnce(Result<(Result<T, E>, Origin), Error>) -> O,
    ) -> O
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
        let (mut released, mut unkeyed) = (false, false);
        let clock = StoreClock::for_span(&span);
        let res = match span.in_scope(|| self.local_hit(&policy, &ops)) {
            Some(res) => res,
            None => {
                self.execute_in_span(body, policy, ops, &clock, &mut released, &mut unkeyed)
                    .instrument(span.clone())
                    .await
            }
        };
        let outcome = outcome_label(&res, released, unkeyed);
        if !span.is_disabled() {
            span.record("outcome", outcome);
            span.record("store_seconds", clock.total().as_secs_f64());
        }
        count_call(scope, outcome);
        finish(res)
    }

    /// The answer of the local cache, when it has the key: checked before anything else is
    /// built, so that a hit costs a lookup and a clone of the decoded value (or, for a type
    /// that cannot be kept decoded, a decode). `None` sends the call on to the store (also
    /// when an option is invalid: the full path refuses it).
    fn local_hit<T, E, P>(&self, policy: &P, ops: &ValueOps<T>) -> Option<Executed<T, E>>
    where
        T: DeserializeOwned,
        P: ErrorPolicy<E>,
    {
        let cache = self.idem.inner.cache.as_ref()?;
        let key = self.key.as_ref().ok()?;
        let options = [self.ttl, self.lease, self.wait_timeout];
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
                return Some(Ok((Ok(v), Origin::LocalCache)));
            }
        }
        let out = decode(&self.codec, policy, self.version, key.clone(), &hit.payload);
        Some(out.map(|out| (out, Origin::LocalCache)))
    }

    /// Runs the call: the body's outcome (or the stored one) and where it came from, or
    /// idem's own error. Sets `released` when the body failed and its claim was given back,
    /// `unkeyed` when the body ran without a key.
    async fn execute_in_span<T, E, F, Fut, P>(
        self,
        body: F,
        policy: P,
        ops: ValueOps<T>,
        clock: &StoreClock,
        released: &mut bool,
        unkeyed: &mut bool,
    ) -> Result<(Result<T, E>, Origin), Error>
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
                *unkeyed = true;
                return Ok((body().await, Origin::Ran));
            }
            Err(e) => return Err(e),
        };
        let inner = &*self.idem.inner;
        let ttl = self.ttl.unwrap_or(inner.ttl);
        let lease = self.lease.unwrap_or(inner.lease);
        let mode = self.in_progress.unwrap_or(inner.in_progress);
        let wait_timeout = self.wait_timeout.unwrap_or(inner.wait_timeout);
        for (option, d) in [
            ("ttl", ttl),
            ("lease", lease),
            ("wait_timeout", wait_timeout),
        ] {
            if let Err(reason) = check_duration(d) {
                return Err(Error::InvalidOption {
                    key,
                    option,
                    reason: format!("{d:?}: {reason}"),
                });
            }
        }
        let (fp, version, codec) = (self.print.fingerprint(), self.version, &self.codec);
        // What the local cache keeps of this payload: its encoding, when the call holds it.
        let request = match (&inner.cache, self.print) {
            (Some(_), RequestPrint::Encoded(encoding)) => Some(Bytes::from(encoding)),
            _ => None,
        };
        let (store, step_timeout) = (&*inner.store, inner.step_timeout);

        let claimed = claim_or_wait(
            store,
            clock,
            step_timeout,
            &key,
            fp,
            lease,
            mode,
            wait_timeout,
        );
        let (token, leased_at) = match claimed.await? {
            Claimed::Ours { token, leased_at } => (token, leased_at),
            Claimed::Completed {
                fingerprint,
                payload,
            } => {
                let out = decode(codec, &policy, version, key.clone(), &payload)?;
                if let Some(cache) = &inner.cache {
                    let value = ops.keep(&out);
                    cache.insert(key, fingerprint, request, payload, value, ttl);
                }
                return Ok((out, Origin::Store));
            }
        };

        // A first run: boxed, so that the future of a replay, which never gets here, stays
        // small (moving a large future costs a replay more than this allocation costs a run).
        Box::pin(async move {
            // From here until the record is completed or released, dropping this future (or
            // a panic in the body) releases the claim in the background.
            let mut guard =
                ReleaseGuard::new(inner.store.clone(), step_timeout, key.clone(), token);
            let beat = with_heartbeat(
                store,
                clock,
                step_timeout,
                &key,
                token,
                lease,
                leased_at,
                body(),
            )
            .await;

            let sealed = match &beat.out {
                Ok(value) => envelope::seal(codec, Kind::Value, version, value),
                Err(e) if policy.cache(e) => policy.seal(codec, version, e),
                Err(_) => {
                    guard.release(clock).await;
                    *released = true;
                    return Ok((beat.out, Origin::Ran));
                }
            };
            // The body succeeded (or failed in a way to keep): from here on a release would
            // invite a second run of its side effect. If the result is not stored, the claim
            // ends with its lease instead, also when this future is dropped mid-way.
            guard.disarm();
            let (sealed, out) =
                check_round_trip(codec, &policy, version, &key, beat.out, sealed, ops.eq)?;
            if beat.lost {
                return Err(Error::LeaseLost { key });
            }
            let lease_ends = beat.leased_at + lease;
            store_result(
                store,
                clock,
                step_timeout,
                &key,
                token,
                &sealed,
                ttl,
                lease_ends,
            )
            .await?;
            tracing::debug!(target: "idem", key = %key, token = %token, "completed");
            if let Some(cache) = &inner.cache {
                let value = ops.keep(&out);
                cache.insert(key, fp, request, sealed, value, ttl);
            }
            Ok((out, Origin::Ran))
        })
        .await
    }
}
