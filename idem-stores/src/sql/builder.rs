//! [`SqlStoreBuilder`]: a SQL store that opens its own pool, within time limits, on a
//! table it creates.

use std::str::FromStr;
use std::time::Duration;

use idem_core::Error;

use super::dialect::Dialect;
use super::{probe, SqlStore, DEFAULT_ACQUIRE_TIMEOUT, DEFAULT_CONNECT_TIMEOUT, DEFAULT_TABLE};

/// Options of a SQL store that opens its own pool: how long to wait for the database, which
/// table, and whether to create it. Use it by its dialect's name
/// ([`PostgresStoreBuilder`](crate::PostgresStoreBuilder), ...).
#[must_use]
pub struct SqlStoreBuilder<D: Dialect> {
    acquire_timeout: Duration,
    connect_timeout: Duration,
    table: String,
    migrate: bool,
    migrate_lock_timeout: Duration,
    pub(crate) settings: D::Settings,
}

impl<D: Dialect> Clone for SqlStoreBuilder<D> {
    fn clone(&self) -> Self {
        SqlStoreBuilder {
            acquire_timeout: self.acquire_timeout,
            connect_timeout: self.connect_timeout,
            table: self.table.clone(),
            migrate: self.migrate,
            migrate_lock_timeout: self.migrate_lock_timeout,
            settings: self.settings.clone(),
        }
    }
}

impl<D: Dialect> std::fmt::Debug for SqlStoreBuilder<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqlStoreBuilder")
            .field("backend", &D::BACKEND)
            .field("acquire_timeout", &self.acquire_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("table", &self.table)
            .field("migrate", &self.migrate)
            .field("migrate_lock_timeout", &self.migrate_lock_timeout)
            .field("settings", &self.settings)
            .finish()
    }
}

impl<D: Dialect> Default for SqlStoreBuilder<D> {
    fn default() -> Self {
        SqlStoreBuilder {
            acquire_timeout: DEFAULT_ACQUIRE_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            table: DEFAULT_TABLE.to_owned(),
            migrate: true,
            migrate_lock_timeout: super::DEFAULT_MIGRATE_LOCK_TIMEOUT,
            settings: D::Settings::default(),
        }
    }
}

impl<D: Dialect> SqlStoreBuilder<D> {
    /// The longest wait for a connection from the pool, opening a new one included
    /// (default 3 s). Keep it at or below the engine's step timeout
    /// ([`IdemBuilder::store_timeout`](idem_core::IdemBuilder::store_timeout), default 5 s):
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

    /// The table (default `idem_records`), as [`SqlStore::with_table`] takes it; checked
    /// when the store connects.
    pub fn table(mut self, table: &str) -> Self {
        self.table = table.to_owned();
        self
    }

    /// Whether connecting runs [`SqlStore::migrate`] (default `true`). Turn it off where the
    /// service's database user may not create tables, and migrate from a deploy step.
    pub fn migrate(mut self, yes: bool) -> Self {
        self.migrate = yes;
        self
    }

    /// How long connecting waits for a migration of the same table that another process
    /// runs (default 60 s), as [`SqlStore::with_migrate_lock_timeout`] sets it.
    pub fn migrate_lock_timeout(mut self, timeout: Duration) -> Self {
        self.migrate_lock_timeout = timeout;
        self
    }

    /// Opens a pool on `url`. See [`connect_with`](Self::connect_with).
    ///
    /// A URL of another scheme, or one that does not parse, is an [`Error::Config`]; no
    /// error shows the URL's password.
    pub async fn connect(self, url: &str) -> Result<SqlStore<D>, Error> {
        let schemes = D::SCHEMES
            .iter()
            .map(|s| format!("`{s}://`"))
            .collect::<Vec<_>>()
            .join(" or ");
        match crate::redact::scheme(url) {
            Some(scheme) if D::SCHEMES.contains(&scheme) => {}
            None if D::BARE_PATHS => {}
            found => {
                let found = match found {
                    Some(scheme) => {
                        format!("`{}` is a `{scheme}://` URL", crate::redact::redact(url))
                    }
                    // Not shown: without a scheme, nothing tells its password apart.
                    None => {
                        "this one has no `scheme://` (it is not shown, as it may hold a password)"
                            .into()
                    }
                };
                return Err(Error::Config {
                    message: format!("{} takes a {schemes} URL; {found}", D::STORE),
                    source: None,
                });
            }
        }
        crate::tls::check(url, || crate::redact::redact(url))?;
        let options = <D::Connection as sqlx::Connection>::Options::from_str(url).map_err(|e| {
            let shown = match crate::redact::scheme(url) {
                Some(_) => format!("`{}`", crate::redact::redact(url)),
                None => "this path (not shown: it has no `scheme://`)".into(),
            };
            // sqlx's reason ("invalid port number") names no part of the URL.
            Error::Config {
                message: format!("{shown} is not a valid {} URL", D::BACKEND),
                source: Some(Box::new(e)),
            }
        })?;
        self.connect_with(options).await
    }

    /// Opens a pool with your connect options, then creates the table (unless
    /// [`migrate(false)`](Self::migrate)).
    ///
    /// It connects once first, so a wrong URL or a server that is down shows at startup:
    /// within the connect timeout, as an [`Error::Connect`] naming the database, whose
    /// source chain holds the cause (connection refused, authentication failed, ...). The
    /// pool waits at most the acquire timeout for a connection, and does not ping a
    /// connection before each statement (sqlx's `test_before_acquire`), which would cost a
    /// second round trip per step; a connection that died is noticed by the statement,
    /// which fails (the body does not run), and the pool replaces it.
    pub async fn connect_with(
        self,
        options: <D::Connection as sqlx::Connection>::Options,
    ) -> Result<SqlStore<D>, Error> {
        let options = D::prepare(options, &self.settings);
        probe::<D::Connection>(&options, self.connect_timeout, || D::describe(&options))
            .await
            .map_err(|e| D::explain_connect_error(&options, e))?;
        let pool = sqlx::pool::PoolOptions::<D>::new()
            .test_before_acquire(false)
            .acquire_timeout(self.acquire_timeout)
            .connect_lazy_with(options);
        let store = SqlStore::new(pool)
            .with_settings(self.settings.clone())
            .with_table(&self.table)?
            .with_migrate_lock_timeout(self.migrate_lock_timeout);
        if self.migrate {
            store.migrate().await.map_err(|e| Error::Connect {
                message: format!(
                    "the {} store could not create or migrate its table `{}`",
                    D::BACKEND,
                    store.table()
                ),
                source: Some(Box::new(e)),
            })?;
        }
        Ok(store)
    }
}

impl<D: Dialect> SqlStore<D> {
    /// Opens a pool on `url` with the default options ([`builder`](Self::builder) to
    /// choose them), and creates the table when it is missing. See
    /// [`SqlStoreBuilder::connect_with`].
    pub async fn connect(url: &str) -> Result<Self, Error> {
        Self::builder().connect(url).await
    }

    /// Opens a pool with your connect options, and creates the table when it is missing.
    /// See [`SqlStoreBuilder::connect_with`].
    pub async fn connect_with(
        options: <D::Connection as sqlx::Connection>::Options,
    ) -> Result<Self, Error> {
        Self::builder().connect_with(options).await
    }

    /// A builder, to choose the timeouts, the table and whether to migrate.
    pub fn builder() -> SqlStoreBuilder<D> {
        SqlStoreBuilder::default()
    }
}
