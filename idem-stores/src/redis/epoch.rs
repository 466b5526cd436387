//! Noticing a Redis that lost its records: the epoch record.
//!
//! A Redis without persistence that restarts, a `FLUSHALL`, or a failover to a replica that
//! did not hold the data all end the same way: no record is left, and every key completed
//! before runs its body again on its next call, silently. To notice, the store keeps one
//! more key under its prefix, the *epoch*: `<prefix>epoch`, a random 128-bit value (32 hex
//! digits) written with `SET NX` and no expiry when the store connects. A record's key is
//! the prefix followed by `scope/id`, and a scope is never empty, so the part after the
//! prefix of every record key holds a `/`; `epoch` holds none, so the epoch key is never a
//! record's.
//!
//! On a standalone server the claim script compares the epoch key with the epoch the store
//! knows before it writes a claim, and answers without writing when it is missing or
//! another (`RedisStore::notice_epoch_change` then reads it here). The store also reads the
//! epoch again (one `GET`, before the step that finds it due) after a step failed because
//! the server could not be reached or did not answer in time (it may have restarted), and
//! otherwise when the last check is older than the check interval: a lazily read clock, no
//! background task. A missing or different epoch is a loss: an `error` event (target
//! `idem`), a new epoch written, and what [`LostRecords`] says for the claims that follow.

use std::hash::{BuildHasher, Hasher};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_core::StoreError;
use redis::Value;
use tokio::time::Instant;

use super::RedisStore;

/// How often (at most) a Redis store reads its epoch back when nothing went wrong.
pub const DEFAULT_REDIS_EPOCH_CHECK_INTERVAL: Duration = Duration::from_secs(10);
/// How long a Redis store that noticed its records lost refuses claims of keys it holds no
/// record for, by default (at least each claim's own lease).
pub const DEFAULT_REDIS_LOST_RECORDS_GRACE: Duration = Duration::from_secs(60);

/// What a [`RedisStore`] does once it noticed that the server lost its records (it
/// restarted without persistence, was flushed, or failed over to an empty replica): every
/// key completed before would run its body again on its next call.
///
/// In every case the store logs the loss at `error` level (target `idem`), naming the
/// server (without its password) and the prefix, and writes a new epoch. What differs is
/// what it answers to a claim that finds no record (a fresh key, or one whose record was
/// lost); claims that find a record (written since) are answered as always.
///
/// - [`FailClaimsFor`](LostRecords::FailClaimsFor) (the default, for
///   [`DEFAULT_REDIS_LOST_RECORDS_GRACE`], one minute): such claims fail with the temporary
///   [`StoreError::RecordsLost`] for that long after the loss was noticed, and at least the
///   claim's own lease, then go on with a warning. The body does not run meanwhile
///   (`Error::Store`). Calls that were running when the server lost their claims finish
///   within their lease instead of running a second time beside a retry, the burst of
///   retries that follows a restart backs off, and the error rate says loudly what
///   happened, while the service is not down for longer than the window. After it, a retry
///   of a key completed before the loss runs its body again: nothing can tell it apart.
/// - [`FailClaimsUntilAcknowledged`](LostRecords::FailClaimsUntilAcknowledged): such claims
///   fail with [`StoreError::RecordsLost`] (not temporary) until the loss is acknowledged,
///   for operations whose repeats cost more than an outage: an operator restores the
///   records or decides the risk is accepted. Every fresh key is refused meanwhile: the
///   service is down for new work until someone acts. [`RedisStore::acknowledge_lost_records`]
///   acknowledges for every store under the prefix, in every process: it writes the current
///   epoch under `<prefix>epoch-acknowledged`, which refused claims read (one `GET` each,
///   only while they are refused). The `idem` command does the same
///   (`idem acknowledge-lost-records <url> --prefix <prefix>`), and so does a shell:
///   `redis-cli SET idem:epoch-acknowledged "$(redis-cli GET idem:epoch)"` (with your
///   prefix). A later loss changes the epoch, and claims are refused again.
/// - [`Warn`](LostRecords::Warn): the error event only; claims go on at once.
///
/// Why the window is the default: warning alone lets the calls whose claims vanished run a
/// second time beside their retries, the moment the server is back; refusing until someone
/// acts takes every new key of the service down for as long as nobody does, for a loss the
/// store cannot undo anyway. A window of about a lease stops the concurrent duplicates and
/// makes the loss impossible to miss, and then the service runs again on its own. The window
/// is in this process's time and starts when this store noticed the loss: stores in other
/// processes notice it on their own (the epoch they find is another) and keep their own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum LostRecords {
    /// Fail claims that find no record for this long (and at least their lease) after the
    /// loss was noticed, then go on.
    FailClaimsFor(Duration),
    /// Fail claims that find no record until the loss is acknowledged
    /// ([`RedisStore::acknowledge_lost_records`], for every store under the prefix).
    FailClaimsUntilAcknowledged,
    /// Log the loss and go on.
    Warn,
}

