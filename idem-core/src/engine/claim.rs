//! The claim: one atomic store operation that acquires the key, answers its stored result, or
//! says another call holds it; in wait mode, repeated until the holder finishes.

use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;

use super::store_op::{wait_op, StoreOps};
use super::{retry_hint, InProgress, MIN_DURATION};
use crate::error::Error;
use crate::store::{Claim, Fence, Fingerprint, Token};

/// Longest pause between two claims of a waiting caller on a store that does not wake waiters.
const MAX_POLL: Duration = Duration::from_millis(250);
const FIRST_POLL: Duration = Duration::from_millis(5);

/// The pauses of a waiting caller on a store that does not wake waiters: 5 ms doubling to
/// 250 ms, each one drawn within a quarter of that either way, so that duplicates that
/// began waiting together do not poll the store in lockstep.
pub(super) struct Polls {
    next: Duration,
}

impl Polls {
    pub(super) fn new() -> Self {
        Polls { next: FIRST_POLL }
    }

    /// The next pause, from `random` (any 64 bits): within 75% to 125% of its step in the
    /// doubling schedule.
    pub(super) fn next(&mut self, random: u64) -> Duration {
        let base = self.next;
        self.next = (base * 2).min(MAX_POLL);
        // `random` as a fraction of 2^64, scaled to half the base: the jitter's range.
        let half = base.as_nanos() / 2;
        let offset = (u128::from(random) * half) >> 64;
        let nanos = base.as_nanos() - half / 2 + offset;
        Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
    }
}

/// What the claim left the call with.
pub(super) enum Claimed {
    /// The key is this call's, under `token`; its lease began no earlier than `leased_at`.
    /// `fence` is the claim's, when the store assigns fences.
    Ours {
        token: Token,
        leased_at: Instant,
        fence: Option<Fence>,
    },
    /// Another call completed the key: its result, with a fingerprint that matches.
    Completed {
        fingerprint: Fingerprint,
        payload: Bytes,
    },
}

/// Claims the call's key, and in [`InProgress::Wait`] mode waits (up to its wait timeout)
/// while another call holds it. A fingerprint that does not match the holder's is
/// [`Error::KeyReuse`]. In [`InProgress::Reject`] mode the answer is [`Error::InProgress`],
/// its hint bounded by [`retry_hint`].
pub(super) async fn claim_or_wait(call: &StoreOps<'_>) -> Result<Claimed, Error> {
    let (store, key, fp, lease) = (call.store, call.key, call.fingerprint, call.lease);
    let mut polls = Polls::new();
    let mut started = None;
    // One token for the whole call: a claim the store answered but whose reply was lost
    // and that is sent again (by a retrying client) is then recognised as this call's.
    let ours = Token::random();
    loop {
        // Taken before the claim is sent, so that the lease the store grants never ends
        // before this instant plus `lease`.
        let sent_at = Instant::now();
        let started = *started.get_or_insert(sent_at);
        let claim = call
            .run("claim", store.claim(key, &fp, ours, lease))
            .await
            .map_err(|source| call.error(source))?;
        let (fingerprint, remaining) = match claim {
            Claim::Acquired {
                token,
                recovered,
                fence,
            } => return Ok(acquired(call, token, recovered, fence, sent_at)),
            Claim::Completed {
                fingerprint,
                payload,
            } => {
                if !fp.matches(&fingerprint) {
                    return Err(Error::KeyReuse { key: key.clone() });
                }
                tracing::debug!(target: "idem", key = %key, "replay");
                return Ok(Claimed::Completed {
                    fingerprint,
                    payload,
                });
            }
            Claim::InProgress {
                fingerprint,
                retry_after,
            } => (fingerprint, retry_after),
        };
        wait_for_holder(call, &mut polls, started, (fingerprint, remaining)).await?;
    }
}

