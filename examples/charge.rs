//! A payment service whose `charge` method must never charge a card twice for one order,
//! however often a client retries it, and however many duplicates arrive at once.
//!
//! `cargo run --example charge`

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem::{idempotent, Idem, MemoryStore};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ChargeRequest {
    pub order_id: String,
    pub amount_cents: u64,
    pub currency: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Receipt {
    pub charge_id: String,
    pub order_id: String,
    pub amount_cents: u64,
}

#[derive(Debug, PartialEq, Serialize, Deserialize)]
pub enum PaymentError {
    /// The bank said no: a retry would say no again, so this answer is stored.
    Declined { reason: String },
    /// The gateway did not answer: not stored, so a retry charges again.
    GatewayTimeout,
    /// idem itself: the store failed, the order is being charged right now, or the order id
    /// came back with another amount.
    Idempotency(String),
}

impl From<idem::Error> for PaymentError {
    fn from(e: idem::Error) -> Self {
        PaymentError::Idempotency(e.to_string())
    }
}

/// Stands for the payment provider: counts the charges it really made.
#[derive(Default)]
pub struct Gateway {
    charges: AtomicU32,
    per_order: Mutex<HashMap<String, u32>>,
}

impl Gateway {
    async fn charge(&self, req: &ChargeRequest) -> Result<Receipt, PaymentError> {
        tokio::time::sleep(Duration::from_millis(50)).await; // the network
        if req.amount_cents > 1_000_000 {
            return Err(PaymentError::Declined {
                reason: "over the card's limit".into(),
            });
        }
        let n = self.charges.fetch_add(1, Ordering::SeqCst) + 1;
        *self
            .per_order
            .lock()
            .unwrap()
            .entry(req.order_id.clone())
            .or_default() += 1;
        Ok(Receipt {
            charge_id: format!("ch_{n:04}"),
            order_id: req.order_id.clone(),
            amount_cents: req.amount_cents,
        })
    }
}

pub struct Payments {
    idem: Idem,
    gateway: Gateway,
}

// Scopes the method after its type: its keys are `charge::Payments::charge/<order id>`.
#[idem::scoped]
impl Payments {
    /// Charges once per order id. A retry gets the first receipt; a duplicate that arrives
    /// while the charge runs waits for it; the same order id with another amount is refused.
    #[idempotent(
        key = req.order_id,
        store = self.idem,
        ttl = "24h",
        in_progress = "wait",
        cache_errors = |e| matches!(e, PaymentError::Declined { .. }),
    )]
    pub async fn charge(&self, req: ChargeRequest) -> Result<Receipt, PaymentError> {
        self.gateway.charge(&req).await
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let payments = Arc::new(Payments {
        idem: Idem::new(MemoryStore::new()),
        gateway: Gateway::default(),
    });
    let req = ChargeRequest {
        order_id: "order-1001".into(),
        amount_cents: 4_999,
        currency: "EUR".into(),
    };

    // A client that timed out and retried three times.
    let first = payments.charge(req.clone()).await.expect("charged");
    for _ in 0..3 {
        assert_eq!(payments.charge(req.clone()).await.expect("replayed"), first);
    }

    // Twenty duplicates of another order at the same moment (a double-clicked button, a
    // load balancer retrying): one charge, twenty identical receipts.
    let other = ChargeRequest {
        order_id: "order-1002".into(),
        ..req.clone()
    };
    let tasks: Vec<_> = (0..20)
        .map(|_| {
            let (payments, other) = (payments.clone(), other.clone());
            tokio::spawn(async move { payments.charge(other).await })
        })
        .collect();
    let mut receipts = Vec::new();
    for task in tasks {
        receipts.push(task.await?.expect("charged or replayed"));
    }
    assert!(receipts.iter().all(|r| r == &receipts[0]));

    // The same order id with another amount is a bug in the client, not a retry.
    let tampered = ChargeRequest {
        amount_cents: 1,
        ..req.clone()
    };
    let refused = payments.charge(tampered).await;
    println!("same order, other amount: {refused:?}");
    assert!(matches!(refused, Err(PaymentError::Idempotency(_))));

    // A declined card stays declined for that order: the answer is stored.
    let too_much = ChargeRequest {
        order_id: "order-1003".into(),
        amount_cents: 5_000_000,
        ..req.clone()
    };
    println!(
        "declined:       {:?}",
        payments.charge(too_much.clone()).await
    );
    println!("declined again: {:?}", payments.charge(too_much).await);

    let charged = payments.gateway.charges.load(Ordering::SeqCst);
    let per_order = payments.gateway.per_order.lock().unwrap().clone();
    println!("receipt:        {first:?}");
    println!("charge() calls: 4 + 20 + 1 + 2, gateway charges: {charged} ({per_order:?})");
    if charged != 2 || per_order.values().any(|&n| n != 1) {
        return Err("an order was charged twice".into());
    }
    Ok(())
}