impl Default for LostRecords {
    fn default() -> Self {
        LostRecords::FailClaimsFor(DEFAULT_REDIS_LOST_RECORDS_GRACE)
    }
}

/// The epoch a store knows, and what it noticed; shared by clones of the store.
pub(super) struct Epoch {
    /// `<prefix>epoch`.
    pub(super) key: String,
    /// `<prefix>epoch-acknowledged`: the epoch whose loss was acknowledged, for every store
    /// under the prefix (no record key either: no `/` after the prefix).
    pub(super) ack_key: String,
    /// The server(s), as messages show them (no password).
    pub(super) server: String,
    policy: LostRecords,
    interval: Duration,
    state: Mutex<State>,
    /// Held while one step reads the epoch, so that steps due at once wait for its answer
    /// instead of each sending a `GET`.
    checking: tokio::sync::Mutex<()>,
}

#[derive(Default)]
struct State {
    /// The epoch found or written last; `None` before the server first answered. Shared,
    /// so that every claim can take it along without a copy.
    value: Option<Arc<str>>,
    checked_at: Option<Instant>,
    /// A step failed as unreachable since the last check: read the epoch before the next.
    suspect: bool,
    /// When the last loss was noticed.
    lost_at: Option<Instant>,
    acknowledged: bool,
    /// The end of the refusal window was logged.
    told_resumed: bool,
    losses: u64,
}

impl std::fmt::Debug for Epoch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Epoch")
            .field("key", &self.key)
            .field("policy", &self.policy)
            .field("interval", &self.interval)
            .finish()
    }
}

