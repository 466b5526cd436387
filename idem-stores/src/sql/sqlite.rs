//! `SqliteStore`: records in one SQLite table in a file, in WAL mode; the persistent store
//! for a single process or a few on one machine.
//!
//! A claim reads the record first (`Statements::read`, no write lock), so a replay never
//! waits for a writer. Only without a live record does it run the upsert
//! (`Statements::take`), one statement that SQLite runs under its write lock and that
//! inserts, or takes over an ended record, or, when another claim got there first, answers
//! with no row, after which the claim reads again.

use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use idem_core::{Claim, Error, Fingerprint, Key, Record, Store, StoreError, Token};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePool, SqlitePoolOptions,
    SqliteRow,
};
use sqlx::Row;

use super::{
    millis, probe, store_error, token_from_db, token_to_db, DbErrorKind, LiveRow, NoAnswer,
    TableName, CLAIM_ATTEMPTS, DEFAULT_TABLE,
};
pub use super::{DEFAULT_ACQUIRE_TIMEOUT, DEFAULT_CONNECT_TIMEOUT};

const BACKEND: &str = "sqlite";

/// The schema version this build creates and reads.
pub const SCHEMA_VERSION: i32 = 1;

/// How long a statement waits for another connection's (or process's) write lock. Below
/// the engine's default step timeout (5 s), so that a lock held elsewhere ends the step with
/// SQLite's own "database is locked" (a temporary failure) rather than the engine's
/// timeout; a write under the lock is one short statement, so a turn rarely takes long.
pub const DEFAULT_BUSY_TIMEOUT: Duration = Duration::from_secs(2);

/// The database's clock in milliseconds since the Unix epoch.
const NOW_MS: &str = "CAST(unixepoch('subsec') * 1000 AS INTEGER)";

/// Idempotency records in a SQLite file (table `idem_records` by default), on a sqlx
/// [`SqlitePool`].
///
/// Correct with many tasks of one process and with several processes on one file: every
/// write is one statement under SQLite's write lock, and a replay is one read that no
/// writer blocks (WAL). Times are SQLite's clock (`unixepoch('subsec')`).
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use idem_stores::SqliteStore;
/// let store = SqliteStore::open("idem.db").await?; // created when missing
/// store.migrate().await?;
/// let idem = idem_core::Idem::new(store);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct SqliteStore {
    pool: SqlitePool,
    table: TableName,
    sql: Arc<Statements>,
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore")
            .field("table", &self.table)
            .field("pool_size", &self.pool.size())
            .finish()
    }
}

/// Options of a [`SqliteStore`] that opens its own pool: how long to wait for the file,
/// for a connection and for another writer's lock.
///
/// ```no_run
/// # use std::time::Duration;
/// # async fn demo() -> Result<(), idem_core::Error> {
/// let store = idem_stores::SqliteStore::builder()
///     .busy_timeout(Duration::from_millis(500))
///     .open("idem.db")
///     .await?;
/// # let _ = store; Ok(()) }
/// ```
#[derive(Debug, Clone)]
#[must_use]
pub struct SqliteStoreBuilder {
    acquire_timeout: Duration,
    connect_timeout: Duration,
    busy_timeout: Duration,
}

impl Default for SqliteStoreBuilder {
    fn default() -> Self {
        SqliteStoreBuilder {
            acquire_timeout: DEFAULT_ACQUIRE_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            busy_timeout: DEFAULT_BUSY_TIMEOUT,
        }
    }
}

impl SqliteStoreBuilder {
    /// The longest wait for a connection from the pool (default 3 s). Keep it at or below
    /// the engine's step timeout
    /// ([`IdemBuilder::step_timeout`](idem_core::IdemBuilder::step_timeout), default 5 s).
    pub fn acquire_timeout(mut self, timeout: Duration) -> Self {
        self.acquire_timeout = timeout.max(Duration::from_millis(1));
        self
    }

