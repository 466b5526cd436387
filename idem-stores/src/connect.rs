//! `connect(url)`: a store chosen by the URL's scheme.

use std::sync::Arc;

use idem_core::{Error, Store};

use crate::MemoryStore;

/// Opens the store a URL names: `memory://`, `sqlite://path`, `postgres://...`,
/// `redis://...` or `redis+cluster://host1,host2,...`. A scheme whose cargo feature is off
/// answers with an [`Error::Config`] naming the feature to turn on; a store that cannot be
/// reached, with an [`Error::Connect`].
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let store = idem_stores::connect("memory://").await.unwrap();
/// let err = idem_stores::connect("mongodb://localhost").await.unwrap_err();
/// assert!(err.to_string().contains("mongodb"));
/// # }
/// ```
pub async fn connect(url: &str) -> Result<Arc<dyn Store>, Error> {
    let scheme = url.split_once("://").map(|(s, _)| s).ok_or_else(|| Error::Config {
        message: format!("`{url}` is not a store URL: expected `scheme://...` (memory, sqlite, postgres, redis, redis+cluster)"),
        source: None,
    })?;
    match scheme {
        "memory" => Ok(Arc::new(MemoryStore::new())),
        // Each backend's arm: the real constructor when its feature is on.
        #[cfg(feature = "redis")]
        "redis" | "rediss" | "redis+unix" => Ok(Arc::new(crate::redis::RedisStore::open(url).await?)),
        #[cfg(not(feature = "redis"))]
        "redis" | "rediss" | "redis+unix" => missing(url, "redis"),
        #[cfg(feature = "redis-cluster")]
        "redis+cluster" | "rediss+cluster" => Ok(Arc::new(crate::redis::RedisStore::open(url).await?)),
        #[cfg(not(feature = "redis-cluster"))]
        "redis+cluster" | "rediss+cluster" => missing(url, "redis-cluster"),
        #[cfg(feature = "postgres")]
        "postgres" | "postgresql" => {
            let store = crate::PostgresStore::connect(url).await?;
            store.migrate().await.map_err(|e| set_up_failed("postgres", e))?;
            Ok(Arc::new(store))
        }
        #[cfg(not(feature = "postgres"))]
        "postgres" | "postgresql" => missing(url, "postgres"),
        #[cfg(feature = "sqlite")]
        "sqlite" => {
            let store = crate::SqliteStore::connect(url).await?;
            store.migrate().await.map_err(|e| set_up_failed("sqlite", e))?;
            Ok(Arc::new(store))
        }
        #[cfg(not(feature = "sqlite"))]
        "sqlite" => missing(url, "sqlite"),
        other => Err(Error::Config {
            message: format!(
                "unknown store URL scheme `{other}` in `{url}`: expected memory, sqlite, postgres, redis or redis+cluster"
            ),
            source: None,
        }),
    }
}

/// `connect` creates the SQL stores' tables; a failure there is a failure to connect.
#[cfg(any(feature = "postgres", feature = "sqlite"))]
fn set_up_failed(backend: &str, e: idem_core::StoreError) -> Error {
    Error::Connect {
        message: format!("the {backend} store could not create or migrate its table"),
        source: Some(Box::new(e)),
    }
}

#[allow(dead_code)]
fn missing(url: &str, feature: &str) -> Result<Arc<dyn Store>, Error> {
    let scheme = url.split("://").next().unwrap_or(url);
    Err(Error::Config {
        message: format!(
            "the `{scheme}://` store needs the cargo feature `{feature}` of idem (or idem-stores); it is off in this build"
        ),
        source: None,
    })
}
