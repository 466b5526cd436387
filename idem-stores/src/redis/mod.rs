//! `RedisStore`: records in Redis, standalone (feature `redis`) or Redis Cluster (feature
//! `redis-cluster`), on the `redis` crate with tokio.
//!
//! ```no_run
//! use idem::Idem;
//! use idem::stores::RedisStore;
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
//! [`ConnectionManager`](https://docs.rs/redis/1/redis/aio/struct.ConnectionManager.html) and
//! `RedisStore::from_cluster_connection` (feature `redis-cluster`) a cluster connection.
//!
//! # One script per step
//!
//! Each store step (claim, complete, release, extend, get, delete, replace) is one Lua
//! script that touches one key, run with `EVALSHA` (and loaded again if the server answers
//! `NOSCRIPT`). Redis runs a script atomically, so concurrent claims of one key have exactly
//! one winner; and a script that names a single key is valid in Redis Cluster whatever slot
//! that key hashes to. (On a standalone server a claim about to write also reads the epoch
//! key: see [`RedisStore`](RedisStore#lost-records).) The scripts are in `scripts.rs`, one
//! constant per step. They need Redis 5 or later (or a compatible server), where scripts
//! replicate their effects and so may read `TIME` before they write.
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
//! | 45..61  | in progress: the claim's fence, 16 ASCII digits                        |
//! | 30..    | completed: the payload (the engine's record envelope), byte for byte   |
//!
//! The fence (`idem::Fence`) is `max(previous + 1, TIME in microseconds)`, the previous
//! one being that of the ended lease the claim takes over (0 for a fresh key). An
//! in-progress record of 45 bytes, written before fences, reads as fence 0; a build from
//! before fences reads a 61-byte in-progress record as not an idem record (`Error::Decode`
//! for a call that meets it), so during a rolling upgrade a key claimed by a new build and
//! still in progress fails closed on an old one. Completed records are as they were.
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
//! # Durability
//!
//! By default a step is done once the primary applied it; Redis replicates asynchronously,
//! so a failover can lose what the primary acknowledged last, and a retry then runs the
//! body again. With [`RedisStoreBuilder::wait_for_replicas`] (or [`RedisStore::with_replicas`])
//! the claim, complete and replace scripts are each sent with `WAIT` behind them, in one
//! pipeline on one connection (`replicas.rs`), and a replay or a resent step touches the
//! record so that the `WAIT` measures the record itself; too few acknowledgements are
//! [`StoreError::NotReplicated`], so no call reports a result the replicas do not hold.
//!
//! # Lost records
//!
//! A server that comes back without the records (no persistence and a restart, a
//! `FLUSHALL`, a failover to a replica without them) would have every key completed before
//! run its body again, silently. The store keeps an epoch beside the records (`epoch.rs`,
//! [`RedisStore::epoch_key`]); on a standalone server the claim script compares it before
//! it writes a claim, and the store reads it back after a step that could not reach the
//! server and at most every [check interval](RedisStoreBuilder::epoch_check_interval); a
//! loss is logged at `error` level and handled as [`LostRecords`] says.
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

mod admin;
mod builder;
mod connect;
mod epoch;
mod info;
mod load;
mod record;
mod replicas;
mod scripts;
mod url;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use idem_core::{Capabilities, Claim, Fingerprint, Key, Record, Store, StoreError, Token};
use redis::aio::ConnectionManager;
use redis::{ErrorKind, RedisError, ScriptInvocation, ServerErrorKind, Value};
use replicas::{evalsha, ReplicaWait};

pub use builder::{
    RedisStoreBuilder, DEFAULT_REDIS_COMMAND_TIMEOUT, DEFAULT_REDIS_PREFIX,
    DEFAULT_REDIS_RECOVERY_WINDOW,
};
pub use epoch::{
    LostRecords, DEFAULT_REDIS_EPOCH_CHECK_INTERVAL, DEFAULT_REDIS_LOST_RECORDS_GRACE,
};

/// The extra script argument of a claim, complete or replace that replicas must
/// acknowledge: it tells the script to touch a record it found nothing to write to
/// (`scripts.rs`).
const DURABLE: &str = "1";

/// The backend name in [`StoreError`]s of a standalone server, and of a cluster.
const BACKEND: &str = "redis";
#[cfg(feature = "redis-cluster")]
const CLUSTER_BACKEND: &str = "redis-cluster";

