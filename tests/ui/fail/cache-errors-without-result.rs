use idem::idempotent;

#[idempotent(cache_errors)]
async fn charge(order_id: String) -> u64 {
    order_id.len() as u64
}

fn main() {}
