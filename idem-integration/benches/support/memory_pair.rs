//! The memory pair that `benches/memory.rs` times and `benches/instructions.rs` counts:
//! the attribute as users write it, on the global engine (set to a memory store in each
//! bench's `main`), and the hand-written check it is compared with.

use std::sync::LazyLock;

use dashmap::DashMap;
use idem::idempotent;

use crate::support::{receipt_for, ChargeRequest, Receipt};

/// On the global engine.
#[idempotent(key = req.order_id)]
pub async fn charge(req: ChargeRequest) -> Receipt {
    receipt_for(&req)
}

/// The same without a payload check (`fingerprint = none`): what the fingerprint costs a
/// replay, since the hand-written check and `#[cached]` check no payload.
#[idempotent(key = req.order_id, fingerprint = none)]
pub async fn charge_unchecked(req: ChargeRequest) -> Receipt {
    receipt_for(&req)
}

static BY_HAND: LazyLock<DashMap<String, Vec<u8>>> = LazyLock::new(DashMap::new);

/// The hand-written check: look the order up, decode its stored receipt; on a miss, charge,
/// encode, insert. No claim, so no protection against concurrent duplicates: the least a
/// hand-rolled result cache does.
pub async fn charge_by_hand(req: ChargeRequest) -> Receipt {
    if let Some(bytes) = BY_HAND.get(&req.order_id) {
        return serde_json::from_slice(&bytes).expect("a stored receipt");
    }
    let receipt = receipt_for(&req);
    let bytes = serde_json::to_vec(&receipt).expect("a receipt encodes");
    BY_HAND.insert(req.order_id, bytes);
    receipt
}

/// An order's entry: the request's JSON and the receipt's.
type Checked = (Vec<u8>, Vec<u8>);

static BY_HAND_CHECKED: LazyLock<DashMap<String, Checked>> = LazyLock::new(DashMap::new);

/// The hand-written check that also compares the request, as idem's default fingerprint
/// does: the stored entry keeps the request's JSON beside the receipt's, and a replay
/// encodes the request it got and compares the two before it decodes the receipt. A request
/// that differs under the same order id is refused (`Err`), not answered with another
/// request's receipt. Still no claim: the fair baseline for a replay with a payload check.
pub async fn charge_by_hand_checked(req: ChargeRequest) -> Result<Receipt, &'static str> {
    let request = serde_json::to_vec(&req).expect("a request encodes");
    if let Some(entry) = BY_HAND_CHECKED.get(&req.order_id) {
        let (stored_request, receipt) = &*entry;
        if *stored_request != request {
            return Err("this order id was first used with another request");
        }
        return Ok(serde_json::from_slice(receipt).expect("a stored receipt"));
    }
    let receipt = receipt_for(&req);
    let bytes = serde_json::to_vec(&receipt).expect("a receipt encodes");
    BY_HAND_CHECKED.insert(req.order_id, (request, bytes));
    Ok(receipt)
}
