//! Connecting a [`RedisStoreBuilder`]: from a URL, from cluster nodes, or on a connection
//! the user already has; each then loads the scripts (`load.rs`).

use std::time::Duration;

use idem_core::Error;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};

#[cfg(feature = "redis-cluster")]
use super::url::cluster_nodes;
use super::url::redact;
use super::{Connection, RedisStore, RedisStoreBuilder};

impl RedisStoreBuilder {
    /// Connects to the server(s) a URL names:
    ///
    /// - `redis://[user:password@]host[:port][/db]`, `rediss://...` (TLS, when the `redis`
    ///   crate's TLS feature is on) or `redis+unix:///path/to.sock`: one server, through a
    ///   [`ConnectionManager`](https://docs.rs/redis/1/redis/aio/struct.ConnectionManager.html) that reconnects on its own;
    /// - `redis+cluster://[user:password@]host1:port1,host2:port2,...` (or
    ///   `rediss+cluster://`): a Redis Cluster, given any of its nodes (feature
    ///   `redis-cluster`).
    ///
    /// Then loads the scripts, and warns when the server's `maxmemory-policy` can evict
    /// records. A server that cannot be reached within the connect timeout is an
    /// [`Error::Connect`] with the client's error as its source; a URL that is not one, an
    /// [`Error::Config`]. No error shows the URL's password (nor a `pass` parameter's).
    pub async fn open(self, url: &str) -> Result<RedisStore, Error> {
        // Without a scheme, nothing tells a password from the rest: the URL is not shown.
        let Some(scheme) = crate::redact::scheme(url) else {
            return Err(config_error(
                "a Redis URL starts with `redis://`, `rediss://`, `redis+unix://` or `redis+cluster://`; this one has no `scheme://` (it is not shown, as it may hold a password)".into(),
                None,
            ));
        };
        crate::tls::check(url, || redact(url))?;
        match scheme {
            "redis+cluster" | "rediss+cluster" => {
                #[cfg(feature = "redis-cluster")]
                {
                    let nodes = cluster_nodes(url)?;
                    self.open_cluster(nodes).await
                }
                #[cfg(not(feature = "redis-cluster"))]
                Err(config_error(
                    format!("`{scheme}://` needs the cargo feature `redis-cluster` of idem (or idem-stores)"),
                    None,
                ))
            }
            _ => {
                let client = redis::Client::open(url).map_err(|e| {
                    config_error(format!("`{}` is not a Redis URL", redact(url)), Some(e))
                })?;
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(self.connect_timeout))
                    .set_response_timeout(Some(self.command_timeout))
                    // Reconnect quickly and give up soon: the engine fails closed, and the
                    // next call tries again.
                    .set_number_of_retries(1)
                    .set_min_delay(Duration::from_millis(50))
                    .set_max_delay(self.connect_timeout);
                let manager = tokio::time::timeout(
                    self.connect_timeout * 3,
                    ConnectionManager::new_with_config(client, config),
                )
                .await
                .map_err(|_| {
                    connect_error(
                        format!(
                            "no connection to `{}` within {:?}",
                            redact(url),
                            self.connect_timeout * 3
                        ),
                        None,
                    )
                })?
                .map_err(|e| {
                    connect_error(format!("cannot connect to `{}`", redact(url)), Some(e))
                })?;
                let store = self.build(Connection::Standalone(manager), redact(url));
                store.prepare().await.map_err(|e| {
                    connect_error(
                        format!(
                            "connected to `{}` but could not load idem's scripts",
                            redact(url)
                        ),
                        Some(e),
                    )
                })?;
                Ok(store)
            }
        }
    }

    /// Connects to a Redis Cluster through any of its nodes (`redis://host:port` each),
    /// loads the scripts and checks the eviction policy of every primary.
    #[cfg(feature = "redis-cluster")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis-cluster")))]
    pub async fn open_cluster<I, S>(self, nodes: I) -> Result<RedisStore, Error>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let nodes: Vec<String> = nodes.into_iter().map(|n| n.as_ref().to_string()).collect();
        let shown = nodes
            .iter()
            .map(|n| redact(n))
            .collect::<Vec<_>>()
            .join(",");
        let client = redis::cluster::ClusterClient::builder(nodes)
            .connection_timeout(self.connect_timeout)
            .response_timeout(self.command_timeout)
            .retries(2)
            .build()
            .map_err(|e| config_error(format!("bad Redis Cluster nodes `{shown}`"), Some(e)))?;
        let connection =
            tokio::time::timeout(self.connect_timeout * 3, client.get_async_connection())
                .await
                .map_err(|_| {
                    connect_error(
                        format!(
                            "no connection to the Redis Cluster `{shown}` within {:?}",
                            self.connect_timeout * 3
                        ),
                        None,
                    )
                })?
                .map_err(|e| {
                    connect_error(
                        format!("cannot connect to the Redis Cluster `{shown}`"),
                        Some(e),
                    )
                })?;
        let store = self.build(Connection::Cluster(connection), shown.clone());
        store.prepare().await.map_err(|e| {
            connect_error(
                format!(
                    "connected to the Redis Cluster `{shown}` but could not load idem's scripts"
                ),
                Some(e),
            )
        })?;
        Ok(store)
    }

    /// A store on a [`ConnectionManager`](https://docs.rs/redis/1/redis/aio/struct.ConnectionManager.html) you already have (its own reconnect and timeout
    /// settings stay; the command timeout of this builder bounds each step on top).
    ///
    /// Loads the scripts and checks the eviction policy; a server that does not answer now
    /// is only logged, since the manager reconnects and the scripts are loaded on first use.
    pub async fn connection_manager(self, manager: ConnectionManager) -> RedisStore {
        let store = self.build(
            Connection::Standalone(manager),
            "the Redis server of a connection manager".into(),
        );
        if let Err(e) = store.prepare().await {
            tracing::warn!(target: "idem", error = %e, "could not load idem's scripts into Redis yet; they load on first use");
        }
        store
    }

    /// A store on a Redis Cluster connection you already have. Like
    /// [`connection_manager`](Self::connection_manager), a cluster that does not answer now
    /// is only logged.
    #[cfg(feature = "redis-cluster")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis-cluster")))]
    pub async fn cluster_connection(
        self,
        connection: redis::cluster_async::ClusterConnection,
    ) -> RedisStore {
        let store = self.build(
            Connection::Cluster(connection),
            "the Redis Cluster of a cluster connection".into(),
        );
        if let Err(e) = store.prepare().await {
            tracing::warn!(target: "idem", error = %e, "could not load idem's scripts into Redis Cluster yet; they load on first use");
        }
        store
    }
}

/// A URL or option that is wrong whatever the server does.
pub(super) fn config_error(message: String, source: Option<redis::RedisError>) -> Error {
    Error::Config {
        message,
        source: source.map(|e| Box::new(e) as idem_core::BoxError),
    }
}

pub(super) fn connect_error(message: String, source: Option<redis::RedisError>) -> Error {
    Error::Connect {
        message,
        source: source.map(|e| Box::new(e) as idem_core::BoxError),
    }
}