    /// The longest wait for the first connection when the store opens (default 3 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout.max(Duration::from_millis(1));
        self
    }

    /// How long a statement waits for another connection's write lock before it fails
    /// with "database is locked" (default [`DEFAULT_BUSY_TIMEOUT`], 2 s). Keep it below the
    /// engine's step timeout.
    pub fn busy_timeout(mut self, timeout: Duration) -> Self {
        self.busy_timeout = timeout;
        self
    }

    /// Opens `sqlite://path/to/file.db` (or `sqlite:path`). See [`SqliteStore::connect`].
    pub async fn connect(self, url: &str) -> Result<SqliteStore, Error> {
        let options = SqliteConnectOptions::from_str(url).map_err(|e| Error::Connect {
            message: format!("invalid sqlite URL `{url}`"),
            source: Some(Box::new(e)),
        })?;
        self.connect_with(options).await
    }

    /// Opens (creating when missing) the SQLite file at `path`.
    pub async fn open(self, path: impl AsRef<Path>) -> Result<SqliteStore, Error> {
        self.connect_with(SqliteConnectOptions::new().filename(path))
            .await
    }

    /// Opens a pool with your options, after setting what the store relies on: the file is
    /// created when missing, the journal is WAL, and the busy timeout is this builder's.
    pub async fn connect_with(self, options: SqliteConnectOptions) -> Result<SqliteStore, Error> {
        let options = options
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .busy_timeout(self.busy_timeout);
        probe::<SqliteConnection>(&options, self.connect_timeout, || {
            format!("the sqlite database `{}`", options.get_filename().display())
        })
        .await?;
        let pool = SqlitePoolOptions::new()
            // A local file: a connection that was fine a moment ago still is.
            .test_before_acquire(false)
            .acquire_timeout(self.acquire_timeout)
            .connect_lazy_with(options);
        Ok(SqliteStore::new(pool))
    }
}

impl SqliteStore {
    /// Opens `sqlite://path/to/file.db` (or `sqlite:path`), creating the file when it is
    /// missing, in WAL mode with a busy timeout of [`DEFAULT_BUSY_TIMEOUT`] and the other
    /// defaults of [`builder`](Self::builder). Does not create the table: call
    /// [`migrate`](Self::migrate). A file that cannot be opened is an [`Error::Connect`]
    /// with SQLite's error as its source.
    pub async fn connect(url: &str) -> Result<SqliteStore, Error> {
        SqliteStore::builder().connect(url).await
    }

    /// Opens (creating when missing) the SQLite file at `path`, like [`connect`](Self::connect).
    pub async fn open(path: impl AsRef<Path>) -> Result<SqliteStore, Error> {
        SqliteStore::builder().open(path).await
    }

    /// Opens a pool with your options, after setting what the store relies on: the file is
    /// created when missing, the journal is WAL, and the busy timeout is
    /// [`DEFAULT_BUSY_TIMEOUT`].
    pub async fn connect_with(options: SqliteConnectOptions) -> Result<SqliteStore, Error> {
        SqliteStore::builder().connect_with(options).await
    }

    /// A builder, to choose the busy, acquire and connect timeouts.
    pub fn builder() -> SqliteStoreBuilder {
        SqliteStoreBuilder::default()
    }

    /// A store on your own pool, with the default table `idem_records`. Use WAL mode
    /// (`SqliteConnectOptions::journal_mode(Wal)`) and a busy timeout, or concurrent
    /// claims fail with "database is locked" instead of waiting their turn.
    pub fn new(pool: SqlitePool) -> SqliteStore {
        let table = TableName::parse(BACKEND, DEFAULT_TABLE, false)
            .expect("the default table name is valid");
        SqliteStore {
            pool,
            sql: Arc::new(Statements::new(&table)),
            table,
        }
    }

    /// Uses `table` instead of `idem_records`: an identifier (`[A-Za-z_][A-Za-z0-9_]*`, at
    /// most 48 bytes).
    pub fn with_table(mut self, table: &str) -> Result<SqliteStore, Error> {
        self.table = TableName::parse(BACKEND, table, false)?;
        self.sql = Arc::new(Statements::new(&self.table));
        Ok(self)
    }

