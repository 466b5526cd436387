//! `RedisStore` across a failover: a private primary, a private replica that follows it
//! through a `TcpProxy` delaying the replication stream, keys run through the engine, the
//! primary killed right after the last acknowledgement, the replica promoted, and every key
//! retried there. Without a durability level acknowledged results are lost (their retry
//! runs the body again); with `wait_for_replicas(1, ..)` none are. RELIABILITY.md keeps the
//! figures these tests print. The conformance suite runs here too, on a durable store
//! whose primary has a replica attached: the level changes no behaviour of the contract.
//!
//! ```text
//! IDEM_TEST_REDIS_URL=redis://127.0.0.1:6379 cargo test -p idem-stores --features redis \
//!   --test redis_failover -- --nocapture
//! ```
//!
//! Like the other Redis test files, they skip without `IDEM_TEST_REDIS_URL` (and fail
//! under `IDEM_REQUIRE_BACKENDS=1`); the servers they use are their own `redis-server`s.
#![cfg(feature = "redis")]

mod support;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use idem_core::testing::unique_scope;
use idem_core::{Error, Fingerprint, Idem, InProgress, StoreError, StoreWrapper};
use idem_stores::RedisStore;
use support::redis_server::{admin, key, PrivateRedis};
use support::TcpProxy;

/// Keys run before the failover.
const KEYS: usize = 200;
/// Engines (each its own store, so its own connection) running the keys side by side: a
/// `WAIT` holds up its connection, so one connection would run the keys one replication
/// round trip at a time.
const ENGINES: usize = 40;
/// How long the proxy holds each chunk of the replication stream: 300 ms, or
/// `IDEM_FAILOVER_DELAY_MS` (for measuring other lags; RELIABILITY.md has 300 and 1000).
fn link_delay() -> Duration {
    let ms = std::env::var("IDEM_FAILOVER_DELAY_MS")
        .ok()
        .and_then(|ms| ms.parse().ok())
        .unwrap_or(300);
    Duration::from_millis(ms)
}

/// The durable store's replica timeout: well above the link's lag (one to two delays: a
/// chunk arriving while the proxy holds the one before waits for it).
fn replica_timeout() -> Duration {
    (link_delay() * 4).max(Duration::from_secs(2))
}
/// The lease of the calls before the failover: it outlasts a call's two waits for the
/// replica, and a claim the replica holds without its result ends soon after the failover
/// (its retry waits for that).
fn lease() -> Duration {
    replica_timeout() * 3
}

/// Taken exclusively by the tests that load the machine (40 connections, 200 keys) or time
/// a wait, shared by the rest (each conformance behaviour holds it through its store): the
/// conformance suite's 300 ms leases must not include a replica acknowledgement delayed
/// by a failover run beside them on two cores.
static TURNS: std::sync::LazyLock<Arc<tokio::sync::RwLock<()>>> =
    std::sync::LazyLock::new(Arc::default);

async fn exclusive() -> tokio::sync::OwnedRwLockWriteGuard<()> {
    TURNS.clone().write_owned().await
}

/// A primary, the proxy in front of it and a replica following the primary through the
/// proxy.
struct Replicated {
    primary: PrivateRedis,
    proxy: TcpProxy,
    replica: PrivateRedis,
}

async fn replicated() -> Option<Replicated> {
    // Diskless full sync, at once: the replica is up in milliseconds, nothing on disk.
    let primary = PrivateRedis::start(&[
        "--repl-diskless-sync",
        "yes",
        "--repl-diskless-sync-delay",
        "0",
    ])?;
    let proxy = TcpProxy::start(([127, 0, 0, 1], primary.port()).into()).await;
    let port = proxy.port().to_string();
    let replica = PrivateRedis::start(&["--replicaof", "127.0.0.1", &port])?;
    wait_replicated(&primary, &replica).await;
    Some(Replicated {
        primary,
        proxy,
        replica,
    })
}

