use idem::idempotent;

#[idempotent(ttl = "30 minutes")]
async fn charge(order_id: String) -> u32 {
    order_id.len() as u32
}

#[idempotent(lease = "0s")]
async fn refund(order_id: String) -> u32 {
    order_id.len() as u32
}

fn main() {}
