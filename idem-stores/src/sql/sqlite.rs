//! `SqliteStore`: records in one SQLite table in a file, in WAL mode; the persistent store
//! for a single process or a few on one machine.
//!
//! A claim reads the record first (`read`, no write lock), so a replay never waits for a
//! writer. Only without a live record does it run the upsert (`take`), one statement that
//! SQLite runs under its write lock and that inserts, or takes over an ended record, or,
//! when another claim got there first, answers with no row, after which the claim reads
//! again.

use std::path::Path;
use std::time::Duration;

use async_trait::async_trait;
use idem_core::{Claim, Error, Key, StoreError};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqliteQueryResult};
use sqlx::Sqlite;

use super::dialect::{Arg, ClaimRequest, Col, Dialect, Driver, Migration, Sql, Statements};
use super::{
    fence_from_db, token_from_db, token_to_db, DbErrorKind, NoAnswer, SqlStore, SqlStoreBuilder,
    TableName, CLAIM_ATTEMPTS,
};

/// How long a statement waits for another connection's (or process's) write lock. Below
/// the engine's default step timeout (5 s), so that a lock held elsewhere ends the step with
/// SQLite's own "database is locked" (a temporary failure) rather than the engine's
/// timeout; a write under the lock is one short statement, so a turn rarely takes long.
pub const DEFAULT_BUSY_TIMEOUT: Duration = Duration::from_secs(2);

/// The database's clock in milliseconds since the Unix epoch.
pub(crate) const NOW_MS: &str = "CAST(unixepoch('subsec') * 1000 AS INTEGER)";

/// The clock fences start from, in microseconds since the Unix epoch: this process's
/// clock, which is the one SQLite reads too (the database is a local file), finer than the
/// milliseconds SQLite's own `'now'` keeps. Claims of one key released and made again
/// within one millisecond still get increasing fences from it.
fn clock_us() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
}

/// Idempotency records in a SQLite file (table `idem_records` by default), on a sqlx
/// [`SqlitePool`](sqlx::SqlitePool): the generic [`SqlStore`] in the SQLite dialect.
///
/// Correct with many tasks of one process and with several processes on one file: every
/// write is one statement under SQLite's write lock, and a replay is one read that no
/// writer blocks (WAL). Times are SQLite's clock (`unixepoch('subsec')`); fences start
/// from this process's clock in microseconds (SQLite's keeps milliseconds).
///
/// Opening creates the file when it is missing (not its directory: a missing directory is
/// an [`Error::Connect`] that says so) and the table; a store on your pool
/// ([`new`](SqlStore::new)) needs [`migrate`](SqlStore::migrate) once.
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use idem::stores::SqliteStore;
/// let store = SqliteStore::open("idem.db").await?; // file and table created when missing
/// let idem = idem::Idem::new(store);
/// # Ok(()) }
/// ```
pub type SqliteStore = SqlStore<Sqlite>;

/// Options of a [`SqliteStore`] that opens its own pool: the generic [`SqlStoreBuilder`]
/// in the SQLite dialect, with [`busy_timeout`](SqlStoreBuilder::busy_timeout).
pub type SqliteStoreBuilder = SqlStoreBuilder<Sqlite>;

/// What the SQLite builder adds to the shared options.
#[derive(Debug, Clone)]
pub struct SqliteSettings {
    busy_timeout: Duration,
}

impl Default for SqliteSettings {
    fn default() -> Self {
        SqliteSettings {
            busy_timeout: DEFAULT_BUSY_TIMEOUT,
        }
    }
}

impl SqlStoreBuilder<Sqlite> {
    /// How long a statement waits for another connection's write lock before it fails
    /// with "database is locked" (default [`DEFAULT_BUSY_TIMEOUT`], 2 s). Keep it below the
    /// engine's step timeout.
    pub fn busy_timeout(mut self, timeout: Duration) -> Self {
        self.settings.busy_timeout = timeout;
        self
    }

    /// Opens the SQLite file at `path`, creating the file (not its directory) and the
    /// table when they are missing.
    pub async fn open(self, path: impl AsRef<Path>) -> Result<SqliteStore, Error> {
        self.connect_with(SqliteConnectOptions::new().filename(path))
            .await
    }
}

impl SqlStore<Sqlite> {
    /// Opens the SQLite file at `path`, like [`connect`](Self::connect) with a URL.
    pub async fn open(path: impl AsRef<Path>) -> Result<SqliteStore, Error> {
        SqliteStore::builder().open(path).await
    }
}

