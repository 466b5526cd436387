//! The engine's promises when a call or its store fails, through the facade: a body that
//! errs, panics or is dropped releases its claim (unless its error is cached), the heartbeat
//! keeps a long body's lease, a holder whose key was taken over gets `LeaseLost` (its body
//! cancelled at the loss by default, or run to its end when asked), an
//! unreachable store fails closed, and a failed or lost `complete` is retried.

mod support;

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idem::{store::Record, store::Store, Error, Fingerprint, LeaseLoss};
use support::engine::{key, setup, wait_until_released, PayError};

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
    assert!(idem.forget_forced(&k).await.unwrap());
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

/// A body of 100 steps of 100 ms, under a 3 s lease; its key is taken over at 0.5 s (an
/// operator's `forget`, then another caller's run). Answers the first call's result, its
/// steps when it answered, and its steps a while later.
async fn body_taken_over_mid_way(mode: LeaseLoss) -> (Result<String, Error>, u32, u32) {
    let (_, idem) = setup();
    let k = key(&format!("taken-over-mid-way-{mode:?}"));
    let steps = Arc::new(AtomicU32::new(0));
    let first = {
        let (idem, k, steps) = (idem.clone(), k.clone(), steps.clone());
        tokio::spawn(async move {
            idem.call(k, Fingerprint::NONE)
                .lease(Duration::from_secs(3))
                .lease_loss(mode)
                .run(|| async move {
                    for _ in 0..100 {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        steps.fetch_add(1, Ordering::SeqCst);
                    }
                    "first".to_string()
                })
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(idem.forget_forced(&k).await.unwrap());
    let second: String = idem
        .call(k.clone(), Fingerprint::NONE)
        .run(|| async { "second".to_string() })
        .await
        .unwrap();
    assert_eq!(second, "second");
    let first = first.await.unwrap();
    let at_answer = steps.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(15)).await;
    let replay: String = idem
        .call(k, Fingerprint::NONE)
        .run(|| async { "third".to_string() })
        .await
        .unwrap();
    assert_eq!(replay, "second", "the successor's result stays");
    (first, at_answer, steps.load(Ordering::SeqCst))
}

#[tokio::test(start_paused = true)]
async fn a_body_whose_lease_is_lost_is_cancelled_by_default() {
    let (first, at_answer, later) = body_taken_over_mid_way(LeaseLoss::Cancel).await;
    assert!(matches!(first, Err(Error::LeaseLost { .. })), "{first:?}");
    // The first beat (at 1 s) is fenced: the body stops there, not after its 100 steps.
    assert!(
        (9..=11).contains(&at_answer),
        "{at_answer} steps ran before the cancel"
    );
    assert_eq!(later, at_answer, "the cancelled body ran on");
}

#[tokio::test(start_paused = true)]
async fn a_body_asked_to_finish_runs_on_after_its_lease_is_lost() {
    let (first, at_answer, later) = body_taken_over_mid_way(LeaseLoss::Finish).await;
    assert!(matches!(first, Err(Error::LeaseLost { .. })), "{first:?}");
    assert_eq!((at_answer, later), (100, 100));
}

#[tokio::test(start_paused = true)]
async fn a_lease_no_extend_secured_for_a_whole_lease_cancels_the_body() {
    let (store, idem) = setup();
    store.fail_extends.store(true, Ordering::SeqCst);
    let steps = Arc::new(AtomicU32::new(0));
    let started = tokio::time::Instant::now();
    let out = {
        let steps = steps.clone();
        idem.call(key("no-extend-secured"), Fingerprint::NONE)
            .lease(Duration::from_secs(3))
            .run(|| async move {
                for _ in 0..100 {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    steps.fetch_add(1, Ordering::SeqCst);
                }
                "done".to_string()
            })
            .await
    };
    let took = started.elapsed();
    assert!(matches!(out, Err(Error::LeaseLost { .. })), "{out:?}");
    // Extends at 1 s and 2 s failed; at 3 s the claim's lease is over.
    assert!(
        took >= Duration::from_secs(3) && took < Duration::from_millis(3200),
        "{took:?}"
    );
    assert!(store.extends.load(Ordering::SeqCst) >= 2);
    let at_answer = steps.load(Ordering::SeqCst);
    assert!((29..=31).contains(&at_answer), "{at_answer} steps");
    tokio::time::sleep(Duration::from_secs(15)).await;
    assert_eq!(steps.load(Ordering::SeqCst), at_answer);
}
