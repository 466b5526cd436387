//! A Redis that lost its records: the store's epoch (`<prefix>epoch`, see `LostRecords`)
//! notices a restart without persistence and a `FLUSHALL`, logs it at `error` level, and
//! refuses claims of keys without a record as its policy says; a healthy server, with a
//! reconnect, never looks lost. Each test owns a private `redis-server` without persistence
//! (`support/redis_server.rs`), so restarting or flushing it disturbs no one.
//!
//! ```text
//! IDEM_TEST_REDIS_URL=redis://127.0.0.1:6379 cargo test -p idem-stores --features redis \
//!   --test redis_epoch
//! ```
#![cfg(feature = "redis")]

mod support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use idem_core::{Error, Fingerprint, Idem, Key, StoreError};
use idem_stores::{LostRecords, RedisStore};
use support::redis_server::{admin, counted, key, kill_normal_clients, Logged, PrivateRedis};

/// The store noticed one loss, and one error event names its server: the event's lines.
fn one_loss_logged(store: &RedisStore, server: &PrivateRedis) -> Vec<String> {
    assert_eq!(store.lost_records_noticed(), 1);
    let errors = Logged::global().of(tracing::Level::ERROR, server.port());
    assert_eq!(errors.len(), 1, "one loss, one event: {errors:?}");
    errors
}

/// A call of `key` whose body counts its runs and answers `value`.
async fn call(idem: &Idem, key: &Key, runs: &AtomicU32, value: u32) -> Result<u32, Error> {
    idem.call(key.clone(), Fingerprint::NONE)
        .run(|| async {
            runs.fetch_add(1, Ordering::SeqCst);
            value
        })
        .await
}

/// A store on `server` that reads its epoch at most every `interval`, under `policy` (the
/// default's when `None`), and an engine on it with a 5 s lease.
async fn store_and_engine(
    server: &PrivateRedis,
    interval: Duration,
    policy: Option<LostRecords>,
) -> (RedisStore, Idem) {
    let mut builder = RedisStore::builder().epoch_check_interval(interval);
    if let Some(policy) = policy {
        builder = builder.on_lost_records(policy);
    }
    let store = builder.open(&server.url()).await.unwrap();
    let idem = engine(&store, Duration::from_secs(5));
    (store, idem)
}

fn engine(store: &RedisStore, lease: Duration) -> Idem {
    Idem::builder()
        .store(store.clone())
        .lease(lease)
        .build()
        .unwrap()
}

async fn flushall(server: &PrivateRedis) {
    let mut admin = admin(&server.url()).await;
    let () = ::redis::cmd("FLUSHALL")
        .query_async(&mut admin)
        .await
        .unwrap();
}

fn is_lost(err: &Error) -> Option<Option<Duration>> {
    match err {
        Error::Store {
            source: StoreError::RecordsLost { retry_after, .. },
            ..
        } => Some(*retry_after),
        _ => None,
    }
}

