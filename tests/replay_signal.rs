//! The replay signal: a caller tells a first run from a replay, and a replay from the store
//! from one from the local cache, through the engine API (`Call::with_outcome`) and the
//! macro (a return type `idem::Outcome<T>` or `Result<idem::Outcome<T>, E>`).

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idem::{idempotent, Error, Fingerprint, Idem, InProgress, Key, MemoryStore, Origin, Outcome};

fn key(id: &str) -> Key {
    Key::new("replay-signal", id).unwrap()
}

#[derive(Debug, PartialEq)]
enum AppError {
    Declined,
    Idem(String),
}

impl From<Error> for AppError {
    fn from(e: Error) -> Self {
        AppError::Idem(e.to_string())
    }
}

// --- the engine API ---------------------------------------------------------------------

#[tokio::test]
async fn a_first_run_is_ran_and_every_later_call_is_a_replay_from_the_store() {
    let idem = Idem::new(MemoryStore::new());
    let runs = AtomicU32::new(0);
    let body = || async { runs.fetch_add(1, Ordering::SeqCst) + 100 };
    let first = idem
        .call(key("value"), Fingerprint::NONE)
        .with_outcome()
        .run(body)
        .await
        .unwrap();
    assert_eq!(first, Outcome::new(100, Origin::Ran));
    assert!(!first.is_replay());
    for _ in 0..3 {
        let again = idem
            .call(key("value"), Fingerprint::NONE)
            .with_outcome()
            .run(body)
            .await
            .unwrap();
        assert_eq!(again, Outcome::new(100, Origin::Store));
        assert!(again.is_replay());
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_fallible_body_reports_where_its_ok_came_from_and_an_err_is_not_a_replay() {
    let idem = Idem::new(MemoryStore::new());
    let runs = AtomicU32::new(0);
    let body = || async {
        match runs.fetch_add(1, Ordering::SeqCst) {
            0 => Err(AppError::Declined),
            n => Ok(format!("receipt-{n}")),
        }
    };
    let failed: Result<Outcome<String>, AppError> = idem
        .call(key("fallible"), Fingerprint::NONE)
        .with_outcome()
        .run_fallible(body)
        .await;
    assert_eq!(failed, Err(AppError::Declined));
    let ran = idem
        .call(key("fallible"), Fingerprint::NONE)
        .with_outcome()
        .run_fallible(body)
        .await
        .unwrap();
    assert_eq!(ran, Outcome::new("receipt-1".to_string(), Origin::Ran));
    let replay = idem
        .call(key("fallible"), Fingerprint::NONE)
        .with_outcome()
        .run_fallible(body)
        .await
        .unwrap();
    assert_eq!(replay, Outcome::new("receipt-1".to_string(), Origin::Store));
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_replay_from_the_local_cache_says_so() {
    let idem = Idem::builder()
        .store(MemoryStore::new())
        .local_cache(16, Duration::from_secs(60))
        .build()
        .unwrap();
    let call = || idem.call(key("cached"), Fingerprint::NONE).with_outcome();
    let origins = [
        call().run(|| async { 1u8 }).await.unwrap().origin(),
        call().run(|| async { 2u8 }).await.unwrap().origin(),
        call().run(|| async { 3u8 }).await.unwrap().origin(),
    ];
    // The first call stores the result and the local cache; replays skip the store.
    assert_eq!(
        origins,
        [Origin::Ran, Origin::LocalCache, Origin::LocalCache]
    );

    // Another engine on the same store has nothing cached: its replay is the store's.
    let other = Idem::new(idem.store().clone());
    let replay = other
        .call(key("cached"), Fingerprint::NONE)
        .with_outcome()
        .run(|| async { 4u8 })
        .await
        .unwrap();
    assert_eq!(replay, Outcome::new(1, Origin::Store));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn of_fifty_concurrent_duplicates_exactly_one_ran() {
    let idem = Arc::new(Idem::new(MemoryStore::new()));
    let runs = Arc::new(AtomicU32::new(0));
    let tasks: Vec<_> = (0..50)
        .map(|_| {
            let (idem, runs) = (idem.clone(), runs.clone());
            tokio::spawn(async move {
                idem.call(key("concurrent"), Fingerprint::NONE)
                    .in_progress(InProgress::Wait)
                    .with_outcome()
                    .run(|| async {
                        runs.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(30)).await;
                        7u32
                    })
                    .await
                    .unwrap()
            })
        })
        .collect();
    let mut ran = 0;
    for task in tasks {
        let out = task.await.unwrap();
        assert_eq!(*out.value(), 7);
        if out.origin() == Origin::Ran {
            ran += 1;
        } else {
            assert_eq!(out.origin(), Origin::Store);
        }
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(ran, 1, "exactly the call that ran says so");
}

#[tokio::test]
async fn a_key_reuse_is_an_error_not_an_outcome() {
    let idem = Idem::new(MemoryStore::new());
    let call = |fp: &str| idem.call(key("reuse"), Fingerprint::of(fp)).with_outcome();
    let first = call("a").run(|| async { 1u8 }).await.unwrap();
    assert_eq!(first.origin(), Origin::Ran);
    let err = call("b").run(|| async { 2u8 }).await.unwrap_err();
    assert!(matches!(err, Error::KeyReuse { .. }), "{err:?}");
}

// --- the macro --------------------------------------------------------------------------

#[idempotent(key = id, store = idem, skip(idem, runs), scope = "replay-signal::value")]
async fn value_fn(idem: &Idem, runs: &AtomicU32, id: u32) -> idem::Outcome<u32> {
    // The body returns the value; the function returns it with its origin.
    runs.fetch_add(1, Ordering::SeqCst);
    id * 2
}

#[tokio::test]
async fn a_fn_returning_outcome_gets_the_origin_and_its_body_returns_the_value() {
    let idem = Idem::new(MemoryStore::new());
    let runs = AtomicU32::new(0);
    // A value type `T` declared as `Outcome<T>` becomes `Result<Outcome<T>, idem::Error>`.
    let first: Result<Outcome<u32>, Error> = value_fn(&idem, &runs, 21).await;
    assert_eq!(first.unwrap(), Outcome::new(42, Origin::Ran));
    let again = value_fn(&idem, &runs, 21).await.unwrap();
    assert_eq!(again, Outcome::new(42, Origin::Store));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[idempotent(key = id, store = idem, skip(idem, runs), scope = "replay-signal::fallible")]
async fn fallible_fn(idem: &Idem, runs: &AtomicU32, id: u32) -> Result<Outcome<String>, AppError> {
    if runs.fetch_add(1, Ordering::SeqCst) == 0 {
        return Err(AppError::Declined);
    }
    let receipt = format!("receipt-{id}");
    Ok(receipt)
}

#[tokio::test]
async fn a_fallible_fn_returning_result_of_outcome_tells_a_replay() {
    let idem = Idem::new(MemoryStore::new());
    let runs = AtomicU32::new(0);
    assert_eq!(fallible_fn(&idem, &runs, 5).await, Err(AppError::Declined));
    let ran = fallible_fn(&idem, &runs, 5).await.unwrap();
    assert_eq!(ran, Outcome::new("receipt-5".to_string(), Origin::Ran));
    let replay = fallible_fn(&idem, &runs, 5).await.unwrap();
    assert_eq!(replay.origin(), Origin::Store);
    assert_eq!(replay.into_value(), "receipt-5");
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

#[idem::store::async_trait]
trait Charges {
    async fn charge(&self, order_id: String) -> Result<Outcome<u64>, Error>;
}

struct Gateway {
    idem: Idem,
    charged: AtomicU32,
}

#[idem::store::async_trait]
#[idem::scoped]
impl Charges for Gateway {
    #[idempotent(key = order_id, store = self.idem)]
    async fn charge(&self, order_id: String) -> Result<Outcome<u64>, Error> {
        self.charged.fetch_add(1, Ordering::SeqCst);
        Ok(order_id.len() as u64)
    }
}

#[tokio::test]
async fn an_async_trait_method_returning_outcome_tells_a_replay() {
    let gateway = Gateway {
        idem: Idem::new(MemoryStore::new()),
        charged: AtomicU32::new(0),
    };
    let charges: &dyn Charges = &gateway;
    let first = charges.charge("o-1".into()).await.unwrap();
    let again = charges.charge("o-1".into()).await.unwrap();
    assert_eq!(first, Outcome::new(3, Origin::Ran));
    assert_eq!(again, Outcome::new(3, Origin::Store));
    assert_eq!(gateway.charged.load(Ordering::SeqCst), 1);
}
