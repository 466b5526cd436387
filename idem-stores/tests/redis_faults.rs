//! `RedisStore` when its server fails: stopped mid-run, dropping connections, frozen,
//! absent, or behind a proxy that black-holes or cuts its connections. Every step is
//! bounded, the body never runs without a claim, and the same store recovers. The stopped
//! and frozen servers are private `redis-server`s of the test's own (`support/redis_server.rs`);
//! the proxied tests use `IDEM_TEST_REDIS_URL`.
//!
//! ```text
//! IDEM_TEST_REDIS_URL=redis://127.0.0.1:6379 cargo test -p idem-stores --features redis \
//!   --test redis --test redis_faults --test redis_operations
//! ```
#![cfg(feature = "redis")]

mod support;

use std::net::TcpListener;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idem_core::testing::{backend_url, unique_scope};
use idem_core::{Error, Fingerprint, Idem, Store, StoreError};
use idem_stores::{LostRecords, RedisStore};
use support::redis_server::{admin, key, kill_normal_clients, PrivateRedis, URL_VAR};
use support::ClaimFresh;

// --- faults ---------------------------------------------------------------------------

/// The caller sees `Error::Store` with a temporary source: `Unavailable` carrying the
/// client's error (a refused or dropped connection), or `Timeout`.
fn assert_store_error(res: Result<String, Error>, what: &str) {
    match res {
        Err(Error::Store { key, source }) => {
            assert!(!key.as_str().is_empty());
            match &source {
                StoreError::Unavailable { .. } => {
                    let client = std::error::Error::source(&source)
                        .expect("the client's error is kept as the source");
                    assert!(
                        client.downcast_ref::<::redis::RedisError>().is_some(),
                        "{what}: the source is the redis client's error, not a string: {client:?}"
                    );
                }
                StoreError::Timeout { .. } => {}
                other => panic!("{what}: a dead server is a temporary failure, got {other:?}"),
            }
        }
        other => panic!("{what}: expected Error::Store, got {other:?}"),
    }
}

