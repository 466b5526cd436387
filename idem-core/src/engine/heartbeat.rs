//! The heartbeat: extends the lease while the body runs, and notices when it is lost.

use std::future::Future;
use std::pin::{pin, Pin};
use std::sync::Mutex;
use std::task::Poll;

use tokio::time::Instant;

use super::store_op::{poll_once, StoreOps};
use super::{LeaseLoss, MIN_DURATION};
use crate::error::StoreError;
use crate::store::Token;

type Extending<'s> = Pin<Box<dyn Future<Output = Result<(), StoreError>> + Send + 's>>;

/// What the heartbeat hands back with the body's output.
pub(super) struct Beat<O> {
    /// The body's output; `None` when the lease was lost and the body dropped for it
    /// ([`LeaseLoss::Cancel`]).
    pub(super) out: Option<O>,
    /// The lease was lost while the body ran: the store fenced an extend (another caller
    /// took the key over), or a whole lease passed with no extend it confirmed.
    pub(super) lost: bool,
    /// When the lease last secured began, at the latest: the start of the last extend that
    /// succeeded, or the claim's.
    pub(super) leased_at: Instant,
}

/// When a lease last secured began, by this process's clock, as its heartbeat moves it:
/// what the body's steps read before each one runs.
pub(super) struct LeaseMark(Mutex<Instant>);

impl LeaseMark {
    pub(super) fn new(at: Instant) -> Self {
        LeaseMark(Mutex::new(at))
    }

    pub(super) fn get(&self) -> Instant {
        *self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn set(&self, at: Instant) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = at;
    }
}

/// Polls `body` to completion while extending the lease every third of its length. Each
/// extend is bounded by the store timeout: one that hangs is abandoned, and the next beat
/// tries again, so one stuck connection does not stop the heartbeat.
///
/// The lease is lost when the store fences an extend. With [`LeaseLoss::Cancel`] it is
/// also lost when a whole lease has passed since the last extend the store confirmed began
/// (an outage, or answers lost on the way back): the store may have ended it, and a
/// successor may be running, so the body is dropped. With [`LeaseLoss::Finish`] the body
/// runs on, and its result is offered to the store as before, which takes it if the lease
/// was in fact extended. An extend still in flight when the lease ends by this process's
/// clock does not keep the body running: its answer may come too late to matter.
///
/// `mark`, when given, follows the start of the lease last secured.
pub(super) async fn with_heartbeat<O>(
    call: &StoreOps<'_>,
    token: Token,
    leased_at: Instant,
    mark: Option<&LeaseMark>,
    body: impl Future<Output = O>,
) -> Beat<O> {
    let (store, key, lease) = (call.store, call.key, call.lease);
    let cancel = call.lease_loss == LeaseLoss::Cancel;
    let period = (lease / 3).max(MIN_DURATION);
    let mut body = pin!(body);
    // A body done at its first poll needs no heartbeat: no timer is made for it.
    if let Poll::Ready(out) = poll_once(body.as_mut()).await {
        return Beat {
            out: Some(out),
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
        if lost && cancel {
            tracing::warn!(target: "idem", key = %key, token = %token,
                "the body is cancelled: its lease is lost");
            return Beat {
                out: None,
                lost,
                leased_at,
            };
        }
        tokio::select! {
            biased;
            out = &mut body => return Beat { out: Some(out), lost, leased_at },
            res = async { extending.as_mut().expect("guarded by is_some").1.as_mut().await }, if extending.is_some() => {
                let (sent_at, _) = extending.take().expect("guarded by is_some");
                match res {
                    Ok(()) => {
                        leased_at = sent_at;
                        if let Some(mark) = mark {
                            mark.set(sent_at);
                        }
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
            // An extend still in flight does not keep the body past its lease: a successor
            // may take the key over the moment the lease ends, whatever the answer says.
            _ = tokio::time::sleep_until(leased_at + lease), if cancel && !lost => {
                lost = true;
                tracing::warn!(target: "idem", key = %key, token = %token,
                    "lease lost while the body runs: no extend succeeded for a whole lease");
            }
            _ = ticker.tick(), if extending.is_none() && !lost => {
                let sent_at = Instant::now();
                extending = Some((sent_at, Box::pin(call.run("extend", store.extend(key, token, lease)))));
            }
        }
    }
}
