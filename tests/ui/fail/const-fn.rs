use idem::idempotent;

#[idempotent]
const fn charge(amount: u64) -> u64 {
    amount
}

fn main() {
    let _ = charge(1);
}
