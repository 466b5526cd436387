//! `RedisStore` against real Redis servers: the conformance suite, round trips and scripts,
//! concurrency, and bad input. Faults and outages are `redis_faults.rs`; constructors and
//! running Redis (eviction) `redis_operations.rs`; what they share `support/redis_server.rs`.
//!
//! The conformance suite and the shared-server tests use `IDEM_TEST_REDIS_URL` (e.g.
//! `redis://127.0.0.1:6379`); every key they write is in a scope of its own. The round-trip
//! tests start a private `redis-server` on a spare 127.0.0.1 port, so that they can count
//! its commands without disturbing anyone; it is killed when the test ends.
//!
//! ```text
//! IDEM_TEST_REDIS_URL=redis://127.0.0.1:6379 cargo test -p idem-stores --features redis \
//!   --test redis --test redis_faults --test redis_operations
//! ```
#![cfg(feature = "redis")]

mod support;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idem_core::testing::{backend_url, unique_scope};
use idem_core::{Claim, Error, Fingerprint, Idem, Record, Store, StoreError, Token};
use idem_stores::RedisStore;
use support::redis_server::{
    admin, claim_new, complete_new, counted, key, resends_acquire_while_own_tokens_race,
    round_trips, shared_store, waiting_engine, PrivateRedis, URL_VAR,
};
use support::ClaimFresh;

idem_core::conformance_tests!(redis, shared_store());

#[tokio::test]
async fn round_trips_first_call_two_replay_one() {
    let Some(server) = PrivateRedis::start(&[]) else {
        return;
    };
    // The epoch is read at most every 10 s by default: never here, so that the count is
    // the steps' alone on a slow machine too (`redis_epoch.rs` counts the epoch's GET).
    let store = RedisStore::builder()
        .epoch_check_interval(Duration::from_secs(3600))
        .open(&server.url())
        .await
        .unwrap();
    let idem = Idem::new(store);
    let mut admin = admin(&server.url()).await;
    let runs = AtomicU32::new(0);
    let k = key("round-trips", "order-1");
    let call = || {
        idem.call(k.clone(), Fingerprint::of(&1u8)).run(|| async {
            runs.fetch_add(1, Ordering::SeqCst);
            "receipt".to_string()
        })
    };

    let (answer, first) = counted(&mut admin, call()).await;
    assert_eq!(answer.unwrap(), "receipt");
    assert_eq!(
        round_trips(&first),
        2,
        "a first call: claim, complete; saw {first:?}"
    );
    assert_eq!(first.get("evalsha"), Some(&2), "{first:?}");
    assert_eq!(
        first.get("get"),
        Some(&3),
        "one GET per script, and the claim's of the epoch before it writes; none from the \
         client: {first:?}"
    );

    for _ in 0..3 {
        let (answer, replay) = counted(&mut admin, call()).await;
        assert_eq!(answer.unwrap(), "receipt");
        assert_eq!(
            round_trips(&replay),
            1,
            "a replay: one claim; saw {replay:?}"
        );
        assert_eq!(replay.get("evalsha"), Some(&1), "{replay:?}");
        assert_eq!(replay.get("get"), Some(&1), "{replay:?}");
        assert_eq!(
            replay.get("time"),
            None,
            "the replay path reads no clock: {replay:?}"
        );
        assert_eq!(
            replay.get("set"),
            None,
            "the replay path writes nothing: {replay:?}"
        );
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn scripts_load_again_after_the_server_forgets_them() {
    let Some(server) = PrivateRedis::start(&[]) else {
        return;
    };
    let store = RedisStore::open(&server.url()).await.unwrap();
    let mut admin = admin(&server.url()).await;
    let () = ::redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut admin)
        .await
        .unwrap();
    let k = key("noscript", "k");
    assert!(matches!(
        store.claim_fresh(&k, Duration::from_secs(5)).await.unwrap(),
        Claim::Acquired { .. }
    ));
}

/// The same claim request sent twice, as a client that retries after a lost reply (the
/// cluster client does) sends it: one `EVALSHA` with the same key and the same packed
/// argument, since the token is the caller's. Both answer Acquired; the second writes
/// nothing (no `SET`). Sent concurrently, resends of one token all acquire, while claims
/// with tokens of their own still have exactly one winner.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_claim_sent_twice_on_the_wire_is_acquired_both_times() {
    let Some(server) = PrivateRedis::start(&[]) else {
        return;
    };
    let store = RedisStore::builder()
        .epoch_check_interval(Duration::from_secs(3600)) // no epoch GET among the counts
        .open(&server.url())
        .await
        .unwrap();
    let mut admin = admin(&server.url()).await;
    let k = key("resent", "k");
    let token = Token::random();
    let lease = Duration::from_secs(30);
    let fp = Fingerprint::of(&1u8);
    for send in 1..=2 {
        let (claim, d) = counted(&mut admin, store.claim(&k, &fp, token, lease)).await;
        match claim.unwrap() {
            Claim::Acquired {
                token: acquired,
                recovered,
                ..
            } => {
                assert_eq!(acquired, token);
                assert!(!recovered, "send {send}");
            }
            other => panic!("send {send} of the same claim: {other:?}"),
        }
        assert_eq!(d.get("evalsha"), Some(&1), "send {send}: {d:?}");
        let writes = d.get("set").copied().unwrap_or(0);
        assert_eq!(writes, u64::from(send == 1), "send {send}: {d:?}");
    }
    assert!(matches!(
        store.get(&k).await.unwrap(),
        Some(Record::InProgress { token: t, .. }) if t == token
    ));

    let (resent, raced) = (key("resent", "concurrent"), key("resent", "raced"));
    resends_acquire_while_own_tokens_race(&store, resent, raced, fp, lease).await;
}

