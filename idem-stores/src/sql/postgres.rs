//! `PostgresStore`: records in one Postgres table, each store operation one statement,
//! time from the database's clock.
//!
//! A claim reads the record first with the plain `get` statement: a replay (or a duplicate
//! of a call still running) is answered by that indexed read alone, with no row lock, no
//! write, no WAL, and none of the claim statement's write path to plan. Only a key without a
//! live record goes on to the claim statement (`claim_sql`), which reads the record again in
//! a CTE and writes only when it is still not live. When a concurrent claim commits the row
//! after that statement's snapshot, the statement answers with no row; the store then runs
//! it once more.
//!
//! Keys are stored through `stored_key`, which percent-encodes `%` and NUL: Postgres text
//! cannot hold NUL, and every key `Key::new` accepts must work here.

use std::borrow::Cow;
use std::time::Duration;

use async_trait::async_trait;
use idem_core::{Claim, Key, StoreError};
use sqlx::postgres::PgQueryResult;
use sqlx::Postgres;

use super::dialect::{Arg, ClaimRequest, Dialect, Migration, Sql, Statements};
use super::{
    fence_from_db, token_from_db, DbErrorKind, NoAnswer, SqlStore, SqlStoreBuilder, TableName,
    CLAIM_ATTEMPTS,
};

/// Idempotency records in a Postgres table (default `idem_records`), on a sqlx
/// [`PgPool`](sqlx::PgPool): the generic [`SqlStore`] in the Postgres dialect.
///
/// A replay costs one round trip (a plain indexed read that finds the stored result) and a
/// first call three (that read, the claim statement, the complete): each store operation
/// is one statement. Leases and expiry run on the database's clock (`now()`), never the
/// client's.
///
/// [`connect`](SqlStore::connect) creates the table (safe from many processes at once); a
/// store on your pool ([`new`](SqlStore::new)) needs [`migrate`](SqlStore::migrate) once.
/// Call [`purge_expired`](SqlStore::purge_expired) on a schedule.
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use idem::stores::PostgresStore;
/// let store = PostgresStore::connect("postgres://app@localhost/app").await?; // and migrates
/// let idem = idem::Idem::new(store);
/// # Ok(()) }
/// ```
pub type PostgresStore = SqlStore<Postgres>;

/// Options of a [`PostgresStore`] that opens its own pool (the generic [`SqlStoreBuilder`]);
/// its table may be schema-qualified: `.table("billing.idem_records")`.
///
/// ```no_run
/// # use std::time::Duration;
/// # async fn demo() -> Result<(), idem::Error> {
/// let store = idem::stores::PostgresStore::builder()
///     .connect_timeout(Duration::from_secs(2))
///     .acquire_timeout(Duration::from_secs(1))
///     .table("billing_idem")
///     .connect("postgres://app@localhost/app")
///     .await?;
/// # let _ = store; Ok(()) }
/// ```
pub type PostgresStoreBuilder = SqlStoreBuilder<Postgres>;

