//! `#[idempotent]` end to end, through the facade only, as a user writes it. Every side
//! effect is counted with an atomic, so a body that runs once too often fails the test.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idem::{idempotent, Error, Idem, Key, MemoryStore};
use serde::{Deserialize, Serialize};

fn engine() -> Arc<Idem> {
    Arc::new(Idem::new(MemoryStore::new()))
}

fn runs(counter: &AtomicU32) -> u32 {
    counter.load(Ordering::SeqCst)
}

/// Whether the store holds a record under `scope/id`.
async fn stored(idem: &Idem, key: Key) -> bool {
    idem.store().get(&key).await.unwrap().is_some()
}

// --- replay -------------------------------------------------------------------------------

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Receipt {
    order_id: String,
    amount_cents: u64,
    charge_no: u32,
}

#[idempotent(key = order_id, store = idem, skip(idem, charges))]
async fn charge(idem: &Idem, charges: &AtomicU32, order_id: String, amount_cents: u64) -> Receipt {
    let charge_no = charges.fetch_add(1, Ordering::SeqCst) + 1;
    Receipt {
        order_id,
        amount_cents,
        charge_no,
    }
}

#[tokio::test]
async fn a_retry_replays_the_stored_result_and_the_side_effect_happens_once() {
    let idem = engine();
    let charges = AtomicU32::new(0);
    let first = charge(&idem, &charges, "order-42".into(), 1250)
        .await
        .unwrap();
    for _ in 0..5 {
        let again = charge(&idem, &charges, "order-42".into(), 1250)
            .await
            .unwrap();
        assert_eq!(again, first);
    }
    assert_eq!(runs(&charges), 1);
    assert_eq!(first.charge_no, 1);

    // Another key runs again; a string key stays readable in the store.
    let other = charge(&idem, &charges, "order-43".into(), 1250)
        .await
        .unwrap();
    assert_eq!(other.charge_no, 2);
    let scope = concat!(module_path!(), "::charge");
    assert!(stored(&idem, Key::new(scope, "order-42").unwrap()).await);
    assert!(stored(&idem, Key::new(scope, "order-43").unwrap()).await);
}

#[tokio::test]
async fn the_same_key_with_other_arguments_is_refused() {
    let idem = engine();
    let charges = AtomicU32::new(0);
    charge(&idem, &charges, "order-1".into(), 1000)
        .await
        .unwrap();
    let err = charge(&idem, &charges, "order-1".into(), 9999)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::KeyReuse { .. }), "{err:?}");
    assert_eq!(runs(&charges), 1);
}

// --- concurrency ----------------------------------------------------------------------------

#[idempotent(key = key_id, store = idem, skip(idem, executions))]
async fn slow_reject(idem: Arc<Idem>, executions: Arc<AtomicU32>, key_id: u32) -> String {
    executions.fetch_add(1, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(30)).await;
    format!("value-{key_id}")
}