/// A primary with a replica attached directly (no proxy).
struct Pair {
    primary: PrivateRedis,
    /// Kept running (and stopped on drop) for the primary's sake.
    _replica: PrivateRedis,
}

impl Pair {
    async fn start() -> Option<Pair> {
        let primary = PrivateRedis::start(&[
            "--repl-diskless-sync",
            "yes",
            "--repl-diskless-sync-delay",
            "0",
        ])?;
        let port = primary.port().to_string();
        let replica = PrivateRedis::start(&["--replicaof", "127.0.0.1", &port])?;
        wait_replicated(&primary, &replica).await;
        Some(Pair {
            primary,
            _replica: replica,
        })
    }
}

/// The pair the conformance behaviours share while any of them runs (each works in a scope
/// of its own): starting and syncing two servers per behaviour costs more than most
/// behaviours, and its load (a fork per sync) would slow the others' replica
/// acknowledgements past their 300 ms leases. The last store dropped stops it.
static SHARED_PAIR: std::sync::Mutex<std::sync::Weak<Pair>> =
    std::sync::Mutex::new(std::sync::Weak::new());

async fn shared_pair() -> Option<Arc<Pair>> {
    if let Some(pair) = SHARED_PAIR.lock().unwrap().upgrade() {
        return Some(pair);
    }
    let pair = Arc::new(Pair::start().await?);
    let mut shared = SHARED_PAIR.lock().unwrap();
    match shared.upgrade() {
        Some(started_meanwhile) => Some(started_meanwhile),
        None => {
            *shared = Arc::downgrade(&pair);
            Some(pair)
        }
    }
}

/// A store with `wait_for_replicas(1, ..)` on a primary that has a replica attached,
/// keeping the servers running.
struct Durable {
    store: RedisStore,
    pair: Arc<Pair>,
    _turn: tokio::sync::OwnedRwLockReadGuard<()>,
}

impl std::fmt::Debug for Durable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.store.fmt(f)
    }
}

impl StoreWrapper for Durable {
    type Inner = RedisStore;
    fn inner(&self) -> &RedisStore {
        &self.store
    }
    fn step_bound(&self) -> Option<Duration> {
        idem_core::Store::step_bound(&self.store)
    }
}

async fn durable_store_on(pair: Arc<Pair>) -> Durable {
    let turn = TURNS.clone().read_owned().await;
    let store = RedisStore::builder()
        .wait_for_replicas(1, Duration::from_secs(1))
        .open(&pair.primary.url())
        .await
        .unwrap();
    Durable {
        store,
        pair,
        _turn: turn,
    }
}

async fn durable_store() -> Option<Durable> {
    Some(durable_store_on(shared_pair().await?).await)
}

idem_core::conformance_tests!(redis_durable, durable_store());