/// The commit level of the store's own writes: Postgres' [`synchronous_commit`], for a
/// cluster with a synchronous standby (`synchronous_standby_names`). Set it with
/// [`PostgresStoreBuilder::synchronous_commit`] or [`PostgresStore::with_synchronous_commit`].
///
/// **What it covers.** Every statement of a store step that writes a record (claim,
/// complete, release, extend, delete, replace) commits at this level; reads, `purge_expired`, the
/// migration and the transactional dedup (`mark_processed_in`, `save_result_in`, which
/// commit with your transaction: `SET LOCAL synchronous_commit` in it) are left as they
/// are. The level is set inside the statement (`set_config('synchronous_commit', ..,
/// true)`, evaluated for each row it writes), so it costs no round trip and applies to
/// that statement's transaction only: nothing else on the pool changes. (Where only a URL
/// can be given, as to `idem::connect` or the `idem` command, sqlx's
/// `?options[synchronous_commit]=remote_apply` sets it for the pool's whole sessions
/// instead.)
///
/// **Without it** (the default) idem sets nothing and the server's own setting applies.
/// With an asynchronous standby, or `synchronous_commit = local` on the server, a result
/// is acknowledged once it is on the primary's disk: a failover to a standby that had not
/// received it yet loses it, and the retry of that key runs the body again (the failover
/// test measured this; see RELIABILITY.md). With [`RemoteWrite`](Self::RemoteWrite),
/// [`On`](Self::On) or [`RemoteApply`](Self::RemoteApply) and a synchronous standby, no
/// acknowledged claim or result is lost when that standby is promoted. Promote one that
/// was synchronous: an asynchronous standby beside it may lag as before, and with a quorum
/// (`ANY n (...)`) only the standbys that confirmed hold a commit, so promote the one
/// furthest ahead.
///
/// **When the standby falls behind or goes away**, Postgres holds each commit until a
/// synchronous standby confirms it. The engine's step timeout (5 s by default) then ends
/// the step with a temporary [`StoreError::Timeout`]: a claim that timed out runs no body
/// (fail closed), and a complete that timed out after the body ran is retried within the
/// lease and never releases the claim, so no second run follows. Postgres' caveat: a
/// commit whose wait is given up on (by the client, a cancel or the end of its session)
/// has already committed on the primary; it becomes visible there once the wait ends,
/// without the standby's confirmation. So a claim that timed out may show up later as an
/// in-progress claim (taken over when its lease ends), and a result that timed out may be
/// stored after all, and is then replayed. Giving up does not end the wait on the server:
/// each write that timed out keeps its server connection busy (waiting for the standby, or
/// for the row lock of the one that does) until the standby answers, so a long outage can
/// use up the pool and the server's connections; calls then fail with `Error::Store` too.
///
/// ```no_run
/// # async fn demo() -> Result<(), idem::Error> {
/// use idem::stores::{PostgresStore, SynchronousCommit};
/// let store = PostgresStore::builder()
///     .synchronous_commit(SynchronousCommit::RemoteApply)
///     .connect("postgres://app@primary/app")
///     .await?;
/// let idem = idem::Idem::new(store);
/// # let _ = idem; Ok(()) }
/// ```
///
/// [`synchronous_commit`]: https://www.postgresql.org/docs/current/runtime-config-wal.html#GUC-SYNCHRONOUS-COMMIT
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SynchronousCommit {
    /// `off`: the commit does not wait even for the primary's disk; a crash of the
    /// primary may lose the last acknowledged writes (at most three times
    /// `wal_writer_delay`).
    Off,
    /// `local`: waits for the primary's disk only, never a standby.
    Local,
    /// `remote_write`: also waits until the synchronous standbys have written the commit
    /// (to their operating system, not yet their disk): a promoted standby has it unless
    /// it crashed too.
    RemoteWrite,
    /// `on`: also waits until the synchronous standbys have flushed the commit to disk.
    On,
    /// `remote_apply`: also waits until the synchronous standbys have applied it, so a
    /// read on one of them sees it too.
    RemoteApply,
}

impl SynchronousCommit {
    /// The setting's value as Postgres spells it (`remote_apply`).
    pub fn as_str(self) -> &'static str {
        match self {
            SynchronousCommit::Off => "off",
            SynchronousCommit::Local => "local",
            SynchronousCommit::RemoteWrite => "remote_write",
            SynchronousCommit::On => "on",
            SynchronousCommit::RemoteApply => "remote_apply",
        }
    }

    /// The conjunct a writing statement's `WHERE` ends with: true, and sets the level for
    /// the statement's transaction (`is_local`), so that its commit waits as asked. A
    /// literal of this enum's, never user text.
    fn conjunct(self) -> String {
        format!(
            " AND set_config('synchronous_commit', '{}', true) IS NOT NULL",
            self.as_str()
        )
    }
}

impl SqlStoreBuilder<Postgres> {
    /// Commits the store's writes at `level` (default: the server's own setting, nothing
    /// set). See [`SynchronousCommit`] for what each level guarantees and what a standby
    /// that stops answering does to a call.
    pub fn synchronous_commit(mut self, level: SynchronousCommit) -> Self {
        self.settings = Some(level);
        self
    }
}

impl SqlStore<Postgres> {
    /// This store with its writes committed at `level`, as
    /// [`PostgresStoreBuilder::synchronous_commit`] sets it; for a store on your pool.
    pub fn with_synchronous_commit(self, level: SynchronousCommit) -> Self {
        self.with_settings(Some(level))
    }

