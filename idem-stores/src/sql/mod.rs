//! The SQL stores: one generic [`SqlStore`] (`store.rs`, `builder.rs`) and a file per
//! dialect (`postgres.rs`, `sqlite.rs`, `mysql.rs`) with what differs: its statements, its
//! migration, its claim, its error codes and how it stores a key (`dialect.rs` says what a
//! dialect supplies). This file holds the small pieces they share: table names, connecting
//! within a time limit, durations as milliseconds, a record's columns as a claim answer, and
//! sqlx errors as [`StoreError`]s.

use std::fmt;
use std::time::Duration;

use bytes::Bytes;
use idem_core::{Claim, Error, Fence, Fingerprint, Record, StoreError, Token};

mod admin;
mod builder;
pub(crate) mod dialect;
#[cfg(feature = "mysql")]
pub mod mysql;
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "sqlite")]
pub mod sqlite;
mod store;
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
mod tx;

pub use builder::SqlStoreBuilder;
pub use dialect::Dialect;
pub use store::{SqlStore, DEFAULT_MIGRATE_LOCK_TIMEOUT};
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
pub use tx::Transactional;

/// The table a store uses unless told otherwise.
pub const DEFAULT_TABLE: &str = "idem_records";

/// The default longest wait for a connection from the pool, opening one included. Below
/// the engine's default step timeout (5 s), so that a pool that cannot lend a connection
/// says so itself before the engine gives up on the step.
pub const DEFAULT_ACQUIRE_TIMEOUT: Duration = Duration::from_secs(3);

pub(crate) use crate::DEFAULT_CONNECT_TIMEOUT;

/// Longest table name part: the store derives index and schema-version names from
/// it by appending up to 10 bytes, and Postgres cuts identifiers at 63.
const MAX_IDENT_LEN: usize = 48;

/// How often a claim statement runs when it answers with no row: under contention a
/// concurrent claim can commit after the statement's snapshot was taken. Once more always
/// answered in measurements; the bound only keeps a broken table from looping forever.
pub(crate) const CLAIM_ATTEMPTS: u32 = 5;

/// Ttls and leases are kept below this many milliseconds (about 100 years), so that
/// `now + ttl` never leaves the database's date range.
const MAX_MILLIS: i64 = 100 * 366 * 24 * 60 * 60 * 1000;

/// A validated table name, optionally schema-qualified (`schema.table`, Postgres only).
///
/// Each part is an SQL identifier, `[A-Za-z_][A-Za-z0-9_]*`, so it can be spliced into
/// statements (quoted) without any escaping; keys and payloads are only ever bound.
#[derive(Clone, PartialEq, Eq)]
pub struct TableName {
    schema: Option<String>,
    name: String,
}

impl TableName {
    pub(crate) fn parse(
        backend: &str,
        table: &str,
        allow_schema: bool,
    ) -> Result<TableName, Error> {
        let bad = |why: String| Error::Config {
            message: format!("invalid {backend} table name `{table}`: {why}"),
            source: None,
        };
        let (schema, name) = match table.split_once('.') {
            Some((s, n)) if allow_schema => (Some(s), n),
            Some(_) => return Err(bad("a schema-qualified name is not supported here".into())),
            None => (None, table),
        };
        for part in schema.iter().chain([&name]) {
            check_ident(part).map_err(&bad)?;
        }
        Ok(TableName {
            schema: schema.map(str::to_owned),
            name: name.to_owned(),
        })
    }

    /// The quoted, qualified name of this table with `suffix` appended to its last part.
    #[cfg_attr(not(any(feature = "postgres", feature = "sqlite")), allow(dead_code))]
    pub(crate) fn quoted_with(&self, suffix: &str) -> String {
        match &self.schema {
            Some(s) => format!("\"{s}\".\"{}{suffix}\"", self.name),
            None => format!("\"{}{suffix}\"", self.name),
        }
    }

    /// The quoted, qualified name of this table.
    #[cfg_attr(not(any(feature = "postgres", feature = "sqlite")), allow(dead_code))]
    pub(crate) fn quoted(&self) -> String {
        self.quoted_with("")
    }

    /// The name with `suffix`, quoted with backticks as MySQL quotes identifiers (double
    /// quotes are string quotes there unless `ANSI_QUOTES` is on). Never qualified.
    #[cfg_attr(not(feature = "mysql"), allow(dead_code))]
    pub(crate) fn backticked_with(&self, suffix: &str) -> String {
        format!("`{}{suffix}`", self.name)
    }

