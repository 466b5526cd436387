use idem::idempotent;

pub struct OrderId(u64);

#[idempotent(key = order.id, fingerprint = none)]
async fn charge(order: Order) -> u64 {
    order.id.0
}

pub struct Order {
    pub id: OrderId,
}

fn main() {}