// --- concurrency ----------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_processes_worth_of_callers_run_the_body_once() {
    let Some(url) = backend_url(URL_VAR) else {
        return;
    };
    // Four stores on four connections stand for four service instances.
    let mut engines = Vec::new();
    for _ in 0..4 {
        let store = RedisStore::open(&url).await.unwrap();
        engines.push(waiting_engine(store));
    }
    let runs = Arc::new(AtomicU32::new(0));
    let k = key(&unique_scope("redis-race"), "payment-7");
    let barrier = Arc::new(tokio::sync::Barrier::new(80));
    let tasks: Vec<_> = (0..80)
        .map(|i| {
            let (idem, k, runs, barrier) = (
                engines[i % 4].clone(),
                k.clone(),
                runs.clone(),
                barrier.clone(),
            );
            tokio::spawn(async move {
                barrier.wait().await;
                idem.call(k, Fingerprint::of(&7u8))
                    .run(|| async move {
                        runs.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        format!("charged by caller {i}")
                    })
                    .await
                    .unwrap()
            })
        })
        .collect();
    let mut values = Vec::new();
    for t in tasks {
        values.push(t.await.unwrap());
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the body ran more than once"
    );
    assert!(
        values.iter().all(|v| *v == values[0]),
        "callers got different results"
    );
}

/// The suite checks `recovered` against the capability (`lease_takeover_after_lease_ends`);
/// here, that a store without a recovery window says it does not report recovery, and
/// does not.
#[tokio::test]
async fn without_a_recovery_window_a_takeover_is_not_reported_as_recovered() {
    let Some(url) = backend_url(URL_VAR) else {
        return;
    };
    let forgetful = RedisStore::builder()
        .recovery_window(Duration::ZERO)
        .open(&url)
        .await
        .unwrap();
    assert!(!forgetful.capabilities().reports_recovery);
    let k = key(&unique_scope("redis-forgetful"), "k");
    forgetful
        .claim_fresh(&k, Duration::from_millis(100))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(matches!(
        forgetful
            .claim_fresh(&k, Duration::from_secs(5))
            .await
            .unwrap(),
        Claim::Acquired {
            recovered: false,
            ..
        }
    ));
}

// --- bad input ------------------------------------------------------------------------

/// The server's clock in milliseconds and microseconds.
async fn server_time(conn: &mut ::redis::aio::MultiplexedConnection) -> (u64, u64) {
    let (s, us): (u64, u64) = ::redis::cmd("TIME").query_async(conn).await.unwrap();
    (s * 1000 + us / 1000, s * 1_000_000 + us)
}

