use idem::idempotent;

#[idempotent(scope = "billing/charge")]
async fn charge(amount: u64) -> u64 {
    amount
}

fn main() {}
