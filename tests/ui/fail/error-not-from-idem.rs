use idem::idempotent;

#[derive(Debug)]
pub enum PaymentError {
    Declined,
}

#[idempotent]
async fn charge(amount: u64) -> Result<u64, PaymentError> {
    if amount == 0 {
        return Err(PaymentError::Declined);
    }
    Ok(amount)
}

fn main() {}
