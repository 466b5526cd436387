//! What an operator sees of each call: the `idem.call` span (scope, key id, outcome, time
//! in the store) and, with the `metrics` feature, counters, a histogram and a gauge through
//! the `metrics` facade. Labels are bounded: a scope, an outcome, a step or a store operation, a backend; never a
//! key id, which is client-chosen and unbounded.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::execute::Happened;
use crate::error::Error;
use crate::key::Key;

/// The time one call has spent in store operations so far: every one goes through
/// [`store_op`](super::store_op::store_op), which adds to the clock of its call. Atomic so that the
/// futures that hold it stay `Send`; it is never contended (one call, one clock).
pub(super) struct StoreClock {
    nanos: AtomicU64,
    /// Whether anything reads the time: the call's span (when a subscriber wants it) or
    /// the `metrics` histogram. When nothing does, an operation reads no clock for it.
    wanted: bool,
}

impl Default for StoreClock {
    /// A clock for an operation outside a call (a `forget`, a release in the background): read
    /// only for the `metrics` histogram.
    fn default() -> Self {
        StoreClock {
            nanos: AtomicU64::new(0),
            wanted: cfg!(feature = "metrics"),
        }
    }
}

impl StoreClock {
    /// A clock for a call whose span is `span`.
    pub(super) fn for_span(span: &tracing::Span) -> Self {
        StoreClock {
            nanos: AtomicU64::new(0),
            wanted: cfg!(feature = "metrics") || !span.is_disabled(),
        }
    }

    /// The start of a step, if its time is wanted.
    pub(super) fn start(&self) -> Option<tokio::time::Instant> {
        self.wanted.then(tokio::time::Instant::now)
    }

    pub(super) fn add(&self, took: Duration) {
        let nanos = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        self.nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    pub(super) fn total(&self) -> Duration {
        Duration::from_nanos(self.nanos.load(Ordering::Relaxed))
    }
}

/// The `outcome` field of the span and label of `idem_calls_total`: one of a fixed set,
/// read from what the call did.
pub(super) fn outcome_label<T, E>(happened: &Result<Happened<T, E>, Error>) -> &'static str {
    match happened {
        Ok(Happened::Ran(_)) => "claimed",
        Ok(Happened::Released(_)) => "released",
        Ok(Happened::Unkeyed(_)) => "unkeyed",
        Ok(Happened::Replayed(_)) => "replayed",
        Ok(Happened::ReplayedLocal(_)) => "replayed_local",
        Err(Error::InProgress { .. } | Error::WaitTimeout { .. }) => "in_progress",
        Err(Error::KeyReuse { .. }) => "key_reuse",
        Err(Error::LeaseLost { .. }) => "lease_lost",
        Err(Error::OutcomeUnknown { .. }) => "outcome_unknown",
        Err(Error::OutcomeNotHeld { .. }) => "outcome_not_held",
        Err(Error::Store { .. } | Error::Decode { .. }) => "store_error",
        // A call refused before it reached the store (a bad option, a missing key) or a
        // result its codec cannot carry.
        Err(_) => "error",
    }
}

/// Adds one store operation's time to the call's clock and, with `metrics`, to the histogram
/// (named `idem_store_step_seconds`, its label `step`: the names operators' dashboards know).
pub(super) fn time_store_op(
    clock: &StoreClock,
    backend: &'static str,
    op: &'static str,
    took: Duration,
) {
    clock.add(took);
    #[cfg(feature = "metrics")]
    metrics::histogram!("idem_store_step_seconds", "step" => op, "backend" => backend)
        .record(took.as_secs_f64());
    #[cfg(not(feature = "metrics"))]
    let _ = (backend, op);
}

/// A call found its key held by a step whose outcome is unknown: a warning, and with
/// `metrics` the counter `idem_held_total{scope,step}`, each time, so that an operator hears
/// of a held key from the first retry on.
pub(super) fn count_held(key: &Key, step: &str) {
    tracing::warn!(target: "idem", key = %key, step,
        "the key is held: its step's outcome is unknown until it is resolved (`idem resolve`, or the reconcile hook)");
    #[cfg(feature = "metrics")]
    metrics::counter!("idem_held_total", "scope" => key.scope().to_owned(), "step" => step.to_owned())
        .increment(1);
}

/// Counts a finished call under its scope and outcome.
pub(super) fn count_call(scope: &str, outcome: &'static str) {
    #[cfg(feature = "metrics")]
    metrics::counter!("idem_calls_total", "scope" => scope.to_owned(), "outcome" => outcome)
        .increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = (scope, outcome);
}

/// `idem_calls_in_progress` is one higher while this lives: dropped with the call's future
/// too, so a cancelled call does not leave the gauge high.
pub(super) struct InFlight(());

impl InFlight {
    pub(super) fn start() -> Self {
        #[cfg(feature = "metrics")]
        metrics::gauge!("idem_calls_in_progress").increment(1.0);
        InFlight(())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        #[cfg(feature = "metrics")]
        metrics::gauge!("idem_calls_in_progress").decrement(1.0);
    }
}
