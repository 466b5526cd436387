//! `PostgresStore`: records in one Postgres table, each store step one statement, time
//! from the database's clock.
//!
//! The claim statement (`claim_sql`) reads the record first in a CTE and writes only when
//! no live record exists, so a replay is a plain indexed read: no row lock, no write, no WAL.
//! When a concurrent claim commits the row after the statement's snapshot, the statement
//! answers with no row; the store then runs it once more.
//!
//! Keys are stored through `stored_key`, which percent-encodes `%` and NUL: Postgres text
//! cannot hold NUL, and every key `Key::new` accepts must work here.

use std::borrow::Cow;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use idem_core::{Claim, Error, Fingerprint, Key, Record, Store, StoreError, Token};
use sqlx::postgres::{PgConnectOptions, PgConnection, PgPool, PgPoolOptions, PgRow};
use sqlx::Row;

use super::{
    millis, probe, store_error, token_from_db, token_to_db, DbErrorKind, LiveRow, NoAnswer,
    TableName, CLAIM_ATTEMPTS, DEFAULT_TABLE,
};
pub use super::{DEFAULT_ACQUIRE_TIMEOUT, DEFAULT_CONNECT_TIMEOUT};

const BACKEND: &str = "postgres";

/// The schema version this build creates and reads. Each later version adds one step to
/// `migration_steps`.
pub const SCHEMA_VERSION: i32 = 1;

/// Idempotency records in a Postgres table (default `idem_records`), on a sqlx [`PgPool`].
///
/// Every step is one statement and one round trip: a first call costs 2 (claim, complete),
/// a replay 1 (the claim answers with the stored result). Leases and expiry run on the
/// database's clock (`now()`), never the client's.
///
/// Create the table once with [`migrate`](PostgresStore::migrate) (safe to run from many
/// processes at once; [`connect`](crate::connect) runs it), and call
/// [`purge_expired`](PostgresStore::purge_expired) on a schedule.
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use idem_stores::PostgresStore;
/// let store = PostgresStore::connect("postgres://app@localhost/app").await?;
/// store.migrate().await?;
/// let idem = idem_core::Idem::new(store);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct PostgresStore {
    pool: PgPool,
    table: TableName,
    sql: Arc<Statements>,
}

impl std::fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresStore")
            .field("table", &self.table)
            .field("pool_size", &self.pool.size())
            .finish()
    }
}

/// Options of a [`PostgresStore`] that opens its own pool: how long to wait for the server.
///
/// ```no_run
/// # use std::time::Duration;
/// # async fn demo() -> Result<(), idem_core::Error> {
/// let store = idem_stores::PostgresStore::builder()
///     .connect_timeout(Duration::from_secs(2))
///     .acquire_timeout(Duration::from_secs(1))
///     .connect("postgres://app@localhost/app")
///     .await?;
/// # let _ = store; Ok(()) }
/// ```
#[derive(Debug, Clone)]
#[must_use]
pub struct PostgresStoreBuilder {
    acquire_timeout: Duration,
    connect_timeout: Duration,
}

impl Default for PostgresStoreBuilder {
    fn default() -> Self {
        PostgresStoreBuilder {
            acquire_timeout: DEFAULT_ACQUIRE_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
        }
    }
}

impl PostgresStoreBuilder {
    /// The longest wait for a connection from the pool, opening a new one included
    /// (default 3 s). Keep it at or below the engine's step timeout
    /// ([`IdemBuilder::step_timeout`](idem_core::IdemBuilder::step_timeout), default 5 s):
    /// a step then fails with the pool's own error rather than the engine's timeout.
    pub fn acquire_timeout(mut self, timeout: Duration) -> Self {
        self.acquire_timeout = timeout.max(Duration::from_millis(1));
        self
    }

    /// The longest wait for the first connection when the store connects (default 3 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout.max(Duration::from_millis(1));
        self
    }

    /// Opens a pool on `url` (`postgres://user:password@host:port/database?...`). See
    /// [`PostgresStore::connect`].
    pub async fn connect(self, url: &str) -> Result<PostgresStore, Error> {
        let options = PgConnectOptions::from_str(url).map_err(|e| Error::Connect {
            message: "invalid postgres URL".into(),
            source: Some(Box::new(e)),
        })?;
        self.connect_with(options).await
    }

    /// Opens a pool with your connect options. See [`PostgresStore::connect`].
    pub async fn connect_with(self, options: PgConnectOptions) -> Result<PostgresStore, Error> {
        probe::<PgConnection>(&options, self.connect_timeout, || {
            format!(
                "postgres at {}:{} (database `{}`)",
                options.get_host(),
                options.get_port(),
                options.get_database().unwrap_or("default")
            )
        })
        .await?;
        let pool = PgPoolOptions::new()
            .test_before_acquire(false)
            .acquire_timeout(self.acquire_timeout)
            .connect_lazy_with(options);
        Ok(PostgresStore::new(pool))
    }
}