#[tokio::test]
async fn redis_stopped_mid_run_fails_closed_and_the_same_store_recovers() {
    let Some(server) = PrivateRedis::start(&[]) else {
        return;
    };
    let server = Arc::new(Mutex::new(server));
    let url = server.lock().unwrap().url();
    // The server comes back empty: the store notices its records lost (`redis_epoch.rs`
    // tests that) and by default refuses claims of keys without a record for a while. This
    // test is about the reconnect, so it only warns.
    let store = RedisStore::builder()
        .connect_timeout(Duration::from_millis(500))
        .command_timeout(Duration::from_secs(1))
        .on_lost_records(LostRecords::Warn)
        .open(&url)
        .await
        .unwrap();
    let idem = Idem::new(store);
    let runs = Arc::new(AtomicU32::new(0));
    let scope = unique_scope("redis-fault");

    // Healthy: runs once.
    let ok = idem
        .call(key(&scope, "before"), Fingerprint::NONE)
        .run(|| async { "v".to_string() })
        .await;
    assert_eq!(ok.unwrap(), "v");

    // The server dies while the body runs: the result cannot be stored, the caller is told.
    let mid = {
        let (server, runs) = (server.clone(), runs.clone());
        idem.call(key(&scope, "mid-run"), Fingerprint::NONE)
            .run(|| async move {
                runs.fetch_add(1, Ordering::SeqCst);
                server.lock().unwrap().kill();
                "lost".to_string()
            })
            .await
    };
    assert_store_error(mid, "the server died during the body");
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    // While it is down, bodies do not run: no claim, no run.
    let down_key = key(&scope, "while-down");
    for i in 0..5 {
        let runs = runs.clone();
        let res = idem
            .call(down_key.clone(), Fingerprint::NONE)
            .run(|| async move {
                runs.fetch_add(1, Ordering::SeqCst);
                "ran".to_string()
            })
            .await;
        assert_store_error(res, &format!("call {i} while the server is down"));
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1, "a body ran without a claim");

    // Back up (empty, its script cache too): the same store works again, within bounds.
    server.lock().unwrap().spawn();
    let deadline = Instant::now() + Duration::from_secs(20);
    let value = loop {
        let runs = runs.clone();
        match idem
            .call(down_key.clone(), Fingerprint::NONE)
            .run(|| async move {
                runs.fetch_add(1, Ordering::SeqCst);
                "after".to_string()
            })
            .await
        {
            Ok(v) => break v,
            Err(e) => {
                assert_store_error(Err(e), "while reconnecting");
                assert!(
                    Instant::now() < deadline,
                    "the store did not recover within 20s"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    assert_eq!(value, "after");
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    let replay = idem
        .call(down_key.clone(), Fingerprint::NONE)
        .run(|| async { "again".to_string() })
        .await
        .unwrap();
    assert_eq!(replay, "after", "replayed from the restarted server");
}

#[tokio::test]
async fn dropped_connections_reconnect() {
    let Some(server) = PrivateRedis::start(&[]) else {
        return;
    };
    let store = RedisStore::builder()
        .command_timeout(Duration::from_secs(1))
        .open(&server.url())
        .await
        .unwrap();
    let mut admin = admin(&server.url()).await;
    let scope = unique_scope("redis-client-kill");
    let k = key(&scope, "k");
    let mut failures = 0;
    for round in 0..5 {
        let killed = kill_normal_clients(&mut admin).await;
        assert!(
            killed >= 1,
            "round {round}: the store's connection was not there to kill"
        );
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match store.get(&k).await {
                Ok(_) => break,
                Err(e) => {
                    assert!(
                        matches!(e, StoreError::Unavailable { .. }),
                        "round {round}: a dropped connection is Unavailable: {e:?}"
                    );
                    failures += 1;
                    assert!(Instant::now() < deadline, "no reconnection within 10s");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }
    // The manager reconnects; at most one call per drop may see the dropped connection.
    assert!(
        failures <= 5,
        "{failures} failed calls for 5 dropped connections"
    );
}

#[tokio::test]
async fn a_frozen_server_times_out_within_the_command_timeout() {
    let Some(server) = PrivateRedis::start(&[]) else {
        return;
    };
    let store = RedisStore::builder()
        .command_timeout(Duration::from_millis(300))
        .open(&server.url())
        .await
        .unwrap();
    // The engine relies on this bound instead of timing each step again.
    assert_eq!(store.step_bound(), Some(Duration::from_millis(300)));
    let k = key(&unique_scope("redis-frozen"), "k");
    server.signal("-STOP");
    let started = Instant::now();
    let res = store.claim_fresh(&k, Duration::from_secs(5)).await;
    let took = started.elapsed();
    server.signal("-CONT");
    match res {
        Err(StoreError::Timeout { after, .. }) => assert_eq!(after, Duration::from_millis(300)),
        other => panic!("expected a timeout, got {other:?}"),
    }
    assert!(
        took < Duration::from_secs(2),
        "the command timeout did not bound the call: {took:?}"
    );
    // Thawed, the same store answers again.
    let deadline = Instant::now() + Duration::from_secs(10);
    while store.get(&k).await.is_err() {
        assert!(
            Instant::now() < deadline,
            "no answer after the server thawed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn connecting_to_nothing_is_a_bounded_connect_error() {
    if backend_url(URL_VAR).is_none() {
        return;
    }
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let started = Instant::now();
    let res = RedisStore::builder()
        .connect_timeout(Duration::from_millis(300))
        .open(&format!("redis://127.0.0.1:{port}"))
        .await;
    assert!(matches!(res, Err(Error::Connect { .. })), "{res:?}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );
    // A URL that is not one is the caller's configuration, not an outage.
    let bad = idem_stores::connect("redis://:::not a url").await;
    assert!(matches!(bad, Err(Error::Config { .. })), "{bad:?}");
}

// --- outages: every step bounded, through a proxy that black-holes or cuts ---------------

/// The server's address in a `redis://` URL, and the URL with the proxy's port instead.
fn via_proxy(url: &str, port: u16) -> (std::net::SocketAddr, String) {
    use std::net::ToSocketAddrs;
    let (scheme, rest) = url.split_once("://").unwrap();
    let (auth, rest) = match rest.rsplit_once('@') {
        Some((auth, rest)) => (format!("{auth}@"), rest),
        None => (String::new(), rest),
    };
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (host, path) = rest.split_at(end);
    let host = if host.contains(':') {
        host.to_string()
    } else {
        format!("{host}:6379")
    };
    let addr = host.to_socket_addrs().unwrap().next().unwrap();
    (addr, format!("{scheme}://{auth}127.0.0.1:{port}{path}"))
}

/// A store on the shared test server through a proxy of the test's own, and one straight.
async fn behind_proxy() -> Option<(support::TcpProxy, Arc<dyn Store>, Arc<dyn Store>)> {
    let url = backend_url(URL_VAR)?;
    let (upstream, _) = via_proxy(&url, 0);
    let proxy = support::TcpProxy::start(upstream).await;
    let (_, through) = via_proxy(&url, proxy.port());
    let proxied = RedisStore::open(&through).await.unwrap();
    let direct = RedisStore::open(&url).await.unwrap();
    Some((proxy, Arc::new(proxied), Arc::new(direct)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn black_holed_claim_answers_within_the_store_timeout() {
    let Some((proxy, store, _)) = behind_proxy().await else {
        return;
    };
    let k = key(&unique_scope("redis-bh-claim"), "k");
    support::claim_when_black_holed(store, &proxy, k).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn black_holed_release_answers_within_the_store_timeout() {
    let Some((proxy, store, _)) = behind_proxy().await else {
        return;
    };
    let k = key(&unique_scope("redis-bh-release"), "k");
    support::release_when_black_holed(store, &proxy, k).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn black_holed_extends_and_complete_answer_within_the_store_timeout() {
    let Some((proxy, store, _)) = behind_proxy().await else {
        return;
    };
    let k = key(&unique_scope("redis-bh-extend"), "k");
    support::extend_and_complete_when_black_holed(store, &proxy, k).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_complete_black_holed_after_the_body_never_runs_it_twice_within_the_lease() {
    let Some((proxy, store, direct)) = behind_proxy().await else {
        return;
    };
    let k = key(&unique_scope("redis-bh-complete"), "k");
    support::complete_black_holed_after_the_body(store, direct, &proxy, k).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cut_connections_fail_fast_and_the_manager_reconnects() {
    let Some((proxy, store, _)) = behind_proxy().await else {
        return;
    };
    support::cut_connections_recover(store, &proxy, &unique_scope("redis-cut")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connecting_through_a_black_hole_is_bounded() {
    let Some(url) = backend_url(URL_VAR) else {
        return;
    };
    let (upstream, _) = via_proxy(&url, 0);
    let proxy = support::TcpProxy::start(upstream).await;
    proxy.black_hole();
    let (_, through) = via_proxy(&url, proxy.port());
    let timeout = Duration::from_millis(300);
    let started = Instant::now();
    let res = RedisStore::builder()
        .connect_timeout(timeout)
        .open(&through)
        .await;
    // The connection opens (the proxy accepts) but the handshake never answers: bounded
    // by the connect timeout, tried at most three times.
    support::assert_within("redis connect", started.elapsed(), timeout * 3);
    assert!(matches!(res, Err(Error::Connect { .. })), "{res:?}");
}
