//! The key encoders of each store, with arbitrary keys: proptest draws sets of ids (NUL and
//! other control characters, `%` escapes and their look-alikes, hash-tag braces, `/`,
//! unicode, ids at the length limit), stores one record per id and reads each back. Two
//! different keys never reach one record on any backend, and the Redis record key of an id
//! never holds a brace (a hash tag the caller could steer). The same properties as the
//! fuzz target `fuzz/fuzz_targets/key.rs`, run by `cargo test`.
//!
//! ```text
//! cargo test -p idem-integration --all-features --test reliability_keys
//! ```

// The store tests' support (the Redis Cluster of `IDEM_TEST_REDIS_CLUSTER`), shared with
// `idem-stores`' own tests.
#[path = "../../idem-stores/tests/support/mod.rs"]
mod support;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use idem_core::{Claim, Fingerprint, Key, Store, Token};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

fn id() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a%{}/\\x00\\n0-9A-F]{1,6}",
        "\\PC{1,8}",
        ".{1,4}",
        (0..4u8).prop_map(|c| format!("{}{}", "x".repeat(idem_core::MAX_ID_LEN - 1), c)),
    ]
}

fn ids() -> impl Strategy<Value = Vec<String>> {
    prop::collection::hash_set(id(), 2..6).prop_map(|s| s.into_iter().collect())
}

static CASE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

async fn distinct(store: &dyn Store, backend: &str, ids: &[String]) -> Result<(), String> {
    let scope = format!(
        "reliability.keys.{backend}.{}.{}",
        std::process::id(),
        CASE.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    );
    let long = Duration::from_secs(600);
    for (i, id) in ids.iter().enumerate() {
        let k = Key::new(&scope, id).map_err(|e| e.to_string())?;
        let token = Token::random();
        match store.claim(&k, &Fingerprint::NONE, token, long).await {
            Ok(Claim::Acquired { .. }) => {}
            other => return Err(format!("{id:?}: a fresh key answered {other:?}")),
        }
        store
            .complete(&k, token, Bytes::from(i.to_string()), long)
            .await
            .map_err(|e| format!("{id:?}: {e}"))?;
    }
    for (i, id) in ids.iter().enumerate() {
        let k = Key::new(&scope, id).unwrap();
        match store.get(&k).await {
            Ok(Some(idem_core::Record::Completed { payload, .. })) if payload == i.to_string() => {}
            other => return Err(format!("{id:?} reached {other:?}, not its own record {i}")),
        }
    }
    Ok(())
}

fn check(backend: &str, store: Arc<dyn Store>, rt: &tokio::runtime::Runtime) {
    let mut runner = TestRunner::new(Config {
        cases: 48,
        ..Config::default()
    });
    let result = runner.run(&ids(), |ids| {
        rt.block_on(distinct(&*store, backend, &ids))
            .map_err(TestCaseError::fail)
    });
    if let Err(e) = result {
        panic!("{backend}: {e}");
    }
    eprintln!("reliability keys {backend}: 48 cases of 2-5 arbitrary ids, each on its own record");
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn reliability_keys_memory() {
    check(
        "memory",
        Arc::new(idem_stores::MemoryStore::new()),
        &runtime(),
    );
}

#[cfg(feature = "sqlite")]
#[test]
fn reliability_keys_sqlite() {
    let rt = runtime();
    let dir = tempfile::tempdir().unwrap();
    let store = rt.block_on(async {
        let s = idem_stores::SqliteStore::open(dir.path().join("keys.db"))
            .await
            .unwrap();
        s.migrate().await.unwrap();
        s
    });
    check("sqlite", Arc::new(store), &rt);
}

#[cfg(feature = "postgres")]
#[test]
fn reliability_keys_postgres() {
    let Some(url) = idem_core::testing::backend_url("IDEM_TEST_POSTGRES_URL") else {
        return;
    };
    let rt = runtime();
    let store = rt.block_on(async {
        let s = idem_stores::PostgresStore::connect(&url)
            .await
            .unwrap()
            .with_table("idem_reliability_keys")
            .unwrap();
        s.migrate().await.unwrap();
        s
    });
    check("postgres", Arc::new(store), &rt);
}

#[cfg(feature = "redis")]
#[test]
fn reliability_keys_redis() {
    let Some(url) = idem_core::testing::backend_url("IDEM_TEST_REDIS_URL") else {
        return;
    };
    let rt = runtime();
    let store = rt.block_on(idem_stores::RedisStore::open(&url)).unwrap();
    // The record key: one-to-one, and no brace from an id.
    let mut runner = TestRunner::new(Config {
        cases: 512,
        ..Config::default()
    });
    runner
        .run(&(id(), id()), |(a, b)| {
            let (ka, kb) = (Key::new("s", &a).unwrap(), Key::new("s", &b).unwrap());
            let (ra, rb) = (store.record_key(&ka), store.record_key(&kb));
            prop_assert_eq!(ra == rb, a == b, "{:?} {:?}", ra, rb);
            let id_part = &ra[store.prefix().len()..];
            prop_assert!(!id_part.contains(['{', '}']), "{:?}", ra);
            Ok(())
        })
        .unwrap();
    eprintln!("reliability keys redis: 512 pairs of ids, record keys one-to-one and brace-free");
    check("redis", Arc::new(store), &rt);
}

#[cfg(feature = "redis-cluster")]
#[test]
fn reliability_keys_redis_cluster() {
    let rt = runtime();
    let Some(store) = rt.block_on(support::redis_server::cluster_store()) else {
        return;
    };
    check("redis-cluster", Arc::new(store), &rt);
}