/// A [`Store`] in Redis or Redis Cluster. Cheap to clone: clones share the connection.
///
/// A step is acknowledged by the primary alone unless the store waits for replicas
/// ([`RedisStoreBuilder::wait_for_replicas`], [`RedisStore::with_replicas`]).
///
/// # Lost records
///
/// A Redis without persistence that restarts, is flushed or fails over to an empty replica
/// has no records left, and every key completed before would run its body again. When the
/// store connects it writes an *epoch* under its prefix ([`epoch_key`](Self::epoch_key):
/// `<prefix>epoch`, a random 128-bit value, `SET NX`, no expiry; no record key is that,
/// since after the prefix a record's key holds `scope/id`, and a scope is never empty) and
/// remembers the value it found or wrote. Three looks at it:
///
/// - On a standalone server the claim script compares it before it writes a claim (the
///   store passes the epoch it knows; the script reads the epoch key beside the record, in
///   the same atomic step, at no extra round trip). Missing or another, the script writes
///   nothing, the store notices the loss as below, and the claim runs once more against
///   the new epoch, so the first claim after a restart or a flush already sees the loss,
///   and no claim acquires a key whose result the server lost. Replays, which find a
///   record written since, do not look.
/// - One `GET`, sent before a step and within that step's command timeout, after a step
///   failed because the server could not be reached (a refused or dropped connection: the
///   server may have restarted) or did not answer within the command timeout;
/// - and otherwise when the last read is older than the
///   [check interval](RedisStoreBuilder::epoch_check_interval) (10 s by default). No
///   background task: steps in between cost nothing more (a first call stays 2 round trips,
///   a replay 1; a step that finds the check due costs one more).
///
/// A missing epoch, or another one (a store under the same prefix noticed first and wrote
/// it), is a loss: an `error` event (target `idem`) names the server (without its
/// password), the epoch key and both values, and says what it means; the store writes a new
/// epoch and answers the claims that find no record as [`LostRecords`] says (by default,
/// for a minute and at least each claim's lease, a temporary
/// [`StoreError::RecordsLost`]; see [`RedisStoreBuilder::on_lost_records`]).
///
/// What it cannot see: a loss before the store connected; a loss that kept the epoch (a
/// failover to a replica that has the epoch but lags on records, which
/// [`wait_for_replicas`](RedisStoreBuilder::wait_for_replicas) is for); an `allkeys-*`
/// eviction policy may evict the epoch itself, which then looks like a loss. On Redis
/// Cluster the epoch is one key in one slot, so it speaks for the primary of that slot
/// alone: a loss on another primary goes unnoticed. A prefix with a hash tag
/// (`idem:{billing}:`) puts the epoch in the slot of every record, where it covers them all.
/// And on a cluster the claim script does not read the epoch (a script may touch the keys
/// of one slot only, and the epoch's is another than the record's): a loss there is seen
/// only by the `GET` after a failed step and the periodic check, so a key completed before
/// it may run its body again within the check interval after it.
///
/// Build it with [`RedisStore::open`], [`RedisStore::builder`],
/// [`RedisStore::from_connection_manager`] or `RedisStore::from_cluster_connection`. See
/// the source of `idem-stores/src/redis/` for the scripts, the record layout and how keys are named.
#[derive(Clone)]
pub struct RedisStore {
    conn: Connection,
    prefix: Arc<str>,
    command_timeout: Duration,
    recovery_window: Duration,
    /// The durability level: `None` answers once the primary took a step.
    replicas: Option<ReplicaWait>,
    /// The epoch this store compares with, shared by its clones (`epoch.rs`).
    epoch: Arc<epoch::Epoch>,
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
            .field("replicas", &self.replicas)
            .field("epoch", &self.epoch)
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
    /// # fn show(store: &idem::stores::RedisStore) {
    /// let key = Key::new("billing", "{order}-42").unwrap();
    /// assert_eq!(store.record_key(&key), "idem:billing/%7Border%7D-42"); // default prefix
    /// # }
    /// ```
    pub fn record_key(&self, key: &Key) -> String {
        record::record_key(&self.prefix, key)
    }

