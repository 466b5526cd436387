use idem::idempotent;

#[idempotent(in_progress = "queue")]
async fn charge(order_id: String) -> u32 {
    order_id.len() as u32
}

fn main() {}