#[tokio::test]
async fn a_restart_is_noticed_after_the_failed_step_and_claims_without_a_record_fail_for_the_window(
) {
    let Some(mut server) = PrivateRedis::start(&[]) else {
        return;
    };
    let events = Logged::global();
    // No interval check in this test's time: only the failed step makes the store look.
    let store = RedisStore::builder()
        .connect_timeout(Duration::from_secs(1))
        .epoch_check_interval(Duration::from_secs(3600))
        .on_lost_records(LostRecords::FailClaimsFor(Duration::from_secs(1)))
        .open(&server.url())
        .await
        .unwrap();
    let idem = engine(&store, Duration::from_millis(500));
    let runs = AtomicU32::new(0);
    let keys: Vec<Key> = (0..5)
        .map(|i| key("epoch-restart", &format!("k{i}")))
        .collect();
    for (i, k) in keys.iter().enumerate() {
        assert_eq!(call(&idem, k, &runs, i as u32).await.unwrap(), i as u32);
    }
    assert_eq!(
        call(&idem, &keys[0], &runs, 99).await.unwrap(),
        0,
        "a replay"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 5);

    server.kill();
    let err = call(&idem, &keys[0], &runs, 99).await.unwrap_err();
    assert!(err.is_retryable(), "a server that is down: {err:?}");
    server.spawn(); // the same port, nothing on disk: every record is gone

    // The next steps read the epoch first, find none, and refuse the claim of a key that
    // has no record: it may have completed before (these did).
    let deadline = Instant::now() + Duration::from_secs(20);
    let retry_after = loop {
        let err = call(&idem, &keys[0], &runs, 99)
            .await
            .expect_err("no claim runs the body while the loss is fresh");
        if let Some(retry_after) = is_lost(&err) {
            break retry_after;
        }
        assert!(err.is_retryable(), "{err:?}");
        assert!(Instant::now() < deadline, "the loss was never noticed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(retry_after.is_some(), "the default kind of window ends");
    assert_eq!(runs.load(Ordering::SeqCst), 5, "no body ran again yet");
    let errors = one_loss_logged(&store, &server);
    assert!(
        errors[0].contains("lost idem's records") && errors[0].contains("runs its body again"),
        "{errors:?}"
    );

    // After the window (its 1 s, at least the 500 ms lease), claims go on, with a warning:
    // a key completed before the loss runs again, as documented.
    let deadline = Instant::now() + Duration::from_secs(30);
    let v = loop {
        match call(&idem, &keys[1], &runs, 11).await {
            Ok(v) => break v,
            Err(e) if is_lost(&e).is_some() && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            Err(e) => panic!("the window did not end: {e:?}"),
        }
    };
    assert_eq!(v, 11);
    assert_eq!(runs.load(Ordering::SeqCst), 6);
    assert_eq!(
        call(&idem, &keys[1], &runs, 12).await.unwrap(),
        11,
        "a replay"
    );
    assert!(
        events
            .of(tracing::Level::WARN, server.port())
            .iter()
            .any(|w| w.contains("go on")),
        "the end of the window is logged"
    );
    assert_eq!(store.lost_records_noticed(), 1, "one loss, noticed once");
}

#[tokio::test]
async fn a_flush_is_noticed_by_every_store_under_the_prefix_and_warn_only_goes_on() {
    let Some(server) = PrivateRedis::start(&[]) else {
        return;
    };
    let events = Logged::global();
    let url = server.url();
    let open = || {
        RedisStore::builder()
            .epoch_check_interval(Duration::ZERO)
            .on_lost_records(LostRecords::Warn)
            .open(&url)
    };
    let (a, b) = (open().await.unwrap(), open().await.unwrap());
    assert_eq!(a.epoch_key(), "idem:epoch");
    let (ia, ib) = (
        engine(&a, Duration::from_secs(5)),
        engine(&b, Duration::from_secs(5)),
    );
    let runs = AtomicU32::new(0);
    let k = key("epoch-flush", "k");
    assert_eq!(call(&ia, &k, &runs, 1).await.unwrap(), 1);
    assert_eq!(call(&ib, &k, &runs, 2).await.unwrap(), 1, "b replays a's");

    flushall(&server).await;
    // Warn only: the loss is logged and the key runs again at once.
    assert_eq!(call(&ia, &k, &runs, 3).await.unwrap(), 3);
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    assert_eq!(a.lost_records_noticed(), 1);
    // b finds the epoch a wrote after the loss: another than its own, so a loss too. The
    // record a wrote since is answered as always.
    assert_eq!(call(&ib, &k, &runs, 4).await.unwrap(), 3);
    assert_eq!(b.lost_records_noticed(), 1);
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    let errors = events.of(tracing::Level::ERROR, server.port());
    assert_eq!(errors.len(), 2, "{errors:?}");
    assert!(errors.iter().any(|e| e.contains("found_epoch=none")));
    assert!(errors.iter().all(|e| e.contains("epoch_key=idem:epoch")));
}

#[tokio::test]
async fn until_acknowledged_refuses_every_claim_without_a_record_until_one_store_acknowledges() {
    let Some(server) = PrivateRedis::start(&[]) else {
        return;
    };
    let url = server.url();
    let open = || {
        RedisStore::builder()
            .epoch_check_interval(Duration::ZERO)
            .on_lost_records(LostRecords::FailClaimsUntilAcknowledged)
            .open(&url)
    };
    // Two stores under one prefix, as two processes of a service have.
    let (a, b) = (open().await.unwrap(), open().await.unwrap());
    let (ia, ib) = (
        engine(&a, Duration::from_secs(5)),
        engine(&b, Duration::from_secs(5)),
    );
    let runs = AtomicU32::new(0);
    let k = key("epoch-ack", "k");
    call(&ia, &k, &runs, 1).await.unwrap();
    flushall(&server).await;
    for (idem, k) in [
        (&ia, k.clone()),
        (&ia, key("epoch-ack", "fresh")),
        (&ib, key("epoch-ack", "fresh-b")),
    ] {
        let err = call(idem, &k, &runs, 2).await.unwrap_err();
        assert_eq!(is_lost(&err), Some(None), "{err:?}");
        assert!(!err.is_retryable(), "not until someone acts: {err}");
        let Error::Store { source, .. } = &err else {
            unreachable!()
        };
        assert!(
            source
                .to_string()
                .contains("until the loss is acknowledged"),
            "{source}"
        );
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!((a.lost_records_noticed(), b.lost_records_noticed()), (1, 1));

    // One acknowledgement, on a: a goes on at once, b at its next claim.
    a.acknowledge_lost_records().await.unwrap();
    assert_eq!(call(&ia, &k, &runs, 3).await.unwrap(), 3);
    assert_eq!(
        call(&ib, &key("epoch-ack", "fresh-b"), &runs, 4)
            .await
            .unwrap(),
        4
    );
    assert_eq!(runs.load(Ordering::SeqCst), 3);

    // A later loss is another epoch: refused again, by both.
    flushall(&server).await;
    for idem in [&ia, &ib] {
        let err = call(idem, &key("epoch-ack", "after-2nd"), &runs, 5)
            .await
            .unwrap_err();
        assert_eq!(is_lost(&err), Some(None), "{err:?}");
    }
    assert_eq!(runs.load(Ordering::SeqCst), 3);
}

/// The claim script compares the epoch key with the store's own epoch before it writes a
/// claim, so the claim after a flush sees the loss itself: every key completed before fails
/// closed at once, without waiting for the check interval (an hour here, so that nothing
/// else can notice).
#[tokio::test]
async fn a_flush_is_seen_by_the_next_claim_and_no_completed_key_runs_again() {
    let Some(server) = PrivateRedis::start(&[]) else {
        return;
    };
    Logged::global(); // listening before anything logs
    let (store, idem) = store_and_engine(&server, Duration::from_secs(3600), None).await;
    let runs = AtomicU32::new(0);
    let keys: Vec<Key> = (0..20)
        .map(|i| key("epoch-claim", &format!("k{i}")))
        .collect();
    for (i, k) in keys.iter().enumerate() {
        assert_eq!(call(&idem, k, &runs, i as u32).await.unwrap(), i as u32);
    }
    assert_eq!(runs.load(Ordering::SeqCst), 20);

    flushall(&server).await;
    let started = Instant::now();
    for k in &keys {
        let err = call(&idem, k, &runs, 99)
            .await
            .expect_err("a key completed before the flush does not run again");
        assert!(
            matches!(is_lost(&err), Some(Some(_))),
            "refused for the default window: {err:?}"
        );
    }
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(5),
        "the claims were refused at once, not after a check: {took:?}"
    );
    assert_eq!(
        runs.load(Ordering::SeqCst),
        20,
        "no body ran after the flush"
    );
    let errors = one_loss_logged(&store, &server);
    assert!(errors[0].contains("found_epoch=none"), "{errors:?}");
}

/// Claims racing after a flush, each finding the epoch missing or already replaced in its
/// script: the loss is noticed once (one event, one new epoch), and every claim fails
/// closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_claims_that_see_a_flush_notice_it_once_and_all_fail_closed() {
    let Some(server) = PrivateRedis::start(&[]) else {
        return;
    };
    Logged::global(); // listening before anything logs
    let (store, idem) = store_and_engine(&server, Duration::from_secs(3600), None).await;
    let runs = Arc::new(AtomicU32::new(0));
    let keys: Vec<Key> = (0..20)
        .map(|i| key("epoch-claim-race", &format!("k{i}")))
        .collect();
    for k in &keys {
        call(&idem, k, &runs, 1).await.unwrap();
    }
    flushall(&server).await;
    let barrier = Arc::new(tokio::sync::Barrier::new(keys.len()));
    let tasks: Vec<_> = keys
        .iter()
        .map(|k| {
            let (idem, runs, barrier, k) = (idem.clone(), runs.clone(), barrier.clone(), k.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                call(&idem, &k, &runs, 2).await
            })
        })
        .collect();
    for task in tasks {
        let err = task.await.unwrap().unwrap_err();
        assert!(matches!(is_lost(&err), Some(Some(_))), "{err:?}");
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        20,
        "no body ran after the flush"
    );
    one_loss_logged(&store, &server);
}

