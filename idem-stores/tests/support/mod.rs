//! What the Postgres and Redis outage tests share: a TCP proxy that can black-hole or cut
//! the store's connections, a store wrapper that records how long each step took before
//! it answered or the engine gave up on it, and the outage scenarios, written once and run
//! against each backend. The Redis test files' server fixtures are `redis_server`.
// Each test crate that includes this module uses a part of it.
#![allow(dead_code)]

pub mod proxy;
#[cfg(feature = "redis")]
pub mod redis_server;
#[cfg(all(feature = "postgres", feature = "sqlite", feature = "mysql"))]
pub mod tx;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idem_core::{
    Bytes, Claim, Error, Fingerprint, Idem, Key, Record, Store, StoreError, StoreWrapper, Token,
};
pub use proxy::TcpProxy;

/// The step timeout of the outage tests: short, so that they run fast.
pub const STEP: Duration = Duration::from_millis(400);
/// Slack for a loaded machine (two cores, every test crate at once) on top of a bound. Far
/// below what an unbounded step costs: forever on a black-holed Postgres connection, the
/// 3 s command timeout on Redis (400 ms + 2 s stays below it).
pub const MARGIN: Duration = Duration::from_secs(2);

/// A key taken directly, as another caller takes it: no fingerprint, a fresh token.
pub trait ClaimFresh: Store {
    fn claim_fresh<'a>(
        &'a self,
        key: &'a Key,
        lease: Duration,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<Claim, StoreError>> + Send + 'a>>
    {
        Box::pin(async move {
            self.claim(key, &Fingerprint::NONE, Token::random(), lease)
                .await
        })
    }
}
impl<S: Store + ?Sized> ClaimFresh for S {}

/// How one step ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Answered,
    Failed,
    /// The engine dropped it: its timeout ran out first.
    Abandoned,
}

/// One store step as the engine saw it.
#[derive(Debug, Clone)]
pub struct Step {
    pub name: &'static str,
    pub took: Duration,
    pub outcome: Outcome,
}

/// A store that logs every step's duration and outcome.
#[derive(Debug, Clone)]
pub struct Recorded {
    inner: Arc<dyn Store>,
    log: Arc<Mutex<Vec<Step>>>,
}

/// Logs its step when dropped: after the answer, or when the engine abandons the step.
struct Entry<'a> {
    log: &'a Mutex<Vec<Step>>,
    name: &'static str,
    started: Instant,
    outcome: Outcome,
}

impl Drop for Entry<'_> {
    fn drop(&mut self) {
        self.log.lock().unwrap().push(Step {
            name: self.name,
            took: self.started.elapsed(),
            outcome: self.outcome,
        });
    }
}

impl Recorded {
    pub fn new(inner: Arc<dyn Store>) -> Recorded {
        Recorded {
            inner,
            log: Arc::default(),
        }
    }

    /// The steps named `name` so far.
    pub fn steps(&self, name: &str) -> Vec<Step> {
        let log = self.log.lock().unwrap();
        log.iter().filter(|s| s.name == name).cloned().collect()
    }

    async fn step<T>(
        &self,
        name: &'static str,
        call: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let mut entry = Entry {
            log: &self.log,
            name,
            started: Instant::now(),
            outcome: Outcome::Abandoned,
        };
        let res = call.await;
        entry.outcome = if res.is_ok() {
            Outcome::Answered
        } else {
            Outcome::Failed
        };
        res
    }
}

#[idem_core::async_trait]
impl StoreWrapper for Recorded {
    type Inner = dyn Store;
    fn inner(&self) -> &dyn Store {
        &*self.inner
    }
    async fn claim(
        &self,
        key: &Key,
        fp: &Fingerprint,
        token: Token,
        lease: Duration,
    ) -> Result<Claim, StoreError> {
        self.step("claim", self.inner.claim(key, fp, token, lease))
            .await
    }
    async fn complete(
        &self,
        key: &Key,
        token: Token,
        payload: Bytes,
        ttl: Duration,
    ) -> Result<(), StoreError> {
        self.step("complete", self.inner.complete(key, token, payload, ttl))
            .await
    }
    async fn release(&self, key: &Key, token: Token) -> Result<(), StoreError> {
        self.step("release", self.inner.release(key, token)).await
    }
    async fn extend(&self, key: &Key, token: Token, lease: Duration) -> Result<(), StoreError> {
        self.step("extend", self.inner.extend(key, token, lease))
            .await
    }
    async fn get(&self, key: &Key) -> Result<Option<Record>, StoreError> {
        self.step("get", self.inner.get(key)).await
    }
    async fn delete(&self, key: &Key) -> Result<bool, StoreError> {
        self.step("delete", self.inner.delete(key)).await
    }
}