    /// A store on the same connection (and prefix, timeouts, recovery window) whose claims
    /// and completes wait for `replicas` replicas, as
    /// [`RedisStoreBuilder::wait_for_replicas`] describes; `0` replicas turns the wait off.
    /// Cheap: nothing is connected or loaded.
    ///
    /// This is how one process picks a durability level per call: give the engine of the
    /// calls whose results must survive a failover the durable store, and the others the
    /// plain one; both share the connection and see the same records.
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # use idem::{Idem, stores::RedisStore};
    /// # async fn engines(store: RedisStore) {
    /// let payments = Idem::new(store.with_replicas(1, Duration::from_millis(500)));
    /// let emails = Idem::new(store); // acknowledged by the primary alone
    /// # let _ = (payments, emails); }
    /// ```
    ///
    /// A `WAIT` holds up the connection it is sent on until it returns: the plain store's
    /// steps queue behind the durable store's waits. Where that matters (replicas that can
    /// lag or go away), open the durable store on a connection of its own instead
    /// ([`RedisStoreBuilder::open`] with the option set).
    pub fn with_replicas(&self, replicas: u32, timeout: Duration) -> RedisStore {
        let store = RedisStore {
            replicas: ReplicaWait::new(replicas, timeout),
            ..self.clone()
        };
        store.warn_if_wait_outlasts_steps();
        store
    }

    /// How many replicas must acknowledge each claim and complete, and how long the store
    /// waits for them; `None` when the store answers on the primary's word alone (the
    /// default).
    pub fn replicas(&self) -> Option<(u32, Duration)> {
        self.replicas.map(|w| (w.replicas, w.timeout))
    }

    /// A replica timeout at or past the command timeout is cut short by it: the step fails
    /// as a timeout, not as the shortfall it is.
    pub(super) fn warn_if_wait_outlasts_steps(&self) {
        if let Some(wait) = self.replicas {
            if wait.timeout >= self.command_timeout {
                tracing::warn!(target: "idem", replica_timeout = ?wait.timeout, command_timeout = ?self.command_timeout,
                    "the Redis replica timeout is not below the command timeout, which bounds the script and its WAIT together: a step whose replicas are late fails as a timeout");
            }
        }
    }

    /// The Redis key of the epoch: the prefix, then `epoch` (no record key is that: the
    /// part after the prefix of each holds a `/`). See [`LostRecords`].
    pub fn epoch_key(&self) -> &str {
        &self.epoch.key
    }

    /// How many times this store (and its clones) noticed that the server lost its
    /// records: its epoch was missing or another one. See [`LostRecords`].
    pub fn lost_records_noticed(&self) -> u64 {
        self.epoch.losses()
    }

    /// Acknowledges the loss of records behind the current epoch: claims of keys without a
    /// record are no longer refused for it ([`LostRecords::FailClaimsUntilAcknowledged`], or
    /// what is left of a [`LostRecords::FailClaimsFor`] window), by this store and its
    /// clones at once, and by every other store under the prefix (in any process) at its
    /// next refused claim: the current epoch is written under `<prefix>epoch-acknowledged`.
    /// A later loss changes the epoch, and is refused again.
    ///
    /// An error (the server could not be reached) leaves the loss unacknowledged everywhere.
    pub async fn acknowledge_lost_records(&self) -> Result<(), StoreError> {
        self.acknowledge_epoch().await
    }