#[idempotent(key = key_id, store = idem, skip(idem, executions), in_progress = "wait", wait_timeout = "20s")]
async fn slow_wait(idem: Arc<Idem>, executions: Arc<AtomicU32>, key_id: u32) -> String {
    executions.fetch_add(1, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(30)).await;
    format!("value-{key_id}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_thousand_concurrent_calls_over_a_hundred_keys_run_a_hundred_times_in_reject_mode() {
    let idem = engine();
    let executions = Arc::new(AtomicU32::new(0));
    let tasks: Vec<_> = (0..1000u32)
        .map(|i| {
            let (idem, executions) = (idem.clone(), executions.clone());
            let key_id = i % 100;
            tokio::spawn(async move { (key_id, slow_reject(idem, executions, key_id).await) })
        })
        .collect();
    let mut answered: HashMap<u32, u32> = HashMap::new();
    let mut rejected = 0;
    for task in tasks {
        let (key_id, out) = task.await.unwrap();
        match out {
            Ok(value) => {
                assert_eq!(value, format!("value-{key_id}"));
                *answered.entry(key_id).or_default() += 1;
            }
            Err(Error::InProgress { retry_after, .. }) => {
                assert!(retry_after > Duration::ZERO);
                rejected += 1;
            }
            Err(e) => panic!("unexpected error: {e}"),
        }
    }
    assert_eq!(runs(&executions), 100);
    // Every key's first caller ran it; duplicates were rejected while it ran.
    assert_eq!(answered.len(), 100);
    assert!(
        rejected > 0,
        "no duplicate arrived while the first call ran"
    );

    // Once they are done, every key replays.
    for key_id in 0..100 {
        let value = slow_reject(idem.clone(), executions.clone(), key_id)
            .await
            .unwrap();
        assert_eq!(value, format!("value-{key_id}"));
    }
    assert_eq!(runs(&executions), 100);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_thousand_concurrent_calls_over_a_hundred_keys_run_a_hundred_times_in_wait_mode() {
    let idem = engine();
    let executions = Arc::new(AtomicU32::new(0));
    let tasks: Vec<_> = (0..1000u32)
        .map(|i| {
            let (idem, executions) = (idem.clone(), executions.clone());
            let key_id = i % 100;
            tokio::spawn(async move { (key_id, slow_wait(idem, executions, key_id).await) })
        })
        .collect();
    for task in tasks {
        let (key_id, out) = task.await.unwrap();
        assert_eq!(out.unwrap(), format!("value-{key_id}"));
    }
    assert_eq!(runs(&executions), 100);
}

// --- errors ---------------------------------------------------------------------------------

#[derive(Debug, PartialEq, Serialize, Deserialize)]
enum PaymentError {
    Declined { reason: String },
    GatewayTimeout,
    Idem(String),
}

impl From<Error> for PaymentError {
    fn from(e: Error) -> Self {
        PaymentError::Idem(e.to_string())
    }
}

#[idempotent(key = order_id, store = idem, skip(idem, attempts, fail_first))]
async fn flaky(
    idem: &Idem,
    attempts: &AtomicU32,
    fail_first: u32,
    order_id: u64,
) -> Result<u64, PaymentError> {
    let attempt = attempts.fetch_add(1, Ordering::SeqCst) + 1;
    if attempt <= fail_first {
        return Err(PaymentError::GatewayTimeout);
    }
    Ok(order_id * 10)
}

#[tokio::test]
async fn an_err_releases_the_claim_and_the_next_call_runs_again() {
    let idem = engine();
    let attempts = AtomicU32::new(0);
    assert_eq!(
        flaky(&idem, &attempts, 2, 7).await,
        Err(PaymentError::GatewayTimeout)
    );
    assert_eq!(
        flaky(&idem, &attempts, 2, 7).await,
        Err(PaymentError::GatewayTimeout)
    );
    assert_eq!(flaky(&idem, &attempts, 2, 7).await, Ok(70));
    assert_eq!(flaky(&idem, &attempts, 2, 7).await, Ok(70));
    assert_eq!(runs(&attempts), 3);
}

#[idempotent(
    key = order_id,
    store = idem,
    skip(idem, attempts, outcome),
    cache_errors = |e| matches!(e, PaymentError::Declined { .. }),
)]
async fn pay(
    idem: &Idem,
    attempts: &AtomicU32,
    outcome: &str,
    order_id: u64,
) -> Result<u64, PaymentError> {
    attempts.fetch_add(1, Ordering::SeqCst);
    match outcome {
        "declined" => Err(PaymentError::Declined {
            reason: "insufficient funds".into(),
        }),
        "timeout" => Err(PaymentError::GatewayTimeout),
        _ => Ok(order_id),
    }
}

#[tokio::test]
async fn cache_errors_stores_the_chosen_error_and_releases_the_others() {
    let idem = engine();
    let attempts = AtomicU32::new(0);
    let declined = PaymentError::Declined {
        reason: "insufficient funds".into(),
    };
    // A declined card stays declined: the error is stored and replayed, even when the
    // retry would now succeed.
    assert_eq!(pay(&idem, &attempts, "declined", 1).await, Err(declined));
    let replay = pay(&idem, &attempts, "ok", 1).await;
    assert!(
        matches!(replay, Err(PaymentError::Declined { .. })),
        "{replay:?}"
    );
    assert_eq!(runs(&attempts), 1);

    // A timeout is not chosen: it releases the key and the retry runs.
    assert_eq!(
        pay(&idem, &attempts, "timeout", 2).await,
        Err(PaymentError::GatewayTimeout)
    );
    assert_eq!(pay(&idem, &attempts, "ok", 2).await, Ok(2));
    assert_eq!(pay(&idem, &attempts, "timeout", 2).await, Ok(2));
    assert_eq!(runs(&attempts), 3);
}

#[idempotent(key = order_id, store = idem, skip(idem, attempts), cache_errors)]
async fn pay_caching_every_error(
    idem: &Idem,
    attempts: &AtomicU32,
    order_id: u64,
) -> Result<u64, PaymentError> {
    let attempt = attempts.fetch_add(1, Ordering::SeqCst);
    if attempt == 0 {
        return Err(PaymentError::GatewayTimeout);
    }
    Ok(order_id)
}

#[tokio::test]
async fn bare_cache_errors_stores_every_error() {
    let idem = engine();
    let attempts = AtomicU32::new(0);
    for _ in 0..3 {
        assert_eq!(
            pay_caching_every_error(&idem, &attempts, 5).await,
            Err(PaymentError::GatewayTimeout)
        );
    }
    assert_eq!(runs(&attempts), 1);
}

// --- keys, fingerprints, scopes ---------------------------------------------------------------

#[idempotent(store = idem, skip(idem, calls, request_id))]
async fn digest_keyed(idem: &Idem, calls: &AtomicU32, request_id: u64, user: String) -> u32 {
    let _ = request_id;
    calls.fetch_add(1, Ordering::SeqCst) + 1
}

