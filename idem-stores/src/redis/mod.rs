//! `RedisStore`: records in Redis, standalone (feature `redis`) or Redis Cluster (feature
//! `redis-cluster`), on the `redis` crate with tokio.
//!
//! ```no_run
//! use idem::Idem;
//! use idem::stores::redis::RedisStore;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), idem::Error> {
//! // Or `idem::connect("redis://...")` / `idem::connect("redis+cluster://h1:7001,h2:7002")`.
//! let store = RedisStore::builder()
//!     .prefix("billing:idem:")
//!     .command_timeout(std::time::Duration::from_secs(1))
//!     .open("redis://127.0.0.1:6379")
//!     .await?;
//! let idem = Idem::new(store);
//! # let _ = idem;
//! # Ok(()) }
//! ```
//!
//! A connection you already have works too: [`RedisStore::from_connection_manager`] takes a
//! [`ConnectionManager`] and
//! `RedisStore::from_cluster_connection` (feature `redis-cluster`) a cluster connection.
//!
//! # One script per step
//!
//! Each store step (claim, complete, release, extend, get, delete) is one Lua script that
//! touches one key, run with `EVALSHA` (and loaded again if the server answers `NOSCRIPT`).
//! Redis runs a script atomically, so concurrent claims of one key have exactly one winner;
//! and a script that names a single key is valid in Redis Cluster whatever slot that key
//! hashes to. The scripts are in `scripts.rs`, one constant per step. They need Redis 5 or
//! later (or a compatible server), where scripts replicate their effects and so may read
//! `TIME` before they write.
//!
//! Round trips: a first call costs two (the claim script, then the complete script) and a
//! replay one (the claim script answers with the stored result). The scripts are loaded
//! when the store connects; after the server restarts (which empties its script cache),
//! the first use of each script costs one `NOSCRIPT` and one `SCRIPT LOAD` more.
//!
//! # Time
//!
//! Leases and time to live are the server's: the claim and extend scripts read `TIME` and
//! write the lease deadline into the record, and every record carries a `PX` expiry. No
//! client clock is ever compared with another. A claim whose lease ended is remembered for
//! a while longer (the [recovery window](RedisStoreBuilder::recovery_window), one minute
//! by default) so that the claim taking it over is told `recovered: true`.
//!
//! # Record layout
//!
//! A record is one Redis string, so the replay path is a single `GET`:
//!
//! | bytes   | field                                                                  |
//! |---------|------------------------------------------------------------------------|
//! | 0..5    | `idem1`: magic and format version                                      |
//! | 5       | state: `P` in progress, `C` completed                                  |
//! | 6..14   | fencing token, big-endian `u64`                                        |
//! | 14..30  | fingerprint, 16 bytes (all zero: none)                                 |
//! | 30..45  | in progress: lease deadline, ms since the Unix epoch on the server's clock, 15 ASCII digits |
//! | 30..    | completed: the payload (the engine's record envelope), byte for byte   |
//!
//! A completed record keeps its token, so that a `complete` resent with that token is
//! recognised (answered like the first, the record untouched) and any other token fenced.
//! A value under the prefix that does not have this header (written by something else, or
//! a Redis hash, list, ...) is reported as [`StoreError::Corrupt`], which the engine turns
//! into `Error::Decode` naming the key; it is never read as a result.
//!
//! # Keys
//!
//! The Redis key of a record is the prefix (default `idem:`) followed by `scope/id`
//! ([`Key::as_str`]), with `%`, `{` and `}` percent-encoded ([`RedisStore::record_key`]).
//! The mapping is one-to-one, so distinct idem keys never share a record, and an id cannot
//! form a Redis Cluster hash tag: records spread over the slots by their whole key. A
//! prefix may hold a hash tag on purpose (`idem:{billing}:` puts every record on one
//! slot); since each script touches a single key, atomicity holds in any slot.
//!
//! # Failures
//!
//! A server that cannot be reached, drops the connection or is loading is
//! [`StoreError::Unavailable`] (temporary, with the client's error as its source); a
//! command that does not answer within the command timeout is [`StoreError::Timeout`]
//! naming the step, as is a step that outlasts the engine's step timeout.
//! [`Store::backend`] is `"redis"`, or `"redis-cluster"` on a cluster, and so is the
//! backend these errors name.
//! The engine then fails closed: the body does not run without a claim. The connection
//! reconnects on its own, so the same store works again once the server is back.
//!
//! # Operations
//!
//! Run Redis with `maxmemory-policy noeviction`: an evicted record is a lost claim or a
//! lost result, and the next call runs the operation again. Every idem record carries an
//! expiry, so `volatile-*` policies evict them as readily as `allkeys-*`. The store warns
//! (through `tracing`, target `idem`) when it connects to a server whose policy can evict.
//! For records that survive a restart, turn on AOF (`appendonly yes`); `appendfsync
//! everysec` can lose the last second of claims and results on a crash, `always` loses
//! none at the cost of an fsync per write.

