//! `RedisStore` as an operator meets it: connecting by URL or from a connection manager, a
//! full `noeviction` server (refuses new claims, still replays), and the warning at connect
//! when the server's policy can evict. The eviction tests start private `redis-server`s
//! (`support/redis_server.rs`); the others use `IDEM_TEST_REDIS_URL`.
//!
//! ```text
//! IDEM_TEST_REDIS_URL=redis://127.0.0.1:6379 cargo test -p idem-stores --features redis \
//!   --test redis --test redis_faults --test redis_operations
//! ```
#![cfg(feature = "redis")]

mod support;

use std::sync::atomic::{AtomicU32, Ordering};

use idem_core::testing::{backend_url, unique_scope};
use idem_core::{Claim, Error, Fingerprint, Idem, StoreError};
use idem_stores::RedisStore;
use support::redis_server::{admin, claim_new, key, Logged, PrivateRedis, URL_VAR};

// --- constructors and operations ------------------------------------------------------

#[tokio::test]
async fn connect_by_url_and_from_a_connection_manager() {
    let Some(url) = backend_url(URL_VAR) else {
        return;
    };
    let by_url = idem_stores::connect(&url).await.unwrap();
    let k = key(&unique_scope("redis-connect"), "k");
    assert!(matches!(
        claim_new(&by_url, &k).await,
        Claim::Acquired { .. }
    ));

    let manager = ::redis::Client::open(url.as_str())
        .unwrap()
        .get_connection_manager()
        .await
        .unwrap();
    let mine = RedisStore::from_connection_manager(manager).await;
    assert!(matches!(
        claim_new(&mine, &k).await,
        Claim::InProgress { .. }
    ));
    assert!(format!("{mine:?}").contains("standalone"));
}

#[tokio::test]
async fn a_full_noeviction_server_refuses_new_claims_and_still_replays() {
    let Some(server) = PrivateRedis::start(&["--maxmemory-policy", "noeviction"]) else {
        return;
    };
    let idem = Idem::new(RedisStore::open(&server.url()).await.unwrap());
    let stored = key("oom", "stored");
    let v: String = idem
        .call(stored.clone(), Fingerprint::NONE)
        .run(|| async { "kept".to_string() })
        .await
        .unwrap();
    assert_eq!(v, "kept");
    // Data well past the limit: a server that is over maxmemory with nothing to evict.
    let mut admin = admin(&server.url()).await;
    let filler = vec![b'x'; 1024];
    for i in 0..2000 {
        let () = ::redis::cmd("SET")
            .arg(format!("filler{i}"))
            .arg(&filler[..])
            .query_async(&mut admin)
            .await
            .unwrap();
    }
    let () = ::redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg("1mb")
        .query_async(&mut admin)
        .await
        .unwrap();
    let refused: Result<(), ::redis::RedisError> = ::redis::cmd("SET")
        .arg("one-more")
        .arg("x")
        .query_async(&mut admin)
        .await;
    assert!(refused.is_err(), "the server is not full");
    let runs = AtomicU32::new(0);
    let res = idem
        .call(key("oom", "new"), Fingerprint::NONE)
        .run(|| async {
            runs.fetch_add(1, Ordering::SeqCst);
            "ran".to_string()
        })
        .await;
    match res {
        Err(Error::Store {
            source: StoreError::Backend { source, .. },
            ..
        }) => {
            assert!(source.to_string().contains("OOM"), "{source}");
        }
        other => panic!("expected Error::Store from a full server, got {other:?}"),
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0, "a body ran without a claim");
    let replay: String = idem
        .call(stored, Fingerprint::NONE)
        .run(|| async { "again".to_string() })
        .await
        .unwrap();
    assert_eq!(replay, "kept", "a full server still answers replays");
}

async fn warnings_on_connect(server: &PrivateRedis) -> Vec<String> {
    let warnings = Logged::default();
    let guard = tracing::subscriber::set_default(warnings.clone());
    RedisStore::open(&server.url()).await.unwrap();
    drop(guard);
    warnings.lines()
}

#[tokio::test(flavor = "current_thread")]
async fn evicting_servers_are_warned_about_at_connect() {
    let Some(volatile) =
        PrivateRedis::start(&["--maxmemory", "100mb", "--maxmemory-policy", "volatile-lru"])
    else {
        return;
    };
    let seen = warnings_on_connect(&volatile).await;
    assert!(
        seen.iter()
            .any(|w| w.contains("volatile-lru") && w.contains("noeviction")),
        "no eviction warning for volatile-lru: {seen:?}"
    );
    let allkeys = PrivateRedis::start(&["--maxmemory-policy", "allkeys-lfu"]).unwrap();
    let seen = warnings_on_connect(&allkeys).await;
    assert!(seen.iter().any(|w| w.contains("allkeys-lfu")), "{seen:?}");
    let safe = PrivateRedis::start(&["--maxmemory-policy", "noeviction"]).unwrap();
    let seen = warnings_on_connect(&safe).await;
    assert!(seen.is_empty(), "noeviction is safe, yet: {seen:?}");
}
