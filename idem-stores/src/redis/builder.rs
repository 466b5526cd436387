//! [`RedisStoreBuilder`]: the options of a [`RedisStore`], set before it connects
//! (connecting is in `connect.rs`).

use std::sync::Arc;
use std::time::Duration;

use super::{Connection, RedisStore};

/// The default prefix of every record's Redis key.
pub const DEFAULT_PREFIX: &str = "idem:";
/// The default longest wait for a connection to be made.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// The default longest wait for one command's answer.
pub const DEFAULT_COMMAND_TIMEOUT: Duration = Duration::from_secs(3);
/// The default time an ended lease is remembered, to report its takeover as a recovery.
pub const DEFAULT_RECOVERY_WINDOW: Duration = Duration::from_secs(60);

/// Options of a [`RedisStore`], then the connection it runs on.
///
/// ```no_run
/// # use std::time::Duration;
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), idem_core::Error> {
/// let store = idem_stores::redis::RedisStore::builder()
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
}

impl Default for RedisStoreBuilder {
    fn default() -> Self {
        RedisStoreBuilder {
            prefix: DEFAULT_PREFIX.to_string(),
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            command_timeout: DEFAULT_COMMAND_TIMEOUT,
            recovery_window: DEFAULT_RECOVERY_WINDOW,
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

    pub(super) fn build(self, conn: Connection) -> RedisStore {
        RedisStore {
            conn,
            prefix: Arc::from(self.prefix),
            command_timeout: self.command_timeout,
            recovery_window: self.recovery_window,
        }
    }
}
