//! What a SQL dialect supplies to [`SqlStore`]: its statements, its migration, how it
//! sorts its errors, how it stores a key, and its claim. Everything else is written once,
//! in `store.rs` and `builder.rs`.
//!
//! [`Driver`] is the other half: the few sqlx calls the generic store makes, with the
//! bounds they need spelled once (a blanket impl), so generic code names only `D: Dialect`.

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use idem_core::{Claim, Fingerprint, Key, StoreError, Token};
use sqlx::{ColumnIndex, Database, Decode, Encode, Executor, IntoArguments, Row, Type};

use super::{DbErrorKind, SqlStore, TableName};

/// A boxed future that can move between threads, as the store's steps are.
pub type BoxFuture<'a, T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + 'a>>;

/// A value bound to a statement. Owned, so that one set of bounds covers every dialect.
#[derive(Clone)]
pub enum Arg {
    /// A text parameter.
    Text(String),
    /// A binary parameter.
    Bytes(Vec<u8>),
    /// An integer parameter.
    Int(i64),
}

/// A statement with its parameters numbered `$1`, `$2`, ... in the order the store binds
/// them (key, token, then the step's own), whatever order the text uses them in.
pub struct Sql {
    /// The text as the database reads it.
    pub text: String,
    /// For positional placeholders (`?`): which bound argument each one takes. Empty when
    /// the database numbers its parameters itself.
    order: Vec<usize>,
}

impl Sql {
    /// A statement whose database reads numbered parameters (`$1` or `?1`) as they are.
    pub fn numbered(text: String) -> Sql {
        Sql {
            text,
            order: Vec::new(),
        }
    }

    /// A statement for a database with positional `?` placeholders: each `$n` (one digit)
    /// becomes `?`, and binding puts argument `n` there, so one argument may appear twice
    /// and in any order.
    pub fn positional(text: &str) -> Sql {
        let mut out = String::with_capacity(text.len());
        let mut order = Vec::new();
        let mut chars = text.chars().peekable();
        while let Some(c) = chars.next() {
            match (c, chars.peek().and_then(|d| d.to_digit(10))) {
                ('$', Some(n)) if n > 0 => {
                    chars.next();
                    order.push(n as usize - 1);
                    out.push('?');
                }
                _ => out.push(c),
            }
        }
        Sql { text: out, order }
    }

    /// The arguments in the order the text takes them.
    pub fn arrange(&self, args: Vec<Arg>) -> Vec<Arg> {
        if self.order.is_empty() {
            args
        } else {
            self.order.iter().map(|&i| args[i].clone()).collect()
        }
    }
}

/// The statements of one table, written by the dialect once per store. Parameters: `key`
/// first, then `token`, then what the step adds (lease or ttl in milliseconds, payload);
/// the replace statements, which take no token, the expected payload in its place.
pub struct Statements {
    /// `complete(key, token, payload, ttl_ms)`: one row affected when it took effect or
    /// repeats the completion of this token.
    pub complete: Sql,
    /// `extend(key, token, lease_ms)`: one row affected when the lease is held.
    pub extend: Sql,
    /// `release(key, token)`: one row affected when the held record was deleted.
    pub release: Sql,
    /// `exists(key)`: whether a record, ended or not, is under the key (after a release
    /// that deleted nothing: a repeat when there is none, fenced otherwise).
    pub exists: Sql,
    /// `get(key)`: the live record's columns (`completed`, `fingerprint`, `token`,
    /// `payload`, `remaining_ms`). A row whose `remaining_ms` is not positive has ended and
    /// is read as no record: a dialect may return it rather than evaluate its clock twice.
    pub get: Sql,
    /// `delete(key)`: one row affected when a live record was deleted.
    pub delete: Sql,
    /// `delete_ended(key)`: deletes the row of an ended record (after a `delete` that found
    /// no live one), so that nothing of the key is left, as with every other store.
    pub delete_ended: Sql,
    /// `purge(limit)`: deletes at most `limit` ended records.
    pub purge: Sql,
    /// `delete_seen(key, token)`: deletes the live record of this token (a claim or the
    /// result it completed), one row affected; what an operator deletes after looking.
    pub delete_seen: Sql,
    /// `replace(key, expected, payload, ttl_ms)`: one row affected when the live record was
    /// a completed one holding `expected` and now holds `payload` for `ttl_ms` from now (its
    /// fingerprint and token kept); `Store::replace` with a new payload.
    pub replace: Sql,
    /// `replace_delete(key, expected)`: one row affected when the live record was a
    /// completed one holding `expected` and was deleted; `Store::replace` with `None`.
    pub replace_delete: Sql,
    /// `count_ended()`: one row, `n`: how many ended records a purge would delete.
    pub count_ended: Sql,
    /// `stats()`: one row, `in_progress`, `completed`, `ended`: records by state.
    pub stats: Sql,
    /// The dialect's claim statements, which only its `claim` reads.
    pub claim: Vec<Sql>,
}

