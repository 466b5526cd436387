//! The engine's promises, through the facade: release on failure, heartbeat, fencing,
//! wait mode, bad input, decode errors, store faults, the local cache and tracing events.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idem::{
    Bytes, Claim, DecodeError, Error, Fingerprint, Idem, InProgress, Key, MemoryStore, Origin,
    Record, Store, StoreError, StoreWrapper, Token,
};

/// A memory store that counts calls and can fail on demand.
#[derive(Debug, Default)]
struct Faulty {
    inner: MemoryStore,
    calls: AtomicU32,
    claims: AtomicU32,
    completes: AtomicU32,
    fail_claims: AtomicBool,
    fail_completes: AtomicU32,
    /// Completes that are stored, but whose answer is lost on the way back.
    lose_complete_answers: AtomicU32,
    /// After the next lost answer, another caller takes the key over and stores the very
    /// same bytes under its own token.
    take_over_after_lost_answer: AtomicBool,
    /// Milliseconds each complete and release takes before reaching the store.
    complete_delay_ms: AtomicU32,
    release_delay_ms: AtomicU32,
    extends: AtomicU32,
}

async fn delay(ms: &AtomicU32) {
    let ms = ms.load(Ordering::SeqCst);
    if ms > 0 {
        tokio::time::sleep(Duration::from_millis(ms.into())).await;
    }
}

fn unavailable() -> StoreError {
    StoreError::Unavailable {
        backend: "faulty",
        source: Box::new(std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            "connection refused (injected)",
        )),
    }
}

#[idem::async_trait]
impl StoreWrapper for Faulty {
    type Inner = MemoryStore;
    fn inner(&self) -> &MemoryStore {
        &self.inner
    }
    async fn claim(
        &self,
        key: &Key,
        fp: &Fingerprint,
        token: Token,
        lease: Duration,
    ) -> Result<Claim, StoreError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.claims.fetch_add(1, Ordering::SeqCst);
        if self.fail_claims.load(Ordering::SeqCst) {
            return Err(unavailable());
        }
        self.inner.claim(key, fp, token, lease).await
    }
    async fn complete(
        &self,
        key: &Key,
        token: Token,
        payload: Bytes,
        ttl: Duration,
    ) -> Result<(), StoreError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.completes.fetch_add(1, Ordering::SeqCst);
        delay(&self.complete_delay_ms).await;
        if self
            .fail_completes
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            return Err(unavailable());
        }
        self.inner
            .complete(key, token, payload.clone(), ttl)
            .await?;
        if self
            .lose_complete_answers
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            if self
                .take_over_after_lost_answer
                .swap(false, Ordering::SeqCst)
            {
                self.inner.delete(key).await?;
                let other = Token::random();
                self.inner
                    .claim(key, &Fingerprint::NONE, other, Duration::from_secs(5))
                    .await?;
                self.inner.complete(key, other, payload, ttl).await?;
            }
            return Err(unavailable());
        }
        Ok(())
    }
    async fn release(&self, key: &Key, token: Token) -> Result<(), StoreError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        delay(&self.release_delay_ms).await;
        self.inner.release(key, token).await
    }
    async fn extend(&self, key: &Key, token: Token, lease: Duration) -> Result<(), StoreError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.extends.fetch_add(1, Ordering::SeqCst);
        self.inner.extend(key, token, lease).await
    }
}

fn setup() -> (Arc<Faulty>, Idem) {
    let store = Arc::new(Faulty::default());
    let idem = Idem::builder().store(store.clone()).build().unwrap();
    (store, idem)
}

fn key(id: &str) -> Key {
    Key::new("engine-tests", id).unwrap()
}

#[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
enum PayError {
    Declined,
    Timeout,
    Idem(String),
}

impl From<Error> for PayError {
    fn from(e: Error) -> Self {
        PayError::Idem(e.to_string())
    }
}