#[tokio::test]
async fn skipped_arguments_are_not_part_of_the_key() {
    let idem = engine();
    let calls = AtomicU32::new(0);
    // Without `key`, the id is the digest of every argument not skipped: `user` only.
    assert_eq!(
        digest_keyed(&idem, &calls, 1, "ada".into()).await.unwrap(),
        1
    );
    assert_eq!(
        digest_keyed(&idem, &calls, 2, "ada".into()).await.unwrap(),
        1
    );
    assert_eq!(
        digest_keyed(&idem, &calls, 1, "bob".into()).await.unwrap(),
        2
    );
    assert_eq!(runs(&calls), 2);
    let scope = concat!(module_path!(), "::digest_keyed");
    let ada = Key::digest(scope, &(&"ada".to_string(),)).unwrap();
    assert!(stored(&idem, ada).await);
}

#[idempotent(key = event_id, store = idem, skip(idem, calls), fingerprint = none)]
async fn unchecked(idem: &Idem, calls: &AtomicU32, event_id: String, payload: String) -> String {
    calls.fetch_add(1, Ordering::SeqCst);
    payload
}

#[tokio::test]
async fn fingerprint_none_replays_whatever_the_payload() {
    let idem = engine();
    let calls = AtomicU32::new(0);
    let first = unchecked(&idem, &calls, "evt-1".into(), "first".into()).await;
    let second = unchecked(&idem, &calls, "evt-1".into(), "second".into()).await;
    assert_eq!(first.unwrap(), "first");
    assert_eq!(second.unwrap(), "first");
    assert_eq!(runs(&calls), 1);
}

#[idempotent(key = order_id, store = idem, skip(idem, calls), fingerprint = amount)]
async fn fingerprinted(
    idem: &Idem,
    calls: &AtomicU32,
    order_id: u32,
    amount: u64,
    note: String,
) -> u64 {
    calls.fetch_add(1, Ordering::SeqCst);
    let _ = note;
    amount
}

#[tokio::test]
async fn an_explicit_fingerprint_checks_only_what_it_names() {
    let idem = engine();
    let calls = AtomicU32::new(0);
    assert_eq!(
        fingerprinted(&idem, &calls, 1, 10, "a".into())
            .await
            .unwrap(),
        10
    );
    // Another note: same fingerprint, replay.
    assert_eq!(
        fingerprinted(&idem, &calls, 1, 10, "b".into())
            .await
            .unwrap(),
        10
    );
    // Another amount: refused.
    let err = fingerprinted(&idem, &calls, 1, 11, "a".into())
        .await
        .unwrap_err();
    assert!(matches!(err, Error::KeyReuse { .. }), "{err:?}");
    assert_eq!(runs(&calls), 1);
}

#[idempotent(store = idem, skip(idem, calls))]
async fn first_fn(idem: &Idem, calls: &AtomicU32, id: u32) -> u32 {
    calls.fetch_add(1, Ordering::SeqCst);
    id
}

#[idempotent(store = idem, skip(idem, calls))]
async fn second_fn(idem: &Idem, calls: &AtomicU32, id: u32) -> u32 {
    calls.fetch_add(1, Ordering::SeqCst);
    id + 1000
}

#[idempotent(store = idem, skip(idem, calls), scope = "e2e::shared")]
async fn shared_a(idem: &Idem, calls: &AtomicU32, id: u32) -> u32 {
    calls.fetch_add(1, Ordering::SeqCst);
    id
}

#[idempotent(store = idem, skip(idem, calls), scope = "e2e::shared")]
async fn shared_b(idem: &Idem, calls: &AtomicU32, id: u32) -> u32 {
    calls.fetch_add(1, Ordering::SeqCst);
    id + 1000
}

#[idempotent(key = order_id, store = idem, skip(idem, calls), fingerprint = idem::Fingerprint::of(&amount))]
async fn precomputed(idem: &Idem, calls: &AtomicU32, order_id: u32, amount: u64) -> u64 {
    calls.fetch_add(1, Ordering::SeqCst);
    amount
}

#[tokio::test]
async fn a_fingerprint_value_is_used_as_is() {
    let idem = engine();
    let calls = AtomicU32::new(0);
    assert_eq!(precomputed(&idem, &calls, 1, 10).await.unwrap(), 10);
    assert_eq!(precomputed(&idem, &calls, 1, 10).await.unwrap(), 10);
    let err = precomputed(&idem, &calls, 1, 11).await.unwrap_err();
    assert!(matches!(err, Error::KeyReuse { .. }), "{err:?}");
    assert_eq!(runs(&calls), 1);
}