/// How a dialect migrates: one lock around all of it, the schema-version table, the steps.
/// Every statement runs as plain SQL text on one connection.
pub struct Migration {
    /// Takes the lock that serialises migrations of this table (and opens a transaction
    /// where DDL is transactional).
    pub lock: Vec<String>,
    /// A query answering 1 when it took the lock, anything else when it did not (MySQL's
    /// `GET_LOCK`, which answers 0 when its timeout ran out): the migration then fails.
    pub acquire: Option<String>,
    /// Ends what `lock` began after success.
    pub commit: Vec<String>,
    /// Ends what `lock` began after a failure.
    pub abort: Vec<String>,
    /// Creates the schema-version table when it is missing.
    pub create_versions: String,
    /// One row, one BIGINT column: the highest version recorded, 0 for none.
    pub current_version: String,
    /// Records a version: `{version}` is replaced by the number.
    pub record_version: String,
    /// Each version's statements, from the previous version to this one. Never edit a
    /// released step; add the next.
    pub steps: Vec<(i64, Vec<String>)>,
}

impl Migration {
    /// The schema version this build's steps bring a table to.
    pub fn newest(&self) -> i64 {
        self.steps.last().map_or(0, |(v, _)| *v)
    }
}

/// A SQL database idem keeps records in: the `D` of [`SqlStore<D>`], implemented by
/// sqlx's `Postgres`, `Sqlite` and `MySql` (features `postgres`, `sqlite`, `mysql`), and
/// named through their aliases ([`PostgresStore`](crate::PostgresStore),
/// [`SqliteStore`](crate::SqliteStore), [`MySqlStore`](crate::MySqlStore)).
///
/// Sealed: only this crate implements it, so that a new database is a new file here (its
/// statements, migration, claim and error codes) and no change breaks an outside
/// implementation. Write generic code over the stores with `D: Dialect`:
///
/// ```
/// use idem_stores::{Dialect, SqlStore};
///
/// fn table_of<D: Dialect>(store: &SqlStore<D>) -> String {
///     format!("{} table {}", D::BACKEND, store.table())
/// }
/// ```
///
/// What a dialect supplies beyond its names is the store's own business and hidden.
#[async_trait]
pub trait Dialect: Driver + Sealed + Sized {
    /// The backend's name in errors and metrics.
    const BACKEND: &'static str;
    /// The user-facing store name, in error messages (`PostgresStore`).
    const STORE: &'static str;
    #[doc(hidden)]
    /// The URL schemes its `connect` takes (`postgres`, `postgresql`).
    const SCHEMES: &'static [&'static str];
    #[doc(hidden)]
    /// Whether its `connect` also takes what has no `scheme://` (SQLite: a file path, or
    /// `sqlite:file.db`).
    const BARE_PATHS: bool = false;
    #[doc(hidden)]
    /// Whether a table name may carry a schema (`schema.table`).
    const SCHEMA_QUALIFIED: bool = false;

    #[doc(hidden)]
    /// Options a dialect's builder adds to the shared ones (SQLite: its busy timeout).
    type Settings: Default + Clone + fmt::Debug + Send + Sync;

    #[doc(hidden)]
    /// The statements for `table`, with the settings that shape them (Postgres: the
    /// commit level of its writes).
    fn statements(table: &TableName, settings: &Self::Settings) -> Statements;
    #[doc(hidden)]
    /// The migration of `table`, waiting at most `lock_timeout` for its lock.
    fn migration(table: &TableName, lock_timeout: Duration) -> Migration;
    #[doc(hidden)]
    /// Sorts a database error.
    fn classify(db: &dyn sqlx::error::DatabaseError) -> DbErrorKind;
    #[doc(hidden)]
    /// The key column's value for `key`.
    fn key(key: &Key) -> Arg;
    #[doc(hidden)]
    /// How many rows a statement affected.
    fn rows_affected(done: &Self::QueryResult) -> u64;
    #[doc(hidden)]
    /// The connect options as the store needs them, with the builder's settings applied
    /// (as they are, unless the dialect needs more).
    fn prepare(
        options: <Self::Connection as sqlx::Connection>::Options,
        _settings: &Self::Settings,
    ) -> <Self::Connection as sqlx::Connection>::Options {
        options
    }
    #[doc(hidden)]
    /// What a connect error names: the server or file the options point at (never the
    /// user or password). Read from the options one by one: sqlx's own URL of them
    /// (`to_url_lossy`) panics on some (a Unix socket as the host).
    fn describe(options: &<Self::Connection as sqlx::Connection>::Options) -> String;

    #[doc(hidden)]
    /// A connect error, with what the dialect can tell about its cause.
    fn explain_connect_error(
        _options: &<Self::Connection as sqlx::Connection>::Options,
        e: idem_core::Error,
    ) -> idem_core::Error {
        e
    }

    #[doc(hidden)]
    /// The claim: one atomic step, as `Store::claim` describes it.
    async fn claim(store: &SqlStore<Self>, request: ClaimRequest<'_>) -> Result<Claim, StoreError>;
}