async fn wait_until_released(store: &dyn Store, k: &Key) {
    for _ in 0..200 {
        if store.get(k).await.unwrap().is_none() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("the claim on {k} was never released");
}

#[tokio::test]
async fn err_releases_the_claim_and_the_next_call_runs_again() {
    let (_, idem) = setup();
    let runs = AtomicU32::new(0);
    for expected in [Err(PayError::Timeout), Err(PayError::Timeout), Ok(7u32)] {
        let out = idem
            .call(key("retry"), Fingerprint::NONE)
            .run_fallible(|| async {
                let n = runs.fetch_add(1, Ordering::SeqCst);
                if n < 2 {
                    Err(PayError::Timeout)
                } else {
                    Ok(7u32)
                }
            })
            .await;
        assert_eq!(out, expected);
    }
    assert_eq!(runs.load(Ordering::SeqCst), 3, "each failure was retried");
    let replay: Result<u32, PayError> = idem
        .call(key("retry"), Fingerprint::NONE)
        .run_fallible(|| async { Ok(99) })
        .await;
    assert_eq!(replay, Ok(7), "the success is replayed");
    assert_eq!(runs.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn chosen_errors_are_cached_and_others_released() {
    let (_, idem) = setup();
    let runs = AtomicU32::new(0);
    let is_declined = |e: &PayError| *e == PayError::Declined;
    for _ in 0..3 {
        let out: Result<u32, PayError> = idem
            .call(key("declined"), Fingerprint::NONE)
            .run_caching_errors(is_declined, || async {
                runs.fetch_add(1, Ordering::SeqCst);
                Err(PayError::Declined)
            })
            .await;
        assert_eq!(out, Err(PayError::Declined));
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "a declined card stays declined without a second charge attempt"
    );

    for _ in 0..2 {
        let out: Result<u32, PayError> = idem
            .call(key("timeout"), Fingerprint::NONE)
            .run_caching_errors(is_declined, || async {
                runs.fetch_add(1, Ordering::SeqCst);
                Err(PayError::Timeout)
            })
            .await;
        assert_eq!(out, Err(PayError::Timeout));
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        3,
        "an error not chosen is not cached"
    );
}

fn explode() -> u32 {
    panic!("boom")
}

#[tokio::test]
async fn a_panicking_body_releases_its_claim() {
    let (store, idem) = setup();
    let k = key("panic");
    let task = {
        let (idem, k) = (idem.clone(), k.clone());
        tokio::spawn(async move {
            idem.call(k, Fingerprint::NONE)
                .run(|| async { explode() })
                .await
        })
    };
    assert!(task.await.unwrap_err().is_panic());
    wait_until_released(&*store, &k).await;
    let v: u32 = idem
        .call(k, Fingerprint::NONE)
        .run(|| async { 5 })
        .await
        .unwrap();
    assert_eq!(v, 5);
}

#[tokio::test]
async fn a_dropped_call_releases_its_claim() {
    let (store, idem) = setup();
    let k = key("dropped");
    let started = Arc::new(tokio::sync::Notify::new());
    let call = {
        let (idem, k, started) = (idem.clone(), k.clone(), started.clone());
        tokio::spawn(async move {
            idem.call(k, Fingerprint::NONE)
                .run(|| async move {
                    started.notify_one();
                    std::future::pending::<u32>().await
                })
                .await
        })
    };
    started.notified().await;
    assert!(matches!(
        store.get(&k).await.unwrap(),
        Some(Record::InProgress { .. })
    ));
    call.abort();
    wait_until_released(&*store, &k).await;
}

#[tokio::test(start_paused = true)]
async fn the_heartbeat_keeps_a_long_body_s_lease() {
    let (store, idem) = setup();
    let k = key("long-body");
    let runs = Arc::new(AtomicU32::new(0));
    let first = {
        let (idem, k, runs) = (idem.clone(), k.clone(), runs.clone());
        tokio::spawn(async move {
            idem.call(k, Fingerprint::NONE)
                .lease(Duration::from_secs(3))
                .run(|| async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_secs(20)).await;
                    "slow".to_string()
                })
                .await
        })
    };
    // Far past the 3s lease, the first call still holds the key.
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_secs(3)).await;
        let dup = idem
            .call(k.clone(), Fingerprint::NONE)
            .run(|| async { "dup".to_string() })
            .await;
        assert!(matches!(dup, Err(Error::InProgress { .. })), "{dup:?}");
    }
    assert_eq!(first.await.unwrap().unwrap(), "slow");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    // A beat every lease / 3 (1s) through a 20s body: one lease would have ended after
    // 3s, so every beat but the first few is what kept the key.
    let extends = store.extends.load(Ordering::SeqCst);
    assert!(extends >= 19, "{extends} extends over a 20s body");
}

