//! `store = <argument>` leaves that argument out of the key and the fingerprint by itself:
//! it is the engine, not the request, and `Idem` is not `Serialize`. No `skip` is needed.
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use idem::{idempotent, Idem, Key, MemoryStore};

static CHARGES: AtomicU32 = AtomicU32::new(0);

#[idempotent(key = order_id, store = idem)]
async fn charge(idem: &Idem, order_id: String) -> u32 {
    CHARGES.fetch_add(1, Ordering::SeqCst) + 1
}

// Without `key`, the id digests the other arguments only.
#[idempotent(store = idem, scope = "store_argument::refund")]
async fn refund(idem: Arc<Idem>, order_id: u64, cents: u64) -> u64 {
    CHARGES.fetch_add(1, Ordering::SeqCst);
    cents
}

// Behind `&` or `*`, it is still the argument itself; a `skip` of it is allowed.
#[idempotent(key = id, store = &*idem, skip(idem))]
async fn capture(idem: Arc<Idem>, id: u32) -> u32 {
    CHARGES.fetch_add(1, Ordering::SeqCst);
    id
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let idem = Idem::new(MemoryStore::new());
    for _ in 0..3 {
        assert_eq!(charge(&idem, "o-1".into()).await.unwrap(), 1);
    }
    assert_eq!(charge(&idem, "o-2".into()).await.unwrap(), 2);
    assert_eq!(CHARGES.load(Ordering::SeqCst), 2, "one run per order");

    let shared = Arc::new(idem.clone());
    for _ in 0..3 {
        assert_eq!(refund(shared.clone(), 7, 250).await.unwrap(), 250);
        assert_eq!(capture(shared.clone(), 9).await.unwrap(), 9);
    }
    assert_eq!(CHARGES.load(Ordering::SeqCst), 4, "one refund, one capture");
    let key = Key::digest("store_argument::refund", &(&7u64, &250u64)).unwrap();
    assert!(idem.store().get(&key).await.unwrap().is_some(), "keyed by (order_id, cents)");
}