#[tokio::test]
async fn two_functions_share_keys_only_through_an_explicit_scope() {
    let idem = engine();
    let calls = AtomicU32::new(0);
    // Identical arguments, default scopes (module path and name): two keys.
    assert_eq!(first_fn(&idem, &calls, 1).await.unwrap(), 1);
    assert_eq!(second_fn(&idem, &calls, 1).await.unwrap(), 1001);
    assert_eq!(runs(&calls), 2);
    // One explicit scope: one key, so the second function replays the first's result.
    assert_eq!(shared_a(&idem, &calls, 1).await.unwrap(), 1);
    assert_eq!(shared_b(&idem, &calls, 1).await.unwrap(), 1);
    assert_eq!(runs(&calls), 3);
    let id = idem_core::digest_hex(&(&1u32,));
    assert!(stored(&idem, Key::new("e2e::shared", id).unwrap()).await);
}

// --- results that look like nothing ---------------------------------------------------------

#[idempotent(key = id, store = idem, skip(idem, calls))]
async fn returns_unit(idem: &Idem, calls: &AtomicU32, id: u32) {
    calls.fetch_add(1, Ordering::SeqCst);
}

#[idempotent(key = id, store = idem, skip(idem, calls))]
async fn returns_none(idem: &Idem, calls: &AtomicU32, id: u32) -> Option<String> {
    calls.fetch_add(1, Ordering::SeqCst);
    None
}

#[idempotent(key = id, store = idem, skip(idem, calls))]
async fn returns_zero(idem: &Idem, calls: &AtomicU32, id: u32) -> u64 {
    calls.fetch_add(1, Ordering::SeqCst);
    0
}

#[idempotent(key = id, store = idem, skip(idem, calls))]
async fn returns_false(idem: &Idem, calls: &AtomicU32, id: u32) -> bool {
    calls.fetch_add(1, Ordering::SeqCst);
    false
}

#[idempotent(key = id, store = idem, skip(idem, calls))]
async fn returns_empty(idem: &Idem, calls: &AtomicU32, id: u32) -> String {
    calls.fetch_add(1, Ordering::SeqCst);
    String::new()
}