    /// The commit level of the store's writes, `None` for the server's own.
    pub fn synchronous_commit(&self) -> Option<SynchronousCommit> {
        *self.settings()
    }
}

#[async_trait]
impl Dialect for Postgres {
    const BACKEND: &'static str = "postgres";
    const STORE: &'static str = "PostgresStore";
    const SCHEMES: &'static [&'static str] = &["postgres", "postgresql"];
    const SCHEMA_QUALIFIED: bool = true;
    type Settings = Option<SynchronousCommit>;

    fn describe(options: &sqlx::postgres::PgConnectOptions) -> String {
        super::dialect::describe_server(
            Self::BACKEND,
            options.get_socket().map(|p| p.as_path()),
            options.get_host(),
            options.get_port(),
            options.get_database(),
        )
    }

    fn statements(table: &TableName, level: &Option<SynchronousCommit>) -> Statements {
        let t = table.quoted();
        // The commit level, set inside each writing statement (see `SynchronousCommit`): a
        // conjunct of its `WHERE`, so every row it writes was written with it in force.
        let at = level.map_or(String::new(), |l| l.conjunct());
        // Only the holder of the current token, while its lease runs, may touch a claim.
        let held = format!("key = $1 AND token = $2 AND NOT completed AND ends_at > now(){at}");
        // A live completed record whose payload is the expected one (`$2`): what a replace
        // may swap or delete.
        let swappable = format!("key = $1 AND completed AND ends_at > now() AND payload = $2{at}");
        Statements {
            claim: vec![Sql::numbered(claim_sql(&t, &at))],
            // Also matches the record this token completed (a repeat), which it rewrites
            // with its own values: one statement, and a repeat that waited on the row lock
            // of its original still finds the completed row.
            complete: Sql::numbered(format!(
                "UPDATE {t} SET completed = true,
                    payload = CASE WHEN completed THEN payload ELSE $3 END,
                    ends_at = CASE WHEN completed THEN ends_at
                                   ELSE clock_timestamp() + $4 * interval '1 millisecond' END
                 WHERE key = $1 AND token = $2 AND ends_at > now(){at}"
            )),
            release: Sql::numbered(format!("DELETE FROM {t} WHERE {held}")),
            exists: Sql::numbered(format!("SELECT 1 FROM {t} WHERE key = $1")),
            extend: Sql::numbered(format!(
                "UPDATE {t} SET ends_at = clock_timestamp() + $3 * interval '1 millisecond' WHERE {held}"
            )),
            get: Sql::numbered(format!(
                "SELECT completed, fingerprint, token, payload, {REMAINING_MS} AS remaining_ms
                 FROM {t} WHERE key = $1 AND ends_at > now()"
            )),
            delete: Sql::numbered(format!(
                "DELETE FROM {t} WHERE key = $1 AND ends_at > now(){at}"
            )),
            delete_ended: Sql::numbered(format!(
                "DELETE FROM {t} WHERE key = $1 AND ends_at <= now()"
            )),
            delete_seen: Sql::numbered(format!(
                "DELETE FROM {t} WHERE key = $1 AND token = $2 AND ends_at > now(){at}"
            )),
            // Only a live completed record holding the expected payload. Under a concurrent
            // write of the row, Postgres waits for it and checks this condition again on
            // the row's newest version, so of racing replaces one matches.
            replace: Sql::numbered(format!(
                "UPDATE {t} SET payload = $3,
                    ends_at = clock_timestamp() + $4 * interval '1 millisecond'
                 WHERE {swappable}"
            )),
            replace_delete: Sql::numbered(format!("DELETE FROM {t} WHERE {swappable}")),
            count_ended: Sql::numbered(format!(
                "SELECT count(*) AS n FROM {t} WHERE ends_at <= now()"
            )),
            stats: Sql::numbered(format!(
                "SELECT count(*) FILTER (WHERE ends_at > now() AND NOT completed) AS in_progress,
                        count(*) FILTER (WHERE ends_at > now() AND completed) AS completed,
                        count(*) FILTER (WHERE ends_at <= now()) AS ended
                 FROM {t}"
            )),
            purge: Sql::numbered(format!(
                "DELETE FROM {t} WHERE key IN (
                    SELECT key FROM {t} WHERE ends_at <= now() LIMIT $1 FOR UPDATE SKIP LOCKED
                 ) AND ends_at <= now()"
            )),
        }
    }

    fn migration(table: &TableName, lock_timeout: Duration) -> Migration {
        let versions = table.quoted_with("_schema");
        Migration {
            // The lock is named after the table (an identifier, so it can be spliced), and
            // held until the transaction ends: DDL is transactional in Postgres.
            // `lock_timeout` bounds the wait for it (and for the DDL's own locks), for
            // this transaction only; running out is `lock_not_available` (55P03).
            lock: vec![
                "BEGIN".into(),
                format!(
                    "SET LOCAL lock_timeout = {}",
                    super::millis(lock_timeout).clamp(1, i64::from(i32::MAX))
                ),
                format!(
                    "SELECT pg_advisory_xact_lock(hashtextextended('idem.migrate:{table}', 0))"
                ),
            ],
            acquire: None,
            commit: vec!["COMMIT".into()],
            abort: vec!["ROLLBACK".into()],
            create_versions: format!(
                "CREATE TABLE IF NOT EXISTS {versions} (
                    version integer PRIMARY KEY,
                    migrated_at timestamptz NOT NULL DEFAULT now()
                )"
            ),
            current_version: format!("SELECT coalesce(max(version), 0)::int8 FROM {versions}"),
            record_version: format!("INSERT INTO {versions} (version) VALUES ({{version}})"),
            // The schema, one version at a time: each entry brings the table from the
            // previous version to this one. Never edit a released step; add the next.
            steps: {
                let t = table.quoted();
                let version_1 = vec![
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
                ];
                // The claim's fence (`Fence`): rows written before it read as 0, and the
                // next claim of their key takes `greatest(0 + 1, clock)`. A constant
                // default, so adding it rewrites no row.
                let version_2 = vec![format!(
                    "ALTER TABLE {t} ADD COLUMN IF NOT EXISTS fence bigint NOT NULL DEFAULT 0"
                )];
                vec![(1, version_1), (2, version_2)]
            },
        }
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

    fn key(key: &Key) -> Arg {
        Arg::Text(stored_key(key).into_owned())
    }

    fn rows_affected(done: &PgQueryResult) -> u64 {
        done.rows_affected()
    }

    async fn claim(store: &PostgresStore, request: ClaimRequest<'_>) -> Result<Claim, StoreError> {
        let ClaimRequest { key, token, .. } = request;
        let err = |e| store.error(e);
        // A plain indexed read first: a replay (or a duplicate of a call still running) is
        // answered by it, without the claim statement, whose write path costs the server
        // more to plan and run than the read. Only a key with no live record, or one this
        // token holds (a resent claim), goes on to the claim statement: a first call costs
        // a third round trip, next to its two commits.
        if let Some(answer) = store.claim_by_reading(key, token).await? {
            return Ok(answer);
        }
        for attempt in 1..=CLAIM_ATTEMPTS {
            let args = request.args::<Postgres>();
            let row = <Postgres as super::dialect::Driver>::fetch_optional(
                store.pool(),
                &store.statements().claim[0],
                args,
            )
            .await
            .map_err(err)?;
            let Some(row) = row else {
                tracing::debug!(target: "idem", key = %key, attempt, "claim raced a concurrent claim; running it again");
                continue;
            };
            let state: i16 = sqlx::Row::try_get(&row, "state").map_err(err)?;
            if state == 0 {
                return Ok(Claim::Acquired {
                    token: token_from_db(sqlx::Row::try_get(&row, "token").map_err(err)?),
                    recovered: sqlx::Row::try_get(&row, "recovered").map_err(err)?,
                    fence: fence_from_db(sqlx::Row::try_get(&row, "fence").map_err(err)?),
                });
            }
            return store.live_row(&row, state == 2)?.into_claim(Self::BACKEND);
        }
        Err(NoAnswer::error(Self::BACKEND))
    }
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
/// acquired (`token`, `recovered`, `fence`), 1 = in progress, 2 = completed (`payload`);
/// or no row when a concurrent claim committed after this statement's snapshot. A live
/// claim held by `$4` is this claim resent: state 0, not recovered, its fence, and nothing
/// written. A new row's fence is the clock in microseconds ([`NOW_US`]); a takeover's is
/// `greatest(fence + 1, clock)`, on the newest row version the conflict locked.
///
/// The new lease runs from `clock_timestamp()`, the time the row is written, so a statement
/// that waited on a lock does not hand out a shorter lease; checks use `now()`. `at` is
/// the commit level's conjunct (or nothing), in the `WHERE` of the insert's one row, so
/// an insert or a takeover is only ever written with it in force.
fn claim_sql(t: &str, at: &str) -> String {
    format!(
        "WITH cur AS (
            SELECT completed, fingerprint, token, payload, ends_at, fence, ends_at > now() AS live
            FROM {t} WHERE key = $1
        ),
        taken AS (
            INSERT INTO {t} AS r (key, fingerprint, token, completed, payload, ends_at, fence)
            SELECT $1, $2, $4, false, NULL, clock_timestamp() + $3 * interval '1 millisecond', {NOW_US}
            WHERE NOT EXISTS (SELECT 1 FROM cur WHERE live){at}
            ON CONFLICT (key) DO UPDATE
                SET fingerprint = excluded.fingerprint, token = excluded.token, completed = false,
                    payload = NULL, ends_at = excluded.ends_at,
                    fence = greatest(r.fence + 1, excluded.fence)
                WHERE r.ends_at <= now()
            RETURNING r.token, r.fence
        )
        SELECT 0::int2 AS state, token, NULL::bytea AS fingerprint, NULL::bytea AS payload,
               0::int8 AS remaining_ms, EXISTS (SELECT 1 FROM cur WHERE NOT completed) AS recovered,
               fence
        FROM taken
        UNION ALL
        SELECT CASE WHEN completed THEN 2 WHEN token = $4 THEN 0 ELSE 1 END::int2, token,
               fingerprint, payload, {remaining}, false, fence
        FROM cur WHERE live",
        remaining = REMAINING_MS,
    )
}

