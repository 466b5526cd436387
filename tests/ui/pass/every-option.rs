//! Every option at once, each in its literal and its expression form.
use std::sync::Arc;
use std::time::Duration;

use idem::{idempotent, Idem, MemoryStore};
use serde::{Deserialize, Serialize};

#[derive(Debug, Serialize, Deserialize)]
pub enum PaymentError {
    Declined,
    Idem(String),
}

impl From<idem::Error> for PaymentError {
    fn from(e: idem::Error) -> Self {
        PaymentError::Idem(e.to_string())
    }
}

const LEASE: Duration = Duration::from_secs(10);

#[idempotent(
    key = order_id,
    scope = "billing::charge",
    store = store,
    ttl = "24h",
    lease = LEASE,
    in_progress = "wait",
    wait_timeout = Duration::from_millis(500),
    fingerprint = (amount, &currency),
    skip(store),
    cache_errors = |e: &PaymentError| matches!(e, PaymentError::Declined),
    codec = idem::codec::Json,
    crate = "idem",
)]
async fn charge(
    store: Arc<Idem>,
    order_id: u64,
    amount: u64,
    currency: String,
) -> Result<String, PaymentError> {
    if amount == 0 {
        return Err(PaymentError::Declined);
    }
    Ok(format!("{order_id}:{amount}{currency}"))
}

#[idempotent(ttl = "250ms", lease = "5m", wait_timeout = "30s", in_progress = "reject", fingerprint = none, cache_errors)]
async fn quote(amount: u64) -> Result<u64, PaymentError> {
    Ok(amount)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    // The functions without `store = ...` run on the global engine.
    let _ = idem::set_global(idem::Idem::new(idem::MemoryStore::new()));
    let store = Arc::new(Idem::new(MemoryStore::new()));
    let receipt = charge(store.clone(), 7, 100, "EUR".into()).await.unwrap();
    assert_eq!(receipt, "7:100EUR");
    assert_eq!(quote(3).await.unwrap(), 3);
}
