//! `RedisStore` against real Redis servers.
//!
//! The conformance suite and the shared-server tests use `IDEM_TEST_REDIS_URL` (e.g.
//! `redis://127.0.0.1:6379`); every key they write is in a scope of its own. The round-trip,
//! fault, timeout and eviction tests each start a private `redis-server` on a spare
//! 127.0.0.1 port, so that they can count its commands, stop it or freeze it without
//! disturbing anyone; it is killed when the test ends.
//!
//! ```text
//! IDEM_TEST_REDIS_URL=redis://127.0.0.1:6379 cargo test -p idem-stores --features redis --test redis
//! ```
#![cfg(feature = "redis")]

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idem_core::testing::{backend_url, unique_scope};
use idem_core::{
    Claim, Error, Fingerprint, Idem, InProgress, Key, Record, Store, StoreError, Token,
};
use idem_stores::redis::RedisStore;

const URL_VAR: &str = "IDEM_TEST_REDIS_URL";

async fn shared_store() -> Option<RedisStore> {
    let url = backend_url(URL_VAR)?;
    Some(
        RedisStore::open(&url)
            .await
            .expect("connect to IDEM_TEST_REDIS_URL"),
    )
}

idem_core::conformance_tests!(redis, shared_store());

/// A plain connection for looking at and poking the server behind the store's back.
async fn admin(url: &str) -> ::redis::aio::MultiplexedConnection {
    ::redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .expect("admin connection")
}

fn key(scope: &str, id: &str) -> Key {
    Key::new(scope, id).unwrap()
}

// --- a private redis-server -----------------------------------------------------------

/// A `redis-server` this test owns: 127.0.0.1 on a spare port, nothing on disk, killed on
/// drop.
struct PrivateRedis {
    child: Option<Child>,
    port: u16,
    dir: std::path::PathBuf,
    extra: Vec<String>,
}