    /// Runs the script of one step under the command timeout (the epoch's check, when it
    /// is due, within it too).
    async fn run(
        &self,
        step: &'static str,
        script: &ScriptInvocation<'_>,
    ) -> Result<Value, StoreError> {
        let backend = self.conn.backend();
        let attempt = async {
            self.check_epoch().await;
            self.conn.eval(script).await
        };
        match tokio::time::timeout(self.command_timeout, attempt).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => Err(self.failed(store_error(backend, step, e, self.command_timeout))),
            Err(_) => Err(self.failed(StoreError::Timeout {
                backend,
                step,
                after: self.command_timeout,
            })),
        }
    }

    /// A step's error, noted when it says the server could not be reached or did not
    /// answer in time: the server may have restarted (or be restarting), so the next step
    /// reads the epoch first.
    fn failed(&self, e: StoreError) -> StoreError {
        if matches!(
            e,
            StoreError::Unavailable { .. } | StoreError::Timeout { .. }
        ) {
            self.epoch.suspect();
        }
        e
    }

    /// The epoch a claim script compares the epoch key with: the one this store knows, on a
    /// standalone server. A cluster's claim never reads it: the epoch key hashes to another
    /// slot than the record (unless the prefix pins both to one), and a script may touch
    /// the keys of one slot only.
    fn epoch_for_claims(&self) -> Option<Arc<str>> {
        match self.conn {
            Connection::Standalone(_) => self.epoch.current(),
            #[cfg(feature = "redis-cluster")]
            Connection::Cluster(_) => None,
        }
    }

    /// The claim script against the epoch the store knows. When the script finds the epoch
    /// key missing or changed (the server lost its records since the store last looked),
    /// the loss is noticed as the epoch check notices one, and the claim runs once more,
    /// against the new epoch, within what is left of the command timeout.
    async fn claim_seeing_losses(
        &self,
        key: &Key,
        fingerprint: &Fingerprint,
        token: Token,
        lease: Duration,
        started: tokio::time::Instant,
    ) -> Result<Claim, StoreError> {
        let known = self.epoch_for_claims();
        if let Some(claim) = self
            .claim_step(key, fingerprint, token, lease, known.as_deref())
            .await?
        {
            return Ok(claim);
        }
        let backend = self.conn.backend();
        let again = async {
            self.notice_epoch_change(known.as_deref()).await?;
            let known = self.epoch_for_claims();
            self.claim_step(key, fingerprint, token, lease, known.as_deref())
                .await
        };
        let left = self.command_timeout.saturating_sub(started.elapsed());
        match tokio::time::timeout(left, again).await {
            Ok(Ok(Some(claim))) => Ok(claim),
            // Lost again between the two scripts: nothing claimed, and no body runs.
            Ok(Ok(None)) => Err(StoreError::Unavailable {
                backend,
                source: "the Redis epoch changed again while the claim ran: the server lost its records twice in a row"
                    .into(),
            }),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(self.failed(StoreError::Timeout {
                backend,
                step: "claim",
                after: self.command_timeout,
            })),
        }
    }

    /// The claim script (and with a durability level its `WAIT`), before the epoch's
    /// verdict on a claim that found no record; `None` when the script found the epoch key
    /// missing or another than `epoch` and wrote nothing.
    async fn claim_step(
        &self,
        key: &Key,
        fingerprint: &Fingerprint,
        token: Token,
        lease: Duration,
        epoch: Option<&str>,
    ) -> Result<Option<Claim>, StoreError> {
        let request = record::claim_request(token, fingerprint, lease, self.recovery_window, epoch);
        let rkey = self.record_key(key);
        let Some(wait) = self.replicas else {
            let mut script = scripts::CLAIM.key(&rkey);
            if epoch.is_some() {
                script.key(&self.epoch.key);
            }
            script.arg(&request[..]);
            let reply = self.run("claim", &script).await?;
            if record::epoch_changed(&reply) {
                return Ok(None);
            }
            return record::claim_reply(reply, token).map(Some);
        };
        let started = tokio::time::Instant::now();
        let keys: &[&str] = match epoch {
            Some(_) => &[&rkey, &self.epoch.key],
            None => &[&rkey],
        };
        let mut eval = evalsha(&scripts::CLAIM, keys);
        eval.arg(&request[..]).arg(DURABLE);
        let (reply, acknowledged) = self
            .run_replicated("claim", wait, &scripts::CLAIM, &rkey, eval)
            .await?;
        if record::epoch_changed(&reply) {
            // Nothing written: nothing for the replicas to hold.
            return Ok(None);
        }
        let claim = record::claim_reply(reply, token)?;
        let Some(shortfall) = wait.shortfall(self.conn.backend(), "claim", acknowledged) else {
            return Ok(Some(claim));
        };
        match claim {
            // Another holder's claim: nothing of ours is at stake, and no body runs.
            Claim::InProgress { .. } => Ok(Some(claim)),
            Claim::Acquired { .. } => {
                // The body must not run on a claim a failover can forget. Releasing now
                // (best effort: it is fenced anyway, and its lease ends) lets a retry claim
                // again at once instead of finding this claim in progress; within what is
                // left of the command timeout, which bounds the whole step.
                let left = self.command_timeout.saturating_sub(started.elapsed());
                match tokio::time::timeout(left, self.release(key, token)).await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => tracing::debug!(target: "idem", key = %key, error = %e,
                        "could not release a claim its replicas did not acknowledge; it ends with its lease"),
                    Err(_) => tracing::debug!(target: "idem", key = %key,
                        "no time left to release a claim its replicas did not acknowledge; it ends with its lease"),
                }
                Err(shortfall)
            }
            // A result the replicas may not hold: a failover could lose it and run the
            // body again, so it is not answered yet.
            _ => Err(shortfall),
        }
    }
}