mod builder;
mod connect;
mod info;
mod load;
mod record;
mod scripts;
mod url;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use idem_core::{Capabilities, Claim, Fingerprint, Key, Record, Store, StoreError, Token};
use redis::aio::ConnectionManager;
use redis::{ErrorKind, RedisError, ScriptInvocation, ServerErrorKind, Value};

pub use builder::{
    RedisStoreBuilder, DEFAULT_COMMAND_TIMEOUT, DEFAULT_CONNECT_TIMEOUT, DEFAULT_PREFIX,
    DEFAULT_RECOVERY_WINDOW,
};

/// The backend name in [`StoreError`]s of a standalone server, and of a cluster.
const BACKEND: &str = "redis";
#[cfg(feature = "redis-cluster")]
const CLUSTER_BACKEND: &str = "redis-cluster";

/// A [`Store`] in Redis or Redis Cluster. Cheap to clone: clones share the connection.
///
/// Build it with [`RedisStore::open`], [`RedisStore::builder`],
/// [`RedisStore::from_connection_manager`] or `RedisStore::from_cluster_connection`. See
/// the [module docs](self) for the scripts, the record layout and how keys are named.
#[derive(Clone)]
pub struct RedisStore {
    conn: Connection,
    prefix: Arc<str>,
    command_timeout: Duration,
    recovery_window: Duration,
}

#[derive(Clone)]
enum Connection {
    Standalone(ConnectionManager),
    #[cfg(feature = "redis-cluster")]
    Cluster(redis::cluster_async::ClusterConnection),
}

impl Connection {
    async fn eval(&self, script: &ScriptInvocation<'_>) -> Result<Value, RedisError> {
        match self {
            Connection::Standalone(c) => script.invoke_async(&mut c.clone()).await,
            #[cfg(feature = "redis-cluster")]
            Connection::Cluster(c) => script.invoke_async(&mut c.clone()).await,
        }
    }

    async fn query(&self, cmd: &redis::Cmd) -> Result<Value, RedisError> {
        match self {
            Connection::Standalone(c) => cmd.query_async(&mut c.clone()).await,
            #[cfg(feature = "redis-cluster")]
            Connection::Cluster(c) => cmd.query_async(&mut c.clone()).await,
        }
    }

    fn kind(&self) -> &'static str {
        match self {
            Connection::Standalone(_) => "standalone",
            #[cfg(feature = "redis-cluster")]
            Connection::Cluster(_) => "cluster",
        }
    }

    fn backend(&self) -> &'static str {
        match self {
            Connection::Standalone(_) => BACKEND,
            #[cfg(feature = "redis-cluster")]
            Connection::Cluster(_) => CLUSTER_BACKEND,
        }
    }
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("mode", &self.conn.kind())
            .field("prefix", &self.prefix)
            .field("command_timeout", &self.command_timeout)
            .field("recovery_window", &self.recovery_window)
            .finish()
    }
}

impl RedisStore {
    /// A builder, to set the key prefix, timeouts and recovery window before connecting.
    pub fn builder() -> RedisStoreBuilder {
        RedisStoreBuilder::default()
    }

    /// Connects with every default: `redis://host:port/db` (also `rediss://` and
    /// `redis+unix://`) for one server, `redis+cluster://host1:port1,host2:port2` for a
    /// cluster (feature `redis-cluster`). See [`RedisStoreBuilder::open`].
    pub async fn open(url: &str) -> Result<RedisStore, idem_core::Error> {
        RedisStoreBuilder::default().open(url).await
    }

    /// A store on a connection manager you already have, with the default prefix and
    /// timeouts. See [`RedisStoreBuilder::connection_manager`].
    pub async fn from_connection_manager(manager: ConnectionManager) -> RedisStore {
        RedisStoreBuilder::default()
            .connection_manager(manager)
            .await
    }

    /// A store on a cluster connection you already have, with the default prefix and
    /// timeouts. See [`RedisStoreBuilder::cluster_connection`].
    #[cfg(feature = "redis-cluster")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis-cluster")))]
    pub async fn from_cluster_connection(
        connection: redis::cluster_async::ClusterConnection,
    ) -> RedisStore {
        RedisStoreBuilder::default()
            .cluster_connection(connection)
            .await
    }

