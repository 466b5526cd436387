use idem::idempotent;

#[idempotent(key = order_id, timeout = "30s")]
async fn charge(order_id: String) -> u32 {
    order_id.len() as u32
}

fn main() {}