    /// The unqualified, quoted name with `suffix` (an index name, which takes no schema).
    #[cfg_attr(not(any(feature = "postgres", feature = "sqlite")), allow(dead_code))]
    pub(crate) fn bare_with(&self, suffix: &str) -> String {
        format!("\"{}{suffix}\"", self.name)
    }
}

impl fmt::Display for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.schema {
            Some(s) => write!(f, "{s}.{}", self.name),
            None => f.write_str(&self.name),
        }
    }
}

impl fmt::Debug for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

fn check_ident(part: &str) -> Result<(), String> {
    let mut chars = part.chars();
    match chars.next() {
        None => return Err("a name part is empty".into()),
        Some(c) if !(c.is_ascii_alphabetic() || c == '_') => {
            return Err(format!("`{part}` must start with a letter or `_`"))
        }
        _ => {}
    }
    if let Some(c) = chars.find(|c| !(c.is_ascii_alphanumeric() || *c == '_')) {
        return Err(format!(
            "`{part}` holds {c:?}; only ASCII letters, digits and `_` are allowed"
        ));
    }
    if part.len() > MAX_IDENT_LEN {
        return Err(format!(
            "`{part}` is {} bytes long; the limit is {MAX_IDENT_LEN}",
            part.len()
        ));
    }
    Ok(())
}

/// Opens one connection with `options` within `timeout`, then closes it: the check that
/// the database is there before a pool is built on it.
///
/// sqlx's `PoolOptions::connect` retries a refused connection until its acquire timeout and
/// then reports only `PoolTimedOut`; a direct connection fails at once with the real cause
/// (connection refused, authentication failed, no such database, ...), which becomes the
/// source of the [`Error::Connect`].
pub(crate) async fn probe<C: sqlx::Connection>(
    options: &<C as sqlx::Connection>::Options,
    timeout: Duration,
    what: impl Fn() -> String,
) -> Result<(), Error> {
    match tokio::time::timeout(timeout, C::connect_with(options)).await {
        Ok(Ok(conn)) => {
            // Closing politely only spares the server a log line; never wait long for it.
            let _ = tokio::time::timeout(timeout, conn.close()).await;
            Ok(())
        }
        Ok(Err(e)) => Err(Error::Connect {
            message: format!("cannot connect to {}", what()),
            source: Some(Box::new(e)),
        }),
        Err(_) => Err(Error::Connect {
            message: format!("no connection to {} within {timeout:?}", what()),
            source: Some(Box::new(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("the connect timeout of {timeout:?} ran out"),
            ))),
        }),
    }
}

/// A duration as whole milliseconds, rounded up (a lease never shrinks) and capped.
pub(crate) fn millis(d: Duration) -> i64 {
    let ms = d.as_nanos().div_ceil(1_000_000);
    i64::try_from(ms).unwrap_or(i64::MAX).min(MAX_MILLIS)
}