    /// The prefix of every record's Redis key.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The Redis key that holds `key`'s record: the prefix, then `scope/id` with `%`, `{`
    /// and `}` percent-encoded (so that an id never forms a cluster hash tag, and distinct
    /// keys stay distinct).
    ///
    /// ```
    /// # use idem::Key;
    /// # fn show(store: &idem::stores::redis::RedisStore) {
    /// let key = Key::new("billing", "{order}-42").unwrap();
    /// assert_eq!(store.record_key(&key), "idem:billing/%7Border%7D-42"); // default prefix
    /// # }
    /// ```
    pub fn record_key(&self, key: &Key) -> String {
        record::record_key(&self.prefix, key)
    }

    /// Runs the script of one step under the command timeout.
    async fn run(
        &self,
        step: &'static str,
        script: &ScriptInvocation<'_>,
    ) -> Result<Value, StoreError> {
        let backend = self.conn.backend();
        match tokio::time::timeout(self.command_timeout, self.conn.eval(script)).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => Err(store_error(backend, step, e, self.command_timeout)),
            Err(_) => Err(StoreError::Timeout {
                backend,
                step,
                after: self.command_timeout,
            }),
        }
    }
}

#[async_trait]
impl Store for RedisStore {
    async fn claim(
        &self,
        key: &Key,
        fingerprint: &Fingerprint,
        token: Token,
        lease: Duration,
    ) -> Result<Claim, StoreError> {
        let mut script = scripts::CLAIM.key(self.record_key(key));
        script.arg(&record::claim_request(token, fingerprint, lease, self.recovery_window)[..]);
        record::claim_reply(self.run("claim", &script).await?, token)
    }

    async fn complete(
        &self,
        key: &Key,
        token: Token,
        payload: Bytes,
        ttl: Duration,
    ) -> Result<(), StoreError> {
        let mut script = scripts::COMPLETE.key(self.record_key(key));
        script
            .arg(&record::token_bytes(token)[..])
            .arg(&payload[..])
            .arg(record::millis(ttl));
        record::held_reply("complete", self.run("complete", &script).await?)
    }

    async fn release(&self, key: &Key, token: Token) -> Result<(), StoreError> {
        let mut script = scripts::RELEASE.key(self.record_key(key));
        script.arg(&record::token_bytes(token)[..]);
        record::held_reply("release", self.run("release", &script).await?)
    }

    async fn extend(&self, key: &Key, token: Token, lease: Duration) -> Result<(), StoreError> {
        let mut script = scripts::EXTEND.key(self.record_key(key));
        script
            .arg(&record::token_bytes(token)[..])
            .arg(record::millis(lease))
            .arg(record::millis(self.recovery_window));
        record::held_reply("extend", self.run("extend", &script).await?)
    }

    async fn get(&self, key: &Key) -> Result<Option<Record>, StoreError> {
        let script = scripts::GET.key(self.record_key(key));
        record::get_reply(self.run("get", &script).await?)
    }

    async fn delete(&self, key: &Key) -> Result<bool, StoreError> {
        let script = scripts::DELETE.key(self.record_key(key));
        record::delete_reply(self.run("delete", &script).await?)
    }

    /// Recovery is reported for takeovers within the recovery window after the lease
    /// ended (a minute by default); a store without a window does not report it.
    fn capabilities(&self) -> Capabilities {
        Capabilities::NONE.with_reports_recovery(!self.recovery_window.is_zero())
    }

    fn backend(&self) -> &'static str {
        self.conn.backend()
    }

    /// The command timeout: each step is one script under it (its reload after a
    /// `NOSCRIPT` included).
    fn step_bound(&self) -> Option<Duration> {
        Some(self.command_timeout)
    }
}

/// A client error as a [`StoreError`]: temporary when the server could not be reached or
/// was busy, corrupt when the key holds another Redis type, a backend failure otherwise.
fn store_error(
    backend: &'static str,
    step: &'static str,
    e: RedisError,
    timeout: Duration,
) -> StoreError {
    if e.code() == Some("WRONGTYPE") {
        return StoreError::Corrupt {
            backend,
            reason: "the key holds a Redis value of another type than string".into(),
        };
    }
    if e.is_timeout() {
        return StoreError::Timeout {
            backend,
            step,
            after: timeout,
        };
    }
    let unreachable = e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_unrecoverable_error()
        || matches!(
            e.kind(),
            ErrorKind::ClusterConnectionNotFound
                | ErrorKind::Server(
                    ServerErrorKind::BusyLoading
                        | ServerErrorKind::TryAgain
                        | ServerErrorKind::ClusterDown
                        | ServerErrorKind::MasterDown
                        | ServerErrorKind::ReadOnly
                )
        );
    let source = Box::new(e);
    if unreachable {
        StoreError::Unavailable { backend, source }
    } else {
        StoreError::Backend { backend, source }
    }
}
