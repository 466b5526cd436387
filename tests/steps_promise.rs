//! Steps keep their promise at the edges, on the memory store (its clock is tokio's, so the
//! leases and holds here run on a paused clock): a step bound to its call's payload, one
//! resolution at a time, a resolution that says what it did, holds that wait for a person, a
//! panic after an unrecorded step, and store answers that come late. The same races on every
//! backend are in `idem-integration/tests/steps_races_every_store.rs`.

mod support;

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::join_all;
use futures_util::FutureExt;
use idem::{
    steps::Resolution, steps::Resolved, steps::Step, store::Bytes, store::Record, store::Store,
    store::StoreError, store::StoreWrapper, store::Token, Error, Fingerprint, Idem, InProgress,
    Key, LeaseLoss, MemoryStore,
};

fn key(id: &str) -> Key {
    Key::new("tests::steps_promise", id).unwrap()
}

fn ambiguous() -> Error {
    support::engine::ambiguous("the gateway timed out after the request was sent")
}

fn refused() -> StoreError {
    StoreError::Unavailable {
        backend: "scripted",
        source: "refused (injected)".into(),
    }
}

/// Whether a stored payload is a hold (the envelope's kind byte).
fn is_hold(payload: &[u8]) -> bool {
    payload.len() > 6 && payload[6] == 2
}

/// What the scripted store does besides the memory store's work.
#[derive(Debug, Default)]
struct Script {
    /// Every complete of a hold fails.
    fail_holds: AtomicBool,
    /// Every complete of a step's record fails.
    fail_step_completes: AtomicBool,
    /// A `get` of a call's key (not a step's) is answered this late, with what the store
    /// held when it was asked.
    late_gets: Mutex<Option<Duration>>,
    /// Every extend is answered this late.
    late_extends: Mutex<Option<Duration>>,
    /// Every complete of a call's key answers `NotReplicated` after this long.
    unreplicated: Mutex<Option<Duration>>,
}

#[derive(Debug)]
struct Scripted {
    inner: MemoryStore,
    script: Arc<Script>,
}

fn scripted() -> (Arc<Scripted>, Arc<Script>) {
    let script = Arc::new(Script::default());
    let store = Arc::new(Scripted {
        inner: MemoryStore::new(),
        script: script.clone(),
    });
    (store, script)
}

fn is_step(key: &Key) -> bool {
    key.scope().contains("#step:")
}

#[idem::store::async_trait]
impl StoreWrapper for Scripted {
    type Inner = MemoryStore;
    fn inner(&self) -> &MemoryStore {
        &self.inner
    }

    async fn complete(
        &self,
        key: &Key,
        token: Token,
        payload: Bytes,
        ttl: Duration,
    ) -> Result<(), StoreError> {
        let s = &self.script;
        if (s.fail_holds.load(SeqCst) && is_hold(&payload))
            || (s.fail_step_completes.load(SeqCst) && is_step(key))
        {
            return Err(refused());
        }
        let unreplicated = *s.unreplicated.lock().unwrap();
        if let (Some(after), false) = (unreplicated, is_step(key)) {
            tokio::time::sleep(after).await;
            return Err(StoreError::NotReplicated {
                backend: "scripted",
                step: "complete",
                acknowledged: 0,
                required: 1,
                after,
            });
        }
        self.inner.complete(key, token, payload, ttl).await
    }

    async fn get(&self, key: &Key) -> Result<Option<Record>, StoreError> {
        let answer = self.inner.get(key).await;
        let late = *self.script.late_gets.lock().unwrap();
        if let (Some(late), false) = (late, is_step(key)) {
            tokio::time::sleep(late).await;
        }
        answer
    }

    async fn extend(&self, key: &Key, token: Token, lease: Duration) -> Result<(), StoreError> {
        let late = *self.script.late_extends.lock().unwrap();
        if let Some(late) = late {
            tokio::time::sleep(late).await;
        }
        self.inner.extend(key, token, lease).await
    }
}

/// A checkout: charges `amount` in a step (counted), then fails when `fail_after` is set.
async fn checkout(
    idem: &Idem,
    k: &Key,
    amount: u32,
    charges: &AtomicU32,
    fail_after: bool,
) -> Result<String, Error> {
    idem.call(k.clone(), Fingerprint::of(&amount))
        .run_fallible(|| async move {
            let charge = idem::step("charge", || async move {
                charges.fetch_add(1, SeqCst);
                Ok::<_, Error>(format!("ch_for_{amount}"))
            })
            .await?;
            if fail_after {
                return Err(Error::Config {
                    message: "stock changed".into(),
                    source: None,
                });
            }
            Ok(format!("order paid {amount} with {charge}"))
        })
        .await
}

