use idem::idempotent;

// Deserialize only: see result-not-serialize.rs.
#[derive(serde::Deserialize)]
pub struct Receipt {
    pub amount: u64,
}

#[idempotent]
async fn charge(order_id: String) -> Receipt {
    Receipt {
        amount: order_id.len() as u64,
    }
}

fn main() {}
