//! Network faults between idem and Redis or Postgres, at a chosen step. A TCP proxy of the
//! test's own (`idem-stores/tests/support/proxy.rs`) sits in front of the server; a store
//! wrapper switches the fault on as the engine starts the chosen step (claim, extend,
//! complete, release) or the body switches it on (mid-body). Faults: a reply delayed below
//! the step timeout, a reply delayed past it, every connection cut, a black hole, the
//! reply dropped after the server acted.
//!
//! Whatever the fault, the call checks that:
//! - the body runs only after a claim that answered `Acquired`;
//! - every store step answers or is given up within the step timeout, and the call ends
//!   within its bound, with the fault's one expected outcome;
//! - once the network is healed, later callers (on a direct connection) all get one value,
//!   the first one stored, and the first caller got no other value.
//!
//! ```text
//! IDEM_REQUIRE_BACKENDS=1 IDEM_TEST_POSTGRES_URL=... IDEM_TEST_REDIS_URL=... \
//!     cargo test -p idem-integration --all-features --test reliability_faults
//! ```
#![cfg(all(feature = "redis", feature = "postgres", feature = "mysql"))]

// The store tests' support (TCP proxy, recording store, private Redis servers), shared with
// `idem-stores`' own tests.
#[path = "../../idem-stores/tests/support/mod.rs"]
mod support;

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use idem_core::testing::{backend_url, unique_scope};
use idem_core::{Claim, Error, Fingerprint, Idem, Key, Record, Store, StoreError, Token};
use support::{BodyError, Recorded, TcpProxy, MARGIN, STEP};

/// The first caller's lease: its complete is retried within it.
const LEASE: Duration = Duration::from_millis(1200);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum At {
    Claim,
    Extend,
    Complete,
    Release,
    MidBody,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// Replies late, well within the step timeout: each reply an eighth of it, since a
    /// Postgres claim on a new connection waits for up to four (its read and its claim
    /// statement, each prepared, then run).
    DelayShort,
    /// Replies after the step timeout.
    DelayLong,
    Cut,
    BlackHole,
    DropReply,
}

const STEPS: [At; 5] = [
    At::Claim,
    At::Extend,
    At::Complete,
    At::Release,
    At::MidBody,
];
const FAULTS: [Fault; 5] = [
    Fault::DelayShort,
    Fault::DelayLong,
    Fault::Cut,
    Fault::BlackHole,
    Fault::DropReply,
];

fn switch_on(proxy: &Arc<TcpProxy>, fault: Fault) {
    match fault {
        Fault::DelayShort => proxy.delay_replies(STEP / 8),
        Fault::DelayLong => proxy.delay_replies(STEP * 3),
        Fault::Cut => proxy.cut(),
        Fault::BlackHole => proxy.black_hole(),
        Fault::DropReply => proxy.drop_replies(),
    }
}

/// Switches the fault on when the engine starts the chosen step, and notes whether a
/// claim answered `Acquired` (the only licence for the body to run).
#[derive(Debug)]
struct Trigger {
    inner: Arc<dyn Store>,
    at: At,
    fault: Fault,
    proxy: Arc<TcpProxy>,
    fired: AtomicBool,
    acquired: Arc<AtomicBool>,
}