#[async_trait]
impl Store for RedisStore {
    /// The claim script; after the store noticed a loss of its records, a claim that found
    /// no record may be refused as [`LostRecords`] says (and its record released again).
    async fn claim(
        &self,
        key: &Key,
        fingerprint: &Fingerprint,
        token: Token,
        lease: Duration,
    ) -> Result<Claim, StoreError> {
        let started = tokio::time::Instant::now();
        let claim = self
            .claim_seeing_losses(key, fingerprint, token, lease, started)
            .await?;
        if !matches!(
            claim,
            Claim::Acquired {
                recovered: false,
                ..
            }
        ) {
            return Ok(claim);
        }
        let left = self.command_timeout.saturating_sub(started.elapsed());
        let Some(refused) = self.refusal(lease, left).await else {
            return Ok(claim);
        };
        // Nothing under the key: it may have completed before the loss. Let go of the
        // claim just written (best effort; its lease ends anyway) within the step's bound.
        let left = self.command_timeout.saturating_sub(started.elapsed());
        if !matches!(
            tokio::time::timeout(left, self.release(key, token)).await,
            Ok(Ok(()))
        ) {
            tracing::debug!(target: "idem", key = %key,
                "could not release a claim refused after the loss of the Redis records; it ends with its lease");
        }
        Err(refused)
    }

    async fn complete(
        &self,
        key: &Key,
        token: Token,
        payload: Bytes,
        ttl: Duration,
    ) -> Result<(), StoreError> {
        let token = record::token_bytes(token);
        let ttl = record::millis(ttl);
        let Some(wait) = self.replicas else {
            let mut script = scripts::COMPLETE.key(self.record_key(key));
            script.arg(&token[..]).arg(&payload[..]).arg(ttl);
            return record::held_reply("complete", self.run("complete", &script).await?);
        };
        let rkey = self.record_key(key);
        let mut eval = evalsha(&scripts::COMPLETE, &[&rkey]);
        eval.arg(&token[..]).arg(&payload[..]).arg(ttl).arg(DURABLE);
        let (reply, acknowledged) = self
            .run_replicated("complete", wait, &scripts::COMPLETE, &rkey, eval)
            .await?;
        record::held_reply("complete", reply)?;
        // Stored on the primary but not yet on enough replicas: an error, so that the
        // engine completes again (same token: the first result stays, and is waited for
        // again) rather than answer a result a failover can lose.
        match wait.shortfall(self.conn.backend(), "complete", acknowledged) {
            Some(shortfall) => Err(shortfall),
            None => Ok(()),
        }
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

    /// One script on the record's key: the stored payload compared byte for byte with
    /// `expected`, then the record rewritten (same header, the new payload, a new `PX`) or
    /// deleted. With a durability level the script is sent with `WAIT` behind it, as a
    /// complete is; too few replicas is [`StoreError::NotReplicated`], whether the record
    /// was replaced on the primary or found as it was not expected. A repeat of a replace
    /// that did take effect answers `false` (the payload is the new one): after an error, read
    /// the record to learn where it stands.
    async fn replace(
        &self,
        key: &Key,
        expected: &[u8],
        new: Option<(Bytes, Duration)>,
    ) -> Result<bool, StoreError> {
        // A ttl of 0 asks for a delete: `record::millis` never answers 0.
        let (ttl, payload) = match &new {
            Some((payload, ttl)) => (record::millis(*ttl), &payload[..]),
            None => (0, &[][..]),
        };
        let Some(wait) = self.replicas else {
            let mut script = scripts::REPLACE.key(self.record_key(key));
            script.arg(expected).arg(ttl).arg(payload);
            return record::replace_reply(self.run("replace", &script).await?);
        };
        let rkey = self.record_key(key);
        let mut eval = evalsha(&scripts::REPLACE, &[&rkey]);
        eval.arg(expected).arg(ttl).arg(payload).arg(DURABLE);
        let (reply, acknowledged) = self
            .run_replicated("replace", wait, &scripts::REPLACE, &rkey, eval)
            .await?;
        let replaced = record::replace_reply(reply)?;
        match wait.shortfall(self.conn.backend(), "replace", acknowledged) {
            Some(shortfall) => Err(shortfall),
            None => Ok(replaced),
        }
    }

    /// Recovery is reported for takeovers within the recovery window after the lease
    /// ended (a minute by default); a store without a window does not report it.
    /// Fences come from the claim script (`TIME` in microseconds, or the ended lease's
    /// fence + 1): assigned with or without a recovery window, which only decides whether
    /// an ended lease's fence is still there to add one to.
    fn capabilities(&self) -> Capabilities {
        Capabilities::NONE
            .with_reports_recovery(!self.recovery_window.is_zero())
            .with_assigns_fences(true)
            .with_replaces_records(true)
    }

    fn backend(&self) -> &'static str {
        self.conn.backend()
    }

    /// The command timeout: each step is one script under it (its reload after a
    /// `NOSCRIPT` included, and with a durability level its `WAIT`, and the release of a
    /// claim too few replicas acknowledged).
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