/// What a claim asks for, as `Store::claim` takes it.
#[derive(Clone, Copy)]
pub struct ClaimRequest<'a> {
    /// The key.
    pub key: &'a Key,
    /// The caller's fingerprint.
    pub fingerprint: &'a Fingerprint,
    /// The caller's token.
    pub token: Token,
    /// The lease asked for.
    pub lease: Duration,
}

impl ClaimRequest<'_> {
    /// The arguments every dialect's claim statement takes, in this order: key,
    /// fingerprint, lease in milliseconds, token.
    pub fn args<D: Dialect>(&self) -> Vec<Arg> {
        vec![
            D::key(self.key),
            Arg::Bytes(self.fingerprint.as_bytes().to_vec()),
            Arg::Int(super::millis(self.lease)),
            Arg::Int(super::token_to_db(self.token)),
        ]
    }
}

/// Keeps [`Dialect`] to the databases this crate implements it for (unnameable outside it).
pub trait Sealed {}

#[cfg(feature = "postgres")]
impl Sealed for sqlx::Postgres {}
#[cfg(feature = "sqlite")]
impl Sealed for sqlx::Sqlite {}
#[cfg(feature = "mysql")]
impl Sealed for sqlx::MySql {}

/// The sqlx calls the generic store makes. Implemented for every sqlx database that has
/// what they need; generic code then needs no bound but `D: Dialect`.
pub trait Driver: Database {
    /// Runs `sql` with `args` on the pool.
    fn execute<'a>(
        pool: &'a sqlx::Pool<Self>,
        sql: &'a Sql,
        args: Vec<Arg>,
    ) -> BoxFuture<'a, Result<Self::QueryResult, sqlx::Error>>;

    /// Runs `sql` with `args` on the pool; its first row, if any.
    fn fetch_optional<'a>(
        pool: &'a sqlx::Pool<Self>,
        sql: &'a Sql,
        args: Vec<Arg>,
    ) -> BoxFuture<'a, Result<Option<Self::Row>, sqlx::Error>>;

    /// Runs `sql` with `args` on one connection (the caller's, inside its transaction).
    fn execute_on<'a>(
        conn: &'a mut Self::Connection,
        sql: &'a Sql,
        args: Vec<Arg>,
    ) -> BoxFuture<'a, Result<Self::QueryResult, sqlx::Error>>;

    /// Runs `sql` with `args` on one connection; its first row, if any.
    fn fetch_optional_on<'a>(
        conn: &'a mut Self::Connection,
        sql: &'a Sql,
        args: Vec<Arg>,
    ) -> BoxFuture<'a, Result<Option<Self::Row>, sqlx::Error>>;

    /// Runs plain SQL text on one connection.
    fn execute_raw<'a>(
        conn: &'a mut Self::Connection,
        sql: &'a str,
    ) -> BoxFuture<'a, Result<(), sqlx::Error>>;

    /// Runs plain SQL text on one connection; the first column of its one row.
    fn fetch_i64_raw<'a>(
        conn: &'a mut Self::Connection,
        sql: &'a str,
    ) -> BoxFuture<'a, Result<i64, sqlx::Error>>;

    /// An integer column.
    fn int(row: &Self::Row, column: Col<'_>) -> Result<i64, sqlx::Error>;
    /// A boolean column (an integer 0 or 1 where the database has no booleans).
    fn flag(row: &Self::Row, column: Col<'_>) -> Result<bool, sqlx::Error>;
    /// A binary column that may be NULL.
    fn bytes(row: &Self::Row, column: Col<'_>) -> Result<Option<Vec<u8>>, sqlx::Error>;
}

impl<DB> Driver for DB
where
    DB: Database,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    String: for<'q> Encode<'q, DB> + Type<DB>,
    Vec<u8>: for<'q> Encode<'q, DB> + for<'r> Decode<'r, DB> + Type<DB>,
    i64: for<'q> Encode<'q, DB> + for<'r> Decode<'r, DB> + Type<DB>,
    bool: for<'r> Decode<'r, DB> + Type<DB>,
    for<'s> &'s str: ColumnIndex<DB::Row>,
    usize: ColumnIndex<DB::Row>,
{
    fn execute<'a>(
        pool: &'a sqlx::Pool<DB>,
        sql: &'a Sql,
        args: Vec<Arg>,
    ) -> BoxFuture<'a, Result<DB::QueryResult, sqlx::Error>> {
        Box::pin(async move { bind(&sql.text, sql.arrange(args)).execute(pool).await })
    }

    fn fetch_optional<'a>(
        pool: &'a sqlx::Pool<DB>,
        sql: &'a Sql,
        args: Vec<Arg>,
    ) -> BoxFuture<'a, Result<Option<DB::Row>, sqlx::Error>> {
        Box::pin(async move {
            bind(&sql.text, sql.arrange(args))
                .fetch_optional(pool)
                .await
        })
    }

    fn execute_on<'a>(
        conn: &'a mut DB::Connection,
        sql: &'a Sql,
        args: Vec<Arg>,
    ) -> BoxFuture<'a, Result<DB::QueryResult, sqlx::Error>> {
        Box::pin(async move { bind(&sql.text, sql.arrange(args)).execute(conn).await })
    }

    fn fetch_optional_on<'a>(
        conn: &'a mut DB::Connection,
        sql: &'a Sql,
        args: Vec<Arg>,
    ) -> BoxFuture<'a, Result<Option<DB::Row>, sqlx::Error>> {
        Box::pin(async move {
            bind(&sql.text, sql.arrange(args))
                .fetch_optional(conn)
                .await
        })
    }

    fn execute_raw<'a>(
        conn: &'a mut DB::Connection,
        sql: &'a str,
    ) -> BoxFuture<'a, Result<(), sqlx::Error>> {
        Box::pin(async move { Executor::execute(conn, sqlx::raw_sql(sql)).await.map(drop) })
    }

    fn fetch_i64_raw<'a>(
        conn: &'a mut DB::Connection,
        sql: &'a str,
    ) -> BoxFuture<'a, Result<i64, sqlx::Error>> {
        Box::pin(async move {
            Executor::fetch_one(conn, sqlx::raw_sql(sql))
                .await?
                .try_get(0usize)
        })
    }

    fn int(row: &DB::Row, column: Col<'_>) -> Result<i64, sqlx::Error> {
        column.get(row)
    }

    fn flag(row: &DB::Row, column: Col<'_>) -> Result<bool, sqlx::Error> {
        column.get(row)
    }

    fn bytes(row: &DB::Row, column: Col<'_>) -> Result<Option<Vec<u8>>, sqlx::Error> {
        column.get(row)
    }
}

