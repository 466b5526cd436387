//! `RedisStore` against a real Redis Cluster: `IDEM_TEST_REDIS_CLUSTER` is
//! `redis+cluster://host1:port1,host2:port2,...` (what `.ci/run` sets) or a comma-separated
//! list of `redis://host:port` node URLs. Every key is in a scope of its own.
//!
//! ```text
//! IDEM_TEST_REDIS_CLUSTER=redis+cluster://127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003 \
//!     cargo test -p idem-stores --features redis-cluster --test redis_cluster
//! ```
#![cfg(feature = "redis-cluster")]

mod support;

use std::collections::HashSet;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idem_core::testing::{backend_url, unique_scope};
use idem_core::{Claim, Error, Fingerprint, Record, Store, Token};
use idem_stores::RedisStore;
use support::redis_server::{
    admin, claim_new, cluster_nodes as nodes, cluster_store, complete_new, key,
    resends_acquire_while_own_tokens_race, waiting_engine, Logged, CLUSTER_VAR,
};

idem_core::conformance_tests!(redis_cluster, cluster_store());

async fn cluster_connection(spec: &str) -> ::redis::cluster_async::ClusterConnection {
    ::redis::cluster::ClusterClient::new(nodes(spec))
        .unwrap()
        .get_async_connection()
        .await
        .expect("cluster connection")
}

#[tokio::test]
async fn cluster_url_connect_and_an_existing_connection() {
    let Some(spec) = backend_url(CLUSTER_VAR) else {
        return;
    };
    let url = format!(
        "redis+cluster://{}",
        nodes(&spec)
            .iter()
            .map(|n| n.trim_start_matches("redis://").to_string())
            .collect::<Vec<_>>()
            .join(",")
    );
    let by_url = idem_stores::connect(&url).await.unwrap();
    let k = key(&unique_scope("cluster-connect"), "k");
    assert!(matches!(
        claim_new(&by_url, &k).await,
        Claim::Acquired { .. }
    ));
    let mine = RedisStore::from_cluster_connection(cluster_connection(&spec).await).await;
    assert!(format!("{mine:?}").contains("cluster"));
    assert!(matches!(
        claim_new(&mine, &k).await,
        Claim::InProgress { .. }
    ));
}

