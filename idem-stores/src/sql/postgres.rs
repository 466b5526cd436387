//! `PostgresStore`: records in one Postgres table, each store step one statement, time
//! from the database's clock.
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

use async_trait::async_trait;
use idem_core::{Claim, Key, StoreError};
use sqlx::postgres::PgQueryResult;
pub use sqlx::Postgres;

use super::dialect::{Arg, ClaimRequest, Dialect, Migration, Sql, Statements};
use super::{
    token_from_db, DbErrorKind, NoAnswer, SqlStore, SqlStoreBuilder, TableName, CLAIM_ATTEMPTS,
};
pub use super::{DEFAULT_ACQUIRE_TIMEOUT, DEFAULT_CONNECT_TIMEOUT};

/// The schema version this build creates and reads.
pub const SCHEMA_VERSION: i32 = 1;

/// Idempotency records in a Postgres table (default `idem_records`), on a sqlx
/// [`PgPool`](sqlx::PgPool): the generic [`SqlStore`] in the Postgres dialect.
///
/// Every step is one statement and one round trip. A claim reads first: a replay costs 1
/// (a plain indexed read that finds the stored result), a first call 3 (the read, the claim
/// statement, complete). Leases and expiry run on the
/// database's clock (`now()`), never the client's.
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

#[async_trait]
impl Dialect for Postgres {
    const BACKEND: &'static str = "postgres";
    const STORE: &'static str = "PostgresStore";
    const SCHEMA_QUALIFIED: bool = true;
    type Settings = ();

    fn statements(table: &TableName) -> Statements {
        let t = table.quoted();
        // Only the holder of the current token, while its lease runs, may touch a claim.
        let held = "key = $1 AND token = $2 AND NOT completed AND ends_at > now()";
        Statements {
            claim: vec![Sql::numbered(claim_sql(&t))],
            // Also matches the record this token completed (a repeat), which it rewrites
            // with its own values: one statement, and a repeat that waited on the row lock
            // of its original still finds the completed row.
            complete: Sql::numbered(format!(
                "UPDATE {t} SET completed = true,
                    payload = CASE WHEN completed THEN payload ELSE $3 END,
                    ends_at = CASE WHEN completed THEN ends_at
                                   ELSE clock_timestamp() + $4 * interval '1 millisecond' END
                 WHERE key = $1 AND token = $2 AND ends_at > now()"
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
            delete: Sql::numbered(format!("DELETE FROM {t} WHERE key = $1 AND ends_at > now()")),
            delete_ended: Sql::numbered(format!(
                "DELETE FROM {t} WHERE key = $1 AND ends_at <= now()"
            )),
            purge: Sql::numbered(format!(
                "DELETE FROM {t} WHERE key IN (
                    SELECT key FROM {t} WHERE ends_at <= now() LIMIT $1 FOR UPDATE SKIP LOCKED
                 ) AND ends_at <= now()"
            )),
        }
    }

    fn migration(table: &TableName) -> Migration {
        let versions = table.quoted_with("_schema");
        Migration {
            // The lock is named after the table (an identifier, so it can be spliced), and
            // held until the transaction ends: DDL is transactional in Postgres.
            lock: vec![
                "BEGIN".into(),
                format!(
                    "SELECT pg_advisory_xact_lock(hashtextextended('idem.migrate:{table}', 0))"
                ),
            ],
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
                vec![(1, version_1)]
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
        if let Some(live) = store.live(key).await? {
            if live.completed || live.token != super::token_to_db(token) {
                return live.into_claim(Self::BACKEND);
            }
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
