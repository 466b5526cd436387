use idem::idempotent;

#[idempotent]
fn charge(order_id: String) -> u32 {
    order_id.len() as u32
}

fn main() {
    // The function is still emitted unchanged, so this call compiles.
    let _: u32 = charge("order-1".into());
}