impl Epoch {
    pub(super) fn new(
        prefix: &str,
        server: String,
        policy: LostRecords,
        interval: Duration,
    ) -> Epoch {
        Epoch {
            key: format!("{prefix}epoch"),
            ack_key: format!("{prefix}epoch-acknowledged"),
            server,
            policy,
            interval,
            state: Mutex::default(),
            checking: tokio::sync::Mutex::new(()),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn due(&self) -> bool {
        let st = self.state();
        st.suspect || st.checked_at.is_none_or(|t| t.elapsed() >= self.interval)
    }

    /// A step could not reach the server, or had no answer in time: it may have restarted.
    pub(super) fn suspect(&self) {
        self.state().suspect = true;
    }

    pub(super) fn losses(&self) -> u64 {
        self.state().losses
    }

    /// The epoch the store knows now.
    pub(super) fn current(&self) -> Option<Arc<str>> {
        self.state().value.clone()
    }

    pub(super) fn acknowledge(&self) {
        let mut st = self.state();
        if st.lost_at.is_some() && !st.acknowledged {
            tracing::warn!(target: "idem", server = %self.server, epoch_key = %self.key,
                "the loss of the Redis records was acknowledged: claims of keys without a record run again");
        }
        st.acknowledged = true;
    }

    /// The error for a claim that found no record, while the loss's policy refuses them.
    pub(super) fn refusal(&self, backend: &'static str, lease: Duration) -> Option<StoreError> {
        let mut st = self.state();
        let lost_at = st.lost_at?;
        if st.acknowledged {
            return None;
        }
        match self.policy {
            LostRecords::Warn => None,
            LostRecords::FailClaimsUntilAcknowledged => Some(StoreError::RecordsLost {
                backend,
                retry_after: None,
            }),
            LostRecords::FailClaimsFor(grace) => {
                let window = grace.max(lease);
                let elapsed = lost_at.elapsed();
                if elapsed < window {
                    return Some(StoreError::RecordsLost {
                        backend,
                        retry_after: Some(window - elapsed),
                    });
                }
                if !st.told_resumed {
                    st.told_resumed = true;
                    tracing::warn!(target: "idem", server = %self.server, epoch_key = %self.key, window = ?window,
                        "claims of keys without a Redis record go on after the loss of the records: a retry of a key completed before the loss runs its body again");
                }
                None
            }
        }
    }

    fn lost(&self, st: &mut State, expected: &str, found: Option<&str>) {
        st.lost_at = Some(Instant::now());
        st.acknowledged = false;
        st.told_resumed = false;
        st.losses += 1;
        let then = match self.policy {
            LostRecords::FailClaimsFor(grace) => format!(
                "claims of keys without a record fail for {grace:?} (at least their lease), then go on"
            ),
            LostRecords::FailClaimsUntilAcknowledged => {
                "claims of keys without a record fail until RedisStore::acknowledge_lost_records is called".into()
            }
            LostRecords::Warn => "claims go on".into(),
        };
        tracing::error!(
            target: "idem",
            server = %self.server,
            epoch_key = %self.key,
            expected_epoch = expected,
            found_epoch = found.unwrap_or("none"),
            "the Redis server lost idem's records: its epoch is {} (it restarted without persistence, was flushed, \
             or failed over to a replica without them). Records written before are gone: a retry of a key completed \
             before runs its body again. {then}",
            if found.is_some() { "another one" } else { "missing" },
        );
    }
}

/// A fresh epoch: 128 bits from std's OS-seeded hasher keys, the pid and the time, as 32 hex
/// digits. It only has to differ from every other epoch written under the prefix.
fn new_epoch() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let mut out = String::with_capacity(32);
    for half in 0..2u8 {
        let mut h = std::hash::RandomState::new().build_hasher();
        h.write_u8(half);
        h.write_u32(std::process::id());
        h.write_u128(nanos);
        out.push_str(&format!("{:016x}", h.finish()));
    }
    out
}

/// A `GET`'s answer as text; bytes that are not UTF-8 (written by something else) are read
/// lossily, so that they compare as another epoch rather than fail every check.
fn as_text(value: Value) -> Result<Option<String>, redis::RedisError> {
    let bytes: Option<Vec<u8>> = redis::from_redis_value(value)?;
    Ok(bytes.map(|b| String::from_utf8_lossy(&b).into_owned()))
}

impl RedisStore {
    /// The refusal of a claim that found no record, unless the loss was acknowledged, here
    /// or (the epoch named under `<prefix>epoch-acknowledged`) by any store under the prefix.
    /// The shared acknowledgement costs a `GET` per refused claim, within `left`.
    pub(super) async fn refusal(&self, lease: Duration, left: Duration) -> Option<StoreError> {
        let refused = self.epoch.refusal(self.conn.backend(), lease)?;
        let acknowledged = async {
            let cmd = redis::cmd("GET").arg(&self.epoch.ack_key).clone();
            let found = as_text(self.conn.query(&cmd).await?)?;
            Ok::<_, redis::RedisError>(
                found.is_some() && found.as_deref() == self.epoch.current().as_deref(),
            )
        };
        match tokio::time::timeout(left, acknowledged).await {
            Ok(Ok(true)) => {
                self.epoch.acknowledge();
                None
            }
            _ => Some(refused),
        }
    }

    /// Writes the acknowledgement of the current epoch for every store under the prefix,
    /// then takes it here.
    pub(super) async fn acknowledge_epoch(&self) -> Result<(), StoreError> {
        if let Some(current) = self.epoch.current() {
            let cmd = redis::cmd("SET")
                .arg(&self.epoch.ack_key)
                .arg(&*current)
                .clone();
            let backend = self.conn.backend();
            match tokio::time::timeout(self.command_timeout, self.conn.query(&cmd)).await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => {
                    return Err(super::store_error(
                        backend,
                        "acknowledge",
                        e,
                        self.command_timeout,
                    ))
                }
                Err(_) => {
                    return Err(StoreError::Timeout {
                        backend,
                        step: "acknowledge",
                        after: self.command_timeout,
                    })
                }
            }
        }
        self.epoch.acknowledge();
        Ok(())
    }

    /// Reads the epoch back when it is due (after an unreachable step, or past the check
    /// interval), and acts on a loss. Never fails a step: a server that does not answer
    /// leaves the check due.
    pub(super) async fn check_epoch(&self) {
        if !self.epoch.due() {
            return;
        }
        let before = self.epoch.state().checked_at;
        let _one = self.epoch.checking.lock().await;
        // A check that ended while this step waited for it answers for this step too.
        let after = self.epoch.state().checked_at;
        if !self.epoch.due() || (after != before && !self.epoch.state().suspect) {
            return;
        }
        if let Err(e) = self.read_epoch().await {
            let unreachable = e.is_io_error()
                || e.is_connection_dropped()
                || e.is_connection_refusal()
                || e.is_timeout();
            if unreachable {
                tracing::debug!(target: "idem", error = %e, "could not read the Redis epoch; it is read again before the next step");
            } else {
                // The server answered, with an error (an ACL without the epoch key, another
                // type under it): asking before every step would not change that, and would
                // queue the steps behind it. Again after the interval.
                tracing::warn!(target: "idem", server = %self.epoch.server, epoch_key = %self.epoch.key, error = %e,
                    "the Redis server refused the epoch's GET or SET; a loss of the records is not noticed meanwhile");
                let mut st = self.epoch.state();
                st.checked_at = Some(Instant::now());
                st.suspect = false;
            }
        }
    }