/// The record layout, as the module docs give it: an in-progress record written today is
/// 61 bytes, its fence the last 16 ASCII digits, and it is what the claim answered; one
/// written before fences (45 bytes) still reads, as fence 0: it is answered, resent,
/// extended (and stays 45 bytes) and completed; an ended one is taken over with a fence
/// from the server's clock.
#[tokio::test]
async fn in_progress_records_of_both_layouts_read() {
    let Some(url) = backend_url(URL_VAR) else {
        return;
    };
    let store = RedisStore::open(&url).await.unwrap();
    let mut admin = admin(&url).await;
    let scope = unique_scope("redis-layouts");
    let raw = |k: &idem_core::Key| store.record_key(k);
    let fp = Fingerprint::from_bytes([7; 16]);

    // Today's layout.
    let k = key(&scope, "new");
    let token = Token::random();
    let (_, before_us) = server_time(&mut admin).await;
    let Claim::Acquired { fence, .. } = store
        .claim(&k, &fp, token, Duration::from_secs(30))
        .await
        .unwrap()
    else {
        panic!("a fresh key is acquired")
    };
    let value: Vec<u8> = ::redis::cmd("GET")
        .arg(raw(&k))
        .query_async(&mut admin)
        .await
        .unwrap();
    assert_eq!(value.len(), 61, "{}", value.escape_ascii());
    assert_eq!(&value[..6], b"idem1P");
    assert_eq!(&value[6..14], &token.get().to_be_bytes());
    assert_eq!(&value[14..30], &[7; 16]);
    let stored: u64 = std::str::from_utf8(&value[45..61])
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(
        stored,
        fence.get(),
        "the record keeps the fence the claim answered"
    );
    assert!(
        fence.get() >= before_us,
        "the fence is TIME in microseconds at least"
    );
    store
        .extend(&k, token, Duration::from_secs(30))
        .await
        .unwrap();
    let value: Vec<u8> = ::redis::cmd("GET")
        .arg(raw(&k))
        .query_async(&mut admin)
        .await
        .unwrap();
    assert_eq!(
        &value[45..],
        format!("{stored:016}").as_bytes(),
        "extend keeps the fence"
    );

    // Written before fences: live, held by `old`.
    let (now_ms, now_us) = server_time(&mut admin).await;
    let old = Token::random();
    let record = |deadline: u64| {
        let mut v = b"idem1P".to_vec();
        v.extend_from_slice(&old.get().to_be_bytes());
        v.extend_from_slice(&[7; 16]);
        v.extend_from_slice(format!("{deadline:015}").as_bytes());
        v
    };
    let live = key(&scope, "old-live");
    let ended = key(&scope, "old-ended");
    for (k, v) in [
        (&live, record(now_ms + 30_000)),
        (&ended, record(now_ms - 1_000)),
    ] {
        let () = ::redis::cmd("SET")
            .arg(raw(k))
            .arg(v)
            .arg("EX")
            .arg(60)
            .query_async(&mut admin)
            .await
            .unwrap();
    }
    assert!(matches!(
        store.get(&live).await.unwrap(),
        Some(Record::InProgress { token, .. }) if token == old
    ));
    match store
        .claim(&live, &fp, old, Duration::from_secs(30))
        .await
        .unwrap()
    {
        Claim::Acquired {
            recovered: false,
            fence,
            ..
        } => {
            assert_eq!(
                fence,
                idem_core::Fence::NONE,
                "an old record's fence reads as 0"
            )
        }
        other => panic!("a resent claim of an old record: {other:?}"),
    }
    assert!(matches!(
        store
            .claim(&live, &fp, Token::random(), Duration::from_secs(30))
            .await
            .unwrap(),
        Claim::InProgress { .. }
    ));
    store
        .extend(&live, old, Duration::from_secs(30))
        .await
        .unwrap();
    let value: Vec<u8> = ::redis::cmd("GET")
        .arg(raw(&live))
        .query_async(&mut admin)
        .await
        .unwrap();
    assert_eq!(value.len(), 45, "an extend keeps the old layout");
    store
        .complete(
            &live,
            old,
            idem_core::Bytes::from_static(b"done"),
            Duration::from_secs(60),
        )
        .await
        .unwrap();
    match store
        .claim(&live, &fp, Token::random(), Duration::from_secs(30))
        .await
        .unwrap()
    {
        Claim::Completed { payload, .. } => assert_eq!(&payload[..], b"done"),
        other => panic!("{other:?}"),
    }

    // Written before fences, its lease ended: taken over, with a fence from the clock.
    match store
        .claim(&ended, &fp, Token::random(), Duration::from_secs(30))
        .await
        .unwrap()
    {
        Claim::Acquired {
            recovered: true,
            fence,
            ..
        } => assert!(fence.get() >= now_us, "{fence:?}"),
        other => panic!("a takeover of an old ended record: {other:?}"),
    }
    let value: Vec<u8> = ::redis::cmd("GET")
        .arg(raw(&ended))
        .query_async(&mut admin)
        .await
        .unwrap();
    assert_eq!(value.len(), 61, "the successor's record has today's layout");
}