impl PrivateRedis {
    /// Starts one, or answers `None` (skipping) when the Redis tests are not configured.
    fn start(extra: &[&str]) -> Option<PrivateRedis> {
        backend_url(URL_VAR)?;
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let dir =
            std::env::temp_dir().join(format!("idem-redis-test-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut server = PrivateRedis {
            child: None,
            port,
            dir,
            extra: extra.iter().map(|s| s.to_string()).collect(),
        };
        server.spawn();
        Some(server)
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    fn spawn(&mut self) {
        assert!(self.child.is_none(), "already running");
        let child = Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port", &self.port.to_string()])
            .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"])
            .arg("--dir")
            .arg(&self.dir)
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server is on PATH (the Redis tests start private servers)");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.pings() {
            assert!(
                Instant::now() < deadline,
                "redis-server on port {} did not come up",
                self.port
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn pings(&self) -> bool {
        let Ok(mut s) = TcpStream::connect(("127.0.0.1", self.port)) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
        let mut buf = [0u8; 7];
        s.write_all(b"PING\r\n").is_ok() && s.read_exact(&mut buf).is_ok() && &buf == b"+PONG\r\n"
    }

    /// Kills the server (as a crash would: no goodbye to its clients).
    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Freezes or thaws the server process (SIGSTOP / SIGCONT): it keeps its connections
    /// but answers nothing.
    fn signal(&self, signal: &str) {
        let pid = self.child.as_ref().expect("running").id().to_string();
        let ok = Command::new("kill")
            .args([signal, &pid])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill {signal} {pid}");
    }
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        if self.child.is_some() {
            let _ = self.signal_quietly("-CONT");
        }
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl PrivateRedis {
    fn signal_quietly(&self, signal: &str) -> std::io::Result<()> {
        let pid = self
            .child
            .as_ref()
            .map(|c| c.id().to_string())
            .unwrap_or_default();
        Command::new("kill")
            .args([signal, &pid])
            .status()
            .map(|_| ())
    }
}

/// `INFO commandstats` as command -> calls.
async fn command_calls(conn: &mut ::redis::aio::MultiplexedConnection) -> HashMap<String, u64> {
    let info: String = ::redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .unwrap();
    info.lines()
        .filter_map(|l| l.strip_prefix("cmdstat_"))
        .filter_map(|l| {
            let (name, rest) = l.split_once(':')?;
            let calls = rest
                .split(',')
                .find_map(|f| f.strip_prefix("calls="))?
                .parse()
                .ok()?;
            Some((name.to_string(), calls))
        })
        .collect()
}

fn delta(before: &HashMap<String, u64>, after: &HashMap<String, u64>) -> HashMap<String, u64> {
    after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0)))
        .filter(|(_, v)| *v > 0)
        .collect()
}

/// Round trips the store made between two snapshots: the scripts it ran, plus any command
/// other than those the scripts run inside (GET, SET, DEL, TIME) and the INFO that took the
/// snapshot. That no client-side GET hides among the scripts' own is checked by the
/// callers: each script does exactly one GET.
fn round_trips(d: &HashMap<String, u64>) -> u64 {
    d.iter()
        .filter(|(k, _)| !matches!(k.as_str(), "get" | "set" | "del" | "time" | "info"))
        .map(|(_, v)| v)
        .sum()
}

#[tokio::test]
async fn round_trips_first_call_two_replay_one() {
    let Some(server) = PrivateRedis::start(&[]) else {
        return;
    };
    let store = RedisStore::open(&server.url()).await.unwrap();
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

    let before = command_calls(&mut admin).await;
    assert_eq!(call().await.unwrap(), "receipt");
    let first = delta(&before, &command_calls(&mut admin).await);
    assert_eq!(
        round_trips(&first),
        2,
        "a first call: claim, complete; saw {first:?}"
    );
    assert_eq!(first.get("evalsha"), Some(&2), "{first:?}");
    assert_eq!(
        first.get("get"),
        Some(&2),
        "one GET per script, none from the client: {first:?}"
    );

    for _ in 0..3 {
        let before = command_calls(&mut admin).await;
        assert_eq!(call().await.unwrap(), "receipt");
        let replay = delta(&before, &command_calls(&mut admin).await);
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
        store
            .claim(
                &k,
                &Fingerprint::NONE,
                Token::random(),
                Duration::from_secs(5)
            )
            .await
            .unwrap(),
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
    let store = RedisStore::open(&server.url()).await.unwrap();
    let mut admin = admin(&server.url()).await;
    let k = key("resent", "k");
    let token = Token::random();
    let lease = Duration::from_secs(30);
    let fp = Fingerprint::of(&1u8);
    for send in 1..=2 {
        let before = command_calls(&mut admin).await;
        match store.claim(&k, &fp, token, lease).await.unwrap() {
            Claim::Acquired {
                token: acquired,
                recovered,
            } => {
                assert_eq!(acquired, token);
                assert!(!recovered, "send {send}");
            }
            other => panic!("send {send} of the same claim: {other:?}"),
        }
        let d = delta(&before, &command_calls(&mut admin).await);
        assert_eq!(d.get("evalsha"), Some(&1), "send {send}: {d:?}");
        let writes = d.get("set").copied().unwrap_or(0);
        assert_eq!(writes, u64::from(send == 1), "send {send}: {d:?}");
    }
    assert!(matches!(
        store.get(&k).await.unwrap(),
        Some(Record::InProgress { token: t, .. }) if t == token
    ));

    let (resent, raced) = (key("resent", "concurrent"), key("resent", "raced"));
    let shared = Token::random();
    let barrier = Arc::new(tokio::sync::Barrier::new(40));
    let tasks: Vec<_> = (0..40)
        .map(|i| {
            let (store, barrier) = (store.clone(), barrier.clone());
            let (k, t) = if i % 2 == 0 {
                (resent.clone(), shared)
            } else {
                (raced.clone(), Token::random())
            };
            tokio::spawn(async move {
                barrier.wait().await;
                (i % 2, store.claim(&k, &fp, t, lease).await.unwrap())
            })
        })
        .collect();
    let mut acquired = [0, 0];
    for task in tasks {
        let (which, claim) = task.await.unwrap();
        match claim {
            Claim::Acquired { .. } => acquired[which] += 1,
            Claim::InProgress { .. } => {}
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(acquired, [20, 1], "[resends of one token, own tokens]");
}

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
    let store = RedisStore::builder()
        .connect_timeout(Duration::from_millis(500))
        .command_timeout(Duration::from_secs(1))
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
        let killed: i64 = ::redis::cmd("CLIENT")
            .arg("KILL")
            .arg("TYPE")
            .arg("normal")
            .arg("SKIPME")
            .arg("yes")
            .query_async(&mut admin)
            .await
            .unwrap();
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
    let res = store
        .claim(
            &k,
            &Fingerprint::NONE,
            Token::random(),
            Duration::from_secs(5),
        )
        .await;
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
        engines.push(
            Idem::builder()
                .store(store)
                .in_progress(InProgress::Wait)
                .wait_timeout(Duration::from_secs(20))
                .build()
                .unwrap(),
        );
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
        .claim(
            &k,
            &Fingerprint::NONE,
            Token::random(),
            Duration::from_millis(100),
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(matches!(
        forgetful
            .claim(
                &k,
                &Fingerprint::NONE,
                Token::random(),
                Duration::from_secs(5)
            )
            .await
            .unwrap(),
        Claim::Acquired {
            recovered: false,
            ..
        }
    ));
}

// --- bad input ------------------------------------------------------------------------

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
    let token = idem_core::Token(1);
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
        match store
            .claim(
                &k,
                &Fingerprint::NONE,
                Token::random(),
                Duration::from_secs(30),
            )
            .await
            .unwrap()
        {
            Claim::Acquired { token, .. } => {
                store
                    .complete(
                        &k,
                        token,
                        idem_core::Bytes::from(id.to_string()),
                        Duration::from_secs(60),
                    )
                    .await
                    .unwrap();
            }
            other => panic!("{id:?}: {other:?}"),
        }
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
    assert!(matches!(
        a.claim(
            &k,
            &Fingerprint::NONE,
            Token::random(),
            Duration::from_secs(30)
        )
        .await
        .unwrap(),
        Claim::Acquired { .. }
    ));
    assert!(matches!(
        b.claim(
            &k,
            &Fingerprint::NONE,
            Token::random(),
            Duration::from_secs(30)
        )
        .await
        .unwrap(),
        Claim::Acquired { .. }
    ));
    assert!(a.record_key(&k).starts_with("idem-test-a:"));
}

// --- constructors and operations ------------------------------------------------------

#[tokio::test]
async fn connect_by_url_and_from_a_connection_manager() {
    let Some(url) = backend_url(URL_VAR) else {
        return;
    };
    let by_url = idem_stores::connect(&url).await.unwrap();
    let k = key(&unique_scope("redis-connect"), "k");
    assert!(matches!(
        by_url
            .claim(
                &k,
                &Fingerprint::NONE,
                Token::random(),
                Duration::from_secs(30)
            )
            .await
            .unwrap(),
        Claim::Acquired { .. }
    ));

    let manager = ::redis::Client::open(url.as_str())
        .unwrap()
        .get_connection_manager()
        .await
        .unwrap();
    let mine = RedisStore::from_connection_manager(manager).await;
    assert!(matches!(
        mine.claim(
            &k,
            &Fingerprint::NONE,
            Token::random(),
            Duration::from_secs(30)
        )
        .await
        .unwrap(),
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

/// Captures the `idem` warnings of one test.
#[derive(Clone, Default)]
struct Warnings(Arc<Mutex<Vec<String>>>);

impl tracing::Subscriber for Warnings {
    fn enabled(&self, meta: &tracing::Metadata<'_>) -> bool {
        *meta.level() <= tracing::Level::WARN
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        struct Text(String);
        impl tracing::field::Visit for Text {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                self.0.push_str(&format!("{}={:?} ", field.name(), value));
            }
            fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
                self.0.push_str(&format!("{}={} ", field.name(), value));
            }
        }
        let mut text = Text(String::new());
        event.record(&mut text);
        self.0.lock().unwrap().push(text.0);
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

async fn warnings_on_connect(server: &PrivateRedis) -> Vec<String> {
    let warnings = Warnings::default();
    let guard = tracing::subscriber::set_default(warnings.clone());
    RedisStore::open(&server.url()).await.unwrap();
    drop(guard);
    let seen = warnings.0.lock().unwrap().clone();
    seen
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

// --- outages: every step bounded, through a proxy that black-holes or cuts ---------------

mod support;

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
async fn black_holed_claim_answers_within_the_step_timeout() {
    let Some((proxy, store, _)) = behind_proxy().await else {
        return;
    };
    let k = key(&unique_scope("redis-bh-claim"), "k");
    support::claim_when_black_holed(store, &proxy, k).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn black_holed_release_answers_within_the_step_timeout() {
    let Some((proxy, store, _)) = behind_proxy().await else {
        return;
    };
    let k = key(&unique_scope("redis-bh-release"), "k");
    support::release_when_black_holed(store, &proxy, k).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn black_holed_extends_and_complete_answer_within_the_step_timeout() {
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