#[idempotent(key = id, store = idem, skip(idem, calls))]
async fn returns_ok_unit(idem: &Idem, calls: &AtomicU32, id: u32) -> Result<(), Error> {
    calls.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

#[tokio::test]
async fn empty_looking_results_are_stored_and_replayed_not_run_again() {
    let idem = engine();
    let calls = AtomicU32::new(0);
    for _ in 0..3 {
        returns_unit(&idem, &calls, 1).await.unwrap();
    }
    assert_eq!(runs(&calls), 1);
    for _ in 0..3 {
        assert_eq!(returns_none(&idem, &calls, 1).await.unwrap(), None);
    }
    assert_eq!(runs(&calls), 2);
    for _ in 0..3 {
        assert_eq!(returns_zero(&idem, &calls, 1).await.unwrap(), 0);
    }
    assert_eq!(runs(&calls), 3);
    for _ in 0..3 {
        assert!(!returns_false(&idem, &calls, 1).await.unwrap());
    }
    assert_eq!(runs(&calls), 4);
    for _ in 0..3 {
        assert_eq!(returns_empty(&idem, &calls, 1).await.unwrap(), "");
    }
    assert_eq!(runs(&calls), 5);
    for _ in 0..3 {
        returns_ok_unit(&idem, &calls, 1).await.unwrap();
    }
    assert_eq!(runs(&calls), 6);
}

// --- expiry ---------------------------------------------------------------------------------

#[idempotent(key = id, store = idem, skip(idem, calls), ttl = "1s")]
async fn short_lived(idem: &Idem, calls: &AtomicU32, id: u32) -> u32 {
    calls.fetch_add(1, Ordering::SeqCst) + 1
}

#[idempotent(key = id, store = idem, skip(idem, calls), ttl = Duration::from_secs(60))]
async fn minute_lived(idem: &Idem, calls: &AtomicU32, id: u32) -> u32 {
    calls.fetch_add(1, Ordering::SeqCst) + 1
}

#[tokio::test(start_paused = true)]
async fn a_record_expires_with_its_ttl_on_the_store_clock() {
    let idem = engine();
    let calls = AtomicU32::new(0);
    assert_eq!(short_lived(&idem, &calls, 1).await.unwrap(), 1);
    tokio::time::advance(Duration::from_millis(900)).await;
    assert_eq!(short_lived(&idem, &calls, 1).await.unwrap(), 1);
    tokio::time::advance(Duration::from_millis(200)).await;
    // Past the ttl: the body runs again, and its new result is stored.
    assert_eq!(short_lived(&idem, &calls, 1).await.unwrap(), 2);
    assert_eq!(short_lived(&idem, &calls, 1).await.unwrap(), 2);
    assert_eq!(runs(&calls), 2);

    // A `Duration` expression works like a literal.
    let calls = AtomicU32::new(0);
    assert_eq!(minute_lived(&idem, &calls, 1).await.unwrap(), 1);
    tokio::time::advance(Duration::from_secs(59)).await;
    assert_eq!(minute_lived(&idem, &calls, 1).await.unwrap(), 1);
    tokio::time::advance(Duration::from_secs(2)).await;
    assert_eq!(minute_lived(&idem, &calls, 1).await.unwrap(), 2);
}

// --- engines --------------------------------------------------------------------------------

static GLOBAL_CALLS: AtomicU32 = AtomicU32::new(0);

#[idempotent(key = id, scope = "e2e::on_global")]
async fn on_global(id: String) -> u32 {
    GLOBAL_CALLS.fetch_add(1, Ordering::SeqCst) + 1
}

#[idempotent(key = id, scope = "e2e::on_global", store = idem, skip(idem))]
async fn on_explicit(idem: &Idem, id: String) -> u32 {
    GLOBAL_CALLS.fetch_add(1, Ordering::SeqCst) + 100
}

#[tokio::test]
async fn without_store_the_global_engine_is_used_and_an_explicit_store_is_its_own() {
    // This binary's global engine; only this test uses it.
    idem::set_global(Idem::new(idem::MemoryStore::new())).unwrap();
    let id = "global-1".to_string();
    assert_eq!(on_global(id.clone()).await.unwrap(), 1);
    assert_eq!(on_global(id.clone()).await.unwrap(), 1);
    assert_eq!(runs(&GLOBAL_CALLS), 1);
    let key = Key::new("e2e::on_global", &id).unwrap();
    assert!(stored(idem::global().unwrap(), key.clone()).await);

    // Same scope and key, another engine: nothing stored there yet, so the body runs,
    // and the global engine's record is untouched.
    let idem = engine();
    assert!(!stored(&idem, key.clone()).await);
    assert_eq!(on_explicit(&idem, id.clone()).await.unwrap(), 101);
    assert_eq!(on_explicit(&idem, id.clone()).await.unwrap(), 101);
    assert_eq!(runs(&GLOBAL_CALLS), 2);
    assert_eq!(on_global(id).await.unwrap(), 1);
}

pub struct Service {
    idem: Arc<Idem>,
    sent: AtomicU32,
}

#[idem::scoped]
impl Service {
    #[idempotent(key = (user_id, template), store = self.idem)]
    pub async fn send_email(&self, user_id: u64, template: &str) -> String {
        let n = self.sent.fetch_add(1, Ordering::SeqCst) + 1;
        format!("message-{n} to {user_id} ({template})")
    }
}

#[tokio::test]
async fn a_method_takes_its_engine_from_self() {
    let service = Service {
        idem: engine(),
        sent: AtomicU32::new(0),
    };
    let a = service.send_email(7, "welcome").await.unwrap();
    let b = service.send_email(7, "welcome").await.unwrap();
    let c = service.send_email(7, "receipt").await.unwrap();
    assert_eq!(a, b);
    assert_ne!(a, c);
    assert_eq!(runs(&service.sent), 2);
}

// --- arguments ------------------------------------------------------------------------------

#[idempotent(store = idem, skip(idem, calls), scope = "e2e::mutating")]
async fn mutating(idem: &Idem, calls: &AtomicU32, mut items: Vec<u32>, mut label: String) -> usize {
    calls.fetch_add(1, Ordering::SeqCst);
    items.push(99);
    label.push_str("-changed");
    items.len() + label.len()
}

#[tokio::test]
async fn a_body_that_mutates_its_arguments_does_not_change_its_key() {
    let idem = engine();
    let calls = AtomicU32::new(0);
    let first = mutating(&idem, &calls, vec![1, 2], "a".into())
        .await
        .unwrap();
    let again = mutating(&idem, &calls, vec![1, 2], "a".into())
        .await
        .unwrap();
    assert_eq!(first, again);
    assert_eq!(runs(&calls), 1);
    // The key is the digest of the arguments as they were passed, not as the body left them.
    let as_passed = Key::digest("e2e::mutating", &(&vec![1u32, 2], &"a".to_string())).unwrap();
    assert!(stored(&idem, as_passed).await);
}

#[derive(Serialize)]
struct Point {
    x: i64,
    y: i64,
}

#[idempotent(store = idem, skip(idem, calls))]
async fn destructured(
    idem: &Idem,
    calls: &AtomicU32,
    (a, b): (u32, u32),
    Point { x, y }: Point,
) -> i64 {
    calls.fetch_add(1, Ordering::SeqCst);
    i64::from(a + b) + x + y
}

#[tokio::test]
async fn destructured_arguments_are_digested_by_their_bindings() {
    let idem = engine();
    let calls = AtomicU32::new(0);
    assert_eq!(
        destructured(&idem, &calls, (1, 2), Point { x: 3, y: 4 })
            .await
            .unwrap(),
        10
    );
    assert_eq!(
        destructured(&idem, &calls, (1, 2), Point { x: 3, y: 4 })
            .await
            .unwrap(),
        10
    );
    assert_eq!(
        destructured(&idem, &calls, (2, 1), Point { x: 3, y: 4 })
            .await
            .unwrap(),
        10
    );
    assert_eq!(runs(&calls), 2);
}

// --- #[async_trait] ---------------------------------------------------------------------------

#[idem::store::async_trait]
trait Ledger {
    async fn post(&self, entry_id: String, cents: i64) -> Result<i64, Error>;
}

struct SharedLedger {
    idem: Arc<Idem>,
    posted: AtomicU32,
}

#[idem::store::async_trait]
#[idem::scoped]
impl Ledger for SharedLedger {
    // `#[async_trait]` on the impl expands first; `#[idempotent]` then wraps its future.
    #[idempotent(key = entry_id, store = self.idem, in_progress = "wait")]
    async fn post(&self, entry_id: String, cents: i64) -> Result<i64, Error> {
        self.posted.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(20)).await;
        Ok(cents)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_method_of_an_async_trait_impl_runs_once_per_key_also_through_dyn() {
    let ledger = Arc::new(SharedLedger {
        idem: engine(),
        posted: AtomicU32::new(0),
    });
    let tasks: Vec<_> = (0..50)
        .map(|i| {
            let ledger = ledger.clone();
            tokio::spawn(async move {
                let ledger: &dyn Ledger = &*ledger;
                ledger.post(format!("entry-{}", i % 5), 100).await
            })
        })
        .collect();
    for task in tasks {
        assert_eq!(task.await.unwrap().unwrap(), 100);
    }
    assert_eq!(runs(&ledger.posted), 5);
    let err = ledger.post("entry-0".into(), 999).await.unwrap_err();
    assert!(matches!(err, Error::KeyReuse { .. }), "{err:?}");
    // A trait impl's method is scoped by the qualified path of the impl.
    let scope = concat!(module_path!(), "::<SharedLedger as Ledger>::post");
    assert!(stored(&ledger.idem, Key::new(scope, "entry-0").unwrap()).await);
    assert_eq!(runs(&ledger.posted), 5);
}

// --- key ids ----------------------------------------------------------------------------------

#[idempotent(key = id, store = idem, skip(idem, calls), scope = "e2e::readable")]
async fn by_integer(idem: &Idem, calls: &AtomicU32, id: u64) -> u64 {
    calls.fetch_add(1, Ordering::SeqCst);
    id
}

#[idempotent(key = id, store = idem, skip(idem, calls), scope = "e2e::too_long")]
async fn by_string(idem: &Idem, calls: &AtomicU32, id: String) -> usize {
    calls.fetch_add(1, Ordering::SeqCst);
    id.len()
}

#[tokio::test]
async fn integer_keys_stay_readable_and_an_invalid_key_fails_before_the_body() {
    let idem = engine();
    let calls = AtomicU32::new(0);
    assert_eq!(by_integer(&idem, &calls, 42).await.unwrap(), 42);
    assert!(stored(&idem, Key::new("e2e::readable", "42").unwrap()).await);

    // Over the 1024-byte limit: refused with InvalidKey, and the body never runs.
    let err = by_string(&idem, &calls, "x".repeat(2000))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidKey { .. }), "{err:?}");
    let err = by_string(&idem, &calls, String::new()).await.unwrap_err();
    assert!(matches!(err, Error::InvalidKey { .. }), "{err:?}");
    assert_eq!(runs(&calls), 1);
}