impl Trigger {
    async fn fire_at(&self, step: At) {
        if step == self.at && !self.fired.swap(true, Ordering::SeqCst) {
            switch_on(&self.proxy, self.fault);
            if self.fault == Fault::Cut {
                // Lets the close reach the client before the step is sent, so that the
                // step meets a closed connection, not a race with one.
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
}

#[async_trait]
impl Store for Trigger {
    async fn claim(
        &self,
        key: &Key,
        fp: &Fingerprint,
        token: Token,
        lease: Duration,
    ) -> Result<Claim, StoreError> {
        self.fire_at(At::Claim).await;
        let out = self.inner.claim(key, fp, token, lease).await;
        if matches!(out, Ok(Claim::Acquired { .. })) {
            self.acquired.store(true, Ordering::SeqCst);
        }
        out
    }
    async fn complete(
        &self,
        key: &Key,
        token: Token,
        payload: Bytes,
        ttl: Duration,
    ) -> Result<(), StoreError> {
        self.fire_at(At::Complete).await;
        self.inner.complete(key, token, payload, ttl).await
    }
    async fn release(&self, key: &Key, token: Token) -> Result<(), StoreError> {
        self.fire_at(At::Release).await;
        self.inner.release(key, token).await
    }
    async fn extend(&self, key: &Key, token: Token, lease: Duration) -> Result<(), StoreError> {
        self.fire_at(At::Extend).await;
        self.inner.extend(key, token, lease).await
    }
    async fn get(&self, key: &Key) -> Result<Option<Record>, StoreError> {
        self.inner.get(key).await
    }
    async fn delete(&self, key: &Key) -> Result<bool, StoreError> {
        self.inner.delete(key).await
    }
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }
}

/// What the first caller is expected to get, by fault and step.
#[derive(Debug, PartialEq, Eq)]
enum Expect {
    /// Its own body's value.
    Value,
    /// `Error::Store`, the body not run (the claim failed).
    StoreNoRun,
    /// `Error::Store` after the body ran (its result could not be stored).
    StoreAfterRun,
    /// The body's own error (the release scenario's body fails).
    BodyFailed,
    /// `Value` or `StoreNoRun`, whichever the client library's pool makes of a connection
    /// closed just before a step: the one cell whose outcome is not ours to decide.
    ValueOrStoreNoRun,
}

fn expected(backend: &str, at: At, fault: Fault) -> Expect {
    use Expect::*;
    match (at, fault) {
        (At::Release, _) => BodyFailed,
        // A claim on a new connection takes more round trips than the fault's budget
        // allows for (the handshake and authentication, then the statements): 362 ms of
        // the 400 ms step timeout on MySQL, about 200 ms on Postgres, with five scenarios
        // on two cores; under load it may time out. Both keep the promise (no body without
        // a claim; checked below).
        (At::Claim, Fault::DelayShort) if backend == "mysql" || backend == "postgres" => {
            ValueOrStoreNoRun
        }
        (_, Fault::DelayShort) => Value,
        // The Redis connection learns of the close when it writes the claim. The Postgres
        // pool usually drops a closed connection on acquire and opens a new one, but not
        // always in time (1 run in 3 to 5 under a loaded CI machine gave StoreNoRun): sqlx
        // decides, and both keep the promise (no body without a claim; checked below).
        (At::Claim, Fault::Cut) if backend == "redis" => StoreNoRun,
        (At::Claim, Fault::Cut) => ValueOrStoreNoRun,
        // The complete's retry runs on a new connection; the extends of the heartbeat
        // are retried at its next beat.
        (_, Fault::Cut) => Value,
        (At::Claim, _) => StoreNoRun,
        // The fault stays on until the call ends: the complete cannot get through.
        (At::Extend | At::Complete | At::MidBody, _) => StoreAfterRun,
    }
}

struct Proxied {
    proxy: Arc<TcpProxy>,
    through: Arc<dyn Store>,
    direct: Arc<dyn Store>,
}

/// One scenario; panics on the first broken promise. Returns a line for the report.
async fn scenario(
    backend: &str,
    make: &(dyn Fn() -> futures_util::future::BoxFuture<'static, Proxied> + Sync),
    at: At,
    fault: Fault,
) {
    let Proxied {
        proxy,
        through,
        direct,
    } = make().await;
    let what = format!("{backend} {fault:?} at {at:?}");
    let key = Key::new(unique_scope("reliability-faults"), "k").unwrap();
    let acquired = Arc::new(AtomicBool::new(false));
    let recorded = Recorded::new(Arc::new(Trigger {
        inner: through,
        at,
        fault,
        proxy: proxy.clone(),
        fired: AtomicBool::new(false),
        acquired: acquired.clone(),
    }));
    let first = support::engine(recorded.clone());
    let ran_first = AtomicU32::new(0);
    let started = Instant::now();
    let out: Result<String, BodyError> = first
        .call(key.clone(), Fingerprint::NONE)
        .lease(LEASE)
        .run_fallible(|| async {
            assert!(
                acquired.load(Ordering::SeqCst),
                "{what}: the body ran without a successful claim"
            );
            ran_first.fetch_add(1, Ordering::SeqCst);
            match at {
                At::MidBody => {
                    switch_on(&proxy, fault);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                // Past the first beat of the heartbeat (every lease / 3).
                At::Extend => tokio::time::sleep(LEASE / 2).await,
                _ => {}
            }
            if at == At::Release {
                Err(BodyError::Failed)
            } else {
                Ok("first".to_string())
            }
        })
        .await;
    let took = started.elapsed();
    // Every step answered or was given up within the step timeout.
    for name in ["claim", "extend", "complete", "release"] {
        for step in recorded.steps(name) {
            support::assert_within(&format!("{what}: {name}"), step.took, STEP);
        }
    }
    // The call: its claim, the body, a complete retried within the lease.
    let bound = STEP + LEASE / 2 + LEASE + STEP;
    assert!(took < bound + MARGIN, "{what}: the call took {took:?}");
    let ran = ran_first.load(Ordering::SeqCst);
    let expect = expected(backend, at, fault);
    match (&expect, &out) {
        (Expect::Value | Expect::ValueOrStoreNoRun, Ok(v)) => assert_eq!(v, "first", "{what}"),
        (Expect::ValueOrStoreNoRun, Err(BodyError::Idem(e))) => {
            support::assert_outage(e, backend, &what);
            assert_eq!(ran, 0, "{what}: the body ran");
        }
        (Expect::StoreNoRun, Err(BodyError::Idem(e))) => {
            support::assert_outage(e, backend, &what);
            assert_eq!(ran, 0, "{what}: the body ran");
        }
        (Expect::StoreAfterRun, Err(BodyError::Idem(e))) => {
            support::assert_outage(e, backend, &what);
            assert_eq!(ran, 1, "{what}: the body's runs");
        }
        (Expect::BodyFailed, Err(BodyError::Failed)) => assert_eq!(ran, 1, "{what}"),
        (expect, got) => panic!("{what}: expected {expect:?}, got {got:?}"),
    }

    // Heal, drop the connections that lost bytes, and ask again on a healthy connection
    // until the first caller's claim is done with (stored, released, or its lease ended).
    proxy.heal();
    proxy.cut();
    let later = Idem::builder().shared_store(direct).build().unwrap();
    let ran_later = AtomicU32::new(0);
    let deadline = Instant::now() + LEASE + Duration::from_secs(5);
    let second = loop {
        let got: Result<String, Error> = later
            .call(key.clone(), Fingerprint::NONE)
            .run(|| async {
                ran_later.fetch_add(1, Ordering::SeqCst);
                "second".to_string()
            })
            .await;
        match got {
            Err(Error::InProgress { .. }) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            other => break other.unwrap_or_else(|e| panic!("{what}: a later caller got {e:?}")),
        }
    };
    let replay: String = later
        .call(key.clone(), Fingerprint::NONE)
        .run(|| async {
            ran_later.fetch_add(1, Ordering::SeqCst);
            "third".to_string()
        })
        .await
        .unwrap();
    assert_eq!(replay, second, "{what}: two later callers, two values");
    // The first value stored is the one everybody gets.
    let stored_first = matches!(expect, Expect::Value)
        || (matches!(expect, Expect::ValueOrStoreNoRun) && out.is_ok())
        || (matches!(expect, Expect::StoreAfterRun) && second == "first");
    if stored_first && !matches!(expect, Expect::StoreAfterRun) {
        assert_eq!(second, "first", "{what}: a later caller got another value");
    }
    assert_eq!(
        ran_later.load(Ordering::SeqCst),
        u32::from(!stored_first),
        "{what}: later runs (later callers got {second:?})"
    );
    eprintln!(
        "reliability faults {what}: first caller {} in {took:.1?}, later callers {second:?}",
        match &out {
            Ok(_) => "got its value".to_string(),
            Err(BodyError::Failed) => "got its body's error".to_string(),
            Err(BodyError::Idem(e)) => format!("got {}", support::error_chain(e)),
        }
    );
}

/// Every step × fault, the faults of one step concurrently (each on its own proxy).
async fn all_scenarios(
    backend: &str,
    make: impl Fn() -> futures_util::future::BoxFuture<'static, Proxied> + Sync,
) {
    for at in STEPS {
        let runs = FAULTS.map(|fault| scenario(backend, &make, at, fault));
        futures_util::future::join_all(runs).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reliability_faults_redis() {
    use idem_stores::RedisStore;
    let Some(url) = backend_url("IDEM_TEST_REDIS_URL") else {
        return;
    };
    let upstream =
        tokio::net::lookup_host(url.trim_start_matches("redis://").trim_end_matches('/'))
            .await
            .unwrap()
            .next()
            .unwrap();
    all_scenarios("redis", move || {
        let url = url.clone();
        Box::pin(async move {
            let proxy = Arc::new(TcpProxy::start(upstream).await);
            let through = RedisStore::open(&format!("redis://127.0.0.1:{}", proxy.port()))
                .await
                .unwrap();
            Proxied {
                proxy,
                through: Arc::new(through),
                direct: Arc::new(RedisStore::open(&url).await.unwrap()),
            }
        })
    })
    .await;
}

/// Every scenario on a SQL store of dialect `D` at `url`: the direct store on the server
/// itself (migrated), and each scenario's store through a proxy of its own, connected with
/// `through_proxy(port)` (the same options on the proxy's port, TLS off).
async fn sql_scenarios<D: idem_stores::Transactional>(
    backend: &'static str,
    url: String,
    upstream: std::net::SocketAddr,
    through_proxy: impl Fn(u16) -> <D::Connection as sqlx::Connection>::Options + Send + Sync + 'static,
) {
    let table = "idem_reliability_faults";
    let direct = idem_stores::SqlStore::<D>::connect(&url)
        .await
        .unwrap()
        .with_table(table)
        .unwrap();
    direct.migrate().await.unwrap();
    let direct: Arc<dyn Store> = Arc::new(direct);
    let through_proxy = Arc::new(through_proxy);
    all_scenarios(backend, move || {
        let (through_proxy, direct) = (through_proxy.clone(), direct.clone());
        Box::pin(async move {
            let proxy = Arc::new(TcpProxy::start(upstream).await);
            let through = idem_stores::SqlStore::<D>::builder()
                .connect_with(through_proxy(proxy.port()))
                .await
                .unwrap()
                .with_table(table)
                .unwrap();
            Proxied {
                proxy,
                through: Arc::new(through),
                direct,
            }
        })
    })
    .await;
}

/// The server's address, to proxy.
async fn upstream(host: &str, port: u16) -> std::net::SocketAddr {
    tokio::net::lookup_host((host, port))
        .await
        .unwrap()
        .next()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reliability_faults_mysql() {
    use sqlx::mysql::{MySqlConnectOptions, MySqlSslMode};
    use std::str::FromStr;
    let Some(url) = backend_url("IDEM_TEST_MYSQL_URL") else {
        return;
    };
    let options = MySqlConnectOptions::from_str(&url).unwrap();
    let upstream = upstream(options.get_host(), options.get_port()).await;
    sql_scenarios::<sqlx::MySql>("mysql", url, upstream, move |port| {
        options
            .clone()
            .port(port)
            .host("127.0.0.1")
            .ssl_mode(MySqlSslMode::Disabled)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reliability_faults_postgres() {
    use sqlx::postgres::{PgConnectOptions, PgSslMode};
    use std::str::FromStr;
    let Some(url) = backend_url("IDEM_TEST_POSTGRES_URL") else {
        return;
    };
    let options = PgConnectOptions::from_str(&url).unwrap();
    let upstream = upstream(options.get_host(), options.get_port()).await;
    sql_scenarios::<sqlx::Postgres>("postgres", url, upstream, move |port| {
        options
            .clone()
            .port(port)
            .host("127.0.0.1")
            .ssl_mode(PgSslMode::Disable)
    })
    .await;
}