#[tokio::test]
async fn a_foreign_value_under_the_prefix_is_a_decode_error_naming_the_key() {
    let Some(url) = backend_url(URL_VAR) else {
        return;
    };
    let store = RedisStore::open(&url).await.unwrap();
    let idem = Idem::new(store.clone());
    let mut admin = admin(&url).await;
    let scope = unique_scope("redis-foreign");
    let runs = AtomicU32::new(0);

    let foreign: [(&str, &[u8]); 4] = [
        ("plain", b"hello"),
        ("truncated", b"idem1C\x00\x01"),
        ("future-version", b"idem2C0123456789abcdef0123456789payload"),
        (
            "in-progress-garbled",
            b"idem1Pxxxxxxxx0123456789abcdefnot-a-deadline!",
        ),
    ];
    for (id, value) in foreign {
        let k = key(&scope, id);
        let () = ::redis::cmd("SET")
            .arg(store.record_key(&k))
            .arg(value)
            .arg("EX")
            .arg(60)
            .query_async(&mut admin)
            .await
            .unwrap();
        let res = idem
            .call(k.clone(), Fingerprint::NONE)
            .run(|| async {
                runs.fetch_add(1, Ordering::SeqCst);
                1u32
            })
            .await;
        match res {
            Err(e @ Error::Decode { .. }) => {
                assert_eq!(e.key(), Some(&k));
                assert!(
                    e.to_string().contains(k.as_str()),
                    "the message names the key: {e}"
                );
            }
            other => panic!("{id}: expected Error::Decode, got {other:?}"),
        }
        assert!(
            matches!(store.get(&k).await, Err(StoreError::Corrupt { .. })),
            "{id}: get"
        );
        assert!(
            store.delete(&k).await.unwrap(),
            "{id}: delete clears a foreign value"
        );
    }

    // A value of another Redis type.
    let k = key(&scope, "a-hash");
    let () = ::redis::cmd("HSET")
        .arg(store.record_key(&k))
        .arg("field")
        .arg("value")
        .query_async(&mut admin)
        .await
        .unwrap();
    let res = idem
        .call(k.clone(), Fingerprint::NONE)
        .run(|| async { 1u32 })
        .await;
    assert!(
        matches!(&res, Err(Error::Decode { key, .. }) if *key == k),
        "{res:?}"
    );
    let token = idem_core::Token::from_u64(1);
    assert!(matches!(
        store
            .complete(&k, token, idem_core::Bytes::new(), Duration::from_secs(1))
            .await,
        Err(StoreError::Corrupt { .. })
    ));
    assert!(store.delete(&k).await.unwrap());
    assert_eq!(
        runs.load(Ordering::SeqCst),
        0,
        "a body ran over a foreign value"
    );
}

#[tokio::test]
async fn special_keys_stay_on_their_own_redis_keys() {
    let Some(url) = backend_url(URL_VAR) else {
        return;
    };
    let store = RedisStore::open(&url).await.unwrap();
    let mut admin = admin(&url).await;
    let scope = unique_scope("redis-special");
    let ids = [
        "a b",
        "*",
        "a*",
        "?",
        "[a]",
        "{a}",
        "{",
        "}",
        "}{",
        "%7Ba%7D",
        "%",
        "a:b",
        "a\nb",
        "日本語",
    ];
    let long = "k".repeat(idem_core::MAX_ID_LEN);
    let mut redis_keys = std::collections::HashSet::new();
    for id in ids.iter().copied().chain([long.as_str()]) {
        let k = key(&scope, id);
        let rk = store.record_key(&k);
        assert!(rk.starts_with("idem:"), "{rk:?}");
        assert!(
            !rk.contains('{') && !rk.contains('}'),
            "an id formed a hash tag: {rk:?}"
        );
        assert!(redis_keys.insert(rk.clone()), "two ids share {rk:?}");
        complete_new(&store, &k, idem_core::Bytes::from(id.to_string())).await;
        let exists: bool = ::redis::cmd("EXISTS")
            .arg(&rk)
            .query_async(&mut admin)
            .await
            .unwrap();
        assert!(exists, "{id:?} is stored under {rk:?}");
    }
    // Glob characters are never patterns: each id reads back only its own record.
    for id in ids.iter().copied().chain([long.as_str()]) {
        match store.get(&key(&scope, id)).await.unwrap() {
            Some(Record::Completed { payload, .. }) => assert_eq!(&payload[..], id.as_bytes()),
            other => panic!("{id:?}: {other:?}"),
        }
    }
}

#[tokio::test]
async fn prefixes_keep_stores_apart() {
    let Some(url) = backend_url(URL_VAR) else {
        return;
    };
    let a = RedisStore::builder()
        .prefix("idem-test-a:")
        .open(&url)
        .await
        .unwrap();
    let b = RedisStore::builder()
        .prefix("idem-test-b:")
        .open(&url)
        .await
        .unwrap();
    assert_eq!(a.prefix(), "idem-test-a:");
    let k = key(&unique_scope("redis-prefix"), "k");
    assert!(matches!(claim_new(&a, &k).await, Claim::Acquired { .. }));
    assert!(matches!(claim_new(&b, &k).await, Claim::Acquired { .. }));
    assert!(a.record_key(&k).starts_with("idem-test-a:"));
}