// --- methods of two types -------------------------------------------------------------------

struct Orders {
    idem: Idem,
    runs: AtomicU32,
}

struct Users {
    idem: Idem,
    runs: AtomicU32,
}

#[idem::scoped]
impl Orders {
    #[idempotent(store = self.idem)]
    async fn create(&self, id: u64) -> String {
        self.runs.fetch_add(1, Ordering::SeqCst);
        format!("order {id}")
    }
}

#[idem::scoped]
impl Users {
    #[idempotent(store = self.idem)]
    async fn create(&self, id: u64) -> String {
        self.runs.fetch_add(1, Ordering::SeqCst);
        format!("user {id}")
    }
}

#[tokio::test]
async fn same_named_methods_of_two_types_never_share_keys() {
    let idem = engine();
    let orders = Orders {
        idem: (*idem).clone(),
        runs: AtomicU32::new(0),
    };
    let users = Users {
        idem: (*idem).clone(),
        runs: AtomicU32::new(0),
    };
    for _ in 0..3 {
        assert_eq!(orders.create(7).await.unwrap(), "order 7");
        assert_eq!(users.create(7).await.unwrap(), "user 7");
    }
    assert_eq!((runs(&orders.runs), runs(&users.runs)), (1, 1));
    // A method's default scope is its type's path and its name.
    let scope = concat!(module_path!(), "::Orders::create");
    assert!(stored(&idem, Key::digest(scope, &(&7u64,)).unwrap()).await);
}

// --- `clone_cached`: the local cache keeps the result decoded ------------------------------

