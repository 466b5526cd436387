//! [`SqlStore`]: records in one SQL table, on a sqlx pool, for any [`Dialect`]. The steps
//! other than the claim are the same statement shape in every dialect (one statement,
//! guarded by key, token and the database's clock), so they are written here once.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::OnceCell;

use async_trait::async_trait;
use bytes::Bytes;
use idem_core::{Capabilities, Claim, Error, Fingerprint, Key, Record, Store, StoreError, Token};

use super::dialect::{Arg, ClaimRequest, Col, Dialect, Sql, Statements};
use super::{millis, store_error, token_to_db, LiveRow, TableName, DEFAULT_TABLE};

/// Idempotency records in one SQL table (default `idem_records`) on a sqlx pool: the
/// shape every SQL store shares. Use it by its dialect's name:
/// [`PostgresStore`](crate::PostgresStore), [`SqliteStore`](crate::SqliteStore),
/// [`MySqlStore`](crate::MySqlStore).
///
/// **Who creates the table.** A store that opens its own pool (`connect`, `connect_with`,
/// `open`, and their builder forms) runs [`migrate`](Self::migrate) before it returns, as
/// [`idem_stores::connect`](crate::connect) does; turn that off with the builder's
/// `migrate(false)` where the service's database user may not create tables. A store on
/// your pool ([`new`](Self::new)) touches nothing until its first step: call
/// [`migrate`](Self::migrate) once at startup. A step on a missing table fails with
/// [`StoreError::NotSetUp`] saying so, and the body does not run.
///
/// Leases and expiry run on the database's clock, never the client's; fencing tokens are
/// the caller's, kept in the row. Each claim that acquires a key sets the row's `fence` to
/// `max(fence + 1, the clock in microseconds)` in the claim's own statement (see
/// [`Fence`](idem_core::Fence)).
pub struct SqlStore<D: Dialect> {
    pool: sqlx::Pool<D>,
    table: TableName,
    sql: Arc<Statements>,
    /// Set once the table's schema version is known to be one this build reads (by
    /// `migrate`, or by the first step): shared by clones, reset by `with_table`.
    schema_checked: Arc<OnceCell<()>>,
    migrate_lock_timeout: Duration,
    /// What shapes the statements beyond the table (Postgres: its commit level).
    settings: D::Settings,
}

impl<D: Dialect> Clone for SqlStore<D> {
    fn clone(&self) -> Self {
        SqlStore {
            pool: self.pool.clone(),
            table: self.table.clone(),
            sql: self.sql.clone(),
            schema_checked: self.schema_checked.clone(),
            migrate_lock_timeout: self.migrate_lock_timeout,
            settings: self.settings.clone(),
        }
    }
}

/// How long [`SqlStore::migrate`] waits for another migration of the table by default.
pub const DEFAULT_MIGRATE_LOCK_TIMEOUT: Duration = Duration::from_secs(60);

impl<D: Dialect> std::fmt::Debug for SqlStore<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct(D::STORE)
            .field("table", &self.table)
            .field("pool_size", &self.pool.size())
            .finish()
    }
}

impl<D: Dialect> SqlStore<D> {
    /// A store on your own pool, with the default table `idem_records`. It does not touch
    /// the database: call [`migrate`](Self::migrate) once before the first step.
    ///
    /// sqlx pools ping each connection before lending it out unless built with
    /// `test_before_acquire(false)`; that ping is one more round trip before every step.
    /// sqlx's default acquire timeout is 30 s: set `acquire_timeout` at or below the
    /// engine's step timeout.
    pub fn new(pool: sqlx::Pool<D>) -> Self {
        let table = TableName::parse(D::BACKEND, DEFAULT_TABLE, D::SCHEMA_QUALIFIED)
            .expect("the default table name is valid");
        let settings = D::Settings::default();
        SqlStore {
            pool,
            sql: Arc::new(D::statements(&table, &settings)),
            table,
            schema_checked: Arc::new(OnceCell::new()),
            migrate_lock_timeout: DEFAULT_MIGRATE_LOCK_TIMEOUT,
            settings,
        }
    }

    /// Uses `table` instead of `idem_records`: an identifier (`[A-Za-z_][A-Za-z0-9_]*`, at
    /// most 48 bytes); on Postgres optionally schema-qualified (`idem.records`, the schema
    /// must exist). Like [`new`](Self::new) it does not touch the database: call
    /// [`migrate`](Self::migrate), or name the table in the builder
    /// (`builder().table(...)`) so that connecting migrates it.
    pub fn with_table(mut self, table: &str) -> Result<Self, Error> {
        self.table = TableName::parse(D::BACKEND, table, D::SCHEMA_QUALIFIED)?;
        self.sql = Arc::new(D::statements(&self.table, &self.settings));
        self.schema_checked = Arc::new(OnceCell::new());
        Ok(self)
    }