    /// The pool.
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// The table name.
    pub fn table(&self) -> String {
        self.table.to_string()
    }

    /// Creates the table and its index when they are missing, and brings an older schema
    /// up to [`SCHEMA_VERSION`]. Safe to run from several connections or processes at once:
    /// it runs in one `BEGIN IMMEDIATE` transaction, which holds SQLite's write lock.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        let err = |e| self.error(e);
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await.map_err(err)?;
        let versions = self.table.quoted_with("_schema");
        sqlx::query(&format!(
            "CREATE TABLE IF NOT EXISTS {versions} (
                version INTEGER PRIMARY KEY,
                migrated_at INTEGER NOT NULL
            )"
        ))
        .execute(&mut *tx)
        .await
        .map_err(err)?;
        let current: i32 =
            sqlx::query_scalar(&format!("SELECT coalesce(max(version), 0) FROM {versions}"))
                .fetch_one(&mut *tx)
                .await
                .map_err(err)?;
        if current > SCHEMA_VERSION {
            return Err(StoreError::NotSetUp {
                backend: BACKEND,
                message: format!(
                    "the table `{}` has schema version {current}, newer than this build's {SCHEMA_VERSION}: \
                     upgrade idem before using it",
                    self.table
                ),
            });
        }
        for (version, statements) in migration_steps(&self.table) {
            if version <= current {
                continue;
            }
            for statement in statements {
                sqlx::query(&statement)
                    .execute(&mut *tx)
                    .await
                    .map_err(err)?;
            }
            sqlx::query(&format!(
                "INSERT INTO {versions} (version, migrated_at) VALUES (?1, {NOW_MS})"
            ))
            .bind(version)
            .execute(&mut *tx)
            .await
            .map_err(err)?;
            tracing::info!(target: "idem", table = %self.table, version, "migrated the sqlite store");
        }
        tx.commit().await.map_err(err)
    }

    /// Deletes records that have ended (expired results, leases ended and not taken over),
    /// at most `limit` per statement, statement after statement until none is left; returns
    /// how many it deleted. Each batch holds the write lock only for itself, so claims get
    /// their turn between batches.
    ///
    /// Ended records are never answered, so this only reclaims space: run it on a schedule.
    pub async fn purge_expired(&self, limit: u32) -> Result<u64, StoreError> {
        let limit = i64::from(limit.max(1));
        let mut total = 0;
        loop {
            let n = sqlx::query(&self.sql.purge)
                .bind(limit)
                .execute(&self.pool)
                .await
                .map_err(|e| self.error(e))?
                .rows_affected();
            total += n;
            if n < limit as u64 {
                return Ok(total);
            }
        }
    }

    fn error(&self, e: sqlx::Error) -> StoreError {
        store_error(BACKEND, &self.table, "SqliteStore::migrate()", classify, e)
    }

    async fn guarded(
        &self,
        sql: &str,
        key: &Key,
        token: Token,
        arg: Option<Bind>,
    ) -> Result<(), StoreError> {
        let mut q = sqlx::query(sql).bind(key.as_str()).bind(token_to_db(token));
        match arg {
            Some(Bind::Millis(ms)) => q = q.bind(ms),
            Some(Bind::Payload(p, ms)) => q = q.bind(p.to_vec()).bind(ms),
            None => {}
        }
        let done = q.execute(&self.pool).await.map_err(|e| self.error(e))?;
        if done.rows_affected() == 1 {
            Ok(())
        } else {
            Err(StoreError::Fenced)
        }
    }
}

enum Bind {
    Millis(i64),
    Payload(Bytes, i64),
}

fn classify(db: &dyn sqlx::error::DatabaseError) -> DbErrorKind {
    if db.message().starts_with("no such table") {
        return DbErrorKind::MissingTable;
    }
    // The primary result code is the low byte of the extended one.
    let code = db.code().and_then(|c| c.parse::<i32>().ok()).unwrap_or(0) & 0xff;
    match code {
        // SQLITE_BUSY, SQLITE_LOCKED: the busy timeout ran out.
        5 | 6 => DbErrorKind::Unavailable,
        // SQLITE_IOERR, SQLITE_CANTOPEN.
        10 | 14 => DbErrorKind::Unavailable,
        _ => DbErrorKind::Other,
    }
}