/// The claim acquired the key (`recovered`: from a holder whose lease had ended), leased
/// from `sent_at`: what the run holds.
fn acquired(
    call: &StoreOps<'_>,
    token: Token,
    recovered: bool,
    fence: Fence,
    sent_at: Instant,
) -> Claimed {
    let (store, key) = (call.store, call.key);
    if recovered {
        tracing::warn!(target: "idem", key = %key, token = %token, fence = fence.get(),
            "took over a claim whose lease had ended: its holder stopped or stalled");
    } else {
        tracing::debug!(target: "idem", key = %key, token = %token, fence = fence.get(), "claimed");
    }
    // Only a store that promises increasing fences hands the body one.
    let fence = store.capabilities().assigns_fences.then_some(fence);
    Claimed::Ours {
        token,
        leased_at: sent_at,
        fence,
    }
}

/// The key is held by a call with `fingerprint` whose lease runs for `remaining`: in
/// [`InProgress::Wait`] mode, waits for a change (the call's wait timeout counted from
/// `started`); else, or once the wait is over, answers why the call cannot run.
async fn wait_for_holder(
    call: &StoreOps<'_>,
    polls: &mut Polls,
    started: Instant,
    (fingerprint, remaining): (Fingerprint, Duration),
) -> Result<(), Error> {
    let (store, key, fp, lease) = (call.store, call.key, call.fingerprint, call.lease);
    if !fp.matches(&fingerprint) {
        return Err(Error::KeyReuse { key: key.clone() });
    }
    if call.mode == InProgress::Reject {
        // The store answers the holder's remaining lease; the hint is shorter, as a
        // holder usually finishes long before its lease ends.
        return Err(Error::InProgress {
            key: key.clone(),
            retry_after: retry_hint(call.retry_after, lease, remaining),
        });
    }
    let waited = started.elapsed();
    if waited >= call.wait_timeout {
        return Err(Error::WaitTimeout {
            key: key.clone(),
            waited,
        });
    }
    let left = call.wait_timeout - waited;
    // Woken on change, the lease end is the latest useful look; else the next poll.
    let pause = if store.capabilities().wakes_waiters {
        remaining.max(MIN_DURATION).min(left)
    } else {
        let poll = polls.next(Token::random().0);
        poll.min(remaining.max(MIN_DURATION)).min(left)
    };
    tracing::trace!(target: "idem", key = %key, ?pause, "waiting for the holder");
    // The store's wait is told to return within `pause`; the store timeout on top bounds
    // one that does not.
    let limit = pause + call.store_timeout;
    wait_op(store, call.clock, limit, store.wait(key, pause))
        .await
        .map_err(|source| call.error(source))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The schedule of one waiter: its first `n` pauses.
    fn schedule(n: usize) -> Vec<Duration> {
        let mut polls = Polls::new();
        (0..n).map(|_| polls.next(Token::random().0)).collect()
    }

    #[test]
    fn waiters_poll_on_schedules_of_their_own_within_a_quarter_of_the_doubling_one() {
        let (a, b) = (schedule(10), schedule(10));
        assert_ne!(a, b, "two waiters polled in lockstep");
        let mut base = FIRST_POLL;
        for (x, y) in a.iter().zip(&b) {
            for pause in [x, y] {
                assert!(
                    *pause >= base * 3 / 4 && *pause <= base * 5 / 4,
                    "{pause:?} is not within 25% of {base:?}"
                );
            }
            base = (base * 2).min(MAX_POLL);
        }
        // Past the doubling, the pauses still differ from one poll to the next.
        assert!(a[8..]
            .iter()
            .all(|p| *p >= MAX_POLL * 3 / 4 && *p <= MAX_POLL * 5 / 4));
    }

    #[test]
    fn the_jitter_reaches_both_ends_of_its_range_and_never_beyond() {
        let mut low = Polls::new();
        let mut high = Polls::new();
        assert_eq!(low.next(0), FIRST_POLL * 3 / 4);
        let top = high.next(u64::MAX);
        assert!(top < FIRST_POLL * 5 / 4 && top > FIRST_POLL * 5 / 4 - Duration::from_micros(1));
    }
}
