//! `MySqlStore`: records in one MySQL or MariaDB table (InnoDB), each store operation one
//! statement (a first call: the read, the claim procedure and the complete, three round
//! trips; a replay one), time from the server's clock.
//!
//! A claim reads the record first with a plain indexed `SELECT`, which answers a replay
//! or a running duplicate. MySQL has no statement that both writes and answers rows, so
//! the claim proper is a stored procedure (`<table>_claim`, created by `migrate`), called
//! in one round trip only for a key without a live record (or a resent claim): it reads
//! the record again and writes only when no live record exists, as the Postgres claim
//! does, then answers with the record. A first claim inserts (a concurrent one that lost the
//! race gets a duplicate key, handled inside the procedure); a takeover is an `UPDATE ...
//! WHERE ends_at <= now`, which InnoDB re-checks under the row lock, so exactly one of
//! several concurrent takeovers matches.
//!
//! Keys are `VARBINARY(1281)`: `scope/id` as its UTF-8 bytes, compared byte for byte, NUL
//! and control characters included. Payloads are `LONGBLOB`; the server's
//! `max_allowed_packet` (16 MiB by default on MariaDB 10.11 and MySQL 8) bounds what one
//! `complete` can send.

use std::time::Duration;

use async_trait::async_trait;
use idem_core::{Claim, Key, StoreError};
use sqlx::mysql::{MySqlDatabaseError, MySqlQueryResult};
use sqlx::MySql;

use super::dialect::{Arg, ClaimRequest, Col, Dialect, Driver, Migration, Sql, Statements};
use super::{
    fence_from_db, token_from_db, token_to_db, DbErrorKind, LiveRow, NoAnswer, SqlStore,
    SqlStoreBuilder, TableName, CLAIM_ATTEMPTS,
};

/// Idempotency records in a MySQL or MariaDB table (default `idem_records`), on a sqlx
/// [`MySqlPool`](sqlx::MySqlPool): the generic [`SqlStore`] in the MySQL dialect.
///
/// A replay costs one round trip (the read answers with the stored result, without calling
/// the procedure) and a first call three (the read, the claim procedure, the complete): each
/// store operation is one statement. Leases and expiry run on the server's clock
/// (`UTC_TIMESTAMP(3)`), never the client's. The claim is a stored procedure, so the
/// database user needs `CREATE ROUTINE` to migrate and `EXECUTE` to claim.
///
/// [`connect`](SqlStore::connect) creates the table and the procedure (safe from many
/// processes at once); a store on your pool ([`new`](SqlStore::new)) needs
/// [`migrate`](SqlStore::migrate) once.
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// // Creates the table `billing_idem` and its procedure `billing_idem_claim` if missing.
/// let store = idem::stores::MySqlStore::builder()
///     .table("billing_idem")
///     .connect("mysql://app@localhost/app")
///     .await?;
/// # let _ = store; Ok(()) }
/// ```
pub type MySqlStore = SqlStore<MySql>;

/// Options of a [`MySqlStore`] that opens its own pool (the generic [`SqlStoreBuilder`]).
/// Where the service's user lacks `CREATE ROUTINE`, connect with `migrate(false)` and run
/// [`migrate`](SqlStore::migrate) from a deploy step as a user that has it.
pub type MySqlStoreBuilder = SqlStoreBuilder<MySql>;

/// The server's clock in milliseconds since the Unix epoch. `UTC_TIMESTAMP` and
/// `TIMESTAMPDIFF` do no time zone conversion, so the session's `time_zone` (and its
/// daylight saving hour that happens twice) cannot move it.
pub(crate) const NOW_MS: &str =
    "(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000)";

/// The server's clock in microseconds since the Unix epoch, as a claim's fence starts from.
const NOW_US: &str = "TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))";