/// With `Warn`, the loss the claim script sees is logged as any other, and the claim goes
/// on against the new epoch: the key runs again, and once only.
#[tokio::test]
async fn a_flush_seen_by_a_claim_under_warn_is_logged_and_the_claim_goes_on() {
    let Some(server) = PrivateRedis::start(&[]) else {
        return;
    };
    Logged::global(); // listening before anything logs
    let (store, idem) =
        store_and_engine(&server, Duration::from_secs(3600), Some(LostRecords::Warn)).await;
    let runs = AtomicU32::new(0);
    let k = key("epoch-claim-warn", "k");
    assert_eq!(call(&idem, &k, &runs, 1).await.unwrap(), 1);
    flushall(&server).await;
    assert_eq!(call(&idem, &k, &runs, 2).await.unwrap(), 2);
    assert_eq!(call(&idem, &k, &runs, 3).await.unwrap(), 2, "a replay");
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    one_loss_logged(&store, &server);
}

#[tokio::test]
async fn a_flush_between_two_steps_is_noticed_once_the_interval_passed() {
    let Some(server) = PrivateRedis::start(&[]) else {
        return;
    };
    let interval = Duration::from_millis(200);
    let (_store, idem) = store_and_engine(&server, interval, None).await;
    let runs = AtomicU32::new(0);
    let k = key("epoch-interval", "k");
    call(&idem, &k, &runs, 1).await.unwrap();
    flushall(&server).await;
    tokio::time::sleep(interval * 2).await;
    let err = call(&idem, &k, &runs, 2).await.unwrap_err();
    let retry_after = is_lost(&err).unwrap_or_else(|| panic!("{err:?}"));
    assert!(err.is_retryable(), "the default window is temporary");
    assert!(retry_after.is_some_and(|d| d <= idem_stores::DEFAULT_REDIS_LOST_RECORDS_GRACE));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_steps_notice_a_loss_once_and_all_fail_closed() {
    let Some(server) = PrivateRedis::start(&[]) else {
        return;
    };
    Logged::global(); // listening before anything logs
    let interval = Duration::from_millis(100);
    let (store, idem) = store_and_engine(&server, interval, None).await;
    let runs = Arc::new(AtomicU32::new(0));
    call(&idem, &key("epoch-concurrent", "before"), &runs, 1)
        .await
        .unwrap();
    flushall(&server).await;
    tokio::time::sleep(interval * 3).await;
    let barrier = Arc::new(tokio::sync::Barrier::new(20));
    let tasks: Vec<_> = (0..20)
        .map(|i| {
            let (idem, runs, barrier) = (idem.clone(), runs.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                call(&idem, &key("epoch-concurrent", &format!("k{i}")), &runs, i).await
            })
        })
        .collect();
    for task in tasks {
        let err = task.await.unwrap().unwrap_err();
        assert!(
            matches!(is_lost(&err), Some(Some(_))),
            "every fresh claim is refused: {err:?}"
        );
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1, "no body ran after the loss");
    one_loss_logged(&store, &server);
}