    /// How long [`migrate`](Self::migrate) waits for a migration of the same table that
    /// another process is running (default [`DEFAULT_MIGRATE_LOCK_TIMEOUT`], 60 s) before
    /// it fails, having changed nothing. Used by MySQL's `GET_LOCK` (whole seconds,
    /// rounded up) and Postgres' `lock_timeout`; SQLite waits its busy timeout.
    pub fn with_migrate_lock_timeout(mut self, timeout: Duration) -> Self {
        self.migrate_lock_timeout = timeout;
        self
    }

    /// The statements rebuilt with `settings` (the table and the schema check stay).
    pub(crate) fn with_settings(mut self, settings: D::Settings) -> Self {
        self.sql = Arc::new(D::statements(&self.table, &settings));
        self.settings = settings;
        self
    }

    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) fn settings(&self) -> &D::Settings {
        &self.settings
    }

    /// The pool.
    pub fn pool(&self) -> &sqlx::Pool<D> {
        &self.pool
    }

    /// The table name, as given.
    pub fn table(&self) -> String {
        self.table.to_string()
    }

    // For the transactional dedup and steps (`tx.rs`).
    pub(crate) fn table_name(&self) -> &TableName {
        &self.table
    }

    pub(crate) fn statements(&self) -> &Statements {
        &self.sql
    }

    /// Creates the table and what it needs when they are missing, and brings an older
    /// schema up to the version this build reads.
    ///
    /// Safe to run from several processes at once: each dialect serialises it on a lock
    /// named after the table (Postgres `pg_advisory_xact_lock`, SQLite `BEGIN IMMEDIATE`,
    /// MySQL `GET_LOCK`); the others wait, then find nothing to do. Fails when the table
    /// was migrated by a newer version of this crate.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        let migration = D::migration(&self.table, self.migrate_lock_timeout);
        let mut conn = self.pool.acquire().await.map_err(|e| self.error(e))?;
        for sql in &migration.lock {
            D::execute_raw(&mut conn, sql)
                .await
                .map_err(|e| self.error(e))?;
        }
        if let Some(acquire) = &migration.acquire {
            let taken = D::fetch_i64_raw(&mut conn, acquire)
                .await
                .map_err(|e| self.error(e))?;
            if taken != 1 {
                return Err(StoreError::Unavailable {
                    backend: D::BACKEND,
                    source: Box::new(LockNotTaken {
                        table: self.table.to_string(),
                        after: self.migrate_lock_timeout,
                    }),
                });
            }
        }
        let outcome = self.migrate_locked(&mut conn, &migration).await;
        if outcome.is_ok() {
            let _ = self.schema_checked.set(());
        }
        let end = if outcome.is_ok() {
            &migration.commit
        } else {
            &migration.abort
        };
        for sql in end {
            if let Err(e) = D::execute_raw(&mut conn, sql).await {
                // A connection left inside a transaction or holding the lock must not go
                // back to the pool.
                conn.close_on_drop();
                if outcome.is_ok() {
                    return Err(self.error(e));
                }
            }
        }
        outcome
    }

    async fn migrate_locked(
        &self,
        conn: &mut D::Connection,
        migration: &super::dialect::Migration,
    ) -> Result<(), StoreError> {
        let err = |e| self.error(e);
        D::execute_raw(conn, &migration.create_versions)
            .await
            .map_err(err)?;
        let current = D::fetch_i64_raw(conn, &migration.current_version)
            .await
            .map_err(err)?;
        let newest = migration.newest();
        if current > newest {
            return Err(self.newer_schema(current, newest));
        }
        for (version, statements) in &migration.steps {
            if *version <= current {
                continue;
            }
            for statement in statements {
                D::execute_raw(conn, statement).await.map_err(err)?;
            }
            let record = migration
                .record_version
                .replace("{version}", &version.to_string());
            D::execute_raw(conn, &record).await.map_err(err)?;
            tracing::info!(target: "idem", backend = D::BACKEND, table = %self.table, version, "migrated the store's table");
        }
        Ok(())
    }

    /// Deletes records that have ended (expired results, leases ended and not taken over),
    /// at most `limit` per statement, statement after statement until none is left; returns
    /// how many it deleted. Each batch is its own short statement, so claims get their turn
    /// between batches and a large table is cleaned without one long lock.
    ///
    /// Ended records are never answered, so this only reclaims space: run it on a schedule
    /// (every few minutes, from one process or several).
    pub async fn purge_expired(&self, limit: u32) -> Result<u64, StoreError> {
        self.ready().await?;
        let limit = i64::from(limit.max(1));
        let mut total = 0;
        loop {
            let done = D::execute(&self.pool, &self.sql.purge, vec![Arg::Int(limit)])
                .await
                .map_err(|e| self.error(e))?;
            let n = D::rows_affected(&done);
            total += n;
            if n < limit as u64 {
                return Ok(total);
            }
        }
    }

    fn newer_schema(&self, found: i64, newest: i64) -> StoreError {
        StoreError::NotSetUp {
            backend: D::BACKEND,
            message: format!(
                "the table `{}` has schema version {found}, newer than this build's {newest}: \
                 upgrade idem before using it",
                self.table
            ),
        }
    }

    fn older_schema(&self, found: i64, newest: i64) -> StoreError {
        StoreError::NotSetUp {
            backend: D::BACKEND,
            message: format!(
                "the table `{}` has schema version {found}, older than this build's {newest}: \
                 run `migrate` (the store's `migrate()`, or `idem migrate <url>`) before using it",
                self.table
            ),
        }
    }

    /// Checks once per store (clones share it) that the table's schema is the one this
    /// build reads (not newer, and not older: an older table lacks columns the statements
    /// name, such as `fence`), before the first step: a store on your pool, or one connected with
    /// `migrate(false)`, never ran [`migrate`](Self::migrate), which checks too. A missing
    /// schema table is left to the step, which then says the table is not set up; the
    /// check runs again at the next step.
    pub(crate) async fn ready(&self) -> Result<(), StoreError> {
        if self.schema_checked.get().is_some() {
            return Ok(());
        }
        let checked = self.schema_checked.get_or_try_init(|| async {
            // `Err(None)`: no schema table, not cached; the step says what is missing.
            let migration = D::migration(&self.table, self.migrate_lock_timeout);
            let mut conn = self.pool.acquire().await.map_err(|e| Some(self.error(e)))?;
            match D::fetch_i64_raw(&mut conn, &migration.current_version).await {
                Ok(found) if found > migration.newest() => {
                    Err(Some(self.newer_schema(found, migration.newest())))
                }
                // Tables of every version have the schema table; 0 is a table not made
                // yet, which the step reports as not set up.
                Ok(found) if found > 0 && found < migration.newest() => {
                    Err(Some(self.older_schema(found, migration.newest())))
                }
                Ok(_) => Ok(()),
                Err(e) => match self.error(e) {
                    StoreError::NotSetUp { .. } => Err(None),
                    other => Err(Some(other)),
                },
            }
        });
        match checked.await {
            Ok(()) | Err(None) => Ok(()),
            Err(Some(e)) => Err(e),
        }
    }

    /// Sorts a sqlx error of this store.
    pub(crate) fn error(&self, e: sqlx::Error) -> StoreError {
        store_error(D::BACKEND, &self.table, D::STORE, D::classify, e)
    }

    /// Runs a statement guarded by key and token: `Ok` when it affected one row.
    async fn guarded(
        &self,
        sql: &Sql,
        key: &Key,
        token: Token,
        rest: Vec<Arg>,
    ) -> Result<(), StoreError> {
        self.ready().await?;
        let mut args = vec![D::key(key), Arg::Int(token_to_db(token))];
        args.extend(rest);
        let done = D::execute(&self.pool, sql, args)
            .await
            .map_err(|e| self.error(e))?;
        if D::rows_affected(&done) == 1 {
            Ok(())
        } else {
            Err(StoreError::Fenced)
        }
    }

    /// The answer of a claim's first, plain read, when it settles the claim: a completed
    /// record (a replay) or a live claim another token holds (a running duplicate).
    /// `None` when the claim statement must run: no live record, or one `token` holds
    /// (this claim, resent).
    pub(crate) async fn claim_by_reading(
        &self,
        key: &Key,
        token: Token,
    ) -> Result<Option<Claim>, StoreError> {
        match self.live(key).await? {
            Some(live) if live.completed || live.token != token_to_db(token) => {
                live.into_claim(D::BACKEND).map(Some)
            }
            _ => Ok(None),
        }
    }

    /// The live record under `key`, if any: one read on the pool (the `get` statement).
    pub(crate) async fn live(&self, key: &Key) -> Result<Option<LiveRow>, StoreError> {
        self.ready().await?;
        let row = D::fetch_optional(&self.pool, &self.sql.get, vec![D::key(key)])
            .await
            .map_err(|e| self.error(e))?;
        let Some(row) = row else { return Ok(None) };
        let completed = D::flag(&row, Col::Name("completed")).map_err(|e| self.error(e))?;
        let live = self.live_row(&row, completed)?;
        // An ended row (see `Statements::get`) is no record.
        Ok((live.remaining_ms > 0).then_some(live))
    }

    /// The live-record columns of `row`, as every dialect names them.
    pub(crate) fn live_row(&self, row: &D::Row, completed: bool) -> Result<LiveRow, StoreError> {
        let read = || -> Result<LiveRow, sqlx::Error> {
            Ok(LiveRow {
                completed,
                fingerprint: D::bytes(row, Col::Name("fingerprint"))?.unwrap_or_default(),
                token: D::int(row, Col::Name("token"))?,
                payload: D::bytes(row, Col::Name("payload"))?,
                remaining_ms: D::int(row, Col::Name("remaining_ms"))?,
            })
        };
        read().map_err(|e| self.error(e))
    }
}

