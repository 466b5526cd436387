//! `connect(url)`: a store chosen by the URL's scheme.

use std::sync::Arc;

use idem_core::{Error, Store};

use crate::redact::{redact, scheme};
use crate::MemoryStore;

/// Opens the store a URL names: `memory://`, `sqlite://path`, `postgres://...`,
/// `mysql://...` (MySQL or MariaDB), `redis://...` or `redis+cluster://host1,host2,...`. A
/// scheme whose cargo feature is off answers with an [`Error::Config`] naming the feature to
/// turn on, and so does an unknown scheme or a malformed URL, saying so; a store that
/// cannot be reached, with an [`Error::Connect`].
///
/// A SQL store opened here creates its table when it is missing, as its own `connect`
/// does (see [`SqlStore`](crate::SqlStore) for the rule).
///
/// No error shows the URL's password: a URL in a message has it (and any query parameter
/// that may hold a secret) replaced by `***`, and one without a `scheme://` is not shown.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let store = idem::stores::connect("memory://").await.unwrap();
/// let err = idem::stores::connect("mongodb://localhost").await.unwrap_err();
/// assert!(err.to_string().contains("mongodb"));
/// # }
/// ```
pub async fn connect(url: &str) -> Result<Arc<dyn Store>, Error> {
    let scheme = checked_scheme(url)?;
    match scheme {
        "memory" => Ok(Arc::new(MemoryStore::new())),
        // Each backend's arm: the real constructor when its feature is on.
        #[cfg(feature = "redis")]
        "redis" | "rediss" | "redis+unix" => Ok(Arc::new(crate::redis::RedisStore::open(url).await?)),
        #[cfg(not(feature = "redis"))]
        "redis" | "rediss" | "redis+unix" => missing(scheme, "redis"),
        #[cfg(feature = "redis-cluster")]
        "redis+cluster" | "rediss+cluster" => Ok(Arc::new(crate::redis::RedisStore::open(url).await?)),
        #[cfg(not(feature = "redis-cluster"))]
        "redis+cluster" | "rediss+cluster" => missing(scheme, "redis-cluster"),
        // The SQL stores' own `connect` creates the table, as this one promises.
        #[cfg(feature = "postgres")]
        "postgres" | "postgresql" => Ok(Arc::new(crate::PostgresStore::connect(url).await?)),
        #[cfg(not(feature = "postgres"))]
        "postgres" | "postgresql" => missing(scheme, "postgres"),
        #[cfg(feature = "mysql")]
        "mysql" | "mariadb" => Ok(Arc::new(crate::MySqlStore::connect(url).await?)),
        #[cfg(not(feature = "mysql"))]
        "mysql" | "mariadb" => missing(scheme, "mysql"),
        #[cfg(feature = "sqlite")]
        "sqlite" => Ok(Arc::new(crate::SqliteStore::connect(url).await?)),
        #[cfg(not(feature = "sqlite"))]
        "sqlite" => missing(scheme, "sqlite"),
        other => Err(Error::Config {
            message: format!(
                "unknown store URL scheme `{other}` in `{}`: expected memory, sqlite, postgres, mysql, redis or redis+cluster",
                redact(url)
            ),
            source: None,
        }),
    }
}

/// The scheme of a store URL, once the URL is known not to ask for TLS this build cannot
/// give (`tls::check`): what every opening by URL checks first.
pub(crate) fn checked_scheme(url: &str) -> Result<&str, Error> {
    // Without a scheme, nothing tells a password from the rest: the URL is not shown.
    let scheme = scheme(url).ok_or_else(|| Error::Config {
        message: "this store URL does not start with `scheme://` (memory, sqlite, postgres, mysql, redis, redis+cluster); it is not shown, as it may hold a password".into(),
        source: None,
    })?;
    crate::tls::check(url, || redact(url))?;
    Ok(scheme)
}

#[allow(dead_code)]
fn missing(scheme: &str, feature: &str) -> Result<Arc<dyn Store>, Error> {
    Err(Error::Config {
        message: format!(
            "the `{scheme}://` store needs the cargo feature `{feature}` of idem (or idem-stores); it is off in this build"
        ),
        source: None,
    })
}

#[cfg(test)]
mod tests {
    /// Every scheme answers, with or without its feature: a store, or an error naming the
    /// feature to turn on.
    #[cfg(not(feature = "mysql"))]
    #[tokio::test]
    async fn mysql_without_its_feature_names_the_feature() {
        for url in [
            "mysql://root@127.0.0.1/test",
            "mariadb://root@127.0.0.1/test",
        ] {
            let err = super::connect(url).await.unwrap_err().to_string();
            assert!(err.contains("cargo feature `mysql`"), "{err}");
        }
    }
}