/// An engine with the outage tests' step timeout on `store`.
pub fn engine(store: impl Store) -> Idem {
    Idem::builder()
        .store(store)
        .store_timeout(STEP)
        .build()
        .unwrap()
}

/// Elapsed below `bound` plus the margin; printed, since these are the numbers to watch.
pub fn assert_within(what: &str, took: Duration, bound: Duration) {
    eprintln!("{what}: answered in {took:?} (bound {bound:?} + margin {MARGIN:?})");
    assert!(
        took < bound + MARGIN,
        "{what}: took {took:?}, past the bound {bound:?} + {MARGIN:?}"
    );
}

/// A temporary store failure of `backend`, the way an outage reaches a caller.
pub fn assert_outage(err: &Error, backend: &str, what: &str) {
    match err {
        Error::Store { source, .. } => {
            assert!(
                source.is_temporary(),
                "{what}: an outage is temporary: {source:?}"
            );
            if let StoreError::Timeout { backend: b, .. } = source {
                assert_eq!(*b, backend, "{what}: {source}");
            }
        }
        other => panic!("{what}: expected Error::Store, got {other:?}"),
    }
}

/// The body's own failure, for `run_fallible`.
#[derive(Debug)]
pub enum BodyError {
    Failed,
    Idem(Error),
}

impl From<Error> for BodyError {
    fn from(e: Error) -> Self {
        BodyError::Idem(e)
    }
}

// ---- the scenarios ----------------------------------------------------------------------

/// Black-holed before the call: the claim answers within the step timeout, the body does
/// not run.
pub async fn claim_when_black_holed(store: Arc<dyn Store>, proxy: &TcpProxy, key: Key) {
    let backend = store.backend();
    let idem = engine(store);
    idem.call(key.clone(), Fingerprint::NONE)
        .run(|| async { 0u32 })
        .await
        .expect("healthy before the black hole");
    let runs = AtomicU32::new(0);
    proxy.black_hole();
    let started = Instant::now();
    let err = idem
        .call(
            Key::new(key.scope(), format!("{}-2", key.id())).unwrap(),
            Fingerprint::NONE,
        )
        .run(|| async { runs.fetch_add(1, Ordering::SeqCst) })
        .await
        .unwrap_err();
    assert_within(&format!("{backend} claim"), started.elapsed(), STEP);
    assert_outage(&err, backend, "claim");
    eprintln!("{backend} claim: {}", error_chain(&err));
    assert_eq!(
        runs.load(Ordering::SeqCst),
        0,
        "the body ran without a claim"
    );
}

/// Black-holed by a body that then fails: the release answers within the step timeout and
/// the caller gets the body's error.
pub async fn release_when_black_holed(store: Arc<dyn Store>, proxy: &TcpProxy, key: Key) {
    let backend = store.backend();
    let recorded = Recorded::new(store);
    let idem = engine(recorded.clone());
    let mut body_ended = None;
    let out: Result<u32, BodyError> = idem
        .call(key, Fingerprint::NONE)
        .run_fallible(|| async {
            proxy.black_hole();
            body_ended = Some(Instant::now());
            Err(BodyError::Failed)
        })
        .await;
    let took = body_ended.expect("the body ran").elapsed();
    assert!(matches!(out, Err(BodyError::Failed)), "{out:?}");
    assert_within(&format!("{backend} release"), took, STEP);
    let releases = recorded.steps("release");
    assert_eq!(releases.len(), 1, "{releases:?}");
    assert_ne!(releases[0].outcome, Outcome::Answered, "{releases:?}");
}

/// Black-holed while the body runs: every extend of the heartbeat answers (or is given up)
/// within the step timeout, beats go on, and the complete is bounded by the lease.
pub async fn extend_and_complete_when_black_holed(
    store: Arc<dyn Store>,
    proxy: &TcpProxy,
    key: Key,
) {
    let backend = store.backend();
    let recorded = Recorded::new(store);
    let idem = engine(recorded.clone());
    // Beats at 2 s and 4 s, the body ends at 5 s: a second of slack on each side for a
    // loaded machine, where a 1.2 s lease left 200 ms between the second beat and the end.
    let lease = Duration::from_secs(6);
    let started = Instant::now();
    let out = idem
        .call(key, Fingerprint::NONE)
        .lease(lease)
        .run(|| async {
            proxy.black_hole();
            tokio::time::sleep(Duration::from_secs(5)).await;
            1u32
        })
        .await;
    let took = started.elapsed();
    let err = out.unwrap_err();
    assert_outage(&err, backend, "complete after a black-holed body");
    assert_within(&format!("{backend} call whose lease ran out"), took, lease);
    let extends = recorded.steps("extend");
    assert!(
        extends.len() >= 2,
        "the heartbeat beat on past a hung extend: {extends:?}"
    );
    for step in extends.iter().chain(&recorded.steps("complete")) {
        assert_within(&format!("{backend} {}", step.name), step.took, STEP);
        assert_ne!(step.outcome, Outcome::Answered, "{step:?}");
    }
}

