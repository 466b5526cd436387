use idem::idempotent;

#[idempotent(skip(client, order))]
async fn charge(client: String, order_id: String) -> u32 {
    (client.len() + order_id.len()) as u32
}

fn main() {}