#[async_trait]
impl Dialect for MySql {
    const BACKEND: &'static str = "mysql";
    const STORE: &'static str = "MySqlStore";
    const SCHEMES: &'static [&'static str] = &["mysql", "mariadb"];
    type Settings = ();

    fn describe(options: &sqlx::mysql::MySqlConnectOptions) -> String {
        super::dialect::describe_server(
            Self::BACKEND,
            options.get_socket().map(|p| p.as_path()),
            options.get_host(),
            options.get_port(),
            options.get_database(),
        )
    }

    /// The statements of one table. Parameters are numbered in the order the store binds them
    /// and turned into MySQL's positional `?` by [`Sql::positional`].
    fn statements(table: &TableName, _settings: &Self::Settings) -> Statements {
        let t = table.backticked_with("");
        let claim = table.backticked_with("_claim");
        let held = format!("`key` = $1 AND token = $2 AND NOT completed AND ends_at > {NOW_MS}");
        let swappable = format!("`key` = $1 AND completed AND ends_at > {NOW_MS} AND payload = $2");
        Statements {
            claim: vec![Sql::positional(&format!("CALL {claim}($1, $2, $3, $4)"))],
            // Also matches the record this token completed (a repeat), which keeps its values.
            complete: Sql::positional(&format!(
                "UPDATE {t} SET payload = IF(completed, payload, $3),
                    ends_at = IF(completed, ends_at, {NOW_MS} + $4),
                    completed = TRUE
                 WHERE `key` = $1 AND token = $2 AND ends_at > {NOW_MS}"
            )),
            release: Sql::positional(&format!("DELETE FROM {t} WHERE {held}")),
            exists: Sql::positional(&format!("SELECT 1 FROM {t} WHERE `key` = $1")),
            extend: Sql::positional(&format!(
                "UPDATE {t} SET ends_at = {NOW_MS} + $3 WHERE {held}"
            )),
            // The server's clock once, not twice (`AND ends_at > now` as well): the second
            // evaluation cost the server about 6 µs of this statement's 35-42 µs (mariadbd's
            // CPU per statement). An ended row comes back with `remaining_ms <= 0`, which the
            // store reads as no live record.
            get: Sql::positional(&format!(
                "SELECT completed, fingerprint, token, payload, ends_at - {NOW_MS} AS remaining_ms
                 FROM {t} WHERE `key` = $1"
            )),
            delete: Sql::positional(&format!(
                "DELETE FROM {t} WHERE `key` = $1 AND ends_at > {NOW_MS}"
            )),
            delete_ended: Sql::positional(&format!(
                "DELETE FROM {t} WHERE `key` = $1 AND ends_at <= {NOW_MS}"
            )),
            delete_seen: Sql::positional(&format!(
                "DELETE FROM {t} WHERE `key` = $1 AND token = $2 AND ends_at > {NOW_MS}"
            )),
            // Only a live completed record holding the expected payload (compared byte for
            // byte: a BLOB). InnoDB reads the row's newest version under its lock, so of
            // racing replaces one matches. `ends_at`, which the condition reads, is
            // assigned last (assignments run left to right).
            replace: Sql::positional(&format!(
                "UPDATE {t} SET payload = $3, ends_at = {NOW_MS} + $4 WHERE {swappable}"
            )),
            replace_delete: Sql::positional(&format!("DELETE FROM {t} WHERE {swappable}")),
            count_ended: Sql::positional(&format!(
                "SELECT CAST(count(*) AS SIGNED) AS n FROM {t} WHERE ends_at <= {NOW_MS}"
            )),
            // UTC_TIMESTAMP is read once per statement.
            stats: Sql::positional(&format!(
                "SELECT CAST(COALESCE(SUM(ends_at > {NOW_MS} AND NOT completed), 0) AS SIGNED) AS in_progress,
                        CAST(COALESCE(SUM(ends_at > {NOW_MS} AND completed), 0) AS SIGNED) AS completed,
                        CAST(COALESCE(SUM(ends_at <= {NOW_MS}), 0) AS SIGNED) AS ended
                 FROM {t}"
            )),
            purge: Sql::positional(&format!(
                "DELETE FROM {t} WHERE ends_at <= {NOW_MS} ORDER BY ends_at LIMIT $1"
            )),
        }
    }

    fn migration(table: &TableName, lock_timeout: Duration) -> Migration {
        let versions = table.backticked_with("_schema");
        // DDL commits on its own in MySQL, so no transaction: a named lock (a session's,
        // at most 64 characters; the table name is at most 48) serialises migrations,
        // and every step is written to be run again.
        let lock = format!("'idem.migrate:{table}'");
        Migration {
            // GET_LOCK answers 1 when taken, 0 when its timeout (whole seconds) ran out,
            // NULL on an error: anything but 1 fails the migration, which then changes
            // nothing (and releases no lock it does not hold).
            lock: vec![],
            acquire: Some(format!(
                "SELECT CAST(COALESCE(GET_LOCK({lock}, {}), 0) AS SIGNED)",
                lock_timeout.as_secs() + u64::from(lock_timeout.subsec_nanos() > 0)
            )),
            commit: vec![format!("DO RELEASE_LOCK({lock})")],
            abort: vec![format!("DO RELEASE_LOCK({lock})")],
            create_versions: format!(
                "CREATE TABLE IF NOT EXISTS {versions} (
                    version INT NOT NULL PRIMARY KEY,
                    migrated_at TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3)
                ) ENGINE = InnoDB"
            ),
            current_version: format!(
                "SELECT CAST(COALESCE(MAX(version), 0) AS SIGNED) FROM {versions}"
            ),
            record_version: format!("INSERT IGNORE INTO {versions} (version) VALUES ({{version}})"),
            // The schema, one version at a time: each entry brings the table from the
            // previous version to this one. Never edit a released step; add the next.
            steps: {
                let t = table.backticked_with("");
                let ends_at = table.backticked_with("_ends_at");
                let claim = table.backticked_with("_claim");
                let version_1 = vec![
                        // `key` is `scope/id` as bytes (1281 = 256 + 1 + 1024), so NUL, control
                        // characters, case and normalisation all stay distinct. `ends_at`: lease end
                        // or expiry, milliseconds since the Unix epoch on the server's clock.
                        format!(
                            "CREATE TABLE IF NOT EXISTS {t} (
                                `key` VARBINARY(1281) NOT NULL PRIMARY KEY,
                                fingerprint VARBINARY(16) NOT NULL,
                                token BIGINT NOT NULL,
                                completed BOOLEAN NOT NULL,
                                payload LONGBLOB,
                                ends_at BIGINT NOT NULL,
                                INDEX {ends_at} (ends_at)
                            ) ENGINE = InnoDB
                              COMMENT = 'idempotency records of idem: one row per key, an in-progress claim or a stored result'"
                        ),
                        claim_procedure_v1(&t, &claim),
                ];
                // The claim's fence (`Fence`): rows written before it read as 0. MySQL has
                // no `ADD COLUMN IF NOT EXISTS` (MariaDB has), and DDL commits on its own,
                // so the column is added only where `information_schema` does not show it:
                // a migration stopped after the `ALTER` runs again cleanly. The procedure
                // is then made again with the fence.
                let version_2 = vec![
                    format!(
                        "SET @idem_add_fence = (SELECT IF(COUNT(*) = 0,
                            'ALTER TABLE {t} ADD COLUMN fence BIGINT NOT NULL DEFAULT 0', 'DO 0')
                         FROM information_schema.COLUMNS
                         WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = '{table}'
                           AND COLUMN_NAME = 'fence')"
                    ),
                    "PREPARE idem_add_fence FROM @idem_add_fence".into(),
                    "EXECUTE idem_add_fence".into(),
                    "DEALLOCATE PREPARE idem_add_fence".into(),
                    format!("DROP PROCEDURE IF EXISTS {claim}"),
                    claim_procedure(&t, &claim),
                ];
                vec![(1, version_1), (2, version_2)]
            },
        }
    }

    fn classify(db: &dyn sqlx::error::DatabaseError) -> DbErrorKind {
        let Some(db) = db.try_downcast_ref::<MySqlDatabaseError>() else {
            return DbErrorKind::Other;
        };
        match db.number() {
            // ER_NO_SUCH_TABLE; ER_SP_DOES_NOT_EXIST (the claim procedure).
            1146 | 1305 => DbErrorKind::MissingTable,
            // Too many connections, server shutdown, lock wait timeout, deadlock (the
            // statement was rolled back), connection killed, query interrupted.
            1040 | 1053 | 1205 | 1213 | 1927 | 1317 => DbErrorKind::Unavailable,
            _ => DbErrorKind::Other,
        }
    }

    fn key(key: &Key) -> Arg {
        Arg::Bytes(key.as_str().as_bytes().to_vec())
    }

    fn rows_affected(done: &MySqlQueryResult) -> u64 {
        // sqlx connects with CLIENT_FOUND_ROWS: an UPDATE counts the rows it matched, so a
        // repeated complete that changes nothing still counts its row.
        done.rows_affected()
    }

    async fn claim(store: &MySqlStore, request: ClaimRequest<'_>) -> Result<Claim, StoreError> {
        let ClaimRequest { key, token, .. } = request;
        let err = |e| store.error(e);
        let mine = token_to_db(token);
        // A plain indexed read first, as on Postgres: a replay (or a duplicate of a call
        // still running) is answered by a `SELECT`, which the server runs far faster than a
        // procedure `CALL` (parsed, with its own statements, and a result set of its own).
        // Only a key with no live record, or one this token holds (a resent claim), goes on
        // to the procedure: a first call costs a third round trip, next to its two commits.
        if let Some(answer) = store.claim_by_reading(key, token).await? {
            return Ok(answer);
        }
        for attempt in 1..=CLAIM_ATTEMPTS {
            let args = request.args::<MySql>();
            let row = match MySql::fetch_optional(store.pool(), &store.statements().claim[0], args)
                .await
            {
                Ok(row) => row,
                // Two claims inserting the key of a row just deleted (a release, a forget)
                // both take a shared lock on the deleted row before their exclusive one:
                // InnoDB breaks that deadlock by rolling one back whole. Nothing of it was
                // written, so it is claimed again.
                Err(e) if is_deadlock(&e) && attempt < CLAIM_ATTEMPTS => {
                    tracing::debug!(target: "idem", key = %key, attempt, "claim chosen as a deadlock victim; running it again");
                    continue;
                }
                Err(e) => return Err(err(e)),
            };
            if let Some(row) = row {
                // By position: sqlx knows no column names for the result of a prepared CALL.
                let read = || -> Result<(bool, bool, bool, LiveRow, i64), sqlx::Error> {
                    Ok((
                        MySql::flag(&row, Col::At(0))?,
                        MySql::flag(&row, Col::At(1))?,
                        MySql::flag(&row, Col::At(2))?,
                        LiveRow {
                            completed: MySql::flag(&row, Col::At(3))?,
                            fingerprint: MySql::bytes(&row, Col::At(4))?.unwrap_or_default(),
                            token: MySql::int(&row, Col::At(5))?,
                            payload: MySql::bytes(&row, Col::At(6))?,
                            remaining_ms: MySql::int(&row, Col::At(7))?,
                        },
                        MySql::int(&row, Col::At(8))?,
                    ))
                };
                let (taken, recovered, live, record, fence) = read().map_err(err)?;
                if taken {
                    return Ok(Claim::Acquired {
                        token: token_from_db(record.token),
                        recovered,
                        fence: fence_from_db(fence),
                    });
                }
                if live {
                    if !record.completed && record.token == mine {
                        // This claim, resent: the same claim, left as it is.
                        return Ok(Claim::Acquired {
                            token,
                            recovered: false,
                            fence: fence_from_db(fence),
                        });
                    }
                    return record.into_claim(Self::BACKEND);
                }
            }
            // The record changed between the procedure's read and its answer (released,
            // or its lease ended just then): claim again.
            tracing::debug!(target: "idem", key = %key, attempt, "claim raced a concurrent step; running it again");
        }
        Err(NoAnswer::error(Self::BACKEND))
    }
}

