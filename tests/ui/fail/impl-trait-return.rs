use idem::idempotent;

#[idempotent]
async fn charge(amount: u64) -> Vec<impl serde::Serialize> {
    vec![amount]
}

fn main() {}
