//! [`Admin`]: what an operator asks of a store beyond the [`Store`] steps a service makes:
//! describe the record under a key (its state, time left, token and sizes, on the store's
//! own clock and key encoding), count records by state, delete a record without cutting
//! off a running call, and purge ended records, each with a dry run where it deletes. The
//! `idem` command is these calls and its output; [`open`] opens a store for it by URL.
//!
//! Implemented by the SQL stores and [`RedisStore`](crate::RedisStore), each once, through
//! the same statements, scripts and key encoding as their [`Store`] steps.

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use idem_core::{Error, Fingerprint, Key, Store, StoreError, Token};

/// A store's operator calls. See the [module docs](self).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # #[cfg(feature = "sqlite")] {
/// use idem_stores::admin::{Admin, DeleteOptions, Deletion};
/// # let dir = tempfile::tempdir()?;
/// let store = idem_stores::SqliteStore::open(dir.path().join("idem.db")).await?;
/// let key = idem_core::Key::new("billing::charge", "order-42")?;
/// assert!(store.describe(&key).await?.is_none());
/// assert_eq!(store.delete_record(&key, DeleteOptions::default()).await?, Deletion::NotFound);
/// assert_eq!(store.stats().await?.completed, 0);
/// # }
/// # Ok(()) }
/// ```
#[async_trait]
pub trait Admin: Store {
    /// The live record under `key`, described; `None` when there is none (an ended claim
    /// or an expired result is no record).
    async fn describe(&self, key: &Key) -> Result<Option<RecordInfo>, AdminError>;

    /// How many records are in each state, on the store's clock.
    async fn stats(&self) -> Result<Stats, AdminError>;

    /// Deletes the record under `key`, so that the next call runs its body again. A live
    /// claim is refused unless `force` ([`Deletion::Refused`]): deleting it lets a second
    /// run start beside the holder, which is still running. With `dry_run`, deletes
    /// nothing and answers what it would have done.
    ///
    /// Deletes only the record it looked at (its key and token, while it lives): a record a
    /// new claim wrote in between is looked at again, never deleted unseen.
    async fn delete_record(
        &self,
        key: &Key,
        options: DeleteOptions,
    ) -> Result<Deletion, AdminError>;

    /// Deletes every ended record (expired results, claims whose lease ended) and answers
    /// how many; with `dry_run`, counts them and deletes nothing.
    async fn purge(&self, dry_run: bool) -> Result<u64, AdminError>;

    /// Creates or upgrades what the store keeps its records in; answers what it brought
    /// to this build's schema, `None` when the store keeps no schema (Redis).
    async fn ensure_schema(&self) -> Result<Option<String>, AdminError>;
}

/// The state of a live record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RecordState {
    /// A claim holds the key: a call is running (or its holder died and the lease has not
    /// ended yet).
    InProgress,
    /// A stored result.
    Completed,
}

impl RecordState {
    /// `in_progress` or `completed`, as the command prints it.
    pub fn as_str(self) -> &'static str {
        match self {
            RecordState::InProgress => "in_progress",
            RecordState::Completed => "completed",
        }
    }
}

/// A live record as [`Admin::describe`] shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RecordInfo {
    /// Claimed or completed.
    pub state: RecordState,
    /// The fingerprint of the call that claimed it.
    pub fingerprint: Fingerprint,
    /// The fencing token of that claim (a completed record keeps its claim's token).
    pub token: Token,
    /// How long it still lives, on the store's clock: the lease left of a claim, the time
    /// to expiry of a result.
    pub time_left: Duration,
    /// The stored result (the engine's record envelope), when completed.
    pub payload: Option<Bytes>,
    /// The key as the store keeps it (escaped as the store escapes keys; a Redis key with
    /// its prefix).
    pub stored_key: String,
    /// How many bytes the store holds for the record's value: the payload, fingerprint
    /// and what the store adds (a Redis record's header).
    pub stored_bytes: usize,
}

/// Records by state, as [`Admin::stats`] counts them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Live claims.
    pub in_progress: u64,
    /// Stored results that have not expired.
    pub completed: u64,
    /// Ended records that a purge would delete.
    pub ended: u64,
}

/// How [`Admin::delete_record`] deletes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeleteOptions {
    /// Deletes a live claim too.
    pub force: bool,
    /// Deletes nothing; answers what would be deleted.
    pub dry_run: bool,
}

/// What [`Admin::delete_record`] did (with a dry run: would do).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Deletion {
    /// The record, as it was, is gone (with a dry run: would be).
    Deleted(RecordInfo),
    /// A live claim holds the key and `force` was not given: nothing was deleted.
    Refused(RecordInfo),
    /// No live record under the key (an ended one is deleted as well, unless a dry run).
    NotFound,
}

/// The error of an [`Admin`] call.
#[derive(Debug)]
#[non_exhaustive]
pub enum AdminError {
    /// The store failed, or is not set up.
    Store(StoreError),
    /// This store cannot do that, or need not; `reason` says why and what to do instead.
    Unsupported {
        /// Which backend.
        backend: &'static str,
        /// What was asked (`stats`, `purge`).
        operation: &'static str,
        /// Why not, and what instead.
        reason: &'static str,
    },
}

