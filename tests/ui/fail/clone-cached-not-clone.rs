use idem::idempotent;

#[derive(serde::Serialize, serde::Deserialize)]
pub struct Receipt {
    cents: u64,
}

// `clone_cached` keeps the decoded result in the local cache and clones it out: the
// result type must be `Clone`, and the error names the option at the result type.
#[idempotent(key = order_id, clone_cached)]
async fn charge(order_id: String) -> Receipt {
    Receipt { cents: 1 }
}

fn main() {}