#[async_trait]
impl Dialect for Sqlite {
    const BACKEND: &'static str = "sqlite";
    const STORE: &'static str = "SqliteStore";
    const SCHEMES: &'static [&'static str] = &["sqlite"];
    const BARE_PATHS: bool = true;
    type Settings = SqliteSettings;

    /// The statements of one table. The claim is two: `read`, the record under `?1` with
    /// whether it is live (the first step of a claim, and all of a replay); and `take`, which
    /// inserts an in-progress record under `?1` (fingerprint `?2`, lease `?3` ms, the caller's
    /// token `?4`, the clock in microseconds `?5`) or takes over an ended one, and answers
    /// the token and the fence, or no row when a live record is there. The fence is `?5`
    /// for a new row and `max(fence + 1, ?5)` for a takeover.
    fn statements(table: &TableName, _settings: &Self::Settings) -> Statements {
        let t = table.quoted();
        let held = format!("key = ?1 AND token = ?2 AND completed = 0 AND ends_at > {NOW_MS}");
        let swappable =
            format!("key = ?1 AND completed <> 0 AND ends_at > {NOW_MS} AND payload = ?2");
        let columns =
            format!("completed, fingerprint, token, payload, ends_at - {NOW_MS} AS remaining_ms");
        Statements {
            claim: vec![
                Sql::numbered(format!("SELECT {columns}, fence, ends_at > {NOW_MS} AS live FROM {t} WHERE key = ?1")),
                Sql::numbered(format!(
                    "INSERT INTO {t} (key, fingerprint, token, completed, payload, ends_at, fence)
                     VALUES (?1, ?2, ?4, 0, NULL, {NOW_MS} + ?3, ?5)
                     ON CONFLICT (key) DO UPDATE
                        SET fingerprint = excluded.fingerprint, token = excluded.token, completed = 0,
                            payload = NULL, ends_at = excluded.ends_at,
                            fence = max({t}.fence + 1, excluded.fence)
                        WHERE {t}.ends_at <= {NOW_MS}
                     RETURNING token, fence"
                )),
            ],
            // Also matches the record this token completed (a repeat), which it rewrites with
            // its own values, so the repeat answers like the first and changes nothing.
            complete: Sql::numbered(format!(
                "UPDATE {t} SET completed = 1,
                    payload = CASE WHEN completed = 1 THEN payload ELSE ?3 END,
                    ends_at = CASE WHEN completed = 1 THEN ends_at ELSE {NOW_MS} + ?4 END
                 WHERE key = ?1 AND token = ?2 AND ends_at > {NOW_MS}"
            )),
            release: Sql::numbered(format!("DELETE FROM {t} WHERE {held}")),
            exists: Sql::numbered(format!("SELECT 1 FROM {t} WHERE key = ?1")),
            extend: Sql::numbered(format!("UPDATE {t} SET ends_at = {NOW_MS} + ?3 WHERE {held}")),
            get: Sql::numbered(format!("SELECT {columns} FROM {t} WHERE key = ?1 AND ends_at > {NOW_MS}")),
            delete: Sql::numbered(format!("DELETE FROM {t} WHERE key = ?1 AND ends_at > {NOW_MS}")),
            delete_ended: Sql::numbered(format!(
                "DELETE FROM {t} WHERE key = ?1 AND ends_at <= {NOW_MS}"
            )),
            delete_seen: Sql::numbered(format!(
                "DELETE FROM {t} WHERE key = ?1 AND token = ?2 AND ends_at > {NOW_MS}"
            )),
            // Only a live completed record holding the expected payload, under the write
            // lock (a BLOB compared byte for byte).
            replace: Sql::numbered(format!(
                "UPDATE {t} SET payload = ?3, ends_at = {NOW_MS} + ?4 WHERE {swappable}"
            )),
            replace_delete: Sql::numbered(format!("DELETE FROM {t} WHERE {swappable}")),
            count_ended: Sql::numbered(format!(
                "SELECT count(*) AS n FROM {t} WHERE ends_at <= {NOW_MS}"
            )),
            // The time is read once per statement (SQLite keeps it for the whole step).
            stats: Sql::numbered(format!(
                "SELECT coalesce(sum(ends_at > {NOW_MS} AND completed = 0), 0) AS in_progress,
                        coalesce(sum(ends_at > {NOW_MS} AND completed <> 0), 0) AS completed,
                        coalesce(sum(ends_at <= {NOW_MS}), 0) AS ended
                 FROM {t}"
            )),
            purge: Sql::numbered(format!(
                "DELETE FROM {t} WHERE rowid IN (SELECT rowid FROM {t} WHERE ends_at <= {NOW_MS} LIMIT ?1)"
            )),
        }
    }

    fn migration(table: &TableName, _lock_timeout: Duration) -> Migration {
        let versions = table.quoted_with("_schema");
        Migration {
            // Takes SQLite's write lock for the whole migration.
            // Takes it within the busy timeout, or fails with `database is locked`.
            lock: vec!["BEGIN IMMEDIATE".into()],
            acquire: None,
            commit: vec!["COMMIT".into()],
            abort: vec!["ROLLBACK".into()],
            create_versions: format!(
                "CREATE TABLE IF NOT EXISTS {versions} (
                    version INTEGER PRIMARY KEY,
                    migrated_at INTEGER NOT NULL
                )"
            ),
            current_version: format!("SELECT coalesce(max(version), 0) FROM {versions}"),
            record_version: format!(
                "INSERT INTO {versions} (version, migrated_at) VALUES ({{version}}, {NOW_MS})"
            ),
            // The schema, one version at a time: each entry brings the table from the
            // previous version to this one. Never edit a released step; add the next.
            steps: {
                let t = table.quoted();
                let version_1 = vec![
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
                ];
                // The claim's fence (`Fence`): rows written before it read as 0, and the
                // next claim of their key takes `max(0 + 1, clock)`.
                let version_2 = vec![format!(
                    "ALTER TABLE {t} ADD COLUMN fence INTEGER NOT NULL DEFAULT 0"
                )];
                vec![(1, version_1), (2, version_2)]
            },
        }
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

    fn key(key: &Key) -> Arg {
        // TEXT holds NUL and compares byte for byte: the key as it is.
        Arg::Text(key.as_str().to_owned())
    }

    fn rows_affected(done: &SqliteQueryResult) -> u64 {
        done.rows_affected()
    }

    /// The file is created when missing, the journal is WAL, and the busy timeout is the
    /// builder's.
    fn prepare(options: SqliteConnectOptions, settings: &SqliteSettings) -> SqliteConnectOptions {
        options
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .busy_timeout(settings.busy_timeout)
    }

    fn describe(options: &SqliteConnectOptions) -> String {
        format!("the sqlite database `{}`", options.get_filename().display())
    }

    /// SQLite says only "unable to open database file"; a missing directory is the usual
    /// cause, and idem creates the file but not its directories.
    fn explain_connect_error(options: &SqliteConnectOptions, e: Error) -> Error {
        let path = options.get_filename();
        let dir = match path.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir,
            _ => return e,
        };
        if path.to_str().is_some_and(|p| p == ":memory:") || dir.is_dir() {
            return e;
        }
        match e {
            Error::Connect { source, .. } => Error::Connect {
                message: format!(
                    "cannot open the sqlite database `{}`: its directory `{}` does not exist \
                     (idem creates the database file, not its directories)",
                    path.display(),
                    dir.display()
                ),
                source,
            },
            other => other,
        }
    }

    async fn claim(store: &SqliteStore, request: ClaimRequest<'_>) -> Result<Claim, StoreError> {
        let ClaimRequest { key, token, .. } = request;
        let err = |e| store.error(e);
        let [read, take] = &store.statements().claim[..] else {
            unreachable!("the sqlite claim is a read and a take")
        };
        for attempt in 1..=CLAIM_ATTEMPTS {
            let row = Sqlite::fetch_optional(store.pool(), read, vec![Sqlite::key(key)])
                .await
                .map_err(err)?;
            let mut recovered = false;
            if let Some(row) = row {
                let live = Sqlite::flag(&row, Col::Name("live")).map_err(err)?;
                let completed = Sqlite::flag(&row, Col::Name("completed")).map_err(err)?;
                let record = store.live_row(&row, completed)?;
                if live && !completed && record.token == token_to_db(token) {
                    // This claim, resent: the same claim, left as it is.
                    let fence = Sqlite::int(&row, Col::Name("fence")).map_err(err)?;
                    return Ok(Claim::Acquired {
                        token,
                        recovered: false,
                        fence: fence_from_db(fence),
                    });
                }
                if live {
                    return record.into_claim(Self::BACKEND);
                }
                recovered = !completed;
            }
            let mut args = request.args::<Sqlite>();
            args.push(Arg::Int(clock_us()));
            let taken = Sqlite::fetch_optional(store.pool(), take, args)
                .await
                .map_err(err)?;
            match taken {
                Some(row) => {
                    return Ok(Claim::Acquired {
                        token: token_from_db(Sqlite::int(&row, Col::Name("token")).map_err(err)?),
                        recovered,
                        fence: fence_from_db(Sqlite::int(&row, Col::Name("fence")).map_err(err)?),
                    })
                }
                None => {
                    tracing::debug!(target: "idem", key = %key, attempt, "claim raced a concurrent claim; reading again")
                }
            }
        }
        Err(NoAnswer::error(Self::BACKEND))
    }
}