#[async_trait]
impl<D: Dialect> Store for SqlStore<D> {
    async fn claim(
        &self,
        key: &Key,
        fingerprint: &Fingerprint,
        token: Token,
        lease: Duration,
    ) -> Result<Claim, StoreError> {
        let request = ClaimRequest {
            key,
            fingerprint,
            token,
            lease,
        };
        self.ready().await?;
        D::claim(self, request).await
    }

    async fn complete(
        &self,
        key: &Key,
        token: Token,
        payload: Bytes,
        ttl: Duration,
    ) -> Result<(), StoreError> {
        let rest = vec![Arg::Bytes(payload.to_vec()), Arg::Int(millis(ttl))];
        self.guarded(&self.sql.complete, key, token, rest).await
    }

    async fn release(&self, key: &Key, token: Token) -> Result<(), StoreError> {
        match self.guarded(&self.sql.release, key, token, vec![]).await {
            Err(StoreError::Fenced) => {
                // A second statement only on this rare path: nothing deleted is a repeat
                // when no record is there, fenced when another claim's record is.
                let row = D::fetch_optional(&self.pool, &self.sql.exists, vec![D::key(key)])
                    .await
                    .map_err(|e| self.error(e))?;
                if row.is_some() {
                    Err(StoreError::Fenced)
                } else {
                    Ok(())
                }
            }
            other => other,
        }
    }

