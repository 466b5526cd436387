//! Round trips on Redis Cluster: a first call costs 2 and a replay 1, summed over every node
//! from `INFO commandstats`; with a durability level, each `WAIT` goes to the one node that
//! ran the script. A test binary of its own, so that no other test of this process runs
//! commands on the cluster while it counts (cargo runs test binaries one at a time; the
//! tests here take turns through `COUNTING`).
//!
//! ```text
//! IDEM_TEST_REDIS_CLUSTER=redis+cluster://127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003 \
//!     cargo test -p idem-stores --features redis-cluster --test redis_cluster_round_trips
//! ```
#![cfg(feature = "redis-cluster")]

mod support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use idem_core::testing::{backend_url, unique_scope};
use idem_core::{Error, Fingerprint, Idem, Key, Store, StoreError};
use idem_stores::RedisStore;
use support::redis_server::{
    admin, cluster_nodes as nodes, command_calls as node_command_calls, delta,
    round_trips as client_commands, CLUSTER_VAR,
};

/// Held by each test while it counts commands.
static COUNTING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A plain connection to each node.
async fn admins(nodes: &[String]) -> Vec<::redis::aio::MultiplexedConnection> {
    let mut admins = Vec::new();
    for node in nodes {
        admins.push(admin(node).await);
    }
    admins
}

/// `INFO commandstats` of every node, summed: command -> calls.
async fn command_calls(nodes: &mut [::redis::aio::MultiplexedConnection]) -> HashMap<String, u64> {
    let mut calls = HashMap::new();
    for conn in nodes {
        for (name, n) in node_command_calls(conn).await {
            *calls.entry(name).or_insert(0) += n;
        }
    }
    calls
}

/// Commands sent by clients between two snapshots (everything but what the scripts run
/// inside and the INFOs of the snapshots), and every command that ran.
fn round_trips(
    before: &HashMap<String, u64>,
    after: &HashMap<String, u64>,
) -> (u64, HashMap<String, u64>) {
    let delta = delta(before, after);
    (client_commands(&delta), delta)
}

#[tokio::test]
async fn cluster_first_call_two_round_trips_replay_one() {
    let Some(spec) = backend_url(CLUSTER_VAR) else {
        return;
    };
    let _counting = COUNTING.lock().await;
    let nodes = nodes(&spec);
    // No epoch GET (at most every 10 s by default) among the counts.
    let idem = Idem::new(
        RedisStore::builder()
            .epoch_check_interval(Duration::from_secs(3600))
            .open_cluster(&nodes)
            .await
            .unwrap(),
    );
    let mut admins = admins(&nodes).await;
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

/// With a durability level, a claim's `WAIT` goes to the primary of the key's slot, in the
/// same pipeline as the script, and to no other node (redis-rs would send a lone `WAIT` to
/// every primary). This cluster has no replicas, so each claim is refused (and released:
/// a second `EVALSHA` on the same node) and its body never runs.
#[tokio::test]
async fn cluster_durable_claim_waits_on_its_keys_primary_alone() {
    let Some(spec) = backend_url(CLUSTER_VAR) else {
        return;
    };
    let _counting = COUNTING.lock().await;
    let nodes = nodes(&spec);
    let store = RedisStore::builder()
        .epoch_check_interval(Duration::from_secs(3600)) // no epoch GET among the counts
        .open_cluster(&nodes)
        .await
        .unwrap();
    let idem = Idem::new(store.with_replicas(1, Duration::from_millis(20)));
    let mut admins = admins(&nodes).await;
    let scope = unique_scope("cluster-durable");
    let runs = AtomicU32::new(0);
    let mut nodes_seen = std::collections::HashSet::new();
    for id in 0..12 {
        let k = Key::new(&scope, id.to_string()).unwrap();
        let mut before = Vec::new();
        for admin in &mut admins {
            before.push(node_command_calls(admin).await);
        }
        let err = idem
            .call(k.clone(), Fingerprint::NONE)
            .run(|| async {
                runs.fetch_add(1, Ordering::SeqCst);
            })
            .await
            .unwrap_err();
        match &err {
            Error::Store {
                source:
                    StoreError::NotReplicated {
                        backend: "redis-cluster",
                        step: "claim",
                        acknowledged: 0,
                        required: 1,
                        ..
                    },
                ..
            } => {}
            other => panic!("{id}: expected NotReplicated, got {other:?}"),
        }
        let mut waits = Vec::new();
        for (n, admin) in admins.iter_mut().enumerate() {
            let (_, delta) = round_trips(&before[n], &node_command_calls(admin).await);
            waits.push((
                n,
                delta.get("wait").copied().unwrap_or(0),
                delta.get("evalsha").copied().unwrap_or(0),
            ));
        }
        let on: Vec<_> = waits.iter().filter(|(_, w, _)| *w > 0).collect();
        assert_eq!(on.len(), 1, "{id}: one node waited: {waits:?}");
        let (node, wait, evalsha) = *on[0];
        assert_eq!(
            (wait, evalsha),
            (1, 2),
            "{id}: one WAIT beside the claim and its release, on the key's node: {waits:?}"
        );
        assert_eq!(
            waits.iter().map(|(_, _, e)| e).sum::<u64>(),
            2,
            "{id}: no script ran elsewhere: {waits:?}"
        );
        nodes_seen.insert(node);
        assert!(store.get(&k).await.unwrap().is_none(), "{id}: released");
    }
    assert!(
        nodes_seen.len() > 1,
        "the keys spread over the nodes: {nodes_seen:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}
