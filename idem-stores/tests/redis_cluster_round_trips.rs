//! Round trips on Redis Cluster: a first call costs 2 and a replay 1, summed over every node
//! from `INFO commandstats`. A test binary of its own, so that no other test of this process
//! runs commands on the cluster while it counts (cargo runs test binaries one at a time).
//!
//! ```text
//! IDEM_TEST_REDIS_CLUSTER=redis+cluster://127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003 \
//!     cargo test -p idem-stores --features redis-cluster --test redis_cluster_round_trips
//! ```
#![cfg(feature = "redis-cluster")]

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};

use idem_core::testing::{backend_url, unique_scope};
use idem_core::{Fingerprint, Idem, Key};
use idem_stores::redis::RedisStore;

fn nodes(spec: &str) -> Vec<String> {
    spec.strip_prefix("redis+cluster://")
        .unwrap_or(spec)
        .split(',')
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .map(|n| {
            if n.contains("://") {
                n.to_string()
            } else {
                format!("redis://{n}")
            }
        })
        .collect()
}

/// `INFO commandstats` of every node, summed: command -> calls.
async fn command_calls(nodes: &mut [::redis::aio::MultiplexedConnection]) -> HashMap<String, u64> {
    let mut calls = HashMap::new();
    for conn in nodes {
        let info: String = ::redis::cmd("INFO")
            .arg("commandstats")
            .query_async(conn)
            .await
            .unwrap();
        for line in info.lines().filter_map(|l| l.strip_prefix("cmdstat_")) {
            let Some((name, rest)) = line.split_once(':') else {
                continue;
            };
            let n: u64 = rest
                .split(',')
                .find_map(|f| f.strip_prefix("calls="))
                .and_then(|n| n.parse().ok())
                .unwrap_or(0);
            *calls.entry(name.to_string()).or_insert(0) += n;
        }
    }
    calls
}

/// Commands sent by clients between two snapshots: everything but what the scripts run
/// inside (GET, SET, DEL, TIME) and the INFOs of the snapshots.
fn round_trips(
    before: &HashMap<String, u64>,
    after: &HashMap<String, u64>,
) -> (u64, HashMap<String, u64>) {
    let delta: HashMap<String, u64> = after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0)))
        .filter(|(_, v)| *v > 0)
        .collect();
    let trips = delta
        .iter()
        .filter(|(k, _)| !matches!(k.as_str(), "get" | "set" | "del" | "time" | "info"))
        .map(|(_, v)| v)
        .sum();
    (trips, delta)
}

#[tokio::test]
async fn cluster_first_call_two_round_trips_replay_one() {
    let Some(spec) = backend_url("IDEM_TEST_REDIS_CLUSTER") else {
        return;
    };
    let nodes = nodes(&spec);
    let idem = Idem::new(RedisStore::builder().open_cluster(&nodes).await.unwrap());
    let mut admins = Vec::new();
    for node in &nodes {
        admins.push(
            ::redis::Client::open(node.as_str())
                .unwrap()
                .get_multiplexed_async_connection()
                .await
                .unwrap(),
        );
    }
    let scope = unique_scope("cluster-round-trips");
    let runs = AtomicU32::new(0);
    // Several keys, so that the count holds on whichever node each one lives.
    for id in ["a", "b", "c", "d"] {
        let k = Key::new(&scope, id).unwrap();
        let call = || {
            idem.call(k.clone(), Fingerprint::of(&1u8)).run(|| async {
                runs.fetch_add(1, Ordering::SeqCst);
                id.to_string()
            })
        };
        let before = command_calls(&mut admins).await;
        assert_eq!(call().await.unwrap(), id);
        let (trips, delta) = round_trips(&before, &command_calls(&mut admins).await);
        assert_eq!(
            trips, 2,
            "{id}: a first call is claim + complete; saw {delta:?}"
        );
        assert_eq!(delta.get("evalsha"), Some(&2), "{id}: {delta:?}");

        let before = command_calls(&mut admins).await;
        assert_eq!(call().await.unwrap(), id);
        let (trips, delta) = round_trips(&before, &command_calls(&mut admins).await);
        assert_eq!(trips, 1, "{id}: a replay is one claim; saw {delta:?}");
        assert_eq!(
            delta.get("get"),
            Some(&1),
            "{id}: one GET, inside the script: {delta:?}"
        );
    }
    assert_eq!(runs.load(Ordering::SeqCst), 4);
}
