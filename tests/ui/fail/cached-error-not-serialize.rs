use idem::idempotent;

#[derive(Debug)]
pub enum PaymentError {
    Declined,
    Idem(idem::Error),
}

impl From<idem::Error> for PaymentError {
    fn from(e: idem::Error) -> Self {
        PaymentError::Idem(e)
    }
}

#[idempotent(cache_errors = |e| matches!(e, PaymentError::Declined))]
async fn charge(amount: u64) -> Result<u64, PaymentError> {
    if amount == 0 {
        return Err(PaymentError::Declined);
    }
    Ok(amount)
}

fn main() {}