#[tokio::test]
async fn a_holder_whose_key_was_taken_over_gets_lease_lost() {
    let (store, idem) = setup();
    let k = key("taken-over");
    let (go_tx, go_rx) = tokio::sync::oneshot::channel::<()>();
    let first = {
        let (idem, k) = (idem.clone(), k.clone());
        tokio::spawn(async move {
            idem.call(k, Fingerprint::NONE)
                .run(|| async move {
                    go_rx.await.unwrap();
                    "first".to_string()
                })
                .await
        })
    };
    while store.get(&k).await.unwrap().is_none() {
        tokio::task::yield_now().await;
    }
    // An operator deletes the record and a second caller runs and stores its result.
    assert!(idem.forget(&k).await.unwrap());
    let second: String = idem
        .call(k.clone(), Fingerprint::NONE)
        .run(|| async { "second".to_string() })
        .await
        .unwrap();
    assert_eq!(second, "second");
    go_tx.send(()).unwrap();
    let first = first.await.unwrap();
    assert!(matches!(first, Err(Error::LeaseLost { .. })), "{first:?}");
    let replay: String = idem
        .call(k, Fingerprint::NONE)
        .run(|| async { "third".to_string() })
        .await
        .unwrap();
    assert_eq!(
        replay, "second",
        "the successor's result was not overwritten"
    );
}

// On tokio's paused clock: the head start below is exact, not a hope.
#[tokio::test(start_paused = true)]
async fn wait_mode_returns_the_first_result_and_reject_mode_refuses() {
    let (_, idem) = setup();
    let k = key("wait");
    let runs = Arc::new(AtomicU32::new(0));
    let call = |mode| {
        let (idem, k, runs) = (idem.clone(), k.clone(), runs.clone());
        tokio::spawn(async move {
            idem.call(k, Fingerprint::NONE)
                .in_progress(mode)
                .run(|| async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    42u64
                })
                .await
        })
    };
    let first = call(InProgress::Reject);
    tokio::time::sleep(Duration::from_millis(50)).await;
    let rejected = call(InProgress::Reject).await.unwrap();
    match rejected {
        Err(Error::InProgress {
            retry_after,
            ref key,
        }) => {
            assert!(retry_after > Duration::ZERO);
            assert_eq!(key.id(), "wait");
            assert!(rejected
                .as_ref()
                .unwrap_err()
                .to_string()
                .contains("engine-tests/wait"));
        }
        other => panic!("expected InProgress, got {other:?}"),
    }
    let waited = call(InProgress::Wait).await.unwrap().unwrap();
    assert_eq!(waited, 42);
    assert_eq!(first.await.unwrap().unwrap(), 42);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