fn migration_steps(table: &TableName) -> Vec<(i32, Vec<String>)> {
    let t = table.quoted();
    vec![(
        1,
        vec![
            // `ends_at`: lease end or expiry, milliseconds since the Unix epoch on SQLite's
            // clock. `key` compares byte for byte (SQLite's default BINARY collation).
            format!(
                "CREATE TABLE IF NOT EXISTS {t} (
                    key TEXT PRIMARY KEY NOT NULL,
                    fingerprint BLOB NOT NULL,
                    token INTEGER NOT NULL,
                    completed INTEGER NOT NULL,
                    payload BLOB,
                    ends_at INTEGER NOT NULL
                )"
            ),
            format!(
                "CREATE INDEX IF NOT EXISTS {} ON {t} (ends_at)",
                table.bare_with("_ends_at")
            ),
        ],
    )]
}

/// The statements of one table, written once per store.
struct Statements {
    /// The record under `?1` with whether it is live: the first step of a claim, and all
    /// of a replay.
    read: String,
    /// Inserts an in-progress record under `?1` (fingerprint `?2`, lease `?3` ms, the
    /// caller's token `?4`), or takes over an ended one; answers the token, or no row when
    /// a live record is there.
    take: String,
    complete: String,
    release: String,
    /// Whether anything lives under `?1`, ended or not: after a release that deleted
    /// nothing, tells a repeat (no record) from a fenced release.
    exists: String,
    extend: String,
    get: String,
    delete: String,
    purge: String,
}

impl Statements {
    fn new(table: &TableName) -> Statements {
        let t = table.quoted();
        let held = format!("key = ?1 AND token = ?2 AND completed = 0 AND ends_at > {NOW_MS}");
        let columns =
            format!("completed, fingerprint, token, payload, ends_at - {NOW_MS} AS remaining_ms");
        Statements {
            read: format!("SELECT {columns}, ends_at > {NOW_MS} AS live FROM {t} WHERE key = ?1"),
            take: format!(
                "INSERT INTO {t} (key, fingerprint, token, completed, payload, ends_at)
                 VALUES (?1, ?2, ?4, 0, NULL, {NOW_MS} + ?3)
                 ON CONFLICT (key) DO UPDATE
                    SET fingerprint = excluded.fingerprint, token = excluded.token, completed = 0,
                        payload = NULL, ends_at = excluded.ends_at
                    WHERE {t}.ends_at <= {NOW_MS}
                 RETURNING token"
            ),
            // Also matches the record this token completed (a repeat), which it rewrites with
            // its own values, so the repeat answers like the first and changes nothing.
            complete: format!(
                "UPDATE {t} SET completed = 1,
                    payload = CASE WHEN completed = 1 THEN payload ELSE ?3 END,
                    ends_at = CASE WHEN completed = 1 THEN ends_at ELSE {NOW_MS} + ?4 END
                 WHERE key = ?1 AND token = ?2 AND ends_at > {NOW_MS}"
            ),
            release: format!("DELETE FROM {t} WHERE {held}"),
            exists: format!("SELECT EXISTS (SELECT 1 FROM {t} WHERE key = ?1)"),
            extend: format!("UPDATE {t} SET ends_at = {NOW_MS} + ?3 WHERE {held}"),
            get: format!("SELECT {columns} FROM {t} WHERE key = ?1 AND ends_at > {NOW_MS}"),
            delete: format!("DELETE FROM {t} WHERE key = ?1 RETURNING ends_at > {NOW_MS} AS live"),
            purge: format!(
                "DELETE FROM {t} WHERE rowid IN (SELECT rowid FROM {t} WHERE ends_at <= {NOW_MS} LIMIT ?1)"
            ),
        }
    }
}

