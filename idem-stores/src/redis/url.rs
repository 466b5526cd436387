//! Redis URLs: a cluster URL as one URL per node (and, from `crate::redact`, a URL with its
//! password hidden).

#[cfg(feature = "redis-cluster")]
use idem_core::Error;

#[cfg(feature = "redis-cluster")]
use super::connect::config_error;

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
        return Err(config_error(
            format!(
                "`{}` names no cluster node: expected `{scheme}://host1:port1,host2:port2`",
                redact(url)
            ),
            None,
        ));
    }
    Ok(nodes)
}

pub(crate) use crate::redact::redact;

#[cfg(test)]
mod tests {
    use super::*;

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