/// Waits until the replica follows the primary: its link is up, and the primary counts it
/// as online (after a sync the primary does so only once the replica's first
/// acknowledgement arrives, up to a second later; until then `WAIT` does not count it). A
/// server that is resyncing may refuse a connection or a command for a moment (`LOADING`):
/// that is not up yet.
async fn wait_replicated(primary: &PrivateRedis, replica: &PrivateRedis) {
    async fn replication(url: &str) -> Option<String> {
        let mut conn = ::redis::Client::open(url)
            .ok()?
            .get_multiplexed_async_connection()
            .await
            .ok()?;
        ::redis::cmd("INFO")
            .arg("replication")
            .query_async(&mut conn)
            .await
            .ok()
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let link_up = replication(&replica.url())
            .await
            .is_some_and(|i| i.contains("master_link_status:up"));
        let online = replication(&primary.url())
            .await
            .is_some_and(|i| i.contains("connected_slaves:1") && i.contains("state=online"));
        if link_up && online {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the replica did not sync with the primary"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// What a failover did to the keys run before it.
#[derive(Debug)]
struct Figures {
    keys: usize,
    /// Calls that returned Ok before the failover.
    acknowledged: usize,
    /// Acknowledged keys whose retry after the failover ran the body again.
    lost: usize,
    /// Keys whose body ran more than once, before and after the failover together.
    run_twice: usize,
    /// How long the keys took before the failover.
    took: Duration,
}

/// Runs [`KEYS`] keys through engines on `stores`, kills the primary right after the last
/// answer (the replication stream still in the proxy is lost with it), promotes the
/// replica, and retries every key there.
async fn fail_over(setup: Replicated, stores: Vec<RedisStore>) -> Figures {
    let durable = stores[0].replicas().is_some();
    let Replicated {
        mut primary,
        proxy,
        replica,
    } = setup;
    proxy.delay_replies(link_delay());
    let scope = unique_scope("redis-failover");
    let runs: Arc<Vec<AtomicU32>> = Arc::new((0..KEYS).map(|_| AtomicU32::new(0)).collect());

    let started = Instant::now();
    let tasks: Vec<_> = stores
        .into_iter()
        .enumerate()
        .map(|(e, store)| {
            let (scope, runs) = (scope.clone(), runs.clone());
            tokio::spawn(async move {
                let idem = Idem::builder()
                    .store(store)
                    .store_timeout(replica_timeout() + Duration::from_secs(2))
                    .build()
                    .unwrap();
                let mut acknowledged = Vec::new();
                for k in (e..KEYS).step_by(ENGINES) {
                    let runs = runs.clone();
                    let res = idem
                        .call(key(&scope, &k.to_string()), Fingerprint::NONE)
                        .lease(lease())
                        .run(|| async move {
                            runs[k].fetch_add(1, Ordering::SeqCst);
                            format!("v{k}")
                        })
                        .await;
                    match res {
                        Ok(v) => {
                            assert_eq!(v, format!("v{k}"));
                            acknowledged.push(k);
                        }
                        Err(e) => eprintln!("key {k} before the failover: {e}"),
                    }
                }
                acknowledged
            })
        })
        .collect();
    let mut acknowledged = [false; KEYS];
    for task in tasks {
        for k in task.await.unwrap() {
            acknowledged[k] = true;
        }
    }

    let took = started.elapsed();
    // The primary dies: nothing more reaches the replica (what the proxy still holds is
    // dropped with its connections, and the replica's reconnects go nowhere).
    proxy.black_hole();
    proxy.cut();
    primary.kill();
    let _: () = ::redis::cmd("REPLICAOF")
        .arg("NO")
        .arg("ONE")
        .query_async(&mut admin(&replica.url()).await)
        .await
        .unwrap();

    let idem = Idem::new(RedisStore::open(&replica.url()).await.unwrap());
    let mut lost = 0;
    for (k, acked) in acknowledged.iter().enumerate() {
        let before = runs[k].load(Ordering::SeqCst);
        let counter = runs.clone();
        let v = idem
            .call(key(&scope, &k.to_string()), Fingerprint::NONE)
            // A claim the replica holds without its result: taken over once its lease ends.
            .in_progress(InProgress::Wait)
            .wait_timeout(lease() + Duration::from_secs(1))
            .run(|| async move {
                counter[k].fetch_add(1, Ordering::SeqCst);
                format!("v{k}")
            })
            .await
            .unwrap_or_else(|e| panic!("key {k} after the failover: {e}"));
        assert_eq!(v, format!("v{k}"));
        if *acked && runs[k].load(Ordering::SeqCst) > before {
            lost += 1;
        }
    }
    let run_twice = runs.iter().filter(|r| r.load(Ordering::SeqCst) > 1).count();
    let figures = Figures {
        keys: KEYS,
        acknowledged: acknowledged.iter().filter(|a| **a).count(),
        lost,
        run_twice,
        took,
    };
    // A row of RELIABILITY.md's table.
    eprintln!(
        "| {} | {:?} | {:?} | {} | {} | {} | {} | {:.1?} |",
        if durable { "1 replica" } else { "off" },
        link_delay(),
        replica_timeout(),
        figures.keys,
        figures.acknowledged,
        figures.lost,
        figures.run_twice,
        figures.took
    );
    figures
}

async fn stores(url: &str, replicas: u32) -> Vec<RedisStore> {
    let mut out = Vec::new();
    for _ in 0..ENGINES {
        let store = RedisStore::builder()
            .wait_for_replicas(replicas, replica_timeout())
            // The script and its WAIT share the command timeout; the engine's step
            // timeout (5 s) is raised in `fail_over` to match.
            .command_timeout(replica_timeout() + Duration::from_secs(1))
            .open(url)
            .await
            .unwrap();
        out.push(store);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_level_a_failover_loses_acknowledged_results() {
    let _exclusive = exclusive().await;
    let Some(setup) = replicated().await else {
        return;
    };
    let stores = stores(&setup.primary.url(), 0).await;
    assert_eq!(stores[0].replicas(), None, "off by default");
    let figures = fail_over(setup, stores).await;
    assert_eq!(
        figures.acknowledged, figures.keys,
        "a healthy primary answers every call"
    );
    assert!(
        figures.lost > 0,
        "the replica lagged {:?} behind, so results acknowledged by the primary alone must have been lost: {figures:?}",
        link_delay()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_one_replica_acknowledging_a_failover_loses_nothing() {
    let _exclusive = exclusive().await;
    let Some(setup) = replicated().await else {
        return;
    };
    let stores = stores(&setup.primary.url(), 1).await;
    assert_eq!(stores[0].replicas(), Some((1, replica_timeout())));
    let figures = fail_over(setup, stores).await;
    assert_eq!(
        figures.acknowledged, figures.keys,
        "the replica acknowledges within the timeout: {figures:?}"
    );
    assert_eq!(figures.lost, 0, "{figures:?}");
    assert_eq!(figures.run_twice, 0, "{figures:?}");
}

/// The level set and no replica attached: the claim fails with `NotReplicated`, the body
/// does not run, and the claim is released (a plain store on the same connection claims
/// the key at once). A replay is refused the same way: the replicas may not hold it.
#[tokio::test]
async fn with_no_replica_attached_the_claim_fails_and_the_body_does_not_run() {
    let Some(server) = PrivateRedis::start(&[]) else {
        return;
    };
    let plain = RedisStore::open(&server.url()).await.unwrap();
    let durable = plain.with_replicas(1, Duration::from_millis(100));
    assert_eq!(plain.replicas(), None);
    assert_eq!(durable.replicas(), Some((1, Duration::from_millis(100))));
    let (plain, durable) = (Idem::new(plain), Idem::new(durable));
    let k = key(&unique_scope("redis-no-replica"), "k");
    let runs = Arc::new(AtomicU32::new(0));
    let body = || {
        let runs = runs.clone();
        move || async move {
            runs.fetch_add(1, Ordering::SeqCst);
            "v".to_string()
        }
    };

    let started = Instant::now();
    let err = durable
        .call(k.clone(), Fingerprint::NONE)
        .run(body())
        .await
        .unwrap_err();
    assert_not_replicated(&err, "claim", Duration::from_millis(100));
    assert!(
        started.elapsed() >= Duration::from_millis(100),
        "WAIT waited its timeout"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0, "the body did not run");
    eprintln!("{err}: {}", std::error::Error::source(&err).unwrap());

    // Released: the plain store claims at once (not `InProgress`) and runs the body.
    let v = plain
        .call(k.clone(), Fingerprint::NONE)
        .run(body())
        .await
        .unwrap();
    assert_eq!((v.as_str(), runs.load(Ordering::SeqCst)), ("v", 1));

    // The stored result is not answered by the durable store while no replica holds it.
    let err = durable
        .call(k.clone(), Fingerprint::NONE)
        .run(body())
        .await
        .unwrap_err();
    assert_not_replicated(&err, "claim", Duration::from_millis(100));
    assert_eq!(runs.load(Ordering::SeqCst), 1, "no second run");
}

fn assert_not_replicated(err: &Error, step: &str, timeout: Duration) {
    assert!(err.is_retryable(), "a shortfall is temporary: {err:?}");
    match err {
        Error::Store {
            source:
                source @ StoreError::NotReplicated {
                    backend,
                    step: s,
                    acknowledged,
                    required,
                    after,
                },
            ..
        } => {
            assert_eq!(
                (*backend, *s, *acknowledged, *required, *after),
                ("redis", step, 0, 1, timeout)
            );
            assert!(source.is_temporary());
            assert_eq!(
                source.to_string(),
                format!("the redis store applied the {step} step, but only 0 of the 1 replicas it requires acknowledged it within {timeout:?}")
            );
        }
        other => panic!("expected a NotReplicated store error, got {other:?}"),
    }
}

/// The replicas fall away while the body runs: the claim was acknowledged, the complete is
/// not. The caller gets `NotReplicated` (after the engine's retries within the lease), not
/// the result, though the primary stores it; a replay is refused likewise. Once the
/// replica is back and has the record, the replay answers the first result: the body ran
/// once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_complete_the_replicas_miss_is_not_reported_until_they_have_it() {
    let _exclusive = exclusive().await;
    let Some(setup) = replicated().await else {
        return;
    };
    // Room for a loaded machine: the first claim must be acknowledged.
    let timeout = Duration::from_secs(2);
    let store = RedisStore::builder()
        .wait_for_replicas(1, timeout)
        .open(&setup.primary.url())
        .await
        .unwrap();
    let idem = Idem::new(store.clone());
    let k = key(&unique_scope("redis-complete-shortfall"), "k");
    let runs = Arc::new(AtomicU32::new(0));
    let body = |cut_link: Option<Box<dyn Fn() + Send + Sync>>| {
        let runs = runs.clone();
        move || async move {
            runs.fetch_add(1, Ordering::SeqCst);
            if let Some(cut_link) = cut_link {
                cut_link();
            }
            "v".to_string()
        }
    };

    let started = Instant::now();
    let err = idem
        .call(k.clone(), Fingerprint::NONE)
        .lease(Duration::from_secs(6))
        .run(body(Some(Box::new(setup.proxy.black_hole_switch()))))
        .await
        .unwrap_err();
    eprintln!(
        "after {:?}: {err}: {}",
        started.elapsed(),
        std::error::Error::source(&err).unwrap()
    );
    // The engine tried again until the lease ran out; its last attempt, cut to what was
    // left of the lease, may have timed out before the WAIT answered.
    match &err {
        Error::Store {
            source:
                StoreError::NotReplicated {
                    step: "complete",
                    acknowledged: 0,
                    required: 1,
                    ..
                }
                | StoreError::Timeout {
                    step: "complete", ..
                },
            ..
        } => {}
        other => panic!("expected a complete NotReplicated, got {other:?}"),
    }
    assert!(err.is_retryable());
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    // The primary holds the result all the same.
    assert!(matches!(
        idem_core::Store::get(&store.with_replicas(0, timeout), &k).await,
        Ok(Some(idem_core::Record::Completed { .. }))
    ));

    // A replay through the durable store waits for the replica too, and is refused.
    let err = idem
        .call(k.clone(), Fingerprint::NONE)
        .run(body(None))
        .await
        .unwrap_err();
    assert_not_replicated(&err, "claim", timeout);
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    // The link is back: the replica resyncs, and the replay answers the first result.
    setup.proxy.heal();
    setup.proxy.cut();
    wait_replicated(&setup.primary, &setup.replica).await;
    let v = idem
        .call(k.clone(), Fingerprint::NONE)
        .run(body(None))
        .await
        .unwrap();
    assert_eq!((v.as_str(), runs.load(Ordering::SeqCst)), ("v", 1));

    // The same at the store's level: a complete the replica misses is `NotReplicated`;
    // resent with its token once the replica is back, it keeps the first result and is
    // acknowledged (the resent complete touches the record, and WAITs for that write).
    use idem_core::{Bytes, Claim, Record, Store, Token};
    let k = key(&unique_scope("redis-complete-shortfall"), "direct");
    let token = Token::random();
    let ttl = Duration::from_secs(60);
    let claim = store
        .claim(&k, &Fingerprint::NONE, token, Duration::from_secs(10))
        .await
        .unwrap();
    assert!(matches!(claim, Claim::Acquired { .. }), "{claim:?}");
    // A second connection, whose last write (a claim of another key) the replica has.
    let fresh = RedisStore::builder()
        .wait_for_replicas(1, timeout)
        .open(&setup.primary.url())
        .await
        .unwrap();
    let other = key(&unique_scope("redis-complete-shortfall"), "other");
    fresh
        .claim(&other, &Fingerprint::NONE, Token::random(), ttl)
        .await
        .unwrap();
    setup.proxy.black_hole();
    let err = store
        .complete(&k, token, Bytes::from_static(b"first"), ttl)
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::NotReplicated {
                step: "complete",
                acknowledged: 0,
                ..
            }
        ),
        "{err:?}"
    );
    // On the second connection (all its own writes replicated), the resent complete and a
    // replay are refused too. They touch the record and WAIT for that write; Redis 7.0 would
    // refuse them even without the touch, since it moves a connection's offset on every
    // command, read-only ones included, but the touch does not rely on it.
    let err = fresh
        .complete(&k, token, Bytes::from_static(b"second"), ttl)
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::NotReplicated {
                step: "complete",
                ..
            }
        ),
        "{err:?}"
    );
    let err = fresh
        .claim(&k, &Fingerprint::NONE, Token::random(), ttl)
        .await
        .unwrap_err();
    assert!(
        matches!(err, StoreError::NotReplicated { step: "claim", .. }),
        "{err:?}"
    );
    setup.proxy.heal();
    setup.proxy.cut();
    wait_replicated(&setup.primary, &setup.replica).await;
    fresh
        .complete(&k, token, Bytes::from_static(b"second"), ttl)
        .await
        .unwrap();
    let Ok(Some(Record::Completed { payload, .. })) = store.get(&k).await else {
        panic!("completed");
    };
    assert_eq!(&payload[..], b"first");
    let replica = RedisStore::open(&setup.replica.url()).await.unwrap();
    let Ok(Some(Record::Completed { payload, .. })) = replica.get(&k).await else {
        panic!("the replica holds the result");
    };
    assert_eq!(&payload[..], b"first");
}

/// A replace is as durable as a complete: with the replica cut off it is `NotReplicated`,
/// though the primary replaced the record (a repeat from the old payload then answers
/// `false`); once the replica is back it holds the new payload.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replace_the_replicas_miss_is_not_replicated() {
    use idem_core::{Bytes, Claim, Record, Store, Token};
    let _exclusive = exclusive().await;
    let Some(setup) = replicated().await else {
        return;
    };
    let timeout = Duration::from_secs(2);
    let store = RedisStore::builder()
        .wait_for_replicas(1, timeout)
        .open(&setup.primary.url())
        .await
        .unwrap();
    let k = key(&unique_scope("redis-replace-shortfall"), "k");
    let (token, ttl) = (Token::random(), Duration::from_secs(60));
    let claim = store
        .claim(&k, &Fingerprint::NONE, token, ttl)
        .await
        .unwrap();
    assert!(matches!(claim, Claim::Acquired { .. }), "{claim:?}");
    store
        .complete(&k, token, Bytes::from_static(b"hold"), ttl)
        .await
        .unwrap();

    setup.proxy.black_hole();
    let err = store
        .replace(&k, b"hold", Some((Bytes::from_static(b"value"), ttl)))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::NotReplicated {
                step: "replace",
                acknowledged: 0,
                required: 1,
                ..
            }
        ),
        "{err:?}"
    );
    setup.proxy.heal();
    setup.proxy.cut();
    wait_replicated(&setup.primary, &setup.replica).await;
    assert!(
        !store.replace(&k, b"hold", None).await.unwrap(),
        "the primary had replaced the record already"
    );
    let replica = RedisStore::open(&setup.replica.url()).await.unwrap();
    let Ok(Some(Record::Completed { payload, .. })) = replica.get(&k).await else {
        panic!("the replica holds the replaced record");
    };
    assert_eq!(&payload[..], b"value");
    assert!(store.replace(&k, b"value", None).await.unwrap());
}