    /// A claim script found the epoch key missing or another than `sent`, the epoch it was
    /// given: reads the epoch as the check does, so that the loss is noticed (logged, a new
    /// epoch written, the policy's refusals begun) once however many claims saw it. A
    /// check that ran since the claim left another epoch known, and has noticed it already.
    pub(super) async fn notice_epoch_change(&self, sent: Option<&str>) -> Result<(), StoreError> {
        let _one = self.epoch.checking.lock().await;
        if self.epoch.current().as_deref() != sent {
            return Ok(());
        }
        self.read_epoch().await.map_err(|e| {
            self.failed(super::store_error(
                self.conn.backend(),
                "claim",
                e,
                self.command_timeout,
            ))
        })
    }

    /// One `GET` of the epoch (and on a first connect or a loss, a `SET NX` and maybe one
    /// more `GET`).
    pub(super) async fn read_epoch(&self) -> Result<(), redis::RedisError> {
        let epoch = &self.epoch;
        let found = as_text(self.conn.query(redis::cmd("GET").arg(&epoch.key)).await?)?;
        let known = epoch.state().value.clone();
        let value = match (known, found) {
            (Some(known), Some(found)) if *known == *found => found,
            (None, Some(found)) => found,
            (Some(known), Some(found)) => {
                // Another store under this prefix noticed the loss first and wrote this one.
                epoch.lost(&mut epoch.state(), &known, Some(&found));
                found
            }
            (known, None) => {
                let fresh = new_epoch();
                let set = self
                    .conn
                    .query(redis::cmd("SET").arg(&epoch.key).arg(&fresh).arg("NX"))
                    .await?;
                let value = if set == Value::Nil {
                    // Another store wrote one first: that is the epoch now.
                    as_text(self.conn.query(redis::cmd("GET").arg(&epoch.key)).await?)?
                        .unwrap_or(fresh)
                } else {
                    fresh
                };
                if let Some(known) = known {
                    epoch.lost(&mut epoch.state(), &known, None);
                }
                value
            }
        };
        let mut st = epoch.state();
        st.value = Some(value.into());
        st.checked_at = Some(Instant::now());
        st.suspect = false;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn epochs_differ_and_are_128_bits_of_hex() {
        let (a, b) = (new_epoch(), new_epoch());
        assert_ne!(a, b);
        assert_eq!(a.len(), 32);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit()));
    }

    #[test]
    fn refusals_follow_the_policy() {
        let lease = Duration::from_secs(1);
        let until = Epoch::new(
            "p:",
            "s".into(),
            LostRecords::FailClaimsUntilAcknowledged,
            Duration::from_secs(10),
        );
        assert_eq!(until.key, "p:epoch");
        assert!(until.refusal("redis", lease).is_none(), "nothing lost yet");
        until.lost(&mut until.state(), "a", None);
        let err = until.refusal("redis", lease).unwrap();
        assert!(!err.is_temporary(), "{err}");
        until.acknowledge();
        assert!(until.refusal("redis", lease).is_none());

        let grace = Epoch::new(
            "p:",
            "s".into(),
            LostRecords::FailClaimsFor(Duration::ZERO),
            Duration::from_secs(10),
        );
        grace.lost(&mut grace.state(), "a", Some("b"));
        let err = grace.refusal("redis", Duration::from_secs(60)).unwrap();
        assert!(err.is_temporary(), "{err}");
        assert!(
            matches!(err, StoreError::RecordsLost { retry_after: Some(d), .. } if d > Duration::from_secs(50))
        );
        assert!(
            grace.refusal("redis", Duration::ZERO).is_none(),
            "a zero window with a zero lease refuses nothing"
        );

        let warn = Epoch::new("p:", "s".into(), LostRecords::Warn, Duration::from_secs(10));
        warn.lost(&mut warn.state(), "a", None);
        assert!(warn.refusal("redis", lease).is_none());
        assert_eq!(warn.losses(), 1);
    }
}