#[tokio::test]
async fn a_retry_with_another_payload_is_key_reuse_before_any_step_replays() {
    let idem = Idem::new(MemoryStore::new());
    let (k, charges) = (key("payload"), AtomicU32::new(0));
    assert!(checkout(&idem, &k, 100, &charges, true).await.is_err());
    let other = checkout(&idem, &k, 5000, &charges, false).await;
    assert!(
        matches!(&other, Err(Error::KeyReuse { key }) if *key == k),
        "another payload replayed the first one's step: {other:?}"
    );
    assert_eq!(
        checkout(&idem, &k, 100, &charges, false).await.unwrap(),
        "order paid 100 with ch_for_100",
        "the first payload's retry resumes after its charge"
    );
    assert_eq!(charges.load(SeqCst), 1);
    let again = checkout(&idem, &k, 5000, &charges, false).await;
    assert!(matches!(again, Err(Error::KeyReuse { .. })), "{again:?}");
}

/// An attempt whose `charge` step fails ambiguously: the key is held.
async fn hold(idem: &Idem, k: &Key, charges: &AtomicU32) {
    let first = attempt(idem, k, charges, true).await;
    assert!(
        matches!(&first, Err(Error::OutcomeUnknown { step, .. }) if step == "charge"),
        "{first:?}"
    );
}

async fn attempt(idem: &Idem, k: &Key, charges: &AtomicU32, fail: bool) -> Result<String, Error> {
    idem.call(k.clone(), Fingerprint::NONE)
        .run_fallible(|| async move {
            Step::new("charge")
                .unknown_if(|_: &Error| true)
                .run(|| async move {
                    charges.fetch_add(1, SeqCst);
                    match fail {
                        true => Err(ambiguous()),
                        false => Ok(String::from("ch_again")),
                    }
                })
                .await
        })
        .await
}

/// A memory store that lets other tasks run before each of its steps, so that resolutions
/// racing on several threads interleave between their reads and their writes.
#[derive(Debug)]
struct Yielding(MemoryStore);