impl PostgresStore {
    /// Opens a pool on `url` (`postgres://user:password@host:port/database?...`) with the
    /// default timeouts ([`builder`](Self::builder) to choose them). Does not create the
    /// table: call [`migrate`](Self::migrate).
    ///
    /// It connects once first, so a wrong URL or a server that is down shows at startup:
    /// within the connect timeout (3 s), as an [`Error::Connect`] whose source chain holds
    /// the cause (connection refused, authentication failed, ...). The pool waits at most
    /// the acquire timeout (3 s) for a connection.
    ///
    /// The pool does not ping a connection before each statement (sqlx's
    /// `test_before_acquire`), which would cost a second round trip per step; a connection
    /// that died is noticed by the statement, which fails (the body does not run) and the
    /// pool replaces it.
    pub async fn connect(url: &str) -> Result<PostgresStore, Error> {
        PostgresStore::builder().connect(url).await
    }

    /// A builder, to choose the connect and acquire timeouts.
    pub fn builder() -> PostgresStoreBuilder {
        PostgresStoreBuilder::default()
    }

    /// A store on your own pool, with the default table `idem_records`.
    ///
    /// sqlx pools ping each connection before lending it out unless built with
    /// `PgPoolOptions::test_before_acquire(false)`; that ping is one more round trip before
    /// every step. sqlx's default acquire timeout is 30 s: set `acquire_timeout` at or
    /// below the engine's step timeout.
    pub fn new(pool: PgPool) -> PostgresStore {
        let table = TableName::parse(BACKEND, DEFAULT_TABLE, true)
            .expect("the default table name is valid");
        PostgresStore {
            pool,
            sql: Arc::new(Statements::new(&table)),
            table,
        }
    }

    /// Uses `table` instead of `idem_records`: an identifier (`[A-Za-z_][A-Za-z0-9_]*`, at
    /// most 48 bytes), optionally schema-qualified (`idem.records`). The schema must exist.
    pub fn with_table(mut self, table: &str) -> Result<PostgresStore, Error> {
        self.table = TableName::parse(BACKEND, table, true)?;
        self.sql = Arc::new(Statements::new(&self.table));
        Ok(self)
    }

    /// The pool.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The table name, as given.
    pub fn table(&self) -> String {
        self.table.to_string()
    }

