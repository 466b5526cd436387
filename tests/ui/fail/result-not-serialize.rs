use idem::idempotent;

// Deserialize only: the missing `Serialize` is what the error names. (A missing
// `Deserialize` is reported the same way, but rustc then lists `Deserialize` impls, and
// that list depends on which serde features the other dependencies turn on.)
#[derive(serde::Deserialize)]
pub struct Receipt {
    pub amount: u64,
}

#[idempotent]
async fn charge(order_id: String) -> Result<Receipt, idem::Error> {
    Ok(Receipt {
        amount: order_id.len() as u64,
    })
}

fn main() {}