    async fn extend(&self, key: &Key, token: Token, lease: Duration) -> Result<(), StoreError> {
        let rest = vec![Arg::Int(millis(lease))];
        self.guarded(&self.sql.extend, key, token, rest).await
    }

    async fn get(&self, key: &Key) -> Result<Option<Record>, StoreError> {
        self.live(key)
            .await?
            .map(|live| live.into_record(D::BACKEND))
            .transpose()
    }

    async fn delete(&self, key: &Key) -> Result<bool, StoreError> {
        // The answer is whether a live record was there; an ended one is no record to a
        // caller. Its row goes too (a second statement, only when there was no live one):
        // left behind, it would answer its old holder's release with `Fenced` where every
        // other store, having nothing under the key, answers `Ok` (found by the model test).
        self.ready().await?;
        let done = D::execute(&self.pool, &self.sql.delete, vec![D::key(key)])
            .await
            .map_err(|e| self.error(e))?;
        if D::rows_affected(&done) == 1 {
            return Ok(true);
        }
        D::execute(&self.pool, &self.sql.delete_ended, vec![D::key(key)])
            .await
            .map_err(|e| self.error(e))?;
        Ok(false)
    }

    /// One statement guarded by key, state, payload and the database's clock: an `UPDATE`
    /// that sets the new payload and its end, or a `DELETE`.
    async fn replace(
        &self,
        key: &Key,
        expected: &[u8],
        new: Option<(Bytes, Duration)>,
    ) -> Result<bool, StoreError> {
        self.ready().await?;
        let mut args = vec![D::key(key), Arg::Bytes(expected.to_vec())];
        let sql = match new {
            Some((payload, ttl)) => {
                args.extend([Arg::Bytes(payload.to_vec()), Arg::Int(millis(ttl))]);
                &self.sql.replace
            }
            None => &self.sql.replace_delete,
        };
        let done = D::execute(&self.pool, sql, args)
            .await
            .map_err(|e| self.error(e))?;
        Ok(D::rows_affected(&done) == 1)
    }

    /// Every dialect keeps an ended claim's row until it is taken over or purged, assigns
    /// fences in its claim, and replaces records.
    fn capabilities(&self) -> Capabilities {
        Capabilities::NONE
            .with_reports_recovery(true)
            .with_assigns_fences(true)
            .with_replaces_records(true)
    }

    fn backend(&self) -> &'static str {
        D::BACKEND
    }
}

/// The source of the error of a migration that could not take its lock: another
/// connection holds it (a migration running elsewhere, or a session that took the lock and
/// never released it).
#[derive(Debug)]
struct LockNotTaken {
    table: String,
    after: Duration,
}

impl std::fmt::Display for LockNotTaken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "another connection holds the migration lock of table `{}` (a migration running elsewhere?); \
             it was not released within {:?}, and nothing was migrated",
            self.table, self.after
        )
    }
}

impl std::error::Error for LockNotTaken {}