    /// Creates the table and its index when they are missing, and brings an older schema up
    /// to [`SCHEMA_VERSION`].
    ///
    /// Safe to run from several processes at once: one transaction under an advisory lock
    /// named after the table does the work, the others wait for it and then find nothing to
    /// do. Fails when the table was migrated by a newer version of this crate.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        let err = |e| self.error(e);
        let mut tx = self.pool.begin().await.map_err(err)?;
        sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))")
            .bind(format!("idem.migrate:{}", self.table))
            .execute(&mut *tx)
            .await
            .map_err(err)?;
        let versions = self.table.quoted_with("_schema");
        sqlx::query(&format!(
            "CREATE TABLE IF NOT EXISTS {versions} (
                version integer PRIMARY KEY,
                migrated_at timestamptz NOT NULL DEFAULT now()
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
            sqlx::query(&format!("INSERT INTO {versions} (version) VALUES ($1)"))
                .bind(version)
                .execute(&mut *tx)
                .await
                .map_err(err)?;
            tracing::info!(target: "idem", table = %self.table, version, "migrated the postgres store");
        }
        tx.commit().await.map_err(err)
    }

    /// Deletes records that have ended (expired results, leases ended and not taken over),
    /// at most `limit` per statement, statement after statement until none is left; returns
    /// how many it deleted. Each batch is its own short transaction and skips rows that a
    /// claim holds locked, so a large table is cleaned without one long lock.
    ///
    /// Ended records are never answered, so this only reclaims space: run it on a schedule
    /// (every few minutes, from one process or several).
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
        store_error(
            BACKEND,
            &self.table,
            "PostgresStore::migrate()",
            classify,
            e,
        )
    }

    async fn guarded(
        &self,
        sql: &str,
        key: &Key,
        token: Token,
        arg: Bind,
    ) -> Result<(), StoreError> {
        let mut q = sqlx::query(sql)
            .bind(stored_key(key))
            .bind(token_to_db(token));
        match arg {
            Bind::Millis(ms) => q = q.bind(ms),
            Bind::Payload(p, ms) => q = q.bind(p.to_vec()).bind(ms),
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
    let code = db.code();
    let code = code.as_deref().unwrap_or("");
    match code {
        // undefined_table.
        "42P01" => DbErrorKind::MissingTable,
        // admin_shutdown, crash_shutdown, cannot_connect_now, too_many_connections.
        "57P01" | "57P02" | "57P03" | "53300" => DbErrorKind::Unavailable,
        // connection_exception class.
        c if c.starts_with("08") => DbErrorKind::Unavailable,
        _ => DbErrorKind::Other,
    }
}

/// The schema, one version at a time: each entry's statements bring the table from the
/// previous version to this one. Never edit a released step; add the next.
fn migration_steps(table: &TableName) -> Vec<(i32, Vec<String>)> {
    let t = table.quoted();
    vec![(
        1,
        vec![
            // `key` is `scope/id`, compared byte for byte ("C"), so keys that differ only in
            // case or normalisation stay apart and lookups skip locale rules.
            format!(
                "CREATE TABLE IF NOT EXISTS {t} (
                    key text COLLATE \"C\" PRIMARY KEY,
                    fingerprint bytea NOT NULL,
                    token bigint NOT NULL,
                    completed boolean NOT NULL,
                    payload bytea,
                    ends_at timestamptz NOT NULL
                )"
            ),
            // For purge_expired.
            format!("CREATE INDEX IF NOT EXISTS {} ON {t} (ends_at)", table.bare_with("_ends_at")),
            // No token sequence: claims bring their own token (`Store::claim`). A table made
            // by an earlier build of this step has an unused `<table>_token_seq`, left alone;
            // the table itself is the same, so both are schema version 1.
            format!(
                "COMMENT ON TABLE {t} IS 'idempotency records of idem: one row per key, an in-progress claim \
                 (completed = false, ends_at = lease end) or a stored result (ends_at = expiry)'"
            ),
        ],
    )]
}

/// The statements of one table, written once per store.
struct Statements {
    claim: String,
    complete: String,
    /// Answers whether the release deleted the held record or found no record at all.
    release: String,
    extend: String,
    get: String,
    delete: String,
    purge: String,
}

