//! Reading `INFO memory`: the connect-time warning about a `maxmemory-policy` that can evict
//! idem records.

use redis::Value;

use super::RedisStore;

impl RedisStore {
    /// Warns when a server's `maxmemory-policy` can evict idem records. Reads `INFO memory`
    /// (which managed services allow where `CONFIG GET` is disabled); a server that does not
    /// tell is logged at debug level and otherwise left alone.
    pub(super) async fn warn_if_evicting(&self) {
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
}
