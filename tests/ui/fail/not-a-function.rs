use idem::idempotent;

#[idempotent]
pub struct Charge {
    pub amount: u64,
}

fn main() {}
