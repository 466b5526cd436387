//! Hostile review of at-most-once steps and calls, on the memory store with a paused clock.

mod support;

use std::sync::atomic::{AtomicU32, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

use idem::{
    steps::Resolution, steps::Resolved, steps::Step, Error, Fingerprint, Idem, Key, MemoryStore,
};

fn key(id: &str) -> Key {
    Key::new("tests::amo_attack", id).unwrap()
}

fn ambiguous() -> Error {
    support::engine::ambiguous("gateway timeout")
}

fn idem(lease: u64) -> Idem {
    Idem::builder()
        .store(MemoryStore::new())
        .lease(Duration::from_secs(lease))
        .build()
        .unwrap()
}

/// A1: `call` resolved as ran with a value of the wrong type. Every later attempt must not run
/// the body, and there must be a way out (resolving again, with the right type).
#[tokio::test(start_paused = true)]
async fn a1_call_resolved_with_wrong_type_has_a_way_out() {
    let idem = idem(5);
    let runs = AtomicU32::new(0);
    let k = key("a1");
    let go = |hang: bool| {
        let runs = &runs;
        idem.call(k.clone(), Fingerprint::NONE)
            .at_most_once()
            .run(move || async move {
                runs.fetch_add(1, SeqCst);
                if hang {
                    std::future::pending::<()>().await;
                }
                7u32
            })
    };
    assert!(tokio::time::timeout(Duration::from_secs(1), go(true))
        .await
        .is_err());
    tokio::time::sleep(Duration::from_secs(6)).await;
    let out = go(false).await;
    assert!(matches!(out, Err(Error::OutcomeUnknown { .. })), "{out:?}");
    let r = idem
        .resolve(&k, "call", Resolution::ran("not a number").unwrap())
        .await
        .unwrap();
    assert_eq!(r, Resolved::Resolved);
    let mut last = None;
    for _ in 0..3 {
        let out = go(false).await;
        eprintln!("after wrong-typed resolution: {out:?}");
        last = Some(out);
        tokio::time::sleep(Duration::from_secs(6)).await;
    }
    assert_eq!(runs.load(SeqCst), 1, "the body ran again");
    // The way out: resolve again with the right type.
    let again = idem
        .resolve(&k, "call", Resolution::ran(&9u32).unwrap())
        .await;
    eprintln!("second resolution: {again:?}");
    let out = go(false).await;
    eprintln!("after second resolution: {out:?}");
    assert_eq!(
        out.ok(),
        Some(9),
        "no way out after a wrong-typed resolution of `call` (last: {last:?}, second resolve: {again:?})"
    );
    assert_eq!(runs.load(SeqCst), 1);
}

/// A2: an at-most-once call whose body has its own step named `call`.
#[tokio::test(start_paused = true)]
async fn a2_body_step_named_call() {
    let idem = idem(5);
    let runs = AtomicU32::new(0);
    let k = key("a2");
    let go = || {
        let runs = &runs;
        idem.call(k.clone(), Fingerprint::NONE)
            .at_most_once()
            .run_fallible(move || async move {
                let v: u32 = Step::new("call")
                    .run(|| async {
                        runs.fetch_add(1, SeqCst);
                        Ok::<_, Error>(5u32)
                    })
                    .await?;
                Ok::<_, Error>(v + 1)
            })
    };
    let out = go().await;
    eprintln!("step named call inside at-most-once call: {out:?}");
    // Whatever the answer, it must not silently run twice, and a second call must agree.
    let out2 = go().await;
    eprintln!("second: {out2:?}");
    assert!(
        runs.load(SeqCst) <= 1,
        "step ran {} times",
        runs.load(SeqCst)
    );
    if let Ok(v) = &out {
        assert_eq!(*v, 6);
        assert_eq!(out2.as_ref().ok(), Some(&6));
    }
}

/// A3: dropped at every await: before the mark (first poll), between mark and body, in
/// the body, after the body before the result. The body must never run twice.
#[tokio::test(start_paused = true)]
async fn a3_drop_at_every_point_never_runs_twice() {
    for (i, stop_after_ms) in [0u64, 1, 50, 150].into_iter().enumerate() {
        let idem = idem(5);
        let runs = Arc::new(AtomicU32::new(0));
        let k = key(&format!("a3-{i}"));
        let go = |slow: bool| {
            let runs = runs.clone();
            idem.call(k.clone(), Fingerprint::NONE)
                .at_most_once()
                .run(move || async move {
                    if slow {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    runs.fetch_add(1, SeqCst);
                    if slow {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    3u32
                })
        };
        let first = tokio::time::timeout(Duration::from_millis(stop_after_ms), go(true)).await;
        tokio::time::sleep(Duration::from_secs(6)).await;
        let second = go(false).await;
        eprintln!(
            "stop after {stop_after_ms}ms: first {first:?}, second {second:?}, runs {}",
            runs.load(SeqCst)
        );
        assert!(
            runs.load(SeqCst) <= 1,
            "ran twice, stop after {stop_after_ms}ms"
        );
        if runs.load(SeqCst) == 1 {
            assert!(
                matches!(second, Err(Error::OutcomeUnknown { .. })) || second.is_ok(),
                "{second:?}"
            );
        }
    }
}

/// A4: a resolution of `call` as not-ran while the original attempt still runs its body,
/// then the original is dropped: a later attempt runs the body a second time.
#[tokio::test(start_paused = true)]
async fn a4_not_ran_resolution_while_the_body_runs() {
    let idem = idem(5);
    let runs = Arc::new(AtomicU32::new(0));
    let k = key("a4");
    let go = |hang: bool| {
        let runs = runs.clone();
        idem.call(k.clone(), Fingerprint::NONE)
            .at_most_once()
            .run(move || async move {
                runs.fetch_add(1, SeqCst);
                if hang {
                    std::future::pending::<()>().await;
                }
                3u32
            })
    };
    let first = go(true);
    tokio::pin!(first);
    // Let it mark and enter the body.
    assert!(tokio::time::timeout(Duration::from_millis(10), &mut first)
        .await
        .is_err());
    assert_eq!(runs.load(SeqCst), 1);
    let r = idem.resolve(&k, "call", Resolution::NotRan).await;
    eprintln!("resolve NotRan while the body runs: {r:?}");
    // `first` is never polled again: as if its process had died there.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let out = go(false).await;
    eprintln!("after: {out:?}");
    assert_eq!(
        runs.load(SeqCst),
        1,
        "resolve({r:?}) on a running body's mark let the body run again"
    );
}

/// A5: a resolution of `call` as ran (x) while the original runs, then the original
/// finishes with y: callers must see one value.
#[tokio::test(start_paused = true)]
async fn a5_ran_resolution_races_a_late_original() {
    let idem = idem(5);
    let runs = Arc::new(AtomicU32::new(0));
    let k = key("a5");
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let first = {
        let runs = runs.clone();
        idem.call(k.clone(), Fingerprint::NONE)
            .at_most_once()
            .run(move || async move {
                runs.fetch_add(1, SeqCst);
                let _ = rx.await;
                1u32
            })
    };
    tokio::pin!(first);
    assert!(tokio::time::timeout(Duration::from_millis(10), &mut first)
        .await
        .is_err());
    let r = idem
        .resolve(&k, "call", Resolution::ran(&2u32).unwrap())
        .await;
    eprintln!("resolve Ran(2) while the body runs: {r:?}");
    tx.send(()).unwrap();
    let first = first.await;
    let later = idem
        .call(k.clone(), Fingerprint::NONE)
        .at_most_once()
        .run(|| async { 99u32 })
        .await;
    eprintln!("first {first:?}, later {later:?}");
    assert_eq!(runs.load(SeqCst), 1);
    if let (Ok(a), Ok(b)) = (&first, &later) {
        assert_eq!(a, b, "two values for one key");
    }
}

/// A6: the body does a side effect outside steps, then an inner at-most-once step's
/// outcome is unknown: after resolving the inner step, the body must not run again.
#[tokio::test(start_paused = true)]
async fn a6_inner_step_held_clears_call_mark_and_body_reruns() {
    let idem = idem(5);
    let body_runs = Arc::new(AtomicU32::new(0));
    let k = key("a6");
    let go = |fail: bool| {
        let body_runs = body_runs.clone();
        idem.call(k.clone(), Fingerprint::NONE)
            .at_most_once()
            .run_fallible(move || async move {
                body_runs.fetch_add(1, SeqCst); // a side effect outside any step
                Step::new("email")
                    .at_most_once()
                    .unknown_if(|_: &Error| true)
                    .run(|| async move {
                        if fail {
                            return Err(ambiguous());
                        }
                        Ok::<_, Error>(1u32)
                    })
                    .await
            })
    };
    let out = go(true).await;
    assert!(matches!(out, Err(Error::OutcomeUnknown { .. })), "{out:?}");
    let r = idem
        .resolve(&k, "email", Resolution::ran(&1u32).unwrap())
        .await;
    eprintln!("resolve email: {r:?}");
    let out = go(false).await;
    eprintln!("after: {out:?}");
    assert_eq!(
        body_runs.load(SeqCst),
        1,
        "an at-most-once body ran twice: its mark was cleared when an inner step held the key"
    );
}

/// A7: cache_errors with at_most_once: a cached error is stored and replayed, body once.
#[tokio::test(start_paused = true)]
async fn a7_cache_errors_with_at_most_once() {
    let idem = idem(5);
    let runs = AtomicU32::new(0);
    let k = key("a7");
    let go = || {
        let runs = &runs;
        idem.call(k.clone(), Fingerprint::NONE)
            .at_most_once()
            .run_caching_errors(
                |e: &Declined| e.0 == "declined",
                move || async move {
                    runs.fetch_add(1, SeqCst);
                    Err::<u32, Declined>(Declined("declined".into()))
                },
            )
    };
    impl_from();
    assert_eq!(go().await, Err(Declined("declined".to_string())));
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(go().await, Err(Declined("declined".to_string())));
    assert_eq!(runs.load(SeqCst), 1);
}
fn impl_from() {}

#[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
struct Declined(String);
impl From<Error> for Declined {
    fn from(e: Error) -> Self {
        Declined(e.to_string())
    }
}

/// A8: changed payload after a crash inside the body, and after a resolution.
#[tokio::test(start_paused = true)]
async fn a8_changed_payload_retries() {
    let idem = idem(5);
    let runs = AtomicU32::new(0);
    let k = key("a8");
    let go = |fp: u32, hang: bool| {
        let runs = &runs;
        idem.call(k.clone(), Fingerprint::of(&fp))
            .at_most_once()
            .run(move || async move {
                runs.fetch_add(1, SeqCst);
                if hang {
                    std::future::pending::<()>().await;
                }
                fp
            })
    };
    assert!(tokio::time::timeout(Duration::from_secs(1), go(1, true))
        .await
        .is_err());
    tokio::time::sleep(Duration::from_secs(6)).await;
    let other = go(2, false).await;
    eprintln!("other payload while held: {other:?}");
    assert!(
        matches!(
            other,
            Err(Error::KeyReuse { .. }) | Err(Error::OutcomeUnknown { .. })
        ),
        "{other:?}"
    );
    idem.resolve(&k, "call", Resolution::ran(&1u32).unwrap())
        .await
        .unwrap();
    let other = go(2, false).await;
    eprintln!("other payload after resolution: {other:?}");
    assert!(matches!(other, Err(Error::KeyReuse { .. })), "{other:?}");
    assert_eq!(go(1, false).await.unwrap(), 1);
    assert_eq!(runs.load(SeqCst), 1);
}

/// A9: two callers racing an at-most-once call: one runs the body.
#[tokio::test(start_paused = true)]
async fn a9_two_callers() {
    let idem = idem(5);
    let runs = Arc::new(AtomicU32::new(0));
    let k = key("a9");
    let go = || {
        let runs = runs.clone();
        idem.call(k.clone(), Fingerprint::NONE)
            .at_most_once()
            .run(move || async move {
                runs.fetch_add(1, SeqCst);
                tokio::time::sleep(Duration::from_millis(50)).await;
                4u32
            })
    };
    let (a, b) = tokio::join!(go(), go());
    eprintln!("{a:?} {b:?}");
    assert_eq!(runs.load(SeqCst), 1);
}

/// A10: at-most-once step: resolution NotRan racing the still-running step body, which then
/// finishes Ok: the step's side effect must not run again on the next attempt.
#[tokio::test(start_paused = true)]
async fn a10_step_not_ran_resolution_races_running_step() {
    let idem = idem(5);
    let runs = Arc::new(AtomicU32::new(0));
    let k = key("a10");
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let rx = Arc::new(tokio::sync::Mutex::new(Some(rx)));
    let go = || {
        let runs = runs.clone();
        let rx = rx.clone();
        idem.call(k.clone(), Fingerprint::NONE)
            .run_fallible(move || async move {
                Step::new("charge")
                    .at_most_once()
                    .run(|| async move {
                        runs.fetch_add(1, SeqCst);
                        let r = rx.lock().await.take();
                        if let Some(r) = r {
                            let _ = r.await;
                        }
                        Ok::<_, Error>(1u32)
                    })
                    .await
            })
    };
    let first = go();
    tokio::pin!(first);
    assert!(tokio::time::timeout(Duration::from_millis(10), &mut first)
        .await
        .is_err());
    let r = idem.resolve(&k, "charge", Resolution::NotRan).await;
    eprintln!("resolve NotRan on running step: {r:?}");
    tx.send(()).unwrap();
    let first = first.await;
    eprintln!("first: {first:?}");
    tokio::time::sleep(Duration::from_secs(6)).await;
    let second = go().await;
    eprintln!("second: {second:?}, runs {}", runs.load(SeqCst));
    assert_eq!(runs.load(SeqCst), 1, "charged twice");
}

/// A2b: v1 of a call (plain) has a step named `call` that completed, then the body failed
/// with an error not to keep; v2 (a rolling deploy) makes the call at-most-once. The mark
/// finds the old step's value and takes it for the call's resolved result: the body never
/// runs and the caller gets a step's value as the call's result.
#[ignore = "left: a body whose plain step was named `call` before the call became at-most-once must rename it (documented on Call::at_most_once)"]
#[tokio::test(start_paused = true)]
async fn a2b_plain_step_named_call_then_at_most_once_takes_its_value_as_the_result() {
    let idem = idem(5);
    let k = key("a2b");
    let body_runs = AtomicU32::new(0);
    let v1 = idem
        .call(k.clone(), Fingerprint::NONE)
        .run_fallible(|| async {
            let _: u32 = Step::new("call")
                .run(|| async { Ok::<_, Error>(41u32) })
                .await?;
            Err::<u32, Error>(ambiguous())
        })
        .await;
    assert!(v1.is_err());
    let v2 = idem
        .call(k.clone(), Fingerprint::NONE)
        .at_most_once()
        .run(|| async {
            body_runs.fetch_add(1, SeqCst);
            1000u32
        })
        .await;
    eprintln!("v2: {v2:?}, body runs {}", body_runs.load(SeqCst));
    assert!(
        !(matches!(v2, Ok(41)) && body_runs.load(SeqCst) == 0),
        "the at-most-once call answered a step's value (41) as its result without running"
    );
}

/// A11: an at-most-once step dropped after its body returned, before its value replaced the
/// hold: the step is not run again, the key is held until resolved, and resolving works.
#[tokio::test(start_paused = true)]
async fn a11_step_dropped_after_body_before_value() {
    let idem = idem(5);
    let runs = Arc::new(AtomicU32::new(0));
    let k = key("a11");
    let go = |slow: bool| {
        let runs = runs.clone();
        idem.call(k.clone(), Fingerprint::NONE)
            .run_fallible(move || async move {
                let v: u32 = Step::new("charge")
                    .at_most_once()
                    .run(|| async move {
                        runs.fetch_add(1, SeqCst);
                        Ok::<_, Error>(5u32)
                    })
                    .await?;
                if slow {
                    std::future::pending::<()>().await;
                }
                Ok::<_, Error>(v)
            })
    };
    assert!(tokio::time::timeout(Duration::from_millis(10), go(true))
        .await
        .is_err());
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(go(false).await.unwrap(), 5, "the step's value is replayed");
    assert_eq!(runs.load(SeqCst), 1);
}

/// A12: an at-most-once step resolved with a wrong-typed value: its record becomes a hold
/// again (journal::replay), so a second, right resolution gets the key out (contrast A1).
#[tokio::test(start_paused = true)]
async fn a12_step_resolved_with_wrong_type_has_a_way_out() {
    let idem = idem(5);
    let runs = AtomicU32::new(0);
    let k = key("a12");
    let go = |hang: bool| {
        let runs = &runs;
        idem.call(k.clone(), Fingerprint::NONE)
            .run_fallible(move || async move {
                Step::new("charge")
                    .at_most_once()
                    .run(|| async move {
                        runs.fetch_add(1, SeqCst);
                        if hang {
                            std::future::pending::<()>().await;
                        }
                        Ok::<_, Error>(5u32)
                    })
                    .await
            })
    };
    assert!(tokio::time::timeout(Duration::from_secs(1), go(true))
        .await
        .is_err());
    tokio::time::sleep(Duration::from_secs(6)).await;
    idem.resolve(&k, "charge", Resolution::ran("nope").unwrap())
        .await
        .unwrap();
    let out = go(false).await;
    assert!(matches!(out, Err(Error::OutcomeUnknown { .. })), "{out:?}");
    tokio::time::sleep(Duration::from_secs(6)).await;
    let r = idem
        .resolve(&k, "charge", Resolution::ran(&8u32).unwrap())
        .await;
    eprintln!("second resolution: {r:?}");
    assert_eq!(go(false).await.unwrap(), 8);
    assert_eq!(runs.load(SeqCst), 1);
}

mod takeover {
    use super::*;
    use idem::{store::Store, store::StoreError, store::StoreWrapper, store::Token};
    use std::sync::atomic::AtomicBool;

    #[derive(Debug)]
    struct NoExtends {
        inner: MemoryStore,
        refuse: Arc<AtomicBool>,
    }

    #[idem::store::async_trait]
    impl StoreWrapper for NoExtends {
        type Inner = MemoryStore;
        fn inner(&self) -> &MemoryStore {
            &self.inner
        }
        async fn extend(&self, key: &Key, token: Token, lease: Duration) -> Result<(), StoreError> {
            if self.refuse.load(SeqCst) {
                return Err(StoreError::Unavailable {
                    backend: "scripted",
                    source: "refused".into(),
                });
            }
            self.inner.extend(key, token, lease).await
        }
    }

    /// A13: the first attempt's heartbeat fails while the at-most-once body runs; a second
    /// caller takes the key over after the lease: it must not run the body; then the first
    /// finishes.
    #[tokio::test(start_paused = true)]
    async fn a13_takeover_while_the_first_runs_the_body() {
        let refuse = Arc::new(AtomicBool::new(true));
        let idem = Idem::builder()
            .store(NoExtends {
                inner: MemoryStore::new(),
                refuse: refuse.clone(),
            })
            .lease(Duration::from_secs(5))
            .build()
            .unwrap();
        let runs = Arc::new(AtomicU32::new(0));
        let k = key("a13");
        let go = |wait: u64| {
            let runs = runs.clone();
            idem.call(k.clone(), Fingerprint::NONE)
                .at_most_once()
                .run(move || async move {
                    runs.fetch_add(1, SeqCst);
                    tokio::time::sleep(Duration::from_secs(wait)).await;
                    wait as u32
                })
        };
        let first = go(20);
        let second = async {
            tokio::time::sleep(Duration::from_secs(7)).await;
            go(0).await
        };
        let (a, b) = tokio::join!(first, second);
        eprintln!("first {a:?}, second {b:?}, runs {}", runs.load(SeqCst));
        assert_eq!(runs.load(SeqCst), 1, "body ran twice on a takeover");
        let third = go(0).await;
        eprintln!("third {third:?}");
        assert_eq!(runs.load(SeqCst), 1);
    }

    /// A14: same with an at-most-once step inside a plain call.
    #[tokio::test(start_paused = true)]
    async fn a14_takeover_while_the_first_runs_an_amo_step() {
        let refuse = Arc::new(AtomicBool::new(true));
        let idem = Idem::builder()
            .store(NoExtends {
                inner: MemoryStore::new(),
                refuse: refuse.clone(),
            })
            .lease(Duration::from_secs(5))
            .build()
            .unwrap();
        let runs = Arc::new(AtomicU32::new(0));
        let k = key("a14");
        let go = |wait: u64| {
            let runs = runs.clone();
            idem.call(k.clone(), Fingerprint::NONE)
                .run_fallible(move || async move {
                    Step::new("charge")
                        .at_most_once()
                        .run(|| async move {
                            runs.fetch_add(1, SeqCst);
                            tokio::time::sleep(Duration::from_secs(wait)).await;
                            Ok::<_, Error>(wait as u32)
                        })
                        .await
                })
        };
        let first = go(20);
        let second = async {
            tokio::time::sleep(Duration::from_secs(7)).await;
            go(0).await
        };
        let (a, b) = tokio::join!(first, second);
        eprintln!("first {a:?}, second {b:?}, runs {}", runs.load(SeqCst));
        let third = go(0).await;
        eprintln!("third {third:?}");
        assert_eq!(runs.load(SeqCst), 1, "step ran twice on a takeover");
    }
}