/// Counts how often a result type is decoded: serde's derive on a twin, then a tally.
macro_rules! decode_counted {
    ($name:ident, $twin:ident, $count:ident $(, $derive:ident)*) => {
        static $count: AtomicU32 = AtomicU32::new(0);
        #[derive(Debug, PartialEq, Serialize $(, $derive)*)]
        struct $name {
            charge_id: String,
            amount_cents: u64,
        }
        #[derive(Deserialize)]
        struct $twin {
            charge_id: String,
            amount_cents: u64,
        }
        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                $count.fetch_add(1, Ordering::SeqCst);
                let $twin { charge_id, amount_cents } = $twin::deserialize(d)?;
                Ok($name { charge_id, amount_cents })
            }
        }
    };
}
decode_counted!(Shared, SharedTwin, SHARED_DECODES, Clone);
decode_counted!(Unshared, UnsharedTwin, UNSHARED_DECODES);
decode_counted!(Relayed, RelayedTwin, RELAYED_DECODES, Clone);

fn cached_engine() -> Idem {
    Idem::builder()
        .store(MemoryStore::new())
        .local_cache(16, Duration::from_secs(60))
        .build()
        .unwrap()
}

#[idempotent(key = order_id, store = idem, skip(idem, calls), clone_cached)]
async fn charge_shared(idem: &Idem, calls: &AtomicU32, order_id: u32, amount_cents: u64) -> Shared {
    let n = calls.fetch_add(1, Ordering::SeqCst);
    Shared {
        charge_id: format!("ch_{order_id}_{n}"),
        amount_cents,
    }
}

#[idempotent(key = order_id, store = idem, skip(idem, calls))]
async fn charge_unshared(
    idem: &Idem,
    calls: &AtomicU32,
    order_id: u32,
    amount_cents: u64,
) -> Unshared {
    let n = calls.fetch_add(1, Ordering::SeqCst);
    Unshared {
        charge_id: format!("ch_{order_id}_{n}"),
        amount_cents,
    }
}

#[tokio::test]
async fn with_clone_cached_a_local_cache_hit_clones_and_without_it_decodes() {
    let idem = cached_engine();
    let calls = AtomicU32::new(0);
    let first = charge_shared(&idem, &calls, 1, 500).await.unwrap();
    // The first run decodes its own sealed value once, to check it survives its codec.
    assert_eq!(SHARED_DECODES.load(Ordering::SeqCst), 1);
    for _ in 0..5 {
        assert_eq!(charge_shared(&idem, &calls, 1, 500).await.unwrap(), first);
    }
    assert_eq!(
        (runs(&calls), SHARED_DECODES.load(Ordering::SeqCst)),
        (1, 1),
        "with clone_cached, replays come from the cache's decoded copy"
    );
    // The payload is still checked on a hit.
    let reuse = charge_shared(&idem, &calls, 1, 501).await;
    assert!(matches!(reuse, Err(Error::KeyReuse { .. })), "{reuse:?}");

    let first = charge_unshared(&idem, &calls, 2, 500).await.unwrap();
    for _ in 0..5 {
        assert_eq!(charge_unshared(&idem, &calls, 2, 500).await.unwrap(), first);
    }
    assert_eq!(
        (runs(&calls), UNSHARED_DECODES.load(Ordering::SeqCst)),
        (2, 6),
        "without clone_cached each hit decodes"
    );
}

#[idempotent(key = order_id, store = idem, skip(idem), scope = "billing::versioned", clone_cached)]
async fn receipt_v1(idem: &Idem, order_id: u32) -> String {
    format!("v1 receipt {order_id}")
}

#[idempotent(key = order_id, store = idem, skip(idem), scope = "billing::versioned", version = 2, clone_cached)]
async fn receipt_v2(idem: &Idem, order_id: u32) -> String {
    format!("v2 receipt {order_id}")
}

#[tokio::test]
async fn a_local_cache_hit_still_refuses_a_record_of_another_version() {
    let idem = cached_engine();
    assert_eq!(receipt_v1(&idem, 3).await.unwrap(), "v1 receipt 3");
    assert_eq!(receipt_v1(&idem, 3).await.unwrap(), "v1 receipt 3");
    let newer = receipt_v2(&idem, 3).await;
    assert!(
        matches!(
            newer,
            Err(Error::Decode {
                source: idem::DecodeError::ResultVersion { .. },
                ..
            })
        ),
        "{newer:?}"
    );
}

#[idempotent(key = order_id, store = idem, skip(idem, calls), clone_cached)]
async fn charge_relayed(
    idem: &Idem,
    calls: &AtomicU32,
    order_id: u32,
    amount_cents: u64,
) -> Relayed {
    calls.fetch_add(1, Ordering::SeqCst);
    Relayed {
        charge_id: format!("ch_{order_id}"),
        amount_cents,
    }
}

