use idem::idempotent;

#[idempotent(key = id, missing_key = "skip")]
async fn charge(id: Option<String>) -> u64 {
    1
}

fn main() {}