#[idem::store::async_trait]
impl StoreWrapper for Yielding {
    type Inner = MemoryStore;
    fn inner(&self) -> &MemoryStore {
        &self.0
    }
    async fn get(&self, key: &Key) -> Result<Option<Record>, StoreError> {
        tokio::task::yield_now().await;
        self.0.get(key).await
    }
    async fn replace(
        &self,
        key: &Key,
        expected: &[u8],
        new: Option<(Bytes, Duration)>,
    ) -> Result<bool, StoreError> {
        tokio::task::yield_now().await;
        self.0.replace(key, expected, new).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_resolutions_write_once_and_never_end_an_attempt_that_started_since() {
    let idem = Idem::new(Yielding(MemoryStore::new()));
    for round in 0..50 {
        let (k, charges) = (key(&format!("race-{round}")), AtomicU32::new(0));
        hold(&idem, &k, &charges).await;
        let resolutions = (0..8).map(|i| {
            let resolution = match i % 2 {
                0 => Resolution::ran(&format!("ch_{i}")).unwrap(),
                _ => Resolution::NotRan,
            };
            let (idem, k) = (idem.clone(), k.clone());
            tokio::spawn(async move { idem.resolve(&k, "charge", resolution).await })
        });
        let answers: Vec<Resolved> = join_all(resolutions)
            .await
            .into_iter()
            .map(|r| r.unwrap().unwrap())
            .collect();
        let resolved = answers.iter().filter(|r| **r == Resolved::Resolved).count();
        assert_eq!(resolved, 1, "round {round}: {answers:?}");
        // Whatever won, the next call runs the step at most once more and answers.
        let out = attempt(&idem, &k, &charges, false).await.unwrap();
        assert!(out == "ch_again" || out.starts_with("ch_"), "{out}");
        assert!(charges.load(SeqCst) <= 2);
    }
    // A resolution that comes after an attempt started leaves its claim alone.
    let (k, charges) = (key("late-resolver"), AtomicU32::new(0));
    hold(&idem, &k, &charges).await;
    idem.resolve(&k, "charge", Resolution::NotRan)
        .await
        .unwrap();
    let started = Arc::new(tokio::sync::Notify::new());
    let go = Arc::new(tokio::sync::Notify::new());
    let running = {
        let (idem, k, started, go) = (idem.clone(), k.clone(), started.clone(), go.clone());
        tokio::spawn(async move {
            idem.call(k, Fingerprint::NONE)
                .run_fallible(|| async move {
                    started.notify_one();
                    go.notified().await;
                    Ok::<_, Error>(1u32)
                })
                .await
        })
    };
    started.notified().await;
    let late = idem
        .resolve(&k, "charge", Resolution::ran("ch_late").unwrap())
        .await;
    assert!(
        matches!(&late, Err(Error::Step { reason, .. }) if reason.contains("is running")),
        "{late:?}"
    );
    go.notify_one();
    assert_eq!(running.await.unwrap().unwrap(), 1, "a resolution ended it");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_reconcile_hook_runs_once_per_held_key_while_its_callers_wait_for_it() {
    let asked = Arc::new(AtomicU32::new(0));
    let idem = {
        let asked = asked.clone();
        Idem::builder()
            .store(MemoryStore::new())
            // Waiting callers wait for the hook's answer; rejecting ones answer at once.
            .in_progress(InProgress::Wait)
            .reconcile(move |_| {
                let asked = asked.clone();
                async move {
                    asked.fetch_add(1, SeqCst);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    Resolution::ran("ch_found").ok()
                }
            })
            .build()
            .unwrap()
    };
    let (k, charges) = (key("hook"), AtomicU32::new(0));
    hold(&idem, &k, &charges).await;
    let retries = (0..8).map(|_| attempt(&idem, &k, &charges, false));
    for out in join_all(retries).await {
        assert_eq!(out.unwrap(), "ch_found");
    }
    assert_eq!(asked.load(SeqCst), 1, "the hook ran for each caller");
    assert_eq!(charges.load(SeqCst), 1, "the charge ran again");
}

#[tokio::test(start_paused = true)]
async fn a_resolution_that_cannot_store_its_value_fails_and_the_key_stays_held() {
    let (store, script) = scripted();
    let lease = Duration::from_secs(10);
    let idem = Idem::builder()
        .shared_store(store.clone())
        .lease(lease)
        .build()
        .unwrap();
    let (k, charges) = (key("unstored-resolution"), AtomicU32::new(0));
    // The step's hold cannot be written; the key's can.
    script.fail_step_completes.store(true, SeqCst);
    let first = attempt(&idem, &k, &charges, true).await;
    assert!(
        matches!(first, Err(Error::OutcomeUnknown { .. })),
        "{first:?}"
    );
    script.fail_step_completes.store(false, SeqCst);
    let step_record = store.get(&k.step("charge").unwrap()).await.unwrap();
    assert!(
        matches!(step_record, Some(Record::InProgress { .. })),
        "{step_record:?}"
    );
    let early = idem
        .resolve(&k, "charge", Resolution::ran("ch_1").unwrap())
        .await;
    match early {
        Err(Error::Step { reason, .. }) => assert!(reason.contains("still claimed"), "{reason}"),
        other => panic!("a resolution that stored nothing answered {other:?}"),
    }
    let held = attempt(&idem, &k, &charges, false).await;
    assert!(
        matches!(held, Err(Error::OutcomeUnknown { .. })),
        "{held:?}"
    );
    tokio::time::sleep(lease + Duration::from_secs(1)).await;
    assert_eq!(
        idem.resolve(&k, "charge", Resolution::ran("ch_1").unwrap())
            .await
            .unwrap(),
        Resolved::Resolved
    );
    assert_eq!(attempt(&idem, &k, &charges, false).await.unwrap(), "ch_1");
    assert_eq!(charges.load(SeqCst), 1, "the resolved step ran again");
}

#[tokio::test]
async fn a_step_value_that_does_not_decode_holds_the_key_instead_of_running_the_step() {
    let idem = Idem::new(MemoryStore::new());
    let (k, charges) = (key("wrong-type"), AtomicU32::new(0));
    hold(&idem, &k, &charges).await;
    // The step returns a String; 42 is not one.
    let resolved = idem
        .resolve(&k, "charge", Resolution::Ran(serde_json::json!(42)))
        .await
        .unwrap();
    assert_eq!(resolved, Resolved::Resolved);
    for _ in 0..2 {
        let out = attempt(&idem, &k, &charges, false).await;
        assert!(
            matches!(&out, Err(Error::OutcomeUnknown { step, .. }) if step == "charge"),
            "{out:?}"
        );
    }
    assert_eq!(charges.load(SeqCst), 1, "the step ran again");
    assert_eq!(
        idem.resolve(&k, "charge", Resolution::ran("ch_1").unwrap())
            .await
            .unwrap(),
        Resolved::Resolved
    );
    assert_eq!(attempt(&idem, &k, &charges, false).await.unwrap(), "ch_1");
    assert_eq!(charges.load(SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn a_hold_outlives_the_calls_ttl_until_resolved_or_its_own_ttl() {
    let ttl = Duration::from_secs(60);
    let idem = Idem::builder()
        .store(MemoryStore::new())
        .ttl(ttl)
        .build()
        .unwrap();
    let (k, charges) = (key("forever"), AtomicU32::new(0));
    hold(&idem, &k, &charges).await;
    tokio::time::sleep(Duration::from_secs(400 * 24 * 3600)).await;
    let out = attempt(&idem, &k, &charges, false).await;
    assert!(matches!(out, Err(Error::OutcomeUnknown { .. })), "{out:?}");
    assert_eq!(charges.load(SeqCst), 1);

    let bounded = Idem::builder()
        .store(MemoryStore::new())
        .ttl(ttl)
        .hold_ttl(Duration::from_secs(3600))
        .build()
        .unwrap();
    hold(&bounded, &k, &charges).await;
    tokio::time::sleep(Duration::from_secs(1800)).await;
    let out = attempt(&bounded, &k, &charges, false).await;
    assert!(matches!(out, Err(Error::OutcomeUnknown { .. })), "{out:?}");
    tokio::time::sleep(Duration::from_secs(1801)).await;
    assert_eq!(
        attempt(&bounded, &k, &charges, false).await.unwrap(),
        "ch_again"
    );
    assert!(
        Idem::builder()
            .store(MemoryStore::new())
            .hold_ttl(Duration::ZERO)
            .build()
            .is_err(),
        "a zero hold_ttl was accepted"
    );
}

#[tokio::test(start_paused = true)]
async fn a_hold_that_cannot_be_written_is_outcome_not_held_and_keeps_the_claim() {
    let (store, script) = scripted();
    let idem = Idem::builder()
        .shared_store(store)
        .lease(Duration::from_secs(5))
        .build()
        .unwrap();
    let (k, charges) = (key("not-held"), AtomicU32::new(0));
    script.fail_holds.store(true, SeqCst);
    let out = attempt(&idem, &k, &charges, true).await;
    match out {
        Err(Error::OutcomeNotHeld { step, source, .. }) => {
            assert_eq!(step, "charge");
            assert!(matches!(*source, Error::Store { .. }), "{source}");
        }
        other => panic!("expected OutcomeNotHeld, got {other:?}"),
    }
    script.fail_holds.store(false, SeqCst);
    let retry = attempt(&idem, &k, &charges, false).await;
    assert!(
        matches!(retry, Err(Error::InProgress { .. })),
        "a retry at once could run the ambiguous step again: {retry:?}"
    );
    assert_eq!(charges.load(SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn a_panic_after_a_step_that_acted_unrecorded_keeps_the_claim() {
    let (store, script) = scripted();
    let idem = Idem::builder()
        .shared_store(store)
        .lease(Duration::from_secs(5))
        .build()
        .unwrap();
    let (k, charges) = (key("panic"), AtomicU32::new(0));
    script.fail_step_completes.store(true, SeqCst);
    let call = idem
        .call(k.clone(), Fingerprint::NONE)
        .run_fallible(|| async {
            let charged = idem::step("charge", || async {
                charges.fetch_add(1, SeqCst);
                Ok::<_, Error>(1u32)
            })
            .await;
            assert!(charged.is_err(), "the step's record was stored");
            panic!("the handler panics after the charge");
            #[allow(unreachable_code)]
            Ok::<_, Error>(0u32)
        });
    let panicked = std::panic::AssertUnwindSafe(call).catch_unwind().await;
    assert!(panicked.is_err());
    script.fail_step_completes.store(false, SeqCst);
    // Let a release in the background, if any, happen.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let retry = idem
        .call(k.clone(), Fingerprint::NONE)
        .run_fallible(|| async {
            idem::step("charge", || async {
                charges.fetch_add(1, SeqCst);
                Ok::<_, Error>(1u32)
            })
            .await
        })
        .await;
    assert!(
        matches!(retry, Err(Error::InProgress { .. })),
        "the panic gave the claim back: {retry:?}"
    );
    assert_eq!(charges.load(SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn a_step_does_not_run_on_a_late_answer_that_its_claims_are_live() {
    let (store, script) = scripted();
    let lease = Duration::from_secs(1);
    let idem = Idem::builder()
        .shared_store(store)
        .lease(lease)
        .lease_loss(LeaseLoss::Finish)
        .in_progress(InProgress::Wait)
        .wait_timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    let k = key("late-answer");
    let charges = Arc::new(AtomicU32::new(0));
    let holder = {
        let (idem, k, charges, script) = (idem.clone(), k.clone(), charges.clone(), script.clone());
        tokio::spawn(async move {
            idem.call(k, Fingerprint::NONE)
                .run_fallible(|| async move {
                    tokio::time::sleep(Duration::from_millis(1200)).await;
                    // From here extends never confirm in time (the holder's lease ends at
                    // 2 s while it runs on), and its look at the call's record, which still
                    // says "yours", is answered 3 s late.
                    *script.late_extends.lock().unwrap() = Some(Duration::from_secs(30));
                    *script.late_gets.lock().unwrap() = Some(Duration::from_secs(3));
                    idem::step("charge", || async move {
                        charges.fetch_add(1, SeqCst);
                        Ok::<_, Error>(1u32)
                    })
                    .await
                })
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(1300)).await;
    *script.late_gets.lock().unwrap() = None;
    let successor = {
        let charges = charges.clone();
        idem.call(k.clone(), Fingerprint::NONE)
            .run_fallible(|| async move {
                idem::step("charge", || async move {
                    charges.fetch_add(1, SeqCst);
                    Ok::<_, Error>(2u32)
                })
                .await
            })
            .await
    };
    assert_eq!(successor.unwrap(), 2);
    let holder = holder.await.unwrap();
    assert!(matches!(holder, Err(Error::LeaseLost { .. })), "{holder:?}");
    assert_eq!(charges.load(SeqCst), 1, "the step ran twice");
}

#[tokio::test(start_paused = true)]
async fn a_body_is_cancelled_at_its_leases_end_without_waiting_for_an_extend_in_flight() {
    let (store, script) = scripted();
    let lease = Duration::from_secs(3);
    let idem = Idem::builder()
        .shared_store(store)
        .lease(lease)
        .build()
        .unwrap();
    *script.late_extends.lock().unwrap() = Some(Duration::from_secs(60));
    let started = tokio::time::Instant::now();
    let out = idem
        .call(key("cancel"), Fingerprint::NONE)
        .run(|| async {
            tokio::time::sleep(Duration::from_secs(30)).await;
            1u32
        })
        .await;
    assert!(matches!(out, Err(Error::LeaseLost { .. })), "{out:?}");
    let took = started.elapsed();
    assert!(
        took <= lease + Duration::from_millis(10),
        "the body ran {took:?}, past its lease of {lease:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_result_not_replicated_within_the_lease_says_so_not_that_a_step_timed_out() {
    let (store, script) = scripted();
    let idem = Idem::builder()
        .shared_store(store)
        .lease(Duration::from_secs(3))
        .store_timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    *script.unreplicated.lock().unwrap() = Some(Duration::from_millis(900));
    let out = idem
        .call(key("unreplicated"), Fingerprint::NONE)
        .run(|| async { 1u32 })
        .await;
    match out {
        Err(Error::Store { source, .. }) => assert!(
            matches!(source, StoreError::NotReplicated { .. }),
            "the cause is hidden: {source}"
        ),
        other => panic!("expected the store's error, got {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn at_most_once_step_stopped_inside_holds_the_key_and_a_plain_err_runs_it_again() {
    let lease = Duration::from_secs(5);
    let idem = Idem::builder()
        .store(MemoryStore::new())
        .lease(lease)
        .build()
        .unwrap();
    let sends = AtomicU32::new(0);
    // `hang`: stop inside the step, after the send; `fail`: an error that says nothing was
    // sent.
    let email = |k: Key, hang: bool, fail: bool| {
        let sends = &sends;
        idem.call(k, Fingerprint::NONE)
            .run_fallible(move || async move {
                Step::new("email")
                    .at_most_once()
                    .run(|| async move {
                        if fail {
                            return Err(ambiguous());
                        }
                        sends.fetch_add(1, SeqCst);
                        if hang {
                            std::future::pending::<()>().await;
                        }
                        Ok::<_, Error>(String::from("msg_1"))
                    })
                    .await
            })
    };
    // Stopped inside the step (the future dropped, as a crash would stop it).
    let k = key("at-most-once");
    assert!(
        tokio::time::timeout(Duration::from_secs(1), email(k.clone(), true, false))
            .await
            .is_err()
    );
    let retry = email(k.clone(), false, false).await;
    assert!(
        matches!(retry, Err(Error::InProgress { .. })),
        "the claim was given back after a stop inside the step: {retry:?}"
    );
    tokio::time::sleep(lease).await;
    for _ in 0..2 {
        let out = email(k.clone(), false, false).await;
        assert!(
            matches!(&out, Err(Error::OutcomeUnknown { step, .. }) if step == "email"),
            "{out:?}"
        );
    }
    assert_eq!(sends.load(SeqCst), 1, "the at-most-once step ran again");
    idem.resolve(&k, "email", Resolution::NotRan).await.unwrap();
    assert_eq!(email(k.clone(), false, false).await.unwrap(), "msg_1");
    assert_eq!(sends.load(SeqCst), 2, "resolved as not sent, it is sent");
    assert_eq!(email(k, false, false).await.unwrap(), "msg_1");
    assert_eq!(sends.load(SeqCst), 2);
    // An error that is not ambiguous leaves nothing: the next attempt sends.
    let k = key("at-most-once-err");
    assert!(email(k.clone(), false, true).await.is_err());
    assert_eq!(email(k, false, false).await.unwrap(), "msg_1");
    assert_eq!(sends.load(SeqCst), 3);
}

#[idem::idempotent(key = order_id, store = idem, skip(idem, sends, hang), at_most_once)]
async fn send_receipt(
    idem: &Idem,
    sends: &AtomicU32,
    order_id: &str,
    hang: bool,
) -> Result<String, Error> {
    sends.fetch_add(1, SeqCst);
    if hang {
        std::future::pending::<()>().await;
    }
    if order_id.ends_with("-fails") {
        return Err(ambiguous());
    }
    Ok(format!("receipt for {order_id}"))
}

#[tokio::test(start_paused = true)]
async fn at_most_once_call_stopped_in_its_body_holds_the_key_until_resolved() {
    let lease = Duration::from_secs(30);
    let idem = Idem::builder()
        .store(MemoryStore::new())
        .lease(lease)
        .build()
        .unwrap();
    let sends = AtomicU32::new(0);
    let stopped = tokio::time::timeout(
        Duration::from_secs(1),
        send_receipt(&idem, &sends, "o-1", true),
    );
    assert!(stopped.await.is_err());
    tokio::time::sleep(lease).await;
    for _ in 0..2 {
        let out = send_receipt(&idem, &sends, "o-1", false).await;
        assert!(
            matches!(&out, Err(Error::OutcomeUnknown { step, .. }) if step == "call"),
            "{out:?}"
        );
    }
    assert_eq!(sends.load(SeqCst), 1, "the at-most-once body ran again");
    let k = Key::new(module_path!().to_owned() + "::send_receipt", "o-1").unwrap();
    let resolved = idem
        .resolve(&k, "call", Resolution::ran("receipt sent by hand").unwrap())
        .await
        .unwrap();
    assert_eq!(resolved, Resolved::Resolved);
    for _ in 0..2 {
        assert_eq!(
            send_receipt(&idem, &sends, "o-1", false).await.unwrap(),
            "receipt sent by hand"
        );
    }
    assert_eq!(sends.load(SeqCst), 1);
    // A body that fails with an error not to keep clears its mark: the next attempt runs.
    assert!(send_receipt(&idem, &sends, "o-2-fails", false)
        .await
        .is_err());
    assert!(send_receipt(&idem, &sends, "o-2-fails", false)
        .await
        .is_err());
    assert_eq!(sends.load(SeqCst), 3);
    // A body that succeeds leaves nothing of its mark behind.
    assert_eq!(
        send_receipt(&idem, &sends, "o-3", false).await.unwrap(),
        "receipt for o-3"
    );
    tokio::time::sleep(Duration::from_millis(10)).await;
    let mark = Key::new(module_path!().to_owned() + "::send_receipt", "o-3")
        .unwrap()
        .step("call")
        .unwrap();
    assert!(idem.store().get(&mark).await.unwrap().is_none());
}