impl fmt::Display for AdminError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AdminError::Store(e) => fmt::Display::fmt(e, f),
            AdminError::Unsupported {
                backend,
                operation,
                reason,
            } => write!(f, "{operation} is not supported on {backend}: {reason}"),
        }
    }
}

impl std::error::Error for AdminError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            // The store error's own message is this one's; its source comes next.
            AdminError::Store(e) => e.source(),
            AdminError::Unsupported { .. } => None,
        }
    }
}

impl From<StoreError> for AdminError {
    fn from(e: StoreError) -> Self {
        AdminError::Store(e)
    }
}

/// Where [`open`] finds the records: the names the service's store was built with.
#[derive(Debug, Clone)]
pub struct Target {
    /// The SQL table (default `idem_records`).
    pub table: String,
    /// The Redis key prefix (default `idem:`).
    pub prefix: String,
    /// Whether to create or upgrade the SQL table on opening (an inspection must not).
    pub migrate: bool,
}

impl Default for Target {
    fn default() -> Self {
        Target {
            table: "idem_records".into(),
            prefix: "idem:".into(),
            migrate: false,
        }
    }
}

/// Opens the store a URL names for its operator calls: `postgres://`, `sqlite://`,
/// `mysql://` (or `mariadb://`), `redis://`, `rediss://`, `redis+cluster://`, as far as
/// this build has their features. Another scheme, `memory://` included (no other process
/// sees its records), is an [`Error::Config`] naming what is accepted.
pub async fn open(url: &str, target: &Target) -> Result<Box<dyn Admin>, Error> {
    // The same scheme and TLS checks as `connect`: a URL asking for TLS never opens
    // in plain text here either.
    let scheme = crate::connect::checked_scheme(url)?;
    // Unused in a build without a backend feature.
    let _ = target;
    match scheme {
        #[cfg(feature = "postgres")]
        "postgres" | "postgresql" => Ok(Box::new(
            crate::PostgresStore::builder()
                .table(&target.table)
                .migrate(target.migrate)
                .connect(url)
                .await?,
        )),
        #[cfg(feature = "sqlite")]
        "sqlite" => Ok(Box::new(
            crate::SqliteStore::builder()
                .table(&target.table)
                .migrate(target.migrate)
                .connect(url)
                .await?,
        )),
        #[cfg(feature = "mysql")]
        "mysql" | "mariadb" => Ok(Box::new(
            crate::MySqlStore::builder()
                .table(&target.table)
                .migrate(target.migrate)
                .connect(url)
                .await?,
        )),
        #[cfg(feature = "redis")]
        "redis" | "rediss" | "redis+unix" | "redis+cluster" | "rediss+cluster" => Ok(Box::new(
            crate::RedisStore::builder()
                .prefix(&target.prefix)
                .open(url)
                .await?,
        )),
        other => Err(Error::Config {
            message: format!(
                "unknown store URL scheme `{other}`: expected postgres, sqlite, mysql, redis, rediss or redis+cluster (as this build's features allow)"
            ),
            source: None,
        }),
    }
}

/// How often a deletion looks again when the record changed between its look and its
/// delete (a claim taken or completed just then).
const DELETE_ATTEMPTS: u32 = 5;

/// The steps each store adds for [`delete_record`]: delete the live record of `token`
/// under `key`, and delete an ended record under `key`, each answering whether it did.
#[async_trait]
pub(crate) trait DeleteSeen: Admin {
    async fn delete_seen(&self, key: &Key, token: Token) -> Result<bool, StoreError>;
    async fn delete_ended(&self, key: &Key) -> Result<(), StoreError>;
}

/// [`Admin::delete_record`] over a store's `describe` and `delete_seen`: look, decide,
/// delete what was seen, look again if it changed meanwhile.
#[allow(dead_code)]
pub(crate) async fn delete_record<S: DeleteSeen + ?Sized>(
    store: &S,
    key: &Key,
    options: DeleteOptions,
) -> Result<Deletion, AdminError> {
    for _ in 0..DELETE_ATTEMPTS {
        let Some(info) = store.describe(key).await? else {
            if !options.dry_run {
                // What `Store::delete` promises: nothing of the key left, an ended claim
                // included (that claim's old holder then gets `Ok` for a release).
                store.delete_ended(key).await?;
            }
            return Ok(Deletion::NotFound);
        };
        if info.state == RecordState::InProgress && !options.force {
            return Ok(Deletion::Refused(info));
        }
        if options.dry_run || store.delete_seen(key, info.token).await? {
            return Ok(Deletion::Deleted(info));
        }
    }
    Err(AdminError::Store(StoreError::Backend {
        backend: store.backend(),
        source: format!(
            "the record under the key changed {DELETE_ATTEMPTS} times between looking at it and deleting it"
        )
        .into(),
    }))
}