/// A column of a row, by name, or by position where the database does not name them.
#[derive(Clone, Copy)]
pub enum Col<'a> {
    /// By name.
    Name(&'a str),
    /// By position, from 0.
    At(usize),
}

impl Col<'_> {
    fn get<R, T>(self, row: &R) -> Result<T, sqlx::Error>
    where
        R: Row,
        for<'s> &'s str: ColumnIndex<R>,
        usize: ColumnIndex<R>,
        T: for<'r> Decode<'r, R::Database> + Type<R::Database>,
    {
        match self {
            Col::Name(name) => row.try_get(name),
            Col::At(i) => row.try_get(i),
        }
    }
}

fn bind<DB>(sql: &str, args: Vec<Arg>) -> sqlx::query::Query<'_, DB, DB::Arguments<'_>>
where
    DB: Database,
    String: for<'q> Encode<'q, DB> + Type<DB>,
    Vec<u8>: for<'q> Encode<'q, DB> + Type<DB>,
    i64: for<'q> Encode<'q, DB> + Type<DB>,
{
    let mut q = sqlx::query(sql);
    for arg in args {
        q = match arg {
            Arg::Text(s) => q.bind(s),
            Arg::Bytes(b) => q.bind(b),
            Arg::Int(i) => q.bind(i),
        };
    }
    q
}

