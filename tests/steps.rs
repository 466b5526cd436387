//! Steps inside one call (`idem::step`), on the memory store: what a body may and may not
//! do with them, and what the engine does with their records. The same behaviours on every
//! backend, under crashes and concurrency, are in `idem-integration/tests/reliability_steps.rs`.

use std::sync::atomic::{AtomicU32, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

use idem::{
    idempotent, steps::Resolution, steps::Resolved, steps::Step, store::Record, store::Store,
    Error, Fingerprint, Idem, Key, MemoryStore,
};

fn key(id: &str) -> Key {
    Key::new("tests::steps", id).unwrap()
}

fn failure(message: &str) -> Error {
    Error::Config {
        message: message.into(),
        source: None,
    }
}

#[tokio::test]
async fn a_step_outside_a_call_or_in_a_task_the_body_spawned_is_refused() {
    let outside = idem::step("charge", || async { Ok::<_, Error>(1) }).await;
    match outside {
        Err(Error::Step {
            key: None,
            step,
            reason,
        }) => {
            assert_eq!(step, "charge");
            assert!(
                reason.contains("only in the body of an idempotent call"),
                "{reason}"
            );
        }
        other => panic!("expected Error::Step outside a call, got {other:?}"),
    }
    let idem = Idem::new(MemoryStore::new());
    let spawned: Result<u32, Error> = idem
        .call(key("spawned"), Fingerprint::NONE)
        .run_fallible(|| async {
            tokio::spawn(idem::step("charge", || async { Ok::<_, Error>(1) }))
                .await
                .unwrap()
        })
        .await;
    assert!(
        matches!(spawned, Err(Error::Step { key: None, .. })),
        "{spawned:?}"
    );
}

#[tokio::test]
async fn a_name_used_twice_or_not_valid_is_refused_naming_the_key() {
    let idem = Idem::new(MemoryStore::new());
    let runs = AtomicU32::new(0);
    let twice: Result<(), Error> = idem
        .call(key("twice"), Fingerprint::NONE)
        .run_fallible(|| async {
            for _ in 0..2 {
                idem::step("email", || async {
                    runs.fetch_add(1, SeqCst);
                    Ok::<_, Error>(())
                })
                .await?;
            }
            Ok(())
        })
        .await;
    match twice {
        Err(Error::Step {
            key: Some(k),
            step,
            reason,
        }) => {
            assert_eq!((k, step.as_str()), (key("twice"), "email"));
            assert!(
                reason.contains("already ran a step of this name"),
                "{reason}"
            );
        }
        other => panic!("expected Error::Step for a repeated name, got {other:?}"),
    }
    assert_eq!(runs.load(SeqCst), 1, "the second step of the same name ran");
    let bad: Result<(), Error> = idem
        .call(key("bad-name"), Fingerprint::NONE)
        .run_fallible(|| async { idem::step("send email", || async { Ok::<_, Error>(()) }).await })
        .await;
    assert!(
        matches!(&bad, Err(Error::Step { reason, .. }) if reason.contains("ASCII letters")),
        "{bad:?}"
    );
}

#[tokio::test]
async fn step_records_are_deleted_once_the_result_is_stored() {
    let store = MemoryStore::new();
    let idem = Idem::new(store.clone());
    let k = key("cleaned");
    let out: u32 = idem
        .call(k.clone(), Fingerprint::NONE)
        .run_fallible(|| async {
            let a = idem::step("a", || async { Ok::<_, Error>(1) }).await?;
            let b = idem::step("b", || async { Ok::<_, Error>(2) }).await?;
            Ok::<_, Error>(a + b)
        })
        .await
        .unwrap();
    assert_eq!(out, 3);
    for name in ["a", "b"] {
        let record = k.step(name).unwrap();
        let mut left = store.get(&record).await.unwrap();
        for _ in 0..100 {
            if left.is_none() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
            left = store.get(&record).await.unwrap();
        }
        assert!(
            left.is_none(),
            "the record of step {name} is still there: {left:?}"
        );
    }
    assert!(matches!(
        store.get(&k).await.unwrap(),
        Some(Record::Completed { .. })
    ));
}

#[idempotent(key = order, store = idem, skip(idem, charges, fail))]
async fn checkout(
    idem: &Idem,
    charges: &AtomicU32,
    order: String,
    fail: bool,
) -> Result<String, Error> {
    let receipt = idem::step("charge", || async {
        charges.fetch_add(1, SeqCst);
        Ok::<_, Error>(format!("charged {order}"))
    })
    .await?;
    if fail {
        return Err(failure("the stock service is down"));
    }
    Ok(receipt)
}

#[tokio::test]
async fn through_the_macro_a_retry_resumes_after_the_completed_step() {
    let idem = Idem::new(MemoryStore::new());
    let charges = AtomicU32::new(0);
    assert!(checkout(&idem, &charges, "o-9".into(), true).await.is_err());
    assert_eq!(
        checkout(&idem, &charges, "o-9".into(), false)
            .await
            .unwrap(),
        "charged o-9"
    );
    assert_eq!(
        checkout(&idem, &charges, "o-9".into(), false)
            .await
            .unwrap(),
        "charged o-9"
    );
    assert_eq!(charges.load(SeqCst), 1, "the retry charged again");
}

#[tokio::test]
async fn a_nested_idempotent_call_keeps_its_own_key_and_its_own_steps() {
    let store = MemoryStore::new();
    let idem = Idem::new(store.clone());
    let charges = AtomicU32::new(0);
    let outer = key("outer");
    let out: String = idem
        .call(outer.clone(), Fingerprint::NONE)
        .run_fallible(|| async {
            // Both bodies use a step named `charge`: each is its own call's.
            idem::step("charge", || async { Ok::<_, Error>(()) }).await?;
            checkout(&idem, &charges, "nested".into(), false).await
        })
        .await
        .unwrap();
    assert_eq!(out, "charged nested");
    assert_eq!(charges.load(SeqCst), 1);
}

#[tokio::test]
async fn a_held_key_answers_outcome_unknown_until_resolved_and_nothing_else_runs() {
    let idem = Idem::builder()
        .store(MemoryStore::new())
        .local_cache(16, Duration::from_secs(60))
        .build()
        .unwrap();
    let k = key("held");
    let counters = (AtomicU32::new(0), AtomicU32::new(0), AtomicU32::new(0));
    let (bodies, charges, emails) = (&counters.0, &counters.1, &counters.2);
    let attempt = |ambiguous: bool| {
        idem.call(k.clone(), Fingerprint::NONE)
            .run_fallible(move || async move {
                bodies.fetch_add(1, SeqCst);
                let receipt = Step::new("charge")
                    .unknown_if(|e: &Error| matches!(e, Error::WaitTimeout { .. }))
                    .run(|| async move {
                        charges.fetch_add(1, SeqCst);
                        if ambiguous {
                            return Err(Error::WaitTimeout {
                                key: key("gateway"),
                                waited: Duration::from_secs(30),
                            });
                        }
                        Ok(String::from("ch_new"))
                    })
                    .await?;
                // Even a body that goes on after the unknown step stores nothing, and runs no
                // later step.
                idem::step("email", || async move {
                    emails.fetch_add(1, SeqCst);
                    Ok::<_, Error>(())
                })
                .await?;
                Ok::<_, Error>(receipt)
            })
    };
    let first = attempt(true).await;
    assert!(
        matches!(&first, Err(Error::OutcomeUnknown { step, .. }) if step == "charge"),
        "{first:?}"
    );
    for _ in 0..3 {
        let again = attempt(false).await;
        assert!(
            matches!(&again, Err(Error::OutcomeUnknown { .. })),
            "{again:?}"
        );
    }
    assert_eq!(
        (
            bodies.load(SeqCst),
            charges.load(SeqCst),
            emails.load(SeqCst)
        ),
        (1, 1, 0)
    );
    assert_eq!(
        idem.resolve(&k, "email", Resolution::NotRan).await.unwrap(),
        Resolved::NotHeld
    );
    let resolved = idem
        .resolve(&k, "charge", Resolution::ran("ch_found").unwrap())
        .await
        .unwrap();
    assert_eq!(resolved, Resolved::Resolved);
    assert_eq!(attempt(false).await.unwrap(), "ch_found");
    assert_eq!(attempt(false).await.unwrap(), "ch_found");
    assert_eq!(
        (charges.load(SeqCst), emails.load(SeqCst)),
        (1, 1),
        "the resolved step ran again, or the email did not run"
    );
}

#[tokio::test]
async fn resolved_as_not_ran_the_step_runs_on_the_next_call() {
    let idem = Idem::new(MemoryStore::new());
    let k = key("not-ran");
    let counter = AtomicU32::new(0);
    let charges = &counter;
    let attempt = |ambiguous: bool| {
        idem.call(k.clone(), Fingerprint::NONE)
            .run_fallible(move || async move {
                Step::new("charge")
                    .unknown_if(|_: &Error| true)
                    .run(|| async move {
                        charges.fetch_add(1, SeqCst);
                        if ambiguous {
                            Err(failure("connection reset"))
                        } else {
                            Ok(7u32)
                        }
                    })
                    .await
            })
    };
    assert!(matches!(
        attempt(true).await,
        Err(Error::OutcomeUnknown { .. })
    ));
    assert_eq!(
        idem.resolve(&k, "charge", Resolution::NotRan)
            .await
            .unwrap(),
        Resolved::Resolved
    );
    assert_eq!(attempt(false).await.unwrap(), 7);
    assert_eq!(charges.load(SeqCst), 2);
}

#[tokio::test]
async fn the_reconcile_hook_resolves_a_held_key_when_it_knows_and_not_otherwise() {
    let knows = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let asked = Arc::new(AtomicU32::new(0));
    let (k2, a2) = (knows.clone(), asked.clone());
    let idem = Idem::builder()
        .store(MemoryStore::new())
        .reconcile(move |unresolved| {
            let (knows, asked) = (k2.clone(), a2.clone());
            async move {
                asked.fetch_add(1, SeqCst);
                assert_eq!(unresolved.step(), "charge");
                assert_eq!(unresolved.step_key().len(), 32);
                knows
                    .load(SeqCst)
                    .then(|| Resolution::ran(&format!("found {}", unresolved.key().id())).unwrap())
            }
        })
        .build()
        .unwrap();
    let k = key("reconciled");
    let counter = AtomicU32::new(0);
    let charges = &counter;
    let attempt = |ambiguous: bool| {
        idem.call(k.clone(), Fingerprint::NONE)
            .run_fallible(move || async move {
                Step::new("charge")
                    .unknown_if(|_: &Error| true)
                    .run(|| async move {
                        charges.fetch_add(1, SeqCst);
                        if ambiguous {
                            Err(failure("timed out"))
                        } else {
                            Ok(String::from("ch_new"))
                        }
                    })
                    .await
            })
    };
    assert!(matches!(
        attempt(true).await,
        Err(Error::OutcomeUnknown { .. })
    ));
    assert!(
        matches!(attempt(false).await, Err(Error::OutcomeUnknown { .. })),
        "the hook did not know"
    );
    knows.store(true, SeqCst);
    assert_eq!(attempt(false).await.unwrap(), "found reconciled");
    assert_eq!(charges.load(SeqCst), 1);
    assert_eq!(asked.load(SeqCst), 2);
}

#[tokio::test]
async fn a_step_whose_value_cannot_be_stored_keeps_the_claim_instead_of_giving_it_back() {
    let idem = Idem::builder()
        .store(MemoryStore::new())
        .lease(Duration::from_secs(30))
        .build()
        .unwrap();
    let k = key("unrecorded");
    let first: Result<(), Error> = idem
        .call(k.clone(), Fingerprint::NONE)
        .run_fallible(|| async {
            // JSON cannot carry a NaN back: the step ran, and its value cannot be kept.
            idem::step("measure", || async { Ok::<_, Error>(f64::NAN) }).await?;
            Ok(())
        })
        .await;
    assert!(matches!(first, Err(Error::Encode { .. })), "{first:?}");
    let retry: Result<(), Error> = idem
        .call(k.clone(), Fingerprint::NONE)
        .run_fallible(|| async { Ok(()) })
        .await;
    assert!(
        matches!(retry, Err(Error::InProgress { .. })),
        "a retry could run the step again at once: {retry:?}"
    );
}

#[idempotent(key = request_id, store = idem, skip(idem, runs), missing_key = "run")]
async fn unkeyed(idem: &Idem, runs: &AtomicU32, request_id: Option<String>) -> Result<u32, Error> {
    let v = idem::step("charge", || async {
        Ok::<_, Error>(runs.fetch_add(1, SeqCst) + 1)
    })
    .await?;
    assert_eq!(
        idem::steps::step_key("charge").is_ok(),
        request_id.is_some(),
        "a step has a key to hand on exactly when the call has one"
    );
    Ok(v)
}

#[tokio::test]
async fn in_a_body_run_without_a_key_steps_are_plain_code() {
    let idem = Idem::new(MemoryStore::new());
    let runs = AtomicU32::new(0);
    assert_eq!(unkeyed(&idem, &runs, None).await.unwrap(), 1);
    assert_eq!(
        unkeyed(&idem, &runs, None).await.unwrap(),
        2,
        "without a key, each call runs its steps"
    );
    assert_eq!(unkeyed(&idem, &runs, Some("r-1".into())).await.unwrap(), 3);
    assert_eq!(
        unkeyed(&idem, &runs, Some("r-1".into())).await.unwrap(),
        3,
        "with a key, replayed"
    );
}