/// The server's clock in microseconds since the Unix epoch, as a claim's fence starts from:
/// `clock_timestamp()`, the time the row is written (as the lease's start is).
const NOW_US: &str = "(extract(epoch FROM clock_timestamp()) * 1000000)::int8";

/// Milliseconds until `ends_at`, rounded up, as the database sees it.
const REMAINING_MS: &str = "ceil(extract(epoch FROM ends_at - now()) * 1000)::int8";

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
    fn a_commit_level_is_in_every_writing_statement_and_nowhere_else() {
        let table = TableName::parse("postgres", "idem_records", true).unwrap();
        let at = "set_config('synchronous_commit', 'remote_write', true)";
        let levelled = Postgres::statements(&table, &Some(SynchronousCommit::RemoteWrite));
        let writes = [
            &levelled.claim[0],
            &levelled.complete,
            &levelled.release,
            &levelled.extend,
            &levelled.delete,
            &levelled.delete_seen,
            &levelled.replace,
            &levelled.replace_delete,
        ];
        for sql in writes {
            assert_eq!(sql.text.matches(at).count(), 1, "{}", sql.text);
        }
        for sql in [
            &levelled.get,
            &levelled.exists,
            &levelled.purge,
            &levelled.stats,
        ] {
            assert!(!sql.text.contains("set_config"), "{}", sql.text);
        }
        let plain = Postgres::statements(&table, &None);
        assert!(!plain.claim[0].text.contains("set_config"));
        assert!(!plain.complete.text.contains("set_config"));
        let names: Vec<&str> = [
            SynchronousCommit::Off,
            SynchronousCommit::Local,
            SynchronousCommit::RemoteWrite,
            SynchronousCommit::On,
            SynchronousCommit::RemoteApply,
        ]
        .iter()
        .map(|l| l.as_str())
        .collect();
        assert_eq!(
            names,
            ["off", "local", "remote_write", "on", "remote_apply"]
        );
    }

    #[test]
    fn plain_keys_are_stored_as_they_are() {
        let key = Key::new("billing", "order-42 ünïcödé").unwrap();
        assert!(matches!(stored_key(&key), Cow::Borrowed(s) if s == key.as_str()));
    }
}
