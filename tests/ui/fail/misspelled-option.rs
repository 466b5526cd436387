use idem::idempotent;

// A typo of `ttl`: the error suggests it.
#[idempotent(key = order_id, tll = "24h")]
async fn charge(order_id: String) -> u32 {
    order_id.len() as u32
}

fn main() {}