#[tokio::test]
async fn a_local_cache_keeps_a_replay_read_from_the_store_decoded_for_the_next() {
    let writer = Idem::new(MemoryStore::new());
    let calls = AtomicU32::new(0);
    let first = charge_relayed(&writer, &calls, 9, 700).await.unwrap();
    let reader = Idem::builder()
        .store(writer.store().clone())
        .local_cache(16, Duration::from_secs(60))
        .build()
        .unwrap();
    let before = RELAYED_DECODES.load(Ordering::SeqCst);
    for _ in 0..4 {
        assert_eq!(
            charge_relayed(&reader, &calls, 9, 700).await.unwrap(),
            first
        );
    }
    assert_eq!(runs(&calls), 1);
    assert_eq!(
        RELAYED_DECODES.load(Ordering::SeqCst) - before,
        1,
        "the store's replay is decoded once, the three hits after it clone"
    );
}

#[idempotent(key = order_id, store = idem, skip(idem, calls), scope = "billing::loose", fingerprint = none)]
async fn loose_charge(idem: &Idem, calls: &AtomicU32, order_id: u32, amount_cents: u64) -> u64 {
    calls.fetch_add(1, Ordering::SeqCst);
    amount_cents
}

#[idempotent(key = order_id, store = idem, skip(idem, calls), scope = "billing::loose")]
async fn strict_charge(idem: &Idem, calls: &AtomicU32, order_id: u32, amount_cents: u64) -> u64 {
    calls.fetch_add(1, Ordering::SeqCst);
    amount_cents
}

/// A local-cache hit matches a request by its encoding first, and falls back to the
/// fingerprints: a record stored without a fingerprint replays to any payload, from the
/// cache as from the store; a record with one refuses another payload.
#[tokio::test]
async fn a_local_cache_hit_with_another_payload_is_judged_by_the_fingerprint() {
    let writer = Idem::new(MemoryStore::new());
    let calls = AtomicU32::new(0);
    assert_eq!(loose_charge(&writer, &calls, 1, 100).await.unwrap(), 100);
    let reader = Idem::builder()
        .store(writer.store().clone())
        .local_cache(16, Duration::from_secs(60))
        .build()
        .unwrap();
    // From the store, then twice from the cache: another amount each time, all replays.
    for amount in [200, 300, 400] {
        assert_eq!(
            strict_charge(&reader, &calls, 1, amount).await.unwrap(),
            100
        );
    }
    assert_eq!(runs(&calls), 1);

    // A record with a fingerprint: the same payload hits, another is refused.
    assert_eq!(strict_charge(&reader, &calls, 2, 500).await.unwrap(), 500);
    assert_eq!(strict_charge(&reader, &calls, 2, 500).await.unwrap(), 500);
    let reuse = strict_charge(&reader, &calls, 2, 501).await;
    assert!(matches!(reuse, Err(Error::KeyReuse { .. })), "{reuse:?}");
    assert_eq!(runs(&calls), 2);
}

#[idempotent(key = order_id, store = idem, skip(idem, calls))]
async fn charge_with_notes(idem: &Idem, calls: &AtomicU32, order_id: u32, notes: String) -> usize {
    calls.fetch_add(1, Ordering::SeqCst);
    notes.len()
}

/// Arguments encoded past 1 KiB are kept in the local cache as their fingerprint, not their
/// encoding: hits and refusals are the same.
#[tokio::test]
async fn a_local_cache_hit_checks_a_large_payload_by_its_fingerprint() {
    let idem = cached_engine();
    let calls = AtomicU32::new(0);
    let notes = "n".repeat(4096);
    for _ in 0..3 {
        assert_eq!(
            charge_with_notes(&idem, &calls, 1, notes.clone())
                .await
                .unwrap(),
            4096
        );
    }
    assert_eq!(runs(&calls), 1);
    let other = format!("{}m", &notes[1..]);
    let reuse = charge_with_notes(&idem, &calls, 1, other).await;
    assert!(matches!(reuse, Err(Error::KeyReuse { .. })), "{reuse:?}");
}

// --- fences ---------------------------------------------------------------------------------

/// Answers the fence its body saw, failing (so that the claim is released) when `fail`.
#[idempotent(key = job, store = idem, skip(idem, fail))]
async fn fenced(idem: &Idem, fail: bool, job: String) -> Result<u64, Error> {
    let fence = idem::fence().expect("a body on the memory store has a fence");
    if fail {
        return Err(Error::Config {
            message: format!("failed under fence {fence}"),
            source: None,
        });
    }
    Ok(fence.get())
}

#[tokio::test]
async fn a_macro_body_reads_its_fence_and_the_next_claim_has_a_larger_one() {
    let idem = engine();
    assert_eq!(idem::fence(), None, "no body runs here");
    let failed = fenced(&idem, true, "job-1".into()).await.unwrap_err();
    let Error::Config { message, .. } = failed else {
        panic!("{failed:?}")
    };
    let first: u64 = message.rsplit(' ').next().unwrap().parse().unwrap();
    let second = fenced(&idem, false, "job-1".into()).await.unwrap();
    assert!(second > first, "{second} after {first}");
    // A replay answers the stored value: the body, and its fence, are the first run's.
    assert_eq!(fenced(&idem, false, "job-1".into()).await.unwrap(), second);
}