/// Milliseconds left, as the database computed them, as a duration (never negative).
pub(crate) fn remaining(ms: i64) -> Duration {
    Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

/// A token as the database keeps it: a signed 64-bit integer, the same bits.
pub(crate) fn token_to_db(token: Token) -> i64 {
    token.get() as i64
}

pub(crate) fn token_from_db(token: i64) -> Token {
    Token::from_u64(token as u64)
}

/// The fence a claim statement answered. The column is never negative (the clock in
/// microseconds, or `previous + 1`; 0 in rows written before fences existed).
pub(crate) fn fence_from_db(fence: i64) -> Fence {
    Fence::from_u64(u64::try_from(fence).unwrap_or(0))
}

/// The columns of a live record, as both stores read them.
pub(crate) struct LiveRow {
    pub completed: bool,
    pub fingerprint: Vec<u8>,
    pub token: i64,
    pub payload: Option<Vec<u8>>,
    pub remaining_ms: i64,
}

impl LiveRow {
    fn fingerprint(&self, backend: &'static str) -> Result<Fingerprint, StoreError> {
        Fingerprint::from_slice(&self.fingerprint).ok_or_else(|| StoreError::Corrupt {
            backend,
            reason: format!(
                "the fingerprint column holds {} bytes, not 16",
                self.fingerprint.len()
            ),
        })
    }

    fn payload(self, backend: &'static str) -> Result<Bytes, StoreError> {
        self.payload.map(Bytes::from).ok_or(StoreError::Corrupt {
            backend,
            reason: "a completed record has no payload".into(),
        })
    }

    /// What a claim answers when it finds this live record.
    pub(crate) fn into_claim(self, backend: &'static str) -> Result<Claim, StoreError> {
        let fingerprint = self.fingerprint(backend)?;
        Ok(if self.completed {
            Claim::Completed {
                fingerprint,
                payload: self.payload(backend)?,
            }
        } else {
            Claim::InProgress {
                fingerprint,
                retry_after: remaining(self.remaining_ms),
            }
        })
    }

    /// What `get` answers for this live record.
    pub(crate) fn into_record(self, backend: &'static str) -> Result<Record, StoreError> {
        let fingerprint = self.fingerprint(backend)?;
        Ok(if self.completed {
            Record::Completed {
                fingerprint,
                payload: self.payload(backend)?,
            }
        } else {
            Record::InProgress {
                fingerprint,
                token: token_from_db(self.token),
                lease_remaining: remaining(self.remaining_ms),
            }
        })
    }
}

/// How a database error is to be reported, as each backend classifies its codes.
pub enum DbErrorKind {
    /// The records table does not exist.
    MissingTable,
    /// The connection is gone or the server cannot take work now: temporary.
    Unavailable,
    /// Anything else the database refused.
    Other,
}

/// Sorts a sqlx error into a [`StoreError`], keeping the sqlx error as the source.
pub(crate) fn store_error(
    backend: &'static str,
    table: &TableName,
    store: &str,
    classify: impl Fn(&dyn sqlx::error::DatabaseError) -> DbErrorKind,
    e: sqlx::Error,
) -> StoreError {
    use sqlx::Error as E;
    match e {
        E::Database(db) => match classify(&*db) {
            DbErrorKind::MissingTable => StoreError::NotSetUp {
                backend,
                message: format!(
                    "the table `{table}` does not exist ({}): call {store}::migrate() once to create it \
                     (connecting by URL runs it for you)",
                    db.message()
                ),
            },
            DbErrorKind::Unavailable => StoreError::Unavailable {
                backend,
                source: Box::new(E::Database(db)),
            },
            DbErrorKind::Other => StoreError::Backend {
                backend,
                source: Box::new(E::Database(db)),
            },
        },
        e @ (E::Io(_)
        | E::Tls(_)
        | E::Protocol(_)
        | E::PoolTimedOut
        | E::PoolClosed
        | E::WorkerCrashed) => StoreError::Unavailable {
            backend,
            source: Box::new(e),
        },
        e => StoreError::Backend {
            backend,
            source: Box::new(e),
        },
    }
}

/// The error of a claim statement that kept answering with no row.
#[derive(Debug)]
pub(crate) struct NoAnswer {
    pub attempts: u32,
}

impl fmt::Display for NoAnswer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the claim statement answered with no row {} times in a row (constant contention on one key?)",
            self.attempts
        )
    }
}

impl std::error::Error for NoAnswer {}

impl NoAnswer {
    /// The store error of a claim that got no answer `CLAIM_ATTEMPTS` times.
    pub(crate) fn error(backend: &'static str) -> StoreError {
        StoreError::Backend {
            backend,
            source: Box::new(NoAnswer {
                attempts: CLAIM_ATTEMPTS,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names_are_identifiers() {
        assert_eq!(
            TableName::parse("postgres", "idem_records", true)
                .unwrap()
                .quoted(),
            "\"idem_records\""
        );
        let t = TableName::parse("postgres", "app.Idem_1", true).unwrap();
        assert_eq!(t.quoted_with("_seq"), "\"app\".\"Idem_1_seq\"");
        assert_eq!(t.bare_with("_x"), "\"Idem_1_x\"");
        assert_eq!(t.to_string(), "app.Idem_1");
        for bad in [
            "",
            "1abc",
            "a-b",
            "a b",
            "a\"b",
            "x;drop table y",
            "é",
            "a.b.c",
            ".a",
            "a.",
            &"x".repeat(49),
        ] {
            assert!(
                TableName::parse("postgres", bad, true).is_err(),
                "{bad:?} was accepted"
            );
        }
        assert!(TableName::parse("sqlite", "main.t", false).is_err());
    }

    #[test]
    fn millis_round_up_and_cap() {
        assert_eq!(millis(Duration::from_micros(1)), 1);
        assert_eq!(millis(Duration::from_millis(300)), 300);
        assert_eq!(millis(Duration::MAX), MAX_MILLIS);
        assert_eq!(remaining(-5), Duration::ZERO);
        assert_eq!(
            token_from_db(token_to_db(Token::from_u64(u64::MAX))),
            Token::from_u64(u64::MAX)
        );
    }
}
