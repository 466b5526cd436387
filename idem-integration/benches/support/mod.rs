//! What the benches share: the request and receipt of the "payment" they measure.

use serde::{Deserialize, Serialize};

/// A 4-field request, taken by value by every function the benches call.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ChargeRequest {
    pub order_id: String,
    pub amount_cents: u64,
    pub currency: String,
    pub customer: String,
}

/// What a charge answers, and what is stored and replayed.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Receipt {
    charge_id: String,
    amount_cents: u64,
    currency: String,
    captured: bool,
}

/// The request of order `order`.
pub fn request(order: u64) -> ChargeRequest {
    ChargeRequest {
        order_id: format!("order-{order}"),
        amount_cents: 1250,
        currency: "EUR".into(),
        customer: "cus_9s6XKzkNRiz8i3".into(),
    }
}

/// The "payment": cheap on purpose, so that what is measured is what wraps it.
pub fn receipt_for(req: &ChargeRequest) -> Receipt {
    Receipt {
        charge_id: "ch_3PqZ8rLkdIwHu7ix0hZWfBk2".into(),
        amount_cents: req.amount_cents,
        currency: req.currency.clone(),
        captured: true,
    }
}