/// The body ran, then the connection black-holed: the caller gets `Error::Store` within
/// the lease, and while that lease lives a retry (on a healthy connection) is told the key
/// is in progress, never answered by a second run. Once the lease has ended, the record is
/// not completed, and a retry claims the key and runs the body again: what the guide's
/// failures chapter says.
pub async fn complete_black_holed_after_the_body(
    through_proxy: Arc<dyn Store>,
    direct: Arc<dyn Store>,
    proxy: &TcpProxy,
    key: Key,
) {
    let backend = through_proxy.backend();
    let lease = Duration::from_secs(4);
    let idem = engine(through_proxy);
    let other = engine(direct);
    let runs = Arc::new(AtomicU32::new(0));
    // The first call's claim is made after this instant, so its lease ends after
    // `lease_end`: retries stop a second before it, so none races the lease's end.
    let lease_end = Instant::now() + lease;
    let first = {
        let (idem, key, runs) = (idem.clone(), key.clone(), runs.clone());
        let black_hole = proxy.black_hole_switch();
        tokio::spawn(async move {
            let started = Instant::now();
            let out = idem
                .call(key, Fingerprint::NONE)
                .lease(lease)
                .run(|| async {
                    runs.fetch_add(1, Ordering::SeqCst);
                    black_hole();
                    7u32
                })
                .await;
            (out, started.elapsed())
        })
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    while runs.load(Ordering::SeqCst) == 0 {
        assert!(
            Instant::now() < deadline,
            "the first call did not run its body"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // A retry on the other engine: its body would answer 8.
    let retry = || {
        other.call(key.clone(), Fingerprint::NONE).run(|| async {
            runs.fetch_add(1, Ordering::SeqCst);
            8u32
        })
    };
    // Retries while the first call's lease lives: in progress, never a second run.
    let mut in_progress = 0;
    while !first.is_finished() && Instant::now() + Duration::from_secs(1) < lease_end {
        match retry().await {
            Err(Error::InProgress { .. }) => in_progress += 1,
            other => panic!("a retry during the first lease got {other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (out, took) = first.await.unwrap();
    let err = out.unwrap_err();
    assert_outage(&err, backend, "complete black-holed after the body");
    eprintln!("{backend} complete: {}", error_chain(&err));
    assert_within(&format!("{backend} unstored result"), took, lease);
    assert!(in_progress >= 5, "{in_progress} retries during the lease");
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "a second run within the lease"
    );
    // After the lease: the record was never completed, so the key is free again.
    let deadline = Instant::now() + Duration::from_secs(10);
    let v = loop {
        match retry().await {
            Ok(v) => break v,
            Err(Error::InProgress { .. }) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            other => panic!("a retry after the lease got {other:?}"),
        }
    };
    assert_eq!(v, 8, "the retry after the lease ran the body");
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// Cut: every connection closes. Calls meanwhile fail fast and temporarily or succeed;
/// the store reconnects, and each key's body runs at most once.
pub async fn cut_connections_recover(store: Arc<dyn Store>, proxy: &TcpProxy, scope: &str) {
    let backend = store.backend();
    let idem = engine(store);
    idem.call(Key::new(scope, "warm").unwrap(), Fingerprint::NONE)
        .run(|| async { 0u32 })
        .await
        .unwrap();
    let before = proxy.accepted();
    proxy.cut();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut failures = 0;
    for i in 0.. {
        let runs = AtomicU32::new(0);
        let started = Instant::now();
        let res = idem
            .call(Key::new(scope, format!("k{i}")).unwrap(), Fingerprint::NONE)
            .run(|| async { runs.fetch_add(1, Ordering::SeqCst) })
            .await;
        match res {
            Ok(_) => break,
            Err(e) => {
                assert_within(
                    &format!("{backend} call after a cut"),
                    started.elapsed(),
                    STEP,
                );
                assert_outage(&e, backend, "a call after a cut");
                assert_eq!(runs.load(Ordering::SeqCst), 0);
                failures += 1;
                assert!(Instant::now() < deadline, "no recovery within 10s");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    eprintln!("{backend}: {failures} failed calls after the cut");
    assert!(proxy.accepted() > before, "the store reconnected");
}

/// The error and its sources, one line.
pub fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut parts = vec![err.to_string()];
    let mut cur = err.source();
    while let Some(e) = cur {
        parts.push(e.to_string());
        cur = e.source();
    }
    parts.join(": ")
}
