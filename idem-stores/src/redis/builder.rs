//! Building a [`RedisStore`]: options, connecting from a URL or from a connection the user
//! has, loading the scripts, and the connect-time check of the eviction policy.

use std::sync::Arc;
use std::time::Duration;

use idem_core::Error;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::Value;

use super::{scripts, Connection, RedisStore};

/// The default prefix of every record's Redis key.
pub const DEFAULT_PREFIX: &str = "idem:";
/// The default longest wait for a connection to be made.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// The default longest wait for one command's answer.
pub const DEFAULT_COMMAND_TIMEOUT: Duration = Duration::from_secs(3);
/// The default time an ended lease is remembered, to report its takeover as a recovery.
pub const DEFAULT_RECOVERY_WINDOW: Duration = Duration::from_secs(60);

/// Options of a [`RedisStore`], then the connection it runs on.
///
/// ```no_run
/// # use std::time::Duration;
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), idem_core::Error> {
/// let store = idem_stores::redis::RedisStore::builder()
///     .prefix("orders:idem:")
///     .connect_timeout(Duration::from_secs(2))
///     .command_timeout(Duration::from_millis(500))
///     .open("redis://127.0.0.1:6379/0")
///     .await?;
/// # let _ = store; Ok(()) }
/// ```
#[derive(Debug, Clone)]
#[must_use]
pub struct RedisStoreBuilder {
    prefix: String,
    connect_timeout: Duration,
    command_timeout: Duration,
    recovery_window: Duration,
}

impl Default for RedisStoreBuilder {
    fn default() -> Self {
        RedisStoreBuilder {
            prefix: DEFAULT_PREFIX.to_string(),
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            command_timeout: DEFAULT_COMMAND_TIMEOUT,
            recovery_window: DEFAULT_RECOVERY_WINDOW,
        }
    }
}

impl RedisStoreBuilder {
    /// The prefix of every record's Redis key (default `idem:`). Stores with different
    /// prefixes never see each other's records. A hash tag in the prefix
    /// (`idem:{orders}:`) puts every record in one cluster slot.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// The longest wait for a connection (or a reconnection) to be made (default 3s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout.max(Duration::from_millis(1));
        self
    }

    /// The longest wait for one store step's answer (default 3s); past it the step fails
    /// with [`StoreError::Timeout`](idem_core::StoreError::Timeout). It bounds every step,
    /// also on a connection passed in by the user.
    pub fn command_timeout(mut self, timeout: Duration) -> Self {
        self.command_timeout = timeout.max(Duration::from_millis(1));
        self
    }

    /// How long a claim whose lease ended is remembered (default one minute), so that the
    /// claim that takes it over is told `recovered: true` (the engine logs such takeovers
    /// as warnings: a holder stopped or stalled). A record whose holder vanished then
    /// occupies memory for its lease plus this window. `Duration::ZERO` forgets it as its
    /// lease ends; takeovers then look like fresh claims.
    pub fn recovery_window(mut self, window: Duration) -> Self {
        self.recovery_window = window;
        self
    }

    /// Connects to the server(s) a URL names:
    ///
    /// - `redis://[user:password@]host[:port][/db]`, `rediss://...` (TLS, when the `redis`
    ///   crate's TLS feature is on) or `redis+unix:///path/to.sock`: one server, through a
    ///   [`ConnectionManager`] that reconnects on its own;
    /// - `redis+cluster://[user:password@]host1:port1,host2:port2,...` (or
    ///   `rediss+cluster://`): a Redis Cluster, given any of its nodes (feature
    ///   `redis-cluster`).
    ///
    /// Then loads the scripts, and warns when the server's `maxmemory-policy` can evict
    /// records. A server that cannot be reached within the connect timeout is an
    /// [`Error::Connect`] with the client's error as its source.
    pub async fn open(self, url: &str) -> Result<RedisStore, Error> {
        let scheme = url.split_once("://").map_or("", |(s, _)| s);
        match scheme {
            "redis+cluster" | "rediss+cluster" => {
                #[cfg(feature = "redis-cluster")]
                {
                    let nodes = cluster_nodes(url)?;
                    self.open_cluster(nodes).await
                }
                #[cfg(not(feature = "redis-cluster"))]
                Err(connect_error(
                    format!("`{scheme}://` needs the cargo feature `redis-cluster` of idem (or idem-stores)"),
                    None,
                ))
            }
            _ => {
                let client = redis::Client::open(url).map_err(|e| {
                    connect_error(format!("`{}` is not a Redis URL", redact(url)), Some(e))
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
                let store = self.build(Connection::Standalone(manager));
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
            .map_err(|e| connect_error(format!("bad Redis Cluster nodes `{shown}`"), Some(e)))?;
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
        let store = self.build(Connection::Cluster(connection));
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

    /// A store on a [`ConnectionManager`] you already have (its own reconnect and timeout
    /// settings stay; the command timeout of this builder bounds each step on top).
    ///
    /// Loads the scripts and checks the eviction policy; a server that does not answer now
    /// is only logged, since the manager reconnects and the scripts are loaded on first use.
    pub async fn connection_manager(self, manager: ConnectionManager) -> RedisStore {
        let store = self.build(Connection::Standalone(manager));
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
        let store = self.build(Connection::Cluster(connection));
        if let Err(e) = store.prepare().await {
            tracing::warn!(target: "idem", error = %e, "could not load idem's scripts into Redis Cluster yet; they load on first use");
        }
        store
    }

    fn build(self, conn: Connection) -> RedisStore {
        RedisStore {
            conn,
            prefix: Arc::from(self.prefix),
            command_timeout: self.command_timeout,
            recovery_window: self.recovery_window,
        }
    }
}

impl RedisStore {
    /// Loads the scripts (on every node of a cluster), then checks the eviction policy.
    async fn prepare(&self) -> Result<(), redis::RedisError> {
        for script in scripts::all() {
            let load = script.prepare_invoke();
            let loaded = match &self.conn {
                Connection::Standalone(c) => {
                    tokio::time::timeout(self.command_timeout, load.load_async(&mut c.clone()))
                        .await
                }
                #[cfg(feature = "redis-cluster")]
                Connection::Cluster(c) => {
                    tokio::time::timeout(self.command_timeout, load.load_async(&mut c.clone()))
                        .await
                }
            };
            match loaded {
                Ok(res) => {
                    res?;
                }
                Err(_) => {
                    return Err(redis::RedisError::from(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!(
                            "SCRIPT LOAD did not answer within {:?}",
                            self.command_timeout
                        ),
                    )))
                }
            }
        }
        self.warn_if_evicting().await;
        Ok(())
    }

    /// Warns when a server's `maxmemory-policy` can evict idem records. Reads `INFO memory`
    /// (which managed services allow where `CONFIG GET` is disabled); a server that does not
    /// tell is logged at debug level and otherwise left alone.
    async fn warn_if_evicting(&self) {
        let mut cmd = redis::cmd("INFO");
        cmd.arg("memory");
        let info = match tokio::time::timeout(self.command_timeout, self.conn.query(&cmd)).await {
            Ok(Ok(info)) => info,
            Ok(Err(e)) => {
                tracing::debug!(target: "idem", error = %e, "could not read the Redis eviction policy");
                return;
            }
            Err(_) => {
                tracing::debug!(target: "idem", "INFO memory did not answer; the eviction policy is not checked");
                return;
            }
        };
        let mut nodes = Vec::new();
        collect_info(&info, None, &mut nodes);
        for (node, text) in nodes {
            let Some(policy) = info_field(&text, "maxmemory_policy") else {
                continue;
            };
            let maxmemory = info_field(&text, "maxmemory").unwrap_or("unknown");
            if let Some(why) = eviction_risk(policy) {
                tracing::warn!(
                    target: "idem",
                    node = node.as_deref().unwrap_or("redis"),
                    maxmemory_policy = policy,
                    maxmemory,
                    "Redis can evict idem records: {why}. An evicted record is a lost claim or a lost \
                     result, and the next call runs the operation again. Set `maxmemory-policy noeviction`."
                );
            }
        }
    }
}

/// Why a `maxmemory-policy` can drop idem records, or `None` when it cannot.
pub(crate) fn eviction_risk(policy: &str) -> Option<&'static str> {
    match policy {
        "noeviction" => None,
        p if p.starts_with("volatile-") => {
            Some("the policy evicts keys that have an expiry, and every idem record has one")
        }
        p if p.starts_with("allkeys-") => Some("the policy evicts any key when memory is full"),
        _ => Some("the policy is not `noeviction`"),
    }
}

/// The text of each node's `INFO` answer, with the node's address when the answer is a
/// cluster's map of them.
fn collect_info(value: &Value, node: Option<String>, out: &mut Vec<(Option<String>, String)>) {
    match value {
        Value::BulkString(bytes) => out.push((node, String::from_utf8_lossy(bytes).into_owned())),
        Value::SimpleString(text) | Value::VerbatimString { text, .. } => {
            out.push((node, text.clone()))
        }
        Value::Map(entries) => {
            for (k, v) in entries {
                let name = match k {
                    Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
                    Value::SimpleString(s) => Some(s.clone()),
                    _ => None,
                };
                collect_info(v, name, out);
            }
        }
        Value::Array(items) => items
            .iter()
            .for_each(|v| collect_info(v, node.clone(), out)),
        _ => {}
    }
}

fn info_field<'t>(text: &'t str, name: &str) -> Option<&'t str> {
    text.lines()
        .filter_map(|line| line.split_once(':'))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.trim())
}