#[tokio::test]
async fn a_healthy_server_never_looks_lost_across_many_steps_and_a_reconnect() {
    let Some(server) = PrivateRedis::start(&[]) else {
        return;
    };
    let events = Logged::global();
    // The epoch is read before every step.
    let (store, idem) = store_and_engine(
        &server,
        Duration::ZERO,
        Some(LostRecords::FailClaimsUntilAcknowledged),
    )
    .await;
    let runs = AtomicU32::new(0);
    for i in 0..100 {
        let k = key("epoch-healthy", &format!("k{}", i % 50));
        assert_eq!(call(&idem, &k, &runs, i % 50).await.unwrap(), i % 50);
    }
    assert_eq!(runs.load(Ordering::SeqCst), 50);

    // Every connection of the store closed, the server unchanged: the store reconnects and
    // finds its own epoch.
    let mut admin = admin(&server.url()).await;
    kill_normal_clients(&mut admin).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    for i in 0..100 {
        let k = key("epoch-healthy", &format!("k{}", i % 60));
        loop {
            match call(&idem, &k, &runs, i % 60).await {
                Ok(v) => {
                    assert_eq!(v, i % 60);
                    break;
                }
                Err(e) if e.is_retryable() && is_lost(&e).is_none() => {
                    assert!(Instant::now() < deadline, "no reconnect: {e:?}");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(e) => panic!("{e:?}"),
            }
        }
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        60,
        "keys 50..60 ran, none again"
    );
    assert_eq!(store.lost_records_noticed(), 0);
    let errors = events.of(tracing::Level::ERROR, server.port());
    assert!(errors.is_empty(), "{errors:?}");
}

#[tokio::test]
async fn an_epoch_key_the_server_refuses_is_warned_about_and_steps_go_on() {
    let Some(server) = PrivateRedis::start(&[]) else {
        return;
    };
    let events = Logged::global();
    let mut admin = admin(&server.url()).await;
    let _: u64 = ::redis::cmd("HSET")
        .arg("idem:epoch")
        .arg("not")
        .arg("a string")
        .query_async(&mut admin)
        .await
        .unwrap();
    let store = RedisStore::builder()
        .epoch_check_interval(Duration::ZERO)
        .on_lost_records(LostRecords::FailClaimsUntilAcknowledged)
        .open(&server.url())
        .await
        .expect("an epoch it cannot read does not refuse the connection");
    let idem = engine(&store, Duration::from_secs(5));
    let runs = AtomicU32::new(0);
    let k = key("epoch-wrongtype", "k");
    assert_eq!(call(&idem, &k, &runs, 1).await.unwrap(), 1);
    assert_eq!(call(&idem, &k, &runs, 2).await.unwrap(), 1);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(store.lost_records_noticed(), 0);
    let warnings = events.of(tracing::Level::WARN, server.port());
    assert!(
        warnings.iter().any(|w| w.contains("epoch_key=idem:epoch")),
        "{warnings:?}"
    );
}

/// The commands the server ran for 10 first calls and 10 replays on `store`.
async fn cost(server: &PrivateRedis, store: &RedisStore, scope: &str) -> HashMap<String, u64> {
    let mut admin = admin(&server.url()).await;
    let idem = engine(store, Duration::from_secs(5));
    let runs = AtomicU32::new(0);
    let ((), mut ran) = counted(&mut admin, async {
        for i in 0..20 {
            let k = key(scope, &format!("k{}", i % 10));
            call(&idem, &k, &runs, 1).await.unwrap();
        }
    })
    .await;
    ran.remove("info");
    ran
}

#[tokio::test]
async fn the_epoch_costs_one_get_per_step_it_is_due_and_nothing_otherwise() {
    let Some(server) = PrivateRedis::start(&[]) else {
        return;
    };
    let url = server.url();
    let open = |interval| {
        RedisStore::builder()
            .epoch_check_interval(interval)
            .open(&url)
    };
    let rare = open(Duration::from_secs(3600)).await.unwrap();
    let always = open(Duration::ZERO).await.unwrap();
    let rare_cost = cost(&server, &rare, "epoch-cost-rare").await;
    let always_cost = cost(&server, &always, "epoch-cost-always").await;
    eprintln!("interval 1h: {rare_cost:?}\ninterval 0: {always_cost:?}");
    // 10 first calls (claim, complete) and 10 replays (claim): 30 scripts either way.
    assert_eq!(rare_cost.get("evalsha"), Some(&30));
    assert_eq!(always_cost.get("evalsha"), Some(&30));
    // The GETs inside the scripts are the same; checking before every step adds one each.
    let gets = |c: &HashMap<String, u64>| c.get("get").copied().unwrap_or(0);
    assert_eq!(gets(&always_cost), gets(&rare_cost) + 30);
    assert_eq!(
        always_cost.get("set"),
        rare_cost.get("set"),
        "an epoch found is never written"
    );
}
