use idem::{idempotent, InProgress};

#[idempotent(in_progress = InProgress::Wait)]
async fn charge(amount: u64) -> u64 {
    amount
}

fn main() {}