/// Whether `e` is InnoDB's deadlock answer (`ER_LOCK_DEADLOCK`): the statement's
/// transaction was rolled back whole.
fn is_deadlock(e: &sqlx::Error) -> bool {
    e.as_database_error()
        .and_then(|db| db.try_downcast_ref::<MySqlDatabaseError>())
        .is_some_and(|db| db.number() == 1213)
}

/// The claim, one `CALL` and one round trip: arguments key, fingerprint, lease in
/// milliseconds, the caller's token.
///
/// It reads the record's end without a lock; only when no live record is there does it
/// write: an `INSERT` where there is no row (a duplicate key means a concurrent claim won:
/// the answer is that claim), or a takeover `UPDATE ... WHERE ends_at <= now` where the
/// record ended. Then it answers with the row as it is, in this column order (read by
/// position): `taken` (this call wrote it), `recovered` (it replaced an abandoned claim),
/// `live`, `completed`, `fingerprint`, `token`, `payload`, `remaining_ms`, `fence`. A live
/// claim held by the caller's token is the caller's claim resent: nothing is written, and
/// its fence is answered again.
///
/// The fence of an inserted row is the server's clock in microseconds (`UTC_TIMESTAMP(6)`,
/// no time zone conversion); a takeover's is `GREATEST(fence + 1, clock)`, under the row
/// lock of its `UPDATE`.
///
/// Assignments in an `UPDATE` run left to right in MySQL, each seeing the ones before it,
/// which is why `ends_at`, which the condition reads, is always assigned last.
fn claim_procedure(t: &str, name: &str) -> String {
    format!(
        "CREATE PROCEDURE IF NOT EXISTS {name}(
            IN k VARBINARY(1281), IN fp VARBINARY(16), IN lease_ms BIGINT, IN tok BIGINT)
        SQL SECURITY INVOKER
        BEGIN
            DECLARE now_ms BIGINT DEFAULT {NOW_MS};
            DECLARE now_us BIGINT DEFAULT {NOW_US};
            DECLARE prev_ends BIGINT DEFAULT NULL;
            DECLARE prev_completed BOOLEAN DEFAULT FALSE;
            DECLARE taken BOOLEAN DEFAULT FALSE;
            DECLARE lost BOOLEAN DEFAULT FALSE;
            DECLARE CONTINUE HANDLER FOR NOT FOUND BEGIN END;
            DECLARE CONTINUE HANDLER FOR 1062 SET lost = TRUE;
            SELECT ends_at, completed INTO prev_ends, prev_completed FROM {t} WHERE `key` = k;
            IF prev_ends IS NULL THEN
                INSERT INTO {t} (`key`, fingerprint, token, completed, payload, ends_at, fence)
                    VALUES (k, fp, tok, FALSE, NULL, now_ms + lease_ms, now_us);
                SET taken = NOT lost;
            ELSEIF prev_ends <= now_ms THEN
                UPDATE {t} SET fingerprint = fp, token = tok, completed = FALSE, payload = NULL,
                    fence = GREATEST(fence + 1, now_us), ends_at = now_ms + lease_ms
                    WHERE `key` = k AND ends_at <= now_ms;
                SET taken = ROW_COUNT() = 1;
            END IF;
            SELECT taken AS taken,
                   taken AND prev_ends IS NOT NULL AND NOT prev_completed AS recovered,
                   ends_at > now_ms AS live,
                   completed, fingerprint, token, payload, ends_at - now_ms AS remaining_ms, fence
            FROM {t} WHERE `key` = k;
        END"
    )
}