/// Ids that share a would-be hash tag still spread over the slots (and so over the nodes):
/// the tag is escaped, so each record hashes by its whole key. Each one is stored and read
/// back from wherever it landed.
#[tokio::test]
async fn hash_tags_in_ids_do_not_pin_records_to_one_slot() {
    let Some(spec) = backend_url(CLUSTER_VAR) else {
        return;
    };
    let store = cluster_store().await.unwrap();
    let mut admin = cluster_connection(&spec).await;
    let scope = unique_scope("cluster-tags");
    let mut slots = HashSet::new();
    for i in 0..24 {
        let k = key(&scope, &format!("{{tenant}}-{i}"));
        let slot: u16 = ::redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(store.record_key(&k))
            .query_async(&mut admin)
            .await
            .unwrap();
        slots.insert(slot);
        complete_new(&store, &k, idem_core::Bytes::from(i.to_string())).await;
    }
    assert!(slots.len() > 12, "records piled onto {} slots", slots.len());
    for i in 0..24 {
        let k = key(&scope, &format!("{{tenant}}-{i}"));
        match store.get(&k).await.unwrap() {
            Some(Record::Completed { payload, .. }) => {
                assert_eq!(&payload[..], i.to_string().as_bytes())
            }
            other => panic!("{k}: {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn callers_on_several_cluster_connections_run_the_body_once() {
    let Some(spec) = backend_url(CLUSTER_VAR) else {
        return;
    };
    let mut engines = Vec::new();
    for _ in 0..3 {
        let store = RedisStore::builder()
            .open_cluster(nodes(&spec))
            .await
            .unwrap();
        engines.push(waiting_engine(store));
    }
    let scope = unique_scope("cluster-race");
    // Several keys, so that several nodes take part.
    let runs: Arc<Vec<AtomicU32>> = Arc::new((0..6).map(|_| AtomicU32::new(0)).collect());
    let tasks: Vec<_> = (0..60)
        .map(|i| {
            let (idem, runs) = (engines[i % 3].clone(), runs.clone());
            let k = key(&scope, &format!("order-{}", i % 6));
            tokio::spawn(async move {
                idem.call(k, Fingerprint::NONE)
                    .run(|| async move {
                        runs[i % 6].fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        i % 6
                    })
                    .await
            })
        })
        .collect();
    for (i, t) in tasks.into_iter().enumerate() {
        let v: Result<usize, Error> = t.await.unwrap();
        assert_eq!(v.unwrap(), i % 6);
    }
    for (k, n) in runs.iter().enumerate() {
        assert_eq!(
            n.load(Ordering::SeqCst),
            1,
            "key {k}: the body ran more than once"
        );
    }
}

/// The same claim request sent twice through the cluster client (one `EVALSHA` with the
/// same key and packed argument, as its own retry after a lost reply sends it) answers
/// Acquired both times, on whichever node the key lives; resent concurrently too, while
/// claims with tokens of their own still have exactly one winner.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_claim_sent_twice_on_the_wire_is_acquired_both_times() {
    let Some(store) = cluster_store().await else {
        return;
    };
    let scope = unique_scope("cluster-resent");
    let lease = Duration::from_secs(30);
    // Several keys, so that several nodes take part.
    for i in 0..6 {
        let k = key(&scope, &format!("k{i}"));
        let token = Token::random();
        for send in 1..=2 {
            match store
                .claim(&k, &Fingerprint::NONE, token, lease)
                .await
                .unwrap()
            {
                Claim::Acquired {
                    token: acquired,
                    recovered: false,
                    ..
                } => assert_eq!(acquired, token),
                other => panic!("{k}: send {send} of the same claim: {other:?}"),
            }
        }
        assert!(matches!(
            store.get(&k).await.unwrap(),
            Some(Record::InProgress { token: t, .. }) if t == token
        ));
    }

    let (resent, raced) = (key(&scope, "concurrent"), key(&scope, "raced"));
    resends_acquire_while_own_tokens_race(&store, resent, raced, Fingerprint::NONE, lease).await;
}

/// The eviction check reads every primary's `INFO memory` (the cluster client answers with
/// a map of node -> text) and names the node whose policy can evict.
#[tokio::test(flavor = "current_thread")]
async fn a_node_that_can_evict_is_named_at_connect() {
    let Some(spec) = backend_url(CLUSTER_VAR) else {
        return;
    };
    let warnings = Logged::global();
    let node = nodes(&spec)[0].clone();
    let port = node.rsplit(':').next().unwrap().to_string();
    let mut one = admin(&node).await;
    let set_policy = |policy: &'static str| {
        let mut cmd = ::redis::cmd("CONFIG");
        cmd.arg("SET").arg("maxmemory-policy").arg(policy);
        cmd
    };
    let names_the_node = |w: &String| w.contains("volatile-ttl") && w.contains(&port);
    let before = warnings.len();
    // maxmemory stays 0, so nothing is evicted while the policy reads volatile-ttl. Other
    // tests connecting meanwhile may warn too; this test looks for a warning after its own
    // connect that names the node and the policy.
    let () = set_policy("volatile-ttl")
        .query_async(&mut one)
        .await
        .unwrap();
    let connected = RedisStore::builder().open_cluster(nodes(&spec)).await;
    let seen: Vec<String> = warnings.lines()[before..].to_vec();
    let () = set_policy("noeviction")
        .query_async(&mut one)
        .await
        .unwrap();
    connected.unwrap();
    assert!(
        seen.iter().any(names_the_node),
        "no warning names node {port} and its policy: {seen:?}"
    );
    // That noeviction warns about nothing is checked on a private server in
    // redis_operations.rs: here other tests share the cluster and may still log warnings
    // from their own connects.
}
