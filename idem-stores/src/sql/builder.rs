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
    pub(crate) settings: D::Settings,
}

impl<D: Dialect> Clone for SqlStoreBuilder<D> {
    fn clone(&self) -> Self {
        SqlStoreBuilder {
            acquire_timeout: self.acquire_timeout,
            connect_timeout: self.connect_timeout,
            table: self.table.clone(),
            migrate: self.migrate,
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
            settings: D::Settings::default(),
        }
    }
}

impl<D: Dialect> SqlStoreBuilder<D> {
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

    /// Opens a pool on `url`. See [`connect_with`](Self::connect_with).
    pub async fn connect(self, url: &str) -> Result<SqlStore<D>, Error> {
        // The password is not shown: the check's message names the URL.
        crate::tls::check(url, || format!("{} URL", D::BACKEND))?;
        let options = <D::Connection as sqlx::Connection>::Options::from_str(url).map_err(|e| {
            Error::Connect {
                message: format!("invalid {} URL", D::BACKEND),
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
        let store = SqlStore::new(pool).with_table(&self.table)?;
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
