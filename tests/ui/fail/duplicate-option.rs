use idem::idempotent;

#[idempotent(ttl = "1h", key = order_id, ttl = "2h")]
async fn charge(order_id: String) -> u32 {
    order_id.len() as u32
}

fn main() {}
