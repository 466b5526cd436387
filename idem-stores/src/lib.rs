//! Store backends for [idem](https://docs.rs/idemkit).
//!
//! [`MemoryStore`] is always there. The others come with cargo features: `redis`,
//! `redis-cluster`, `postgres`, `sqlite`, `mysql`, and TLS with `postgres-tls` and
//! `redis-tls` (rustls on ring). [`connect`] picks one from a URL. The
//! three SQL stores are one generic [`SqlStore`] in three dialects.
#![deny(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod admin;
mod connect;
mod memory;
mod redact;
#[cfg(feature = "redis")]
mod redis;
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
mod sql;
mod tls;

use std::time::Duration;

/// How long a networked store (Postgres, MySQL, Redis) waits for a new connection by
/// default: each builder's `connect_timeout` changes it.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

pub use connect::connect;
pub use memory::MemoryStore;
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub use redis::{
    LostRecords, RedisStore, RedisStoreBuilder, DEFAULT_REDIS_COMMAND_TIMEOUT,
    DEFAULT_REDIS_EPOCH_CHECK_INTERVAL, DEFAULT_REDIS_LOST_RECORDS_GRACE, DEFAULT_REDIS_PREFIX,
    DEFAULT_REDIS_RECOVERY_WINDOW,
};
#[cfg(feature = "mysql")]
#[cfg_attr(docsrs, doc(cfg(feature = "mysql")))]
pub use sql::mysql::{MySqlStore, MySqlStoreBuilder};
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub use sql::postgres::{PostgresStore, PostgresStoreBuilder, SynchronousCommit};
#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
pub use sql::sqlite::{SqliteSettings, SqliteStore, SqliteStoreBuilder, DEFAULT_BUSY_TIMEOUT};
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
#[cfg_attr(
    docsrs,
    doc(cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql")))
)]
pub use sql::Transactional;
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
#[cfg_attr(
    docsrs,
    doc(cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql")))
)]
pub use sql::{
    Dialect, SqlStore, SqlStoreBuilder, DEFAULT_ACQUIRE_TIMEOUT, DEFAULT_MIGRATE_LOCK_TIMEOUT,
};