/// The key column's value for `key`: `scope/id` with `%` written `%25` and NUL written
/// `%00`.
///
/// Postgres text cannot hold NUL (`invalid byte sequence for encoding "UTF8": 0x00`), yet
/// `Key::new` accepts it, so NUL is escaped; escaping the escape character as well keeps the
/// mapping one-to-one, so `a\0b`, `a%00b` and `a` stay three keys. Nothing is decoded back:
/// the column is only compared with values made here.
fn stored_key(key: &Key) -> Cow<'_, str> {
    let key = key.as_str();
    if !key.contains(['%', '\0']) {
        return Cow::Borrowed(key);
    }
    let mut out = String::with_capacity(key.len() + 8);
    for c in key.chars() {
        match c {
            '%' => out.push_str("%25"),
            '\0' => out.push_str("%00"),
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// The claim statement: `$1` key, `$2` fingerprint, `$3` lease in milliseconds, `$4` the
/// caller's token.
///
/// `cur` reads the record (no lock). Only when it sees no live record does `taken` insert,
/// or take over an ended record through `ON CONFLICT ... DO UPDATE ... WHERE <ended>`,
/// which re-checks the end on the newest row version. The answer is one row: `state` 0 =
/// acquired (`token`, `recovered`), 1 = in progress, 2 = completed (`payload`); or no row
/// when a concurrent claim committed after this statement's snapshot. A live claim held by
/// `$4` is this claim resent: state 0, not recovered, and nothing written.
///
/// The new lease runs from `clock_timestamp()`, the time the row is written, so a statement
/// that waited on a lock does not hand out a shorter lease; checks use `now()`.
fn claim_sql(t: &str) -> String {
    format!(
        "WITH cur AS (
            SELECT completed, fingerprint, token, payload, ends_at, ends_at > now() AS live
            FROM {t} WHERE key = $1
        ),
        taken AS (
            INSERT INTO {t} AS r (key, fingerprint, token, completed, payload, ends_at)
            SELECT $1, $2, $4, false, NULL, clock_timestamp() + $3 * interval '1 millisecond'
            WHERE NOT EXISTS (SELECT 1 FROM cur WHERE live)
            ON CONFLICT (key) DO UPDATE
                SET fingerprint = excluded.fingerprint, token = excluded.token, completed = false,
                    payload = NULL, ends_at = excluded.ends_at
                WHERE r.ends_at <= now()
            RETURNING r.token
        )
        SELECT 0::int2 AS state, token, NULL::bytea AS fingerprint, NULL::bytea AS payload,
               0::int8 AS remaining_ms, EXISTS (SELECT 1 FROM cur WHERE NOT completed) AS recovered
        FROM taken
        UNION ALL
        SELECT CASE WHEN completed THEN 2 WHEN token = $4 THEN 0 ELSE 1 END::int2, token,
               fingerprint, payload, {remaining}, false
        FROM cur WHERE live",
        remaining = REMAINING_MS,
    )
}

/// Milliseconds until `ends_at`, rounded up, as the database sees it.
const REMAINING_MS: &str = "ceil(extract(epoch FROM ends_at - now()) * 1000)::int8";

impl Statements {
    fn new(table: &TableName) -> Statements {
        let t = table.quoted();
        // Only the holder of the current token, while its lease runs, may touch a claim.
        let held = "key = $1 AND token = $2 AND NOT completed AND ends_at > now()";
        Statements {
            claim: claim_sql(&t),
            // Also matches the record this token completed (a repeat), which it rewrites
            // with its own values: one statement, and a repeat that waited on the row lock
            // of its original still finds the completed row.
            complete: format!(
                "UPDATE {t} SET completed = true,
                    payload = CASE WHEN completed THEN payload ELSE $3 END,
                    ends_at = CASE WHEN completed THEN ends_at
                                   ELSE clock_timestamp() + $4 * interval '1 millisecond' END
                 WHERE key = $1 AND token = $2 AND ends_at > now()"
            ),
            // The outer SELECT sees the row as it was before the DELETE (one snapshot), so
            // "no row" means there was none to begin with: a repeat.
            release: format!(
                "WITH gone AS (DELETE FROM {t} WHERE {held} RETURNING 1)
                 SELECT EXISTS (SELECT 1 FROM gone) OR NOT EXISTS (SELECT 1 FROM {t} WHERE key = $1)"
            ),
            extend: format!(
                "UPDATE {t} SET ends_at = clock_timestamp() + $3 * interval '1 millisecond' WHERE {held}"
            ),
            get: format!(
                "SELECT completed, fingerprint, token, payload, {REMAINING_MS} AS remaining_ms
                 FROM {t} WHERE key = $1 AND ends_at > now()"
            ),
            delete: format!("DELETE FROM {t} WHERE key = $1 RETURNING ends_at > now() AS live"),
            purge: format!(
                "DELETE FROM {t} WHERE key IN (
                    SELECT key FROM {t} WHERE ends_at <= now() LIMIT $1 FOR UPDATE SKIP LOCKED
                 ) AND ends_at <= now()"
            ),
        }
    }
}

fn live_row(row: &PgRow) -> Result<LiveRow, sqlx::Error> {
    Ok(LiveRow {
        completed: row.try_get("completed")?,
        fingerprint: row.try_get("fingerprint")?,
        token: row.try_get("token")?,
        payload: row.try_get("payload")?,
        remaining_ms: row.try_get("remaining_ms")?,
    })
}

