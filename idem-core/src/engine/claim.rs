//! The claim: one atomic store step that acquires the key, answers its stored result, or
//! says another call holds it; in wait mode, repeated until the holder finishes.

use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;

use super::observe::StoreClock;
use super::step::{step, store_error, wait_step};
use super::{InProgress, MIN_DURATION};
use crate::error::Error;
use crate::key::Key;
use crate::store::{Claim, Fingerprint, Store, Token};

/// Longest pause between two claims of a waiting caller on a store that does not wake waiters.
const MAX_POLL: Duration = Duration::from_millis(250);
const FIRST_POLL: Duration = Duration::from_millis(5);

/// What the claim left the call with.
pub(super) enum Claimed {
    /// The key is this call's, under `token`; its lease began no earlier than `leased_at`.
    Ours { token: Token, leased_at: Instant },
    /// Another call completed the key: its result, with a fingerprint that matches.
    Completed {
        fingerprint: Fingerprint,
        payload: Bytes,
    },
}

/// Claims `key`, and in [`InProgress::Wait`] mode waits (up to `wait_timeout`) while another
/// call holds it. A fingerprint that does not match the holder's is [`Error::KeyReuse`].
#[allow(clippy::too_many_arguments)]
pub(super) async fn claim_or_wait(
    store: &dyn Store,
    clock: &StoreClock,
    step_timeout: Duration,
    key: &Key,
    fp: Fingerprint,
    lease: Duration,
    mode: InProgress,
    wait_timeout: Duration,
) -> Result<Claimed, Error> {
    let mut poll = FIRST_POLL;
    let mut started = None;
    // One token for the whole call: a claim the store answered but whose reply was lost
    // and that is sent again (by a retrying client) is then recognised as this call's.
    let ours = Token::random();
    loop {
        // Taken before the claim is sent, so that the lease the store grants never ends
        // before this instant plus `lease`.
        let sent_at = Instant::now();
        let started = *started.get_or_insert(sent_at);
        let claim = step(
            store,
            clock,
            "claim",
            step_timeout,
            store.claim(key, &fp, ours, lease),
        )
        .await
        .map_err(|source| store_error(key, source))?;
        match claim {
            Claim::Acquired { token, recovered } => {
                if recovered {
                    tracing::warn!(target: "idem", key = %key, token = %token,
                        "took over a claim whose lease had ended: its holder stopped or stalled");
                } else {
                    tracing::debug!(target: "idem", key = %key, token = %token, "claimed");
                }
                return Ok(Claimed::Ours {
                    token,
                    leased_at: sent_at,
                });
            }
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
            } => {
                if !fp.matches(&fingerprint) {
                    return Err(Error::KeyReuse { key: key.clone() });
                }
                if mode == InProgress::Reject {
                    return Err(Error::InProgress {
                        key: key.clone(),
                        retry_after,
                    });
                }
                let waited = started.elapsed();
                if waited >= wait_timeout {
                    return Err(Error::WaitTimeout {
                        key: key.clone(),
                        waited,
                    });
                }
                let left = wait_timeout - waited;
                let pause = if store.capabilities().wakes_waiters {
                    // Woken on change; the lease end is the latest useful look.
                    retry_after.max(MIN_DURATION).min(left)
                } else {
                    poll.min(retry_after.max(MIN_DURATION)).min(left)
                };
                poll = (poll * 2).min(MAX_POLL);
                tracing::trace!(target: "idem", key = %key, ?pause, "waiting for the holder");
                // The store's wait is told to return within `pause`; the step timeout
                // on top bounds one that does not.
                wait_step(store, clock, pause + step_timeout, store.wait(key, pause))
                    .await
                    .map_err(|source| store_error(key, source))?;
            }
        }
    }
}