fn live_row(row: &SqliteRow) -> Result<LiveRow, sqlx::Error> {
    Ok(LiveRow {
        completed: row.try_get("completed")?,
        fingerprint: row.try_get("fingerprint")?,
        token: row.try_get("token")?,
        payload: row.try_get("payload")?,
        remaining_ms: row.try_get("remaining_ms")?,
    })
}

#[async_trait]
impl Store for SqliteStore {
    async fn claim(
        &self,
        key: &Key,
        fingerprint: &Fingerprint,
        token: Token,
        lease: Duration,
    ) -> Result<Claim, StoreError> {
        for attempt in 1..=CLAIM_ATTEMPTS {
            let row = sqlx::query(&self.sql.read)
                .bind(key.as_str())
                .fetch_optional(&self.pool)
                .await
                .map_err(|e| self.error(e))?;
            let mut recovered = false;
            if let Some(row) = row {
                let live: bool = row.try_get("live").map_err(|e| self.error(e))?;
                let record = live_row(&row).map_err(|e| self.error(e))?;
                if live && !record.completed && record.token == token_to_db(token) {
                    // This claim, resent: the same claim, left as it is.
                    return Ok(Claim::Acquired {
                        token,
                        recovered: false,
                    });
                }
                if live {
                    return record.into_claim(BACKEND);
                }
                recovered = !record.completed;
            }
            let taken: Option<i64> = sqlx::query_scalar(&self.sql.take)
                .bind(key.as_str())
                .bind(&fingerprint.as_bytes()[..])
                .bind(millis(lease))
                .bind(token_to_db(token))
                .fetch_optional(&self.pool)
                .await
                .map_err(|e| self.error(e))?;
            match taken {
                Some(taken) => {
                    return Ok(Claim::Acquired {
                        token: token_from_db(taken),
                        recovered,
                    })
                }
                None => {
                    tracing::debug!(target: "idem", key = %key, attempt, "claim raced a concurrent claim; reading again")
                }
            }
        }
        Err(StoreError::Backend {
            backend: BACKEND,
            source: Box::new(NoAnswer {
                attempts: CLAIM_ATTEMPTS,
            }),
        })
    }

    async fn complete(
        &self,
        key: &Key,
        token: Token,
        payload: Bytes,
        ttl: Duration,
    ) -> Result<(), StoreError> {
        self.guarded(
            &self.sql.complete,
            key,
            token,
            Some(Bind::Payload(payload, millis(ttl))),
        )
        .await
    }

    async fn release(&self, key: &Key, token: Token) -> Result<(), StoreError> {
        match self.guarded(&self.sql.release, key, token, None).await {
            Err(StoreError::Fenced) => {
                // A second statement only on this rare path; a record written in between
                // belongs to another claim, which this release must not touch either way.
                let exists: bool = sqlx::query_scalar(&self.sql.exists)
                    .bind(key.as_str())
                    .fetch_one(&self.pool)
                    .await
                    .map_err(|e| self.error(e))?;
                if exists {
                    Err(StoreError::Fenced)
                } else {
                    Ok(())
                }
            }
            other => other,
        }
    }

    async fn extend(&self, key: &Key, token: Token, lease: Duration) -> Result<(), StoreError> {
        self.guarded(
            &self.sql.extend,
            key,
            token,
            Some(Bind::Millis(millis(lease))),
        )
        .await
    }

    async fn get(&self, key: &Key) -> Result<Option<Record>, StoreError> {
        let row = sqlx::query(&self.sql.get)
            .bind(key.as_str())
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| self.error(e))?;
        match row {
            None => Ok(None),
            Some(row) => live_row(&row)
                .map_err(|e| self.error(e))?
                .into_record(BACKEND)
                .map(Some),
        }
    }

    async fn delete(&self, key: &Key) -> Result<bool, StoreError> {
        let live: Option<bool> = sqlx::query_scalar(&self.sql.delete)
            .bind(key.as_str())
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| self.error(e))?;
        Ok(live.unwrap_or(false))
    }

    fn backend(&self) -> &'static str {
        BACKEND
    }
}
