//! [`RedisStoreBuilder`]: the options of a [`RedisStore`], set before it connects
//! (connecting is in `connect.rs`).

use std::sync::Arc;
use std::time::Duration;

use super::epoch::{Epoch, LostRecords, DEFAULT_REDIS_EPOCH_CHECK_INTERVAL};
use super::replicas::ReplicaWait;
use super::{Connection, RedisStore};

pub(crate) use crate::DEFAULT_CONNECT_TIMEOUT;

/// The default prefix of every record's Redis key.
pub const DEFAULT_REDIS_PREFIX: &str = "idem:";
/// The default longest wait for one Redis command's answer.
pub const DEFAULT_REDIS_COMMAND_TIMEOUT: Duration = Duration::from_secs(3);
/// The default time a Redis store remembers an ended lease, to report its takeover as a
/// recovery.
pub const DEFAULT_REDIS_RECOVERY_WINDOW: Duration = Duration::from_secs(60);

/// Options of a [`RedisStore`], then the connection it runs on.
///
/// ```no_run
/// # use std::time::Duration;
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), idem::Error> {
/// let store = idem::stores::RedisStore::builder()
///     .prefix("orders:idem:")
///     .connect_timeout(Duration::from_secs(2))
///     .command_timeout(Duration::from_millis(500))
///     .open("redis://127.0.0.1:6379/0")
///     .await?;
/// # let _ = store; Ok(()) }
/// ```
#[derive(Debug, Clone)]
#[must_use]
pub struct RedisStoreBuilder {
    pub(super) prefix: String,
    pub(super) connect_timeout: Duration,
    pub(super) command_timeout: Duration,
    pub(super) recovery_window: Duration,
    pub(super) replicas: Option<ReplicaWait>,
    pub(super) lost_records: LostRecords,
    pub(super) epoch_check_interval: Duration,
}

impl Default for RedisStoreBuilder {
    fn default() -> Self {
        RedisStoreBuilder {
            prefix: DEFAULT_REDIS_PREFIX.to_string(),
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            command_timeout: DEFAULT_REDIS_COMMAND_TIMEOUT,
            recovery_window: DEFAULT_REDIS_RECOVERY_WINDOW,
            replicas: None,
            lost_records: LostRecords::default(),
            epoch_check_interval: DEFAULT_REDIS_EPOCH_CHECK_INTERVAL,
        }
    }
}

impl RedisStoreBuilder {
    /// The prefix of every record's Redis key (default `idem:`). Stores with different
    /// prefixes never see each other's records. A hash tag in the prefix
    /// (`idem:{orders}:`) puts every record in one cluster slot.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// The longest wait for a connection (or a reconnection) to be made (default 3s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout.max(Duration::from_millis(1));
        self
    }

    /// The longest wait for one store step's answer (default 3s); past it the step fails
    /// with [`StoreError::Timeout`](idem_core::StoreError::Timeout). It bounds every step,
    /// also on a connection passed in by the user.
    pub fn command_timeout(mut self, timeout: Duration) -> Self {
        self.command_timeout = timeout.max(Duration::from_millis(1));
        self
    }

    /// How long a claim whose lease ended is remembered (default one minute), so that the
    /// claim that takes it over is told `recovered: true` (the engine logs such takeovers
    /// as warnings: a holder stopped or stalled). A record whose holder vanished then
    /// occupies memory for its lease plus this window. `Duration::ZERO` forgets it as its
    /// lease ends; takeovers then look like fresh claims.
    pub fn recovery_window(mut self, window: Duration) -> Self {
        self.recovery_window = window;
        self
    }

    /// The durability level: each claim and each complete is acknowledged by at least
    /// `replicas` replicas before the store answers it (Redis `WAIT replicas timeout`,
    /// sent behind the step's script in the same round trip, on the same connection; on a
    /// cluster, to the primary of the record's slot). Off by default; `0` turns it off.
    ///
    /// **Off**, a step counts as done once the primary applied it. Redis replicates
    /// asynchronously, so a result the primary acknowledged is lost if the primary dies
    /// before a replica has it, and after the failover a retry of the same key runs the
    /// body again (a claim can be lost likewise, and a duplicate then runs beside the first).
    ///
    /// **On**, no call reports success on a record fewer than `replicas` replicas hold:
    ///
    /// - a claim that fewer replicas acknowledged within `timeout` fails with the temporary
    ///   [`StoreError::NotReplicated`](idem_core::StoreError::NotReplicated), so the body
    ///   does not run (the engine answers `Error::Store`); the store releases that claim,
    ///   best effort (were the release lost, the claim is fenced and its lease ends);
    /// - a replay waits too, and is refused the same way while the replicas lag: the stored
    ///   result is answered only once they hold it (the claim script touches the record, a
    ///   write the `WAIT` then measures, so a replay costs a replicated write);
    /// - a complete that fewer replicas acknowledged fails with `NotReplicated` (the result
    ///   is stored on the primary and may yet reach them). The engine completes again with
    ///   the same token, which keeps the first result and waits again, within the lease; if
    ///   that never succeeds the caller gets `Error::Store`, never the result, and nothing
    ///   is released after the body's success;
    /// - a replace ([`Store::replace`](idem_core::Store::replace)) waits likewise, and fails
    ///   with `NotReplicated` when too few acknowledged, though the primary may have
    ///   replaced the record already.
    ///
    /// Each claim and complete then costs a wait for the replicas (about a round trip from
    /// the primary to its slowest required replica) and holds up its connection meanwhile:
    /// `WAIT` blocks the connection it is sent on, so steps of other calls on that connection
    /// queue behind it. With too few replicas attached every claim waits the whole `timeout`
    /// and fails; so it does for a moment after a replica (re)syncs, since the primary counts
    /// it only from its first acknowledgement (sent within a second). The wait happens within the command timeout and the engine's step
    /// timeout: keep `timeout` below both, else a late replica shows as a `Timeout`.
    ///
    /// What this does not cover: `WAIT` counts replicas that received the write, not ones
    /// that wrote it to disk (`WAITAOF`, Redis 7.2, is not used); a failover that promotes a
    /// replica that did not acknowledge (Sentinel or Cluster choose by replication offset,
    /// which favours one that did) loses the record all the same. See
    /// [`RedisStore::with_replicas`] to choose the level per call over one connection.
    pub fn wait_for_replicas(mut self, replicas: u32, timeout: Duration) -> Self {
        self.replicas = ReplicaWait::new(replicas, timeout);
        self
    }

    /// What the store does once it noticed that the server lost its records (a restart
    /// without persistence, a `FLUSHALL`, a failover to an empty replica): by default
    /// ([`LostRecords::FailClaimsFor`] one minute) claims of keys without a record fail with
    /// a temporary error for that long, then go on with a warning. See [`LostRecords`] for
    /// the choices and why, and [`RedisStore`](crate::RedisStore#lost-records) for how the
    /// loss is noticed.
    pub fn on_lost_records(mut self, policy: LostRecords) -> Self {
        self.lost_records = policy;
        self
    }

    /// How often, at most, the store reads its epoch back when nothing failed (default 10 s):
    /// the first step past the interval sends one `GET` first. A step that could not reach
    /// the server has the next step read it whatever the interval. `Duration::ZERO` reads it
    /// before every step (a round trip more each; steps that wait for the same check share it).
    /// On a standalone server a claim that would write also compares the epoch inside its
    /// script, whatever the interval; on a cluster only this check and the one after a
    /// failed step look (see [`RedisStore`](crate::RedisStore#lost-records)).
    pub fn epoch_check_interval(mut self, interval: Duration) -> Self {
        self.epoch_check_interval = interval;
        self
    }

    pub(super) fn build(self, conn: Connection, server: String) -> RedisStore {
        let epoch = Epoch::new(
            &self.prefix,
            server,
            self.lost_records,
            self.epoch_check_interval,
        );
        let store = RedisStore {
            epoch: Arc::new(epoch),
            conn,
            prefix: Arc::from(self.prefix),
            command_timeout: self.command_timeout,
            recovery_window: self.recovery_window,
            replicas: self.replicas,
        };
        store.warn_if_wait_outlasts_steps();
        store
    }
}