/// A server that lost the scripts (`SCRIPT FLUSH`, as a restart does): the durable
/// pipeline's `NOSCRIPT` loads the script and sends the pair again, once.
#[tokio::test]
async fn a_durable_step_reloads_a_flushed_script() {
    // A pair of its own: the flush would make the shared one's users reload too.
    let Some(pair) = Pair::start().await else {
        return;
    };
    let durable = durable_store_on(Arc::new(pair)).await;
    let url = durable.pair.primary.url();
    let idem = Idem::new(durable);
    let runs = Arc::new(AtomicU32::new(0));
    let k = key(&unique_scope("redis-durable-noscript"), "k");
    for round in 0..2 {
        let _: () = ::redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query_async(&mut admin(&url).await)
            .await
            .unwrap();
        let runs = runs.clone();
        let v = idem
            .call(k.clone(), Fingerprint::NONE)
            .run(|| async move {
                runs.fetch_add(1, Ordering::SeqCst);
                "v".to_string()
            })
            .await
            .unwrap_or_else(|e| panic!("round {round}: {e}"));
        assert_eq!(v, "v");
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1, "run once, replayed once");
}

/// The cost of sharing a connection (`with_replicas`): a `WAIT` holds up the connection it
/// is sent on, so a plain call on it queues behind a durable call's waits for a lagging
/// replica, while a plain store on a connection of its own does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_call_on_a_shared_connection_waits_behind_a_durable_one() {
    let _exclusive = exclusive().await;
    let Some(setup) = replicated().await else {
        return;
    };
    // Seconds, not milliseconds: the bounds below must hold on a loaded machine.
    let delay = Duration::from_secs(2);
    setup.proxy.delay_replies(delay);
    // Timeouts above the queueing measured here (a delay or two).
    let shared = RedisStore::builder()
        .command_timeout(Duration::from_secs(30))
        .open(&setup.primary.url())
        .await
        .unwrap();
    let engine = |store: RedisStore| {
        Idem::builder()
            .store(store)
            .store_timeout(Duration::from_secs(30))
            .build()
            .unwrap()
    };
    let durable = engine(shared.with_replicas(1, Duration::from_secs(10)));
    let shared = engine(shared);
    let own = Idem::new(RedisStore::open(&setup.primary.url()).await.unwrap());
    let scope = unique_scope("redis-shared-connection");

    let slow = {
        let k = key(&scope, "durable");
        tokio::spawn(async move {
            durable
                .call(k, Fingerprint::NONE)
                .run(|| async { "d".to_string() })
                .await
        })
    };
    // Its claim and WAIT are on the connection by now (the WAIT then blocks it for
    // a delay or two).
    tokio::time::sleep(Duration::from_millis(200)).await;
    let timed = |idem: Idem, id: &'static str| {
        let k = key(&scope, id);
        async move {
            let started = Instant::now();
            idem.call(k, Fingerprint::NONE)
                .run(|| async { "p".to_string() })
                .await
                .unwrap();
            started.elapsed()
        }
    };
    let (on_shared, on_own) = tokio::join!(timed(shared, "shared"), timed(own, "own"));
    assert_eq!(slow.await.unwrap().unwrap(), "d");
    eprintln!(
        "link delay {delay:?}: a plain call took {on_shared:.1?} on the durable store's connection, {on_own:.1?} on its own"
    );
    assert!(
        on_shared > delay / 2,
        "queued behind the WAIT: {on_shared:?}"
    );
    assert!(on_own < Duration::from_secs(1), "not held up: {on_own:?}");
}
