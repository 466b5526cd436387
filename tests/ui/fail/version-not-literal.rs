use idem::idempotent;

const V: u64 = 2;

#[idempotent(key = id, version = V)]
async fn charge(id: String) -> u64 {
    1
}

fn main() {}