/// `redis+cluster://[auth@]h1:p1,h2:p2[/db][?query]` as one `redis://` URL per node.
#[cfg(feature = "redis-cluster")]
pub(crate) fn cluster_nodes(url: &str) -> Result<Vec<String>, Error> {
    let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
    let node_scheme = if scheme.starts_with("rediss") {
        "rediss"
    } else {
        "redis"
    };
    let (hosts_part, tail) = match rest.find(['/', '?']) {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    let (auth, hosts) = match hosts_part.rsplit_once('@') {
        Some((auth, hosts)) => (format!("{auth}@"), hosts),
        None => (String::new(), hosts_part),
    };
    let nodes: Vec<String> = hosts
        .split(',')
        .map(str::trim)
        .filter(|h| !h.is_empty())
        .map(|h| format!("{node_scheme}://{auth}{h}{tail}"))
        .collect();
    if nodes.is_empty() {
        return Err(connect_error(
            format!(
                "`{}` names no cluster node: expected `{scheme}://host1:port1,host2:port2`",
                redact(url)
            ),
            None,
        ));
    }
    Ok(nodes)
}

/// A URL with its password hidden, for messages.
fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    match rest[..end].rsplit_once('@') {
        Some((auth, hosts)) if auth.contains(':') => {
            let user = auth.split(':').next().unwrap_or("");
            format!("{scheme}://{user}:***@{hosts}{}", &rest[end..])
        }
        _ => url.to_string(),
    }
}

