use idem::idempotent;

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