// On tokio's paused clock: the head start below is exact, not a hope.
#[tokio::test(start_paused = true)]
async fn a_waiter_runs_the_body_itself_when_the_first_call_fails() {
    let (_, idem) = setup();
    let k = key("wait-then-run");
    let first = {
        let (idem, k) = (idem.clone(), k.clone());
        tokio::spawn(async move {
            idem.call(k, Fingerprint::NONE)
                .run_fallible(|| async {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    Err::<u32, _>(PayError::Timeout)
                })
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    let waiter: Result<u32, PayError> = idem
        .call(k, Fingerprint::NONE)
        .in_progress(InProgress::Wait)
        .run_fallible(|| async { Ok(9) })
        .await;
    assert_eq!(first.await.unwrap(), Err(PayError::Timeout));
    assert_eq!(waiter, Ok(9));
}

// On tokio's paused clock: the head start below is exact, not a hope.
#[tokio::test(start_paused = true)]
async fn wait_mode_gives_up_after_its_timeout() {
    let (_, idem) = setup();
    let k = key("wait-timeout");
    let _holder = {
        let (idem, k) = (idem.clone(), k.clone());
        tokio::spawn(async move {
            idem.call(k, Fingerprint::NONE)
                .run(std::future::pending::<u8>)
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    let out = idem
        .call(k, Fingerprint::NONE)
        .in_progress(InProgress::Wait)
        .wait_timeout(Duration::from_millis(150))
        .run(|| async { 1u8 })
        .await;
    match out {
        Err(Error::WaitTimeout { waited, .. }) => assert!(waited >= Duration::from_millis(150)),
        other => panic!("expected WaitTimeout, got {other:?}"),
    }
}

#[tokio::test]
async fn bad_input_is_refused_before_any_store_access() {
    let (store, idem) = setup();
    let ran = AtomicBool::new(false);
    let body = || async {
        ran.store(true, Ordering::SeqCst);
        1u8
    };
    let empty = idem
        .call_checked(Key::new("s", ""), Fingerprint::NONE)
        .run(body)
        .await;
    assert!(
        matches!(&empty, Err(Error::InvalidKey { reason, .. }) if reason.contains("empty")),
        "{empty:?}"
    );
    let long = idem
        .call_checked(Key::new("s", "k".repeat(1025)), Fingerprint::NONE)
        .run(body)
        .await;
    let msg = long.unwrap_err().to_string();
    assert!(msg.contains("1025 bytes") && msg.contains("1024"), "{msg}");
    let slash = Key::new("a/b", "k").unwrap_err().to_string();
    assert!(slash.contains('/'), "{slash}");
    let zero_ttl = idem
        .call(key("zero-ttl"), Fingerprint::NONE)
        .ttl(Duration::ZERO)
        .run(body)
        .await;
    assert!(
        matches!(&zero_ttl, Err(Error::InvalidOption { option: "ttl", .. })),
        "{zero_ttl:?}"
    );
    assert!(zero_ttl
        .unwrap_err()
        .to_string()
        .contains("engine-tests/zero-ttl"));
    let zero_lease = idem
        .call(key("zero-lease"), Fingerprint::NONE)
        .lease(Duration::ZERO)
        .run(body)
        .await;
    assert!(matches!(
        zero_lease,
        Err(Error::InvalidOption {
            option: "lease",
            ..
        })
    ));
    assert_eq!(
        store.calls.load(Ordering::SeqCst),
        0,
        "nothing reached the store"
    );
    assert!(!ran.load(Ordering::SeqCst), "the body never ran");

    let built = Idem::builder()
        .store(MemoryStore::new())
        .ttl(Duration::ZERO)
        .build();
    // A configuration error, not a failure to connect.
    let err = built.unwrap_err();
    assert!(matches!(err, Error::Config { .. }), "{err:?}");
    assert_eq!(
        err.to_string(),
        "invalid idem configuration: Idem::builder(): `ttl` is 0ns; it must be at least 1ms"
    );
    let no_store = Idem::builder().build().unwrap_err();
    assert!(matches!(no_store, Error::Config { .. }), "{no_store:?}");
    assert!(no_store.to_string().contains(".store("), "{no_store}");
    let unknown = idem::connect("mongodb://localhost").await.unwrap_err();
    assert!(matches!(unknown, Error::Config { .. }), "{unknown:?}");
}

#[tokio::test]
async fn an_unreachable_store_fails_closed_with_the_source_kept() {
    let (store, idem) = setup();
    store.fail_claims.store(true, Ordering::SeqCst);
    let ran = AtomicBool::new(false);
    let out = idem
        .call(key("down"), Fingerprint::NONE)
        .run(|| async {
            ran.store(true, Ordering::SeqCst);
            1u8
        })
        .await;
    let err = out.unwrap_err();
    assert!(matches!(err, Error::Store { .. }));
    assert!(err.is_retryable());
    assert!(
        !ran.load(Ordering::SeqCst),
        "the body must not run without a claim"
    );
    // The chain reaches the client's own error.
    let mut chain = Vec::new();
    let mut cur: Option<&dyn std::error::Error> = Some(&err);
    while let Some(e) = cur {
        chain.push(e.to_string());
        cur = e.source();
    }
    assert!(chain.iter().any(|m| m.contains("injected")), "{chain:?}");
}

#[tokio::test(start_paused = true)]
async fn a_failed_complete_is_retried() {
    let (store, idem) = setup();
    store.fail_completes.store(1, Ordering::SeqCst);
    let v: u8 = idem
        .call(key("flaky"), Fingerprint::NONE)
        .run(|| async { 3 })
        .await
        .unwrap();
    assert_eq!(v, 3);
    assert_eq!(
        store.completes.load(Ordering::SeqCst),
        2,
        "one failure, one retry"
    );
    let replay: u8 = idem
        .call(key("flaky"), Fingerprint::NONE)
        .run(|| async { 4 })
        .await
        .unwrap();
    assert_eq!(replay, 3);

    // A store that keeps failing: tried again with backoff while the lease runs, and the
    // caller hears of it before the lease ends (after which another caller may claim).
    store.fail_completes.store(1000, Ordering::SeqCst);
    let lease = Duration::from_secs(2);
    let started = tokio::time::Instant::now();
    let out = idem
        .call(key("dead"), Fingerprint::NONE)
        .lease(lease)
        .run(|| async { 3u8 })
        .await;
    let took = started.elapsed();
    assert!(matches!(out, Err(Error::Store { .. })), "{out:?}");
    let attempts = store.completes.load(Ordering::SeqCst) - 2;
    assert!(
        (4..=20).contains(&attempts),
        "retried with backoff, bounded by the lease: {attempts} attempts"
    );
    assert!(took < lease, "answered after the lease ended: {took:?}");
}

#[tokio::test]
async fn a_complete_whose_answer_was_lost_is_not_a_lost_lease() {
    let (store, idem) = setup();
    store.lose_complete_answers.store(1, Ordering::SeqCst);
    let runs = AtomicU32::new(0);
    let v: u8 = idem
        .call(key("lost-answer"), Fingerprint::NONE)
        .run(|| async {
            runs.fetch_add(1, Ordering::SeqCst);
            8
        })
        .await
        .unwrap();
    assert_eq!(v, 8);
    assert_eq!(
        store.completes.load(Ordering::SeqCst),
        2,
        "stored, answer lost, retried: the store answers the repeat like the first"
    );
    let replay: u8 = idem
        .call(key("lost-answer"), Fingerprint::NONE)
        .run(|| async { 9 })
        .await
        .unwrap();
    assert_eq!(replay, 8);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// The engine trusts the store's answer to a retried complete: the store recognises a
/// repeat of its own token, so a retry that is fenced was fenced, even when the record it
/// finds holds the same bytes under another caller's token.
#[tokio::test]
async fn a_retried_complete_that_is_fenced_is_a_lost_lease() {
    let (store, idem) = setup();
    store.lose_complete_answers.store(1, Ordering::SeqCst);
    store
        .take_over_after_lost_answer
        .store(true, Ordering::SeqCst);
    let res = idem
        .call(key("lost-answer-then-taken"), Fingerprint::NONE)
        .run(|| async { 8u8 })
        .await;
    assert!(matches!(res, Err(Error::LeaseLost { .. })), "{res:?}");
    assert_eq!(store.completes.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn records_that_do_not_decode_are_errors_naming_the_key() {
    let (store, idem) = setup();
    // Junk bytes under the key.
    let k = key("junk");
    let Claim::Acquired { token, .. } = store
        .claim(
            &k,
            &Fingerprint::NONE,
            Token::random(),
            Duration::from_secs(5),
        )
        .await
        .unwrap()
    else {
        panic!()
    };
    store
        .complete(
            &k,
            token,
            Bytes::from_static(b"not an envelope"),
            Duration::from_secs(60),
        )
        .await
        .unwrap();
    let err = idem
        .call(k, Fingerprint::NONE)
        .run(|| async { 1u32 })
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Decode {
                source: DecodeError::NotAnEnvelope,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("engine-tests/junk"), "{err}");

    // A record of a shape the type cannot read: the codec's error, never a panic.
    let _: Vec<u32> = idem
        .call(key("typed"), Fingerprint::NONE)
        .run(|| async { vec![1, 2] })
        .await
        .unwrap();
    let err = idem
        .call(key("typed"), Fingerprint::NONE)
        .run(|| async { "text".to_string() })
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Decode {
                source: DecodeError::Payload { codec: "json", .. },
                ..
            }
        ),
        "{err:?}"
    );
    // A type that reads the same shape replays it: records do not carry type names, so a
    // result type may be renamed, moved or widened.
    let widened: Vec<u64> = idem
        .call(key("typed"), Fingerprint::NONE)
        .run(|| async { vec![9u64] })
        .await
        .unwrap();
    assert_eq!(widened, vec![1, 2]);

    // A record written under another result version is refused, both ways.
    let _: u32 = idem
        .call(key("versioned"), Fingerprint::NONE)
        .version(2)
        .run(|| async { 1u32 })
        .await
        .unwrap();
    for other in [0, 1, 3] {
        let err = idem
            .call(key("versioned"), Fingerprint::NONE)
            .version(other)
            .run(|| async { 2u32 })
            .await
            .unwrap_err();
        assert!(
            matches!(
                err,
                Error::Decode {
                    source: DecodeError::ResultVersion { found: 2, expected },
                    ..
                } if expected == other
            ),
            "{err:?}"
        );
    }

    // A cached error read by a call that does not cache errors.
    let _: Result<u32, PayError> = idem
        .call(key("cached-err"), Fingerprint::NONE)
        .run_caching_errors(|_: &PayError| true, || async { Err(PayError::Declined) })
        .await;
    let err = idem
        .call(key("cached-err"), Fingerprint::NONE)
        .run(|| async { 1u32 })
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Decode {
                source: DecodeError::UnexpectedError,
                ..
            }
        ),
        "{err:?}"
    );
}

#[cfg(feature = "postcard")]
#[tokio::test]
async fn codecs_are_kept_apart() {
    use idem::codec::{Json, Postcard};
    let (_, idem) = setup();
    let v: (u8, String) = idem
        .call(key("pc"), Fingerprint::NONE)
        .codec(Postcard)
        .run(|| async { (1, "x".into()) })
        .await
        .unwrap();
    assert_eq!(v, (1, "x".into()));
    let replay: (u8, String) = idem
        .call(key("pc"), Fingerprint::NONE)
        .codec(Postcard)
        .run(|| async { (2, "y".into()) })
        .await
        .unwrap();
    assert_eq!(replay, (1, "x".into()));
    let err = idem
        .call(key("pc"), Fingerprint::NONE)
        .codec(Json)
        .run(|| async { (3u8, String::new()) })
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Decode {
                source: DecodeError::Codec {
                    found: 2,
                    expected: 1
                },
                ..
            }
        ),
        "{err:?}"
    );
}

#[cfg(feature = "bincode")]
#[tokio::test]
async fn the_bincode_codec_round_trips() {
    let (_, idem) = setup();
    let idem2 = Idem::builder()
        .shared_store(idem.store().clone())
        .codec(idem::BuiltinCodec::Bincode)
        .build()
        .unwrap();
    let v: Vec<i64> = idem2
        .call(key("bc"), Fingerprint::NONE)
        .run(|| async { vec![-1, 2] })
        .await
        .unwrap();
    let replay: Vec<i64> = idem2
        .call(key("bc"), Fingerprint::NONE)
        .run(|| async { vec![] })
        .await
        .unwrap();
    assert_eq!(v, replay);
}

/// A counting store with a local cache in front of it.
fn with_local_cache() -> (Arc<Faulty>, Idem) {
    let store = Arc::new(Faulty::default());
    let idem = Idem::builder()
        .store(store.clone())
        .local_cache(100, Duration::from_secs(60))
        .build()
        .unwrap();
    (store, idem)
}

#[tokio::test]
async fn the_local_cache_answers_replays_without_the_store() {
    let (store, idem) = with_local_cache();
    let fp = Fingerprint::of("payload");
    for _ in 0..10 {
        let v: u32 = idem
            .call(key("hot"), fp)
            .run(|| async { 11 })
            .await
            .unwrap();
        assert_eq!(v, 11);
    }
    assert_eq!(
        store.claims.load(Ordering::SeqCst),
        1,
        "replays came from the local cache"
    );
    let reuse = idem
        .call(key("hot"), Fingerprint::of("other"))
        .run(|| async { 12u32 })
        .await;
    assert!(
        matches!(reuse, Err(Error::KeyReuse { .. })),
        "the cache checks fingerprints too"
    );
    assert!(idem.forget(&key("hot")).await.unwrap());
    let v: u32 = idem
        .call(key("hot"), fp)
        .run(|| async { 13 })
        .await
        .unwrap();
    assert_eq!(v, 13, "forget clears the cache as well as the store");
}

/// The local cache answers before the call's future is built, but not past a bad option:
/// a zero lease on a key the cache holds is refused as it is on any other key.
#[tokio::test]
async fn an_invalid_option_is_refused_even_when_the_local_cache_has_the_key() {
    let (_, idem) = with_local_cache();
    let run = |lease: Duration| {
        idem.call(key("cached-bad-option"), Fingerprint::NONE)
            .lease(lease)
            .with_outcome()
            .run(|| async { 7u32 })
    };
    let first = run(Duration::from_secs(5)).await.unwrap();
    let again = run(Duration::from_secs(5)).await.unwrap();
    assert_eq!(
        (first.origin(), again.origin()),
        (Origin::Ran, Origin::LocalCache)
    );
    let bad = run(Duration::ZERO).await;
    assert!(
        matches!(
            bad,
            Err(Error::InvalidOption {
                option: "lease",
                ..
            })
        ),
        "{bad:?}"
    );
}

// On tokio's paused clock: the head start below is exact, not a hope.
#[tokio::test(start_paused = true)]
async fn key_reuse_is_refused_while_in_progress_too() {
    let (_, idem) = setup();
    let k = key("reuse-in-progress");
    let _holder = {
        let (idem, k) = (idem.clone(), k.clone());
        tokio::spawn(async move {
            idem.call(k, Fingerprint::of(&1))
                .run(std::future::pending::<u8>)
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    let out = idem
        .call(k, Fingerprint::of(&2))
        .in_progress(InProgress::Wait)
        .run(|| async { 1u8 })
        .await;
    assert!(matches!(out, Err(Error::KeyReuse { .. })), "{out:?}");
}

// On tokio's paused clock: the head start below is exact, not a hope.
#[tokio::test(start_paused = true)]
async fn a_call_dropped_while_storing_its_result_does_not_invite_a_second_run() {
    let (store, idem) = setup();
    store.complete_delay_ms.store(200, Ordering::SeqCst);
    let runs = AtomicU32::new(0);
    let body = || async {
        runs.fetch_add(1, Ordering::SeqCst);
        "charged".to_string()
    };
    // The client gives up after the side effect, while the result is on its way to the store.
    let first = tokio::time::timeout(
        Duration::from_millis(50),
        idem.call(key("dropped-in-complete"), Fingerprint::NONE)
            .run(body),
    )
    .await;
    assert!(first.is_err(), "the first call timed out");
    tokio::time::sleep(Duration::from_millis(100)).await;
    let retry = idem
        .call(key("dropped-in-complete"), Fingerprint::NONE)
        .run(body)
        .await;
    assert!(matches!(retry, Err(Error::InProgress { .. })), "{retry:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the side effect ran once");
}

// On tokio's paused clock: the head start below is exact, not a hope.
#[tokio::test(start_paused = true)]
async fn a_call_dropped_while_releasing_still_releases() {
    let (store, idem) = setup();
    store.release_delay_ms.store(100, Ordering::SeqCst);
    let k = key("dropped-in-release");
    let first = tokio::time::timeout(
        Duration::from_millis(30),
        idem.call(k.clone(), Fingerprint::NONE)
            .run_fallible(|| async { Err::<u8, _>(PayError::Timeout) }),
    )
    .await;
    assert!(first.is_err(), "dropped during the release");
    wait_until_released(&*store, &k).await;
    store.release_delay_ms.store(0, Ordering::SeqCst);
    let v: Result<u8, PayError> = idem
        .call(k, Fingerprint::NONE)
        .run_fallible(|| async { Ok(1) })
        .await;
    assert_eq!(v, Ok(1));
}

#[tokio::test]
async fn huge_durations_are_refused_not_overflowed() {
    let (store, idem) = setup();
    let out = idem
        .call(key("forever"), Fingerprint::NONE)
        .ttl(Duration::MAX)
        .run(|| async { 1u8 })
        .await;
    match out {
        Err(Error::InvalidOption {
            option: "ttl",
            reason,
            ..
        }) => {
            assert!(reason.contains("100 years"), "{reason}")
        }
        other => panic!("expected InvalidOption, got {other:?}"),
    }
    let out = idem
        .call(key("forever"), Fingerprint::NONE)
        .lease(Duration::MAX)
        .run(|| async { 1u8 })
        .await;
    assert!(
        matches!(
            out,
            Err(Error::InvalidOption {
                option: "lease",
                ..
            })
        ),
        "{out:?}"
    );
    assert_eq!(store.calls.load(Ordering::SeqCst), 0);
    assert!(Idem::builder()
        .store(MemoryStore::new())
        .ttl(Duration::MAX)
        .build()
        .is_err());
    // A store used directly saturates instead of panicking.
    let memory = MemoryStore::new();
    let Claim::Acquired { token, .. } = memory
        .claim(
            &key("direct"),
            &Fingerprint::NONE,
            Token::random(),
            Duration::MAX,
        )
        .await
        .unwrap()
    else {
        panic!()
    };
    memory
        .complete(&key("direct"), token, Bytes::new(), Duration::MAX)
        .await
        .unwrap();
}

#[tokio::test]
async fn a_result_that_does_not_survive_its_codec_is_refused_and_not_rerun() {
    let (_, idem) = setup();
    let runs = AtomicU32::new(0);
    // JSON cannot encode a map with tuple keys.
    // The first call is refused; the claim it leaves held keeps a retry from running
    // the side effect again until its lease ends.
    for attempt in 0..2 {
        let out = idem
            .call(key("tuple-keys"), Fingerprint::NONE)
            .run(|| async {
                runs.fetch_add(1, Ordering::SeqCst);
                std::collections::HashMap::from([((1u8, 2u8), 3u8)])
            })
            .await;
        if attempt == 0 {
            assert!(matches!(out, Err(Error::Encode { .. })), "{out:?}");
        } else {
            assert!(matches!(out, Err(Error::InProgress { .. })), "{out:?}");
        }
    }
    // JSON writes NaN as null, which does not decode back into an f64: the first caller
    // would otherwise get a value that every replay fails to decode.
    // The first call is refused; the claim it leaves held keeps a retry from running
    // the side effect again until its lease ends.
    for attempt in 0..2 {
        let out = idem
            .call(key("nan"), Fingerprint::NONE)
            .run(|| async {
                runs.fetch_add(1, Ordering::SeqCst);
                f64::NAN
            })
            .await;
        if attempt == 0 {
            assert!(matches!(out, Err(Error::Encode { .. })), "{out:?}");
        } else {
            assert!(matches!(out, Err(Error::InProgress { .. })), "{out:?}");
        }
    }
    assert_eq!(runs.load(Ordering::SeqCst), 2, "neither body ran twice");
}

/// Counts claims and nothing else: every other step, `wait` and `capabilities` included,
/// comes from the memory store through `StoreWrapper`'s defaults.
#[derive(Debug, Default)]
struct CountingClaims {
    inner: MemoryStore,
    claims: AtomicU32,
}

#[idem::async_trait]
impl StoreWrapper for CountingClaims {
    type Inner = MemoryStore;
    fn inner(&self) -> &MemoryStore {
        &self.inner
    }
    async fn claim(
        &self,
        key: &Key,
        fp: &Fingerprint,
        token: Token,
        lease: Duration,
    ) -> Result<Claim, StoreError> {
        self.claims.fetch_add(1, Ordering::SeqCst);
        self.inner.claim(key, fp, token, lease).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_wrapper_that_overrides_one_step_keeps_the_inner_store_s_wake_ups() {
    let store = Arc::new(CountingClaims::default());
    assert_eq!(
        Store::capabilities(&*store),
        MemoryStore::new().capabilities()
    );
    assert_eq!(Store::backend(&*store), "memory");
    let idem = Idem::builder()
        .store(store.clone())
        .wait_timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let (release_tx, release_rx) = tokio::sync::oneshot::channel::<()>();
    let holder = {
        let idem = idem.clone();
        tokio::spawn(async move {
            idem.call(key("woken"), Fingerprint::NONE)
                .run(|| async move {
                    release_rx.await.unwrap();
                    1u32
                })
                .await
        })
    };
    while store.claims.load(Ordering::SeqCst) == 0 {
        tokio::task::yield_now().await;
    }
    let waiters: Vec<_> = (0..10)
        .map(|_| {
            let idem = idem.clone();
            tokio::spawn(async move {
                idem.call(key("woken"), Fingerprint::NONE)
                    .in_progress(InProgress::Wait)
                    .run(|| async { 2u32 })
                    .await
            })
        })
        .collect();
    // The waiters claim once, find the key held, and wait: woken by the memory store, not
    // polling. With a 400 ms hold, polling (5 ms doubling to 250 ms) would claim about six
    // times per waiter; woken waiters claim once before and once after.
    tokio::time::sleep(Duration::from_millis(400)).await;
    release_tx.send(()).unwrap();
    assert_eq!(holder.await.unwrap().unwrap(), 1);
    for waiter in waiters {
        assert_eq!(waiter.await.unwrap().unwrap(), 1);
    }
    assert_eq!(store.claims.load(Ordering::SeqCst), 1 + 10 * 2);
}