/// The claim procedure of schema version 1, before fences: what version 1 made, kept as
/// it was (a released migration step is never edited); version 2 replaces it with
/// [`claim_procedure`].
///
/// The claim, one `CALL` and one round trip: arguments key, fingerprint, lease in
/// milliseconds, the caller's token.
///
/// It reads the record's end without a lock; only when no live record is there does it
/// write: an `INSERT` where there is no row (a duplicate key means a concurrent claim won:
/// the answer is that claim), or a takeover `UPDATE ... WHERE ends_at <= now` where the
/// record ended. Then it answers with the row as it is, in this column order (read by
/// position): `taken` (this call wrote it), `recovered` (it replaced an abandoned claim),
/// `live`, `completed`, `fingerprint`, `token`, `payload`, `remaining_ms`. A live
/// claim held by the caller's token is the caller's claim resent: nothing is written.
///
/// Assignments in an `UPDATE` run left to right in MySQL, each seeing the ones before it,
/// which is why `ends_at`, which the condition reads, is always assigned last.
fn claim_procedure_v1(t: &str, name: &str) -> String {
    format!(
        "CREATE PROCEDURE IF NOT EXISTS {name}(
            IN k VARBINARY(1281), IN fp VARBINARY(16), IN lease_ms BIGINT, IN tok BIGINT)
        SQL SECURITY INVOKER
        BEGIN
            DECLARE now_ms BIGINT DEFAULT {NOW_MS};
            DECLARE prev_ends BIGINT DEFAULT NULL;
            DECLARE prev_completed BOOLEAN DEFAULT FALSE;
            DECLARE taken BOOLEAN DEFAULT FALSE;
            DECLARE lost BOOLEAN DEFAULT FALSE;
            DECLARE CONTINUE HANDLER FOR NOT FOUND BEGIN END;
            DECLARE CONTINUE HANDLER FOR 1062 SET lost = TRUE;
            SELECT ends_at, completed INTO prev_ends, prev_completed FROM {t} WHERE `key` = k;
            IF prev_ends IS NULL THEN
                INSERT INTO {t} (`key`, fingerprint, token, completed, payload, ends_at)
                    VALUES (k, fp, tok, FALSE, NULL, now_ms + lease_ms);
                SET taken = NOT lost;
            ELSEIF prev_ends <= now_ms THEN
                UPDATE {t} SET fingerprint = fp, token = tok, completed = FALSE, payload = NULL,
                    ends_at = now_ms + lease_ms
                    WHERE `key` = k AND ends_at <= now_ms;
                SET taken = ROW_COUNT() = 1;
            END IF;
            SELECT taken AS taken,
                   taken AND prev_ends IS NOT NULL AND NOT prev_completed AS recovered,
                   ends_at > now_ms AS live,
                   completed, fingerprint, token, payload, ends_at - now_ms AS remaining_ms
            FROM {t} WHERE `key` = k;
        END"
    )
}