#[async_trait]
impl Store for PostgresStore {
    async fn claim(
        &self,
        key: &Key,
        fingerprint: &Fingerprint,
        token: Token,
        lease: Duration,
    ) -> Result<Claim, StoreError> {
        for attempt in 1..=CLAIM_ATTEMPTS {
            let row = sqlx::query(&self.sql.claim)
                .bind(stored_key(key))
                .bind(&fingerprint.as_bytes()[..])
                .bind(millis(lease))
                .bind(token_to_db(token))
                .fetch_optional(&self.pool)
                .await
                .map_err(|e| self.error(e))?;
            let Some(row) = row else {
                tracing::debug!(target: "idem", key = %key, attempt, "claim raced a concurrent claim; running it again");
                continue;
            };
            let state: i16 = row.try_get("state").map_err(|e| self.error(e))?;
            if state == 0 {
                return Ok(Claim::Acquired {
                    token: token_from_db(row.try_get("token").map_err(|e| self.error(e))?),
                    recovered: row.try_get("recovered").map_err(|e| self.error(e))?,
                });
            }
            let live = LiveRow {
                completed: state == 2,
                fingerprint: row.try_get("fingerprint").map_err(|e| self.error(e))?,
                token: row.try_get("token").map_err(|e| self.error(e))?,
                payload: row.try_get("payload").map_err(|e| self.error(e))?,
                remaining_ms: row.try_get("remaining_ms").map_err(|e| self.error(e))?,
            };
            return live.into_claim(BACKEND);
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
            Bind::Payload(payload, millis(ttl)),
        )
        .await
    }

    async fn release(&self, key: &Key, token: Token) -> Result<(), StoreError> {
        let done: bool = sqlx::query_scalar(&self.sql.release)
            .bind(stored_key(key))
            .bind(token_to_db(token))
            .fetch_one(&self.pool)
            .await
            .map_err(|e| self.error(e))?;
        if done {
            Ok(())
        } else {
            Err(StoreError::Fenced)
        }
    }

    async fn extend(&self, key: &Key, token: Token, lease: Duration) -> Result<(), StoreError> {
        self.guarded(&self.sql.extend, key, token, Bind::Millis(millis(lease)))
            .await
    }

    async fn get(&self, key: &Key) -> Result<Option<Record>, StoreError> {
        let row = sqlx::query(&self.sql.get)
            .bind(stored_key(key))
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
            .bind(stored_key(key))
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| self.error(e))?;
        Ok(live.unwrap_or(false))
    }

    fn backend(&self) -> &'static str {
        BACKEND
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_keys_are_one_to_one_and_hold_no_nul() {
        let ids = [
            "a",
            "a\0b",
            "a%00b",
            "a%2500b",
            "a%b",
            "a%25b",
            "a%",
            "a%25",
            "%",
            "%25",
            "%2525",
            "\0",
            "\0\0",
            "%00",
            "%0000",
            "%00%00",
            "\0%",
            "%\0",
            "a\u{1}b",
            "a\u{7f}b",
            "日本\0語",
        ];
        let stored: Vec<String> = ids
            .iter()
            .map(|id| stored_key(&Key::new("s", id).unwrap()).into_owned())
            .collect();
        for (i, a) in stored.iter().enumerate() {
            assert!(
                !a.contains('\0'),
                "{:?} is stored with a NUL: {a:?}",
                ids[i]
            );
            for (j, b) in stored.iter().enumerate().skip(i + 1) {
                assert_ne!(a, b, "{:?} and {:?} share a stored key", ids[i], ids[j]);
            }
        }
        assert_eq!(stored[0], "s/a");
        assert_eq!(stored[1], "s/a%00b");
        assert_eq!(stored[2], "s/a%2500b");
    }

    #[test]
    fn stored_keys_decode_back_to_the_key() {
        // One-to-one for every id, not only those listed above: the encoding has an exact
        // inverse (which the store never needs, since it only compares).
        fn decode(s: &str) -> String {
            let mut out = String::new();
            let mut rest = s;
            while let Some(i) = rest.find('%') {
                out.push_str(&rest[..i]);
                match &rest[i + 1..i + 3] {
                    "25" => out.push('%'),
                    "00" => out.push('\0'),
                    other => panic!("unexpected escape %{other}"),
                }
                rest = &rest[i + 3..];
            }
            out.push_str(rest);
            out
        }
        let mut id = String::new();
        for c in "a%\0b%%00\0\u{1}%25é".chars().cycle().take(200) {
            id.push(c);
            let key = Key::new("scope", &id).unwrap();
            assert_eq!(decode(&stored_key(&key)), key.as_str());
        }
    }

    #[test]
    fn plain_keys_are_stored_as_they_are() {
        let key = Key::new("billing", "order-42 ünïcödé").unwrap();
        assert!(matches!(stored_key(&key), Cow::Borrowed(s) if s == key.as_str()));
    }
}