/// What a connect error names of a server: `<backend> at <host>:<port> (database <db>)`,
/// or the socket instead of the host and port.
pub(crate) fn describe_server(
    backend: &str,
    socket: Option<&std::path::Path>,
    host: &str,
    port: u16,
    database: Option<&str>,
) -> String {
    let at = match socket {
        Some(socket) => format!("the socket in `{}`", socket.display()),
        // Postgres without a host in its URL: the directory of a local socket, if any.
        None if host.starts_with('/') => format!("the socket in `{host}` (port {port})"),
        None => format!("{host}:{port}"),
    };
    format!("{backend} at {at} (database `{}`)", database.unwrap_or(""))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positional_statements_take_their_arguments_by_number() {
        let sql = Sql::positional("UPDATE t SET a = $3 WHERE k = $1 AND t = $2 AND b = $3");
        assert_eq!(
            sql.text,
            "UPDATE t SET a = ? WHERE k = ? AND t = ? AND b = ?"
        );
        let args = sql.arrange(vec![Arg::Int(1), Arg::Int(2), Arg::Int(3)]);
        let ints: Vec<i64> = args
            .iter()
            .map(|a| match a {
                Arg::Int(i) => *i,
                _ => unreachable!(),
            })
            .collect();
        assert_eq!(ints, [3, 1, 2, 3]);
        assert_eq!(
            Sql::numbered("x = $2".into())
                .arrange(vec![Arg::Int(9)])
                .len(),
            1
        );
    }
}
