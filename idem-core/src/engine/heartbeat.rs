//! The heartbeat: extends the lease while the body runs, and notices when it is lost.

use std::future::Future;
use std::pin::{pin, Pin};
use std::task::Poll;
use std::time::Duration;

use tokio::time::Instant;

use super::observe::StoreClock;
use super::step::{poll_once, step};
use super::MIN_DURATION;
use crate::error::StoreError;
use crate::key::Key;
use crate::store::{Store, Token};

type Extending<'s> = Pin<Box<dyn Future<Output = Result<(), StoreError>> + Send + 's>>;

/// What the heartbeat hands back with the body's output.
pub(super) struct Beat<O> {
    pub(super) out: O,
    /// The store fenced an extend: another caller took the key over.
    pub(super) lost: bool,
    /// When the lease last secured began, at the latest: the start of the last extend that
    /// succeeded, or the claim's.
    pub(super) leased_at: Instant,
}

/// Polls `body` to completion while extending the lease every third of its length. Each
/// extend is bounded by the step timeout: one that hangs is abandoned, and the next beat
/// tries again, so one stuck connection does not stop the heartbeat.
#[allow(clippy::too_many_arguments)]
pub(super) async fn with_heartbeat<O>(
    store: &dyn Store,
    clock: &StoreClock,
    step_timeout: Duration,
    key: &Key,
    token: Token,
    lease: Duration,
    leased_at: Instant,
    body: impl Future<Output = O>,
) -> Beat<O> {
    let period = (lease / 3).max(MIN_DURATION);
    let mut body = pin!(body);
    // A body done at its first poll needs no heartbeat: no timer is made for it.
    if let Poll::Ready(out) = poll_once(body.as_mut()).await {
        return Beat {
            out,
            lost: false,
            leased_at,
        };
    }
    let mut ticker = tokio::time::interval_at(Instant::now() + period, period);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut extending: Option<(Instant, Extending<'_>)> = None;
    let mut lost = false;
    let mut leased_at = leased_at;
    loop {
        tokio::select! {
            biased;
            out = &mut body => return Beat { out, lost, leased_at },
            res = async { extending.as_mut().expect("guarded by is_some").1.as_mut().await }, if extending.is_some() => {
                let (sent_at, _) = extending.take().expect("guarded by is_some");
                match res {
                    Ok(()) => {
                        leased_at = sent_at;
                        tracing::trace!(target: "idem", key = %key, "lease extended");
                    }
                    Err(StoreError::Fenced) => {
                        lost = true;
                        tracing::warn!(target: "idem", key = %key, token = %token,
                            "lease lost while the body runs: another caller took the key over");
                    }
                    Err(e) => tracing::warn!(target: "idem", key = %key, error = %e,
                        "could not extend the lease; trying again at the next beat"),
                }
            }
            _ = ticker.tick(), if extending.is_none() && !lost => {
                let sent_at = Instant::now();
                extending = Some((sent_at, Box::pin(step(store, clock, "extend", step_timeout, store.extend(key, token, lease)))));
            }
        }
    }
}