fn connect_error(message: String, source: Option<redis::RedisError>) -> Error {
    Error::Connect {
        message,
        source: source.map(|e| Box::new(e) as idem_core::BoxError),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eviction_policies() {
        assert_eq!(eviction_risk("noeviction"), None);
        for p in [
            "volatile-lru",
            "volatile-lfu",
            "volatile-random",
            "volatile-ttl",
        ] {
            assert!(eviction_risk(p).unwrap().contains("expiry"), "{p}");
        }
        for p in ["allkeys-lru", "allkeys-lfu", "allkeys-random"] {
            assert!(eviction_risk(p).is_some(), "{p}");
        }
    }

    #[test]
    fn info_fields_are_read_per_node() {
        let text =
            "# Memory\r\nmaxmemory:0\r\nmaxmemory_human:0B\r\nmaxmemory_policy:allkeys-lru\r\n";
        let value = Value::Map(vec![(
            Value::BulkString(b"127.0.0.1:7001".to_vec()),
            Value::BulkString(text.as_bytes().to_vec()),
        )]);
        let mut nodes = Vec::new();
        collect_info(&value, None, &mut nodes);
        assert_eq!(nodes.len(), 1);
        assert_eq!(nodes[0].0.as_deref(), Some("127.0.0.1:7001"));
        assert_eq!(
            info_field(&nodes[0].1, "maxmemory_policy"),
            Some("allkeys-lru")
        );
        assert_eq!(info_field(&nodes[0].1, "maxmemory"), Some("0"));
    }

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(redact("redis://u:secret@h:1/0"), "redis://u:***@h:1/0");
        assert_eq!(redact("redis://h:1"), "redis://h:1");
    }

    #[cfg(feature = "redis-cluster")]
    #[test]
    fn cluster_urls_become_node_urls() {
        assert_eq!(
            cluster_nodes("redis+cluster://127.0.0.1:7001,127.0.0.1:7002").unwrap(),
            ["redis://127.0.0.1:7001", "redis://127.0.0.1:7002"]
        );
        assert_eq!(
            cluster_nodes("rediss+cluster://u:p@a:1,b:2/?protocol=resp3").unwrap(),
            [
                "rediss://u:p@a:1/?protocol=resp3",
                "rediss://u:p@b:2/?protocol=resp3"
            ]
        );
        assert!(cluster_nodes("redis+cluster://").is_err());
    }
}
